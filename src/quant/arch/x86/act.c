/* quant, x86 AVX2/FMA: the FFN gate, silu(g) * u, eight lanes at a time — see quant.h.
 *
 * exp(x) = 2^k * e^r with k = round(x / ln 2) and r = x - k ln 2 (ln 2 in two parts, so r is exact to
 * a few ulp), |r| <= ln2 / 2; e^r by its Taylor polynomial to degree 7, whose truncation error
 * (|r|^8 / 8! < 5e-9) is below half an ulp of the result; 2^k built in the exponent field.  The
 * input is clamped to [-87, 88] so that 2^k stays a normal float: for silu that only changes
 * results whose magnitude is below 1e-36 (g < -87), NaN goes through (the clamp keeps it).
 * Measured against expf over the range silu sees (|x| < 80): within 2 ulp (test-quant).
 * Why: silu over the FFN's 8192 gates per layer was ~1.5% of a Llama-3.2-1B decode token through
 * expf one at a time. */
#include "quant/quant-impl.h"

#include <immintrin.h>
#include <math.h>

static inline __m256 hq_exp8(__m256 x) {
    /* min/max return their second operand when one is NaN: NaN survives the clamp */
    x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(_mm256_set1_ps(-87.0f), x));
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);       /* ln 2, high part (exact k*hi) */
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);           /* ln 2 - high part */
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

void hq_silu_mul_avx2(int64_t n, float *restrict g, const float *restrict u) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 e = hq_exp8(_mm256_sub_ps(zero, x));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}
