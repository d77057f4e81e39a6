/* cli/trial: the planner's best-predicted candidates run for a few tokens each, and the one measured
   fastest chosen (`--plan-trial N`; docs/planner.md, "Trial").

   Why: where several candidates are predicted within a few percent of each other, which one the cost
   model names is decided by its error, not by the plans (the sweeps of docs/planner.md: home4-8b-tiny's
   six best-predicted candidates lay within 5% and measured 984-1487 ms/token). A few tokens of each,
   measured side by side at the same minute, separate them where a profile taken minutes earlier cannot.
   A trial runs each candidate exactly as `hearth run` would (the same engine set-up, its weights sent
   once and cached by the workers), in rounds — every candidate once a round, every other round in
   reverse order, so that a change of the machines' load touches each alike — and takes the median of
   its rounds. The result is kept in the profile cache's folder (trial.json), keyed by the model file,
   the devices, the threads, the context and the candidates measured: a later run that plans the same
   candidates takes the trial's choice without measuring again. This is app-layer code: it runs the
   cluster (src/cluster) for the planner (src/plan), which knows nothing of either. */
#include "engine.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define CLI_TRIAL_ROUNDS 2      /* every candidate measured this many times, the median taken */
#define CLI_TRIAL_WARM   2      /* decode passes before the timed ones (the residency manager's first
                                   reads, the workers' first FORWARD) */
#define CLI_TRIAL_WITHIN 1.5    /* only candidates predicted within this factor of the best: the sweeps'
                                   largest prediction errors were -47% / +58% */
#define CLI_TRIAL_CACHED 32     /* results trial.json keeps (the newest) */
#define CLI_TRIAL_AUTO   4      /* the default trial (no --plan-trial): its best-predicted candidates */
#define CLI_TRIAL_START_S 1.0   /* a run's start beyond loading weights, for the estimate: connections, the
                                   workers' sessions (home4: 1.2-2.8 s a run in all, with its weights cached) */

/* the candidates worth measuring: feasible, one of each
   description (a TP plan's lossy twin only where its exact twin can meet loss: on links that lose
   nothing it is the same plan with more datagrams), within `within` times the best, fastest predicted first;
   n at most max */
static int trial_pick(const hpl_choice *ch, int max, double within, int *idx) {
    if (ch->chosen < 0) return 0;
    const double best = ch->cand[ch->chosen].ms_per_token;
    bool used[HPL_MAX_CANDIDATES] = {0};
    int n = 0;
    while (n < max) {
        int b = -1;
        for (int i = 0; i < ch->n; i++)
            if (!used[i] && ch->cand[i].feasible && ch->cand[i].ms_per_token <= best * within &&
                (b < 0 || ch->cand[i].ms_per_token < ch->cand[b].ms_per_token))
                b = i;
        if (b < 0) break;
        used[b] = true;
        char d[256], e[256];
        hpl_plan x = ch->cand[b];
        x.lossy = false;              /* the lossy twin's description says "(lossy)" */
        hpl_plan_describe(&x, d, sizeof d);
        bool dup = false;
        for (int k = 0; k < n && !dup; k++) {
            hpl_plan q = ch->cand[idx[k]];
            const bool lossy = q.lossy;
            q.lossy = false;
            hpl_plan_describe(&q, e, sizeof e);
            dup = !strcmp(d, e) && (ch->cand[b].lossy == lossy || q.p_hit == 0);
        }
        if (!dup) idx[n++] = b;
    }
    return n;
}

/* is a plan of this description already among ch's candidates? */
static bool trial_listed(const hpl_choice *ch, const hpl_plan *q) {
    char d[256], e[256];
    hpl_plan_describe(q, d, sizeof d);
    for (int i = 0; i < ch->n; i++) {
        hpl_plan_describe(&ch->cand[i], e, sizeof e);
        if (!strcmp(d, e) && ch->cand[i].lossy == q->lossy) return true;
    }
    return false;
}

/* The neighbours of candidate b of ch (hpl_neighbours), the `max` predicted fastest that are not candidates
   already (feasible, within `within` times the best), appended to ch (its n grows) and to idx[n..]. The
   new n. */
static int trial_add_neighbours_of(const hpl_cluster *cl, const hpl_model *pm, int n_prompt, hpl_choice *ch, int b,
                                   int max, double within, int *idx, int n) {
    hpl_plan *nb = b < 0 || max < 1 ? NULL : malloc(sizeof *nb * HPL_MAX_NEIGHBOURS);
    if (!nb) return n;   /* none (out of memory: the trial goes on without them) */
    const int k = hpl_neighbours(cl, pm, n_prompt, &ch->cand[b], nb, HPL_MAX_NEIGHBOURS);
    const double best = ch->cand[ch->chosen].ms_per_token;
    bool used[HPL_MAX_NEIGHBOURS] = {0};
    for (int added = 0; added < max && n < CLI_TRIAL_MAX && ch->n < HPL_MAX_CANDIDATES;) {
        int j = -1;
        for (int i = 0; i < k; i++)
            if (!used[i] && nb[i].ms_per_token <= best * within && (j < 0 || nb[i].ms_per_token < nb[j].ms_per_token))
                j = i;
        if (j < 0) break;
        used[j] = true;
        if (trial_listed(ch, &nb[j])) continue;
        ch->cand[ch->n] = nb[j];
        idx[n++] = ch->n++;
        added++;
    }
    free(nb);
    return n;
}

/* The neighbours of the best-predicted pipeline among ch's candidates (or its hybrid) and of its best TP
   plan, `max` in all (trial_add_neighbours_of): the pipeline's the larger half, so that a trial takes no
   longer for them (home4-8b-tiny's 8B: 6 candidates estimated at 571 s, 8 at 742, over `hearth plan`'s 600-s
   budget). The new n. */
static int trial_add_neighbours(const hpl_cluster *cl, const hpl_model *pm, int n_prompt, hpl_choice *ch, int max,
                                double within, int *idx, int n) {
    int b = -1;
    for (int i = 0; i < ch->n; i++)
        if (ch->cand[i].feasible && (ch->cand[i].kind == HPL_PP || ch->cand[i].kind == HPL_HYBRID) &&
            (b < 0 || ch->cand[i].ms_per_token < ch->cand[b].ms_per_token))
            b = i;
    const int tp = hpl_best_of_kind(ch, HPL_TP);   /* before the pipeline's neighbours join ch */
    const int n0 = n;
    n = trial_add_neighbours_of(cl, pm, n_prompt, ch, b, max - max / 2, within, idx, n);
    return trial_add_neighbours_of(cl, pm, n_prompt, ch, tp, max - (n - n0), within, idx, n);
}

/* A trial's time in seconds, roughly (what the default trial is held to, --plan-trial-budget): each run's
   decode passes at the candidate's predicted speed, its start (every device loading its weights at its
   disk's speed, and CLI_TRIAL_START_S), and each candidate's worker weights sent once over the links, one
   worker after another (its second round finds them in the workers' slice caches: cli_trial_run measures a
   candidate's rounds back to back). At most: an earlier candidate's slices, or an earlier trial's, may be
   cached too (home4-8b-tiny's 8B, session 41: a hybrid's group slices of the same shares were). */
static double trial_estimate_s(const hpl_cluster *cl, const hpl_choice *ch, const int *pick, int n, int tokens) {
    double s = 0;
    for (int k = 0; k < n; k++) {
        const hpl_plan *p = &ch->cand[pick[k]];
        double load = 0, send = 0;
        for (int i = 0; i < p->n; i++) {
            const hpl_dev_cost *dc = &p->dc[i];
            const int d = dc->dev;
            if (d < 0 || d >= cl->n) continue;
            const double disk = cl->dev[d].disk_gbps > 0 ? cl->dev[d].disk_gbps : 1;
            load = HR_MAX(load, dc->resident_bytes / (disk * 1e9));
            if (d > 0) send += (dc->resident_bytes + dc->stream_bytes) / (HR_MAX(cl->link[0][d].gbps, 1e-3) * 1e9);
        }
        s += send + CLI_TRIAL_ROUNDS * ((1 + CLI_TRIAL_WARM + tokens) * p->ms_per_token / 1e3 + load + CLI_TRIAL_START_S);
    }
    return s;
}

/* the candidates a trial of `want` measures: the want best-predicted, and want/2 (at least one) neighbours
   of the best pipeline and the best TP plan, appended to ch; their count, their indices in pick */
static int trial_select(const hpl_cluster *cl, const hpl_model *pm, int n_prompt, hpl_choice *ch, int want,
                        double within, int *pick) {
    const int n = trial_pick(ch, want, within, pick);
    return trial_add_neighbours(cl, pm, n_prompt, ch, HR_MAX(1, want / 2), within, pick, n);
}

/* what a trial's figures depend on besides the plans: the model file, the devices, threads, context */
static uint64_t trial_key(const cli_opts *o, const hpl_cluster *cl, const hm_ctx_params *cp) {
    hr_hasher h;
    hr_hasher_init(&h, 0x747269616cull);
    struct stat st;
    char real[4096];
    const char *path = realpath(o->model, real) ? real : o->model;
    hr_hasher_update(&h, path, strlen(path) + 1);
    if (!stat(o->model, &st)) {
        int64_t v[2] = {(int64_t)st.st_size, (int64_t)st.st_mtime};
        hr_hasher_update(&h, v, sizeof v);
    }
    for (int i = 0; i < cl->n; i++) hr_hasher_update(&h, cl->addr[i], strlen(cl->addr[i]) + 1);
    int32_t v[3] = {cp->n_threads, cp->n_ctx, o->head.lossy_deadline_ms};
    hr_hasher_update(&h, v, sizeof v);
    return hr_hasher_final(&h);
}

/* a plan's name in trial.json: its description (which says "(lossy)" of a TP plan's lossy twin) */
static void trial_name(const hpl_plan *p, char *buf, size_t cap) { hpl_plan_describe(p, buf, cap); }

static int trial_file(char *buf, size_t cap, hr_err *err) {
    hpl_profile_params pp = hpl_cluster_default_params().self;
    return hpl_cache_file(&pp, "trial.json", buf, cap, err);
}

/* The earlier trial of this key (trial.json), as figures for ch's candidates: found[i] true and ms[i] its
   figure (NAN: it did not run) for each candidate the trial measured. The number of them, 0 when none. */
static int trial_load(uint64_t key, const hpl_choice *ch, bool *found, double *ms, int *tokens) {
    char file[2200];
    hr_err err = {0};
    memset(found, 0, sizeof *found * (size_t)ch->n);
    if (trial_file(file, sizeof file, &err)) return 0;
    json_t *root = json_load_file(file, 0, NULL);
    char k[32];
    snprintf(k, sizeof k, "%016llx", (unsigned long long)key);
    json_t *e = json_object_get(json_object_get(root, "trials"), k);
    json_t *plans = json_object_get(e, "plans"), *fig = json_object_get(e, "ms_per_token");
    int n = 0;
    *tokens = (int)HR_MIN(HR_MAX(json_integer_value(json_object_get(e, "tokens")), 0), 4096);
    if (json_is_array(plans) && json_is_array(fig) && json_array_size(plans) == json_array_size(fig))
        for (size_t j = 0; j < json_array_size(plans); j++) {
            const char *name = json_string_value(json_array_get(plans, j));
            json_t *v = json_array_get(fig, j);
            double x = json_is_number(v) ? json_number_value(v) : NAN;
            if (!name || !(json_is_null(v) || (x > 0 && x < 1e7))) continue;   /* not ours: ignored */
            for (int i = 0; i < ch->n; i++) {
                char c[300];
                trial_name(&ch->cand[i], c, sizeof c);
                if (ch->cand[i].feasible && !found[i] && !strcmp(c, name)) {
                    found[i] = true;
                    ms[i] = x;
                    n++;
                    break;
                }
            }
        }
    json_decref(root);
    return n;
}

/* the trial kept for later runs (a cache: a failure to write it is not an error), the oldest dropped */
static void trial_save(uint64_t key, const hpl_choice *ch, const cli_trial *t) {
    char file[2200];
    hr_err err = {0};
    if (trial_file(file, sizeof file, &err)) return;
    json_t *root = json_load_file(file, 0, NULL);
    if (!json_is_object(root)) {
        json_decref(root);
        root = json_object();
    }
    json_t *all = json_object_get(root, "trials");
    if (!json_is_object(all)) json_object_set_new(root, "trials", all = json_object());
    char k[32];
    snprintf(k, sizeof k, "%016llx", (unsigned long long)key);
    json_object_del(all, k);
    while (json_object_size(all) >= CLI_TRIAL_CACHED) { /* the oldest goes */
        const char *old = NULL, *kk;
        json_int_t when = 0;
        json_t *v;
        json_object_foreach(all, kk, v) {
            json_int_t w = json_integer_value(json_object_get(v, "time"));
            if (!old || w < when) old = kk, when = w;
        }
        json_object_del(all, old);
    }
    json_t *e = json_object(), *plans = json_array(), *ms = json_array();
    for (int i = 0; i < t->n; i++) {
        char name[300];
        trial_name(&ch->cand[t->idx[i]], name, sizeof name);
        json_array_append_new(plans, json_string(name));
        json_array_append_new(ms, isnan(t->ms[i]) ? json_null() : json_real(t->ms[i]));
    }
    json_object_set_new(e, "plans", plans);
    json_object_set_new(e, "ms_per_token", ms);
    json_object_set_new(e, "tokens", json_integer(t->tokens));
    json_object_set_new(e, "time", json_integer((json_int_t)time(NULL)));
    json_object_set_new(all, k, e);
    hpl_json_save(file, root);
    json_decref(root);
}

/* one run of candidate p: the engine set up as `hearth run` sets it up for that plan, WARM decode passes,
   then `tokens` timed ones; their mean ms, or NAN (err says why) */
static double trial_once(const cli_opts *o, const hm_model *m, const hm_ctx_params *cp, bool managed,
                         const hpl_cluster *cl, const hpl_plan *p, int tokens, hr_err *err) {
    cli_opts *oo = malloc(sizeof *oo);
    float *logits = malloc(sizeof *logits * (size_t)m->hp.n_vocab);
    double ms = NAN;
    cli_engine t = {.m = (hm_model *)m};
    if (!oo || !logits) {
        hr_fail(err, HR_ENOMEM, "out of memory");
        goto done;
    }
    *oo = *o;
    const char *addr[HC_MAX_DEVICES - 1];
    for (int i = 1; i < cl->n; i++) addr[i - 1] = cl->addr[i];
    cli_plan_apply(p, addr, &oo->head);
    oo->plan_given = true;          /* this plan, not the planner's */
    oo->plan_trial = 0;
    oo->importance = NULL;          /* the caller's placement (o->head.place) is kept */
    oo->n_link_loss = 0;
    oo->head.no_recover = true;     /* a worker that fails fails the candidate */
    oo->head.replan = NULL;
    if (cli_engine_start(&t, oo, cp, managed, NULL, err)) goto done;
    const int32_t tok = m->hp.n_vocab > 1 ? 1 : 0; /* any token: the time does not depend on which */
    int32_t pos = 0;
    if (cli_engine_eval(&t, &tok, 1, pos++, logits, false, err)) goto done;
    for (int i = 0; i < CLI_TRIAL_WARM; i++)
        if (cli_engine_eval(&t, &tok, 1, pos++, logits, false, err)) goto done;
    int64_t t0 = hr_time_ns();
    for (int i = 0; i < tokens; i++)
        if (cli_engine_eval(&t, &tok, 1, pos++, logits, false, err)) goto done;
    ms = (double)(hr_time_ns() - t0) / 1e6 / tokens;
done:
    hm_ctx_free(t.c);
    hmem_free(t.mm);
    hc_head_free(t.tp);
    free(logits);
    free(oo);
    return ms;
}

/* the earlier trial's figures for the candidates it measured, when it covers what this run would measure:
   with --plan-trial N, exactly the candidates picked now; without, the prediction's choice among them (so
   that a trial's answer never stands against a candidate it did not see). true: t filled. */
static bool trial_cached(const cli_opts *o, uint64_t key, const hpl_choice *ch, const int *pick, int n_pick,
                         cli_trial *t) {
    bool found[HPL_MAX_CANDIDATES];
    double ms[HPL_MAX_CANDIDATES];
    int tokens;
    int n = trial_load(key, ch, found, ms, &tokens);
    if (n < 2) return false;
    if (o->plan_trial > 0) {
        if (n != n_pick) return false;
        for (int k = 0; k < n_pick; k++)
            if (!found[pick[k]]) return false;
    } else if (!found[ch->chosen]) return false;
    t->n = 0;
    for (int i = 0; i < ch->n && t->n < CLI_TRIAL_MAX; i++)
        if (found[i]) {
            t->idx[t->n] = i;
            t->ms[t->n++] = ms[i];
        }
    t->cached = true;
    t->tokens = tokens;
    t->rounds = CLI_TRIAL_ROUNDS;
    return true;
}

/* after a look-up over every neighbour (no --plan-trial): only the neighbours the earlier trial measured
   stay in ch, after its n0 candidates, and t's indices follow them */
static void trial_compact(hpl_choice *ch, int n0, cli_trial *t) {
    int to = n0;
    for (int i = n0; i < ch->n; i++) {
        int k = -1;
        for (int j = 0; j < t->n && k < 0; j++)
            if (t->idx[j] == i) k = j;
        if (k < 0) continue;
        if (to != i) ch->cand[to] = ch->cand[i];
        t->idx[k] = to++;
    }
    ch->n = to;
}

int cli_trial_run(const cli_opts *o, const hm_model *m, const hm_ctx_params *cp, bool managed, const hpl_cluster *cl,
                  int n_prompt, hpl_choice *ch, cli_trial *t, hr_err *err) {
    *t = (cli_trial){.best = ch->chosen, .n_listed = ch->n};
    if (ch->chosen < 0) return 0;
    hpl_model pm;
    if (hpl_model_from(m, cp, &pm, err)) return err->code;
    /* --plan-trial N: N; no flag (-1): the default trial, when cheap enough; 0: only the look-up */
    const bool asked = o->plan_trial > 0, by_default = o->plan_trial < 0;
    const int n0 = ch->n, want = asked ? (int)HR_MIN(o->plan_trial, CLI_TRIAL_MAX) : by_default ? CLI_TRIAL_AUTO : 0;
    const double within = o->plan_trial_within > 0 ? o->plan_trial_within : CLI_TRIAL_WITHIN;
    int pick[CLI_TRIAL_MAX], n_pick = 0;
    if (asked) n_pick = trial_select(cl, &pm, n_prompt, ch, want, within, pick);
    else /* a look-up: every neighbour, so that an earlier trial's may be found */
        trial_add_neighbours(cl, &pm, n_prompt, ch, HPL_MAX_CANDIDATES, INFINITY, pick, 0);
    const uint64_t key = trial_key(o, cl, cp);
    const bool reuse = !o->no_cache && trial_cached(o, key, ch, pick, n_pick, t);
    if (!asked) trial_compact(ch, n0, reuse ? t : &(cli_trial){0});
    t->n_listed = n0;
    const int32_t n_ctx = hm_ctx_resolve_n_ctx(&m->hp, cp->n_ctx);
    const int tokens = (int)HR_MIN(o->plan_trial_tokens > 0 ? o->plan_trial_tokens : 8, n_ctx - 1 - CLI_TRIAL_WARM);
    if (by_default && !reuse) { /* the default trial: the near-ties, when measuring them is cheap */
        n_pick = trial_select(cl, &pm, n_prompt, ch, want, within, pick);
        const double budget = o->plan_trial_budget >= 0 ? o->plan_trial_budget : CLI_TRIAL_BUDGET_RUN;
        if (tokens < 1) n_pick = 0; /* a context too short for one: no trial (asked for, it is an error) */
        if (n_pick >= 2) {
            t->estimate_s = trial_estimate_s(cl, ch, pick, n_pick, tokens);
            if (t->estimate_s > budget) {
                t->over_budget = true;
                t->budget_s = budget;
                n_pick = 0;
            }
        }
    }
    if (!reuse && n_pick < 2) {               /* nothing to choose between, or no trial asked for */
        ch->n = n0;
        return 0;
    }
    if (!reuse) {
        /* the positions a trial uses: its prompt token, the warm-up and the timed passes */
        t->tokens = tokens;
        if (t->tokens < 1) return hr_fail(err, HR_EINVAL, "a context of %d positions is too short for a trial", n_ctx);
        t->n = n_pick;
        t->rounds = CLI_TRIAL_ROUNDS;
        memcpy(t->idx, pick, sizeof pick[0] * (size_t)n_pick);
        double runs[CLI_TRIAL_MAX][CLI_TRIAL_ROUNDS];
        int ok[CLI_TRIAL_MAX] = {0};
        if (!t->estimate_s) t->estimate_s = trial_estimate_s(cl, ch, t->idx, t->n, t->tokens);
        HR_LOGI("plan trial: %d candidates, %d rounds of %d tokens each (estimated %.0f s%s; docs/planner.md, "
                "\"Trial\")", t->n, CLI_TRIAL_ROUNDS, t->tokens, t->estimate_s,
                by_default ? ", by default: --plan-trial 0 chooses by prediction alone" : "");
        const int64_t t0 = hr_time_ns();
        /* a candidate's rounds back to back: its second finds the workers' slices in their caches (in turns,
           round 1 of every candidate then round 2 in reverse, home4-8b-tiny's 8B sent 8.6 GiB again, 224 of the
           trial's 932 s: six candidates' slices outgrew a worker's cache); a burst of load on the host then
           weighs on one candidate's rounds rather than one round of several */
        for (int k = 0; k < t->n; k++)
            for (int r = 0; r < CLI_TRIAL_ROUNDS; r++) {
                const hpl_plan *p = &ch->cand[t->idx[k]];
                char desc[256];
                hpl_plan_describe(p, desc, sizeof desc);
                if (r > 0 && ok[k] < 0) continue;  /* failed once: not again */
                hr_err e = {0};
                double ms = trial_once(o, m, cp, managed, cl, p, t->tokens, &e);
                if (isnan(ms)) {
                    HR_LOGW("plan trial: candidate %d (%s) did not run: %s", t->idx[k], desc, e.msg);
                    ok[k] = -1;
                    continue;
                }
                runs[k][r] = ms;
                ok[k] = 1;
                HR_LOGI("plan trial: round %d/%d: candidate %d (%s): %.2f ms/token (predicted %.2f)", r + 1,
                        CLI_TRIAL_ROUNDS, t->idx[k], desc, ms, p->ms_per_token);
            }
        for (int k = 0; k < t->n; k++) { /* the median of the rounds (of an even count: the middle two's mean) */
            if (ok[k] != 1) {
                t->ms[k] = NAN;
                continue;
            }
            double *x = runs[k];
            for (int i = 1; i < CLI_TRIAL_ROUNDS; i++)
                for (int j = i; j > 0 && x[j] < x[j - 1]; j--) {
                    double s = x[j];
                    x[j] = x[j - 1];
                    x[j - 1] = s;
                }
            t->ms[k] = (x[(CLI_TRIAL_ROUNDS - 1) / 2] + x[CLI_TRIAL_ROUNDS / 2]) / 2;
        }
        t->elapsed_ms = (double)(hr_time_ns() - t0) / 1e6;
        HR_LOGI("plan trial: %d candidates measured in %.1f s (estimated %.0f s)", t->n, t->elapsed_ms / 1e3,
                t->estimate_s);
    }
    int best = -1;
    for (int k = 0; k < t->n; k++)
        if (!isnan(t->ms[k]) && (best < 0 || t->ms[k] < t->ms[best])) best = k;
    if (best < 0) {
        if (reuse) { /* an earlier trial in which nothing ran: by prediction */
            ch->n = n0;
            *t = (cli_trial){.best = ch->chosen, .n_listed = n0};
            return 0;
        }
        return hr_fail(err, HR_ENET, "plan trial: no candidate ran (the warnings above say why)");
    }
    if (!reuse) trial_save(key, ch, t);
    t->best = t->idx[best];
    return 0;
}

double cli_trial_ms(const cli_trial *t, int cand) {
    for (int k = 0; k < t->n; k++)
        if (t->idx[k] == cand) return t->ms[k];
    return NAN;
}

int cli_trial_near(const hpl_choice *ch, double within) {
    int idx[CLI_TRIAL_MAX];
    return trial_pick(ch, CLI_TRIAL_MAX, within, idx);
}

bool cli_trial_hint(const hpl_choice *ch, const cli_trial *t, bool in_plan, char *buf, size_t cap) {
    const int near = t->n ? 0 : cli_trial_near(ch, CLI_TRIAL_HINT);
    if (near < 2) return false;
    char over[160] = "";
    if (t->over_budget)
        snprintf(over, sizeof over, "a trial is estimated at %.0f s, over --plan-trial-budget %g; ", t->estimate_s,
                 t->budget_s);
    char plan[64] = "";
    if (!in_plan) snprintf(plan, sizeof plan, "`hearth plan` (its budget %.0f s) or ", CLI_TRIAL_BUDGET_PLAN);
    snprintf(buf, cap, "%d other candidates are predicted within %.0f%% of the chosen one, closer than the prediction "
             "can order them: %s%s`--plan-trial %d` measures them and keeps the fastest (docs/planner.md, \"Trial\")",
             near - 1, (CLI_TRIAL_HINT - 1) * 100, over, plan, HR_MIN(near, 6));
    return true;
}
