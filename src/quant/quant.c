/* quant: the dispatch table, the generic attention kernels and the packed layouts */
#include "quant/quant-impl.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <strings.h>

/* Kernels are referenced weakly: a kernel a family does not define is NULL here and the table
   keeps the portable one.  tests/test-quant checks that on a CPU with AVX2 every type does get its
   SIMD kernel, so a misnamed kernel cannot hide behind the fallback. */
#define HQ_WEAK __attribute__((weak))
#define HQ_WEAK_KERNELS(T, t, ...) HQ_TYPE_KERNELS(HQ_WEAK, t)
HQ_TYPES(HQ_WEAK_KERNELS)
HQ_ATT_FAMILIES(HQ_WEAK)

/* ---- attention, generic: the order and roundings hq_att_kq_fn / hq_att_kv_fn define ---- */
static inline float hq_kv_elem(const uint8_t *row, int d, bool f16) {
    return f16 ? hr_fp16_to_fp32(((const hr_fp16 *)row)[d]) : ((const float *)row)[d];
}

/* volatile products keep a compiler that may contract a*b+c into one fused operation from doing so */
static void hq_att_kq_generic(int n, int hd, int nq, const float *restrict q, size_t qs, const uint8_t *restrict k,
                              size_t row, bool f16, float *restrict s, size_t ss) {
    for (int j = 0; j < nq; j++)
        for (int i = 0; i < n; i++) {
            const uint8_t *kr = k + (size_t)i * row;
            const float *qj = q + (size_t)j * qs;
            float sum = 0.0f;
            for (int d = 0; d < hd; d++) {
                volatile float pr = qj[d] * hq_kv_elem(kr, d, f16);
                sum += pr;
            }
            s[(size_t)j * ss + i] = sum;
        }
}
static void hq_att_kv_generic(int n, int hd, int nq, const float *restrict p, size_t ps, const uint8_t *restrict v,
                              size_t row, bool f16, float *restrict acc, size_t as) {
    for (int j = 0; j < nq; j++)
        for (int i = 0; i < n; i++) {
            const uint8_t *vr = v + (size_t)i * row;
            for (int d = 0; d < hd; d++) {
                volatile float pr = p[(size_t)j * ps + i] * hq_kv_elem(vr, d, f16);
                acc[(size_t)j * as + d] += pr;
            }
        }
}

static void hq_att_acc16_generic(int n, int hd, int nq, hr_fp16 *restrict acc, size_t as, const uint8_t *restrict v,
                                 size_t row, const float *restrict m, const float *restrict p, size_t ps) {
    for (int j = 0; j < nq; j++) {
        hr_fp16 *a = acc + (size_t)j * as;
        const float *mj = m + (size_t)j * ps, *pj = p + (size_t)j * ps;
        for (int i = 0; i < n; i++) {
            const hr_fp16 *vi = (const hr_fp16 *)(v + (size_t)i * row);
            if (mj[i] != 1.0f)
                for (int d = 0; d < hd; d++) a[d] = hr_fp32_to_fp16(hr_fp16_to_fp32(a[d]) * mj[i]);
            for (int d = 0; d < hd; d++) {
                volatile float pr = hr_fp16_to_fp32(vi[d]) * pj[i];
                a[d] = hr_fp32_to_fp16(pr + hr_fp16_to_fp32(a[d]));
            }
        }
    }
}
/* hq_expf's data: tab[i] = the bits of 2^(i/32) rounded to double, less i << 47 (so that adding k << 47
   for k = i mod 32 puts k/32's integer part in the exponent); the cubic's coefficients for r = x*32/ln2
   - k in [-1/2, 1/2] (those of glibc, the minimax fit of 2^(r/32)); shift = 1.5 * 2^52 rounds to an
   integer in the low bits of a double */
const uint64_t hq_exp_tab[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};
const double hq_exp_c[5] = {
    0x1.c6af84b912394p-5 / 32 / 32 / 32, 0x1.ebfce50fac4f3p-3 / 32 / 32, 0x1.62e42ff0c52d6p-1 / 32, /* cubic */
    0x1.71547652b82fep+0 * 32, /* 32 / ln 2 */
    0x1.8p+52,                 /* shift */
};

float hq_expf(float x) {
    if (!(fabsf(x) < 88.0f)) return expf(x); /* overflow, underflow to subnormals, inf, NaN */
    const double xd = x, kd = fma(hq_exp_c[3], xd, hq_exp_c[4]);
    uint64_t ki;
    memcpy(&ki, &kd, sizeof ki);
    const double k = kd - hq_exp_c[4], r = fma(hq_exp_c[3], xd, -k);
    const uint64_t t = hq_exp_tab[ki % 32] + (ki << 47);
    double s;
    memcpy(&s, &t, sizeof s);
    const double z = fma(hq_exp_c[0], r, hq_exp_c[1]), r2 = r * r, y = fma(z, r2, fma(hq_exp_c[2], r, 1.0));
    return (float)(y * s);
}

static void hq_att_exp_generic(int n, const float *x, float *y) {
    for (int i = 0; i < n; i++) y[i] = hq_expf(x[i]);
}

static hq_traits hq_table[HQ_TYPE_COUNT]; /* its entries are defined below */
/* one vec_dot call per score: the definition the SIMD kernels reproduce */
static void hq_att_kq16_generic(int n, int hd, int nq, const hr_fp16 *restrict q, size_t qs, const uint8_t *restrict k,
                                size_t row, float *restrict s, size_t ss) {
    for (int j = 0; j < nq; j++)
        for (int i = 0; i < n; i++)
            hq_table[HQ_TYPE_F16].vec_dot(hd, &s[(size_t)j * ss + i], k + (size_t)i * row, q + (size_t)j * qs);
}
static void hq_silu_mul_generic(int64_t n, float *restrict g, const float *restrict u) {
    for (int64_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}
static hq_silu_mul_fn hq_silu_mul = hq_silu_mul_generic;
static hq_att_kernels hq_att = {hq_att_kq_generic, hq_att_kv_generic, hq_att_acc16_generic, hq_att_kq16_generic,
                                hq_att_exp_generic};
static const hq_att_kernels hq_att_generic = {hq_att_kq_generic, hq_att_kv_generic, hq_att_acc16_generic,
                                              hq_att_kq16_generic, hq_att_exp_generic};

/* The generic tile: one vec_dot per (row, column). Each type's entry gets its own instance so the
   indirect call goes to that type's dispatched vec_dot. */
static void hq_gemm_loop(hq_vec_dot_fn dot, int n, float *restrict s, size_t lds, const void *restrict x,
                         size_t bx, int nr, const void *restrict y, size_t by, int nc) {
    for (int j = 0; j < nc; j++)
        for (int i = 0; i < nr; i++)
            dot(n, &s[(size_t)j * lds + i], (const char *)x + (size_t)i * bx, (const char *)y + (size_t)j * by);
}
#define HQ_GEMM_GENERIC(T, ...)                                                                          \
    static void hq_gemm_generic_##T(int n, float *restrict s, size_t lds, const void *restrict x,      \
                                    size_t bx, int nr, const void *restrict y, size_t by, int nc) {     \
        hq_gemm_loop(hq_table[HQ_TYPE_##T].vec_dot, n, s, lds, x, bx, nr, y, by, nc);                    \
    }
HQ_TYPES(HQ_GEMM_GENERIC)
static const char *hq_simd = "generic";

/* the band holding row r of a packed matrix of nrows rows of bx bytes: its start, and its number of
   groups */
static const uint8_t *hq_band_of(const void *x, int64_t nrows, int64_t r, size_t bx, int *ng) {
    const int64_t b0 = r / HQ_BAND * HQ_BAND;
    *ng = (int)((nrows - b0 < HQ_BAND ? nrows - b0 : HQ_BAND) / HQ_PACK_ROWS);
    return (const uint8_t *)x + (size_t)b0 * bx;
}

/* A band of a layout without K-panels (docs/quant.md) is its groups one after another: pack and unpack
   (hq_pack_fn, hq_unpack_fn) over the layout's functions for one group (_grp), whose rows take
   blocks of BS bytes per BLK elements. */
#define HQ_GROUPS_BAND(t, L, BLK, BS)                                                                        \
    static void hq_pack_##t##_##L(void *restrict dst, const void *restrict src, size_t bx, int64_t ne0, int nrows) { \
        for (int g = 0; g < nrows / HQ_PACK_ROWS; g++)                                                       \
            hq_pack_##t##_##L##_grp((uint8_t *)dst + (size_t)g * HQ_PACK_ROWS * bx,                         \
                                   (const uint8_t *)src + (size_t)g * HQ_PACK_ROWS * bx, bx, ne0);           \
    }                                                                                                        \
    static void hq_unpack_##t##_##L(void *restrict dst, const void *restrict x, int64_t ne0, int64_t nrows,  \
                                    int64_t r, int64_t e0, int64_t ne) {                                     \
        (void)nrows;                                                                                         \
        const size_t bx = (size_t)(ne0 / (BLK)) * (BS);                                                      \
        hq_unpack_##t##_##L##_grp(dst, (const uint8_t *)x + (size_t)(r / HQ_PACK_ROWS) * HQ_PACK_ROWS * bx,  \
                                  (int)(r % HQ_PACK_ROWS), ne0, e0, ne);                                     \
    }

/* ---- Q4_0 x4 (docs/quant.md): entry k of a group = scales of blocks 2k, 2k+1 of rows 0-3, then each row's
   codes of the two blocks ---- */
enum { HQ_X4_ENTRY = 8 * sizeof(block_q4_0) };
static void hq_pack_q4_0_x4_grp(void *restrict dst, const void *restrict src, size_t bx, int64_t ne0) {
    uint8_t *d = dst;
    for (int64_t k = 0; k < ne0 / (2 * QK4_0); k++, d += HQ_X4_ENTRY)
        for (int i = 0; i < HQ_PACK_ROWS; i++) {
            const block_q4_0 *b = (const block_q4_0 *)((const uint8_t *)src + (size_t)i * bx) + 2 * k;
            memcpy(d + 2 * i, &b[0].d, 2);
            memcpy(d + 8 + 2 * i, &b[1].d, 2);
            memcpy(d + 16 + 32 * i, b[0].qs, 16);
            memcpy(d + 32 + 32 * i, b[1].qs, 16);
        }
}
static void hq_unpack_q4_0_x4_grp(void *restrict dst, const void *restrict group, int i, int64_t ne0, int64_t e0, int64_t ne) {
    (void)ne0;
    block_q4_0 *b = dst;
    for (int64_t k = e0 / (2 * QK4_0); k < (e0 + ne) / (2 * QK4_0); k++, b += 2) {
        const uint8_t *e = (const uint8_t *)group + k * HQ_X4_ENTRY;
        memcpy(&b[0].d, e + 2 * i, 2);
        memcpy(&b[1].d, e + 8 + 2 * i, 2);
        memcpy(b[0].qs, e + 16 + 32 * i, 16);
        memcpy(b[1].qs, e + 32 + 32 * i, 16);
    }
}
HQ_GROUPS_BAND(q4_0, x4, QK4_0, sizeof(block_q4_0))

#if defined(HEARTH_ARCH_X86)
/* ---- x4v of the 32-element kinds (docs/quant.md, AVX-512): unit u of a group = blocks 4u .. 4u+3 of rows
   0-3: the scale of row r's block j at fp16 4r + j, then vector i (64 bytes) with bytes 4i .. 4i+3 of
   that block's qs at 16r + 4j (Q4_0: 4 vectors; Q8_0: 8, each code offset by 128, code ^ 0x80, the
   unsigned operand of vpdpbusd); a band's groups in K-panels (hq_panel_at).  Both kinds' blocks are
   the scale, then nq bytes of qs. ---- */
enum { HQ_X4V_PU = HQ_PANEL / 128 }; /* units (4 blocks of 32) per K-panel (docs/quant.md) */
static_assert(offsetof(block_q4_0, qs) == 2 && offsetof(block_q8_0, qs) == 2, "x4v blocks: d, then qs");
static void hq_pack_x4v(void *restrict dst, const void *restrict src, size_t bx, int64_t ne0, int nrows, int nq) {
    const int64_t nu = ne0 / 128;
    const int ng = nrows / HQ_PACK_ROWS;
    const size_t bs = 2 + (size_t)nq, E = 16 * bs;
    const uint8_t flip = nq == QK8_0 ? 0x80 : 0;
    for (int g = 0; g < ng; g++)
        for (int64_t u = 0; u < nu; u++) {
            uint8_t *d = (uint8_t *)dst + hq_panel_at(ng, g, nu, u, HQ_X4V_PU, E);
            for (int r = 0; r < HQ_PACK_ROWS; r++)
                for (int j = 0; j < 4; j++) {
                    const uint8_t *b = (const uint8_t *)src + (size_t)(HQ_PACK_ROWS * g + r) * bx + (size_t)(4 * u + j) * bs;
                    memcpy(d + 2 * (4 * r + j), b, 2);
                    for (int k = 0; k < nq; k++) d[32 + 64 * (k / 4) + 16 * r + 4 * j + k % 4] = b[2 + k] ^ flip;
                }
        }
}
static void hq_unpack_x4v(void *restrict dst, const void *restrict x, int64_t ne0, int64_t nrows, int64_t r0,
                          int64_t e0, int64_t ne, int nq) {
    const int64_t nu = ne0 / 128;
    const size_t bs = 2 + (size_t)nq, E = 16 * bs;
    const uint8_t flip = nq == QK8_0 ? 0x80 : 0;
    int ng;
    const uint8_t *band = hq_band_of(x, nrows, r0, (size_t)(ne0 / 32) * bs, &ng);
    const int g = (int)(r0 % HQ_BAND / HQ_PACK_ROWS), r = (int)(r0 % HQ_PACK_ROWS);
    uint8_t *b = dst;
    for (int64_t u = e0 / 128; u < (e0 + ne) / 128; u++) {
        const uint8_t *d = band + hq_panel_at(ng, g, nu, u, HQ_X4V_PU, E);
        for (int j = 0; j < 4; j++, b += bs) {
            memcpy(b, d + 2 * (4 * r + j), 2);
            for (int k = 0; k < nq; k++) b[2 + k] = d[32 + 64 * (k / 4) + 16 * r + 4 * j + k % 4] ^ flip;
        }
    }
}
/* Q4_0: x4v where it fits the row (hq_x4v_fits), x4 otherwise */
static void hq_pack_q4_0_x4v(void *restrict dst, const void *restrict src, size_t bx, int64_t ne0, int nrows) {
    if (!hq_x4v_fits(ne0)) {
        hq_pack_q4_0_x4(dst, src, bx, ne0, nrows);
        return;
    }
    hq_pack_x4v(dst, src, bx, ne0, nrows, QK4_0 / 2);
}
static void hq_unpack_q4_0_x4v(void *restrict dst, const void *restrict x, int64_t ne0, int64_t nrows, int64_t r0,
                               int64_t e0, int64_t ne) {
    if (!hq_x4v_fits(ne0)) {
        hq_unpack_q4_0_x4(dst, x, ne0, nrows, r0, e0, ne);
        return;
    }
    hq_unpack_x4v(dst, x, ne0, nrows, r0, e0, ne, QK4_0 / 2);
}
/* Q8_0: x4v only (hq_pack_ok packs no other row) */
static void hq_pack_q8_0_x4(void *restrict dst, const void *restrict src, size_t bx, int64_t ne0, int nrows) {
    hq_pack_x4v(dst, src, bx, ne0, nrows, QK8_0);
}
static void hq_unpack_q8_0_x4(void *restrict dst, const void *restrict x, int64_t ne0, int64_t nrows, int64_t r0,
                              int64_t e0, int64_t ne) {
    hq_unpack_x4v(dst, x, ne0, nrows, r0, e0, ne, QK8_0);
}
#endif

/* ---- Q4_K x4 and x4v (docs/quant.md): entry b of a group = d, dmin of rows 0-3, their scale fields, then
   the codes: per sub-block s 16 bytes of each row, byte k holding quants k and k + 16 of s (the file
   pairs quant k of sub-blocks 2j and 2j + 1 in qs[32j + k]).  x4 (Q5_K's low bits) puts row r's 16 at
   64 + 64s + 16r; x4v (Q4_K) cuts them into 4-byte pieces, piece i in vector 4(s / 4) + i at lane
   4r + s % 4. ---- */
enum { HQ_K4_ENTRY = HQ_PACK_ROWS * sizeof(block_q4_K) };
static int hq_k4_pos(bool v, int s, int r, int k) {
    return v ? 64 + 64 * (4 * (s / 4) + k / 4) + 16 * r + 4 * (s % 4) + k % 4 : 64 + 64 * s + 16 * r + k;
}
/* row r's block x into entry d (whose other rows' bytes are left as they are) */
static void hq_pack_q4_K_row(uint8_t *d, const block_q4_K *x, int r, bool v) {
    memcpy(d + 4 * r, &x->d, 2);
    memcpy(d + 4 * r + 2, &x->dmin, 2);
    memcpy(d + 16 + K_SCALE_SIZE * r, x->scales, K_SCALE_SIZE);
    for (int s = 0; s < QK_K / 32; s++)
        for (int k = 0; k < 16; k++) {
            const int sh = 4 * (s & 1), j = 32 * (s / 2);
            const int lo = (x->qs[j + k] >> sh) & 15, hi = (x->qs[j + k + 16] >> sh) & 15;
            d[hq_k4_pos(v, s, r, k)] = (uint8_t)(lo | hi << 4);
        }
}
static void hq_unpack_q4_K_row(block_q4_K *x, const uint8_t *e, int r, bool v) {
    memcpy(&x->d, e + 4 * r, 2);
    memcpy(&x->dmin, e + 4 * r + 2, 2);
    memcpy(x->scales, e + 16 + K_SCALE_SIZE * r, K_SCALE_SIZE);
    memset(x->qs, 0, sizeof x->qs);
    for (int s = 0; s < QK_K / 32; s++)
        for (int k = 0; k < 16; k++) {
            const int sh = 4 * (s & 1), j = 32 * (s / 2), c = e[hq_k4_pos(v, s, r, k)];
            x->qs[j + k] |= (uint8_t)((c & 15) << sh);
            x->qs[j + k + 16] |= (uint8_t)((c >> 4) << sh);
        }
}
/* x4v's bands hold K-panels (docs/quant.md, hq_panel_at) */
static void hq_pack_q4_K_x4(void *restrict dst, const void *restrict src, size_t bx, int64_t ne0, int nrows) {
    const int64_t nb = ne0 / QK_K;
    const int ng = nrows / HQ_PACK_ROWS;
    for (int g = 0; g < ng; g++)
        for (int64_t b = 0; b < nb; b++)
            for (int r = 0; r < HQ_PACK_ROWS; r++)
                hq_pack_q4_K_row((uint8_t *)dst + hq_panel_at(ng, g, nb, b, HQ_PANEL / QK_K, HQ_K4_ENTRY),
                                 (const block_q4_K *)((const uint8_t *)src + (size_t)(HQ_PACK_ROWS * g + r) * bx) + b, r, true);
}
static void hq_unpack_q4_K_x4(void *restrict dst, const void *restrict x, int64_t ne0, int64_t nrows, int64_t r,
                              int64_t e0, int64_t ne) {
    const int64_t nb = ne0 / QK_K;
    int ng;
    const uint8_t *band = hq_band_of(x, nrows, r, (size_t)nb * sizeof(block_q4_K), &ng);
    block_q4_K *o = dst;
    for (int64_t b = e0 / QK_K; b < (e0 + ne) / QK_K; b++, o++)
        hq_unpack_q4_K_row(o, band + hq_panel_at(ng, (int)(r % HQ_BAND / HQ_PACK_ROWS), nb, b, HQ_PANEL / QK_K, HQ_K4_ENTRY),
                           (int)(r % HQ_PACK_ROWS), true);
}

/* ---- Q5_K x4 (docs/quant.md): Q4_K's entry for the low four bits (the block's fields up to qs match), then
   the fifth bits: two 64-byte vectors (sub-blocks 0-3, 4-7), 16 bytes per row, bits 2j and 2j + 1 of
   byte k holding those of quants k and k + 16 of sub-block 4v + j.  In the file the fifth bit of
   quant l of sub-block s is bit s of qh[l]. ---- */
enum { HQ_K5_ENTRY = HQ_PACK_ROWS * sizeof(block_q5_K) };
static void hq_pack_q5_K_x4_grp(void *restrict dst, const void *restrict src, size_t bx, int64_t ne0) {
    uint8_t *d = dst;
    for (int64_t b = 0; b < ne0 / QK_K; b++, d += HQ_K5_ENTRY) {
        memset(d + HQ_K4_ENTRY, 0, HQ_K5_ENTRY - HQ_K4_ENTRY);
        for (int r = 0; r < HQ_PACK_ROWS; r++) {
            const block_q5_K *x = (const block_q5_K *)((const uint8_t *)src + (size_t)r * bx) + b;
            block_q4_K low;
            memcpy(&low.d, &x->d, 2), memcpy(&low.dmin, &x->dmin, 2);
            memcpy(low.scales, x->scales, K_SCALE_SIZE), memcpy(low.qs, x->qs, sizeof low.qs);
            hq_pack_q4_K_row(d, &low, r, false);
            for (int s = 0; s < QK_K / 32; s++)
                for (int k = 0; k < 16; k++) {
                    const int j = s % 4, b0 = x->qh[k] >> s & 1, b1 = x->qh[k + 16] >> s & 1;
                    d[HQ_K4_ENTRY + 64 * (s / 4) + 16 * r + k] |= (uint8_t)(b0 << (2 * j) | b1 << (2 * j + 1));
                }
        }
    }
}
static void hq_unpack_q5_K_x4_grp(void *restrict dst, const void *restrict group, int r, int64_t ne0, int64_t e0, int64_t ne) {
    (void)ne0;
    block_q5_K *x = dst;
    for (int64_t b = e0 / QK_K; b < (e0 + ne) / QK_K; b++, x++) {
        const uint8_t *e = (const uint8_t *)group + b * HQ_K5_ENTRY;
        block_q4_K low;
        hq_unpack_q4_K_row(&low, e, r, false);
        memcpy(&x->d, &low.d, 2), memcpy(&x->dmin, &low.dmin, 2);
        memcpy(x->scales, low.scales, K_SCALE_SIZE), memcpy(x->qs, low.qs, sizeof x->qs);
        memset(x->qh, 0, sizeof x->qh);
        for (int s = 0; s < QK_K / 32; s++)
            for (int k = 0; k < 16; k++) {
                const int j = s % 4, v = e[HQ_K4_ENTRY + 64 * (s / 4) + 16 * r + k];
                x->qh[k] |= (uint8_t)((v >> (2 * j) & 1) << s);
                x->qh[k + 16] |= (uint8_t)((v >> (2 * j + 1) & 1) << s);
            }
    }
}
HQ_GROUPS_BAND(q5_K, x4, QK_K, sizeof(block_q5_K))

/* ---- Q6_K x4v (docs/quant.md): entry b of a group = the rows' scales (64 bytes: byte 16L + 4r + s = row r's
   scale of sub-block hq_q6v_sub(L, s)), their d (8 bytes: row r at 64 + 2r), then the codes: lane set
   L (sub-blocks hq_q6v_sub(L, s), s < 4) takes 3 vectors at 72 + 192L, lane 4r + s of each = 4 bytes
   of row r's sub-block: byte t of vector w holds quant 4w + t in its low 6 bits and 2 bits of quant
   12 + t in its top 2 (bits 2w, 2w + 1 of it).  In the file, quant e = 128h + 32p + l takes the
   nibble 4(p >> 1) of ql[64h + 32(p & 1) + l] and bits 2p of qh[32h + l]. ---- */
enum { HQ_K6_ENTRY = HQ_PACK_ROWS * sizeof(block_q6_K), HQ_K6_TAIL = 72 };
static int hq_q6_get(const block_q6_K *x, int e) {
    const int h = e / 128, p = e % 128 / 32, l = e % 32;
    return (x->ql[64 * h + 32 * (p & 1) + l] >> (4 * (p >> 1)) & 15) | (x->qh[32 * h + l] >> (2 * p) & 3) << 4;
}
static void hq_q6_set(block_q6_K *x, int e, int v) { /* into zeroed ql, qh */
    const int h = e / 128, p = e % 128 / 32, l = e % 32;
    x->ql[64 * h + 32 * (p & 1) + l] |= (uint8_t)((v & 15) << (4 * (p >> 1)));
    x->qh[32 * h + l] |= (uint8_t)((v >> 4) << (2 * p));
}
static int hq_q6v_sub(int L, int s) { return 8 * (L / 2) + 2 * s + L % 2; }
static void hq_pack_q6_K_x4(void *restrict dst, const void *restrict src, size_t bx, int64_t ne0, int nrows) {
    const int64_t nb = ne0 / QK_K;
    const int ng = nrows / HQ_PACK_ROWS;
    memset(dst, 0, (size_t)nrows * (size_t)nb * sizeof(block_q6_K));
    for (int g = 0; g < ng; g++)
        for (int64_t b = 0; b < nb; b++)
            for (int r = 0; r < HQ_PACK_ROWS; r++) {
                const block_q6_K *x = (const block_q6_K *)((const uint8_t *)src + (size_t)(HQ_PACK_ROWS * g + r) * bx) + b;
                uint8_t *tail = (uint8_t *)dst + hq_panel_at(ng, g, nb, b, HQ_PANEL / QK_K, HQ_K6_ENTRY), *code = tail + HQ_K6_TAIL;
                memcpy(tail + 64 + 2 * r, &x->d, 2);
                for (int L = 0; L < 4; L++)
                    for (int k = 0; k < 4; k++) {
                        const int sb = hq_q6v_sub(L, k);
                        tail[16 * L + 4 * r + k] = (uint8_t)x->scales[sb];
                        for (int t = 0; t < 4; t++) {
                            const int top = hq_q6_get(x, 16 * sb + 12 + t);
                            for (int w = 0; w < 3; w++)
                                code[192 * L + 64 * w + 16 * r + 4 * k + t] =
                                    (uint8_t)(hq_q6_get(x, 16 * sb + 4 * w + t) | (top >> (2 * w) & 3) << 6);
                        }
                    }
            }
}
static void hq_unpack_q6_K_x4(void *restrict dst, const void *restrict x0, int64_t ne0, int64_t nrows, int64_t r0,
                              int64_t e0, int64_t ne) {
    const int64_t nb = ne0 / QK_K;
    int ng;
    const uint8_t *band = hq_band_of(x0, nrows, r0, (size_t)nb * sizeof(block_q6_K), &ng);
    const int g = (int)(r0 % HQ_BAND / HQ_PACK_ROWS), r = (int)(r0 % HQ_PACK_ROWS);
    block_q6_K *x = dst;
    for (int64_t b = e0 / QK_K; b < (e0 + ne) / QK_K; b++, x++) {
        const uint8_t *tail = band + hq_panel_at(ng, g, nb, b, HQ_PANEL / QK_K, HQ_K6_ENTRY), *code = tail + HQ_K6_TAIL;
        memcpy(&x->d, tail + 64 + 2 * r, 2);
        memset(x->ql, 0, sizeof x->ql);
        memset(x->qh, 0, sizeof x->qh);
        for (int L = 0; L < 4; L++)
            for (int k = 0; k < 4; k++) {
                const int sb = hq_q6v_sub(L, k);
                x->scales[sb] = (int8_t)tail[16 * L + 4 * r + k];
                for (int t = 0; t < 4; t++) {
                    int top = 0;
                    for (int w = 0; w < 3; w++) {
                        const int c = code[192 * L + 64 * w + 16 * r + 4 * k + t];
                        hq_q6_set(x, 16 * sb + 4 * w + t, c & 63);
                        top |= (c >> 6) << (2 * w);
                    }
                    hq_q6_set(x, 16 * sb + 12 + t, top);
                }
            }
    }
}

/* The packed layout of each type that has one (docs/quant.md): what a family's gemm_packed for the
   type reads.  Q4_0's AVX-512 kernel reads x4v instead, where it fits (hq_init_once). */
static const struct {
    hq_pack_fn pack;
    hq_unpack_fn unpack;
} hq_layout[HQ_TYPE_COUNT] = {
    [HQ_TYPE_Q4_0] = {hq_pack_q4_0_x4, hq_unpack_q4_0_x4},
#if defined(HEARTH_ARCH_X86)
    [HQ_TYPE_Q8_0] = {hq_pack_q8_0_x4, hq_unpack_q8_0_x4},
#endif
    [HQ_TYPE_Q4_K] = {hq_pack_q4_K_x4, hq_unpack_q4_K_x4},
    [HQ_TYPE_Q5_K] = {hq_pack_q5_K_x4, hq_unpack_q5_K_x4},
    [HQ_TYPE_Q6_K] = {hq_pack_q6_K_x4, hq_unpack_q6_K_x4},
};

/* a role's traits (HQ_TYPES) */
#define HQ_QUANTIZED_FLOAT false
#define HQ_QUANTIZED_QUANT true
#define HQ_QUANTIZED_ACT   true
#define HQ_WEIGHT_FLOAT    true
#define HQ_WEIGHT_QUANT    true
#define HQ_WEIGHT_ACT      false

/* Each type's entry with its portable kernels; hq_init_once puts in the SIMD ones. */
#define HQ_ENTRY(T, t, id, blk, bytes, vdt, role)                                                      \
    [HQ_TYPE_##T] = {.name = #T, .blck_size = blk, .type_size = bytes, .is_quantized = HQ_QUANTIZED_##role, \
                     .to_float = hq_dequantize_ref_##t, .from_float_ref = hq_quantize_ref_##t,         \
                     .from_float = hq_quantize_ref_##t, .vec_dot_type = HQ_TYPE_##vdt,                 \
                     .vec_dot = hq_vec_dot_ref_##t, .vec_dot_ref = hq_vec_dot_ref_##t,                 \
                     .gemm = hq_gemm_generic_##T},
static hq_traits hq_table[HQ_TYPE_COUNT] = {HQ_TYPES(HQ_ENTRY)}; /* an id out of order would not fit */
#define HQ_WEIGHT(T, t, id, blk, bytes, vdt, role) [HQ_TYPE_##T] = HQ_WEIGHT_##role,
static const bool hq_weight[HQ_TYPE_COUNT] = {HQ_TYPES(HQ_WEIGHT)};

/* Family `arch`'s kernels for type T, where it has them; a packed kernel comes with the type's
   layout and the kernel's activation form (prep NULL where the family has none). */
#define HQ_USE(arch, T, t)                                                                           \
    {                                                                                                \
        hq_traits *e = &hq_table[HQ_TYPE_##T];                                                       \
        if (hq_vec_dot_##arch##_##t) e->vec_dot = hq_vec_dot_##arch##_##t;                           \
        if (hq_quantize_##arch##_##t) e->from_float = hq_quantize_##arch##_##t;                      \
        if (hq_gemm_##arch##_##t) e->gemm = hq_gemm_##arch##_##t;                                    \
        if (hq_gemm_packed_##arch##_##t && hq_layout[HQ_TYPE_##T].pack) {                            \
            e->gemm_packed = hq_gemm_packed_##arch##_##t;                                            \
            e->pack = hq_layout[HQ_TYPE_##T].pack, e->unpack = hq_layout[HQ_TYPE_##T].unpack;        \
            e->prep = hq_prep_size_##arch##_##t ? hq_prep_##arch##_##t : NULL;                       \
            e->prep_size = hq_prep_##arch##_##t ? hq_prep_size_##arch##_##t : NULL;                  \
        }                                                                                            \
    }
#define HQ_USE_AVX2(T, t, ...) HQ_USE(avx2, T, t)
#define HQ_USE_AVX512(T, t, ...) HQ_USE(avx512, T, t)
#define HQ_USE_NEON(T, t, ...) HQ_USE(neon, T, t)

/* an environment switch: set to anything but "" or "0" */
static bool hq_env_set(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

static void hq_init_once(void) {
    hr_init();
    if (hq_env_set("HEARTH_NO_SIMD")) return;
#if defined(HEARTH_ARCH_X86)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        HQ_TYPES(HQ_USE_AVX2)
        if (hq_att_kq_avx2 && hq_att_kv_avx2 && hq_att_acc16_avx2 && hq_att_kq16_avx2 && hq_att_exp_avx2)
            hq_att = (hq_att_kernels){hq_att_kq_avx2, hq_att_kv_avx2, hq_att_acc16_avx2, hq_att_kq16_avx2,
                                      hq_att_exp_avx2};
        if (hq_silu_mul_avx2) hq_silu_mul = hq_silu_mul_avx2;
        hq_simd = "avx2";
        if (!hq_env_set("HEARTH_NO_AVX512") && __builtin_cpu_supports("avx512f") &&
            __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni") && hq_vec_dot_avx512_q4_K) {
            HQ_TYPES(HQ_USE_AVX512)
            if (hq_gemm_packed_avx512_q4_0) { /* Q4_0's AVX-512 kernel reads x4v, or x4 (hq_x4v_fits) */
                hq_traits *t = &hq_table[HQ_TYPE_Q4_0];
                t->pack = hq_pack_q4_0_x4v, t->unpack = hq_unpack_q4_0_x4v;
            }
            if (hq_att_acc16_avx512 && hq_att.acc16 == hq_att_acc16_avx2) hq_att.acc16 = hq_att_acc16_avx512;
            if (hq_att_kq_avx512 && hq_att.kq == hq_att_kq_avx2) hq_att.kq = hq_att_kq_avx512;
            hq_simd = "avx512";
        }
    }
#elif defined(HEARTH_ARCH_ARM)
    HQ_TYPES(HQ_USE_NEON) /* NEON is mandatory on AArch64 */
    if (hq_att_kq_neon && hq_att_kv_neon && hq_att_acc16_neon)
        hq_att = (hq_att_kernels){hq_att_kq_neon, hq_att_kv_neon, hq_att_acc16_neon, hq_att_kq16_generic,
                                  hq_att_exp_generic};
    hq_simd = "neon";
#endif
}

static pthread_once_t hq_once = PTHREAD_ONCE_INIT;

const hq_traits *hq_get_traits(int type) {
    pthread_once(&hq_once, hq_init_once);
    if (type < 0 || type >= HQ_TYPE_COUNT) return NULL;
    const hq_traits *t = &hq_table[type];
    if (!t->name || !t->to_float || !t->vec_dot) return NULL;
    return t;
}

hq_silu_mul_fn hq_get_silu_mul(bool generic) {
    pthread_once(&hq_once, hq_init_once);
    return generic ? hq_silu_mul_generic : hq_silu_mul;
}
const hq_att_kernels *hq_get_att(bool generic) {
    pthread_once(&hq_once, hq_init_once);
    return generic ? &hq_att_generic : &hq_att;
}

const char *hq_simd_name(void) {
    pthread_once(&hq_once, hq_init_once);
    return hq_simd;
}

bool hq_type_valid(int type) {
    return hq_get_traits(type) != NULL && hq_weight[type];
}

/* the names are set before hq_init_once runs and never change, so this needs no initialisation */
const char *hq_type_name(int type) {
    if (type < 0 || type >= HQ_TYPE_COUNT || !hq_table[type].name) return "unknown";
    return hq_table[type].name;
}

int hq_type_from_name(const char *s) {
    for (int t = 0; t < HQ_TYPE_COUNT; t++)
        if (strcmp(hq_type_name(t), "unknown") != 0 && !strcasecmp(hq_type_name(t), s)) return t;
    return -1;
}

bool hq_pack_ok(int type, int64_t ne0, int64_t nrows) {
    const hq_traits *t = hq_get_traits(type);
    if (!t || !t->gemm_packed) return false;
    const int64_t unit = type == HQ_TYPE_Q4_0 ? 2 * t->blck_size : t->blck_size; /* Q4_0: pairs of blocks */
    if ((type == HQ_TYPE_Q4_K || type == HQ_TYPE_Q6_K) && ne0 > HQ_KV_MAX_NE0) return false;
    if (type == HQ_TYPE_Q8_0 && !hq_x4v_fits(ne0)) return false; /* x4v only */
    return ne0 > 0 && ne0 % unit == 0 && nrows > 0 && nrows % HQ_PACK_ROWS == 0;
}

size_t hq_row_size(int type, int64_t ne0) {
    const hq_traits *t = hq_get_traits(type);
    if (!t || ne0 < 0 || ne0 % t->blck_size) return 0;
    return (size_t)(ne0 / t->blck_size) * t->type_size;
}
