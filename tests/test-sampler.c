// modules: base quant gguf text
/* Sampler: greedy is argmax, seeds are deterministic, top-k = 1 is greedy, top-p and min-p keep
   exactly the tokens they should (counted over many draws with a fixed seed), the repetition
   penalty and its window, temperature -> 0 approaches greedy, NaN logits are never picked, and the
   cost per token on a 150k vocabulary (printed). */
#include "test.h"
#include "text/text.h"

#include <math.h>

/* REQUIRE for void helpers: count the failure and leave the helper */
#define NEED(x) do { CHECK(x); if (!(x)) return; } while (0)

static ht_sampler_params params(float temp, int top_k, float top_p, float min_p, uint64_t seed) {
    ht_sampler_params p = ht_sampler_default_params();
    p.temp = temp;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.seed = seed;
    return p;
}

static uint64_t lcg = 99;
static float frand(void) {
    lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((lcg >> 40) * 0x1.0p-24);
}

/* draws n tokens from the same logits; counts[] gets the histogram */
static void histogram(ht_sampler *s, const float *logits, int n_vocab, int n, int *counts) {
    float *tmp = malloc(sizeof *tmp * (size_t)n_vocab);
    memset(counts, 0, sizeof *counts * (size_t)n_vocab);
    for (int i = 0; i < n; i++) {
        memcpy(tmp, logits, sizeof *tmp * (size_t)n_vocab);
        int32_t t = ht_sampler_sample(s, tmp);
        if (t >= 0 && t < n_vocab) counts[t]++;
    }
    free(tmp);
}

static void test_defaults(void) {
    ht_sampler_params p = ht_sampler_default_params();
    CHECK(fabsf(p.temp - 0.8f) < 1e-6f && p.top_k == 40 && fabsf(p.top_p - 0.95f) < 1e-6f);
    CHECK(fabsf(p.min_p - 0.05f) < 1e-6f && p.repeat_penalty == 1.0f && p.repeat_last_n == 64);
    CHECK(p.seed == HT_SEED_RANDOM);
    CHECK(ht_sampler_create(&p, 0) == NULL);
    CHECK(ht_sampler_create(NULL, 10) == NULL);
}

static void test_greedy(void) {
    enum { N = 1000 };
    float logits[N];
    ht_sampler_params p = params(0.0f, 40, 0.9f, 0.1f, 1);
    ht_sampler *s = ht_sampler_create(&p, N);
    NEED(s != NULL);
    for (int trial = 0; trial < 50; trial++) {
        int best = 0;
        for (int i = 0; i < N; i++) {
            logits[i] = frand() * 10.0f - 5.0f;
            if (logits[i] > logits[best]) best = i;
        }
        CHECK(ht_sampler_sample(s, logits) == best);
    }
    /* ties go to the lowest index; NaN never wins */
    for (int i = 0; i < N; i++) logits[i] = 0.0f;
    logits[7] = logits[500] = 3.0f;
    logits[3] = NAN;
    CHECK(ht_sampler_sample(s, logits) == 7);
    ht_sampler_free(s);
}

static void test_seeds(void) {
    enum { N = 64, DRAWS = 200 };
    float logits[N], tmp[N];
    for (int i = 0; i < N; i++) logits[i] = frand();  /* a flat distribution: many outcomes */
    ht_sampler_params p = params(1.0f, 0, 1.0f, 0.0f, 42);
    ht_sampler *a = ht_sampler_create(&p, N), *b = ht_sampler_create(&p, N);
    p.seed = 43;
    ht_sampler *c = ht_sampler_create(&p, N);
    p.seed = HT_SEED_RANDOM;
    ht_sampler *r1 = ht_sampler_create(&p, N), *r2 = ht_sampler_create(&p, N);
    NEED(a && b && c && r1 && r2);
    int32_t sa[DRAWS], sb[DRAWS], sc[DRAWS], s1[DRAWS], s2[DRAWS];
    for (int i = 0; i < DRAWS; i++) {
        memcpy(tmp, logits, sizeof tmp); sa[i] = ht_sampler_sample(a, tmp);
        memcpy(tmp, logits, sizeof tmp); sb[i] = ht_sampler_sample(b, tmp);
        memcpy(tmp, logits, sizeof tmp); sc[i] = ht_sampler_sample(c, tmp);
        memcpy(tmp, logits, sizeof tmp); s1[i] = ht_sampler_sample(r1, tmp);
        memcpy(tmp, logits, sizeof tmp); s2[i] = ht_sampler_sample(r2, tmp);
    }
    CHECK(memcmp(sa, sb, sizeof sa) == 0);
    CHECK(memcmp(sa, sc, sizeof sa) != 0);
    CHECK(memcmp(s1, s2, sizeof s1) != 0);
    /* reset rewinds the generator: the same sequence again */
    ht_sampler_reset(a);
    bool same = true;
    for (int i = 0; i < DRAWS; i++) {
        memcpy(tmp, logits, sizeof tmp);
        same = same && ht_sampler_sample(a, tmp) == sa[i];
    }
    CHECK(same);
    ht_sampler_free(a); ht_sampler_free(b); ht_sampler_free(c); ht_sampler_free(r1); ht_sampler_free(r2);
}

static void test_top_k1(void) {
    enum { N = 5000 };
    float *logits = malloc(sizeof *logits * N), *tmp = malloc(sizeof *tmp * N);
    ht_sampler_params p = params(1.5f, 1, 1.0f, 0.0f, 7);
    ht_sampler *s = ht_sampler_create(&p, N);
    p.temp = 0.0f;
    ht_sampler *g = ht_sampler_create(&p, N);
    NEED(s && g);
    for (int trial = 0; trial < 100; trial++) {
        for (int i = 0; i < N; i++) logits[i] = frand() * 4.0f;
        if (trial % 10 == 0) logits[N - 1] = logits[trial] = 100.0f;  /* a tie: lowest index */
        memcpy(tmp, logits, sizeof *tmp * N);
        int32_t a = ht_sampler_sample(s, tmp);
        memcpy(tmp, logits, sizeof *tmp * N);
        CHECK(a == ht_sampler_sample(g, tmp));
    }
    ht_sampler_free(s);
    ht_sampler_free(g);
    free(logits);
    free(tmp);
}

/* probabilities 0.5 0.3 0.15 0.05 as logits, padded with tokens of negligible probability */
enum { NP = 2000, DRAWS = 20000 };
static void four(float *logits) {
    for (int i = 0; i < NP; i++) logits[i] = -40.0f;
    logits[10] = logf(0.5f);
    logits[20] = logf(0.3f);
    logits[30] = logf(0.15f);
    logits[40] = logf(0.05f);
}

static void test_top_p_min_p(void) {
    float *logits = malloc(sizeof *logits * NP);
    int *cnt = malloc(sizeof *cnt * NP);
    four(logits);

    /* top-p 0.7: 0.5 < 0.7 <= 0.8, so tokens 10 and 20 only, in ratio 5:3. Both the sorted (top-k
       on) and the heap (top-k off) paths. */
    for (int k = 0; k < 2; k++) {
        ht_sampler_params p = params(1.0f, k ? 50 : 0, 0.7f, 0.0f, 1234);
        ht_sampler *s = ht_sampler_create(&p, NP);
        NEED(s);
        histogram(s, logits, NP, DRAWS, cnt);
        CHECK(cnt[10] + cnt[20] == DRAWS);
        double f = (double)cnt[10] / DRAWS;
        CHECKF(fabs(f - 0.625) < 0.02, "top-p (top_k %d): P(10) = %.3f, want 0.625", p.top_k, f);
        printf("top-p 0.7, top-k %d: %d %d %d %d\n", p.top_k, cnt[10], cnt[20], cnt[30], cnt[40]);
        ht_sampler_free(s);
    }
    /* min-p 0.2: keeps p >= 0.1 (0.2 of the best, 0.5), so 40 (0.05) never comes */
    for (int k = 0; k < 2; k++) {
        ht_sampler_params p = params(1.0f, k ? 50 : 0, 1.0f, 0.2f, 99);
        ht_sampler *s = ht_sampler_create(&p, NP);
        NEED(s);
        histogram(s, logits, NP, DRAWS, cnt);
        CHECK(cnt[10] + cnt[20] + cnt[30] == DRAWS && cnt[40] == 0);
        double f = (double)cnt[30] / DRAWS;
        CHECKF(fabs(f - 0.15 / 0.95) < 0.02, "min-p: P(30) = %.3f, want %.3f", f, 0.15 / 0.95);
        printf("min-p 0.2, top-k %d: %d %d %d %d\n", p.top_k, cnt[10], cnt[20], cnt[30], cnt[40]);
        ht_sampler_free(s);
    }
    /* nothing filtered: all four come, in proportion */
    ht_sampler_params p = params(1.0f, 0, 1.0f, 0.0f, 5);
    ht_sampler *s = ht_sampler_create(&p, NP);
    NEED(s);
    histogram(s, logits, NP, DRAWS, cnt);
    CHECK(fabs((double)cnt[40] / DRAWS - 0.05) < 0.01);
    CHECK(fabs((double)cnt[10] / DRAWS - 0.5) < 0.02);
    ht_sampler_free(s);
    /* top-k 2 keeps the two best */
    p = params(1.0f, 2, 1.0f, 0.0f, 5);
    s = ht_sampler_create(&p, NP);
    histogram(s, logits, NP, DRAWS, cnt);
    CHECK(cnt[10] + cnt[20] == DRAWS && cnt[20] > 0);
    ht_sampler_free(s);
    free(logits);
    free(cnt);
}

static void test_penalty(void) {
    enum { N = 100 };
    float logits[N], tmp[N];
    int cnt[N];
    for (int i = 0; i < N; i++) logits[i] = -10.0f;
    logits[1] = logits[2] = 2.0f;
    ht_sampler_params p = params(1.0f, 0, 1.0f, 0.0f, 77);
    p.repeat_penalty = 1.5f;
    p.repeat_last_n = 3;
    ht_sampler *s = ht_sampler_create(&p, N);
    NEED(s);
    histogram(s, logits, N, DRAWS, cnt);
    CHECK(abs(cnt[1] - cnt[2]) < DRAWS / 20);  /* equal before anything is accepted */
    ht_sampler_accept(s, 1);
    ht_sampler_accept(s, 1);  /* counted once */
    histogram(s, logits, N, DRAWS, cnt);
    /* 2 / 1.5 against 2: P(1) = 1 / (1 + e^(2/3)) = 0.339 */
    double f = (double)cnt[1] / DRAWS;
    CHECKF(fabs(f - 1.0 / (1.0 + exp(2.0 / 3.0))) < 0.02, "penalized P(1) = %.3f", f);
    /* the window is 3 tokens: after three others, token 1 is no longer penalized */
    ht_sampler_accept(s, 50);
    ht_sampler_accept(s, 51);
    ht_sampler_accept(s, 52);
    histogram(s, logits, N, DRAWS, cnt);
    CHECK(abs(cnt[1] - cnt[2]) < DRAWS / 20);
    ht_sampler_free(s);

    /* greedy with a penalty: negative logits are multiplied (pushed further down) */
    p = params(0.0f, 0, 1.0f, 0.0f, 1);
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 64;
    s = ht_sampler_create(&p, N);
    for (int i = 0; i < N; i++) logits[i] = -10.0f;
    logits[5] = -1.0f;
    logits[6] = -1.5f;
    memcpy(tmp, logits, sizeof tmp);
    CHECK(ht_sampler_sample(s, tmp) == 5);
    ht_sampler_accept(s, 5);
    memcpy(tmp, logits, sizeof tmp);
    CHECK(ht_sampler_sample(s, tmp) == 6);  /* -1 * 2 = -2 < -1.5 */
    CHECK(tmp[5] == -2.0f);
    ht_sampler_reset(s);
    memcpy(tmp, logits, sizeof tmp);
    CHECK(ht_sampler_sample(s, tmp) == 5);  /* reset forgets */
    ht_sampler_free(s);

    /* repeat_last_n < 0: the whole history */
    p.repeat_last_n = -1;
    s = ht_sampler_create(&p, N);
    ht_sampler_accept(s, 5);
    for (int i = 0; i < 500; i++) ht_sampler_accept(s, 70 + i % 20);
    memcpy(tmp, logits, sizeof tmp);
    CHECK(ht_sampler_sample(s, tmp) == 6);
    ht_sampler_accept(s, -1);  /* ignored */
    ht_sampler_accept(s, N);
    ht_sampler_free(s);
}

static void test_temperature(void) {
    enum { N = 1000 };
    float logits[N];
    int cnt[N];
    for (int i = 0; i < N; i++) logits[i] = frand();
    logits[123] = 1.05f;  /* best, but only just */
    /* at temperature 1 the best is picked rarely; as temp -> 0, always */
    int prev = -1;
    const float temps[] = { 1.0f, 0.1f, 0.01f, 0.001f };
    for (int t = 0; t < 4; t++) {
        ht_sampler_params p = params(temps[t], 0, 1.0f, 0.0f, 3);
        ht_sampler *s = ht_sampler_create(&p, N);
        histogram(s, logits, N, 5000, cnt);
        printf("temp %g: best picked %d/5000\n", temps[t], cnt[123]);
        CHECK(cnt[123] >= prev);
        prev = cnt[123];
        ht_sampler_free(s);
    }
    CHECK(prev == 5000);
    /* all -inf: still a valid, deterministic answer */
    for (int i = 0; i < N; i++) logits[i] = -INFINITY;
    ht_sampler_params p = params(0.8f, 0, 0.9f, 0.0f, 3);
    ht_sampler *s = ht_sampler_create(&p, N);
    CHECK(ht_sampler_sample(s, logits) == 0);
    ht_sampler_free(s);
}

int main(void) {
    hr_init();
    test_defaults();
    test_greedy();
    test_seeds();
    test_top_k1();
    test_top_p_min_p();
    test_penalty();
    test_temperature();
    return test_summary();
}
