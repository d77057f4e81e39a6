// modules: base quant gguf model
/* test-shard: the forward pass over tensor-parallel shards, and over pipeline windows (check_pipeline),
 * gives the single-device result.
 * k shards of one model run in k threads in lockstep, each over its own share of attention units
 * (KV heads) and FFN neurons (uneven shares, and shares with no attention at all); their sync hook
 * is an in-memory all-reduce (every shard sums all partials in the same order). The last-token
 * logits of every step and the greedy tokens must equal the single-device run's. This tests the
 * engine side of tensor parallelism without a network.
 * Tolerances: with F32 weights and an F32 cache the only difference is the order in which partial
 * dot products are added (measured ~2e-6). Where values are rounded afterwards — activations
 * quantized to 8 bits for the next matmul, K/V rounded to F16 — that last-bit difference can flip a
 * rounding and the flip propagates: measured up to 1.2e-2 relative (the size of the quantization
 * noise itself; llama.cpp references are met at 3e-2), and the greedy tokens still agree. */
#include "test.h"

#include "gguf/gguf.h"
#include "model/model.h"
#include "quant/quant.h"

#include <math.h>
#include <pthread.h>

#define MAX_SHARDS 4

typedef struct group {
    int k;
    pthread_barrier_t bar;
    float *slot[MAX_SHARDS];
} group;

typedef struct peer {
    group *g;
    int idx;
    float *sum;          /* [n_batch][n_embd] */
} peer;

static int allreduce(void *user, int layer, enum hm_block b, float *x, int n, int n_embd) {
    (void)layer; (void)b;
    peer *p = user;
    group *g = p->g;
    g->slot[p->idx] = x;
    pthread_barrier_wait(&g->bar);
    size_t cnt = (size_t)n * n_embd;
    for (size_t i = 0; i < cnt; i++) {
        float s = 0;
        for (int j = 0; j < g->k; j++) s += g->slot[j][i];
        p->sum[i] = s;
    }
    pthread_barrier_wait(&g->bar);   /* everyone has read every slot */
    memcpy(x, p->sum, cnt * sizeof(float));
    return 0;
}

typedef struct job {
    hm_ctx *c;
    const int32_t *toks;
    int n;
    int32_t pos0;
    float *logits;       /* shard 0 only */
    int rc;
} job;

static void *run_job(void *arg) {
    job *j = arg;
    hr_err err = {0};
    j->rc = hm_eval(j->c, &(hm_batch){.tokens = j->toks, .n = j->n, .pos = j->pos0, .logits = j->logits}, &err);
    if (j->rc) fprintf(stderr, "shard eval: %s\n", err.msg);
    return NULL;
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (v[i] > v[b]) b = i;
    return b;
}

/* Runs prompt + n_gen greedy steps single-device and sharded; compares logits and tokens. */
/* the prompt both checks run, then n_gen greedy steps */
static const int32_t prompt[] = {1, 403, 407, 261, 378, 432, 383, 286};
enum { np = 8, n_gen = 12 };

/* opens a model and a single-device reference context of the checks' size */
static bool open_ref(const char *path, int kv_type, gguf_ctx **g, hm_model **m, hm_ctx_params *cp, hm_ctx **ref) {
    hr_err err = {0};
    *m = NULL;
    *ref = NULL;
    if (!(*g = gguf_open(path, &err))) return false;
    if (!(*m = hm_model_load(*g, &err))) { gguf_close(*g); return false; }
    *cp = hm_ctx_default_params();
    cp->n_ctx = 64;
    cp->n_batch = 16;
    cp->n_threads = 1;
    cp->kv_type = kv_type;
    hm_shard full = hm_shard_full(*m);
    if (!(*ref = hm_ctx_create(*m, &full, cp, &err))) { hm_model_free(*m); gguf_close(*g); return false; }
    return true;
}

static void check_split(const char *path, int k, const int32_t *kv_cuts, const int32_t *ff_cuts, int kv_type,
                        double tol) {
    hr_err err = {0};
    gguf_ctx *g;
    hm_model *m;
    hm_ctx_params cp;
    hm_ctx *ref;
    REQUIRE_VOID(open_ref(path, kv_type, &g, &m, &cp, &ref));
    int V = m->hp.n_vocab, E = m->hp.n_embd;

    group grp = {.k = k};
    pthread_barrier_init(&grp.bar, NULL, (unsigned)k);
    peer peers[MAX_SHARDS];
    hm_ctx *cs[MAX_SHARDS] = {0};
    bool ok = true;
    for (int i = 0; i < k; i++) {
        hm_shard s = hm_shard_full(m);
        s.kv_begin = kv_cuts[i];
        s.kv_end = kv_cuts[i + 1];
        s.ff_begin = ff_cuts[i];
        s.ff_end = ff_cuts[i + 1];
        s.last = i == 0;          /* shard 0 is the head: logits */
        s.sync = allreduce;
        peers[i] = (peer){&grp, i, malloc((size_t)cp.n_batch * E * sizeof(float))};
        s.sync_user = &peers[i];
        cs[i] = hm_ctx_create(m, &s, &cp, &err);
        CHECKF(cs[i] != NULL, "%s: shard %d: %s", path, i, err.msg);
        if (!cs[i]) ok = false;
    }
    float *lr = malloc((size_t)V * sizeof(float)), *ls = malloc((size_t)V * sizeof(float));
    int32_t tok_r = 0, tok_s = 0;
    double worst = 0;
    int same_tokens = 0;
    for (int step = 0; ok && step <= n_gen; step++) {
        const int32_t *in_r = step == 0 ? prompt : &tok_r, *in_s = step == 0 ? prompt : &tok_s;
        int n = step == 0 ? np : 1;
        int32_t pos = step == 0 ? 0 : np + step - 1;
        REQUIRE_VOID(hm_eval(ref, &(hm_batch){.tokens = in_r, .n = n, .pos = pos, .logits = lr}, &err) == 0);
        pthread_t th[MAX_SHARDS];
        job jobs[MAX_SHARDS];
        for (int i = 0; i < k; i++) {
            jobs[i] = (job){cs[i], in_s, n, pos, i == 0 ? ls : NULL, 0};
            pthread_create(&th[i], NULL, run_job, &jobs[i]);
        }
        for (int i = 0; i < k; i++) { pthread_join(th[i], NULL); CHECK(jobs[i].rc == 0); }
        double num = 0, den = 0;
        for (int v = 0; v < V; v++) { double d = (double)lr[v] - ls[v]; num += d * d; den += (double)lr[v] * lr[v]; }
        double rel = sqrt(num / den);
        if (rel > worst) worst = rel;
        tok_r = argmax(lr, V);
        tok_s = argmax(ls, V);
        same_tokens += tok_r == tok_s;
    }
    printf("%-44s %d shards kv", strrchr(path, '/') + 1, k);
    for (int i = 0; i <= k; i++) printf("%s%d", i ? "," : " ", kv_cuts[i]);
    printf(" ff");
    for (int i = 0; i <= k; i++) printf("%s%d", i ? "," : " ", ff_cuts[i]);
    printf(": worst logits rel %.2e, tokens %d/%d equal\n", worst, same_tokens, n_gen + 1);
    CHECKF(worst <= tol, "%s, %d shards: logits differ by %.2e > %.1e", path, k, worst, tol);
    CHECKF(same_tokens == n_gen + 1, "%s, %d shards: greedy tokens differ", path, k);
    free(lr);
    free(ls);
    for (int i = 0; i < k; i++) { hm_ctx_free(cs[i]); free(peers[i].sum); }
    pthread_barrier_destroy(&grp.bar);
    hm_ctx_free(ref);
    hm_model_free(m);
    gguf_close(g);
}

/* Pipeline (piped ring): device d owns windows of sizes[d] layers, dealt round the ring from layer 0
   until all are placed; the hidden state goes device 0 -> 1 -> ... -> 0 once per round. Every layer
   runs whole on one device with the same kernels, so the logits must equal the single-device ones
   exactly. Device 0 embeds and runs the output head (an empty last window if it owns no last layer). */
static void check_pipeline(const char *path, int k, const int *sizes, int kv_type) {
    hr_err err = {0};
    gguf_ctx *g;
    hm_model *m;
    hm_ctx_params cp;
    hm_ctx *ref;
    REQUIRE_VOID(open_ref(path, kv_type, &g, &m, &cp, &ref));
    int V = m->hp.n_vocab, E = m->hp.n_embd, L = m->hp.n_layer;
    hm_shard sh[MAX_SHARDS];
    int owner[256], rounds = 0;          /* owner of each window in execution order */
    for (int d = 0; d < k; d++) {
        sh[d] = hm_shard_full(m);
        sh[d].first = sh[d].last = d == 0;
    }
    for (int l = 0, d = 0; l < L; d = (d + 1) % k) {
        if (sizes[d] == 0) continue;
        int e = l + sizes[d] < L ? l + sizes[d] : L;
        sh[d].windows[sh[d].n_windows++] = (hm_window){l, e};
        owner[rounds++] = d;
        l = e;
    }
    if (sh[0].n_windows == 0 || sh[0].windows[0].begin != 0) {   /* embedding only */
        memmove(&sh[0].windows[1], &sh[0].windows[0], (size_t)sh[0].n_windows * sizeof sh[0].windows[0]);
        sh[0].windows[0] = (hm_window){0, 0};
        sh[0].n_windows++;
        memmove(&owner[1], &owner[0], (size_t)rounds * sizeof owner[0]);
        owner[0] = 0;
        rounds++;
    }
    if (owner[rounds - 1] != 0) {                                      /* output only */
        sh[0].windows[sh[0].n_windows++] = (hm_window){L, L};
        owner[rounds++] = 0;
    }
    hm_ctx *cs[MAX_SHARDS] = {0};
    for (int d = 0; d < k; d++) {
        if (sh[d].n_windows == 0) continue;   /* more devices than windows: this one idles */
        cs[d] = hm_ctx_create(m, &sh[d], &cp, &err);
        CHECKF(cs[d] != NULL, "%s: device %d: %s", path, d, err.msg);
        if (!cs[d]) goto done;
        CHECKF(hm_ctx_n_windows(cs[d]) == sh[d].n_windows, "device %d: %d windows, %d given", d, hm_ctx_n_windows(cs[d]), sh[d].n_windows);
    }
    float *lr = malloc((size_t)V * sizeof(float)), *ls = malloc((size_t)V * sizeof(float));
    float *h0 = malloc((size_t)cp.n_batch * E * sizeof(float)), *h1 = malloc((size_t)cp.n_batch * E * sizeof(float));
    int32_t tok_r = 0, tok_s = 0;
    int exact = 0, same_tokens = 0;
    for (int step = 0; step <= n_gen; step++) {
        const int32_t *in_r = step == 0 ? prompt : &tok_r, *in_s = step == 0 ? prompt : &tok_s;
        int n = step == 0 ? np : 1;
        int32_t pos = step == 0 ? 0 : np + step - 1;
        REQUIRE_VOID(hm_eval(ref, &(hm_batch){.tokens = in_r, .n = n, .pos = pos, .logits = lr}, &err) == 0);
        int next_w[MAX_SHARDS] = {0};
        for (int r = 0; r < rounds; r++) {
            int d = owner[r];
            const hm_batch b = {.tokens = in_s, .embd = h0, .n = n, .pos = pos, .logits = ls, .embd_out = h1};
            int rc = hm_eval_window(cs[d], next_w[d]++, &b, &err);
            CHECKF(rc == 0, "%s: device %d window %d: %s", path, d, next_w[d] - 1, err.msg);
            float *t = h0; h0 = h1; h1 = t;
        }
        exact += !memcmp(lr, ls, (size_t)V * sizeof(float));
        tok_r = argmax(lr, V);
        tok_s = argmax(ls, V);
        same_tokens += tok_r == tok_s;
    }
    /* a window shard refuses the one-call form */
    CHECK(k < 2 || sh[1].n_windows < 2 ||
          hm_eval(cs[1], &(hm_batch){.embd = h0, .n = 1, .embd_out = h1}, &err) == HR_EINVAL);
    printf("%-44s pipeline %d devices, windows", strrchr(path, '/') + 1, k);
    for (int d = 0; d < k; d++) printf("%s%d", d ? "," : " ", sizes[d]);
    printf(" (%d windows per token): %d/%d steps bit-identical, tokens %d/%d equal\n", rounds, exact, n_gen + 1,
           same_tokens, n_gen + 1);
    CHECKF(exact == n_gen + 1, "%s: pipeline logits differ from the single device's", path);
    CHECKF(same_tokens == n_gen + 1, "%s: pipeline greedy tokens differ", path);
    free(lr);
    free(ls);
    free(h0);
    free(h1);
done:
    for (int d = 0; d < k; d++) hm_ctx_free(cs[d]);
    hm_ctx_free(ref);
    hm_model_free(m);
    gguf_close(g);
}

/* shards the model cannot run are refused: columns off block boundaries, units outside the model,
   windows that overlap, run backwards or leave the model */
static void check_bad_shards(const char *path) {
    hr_err err = {0};
    gguf_ctx *g = gguf_open(path, &err);
    REQUIRE_VOID(g);
    hm_model *m = hm_model_load(g, &err);
    REQUIRE_VOID(m);
    hm_shard s = hm_shard_full(m);
    s.ff_begin = 0;
    s.ff_end = 100;      /* not a multiple of any quant block */
    CHECK(hm_shard_validate(m, &s, &err) == HR_EINVAL && strstr(err.msg, "block boundaries"));
    s = hm_shard_full(m);
    s.kv_end = m->hp.n_head_kv + 1;
    CHECK(hm_shard_validate(m, &s, &err) == HR_EINVAL);
    s = hm_shard_full(m);
    s.n_windows = 2;
    s.windows[0] = (hm_window){0, 1};
    s.windows[1] = (hm_window){0, 2};
    CHECK(hm_shard_validate(m, &s, &err) == HR_EINVAL && strstr(err.msg, "window"));
    s.windows[1] = (hm_window){2, 1};
    CHECK(hm_shard_validate(m, &s, &err) == HR_EINVAL);
    s.windows[1] = (hm_window){1, m->hp.n_layer + 1};
    CHECK(hm_shard_validate(m, &s, &err) == HR_EINVAL);
    s.n_windows = HM_MAX_WINDOWS + 1;
    CHECK(hm_shard_validate(m, &s, &err) == HR_EINVAL);
    s.n_windows = 2;
    s.windows[1] = (hm_window){m->hp.n_layer, m->hp.n_layer};   /* an empty last window is fine */
    CHECKF(hm_shard_validate(m, &s, &err) == 0, "%s", err.msg);
    CHECK(hm_shard_n_layers(&s) == 1);
    hm_model_free(m);
    gguf_close(g);
}

int main(void) {
    hr_init();
    const char *sh = test_shared_dir();
    const char *stories = test_path(sh, "models/stories260K.gguf");
    /* stories260K: 4 KV heads, n_ff 172, F32 (any column split is block-aligned) */
    check_split(stories, 2, (int32_t[]){0, 1, 4}, (int32_t[]){0, 100, 172}, HQ_TYPE_F32, 1e-5);
    check_split(stories, 3, (int32_t[]){0, 2, 3, 4}, (int32_t[]){0, 50, 120, 172}, HQ_TYPE_F32, 1e-5);
    check_split(stories, 4, (int32_t[]){0, 1, 2, 3, 4}, (int32_t[]){0, 43, 86, 129, 172}, HQ_TYPE_F32, 1e-5);
    check_split(stories, 2, (int32_t[]){0, 3, 4}, (int32_t[]){0, 20, 172}, HQ_TYPE_F16, 1e-3);
    /* synth models: 2 KV heads of 2x128 columns, n_ff 1536; a third shard holds FFN neurons only */
    check_split(test_path(sh, "models/synth/synth-llama-Q8_0.gguf"), 3, (int32_t[]){0, 1, 2, 2},
                (int32_t[]){0, 512, 1024, 1536}, HQ_TYPE_F16, 3e-2);
    check_split(test_path(sh, "models/synth/synth-llama-Q4_K_M-mix.gguf"), 2, (int32_t[]){0, 1, 2},
                (int32_t[]){0, 256, 1536}, HQ_TYPE_F16, 3e-2);
    check_split(test_path(sh, "models/synth/synth-qwen2-Q4_K_M-mix.gguf"), 2, (int32_t[]){0, 1, 2},
                (int32_t[]){0, 1024, 1536}, HQ_TYPE_F16, 3e-2);
    check_split(test_path(sh, "models/synth/synth-qwen3-Q8_0.gguf"), 3, (int32_t[]){0, 0, 1, 2},
                (int32_t[]){0, 512, 1024, 1536}, HQ_TYPE_F16, 3e-2);
    check_bad_shards(test_path(sh, "models/synth/synth-llama-Q4_K_M.gguf"));
    /* pipelines: stories260K has 5 layers, the synth models 2 (a plain pipeline is one round) */
    stories = test_path(sh, "models/stories260K.gguf");
    check_pipeline(stories, 2, (int[]){3, 2}, HQ_TYPE_F16);            /* one round */
    check_pipeline(stories, 2, (int[]){1, 1}, HQ_TYPE_F16);            /* 3 rounds, head ends */
    check_pipeline(stories, 3, (int[]){1, 2, 1}, HQ_TYPE_F32);         /* 2 rounds, worker ends */
    check_pipeline(stories, 3, (int[]){0, 1, 1}, HQ_TYPE_F16);         /* head: embedding + output only */
    check_pipeline(test_path(sh, "models/synth/synth-llama-Q8_0.gguf"), 3, (int[]){1, 1, 1}, HQ_TYPE_F16);
    check_pipeline(test_path(sh, "models/synth/synth-qwen3-Q4_K_M-mix.gguf"), 2, (int[]){1, 1}, HQ_TYPE_F16);
    check_pipeline(test_path(sh, "models/synth/synth-qwen2-Q8_0.gguf"), 4, (int[]){1, 1, 1, 1}, HQ_TYPE_F16);
    return test_summary();
}
