/* quant: portable reference kernels for the float types and the 32-element ("legacy") quants —
   see quant.h.
 *
 * These define the formats: block layouts and rounding are ggml's, so a file quantized here reads
 * the same in llama.cpp and the other way round, and the SIMD kernels in arch/ are tested against
 * these.  Dots accumulate each block's products exactly in integers and the blocks in float, as
 * ggml's scalar kernels do.
 *
 * Rounding, as ggml's *_ref quantizers do it (the SIMD activation quantizers reproduce it byte for
 * byte):
 *   Q4_0/Q5_0  d = max / -8 (-16), max = the value of largest magnitude, sign kept, so that value
 *              lands exactly on the most negative code; q = (int)(x/d + 8.5) clamped to 15 (31)
 *   Q4_1/Q5_1  d = (max - min) / 15 (31), m = min; q = (int)((x - min)/d + 0.5) clamped
 *   Q8_0/Q8_1  d = amax / 127; q = roundf(x/d) (half away from zero); Q8_1 adds s = d * sum(q)
 * In every case x/d is computed as x * (1/d) with the float d, before d is rounded to fp16.
 */
#include "quant/quant-impl.h"

#include <float.h>
#include <math.h>

/* ---- float types ---------------------------------------------------------------------------------- */

void hq_quantize_ref_f32(const float *restrict x, void *restrict vy, int64_t k) {
    memcpy(vy, x, (size_t)k * sizeof(float));
}

void hq_dequantize_ref_f32(const void *restrict vx, float *restrict y, int64_t k) {
    memcpy(y, vx, (size_t)k * sizeof(float));
}

void hq_vec_dot_ref_f32(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const float *x = vx, *y = vy;
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += x[i] * y[i];
    *s = sum;
}

void hq_quantize_ref_f16(const float *restrict x, void *restrict vy, int64_t k) {
    hr_fp16 *y = vy;
    for (int64_t i = 0; i < k; i++) y[i] = hr_fp32_to_fp16(x[i]);
}

void hq_dequantize_ref_f16(const void *restrict vx, float *restrict y, int64_t k) {
    const hr_fp16 *x = vx;
    for (int64_t i = 0; i < k; i++) y[i] = hr_fp16_to_fp32(x[i]);
}

/* the product of two halves is exact in float (11 + 11 significant bits), so only the sum rounds */
void hq_vec_dot_ref_f16(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const hr_fp16 *x = vx, *y = vy;
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += hr_fp16_to_fp32(x[i]) * hr_fp16_to_fp32(y[i]);
    *s = sum;
}

void hq_quantize_ref_bf16(const float *restrict x, void *restrict vy, int64_t k) {
    hr_bf16 *y = vy;
    for (int64_t i = 0; i < k; i++) y[i] = hr_fp32_to_bf16(x[i]);
}

void hq_dequantize_ref_bf16(const void *restrict vx, float *restrict y, int64_t k) {
    const hr_bf16 *x = vx;
    for (int64_t i = 0; i < k; i++) y[i] = hr_bf16_to_fp32(x[i]);
}

void hq_vec_dot_ref_bf16(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const hr_bf16 *x = vx, *y = vy;
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += hr_bf16_to_fp32(x[i]) * hr_bf16_to_fp32(y[i]);
    *s = sum;
}

/* ---- helpers for the block quantizers ------------------------------------------------------------ */

/* the element of largest magnitude, with its sign (the first one on ties, as ggml) */
static float hq_signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static void hq_min_max(const float *x, int n, float *min, float *max) {
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *min = lo;
    *max = hi;
}

/* (int)(v) clamped to [0, hi]; v >= 0 up to float rounding, so the truncation is a floor */
static inline int hq_trunc_clamp(float v, int hi) {
    int q = v > 0.0f ? (int)v : 0;
    return q > hi ? hi : q;
}

static inline uint32_t hq_load_u32le(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void hq_store_u32le(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* ---- Q4_0: x = d * (q - 8); byte j holds element j (low nibble) and element j+16 (high nibble) --- */

void hq_quantize_ref_q4_0(const float *restrict x, void *restrict vy, int64_t k) {
    block_q4_0 *y = vy;
    const int64_t nb = k / QK4_0;
    for (int64_t i = 0; i < nb; i++, x += QK4_0) {
        const float d = hq_signed_absmax(x, QK4_0) / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = hr_fp32_to_fp16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const int lo = hq_trunc_clamp(x[j] * id + 8.5f, 15);
            const int hi = hq_trunc_clamp(x[j + QK4_0 / 2] * id + 8.5f, 15);
            y[i].qs[j] = (uint8_t)(lo | hi << 4);
        }
    }
}

void hq_dequantize_ref_q4_0(const void *restrict vx, float *restrict y, int64_t k) {
    const block_q4_0 *x = vx;
    const int64_t nb = k / QK4_0;
    for (int64_t i = 0; i < nb; i++, y += QK4_0) {
        const float d = hr_fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[j] = (float)((x[i].qs[j] & 15) - 8) * d;
            y[j + QK4_0 / 2] = (float)((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

void hq_vec_dot_ref_q4_0(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    const int nb = n / QK8_0;
    float sum = 0.0f;
    for (int i = 0; i < nb; i++) {
        int isum = 0;
        for (int j = 0; j < QK4_0 / 2; j++) {
            isum += ((x[i].qs[j] & 15) - 8) * y[i].qs[j];
            isum += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + QK4_0 / 2];
        }
        sum += (float)isum * (hr_fp16_to_fp32(x[i].d) * hr_fp16_to_fp32(y[i].d));
    }
    *s = sum;
}

/* ---- Q4_1: x = d * q + m ---------------------------------------------------------------------------- */

void hq_quantize_ref_q4_1(const float *restrict x, void *restrict vy, int64_t k) {
    block_q4_1 *y = vy;
    const int64_t nb = k / QK4_1;
    for (int64_t i = 0; i < nb; i++, x += QK4_1) {
        float min, max;
        hq_min_max(x, QK4_1, &min, &max);
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = hr_fp32_to_fp16(d);
        y[i].m = hr_fp32_to_fp16(min);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const int lo = hq_trunc_clamp((x[j] - min) * id + 0.5f, 15);
            const int hi = hq_trunc_clamp((x[j + QK4_1 / 2] - min) * id + 0.5f, 15);
            y[i].qs[j] = (uint8_t)(lo | hi << 4);
        }
    }
}

void hq_dequantize_ref_q4_1(const void *restrict vx, float *restrict y, int64_t k) {
    const block_q4_1 *x = vx;
    const int64_t nb = k / QK4_1;
    for (int64_t i = 0; i < nb; i++, y += QK4_1) {
        const float d = hr_fp16_to_fp32(x[i].d), m = hr_fp16_to_fp32(x[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            y[j] = (float)(x[i].qs[j] & 15) * d + m;
            y[j + QK4_1 / 2] = (float)(x[i].qs[j] >> 4) * d + m;
        }
    }
}

/* sum_j (dx*qx_j + m) * dy*qy_j = dx*dy * sum(qx*qy) + m * (dy * sum(qy)), the last factor being s */
void hq_vec_dot_ref_q4_1(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q4_1 *x = vx;
    const block_q8_1 *y = vy;
    const int nb = n / QK8_1;
    float sum = 0.0f;
    for (int i = 0; i < nb; i++) {
        int isum = 0;
        for (int j = 0; j < QK4_1 / 2; j++) {
            isum += (x[i].qs[j] & 15) * y[i].qs[j];
            isum += (x[i].qs[j] >> 4) * y[i].qs[j + QK4_1 / 2];
        }
        sum += (float)isum * (hr_fp16_to_fp32(x[i].d) * hr_fp16_to_fp32(y[i].d)) +
               hr_fp16_to_fp32(x[i].m) * hr_fp16_to_fp32(y[i].s);
    }
    *s = sum;
}

/* ---- Q5_0: x = d * (q - 16); low 4 bits as Q4_0, bit 4 of element j is bit j of qh (LE u32) ----- */

void hq_quantize_ref_q5_0(const float *restrict x, void *restrict vy, int64_t k) {
    block_q5_0 *y = vy;
    const int64_t nb = k / QK5_0;
    for (int64_t i = 0; i < nb; i++, x += QK5_0) {
        const float d = hq_signed_absmax(x, QK5_0) / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = hr_fp32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            const int lo = hq_trunc_clamp(x[j] * id + 16.5f, 31);
            const int hi = hq_trunc_clamp(x[j + QK5_0 / 2] * id + 16.5f, 31);
            y[i].qs[j] = (uint8_t)((lo & 15) | (hi & 15) << 4);
            qh |= (uint32_t)(lo >> 4) << j;
            qh |= (uint32_t)(hi >> 4) << (j + QK5_0 / 2);
        }
        hq_store_u32le(y[i].qh, qh);
    }
}

void hq_dequantize_ref_q5_0(const void *restrict vx, float *restrict y, int64_t k) {
    const block_q5_0 *x = vx;
    const int64_t nb = k / QK5_0;
    for (int64_t i = 0; i < nb; i++, y += QK5_0) {
        const float d = hr_fp16_to_fp32(x[i].d);
        const uint32_t qh = hq_load_u32le(x[i].qh);
        for (int j = 0; j < QK5_0 / 2; j++) {
            const int lo = (x[i].qs[j] & 15) | (int)((qh >> j) & 1) << 4;
            const int hi = (x[i].qs[j] >> 4) | (int)((qh >> (j + QK5_0 / 2)) & 1) << 4;
            y[j] = (float)(lo - 16) * d;
            y[j + QK5_0 / 2] = (float)(hi - 16) * d;
        }
    }
}

void hq_vec_dot_ref_q5_0(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q5_0 *x = vx;
    const block_q8_0 *y = vy;
    const int nb = n / QK8_0;
    float sum = 0.0f;
    for (int i = 0; i < nb; i++) {
        const uint32_t qh = hq_load_u32le(x[i].qh);
        int isum = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            const int lo = (x[i].qs[j] & 15) | (int)((qh >> j) & 1) << 4;
            const int hi = (x[i].qs[j] >> 4) | (int)((qh >> (j + QK5_0 / 2)) & 1) << 4;
            isum += (lo - 16) * y[i].qs[j] + (hi - 16) * y[i].qs[j + QK5_0 / 2];
        }
        sum += (float)isum * (hr_fp16_to_fp32(x[i].d) * hr_fp16_to_fp32(y[i].d));
    }
    *s = sum;
}

/* ---- Q5_1: x = d * q + m, bits as Q5_0 ------------------------------------------------------------ */

void hq_quantize_ref_q5_1(const float *restrict x, void *restrict vy, int64_t k) {
    block_q5_1 *y = vy;
    const int64_t nb = k / QK5_1;
    for (int64_t i = 0; i < nb; i++, x += QK5_1) {
        float min, max;
        hq_min_max(x, QK5_1, &min, &max);
        const float d = (max - min) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = hr_fp32_to_fp16(d);
        y[i].m = hr_fp32_to_fp16(min);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            /* ggml does not clamp here; (max-min)*id can exceed 31 by an ulp only, so the clamp
               changes nothing but guards the 5-bit field */
            const int lo = hq_trunc_clamp((x[j] - min) * id + 0.5f, 31);
            const int hi = hq_trunc_clamp((x[j + QK5_1 / 2] - min) * id + 0.5f, 31);
            y[i].qs[j] = (uint8_t)((lo & 15) | (hi & 15) << 4);
            qh |= (uint32_t)(lo >> 4) << j;
            qh |= (uint32_t)(hi >> 4) << (j + QK5_1 / 2);
        }
        hq_store_u32le(y[i].qh, qh);
    }
}

void hq_dequantize_ref_q5_1(const void *restrict vx, float *restrict y, int64_t k) {
    const block_q5_1 *x = vx;
    const int64_t nb = k / QK5_1;
    for (int64_t i = 0; i < nb; i++, y += QK5_1) {
        const float d = hr_fp16_to_fp32(x[i].d), m = hr_fp16_to_fp32(x[i].m);
        const uint32_t qh = hq_load_u32le(x[i].qh);
        for (int j = 0; j < QK5_1 / 2; j++) {
            const int lo = (x[i].qs[j] & 15) | (int)((qh >> j) & 1) << 4;
            const int hi = (x[i].qs[j] >> 4) | (int)((qh >> (j + QK5_1 / 2)) & 1) << 4;
            y[j] = (float)lo * d + m;
            y[j + QK5_1 / 2] = (float)hi * d + m;
        }
    }
}

void hq_vec_dot_ref_q5_1(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q5_1 *x = vx;
    const block_q8_1 *y = vy;
    const int nb = n / QK8_1;
    float sum = 0.0f;
    for (int i = 0; i < nb; i++) {
        const uint32_t qh = hq_load_u32le(x[i].qh);
        int isum = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            const int lo = (x[i].qs[j] & 15) | (int)((qh >> j) & 1) << 4;
            const int hi = (x[i].qs[j] >> 4) | (int)((qh >> (j + QK5_1 / 2)) & 1) << 4;
            isum += lo * y[i].qs[j] + hi * y[i].qs[j + QK5_1 / 2];
        }
        sum += (float)isum * (hr_fp16_to_fp32(x[i].d) * hr_fp16_to_fp32(y[i].d)) +
               hr_fp16_to_fp32(x[i].m) * hr_fp16_to_fp32(y[i].s);
    }
    *s = sum;
}

/* ---- Q8_0 / Q8_1: x = d * q, q in [-127, 127] -------------------------------------------------------- */

/* one block's scale and codes; returns sum(q) */
static int hq_quantize_block_q8(const float *x, hr_fp16 *dst_d, int8_t *qs, float *d_out) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    *dst_d = hr_fp32_to_fp16(d);
    *d_out = d;
    int sum = 0;
    for (int j = 0; j < QK8_0; j++) {
        qs[j] = (int8_t)roundf(x[j] * id);
        sum += qs[j];
    }
    return sum;
}

void hq_quantize_ref_q8_0(const float *restrict x, void *restrict vy, int64_t k) {
    block_q8_0 *y = vy;
    const int64_t nb = k / QK8_0;
    float d;
    for (int64_t i = 0; i < nb; i++) hq_quantize_block_q8(x + i * QK8_0, &y[i].d, y[i].qs, &d);
}

void hq_dequantize_ref_q8_0(const void *restrict vx, float *restrict y, int64_t k) {
    const block_q8_0 *x = vx;
    const int64_t nb = k / QK8_0;
    for (int64_t i = 0; i < nb; i++, y += QK8_0) {
        const float d = hr_fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK8_0; j++) y[j] = (float)x[i].qs[j] * d;
    }
}

void hq_vec_dot_ref_q8_0(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q8_0 *x = vx, *y = vy;
    const int nb = n / QK8_0;
    float sum = 0.0f;
    for (int i = 0; i < nb; i++) {
        int isum = 0;
        for (int j = 0; j < QK8_0; j++) isum += x[i].qs[j] * y[i].qs[j];
        sum += (float)isum * (hr_fp16_to_fp32(x[i].d) * hr_fp16_to_fp32(y[i].d));
    }
    *s = sum;
}

void hq_quantize_ref_q8_1(const float *restrict x, void *restrict vy, int64_t k) {
    block_q8_1 *y = vy;
    const int64_t nb = k / QK8_1;
    for (int64_t i = 0; i < nb; i++) {
        float d;
        const int sum = hq_quantize_block_q8(x + i * QK8_1, &y[i].d, y[i].qs, &d);
        y[i].s = hr_fp32_to_fp16((float)sum * d);
    }
}

void hq_dequantize_ref_q8_1(const void *restrict vx, float *restrict y, int64_t k) {
    const block_q8_1 *x = vx;
    const int64_t nb = k / QK8_1;
    for (int64_t i = 0; i < nb; i++, y += QK8_1) {
        const float d = hr_fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK8_1; j++) y[j] = (float)x[i].qs[j] * d;
    }
}

/* Q8_1 is an activation type only; its dot (with itself) exists for the table's symmetry */
void hq_vec_dot_ref_q8_1(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q8_1 *x = vx, *y = vy;
    const int nb = n / QK8_1;
    float sum = 0.0f;
    for (int i = 0; i < nb; i++) {
        int isum = 0;
        for (int j = 0; j < QK8_1; j++) isum += x[i].qs[j] * y[i].qs[j];
        sum += (float)isum * (hr_fp16_to_fp32(x[i].d) * hr_fp16_to_fp32(y[i].d));
    }
    *s = sum;
}
