/* quant, internal: what the dispatch table (quant.c), the reference kernels (quants-ref.c,
 * quants-k-ref.c) and the SIMD kernels (arch/) share — the packed layouts' geometry, hq_expf's
 * table, and the prototypes of every kernel a type may have.  docs/quant.md explains the layouts
 * and the kernel layers. */
#ifndef HEARTH_QUANT_IMPL_H
#define HEARTH_QUANT_IMPL_H

#include "quant/quant.h"

/* Packed layouts: rows in groups of HQ_PACK_ROWS rearranged among themselves, groups in bands of
   HQ_BAND rows, and rows longer than HQ_PANEL elements cut into K-panels within a band (the x4v
   layouts). */
enum { HQ_PACK_ROWS = 4, HQ_PANEL = 4096 };
static_assert(HQ_BAND % HQ_PACK_ROWS == 0, "a band is whole groups");
static_assert(HQ_PANEL % HQ_UNPACK_STEP == 0, "a stretch to unpack lies within one K-panel");
/* The byte offset, in a band of ng groups whose rows hold nu units (a layout's step along K: a
   super-block; Q4_0 and Q8_0 x4v: 4 blocks) of entries of E bytes (a unit of the group's 4 rows), in
   K-panels of pu units (HQ_PANEL elements), of group g's entry for unit u.  A panel's entries of one
   group are consecutive, so the offset for u = a panel's first unit starts a run of them. */
static inline size_t hq_panel_at(int ng, int g, int64_t nu, int64_t u, int64_t pu, size_t E) {
    const int64_t p0 = u / pu * pu, w = nu - p0 < pu ? nu - p0 : pu;
    return E * (size_t)(ng * p0 + g * w + (u - p0));
}

/* hq_expf's table and constants, for its SIMD forms (defined in quant.c) */
extern const uint64_t hq_exp_tab[32];
extern const double hq_exp_c[5];

/* ---- kernel prototypes --------------------------------------------------------------------------- */
/* A is empty here; quant.c passes the weak attribute, so that a kernel a family does not define is
   NULL there and the table keeps the portable one. */

/* the reference kernels of type t (quants-ref.c, quants-k-ref.c) */
#define HQ_REF_KERNELS(A, t)                                                                 \
    A void hq_quantize_ref_##t(const float *restrict x, void *restrict y, int64_t k);        \
    A void hq_dequantize_ref_##t(const void *restrict x, float *restrict y, int64_t k);      \
    A void hq_vec_dot_ref_##t(int n, float *restrict s, const void *restrict x, const void *restrict y);

/* the kernels family `arch` may have for type t (arch/x86: avx2, avx512; arch/arm: neon): a dot
   product, an activation quantizer, a tile, and a tile over the packed layout with its activation form
   (hq_gemm_fn, hq_prep_fn) */
#define HQ_ARCH_KERNELS(A, arch, t)                                                                              \
    A void hq_vec_dot_##arch##_##t(int n, float *restrict s, const void *restrict x, const void *restrict y);  \
    A void hq_quantize_##arch##_##t(const float *restrict x, void *restrict y, int64_t k);                      \
    A void hq_gemm_##arch##_##t(int n, float *restrict s, size_t lds, const void *restrict x, size_t bx, int nr, \
                                const void *restrict y, size_t by, int nc);                                     \
    A void hq_gemm_packed_##arch##_##t(int n, float *restrict s, size_t lds, const void *restrict x, size_t bx, \
                                       int nr, const void *restrict y, size_t by, int nc);                      \
    A void hq_prep_##arch##_##t(void *restrict dst, const void *restrict src, int64_t n);                       \
    A size_t hq_prep_size_##arch##_##t(int64_t n);

/* every kernel of type t, in every family */
#define HQ_TYPE_KERNELS(A, t) \
    HQ_REF_KERNELS(A, t) HQ_ARCH_KERNELS(A, avx2, t) HQ_ARCH_KERNELS(A, avx512, t) HQ_ARCH_KERNELS(A, neon, t)

/* the attention and FFN-gate kernels family `arch` may have (hq_att_kernels, hq_silu_mul_fn) */
#define HQ_ATT_KERNELS(A, arch)                                                                                 \
    A void hq_att_kq_##arch(int n, int hd, int nq, const float *restrict q, size_t qs, const uint8_t *restrict k, \
                            size_t row, bool f16, float *restrict s, size_t ss);                                 \
    A void hq_att_kv_##arch(int n, int hd, int nq, const float *restrict p, size_t ps, const uint8_t *restrict v, \
                            size_t row, bool f16, float *restrict acc, size_t as);                               \
    A void hq_att_acc16_##arch(int n, int hd, int nq, hr_fp16 *restrict acc, size_t as, const uint8_t *restrict v, \
                               size_t row, const float *restrict m, const float *restrict p, size_t ps);          \
    A void hq_att_kq16_##arch(int n, int hd, int nq, const hr_fp16 *restrict q, size_t qs,                        \
                              const uint8_t *restrict k, size_t row, float *restrict s, size_t ss);               \
    A void hq_att_exp_##arch(int n, const float *x, float *y);                                                    \
    A void hq_silu_mul_##arch(int64_t n, float *restrict g, const float *restrict u);
#define HQ_ATT_FAMILIES(A) HQ_ATT_KERNELS(A, avx2) HQ_ATT_KERNELS(A, avx512) HQ_ATT_KERNELS(A, neon)

#define HQ_DECLARE_KERNELS(T, t, ...) HQ_TYPE_KERNELS(, t)
HQ_TYPES(HQ_DECLARE_KERNELS)
#undef HQ_DECLARE_KERNELS
HQ_ATT_FAMILIES()

#endif
