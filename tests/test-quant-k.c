// modules: base quant
/* test-quant-k: the K-quants (Q2_K..Q6_K and the Q8_K activations).
 *   - quantize -> dequantize error per type on Gaussian data, within bounds its bits allow
 *   - a hand-built block per type, its values computed here from the layout (not via quants-k-ref.c)
 *   - the dispatched (SIMD) dot products and tile kernels against the reference ones
 *   - the SIMD Q8_K quantizer gives the reference's bytes
 *   - real llama.cpp-quantized tensors (../shared/models/synth) dequantize to the F16 file's weights
 * Runs in a few seconds; also meant to be run with HEARTH_NO_SIMD=1.  tools/kbench measures the
 * kernels' speed (-T Q4_K,Q6_K,...). */
#include "quant/quant-impl.h"
#include "test.h"

#include <math.h>

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng_u64(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float rng_unit(void) { return (float)((rng_u64() >> 40) + 0.5) / (float)(1 << 24); } /* (0,1) */
static float rng_gauss(void) {
    const float u = rng_unit(), v = rng_unit();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

/* REQUIRE for void helpers: count the failure and leave the helper */
#define NEED(x) do { if (!(x)) { CHECK(x); return; } } while (0)

static const int ktypes[] = {HQ_TYPE_Q2_K, HQ_TYPE_Q3_K, HQ_TYPE_Q4_K, HQ_TYPE_Q5_K, HQ_TYPE_Q6_K};
#define N_KTYPES 5

/* relative RMS error of b against a */
static double rel_rms(const float *a, const float *b, int64_t n) {
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)a[i] * a[i];
    }
    return s > 0 ? sqrt(e / s) : sqrt(e);
}

/* ---- quantization error --------------------------------------------------------------------------- */

/* Bounds for N(0,1) data, 64 super-blocks. Measured with this quantizer (gcc 12, x86-64 and
   AArch64 alike): Q2_K 0.2747, Q3_K 0.1467, Q4_K 0.0719, Q5_K 0.0358, Q6_K 0.0175 -- each bit
   halves the error, as it should, and llama.cpp's quantizers give about the same on the synth
   models (test_real_files). The limits leave ~10% headroom, so a real regression in the scale
   search fails. */
static void test_roundtrip(void) {
    static const double bound[N_KTYPES] = {0.29, 0.165, 0.078, 0.039, 0.0195};
    /* a 15-sigma outlier coarsens the grid of its sub-block; measured 0.2775 0.1670 0.0801 0.0398 0.0226 */
    static const double obound[N_KTYPES] = {0.305, 0.185, 0.088, 0.044, 0.025};
    const int64_t n = 64 * QK_K;
    float *x = malloc(n * sizeof(float)), *r = malloc(n * sizeof(float));
    void *q = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) x[i] = rng_gauss();
    for (int t = 0; t < N_KTYPES; t++) {
        const hq_traits *tr = hq_get_traits(ktypes[t]);
        NEED(tr && tr->from_float_ref && tr->to_float);
        tr->from_float_ref(x, q, n);
        tr->to_float(q, r, n);
        const double e = rel_rms(x, r, n);
        printf("  %-5s quantize_ref -> dequantize rel RMS error %.4f (bound %.4f)\n", tr->name, e, bound[t]);
        CHECKF(e < bound[t], "%s: %.4f", tr->name, e);
    }
    /* Gaussian data scaled like real weights (std 0.02), with outliers and an all-zero block */
    for (int64_t i = 0; i < n; i++) x[i] = 0.02f * rng_gauss() + (i % 997 == 0 ? 0.3f : 0.0f);
    for (int i = 0; i < QK_K; i++) x[5 * QK_K + i] = 0;
    for (int t = 0; t < N_KTYPES; t++) {
        const hq_traits *tr = hq_get_traits(ktypes[t]);
        tr->from_float_ref(x, q, n);
        tr->to_float(q, r, n);
        bool zero_ok = true;
        for (int i = 0; i < QK_K; i++) zero_ok = zero_ok && r[5 * QK_K + i] == 0;
        CHECKF(zero_ok, "%s: all-zero block does not come back as zeros", tr->name);
        const double e = rel_rms(x, r, n);
        printf("  %-5s same, std 0.02 with outliers: %.4f (bound %.4f)\n", tr->name, e, obound[t]);
        CHECKF(e < obound[t], "%s (std 0.02 + outliers): %.4f", tr->name, e);
    }
    free(x), free(r), free(q);
}

/* ---- hand-built blocks ---------------------------------------------------------------------------
   Each block is written field by field from the layout as ggml documents it and dequantized here
   with loops written in ggml's order (sequential over the packed bytes); the reference dequantizer
   indexes differently, so a shared misunderstanding would have to be made twice. d = 1, dmin = 0.5
   (exact in fp16), so the expected values are exact. */

static const hr_fp16 FP16_ONE = 0x3C00, FP16_HALF = 0x3800;

static int check_block(const char *name, int type, const void *blk, const float *expect) {
    float got[QK_K];
    hq_get_traits(type)->to_float(blk, got, QK_K);
    int bad = 0;
    for (int i = 0; i < QK_K; i++)
        if (got[i] != expect[i]) {
            if (bad < 4) fprintf(stderr, "  %s: value %d: got %g, expected %g\n", name, i, got[i], expect[i]);
            bad++;
        }
    CHECKF(bad == 0, "%s hand-built block: %d values differ", name, bad);
    return bad;
}

static void test_hand_q2_K(void) {
    block_q2_K b;
    uint8_t sc[16], mn[16];
    for (int j = 0; j < 16; j++) { sc[j] = (uint8_t)((j * 7 + 3) & 15); mn[j] = (uint8_t)((j * 5 + 1) & 15); }
    for (int j = 0; j < 16; j++) b.scales[j] = (uint8_t)(sc[j] | (mn[j] << 4));
    for (int i = 0; i < 64; i++) b.qs[i] = (uint8_t)(i * 37 + 11);
    b.d = FP16_ONE, b.dmin = FP16_HALF;
    float ex[QK_K], *y = ex;
    int is = 0;
    for (int half = 0; half < 2; half++) {
        const uint8_t *q = b.qs + 32 * half;
        for (int shift = 0; shift < 8; shift += 2) {
            for (int part = 0; part < 2; part++, is++)
                for (int l = 0; l < 16; l++) *y++ = (float)sc[is] * ((q[16 * part + l] >> shift) & 3) - 0.5f * mn[is];
        }
    }
    check_block("Q2_K", HQ_TYPE_Q2_K, &b, ex);
}

static void test_hand_q3_K(void) {
    block_q3_K b;
    int sc[16]; /* signed, -32..31 */
    for (int j = 0; j < 16; j++) sc[j] = ((j * 13 + 5) % 64) - 32;
    /* 6-bit scales: low nibbles of scales 0-7 in bytes 0-7, of 8-15 in the high nibbles of bytes
       0-7; top two bits of scale j in byte 8 + j%4 at bit 2*(j/4) */
    memset(b.scales, 0, 12);
    for (int j = 0; j < 16; j++) {
        const int u = sc[j] + 32;
        if (j < 8) b.scales[j] |= (uint8_t)(u & 15);
        else b.scales[j - 8] |= (uint8_t)((u & 15) << 4);
        b.scales[8 + j % 4] |= (uint8_t)((u >> 4) << (2 * (j / 4)));
    }
    for (int i = 0; i < 32; i++) b.hmask[i] = (uint8_t)(i * 29 + 7);
    for (int i = 0; i < 64; i++) b.qs[i] = (uint8_t)(i * 53 + 17);
    b.d = FP16_ONE;
    float ex[QK_K], *y = ex;
    int is = 0;
    uint8_t m = 1;
    for (int half = 0; half < 2; half++) {
        const uint8_t *q = b.qs + 32 * half;
        for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
            for (int part = 0; part < 2; part++, is++)
                for (int l = 0; l < 16; l++) {
                    const int lo = (q[16 * part + l] >> shift) & 3;
                    const int v = lo - ((b.hmask[16 * part + l] & m) ? 0 : 4);
                    *y++ = (float)sc[is] * (float)v;
                }
        }
    }
    check_block("Q3_K", HQ_TYPE_Q3_K, &b, ex);
}

/* 6-bit scales/mins of Q4_K/Q5_K: j < 4 in the low 6 bits of bytes j / j+4; j >= 4: low nibble
   in byte j+4 (scale: low nibble, min: high nibble), top 2 bits in bits 6-7 of bytes j-4 / j */
static void pack_k4_scales(uint8_t *s, const uint8_t *sc, const uint8_t *mn) {
    memset(s, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            s[j] |= sc[j];
            s[j + 4] |= mn[j];
        } else {
            s[j + 4] = (uint8_t)((sc[j] & 15) | ((mn[j] & 15) << 4));
            s[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            s[j] |= (uint8_t)((mn[j] >> 4) << 6);
        }
    }
}

static void test_hand_q4_K(void) {
    block_q4_K b;
    const uint8_t sc[8] = {1, 63, 17, 32, 48, 5, 60, 33}, mn[8] = {62, 0, 19, 47, 16, 63, 2, 31};
    pack_k4_scales(b.scales, sc, mn);
    for (int i = 0; i < 128; i++) b.qs[i] = (uint8_t)(i * 71 + 3);
    b.d = FP16_ONE, b.dmin = FP16_HALF;
    float ex[QK_K], *y = ex;
    for (int c = 0; c < 4; c++) {
        for (int l = 0; l < 32; l++) *y++ = (float)sc[2 * c] * (b.qs[32 * c + l] & 15) - 0.5f * mn[2 * c];
        for (int l = 0; l < 32; l++) *y++ = (float)sc[2 * c + 1] * (b.qs[32 * c + l] >> 4) - 0.5f * mn[2 * c + 1];
    }
    check_block("Q4_K", HQ_TYPE_Q4_K, &b, ex);
}

static void test_hand_q5_K(void) {
    block_q5_K b;
    const uint8_t sc[8] = {7, 50, 63, 1, 36, 12, 44, 20}, mn[8] = {3, 63, 8, 40, 55, 1, 27, 16};
    pack_k4_scales(b.scales, sc, mn);
    for (int i = 0; i < 128; i++) b.qs[i] = (uint8_t)(i * 97 + 41);
    for (int i = 0; i < 32; i++) b.qh[i] = (uint8_t)(i * 23 + 99);
    b.d = FP16_ONE, b.dmin = FP16_HALF;
    float ex[QK_K], *y = ex;
    uint8_t u1 = 1, u2 = 2;
    for (int c = 0; c < 4; c++, u1 <<= 2, u2 <<= 2) {
        for (int l = 0; l < 32; l++)
            *y++ = (float)sc[2 * c] * ((b.qs[32 * c + l] & 15) + ((b.qh[l] & u1) ? 16 : 0)) - 0.5f * mn[2 * c];
        for (int l = 0; l < 32; l++)
            *y++ = (float)sc[2 * c + 1] * ((b.qs[32 * c + l] >> 4) + ((b.qh[l] & u2) ? 16 : 0)) - 0.5f * mn[2 * c + 1];
    }
    check_block("Q5_K", HQ_TYPE_Q5_K, &b, ex);
}

static void test_hand_q6_K(void) {
    block_q6_K b;
    for (int j = 0; j < 16; j++) b.scales[j] = (int8_t)(j * 19 - 128 + (j == 15 ? 110 : 0)); /* -128..127 */
    for (int i = 0; i < 128; i++) b.ql[i] = (uint8_t)(i * 83 + 29);
    for (int i = 0; i < 64; i++) b.qh[i] = (uint8_t)(i * 45 + 77);
    b.d = FP16_ONE;
    float ex[QK_K];
    for (int half = 0; half < 2; half++) {
        const uint8_t *ql = b.ql + 64 * half, *qh = b.qh + 32 * half;
        const int8_t *s = b.scales + 8 * half;
        float *y = ex + 128 * half;
        for (int l = 0; l < 32; l++) {
            const int is = l / 16;
            y[l] = (float)s[is] * (((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32);
            y[l + 32] = (float)s[is + 2] * (((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
            y[l + 64] = (float)s[is + 4] * (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            y[l + 96] = (float)s[is + 6] * (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
    check_block("Q6_K", HQ_TYPE_Q6_K, &b, ex);
}

/* Q8_K on values with a known answer: max |x| = 2.54 at a negative value, so iscale = 50 and
   every q is exact */
static void test_hand_q8_K(void) {
    float x[QK_K];
    for (int i = 0; i < QK_K; i++) x[i] = (float)((i * 7) % 255 - 127) / 50.0f;
    x[3] = -2.54f;
    for (int i = 0; i < QK_K; i++)
        if (i != 3 && fabsf(x[i]) >= 2.54f) x[i] = 2.5f;
    block_q8_K b;
    hq_quantize_ref_q8_K(x, &b, QK_K);
    CHECK(fabsf(b.d - 2.54f / 127.0f) < 1e-8f);
    int bad = 0;
    for (int i = 0; i < QK_K; i++)
        if (b.qs[i] != (int)lrintf(x[i] * 50.0f)) bad++;
    CHECKF(bad == 0, "Q8_K: %d values differ", bad);
    bool sums_ok = true;
    for (int j = 0; j < 16; j++) {
        int s = 0;
        for (int i = 0; i < 16; i++) s += b.qs[16 * j + i];
        sums_ok = sums_ok && b.bsums[j] == s;
    }
    CHECK(sums_ok);
}

/* ---- SIMD against reference ----------------------------------------------------------------------- */

/* random weight row of nb blocks of type t (quantized Gaussian data, so scales are realistic) and
   a Q8_K activation row */
static void make_rows(const hq_traits *tr, int nb, void *w, void *a, float *wf, float *af) {
    const int n = nb * QK_K;
    for (int i = 0; i < n; i++) wf[i] = rng_gauss() * (1.0f + (float)(i / QK_K));
    for (int i = 0; i < n; i++) af[i] = rng_gauss();
    tr->from_float_ref(wf, w, n);
    hq_quantize_ref_q8_K(af, a, n);
}

/* the scale of a dot product's terms: |w|_2 * |a|_2 bounds it (Cauchy-Schwarz); float rounding
   differences are a small multiple of 2^-24 of that */
static double dot_norm(const float *w, const float *a, int n) {
    double sw = 0, sa = 0;
    for (int i = 0; i < n; i++) sw += (double)w[i] * w[i], sa += (double)a[i] * a[i];
    return sqrt(sw * sa) + 1e-30;
}

static void test_vec_dot(void) {
    const int maxb = 16, maxn = maxb * QK_K;
    void *w = malloc((size_t)maxb * sizeof(block_q6_K) * 2), *a = malloc((size_t)maxb * sizeof(block_q8_K));
    float *wf = malloc(maxn * sizeof(float)), *af = malloc(maxn * sizeof(float));
    float *wd = malloc(maxn * sizeof(float)), *ad = malloc(maxn * sizeof(float));
    for (int t = 0; t < N_KTYPES; t++) {
        const hq_traits *tr = hq_get_traits(ktypes[t]);
        NEED(tr->vec_dot_type == HQ_TYPE_Q8_K);
        double worst_simd = 0, worst_float = 0;
        for (int nb = 1; nb <= maxb; nb++) {
            const int n = nb * QK_K;
            make_rows(tr, nb, w, a, wf, af);
            float s_ref = 0, s_fast = 0;
            tr->vec_dot_ref(n, &s_ref, w, a);
            tr->vec_dot(n, &s_fast, w, a);
            /* the exact dot of what the blocks hold, in double */
            tr->to_float(w, wd, n);
            hq_dequantize_ref_q8_K(a, ad, n);
            double exact = 0;
            for (int i = 0; i < n; i++) exact += (double)wd[i] * ad[i];
            const double norm = dot_norm(wd, ad, n);
            worst_simd = fmax(worst_simd, fabs((double)s_fast - s_ref) / norm);
            worst_float = fmax(worst_float, fabs((double)s_ref - exact) / norm);
        }
        /* the reference sums integers exactly; the SIMD kernels convert per-block integer sums to
           float and accumulate in float: error ~ nb * 2^-24 relative to the terms (measured <= 1.4e-8
           on AVX2 and NEON); a wrong scale or bit anywhere gives > 1e-3 */
        printf("  %-5s vec_dot vs ref: worst %.2g; ref vs float dot of dequantized: worst %.2g\n", tr->name,
               worst_simd, worst_float);
        CHECKF(worst_simd < 2e-7, "%s: vec_dot vs vec_dot_ref rel error %.3g", tr->name, worst_simd);
        CHECKF(worst_float < 1e-7, "%s: vec_dot_ref vs dequantized float dot rel error %.3g", tr->name, worst_float);
    }
    free(w), free(a), free(wf), free(af), free(wd), free(ad);
}

static void test_q8_K_from_float(void) {
    const hq_traits *tr = hq_get_traits(HQ_TYPE_Q8_K);
    NEED(tr && tr->from_float && tr->from_float_ref);
    const int nb = 48, n = nb * QK_K;
    float *x = malloc(n * sizeof(float));
    block_q8_K *r = malloc(nb * sizeof(block_q8_K)), *f = malloc(nb * sizeof(block_q8_K));
    for (int i = 0; i < n; i++) x[i] = rng_gauss() * (float)(1 + i / QK_K) * 0.37f;
    /* edge cases: a zero block; the largest magnitude at both signs (first one wins); a positive
       maximum; a block of equal values; values that land exactly on .5 after scaling */
    for (int i = 0; i < QK_K; i++) x[1 * QK_K + i] = 0;
    x[2 * QK_K + 10] = 50.0f, x[2 * QK_K + 200] = -50.0f;
    x[3 * QK_K + 7] = -50.0f, x[3 * QK_K + 8] = 50.0f;
    x[4 * QK_K + 255] = 99.0f;
    for (int i = 0; i < QK_K; i++) x[5 * QK_K + i] = -1.25f;
    for (int i = 0; i < QK_K; i++) x[6 * QK_K + i] = (float)(i - 128) * 0.5f + (i == 0 ? -0.5f : 0.0f);
    x[7 * QK_K + 31] = 1e-30f;
    /* denormals under a tiny maximum (below ~4e-37 the scale 127/max overflows, in ggml too) */
    for (int i = 0; i < QK_K; i++) x[8 * QK_K + i] = (i & 1) ? 3e-39f : -1e-38f;
    x[8 * QK_K + 77] = -1e-35f;
    tr->from_float_ref(x, r, n);
    tr->from_float(x, f, n);
    int bad = 0;
    for (int b = 0; b < nb; b++)
        if (memcmp(&r[b], &f[b], sizeof r[b]) != 0) {
            if (bad < 3) fprintf(stderr, "  Q8_K from_float: block %d differs (d %g vs %g)\n", b, r[b].d, f[b].d);
            bad++;
        }
    CHECKF(bad == 0, "Q8_K from_float vs reference: %d of %d blocks differ", bad, nb);
    free(x), free(r), free(f);
}

static void test_gemm(void) {
    const int nb = 3, n = nb * QK_K, maxr = 7;
    for (int t = 0; t < N_KTYPES; t++) {
        const hq_traits *tr = hq_get_traits(ktypes[t]);
        NEED(tr->gemm);
        const size_t bx = tr->type_size * nb + 8, by = sizeof(block_q8_K) * nb + 4; /* odd strides */
        char *x = malloc(bx * maxr), *y = malloc(by * maxr);
        float *wf = malloc(n * sizeof(float)), *af = malloc(n * sizeof(float));
        for (int i = 0; i < maxr; i++) make_rows(tr, nb, x + i * bx, y + i * by, wf, af);
        double worst = 0;
        int stray = 0;
        for (int nr = 1; nr <= maxr; nr++)
            for (int nc = 1; nc <= maxr; nc++) {
                const size_t lds = (size_t)nr + 3;
                float s[(7 + 3) * 7];
                for (size_t i = 0; i < HR_ARRAY_LEN(s); i++) s[i] = -999.0f;
                tr->gemm(n, s, lds, x, bx, nr, y, by, nc);
                for (int j = 0; j < nc; j++)
                    for (int i = 0; i < (int)lds; i++) {
                        if (i >= nr) { stray += s[j * lds + i] != -999.0f; continue; }
                        float ref = 0;
                        tr->vec_dot(n, &ref, x + i * bx, y + j * by);
                        worst = fmax(worst, fabs((double)s[j * lds + i] - ref) / (fabs(ref) + 1.0));
                    }
            }
        CHECKF(worst < 1e-5, "%s: gemm vs vec_dot loop rel error %.3g", tr->name, worst);
        CHECKF(stray == 0, "%s: gemm wrote %d values outside the tile", tr->name, stray);
        free(x), free(y), free(wf), free(af);
    }
}

/* More weight rows than one call's group of 4 and one engine tile (16), a short last group, and
   activation row counts that leave columns over */
static void test_gemm_large(void) {
    enum { NB = 11, MAXR = 22, MAXC = 6 }; /* 11 super-blocks: prefill chunks of 8 plus 3 */
    const int n = NB * QK_K, rows[] = {16, 22}, cols[] = {1, 6};
    for (int t = 0; t < N_KTYPES; t++) {
        const hq_traits *tr = hq_get_traits(ktypes[t]);
        NEED(tr->gemm);
        const size_t bx = tr->type_size * NB, by = sizeof(block_q8_K) * NB;
        char *x = malloc(bx * MAXR), *y = malloc(by * MAXR);
        float *wf = malloc(n * sizeof(float)), *af = malloc(n * sizeof(float));
        float *s = malloc(MAXR * MAXC * sizeof(float)), *wd = malloc(n * sizeof(float)), *ad = malloc(n * sizeof(float));
        double wn[MAXR], an[MAXR];
        NEED(x && y && wf && af && s && wd && ad);
        for (int i = 0; i < MAXR; i++) {
            make_rows(tr, NB, x + i * bx, y + i * by, wf, af);
            tr->to_float(x + i * bx, wd, n);
            hq_dequantize_ref_q8_K(y + i * by, ad, n);
            wn[i] = dot_norm(wd, wd, n), an[i] = dot_norm(ad, ad, n); /* squared norms */
        }
        double worst = 0;
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++) {
                const int nr = rows[a], nc = cols[b];
                tr->gemm(n, s, MAXR, x, bx, nr, y, by, nc);
                for (int j = 0; j < nc; j++)
                    for (int i = 0; i < nr; i++) {
                        float ref = 0;
                        tr->vec_dot(n, &ref, x + i * bx, y + j * by);
                        worst = fmax(worst, fabs((double)s[j * MAXR + i] - ref) / sqrt(wn[i] * an[j]));
                    }
            }
        /* relative to |w| |a| as in test_vec_dot: float summation order only (~nb * 2^-24) */
        printf("  %-5s gemm (nr up to %d, nc up to %d) vs vec_dot: worst %.2g\n", tr->name, MAXR, MAXC, worst);
        CHECKF(worst < 1e-6, "%s: large gemm vs vec_dot loop rel error %.3g", tr->name, worst);
        free(x), free(y), free(wf), free(af), free(s), free(wd), free(ad);
    }
}

/* The AVX-512 bodies promise the AVX2 kernels' results bit for bit (quants-k512.c).  Blocks of
   random bytes (every code, scale, min and high-bit pattern, scales of -128 included) with finite
   d / dmin; decode (nc 1) and prefill tiles (nc 2-6, up to 22 rows: a tile of 16 and a rest),
   along K of 1-11 super-blocks (prefill chunks of 8 plus a rest). */
static void test_avx512_vs_avx2(void) {
#if defined(HEARTH_ARCH_X86)
    __builtin_cpu_init();
    if (strcmp(hq_simd_name(), "avx512") != 0) {
        printf("  AVX-512 vs AVX2: not run (kernels: %s)\n", hq_simd_name());
        return;
    }
    typedef void (*gemm_fn)(int, float *restrict, size_t, const void *restrict, size_t, int, const void *restrict,
                            size_t, int);
    const struct { int type; gemm_fn a2, a5; size_t doff, moff; } k[] = {
        {HQ_TYPE_Q4_K, hq_gemm_avx2_q4_K, hq_gemm_avx512_q4_K, offsetof(block_q4_K, d), offsetof(block_q4_K, dmin)},
        {HQ_TYPE_Q5_K, hq_gemm_avx2_q5_K, hq_gemm_avx512_q5_K, offsetof(block_q5_K, d), offsetof(block_q5_K, dmin)},
        {HQ_TYPE_Q6_K, hq_gemm_avx2_q6_K, hq_gemm_avx512_q6_K, offsetof(block_q6_K, d), offsetof(block_q6_K, d)},
    };
    enum { NB = 11, MAXR = 22, MAXC = 6 };
    for (size_t t = 0; t < HR_ARRAY_LEN(k); t++) {
        const hq_traits *tr = hq_get_traits(k[t].type);
        NEED(tr->gemm == k[t].a5);
        const size_t bx = tr->type_size * NB, by = sizeof(block_q8_K) * NB;
        uint8_t *x = malloc(bx * MAXR), *y = malloc(by * MAXC);
        float *s2 = malloc(MAXR * MAXC * sizeof(float)), *s5 = malloc(MAXR * MAXC * sizeof(float));
        NEED(x && y && s2 && s5);
        for (size_t i = 0; i < bx * MAXR; i++) x[i] = (uint8_t)rng_u64();
        for (int b = 0; b < NB * MAXR; b++) { /* d, dmin: random finite fp16 in about [2^-14, 2) */
            uint8_t *blk = x + (size_t)b * tr->type_size;
            const hr_fp16 d = (hr_fp16)(0x0400 + rng_u64() % 0x3800), m = (hr_fp16)(0x0400 + rng_u64() % 0x3800);
            memcpy(blk + k[t].doff, &d, 2);
            if (k[t].moff != k[t].doff) memcpy(blk + k[t].moff, &m, 2);
        }
        float *af = malloc(NB * QK_K * sizeof(float));
        NEED(af);
        for (int c = 0; c < MAXC; c++) {
            for (int i = 0; i < NB * QK_K; i++) af[i] = rng_gauss();
            af[c] = c & 1 ? -30.0f : 30.0f; /* an activation of -127 or 127 */
            hq_quantize_ref_q8_K(af, y + (size_t)c * by, NB * QK_K);
        }
        static const int rows[] = {1, 2, 3, 4, 5, 16, 17, 22};
        int differ = 0, calls = 0;
        for (int nb = 1; nb <= NB; nb += 2)
            for (size_t r = 0; r < HR_ARRAY_LEN(rows); r++)
                for (int nc = 1, nr = rows[r]; nc <= MAXC; nc++, calls++) {
                    memset(s2, 0, MAXR * MAXC * sizeof(float)), memset(s5, 0xff, MAXR * MAXC * sizeof(float));
                    k[t].a2(nb * QK_K, s2, MAXR, x, bx, nr, y, by, nc);
                    k[t].a5(nb * QK_K, s5, MAXR, x, bx, nr, y, by, nc);
                    for (int j = 0; j < nc; j++) differ += memcmp(s2 + j * MAXR, s5 + j * MAXR, nr * sizeof(float)) != 0;
                }
        printf("  %-5s AVX-512 vs AVX2: %d calls, %d columns differ\n", tr->name, calls, differ);
        CHECKF(differ == 0, "%s: AVX-512 gemm differs from AVX2 in %d columns", tr->name, differ);
        free(x), free(y), free(s2), free(s5), free(af);
    }
#endif
}

/* With SIMD on, every K type must get its SIMD kernel: a misnamed kernel would otherwise fall
   back to the reference silently (the table refers to kernels by weak symbol). */
static void test_dispatch(void) {
    printf("  kernels: %s\n", hq_simd_name());
    const char *no_simd = getenv("HEARTH_NO_SIMD");
    const bool off = no_simd && *no_simd && strcmp(no_simd, "0") != 0;
    bool expect = false;
#if defined(HEARTH_ARCH_X86)
    __builtin_cpu_init();
    expect = !off && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#elif defined(HEARTH_ARCH_ARM)
    expect = !off;
#endif
    if (!expect) return;
    for (int t = 0; t < N_KTYPES; t++) {
        const hq_traits *tr = hq_get_traits(ktypes[t]);
        CHECKF(tr->vec_dot != tr->vec_dot_ref, "%s: SIMD vec_dot not picked (misnamed kernel?)", tr->name);
    }
    const hq_traits *q8 = hq_get_traits(HQ_TYPE_Q8_K);
    CHECKF(q8->from_float != q8->from_float_ref, "Q8_K: SIMD quantizer not picked");
}

/* ---- real files: llama.cpp's quantization of the synth models against their F16 weights ---------
   A minimal walk over GGUF v2/v3 (the project's gguf module is tested on its own); every read is
   bounds-checked because a damaged file should fail the test, not crash it. */

typedef struct { const uint8_t *p, *end; bool bad; } rd;
static uint64_t rd_u(rd *r, int n) {
    if (r->bad || r->end - r->p < n) { r->bad = true; return 0; }
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)r->p[i] << (8 * i);
    r->p += n;
    return v;
}
static void rd_skip(rd *r, uint64_t n) {
    if (r->bad || (uint64_t)(r->end - r->p) < n) { r->bad = true; return; }
    r->p += n;
}
static void rd_value(rd *r, uint32_t type, int depth) {
    static const int size[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type == 8) rd_skip(r, rd_u(r, 8));
    else if (type == 9 && depth == 0) {
        const uint32_t et = (uint32_t)rd_u(r, 4);
        const uint64_t cnt = rd_u(r, 8);
        if (et == 8 || et == 9) {
            for (uint64_t i = 0; i < cnt && !r->bad; i++) rd_value(r, et, 1);
        } else if (et < 13 && cnt <= (uint64_t)(r->end - r->p)) {
            rd_skip(r, cnt * (uint64_t)size[et]);
        } else r->bad = true;
    } else if (type < 13 && size[type]) rd_skip(r, (uint64_t)size[type]);
    else r->bad = true;
}

typedef struct { char name[96]; int type; int64_t ne; const void *data; } gg_tensor;

/* bytes of n elements of a ggml type, from the block structs (not from the dispatch table, so
   this walk does not depend on the other types' kernels); 0 if unknown or not whole blocks */
static size_t gg_size(int type, int64_t n) {
    size_t blk = 1, sz = 0;
    switch (type) {
    case HQ_TYPE_F32: sz = 4; break;
    case HQ_TYPE_F16: case HQ_TYPE_BF16: sz = 2; break;
    case HQ_TYPE_Q4_0: blk = 32, sz = sizeof(block_q4_0); break;
    case HQ_TYPE_Q4_1: blk = 32, sz = sizeof(block_q4_1); break;
    case HQ_TYPE_Q5_0: blk = 32, sz = sizeof(block_q5_0); break;
    case HQ_TYPE_Q5_1: blk = 32, sz = sizeof(block_q5_1); break;
    case HQ_TYPE_Q8_0: blk = 32, sz = sizeof(block_q8_0); break;
    case HQ_TYPE_Q2_K: blk = QK_K, sz = sizeof(block_q2_K); break;
    case HQ_TYPE_Q3_K: blk = QK_K, sz = sizeof(block_q3_K); break;
    case HQ_TYPE_Q4_K: blk = QK_K, sz = sizeof(block_q4_K); break;
    case HQ_TYPE_Q5_K: blk = QK_K, sz = sizeof(block_q5_K); break;
    case HQ_TYPE_Q6_K: blk = QK_K, sz = sizeof(block_q6_K); break;
    default: return 0;
    }
    return n % (int64_t)blk ? 0 : (size_t)(n / (int64_t)blk) * sz;
}

/* tensors of a GGUF image (at most cap); returns the count or -1 */
static int gg_tensors(const uint8_t *buf, size_t size, gg_tensor *out, int cap) {
    rd r = {buf, buf + size, false};
    if (rd_u(&r, 4) != 0x46554747u) return -1;
    const uint32_t version = (uint32_t)rd_u(&r, 4);
    if (version < 2 || version > 3) return -1;
    const uint64_t nt = rd_u(&r, 8), nkv = rd_u(&r, 8);
    uint64_t align = 32;
    for (uint64_t i = 0; i < nkv && !r.bad; i++) {
        const uint64_t kl = rd_u(&r, 8);
        const uint8_t *key = r.p;
        rd_skip(&r, kl);
        const uint32_t type = (uint32_t)rd_u(&r, 4);
        if (!r.bad && type == 4 && kl == 17 && !memcmp(key, "general.alignment", 17)) {
            align = rd_u(&r, 4);
            continue;
        }
        rd_value(&r, type, 0);
    }
    if (r.bad || nt > (uint64_t)cap || align == 0) return -1;
    uint64_t offs[512];
    if (nt > HR_ARRAY_LEN(offs)) return -1;
    for (uint64_t i = 0; i < nt && !r.bad; i++) {
        const uint64_t nl = rd_u(&r, 8);
        if (nl >= sizeof out[i].name || (uint64_t)(r.end - r.p) < nl) return -1;
        memcpy(out[i].name, r.p, nl);
        out[i].name[nl] = 0;
        r.p += nl;
        const uint32_t nd = (uint32_t)rd_u(&r, 4);
        if (nd < 1 || nd > 4) return -1;
        int64_t ne = 1;
        for (uint32_t d = 0; d < nd; d++) {
            const uint64_t v = rd_u(&r, 8);
            if (v == 0 || v > (1u << 30) || ne > (INT64_C(1) << 40) / (int64_t)v) return -1;
            ne *= (int64_t)v;
        }
        out[i].type = (int)rd_u(&r, 4);
        out[i].ne = ne;
        offs[i] = rd_u(&r, 8);
    }
    if (r.bad) return -1;
    const uint64_t start = ((uint64_t)(r.p - buf) + align - 1) / align * align;
    for (uint64_t i = 0; i < nt; i++) {
        const size_t rs = gg_size(out[i].type, out[i].ne);
        if (!rs || start + offs[i] > size || size - (start + offs[i]) < rs) return -1;
        out[i].data = buf + start + offs[i];
    }
    return (int)nt;
}

static void test_real_files(void) {
    const char *shared = getenv("HEARTH_SHARED");
    if (!shared) shared = "../shared";
    static const struct { const char *file; int type; double bound; } files[] = {
        /* llama.cpp's quantizers on N(0, 0.02) weights give (worst tensor) 0.297 0.151 0.0715 0.0362
           0.0178; a layout error gives ~1 */
        {"synth-llama-Q2_K.gguf", HQ_TYPE_Q2_K, 0.33},   {"synth-llama-Q3_K_M.gguf", HQ_TYPE_Q3_K, 0.17},
        {"synth-llama-Q4_K_M.gguf", HQ_TYPE_Q4_K, 0.08}, {"synth-llama-Q5_K_M.gguf", HQ_TYPE_Q5_K, 0.04},
        {"synth-llama-Q6_K.gguf", HQ_TYPE_Q6_K, 0.02},
    };
    size_t fsize;
    uint8_t *fbuf = test_read_file(test_path(shared, "models/synth/synth-llama-F16.gguf"), &fsize);
    if (!fbuf) {
        printf("  real files: SKIPPED (no %s/models/synth)\n", shared);
        return;
    }
    static gg_tensor ft[512], qt[512];
    const int nf = gg_tensors(fbuf, fsize, ft, 512);
    CHECKF(nf > 0, "synth-llama-F16.gguf: cannot walk the tensor table");
    for (size_t k = 0; k < HR_ARRAY_LEN(files) && nf > 0; k++) {
        size_t qsize;
        char rel[256];
        snprintf(rel, sizeof rel, "models/synth/%s", files[k].file);
        uint8_t *qbuf = test_read_file(test_path(shared, rel), &qsize);
        if (!qbuf) { printf("  real files: %s missing, skipped\n", files[k].file); continue; }
        const int nq = gg_tensors(qbuf, qsize, qt, 512);
        CHECKF(nq > 0, "%s: cannot walk the tensor table", files[k].file);
        int n_checked = 0;
        double worst = 0, std_sum = 0;
        for (int i = 0; i < nq; i++) {
            if (qt[i].type != files[k].type) continue;
            const gg_tensor *f = NULL;
            for (int j = 0; j < nf; j++)
                if (!strcmp(ft[j].name, qt[i].name)) f = &ft[j];
            if (!f || f->ne != qt[i].ne || (f->type != HQ_TYPE_F16 && f->type != HQ_TYPE_F32)) continue;
            const int64_t n = qt[i].ne;
            float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
            for (int64_t e = 0; e < n; e++)
                a[e] = f->type == HQ_TYPE_F16 ? hr_fp16_to_fp32(((const hr_fp16 *)f->data)[e]) : ((const float *)f->data)[e];
            hq_get_traits(qt[i].type)->to_float(qt[i].data, b, n);
            double s2 = 0;
            for (int64_t e = 0; e < n; e++) s2 += (double)b[e] * b[e];
            std_sum += sqrt(s2 / (double)n);
            worst = fmax(worst, rel_rms(a, b, n));
            n_checked++;
            free(a), free(b);
        }
        printf("  %-24s %2d %s tensors vs F16: worst rel RMS %.4f, mean std %.4f\n", files[k].file, n_checked,
               hq_type_name(files[k].type), worst, n_checked ? std_sum / n_checked : 0.0);
        CHECKF(n_checked > 0, "%s: no %s tensor matched the F16 file", files[k].file, hq_type_name(files[k].type));
        CHECKF(worst < files[k].bound, "%s: dequantized %s differs from F16 by %.4f", files[k].file,
               hq_type_name(files[k].type), worst);
        CHECKF(n_checked == 0 || fabs(std_sum / n_checked - 0.02) < 0.004, "%s: std %.4f, expected ~0.02",
               files[k].file, std_sum / n_checked);
        free(qbuf);
    }
    free(fbuf);
}

int main(void) {
    hr_init();
    test_dispatch();
    test_roundtrip();
    test_hand_q2_K();
    test_hand_q3_K();
    test_hand_q4_K();
    test_hand_q5_K();
    test_hand_q6_K();
    test_hand_q8_K();
    test_vec_dot();
    test_q8_K_from_float();
    test_gemm();
    test_gemm_large();
    test_avx512_vs_avx2();
    test_real_files();
    return test_summary();
}
