/*
 * quant — tensor element types and their kernels.  Prefix: hq_.
 *
 * The types are ggml's (F32, F16, BF16, the 32-element quants, the K-quants), block for block, so
 * GGUF data is used as it is.  HQ_TYPES is their one list: the enum, the names, the sizes and the
 * dispatch table are made from it.  hq_get_traits(type) gives a type's entry: block size, bytes per
 * block, (de)quantizers, and the dot-product and tile kernels picked for this CPU (AVX2, AVX-512 or
 * NEON where present, portable code otherwise).  The module also holds the forward pass's attention
 * and FFN-gate kernels.
 *
 * A row is a whole number of blocks, and a tensor sliced for another device is cut at block
 * boundaries.  A kernel family may keep a weight tensor in a packed layout of its own, in bands of
 * HQ_BAND rows.  docs/quant.md describes the kernel layers, the activation type of each dot product
 * and the packed layouts; the kernels' prototypes are in quant-impl.h.
 */
#ifndef HEARTH_QUANT_H
#define HEARTH_QUANT_H

#include "base/base.h"

#include <assert.h>

/* ---- the types --------------------------------------------------------------------------------- */
/* X(NAME, name, id, elements per block, bytes per block, vec_dot_type, role), one line per type.
   NAME: the GGUF name ("Q4_K") and the enum's suffix; name: the suffix of the type's kernels
   (hq_vec_dot_ref_q4_K); id: ggml's value, stored in GGUF files (new types go at the end, with a
   higher id); vec_dot_type: the type activations are converted to for dot products with this one;
   role: FLOAT (a weight type, not quantized), QUANT (a quantized weight type) or ACT (quantized,
   for activations only). */
#define HQ_TYPES(X)                                              \
    X(F32,  f32,   0, 1,     4,                  F32,  FLOAT)    \
    X(F16,  f16,   1, 1,     2,                  F16,  FLOAT)    \
    X(Q4_0, q4_0,  2, QK4_0, sizeof(block_q4_0), Q8_0, QUANT)    \
    X(Q4_1, q4_1,  3, QK4_1, sizeof(block_q4_1), Q8_1, QUANT)    \
    X(Q5_0, q5_0,  6, QK5_0, sizeof(block_q5_0), Q8_0, QUANT)    \
    X(Q5_1, q5_1,  7, QK5_1, sizeof(block_q5_1), Q8_1, QUANT)    \
    X(Q8_0, q8_0,  8, QK8_0, sizeof(block_q8_0), Q8_0, QUANT)    \
    X(Q8_1, q8_1,  9, QK8_1, sizeof(block_q8_1), Q8_1, ACT)      \
    X(Q2_K, q2_K, 10, QK_K,  sizeof(block_q2_K), Q8_K, QUANT)    \
    X(Q3_K, q3_K, 11, QK_K,  sizeof(block_q3_K), Q8_K, QUANT)    \
    X(Q4_K, q4_K, 12, QK_K,  sizeof(block_q4_K), Q8_K, QUANT)    \
    X(Q5_K, q5_K, 13, QK_K,  sizeof(block_q5_K), Q8_K, QUANT)    \
    X(Q6_K, q6_K, 14, QK_K,  sizeof(block_q6_K), Q8_K, QUANT)    \
    X(Q8_K, q8_K, 15, QK_K,  sizeof(block_q8_K), Q8_K, ACT)      \
    X(BF16, bf16, 30, 1,     2,                  BF16, FLOAT)

/* HQ_TYPE_F32 = 0, ...: the ids of HQ_TYPES; ids in between are types this module does not have */
typedef enum hq_type {
#define HQ_TYPE_ENUM(T, t, id, ...) HQ_TYPE_##T = id,
    HQ_TYPES(HQ_TYPE_ENUM)
#undef HQ_TYPE_ENUM
    HQ_TYPE_COUNT /* one past the last id: the list's ids increase */
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

/* Packed layouts (docs/quant.md): a packed matrix is cut into bands of HQ_BAND rows (the last may be
   shorter), each taking the bytes it takes in the file at the same offset, so whole bands are still
   addressed as rows (row i at x + i*bx). */
enum { HQ_BAND = 16 };
/* The longest row Q4_0's and Q8_0's AVX-512 layout ("x4v") takes: rows of whole 4-block units up
   to this length (longer ones are untested).  Q4_0 keeps the AVX2 layout for other rows; Q8_0 is
   not packed then. */
enum { HQ_X4V_MAX_NE0 = 32768 };
static inline bool hq_x4v_fits(int64_t ne0) { return ne0 % 128 == 0 && ne0 <= HQ_X4V_MAX_NE0; }
/* The longest Q4_K or Q6_K row the packed layout takes (longer ones are untested); longer rows
   stay in the file layout. */
enum { HQ_KV_MAX_NE0 = 32768 };
/* dst = the packed form of the band of nrows (a multiple of 4, <= HQ_BAND) consecutive rows of ne0
   elements at src (row stride bx) */
typedef void (*hq_pack_fn)(void *restrict dst, const void *restrict src, size_t bx, int64_t ne0, int nrows);
/* dst = elements [e0, e0 + ne) of row r of a packed matrix x of nrows rows of ne0 elements, in the file
   layout; e0 a multiple of HQ_UNPACK_STEP, e0 + ne a multiple of it or ne0 */
enum { HQ_UNPACK_STEP = 1024 };
typedef void (*hq_unpack_fn)(void *restrict dst, const void *restrict x, int64_t ne0, int64_t nrows, int64_t r,
                             int64_t e0, int64_t ne);
/* A packed kernel may read its activation rows in a form of its own ("prepared"): prep turns a row
   of n elements in vec_dot_type (src) into it (dst, prep_size(n) bytes).  The engine prepares each
   row once per matmul; a gemm_packed whose type has prep reads prepared rows (y, by), one without
   reads vec_dot_type rows. */
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
    hq_gemm_fn       gemm_packed;   /* the tile kernel over packed rows; NULL: the type is never packed.
                                       x at a band's start, nr rows ending at a band's end or at the
                                       matrix's last row */
    hq_pack_fn       pack;          /* set with gemm_packed */
    hq_unpack_fn     unpack;
    hq_prep_fn       prep;          /* NULL: gemm_packed reads vec_dot_type rows as they are */
    hq_prep_size_fn  prep_size;
} hq_traits;

/* Whether a tensor of `type` with rows of ne0 elements and nrows rows can be packed for the
   dispatched kernels (the type has gemm_packed, whole groups of rows, whole pairs of blocks for Q4_0,
   rows of at most HQ_KV_MAX_NE0 for Q4_K and Q6_K, rows x4v fits for Q8_0). */
bool hq_pack_ok(int type, int64_t ne0, int64_t nrows);

/* ---- attention kernels (the F32 and F16 paths of flash attention, src/model) ------------------------ */
/* s_j[i] = sum over d < hd of q_j[d] * k_i[d] for j < nq queries (q_j at q + j*qs floats, s_j at
   s + j*ss floats) and i < n positions, k_i = the row at k + i*row bytes (F16 if f16, else F32).
   Each sum runs over d = 0, 1, ... in order with the product and the sum rounded separately (no
   fused multiply-add), so every kernel gives the generic one's bits. */
typedef void (*hq_att_kq_fn)(int n, int hd, int nq, const float *restrict q, size_t qs, const uint8_t *restrict k,
                             size_t row, bool f16, float *restrict s, size_t ss);
/* acc_j[d] = acc_j[d] + p_j[i] * v_i[d] for i = 0, 1, ..., n-1 in order, product and sum rounded
   separately, for j < nq (p_j at p + j*ps, acc_j at acc + j*as floats); each V row is read once for
   all nq. */
typedef void (*hq_att_kv_fn)(int n, int hd, int nq, const float *restrict p, size_t ps, const uint8_t *restrict v,
                             size_t row, bool f16, float *restrict acc, size_t as);
/* The F16 path's accumulation (llama.cpp's), for nq heads (acc_j at acc + j*as, factors at m + j*ps
   and p + j*ps), every step rounded to F16 to nearest even, over i < n in order: if m_j[i] != 1,
   acc_j[d] = f16(f32(acc_j[d]) * m_j[i]); then acc_j[d] = f16(f32(v_i[d]) * p_j[i] + f32(acc_j[d])),
   product and sum rounded separately, v_i the F16 row at v + i*row (a NaN's payload may differ
   between kernels). */
typedef void (*hq_att_acc16_fn)(int n, int hd, int nq, hr_fp16 *restrict acc, size_t as, const uint8_t *restrict v,
                                size_t row, const float *restrict m, const float *restrict p, size_t ps);
/* The F16 path's scores: s_j[i] = the F16 type's dispatched vec_dot of k_i (the F16 row at k + i*row)
   with q_j (F16, at q + j*qs), for i < n and j < nq, bit for bit. */
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
/* e^x: the algorithm of x86-64 glibc's expf (its FMA build, which llama.cpp's flash attention calls),
   so equal to that expf for every float; elsewhere still one fixed function (< 1 ulp) that the SIMD
   kernels reproduce exactly (docs/quant.md). */
float hq_expf(float x);
/* The dispatched attention kernels (SIMD where the CPU has it); `generic` the portable ones. */
const hq_att_kernels *hq_get_att(bool generic);

/* ---- the FFN's gate (SwiGLU) --------------------------------------------------------------------- */
/* g[i] = silu(g[i]) * u[i] = g[i] / (1 + exp(-g[i])) * u[i] for i < n.  The generic kernel calls expf;
   the AVX2 one evaluates exp with its own polynomial (within 2 ulp of expf's, as llama.cpp's CPU silu
   is vectorized), so the two differ in the last bits. */
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

#endif
