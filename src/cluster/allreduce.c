/* cluster/allreduce: the shard's sync hook — star and ring all-reduce over the session's
   connections (see cluster.h, "All-reduce") */
#define _GNU_SOURCE /* ppoll */
#include "cluster-impl.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

int64_t hc_ar_deadline(const hc_ar *a, int n) { return hn_deadline_ms((int64_t)a->timeout_ms + 20 * (int64_t)n); }

static const char *hc_role(int dev) { return dev == 0 ? "head" : "worker"; }

/* records why the sync failed, naming the peer: the forward pass only passes the code on */
static int hc_ar_fail(hc_ar *a, int dev, int rc, const char *msg) {
    return hr_fail(&a->err, rc, "%s %d at %s: %s", hc_role(dev), dev, a->names[dev], hc_skip_peer(msg, a->names[dev]));
}

/* Receives one PARTIAL/RESULT for this all-reduce from device dev; ERROR and BYE from the peer, and
   anything else, end it with a message. */
static int hc_ar_recv(hc_ar *a, int dev, hn_conn *c, hn_frame *f, hn_msg *m, int want, int n) {
    hr_err e = {0};
    int64_t t0 = hr_time_ns();
    int rc = hn_msg_recv(c, f, m, hc_ar_deadline(a, n), &e);
    a->wait_ns += hr_time_ns() - t0;
    if (rc) return hc_ar_fail(a, dev, rc, e.msg);
    char why[HN_MAX_MESSAGE + 64], text[HN_MAX_MESSAGE + 1];
    if (m->type == HN_MSG_ERROR) {
        snprintf(why, sizeof why, "reported an error: %s",
                 hr_escape(text, sizeof text, m->u.error.message.s, m->u.error.message.n));
        return hc_ar_fail(a, dev, m->u.error.code < 0 ? m->u.error.code : HR_EPROTO, why);
    }
    if (m->type == HN_MSG_BYE) {
        snprintf(why, sizeof why, "ended the session: %s",
                 hr_escape(text, sizeof text, m->u.bye.reason.s, m->u.bye.reason.n));
        return hc_ar_fail(a, dev, HR_ENET, why);
    }
    if (m->type != want) {
        snprintf(why, sizeof why, "sent %s during an all-reduce (expected %s)", hn_msg_name(m->type), hn_msg_name(want));
        return hc_ar_fail(a, dev, HR_EPROTO, why);
    }
    if (m->seq != a->seq) {
        snprintf(why, sizeof why, "%s for all-reduce %u arrived during all-reduce %u", hn_msg_name(want), m->seq, a->seq);
        return hc_ar_fail(a, dev, HR_EPROTO, why);
    }
    return 0;
}

static int hc_ar_send(hc_ar *a, int dev, hn_conn *c, hn_msg *m, int n) {
    hr_err e = {0};
    int64_t t0 = hr_time_ns();
    int rc = hc_send(a->hook, dev, c, m, hc_ar_deadline(a, n), &e);
    a->send_ns += hr_time_ns() - t0;
    return rc ? hc_ar_fail(a, dev, rc, e.msg) : 0;
}

static int hc_partial_check(hc_ar *a, int dev, const hn_partial *p, int layer, uint32_t stage, int n, int E,
                            uint64_t off, uint64_t cnt) {
    if (p->layer != (uint32_t)layer || p->stage != stage || p->n_tokens != (uint32_t)n || p->n_embd != (uint32_t)E ||
        p->offset != off || p->n != cnt) {
        char why[256];
        snprintf(why, sizeof why, "PARTIAL for layer %u stage %u, %u x %u, elements %u+%u does not match the expected "
                 "layer %d stage %u, %d x %d, elements %llu+%llu", p->layer, p->stage, p->n_tokens, p->n_embd, p->offset,
                 p->n, layer, stage, n, E, (unsigned long long)off, (unsigned long long)cnt);
        return hc_ar_fail(a, dev, HR_EPROTO, why);
    }
    return 0;
}

/* ---- lossy star (docs/lossy.md): workers' partials as datagrams, merged at a deadline ---- */

static bool hc_lossy_on(const hc_ar *a, int layer, int n) {
    return a->lossy && layer > 0 && n <= HC_LOSSY_MAX_TOKENS;
}

int hc_ar_lossy_alloc(hc_ar *a, int n_embd) {
    a->lcap = (size_t)HC_LOSSY_MAX_TOKENS * (size_t)n_embd;
    a->lmaxp = (a->lcap + HN_DGRAM_MAX_ELEMS - 1) / HN_DGRAM_MAX_ELEMS;
    a->lbuf = malloc((size_t)a->k * a->lcap * sizeof(float));
    a->got = malloc((size_t)a->k * a->lmaxp);
    return a->lbuf && a->got ? 0 : HR_ENOMEM;
}

void hc_ar_lossy_free(hc_ar *a) {
    free(a->lbuf);
    free(a->got);
    a->lbuf = NULL;
    a->got = NULL;
}

/* test hook: a pseudo-random drop decision per (seed, device, all-reduce, datagram), the same in every
   run whatever the timing */
static bool hc_lossy_drop(const hc_ar *a, uint32_t idx) {
    if (!a->drop_ppm) return false;
    uint64_t z = a->drop_seed ^ (uint64_t)a->me << 56 ^ (uint64_t)a->seq << 20 ^ idx;
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return z % 1000000u < a->drop_ppm;
}

/* A datagram that arrived on worker d's socket during all-reduce a->seq of cnt elements (np datagrams):
   taken into d's buffer, or dropped and counted. Returns 1 when it was a new piece of this all-reduce. */
static int hc_lossy_take(hc_ar *a, int d, const uint8_t *buf, long len, size_t cnt, size_t np) {
    hc_lossy_link *l = &a->ll[d];
    hn_dgram g;
    if (len == -1) { l->foreign++; return 0; }   /* from another address (or a receive error) */
    if (len < 0 || hn_dgram_decode(buf, (size_t)len, &g, NULL, 0)) { l->malformed++; return 0; }
    if (g.session != a->session || g.device != (uint16_t)d) { l->foreign++; return 0; }
    if (g.seq < a->seq) { l->late++; return 0; }
    /* a later all-reduce cannot have started before this one is merged; datagrams have fixed bounds */
    size_t idx = g.offset / HN_DGRAM_MAX_ELEMS;
    if (g.seq != a->seq || g.total != cnt || g.offset % HN_DGRAM_MAX_ELEMS ||
        g.n != HR_MIN((size_t)HN_DGRAM_MAX_ELEMS, cnt - g.offset)) {
        l->malformed++;
        return 0;
    }
    uint8_t *got = a->got + (size_t)d * a->lmaxp;
    if (idx >= np || got[idx]) { l->dup++; return 0; }
    got[idx] = 1;
    memcpy(a->lbuf + (size_t)d * a->lcap + g.offset, g.data, (size_t)g.n * sizeof(float));
    l->received++;
    return 1;
}

/* head: waits for the workers' datagrams until all are in or the deadline passes, then adds what
   arrived in device order (a missing range adds zero): with nothing lost, the very sum of the TCP star */
static void hc_lossy_head(hc_ar *a, float *x, int n, int E) {
    size_t cnt = (size_t)n * E, np = (cnt + HN_DGRAM_MAX_ELEMS - 1) / HN_DGRAM_MAX_ELEMS;
    int k = a->k;
    for (int d = 1; d < k; d++) {
        memset(a->lbuf + (size_t)d * a->lcap, 0, cnt * sizeof(float));
        memset(a->got + (size_t)d * a->lmaxp, 0, np);
    }
    size_t missing = (size_t)(k - 1) * np;
    int64_t t0 = hr_time_ns(), deadline = t0 + (int64_t)a->lossy_deadline_ms * 1000000;
    uint8_t buf[HN_DGRAM_MAX_BYTES + 8] __attribute__((aligned(8)));
    struct pollfd pf[HC_MAX_DEVICES];
    for (;;) {
        for (int d = 1; d < k; d++) {
            long len;
            while ((len = hn_udp_recv(a->ll[d].udp, buf, HN_DGRAM_MAX_BYTES)) != 0)
                missing -= (size_t)hc_lossy_take(a, d, buf, len, cnt, np);
        }
        int64_t left = deadline - hr_time_ns();
        if (!missing || left <= 0) break;
        for (int d = 1; d < k; d++) pf[d - 1] = (struct pollfd){.fd = hn_udp_fd(a->ll[d].udp), .events = POLLIN};
        struct timespec ts = {.tv_sec = left / 1000000000, .tv_nsec = left % 1000000000};
        ppoll(pf, (nfds_t)(k - 1), &ts, NULL);
    }
    int64_t t1 = hr_time_ns();
    a->wait_ns += t1 - t0;
    uint64_t lost_elems = 0;
    for (int d = 1; d < k; d++) {
        const uint8_t *got = a->got + (size_t)d * a->lmaxp;
        for (size_t i = 0; i < np; i++)
            if (!got[i]) {
                a->ll[d].lost++;
                size_t e = HR_MIN((size_t)HN_DGRAM_MAX_ELEMS, cnt - i * HN_DGRAM_MAX_ELEMS);
                a->ll[d].elems_lost += e;
                lost_elems += e;
            }
        const float *p = a->lbuf + (size_t)d * a->lcap;
        for (size_t i = 0; i < cnt; i++) x[i] += p[i];
    }
    a->lossy_syncs++;
    a->elems_lost_max = HR_MAX(a->elems_lost_max, lost_elems);
    a->send_ns += hr_time_ns() - t1;
}

/* worker: the partial as datagrams to the head, sent once (never retransmitted) */
static void hc_lossy_worker(hc_ar *a, const float *x, int n, int E) {
    size_t cnt = (size_t)n * E;
    hc_lossy_link *l = &a->ll[0];
    uint8_t buf[HN_DGRAM_MAX_BYTES];
    int64_t t0 = hr_time_ns();
    for (size_t off = 0, idx = 0; off < cnt; off += HN_DGRAM_MAX_ELEMS, idx++) {
        hn_dgram g = {.session = a->session, .seq = a->seq, .device = (uint16_t)a->me, .total = (uint32_t)cnt,
                      .offset = (uint32_t)off, .n = (uint32_t)HR_MIN((size_t)HN_DGRAM_MAX_ELEMS, cnt - off),
                      .data = x + off};
        size_t len = hn_dgram_encode(&g, buf, sizeof buf);
        if (hc_lossy_drop(a, (uint32_t)idx)) l->hook_dropped++;
        else if (!len || hn_udp_send(l->udp, buf, len)) l->send_fail++;
        else l->sent++;
        if (a->dup && len && !hn_udp_send(l->udp, buf, len)) l->sent++;
    }
    a->send_ns += hr_time_ns() - t0;
}

/* star, head side: add the workers' partials in device order (TCP, or the lossy merge), send the sum
   back over TCP — reliably, so that every device continues from the same values (docs/lossy.md) */
static int hc_star_head(hc_ar *a, int layer, uint32_t stage, float *x, int n, int E, uint64_t compute_ns) {
    size_t cnt = (size_t)n * E;
    if (hc_lossy_on(a, layer, n)) hc_lossy_head(a, x, n, E);
    else
        for (int d = 1; d < a->k; d++) {
            hn_msg m;
            int rc = hc_ar_recv(a, d, a->conn[d], &a->rx[d], &m, HN_MSG_PARTIAL, n);
            if (rc) return rc;
            if ((rc = hc_partial_check(a, d, &m.u.partial, layer, stage, n, E, 0, cnt))) return rc;
            int64_t t0 = hr_time_ns();
            const float *p = m.u.partial.data;
            for (size_t i = 0; i < cnt; i++) x[i] += p[i];
            a->send_ns += hr_time_ns() - t0;
        }
    hn_msg r = {.type = HN_MSG_RESULT, .seq = a->seq};
    r.u.result = (hn_result){.layer_end = (uint32_t)layer + 1, .n_tokens = (uint32_t)n, .n_embd = (uint32_t)E,
                             .compute_ns = compute_ns, .data = x};
    for (int d = 1; d < a->k; d++) {
        int rc = hc_ar_send(a, d, a->conn[d], &r, n);
        if (rc) return rc;
    }
    return 0;
}

/* star, worker side: send the partial, take the sum */
static int hc_star_worker(hc_ar *a, int layer, uint32_t stage, float *x, int n, int E, uint64_t compute_ns) {
    size_t cnt = (size_t)n * E;
    int rc;
    if (hc_lossy_on(a, layer, n)) hc_lossy_worker(a, x, n, E);
    else {
        hn_msg p = {.type = HN_MSG_PARTIAL, .seq = a->seq};
        p.u.partial = (hn_partial){.layer = (uint32_t)layer, .stage = stage, .n_tokens = (uint32_t)n,
                                   .n_embd = (uint32_t)E, .offset = 0, .n = (uint32_t)cnt, .compute_ns = compute_ns,
                                   .data = x};
        if ((rc = hc_ar_send(a, 0, a->conn[0], &p, n))) return rc;
    }
    hn_msg m;
    if ((rc = hc_ar_recv(a, 0, a->conn[0], &a->rx[0], &m, HN_MSG_RESULT, n))) return rc;
    const hn_result *r = &m.u.result;
    if (r->n_tokens != (uint32_t)n || r->n_embd != (uint32_t)E)
        return hc_ar_fail(a, 0, HR_EPROTO, "RESULT has another shape than the partial");
    memcpy(x, r->data, cnt * sizeof(float));
    return 0;
}

static inline int hc_mod(int v, int k) { return ((v % k) + k) % k; }

/* ring: reduce-scatter, then all-gather; chunk c is elements [c N / k, (c+1) N / k). Every step moves
   its chunk in pieces of at most HC_RING_PIECE elements, and every device sends a piece before it
   receives one: the sends of a step go out at once around the ring (a true ring, not a relay), and
   since a link never holds more than one unread piece, which its socket buffer takes
   (hc_ar_ring_init), no send can block on a peer that is itself blocked sending. */
#define HC_RING_PIECE 16384

void hc_ar_ring_init(hc_ar *a) {
    int sz = 4 * HC_RING_PIECE * (int)sizeof(float);
    if (a->next) setsockopt(hn_conn_fd(a->next), SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
}

static int hc_ring(hc_ar *a, int layer, uint32_t stage, float *x, int n, int E, uint64_t compute_ns) {
    int k = a->k, me = a->me;
    uint64_t N = (uint64_t)n * E;
    for (int phase = 0; phase < 2; phase++) {
        for (int s = 0; s < k - 1; s++) {
            int sc = phase == 0 ? hc_mod(me - s, k) : hc_mod(me + 1 - s, k);
            int rcn = phase == 0 ? hc_mod(me - s - 1, k) : hc_mod(me - s, k);
            uint64_t s0 = N * (uint64_t)sc / (uint64_t)k, s1 = N * (uint64_t)(sc + 1) / (uint64_t)k;
            uint64_t r0 = N * (uint64_t)rcn / (uint64_t)k, r1 = N * (uint64_t)(rcn + 1) / (uint64_t)k;
            for (uint64_t so = s0, ro = r0; so < s1 || ro < r1;) {
                int rc;
                if (so < s1) {
                    uint64_t cnt = HR_MIN((uint64_t)HC_RING_PIECE, s1 - so);
                    hn_msg p = {.type = HN_MSG_PARTIAL, .seq = a->seq};
                    p.u.partial = (hn_partial){.layer = (uint32_t)layer, .stage = stage, .n_tokens = (uint32_t)n,
                                               .n_embd = (uint32_t)E, .offset = (uint32_t)so, .n = (uint32_t)cnt,
                                               .compute_ns = compute_ns, .data = x + so};
                    if ((rc = hc_ar_send(a, a->next_dev, a->next, &p, n))) return rc;
                    so += cnt;
                }
                if (ro < r1) {
                    uint64_t cnt = HR_MIN((uint64_t)HC_RING_PIECE, r1 - ro);
                    hn_msg m;
                    if ((rc = hc_ar_recv(a, a->prev_dev, a->prev, &a->ring_rx, &m, HN_MSG_PARTIAL, n))) return rc;
                    if ((rc = hc_partial_check(a, a->prev_dev, &m.u.partial, layer, stage, n, E, ro, cnt))) return rc;
                    int64_t t0 = hr_time_ns();
                    const float *d = m.u.partial.data;
                    float *dst = x + ro;
                    if (phase == 0) for (uint64_t i = 0; i < cnt; i++) dst[i] += d[i];
                    else memcpy(dst, d, (size_t)cnt * sizeof(float));
                    a->send_ns += hr_time_ns() - t0;
                    ro += cnt;
                }
            }
        }
    }
    return 0;
}

int hc_ar_sync(void *user, int layer, enum hm_block b, float *x, int n, int n_embd) {
    hc_ar *a = user;
    int64_t now = hr_time_ns();
    uint64_t compute_ns = (uint64_t)(now - a->mark);
    a->compute_ns += now - a->mark;
    a->seq++;
    int rc = 0;
    uint32_t stage = b == HM_BLOCK_ATTN ? HN_STAGE_ATTN : HN_STAGE_FFN;
    if (a->k > 1) {
        if (a->mode == HC_ALLREDUCE_RING) rc = hc_ring(a, layer, stage, x, n, n_embd, compute_ns);
        else if (a->me == 0) rc = hc_star_head(a, layer, stage, x, n, n_embd, compute_ns);
        else rc = hc_star_worker(a, layer, stage, x, n, n_embd, compute_ns);
        if (!rc) a->sum_hash = hr_hash64(x, (size_t)n * n_embd * sizeof(float), a->sum_hash);
    }
    a->mark = hr_time_ns();
    return rc;
}
