/* hearth calibrate: how much each tensor-parallel unit group contributes to its block's output over a
   text, written as an importance file for loss-aware placement (docs/lossy.md) */
#include "cli.h"

#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

enum { CALIBRATE_MAX_BYTES = 64 << 20 };

int cli_groups_open(cli_engine *e, hr_err *err) {
    hc_plan one;
    const double w = 1;
    if (hc_plan_make(e->m, &w, 1, &one, err)) return err->code;
    return (e->groups = hm_groups_create(e->m, one.att_group, one.ff_group, err)) ? 0 : err->code;
}

int cli_importance_measure(cli_engine *e, cli_chunks *ck, hpl_importance *imp, hr_err *err) {
    hm_groups *g = e->groups;
    const hm_hparams *hp = &e->m->hp;
    hc_plan one;
    const double w = 1;
    if (hc_plan_make(e->m, &w, 1, &one, err)) return err->code;
    *imp = (hpl_importance){.n_layer = hp->n_layer, .n_embd = hp->n_embd, .att_kv = one.att_group,
                            .ff = one.ff_group, .n_groups = {hm_groups_count(g, HM_BLOCK_ATTN),
                                                              hm_groups_count(g, HM_BLOCK_FFN)}};
    snprintf(imp->model, sizeof imp->model, "%s", hp->name);
    if (hpl_importance_alloc(imp, err)) return err->code;
    hm_groups_stats(g, true);
    for (int i = 0; i < ck->n_chunk; i++) {
        if (cli_chunk_eval(e, ck, i, NULL, err)) {
            hm_groups_stats(g, false);
            return err->code;
        }
        cli_progress("calibrate", (uint64_t)i + 1, (uint64_t)ck->n_chunk);
    }
    cli_progress_end();
    imp->tokens = hm_groups_tokens(g);
    for (int il = 0; il < hp->n_layer; il++)
        for (int b = 0; b < 2; b++)
            hm_groups_mean_norms(g, il, b ? HM_BLOCK_FFN : HM_BLOCK_ATTN, imp->imp[b] + (size_t)il * imp->n_groups[b]);
    hm_groups_stats(g, false);
    return 0;
}

static int calibrate(cli_opts *o) {
    hr_err err = {0};
    cli_engine e = {0};
    cli_chunks ck = {0};
    hpl_importance imp = {0};
    size_t len = 0;
    char *text = cli_read_text(o->file, CALIBRATE_MAX_BYTES, &len, &err);
    hm_ctx_params cp = cli_ctx_params(o);
    int rc = !text || cli_engine_open(&e, o, true, &err) || cli_groups_open(&e, &err);
    if (!rc) {
        /* a text shorter than a chunk is one chunk of what it has */
        rc = cli_chunks_init(&ck, &e, text, len, (int)o->n_ctx, (int)o->n_batch, (int)o->n_chunks, &err);
        if (!rc && ck.n_chunk == 0 && ck.n_tokens > 0) {
            const int n = ck.n_tokens;
            cli_chunks_free(&ck);
            rc = cli_chunks_init(&ck, &e, text, len, n, (int)o->n_batch, 1, &err);
        }
        if (!rc && ck.n_chunk == 0) rc = hr_fail(&err, HR_EINVAL, "the text has no tokens");
    }
    if (!rc) {
        cp.n_ctx = ck.n_ctx;
        cp.n_batch = ck.n_batch;
        rc = cli_engine_start(&e, o, &cp, false, NULL, &err);
    }
    if (!rc) rc = cli_importance_measure(&e, &ck, &imp, &err);
    if (!rc) rc = hpl_importance_write(&imp, o->output, &err);
    if (!rc)
        fprintf(stderr, "hearth calibrate: %llu tokens, %d layers x (%d attention + %d FFN groups) -> %s\n",
                (unsigned long long)imp.tokens, imp.n_layer, imp.n_groups[0], imp.n_groups[1], o->output);
    else fprintf(stderr, "hearth calibrate: %s\n", err.msg[0] ? err.msg : "failed");
    hpl_importance_free(&imp);
    cli_chunks_free(&ck);
    cli_engine_close(&e);
    free(text);
    return rc ? 1 : 0;
}

static void calibrate_defaults(cli_opts *o) {
    o->n_ctx = 512;
    o->n_batch = 0;
}

static int calibrate_check(const cli_command *c, cli_opts *o) {
    if (!o->model || !o->file || !o->output) return cli_usage_error(c, "-m, -f and -o are required");
    if (cli_output_taken("calibrate", o->output, o->force)) return 1;
    return 0;
}

const cli_command cli_calibrate = {
    "calibrate", CLI_CALIBRATE, "measure the importance of each tensor-parallel unit group over a text",
    "-m MODEL -f TEXT -o IMPORTANCE.json [options]",
    "Runs the text through the model in chunks of -c tokens and measures, for every layer, the mean\n"
    "L2 norm of each unit group's contribution to its block's output (attention: groups of KV heads\n"
    "with their query heads; FFN: groups of neurons in whole quant blocks — the units tensor\n"
    "parallelism deals out). Loss-aware placement gives the lossiest links the least important\n"
    "groups (hearth perplexity --sim-placement importance; docs/lossy.md has the file's format).",
    .defaults = calibrate_defaults, .check = calibrate_check, .run = calibrate};
