/* quant, x86 AVX-512 (F, BW, VNNI): the K-quant bodies of Q4_K, Q5_K and Q6_K on 512-bit vectors,
 * under the AVX2 file's driver (kq.h).  Chosen at run time where the CPU has those three
 * extensions; the other K types keep their AVX2 kernels.
 *
 * Why: at two threads each core must stream a K-quant row at 25-28 GB/s to keep up with memory,
 * and the AVX2 bodies top out about there (kbench hot: Q4_K 28, Q6_K 33 GB/s on Zen 5), so decode
 * was limited by arithmetic as much as by memory.  A 512-bit vector takes a whole 64-quant step in
 * about half the instructions:
 *   - one vector holds two sub-blocks side by side, matched to 64 contiguous activation bytes.
 *     Q4_K / Q5_K: the step's 32 code bytes broadcast to both halves, the upper half shifted by 4
 *     under a mask (its high nibbles); Q6_K: 64 bytes of ql as they lie, low or high nibbles;
 *   - the per-sub-block int16 scales come from one vpermw per step;
 *   - maddubs then vpdpwssd (VNNI: the scale's madd and the accumulate in one instruction).
 * The 16 int32 lanes are folded to 8 at the end of each super-block, lane l of the lower half plus
 * lane l of the upper, which holds exactly the integers the AVX2 body leaves in lane l (the same
 * products, summed in another order, and integer sums are exact).  So the floats, and every result,
 * are the AVX2 kernels' bit for bit; tests/test-quant-k.c checks that on CPUs that have AVX-512. */
#include "quant/arch/x86/kq.h"

KQ_INLINE __m512i kz_load(const void *p) { return _mm512_loadu_si512(p); }
/* 32 bytes at p in both halves */
KQ_INLINE __m512i kz_bcast(const void *p) { return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p)); }
/* word-lane mask of the upper 256 bits */
#define KZ_HI ((__mmask32)0xFFFF0000u)

/* vpermw indices: words 0..15 take scale a, words 16..31 scale b (sub-blocks of 32: Q4_K, Q5_K) */
#define KZ_X16(a) a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a
#define KZ_X8(a) a, a, a, a, a, a, a, a
static const uint16_t kz_pick32[4][32] __attribute__((aligned(64))) = {
    {KZ_X16(0), KZ_X16(1)}, {KZ_X16(2), KZ_X16(3)}, {KZ_X16(4), KZ_X16(5)}, {KZ_X16(6), KZ_X16(7)}};
/* sub-blocks of 16 (Q6_K): the 128-bit chunk c of step s (0..3) takes scale 4s + c */
static const uint16_t kz_pick16[4][32] __attribute__((aligned(64))) = {
    {KZ_X8(0), KZ_X8(1), KZ_X8(2), KZ_X8(3)}, {KZ_X8(4), KZ_X8(5), KZ_X8(6), KZ_X8(7)},
    {KZ_X8(8), KZ_X8(9), KZ_X8(10), KZ_X8(11)}, {KZ_X8(12), KZ_X8(13), KZ_X8(14), KZ_X8(15)}};

KQ_INLINE __m512i kz_pick(__m512i s16, const uint16_t *idx) {
    return _mm512_permutexvar_epi16(_mm512_load_si512((const void *)idx), s16);
}

/* word shift by a constant n: left for n > 0, right for n < 0 */
KQ_INLINE __m512i kz_shift(__m512i v, int n) {
    if (n > 0) return _mm512_slli_epi16(v, (unsigned)n);
    if (n < 0) return _mm512_srli_epi16(v, (unsigned)-n);
    return v;
}
/* lower half shifted by lo, upper half by hi (constants after inlining) */
KQ_INLINE __m512i kz_shift2(__m512i v, int lo, int hi) {
    const __m512i a = kz_shift(v, lo);
    if (hi == lo) return a;
    if (hi > 0) return _mm512_mask_slli_epi16(a, KZ_HI, v, (unsigned)hi);
    if (hi < 0) return _mm512_mask_srli_epi16(a, KZ_HI, v, (unsigned)-hi);
    return _mm512_mask_mov_epi16(a, KZ_HI, v);
}

/* a | (b & c) */
KQ_INLINE __m512i kz_or_and(__m512i a, __m512i b, __m512i c) { return _mm512_ternarylogic_epi32(a, b, c, 0xF8); }

/* 16 int32 lanes -> the 8 of the AVX2 body (lane l + lane l + 8) */
KQ_INLINE __m256i kz_fold(__m512i z) {
    return _mm256_add_epi32(_mm512_castsi512_si256(z), _mm512_extracti64x4_epi64(z, 1));
}

/* ---- Q4_K / Q5_K: step j = sub-blocks 2j (low nibbles of qs[32j..]) and 2j+1 (high nibbles) ---------- */

#define KZ_SB_K45(t, FIVE)                                                                                    \
    KQ_INLINE void kq_sb_##t(int NC, const block_##t *x, const block_q8_K *const *y, int i, __m256i *A, __m256i *B) { \
        const __m512i m4 = _mm512_set1_epi8(0x0F), m16 = _mm512_set1_epi8(0x10);                             \
        __m128i sc, mn;                                                                                       \
        kq_k4_scales(x->scales, &sc, &mn);                                                                    \
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn));                                 \
        const __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(sc));                                  \
        __m512i Z[4];                                                                                         \
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) Z[c] = _mm512_setzero_si512();                  \
        __m512i qh = _mm512_setzero_si512();                                                                  \
        if (FIVE) qh = kz_bcast((const uint8_t *)x + offsetof(block_q5_K, qh));                               \
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {                                                 \
            const __m512i q = kz_bcast(x->qs + 32 * j);                                                       \
            __m512i w = _mm512_and_si512(_mm512_mask_srli_epi16(q, KZ_HI, q, 4), m4);                         \
            /* Q5_K: the fifth bit of quant r of sub-block s is bit s of qh[r], moved to bit 4 */             \
            if (FIVE) w = kz_or_and(w, kz_shift2(qh, 4 - 2 * j, 3 - 2 * j), m16);                              \
            const __m512i sv = kz_pick(sc16, kz_pick32[j]);                                                   \
            _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {                                            \
                const __m512i p = _mm512_maddubs_epi16(w, kz_load(y[c][i].qs + 64 * j));                     \
                Z[c] = _mm512_dpwssd_epi32(Z[c], p, sv);                                                      \
            }                                                                                                 \
        }                                                                                                     \
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {                                                \
            A[c] = kz_fold(Z[c]);                                                                             \
            B[c] = _mm256_madd_epi16(kq_load(y[c][i].bsums), mins);                                           \
        }                                                                                                     \
    }
KZ_SB_K45(q4_K, 0)
KZ_SB_K45(q5_K, 1)

/* ---- Q6_K: half h (128 quants), step s = 2h + e: e = 0 the low nibbles of ql[64h..64h+63] (quants
   0-31 and 32-63 of the half), e = 1 their high nibbles (64-95, 96-127); the top two bits of quant
   32p + r of the half are bits 2p, 2p+1 of qh[32h + r]. ---------------------------------------------- */

KQ_INLINE void kq_sb_q6_K(int NC, const block_q6_K *x, const block_q8_K *const *y, int i, __m256i *A, __m256i *B) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
    const __m512i scz = _mm512_castsi256_si512(sc16);
    __m512i Z[4];
#pragma GCC unroll 4
    for (int c = 0; c < NC; c++) Z[c] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i ql = kz_load(x->ql + 64 * h), qh = kz_bcast(x->qh + 32 * h);
#pragma GCC unroll 2
        for (int e = 0; e < 2; e++) {
            const __m512i nib = _mm512_and_si512(e ? _mm512_srli_epi16(ql, 4) : ql, m4);
            /* p = 2e (lower half), 2e + 1 (upper half): bit 2p to bit 4 */
            const __m512i q = kz_or_and(nib, kz_shift2(qh, 4 - 4 * e, 2 - 4 * e), m30);
            const __m512i sv = kz_pick(scz, kz_pick16[2 * h + e]);
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++) {
                const __m512i p = _mm512_maddubs_epi16(q, kz_load(y[c][i].qs + 128 * h + 64 * e));
                Z[c] = _mm512_dpwssd_epi32(Z[c], p, sv);
            }
        }
    }
    /* the quants went in biased by +32: take 32 * sum_j scale_j * bsum_j back out */
#pragma GCC unroll 4
    for (int c = 0; c < NC; c++) {
        const __m256i bias = _mm256_madd_epi16(kq_load(y[c][i].bsums), sc16);
        A[c] = _mm256_sub_epi32(kz_fold(Z[c]), _mm256_slli_epi32(bias, 5));
    }
    (void)B;
}

KQ_KERNELS(q4_K, 1, offsetof(block_q4_K, dmin))
KQ_KERNELS(q5_K, 1, offsetof(block_q5_K, dmin))
KQ_KERNELS(q6_K, 0, 0)

KQ_ENTRY(avx512, q4_K)
KQ_ENTRY(avx512, q5_K)
KQ_ENTRY(avx512, q6_K)
