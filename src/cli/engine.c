/* cli/engine: a model set up from the flags, on this device or on a cluster */
#include "engine.h"

#include <math.h>
#include <string.h>
#include <time.h>
#include <stdlib.h>

/* flags that work but are likely mistakes: said once, the run goes on */
static void cli_engine_warn(const cli_engine *e, const cli_opts *o) {
    int cores = hr_physical_cores();
    if (o->threads > 2 * cores)
        HR_LOGW("-t %ld is far above this machine's %d cores: the threads will take turns (slower than -t %d)",
                o->threads, cores, cores);
    int32_t train = e->m->hp.n_ctx_train;
    if (train > 0 && o->n_ctx > train)
        HR_LOGW("-c %ld is longer than the %d tokens %s was trained on: text past that may degrade", o->n_ctx, train,
                e->m->hp.name[0] ? e->m->hp.name : "the model");
}

int cli_engine_open(cli_engine *e, const cli_opts *o, bool vocab, hr_err *err) {
    *e = (cli_engine){0};
    if (!(e->g = gguf_open(o->model, err)) || !(e->m = hm_model_load(e->g, err))) return err->code;
    cli_engine_warn(e, o);
    if (!vocab) return 0;
    if (!(e->voc = ht_vocab_load(e->g, err))) return err->code;
    if (ht_vocab_size(e->voc) > e->m->hp.n_vocab)
        return hr_fail(err, HR_EFORMAT, "vocabulary has %d tokens but the model's embedding has %d rows",
                       ht_vocab_size(e->voc), e->m->hp.n_vocab);
    return 0;
}

/* The lossy all-reduce's test hook: HEARTH_LOSSY_DROP=SEED:RATE[:DUP[:D+D+...]] makes every device (or
   only devices D, 0 the head) drop its outgoing datagrams with probability RATE (0..1) in a pattern fixed
   by SEED, and with DUP 1 send each of the others twice (docs/lossy.md); the planner's loss probe drops
   its datagrams the same way, on every link (docs/planner.md, "Loss"); not in --help. Unset: all zero. */
static int cli_lossy_drop_env(uint64_t *seed_out, uint32_t *ppm, bool *dup_out, uint64_t *devs_out, hr_err *err) {
    *seed_out = 0;
    *ppm = 0;
    *dup_out = false;
    *devs_out = 0;
    const char *v = getenv("HEARTH_LOSSY_DROP");
    if (!v || !*v) return 0;
    char *end;
    unsigned long long seed = strtoull(v, &end, 10);
    double rate = *end == ':' ? strtod(end + 1, &end) : -1;
    long dup = 0;
    if (*end == ':') dup = strtol(end + 1, &end, 10);
    uint64_t devs = 0;
    for (char sep = *end == ':' ? '+' : 0; sep == '+' && *end; sep = *end) {
        long d = strtol(end + 1, &end, 10);
        if (d < 0 || d >= HC_MAX_DEVICES) break;
        devs |= 1ull << d;
    }
    if (*end || !(rate >= 0 && rate <= 1) || dup < 0 || dup > 1)
        return hr_fail(err, HR_EINVAL, "HEARTH_LOSSY_DROP: expected SEED:RATE[:DUP[:D+D+...]] (RATE 0..1, DUP 0 or 1, "
                       "D devices, 0 the head)");
    *dup_out = dup == 1;
    *seed_out = seed;
    *ppm = (uint32_t)(rate * 1e6 + 0.5);
    *devs_out = devs;
    return 0;
}

int cli_engine_plan(const cli_opts *o, const hm_model *m, const hm_ctx_params *cp, int n_prompt, hpl_cluster *cl,
                    hpl_choice *ch, hr_err *err) {
    hpl_model pm;
    if (hpl_model_from(m, cp, &pm, err)) return err->code;
    hpl_cluster_params p = hpl_cluster_default_params();
    p.self.n_threads = cp->n_threads;
    p.self.disk_path = o->model;
    p.self.mem = o->mem;
    p.self.no_cache = o->no_cache;
    p.self.types = hpl_model_types(&pm); /* the first profile measures only what the model uses */
    p.serial = o->profile_serial;
    p.key = o->head.key;
    bool dup;
    uint64_t devs;
    if (cli_lossy_drop_env(&p.loss_drop_seed, &p.loss_drop_ppm, &dup, &devs, err)) return err->code;
    if (hpl_cluster_profile(o->head.workers, o->head.n_workers, &p, cl, err)) return err->code;
    return hpl_choose(cl, &pm, n_prompt, ch, err);
}

/* The test hook HEARTH_PLAN_PICK (docs/planner.md, "Test hook"): run a candidate of the test's choosing
   instead of the planner's — "single", "tp", "pp" or "hybrid" (the fastest predicted feasible candidate
   of that kind; tp: exact, not lossy) or a candidate's index in `hearth plan --json`. On loopback every
   link is alike, so the planner would never pick some kinds; this lets the tests run them end to end.
   *pick: the candidate; unset or empty: ch->chosen. */
static int cli_plan_pick(const hpl_choice *ch, const char **hook, int *pick, hr_err *err) {
    const char *v = getenv("HEARTH_PLAN_PICK");
    *hook = v && *v ? v : NULL;
    *pick = ch->chosen;
    if (!*hook) return 0;
    char *end;
    long idx = strtol(v, &end, 10);
    if (end != v && !*end) {
        if (idx < 0 || idx >= ch->n)
            return hr_fail(err, HR_EINVAL, "HEARTH_PLAN_PICK=%s: the planner has candidates 0 to %d", v, ch->n - 1);
        if (!ch->cand[idx].feasible)
            return hr_fail(err, HR_EINVAL, "HEARTH_PLAN_PICK=%s: that candidate is not feasible (%s)", v,
                           ch->cand[idx].why);
        *pick = (int)idx;
        return 0;
    }
    for (int k = HPL_SINGLE; k <= HPL_HYBRID; k++)
        if (!strcmp(v, hpl_kind_name(k))) {
            if ((*pick = hpl_best_of_kind(ch, k)) < 0)
                return hr_fail(err, HR_EINVAL, "HEARTH_PLAN_PICK=%s: no feasible %s candidate on this cluster", v, v);
            return 0;
        }
    return hr_fail(err, HR_EINVAL, "HEARTH_PLAN_PICK=%s: want single, tp, pp, hybrid or a candidate's index", v);
}

void cli_plan_apply(const hpl_plan *p, const char *const *addr, hc_head_params *h) {
    h->n_workers = p->n - 1;
    for (int i = 1; i < p->n; i++) h->workers[i - 1] = addr[p->dev[i] - 1];
    h->pp = false;
    h->n_shares = h->n_windows = h->n_stages = 0;
    h->shares_auto = false;
    h->lossy = p->lossy; /* the lossy all-reduce (docs/lossy.md): star, UDP partials with a deadline */
    if (p->lossy) h->allreduce = HC_ALLREDUCE_STAR;
    if (p->kind == HPL_TP) {
        h->n_shares = p->n;
        memcpy(h->shares, p->share, sizeof p->share[0] * (size_t)p->n);
    } else if (p->kind == HPL_PP) {
        h->pp = true;
        h->n_windows = p->n;
        memcpy(h->layer_windows, p->window, sizeof p->window[0] * (size_t)p->n);
    } else if (p->kind == HPL_HYBRID) {
        /* the workers are in the plan's order, the stages' devices one after the other: one device a
           stage, but the group's at stage gstage (0: the head's) */
        h->pp = true;
        h->n_stages = p->n - p->group + 1;
        for (int s = 0; s < h->n_stages; s++) h->stage_devs[s] = s == p->gstage ? p->group : 1;
        h->n_shares = p->group;
        memcpy(h->shares, p->share, sizeof p->share[0] * (size_t)p->group);
        h->n_windows = h->n_stages;
        memcpy(h->layer_windows, p->window, sizeof p->window[0] * (size_t)h->n_stages);
    }
}

/* The planner's choice for o's model over h's workers becomes h's plan (h->n_workers 0: one device);
   loss (optional): each of the plan's workers' measured datagram loss in percent, in h->workers order.
   trial: an earlier trial looked up, or the best-predicted candidates measured and the fastest run
   (--plan-trial N, or the default trial within its budget: trial.c; managed: as cli_engine_start's); a
   re-plan after a failure does not measure. */
static int cli_engine_choose(const cli_opts *o, const hm_model *m, const hm_ctx_params *cp, hc_head_params *h,
                             double *loss, bool trial, bool managed, hr_err *err) {
    hpl_cluster *cl = malloc(sizeof *cl);
    hpl_choice *ch = malloc(sizeof *ch);
    cli_opts *oo = malloc(sizeof *oo);
    int rc = 0;
    if (!cl || !ch || !oo) rc = hr_fail(err, HR_ENOMEM, "out of memory");
    else {
        *oo = *o;
        oo->head = *h;
        /* a worker that does not answer (gone, stopped) is planned without, as one that leaves later */
        while ((rc = cli_engine_plan(oo, m, cp, 512, cl, ch, err)) && !h->no_recover && cl->failed > 0 &&
               (rc == HR_ENET || rc == HR_ETIMEDOUT)) {
            int i = cl->failed - 1;
            HR_LOGW("worker %s does not answer (%s): planning without it", oo->head.workers[i], err->msg);
            memmove(&oo->head.workers[i], &oo->head.workers[i + 1],
                    sizeof oo->head.workers[0] * (size_t)(oo->head.n_workers - i - 1));
            oo->head.n_workers--;
        }
        if (!rc && ch->chosen < 0) rc = hr_fail(err, HR_ENOMEM, "%s", ch->why);
        h->n_workers = oo->head.n_workers;
        memcpy(h->workers, oo->head.workers, sizeof h->workers);
    }
    const char *hook = NULL;
    int pick = -1;
    if (!rc) rc = cli_plan_pick(ch, &hook, &pick, err);
    cli_trial tr = {.best = -1};
    if (!rc && trial && !hook && !(rc = cli_trial_run(oo, m, cp, managed, cl, 512, ch, &tr, err)))
        pick = tr.best;
    const bool trial_hint = trial && o->plan_trial <= 0;
    if (!rc) {
        const hpl_plan *p = &ch->cand[pick];
        char desc[256];
        hpl_plan_describe(p, desc, sizeof desc);
        if (hook)
            HR_LOGW("plan: candidate %d forced by the test hook HEARTH_PLAN_PICK=%s, not the planner's choice (%d): "
                    "%s: predicted %.2f ms/token", pick, hook, ch->chosen, desc, p->ms_per_token);
        else if (tr.n > 0)
            HR_LOGI("plan: %s: measured %.2f ms/token, the fastest of %d candidates %s (predicted %.2f; the "
                    "planner's own choice was candidate %d)", desc, cli_trial_ms(&tr, pick), tr.n,
                    tr.cached ? "in an earlier trial (trial.json in the profile cache)" : "in this trial", p->ms_per_token,
                    ch->chosen);
        else {
            HR_LOGI("plan: %s: predicted %.2f ms/token (profiled in %.0f ms; `hearth plan` lists every candidate)", desc,
                    p->ms_per_token, cl->profile_ms);
            char hint[512];
            if (trial_hint && cli_trial_hint(ch, &tr, false, hint, sizeof hint)) HR_LOGI("plan: %s", hint);
        }
        if (p->lossy && !hook)
            HR_LOGI("plan: lossy mode (--lossy: the all-reduces' partials as UDP datagrams, %.0f ms deadline), since the "
                    "links lose datagrams: %s", p->deadline_ms, ch->why);
        const char *all[HC_MAX_DEVICES - 1];
        memcpy(all, h->workers, sizeof all);
        cli_plan_apply(p, all, h);
        for (int i = 1; i < p->n && loss; i++) loss[i - 1] = cl->link[0][p->dev[i]].loss * 100;
    }
    free(cl);
    free(ch);
    free(oo);
    return rc;
}

/* hc_replan_fn: the planner again, over the workers that remain (a worker still ending the failed
   session says it is busy for a moment: asked again). Its budgets hold: when nothing fits, the error. */
static int cli_engine_replan(void *user, hc_head_params *p, hr_err *err) {
    const cli_engine *e = user;
    if (p->n_workers == 0) return 0;   /* the head alone */
    int64_t until = hr_time_ns() + 5000 * 1000000LL;
    for (;;) {
        hc_head_params q = *p;
        int rc = cli_engine_choose(e->o, e->m, &e->cp, &q, NULL, false, false, err);
        if (!rc) {
            *p = q;
            return 0;
        }
        if (!strstr(err->msg, "busy") || hr_time_ns() > until) return rc;
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* The lossy all-reduce's test hook: the head's share of it (the workers get it in LOAD_PLAN) */
static int cli_lossy_drop(hc_head_params *hp, hr_err *err) {
    bool dup;
    if (cli_lossy_drop_env(&hp->lossy_drop_seed, &hp->lossy_drop_ppm, &dup, &hp->lossy_drop_devices, err))
        return err->code;
    hp->lossy_dup = dup;
    return 0;
}

int cli_importance_load(const hm_model *m, const char *path, hpl_importance *imp, hr_err *err) {
    const hm_hparams *hp = &m->hp;
    hc_plan one;
    const double w = 1;
    int rc = hc_plan_make(m, &w, 1, &one, err);
    if (rc || (rc = hpl_importance_read(imp, path, err))) return rc;
    int32_t ga = hp->n_head_kv / one.att_group, gf = hp->n_ff / one.ff_group;
    if (imp->model[0] && hp->name[0] && strcmp(imp->model, hp->name))
        rc = hr_fail(err, HR_EINVAL, "'%s' was measured on the model '%s', not on '%s'", path, imp->model, hp->name);
    else if (imp->n_layer != hp->n_layer || imp->n_embd != hp->n_embd || imp->att_kv != one.att_group ||
             imp->ff != one.ff_group || imp->n_groups[0] != ga || imp->n_groups[1] != gf)
        rc = hr_fail(err, HR_EINVAL, "'%s' has %d layers of width %d, %d attention groups of %d KV heads and %d FFN "
                     "groups of %d neurons; this model %d layers of width %d, %d of %d and %d of %d", path, imp->n_layer,
                     imp->n_embd, imp->n_groups[0], imp->att_kv, imp->n_groups[1], imp->ff, hp->n_layer, hp->n_embd, ga,
                     one.att_group, gf, one.ff_group);
    if (rc) hpl_importance_free(imp);
    return rc;
}

/* hc_place_fn: HALO's Algorithm 3 per layer over the importance file, with the links' loss from
   --link-loss (by worker address, so that a re-plan over fewer workers keeps each one's), then every
   device's groups in a row, in device order, which is the order the plan's ranges follow */
static int cli_engine_place(void *user, const hc_plan *plan, const char *const *names, hc_order *ord, hr_err *err) {
    const cli_engine *e = user;
    const cli_opts *o = e->o;
    const int n = plan->n_devices;
    double loss[HC_MAX_DEVICES] = {0};
    for (int d = 1; d < n; d++)
        for (int i = 0; i < o->head.n_workers && o->n_link_loss; i++)
            if (!strcmp(names[d], o->head.workers[i])) loss[d] = o->link_loss[o->n_link_loss == 1 ? 0 : i] / 100;
    if (e->imp.att_kv != plan->att_group || e->imp.ff != plan->ff_group)
        return hr_fail(err, HR_EINVAL, "the importance file's groups (%d KV heads, %d neurons) are not the plan's (%d, %d)",
                       e->imp.att_kv, e->imp.ff, plan->att_group, plan->ff_group);
    int32_t *assign = malloc(sizeof *assign * (size_t)HR_MAX(ord->n_groups[0], ord->n_groups[1]));
    if (!assign) return hr_fail(err, HR_ENOMEM, "out of memory");
    int rc = 0;
    for (int b = 0; b < 2 && !rc; b++) {
        const int32_t G = ord->n_groups[b], size = b ? plan->ff_group : plan->att_group;
        int32_t count[HC_MAX_DEVICES];
        for (int d = 0; d < n; d++)
            count[d] = b ? (plan->dev[d].ff_end - plan->dev[d].ff_begin) / size
                         : (plan->dev[d].kv_end - plan->dev[d].kv_begin) / size;
        for (int il = 0; il < ord->n_layer && !rc; il++) {
            if ((rc = hpl_place_groups(e->imp.imp[b] + (size_t)il * G, G, loss, count, n, assign, err))) break;
            int32_t *row = ord->order[b] + (size_t)il * G, k = 0;
            for (int d = 0; d < n; d++)
                for (int32_t g = 0; g < G; g++)
                    if (assign[g] == d) row[k++] = g;
        }
    }
    free(assign);
    return rc;
}

/* --importance and --link-loss: what they apply to, the file read and checked, the placement set
   (before the planner, whose choice may then leave it unused: one device, a pipeline) */
static int cli_engine_importance(cli_engine *e, cli_opts *o, hr_err *err) {
    if (o->n_link_loss && !o->importance && !o->head.lossy_protect)
        return hr_fail(err, HR_EINVAL, "--link-loss is for --importance's placement or --lossy-protect");
    if (o->n_link_loss > 1 && !o->n_sim_loss && o->n_link_loss != o->head.n_workers)
        return hr_fail(err, HR_EINVAL, "--link-loss has %d values for %d workers", o->n_link_loss, o->head.n_workers);
    if (!o->importance || o->n_sim_loss) return 0;   /* the simulation's (cmd-perplexity.c) */
    if (!o->head.n_workers)
        return hr_fail(err, HR_EINVAL, "--importance places unit groups on --workers (tensor parallelism)");
    /* --link-loss is in --workers order, before the planner leaves any out (checked above) */
    if (o->head.pp) HR_LOGW("--importance: a pipeline computes whole layers; the placement of unit groups is not used");
    if (cli_importance_load(e->m, o->importance, &e->imp, err)) return err->code;
    o->head.place = cli_engine_place;
    o->head.place_user = e;
    return 0;
}

int cli_engine_start(cli_engine *e, cli_opts *o, const hm_ctx_params *cp, bool managed, hc_progress_fn progress,
                     hr_err *err) {
    e->o = o;
    e->cp = *cp;
    if (cli_engine_importance(e, o, err)) return err->code;
    bool planner = o->head.n_workers && !o->plan_given && !o->head.pp;
    /* --importance without --link-loss: the placement takes the loss the planner's probe measured */
    const bool probed = planner && o->importance && !o->n_link_loss && !o->n_sim_loss;
    if (planner && cli_engine_choose(o, e->m, cp, &o->head, probed ? o->link_loss : NULL, true, managed, err))
        return err->code;
    if (probed) {
        o->n_link_loss = o->head.n_workers;
        for (int i = 0; i < o->n_link_loss; i++)
            HR_LOGI("placement: worker %s loses %.2f%% of datagrams (measured)", o->head.workers[i], o->link_loss[i]);
    }
    if (o->head.lossy && !o->head.n_workers) return hr_fail(err, HR_EINVAL, "--lossy needs --workers");
    if (o->head.lossy && cli_lossy_drop(&o->head, err)) return err->code;
    if (o->head.lossy_protect && !o->head.lossy) return hr_fail(err, HR_EINVAL, "--lossy-protect is for --lossy");
    if (o->head.lossy_protect_rank && !o->head.lossy_protect)
        return hr_fail(err, HR_EINVAL, "--lossy-protect-rank is for --lossy-protect");
    o->head.lossy_protect_devices = 0; /* every worker, unless the links' loss says which are lossy */
    for (int i = 0; o->head.lossy_protect && i < o->head.n_workers && i < 63 && o->n_link_loss; i++)
        if (o->link_loss[o->n_link_loss == 1 ? 0 : i] > 0) o->head.lossy_protect_devices |= 1ull << (i + 1);
    if (o->head.lossy_protect && o->n_link_loss && !o->head.lossy_protect_devices) {
        HR_LOGW("--lossy-protect: --link-loss gives no worker a loss: nothing to protect");
        o->head.lossy_protect = 0;
    }
    if (o->head.n_workers) {
        if (planner) {
            o->head.replan = cli_engine_replan;
            o->head.replan_user = e;
        }
        o->head.timeout_ms = (int)(o->worker_timeout * 1000 + 0.5);
        /* the head makes its own residency manager, for its shard */
        o->head.model_path = o->model;
        o->head.mem = o->mem;
        o->head.cache_dir = o->cache_dir;
        o->head.cache_max = o->cache_max;
        o->head.use_mmap = o->use_mmap;
        o->head.no_repack = o->no_repack;
        o->head.progress = progress;
        return (e->tp = hc_head_create(e->m, &o->head, cp, err)) ? 0 : err->code;
    }
    hm_shard sh = hm_shard_full(e->m);
    if (e->groups) hm_groups_attach(e->groups, &sh);
    uint64_t ctx_bytes = hm_ctx_bytes_estimate(&e->m->hp, cp);
    /* the plan follows the KV cache's use (cli_engine_eval says how many positions): the scratch is
       what the context takes beside its positions */
    int32_t n_ctx = hm_ctx_resolve_n_ctx(&e->m->hp, cp->n_ctx);
    if (managed ? hmem_setup_kv(e->m, &sh, o->model, &o->mem, ctx_bytes, hm_ctx_base_bytes_for_shard(&e->m->hp, &sh, cp),
                                n_ctx, &e->mm, err)
                : hmem_check_ctx(ctx_bytes, err))
        return err->code;
    if (hmem_load_weights(e->mm, e->m, &sh, o->use_mmap, o->no_repack, err)) return err->code;
    return (e->c = hm_ctx_create(e->m, &sh, cp, err)) ? 0 : err->code;
}

int cli_engine_eval(cli_engine *e, const int32_t *tokens, int n, int32_t pos0, float *logits, bool all, hr_err *err) {
    if (e->tp) return hc_head_eval(e->tp, tokens, n, pos0, logits, all, err);
    if (e->mm && hmem_set_positions(e->mm, pos0 + n, err)) return err->code;
    const hm_batch b = {.tokens = tokens, .n = n, .pos = pos0, .logits = logits, .all_logits = all};
    return hm_eval(e->c, &b, err);
}

int cli_engine_check_logits(const float *logits, size_t n, hr_err *err) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += !isfinite(logits[i]);
    if (!bad) return 0;
    return hr_fail(err, HR_ERANGE, "%zu of %zu logits are not finite (NaN or Inf): the model's weights hold NaN or "
                   "Inf, or overflow", bad, n);
}

int cli_engine_rejoin(cli_engine *e, hr_err *err) { return e->tp ? hc_head_rejoin(e->tp, err) : 0; }

int32_t cli_engine_n_ctx(const cli_engine *e) { return e->tp ? hc_head_n_ctx(e->tp) : hm_ctx_n_ctx(e->c); }

void cli_engine_close(cli_engine *e) {
    hm_ctx_free(e->c);
    hm_groups_free(e->groups);
    hpl_importance_free(&e->imp);
    hmem_free(e->mm);
    hc_head_free(e->tp);
    ht_vocab_free(e->voc);
    hm_model_free(e->m);
    gguf_close(e->g);
    *e = (cli_engine){0};
}

/* ---- a text in chunks, as llama-perplexity runs it -------------------------------------------------- */

static int cli_chunks_setup(cli_chunks *ck, const cli_engine *e, int n_ctx, int n_batch, int max_chunks, hr_err *err) {
    ck->n_ctx = n_ctx;
    ck->n_batch = n_batch > 0 ? HR_MIN(n_batch, n_ctx) : n_ctx;
    ck->n_chunk = ck->n_tokens / n_ctx;
    if (max_chunks > 0) ck->n_chunk = HR_MIN(ck->n_chunk, max_chunks);
    ck->first = n_ctx / 2;
    ck->bos = ht_add_bos(e->voc) ? ht_token_bos(e->voc) : -1;
    ck->buf = malloc(sizeof *ck->buf * (size_t)n_ctx);
    ck->all = malloc(sizeof *ck->all * (size_t)ck->n_batch * (size_t)e->m->hp.n_vocab);
    if (!ck->buf || !ck->all) return hr_fail(err, HR_ENOMEM, "out of memory for a chunk's logits");
    return 0;
}

int cli_chunks_init(cli_chunks *ck, const cli_engine *e, const char *text, size_t len, int n_ctx, int n_batch,
                    int max_chunks, hr_err *err) {
    *ck = (cli_chunks){0};
    const bool bos = ht_add_bos(e->voc);
    int n = ht_tokenize(e->voc, text, len, bos, NULL, 0);
    if (n >= 0 && !(ck->tokens = malloc(sizeof *ck->tokens * (size_t)HR_MAX(n, 1)))) n = HR_ENOMEM;
    if (n >= 0) n = ht_tokenize(e->voc, text, len, bos, ck->tokens, n);
    if (n < 0) return hr_fail(err, n, "tokenizing the text failed: %s", hr_strerror(n));
    ck->n_tokens = n;
    return cli_chunks_setup(ck, e, n_ctx, n_batch, max_chunks, err);
}

int cli_chunks_from_tokens(cli_chunks *ck, const cli_engine *e, const int32_t *tokens, int n_chunk, int n_ctx,
                           int n_batch, hr_err *err) {
    *ck = (cli_chunks){0};
    const size_t n = (size_t)n_chunk * (size_t)n_ctx;
    if (!(ck->tokens = malloc(sizeof *ck->tokens * HR_MAX(n, 1)))) return hr_fail(err, HR_ENOMEM, "out of memory");
    memcpy(ck->tokens, tokens, sizeof *tokens * n);
    ck->n_tokens = (int)n;
    return cli_chunks_setup(ck, e, n_ctx, n_batch, 0, err);
}

int cli_chunk_eval(cli_engine *e, cli_chunks *ck, int i, float *logits, hr_err *err) {
    const int64_t V = e->m->hp.n_vocab;
    memcpy(ck->buf, ck->tokens + (size_t)i * ck->n_ctx, sizeof *ck->buf * (size_t)ck->n_ctx);
    if (ck->bos >= 0) ck->buf[0] = ck->bos;
    for (int p0 = 0; p0 < ck->n_ctx; p0 += ck->n_batch) {
        const int nb = HR_MIN(ck->n_batch, ck->n_ctx - p0);
        /* every position's logits (the scored ones are the batch's last rows), or none at all */
        if (cli_engine_eval(e, ck->buf + p0, nb, p0, logits ? ck->all : NULL, logits != NULL, err)) return err->code;
        for (int p = HR_MAX(p0, ck->first); logits && p < p0 + nb && p < ck->n_ctx - 1; p++)
            memcpy(logits + (size_t)(p - ck->first) * V, ck->all + (size_t)(p - p0) * V, sizeof(float) * (size_t)V);
    }
    return 0;
}

void cli_chunks_free(cli_chunks *ck) {
    free(ck->tokens);
    free(ck->buf);
    free(ck->all);
    *ck = (cli_chunks){0};
}
