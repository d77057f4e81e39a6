/* quant, AArch64 NEON: K-quant dot products against Q8_K activations and the Q8_K activation
 * quantizer.  Layouts: see quants-k-ref.c.
 *
 * Baseline NEON (every AArch64 core); where the compiler targets the int8 dot-product extension
 * (__ARM_FEATURE_DOTPROD, e.g. -march=armv8.2-a+dotprod) each group of 16 products is one SDOT.
 * Quants are unpacked to signed int8 per 16 values, dotted with the activations into int32 lanes,
 * and each sub-block's lanes are scaled by its integer scale (vmlaq_n_s32); a block's lanes are
 * added once, then its float scales applied. Mins (Q2_K, Q4_K, Q5_K) go through the activation
 * block sums, one multiply per 16 or 32 values.
 */
#include "quant/quant-impl.h"

#include <arm_neon.h>
#include <math.h>

/* acc + the 16 products a[i]*b[i], spread over the four lanes (how they are spread differs between
   the two paths; callers only use the sum of the lanes). Without SDOT the products are paired in
   int16 first: |a| <= 32 and |b| <= 127 here, so a pair stays below 2^13. */
static inline int32x4_t kq_dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    int16x8_t p = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    p = vmlal_high_s8(p, a, b);
    return vpadalq_s16(acc, p);
#endif
}

static inline int8x16_t kq_s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }

/* sum_j m[j] * s[j] over 16 int16 pairs (mins of 16-value sub-blocks times activation block sums) */
static inline int32_t kq_dot_s16x16(const int16_t *m, const int16_t *s) {
    const int16x8_t m0 = vld1q_s16(m), m1 = vld1q_s16(m + 8), s0 = vld1q_s16(s), s1 = vld1q_s16(s + 8);
    int32x4_t t = vmull_s16(vget_low_s16(m0), vget_low_s16(s0));
    t = vmlal_high_s16(t, m0, s0);
    t = vmlal_s16(t, vget_low_s16(m1), vget_low_s16(s1));
    t = vmlal_high_s16(t, m1, s1);
    return vaddvq_s32(t);
}

/* the 6-bit scales and mins of Q4_K/Q5_K */
static inline void kq_k4_scales(const uint8_t *s, uint8_t *sc, uint8_t *mn) {
    uint32_t a[3], o[4];
    memcpy(a, s, 12);
    o[0] = a[0] & 0x3f3f3f3f;
    o[1] = (a[2] & 0x0f0f0f0f) | (((a[0] >> 6) & 0x03030303) << 4);
    o[2] = a[1] & 0x3f3f3f3f;
    o[3] = ((a[2] >> 4) & 0x0f0f0f0f) | (((a[1] >> 6) & 0x03030303) << 4);
    memcpy(sc, o, 8);
    memcpy(mn, o + 2, 8);
}

/* Q4_K/Q5_K mins: sum_j min_j * (bsums[2j] + bsums[2j+1]) */
static inline int32_t kq_k4_mins(const uint8_t *mn, const int16_t *bsums) {
    const int16x8_t bs = vpaddq_s16(vld1q_s16(bsums), vld1q_s16(bsums + 8));
    const int16x8_t m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mn)));
    int32x4_t t = vmull_s16(vget_low_s16(bs), vget_low_s16(m));
    t = vmlal_high_s16(t, bs, m);
    return vaddvq_s32(t);
}

/* ---- Q4_K ------------------------------------------------------------------------------------------ */

void hq_vec_dot_neon_q4_K(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    const int32x4_t zero = vdupq_n_s32(0);
    float sum = 0;
    for (int i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], mn[8];
        kq_k4_scales(x[i].scales, sc, mn);
        const int32_t msum = kq_k4_mins(mn, y[i].bsums);
        const uint8_t *q = x[i].qs;
        const int8_t *a = y[i].qs;
        int32x4_t acc = zero;
        for (int j = 0; j < 4; j++, q += 32, a += 64) {
            const uint8x16_t b0 = vld1q_u8(q), b1 = vld1q_u8(q + 16);
            int32x4_t lo = kq_dot16(zero, kq_s8(vandq_u8(b0, m4)), vld1q_s8(a));
            lo = kq_dot16(lo, kq_s8(vandq_u8(b1, m4)), vld1q_s8(a + 16));
            int32x4_t hi = kq_dot16(zero, kq_s8(vshrq_n_u8(b0, 4)), vld1q_s8(a + 32));
            hi = kq_dot16(hi, kq_s8(vshrq_n_u8(b1, 4)), vld1q_s8(a + 48));
            acc = vmlaq_n_s32(acc, lo, sc[2 * j]);
            acc = vmlaq_n_s32(acc, hi, sc[2 * j + 1]);
        }
        const float dy = y[i].d;
        sum += dy * hr_fp16_to_fp32(x[i].d) * (float)vaddvq_s32(acc) - dy * hr_fp16_to_fp32(x[i].dmin) * (float)msum;
    }
    *s = sum;
}

/* ---- Q5_K ------------------------------------------------------------------------------------------ */

void hq_vec_dot_neon_q5_K(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), one = vdupq_n_u8(1), two = vdupq_n_u8(2);
    const int32x4_t zero = vdupq_n_s32(0);
    float sum = 0;
    for (int i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], mn[8];
        kq_k4_scales(x[i].scales, sc, mn);
        const int32_t msum = kq_k4_mins(mn, y[i].bsums);
        const uint8_t *q = x[i].qs;
        const int8_t *a = y[i].qs;
        /* the fifth bit of value 32j+l is bit j of qh[l]; shifting qh by 2 per 64 values keeps the
           bits of the current pair of sub-blocks at bits 0 and 1 */
        uint8x16_t h0 = vld1q_u8(x[i].qh), h1 = vld1q_u8(x[i].qh + 16);
        int32x4_t acc = zero;
        for (int j = 0; j < 4; j++, q += 32, a += 64) {
            const uint8x16_t b0 = vld1q_u8(q), b1 = vld1q_u8(q + 16);
            const uint8x16_t l0 = vorrq_u8(vandq_u8(b0, m4), vshlq_n_u8(vandq_u8(h0, one), 4));
            const uint8x16_t l1 = vorrq_u8(vandq_u8(b1, m4), vshlq_n_u8(vandq_u8(h1, one), 4));
            const uint8x16_t u0 = vorrq_u8(vshrq_n_u8(b0, 4), vshlq_n_u8(vandq_u8(h0, two), 3));
            const uint8x16_t u1 = vorrq_u8(vshrq_n_u8(b1, 4), vshlq_n_u8(vandq_u8(h1, two), 3));
            h0 = vshrq_n_u8(h0, 2);
            h1 = vshrq_n_u8(h1, 2);
            int32x4_t lo = kq_dot16(zero, kq_s8(l0), vld1q_s8(a));
            lo = kq_dot16(lo, kq_s8(l1), vld1q_s8(a + 16));
            int32x4_t hi = kq_dot16(zero, kq_s8(u0), vld1q_s8(a + 32));
            hi = kq_dot16(hi, kq_s8(u1), vld1q_s8(a + 48));
            acc = vmlaq_n_s32(acc, lo, sc[2 * j]);
            acc = vmlaq_n_s32(acc, hi, sc[2 * j + 1]);
        }
        const float dy = y[i].d;
        sum += dy * hr_fp16_to_fp32(x[i].d) * (float)vaddvq_s32(acc) - dy * hr_fp16_to_fp32(x[i].dmin) * (float)msum;
    }
    *s = sum;
}

/* ---- Q6_K ------------------------------------------------------------------------------------------ */

void hq_vec_dot_neon_q6_K(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m30 = vdupq_n_u8(0x30);
    const int8x16_t bias = vdupq_n_s8(32);
    const int32x4_t zero = vdupq_n_s32(0);
    float sum = 0;
    for (int i = 0; i < n / QK_K; i++) {
        const int8_t *sc = x[i].scales;
        int32x4_t acc = zero;
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[i].ql + 64 * h, *qh = x[i].qh + 32 * h;
            const int8_t *a = y[i].qs + 128 * h;
            for (int u = 0; u < 2; u++) {
                /* values 16u..16u+15 of each 32-value part p of this half: part p's low nibble is
                   in ql byte 32*(p&1)+l (low for p < 2, high otherwise), its top bits at 2p in qh */
                const uint8x16_t l0 = vld1q_u8(ql + 16 * u), l1 = vld1q_u8(ql + 32 + 16 * u);
                const uint8x16_t hb = vld1q_u8(qh + 16 * u);
                const uint8x16_t q0 = vorrq_u8(vandq_u8(l0, m4), vandq_u8(vshlq_n_u8(hb, 4), m30));
                const uint8x16_t q1 = vorrq_u8(vandq_u8(l1, m4), vandq_u8(vshlq_n_u8(hb, 2), m30));
                const uint8x16_t q2 = vorrq_u8(vshrq_n_u8(l0, 4), vandq_u8(hb, m30));
                const uint8x16_t q3 = vorrq_u8(vshrq_n_u8(l1, 4), vandq_u8(vshrq_n_u8(hb, 2), m30));
                const int base = 8 * h + u; /* scale of part p is sc[base + 2p] */
                acc = vmlaq_n_s32(acc, kq_dot16(zero, vsubq_s8(kq_s8(q0), bias), vld1q_s8(a + 16 * u)), sc[base]);
                acc = vmlaq_n_s32(acc, kq_dot16(zero, vsubq_s8(kq_s8(q1), bias), vld1q_s8(a + 32 + 16 * u)), sc[base + 2]);
                acc = vmlaq_n_s32(acc, kq_dot16(zero, vsubq_s8(kq_s8(q2), bias), vld1q_s8(a + 64 + 16 * u)), sc[base + 4]);
                acc = vmlaq_n_s32(acc, kq_dot16(zero, vsubq_s8(kq_s8(q3), bias), vld1q_s8(a + 96 + 16 * u)), sc[base + 6]);
            }
        }
        sum += y[i].d * hr_fp16_to_fp32(x[i].d) * (float)vaddvq_s32(acc);
    }
    *s = sum;
}

/* ---- Q3_K ------------------------------------------------------------------------------------------ */

void hq_vec_dot_neon_q3_K(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q3_K *x = vx;
    const block_q8_K *y = vy;
    const uint8x16_t m3 = vdupq_n_u8(3), one = vdupq_n_u8(1);
    const int8x16_t four = vdupq_n_s8(4);
    const int32x4_t zero = vdupq_n_s32(0);
    float sum = 0;
    for (int i = 0; i < n / QK_K; i++) {
        /* 16 signed 6-bit scales: low nibbles in bytes 0..7 (low, then high nibble), top bits of
           scale j at 2*(j/4) in byte 8 + j%4 */
        uint32_t a4[3], o[4];
        memcpy(a4, x[i].scales, 12);
        o[0] = (a4[0] & 0x0f0f0f0f) | ((a4[2] & 0x03030303) << 4);
        o[1] = (a4[1] & 0x0f0f0f0f) | (((a4[2] >> 2) & 0x03030303) << 4);
        o[2] = ((a4[0] >> 4) & 0x0f0f0f0f) | (((a4[2] >> 4) & 0x03030303) << 4);
        o[3] = ((a4[1] >> 4) & 0x0f0f0f0f) | (((a4[2] >> 6) & 0x03030303) << 4);
        uint8_t u6[16];
        memcpy(u6, o, 16);
        /* value 32k+l: bit k of hmask[l] set means +0, clear means -4 */
        uint8x16_t hm0 = vld1q_u8(x[i].hmask), hm1 = vld1q_u8(x[i].hmask + 16);
        int32x4_t acc = zero;
        for (int h = 0; h < 2; h++) {
            uint8x16_t q0 = vld1q_u8(x[i].qs + 32 * h), q1 = vld1q_u8(x[i].qs + 32 * h + 16);
            for (int p = 0; p < 4; p++) {
                const int k = 4 * h + p;
                const int8_t *a = y[i].qs + 32 * k;
                const uint8x16_t v0 = vorrq_u8(vandq_u8(q0, m3), vshlq_n_u8(vandq_u8(hm0, one), 2));
                const uint8x16_t v1 = vorrq_u8(vandq_u8(q1, m3), vshlq_n_u8(vandq_u8(hm1, one), 2));
                acc = vmlaq_n_s32(acc, kq_dot16(zero, vsubq_s8(kq_s8(v0), four), vld1q_s8(a)), (int)u6[2 * k] - 32);
                acc = vmlaq_n_s32(acc, kq_dot16(zero, vsubq_s8(kq_s8(v1), four), vld1q_s8(a + 16)), (int)u6[2 * k + 1] - 32);
                q0 = vshrq_n_u8(q0, 2);
                q1 = vshrq_n_u8(q1, 2);
                hm0 = vshrq_n_u8(hm0, 1);
                hm1 = vshrq_n_u8(hm1, 1);
            }
        }
        sum += y[i].d * hr_fp16_to_fp32(x[i].d) * (float)vaddvq_s32(acc);
    }
    *s = sum;
}

/* ---- Q2_K ------------------------------------------------------------------------------------------ */

void hq_vec_dot_neon_q2_K(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q2_K *x = vx;
    const block_q8_K *y = vy;
    const uint8x16_t m3 = vdupq_n_u8(3);
    const int32x4_t zero = vdupq_n_s32(0);
    float sum = 0;
    for (int i = 0; i < n / QK_K; i++) {
        const uint8x16_t raw = vld1q_u8(x[i].scales);
        int16_t mins[16];
        const uint8x16_t mn = vshrq_n_u8(raw, 4);
        vst1q_s16(mins, vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mn))));
        vst1q_s16(mins + 8, vreinterpretq_s16_u16(vmovl_high_u8(mn)));
        const int32_t msum = kq_dot_s16x16(mins, y[i].bsums);
        int32x4_t acc = zero;
        for (int h = 0; h < 2; h++) {
            uint8x16_t q0 = vld1q_u8(x[i].qs + 32 * h), q1 = vld1q_u8(x[i].qs + 32 * h + 16);
            for (int p = 0; p < 4; p++) {
                const int k = 4 * h + p;
                const int8_t *a = y[i].qs + 32 * k;
                acc = vmlaq_n_s32(acc, kq_dot16(zero, kq_s8(vandq_u8(q0, m3)), vld1q_s8(a)), x[i].scales[2 * k] & 0x0F);
                acc = vmlaq_n_s32(acc, kq_dot16(zero, kq_s8(vandq_u8(q1, m3)), vld1q_s8(a + 16)),
                                  x[i].scales[2 * k + 1] & 0x0F);
                q0 = vshrq_n_u8(q0, 2);
                q1 = vshrq_n_u8(q1, 2);
            }
        }
        const float dy = y[i].d;
        sum += dy * hr_fp16_to_fp32(x[i].d) * (float)vaddvq_s32(acc) - dy * hr_fp16_to_fp32(x[i].dmin) * (float)msum;
    }
    *s = sum;
}

/* ---- Q8_K activations: the reference's bytes ----------------------------------------------------- */

void hq_quantize_neon_q8_K(const float *restrict x, void *restrict vy, int64_t k) {
    block_q8_K *y = vy;
    for (int64_t b = 0; b < k / QK_K; b++, x += QK_K) {
        float32x4_t mx = vdupq_n_f32(0);
        for (int i = 0; i < QK_K; i += 4) mx = vmaxq_f32(mx, vabsq_f32(vld1q_f32(x + i)));
        const float amax = vmaxvq_f32(mx);
        if (amax == 0) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        /* the sign comes from the first value of that magnitude, as in the reference */
        int idx = -1;
        for (int i = 0; i < QK_K; i++)
            if (fabsf(x[i]) == amax) { idx = i; break; }
        if (idx < 0) { /* NaNs: the reference defines what happens */
            hq_quantize_ref_q8_K(x, &y[b], QK_K);
            continue;
        }
        const float iscale = -127.0f / x[idx];
        for (int i = 0; i < QK_K; i += 16) {
            /* round to nearest, ties to even (as the reference); saturating narrows cap 128 at 127 */
            const int32x4_t q0 = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + i), iscale));
            const int32x4_t q1 = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + i + 4), iscale));
            const int32x4_t q2 = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + i + 8), iscale));
            const int32x4_t q3 = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + i + 12), iscale));
            const int16x8_t h0 = vcombine_s16(vqmovn_s32(q0), vqmovn_s32(q1));
            const int16x8_t h1 = vcombine_s16(vqmovn_s32(q2), vqmovn_s32(q3));
            const int8x16_t v = vcombine_s8(vqmovn_s16(h0), vqmovn_s16(h1));
            vst1q_s8(y[b].qs + i, v);
            y[b].bsums[i / 16] = (int16_t)vaddlvq_s8(v);
        }
        y[b].d = 1.0f / iscale;
    }
}
