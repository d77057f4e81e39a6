/* forward: the transformer forward pass over a shard — see model.h
 *
 * Per layer, for the n tokens of one hm_eval call:
 *   xn = rmsnorm(x) * attn_norm
 *   q, k, v = Wq xn, Wk xn, Wv xn (+ bias)  one parallel job for the three (matvec or GEMM tiles)
 *   q, k = per-head rmsnorm (qwen3); RoPE; k, v -> KV cache
 *   a = softmax(q K^T / sqrt(hd)) V          per (token, head), causal, one pass (online softmax)
 *   o = Wo a;  sync(o);  x += o
 *   xn = rmsnorm(x) * ffn_norm;  h = silu(Wg xn) * (Wu xn);  d = Wd h;  sync(d);  x += d
 * then (last shard) logits = Wout rmsnorm(x) * output_norm.
 * The numerics follow ggml's CPU backend where it matters for comparing logits: RMS sums and softmax
 * sums in double, activations quantized to the weight type's vec_dot_type (matmul.c), attention as
 * llama.cpp's CPU flash attention (attention.c).
 */
#include "model-impl.h"

#include <stdlib.h>

/* ---- context: the shard's weight views, KV cache and scratch ------------------------------------ */

hm_ctx_params hm_ctx_default_params(void) {
    hm_ctx_params p = {.n_ctx = 0, .n_seq = 1, .n_batch = 512, .n_threads = 0, .kv_type = HQ_TYPE_F16, .pool = NULL};
    return p;
}

int32_t hm_ctx_resolve_n_ctx(const hm_hparams *hp, int32_t n_ctx) {
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

/* KV cache + scratch of a context of these parameters over n_layers layers and n_kv KV heads. base: only what it
   takes beside its cache's positions, one position's KV and the whole scratch (sized for the context's batch,
   however few positions are in use) */
static uint64_t hm_ctx_bytes_need(const hm_hparams *hp, int64_t n_layers, int64_t n_kv, const hm_ctx_params *p,
                                  bool base) {
    const int32_t n_ctx = hm_ctx_resolve_n_ctx(hp, p->n_ctx), n_pos = base ? 1 : n_ctx;
    int64_t B = p->n_batch > 0 ? p->n_batch : 512, n_seq = p->n_seq > 0 ? p->n_seq : 1;
    B = HR_MIN(B, (int64_t)n_ctx);   /* as hm_ctx_create clamps it: a batch never holds more than the cache */
    uint64_t kv = 2ull * (uint64_t)n_layers * hm_kv_layer_bytes(hp, n_pos, p->kv_type) / (uint64_t)hp->n_head_kv *
                  (uint64_t)n_kv * (uint64_t)n_seq;
    int64_t Dq = (int64_t)hp->n_head * hp->head_dim, Dkv = (int64_t)hp->n_head_kv * hp->head_dim;
    uint64_t scratch = (uint64_t)B * (3 * hp->n_embd + 2 * Dq + 2 * Dkv + 2 * hp->n_ff + hp->head_dim) * 4;
    scratch += (uint64_t)B * hm_max_dim(hp) * 4 * 3;   /* quantized and prepared copies (upper bound) */
    scratch += (uint64_t)B * 9 + (uint64_t)n_seq * 4;   /* the batch's sequences, positions, paths */
    int nt = p->n_threads > 0 ? p->n_threads : hr_physical_cores();
    scratch += (uint64_t)nt * ((uint64_t)n_pos * 8 + hp->head_dim * 4 + 256);
    return kv + scratch;
}

uint64_t hm_ctx_bytes_estimate(const hm_hparams *hp, const hm_ctx_params *p) {
    return hm_ctx_bytes_need(hp, hp->n_layer, hp->n_head_kv, p, false);
}

static uint64_t hm_ctx_shard_need(const hm_hparams *hp, const hm_shard *s, const hm_ctx_params *p, bool base) {
    int32_t kv_end = s->kv_end < 0 ? hp->n_head_kv : s->kv_end;
    return hm_ctx_bytes_need(hp, hm_shard_n_layers(s), HR_MAX(kv_end - s->kv_begin, 0), p, base);
}

uint64_t hm_ctx_bytes_for_shard(const hm_hparams *hp, const hm_shard *s, const hm_ctx_params *p) {
    return hm_ctx_shard_need(hp, s, p, false);
}

uint64_t hm_ctx_base_bytes_for_shard(const hm_hparams *hp, const hm_shard *s, const hm_ctx_params *p) {
    return hm_ctx_shard_need(hp, s, p, true);
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
    hr_free_aligned(c->tseq);
    hr_free_aligned(c->tpos);
    hr_free_aligned(c->tf32);
    hr_free_aligned(c->seq_n);
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
    c->n_ctx = hm_ctx_resolve_n_ctx(hp, c->p.n_ctx);
    if (c->n_ctx < 1 || c->n_ctx > (1 << 24)) { hr_fail(err, HR_EINVAL, "context length %d out of range", c->n_ctx); goto err; }
    c->p.n_ctx = c->n_ctx;
    if (c->p.n_batch > c->n_ctx) c->p.n_batch = c->n_ctx;
    if (c->p.n_seq <= 0) c->p.n_seq = 1;
    if (c->p.n_seq > HM_MAX_SEQ) { hr_fail(err, HR_EINVAL, "%d sequences (at most %d)", c->p.n_seq, HM_MAX_SEQ); goto err; }
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
    size_t kvb = (size_t)c->p.n_seq * (size_t)c->n_ctx * (size_t)Dkv * c->kv_esize;
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
    if (!(c->tseq = hm_ctx_alloc(c, (size_t)B * 4)) || !(c->tpos = hm_ctx_alloc(c, (size_t)B * 4)) ||
        !(c->tf32 = hm_ctx_alloc(c, (size_t)B)) || !(c->seq_n = hm_ctx_alloc(c, (size_t)c->p.n_seq * 4)))
        goto oom;
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
int32_t hm_ctx_n_seq(const hm_ctx *c) { return c->p.n_seq; }

int hm_kv_seq_copy(hm_ctx *c, int32_t src, int32_t dst, int32_t n, hr_err *err) {
    if (src < 0 || dst < 0 || src >= c->p.n_seq || dst >= c->p.n_seq || n < 0 || n > c->n_ctx)
        return hr_fail(err, HR_EINVAL, "KV copy of %d positions from sequence %d to %d (of %d)", n, src, dst,
                       c->p.n_seq);
    if (src == dst || n == 0) return 0;
    const size_t bytes = (size_t)n * (size_t)c->m->hp.head_dim * c->kv_esize;
    for (int li = 0; li < c->nl; li++)
        for (int h = 0; h < c->nkv; h++) {
            memcpy(c->k_cache[li] + hm_kv_off(c, dst, h, 0), c->k_cache[li] + hm_kv_off(c, src, h, 0), bytes);
            memcpy(c->v_cache[li] + hm_kv_off(c, dst, h, 0), c->v_cache[li] + hm_kv_off(c, src, h, 0), bytes);
        }
    return 0;
}
hm_timings hm_ctx_timings(const hm_ctx *c) { return c->t; }

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

/* xn = rmsnorm(x) * w for the n tokens (op 1: after x += o) */
static void hm_rows(hm_ctx *c, int n, int op, const float *w) {
    int64_t t0 = hr_time_ns();
    hm_rows_job j = {c, n, op, w};
    if (n == 1) hm_rows_worker(&j, 0, 1);
    else hr_pool_run(c->pool, hm_rows_worker, &j);
    c->t.other_ns += hr_time_ns() - t0;
}

/* the residency manager's hook around a block's weights, timed */
static void hm_weights(hm_ctx *c, int layer, enum hm_block b, enum hm_phase ph) {
    if (!c->shard.weights) return;
    int64_t t0 = hr_time_ns();
    c->shard.weights(c->shard.weights_user, layer, b, ph);
    c->t.weights_ns += hr_time_ns() - t0;
}

/* the shard's sync of a block's partial output (an all-reduce under tensor parallelism), timed */
static int hm_sync(hm_ctx *c, int layer, enum hm_block b, float *x, int n, hr_err *err) {
    if (!c->shard.sync) return 0;
    int64_t t0 = hr_time_ns();
    int rc = c->shard.sync(c->shard.sync_user, layer, b, x, n, c->m->hp.n_embd);
    c->t.sync_ns += hr_time_ns() - t0;
    if (rc) return hr_fail(err, rc, "layer %d %s sync failed: %s", layer, b == HM_BLOCK_ATTN ? "attention" : "FFN",
                           hr_strerror(rc));
    return 0;
}

/* o = attention block output (this share's partial sum) for xn = rmsnorm(x) * attn_norm */
static void hm_attention_block(hm_ctx *c, const hm_layer *L, int li, int n) {
    if (c->nkv == 0) { /* no attention heads in this share: a zero partial */
        memset(c->o, 0, (size_t)n * c->m->hp.n_embd * sizeof(float));
        return;
    }
    /* q, k, v projections */
    hm_act_set(&c->act_in, c->xn, n, c->m->hp.n_embd);
    const hm_tensor *wqkv[] = {&L->wq, &L->wk, &L->wv};
    float *oqkv[] = {c->q, c->k, c->v};
    hm_att_job aj = {c, li, n};
    const hm_mm_hooks warm = {.then = hm_att_warm, .arg = &aj};
    hm_matmul(c, &c->act_in, wqkv, oqkv, 3, false, n == 1 ? &warm : NULL);
    /* biases, q/k norm, RoPE, KV store */
    int64_t t0 = hr_time_ns();
    hm_qk_job qj = {c, L, li, n};
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

/* o = FFN block output (this share's partial sum) for xn = rmsnorm(x) * ffn_norm:
   Wd (silu(Wg xn) * Wu xn) */
static void hm_ffn_block(hm_ctx *c, const hm_layer *L, int il, int n) {
    if (c->F == 0) { /* no FFN neurons in this share */
        memset(c->o, 0, (size_t)n * c->m->hp.n_embd * sizeof(float));
        if (c->shard.ffn) c->shard.ffn(c->shard.ffn_user, il, true, c->xn, NULL, 0, c->o, n);
        return;
    }
    /* gate and up projections, gate = silu(gate) * up */
    hm_act_set(&c->act_in, c->xn, n, c->m->hp.n_embd);
    hm_act_set(&c->act_ff, c->gate, n, c->F);
    hm_ff_gate_up(c, L, n);
    if (c->shard.ffn) { /* the hook may change the activations: their converted forms are made again */
        c->shard.ffn(c->shard.ffn_user, il, false, c->xn, c->gate, c->F, NULL, n);
        hm_act_set(&c->act_ff, c->gate, n, c->F);
    }
    /* down projection */
    const hm_tensor *wd[] = {&L->w_down};
    float *od[] = {c->o};
    hm_matmul(c, &c->act_ff, wd, od, 1, false, NULL);
    if (c->shard.ffn) c->shard.ffn(c->shard.ffn_user, il, true, c->xn, NULL, c->F, c->o, n);
}

int hm_ctx_n_windows(const hm_ctx *c) { return c->shard.n_windows; }

/* The batch's tokens' sequences and positions into tseq / tpos, checked, and each token's attention
   path into tf32: F32 where its sequence has HM_KV_TILE tokens or more in the batch (one sequence: the
   whole batch, as before there were several), so that what one sequence's tokens compute never
   depends on the other sequences' (attention.c). */
static int hm_batch_setup(hm_ctx *c, const hm_batch *b, hr_err *err) {
    const int n = b->n;
    const int32_t n_seq = c->p.n_seq;
    int32_t *cnt = c->seq_n;
    memset(cnt, 0, sizeof *cnt * (size_t)n_seq);
    for (int i = 0; i < n; i++) {
        const int32_t s = b->seq ? b->seq[i] : 0;
        const int64_t p = b->pos_of ? b->pos_of[i] : (int64_t)b->pos + i;
        if (s < 0 || s >= n_seq) return hr_fail(err, HR_EINVAL, "token %d: sequence %d of %d", i, s, n_seq);
        if (p < 0 || p >= c->n_ctx)
            return hr_fail(err, HR_ERANGE, "token %d: position %lld outside the context length %d", i, (long long)p,
                           c->n_ctx);
        c->tseq[i] = s, c->tpos[i] = (int32_t)p;
        cnt[s]++;
    }
    for (int i = 0; i < n; i++) c->tf32[i] = c->kv_type == HQ_TYPE_F32 || cnt[c->tseq[i]] >= HM_KV_TILE;
    /* a sequence's tokens are consecutive positions in ascending order; seq_n now holds the index of
       each sequence's last token so far (-1: none yet) */
    memset(cnt, 0xff, sizeof *cnt * (size_t)n_seq);
    for (int i = 0; i < n; i++) {
        const int32_t s = c->tseq[i], last = cnt[s];
        if (last >= 0 && c->tpos[i] != c->tpos[last] + 1)
            return hr_fail(err, HR_EINVAL, "token %d of sequence %d at position %d, after position %d", i, s,
                           c->tpos[i], c->tpos[last]);
        cnt[s] = i;
    }
    return 0;
}

int hm_batch_check(hm_ctx *c, const hm_batch *b, hr_err *err) {
    if (b->n < 1 || b->n > c->p.n_batch)
        return hr_fail(err, HR_EINVAL, "batch of %d tokens outside [1, %d]", b->n, c->p.n_batch);
    return hm_batch_setup(c, b, err);
}

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
    memset(&c->t, 0, sizeof c->t);
    int64_t t_start = hr_time_ns();
    if (w < 0 || w >= c->shard.n_windows)
        return hr_fail(err, HR_EINVAL, "window %d of a shard of %d", w, c->shard.n_windows);
    const int rc = hm_batch_check(c, b, err);
    if (rc) return rc;
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
    /* the RoPE angles of the batch's positions, for every layer */
    hm_rope_cache(c, n);

    for (int il = win.begin; il < win.end; il++) {
        int li = c->win_slot[w] + il - win.begin;
        const hm_layer *L = &c->L[li];
        /* attention rmsnorm (the residual add of the previous FFN is folded into op 1) */
        hm_rows(c, n, il == win.begin ? 0 : 1, L->attn_norm.data);
        hm_weights(c, il, HM_BLOCK_ATTN, HM_PHASE_BEGIN);
        hm_attention_block(c, L, li, n);
        hm_weights(c, il, HM_BLOCK_ATTN, HM_PHASE_END);
        if (c->shard.probe && c->nkv)
            c->shard.probe(c->shard.probe_user, il, HM_BLOCK_ATTN, c->xn, c->att, c->Dq, c->o, n, (int)E);
        if (hm_sync(c, il, HM_BLOCK_ATTN, c->o, n, err)) return err ? err->code : HR_ENET;
        /* ffn rmsnorm (with the attention residual x += o folded in) */
        hm_rows(c, n, 1, L->ffn_norm.data);
        hm_weights(c, il, HM_BLOCK_FFN, HM_PHASE_BEGIN);
        hm_ffn_block(c, L, il, n);
        hm_weights(c, il, HM_BLOCK_FFN, HM_PHASE_END);
        if (c->shard.probe && c->F)
            c->shard.probe(c->shard.probe_user, il, HM_BLOCK_FFN, c->xn, c->gate, c->F, c->o, n, (int)E);
        if (hm_sync(c, il, HM_BLOCK_FFN, c->o, n, err)) return err ? err->code : HR_ENET;
        /* FFN residual: folded into the next layer's norm, done here after the last layer */
        if (il == win.end - 1) hm_add(c->x, c->o, (int64_t)n * E);
    }

    if (!last) {
        if (b->embd_out) memcpy(b->embd_out, c->x, (size_t)n * E * sizeof(float));
        c->t.total_ns = hr_time_ns() - t_start;
        return 0;
    }
    /* final norm and output head, for the wanted tokens (out), or the last token or all of them; the head
       part by part (hm_output_parts), each its own block for the weights hook, the norm with part 0 */
    int cnt = 0;
    for (int k = 0, np = hm_output_parts(m); k < np; k++) {
        hm_weights(c, m->hp.n_layer + k, HM_BLOCK_OUTPUT, HM_PHASE_BEGIN);
        if (k == 0) {
            for (int t = 0; t < n; t++)
                if (b->out ? b->out[t] != 0 : b->all_logits || t == n - 1)
                    hm_rmsnorm(c->xn + (int64_t)cnt++ * E, c->x + (int64_t)t * E, m->output_norm.data, E, hp->rms_eps);
            if (b->logits && cnt > 0) hm_act_set(&c->act_in, c->xn, cnt, E);
        }
        if (b->logits && cnt > 0) {
            int64_t r[2];
            hm_output_part_rows(m, k, r);
            hm_matmul_rows(c, &c->act_in, &m->output, r[0], r[1], b->logits);
        }
        hm_weights(c, m->hp.n_layer + k, HM_BLOCK_OUTPUT, HM_PHASE_END);
    }
    if (b->embd_out) memcpy(b->embd_out, c->x, (size_t)n * E * sizeof(float));
    c->t.total_ns = hr_time_ns() - t_start;
    return 0;
}
