/* cluster/probe: a link's RTT and throughput, measured over a session with a worker — by the planner
   (head <-> worker) and by a worker the planner asks (LINK_PROBE: worker <-> worker); see cluster.h */
#define _GNU_SOURCE /* ppoll */
#include "cluster-impl.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>

static int hc_probe_send(hc_probe_conn *pc, hn_msg *m, int timeout_ms, hr_err *err) {
    m->seq = ++pc->seq;
    return hn_msg_send(pc->conn, m, hn_deadline_ms(timeout_ms), err);
}

int hc_probe_expect(hc_probe_conn *pc, int want, hn_msg *m, int timeout_ms, hr_err *err) {
    if (hn_msg_recv(pc->conn, &pc->rx, m, hn_deadline_ms(timeout_ms), err)) return err->code;
    if (m->type == HN_MSG_ERROR) {
        char why[HN_MAX_MESSAGE + 32];
        hr_escape(why, sizeof why, m->u.error.message.s, m->u.error.message.n);
        return hr_fail(err, m->u.error.code < 0 ? m->u.error.code : HR_EPROTO, "%s", why);
    }
    if (m->type != want)
        return hr_fail(err, HR_EPROTO, "answered %s where %s was expected", hn_msg_name(m->type), hn_msg_name(want));
    return 0;
}

int hc_probe_request(hc_probe_conn *pc, hn_msg *m, int want, int timeout_ms, hr_err *err) {
    if (hc_probe_send(pc, m, timeout_ms, err)) return err->code;
    return want ? hc_probe_expect(pc, want, m, timeout_ms, err) : 0;
}

int hc_probe_open(hc_probe_conn *pc, const char *addr, const hn_key *key, const char *me, int timeout_ms, hr_err *err) {
    memset(pc, 0, sizeof *pc);
    if (!(pc->conn = hn_connect_secure(addr, key, hn_deadline_ms(timeout_ms), err))) return err->code;
    hn_msg m = {.type = HN_MSG_HELLO};
    m.u.hello = (hn_hello){.version_min = HN_PROTO_VERSION, .version_max = HN_PROTO_VERSION,
                           .caps = HN_CAP_F32_ACT | (key ? HN_CAP_ENCRYPT : 0), .device = hn_cstr(me)};
    if (hc_probe_request(pc, &m, HN_MSG_HELLO_ACK, timeout_ms, err)) return err->code;
    if (m.u.hello_ack.version != HN_PROTO_VERSION) return hr_fail(err, HR_EUNSUPPORTED, "chose another protocol version");
    return 0;
}

void hc_probe_close(hc_probe_conn *pc, bool bye) {
    if (pc->conn && bye) {
        hn_msg m = {.type = HN_MSG_BYE};
        m.u.bye = (hn_bye){0, hn_cstr("measured")};
        hr_err e = {0};
        hc_probe_send(pc, &m, 1000, &e);
    }
    hn_conn_close(pc->conn);
    hn_frame_free(&pc->rx);
    memset(pc, 0, sizeof *pc);
}

int hc_probe_link(hc_probe_conn *pc, int n_pings, uint32_t bytes, int timeout_ms, double *rtt_ms, double *gbps,
                  hr_err *err) {
    double t[HN_MAX_PINGS];
    int n = HR_MAX(1, HR_MIN(n_pings, HN_MAX_PINGS));
    if (bytes > HN_MAX_PROBE) return hr_fail(err, HR_ERANGE, "a probe of %u bytes (at most %u)", bytes, HN_MAX_PROBE);
    for (int k = 0; k < n; k++) { /* empty PROFILE_REQs: the smallest round trip the protocol has */
        hn_msg m = {.type = HN_MSG_PROFILE_REQ};
        int64_t t0 = hr_time_ns();
        if (hc_probe_request(pc, &m, HN_MSG_PROFILE, timeout_ms, err)) return err->code;
        t[k] = (double)(hr_time_ns() - t0) / 1e6;
    }
    *rtt_ms = hr_median(t, n);
    *gbps = 0;
    if (!bytes) return 0;
    uint8_t *data = calloc(1, bytes);
    if (!data) return hr_fail(err, HR_ENOMEM, "out of memory");
    hn_msg m = {.type = HN_MSG_PROBE};
    m.u.probe = (hn_probe){.reply_bytes = 0, .n = bytes, .data = data};
    int64_t t0 = hr_time_ns();
    int rc = hc_probe_request(pc, &m, HN_MSG_PROBE, timeout_ms, err);
    double ms = (double)(hr_time_ns() - t0) / 1e6 - *rtt_ms;
    free(data);
    if (rc) return rc;
    *gbps = bytes / (HR_MAX(ms, 1e-3) * 1e6);
    return 0;
}

/* ---- datagram loss (LOSS_PROBE; docs/planner.md, "Loss") ------------------------------------------------ */

/* the test hook's drop decision for probe datagram idx (HEARTH_LOSSY_DROP: a fixed pattern per seed) */
static bool hc_probe_drop(uint64_t seed, uint32_t ppm, uint64_t idx) {
    if (!ppm) return false;
    uint64_t z = seed ^ idx * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return z % 1000000u < ppm;
}

/* a probe datagram of session `session` and number seq < count, or false (anything else is dropped) */
static bool hc_probe_dgram(const uint8_t *buf, long len, hn_dgram_crypt *x, uint64_t session, uint32_t count, uint32_t *seq) {
    hn_dgram g;
    if (len <= 0 || hn_dgram_decode(buf, (size_t)len, x, &g, NULL, 0)) return false;
    if (g.kind != HN_DGRAM_PROBE || g.session != session || g.seq >= count) return false;
    *seq = g.seq;
    return true;
}

static size_t hc_probe_encode(hn_dgram_crypt *x, uint64_t session, uint32_t seq, uint16_t device, uint32_t elems,
                              uint8_t *out) {
    static const float zeros[HN_DGRAM_MAX_ELEMS] = {0};
    hn_dgram g = {.kind = HN_DGRAM_PROBE, .session = session, .seq = seq, .device = device,
                  .total = elems, .offset = 0, .n = elems, .data = zeros};
    return hn_dgram_encode(&g, x, out, HN_DGRAM_MAX_BYTES);
}

int hc_probe_loss(hc_probe_conn *pc, const hc_loss_params *lp, int timeout_ms, hc_loss_result *out, hr_err *err) {
    memset(out, 0, sizeof *out);
    uint32_t count = (uint32_t)HR_MAX(1, HR_MIN(lp->count, HN_MAX_LOSS_PROBE));
    hn_dgram_crypt x;
    if (hn_dgram_crypt_init(&x, pc->conn, err)) return err->code;
    hn_udp *u = hn_udp_open(pc->conn, err);
    uint8_t *seen = calloc(count, 1);
    if (!u || !seen) {
        hn_udp_close(u);
        free(seen);
        hn_dgram_crypt_wipe(&x);
        return u ? hr_fail(err, HR_ENOMEM, "out of memory") : err->code;
    }
    hn_udp_expect_peer(u, pc->conn); /* only the worker's address is echoed */
    uint64_t session = 0; /* tells this probe's datagrams from anything else on the port */
    if (getrandom(&session, sizeof session, 0) != (ssize_t)sizeof session)
        session = (uint64_t)hr_time_ns() * 0x9e3779b97f4a7c15ULL ^ (uint64_t)(uintptr_t)seen;
    hn_msg m = {.type = HN_MSG_LOSS_PROBE};
    m.u.loss_probe = (hn_loss_probe){.session = session, .drop_seed = lp->drop_seed, .port = hn_udp_port(u),
                                     .count = count, .interval_us = lp->interval_us, .elems = lp->elems,
                                     .wait_ms = lp->wait_ms, .drop_ppm = lp->drop_ppm};
    int rc = hc_probe_request(pc, &m, 0, timeout_ms, err);
    /* echo every probe datagram until the worker's answer starts to arrive on the connection (nothing
       else comes there meanwhile, and frames are read exactly: readable means the answer) */
    int64_t until = hr_time_ns() + ((int64_t)count * lp->interval_us / 1000 + lp->wait_ms + timeout_ms) * 1000000;
    uint8_t buf[HN_DGRAM_MAX_BYTES + 8], echo[HN_DGRAM_MAX_BYTES];
    while (!rc) {
        struct pollfd pf[2] = {{.fd = hn_udp_fd(u), .events = POLLIN}, {.fd = hn_conn_fd(pc->conn), .events = POLLIN}};
        int64_t left = until - hr_time_ns();
        if (left <= 0) { rc = hr_fail(err, HR_ETIMEDOUT, "no answer to LOSS_PROBE"); break; }
        if (poll(pf, 2, (int)HR_MIN(left / 1000000 + 1, 100)) < 0 && errno != EINTR) {
            rc = hr_fail(err, HR_ENET, "poll: %s", strerror(errno));
            break;
        }
        long len;
        while ((len = hn_udp_recv(u, buf, HN_DGRAM_MAX_BYTES)) != 0) {
            uint32_t seq;
            if (!hc_probe_dgram(buf, len, &x, session, count, &seq)) { out->foreign++; continue; }
            if (seen[seq]) { out->duplicate++; continue; }
            seen[seq] = 1;
            out->received++;
            hn_udp_reply_to_last(u);
            size_t n = hc_probe_encode(&x, session, seq, 0, lp->elems, echo);
            if (hc_probe_drop(lp->drop_seed, lp->drop_ppm, (uint64_t)seq + (1ull << 32))) continue;
            if (n) hn_udp_send(u, echo, n);
        }
        if (pf[1].revents) break;
    }
    if (!rc) rc = hc_probe_expect(pc, HN_MSG_PROFILE, &m, timeout_ms, err);
    if (!rc) {
        const double sent = hn_profile_num(&m.u.profile, "sent", -1), echoed = hn_profile_num(&m.u.profile, "echoed", -1);
        if (!(sent >= 0 && sent <= count && echoed >= 0 && echoed <= out->received))
            rc = hr_fail(err, HR_EPROTO, "LOSS_PROBE answered without sent and echoed (or with impossible ones)");
        else {
            out->count = count;
            out->echoed = (uint32_t)echoed;
            /* up: what the worker meant to send and did not arrive; down: what the head echoed and did not */
            out->up = 1.0 - (double)out->received / count;
            out->down = out->received ? 1.0 - echoed / out->received : 0;
            out->loss = (double)(count - out->echoed) / (double)(count + out->received);
        }
    }
    hn_udp_close(u);
    free(seen);
    hn_dgram_crypt_wipe(&x);
    return rc;
}

int hc_loss_probe_answer(hn_conn *head, const hn_loss_probe *rq, uint16_t device, hn_kv *kv, char vals[3][24],
                         uint32_t *n_kv, hr_err *err) {
    hn_dgram_crypt x;
    if (hn_dgram_crypt_init(&x, head, err)) return err->code;
    hn_udp *u = hn_udp_open(head, err);
    uint8_t *seen = calloc(rq->count, 1);
    int rc = 0;
    if (!u || !seen) rc = u ? hr_fail(err, HR_ENOMEM, "out of memory") : err->code;
    /* only to its own head: the connection's peer address, at the port it names */
    if (!rc) rc = hn_udp_connect(u, head, (uint16_t)rq->port, err);
    uint32_t sent = 0, echoed = 0, dropped = 0;
    uint8_t out[HN_DGRAM_MAX_BYTES], buf[HN_DGRAM_MAX_BYTES + 8];
    /* the window closes wait_ms after the last send, or wait_ms after the latest echo while echoes still
       come (up to HN_MAX_LOSS_WAIT_MS after the last send): a head with a quarter core echoing seven
       probes at once falls tens of ms behind, and an echo that is late is not a datagram the link lost
       (klonet8: 2-86% "lost" head -> worker on lossless links, the planner's TP plans priced 10x) */
    int64_t t0 = hr_time_ns(), step = (int64_t)rq->interval_us * 1000, wait = (int64_t)rq->wait_ms * 1000000;
    int64_t last = t0 + step * rq->count, end = last + wait, cap = last + (int64_t)HN_MAX_LOSS_WAIT_MS * 1000000;
    for (uint32_t i = 0; !rc;) {
        int64_t now = hr_time_ns();
        while (i < rq->count && now >= t0 + step * i) {
            size_t n = hc_probe_encode(&x, rq->session, i, device, rq->elems, out);
            if (hc_probe_drop(rq->drop_seed, rq->drop_ppm, i)) dropped++;
            else if (n && !hn_udp_send(u, out, n)) sent++;
            i++;
        }
        long len;
        while ((len = hn_udp_recv(u, buf, HN_DGRAM_MAX_BYTES)) != 0) {
            uint32_t seq;
            if (hc_probe_dgram(buf, len, &x, rq->session, rq->count, &seq) && !seen[seq]) {
                seen[seq] = 1;
                echoed++;
                end = HR_MIN(cap, HR_MAX(end, hr_time_ns() + wait));
            }
        }
        if (i == rq->count && (now >= end || echoed == sent)) break;
        /* sleep until the next send (or the end), or an echo: never spin, a device may have a quarter core */
        int64_t next = i < rq->count ? t0 + step * i : end, nap = HR_MAX(0, HR_MIN(next - hr_time_ns(), 50000000));
        struct pollfd pf = {.fd = hn_udp_fd(u), .events = POLLIN};
        struct timespec ts = {0, (long)nap};
        ppoll(&pf, 1, &ts, NULL);
    }
    HR_LOGD("loss probe: sent %u, echoed %u, window closed %.1f ms after the last send", sent, echoed,
            (double)(hr_time_ns() - last) / 1e6);
    hn_udp_close(u);
    free(seen);
    hn_dgram_crypt_wipe(&x);
    if (rc) return rc;
    snprintf(vals[0], 24, "%u", sent);
    snprintf(vals[1], 24, "%u", echoed);
    snprintf(vals[2], 24, "%u", dropped);
    kv[0] = (hn_kv){hn_cstr("sent"), hn_cstr(vals[0])};
    kv[1] = (hn_kv){hn_cstr("echoed"), hn_cstr(vals[1])};
    kv[2] = (hn_kv){hn_cstr("dropped"), hn_cstr(vals[2])};
    *n_kv = 3;
    return 0;
}
