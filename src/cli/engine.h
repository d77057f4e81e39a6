/* cli/engine: what the commands that run a model share — the file, the model and its vocabulary,
   the residency manager, and either a context on this device or the head of a cluster — set up from
   the flags (cli_opts) in one place, and one forward-pass call for both. */
#ifndef HEARTH_CLI_ENGINE_H
#define HEARTH_CLI_ENGINE_H

#include "flags.h"
#include "gguf/gguf.h"

typedef struct cli_engine {
    gguf_ctx *g;
    hm_model *m;
    ht_vocab *voc;    /* NULL unless asked for */
    hmem     *mm;     /* this device's residency manager, or NULL */
    hm_ctx   *c;      /* one device */
    hm_ctx  **seq_ctx;/* serve, while a context holds one sequence: one context per sequence (seq_ctx[0] = c) */
    int       n_seq_ctx;
    hr_pool  *pool;   /* the threads the seq_ctx share */
    hc_head  *tp;     /* or the head of a cluster (--workers) */
} cli_engine;

/* Maps o->model and loads its hyper-parameters (and its vocabulary when `vocab`, checked against the
   embedding's rows). */
int  cli_engine_open(cli_engine *e, const cli_opts *o, bool vocab, hr_err *err);
/* The residency manager (managed: from o->mem; else none, the weights loaded if they fit), the weights,
   and the context for cp — or, with --workers, the cluster's head (o->head; progress may be NULL). */
int  cli_engine_start(cli_engine *e, cli_opts *o, const hm_ctx_params *cp, bool managed, hc_progress_fn progress,
                      hr_err *err);
/* With cp->n_seq > 1 (serve): one context of n_seq sequences, or, while the engine refuses that
   (HR_EUNSUPPORTED), n_seq contexts of one sequence each in seq_ctx, sharing one thread pool. */
/* One forward pass of tokens[0..n) at pos0.. -> the logits of the last token (all: of every token). */
int  cli_engine_eval(cli_engine *e, const int32_t *tokens, int n, int32_t pos0, float *logits, bool all, hr_err *err);
/* HR_ERANGE, with how many, when any of logits[0..n) is NaN or Inf (broken weights): run and chat stop
   on it, eval warns. */
int  cli_engine_check_logits(const float *logits, size_t n, hr_err *err);
int32_t cli_engine_n_ctx(const cli_engine *e);
void cli_engine_close(cli_engine *e);

#endif
