/* model-impl: what the forward pass's files share — the context, activation forms, job structs, and
 * the element-wise helpers every step inlines.  Not part of the API (model.h).
 *
 *   forward.c    context create/free and the forward pass, step by step
 *   matmul.c     activation forms, the matmul job and decode's work scheduler, the FFN pipe
 *   attention.c  RoPE, the KV cache store, and attention's numerics
 */
#ifndef HEARTH_MODEL_IMPL_H
#define HEARTH_MODEL_IMPL_H

#include "model.h"

#include "quant/quant.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#define HM_ALIGN 64
#define HM_KV_TILE 64     /* attention positions per online-softmax step (llama.cpp's CPU flash-attention tile) */
_Static_assert(HM_KV_TILE == HM_BATCH_F32_TOKENS, "a batch's attention path: model.h says where it changes");
#define HM_ATT_NQ 4       /* heads of one token on one KV head (GQA) scored and accumulated together */
#define HM_FF_UNIT 256   /* decode: FFN activations converted for ffn_down in units of this many (hm_ff_pipe) */

/* Decode's work queue: thread i's unclaimed rows of a part, [front, back) in HM_ROW_CHUNKs, in one
   word (back << 32 | front) on a cache line of its own.  The owner claims from the front, a thread
   that has run out of rows of that part claims from the back. */
typedef struct hm_mm_span {
    _Alignas(HM_ALIGN) _Atomic uint64_t part[3];
} hm_mm_span;

/* activation forms a weight can ask for: its vec_dot_type, or, packed where its kernel reads prepared
   rows (quant.h, hq_prep_fn), that form, made from the vec_dot_type copy (hm_act_types: the weight's
   type for those) */
enum {
    HM_ACT_F32, HM_ACT_F16, HM_ACT_BF16, HM_ACT_Q8_0, HM_ACT_Q8_1, HM_ACT_Q8_K,
    HM_ACT_PREP, HM_ACT_P_Q4_0 = HM_ACT_PREP, HM_ACT_P_Q8_0, HM_ACT_P_Q4_K, HM_ACT_P_Q6_K, HM_ACT_COUNT
};

/* An activation matrix [n][dim] in F32 plus lazily made copies in each form the weights read. */
typedef struct hm_act {
    float   *f32;                   /* borrowed: [n][dim] */
    int      n, dim;
    uint8_t *q[HM_ACT_COUNT];       /* owned buffers, [n_batch][the form's row size for dim] */
    size_t   q_row[HM_ACT_COUNT];   /* row stride of the current conversion */
    bool     valid[HM_ACT_COUNT];
} hm_act;

struct hm_ctx {
    const hm_model *m;
    hm_shard shard;
    hm_ctx_params p;
    hr_pool *pool;
    bool own_pool;
    int kv_type;
    size_t kv_esize;
    int32_t n_ctx;
    int64_t max_dim;
    /* this shard's share of each layer: query heads, KV heads, their widths, FFN neurons */
    int nh, nkv;
    int64_t Dq, Dkv, F;
    int32_t nl;                     /* layers of the shard (all its windows) */
    int32_t win_slot[HM_MAX_WINDOWS]; /* slot of each window's first layer in L and the caches */
    hm_layer *L;                    /* [nl]: views of the model's tensors, window after window */
    /* KV cache of the shard's layers: K and V as [n_seq][n_kv][n_ctx][hd], each (sequence, KV head)'s
       rows in one run (hm_kv_rows) */
    uint8_t **k_cache, **v_cache;
    /* the current batch's tokens: sequence, position, and whether its attention takes the F32 path */
    int32_t *tseq, *tpos;           /* [n_batch] */
    uint8_t *tf32;                  /* [n_batch] */
    int32_t *seq_n;                 /* [n_seq]: scratch, per sequence (hm_batch_setup) */
    /* scratch, [n_batch][...] */
    float *x, *xn, *q, *k, *v, *att, *o, *gate, *up;
    float *rope_cs;                 /* [n_batch][hd/2][2] cos, sin */
    hm_act act_in;                  /* xn (dim n_embd) */
    hm_act act_att;                 /* att (dim n_head*hd) */
    hm_act act_ff;                  /* gate after silu*up (dim n_ff) */
    _Atomic uint32_t *ff_units;     /* [F / HM_FF_UNIT]: decode's gate rows done per unit (hm_ff_pipe) */
    /* per-thread attention scratch, att_scratch_stride bytes each (its layout: hm_att_worker) */
    uint8_t *att_scratch;
    size_t att_scratch_stride;
    double *dec_speed;              /* [n_threads]: weight bytes per ns each thread streamed in decode (EMA) */
    hm_mm_span *dec_span;         /* [n_threads]: decode matmul jobs' work queues (hm_mm_claim) */
    uint64_t bytes;
    hm_timings t;
};

/* byte offset in a layer's K or V cache of sequence seq's KV head h's row at position pos */
static inline size_t hm_kv_off(const hm_ctx *c, int32_t seq, int h, int32_t pos) {
    return (((size_t)seq * (size_t)c->nkv + (size_t)h) * (size_t)c->n_ctx + (size_t)pos) *
           (size_t)c->m->hp.head_dim * c->kv_esize;
}

/* scratch of the ctx, counted in hm_ctx_bytes */
static inline void *hm_ctx_alloc(hm_ctx *c, size_t bytes) {
    c->bytes += bytes;
    return hr_alloc_aligned(bytes, HM_ALIGN);
}

/* ---- element-wise ops -------------------------------------------------------------------------- */

/* four floats as one value (GCC / clang vector extension: SSE2 or NEON registers), for the
   element-wise loops the compiler does not vectorize by itself at -O2 (a count not known at compile
   time); loads and stores through memcpy, any alignment */
typedef float hm_f4 __attribute__((vector_size(16)));
static inline hm_f4 hm_ld4(const float *p) {
    hm_f4 v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void hm_st4(float *p, hm_f4 v) { memcpy(p, &v, sizeof v); }

/* x[i] += o[i] */
static inline void hm_add(float *x, const float *o, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) hm_st4(x + i, hm_ld4(x + i) + hm_ld4(o + i));
    for (; i < n; i++) x[i] += o[i];
}

/* y = x / rms(x) * w, the sum in double as ggml does */
static inline void hm_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps) {
    /* the sum of squares in double over 8 interleaved chains (one chain of adds waited ~4 cycles per
       element: ~2.5 us per 2048, 33 times a token); the double sum's order moves it by ~1e-16
       relative, far below the float scale's rounding */
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += (double)x[i + k] * x[i + k];
    double sum = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for (; i < n; i++) sum += (double)x[i] * x[i];
    const float scale = 1.0f / sqrtf((float)(sum / n) + eps);
    for (i = 0; i + 4 <= n; i += 4) hm_st4(y + i, hm_ld4(x + i) * scale * hm_ld4(w + i)); /* y may be x */
    for (; i < n; i++) y[i] = x[i] * scale * w[i];
}

/* ---- matmul.c ----------------------------------------------------------------------------------- */

/* a now holds f32 ([n][dim]); its converted copies are stale */
static inline void hm_act_set(hm_act *a, float *f32, int n, int64_t dim) {
    a->f32 = f32;
    a->n = n;
    a->dim = (int)dim;
    memset(a->valid, 0, sizeof a->valid);
}

/* what a decode's matmul job does besides its rows, each hook optional */
typedef struct hm_mm_hooks {
    void (*rows)(const void *arg, int64_t r0, int64_t r1); /* after each range of rows (of part 0) is done */
    void (*then)(const void *arg, int ith, int nth);       /* each thread, when it has no rows left */
    const void *arg;
} hm_mm_hooks;

/* allocates act's buffers for the forms the weights ws[0..nw) read (at hm_ctx_create) */
int hm_act_init(hm_ctx *c, hm_act *a, const hm_tensor *const *ws, int nw, int64_t dim);
/* outs[i][n][ws[i]->ne1] = ws[i] · a for the nw (<= 3) weights, in one parallel job; glu: ws[0] and
   ws[1] are the gate and up projections, and outs[0] becomes silu(gate) * up.  hooks: decode only. */
void hm_matmul(hm_ctx *c, hm_act *a, const hm_tensor *const *ws, float *const *outs, int nw, bool glu,
               const hm_mm_hooks *hooks);
/* rows [r0, r1) of w (r0 a multiple of 16: whole packed bands) into out[n][w->ne1]'s columns [r0, r1):
   each row's result as hm_matmul gives it */
void hm_matmul_rows(hm_ctx *c, hm_act *a, const hm_tensor *w, int64_t r0, int64_t r1, float *out);
/* gate = silu(Wg xn) * (Wu xn) from act_in (act_ff set to gate); a decode also converts gate into
   ffn_down's form as its rows come in (hm_ff_pipe) */
void hm_ff_gate_up(hm_ctx *c, const hm_layer *L, int n);

/* ---- attention.c -------------------------------------------------------------------------------- */

/* the tokens' sequences and positions are the ctx's tseq and tpos */
typedef struct hm_att_job {
    hm_ctx *c;
    int li;          /* layer index within the shard */
    int n;
} hm_att_job;
typedef struct hm_qk_job { hm_ctx *c; const hm_layer *L; int li; int n; } hm_qk_job;

/* cos/sin of the RoPE angles of the n tokens' positions (tpos), into rope_cs */
void hm_rope_cache(hm_ctx *c, int n);
/* hm_qk_job's tokens: biases, q/k norms, RoPE, and the K/V store into the cache */
void hm_qk_worker(void *arg, int ith, int nth);
/* hm_att_job's (token, head) items: att = softmax(q K^T / sqrt(hd)) V */
void hm_att_worker(void *arg, int ith, int nth);
/* a decode's QKV job's hm_mm_hooks.then: requests the cache rows the attention will read */
void hm_att_warm(const void *arg, int ith, int nth);

#endif
