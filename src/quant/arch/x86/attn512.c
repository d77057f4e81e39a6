/* quant, x86 AVX-512: the F16 attention path's accumulator (quant.h, hq_att_acc16_fn) on 16 lanes.
 *
 * Each step rounds every element to F16 and back (vcvtps2ph, vcvtph2ps); those conversions bound the
 * AVX2 kernel (attn.c), and one 512-bit conversion does 16 elements where a 256-bit one does 8.  The
 * steps, their order and their roundings are the AVX2 kernel's, element by element, so the bits are
 * the same (tests/test-quant.c).  Like attn.c this file is compiled with -ffp-contract=off
 * (CMakeLists.txt): the product and the sum are rounded separately. */
#include "quant/quant.h"

#include <immintrin.h>

void hq_att_acc16_avx2(int n, int hd, int nq, hr_fp16 *restrict acc, size_t as, const uint8_t *restrict v,
                       size_t row, const float *restrict m, const float *restrict p, size_t ps);

/* round each lane to F16 and back (nearest even) */
static inline __m512 hq_r16z(__m512 x) { return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)); }

/* C chunks of 16 elements of NQ heads' accumulators in registers across the n positions */
#define HQ_ACC16Z_BLOCK(C, NQ)                                                                         \
    for (; d0 + 16 * (C) <= hd; d0 += 16 * (C)) {                                                      \
        __m512 a[NQ][C];                                                                               \
        _Pragma("GCC unroll 4") for (int j = 0; j < (NQ); j++)                                         \
            _Pragma("GCC unroll 4") for (int k = 0; k < (C); k++)                                      \
                a[j][k] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(acc + j * as + d0 + 16 * k))); \
        for (int i = 0; i < n; i++) {                                                                  \
            const hr_fp16 *vi = (const hr_fp16 *)(v + (size_t)i * row) + d0;                           \
            __m512 x[C];                                                                               \
            _Pragma("GCC unroll 4") for (int k = 0; k < (C); k++)                                      \
                x[k] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(vi + 16 * k)));            \
            _Pragma("GCC unroll 4") for (int j = 0; j < (NQ); j++) {                                   \
                const float mj = m[j * ps + i];                                                        \
                if (mj != 1.0f) {                                                                      \
                    const __m512 vm = _mm512_set1_ps(mj);                                              \
                    _Pragma("GCC unroll 4") for (int k = 0; k < (C); k++) a[j][k] = hq_r16z(_mm512_mul_ps(a[j][k], vm)); \
                }                                                                                      \
                const __m512 vp = _mm512_set1_ps(p[j * ps + i]);                                       \
                _Pragma("GCC unroll 4") for (int k = 0; k < (C); k++)                                  \
                    a[j][k] = hq_r16z(_mm512_add_ps(_mm512_mul_ps(x[k], vp), a[j][k]));                \
            }                                                                                          \
        }                                                                                              \
        _Pragma("GCC unroll 4") for (int j = 0; j < (NQ); j++)                                         \
            _Pragma("GCC unroll 4") for (int k = 0; k < (C); k++)                                      \
                _mm256_storeu_si256((__m256i *)(acc + j * as + d0 + 16 * k), _mm512_cvtps_ph(a[j][k], _MM_FROUND_TO_NEAREST_INT)); \
    }

/* heads in groups of up to 4, 64 or 16 elements at a time; what a head size leaves (< 16) goes to
   the AVX2 kernel, element d's steps being independent of the others' */
void hq_att_acc16_avx512(int n, int hd, int nq, hr_fp16 *restrict acc, size_t as, const uint8_t *restrict v,
                         size_t row, const float *restrict m, const float *restrict p, size_t ps) {
    for (int j0 = 0; j0 < nq; j0 += 4, acc += 4 * as, m += 4 * ps, p += 4 * ps) {
        const int g = nq - j0 < 4 ? nq - j0 : 4;
        int d0 = 0;
        switch (g) {
        case 1: HQ_ACC16Z_BLOCK(4, 1) HQ_ACC16Z_BLOCK(1, 1) break;
        case 2: HQ_ACC16Z_BLOCK(4, 2) HQ_ACC16Z_BLOCK(1, 2) break;
        case 3: HQ_ACC16Z_BLOCK(4, 3) HQ_ACC16Z_BLOCK(1, 3) break;
        default: HQ_ACC16Z_BLOCK(4, 4) HQ_ACC16Z_BLOCK(1, 4) break;
        }
        if (d0 < hd) hq_att_acc16_avx2(n, hd - d0, g, acc + d0, as, v + (size_t)d0 * sizeof(hr_fp16), row, m, p, ps);
    }
}
