// modules: base quant
/* test-quant — the float types and the 32-element quants: reference (de)quantizers (byte layout and
   error bounds), and every dispatched kernel (vec_dot, from_float, gemm) against its reference.
   Without HEARTH_NO_SIMD it runs itself once more with HEARTH_NO_SIMD=1, so the generic table is
   tested too.  Flag: --no-reexec (tests/test-arm-build.sh uses it under qemu).  tools/kbench
   measures the kernels' speed. */
#include "test.h"

#include "quant/quant-impl.h"

#include <math.h>

/* REQUIRE for functions that return nothing */
#define REQUIRE_V(x) do { if (!(x)) { fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #x); \
    test_n_fail++; return; } } while (0)

/* ---- data ------------------------------------------------------------------------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t rng_next(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static float rng_uniform(float lo, float hi) { return lo + (hi - lo) * (float)(rng_next() >> 40) * 0x1p-24f; }

static void fill_uniform(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = rng_uniform(-1.0f, 1.0f);
}

static const int my_types[] = {HQ_TYPE_F32, HQ_TYPE_F16, HQ_TYPE_BF16, HQ_TYPE_Q4_0, HQ_TYPE_Q4_1,
                               HQ_TYPE_Q5_0, HQ_TYPE_Q5_1, HQ_TYPE_Q8_0, HQ_TYPE_Q8_1};

/* Relative RMS error of quantize -> dequantize on data uniform in [-1, 1] (the per-block scales of
   test_roundtrip are divided out).  With a uniform step h the error is uniform in [-h/2, h/2], RMS
   h/sqrt(12), against the data's RMS 1/sqrt(3): ratio h/2.  Blocks of 32 have amax ~ 32/33 and
   range max-min ~ 2*31/33:
     Q8_0/Q8_1 h = amax/127 -> 0.38%     Q5_1 h = range/31 -> 2.9%     Q4_1 h = range/15 -> 6.1%
     Q5_0 h = amax/16, Q4_0 h = amax/8 -> 3.0%, 6.1%, plus the clamp: the side opposite the
       largest magnitude has one step less (codes -8..7), so values in its last half step are off
       by up to h -> 3.1%, 6.5%
     F16/BF16: RMS half-ulp of an 11/8-bit significand over data uniform in [0, s], averaged over
       log-uniform s -> 0.0207% / 0.166%
   Each was also checked by a direct simulation; the bounds are those values plus ~5% (64K
   samples: the estimate's own spread is ~0.5%). */
static double rms_bound(int t) {
    switch (t) {
    case HQ_TYPE_F32:  return 0.0;
    case HQ_TYPE_F16:  return 0.00022;
    case HQ_TYPE_BF16: return 0.00175;
    case HQ_TYPE_Q4_0: return 0.068;
    case HQ_TYPE_Q4_1: return 0.064;
    case HQ_TYPE_Q5_0: return 0.033;
    case HQ_TYPE_Q5_1: return 0.031;
    case HQ_TYPE_Q8_0:
    case HQ_TYPE_Q8_1: return 0.00395;
    }
    return 1.0;
}

static bool is_simd_disabled(void) {
    const char *e = getenv("HEARTH_NO_SIMD");
    return e && *e && strcmp(e, "0") != 0;
}

/* ---- byte layouts: blocks quantized by hand ------------------------------------------------------- */

static void test_layout(void) {
    const hq_traits *tr = hq_get_traits(HQ_TYPE_Q4_0);
    REQUIRE_V(tr != NULL);
    CHECK(tr->blck_size == 32 && tr->type_size == 18);
    CHECK(hq_get_traits(HQ_TYPE_Q4_1)->type_size == 20);
    CHECK(hq_get_traits(HQ_TYPE_Q5_0)->type_size == 22);
    CHECK(hq_get_traits(HQ_TYPE_Q5_1)->type_size == 24);
    CHECK(hq_get_traits(HQ_TYPE_Q8_0)->type_size == 34);
    CHECK(hq_get_traits(HQ_TYPE_Q8_1)->type_size == 36);
    CHECK(hq_get_traits(HQ_TYPE_F16)->type_size == 2 && hq_get_traits(HQ_TYPE_F16)->blck_size == 1);
    CHECK(hq_get_traits(HQ_TYPE_BF16)->type_size == 2);
    CHECK(hq_row_size(HQ_TYPE_Q4_0, 4096) == 128 * 18);
    CHECK(hq_row_size(HQ_TYPE_Q4_0, 4095) == 0);

    /* Q4_0, block 1: elements 0..15 are (j-8)/2, elements 16..31 are (7-j)/2. The value of largest
       magnitude is -4 (first at element 0), so d = -4/-8 = 0.5 and q = x/0.5 + 8: element j -> j,
       element 16+j -> 15-j; byte j = j | (15-j) << 4.  Block 2: zeros but +4 at 5 and -1 at 20:
       d = 4/-8 = -0.5, q(4) = 0, q(0) = 8, q(-1) = 10. */
    float x[64] = {0};
    for (int j = 0; j < 16; j++) {
        x[j] = (float)(j - 8) * 0.5f;
        x[16 + j] = (float)(7 - j) * 0.5f;
    }
    x[32 + 5] = 4.0f;
    x[32 + 20] = -1.0f;
    uint8_t q4[2 * 18];
    hq_quantize_ref_q4_0(x, q4, 64);
    uint8_t want4[2 * 18];
    want4[0] = 0x00, want4[1] = 0x38; /* fp16 0.5, little-endian */
    for (int j = 0; j < 16; j++) want4[2 + j] = (uint8_t)(j | (15 - j) << 4);
    want4[18] = 0x00, want4[19] = 0xB8; /* fp16 -0.5 */
    memset(want4 + 20, 0x88, 16);
    want4[20 + 5] = 0x80; /* element 5 low (0), element 21 high (8) */
    want4[20 + 4] = 0xA8; /* element 4 low (8), element 20 high (10) */
    CHECK(memcmp(q4, want4, sizeof want4) == 0);
    float back[64];
    hq_dequantize_ref_q4_0(q4, back, 64);
    CHECK(memcmp(back, x, 32 * sizeof(float)) == 0); /* block 1 is exactly representable */
    CHECK(back[32 + 5] == 4.0f && back[32 + 20] == -1.0f && back[32] == 0.0f);

    /* Q8_0: amax 7.9375 = 127/16, so d = 1/16 exactly (fp16 0x2C00) and x/d = 16x.  The codes test
       roundf's half-away-from-zero: 0.5 -> 1, -0.5 -> -1, 1.5 -> 2. */
    float y[32];
    for (int j = 0; j < 32; j++) y[j] = (float)(j - 16) * 0.25f; /* q = 4(j-16) */
    const float special[8] = {-7.9375f, 7.9375f, 0.03f, 0.032f, -0.032f, 0.03125f, -0.03125f, 0.09375f};
    const int8_t special_q[8] = {-127, 127, 0, 1, -1, 1, -1, 2};
    memcpy(y, special, sizeof special);
    uint8_t want8[34] = {0x00, 0x2C};
    for (int j = 0; j < 32; j++) want8[2 + j] = (uint8_t)(j < 8 ? special_q[j] : 4 * (j - 16));
    uint8_t q8[34], q8s[34];
    hq_quantize_ref_q8_0(y, q8, 32);
    CHECK(memcmp(q8, want8, 34) == 0);
    hq_get_traits(HQ_TYPE_Q8_0)->from_float(y, q8s, 32); /* the SIMD quantizer rounds ties alike */
    CHECK(memcmp(q8s, want8, 34) == 0);
    /* Q8_1 adds s = d * sum(q) */
    int sum = 0;
    for (int j = 0; j < 32; j++) sum += (int8_t)want8[2 + j];
    const hr_fp16 want_s = hr_fp32_to_fp16((float)sum * 0.0625f);
    block_q8_1 b81, b81s;
    hq_quantize_ref_q8_1(y, &b81, 32);
    hq_get_traits(HQ_TYPE_Q8_1)->from_float(y, &b81s, 32);
    CHECK(b81.d == 0x2C00 && b81.s == want_s && memcmp(b81.qs, want8 + 2, 32) == 0);
    CHECK(memcmp(&b81, &b81s, sizeof b81) == 0);

    /* Q5_0 by hand: d = 1; qh = 01 00 00 80 sets bit 0 (element 0) and bit 31 (element 31);
       qs[0] = 0x21 (element 0 low 1, element 16 low 2), qs[15] = 0x3F (element 15 low 15,
       element 31 low 3); all else 0 -> -16. */
    block_q5_0 b5 = {.d = 0x3C00, .qh = {0x01, 0x00, 0x00, 0x80}};
    b5.qs[0] = 0x21;
    b5.qs[15] = 0x3F;
    float v5[32];
    hq_dequantize_ref_q5_0(&b5, v5, 32);
    CHECK(v5[0] == 1.0f && v5[16] == -14.0f && v5[15] == -1.0f && v5[31] == 3.0f && v5[1] == -16.0f);
    /* ... and quantizing those values gives the block back (max magnitude -16 -> d = 1) */
    block_q5_0 b5q;
    hq_quantize_ref_q5_0(v5, &b5q, 32);
    CHECK(memcmp(&b5q, &b5, sizeof b5) == 0);
    /* Q5_1 / Q4_1: x = d*q + m with d = 1, m = -3 */
    block_q5_1 b51 = {.d = 0x3C00, .m = 0xC200, .qh = {0x00, 0x00, 0x01, 0x00}};
    b51.qs[0] = 0x1F; /* element 0 -> 15, element 16 -> 1 | 16 (bit 16 set) = 17 */
    float v51[32];
    hq_dequantize_ref_q5_1(&b51, v51, 32);
    CHECK(v51[0] == 12.0f && v51[16] == 14.0f && v51[1] == -3.0f);
    block_q4_1 b41 = {.d = 0x3C00, .m = 0xC200};
    b41.qs[3] = 0xE2; /* element 3 -> 2, element 19 -> 14 */
    float v41[32];
    hq_dequantize_ref_q4_1(&b41, v41, 32);
    CHECK(v41[3] == -1.0f && v41[19] == 11.0f && v41[0] == -3.0f);
    /* F16 / BF16 rounding of a value exactly between two representable ones: to even */
    hr_fp16 h;
    const float mid = 1.0f + 0x1p-11f; /* halfway between 1 and 1 + 2^-10 */
    hq_quantize_ref_f16(&mid, &h, 1);
    CHECK(h == 0x3C00);
    hr_bf16 bh;
    const float midb = 1.0f + 0x1p-8f + 0x1p-7f; /* halfway between 1+2^-7 and 1+2^-6: to even */
    hq_quantize_ref_bf16(&midb, &bh, 1);
    CHECK(bh == 0x3F82);
}

/* ---- quantize -> dequantize error ------------------------------------------------------------------- */

static void test_roundtrip(void) {
    const int64_t n = 65536;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float)), *scale = malloc(n / 32 * sizeof(float));
    void *q = malloc((size_t)n * 4);
    REQUIRE_V(x && y && q && scale);
    fill_uniform(x, n);
    for (int64_t b = 0; b < n / 32; b++) { /* blocks of very different magnitude */
        scale[b] = exp2f(rng_uniform(-6.0f, 6.0f));
        for (int j = 0; j < 32; j++) x[b * 32 + j] *= scale[b];
    }
    for (size_t k = 0; k < HR_ARRAY_LEN(my_types); k++) {
        const int t = my_types[k];
        const hq_traits *tr = hq_get_traits(t);
        CHECK(tr != NULL);
        if (!tr) continue;
        tr->from_float_ref(x, q, n);
        tr->to_float(q, y, n);
        /* on the data before the per-block scaling, so every magnitude counts alike */
        double e2 = 0.0, s2 = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const double d = ((double)y[i] - x[i]) / scale[i / 32], v = (double)x[i] / scale[i / 32];
            e2 += d * d;
            s2 += v * v;
        }
        const double rel = sqrt(e2 / s2);
        printf("  %-5s quantize->dequantize relative RMS error %.5f%% (bound %.4f%%)\n", tr->name, 100 * rel,
               100 * rms_bound(t));
        CHECKF(rel <= rms_bound(t), "%s rel rms %g", tr->name, rel);
        /* the reference does not depend on the table: quantizing again gives the same bytes */
        if (tr->from_float != tr->from_float_ref) {
            void *q2 = malloc((size_t)n * 4);
            tr->from_float(x, q2, n);
            CHECKF(memcmp(q, q2, hq_row_size(t, n)) == 0, "%s from_float differs from the reference", tr->name);
            free(q2);
        }
    }
    free(x), free(y), free(q), free(scale);
}

/* ---- activation quantizers: SIMD vs reference, byte for byte ---------------------------------------- */

static void test_from_float(void) {
    const int types[] = {HQ_TYPE_Q8_0, HQ_TYPE_Q8_1, HQ_TYPE_Q8_K};
    enum { N = 256 * 13 };
    static float x[N];
    static uint8_t a[N * 2], b[N * 2];
    for (size_t k = 0; k < HR_ARRAY_LEN(types); k++) {
        const hq_traits *tr = hq_get_traits(types[k]);
        int bad = 0;
        for (int round = 0; round < 4; round++) {
            fill_uniform(x, N);
            if (round == 1) /* exact ties: amax 127 * 2^e, values at (k + 1/2) steps */
                for (int i = 0; i < N; i++)
                    x[i] = (i % 32 == 0 ? 127.0f : (float)((int)(rng_next() % 253) - 126) + 0.5f) * 0x1p-3f;
            if (round == 2) /* a zero block, tiny and huge magnitudes */
                for (int i = 0; i < N; i++) x[i] = i < 32 ? 0.0f : x[i] * (i < N / 2 ? 1e-30f : 1e30f);
            if (round == 3) /* the largest magnitude negative, or shared by +/- */
                for (int i = 0; i < N; i += 32) x[i + 7] = -2.0f, x[i + 9] = (i & 32) ? 2.0f : 1.0f;
            if (round == 3 && types[k] == HQ_TYPE_Q8_K) /* a NaN, an infinity: each block to the reference */
                x[256 * 5 + 100] = NAN, x[256 * 9 + 3] = -INFINITY;
            const int bs = (int)tr->blck_size;
            for (int len = bs; len <= N; len += bs * 3) {
                memset(a, 0xAA, sizeof a);
                memset(b, 0x55, sizeof b);
                tr->from_float_ref(x, a, len);
                tr->from_float(x, b, len);
                if (memcmp(a, b, hq_row_size(types[k], len)) != 0) bad++;
            }
        }
        CHECKF(bad == 0, "%s: %d rows differ between from_float and from_float_ref", tr->name, bad);
    }
}

/* F32 -> F16 rows (the F16 attention path's q, the KV cache): the dispatched converter against
   hr_fp32_to_fp16 on every class of value: normal, ties at every exponent, the overflow edge (65504,
   65519.996 -> 65504, 65520 -> inf), half subnormals and their ties, float subnormals, zeros,
   infinities and NaNs of both signs and any payload, and random bit patterns */
static void test_f16_rows(void) {
    const hq_traits *tr = hq_get_traits(HQ_TYPE_F16);
    enum { N = 4099 }; /* not a multiple of 8: the tail too */
    static float x[N];
    static hr_fp16 a[N], b[N];
    const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.996f, 65520.0f, -65520.0f, 1e9f,
                              0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.8p-24f, 0x1p-26f, 0x1p-149f, 0x1.002p0f,
                              0x1.006p0f, INFINITY, -INFINITY, NAN, -NAN};
    int bad = 0;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) {
            if (round == 0) x[i] = specials[i % HR_ARRAY_LEN(specials)] * (i % 7 == 3 ? -1.0f : 1.0f);
            else if (round == 1) { /* ties: 11 significant bits and a half, at random exponents */
                const uint32_t m = (uint32_t)(rng_next() % 2048) << 13 | 1u << 12, e = 100 + rng_next() % 50;
                x[i] = hr_bits_to_f32(e << 23 | m);
            } else { /* any bits, NaN payloads included */
                x[i] = hr_bits_to_f32((uint32_t)rng_next());
            }
        }
        if (round == 0) x[N / 2] = hr_bits_to_f32(0x7fc12345u); /* a NaN with a payload, among normal values */
        for (int i = 0; i < N; i++) a[i] = hr_fp32_to_fp16(x[i]);
        memset(b, 0x55, sizeof b);
        tr->from_float(x, b, N);
        for (int i = 0; i < N; i++) bad += a[i] != b[i];
    }
    printf("  F16 rows (%s): %d values differ from hr_fp32_to_fp16\n", hq_simd_name(), bad);
    CHECKF(bad == 0, "F16 from_float: %d values differ from hr_fp32_to_fp16", bad);
}

/* ---- dot products --------------------------------------------------------------------------------------- */

typedef struct {
    double simd, deq, quant; /* largest errors seen, relative to sum |x_i y_i| */
} dot_err;

/* one random pair of rows of n elements: dispatched vs reference dot, reference vs the dot of the
   dequantized rows, and the quantized dot vs the float dot of the original data */
static void check_dot(int t, int n, dot_err *e) {
    const hq_traits *tr = hq_get_traits(t), *vt = hq_get_traits(tr->vec_dot_type);
    float *x = malloc((size_t)n * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
    float *xd = malloc((size_t)n * sizeof(float)), *yd = malloc((size_t)n * sizeof(float));
    void *qx = malloc((size_t)n * 4 + 64), *qy = malloc((size_t)n * 4 + 64);
    fill_uniform(x, n);
    fill_uniform(y, n);
    tr->from_float_ref(x, qx, n);
    vt->from_float(y, qy, n);
    tr->to_float(qx, xd, n);
    vt->to_float(qy, yd, n);
    double exact = 0.0, deq = 0.0, absd = 0.0, absx = 0.0;
    for (int i = 0; i < n; i++) {
        exact += (double)x[i] * y[i];
        deq += (double)xd[i] * yd[i];
        absd += fabs((double)xd[i] * yd[i]);
        absx += fabs((double)x[i] * y[i]);
    }
    float r_ref = NAN, r = NAN;
    tr->vec_dot_ref(n, &r_ref, qx, qy);
    tr->vec_dot(n, &r, qx, qy);
    const double es = fabs((double)r - r_ref) / absd, ed = fabs((double)r_ref - deq) / absd;
    const double eq = fabs((double)r - exact) / absx;
    if (!(es <= e->simd)) e->simd = isnan(es) ? INFINITY : es;
    if (!(ed <= e->deq)) e->deq = isnan(ed) ? INFINITY : ed;
    /* quantization error: a sum of n independent errors; scaled by sqrt(n) to compare across n */
    const double eqn = eq * sqrt((double)n);
    if (!(eqn <= e->quant)) e->quant = isnan(eqn) ? INFINITY : eqn;
    free(x), free(y), free(xd), free(yd), free(qx), free(qy);
}

static void test_vec_dot(void) {
    const int dot_types[] = {HQ_TYPE_F32, HQ_TYPE_F16, HQ_TYPE_BF16, HQ_TYPE_Q4_0, HQ_TYPE_Q4_1,
                             HQ_TYPE_Q5_0, HQ_TYPE_Q5_1, HQ_TYPE_Q8_0, HQ_TYPE_Q8_1};
    const int nblocks[] = {1, 2, 3, 4, 5, 7, 8, 16, 31, 33, 64};
    const int odd_n[] = {1, 3, 7, 8, 9, 15, 17, 31, 33, 100, 257, 1000, 2047};
    for (size_t k = 0; k < HR_ARRAY_LEN(dot_types); k++) {
        const int t = dot_types[k];
        const hq_traits *tr = hq_get_traits(t);
        dot_err e = {0};
        for (int rep = 0; rep < 8; rep++)
            for (size_t m = 0; m < HR_ARRAY_LEN(nblocks); m++) check_dot(t, nblocks[m] * 32, &e);
        if (tr->blck_size == 1)
            for (int rep = 0; rep < 4; rep++)
                for (size_t m = 0; m < HR_ARRAY_LEN(odd_n); m++) check_dot(t, odd_n[m], &e);
        /* SIMD vs reference: identical integer parts, only the float summation order differs —
           a few ulps of the largest partial sum.  Dequantized vs quantized dot: the same products
           (d*q is exact in float), except for Q8_1's s = d*sum(q), stored as fp16 (2^-11
           relative), which enters the _1 types' dots through m*s. */
        const bool has_min = t == HQ_TYPE_Q4_1 || t == HQ_TYPE_Q5_1;
        const double tol_simd = 2e-6, tol_deq = has_min ? 2e-3 : 2e-6;
        /* quantization: each element's error has relative RMS rx (weights) and ry (activations),
           so the dot's error has SD (4/3) sqrt(rx^2 + ry^2) / sqrt(n) relative to sum|x y| for
           uniform data (E|x| = 1/2, E x^2 = 1/3); allow 6 SD (some 1100 draws per type) */
        const double rx = rms_bound(t), ry = rms_bound(tr->vec_dot_type);
        const double tol_quant = 6.0 * (4.0 / 3.0) * sqrt(rx * rx + ry * ry) + 2e-5;
        printf("  %-5s vec_dot: simd-ref %.2e  ref-dequantized %.2e  quantized-exact*sqrt(n) %.2e (bound %.2e)\n",
               tr->name, e.simd, e.deq, e.quant, tol_quant);
        CHECKF(e.simd <= tol_simd, "%s simd vs ref %g", tr->name, e.simd);
        CHECKF(e.deq <= tol_deq, "%s ref vs dequantized %g", tr->name, e.deq);
        CHECKF(e.quant <= tol_quant, "%s quantized vs exact %g", tr->name, e.quant);
    }
}

/* ---- gemm tiles vs a loop of vec_dot ---------------------------------------------------------------- */

static void test_gemm(void) {
    const int gemm_types[] = {HQ_TYPE_F32, HQ_TYPE_F16, HQ_TYPE_BF16, HQ_TYPE_Q4_0, HQ_TYPE_Q4_1,
                              HQ_TYPE_Q5_0, HQ_TYPE_Q5_1, HQ_TYPE_Q8_0};
    const int lens[] = {32, 96, 256, 1024 + 32};
    enum { MAXR = 7 };
    for (size_t k = 0; k < HR_ARRAY_LEN(gemm_types); k++) {
        const int t = gemm_types[k];
        const hq_traits *tr = hq_get_traits(t), *vt = hq_get_traits(tr->vec_dot_type);
        int bad = 0, untouched_bad = 0;
        double worst = 0.0;
        for (size_t m = 0; m < HR_ARRAY_LEN(lens); m++) {
            int n = lens[m];
            if (tr->blck_size == 1 && m == 1) n = 101; /* float types: a length with a tail */
            /* rows padded by 3 blocks so the strides are not the row sizes */
            const size_t bx = hq_row_size(t, n) + 3 * tr->type_size;
            const size_t by = hq_row_size(tr->vec_dot_type, n) + 3 * vt->type_size;
            uint8_t *x = calloc(MAXR, bx), *y = calloc(MAXR, by);
            float *f = malloc((size_t)n * sizeof(float));
            for (int r = 0; r < MAXR; r++) {
                fill_uniform(f, n);
                tr->from_float_ref(f, x + r * bx, n);
                fill_uniform(f, n);
                vt->from_float(f, y + r * by, n);
            }
            for (int nr = 1; nr <= MAXR; nr++)
                for (int nc = 1; nc <= MAXR; nc++) {
                    const size_t lds = (size_t)nr + 2;
                    float s[MAXR * (MAXR + 2)];
                    for (size_t i = 0; i < HR_ARRAY_LEN(s); i++) s[i] = -12345.0f;
                    tr->gemm(n, s, lds, x, bx, nr, y, by, nc);
                    for (int j = 0; j < nc; j++)
                        for (size_t i = 0; i < lds; i++) {
                            if (i >= (size_t)nr) {
                                if (s[j * lds + i] != -12345.0f) untouched_bad++;
                                continue;
                            }
                            float want, mag;
                            tr->vec_dot(n, &want, x + i * bx, y + j * by);
                            /* scale of the sums: the dot of |dequantized| values */
                            float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
                            tr->to_float(x + i * bx, a, n);
                            vt->to_float(y + j * by, b, n);
                            double acc = 0.0;
                            for (int e = 0; e < n; e++) acc += fabs((double)a[e] * b[e]);
                            mag = (float)acc;
                            free(a), free(b);
                            const double err = fabs((double)s[j * lds + i] - want) / mag;
                            if (!(err <= 2e-6)) bad++;
                            if (err > worst || isnan(err)) worst = isnan(err) ? INFINITY : err;
                        }
                }
            free(x), free(y), free(f);
        }
        printf("  %-5s gemm (nr, nc in 1..7) vs vec_dot: worst relative difference %.2e\n", tr->name, worst);
        CHECKF(bad == 0, "%s gemm: %d entries differ from vec_dot", tr->name, bad);
        CHECKF(untouched_bad == 0, "%s gemm wrote outside the tile", tr->name);
    }
}

/* Tiles larger than the kernels' blocking: more than 16 weight rows (several row tiles, a short
   last group of 4), activation row counts that leave 1..3 columns over, and lengths that cross the
   kernels' K chunks (2080 = 65 blocks: prefill chunks of 32 blocks plus an odd last block; 8288 =
   259 blocks: decode chunks of 256 blocks plus a pair and a last block); Q8_0 weights include
   codes of -128. */
static void test_gemm_large(void) {
    const int gemm_types[] = {HQ_TYPE_Q4_0, HQ_TYPE_Q4_1, HQ_TYPE_Q5_0, HQ_TYPE_Q5_1, HQ_TYPE_Q8_0, HQ_TYPE_F16};
    const int lens[] = {2080, 8288}, rows[] = {16, 21, 35}, cols[] = {1, 6, 9};
    enum { MAXR = 35, MAXC = 9 };
    for (size_t k = 0; k < HR_ARRAY_LEN(gemm_types); k++) {
        const int t = gemm_types[k];
        const hq_traits *tr = hq_get_traits(t), *vt = hq_get_traits(tr->vec_dot_type);
        int bad = 0;
        double worst = 0.0;
        for (size_t m = 0; m < HR_ARRAY_LEN(lens); m++) {
            const int n = lens[m];
            const size_t bx = hq_row_size(t, n) + tr->type_size, by = hq_row_size(tr->vec_dot_type, n);
            uint8_t *x = calloc(MAXR, bx), *y = calloc(MAXC, by);
            float *f = malloc((size_t)n * sizeof(float)), *s = malloc((size_t)MAXR * MAXC * sizeof(float));
            float *want = malloc((size_t)MAXR * MAXC * sizeof(float)), *mag = malloc((size_t)MAXR * MAXC * sizeof(float));
            float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
            REQUIRE_V(x && y && f && s && want && mag && a && b);
            for (int r = 0; r < MAXR; r++) {
                fill_uniform(f, n);
                tr->from_float_ref(f, x + r * bx, n);
                /* Q8_0 weight codes may be -128 in a file (no quantizer writes it): sprinkle some in */
                if (t == HQ_TYPE_Q8_0)
                    for (int b = 0; b < n / QK8_0; b++) ((block_q8_0 *)(x + r * bx))[b].qs[(b * 7 + r) % QK8_0] = -128;
            }
            for (int c = 0; c < MAXC; c++) {
                fill_uniform(f, n);
                vt->from_float(f, y + c * by, n);
            }
            for (int r = 0; r < MAXR; r++)
                for (int c = 0; c < MAXC; c++) {
                    tr->vec_dot(n, &want[c * MAXR + r], x + r * bx, y + c * by);
                    tr->to_float(x + r * bx, a, n);
                    vt->to_float(y + c * by, b, n);
                    double acc = 0.0;
                    for (int e = 0; e < n; e++) acc += fabs((double)a[e] * b[e]);
                    mag[c * MAXR + r] = (float)acc;
                }
            for (size_t ir = 0; ir < HR_ARRAY_LEN(rows); ir++)
                for (size_t ic = 0; ic < HR_ARRAY_LEN(cols); ic++) {
                    const int nr = rows[ir], nc = cols[ic];
                    tr->gemm(n, s, MAXR, x, bx, nr, y, by, nc);
                    for (int c = 0; c < nc; c++)
                        for (int r = 0; r < nr; r++) {
                            const double err = fabs((double)s[c * MAXR + r] - want[c * MAXR + r]) / mag[c * MAXR + r];
                            if (!(err <= 2e-6)) bad++;
                            if (err > worst || isnan(err)) worst = isnan(err) ? INFINITY : err;
                        }
                }
            free(x), free(y), free(f), free(s), free(want), free(mag), free(a), free(b);
        }
        printf("  %-5s gemm (nr up to 35, nc up to 9, n up to 8288) vs vec_dot: worst relative difference %.2e\n",
               tr->name, worst);
        CHECKF(bad == 0, "%s large gemm: %d entries differ from vec_dot", tr->name, bad);
    }
}

/* ---- which kernels the table chose -------------------------------------------------------------------- */

#if defined(HEARTH_ARCH_X86)
/* The AVX-512 Q8_0 prefill tile promises the AVX2 tile's bits (quants512.c): random codes (-128
   included) and scales, K of 1-300 blocks (chunks of 16 and a rest), 1-35 rows (groups of 4, a
   short last one), 1-9 columns (tiles of 4 and a rest), odd strides. */
static void test_q8_0_avx512(void) {
    enum { MAXB = 300, MAXR = 35, MAXC = 9 };
    const size_t bx = MAXB * sizeof(block_q8_0) + 6, by = MAXB * sizeof(block_q8_0) + 2;
    uint8_t *x = malloc(bx * MAXR), *y = malloc(by * MAXC);
    float *s2 = malloc(sizeof(float) * MAXR * MAXC), *s5 = malloc(sizeof(float) * MAXR * MAXC);
    REQUIRE_V(x && y && s2 && s5);
    for (size_t i = 0; i < bx * MAXR; i++) x[i] = (uint8_t)rng_next();
    for (size_t i = 0; i < by * MAXC; i++) y[i] = (uint8_t)rng_next();
    for (int r = 0; r < MAXR; r++)
        for (int b = 0; b < MAXB; b++) { /* finite scales; activation codes as the quantizer makes them (|a| <= 127) */
            block_q8_0 *xb = (block_q8_0 *)(x + r * bx) + b;
            xb->d = (hr_fp16)(0x0400 + rng_next() % 0x3800);
            if (r < MAXC) {
                block_q8_0 *yb = (block_q8_0 *)(y + r * by) + b;
                yb->d = (hr_fp16)(0x0400 + rng_next() % 0x3800);
                for (int i = 0; i < QK8_0; i++) if (yb->qs[i] == -128) yb->qs[i] = -127;
            }
        }
    const int ks[] = {1, 15, 16, 17, 64, 300}, rows[] = {1, 3, 4, 5, 12, 16, 17, 35};
    int differ = 0, calls = 0;
    for (size_t ki = 0; ki < HR_ARRAY_LEN(ks); ki++)
        for (size_t ri = 0; ri < HR_ARRAY_LEN(rows); ri++)
            for (int nc = 2; nc <= MAXC; nc++, calls++) {
                memset(s2, 0, sizeof(float) * MAXR * MAXC), memset(s5, 0xff, sizeof(float) * MAXR * MAXC);
                hq_gemm_avx2_q8_0(ks[ki] * QK8_0, s2, MAXR, x, bx, rows[ri], y, by, nc);
                hq_gemm_avx512_q8_0(ks[ki] * QK8_0, s5, MAXR, x, bx, rows[ri], y, by, nc);
                for (int j = 0; j < nc; j++) differ += memcmp(s2 + j * MAXR, s5 + j * MAXR, sizeof(float) * rows[ri]) != 0;
            }
    printf("  Q8_0 AVX-512 prefill tile vs AVX2: %d calls, %d columns differ\n", calls, differ);
    CHECKF(differ == 0, "Q8_0: AVX-512 gemm differs from AVX2 in %d columns", differ);
    free(x), free(y), free(s2), free(s5);
}
#endif

/* Packed layouts (docs/quant.md): where the dispatched family has one, pack then unpack gives the rows
   back byte for byte, and gemm_packed over the packed rows gives gemm's results bit for bit — decode
   over whole shares and longer rows (x4v's K-panels: 8192 = two, 8320 = Q4_0's two and a unit, the
   K-quants' 33 super-blocks = two and one, a short prefill chunk; the longest rows x4v takes),
   prefill tiles of 1-5 columns, 4 to 36 rows (36: two bands and a short one).  Rows come from
   the quantizer and, for the K-quants, also as random bytes (every 6-bit scale and min pattern, finite d and
   dmin); unpack is checked whole and in stretches of HQ_UNPACK_STEP.  hq_pack_ok refuses shapes the
   layout cannot hold.  Without a packed kernel (generic table,
   NEON) nothing may be packed. */
static void test_packed_type(int type, const int *lens, size_t nlens, bool random_bytes) {
    const hq_traits *tr = hq_get_traits(type), *vt = hq_get_traits(tr->vec_dot_type);
    const int64_t blk = tr->blck_size;
    if (!tr->gemm_packed) {
        printf("  %s packed: no packed kernel in the %s table\n", tr->name, hq_simd_name());
        CHECK(!hq_pack_ok(type, 2 * blk, 4) && !tr->pack && !tr->unpack && !tr->prep);
        return;
    }
    CHECK(tr->pack && tr->unpack);
    /* Q4_0's x4 and x4v take pairs of blocks, Q8_0's x4v units of 4 */
    const int64_t unit = type == HQ_TYPE_Q4_0 ? 2 * blk : type == HQ_TYPE_Q8_0 ? 4 * blk : blk;
    CHECK(hq_pack_ok(type, unit, 4) && hq_pack_ok(type, 64 * unit, 36));
    CHECK(!hq_pack_ok(type, unit, 6)); /* rows not whole groups */
    CHECK(!hq_pack_ok(type, 0, 4) && !hq_pack_ok(type, unit, 0) && !hq_pack_ok(type, blk + 1, 4));
    if (unit > blk) CHECK(!hq_pack_ok(type, unit + blk, 4)); /* not whole units */
    const int rowss[] = {4, 8, 36};
    int bad_rt = 0, bad_gemm = 0, cases = 0;
    for (int src = 0; src < (random_bytes ? 2 : 1); src++)
        for (size_t li = 0; li < nlens; li++)
            for (size_t ri = 0; ri < HR_ARRAY_LEN(rowss); ri++) {
                const int n = lens[li], rows = rowss[ri], nc_max = 5;
                const size_t bx = hq_row_size(type, n), by = hq_row_size(tr->vec_dot_type, n);
                uint8_t *x = malloc(bx * rows), *px = malloc(bx * rows), *back = malloc(bx), *y = malloc(by * nc_max);
                float *f = malloc((size_t)n * sizeof(float)), *s0 = malloc(sizeof(float) * rows * nc_max),
                      *s1 = malloc(sizeof(float) * rows * nc_max);
                REQUIRE_V(x && px && back && y && f && s0 && s1);
                for (int r = 0; r < rows; r++) {
                    fill_uniform(f, n);
                    tr->from_float_ref(f, x + r * bx, n);
                }
                if (src == 1) /* random bytes (Q8_0: codes of -128 too), the fp16 scales made finite */
                    for (size_t i = 0; i < bx * rows; i++) x[i] = (uint8_t)rng_next();
                for (int r = 0; src == 1 && r < rows; r++)
                    for (int64_t b = 0; b < n / blk; b++) {
                        /* Q6_K: d at the block's end; Q4_K, Q5_K: d, dmin at its start; Q8_0: d */
                        const bool q6 = type == HQ_TYPE_Q6_K, one = q6 || type == HQ_TYPE_Q8_0;
                        hr_fp16 *d = (hr_fp16 *)(x + r * bx + b * tr->type_size + (q6 ? offsetof(block_q6_K, d) : 0));
                        for (int k = 0; k < (one ? 1 : 2); k++) d[k] = (hr_fp16)(0x0400 + rng_next() % 0x3800);
                    }
                for (int j = 0; j < nc_max; j++) {
                    fill_uniform(f, n);
                    vt->from_float(f, y + j * by, n);
                }
                for (int r = 0; r < rows; r += HQ_BAND)
                    tr->pack(px + r * bx, x + r * bx, bx, n, rows - r < HQ_BAND ? rows - r : HQ_BAND);
                for (int r = 0; r < rows; r++) { /* whole, and in the stretches hm_tensor_row_f32 takes */
                    tr->unpack(back, px, n, rows, r, 0, n);
                    if (memcmp(back, x + r * bx, bx)) bad_rt++;
                    memset(back, 0, bx);
                    for (int e0 = 0; e0 < n; e0 += HQ_UNPACK_STEP) {
                        const int ne = n - e0 < HQ_UNPACK_STEP ? n - e0 : HQ_UNPACK_STEP;
                        tr->unpack(back + hq_row_size(type, e0), px, n, rows, r, e0, ne);
                    }
                    if (memcmp(back, x + r * bx, bx)) bad_rt++;
                }
                /* the packed kernel's activation rows, prepared as the engine prepares them (docs/quant.md) */
                const size_t pys = tr->prep ? tr->prep_size(n) : by;
                uint8_t *py = tr->prep ? malloc(pys * nc_max) : y;
                REQUIRE_V(py);
                for (int j = 0; tr->prep && j < nc_max; j++) tr->prep(py + j * pys, y + j * by, n);
                for (int nc = 1; nc <= nc_max; nc++) {
                    tr->gemm(n, s0, rows, x, bx, rows, y, by, nc);
                    tr->gemm_packed(n, s1, rows, px, bx, rows, py, pys, nc);
                    if (memcmp(s0, s1, sizeof(float) * rows * nc)) bad_gemm++;
                    cases++;
                }
                if (py != y) free(py);
                free(x), free(px), free(back), free(y), free(f), free(s0), free(s1);
            }
    printf("  %s packed: %d gemm cases, %d differ from the file layout's; %d rows fail pack + unpack\n", tr->name,
           cases, bad_gemm, bad_rt);
    CHECKF(bad_rt == 0, "%s: %d rows did not survive pack + unpack", tr->name, bad_rt);
    CHECKF(bad_gemm == 0, "%s: %d gemm_packed cases differ from gemm", tr->name, bad_gemm);
}

/* Which Q4_0 layout a table packs into (docs/quant.md): on AVX-512 x4v for rows of whole 4-block units
   (each (row r, block j)'s scale at fp16 4r + j, bytes 4i .. 4i+3 of its qs at 32 + 64i + 16r + 4j),
   x4 otherwise and on AVX2 (per block pair: 8 scales, then each row's two qs) */
static void test_q4_0_layouts(void) {
    const hq_traits *tr = hq_get_traits(HQ_TYPE_Q4_0);
    if (!tr->pack) return;
    const bool x4v = strcmp(hq_simd_name(), "avx512") == 0;
    enum { NB = 6 }; /* rows of 4 blocks (128 elements) and of 6 (192) */
    block_q4_0 rows[4][NB];
    uint8_t packed[sizeof rows];
    for (int r = 0; r < 4; r++)
        for (int b = 0; b < NB; b++) {
            rows[r][b].d = (hr_fp16)(0x3C00 + 16 * r + b);
            for (int k = 0; k < 16; k++) rows[r][b].qs[k] = (uint8_t)(16 * r + 4 * b + k);
        }
    int bad = 0;
    for (int nb = 4; nb <= NB; nb += 2) {
        tr->pack(packed, rows, sizeof rows[0], 32 * nb, 4); /* the first nb blocks of each row */
        const bool v = x4v && nb == 4;
        for (int r = 0; r < 4; r++)
            for (int b = 0; b < 2; b++) { /* the first blocks of each row, where both layouts have them */
                hr_fp16 d;
                memcpy(&d, packed + (v ? 2 * (4 * r + b) : 2 * r + 8 * b), 2);
                bad += d != rows[r][b].d;
                for (int k = 0; k < 16; k++)
                    bad += packed[v ? 32 + 64 * (k / 4) + 16 * r + 4 * b + k % 4 : 16 + 32 * r + 16 * b + k] != rows[r][b].qs[k];
            }
    }
    printf("  Q4_0 packed layouts (%s: %s): %d bytes misplaced\n", hq_simd_name(),
           x4v ? "x4v for rows of 4-block units, x4 otherwise" : "x4", bad);
    CHECKF(bad == 0, "Q4_0: %d packed bytes not where the %s layout puts them", bad, x4v ? "x4v" : "x4");
}

/* Q8_0's x4v (docs/quant.md, AVX-512): each (row r, block j)'s scale at fp16 4r + j, byte k of its qs at
   32 + 64 * (k / 4) + 16r + 4j + k % 4, offset by 128 (code ^ 0x80) */
static void test_q8_0_layout(void) {
    const hq_traits *tr = hq_get_traits(HQ_TYPE_Q8_0);
    if (!tr->pack) return;
    block_q8_0 rows[4][4];
    uint8_t packed[sizeof rows];
    for (int r = 0; r < 4; r++)
        for (int j = 0; j < 4; j++) {
            rows[r][j].d = (hr_fp16)(0x3C00 + 4 * r + j);
            for (int k = 0; k < QK8_0; k++) rows[r][j].qs[k] = (int8_t)(uint8_t)(37 * r + 11 * j + 5 * k);
        }
    tr->pack(packed, rows, sizeof rows[0], 128, 4);
    int bad = 0;
    for (int r = 0; r < 4; r++)
        for (int j = 0; j < 4; j++) {
            hr_fp16 d;
            memcpy(&d, packed + 2 * (4 * r + j), 2);
            bad += d != rows[r][j].d;
            for (int k = 0; k < QK8_0; k++)
                bad += packed[32 + 64 * (k / 4) + 16 * r + 4 * j + k % 4] != ((uint8_t)rows[r][j].qs[k] ^ 0x80);
        }
    printf("  Q8_0 packed layout (x4v): %d bytes misplaced\n", bad);
    CHECKF(bad == 0, "Q8_0: %d packed bytes not where x4v puts them", bad);
}

/* x4v's K-panels (docs/quant.md): in a band of 16 rows of 8192 Q4_K / Q6_K elements (two panels of 16
   super-blocks), group g's entry for super-block b at 576 / 840 * (64 * (b / 16) + 16 * g + b % 16):
   checked through each row's d, which the entry keeps at 4r (Q4_K) / 64 + 2r (Q6_K) */
static void test_x4v_panels(void) {
    enum { K = 8192, NB = K / QK_K, R = 16 };
    int bad = 0, checked = 0;
    for (int q6 = 0; q6 < 2; q6++) {
        const int type = q6 ? HQ_TYPE_Q6_K : HQ_TYPE_Q4_K;
        const hq_traits *tr = hq_get_traits(type);
        if (!tr->pack || strcmp(hq_simd_name(), "generic") == 0) continue;
        const size_t bs = tr->type_size, bx = NB * bs, E = 4 * bs, doff = q6 ? offsetof(block_q6_K, d) : 0;
        uint8_t *x = calloc(R, bx), *px = malloc(R * bx);
        REQUIRE_V(x && px);
        for (int r = 0; r < R; r++)
            for (int b = 0; b < NB; b++) {
                const hr_fp16 d = (hr_fp16)(0x3C00 + NB * r + b);
                memcpy(x + r * bx + b * bs + doff, &d, 2);
            }
        tr->pack(px, x, bx, K, R);
        for (int r = 0; r < R; r++)
            for (int b = 0; b < NB; b++) {
                const size_t e = E * (size_t)(64 * (b / 16) + 16 * (r / 4) + b % 16);
                hr_fp16 d;
                memcpy(&d, px + e + (q6 ? 64 + 2 * (r % 4) : 4 * (r % 4)), 2);
                bad += d != (hr_fp16)(0x3C00 + NB * r + b);
                checked++;
            }
        free(x), free(px);
    }
    printf("  x4v K-panels (Q4_K, Q6_K, 16 x 8192): %d of %d entries misplaced\n", bad, checked);
    CHECKF(bad == 0, "x4v: %d entries not where the K-panels put them", bad);
}

static void test_packed(void) {
    test_q4_0_layouts();
    test_q8_0_layout();
    test_x4v_panels();
    /* Q8_0 packs only rows x4v takes (whole 4-block units, at most HQ_X4V_MAX_NE0) */
    CHECK(!hq_pack_ok(HQ_TYPE_Q8_0, 64, 4) && !hq_pack_ok(HQ_TYPE_Q8_0, 192, 4) &&
          !hq_pack_ok(HQ_TYPE_Q8_0, HQ_X4V_MAX_NE0 + 128, 4) && !hq_pack_ok(HQ_TYPE_Q3_K, 256, 4));
    if (hq_get_traits(HQ_TYPE_Q8_0)->gemm_packed) CHECK(hq_pack_ok(HQ_TYPE_Q8_0, HQ_X4V_MAX_NE0, 4));
    if (hq_get_traits(HQ_TYPE_Q4_0)->gemm_packed) CHECK(!hq_pack_ok(HQ_TYPE_Q4_0, 96, 4)); /* an odd number of blocks */
    /* Q4_0: rows of whole 4-block units (x4v on AVX-512), up to and past x4's one-pass decode, the
       longest row x4v packs (its decode's prepared row at full size), and rows an AVX-512 table keeps
       in x4 (an odd number of block pairs; past that longest row) */
    const int lens0[] = {128, 1024, 8192, 8320, HQ_X4V_MAX_NE0, 192, 8256, HQ_X4V_MAX_NE0 + 128},
              lensk[] = {256, 1024, 8192, 8448}, lensk4[] = {256, 1024, 8192, 8448, HQ_KV_MAX_NE0};
    test_packed_type(HQ_TYPE_Q4_0, lens0, HR_ARRAY_LEN(lens0), false);
    /* Q8_0: x4v's units and K-panels (8320: two panels and a unit), the longest row it packs */
    const int lens8[] = {128, 1024, 8192, 8320, HQ_X4V_MAX_NE0};
    test_packed_type(HQ_TYPE_Q8_0, lens8, HR_ARRAY_LEN(lens8), true);
    /* Q4_K, Q6_K: x4v up to the longest row its decode prepares; longer rows stay in the file layout */
    if (hq_get_traits(HQ_TYPE_Q4_K)->gemm_packed)
        CHECK(hq_pack_ok(HQ_TYPE_Q4_K, HQ_KV_MAX_NE0, 4) && !hq_pack_ok(HQ_TYPE_Q4_K, HQ_KV_MAX_NE0 + QK_K, 4));
    test_packed_type(HQ_TYPE_Q4_K, lensk4, HR_ARRAY_LEN(lensk4), true);
    test_packed_type(HQ_TYPE_Q5_K, lensk, HR_ARRAY_LEN(lensk), true);
    if (hq_get_traits(HQ_TYPE_Q6_K)->gemm_packed)
        CHECK(hq_pack_ok(HQ_TYPE_Q6_K, HQ_KV_MAX_NE0, 4) && !hq_pack_ok(HQ_TYPE_Q6_K, HQ_KV_MAX_NE0 + QK_K, 4));
    test_packed_type(HQ_TYPE_Q6_K, lensk4, HR_ARRAY_LEN(lensk4), true);
}

static void test_dispatch(void) {
    const int simd_types[] = {HQ_TYPE_F32, HQ_TYPE_F16, HQ_TYPE_BF16, HQ_TYPE_Q4_0, HQ_TYPE_Q4_1,
                              HQ_TYPE_Q5_0, HQ_TYPE_Q5_1, HQ_TYPE_Q8_0};
    printf("  kernels: %s\n", hq_simd_name());
    if (is_simd_disabled()) {
        CHECK(strcmp(hq_simd_name(), "generic") == 0);
        for (size_t k = 0; k < HR_ARRAY_LEN(my_types); k++) {
            const hq_traits *tr = hq_get_traits(my_types[k]);
            CHECK(tr->vec_dot == tr->vec_dot_ref && tr->from_float == tr->from_float_ref);
        }
        return;
    }
#if defined(HEARTH_ARCH_X86)
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))) {
        printf("  (no AVX2/FMA/F16C: generic kernels)\n");
        return;
    }
    /* AVX-512 kernels replace some AVX2 ones where the CPU has them (test-quant-k checks they agree) */
    const bool has512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vnni");
    const char *no512 = getenv("HEARTH_NO_AVX512");
    const bool want512 = has512 && !(no512 && *no512 && strcmp(no512, "0") != 0);
    CHECK(strcmp(hq_simd_name(), want512 ? "avx512" : "avx2") == 0);
    /* a misnamed kernel would silently leave the reference in place */
    for (size_t k = 0; k < HR_ARRAY_LEN(simd_types); k++) {
        const hq_traits *tr = hq_get_traits(simd_types[k]);
        CHECKF(tr->vec_dot != tr->vec_dot_ref, "%s has no AVX2 vec_dot", tr->name);
    }
    CHECK(hq_get_traits(HQ_TYPE_Q4_0)->vec_dot == hq_vec_dot_avx2_q4_0);
    CHECK(hq_get_traits(HQ_TYPE_Q8_0)->vec_dot == hq_vec_dot_avx2_q8_0);
    CHECK(hq_get_traits(HQ_TYPE_Q8_0)->from_float == hq_quantize_avx2_q8_0);
    CHECK(hq_get_traits(HQ_TYPE_Q8_1)->from_float == hq_quantize_avx2_q8_1);
    CHECK(hq_get_traits(HQ_TYPE_Q4_0)->gemm == hq_gemm_avx2_q4_0);
    CHECK(hq_get_traits(HQ_TYPE_Q4_0)->gemm_packed == (want512 ? hq_gemm_packed_avx512_q4_0 : hq_gemm_packed_avx2_q4_0));
    CHECK(hq_get_traits(HQ_TYPE_Q8_0)->gemm_packed == (want512 ? hq_gemm_packed_avx512_q8_0 : NULL));
    CHECK(hq_get_traits(HQ_TYPE_Q4_1)->gemm == hq_gemm_avx2_q4_1);
    CHECK(hq_get_traits(HQ_TYPE_Q5_0)->gemm == hq_gemm_avx2_q5_0);
    CHECK(hq_get_traits(HQ_TYPE_Q5_1)->gemm == hq_gemm_avx2_q5_1);
    CHECK(hq_get_traits(HQ_TYPE_Q8_0)->gemm == (want512 ? hq_gemm_avx512_q8_0 : hq_gemm_avx2_q8_0));
    if (want512) test_q8_0_avx512();
    CHECK(hq_get_traits(HQ_TYPE_F32)->gemm == hq_gemm_avx2_f32);
    CHECK(hq_get_traits(HQ_TYPE_F16)->gemm == hq_gemm_avx2_f16);
    CHECK(hq_get_traits(HQ_TYPE_BF16)->gemm == hq_gemm_avx2_bf16);
#elif defined(HEARTH_ARCH_ARM)
    CHECK(strcmp(hq_simd_name(), "neon") == 0);
    for (size_t k = 0; k < HR_ARRAY_LEN(simd_types); k++) {
        const hq_traits *tr = hq_get_traits(simd_types[k]);
        CHECKF(tr->vec_dot != tr->vec_dot_ref, "%s has no NEON vec_dot", tr->name);
    }
    CHECK(hq_get_traits(HQ_TYPE_Q4_0)->vec_dot == hq_vec_dot_neon_q4_0);
    CHECK(hq_get_traits(HQ_TYPE_Q8_0)->from_float == hq_quantize_neon_q8_0);
    CHECK(hq_get_traits(HQ_TYPE_Q8_1)->from_float == hq_quantize_neon_q8_1);
    CHECK(hq_get_traits(HQ_TYPE_Q4_0)->gemm == hq_gemm_neon_q4_0);
    CHECK(hq_get_traits(HQ_TYPE_Q5_1)->gemm == hq_gemm_neon_q5_1);
    CHECK(hq_get_traits(HQ_TYPE_Q8_0)->gemm == hq_gemm_neon_q8_0);
    CHECK(hq_get_traits(HQ_TYPE_F16)->gemm == hq_gemm_neon_f16);
#else
    (void)simd_types;
#endif
}

/* The attention kernels: the dispatched ones give the generic ones' bits (same order, no FMA), for
   F16 and F32 caches, head sizes with and without a multiple of 8, any number of positions. */
static void test_attention(void) {
    const hq_att_kernels *fast = hq_get_att(false), *gen = hq_get_att(true);
    /* with SIMD on, the dispatched kernels are the architecture's own (AVX2 or NEON) */
    if (!is_simd_disabled() && strcmp(hq_simd_name(), "generic"))
        CHECK(fast->kq != gen->kq && fast->kv != gen->kv && fast->acc16 != gen->acc16);
    if (!is_simd_disabled() && strncmp(hq_simd_name(), "avx", 3) == 0) CHECK(fast->kq16 != gen->kq16);
    uint64_t rng = 12345;
    const int hds[] = {48, 64, 128, 36, 40}; /* 40: chunks of 16, then one of 8 */
    for (size_t h = 0; h < HR_ARRAY_LEN(hds); h++)
        for (int f16 = 0; f16 < 2; f16++) {
            int hd = hds[h], n = 75;
            size_t es = f16 ? 2 : 4, row = (size_t)(hd + 8) * es; /* rows wider than a head, like a cache */
            uint8_t *k = calloc((size_t)n, row);
            float q[128], p[75], s1[75], s2[75], a1[128], a2[128];
            for (int i = 0; i < n; i++)
                for (int d = 0; d < hd + 8; d++) {
                    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
                    float x = (float)((double)(rng >> 40) / (double)(1 << 24) * 4 - 2);
                    if (f16) ((hr_fp16 *)(k + (size_t)i * row))[d] = hr_fp32_to_fp16(x);
                    else ((float *)(k + (size_t)i * row))[d] = x;
                }
            for (int d = 0; d < hd; d++) q[d] = (float)(d % 7) * 0.37f - 1.1f;
            for (int i = 0; i < n; i++) p[i] = 1.0f / (float)(i + 1);
            int ok = 1;
            for (int m = 1; m <= n; m += 9) {
                fast->kq(m, hd, 1, q, 0, k, row, f16, s1, 0);
                gen->kq(m, hd, 1, q, 0, k, row, f16, s2, 0);
                ok &= !memcmp(s1, s2, (size_t)m * sizeof(float));
                /* several queries (GQA heads) at once: 2-6, strides wider than a head, against the generic
                   kernel and against one query at a time */
                for (int nq = 2; nq <= 6; nq += 2) {
                    float qq[6 * 136], m1[6 * 80], m2[6 * 80];
                    for (int j = 0; j < nq; j++)
                        for (int d = 0; d < hd; d++) qq[j * 136 + d] = (float)((d + 3 * j) % 9) * 0.29f - 1.2f;
                    fast->kq(m, hd, nq, qq, 136, k, row, f16, m1, 80);
                    gen->kq(m, hd, nq, qq, 136, k, row, f16, m2, 80);
                    for (int j = 0; j < nq; j++) {
                        ok &= !memcmp(m1 + j * 80, m2 + j * 80, (size_t)m * sizeof(float));
                        fast->kq(m, hd, 1, qq + j * 136, 0, k, row, f16, s1, 0);
                        ok &= !memcmp(m1 + j * 80, s1, (size_t)m * sizeof(float));
                    }
                }
                for (int d = 0; d < hd; d++) a1[d] = a2[d] = (float)d * 0.01f;
                fast->kv(m, hd, 1, p, 0, k, row, f16, a1, 0);
                gen->kv(m, hd, 1, p, 0, k, row, f16, a2, 0);
                ok &= !memcmp(a1, a2, (size_t)hd * sizeof(float));
                for (int nq = 2; nq <= 6; nq += 2) { /* several heads' accumulators at once, strided */
                    float pp[6 * 80], b1[6 * 136], b2[6 * 136];
                    for (int j = 0; j < nq; j++)
                        for (int i = 0; i < m; i++) pp[j * 80 + i] = 1.0f / (float)(i + 2 + j);
                    for (int e = 0; e < 6 * 136; e++) b1[e] = b2[e] = (float)(e % 13) * 0.02f;
                    fast->kv(m, hd, nq, pp, 80, k, row, f16, b1, 136);
                    gen->kv(m, hd, nq, pp, 80, k, row, f16, b2, 136);
                    ok &= !memcmp(b1, b2, sizeof b1);
                }
            }
            /* the F16 path's accumulator over tiles of 1..75 positions (F16 data only: NaN payloads may
               differ): rescales of 1 (skipped), 0 (the first position's), and in (0, 1); one head, then
               1-6 heads at once (strided) against the generic kernel and against one head at a time */
            hr_fp16 c1[128], c2[128];
            float ms[75];
            for (int i = 0; i < n; i++) ms[i] = i % 5 == 0 ? 0.75f + 0.003f * (float)i : i % 7 == 3 ? 0.0f : 1.0f;
            for (int d = 0; d < hd; d++) c1[d] = c2[d] = hr_fp32_to_fp16((float)(d % 11) * 0.3f - 1.5f);
            for (int m = 1; f16 && m <= n; m += 9) { /* compared after every call: a zero rescale wipes the past */
                fast->acc16(m, hd, 1, c1, 0, k, row, ms, p, 0);
                gen->acc16(m, hd, 1, c2, 0, k, row, ms, p, 0);
                ok &= !memcmp(c1, c2, (size_t)hd * sizeof(hr_fp16));
            }
            for (int nq = 1; f16 && nq <= 6; nq++) {
                enum { AS = 136, PS = 80 };
                hr_fp16 h1[6 * AS], h2[6 * AS], h3[6 * AS];
                float mm[6 * PS], pp[6 * PS];
                for (int j = 0; j < nq; j++)
                    for (int i = 0; i < n; i++) {
                        mm[j * PS + i] = (i + j) % 4 == 0 ? 0.5f + 0.004f * (float)i : (i * (j + 1)) % 9 == 5 ? 0.0f : 1.0f;
                        pp[j * PS + i] = 1.0f / (float)(i + 1 + 2 * j);
                    }
                for (int e = 0; e < 6 * AS; e++) h1[e] = h2[e] = h3[e] = hr_fp32_to_fp16((float)(e % 13) * 0.2f - 1.1f);
                for (int m = 1; m <= n; m += 12) {
                    fast->acc16(m, hd, nq, h1, AS, k, row, mm, pp, PS);
                    gen->acc16(m, hd, nq, h2, AS, k, row, mm, pp, PS);
                    for (int j = 0; j < nq; j++) fast->acc16(m, hd, 1, h3 + j * AS, 0, k, row, mm + j * PS, pp + j * PS, 0);
                    ok &= !memcmp(h1, h2, sizeof h1) && !memcmp(h1, h3, sizeof h1);
                }
            }
            /* the F16 path's scores: 1-6 heads (q rounded to F16, strided) against the dispatched F16
               vec_dot, score by score */
            for (int nq = 1; f16 && nq <= 6; nq++) {
                hr_fp16 q16[6 * 136];
                float k1[6 * 80], k2[6 * 80];
                for (int j = 0; j < nq; j++)
                    for (int d = 0; d < hd; d++) q16[j * 136 + d] = hr_fp32_to_fp16((float)((d + 5 * j) % 11) * 0.23f - 1.0f);
                for (int m = 1; m <= n; m += 12) {
                    fast->kq16(m, hd, nq, q16, 136, k, row, k1, 80);
                    for (int j = 0; j < nq; j++)
                        for (int i = 0; i < m; i++)
                            hq_get_traits(HQ_TYPE_F16)->vec_dot(hd, &k2[j * 80 + i], k + (size_t)i * row, q16 + j * 136);
                    for (int j = 0; j < nq; j++) ok &= !memcmp(k1 + j * 80, k2 + j * 80, (size_t)m * sizeof(float));
                }
            }
            CHECKF(ok, "attention kernels (hd %d, %s cache) differ from the generic ones", hd, f16 ? "F16" : "F32");
            free(k);
        }
}

/* The softmax's exponential: the dispatched kernel gives hq_expf's bits (in place too, any length, the
   lanes that fall back to expf among the others); hq_expf is within 1 ulp of e^x; and where the C library
   is glibc on an x86-64 CPU with FMA (the build of expf it then runs), it is expf bit for bit. */
static void test_att_exp(void) {
    const hq_att_kernels *fast = hq_get_att(false), *gen = hq_get_att(true);
    if (!is_simd_disabled() && strncmp(hq_simd_name(), "avx", 3) == 0) CHECK(fast->exp != gen->exp);
    enum { N = 1 << 16 };
    static float x[N], y1[N], y2[N];
    const float edge[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-45f, 87.99f, -87.99f, 88.0f, -88.0f, 88.72f, 88.73f,
                          -103.2f, -103.9f, -104.0f, -150.0f, INFINITY, -INFINITY, NAN, -0.5f, -1.0f, -20.0f};
    int n_edge = (int)HR_ARRAY_LEN(edge), bad_kernel = 0, bad_ulp = 0, bad_libc = 0;
    long checked = 0;
    uint64_t rng = 99;
    for (uint64_t u0 = 0; u0 < (1ull << 32); u0 += (uint64_t)N * 61) { /* every 61st bit pattern, in runs */
        for (int i = 0; i < N; i++) {
            const uint32_t b = (uint32_t)(u0 + (uint64_t)i * 61);
            memcpy(&x[i], &b, 4);
        }
        for (int i = 0; i < N / 4; i++) { /* and softmax arguments: (-30, 0], with the edges among them */
            rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
            x[4 * i] = i % 97 < n_edge ? edge[i % 97] : -(float)((double)(rng >> 40) / (double)(1 << 24)) * 30.0f;
        }
        const int n = N - (int)(u0 % 7); /* lengths that leave a tail */
        fast->exp(n, x, y1);
        gen->exp(n, x, y2);
        memcpy(y2 + n, x + n, (size_t)(N - n) * sizeof(float));
        for (int i = 0; i < n; i++) {
            bad_kernel += isnan(y2[i]) ? !isnan(y1[i]) : memcmp(&y1[i], &y2[i], 4) != 0;
            if (fabsf(x[i]) < 87.0f) { /* a normal result: within one ulp of e^x */
                const double e = exp((double)x[i]);
                bad_ulp += fabs((double)y2[i] - e) > (double)(nextafterf((float)e, INFINITY) - (float)e);
            }
#if defined(__GLIBC__) && defined(__x86_64__)
            if (__builtin_cpu_supports("fma")) {
                const float l = expf(x[i]);
                bad_libc += isnan(l) ? !isnan(y2[i]) : memcmp(&l, &y2[i], 4) != 0;
            }
#endif
            checked++;
        }
        memcpy(y1, x, sizeof x); /* in place */
        fast->exp(n, y1, y1);
        for (int i = 0; i < n; i++) bad_kernel += isnan(y2[i]) ? !isnan(y1[i]) : memcmp(&y1[i], &y2[i], 4) != 0;
    }
    CHECKF(checked > 70000000 && bad_kernel == 0, "dispatched exp differs from hq_expf at %d of %ld", bad_kernel, checked);
    CHECKF(bad_ulp == 0, "hq_expf more than 1 ulp from e^x at %d of %ld", bad_ulp, checked);
    CHECKF(bad_libc == 0, "hq_expf differs from glibc's expf at %d of %ld", bad_libc, checked);
}

/* The FFN gate: the dispatched silu(g) * u against expf's, over the range gates take and its edges. */
static void test_silu_mul(void) {
    hq_silu_mul_fn fast = hq_get_silu_mul(false), gen = hq_get_silu_mul(true);
    enum { N = 4099 }; /* not a multiple of 8: the tail too */
    static float g1[N], g2[N], u[N];
    uint64_t rng = 777;
    for (int i = 0; i < N; i++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        const float r = (float)((double)(rng >> 40) / (double)(1 << 24)); /* [0, 1) */
        g1[i] = i < 2048 ? (r * 2 - 1) * 8 : (r * 2 - 1) * 80; /* most gates are small */
        u[i] = 0.5f + r;
    }
    g1[0] = 0.0f, g1[1] = -0.0f, g1[2] = 1e-30f, g1[3] = 87.5f, g1[4] = 200.0f, g1[5] = NAN;
    memcpy(g2, g1, sizeof g1);
    fast(N, g1, u);
    gen(N, g2, u);
    double worst = 0; /* in ulps of the expf result */
    int bad = 0;
    for (int i = 0; i < N; i++) {
        if (isnan(g2[i])) { bad += !isnan(g1[i]); continue; }
        const double ulp = fmax(fabs((double)g2[i]) * 0x1p-23, 0x1p-149);
        worst = fmax(worst, fabs((double)g1[i] - g2[i]) / ulp);
    }
    printf("  silu_mul (%s) vs expf: worst %.2f ulp over %d gates in [-80, 80]\n", hq_simd_name(), worst, N);
    CHECKF(bad == 0, "silu_mul: %d NaN gates lost", bad);
    CHECKF(worst <= 4.0, "silu_mul: %.2f ulp from the expf version", worst);
}

/* ---- main --------------------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    bool reexec = true;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--no-reexec")) reexec = false;
    hr_init();
    printf("test-quant (%s kernels%s)\n", hq_simd_name(), is_simd_disabled() ? ", HEARTH_NO_SIMD" : "");
    test_dispatch();
    test_layout();
    test_roundtrip();
    test_from_float();
    test_f16_rows();
    test_vec_dot();
    test_gemm();
    test_gemm_large();
    test_packed();
    test_attention();
    test_att_exp();
    test_silu_mul();
    if (reexec && !strcmp(hq_simd_name(), "avx512")) test_rerun_with(argv[0], "HEARTH_NO_AVX512");
    if (reexec && !is_simd_disabled()) test_rerun_with(argv[0], "HEARTH_NO_SIMD");
    return test_summary();
}
