/* quant, x86 AVX-512 (F, BW, VNNI): the K-quant bodies of Q4_K, Q5_K and Q6_K on 512-bit vectors,
 * under the AVX2 file's driver (kq.h), and (below) the kernels over their packed layouts (Q5_K: "x4";
 * Q4_K, Q6_K: "x4v"), which decode and prefill use when the weights are loaded into memory.  Chosen at run time where
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

/* (Q4_K's and Q6_K's bodies below fold their lanes differently, kq.h: each lane holds whole
   sub-blocks, the sums their x4v kernels make.) */

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
    __m256i X[4], Y[4][2];
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
                /* the AVX2 body's P[4h + 2e] (lower half) and P[4h + 2e + 1] (upper): kq.h, Q6_K's lanes */
                const __m512i P = _mm512_madd_epi16(_mm512_maddubs_epi16(q, kz_load(y[c][i].qs + 128 * h + 64 * e)), sv);
                const __m256i x = _mm256_hadd_epi32(_mm512_castsi512_si256(P), _mm512_extracti64x4_epi64(P, 1));
                if (e == 0) X[c] = x;
                else Y[c][h] = _mm256_hadd_epi32(X[c], x);
            }
        }
    }
    /* the quants went in biased by +32: take 32 * sum_j scale_j * bsum_j back out */
#pragma GCC unroll 4
    for (int c = 0; c < NC; c++) {
        const __m256i bias = _mm256_madd_epi16(kq_load(y[c][i].bsums), sc16);
        A[c] = _mm256_sub_epi32(kq_fold_y(Y[c][0], Y[c][1]), _mm256_slli_epi32(bias, 5));
    }
    (void)B;
}

KQ_KERNELS(q4_K, 1, offsetof(block_q4_K, dmin))
KQ_KERNELS(q5_K, 1, offsetof(block_q5_K, dmin))
KQ_KERNELS(q6_K, 0, 0)

KQ_ENTRY(avx512, q4_K)
KQ_ENTRY(avx512, q5_K)
KQ_ENTRY(avx512, q6_K)

/* ---- the x4 layout (docs/quant.md): Q5_K's packed form, decode and prefill over groups of 4 rows --------
 *
 * An entry (super-block b of the group's 4 rows) holds d and dmin of rows 0-3 (16 bytes: d0 m0 d1 m1
 * ..), their 12-byte scale fields as in the file (48 bytes), then sub-block s = 0..7 at 64 + 64 s: 16
 * bytes per row, byte k = the low four bits of quant k (low nibble) and of quant k + 16 (high nibble);
 * Q5_K's fifth bits follow (below).
 *
 * Why: the file-layout body above spends ~85 instructions per super-block of one row, of which the
 * multiplies are 9; the rest is unpacking that row's 6-bit scales in scalar code and one row's float
 * steps, so it streams ~23 GB/s hot on a Zen 4 core, below the 27-30 GB/s per core the memory gives.
 * Four rows in one vector share all of that: one 128-bit lane per row, the scales of four rows
 * unpacked by six vector operations, each sub-block's scale vector one pshufb, and the float steps
 * done for four rows at once (~25 instructions per super-block and row).  Zen 4 VM, for Q4_K (which
 * used this layout until session 14, x4v below since), kbench 2048 x 8192: hot 23.7 -> 34.7 GB/s;
 * Llama-3.2-1B Q4_K_M decode, fraction of a same-seconds stream, one thread 70-72 -> 84-86%, two
 * threads 71-73 -> 81-84% where the machine gave ~60 GB/s and 92.5 -> ~91% where it gave ~37
 * (docs/benchmarks.md); pp128 at two threads +15%.
 *
 * Sums: lane m (0..3) of a row's low accumulator gets quants 4m..4m+3 of every sub-block, times its
 * scale; the high accumulator quants 16+4m..19+4m: the integers the AVX2 body leaves in its lanes m
 * and m + 4.  Each lane's float steps are that body's (d then dmin FMA per super-block), and kx_hsum4
 * adds the lanes as kq_hsum does, so the results are the AVX2 kernel's bit for bit (test-quant). */
enum { KX_ENTRY = 4 * sizeof(block_q4_K) };

/* Decode's software prefetch, bytes ahead of the group stream (0: none, the hardware prefetchers
   alone).  Q5_K keeps 7 KiB: with none, Q5_K_M at one thread fell from 84.7-85.7 to 76.9-78.9% (at
   two, ~36 GB/s, it gained: 91.6-93.0 vs 88.1%).  The x4 Q4_K and Q6_K kernels read best with none
   (Llama-3.2-1B Q4_K_M, one thread 86.8-87.8 vs 83.3-84.4% of the stream against 7 KiB; 2 and 4 KiB
   far worse), as do their x4v kernels (no prefetch tried there).  (Q4_0's packed AVX2 decode needs
   its prefetch: without, 65-67 vs 84%.) */
#define KX_DEC_PF_q5_K 7168

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
   c's low and high accumulators (one 128-bit lane per row); pf > 0 prefetches pf bytes ahead (Q5_K:
   entries of KX5_ENTRY, its fifth bits after the x4 bytes) */
KQ_INLINE void kx_cols_q5_K(int i0, int i1, int NC, const uint8_t *g, const block_q8_K *const *y, __m512 *acc, int pf) {
    const size_t es = KX5_ENTRY;
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
        __m512i Zl[4], Zh[4];
        const __m512i h[2] = {_mm512_loadu_si512(e + KX_ENTRY), _mm512_loadu_si512(e + KX_ENTRY + 64)};
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) Zl[c] = Zh[c] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
            const __m512i q = _mm512_loadu_si512(e + 64 + 64 * s);
            /* the fifth bits: 2j, 2j + 1 of the bit vector to bit 4 */
            const int j = s % 4;
            const __m512i lo = kz_or_and(_mm512_and_si512(q, m4), kz_shift(h[s / 4], 4 - 2 * j), m16);
            const __m512i hi = kz_or_and(_mm512_and_si512(_mm512_srli_epi16(q, 4), m4), kz_shift(h[s / 4], 3 - 2 * j), m16);
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

/* the four rows' sums from a column's accumulators, added as kq_hsum adds a row's eight lanes:
   ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) */
KQ_INLINE __m128 kx_hsum4(__m512 lo, __m512 hi) {
    __m512 u = _mm512_add_ps(lo, hi);
    u = _mm512_add_ps(u, _mm512_permute_ps(u, 0x4E));
    u = _mm512_add_ps(u, _mm512_permute_ps(u, 0xB1));
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), u));
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
                /* a few columns (KQ_FEW_NC, kq.h): each group's row in one run, prefetched as decode's */                \
                const int kc = nc <= KQ_FEW_NC ? nb : KQ_KC, pf = nc <= KQ_FEW_NC ? KX_DEC_PF_##t : 0;                    \
                for (int i0 = 0; i0 < nb; i0 += kc) {                                                                             \
                    const int i1 = nb - i0 < kc ? nb : i0 + kc;                                                                   \
                    for (int g = 0; g < ng; g++) {                                                                                \
                        const uint8_t *grp = (const uint8_t *)x + (size_t)(r0 + 4 * g) * bx;                                      \
                        switch (C) {                                                                                              \
                        case 4: kx_cols_##t(i0, i1, 4, grp, yc, acc[g], pf); break;                                               \
                        case 3: kx_cols_##t(i0, i1, 3, grp, yc, acc[g], pf); break;                                               \
                        case 2: kx_cols_##t(i0, i1, 2, grp, yc, acc[g], pf); break;                                               \
                        default: kx_cols_##t(i0, i1, 1, grp, yc, acc[g], pf); break;                                              \
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

/* ---- Q4_K in the x4v layout (docs/quant.md): one sub-block of one row per int32 lane --------------------
 *
 * An entry (super-block b of the group's 4 rows, 576 bytes) holds d and dmin of rows 0-3 and their
 * scale fields as x4 does (64 bytes), then 8 vectors: vector 4h + i, lane 4r + s = code bytes 4i ..
 * 4i+3 of row r's sub-block 4h + s, byte k of a sub-block holding quants k (low nibble) and k + 16
 * (high nibble).  The activation row is prepared once per matmul in the same order (kv_prep: per
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

/* each half (128 bytes) of a super-block's quants q, dwords permuted by t0 (the first 64 bytes of d)
   and t1 (the next 64) from the half's 32 */
KQ_INLINE void kv_perm_qs(const int8_t *q, int8_t *d, __m512i t0, __m512i t1) {
    for (int h = 0; h < 2; h++) {
        const __m512i a = _mm512_loadu_si512(q + 128 * h), c = _mm512_loadu_si512(q + 128 * h + 64);
        _mm512_storeu_si512(d + 128 * h, _mm512_permutex2var_epi32(a, t0, c));
        _mm512_storeu_si512(d + 128 * h + 64, _mm512_permutex2var_epi32(a, t1, c));
    }
}

/* super-blocks y[0 .. n) into p[0 .. n) with qs in x4v's order (d and bsums as they are): half h
   (sub-blocks 4h .. 4h+3, 128 bytes) is a 4 x 8 transpose of dwords: dword 8i + 4p + s of the result
   = dword 8s + 4p + i of the half (quants 4i .. 4i+3 of sub-block 4h + s, p = 1: 16 further) */
KQ_INLINE void kv_prep(const block_q8_K *y, block_q8_K *p, int n) {
    const __m512i t0 = _mm512_setr_epi32(0, 8, 16, 24, 4, 12, 20, 28, 1, 9, 17, 25, 5, 13, 21, 29);
    const __m512i t1 = _mm512_setr_epi32(2, 10, 18, 26, 6, 14, 22, 30, 3, 11, 19, 27, 7, 15, 23, 31);
    for (int b = 0; b < n; b++) {
        p[b].d = y[b].d;
        memcpy(p[b].bsums, y[b].bsums, sizeof p[b].bsums);
        kv_perm_qs(y[b].qs, p[b].qs, t0, t1);
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

/* KQ_PREP_GEMM's hooks: a group is one sub-group here */
#define kv_tile_cols(sub, i0, i1, yo, NC, grp, y, acc) kv_cols_q4_K(i0, i1, yo, NC, grp, y, acc)
KQ_INLINE void kv_store4(float *s, __m512 lo, __m512 hi) { _mm_storeu_ps(s, kx_hsum4(lo, hi)); }

/* whole bands (docs/quant.md), n <= HQ_KV_MAX_NE0 (hq_pack_ok), activation rows prepared by the caller
   (hq_prep_avx512_q4_K).  Decode walks the bands, each K-panel's groups one after another (one
   linear stream, no software prefetch); prefill: tiles of one band (4 groups) x 4 columns, K in
   chunks of KQ_KC super-blocks (kq.h) */
KQ_PREP_GEMM(avx512, q4_K, block_q8_K, kv_prep, kv_tile_cols, __m512, _mm512_setzero_ps, kv_store4, 1, KX_ENTRY, KQ_PU)

/* ---- Q6_K in the x4v layout (docs/quant.md): one sub-block of one row per int32 lane ---------------------
 *
 * An entry (super-block b of the group's 4 rows, 840 bytes) holds the rows' scales and d (72 bytes),
 * then 4 lane sets of 3 vectors: set L holds sub-blocks (0 2 4 6 | 1 3 5 7 | 8 10 12 14 | 9 11 13 15)[L],
 * lane 4r + s one sub-block of row r, byte t of vector w its quant 4w + t (6 bits) plus 2 bits of
 * quant 12 + t on top.  So quants 0-11 are one mask each, quants 12-15 three shifts and three merges,
 * and each of the four 64-quant vectors is one vpdpbusd against the activations prepared in the same
 * order (k6_prep); the scale is applied once per super-block (vpmulld), the +32 bias through 32 times
 * the activation sums, taken from each lane before.  Where the x4 kernel spent per 64 quants a mask,
 * a shift and a merge for the top bits, a pshufb for the scale, maddubs and vpdpwssd.  (The codes
 * of all of a group's super-blocks first, so that the vectors sit on cache lines, read slower from
 * memory: kbench cold 14-16 against 19 GB/s, the tails a second stream.)
 *
 * Sums: Q6_K's lanes of kq.h (lane k of a row: sub-blocks 2k and 2k + 1 whole) = lane k of set 0 plus
 * set 1 (k < 4), of set 2 plus set 3 (k >= 4); float steps and the final sums as x4's: the AVX2
 * kernel's bits (test-quant).  Zen 4 VM: docs/benchmarks.md (session 14). */
enum { K6_ENTRY = 4 * sizeof(block_q6_K), K6_TAIL = 72 };

/* super-blocks y[0 .. n) prepared: quants of set L at 64L, its 4 vectors' 16 bytes each (lane s:
   quants 4t .. 4t+3 of its sub-block), and 32 x the sub-block sums in lane order */
KQ_INLINE void k6_prep(const block_q8_K *y, kq_q6p *p, int n) {
    /* within a half (sub-blocks 8H .. 8H+7, dwords 4j + t of sub-block j): set 2H + L', vector t, lane s
       = dword 4(2s + L') + t */
    const __m512i t0 = _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
    const __m512i t1 = _mm512_add_epi32(t0, _mm512_set1_epi32(4));
    const __m512i bo = _mm512_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
    for (int b = 0; b < n; b++) {
        p[b].d = y[b].d;
        const __m512i bs = _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)y[b].bsums));
        _mm512_storeu_si512(p[b].bs32, _mm512_slli_epi32(_mm512_permutexvar_epi32(bo, bs), 5));
        kv_perm_qs(y[b].qs, p[b].qs, t0, t1);
    }
}

/* one group (g: its entries) x NC prepared activation rows over super-blocks i0 .. i1 (y[c][i - yo]);
   acc[2c], acc[2c + 1]: column c's AVX2 lanes 0-3 and 4-7, one 128-bit lane per row */
KQ_INLINE void k6_cols(int i0, int i1, int yo, int NC, const uint8_t *g, const kq_q6p *const *y, __m512 *acc) {
    const __m512i m3f = _mm512_set1_epi8(0x3F), m03 = _mm512_set1_epi8(0x03), m0f = _mm512_set1_epi8(0x0F);
    const __m512i pick_d = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 t[8];
#pragma GCC unroll 8
    for (int c = 0; c < 2 * NC; c++) t[c] = acc[c];
    for (int i = i0; i < i1; i++) {
        const uint8_t *sd = g + (size_t)i * K6_ENTRY, *e = sd + K6_TAIL;
        __m512i A[4][2];
#pragma GCC unroll 4
        for (int L = 0; L < 4; L++) {
            const __m512i a = _mm512_loadu_si512(e + 192 * L), b = _mm512_loadu_si512(e + 192 * L + 64),
                          c2 = _mm512_loadu_si512(e + 192 * L + 128);
            /* quants 12-15: bits 6-7 of a, b, c to bits 0-1, 2-3, 4-5 (select, then clear 6-7) */
            const __m512i u = _mm512_ternarylogic_epi32(_mm512_srli_epi16(a, 6), _mm512_srli_epi16(b, 4), m03, 0xE4);
            const __m512i v3 = _mm512_and_si512(_mm512_ternarylogic_epi32(u, _mm512_srli_epi16(c2, 2), m0f, 0xE4), m3f);
            const __m512i v[4] = {_mm512_and_si512(a, m3f), _mm512_and_si512(b, m3f), _mm512_and_si512(c2, m3f), v3};
            const __m512i s = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sd + 16 * L)));
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++) {
                const kq_q6p *yc = &y[c][i - yo];
                __m512i z = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int w = 0; w < 4; w++) z = _mm512_dpbusd_epi32(z, v[w], kx_bcast16(yc->qs + 64 * L + 16 * w));
                const __m512i sz = _mm512_mullo_epi32(_mm512_sub_epi32(z, kx_bcast16(yc->bs32 + 4 * L)), s);
                A[c][L / 2] = L % 2 ? _mm512_add_epi32(A[c][L / 2], sz) : sz;
            }
        }
        const __m128 d4 = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(sd + 64)));
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) {
            const __m512 fd = _mm512_permutexvar_ps(pick_d, _mm512_castps128_ps512(_mm_mul_ps(d4, _mm_set1_ps(y[c][i - yo].d))));
            t[2 * c] = _mm512_fmadd_ps(fd, _mm512_cvtepi32_ps(A[c][0]), t[2 * c]);
            t[2 * c + 1] = _mm512_fmadd_ps(fd, _mm512_cvtepi32_ps(A[c][1]), t[2 * c + 1]);
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < 2 * NC; c++) acc[c] = t[c];
}

/* KQ_PREP_GEMM's hook: a group is one sub-group here */
#define k6_tile_cols(sub, i0, i1, yo, NC, grp, y, acc) k6_cols(i0, i1, yo, NC, grp, y, acc)

/* whole bands, n <= HQ_KV_MAX_NE0 (hq_pack_ok); as Q4_K's */
KQ_PREP_GEMM(avx512, q6_K, kq_q6p, k6_prep, k6_tile_cols, __m512, _mm512_setzero_ps, kv_store4, 1, K6_ENTRY, KQ_PU)

/* ---- Q8_K activations: the reference's bytes, a block in 16 registers ------------------------------ */

/* Each block's 256 floats are loaded once and kept in registers.  The signed value of largest
   magnitude comes from the block's maximum and minimum (four chains each): where one of them has the
   larger magnitude it is that value wherever it occurs first; only where both +a and -a occur does the
   first occurrence need a search.  Quantized as the reference (the product, then nearest-even by
   MXCSR's default), narrowed with saturation; the sums of 16 come from sums of 8 bytes (vpsadbw on
   the bytes + 128).  A NaN or infinity anywhere shows as a -128 byte, which no finite block can give,
   and that block goes to the reference.  Zen 4, hot: 8192 values (ffn_down's activations, quantized
   on one thread while the other waits) 2.06 us with the AVX2 quantizer (one chain of maxima, then a
   search of the block for the sign), 1.36 us here. */
void hq_quantize_avx512_q8_K(const float *restrict x, void *restrict vy, int64_t k) {
    block_q8_K *y = vy;
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512i even = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), odd = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
    const __m512i flip = _mm512_set1_epi8((char)0x80), lowest = _mm512_set1_epi8((char)-128);
    for (int64_t b = 0; b < k / QK_K; b++, x += QK_K) {
        __m512 v[16];
        __m512 mx[4], mn[4];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) v[i] = _mm512_loadu_ps(x + 16 * i);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) mx[c] = mn[c] = _mm512_setzero_ps();
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) { /* a NaN lane keeps the running value: the reference skips NaNs */
            mx[i % 4] = _mm512_max_ps(v[i], mx[i % 4]);
            mn[i % 4] = _mm512_min_ps(v[i], mn[i % 4]);
        }
        const float hi = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(mx[0], mx[1]), _mm512_max_ps(mx[2], mx[3])));
        const float lo = _mm512_reduce_min_ps(_mm512_min_ps(_mm512_min_ps(mn[0], mn[1]), _mm512_min_ps(mn[2], mn[3])));
        if (hi == 0 && lo == 0) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        float vmax = hi > -lo ? hi : lo;
        if (hi == -lo) /* both signs at the largest magnitude: the first one's */
            for (int i = 0; i < 16; i++) {
                const __mmask16 e = _mm512_cmp_ps_mask(_mm512_abs_ps(v[i]), _mm512_set1_ps(hi), _CMP_EQ_OQ);
                if (e) {
                    vmax = x[16 * i + __builtin_ctz(e)];
                    break;
                }
            }
        const float iscale = -127.0f / vmax;
        const __m512 vs = _mm512_set1_ps(iscale);
        __m512i s8[4];
        __mmask64 bad = 0;
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(vs, v[4 * i]));
            const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(vs, v[4 * i + 1]));
            const __m512i q2 = _mm512_cvtps_epi32(_mm512_mul_ps(vs, v[4 * i + 2]));
            const __m512i q3 = _mm512_cvtps_epi32(_mm512_mul_ps(vs, v[4 * i + 3]));
            const __m512i p = _mm512_permutexvar_epi32(order, _mm512_packs_epi16(_mm512_packs_epi32(q0, q1), _mm512_packs_epi32(q2, q3)));
            bad |= _mm512_cmpeq_epi8_mask(p, lowest);
            _mm512_storeu_si512(y[b].qs + 64 * i, p);
            s8[i] = _mm512_sad_epu8(_mm512_xor_si512(p, flip), _mm512_setzero_si512()); /* 8 sums of 8 */
        }
        if (bad) {
            hq_quantize_ref_q8_K(x, &y[b], QK_K);
            continue;
        }
        const __m512i bias = _mm512_set1_epi64(16 * 128);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512i a = s8[2 * h], c = s8[2 * h + 1];
            const __m512i s16 = _mm512_sub_epi64(
                _mm512_add_epi64(_mm512_permutex2var_epi64(a, even, c), _mm512_permutex2var_epi64(a, odd, c)), bias);
            _mm_storeu_si128((__m128i *)(y[b].bsums + 8 * h), _mm512_cvtepi64_epi16(s16));
        }
        y[b].d = 1.0f / iscale;
    }
}
