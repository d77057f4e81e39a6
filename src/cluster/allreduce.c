/* cluster/allreduce: the shard's sync hook — star and ring all-reduce over the session's
   connections (see cluster.h, "All-reduce") */
#define _GNU_SOURCE /* ppoll */
#include "cluster-impl.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

int64_t hc_ar_deadline(const hc_ar *a, int n) {
    return hn_deadline_ms(a->timeout_ms + (a->token_ms > 0 ? a->token_ms : HC_TOKEN_MS) * (int64_t)n);
}

static const char *hc_role(int dev) { return dev == 0 ? "head" : "worker"; }

/* records why the sync failed, naming the peer: the forward pass only passes the code on */
static int hc_ar_fail(hc_ar *a, int dev, int rc, const char *msg) {
    a->err_dev = dev;
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

/* ---- lossy star (docs/lossy.md): workers' partials as datagrams, merged at a deadline; the sum goes
   back as datagrams too, and a worker that misses any asks again (NACK) until it has all of them ---- */

bool hc_ar_lossy_on(const hc_ar *a, int layer, int n) {
    return a->lossy && layer > 0 && n <= a->lossy_max_tokens;
}

/* the last all-reduce of a pass: only the head continues from its sum (to the output head) */
static bool hc_lossy_last(const hc_ar *a, int layer, uint32_t stage) {
    return layer == a->n_layer - 1 && stage == HN_STAGE_FFN;
}

int hc_ar_lossy_alloc(hc_ar *a, int n_embd) {
    a->lcap = (size_t)a->lossy_max_tokens * (size_t)n_embd;
    /* sealed datagrams hold fewer elements: room for the most datagrams either way */
    a->lmaxp = (a->lcap + HN_DGRAM_MAX_ELEMS_SEALED - 1) / HN_DGRAM_MAX_ELEMS_SEALED;
    a->lbuf = malloc((size_t)a->k * a->lcap * sizeof(float));
    a->got = malloc((size_t)a->k * a->lmaxp);
    a->nkeep = 2 * HR_MAX(a->n_layer, 1);
    a->keep = calloc((size_t)a->nkeep, sizeof *a->keep);
    a->keep_seq = calloc((size_t)a->nkeep, sizeof *a->keep_seq);
    a->keep_cnt = calloc((size_t)a->nkeep, sizeof *a->keep_cnt);
    a->keep_cap = calloc((size_t)a->nkeep, sizeof *a->keep_cap);
    return a->lbuf && a->got && a->keep && a->keep_seq && a->keep_cnt && a->keep_cap ? 0 : HR_ENOMEM;
}

void hc_ar_lossy_free(hc_ar *a) {
    for (int i = 0; a->keep && i < a->nkeep; i++) free(a->keep[i]);
    free(a->lbuf);
    free(a->got);
    free(a->keep);
    free(a->keep_seq);
    free(a->keep_cnt);
    free(a->keep_cap);
    a->lbuf = NULL;
    a->got = NULL;
    a->keep = NULL;
    a->keep_seq = NULL;
    a->keep_cnt = a->keep_cap = NULL;
    a->nkeep = 0;
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

/* elements per datagram: fewer when the links seal them (all links do, or none: the cluster key) */
static size_t hc_lossy_pe(const hc_ar *a) { return hn_dgram_max_elems(&a->ll[a->me == 0 ? 1 : 0].crypt); }

/* x[0, cnt) as datagrams of `kind` for all-reduce seq on link l (the test hook may drop some: counted
   in *dropped); idx0 numbers them for the hook. Returns the datagrams the kernel took. */
static uint64_t hc_lossy_send(hc_ar *a, hc_lossy_link *l, int kind, uint32_t seq, const float *x, size_t cnt,
                              uint32_t idx0, uint64_t *dropped) {
    uint8_t buf[HN_DGRAM_MAX_BYTES];
    uint64_t sent = 0;
    const size_t pe = hc_lossy_pe(a);
    for (size_t off = 0, idx = idx0; off < cnt; off += pe, idx++) {
        hn_dgram g = {.kind = kind, .session = a->session, .seq = seq, .device = (uint16_t)a->me,
                      .total = (uint32_t)cnt, .offset = (uint32_t)off,
                      .n = (uint32_t)HR_MIN(pe, cnt - off), .data = x + off};
        size_t len = hn_dgram_encode(&g, &l->crypt, buf, sizeof buf);
        if (hc_lossy_drop(a, (uint32_t)idx)) (*dropped)++;
        else if (!len || hn_udp_send(l->udp, buf, len)) l->send_fail++;
        else sent++;
        if (a->dup && len && !hn_udp_send(l->udp, buf, len)) sent++;
        if (off + pe >= cnt && kind != HN_DGRAM_NACK && len) {
            /* the tail again, flagged: one lost tail no longer hides that the burst is over */
            g.flags = HN_DGRAM_REPEAT;
            if (hn_dgram_encode(&g, &l->crypt, buf, sizeof buf) && !hc_lossy_drop(a, (uint32_t)idx + (1u << 24)))
                hn_udp_send(l->udp, buf, len);
        }
    }
    return sent;
}

/* Checks a datagram that arrived during all-reduce a->seq of cnt elements against what `kind` from
   device `from` must be: 1 when it is a piece of this all-reduce (g filled, *idx its number), else 0
   with the reason counted (a NACK for a sum the head kept is answered here). cnt 0: between all-reduces. */
static int hc_lossy_check(hc_ar *a, hc_lossy_link *l, int from, int kind, const uint8_t *buf, long len, size_t cnt,
                          hn_dgram *g, size_t *idx) {
    if (len == -1) { l->foreign++; return 0; }   /* from another address (or a receive error) */
    int rc = len < 0 ? HR_EFORMAT : hn_dgram_decode(buf, (size_t)len, &l->crypt, g, NULL, 0);
    if (rc == HR_EAUTH) { l->auth_failed++; return 0; }   /* not sealed with this link's key, or altered */
    if (rc == HR_EEXIST) { l->dup++; return 0; }          /* a counter seen: a replay or a network duplicate */
    if (rc) { l->malformed++; return 0; }
    if (g->session != a->session || g->device != (uint16_t)from) { l->foreign++; return 0; }
    if (a->me == 0) hn_udp_reply_to_last(l->udp);   /* a genuine datagram: where the worker listens */
    if (g->kind == HN_DGRAM_PARTIAL && g->seq > l->heard) l->heard = g->seq;
    if (g->kind == HN_DGRAM_NACK && kind == HN_DGRAM_PARTIAL) {
        /* the worker missed some of a sum: all of it again, if the head has sent it (an early NACK,
           for the sum being merged now, waits for it). Any kept sum, not only the last: a worker
           the head went on without may still wait for an older one (hc_lossy_keep) */
        l->nacks++;
        int slot = a->nkeep ? (int)(g->seq % (uint32_t)a->nkeep) : 0;
        if (a->nkeep && a->keep_seq[slot] == g->seq && a->keep_cnt[slot])
            l->resends += hc_lossy_send(a, l, HN_DGRAM_RESULT, g->seq, a->keep[slot], a->keep_cnt[slot],
                                        (1u << 16) + (uint32_t)(l->nacks << 8), /* each resend its own drops */
                                        &l->res_dropped);
        return 0;
    }
    if (g->kind != kind) { l->malformed++; return 0; }
    /* cnt 0: between all-reduces (hc_ar_lossy_wait), when all-reduce a->seq is merged too */
    bool merged = g->seq < a->seq || (!cnt && g->seq == a->seq);
    if (merged && (g->flags & HN_DGRAM_REPEAT)) return 0;   /* the copy of a tail already merged */
    if (merged) { *(kind == HN_DGRAM_RESULT ? &l->res_late : &l->late) += 1; return 0; }
    /* a later all-reduce cannot have started before this one is complete; datagrams have fixed bounds */
    const size_t pe = hc_lossy_pe(a);
    if (g->seq != a->seq || g->total != cnt || g->offset % pe || g->n != HR_MIN(pe, cnt - g->offset)) {
        l->malformed++;
        return 0;
    }
    *idx = g->offset / pe;
    return 1;
}

/* head: waits for the workers' datagrams, then adds what arrived in device order (a missing range adds
   zero): with nothing lost, the very sum of the TCP star. The deadline runs per worker from its first
   datagram of this all-reduce, so that a worker still computing (skew, a CPU quota's slice) is not
   taken for loss. A worker none of whose datagrams arrived yet is most likely still computing when it
   sends HC_LOSSY_SURE_NP or more of them (all lost at 10% loss: < 1e-3), and is waited for as the TCP
   star would; one that sends fewer is waited for the deadline plus its usual lateness + 4 deviations
   (TCP's RTO estimator) (docs/lossy.md). */
/* Nothing may come over a TCP connection during a lossy all-reduce: anything there (ERROR, BYE, the
   peer's end) ends it with hc_ar_recv's message naming the peer. */
static int hc_lossy_tcp(hc_ar *a, int dev, hn_conn *c, hn_frame *f, int n, int want) {
    hn_msg m;
    int rc = hc_ar_recv(a, dev, c, f, &m, want, n);
    return rc ? rc : hc_ar_fail(a, dev, HR_EPROTO, "a message during a lossy all-reduce");
}

static int hc_lossy_head(hc_ar *a, float *x, int n, int E) {
    size_t cnt = (size_t)n * E, pe = hc_lossy_pe(a), np = (cnt + pe - 1) / pe;
    int k = a->k;
    int64_t t0 = hr_time_ns(), D = (int64_t)a->lossy_deadline_ms * 1000000;
    int64_t dl[HC_MAX_DEVICES];        /* worker d's deadline */
    size_t left[HC_MAX_DEVICES];       /* its datagrams still missing */
    bool first[HC_MAX_DEVICES] = {0};  /* one of them arrived */
    bool tail[HC_MAX_DEVICES] = {0};   /* its last one arrived */
    size_t missing = 0;
    for (int d = 1; d < k; d++) {
        memset(a->lbuf + (size_t)d * a->lcap, 0, cnt * sizeof(float));
        memset(a->got + (size_t)d * a->lmaxp, 0, np);
        const hc_lossy_link *l = &a->ll[d];
        int64_t tmo = hc_ar_deadline(a, n) - t0;
        dl[d] = t0 + (np >= HC_LOSSY_SURE_NP ? tmo : D + HR_MIN(l->skew_ns + 4 * l->skew_dev_ns, tmo));
        left[d] = np;
        missing += np;
    }
    uint8_t buf[HN_DGRAM_MAX_BYTES + 8] __attribute__((aligned(8)));
    struct pollfd pf[2 * HC_MAX_DEVICES];
    for (;;) {
        for (int d = 1; d < k; d++) {
            hc_lossy_link *l = &a->ll[d];
            long len;
            while ((len = hn_udp_recv(l->udp, buf, HN_DGRAM_MAX_BYTES)) != 0) {
                hn_dgram g;
                size_t idx;
                if (!hc_lossy_check(a, l, d, HN_DGRAM_PARTIAL, buf, len, cnt, &g, &idx)) continue;
                uint8_t *got = a->got + (size_t)d * a->lmaxp;
                if (idx == np - 1 && !tail[d]) {
                    /* the burst is over: whatever is missing now is lost (after a reordering grace) */
                    tail[d] = true;
                    dl[d] = HR_MIN(dl[d], hr_time_ns() + HC_LOSSY_GRACE_NS);
                }
                if (got[idx]) { if (!(g.flags & HN_DGRAM_REPEAT)) l->dup++; continue; }
                got[idx] = 1;
                memcpy(a->lbuf + (size_t)d * a->lcap + g.offset, g.data, (size_t)g.n * sizeof(float));
                l->received++;
                missing--;
                left[d]--;
                if (!first[d]) {
                    first[d] = true;
                    int64_t now = hr_time_ns(), e = now - t0 - l->skew_ns;
                    if (!tail[d]) dl[d] = now + D;
                    l->skew_ns += e / 8;
                    l->skew_dev_ns += ((e < 0 ? -e : e) - l->skew_dev_ns) / 4;
                }
            }
        }
        /* on until every worker with datagrams missing is past its own deadline */
        int64_t now = hr_time_ns(), wake = INT64_MAX;
        for (int d = 1; d < k; d++)
            if (left[d] && dl[d] > now) wake = HR_MIN(wake, dl[d]);
        if (!missing || wake == INT64_MAX) break;
        /* the workers' TCP connections too: a worker that fails or dies ends the pass at once, as on TCP */
        for (int d = 1; d < k; d++) {
            pf[d - 1] = (struct pollfd){.fd = hn_udp_fd(a->ll[d].udp), .events = POLLIN};
            pf[k - 2 + d] = (struct pollfd){.fd = hn_conn_fd(a->conn[d]), .events = POLLIN};
        }
        struct timespec ts = {.tv_sec = (wake - now) / 1000000000, .tv_nsec = (wake - now) % 1000000000};
        if (ppoll(pf, (nfds_t)(2 * (k - 1)), &ts, NULL) > 0)
            for (int d = 1; d < k; d++)
                if (pf[k - 2 + d].revents) return hc_lossy_tcp(a, d, a->conn[d], &a->rx[d], n, HN_MSG_PARTIAL);
    }
    for (int d = 1; d < k; d++)
        if (!first[d] && np >= HC_LOSSY_SURE_NP)   /* waited the whole TCP deadline for nothing */
            return hc_ar_fail(a, d, HR_ETIMEDOUT, "no partial sum arrived in time (lossy all-reduce)");
    int64_t t1 = hr_time_ns();
    a->wait_ns += t1 - t0;
    uint64_t lost_elems = 0;
    for (int d = 1; d < k; d++) {
        const uint8_t *got = a->got + (size_t)d * a->lmaxp;
        for (size_t i = 0; i < np; i++)
            if (!got[i]) {
                a->ll[d].lost++;
                size_t e = HR_MIN(pe, cnt - i * pe);
                a->ll[d].elems_lost += e;
                lost_elems += e;
            }
        const float *p = a->lbuf + (size_t)d * a->lcap;
        for (size_t i = 0; i < cnt; i++) x[i] += p[i];
    }
    a->lossy_syncs++;
    a->settle_seq = a->seq;
    a->elems_lost_max = HR_MAX(a->elems_lost_max, lost_elems);
    a->send_ns += hr_time_ns() - t1;
    return 0;
}

/* head: keeps sum seq for the workers' NACKs, in slot seq % nkeep. Enough slots: the head completes
   a TCP all-reduce only once every worker has sent its partial, so every worker has had every earlier
   sum; layer 0's all-reduces are on TCP, so the last one the head completed is less than a pass (2
   n_layer all-reduces) before any sum it stores now, and the sum this one replaces (nkeep = 2 n_layer
   older) no worker can still wait for. */
static int hc_lossy_keep(hc_ar *a, const float *x, size_t cnt) {
    int slot = (int)(a->seq % (uint32_t)a->nkeep);
    if (a->keep_cap[slot] < cnt) {
        float *p = realloc(a->keep[slot], cnt * sizeof(float));
        if (!p) return hr_fail(&a->err, HR_ENOMEM, "out of memory (the lossy all-reduce's sums)");
        a->keep[slot] = p;
        a->keep_cap[slot] = cnt;
    }
    memcpy(a->keep[slot], x, cnt * sizeof(float));
    a->keep_seq[slot] = a->seq;
    a->keep_cnt[slot] = cnt;
    return 0;
}

/* head: the sum back to every worker as datagrams, kept for their NACKs */
static int hc_lossy_head_result(hc_ar *a, const float *x, size_t cnt) {
    int64_t t0 = hr_time_ns();
    int rc = hc_lossy_keep(a, x, cnt);
    if (rc) return rc;
    for (int d = 1; d < a->k; d++) {
        hc_lossy_link *l = &a->ll[d];
        l->res_sent += hc_lossy_send(a, l, HN_DGRAM_RESULT, a->seq, x, cnt, 0, &l->res_dropped);
    }
    a->send_ns += hr_time_ns() - t0;
    return 0;
}

/* head, between all-reduces: reads the workers' datagrams, answering NACKs, until c (if any) is readable,
   the deadline, or (settle) no worker is behind the last all-reduce; settle also moves the deadline on
   whenever a worker that is behind asks for a sum, up to `bound` */
static void hc_lossy_idle(hc_ar *a, hn_conn *c, int64_t deadline, bool settle, int64_t bound) {
    uint8_t buf[HN_DGRAM_MAX_BYTES + 8] __attribute__((aligned(8)));
    struct pollfd pf[HC_MAX_DEVICES];
    uint64_t nacks0[HC_MAX_DEVICES];
    for (int d = 1; d < a->k; d++) nacks0[d] = a->ll[d].nacks;
    for (;;) {
        /* NACKs answered; anything else is counted as in an all-reduce (a partial is late by now) */
        for (int d = 1; d < a->k; d++) {
            long len;
            while ((len = hn_udp_recv(a->ll[d].udp, buf, HN_DGRAM_MAX_BYTES)) != 0) {
                hn_dgram g;
                size_t idx;
                hc_lossy_check(a, &a->ll[d], d, HN_DGRAM_PARTIAL, buf, len, 0, &g, &idx);
            }
        }
        if (settle) {
            bool behind = false;
            for (int d = 1; d < a->k; d++)
                if (a->ll[d].heard < a->seq) {
                    behind = true;
                    if (a->ll[d].nacks != nacks0[d]) {   /* it waits for a sum: stay for its partial, or its next NACK */
                        nacks0[d] = a->ll[d].nacks;
                        deadline = HR_MIN(bound, hr_time_ns() + 4 * (int64_t)a->lossy_deadline_ms * 1000000);
                    }
                }
            if (!behind) return;
        }
        int64_t now = hr_time_ns();
        if (now >= deadline) return;
        int n = 0;
        if (c) pf[n++] = (struct pollfd){.fd = hn_conn_fd(c), .events = POLLIN};
        for (int d = 1; d < a->k; d++) pf[n++] = (struct pollfd){.fd = hn_udp_fd(a->ll[d].udp), .events = POLLIN};
        int64_t wake = deadline - now;
        struct timespec ts = {.tv_sec = wake / 1000000000, .tv_nsec = wake % 1000000000};
        int r = ppoll(pf, (nfds_t)n, &ts, NULL);
        if (r < 0 ? errno != EINTR : c && r > 0 && pf[0].revents) return;   /* the message (or the error) is hn_msg_recv's */
    }
}

void hc_ar_lossy_wait(hc_ar *a, hn_conn *c, int64_t deadline) {
    if (!a->lossy || a->me != 0 || !a->nkeep || a->k < 2) return;
    hc_lossy_idle(a, c, deadline, false, 0);
}

void hc_ar_lossy_settle(hc_ar *a) {
    if (!a->lossy || a->me != 0 || !a->nkeep || a->k < 2 || a->settle_seq != a->seq || !a->seq) return;
    bool behind = false;
    for (int d = 1; d < a->k; d++) behind = behind || a->ll[d].heard < a->seq;
    if (!behind) return;
    int64_t t0 = hr_time_ns(), D = (int64_t)a->lossy_deadline_ms * 1000000;
    hc_lossy_idle(a, NULL, t0 + 2 * D, true, t0 + (int64_t)HC_LOSSY_SETTLE_MS * 1000000);
    a->settles++;
    a->settle_ns += hr_time_ns() - t0;
}

/* worker: the sum's datagrams into x until it has all of them; a NACK when some are still missing 1 ms
   after one came (or, none yet, after the deadline, then backing off) — the head sends all again. Fails
   only when the sum is not complete by the all-reduce's TCP deadline: every device continues from the
   same values or the pass fails. */
static int hc_lossy_worker_result(hc_ar *a, float *x, int n, int E) {
    size_t cnt = (size_t)n * E, pe = hc_lossy_pe(a), np = (cnt + pe - 1) / pe;
    hc_lossy_link *l = &a->ll[0];
    /* >= np: n <= HC_LOSSY_MAX_TOKENS, E / HN_DGRAM_MAX_ELEMS_SEALED < 64 */
    uint8_t got[HC_LOSSY_MAX_TOKENS * 64] = {0};
    if (np > sizeof got) return hc_ar_fail(a, 0, HR_ERANGE, "a lossy all-reduce too large");
    size_t left = np;
    int64_t t0 = hr_time_ns(), end = hc_ar_deadline(a, n), D = (int64_t)a->lossy_deadline_ms * 1000000;
    int64_t gap = D, nack_at = t0 + gap;   /* none yet: the head may still be merging; back off */
    uint32_t nack_no = 0;
    uint8_t buf[HN_DGRAM_MAX_BYTES + 8] __attribute__((aligned(8)));
    for (;;) {
        long len;
        /* no further than this sum: a head that merged without this worker (late: descheduled, a CPU
           quota) may have sent the next sums already, which the next all-reduces take from the socket */
        while (left && (len = hn_udp_recv(l->udp, buf, HN_DGRAM_MAX_BYTES)) != 0) {
            hn_dgram g;
            size_t idx;
            if (!hc_lossy_check(a, l, 0, HN_DGRAM_RESULT, buf, len, cnt, &g, &idx)) continue;
            if (got[idx]) { if (!(g.flags & HN_DGRAM_REPEAT)) l->dup++; continue; }
            if (left == np) nack_at = hr_time_ns() + (gap = 1000000);  /* the rest of a burst: soon */
            if (idx == np - 1) nack_at = HR_MIN(nack_at, hr_time_ns() + HC_LOSSY_GRACE_NS); /* it is over */
            got[idx] = 1;
            memcpy(x + g.offset, g.data, (size_t)g.n * sizeof(float));
            l->res_received++;
            left--;
        }
        if (!left) break;
        int64_t now = hr_time_ns();
        if (now >= end) return hc_ar_fail(a, 0, HR_ETIMEDOUT, "the sum of a lossy all-reduce did not arrive in time");
        if (now >= nack_at) {
            /* NACK: one element, 0; numbered apart from the partial's datagrams for the test hook */
            float zero = 0;
            l->nacks += hc_lossy_send(a, l, HN_DGRAM_NACK, a->seq, &zero, 1, (1u << 17) + nack_no++, &l->res_dropped);
            if (left == np) gap = HR_MIN(2 * gap, 200 * 1000000LL);
            nack_at = now + gap;
        }
        int64_t wake = HR_MIN(nack_at, end) - now;
        /* A message from the head is no reason to stop: a head that merged without this worker (late:
           descheduled, a CPU quota) may have sent its next FORWARD, or asked for the stats, and it
           answers NACKs for every sum of the pass while it waits for this worker's next TCP message
           (hc_ar_lossy_wait), which comes once the pass is over. Only the head's end (it closed: a
           failure elsewhere, BYE) ends the wait at once, with the message it left. */
        struct pollfd pf[2] = {{.fd = hn_udp_fd(l->udp), .events = POLLIN},
                               {.fd = hn_conn_fd(a->conn[0]), .events = POLLRDHUP}};
        struct timespec ts = {.tv_sec = wake / 1000000000, .tv_nsec = wake % 1000000000};
        /* the datagrams first: the sum may be there with the head's end behind it */
        if (ppoll(pf, 2, &ts, NULL) > 0 && pf[1].revents && !pf[0].revents)
            return hc_lossy_tcp(a, 0, a->conn[0], &a->rx[0], n, HN_MSG_RESULT);
    }
    a->wait_ns += hr_time_ns() - t0;
    return 0;
}

/* star, head side: add the workers' partials in device order (TCP, or the lossy merge), send the sum
   back over TCP — reliably, so that every device continues from the same values (docs/lossy.md) */
static int hc_star_head(hc_ar *a, int layer, uint32_t stage, float *x, int n, int E, uint64_t compute_ns) {
    size_t cnt = (size_t)n * E;
    if (hc_ar_lossy_on(a, layer, n)) {
        int rc = hc_lossy_head(a, x, n, E);
        if (!rc && !hc_lossy_last(a, layer, stage)) rc = hc_lossy_head_result(a, x, cnt);
        return rc;
    }
        for (int d = 1; d < a->k; d++) {
            hn_msg m;
            hc_ar_lossy_wait(a, a->conn[d], hc_ar_deadline(a, n));  /* a worker may still miss a sum */
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
    if (hc_ar_lossy_on(a, layer, n)) {
        int64_t t0 = hr_time_ns();
        a->ll[0].sent += hc_lossy_send(a, &a->ll[0], HN_DGRAM_PARTIAL, a->seq, x, cnt, 0, &a->ll[0].hook_dropped);
        a->send_ns += hr_time_ns() - t0;
        return hc_lossy_last(a, layer, stage) ? 0 : hc_lossy_worker_result(a, x, n, E);
    }
    {
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
        /* the last sum of a pass: in lossy mode the head's alone (hc_lossy_last), so hashed nowhere */
        if (!rc && !hc_lossy_last(a, layer, stage))
            a->sum_hash = hr_hash64(x, (size_t)n * n_embd * sizeof(float), a->sum_hash);
    }
    a->mark = hr_time_ns();
    return rc;
}
