// modules: base quant gguf model
/* test-model: the forward pass against llama.cpp's outputs in ../shared/reference.
 * - every synth model: logits at every position, relative RMS error and top-1 agreement;
 * - stories260K: logits (rel. RMS <= 1e-4) and the greedy continuations token for token;
 * - F32 vs F16 KV cache and batch vs token-by-token evaluation agree;
 * - hm_protect: the selected groups, their contribution and the mask (test_protect).
 * Tolerances are the issue's: F16/BF16 <= 0.005, quantized <= 0.03, top-1 >= 90%. */
#include "test.h"

#include "gguf/gguf.h"
#include "model/model.h"
#include "quant/quant.h"

#include <dirent.h>
#include <jansson.h>
#include <math.h>

typedef struct { double rel_rms; double top1; } cmp_result;

static cmp_result compare(const float *a, const float *ref, int n_tok, int n_vocab) {
    double num = 0, den = 0;
    int agree = 0;
    for (int t = 0; t < n_tok; t++) {
        const float *x = a + (size_t)t * n_vocab, *y = ref + (size_t)t * n_vocab;
        int ax = 0, ay = 0;
        for (int i = 0; i < n_vocab; i++) {
            double d = (double)x[i] - y[i];
            num += d * d;
            den += (double)y[i] * y[i];
            if (x[i] > x[ax]) ax = i;
            if (y[i] > y[ay]) ay = i;
        }
        agree += ax == ay;
    }
    cmp_result r = {sqrt(num / (den > 0 ? den : 1)), (double)agree / n_tok};
    return r;
}

/* loads MODEL, evaluates `tokens` in batches of n_batch (all logits) on n_threads (0: the default) */
static float *eval_threads(const char *path, const int32_t *tokens, int n, int kv_type, int n_batch, int n_threads,
                           int *n_vocab) {
    hr_err err = {0};
    gguf_ctx *g = gguf_open(path, &err);
    if (!g) { fprintf(stderr, "%s\n", err.msg); return NULL; }
    hm_model *m = hm_model_load(g, &err);
    if (!m) { fprintf(stderr, "%s\n", err.msg); gguf_close(g); return NULL; }
    hm_ctx_params p = hm_ctx_default_params();
    p.n_ctx = n;
    p.n_batch = n_batch;
    p.kv_type = kv_type;
    if (n_threads > 0) p.n_threads = n_threads;
    hm_shard sh = hm_shard_full(m);
    hm_ctx *c = hm_ctx_create(m, &sh, &p, &err);
    float *logits = NULL;
    if (c) {
        *n_vocab = m->hp.n_vocab;
        logits = malloc((size_t)n * m->hp.n_vocab * sizeof(float));
        for (int i = 0; i < n; i += n_batch) {
            int nb = HR_MIN(n_batch, n - i);
            const hm_batch b = {.tokens = tokens + i, .n = nb, .pos = i, .logits = logits + (size_t)i * m->hp.n_vocab,
                                .all_logits = true};
            if (hm_eval(c, &b, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                free(logits);
                logits = NULL;
                break;
            }
        }
    } else fprintf(stderr, "%s\n", err.msg);
    hm_ctx_free(c);
    hm_model_free(m);
    gguf_close(g);
    return logits;
}

static float *eval_all(const char *path, const int32_t *tokens, int n, int kv_type, int n_batch, int *n_vocab) {
    return eval_threads(path, tokens, n, kv_type, n_batch, 0, n_vocab);
}

static int32_t *json_ids(json_t *arr, int *n) {
    *n = (int)json_array_size(arr);
    int32_t *ids = malloc((size_t)(*n > 0 ? *n : 1) * sizeof *ids);
    for (int i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
    return ids;
}

static void test_synth(const char *shared) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/reference/synth", shared);
    DIR *d = opendir(dir);
    REQUIRE_VOID(d);
    struct dirent *e;
    int n_models = 0;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".json")) continue;
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(len - 5), e->d_name);
        json_error_t je;
        json_t *j = json_load_file(test_path(dir, e->d_name), 0, &je);
        CHECKF(j != NULL, "%s: %s", e->d_name, je.text);
        if (!j) continue;
        int n;
        int32_t *ids = json_ids(json_object_get(j, "tokens"), &n);
        int n_vocab_ref = (int)json_integer_value(json_object_get(j, "n_vocab"));
        char rel[8192];
        snprintf(rel, sizeof rel, "models/synth/%s.gguf", name);
        char model[4096]; /* test_path's buffers are reused */
        snprintf(model, sizeof model, "%s", test_path(shared, rel));
        /* the shared references, else the llama.cpp-made ones in tests/data/ref-synth (README there) */
        snprintf(rel, sizeof rel, "%s/%s.logits.f32", dir, name);
        size_t sz = 0;
        float *ref = test_read_file(rel, &sz);
        if (!ref) {
            const char *src = getenv("HEARTH_SRC");
            snprintf(rel, sizeof rel, "%s/tests/data/ref-synth/%s.logits.f32", src ? src : ".", name);
            ref = test_read_file(rel, &sz);
        }
        /* the prompt in one batch, then token by token (the decode's paths: its matmul jobs, the FFN
           activations converted unit by unit inside the gate/up job, its attention) */
        for (int pass = 0; pass < 2; pass++) {
            const int n_batch = pass == 0 ? n : 1;
            int n_vocab = 0;
            float *logits = eval_all(model, ids, n, HQ_TYPE_F16, n_batch, &n_vocab);
            CHECKF(logits && ref && n_vocab == n_vocab_ref && sz == (size_t)n * n_vocab * 4, "%s: eval or reference failed (logits %p ref %p n_vocab %d/%d size %zu)", name, (void *)logits, (void *)ref, n_vocab, n_vocab_ref, sz);
            if (logits && ref && n_vocab == n_vocab_ref && sz == (size_t)n * n_vocab * 4) {
                cmp_result r = compare(logits, ref, n, n_vocab);
                bool is_float = strstr(name, "F16") || strstr(name, "BF16");
                double tol = is_float ? 0.005 : 0.03;
                printf("%-28s %-7s rel_rms %.5f (tol %.3f)  top1 %.1f%%\n", name, pass ? "decode" : "batch", r.rel_rms, tol,
                       100 * r.top1);
                CHECKF(r.rel_rms <= tol, "%s (%s): relative RMS %.5f > %.3f", name, pass ? "decode" : "batch", r.rel_rms, tol);
                CHECKF(r.top1 >= 0.90, "%s (%s): top-1 agreement %.1f%% < 90%%", name, pass ? "decode" : "batch", 100 * r.top1);
            }
            free(logits);
        }
        n_models++;
        free(ref);
        free(ids);
        json_decref(j);
    }
    closedir(d);
    CHECKF(n_models >= 17, "only %d synth references found", n_models);
}

static void test_stories(const char *shared) {
    const char *model = test_path(shared, "models/stories260K.gguf");
    hr_err err = {0};
    for (int k = 1; k <= 16; k++) {
        char p[8192];
        snprintf(p, sizeof p, "%s/reference/stories260K/public-%d.json", shared, k);
        json_t *j = json_load_file(p, 0, NULL);
        if (!j) { CHECKF(k > 1, "no stories260K references"); break; }
        int n;
        int32_t *ids = json_ids(json_object_get(j, "tokens"), &n);
        int n_vocab = 0;
        float *logits = eval_all(model, ids, n, HQ_TYPE_F16, n, &n_vocab);
        snprintf(p, sizeof p, "%s/reference/stories260K/public-%d.logits.f32", shared, k);
        size_t sz;
        float *ref = test_read_file(p, &sz);
        CHECK(logits && ref && sz == (size_t)n * n_vocab * 4);
        if (logits && ref && sz == (size_t)n * n_vocab * 4) {
            cmp_result r = compare(logits, ref, n, n_vocab);
            printf("stories260K public-%d logits: rel_rms %.2e top1 %.1f%%\n", k, r.rel_rms, 100 * r.top1);
            CHECKF(r.rel_rms <= 1e-4, "public-%d: relative RMS %.2e > 1e-4", k, r.rel_rms);
            /* with an F32 cache, evaluating token by token, in batches of 7 or all at once uses the
               same arithmetic (the KV cache path): the logits must agree to float rounding */
            float *la = eval_all(model, ids, n, HQ_TYPE_F32, n, &n_vocab);
            float *l1 = eval_all(model, ids, n, HQ_TYPE_F32, 1, &n_vocab);
            float *l7 = eval_all(model, ids, n, HQ_TYPE_F32, 7, &n_vocab);
            CHECK(la && l1 && l7);
            if (la && l1 && l7) {
                cmp_result r1 = compare(l1, la, n, n_vocab), r7 = compare(l7, la, n, n_vocab);
                CHECKF(r1.rel_rms < 1e-5 && r7.rel_rms < 1e-5, "batching changes logits: %.2e %.2e", r1.rel_rms, r7.rel_rms);
                cmp_result rf = compare(la, ref, n, n_vocab);
                printf("stories260K public-%d F32 cache: rel_rms %.2e\n", k, rf.rel_rms);
                CHECKF(rf.rel_rms < 1e-3, "F32 KV cache: relative RMS %.2e", rf.rel_rms);
            }
            free(la);
            free(l1);
            free(l7);
        }
        free(logits);
        free(ref);
        free(ids);
        json_decref(j);

        /* greedy continuation, token by token, F16 KV cache as llama.cpp's default */
        snprintf(p, sizeof p, "%s/reference/stories260K/public-%d.gen.json", shared, k);
        j = json_load_file(p, 0, NULL);
        CHECK(j != NULL);
        if (!j) continue;
        int np, ng;
        int32_t *prompt = json_ids(json_object_get(j, "prompt_tokens"), &np);
        int32_t *gen = json_ids(json_object_get(j, "tokens"), &ng);
        gguf_ctx *g = gguf_open(model, &err);
        hm_model *m = g ? hm_model_load(g, &err) : NULL;
        hm_ctx_params cp = hm_ctx_default_params();
        cp.n_ctx = np + ng + 1;
        hm_shard sh = m ? hm_shard_full(m) : (hm_shard){0};
        hm_ctx *c = m ? hm_ctx_create(m, &sh, &cp, &err) : NULL;
        REQUIRE_VOID(c);
        float *lg = malloc((size_t)m->hp.n_vocab * sizeof(float));
        int rc = hm_eval(c, &(hm_batch){.tokens = prompt, .n = np, .logits = lg}, &err);
        int match = 0;
        for (int i = 0; i < ng && rc == 0; i++) {
            int best = 0;
            for (int v = 1; v < m->hp.n_vocab; v++) if (lg[v] > lg[best]) best = v;
            if (best != gen[i]) break;
            match++;
            if (i + 1 < ng) rc = hm_eval(c, &(hm_batch){.tokens = &best, .n = 1, .pos = np + i, .logits = lg}, &err);
        }
        printf("stories260K public-%d greedy: %d/%d tokens match\n", k, match, ng);
        CHECKF(match == ng, "public-%d: greedy continuation diverges at token %d", k, match);
        free(lg);
        free(prompt);
        free(gen);
        hm_ctx_free(c);
        hm_model_free(m);
        gguf_close(g);
        json_decref(j);
    }
}

static void test_bad_inputs(const char *shared) {
    hr_err err = {0};
    gguf_ctx *g = gguf_open(test_path(shared, "models/stories260K.gguf"), &err);
    REQUIRE_VOID(g);
    hm_model *m = hm_model_load(g, &err);
    REQUIRE_VOID(m);
    hm_ctx_params p = hm_ctx_default_params();
    p.n_ctx = 8;
    p.n_batch = 4;
    hm_shard sh = hm_shard_full(m);
    hm_ctx *c = hm_ctx_create(m, &sh, &p, &err);
    REQUIRE_VOID(c);
    float *lg = malloc((size_t)m->hp.n_vocab * sizeof(float));
    int32_t bad = m->hp.n_vocab, ok[5] = {1, 2, 3, 4, 5};
    CHECK(hm_eval(c, &(hm_batch){.tokens = &bad, .n = 1, .logits = lg}, &err) == HR_EINVAL && err.msg[0]);
    CHECK(hm_eval(c, &(hm_batch){.tokens = ok, .n = 5, .logits = lg}, &err) == HR_EINVAL);   /* > n_batch */
    CHECK(hm_eval(c, &(hm_batch){.tokens = ok, .n = 2, .pos = 7, .logits = lg}, &err) == HR_ERANGE);   /* past n_ctx */
    CHECK(hm_eval(c, &(hm_batch){.tokens = ok, .n = 2, .pos = 6, .logits = lg}, &err) == 0);
    free(lg);
    hm_ctx_free(c);
    hm_model_free(m);
    gguf_close(g);
}

/* Decode hands out each matmul's rows at run time (a thread that finishes its share takes the rest of
   another's), so which thread computes which rows changes from token to token; a row's result must
   not.  Token-by-token logits on 1, 3 and 8 threads (8 on fewer cores: threads are descheduled
   mid-job, so shares are taken over) must be the same bits; a row computed twice (the FFN gate applied
   twice) or never (a stale row from the previous token) would show. */
static void test_decode_threads(const char *shared) {
    const char *models[] = {"models/synth/synth-llama-Q4_0.gguf", "models/synth/synth-llama-Q4_K_M-mix.gguf",
                            "models/synth/synth-qwen2-Q8_0.gguf"};
    int32_t ids[24];
    for (int i = 0; i < 24; i++) ids[i] = (int32_t)(1 + (i * 37) % 250);
    for (size_t k = 0; k < HR_ARRAY_LEN(models); k++) {
        int nv = 0;
        float *l1 = eval_threads(test_path(shared, models[k]), ids, 24, HQ_TYPE_F16, 1, 1, &nv);
        for (int nt = 3; nt <= 8; nt += 5) {
            float *ln = eval_threads(test_path(shared, models[k]), ids, 24, HQ_TYPE_F16, 1, nt, &nv);
            CHECK(l1 && ln);
            if (l1 && ln)
                CHECKF(!memcmp(l1, ln, (size_t)24 * nv * sizeof(float)), "%s: decode on %d threads differs from 1 thread",
                       models[k], nt);
            free(ln);
        }
        free(l1);
    }
}

/* The output head computed in parts (hm_output_parts, each its own block for the residency manager) against a
   plain reference: the hidden states the forward pass hands out (embd_out) normalized and multiplied by every
   row of the head in double, for a batch of 7 tokens (logits of all of them: parts write column ranges of
   each token's row) and a decode step, from the file's layout and from the packed copy. A part computed from
   the wrong rows or written to the wrong columns is off by the logits' own size; the kernels' quantized
   activations by ~1%. */
static void test_output_parts(const char *shared) {
    const char *path = test_path(shared, "models/llama-2-tiny-random.gguf");
    for (int repack = 0; repack <= 1; repack++) {
        hr_err err = {0};
        gguf_ctx *g = gguf_open(path, &err);
        hm_model *m = g ? hm_model_load(g, &err) : NULL;
        hm_shard sh = m ? hm_shard_full(m) : (hm_shard){0};
        uint64_t copied = 0, packed = 0;
        if (m && repack && hm_model_load_weights(m, &sh, true, &copied, &packed, &err)) hm_model_free(m), m = NULL;
        if (!m) { fprintf(stderr, "%s: %s\n", path, err.msg); CHECK(0); gguf_close(g); return; }
        CHECKF(hm_output_parts(m) > 1, "%s: the output head in %d part(s): the test needs several", path,
               hm_output_parts(m));
        hm_ctx_params p = hm_ctx_default_params();
        p.n_ctx = 16;
        p.n_threads = 2;
        hm_ctx *c = hm_ctx_create(m, &sh, &p, &err);
        const int V = m->hp.n_vocab, E = m->hp.n_embd, N = 7;
        float *lg = malloc(sizeof(float) * (size_t)(N + 1) * V), *x = malloc(sizeof(float) * (size_t)(N + 1) * E);
        float *row = malloc(sizeof(float) * (size_t)E), *xn = malloc(sizeof(float) * (size_t)E);
        int32_t tok[N + 1];
        for (int i = 0; i <= N; i++) tok[i] = (int32_t)(1 + (i * 131) % (V - 1));
        REQUIRE_VOID(c && lg && x && row && xn);
        const hm_batch b = {.tokens = tok, .n = N, .pos = 0, .logits = lg, .all_logits = true, .embd_out = x};
        const hm_batch d = {.tokens = tok + N, .n = 1, .pos = N, .logits = lg + (size_t)N * V, .embd_out = x + (size_t)N * E};
        CHECKF(!hm_eval(c, &b, &err) && !hm_eval(c, &d, &err), "%s", err.msg);
        double num = 0, den = 0;
        int agree = 0;
        for (int t = 0; t <= N; t++) {
            double ss = 0;
            for (int e = 0; e < E; e++) ss += (double)x[(size_t)t * E + e] * x[(size_t)t * E + e];
            const double inv = 1.0 / sqrt(ss / E + m->hp.rms_eps);
            for (int e = 0; e < E; e++) xn[e] = (float)(x[(size_t)t * E + e] * inv * ((const float *)m->output_norm.data)[e]);
            int best = 0, best_ref = 0;
            double best_v = -INFINITY;
            for (int r = 0; r < V; r++) {
                hm_tensor_row_f32(&m->output, r, row);
                double ref = 0;
                for (int e = 0; e < E; e++) ref += (double)row[e] * xn[e];
                const double got = lg[(size_t)t * V + r], dv = got - ref;
                num += dv * dv;
                den += ref * ref;
                if (ref > best_v) best_v = ref, best_ref = r;
                if (got > lg[(size_t)t * V + best]) best = r;
            }
            agree += best == best_ref;
        }
        const double rel = sqrt(num / HR_MAX(den, 1e-30));
        CHECKF(rel < 0.03 && agree >= N, "%s%s: the parted output head's logits, rel. RMS %.4f against the plain "
               "product, top-1 %d of %d", path, repack ? " (packed)" : "", rel, agree, N + 1);
        printf("output head in %d parts%s: rel. RMS %.5f against the plain product, top-1 %d of %d\n",
               hm_output_parts(m), repack ? " (packed)" : "", rel, agree, N + 1);
        free(lg), free(x), free(row), free(xn);
        hm_ctx_free(c);
        hm_model_free(m);
        gguf_close(g);
    }
}

/* hm_protect (the lossy all-reduce's protected groups, docs/lossy.md) on stories260K (F32): a share of 88
   neurons in a gathered order, groups of 4. At full rank the predictor's activations are exact, so it selects
   the groups whose sum of (activation x down column norm)^2 is largest; the head's contribution is those
   groups' part of the FFN output; the worker's mask zeroes exactly them; head and worker select alike. */
static void test_protect(const char *shared) {
    const char *path = test_path(shared, "models/stories260K.gguf");
    hr_err err = {0};
    gguf_ctx *g = gguf_open(path, &err);
    hm_model *m = g ? hm_model_load(g, &err) : NULL;
    if (!m) { fprintf(stderr, "%s: %s\n", path, err.msg); CHECK(0); gguf_close(g); return; }
    enum { Fs = 88, G = 4, NP = 3 };
    const int E = m->hp.n_embd, F = m->hp.n_ff, L = m->hp.n_layer;
    int32_t *nr = malloc(sizeof *nr * (size_t)L * Fs);
    float *gr = malloc(sizeof(float) * E), *ur = malloc(sizeof(float) * E), *dr = malloc(sizeof(float) * F);
    float *a = malloc(sizeof(float) * Fs), *xn = malloc(sizeof(float) * E), *o = malloc(sizeof(float) * E);
    double *ref = malloc(sizeof(double) * E), *dn = malloc(sizeof(double) * Fs), score[22];
    REQUIRE_VOID(nr && gr && ur && dr && a && xn && o && ref && dn && F >= 170 && E == 64);
    for (int il = 0; il < L; il++)
        for (int j = 0; j < Fs; j++) nr[(size_t)il * Fs + j] = 150 - (j * 7) % 151; /* distinct: 7 and 151 coprime */
    hm_protect_params pp = {.n_ff = Fs, .group = G, .rank = E, .n_protect = NP, .neuron = nr, .head = true};
    hm_protect *ph = hm_protect_create(m, &pp, &err);
    pp.head = false;
    hm_protect *pw = hm_protect_create(m, &pp, &err);
    REQUIRE_VOID(ph && pw);
    CHECK(hm_protect_count(ph) == NP && hm_protect_bytes(ph) > hm_protect_bytes(pw));
    uint64_t z = 12345;
    int exact = 0, tries = 0;
    for (int il = 1; il < L; il++)
        for (int rep = 0; rep < 4; rep++, tries++) {
            for (int e = 0; e < E; e++) {
                z = z * 6364136223846793005ull + 1442695040888963407ull;
                xn[e] = (float)((double)(z >> 11) * 0x1.0p-53 * 2 - 1);
            }
            const hm_layer *ly = &m->layers[il];
            for (int j = 0; j < Fs; j++) {
                const int r = nr[(size_t)il * Fs + j];
                hm_tensor_row_f32(&ly->w_gate, r, gr);
                hm_tensor_row_f32(&ly->w_up, r, ur);
                double gs = 0, us = 0;
                for (int e = 0; e < E; e++) gs += (double)gr[e] * xn[e], us += (double)ur[e] * xn[e];
                a[j] = (float)(gs / (1 + exp(-gs)) * us);
                dn[j] = 0;
            }
            for (int e = 0; e < E; e++) {
                hm_tensor_row_f32(&ly->w_down, e, dr);
                for (int j = 0; j < Fs; j++) dn[j] += (double)dr[nr[(size_t)il * Fs + j]] * dr[nr[(size_t)il * Fs + j]];
            }
            for (int gi = 0; gi < Fs / G; gi++) {
                score[gi] = 0;
                for (int j = gi * G; j < gi * G + G; j++) score[gi] += (double)a[j] * a[j] * dn[j];
            }
            int32_t sh[NP], sw[NP];
            hm_protect_select(ph, il, xn, sh);
            hm_protect_select(pw, il, xn, sw);
            CHECK(!memcmp(sh, sw, sizeof sh));
            CHECK(sh[0] < sh[1] && sh[1] < sh[2]);
            /* the selection is the exact top 3 (a near tie may swap the last one) */
            int top[NP] = {-1, -1, -1};
            for (int k = 0; k < NP; k++)
                for (int gi = 0; gi < Fs / G; gi++) {
                    bool used = false;
                    for (int q = 0; q < k; q++) used |= top[q] == gi;
                    if (!used && (top[k] < 0 || score[gi] > score[top[k]])) top[k] = gi;
                }
            int hit = 0;
            for (int k = 0; k < NP; k++)
                for (int q = 0; q < NP; q++) hit += sh[q] == top[k];
            exact += hit == NP;
            CHECKF(hit >= NP - 1, "layer %d: selected %d %d %d, largest %d %d %d", il, sh[0], sh[1], sh[2], top[0], top[1],
                   top[2]);
            /* the head's contribution: the selected groups' part of ffn_down times the activations */
            for (int e = 0; e < E; e++) {
                hm_tensor_row_f32(&ly->w_down, e, dr);
                ref[e] = 0;
                for (int k = 0; k < NP; k++)
                    for (int j = sh[k] * G; j < sh[k] * G + G; j++) ref[e] += (double)dr[nr[(size_t)il * Fs + j]] * a[j];
                o[e] = 1;
            }
            hm_protect_add(ph, il, xn, sh, o);
            double num = 0, den = 0;
            for (int e = 0; e < E; e++) num += (o[e] - 1 - ref[e]) * (o[e] - 1 - ref[e]), den += ref[e] * ref[e];
            CHECKF(den > 0 && num <= 1e-10 * den, "layer %d: contribution rel. error %g", il, sqrt(num / den));
            /* the worker's mask: exactly the selected groups' activations zeroed */
            memcpy(dr, a, sizeof(float) * Fs);
            hm_protect_mask(pw, sh, dr);
            int wrong = 0;
            for (int j = 0; j < Fs; j++) {
                const int gi = j / G;
                const bool sel = gi == sh[0] || gi == sh[1] || gi == sh[2];
                wrong += sel ? dr[j] != 0 : dr[j] != a[j];
            }
            CHECK(wrong == 0);
        }
    CHECKF(exact >= tries * 3 / 4, "the exact top groups selected in %d of %d", exact, tries);
    hm_protect_free(ph);
    hm_protect_free(pw);
    /* impossible settings: a clear error, nothing made */
    const hm_protect_params bad[] = {
        {.n_ff = Fs, .group = G, .rank = E, .n_protect = 0, .neuron = nr},
        {.n_ff = Fs, .group = G, .rank = E, .n_protect = Fs / G + 1, .neuron = nr},
        {.n_ff = Fs, .group = G, .rank = 0, .n_protect = 1, .neuron = nr},
        {.n_ff = Fs, .group = G, .rank = E + 1, .n_protect = 1, .neuron = nr},
        {.n_ff = Fs, .group = 0, .rank = E, .n_protect = 1, .neuron = nr},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err = (hr_err){0};
        CHECK(!hm_protect_create(m, &bad[i], &err) && err.code == HR_EINVAL && err.msg[0]);
    }
    nr[5] = F; /* a neuron outside the model */
    err = (hr_err){0};
    CHECK(!hm_protect_create(m, &(hm_protect_params){.n_ff = Fs, .group = G, .rank = 8, .n_protect = 1, .neuron = nr}, &err) &&
          err.msg[0]);
    free(nr), free(gr), free(ur), free(dr), free(a), free(xn), free(o), free(ref), free(dn);
    hm_model_free(m);
    gguf_close(g);
}

int main(void) {
    hr_init();
    const char *shared = test_shared_dir();
    printf("kernels: %s\n", hq_simd_name());
    test_bad_inputs(shared);
    test_stories(shared);
    test_synth(shared);
    test_decode_threads(shared);
    test_output_parts(shared);
    test_protect(shared);
    return test_summary();
}
