/* groups: what each group of tensor-parallel units contributes to a block's output — calibration's
 * statistics and the lossy-link simulation (model.h, "unit groups"; docs/lossy.md).
 *
 * The probe sees a block's activations a (the input of attn_output / ffn_down) and its output x. The
 * output is W a = sum over groups g of W[:, cols(g)] a[cols(g)], so a group's contribution to output
 * element r is the dot product of row r's columns of g with a's; the copy of W here is F32, one
 * [n_embd][K] matrix per layer and block.
 */
#include "model-impl.h"

#include <stdlib.h>

struct hm_groups {
    const hm_model *m;
    int32_t L, E;
    int64_t K[2];            /* activation width per block: n_head * head_dim, n_ff */
    int32_t cols[2];         /* columns per group */
    int32_t count[2];        /* groups per block */
    int32_t stride;          /* max(count) */
    float  *w[2];            /* [L][E][K] dequantized attn_output, ffn_down */
    /* statistics */
    bool     stats;
    double  *norm_sum;       /* [L][2][stride] */
    uint64_t tokens;
    /* loss simulation */
    bool     lossy;
    int      n_dev;
    double   loss[HM_GROUPS_MAX_DEV];
    int32_t *assign;         /* [L][2][stride] */
    int32_t  packet;
    uint64_t seed;
    int      rank;           /* enum hm_groups_rank */
    int32_t  protect;        /* HM_RANK_PROTECT: groups per token moved to the head */
    int32_t  dev_count[2][HM_GROUPS_MAX_DEV]; /* ranked modes: groups per device */
    int      dev_order[HM_GROUPS_MAX_DEV];  /* devices by loss, lowest first */
    int32_t *tok_assign;     /* ranked modes: [n_batch][stride], grown as needed */
    size_t   tok_cap;
    double  *tok_norm;       /* [stride] */
    double  *norms;          /* ranked modes: [n_batch][stride], grown as needed */
    size_t   norms_cap;
    double  *prev_norm;      /* HM_RANK_PREV: [L][2][stride] the last token's norms of each block */
    /* HM_RANK_LOWRANK: per layer, gate and up as Q [n_ff][k] and B [k][E] (W ~ Q B); ffn_down's column norms */
    int32_t  lr_k;
    float   *lr_q[2], *lr_b[2];
    float   *down_norm;      /* [L][n_ff] */
    float   *lr_scratch;     /* [2][n_ff] + [k] */
    hm_groups_counters cnt;
};

void hm_groups_free(hm_groups *g) {
    if (!g) return;
    free(g->w[0]);
    free(g->w[1]);
    free(g->norm_sum);
    free(g->assign);
    free(g->tok_assign);
    free(g->tok_norm);
    free(g->norms);
    free(g->prev_norm);
    for (int i = 0; i < 2; i++) {
        free(g->lr_q[i]);
        free(g->lr_b[i]);
    }
    free(g->down_norm);
    free(g->lr_scratch);
    free(g);
}

hm_groups *hm_groups_create(const hm_model *m, int32_t att_kv, int32_t ff, hr_err *err) {
    const hm_hparams *hp = &m->hp;
    if (m->is_slice || m->has_layer) {
        hr_fail(err, HR_EINVAL, "unit groups need the whole model, not a slice file");
        return NULL;
    }
    if (att_kv < 1 || att_kv > hp->n_head_kv || ff < 1 || ff > hp->n_ff) {
        hr_fail(err, HR_EINVAL, "group sizes %d KV heads, %d neurons out of range", att_kv, ff);
        return NULL;
    }
    hm_groups *g = calloc(1, sizeof *g);
    if (!g) goto oom;
    g->m = m;
    g->L = hp->n_layer;
    g->E = hp->n_embd;
    g->K[0] = (int64_t)hp->n_head * hp->head_dim;
    g->K[1] = hp->n_ff;
    g->cols[0] = att_kv * (hp->n_head / hp->n_head_kv) * hp->head_dim;
    g->cols[1] = ff;
    for (int b = 0; b < 2; b++) {
        g->count[b] = (int32_t)((g->K[b] + g->cols[b] - 1) / g->cols[b]);
        g->stride = HR_MAX(g->stride, g->count[b]);
        if (!(g->w[b] = malloc(sizeof(float) * (size_t)g->L * (size_t)g->E * (size_t)g->K[b]))) goto oom;
        for (int il = 0; il < g->L; il++) {
            const hm_tensor *t = b == 0 ? &m->layers[il].wo : &m->layers[il].w_down;
            if (t->ne0 != g->K[b] || t->ne1 != g->E) {
                hr_fail(err, HR_EFORMAT, "layer %d: %s is %lld x %lld", il, b == 0 ? "attn_output" : "ffn_down",
                        (long long)t->ne0, (long long)t->ne1);
                hm_groups_free(g);
                return NULL;
            }
            for (int32_t r = 0; r < g->E; r++)
                hm_tensor_row_f32(t, r, g->w[b] + ((size_t)il * g->E + r) * (size_t)g->K[b]);
        }
    }
    const size_t cells = (size_t)g->L * 2 * (size_t)g->stride;
    if (!(g->norm_sum = calloc(cells, sizeof *g->norm_sum)) || !(g->assign = calloc(cells, sizeof *g->assign)) ||
        !(g->tok_norm = malloc(sizeof *g->tok_norm * (size_t)g->stride)) ||
        !(g->prev_norm = calloc(cells, sizeof *g->prev_norm)))
        goto oom;
    return g;
oom:
    hm_groups_free(g);
    hr_fail(err, HR_ENOMEM, "out of memory for the unit groups' copy of attn_output and ffn_down");
    return NULL;
}

int32_t hm_groups_count(const hm_groups *g, enum hm_block b) { return g->count[b == HM_BLOCK_FFN]; }
int32_t hm_groups_stride(const hm_groups *g) { return g->stride; }
uint64_t hm_groups_tokens(const hm_groups *g) { return g->tokens; }
hm_groups_counters hm_groups_get_counters(const hm_groups *g) { return g->cnt; }

void hm_groups_stats(hm_groups *g, bool on) {
    g->stats = on;
    g->tokens = 0;
    memset(g->norm_sum, 0, sizeof *g->norm_sum * (size_t)g->L * 2 * (size_t)g->stride);
}

void hm_groups_mean_norms(const hm_groups *g, int layer, enum hm_block b, double *out) {
    const int bi = b == HM_BLOCK_FFN;
    const double *s = g->norm_sum + ((size_t)layer * 2 + bi) * (size_t)g->stride;
    for (int32_t i = 0; i < g->count[bi]; i++) out[i] = g->tokens ? s[i] / (double)g->tokens : 0;
}

static double hm_dot(const float *w, const float *a, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)w[i] * a[i];
    return s;
}

/* a uniform number in [0, 1) from the packet's identity (splitmix64's finalizer over a mix of them) */
static double hm_packet_draw(uint64_t seed, uint64_t call, int dev, uint64_t packet) {
    uint64_t z = seed ^ (call * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)dev * 0xC2B2AE3D27D4EB4Full) ^
                 (packet * 0x165667B19E3779F9ull);
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

/* ---- the low-rank FFN predictor (HM_RANK_LOWRANK) ------------------------------------------------------ */

/* orthonormal columns of a [m][k] row-major matrix, in place (modified Gram-Schmidt; a column that
   vanishes stays zero) */
static void hm_orthonormalize(float *a, int64_t m, int32_t k) {
    for (int32_t j = 0; j < k; j++) {
        for (int32_t i = 0; i < j; i++) {
            double d = 0;
            for (int64_t r = 0; r < m; r++) d += (double)a[r * k + i] * a[r * k + j];
            for (int64_t r = 0; r < m; r++) a[r * k + j] -= (float)d * a[r * k + i];
        }
        double n2 = 0;
        for (int64_t r = 0; r < m; r++) n2 += (double)a[r * k + j] * a[r * k + j];
        const float inv = n2 > 0 ? (float)(1 / sqrt(n2)) : 0;
        for (int64_t r = 0; r < m; r++) a[r * k + j] *= inv;
    }
}

/* W [m][E] ~ Q [m][k] B [k][E]: Q spans W's range found from W times a random [E][k] matrix, refined by
   one power iteration (Q = orth(W orth(W^T Q))); B = Q^T W */
static bool hm_lowrank(const float *W, int64_t m, int32_t E, int32_t k, uint64_t seed, float *Q, float *B) {
    float *om = malloc(sizeof *om * (size_t)E * (size_t)k);
    if (!om) return false;
    for (size_t i = 0; i < (size_t)E * (size_t)k; i++) /* a centred uniform; its range is what matters */
        om[i] = (float)(hm_packet_draw(seed, i, 0, 0) - 0.5);
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t r = 0; r < m; r++) /* Q = W om */
            for (int32_t j = 0; j < k; j++) {
                double d = 0;
                for (int32_t e = 0; e < E; e++) d += (double)W[r * E + e] * om[(size_t)e * k + j];
                Q[r * k + j] = (float)d;
            }
        hm_orthonormalize(Q, m, k);
        if (pass == 1) break;
        for (int32_t e = 0; e < E; e++) /* om = W^T Q */
            for (int32_t j = 0; j < k; j++) {
                double d = 0;
                for (int64_t r = 0; r < m; r++) d += (double)W[r * E + e] * Q[r * k + j];
                om[(size_t)e * k + j] = (float)d;
            }
        hm_orthonormalize(om, E, k);
    }
    for (int32_t j = 0; j < k; j++) /* B = Q^T W */
        for (int32_t e = 0; e < E; e++) {
            double d = 0;
            for (int64_t r = 0; r < m; r++) d += (double)Q[r * k + j] * W[r * E + e];
            B[(size_t)j * E + e] = (float)d;
        }
    free(om);
    return true;
}

static int hm_lowrank_setup(hm_groups *g, int32_t k, hr_err *err) {
    if (k < 1 || k > g->E)
        return hr_fail(err, HR_EINVAL, "loss simulation: predictor rank %d outside [1, %d]", k, g->E);
    if (g->lr_k == k) return 0;
    const int64_t F = g->K[1];
    for (int i = 0; i < 2; i++) {
        free(g->lr_q[i]);
        free(g->lr_b[i]);
        g->lr_q[i] = malloc(sizeof(float) * (size_t)g->L * (size_t)F * (size_t)k);
        g->lr_b[i] = malloc(sizeof(float) * (size_t)g->L * (size_t)k * (size_t)g->E);
    }
    free(g->lr_scratch);
    g->lr_scratch = malloc(sizeof(float) * (size_t)(2 * F + k));
    if (!g->down_norm) g->down_norm = malloc(sizeof(float) * (size_t)g->L * (size_t)F);
    float *W = malloc(sizeof(float) * (size_t)F * (size_t)g->E);
    bool ok = W && g->lr_q[0] && g->lr_q[1] && g->lr_b[0] && g->lr_b[1] && g->lr_scratch && g->down_norm;
    for (int il = 0; ok && il < g->L; il++) {
        for (int i = 0; ok && i < 2; i++) {
            const hm_tensor *t = i == 0 ? &g->m->layers[il].w_gate : &g->m->layers[il].w_up;
            for (int64_t r = 0; r < F; r++) hm_tensor_row_f32(t, r, W + (size_t)r * g->E);
            ok = hm_lowrank(W, F, g->E, k, g->seed + 17 * (uint64_t)il + (uint64_t)i,
                            g->lr_q[i] + (size_t)il * F * k, g->lr_b[i] + (size_t)il * k * g->E);
        }
        const float *D = g->w[1] + (size_t)il * g->E * F; /* ffn_down [E][F] */
        for (int64_t j = 0; j < F; j++) {
            double n2 = 0;
            for (int32_t r = 0; r < g->E; r++) n2 += (double)D[(size_t)r * F + j] * D[(size_t)r * F + j];
            g->down_norm[(size_t)il * F + j] = (float)sqrt(n2);
        }
    }
    free(W);
    if (!ok) {
        g->lr_k = 0;
        return hr_fail(err, HR_ENOMEM, "out of memory for the low-rank predictor");
    }
    g->lr_k = k;
    return 0;
}

/* The low-rank predictor of one layer: gate (0) and up (1) as Q [F][k] B [k][E], ffn_down's column norms dn [F],
   groups of `cols` neurons. The predicted contribution norms of its `count` groups for one token's normalized
   input xn: the norm over each group's neurons of silu(g) u times the neuron's down norm (scratch: pre [2][F],
   t [k]). The simulation's ranking (HM_RANK_LOWRANK) and the runtime's protected groups (hm_protect) alike. */
typedef struct hm_lr_layer {
    const float *q[2], *b[2], *dn;
    int64_t F;
    int32_t k, E, cols, count;
} hm_lr_layer;

static void hm_lr_norms(const hm_lr_layer *l, const float *xn, float *pre, float *t, double *out) {
    const int64_t F = l->F;
    const int32_t k = l->k, E = l->E;
    for (int i = 0; i < 2; i++) {
        for (int32_t j = 0; j < k; j++) t[j] = (float)hm_dot(l->b[i] + (size_t)j * E, xn, E);
        for (int64_t r = 0; r < F; r++) pre[i * F + r] = (float)hm_dot(l->q[i] + (size_t)r * k, t, k);
    }
    for (int32_t gi = 0; gi < l->count; gi++) {
        double s = 0;
        for (int64_t j = (int64_t)gi * l->cols; j < HR_MIN(F, (int64_t)(gi + 1) * l->cols); j++) {
            const double gate = pre[j], a = gate / (1 + exp(-gate)) * pre[F + j], c = a * l->dn[j];
            s += c * c;
        }
        out[gi] = sqrt(s);
    }
}

/* predicted contribution norms of the FFN groups for one token's normalized input xn */
static void hm_lowrank_norms(hm_groups *g, int layer, const float *xn, double *out) {
    const int64_t F = g->K[1];
    const int32_t k = g->lr_k, E = g->E;
    const size_t qo = (size_t)layer * F * k, bo = (size_t)layer * k * E;
    const hm_lr_layer l = {{g->lr_q[0] + qo, g->lr_q[1] + qo}, {g->lr_b[0] + bo, g->lr_b[1] + bo},
                           g->down_norm + (size_t)layer * F, F, k, E, g->cols[1], g->count[1]};
    hm_lr_norms(&l, xn, g->lr_scratch, g->lr_scratch + 2 * F, out);
}

static double hm_loss_of(const hm_groups_loss *l, int d) { return d == 0 ? 0 : l->loss[d]; }

int hm_groups_set_loss(hm_groups *g, const hm_groups_loss *l, hr_err *err) {
    memset(&g->cnt, 0, sizeof g->cnt);
    g->lossy = false;
    if (!l) return 0;
    if (l->n_dev < 1 || l->n_dev > HM_GROUPS_MAX_DEV || l->packet < 1)
        return hr_fail(err, HR_EINVAL, "loss simulation: %d devices, packets of %d elements", l->n_dev, l->packet);
    for (int d = 1; d < l->n_dev; d++)
        if (!(l->loss[d] >= 0 && l->loss[d] <= 1))
            return hr_fail(err, HR_EINVAL, "loss simulation: device %d's loss rate %g outside [0, 1]", d, l->loss[d]);
    if (l->rank < HM_RANK_STATIC || l->rank > HM_RANK_PROTECT)
        return hr_fail(err, HR_EINVAL, "loss simulation: ranking %d", l->rank);
    if (l->rank == HM_RANK_PROTECT && l->protect < 0)
        return hr_fail(err, HR_EINVAL, "loss simulation: %d groups protected", l->protect);
    if (l->rank != HM_RANK_STATIC && l->rank != HM_RANK_PROTECT) {
        for (int b = 0; b < 2; b++) {
            int64_t sum = 0;
            for (int d = 0; d < l->n_dev; d++) {
                g->dev_count[b][d] = l->count[b * l->n_dev + d];
                if (g->dev_count[b][d] < 0) return hr_fail(err, HR_EINVAL, "loss simulation: a negative group count");
                sum += g->dev_count[b][d];
            }
            if (sum != g->count[b])
                return hr_fail(err, HR_EINVAL, "loss simulation: %lld groups dealt of %d", (long long)sum,
                               hm_groups_count(g, b ? HM_BLOCK_FFN : HM_BLOCK_ATTN));
        }
        /* devices by loss, lowest first (ties: lower index), as hpl_place_groups orders them */
        for (int i = 0; i < l->n_dev; i++) {
            int j = i;
            for (; j > 0 && hm_loss_of(l, i) < hm_loss_of(l, g->dev_order[j - 1]); j--)
                g->dev_order[j] = g->dev_order[j - 1];
            g->dev_order[j] = i;
        }
    }
    for (int il = 0; l->assign && il < g->L; il++) /* ranked modes may leave it out */
        for (int b = 0; b < 2; b++)
            for (int32_t i = 0; i < g->count[b]; i++) {
                const size_t at = ((size_t)il * 2 + b) * (size_t)g->stride + i;
                if (l->assign[at] < 0 || l->assign[at] >= l->n_dev)
                    return hr_fail(err, HR_EINVAL, "loss simulation: layer %d group %d on device %d of %d", il, i,
                                   l->assign[at], l->n_dev);
                g->assign[at] = l->assign[at];
            }
    if (!l->assign && (l->rank == HM_RANK_STATIC || l->rank >= HM_RANK_LOWRANK))
        return hr_fail(err, HR_EINVAL, "loss simulation: no placement");
    g->seed = l->seed;
    if (l->rank >= HM_RANK_LOWRANK && hm_lowrank_setup(g, l->lowrank, err)) return err->code;
    g->rank = l->rank;
    g->protect = l->protect;
    memset(g->prev_norm, 0, sizeof *g->prev_norm * (size_t)g->L * 2 * (size_t)g->stride);
    g->n_dev = l->n_dev;
    g->loss[0] = 0;
    for (int d = 1; d < l->n_dev; d++) g->loss[d] = l->loss[d];
    g->packet = l->packet;
    g->lossy = true;
    return 0;
}

/* the L2 norm of each group's contribution to one token's output: out[count] */
static void hm_token_norms(const hm_groups *g, int bi, const float *W, const float *a, int64_t K, double *out) {
    const int32_t cols = g->cols[bi];
    for (int32_t i = 0; i < g->count[bi]; i++) {
        const int64_t c0 = (int64_t)i * cols, nc = HR_MIN((int64_t)cols, K - c0);
        double n2 = 0;
        for (int r = 0; r < g->E; r++) {
            const double s = hm_dot(W + (size_t)r * K + c0, a + c0, nc);
            n2 += s * s;
        }
        out[i] = sqrt(n2);
    }
}

typedef struct hm_rank { double v; int32_t i; } hm_rank;
static int hm_rank_desc(const void *a, const void *b) {
    const hm_rank *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

/* ranked modes: each token's groups to devices, the largest contributions (to this token, or to the
   one before) to the least lossy devices */
static bool hm_token_assign(hm_groups *g, int layer, int bi, size_t cell, const float *W, const float *in,
                            const float *act, int64_t K, int n) {
    const size_t need = (size_t)n * (size_t)g->stride;
    if (need > g->tok_cap) {
        int32_t *p = realloc(g->tok_assign, sizeof *p * need);
        double *q = realloc(g->norms, sizeof *q * need);
        if (p) g->tok_assign = p;
        if (q) g->norms = q;
        if (!p || !q) return false;
        g->tok_cap = need;
    }
    hm_rank *rk = malloc(sizeof *rk * (size_t)g->count[bi]);
    if (!rk) return false;
    for (int t = 0; t < n; t++) {
        double *nt = g->norms + (size_t)t * g->stride;
        if (g->rank >= HM_RANK_LOWRANK) hm_lowrank_norms(g, layer, in + (size_t)t * g->E, nt);
        else hm_token_norms(g, bi, W, act + (size_t)t * K, K, nt);
    }
    for (int t = 0; t < n; t++) {
        int32_t *as = g->tok_assign + (size_t)t * g->stride, next = 0;
        if (g->rank == HM_RANK_PROTECT) {
            /* the static placement, less each lossy device's groups predicted largest: to the head */
            const int32_t *st = g->assign + cell;
            const double *nrm = g->norms + (size_t)t * g->stride;
            memcpy(as, st, sizeof *as * (size_t)g->count[bi]);
            for (int d = 1; d < g->n_dev; d++) {
                if (!(g->loss[d] > 0)) continue;
                next = 0;
                for (int32_t i = 0; i < g->count[bi]; i++)
                    if (st[i] == d) rk[next++] = (hm_rank){nrm[i], i};
                qsort(rk, (size_t)next, sizeof *rk, hm_rank_desc);
                for (int32_t c = 0; c < HR_MIN(next, g->protect); c++) as[rk[c].i] = 0;
            }
            continue;
        }
        const double *nrm = g->rank != HM_RANK_PREV ? g->norms + (size_t)t * g->stride
                          : t > 0                    ? g->norms + (size_t)(t - 1) * g->stride
                                                     : g->prev_norm + cell;
        for (int32_t i = 0; i < g->count[bi]; i++) rk[i] = (hm_rank){nrm[i], i};
        qsort(rk, (size_t)g->count[bi], sizeof *rk, hm_rank_desc);
        for (int k = 0; k < g->n_dev; k++)
            for (int32_t c = 0; c < g->dev_count[bi][g->dev_order[k]]; c++) as[rk[next++].i] = g->dev_order[k];
    }
    memcpy(g->prev_norm + cell, g->norms + (size_t)(n - 1) * g->stride, sizeof *g->prev_norm * (size_t)g->count[bi]);
    free(rk);
    return true;
}

static void hm_groups_probe(void *user, int layer, enum hm_block block, const float *in, const float *act, int64_t K,
                            float *x, int n, int E) {
    hm_groups *g = user;
    const int bi = block == HM_BLOCK_FFN;
    HR_ASSERT(K == g->K[bi] && E == g->E && layer >= 0 && layer < g->L); /* a full shard of this model */
    const float *W = g->w[bi] + (size_t)layer * (size_t)E * (size_t)K;
    const int32_t cols = g->cols[bi], count = g->count[bi];
    const size_t cell = ((size_t)layer * 2 + bi) * (size_t)g->stride;
    if (g->stats) {
        if (layer == 0 && bi == 0) g->tokens += (uint64_t)n;
        double *sum = g->norm_sum + cell;
        for (int t = 0; t < n; t++) {
            hm_token_norms(g, bi, W, act + (size_t)t * K, K, g->tok_norm);
            for (int32_t i = 0; i < count; i++) sum[i] += g->tok_norm[i];
        }
    }
    if (!g->lossy || layer == 0) return;
    /* HM_RANK_LOWRANK and HM_RANK_PROTECT rank the FFN only */
    const bool ranked = g->rank != HM_RANK_STATIC && (g->rank < HM_RANK_LOWRANK || bi == 1);
    const bool assigned = !ranked || hm_token_assign(g, layer, bi, cell, W, in, act, K, n);
    HR_ASSERT(assigned); /* out of memory for a few ints per token: the simulation cannot go on */
    const uint64_t call = g->cnt.allreduces++;
    const int64_t total = (int64_t)n * E, npk = (total + g->packet - 1) / g->packet;
    for (int d = 1; d < g->n_dev; d++) {
        g->cnt.packets += (uint64_t)npk;
        g->cnt.elems += (uint64_t)total;
        for (int64_t pk = 0; pk < npk; pk++) {
            if (hm_packet_draw(g->seed, call, d, (uint64_t)pk) >= g->loss[d]) continue;
            const int64_t e0 = pk * g->packet, e1 = HR_MIN(total, e0 + g->packet);
            g->cnt.lost++;
            g->cnt.elems_lost += (uint64_t)(e1 - e0);
            for (int64_t e = e0; e < e1; e++) {
                const int64_t t = e / E, r = e % E;
                const float *a = act + (size_t)t * K, *w = W + (size_t)r * K;
                const int32_t *as = ranked ? g->tok_assign + (size_t)t * g->stride : g->assign + cell;
                double s = 0;
                for (int32_t i = 0; i < count; i++) {
                    if (as[i] != d) continue;
                    const int64_t c0 = (int64_t)i * cols;
                    s += hm_dot(w + c0, a + c0, HR_MIN((int64_t)cols, K - c0));
                }
                x[e] -= (float)s;
            }
        }
    }
}

void hm_groups_attach(hm_groups *g, hm_shard *s) {
    s->probe = hm_groups_probe;
    s->probe_user = g;
}

/* ---- protected groups (model.h, hm_protect) -------------------------------------------------------------- */

struct hm_protect {
    int32_t L, E, F, group, count, k, n_protect;
    float  *q[2], *b[2];     /* per layer: gate and up as Q [F][k] B [k][E] */
    float  *dn;              /* [L][F] ffn_down's column norms */
    float  *w[2], *d;        /* head: [L][F][E] gate and up rows, [L][E][F] down columns */
    float  *pre, *t;         /* scratch: [2][F], [k] */
    double *norm;            /* [count] */
    hm_rank *rk;             /* [count] */
};

void hm_protect_free(hm_protect *p) {
    if (!p) return;
    for (int i = 0; i < 2; i++) free(p->q[i]), free(p->b[i]), free(p->w[i]);
    free(p->dn);
    free(p->d);
    free(p->pre);
    free(p->t);
    free(p->rk);
    free(p->norm);
    free(p);
}

int32_t hm_protect_count(const hm_protect *p) { return p->n_protect; }

uint64_t hm_protect_bytes(const hm_protect *p) {
    const uint64_t LF = (uint64_t)p->L * (uint64_t)p->F;
    return sizeof(float) * (2 * LF * (uint64_t)p->k + 2 * (uint64_t)p->L * p->k * p->E + LF +
                            (p->d ? 3 * LF * (uint64_t)p->E : 0) + 2 * (uint64_t)p->F + (uint64_t)p->k);
}

hm_protect *hm_protect_create(const hm_model *m, const hm_protect_params *pp, hr_err *err) {
    const int32_t E = m->hp.n_embd, L = m->hp.n_layer, F = pp->n_ff, k = pp->rank;
    const int32_t count = pp->group >= 1 && F >= 1 ? (F + pp->group - 1) / pp->group : 0;
    if (count < 1 || k < 1 || k > E || pp->n_protect < 1 || pp->n_protect > count) {
        hr_fail(err, HR_EINVAL, "protected groups: %d of %d groups (%d neurons, groups of %d), rank %d of n_embd %d",
                pp->n_protect, count, F, pp->group, k, E);
        return NULL;
    }
    hm_protect *p = calloc(1, sizeof *p);
    if (!p) return hr_fail(err, HR_ENOMEM, "out of memory"), NULL;
    *p = (hm_protect){.L = L, .E = E, .F = F, .group = pp->group, .count = count, .k = k, .n_protect = pp->n_protect};
    const size_t LF = (size_t)L * (size_t)F;
    bool ok = true;
    for (int i = 0; i < 2; i++) {
        ok = ok && (p->q[i] = malloc(sizeof(float) * LF * (size_t)k)) && (p->b[i] = malloc(sizeof(float) * (size_t)L * k * E));
        if (pp->head) ok = ok && (p->w[i] = malloc(sizeof(float) * LF * (size_t)E));
    }
    ok = ok && (p->dn = malloc(sizeof(float) * LF)) && (!pp->head || (p->d = malloc(sizeof(float) * LF * (size_t)E)));
    ok = ok && (p->pre = malloc(sizeof(float) * 2 * (size_t)F)) && (p->t = malloc(sizeof(float) * (size_t)k)) &&
         (p->rk = malloc(sizeof *p->rk * (size_t)count)) && (p->norm = malloc(sizeof *p->norm * (size_t)count));
    float *W = malloc(sizeof(float) * (size_t)F * E), *row = NULL;
    for (int il = 0; ok && W && il < L; il++) {
        const hm_layer *ly = &m->layers[il];
        const int32_t *nr = pp->neuron ? pp->neuron + (size_t)il * F : NULL;
        const int64_t cols = ly->w_down.ne0;
        for (int j = 0; ok && j < F; j++) ok = (nr ? nr[j] : j) >= 0 && (nr ? nr[j] : j) < cols;
        if (!ok) break;
        for (int i = 0; ok && i < 2; i++) {
            const hm_tensor *t = i == 0 ? &ly->w_gate : &ly->w_up;
            for (int32_t j = 0; j < F; j++) hm_tensor_row_f32(t, nr ? nr[j] : j, W + (size_t)j * E);
            if (p->w[i]) memcpy(p->w[i] + (size_t)il * F * E, W, sizeof(float) * (size_t)F * E);
            /* the seed depends on the layer and tensor only: the head and the worker draw the same */
            ok = hm_lowrank(W, F, E, k, 0x70726f74656374ull + 17 * (uint64_t)il + (uint64_t)i,
                            p->q[i] + (size_t)il * F * k, p->b[i] + (size_t)il * k * E);
        }
        if (!row && !(row = malloc(sizeof(float) * (size_t)cols))) ok = false;
        float *dn = p->dn + (size_t)il * F;
        for (int32_t j = 0; j < F; j++) dn[j] = 0;
        for (int32_t r = 0; ok && r < E; r++) {
            hm_tensor_row_f32(&ly->w_down, r, row);
            for (int32_t j = 0; j < F; j++) {
                const float v = row[nr ? nr[j] : j];
                dn[j] += v * v;
                if (p->d) p->d[((size_t)il * E + r) * F + j] = v;
            }
        }
        for (int32_t j = 0; j < F; j++) dn[j] = sqrtf(dn[j]);
    }
    if (!W) ok = false;
    free(W);
    free(row);
    if (!ok) {
        hm_protect_free(p);
        return hr_fail(err, HR_ENOMEM, "protected groups: out of memory, or a neuron outside the model"), NULL;
    }
    return p;
}

void hm_protect_select(hm_protect *p, int layer, const float *xn, int32_t *sel) {
    const int32_t F = p->F, k = p->k, E = p->E;
    const size_t qo = (size_t)layer * F * k, bo = (size_t)layer * k * E;
    const hm_lr_layer l = {{p->q[0] + qo, p->q[1] + qo}, {p->b[0] + bo, p->b[1] + bo}, p->dn + (size_t)layer * F,
                           F, k, E, p->group, p->count};
    hm_lr_norms(&l, xn, p->pre, p->t, p->norm);
    for (int32_t gi = 0; gi < p->count; gi++) p->rk[gi] = (hm_rank){p->norm[gi], gi};
    qsort(p->rk, (size_t)p->count, sizeof *p->rk, hm_rank_desc);
    for (int32_t i = 0; i < p->n_protect; i++) { /* ascending */
        int32_t j = i, v = p->rk[i].i;
        for (; j > 0 && sel[j - 1] > v; j--) sel[j] = sel[j - 1];
        sel[j] = v;
    }
}

void hm_protect_mask(const hm_protect *p, const int32_t *sel, float *act) {
    for (int32_t i = 0; i < p->n_protect; i++)
        for (int32_t j = sel[i] * p->group; j < HR_MIN(p->F, (sel[i] + 1) * p->group); j++) act[j] = 0;
}

void hm_protect_add(hm_protect *p, int layer, const float *xn, const int32_t *sel, float *o) {
    HR_ASSERT(p->d); /* made with head = true */
    const int32_t F = p->F, E = p->E;
    float *a = p->pre; /* the selected neurons' activations, at their positions */
    for (int32_t i = 0; i < p->n_protect; i++)
        for (int32_t j = sel[i] * p->group; j < HR_MIN(F, (sel[i] + 1) * p->group); j++) {
            const double g = hm_dot(p->w[0] + ((size_t)layer * F + j) * E, xn, E);
            const double u = hm_dot(p->w[1] + ((size_t)layer * F + j) * E, xn, E);
            a[j] = (float)(g / (1 + exp(-g)) * u);
        }
    for (int32_t r = 0; r < E; r++) {
        const float *D = p->d + ((size_t)layer * E + r) * F;
        double s = 0;
        for (int32_t i = 0; i < p->n_protect; i++)
            for (int32_t j = sel[i] * p->group; j < HR_MIN(F, (sel[i] + 1) * p->group); j++) s += (double)D[j] * a[j];
        o[r] += (float)s;
    }
}
