/* quant, ARM: NEON attention kernels — see quant.h ("attention kernels") and arch/x86/attn.c.
 *
 * Scores four positions per register: a 4x4 tile of K (F16 widened with FCVTL) is transposed so
 * that register dd holds element d0+dd of the four rows, and each lane adds q[d] * k[d] in order
 * d = 0, 1, ... Values: acc[d] += p_i * v_i[d] four d at a time. Every product goes through an empty
 * asm statement before its sum, so the compiler cannot fuse them into FMLA (a fused multiply-add
 * would round differently from the generic kernels, whose bits these must reproduce).
 */
#include "quant/quant-impl.h"

#if defined(__aarch64__) && defined(__ARM_NEON)

#include <arm_neon.h>

/* the product, kept apart from the sum that follows */
static inline float32x4_t hq_mul_sep(float32x4_t a, float32x4_t b) {
    float32x4_t p = vmulq_f32(a, b);
    __asm__("" : "+w"(p));
    return p;
}
static inline float hq_mul_sep1(float a, float b) {
    float p = a * b;
    __asm__("" : "+w"(p));
    return p;
}

static inline float32x4_t hq_load4(const uint8_t *p, bool f16) {
    return f16 ? vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p))) : vld1q_f32((const float *)p);
}

static inline float hq_elem(const uint8_t *row, int d, bool f16) {
    return f16 ? hr_fp16_to_fp32(((const hr_fp16 *)row)[d]) : ((const float *)row)[d];
}

static void hq_att_kq1(int n, int hd, const float *restrict q, const uint8_t *restrict k, size_t row, bool f16,
                      float *restrict s) {
    size_t es = f16 ? 2 : 4;
    int i = 0;
    if (hd % 4 == 0)
        for (; i + 4 <= n; i += 4) {
            float32x4_t acc = vdupq_n_f32(0.0f);
            const uint8_t *k0 = k + (size_t)i * row;
            for (int d0 = 0; d0 < hd; d0 += 4) {
                float32x4_t r0 = hq_load4(k0 + (size_t)d0 * es, f16);
                float32x4_t r1 = hq_load4(k0 + row + (size_t)d0 * es, f16);
                float32x4_t r2 = hq_load4(k0 + 2 * row + (size_t)d0 * es, f16);
                float32x4_t r3 = hq_load4(k0 + 3 * row + (size_t)d0 * es, f16);
                /* 4x4 transpose: c[dd] = element d0+dd of rows 0..3 */
                float32x4x2_t t01 = vtrnq_f32(r0, r1), t23 = vtrnq_f32(r2, r3);
                float32x4_t c0 = vcombine_f32(vget_low_f32(t01.val[0]), vget_low_f32(t23.val[0]));
                float32x4_t c1 = vcombine_f32(vget_low_f32(t01.val[1]), vget_low_f32(t23.val[1]));
                float32x4_t c2 = vcombine_f32(vget_high_f32(t01.val[0]), vget_high_f32(t23.val[0]));
                float32x4_t c3 = vcombine_f32(vget_high_f32(t01.val[1]), vget_high_f32(t23.val[1]));
                acc = vaddq_f32(acc, hq_mul_sep(vdupq_n_f32(q[d0]), c0));
                acc = vaddq_f32(acc, hq_mul_sep(vdupq_n_f32(q[d0 + 1]), c1));
                acc = vaddq_f32(acc, hq_mul_sep(vdupq_n_f32(q[d0 + 2]), c2));
                acc = vaddq_f32(acc, hq_mul_sep(vdupq_n_f32(q[d0 + 3]), c3));
            }
            vst1q_f32(s + i, acc);
        }
    for (; i < n; i++) {
        const uint8_t *kr = k + (size_t)i * row;
        float sum = 0.0f;
        for (int d = 0; d < hd; d++) sum += hq_mul_sep1(q[d], hq_elem(kr, d, f16));
        s[i] = sum;
    }
}

/* query after query (the AVX2 kernel shares each transposed tile between queries; not done here) */
void hq_att_kq_neon(int n, int hd, int nq, const float *restrict q, size_t qs, const uint8_t *restrict k, size_t row,
                    bool f16, float *restrict s, size_t ss) {
    for (int j = 0; j < nq; j++) hq_att_kq1(n, hd, q + (size_t)j * qs, k, row, f16, s + (size_t)j * ss);
}

static void hq_att_kv1(int n, int hd, const float *restrict p, const uint8_t *restrict v, size_t row, bool f16,
                      float *restrict acc) {
    size_t es = f16 ? 2 : 4;
    int d0 = 0;
    for (; d0 + 4 <= hd; d0 += 4) {
        float32x4_t a = vld1q_f32(acc + d0);
        for (int i = 0; i < n; i++)
            a = vaddq_f32(a, hq_mul_sep(vdupq_n_f32(p[i]), hq_load4(v + (size_t)i * row + (size_t)d0 * es, f16)));
        vst1q_f32(acc + d0, a);
    }
    for (; d0 < hd; d0++)
        for (int i = 0; i < n; i++) acc[d0] += hq_mul_sep1(p[i], hq_elem(v + (size_t)i * row, d0, f16));
}

void hq_att_kv_neon(int n, int hd, int nq, const float *restrict p, size_t ps, const uint8_t *restrict v, size_t row,
                    bool f16, float *restrict acc, size_t as) {
    for (int j = 0; j < nq; j++) hq_att_kv1(n, hd, p + (size_t)j * ps, v, row, f16, acc + (size_t)j * as);
}

static void hq_att_scale16(int hd, hr_fp16 *restrict acc, float m) {
    int d = 0;
    for (; d + 4 <= hd; d += 4) {
        float32x4_t a = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(acc + d)));
        vst1_u16(acc + d, vreinterpret_u16_f16(vcvt_f16_f32(vmulq_n_f32(a, m))));
    }
    for (; d < hd; d++) acc[d] = hr_fp32_to_fp16(hr_fp16_to_fp32(acc[d]) * m);
}

static void hq_att_mad16(int hd, hr_fp16 *restrict acc, const hr_fp16 *restrict v, float p) {
    int d = 0;
    for (; d + 4 <= hd; d += 4) {
        float32x4_t a = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(acc + d)));
        float32x4_t x = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(v + d)));
        float32x4_t r = vaddq_f32(hq_mul_sep(x, vdupq_n_f32(p)), a);
        vst1_u16(acc + d, vreinterpret_u16_f16(vcvt_f16_f32(r)));
    }
    for (; d < hd; d++) acc[d] = hr_fp32_to_fp16(hq_mul_sep1(hr_fp16_to_fp32(v[d]), p) + hr_fp16_to_fp32(acc[d]));
}

/* head after head, position after position through the accumulator in memory (the AVX2 kernel keeps
   it in registers and widens each V chunk once for a GQA group's heads; not done here yet) */
void hq_att_acc16_neon(int n, int hd, int nq, hr_fp16 *restrict acc, size_t as, const uint8_t *restrict v,
                       size_t row, const float *restrict m, const float *restrict p, size_t ps) {
    for (int j = 0; j < nq; j++)
        for (int i = 0; i < n; i++) {
            if (m[(size_t)j * ps + i] != 1.0f) hq_att_scale16(hd, acc + (size_t)j * as, m[(size_t)j * ps + i]);
            hq_att_mad16(hd, acc + (size_t)j * as, (const hr_fp16 *)(v + (size_t)i * row), p[(size_t)j * ps + i]);
        }
}

#endif
