/* cluster/recover: a device that leaves does not end the answer (docs/reliability.md, "A device that
   leaves"). hc_head runs one incarnation of the head (hc_core, head.c) and keeps every sequence's
   tokens as the forward passes wrote them into the KV caches. When a pass fails because of a worker
   (it died, closed its connection, missed its deadline — a stopped process does that — or broke the
   protocol), the incarnation is dropped (its workers are told BYE, so their sessions end and a
   stopped one that resumes finds its session over), the plan is made again over the workers that
   remain (the caller's planner through p->replan, else the given shares or windows without the
   missing devices), a new incarnation is set up (weights from the head's mapping and the workers'
   slice caches), the token history is run through it again, and the pass that failed is run once
   more: the caller gets the logits a failure-free run gives. No worker left: the head alone. */
#define _GNU_SOURCE
#include "cluster-impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define HC_BUSY_WAIT_MS  5000  /* a worker still ending the failed session answers "busy" that long */
#define HC_REJOIN_MS     1000  /* deadline of the HELLO that asks a missing worker whether it is back */
#define HC_REJOIN_EVERY  2000  /* at most one such round per this many ms */

/* one sequence's tokens, position by position, and whether each took attention's F32 path (its
   batch held HM_BATCH_F32_TOKENS or more of the sequence's tokens): the replay cuts them so again */
typedef struct hc_hist {
    int32_t *tok;
    uint8_t *f32;
    int32_t  len, cap;
    bool     lost;   /* written with a gap before it: cannot be rebuilt */
} hc_hist;

struct hc_head {
    const hm_model *m;
    hc_head_params  orig;                 /* as given */
    hm_ctx_params   cp;
    hc_core        *c;
    hc_head_params  cur;                  /* c's: the workers that remain, their plan */
    bool            gone[HC_MAX_DEVICES - 1]; /* orig.workers[i] left */
    int32_t         n_seq, n_ctx, n_batch;
    hc_hist        *hist;                 /* [n_seq] */
    int             recoveries;
    char            warning[512];         /* the last warning: a worker left */
    int64_t         last_rejoin;
    int32_t        *rb_seq, *rb_tok;      /* [n_batch]: the replay's sequence ids and tokens */
};

/* A worker's failure that it leaving answers: it is gone, silent or broke the protocol. A bad address or
   argument (HR_EINVAL, HR_ERANGE) is the caller's to fix, and a device whose memory cannot hold its part
   (HR_ENOMEM) is the plan's limit: the budgets hold, so that is the error, not a device leaving. A peer
   that fails authentication (HR_EAUTH: another cluster key, none, or frames altered on the way) is not
   one of ours to plan around: that is said, not hidden behind a re-plan. */
static bool hc_leaves(int code) {
    return code != HR_EINVAL && code != HR_ERANGE && code != HR_ENOMEM && code != HR_EAUTH;
}

/* ---- the token history ---- */

static int hc_hist_put(hc_hist *q, int32_t pos, int32_t tok, bool f32) {
    if (pos >= q->cap) {
        int32_t cap = HR_MAX(pos + 1, HR_MAX(64, q->cap * 2));
        int32_t *t = realloc(q->tok, sizeof *t * (size_t)cap);
        if (t) q->tok = t;
        uint8_t *f = t ? realloc(q->f32, (size_t)cap) : NULL;
        if (f) q->f32 = f;
        if (!t || !f) return HR_ENOMEM;
        q->cap = cap;
    }
    q->tok[pos] = tok;
    q->f32[pos] = f32;
    return 0;
}

/* a successful batch into the history: each sequence now holds its tokens up to the last this batch
   wrote (what lies beyond is stale in the caches and is overwritten before it is read) */
static void hc_hist_batch(hc_head *H, const int32_t *tokens, int n, const int32_t *seq, const int32_t *pos_of,
                          int32_t pos) {
    int32_t cnt[256], *c = cnt;
    if (H->n_seq > 256 && !(c = calloc((size_t)H->n_seq, sizeof *c))) goto lost;
    if (c == cnt) memset(cnt, 0, sizeof cnt);
    for (int i = 0; i < n; i++) c[seq ? seq[i] : 0]++;
    for (int i = 0; i < n; i++) {
        hc_hist *q = &H->hist[seq ? seq[i] : 0];
        int32_t p = pos_of ? pos_of[i] : pos + i;
        if (p > q->len) q->lost = true;    /* a position before it was never written */
        if (hc_hist_put(q, p, tokens[i], c[seq ? seq[i] : 0] >= HM_BATCH_F32_TOKENS)) q->lost = true;
        q->len = p + 1;
    }
    if (c != cnt) free(c);
    return;
lost:
    for (int i = 0; i < n; i++) H->hist[seq ? seq[i] : 0].lost = true;
}

/* ---- plans over the workers that remain ---- */

/* window sizes kept[0..n) of a plan whose sizes summed to sum: scaled so that a round places as many
   layers as before, each non-zero one at least one layer (none kept: one even round) */
static void hc_windows_scale(hc_head_params *p, int n, int sum, int kept) {
    p->n_windows = kept > 0 ? n : 0;
    for (int d = 0; d < n && kept > 0; d++)
        if (p->layer_windows[d] > 0) p->layer_windows[d] = HR_MAX(1, (int)((double)p->layer_windows[d] * sum / kept + 0.5));
}

/* A hybrid plan without the devices that left: every group keeps the members that remain (with their
   shares; a group reduced to one device is a plain stage), a stage none of whose devices remains is
   dropped. Only the head's stage left: tensor parallelism over it; no group left: a plain pipeline. */
static void hc_stages_without(const hc_head *H, hc_head_params *p) {
    const hc_head_params *o = &H->orig;
    int ns = 0, sum = 0, kept = 0, nsh = 0, groups = 0;
    for (int s = 0, d = 0, wi = 0; s < o->n_stages; s++) {
        const int n = o->stage_devs[s];
        int left = 0;
        double w[HC_MAX_DEVICES];
        for (int i = d; i < d + n; i++)
            if (i == 0 || !H->gone[i - 1]) w[left++] = n > 1 && o->n_shares ? o->shares[wi + i - d] : 1;
        if (o->n_windows) sum += o->layer_windows[s];
        if (left > 0) {
            if (o->n_windows) kept += (p->layer_windows[ns] = o->layer_windows[s]);
            p->stage_devs[ns++] = left;
        }
        if (left > 1) {
            groups++;
            memcpy(p->shares + nsh, w, sizeof w[0] * (size_t)left);
            nsh += left;
        }
        wi += n > 1 ? n : 0;
        d += n;
    }
    p->n_stages = ns;
    p->n_shares = o->n_shares ? nsh : 0;
    if (o->n_windows) hc_windows_scale(p, ns, sum, kept);
    if (ns == 1) p->pp = false, p->n_stages = p->n_windows = 0;
    else if (!groups) p->n_stages = p->n_shares = 0;
}

/* The given plan without the devices that left: shares and windows of the others (windows scaled so
   that a round places as many layers as before; each keeps at least one layer). */
static void hc_plan_without(const hc_head *H, hc_head_params *p) {
    const hc_head_params *o = &H->orig;
    if (o->pp && o->n_stages) {
        hc_stages_without(H, p);
        return;
    }
    int k = 1;
    if (o->n_shares) p->shares[0] = o->shares[0];
    if (o->n_windows) p->layer_windows[0] = o->layer_windows[0];
    int sum = o->n_windows ? o->layer_windows[0] : 0, kept = sum;
    for (int i = 0; i < o->n_workers; i++) {
        if (o->n_windows) sum += o->layer_windows[i + 1];
        if (H->gone[i]) continue;
        if (o->n_shares) p->shares[k] = o->shares[i + 1];
        if (o->n_windows) kept += (p->layer_windows[k] = o->layer_windows[i + 1]);
        k++;
    }
    if (o->n_shares) {
        p->n_shares = k;
        double s = 0;
        for (int d = 0; d < k; d++) s += p->shares[d];
        if (!(s > 0)) p->n_shares = 0;   /* only devices with no share remain: equal shares */
    }
    if (o->n_windows) hc_windows_scale(p, k, sum, kept);
}

/* a set of device bits (bit d: device d, the head 0) over the workers that remain: each worker's bit
   follows it to its new device index, the head's stays */
static uint64_t hc_bits_now(const hc_head *H, uint64_t bits) {
    uint64_t now = bits & 1;
    for (int i = 0, k = 1; i < H->orig.n_workers; i++) {
        if (H->gone[i]) continue;
        if (i + 1 < 64 && k < 64 && (bits >> (i + 1) & 1)) now |= 1ull << k;
        k++;
    }
    return now;
}

/* the parameters of the next incarnation: the workers that remain, in the given order, and a plan */
static int hc_params_now(hc_head *H, hc_head_params *p, hr_err *err) {
    *p = H->orig;
    p->n_workers = 0;
    for (int i = 0; i < H->orig.n_workers; i++)
        if (!H->gone[i]) p->workers[p->n_workers++] = H->orig.workers[i];
    /* the sets of devices that are protected, or that the test hook makes drop (0 means every device in
       both, so a set whose devices all left turns the feature off rather than on for everyone) */
    p->lossy_protect_devices = hc_bits_now(H, H->orig.lossy_protect_devices);
    if (H->orig.lossy_protect_devices && !p->lossy_protect_devices) p->lossy_protect = 0;
    p->lossy_drop_devices = hc_bits_now(H, H->orig.lossy_drop_devices);
    if (H->orig.lossy_drop_devices && !p->lossy_drop_devices) p->lossy_drop_ppm = 0, p->lossy_dup = false;
    bool all = p->n_workers == H->orig.n_workers;
    if (!all) hc_plan_without(H, p);
    if (p->replan && !all) return p->replan(p->replan_user, p, err);
    return 0;
}

/* orig's index of worker d (1..) of the current incarnation */
static int hc_orig_index(const hc_head *H, int d) {
    const char *a = H->cur.workers[d - 1];
    for (int i = 0; i < H->orig.n_workers; i++)
        if (H->orig.workers[i] == a) return i;
    return -1;
}

static int hc_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    return nanosleep(&ts, NULL);
}

/* A new incarnation over the workers not gone. A worker that fails while it is set up leaves too,
   unless it only says it is busy (still ending the failed session): that one is waited for. */
static int hc_build(hc_head *H, hr_err *err) {
    int64_t busy_until = hr_time_ns() + (int64_t)HC_BUSY_WAIT_MS * 1000000;
    for (;;) {
        hc_head_params p;
        if (hc_params_now(H, &p, err)) return err->code;
        H->cur = p;
        int fw = 0;
        hr_err e = {0};
        if ((H->c = hc_core_create(H->m, &H->cur, &H->cp, &fw, &e))) break;
        int i = fw > 0 && hc_leaves(e.code) ? hc_orig_index(H, fw) : -1;
        if (i < 0) return hr_fail(err, e.code, "%s", e.msg);
        if (strstr(e.msg, "busy") && hr_time_ns() < busy_until) {
            hc_sleep_ms(100);
            continue;
        }
        HR_LOGW("head: worker %s left too while the plan was set up again: %s", H->orig.workers[i], e.msg);
        H->gone[i] = true;
    }
    if (hc_core_n_ctx(H->c) != H->n_ctx || hc_core_n_seq(H->c) != H->n_seq || hc_core_n_batch(H->c) != H->n_batch)
        return hr_fail(err, HR_EUNSUPPORTED, "the new plan has another context (%d positions, %d sequences, batches of "
                       "%d) than the old (%d, %d, %d)", hc_core_n_ctx(H->c), hc_core_n_seq(H->c),
                       hc_core_n_batch(H->c), H->n_ctx, H->n_seq, H->n_batch);
    return 0;
}

/* Runs every sequence's history through the new incarnation, cut as it was first run: runs of tokens
   that took the F32 path in chunks of at least HM_BATCH_F32_TOKENS, the others in chunks below it. A
   run on the F32 path shorter than that (a prefix copied from a longer batch of another sequence) is
   padded with tokens after it up to HM_BATCH_F32_TOKENS: a token's results depend on the tokens before
   it and on its path only, and the padding's positions lie beyond what the sequence holds or are
   written again by the replay's next run. */
static int hc_replay(hc_head *H, int64_t *n_tokens, hr_err *err) {
    *n_tokens = 0;
    for (int32_t s = 0; s < H->n_seq; s++) {
        const hc_hist *q = &H->hist[s];
        if (q->lost) return hr_fail(err, HR_EUNSUPPORTED, "sequence %d was written with gaps: it cannot be rebuilt", s);
        for (int32_t i = 0; i < q->len;) {
            int32_t j = i;
            while (j < q->len && q->f32[j] == q->f32[i]) j++;
            for (int32_t at = i; at < j;) {
                int32_t rest = j - at, n, pad = 0;
                if (q->f32[i]) {
                    n = HR_MIN(H->n_batch, rest);
                    if (rest - n > 0 && rest - n < HM_BATCH_F32_TOKENS) n = HR_MAX(HM_BATCH_F32_TOKENS, rest - HM_BATCH_F32_TOKENS);
                    n = HR_MIN(n, H->n_batch);
                    if (n < HM_BATCH_F32_TOKENS && HM_BATCH_F32_TOKENS <= H->n_batch && at + HM_BATCH_F32_TOKENS <= H->n_ctx)
                        pad = HM_BATCH_F32_TOKENS - n;
                } else n = HR_MIN(rest, HR_MIN(H->n_batch, HM_BATCH_F32_TOKENS - 1));
                for (int k = 0; k < n + pad; k++) {
                    H->rb_seq[k] = s;
                    H->rb_tok[k] = q->tok[at + HR_MIN(k, n - 1)];
                }
                const hm_batch b = {.tokens = H->rb_tok, .n = n + pad, .pos = at, .seq = H->rb_seq};
                int rc = hc_core_eval_batch(H->c, &b, err);
                if (rc) return rc;
                *n_tokens += n;
                at += n;
            }
            i = j;
        }
    }
    return 0;
}

static int hc_active(const hc_head *H) {
    int k = 1;
    for (int i = 0; i < H->orig.n_workers; i++) k += !H->gone[i];
    return k;
}

/* The failed incarnation's worker `blamed` (0: a rejoin) left: rebuild over the rest and replay. Any
   failure of a worker on the way (set-up, replay) is one more that left. */
static int hc_recover(hc_head *H, int blamed, const char *why, hr_err *err) {
    int64_t t0 = hr_time_ns();
    char who[96] = "";
    if (blamed > 0) {
        int i = hc_orig_index(H, blamed);
        if (i >= 0) H->gone[i] = true;
        snprintf(who, sizeof who, "%s", i >= 0 ? H->orig.workers[i] : "?");
    }
    for (;;) {
        hc_core_free(H->c);   /* BYE to the others: their sessions end */
        H->c = NULL;
        int rc = hc_build(H, err);
        int64_t n = 0, t1 = hr_time_ns();
        if (!rc) rc = hc_replay(H, &n, err);
        if (!rc) {
            int k = hc_active(H);
            if (blamed > 0) {
                H->recoveries++;
                snprintf(H->warning, sizeof H->warning, "worker %s left (%s): the answer went on over %d device%s",
                         who, why, k, k == 1 ? "" : "s");
                HR_LOGW("worker %s left (%s): the answer goes on over %d device%s (%s; set up in %.0f ms, %lld "
                        "tokens recomputed in %.0f ms)", who, why, k, k == 1 ? "" : "s",
                        k == 1 ? "the head alone" : hc_core_pp_plan(H->c) ? "pipeline" : "tensor parallel",
                        (t1 - t0) * 1e-6, (long long)n, (hr_time_ns() - t1) * 1e-6);
            } else
                HR_LOGI("head: %d devices again (set up in %.0f ms, %lld tokens recomputed in %.0f ms)", k,
                        (t1 - t0) * 1e-6, (long long)n, (hr_time_ns() - t1) * 1e-6);
            return 0;
        }
        int fw = H->c && hc_leaves(rc) ? hc_core_failed_worker(H->c) : 0;
        int i = fw > 0 ? hc_orig_index(H, fw) : -1;
        if (i < 0) {
            hc_core_free(H->c);
            H->c = NULL;
            if (blamed > 0)
                return hr_fail(err, err->code, "worker %s left (%s) and the devices that remain cannot go on: %s", who,
                               why, err->msg);
            return rc;
        }
        HR_LOGW("head: worker %s left too while the answer was rebuilt: %s", H->orig.workers[i], err->msg);
        H->gone[i] = true;
    }
}

/* the times of one call that recovered (docs/benchmarks.md, "Issue 29: recovery") */
typedef struct hc_call { int64_t t0, t_fail, t_back; } hc_call;

/* The worker to blame for a failure blamed on fw: a worker that reports a peer's failure (its ring
   neighbour in a ring all-reduce: "worker 1 at ADDR: peer closed") names that peer last; else fw. */
static int hc_blame(const hc_head *H, int fw, const char *msg) {
    const char *p = msg, *last = NULL;
    while ((p = strstr(p, "worker "))) last = p++;
    int d;
    if (last && sscanf(last, "worker %d at ", &d) == 1 && d >= 1 && d <= H->cur.n_workers) return d;
    return fw;
}

/* after a failed call: recover when a worker was to blame, else pass the error on */
static int hc_failed(hc_head *H, int rc, hc_call *t, hr_err *err) {
    int fw = H->c ? hc_core_failed_worker(H->c) : 0;
    if (fw > 0) fw = hc_blame(H, fw, err->msg);
    if (!rc || fw <= 0 || H->orig.no_recover || !hc_leaves(rc)) return rc;
    char why[sizeof err->msg];
    snprintf(why, sizeof why, "%s", err->msg);
    if (t && !t->t_fail) t->t_fail = hr_time_ns();
    rc = hc_recover(H, fw, why, err);
    if (t) t->t_back = hr_time_ns();
    return rc;
}

/* a call that went on after a failure: how long from its start to its result, and where the time went */
static void hc_call_done(const hc_call *t) {
    if (!t->t_fail) return;
    int64_t now = hr_time_ns();
    HR_LOGI("head: the call went on %.0f ms after it began: %.0f ms to notice the failure, %.0f ms to plan, set up "
            "and replay, %.0f ms to run it again", (now - t->t0) * 1e-6, (t->t_fail - t->t0) * 1e-6,
            (t->t_back - t->t_fail) * 1e-6, (now - t->t_back) * 1e-6);
}

/* ---- the head's API (cluster.h) ---- */

hc_head *hc_head_create(const hm_model *m, const hc_head_params *p, const hm_ctx_params *cp, hr_err *err) {
    hc_head *H = calloc(1, sizeof *H);
    if (!H) { hr_fail(err, HR_ENOMEM, "out of memory"); return NULL; }
    H->m = m;
    H->orig = *p;
    H->cp = *cp;
    if (p->n_workers < 1) { hr_fail(err, HR_EINVAL, "no workers given"); goto fail; }
    if (p->n_workers > HC_MAX_DEVICES - 1) { hr_fail(err, HR_ERANGE, "more than %d workers", HC_MAX_DEVICES - 1); goto fail; }
    H->cur = *p;
    int fw = 0;
    hr_err e = {0};
    /* a worker that fails while the cluster is set up leaves as it would later (none: the error); one
       that serves another head ("busy") or speaks another protocol version (HR_EUNSUPPORTED) is not
       leaving: the user asked for it, and learns why it is not there */
    while (!(H->c = hc_core_create(m, &H->cur, cp, &fw, &e))) {
        bool leaves = hc_leaves(e.code) && e.code != HR_EUNSUPPORTED;
        int i = fw > 0 && !p->no_recover && leaves ? hc_orig_index(H, fw) : -1;
        if (i < 0) { hr_fail(err, e.code, "%s", e.msg); goto fail; }
        HR_LOGW("worker %s left while the cluster was set up (%s): planning without it", p->workers[i], e.msg);
        H->gone[i] = true;
        if (hc_params_now(H, &H->cur, err)) goto fail;
        e = (hr_err){0};
    }
    H->n_ctx = hc_core_n_ctx(H->c);
    H->n_seq = hc_core_n_seq(H->c);
    H->n_batch = hc_core_n_batch(H->c);
    H->hist = calloc((size_t)H->n_seq, sizeof *H->hist);
    H->rb_seq = malloc(sizeof *H->rb_seq * (size_t)H->n_batch);
    H->rb_tok = malloc(sizeof *H->rb_tok * (size_t)H->n_batch);
    if (!H->hist || !H->rb_seq || !H->rb_tok) { hr_fail(err, HR_ENOMEM, "out of memory"); goto fail; }
    return H;
fail:
    hc_head_free(H);
    return NULL;
}

int hc_head_eval(hc_head *H, const int32_t *tokens, int n, int32_t pos0, float *logits, bool all_logits, hr_err *err) {
    hc_call t = {.t0 = hr_time_ns()};
    for (;;) {
        if (!H->c) return hr_fail(err, HR_ENET, "the cluster failed earlier; start again");
        int rc = hc_core_eval(H->c, tokens, n, pos0, logits, all_logits, err);
        if (!rc) {
            /* hc_core_eval cuts the tokens into batches of n_batch */
            for (int off = 0; off < n; off += H->n_batch)
                hc_hist_batch(H, tokens + off, HR_MIN(H->n_batch, n - off), NULL, NULL, pos0 + off);
            hc_call_done(&t);
            return 0;
        }
        if ((rc = hc_failed(H, rc, &t, err))) return rc;
    }
}

int hc_head_eval_batch(hc_head *H, const hm_batch *b, hr_err *err) {
    hc_call t = {.t0 = hr_time_ns()};
    for (;;) {
        if (!H->c) return hr_fail(err, HR_ENET, "the cluster failed earlier; start again");
        int rc = hc_core_eval_batch(H->c, b, err);
        if (!rc) {
            hc_hist_batch(H, b->tokens, b->n, b->seq, b->pos_of, b->pos);
            hc_call_done(&t);
            return 0;
        }
        if ((rc = hc_failed(H, rc, &t, err))) return rc;
    }
}

int hc_head_reset(hc_head *H, int32_t pos, hr_err *err) {
    for (int32_t s = 0; H->hist && s < H->n_seq; s++) H->hist[s].len = HR_MIN(H->hist[s].len, HR_MAX(pos, 0));
    if (!H->c) return hr_fail(err, HR_ENET, "the cluster failed earlier; start again");
    return hc_failed(H, hc_core_reset(H->c, pos, err), NULL, err);  /* a rebuilt cluster holds only the history */
}

int hc_head_kv_seq_copy(hc_head *H, int32_t src, int32_t dst, int32_t n, hr_err *err) {
    for (;;) {
        if (!H->c) return hr_fail(err, HR_ENET, "the cluster failed earlier; start again");
        int rc = hc_core_kv_seq_copy(H->c, src, dst, n, err);
        if (!rc) {
            hc_hist *a = &H->hist[src], *b = &H->hist[dst];
            b->lost = a->lost || n > a->len;
            for (int32_t i = 0; i < n && i < a->len && !b->lost; i++)
                if (hc_hist_put(b, i, a->tok[i], a->f32[i])) b->lost = true;
            b->len = n;
            return 0;
        }
        if ((rc = hc_failed(H, rc, NULL, err))) return rc;
    }
}

int hc_head_rejoin(hc_head *H, hr_err *err) {
    int64_t now = hr_time_ns();
    if (!H->c || hc_active(H) == 1 + H->orig.n_workers || now - H->last_rejoin < (int64_t)HC_REJOIN_EVERY * 1000000)
        return 0;
    H->last_rejoin = now;
    bool back = false;
    for (int i = 0; i < H->orig.n_workers; i++) {
        if (!H->gone[i]) continue;
        hc_probe_conn pc;
        hr_err e = {0};
        if (!hc_probe_open(&pc, H->orig.workers[i], H->orig.key, "head (is it back?)", HC_REJOIN_MS, &e)) {
            HR_LOGI("head: worker %s is back: it is planned in again", H->orig.workers[i]);
            H->gone[i] = false;
            back = true;
        }
        hc_probe_close(&pc, !e.code);
    }
    return back ? hc_recover(H, 0, "", err) : 0;
}

int hc_head_stats(hc_head *H, hc_dev_stats *out, int cap, hr_err *err) {
    for (;;) {
        if (!H->c) return hr_fail(err, HR_ENET, "the cluster failed earlier");
        int rc = hc_core_stats(H->c, out, cap, err);
        if (rc >= 0) return rc;
        if ((rc = hc_failed(H, rc, NULL, err))) return rc;
    }
}

int hc_head_recoveries(const hc_head *H) { return H->recoveries; }
const char *hc_head_warning(const hc_head *H) { return H->warning; }
int hc_head_n_devices(const hc_head *H) { return hc_active(H); }
int32_t hc_head_n_ctx(const hc_head *H) { return H->n_ctx; }
int32_t hc_head_n_seq(const hc_head *H) { return H->n_seq; }
int32_t hc_head_n_batch(const hc_head *H) { return H->n_batch; }
const hc_plan *hc_head_plan(const hc_head *H) { return H->c ? hc_core_plan(H->c) : NULL; }
const hc_pp_plan *hc_head_pp_plan(const hc_head *H) { return H->c ? hc_core_pp_plan(H->c) : NULL; }
hmem *hc_head_mem(const hc_head *H) { return H->c ? hc_core_mem(H->c) : NULL; }
uint64_t hc_head_weight_bytes_sent(const hc_head *H) { return H->c ? hc_core_weight_bytes_sent(H->c) : 0; }
uint64_t hc_head_weight_bytes_total(const hc_head *H) { return H->c ? hc_core_weight_bytes_total(H->c) : 0; }
uint64_t hc_head_slice_bytes_written(const hc_head *H) { return H->c ? hc_core_slice_bytes_written(H->c) : 0; }

void hc_head_free(hc_head *H) {
    if (!H) return;
    hc_core_free(H->c);
    for (int32_t s = 0; H->hist && s < H->n_seq; s++) {
        free(H->hist[s].tok);
        free(H->hist[s].f32);
    }
    free(H->hist);
    free(H->rb_seq);
    free(H->rb_tok);
    free(H);
}
