/* quant, x86: AVX2/FMA/F16C kernels for the float types and the 32-element quants — see quant.h.
 *
 * This file is compiled with -mavx2 -mfma -mf16c; quant.c installs its kernels only when the CPU
 * has all three.  Decoding calls vec_dot once per weight row, so these loops are the hot path.
 *
 * Integer dots: a weight block becomes its 32 codes in one ymm register — unsigned for the 4/5-bit
 * types (value = d*(code - z) with zero point z = 8/16 for Q4_0/Q5_0, d*code + m for Q4_1/Q5_1,
 * the min entering through the activation's s = d*sum(q)), signed for Q8_0.
 * _mm256_maddubs_epi16 multiplies unsigned by signed bytes: unsigned codes go in as they are and
 * the zero point comes off as z*sum(a); signed Q8_0 codes use the "sign trick" |w| * (a with w's
 * sign).  Pairs summed in 16 bits cannot saturate: codes <= 31, and for Q8_0 2*127*127 < 32767
 * (codes are in [-127, 127]; a -128, which no quantizer writes, would not be exact).  Each
 * block's 8 partial int32 sums become float and are scaled by dx*dy with one FMA, so a row needs a
 * single horizontal sum at the end.
 *
 * Activation quantizers reproduce the reference byte for byte (including roundf's half-away-from-
 * zero), so results do not depend on which kernel family ran — a device without AVX2 computes the
 * same activations as one with it.
 */
#include "quant/quant.h"

#include <immintrin.h>

#define HQ_INLINE static inline __attribute__((always_inline))

/* ---- helpers -------------------------------------------------------------------------------------- */

/* Block scales go through hr_fp16_table (filled by hr_init, which hq_get_traits runs): a load
   that runs on the load ports, where F16C's vcvtph2ps needs a move into a vector register and a
   conversion on the vector ports the integer work is queueing for.  On Zen 3 this made Q4_0
   vec_dot ~12% faster, and broadcasting straight from the table another ~8%. */
HQ_INLINE float hq_h2f(hr_fp16 h) { return hr_fp16_to_fp32(h); }
/* the same, in all 8 lanes: a broadcast load straight from the table, no shuffle */
HQ_INLINE __m256 hq_h2v(hr_fp16 h) { return _mm256_broadcast_ss(&hr_fp16_table[h]); }

HQ_INLINE float hq_hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

HQ_INLINE float hq_hmax_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* 16 bytes of packed nibbles -> 32 bytes 0..15 in element order: low nibbles are elements 0..15,
   high nibbles elements 16..31 */
HQ_INLINE __m256i hq_nibbles(const uint8_t *qs) {
    const __m128i b = _mm_loadu_si128((const __m128i *)qs);
    const __m256i v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* 32 bits (little-endian u32 at p) -> 32 bytes, 0xFF where bit j is set */
HQ_INLINE __m256i hq_bits_to_bytes(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    /* byte j takes source byte j/8 (both 128-bit lanes hold all four), then tests its own bit */
    const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL,
                                              0x0303030303030303LL);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* 8 int32 partial sums of (signed w) * (signed a), by the sign trick */
HQ_INLINE __m256i hq_dot_ss(__m256i w, __m256i a) {
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* ---- weight blocks as 32 bytes ------------------------------------------------------------------- */

enum { HQ_K_Q4_0, HQ_K_Q4_1, HQ_K_Q5_0, HQ_K_Q5_1, HQ_K_Q8_0 };

/* codes are unsigned, value = d*(code - zero point) (+ m for the _1 kinds); Q8_0 codes are signed */
HQ_INLINE int hq_kind_zp(int kind) { return kind == HQ_K_Q4_0 ? 8 : kind == HQ_K_Q5_0 ? 16 : 0; }
HQ_INLINE bool hq_kind_min(int kind) { return kind == HQ_K_Q4_1 || kind == HQ_K_Q5_1; }

HQ_INLINE size_t hq_kind_size(int kind) {
    switch (kind) {
    case HQ_K_Q4_0: return sizeof(block_q4_0);
    case HQ_K_Q4_1: return sizeof(block_q4_1);
    case HQ_K_Q5_0: return sizeof(block_q5_0);
    case HQ_K_Q5_1: return sizeof(block_q5_1);
    default:        return sizeof(block_q8_0);
    }
}

/* block b of a weight row: its 32 codes, scale and min. The 5-bit kinds share the 4-bit layout
   plus bit 4 of each code in qh. */
HQ_INLINE __m256i hq_load_w(int kind, const void *row, int b, __m256 *d, float *m) {
    const char *p = (const char *)row + (size_t)b * hq_kind_size(kind);
    switch (kind) {
    case HQ_K_Q4_0: {
        const block_q4_0 *x = (const block_q4_0 *)p;
        *d = hq_h2v(x->d);
        return hq_nibbles(x->qs);
    }
    case HQ_K_Q4_1: {
        const block_q4_1 *x = (const block_q4_1 *)p;
        *d = hq_h2v(x->d);
        *m = hq_h2f(x->m);
        return hq_nibbles(x->qs);
    }
    case HQ_K_Q5_0: {
        const block_q5_0 *x = (const block_q5_0 *)p;
        *d = hq_h2v(x->d);
        const __m256i hi = _mm256_and_si256(hq_bits_to_bytes(x->qh), _mm256_set1_epi8(0x10));
        return _mm256_or_si256(hq_nibbles(x->qs), hi);
    }
    case HQ_K_Q5_1: {
        const block_q5_1 *x = (const block_q5_1 *)p;
        *d = hq_h2v(x->d);
        *m = hq_h2f(x->m);
        const __m256i hi = _mm256_and_si256(hq_bits_to_bytes(x->qh), _mm256_set1_epi8(0x10));
        return _mm256_or_si256(hq_nibbles(x->qs), hi);
    }
    default: {
        const block_q8_0 *x = (const block_q8_0 *)p;
        *d = hq_h2v(x->d);
        return _mm256_loadu_si256((const __m256i *)x->qs);
    }
    }
}

/* Activation blocks: Q8_1 (with s) for the kinds with a min, Q8_0 for the others. */
HQ_INLINE const int8_t *hq_load_a(int kind, const void *row, int b, __m256 *d, float *s) {
    if (!hq_kind_min(kind)) {
        const block_q8_0 *y = (const block_q8_0 *)row + b;
        *d = hq_h2v(y->d);
        return y->qs;
    }
    const block_q8_1 *y = (const block_q8_1 *)row + b;
    *d = hq_h2v(y->d);
    *s = hq_h2f(y->s);
    return y->qs;
}

/* acc += dx*dy * (block's integer dot); *summ += m*s for the kinds with a min.
   With a zero point z the dot is sum(code*a) - z*sum(a): two maddubs and a subtract, one
   instruction less than recentering the codes and using the sign trick (Q4_0 +12% on Zen 3).
   16-bit pair sums stay below 2*31*128 + 2*16*128 < 32767. */
HQ_INLINE __m256 hq_block_dot(int kind, const void *x, const void *y, int b, __m256 acc, float *summ) {
    __m256 dx, dy;
    float mx = 0.0f, sy = 0.0f;
    const __m256i w = hq_load_w(kind, x, b, &dx, &mx);
    const int8_t *qa = hq_load_a(kind, y, b, &dy, &sy);
    const __m256i a = _mm256_loadu_si256((const __m256i *)qa);
    __m256i p;
    if (kind == HQ_K_Q8_0) {
        p = hq_dot_ss(w, a);
    } else {
        __m256i p16 = _mm256_maddubs_epi16(w, a);
        if (hq_kind_zp(kind))
            p16 = _mm256_sub_epi16(p16, _mm256_maddubs_epi16(_mm256_set1_epi8((char)hq_kind_zp(kind)), a));
        p = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
    }
    if (hq_kind_min(kind)) *summ += mx * sy;
    return _mm256_fmadd_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(p), acc);
}

/* two independent accumulators: the FMA chain, not the integer work, would otherwise set the pace */
HQ_INLINE float hq_vec_dot_blocks(int kind, int n, const void *x, const void *y) {
    const int nb = n / QK8_0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float summ0 = 0.0f, summ1 = 0.0f;
    int b = 0;
    for (; b + 1 < nb; b += 2) {
        acc0 = hq_block_dot(kind, x, y, b, acc0, &summ0);
        acc1 = hq_block_dot(kind, x, y, b + 1, acc1, &summ1);
    }
    if (b < nb) acc0 = hq_block_dot(kind, x, y, b, acc0, &summ0);
    return hq_hsum_ps(_mm256_add_ps(acc0, acc1)) + (summ0 + summ1);
}

void hq_vec_dot_avx2_q4_0(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_blocks(HQ_K_Q4_0, n, x, y);
}
void hq_vec_dot_avx2_q4_1(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_blocks(HQ_K_Q4_1, n, x, y);
}
void hq_vec_dot_avx2_q5_0(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_blocks(HQ_K_Q5_0, n, x, y);
}
void hq_vec_dot_avx2_q5_1(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_blocks(HQ_K_Q5_1, n, x, y);
}
void hq_vec_dot_avx2_q8_0(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_blocks(HQ_K_Q8_0, n, x, y);
}

/* ---- tiles for prefill ---------------------------------------------------------------------------- */

/* One weight row against C (1..4) activation rows: each weight block is unpacked once and used C
   times. C is a constant at every call and the C loops are unrolled, so acc[] lives in registers
   (left to itself GCC kept it on the stack, a store-to-load chain per row and block).  Here the
   sign trick is the cheaper one: |w| is computed once per weight block, leaving one sign + one
   maddubs per activation row. */
HQ_INLINE void hq_tile_1xC(int kind, int C, int nb, float *s, size_t lds, const void *x, const void *y,
                           size_t by) {
    __m256 acc[4];
    float summ[4];
    #pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        acc[c] = _mm256_setzero_ps();
        summ[c] = 0.0f;
    }
    const bool sign_trick = !hq_kind_min(kind);
    for (int b = 0; b < nb; b++) {
        __m256 dx;
        float mx = 0.0f;
        __m256i w = hq_load_w(kind, x, b, &dx, &mx);
        if (hq_kind_zp(kind)) w = _mm256_sub_epi8(w, _mm256_set1_epi8((char)hq_kind_zp(kind)));
        const __m256i aw = sign_trick ? _mm256_sign_epi8(w, w) : w;
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            __m256 dy;
            float sy = 0.0f;
            const int8_t *qa = hq_load_a(kind, (const char *)y + (size_t)c * by, b, &dy, &sy);
            __m256i a = _mm256_loadu_si256((const __m256i *)qa);
            if (sign_trick) a = _mm256_sign_epi8(a, w);
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, a), _mm256_set1_epi16(1));
            acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(p), acc[c]);
            if (hq_kind_min(kind)) summ[c] += mx * sy;
        }
    }
    #pragma GCC unroll 4
    for (int c = 0; c < C; c++) s[(size_t)c * lds] = hq_hsum_ps(acc[c]) + summ[c];
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

#define HQ_GEMM_AVX2(t, KIND)                                                                           \
    void hq_gemm_avx2_##t(int n, float *restrict s, size_t lds, const void *restrict x, size_t bx, int nr, \
                          const void *restrict y, size_t by, int nc) {                                 \
        hq_gemm_blocks(KIND, n, s, lds, x, bx, nr, y, by, nc);                                        \
    }
HQ_GEMM_AVX2(q4_0, HQ_K_Q4_0)
HQ_GEMM_AVX2(q4_1, HQ_K_Q4_1)
HQ_GEMM_AVX2(q5_0, HQ_K_Q5_0)
HQ_GEMM_AVX2(q5_1, HQ_K_Q5_1)
HQ_GEMM_AVX2(q8_0, HQ_K_Q8_0)

/* ---- float types ---------------------------------------------------------------------------------- */

enum { HQ_F_F32, HQ_F_F16, HQ_F_BF16 };

/* 8 elements starting at element i, as floats */
HQ_INLINE __m256 hq_load8(int kind, const void *p, int i) {
    switch (kind) {
    case HQ_F_F32:
        return _mm256_loadu_ps((const float *)p + i);
    case HQ_F_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const hr_fp16 *)p + i)));
    default: {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const hr_bf16 *)p + i)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
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

/* four accumulators hide the FMA latency (4 cycles, 2 per cycle) */
HQ_INLINE float hq_vec_dot_float(int kind, int n, const void *x, const void *y) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm256_fmadd_ps(hq_load8(kind, x, i), hq_load8(kind, y, i), acc0);
        acc1 = _mm256_fmadd_ps(hq_load8(kind, x, i + 8), hq_load8(kind, y, i + 8), acc1);
        acc2 = _mm256_fmadd_ps(hq_load8(kind, x, i + 16), hq_load8(kind, y, i + 16), acc2);
        acc3 = _mm256_fmadd_ps(hq_load8(kind, x, i + 24), hq_load8(kind, y, i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(hq_load8(kind, x, i), hq_load8(kind, y, i), acc0);
    float sum = hq_hsum_ps(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++) sum += hq_load1(kind, x, i) * hq_load1(kind, y, i);
    return sum;
}

void hq_vec_dot_avx2_f32(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_float(HQ_F_F32, n, x, y);
}
void hq_vec_dot_avx2_f16(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_float(HQ_F_F16, n, x, y);
}
void hq_vec_dot_avx2_bf16(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_float(HQ_F_BF16, n, x, y);
}

/* one weight row against C (1..4) activation rows, 16 elements a step (two chains per row) */
HQ_INLINE void hq_tile_float_1xC(int kind, int C, int n, float *s, size_t lds, const void *x, const void *y,
                                 size_t by) {
    __m256 acc0[4], acc1[4];
    const void *yc[4];
    #pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        acc0[c] = acc1[c] = _mm256_setzero_ps();
        yc[c] = (const char *)y + (size_t)c * by;
    }
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 w0 = hq_load8(kind, x, i), w1 = hq_load8(kind, x, i + 8);
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            acc0[c] = _mm256_fmadd_ps(w0, hq_load8(kind, yc[c], i), acc0[c]);
            acc1[c] = _mm256_fmadd_ps(w1, hq_load8(kind, yc[c], i + 8), acc1[c]);
        }
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 w0 = hq_load8(kind, x, i);
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++) acc0[c] = _mm256_fmadd_ps(w0, hq_load8(kind, yc[c], i), acc0[c]);
    }
    #pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        float sum = hq_hsum_ps(_mm256_add_ps(acc0[c], acc1[c]));
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

#define HQ_GEMM_AVX2_FLOAT(t, KIND)                                                                     \
    void hq_gemm_avx2_##t(int n, float *restrict s, size_t lds, const void *restrict x, size_t bx, int nr, \
                          const void *restrict y, size_t by, int nc) {                                 \
        hq_gemm_float(KIND, n, s, lds, x, bx, nr, y, by, nc);                                         \
    }
HQ_GEMM_AVX2_FLOAT(f32, HQ_F_F32)
HQ_GEMM_AVX2_FLOAT(f16, HQ_F_F16)
HQ_GEMM_AVX2_FLOAT(bf16, HQ_F_BF16)

/* ---- activation quantizers ------------------------------------------------------------------------ */

/* roundf() of 8 floats: half away from zero, exactly (t = trunc|v| and |v| - t are exact) */
HQ_INLINE __m256i hq_round_away(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 a = _mm256_andnot_ps(sign, v);
    const __m256 t = _mm256_round_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 up = _mm256_cmp_ps(_mm256_sub_ps(a, t), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 r = _mm256_add_ps(t, _mm256_and_ps(up, _mm256_set1_ps(1.0f)));
    return _mm256_cvttps_epi32(_mm256_or_ps(r, _mm256_and_ps(sign, v)));
}

/* one block of 32: writes d and the codes, returns sum(q) and the float d */
HQ_INLINE int hq_quantize_block_q8(const float *x, hr_fp16 *dst_d, int8_t *qs, float *d_out) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
    const __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
    const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                   _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    const float amax = hq_hmax_ps(m);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    *dst_d = (hr_fp16)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    *d_out = d;
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i q0 = hq_round_away(_mm256_mul_ps(v0, vid)), q1 = hq_round_away(_mm256_mul_ps(v1, vid));
    const __m256i q2 = hq_round_away(_mm256_mul_ps(v2, vid)), q3 = hq_round_away(_mm256_mul_ps(v3, vid));
    /* packs work per 128-bit lane: the bytes come out as dwords 0 4 1 5 2 6 3 7 of the wanted order */
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    const __m256i q = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)qs, q);
    const __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

void hq_quantize_avx2_q8_0(const float *restrict x, void *restrict vy, int64_t k) {
    block_q8_0 *y = vy;
    const int64_t nb = k / QK8_0;
    float d;
    for (int64_t i = 0; i < nb; i++) hq_quantize_block_q8(x + i * QK8_0, &y[i].d, y[i].qs, &d);
}

void hq_quantize_avx2_q8_1(const float *restrict x, void *restrict vy, int64_t k) {
    block_q8_1 *y = vy;
    const int64_t nb = k / QK8_1;
    for (int64_t i = 0; i < nb; i++) {
        float d;
        const int sum = hq_quantize_block_q8(x + i * QK8_1, &y[i].d, y[i].qs, &d);
        y[i].s = (hr_fp16)_cvtss_sh((float)sum * d, _MM_FROUND_TO_NEAREST_INT);
    }
}
