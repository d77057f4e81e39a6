/* netbench — what the encrypted links of issue 29 cost (docs/benchmarks.md, "Issue 29").
 *
 *   netbench ADDR [--key FILE] [-n N]   N sessions with the worker at ADDR: the medians of TCP connect,
 *                                       the handshake (with --key; the worker must hold the same key)
 *                                       and a HELLO round trip after it, in ms; then BYE
 *   netbench --seal                     ChaCha20-Poly1305 seal + open of one frame (the header as
 *                                       associated data) on this core: µs per frame and GB/s, for
 *                                       the sizes a decode step sends (a hidden state of 1-16 K floats),
 *                                       in CPU time (the machine may be shared)
 */
#include "base/base.h"
#include "net/net.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int nb_cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double nb_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, nb_cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* this thread's CPU time: on a shared machine the wall clock also counts other jobs' turns */
static int64_t cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int nb_seal(void) {
    static const size_t sizes[] = {4096, 16384, 65536};
    uint8_t k[HN_NOISE_KEY_SIZE] = {1}, hdr[HN_HEADER_SIZE] = {0};
    printf("%-10s %12s %10s\n", "bytes", "us/frame", "GB/s");
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        uint8_t *buf = calloc(1, n + HN_AEAD_TAG_SIZE);
        if (!buf) return 1;
        int reps = (int)(32u * 1024 * 1024 / n);
        double best = 1e30;
        for (int round = 0; round < 5; round++) {
            int64_t t0 = cpu_ns();
            for (int i = 0; i < reps; i++) {
                hn_aead_seal(k, (uint64_t)i, hdr, sizeof hdr, buf, n, buf);
                if (hn_aead_open(k, (uint64_t)i, hdr, sizeof hdr, buf, n + HN_AEAD_TAG_SIZE, buf)) return 1;
            }
            double us = (double)(cpu_ns() - t0) / 1e3 / reps;
            if (us < best) best = us;
        }
        printf("%-10zu %12.2f %10.2f   (seal + open, CPU time, best of 5)\n", n, best, (double)n / best / 1e3);
        free(buf);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (sodium_init() < 0) return 1; /* also picks libsodium's fastest code for this CPU */
    const char *addr = NULL, *key_path = NULL;
    int n = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seal")) return nb_seal();
        if (!strcmp(argv[i], "--key") && i + 1 < argc) key_path = argv[++i];
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) n = atoi(argv[++i]);
        else if (!addr && argv[i][0] != '-') addr = argv[i];
        else { fprintf(stderr, "usage: netbench ADDR [--key FILE] [-n N] | netbench --seal\n"); return 2; }
    }
    if (!addr || n < 1 || n > 10000) { fprintf(stderr, "usage: netbench ADDR [--key FILE] [-n N] | netbench --seal\n"); return 2; }
    hn_key key;
    hr_err err = {0};
    if (key_path && hn_key_load(key_path, &key, &err)) { fprintf(stderr, "netbench: %s\n", err.msg); return 1; }
    double *conn = calloc((size_t)n, sizeof *conn), *hs = calloc((size_t)n, sizeof *hs), *rtt = calloc((size_t)n, sizeof *rtt);
    if (!conn || !hs || !rtt) return 1;
    for (int i = 0; i < n; i++) {
        int64_t t0 = hr_time_ns();
        hn_conn *c = hn_connect(addr, hn_deadline_ms(5000), &err);
        if (!c) { fprintf(stderr, "netbench: %s\n", err.msg); return 1; }
        int64_t t1 = hr_time_ns();
        if (hn_conn_handshake(c, key_path ? &key : NULL, hn_deadline_ms(5000), &err)) {
            fprintf(stderr, "netbench: %s\n", err.msg);
            return 1;
        }
        int64_t t2 = hr_time_ns();
        hn_msg m = {.type = HN_MSG_HELLO};
        m.u.hello = (hn_hello){.version_min = HN_PROTO_VERSION, .version_max = HN_PROTO_VERSION,
                               .caps = HN_CAP_F32_ACT | (key_path ? HN_CAP_ENCRYPT : 0), .device = hn_cstr("netbench")};
        hn_frame f = {0};
        if (hn_msg_send(c, &m, hn_deadline_ms(5000), &err) || hn_msg_recv(c, &f, &m, hn_deadline_ms(5000), &err) ||
            m.type != HN_MSG_HELLO_ACK) {
            fprintf(stderr, "netbench: HELLO: %s\n", err.msg[0] ? err.msg : hn_msg_name(m.type));
            return 1;
        }
        int64_t t3 = hr_time_ns();
        m = (hn_msg){.type = HN_MSG_BYE};
        m.u.bye = (hn_bye){0, hn_cstr("measured")};
        hn_msg_send(c, &m, hn_deadline_ms(1000), NULL);
        hn_frame_free(&f);
        hn_conn_close(c);
        conn[i] = (double)(t1 - t0) / 1e6;
        hs[i] = (double)(t2 - t1) / 1e6;
        rtt[i] = (double)(t3 - t2) / 1e6;
        usleep(20000); /* the worker goes back to its door between sessions */
    }
    printf("%s%s: %d sessions, medians: connect %.3f ms, handshake %.3f ms, HELLO round trip %.3f ms\n", addr,
           key_path ? " (encrypted)" : " (plaintext)", n, nb_median(conn, n), nb_median(hs, n), nb_median(rtt, n));
    hn_key_wipe(&key);
    return 0;
}
