/*
 * quant — tensor element types, their block layouts (bit-exact with ggml, so GGUF files are read
 * as they are), reference (de)quantizers and dot-product kernels, chosen at run time through one
 * dispatch table.  Prefix: hq_.
 *
 * Every weight type is stored in blocks of hq_blck_size(t) elements taking hq_type_size(t) bytes.
 * Blocks are the unit of everything: a row is a whole number of blocks, and a tensor sliced for
 * another device is cut at block boundaries.
 *
 * Dot products multiply a weight row (type t) with an activation row that was first converted to
 * the type's vec_dot_type (Q8_0 for the 32-element quants, Q8_1 for Q4_1/Q5_1, Q8_K for the
 * K-quants, F16 for F16, BF16 for BF16, F32 for F32) — the same scheme as llama.cpp, so the engine's
 * logits track its reference outputs.
 *
 * Kernel layers (as in ggml-cpu):
 *   *_ref      portable reference code (quants-ref.c, quants-k-ref.c): quantize, dequantize, dot
 *   generic    the scalar kernels the table uses when no SIMD version exists (= the _ref dots)
 *   arch/x86   AVX2/FMA/F16C kernels;   arch/arm   NEON kernels
 * hq_init() (called by hr_init users through hq_traits) detects CPU features once and fills the
 * table; HEARTH_NO_SIMD=1 in the environment forces the generic kernels (for tests and debugging).
 */
#ifndef HEARTH_QUANT_H
#define HEARTH_QUANT_H

#include "base/base.h"

#include <assert.h>

/* On-disk type ids: the values are ggml's (they are stored in GGUF files). Append only. */
typedef enum hq_type {
    HQ_TYPE_F32  = 0,
    HQ_TYPE_F16  = 1,
    HQ_TYPE_Q4_0 = 2,
    HQ_TYPE_Q4_1 = 3,
    HQ_TYPE_Q5_0 = 6,
    HQ_TYPE_Q5_1 = 7,
    HQ_TYPE_Q8_0 = 8,
    HQ_TYPE_Q8_1 = 9,
    HQ_TYPE_Q2_K = 10,
    HQ_TYPE_Q3_K = 11,
    HQ_TYPE_Q4_K = 12,
    HQ_TYPE_Q5_K = 13,
    HQ_TYPE_Q6_K = 14,
    HQ_TYPE_Q8_K = 15,
    HQ_TYPE_BF16 = 30,
    HQ_TYPE_COUNT = 31,
} hq_type;

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK_K 256
#define K_SCALE_SIZE 12

/* ---- block layouts (ggml-common.h's, field for field) ------------------------------------------- */
typedef struct { hr_fp16 d; uint8_t qs[QK4_0 / 2]; } block_q4_0;           /* x = d * (q - 8) */
static_assert(sizeof(block_q4_0) == 2 + QK4_0 / 2, "block_q4_0 size");
typedef struct { hr_fp16 d, m; uint8_t qs[QK4_1 / 2]; } block_q4_1;        /* x = d * q + m */
static_assert(sizeof(block_q4_1) == 4 + QK4_1 / 2, "block_q4_1 size");
typedef struct { hr_fp16 d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0;   /* x = d*(q-16) */
static_assert(sizeof(block_q5_0) == 2 + 4 + QK5_0 / 2, "block_q5_0 size");
typedef struct { hr_fp16 d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1;
static_assert(sizeof(block_q5_1) == 4 + 4 + QK5_1 / 2, "block_q5_1 size");
typedef struct { hr_fp16 d; int8_t qs[QK8_0]; } block_q8_0;                 /* x = d * q */
static_assert(sizeof(block_q8_0) == 2 + QK8_0, "block_q8_0 size");
typedef struct { hr_fp16 d, s; int8_t qs[QK8_1]; } block_q8_1;              /* s = d * sum(qs) */
static_assert(sizeof(block_q8_1) == 4 + QK8_1, "block_q8_1 size");

/* 2.625 bpw: 16 blocks of 16, 4-bit scales and mins, x = d*sc*q - dmin*m */
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; hr_fp16 d, dmin; } block_q2_K;
static_assert(sizeof(block_q2_K) == 2 * 2 + QK_K / 16 + QK_K / 4, "block_q2_K size");
/* 3.4375 bpw: 16 blocks of 16, 6-bit scales, high bit in hmask */
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; hr_fp16 d; } block_q3_K;
static_assert(sizeof(block_q3_K) == 2 + QK_K / 4 + QK_K / 8 + 12, "block_q3_K size");
/* 4.5 bpw: 8 blocks of 32, 6-bit scales and mins packed in 12 bytes */
typedef struct { hr_fp16 d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; } block_q4_K;
static_assert(sizeof(block_q4_K) == 2 * 2 + K_SCALE_SIZE + QK_K / 2, "block_q4_K size");
/* 5.5 bpw */
typedef struct { hr_fp16 d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
static_assert(sizeof(block_q5_K) == 2 * 2 + K_SCALE_SIZE + QK_K / 2 + QK_K / 8, "block_q5_K size");
/* 6.5625 bpw: 16 blocks of 16, 8-bit scales */
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; hr_fp16 d; } block_q6_K;
static_assert(sizeof(block_q6_K) == 2 + QK_K / 16 + 3 * QK_K / 4, "block_q6_K size");
/* activations for K-quant dots: float scale, sums of groups of 16 */
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;
static_assert(sizeof(block_q8_K) == 4 + QK_K + QK_K / 16 * 2, "block_q8_K size");

/* ---- traits and dispatch ------------------------------------------------------------------------- */
/* y[0..k) = dequantize(x); k is a multiple of the block size */
typedef void (*hq_to_float_fn)(const void *restrict x, float *restrict y, int64_t k);
/* y = quantize(x[0..k)); k is a multiple of the block size */
typedef void (*hq_from_float_fn)(const float *restrict x, void *restrict y, int64_t k);
/* *s = dot(x, y) over n elements; x has the weight type, y the type's vec_dot_type */
typedef void (*hq_vec_dot_fn)(int n, float *restrict s, const void *restrict x, const void *restrict y);

/* Tile of dot products for prefill (weights read once per tile, reused across activation rows):
   s[j*lds + i] = dot(x_i, y_j) for i < nr weight rows (row i at x + i*bx bytes) and j < nc
   activation rows (row j at y + j*by bytes, already in vec_dot_type). */
typedef void (*hq_gemm_fn)(int n, float *restrict s, size_t lds, const void *restrict x, size_t bx, int nr,
                           const void *restrict y, size_t by, int nc);

/* Packed layouts.  A kernel family may run a type faster from its own arrangement of the bytes: rows
   in groups of HQ_PACK_ROWS, each group's rows rearranged among themselves, and groups in bands of
   HQ_BAND rows (a matrix's last band may be shorter, whole groups), so that a band takes the same
   bytes at the same offset as in the file and a range of whole bands is still addressed as rows (row
   i at x + i*bx).  The layouts ("x4"):
   - Q4_0 (AVX2): per pair of blocks b, b+1 of the group's rows, 144 bytes: the 8 fp16 scales [rows
     0-3 at b | rows 0-3 at b+1], then each row's 32 code bytes [qs of b | qs of b+1] — what the AVX2
     kernel uses per step, read in one linear stream;
   - Q4_0 (AVX-512, "x4v"): per unit of 4 blocks of the group's rows, 288 bytes: the 16 fp16 scales
     [row r, block j] at 4r + j, then 4 vectors of 64 bytes whose 4-byte lane 4r + j holds bytes
     4i .. 4i+3 of the qs of row r's block j (vector i) — one block of one row per int32 lane of a
     vpdpbusd (quants512.c);
   - Q8_0 (AVX-512, "x4v"): as Q4_0's, 544 bytes per unit: the 16 scales, then 8 vectors of 64
     bytes, lane 4r + j of vector i holding bytes 4i .. 4i+3 of row r's block j, each code offset by
     128 (code ^ 0x80: vpdpbusd's unsigned operand; the prepared activations carry -128 * their
     sums).  Only rows x4v fits are packed (hq_x4v_fits); others stay in the file layout;
   - Q4_K and Q6_K ("x4v", AVX2 and AVX-512 alike): per super-block, the 4 rows' d (dmin) and scales
     together, then vectors of 64 bytes whose 4-byte lane 4r + s holds 4 code bytes of row r's
     sub-block s of a set of 4 — one sub-block of one row per int32 lane of a vpdpbusd (Q4_K: 8
     vectors, 4 nibble bytes each; Q6_K: 12, a 6-bit quant per byte and 2 bits of a fourth on top;
     quant.c and quants-k512.c have the byte maps).  AVX2 reads a vector as two of 32 bytes (2 rows).
     Rows longer than a panel (HQ_PANEL elements) are cut into K-panels: a band holds panel 0 of its
     groups (each group's entries for those elements in order), then panel 1, ... (the last panel
     narrower); hq_panel_at gives the offsets.  So a decode, still one linear stream, reuses
     each panel's prepared activations (<= 5.2 KiB) while they are in L1: over whole rows of 8192 the
     activations (10 KiB) and one group's weights (26 KiB, Q6_K) overflowed the 32 KiB L1 between
     two uses (docs/design.md);
   - Q5_K (AVX-512, "x4"): per super-block, the 4 rows' scales together, then each sub-block's codes
     of the 4 rows side by side, one 128-bit lane per row.
   Without panels a band is simply its groups one after another.  A type has a packed form when the
   dispatched family has its kernel (gemm_packed != NULL); hq_pack_ok says whether a tensor's shape
   allows it.  gemm_packed takes whole bands: x at a band's start, and nr rows ending at a band's end
   or at the matrix's last row (its last band the matrix's). */
enum { HQ_PACK_ROWS = 4, HQ_BAND = 16, HQ_PANEL = 4096 };
/* The byte offset, in a band of ng groups whose rows hold nu units (a layout's step along K: a
   super-block; Q4_0 and Q8_0 x4v: 4 blocks) of entries of E bytes (a unit of the group's 4 rows), in K-panels
   of pu units (HQ_PANEL elements), of group g's entry for unit u.  A panel's entries of one group are
   consecutive, so the offset for u = a panel's first unit starts a run of them. */
static inline size_t hq_panel_at(int ng, int g, int64_t nu, int64_t u, int64_t pu, size_t E) {
    const int64_t p0 = u / pu * pu, w = nu - p0 < pu ? nu - p0 : pu;
    return E * (size_t)(ng * p0 + g * w + (u - p0));
}
/* Which of Q4_0's two layouts an AVX-512 table packs a row into: x4v where the row is whole units of
   4 blocks and at most HQ_X4V_MAX_NE0 long (the decode once prepared the row on the stack; the engine
   holds it now, but longer x4v rows are untested), x4 otherwise (with the
   AVX2 kernel: a tensor-parallel slice of, say, 86 blocks keeps a packed layout).  pack, unpack and
   gemm_packed all decide by this, from the row length alone. */
enum { HQ_X4V_MAX_NE0 = 32768 };
static inline bool hq_x4v_fits(int64_t ne0) { return ne0 % 128 == 0 && ne0 <= HQ_X4V_MAX_NE0; }
/* The longest Q4_K or Q6_K row x4v packs (the decode once prepared the activation row on the stack;
   the engine holds it now, but longer x4v rows are untested).  Longer rows stay in the file layout. */
enum { HQ_KV_MAX_NE0 = 32768 };
/* dst = the packed form of the band of nrows (a multiple of HQ_PACK_ROWS, <= HQ_BAND) consecutive
   rows of ne0 elements at src (row stride bx) */
typedef void (*hq_pack_fn)(void *restrict dst, const void *restrict src, size_t bx, int64_t ne0, int nrows);
/* dst = elements [e0, e0 + ne) of row r of a packed matrix x of nrows rows of ne0 elements, in the file
   layout; e0 a multiple of HQ_UNPACK_STEP, e0 + ne a multiple of it or ne0 */
enum { HQ_UNPACK_STEP = 1024 };
static_assert(HQ_PANEL % HQ_UNPACK_STEP == 0, "a stretch to unpack lies within one K-panel");
typedef void (*hq_unpack_fn)(void *restrict dst, const void *restrict x, int64_t ne0, int64_t nrows, int64_t r,
                             int64_t e0, int64_t ne);
/* A packed kernel may read its activation rows in a form of its own ("prepared": the x4v kernels'
   quants in the order of their code vectors, with their sums): prep turns a row of n elements in
   vec_dot_type (src) into it (dst, prep_size(n) bytes).  The engine prepares each row once per
   matmul; a gemm_packed whose type has prep reads prepared rows (y, by), one without reads
   vec_dot_type rows. */
typedef void (*hq_prep_fn)(void *restrict dst, const void *restrict src, int64_t n);
typedef size_t (*hq_prep_size_fn)(int64_t n);

typedef struct hq_traits {
    const char      *name;          /* "Q4_K" */
    int64_t          blck_size;     /* elements per block */
    size_t           type_size;     /* bytes per block */
    bool             is_quantized;
    hq_to_float_fn   to_float;      /* dequantize (reference; fine for bulk conversion) */
    hq_from_float_fn from_float_ref;/* reference quantizer (used by `hearth quantize`) */
    hq_from_float_fn from_float;    /* fast quantizer for activations (SIMD where available) */
    hq_type          vec_dot_type;  /* activation type for vec_dot */
    hq_vec_dot_fn    vec_dot;       /* dispatched kernel */
    hq_vec_dot_fn    vec_dot_ref;   /* portable reference kernel (tests compare against it) */
    hq_gemm_fn       gemm;          /* tile kernel; a generic loop over vec_dot where no SIMD one exists */
    hq_gemm_fn       gemm_packed;   /* the tile kernel over packed rows (whole bands, see above); NULL:
                                       the type is never packed */
    hq_pack_fn       pack;          /* set with gemm_packed */
    hq_unpack_fn     unpack;
    hq_prep_fn       prep;          /* NULL: gemm_packed reads vec_dot_type rows as they are */
    hq_prep_size_fn  prep_size;
} hq_traits;

/* Whether a tensor of `type` with rows of ne0 elements and nrows rows can be packed for the
   dispatched kernels (the type has gemm_packed, whole groups of rows, whole pairs of blocks for Q4_0,
   rows of at most HQ_KV_MAX_NE0 for Q4_K and Q6_K, rows x4v fits for Q8_0). */
bool hq_pack_ok(int type, int64_t ne0, int64_t nrows);

/* ---- attention kernels (the F32 path of flash attention, src/model) ------------------------------ */
/* s_j[i] = sum over d < hd of q_j[d] * k_i[d] for j < nq queries (q_j at q + j*qs floats, s_j at
   s + j*ss floats) and i < n positions, k_i = the row at k + i*row bytes (F16 if f16, else F32).
   Each sum runs over d = 0, 1, ... in order with the product and the sum rounded separately (no
   fused multiply-add), so the AVX2 kernel (8 positions per register, each 8x8 tile of K transposed
   once for up to 4 queries: the heads of a GQA group) gives the generic one's bits. */
typedef void (*hq_att_kq_fn)(int n, int hd, int nq, const float *restrict q, size_t qs, const uint8_t *restrict k,
                             size_t row, bool f16, float *restrict s, size_t ss);
/* acc_j[d] = acc_j[d] + p_j[i] * v_i[d] for i = 0, 1, ..., n-1 in order, product and sum rounded
   separately, for j < nq (p_j at p + j*ps, acc_j at acc + j*as floats); each V row is read once for
   all nq. */
typedef void (*hq_att_kv_fn)(int n, int hd, int nq, const float *restrict p, size_t ps, const uint8_t *restrict v,
                             size_t row, bool f16, float *restrict acc, size_t as);
/* The F16 path (llama.cpp's per-row kernel) over n positions of a tile, for nq heads (j < nq: the
   accumulator at acc + j*as, factors at m + j*ps and p + j*ps), in order, every step rounded to F16
   to nearest even: for i < n, if m_j[i] != 1 then acc_j[d] = f16(f32(acc_j[d]) * m_j[i]) (the online
   softmax's rescale: with m = 1 it would change nothing); then
   acc_j[d] = f16(f32(v_i[d]) * p_j[i] + f32(acc_j[d])), product and sum rounded separately, v_i the F16
   row at v + i*row, read once for all nq heads (a NaN's payload may differ between kernels). */
typedef void (*hq_att_acc16_fn)(int n, int hd, int nq, hr_fp16 *restrict acc, size_t as, const uint8_t *restrict v,
                                size_t row, const float *restrict m, const float *restrict p, size_t ps);
/* The F16 path's scores: s_j[i] = the F16 type's dispatched vec_dot of k_i (the F16 row at k + i*row)
   with q_j (F16, at q + j*qs), for i < n and j < nq: each K row read and widened once for all nq
   heads, each sum the vec_dot's bit for bit. */
typedef void (*hq_att_kq16_fn)(int n, int hd, int nq, const hr_fp16 *restrict q, size_t qs,
                               const uint8_t *restrict k, size_t row, float *restrict s, size_t ss);
/* The online softmax's exponential: y[i] = hq_expf(x[i]) for i < n, bit for bit (x == y allowed). */
typedef void (*hq_att_exp_fn)(int n, const float *x, float *y);
typedef struct hq_att_kernels {
    hq_att_kq_fn kq;
    hq_att_kv_fn kv;
    hq_att_acc16_fn acc16;
    hq_att_kq16_fn kq16;
    hq_att_exp_fn exp;
} hq_att_kernels;
/* e^x as glibc's expf computes it where the CPU has FMA (x86-64 glibc picks that build of it; llama.cpp's
   flash attention calls expf): for |x| < 88 its algorithm step for step — x/ln2 split into k/32 + r,
   2^(k/32) from a 32-entry table, a cubic in r, all in double, the same four fused multiply-adds, one
   rounding to float — and for the rest (|x| >= 88, NaN) the C library's expf itself.  On such a
   machine it equals expf for every float (checked for all 2^32 once, and on a sample by test-quant);
   elsewhere it is still one fixed function (< 1 ulp), which the SIMD kernels reproduce exactly. */
float hq_expf(float x);
extern const uint64_t hq_exp_tab[32]; /* hq_expf's table and constants, for its SIMD forms (quant.c) */
extern const double hq_exp_c[5];
/* The dispatched attention kernels (SIMD where the CPU has it); `generic` the portable ones. */
const hq_att_kernels *hq_get_att(bool generic);

/* ---- the FFN's gate (SwiGLU) --------------------------------------------------------------------- */
/* g[i] = silu(g[i]) * u[i] = g[i] / (1 + exp(-g[i])) * u[i] for i < n.  The generic kernel calls expf;
   the AVX2 one evaluates exp with its own polynomial (within 2 ulp of expf's; llama.cpp's CPU silu
   is vectorized the same way), so the two differ in the last bits. */
typedef void (*hq_silu_mul_fn)(int64_t n, float *restrict g, const float *restrict u);
hq_silu_mul_fn hq_get_silu_mul(bool generic);

/* The table entry for a type, or NULL if the type is not supported. Thread-safe after first call. */
const hq_traits *hq_get_traits(int type);
const char *hq_type_name(int type);          /* "Q4_K", or "unknown" */
int         hq_type_from_name(const char *); /* case-insensitive; -1 if unknown */
bool        hq_type_valid(int type);         /* supported as a weight type */
/* bytes of a row of ne0 elements; 0 if ne0 is not a multiple of the block size or type unknown */
size_t      hq_row_size(int type, int64_t ne0);
/* Which kernel family the table picked: "avx512" (AVX2 with AVX-512 kernels for some types), "avx2",
   "neon" or "generic".  HEARTH_NO_SIMD=1 in the environment picks the generic kernels,
   HEARTH_NO_AVX512=1 stops at AVX2. */
const char *hq_simd_name(void);

/* ---- kernels each implementation file provides (the table in quant.c refers to them) ------------- */
/* reference quantize/dequantize (quants-ref.c, quants-k-ref.c) */
#define HQ_DECLARE_REF(t)                                                                   \
    void hq_quantize_ref_##t(const float *restrict x, void *restrict y, int64_t k);         \
    void hq_dequantize_ref_##t(const void *restrict x, float *restrict y, int64_t k);       \
    void hq_vec_dot_ref_##t(int n, float *restrict s, const void *restrict x, const void *restrict y);
HQ_DECLARE_REF(f32) HQ_DECLARE_REF(f16) HQ_DECLARE_REF(bf16)
HQ_DECLARE_REF(q4_0) HQ_DECLARE_REF(q4_1) HQ_DECLARE_REF(q5_0) HQ_DECLARE_REF(q5_1)
HQ_DECLARE_REF(q8_0) HQ_DECLARE_REF(q8_1)
HQ_DECLARE_REF(q2_K) HQ_DECLARE_REF(q3_K) HQ_DECLARE_REF(q4_K) HQ_DECLARE_REF(q5_K)
HQ_DECLARE_REF(q6_K) HQ_DECLARE_REF(q8_K)
/* (hq_vec_dot_ref_q8_1 / _q8_K are activation-only types: their dot is not used; they exist for
   symmetry and may simply be dot-with-self-type) */

/* SIMD kernels (files in arch/x86 with -mavx2 -mfma -mf16c; in arch/arm with NEON). Each arch file
   defines the functions it has; quant.c references them only under HEARTH_ARCH_X86/ARM. */
#define HQ_DECLARE_SIMD(arch, t) \
    void hq_vec_dot_##arch##_##t(int n, float *restrict s, const void *restrict x, const void *restrict y);
/* optional tile kernels: hq_gemm_<arch>_<type> (see hq_gemm_fn) */
#define HQ_DECLARE_GEMM(arch, t)                                                                 \
    void hq_gemm_##arch##_##t(int n, float *restrict s, size_t lds, const void *restrict x, size_t bx, \
                              int nr, const void *restrict y, size_t by, int nc);
#define HQ_DECLARE_PACKED(arch, t)                                                                  \
    void hq_gemm_packed_##arch##_##t(int n, float *restrict s, size_t lds, const void *restrict x, size_t bx, \
                                     int nr, const void *restrict y, size_t by, int nc);                       \
    void hq_prep_##arch##_##t(void *restrict dst, const void *restrict src, int64_t n);                       \
    size_t hq_prep_size_##arch##_##t(int64_t n);
#define HQ_DECLARE_SIMD_ALL(arch)                                                        \
    HQ_DECLARE_SIMD(arch, f32) HQ_DECLARE_SIMD(arch, f16) HQ_DECLARE_SIMD(arch, bf16)    \
    HQ_DECLARE_SIMD(arch, q4_0) HQ_DECLARE_SIMD(arch, q4_1) HQ_DECLARE_SIMD(arch, q5_0)  \
    HQ_DECLARE_SIMD(arch, q5_1) HQ_DECLARE_SIMD(arch, q8_0)                              \
    HQ_DECLARE_SIMD(arch, q2_K) HQ_DECLARE_SIMD(arch, q3_K) HQ_DECLARE_SIMD(arch, q4_K)  \
    HQ_DECLARE_SIMD(arch, q5_K) HQ_DECLARE_SIMD(arch, q6_K)                              \
    HQ_DECLARE_GEMM(arch, q4_0) HQ_DECLARE_GEMM(arch, q8_0) HQ_DECLARE_GEMM(arch, q4_K)    \
    HQ_DECLARE_GEMM(arch, q5_K) HQ_DECLARE_GEMM(arch, q6_K) HQ_DECLARE_GEMM(arch, q4_1)    \
    HQ_DECLARE_GEMM(arch, q5_0) HQ_DECLARE_GEMM(arch, q5_1) HQ_DECLARE_GEMM(arch, q2_K)    \
    HQ_DECLARE_GEMM(arch, q3_K) HQ_DECLARE_GEMM(arch, f16) HQ_DECLARE_GEMM(arch, f32)      \
    HQ_DECLARE_GEMM(arch, bf16)                                                            \
    HQ_DECLARE_PACKED(arch, q4_0) HQ_DECLARE_PACKED(arch, q4_K) HQ_DECLARE_PACKED(arch, q5_K)    \
    HQ_DECLARE_PACKED(arch, q6_K) HQ_DECLARE_PACKED(arch, q8_0)                            \
    void hq_quantize_##arch##_f16(const float *restrict x, void *restrict y, int64_t k);  \
    void hq_quantize_##arch##_q8_0(const float *restrict x, void *restrict y, int64_t k); \
    void hq_quantize_##arch##_q8_1(const float *restrict x, void *restrict y, int64_t k); \
    void hq_quantize_##arch##_q8_K(const float *restrict x, void *restrict y, int64_t k);
HQ_DECLARE_SIMD_ALL(avx2)
HQ_DECLARE_SIMD_ALL(avx512) /* arch/x86/quants-k512.c: the types it has override the avx2 entries */
HQ_DECLARE_SIMD_ALL(neon)

#endif
