/* cli/engine: a model set up from the flags, on this device or on a cluster */
#include "engine.h"

#include <math.h>
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

int cli_engine_start(cli_engine *e, cli_opts *o, const hm_ctx_params *cp, bool managed, hc_progress_fn progress,
                     hr_err *err) {
    if (o->head.n_workers) {
        /* the head makes its own residency manager, for its shard */
        o->head.model_path = o->model;
        o->head.mem = o->mem;
        o->head.cache_dir = o->cache_dir;
        o->head.use_mmap = o->use_mmap;
        o->head.no_repack = o->no_repack;
        o->head.progress = progress;
        return (e->tp = hc_head_create(e->m, &o->head, cp, err)) ? 0 : err->code;
    }
    hm_shard sh = hm_shard_full(e->m);
    uint64_t ctx_bytes = hm_ctx_bytes_estimate(&e->m->hp, cp);
    if (managed ? hmem_setup(e->m, &sh, o->model, &o->mem, ctx_bytes, &e->mm, err) : hmem_check_ctx(ctx_bytes, err))
        return err->code;
    if (hmem_load_weights(e->mm, e->m, &sh, o->use_mmap, o->no_repack, err)) return err->code;
    if ((e->c = hm_ctx_create(e->m, &sh, cp, err))) return 0;
    if (err->code != HR_EUNSUPPORTED || cp->n_seq <= 1) return err->code;
    /* TODO(issue 27): gone once hm_ctx holds several sequences (the batch branch) */
    HR_LOGI("%s: one context per sequence instead", err->msg);
    hm_ctx_params one = *cp;
    one.n_seq = 1;
    if (!(e->pool = hr_pool_create(cp->n_threads > 0 ? cp->n_threads : hr_physical_cores(), err))) return err->code;
    one.pool = e->pool;
    if (!(e->seq_ctx = calloc((size_t)cp->n_seq, sizeof *e->seq_ctx))) return hr_fail(err, HR_ENOMEM, "out of memory");
    while (e->n_seq_ctx < cp->n_seq) {
        if (!(e->seq_ctx[e->n_seq_ctx] = hm_ctx_create(e->m, &sh, &one, err))) return err->code;
        e->c = e->seq_ctx[0];  /* closed as c */
        e->n_seq_ctx++;
    }
    return 0;
}

int cli_engine_eval(cli_engine *e, const int32_t *tokens, int n, int32_t pos0, float *logits, bool all, hr_err *err) {
    if (e->tp) return hc_head_eval(e->tp, tokens, n, pos0, logits, all, err);
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

int32_t cli_engine_n_ctx(const cli_engine *e) { return e->tp ? hc_head_n_ctx(e->tp) : hm_ctx_n_ctx(e->c); }

void cli_engine_close(cli_engine *e) {
    for (int i = 1; i < e->n_seq_ctx; i++) hm_ctx_free(e->seq_ctx[i]);
    free(e->seq_ctx);
    hm_ctx_free(e->c);
    hr_pool_free(e->pool);
    hmem_free(e->mm);
    hc_head_free(e->tp);
    ht_vocab_free(e->voc);
    hm_model_free(e->m);
    gguf_close(e->g);
    *e = (cli_engine){0};
}
