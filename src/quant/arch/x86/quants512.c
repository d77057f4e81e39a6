/* quant, x86 AVX-512 (F, BW, VNNI): Q4_0 and Q8_0 decode and prefill over their "x4v" packed layout
 * (docs/quant.md), and the Q8_0 prefill tiles over the file layout.
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
 * arithmetic reached only 63-70% of the stream at one thread, without it 93-94% (docs/benchmarks.md).
 *
 * Q8_0 (session 17) has the same layout with 8 code vectors (a code per byte), each code offset by
 * 128 when packed, so vpdpbusd takes it as its unsigned operand and the offset comes back out with
 * the zero point's mechanism (-128 * the block's activation sum).  Its file-layout kernels (AVX2,
 * and the AVX-512 tiles below) were changed to the same order, so x4v gives their bits.  It was the
 * one type below 90% of the stream at two threads in this VM's fast memory phase: its AVX2 decode ran
 * at 30-34 GB/s a core hot against the ~31 each core must take; x4v runs at ~90 (kbench 2048 x 2048,
 * one core), and Llama-3.2-1B Q8_0 decode went from 88.7-91.6% of the same-seconds stream to 95.8% at
 * ~63 GB/s (docs/benchmarks.md). */
#include "quant/quant-impl.h"

#include <immintrin.h>

#define QZ_INLINE static inline __attribute__((always_inline))

/* a prepared unit of an activation row: step i (< 8) = bytes 4i .. 4i+3 of each of the unit's 4
   blocks (16 bytes, broadcast to the 4 rows' lanes), the 4 scales, -z * the 4 blocks' sums (z the
   weights' offset: Q4_0's zero point 8, Q8_0's 128) */
typedef struct {
    uint8_t a[8][16];
    float d[4];
    int32_t z[4];
} qv_a;

/* units u0 .. u0+nu of Q8_0 row y, prepared for weights offset by 1 << zs */
QZ_INLINE void qv_prep(const block_q8_0 *y, int u0, int nu, qv_a *buf, int zs) {
    const __m256i ones8 = _mm256_set1_epi8(1), ones = _mm256_set1_epi16(1);
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
        /* dword j of every step is block j's: the sums over the steps, 16-bit pairs first (at most
           8 * 128 in magnitude), then the two halves, times the offset */
        const __m256i h = _mm256_add_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(ones8, p0), _mm256_maddubs_epi16(ones8, p1)),
                                           _mm256_add_epi16(_mm256_maddubs_epi16(ones8, p2), _mm256_maddubs_epi16(ones8, p3)));
        const __m256i w = _mm256_madd_epi16(h, ones);
        const __m128i z = _mm_add_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
        _mm_storeu_si128((__m128i *)a->z, _mm_sub_epi32(_mm_setzero_si128(), _mm_slli_epi32(z, zs)));
    }
}

/* A unit's codes as 8 vectors, w[i] against step i.  Q4_0 (4 vectors in the layout): w[i] the low
   nibbles, w[i + 4] the high ones in place (16 * code; x & 0xF0, one AND, no shift); Q8_0: the 8
   vectors as they are (codes + 128). */
QZ_INLINE void qv_codes(bool q8, const char *e, __m512i *w) {
    if (q8) {
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) w[i] = _mm512_loadu_si512(e + 32 + 64 * i);
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        const __m512i q = _mm512_loadu_si512(e + 32 + 64 * i);
        w[i] = _mm512_and_si512(q, m4);
        w[i + 4] = _mm512_andnot_si512(m4, q);
    }
}

/* the 16 (row, block) integer dot products of a unit's codes with prepared unit a: two chains (steps
   0-3, which start from the offset's correction, and 4-7), Q4_0's second divided by 16 (exact: every
   product a multiple of 16) */
QZ_INLINE __m512i qv_dots(bool q8, const __m512i *w, const qv_a *a) {
    __m512i l = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)a->z)), h = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        l = _mm512_dpbusd_epi32(l, w[i], _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)a->a[i])));
        h = _mm512_dpbusd_epi32(h, w[i + 4], _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)a->a[i + 4])));
    }
    return _mm512_add_epi32(l, q8 ? h : _mm512_srai_epi32(h, 4));
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

/* bytes of a unit */
QZ_INLINE size_t qv_unit(bool q8) { return 16 * (q8 ? sizeof(block_q8_0) : sizeof(block_q4_0)); }

enum {
    QV_KC = 8, QV_TC = 4, QV_TR = 16,  /* prefill: units per chunk, columns and rows per tile */
    QV_PU = HQ_PANEL / 128,            /* units per K-panel (docs/quant.md) */
    /* Tiles of a few columns (a decode step of several sequences, issue 27) read the weights from
       DRAM once for little arithmetic, as decode does, and were bound by the stream's latency: each
       group's units in chunks of QV_KC, the 4 groups of a band taken in turn, and the unit's work
       added to the wait for its bytes (Llama-3.2-1B shape, 2 threads on a 16-core Xeon: a step of 4
       sequences 1.63x a step of one, 8: 2.52x).  So up to QV_FEW_NC columns each group's units of a
       panel go in one run, one stream for the prefetchers, and each unit requests the bytes
       QV_PF_UNITS units ahead of it into L1: 4 sequences 1.00x, 8: 1.82x (docs/benchmarks.md, issue
       27).  The order of every sum is the same either way (units in order, per row and column). */
    QV_FEW_NC = 8, QV_PF_UNITS = 16,
};
static_assert((int)QV_TR == (int)HQ_BAND && (int)QV_PU % (int)QV_KC == 0, "prefill tiles: one band, chunks within a panel");

/* decode: the activation row prepared by the caller (hq_prep_avx512_q4_0 / _q8_0), band by band (docs/quant.md)
   K-panel by K-panel, each panel's groups one after another, each group's accumulator carried from
   panel to panel */
QZ_INLINE void qv_matvec(bool q8, int nu, float *restrict s, const char *restrict x, size_t bx, int nr,
                         const qv_a *buf) {
    const size_t E = qv_unit(q8);
    for (int b0 = 0; b0 < nr; b0 += HQ_BAND) {
        const int ng = (nr - b0 < HQ_BAND ? nr - b0 : HQ_BAND) / 4;
        const char *band = x + (size_t)b0 * bx;
        __m512 acc[HQ_BAND / 4];
        for (int g = 0; g < ng; g++) acc[g] = _mm512_setzero_ps();
        for (int p0 = 0; p0 < nu; p0 += QV_PU) {
            const int w = nu - p0 < QV_PU ? nu - p0 : QV_PU;
            for (int g = 0; g < ng; g++) {
                const char *e = band + hq_panel_at(ng, g, nu, p0, QV_PU, E);
                __m512 t = acc[g];
                for (int u = p0; u < p0 + w; u++, e += E) {
                    __m512i c[8];
                    qv_codes(q8, e, c);
                    const __m512 dx = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)e));
                    t = qv_acc(t, dx, buf + u, qv_dots(q8, c, buf + u));
                }
                acc[g] = t;
            }
        }
        for (int g = 0; g < ng; g++) qv_store(acc[g], s + b0 + 4 * g);
    }
}

/* prefill: one group's units k0 .. k0+kc against C prepared columns (column c's unit k at yc[c][k]),
   accumulating into acc[c] */
QZ_INLINE void qv_rows(bool q8, int C, const char *grp, int k0, int kc, const qv_a *const *yc, __m512 *acc, size_t pf) {
    __m512 t[QV_TC];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) t[c] = acc[c];
    for (int k = 0; k < kc; k++) {
        const char *e = grp + (size_t)(k0 + k) * qv_unit(q8);
        if (pf)
            for (size_t b = 0; b < qv_unit(q8); b += 64) _mm_prefetch(e + pf + b, _MM_HINT_T0);
        __m512i w[8];
        qv_codes(q8, e, w);
        const __m512 dx = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)e));
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const qv_a *a = yc[c] + k;
            t[c] = qv_acc(t[c], dx, a, qv_dots(q8, w, a));
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) acc[c] = t[c];
}

/* the x4v gemm (whole bands, activation rows prepared): decode, or prefill tiles of one band (16
   rows) x 4 columns, K in chunks of QV_KC units (within one K-panel) whose prepared columns (5 KiB)
   stay in L1 while the tile's rows pass */
QZ_INLINE void qv_gemm(bool q8, int n, float *restrict s, size_t lds, const void *restrict x, size_t bx, int nr,
                       const void *restrict y, size_t by, int nc) {
    const int nu = n / 128;
    if (nc == 1) {
        qv_matvec(q8, nu, s, x, bx, nr, y);
        return;
    }
    const bool few = nc <= QV_FEW_NC; /* a decode step of several sequences: see QV_FEW_NC */
    const size_t pf = few ? (size_t)QV_PF_UNITS * qv_unit(q8) : 0;
    for (int r0 = 0; r0 < nr; r0 += QV_TR) {
        const int ng = (nr - r0 < QV_TR ? nr - r0 : QV_TR) / 4;
        const char *band = (const char *)x + (size_t)r0 * bx;
        for (int j = 0; j < nc; j += QV_TC) {
            const int C = nc - j < QV_TC ? nc - j : QV_TC;
            __m512 acc[QV_TR / 4][QV_TC];
            for (int g = 0; g < ng; g++)
                for (int c = 0; c < QV_TC; c++) acc[g][c] = _mm512_setzero_ps();
            const int KC = few ? QV_PU : QV_KC;
            for (int k0 = 0; k0 < nu; k0 += KC) {
                const int kc = nu - k0 < KC ? nu - k0 : KC, p0 = k0 / QV_PU * QV_PU;
                const qv_a *buf[QV_TC];
                for (int c = 0; c < QV_TC; c++) buf[c] = (const qv_a *)((const char *)y + (size_t)(j + (c < C ? c : 0)) * by) + k0;
                for (int g = 0; g < ng; g++) {
                    const char *grp = band + hq_panel_at(ng, g, nu, p0, QV_PU, qv_unit(q8));
                    switch (C) {
                    case 1: qv_rows(q8, 1, grp, k0 - p0, kc, buf, acc[g], pf); break;
                    case 2: qv_rows(q8, 2, grp, k0 - p0, kc, buf, acc[g], pf); break;
                    case 3: qv_rows(q8, 3, grp, k0 - p0, kc, buf, acc[g], pf); break;
                    default: qv_rows(q8, 4, grp, k0 - p0, kc, buf, acc[g], pf); break;
                    }
                }
            }
            for (int g = 0; g < ng; g++)
                for (int c = 0; c < C; c++) qv_store(acc[g][c], s + (size_t)(j + c) * lds + r0 + 4 * g);
        }
    }
}

/* the activation rows the packed kernel reads (quant.h, hq_prep_fn): prepared units where x4v fits
   the row, the Q8_0 row as it is where the x4 layout and the AVX2 kernel take it */
void hq_prep_avx512_q4_0(void *restrict dst, const void *restrict src, int64_t n) {
    if (!hq_x4v_fits(n)) {
        memcpy(dst, src, (size_t)(n / QK8_0) * sizeof(block_q8_0));
        return;
    }
    qv_prep((const block_q8_0 *)src, 0, (int)(n / (4 * QK4_0)), (qv_a *)dst, 3);
}
size_t hq_prep_size_avx512_q4_0(int64_t n) {
    return hq_x4v_fits(n) ? (size_t)(n / (4 * QK4_0)) * sizeof(qv_a) : (size_t)(n / QK8_0) * sizeof(block_q8_0);
}

/* rows that x4v does not fit are in the x4 layout, which the AVX2 kernel reads (hq_x4v_fits) */
void hq_gemm_packed_avx512_q4_0(int n, float *restrict s, size_t lds, const void *restrict x, size_t bx, int nr,
                                const void *restrict y, size_t by, int nc) {
    if (!hq_x4v_fits(n)) {
        hq_gemm_packed_avx2_q4_0(n, s, lds, x, bx, nr, y, by, nc);
        return;
    }
    qv_gemm(false, n, s, lds, x, bx, nr, y, by, nc);
}

/* Q8_0 packs only rows x4v fits (hq_pack_ok) */
void hq_prep_avx512_q8_0(void *restrict dst, const void *restrict src, int64_t n) {
    qv_prep((const block_q8_0 *)src, 0, (int)(n / (4 * QK8_0)), (qv_a *)dst, 7);
}
size_t hq_prep_size_avx512_q8_0(int64_t n) { return (size_t)(n / (4 * QK8_0)) * sizeof(qv_a); }
void hq_gemm_packed_avx512_q8_0(int n, float *restrict s, size_t lds, const void *restrict x, size_t bx, int nr,
                                const void *restrict y, size_t by, int nc) {
    qv_gemm(true, n, s, lds, x, bx, nr, y, by, nc);
}

/* ---- Q8_0 prefill tiles over the file layout ---------------------------------------------------
   The AVX2 tile's sums in 512-bit vectors (quants.c, hq_rows4): a vector holds two groups of 4 rows
   (its 128-bit lanes: group 0 at blocks b, b+1, then group 1), so each group's lanes are the AVX2
   tile's and every float step is the same: bit-identical results (test-quant), which are also the
   x4v kernel's.  The weights are signed, and vpdpbusd wants one unsigned operand: the codes go in
   offset by 128 (w ^ 0x80 = w + 128 as a byte), which adds 128 * (the four activations) to each
   int32 lane; the sum starts from -128 * those (computed once per activation pair), so vpdpbusd
   itself takes it back out, two steps (bytes 0-15, 16-31 of each block) giving what the AVX2 tile's
   two madds give.  Rows rarely packed (--mmap, --no-repack, shapes x4v does not take) run here. */

/* a prepared pair of activation blocks b, b+1: codes [b 0-15 | b+1 0-15] and [16-31 | 16-31], -128 *
   each lane's 8 codes, the scales [d_b x4 | d_b+1 x4] */
typedef struct { __m256i lo, hi, corr; __m256 d; } qz_p;

enum { QZ_KB = 16, QZ_TC = 4, QZ_TR = 16 }; /* block pairs per chunk, columns and rows per tile */

QZ_INLINE __m256i qz_cross(const char *p0, const char *p1) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p0)),
                                   _mm_loadu_si128((const __m128i *)p1), 1);
}

QZ_INLINE void qz_prep(const block_q8_0 *y, int k0, int kc, qz_p *a) {
    const __m256i c128 = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    for (int k = 0; k < kc; k++, a++) {
        const block_q8_0 *y0 = y + 2 * (size_t)(k0 + k), *y1 = y0 + 1;
        a->lo = qz_cross((const char *)y0->qs, (const char *)y1->qs);
        a->hi = qz_cross((const char *)y0->qs + 16, (const char *)y1->qs + 16);
        const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(c128, a->lo), ones),
                                           _mm256_madd_epi16(_mm256_maddubs_epi16(c128, a->hi), ones));
        a->corr = _mm256_sub_epi32(_mm256_setzero_si256(), s);
        a->d = _mm256_blend_ps(_mm256_set1_ps(hr_fp16_table[y0->d]), _mm256_set1_ps(hr_fp16_table[y1->d]), 0xF0);
    }
}

/* four fp16 scales at byte offset o of rows xr[0..3] as 64 bits */
QZ_INLINE long long qz_h4(const char *const *xr, size_t o) {
    uint16_t h[4];
    for (int i = 0; i < 4; i++) memcpy(&h[i], xr[i] + o, 2);
    uint64_t v;
    memcpy(&v, h, 8);
    return (long long)v;
}

/* two groups of rows (xr[0..3], xr[4..7]) x C prepared columns over block pairs k0 .. k0+kc; acc[c]:
   group 0's AVX2 accumulator in the low 256 bits, group 1's in the high */
QZ_INLINE void qz_rows(int C, const char *const *xr, int k0, int kc, const qz_p *buf, __m512 *acc) {
    const __m512i c128 = _mm512_set1_epi8((char)0x80);
    const size_t bs = sizeof(block_q8_0);
    __m512 t[QZ_TC];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) t[c] = acc[c];
    for (int k = 0; k < kc; k++) {
        const size_t o = 2 * (size_t)(k0 + k) * bs;
        __m512i wl[4], wh[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const char *g0 = xr[r] + o, *g1 = xr[4 + r] + o;
            wl[r] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(qz_cross(g0 + 2, g0 + bs + 2)),
                                                        qz_cross(g1 + 2, g1 + bs + 2), 1), c128);
            wh[r] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(qz_cross(g0 + 18, g0 + bs + 18)),
                                                        qz_cross(g1 + 18, g1 + bs + 18), 1), c128);
        }
        const __m512 dx =
            _mm512_cvtph_ps(_mm256_set_epi64x(qz_h4(xr + 4, o + bs), qz_h4(xr + 4, o), qz_h4(xr, o + bs), qz_h4(xr, o)));
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const qz_p *a = buf + c * QZ_KB + k;
            const __m512i al = _mm512_broadcast_i64x4(a->lo), ah = _mm512_broadcast_i64x4(a->hi);
            const __m512i corr = _mm512_broadcast_i64x4(a->corr);
            __m512i p[4];
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) p[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(corr, wl[r], al), wh[r], ah);
            /* hq_red4's Q8_0 reduction, lane by 128-bit lane */
            const __m512i q01 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1]));
            const __m512i q23 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
            const __m512i d32 = _mm512_add_epi32(_mm512_unpacklo_epi64(q01, q23), _mm512_unpackhi_epi64(q01, q23));
            const __m512 ad = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(a->d)));
            t[c] = _mm512_fmadd_ps(_mm512_mul_ps(dx, ad), _mm512_cvtepi32_ps(d32), t[c]);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) acc[c] = t[c];
}

void hq_gemm_avx512_q8_0(int n, float *restrict s, size_t lds, const void *restrict x, size_t bx, int nr,
                         const void *restrict y, size_t by, int nc) {
    const int nb = n / QK8_0;
    if (nc == 1 || nb % 2) { /* decode; an odd block count (the AVX2 tile adds its last block apart) */
        hq_gemm_avx2_q8_0(n, s, lds, x, bx, nr, y, by, nc);
        return;
    }
    const int nk = nb / 2;
    qz_p buf[QZ_TC * QZ_KB];
    for (int i0 = 0; i0 < nr; i0 += QZ_TR) {
        /* pairs of groups (8 rows): a short tile repeats its last row, and the repeats' results are
           dropped */
        const int ni = nr - i0 < QZ_TR ? nr - i0 : QZ_TR, np = (ni + 7) / 8;
        const char *xr[QZ_TR];
        for (int i = 0; i < 8 * np; i++) xr[i] = (const char *)x + (size_t)(i0 + (i < ni ? i : ni - 1)) * bx;
        for (int j = 0; j < nc; j += QZ_TC) {
            const int C = nc - j < QZ_TC ? nc - j : QZ_TC;
            __m512 acc[QZ_TR / 8][QZ_TC];
            for (int g = 0; g < np; g++)
                for (int c = 0; c < QZ_TC; c++) acc[g][c] = _mm512_setzero_ps();
            for (int k0 = 0; k0 < nk; k0 += QZ_KB) {
                const int kc = nk - k0 < QZ_KB ? nk - k0 : QZ_KB;
                for (int c = 0; c < C; c++)
                    qz_prep((const block_q8_0 *)((const char *)y + (size_t)(j + c) * by), k0, kc, buf + c * QZ_KB);
                for (int g = 0; g < np; g++) {
                    switch (C) {
                    case 1: qz_rows(1, xr + 8 * g, k0, kc, buf, acc[g]); break;
                    case 2: qz_rows(2, xr + 8 * g, k0, kc, buf, acc[g]); break;
                    case 3: qz_rows(3, xr + 8 * g, k0, kc, buf, acc[g]); break;
                    default: qz_rows(4, xr + 8 * g, k0, kc, buf, acc[g]); break;
                    }
                }
            }
            /* each group's rows: its even-block lanes + its odd-block lanes, as the AVX2 tile */
            for (int g = 0; g < np; g++)
                for (int c = 0; c < C; c++) {
                    float v[16];
                    _mm512_storeu_ps(v, acc[g][c]);
                    for (int i = 0; i < 8 && 8 * g + i < ni; i++)
                        s[(size_t)(j + c) * lds + i0 + 8 * g + i] = v[8 * (i / 4) + i % 4] + v[8 * (i / 4) + 4 + i % 4];
                }
        }
    }
}
