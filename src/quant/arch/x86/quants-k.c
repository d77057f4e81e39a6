/* quant, x86 AVX2/FMA/F16C: K-quant dot products against Q8_K activations, their tile (GEMM)
 * kernels, and the Q8_K activation quantizer.  Layouts: see quants-k-ref.c.
 *
 * Every kernel is built on one always-inline body per type (kq_sb_*) that takes one super-block of
 * one weight row against NC (1..4) activation rows to integer sums, unpacking each weight vector
 * once for all NC.  On top of it: vec_dot (NC = 1), prefill tiles (16 weight rows x 4 activation
 * rows, walked along K in chunks that stay in L1), and decode (the vec_dot row after row, with a
 * software prefetch running ahead of the one linear stream the rows make).  That driver is in kq.h,
 * shared with the AVX-512 bodies of quants-k512.c.
 *
 * Arithmetic per 32 quants: the weight quants, made non-negative (Q3_K / Q6_K carry a bias of 4 /
 * 32), go through maddubs with the int8 activations (pairs of products in int16, no saturation:
 * at most 2*63*127), then madd with the sub-block scale as int16 gives int32 lanes. Biases and
 * mins are applied once per super-block through the activation block sums (bsums).
 */
#include "quant/arch/x86/kq.h"

/* Scales are applied as int16 (madd), so each 32-quant vector needs a vector of 16 int16 scales:
   the sub-block scale of its first 16 quants in the low 128-bit lane (maddubs fills that lane from
   them) and of its last 16 in the high lane. The scales of a block are widened to int16 once; one
   in-lane pshufb per vector then picks them with these controls (bytes 2a, 2a+1 in the low lane,
   2b, 2b+1 in the high lane). */
#define KQ_W8(a) 2 * (a), 2 * (a) + 1, 2 * (a), 2 * (a) + 1, 2 * (a), 2 * (a) + 1, 2 * (a), 2 * (a) + 1, \
                 2 * (a), 2 * (a) + 1, 2 * (a), 2 * (a) + 1, 2 * (a), 2 * (a) + 1, 2 * (a), 2 * (a) + 1
#define KQ_PICK(a, b) {KQ_W8(a), KQ_W8(b)}
/* sub-blocks of 32 (Q4_K, Q5_K): vector k has the one scale k, picked from 8 int16 scales
   duplicated in both lanes */
static const uint8_t kq_pick32[8][32] __attribute__((aligned(32))) = {
    KQ_PICK(0, 0), KQ_PICK(1, 1), KQ_PICK(2, 2), KQ_PICK(3, 3),
    KQ_PICK(4, 4), KQ_PICK(5, 5), KQ_PICK(6, 6), KQ_PICK(7, 7)};
/* sub-blocks of 16 (Q2_K, Q3_K, Q6_K): vector k has scales 2k and 2k+1, picked from scales 0..7
   (k < 4) or 8..15 (k >= 4) duplicated in both lanes */
static const uint8_t kq_pick16[4][32] __attribute__((aligned(32))) = {
    KQ_PICK(0, 1), KQ_PICK(2, 3), KQ_PICK(4, 5), KQ_PICK(6, 7)};

KQ_INLINE __m256i kq_pick(__m256i s16, const uint8_t *ctl) {
    return _mm256_shuffle_epi8(s16, _mm256_load_si256((const __m256i *)ctl));
}

/* 16 int8 scales -> int16, as two vectors holding scales 0..7 and 8..15 in both lanes */
KQ_INLINE void kq_widen16(__m128i s8, __m256i *s16, __m256i *lo, __m256i *hi) {
    *s16 = _mm256_cvtepi8_epi16(s8);
    *lo = _mm256_permute2x128_si256(*s16, *s16, 0x00);
    *hi = _mm256_permute2x128_si256(*s16, *s16, 0x11);
}

/* moves bit b of every byte to bit t (other bits are left for the caller to mask); b, t < 8 and
   constant after inlining */
KQ_INLINE __m256i kq_bit_to(__m256i h, int b, int t) {
    if (b < t) return _mm256_slli_epi16(h, t - b);
    if (b > t) return _mm256_srli_epi16(h, b - t);
    return h;
}

/* the 16 signed 6-bit scales of Q3_K as int8 */
KQ_INLINE __m128i kq_k3_scales(const uint8_t *s) {
    uint32_t a0, a1, a2;
    memcpy(&a0, s, 4), memcpy(&a1, s + 4, 4), memcpy(&a2, s + 8, 4);
    const uint32_t v0 = (a0 & 0x0f0f0f0f) | ((a2 & 0x03030303) << 4);
    const uint32_t v1 = (a1 & 0x0f0f0f0f) | (((a2 >> 2) & 0x03030303) << 4);
    const uint32_t v2 = ((a0 >> 4) & 0x0f0f0f0f) | (((a2 >> 4) & 0x03030303) << 4);
    const uint32_t v3 = ((a1 >> 4) & 0x0f0f0f0f) | (((a2 >> 6) & 0x03030303) << 4);
    const __m128i v = _mm_set_epi64x((long long)((uint64_t)v3 << 32 | v2), (long long)((uint64_t)v1 << 32 | v0));
    return _mm_sub_epi8(v, _mm_set1_epi8(32));
}

/* Each type's body works on one super-block i of one weight row against NC (1..4) activation rows
   (y[c] + i), unpacking each weight vector once for all NC: it leaves per column the integer sums
   A[c] (8 lanes; scaled by d, biases already taken out) and, for the types with mins, B[c] (scaled
   by dmin, subtracted). */

/* ---- Q4_K ------------------------------------------------------------------------------------------
 * Its lanes are those of kq_fold_k4 (kq.h), not a share of every sub-block as the other types': step j
 * (sub-blocks 2j and 2j + 1) goes into W[2j mod 4] and W[2j + 1 mod 4], three hadds fold them. */

KQ_INLINE void kq_sb_q4_K(int NC, const block_q4_K *x, const block_q8_K *const *y, int i, __m256i *A, __m256i *B) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m128i sc, mn;
    kq_k4_scales(x->scales, &sc, &mn);
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn)); /* m0 m0 m1 m1 .. */
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc));
    __m256i W[4][4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const __m256i q = kq_load(x->qs + 32 * j);
        const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        const __m256i slo = kq_pick(sc16, kq_pick32[2 * j]), shi = kq_pick(sc16, kq_pick32[2 * j + 1]);
        const int w = 2 * (j % 2);
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) {
            const int8_t *a = y[c][i].qs + 64 * j;
            const __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, kq_load(a)), slo);
            const __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, kq_load(a + 32)), shi);
            W[c][w] = j < 2 ? plo : _mm256_add_epi32(W[c][w], plo);
            W[c][w + 1] = j < 2 ? phi : _mm256_add_epi32(W[c][w + 1], phi);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < NC; c++) {
        A[c] = kq_fold_k4(W[c][0], W[c][1], W[c][2], W[c][3]);
        B[c] = _mm256_madd_epi16(kq_load(y[c][i].bsums), mins);
    }
}

/* ---- Q5_K ------------------------------------------------------------------------------------------ */

KQ_INLINE void kq_sb_q5_K(int NC, const block_q5_K *x, const block_q8_K *const *y, int i, __m256i *A, __m256i *B) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m16 = _mm256_set1_epi8(0x10);
    __m128i sc, mn;
    kq_k4_scales(x->scales, &sc, &mn);
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn));
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc));
    const __m256i qh = kq_load(x->qh);
#pragma GCC unroll 4
    for (int c = 0; c < NC; c++) A[c] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const __m256i q = kq_load(x->qs + 32 * j);
        /* quant r of sub-block s has its fifth bit at bit s of qh[r] */
        const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_and_si256(kq_bit_to(qh, 2 * j, 4), m16));
        const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                                           _mm256_and_si256(kq_bit_to(qh, 2 * j + 1, 4), m16));
        const __m256i slo = kq_pick(sc16, kq_pick32[2 * j]), shi = kq_pick(sc16, kq_pick32[2 * j + 1]);
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) {
            const int8_t *a = y[c][i].qs + 64 * j;
            const __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, kq_load(a)), slo);
            const __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, kq_load(a + 32)), shi);
            A[c] = _mm256_add_epi32(A[c], _mm256_add_epi32(plo, phi));
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < NC; c++) B[c] = _mm256_madd_epi16(kq_load(y[c][i].bsums), mins);
}

/* ---- Q6_K ------------------------------------------------------------------------------------------ */

KQ_INLINE void kq_sb_q6_K(int NC, const block_q6_K *x, const block_q8_K *const *y, int i, __m256i *A, __m256i *B) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256i sc16, slo, shi, X[4], Y[4][2];
    kq_widen16(_mm_loadu_si128((const __m128i *)x->scales), &sc16, &slo, &shi);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i l0 = kq_load(x->ql + 64 * h), l1 = kq_load(x->ql + 64 * h + 32);
        const __m256i qh = kq_load(x->qh + 32 * h);
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            /* quants 32p..32p+31 of this half: nibble (low of l0, l1, then high of l0, l1) plus
               bits 2p, 2p+1 of qh as bits 4, 5 */
            const __m256i nib = p < 2 ? _mm256_and_si256(p == 0 ? l0 : l1, m4)
                                      : _mm256_and_si256(_mm256_srli_epi16(p == 2 ? l0 : l1, 4), m4);
            const __m256i q = _mm256_or_si256(nib, _mm256_and_si256(kq_bit_to(qh, 2 * p, 4), m30));
            const __m256i sv = kq_pick(h ? shi : slo, kq_pick16[p]);
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++) {
                /* P[4h + p]: sub-blocks 8h + 2p, 8h + 2p + 1 (kq.h, Q6_K's lanes) */
                const __m256i pr = _mm256_maddubs_epi16(q, kq_load(y[c][i].qs + 128 * h + 32 * p));
                const __m256i P = _mm256_madd_epi16(pr, sv);
                if (p % 2 == 0) X[c] = P;
                else if (p == 1) Y[c][h] = _mm256_hadd_epi32(X[c], P);
                else Y[c][h] = _mm256_hadd_epi32(Y[c][h], _mm256_hadd_epi32(X[c], P));
            }
        }
    }
    /* the quants went in biased by +32: take 32 * sum_j scale_j * bsum_j back out (lane k: sub-blocks
       2k, 2k + 1, as A's) */
#pragma GCC unroll 4
    for (int c = 0; c < NC; c++) {
        const __m256i bias = _mm256_madd_epi16(kq_load(y[c][i].bsums), sc16);
        A[c] = _mm256_sub_epi32(kq_fold_y(Y[c][0], Y[c][1]), _mm256_slli_epi32(bias, 5));
    }
    (void)B;
}

/* ---- Q3_K ------------------------------------------------------------------------------------------ */

KQ_INLINE void kq_sb_q3_K(int NC, const block_q3_K *x, const block_q8_K *const *y, int i, __m256i *A, __m256i *B) {
    const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(4);
    __m256i sc16, slo, shi;
    kq_widen16(kq_k3_scales(x->scales), &sc16, &slo, &shi);
    const __m256i hm = kq_load(x->hmask);
#pragma GCC unroll 4
    for (int c = 0; c < NC; c++) A[c] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i qs = kq_load(x->qs + 32 * h);
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            const int k = 4 * h + p; /* quants 32k..32k+31: bits 2p of qs, bit k of hmask */
            const __m256i q = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 2 * p), m3),
                                              _mm256_and_si256(kq_bit_to(hm, k, 2), m4));
            const __m256i sv = kq_pick(h ? shi : slo, kq_pick16[p]);
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++) {
                const __m256i pr = _mm256_maddubs_epi16(q, kq_load(y[c][i].qs + 32 * k));
                A[c] = _mm256_add_epi32(A[c], _mm256_madd_epi16(pr, sv));
            }
        }
    }
    /* quants are 0..7 for values -4..3: take 4 * sum_j scale_j * bsum_j back out */
#pragma GCC unroll 4
    for (int c = 0; c < NC; c++) {
        const __m256i bias = _mm256_madd_epi16(kq_load(y[c][i].bsums), sc16);
        A[c] = _mm256_sub_epi32(A[c], _mm256_slli_epi32(bias, 2));
    }
    (void)B;
}

/* ---- Q2_K ------------------------------------------------------------------------------------------ */

KQ_INLINE void kq_sb_q2_K(int NC, const block_q2_K *x, const block_q8_K *const *y, int i, __m256i *A, __m256i *B) {
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i n4 = _mm_set1_epi8(0x0F);
    const __m128i raw = _mm_loadu_si128((const __m128i *)x->scales);
    __m256i sc16, slo, shi;
    kq_widen16(_mm_and_si128(raw, n4), &sc16, &slo, &shi);
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), n4));
#pragma GCC unroll 4
    for (int c = 0; c < NC; c++) A[c] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i qs = kq_load(x->qs + 32 * h);
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            const int k = 4 * h + p;
            const __m256i q = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * p), m3);
            const __m256i sv = kq_pick(h ? shi : slo, kq_pick16[p]);
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++) {
                const __m256i pr = _mm256_maddubs_epi16(q, kq_load(y[c][i].qs + 32 * k));
                A[c] = _mm256_add_epi32(A[c], _mm256_madd_epi16(pr, sv));
            }
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < NC; c++) B[c] = _mm256_madd_epi16(kq_load(y[c][i].bsums), mins);
}

KQ_KERNELS(q2_K, 1, offsetof(block_q2_K, dmin))
KQ_KERNELS(q3_K, 0, 0)
KQ_KERNELS(q4_K, 1, offsetof(block_q4_K, dmin))

KQ_KERNELS(q5_K, 1, offsetof(block_q5_K, dmin))
KQ_KERNELS(q6_K, 0, 0)

KQ_ENTRY(avx2, q2_K)
KQ_ENTRY(avx2, q3_K)
KQ_ENTRY(avx2, q4_K)
KQ_ENTRY(avx2, q5_K)
KQ_ENTRY(avx2, q6_K)

/* ---- Q4_K in the x4v layout (docs/quant.md) on 256-bit vectors -------------------------------------------
 *
 * The AVX-512 kernel's layout and sums (quants-k512.c has the byte map): a 64-byte vector is two of
 * 32 bytes here, rows 0-1 and rows 2-3, each 128-bit lane one row and each int32 lane one sub-block
 * of it.  Without vpdpbusd the dot products are maddubs (pairs of quant x activation in int16: at
 * most 2 * 15 * 127), added in int16 over the 4 vectors of a half (at most 15240), then one madd with
 * ones per half to int32: 2 operations per 32 bytes and column instead of the file-layout body's 3,
 * and the 6-bit scales, the mins and the float steps done for two rows at once instead of per row.
 * The AVX2 body's lanes (kq_fold_k4) and float steps, so results are its bits (test-quant).
 * Zen 4 VM, HEARTH_NO_AVX512=1: docs/benchmarks.md (session 14). */
enum { KV2_ENTRY = HQ_PACK_ROWS * sizeof(block_q4_K), KV2_DC = 8 };

/* super-blocks y[0 .. n) into p[0 .. n) with qs in x4v's order (the AVX-512 kv_prep's): per half of
   128 bytes a 4 x 4 transpose of dwords in each 128-bit lane */
KQ_INLINE void kv2_prep(const block_q8_K *y, block_q8_K *p, int n) {
    for (int b = 0; b < n; b++) {
        p[b].d = y[b].d;
        memcpy(p[b].bsums, y[b].bsums, sizeof p[b].bsums);
        for (int h = 0; h < 2; h++) {
            const int8_t *src = y[b].qs + 128 * h;
            const __m256i s0 = kq_load(src), s1 = kq_load(src + 32), s2 = kq_load(src + 64), s3 = kq_load(src + 96);
            const __m256i t0 = _mm256_unpacklo_epi32(s0, s1), t1 = _mm256_unpackhi_epi32(s0, s1);
            const __m256i t2 = _mm256_unpacklo_epi32(s2, s3), t3 = _mm256_unpackhi_epi32(s2, s3);
            int8_t *dst = p[b].qs + 128 * h;
            _mm256_storeu_si256((__m256i *)dst, _mm256_unpacklo_epi64(t0, t2));
            _mm256_storeu_si256((__m256i *)(dst + 32), _mm256_unpackhi_epi64(t0, t2));
            _mm256_storeu_si256((__m256i *)(dst + 64), _mm256_unpacklo_epi64(t1, t3));
            _mm256_storeu_si256((__m256i *)(dst + 96), _mm256_unpackhi_epi64(t1, t3));
        }
    }
}

/* the scale fields of 2 rows (24 bytes at p) as one 128-bit lane per row: dwords [sc 0-3 | mn 0-3 |
   sc 4-7 | mn 4-7] (kq_k4_scales' formulas) */
KQ_INLINE __m256i kv2_scales(const uint8_t *p) {
    const __m256i v = _mm256_setr_m128i(_mm_loadu_si128((const __m128i *)p), _mm_loadu_si128((const __m128i *)(p + 12)));
    const __m256i a = _mm256_shuffle_epi32(v, 0xA4), b = _mm256_shuffle_epi32(v, 0x40); /* [a0 a1 a2 a2], [a0 a0 a0 a1] */
    const __m256i lowbits = _mm256_and_si256(_mm256_srlv_epi32(a, _mm256_setr_epi32(0, 0, 0, 4, 0, 0, 0, 4)),
                                             _mm256_setr_epi32(0x3f3f3f3f, 0x3f3f3f3f, 0x0f0f0f0f, 0x0f0f0f0f,
                                                               0x3f3f3f3f, 0x3f3f3f3f, 0x0f0f0f0f, 0x0f0f0f0f));
    return _mm256_or_si256(lowbits, _mm256_and_si256(_mm256_srli_epi32(b, 2), _mm256_setr_epi32(0, 0, 0x30303030, 0x30303030,
                                                                                                0, 0, 0x30303030, 0x30303030)));
}

/* pshufb controls on kv2_scales' lanes: the scales of sub-blocks 0-3 and 4-7 as dwords; the mins of
   0-3 and 4-7, each twice, as words (what madd with the activation sums in pairs needs) */
#define KV2_D(b) (b), -128, -128, -128
#define KV2_W(b) (b), -128, (b), -128
static const int8_t kv2_ctl[4][32] __attribute__((aligned(32))) = {
    {KV2_D(0), KV2_D(1), KV2_D(2), KV2_D(3), KV2_D(0), KV2_D(1), KV2_D(2), KV2_D(3)},
    {KV2_D(8), KV2_D(9), KV2_D(10), KV2_D(11), KV2_D(8), KV2_D(9), KV2_D(10), KV2_D(11)},
    {KV2_W(4), KV2_W(5), KV2_W(6), KV2_W(7), KV2_W(4), KV2_W(5), KV2_W(6), KV2_W(7)},
    {KV2_W(12), KV2_W(13), KV2_W(14), KV2_W(15), KV2_W(12), KV2_W(13), KV2_W(14), KV2_W(15)}};

/* rows 2R, 2R + 1 of one group (g: its entries) x NC prepared activation rows over super-blocks
   i0 .. i1 (y[c][i - yo]); acc[2c], acc[2c + 1]: column c's AVX2 lanes 0-3 and 4-7, one 128-bit lane
   per row */
KQ_INLINE void kv2_cols_q4_K(int R, int i0, int i1, int yo, int NC, const uint8_t *g, const block_q8_K *const *y,
                             __m256 *acc) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const __m256i pick_d = _mm256_setr_epi32(4 * R, 4 * R, 4 * R, 4 * R, 4 * R + 2, 4 * R + 2, 4 * R + 2, 4 * R + 2);
    const __m256i pick_m = _mm256_add_epi32(pick_d, _mm256_set1_epi32(1));
    const __m256 neg_m = _mm256_castsi256_ps(_mm256_set1_epi64x((long long)0x8000000000000000ull));
    __m256 t[8];
#pragma GCC unroll 8
    for (int c = 0; c < 2 * NC; c++) t[c] = acc[c];
    for (int i = i0; i < i1; i++) {
        const uint8_t *e = g + (size_t)i * KV2_ENTRY;
        const __m256i sc = kv2_scales(e + 16 + 2 * K_SCALE_SIZE * R);
        __m256i Al[4], Ah[4];
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i Wl[4], Wh[4];
#pragma GCC unroll 4
            for (int v = 4 * h; v < 4 * h + 4; v++) {
                const __m256i q = kq_load(e + 64 + 64 * v + 32 * R);
                const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
#pragma GCC unroll 4
                for (int c = 0; c < NC; c++) {
                    const int8_t *a = y[c][i - yo].qs + 32 * v;
                    const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)a)));
                    const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(a + 16))));
                    Wl[c] = v == 4 * h ? pl : _mm256_add_epi16(Wl[c], pl);
                    Wh[c] = v == 4 * h ? ph : _mm256_add_epi16(Wh[c], ph);
                }
            }
            const __m256i sh = kq_pick(sc, (const uint8_t *)kv2_ctl[h]);
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++) {
                const __m256i l = _mm256_mullo_epi32(_mm256_madd_epi16(Wl[c], ones), sh);
                const __m256i u = _mm256_mullo_epi32(_mm256_madd_epi16(Wh[c], ones), sh);
                Al[c] = h ? _mm256_add_epi32(Al[c], l) : l;
                Ah[c] = h ? _mm256_add_epi32(Ah[c], u) : u;
            }
        }
        const __m256i ml = kq_pick(sc, (const uint8_t *)kv2_ctl[2]), mh = kq_pick(sc, (const uint8_t *)kv2_ctl[3]);
        const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)e)); /* d0 m0 d1 m1 .. */
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) {
            const block_q8_K *yc = &y[c][i - yo];
            /* per row: dy * d and dy * -dmin, as the file-layout body forms them */
            const __m256 f = _mm256_xor_ps(_mm256_mul_ps(dm, _mm256_set1_ps(yc->d)), neg_m);
            const __m256 fd = _mm256_permutevar8x32_ps(f, pick_d), fm = _mm256_permutevar8x32_ps(f, pick_m);
            const __m256i bl = _mm256_madd_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)yc->bsums)), ml);
            const __m256i bh = _mm256_madd_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(yc->bsums + 8))), mh);
            t[2 * c] = _mm256_fmadd_ps(fm, _mm256_cvtepi32_ps(bl), _mm256_fmadd_ps(fd, _mm256_cvtepi32_ps(Al[c]), t[2 * c]));
            t[2 * c + 1] = _mm256_fmadd_ps(fm, _mm256_cvtepi32_ps(bh), _mm256_fmadd_ps(fd, _mm256_cvtepi32_ps(Ah[c]), t[2 * c + 1]));
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < 2 * NC; c++) acc[c] = t[c];
}

/* the two rows' sums from a column's accumulators, added as kq_hsum adds a row's eight lanes:
   ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) */
KQ_INLINE void kv2_store2(float *s, __m256 lo, __m256 hi) {
    __m256 u = _mm256_add_ps(lo, hi);
    u = _mm256_add_ps(u, _mm256_permute_ps(u, 0x4E));
    u = _mm256_add_ps(u, _mm256_permute_ps(u, 0xB1));
    s[0] = _mm256_cvtss_f32(u);
    s[1] = _mm_cvtss_f32(_mm256_extractf128_ps(u, 1));
}

/* the AVX-512 kernel's entry (quants-k512.c), on 256-bit vectors */
/* decode: a group's row pairs KV2_DC entries at a time, so that the second pair reads them from L1 (one
   pass per pair over a whole panel read each line twice from afar: kbench cold 14 against 21 GB/s) */
KQ_PREP_GEMM(avx2, q4_K, block_q8_K, kv2_prep, kv2_cols_q4_K, __m256, _mm256_setzero_ps, kv2_store2, 2, KV2_ENTRY, KV2_DC)

/* ---- Q6_K in the x4v layout (docs/quant.md) on 256-bit vectors -------------------------------------------
 * The AVX-512 kernel's layout and sums (quants-k512.c), two rows per vector as for Q4_K above: the
 * 6-bit quants' products in int16 two vectors at a time (at most 2 * 2 * 63 * 127 = 32004), then madd
 * with ones; bits: the file-layout body's (test-quant). */
enum { K62_ENTRY = HQ_PACK_ROWS * sizeof(block_q6_K), K62_TAIL = 72 };

/* super-blocks y[0 .. n) prepared as for the AVX-512 kernel (kq.h, kq_q6p): per half of 128 bytes an
   in-lane 4 x 4 transpose of dwords, the lower lanes giving set 2H, the upper set 2H + 1 */
KQ_INLINE void k62_prep(const block_q8_K *y, kq_q6p *p, int n) {
    const __m256i bo = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    for (int b = 0; b < n; b++) {
        p[b].d = y[b].d;
        for (int k = 0; k < 2; k++) {
            const __m256i bs = _mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)(y[b].bsums + 8 * k)));
            _mm256_storeu_si256((__m256i *)(p[b].bs32 + 8 * k), _mm256_slli_epi32(_mm256_permutevar8x32_epi32(bs, bo), 5));
        }
        for (int h = 0; h < 2; h++) {
            const int8_t *src = y[b].qs + 128 * h;
            const __m256i s0 = kq_load(src), s1 = kq_load(src + 32), s2 = kq_load(src + 64), s3 = kq_load(src + 96);
            const __m256i t0 = _mm256_unpacklo_epi32(s0, s1), t1 = _mm256_unpackhi_epi32(s0, s1);
            const __m256i t2 = _mm256_unpacklo_epi32(s2, s3), t3 = _mm256_unpackhi_epi32(s2, s3);
            const __m256i r0 = _mm256_unpacklo_epi64(t0, t2), r1 = _mm256_unpackhi_epi64(t0, t2);
            const __m256i r2 = _mm256_unpacklo_epi64(t1, t3), r3 = _mm256_unpackhi_epi64(t1, t3);
            int8_t *dst = p[b].qs + 128 * h;
            _mm256_storeu_si256((__m256i *)dst, _mm256_permute2x128_si256(r0, r1, 0x20));
            _mm256_storeu_si256((__m256i *)(dst + 32), _mm256_permute2x128_si256(r2, r3, 0x20));
            _mm256_storeu_si256((__m256i *)(dst + 64), _mm256_permute2x128_si256(r0, r1, 0x31));
            _mm256_storeu_si256((__m256i *)(dst + 96), _mm256_permute2x128_si256(r2, r3, 0x31));
        }
    }
}

/* rows 2R, 2R + 1 of one group (g: its entries) x NC prepared activation rows over super-blocks
   i0 .. i1 (y[c][i - yo]); acc[2c], acc[2c + 1]: column c's lanes 0-3 and 4-7, one 128-bit lane per row */
KQ_INLINE void k62_cols(int R, int i0, int i1, int yo, int NC, const uint8_t *g, const kq_q6p *const *y, __m256 *acc) {
    const __m256i m3f = _mm256_set1_epi8(0x3F), m03 = _mm256_set1_epi8(0x03), m0c = _mm256_set1_epi8(0x0C),
                  m30 = _mm256_set1_epi8(0x30), ones = _mm256_set1_epi16(1);
    const __m256i pick_d = _mm256_setr_epi32(2 * R, 2 * R, 2 * R, 2 * R, 2 * R + 1, 2 * R + 1, 2 * R + 1, 2 * R + 1);
    __m256 t[8];
#pragma GCC unroll 8
    for (int c = 0; c < 2 * NC; c++) t[c] = acc[c];
    for (int i = i0; i < i1; i++) {
        const uint8_t *sd = g + (size_t)i * K62_ENTRY, *e = sd + K62_TAIL + 32 * R;
        __m256i A[4][2];
#pragma GCC unroll 4
        for (int L = 0; L < 4; L++) {
            const __m256i a = kq_load(e + 192 * L), b = kq_load(e + 192 * L + 64), c2 = kq_load(e + 192 * L + 128);
            const __m256i v3 = _mm256_or_si256(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 6), m03),
                                                               _mm256_and_si256(_mm256_srli_epi16(b, 4), m0c)),
                                               _mm256_and_si256(_mm256_srli_epi16(c2, 2), m30));
            const __m256i v[4] = {_mm256_and_si256(a, m3f), _mm256_and_si256(b, m3f), _mm256_and_si256(c2, m3f), v3};
            const __m256i sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sd + 16 * L + 8 * R)));
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++) {
                const kq_q6p *yc = &y[c][i - yo];
                const int8_t *q = yc->qs + 64 * L;
                __m256i w[2];
#pragma GCC unroll 2
                for (int k = 0; k < 2; k++)
                    w[k] = _mm256_add_epi16(
                        _mm256_maddubs_epi16(v[2 * k], _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(q + 32 * k)))),
                        _mm256_maddubs_epi16(v[2 * k + 1], _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(q + 32 * k + 16)))));
                const __m256i z = _mm256_add_epi32(_mm256_madd_epi16(w[0], ones), _mm256_madd_epi16(w[1], ones));
                const __m256i bias = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(yc->bs32 + 4 * L)));
                const __m256i sz = _mm256_mullo_epi32(_mm256_sub_epi32(z, bias), sc);
                A[c][L / 2] = L % 2 ? _mm256_add_epi32(A[c][L / 2], sz) : sz;
            }
        }
        const __m128 d4 = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(sd + 64)));
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) {
            const __m256 fd = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_mul_ps(d4, _mm_set1_ps(y[c][i - yo].d))), pick_d);
            t[2 * c] = _mm256_fmadd_ps(fd, _mm256_cvtepi32_ps(A[c][0]), t[2 * c]);
            t[2 * c + 1] = _mm256_fmadd_ps(fd, _mm256_cvtepi32_ps(A[c][1]), t[2 * c + 1]);
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < 2 * NC; c++) acc[c] = t[c];
}

KQ_PREP_GEMM(avx2, q6_K, kq_q6p, k62_prep, k62_cols, __m256, _mm256_setzero_ps, kv2_store2, 2, K62_ENTRY, KV2_DC)

/* ---- Q8_K activations: the reference's bytes, eight lanes at a time ------------------------------ */

void hq_quantize_avx2_q8_K(const float *restrict x, void *restrict vy, int64_t k) {
    block_q8_K *y = vy;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (int64_t b = 0; b < k / QK_K; b++, x += QK_K) {
        __m256 mx = _mm256_setzero_ps();
        for (int i = 0; i < QK_K; i += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(x + i), absmask));
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float amax = _mm_cvtss_f32(m);
        if (amax == 0) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        /* the sign comes from the first value of that magnitude, as in the reference */
        const __m256 va = _mm256_set1_ps(amax);
        int idx = -1;
        for (int i = 0; i < QK_K && idx < 0; i += 8) {
            const int bits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), absmask), va, _CMP_EQ_OQ));
            if (bits) idx = i + __builtin_ctz((unsigned)bits);
        }
        if (idx < 0) { /* NaNs: the reference defines what happens */
            hq_quantize_ref_q8_K(x, &y[b], QK_K);
            continue;
        }
        const float iscale = -127.0f / x[idx];
        const __m256 vs = _mm256_set1_ps(iscale);
        int bad = 0;
        for (int i = 0; i < QK_K; i += 32) {
            /* round to nearest even (the MXCSR default), saturate to int8: 128 -> 127 as the
               reference's cap */
            const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(x + i)));
            const __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(x + i + 8)));
            const __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(x + i + 16)));
            const __m256i q3 = _mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(x + i + 24)));
            const __m256i p = _mm256_permutevar8x32_epi32(
                _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3)), order);
            _mm256_storeu_si256((__m256i *)(y[b].qs + i), p);
            bad |= _mm256_movemask_epi8(_mm256_cmpeq_epi8(p, flip));
            /* sums of 8 bytes of q + 128 */
            const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(p, flip), _mm256_setzero_si256());
            uint64_t s8[4];
            _mm256_storeu_si256((__m256i *)s8, sad);
            y[b].bsums[i / 16] = (int16_t)((int)(s8[0] + s8[1]) - 16 * 128);
            y[b].bsums[i / 16 + 1] = (int16_t)((int)(s8[2] + s8[3]) - 16 * 128);
        }
        if (bad) { /* a -128, which only a NaN or an infinity gives (cvtps2dq's 0x80000000): the reference's bytes */
            hq_quantize_ref_q8_K(x, &y[b], QK_K);
            continue;
        }
        y[b].d = 1.0f / iscale;
    }
}
