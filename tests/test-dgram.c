/* test-dgram — the lossy all-reduce's datagram codec and UDP socket (src/net/dgram.c, udp.c; net.h "datagrams"):
   - encode/decode round trips of the three kinds at the limits (1 and HN_DGRAM_MAX_ELEMS elements, the
     last range of a partial), the payload carried bit for bit;
   - the encoder refuses what the decoder would (n 0 or too large, a range past the total, no room);
   - the decoder refuses every single-field corruption of a valid datagram (magic, version, kind,
     flags, n, offset, total, a length one byte off) and random bytes; it never reads past the end
     (run under ASan);
   - sealed datagrams (issue 29): a round trip through a sender's and a receiver's hn_dgram_crypt, the
     elements not in clear; every single flipped bit, a wrong key, a plaintext datagram refused
     (HR_EAUTH); a replayed counter refused (HR_EEXIST); the sealed limits (fewer elements, within
     HN_DGRAM_MAX_BYTES; no counter past HN_REKEY_MESSAGES); a plaintext connection seals nothing;
   - two UDP sockets beside a loopback TCP connection: connect, send, receive; a datagram from another
     address is refused by the peer check, an empty or oversized one reported as such;
   - the worker's side of the planner's loss probe (hc_loss_probe_answer) against a slow head that
     echoes one datagram a millisecond, long after the worker's last send: every echo counted (the
     window stays open while echoes come; a window of wait_ms after the last send counted under half
     of them); a head that stops echoing halfway: half counted, and the answer within a second.
   HEARTH_DGRAM_SEED_DIR=dir writes the valid samples as seeds for tests/fuzz-dgram.c. */
#include "test.h"

#include "cluster/cluster.h"
#include "net/net.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

static void write_seed(const char *name, const uint8_t *p, size_t n) {
    const char *dir = getenv("HEARTH_DGRAM_SEED_DIR");
    if (!dir) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(p, 1, n, f);
    fclose(f);
}

static void test_round_trip(void) {
    float v[HN_DGRAM_MAX_ELEMS];
    uint64_t st = 42;
    for (int i = 0; i < HN_DGRAM_MAX_ELEMS; i++) {
        uint32_t bits = (uint32_t)test_splitmix64(&st);
        memcpy(&v[i], &bits, 4); /* any bit pattern, NaNs included, travels as is */
    }
    const struct { uint32_t total, offset, n; const char *seed; } cases[] = {
        {1, 0, 1, "one"}, {64, 0, 64, "small"}, {2048, 0, HN_DGRAM_MAX_ELEMS, "full"},
        {2048, 2046, 2, "tail"}, {HN_DGRAM_MAX_TOTAL, HN_DGRAM_MAX_TOTAL - 3, 3, "max-total"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        hn_dgram d = {.kind = HN_DGRAM_PARTIAL + (int)(c % 4), .flags = (uint16_t)(c & 1), .session = 0x0123456789abcdefULL + c,
                      .seq = 77 + (uint32_t)c, .device = (uint16_t)(c + 1), .total = cases[c].total,
                      .offset = cases[c].offset, .n = cases[c].n, .data = v};
        uint8_t buf[HN_DGRAM_MAX_BYTES];
        size_t len = hn_dgram_encode(&d, NULL, buf, sizeof buf);
        CHECKF(len == HN_DGRAM_HEADER + 4 * (size_t)d.n && len <= HN_DGRAM_MAX_BYTES, "case %zu: %zu bytes", c, len);
        write_seed(cases[c].seed, buf, len);
        hn_dgram o;
        char why[128] = "";
        /* an exact-size heap copy: ASan sees any read past the end */
        uint8_t *copy = malloc(len);
        REQUIRE_VOID(copy);
        memcpy(copy, buf, len);
        CHECKF(hn_dgram_decode(copy, len, NULL, &o, why, sizeof why) == 0, "case %zu: %s", c, why);
        CHECK(o.kind == d.kind && o.flags == d.flags && o.session == d.session && o.seq == d.seq && o.device == d.device &&
              o.total == d.total && o.offset == d.offset && o.n == d.n);
        CHECK(o.data == copy + HN_DGRAM_HEADER && !memcmp(o.data, v, 4 * (size_t)d.n));
        free(copy);
    }
}

static void test_encoder_refuses(void) {
    float v[HN_DGRAM_MAX_ELEMS + 1] = {0};
    uint8_t buf[HN_DGRAM_MAX_BYTES + 64];
    const hn_dgram bad[] = {
        {.kind = 1, .total = 10, .offset = 0, .n = 0, .data = v},
        {.kind = 0, .total = 10, .offset = 0, .n = 1, .data = v},
        {.kind = 5, .total = 10, .offset = 0, .n = 1, .data = v},
        {.kind = 1, .total = 4096, .offset = 0, .n = HN_DGRAM_MAX_ELEMS + 1, .data = v},
        {.kind = 1, .total = 10, .offset = 8, .n = 3, .data = v},
        {.kind = 1, .total = 10, .offset = 11, .n = 1, .data = v},
        {.kind = 1, .total = HN_DGRAM_MAX_TOTAL + 1, .offset = 0, .n = 1, .data = v},
        {.kind = 1, .total = 10, .offset = 0, .n = 1, .data = NULL},
        {.kind = 1, .flags = 2, .total = 10, .offset = 0, .n = 1, .data = v},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECKF(hn_dgram_encode(&bad[i], NULL, buf, sizeof buf) == 0, "bad datagram %zu encoded", i);
    hn_dgram ok = {.kind = 2, .total = 10, .offset = 0, .n = 10, .data = v};
    CHECK(hn_dgram_encode(&ok, NULL, buf, HN_DGRAM_HEADER + 39) == 0);  /* no room */
    CHECK(hn_dgram_encode(&ok, NULL, buf, HN_DGRAM_HEADER + 40) == HN_DGRAM_HEADER + 40);
}

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

static void test_decoder_refuses(void) {
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    hn_dgram d = {.kind = HN_DGRAM_PARTIAL, .session = 5, .seq = 9, .device = 2, .total = 64, .offset = 8, .n = 8,
                  .data = v};
    uint8_t good[HN_DGRAM_MAX_BYTES];
    size_t len = hn_dgram_encode(&d, NULL, good, sizeof good);
    REQUIRE_VOID(len == HN_DGRAM_HEADER + 32);
    hn_dgram o;
    uint8_t b[HN_DGRAM_MAX_BYTES + 8];
    char why[128];
#define MUTATE(stmt, blen, what) do { memcpy(b, good, len); stmt; why[0] = 0; \
        CHECKF(hn_dgram_decode(b, (blen), NULL, &o, why, sizeof why) == HR_EFORMAT && why[0], "%s accepted", what); \
    } while (0)
    MUTATE((void)0, len - 1, "a byte short");
    MUTATE(b[len] = 0, len + 1, "a byte long");
    MUTATE((void)0, HN_DGRAM_HEADER - 1, "a short header");
    MUTATE((void)0, 0, "nothing");
    MUTATE(b[0] ^= 1, len, "bad magic");
    MUTATE(put16(b + 4, 2), len, "version 2");
    MUTATE(put16(b + 6, 5), len, "kind 5");
    MUTATE(put16(b + 6, 0), len, "kind 0");
    MUTATE(put16(b + 22, 2), len, "an unknown flag");
    MUTATE(put32(b + 32, 0), HN_DGRAM_HEADER, "n 0");
    MUTATE(put32(b + 32, 9), len, "n one more than the bytes");
    MUTATE(put32(b + 28, 57), len, "a range past the total");
    MUTATE(put32(b + 28, 0xfffffffcu), len, "an offset that wraps");
    MUTATE(put32(b + 24, HN_DGRAM_MAX_TOTAL + 1), len, "a total past the limit");
    MUTATE((put32(b + 24, 400), put32(b + 28, 0), put32(b + 32, HN_DGRAM_MAX_ELEMS + 1)),
           HN_DGRAM_HEADER + 4 * (HN_DGRAM_MAX_ELEMS + 1), "more elements than a datagram holds");
#undef MUTATE
    /* random bytes: refused or, if ever taken, self-consistent */
    uint64_t st = 7;
    int taken = 0;
    for (int i = 0; i < 20000; i++) {
        size_t n = (size_t)(test_splitmix64(&st) % (sizeof b));
        for (size_t j = 0; j < n; j++) b[j] = (uint8_t)test_splitmix64(&st);
        if (i & 1 && n >= 8) put32(b, HN_DGRAM_MAGIC), put16(b + 4, HN_DGRAM_VERSION), put16(b + 6, HN_DGRAM_PARTIAL);
        if (hn_dgram_decode(b, n, NULL, &o, NULL, 0) == 0) {
            taken++;
            CHECK(n == HN_DGRAM_HEADER + 4 * (size_t)o.n && o.offset + (uint64_t)o.n <= o.total);
        }
    }
    CHECK(taken < 10);
}

/* a sender and a receiver of one direction: the receiver's key is the sender's */
static void crypt_pair(hn_dgram_crypt *snd, hn_dgram_crypt *rcv, uint8_t key) {
    memset(snd, 0, sizeof *snd);
    memset(rcv, 0, sizeof *rcv);
    snd->on = rcv->on = true;
    memset(snd->send.k, key, sizeof snd->send.k);
    memset(rcv->recv.k, key, sizeof rcv->recv.k);
    memset(snd->recv.k, 0x5a, sizeof snd->recv.k);
    memset(rcv->send.k, 0xa5, sizeof rcv->send.k);
    hn_replay_init(&snd->seen);
    hn_replay_init(&rcv->seen);
}

static void test_sealed(void) {
    hn_dgram_crypt snd, rcv;
    crypt_pair(&snd, &rcv, 0x11);
    CHECK(hn_dgram_max_elems(&snd) == HN_DGRAM_MAX_ELEMS_SEALED && hn_dgram_max_elems(NULL) == HN_DGRAM_MAX_ELEMS);
    CHECK(HN_DGRAM_HEADER + HN_DGRAM_SEAL_OVERHEAD + 4 * HN_DGRAM_MAX_ELEMS_SEALED <= HN_DGRAM_MAX_BYTES);
    float v[HN_DGRAM_MAX_ELEMS_SEALED + 1];
    for (int i = 0; i <= HN_DGRAM_MAX_ELEMS_SEALED; i++) v[i] = 1.5f + (float)i;
    uint8_t buf[HN_DGRAM_MAX_BYTES], plain[HN_DGRAM_MAX_BYTES];
    hn_dgram o;
    char why[128] = "";
    /* round trips at both limits; consecutive counters */
    const uint32_t ns[] = {1, HN_DGRAM_MAX_ELEMS_SEALED};
    for (size_t c = 0; c < 2; c++) {
        hn_dgram d = {.kind = HN_DGRAM_PARTIAL, .session = 77, .seq = 9, .device = 2, .total = 4096, .offset = 0,
                      .n = ns[c], .data = v};
        size_t len = hn_dgram_encode(&d, &snd, buf, sizeof buf);
        CHECKF(len == HN_DGRAM_HEADER + HN_DGRAM_SEAL_OVERHEAD + 4 * (size_t)ns[c], "sealed size %zu", len);
        CHECK(hn_dgram_encode(&d, NULL, plain, sizeof plain) == HN_DGRAM_HEADER + 4 * (size_t)ns[c]);
        uint16_t ver;
        uint64_t ctr;
        memcpy(&ver, buf + 4, 2);
        memcpy(&ctr, buf + HN_DGRAM_HEADER, 8);
        CHECKF(ver == HN_DGRAM_VERSION_SEALED && ctr == c, "version %u counter %llu", ver, (unsigned long long)ctr);
        /* the header as in clear, the elements not */
        CHECK(!memcmp(buf + 6, plain + 6, HN_DGRAM_HEADER - 6));
        CHECK(memcmp(buf + HN_DGRAM_HEADER + 8, plain + HN_DGRAM_HEADER, 4 * (size_t)ns[c]) != 0);
        CHECKF(hn_dgram_decode(buf, len, &rcv, &o, why, sizeof why) == 0, "sealed case %zu: %s", c, why);
        CHECK(o.kind == HN_DGRAM_PARTIAL && o.session == 77 && o.seq == 9 && o.device == 2 && o.total == 4096 &&
              o.n == ns[c] && !memcmp(o.data, v, 4 * (size_t)ns[c]));
        /* the same bytes again: a replay */
        CHECK(hn_dgram_decode(buf, len, &rcv, &o, why, sizeof why) == HR_EEXIST);
        write_seed(c ? "sealed-full" : "sealed-one", buf, len);
    }
    /* every single flipped bit (header, counter, elements, tag) fails to open */
    float w[4] = {1, 2, 3, 4};
    hn_dgram d = {.kind = HN_DGRAM_RESULT, .session = 5, .seq = 3, .device = 0, .total = 4, .offset = 0, .n = 4,
                  .data = w};
    size_t len = hn_dgram_encode(&d, &snd, buf, sizeof buf);
    REQUIRE_VOID(len > 0);
    int flipped_ok = 0;
    for (size_t bit = 0; bit < len * 8; bit++) {
        hn_replay_init(&rcv.seen);
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        if (hn_dgram_decode(buf, len, &rcv, &o, NULL, 0) != HR_EAUTH) flipped_ok++;
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    CHECKF(flipped_ok == 0, "%d single-bit flips not refused", flipped_ok);
    /* truncated or extended by a byte */
    hn_replay_init(&rcv.seen);
    CHECK(hn_dgram_decode(buf, len - 1, &rcv, &o, NULL, 0) == HR_EAUTH);
    CHECK(hn_dgram_decode(buf, len + 1, &rcv, &o, NULL, 0) == HR_EAUTH);
    CHECK(hn_dgram_decode(buf, len, &rcv, &o, NULL, 0) == 0);   /* the untouched one still opens */
    /* another key; a plaintext datagram to a sealing receiver; a sealed one to a plaintext receiver */
    hn_dgram_crypt other, other_rcv;
    crypt_pair(&other, &other_rcv, 0x22);
    CHECK(hn_dgram_decode(buf, len, &other_rcv, &o, NULL, 0) == HR_EAUTH);
    size_t plen = hn_dgram_encode(&d, NULL, plain, sizeof plain);
    CHECK(hn_dgram_decode(plain, plen, &rcv, &o, NULL, 0) == HR_EAUTH);
    CHECK(hn_dgram_decode(buf, len, NULL, &o, NULL, 0) == HR_EFORMAT);
    /* replay window: an old counter after newer ones, then far too old */
    hn_dgram_crypt late_snd, late_rcv;
    crypt_pair(&late_snd, &late_rcv, 0x33);
    uint8_t first[HN_DGRAM_MAX_BYTES];
    size_t flen = hn_dgram_encode(&d, &late_snd, first, sizeof first);
    for (int i = 0; i < 10; i++) {
        size_t l2 = hn_dgram_encode(&d, &late_snd, buf, sizeof buf);
        CHECK(hn_dgram_decode(buf, l2, &late_rcv, &o, NULL, 0) == 0);
    }
    CHECK(hn_dgram_decode(first, flen, &late_rcv, &o, NULL, 0) == 0);          /* reordered: still new */
    CHECK(hn_dgram_decode(first, flen, &late_rcv, &o, NULL, 0) == HR_EEXIST);  /* again: a replay */
    /* the sealed limits: one element too many; no counter past HN_REKEY_MESSAGES */
    hn_dgram big = d;
    big.total = 4096;
    big.n = HN_DGRAM_MAX_ELEMS_SEALED + 1;
    big.data = v;
    CHECK(hn_dgram_encode(&big, &snd, buf, sizeof buf) == 0);
    CHECK(hn_dgram_encode(&big, NULL, plain, sizeof plain) > 0);
    snd.next = HN_REKEY_MESSAGES;
    CHECK(hn_dgram_encode(&d, &snd, buf, sizeof buf) == 0);
    hn_dgram_crypt_wipe(&snd);
    CHECK(!snd.on);
}

/* a loopback TCP connection: *c the connecting side, *a the accepted one (the listener is returned) */
static hn_listener *loop_pair(hn_conn **c, hn_conn **a) {
    hr_err e = {0};
    hn_listener *l = hn_listen("127.0.0.1:0", &e);
    if (!l) return NULL;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", hn_listener_port(l));
    *c = hn_connect(addr, hn_deadline_ms(5000), &e);
    *a = *c ? hn_accept(l, hn_deadline_ms(5000), &e) : NULL;
    return l;
}

static void test_sockets(void) {
    hr_err e = {0};
    hn_conn *c = NULL, *a = NULL;
    hn_listener *l = loop_pair(&c, &a);
    REQUIRE_VOID(l && c && a);
    hn_dgram_crypt x;
    CHECK(hn_dgram_crypt_init(&x, c, &e) == 0 && !x.on);   /* a plaintext connection: nothing sealed */
    hn_udp *head = hn_udp_open(a, &e), *worker = hn_udp_open(c, &e);
    REQUIRE_VOID(head && worker);
    CHECK(hn_udp_port(head) != 0 && hn_udp_port(worker) != 0);
    hn_udp_expect_peer(head, a);
    CHECK(hn_udp_connect(worker, c, hn_udp_port(head), &e) == 0);
    float v[4] = {1, 2, 3, 4};
    uint8_t out[HN_DGRAM_MAX_BYTES], in[HN_DGRAM_MAX_BYTES];
    hn_dgram d = {.kind = HN_DGRAM_RESULT, .session = 1, .seq = 1, .device = 1, .total = 4, .offset = 0, .n = 4,
                  .data = v};
    size_t len = hn_dgram_encode(&d, NULL, out, sizeof out);
    CHECK(hn_udp_send(worker, out, len) == 0);
    long got = 0;
    for (int i = 0; i < 200 && got == 0; i++) {
        got = hn_udp_recv(head, in, sizeof in);
        if (!got) usleep(1000);
    }
    CHECK(got == (long)len && !memcmp(in, out, len));
    CHECK(hn_udp_recv(head, in, sizeof in) == 0);   /* nothing more waiting */
    /* an empty datagram and one longer than the buffer: read and reported */
    CHECK(hn_udp_send(worker, out, 0) == 0);
    CHECK(hn_udp_send(worker, out, len) == 0);
    long r1 = 0, r2 = 0;
    for (int i = 0; i < 200 && r1 == 0; i++) { r1 = hn_udp_recv(head, in, sizeof in); if (!r1) usleep(1000); }
    for (int i = 0; i < 200 && r2 == 0; i++) { r2 = hn_udp_recv(head, in, 16); if (!r2) usleep(1000); }
    CHECKF(r1 == -2 && r2 == -2, "empty: %ld, oversized: %ld", r1, r2);
    /* from another address: 127.0.0.2 is loopback too, but not the connection's peer */
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in src = {.sin_family = AF_INET};
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(hn_udp_port(head))};
    inet_pton(AF_INET, "127.0.0.2", &src.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&src, sizeof src) == 0) {
        CHECK(sendto(fd, out, len, 0, (struct sockaddr *)&dst, sizeof dst) == (ssize_t)len);
        long r = 0;
        for (int i = 0; i < 200 && r == 0; i++) { r = hn_udp_recv(head, in, sizeof in); if (!r) usleep(1000); }
        CHECKF(r == -1, "a datagram from 127.0.0.2: %ld", r);
    }
    if (fd >= 0) close(fd);
    hn_udp_close(head);
    hn_udp_close(worker);
    hn_conn_close(a);
    hn_conn_close(c);
    hn_listener_close(l);
}

typedef struct probe_job {
    hn_conn *conn;
    hn_loss_probe rq;
    hn_kv kv[3];
    char vals[3][24];
    uint32_t n_kv;
    hr_err e;
    int rc;
} probe_job;

static void *probe_worker(void *arg) {
    probe_job *j = arg;
    j->rc = hc_loss_probe_answer(j->conn, &j->rq, 1, j->kv, j->vals, &j->n_kv, &j->e);
    return NULL;
}

/* a head that takes everything the worker sends, then echoes the first `echo` of them 1 ms apart */
static void slow_head(uint32_t count, uint32_t echo, long *echoed, double *answer_ms) {
    hr_err e = {0};
    hn_conn *c = NULL, *a = NULL;
    hn_listener *l = loop_pair(&c, &a);
    REQUIRE_VOID(l && c && a);
    hn_udp *u = hn_udp_open(c, &e);
    REQUIRE_VOID(u);
    hn_udp_expect_peer(u, c);
    probe_job j = {.conn = a, .rq = {.session = 77, .port = hn_udp_port(u), .count = count, .interval_us = 100,
                                     .elems = 4, .wait_ms = 60}};
    pthread_t th;
    REQUIRE_VOID(pthread_create(&th, NULL, probe_worker, &j) == 0);
    uint32_t got = 0;
    uint8_t buf[HN_DGRAM_MAX_BYTES], out[HN_DGRAM_MAX_BYTES];
    for (int64_t until = hr_time_ns() + 2000000000LL; got < count && hr_time_ns() < until;) {
        long n = hn_udp_recv(u, buf, sizeof buf);
        if (n > 0) got++;
        else usleep(200);
    }
    CHECKF(got == count, "the head received %u of %u probe datagrams", got, count);
    hn_udp_reply_to_last(u);   /* echoes go where the probes came from */
    int64_t t0 = hr_time_ns();
    static const float zeros[4] = {0};
    for (uint32_t i = 0; i < echo; i++) {
        hn_dgram g = {.kind = HN_DGRAM_PROBE, .session = 77, .seq = i, .device = 0, .total = 4, .n = 4, .data = zeros};
        size_t n = hn_dgram_encode(&g, NULL, out, sizeof out);
        CHECK(n > 0 && hn_udp_send(u, out, n) == 0);
        usleep(1000);
    }
    pthread_join(th, NULL);
    *answer_ms = (double)(hr_time_ns() - t0) / 1e6;
    CHECKF(j.rc == 0 && j.n_kv == 3, "%s", j.e.msg);
    *echoed = strtol(j.vals[1], NULL, 10);
    CHECKF(strtol(j.vals[0], NULL, 10) == (long)count, "sent %s of %u", j.vals[0], count);
    hn_udp_close(u);
    hn_conn_close(a);
    hn_conn_close(c);
    hn_listener_close(l);
}

static void test_loss_probe_window(void) {
    long echoed = -1;
    double ms = 0;
    slow_head(200, 200, &echoed, &ms);
    CHECKF(echoed == 200, "a slow head's echoes: %ld of 200 counted", echoed);
    slow_head(200, 100, &echoed, &ms);
    CHECKF(echoed == 100 && ms < 1000, "a head that stopped: %ld of 100 counted, answered %.0f ms after", echoed, ms);
}

int main(void) {
    hr_init();
    test_round_trip();
    test_encoder_refuses();
    test_decoder_refuses();
    test_sealed();
    test_sockets();
    test_loss_probe_window();
    return test_summary();
}
