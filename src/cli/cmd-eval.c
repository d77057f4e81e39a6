/* hearth eval: logits of a token sequence, in the format of llama.cpp's reference logits */
#include "cli.h"

#include "engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

/* n rows of logits to path (a regular file through a temporary one renamed over it; see hr_outfile) */
static int write_logits(const char *path, const float *logits, size_t cnt, hr_err *err) {
    hr_outfile out;
    int rc = hr_outfile_open(&out, path, err);
    if (rc) return rc;
    /* the file format is little-endian; this build is for little-endian hosts (checked in base) */
    if (fwrite(logits, sizeof(float), cnt, out.f) != cnt) {
        hr_fail(err, HR_EIO, "cannot write '%s': %s", hr_outfile_name(&out), strerror(errno));
        hr_outfile_abort(&out);
        return HR_EIO;
    }
    return hr_outfile_commit(&out, err);
}

static int eval(cli_opts *o) {
    hr_err err = {0};
    cli_engine e = {0};
    float *logits = NULL;
    size_t n = (size_t)o->n_tokens;
    hm_ctx_params cp = cli_ctx_params(o);
    cp.n_ctx = cp.n_batch = (int32_t)n;
    int rc = cli_engine_open(&e, o, false, &err) || cli_engine_start(&e, o, &cp, false, NULL, &err);
    if (!rc && !(logits = malloc(n * (size_t)e.m->hp.n_vocab * sizeof(float))))
        rc = hr_fail(&err, HR_ENOMEM, "out of memory for logits");
    if (!rc) rc = cli_engine_eval(&e, o->tokens, (int)n, 0, logits, true, &err);
    hr_err warn = {0};
    if (!rc && cli_engine_check_logits(logits, n * (size_t)e.m->hp.n_vocab, &warn))
        fprintf(stderr, "hearth eval: warning: %s\n", warn.msg);
    if (!rc) rc = write_logits(o->logits_out, logits, n * (size_t)e.m->hp.n_vocab, &err);
    if (!rc) fprintf(stderr, "hearth eval: wrote %zu x %d logits to %s\n", n, e.m->hp.n_vocab, o->logits_out);
    else fprintf(stderr, "hearth eval: %s\n", err.msg[0] ? err.msg : "failed");
    free(logits);
    cli_engine_close(&e);
    return rc ? 1 : 0;
}

static int eval_check(const cli_command *c, cli_opts *o) {
    if (!o->model || !o->n_tokens || !o->logits_out)
        return cli_usage_error(c, "-m, --tokens and --logits are required (see hearth eval --help)");
    if (cli_output_taken("eval", o->logits_out, o->force)) return 1;
    return 0;
}

const cli_command cli_eval = {
    "eval", CLI_EVAL, "write the logits of a token sequence (for comparison with references)",
    "-m MODEL --tokens ID,ID,... --logits OUT.f32 [options]",
    "Feeds the token ids at positions 0..n-1 in one batch and writes the logits of every\n"
    "position as little-endian float32 [n_tokens][n_vocab].",
    .check = eval_check, .run = eval};
