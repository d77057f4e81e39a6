/* quant, x86 AVX-512 (F, BW, VNNI): Q4_0 decode and prefill over its "x4v" packed layout (quant.h),
 * and the Q8_0 prefill tiles.
 *
 * Q4_0.  A unit of the layout is 4 consecutive blocks of a group's 4 rows: their 16 scales, then 4
 * vectors of 64 bytes in which int32 lane 4r + j holds 4 code bytes of row r's block j (vector i:
 * bytes 4i .. 4i+3 of the block's qs, i.e. codes 4i .. 4i+3 in the low nibbles and 16+4i .. in the
 * high ones).  So every lane of a vpdpbusd belongs to one block of one row: 8 of them (low nibbles
 * against activation step i, high nibbles against step i+4, each step the 4 blocks' 4 bytes
 * broadcast to the 4 rows) leave each lane holding its block's whole integer dot product, with no
 * reduction across lanes; the zero point (-8 * the block's activation sum) is the low chain's
 * starting value.  The high nibbles are masked in place (x & 0xF0 = 16 * code: one AND, no shift)
 * and their chain's sum divided by 16 at the end (exact: every product is a multiple of 16).  Per
 * unit that is 4 loads, 8 ANDs, 8 vpdpbusd and one conversion, multiply and FMA pair for 16
 * (row, block) sums; the 4-row x4 kernels need ~2x the instructions for the same bytes.
 *
 * Float steps keep the AVX2 kernel's order, so the results are its bits: each row accumulates its
 * even blocks in one chain and its odd blocks in another (lanes 4r and 4r+1 here: blocks j = 0, 1
 * by a first FMA, then j = 2, 3 moved onto them by an in-lane permute and a second FMA), and the two
 * chains are added at the end.  test-quant compares this kernel with the file-layout AVX2 one bit
 * for bit wherever the CPU has AVX-512.
 *
 * Why decode has its own kernel here (it had none until session 13): the prepared activations must
 * stay in L1 while each group's weights stream through it.  The AVX2 kernel's prepared entry takes
 * 160 bytes per 64 activations (20 KiB for K = 8192, beside an 18 KiB group of weights, in a 32 KiB
 * L1); a unit here takes 160 bytes per 128 (10 KiB), and the kernel needs no software prefetch:
 * with it, or with the same prepared activations spread to 64-byte vectors (40 KiB), the same
 * arithmetic reached only 63-70% of the stream at one thread, without it 93-94% (docs/benchmarks.md). */
#include "quant/quant.h"

#include <immintrin.h>

#define QZ_INLINE static inline __attribute__((always_inline))

/* a prepared unit of an activation row: step i (< 8) = bytes 4i .. 4i+3 of each of the unit's 4
   blocks (16 bytes, broadcast to the 4 rows' lanes), the 4 scales, -8 * the 4 blocks' sums */
typedef struct {
    uint8_t a[8][16];
    float d[4];
    int32_t z[4];
} qv_a;

/* units u0 .. u0+nu of Q8_0 row y, prepared */
QZ_INLINE void qv_prep(const block_q8_0 *y, int u0, int nu, qv_a *buf) {
    const __m256i eight = _mm256_set1_epi8(8), ones = _mm256_set1_epi16(1);
    for (int u = 0; u < nu; u++) {
        const block_q8_0 *yb = y + 4 * (size_t)(u0 + u);
        qv_a *a = buf + u;
        __m256i b[4];
        for (int j = 0; j < 4; j++) b[j] = _mm256_loadu_si256((const __m256i *)yb[j].qs), a->d[j] = _cvtsh_ss(yb[j].d);
        /* a 4 x 8 transpose of 4-byte words: t* pair blocks (0, 1) and (2, 3), s* hold steps [i | i+4] */
        const __m256i t0 = _mm256_unpacklo_epi32(b[0], b[1]), t1 = _mm256_unpacklo_epi32(b[2], b[3]);
        const __m256i t2 = _mm256_unpackhi_epi32(b[0], b[1]), t3 = _mm256_unpackhi_epi32(b[2], b[3]);
        const __m256i s0 = _mm256_unpacklo_epi64(t0, t1), s1 = _mm256_unpackhi_epi64(t0, t1);
        const __m256i s2 = _mm256_unpacklo_epi64(t2, t3), s3 = _mm256_unpackhi_epi64(t2, t3);
        const __m256i p0 = _mm256_permute2x128_si256(s0, s1, 0x20), p1 = _mm256_permute2x128_si256(s2, s3, 0x20);
        const __m256i p2 = _mm256_permute2x128_si256(s0, s1, 0x31), p3 = _mm256_permute2x128_si256(s2, s3, 0x31);
        _mm256_storeu_si256((__m256i *)a->a[0], p0);
        _mm256_storeu_si256((__m256i *)a->a[2], p1);
        _mm256_storeu_si256((__m256i *)a->a[4], p2);
        _mm256_storeu_si256((__m256i *)a->a[6], p3);
        /* dword j of every step is block j's: 8 * the sums over the steps, 16-bit pairs first (at most
           8 * 8 * 128 in magnitude), then the two halves */
        const __m256i h = _mm256_add_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(eight, p0), _mm256_maddubs_epi16(eight, p1)),
                                           _mm256_add_epi16(_mm256_maddubs_epi16(eight, p2), _mm256_maddubs_epi16(eight, p3)));
        const __m256i w = _mm256_madd_epi16(h, ones);
        const __m128i z = _mm_add_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
        _mm_storeu_si128((__m128i *)a->z, _mm_sub_epi32(_mm_setzero_si128(), z));
    }
}

/* the 16 (row, block) integer dot products of a unit's split codes with prepared unit a */
QZ_INLINE __m512i qv_dots(const __m512i *lo, const __m512i *hi, const qv_a *a) {
    __m512i l = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)a->z)), h = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        l = _mm512_dpbusd_epi32(l, lo[i], _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)a->a[i])));
        h = _mm512_dpbusd_epi32(h, hi[i], _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)a->a[i + 4])));
    }
    return _mm512_add_epi32(l, _mm512_srai_epi32(h, 4));
}

/* unit e's codes, split: lo[i] the low nibbles, hi[i] the high ones in place (16 * code) */
QZ_INLINE void qv_codes(const char *e, __m512i *lo, __m512i *hi) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        const __m512i q = _mm512_loadu_si512(e + 32 + 64 * i);
        lo[i] = _mm512_and_si512(q, m4);
        hi[i] = _mm512_andnot_si512(m4, q);
    }
}

/* t += the unit's scaled sums in the AVX2 order: lanes 4r, 4r+1 take blocks 0, 1, then 2, 3 */
QZ_INLINE __m512 qv_acc(__m512 t, __m512 dx, const qv_a *a, __m512i p) {
    const __m512 sc = _mm512_mul_ps(dx, _mm512_broadcast_f32x4(_mm_loadu_ps(a->d)));
    const __m512 f = _mm512_cvtepi32_ps(p);
    t = _mm512_fmadd_ps(sc, f, t);
    return _mm512_fmadd_ps(_mm512_permute_ps(sc, 0x0E), _mm512_permute_ps(f, 0x0E), t);
}

/* row r's result: its even-block chain + its odd-block chain, as the AVX2 kernel's last step */
QZ_INLINE void qv_store(__m512 t, float *s) {
    float v[16];
    _mm512_storeu_ps(v, t);
    for (int r = 0; r < 4; r++) s[r] = v[4 * r] + v[4 * r + 1];
}

enum {
    QV_UNIT = 16 * sizeof(block_q4_0), /* bytes of a unit */
    QV_KC = 8, QV_TC = 4, QV_TR = 16,  /* prefill: units per chunk, columns and rows per tile */
    QV_PU = HQ_PANEL / 128,            /* units per K-panel (quant.h) */
};
static_assert((int)QV_TR == (int)HQ_BAND && (int)QV_PU % (int)QV_KC == 0, "prefill tiles: one band, chunks within a panel");

/* decode: the activation row prepared by the caller (hq_prep_avx512_q4_0), band by band (quant.h)
   K-panel by K-panel, each panel's groups one after another, each group's accumulator carried from
   panel to panel */
static void qv_matvec(int nu, float *restrict s, const char *restrict x, size_t bx, int nr, const qv_a *buf) {
    for (int b0 = 0; b0 < nr; b0 += HQ_BAND) {
        const int ng = (nr - b0 < HQ_BAND ? nr - b0 : HQ_BAND) / 4;
        const char *band = x + (size_t)b0 * bx;
        __m512 acc[HQ_BAND / 4];
        for (int g = 0; g < ng; g++) acc[g] = _mm512_setzero_ps();
        for (int p0 = 0; p0 < nu; p0 += QV_PU) {
            const int w = nu - p0 < QV_PU ? nu - p0 : QV_PU;
            for (int g = 0; g < ng; g++) {
                const char *e = band + hq_panel_at(ng, g, nu, p0, QV_PU, QV_UNIT);
                __m512 t = acc[g];
                for (int u = p0; u < p0 + w; u++, e += QV_UNIT) {
                    __m512i lo[4], hi[4];
                    qv_codes(e, lo, hi);
                    const __m512 dx = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)e));
                    t = qv_acc(t, dx, buf + u, qv_dots(lo, hi, buf + u));
                }
                acc[g] = t;
            }
        }
        for (int g = 0; g < ng; g++) qv_store(acc[g], s + b0 + 4 * g);
    }
}

/* prefill: one group's units k0 .. k0+kc against C prepared columns (column c's unit k at yc[c][k]),
   accumulating into acc[c] */
QZ_INLINE void qv_rows(int C, const char *grp, int k0, int kc, const qv_a *const *yc, __m512 *acc) {
    __m512 t[QV_TC];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) t[c] = acc[c];
    for (int k = 0; k < kc; k++) {
        const char *e = grp + (size_t)(k0 + k) * QV_UNIT;
        __m512i lo[4], hi[4];
        qv_codes(e, lo, hi);
        const __m512 dx = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)e));
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const qv_a *a = yc[c] + k;
            t[c] = qv_acc(t[c], dx, a, qv_dots(lo, hi, a));
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) acc[c] = t[c];
}

/* the activation rows the packed kernel reads (quant.h, hq_prep_fn): prepared units where x4v fits
   the row, the Q8_0 row as it is where the x4 layout and the AVX2 kernel take it */
void hq_prep_avx512_q4_0(void *restrict dst, const void *restrict src, int64_t n) {
    if (!hq_x4v_fits(n)) {
        memcpy(dst, src, (size_t)(n / QK8_0) * sizeof(block_q8_0));
        return;
    }
    qv_prep((const block_q8_0 *)src, 0, (int)(n / (4 * QK4_0)), (qv_a *)dst);
}
size_t hq_prep_size_avx512_q4_0(int64_t n) {
    return hq_x4v_fits(n) ? (size_t)(n / (4 * QK4_0)) * sizeof(qv_a) : (size_t)(n / QK8_0) * sizeof(block_q8_0);
}

/* whole bands (quant.h, hq_pack_ok), activation rows prepared (hq_prep_avx512_q4_0); rows that x4v
   does not fit are in the x4 layout, which the AVX2 kernel reads (hq_x4v_fits).  Prefill: tiles of
   one band (16 rows) x 4 columns, K in chunks of QV_KC units (within one K-panel) whose prepared
   columns (5 KiB) stay in L1 while the tile's rows pass. */
void hq_gemm_packed_avx512_q4_0(int n, float *restrict s, size_t lds, const void *restrict x, size_t bx, int nr,
                                const void *restrict y, size_t by, int nc) {
    if (!hq_x4v_fits(n)) {
        hq_gemm_packed_avx2_q4_0(n, s, lds, x, bx, nr, y, by, nc);
        return;
    }
    const int nu = n / (4 * QK4_0);
    if (nc == 1) {
        qv_matvec(nu, s, x, bx, nr, y);
        return;
    }
    for (int r0 = 0; r0 < nr; r0 += QV_TR) {
        const int ng = (nr - r0 < QV_TR ? nr - r0 : QV_TR) / 4;
        const char *band = (const char *)x + (size_t)r0 * bx;
        for (int j = 0; j < nc; j += QV_TC) {
            const int C = nc - j < QV_TC ? nc - j : QV_TC;
            __m512 acc[QV_TR / 4][QV_TC];
            for (int g = 0; g < ng; g++)
                for (int c = 0; c < QV_TC; c++) acc[g][c] = _mm512_setzero_ps();
            for (int k0 = 0; k0 < nu; k0 += QV_KC) {
                const int kc = nu - k0 < QV_KC ? nu - k0 : QV_KC, p0 = k0 / QV_PU * QV_PU;
                const qv_a *buf[QV_TC];
                for (int c = 0; c < QV_TC; c++) buf[c] = (const qv_a *)((const char *)y + (size_t)(j + (c < C ? c : 0)) * by) + k0;
                for (int g = 0; g < ng; g++) {
                    const char *grp = band + hq_panel_at(ng, g, nu, p0, QV_PU, QV_UNIT);
                    switch (C) {
                    case 1: qv_rows(1, grp, k0 - p0, kc, buf, acc[g]); break;
                    case 2: qv_rows(2, grp, k0 - p0, kc, buf, acc[g]); break;
                    case 3: qv_rows(3, grp, k0 - p0, kc, buf, acc[g]); break;
                    default: qv_rows(4, grp, k0 - p0, kc, buf, acc[g]); break;
                    }
                }
            }
            for (int g = 0; g < ng; g++)
                for (int c = 0; c < C; c++) qv_store(acc[g][c], s + (size_t)(j + c) * lds + r0 + 4 * g);
        }
    }
}

/* ---- Q8_0 prefill tiles --------------------------------------------------------------------------
   The weights are signed, and vpdpbusd wants one unsigned operand: the codes go in offset by 128
   (w ^ 0x80 = w + 128 as a byte), which adds 128 * (the four activations) to each int32 lane: the
   sum starts from -128 * those (computed once per activation block), so vpdpbusd itself takes it
   back out.  A vector holds one block of two rows, so each row keeps the AVX2 tile's eight lanes
   (same integers, same float steps, same final hadds): bit-identical results.  Four pairs of rows
   go together and share each column's broadcasts, and the row scales are broadcast loads from
   hr_fp16_table: ~4 instructions per block, pair of rows and column against the AVX2 tile's ~14.
   Zen 4 (512-bit instructions run as two halves, so the pipes' work is what counts), kbench Q8_0
   2048 x 2048 x 16 GOP/s: one pair at a time with the offset subtracted after 77-82, two pairs
   93-96, four pairs with the table's scales 107-110; Llama-3.2-1B pp128 t1 40 -> 46 -> 53.5. */

/* a prepared activation block: its codes, -128 * the sum of each lane's four codes (the start of
   vpdpbusd's sum, which takes the offset back out as it goes), its scale */
typedef struct { __m256i a, corr; float d; } qz_b;

enum { QZ_KB = 16, QZ_TC = 4, QZ_TR = 16 }; /* blocks per chunk, columns and rows per tile */

QZ_INLINE void qz_prep8(const block_q8_0 *y, int k0, int kc, qz_b *a) {
    const __m256i c128 = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    for (int k = 0; k < kc; k++, a++) {
        a->a = _mm256_loadu_si256((const __m256i *)y[k0 + k].qs);
        a->corr = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_madd_epi16(_mm256_maddubs_epi16(c128, a->a), ones));
        a->d = _cvtsh_ss(y[k0 + k].d);
    }
}

/* four pairs of rows (xr[2p], xr[2p+1]) x C prepared columns over blocks k0 .. k0+kc; acc[p][c]: row
   2p's 8 lanes, then 2p+1's.  The pairs share each column's broadcasts. */
QZ_INLINE void qz_rows8(int C, const char *const *xr, int k0, int kc, const qz_b *buf, __m512 (*acc)[QZ_TC]) {
    const __m512i c128 = _mm512_set1_epi8((char)0x80);
    __m512 t[4][QZ_TC];
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) t[q][c] = acc[q][c];
    for (int k = 0; k < kc; k++) {
        __m512i w[4];
        __m512 dx[4];
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            const block_q8_0 *x0 = (const block_q8_0 *)xr[2 * q] + k0 + k, *x1 = (const block_q8_0 *)xr[2 * q + 1] + k0 + k;
            w[q] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)x0->qs)),
                                                       _mm256_loadu_si256((const __m256i *)x1->qs), 1), c128);
            /* the scales from hr_fp16_table as broadcast loads, the second under a mask: no FP-pipe
               conversion or shuffle per pair and block */
            dx[q] = _mm512_mask_broadcastss_ps(_mm512_set1_ps(hr_fp16_table[x0->d]), 0xFF00,
                                               _mm_load_ss(&hr_fp16_table[x1->d]));
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const qz_b *a = buf + c * QZ_KB + k;
            const __m512i av = _mm512_broadcast_i64x4(a->a), corr = _mm512_broadcast_i64x4(a->corr);
            const __m512 ad = _mm512_set1_ps(a->d);
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) {
                const __m512i p = _mm512_dpbusd_epi32(corr, w[q], av);
                t[q][c] = _mm512_fmadd_ps(_mm512_mul_ps(dx[q], ad), _mm512_cvtepi32_ps(p), t[q][c]);
            }
        }
    }
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) acc[q][c] = t[q][c];
}

void hq_gemm_avx512_q8_0(int n, float *restrict s, size_t lds, const void *restrict x, size_t bx, int nr,
                         const void *restrict y, size_t by, int nc) {
    if (nc == 1) { /* decode */
        hq_gemm_avx2_q8_0(n, s, lds, x, bx, nr, y, by, nc);
        return;
    }
    const int nb = n / QK8_0;
    qz_b buf[QZ_TC * QZ_KB];
    for (int i0 = 0; i0 < nr; i0 += QZ_TR) {
        /* pairs of rows, in whole groups of 8 rows: a short tile repeats its last row, and the
           repeats' results are dropped */
        const int ni = nr - i0 < QZ_TR ? nr - i0 : QZ_TR, np = (ni + 7) / 8 * 4;
        const char *xr[QZ_TR];
        for (int i = 0; i < np * 2; i++) xr[i] = (const char *)x + (size_t)(i0 + (i < ni ? i : ni - 1)) * bx;
        for (int j = 0; j < nc; j += QZ_TC) {
            const int C = nc - j < QZ_TC ? nc - j : QZ_TC;
            __m512 acc[QZ_TR / 2][QZ_TC];
            for (int g = 0; g < np; g++)
                for (int c = 0; c < QZ_TC; c++) acc[g][c] = _mm512_setzero_ps();
            for (int k0 = 0; k0 < nb; k0 += QZ_KB) {
                const int kc = nb - k0 < QZ_KB ? nb - k0 : QZ_KB;
                for (int c = 0; c < C; c++)
                    qz_prep8((const block_q8_0 *)((const char *)y + (size_t)(j + c) * by), k0, kc, buf + c * QZ_KB);
                for (int g = 0; g < np; g += 4) {
                    switch (C) {
                    case 1: qz_rows8(1, xr + 2 * g, k0, kc, buf, acc + g); break;
                    case 2: qz_rows8(2, xr + 2 * g, k0, kc, buf, acc + g); break;
                    case 3: qz_rows8(3, xr + 2 * g, k0, kc, buf, acc + g); break;
                    default: qz_rows8(4, xr + 2 * g, k0, kc, buf, acc + g); break;
                    }
                }
            }
            /* the AVX2 tile's reduction of four rows' accumulators (hadd, hadd, halves) */
            for (int g = 0; 2 * g < ni; g += 2)
                for (int c = 0; c < C; c++) {
                    const __m256 a0 = _mm512_castps512_ps256(acc[g][c]);
                    const __m256 a1 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[g][c]), 1));
                    const __m256 a2 = _mm512_castps512_ps256(acc[g + 1][c]);
                    const __m256 a3 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[g + 1][c]), 1));
                    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
                    float r[4];
                    _mm_storeu_ps(r, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
                    for (int i = 0; i < 4 && 2 * g + i < ni; i++) s[(size_t)(j + c) * lds + i0 + 2 * g + i] = r[i];
                }
        }
    }
}
