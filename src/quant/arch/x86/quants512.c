/* quant, x86 AVX-512 (F, BW, VNNI): prefill tiles of Q4_0 in the x4 layout (quant.h).
 *
 * Decode (one activation row) stays with the AVX2 kernel, which streams at the memory roofline;
 * prefill is arithmetic, and there the AVX2 tile spends ~25 instructions per entry (2 blocks x 4
 * rows) and column.  Here one 512-bit vector holds two rows' codes of an entry, and VNNI's vpdpbusd
 * multiplies the unsigned codes by the signed activations and sums four products per int32 lane:
 * two vpdpbusd per pair of rows (low nibbles, high nibbles), a reduction of each 4-lane group
 * (two unpacks, a shuffle, a vpermd) to the AVX2 tile's [rows 0-3 of block b | of block b+1]
 * lanes, then its zero-point correction and FMA, ~14 per entry and column.
 *
 * The integer sums are exact, the float steps the AVX2 tile's, in its order (entries along K, one
 * FMA per entry and column), so the results are its bits: test-quant's packed checks compare this
 * kernel with the file-layout AVX2 one wherever the CPU has AVX-512. */
#include "quant/quant.h"

#include <immintrin.h>

#define QZ_INLINE static inline __attribute__((always_inline))

/* an entry of a prepared activation row: activation blocks b, b+1 as [b 0-15 | b+1 0-15] (lo) and
   [b 16-31 | b+1 16-31] (hi), their scales [d_b x4 | d_b+1 x4], and 8 * their sums (the zero point's
   share) [x4 | x4] */
typedef struct { __m256i lo, hi, z; __m256 d; } qz_a;

enum { QZ_KC = 16, QZ_TC = 4, QZ_TR = 16 }; /* entries per chunk, columns and rows per tile */

QZ_INLINE void qz_prep(const block_q8_0 *y, int k0, int kc, qz_a *a) {
    for (int k = 0; k < kc; k++, a++) {
        const block_q8_0 *yb = y + 2 * (k0 + k);
        const __m256i a0 = _mm256_loadu_si256((const __m256i *)yb[0].qs);
        const __m256i a1 = _mm256_loadu_si256((const __m256i *)yb[1].qs);
        a->lo = _mm256_permute2x128_si256(a0, a1, 0x20);
        a->hi = _mm256_permute2x128_si256(a0, a1, 0x31);
        a->d = _mm256_blend_ps(_mm256_set1_ps(_cvtsh_ss(yb[0].d)), _mm256_set1_ps(_cvtsh_ss(yb[1].d)), 0xF0);
        const __m256i eight = _mm256_set1_epi8(8);
        __m256i z = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(eight, a->lo), _mm256_maddubs_epi16(eight, a->hi)),
                                      _mm256_set1_epi16(1));
        z = _mm256_add_epi32(z, _mm256_shuffle_epi32(z, 0x4E));
        a->z = _mm256_add_epi32(z, _mm256_shuffle_epi32(z, 0xB1));
    }
}

/* one group of 4 rows (grp: its x4 entries) x C prepared columns over entries k0 .. k0+kc */
QZ_INLINE void qz_rows(int C, const char *grp, int k0, int kc, const qz_a *buf, __m256 *acc) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* per 128-bit chunk c, lane 0 holds rows 0/1's sum and lane 1 rows 2/3's (see below) */
    const __m512i pick = _mm512_setr_epi32(0, 8, 1, 9, 4, 12, 5, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    __m256 t[QZ_TC];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) t[c] = acc[c];
    for (int k = 0; k < kc; k++) {
        const char *e = grp + (size_t)(k0 + k) * 8 * sizeof(block_q4_0);
        const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)e));
        const __m512i q01 = _mm512_loadu_si512(e + 16), q23 = _mm512_loadu_si512(e + 80);
        const __m512i lo01 = _mm512_and_si512(q01, m4), hi01 = _mm512_and_si512(_mm512_srli_epi16(q01, 4), m4);
        const __m512i lo23 = _mm512_and_si512(q23, m4), hi23 = _mm512_and_si512(_mm512_srli_epi16(q23, 4), m4);
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const qz_a *a = buf + c * QZ_KC + k;
            const __m512i alo = _mm512_broadcast_i64x4(a->lo), ahi = _mm512_broadcast_i64x4(a->hi);
            /* 128-bit chunks: [row0 b | row0 b+1 | row1 b | row1 b+1] and the same for rows 2, 3 */
            const __m512i p01 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo01, alo), hi01, ahi);
            const __m512i p23 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo23, alo), hi23, ahi);
            /* each chunk's 4 lanes summed: lane 0 from p01, lane 1 from p23 */
            __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi32(p01, p23), _mm512_unpackhi_epi32(p01, p23));
            u = _mm512_add_epi32(u, _mm512_shuffle_epi32(u, (_MM_PERM_ENUM)0x4E));
            const __m256i d32 = _mm256_sub_epi32(_mm512_castsi512_si256(_mm512_permutexvar_epi32(pick, u)), a->z);
            t[c] = _mm256_fmadd_ps(_mm256_mul_ps(dx, a->d), _mm256_cvtepi32_ps(d32), t[c]);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) acc[c] = t[c];
}

/* tiles of 16 rows x 4 columns, K in chunks of QZ_KC entries whose prepared columns (8 KiB) stay in
   L1 while the rows pass; nr is a multiple of 4, x a group's start, K a multiple of 64 (hq_pack_ok) */
void hq_gemm_packed_avx512_q4_0(int n, float *restrict s, size_t lds, const void *restrict x, size_t bx, int nr,
                                const void *restrict y, size_t by, int nc) {
    if (nc == 1) { /* decode */
        hq_gemm_packed_avx2_q4_0(n, s, lds, x, bx, nr, y, by, nc);
        return;
    }
    const int nk = n / (2 * QK4_0);
    qz_a buf[QZ_TC * QZ_KC];
    for (int r0 = 0; r0 < nr; r0 += QZ_TR) {
        const int ng = (nr - r0 < QZ_TR ? nr - r0 : QZ_TR) / 4;
        for (int j = 0; j < nc; j += QZ_TC) {
            const int C = nc - j < QZ_TC ? nc - j : QZ_TC;
            __m256 acc[QZ_TR / 4][QZ_TC];
            for (int g = 0; g < ng; g++)
                for (int c = 0; c < QZ_TC; c++) acc[g][c] = _mm256_setzero_ps();
            for (int k0 = 0; k0 < nk; k0 += QZ_KC) {
                const int kc = nk - k0 < QZ_KC ? nk - k0 : QZ_KC;
                for (int c = 0; c < C; c++)
                    qz_prep((const block_q8_0 *)((const char *)y + (size_t)(j + c) * by), k0, kc, buf + c * QZ_KC);
                for (int g = 0; g < ng; g++) {
                    const char *grp = (const char *)x + (size_t)(r0 + 4 * g) * bx;
                    switch (C) {
                    case 1: qz_rows(1, grp, k0, kc, buf, acc[g]); break;
                    case 2: qz_rows(2, grp, k0, kc, buf, acc[g]); break;
                    case 3: qz_rows(3, grp, k0, kc, buf, acc[g]); break;
                    default: qz_rows(4, grp, k0, kc, buf, acc[g]); break;
                    }
                }
            }
            for (int g = 0; g < ng; g++)
                for (int c = 0; c < C; c++)
                    _mm_storeu_ps(s + (size_t)(j + c) * lds + r0 + 4 * g,
                                  _mm_add_ps(_mm256_castps256_ps128(acc[g][c]), _mm256_extractf128_ps(acc[g][c], 1)));
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

enum { QZ_KB = 16 }; /* blocks per chunk */

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
