/* quant: portable reference kernels for the K-quants (Q2_K..Q6_K, Q8_K) — see quant.h.
 *
 * Super-blocks of QK_K = 256 values. The layouts are ggml's, bit for bit; summarised here because
 * every other kernel (arch/x86/quants-k.c, arch/arm/quants-k.c) and the tests rely on them:
 *
 *   Q2_K  16 sub-blocks of 16. scales[j] = scale_j | min_j << 4 (4 bits each);
 *         x = d*scale_j*q - dmin*min_j, q in 0..3.
 *   Q3_K  16 sub-blocks of 16, signed 6-bit scales stored +32 in 12 bytes: the low nibbles of
 *         sub-blocks 0..7 / 8..15 are the low / high nibbles of bytes 0..7, the top two bits of
 *         sub-block j sit at bits 2*(j/4) of byte 8 + j%4.  x = d*(scale_j-32)*(q-4) with
 *         q = low2 + 4*hbit in 0..7 (a clear hmask bit means a negative value).
 *   Q4_K  8 sub-blocks of 32, 6-bit scales and mins in 12 bytes (sub-blocks 0..3: low six bits of
 *         bytes 0..3 / 4..7; sub-blocks 4..7: nibbles of bytes 8..11 plus the top two bits of
 *         bytes 0..3 / 4..7).  x = d*scale_j*q - dmin*min_j, q in 0..15.
 *   Q5_K  as Q4_K plus a fifth bit per value in qh; q in 0..31.
 *   Q6_K  16 sub-blocks of 16, int8 scales; x = d*scale_j*(q-32), q in 0..63.
 *   Q8_K  activations: float d, int8 q, and the sum of every 16 q's (bsums) so that the min terms
 *         of Q2_K/Q4_K/Q5_K (and the offsets of Q3_K/Q6_K in SIMD code) cost one multiply per 16.
 *
 * Packing of the low bits, per 128 values (Q2_K, Q3_K, Q6_K) or 64 values (Q4_K, Q5_K): value
 * r of a group is in byte r % 32 of that group's 32 bytes, at bit position 2*(r/32) (2-bit fields)
 * or 4*(r/32) (nibbles); high bits (Q3_K hmask, Q5_K qh) are bit r/32 of byte r%32 across the
 * whole super-block; Q6_K keeps two nibbles per ql byte over 64 bytes per 128 values and four
 * 2-bit fields per qh byte over 32 bytes.
 *
 * Quantizers search, per sub-block, a scale (and for Q2_K/Q4_K/Q5_K an offset) by weighted least
 * squares over a few candidate grids, then quantize the sub-block scales themselves the same way,
 * then re-round every value with the scales actually stored. They are not llama.cpp's routines and
 * do not produce its bytes; the Q8_K activation quantizer does, because logits are compared with
 * llama.cpp's.
 */
#include "quant/quant-impl.h"

#include <math.h>

/* Nearest integer, ties to even, as lrintf in the default rounding mode (and ggml's nearest_int)
   but without a libm call in the quantizers' inner loops: adding 1.5 * 2^23 leaves the rounded
   integer in the low mantissa bits. Exact for |v| < 2^22; larger inputs are clamped first (they
   only occur where the caller clamps the result to a few levels anyway). */
static inline int kq_round(float v) {
    v = v > 4e6f ? 4e6f : v < -4e6f ? -4e6f : v;
    const float t = v + 12582912.0f;
    uint32_t u;
    memcpy(&u, &t, sizeof u);
    return (int)(u & 0x007fffff) - 0x00400000;
}
static inline int kq_clamp(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* ---- scale search ----------------------------------------------------------------------------- */

/* Best scale for x[i] ~ scale * L[i] with integer L[i] in [lo, hi], minimising sum w*(x - scale*L)^2.
   The candidates map the value of largest magnitude onto the far end of the grid (lo if the grid
   is signed, so a symmetric grid gets its extra negative level) with that end nudged by up to
   +-0.9 levels; each candidate's scale is then refitted by least squares. */
static float kq_fit_scale(int n, int lo, int hi, const float *x, const float *w, int8_t *L) {
    float amax = 0, xm = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); xm = x[i]; }
    if (amax < 1e-30f) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0;
    }
    const float target = lo < 0 ? (float)-lo : (float)hi;  /* |level| the extreme value maps to */
    const float sgn = lo < 0 ? -1.0f : 1.0f;
    float best_scale = 0, best_gain = -1;
    int8_t T[QK_K];
    for (int k = -9; k <= 9; k++) {
        const float t = target + 0.1f * (float)k;
        if (t <= 0.3f) continue;
        const float iscale = sgn * t / xm;
        float sxl = 0, sll = 0;
        for (int i = 0; i < n; i++) {
            const int l = kq_clamp(kq_round(iscale * x[i]), lo, hi);
            T[i] = (int8_t)l;
            sxl += w[i] * x[i] * (float)l;
            sll += w[i] * (float)(l * l);
        }
        /* with the least-squares scale sxl/sll the error is sum w x^2 - sxl^2/sll: maximise the gain */
        if (sll > 0 && sxl * sxl / sll > best_gain) {
            best_gain = sxl * sxl / sll;
            best_scale = sxl / sll;
            memcpy(L, T, (size_t)n);
        }
    }
    if (best_gain < 0) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0;
    }
    return best_scale;
}

/* Best scale >= 0 and offset -min (min >= 0, as K-quants store it) for x[i] ~ scale*L[i] - min,
   L[i] in [0, nmax]. Candidate grids stretch (max - min) over nmax +- up to 1 level; each is
   refitted by 2x2 weighted least squares, the offset clipped at 0. */
static float kq_fit_affine(int n, int nmax, const float *x, const float *w, uint8_t *L, float *min_out) {
    float xmin = x[0], xmax = x[0];
    for (int i = 1; i < n; i++) {
        xmin = x[i] < xmin ? x[i] : xmin;
        xmax = x[i] > xmax ? x[i] : xmax;
    }
    if (xmin > 0) xmin = 0;
    if (xmax <= xmin) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *min_out = -xmin;
        return 0;
    }
    float sw = 0, sx = 0, sxx = 0;
    for (int i = 0; i < n; i++) {
        sw += w[i];
        sx += w[i] * x[i];
        sxx += w[i] * x[i] * x[i];
    }
    float best_err = INFINITY, best_scale = (xmax - xmin) / (float)nmax, best_off = xmin;
    uint8_t T[QK_K];
    for (int k = -10; k <= 10; k++) {
        const float t = (float)nmax + 0.1f * (float)k;
        if (t <= 0.5f) continue;
        const float iscale = t / (xmax - xmin);
        float sl = 0, sll = 0, sxl = 0;
        for (int i = 0; i < n; i++) {
            const int l = kq_clamp(kq_round(iscale * (x[i] - xmin)), 0, nmax);
            T[i] = (uint8_t)l;
            sl += w[i] * (float)l;
            sll += w[i] * (float)(l * l);
            sxl += w[i] * x[i] * (float)l;
        }
        /* minimise sum w (scale*l + off - x)^2 over scale, off <= 0 */
        const float det = sw * sll - sl * sl;
        float scale, off;
        if (det <= 0) continue;
        scale = (sw * sxl - sl * sx) / det;
        off = (sll * sx - sl * sxl) / det;
        if (off > 0) {
            off = 0;
            scale = sll > 0 ? sxl / sll : 0;
        }
        /* expanded form of sum w (scale*l + off - x)^2 */
        const float err = scale * scale * sll + off * off * sw + sxx + 2 * scale * off * sl -
                          2 * scale * sxl - 2 * off * sx;
        if (err < best_err) {
            best_err = err;
            best_scale = scale;
            best_off = off;
            memcpy(L, T, (size_t)n);
        }
    }
    if (best_err == INFINITY) {  /* every candidate degenerate: plain min/max grid */
        const float iscale = (float)nmax / (xmax - xmin);
        for (int i = 0; i < n; i++) L[i] = (uint8_t)kq_clamp(kq_round(iscale * (x[i] - xmin)), 0, nmax);
    }
    *min_out = -best_off;
    return best_scale;
}

/* Unsigned integer levels in [0, nmax] for non-negative values v (the sub-block scales or mins),
   weighted by how much an error in each costs; returns the common step. */
static float kq_fit_levels(int n, int nmax, const float *v, const float *w, uint8_t *q) {
    int8_t L[QK_K / 16];
    float wt[QK_K / 16];
    for (int j = 0; j < n; j++) wt[j] = w[j] > 0 ? w[j] : 1e-12f;
    const float d = kq_fit_scale(n, 0, nmax, v, wt, L);  /* nmax <= 63 here */
    for (int j = 0; j < n; j++) q[j] = (uint8_t)L[j];
    return d;
}

/* per-value importance: the mean magnitude plus the value's own, so that large weights (which
   matter most in a dot product) are fitted more closely without ignoring the rest */
static void kq_weights(int n, const float *x, float *w) {
    float s2 = 0;
    for (int i = 0; i < n; i++) s2 += x[i] * x[i];
    const float av = sqrtf(s2 / (float)n);
    for (int i = 0; i < n; i++) w[i] = av + fabsf(x[i]);
}

/* ---- shared helpers for the 6-bit packed scales of Q4_K / Q5_K ----------------------------------- */

static inline void k4_get(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static void k4_put(uint8_t *s, const uint8_t *sc, const uint8_t *mn) {
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 0x0F) | ((mn[j + 4] & 0x0F) << 4));
    }
}

/* Q3_K: 6-bit scale j (biased by 32) */
static inline int k3_get(const uint8_t *s, int j) {
    const int lo = j < 8 ? (s[j] & 0x0F) : (s[j - 8] >> 4);
    const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

/* Asymmetric K-quant (Q2_K nsub=16 of 16, Q4_K/Q5_K nsub=8 of 32): fit each sub-block, then the
   scales and mins on a 0..smax grid, then re-round the values with what is stored. Writes the
   quantized values (0..nmax) into L, the sub-block levels into ls/lm, and d/dmin as fp16. */
static void kq_quantize_affine(const float *x, int nsub, int nmax, int smax, uint8_t *L, uint8_t *ls,
                               uint8_t *lm, hr_fp16 *d_out, hr_fp16 *dmin_out) {
    const int sub = QK_K / nsub;
    float w[QK_K], scales[16], mins[16], wsc[16], wmn[16];
    kq_weights(QK_K, x, w);
    for (int j = 0; j < nsub; j++) {
        scales[j] = kq_fit_affine(sub, nmax, x + sub * j, w + sub * j, L + sub * j, &mins[j]);
        /* an error e in scale_j costs e^2 * sum w l^2; in min_j it costs e^2 * sum w */
        float a = 0, b = 0;
        for (int i = 0; i < sub; i++) {
            a += w[sub * j + i] * (float)(L[sub * j + i] * L[sub * j + i]);
            b += w[sub * j + i];
        }
        wsc[j] = a;
        wmn[j] = b;
    }
    const float d = kq_fit_levels(nsub, smax, scales, wsc, ls);
    const float dm = kq_fit_levels(nsub, smax, mins, wmn, lm);
    *d_out = hr_fp32_to_fp16(d);
    *dmin_out = hr_fp32_to_fp16(dm);
    const float dq = hr_fp16_to_fp32(*d_out), dmq = hr_fp16_to_fp32(*dmin_out);
    for (int j = 0; j < nsub; j++) {
        const float s = dq * (float)ls[j], m = dmq * (float)lm[j];
        for (int i = 0; i < sub; i++) {
            const int k = sub * j + i;
            L[k] = s > 0 ? (uint8_t)kq_clamp(kq_round((x[k] + m) / s), 0, nmax) : 0;
        }
    }
}

/* Symmetric K-quant (Q3_K, Q6_K: 16 sub-blocks of 16): values on [-nq, nq-1], sub-block scales on
   [-ns, ns-1]. Fills sc with the (signed) sub-block scale levels and returns their step d; the
   values are then rounded against what is stored (kq_requantize_symmetric). */
static float kq_quantize_symmetric(const float *x, int nq, int ns, int *sc) {
    float w[QK_K], scales[QK_K / 16], wsc[QK_K / 16];
    int8_t T[QK_K], S[QK_K / 16];
    kq_weights(QK_K, x, w);
    for (int j = 0; j < QK_K / 16; j++) {
        scales[j] = kq_fit_scale(16, -nq, nq - 1, x + 16 * j, w + 16 * j, T + 16 * j);
        float a = 0;
        for (int i = 0; i < 16; i++) a += w[16 * j + i] * (float)(T[16 * j + i] * T[16 * j + i]);
        wsc[j] = a > 0 ? a : 1e-12f;
    }
    const float d = kq_fit_scale(QK_K / 16, -ns, ns - 1, scales, wsc, S);
    for (int j = 0; j < QK_K / 16; j++) sc[j] = S[j];
    return d;
}

/* values re-rounded with the stored (fp16 d) * sc[j] */
static void kq_requantize_symmetric(const float *x, float d, const int *sc, int nq, uint8_t *L) {
    for (int j = 0; j < QK_K / 16; j++) {
        const float s = d * (float)sc[j];
        for (int i = 0; i < 16; i++) {
            const int k = 16 * j + i;
            L[k] = (uint8_t)(nq + (s != 0 ? kq_clamp(kq_round(x[k] / s), -nq, nq - 1) : 0));
        }
    }
}

/* ---- unpacking: the quants of one block as small integers in element order (one definition of
   each layout, shared by dequantize and vec_dot; written as plain loops the compiler vectorizes) -- */

/* 2-bit fields, per 128 values: byte l of the 32 holds values l, l+32, l+64, l+96 (bits 0-1 .. 6-7) */
static void kq_unpack_2bit(const uint8_t *restrict qs, int8_t *restrict q) {
    for (int h = 0; h < 2; h++)
        for (int p = 0; p < 4; p++)
            for (int l = 0; l < 32; l++) q[128 * h + 32 * p + l] = (int8_t)((qs[32 * h + l] >> (2 * p)) & 3);
}

/* Q3_K: -4..3; the hmask bit of value 32k+l is bit k of hmask[l], and a clear bit subtracts 4 */
static void kq_unpack_q3(const block_q3_K *restrict x, int8_t *restrict q) {
    kq_unpack_2bit(x->qs, q);
    for (int k = 0; k < 8; k++)
        for (int l = 0; l < 32; l++) q[32 * k + l] = (int8_t)(q[32 * k + l] - 4 + 4 * ((x->hmask[l] >> k) & 1));
}

/* nibbles, per 64 values: byte l of the 32 holds value l (low) and l+32 (high) */
static void kq_unpack_4bit(const uint8_t *restrict qs, int8_t *restrict q) {
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = (int8_t)(qs[32 * c + l] & 0x0F);
            q[64 * c + 32 + l] = (int8_t)(qs[32 * c + l] >> 4);
        }
}

/* Q5_K: 0..31; the fifth bit of value 32j+l is bit j of qh[l] */
static void kq_unpack_q5(const block_q5_K *restrict x, int8_t *restrict q) {
    kq_unpack_4bit(x->qs, q);
    for (int j = 0; j < 8; j++)
        for (int l = 0; l < 32; l++) q[32 * j + l] = (int8_t)(q[32 * j + l] | (((x->qh[l] >> j) & 1) << 4));
}

/* Q6_K: -32..31; per 128 values, part p (32 values) takes its low nibble from ql byte
   32*(p&1) + l (low nibble for p < 2, high for p >= 2) and its top two bits from bits 2p of qh[l] */
static void kq_unpack_q6(const block_q6_K *restrict x, int8_t *restrict q) {
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = x->ql + 64 * h, *qh = x->qh + 32 * h;
        for (int p = 0; p < 4; p++)
            for (int l = 0; l < 32; l++) {
                const int lo = (ql[32 * (p & 1) + l] >> (4 * (p >> 1))) & 0x0F;
                q[128 * h + 32 * p + l] = (int8_t)((lo | (((qh[l] >> (2 * p)) & 3) << 4)) - 32);
            }
    }
}

static inline int32_t kq_dot_i8(const int8_t *a, const int8_t *b, int n) {
    int32_t s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ================================ Q2_K =========================================================== */

void hq_quantize_ref_q2_K(const float *restrict x, void *restrict vy, int64_t k) {
    block_q2_K *y = vy;
    for (int64_t b = 0; b < k / QK_K; b++, x += QK_K) {
        uint8_t L[QK_K], ls[16], lm[16];
        kq_quantize_affine(x, 16, 3, 15, L, ls, lm, &y[b].d, &y[b].dmin);
        for (int j = 0; j < 16; j++) y[b].scales[j] = (uint8_t)(ls[j] | (lm[j] << 4));
        memset(y[b].qs, 0, sizeof y[b].qs);
        for (int e = 0; e < QK_K; e++) y[b].qs[32 * (e / 128) + e % 32] |= (uint8_t)(L[e] << (2 * ((e % 128) / 32)));
    }
}

void hq_dequantize_ref_q2_K(const void *restrict vx, float *restrict y, int64_t k) {
    const block_q2_K *x = vx;
    int8_t q[QK_K];
    for (int64_t b = 0; b < k / QK_K; b++, y += QK_K) {
        const float d = hr_fp16_to_fp32(x[b].d), dmin = hr_fp16_to_fp32(x[b].dmin);
        kq_unpack_2bit(x[b].qs, q);
        for (int j = 0; j < 16; j++) {
            const float s = d * (float)(x[b].scales[j] & 0x0F), m = dmin * (float)(x[b].scales[j] >> 4);
            for (int i = 0; i < 16; i++) y[16 * j + i] = s * (float)q[16 * j + i] - m;
        }
    }
}

void hq_vec_dot_ref_q2_K(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q2_K *x = vx;
    const block_q8_K *y = vy;
    int8_t q[QK_K];
    double sum = 0;
    for (int b = 0; b < n / QK_K; b++) {
        kq_unpack_2bit(x[b].qs, q);
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 16; j++) {
            isum += (x[b].scales[j] & 0x0F) * kq_dot_i8(q + 16 * j, y[b].qs + 16 * j, 16);
            msum += (x[b].scales[j] >> 4) * y[b].bsums[j];
        }
        sum += (double)y[b].d * ((double)hr_fp16_to_fp32(x[b].d) * isum - (double)hr_fp16_to_fp32(x[b].dmin) * msum);
    }
    *s = (float)sum;
}

/* ================================ Q3_K =========================================================== */

void hq_quantize_ref_q3_K(const float *restrict x, void *restrict vy, int64_t k) {
    block_q3_K *y = vy;
    for (int64_t b = 0; b < k / QK_K; b++, x += QK_K) {
        uint8_t L[QK_K];
        int sc[16];
        const float d = kq_quantize_symmetric(x, 4, 32, sc);
        y[b].d = hr_fp32_to_fp16(d);
        kq_requantize_symmetric(x, hr_fp16_to_fp32(y[b].d), sc, 4, L);
        memset(y[b].scales, 0, sizeof y[b].scales);
        for (int j = 0; j < 16; j++) {
            const int u = sc[j] + 32;  /* 0..63 */
            y[b].scales[j % 8] |= (uint8_t)((u & 0x0F) << (j < 8 ? 0 : 4));
            y[b].scales[8 + j % 4] |= (uint8_t)((u >> 4) << (2 * (j / 4)));
        }
        memset(y[b].hmask, 0, sizeof y[b].hmask);
        memset(y[b].qs, 0, sizeof y[b].qs);
        for (int e = 0; e < QK_K; e++) {
            if (L[e] & 4) y[b].hmask[e % 32] |= (uint8_t)(1u << (e / 32));
            y[b].qs[32 * (e / 128) + e % 32] |= (uint8_t)((L[e] & 3) << (2 * ((e % 128) / 32)));
        }
    }
}

void hq_dequantize_ref_q3_K(const void *restrict vx, float *restrict y, int64_t k) {
    const block_q3_K *x = vx;
    int8_t q[QK_K];
    for (int64_t b = 0; b < k / QK_K; b++, y += QK_K) {
        const float d = hr_fp16_to_fp32(x[b].d);
        kq_unpack_q3(&x[b], q);
        for (int j = 0; j < 16; j++) {
            const float s = d * (float)k3_get(x[b].scales, j);
            for (int i = 0; i < 16; i++) y[16 * j + i] = s * (float)q[16 * j + i];
        }
    }
}

void hq_vec_dot_ref_q3_K(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q3_K *x = vx;
    const block_q8_K *y = vy;
    int8_t q[QK_K];
    double sum = 0;
    for (int b = 0; b < n / QK_K; b++) {
        kq_unpack_q3(&x[b], q);
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) isum += k3_get(x[b].scales, j) * kq_dot_i8(q + 16 * j, y[b].qs + 16 * j, 16);
        sum += (double)y[b].d * (double)hr_fp16_to_fp32(x[b].d) * isum;
    }
    *s = (float)sum;
}

/* ================================ Q4_K / Q5_K ==================================================== */

void hq_quantize_ref_q4_K(const float *restrict x, void *restrict vy, int64_t k) {
    block_q4_K *y = vy;
    for (int64_t b = 0; b < k / QK_K; b++, x += QK_K) {
        uint8_t L[QK_K], ls[8], lm[8];
        kq_quantize_affine(x, 8, 15, 63, L, ls, lm, &y[b].d, &y[b].dmin);
        k4_put(y[b].scales, ls, lm);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) y[b].qs[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
    }
}

void hq_quantize_ref_q5_K(const float *restrict x, void *restrict vy, int64_t k) {
    block_q5_K *y = vy;
    for (int64_t b = 0; b < k / QK_K; b++, x += QK_K) {
        uint8_t L[QK_K], ls[8], lm[8];
        kq_quantize_affine(x, 8, 31, 63, L, ls, lm, &y[b].d, &y[b].dmin);
        k4_put(y[b].scales, ls, lm);
        memset(y[b].qh, 0, sizeof y[b].qh);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                const int a = L[64 * c + l], h = L[64 * c + 32 + l];
                y[b].qs[32 * c + l] = (uint8_t)((a & 0x0F) | ((h & 0x0F) << 4));
                y[b].qh[l] |= (uint8_t)(((a >> 4) << (2 * c)) | ((h >> 4) << (2 * c + 1)));
            }
    }
}

/* x = d*scale_j*q - dmin*min_j over sub-blocks of 32, given the unpacked quants */
static void kq_dequantize_k4(const uint8_t *scales, hr_fp16 hd, hr_fp16 hdmin, const int8_t *q, float *y) {
    const float d = hr_fp16_to_fp32(hd), dmin = hr_fp16_to_fp32(hdmin);
    for (int j = 0; j < 8; j++) {
        int sc, mn;
        k4_get(scales, j, &sc, &mn);
        const float s = d * (float)sc, m = dmin * (float)mn;
        for (int l = 0; l < 32; l++) y[32 * j + l] = s * (float)q[32 * j + l] - m;
    }
}

static double kq_dot_k4(const uint8_t *scales, hr_fp16 hd, hr_fp16 hdmin, const int8_t *q, const block_q8_K *y) {
    int32_t isum = 0, msum = 0;
    for (int j = 0; j < 8; j++) {
        int sc, mn;
        k4_get(scales, j, &sc, &mn);
        isum += sc * kq_dot_i8(q + 32 * j, y->qs + 32 * j, 32);
        msum += mn * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
    }
    return (double)y->d * ((double)hr_fp16_to_fp32(hd) * isum - (double)hr_fp16_to_fp32(hdmin) * msum);
}

void hq_dequantize_ref_q4_K(const void *restrict vx, float *restrict y, int64_t k) {
    const block_q4_K *x = vx;
    int8_t q[QK_K];
    for (int64_t b = 0; b < k / QK_K; b++, y += QK_K) {
        kq_unpack_4bit(x[b].qs, q);
        kq_dequantize_k4(x[b].scales, x[b].d, x[b].dmin, q, y);
    }
}

void hq_vec_dot_ref_q4_K(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    int8_t q[QK_K];
    double sum = 0;
    for (int b = 0; b < n / QK_K; b++) {
        kq_unpack_4bit(x[b].qs, q);
        sum += kq_dot_k4(x[b].scales, x[b].d, x[b].dmin, q, &y[b]);
    }
    *s = (float)sum;
}

void hq_dequantize_ref_q5_K(const void *restrict vx, float *restrict y, int64_t k) {
    const block_q5_K *x = vx;
    int8_t q[QK_K];
    for (int64_t b = 0; b < k / QK_K; b++, y += QK_K) {
        kq_unpack_q5(&x[b], q);
        kq_dequantize_k4(x[b].scales, x[b].d, x[b].dmin, q, y);
    }
}

void hq_vec_dot_ref_q5_K(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    int8_t q[QK_K];
    double sum = 0;
    for (int b = 0; b < n / QK_K; b++) {
        kq_unpack_q5(&x[b], q);
        sum += kq_dot_k4(x[b].scales, x[b].d, x[b].dmin, q, &y[b]);
    }
    *s = (float)sum;
}

/* ================================ Q6_K =========================================================== */

void hq_quantize_ref_q6_K(const float *restrict x, void *restrict vy, int64_t k) {
    block_q6_K *y = vy;
    for (int64_t b = 0; b < k / QK_K; b++, x += QK_K) {
        uint8_t L[QK_K];
        int sc[16];
        const float d = kq_quantize_symmetric(x, 32, 128, sc);
        y[b].d = hr_fp32_to_fp16(d);
        kq_requantize_symmetric(x, hr_fp16_to_fp32(y[b].d), sc, 32, L);
        for (int j = 0; j < 16; j++) y[b].scales[j] = (int8_t)sc[j];
        memset(y[b].ql, 0, sizeof y[b].ql);
        memset(y[b].qh, 0, sizeof y[b].qh);
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, r = e % 128, l = r % 32, part = r / 32;
            y[b].ql[64 * h + 32 * (part & 1) + l] |= (uint8_t)((L[e] & 0x0F) << (4 * (part >> 1)));
            y[b].qh[32 * h + l] |= (uint8_t)((L[e] >> 4) << (2 * part));
        }
    }
}

void hq_dequantize_ref_q6_K(const void *restrict vx, float *restrict y, int64_t k) {
    const block_q6_K *x = vx;
    int8_t q[QK_K];
    for (int64_t b = 0; b < k / QK_K; b++, y += QK_K) {
        const float d = hr_fp16_to_fp32(x[b].d);
        kq_unpack_q6(&x[b], q);
        for (int j = 0; j < 16; j++) {
            const float s = d * (float)x[b].scales[j];
            for (int i = 0; i < 16; i++) y[16 * j + i] = s * (float)q[16 * j + i];
        }
    }
}

void hq_vec_dot_ref_q6_K(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    int8_t q[QK_K];
    double sum = 0;
    for (int b = 0; b < n / QK_K; b++) {
        kq_unpack_q6(&x[b], q);
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) isum += x[b].scales[j] * kq_dot_i8(q + 16 * j, y[b].qs + 16 * j, 16);
        sum += (double)y[b].d * (double)hr_fp16_to_fp32(x[b].d) * isum;
    }
    *s = (float)sum;
}

/* ================================ Q8_K =========================================================== */

/* ggml's activation quantizer, value for value: the scale maps the signed value of largest
   magnitude (its first occurrence) to -127, values round to nearest (ties to even), 127 caps. */
void hq_quantize_ref_q8_K(const float *restrict x, void *restrict vy, int64_t k) {
    block_q8_K *y = vy;
    for (int64_t b = 0; b < k / QK_K; b++, x += QK_K) {
        float amax = 0, vmax = 0;
        for (int i = 0; i < QK_K; i++)
            if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); vmax = x[i]; }
        if (amax == 0) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const float iscale = -127.0f / vmax;
        for (int i = 0; i < QK_K; i++) {
            const int v = kq_round(iscale * x[i]);
            y[b].qs[i] = (int8_t)(v > 127 ? 127 : v);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int i = 0; i < 16; i++) sum += y[b].qs[16 * j + i];
            y[b].bsums[j] = (int16_t)sum;
        }
        y[b].d = 1.0f / iscale;
    }
}

void hq_dequantize_ref_q8_K(const void *restrict vx, float *restrict y, int64_t k) {
    const block_q8_K *x = vx;
    for (int64_t b = 0; b < k / QK_K; b++)
        for (int i = 0; i < QK_K; i++) *y++ = x[b].d * (float)x[b].qs[i];
}

/* Q8_K . Q8_K (activation type only; kept for symmetry of the table) */
void hq_vec_dot_ref_q8_K(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q8_K *x = vx;
    const block_q8_K *y = vy;
    double sum = 0;
    for (int b = 0; b < n / QK_K; b++) {
        int32_t t = 0;
        for (int i = 0; i < QK_K; i++) t += x[b].qs[i] * y[b].qs[i];
        sum += (double)x[b].d * (double)y[b].d * t;
    }
    *s = (float)sum;
}
