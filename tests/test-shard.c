// modules: base quant gguf model
/* test-shard: the forward pass over tensor-parallel shards gives the single-device result.
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
    j->rc = hm_eval(j->c, j->toks, NULL, j->n, j->pos0, j->logits, false, NULL, &err);
    if (j->rc) fprintf(stderr, "shard eval: %s\n", err.msg);
    return NULL;
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (v[i] > v[b]) b = i;
    return b;
}

/* Runs prompt + n_gen greedy steps single-device and sharded; compares logits and tokens. */
static void check_split(const char *path, int k, const int32_t *kv_cuts, const int32_t *ff_cuts, int kv_type,
                        double tol) {
    hr_err err = {0};
    gguf_ctx *g = gguf_open(path, &err);
    REQUIRE_VOID(g);
    hm_model *m = hm_model_load(g, &err);
    REQUIRE_VOID(m);
    int V = m->hp.n_vocab, E = m->hp.n_embd;
    const int32_t prompt[] = {1, 403, 407, 261, 378, 432, 383, 286};
    const int np = 8, n_gen = 12;
    hm_ctx_params cp = hm_ctx_default_params();
    cp.n_ctx = 64;
    cp.n_batch = 16;
    cp.n_threads = 1;
    cp.kv_type = kv_type;
    hm_shard full = hm_shard_full(m);
    hm_ctx *ref = hm_ctx_create(m, &full, &cp, &err);
    REQUIRE_VOID(ref);

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
        REQUIRE_VOID(hm_eval(ref, in_r, NULL, n, pos, lr, false, NULL, &err) == 0);
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

static void check_misaligned(const char *path) {
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
    check_misaligned(test_path(sh, "models/synth/synth-llama-Q4_K_M.gguf"));
    return test_summary();
}
