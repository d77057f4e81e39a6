/* quant, x86 AVX-512 (F, BW, VNNI): the K-quant bodies of Q4_K, Q5_K and Q6_K on 512-bit vectors,
 * under the AVX2 file's driver (kq.h), and (below) Q4_K, Q5_K and Q6_K over their packed "x4" layouts,
 * which decode and prefill use when the weights are loaded into memory.  Chosen at run time where
 * the CPU has those three extensions; the other K types keep their AVX2 kernels.
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
KZ_SB_K45(q5_K, 1)

/* Q4_K: the lanes of kq_fold_k4 (kq.h).  Step j's 16 lanes hold sub-block 2j's partial sums in the
   lower half and 2j + 1's in the upper: steps 0 and 2 accumulate into one vector ([W0 | W1]), steps 1
   and 3 into another ([W2 | W3]). */
KQ_INLINE void kq_sb_q4_K(int NC, const block_q4_K *x, const block_q8_K *const *y, int i, __m256i *A, __m256i *B) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m128i sc, mn;
    kq_k4_scales(x->scales, &sc, &mn);
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn));
    const __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(sc));
    __m512i Z[4][2];
#pragma GCC unroll 4
    for (int c = 0; c < NC; c++) Z[c][0] = Z[c][1] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const __m512i q = kz_bcast(x->qs + 32 * j);
        const __m512i w = _mm512_and_si512(_mm512_mask_srli_epi16(q, KZ_HI, q, 4), m4);
        const __m512i sv = kz_pick(sc16, kz_pick32[j]);
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) {
            const __m512i p = _mm512_maddubs_epi16(w, kz_load(y[c][i].qs + 64 * j));
            Z[c][j % 2] = _mm512_dpwssd_epi32(Z[c][j % 2], p, sv);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < NC; c++) {
        A[c] = kq_fold_k4(_mm512_castsi512_si256(Z[c][0]), _mm512_extracti64x4_epi64(Z[c][0], 1),
                          _mm512_castsi512_si256(Z[c][1]), _mm512_extracti64x4_epi64(Z[c][1], 1));
        B[c] = _mm256_madd_epi16(kq_load(y[c][i].bsums), mins);
    }
}

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

/* ---- Q4_K in the x4 layout (quant.h): decode and prefill over groups of 4 rows --------------------
 *
 * An entry (super-block b of the group's 4 rows, 576 bytes) holds d and dmin of rows 0-3 (16 bytes:
 * d0 m0 d1 m1 ..), their 12-byte scale fields as in the file (48 bytes), then sub-block s = 0..7 at
 * 64 + 64 s: 16 bytes per row, byte k = quant k (low nibble) and quant k + 16 (high nibble).
 *
 * Why: the file-layout body above spends ~85 instructions per super-block of one row, of which the
 * multiplies are 9; the rest is unpacking that row's 6-bit scales in scalar code and one row's float
 * steps, so it streams ~23 GB/s hot on a Zen 4 core, below the 27-30 GB/s per core the memory gives.
 * Four rows in one vector share all of that: one 128-bit lane per row, the scales of four rows
 * unpacked by six vector operations, each sub-block's scale vector one pshufb, and the float steps
 * done for four rows at once (~25 instructions per super-block and row).  Zen 4 VM, kbench 2048 x
 * 8192: hot 23.7 -> 34.7 GB/s; Llama-3.2-1B Q4_K_M decode, fraction of a same-seconds stream, one
 * thread 70-72 -> 84-86%, two threads 71-73 -> 81-84% where the machine gave ~60 GB/s and 92.5 ->
 * ~91% where it gave ~37 (docs/benchmarks.md; 7 KiB prefetch, and more without it: KX_DEC_PF_*);
 * pp128 at two threads +15%.
 *
 * Sums: lane m (0..3) of a row's low accumulator gets quants 4m..4m+3 of every sub-block, times its
 * scale; the high accumulator quants 16+4m..19+4m: the integers the AVX2 body leaves in its lanes m
 * and m + 4.  Each lane's float steps are that body's (d then dmin FMA per super-block), and kx_hsum4
 * adds the lanes as kq_hsum does, so the results are the AVX2 kernel's bit for bit (test-quant). */
enum { KX_ENTRY = 4 * sizeof(block_q4_K) };

/* Decode's software prefetch, bytes ahead of the group stream (0: none, the hardware prefetchers
   alone).  Packed Q4_K and Q6_K read best with none: Llama-3.2-1B Q4_K_M (both types) on the Zen 4
   VM, fraction of a same-seconds stream, alternating runs, none against 7 KiB: one thread 86.8-87.8
   vs 83.3-84.4%, two threads where the machine gave ~36 GB/s 96.1-96.4 vs 89.2-89.6% (the file
   layout: 92.0-92.5), ~55-60 GB/s 87.4-89.4 vs 81.0-83.3%; 2 and 4 KiB were far worse (63-69%), 5-12
   KiB in between.  Q5_K keeps 7 KiB: with none, Q5_K_M at one thread fell from 84.7-85.7 to 76.9-78.9%
   (at two, ~36 GB/s, it gained: 91.6-93.0 vs 88.1%).  (Q4_0's packed AVX2 decode needs its prefetch:
   without, 65-67 vs 84%.) */
#define KX_DEC_PF_q5_K 7168
#define KX_DEC_PF_q6_K 0

/* the scale fields of 4 rows (48 bytes at p, row r's dwords a0 a1 a2 at 3r..3r+2) as one 128-bit
   lane per row: dwords [sc 0-3 | mn 0-3 | sc 4-7 | mn 4-7] (kq_k4_scales' formulas) */
KQ_INLINE __m512i kx_scales(const uint8_t *p) {
    const __m512i v = _mm512_maskz_loadu_epi32(0x0FFF, p);
    const __m512i a = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 1, 2, 2, 3, 4, 5, 5, 6, 7, 8, 8, 9, 10, 11, 11), v);
    const __m512i b = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 0, 1, 3, 3, 3, 4, 6, 6, 6, 7, 9, 9, 9, 10), v);
    /* [a0 & 3f | a1 & 3f | a2 & 0f | (a2 >> 4) & 0f], the top two bits from (a0 >> 2), (a1 >> 2) & 30 */
    const __m512i lowbits = _mm512_and_si512(_mm512_srlv_epi32(a, _mm512_set4_epi32(4, 0, 0, 0)),
                                             _mm512_set4_epi32(0x0f0f0f0f, 0x0f0f0f0f, 0x3f3f3f3f, 0x3f3f3f3f));
    return kz_or_and(lowbits, _mm512_srli_epi32(b, 2), _mm512_set4_epi32(0x30303030, 0x30303030, 0, 0));
}

/* pshufb controls on kx_scales' lanes: scale s as 8 words; the mins of sub-blocks 0-3 (lo) and 4-7
   (hi), each twice, as words */
#define KX_W(b) (b), -128
#define KX_S(s) KX_W(s), KX_W(s), KX_W(s), KX_W(s), KX_W(s), KX_W(s), KX_W(s), KX_W(s)
#define KX_M(a, b, c, d) KX_W(a), KX_W(a), KX_W(b), KX_W(b), KX_W(c), KX_W(c), KX_W(d), KX_W(d)
static const int8_t kx_ctl[10][16] __attribute__((aligned(16))) = {
    {KX_S(0)}, {KX_S(1)}, {KX_S(2)}, {KX_S(3)}, {KX_S(8)}, {KX_S(9)}, {KX_S(10)}, {KX_S(11)},
    {KX_M(4, 5, 6, 7)}, {KX_M(12, 13, 14, 15)}};
KQ_INLINE __m512i kx_pick(__m512i sc, int k) {
    return _mm512_shuffle_epi8(sc, _mm512_broadcast_i32x4(_mm_load_si128((const __m128i *)kx_ctl[k])));
}
KQ_INLINE __m512i kx_bcast16(const void *p) { return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p)); }

/* Q5_K x4: the Q4_K entry's 576 bytes (its nibbles), then the fifth bits in two 64-byte vectors,
   sub-blocks 0-3 and 4-7, 16 bytes per row: bits 2j and 2j + 1 of byte k are those of quants k and
   k + 16 of sub-block 4v + j (vector v).  704 bytes = 4 x 176. */
enum { KX5_ENTRY = 4 * sizeof(block_q5_K) };
/* Zen 4 VM: kbench hot 22 -> 33.5 GB/s; Llama-3.2-1B Q5_K_M decode, fraction of a same-seconds stream,
   one thread 70-75 -> 85-86%, two threads (~38 GB/s) 91.6-92.4 -> 88.3-89.2%; pp128 t2 +22%. */

/* one group (g: its entries) x NC activation rows over super-blocks i0 .. i1; t[2c], t[2c+1]: column
   c's low and high accumulators (one 128-bit lane per row); pf > 0 prefetches pf bytes ahead.
   five: Q5_K (entries of KX5_ENTRY), else Q4_K. */
KQ_INLINE void kx_cols_k45(bool five, int i0, int i1, int NC, const uint8_t *g, const block_q8_K *const *y, __m512 *acc,
                           int pf) {
    const size_t es = five ? KX5_ENTRY : KX_ENTRY;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m16 = _mm512_set1_epi8(0x10);
    const __m512i pick_d = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
    const __m512i pick_m = _mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7, 7);
    const __m256 neg_m = _mm256_castsi256_ps(_mm256_set1_epi64x((long long)0x8000000000000000ull));
    __m512 t[8];
#pragma GCC unroll 8
    for (int c = 0; c < 2 * NC; c++) t[c] = acc[c];
    for (int i = i0; i < i1; i++) {
        const uint8_t *e = g + (size_t)i * es;
        if (pf) kq_prefetch_span((const char *)e + pf, (int)es);
        const __m512i sc = kx_scales(e + 16);
        __m512i Zl[4], Zh[4], h[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        if (five) h[0] = _mm512_loadu_si512(e + KX_ENTRY), h[1] = _mm512_loadu_si512(e + KX_ENTRY + 64);
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) Zl[c] = Zh[c] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
            const __m512i q = _mm512_loadu_si512(e + 64 + 64 * s);
            __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
            if (five) { /* bits 2j, 2j + 1 to bit 4 */
                const int j = s % 4;
                lo = kz_or_and(lo, kz_shift(h[s / 4], 4 - 2 * j), m16);
                hi = kz_or_and(hi, kz_shift(h[s / 4], 3 - 2 * j), m16);
            }
            const __m512i sv = kx_pick(sc, s);
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++) {
                const int8_t *a = y[c][i].qs + 32 * s;
                Zl[c] = _mm512_dpwssd_epi32(Zl[c], _mm512_maddubs_epi16(lo, kx_bcast16(a)), sv);
                Zh[c] = _mm512_dpwssd_epi32(Zh[c], _mm512_maddubs_epi16(hi, kx_bcast16(a + 16)), sv);
            }
        }
        const __m512i ml = kx_pick(sc, 8), mh = kx_pick(sc, 9);
        const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)e)); /* d0 m0 d1 m1 .. */
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) {
            /* per row: dy * d and dy * -dmin, as the AVX2 body forms them */
            const __m512 f = _mm512_castps256_ps512(_mm256_xor_ps(_mm256_mul_ps(dm, _mm256_set1_ps(y[c][i].d)), neg_m));
            const __m512 fd = _mm512_permutexvar_ps(pick_d, f), fm = _mm512_permutexvar_ps(pick_m, f);
            const __m512i bl = _mm512_madd_epi16(kx_bcast16(y[c][i].bsums), ml);
            const __m512i bh = _mm512_madd_epi16(kx_bcast16(y[c][i].bsums + 8), mh);
            t[2 * c] = _mm512_fmadd_ps(fm, _mm512_cvtepi32_ps(bl), _mm512_fmadd_ps(fd, _mm512_cvtepi32_ps(Zl[c]), t[2 * c]));
            t[2 * c + 1] = _mm512_fmadd_ps(fm, _mm512_cvtepi32_ps(bh), _mm512_fmadd_ps(fd, _mm512_cvtepi32_ps(Zh[c]), t[2 * c + 1]));
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < 2 * NC; c++) acc[c] = t[c];
}
KQ_INLINE void kx_cols_q5_K(int i0, int i1, int NC, const uint8_t *g, const block_q8_K *const *y, __m512 *acc, int pf) {
    kx_cols_k45(true, i0, i1, NC, g, y, acc, pf);
}

/* the four rows' sums from a column's accumulators, added as kq_hsum adds a row's eight lanes:
   ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) */
KQ_INLINE __m128 kx_hsum4(__m512 lo, __m512 hi) {
    __m512 u = _mm512_add_ps(lo, hi);
    u = _mm512_add_ps(u, _mm512_permute_ps(u, 0x4E));
    u = _mm512_add_ps(u, _mm512_permute_ps(u, 0xB1));
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), u));
}

/* ---- Q6_K in the x4 layout (quant.h) ------------------------------------------------------------
 *
 * An entry (super-block b of the group's 4 rows, 840 bytes): d of rows 0-3 (8 bytes), their 16
 * int8 scales (64 bytes), then per quad Q = 0..3 of sub-blocks (4Q .. 4Q+3, 16 quants each) at
 * 72 + 192 Q three 64-byte vectors, 16 bytes per row: the low nibbles of sub-blocks 4Q and 4Q+1
 * (byte k: quant k of each), of 4Q+2 and 4Q+3, and the top two bits of all four (bits 2j, 2j+1 of
 * byte k: quant k of sub-block 4Q+j).
 *
 * One vector is a sub-block of four rows, so each row's 128-bit lane takes one scale: one pshufb
 * from the rows' scales widened once per entry.  Even sub-blocks go to the low accumulator, odd
 * ones to the high: lane m of a row's low accumulator then holds what the AVX2 body leaves in its
 * lane m, the high one its lane m + 4 (the AVX2 body's vectors are pairs of sub-blocks), and the
 * bias the same lanes' (32 * scale * bsum of sub-blocks 2m, 2m + 1 and 8 + 2m, 9 + 2m); float steps
 * and the final sums as for Q4_K: the AVX2 kernel's bits.
 * Measured (Zen 4 VM): kbench hot 33 -> 38.5 GB/s, but Llama-3.2-1B Q4_K_M decode (Q6_K: a third of
 * its bytes, the tied head among them) the same with or without it at one and two threads, within
 * the noise (+-1 point of the stream), and pp128 +1%: the stream, not this kernel, is the limit
 * there.  Kept for the hot figure, which machines with more bandwidth per core will need. */
enum { KX6_ENTRY = 4 * sizeof(block_q6_K) };

/* pshufb controls: word w of each lane, 8 times */
#define KX_WW(w) 2 * (w), 2 * (w) + 1
#define KX_S6(w) KX_WW(w), KX_WW(w), KX_WW(w), KX_WW(w), KX_WW(w), KX_WW(w), KX_WW(w), KX_WW(w)
static const int8_t kx_ctl6[8][16] __attribute__((aligned(16))) = {
    {KX_S6(0)}, {KX_S6(1)}, {KX_S6(2)}, {KX_S6(3)}, {KX_S6(4)}, {KX_S6(5)}, {KX_S6(6)}, {KX_S6(7)}};

KQ_INLINE void kx_cols_q6_K(int i0, int i1, int NC, const uint8_t *g, const block_q8_K *const *y, __m512 *acc, int pf) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i pick_d = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 t[8];
#pragma GCC unroll 8
    for (int c = 0; c < 2 * NC; c++) t[c] = acc[c];
    for (int i = i0; i < i1; i++) {
        const uint8_t *e = g + (size_t)i * KX6_ENTRY;
        if (pf) kq_prefetch_span((const char *)e + pf, KX6_ENTRY);
        /* each row's scales as words: 0-7 (slo) and 8-15 (shi) in its lane */
        const __m512i sb = _mm512_loadu_si512(e + 8);
        const __m512i slo = _mm512_srai_epi16(_mm512_unpacklo_epi8(sb, sb), 8);
        const __m512i shi = _mm512_srai_epi16(_mm512_unpackhi_epi8(sb, sb), 8);
        __m512i Zl[4], Zh[4];
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) Zl[c] = Zh[c] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int Q = 0; Q < 4; Q++) {
            const uint8_t *qd = e + 72 + 192 * Q;
            const __m512i a = _mm512_loadu_si512(qd), b = _mm512_loadu_si512(qd + 64), h = _mm512_loadu_si512(qd + 128);
            const __m512i nib[4] = {_mm512_and_si512(a, m4), _mm512_and_si512(_mm512_srli_epi16(a, 4), m4),
                                    _mm512_and_si512(b, m4), _mm512_and_si512(_mm512_srli_epi16(b, 4), m4)};
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const int s = 4 * Q + j;
                const __m512i q = kz_or_and(nib[j], kz_shift(h, 4 - 2 * j), m30);
                const __m512i sv = _mm512_shuffle_epi8(s < 8 ? slo : shi,
                                                       _mm512_broadcast_i32x4(_mm_load_si128((const __m128i *)kx_ctl6[s % 8])));
#pragma GCC unroll 4
                for (int c = 0; c < NC; c++) {
                    const __m512i p = _mm512_maddubs_epi16(q, kx_bcast16(y[c][i].qs + 16 * s));
                    if (s % 2) Zh[c] = _mm512_dpwssd_epi32(Zh[c], p, sv);
                    else Zl[c] = _mm512_dpwssd_epi32(Zl[c], p, sv);
                }
            }
        }
        const __m128 d4 = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)e));
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) {
            /* the quants went in biased by +32 */
            const __m512i bl = _mm512_madd_epi16(kx_bcast16(y[c][i].bsums), slo);
            const __m512i bh = _mm512_madd_epi16(kx_bcast16(y[c][i].bsums + 8), shi);
            const __m512i al = _mm512_sub_epi32(Zl[c], _mm512_slli_epi32(bl, 5));
            const __m512i ah = _mm512_sub_epi32(Zh[c], _mm512_slli_epi32(bh, 5));
            const __m512 fd = _mm512_permutexvar_ps(pick_d, _mm512_castps128_ps512(_mm_mul_ps(d4, _mm_set1_ps(y[c][i].d))));
            t[2 * c] = _mm512_fmadd_ps(fd, _mm512_cvtepi32_ps(al), t[2 * c]);
            t[2 * c + 1] = _mm512_fmadd_ps(fd, _mm512_cvtepi32_ps(ah), t[2 * c + 1]);
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < 2 * NC; c++) acc[c] = t[c];
}

/* nr a multiple of 4 and x a group's start (hq_pack_ok); prefill as the file-layout tiles: 16 rows
   (4 groups) x 4 columns, K in chunks of KQ_KC super-blocks */
#define KX_GEMM_PACKED(t)                                                                                                         \
    void hq_gemm_packed_avx512_##t(int n, float *restrict s, size_t lds, const void *restrict x, size_t bx, int nr,               \
                                   const void *restrict vy, size_t by, int nc) {                                                  \
        const int nb = n / QK_K;                                                                                                  \
        if (nc == 1) { /* decode: the groups one after another, one linear stream */                                              \
            const block_q8_K *yc[1] = {vy};                                                                                       \
            for (int r = 0; r < nr; r += 4) {                                                                                     \
                __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};                                                       \
                kx_cols_##t(0, nb, 1, (const uint8_t *)x + (size_t)r * bx, yc, acc, KX_DEC_PF_##t);                                   \
                _mm_storeu_ps(s + r, kx_hsum4(acc[0], acc[1]));                                                                   \
            }                                                                                                                     \
            return;                                                                                                               \
        }                                                                                                                         \
        for (int r0 = 0; r0 < nr; r0 += KQ_TR) {                                                                                  \
            const int ng = (nr - r0 < KQ_TR ? nr - r0 : KQ_TR) / 4;                                                               \
            for (int j0 = 0; j0 < nc; j0 += 4) {                                                                                  \
                const int C = nc - j0 < 4 ? nc - j0 : 4;                                                                          \
                const block_q8_K *yc[4];                                                                                          \
                for (int c = 0; c < 4; c++) yc[c] = (const block_q8_K *)((const char *)vy + (size_t)(j0 + (c < C ? c : 0)) * by); \
                __m512 acc[KQ_TR / 4][8];                                                                                         \
                for (int g = 0; g < ng; g++)                                                                                      \
                    for (int c = 0; c < 8; c++) acc[g][c] = _mm512_setzero_ps();                                                  \
                for (int i0 = 0; i0 < nb; i0 += KQ_KC) {                                                                          \
                    const int i1 = nb - i0 < KQ_KC ? nb : i0 + KQ_KC;                                                             \
                    for (int g = 0; g < ng; g++) {                                                                                \
                        const uint8_t *grp = (const uint8_t *)x + (size_t)(r0 + 4 * g) * bx;                                      \
                        switch (C) {                                                                                              \
                        case 4: kx_cols_##t(i0, i1, 4, grp, yc, acc[g], 0); break;                                                \
                        case 3: kx_cols_##t(i0, i1, 3, grp, yc, acc[g], 0); break;                                                \
                        case 2: kx_cols_##t(i0, i1, 2, grp, yc, acc[g], 0); break;                                                \
                        default: kx_cols_##t(i0, i1, 1, grp, yc, acc[g], 0); break;                                               \
                        }                                                                                                         \
                    }                                                                                                             \
                }                                                                                                                 \
                for (int g = 0; g < ng; g++)                                                                                      \
                    for (int c = 0; c < C; c++)                                                                                   \
                        _mm_storeu_ps(s + (size_t)(j0 + c) * lds + r0 + 4 * g, kx_hsum4(acc[g][2 * c], acc[g][2 * c + 1]));       \
            }                                                                                                                     \
        }                                                                                                                         \
    }
KX_GEMM_PACKED(q5_K)
KX_GEMM_PACKED(q6_K)

/* ---- Q4_K in the x4v layout (quant.h): one sub-block of one row per int32 lane --------------------
 *
 * An entry (super-block b of the group's 4 rows, 576 bytes) holds d and dmin of rows 0-3 and their
 * scale fields as x4 does (64 bytes), then 8 vectors: vector 4h + i, lane 4r + s = code bytes 4i ..
 * 4i+3 of row r's sub-block 4h + s, byte k of a sub-block holding quants k (low nibble) and k + 16
 * (high nibble).  The activation row is prepared once per call in the same order (kv_prep: per
 * half h and step i, the 16 bytes that meet the low nibbles, then the 16 that meet the high ones), so
 * each vector takes two vpdpbusd, the high nibbles masked in place (x & 0xF0: that sum is 16 times
 * the true one, divided out exactly at the end), and after 8 vectors every lane holds a whole half
 * sub-block's dot product: its scale is applied once per super-block (vpmulld), not per step, where
 * the x4 kernel (Q5_K's, above) needs maddubs and vpdpwssd for every 64 quants.
 *
 * Sums: the lanes of kq_fold_k4 (kq.h): AVX2 lane l < 4 of a row = sub-blocks l and l + 4's first
 * halves (the low-nibble sums of lane l of h = 0 and h = 1, each times its scale), lane l + 4 their
 * second halves; the mins' lanes are the AVX2 body's (sub-block l's min times its activation sum).
 * Float steps and the final sums as x4's, so results are the AVX2 kernel's bit for bit (test-quant).
 * Zen 4 VM: see docs/benchmarks.md (session 14). */
enum { KV_MAX_NB = HQ_K4V_MAX_NE0 / QK_K };

/* super-blocks y[0 .. n) into p[0 .. n) with qs in x4v's order (d and bsums as they are): half h
   (sub-blocks 4h .. 4h+3, 128 bytes) is a 4 x 8 transpose of dwords: dword 8i + 4p + s of the result
   = dword 8s + 4p + i of the half (quants 4i .. 4i+3 of sub-block 4h + s, p = 1: 16 further) */
KQ_INLINE void kv_prep(const block_q8_K *y, block_q8_K *p, int n) {
    const __m512i t0 = _mm512_setr_epi32(0, 8, 16, 24, 4, 12, 20, 28, 1, 9, 17, 25, 5, 13, 21, 29);
    const __m512i t1 = _mm512_setr_epi32(2, 10, 18, 26, 6, 14, 22, 30, 3, 11, 19, 27, 7, 15, 23, 31);
    for (int b = 0; b < n; b++) {
        p[b].d = y[b].d;
        memcpy(p[b].bsums, y[b].bsums, sizeof p[b].bsums);
        for (int h = 0; h < 2; h++) {
            const __m512i a = _mm512_loadu_si512(y[b].qs + 128 * h), c = _mm512_loadu_si512(y[b].qs + 128 * h + 64);
            _mm512_storeu_si512(p[b].qs + 128 * h, _mm512_permutex2var_epi32(a, t0, c));
            _mm512_storeu_si512(p[b].qs + 128 * h + 64, _mm512_permutex2var_epi32(a, t1, c));
        }
    }
}

/* one group (g: its entries) x NC prepared activation rows over super-blocks i0 .. i1 (y[c][i - yo]);
   acc[2c], acc[2c + 1]: column c's AVX2 lanes 0-3 and 4-7, one 128-bit lane per row */
KQ_INLINE void kv_cols_q4_K(int i0, int i1, int yo, int NC, const uint8_t *g, const block_q8_K *const *y, __m512 *acc) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i pick_d = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
    const __m512i pick_m = _mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7, 7);
    const __m256 neg_m = _mm256_castsi256_ps(_mm256_set1_epi64x((long long)0x8000000000000000ull));
    /* the scales of sub-blocks 4h .. 4h+3 as one dword per lane, from kx_scales' [sc 0-3 | mn 0-3 | sc 4-7 | ..] */
    const __m512i sc_h0 = _mm512_set4_epi32(0xFFFFFF03, 0xFFFFFF02, 0xFFFFFF01, 0xFFFFFF00);
    const __m512i sc_h1 = _mm512_set4_epi32(0xFFFFFF0B, 0xFFFFFF0A, 0xFFFFFF09, 0xFFFFFF08);
    __m512 t[8];
#pragma GCC unroll 8
    for (int c = 0; c < 2 * NC; c++) t[c] = acc[c];
    for (int i = i0; i < i1; i++) {
        const uint8_t *e = g + (size_t)i * KX_ENTRY;
        __m512i Zl[4][2], Zh[4][2];
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) Zl[c][0] = Zl[c][1] = Zh[c][0] = Zh[c][1] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int v = 0; v < 8; v++) {
            const __m512i q = _mm512_loadu_si512(e + 64 + 64 * v);
            const __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_andnot_si512(m4, q);
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++) {
                const int8_t *a = y[c][i - yo].qs + 32 * v;
                Zl[c][v / 4] = _mm512_dpbusd_epi32(Zl[c][v / 4], lo, kx_bcast16(a));
                Zh[c][v / 4] = _mm512_dpbusd_epi32(Zh[c][v / 4], hi, kx_bcast16(a + 16));
            }
        }
        const __m512i sc = kx_scales(e + 16);
        const __m512i s0 = _mm512_shuffle_epi8(sc, sc_h0), s1 = _mm512_shuffle_epi8(sc, sc_h1);
        const __m512i ml = kx_pick(sc, 8), mh = kx_pick(sc, 9);
        const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)e)); /* d0 m0 d1 m1 .. */
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) {
            const block_q8_K *yc = &y[c][i - yo];
            const __m512i al = _mm512_add_epi32(_mm512_mullo_epi32(Zl[c][0], s0), _mm512_mullo_epi32(Zl[c][1], s1));
            const __m512i ah = _mm512_srai_epi32(
                _mm512_add_epi32(_mm512_mullo_epi32(Zh[c][0], s0), _mm512_mullo_epi32(Zh[c][1], s1)), 4);
            /* per row: dy * d and dy * -dmin, as the AVX2 body forms them */
            const __m512 f = _mm512_castps256_ps512(_mm256_xor_ps(_mm256_mul_ps(dm, _mm256_set1_ps(yc->d)), neg_m));
            const __m512 fd = _mm512_permutexvar_ps(pick_d, f), fm = _mm512_permutexvar_ps(pick_m, f);
            const __m512i bl = _mm512_madd_epi16(kx_bcast16(yc->bsums), ml);
            const __m512i bh = _mm512_madd_epi16(kx_bcast16(yc->bsums + 8), mh);
            t[2 * c] = _mm512_fmadd_ps(fm, _mm512_cvtepi32_ps(bl), _mm512_fmadd_ps(fd, _mm512_cvtepi32_ps(al), t[2 * c]));
            t[2 * c + 1] = _mm512_fmadd_ps(fm, _mm512_cvtepi32_ps(bh), _mm512_fmadd_ps(fd, _mm512_cvtepi32_ps(ah), t[2 * c + 1]));
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < 2 * NC; c++) acc[c] = t[c];
}

/* KQ_PREP_TILES' hooks: a group is one sub-group here */
#define kv_tile_cols(sub, i0, i1, yo, NC, grp, y, acc) kv_cols_q4_K(i0, i1, yo, NC, grp, y, acc)
KQ_INLINE void kv_store4(float *s, __m512 lo, __m512 hi) { _mm_storeu_ps(s, kx_hsum4(lo, hi)); }

/* nr a multiple of 4, x a group's start and n <= HQ_K4V_MAX_NE0 (hq_pack_ok).  Decode prepares the
   activation row once and walks the groups one after another (one linear stream, no software
   prefetch); prefill: tiles of 16 rows (4 groups) x 4 columns, K in chunks of KQ_KC super-blocks, each
   chunk of the 4 columns prepared once per tile */
void hq_gemm_packed_avx512_q4_K(int n, float *restrict s, size_t lds, const void *restrict x, size_t bx, int nr,
                                const void *restrict vy, size_t by, int nc) {
    const int nb = n / QK_K;
    if (nc == 1) {
        block_q8_K p[KV_MAX_NB];
        kv_prep(vy, p, nb);
        const block_q8_K *yc[1] = {p};
        for (int r = 0; r < nr; r += 4) {
            __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
            kv_cols_q4_K(0, nb, 0, 1, (const uint8_t *)x + (size_t)r * bx, yc, acc);
            _mm_storeu_ps(s + r, kx_hsum4(acc[0], acc[1]));
        }
        return;
    }
    KQ_PREP_TILES(kv_prep, kv_tile_cols, __m512, _mm512_setzero_ps, kv_store4, 1)
}
