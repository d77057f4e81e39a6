/* quant, ARM: NEON kernels for the float types and the 32-element quants — see quant.h.
 *
 * Baseline AArch64 NEON (every ARMv8-A core): 8-bit products widen with vmull_s8 and pair-add
 * into 32-bit lanes with vpadalq_s16.  Cores with the dot-product extension (Cortex-A55/A76 and
 * later, Apple M1) get SDOT when the build targets them (-march=armv8.2-a+dotprod or -mcpu=native
 * define __ARM_FEATURE_DOTPROD); the result is the same integer.
 *
 * A weight block becomes two 16-byte vectors of signed values in element order (elements 0..15,
 * 16..31), matching the activation's qs[0..15], qs[16..31].  Products of two int8 fit int16
 * (|-128 * -128| = 16384), so the widening path is exact for any codes.  Each block's integer
 * dot is scaled by dx*dy into a float accumulator; two blocks per iteration keep two chains busy.
 * The prefill tiles unpack each weight block once for up to 4 activation rows.
 *
 * The activation quantizers round with FCVTAS (to nearest, ties away from zero), which is exactly
 * the reference's roundf, so their bytes equal the reference's.
 */
#include "quant/quant-impl.h"

#if defined(__aarch64__) && defined(__ARM_NEON)

#include <arm_neon.h>

#define HQ_INLINE static inline __attribute__((always_inline))

/* ---- helpers -------------------------------------------------------------------------------------- */

HQ_INLINE float hq_h2f(hr_fp16 h) { return hr_fp16_to_fp32(h); }

/* acc + sum of a[i]*b[i] over 16 lanes, spread over 4 int32 lanes */
HQ_INLINE int32x4_t hq_dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    const int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    const int16x8_t hi = vmull_high_s8(a, b);
    return vpadalq_s16(vpadalq_s16(acc, lo), hi);
#endif
}

/* 16 packed bytes of nibbles -> low nibbles (elements 0..15) and high nibbles (16..31), 0..15 */
HQ_INLINE void hq_nibbles(const uint8_t *qs, uint8x16_t *lo, uint8x16_t *hi) {
    const uint8x16_t v = vld1q_u8(qs);
    *lo = vandq_u8(v, vdupq_n_u8(0x0F));
    *hi = vshrq_n_u8(v, 4);
}

/* qh (little-endian u32, bit j = element j) -> 0xFF/0x00 per element, elements 0..15 and 16..31 */
HQ_INLINE void hq_bits(const uint8_t *qh, uint8x16_t *lo, uint8x16_t *hi) {
    static const uint8_t bit_of_lane[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t mask = vld1q_u8(bit_of_lane);
    *lo = vtstq_u8(vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1])), mask);
    *hi = vtstq_u8(vcombine_u8(vdup_n_u8(qh[2]), vdup_n_u8(qh[3])), mask);
}

/* ---- weight blocks -------------------------------------------------------------------------------- */

enum { HQ_K_Q4_0, HQ_K_Q4_1, HQ_K_Q5_0, HQ_K_Q5_1, HQ_K_Q8_0 };

HQ_INLINE bool hq_kind_min(int kind) { return kind == HQ_K_Q4_1 || kind == HQ_K_Q5_1; }

/* block b: the 32 weights as signed bytes (codes minus the zero point; for the kinds with a min,
   the codes 0..31 themselves, which fit int8), scale and min */
HQ_INLINE void hq_load_w(int kind, const void *row, int b, int8x16_t *w0, int8x16_t *w1, float *d, float *m) {
    uint8x16_t lo, hi, hlo, hhi;
    switch (kind) {
    case HQ_K_Q4_0: {
        const block_q4_0 *x = (const block_q4_0 *)row + b;
        *d = hq_h2f(x->d);
        hq_nibbles(x->qs, &lo, &hi);
        *w0 = vsubq_s8(vreinterpretq_s8_u8(lo), vdupq_n_s8(8));
        *w1 = vsubq_s8(vreinterpretq_s8_u8(hi), vdupq_n_s8(8));
        return;
    }
    case HQ_K_Q4_1: {
        const block_q4_1 *x = (const block_q4_1 *)row + b;
        *d = hq_h2f(x->d);
        *m = hq_h2f(x->m);
        hq_nibbles(x->qs, &lo, &hi);
        *w0 = vreinterpretq_s8_u8(lo);
        *w1 = vreinterpretq_s8_u8(hi);
        return;
    }
    case HQ_K_Q5_0: {
        /* code - 16 as a byte: where bit 4 is clear, setting the top nibble subtracts 16 */
        const block_q5_0 *x = (const block_q5_0 *)row + b;
        *d = hq_h2f(x->d);
        hq_nibbles(x->qs, &lo, &hi);
        hq_bits(x->qh, &hlo, &hhi);
        *w0 = vreinterpretq_s8_u8(vorrq_u8(lo, vbicq_u8(vdupq_n_u8(0xF0), hlo)));
        *w1 = vreinterpretq_s8_u8(vorrq_u8(hi, vbicq_u8(vdupq_n_u8(0xF0), hhi)));
        return;
    }
    case HQ_K_Q5_1: {
        const block_q5_1 *x = (const block_q5_1 *)row + b;
        *d = hq_h2f(x->d);
        *m = hq_h2f(x->m);
        hq_nibbles(x->qs, &lo, &hi);
        hq_bits(x->qh, &hlo, &hhi);
        *w0 = vreinterpretq_s8_u8(vorrq_u8(lo, vandq_u8(hlo, vdupq_n_u8(0x10))));
        *w1 = vreinterpretq_s8_u8(vorrq_u8(hi, vandq_u8(hhi, vdupq_n_u8(0x10))));
        return;
    }
    default: {
        const block_q8_0 *x = (const block_q8_0 *)row + b;
        *d = hq_h2f(x->d);
        *w0 = vld1q_s8(x->qs);
        *w1 = vld1q_s8(x->qs + 16);
        return;
    }
    }
}

/* acc += dx*dy * (block's integer dot); *summ += m*s for the kinds with a min (Q8_1 activations) */
HQ_INLINE float32x4_t hq_block_dot(int kind, const void *x, const void *y, int b, float32x4_t acc, float *summ) {
    int8x16_t w0, w1;
    float dx, mx = 0.0f, dy;
    const int8_t *qa;
    hq_load_w(kind, x, b, &w0, &w1, &dx, &mx);
    if (hq_kind_min(kind)) {
        const block_q8_1 *a = (const block_q8_1 *)y + b;
        dy = hq_h2f(a->d);
        *summ += mx * hq_h2f(a->s);
        qa = a->qs;
    } else {
        const block_q8_0 *a = (const block_q8_0 *)y + b;
        dy = hq_h2f(a->d);
        qa = a->qs;
    }
    const int32x4_t p = hq_dot16(hq_dot16(vdupq_n_s32(0), w0, vld1q_s8(qa)), w1, vld1q_s8(qa + 16));
    return vmlaq_n_f32(acc, vcvtq_f32_s32(p), dx * dy);
}

HQ_INLINE float hq_vec_dot_blocks(int kind, int n, const void *x, const void *y) {
    const int nb = n / QK8_0;
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
    float summ0 = 0.0f, summ1 = 0.0f;
    int b = 0;
    for (; b + 1 < nb; b += 2) {
        acc0 = hq_block_dot(kind, x, y, b, acc0, &summ0);
        acc1 = hq_block_dot(kind, x, y, b + 1, acc1, &summ1);
    }
    if (b < nb) acc0 = hq_block_dot(kind, x, y, b, acc0, &summ0);
    return vaddvq_f32(vaddq_f32(acc0, acc1)) + (summ0 + summ1);
}

void hq_vec_dot_neon_q4_0(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_blocks(HQ_K_Q4_0, n, x, y);
}
void hq_vec_dot_neon_q4_1(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_blocks(HQ_K_Q4_1, n, x, y);
}
void hq_vec_dot_neon_q5_0(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_blocks(HQ_K_Q5_0, n, x, y);
}
void hq_vec_dot_neon_q5_1(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_blocks(HQ_K_Q5_1, n, x, y);
}
void hq_vec_dot_neon_q8_0(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_blocks(HQ_K_Q8_0, n, x, y);
}

/* ---- tiles for prefill ---------------------------------------------------------------------------- */

/* One weight row against C (1..4) activation rows: each weight block is unpacked once and used C
   times; C is a constant at every call and the C loops are unrolled, so acc[] stays in
   registers. */
HQ_INLINE void hq_tile_1xC(int kind, int C, int nb, float *s, size_t lds, const void *x, const void *y,
                           size_t by) {
    float32x4_t acc[4];
    float summ[4];
    #pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        acc[c] = vdupq_n_f32(0.0f);
        summ[c] = 0.0f;
    }
    for (int b = 0; b < nb; b++) {
        int8x16_t w0, w1;
        float dx, mx = 0.0f;
        hq_load_w(kind, x, b, &w0, &w1, &dx, &mx);
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const char *yc = (const char *)y + (size_t)c * by;
            float dy;
            const int8_t *qa;
            if (hq_kind_min(kind)) {
                const block_q8_1 *a = (const block_q8_1 *)yc + b;
                dy = hq_h2f(a->d);
                summ[c] += mx * hq_h2f(a->s);
                qa = a->qs;
            } else {
                const block_q8_0 *a = (const block_q8_0 *)yc + b;
                dy = hq_h2f(a->d);
                qa = a->qs;
            }
            const int32x4_t p = hq_dot16(hq_dot16(vdupq_n_s32(0), w0, vld1q_s8(qa)), w1, vld1q_s8(qa + 16));
            acc[c] = vmlaq_n_f32(acc[c], vcvtq_f32_s32(p), dx * dy);
        }
    }
    #pragma GCC unroll 4
    for (int c = 0; c < C; c++) s[(size_t)c * lds] = vaddvq_f32(acc[c]) + summ[c];
}

HQ_INLINE void hq_gemm_blocks(int kind, int n, float *s, size_t lds, const void *x, size_t bx, int nr,
                              const void *y, size_t by, int nc) {
    const int nb = n / QK8_0;
    for (int j = 0; j < nc; j += 4) {
        const char *yj = (const char *)y + (size_t)j * by;
        float *sj = s + (size_t)j * lds;
        for (int i = 0; i < nr; i++) {
            const char *xi = (const char *)x + (size_t)i * bx;
            switch (nc - j) {
            case 1:  hq_tile_1xC(kind, 1, nb, sj + i, lds, xi, yj, by); break;
            case 2:  hq_tile_1xC(kind, 2, nb, sj + i, lds, xi, yj, by); break;
            case 3:  hq_tile_1xC(kind, 3, nb, sj + i, lds, xi, yj, by); break;
            default: hq_tile_1xC(kind, 4, nb, sj + i, lds, xi, yj, by); break;
            }
        }
    }
}

#define HQ_GEMM_NEON(t, KIND)                                                                           \
    void hq_gemm_neon_##t(int n, float *restrict s, size_t lds, const void *restrict x, size_t bx, int nr, \
                          const void *restrict y, size_t by, int nc) {                                 \
        hq_gemm_blocks(KIND, n, s, lds, x, bx, nr, y, by, nc);                                        \
    }
HQ_GEMM_NEON(q4_0, HQ_K_Q4_0)
HQ_GEMM_NEON(q4_1, HQ_K_Q4_1)
HQ_GEMM_NEON(q5_0, HQ_K_Q5_0)
HQ_GEMM_NEON(q5_1, HQ_K_Q5_1)
HQ_GEMM_NEON(q8_0, HQ_K_Q8_0)

/* ---- float types ---------------------------------------------------------------------------------- */

enum { HQ_F_F32, HQ_F_F16, HQ_F_BF16 };

/* 8 elements starting at element i, as two float32x4 */
HQ_INLINE void hq_load8(int kind, const void *p, int i, float32x4_t *a, float32x4_t *b) {
    switch (kind) {
    case HQ_F_F32:
        *a = vld1q_f32((const float *)p + i);
        *b = vld1q_f32((const float *)p + i + 4);
        return;
    case HQ_F_F16: {
        const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16((const hr_fp16 *)p + i));
        *a = vcvt_f32_f16(vget_low_f16(h));
        *b = vcvt_high_f32_f16(h);
        return;
    }
    default: {
        const uint16x8_t h = vld1q_u16((const hr_bf16 *)p + i);
        *a = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
        *b = vreinterpretq_f32_u32(vshll_high_n_u16(h, 16));
        return;
    }
    }
}

HQ_INLINE float hq_load1(int kind, const void *p, int i) {
    switch (kind) {
    case HQ_F_F32: return ((const float *)p)[i];
    case HQ_F_F16: return hq_h2f(((const hr_fp16 *)p)[i]);
    default:       return hr_bf16_to_fp32(((const hr_bf16 *)p)[i]);
    }
}

/* 16 elements a step into four accumulators (FMA latency 4 on most cores, 2 per cycle) */
HQ_INLINE float hq_vec_dot_float(int kind, int n, const void *x, const void *y) {
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        float32x4_t x0, x1, x2, x3, y0, y1, y2, y3;
        hq_load8(kind, x, i, &x0, &x1);
        hq_load8(kind, x, i + 8, &x2, &x3);
        hq_load8(kind, y, i, &y0, &y1);
        hq_load8(kind, y, i + 8, &y2, &y3);
        acc0 = vfmaq_f32(acc0, x0, y0);
        acc1 = vfmaq_f32(acc1, x1, y1);
        acc2 = vfmaq_f32(acc2, x2, y2);
        acc3 = vfmaq_f32(acc3, x3, y3);
    }
    for (; i + 8 <= n; i += 8) {
        float32x4_t x0, x1, y0, y1;
        hq_load8(kind, x, i, &x0, &x1);
        hq_load8(kind, y, i, &y0, &y1);
        acc0 = vfmaq_f32(acc0, x0, y0);
        acc1 = vfmaq_f32(acc1, x1, y1);
    }
    float sum = vaddvq_f32(vaddq_f32(vaddq_f32(acc0, acc1), vaddq_f32(acc2, acc3)));
    for (; i < n; i++) sum += hq_load1(kind, x, i) * hq_load1(kind, y, i);
    return sum;
}

void hq_vec_dot_neon_f32(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_float(HQ_F_F32, n, x, y);
}
void hq_vec_dot_neon_f16(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_float(HQ_F_F16, n, x, y);
}
void hq_vec_dot_neon_bf16(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_float(HQ_F_BF16, n, x, y);
}

/* one weight row against C (1..4) activation rows, 8 elements a step */
HQ_INLINE void hq_tile_float_1xC(int kind, int C, int n, float *s, size_t lds, const void *x, const void *y,
                                 size_t by) {
    float32x4_t acc0[4], acc1[4];
    const void *yc[4];
    #pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        acc0[c] = acc1[c] = vdupq_n_f32(0.0f);
        yc[c] = (const char *)y + (size_t)c * by;
    }
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        float32x4_t w0, w1;
        hq_load8(kind, x, i, &w0, &w1);
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            float32x4_t a0, a1;
            hq_load8(kind, yc[c], i, &a0, &a1);
            acc0[c] = vfmaq_f32(acc0[c], w0, a0);
            acc1[c] = vfmaq_f32(acc1[c], w1, a1);
        }
    }
    #pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        float sum = vaddvq_f32(vaddq_f32(acc0[c], acc1[c]));
        for (int k = i; k < n; k++) sum += hq_load1(kind, x, k) * hq_load1(kind, yc[c], k);
        s[(size_t)c * lds] = sum;
    }
}

HQ_INLINE void hq_gemm_float(int kind, int n, float *s, size_t lds, const void *x, size_t bx, int nr,
                             const void *y, size_t by, int nc) {
    for (int j = 0; j < nc; j += 4) {
        const char *yj = (const char *)y + (size_t)j * by;
        float *sj = s + (size_t)j * lds;
        for (int i = 0; i < nr; i++) {
            const char *xi = (const char *)x + (size_t)i * bx;
            switch (nc - j) {
            case 1:  hq_tile_float_1xC(kind, 1, n, sj + i, lds, xi, yj, by); break;
            case 2:  hq_tile_float_1xC(kind, 2, n, sj + i, lds, xi, yj, by); break;
            case 3:  hq_tile_float_1xC(kind, 3, n, sj + i, lds, xi, yj, by); break;
            default: hq_tile_float_1xC(kind, 4, n, sj + i, lds, xi, yj, by); break;
            }
        }
    }
}

#define HQ_GEMM_NEON_FLOAT(t, KIND)                                                                     \
    void hq_gemm_neon_##t(int n, float *restrict s, size_t lds, const void *restrict x, size_t bx, int nr, \
                          const void *restrict y, size_t by, int nc) {                                 \
        hq_gemm_float(KIND, n, s, lds, x, bx, nr, y, by, nc);                                         \
    }
HQ_GEMM_NEON_FLOAT(f32, HQ_F_F32)
HQ_GEMM_NEON_FLOAT(f16, HQ_F_F16)
HQ_GEMM_NEON_FLOAT(bf16, HQ_F_BF16)

/* ---- activation quantizers ------------------------------------------------------------------------ */

/* one block of 32: writes d and the codes, returns sum(q) and the float d */
HQ_INLINE int hq_quantize_block_q8(const float *x, hr_fp16 *dst_d, int8_t *qs, float *d_out) {
    float32x4_t v[8];
    float32x4_t m = vdupq_n_f32(0.0f);
    for (int j = 0; j < 8; j++) {
        v[j] = vld1q_f32(x + 4 * j);
        m = vmaxq_f32(m, vabsq_f32(v[j]));
    }
    const float amax = vmaxvq_f32(m);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    *dst_d = hr_fp32_to_fp16(d);
    *d_out = d;
    int32x4_t sum = vdupq_n_s32(0);
    for (int j = 0; j < 8; j += 2) {
        /* FCVTAS: nearest, ties away from zero = roundf */
        const int32x4_t q0 = vcvtaq_s32_f32(vmulq_n_f32(v[j], id));
        const int32x4_t q1 = vcvtaq_s32_f32(vmulq_n_f32(v[j + 1], id));
        sum = vaddq_s32(sum, vaddq_s32(q0, q1));
        const int16x8_t q16 = vcombine_s16(vmovn_s32(q0), vmovn_s32(q1));
        vst1_s8(qs + 4 * j, vmovn_s16(q16));
    }
    return vaddvq_s32(sum);
}

void hq_quantize_neon_q8_0(const float *restrict x, void *restrict vy, int64_t k) {
    block_q8_0 *y = vy;
    const int64_t nb = k / QK8_0;
    float d;
    for (int64_t i = 0; i < nb; i++) hq_quantize_block_q8(x + i * QK8_0, &y[i].d, y[i].qs, &d);
}

void hq_quantize_neon_q8_1(const float *restrict x, void *restrict vy, int64_t k) {
    block_q8_1 *y = vy;
    const int64_t nb = k / QK8_1;
    for (int64_t i = 0; i < nb; i++) {
        float d;
        const int sum = hq_quantize_block_q8(x + i * QK8_1, &y[i].d, y[i].qs, &d);
        y[i].s = hr_fp32_to_fp16((float)sum * d);
    }
}

#endif /* __aarch64__ && __ARM_NEON */
