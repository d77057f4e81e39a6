/* quant, x86 AVX-512: the F16 attention path's accumulator (quant.h, hq_att_acc16_fn) on 16 lanes, and
 * the F32 path's scores (hq_att_kq_fn) on 16 positions per register (below).
 *
 * Each step rounds every element to F16 and back (vcvtps2ph, vcvtph2ps); those conversions bound the
 * AVX2 kernel (attn.c), and one 512-bit conversion does 16 elements where a 256-bit one does 8.  The
 * steps, their order and their roundings are the AVX2 kernel's, element by element, so the bits are
 * the same (tests/test-quant.c).  Like attn.c this file is compiled with -ffp-contract=off
 * (CMakeLists.txt): the product and the sum are rounded separately. */
#include "attn.h"

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

/* ---- the F32 path's scores (hq_att_kq_fn) on 16 positions per register ------------------------------ */

void hq_att_kq_avx2(int n, int hd, int nq, const float *restrict q, size_t qs, const uint8_t *restrict k, size_t row,
                    bool f16, float *restrict s, size_t ss);

/* up to 4 queries against 16 positions: rows j and 8 + j of a 16 x 8 tile of K side by side in one
   register, each half transposed as attn.c's 8x8 tile (in-lane unpacks and shuffles, then one
   two-source permute per register for the step that crosses 128-bit lanes), so register dd holds
   element d0 + dd of the 16 positions in order; then each lane adds q[d] * k[d] in order d = 0, 1, ...
   — the generic kernel's order and roundings.  Four chains of 16-lane additions keep Zen 4's two
   256-bit adders busy, where the AVX2 kernel's four chains of 8 lanes left them half idle. */
static inline __attribute__((always_inline)) void hq_kqz(int nq, int hd, const float *q, size_t qs, const uint8_t *k0,
                                                         size_t row, size_t es, bool f16, float *s, size_t ss) {
    const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
    const __m512i hi = _mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int d0 = 0; d0 < hd; d0 += 8) {
        __m512 r[8];
        for (int j = 0; j < 8; j++) {
            const __m256 a = hq_load8(k0 + (size_t)j * row + (size_t)d0 * es, f16);
            const __m256 b = hq_load8(k0 + (size_t)(8 + j) * row + (size_t)d0 * es, f16);
            r[j] = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(a)), _mm256_castps_pd(b), 1));
        }
        const __m512 t0 = _mm512_unpacklo_ps(r[0], r[1]), t1 = _mm512_unpackhi_ps(r[0], r[1]);
        const __m512 t2 = _mm512_unpacklo_ps(r[2], r[3]), t3 = _mm512_unpackhi_ps(r[2], r[3]);
        const __m512 t4 = _mm512_unpacklo_ps(r[4], r[5]), t5 = _mm512_unpackhi_ps(r[4], r[5]);
        const __m512 t6 = _mm512_unpacklo_ps(r[6], r[7]), t7 = _mm512_unpackhi_ps(r[6], r[7]);
        const __m512 u0 = _mm512_shuffle_ps(t0, t2, 0x44), u1 = _mm512_shuffle_ps(t0, t2, 0xEE);
        const __m512 u2 = _mm512_shuffle_ps(t1, t3, 0x44), u3 = _mm512_shuffle_ps(t1, t3, 0xEE);
        const __m512 u4 = _mm512_shuffle_ps(t4, t6, 0x44), u5 = _mm512_shuffle_ps(t4, t6, 0xEE);
        const __m512 u6 = _mm512_shuffle_ps(t5, t7, 0x44), u7 = _mm512_shuffle_ps(t5, t7, 0xEE);
        r[0] = _mm512_permutex2var_ps(u0, lo, u4), r[4] = _mm512_permutex2var_ps(u0, hi, u4);
        r[1] = _mm512_permutex2var_ps(u1, lo, u5), r[5] = _mm512_permutex2var_ps(u1, hi, u5);
        r[2] = _mm512_permutex2var_ps(u2, lo, u6), r[6] = _mm512_permutex2var_ps(u2, hi, u6);
        r[3] = _mm512_permutex2var_ps(u3, lo, u7), r[7] = _mm512_permutex2var_ps(u3, hi, u7);
#pragma GCC unroll 4
        for (int j = 0; j < nq; j++) {
            const float *qj = q + (size_t)j * qs + d0;
#pragma GCC unroll 8
            for (int dd = 0; dd < 8; dd++) acc[j] = _mm512_add_ps(acc[j], _mm512_mul_ps(_mm512_set1_ps(qj[dd]), r[dd]));
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < nq; j++) _mm512_storeu_ps(s + (size_t)j * ss, acc[j]);
}

/* blocks of 16 positions here, what is left (fewer than 16, or a head size not a multiple of 8) to
   the AVX2 kernel */
void hq_att_kq_avx512(int n, int hd, int nq, const float *restrict q, size_t qs, const uint8_t *restrict k, size_t row,
                      bool f16, float *restrict s, size_t ss) {
    const size_t es = f16 ? 2 : 4;
    int i = 0;
    if (hd % 8 == 0)
        for (; i + 16 <= n; i += 16)
            for (int j0 = 0; j0 < nq; j0 += 4) {
                const int m = nq - j0 < 4 ? nq - j0 : 4;
                const uint8_t *k0 = k + (size_t)i * row;
                const float *qj = q + (size_t)j0 * qs;
                float *sj = s + (size_t)j0 * ss + i;
                HQ_BY_NQ(m, hq_kqz, hd, qj, qs, k0, row, es, f16, sj, ss);
            }
    if (i < n) hq_att_kq_avx2(n - i, hd, nq, q, qs, k + (size_t)i * row, row, f16, s + i, ss);
}
