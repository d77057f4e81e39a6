// modules: base quant gguf model mem net cluster text cli
/* test-tp: tensor parallelism over loopback with the cluster API (src/cluster), workers in threads.
 * - A head + 1, 2, 3 workers (even and uneven shares, star and ring) gives the single-device logits
 *   and greedy tokens: F32 weights and an F32 KV cache (stories260K) to <= 1e-5 relative; quantized
 *   synth models to the tolerance tests/test-shard.c explains (last-bit differences of the partial
 *   sums can flip one 8-bit rounding of the next matmul's activations), with the same tokens.
 * - Privacy: every message the head sends is inspected (the send hook): only the expected types, no
 *   token_embd/output slices, the prompt's token ids nowhere in any payload as int32s, and every
 *   FORWARD carries exactly the embedding rows of its tokens (hidden states, not ids).
 * - Several sequences in one batch (hc_head_eval_batch), tensor parallel and pipeline: interleaved
 *   in batches, each sequence's logits are its bits alone on the same cluster; a pipeline's are the
 *   single device's, in one pass or as micro-batches round the ring; a prefix copied on every device
 *   (KV_COPY) gives the logits of computing it.
 * - Slice cache: a second head with the same model and shares sends 0 weight bytes.
 * - The head's own share (a slice file in its cache, loaded and packed like a worker's): logits
 *   bit-identical to the head computing on views of the whole model, on the first run (which writes
 *   the file), on the second (which reuses it: nothing written), streamed under a budget smaller than
 *   its share, and from the file mapping in the file's layout (--mmap --no-repack).
 * - Robustness: garbage, a wrong protocol version, an oversized or truncated frame, messages out of
 *   order and a second head while one is served: the worker logs the reason, closes that connection
 *   and goes on serving (a normal head afterwards gets the right tokens).
 * - A worker that leaves mid-answer (several sequences, a copied prefix, prompts on both attention
 *   paths): the head goes on without it, and every step's logits are the single device's bits. */
#include "test.h"

#include "cli/cli.h"
#include "cluster/cluster.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "net/net.h"
#include "quant/quant.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- log capture ---- */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_buf[1 << 16];
static size_t log_n;

static void log_cb(enum hr_log_level level, const char *msg, void *user) {
    (void)user;
    pthread_mutex_lock(&log_mu);
    size_t n = strlen(msg);
    if (log_n + n + 2 < sizeof log_buf) {
        memcpy(log_buf + log_n, msg, n);
        log_n += n;
        log_buf[log_n++] = '\n';
        log_buf[log_n] = 0;
    }
    pthread_mutex_unlock(&log_mu);
    if (getenv("TEST_TP_VERBOSE") || level >= HR_LOG_ERROR) fprintf(stderr, "[log] %s\n", msg);
}
static void log_clear(void) { pthread_mutex_lock(&log_mu); log_n = 0; log_buf[0] = 0; pthread_mutex_unlock(&log_mu); }
static bool log_has(const char *s) {
    pthread_mutex_lock(&log_mu);
    bool r = strstr(log_buf, s) != NULL;
    pthread_mutex_unlock(&log_mu);
    return r;
}
/* waits up to 3 s for a log line (the worker runs on its own thread) */
static bool log_wait(const char *s) {
    for (int i = 0; i < 300; i++) {
        if (log_has(s)) return true;
        usleep(10000);
    }
    return false;
}

/* ---- workers in threads ---- */
#define MAX_W 3
typedef struct wk { hc_worker *w; pthread_t th; char addr[64]; } wk;
static char tmpdir[] = "/tmp/hearth-test-tp-XXXXXX";

static void *serve(void *arg) {
    wk *k = arg;
    hr_err e = {0};
    if (hc_worker_serve(k->w, 0, &e)) fprintf(stderr, "worker: %s\n", e.msg);
    return NULL;
}

static bool start_workers(wk *ws, int n) {
    for (int i = 0; i < n; i++) {
        hc_worker_params p = hc_worker_default_params();
        char cache[256];
        snprintf(cache, sizeof cache, "%s/cache%d", tmpdir, i);
        p.listen = "127.0.0.1:0";
        p.cache_dir = cache;
        p.n_threads = 1;
        hr_err e = {0};
        ws[i].w = hc_worker_create(&p, &e);
        if (!ws[i].w) { fprintf(stderr, "worker: %s\n", e.msg); return false; }
        snprintf(ws[i].addr, sizeof ws[i].addr, "127.0.0.1:%u", hc_worker_port(ws[i].w));
        pthread_create(&ws[i].th, NULL, serve, &ws[i]);
    }
    return true;
}

static void stop_workers(wk *ws, int n) {
    for (int i = 0; i < n; i++) if (ws[i].w) hc_worker_stop(ws[i].w);
    for (int i = 0; i < n; i++) if (ws[i].w) { pthread_join(ws[i].th, NULL); hc_worker_free(ws[i].w); ws[i].w = NULL; }
}

static void worker_list(const wk *ws, int n, char *out, size_t cap) {
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        strncat(out, ws[i].addr, cap - strlen(out) - 2);
        if (i + 1 < n) strncat(out, ",", cap - strlen(out) - 1);
    }
}

/* ---- the privacy inspector: sees every message the head sends ---- */
typedef struct inspect {
    const hm_model *m;
    const int32_t *prompt;
    int n_prompt;
    const int32_t *fed;       /* tokens of the current pass (for the FORWARD content check) */
    int n_fed;
    int bad_type, bad_slice, id_found, forward_bad, forwards;
    bool pipeline;            /* FORWARDs carry hidden states after the head's window, not the embedding */
    hn_buf buf;
} inspect;

static bool contains_ids(const uint8_t *p, size_t n, const int32_t *ids, int k) {
    size_t need = (size_t)k * 4;
    for (size_t i = 0; i + need <= n; i++)
        if (!memcmp(p + i, ids, need)) return true;
    return false;
}

static void hook(void *user, int device, const hn_msg *m) {
    (void)device;
    inspect *in = user;
    switch (m->type) {
    case HN_MSG_HELLO: case HN_MSG_PROFILE_REQ: case HN_MSG_LOAD_PLAN: case HN_MSG_SLICE_BEGIN: case HN_MSG_SLICE_HAVE:
    case HN_MSG_SLICE_CHUNK: case HN_MSG_SLICE_END: case HN_MSG_FORWARD: case HN_MSG_RESULT: case HN_MSG_PARTIAL:
    case HN_MSG_RESET: case HN_MSG_BYE:
        break;
    default: in->bad_type++;
    }
    if (m->type == HN_MSG_SLICE_BEGIN) {
        const hn_str n = m->u.slice_begin.name;
        if (hn_str_eq(n, "token_embd.weight") || hn_str_eq(n, "output.weight") || hn_str_eq(n, "output_norm.weight"))
            in->bad_slice++;
    }
    /* the prompt's ids, as the int32 sequence a careless protocol would carry, appear in no payload */
    hr_err e = {0};
    if (hn_msg_encode_full(m, &in->buf, &e) == 0) {
        for (int w = 0; w + 3 <= in->n_prompt; w++)
            if (contains_ids(in->buf.data, in->buf.len, in->prompt + w, 3)) { in->id_found++; break; }
    }
    if (m->type == HN_MSG_FORWARD) in->forwards++;
    if (m->type == HN_MSG_FORWARD && !in->pipeline) {
        /* what a FORWARD carries is the embedding of the pass's tokens: hidden states, not ids */
        const hn_forward *f = &m->u.forward;
        int E = in->m->hp.n_embd;
        float *emb = malloc((size_t)in->n_fed * E * sizeof(float));
        if (!emb || (int)f->n_tokens != in->n_fed || hm_embed(in->m, in->fed, in->n_fed, emb, NULL) ||
            memcmp(emb, f->data, (size_t)in->n_fed * E * sizeof(float)))
            in->forward_bad++;
        free(emb);
    }
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (v[i] > v[b]) b = i;
    return b;
}

/* The head's parameters as `hearth run` makes them from its flags (--workers LIST [--tp-shares S]
   [--pp [--layer-windows W]]); hp.workers point into o, which the caller frees. */
static bool head_flags(cli_opts *o, const char *list, const char *shares, const char *windows, bool pp,
                       const char *stages) {
    char *argv[10] = {"run", "--workers", (char *)list};
    int argc = 3;
    if (stages) { argv[argc++] = "--stages"; argv[argc++] = (char *)stages; }
    if (shares) { argv[argc++] = "--tp-shares"; argv[argc++] = (char *)shares; }
    if (pp) argv[argc++] = "--pp";
    if (pp && windows && windows[0]) { argv[argc++] = "--layer-windows"; argv[argc++] = (char *)windows; }
    *o = cli_opts_default();
    return cli_parse(&cli_run, argc, argv, o) == 0;
}

typedef struct run_cfg {
    const char *model;
    int n_workers;
    const char *shares;       /* NULL: equal */
    int allreduce;
    int kv_type;
    double tol;               /* worst relative RMS logit difference allowed */
    bool privacy;
    int64_t expect_sent;      /* -1: any; else the weight bytes the head must send */
    const char *pp;           /* a pipeline with these --layer-windows ("" = the default split); NULL: TP */
} run_cfg;

/* prompt + n_gen greedy steps on one device and on head + workers; compares every step's logits */
static void check_run(wk *ws, const run_cfg *rc) {
    hr_err err = {0};
    gguf_ctx *g = gguf_open(rc->model, &err);
    REQUIRE_VOID(g);
    hm_model *m = hm_model_load(g, &err);
    REQUIRE_VOID(m);
    int V = m->hp.n_vocab;
    const int32_t prompt[] = {1, 403, 407, 261, 378, 432, 383, 286};
    const int np = 8, n_gen = getenv("TEST_TP_STEPS") ? atoi(getenv("TEST_TP_STEPS")) : 12;
    hm_ctx_params cp = hm_ctx_default_params();
    cp.n_ctx = 64;
    cp.n_batch = 16;
    cp.n_threads = 1;
    cp.kv_type = rc->kv_type;
    hm_shard full = hm_shard_full(m);
    hm_ctx *ref = hm_ctx_create(m, &full, &cp, &err);
    REQUIRE_VOID(ref);

    inspect in = {.m = m, .prompt = prompt, .n_prompt = np};
    hn_buf_init(&in.buf);
    char list[512];
    worker_list(ws, rc->n_workers, list, sizeof list);
    cli_opts o;
    CHECK(head_flags(&o, list, rc->shares, rc->pp, rc->pp != NULL, NULL));
    hc_head_params hp = o.head;
    hp.allreduce = rc->allreduce;
    in.pipeline = hp.pp;
    if (rc->privacy) { hp.send_hook = hook; hp.send_hook_user = &in; }
    in.fed = prompt;
    in.n_fed = 0;
    hc_head *h = hc_head_create(m, &hp, &cp, &err);
    CHECKF(h != NULL, "%s, %d workers: %s", rc->model, rc->n_workers, err.msg);
    if (!h) goto done;
    if (rc->expect_sent >= 0)
        CHECKF((int64_t)hc_head_weight_bytes_sent(h) == rc->expect_sent, "%s: sent %llu weight bytes, expected %lld",
               rc->model, (unsigned long long)hc_head_weight_bytes_sent(h), (long long)rc->expect_sent);
    float *lr = malloc((size_t)V * sizeof(float)), *ls = malloc((size_t)V * sizeof(float));
    int32_t tok_r = 0, tok_s = 0;
    double worst = 0;
    int same = 0;
    bool ok = true;
    for (int step = 0; ok && step <= n_gen; step++) {
        const int32_t *in_r = step == 0 ? prompt : &tok_r, *in_s = step == 0 ? prompt : &tok_s;
        int n = step == 0 ? np : 1;
        int32_t pos = step == 0 ? 0 : np + step - 1;
        CHECK(hm_eval(ref, &(hm_batch){.tokens = in_r, .n = n, .pos = pos, .logits = lr}, &err) == 0);
        in.fed = in_s;
        in.n_fed = n;
        int r = hc_head_eval(h, in_s, n, pos, ls, false, &err);
        CHECKF(r == 0, "%s: %s", rc->model, err.msg);
        if (r) { ok = false; break; }
        double num = 0, den = 0;
        for (int v = 0; v < V; v++) { double d = (double)lr[v] - ls[v]; num += d * d; den += (double)lr[v] * lr[v]; }
        double rel = sqrt(num / den);
        if (rel > worst) worst = rel;
        tok_r = argmax(lr, V);
        tok_s = argmax(ls, V);
        same += tok_r == tok_s;
        if (tok_r != tok_s) {
            /* how close the single-device run was to choosing the other token */
            printf("  step %d: token %d (logit %.6f) vs %d (its logit there %.6f); rel %.2e\n", step, tok_r, lr[tok_r],
                   tok_s, lr[tok_s], rel);
            ok = false;
        }
    }
    printf("%-30s %d workers %s %-8s %s kv %s: worst logits rel %.2e, tokens %d/%d equal, sent %llu bytes\n",
           strrchr(rc->model, '/') + 1, rc->n_workers, rc->pp ? "pipeline" : "shares",
           rc->pp ? (rc->pp[0] ? rc->pp : "default") : rc->shares ? rc->shares : "equal",
           rc->pp ? "" : rc->allreduce == HC_ALLREDUCE_RING ? "ring" : "star", rc->kv_type == HQ_TYPE_F32 ? "f32" : "f16", worst,
           same, n_gen + 1, (unsigned long long)hc_head_weight_bytes_sent(h));
    CHECKF(worst <= rc->tol, "%s: logits differ by %.2e > %.1e", rc->model, worst, rc->tol);
    CHECKF(same == n_gen + 1, "%s: greedy tokens differ", rc->model);
    if (rc->privacy) {
        CHECK(in.bad_type == 0);
        CHECK(in.bad_slice == 0);
        CHECK(in.id_found == 0);
        /* a pipeline: one FORWARD from the head per trip round the ring */
        CHECK(in.forwards == (n_gen + 1) * (rc->pp ? hc_head_pp_plan(h)->n_rounds : rc->n_workers));
        CHECK(in.forward_bad == 0);
    }
    free(lr);
    free(ls);
    hc_head_free(h);
done:
    cli_opts_free(&o);
    hn_buf_free(&in.buf);
    hm_ctx_free(ref);
    hm_model_free(m);
    gguf_close(g);
}

/* ---- the head's own share ---- */

typedef struct head_way {
    bool views;            /* the head computes on views of the whole model (the reference) */
    bool mmap, no_repack;
    uint64_t budget;       /* a residency budget (0: the default) */
} head_way;

/* The head's logits (into out, [n_steps + 1][V]) for the prompt and then seq[0..n_steps) one token
   at a time (choose: seq is filled with the greedy tokens as it goes). The head's slice bytes written
   go to *written and its residency plan to *plan (mode -1: no manager). */
static bool head_logits(wk *ws, hm_model *m, int n_workers, const char *shares, const char *cache, const head_way *w,
                        int32_t *seq, int n_steps, bool choose, float *out, uint64_t *written, hmem_plan *plan) {
    static const int32_t prompt[] = {1, 403, 407, 261, 378, 432, 383, 286};
    const int V = m->hp.n_vocab;
    char list[512];
    worker_list(ws, n_workers, list, sizeof list);
    cli_opts o;
    CHECK(head_flags(&o, list, shares, NULL, false, NULL));
    hc_head_params hp = o.head;
    hp.cache_dir = cache;
    hp.share_views = w->views;
    hp.use_mmap = w->mmap;
    hp.no_repack = w->no_repack;
    if (w->budget) hp.mem = (hmem_request){.given = true, .bytes = w->budget, .window = 2};
    hm_ctx_params cp = hm_ctx_default_params();
    cp.n_ctx = 64;
    cp.n_batch = 16;
    cp.n_threads = 1;
    hr_err err = {0};
    hc_head *h = hc_head_create(m, &hp, &cp, &err);
    CHECKF(h != NULL, "head: %s", err.msg);
    bool ok = h != NULL;
    for (int step = 0; ok && step <= n_steps; step++) {
        float *lg = out + (size_t)step * V;
        int r = step == 0 ? hc_head_eval(h, prompt, 8, 0, lg, false, &err)
                          : hc_head_eval(h, &seq[step - 1], 1, 8 + step - 1, lg, false, &err);
        CHECKF(r == 0, "head eval: %s", err.msg);
        ok = r == 0;
        if (ok && choose && step < n_steps) seq[step] = argmax(lg, V);
    }
    if (h) {
        *written = hc_head_slice_bytes_written(h);
        *plan = hc_head_mem(h) ? *hmem_get_plan(hc_head_mem(h)) : (hmem_plan){.mode = (hmem_mode)-1};
    }
    hc_head_free(h);
    cli_opts_free(&o);
    return ok;
}

/* ---- several sequences in one batch (issue 27) ---------------------------------------------------- */

enum { BS_N = 3, BS_PROMPT = 8, BS_GEN = 5, BS_LEN = BS_PROMPT + BS_GEN };

/* one step of sequences [0, BS_N) into a batch: sequence q's next `chunk` prompt tokens or its next
   token (none if `skip`), in the order the step rotates to; returns the batch's size */
static int bs_step(const int32_t (*tok)[BS_LEN], int *done, int chunk, int step, int32_t *t, int32_t *sq, int32_t *po,
                   int *from) {
    int n = 0;
    for (int k = 0; k < BS_N; k++) {
        const int q = (k + step) % BS_N;
        if (done[q] >= BS_LEN || (step % 4 == 3 && q == 1)) continue;
        const int nb = done[q] < BS_PROMPT ? HR_MIN(chunk, BS_PROMPT - done[q]) : 1;
        for (int i = 0; i < nb; i++, n++) t[n] = tok[q][done[q] + i], sq[n] = q, po[n] = done[q] + i, from[n] = q;
        done[q] += nb;
    }
    return n;
}

/* runs the BS_N sequences through a head (or one device, h NULL: context c): each alone (chunk = its
   prompt, then a token a step) when alone, else interleaved (prompts in chunks of 3, in rotating
   orders, a sequence skipped now and then); every token's logits into out[q][pos] */
static bool bs_run(hc_head *h, hm_ctx *c, const int32_t (*tok)[BS_LEN], bool alone, int V, float *out) {
    int done[BS_N] = {0};
    int32_t t[BS_N * BS_PROMPT], sq[BS_N * BS_PROMPT], po[BS_N * BS_PROMPT];
    int from[BS_N * BS_PROMPT];
    uint8_t want[BS_N * BS_PROMPT];
    memset(want, 1, sizeof want);
    float *lg = malloc(sizeof(float) * BS_N * BS_PROMPT * (size_t)V);
    hr_err err = {0};
    bool ok = lg != NULL;
    for (int step = 0; ok; step++) {
        int n = 0;
        if (alone) {
            for (int q = 0; q < BS_N && n == 0; q++) {
                if (done[q] >= BS_LEN) continue;
                const int nb = done[q] < BS_PROMPT ? BS_PROMPT : 1;
                for (int i = 0; i < nb; i++, n++) t[n] = tok[q][done[q] + i], sq[n] = q, po[n] = done[q] + i, from[n] = q;
                done[q] += nb;
            }
        } else {
            n = bs_step(tok, done, 3, step, t, sq, po, from);
        }
        if (n == 0) break;
        const hm_batch b = {.tokens = t, .n = n, .seq = sq, .pos_of = po, .out = want, .logits = lg};
        const int rc = h ? hc_head_eval_batch(h, &b, &err) : hm_eval(c, &b, &err);
        CHECKF(rc == 0, "batch: %s", err.msg);
        ok = rc == 0;
        for (int i = 0; ok && i < n; i++)
            memcpy(out + ((size_t)from[i] * BS_LEN + po[i]) * V, lg + (size_t)i * V, sizeof(float) * V);
    }
    free(lg);
    return ok;
}

/* The three sequences' tokens, the context they run in (cp) and their logits on one device (one). */
static bool bs_reference(const hm_model *m, int32_t (*tok)[BS_LEN], hm_ctx_params *cp, float *one) {
    const int V = m->hp.n_vocab;
    for (int q = 0; q < BS_N; q++)
        for (int i = 0; i < BS_LEN; i++) tok[q][i] = (int32_t)((7 + 131 * q + 37 * i + i * i) % V);
    *cp = hm_ctx_default_params();
    cp->n_ctx = 32, cp->n_seq = BS_N, cp->n_batch = 16, cp->n_threads = 1;
    hr_err err = {0};
    hm_shard full = hm_shard_full(m);
    hm_ctx *c = hm_ctx_create(m, &full, cp, &err);
    if (!c) return false;
    bool ok = bs_run(NULL, c, (const int32_t (*)[BS_LEN])tok, false, V, one);
    hm_ctx_free(c);
    return ok;
}

/* Three sequences over a cluster (tensor parallel, a pipeline of these windows, or with stages a hybrid:
   the head's group tensor parallel): each alone, then interleaved in batches, on the same head: the
   same bits; a pipeline also gives the single device's bits (whole layers everywhere), tensor
   parallelism and hybrids the same greedy tokens within tol. A batch the engine would refuse is
   refused at the head, and the cluster serves on. Micro-batches round a pipeline's ring (2 and 3) give
   the one pass's bits. */
static void check_batches(wk *ws, const char *model, int n_workers, const char *pp, double tol, const char *stages) {
    hr_err err = {0};
    gguf_ctx *g = gguf_open(model, &err);
    REQUIRE_VOID(g);
    hm_model *m = hm_model_load(g, &err);
    REQUIRE_VOID(m);
    const int V = m->hp.n_vocab;
    int32_t tok[BS_N][BS_LEN];
    const size_t sz = sizeof(float) * BS_N * BS_LEN * (size_t)V;
    float *one = malloc(sz), *alone = malloc(sz), *batched = malloc(sz);
    REQUIRE_VOID(one && alone && batched);
    hm_ctx_params cp;
    REQUIRE_VOID(bs_reference(m, tok, &cp, one));
    char list[512];
    worker_list(ws, n_workers, list, sizeof list);
    cli_opts o;
    CHECK(head_flags(&o, list, NULL, pp, pp != NULL, stages));
    const bool exact = pp && !stages;   /* whole layers everywhere */
    hc_head *h = hc_head_create(m, &o.head, &cp, &err);
    CHECKF(h != NULL, "head: %s", err.msg);
    if (h) {
        CHECK(bs_run(h, NULL, tok, true, V, alone) && bs_run(h, NULL, tok, false, V, batched));
        int bad = 0, top = 0;
        double worst = 0;
        for (int r = 0; r < BS_N * BS_LEN; r++) {
            const float *x = batched + (size_t)r * V, *y = one + (size_t)r * V;
            bad += memcmp(x, alone + (size_t)r * V, sizeof(float) * V) != 0;
            double num = 0, den = 0;
            for (int i = 0; i < V; i++) num += ((double)x[i] - y[i]) * ((double)x[i] - y[i]), den += (double)y[i] * y[i];
            worst = HR_MAX(worst, sqrt(num / HR_MAX(den, 1e-30)));
            top += argmax(x, V) == argmax(y, V);
        }
        printf("  %-30s %d workers %s: %d of %d tokens' logits differ batched from alone; vs one device: worst rel "
               "%.2e, top-1 %d/%d\n", strrchr(model, '/') + 1, n_workers, stages ? "hybrid" : pp ? "pipeline" : "tensor parallel", bad,
               BS_N * BS_LEN, worst, top, BS_N * BS_LEN);
        CHECK(bad == 0);
        CHECK(exact ? memcmp(batched, one, sz) == 0 : worst <= tol && top == BS_N * BS_LEN);
        /* refused at the head: a sequence out of range, a gap in a sequence's positions */
        float *lg = malloc(sizeof(float) * 4 * (size_t)V);
        const int32_t t2[2] = {1, 2};
        CHECK(hc_head_eval_batch(h, &(hm_batch){.tokens = t2, .n = 2, .logits = lg, .seq = (int32_t[]){0, BS_N}}, &err) ==
              HR_EINVAL);
        CHECK(hc_head_eval_batch(h, &(hm_batch){.tokens = t2, .n = 2, .logits = lg, .pos_of = (int32_t[]){0, 2}}, &err) ==
              HR_EINVAL);
        /* sequence 0's first 6 positions copied into sequence 2 (KV_COPY on every device), then the
           rest of sequence 0's prompt and a token computed there: sequence 0's bits alone */
        CHECK(hc_head_kv_seq_copy(h, 0, BS_N, 6, &err) == HR_EINVAL);
        CHECKF(hc_head_kv_seq_copy(h, 0, 2, 6, &err) == 0, "%s", err.msg);
        const int32_t s2[3] = {2, 2, 2}, p2[3] = {6, 7, 8};
        int kv_bad = 0;
        for (int c2 = 0; c2 < 2; c2++) { /* the prompt's last two, then the first generated token */
            const int n2 = c2 == 0 ? 2 : 1, at = c2 == 0 ? 6 : 8;
            const hm_batch b2 = {.tokens = tok[0] + at, .n = n2, .seq = s2, .pos_of = p2 + c2 * 2,
                                 .logits = lg, .all_logits = true};
            CHECKF(hc_head_eval_batch(h, &b2, &err) == 0, "%s", err.msg);
            kv_bad += memcmp(lg, alone + (size_t)at * V, sizeof(float) * V * (size_t)n2) != 0;
        }
        CHECKF(kv_bad == 0, "a copied prefix gave other logits than computing it (%d batches)", kv_bad);
        free(lg);
    }
    hc_head_free(h);
    if (pp) { /* micro-batches round the ring: 2 and 3 (one sequence each) give the one pass's bits */
        for (int mbn = 2; mbn <= 3; mbn++) {
            hc_head_params hpm = o.head;
            hpm.pp_micro = mbn;
            h = hc_head_create(m, &hpm, &cp, &err);
            CHECKF(h != NULL, "head: %s", err.msg);
            if (!h) break;
            memset(batched, 0, sz);
            CHECK(bs_run(h, NULL, tok, false, V, batched));
            const bool same = memcmp(batched, exact ? one : alone, sz) == 0;
            printf("  %-30s %d workers %s, %d micro-batches: logits %s %s\n", strrchr(model, '/') + 1, n_workers,
                   stages ? "hybrid" : "pipeline", mbn, same ? "==" : "!=", exact ? "the single device's" : "one pass's");
            CHECK(same);
            hc_head_free(h);
        }
    }
    cli_opts_free(&o);
    free(one), free(alone), free(batched);
    hm_model_free(m);
    gguf_close(g);
}

/* The compact share against the views, every way the head can hold it; each call uses a fresh cache. */
static void check_head_share(wk *ws, const char *model, int n_workers, const char *shares) {
    static int calls;
    hr_err err = {0};
    gguf_ctx *g = gguf_open(model, &err);
    hm_model *m = g ? hm_model_load(g, &err) : NULL;
    REQUIRE_VOID(m);
    const int n_steps = 8, V = m->hp.n_vocab;
    char cache[256];
    snprintf(cache, sizeof cache, "%s/head%d", tmpdir, calls++);
    size_t n = (size_t)(n_steps + 1) * V;
    float *ref = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    int32_t seq[8];
    uint64_t written = 0;
    hmem_plan plan;
    const struct { const char *what; head_way w; bool wrote; bool stream; } ways[] = {
        {"views", {.views = true}, false, false},
        {"first run", {0}, true, false},
        {"second run", {0}, false, false},
        {"streamed", {.budget = 1}, false, true},   /* set from the second run's plan */
        {"--mmap --no-repack", {.mmap = true, .no_repack = true}, false, false},
    };
    const char *name = strrchr(model, '/') + 1;
    uint64_t small = 0;
    for (size_t i = 0; i < HR_ARRAY_LEN(ways); i++) {
        log_clear();
        head_way w = ways[i].w;
        if (w.budget) w.budget = small;
        if (!head_logits(ws, m, n_workers, shares, cache, &w, seq, n_steps, i == 0, i ? got : ref, &written, &plan))
            break;
        /* a budget below the share: its KV cache and scratch, its largest block and half the rest */
        if (i == 2) small = plan.ctx_bytes + plan.largest_bytes + (plan.weight_bytes - plan.largest_bytes) / 2;
        if (i == 0) continue;
        CHECKF(!memcmp(ref, got, n * sizeof(float)), "%s %s: the head's share (%s) gives other logits than its views",
               name, shares ? shares : "equal", ways[i].what);
        CHECKF((written > 0) == ways[i].wrote, "%s: %s wrote %llu bytes of the head's slice file", name, ways[i].what,
               (unsigned long long)written);
        if (i == 2) CHECK(log_has("tp: head: its share"));
        if (i == 2) CHECKF(plan.mode == HMEM_KEEP, "%s: the head's share is not kept whole by default", name);
        if (ways[i].stream) CHECKF(plan.mode == HMEM_STREAM, "%s: a budget of %llu bytes did not stream the head's "
                                   "share (mode %d)", name, (unsigned long long)small, (int)plan.mode);
    }
    printf("%-30s %d workers shares %-8s: the head's own share == its views (written, reused, streamed, mmap)\n",
           name, n_workers, shares ? shares : "equal");
    free(ref);
    free(got);
    hm_model_free(m);
    gguf_close(g);
}

/* ---- malformed input ---- */

/* raw bytes to a worker, then: did it answer ERROR (and what), and did it close the connection? */
static void poke(const char *addr, const void *bytes, size_t n, bool close_after, const char *want_error,
                 const char *want_log) {
    hr_err e = {0};
    log_clear();
    hn_conn *c = hn_connect(addr, hn_deadline_ms(2000), &e);
    REQUIRE_VOID(c);
    if (n) CHECK(write(hn_conn_fd(c), bytes, n) == (ssize_t)n);
    if (close_after) shutdown(hn_conn_fd(c), SHUT_WR);
    hn_frame f = {0};
    hn_msg m;
    int rc = hn_msg_recv(c, &f, &m, hn_deadline_ms(5000), &e);
    if (want_error) {
        CHECKF(rc == 0 && m.type == HN_MSG_ERROR, "expected ERROR for '%s': %s", want_error, e.msg);
        if (rc == 0 && m.type == HN_MSG_ERROR) {
            char msg[HN_MAX_MESSAGE + 1];
            hn_str_copy(msg, sizeof msg, m.u.error.message);
            CHECKF(strstr(msg, want_error) != NULL, "ERROR '%s' lacks '%s'", msg, want_error);
        }
        rc = hn_msg_recv(c, &f, &m, hn_deadline_ms(5000), &e);
    } else if (rc == 0 && m.type == HN_MSG_ERROR) {
        rc = hn_msg_recv(c, &f, &m, hn_deadline_ms(5000), &e); /* the reason may come first */
    }
    /* then the worker closes: a receive ends with "closed" (not a timeout) */
    CHECKF(rc == HR_ENET, "worker did not close the connection (rc %d: %s)", rc, e.msg);
    if (want_log) CHECKF(log_wait(want_log), "worker log lacks '%s':\n%s", want_log, log_buf);
    hn_frame_free(&f);
    hn_conn_close(c);
}

static void send_msg_raw(hn_conn *c, hn_msg *m) {
    hr_err e = {0};
    CHECKF(hn_msg_send(c, m, hn_deadline_ms(2000), &e) == 0, "%s", e.msg);
}

static void check_malformed(wk *ws, const char *model) {
    const char *addr = ws[0].addr;
    /* garbage: an HTTP request */
    const char http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    poke(addr, http, sizeof http - 1, false, NULL, "magic");
    /* a frame of another protocol version */
    uint8_t hdr[HN_HEADER_SIZE];
    hn_header_encode(hdr, HN_MSG_HELLO, 0, 0);
    hdr[4] = 2;
    poke(addr, hdr, sizeof hdr, false, NULL, "version");
    /* an oversized HELLO: refused from the header, before any allocation */
    hn_header_encode(hdr, HN_MSG_HELLO, 0, 0);
    uint32_t big = 1u << 30;
    memcpy(hdr + 8, &big, 4);
    poke(addr, hdr, sizeof hdr, false, NULL, "HELLO");
    /* a truncated frame: the header promises 100 bytes, 10 come, then the head goes away */
    uint8_t trunc[HN_HEADER_SIZE + 10] = {0};
    hn_header_encode(trunc, HN_MSG_HELLO, 100, 0);
    poke(addr, trunc, sizeof trunc, true, NULL, "in the middle");
    /* nothing at all, then a close */
    poke(addr, NULL, 0, true, NULL, "closed");
    /* a well-formed HELLO that speaks only version 9 */
    hn_msg m = {.type = HN_MSG_HELLO};
    m.u.hello = (hn_hello){.version_min = 9, .version_max = 9, .device = hn_cstr("future head")};
    hn_buf b;
    hn_buf_init(&b);
    hn_msg_encode_full(&m, &b, NULL);
    uint8_t frame[512];
    hn_header_encode(frame, HN_MSG_HELLO, (uint32_t)b.len, 0);
    memcpy(frame + HN_HEADER_SIZE, b.data, b.len);
    poke(addr, frame, HN_HEADER_SIZE + b.len, false, "not supported", "not supported");
    /* the right HELLO, then a FORWARD before any LOAD_PLAN */
    hr_err e = {0};
    hn_conn *c = hn_connect(addr, hn_deadline_ms(2000), &e);
    REQUIRE_VOID(c);
    log_clear();
    m.u.hello = (hn_hello){.version_min = HN_PROTO_VERSION, .version_max = HN_PROTO_VERSION, .device = hn_cstr("test head")};
    send_msg_raw(c, &m);
    hn_frame f = {0};
    hn_msg r;
    CHECK(hn_msg_recv(c, &f, &r, hn_deadline_ms(5000), &e) == 0 && r.type == HN_MSG_HELLO_ACK);
    int32_t pos[1] = {0};
    float x[4] = {0};
    hn_msg fw = {.type = HN_MSG_FORWARD};
    fw.u.forward = (hn_forward){.layer_end = 1, .n_tokens = 1, .n_embd = 4, .pos = pos, .data = x};
    send_msg_raw(c, &fw);
    CHECK(hn_msg_recv(c, &f, &r, hn_deadline_ms(5000), &e) == 0 && r.type == HN_MSG_ERROR);
    CHECK(hn_msg_recv(c, &f, &r, hn_deadline_ms(5000), &e) == HR_ENET);
    CHECK(log_wait("FORWARD before LOAD_PLAN"));
    hn_conn_close(c);
    /* the right HELLO, then a LOAD_PLAN without the hyper-parameters */
    c = hn_connect(addr, hn_deadline_ms(2000), &e);
    REQUIRE_VOID(c);
    send_msg_raw(c, &m);
    CHECK(hn_msg_recv(c, &f, &r, hn_deadline_ms(5000), &e) == 0 && r.type == HN_MSG_HELLO_ACK);
    hn_msg lp = {.type = HN_MSG_LOAD_PLAN};
    lp.u.load_plan = (hn_load_plan){.device_index = 1, .n_devices = 2, .arch = hn_cstr("llama")};
    send_msg_raw(c, &lp);
    CHECK(hn_msg_recv(c, &f, &r, hn_deadline_ms(5000), &e) == 0 && r.type == HN_MSG_ERROR);
    CHECK(hn_msg_recv(c, &f, &r, hn_deadline_ms(5000), &e) == HR_ENET);
    hn_conn_close(c);
    hn_frame_free(&f);
    hn_buf_free(&b);

    /* a second head while one is being served: ERROR "busy", and the first head is unaffected */
    hr_err err = {0};
    gguf_ctx *g = gguf_open(model, &err);
    hm_model *mm = g ? hm_model_load(g, &err) : NULL;
    REQUIRE_VOID(mm);
    hc_head_params hp = hc_head_default_params();
    hp.n_workers = 1;
    hp.workers[0] = addr;
    hm_ctx_params cp = hm_ctx_default_params();
    cp.n_ctx = 32;
    cp.n_threads = 1;
    hc_head *h = hc_head_create(mm, &hp, &cp, &err);
    CHECKF(h != NULL, "%s", err.msg);
    poke(addr, frame, HN_HEADER_SIZE, false, "busy", NULL);
    if (h) {
        float *lg = malloc((size_t)mm->hp.n_vocab * sizeof(float));
        int32_t t[2] = {1, 403};
        CHECKF(hc_head_eval(h, t, 2, 0, lg, false, &err) == 0, "%s", err.msg);
        free(lg);
        hc_head_free(h);
    }
    hm_model_free(mm);
    gguf_close(g);
}

/* hr_hash64: streaming in any pieces gives the one-shot value; every byte and the length matter */
static void check_hash(void) {
    uint8_t buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (uint8_t)(i * 37 + 11);
    uint64_t whole = hr_hash64(buf, sizeof buf, 0);
    hr_hasher h;
    hr_hasher_init(&h, 0);
    for (size_t o = 0, k = 1; o < sizeof buf; o += k, k = k * 3 % 61 + 1) hr_hasher_update(&h, buf + o, HR_MIN(k, sizeof buf - o));
    CHECK(hr_hasher_final(&h) == whole);
    int distinct = 0;
    for (int i = 0; i < 1000; i += 7) {
        buf[i] ^= 1;
        distinct += hr_hash64(buf, sizeof buf, 0) != whole;
        buf[i] ^= 1;
    }
    CHECK(distinct == 143);
    CHECK(hr_hash64(buf, 999, 0) != whole && hr_hash64(buf, 1000, 1) != whole);
    CHECK(hr_hash64(buf + 1, 64, 0) == hr_hash64(memcpy(buf + 500, buf + 1, 64), 64, 0)); /* alignment */
    uint8_t zeros[64] = {0};
    CHECK(hr_hash64(zeros, 32, 0) != hr_hash64(zeros, 64, 0) && hr_hash64(zeros, 0, 0) != hr_hash64(zeros, 1, 0));
}

/* A pipeline FORWARD that lands where the worker has no window (the head's message altered on its
   way out, as a broken or hostile head would send it): the worker refuses it with a message, the
   head's pass fails with that message instead of hanging, and the worker serves the next head. */
typedef struct bend { int forwards; int32_t layer; } bend;
static void bend_hook(void *user, int device, const hn_msg *m) {
    (void)device;
    bend *b = user;
    if (m->type != HN_MSG_FORWARD || ++b->forwards != 2) return;
    ((hn_msg *)m)->u.forward.layer_begin = (uint32_t)b->layer;   /* the head's own, non-const message */
}

/* alters the units of a pipeline LOAD_PLAN (the head's own message; the hook swaps in a copy) */
typedef struct replan { int mode; hn_unit units[8]; } replan;
static void replan_hook(void *user, int device, const hn_msg *m) {
    (void)device;
    replan *r = user;
    if (m->type != HN_MSG_LOAD_PLAN) return;
    hn_load_plan *lp = &((hn_msg *)m)->u.load_plan;
    if (lp->n_units < 2 || lp->n_units > 8) return;
    memcpy(r->units, lp->units, lp->n_units * sizeof r->units[0]);
    switch (r->mode) {
    case 0: r->units[1].layer = r->units[0].layer; break;   /* the same layer twice */
    case 1: r->units[0].layer = r->units[1].layer + 1; break;   /* out of order */
    case 2: r->units[1].kind = HN_UNIT_ATTN_HEADS; break;   /* a TP unit in a pipeline plan */
    case 3: r->units[1].layer = 4096; break;                /* past the model */
    case 4: r->units[0].end = 2; break;                     /* not a whole layer */
    default: lp->n_units = 0; return;                       /* no layers at all */
    }
    lp->units = r->units;
}

/* a pipeline of the head and worker 1 over stories260K's 5 layers (head 0, 2, 4; worker 1, 3), whose
   messages to the worker pass through fn */
static void pp1_params(const char *list, hc_send_hook_fn fn, void *user, hc_head_params *hp, hm_ctx_params *cp) {
    static cli_opts o;  /* hp's worker addresses point into it */
    cli_opts_free(&o);
    CHECK(head_flags(&o, list, NULL, "1,1", true, NULL));
    *hp = o.head;
    hp->send_hook = fn;
    hp->send_hook_user = user;
    hp->no_recover = true;   /* the worker's refusal must reach the caller, not be recovered from */
    *cp = hm_ctx_default_params();
    cp->n_ctx = 32;
    cp->n_threads = 1;
}

static void check_pp_malformed(wk *ws, const char *model) {
    hr_err err = {0};
    gguf_ctx *g = gguf_open(model, &err);
    hm_model *m = g ? hm_model_load(g, &err) : NULL;
    REQUIRE_VOID(m);
    char list[512];
    worker_list(ws, 1, list, sizeof list);
    hc_head_params hp;
    hm_ctx_params cp;
    bend b = {0, 2};             /* the second hand-off says layer 2, which is the head's */
    pp1_params(list, bend_hook, &b, &hp, &cp);
    hc_head *h = hc_head_create(m, &hp, &cp, &err);
    CHECKF(h != NULL, "%s", err.msg);
    if (h) {
        float *lg = malloc((size_t)m->hp.n_vocab * sizeof(float));
        int32_t t[2] = {1, 403};
        log_clear();
        int64_t t0 = hr_time_ns();
        int rc = hc_head_eval(h, t, 2, 0, lg, false, &err);
        CHECKF(rc != 0 && strstr(err.msg, "no window"), "altered FORWARD: rc %d, '%s'", rc, err.msg);
        CHECK(hr_time_ns() - t0 < 5000000000LL);
        CHECK(log_wait("no window of this worker begins"));
        free(lg);
        hc_head_free(h);
    }
    /* every way a pipeline LOAD_PLAN's units can be wrong: refused, and the head says why (the
       worker's reason, not the closed connection it finds next), fast */
    for (int mode = 0; mode < 6; mode++) {
        replan r = {.mode = mode};
        pp1_params(list, replan_hook, &r, &hp, &cp);
        int64_t t0 = hr_time_ns();
        h = hc_head_create(m, &hp, &cp, &err);
        CHECKF(h == NULL && strstr(err.msg, "LOAD_PLAN"), "altered LOAD_PLAN (case %d): '%s'", mode,
               h ? "accepted" : err.msg);
        CHECK(hr_time_ns() - t0 < 5000000000LL);
        hc_head_free(h);
    }
    hm_model_free(m);
    gguf_close(g);
}

/* pipeline plans: windows dealt round the ring, the head's empty windows, impossible sizes */
static void check_pp_plan(void) {
    hr_err err = {0};
    hc_pp_plan p;
    /* 16 layers, 2,3,2: rounds 0-1|2-4|5-6, 7-8|9-11|12-13, 14-15 on the head */
    CHECK(hc_pp_plan_make(16, (int[]){2, 3, 2}, 3, &p, &err) == 0);
    CHECK(p.n_win[0] == 3 && p.win[0][1].begin == 7 && p.win[0][2].begin == 14 && p.win[0][2].end == 16);
    CHECK(p.n_win[1] == 2 && p.win[1][0].begin == 2 && p.win[1][1].end == 12);
    CHECK(p.n_win[2] == 2 && p.win[2][1].begin == 12 && p.win[2][1].end == 14);
    CHECK(p.n_rounds == 2 && p.n_steps == 7 && p.step_dev[6] == 0);
    /* the default: one round, the head with the fewest layers, then the output head [16, 16) */
    CHECK(hc_pp_plan_make(16, NULL, 3, &p, &err) == 0);
    CHECK(p.n_win[0] == 2 && p.win[0][0].end == 5 && p.win[0][1].begin == 16 && p.win[0][1].end == 16);
    CHECK(p.win[1][0].begin == 5 && p.win[1][0].end == 10 && p.win[2][0].end == 16 && p.n_rounds == 1);
    /* a head with no layers: [0, 0) then [L, L) */
    CHECK(hc_pp_plan_make(5, (int[]){0, 1, 1}, 3, &p, &err) == 0);
    CHECK(p.n_win[0] == 2 && p.win[0][0].end == 0 && p.win[0][1].begin == 5 && p.n_win[1] == 3 && p.n_win[2] == 2);
    CHECK(p.n_rounds == 3);   /* d1 d2 | d1 d2 | d1: the ring passes through the head twice */
    /* impossible: a worker placed after the last layer, no layers at all, one device, too many windows */
    CHECK(hc_pp_plan_make(16, (int[]){14, 2, 1}, 3, &p, &err) == HR_EINVAL && strstr(err.msg, "no layers"));
    CHECK(hc_pp_plan_make(16, (int[]){0, 0}, 2, &p, &err) == HR_EINVAL);
    CHECK(hc_pp_plan_make(16, (int[]){1}, 1, &p, &err) == HR_ERANGE);
    CHECK(hc_pp_plan_make(200, (int[]){1, 1}, 2, &p, &err) == HR_ERANGE && strstr(err.msg, "windows"));
}

/* the plan: block-aligned groups, largest remainder, contiguous ranges; balancing for the output head */
static void check_plan(const char *path) {
    hr_err err = {0};
    gguf_ctx *g = gguf_open(path, &err);
    hm_model *m = g ? hm_model_load(g, &err) : NULL;
    REQUIRE_VOID(m);
    hc_plan p;
    CHECK(hc_plan_make(m, (double[]){3, 1, 2}, 3, &p, &err) == 0);
    /* Q4_K/Q6_K: 2 KV heads of 256 attn_output columns (1 per group), 1536 neurons in 6 groups of 256 */
    CHECK(p.att_group == 1 && p.ff_group == 256);
    CHECK(p.dev[0].kv_begin == 0 && p.dev[0].kv_end == 1 && p.dev[1].kv_end == 1 && p.dev[2].kv_end == 2);
    CHECK(p.dev[0].ff_end == 768 && p.dev[1].ff_end == 1024 && p.dev[2].ff_end == 1536);
    CHECK(hc_plan_make(m, (double[]){0, 0}, 2, &p, &err) == HR_EINVAL);
    double sh[4], frac;
    CHECK(hc_plan_balance(m, (double[]){1, 1, 1, 1}, 4, sh, &frac, &err) == 0);
    CHECK(frac > 0 && frac < 0.5 && sh[0] < 0.25 && fabs(sh[0] + sh[1] + sh[2] + sh[3] - 1) < 1e-9);
    CHECK(fabs(sh[1] - sh[3]) < 1e-12);
    CHECK(hc_plan_balance(m, (double[]){0.01, 1}, 2, sh, NULL, &err) == 0 && sh[0] == 0 && sh[1] == 1);
    hm_model_free(m);
    gguf_close(g);
}

/* ---- a worker that leaves: the rebuilt caches hold the failure-free bits ----
   A pipeline (bit-identical to one device) runs what a server does — two sequences' prompts in one
   batch (70 tokens: attention's F32 path; 10: the F16 path), a prefix copied to a third sequence and
   continued, decode steps of all three — against one device's context doing the same. After a few
   decode steps worker 2 stops (its session ends, its connections close); the next step makes the head
   plan again without it, rebuild every device's caches from the token history and run the step again:
   every step's logits, before and after, must be the single device's bits. */
static void check_recover_bits(wk *ws, const char *model) {
    hr_err err = {0};
    gguf_ctx *g = gguf_open(model, &err);
    hm_model *m = g ? hm_model_load(g, &err) : NULL;
    REQUIRE_VOID(m);
    const int V = m->hp.n_vocab;
    hm_ctx_params cp = hm_ctx_default_params();
    cp.n_ctx = 128;
    cp.n_threads = 1;
    cp.n_seq = 3;
    cp.n_batch = 96;
    hm_shard sh = hm_shard_full(m);
    hm_ctx *c = hm_ctx_create(m, &sh, &cp, &err);
    cli_opts o;
    char list[256];
    worker_list(ws, 2, list, sizeof list);
    CHECK(head_flags(&o, list, NULL, "", true, NULL));
    hc_head *h = c ? hc_head_create(m, &o.head, &cp, &err) : NULL;
    CHECKF(h != NULL, "%s", err.msg);
    enum { N = 96 };
    int32_t t[N], sq[N], po[N];
    uint8_t want[N];
    float *la = malloc(sizeof(float) * 3 * (size_t)V), *lb = malloc(sizeof(float) * 3 * (size_t)V);
    int32_t len[3] = {0};
    uint64_t x = 29;
    log_clear();
    for (int step = 0; h && la && lb && step < 12; step++) {
        int n = 0;
        if (step == 0) { /* two prompts in one batch */
            for (int i = 0; i < 70; i++, n++) t[n] = (int32_t)(test_splitmix64(&x) % (uint64_t)V), sq[n] = 0, po[n] = i;
            for (int i = 0; i < 10; i++, n++) t[n] = (int32_t)(test_splitmix64(&x) % (uint64_t)V), sq[n] = 1, po[n] = i;
            len[0] = 70, len[1] = 10;
        } else if (step == 1) { /* a shared prefix, then the third sequence's own tokens */
            CHECKF(hm_kv_seq_copy(c, 0, 2, 40, &err) == 0, "%s", err.msg);
            CHECKF(hc_head_kv_seq_copy(h, 0, 2, 40, &err) == 0, "%s", err.msg);
            for (int i = 0; i < 5; i++, n++) t[n] = (int32_t)(test_splitmix64(&x) % (uint64_t)V), sq[n] = 2, po[n] = 40 + i;
            len[2] = 45;
        } else { /* a decode step of every sequence */
            for (int q = 0; q < 3; q++, n++) t[n] = (int32_t)(test_splitmix64(&x) % (uint64_t)V), sq[n] = q, po[n] = len[q]++;
        }
        if (step == 6) { /* worker 2 leaves */
            hc_worker_stop(ws[1].w);
            pthread_join(ws[1].th, NULL);
            hc_worker_free(ws[1].w);
            ws[1].w = NULL;
        }
        for (int i = 0; i < n; i++) want[i] = i + 1 == n || sq[i + 1] != sq[i];
        const hm_batch b1 = {.tokens = t, .n = n, .seq = sq, .pos_of = po, .out = want, .logits = la};
        const hm_batch b2 = {.tokens = t, .n = n, .seq = sq, .pos_of = po, .out = want, .logits = lb};
        int rows = 0;
        for (int i = 0; i < n; i++) rows += want[i];
        CHECKF(hm_eval(c, &b1, &err) == 0, "one device, step %d: %s", step, err.msg);
        int rc = hc_head_eval_batch(h, &b2, &err);
        CHECKF(rc == 0, "cluster, step %d: %s", step, err.msg);
        if (rc) break;
        CHECKF(!memcmp(la, lb, sizeof(float) * (size_t)rows * V), "step %d: the cluster's logits are not one device's", step);
    }
    CHECKF(log_has("left ("), "no worker left: %s", log_buf);
    CHECK(h && hc_head_recoveries(h) == 1);
    free(la);
    free(lb);
    hc_head_free(h);
    hm_ctx_free(c);
    cli_opts_free(&o);
    hm_model_free(m);
    gguf_close(g);
}

int main(void) {
    hr_init();
    check_hash();
    check_pp_plan();
    check_plan(test_path(test_shared_dir(), "models/synth/synth-llama-Q4_K_M-mix.gguf"));
    hr_log_set(log_cb, NULL);
    hr_log(HR_LOG_DEBUG, "test-tp"); /* settles base's lazily read log level before threads log */
    const char *sh = test_shared_dir();
    REQUIRE(mkdtemp(tmpdir) != NULL);
    setenv("XDG_CACHE_HOME", tmpdir, 1);   /* the heads' default cache */
    wk ws[MAX_W] = {0};
    REQUIRE(start_workers(ws, MAX_W));
    const char *stories = test_path(sh, "models/stories260K.gguf");
    const char *q8 = test_path(sh, "models/synth/synth-llama-Q8_0.gguf");
    const char *q4km = test_path(sh, "models/synth/synth-llama-Q4_K_M-mix.gguf");
    const char *qw2 = test_path(sh, "models/synth/synth-qwen2-Q8_0.gguf");
    const char *qw3 = test_path(sh, "models/synth/synth-qwen3-Q4_K_M-mix.gguf");
    /* F32 weights, F32 cache: only the order of the partial sums differs */
    run_cfg f32 = {stories, 1, NULL, HC_ALLREDUCE_STAR, HQ_TYPE_F32, 1e-5, true, -1, NULL};
    check_run(ws, &f32);
    f32.n_workers = 2; f32.shares = "3,1,2";
    check_run(ws, &f32);
    f32.n_workers = 3; f32.shares = NULL;
    check_run(ws, &f32);
    f32.shares = "1,2,0,3";   /* a worker with nothing to compute still takes part */
    check_run(ws, &f32);
    f32.shares = NULL; f32.allreduce = HC_ALLREDUCE_RING;
    check_run(ws, &f32);
    f32.n_workers = 1;
    check_run(ws, &f32);
    /* same model and shares again: every slice is in the workers' caches */
    f32.n_workers = 3; f32.allreduce = HC_ALLREDUCE_STAR; f32.expect_sent = 0;
    check_run(ws, &f32);
    /* quantized weights and an F16 cache */
    run_cfg q = {q8, 2, NULL, HC_ALLREDUCE_STAR, HQ_TYPE_F16, 3e-2, true, -1, NULL};
    check_run(ws, &q);
    q.model = q4km; q.n_workers = 3; q.shares = "3,1,2,1";
    check_run(ws, &q);
    q.model = qw2; q.n_workers = 1;
    q.shares = NULL;
    check_run(ws, &q);
    q.model = test_path(sh, "models/synth/synth-qwen2-Q4_K_M-mix.gguf"); q.n_workers = 2;
    check_run(ws, &q);
    q.model = qw3; q.n_workers = 2; q.allreduce = HC_ALLREDUCE_RING;
    check_run(ws, &q);
    q.n_workers = 3; q.shares = "3,1,2,1"; q.allreduce = HC_ALLREDUCE_STAR;
    check_run(ws, &q);
    /* pipelines: whole layers on each device, so the logits are the single device's exactly */
    run_cfg pp = {stories, 1, NULL, HC_ALLREDUCE_STAR, HQ_TYPE_F16, 0, true, -1, "1,1"};  /* 2 trips */
    check_run(ws, &pp);
    pp.n_workers = 2; pp.pp = "1,2,1";
    check_run(ws, &pp);
    pp.pp = "0,1,1"; pp.kv_type = HQ_TYPE_F32;   /* the head: embedding and output head only */
    check_run(ws, &pp);
    pp.n_workers = 3; pp.pp = "";                /* the default: one round */
    check_run(ws, &pp);
    pp.model = qw3; pp.n_workers = 1; pp.pp = "1,1"; pp.kv_type = HQ_TYPE_F16;
    check_run(ws, &pp);
    pp.model = q4km; pp.n_workers = 2; pp.pp = "0,1,1";
    check_run(ws, &pp);

    /* the head's own share: F32, Q8_0, K-quant mixes, biases, q/k norms, a tied Q4_0 head, a head
       with no units */
    char tied[300];
    snprintf(tied, sizeof tied, "%s/tied-q4_0.gguf", tmpdir);
    char *synth[] = {"synth", "--shape", "custom", "--arch", "llama", "--n-embd", "256", "--n-layer", "2", "--n-head", "8",
                     "--n-head-kv", "4", "--n-ff", "512", "--type", "Q4_0", "--tied", "--vocab-from",
                     (char *)stories, "-o", tied};
    CHECK(cli_main(&cli_synth, (int)HR_ARRAY_LEN(synth), synth) == 0);
    check_head_share(ws, stories, 1, NULL);
    check_head_share(ws, stories, 2, "3,1,2");
    check_head_share(ws, q8, 1, NULL);
    check_head_share(ws, q4km, 3, "3,1,2,1");
    check_head_share(ws, qw2, 2, NULL);
    check_head_share(ws, qw3, 1, NULL);
    check_head_share(ws, tied, 1, NULL);
    check_head_share(ws, tied, 2, "0,1,1");

    /* several sequences in one batch */
    check_batches(ws, stories, 2, NULL, 1e-4, NULL);   /* an F16 cache: the partial sums' order shows more */
    check_batches(ws, q4km, 3, NULL, 3e-2, NULL);
    check_batches(ws, stories, 1, "1,1", 0, NULL);
    check_batches(ws, q4km, 2, "0,1,1", 0, NULL);
    check_batches(ws, stories, 2, "1,1", 1e-4, "0+1,2");
    check_batches(ws, stories, 3, "2,1", 1e-4, "0+1+2,3");

    check_malformed(ws, stories);
    check_pp_malformed(ws, stories);
    /* after all that, the workers still serve a normal head */
    f32.shares = "2,1,1,1"; f32.expect_sent = -1;
    check_run(ws, &f32);

    check_recover_bits(ws, stories);   /* last: it stops worker 2 */

    stop_workers(ws, MAX_W);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_summary();
}
