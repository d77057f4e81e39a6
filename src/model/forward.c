/* forward: the transformer forward pass over a shard, KV cache, scratch — see model.h
 *
 * Data flow for n tokens (one hm_eval call), per layer:
 *   xn = rmsnorm(x) * attn_norm            -> quantized once per activation type the weights need
 *   q, k, v = Wq xn, Wk xn, Wv xn (+ bias)  one parallel job for the three (matvec or GEMM tiles)
 *   q, k = per-head rmsnorm (qwen3); RoPE; k, v -> KV cache (K rows, V transposed)
 *   a = softmax(q K^T / sqrt(hd)) V          per (token, head), causal, one pass (online softmax)
 *   o = Wo a;  sync(o);  x += o
 *   xn = rmsnorm(x) * ffn_norm;  h = silu(Wg xn) * (Wu xn);  d = Wd h;  sync(d);  x += d
 * then (last shard) logits = Wout rmsnorm(x) * output_norm.
 * The numerics follow ggml's CPU backend where it matters for comparing logits: RMS sums and softmax
 * sums in double, RoPE angles by repeated float multiplication, activations quantized to the weight
 * type's vec_dot_type; attention numerics as llama.cpp's CPU flash attention (see hm_att_worker).
 */
#include "model.h"

#include "quant/quant.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#define HM_ALIGN 64
#define HM_ROW_CHUNK 16   /* rows per work unit: a multiple of every tile kernel's row step, whole bands */
#define HM_MAX_SPLIT 64   /* decode splits rows by measured speed up to this many threads (evenly above) */
static_assert(HM_ROW_CHUNK % HQ_BAND == 0, "a work unit of a packed weight is whole bands (quant.h)");
#define HM_KV_TILE 64     /* attention positions per online-softmax step (llama.cpp's CPU flash-attention tile) */
#define HM_ATT_NQ 4       /* heads of one token on one KV head (GQA) scored and accumulated together */
#define HM_FF_UNIT 256   /* decode: FFN activations converted for ffn_down in units of this many (hm_ff_pipe) */
#define HM_ATT_PF_POS 256 /* decode: cache rows per KV head a thread requests ahead of its heads (hm_att_warm) */

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
static const int hm_act_types[HM_ACT_COUNT] = {HQ_TYPE_F32,  HQ_TYPE_F16,  HQ_TYPE_BF16, HQ_TYPE_Q8_0, HQ_TYPE_Q8_1,
                                               HQ_TYPE_Q8_K, HQ_TYPE_Q4_0, HQ_TYPE_Q8_0, HQ_TYPE_Q4_K, HQ_TYPE_Q6_K};
static int hm_act_index(int type) {
    for (int i = 0; i < HM_ACT_PREP; i++)
        if (hm_act_types[i] == type) return i;
    return -1;
}
/* the prepared form for weights of `type` when packed (-1: none, its packed kernel reads vec_dot_type) */
static int hm_act_prep_index(int type) {
    if (!hq_get_traits(type)->prep) return -1;
    for (int i = HM_ACT_PREP; i < HM_ACT_COUNT; i++)
        if (hm_act_types[i] == type) return i;
    return -1;
}
/* the form weight w reads */
static int hm_act_for(const hm_tensor *w) {
    const int p = w->packed ? hm_act_prep_index(w->type) : -1;
    return p >= 0 ? p : hm_act_index(hq_get_traits(w->type)->vec_dot_type);
}

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
    /* KV cache of the shard's layers: K and V as [n_kv][n_ctx][hd], each KV head's rows in one run */
    uint8_t **k_cache, **v_cache;
    /* scratch, [n_batch][...] */
    float *x, *xn, *q, *k, *v, *att, *o, *gate, *up;
    float *rope_cs;                 /* [n_batch][hd/2][2] cos, sin */
    hm_act act_in;                  /* xn (dim n_embd) */
    hm_act act_att;                 /* att (dim n_head*hd) */
    hm_act act_ff;                  /* gate after silu*up (dim n_ff) */
    _Atomic uint32_t *ff_units;     /* [F / HM_FF_UNIT]: decode's gate rows done per unit (hm_ff_pipe) */
    /* per-thread attention scratch: scores [n_ctx] f32, probs [n_ctx] kv type, q [hd] kv type */
    uint8_t *att_scratch;
    size_t att_scratch_stride;
    double *dec_speed;              /* [n_threads]: weight bytes per ns each thread streamed in decode (EMA) */
    hm_mm_span *dec_span;         /* [n_threads]: decode matmul jobs' work queues (hm_mm_claim) */
    uint64_t bytes;
    hm_timings t;
};

hm_ctx_params hm_ctx_default_params(void) {
    hm_ctx_params p = {.n_ctx = 0, .n_batch = 512, .n_threads = 0, .kv_type = HQ_TYPE_F16, .pool = NULL};
    return p;
}

static int32_t hm_resolve_n_ctx(const hm_hparams *hp, int32_t n_ctx) {
    if (n_ctx > 0) return n_ctx;
    return HR_MIN(hp->n_ctx_train, 4096);
}

static size_t hm_kv_layer_bytes(const hm_hparams *hp, int32_t n_ctx, int kv_type) {
    size_t es = kv_type == HQ_TYPE_F32 ? 4 : 2;
    return (size_t)n_ctx * (size_t)hp->n_head_kv * (size_t)hp->head_dim * es;
}

/* rows [r0, r1) of a weight: a contiguous view */
static hm_tensor hm_rows_view(const hm_tensor *t, int64_t r0, int64_t r1) {
    hm_tensor v = *t;
    if (!t->data) return v;
    HR_ASSERT(!t->packed || (r0 % HQ_BAND == 0 && (r1 % HQ_BAND == 0 || r1 == t->ne1))); /* whole bands */
    v.map = (const uint8_t *)t->map + (size_t)r0 * t->row_bytes;
    v.data = (const uint8_t *)t->data + (size_t)r0 * t->row_bytes;
    v.ne1 = r1 - r0;
    return v;
}
/* columns [c0, c1) of every row (block-aligned, checked by hm_shard_validate): a strided view whose
   row_bytes stays the full row's stride */
static hm_tensor hm_cols_view(const hm_tensor *t, int64_t c0, int64_t c1) {
    hm_tensor v = *t;
    const hq_traits *tr = hq_get_traits(t->type);
    HR_ASSERT(!t->packed || (c0 == 0 && c1 == t->ne0));
    v.data = (const uint8_t *)t->data + (size_t)(c0 / tr->blck_size) * tr->type_size;
    v.map = (const uint8_t *)t->map + (size_t)(c0 / tr->blck_size) * tr->type_size;
    v.ne0 = c1 - c0;
    return v;
}
/* elements [e0, e1) of an F32 vector (biases) */
static hm_tensor hm_vec_view(const hm_tensor *t, int64_t e0, int64_t e1) {
    hm_tensor v = *t;
    if (!t->data) return v;
    v.data = (const float *)t->data + e0;
    v.map = (const float *)t->map + e0;
    v.ne0 = e1 - e0;
    return v;
}

static void hm_layer_view(hm_layer *d, const hm_layer *L, const hm_shard *s, int64_t unit, int64_t hd) {
    *d = *L;
    int64_t q0 = s->kv_begin * unit, q1 = s->kv_end * unit;    /* query rows */
    int64_t k0 = s->kv_begin * hd, k1 = s->kv_end * hd;        /* key/value rows */
    d->wq = hm_rows_view(&L->wq, q0, q1);
    d->wk = hm_rows_view(&L->wk, k0, k1);
    d->wv = hm_rows_view(&L->wv, k0, k1);
    d->bq = hm_vec_view(&L->bq, q0, q1);
    d->bk = hm_vec_view(&L->bk, k0, k1);
    d->bv = hm_vec_view(&L->bv, k0, k1);
    d->wo = hm_cols_view(&L->wo, q0, q1);
    d->w_gate = hm_rows_view(&L->w_gate, s->ff_begin, s->ff_end);
    d->w_up = hm_rows_view(&L->w_up, s->ff_begin, s->ff_end);
    d->w_down = hm_cols_view(&L->w_down, s->ff_begin, s->ff_end);
}

static int64_t hm_max_dim(const hm_hparams *hp) {
    int64_t d = hp->n_embd;
    d = HR_MAX(d, (int64_t)hp->n_ff);
    d = HR_MAX(d, (int64_t)hp->n_head * hp->head_dim);
    return d;
}

static uint64_t hm_ctx_bytes_need(const hm_hparams *hp, int64_t n_layers, int64_t n_kv, const hm_ctx_params *p) {
    int32_t n_ctx = hm_resolve_n_ctx(hp, p->n_ctx);
    int64_t B = p->n_batch > 0 ? p->n_batch : 512;
    uint64_t kv = 2ull * (uint64_t)n_layers * hm_kv_layer_bytes(hp, n_ctx, p->kv_type) / (uint64_t)hp->n_head_kv *
                  (uint64_t)n_kv;
    int64_t Dq = (int64_t)hp->n_head * hp->head_dim, Dkv = (int64_t)hp->n_head_kv * hp->head_dim;
    uint64_t scratch = (uint64_t)B * (3 * hp->n_embd + 2 * Dq + 2 * Dkv + 2 * hp->n_ff + hp->head_dim) * 4;
    scratch += (uint64_t)B * hm_max_dim(hp) * 4 * 3;   /* quantized and prepared copies (upper bound) */
    int nt = p->n_threads > 0 ? p->n_threads : hr_physical_cores();
    scratch += (uint64_t)nt * ((uint64_t)n_ctx * 8 + hp->head_dim * 4 + 256);
    return kv + scratch;
}

uint64_t hm_ctx_bytes_estimate(const hm_hparams *hp, const hm_ctx_params *p) {
    return hm_ctx_bytes_need(hp, hp->n_layer, hp->n_head_kv, p);
}

uint64_t hm_ctx_bytes_for_shard(const hm_hparams *hp, const hm_shard *s, const hm_ctx_params *p) {
    int32_t kv_end = s->kv_end < 0 ? hp->n_head_kv : s->kv_end;
    return hm_ctx_bytes_need(hp, hm_shard_n_layers(s), HR_MAX(kv_end - s->kv_begin, 0), p);
}

static void *hm_ctx_alloc(hm_ctx *c, size_t bytes) {
    c->bytes += bytes;
    return hr_alloc_aligned(bytes, HM_ALIGN);
}

void hm_ctx_free(hm_ctx *c) {
    if (!c) return;
    for (int i = 0; c->k_cache && i < c->nl; i++) hr_free_aligned(c->k_cache[i]);
    for (int i = 0; c->v_cache && i < c->nl; i++) hr_free_aligned(c->v_cache[i]);
    free(c->k_cache);
    free(c->v_cache);
    float *bufs[] = {c->x, c->xn, c->q, c->k, c->v, c->att, c->o, c->gate, c->up, c->rope_cs};
    for (size_t i = 0; i < HR_ARRAY_LEN(bufs); i++) hr_free_aligned(bufs[i]);
    free(c->L);
    hm_act *acts[] = {&c->act_in, &c->act_att, &c->act_ff};
    for (size_t a = 0; a < HR_ARRAY_LEN(acts); a++)
        for (int i = 0; i < HM_ACT_COUNT; i++) hr_free_aligned(acts[a]->q[i]);
    hr_free_aligned(c->att_scratch);
    free((void *)c->ff_units);
    free(c->dec_speed);
    hr_free_aligned(c->dec_span);
    if (c->own_pool) hr_pool_free(c->pool);
    free(c);
}

/* allocates one buffer per activation form some weight of the shard needs: its vec_dot_type, and the
   prepared form where the weight can be packed (whether it is may be decided after this) */
static int hm_act_init(hm_ctx *c, hm_act *a, const hm_tensor *const *ws, int nw, int64_t dim) {
    if (dim == 0) return 0; /* an empty share: the block is skipped */
    for (int i = 0; i < nw; i++) {
        const hq_traits *tr = hq_get_traits(ws[i]->type);
        const int pi = hq_pack_ok(ws[i]->type, dim, ws[i]->ne1) ? hm_act_prep_index(ws[i]->type) : -1;
        const int forms[2] = {hm_act_index(tr->vec_dot_type), pi};
        HR_ASSERT(forms[0] >= 0);
        for (int f = 0; f < 2; f++) {
            const int ai = forms[f];
            if (ai < 0 || ai == HM_ACT_F32 || a->q[ai]) continue;
            const size_t row = ai >= HM_ACT_PREP ? tr->prep_size(dim) : hq_row_size(hm_act_types[ai], dim);
            HR_ASSERT(row > 0);
            a->q[ai] = hm_ctx_alloc(c, row * (size_t)c->p.n_batch);
            if (!a->q[ai]) return HR_ENOMEM;
        }
    }
    return 0;
}

hm_ctx *hm_ctx_create(const hm_model *m, const hm_shard *shard, const hm_ctx_params *params, hr_err *err) {
    const hm_hparams *hp = &m->hp;
    hm_ctx *c = calloc(1, sizeof *c);
    if (!c) { hr_fail(err, HR_ENOMEM, "out of memory"); return NULL; }
    c->m = m;
    c->shard = hm_shard_normalize(m, shard);
    shard = &c->shard;
    c->p = *params;
    if (hm_shard_validate(m, shard, err)) goto err;
    if (c->p.n_batch <= 0) c->p.n_batch = 512;
    if (c->p.n_threads <= 0) c->p.n_threads = hr_physical_cores();
    c->n_ctx = hm_resolve_n_ctx(hp, c->p.n_ctx);
    if (c->n_ctx < 1 || c->n_ctx > (1 << 24)) { hr_fail(err, HR_EINVAL, "context length %d out of range", c->n_ctx); goto err; }
    c->p.n_ctx = c->n_ctx;
    if (c->p.n_batch > c->n_ctx) c->p.n_batch = c->n_ctx;
    c->kv_type = c->p.kv_type;
    if (c->kv_type != HQ_TYPE_F16 && c->kv_type != HQ_TYPE_F32) {
        hr_fail(err, HR_EINVAL, "KV cache type must be F16 or F32");
        goto err;
    }
    c->kv_esize = c->kv_type == HQ_TYPE_F32 ? 4 : 2;
    if (c->p.pool) c->pool = c->p.pool;
    else {
        c->pool = hr_pool_create(c->p.n_threads, err);
        if (!c->pool) goto err;
        c->own_pool = true;
    }
    c->p.n_threads = hr_pool_size(c->pool);
    c->dec_span = hr_alloc_aligned(sizeof(hm_mm_span) * (size_t)c->p.n_threads, HM_ALIGN);
    if (!(c->dec_speed = malloc(sizeof(double) * (size_t)c->p.n_threads)) || !c->dec_span) {
        hr_fail(err, HR_ENOMEM, "out of memory");
        goto err;
    }
    for (int i = 0; i < c->p.n_threads; i++) c->dec_speed[i] = 1.0;

    int64_t B = c->p.n_batch, E = hp->n_embd, hd = hp->head_dim;
    int gqa = hp->n_head / hp->n_head_kv;
    c->nkv = shard->kv_end - shard->kv_begin;
    c->nh = c->nkv * gqa;
    c->Dq = (int64_t)c->nh * hd;
    c->Dkv = (int64_t)c->nkv * hd;
    c->F = shard->ff_end - shard->ff_begin;
    int64_t Dq = c->Dq, Dkv = c->Dkv;
    c->max_dim = hm_max_dim(hp);
    int nl = c->nl = hm_shard_n_layers(shard);
    c->L = calloc((size_t)HR_MAX(nl, 1), sizeof *c->L);
    if (!c->L) goto oom;
    for (int w = 0, slot = 0; w < shard->n_windows; w++) {
        c->win_slot[w] = slot;
        for (int il = shard->windows[w].begin; il < shard->windows[w].end; il++, slot++)
            hm_layer_view(&c->L[slot], &m->layers[il], shard, gqa * hd, hd);
    }
    c->k_cache = calloc((size_t)HR_MAX(nl, 1), sizeof(uint8_t *));
    c->v_cache = calloc((size_t)HR_MAX(nl, 1), sizeof(uint8_t *));
    if (!c->k_cache || !c->v_cache) goto oom;
    size_t kvb = (size_t)c->n_ctx * (size_t)Dkv * c->kv_esize;
    for (int i = 0; i < nl; i++) {
        c->k_cache[i] = hm_ctx_alloc(c, kvb);
        c->v_cache[i] = hm_ctx_alloc(c, kvb);
        if (!c->k_cache[i] || !c->v_cache[i]) goto oom;
    }
#define ALLOC_F(field, count) if (!(c->field = hm_ctx_alloc(c, (size_t)(count) * sizeof(float)))) goto oom
    ALLOC_F(x, B * E);
    ALLOC_F(xn, B * E);
    ALLOC_F(q, B * Dq);
    ALLOC_F(k, B * Dkv);
    ALLOC_F(v, B * Dkv);
    ALLOC_F(att, B * Dq);
    ALLOC_F(o, B * E);
    ALLOC_F(gate, B * c->F);
    ALLOC_F(up, B * c->F);
    ALLOC_F(rope_cs, B * hd);
#undef ALLOC_F
    /* which activation types the shard's weights need */
    for (int i = 0; i < nl; i++) {
        const hm_layer *L = &c->L[i];
        const hm_tensor *in[] = {&L->wq, &L->wk, &L->wv, &L->w_gate, &L->w_up};
        const hm_tensor *at[] = {&L->wo};
        const hm_tensor *ff[] = {&L->w_down};
        if (hm_act_init(c, &c->act_in, in, 5, E) || hm_act_init(c, &c->act_att, at, 1, Dq) ||
            hm_act_init(c, &c->act_ff, ff, 1, c->F))
            goto oom;
    }
    if (shard->last) {
        const hm_tensor *out[] = {&m->output};
        if (hm_act_init(c, &c->act_in, out, 1, E)) goto oom;
    }
    c->att_scratch_stride = hr_pad((size_t)HM_ATT_NQ * (hd + 2 * HM_KV_TILE) * sizeof(float),
                                   HM_ALIGN);
    c->att_scratch = hm_ctx_alloc(c, c->att_scratch_stride * (size_t)c->p.n_threads);
    if (!c->att_scratch) goto oom;
    if (c->F % HM_FF_UNIT == 0 && c->F > 0 && !(c->ff_units = calloc((size_t)(c->F / HM_FF_UNIT), sizeof *c->ff_units)))
        goto oom;
    return c;
oom:
    hr_fail(err, HR_ENOMEM, "out of memory allocating the context (%.1f MiB so far)", c->bytes / 1048576.0);
err:
    hm_ctx_free(c);
    return NULL;
}

uint64_t hm_ctx_bytes(const hm_ctx *c) { return c->bytes; }
int32_t hm_ctx_n_ctx(const hm_ctx *c) { return c->n_ctx; }
hm_timings hm_ctx_timings(const hm_ctx *c) { return c->t; }

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
static void hm_add(float *x, const float *o, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) hm_st4(x + i, hm_ld4(x + i) + hm_ld4(o + i));
    for (; i < n; i++) x[i] += o[i];
}

/* y = x / rms(x) * w, the sum in double as ggml does */
static void hm_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps) {
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

/* ---- activation conversion ---------------------------------------------------------------------- */

typedef struct { hm_act *a; int ai; } hm_conv_job;
static void hm_conv_worker(void *arg, int ith, int nth) {
    hm_conv_job *j = arg;
    hm_act *a = j->a;
    int64_t r0, r1;
    hr_split(a->n, ith, nth, 1, &r0, &r1);
    const int ai = j->ai;
    if (ai >= HM_ACT_PREP) { /* a packed kernel's form, from the vec_dot_type copy */
        const hq_traits *tr = hq_get_traits(hm_act_types[ai]);
        const int src = hm_act_index(tr->vec_dot_type);
        for (int64_t r = r0; r < r1; r++) tr->prep(a->q[ai] + r * a->q_row[ai], a->q[src] + r * a->q_row[src], a->dim);
        return;
    }
    const hq_traits *tr = hq_get_traits(hm_act_types[ai]);
    for (int64_t r = r0; r < r1; r++)
        tr->from_float(a->f32 + r * a->dim, a->q[ai] + r * a->q_row[ai], a->dim);
}

/* makes sure a has a copy in activation form ai; returns the row pointer base and stride */
static const uint8_t *hm_act_get(hm_ctx *c, hm_act *a, int ai, size_t *row) {
    if (ai == HM_ACT_F32) { *row = (size_t)a->dim * 4; return (const uint8_t *)a->f32; }
    if (!a->valid[ai]) {
        if (ai >= HM_ACT_PREP) {
            const hq_traits *tr = hq_get_traits(hm_act_types[ai]);
            size_t src_row;
            (void)hm_act_get(c, a, hm_act_index(tr->vec_dot_type), &src_row);
            a->q_row[ai] = tr->prep_size(a->dim);
        } else {
            a->q_row[ai] = hq_row_size(hm_act_types[ai], a->dim);
        }
        hm_conv_job j = {a, ai};
        if (a->n == 1) hm_conv_worker(&j, 0, 1);
        else hr_pool_run(c->pool, hm_conv_worker, &j);
        a->valid[ai] = true;
    }
    *row = a->q_row[ai];
    return a->q[ai];
}

static void hm_act_set(hm_act *a, float *f32, int n, int64_t dim) {
    a->f32 = f32;
    a->n = n;
    a->dim = (int)dim;
    memset(a->valid, 0, sizeof a->valid);
}

/* ---- matmul: out[n][rows] = W · act, several weights in one parallel job ------------------------ */

typedef struct hm_mm_item {
    const hm_tensor *w;
    const uint8_t *y;   /* activations in w's vec_dot_type */
    size_t y_row;
    float *out;         /* [n][w->ne1] */
} hm_mm_item;

typedef struct hm_mm_job {
    hm_mm_item items[3];
    int n_items;
    int n;              /* tokens */
    double *speed;      /* decode: the ctx's dec_speed, which each thread updates for itself */
    hq_silu_mul_fn glu; /* if set: items 0 and 1 are the gate and up projections (same rows), computed
                           together row range by row range, each range finished as gate = silu(gate) * up */
    hm_mm_span *span;   /* decode (n = 1, nth <= HM_MAX_SPLIT): [nth]; NULL: static shares */
    const struct hm_mm_hooks *hooks;
} hm_mm_job;

/* what a decode's matmul job does besides its rows, each hook optional */
typedef struct hm_mm_hooks {
    void (*rows)(const void *arg, int64_t r0, int64_t r1); /* after each range of rows (of part 0) is done */
    void (*then)(const void *arg, int ith, int nth);       /* each thread, when it has no rows left */
    const void *arg;
} hm_mm_hooks;

/* A job's parts: the items, except that a GLU job's gate and up are one part */
static int hm_mm_parts(const hm_mm_job *j) { return j->glu ? 1 : j->n_items; }

/* rows [r0, r1) of part p: the tile kernel over them, for every token (a GLU part: the gate's rows,
   the up's rows, then the gate over them); returns the weight bytes read */
static uint64_t hm_mm_rows(const hm_mm_job *j, int p, int64_t r0, int64_t r1) {
    uint64_t bytes = 0;
    for (int it = p; it < (j->glu ? 2 : p + 1); it++) {
        const hm_mm_item *m = &j->items[it];
        const hm_tensor *w = m->w;
        const hq_traits *tr = hq_get_traits(w->type);
        const hq_gemm_fn gemm = w->packed ? tr->gemm_packed : tr->gemm; /* packed: whole groups */
        /* tiles of HM_ROW_CHUNK weight rows x all tokens: the rows stay in cache while every
           token's activations stream past them; decode (n = 1) hands the kernel the whole range
           instead, so that it prepares the activation row once and streams the rows as one run */
        const int64_t chunk = j->n == 1 ? HR_MAX(r1 - r0, 1) : HM_ROW_CHUNK;
        for (int64_t r = r0; r < r1; r += chunk) {
            int nr = (int)HR_MIN(chunk, r1 - r);
            gemm((int)w->ne0, m->out + r, (size_t)w->ne1, w->data + r * w->row_bytes, w->row_bytes, nr, m->y,
                 m->y_row, j->n);
        }
        bytes += (uint64_t)HR_MAX(r1 - r0, 0) * w->row_bytes;
    }
    if (j->glu) {
        const int64_t ne1 = j->items[0].w->ne1;
        for (int t = 0; t < j->n && r1 > r0; t++)
            j->glu(r1 - r0, j->items[0].out + t * ne1 + r0, j->items[1].out + t * ne1 + r0);
    }
    if (p == 0 && j->hooks && j->hooks->rows && r1 > r0) j->hooks->rows(j->hooks->arg, r0, r1);
    return bytes;
}

/* Claims rows of a span in whole HM_ROW_CHUNKs: the owner (front) half of what is left, at least
   HM_MM_MIN_CLAIM chunks; another thread (back) half of what is left, at least one chunk.  Returns
   false when nothing is left. */
#define HM_MM_MIN_CLAIM 4
static bool hm_mm_claim(_Atomic uint64_t *sp, bool front, int64_t ne1, int64_t *r0, int64_t *r1) {
    uint64_t v = atomic_load_explicit(sp, memory_order_relaxed);
    for (;;) {
        const uint32_t f = (uint32_t)v, b = (uint32_t)(v >> 32);
        if (f >= b) return false;
        const uint32_t left = b - f;
        uint32_t take = front ? HR_MAX((left + 1) / 2, HM_MM_MIN_CLAIM) : HR_MAX(left / 2, 1);
        take = HR_MIN(take, left);
        const uint64_t nv = front ? (uint64_t)b << 32 | (f + take) : (uint64_t)(b - take) << 32 | f;
        if (atomic_compare_exchange_weak_explicit(sp, &v, nv, memory_order_relaxed, memory_order_relaxed)) {
            const uint32_t c0 = front ? f : b - take;
            *r0 = HR_MIN((int64_t)c0 * HM_ROW_CHUNK, ne1);
            *r1 = HR_MIN((int64_t)(c0 + take) * HM_ROW_CHUNK, ne1);
            return true;
        }
    }
}

/* Decode splits each part's rows between the threads in proportion to how fast each has been
   streaming (dec_speed: an average over recent jobs, each thread updating its own entry after its
   share).  On a shared machine one core is often slower than the other for long stretches — which
   one changes from run to run — and an even split left the faster thread waiting: at 2 threads
   (Zen 5 VM, Llama-3.2-1B tg64, instrumented) the two threads' times per matmul job differed by
   13-30% of the job summed over a run (Q4_0 17%, Q8_0 13-30%, Q4_K_M 26%); with this split 5-10%.
   What is left is noise within a job (a core slowed for some microseconds), which no split made
   beforehand can know: so each thread claims its share a half at a time, and a thread that has
   finished its share of a part takes the rest of another's from the back, before moving to the
   next part.  Which thread computes a row does not change the row's result. */
static void hm_dec_spans(const hm_mm_job *j, const double *speed, int nth, hm_mm_span *span) {
    double tot = 0, cum = 0;
    for (int i = 0; i < nth; i++) tot += speed[i];
    for (int i = 0; i < nth; i++) {
        const double c0 = cum / tot, c1 = (cum += speed[i]) / tot;
        for (int p = 0; p < hm_mm_parts(j); p++) {
            const int64_t nch = (j->items[p].w->ne1 + HM_ROW_CHUNK - 1) / HM_ROW_CHUNK;
            const uint64_t f = i == 0 ? 0 : (uint64_t)HR_MIN((int64_t)(nch * c0 + 0.5), nch);
            const uint64_t b = i == nth - 1 ? (uint64_t)nch : (uint64_t)HR_MIN((int64_t)(nch * c1 + 0.5), nch);
            atomic_store_explicit(&span[i].part[p], b << 32 | f, memory_order_relaxed);
        }
    }
}

/* decode: this thread's share of each part, claimed from the front of its span, then what is left of
   the others' from their backs */
static void hm_mm_worker_spans(hm_mm_job *j, int ith, int nth) {
    const int64_t t0 = hr_time_ns();
    uint64_t bytes = 0;
    for (int p = 0; p < hm_mm_parts(j); p++) {
        const int64_t ne1 = j->items[p].w->ne1;
        int64_t r0, r1;
        while (hm_mm_claim(&j->span[ith].part[p], true, ne1, &r0, &r1)) bytes += hm_mm_rows(j, p, r0, r1);
        for (int k = 1; k < nth; k++) {
            _Atomic uint64_t *sp = &j->span[(ith + k) % nth].part[p];
            while (hm_mm_claim(sp, false, ne1, &r0, &r1)) bytes += hm_mm_rows(j, p, r0, r1);
        }
    }
    /* this thread's speed, averaged over ~8 jobs (a stall moves it by an eighth at most) and kept
       within [0.25, 64] bytes/ns; jobs too short to time say nothing */
    const int64_t dt = hr_time_ns() - t0;
    if (dt > 20000 && bytes > 0) {
        const double v = 0.875 * j->speed[ith] + 0.125 * ((double)bytes / (double)dt);
        j->speed[ith] = HR_MIN(HR_MAX(v, 0.25), 64.0);
    }
}

static void hm_mm_worker(void *arg, int ith, int nth) {
    hm_mm_job *j = arg;
    if (j->span) {
        hm_mm_worker_spans(j, ith, nth);
    } else { /* static shares in HM_ROW_CHUNK tiles */
        for (int p = 0; p < hm_mm_parts(j); p++) {
            int64_t r0, r1;
            hr_split(j->items[p].w->ne1, ith, nth, HM_ROW_CHUNK, &r0, &r1);
            hm_mm_rows(j, p, r0, r1);
        }
    }
    if (j->hooks && j->hooks->then) j->hooks->then(j->hooks->arg, ith, nth);
}

static void hm_matmul(hm_ctx *c, hm_act *a, const hm_tensor *const *ws, float *const *outs, int nw, bool glu,
                      const hm_mm_hooks *hooks) {
    int64_t t0 = hr_time_ns();
    hm_mm_job j = {.n_items = nw, .n = a->n, .speed = c->dec_speed, .glu = glu ? hq_get_silu_mul(false) : NULL, .hooks = hooks};
    for (int i = 0; i < nw; i++) {
        int ai = hm_act_for(ws[i]);
        j.items[i].w = ws[i];
        j.items[i].y = hm_act_get(c, a, ai, &j.items[i].y_row);
        j.items[i].out = outs[i];
    }
    if (a->n == 1 && c->p.n_threads <= HM_MAX_SPLIT) {
        j.span = c->dec_span;
        hm_dec_spans(&j, c->dec_speed, c->p.n_threads, j.span);
    }
    hr_pool_run(c->pool, hm_mm_worker, &j);
    c->t.matmul_ns += hr_time_ns() - t0;
}

/* ---- attention ---------------------------------------------------------------------------------- */

typedef struct hm_att_job {
    hm_ctx *c;
    int li;          /* layer index within the shard */
    int n;
    int32_t pos0;
} hm_att_job;

/* Attention for one (token, head): one pass over the cache with an online softmax (running max M,
   running sum S, running output acc), so K and V are each read once. Two numerics, chosen as
   llama.cpp's CPU flash attention (its default, against which hearth is tested) chooses them:
   - F32 path (batches of >= HM_KV_TILE tokens, and always with an F32 cache): q stays F32, an F16
     cache is converted on load, scores are sequential sums over the head dimension, positions go in
     tiles of HM_KV_TILE with the softmax normalised per tile, the output accumulates in F32;
   - F16 path (smaller batches, F16 cache): q is rounded to F16 for the dot with K, and the output
     is accumulated in F16, rounded after every position, as llama.cpp's per-row kernel does.
   Both are exact softmax attention; they differ only in rounding (~3e-4 relative on the logits). */

/* F32 path for nq (<= HM_ATT_NQ) heads of one token that share a KV head (GQA): the scores of a tile
   for all of them in one kernel call (each K tile transposed once), each head's online softmax, then
   the values for all of them in one call (each V row read once); per head the steps of one head
   alone, in the same order. acc: [nq][hd], sc: [nq][HM_KV_TILE], q and out: nq heads of hd
   in a row. */
static void hm_att_f32(const hq_att_kernels *ak, int nq, const float *q, const uint8_t *kbase, const uint8_t *vbase,
                       size_t row, bool f16, int32_t npos, int hd, float scale, float *acc, float *sc, float *out) {
    float M[HM_ATT_NQ], S[HM_ATT_NQ];
    for (int j = 0; j < nq; j++) M[j] = -INFINITY, S[j] = 0.0f;
    memset(acc, 0, (size_t)nq * hd * sizeof(float));
    /* the loops over a tile's positions below run the HM_ATT_NQ heads' chains side by side (each
       head's running maximum and its double-precision sum, each in its own order as one head alone
       would), so that a step waits on its own head's previous step only; a group of fewer heads runs
       the missing ones over a tile of zeros */
    float pad[HM_ATT_NQ][HM_KV_TILE]; /* row j stands in for a missing head j */
    float *r[HM_ATT_NQ];
    for (int j = 0; j < HM_ATT_NQ; j++) r[j] = j < nq ? sc + j * HM_KV_TILE : pad[j];
    if (nq < HM_ATT_NQ) memset(pad, 0, sizeof pad);
    for (int32_t p0 = 0; p0 < npos; p0 += HM_KV_TILE) {
        int nt = HR_MIN(HM_KV_TILE, npos - p0);
        ak->kq(nt, hd, nq, q, (size_t)hd, kbase + (size_t)p0 * row, row, f16, sc, HM_KV_TILE); /* sequential sums over d */
        float tmax[HM_ATT_NQ];
        for (int j = 0; j < HM_ATT_NQ; j++) tmax[j] = -INFINITY;
        for (int i = 0; i < nt; i++)
#pragma GCC unroll 4
            for (int j = 0; j < HM_ATT_NQ; j++) {
                r[j][i] *= scale;
                tmax[j] = r[j][i] > tmax[j] ? r[j][i] : tmax[j];
            }
        for (int j = 0; j < nq; j++) {
            float *scj = sc + j * HM_KV_TILE, *accj = acc + (size_t)j * hd;
            if (tmax[j] > M[j]) {
                float ms = hq_expf(M[j] - tmax[j]);
                for (int d = 0; d < hd; d++) accj[d] *= ms;
                S[j] *= ms;
                M[j] = tmax[j];
            }
            const float mj = M[j];
            for (int i = 0; i < nt; i++) scj[i] -= mj;
            ak->exp(nt, scj, scj);
        }
        double sum[HM_ATT_NQ] = {0};
        for (int i = 0; i < nt; i++)
#pragma GCC unroll 4
            for (int j = 0; j < HM_ATT_NQ; j++) sum[j] += r[j][i];
        for (int j = 0; j < nq; j++) S[j] += (float)sum[j];
        ak->kv(nt, hd, nq, sc, HM_KV_TILE, vbase + (size_t)p0 * row, row, f16, acc, (size_t)hd);
    }
    for (int j = 0; j < nq; j++) {
        float inv = S[j] == 0.0f ? 0.0f : 1.0f / S[j];
        for (int d = 0; d < hd; d++) out[(size_t)j * hd + d] = acc[(size_t)j * hd + d] * inv;
    }
}

/* Requests the lines of K and V rows (one KV head's bytes of n positions, rows `row` apart) into L1,
   or into L2 (l2): in a decode a layer's cache was last read a whole token ago, so it comes from DRAM,
   a stride of rows the hardware prefetchers do not follow far enough ahead */
static inline void hm_att_prefetch(const uint8_t *k, const uint8_t *v, size_t row, int n, size_t bytes, bool l2) {
    for (int i = 0; i < n; i++)
        for (size_t b = 0; b < bytes; b += 64) {
            if (l2) {
                __builtin_prefetch(k + (size_t)i * row + b, 0, 2);
                __builtin_prefetch(v + (size_t)i * row + b, 0, 2);
            } else {
                __builtin_prefetch(k + (size_t)i * row + b, 0, 3);
                __builtin_prefetch(v + (size_t)i * row + b, 0, 3);
            }
        }
}

/* F16 path for nq (<= HM_ATT_NQ) heads of one token that share a KV head, a tile of positions at a
   time: the scores (q16 . k_p) of all of them in one kernel call (each K row widened once), then each
   head's online-softmax factors in order (m: the accumulator's rescale when the running max rises,
   else 1; w: the position's weight), then the accumulators' F16 steps over the tile in one call
   (each V row widened once).  Per head the steps of one head alone, position by position, in the
   same order.  q16, acc16: [nq][hd]; m, w: [nq][HM_KV_TILE]; q and out: nq heads of hd in a row. */
static void hm_att_f16(const hq_att_kernels *ak, int nq, const float *q, const uint8_t *kbase, const uint8_t *vbase,
                       size_t row, int32_t npos, int hd, float scale, hr_fp16 *q16, hr_fp16 *acc16, float *m,
                       float *w, float *out) {
    float M[HM_ATT_NQ], S[HM_ATT_NQ];
    for (int j = 0; j < nq; j++) M[j] = -INFINITY, S[j] = 0.0f;
    hq_get_traits(HQ_TYPE_F16)->from_float(q, q16, (int64_t)nq * hd); /* hr_fp32_to_fp16's bits */
    memset(acc16, 0, (size_t)nq * hd * sizeof(hr_fp16));
    for (int32_t p0 = 0; p0 < npos; p0 += HM_KV_TILE) {
        const int nt = HR_MIN(HM_KV_TILE, npos - p0);
        hm_att_prefetch(kbase + (size_t)p0 * row, vbase + (size_t)p0 * row, row, nt, (size_t)hd * sizeof(hr_fp16), false);
        ak->kq16(nt, hd, nq, q16, (size_t)hd, kbase + (size_t)p0 * row, row, w, HM_KV_TILE);
        /* the running maxima's steps first, each position's one exponential's argument in w (rises:
           it is the rescale's), then the exponentials in one call per head, then the running sums;
           the heads side by side, so that each step waits on its own head's previous one only */
        bool rises[HM_ATT_NQ][HM_KV_TILE];
        for (int i = 0; i < nt; i++)
            for (int j = 0; j < nq; j++) {
                float *wj = w + j * HM_KV_TILE;
                const float s = wj[i] * scale;
                rises[j][i] = s > M[j];
                wj[i] = rises[j][i] ? M[j] - s : s - M[j];
                M[j] = rises[j][i] ? s : M[j];
            }
        for (int j = 0; j < nq; j++) ak->exp(nt, w + j * HM_KV_TILE, w + j * HM_KV_TILE);
        for (int i = 0; i < nt; i++)
            for (int j = 0; j < nq; j++) {
                float *mj = m + j * HM_KV_TILE, *wj = w + j * HM_KV_TILE;
                mj[i] = rises[j][i] ? wj[i] : 1.0f;
                wj[i] = rises[j][i] ? 1.0f : wj[i];
                S[j] = S[j] * mj[i] + wj[i];
            }
        ak->acc16(nt, hd, nq, acc16, (size_t)hd, vbase + (size_t)p0 * row, row, m, w, HM_KV_TILE);
    }
    for (int j = 0; j < nq; j++) {
        const float inv = S[j] == 0.0f ? 0.0f : 1.0f / S[j];
        for (int d = 0; d < hd; d++) out[(size_t)j * hd + d] = hr_fp16_to_fp32(acc16[(size_t)j * hd + d]) * inv;
    }
}

/* Thread ith's items [w0, w1) of the n * nh (token, head) items of a batch, in order: contiguous
   ranges of equal cost, an item of token t costing its pos0 + t + 1 positions. (Equal item counts
   gave the second of two threads 3/4 of a 512-token prompt's attention, the first waiting.) */
static void hm_att_split(int n, int nh, int32_t pos0, int ith, int nth, int64_t *w0, int64_t *w1) {
    double total = 0;
    for (int t = 0; t < n; t++) total += (double)(pos0 + t + 1);
    int64_t bound[2];
    for (int e = 0; e < 2; e++) {
        const int i = ith + e;
        if (i == 0 || i == nth) { bound[e] = i == 0 ? 0 : (int64_t)n * nh; continue; }
        const double target = total * i / nth;   /* in positions per head */
        double cum = 0;
        int t = 0;
        while (t < n - 1 && cum + (pos0 + t + 1) <= target) cum += (double)(pos0 + t + 1), t++;
        int64_t h = (int64_t)((target - cum) / (pos0 + t + 1) * nh + 0.5);
        bound[e] = (int64_t)t * nh + HR_MIN(h, (int64_t)nh);
    }
    *w0 = bound[0];
    *w1 = HR_MAX(bound[0], bound[1]);
}

static void hm_att_worker(void *arg, int ith, int nth) {
    hm_att_job *j = arg;
    hm_ctx *c = j->c;
    const hm_hparams *hp = &c->m->hp;
    int hd = hp->head_dim, nh = c->nh, gqa = hp->n_head / hp->n_head_kv;
    const int64_t Dq = c->Dq;
    const float scale = 1.0f / sqrtf((float)hd);
    /* scratch: F32 path acc [HM_ATT_NQ][hd] and sc [HM_ATT_NQ][HM_KV_TILE]; the F16 path's q16 and acc16
       ([HM_ATT_NQ][hd] each, in acc's place), m (in sc's place) and w [HM_ATT_NQ][HM_KV_TILE] */
    float *acc = (float *)(c->att_scratch + (size_t)ith * c->att_scratch_stride);
    float *sc = acc + HM_ATT_NQ * hd, *sw = sc + HM_ATT_NQ * HM_KV_TILE;
    hr_fp16 *q16 = (hr_fp16 *)acc, *acc16 = q16 + HM_ATT_NQ * hd;
    const uint8_t *K = c->k_cache[j->li], *V = c->v_cache[j->li];
    const size_t es = c->kv_esize, row = (size_t)hd * es, head = (size_t)c->n_ctx * row; /* a KV head's rows */
    bool f16 = c->kv_type == HQ_TYPE_F16;
    bool f16_path = f16 && j->n < HM_KV_TILE;
    const hq_att_kernels *ak = hq_get_att(false);
    int64_t w0, w1;
    hm_att_split(j->n, nh, j->pos0, ith, nth, &w0, &w1);
    for (int64_t w = w0, g = 1; w < w1; w += g) {
        int t = (int)(w / nh), h = (int)(w % nh), kvh = h / gqa;
        int32_t npos = j->pos0 + t + 1;  /* causal: positions 0..pos */
        const float *q = c->q + (int64_t)t * Dq + (int64_t)h * hd;
        const uint8_t *kb = K + (size_t)kvh * head, *vb = V + (size_t)kvh * head;
        float *out = c->att + (int64_t)t * Dq + (int64_t)h * hd;
        /* this head and the next heads of this token on the same KV head, in this thread's range */
        g = 1;
        while (g < HM_ATT_NQ && w + g < w1 && h + g < nh && (h + g) / gqa == kvh) g++;
        if (f16_path) hm_att_f16(ak, (int)g, q, kb, vb, row, npos, hd, scale, q16, acc16, sc, sw, out);
        else hm_att_f32(ak, (int)g, q, kb, vb, row, f16, npos, hd, scale, acc, sc, out);
    }
}

/* Each thread of a decode's QKV matmul job ends its share with this: it requests into L2 the first
   HM_ATT_PF_POS cache rows of each KV head its attention heads will read (hm_att_worker's split),
   thread 0 also the rows the new position's K and V go to (hm_qk_worker's stores).  Those lines come
   from DRAM: a token's weight stream evicts the whole cache between two uses of a layer, and its 1 KiB
   stride of rows (before the cache was laid out per KV head) was not one the hardware prefetchers
   followed.  Requested here, their latency overlaps with the other thread's last rows, the RoPE and
   the KV stores, not with the attention's own work: at two threads, Llama-3.2-1B Q4_K_M, 128 tokens
   from position 0, the attention step (RoPE, stores, the heads) took ~0.50-0.61 -> 0.41-0.45 ms a
   token, the stores alone ~3.5 -> ~0.7 us a layer (each a DRAM read for ownership). */
static void hm_att_warm(const void *arg, int ith, int nth) {
    const hm_att_job *j = arg;
    const hm_ctx *c = j->c;
    const int hd = c->m->hp.head_dim, nh = c->nh, gqa = c->m->hp.n_head / c->m->hp.n_head_kv;
    const uint8_t *K = c->k_cache[j->li], *V = c->v_cache[j->li];
    const size_t row = (size_t)hd * c->kv_esize, head = (size_t)c->n_ctx * row;
    if (ith == 0)
        for (int h = 0; h < c->nkv; h++)
            hm_att_prefetch(K + h * head + (size_t)j->pos0 * row, V + h * head + (size_t)j->pos0 * row, row, 1, row, true);
    int64_t w0, w1;
    hm_att_split(1, nh, j->pos0, ith, nth, &w0, &w1);
    const int32_t np = HR_MIN(j->pos0, HM_ATT_PF_POS);
    for (int64_t w = w0; w < w1; w++) {
        const int h = (int)(w % nh);
        if (w > w0 && h % gqa) continue; /* once per KV head */
        hm_att_prefetch(K + (size_t)(h / gqa) * head, V + (size_t)(h / gqa) * head, row, np, row, true);
    }
}

/* RoPE on one head vector in place: llama rotates adjacent pairs, NeoX rotates the two halves */
static inline __attribute__((always_inline)) void hm_rope_hd(float *restrict x, const float *restrict cs, int hd,
                                                              bool neox) {
    const int half = hd / 2;
    if (neox) {
        for (int i = 0; i < half; i++) {
            const float cth = cs[2 * i], sth = cs[2 * i + 1], x0 = x[i], x1 = x[i + half];
            x[i] = x0 * cth - x1 * sth;
            x[i + half] = x0 * sth + x1 * cth;
        }
    } else {
        for (int i = 0; i < half; i++) {
            const float cth = cs[2 * i], sth = cs[2 * i + 1], x0 = x[2 * i], x1 = x[2 * i + 1];
            x[2 * i] = x0 * cth - x1 * sth;
            x[2 * i + 1] = x0 * sth + x1 * cth;
        }
    }
}
/* the common head sizes as constants, so that the compiler vectorizes their loops (a variable count
   and one loop choosing its indices per pair did not vectorize: ~1.5 ns a pair, RoPE ~30 us of a
   Llama-3.2-1B token) */
static void hm_rope(float *restrict x, const float *restrict cs, int hd, bool neox) {
    if (hd == 64) hm_rope_hd(x, cs, 64, neox);
    else if (hd == 128) hm_rope_hd(x, cs, 128, neox);
    else hm_rope_hd(x, cs, hd, neox);
}

typedef struct hm_qk_job { hm_ctx *c; const hm_layer *L; int li; int n; int32_t pos0; } hm_qk_job;

/* biases, q/k norms, RoPE, and the KV cache store, per token */
static void hm_qk_worker(void *arg, int ith, int nth) {
    hm_qk_job *j = arg;
    hm_ctx *c = j->c;
    const hm_hparams *hp = &c->m->hp;
    const hm_layer *L = j->L;
    int hd = hp->head_dim, nh = c->nh, nkv = c->nkv;
    int64_t Dq = c->Dq, Dkv = c->Dkv;
    int64_t t0, t1;
    hr_split(j->n, ith, nth, 1, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        float *q = c->q + t * Dq, *k = c->k + t * Dkv, *v = c->v + t * Dkv;
        if (L->bq.data) {
            const float *bq = L->bq.data, *bk = L->bk.data, *bv = L->bv.data;
            for (int64_t i = 0; i < Dq; i++) q[i] += bq[i];
            for (int64_t i = 0; i < Dkv; i++) k[i] += bk[i];
            for (int64_t i = 0; i < Dkv; i++) v[i] += bv[i];
        }
        const float *cs = c->rope_cs + t * hd;
        for (int h = 0; h < nh; h++) {
            if (L->q_norm.data) hm_rmsnorm(q + h * hd, q + h * hd, L->q_norm.data, hd, hp->rms_eps);
            hm_rope(q + h * hd, cs, hd, hp->rope_neox);
        }
        for (int h = 0; h < nkv; h++) {
            if (L->k_norm.data) hm_rmsnorm(k + h * hd, k + h * hd, L->k_norm.data, hd, hp->rms_eps);
            hm_rope(k + h * hd, cs, hd, hp->rope_neox);
        }
        const size_t pos = (size_t)(j->pos0 + (int32_t)t), es = c->kv_esize;
        /* the dispatched F32 -> F16 rows: hr_fp32_to_fp16's bits */
        const hq_from_float_fn to16 = hq_get_traits(HQ_TYPE_F16)->from_float;
        for (int h = 0; h < nkv; h++) { /* KV head h's row at pos (hm_ctx's cache layout) */
            uint8_t *K = c->k_cache[j->li] + ((size_t)h * (size_t)c->n_ctx + pos) * (size_t)hd * es;
            uint8_t *V = c->v_cache[j->li] + ((size_t)h * (size_t)c->n_ctx + pos) * (size_t)hd * es;
            if (c->kv_type == HQ_TYPE_F16) {
                to16(k + h * hd, K, hd);
                to16(v + h * hd, V, hd);
            } else {
                memcpy(K, k + h * hd, (size_t)hd * 4);
                memcpy(V, v + h * hd, (size_t)hd * 4);
            }
        }
    }
}

/* ---- the forward pass ---------------------------------------------------------------------------- */

typedef struct hm_rows_job {
    hm_ctx *c;
    int n;
    int op;              /* 0: xn = norm(x)*w; 1: x += o, xn = norm(x)*w (the FFN gate is done in its matmul job) */
    const float *w;
} hm_rows_job;

static void hm_rows_worker(void *arg, int ith, int nth) {
    hm_rows_job *j = arg;
    hm_ctx *c = j->c;
    const hm_hparams *hp = &c->m->hp;
    int64_t E = hp->n_embd;
    int64_t t0, t1;
    hr_split(j->n, ith, nth, 1, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        float *x = c->x + t * E;
        if (j->op == 1) {
            hm_add(x, c->o + t * E, E);
        }
        hm_rmsnorm(c->xn + t * E, x, j->w, E, hp->rms_eps);
    }
}

static void hm_rows(hm_ctx *c, int n, int op, const float *w) {
    int64_t t0 = hr_time_ns();
    hm_rows_job j = {c, n, op, w};
    if (n == 1) hm_rows_worker(&j, 0, 1);
    else hr_pool_run(c->pool, hm_rows_worker, &j);
    c->t.other_ns += hr_time_ns() - t0;
}

static void hm_weights(hm_ctx *c, int layer, enum hm_block b, enum hm_phase ph) {
    if (!c->shard.weights) return;
    int64_t t0 = hr_time_ns();
    c->shard.weights(c->shard.weights_user, layer, b, ph);
    c->t.weights_ns += hr_time_ns() - t0;
}

static int hm_sync(hm_ctx *c, int layer, enum hm_block b, float *x, int n, hr_err *err) {
    if (!c->shard.sync) return 0;
    int64_t t0 = hr_time_ns();
    int rc = c->shard.sync(c->shard.sync_user, layer, b, x, n, c->m->hp.n_embd);
    c->t.sync_ns += hr_time_ns() - t0;
    if (rc) return hr_fail(err, rc, "layer %d %s sync failed: %s", layer, b == HM_BLOCK_ATTN ? "attention" : "FFN",
                           hr_strerror(rc));
    return 0;
}

/* cos/sin of each token's RoPE angles: theta_i = pos * base^(-2i/hd) / freq_factor_i, computed by
   repeated multiplication in float as ggml's rope cache does */
static void hm_rope_cache(hm_ctx *c, int n, int32_t pos0) {
    const hm_hparams *hp = &c->m->hp;
    int hd = hp->head_dim;
    const float theta_scale = powf(hp->rope_base, -2.0f / (float)hd);
    const float *ff = c->m->rope_freqs.data;
    for (int t = 0; t < n; t++) {
        float theta = (float)(pos0 + t);
        float *cs = c->rope_cs + (int64_t)t * hd;
        for (int i = 0; i < hd / 2; i++) {
            float th = ff ? theta / ff[i] : theta;
            cs[2 * i] = cosf(th);
            cs[2 * i + 1] = sinf(th);
            theta *= theta_scale;
        }
    }
}

/* o = attention block output (this share's partial sum) for xn = rmsnorm(x) * attn_norm */
static void hm_attention_block(hm_ctx *c, const hm_layer *L, int li, int n, int32_t pos0) {
    if (c->nkv == 0) { /* no attention heads in this share: a zero partial */
        memset(c->o, 0, (size_t)n * c->m->hp.n_embd * sizeof(float));
        return;
    }
    /* q, k, v projections */
    hm_act_set(&c->act_in, c->xn, n, c->m->hp.n_embd);
    const hm_tensor *wqkv[] = {&L->wq, &L->wk, &L->wv};
    float *oqkv[] = {c->q, c->k, c->v};
    hm_att_job aj = {c, li, n, pos0};
    const hm_mm_hooks warm = {.then = hm_att_warm, .arg = &aj};
    hm_matmul(c, &c->act_in, wqkv, oqkv, 3, false, n == 1 ? &warm : NULL);
    /* biases, q/k norm, RoPE, KV store */
    int64_t t0 = hr_time_ns();
    hm_qk_job qj = {c, L, li, n, pos0};
    if (n == 1) hm_qk_worker(&qj, 0, 1);
    else hr_pool_run(c->pool, hm_qk_worker, &qj);
    /* softmax(q K^T / sqrt(hd)) V */
    hr_pool_run(c->pool, hm_att_worker, &aj);
    c->t.attn_ns += hr_time_ns() - t0;
    /* output projection */
    hm_act_set(&c->act_att, c->att, n, c->Dq);
    const hm_tensor *wo[] = {&L->wo};
    float *oo[] = {c->o};
    hm_matmul(c, &c->act_att, wo, oo, 1, false, NULL);
}

/* A decode's ffn_down reads its activations (silu(gate) * up, F values) in another form: Q8_K and
   its kernel's prepared form for the K-quants, Q8_0 (and x4v's prepared form where packed) for Q4_0
   and Q8_0.  Made in one piece before the down job, that conversion took one thread 3.6-4.2 us of
   every ~250 us job (the values cold, half of them written by the other core) while the other waited.  Instead the gate/up job converts its
   output unit by unit (HM_FF_UNIT values: whole blocks of every form) as the rows come in: each
   thread adds the rows it has finished to their unit's count, and the thread that completes a unit
   converts it.  Each unit's bytes are those of the whole row's conversion (block-local forms). */
typedef struct hm_ff_pipe {
    hm_ctx *c;
    int src, dst; /* forms: src from the F32 values (from_float), dst from src (prep) or -1 */
} hm_ff_pipe;

static void hm_ff_unit_rows(const void *arg, int64_t r0, int64_t r1) {
    const hm_ff_pipe *p = arg;
    hm_act *a = &p->c->act_ff;
    for (int64_t u = r0 / HM_FF_UNIT; u * HM_FF_UNIT < r1; u++) {
        const uint32_t k = (uint32_t)(HR_MIN(r1, (u + 1) * HM_FF_UNIT) - HR_MAX(r0, u * HM_FF_UNIT));
        /* acq_rel: the thread that completes the unit sees the other's values */
        if (atomic_fetch_add_explicit(&p->c->ff_units[u], k, memory_order_acq_rel) + k != HM_FF_UNIT) continue;
        const hq_traits *ts = hq_get_traits(hm_act_types[p->src]);
        uint8_t *q = a->q[p->src] + (size_t)u * hq_row_size(hm_act_types[p->src], HM_FF_UNIT);
        ts->from_float(a->f32 + u * HM_FF_UNIT, q, HM_FF_UNIT);
        if (p->dst >= 0) {
            const hq_traits *td = hq_get_traits(hm_act_types[p->dst]);
            td->prep(a->q[p->dst] + (size_t)u * td->prep_size(HM_FF_UNIT), q, HM_FF_UNIT);
        }
    }
}

/* whether ffn_down's form of act_ff (set to c->gate, one token) can be made by hm_ff_unit_rows: sets
   up p and the unit counts */
static bool hm_ff_pipe_init(hm_ctx *c, const hm_tensor *wd, hm_ff_pipe *p) {
    if (!c->ff_units) return false;
    const int ai = hm_act_for(wd);
    *p = (hm_ff_pipe){c, ai, -1};
    if (ai >= HM_ACT_PREP) { /* prepared forms made of whole units' forms: K-quant super-blocks, x4v units */
        const int vt = hq_get_traits(hm_act_types[ai])->vec_dot_type;
        if (vt != HQ_TYPE_Q8_K && !(vt == HQ_TYPE_Q8_0 && hq_x4v_fits(c->F))) return false;
        p->src = hm_act_index(vt), p->dst = ai;
    } else if (ai == HM_ACT_F32 || HM_FF_UNIT % hq_get_traits(hm_act_types[ai])->blck_size) {
        return false;
    }
    if (!c->act_ff.q[p->src] || (p->dst >= 0 && !c->act_ff.q[p->dst])) return false;
    memset((void *)c->ff_units, 0, sizeof *c->ff_units * (size_t)(c->F / HM_FF_UNIT));
    return true;
}

/* after the gate/up job: the forms made are act_ff's copies */
static void hm_ff_pipe_done(const hm_ff_pipe *p) {
    hm_act *a = &p->c->act_ff;
    a->q_row[p->src] = hq_row_size(hm_act_types[p->src], a->dim);
    a->valid[p->src] = true;
    if (p->dst >= 0) {
        a->q_row[p->dst] = hq_get_traits(hm_act_types[p->dst])->prep_size(a->dim);
        a->valid[p->dst] = true;
    }
}

/* o = FFN block output (this share's partial sum) for xn = rmsnorm(x) * ffn_norm:
   Wd (silu(Wg xn) * Wu xn) */
static void hm_ffn_block(hm_ctx *c, const hm_layer *L, int n) {
    if (c->F == 0) { /* no FFN neurons in this share */
        memset(c->o, 0, (size_t)n * c->m->hp.n_embd * sizeof(float));
        return;
    }
    hm_act_set(&c->act_in, c->xn, n, c->m->hp.n_embd);
    hm_act_set(&c->act_ff, c->gate, n, c->F);
    const hm_tensor *wgu[] = {&L->w_gate, &L->w_up};
    float *ogu[] = {c->gate, c->up};
    hm_ff_pipe pipe;
    const bool piped = n == 1 && hm_ff_pipe_init(c, &L->w_down, &pipe);
    const hm_mm_hooks convert = {.rows = hm_ff_unit_rows, .arg = &pipe};
    hm_matmul(c, &c->act_in, wgu, ogu, 2, true, piped ? &convert : NULL); /* gate = silu(gate) * up, row by row */
    if (piped) hm_ff_pipe_done(&pipe);
    const hm_tensor *wd[] = {&L->w_down};
    float *od[] = {c->o};
    hm_matmul(c, &c->act_ff, wd, od, 1, false, NULL);
}

int hm_ctx_n_windows(const hm_ctx *c) { return c->shard.n_windows; }

int hm_eval(hm_ctx *c, const hm_batch *b, hr_err *err) {
    if (c->shard.n_windows != 1)
        return hr_fail(err, HR_EINVAL, "a shard of %d windows is run window by window (hm_eval_window)",
                       c->shard.n_windows);
    return hm_eval_window(c, 0, b, err);
}

int hm_eval_window(hm_ctx *c, int w, const hm_batch *b, hr_err *err) {
    const hm_model *m = c->m;
    const hm_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd;
    const int n = b->n;
    const int32_t pos0 = b->pos;
    memset(&c->t, 0, sizeof c->t);
    int64_t t_start = hr_time_ns();
    if (n < 1 || n > c->p.n_batch)
        return hr_fail(err, HR_EINVAL, "batch of %d tokens outside [1, %d]", n, c->p.n_batch);
    if (pos0 < 0 || (int64_t)pos0 + n > c->n_ctx)
        return hr_fail(err, HR_ERANGE, "positions %d..%d exceed the context length %d", pos0, pos0 + n - 1, c->n_ctx);
    if (w < 0 || w >= c->shard.n_windows)
        return hr_fail(err, HR_EINVAL, "window %d of a shard of %d", w, c->shard.n_windows);
    const hm_window win = c->shard.windows[w];
    bool first = c->shard.first && w == 0, last = c->shard.last && w == c->shard.n_windows - 1;

    /* input: token embeddings (first shard) or the previous stage's hidden states */
    if (first) {
        if (!b->tokens) return hr_fail(err, HR_EINVAL, "first shard needs token ids");
        const int rc = hm_embed(m, b->tokens, n, c->x, err);
        if (rc) return rc;
    } else {
        if (!b->embd) return hr_fail(err, HR_EINVAL, "non-first shard needs hidden states");
        memcpy(c->x, b->embd, (size_t)n * E * sizeof(float));
    }
    hm_rope_cache(c, n, pos0);

    for (int il = win.begin; il < win.end; il++) {
        int li = c->win_slot[w] + il - win.begin;
        const hm_layer *L = &c->L[li];
        /* attention rmsnorm (the residual add of the previous FFN is folded into op 1) */
        hm_rows(c, n, il == win.begin ? 0 : 1, L->attn_norm.data);
        hm_weights(c, il, HM_BLOCK_ATTN, HM_PHASE_BEGIN);
        hm_attention_block(c, L, li, n, pos0);
        hm_weights(c, il, HM_BLOCK_ATTN, HM_PHASE_END);
        if (hm_sync(c, il, HM_BLOCK_ATTN, c->o, n, err)) return err ? err->code : HR_ENET;
        /* ffn rmsnorm (with the attention residual x += o folded in) */
        hm_rows(c, n, 1, L->ffn_norm.data);
        hm_weights(c, il, HM_BLOCK_FFN, HM_PHASE_BEGIN);
        hm_ffn_block(c, L, n);
        hm_weights(c, il, HM_BLOCK_FFN, HM_PHASE_END);
        if (hm_sync(c, il, HM_BLOCK_FFN, c->o, n, err)) return err ? err->code : HR_ENET;
        /* FFN residual: folded into the next layer's norm, done here after the last layer */
        if (il == win.end - 1) hm_add(c->x, c->o, (int64_t)n * E);
    }

    if (!last) {
        if (b->embd_out) memcpy(b->embd_out, c->x, (size_t)n * E * sizeof(float));
        c->t.total_ns = hr_time_ns() - t_start;
        return 0;
    }
    /* final norm and output head, for the last token or all of them */
    int t0 = b->all_logits ? 0 : n - 1, cnt = b->all_logits ? n : 1;
    hm_weights(c, m->hp.n_layer, HM_BLOCK_OUTPUT, HM_PHASE_BEGIN);
    for (int t = t0; t < n; t++)
        hm_rmsnorm(c->xn + (t - t0) * E, c->x + (int64_t)t * E, m->output_norm.data, E, hp->rms_eps);
    if (b->logits) {
        hm_act_set(&c->act_in, c->xn, cnt, E);
        const hm_tensor *wout[] = {&m->output};
        float *olog[] = {b->logits};
        hm_matmul(c, &c->act_in, wout, olog, 1, false, NULL);
    }
    hm_weights(c, m->hp.n_layer, HM_BLOCK_OUTPUT, HM_PHASE_END);
    if (b->embd_out) memcpy(b->embd_out, c->x, (size_t)n * E * sizeof(float));
    c->t.total_ns = hr_time_ns() - t_start;
    return 0;
}
