/* quant, x86: AVX2/F16C attention kernels — see quant.h ("attention kernels").
 *
 * Scores: eight positions at a time, one per lane: an 8x8 tile of K (8 rows, 8 elements of the head
 * dimension, F16 widened by F16C) is transposed so that register dd holds element d0+dd of the
 * eight rows, and each lane adds q[d] * k[d] in order d = 0, 1, ... — the generic kernel's order and
 * roundings, eight times at once. This file is compiled with -ffp-contract=off (CMakeLists.txt):
 * a fused multiply-add would round differently from the generic kernel.
 * Values: acc[d] += p_i * v_i[d] for eight d at a time, positions in order — again the generic order.
 * F16 path: eight elements at a time through F16C, which rounds to nearest even as hr_fp32_to_fp16,
 * the accumulator held in registers across a tile of positions.
 */
#include "attn.h"


/* r[0..8) rows -> columns */
static inline void hq_transpose8(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

static inline float hq_elem(const uint8_t *row, int d, bool f16) {
    return f16 ? _cvtsh_ss(((const uint16_t *)row)[d]) : ((const float *)row)[d];
}

/* up to 4 queries against 8 positions: each 8x8 tile of K loaded, widened and transposed once */
static inline __attribute__((always_inline)) void hq_kq8(int nq, int hd, const float *q, size_t qs, const uint8_t *k0,
                                                         size_t row, size_t es, bool f16, float *s, size_t ss) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int d0 = 0; d0 < hd; d0 += 8) {
        __m256 r[8];
        for (int j = 0; j < 8; j++) r[j] = hq_load8(k0 + (size_t)j * row + (size_t)d0 * es, f16);
        hq_transpose8(r);
#pragma GCC unroll 4
        for (int j = 0; j < nq; j++) {
            const float *qj = q + (size_t)j * qs + d0;
#pragma GCC unroll 8
            for (int dd = 0; dd < 8; dd++) acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(_mm256_set1_ps(qj[dd]), r[dd]));
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < nq; j++) _mm256_storeu_ps(s + (size_t)j * ss, acc[j]);
}

void hq_att_kq_avx2(int n, int hd, int nq, const float *restrict q, size_t qs, const uint8_t *restrict k, size_t row,
                    bool f16, float *restrict s, size_t ss) {
    size_t es = f16 ? 2 : 4;
    int i = 0;
    if (hd % 8 == 0)
        for (; i + 8 <= n; i += 8)
            for (int j0 = 0; j0 < nq; j0 += 4) {
                const int m = nq - j0 < 4 ? nq - j0 : 4;
                const uint8_t *k0 = k + (size_t)i * row;
                const float *qj = q + (size_t)j0 * qs;
                float *sj = s + (size_t)j0 * ss + i;
                HQ_BY_NQ(m, hq_kq8, hd, qj, qs, k0, row, es, f16, sj, ss);
            }
    for (; i < n; i++) {
        const uint8_t *kr = k + (size_t)i * row;
        for (int j = 0; j < nq; j++) {
            const float *qj = q + (size_t)j * qs;
            float sum = 0.0f;
            for (int d = 0; d < hd; d++) sum += qj[d] * hq_elem(kr, d, f16);
            s[(size_t)j * ss + i] = sum;
        }
    }
}

/* up to 4 accumulators of 8 elements, each V chunk loaded and widened once for all of them */
static inline __attribute__((always_inline)) void hq_kv8(int nq, int n, const float *p, size_t ps, const uint8_t *v,
                                                         size_t row, bool f16, float *acc, size_t as) {
    __m256 a[4];
#pragma GCC unroll 4
    for (int j = 0; j < nq; j++) a[j] = _mm256_loadu_ps(acc + (size_t)j * as);
    for (int i = 0; i < n; i++) {
        const __m256 x = hq_load8(v + (size_t)i * row, f16);
#pragma GCC unroll 4
        for (int j = 0; j < nq; j++) a[j] = _mm256_add_ps(a[j], _mm256_mul_ps(_mm256_set1_ps(p[(size_t)j * ps + i]), x));
    }
#pragma GCC unroll 4
    for (int j = 0; j < nq; j++) _mm256_storeu_ps(acc + (size_t)j * as, a[j]);
}

/* the same for two chunks of 8 elements at once: 2 x nq chains of dependent additions (an addition's
   latency is 3 cycles and two can start per cycle, so 4 chains left the adders half idle) */
static inline __attribute__((always_inline)) void hq_kv16(int nq, int n, const float *p, size_t ps, const uint8_t *v,
                                                          size_t row, bool f16, float *acc, size_t as) {
    __m256 a[4], b[4];
#pragma GCC unroll 4
    for (int j = 0; j < nq; j++) a[j] = _mm256_loadu_ps(acc + (size_t)j * as), b[j] = _mm256_loadu_ps(acc + (size_t)j * as + 8);
    const size_t es = f16 ? 2 : 4;
    for (int i = 0; i < n; i++) {
        const __m256 x = hq_load8(v + (size_t)i * row, f16), y = hq_load8(v + (size_t)i * row + 8 * es, f16);
#pragma GCC unroll 4
        for (int j = 0; j < nq; j++) {
            const __m256 pj = _mm256_set1_ps(p[(size_t)j * ps + i]);
            a[j] = _mm256_add_ps(a[j], _mm256_mul_ps(pj, x));
            b[j] = _mm256_add_ps(b[j], _mm256_mul_ps(pj, y));
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < nq; j++) _mm256_storeu_ps(acc + (size_t)j * as, a[j]), _mm256_storeu_ps(acc + (size_t)j * as + 8, b[j]);
}

void hq_att_kv_avx2(int n, int hd, int nq, const float *restrict p, size_t ps, const uint8_t *restrict v, size_t row,
                    bool f16, float *restrict acc, size_t as) {
    size_t es = f16 ? 2 : 4;
    for (int j0 = 0; j0 < nq; j0 += 4) {
        const int m = nq - j0 < 4 ? nq - j0 : 4;
        const float *pj = p + (size_t)j0 * ps;
        float *aj = acc + (size_t)j0 * as;
        int d0 = 0;
        for (; d0 + 16 <= hd; d0 += 16) {
            const uint8_t *vd = v + (size_t)d0 * es;
            HQ_BY_NQ(m, hq_kv16, n, pj, ps, vd, row, f16, aj + d0, as);
        }
        for (; d0 + 8 <= hd; d0 += 8) {
            const uint8_t *vd = v + (size_t)d0 * es;
            HQ_BY_NQ(m, hq_kv8, n, pj, ps, vd, row, f16, aj + d0, as);
        }
        for (; d0 < hd; d0++)
            for (int j = 0; j < m; j++)
                for (int i = 0; i < n; i++) aj[(size_t)j * as + d0] += pj[(size_t)j * ps + i] * hq_elem(v + (size_t)i * row, d0, f16);
    }
}

/* round each lane to F16 and back (nearest even) */
static inline __m256 hq_r16(__m256 x) { return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)); }

/* C chunks of 8 elements of NQ heads' accumulators, held in registers across all n positions; each
   V chunk is widened once for the NQ heads (each element's steps are independent of the others', so
   blocking over d and heads keeps every rounding) */
#define HQ_ACC16_BLOCK(C, NQ)                                                                          \
    for (; d0 + 8 * (C) <= hd; d0 += 8 * (C)) {                                                        \
        __m256 a[NQ][C];                                                                               \
        _Pragma("GCC unroll 4") for (int j = 0; j < (NQ); j++)                                         \
            _Pragma("GCC unroll 8") for (int k = 0; k < (C); k++)                                      \
                a[j][k] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(acc + j * as + d0 + 8 * k))); \
        for (int i = 0; i < n; i++) {                                                                  \
            const hr_fp16 *vi = (const hr_fp16 *)(v + (size_t)i * row) + d0;                           \
            __m256 x[C];                                                                               \
            _Pragma("GCC unroll 8") for (int k = 0; k < (C); k++)                                      \
                x[k] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vi + 8 * k)));                \
            _Pragma("GCC unroll 4") for (int j = 0; j < (NQ); j++) {                                   \
                const float mj = m[j * ps + i];                                                        \
                if (mj != 1.0f) {                                                                      \
                    const __m256 vm = _mm256_set1_ps(mj);                                              \
                    _Pragma("GCC unroll 8") for (int k = 0; k < (C); k++) a[j][k] = hq_r16(_mm256_mul_ps(a[j][k], vm)); \
                }                                                                                      \
                const __m256 vp = _mm256_set1_ps(p[j * ps + i]);                                       \
                _Pragma("GCC unroll 8") for (int k = 0; k < (C); k++)                                  \
                    a[j][k] = hq_r16(_mm256_add_ps(_mm256_mul_ps(x[k], vp), a[j][k]));                 \
            }                                                                                          \
        }                                                                                              \
        _Pragma("GCC unroll 4") for (int j = 0; j < (NQ); j++)                                         \
            _Pragma("GCC unroll 8") for (int k = 0; k < (C); k++)                                      \
                _mm_storeu_si128((__m128i *)(acc + j * as + d0 + 8 * k), _mm256_cvtps_ph(a[j][k], _MM_FROUND_TO_NEAREST_INT)); \
    }

/* elements d0 .. hd-1 of one head's accumulator, one at a time (head sizes not a multiple of 8) */
static void hq_acc16_tail(int d0, int n, int hd, hr_fp16 *restrict acc, const uint8_t *restrict v, size_t row,
                          const float *restrict m, const float *restrict p) {
    for (; d0 < hd; d0++) {
        float a = _cvtsh_ss(acc[d0]);
        for (int i = 0; i < n; i++) {
            const hr_fp16 *vi = (const hr_fp16 *)(v + (size_t)i * row);
            if (m[i] != 1.0f) a = _cvtsh_ss(_cvtss_sh(a * m[i], _MM_FROUND_TO_NEAREST_INT));
            a = _cvtsh_ss(_cvtss_sh(_cvtsh_ss(vi[d0]) * p[i] + a, _MM_FROUND_TO_NEAREST_INT));
        }
        acc[d0] = _cvtss_sh(a, _MM_FROUND_TO_NEAREST_INT);
    }
}

/* The accumulators stay in registers for the whole tile: one head 64 elements at a time, or the
   heads of a GQA group 16 elements at a time, each V chunk widened once for all of them.  (The
   per-position kernels this replaced stored the accumulator and loaded it back after every position,
   a chain through memory of about 170 cycles per position and head; Llama-3.2-1B decode at 64
   positions: attention was 5% of a token.) */
void hq_att_acc16_avx2(int n, int hd, int nq, hr_fp16 *restrict acc, size_t as, const uint8_t *restrict v,
                       size_t row, const float *restrict m, const float *restrict p, size_t ps) {
    for (int j0 = 0; j0 < nq; j0 += 4, acc += 4 * as, m += 4 * ps, p += 4 * ps) {
        const int g = nq - j0 < 4 ? nq - j0 : 4;
        int d0 = 0;
        switch (g) {
        case 1: HQ_ACC16_BLOCK(8, 1) HQ_ACC16_BLOCK(1, 1) break;
        case 2: HQ_ACC16_BLOCK(2, 2) HQ_ACC16_BLOCK(1, 2) break;
        case 3: HQ_ACC16_BLOCK(2, 3) HQ_ACC16_BLOCK(1, 3) break;
        default: HQ_ACC16_BLOCK(2, 4) HQ_ACC16_BLOCK(1, 4) break;
        }
        for (int j = 0; j < g; j++) hq_acc16_tail(d0, n, hd, acc + j * as, v, row, m + j * ps, p + j * ps);
    }
}

/* ---- the softmax's exponential (hq_att_exp_fn): hq_expf four lanes at a time ---------------------- */

/* hq_expf's steps on four doubles (the floats widened exactly); |x| < 88 in every lane */
static inline __m128 hq_exp4(__m128 x) {
    const __m256d xd = _mm256_cvtps_pd(x), inv = _mm256_set1_pd(hq_exp_c[3]), sh = _mm256_set1_pd(hq_exp_c[4]);
    const __m256d kd = _mm256_fmadd_pd(inv, xd, sh);
    const __m256i ki = _mm256_castpd_si256(kd);
    const __m256d r = _mm256_fmsub_pd(inv, xd, _mm256_sub_pd(kd, sh)); /* fma(inv, xd, -k) */
    const __m256i t = _mm256_add_epi64(
        _mm256_i64gather_epi64((const long long *)hq_exp_tab, _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8),
        _mm256_slli_epi64(ki, 47));
    const __m256d z = _mm256_fmadd_pd(_mm256_set1_pd(hq_exp_c[0]), r, _mm256_set1_pd(hq_exp_c[1]));
    const __m256d y = _mm256_fmadd_pd(z, _mm256_mul_pd(r, r),
                                      _mm256_fmadd_pd(_mm256_set1_pd(hq_exp_c[2]), r, _mm256_set1_pd(1.0)));
    return _mm256_cvtpd_ps(_mm256_mul_pd(y, _mm256_castsi256_pd(t)));
}

/* Eight at a time; a group with a lane at |x| >= 88 or NaN (a large gap between scores, the first
   position's -inf) takes those lanes from hq_expf, which hands them to expf.  The tail goes to
   hq_expf too. */
void hq_att_exp_avx2(int n, const float *x, float *y) {
    const __m256i big = _mm256_set1_epi32(0x42afffff), abs = _mm256_set1_epi32(0x7fffffff); /* 88.0f - 1 ulp */
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256i special = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_castps_si256(v), abs), big);
        const __m256 e = _mm256_set_m128(hq_exp4(_mm256_extractf128_ps(v, 1)), hq_exp4(_mm256_castps256_ps128(v)));
        const int m = _mm256_movemask_ps(_mm256_castsi256_ps(special));
        if (m == 0) {
            _mm256_storeu_ps(y + i, e);
            continue;
        }
        float tmp[8], in[8];
        _mm256_storeu_ps(tmp, e);
        _mm256_storeu_ps(in, v);
        for (int k = 0; k < 8; k++) y[i + k] = m >> k & 1 ? hq_expf(in[k]) : tmp[k];
    }
    for (; i < n; i++) y[i] = hq_expf(x[i]);
}
