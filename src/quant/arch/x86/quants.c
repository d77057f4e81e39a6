/* quant, x86: AVX2/FMA/F16C kernels for the float types and the 32-element quants — see quant.h.
 *
 * This file is compiled with -mavx2 -mfma -mf16c; quant.c installs its kernels only when the CPU
 * has all three.  The engine does every matmul through the tile kernels (hq_gemm_fn) — decoding
 * is their one-activation-row case — so the tiles below are the hot path; vec_dot serves attention
 * and the tests.
 *
 * Integer dots: a weight block becomes its 32 codes in one ymm register — unsigned for the 4/5-bit
 * types (value = d*(code - z) with zero point z = 8/16 for Q4_0/Q5_0, d*code + m for Q4_1/Q5_1,
 * the min entering through the activation's s = d*sum(q)), signed for Q8_0.
 * _mm256_maddubs_epi16 multiplies unsigned by signed bytes: unsigned codes go in as they are and
 * the zero point comes off as z*sum(a); signed Q8_0 codes use the "sign trick" |w| * (a with w's
 * sign).  Pairs summed in 16 bits cannot saturate: codes <= 31, and for Q8_0 2*128*127 < 32767
 * (|w| is read unsigned, so a weight code -128, which no quantizer writes, is still exact).  vec_dot
 * scales each block's 8 partial int32 sums by dx*dy with one FMA, so a row needs a single horizontal
 * sum at the end; the tiles reduce each block to its whole integer dot first (below).
 *
 * Activation quantizers reproduce the reference byte for byte (including roundf's half-away-from-
 * zero), so results do not depend on which kernel family ran — a device without AVX2 computes the
 * same activations as one with it.
 */
#include "quant/arch/x86/kq.h"

#define HQ_INLINE static inline __attribute__((always_inline))

/* ---- helpers -------------------------------------------------------------------------------------- */

/* Block scales go through hr_fp16_table (filled by hr_init, which hq_get_traits runs): a load
   that runs on the load ports, where F16C's vcvtph2ps needs a move into a vector register and a
   conversion on the vector ports the integer work is queueing for.  On Zen 3 this made Q4_0
   vec_dot ~12% faster, and broadcasting straight from the table another ~8%. */
HQ_INLINE float hq_h2f(hr_fp16 h) { return hr_fp16_to_fp32(h); }
/* the same, in all 8 lanes: a broadcast load straight from the table, no shuffle */
HQ_INLINE __m256 hq_h2v(hr_fp16 h) { return _mm256_broadcast_ss(&hr_fp16_table[h]); }

HQ_INLINE float hq_hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

HQ_INLINE float hq_hmax_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* 16 bytes of packed nibbles -> 32 bytes 0..15 in element order: low nibbles are elements 0..15,
   high nibbles elements 16..31 */
HQ_INLINE __m256i hq_nibbles(const uint8_t *qs) {
    const __m128i b = _mm_loadu_si128((const __m128i *)qs);
    const __m256i v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* 32 bits (little-endian u32 at p) -> 32 bytes, 0xFF where bit j is set */
HQ_INLINE __m256i hq_bits_to_bytes(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    /* byte j takes source byte j/8 (both 128-bit lanes hold all four), then tests its own bit */
    const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL,
                                              0x0303030303030303LL);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* 8 int32 partial sums of (signed w) * (signed a), by the sign trick */
HQ_INLINE __m256i hq_dot_ss(__m256i w, __m256i a) {
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* ---- weight blocks as 32 bytes ------------------------------------------------------------------- */

enum { HQ_K_Q4_0, HQ_K_Q4_1, HQ_K_Q5_0, HQ_K_Q5_1, HQ_K_Q8_0 };

/* codes are unsigned, value = d*(code - zero point) (+ m for the _1 kinds); Q8_0 codes are signed */
HQ_INLINE int hq_kind_zp(int kind) { return kind == HQ_K_Q4_0 ? 8 : kind == HQ_K_Q5_0 ? 16 : 0; }
HQ_INLINE bool hq_kind_min(int kind) { return kind == HQ_K_Q4_1 || kind == HQ_K_Q5_1; }

HQ_INLINE size_t hq_kind_size(int kind) {
    switch (kind) {
    case HQ_K_Q4_0: return sizeof(block_q4_0);
    case HQ_K_Q4_1: return sizeof(block_q4_1);
    case HQ_K_Q5_0: return sizeof(block_q5_0);
    case HQ_K_Q5_1: return sizeof(block_q5_1);
    default:        return sizeof(block_q8_0);
    }
}

/* block b of a weight row: its 32 codes, scale and min. The 5-bit kinds share the 4-bit layout
   plus bit 4 of each code in qh. */
HQ_INLINE __m256i hq_load_w(int kind, const void *row, int b, __m256 *d, float *m) {
    const char *p = (const char *)row + (size_t)b * hq_kind_size(kind);
    switch (kind) {
    case HQ_K_Q4_0: {
        const block_q4_0 *x = (const block_q4_0 *)p;
        *d = hq_h2v(x->d);
        return hq_nibbles(x->qs);
    }
    case HQ_K_Q4_1: {
        const block_q4_1 *x = (const block_q4_1 *)p;
        *d = hq_h2v(x->d);
        *m = hq_h2f(x->m);
        return hq_nibbles(x->qs);
    }
    case HQ_K_Q5_0: {
        const block_q5_0 *x = (const block_q5_0 *)p;
        *d = hq_h2v(x->d);
        const __m256i hi = _mm256_and_si256(hq_bits_to_bytes(x->qh), _mm256_set1_epi8(0x10));
        return _mm256_or_si256(hq_nibbles(x->qs), hi);
    }
    case HQ_K_Q5_1: {
        const block_q5_1 *x = (const block_q5_1 *)p;
        *d = hq_h2v(x->d);
        *m = hq_h2f(x->m);
        const __m256i hi = _mm256_and_si256(hq_bits_to_bytes(x->qh), _mm256_set1_epi8(0x10));
        return _mm256_or_si256(hq_nibbles(x->qs), hi);
    }
    default: {
        const block_q8_0 *x = (const block_q8_0 *)p;
        *d = hq_h2v(x->d);
        return _mm256_loadu_si256((const __m256i *)x->qs);
    }
    }
}

/* Activation blocks: Q8_1 (with s) for the kinds with a min, Q8_0 for the others. */
HQ_INLINE const int8_t *hq_load_a(int kind, const void *row, int b, __m256 *d, float *s) {
    if (!hq_kind_min(kind)) {
        const block_q8_0 *y = (const block_q8_0 *)row + b;
        *d = hq_h2v(y->d);
        return y->qs;
    }
    const block_q8_1 *y = (const block_q8_1 *)row + b;
    *d = hq_h2v(y->d);
    *s = hq_h2f(y->s);
    return y->qs;
}

/* acc += dx*dy * (block's integer dot); *summ += m*s for the kinds with a min.
   With a zero point z the dot is sum(code*a) - z*sum(a): two maddubs and a subtract, one
   instruction less than recentering the codes and using the sign trick (Q4_0 +12% on Zen 3).
   16-bit pair sums stay below 2*31*128 + 2*16*128 < 32767. */
HQ_INLINE __m256 hq_block_dot(int kind, const void *x, const void *y, int b, __m256 acc, float *summ) {
    __m256 dx, dy;
    float mx = 0.0f, sy = 0.0f;
    const __m256i w = hq_load_w(kind, x, b, &dx, &mx);
    const int8_t *qa = hq_load_a(kind, y, b, &dy, &sy);
    const __m256i a = _mm256_loadu_si256((const __m256i *)qa);
    __m256i p;
    if (kind == HQ_K_Q8_0) {
        p = hq_dot_ss(w, a);
    } else {
        __m256i p16 = _mm256_maddubs_epi16(w, a);
        if (hq_kind_zp(kind))
            p16 = _mm256_sub_epi16(p16, _mm256_maddubs_epi16(_mm256_set1_epi8((char)hq_kind_zp(kind)), a));
        p = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
    }
    if (hq_kind_min(kind)) *summ += mx * sy;
    return _mm256_fmadd_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(p), acc);
}

/* two independent accumulators: the FMA chain, not the integer work, would otherwise set the pace */
HQ_INLINE float hq_vec_dot_blocks(int kind, int n, const void *x, const void *y) {
    const int nb = n / QK8_0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float summ0 = 0.0f, summ1 = 0.0f;
    int b = 0;
    for (; b + 1 < nb; b += 2) {
        acc0 = hq_block_dot(kind, x, y, b, acc0, &summ0);
        acc1 = hq_block_dot(kind, x, y, b + 1, acc1, &summ1);
    }
    if (b < nb) acc0 = hq_block_dot(kind, x, y, b, acc0, &summ0);
    return hq_hsum_ps(_mm256_add_ps(acc0, acc1)) + (summ0 + summ1);
}

void hq_vec_dot_avx2_q4_0(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_blocks(HQ_K_Q4_0, n, x, y);
}
void hq_vec_dot_avx2_q4_1(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_blocks(HQ_K_Q4_1, n, x, y);
}
void hq_vec_dot_avx2_q5_0(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_blocks(HQ_K_Q5_0, n, x, y);
}
void hq_vec_dot_avx2_q5_1(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_blocks(HQ_K_Q5_1, n, x, y);
}
void hq_vec_dot_avx2_q8_0(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_blocks(HQ_K_Q8_0, n, x, y);
}

/* ---- tiles: decode (one activation row) and prefill (many) -------------------------------------- */

/* The nibble kinds work on pairs of blocks b, b+1 held as two vectors:
     lo = codes 0..15 of b | codes 0..15 of b+1,    hi = codes 16..31 of b | codes 16..31 of b+1,
   which is how the bytes lie in memory (qs of b and of b+1 in the two lanes; low nibbles are codes
   0..15), so unpacking crosses no lanes.  The activations are permuted to match once per call
   ("prepared") and read from L1 by every weight row.
   Four weight rows (one activation row) are then reduced together: their 16-bit pair results are
   interleaved across rows with in-lane unpacks and added before anything is widened, so one madd,
   one conversion and one FMA serve 4 rows x 2 blocks.  Lane r of the low half ends up with row r's
   dot with block b and lane r of the high half with block b+1, and the 8 fp16 weight scales of
   those 4 rows x 2 blocks convert into exactly that layout with one vcvtph2ps.  The 16-bit sums stay
   exact: a Q4 lane adds at most 16 products of 15 * 128 (30720); the Q5 kinds widen after the first
   step (8 products of 31 * 128 = 31744).  The zero point comes off the 32-bit sums as z * sum(a),
   prepared per block; the mins of Q4_1/Q5_1 as m * s, one FMA with the activation sums s.
   On Zen 3 (L1-resident, 1 core) a Q4_0 row-block takes ~2.5 cycles in decode, where a dot over
   one row at a time took ~4.9 (vec_dot) to ~5.9 (the former tile, one FMA chain), and prefill ~1.8
   cycles per row-column-block (from ~3.4). */

/* a prepared activation pair: codes (lo, hi), z * block sums as int32 (zero-point kinds), scales d
   and sums s (kinds with a min) as [b x4 | b+1 x4] */
typedef struct { __m256i lo, hi, z; __m256 d, s; } hq_a2;

/* two fp16 scales as [h0 x4 | h1 x4] */
HQ_INLINE __m256 hq_h2v2(hr_fp16 h0, hr_fp16 h1) { return _mm256_blend_ps(hq_h2v(h0), hq_h2v(h1), 0xF0); }

/* bit 4 of the codes of a pair (qh words at qh0, qh1), as 0x10 bytes in the pair layout */
HQ_INLINE void hq_hibits2(const uint8_t *qh0, const uint8_t *qh1, __m256i *lo, __m256i *hi) {
    uint32_t h0, h1;
    memcpy(&h0, qh0, 4);
    memcpy(&h1, qh1, 4);
    const __m256i v = _mm256_broadcastsi128_si256(_mm_cvtsi64_si128((long long)((uint64_t)h1 << 32 | h0)));
    /* byte j of lo tests bit j of its block's word: source byte j/8 (h0 bytes 0..3, h1 bytes 4..7);
       hi tests bits 16..31 */
    const __m256i clo = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0404040404040404LL, 0x0505050505050505LL);
    const __m256i chi = _mm256_setr_epi64x(0x0202020202020202LL, 0x0303030303030303LL, 0x0606060606060606LL,
                                           0x0707070707070707LL);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL), b4 = _mm256_set1_epi8(0x10);
    *lo = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, clo), bit), bit), b4);
    *hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, chi), bit), bit), b4);
}

/* where the fields of the nibble blocks sit: d first, then m (the _1 kinds), then qh (Q5), then qs */
static_assert(offsetof(block_q4_0, qs) == 2 && offsetof(block_q4_1, m) == 2 && offsetof(block_q4_1, qs) == 4 &&
              offsetof(block_q5_0, qh) == 2 && offsetof(block_q5_0, qs) == 6 && offsetof(block_q5_1, m) == 2 &&
              offsetof(block_q5_1, qh) == 4 && offsetof(block_q5_1, qs) == 8, "nibble block layouts");

/* the codes of blocks b, b+1 of a weight row in the pair layout; Q8_0's as they are (signed), its
   bytes 0-15 of each block in lo and 16-31 in hi */
HQ_INLINE void hq_codes2(int kind, const void *row, int b, __m256i *lo, __m256i *hi) {
    const size_t bs = hq_kind_size(kind);
    const char *p0 = (const char *)row + (size_t)b * bs, *p1 = p0 + bs;
    if (kind == HQ_K_Q8_0) {
        *lo = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p0 + 2))),
                                      _mm_loadu_si128((const __m128i *)(p1 + 2)), 1);
        *hi = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p0 + 18))),
                                      _mm_loadu_si128((const __m128i *)(p1 + 18)), 1);
        return;
    }
    const size_t off = kind == HQ_K_Q4_0 ? 2 : kind == HQ_K_Q4_1 ? 4 : kind == HQ_K_Q5_0 ? 6 : 8;
    const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p0 + off))),
                                              _mm_loadu_si128((const __m128i *)(p1 + off)), 1);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    *lo = _mm256_and_si256(q, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    if (kind == HQ_K_Q5_0 || kind == HQ_K_Q5_1) {
        __m256i hl, hh;
        hq_hibits2((const uint8_t *)p0 + off - 4, (const uint8_t *)p1 + off - 4, &hl, &hh);
        *lo = _mm256_or_si256(*lo, hl);
        *hi = _mm256_or_si256(*hi, hh);
    }
}

/* zp * (sum of each block's codes), in all 4 lanes of its half */
HQ_INLINE __m256i hq_zsum(int zp, __m256i lo, __m256i hi) {
    const __m256i z = _mm256_set1_epi8((char)zp);
    __m256i t = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(z, lo), _mm256_maddubs_epi16(z, hi)),
                                  _mm256_set1_epi16(1));
    t = _mm256_add_epi32(t, _mm256_shuffle_epi32(t, 0x4E));
    return _mm256_add_epi32(t, _mm256_shuffle_epi32(t, 0xB1));
}

/* prepares entries k0 .. k0+kc of an activation row (pairs, hq_a2) */
HQ_INLINE void hq_prep(int kind, const void *row, int k0, int kc, void *buf) {
    for (int k = 0; k < kc; k++) {
        hq_a2 *a = (hq_a2 *)buf + k;
        const int b = 2 * (k0 + k);
        __m256i a0, a1;
        if (hq_kind_min(kind)) {
            const block_q8_1 *y = (const block_q8_1 *)row + b;
            a0 = _mm256_loadu_si256((const __m256i *)y[0].qs), a1 = _mm256_loadu_si256((const __m256i *)y[1].qs);
            a->d = hq_h2v2(y[0].d, y[1].d);
            a->s = hq_h2v2(y[0].s, y[1].s);
        } else {
            const block_q8_0 *y = (const block_q8_0 *)row + b;
            a0 = _mm256_loadu_si256((const __m256i *)y[0].qs), a1 = _mm256_loadu_si256((const __m256i *)y[1].qs);
            a->d = hq_h2v2(y[0].d, y[1].d);
        }
        a->lo = _mm256_permute2x128_si256(a0, a1, 0x20);
        a->hi = _mm256_permute2x128_si256(a0, a1, 0x31);
        if (hq_kind_zp(kind)) a->z = hq_zsum(hq_kind_zp(kind), a->lo, a->hi);
    }
}

/* four fp16 values, one from each row, as 64 bits; the empty asm keeps GCC from vectorizing the
   gather into a dozen shuffles */
HQ_INLINE uint64_t hq_h4(const char *const *xr, size_t off) {
    uint16_t h0, h1, h2, h3;
    memcpy(&h0, xr[0] + off, 2), memcpy(&h1, xr[1] + off, 2), memcpy(&h2, xr[2] + off, 2), memcpy(&h3, xr[3] + off, 2);
    uint64_t lo = (uint64_t)h0 | (uint64_t)h1 << 16, hi = (uint64_t)h2 | (uint64_t)h3 << 16;
    __asm__("" : "+r"(lo), "+r"(hi));
    return lo | hi << 32;
}

/* the fp16 field at byte offset off of blocks b, b+1 (bs apart) in rows xr[0..3]:
   [rows at b | rows at b+1] */
HQ_INLINE __m256 hq_h8(const char *const *xr, size_t off, size_t bs) {
    return _mm256_cvtph_ps(_mm_set_epi64x((long long)hq_h4(xr, off + bs), (long long)hq_h4(xr, off)));
}

/* the 16-bit pair results p[0..3] of four rows (Q8_0: their int32 sums) as int32 [r0 r1 r2 r3 | r0 r1 r2 r3] */
HQ_INLINE __m256i hq_red4(int kind, const __m256i *p) {
    const __m256i ones = _mm256_set1_epi16(1);
    if (kind == HQ_K_Q8_0) {
        const __m256i q01 = _mm256_add_epi32(_mm256_unpacklo_epi32(p[0], p[1]), _mm256_unpackhi_epi32(p[0], p[1]));
        const __m256i q23 = _mm256_add_epi32(_mm256_unpacklo_epi32(p[2], p[3]), _mm256_unpackhi_epi32(p[2], p[3]));
        return _mm256_add_epi32(_mm256_unpacklo_epi64(q01, q23), _mm256_unpackhi_epi64(q01, q23));
    }
    __m256i q01 = _mm256_add_epi16(_mm256_unpacklo_epi32(p[0], p[1]), _mm256_unpackhi_epi32(p[0], p[1]));
    __m256i q23 = _mm256_add_epi16(_mm256_unpacklo_epi32(p[2], p[3]), _mm256_unpackhi_epi32(p[2], p[3]));
    if (kind == HQ_K_Q5_0 || kind == HQ_K_Q5_1) { /* 5-bit codes: widen after the first step */
        q01 = _mm256_madd_epi16(q01, ones), q23 = _mm256_madd_epi16(q23, ones);
        return _mm256_add_epi32(_mm256_unpacklo_epi64(q01, q23), _mm256_unpackhi_epi64(q01, q23));
    }
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_unpacklo_epi64(q01, q23), _mm256_unpackhi_epi64(q01, q23)), ones);
}

/* a single block (the last of an odd count), its min term in lane 0 */
HQ_INLINE __m256 hq_dot1(int kind, const void *x, const void *y, int b, __m256 acc) {
    float summ = 0.0f;
    acc = hq_block_dot(kind, x, y, b, acc, &summ);
    if (hq_kind_min(kind)) acc = _mm256_add_ps(acc, _mm256_zextps128_ps256(_mm_set_ss(summ)));
    return acc;
}

/* Weights are read once, straight from DRAM, and four interleaved row streams train the hardware
   prefetcher poorly (Q4_0 decode at ~9 GB/s against ~13 one row at a time), so the kernels
   prefetch the rows' bytes linearly, HQ_LPF ahead of what they read: Q4_0 then streams at ~14-15
   GB/s and Q8_0 at ~14 of the ~17.7 one core can read (tools/membw).  Decode over a thread's whole
   share (hq_matvec) prefetches at least a whole group of 4 rows ahead: with long rows (K = 8192,
   a group of 18-27 KiB) a point 8 KiB past the group's start lies inside the group's own later
   rows, which the four streams read long before the linear walk gets there (kbench, 2048 x 8192
   cold: Q4_K 13.4 -> 16.2 GB/s, Q6_K 11.7 -> 16.6).  The prefetches go to L2 (kq.h, KQ_PF_HINT).
   The nibble kinds' decode runs 7 KiB ahead, not 8 (HQ_DEC_LPF): on a Zen 4 VM at 2 threads
   (Llama-3.2-1B Q4_0, each token's time against a stream of its weights in the same seconds, 30
   runs of 128 tokens per distance) decode reached 92.9% of the stream where the machine gave ~35
   GB/s and 84.4% where it gave ~60, against 87.8% and 83.3% at 8 KiB; 6 KiB 93.8% and 81.9%,
   4.5-5 KiB 71-80% where it gave ~60.  Q8_0 (8 KiB: 92.8 / 89.0%, 7 KiB: 95.7 / 86.5%) and the
   K-quants (kq.h) stay at 8. */
#ifndef HQ_LPF
#define HQ_LPF 8192
#endif
#ifndef HQ_DEC_LPF
#define HQ_DEC_LPF 7168
#endif
#ifndef HQ_PF_AHEAD
#define HQ_PF_AHEAD(bx) (4 * (bx) > HQ_DEC_LPF ? 4 * (bx) : HQ_DEC_LPF)
#endif

enum { HQ_TC = 4 /* most activation rows per tile */ };

/* Rows xr[0..3] (the prefetch pointer pf walks them) against C (1..4) prepared activation rows
   (column c at buf + c * stride entries) over entries k0 .. k0+kc; acc[c] in the 4-row layout.
   packed (Q4_0): xr[0] is a group in the x4 layout (docs/quant.md), whose entry k holds the 8 scales and
   then the 4 rows' codes, just as they are used.  Q8_0's signed codes go by the sign trick |w| *
   (a with w's sign), |w| once per weight vector for all the columns (a code -128 stays exact: |w| is
   read unsigned, 2 * 128 * 127 < 32767), and each half's 16-bit pairs are widened before they are
   added (2 * 127 * 127 leaves no room for more). */
HQ_INLINE void hq_rows4(int kind, bool packed, int C, int k0, int kc, const char *const *xr, const void *buf,
                        int stride, __m256 *acc, const char *pf) {
    const size_t bs = hq_kind_size(kind);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 t[HQ_TC];
    #pragma GCC unroll 4
    for (int c = 0; c < C; c++) t[c] = acc[c];
    for (int k = 0; k < kc; k++) {
        if (HQ_LPF && pf) kq_prefetch_span(pf, 8 * (int)bs), pf += 8 * bs;
        const int b = 2 * (k0 + k);
        __m256i lo[4], hi[4];
        __m256 dx;
        if (packed) {
            const char *e = xr[0] + (size_t)b * 4 * bs;
            dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)e));
            const __m256i m4 = _mm256_set1_epi8(0x0F);
            #pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const __m256i q = _mm256_loadu_si256((const __m256i *)(e + 16 + 32 * i));
                lo[i] = _mm256_and_si256(q, m4), hi[i] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            }
        } else {
            #pragma GCC unroll 4
            for (int i = 0; i < 4; i++) hq_codes2(kind, xr[i], b, &lo[i], &hi[i]);
            dx = hq_h8(xr, (size_t)b * bs, bs);
        }
        const __m256 mx = hq_kind_min(kind) ? hq_h8(xr, (size_t)b * bs + 2, bs) : _mm256_setzero_ps();
        __m256i ulo[4], uhi[4]; /* Q8_0: |w| */
        #pragma GCC unroll 4
        for (int i = 0; kind == HQ_K_Q8_0 && i < 4; i++)
            ulo[i] = _mm256_sign_epi8(lo[i], lo[i]), uhi[i] = _mm256_sign_epi8(hi[i], hi[i]);
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const hq_a2 *a = (const hq_a2 *)buf + c * stride + k;
            __m256i p[4];
            #pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                p[i] = kind == HQ_K_Q8_0
                           ? _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(ulo[i], _mm256_sign_epi8(a->lo, lo[i])), ones),
                                              _mm256_madd_epi16(_mm256_maddubs_epi16(uhi[i], _mm256_sign_epi8(a->hi, hi[i])), ones))
                           : _mm256_add_epi16(_mm256_maddubs_epi16(lo[i], a->lo), _mm256_maddubs_epi16(hi[i], a->hi));
            __m256i d32 = hq_red4(kind, p);
            if (hq_kind_zp(kind)) d32 = _mm256_sub_epi32(d32, a->z);
            t[c] = _mm256_fmadd_ps(_mm256_mul_ps(dx, a->d), _mm256_cvtepi32_ps(d32), t[c]);
            if (hq_kind_min(kind)) t[c] = _mm256_fmadd_ps(mx, a->s, t[c]);
        }
    }
    #pragma GCC unroll 4
    for (int c = 0; c < C; c++) acc[c] = t[c];
}

/* the results of a group of 4 rows (the first n < 4 of them valid) from its accumulator in the 4-row
   layout (even blocks + odd blocks), plus the last block of an odd count, into s[0..n) */
static __attribute__((noinline)) void hq_finish4(int kind, const __m256 *acc, int nb, const char *const *xr, const void *y, int n, float *s) {
    float r[4];
    _mm_storeu_ps(r, _mm_add_ps(_mm256_castps256_ps128(acc[0]), _mm256_extractf128_ps(acc[0], 1)));
    for (int i = 0; i < 4 && i < n; i++) {
        if (nb % 2) r[i] += hq_hsum_ps(hq_dot1(kind, xr[i], y, nb - 1, _mm256_setzero_ps()));
        s[i] = r[i];
    }
}

/* Up to 16 weight rows (groups of 4; a short last group repeats its last row and drops the extra
   results) x C (1..4) activation rows, walked along K in chunks of kc_max prepared entries per
   column.  Decode (C = 1) prefetches the group's 4 rows as one linear stream; prefill re-reads the
   16 rows from L1/L2 for every group of columns and leaves them to the hardware prefetcher. */
HQ_INLINE void hq_tile(int kind, bool packed, int C, int kc_max, void *buf, int nb, float *s, size_t lds,
                       const void *x, size_t bx, int nr, const void *y, size_t by) {
    const int nk = nb / 2, ng = (nr + 3) / 4; /* prepared entries: pairs of blocks */
    __m256 acc[4][HQ_TC];
    const char *xg[4][4];
    for (int g = 0; g < ng; g++) {
        for (int i = 0; i < 4; i++) xg[g][i] = (const char *)x + (size_t)(4 * g + i < nr ? 4 * g + i : nr - 1) * bx;
        for (int c = 0; c < C; c++) acc[g][c] = _mm256_setzero_ps();
    }
    for (int k0 = 0; k0 < nk; k0 += kc_max) {
        const int kc = nk - k0 < kc_max ? nk - k0 : kc_max;
        for (int c = 0; c < C; c++)
            hq_prep(kind, (const char *)y + (size_t)c * by, k0, kc, (hq_a2 *)buf + (size_t)c * kc_max);
        for (int g = 0; g < ng; g++)
            hq_rows4(kind, packed, C, k0, kc, xg[g], buf, kc_max, acc[g],
                     C == 1 ? xg[g][0] + 8 * (size_t)k0 * hq_kind_size(kind) + HQ_LPF : NULL);
    }
    for (int g = 0; g < ng; g++)
        for (int c = 0; c < C; c++)
            hq_finish4(kind, &acc[g][c], nb, xg[g],
                       (const char *)y + (size_t)c * by, nr - 4 * g, s + (size_t)c * lds + 4 * g);
}

/* prepared entries per chunk: decode takes K = 8192 in one (16-20 KiB); prefill keeps 4 columns'
   chunk at 10 KiB so it stays in L1 next to the weight rows */
enum { HQ_KC_DEC = 128, HQ_KC_PRE = 16 };

/* Q8_0's decode goes one row at a time: one linear stream with the prefetch HQ_LPF ahead of it, as
   the K-quants do.  Its sums are the 4-row kernel's (and x4v's, quants512.c) float for float: each
   block's whole integer dot (4 blocks' partial sums reduced together: three hadds and an add),
   scaled by dx * dy with one FMA into its chain (lane 0: the even blocks, lane 1: the odd ones;
   blocks 2 and 3 of a quad moved onto lanes 0 and 1 for a second FMA, as x4v does), the two chains
   added at the end.  The activation codes are read where they are (the row stays in L1); only the
   scales are prepared, dy[b] as floats (a multiple of 4, zeros past nb).  The 4-row kernel here (four
   interleaved row streams, the next group prefetched) ran Llama-3.2-1B Q8_0 at 75% of the stream at
   one thread and 69-90% per matmul at two in the VM's fast phase, against 89-90% and 95-96% one row
   at a time (AVX2 table, Zen 4). */
HQ_INLINE void hq_prep_q8(const void *row, int nb, float *dy) {
    const block_q8_0 *y = row;
    for (int b = 0; b < (nb + 3) / 4 * 4; b++) dy[b] = b < nb ? hq_h2f(y[b].d) : 0.0f;
}

/* the 8 int32 partial sums of block x's codes against block y's */
HQ_INLINE __m256i hq_part_q8(const block_q8_0 *x, const block_q8_0 *y) {
    const __m256i w = _mm256_loadu_si256((const __m256i *)x->qs), a = _mm256_loadu_si256((const __m256i *)y->qs);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w)), _mm256_set1_epi16(1));
}

/* [dot 0, dot 1, dot 2, dot 3] from four blocks' partial sums */
HQ_INLINE __m128i hq_dots4(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* one row of nb blocks against activation row y (scales dy); an odd last block is added as
   hq_finish4 adds it */
HQ_INLINE float hq_row_q8(int nb, const char *row, const void *vy, const float *dy) {
    const block_q8_0 *x = (const block_q8_0 *)row, *y = vy;
    __m128 t = _mm_setzero_ps();
    int b = 0;
    for (; b + 4 <= nb; b += 4) {
        kq_prefetch_span(row + (size_t)b * sizeof(block_q8_0) + HQ_LPF, 4 * (int)sizeof(block_q8_0));
        const __m128i d = hq_dots4(hq_part_q8(x + b, y + b), hq_part_q8(x + b + 1, y + b + 1),
                                   hq_part_q8(x + b + 2, y + b + 2), hq_part_q8(x + b + 3, y + b + 3));
        const __m128 dx = _mm_setr_ps(hr_fp16_table[x[b].d], hr_fp16_table[x[b + 1].d], hr_fp16_table[x[b + 2].d],
                                      hr_fp16_table[x[b + 3].d]);
        const __m128 sc = _mm_mul_ps(dx, _mm_loadu_ps(dy + b)), f = _mm_cvtepi32_ps(d);
        t = _mm_fmadd_ps(sc, f, t);
        t = _mm_fmadd_ps(_mm_movehl_ps(sc, sc), _mm_movehl_ps(f, f), t);
    }
    if (b + 2 <= nb) { /* a last pair: lanes 0 and 1 only (the others add 0 * 0) */
        const __m256i z = _mm256_setzero_si256();
        const __m128i d = hq_dots4(hq_part_q8(x + b, y + b), hq_part_q8(x + b + 1, y + b + 1), z, z);
        const __m128 dx = _mm_setr_ps(hr_fp16_table[x[b].d], hr_fp16_table[x[b + 1].d], 0.0f, 0.0f);
        t = _mm_fmadd_ps(_mm_mul_ps(dx, _mm_loadu_ps(dy + b)), _mm_cvtepi32_ps(d), t);
        b += 2;
    }
    float r = _mm_cvtss_f32(t) + _mm_cvtss_f32(_mm_movehdup_ps(t));
    if (b < nb) r += hq_hsum_ps(hq_dot1(HQ_K_Q8_0, row, y, nb - 1, _mm256_setzero_ps()));
    return r;
}

/* Decode with a K whose prepared row fits the buffer (the nibble kinds: K <= 8192): the activation
   row is prepared once for all the caller's rows (the engine passes a thread's whole share); then
   group by group of 4 rows, each over all of K, the prefetch stream running on across groups,
   consecutive rows lying back to back.  Against 16-row calls (callgrind, K = 2048): Q4_0 11.4 ->
   11.1 instructions per block.  The sums are hq_tile's (one chunk).  Q8_0 goes row by row (above).
   Since session 17 Q8_0's tiles share the 4-row pair kernel and its order (per row: the even
   blocks' chain + the odd blocks', each block's whole integer dot scaled by one FMA), which is also
   the order of its AVX-512 x4v kernel, so that packed and file layouts give the same bits (before:
   per row, 8 lanes of partial sums in two FMA chains).  Zen 4, kbench one core, AVX2 table, prefill
   (16 columns): 50 -> 65 GOP/s. */
HQ_INLINE void hq_matvec(int kind, bool packed, void *buf, int nb, float *s, const void *x, size_t bx, int nr,
                         const void *y) {
    const int nk = nb / 2;
    if (kind == HQ_K_Q8_0) {
        hq_prep_q8(y, nb, buf);
        for (int r = 0; r < nr; r++) s[r] = hq_row_q8(nb, (const char *)x + (size_t)r * bx, y, buf);
        return;
    }
    hq_prep(kind, y, 0, nk, buf);
    for (int r0 = 0; r0 < nr; r0 += 4) {
        const char *xr[4];
        for (int i = 0; i < 4; i++) xr[i] = (const char *)x + (size_t)(r0 + i < nr ? r0 + i : nr - 1) * bx;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        hq_rows4(kind, packed, 1, 0, nk, xr, buf, nk, acc, xr[0] + HQ_PF_AHEAD(bx));
        /* hq_finish4's sums stored in place, without its call per group (2.7% of Q4_0 decode samples at 2
           threads; kbench Q4_0 8192 x 2048 hot, 3 alternating pairs: 33.4-35.2 -> 35.1-37.3 GB/s) */
        if (nb % 2 == 0 && nr - r0 >= 4)
            _mm_storeu_ps(s + r0, _mm_add_ps(_mm256_castps256_ps128(acc[0]), _mm256_extractf128_ps(acc[0], 1)));
        else
            hq_finish4(kind, acc, nb, xr, y, nr - r0, s + r0);
    }
}

HQ_INLINE void hq_gemm_blocks(int kind, bool packed, int n, float *s, size_t lds, const void *x, size_t bx, int nr,
                              const void *y, size_t by, int nc) {
    const int nb = n / QK8_0;
    hq_a2 buf[HQ_KC_DEC > HQ_TC * HQ_KC_PRE ? HQ_KC_DEC : HQ_TC * HQ_KC_PRE];
    /* Q8_0 prepares only its scales (K <= 163840), the others their pairs (K <= 8192) */
    const size_t prep = kind == HQ_K_Q8_0 ? (size_t)(nb + 3) / 4 * 4 * sizeof(float) : nb / 2 * sizeof(hq_a2);
    if (nc == 1 && prep <= sizeof buf) {
        hq_matvec(kind, packed, buf, nb, s, x, bx, nr, y);
        return;
    }
    for (int i0 = 0; i0 < nr; i0 += 16) {
        const int ni = nr - i0 < 16 ? nr - i0 : 16;
        const char *xi = (const char *)x + (size_t)i0 * bx;
        if (nc == 1) {
            hq_tile(kind, packed, 1, HQ_KC_DEC, buf, nb, s + i0, lds, xi, bx, ni, y, by);
            continue;
        }
        for (int j = 0; j < nc; j += HQ_TC) {
            const char *yj = (const char *)y + (size_t)j * by;
            float *sj = s + (size_t)j * lds + i0;
            switch (nc - j) {
            case 1:  hq_tile(kind, packed, 1, HQ_KC_PRE, buf, nb, sj, lds, xi, bx, ni, yj, by); break;
            case 2:  hq_tile(kind, packed, 2, HQ_KC_PRE, buf, nb, sj, lds, xi, bx, ni, yj, by); break;
            case 3:  hq_tile(kind, packed, 3, HQ_KC_PRE, buf, nb, sj, lds, xi, bx, ni, yj, by); break;
            default: hq_tile(kind, packed, 4, HQ_KC_PRE, buf, nb, sj, lds, xi, bx, ni, yj, by); break;
            }
        }
    }
}

#define HQ_GEMM_AVX2(t, KIND)                                                                           \
    void hq_gemm_avx2_##t(int n, float *restrict s, size_t lds, const void *restrict x, size_t bx, int nr, \
                          const void *restrict y, size_t by, int nc) {                                 \
        hq_gemm_blocks(KIND, false, n, s, lds, x, bx, nr, y, by, nc);                                 \
    }
HQ_GEMM_AVX2(q4_0, HQ_K_Q4_0)
HQ_GEMM_AVX2(q4_1, HQ_K_Q4_1)
HQ_GEMM_AVX2(q5_0, HQ_K_Q5_0)
HQ_GEMM_AVX2(q5_1, HQ_K_Q5_1)
HQ_GEMM_AVX2(q8_0, HQ_K_Q8_0)

/* Q4_0 in the x4 layout: the same sums, each entry's scales one load and one conversion instead of
   eight 2-byte loads, and the rows one linear stream (a kbench-style harness, 8192 x 2048, a fresh
   copy per pass, Zen 5: 28-34 GB/s against 24-28 on one core, 48-57 against 42-52 on two: the
   membw roofline).  nr is a multiple of 4, x a group's start, K a multiple of 64 (hq_pack_ok). */
void hq_gemm_packed_avx2_q4_0(int n, float *restrict s, size_t lds, const void *restrict x, size_t bx, int nr,
                              const void *restrict y, size_t by, int nc) {
    hq_gemm_blocks(HQ_K_Q4_0, true, n, s, lds, x, bx, nr, y, by, nc);
}

/* ---- float types ---------------------------------------------------------------------------------- */

enum { HQ_F_F32, HQ_F_F16, HQ_F_BF16 };

/* 8 elements starting at element i, as floats */
HQ_INLINE __m256 hq_load8(int kind, const void *p, int i) {
    switch (kind) {
    case HQ_F_F32:
        return _mm256_loadu_ps((const float *)p + i);
    case HQ_F_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const hr_fp16 *)p + i)));
    default: {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const hr_bf16 *)p + i)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    }
    }
}

HQ_INLINE float hq_load1(int kind, const void *p, int i) {
    switch (kind) {
    case HQ_F_F32: return ((const float *)p)[i];
    case HQ_F_F16: return hq_h2f(((const hr_fp16 *)p)[i]);
    default:       return hr_bf16_to_fp32(((const hr_bf16 *)p)[i]);
    }
}

/* four accumulators hide the FMA latency (4 cycles, 2 per cycle) */
HQ_INLINE float hq_vec_dot_float(int kind, int n, const void *x, const void *y) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm256_fmadd_ps(hq_load8(kind, x, i), hq_load8(kind, y, i), acc0);
        acc1 = _mm256_fmadd_ps(hq_load8(kind, x, i + 8), hq_load8(kind, y, i + 8), acc1);
        acc2 = _mm256_fmadd_ps(hq_load8(kind, x, i + 16), hq_load8(kind, y, i + 16), acc2);
        acc3 = _mm256_fmadd_ps(hq_load8(kind, x, i + 24), hq_load8(kind, y, i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(hq_load8(kind, x, i), hq_load8(kind, y, i), acc0);
    float sum = hq_hsum_ps(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++) sum += hq_load1(kind, x, i) * hq_load1(kind, y, i);
    return sum;
}

void hq_vec_dot_avx2_f32(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_float(HQ_F_F32, n, x, y);
}
void hq_vec_dot_avx2_f16(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_float(HQ_F_F16, n, x, y);
}
/* hq_hsum_ps of v[0..8) in lane p of one vector: the same additions, ((l0 + l4) + (l2 + l6)) +
   ((l1 + l5) + (l3 + l7)), for eight vectors at once */
HQ_INLINE __m256 hq_hsum8_ps(const __m256 *v) {
    __m256 u[4], w[2];
    for (int k = 0; k < 4; k++) /* halves: v[2k] lanes k + (k+4), v[2k+1] likewise */
        u[k] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * k], v[2 * k + 1], 0x20),
                             _mm256_permute2f128_ps(v[2 * k], v[2 * k + 1], 0x31));
    for (int k = 0; k < 2; k++) /* lanes 0 + 2 and 1 + 3 of each half */
        w[k] = _mm256_add_ps(_mm256_shuffle_ps(u[2 * k], u[2 * k + 1], 0x44), _mm256_shuffle_ps(u[2 * k], u[2 * k + 1], 0xEE));
    const __m256 r = _mm256_hadd_ps(w[0], w[1]); /* r0 r2 r4 r6 | r1 r3 r5 r7 */
    return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* The F16 path's attention scores (quant.h, hq_att_kq16_fn): hq_vec_dot_float's sums (four chains
   over 32-element steps, the 8-element tail into the first, the chains added pairwise, then the
   lanes), for the heads of a GQA group two at a time: each K chunk widened once for both, each q
   once per call rather than once per position, and the lanes of eight positions summed together
   (hq_hsum8_ps).  Head sizes above 256 or not a multiple of 8 take the vec_dot itself. */
#define HQ_KQ16_PF 8 /* positions ahead */
HQ_INLINE void hq_kq16_body(int n, int hd, int nq, const hr_fp16 *restrict q, size_t qs, const uint8_t *restrict k,
                            size_t row, float *restrict s, size_t ss) {
    float qf[2][256] __attribute__((aligned(32)));
    __m256 c[2][8]; /* each head's chains summed, for eight positions */
    for (int j0 = 0; j0 < nq; j0 += 2) {
        const int g = nq - j0 < 2 ? nq - j0 : 2;
        for (int j = 0; j < g; j++)
            for (int d = 0; d < hd; d += 8) _mm256_store_ps(qf[j] + d, hq_load8(HQ_F_F16, q + (size_t)(j0 + j) * qs, d));
        if (g == 1) memcpy(qf[1], qf[0], (size_t)hd * sizeof(float)); /* a second head's work, not stored */
        for (int i = 0; i < n; i++) {
            const hr_fp16 *kr = (const hr_fp16 *)(k + (size_t)i * row);
            if (j0 == 0 && i + HQ_KQ16_PF < n) /* the cache's rows are far apart: a stride the hardware may not follow */
                for (int b = 0; b < hd * 2; b += 64) _mm_prefetch((const char *)kr + HQ_KQ16_PF * row + b, _MM_HINT_T0);
            __m256 a[2][4];
            for (int j = 0; j < 2; j++) a[j][0] = a[j][1] = a[j][2] = a[j][3] = _mm256_setzero_ps();
            int d = 0;
            #pragma GCC unroll 8
            for (; d + 32 <= hd; d += 32) {
                const __m256 x0 = hq_load8(HQ_F_F16, kr, d), x1 = hq_load8(HQ_F_F16, kr, d + 8);
                const __m256 x2 = hq_load8(HQ_F_F16, kr, d + 16), x3 = hq_load8(HQ_F_F16, kr, d + 24);
                for (int j = 0; j < 2; j++) {
                    a[j][0] = _mm256_fmadd_ps(x0, _mm256_load_ps(qf[j] + d), a[j][0]);
                    a[j][1] = _mm256_fmadd_ps(x1, _mm256_load_ps(qf[j] + d + 8), a[j][1]);
                    a[j][2] = _mm256_fmadd_ps(x2, _mm256_load_ps(qf[j] + d + 16), a[j][2]);
                    a[j][3] = _mm256_fmadd_ps(x3, _mm256_load_ps(qf[j] + d + 24), a[j][3]);
                }
            }
            for (; d + 8 <= hd; d += 8) {
                const __m256 x0 = hq_load8(HQ_F_F16, kr, d);
                for (int j = 0; j < 2; j++) a[j][0] = _mm256_fmadd_ps(x0, _mm256_load_ps(qf[j] + d), a[j][0]);
            }
            for (int j = 0; j < 2; j++)
                c[j][i % 8] = _mm256_add_ps(_mm256_add_ps(a[j][0], a[j][1]), _mm256_add_ps(a[j][2], a[j][3]));
            if (i % 8 == 7)
                for (int j = 0; j < g; j++) _mm256_storeu_ps(s + (size_t)(j0 + j) * ss + i - 7, hq_hsum8_ps(c[j]));
        }
        for (int i = n - n % 8; i < n; i++)
            for (int j = 0; j < g; j++) s[(size_t)(j0 + j) * ss + i] = hq_hsum_ps(c[j][i % 8]);
    }
}

/* the common head sizes get a body of their own, whose loops over d the compiler unrolls and whose
   chains stay in registers; with hd a variable they went through the stack.  This kernel's share
   of perf samples at one thread: Llama-3.2-1B (hd 64), decode at depth 1024, 14.8 -> 7.3%; a
   2-layer Llama-3-8B shape (hd 128), a whole bench -d 2048 -n 128 run (the fill included), 3.1 ->
   1.7% */
void hq_att_kq16_avx2(int n, int hd, int nq, const hr_fp16 *restrict q, size_t qs, const uint8_t *restrict k,
                      size_t row, float *restrict s, size_t ss) {
    if (hd > 256 || hd % 8) {
        for (int j = 0; j < nq; j++)
            for (int i = 0; i < n; i++)
                s[(size_t)j * ss + i] = hq_vec_dot_float(HQ_F_F16, hd, k + (size_t)i * row, q + (size_t)j * qs);
        return;
    }
    if (hd == 64) hq_kq16_body(n, 64, nq, q, qs, k, row, s, ss);
    else if (hd == 128) hq_kq16_body(n, 128, nq, q, qs, k, row, s, ss);
    else hq_kq16_body(n, hd, nq, q, qs, k, row, s, ss);
}

void hq_vec_dot_avx2_bf16(int n, float *restrict s, const void *restrict x, const void *restrict y) {
    *s = hq_vec_dot_float(HQ_F_BF16, n, x, y);
}

/* one weight row against C (1..4) activation rows, 16 elements a step (two chains per row) */
HQ_INLINE void hq_tile_float_1xC(int kind, int C, int n, float *s, size_t lds, const void *x, const void *y,
                                 size_t by) {
    __m256 acc0[4], acc1[4];
    const void *yc[4];
    #pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        acc0[c] = acc1[c] = _mm256_setzero_ps();
        yc[c] = (const char *)y + (size_t)c * by;
    }
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 w0 = hq_load8(kind, x, i), w1 = hq_load8(kind, x, i + 8);
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            acc0[c] = _mm256_fmadd_ps(w0, hq_load8(kind, yc[c], i), acc0[c]);
            acc1[c] = _mm256_fmadd_ps(w1, hq_load8(kind, yc[c], i + 8), acc1[c]);
        }
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 w0 = hq_load8(kind, x, i);
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++) acc0[c] = _mm256_fmadd_ps(w0, hq_load8(kind, yc[c], i), acc0[c]);
    }
    #pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        float sum = hq_hsum_ps(_mm256_add_ps(acc0[c], acc1[c]));
        for (int k = i; k < n; k++) sum += hq_load1(kind, x, k) * hq_load1(kind, yc[c], k);
        s[(size_t)c * lds] = sum;
    }
}

HQ_INLINE void hq_gemm_float(int kind, int n, float *s, size_t lds, const void *x, size_t bx, int nr,
                             const void *y, size_t by, int nc) {
    for (int j = 0; j < nc; j += 4) {
        const char *yj = (const char *)y + (size_t)j * by;
        float *sj = s + (size_t)j * lds;
        for (int i = 0; i < nr; i++) {
            const char *xi = (const char *)x + (size_t)i * bx;
            switch (nc - j) {
            case 1:  hq_tile_float_1xC(kind, 1, n, sj + i, lds, xi, yj, by); break;
            case 2:  hq_tile_float_1xC(kind, 2, n, sj + i, lds, xi, yj, by); break;
            case 3:  hq_tile_float_1xC(kind, 3, n, sj + i, lds, xi, yj, by); break;
            default: hq_tile_float_1xC(kind, 4, n, sj + i, lds, xi, yj, by); break;
            }
        }
    }
}

#define HQ_GEMM_AVX2_FLOAT(t, KIND)                                                                     \
    void hq_gemm_avx2_##t(int n, float *restrict s, size_t lds, const void *restrict x, size_t bx, int nr, \
                          const void *restrict y, size_t by, int nc) {                                 \
        hq_gemm_float(KIND, n, s, lds, x, bx, nr, y, by, nc);                                         \
    }
HQ_GEMM_AVX2_FLOAT(f32, HQ_F_F32)
HQ_GEMM_AVX2_FLOAT(f16, HQ_F_F16)
HQ_GEMM_AVX2_FLOAT(bf16, HQ_F_BF16)

/* ---- activation quantizers ------------------------------------------------------------------------ */

/* roundf() of 8 floats: half away from zero, exactly (t = trunc|v| and |v| - t are exact) */
HQ_INLINE __m256i hq_round_away(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 a = _mm256_andnot_ps(sign, v);
    const __m256 t = _mm256_round_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 up = _mm256_cmp_ps(_mm256_sub_ps(a, t), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 r = _mm256_add_ps(t, _mm256_and_ps(up, _mm256_set1_ps(1.0f)));
    return _mm256_cvttps_epi32(_mm256_or_ps(r, _mm256_and_ps(sign, v)));
}

/* one block of 32: writes d and the codes, returns sum(q) and the float d */
HQ_INLINE int hq_quantize_block_q8(const float *x, hr_fp16 *dst_d, int8_t *qs, float *d_out) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
    const __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
    const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                   _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    const float amax = hq_hmax_ps(m);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    *dst_d = (hr_fp16)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    *d_out = d;
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i q0 = hq_round_away(_mm256_mul_ps(v0, vid)), q1 = hq_round_away(_mm256_mul_ps(v1, vid));
    const __m256i q2 = hq_round_away(_mm256_mul_ps(v2, vid)), q3 = hq_round_away(_mm256_mul_ps(v3, vid));
    /* packs work per 128-bit lane: the bytes come out as dwords 0 4 1 5 2 6 3 7 of the wanted order */
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    const __m256i q = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)qs, q);
    const __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* F32 -> F16 rows (the F16 path's q and the KV cache's rows, F16 weights' activations): F16C's
   conversion rounds to nearest even and follows IEEE for overflow, infinities and subnormals, as
   hr_fp32_to_fp16 does; eight values holding a NaN go to that function, whose NaN is sign | 0x7e00
   (F16C keeps a truncated payload).  The reference's bits everywhere (test-quant). */
void hq_quantize_avx2_f16(const float *restrict x, void *restrict vy, int64_t k) {
    hr_fp16 *y = vy;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i), nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
        if (_mm256_testz_ps(nan, nan))
            _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
        else
            for (int j = 0; j < 8; j++) y[i + j] = hr_fp32_to_fp16(x[i + j]);
    }
    for (; i < k; i++) y[i] = hr_fp32_to_fp16(x[i]);
}

void hq_quantize_avx2_q8_0(const float *restrict x, void *restrict vy, int64_t k) {
    block_q8_0 *y = vy;
    const int64_t nb = k / QK8_0;
    float d;
    for (int64_t i = 0; i < nb; i++) hq_quantize_block_q8(x + i * QK8_0, &y[i].d, y[i].qs, &d);
}

void hq_quantize_avx2_q8_1(const float *restrict x, void *restrict vy, int64_t k) {
    block_q8_1 *y = vy;
    const int64_t nb = k / QK8_1;
    for (int64_t i = 0; i < nb; i++) {
        float d;
        const int sum = hq_quantize_block_q8(x + i * QK8_1, &y[i].d, y[i].qs, &d);
        y[i].s = (hr_fp16)_cvtss_sh((float)sum * d, _MM_FROUND_TO_NEAREST_INT);
    }
}
