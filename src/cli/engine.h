/* cli/engine: what the commands that run a model share — the file, the model and its vocabulary,
   the residency manager, and either a context on this device or the head of a cluster — set up from
   the flags (cli_opts) in one place, and one forward-pass call for both. */
#ifndef HEARTH_CLI_ENGINE_H
#define HEARTH_CLI_ENGINE_H

#include "flags.h"
#include "gguf/gguf.h"
#include "plan/plan.h"

typedef struct cli_engine {
    gguf_ctx *g;
    hm_model *m;
    ht_vocab *voc;    /* NULL unless asked for */
    hmem     *mm;     /* this device's residency manager, or NULL */
    hm_ctx   *c;      /* one device */
    hc_head  *tp;     /* or the head of a cluster (--workers) */
    hm_groups *groups;/* set before cli_engine_start (one device only): its probe sees every block
                         (calibration, loss simulation; model.h) */
    hpl_importance imp; /* --importance with --workers: the placement of unit groups (docs/lossy.md) */
    /* the planner again when a worker leaves (the planner's plan: no plan flags) */
    const cli_opts *o;
    hm_ctx_params   cp;
} cli_engine;

/* Maps o->model and loads its hyper-parameters (and its vocabulary when `vocab`, checked against the
   embedding's rows). */
int  cli_engine_open(cli_engine *e, const cli_opts *o, bool vocab, hr_err *err);
/* The residency manager (managed: from o->mem; else none, the weights loaded if they fit), the weights,
   and the context for cp — or, with --workers, the cluster's head (o->head; progress may be NULL). */
int  cli_engine_start(cli_engine *e, cli_opts *o, const hm_ctx_params *cp, bool managed, hc_progress_fn progress,
                      hr_err *err);
/* Reads an importance file (`hearth calibrate`) and checks it against the model m: its name, layers,
   width, group sizes and counts (those of tensor parallelism's plan). */
int  cli_importance_load(const hm_model *m, const char *path, hpl_importance *imp, hr_err *err);
/* The planner for o's --workers: profiles the cluster (this device from its cache when it can) and
   costs every candidate plan for the model m run with cp. cl and ch are filled (ch->chosen -1 with
   ch->why when nothing fits). */
int  cli_engine_plan(const cli_opts *o, const hm_model *m, const hm_ctx_params *cp, int n_prompt, hpl_cluster *cl,
                     hpl_choice *ch, hr_err *err);
/* Plan p (a candidate of the planner's) as h's plan flags: its workers (addr[i]: cluster device i+1's
   "HOST:PORT"), shares, windows, stages, lossy mode; what h says besides (key, timeouts) is kept. */
void cli_plan_apply(const hpl_plan *p, const char *const *addr, hc_head_params *h);

/* The trial (trial.c; docs/planner.md, "Trial"): with o->plan_trial N, the N best-predicted candidates of
   ch (feasible, within 1.5x of the best, one of each description) and N/2 (at least one) neighbours of the
   best-predicted pipeline (a layer moved between two stages, the trips doubled or halved) and of the best
   TP plan (the head's share moved), appended to ch, run for a few tokens each, two rounds of a candidate
   back to back, as `hearth run` runs them (managed: as cli_engine_start's),
   unless an earlier trial of the same model, devices, threads, context and candidates is in trial.json
   (the profile cache's folder; o->no_cache: measured again). Every choice first looks trial.json up: an
   earlier trial that measured the prediction's choice decides among what it measured. With no
   --plan-trial (o->plan_trial -1) and nothing found, the default trial: CLI_TRIAL_AUTO candidates and half
   as many neighbours, when two or more are within reach and its estimate is at most o->plan_trial_budget
   seconds (-1: CLI_TRIAL_BUDGET_RUN; over it, t->over_budget and no trial); o->plan_trial 0: the look-up
   only. best: the candidate measured fastest (ch->chosen when there was no trial: n 0). A candidate that
   fails is warned about and left out; none that runs is an error. n_prompt: the prefill figure's prompt,
   for the neighbours' costs. */
#define CLI_TRIAL_MAX 16
typedef struct cli_trial {
    int    n;                      /* candidates measured */
    int    idx[CLI_TRIAL_MAX];     /* their indices in the choice */
    double ms[CLI_TRIAL_MAX];      /* their decode ms/token, the median of the rounds; NAN: it failed */
    int    tokens;                 /* timed decode passes a run */
    int    rounds;                 /* runs of each candidate (the median of them is its figure) */
    int    best;                   /* index in the choice */
    int    n_listed;               /* the planner's own candidates: the neighbours the trial added come after */
    bool   cached;                 /* the figures came from an earlier trial */
    double elapsed_ms;             /* the trial's time (0 when cached) */
    double estimate_s;             /* what it was estimated to take (trial.c, trial_estimate_s; 0: not estimated) */
    bool   over_budget;            /* the default trial did not run: estimate_s over budget_s */
    double budget_s;
} cli_trial;
#define CLI_TRIAL_BUDGET_RUN  120.0 /* s: the default trial of run, chat and serve (--plan-trial-budget) */
#define CLI_TRIAL_BUDGET_PLAN 1200.0 /* s: of `hearth plan`, the household's set-up step, run once (trial.json keeps its figures) */
int    cli_trial_run(const cli_opts *o, const hm_model *m, const hm_ctx_params *cp, bool managed, const hpl_cluster *cl,
                     int n_prompt, hpl_choice *ch, cli_trial *t, hr_err *err);
double cli_trial_ms(const cli_trial *t, int cand);   /* candidate cand's measured figure; NAN: not measured */
/* distinct feasible candidates of ch predicted within `within` times the best (the best included): near-ties,
   which the prediction alone cannot order (the hint to use --plan-trial) */
#define CLI_TRIAL_HINT 1.10
int    cli_trial_near(const hpl_choice *ch, double within);
/* after a choice by prediction (t->n 0) among near-ties: the sentence that says so and how to measure them
   (t->over_budget: the default trial's estimate and budget; !in_plan: `hearth plan` named too) in buf;
   false, buf untouched, where fewer than two candidates are near */
bool   cli_trial_hint(const hpl_choice *ch, const cli_trial *t, bool in_plan, char *buf, size_t cap);

/* One forward pass of tokens[0..n) at pos0.. -> the logits of the last token (all: of every token). */
int  cli_engine_eval(cli_engine *e, const int32_t *tokens, int n, int32_t pos0, float *logits, bool all, hr_err *err);
/* HR_ERANGE, with how many, when any of logits[0..n) is NaN or Inf (broken weights): run and chat stop
   on it, eval warns. */
int  cli_engine_check_logits(const float *logits, size_t n, hr_err *err);
int32_t cli_engine_n_ctx(const cli_engine *e);
/* Between requests: a cluster takes workers that left and are back in again (hc_head_rejoin). */
int  cli_engine_rejoin(cli_engine *e, hr_err *err);
void cli_engine_close(cli_engine *e);

/* A text cut as llama-perplexity cuts it: tokenized whole (BOS first where the vocabulary adds one),
   n_chunk = n_tokens / n_ctx non-overlapping chunks of n_ctx tokens, each run from position 0 in
   batches of n_batch with its first token replaced by BOS (where added); a chunk's logits for
   positions first = n_ctx/2 .. n_ctx-2 score the tokens after them. */
typedef struct cli_chunks {
    int32_t *tokens;         /* owned */
    int      n_tokens, n_ctx, n_batch, n_chunk, first;
    int32_t  bos;            /* -1: none put in front of chunks */
    int32_t *buf;            /* [n_ctx] one chunk's input */
    float   *all;            /* [n_batch][n_vocab] one batch's logits */
} cli_chunks;
/* Tokenizes text (e->voc) and sets up the chunks: n_chunk limited to max_chunks when > 0. */
int  cli_chunks_init(cli_chunks *ck, const cli_engine *e, const char *text, size_t len, int n_ctx, int n_batch,
                     int max_chunks, hr_err *err);
/* As cli_chunks_init for tokens already cut (a KL-divergence base file's) */
int  cli_chunks_from_tokens(cli_chunks *ck, const cli_engine *e, const int32_t *tokens, int n_chunk, int n_ctx,
                            int n_batch, hr_err *err);
/* Runs chunk i; logits NULL: no output head (calibration), else [n_ctx-1-first][n_vocab] out. */
int  cli_chunk_eval(cli_engine *e, cli_chunks *ck, int i, float *logits, hr_err *err);
void cli_chunks_free(cli_chunks *ck);

/* Unit groups (cmd-calibrate.c): e->groups for the model's tensor-parallel groups (hc_plan_make's
   sizes); call between cli_engine_open and cli_engine_start. */
int  cli_groups_open(cli_engine *e, hr_err *err);
/* Runs every chunk of ck (no output head) with statistics on and fills imp (allocated here) with each
   group's mean contribution norm. */
int  cli_importance_measure(cli_engine *e, cli_chunks *ck, hpl_importance *imp, hr_err *err);

#endif
