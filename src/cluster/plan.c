/* cluster/plan: shares -> unit ranges, the model hash, the matvec benchmark — see cluster.h */
#include "cluster-impl.h"

#include "base/pool.h"
#include "quant/quant.h"

#include <math.h>
#include <stdlib.h>

static int64_t hc_gcd(int64_t a, int64_t b) {
    while (b) { int64_t t = a % b; a = b; b = t; }
    return a;
}
static int64_t hc_lcm(int64_t a, int64_t b) { return a / hc_gcd(a, b) * b; }

/* Splits n_groups among devices in proportion to w (sum 1) by largest remainder; ties go to the
   lower index, so the result depends only on the inputs. */
static void hc_deal(int64_t n_groups, const double *w, int k, int64_t *count) {
    double frac[HC_MAX_DEVICES];
    int64_t given = 0;
    for (int i = 0; i < k; i++) {
        double q = w[i] * (double)n_groups;
        count[i] = (int64_t)floor(q);
        if (count[i] > n_groups) count[i] = n_groups;
        frac[i] = q - (double)count[i];
        given += count[i];
    }
    while (given < n_groups) {
        int best = -1;
        for (int i = 0; i < k; i++)
            if (w[i] > 0 && (best < 0 || frac[i] > frac[best])) best = i;
        count[best]++;
        frac[best] = -1;  /* each device gets at most one extra group */
        given++;
    }
    while (given > n_groups) { /* floating-point excess (cannot happen with sum 1, kept for safety) */
        int worst = -1;
        for (int i = 0; i < k; i++)
            if (count[i] > 0 && (worst < 0 || frac[i] < frac[worst])) worst = i;
        count[worst]--;
        given--;
    }
}

int hc_plan_make(const hm_model *m, const double *weights, int n, hc_plan *out, hr_err *err) {
    const hm_hparams *hp = &m->hp;
    memset(out, 0, sizeof *out);
    if (n < 1 || n > HC_MAX_DEVICES) return hr_fail(err, HR_ERANGE, "%d devices: must be 1..%d", n, HC_MAX_DEVICES);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        if (!(weights[i] >= 0) || !isfinite(weights[i])) return hr_fail(err, HR_EINVAL, "share %d is not a number >= 0", i);
        sum += weights[i];
    }
    if (!(sum > 0)) return hr_fail(err, HR_EINVAL, "all shares are zero");
    out->n_devices = n;
    for (int i = 0; i < n; i++) out->weight[i] = weights[i] / sum;

    /* group sizes: whole blocks of every layer's attn_output / ffn_down columns */
    int64_t unit_cols = (int64_t)(hp->n_head / hp->n_head_kv) * hp->head_dim;
    int64_t wo_blk = 1, down_blk = 1;
    for (int il = 0; il < hp->n_layer; il++) {
        const hq_traits *to = hq_get_traits(m->layers[il].wo.type), *td = hq_get_traits(m->layers[il].w_down.type);
        if (!to || !td) return hr_fail(err, HR_EUNSUPPORTED, "layer %d: unknown weight type", il);
        wo_blk = hc_lcm(wo_blk, to->blck_size);
        down_blk = hc_lcm(down_blk, td->blck_size);
    }
    int64_t ga = hc_lcm(unit_cols, wo_blk) / unit_cols;
    out->att_group = (int32_t)ga;
    out->ff_group = (int32_t)down_blk;
    if (hp->n_head_kv % ga != 0 || hp->n_ff % down_blk != 0)
        return hr_fail(err, HR_EUNSUPPORTED, "the model's %d KV heads / %d FFN neurons cannot be cut on block "
                       "boundaries (groups of %lld / %lld)", hp->n_head_kv, hp->n_ff, (long long)ga, (long long)down_blk);

    int64_t ca[HC_MAX_DEVICES], cf[HC_MAX_DEVICES];
    hc_deal(hp->n_head_kv / ga, out->weight, n, ca);
    hc_deal(hp->n_ff / down_blk, out->weight, n, cf);
    int64_t a = 0, f = 0;
    for (int i = 0; i < n; i++) {
        hc_share *s = &out->dev[i];
        s->kv_begin = (int32_t)(a * ga);
        a += ca[i];
        s->kv_end = (int32_t)(a * ga);
        s->ff_begin = (int32_t)(f * down_blk);
        f += cf[i];
        s->ff_end = (int32_t)(f * down_blk);
    }
    HR_ASSERT(out->dev[n - 1].kv_end == hp->n_head_kv && out->dev[n - 1].ff_end == hp->n_ff);
    return 0;
}

static uint64_t hc_tensor_bytes(const hm_tensor *t) { return t->data ? (uint64_t)t->row_bytes * (uint64_t)t->ne1 : 0; }

int hc_plan_balance(const hm_model *m, const double *speed, int n, double *share, double *head_frac, hr_err *err) {
    if (n < 1 || n > HC_MAX_DEVICES) return hr_fail(err, HR_ERANGE, "%d devices: must be 1..%d", n, HC_MAX_DEVICES);
    double S = 0;
    for (int i = 0; i < n; i++) {
        if (!(speed[i] > 0) || !isfinite(speed[i])) return hr_fail(err, HR_EINVAL, "device %d: speed must be > 0", i);
        S += speed[i];
    }
    /* a decode step reads every weight once: bytes stand for time on a memory-bound device */
    uint64_t wl = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const hm_layer *L = &m->layers[il];
        const hm_tensor *ts[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->bq, &L->bk, &L->bv, &L->q_norm,
                                 &L->k_norm, &L->wo, &L->ffn_norm, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < HR_ARRAY_LEN(ts); i++) wl += hc_tensor_bytes(ts[i]);
    }
    double WL = (double)wl, WO = (double)(hc_tensor_bytes(&m->output) + hc_tensor_bytes(&m->output_norm));
    if (head_frac) *head_frac = WO / (WL + WO);
    /* everyone finishes at T = (WL + WO) / S: the head's layer share is what its speed leaves after
       the output head; if that is nothing, the workers split the layers among themselves */
    double T = (WL + WO) / S;
    double h = (T * speed[0] - WO) / WL;
    if (n == 1 || !(WL > 0)) h = 1;
    if (h < 0) h = 0;
    double rest = S - speed[0];
    share[0] = h;
    for (int i = 1; i < n; i++) share[i] = rest > 0 ? (1 - h) * speed[i] / rest : 0;
    return 0;
}

uint64_t hc_model_hash(const gguf_ctx *g) {
    /* the header, metadata and tensor directory name the model and where every byte of it lies;
       hashing the tensor data too would cost a full read of a many-GB file on every run */
    uint64_t size = gguf_file_size(g);
    uint64_t head = gguf_data_offset(g);
    if (head > size) head = size;
    return hr_hash64(gguf_base(g), (size_t)head, size ^ 0x68656172746821ULL);
}

/* ---- benchmark ---- */

typedef struct hc_bench_job {
    const uint8_t *w;       /* [rows][row_bytes] Q8_0 */
    const uint8_t *x;       /* one Q8_0 row */
    float *y;
    int64_t rows, cols;
    size_t row_bytes;
} hc_bench_job;

static void hc_bench_worker(void *arg, int ith, int nth) {
    hc_bench_job *j = arg;
    const hq_traits *tr = hq_get_traits(HQ_TYPE_Q8_0);
    int64_t r0, r1;
    hr_split(j->rows, ith, nth, 16, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) tr->vec_dot((int)j->cols, &j->y[r], j->w + (size_t)r * j->row_bytes, j->x);
}

double hc_bench_matvec(int n_threads, int ms, hr_err *err) {
    const int64_t cols = 4096;
    const size_t row_bytes = hq_row_size(HQ_TYPE_Q8_0, cols);
    const int64_t rows = (int64_t)((32u << 20) / row_bytes);
    if (n_threads <= 0) n_threads = hr_physical_cores();
    if (ms <= 0) ms = 300;
    uint8_t *w = hr_alloc_aligned((size_t)rows * row_bytes, 64);
    uint8_t *x = hr_alloc_aligned(row_bytes, 64);
    float *y = hr_alloc_aligned((size_t)rows * sizeof(float), 64);
    hr_pool *pool = NULL;
    double gbps = -1;
    if (!w || !x || !y) { hr_fail(err, HR_ENOMEM, "benchmark: out of memory"); goto done; }
    if (!(pool = hr_pool_create(n_threads, err))) goto done;
    /* random quants with a small fp16 scale: realistic values, no NaNs */
    uint64_t s = 0x9e3779b97f4a7c15ULL;
    for (size_t i = 0; i < (size_t)rows * row_bytes; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        w[i] = (uint8_t)s;
    }
    hr_fp16 d = hr_fp32_to_fp16(0.01f);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < cols / 32; b++) memcpy(w + (size_t)r * row_bytes + (size_t)b * 34, &d, 2);
    for (int64_t b = 0; b < cols / 32; b++) memcpy(x + (size_t)b * 34, &d, 2);
    hc_bench_job j = {w, x, y, rows, cols, row_bytes};
    hr_pool_run(pool, hc_bench_worker, &j); /* warm-up: page in */
    int64_t t0 = hr_time_ns(), t1 = t0, budget = (int64_t)ms * 1000000;
    int64_t passes = 0;
    while (t1 - t0 < budget || passes < 2) {
        hr_pool_run(pool, hc_bench_worker, &j);
        passes++;
        t1 = hr_time_ns();
    }
    gbps = (double)passes * (double)rows * (double)row_bytes / (double)(t1 - t0);
done:
    hr_pool_free(pool);
    hr_free_aligned(w);
    hr_free_aligned(x);
    hr_free_aligned(y);
    return gbps;
}

/* ---- pipeline ---------------------------------------------------------------------------------- */

/* appends window [b, e) of device d to the pass */
static int hc_pp_add(hc_pp_plan *p, int d, int b, int e, hr_err *err) {
    if (p->n_win[d] >= HM_MAX_WINDOWS)
        return hr_fail(err, HR_ERANGE, "device %d would get more than %d windows: use larger windows", d, HM_MAX_WINDOWS);
    if (p->n_steps >= HC_MAX_STEPS) return hr_fail(err, HR_ERANGE, "more than %d windows per pass", HC_MAX_STEPS);
    p->win[d][p->n_win[d]++] = (hm_window){b, e};
    p->step_dev[p->n_steps++] = (uint8_t)d;
    return 0;
}

int hc_pp_plan_make(int n_layer, const int *sizes_in, int k, hc_pp_plan *out, hr_err *err) {
    memset(out, 0, sizeof *out);
    if (k < 2 || k > HC_MAX_DEVICES) return hr_fail(err, HR_ERANGE, "%d devices: a pipeline needs 2..%d", k, HC_MAX_DEVICES);
    if (n_layer < 1 || n_layer > HC_PP_MAX_LAYERS)
        return hr_fail(err, HR_EINVAL, "a model of %d layers (a pipeline places 1..%d)", n_layer, HC_PP_MAX_LAYERS);
    int sizes[HC_MAX_DEVICES], sum = 0;
    for (int d = 0; d < k; d++) {
        /* default: one round, the head (which also runs the output head) takes the fewest layers */
        sizes[d] = sizes_in ? sizes_in[d] : n_layer / k + (d >= k - n_layer % k ? 1 : 0);
        if (sizes[d] < 0) return hr_fail(err, HR_EINVAL, "device %d: a window of %d layers", d, sizes[d]);
        sum += sizes[d];
    }
    if (sum == 0) return hr_fail(err, HR_EINVAL, "every window size is 0: no device runs a layer");
    out->n_devices = k;
    out->n_layer = n_layer;
    if (sizes[0] == 0 && hc_pp_add(out, 0, 0, 0, err)) return err ? err->code : HR_ERANGE;
    int last = 0;
    for (int l = 0, d = 0; l < n_layer; d = (d + 1) % k) {
        if (sizes[d] == 0) continue;
        int e = HR_MIN(l + sizes[d], n_layer);
        if (hc_pp_add(out, d, l, e, err)) return err ? err->code : HR_ERANGE;
        last = d;
        l = e;
    }
    if (last != 0 && hc_pp_add(out, 0, n_layer, n_layer, err)) return err ? err->code : HR_ERANGE;
    /* a trip ends where the pass moves back round the ring (through the head, which passes it on
       when it owns nothing there) */
    for (int i = 0; i + 1 < out->n_steps; i++) out->n_rounds += out->step_dev[i + 1] <= out->step_dev[i];
    for (int d = 1; d < k; d++)
        if (out->n_win[d] == 0)
            return hr_fail(err, HR_EINVAL, "device %d gets no layers (%d layers are placed before its turn): give it a "
                           "window or leave it out", d, n_layer);
    return 0;
}

void hc_pp_layers(const hc_pp_plan *p, int d, uint8_t *mask) {
    memset(mask, 0, (size_t)p->n_layer);
    for (int i = 0; i < p->n_win[d]; i++)
        for (int il = p->win[d][i].begin; il < p->win[d][i].end; il++) mask[il] = 1;
}

/* ---- a head's plan flags -> the layout (hc_head_create and `hearth plan`) ---------------------------- */
int hc_layout_stage_size(const hc_layout *l, int st) {
    return (st + 1 < l->n_stages ? l->first[st + 1] : l->k) - l->first[st];
}

/* tensor parallel: shares (given, equal or from speeds) -> unit ranges */
static int hc_layout_tp(const hm_model *m, const hc_head_params *p, const double *speed, hc_layout *l, hr_err *err) {
    double w[HC_MAX_DEVICES];
    const int k = l->k;
    if (p->shares_auto) {
        if (!speed) return hr_fail(err, HR_EINVAL, "--tp-shares auto needs the devices' measured speeds");
        memcpy(w, speed, (size_t)k * sizeof *w);
    } else if (!p->n_shares) for (int d = 0; d < k; d++) w[d] = 1;
    else {
        if (p->n_shares != k)
            return hr_fail(err, HR_EINVAL, "--tp-shares has %d weights for %d devices (the head and %d workers)",
                           p->n_shares, k, k - 1);
        memcpy(w, p->shares, (size_t)k * sizeof *w);
    }
    if (!p->n_shares) {
        /* speeds -> shares: the head also runs the output head */
        double s[HC_MAX_DEVICES];
        memcpy(s, w, sizeof s);
        if (hc_plan_balance(m, s, k, w, &l->head_frac, err)) return err ? err->code : HR_EINVAL;
    }
    return hc_plan_make(m, w, k, &l->plan, err) ? (err ? err->code : HR_EINVAL) : 0;
}

/* hybrid: the stages (p->n_stages, p->stage_devs) -> stage, first, group, and every group's TP shares
   (--tp-shares: one weight per device of a group, in device order) */
static int hc_layout_stages(const hm_model *m, const hc_head_params *p, hc_layout *l, hr_err *err) {
    const int k = l->k;
    if (p->n_stages < 2 || p->n_stages > HC_MAX_DEVICES)
        return hr_fail(err, HR_EINVAL, "a hybrid plan needs at least two stages (%d given)", p->n_stages);
    int sum = 0, in_groups = 0;
    for (int s = 0; s < p->n_stages; s++) {
        if (p->stage_devs[s] < 1 || p->stage_devs[s] > k)
            return hr_fail(err, HR_EINVAL, "stage %d has %d devices", s, p->stage_devs[s]);
        sum += p->stage_devs[s];
        in_groups += p->stage_devs[s] > 1 ? p->stage_devs[s] : 0;
    }
    if (sum != k)
        return hr_fail(err, HR_EINVAL, "the stages hold %d devices, the cluster has %d (the head and %d workers)", sum,
                       k, k - 1);
    if (p->shares_auto) return hr_fail(err, HR_EINVAL, "--tp-shares auto is not for a hybrid plan: give the weights");
    if (p->n_shares && !in_groups)
        return hr_fail(err, HR_EINVAL, "--tp-shares is for tensor parallelism: no stage is a group");
    if (p->n_shares && p->n_shares != in_groups)
        return hr_fail(err, HR_EINVAL, "--tp-shares has %d weights for the %d devices of the stages' groups",
                       p->n_shares, in_groups);
    if (in_groups && p->allreduce != HC_ALLREDUCE_STAR)
        return hr_fail(err, HR_EUNSUPPORTED, "a hybrid plan's groups all-reduce by star (not --allreduce ring)");
    l->n_stages = p->n_stages;
    l->group = p->stage_devs[0];
    l->plan.n_devices = k;
    for (int s = 0, d = 0, wi = 0; s < p->n_stages; s++) {
        const int n = p->stage_devs[s];
        l->first[s] = (uint8_t)d;
        for (int i = 0; i < n; i++) l->stage[d + i] = (uint8_t)s;
        if (n > 1) {
            double w[HC_MAX_DEVICES];
            hc_plan gp;
            for (int i = 0; i < n; i++) w[i] = p->n_shares ? p->shares[wi + i] : 1;
            if (hc_plan_make(m, w, n, &gp, err)) return err ? err->code : HR_EINVAL;
            l->plan.att_group = gp.att_group, l->plan.ff_group = gp.ff_group;
            memcpy(&l->plan.dev[d], gp.dev, sizeof gp.dev[0] * (size_t)n);
            memcpy(&l->plan.weight[d], gp.weight, sizeof gp.weight[0] * (size_t)n);
            wi += n;
        } else l->plan.dev[d] = (hc_share){0, m->hp.n_head_kv, 0, m->hp.n_ff, 0};
        d += n;
    }
    return 0;
}

/* pipeline: window sizes -> every stage's windows; every stage computes whole layers — one device, or
   (hybrid) a group, each of its devices a share of every one of them */
static int hc_layout_pp(const hm_model *m, const hc_head_params *p, hc_layout *l, hr_err *err) {
    const hm_hparams *hp = &m->hp;
    const int k = l->k;
    l->group = 1;
    if (p->n_stages) {
        if (hc_layout_stages(m, p, l, err)) return err ? err->code : HR_EINVAL;
    } else if (p->n_shares || p->shares_auto)
        return hr_fail(err, HR_EINVAL, "--tp-shares is for tensor parallelism, not --pp");
    else {
        l->n_stages = k;
        l->plan.n_devices = k;
        for (int d = 0; d < k; d++) {
            l->stage[d] = l->first[d] = (uint8_t)d;
            l->plan.dev[d] = (hc_share){0, hp->n_head_kv, 0, hp->n_ff, 0};
        }
    }
    const int ns = l->n_stages;
    if (p->n_windows && p->n_windows != ns) {
        if (p->n_stages)
            return hr_fail(err, HR_EINVAL, "--layer-windows has %d sizes for %d stages", p->n_windows, ns);
        return hr_fail(err, HR_EINVAL, "--layer-windows has %d sizes for %d devices (the head and %d workers)",
                       p->n_windows, k, k - 1);
    }
    for (int st = 0; st < ns && p->n_windows; st++)
        if (hc_layout_stage_size(l, st) > 1 && p->layer_windows[st] == 0)
            return hr_fail(err, HR_EINVAL, "%s group gets no layers (window size 0): leave the group out",
                           st ? "a worker's" : "the head's");
    hr_err e = {0};
    if (hc_pp_plan_make(hp->n_layer, p->n_windows ? p->layer_windows : NULL, ns, &l->pp, &e))  /* its messages */
        return hr_fail(err, e.code, "%s%s", p->n_stages ? "stages: " : "", e.msg);              /* count stages */
    return 0;
}

int hc_layout_make(const hm_model *m, const hc_head_params *p, int k, const double *speed, hc_layout *out,
                   hr_err *err) {
    memset(out, 0, sizeof *out);
    out->k = k;
    out->group = 1;
    if (k < 2 || k > HC_MAX_DEVICES)
        return hr_fail(err, HR_EINVAL, "%d devices: a cluster has the head and 1..%d workers", k, HC_MAX_DEVICES - 1);
    if (p->lossy && (p->pp || p->allreduce != HC_ALLREDUCE_STAR))
        return hr_fail(err, HR_EINVAL, "--lossy is a star all-reduce of tensor parallelism (not --pp, not --allreduce ring)");
    if (p->pp) return hc_layout_pp(m, p, out, err);
    if (p->n_windows || p->n_stages)
        return hr_fail(err, HR_EINVAL, "%s needs --pp", p->n_windows ? "--layer-windows" : "a plan of stages");
    return hc_layout_tp(m, p, speed, out, err);
}
