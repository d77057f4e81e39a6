/* quant, x86: what the K-quant kernel files share (quants-k.c: AVX2; quants-k512.c: AVX-512).
 *
 * A file defines, per type t, one always-inline body
 *     kq_sb_t(int NC, const block_t *x, const block_q8_K *const *y, int i, __m256i *A, __m256i *B)
 * that takes super-block i of one weight row against NC (1..4) activation rows to integer sums: per
 * column, eight int32 lanes A (to be scaled by d; biases already taken out) and, for the types with
 * mins, B (scaled by dmin, subtracted).  KQ_KERNELS(t) builds the float accumulation over a range of
 * super-blocks on it, KQ_ENTRY(arch, t) the vec_dot and tile (GEMM) entry points.  Integer sums are
 * exact, so two bodies that leave the same A and B in each lane give the same floats bit for bit. */
#ifndef HEARTH_QUANT_X86_KQ_H
#define HEARTH_QUANT_X86_KQ_H

#include "quant/quant-impl.h"

#include <immintrin.h>
#include <stddef.h>

#define KQ_INLINE static inline __attribute__((always_inline))

KQ_INLINE float kq_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

KQ_INLINE float kq_fp16(hr_fp16 h) { return _cvtsh_ss(h); }

KQ_INLINE __m256i kq_load(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* the 6-bit scales and mins of Q4_K/Q5_K, 8 bytes each in the low half of an xmm */
KQ_INLINE void kq_k4_scales(const uint8_t *s, __m128i *sc, __m128i *mn) {
    uint32_t a0, a1, a2; /* three plain loads: a copy into an array went through the stack */
    memcpy(&a0, s, 4), memcpy(&a1, s + 4, 4), memcpy(&a2, s + 8, 4);
    const uint32_t sc_lo = a0 & 0x3f3f3f3f, mn_lo = a1 & 0x3f3f3f3f;
    const uint32_t sc_hi = (a2 & 0x0f0f0f0f) | (((a0 >> 6) & 0x03030303) << 4);
    const uint32_t mn_hi = ((a2 >> 4) & 0x0f0f0f0f) | (((a1 >> 6) & 0x03030303) << 4);
    *sc = _mm_cvtsi64_si128((long long)((uint64_t)sc_hi << 32 | sc_lo));
    *mn = _mm_cvtsi64_si128((long long)((uint64_t)mn_hi << 32 | mn_lo));
}

/* Q4_K's lanes.  Lane l < 4 of A holds sub-blocks l and l + 4's first halves (quants 0-15), each
   times its scale, lane l + 4 their second halves (quants 16-31): the sums the AVX-512 packed kernel
   (quants-k512.c) makes with one sub-block of one row per int32 lane, and the integers each lane
   holds are what makes two kernels' floats agree bit for bit.  The file-layout bodies reach them from
   W[s] = the scaled partial sums of sub-blocks s and s + 4 (s < 4; 8 lanes, the first half in lanes
   0-3) by three in-lane hadds. */
KQ_INLINE __m256i kq_fold_k4(__m256i w0, __m256i w1, __m256i w2, __m256i w3) {
    return _mm256_hadd_epi32(_mm256_hadd_epi32(w0, w1), _mm256_hadd_epi32(w2, w3));
}

/* Q6_K's lanes: lane k of A holds sub-blocks 2k and 2k + 1 whole (each times its scale, the bias
   taken out), again what the AVX-512 packed kernel sums.  The file-layout bodies have P[k] = the
   scaled partial sums of sub-blocks 2k (lanes 0-3) and 2k + 1 (lanes 4-7); X[m] = hadd(P[2m],
   P[2m+1]), Y[n] = hadd(X[2n], X[2n+1]) = [P[4n] .. P[4n+3] over their lanes 0-3 | over lanes 4-7];
   kq_fold_y adds the halves: [P[0] .. P[7] whole]. */
KQ_INLINE __m256i kq_fold_y(__m256i y0, __m256i y1) {
    return _mm256_add_epi32(_mm256_permute2x128_si256(y0, y1, 0x20), _mm256_permute2x128_si256(y0, y1, 0x31));
}

/* ---- one row x NC columns: vec_dot, prefill tiles, decode ---------------------------------------- */

/* The decode kernels' software prefetch goes to L2 (prefetcht1), not L1: in L1 the prefetched lines
   hold the few L1 miss buffers for their whole trip from DRAM, and the demand loads and the L1
   hardware prefetcher wait behind them, while L2 has room for the whole 8 KiB the stream runs
   ahead.  Zen 4 (EPYC 9004 VM, kbench 2048 x 8192 cold, one core): Q4_0x4 12 -> 19-23 GB/s,
   Q8_0 15 -> 17-22, Q4_K 17.8 -> 18.5, Q6_K 19.5 -> 21; Llama-3.2-1B decode, alternating pairs,
   17 of 18 faster (t1 +8-29%): docs/benchmarks.md.  T2 measured the same as T1 there; T0 was the choice from
   Zen 3 and Zen 5 measurements, where T1 was not tried. */
#ifndef KQ_PF_HINT
#define KQ_PF_HINT _MM_HINT_T1
#endif

/* touches every 64-byte line of [p, p + n) */
KQ_INLINE void kq_prefetch_span(const char *p, int n) {
#pragma GCC unroll 16
    for (int o = 0; o < n; o += 64) _mm_prefetch(p + o, KQ_PF_HINT);
}

/* Decode streams each weight row from DRAM once.  It goes one row at a time, so the thread reads a
   single linear stream, and prefetches KQ_DEC_PF bytes ahead of it (the rows of a share are
   contiguous, so the prefetch runs on into the next row).  Measured on Zen 3 (Llama-3.2-1B Q4_K_M,
   medians of 6 alternating runs): 10-11% more decode tok/s at 1 and 2 threads than four interleaved
   rows with a shared prefetch, which trained the hardware prefetcher poorly and spilled registers;
   4 KiB ahead gave about 8%. */
#ifndef KQ_DEC_PF
#define KQ_DEC_PF 8192
#endif

/* MIN: the type has mins (B); MOFF: byte offset of dmin in the block */
#define KQ_KERNELS(t, MIN, MOFF)                                                                        \
    /* one row x NC columns over super-blocks i0 .. i1, accumulating into acc[0..NC); pf > 0 prefetches \
       every block pf bytes ahead (decode) */                                                               \
    KQ_INLINE void kq_cols_##t(int i0, int i1, int NC, const void *vx, const block_q8_K *const *y, __m256 *acc, \
                               int pf) {                                                                    \
        const block_##t *x = vx;                                                                            \
        __m256 t[4];                                                                                        \
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) t[c] = acc[c];                                \
        for (int i = i0; i < i1; i++) {                                                                     \
            if (pf) kq_prefetch_span((const char *)(x + i) + pf, (int)sizeof(block_##t));                   \
            __m256i A[4], B[4];                                                                             \
            kq_sb_##t(NC, x + i, y, i, A, B);                                                               \
            const float dx = kq_fp16(x[i].d), mx = MIN ? -kq_fp16(*(const hr_fp16 *)((const char *)(x + i) + MOFF)) : 0; \
            _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {                                          \
                const float dy = y[c][i].d;                                                                 \
                t[c] = _mm256_fmadd_ps(_mm256_set1_ps(dy * dx), _mm256_cvtepi32_ps(A[c]), t[c]);             \
                if (MIN) t[c] = _mm256_fmadd_ps(_mm256_set1_ps(dy * mx), _mm256_cvtepi32_ps(B[c]), t[c]);     \
            }                                                                                               \
        }                                                                                                   \
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) acc[c] = t[c];                                \
    }

/* ---- entry points ------------------------------------------------------------------------------------ */

/* Prefill tiles: up to 16 weight rows x 4 activation rows, walked along K in chunks of KQ_KC
   super-blocks so that the 4 activation rows' chunk (4 x 8 x 292 B = 9 KiB) stays in L1 while the
   16 weight rows pass over it; each weight vector is unpacked once per 4 columns.  (Row by row over
   all columns instead re-read every activation row from L2 per weight row: ~8x the L2 traffic.) */
enum { KQ_KC = 8, KQ_TR = 16 };

#define KQ_ENTRY(arch, t)                                                                                           \
    void hq_vec_dot_##arch##_##t(int n, float *restrict s, const void *restrict vx, const void *restrict vy) { \
        const block_q8_K *yc[1] = {vy};                                                                    \
        __m256 acc = _mm256_setzero_ps();                                                                  \
        kq_cols_##t(0, n / QK_K, 1, vx, yc, &acc, 0);                                                      \
        *s = kq_hsum(acc);                                                                                 \
    }                                                                                                      \
    void hq_gemm_##arch##_##t(int n, float *restrict s, size_t lds, const void *restrict vx, size_t bx, int nr, \
                          const void *restrict vy, size_t by, int nc) {                                     \
        const int nb = n / QK_K;                                                                           \
        if (nc == 1) { /* decode: one row at a time, see KQ_DEC_PF */                                      \
            const block_q8_K *yc[1] = {vy};                                                                \
            for (int r = 0; r < nr; r++) {                                                                 \
                __m256 acc = _mm256_setzero_ps();                                                          \
                kq_cols_##t(0, nb, 1, (const char *)vx + (size_t)r * bx, yc, &acc, KQ_DEC_PF);             \
                s[r] = kq_hsum(acc);                                                                       \
            }                                                                                              \
            return;                                                                                        \
        }                                                                                                  \
        for (int r0 = 0; r0 < nr; r0 += KQ_TR) {                                                           \
            const int m = nr - r0 < KQ_TR ? nr - r0 : KQ_TR;                                               \
            for (int j0 = 0; j0 < nc; j0 += 4) {                                                           \
                const int C = nc - j0 < 4 ? nc - j0 : 4;                                                   \
                const block_q8_K *yc[4];                                                                   \
                for (int c = 0; c < 4; c++)                                                                \
                    yc[c] = (const block_q8_K *)((const char *)vy + (size_t)(j0 + (c < C ? c : 0)) * by); \
                __m256 acc[KQ_TR][4];                                                                      \
                for (int r = 0; r < m; r++)                                                                \
                    for (int c = 0; c < 4; c++) acc[r][c] = _mm256_setzero_ps();                           \
                for (int i0 = 0; i0 < nb; i0 += KQ_KC) {                                                   \
                    const int i1 = nb - i0 < KQ_KC ? nb : i0 + KQ_KC;                                      \
                    for (int r = 0; r < m; r++) {                                                          \
                        const void *xr = (const char *)vx + (size_t)(r0 + r) * bx;                         \
                        switch (C) {                                                                       \
                        case 4: kq_cols_##t(i0, i1, 4, xr, yc, acc[r], 0); break;                             \
                        case 3: kq_cols_##t(i0, i1, 3, xr, yc, acc[r], 0); break;                             \
                        case 2: kq_cols_##t(i0, i1, 2, xr, yc, acc[r], 0); break;                             \
                        default: kq_cols_##t(i0, i1, 1, xr, yc, acc[r], 0); break;                            \
                        }                                                                                  \
                    }                                                                                      \
                }                                                                                          \
                for (int c = 0; c < C; c++)                                                                \
                    for (int r = 0; r < m; r++) s[(size_t)(j0 + c) * lds + r0 + r] = kq_hsum(acc[r][c]);   \
            }                                                                                              \
        }                                                                                                  \
    }

/* Q6_K's x4v activations: per super-block d, 32 times each sub-block's sum in the order of the lanes
   (sets 0-3: sub-blocks 0 2 4 6 | 1 3 5 7 | 8 10 12 14 | 9 11 13 15), and the quants in the order of
   the code vectors (quants-k512.c) */
typedef struct { float d; int32_t bs32[QK_K / 16]; int8_t qs[QK_K]; } kq_q6p;

/* super-blocks per K-panel of the x4v layouts (docs/quant.md) */
enum { KQ_PU = HQ_PANEL / QK_K };

/* Decode over the x4v layouts: the activation row prepared (PT: hq_prep) by the caller, once per
   matmul; then band by band (docs/quant.md) K-panel by K-panel, each panel's groups one after another —
   one linear stream in which each panel's activations stay in L1 while its groups pass; each group's
   accumulators carried from panel to panel (one per sub-group: NSUB of them, of 4 / NSUB rows), so
   every lane still sums its super-blocks in order: the file-layout kernel's bits.  Within a panel a
   group goes DC entries at a time, each sub-group in turn (AVX2: the second pair of rows reads the
   entries from L1).  COLS(sub, i0, i1, yo, NC, group, y, acc): sub-group sub of a group's entries
   i0 .. i1 (at group + i * E) against y[c][i - yo]; STORE(dst, lo, hi) a sub-group's 4 / NSUB sums.
   Returns from the gemm when nc == 1. */
#define KQ_PREP_DECODE(PT, COLS, VT, ZERO, STORE, NSUB, E, DC)                                                  \
    if (nc == 1) {                                                                                              \
        const PT *y1_[1] = {(const PT *)vy};                                                                    \
        for (int b0 = 0; b0 < nr; b0 += HQ_BAND) {                                                              \
            const int ng = (nr - b0 < HQ_BAND ? nr - b0 : HQ_BAND) / HQ_PACK_ROWS;                              \
            const uint8_t *band = (const uint8_t *)x + (size_t)b0 * bx;                                         \
            VT dacc_[HQ_BAND / HQ_PACK_ROWS * (NSUB)][2];                                                       \
            for (int q = 0; q < ng * (NSUB); q++) dacc_[q][0] = dacc_[q][1] = ZERO();                           \
            for (int p0 = 0; p0 < nb; p0 += KQ_PU) {                                                            \
                const int w = nb - p0 < KQ_PU ? nb - p0 : KQ_PU;                                                \
                for (int g = 0; g < ng; g++) {                                                                  \
                    const uint8_t *grp = band + hq_panel_at(ng, g, nb, p0, KQ_PU, (E));                                \
                    for (int c0 = 0; c0 < w; c0 += (DC)) {                                                      \
                        const int c1 = w - c0 < (DC) ? w : c0 + (DC);                                           \
                        for (int sub = 0; sub < (NSUB); sub++)                                                  \
                            COLS(sub, c0, c1, -p0, 1, grp, y1_, dacc_[(NSUB) * g + sub]);                       \
                    }                                                                                           \
                }                                                                                               \
            }                                                                                                   \
            for (int q = 0; q < ng * (NSUB); q++)                                                               \
                STORE(s + b0 + HQ_PACK_ROWS / (NSUB) * q, dacc_[q][0], dacc_[q][1]);                            \
        }                                                                                                       \
        return;                                                                                                 \
    }

/* the packed gemm (hq_gemm_fn) of type t over an x4v layout, whose activation rows (vy, by) are in
   the form PT (prepared by PREP(src, dst, super-blocks): hq_prep_<arch>_<t>): decode above, prefill
   tiles below */
#define KQ_PREP_GEMM(arch, t, PT, PREP, COLS, VT, ZERO, STORE, NSUB, E, DC)                                      \
    void hq_prep_##arch##_##t(void *restrict dst, const void *restrict src, int64_t n) {                         \
        PREP((const block_q8_K *)src, (PT *)dst, (int)(n / QK_K));                                              \
    }                                                                                                           \
    size_t hq_prep_size_##arch##_##t(int64_t n) { return (size_t)(n / QK_K) * sizeof(PT); }                     \
    void hq_gemm_packed_##arch##_##t(int n, float *restrict s, size_t lds, const void *restrict x, size_t bx,     \
                                     int nr, const void *restrict vy, size_t by, int nc) {                       \
        const int nb = n / QK_K;                                                                                \
        KQ_PREP_DECODE(PT, COLS, VT, ZERO, STORE, NSUB, E, DC)                                                  \
        KQ_PREP_TILES(PT, COLS, VT, ZERO, STORE, NSUB, E)                                                       \
    }

/* Prefill tiles over the x4v layouts (Q4_K, Q6_K), whose kernels read the activations prepared in
   their order (type PT): 16 weight rows x 4 activation rows, K in chunks of KQ_KC super-blocks (the 4
   rows' chunk, 9-10 KiB, stays in L1 while the tile's rows pass).  A group of 4 rows is NSUB
   sub-groups (256-bit kernels: 2 of 2 rows) with 8 accumulators of type VT each (2 per column), run by COLS(sub, i0, i1, yo, NC,
   group, y, acc) and stored by STORE(dst, acc_lo, acc_hi).  Declares the locals it needs; nb, nr, nc,
   x, bx, vy, by, s and lds are the gemm's.  A tile is one band (of HQ_BAND rows, the last maybe fewer),
   and a chunk of KQ_KC super-blocks lies within one K-panel.
   Tiles of at most KQ_FEW_NC columns (a decode step of several sequences, issue 27) read their
   weights from DRAM once for little arithmetic, as decode does, and in chunks, the groups in turn,
   the unit's work was added to the wait for its bytes: each sub-group's super-blocks of a K-panel
   go in one run (one stream) instead, each requesting into L1 the bytes KQ_FEW_PF ahead of it.
   Llama-3.2-1B shape Q4_K_M, 2 threads on a 16-core Xeon, a step of 4 sequences against a step of
   one: 1.39x -> 0.89x, 8: 1.90x -> 1.56x (one run alone: 1.37x; the decode distance KQ_DEC_PF
   into L2: 1.02x; docs/benchmarks.md, issue 27).  Every sum keeps its order. */
enum { KQ_FEW_NC = 8, KQ_FEW_PF = 4608 };
static_assert((int)KQ_TR == (int)HQ_BAND && (int)KQ_PU % (int)KQ_KC == 0, "prefill tiles: one band, chunks within a panel");
#define KQ_TILE_COLS(COLS, sub, k0, k1, yo, C, grp, yc, acc)                                                    \
    switch (C) {                                                                                                \
    case 4: COLS(sub, k0, k1, yo, 4, grp, yc, acc); break;                                                      \
    case 3: COLS(sub, k0, k1, yo, 3, grp, yc, acc); break;                                                      \
    case 2: COLS(sub, k0, k1, yo, 2, grp, yc, acc); break;                                                      \
    default: COLS(sub, k0, k1, yo, 1, grp, yc, acc); break;                                                     \
    }
#define KQ_PREP_TILES(PT, COLS, VT, ZERO, STORE, NSUB, E)                                                         \
    const bool few = nc <= KQ_FEW_NC;                                                                           \
    const int kc = few ? KQ_PU : KQ_KC;                                                                         \
    for (int r0 = 0; r0 < nr; r0 += KQ_TR) {                                                                    \
        const int ng = (nr - r0 < KQ_TR ? nr - r0 : KQ_TR) / HQ_PACK_ROWS, ns = ng * (NSUB);                    \
        const uint8_t *band = (const uint8_t *)x + (size_t)r0 * bx;                                             \
        for (int j0 = 0; j0 < nc; j0 += 4) {                                                                    \
            const int C = nc - j0 < 4 ? nc - j0 : 4;                                                            \
            VT acc[KQ_TR / 4 * (NSUB)][8];                                                                      \
            for (int g = 0; g < ns; g++)                                                                        \
                for (int c = 0; c < 8; c++) acc[g][c] = ZERO();                                                 \
            for (int i0 = 0; i0 < nb; i0 += kc) {                                                               \
                const int i1 = nb - i0 < kc ? nb : i0 + kc, p0 = i0 / KQ_PU * KQ_PU;                            \
                const PT *yc[4];                                                                                \
                for (int c = 0; c < 4; c++)                                                                     \
                    yc[c] = (const PT *)((const char *)vy + (size_t)(j0 + (c < C ? c : 0)) * by) + i0;          \
                for (int g = 0; g < ns; g++) {                                                                  \
                    const uint8_t *grp = band + hq_panel_at(ng, g / (NSUB), nb, p0, KQ_PU, (E));                \
                    const int k0 = i0 - p0, k1 = i1 - p0;                                                       \
                    if (!few) {                                                                                 \
                        KQ_TILE_COLS(COLS, g % (NSUB), k0, k1, k0, C, grp, yc, acc[g])                          \
                        continue;                                                                               \
                    }                                                                                           \
                    for (int k = k0; k < k1; k++) {                                                             \
                        const char *pf = (const char *)grp + (size_t)k * (E) + KQ_FEW_PF;                       \
                        for (int o = 0; o < (E); o += 64) _mm_prefetch(pf + o, _MM_HINT_T0);                    \
                        KQ_TILE_COLS(COLS, g % (NSUB), k, k + 1, k0, C, grp, yc, acc[g])                        \
                    }                                                                                           \
                }                                                                                               \
            }                                                                                                   \
            for (int g = 0; g < ns; g++)                                                                        \
                for (int c = 0; c < C; c++)                                                                     \
                    STORE(s + (size_t)(j0 + c) * lds + r0 + 4 / (NSUB) * g, acc[g][2 * c], acc[g][2 * c + 1]);  \
        }                                                                                                       \
    }

#endif
