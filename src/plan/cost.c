/* plan/cost: what a plan costs — decode ms/token, prefill ms, per-device memory — from the profiles;
   the formulas are in docs/planner.md, "The cost model" */
#include "plan.h"

#include "mem/mem.h"
#include "quant/quant.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HPL_MSG_OVERHEAD 64.0       /* bytes of header and fields around a hidden state */
#define HPL_DISK_UNKNOWN_GBPS 0.1   /* a device whose disk could not be measured: assume a slow one */

const char *hpl_kind_name(int kind) {
    static const char *names[] = {"single", "tp", "pp", "hybrid"};
    return kind >= 0 && kind < 4 ? names[kind] : "?";
}

/* ---- the model -------------------------------------------------------------------------------------- */

static void hpl_add_bytes(hpl_model *m, int type, double bytes) {
    for (int i = 0; i < m->n_types; i++)
        if (m->type[i] == type) { m->layer_bytes_of[i] += bytes; return; }
    if (m->n_types == HPL_MAX_TYPES) { m->layer_bytes_of[0] += bytes; return; } /* cannot happen with hq's types */
    m->type[m->n_types] = type;
    m->layer_bytes_of[m->n_types++] = bytes;
}

static double hpl_tensor_bytes(const hm_tensor *t) { return t->data || t->map ? (double)t->row_bytes * (double)t->ne1 : 0; }

/* the output head's parts (hm_output_parts), taken as equal: `fixed` bytes of it (0: none) in blocks of part bytes */
static int hpl_out_parts(const hpl_model *m, double fixed) { return fixed > 0 ? HR_MAX(m->out_parts, 1) : 0; }
static double hpl_out_part_bytes(const hpl_model *m, double fixed) { return fixed > 0 ? fixed / hpl_out_parts(m, fixed) : 0; }

int hpl_model_from(const hm_model *mod, const hm_ctx_params *cp, hpl_model *m, hr_err *err) {
    const hm_hparams *hp = &mod->hp;
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", hp->name[0] ? hp->name : hp->arch_name);
    m->n_layer = hp->n_layer;
    m->n_embd = hp->n_embd;
    m->n_vocab = hp->n_vocab;
    m->n_ctx = cp->n_ctx > 0 ? cp->n_ctx : HR_MIN(hp->n_ctx_train, 4096);
    m->n_batch = cp->n_batch > 0 ? cp->n_batch : 512;
    if (m->n_layer < 1) return hr_fail(err, HR_EINVAL, "a model without layers");
    for (int il = 0; il < hp->n_layer; il++) {
        const hm_layer *L = &mod->layers[il];
        const hm_tensor *attn[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->bq, &L->bk, &L->bv, &L->q_norm, &L->k_norm, &L->wo};
        const hm_tensor *ffn[] = {&L->ffn_norm, &L->w_gate, &L->w_up, &L->w_down};
        double a = 0, f = 0;
        for (size_t i = 0; i < HR_ARRAY_LEN(attn); i++) {
            double b = hpl_tensor_bytes(attn[i]);
            a += b;
            hpl_add_bytes(m, attn[i]->type, b / hp->n_layer);
        }
        for (size_t i = 0; i < HR_ARRAY_LEN(ffn); i++) {
            double b = hpl_tensor_bytes(ffn[i]);
            f += b;
            hpl_add_bytes(m, ffn[i]->type, b / hp->n_layer);
        }
        m->layer_bytes += (a + f) / hp->n_layer;
        if (il < HPL_MAX_LAYERS) m->attn_bytes_of[il] = a, m->ffn_bytes_of[il] = f;
        m->attn_bytes += a / hp->n_layer;
        m->ffn_bytes += f / hp->n_layer;
        m->block_max_bytes = HR_MAX(m->block_max_bytes, HR_MAX(a, f));
    }
    m->out_type = mod->output.type;
    m->out_bytes = hpl_tensor_bytes(&mod->output) + hpl_tensor_bytes(&mod->output_norm);
    m->out_parts = hm_output_parts(mod);
    m->embd_bytes = hpl_tensor_bytes(&mod->tok_embd);
    const double elt = cp->kv_type == HQ_TYPE_F32 ? 4 : 2;
    const int n_seq = cp->n_seq > 0 ? cp->n_seq : 1;
    m->kv_bytes_per_layer = 2.0 * m->n_ctx * n_seq * hp->n_head_kv * hp->head_dim * elt;
    double total = (double)hm_ctx_bytes_estimate(hp, cp);
    m->scratch_bytes = HR_MAX(0, total - m->kv_bytes_per_layer * hp->n_layer);
    return 0;
}

uint32_t hpl_model_types(const hpl_model *m) {
    uint32_t mask = 0;
    /* the norms' F32 (and absent tensors) weigh nothing: costed at another type's rate (hpl_speed) */
    for (int i = 0; i < m->n_types; i++)
        if (m->type[i] >= 0 && m->type[i] < 32 && m->layer_bytes_of[i] > 0.01 * m->layer_bytes) mask |= 1u << m->type[i];
    if (m->out_type >= 0 && m->out_type < 32) mask |= 1u << m->out_type;
    return mask;
}

/* ---- per-device figures ------------------------------------------------------------------------------- */

/* ms for `layers` layers of fraction x of every weight, decode (tokens 0) or prefill of `tokens`; mapped:
   computed from the file's mapping (hpl_mapped) */
static double hpl_layers_ms(const hpl_device *d, const hpl_model *m, double layers, double x, int tokens, bool mapped) {
    double ms = 0;
    for (int i = 0; i < m->n_types; i++) {
        double gbps = hpl_speed(d, m->type[i], tokens > 0, mapped);
        ms += m->layer_bytes_of[i] * x * layers * (tokens > 0 ? tokens : 1) / (gbps * 1e6);
    }
    return ms;
}

/* what only the head does per token: the output norm and head, and the sampler (a few passes over the
   logits) */
static double hpl_head_extra_ms(const hpl_device *d, const hpl_model *m, bool mapped) {
    double ms = m->out_bytes / (hpl_speed(d, m->out_type, false, mapped) * 1e6);
    double bw = d->mem_bw_gbps > 0 ? d->mem_bw_gbps : 1;
    return ms + 4.0 * 4.0 * m->n_vocab / (bw * 1e6);
}

static double hpl_disk_ms_per_byte(const hpl_device *d) {
    return 1.0 / ((d->disk_gbps > 0 ? d->disk_gbps : HPL_DISK_UNKNOWN_GBPS) * 1e6);
}

/* Memory of one device holding `weights` bytes of layers (plus `fixed` bytes the head keeps: the
   output head, one block of its own), kv bytes of KV cache and the scratch: what stays resident and
   what streams. The residency manager's rules (src/mem): everything kept when it fits the budget;
   else room for the two largest streamed blocks stays free for the stream and the rest of the budget
   pins weights, the blocks chosen as the manager chooses them (hpl_pinned_bytes). A default budget that cannot hold the KV cache, the scratch and the largest block means
   no manager (src/mem/setup.c): plain mmap, where the kernel keeps what fits the device's memory and
   a token's pass over more than that misses every page (LRU over a cycle); a budget given that
   cannot hold them is an error. */
/* What the residency manager pins (src/mem, hmem_pin_best: LIME's allocator) of a device holding
   `weights` bytes of layers, each a fraction x of the model's (TP shares), and `fixed` bytes of output
   head, beside the window of the two largest streamed blocks (one when two do not fit), in avail bytes.
   The manager keeps its RUN pins where they come within 1/32 of these. */
static double hpl_pinned_bytes(const hpl_model *m, double weights, double fixed, double x, double avail) {
    double per = x * m->layer_bytes;
    int n = per > 0 ? (int)lround(weights / per) : 0;
    const int np = hpl_out_parts(m, fixed);
    const uint64_t part = (uint64_t)hpl_out_part_bytes(m, fixed);
    uint64_t size[3] = {(uint64_t)(x * m->attn_bytes), (uint64_t)(x * m->ffn_bytes), part}, pinned = 0;
    int count[3] = {n, n, np}, pin[3], k = np > 0 ? 3 : 2;
    /* the two largest blocks: the window's room (n copies of the larger layer block, np of the part) */
    uint64_t big = HR_MAX(size[0], size[1]), top = HR_MAX(big, np > 0 ? part : 0);
    int n_top = (n > 0 && big == top ? n : 0) + (np > 0 && part == top ? np : 0);
    uint64_t second = n_top >= 2 ? top : part == top ? (n > 0 ? big : 0) : (np > 0 ? part : 0);
    uint64_t two = top + second;
    int w = (double)two <= avail ? 2 : 1;
    if (n + count[2] > 0 && !hmem_pin_best_classes(size, count, k, w, (uint64_t)HR_MAX(avail, 0), pin, &pinned)) {
        bool every = true; /* every block pinned: all of it (the sizes above are rounded down to bytes) */
        for (int i = 0; i < k; i++) every = every && pin[i] == count[i];
        return every ? weights + fixed : (double)pinned;
    }
    return HR_MAX(0, avail - HR_MIN(2 * HR_MAX(big, part), avail)); /* the search gave up: the room, less two blocks */
}

static bool hpl_memory(const hpl_device *d, const hpl_model *m, double weights, double fixed, double kv,
                       double block, hpl_dev_cost *dc, char *why, size_t cap) {
    const double x = m->block_max_bytes > 0 ? block / m->block_max_bytes : 1; /* TP: the share */
    const double scratch = m->scratch_bytes;
    dc->kv_bytes = kv;
    dc->scratch_bytes = scratch;
    dc->budget = (double)d->budget;
    block = HR_MAX(block, hpl_out_part_bytes(m, fixed));
    double all = weights + fixed, avail = dc->budget - kv - scratch;
    if (all <= avail) {
        dc->resident_bytes = all;
        dc->stream_bytes = 0;
        dc->mem_bytes = all + kv + scratch;
        return true;
    }
    if (avail < block && !d->budget_set) {
        double usable = (double)d->mem_usable - kv - scratch;
        if (usable < 0) {
            snprintf(why, cap, "%s: its memory (%.0f MiB) does not hold the KV cache (%.0f MiB) and the scratch (%.0f MiB)",
                     d->name, d->mem_usable / 1048576.0, kv / 1048576, scratch / 1048576);
            return false;
        }
        dc->mmap = true;
        dc->resident_bytes = all <= usable ? all : 0;
        dc->stream_bytes = all <= usable ? 0 : all;
        dc->mem_bytes = HR_MIN(all, usable) + kv + scratch;
        return true;
    }
    if (avail < block) {
        snprintf(why, cap, "%s: its budget %.0f MiB does not hold the KV cache (%.0f MiB), the scratch (%.0f MiB) and one "
                 "block of weights (%.0f MiB)", d->name, dc->budget / 1048576, kv / 1048576, scratch / 1048576,
                 block / 1048576);
        return false;
    }
    dc->resident_bytes = hpl_pinned_bytes(m, weights, fixed, x, avail);
    dc->stream_bytes = all - dc->resident_bytes;
    dc->mem_bytes = dc->budget;
    return true;
}

/* Whether a device computes from the file's mapping, not from weights loaded into memory: its residency
   manager streams (src/mem: every block, pinned or not, is a range of the mapping) or it has no manager
   (plain mmap). Such a device runs the kernels on the file's layout (hpl_type_speed.matvec_map_gbps):
   session 26 measured a streaming device of home4-8b-small computing 2.5x slower than it did with its
   weights loaded and packed. */
static bool hpl_mapped(const hpl_dev_cost *dc) { return dc->mmap || dc->stream_bytes > 0; }

/* what of a device's streaming its compute does not cover: a manager's loader reads ahead while it
   computes (and hidden_ms more in the ring's idle time); plain mmap faults pages in as compute
   reaches them */
static double hpl_blocked(const hpl_dev_cost *dc, double hidden_ms) {
    if (dc->mmap) return dc->stream_ms;
    return HR_MAX(0, dc->stream_ms - dc->compute_ms - hidden_ms);
}

/* The residency manager's loader played out over a device's passes (src/mem/mem.c, loader_main): n blocks in
   execution order, the loader reading the streamed ones in that order a chunk at a time, each chunk once the
   streamed bytes from the block being computed (the one after the last finished) up to the chunk's end fit
   the room; a block's compute waits until it is loaded, and the device idles gap_ms[i] after block i while
   the rest of the ring computes (the loader reads on). Three passes from an empty room; the waits of the third,
   the steady state, are the blocked time of a pass. */
double hpl_stream_blocked(int n, const double *bytes, const bool *pinned, const double *compute_ms, const double *gap_ms,
                          double room, double ms_per_byte) {
    if (n < 1) return 0;
    const int N = 3 * n;
    double *t_end = malloc(sizeof *t_end * (size_t)N), *before = malloc(sizeof *before * ((size_t)N + 1));
    if (!t_end || !before) {
        free(t_end);
        free(before);
        return -1;
    }
    before[0] = 0;   /* the streamed bytes of the unrolled passes' blocks before g */
    for (int g = 0; g < N; g++) before[g + 1] = before[g] + (pinned[g % n] ? 0 : bytes[g % n]);
    double load_t = 0, free_t = 0, wait = 0;   /* the loader's clock; when the compute may begin the next block */
    int b = 0;
    for (int g = 0; g < N; g++) {
        const int i = g % n;
        double ready = free_t;
        if (!pinned[i]) {
            for (double a = 0; a < bytes[i]; a += (double)HMEM_CHUNK) {
                const double len = HR_MIN((double)HMEM_CHUNK, bytes[i] - a), need = before[g] + a + len - room;
                while (b < g && before[b] < need) b++;   /* from block b on, the streamed bytes up to here fit */
                const double may = b == 0 ? 0 : t_end[b - 1];   /* when the compute finished block b - 1 */
                load_t = HR_MAX(load_t, may) + len * ms_per_byte;
            }
            ready = HR_MAX(ready, load_t);
        }
        if (g >= 2 * n) wait += ready - free_t;
        t_end[g] = ready + compute_ms[i];
        free_t = t_end[g] + gap_ms[i];
    }
    free(t_end);
    free(before);
    return wait;
}

/* A streaming device's blocked time (hpl_stream_blocked) over its blocks: the attention and FFN blocks of each
   of its layer ranges (a pipeline stage's windows; a TP device's one range of every layer, x of each), each
   layer's own sizes (Q4_K_M gives some layers Q6_K), then the output head on the head; pinned as the residency
   manager pins them at the start of a generation (hmem_plan_at for the first positions, as the runtime plans
   them: src/cluster/worker.c); the layers' compute spread over their blocks by bytes, the output head's its
   own; idle after each range (a pipeline: the rest of the ring) and after each block (TP: the all-reduce), when
   the loader reads on. What hides the streaming is then where the streamed
   blocks lie: streamed blocks among pinned ones (attention blocks between pinned FFN blocks) are read while the
   pinned ones compute, while one stretch of streamed blocks is read ahead only as far as the room reaches, then
   at the disk's pace. (Session 30, home4-8b-small's d2, `--timings`: 31 layers, 21 of 62 blocks streamed mostly
   in the window's second half, blocked 275 ms a pass; 30 layers with every attention block streamed between
   pinned FFN blocks, 0-3 ms; the formula before, stream - compute - idle, said 0 for both.) -1: no plan (the
   caller falls back to that formula). */
typedef struct hpl_sim_in {
    double x;                  /* the share of every layer (1 in a pipeline) */
    const hm_window *win;      /* the layer ranges, in execution order */
    int    n_win;
    bool   head;               /* the output head comes last */
    double layers_ms, head_ms; /* compute: of the layers (the loader's CPU in it), of the output head */
    double idle_ms;            /* idle after the ranges (a pipeline: the rest of the ring), spread over them */
    double block_gap;          /* idle after each block (TP: the all-reduce) */
    double budget, kv, scratch, ms_per_byte;
} hpl_sim_in;

static double hpl_stream_sim(const hpl_model *m, const hpl_sim_in *in) {
    const int np = in->head ? hpl_out_parts(m, m->out_bytes) : 0;
    int n = np, nl = 0, ranges = 0;
    for (int w = 0; w < in->n_win; w++) {
        nl += in->win[w].end - in->win[w].begin;
        ranges += in->win[w].end > in->win[w].begin;
    }
    n += 2 * nl;
    if (n < 1 || in->budget < 1) return -1;
    uint64_t *bytes = malloc(sizeof *bytes * (size_t)n);
    uint8_t *kind = malloc((size_t)n);
    bool *pinned = malloc(sizeof *pinned * (size_t)n);
    double *sz = malloc(sizeof *sz * (size_t)n), *c = malloc(sizeof *c * (size_t)n), *gap = calloc((size_t)n, sizeof *gap);
    double blocked = -1, layers = 0;
    if (!bytes || !kind || !pinned || !sz || !c || !gap) goto done;
    int k = 0;
    for (int w = 0; w < in->n_win; w++) {
        for (int l = in->win[w].begin; l < in->win[w].end; l++) {
            const bool known = l < HPL_MAX_LAYERS && m->attn_bytes_of[l] > 0 && m->ffn_bytes_of[l] > 0;
            gap[k] = in->block_gap;
            bytes[k] = (uint64_t)(in->x * (known ? m->attn_bytes_of[l] : m->attn_bytes)), kind[k++] = HM_BLOCK_ATTN;
            gap[k] = in->block_gap;
            bytes[k] = (uint64_t)(in->x * (known ? m->ffn_bytes_of[l] : m->ffn_bytes)), kind[k++] = HM_BLOCK_FFN;
        }
        if (in->win[w].end > in->win[w].begin) gap[k - 1] += in->idle_ms / ranges;
    }
    for (int j = 0; j < np; j++) bytes[k] = (uint64_t)hpl_out_part_bytes(m, m->out_bytes), kind[k++] = HM_BLOCK_OUTPUT;
    if (ranges == 0) gap[k - 1] += in->idle_ms;
    for (int i = 0; i < 2 * nl; i++) layers += (double)bytes[i];
    hmem_params hp = hmem_default_params();
    hp.ctx_bytes = (uint64_t)HR_MAX(in->kv + in->scratch, 0);
    hp.n_ctx = m->n_ctx;
    hp.ctx_base_bytes = (uint64_t)HR_MAX(in->scratch, 0);
    hmem_plan plan;
    hr_err e = {0};
    if (hmem_plan_at(bytes, kind, n, &hp, (uint64_t)in->budget, 1, pinned, &plan, &e) || plan.mode != HMEM_STREAM) goto done;
    for (int i = 0; i < n; i++) {
        sz[i] = (double)bytes[i];
        c[i] = i < 2 * nl ? (layers > 0 ? in->layers_ms * sz[i] / layers : 0) : in->head_ms / np;
    }
    blocked = hpl_stream_blocked(n, sz, pinned, c, gap, (double)plan.room_bytes, in->ms_per_byte);
done:
    free(bytes);
    free(kind);
    free(pinned);
    free(sz);
    free(c);
    free(gap);
    return blocked;
}

static const hpl_link *hpl_link_of(const hpl_cluster *c, int a, int b) { return &c->link[a][b]; }

/* one-way time of a message of `bytes` on the link a -> b */
static double hpl_hop_ms(const hpl_cluster *c, int a, int b, double bytes) {
    const hpl_link *l = hpl_link_of(c, a, b);
    double gbps = l->gbps > 0 ? l->gbps : 0.1;
    return l->rtt_ms / 2 + bytes / (gbps * 1e6);
}

/* ---- CPU quotas ---------------------------------------------------------------------------------------------- */
/* A CFS quota grants q x P of CPU time in every period P (the kernel refills the group's pool to the quota
   at each period's start; hpl_quota_run below has the rules). The profile measures a device's speed under
   its quota as if it computed throughout (CPU time / quota, src/plan/profile.c), which is what one device
   alone sees; but a device of a pipeline or a TP group idles while the others compute and the links carry
   the hidden state, and its next burst starts on a quota it has not spent: it runs at its threads' full
   speed until the period's quota is gone. docs/planner.md ("CPU quotas") has the measurements. So a token is
   written down as the devices' bursts and the waits between them (hpl_sched) and played through the
   periods of every device (hpl_sched_run); the difference to the same token at the quota-bound rates is
   the plan's quota_ms. */
#define HPL_QUOTA_TOKENS 4   /* tokens played; the first one (every device starting on a full quota) is not counted */
#define HPL_QUOTA_PHASES 32  /* phase sets of the devices' period grids, averaged (each device's own sequence:
                                the relative phases vary too; the tokens' time depends on them) */

typedef struct hpl_sched {
    int     n, cap;          /* steps: a wait (network, disk), then bursts of devices that compute at once */
    double *wait;
    int    *first, *count;   /* step i's bursts: [first, first + count) */
    int     nb, capb;
    int    *dev;             /* a burst: its device (cluster index) and its ms at the quota-bound rate */
    double *ms;
    bool    failed;          /* out of memory: the plan is costed without the quota model */
    uint32_t steady;         /* devices (bit: cluster index) played at their quota-bound rate: those that
                                stream weights from disk, whose loader spends their quota between bursts */
} hpl_sched;

static void hpl_sched_free(hpl_sched *s) {
    free(s->wait);
    free(s->first);
    free(s->count);
    free(s->dev);
    free(s->ms);
    memset(s, 0, sizeof *s);
}

static bool hpl_grow(void **a, int cap, size_t size) {
    void *n = realloc(*a, (size_t)cap * size);
    if (!n) return false;
    *a = n;
    return true;
}

/* a new step: wait ms, then the bursts hpl_sched_burst adds */
static void hpl_sched_step(hpl_sched *s, double wait) {
    if (s->failed) return;
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        if (!hpl_grow((void **)&s->wait, cap, sizeof *s->wait) || !hpl_grow((void **)&s->first, cap, sizeof *s->first) ||
            !hpl_grow((void **)&s->count, cap, sizeof *s->count)) { s->failed = true; return; }
        s->cap = cap;
    }
    s->wait[s->n] = wait;
    s->first[s->n] = s->nb;
    s->count[s->n++] = 0;
}

static void hpl_sched_burst(hpl_sched *s, int dev, double ms) {
    if (s->failed || ms <= 0) return;
    if (!s->n) hpl_sched_step(s, 0);
    if (s->failed) return;
    if (s->nb == s->capb) {
        int cap = s->capb ? 2 * s->capb : 64;
        if (!hpl_grow((void **)&s->dev, cap, sizeof *s->dev) || !hpl_grow((void **)&s->ms, cap, sizeof *s->ms)) {
            s->failed = true;
            return;
        }
        s->capb = cap;
    }
    s->dev[s->nb] = dev;
    s->ms[s->nb++] = ms;
    s->count[s->n - 1]++;
}

/* a device whose quota is below the threads it computes with: its bursts are held to the quota */
static bool hpl_quota_binds(const hpl_device *d) { return d->cpu_quota > 0 && d->cpu_quota < HR_MAX(d->n_threads, 1); }

/* a device that bursts: its quota binds and it does not stream (hpl_sched.steady) */
static bool hpl_bursts(const hpl_cluster *c, const hpl_sched *s, int d) {
    return hpl_quota_binds(&c->dev[d]) && !(d < 32 && (s->steady >> d & 1u));
}

/* marks the plan's streaming devices steady */
static void hpl_sched_steady(hpl_sched *s, const hpl_plan *p) {
    for (int i = 0; i < p->n; i++)
        if (p->dc[i].stream_bytes > 0 && p->dc[i].dev < 32) s->steady |= 1u << p->dc[i].dev;
}

/* whether any device of the plan bursts: otherwise its token is not written down at all (no quota, the
   usual case, costs nothing more) */
static bool hpl_plan_bursts(const hpl_cluster *c, const hpl_plan *p) {
    for (int i = 0; i < p->n; i++)
        if (hpl_quota_binds(&c->dev[p->dev[i]]) && !(p->dc[i].stream_bytes > 0)) return true;
    return false;
}

/* CFS bandwidth control as the kernel applies it (kernel/sched/fair.c, Linux 5.4 and later): the group's
   pool is refilled to Q = q x P at every period boundary (to Q, not by Q: without cpu.cfs_burst_us nothing
   is saved up); a CPU that runs the group's threads takes runtime from the pool in slices of up to 5 ms
   (sched_cfs_bandwidth_slice_us) into its own local runtime, which does not expire at a boundary (since
   5.4); the threads are throttled when their CPU's local runtime and the pool are both spent, until the
   next refill; a CPU whose queue goes idle returns to the pool all but 1 ms (min_cfs_rq_runtime) of its
   local runtime. So a burst that starts late in a period does not lose what that period granted: it takes
   the whole quota at its start and carries it across the boundary (the model of session 23, a period's
   quota lost at its end, predicted pipelines 8-35% slow). The k threads of a device are taken as one
   CPU's queue with k times the slice and the 1 ms. */
#define HPL_CFS_SLICE_MS     5.0
#define HPL_CFS_MIN_LOCAL_MS 1.0

typedef struct hpl_quota_dev {
    double q, k, P, phase;   /* quota (cores), threads, period (ms), where its periods start */
    double hz, tick;         /* its scheduler tick (ms), and where its CPU's ticks fall */
    double pool;             /* the group's runtime no CPU has taken yet (ms of CPU) */
    double local;            /* the runtime its CPUs hold */
    long   period;           /* the period whose refill the pool has had */
} hpl_quota_dev;

/* the refills of the periods that began by t */
static void hpl_quota_refill(hpl_quota_dev *v, double t) {
    long k = (long)floor((t - v->phase) / v->P + 1e-9);
    if (k != v->period) {
        v->period = k;
        v->pool = v->q * v->P;
    }
}

/* a device that has `cpu` ms of CPU to do from t0 on, at k threads: when it is done */
static double hpl_quota_run(hpl_quota_dev *v, double t0, double cpu) {
    double t = t0;
    bool throttled = false;
    hpl_quota_refill(v, t);
    for (int guard = 0; cpu > 1e-9 && guard < 1000000; guard++) {
        if (v->local <= 1e-9) {   /* a slice from the pool (a debt first) */
            double take = HR_MIN(v->pool, HPL_CFS_SLICE_MS * v->k - v->local);
            v->local += take;
            v->pool -= take;
        }
        double end = v->phase + (double)(v->period + 1) * v->P;   /* the next refill */
        if (v->local <= 1e-9) {
            /* out of runtime while running: the kernel notices at its CPU's next tick and runs on into debt
               until then; then throttled until a refill pays the debt and leaves some (one that cannot keeps
               it throttled) */
            if (!throttled) {
                double tk = v->tick + ceil((t - v->tick) / v->hz + 1e-9) * v->hz;
                double dt = HR_MIN(cpu / v->k, HR_MIN(tk, end) - t);
                v->local -= dt * v->k;
                cpu -= dt * v->k;
                t += dt;
                if (cpu <= 1e-9) break;
                throttled = t < end - 1e-9;   /* the boundary before the tick: refilled, still running */
            }
            t = end;
            hpl_quota_refill(v, t);
            continue;
        }
        throttled = false;
        double dt = HR_MIN(HR_MIN(cpu, v->local) / v->k, end - t);
        v->local -= dt * v->k;
        cpu -= dt * v->k;
        t += dt;
        if (t >= end - 1e-9) {
            t = end;
            hpl_quota_refill(v, t);
        }
    }
    /* going idle: its CPUs keep 1 ms each and return the rest */
    double keep = HR_MIN(v->local, HPL_CFS_MIN_LOCAL_MS * v->k);
    if (keep > 0) {
        v->pool += v->local - keep;
        v->local = keep;
    }
    return t;
}

double hpl_quota_burst_ms(double q, double period_ms, double tick_ms, double start, double cpu_ms) {
    hpl_quota_dev v = {.q = q, .k = 1, .P = period_ms, .phase = 0, .hz = tick_ms, .tick = 0, .period = LONG_MIN};
    return hpl_quota_run(&v, start, cpu_ms) - start;
}

/* The plan's quota_ms: its token played through the devices' quota periods, less the same token at every
   device's quota-bound rate (0 when no device's quota binds). */
static double hpl_sched_run(const hpl_cluster *c, const hpl_sched *s) {
    if (s->failed || !s->n) return 0;
    bool binds = false;
    for (int b = 0; b < s->nb; b++) binds = binds || hpl_bursts(c, s, s->dev[b]);
    if (!binds) return 0;
    double flat = 0;   /* the token at the quota-bound rates */
    for (int i = 0; i < s->n; i++) {
        double m = 0;
        for (int b = s->first[i]; b < s->first[i] + s->count[i]; b++) m = HR_MAX(m, s->ms[b]);
        flat += s->wait[i] + m;
    }
    hpl_quota_dev v[HPL_MAX_DEVICES];
    double sum = 0;
    for (int ph = 0; ph < HPL_QUOTA_PHASES; ph++) {
        for (int d = 0; d < c->n && d < HPL_MAX_DEVICES; d++) {
            const hpl_device *dv = &c->dev[d];
            v[d].q = dv->cpu_quota;
            v[d].k = HR_MAX(dv->n_threads, 1);
            v[d].P = dv->cpu_period_ms > 0 ? dv->cpu_period_ms : HPL_CPU_PERIOD_DEFAULT_MS;
            /* a Kronecker sequence per device (the fractional part of the square root of its prime): every
               set gives every device another phase, so the sets sample the devices' relative phases, which
               the kernel does not align, evenly and the same way whatever the devices' indices */
            static const double root[HPL_MAX_DEVICES] = {1.41421356, 1.73205081, 2.23606798, 2.64575131, 3.31662479,
                                                         3.60555128, 4.12310563, 4.35889894, 4.79583152, 5.38516481,
                                                         5.56776436, 6.08276253, 6.40312424, 6.55743852, 6.85565460,
                                                         7.28010989};
            double f = (ph + 0.5) * (root[d] - floor(root[d]));
            v[d].phase = (f - floor(f)) * v[d].P;
            double g = (ph + 0.5) * (root[HPL_MAX_DEVICES - 1 - d] - floor(root[HPL_MAX_DEVICES - 1 - d]));
            v[d].hz = dv->tick_ms > 0 ? dv->tick_ms : HPL_TICK_DEFAULT_MS;
            v[d].tick = (g - floor(g)) * v[d].hz;
            v[d].pool = v[d].local = 0;
            v[d].period = LONG_MIN;
        }
        double t = 0, t1 = 0;
        for (int tok = 0; tok < HPL_QUOTA_TOKENS; tok++) {
            if (tok == 1) t1 = t;
            for (int i = 0; i < s->n; i++) {
                t += s->wait[i];
                double end = t;
                for (int b = s->first[i]; b < s->first[i] + s->count[i]; b++) {
                    int d = s->dev[b];
                    /* quota-bound: the burst's CPU time is its ms at the rate of q cores */
                    /* (not inside HR_MAX, which evaluates its arguments twice) */
                    double e1 = hpl_bursts(c, s, d) ? hpl_quota_run(&v[d], t, s->ms[b] * v[d].q) : t + s->ms[b];
                    end = HR_MAX(end, e1);
                }
                t = end;
            }
        }
        sum += (t - t1) / (HPL_QUOTA_TOKENS - 1);
    }
    return sum / HPL_QUOTA_PHASES - flat;
}

/* ---- the plans ---------------------------------------------------------------------------------------------- */

/* The CPU a streaming device's loader spends beside the compute, inside the same quota: the page cache's
   work per byte streamed (readahead, mapping, dropping what was read). The profile's cold read measures
   it alone (disk_cpu_ms_gb: 9-11 ms per GB on every testbed device, session 28); the loader spends more,
   because it evicts under the device's memory limit while the kernels run: home4-8b-small's d2 (0.8 core)
   streaming 1.5 GB a token, its loader thread took 27 ms of CPU per GB (session 27, with MADV_HUGEPAGE;
   72 before) — HPL_LOADER_CPU_X (plan.h) times the cold read's. Plain mmap faults the pages in from the
   compute's own thread: its stream_ms is all blocked (hpl_blocked) and already holds that work. */
static double hpl_loader_ms(const hpl_device *d, const hpl_dev_cost *dc) {
    if (dc->mmap || dc->stream_bytes <= 0 || !(d->disk_cpu_ms_gb > 0)) return 0;
    const double cores = hpl_quota_binds(d) ? d->cpu_quota : HR_MAX(d->n_threads, 1);
    return dc->stream_bytes / 1e9 * d->disk_cpu_ms_gb * HPL_LOADER_CPU_X / cores;
}

static int hpl_cost_single(const hpl_cluster *c, const hpl_model *m, int n_prompt, hpl_plan *p) {
    const hpl_device *d = &c->dev[0];
    hpl_dev_cost *dc = &p->dc[0];
    dc->dev = 0;
    dc->share = 1;
    dc->layers = m->n_layer;
    if (!hpl_memory(d, m, m->layer_bytes * m->n_layer, m->out_bytes, m->kv_bytes_per_layer * m->n_layer,
                    m->block_max_bytes, dc, p->why, sizeof p->why))
        return 0;
    p->head_extra_ms = hpl_head_extra_ms(d, m, hpl_mapped(dc));
    dc->compute_ms = hpl_layers_ms(d, m, m->n_layer, 1, 0, hpl_mapped(dc)) + p->head_extra_ms + hpl_loader_ms(d, dc);
    dc->stream_ms = dc->stream_bytes * hpl_disk_ms_per_byte(d);
    /* the loader played out over the manager's pins, as for a pipeline stage: one window of every layer,
       then the output head, nothing idle between passes but the sampler's share of the head's work */
    const hm_window all = {0, m->n_layer};
    hpl_sim_in in = {.x = 1, .win = &all, .n_win = 1, .head = true, .layers_ms = dc->compute_ms - p->head_extra_ms,
                     .head_ms = p->head_extra_ms, .budget = dc->budget, .kv = dc->kv_bytes, .scratch = dc->scratch_bytes,
                     .ms_per_byte = hpl_disk_ms_per_byte(d)};
    const double sim = dc->mmap || dc->stream_bytes <= 0 ? -1 : hpl_stream_sim(m, &in);
    dc->blocked_ms = sim >= 0 ? sim : hpl_blocked(dc, 0);
    if (hpl_plan_bursts(c, p)) {
        hpl_sched s = {0};
        hpl_sched_steady(&s, p);
        hpl_sched_burst(&s, 0, dc->compute_ms);
        hpl_sched_step(&s, dc->blocked_ms);
        p->quota_ms = hpl_sched_run(c, &s);
        hpl_sched_free(&s);
    }
    p->compute_ms = dc->compute_ms + p->quota_ms;
    p->blocked_ms = dc->blocked_ms;
    p->ms_per_token = p->compute_ms + dc->blocked_ms;
    int nb = (n_prompt + m->n_batch - 1) / m->n_batch;
    double pf = hpl_layers_ms(d, m, m->n_layer, 1, n_prompt, hpl_mapped(dc)) + p->head_extra_ms;
    p->prefill_ms = pf + HR_MAX(0, nb * dc->stream_ms - pf);
    p->feasible = true;
    return 0;
}

/* the time of TP device i (index into p->dev) for share x, per token: its layers' compute and the
   part of its streaming that compute does not cover */
static double hpl_tp_dev(const hpl_cluster *c, const hpl_model *m, const hpl_plan *p, int i, double x, hpl_dev_cost *dc,
                         bool *ok, char *why, size_t cap) {
    const hpl_device *d = &c->dev[p->dev[i]];
    memset(dc, 0, sizeof *dc);
    dc->dev = p->dev[i];
    dc->share = x;
    dc->layers = m->n_layer;
    *ok = hpl_memory(d, m, x * m->layer_bytes * m->n_layer, p->dev[i] == 0 ? m->out_bytes : 0,
                     x * m->kv_bytes_per_layer * m->n_layer, HR_MAX(x * m->block_max_bytes, 1), dc, why, cap);
    if (!*ok) return INFINITY;
    dc->compute_ms = hpl_layers_ms(d, m, m->n_layer, x, 0, hpl_mapped(dc)) + hpl_loader_ms(d, dc);
    dc->stream_ms = dc->stream_bytes * hpl_disk_ms_per_byte(d);
    dc->blocked_ms = hpl_blocked(dc, 0);
    return dc->compute_ms + dc->blocked_ms;
}

double hpl_tp_dev_time(const hpl_cluster *c, const hpl_model *m, const hpl_plan *p, int i, double x) {
    hpl_dev_cost dc;
    bool ok;
    char why[8];
    return hpl_tp_dev(c, m, p, i, x, &dc, &ok, why, sizeof why);
}

double hpl_tp_objective(const hpl_cluster *c, const hpl_model *m, const hpl_plan *p, const double *x) {
    double worst = 0;
    for (int i = 0; i < p->n; i++) worst = HR_MAX(worst, hpl_tp_dev_time(c, m, p, i, x[i]));
    return worst;
}

static int hpl_cost_tp(const hpl_cluster *c, const hpl_model *m, int n_prompt, hpl_plan *p) {
    const double B = m->n_embd * 4.0 + HPL_MSG_OVERHEAD;
    double layers = 0, ar, fwd, ar_pf, fwd_pf, layers_pf = 0, stream = 0, rtt = 0, xfer = 0, xfer_pf = 0;
    int nb = (n_prompt + m->n_batch - 1) / m->n_batch, per = HR_MIN(n_prompt, m->n_batch);
    for (int i = 0; i < p->n; i++) {
        bool ok;
        hpl_tp_dev(c, m, p, i, p->share[i], &p->dc[i], &ok, p->why, sizeof p->why);
        if (!ok) return 0;
        p->compute_ms = HR_MAX(p->compute_ms, p->dc[i].compute_ms);
        layers_pf = HR_MAX(layers_pf, hpl_layers_ms(&c->dev[p->dev[i]], m, m->n_layer, p->share[i], n_prompt,
                                                    hpl_mapped(&p->dc[i])));
        stream = HR_MAX(stream, p->dc[i].stream_ms);
        if (i == 0) continue;
        /* star all-reduce: PARTIAL up, RESULT down; FORWARD to start the pass. The latencies
           overlap (the slowest link's), the bytes do not: they all pass the head's own link */
        const hpl_link *l = hpl_link_of(c, 0, p->dev[i]);
        double gbps = l->gbps > 0 ? l->gbps : 0.1;
        rtt = HR_MAX(rtt, l->rtt_ms);
        xfer += 2 * B / (gbps * 1e6);
        xfer_pf += 2 * B * per / (gbps * 1e6);
    }
    ar = rtt + xfer;
    ar_pf = rtt + xfer_pf;
    fwd = rtt / 2 + xfer / 2;
    fwd_pf = rtt / 2 + xfer_pf / 2;
    /* a device's loader goes on reading while its compute thread waits for the all-reduces: those waits
       come at every block, so the loader, behind whenever the device is disk-bound, never fills its window
       of two blocks in them (home4-8b-small, TP over four devices with the head streaming: predicted +22% to
       +58% with the waits left out, -5% to +23% with them; docs/planner.md, "Session 28") */
    p->head_extra_ms = hpl_head_extra_ms(&c->dev[0], m, hpl_mapped(&p->dc[0]));
    const hm_window all = {0, m->n_layer};
    for (int i = 0; i < p->n; i++) {
        hpl_dev_cost *dc = &p->dc[i];
        /* the loader played out (hpl_stream_sim): the waits for the all-reduce after every block */
        hpl_sim_in in = {.x = p->share[i], .win = &all, .n_win = 1, .head = p->dev[i] == 0, .layers_ms = dc->compute_ms,
                         .head_ms = p->dev[i] == 0 ? p->head_extra_ms : 0, .idle_ms = fwd, .block_gap = ar,
                         .budget = dc->budget, .kv = dc->kv_bytes, .scratch = dc->scratch_bytes,
                         .ms_per_byte = hpl_disk_ms_per_byte(&c->dev[p->dev[i]])};
        double sim = dc->mmap || dc->stream_bytes <= 0 ? -1 : hpl_stream_sim(m, &in);
        dc->blocked_ms = sim >= 0 ? sim : hpl_blocked(dc, fwd + 2.0 * m->n_layer * ar);
        layers = HR_MAX(layers, dc->compute_ms + dc->blocked_ms);
        p->blocked_ms = HR_MAX(p->blocked_ms, dc->blocked_ms);
    }
    /* the token as bursts: the FORWARD, every block's compute on every device and its all-reduce, the
       output head */
    if (hpl_plan_bursts(c, p)) {
        hpl_sched s = {0};
        hpl_sched_steady(&s, p);
        hpl_sched_step(&s, fwd);
        for (int il = 0; il < m->n_layer; il++)
            for (int h = 0; h < 2; h++) {
                const double f = (h ? m->ffn_bytes : m->attn_bytes) / HR_MAX(m->layer_bytes, 1) / m->n_layer;
                for (int i = 0; i < p->n; i++) hpl_sched_burst(&s, p->dev[i], p->dc[i].compute_ms * f);
                hpl_sched_step(&s, ar);
            }
        hpl_sched_burst(&s, 0, p->head_extra_ms);
        hpl_sched_step(&s, layers - p->compute_ms);   /* blocked on disk */
        p->quota_ms = hpl_sched_run(c, &s);
        hpl_sched_free(&s);
    }
    p->dc[0].compute_ms += p->head_extra_ms;
    p->compute_ms += p->quota_ms;
    p->comm_ms = fwd + 2.0 * m->n_layer * ar;
    p->n_messages = (p->n - 1) * (1 + 4 * m->n_layer);
    p->ms_per_token = layers + p->head_extra_ms + p->comm_ms + p->quota_ms;
    double pf = layers_pf + p->head_extra_ms + nb * (fwd_pf + 2.0 * m->n_layer * ar_pf);
    p->prefill_ms = pf + HR_MAX(0, nb * stream - pf);
    p->feasible = true;
    hpl_loss_tp(c, m, n_prompt, p); /* what lost packets cost (loss.c) */
    return 0;
}

/* A hybrid plan's group stage gs: its members dev[gs..gs + g) run the stage's layers tensor parallel
   (each member its share of them, as hpl_tp_dev; the slowest member sets the stage's time), and the
   group's messages: a FORWARD from the leader dev[gs] (the head, or the worker the previous stage hands
   the hidden state to) to every member per non-empty window of the stage, a star all-reduce around the
   leader after every block (docs/planner.md, "Hybrid plans"). *t: compute, *tb: blocked on disk, *t_pf:
   prefill. */
static bool hpl_group_cost(const hpl_cluster *c, const hpl_model *m, const hc_pp_plan *pl, int gs, int g, int n_prompt,
                           hpl_plan *p, double *t, double *tb, double *t_pf, double *comm, double *comm_pf,
                           double *loss, double *loss_pf, double *fwd, double *ar) {
    hpl_model ms = *m;
    ms.n_layer = 0;
    int nwin = 0;
    for (int w = 0; w < pl->n_win[gs]; w++) {
        ms.n_layer += pl->win[gs][w].end - pl->win[gs][w].begin;
        nwin += pl->win[gs][w].end > pl->win[gs][w].begin;
    }
    if (ms.n_layer == 0) {
        if (gs) snprintf(p->why, sizeof p->why, "stage %d's group gets no layers", gs);
        else snprintf(p->why, sizeof p->why, "the head's group gets no layers");
        return false;
    }
    hpl_plan pg = *p;   /* the group as a TP plan of its own: pg.dev[i] = dev[gs + i] */
    pg.n = g;
    memcpy(pg.dev, p->dev + gs, sizeof pg.dev[0] * (size_t)g);
    const int lead = p->dev[gs];
    const double B = m->n_embd * 4.0 + HPL_MSG_OVERHEAD;
    const int per = HR_MIN(n_prompt, m->n_batch);
    double rtt = 0, up = 0, up_pf = 0, worst = 0;
    *t = *t_pf = 0;
    for (int i = 0; i < g; i++) {
        bool ok;
        hpl_dev_cost *dc = &p->dc[gs + i];
        worst = HR_MAX(worst, hpl_tp_dev(c, &ms, &pg, i, p->share[i], dc, &ok, p->why, sizeof p->why));
        if (!ok) return false;
        dc->window = p->window[gs];
        *t = HR_MAX(*t, dc->compute_ms);
        *t_pf = HR_MAX(*t_pf, hpl_layers_ms(&c->dev[pg.dev[i]], m, ms.n_layer, p->share[i], n_prompt, hpl_mapped(dc)));
        if (i == 0) continue;
        const int d = pg.dev[i];
        const hpl_link *l = hpl_link_of(c, lead, d);
        double gbps = l->gbps > 0 ? l->gbps : 0.1;
        rtt = HR_MAX(rtt, l->rtt_ms);   /* the latencies overlap, the bytes all pass the leader's link */
        up += B / (gbps * 1e6);
        up_pf += B * per / (gbps * 1e6);
        /* TCP's recoveries of lost segments (loss.c): the member's FORWARDs and its two all-reduces a layer */
        *loss += nwin * hpl_tcp_recovery_ms(c, lead, d, B) +
                 2.0 * ms.n_layer * (hpl_tcp_recovery_ms(c, d, lead, B) + hpl_tcp_recovery_ms(c, lead, d, B));
        *loss_pf += nwin * hpl_tcp_recovery_ms(c, lead, d, B * per) +
                    2.0 * ms.n_layer * (hpl_tcp_recovery_ms(c, d, lead, B * per) + hpl_tcp_recovery_ms(c, lead, d, B * per));
    }
    *fwd = rtt / 2 + up;
    *ar = rtt + 2 * up;
    /* a member that streams: its loader played out over its pins (hpl_stream_sim), reading on in the waits
       for the all-reduce after every block; the rest of the ring's time is not counted as idle here (it is
       not known yet), so a member's wait is if anything overstated */
    worst = 0;
    for (int i = 0; i < g; i++) {
        hpl_dev_cost *dc = &p->dc[gs + i];
        const bool head = pg.dev[i] == 0;
        const double head_ms = head ? hpl_head_extra_ms(&c->dev[0], m, hpl_mapped(dc)) : 0;
        hpl_sim_in in = {.x = p->share[i], .win = pl->win[gs], .n_win = pl->n_win[gs], .head = head,
                         .layers_ms = dc->compute_ms, .head_ms = head_ms, .block_gap = *ar, .budget = dc->budget,
                         .kv = dc->kv_bytes, .scratch = dc->scratch_bytes,
                         .ms_per_byte = hpl_disk_ms_per_byte(&c->dev[pg.dev[i]])};
        const double sim = dc->mmap || dc->stream_bytes <= 0 ? -1 : hpl_stream_sim(m, &in);
        if (sim >= 0) dc->blocked_ms = sim;
        worst = HR_MAX(worst, dc->compute_ms + dc->blocked_ms);
    }
    *tb = worst - *t;
    *comm += nwin * (rtt / 2 + up) + 2.0 * ms.n_layer * (rtt + 2 * up);
    *comm_pf += nwin * (rtt / 2 + up_pf) + 2.0 * ms.n_layer * (rtt + 2 * up_pf);
    p->n_messages += (g - 1) * (nwin + 4 * ms.n_layer);
    return true;
}

/* A ring's quota_ms (hpl_sched_run): the token as the walk of hpl_cost_pp's hand-offs, each window's
   layers a burst of its device (a group's: every block a burst of every member, then the all-reduce), the
   output head last. di: stage -> index into p->dev; g, gs: the group and its stage; g_fwd, g_ar: the
   group's FORWARD and all-reduce; tail: what else waits (disk, TCP's recoveries). */
static double hpl_pp_quota(const hpl_cluster *c, const hpl_model *m, const hpl_plan *p, const hc_pp_plan *pl,
                           const int *di, int g, int gs, double g_fwd, double g_ar, double tail) {
    const double B = m->n_embd * 4.0 + HPL_MSG_OVERHEAD;
    const double fa = m->attn_bytes / HR_MAX(m->layer_bytes, 1), ff = m->ffn_bytes / HR_MAX(m->layer_bytes, 1);
    if (!hpl_plan_bursts(c, p)) return 0;
    int at = 0, wi[HC_MAX_DEVICES] = {0};
    double per[HPL_MAX_DEVICES] = {0};   /* index into p->dev -> ms per layer (a member: of its share) */
    for (int i = 0; i < p->n; i++) {
        const hpl_dev_cost *dc = &p->dc[i];
        double own = dc->compute_ms - (i == 0 ? p->head_extra_ms : 0);
        int layers = g > 1 && i >= gs && i < gs + g ? p->dc[gs].layers : dc->layers;
        per[i] = layers > 0 ? own / layers : 0;
    }
    hpl_sched s = {0};
    hpl_sched_steady(&s, p);
    for (int k = 0; k <= pl->n_steps; k++) {
        int to = k < pl->n_steps ? pl->step_dev[k] : 0;
        if (to <= at && at != 0) {
            hpl_sched_step(&s, hpl_hop_ms(c, p->dev[di[at]], 0, B));
            at = 0;
        } else if (to != at) {
            hpl_sched_step(&s, hpl_hop_ms(c, p->dev[di[at]], p->dev[di[to]], B));
            at = to;
        }
        if (k == pl->n_steps) break;
        if (to != at) {   /* from the head on to `to` */
            hpl_sched_step(&s, hpl_hop_ms(c, 0, p->dev[di[to]], B));
            at = to;
        }
        const hm_window *w = &pl->win[to][wi[to]++];
        const int n = w->end - w->begin;
        if (n <= 0) continue;
        if (g > 1 && to == gs) {
            hpl_sched_step(&s, g_fwd);
            for (int il = 0; il < n; il++)
                for (int h = 0; h < 2; h++) {
                    for (int i = gs; i < gs + g; i++) hpl_sched_burst(&s, p->dev[i], per[i] * (h ? ff : fa));
                    hpl_sched_step(&s, g_ar);
                }
        } else {
            hpl_sched_step(&s, 0);
            hpl_sched_burst(&s, p->dev[di[to]], per[di[to]] * n);
        }
    }
    hpl_sched_step(&s, 0);
    hpl_sched_burst(&s, 0, p->head_extra_ms);
    hpl_sched_step(&s, tail);
    double q = hpl_sched_run(c, &s);
    hpl_sched_free(&s);
    return q;
}

/* A piped ring (PP), or a hybrid plan: the same ring one of whose stages, gs, is the group
   dev[gs..gs + g); every other stage one device (g = 1: every device a stage). */
static int hpl_cost_pp(const hpl_cluster *c, const hpl_model *m, int n_prompt, hpl_plan *p, hr_err *err) {
    const int g = p->kind == HPL_HYBRID ? p->group : 1, ns = p->n - g + 1, gs = g > 1 ? p->gstage : 0;
    if (g < 1 || ns < 2) {
        snprintf(p->why, sizeof p->why, "a group of %d of the %d devices leaves no other stage", g, p->n);
        return 0;
    }
    hc_pp_plan pl;
    hr_err e = {0};
    if (hc_pp_plan_make(m->n_layer, p->window, ns, &pl, &e)) {
        snprintf(p->why, sizeof p->why, "windows: %.200s", e.msg);
        return 0;
    }
    p->trips = HR_MAX(1, pl.n_rounds);
    int di[HPL_MAX_DEVICES];   /* stage -> index into p->dev */
    for (int st = 0; st < ns; st++) di[st] = st <= gs ? st : g - 1 + st;
    const double B = m->n_embd * 4.0 + HPL_MSG_OVERHEAD;
    int nb = (n_prompt + m->n_batch - 1) / m->n_batch, per = HR_MIN(n_prompt, m->n_batch);
    /* the hand-offs of a pass: from the head round the ring, a window at a time, back to the head */
    double comm = 0, comm_pf = 0, loss = 0, loss_pf = 0;   /* loss: TCP's recoveries (loss.c) */
    int at = 0, hops = 0;
    for (int s = 0; s <= pl.n_steps; s++) {
        int to = s < pl.n_steps ? pl.step_dev[s] : 0;
        /* round the ring's end, back through the head: also from a device to itself, its next window
           being a trip later (the other devices own nothing on the way; hc_pp_plan_make) */
        if (to <= at && at != 0) {
            comm += hpl_hop_ms(c, p->dev[di[at]], 0, B);
            comm_pf += hpl_hop_ms(c, p->dev[di[at]], 0, B * per);
            loss += hpl_tcp_recovery_ms(c, p->dev[di[at]], 0, B);
            loss_pf += hpl_tcp_recovery_ms(c, p->dev[di[at]], 0, B * per);
            hops++;
            at = 0;
            if (to == 0) continue;
        }
        if (to == at) continue; /* the head's windows, one after another */
        comm += hpl_hop_ms(c, p->dev[di[at]], p->dev[di[to]], B);
        comm_pf += hpl_hop_ms(c, p->dev[di[at]], p->dev[di[to]], B * per);
        loss += hpl_tcp_recovery_ms(c, p->dev[di[at]], p->dev[di[to]], B);
        loss_pf += hpl_tcp_recovery_ms(c, p->dev[di[at]], p->dev[di[to]], B * per);
        hops++;
        at = to;
    }
    p->n_messages = hops;
    double sum_c = 0, sum_pf = 0, blocked = 0, blocked_pf = 0, g_fwd = 0, g_ar = 0;
    if (g > 1) {
        double t, tb, t_pf;
        if (!hpl_group_cost(c, m, &pl, gs, g, n_prompt, p, &t, &tb, &t_pf, &comm, &comm_pf, &loss, &loss_pf, &g_fwd, &g_ar))
            return 0;
        /* the head's output head, priced once its memory says whether it computes from the mapping */
        if (gs == 0) p->head_extra_ms = hpl_head_extra_ms(&c->dev[0], m, hpl_mapped(&p->dc[0]));
        double extra = gs == 0 ? p->head_extra_ms : 0;
        p->dc[gs].compute_ms += extra;
        sum_c += t + extra;
        sum_pf += t_pf + extra;
        blocked += tb;
    }
    for (int st = 0; st < ns; st++) {
        if (g > 1 && st == gs) continue;
        const int i = di[st];
        hpl_dev_cost *dc = &p->dc[i];
        const hpl_device *d = &c->dev[p->dev[i]];
        memset(dc, 0, sizeof *dc);
        dc->dev = p->dev[i];
        dc->window = p->window[st];
        for (int w = 0; w < pl.n_win[st]; w++) dc->layers += pl.win[st][w].end - pl.win[st][w].begin;
        if (!hpl_memory(d, m, dc->layers * m->layer_bytes, i == 0 ? m->out_bytes : 0, dc->layers * m->kv_bytes_per_layer,
                        m->block_max_bytes, dc, p->why, sizeof p->why))
            return 0;
        if (i == 0) p->head_extra_ms = hpl_head_extra_ms(d, m, hpl_mapped(dc)); /* as in the group above */
        dc->compute_ms = hpl_layers_ms(d, m, dc->layers, 1, 0, hpl_mapped(dc)) + (i == 0 ? p->head_extra_ms : 0) +
                         hpl_loader_ms(d, dc);
        dc->stream_ms = dc->stream_bytes * hpl_disk_ms_per_byte(d);
        sum_c += dc->compute_ms;
        sum_pf += hpl_layers_ms(d, m, dc->layers, 1, n_prompt, hpl_mapped(dc)) + (i == 0 ? p->head_extra_ms : 0);
    }
    /* TPI-LLM Prop. 4 / prima.cpp: a device's loader reads while it computes and, up to the room it
       has for each window, while the rest of the ring computes; what is left blocks (a group's members
       stream as tensor-parallel devices do, counted above) */
    for (int st = 0; st < ns; st++) {
        if (g > 1 && st == gs) continue;
        hpl_dev_cost *dc = &p->dc[di[st]];
        if (dc->stream_bytes <= 0) continue;
        const hpl_device *d = &c->dev[p->dev[di[st]]];
        double idle = sum_c - dc->compute_ms + comm;
        double room_ms = pl.n_win[st] * HR_MIN(2 * m->block_max_bytes, dc->stream_bytes) * hpl_disk_ms_per_byte(d);
        const double head_ms = di[st] == 0 ? p->head_extra_ms : 0;
        hpl_sim_in in = {.x = 1, .win = pl.win[st], .n_win = pl.n_win[st], .head = di[st] == 0,
                         .layers_ms = dc->compute_ms - head_ms, .head_ms = head_ms, .idle_ms = idle,
                         .budget = dc->budget, .kv = dc->kv_bytes, .scratch = dc->scratch_bytes,
                         .ms_per_byte = hpl_disk_ms_per_byte(d)};
        double sim = dc->mmap ? -1 : hpl_stream_sim(m, &in);
        dc->blocked_ms = sim >= 0 ? sim : hpl_blocked(dc, HR_MIN(idle, room_ms));
        blocked += dc->blocked_ms;
        double own_pf = hpl_layers_ms(d, m, dc->layers, 1, n_prompt, hpl_mapped(dc));
        blocked_pf += HR_MAX(0, dc->stream_ms - own_pf - HR_MIN(sum_pf - own_pf + comm_pf, room_ms));
    }
    p->quota_ms = hpl_pp_quota(c, m, p, &pl, di, g, gs, g_fwd, g_ar, blocked + loss);
    comm += loss;
    comm_pf += loss_pf;
    p->loss_ms = loss;
    p->compute_ms = sum_c + p->quota_ms;
    p->comm_ms = comm;
    p->blocked_ms = blocked;
    p->ms_per_token = p->compute_ms + comm + blocked;
    p->prefill_ms = nb * (sum_pf + comm_pf + blocked_pf) - (nb - 1) * p->head_extra_ms;
    p->feasible = true;
    (void)err;
    return 0;
}

int hpl_disk_first(const hpl_cluster *c, int i) {
    if (!c->dev[i].disk_id[0]) return -1;
    for (int j = 0; j < i; j++)
        if (!strcmp(c->dev[j].disk_id, c->dev[i].disk_id)) return j;
    return i;
}

/* Devices that read their weights from one disk (the same disk_id: two workers on one machine, the testbed's
   devices) share its throughput: each device's streaming is costed at the speed it measured alone, and a
   token takes at least what the disk needs to read all their streamed bytes one after another. (home4-8b-small,
   session 26's sweep recosted: pipelines in which two devices stream came out 41-61% fast without this bound,
   2-28% with it; docs/planner.md, "Session 27".) A bound only: how much of the reading overlaps compute is the
   devices' own business (hpl_blocked). */
static void hpl_shared_disks(const hpl_cluster *c, hpl_plan *p) {
    double sum[HPL_MAX_DEVICES] = {0}, worst = 0;
    int k[HPL_MAX_DEVICES] = {0};
    for (int i = 0; i < p->n; i++) {
        const int d = hpl_disk_first(c, p->dev[i]);
        if (d < 0) continue;
        sum[d] += p->dc[i].stream_ms;
        k[d] += p->dc[i].stream_bytes > 0;
        if (k[d] > 1) worst = HR_MAX(worst, sum[d]);
    }
    if (worst > p->ms_per_token) {
        p->shared_disk_ms = worst - p->ms_per_token;
        p->blocked_ms += p->shared_disk_ms;
        p->ms_per_token = worst;
    }
}

int hpl_cost(const hpl_cluster *c, const hpl_model *m, int n_prompt, hpl_plan *p, hr_err *err) {
    p->feasible = false;
    p->why[0] = 0;
    p->ms_per_token = p->prefill_ms = INFINITY;
    p->compute_ms = p->comm_ms = p->blocked_ms = p->head_extra_ms = p->quota_ms = p->shared_disk_ms = 0;
    p->loss_ms = p->p_hit = p->elements_lost = p->lost_fraction = 0;
    p->n_messages = 0;
    memset(p->dc, 0, sizeof p->dc);
    if (n_prompt < 1) n_prompt = 1;
    if (p->n < 1 || p->n > c->n || p->dev[0] != 0) return hr_fail(err, HR_EINVAL, "a plan's first device must be the head");
    int rc;
    switch (p->kind) {
    case HPL_SINGLE: rc = p->n == 1 ? hpl_cost_single(c, m, n_prompt, p) : hr_fail(err, HR_EINVAL, "single: one device"); break;
    case HPL_TP: rc = p->n >= 2 ? hpl_cost_tp(c, m, n_prompt, p) : hr_fail(err, HR_EINVAL, "tp: two devices or more"); break;
    case HPL_PP: rc = p->n >= 2 ? hpl_cost_pp(c, m, n_prompt, p, err) : hr_fail(err, HR_EINVAL, "pp: two devices or more"); break;
    case HPL_HYBRID:
        rc = p->n >= 3 && p->group >= 2 && p->group < p->n && p->gstage >= 0 && p->gstage <= p->n - p->group
           ? hpl_cost_pp(c, m, n_prompt, p, err)
           : hr_fail(err, HR_EINVAL, "hybrid: a group of two devices or more at one of the stages, and another stage");
        break;
    default: rc = hr_fail(err, HR_EINVAL, "plan kind %d", p->kind);
    }
    if (!rc && p->lossy && p->kind != HPL_TP) rc = hr_fail(err, HR_EINVAL, "the lossy all-reduce is tensor parallelism's");
    if (!rc && p->feasible) hpl_shared_disks(c, p);
    if (!p->feasible) p->ms_per_token = p->prefill_ms = INFINITY;
    return rc;
}

void hpl_plan_describe(const hpl_plan *p, char *buf, size_t cap) {
    size_t n = 0;
    if (p->kind == HPL_SINGLE) { snprintf(buf, cap, "single device (the head)"); return; }
    const bool hy = p->kind == HPL_HYBRID;
    n += (size_t)snprintf(buf + n, cap - n, "%s%s over %d devices (", hpl_kind_name(p->kind),
                          p->lossy ? " (lossy)" : "", p->n);
    for (int i = 0; i < p->n && n < cap; i++)  /* hybrid: the stages, "0+1,2,3" or "0,1+2,3" */
        n += (size_t)snprintf(buf + n, cap - n, "%s%d", !i ? "" : hy && i > p->gstage && i < p->gstage + p->group ? "+" : ",",
                              p->dev[i]);
    if (n < cap && (p->kind == HPL_TP || hy)) {
        n += (size_t)snprintf(buf + n, cap - n, "), shares ");
        for (int i = 0; i < (hy ? p->group : p->n) && n < cap; i++)
            n += (size_t)snprintf(buf + n, cap - n, "%s%.3f", i ? "," : "", p->share[i]);
    }
    if (n < cap && p->kind != HPL_TP) {
        n += (size_t)snprintf(buf + n, cap - n, "%swindows ", hy ? ", " : "), ");
        for (int i = 0; i < (hy ? p->n - p->group + 1 : p->n) && n < cap; i++)
            n += (size_t)snprintf(buf + n, cap - n, "%s%d", i ? "," : "", p->window[i]);
        if (n < cap) snprintf(buf + n, cap - n, ", %d trip%s", p->trips, p->trips == 1 ? "" : "s");
    }
}
