// modules: base quant gguf model
/* test-batch — multi-sequence batches (issue 27): a sequence's logits are the same bits whether it runs
 * alone or batched with other sequences.
 * - kernels: every weight type's tile kernel (file layout and packed) gives an activation row the same
 *   bits whatever the tile around it — how many rows it has, where the row sits, how many weight rows
 *   — which is what lets a decode step of k sequences share one pass over the weights.  The
 *   dispatched table, then (children) the AVX2 family and the portable kernels.
 * - the forward pass, on shared models of several weight types (weights loaded and packed, and the
 *   file's layout): sequences run alone (seq == NULL, the API every single-sequence caller uses:
 *   a prompt, then one token at a time) against the same sequences interleaved in batches with
 *   others at other positions, their prompts cut into other chunks, in varying orders: every
 *   token's logits memcmp-equal.  The prefix copy (hm_kv_seq_copy) gives the logits of recomputing.
 * - bad batches (sequence out of range, positions not consecutive) are refused; memory estimates
 *   count every sequence's cache. */
#include "test.h"

#include "gguf/gguf.h"
#include "model/model.h"
#include "quant/quant-impl.h"


static uint64_t rng_state = 0x243f6a8885a308d3ULL;
static uint64_t rng_next(void) { return test_splitmix64(&rng_state); }
static float rng_uniform(void) { return -1.0f + 2.0f * (float)(rng_next() >> 40) * 0x1p-24f; }

/* ---- kernels: a row's result does not depend on its tile ------------------------------------------- */

/* Each of NC activation rows alone (nc = 1 over all R weight rows: a decode's call) is the reference;
   then every nc = 1..NC at several offsets, over all rows at once and in tiles of 16 rows (a batch's
   calls): each column must be the reference's bits. */
static void test_kernel_columns(void) {
    const int types[] = {HQ_TYPE_F32,  HQ_TYPE_F16,  HQ_TYPE_BF16, HQ_TYPE_Q4_0, HQ_TYPE_Q4_1,
                         HQ_TYPE_Q5_0, HQ_TYPE_Q5_1, HQ_TYPE_Q8_0, HQ_TYPE_Q2_K, HQ_TYPE_Q3_K,
                         HQ_TYPE_Q4_K, HQ_TYPE_Q5_K, HQ_TYPE_Q6_K};
    const int lens[] = {256, 2048, 8192 + 256}; /* the last: x4v's K-panels, and a decode's long chunks */
    enum { R = 32, NC = 9 };   /* two bands; up to 9 columns: tiles of 4, a rest of 1 */
    for (size_t k = 0; k < HR_ARRAY_LEN(types); k++) {
        const int t = types[k];
        const hq_traits *tr = hq_get_traits(t), *vt = hq_get_traits(tr->vec_dot_type);
        for (int pk = 0; pk < 2; pk++) {
            if (pk && !tr->gemm_packed) continue;
            int bad = 0, cases = 0;
            for (size_t li = 0; li < HR_ARRAY_LEN(lens); li++) {
                const int n = lens[li];
                if (pk && !hq_pack_ok(t, n, R)) continue;
                const size_t bx = hq_row_size(t, n), by = hq_row_size(tr->vec_dot_type, n);
                const size_t pys = pk && tr->prep ? tr->prep_size(n) : by;
                uint8_t *x = malloc(bx * R), *px = malloc(bx * R), *y = malloc(by * NC), *py = malloc(pys * NC);
                float *f = malloc((size_t)n * sizeof(float)), *ref = malloc(sizeof(float) * R * NC),
                      *s = malloc(sizeof(float) * R * NC);
                REQUIRE_VOID(x && px && y && py && f && ref && s);
                for (int r = 0; r < R; r++) {
                    for (int i = 0; i < n; i++) f[i] = rng_uniform();
                    tr->from_float_ref(f, x + r * bx, n);
                }
                for (int j = 0; j < NC; j++) {
                    for (int i = 0; i < n; i++) f[i] = rng_uniform();
                    vt->from_float(f, y + j * by, n);
                }
                const uint8_t *W = x, *Y = y;
                if (pk) {
                    for (int r = 0; r < R; r += HQ_BAND) tr->pack(px + r * bx, x + r * bx, bx, n, HR_MIN(R - r, HQ_BAND));
                    W = px;
                    if (tr->prep) {
                        for (int j = 0; j < NC; j++) tr->prep(py + j * pys, y + j * by, n);
                        Y = py;
                    }
                }
                const hq_gemm_fn g = pk ? tr->gemm_packed : tr->gemm;
                for (int j = 0; j < NC; j++) g(n, ref + j * R, R, W, bx, R, Y + j * pys, pys, 1);
                for (int nc = 1; nc <= NC; nc++)
                    for (int off = 0; off + nc <= NC; off += 3) {
                        g(n, s, R, W, bx, R, Y + off * pys, pys, nc);
                        for (int j = 0; j < nc; j++) bad += memcmp(s + j * R, ref + (off + j) * R, R * sizeof(float)) != 0;
                        memset(s, 0, sizeof(float) * R * NC);
                        for (int r0 = 0; r0 < R; r0 += 16) g(n, s + r0, R, W + r0 * bx, bx, 16, Y + off * pys, pys, nc);
                        for (int j = 0; j < nc; j++) bad += memcmp(s + j * R, ref + (off + j) * R, R * sizeof(float)) != 0;
                        cases += 2 * nc;
                    }
                free(x), free(px), free(y), free(py), free(f), free(ref), free(s);
            }
            printf("  %-5s %s (%s): %d of %d columns differ from the row alone\n", tr->name, pk ? "packed" : "file",
                   hq_simd_name(), bad, cases);
            CHECKF(bad == 0, "%s %s: a row's result depends on its tile", tr->name, pk ? "packed" : "file");
        }
    }
}

/* ---- the forward pass ------------------------------------------------------------------------------ */

enum { N_CTX = 192, MAX_SEQ = 4 };

/* a sequence: tokens [len], the first n_prompt a prompt, the rest decoded one a step */
typedef struct {
    int32_t tok[N_CTX];
    int len, n_prompt;
    int chunk_alone, chunk_batched; /* prompt chunk sizes (both below 64, or both 64 and more) */
} tseq;

static hm_ctx *mk_ctx(const hm_model *m, int n_seq, int kv_type) {
    hr_err err = {0};
    hm_ctx_params p = hm_ctx_default_params();
    p.n_ctx = N_CTX;
    p.n_seq = n_seq;
    p.n_batch = 256;
    p.n_threads = 2;
    p.kv_type = kv_type;
    hm_shard sh = hm_shard_full(m);
    hm_ctx *c = hm_ctx_create(m, &sh, &p, &err);
    if (!c) fprintf(stderr, "hm_ctx_create: %s\n", err.msg);
    return c;
}

/* s alone through the single-sequence API: its prompt in chunks of chunk_alone, then a token a step;
   every token's logits into out [len][n_vocab] */
static bool run_alone(const hm_model *m, int kv_type, const tseq *s, float *out) {
    hr_err err = {0};
    hm_ctx *c = mk_ctx(m, 1, kv_type);
    if (!c) return false;
    const int V = m->hp.n_vocab;
    bool ok = true;
    for (int i = 0; ok && i < s->len;) {
        const int nb = i < s->n_prompt ? HR_MIN(s->chunk_alone, s->n_prompt - i) : 1;
        const hm_batch b = {.tokens = s->tok + i, .n = nb, .pos = i, .logits = out + (size_t)i * V, .all_logits = true};
        if (hm_eval(c, &b, &err)) ok = false, fprintf(stderr, "alone: %s\n", err.msg);
        i += nb;
    }
    hm_ctx_free(c);
    return ok;
}

/* the sequences interleaved: each step takes, for each sequence in a rotating order, its next prompt
   chunk (chunk_batched) or its next token, skipping a sequence now and then; logits of every token */
static bool run_batched(const hm_model *m, int kv_type, const tseq *ss, int ns, float **out) {
    hr_err err = {0};
    hm_ctx *c = mk_ctx(m, ns + 1, kv_type); /* one sequence more than used: sequence numbers are not slots */
    if (!c) return false;
    const int V = m->hp.n_vocab;
    int done[MAX_SEQ] = {0};
    int32_t tok[256], seq[256], pos[256];
    uint8_t want[256];
    int at[256];
    float *lg = malloc(sizeof(float) * 256 * (size_t)V);
    bool ok = lg != NULL;
    for (int step = 0; ok; step++) {
        int n = 0;
        for (int k = 0; k < ns; k++) {
            const int q = (k + step) % ns;
            const tseq *s = &ss[q];
            if (done[q] >= s->len || (step % 3 == 2 && q == step % ns && step > 0)) continue;
            const int nb = done[q] < s->n_prompt ? HR_MIN(s->chunk_batched, s->n_prompt - done[q]) : 1;
            for (int i = 0; i < nb; i++, n++) {
                tok[n] = s->tok[done[q] + i];
                seq[n] = ns - q;       /* sequences numbered from the top */
                pos[n] = done[q] + i;
                want[n] = (uint8_t)(1 + (n & 1)); /* any nonzero */
                at[n] = q;
            }
            done[q] += nb;
        }
        if (n == 0) {
            int left = 0;
            for (int q = 0; q < ns; q++) left += done[q] < ss[q].len;
            if (!left) break;
            continue;
        }
        const hm_batch b = {.tokens = tok, .n = n, .pos = 12345, .logits = lg, .seq = seq, .pos_of = pos, .out = want};
        if (hm_eval(c, &b, &err)) {
            fprintf(stderr, "batched: %s\n", err.msg);
            ok = false;
        }
        for (int i = 0; ok && i < n; i++) memcpy(out[at[i]] + (size_t)pos[i] * V, lg + (size_t)i * V, sizeof(float) * V);
    }
    free(lg);
    hm_ctx_free(c);
    return ok;
}

/* the prefix path: sequence 0 runs s, sequence 1 copies its first `keep` positions and computes the
   rest (one chunk, then a token a step) — its logits must be s alone's from keep on; sequence 0 goes
   on unharmed (its last tokens after the copy) */
static void check_prefix_copy(const hm_model *m, int kv_type, const tseq *s, const float *alone, const char *name) {
    hr_err err = {0};
    hm_ctx *c = mk_ctx(m, 2, kv_type);
    REQUIRE_VOID(c);
    const int V = m->hp.n_vocab, keep = s->n_prompt - 5, stop = s->len - 3;
    float *lg = malloc(sizeof(float) * (size_t)s->len * V);
    REQUIRE_VOID(lg && keep > 0 && keep + 5 <= 64 && s->chunk_alone < 64);
    int bad = 0;
    int32_t zero[64] = {0}, ones[64], po[64];
    for (int k = 0; k < 64; k++) ones[k] = 1;
    for (int i = 0; i < stop;) { /* sequence 0, as alone, up to stop */
        const int nb = i < s->n_prompt ? HR_MIN(s->chunk_alone, s->n_prompt - i) : 1;
        for (int k = 0; k < nb; k++) po[k] = i + k;
        const hm_batch b = {.tokens = s->tok + i, .n = nb, .logits = lg, .all_logits = true, .seq = zero, .pos_of = po};
        CHECK(hm_eval(c, &b, &err) == 0);
        i += nb;
    }
    CHECK(hm_kv_seq_copy(c, 0, 1, keep, &err) == 0);
    const hm_batch b1 = {.tokens = s->tok + keep, .n = s->n_prompt - keep, .pos = keep, .logits = lg, .all_logits = true,
                         .seq = ones};
    CHECK(hm_eval(c, &b1, &err) == 0);
    bad += memcmp(lg, alone + (size_t)keep * V, sizeof(float) * V * (size_t)(s->n_prompt - keep)) != 0;
    for (int i = s->n_prompt; i < s->len; i++) {
        const int32_t one = 1;
        const hm_batch b = {.tokens = s->tok + i, .n = 1, .pos = i, .logits = lg, .seq = &one};
        CHECK(hm_eval(c, &b, &err) == 0);
        bad += memcmp(lg, alone + (size_t)i * V, sizeof(float) * V) != 0;
    }
    for (int i = stop; i < s->len; i++) { /* sequence 0 again */
        const hm_batch b = {.tokens = s->tok + i, .n = 1, .pos = i, .logits = lg};
        CHECK(hm_eval(c, &b, &err) == 0);
        bad += memcmp(lg, alone + (size_t)i * V, sizeof(float) * V) != 0;
    }
    CHECKF(bad == 0, "%s: prefix copy: %d rows of logits differ from recomputing", name, bad);
    free(lg);
    hm_ctx_free(c);
}

static void test_model(const char *shared, const char *rel, bool load, int kv_type) {
    hr_err err = {0};
    gguf_ctx *g = gguf_open(test_path(shared, rel), &err);
    REQUIRE_VOID(g);
    hm_model *m = hm_model_load(g, &err);
    REQUIRE_VOID(m);
    hm_shard sh = hm_shard_full(m);
    uint64_t copied, packed = 0;
    if (load) CHECK(hm_model_load_weights(m, &sh, true, &copied, &packed, &err) == 0);
    const int V = m->hp.n_vocab;
    /* A: a short prompt cut into smaller chunks; B: a prompt of 5 in one; C: a long prompt (F32 path)
       in two chunks; D: a prompt fed token by token */
    static tseq ss[MAX_SEQ];
    const int shape[MAX_SEQ][4] = {{20, 20, 7, 14}, {5, 5, 5, 12}, {150, 150, 75, 10}, {33, 33, 1, 9}};
    for (int q = 0; q < MAX_SEQ; q++) {
        tseq *s = &ss[q];
        s->n_prompt = shape[q][0], s->chunk_alone = shape[q][1], s->chunk_batched = shape[q][2];
        s->len = s->n_prompt + shape[q][3];
        for (int i = 0; i < s->len; i++) s->tok[i] = (int32_t)(rng_next() % (uint64_t)V);
    }
    float *alone[MAX_SEQ], *batched[MAX_SEQ];
    bool ok = true;
    for (int q = 0; q < MAX_SEQ; q++) {
        alone[q] = malloc(sizeof(float) * (size_t)ss[q].len * V);
        batched[q] = calloc((size_t)ss[q].len * V, sizeof(float));
        ok = ok && alone[q] && batched[q] && run_alone(m, kv_type, &ss[q], alone[q]);
    }
    CHECK(ok);
    if (ok) {
        CHECK(run_batched(m, kv_type, ss, MAX_SEQ, batched));
        int bad = 0, rows = 0;
        for (int q = 0; q < MAX_SEQ; q++)
            for (int i = 0; i < ss[q].len; i++, rows++)
                bad += memcmp(alone[q] + (size_t)i * V, batched[q] + (size_t)i * V, sizeof(float) * V) != 0;
        printf("  %-34s %-6s %s KV: %d of %d tokens' logits differ batched from alone\n", rel,
               load ? (packed ? "packed" : "loaded") : "mapped", kv_type == HQ_TYPE_F16 ? "F16" : "F32", bad, rows);
        CHECKF(bad == 0, "%s: batched logits differ from alone", rel);
        check_prefix_copy(m, kv_type, &ss[0], alone[0], rel);
    }
    for (int q = 0; q < MAX_SEQ; q++) free(alone[q]), free(batched[q]);
    hm_model_free(m);
    gguf_close(g);
}

/* bad batches and contexts; estimates count every sequence */
static void test_bad(const char *shared) {
    hr_err err = {0};
    gguf_ctx *g = gguf_open(test_path(shared, "models/stories260K.gguf"), &err);
    REQUIRE_VOID(g);
    hm_model *m = hm_model_load(g, &err);
    REQUIRE_VOID(m);
    hm_ctx_params p = hm_ctx_default_params();
    p.n_ctx = 16, p.n_batch = 8, p.n_seq = 3;
    hm_shard sh = hm_shard_full(m);
    hm_ctx *c = hm_ctx_create(m, &sh, &p, &err);
    REQUIRE_VOID(c);
    CHECK(hm_ctx_n_seq(c) == 3 && hm_ctx_n_ctx(c) == 16);
    float *lg = malloc(sizeof(float) * 8 * (size_t)m->hp.n_vocab);
    const int32_t tok[4] = {1, 2, 3, 4};
    CHECK(hm_eval(c, &(hm_batch){.tokens = tok, .n = 2, .logits = lg, .seq = (int32_t[]){0, 3}}, &err) == HR_EINVAL);
    CHECK(hm_eval(c, &(hm_batch){.tokens = tok, .n = 2, .logits = lg, .seq = (int32_t[]){-1, 0}}, &err) == HR_EINVAL);
    CHECK(hm_eval(c, &(hm_batch){.tokens = tok, .n = 2, .logits = lg, .pos_of = (int32_t[]){0, 16}}, &err) ==
          HR_ERANGE);
    CHECK(hm_eval(c, &(hm_batch){.tokens = tok, .n = 2, .logits = lg, .pos = INT32_MAX}, &err) == HR_ERANGE);
    /* a sequence's tokens: consecutive and ascending, whatever lies between them */
    CHECK(hm_eval(c, &(hm_batch){.tokens = tok, .n = 3, .logits = lg, .seq = (int32_t[]){1, 0, 1},
                                 .pos_of = (int32_t[]){4, 0, 6}}, &err) == HR_EINVAL);
    CHECK(hm_eval(c, &(hm_batch){.tokens = tok, .n = 2, .logits = lg, .pos_of = (int32_t[]){3, 3}}, &err) == HR_EINVAL);
    CHECK(hm_eval(c, &(hm_batch){.tokens = tok, .n = 3, .logits = lg, .seq = (int32_t[]){1, 0, 1},
                                 .pos_of = (int32_t[]){4, 0, 5}, .out = (uint8_t[]){0, 0, 0}}, &err) == 0);
    CHECK(hm_kv_seq_copy(c, 0, 3, 4, &err) == HR_EINVAL && hm_kv_seq_copy(c, 0, 1, 17, &err) == HR_EINVAL);
    CHECK(hm_kv_seq_copy(c, 2, 1, 16, &err) == 0);
    free(lg);
    hm_ctx_free(c);
    p.n_seq = HM_MAX_SEQ + 1;
    CHECK(hm_ctx_create(m, &sh, &p, &err) == NULL);
    /* the estimates grow by one sequence's cache (every layer's K and V) and a counter per sequence */
    hm_ctx_params p1 = hm_ctx_default_params(), p4 = p1;
    p1.n_ctx = p4.n_ctx = 256, p4.n_seq = 4;
    const hm_hparams *hp = &m->hp;
    const uint64_t one = 2ull * hp->n_layer * 256 * hp->n_head_kv * hp->head_dim * 2 + 4;
    CHECK(hm_ctx_bytes_estimate(hp, &p4) - hm_ctx_bytes_estimate(hp, &p1) == 3 * one);
    CHECK(hm_ctx_bytes_for_shard(hp, &sh, &p4) - hm_ctx_bytes_for_shard(hp, &sh, &p1) == 3 * one);
    /* a batch never holds more tokens than the cache (hm_ctx_create clamps n_batch to n_ctx), so the estimate
       at n_batch > n_ctx is the one at n_batch = n_ctx, and it covers what the ctx takes */
    hm_ctx_params pb = p1, pc = p1;
    pb.n_ctx = pc.n_ctx = 64, pb.n_batch = 512, pc.n_batch = 64, pb.n_threads = pc.n_threads = 1;
    CHECK(hm_ctx_bytes_estimate(hp, &pb) == hm_ctx_bytes_estimate(hp, &pc));
    hm_ctx *cb = hm_ctx_create(m, &sh, &pb, &err);
    CHECK(cb != NULL && hm_ctx_bytes(cb) <= hm_ctx_bytes_estimate(hp, &pb));
    hm_ctx_free(cb);
    hm_model_free(m);
    gguf_close(g);
}

int main(int argc, char **argv) {
    bool reexec = argc < 2 || strcmp(argv[1], "--no-reexec") != 0;
    const char *shared = test_shared_dir();
    printf("test-batch (%s kernels)\n", hq_simd_name());
    test_kernel_columns();
    const char *models[] = {"models/stories260K.gguf",           "models/synth/synth-llama-Q4_0.gguf",
                            "models/synth/synth-llama-Q8_0.gguf", "models/synth/synth-llama-Q4_K_M-mix.gguf",
                            "models/synth/synth-llama-Q6_K.gguf", "models/synth/synth-llama-F16.gguf",
                            "models/synth/synth-qwen2-Q8_0.gguf", "models/synth/synth-qwen3-Q4_K_M-mix.gguf"};
    /* the other kernel tables (children): the first two models (F32, Q4_0); the portable table's
       forward passes under ThreadSanitizer took more than the test's 10 minutes on a loaded 2-core VM,
       and its threads do there what they do with the SIMD tables, so that child checks the kernels */
    size_t n_models = reexec ? HR_ARRAY_LEN(models) : 2;
#if defined(__SANITIZE_THREAD__)
    if (!strcmp(hq_simd_name(), "generic")) n_models = 0;
#endif
    for (size_t i = 0; i < n_models; i++) test_model(shared, models[i], true, HQ_TYPE_F16);
    if (reexec) {
        test_model(shared, "models/synth/synth-llama-Q4_K_M.gguf", false, HQ_TYPE_F16);
        test_model(shared, "models/synth/synth-qwen3-Q8_0.gguf", true, HQ_TYPE_F32);
    }
    test_bad(shared);
    if (reexec && !strcmp(hq_simd_name(), "avx512")) test_rerun_with(argv[0], "HEARTH_NO_AVX512");
    if (reexec && strcmp(hq_simd_name(), "generic")) test_rerun_with(argv[0], "HEARTH_NO_SIMD");
    return test_summary();
}
