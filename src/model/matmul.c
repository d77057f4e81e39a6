/* matmul: activation forms, the matmul job and decode's work scheduler, the FFN pipe — see model-impl.h
 *
 * A weight reads its activations in one form (its vec_dot_type, or its packed kernel's prepared
 * form); hm_act keeps one copy per form, made on first use.  hm_matmul runs up to three weights over
 * the same activations as one parallel job: static row shares for a batch, speed-weighted spans that
 * threads claim from (and steal from) in a decode.
 */
#include "model-impl.h"

#include <stdlib.h>

#define HM_ROW_CHUNK 16   /* rows per work unit: a multiple of every tile kernel's row step, whole bands */
#define HM_MAX_SPLIT 64   /* decode splits rows by measured speed up to this many threads (evenly above) */
#define HM_DEC_MAX_N 16   /* "decode": jobs of up to this many tokens (a step of several sequences' next tokens) */
static_assert(HM_ROW_CHUNK % HQ_BAND == 0, "a work unit of a packed weight is whole bands (quant.h)");

/* ---- activation forms ---------------------------------------------------------------------------- */

/* each form's type (a prepared form: the packed weight type it is made for) */
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

/* allocates one buffer per activation form some weight of the shard needs: its vec_dot_type, and the
   prepared form where the weight can be packed (whether it is may be decided after this) */
int hm_act_init(hm_ctx *c, hm_act *a, const hm_tensor *const *ws, int nw, int64_t dim) {
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

/* ---- matmul: out[n][rows] = W · act, several weights in one parallel job ------------------------ */

typedef struct hm_mm_item {
    const hm_tensor *w;
    const uint8_t *y;   /* activations in w's vec_dot_type */
    size_t y_row;
    float *out;         /* [n][ld] */
    size_t ld;          /* out's row stride (w->ne1, or more for a view of some rows: hm_matmul_rows) */
} hm_mm_item;

typedef struct hm_mm_job {
    hm_mm_item items[3];
    int n_items;
    int n;              /* tokens */
    double *speed;      /* decode: the ctx's dec_speed, which each thread updates for itself */
    hq_silu_mul_fn glu; /* if set: items 0 and 1 are the gate and up projections (same rows), computed
                           together row range by row range, each range finished as gate = silu(gate) * up */
    hm_mm_span *span;   /* decode (n <= HM_DEC_MAX_N, nth <= HM_MAX_SPLIT): [nth]; NULL: static shares */
    const struct hm_mm_hooks *hooks;
} hm_mm_job;


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
            gemm((int)w->ne0, m->out + r, m->ld, w->data + r * w->row_bytes, w->row_bytes, nr, m->y,
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

static void hm_matmul_ld(hm_ctx *c, hm_act *a, const hm_tensor *const *ws, float *const *outs, const size_t *ld,
                         int nw, bool glu, const hm_mm_hooks *hooks) {
    int64_t t0 = hr_time_ns();
    hm_mm_job j = {.n_items = nw, .n = a->n, .speed = c->dec_speed, .glu = glu ? hq_get_silu_mul(false) : NULL, .hooks = hooks};
    for (int i = 0; i < nw; i++) {
        int ai = hm_act_for(ws[i]);
        j.items[i].w = ws[i];
        j.items[i].y = hm_act_get(c, a, ai, &j.items[i].y_row);
        j.items[i].out = outs[i];
        j.items[i].ld = ld ? ld[i] : (size_t)ws[i]->ne1;
    }
    /* a decode step of one sequence or of several (continuous batching): the same weight stream, and
       the same threads' speeds; its rows cost more per byte, not differently from one thread to the other */
    if (a->n <= HM_DEC_MAX_N && c->p.n_threads <= HM_MAX_SPLIT) {
        j.span = c->dec_span;
        hm_dec_spans(&j, c->dec_speed, c->p.n_threads, j.span);
    }
    hr_pool_run(c->pool, hm_mm_worker, &j);
    c->t.matmul_ns += hr_time_ns() - t0;
}

void hm_matmul(hm_ctx *c, hm_act *a, const hm_tensor *const *ws, float *const *outs, int nw, bool glu,
               const hm_mm_hooks *hooks) {
    hm_matmul_ld(c, a, ws, outs, NULL, nw, glu, hooks);
}

void hm_matmul_rows(hm_ctx *c, hm_act *a, const hm_tensor *w, int64_t r0, int64_t r1, float *out) {
    if (r1 <= r0) return;
    hm_tensor v = *w; /* a view of the rows: the same bytes per row in either layout, bands whole from r0 on */
    v.ne1 = r1 - r0;
    v.data = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    v.map = (const uint8_t *)w->map + (size_t)r0 * w->row_bytes;
    const hm_tensor *ws[] = {&v};
    float *outs[] = {out + r0};
    const size_t ld[] = {(size_t)w->ne1};
    hm_matmul_ld(c, a, ws, outs, ld, 1, false, NULL);
}

/* ---- the FFN pipe ------------------------------------------------------------------------------- */

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

void hm_ff_gate_up(hm_ctx *c, const hm_layer *L, int n) {
    const hm_tensor *wgu[] = {&L->w_gate, &L->w_up};
    float *ogu[] = {c->gate, c->up};
    hm_ff_pipe pipe;
    const bool piped = n == 1 && hm_ff_pipe_init(c, &L->w_down, &pipe);
    const hm_mm_hooks convert = {.rows = hm_ff_unit_rows, .arg = &pipe};
    hm_matmul(c, &c->act_in, wgu, ogu, 2, true, piped ? &convert : NULL); /* gate = silu(gate) * up, row by row */
    if (piped) hm_ff_pipe_done(&pipe);
}
