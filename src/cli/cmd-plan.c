/* `hearth plan`: the planner's view of a cluster for one model — every device's profile, every link,
   every candidate plan with its predicted speed and memory, the chosen one and why (src/plan) — as
   tables or as one JSON object. */
#include "cli.h"
#include "engine.h"

#include "quant/quant.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static json_t *plan_json_device(int i, const hpl_cluster *c) {
    char *txt = hpl_device_json(&c->dev[i]);
    json_t *o = txt ? json_loads(txt, 0, NULL) : json_object();
    free(txt);
    json_object_set_new(o, "index", json_integer(i));
    json_object_set_new(o, "address", json_string(c->addr[i]));
    if (i > 0) {
        json_object_set_new(o, "rtt_ms", json_real(c->link[0][i].rtt_ms));
        json_object_set_new(o, "link_gbps", json_real(c->link[0][i].gbps));
        json_object_set_new(o, "loss", json_real(c->link[0][i].loss));
    }
    return o;
}

static json_t *plan_num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *plan_json_cand(const hpl_plan *p, int n_prompt) {
    json_t *o = json_object(), *devs = json_array(), *mem = json_array();
    json_object_set_new(o, "kind", json_string(hpl_kind_name(p->kind)));
    for (int i = 0; i < p->n; i++) json_array_append_new(devs, json_integer(p->dev[i]));
    json_object_set_new(o, "devices", devs);
    /* hybrid: the group's stage and size (its devices devices[group_stage..group_stage + group), with
       their shares), windows per stage */
    const bool hy = p->kind == HPL_HYBRID;
    if (hy) {
        json_object_set_new(o, "group", json_integer(p->group));
        json_object_set_new(o, "group_stage", json_integer(p->gstage));
    }
    if (p->kind == HPL_TP) /* the lossy all-reduce is TP with a flag, not a kind of its own */
        json_object_set_new(o, "lossy", json_boolean(p->lossy));
    if (p->kind == HPL_TP || hy) {
        json_t *a = json_array();
        for (int i = 0; i < (hy ? p->group : p->n); i++) json_array_append_new(a, json_real(p->share[i]));
        json_object_set_new(o, "shares", a);
    }
    if (p->kind == HPL_PP || hy) {
        json_t *a = json_array();
        for (int i = 0; i < (hy ? p->n - p->group + 1 : p->n); i++) json_array_append_new(a, json_integer(p->window[i]));
        json_object_set_new(o, "windows", a);
        json_object_set_new(o, "trips", json_integer(p->trips));
    }
    char desc[256];
    hpl_plan_describe(p, desc, sizeof desc);
    json_object_set_new(o, "plan", json_string(desc));
    json_object_set_new(o, "feasible", json_boolean(p->feasible));
    if (!p->feasible) json_object_set_new(o, "why", json_string(p->why));
    json_object_set_new(o, "predicted_ms_per_token", plan_num(p->ms_per_token));
    json_object_set_new(o, "predicted_prefill_ms", plan_num(p->prefill_ms));
    json_object_set_new(o, "prompt_tokens", json_integer(n_prompt));
    json_object_set_new(o, "compute_ms", json_real(p->compute_ms));
    json_object_set_new(o, "network_ms", json_real(p->comm_ms));
    json_object_set_new(o, "blocked_ms", json_real(p->blocked_ms));
    json_object_set_new(o, "shared_disk_ms", json_real(p->shared_disk_ms));
    /* in compute_ms: what the devices' CPU quotas change against computing at the quota-bound rate throughout */
    json_object_set_new(o, "quota_ms", json_real(p->quota_ms));
    json_object_set_new(o, "messages_per_token", json_integer(p->n_messages));
    /* what loss costs (docs/planner.md, "Loss"): in network_ms already */
    json_object_set_new(o, "loss_ms", json_real(p->loss_ms));
    if (p->kind == HPL_TP) json_object_set_new(o, "allreduce_loss_probability", json_real(p->p_hit));
    if (p->lossy) {
        json_object_set_new(o, "deadline_ms", json_real(p->deadline_ms));
        json_object_set_new(o, "elements_lost_per_allreduce", json_real(p->elements_lost));
        json_object_set_new(o, "lost_fraction", json_real(p->lost_fraction));
    }
    for (int i = 0; i < p->n && p->feasible; i++) {
        const hpl_dev_cost *d = &p->dc[i];
        json_t *m = json_object();
        json_object_set_new(m, "device", json_integer(d->dev));
        json_object_set_new(m, "layers", json_integer(d->layers));
        json_object_set_new(m, "compute_ms", json_real(d->compute_ms));
        json_object_set_new(m, "blocked_ms", json_real(d->blocked_ms));
        json_object_set_new(m, "resident_bytes", json_integer((json_int_t)d->resident_bytes));
        json_object_set_new(m, "stream_bytes_per_token", json_integer((json_int_t)d->stream_bytes));
        json_object_set_new(m, "kv_bytes", json_integer((json_int_t)d->kv_bytes));
        json_object_set_new(m, "scratch_bytes", json_integer((json_int_t)d->scratch_bytes));
        json_object_set_new(m, "budget_bytes", json_integer((json_int_t)d->budget));
        json_array_append_new(mem, m);
    }
    json_object_set_new(o, "memory", mem);
    return o;
}

/* the width of the table's plan column: the longest description (hybrids name devices, shares and windows) */
static int plan_desc_width(const hpl_choice *ch, const hpl_plan *given) {
    int w = 4;
    char desc[256];
    for (int i = 0; i <= ch->n; i++) {
        const hpl_plan *p = i < ch->n ? &ch->cand[i] : given;
        if (!p) continue;
        hpl_plan_describe(p, desc, sizeof desc);
        w = HR_MAX(w, (int)strlen(desc));
    }
    return w;
}

/* one row of the candidates' table: mark ("*" the chosen, "g" the given plan), its number, its figures */
static void plan_print_row(const hpl_plan *p, const char *mark, const char *num, int width) {
    char desc[256];
    hpl_plan_describe(p, desc, sizeof desc);
    if (!p->feasible) {
        printf("%s %-3s %-*s does not fit: %s\n", mark, num, width, desc, p->why);
        return;
    }
    printf("%s %-3s %-*s %10.2f %11.1f %9.2f %9.2f %9.2f %9.2f  ", mark, num, width, desc, p->ms_per_token, p->prefill_ms,
           p->compute_ms, p->comm_ms, p->loss_ms, p->blocked_ms);
    for (int d = 0; d < p->n; d++)
        printf("%s%d: %.0f+%.0f", d ? ", " : "", p->dc[d].dev, p->dc[d].resident_bytes / 1048576.0,
               p->dc[d].stream_bytes / 1048576.0);
    printf("\n");
}

/* --cluster FILE: the devices and links of an earlier `hearth plan --json`, costed for this model */
static int cli_plan_saved(const cli_opts *o, const hm_model *m, const hm_ctx_params *cp, int n_prompt, hpl_cluster *cl,
                          hpl_choice *ch, hr_err *err) {
    hpl_model pm;
    if (hpl_cluster_read(o->cluster_file, cl, err) || hpl_model_from(m, cp, &pm, err)) return err->code;
    return hpl_choose(cl, &pm, n_prompt, ch, err);
}

static int plan_run(cli_opts *o) {
    hr_err err = {0};
    cli_engine e;
    hpl_cluster *cl = malloc(sizeof *cl);
    hpl_choice *ch = malloc(sizeof *ch);
    hpl_plan *given = NULL;   /* the plan flags' plan (`hearth run`'s reading of them), costed */
    int rc = 1;
    if (!cl || !ch) { fprintf(stderr, "hearth plan: out of memory\n"); goto done; }
    if (cli_engine_open(&e, o, false, &err)) { fprintf(stderr, "hearth plan: %s\n", err.msg); goto done; }
    /* a saved cluster is costed, not run, and a given plan is the user's: only an earlier trial's look-up */
    if (o->cluster_file || o->plan_given || o->head.pp) o->plan_trial = 0;
    if (o->plan_trial_budget < 0) o->plan_trial_budget = CLI_TRIAL_BUDGET_PLAN;
    hm_ctx_params cp = cli_ctx_params(o);
    int np = (int)o->prompt_tokens;
    if (o->cluster_file ? cli_plan_saved(o, e.m, &cp, np, cl, ch, &err) : cli_engine_plan(o, e.m, &cp, np, cl, ch, &err)) {
        fprintf(stderr, "hearth plan: %s\n", err.msg);
        cli_engine_close(&e);
        goto done;
    }
    if (o->plan_given || o->head.pp) {
        hpl_model pm;
        if (!(given = malloc(sizeof *given))) hr_fail(&err, HR_ENOMEM, "out of memory");
        hc_head_params hp = o->head;
        if (o->cluster_file) /* the saved cluster's devices are the plan flags' */
            for (hp.n_workers = 0; hp.n_workers < cl->n - 1; hp.n_workers++) hp.workers[hp.n_workers] = cl->addr[hp.n_workers + 1];
        if (!given || hpl_model_from(e.m, &cp, &pm, &err) || hpl_plan_given(cl, &pm, e.m, &hp, np, given, &err)) {
            fprintf(stderr, "hearth plan: %s\n", err.msg);
            cli_engine_close(&e);
            goto done;
        }
    }
    /* --plan-trial: the best-predicted candidates measured, the fastest chosen (trial.c) */
    cli_trial tr = {.best = -1};
    const int predicted = ch->chosen;
    if (ch->chosen >= 0) {
        if (cli_trial_run(o, e.m, &cp, true, cl, np, ch, &tr, &err)) {
            fprintf(stderr, "hearth plan: %s\n", err.msg);
            cli_engine_close(&e);
            goto done;
        }
        ch->chosen = tr.best;
    }
    char why[1024];
    if (tr.n > 0)
        snprintf(why, sizeof why, "measured %.2f ms/token, the fastest of the %d candidates %s (%d rounds of %d tokens); "
                 "by prediction alone: candidate %d (%s)", cli_trial_ms(&tr, ch->chosen), tr.n,
                 tr.cached ? "of an earlier trial" : "measured", tr.rounds, tr.tokens, predicted, ch->why);
    else snprintf(why, sizeof why, "%s", ch->why);
    cli_engine_close(&e);
    if (o->json) {
        json_t *root = json_object(), *devs = json_array(), *cands = json_array();
        for (int i = 0; i < cl->n; i++) json_array_append_new(devs, plan_json_device(i, cl));
        for (int i = 0; i < ch->n; i++) json_array_append_new(cands, plan_json_cand(&ch->cand[i], np));
        for (int i = tr.n_listed; i < ch->n; i++) /* the trial's own: a neighbour of the best-predicted pipeline */
            json_object_set_new(json_array_get(cands, (size_t)i), "neighbour", json_true());
        for (int k = 0; k < tr.n; k++) /* the trial's figure (null: that candidate did not run) */
            json_object_set_new(json_array_get(cands, (size_t)tr.idx[k]), "measured_ms_per_token",
                                isnan(tr.ms[k]) ? json_null() : json_real(tr.ms[k]));
        json_object_set_new(root, "devices", devs);
        json_t *links = json_array();
        for (int a = 0; a < cl->n; a++)
            for (int b = a + 1; b < cl->n; b++) {
                json_t *l = json_object();
                json_object_set_new(l, "a", json_integer(a));
                json_object_set_new(l, "b", json_integer(b));
                json_object_set_new(l, "rtt_ms", json_real(cl->link[a][b].rtt_ms));
                json_object_set_new(l, "gbps", json_real(cl->link[a][b].gbps));
                json_object_set_new(l, "gbps_measured", json_real(cl->link[a][b].gbps_measured));
                json_object_set_new(l, "estimated", json_boolean(cl->link[a][b].estimated));
                json_object_set_new(l, "cached", json_boolean(cl->link[a][b].cached));
                /* datagram loss (docs/planner.md, "Loss"): pooled, a -> b, b -> a, and how many datagrams
                   measured it (0: estimated from the links to the head) */
                json_object_set_new(l, "loss", json_real(cl->link[a][b].loss));
                json_object_set_new(l, "loss_ab", json_real(cl->link[a][b].loss_to));
                json_object_set_new(l, "loss_ba", json_real(cl->link[a][b].loss_from));
                json_object_set_new(l, "loss_samples", json_integer(cl->link[a][b].loss_samples));
                json_array_append_new(links, l);
            }
        json_object_set_new(root, "links", links);
        json_object_set_new(root, "profile_ms", json_real(cl->profile_ms));
        json_object_set_new(root, "candidates", cands);
        json_object_set_new(root, "chosen", ch->chosen >= 0 ? json_integer(ch->chosen) : json_null());
        json_object_set_new(root, "why", json_string(why));
        /* how the choice was made: "prediction", or "trial" (the candidates measured, their figures in
           measured_ms_per_token; predicted_choice: what the prediction alone would have run) */
        json_object_set_new(root, "chosen_by", json_string(tr.n > 0 ? "trial" : "prediction"));
        json_object_set_new(root, "predicted_choice", predicted >= 0 ? json_integer(predicted) : json_null());
        if (tr.n > 0) {
            json_t *t = json_object(), *idx = json_array();
            for (int k = 0; k < tr.n; k++) json_array_append_new(idx, json_integer(tr.idx[k]));
            json_object_set_new(t, "candidates", idx);
            json_object_set_new(t, "rounds", json_integer(tr.rounds));
            json_object_set_new(t, "tokens", json_integer(tr.tokens));
            json_object_set_new(t, "cached", json_boolean(tr.cached));
            json_object_set_new(t, "elapsed_ms", json_real(tr.elapsed_ms));
            json_object_set_new(t, "estimated_ms", json_real(tr.estimate_s * 1e3));
            json_object_set_new(root, "trial", t);
        } else if (tr.over_budget) { /* the default trial, not run: its estimate over the budget */
            json_t *t = json_object();
            json_object_set_new(t, "skipped", json_string("over budget"));
            json_object_set_new(t, "estimated_ms", json_real(tr.estimate_s * 1e3));
            json_object_set_new(t, "budget_ms", json_real(tr.budget_s * 1e3));
            json_object_set_new(root, "trial", t);
        }
        if (given) { /* docs/planner.md, "A given plan" */
            json_t *g = plan_json_cand(given, np);
            json_object_set_new(g, "source", json_string("user"));
            json_object_set_new(g, "given", json_true());
            json_object_set_new(g, "ratio_to_chosen", ch->chosen >= 0 && given->feasible
                                    ? json_real(given->ms_per_token / ch->cand[ch->chosen].ms_per_token) : json_null());
            json_object_set_new(root, "given_plan", g);
        }
        char *s = json_dumps(root, JSON_INDENT(1));
        if (s) puts(s);
        free(s);
        json_decref(root);
    } else {
        printf("devices (profiled in %.0f ms):\n", cl->profile_ms);
        for (int i = 0; i < cl->n; i++) cli_print_device(i, cl->addr[i], &cl->dev[i]);
        /* devices whose weights are on one disk (src/plan/cost.c, hpl_shared_disks) */
        for (int i = 0; i < cl->n; i++) {
            if (hpl_disk_first(cl, i) != i) continue;
            char who[128] = "";
            int k = 0;
            size_t n = 0;
            for (int j = i; j < cl->n; j++)
                if (hpl_disk_first(cl, j) == i && n < sizeof who)
                    n += (size_t)snprintf(who + n, sizeof who - n, "%s%d", k++ ? "," : "", j);
            if (k > 1) printf("  devices %s read their weights from one disk: their streaming shares it\n", who);
        }
        if (cl->n > 1) {
            printf("links:\n");
            for (int a = 0; a < cl->n; a++)
                for (int b = a + 1; b < cl->n; b++)
                    printf("  %-2d <-> %-2d  rtt %7.3f ms  %7.3f GB/s  loss %5.2f%%%s%s%s\n", a, b, cl->link[a][b].rtt_ms,
                           cl->link[a][b].gbps, 100 * cl->link[a][b].loss, cl->link[a][b].estimated ? "  (estimated)" : "",
                           !cl->link[a][b].estimated && !cl->link[a][b].loss_samples ? "  (loss estimated)" : "",
                           cl->link[a][b].cached ? "  (throughput cached)" : "");
        }
        printf("candidates (decode ms/token; prefill of %d tokens):\n", np);
        const int width = plan_desc_width(ch, given);
        printf("  %-3s %-*s %10s %11s %9s %9s %9s %9s  %s\n", "#", width, "plan", "ms/token", "prefill ms", "compute", "network",
               "of: loss", "blocked", "per device: resident + streamed/token MiB");
        for (int i = 0; i < ch->n; i++) {
            char num[16];
            snprintf(num, sizeof num, "%d", i);
            plan_print_row(&ch->cand[i], i == ch->chosen ? "*" : " ", num, width);
        }
        if (given) plan_print_row(given, "g", "-", width);
        if (tr.n_listed + 1 == ch->n)
            printf("  (%d: a neighbour of the best-predicted pipeline, added by the trial)\n", tr.n_listed);
        else if (tr.n_listed < ch->n)
            printf("  (%d-%d: neighbours of the best-predicted pipeline, added by the trial)\n", tr.n_listed, ch->n - 1);
        if (tr.n > 0) {
            if (tr.cached) printf("trial (from an earlier one, trial.json; --no-cache measures again):\n");
            else printf("trial (%d rounds of %d tokens each, %.1f s, estimated %.0f s):\n", tr.rounds, tr.tokens,
                        tr.elapsed_ms / 1000, tr.estimate_s);
            for (int k = 0; k < tr.n; k++) {
                const hpl_plan *p = &ch->cand[tr.idx[k]];
                char desc[256];
                hpl_plan_describe(p, desc, sizeof desc);
                if (isnan(tr.ms[k])) printf("  %-3d %-*s did not run (the warnings above say why)\n", tr.idx[k], width, desc);
                else printf("  %-3d %-*s measured %8.2f ms/token, predicted %8.2f (%+.0f%%)\n", tr.idx[k], width, desc,
                            tr.ms[k], p->ms_per_token, 100 * (p->ms_per_token / tr.ms[k] - 1));
            }
        }
        if (ch->chosen >= 0) printf("chosen: %d: %s\n", ch->chosen, why);
        else printf("%s\n", ch->why);
        char hint[512];
        if (!o->cluster_file && cli_trial_hint(ch, &tr, true, hint, sizeof hint)) printf("%s\n", hint);
        if (given) {
            char desc[256];
            hpl_plan_describe(given, desc, sizeof desc);
            if (!given->feasible) printf("given (g): %s: does not fit: %s\n", desc, given->why);
            else if (ch->chosen >= 0)
                printf("given (g): %s: %.2f ms/token predicted, %.2fx the chosen plan's %.2f\n", desc,
                       given->ms_per_token, given->ms_per_token / ch->cand[ch->chosen].ms_per_token,
                       ch->cand[ch->chosen].ms_per_token);
            else printf("given (g): %s: %.2f ms/token predicted\n", desc, given->ms_per_token);
        }
    }
    rc = ch->chosen >= 0 ? 0 : 1;
    if (rc && o->json) fprintf(stderr, "hearth plan: %s\n", ch->why);
    if (given && !given->feasible) { /* as `hearth run` would fail: the plan cannot run */
        fprintf(stderr, "hearth plan: the given plan does not fit: %s\n", given->why);
        rc = 1;
    }
done:
    free(given);
    free(cl);
    free(ch);
    return rc;
}

static int plan_check(const cli_command *c, cli_opts *o) {
    int rc = cli_check_model(c, o);
    if (rc) return rc;
    if (!o->cluster_file) return cli_check_cluster(c, o);
    if (o->head.n_workers || o->workers_auto) return cli_usage_error(c, "--cluster FILE or --workers: not both");
    if (o->plan_trial > 0) return cli_usage_error(c, "--plan-trial runs the plans; --cluster FILE measures nothing");
    if (o->no_cache || o->profile_serial)
        return cli_usage_error(c, "%s measures; --cluster FILE measures nothing", o->no_cache ? "--no-cache" : "--profile-serial");
    return 0;
}

const cli_command cli_plan = {
    "plan", CLI_PLAN, "measure the devices and links, predict every plan, choose one",
    "-m MODEL [--workers H:P,... | --cluster SAVED.json] [-c CTX] [--json] [--tp-shares W,... | --pp [--layer-windows N,...] | --stages ...]",
    "Profiles this device (cached) and every worker (each measures itself; cached there), measures the\n"
    "links to the workers, then predicts, for every candidate plan — one device; tensor parallel over\n"
    "the head and each set of workers (shares by min-max); a piped-ring pipeline over them (windows\n"
    "and trips by an ILP); hybrid plans, one of whose stages is a tensor-parallel group — the head and\n"
    "its workers of the fastest links, or the two workers with the fastest link between them (the same\n"
    "ILP, the group as one device) — decode ms/token,\n"
    "prefill time and each device's memory, and names the fastest. `hearth run --workers ...` without\n"
    "plan flags runs that plan. With plan flags (--tp-shares, --pp, --layer-windows, --stages, --lossy),\n"
    "the plan they give, read and checked as `hearth run` reads them, is costed too: a row marked g,\n"
    "\"given_plan\" in the JSON, and its predicted ms/token against the chosen plan's. With --cluster\n"
    "FILE nothing is measured: the devices and links are FILE's. Where other candidates are\n"
    "predicted within 1.5x of the best, the 4 best-predicted and 2 neighbours (of the best pipeline\n"
    "and of the best TP plan) are run for a few tokens each and the fastest measured is chosen\n"
    "(a \"trial\" table; measured_ms_per_token and \"chosen_by\": \"trial\" in the JSON), when that is\n"
    "estimated to take at most --plan-trial-budget seconds (1200; --plan-trial N: N of them,\n"
    "whatever it takes; --plan-trial 0: none); `hearth run` with the same workers then takes\n"
    "that choice from trial.json. docs/planner.md.",
    .check = plan_check, .run = plan_run};
