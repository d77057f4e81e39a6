/* plan/solve: TP shares by min-max (HALO), pipeline windows by an ILP per trip count (Halda, GLPK), and
   the choice among all candidates — see plan.h and docs/planner.md, "The solvers" */
#include "plan.h"

#include <glpk.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- tensor parallel: min-max shares ------------------------------------------------------------------- */

/* the largest share of device i whose time stays within T (the time grows with the share) */
static double hpl_tp_share_within(const hpl_cluster *c, const hpl_model *m, const hpl_plan *p, int i, double T) {
    if (hpl_tp_dev_time(c, m, p, i, 1.0) <= T) return 1;
    double lo = 0, hi = 1;
    for (int it = 0; it < 50; it++) {
        double mid = (lo + hi) / 2;
        if (hpl_tp_dev_time(c, m, p, i, mid) <= T) lo = mid;
        else hi = mid;
    }
    return lo;
}

int hpl_solve_tp(const hpl_cluster *c, const hpl_model *m, hpl_plan *p, hr_err *err) {
    if (p->n < 1) return hr_fail(err, HR_EINVAL, "tp: no devices");
    /* T: from 0 to the time of the slowest device doing everything (or more, when streaming) */
    double hi = 0;
    for (int i = 0; i < p->n; i++) {
        double t = hpl_tp_dev_time(c, m, p, i, 1.0);
        if (isfinite(t)) hi = HR_MAX(hi, t);
    }
    if (!(hi > 0)) return hr_fail(err, HR_ERANGE, "tp: no device can hold the whole model's KV cache; no share fits");
    double lo = 0, x[HPL_MAX_DEVICES];
    /* grow hi until the shares that fit within it cover the model */
    for (int grow = 0; grow < 60; grow++) {
        double sum = 0;
        for (int i = 0; i < p->n; i++) sum += hpl_tp_share_within(c, m, p, i, hi);
        if (sum >= 1) break;
        hi *= 2;
        if (grow == 59) return hr_fail(err, HR_ERANGE, "tp: the devices' memory cannot hold the model's KV cache");
    }
    for (int it = 0; it < 60; it++) {
        double mid = (lo + hi) / 2, sum = 0;
        for (int i = 0; i < p->n; i++) sum += hpl_tp_share_within(c, m, p, i, mid);
        if (sum >= 1) hi = mid;
        else lo = mid;
    }
    double sum = 0;
    for (int i = 0; i < p->n; i++) sum += x[i] = hpl_tp_share_within(c, m, p, i, hi);
    for (int i = 0; i < p->n; i++) p->share[i] = x[i] / sum; /* scaling down keeps every time within hi */
    return 0;
}

/* ---- pipeline: the ILP per trip count ------------------------------------------------------------------ */

/* the linear model's constants (docs/planner.md, "Pipeline ILP") */
typedef struct hpl_ilp {
    int    n, k, L;
    double c[HPL_MAX_DEVICES];     /* ms per layer */
    double D[HPL_MAX_DEVICES];     /* disk ms per byte */
    double F[HPL_MAX_DEVICES];     /* bytes that must stay: the scratch */
    double E[HPL_MAX_DEVICES];     /* weights beyond the windows' (the head's output head): may stream */
    double M[HPL_MAX_DEVICES];     /* budget */
    double wmax[HPL_MAX_DEVICES];  /* largest window the KV cache allows */
    double hide_cap[HPL_MAX_DEVICES];
    double Wl, Kl, comm, extra;
    int    Wmin, Wmax;
    int    lo[HPL_MAX_DEVICES];    /* the smallest window: 1, the head's 0 (it may only embed and sample) */
} hpl_ilp;

static void hpl_ilp_setup(const hpl_cluster *c, const hpl_model *m, const hpl_plan *p, int k, hpl_ilp *q) {
    memset(q, 0, sizeof *q);
    for (int i = 1; i < p->n; i++) q->lo[i] = 1;
    q->n = p->n;
    q->k = k;
    q->L = m->n_layer;
    q->Wl = m->layer_bytes;
    q->Kl = m->kv_bytes_per_layer;
    const double B = m->n_embd * 4.0 + 64;
    for (int i = 0; i < p->n; i++) {
        const hpl_device *d = &c->dev[p->dev[i]];
        q->c[i] = 0;
        for (int t = 0; t < m->n_types; t++) q->c[i] += m->layer_bytes_of[t] / (hpl_speed(d, m->type[t], false, false) * 1e6);
        q->D[i] = 1.0 / ((d->disk_gbps > 0 ? d->disk_gbps : 0.1) * 1e6);
        q->F[i] = m->scratch_bytes;
        q->E[i] = i == 0 ? m->out_bytes : 0;
        q->M[i] = (double)d->budget;
        double room = q->M[i] - q->F[i] - m->block_max_bytes;
        q->wmax[i] = room < 0 ? -1 : (q->Kl > 0 ? floor(room / (k * q->Kl)) : q->L);
        q->wmax[i] = HR_MIN(q->wmax[i], q->L);
        q->hide_cap[i] = k * 2 * m->block_max_bytes * q->D[i];
        /* every trip goes once round the ring */
        const hpl_link *l = &c->link[p->dev[i]][p->dev[(i + 1) % p->n]];
        q->comm += k * (l->rtt_ms / 2 + B / ((l->gbps > 0 ? l->gbps : 0.1) * 1e6));
    }
    q->extra = m->out_bytes / (hpl_speed(&c->dev[0], m->out_type, false, false) * 1e6);
    q->Wmin = (q->L + k - 1) / k;
    q->Wmax = k >= 2 ? (q->L - 1) / (k - 1) : q->L * 64;
}

static double hpl_ilp_eval(const hpl_ilp *q, const int *w) {
    int W = 0;
    for (int i = 0; i < q->n; i++) {
        if (w[i] < q->lo[i] || w[i] > q->wmax[i]) return -1;
        W += w[i];
    }
    if (W < q->Wmin || W > q->Wmax) return -1;
    double sum_c = 0;
    for (int i = 0; i < q->n; i++) sum_c += q->k * q->c[i] * w[i];
    double obj = sum_c + q->comm + q->extra;
    for (int i = 0; i < q->n; i++) {
        double o = HR_MAX(0, q->k * w[i] * (q->Wl + q->Kl) + q->E[i] + q->F[i] - q->M[i]);
        double idle = sum_c - q->k * q->c[i] * w[i] + q->comm + (i ? q->extra : 0);
        double h = HR_MIN(idle, q->hide_cap[i]);
        obj += HR_MAX(0, q->D[i] * o - q->k * q->c[i] * w[i] - h);
    }
    return obj;
}

double hpl_pp_objective(const hpl_cluster *c, const hpl_model *m, const hpl_plan *p, int trips) {
    hpl_ilp q;
    hpl_ilp_setup(c, m, p, trips, &q);
    return hpl_ilp_eval(&q, p->window);
}

static int hpl_glp_silent(void *info, const char *s) { (void)info; (void)s; return 1; }

/* hpl_solve_pp_trips, with the head's window at least lo0 (a hybrid's head group: 1, since a group must
   get layers) */
static int hpl_solve_ilp(const hpl_cluster *c, const hpl_model *m, hpl_plan *p, int k, int lo0, double *objective,
                         hr_err *err) {
    if (p->n < 2 || k < 1) return hr_fail(err, HR_EINVAL, "pp: two devices and one trip at least");
    hpl_ilp q;
    hpl_ilp_setup(c, m, p, k, &q);
    q.lo[0] = lo0;
    if (q.Wmin > q.Wmax) return hr_fail(err, HR_ERANGE, "pp: %d trips cannot place %d layers", k, q.L);
    for (int i = 0; i < p->n; i++)
        if (q.wmax[i] < q.lo[i])
            return hr_fail(err, HR_ERANGE, "pp: device %d cannot hold the KV cache of one layer per trip", p->dev[i]);
    const int n = p->n;
    /* columns: w_i (1..n), o_i (n+1..2n), h_i (2n+1..3n), b_i (3n+1..4n) */
    glp_term_hook(hpl_glp_silent, NULL);
    glp_prob *lp = glp_create_prob();
    glp_set_obj_dir(lp, GLP_MIN);
    glp_add_cols(lp, 4 * n);
    for (int i = 0; i < n; i++) {
        int w = 1 + i, o = 1 + n + i, h = 1 + 2 * n + i, b = 1 + 3 * n + i;
        glp_set_col_kind(lp, w, GLP_IV);
        glp_set_col_bnds(lp, w, GLP_DB, q.lo[i], HR_MAX(q.lo[i], q.wmax[i]));
        if (q.wmax[i] == q.lo[i]) glp_set_col_bnds(lp, w, GLP_FX, q.wmax[i], q.wmax[i]);
        glp_set_obj_coef(lp, w, k * q.c[i]);
        glp_set_col_bnds(lp, o, GLP_LO, 0, 0);
        glp_set_col_bnds(lp, h, q.hide_cap[i] > 0 ? GLP_DB : GLP_FX, 0, q.hide_cap[i]);
        glp_set_col_bnds(lp, b, GLP_LO, 0, 0);
        glp_set_obj_coef(lp, b, 1);
    }
    glp_set_obj_coef(lp, 0, q.comm + q.extra);
    int ind[2 * HPL_MAX_DEVICES + 4];
    double val[2 * HPL_MAX_DEVICES + 4];
    /* sum w in [Wmin, Wmax] */
    int r = glp_add_rows(lp, 1);
    for (int i = 0; i < n; i++) { ind[1 + i] = 1 + i; val[1 + i] = 1; }
    glp_set_mat_row(lp, r, n, ind, val);
    glp_set_row_bnds(lp, r, q.Wmin == q.Wmax ? GLP_FX : GLP_DB, q.Wmin, q.Wmax);
    for (int i = 0; i < n; i++) {
        int w = 1 + i, o = 1 + n + i, h = 1 + 2 * n + i, b = 1 + 3 * n + i;
        /* o_i - k (Wl + Kl) w_i >= E_i + F_i - M_i: the bytes beyond the budget stream */
        r = glp_add_rows(lp, 1);
        ind[1] = o; val[1] = 1; ind[2] = w; val[2] = -k * (q.Wl + q.Kl);
        glp_set_mat_row(lp, r, 2, ind, val);
        glp_set_row_bnds(lp, r, GLP_LO, q.E[i] + q.F[i] - q.M[i], 0);
        /* b_i - D_i o_i + k c_i w_i + h_i >= 0: what neither its compute nor the hidden load covers blocks */
        r = glp_add_rows(lp, 1);
        ind[1] = b; val[1] = 1; ind[2] = o; val[2] = -q.D[i]; ind[3] = w; val[3] = k * q.c[i]; ind[4] = h; val[4] = 1;
        glp_set_mat_row(lp, r, 4, ind, val);
        glp_set_row_bnds(lp, r, GLP_LO, 0, 0);
        /* h_i - sum_{j != i} k c_j w_j <= comm + (the head's extra, for a worker): loads hide only in idle time */
        r = glp_add_rows(lp, 1);
        int nz = 0;
        ind[++nz] = h; val[nz] = 1;
        for (int j = 0; j < n; j++)
            if (j != i) { ind[++nz] = 1 + j; val[nz] = -k * q.c[j]; }
        glp_set_mat_row(lp, r, nz, ind, val);
        glp_set_row_bnds(lp, r, GLP_UP, 0, q.comm + (i ? q.extra : 0));
    }
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.presolve = GLP_ON;
    parm.msg_lev = GLP_MSG_OFF;
    int rc = glp_intopt(lp, &parm), st = glp_mip_status(lp);
    if (rc || (st != GLP_OPT && st != GLP_FEAS)) {
        glp_delete_prob(lp);
        return hr_fail(err, HR_ERANGE, "pp: no window set with %d trips fits the budgets", k);
    }
    for (int i = 0; i < n; i++) p->window[i] = (int)lround(glp_mip_col_val(lp, 1 + i));
    if (objective) *objective = glp_mip_obj_val(lp);
    glp_delete_prob(lp);
    p->trips = k;
    return 0;
}

int hpl_solve_pp_trips(const hpl_cluster *c, const hpl_model *m, hpl_plan *p, int k, double *objective, hr_err *err) {
    return hpl_solve_ilp(c, m, p, k, 0, objective, err);
}

/* The ILP's streaming is prima.cpp's linear model (the bytes beyond a budget stream); the cost model
   knows what the residency manager pins (whole blocks, LIME's allocator) and how much of a load the
   ring's idle time hides. A local search on the cost model from the ILP's windows, one layer moved
   from one device to another while that helps (the trips stay), closes the gap: on pair2 the ILP's
   4-trip windows 1,3 cost 409 ms/token where 0,4 costs 287 (docs/planner.md). */
static int hpl_pp_refine(const hpl_cluster *c, const hpl_model *m, int n_prompt, hpl_plan *t, hr_err *err) {
    /* the stages: a hybrid's group is one; every stage keeps a layer but the head alone, which may pass
       the hidden state on (a group must have layers, the head's too) */
    const bool hy = t->kind == HPL_HYBRID;
    const int ns = hy ? t->n - t->group + 1 : t->n, lo0 = hy && t->gstage == 0 ? 1 : 0;
    for (int step = 0; step < 2 * m->n_layer; step++) {
        hpl_plan best = *t;
        for (int i = 0; i < ns; i++)
            for (int j = 0; j < ns; j++) {
                if (i == j || t->window[i] <= (i == 0 ? lo0 : 1)) continue;
                hpl_plan u = *t;
                u.window[i]--;
                u.window[j]++;
                if (hpl_cost(c, m, n_prompt, &u, err)) return err->code;
                if (u.feasible && u.trips == t->trips && u.ms_per_token < best.ms_per_token * (1 - 1e-9)) best = u;
            }
        if (best.ms_per_token >= t->ms_per_token) break;
        *t = best;
    }
    return 0;
}

int hpl_solve_pp(const hpl_cluster *c, const hpl_model *m, int n_prompt, hpl_plan *p, hr_err *err) {
    hpl_plan best = *p;
    best.feasible = false;
    char why[256] = "";
    int max_trips = HR_MIN(m->n_layer, HM_MAX_WINDOWS - 1);
    for (int k = 1; k <= max_trips; k++) {
        hpl_plan t = *p;
        hr_err e = {0};
        if (hpl_solve_pp_trips(c, m, &t, k, NULL, &e)) {
            if (!why[0]) snprintf(why, sizeof why, "%.250s", e.msg);
            continue;
        }
        if (hpl_cost(c, m, n_prompt, &t, err)) return err->code;
        /* every trip count refined, not only those whose ILP windows come near the best so far: on pair2
           the 8-trip ILP windows cost 1.4x the 1-trip plan and refined 0.98x (session 25); refining them
           all adds ~0.05 s to klonet8's plan */
        if (t.feasible && hpl_pp_refine(c, m, n_prompt, &t, err)) return err->code;
        if (!t.feasible && !why[0]) snprintf(why, sizeof why, "%s", t.why);
        if (t.feasible && (!best.feasible || t.ms_per_token < best.ms_per_token)) best = t;
    }
    *p = best;
    if (!best.feasible) {
        snprintf(p->why, sizeof p->why, "%s", why[0] ? why : "no window set fits");
        p->ms_per_token = p->prefill_ms = INFINITY;
    }
    return 0;
}

/* ---- hybrid: the pipeline ILP with the group as one virtual device ------------------------------------- */

/* The cluster the ILP of hybrid plan p sees (pv: its plan over it): device s is stage s. The group's
   stage gs is its members dev[gs..gs + g) as one device — per weight type the members' speeds summed
   (min-max shares make them finish together), slowed by the two all-reduces around its leader dev[gs]
   that every layer costs; their budgets and disks summed — with the leader's links; every other stage
   is its device, with its links (device 0 is the head, or the head's group). */
static void hpl_group_cluster(const hpl_cluster *c, const hpl_model *m, const hpl_plan *p, hpl_cluster *v, hpl_plan *pv) {
    const int g = p->group, ns = p->n - g + 1, gs = p->gstage, lead = p->dev[gs];
    int map[HPL_MAX_DEVICES];
    memset(v, 0, sizeof *v);
    memset(pv, 0, sizeof *pv);
    v->n = pv->n = ns;
    pv->kind = HPL_PP;
    for (int s = 0; s < ns; s++) {
        map[s] = p->dev[s <= gs ? s : g - 1 + s];
        pv->dev[s] = s;
        v->dev[s] = c->dev[map[s]];
    }
    for (int a = 0; a < ns; a++)
        for (int b = 0; b < ns; b++) v->link[a][b] = c->link[map[a]][map[b]];
    hpl_device *d = &v->dev[gs];
    const double B = m->n_embd * 4.0 + 64;
    double rtt = 0, up = 0, per_layer = 0;
    d->budget = 0;
    d->disk_gbps = 0;
    d->n_types = m->n_types;
    for (int t = 0; t < m->n_types; t++) d->ts[t] = (hpl_type_speed){.type = m->type[t]};
    for (int i = 0; i < g; i++) {
        const hpl_device *x = &c->dev[p->dev[gs + i]];
        for (int t = 0; t < m->n_types; t++) {
            d->ts[t].matvec_gbps += hpl_speed(x, m->type[t], false, false);
            d->ts[t].matmul_gbps += hpl_speed(x, m->type[t], true, false);
        }
        d->budget += x->budget;
        d->disk_gbps += x->disk_gbps > 0 ? x->disk_gbps : 0.1;
        if (i == 0) continue;
        const hpl_link *l = &c->link[lead][p->dev[gs + i]];
        rtt = HR_MAX(rtt, l->rtt_ms);
        up += B / ((l->gbps > 0 ? l->gbps : 0.1) * 1e6);
    }
    for (int t = 0; t < m->n_types; t++) per_layer += m->layer_bytes_of[t] / (d->ts[t].matvec_gbps * 1e6);
    const double f = per_layer > 0 ? per_layer / (per_layer + 2 * (rtt + 2 * up)) : 1;
    for (int t = 0; t < m->n_types; t++) d->ts[t].matvec_gbps *= f;
}

typedef struct { bool done; double x[HPL_MAX_DEVICES]; } hpl_share_memo;

/* hybrid plan h with its windows set: the group's shares, min-max over the layers of its stage
   (solved once per layer count: the min-max is most of a hybrid candidate's time), and its cost */
static int hpl_group_shares(const hpl_cluster *c, const hpl_model *m, int n_prompt, hpl_plan *h, hpl_share_memo *memo,
                            hr_err *err) {
    const int g = h->group, ns = h->n - g + 1, gs = h->gstage;
    hc_pp_plan pl;
    hr_err e = {0};
    if (hc_pp_plan_make(m->n_layer, h->window, ns, &pl, &e)) {
        h->feasible = false;
        snprintf(h->why, sizeof h->why, "windows: %.200s", e.msg);
        return 0;
    }
    hpl_model ms = *m;
    ms.n_layer = 0;
    for (int w = 0; w < pl.n_win[gs]; w++) ms.n_layer += pl.win[gs][w].end - pl.win[gs][w].begin;
    const int nl = HR_MAX(0, HR_MIN(ms.n_layer, m->n_layer));
    if (!memo[nl].done) {
        hpl_plan tg = *h;
        tg.kind = HPL_TP;
        tg.n = g;
        memcpy(tg.dev, h->dev + gs, sizeof tg.dev[0] * (size_t)g);
        if (ms.n_layer == 0 || hpl_solve_tp(c, &ms, &tg, &e))
            for (int i = 0; i < g; i++) tg.share[i] = 1.0 / g;
        memcpy(memo[nl].x, tg.share, sizeof tg.share[0] * (size_t)g);
        memo[nl].done = true;
    }
    memcpy(h->share, memo[nl].x, sizeof h->share[0] * (size_t)g);
    return hpl_cost(c, m, n_prompt, h, err);
}

int hpl_solve_hybrid(const hpl_cluster *c, const hpl_model *m, int n_prompt, hpl_plan *p, hr_err *err) {
    const int g = p->group, ns = p->n - g + 1, gs = p->gstage;
    if (p->kind != HPL_HYBRID || g < 2 || ns < 2 || gs < 0 || gs >= ns)
        return hr_fail(err, HR_EINVAL, "hybrid: a group at one of the stages, and another stage");
    hpl_cluster *v = malloc(sizeof *v);
    /* the group's shares depend only on how many layers it gets, which many trip counts share: solved
       once per count (the min-max is most of a hybrid candidate's time) */
    hpl_share_memo *memo = calloc((size_t)m->n_layer + 1, sizeof *memo);
    if (!v || !memo) {
        free(v);
        free(memo);
        return hr_fail(err, HR_ENOMEM, "out of memory");
    }
    hpl_plan pv, best = *p;
    best.feasible = false;
    char why[256] = "";
    hpl_group_cluster(c, m, p, v, &pv);
    int rc = 0, max_trips = HR_MIN(m->n_layer, HM_MAX_WINDOWS - 1);
    for (int k = 1; k <= max_trips && !rc; k++) {
        hpl_plan t = pv, h = *p;
        hc_pp_plan pl;
        hr_err e = {0};
        if (hpl_solve_ilp(v, m, &t, k, gs == 0, NULL, &e) || hc_pp_plan_make(m->n_layer, t.window, ns, &pl, &e)) {
            if (!why[0]) snprintf(why, sizeof why, "%.250s", e.msg);
            continue;
        }
        memcpy(h.window, t.window, sizeof h.window[0] * (size_t)ns);
        if ((rc = hpl_group_shares(c, m, n_prompt, &h, memo, err))) break;
        /* refined on the cost model as a pipeline's windows are, the shares then solved again for the
           layers the group ends with (kept only if that helps) */
        if (h.feasible) {
            if ((rc = hpl_pp_refine(c, m, n_prompt, &h, err))) break;
            hpl_plan h2 = h;
            if ((rc = hpl_group_shares(c, m, n_prompt, &h2, memo, err))) break;
            if (h2.feasible && h2.ms_per_token < h.ms_per_token) h = h2;
        }
        if (!h.feasible && !why[0]) snprintf(why, sizeof why, "%s", h.why);
        if (h.feasible && (!best.feasible || h.ms_per_token < best.ms_per_token)) best = h;
    }
    free(v);
    free(memo);
    if (rc) return rc;
    *p = best;
    if (!best.feasible) {
        snprintf(p->why, sizeof p->why, "%s", why[0] ? why : "no window set fits");
        p->ms_per_token = p->prefill_ms = INFINITY;
    }
    return 0;
}

/* ---- all candidates --------------------------------------------------------------------------------------- */

#define HPL_MAX_GROUP 4   /* devices in the head's group of a hybrid candidate */

/* what a star all-reduce of one hidden state costs on the link a -> b, for ranking links: an RTT and
   the bytes both ways */
static double hpl_ar_rank(const hpl_cluster *c, const hpl_model *m, int a, int b) {
    const hpl_link *l = &c->link[a][b];
    return l->rtt_ms + 2 * m->n_embd * 4.0 / (HR_MAX(l->gbps, 0.1) * 1e6);
}

/* the lossy twin of the TP candidate just added (the same shares; loss.c costs what it waits for and
   what it loses): a candidate beside it whatever the links' loss, so that `hearth plan` shows both */
static int hpl_add_lossy(const hpl_cluster *c, const hpl_model *m, int n_prompt, hpl_choice *out, hr_err *err) {
    if (out->n >= HPL_MAX_CANDIDATES) return 0;
    hpl_plan *p = &out->cand[out->n];
    *p = out->cand[out->n - 1];
    p->lossy = true;
    p->deadline_ms = HPL_LOSSY_DEADLINE_MS;
    if (p->feasible && hpl_cost(c, m, n_prompt, p, err)) return err->code;
    out->n++;
    return 0;
}

static int hpl_add_candidates(const hpl_cluster *c, const hpl_model *m, int n_prompt, const int *sub, int ns,
                              hpl_choice *out, hr_err *err) {
    for (int kind = HPL_TP; kind <= HPL_PP; kind++) {
        if (out->n >= HPL_MAX_CANDIDATES) return 0;
        hpl_plan *p = &out->cand[out->n];
        memset(p, 0, sizeof *p);
        p->kind = kind;
        p->n = ns + 1;
        p->dev[0] = 0;
        for (int i = 0; i < ns; i++) p->dev[1 + i] = sub[i];
        hr_err e = {0};
        if (kind == HPL_TP) {
            if (hpl_solve_tp(c, m, p, &e)) {
                for (int i = 0; i < p->n; i++) p->share[i] = 1.0 / p->n;
                hpl_cost(c, m, n_prompt, p, err);
                p->feasible = false;
                p->ms_per_token = p->prefill_ms = INFINITY;
                snprintf(p->why, sizeof p->why, "%.250s", e.msg);
            } else if (hpl_cost(c, m, n_prompt, p, err)) return err->code;
        } else if (hpl_solve_pp(c, m, n_prompt, p, err)) return err->code;
        out->n++;
        if (kind == HPL_TP && hpl_add_lossy(c, m, n_prompt, out, err)) return err->code;
    }
    /* hybrid: the head's group is the head and the g-1 workers with the fastest links to it (an
       all-reduce's cost), at most HPL_MAX_GROUP devices; the others, in their order, a stage each */
    int order[HPL_MAX_DEVICES];
    for (int i = 0; i < ns; i++) order[i] = sub[i];
    for (int i = 0; i < ns; i++)
        for (int j = i + 1; j < ns; j++)
            if (hpl_ar_rank(c, m, 0, order[j]) < hpl_ar_rank(c, m, 0, order[i])) {
                int t = order[i]; order[i] = order[j]; order[j] = t;
            }
    for (int g = 2; g <= ns && g <= HPL_MAX_GROUP && out->n < HPL_MAX_CANDIDATES; g++) {
        hpl_plan *p = &out->cand[out->n];
        memset(p, 0, sizeof *p);
        p->kind = HPL_HYBRID;
        p->n = ns + 1;
        p->group = g;
        bool in[HPL_MAX_DEVICES] = {0};
        for (int i = 0; i < g - 1; i++) in[p->dev[1 + i] = order[i]] = true;
        for (int i = 0, k = g; i < ns; i++)
            if (!in[sub[i]]) p->dev[k++] = sub[i];
        if (hpl_solve_hybrid(c, m, n_prompt, p, err)) return err->code;
        out->n++;
    }
    /* a worker-led group: the pair of the subset's workers with the fastest link between them (its
       all-reduces run over that link), a stage at the place of the first of them; the head and the
       others a stage each, in their order. One candidate per subset keeps the count bounded. */
    if (ns >= 2 && out->n < HPL_MAX_CANDIDATES) {
        int a = 0, b = 1;
        for (int i = 0; i < ns; i++)
            for (int j = i + 1; j < ns; j++)
                if (hpl_ar_rank(c, m, sub[i], sub[j]) < hpl_ar_rank(c, m, sub[a], sub[b])) a = i, b = j;
        hpl_plan *p = &out->cand[out->n];
        memset(p, 0, sizeof *p);
        p->kind = HPL_HYBRID;
        p->n = ns + 1;
        p->group = 2;
        for (int i = 0, k = 1; i < ns; i++) {
            if (i == b) continue;
            if (i == a) {
                p->gstage = k;
                p->dev[k++] = sub[a];
                p->dev[k++] = sub[b];
            } else p->dev[k++] = sub[i];
        }
        if (hpl_solve_hybrid(c, m, n_prompt, p, err)) return err->code;
        out->n++;
    }
    return 0;
}

int hpl_best_of_kind(const hpl_choice *ch, int kind) {
    int best = -1;
    for (int i = 0; i < ch->n; i++) {
        const hpl_plan *p = &ch->cand[i];
        if (p->kind == kind && !p->lossy && p->feasible && (best < 0 || p->ms_per_token < ch->cand[best].ms_per_token))
            best = i;
    }
    return best;
}

/* the fastest feasible candidate and the next; a lossy one (it loses elements) only when it is
   HPL_LOSSY_MARGIN faster than the fastest exact one */
static void hpl_rank(const hpl_choice *out, int *best, int *second) {
    int exact = -1, lossy = -1;
    for (int i = 0; i < out->n; i++) {
        const hpl_plan *p = &out->cand[i];
        int *slot = p->lossy ? &lossy : &exact;
        if (p->feasible && (*slot < 0 || p->ms_per_token < out->cand[*slot].ms_per_token)) *slot = i;
    }
    bool take_lossy = lossy >= 0 && (exact < 0 || out->cand[lossy].ms_per_token < (1 - HPL_LOSSY_MARGIN) *
                                                                                 out->cand[exact].ms_per_token);
    *best = take_lossy ? lossy : exact;
    *second = -1;
    for (int i = 0; i < out->n; i++)
        if (i != *best && out->cand[i].feasible &&
            (*second < 0 || out->cand[i].ms_per_token < out->cand[*second].ms_per_token))
            *second = i;
}

/* the loss part of a plan's "why" (closes the parenthesis): what loss costs it, and what it loses */
static int hpl_why_loss(const hpl_plan *p, const hpl_model *m, char *buf, size_t cap) {
    int n = 0;
    if (p->lossy)
        n = snprintf(buf, cap, ", of which loss %.2f; loses %.1f of %d elements per all-reduce, %.2f%%", p->loss_ms,
                     p->elements_lost, (p->n - 1) * m->n_embd, 100 * p->lost_fraction);
    else if (p->loss_ms > 0)
        n = snprintf(buf, cap, ", of which TCP's recoveries of lost segments %.2f", p->loss_ms);
    if (n >= 0 && (size_t)n < cap && p->kind == HPL_TP && !p->lossy && p->p_hit > 0)
        n += snprintf(buf + n, cap - (size_t)n, "; %.0f%% of its all-reduces meet a loss", 100 * p->p_hit);
    if (n >= 0 && (size_t)n < cap) n += snprintf(buf + n, cap - (size_t)n, ")");
    return n < 0 ? 0 : (int)HR_MIN((size_t)n, cap - 1);
}

static double hpl_dev_speed(const hpl_device *d) { return hpl_speed(d, 8 /* Q8_0 */, false, false); }

int hpl_choose(const hpl_cluster *c, const hpl_model *m, int n_prompt, hpl_choice *out, hr_err *err) {
    memset(out, 0, sizeof *out);
    out->chosen = -1;
    if (c->n < 1) return hr_fail(err, HR_EINVAL, "no devices");
    hpl_plan *s = &out->cand[out->n++];
    s->kind = HPL_SINGLE;
    s->n = 1;
    s->share[0] = 1;
    if (hpl_cost(c, m, n_prompt, s, err)) return err->code;
    const int nw = c->n - 1;
    int sub[HPL_MAX_DEVICES];
    if (nw <= 5) { /* every subset of the workers, in their order */
        for (int mask = 1; mask < (1 << nw); mask++) {
            int ns = 0;
            for (int i = 0; i < nw; i++)
                if (mask & (1 << i)) sub[ns++] = 1 + i;
            if (hpl_add_candidates(c, m, n_prompt, sub, ns, out, err)) return err->code;
        }
    } else { /* prefixes of the workers by speed, each kept in the given order */
        int order[HPL_MAX_DEVICES];
        for (int i = 0; i < nw; i++) order[i] = 1 + i;
        for (int i = 0; i < nw; i++)
            for (int j = i + 1; j < nw; j++)
                if (hpl_dev_speed(&c->dev[order[j]]) > hpl_dev_speed(&c->dev[order[i]])) {
                    int t = order[i]; order[i] = order[j]; order[j] = t;
                }
        for (int len = 1; len <= nw; len++) {
            bool in[HPL_MAX_DEVICES] = {0};
            for (int i = 0; i < len; i++) in[order[i]] = true;
            int ns = 0;
            for (int d = 1; d <= nw; d++)
                if (in[d]) sub[ns++] = d;
            if (hpl_add_candidates(c, m, n_prompt, sub, ns, out, err)) return err->code;
        }
    }
    int best = -1, second = -1;
    hpl_rank(out, &best, &second);
    out->chosen = best;
    if (best < 0) {
        double need = m->kv_bytes_per_layer * m->n_layer, have = 0;
        for (int d = 0; d < c->n; d++) have += HR_MAX(0, (double)c->dev[d].budget - m->scratch_bytes -
                                    m->block_max_bytes);
        snprintf(out->why, sizeof out->why,
                 "no plan fits: the KV cache at %d tokens needs %.0f MiB and each device also needs %.0f MiB of scratch "
                 "and room for one %.0f MiB block of weights; the devices' budgets leave %.0f MiB for the KV cache "
                 "(%s). Use a shorter context (-c), or add memory or devices",
                 m->n_ctx, need / 1048576, m->scratch_bytes / 1048576, m->block_max_bytes / 1048576, have / 1048576,
                 out->cand[0].why);
        return 0;
    }
    char a[160], b[160];
    const hpl_plan *B = &out->cand[best];
    hpl_plan_describe(B, a, sizeof a);
    int n = snprintf(out->why, sizeof out->why, "%s: %.2f ms/token (compute %.2f, network %.2f, blocked on disk %.2f",
                     a, B->ms_per_token, B->compute_ms, B->comm_ms, B->blocked_ms);
    n += hpl_why_loss(B, m, out->why + n, sizeof out->why - (size_t)n);
    if (second >= 0 && n > 0 && (size_t)n < sizeof out->why) {
        const hpl_plan *S = &out->cand[second];
        hpl_plan_describe(S, b, sizeof b);
        n += snprintf(out->why + n, sizeof out->why - (size_t)n, "; next best %s: %.2f ms/token (%+.0f%%", b,
                      S->ms_per_token, 100.0 * (S->ms_per_token / B->ms_per_token - 1));
        if (n > 0 && (size_t)n < sizeof out->why) n += hpl_why_loss(S, m, out->why + n, sizeof out->why - (size_t)n);
        if (S->lossy && !B->lossy && S->ms_per_token < B->ms_per_token && (size_t)n < sizeof out->why)
            n += snprintf(out->why + n, sizeof out->why - (size_t)n, "; lossy TP is taken only when %.0f%% faster than "
                          "the best exact plan", 100 * HPL_LOSSY_MARGIN);
    }
    double worst = 0;
    for (int a = 0; a < c->n; a++)
        for (int b = 0; b < c->n; b++) worst = HR_MAX(worst, c->link[a][b].loss);
    if (worst > 0 && n > 0 && (size_t)n < sizeof out->why)
        snprintf(out->why + n, sizeof out->why - (size_t)n, "; links lose up to %.1f%% of datagrams", 100 * worst);
    return 0;
}

/* ---- the neighbours of a plan (`--plan-trial`) ------------------------------------------------------------- */

/* a TP plan's neighbours: the head's share moved by each of HPL_TP_STEPS (the workers' scaled in
   proportion, so that they keep their min-max ratios). The head is the member the min-max gets most
   wrong where it streams (home4-8b-tiny, sessions 29-41: the head at 0.25 measured 1039-1164 ms/token,
   min-max's 0.05 1203-1455; the cost model priced them within 1-3%). */
static const double HPL_TP_STEPS[] = {0.1, 0.2, -0.1};

static int hpl_tp_neighbours(const hpl_cluster *c, const hpl_model *m, int n_prompt, const hpl_plan *p, hpl_plan *out,
                             int cap) {
    const double least = 1.0 / 64;   /* every member keeps some of every layer */
    int n = 0;
    for (size_t v = 0; v < sizeof HPL_TP_STEPS / sizeof HPL_TP_STEPS[0] && n < cap; v++) {
        hpl_plan q = *p;
        const double h = p->share[0] + HPL_TP_STEPS[v], rest = 1 - p->share[0];
        bool ok = h >= least && rest > 0;
        q.share[0] = h;
        for (int i = 1; i < p->n; i++) ok = ok && (q.share[i] = p->share[i] * (1 - h) / rest) >= least;
        hr_err e = {0};
        if (!ok || hpl_cost(c, m, n_prompt, &q, &e) || !q.feasible) continue;
        out[n++] = q;
    }
    return n;
}

int hpl_neighbours(const hpl_cluster *c, const hpl_model *m, int n_prompt, const hpl_plan *p, hpl_plan *out, int cap) {
    if (p->kind == HPL_TP) return hpl_tp_neighbours(c, m, n_prompt, p, out, cap);
    if (p->kind != HPL_PP && p->kind != HPL_HYBRID) return 0;
    const int ns = p->kind == HPL_PP ? p->n : p->n - p->group + 1;   /* stages */
    int n = 0;
    for (int v = 0; v < ns * ns + 2 && n < cap; v++) {
        hpl_plan q = *p;
        if (v < ns * ns) {          /* a layer from stage a to stage b */
            const int a = v / ns, b = v % ns;
            if (a == b || q.window[a] < (a ? 2 : 1)) continue;
            q.window[a]--;
            q.window[b]++;
        } else if (v == ns * ns) {  /* twice the trips */
            bool even = q.window[1] >= 2;
            for (int s = 0; s < ns; s++) even = even && q.window[s] % 2 == 0;
            if (!even) continue;
            for (int s = 0; s < ns; s++) q.window[s] /= 2;
        } else {                    /* half the trips */
            if (q.trips < 2) continue;
            for (int s = 0; s < ns; s++) q.window[s] *= 2;
        }
        hr_err e = {0};
        if (hpl_cost(c, m, n_prompt, &q, &e) || !q.feasible) continue;
        out[n++] = q;
    }
    return n;
}

/* ---- a plan the user gave ----------------------------------------------------------------------------- */

/* a device's decode speed over the model's layers (bytes per ms): its matvec speed per weight type,
   weighted by the layers' bytes of each type — what `--tp-shares auto` weighs the devices by */
static double hpl_layers_speed(const hpl_device *d, const hpl_model *m) {
    double ms = 0;
    for (int t = 0; t < m->n_types; t++) ms += m->layer_bytes_of[t] / (hpl_speed(d, m->type[t], false, false) * 1e6);
    return ms > 0 ? m->layer_bytes / ms : 0;
}

int hpl_plan_given(const hpl_cluster *c, const hpl_model *pm, const hm_model *m, const hc_head_params *hp,
                   int n_prompt, hpl_plan *out, hr_err *err) {
    memset(out, 0, sizeof *out);
    const int k = c->n;
    if (k < 2) return hr_fail(err, HR_EINVAL, "a given plan needs --workers");
    double speed[HPL_MAX_DEVICES];
    for (int d = 0; d < k; d++) speed[d] = hpl_layers_speed(&c->dev[d], pm);
    hc_layout *l = malloc(sizeof *l);
    if (!l) return hr_fail(err, HR_ENOMEM, "out of memory");
    int rc = hc_layout_make(m, hp, k, speed, l, err);
    int gs = -1, gn = 1;   /* a hybrid plan's group: its stage and size */
    if (!rc && hp->pp && hp->n_stages) {
        for (int s = 0; s < l->n_stages && !rc; s++) {
            if (hc_layout_stage_size(l, s) == 1) continue;
            if (gs >= 0)
                rc = hr_fail(err, HR_EUNSUPPORTED, "the cost model prices hybrid plans with one group (0+1,2 or 0,1+2,3); "
                             "stages %d and %d are groups", gs, s);
            gs = s;
            gn = hc_layout_stage_size(l, s);
        }
    }
    if (!rc) {
        out->n = k;
        for (int d = 0; d < k; d++) out->dev[d] = d;
        if (!hp->pp) {
            out->kind = HPL_TP;
            for (int d = 0; d < k; d++) out->share[d] = l->plan.weight[d];
            out->lossy = hp->lossy;
            if (hp->lossy) out->deadline_ms = hp->lossy_deadline_ms > 0 ? hp->lossy_deadline_ms : HPL_LOSSY_DEADLINE_MS;
        } else {
            out->kind = gn > 1 ? HPL_HYBRID : HPL_PP;
            out->group = gn > 1 ? gn : 0;
            out->gstage = gn > 1 ? gs : 0;
            for (int i = 0; i < gn; i++) out->share[i] = gn > 1 ? l->plan.weight[l->first[gs] + i] : 1;
            for (int s = 0; s < l->n_stages; s++) {
                /* given, else hc_pp_plan_make's default: one round, each stage's layers one window */
                if (hp->n_windows) out->window[s] = hp->layer_windows[s];
                else
                    for (int w = 0; w < l->pp.n_win[s]; w++)
                        out->window[s] += l->pp.win[s][w].end - l->pp.win[s][w].begin;
            }
        }
        rc = hpl_cost(c, pm, n_prompt, out, err);
    }
    free(l);
    return rc;
}
