/* hearth eval: logits of a token sequence, in the format of ../shared/reference */
#include "cli.h"

#include "gguf/gguf.h"
#include "mem/mem.h"
#include "model/model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: hearth eval -m MODEL --tokens ID,ID,... --logits OUT.f32 [options]\n\n"
            "Feeds the token ids at positions 0..n-1 in one batch and writes the logits of every\n"
            "position as little-endian float32 [n_tokens][n_vocab].\n\n"
            "options:\n"
            "  -m, --model FILE     GGUF model (required)\n"
            "  --tokens LIST        comma-separated token ids (required)\n"
            "  --logits FILE        output file (required; not overwritten unless --force)\n"
            "  --force              overwrite an existing output file\n"
            "  -t, --threads N      threads (default: physical cores)\n"
            "  --kv-type f16|f32    KV cache element type (default f16)\n"
            "%s"
            "  -h, --help           this help\n", cli_weights_help);
}

int cmd_eval(int argc, char **argv) {
    const char *model = NULL, *toks = NULL, *out = NULL, *v;
    bool force = false;
    long threads = 0;
    int kv_type = 1; /* HQ_TYPE_F16 */
    cli_weights wf = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { if (!(model = cli_value("eval", argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--tokens")) { if (!(toks = cli_value("eval", argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--logits")) { if (!(out = cli_value("eval", argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--force")) force = true;
        else if (cli_weights_flag(&wf, argv, i)) continue;
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!(v = cli_value("eval", argc, argv, &i)) || !cli_parse_int("eval", a, v, 1, 1024, &threads)) return 2;
        } else if (!strcmp(a, "--kv-type")) {
            if (!(v = cli_value("eval", argc, argv, &i))) return 2;
            if (!strcmp(v, "f16")) kv_type = 1;
            else if (!strcmp(v, "f32")) kv_type = 0;
            else { fprintf(stderr, "hearth eval: --kv-type must be f16 or f32\n"); return 2; }
        } else { fprintf(stderr, "hearth eval: unknown option '%s'\n", a); usage(stderr); return 2; }
    }
    if (!model || !toks || !out) {
        fprintf(stderr, "hearth eval: -m, --tokens and --logits are required\n");
        usage(stderr);
        return 2;
    }
    /* parse ids */
    size_t cap = 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    const char *p = toks;
    while (ids && *p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "hearth eval: --tokens: '%s' is not a comma-separated list of ids\n", toks);
            free(ids);
            return 2;
        }
        if (n == cap) {
            int32_t *nid = realloc(ids, (cap *= 2) * sizeof *ids);
            if (!nid) { free(ids); ids = NULL; break; }
            ids = nid;
        }
        ids[n++] = (int32_t)x;
        p = *end ? end + 1 : end;
    }
    if (!ids || n == 0) { fprintf(stderr, "hearth eval: no token ids given\n"); free(ids); return 2; }
    struct stat st;
    if (!force && stat(out, &st) == 0) {
        fprintf(stderr, "hearth eval: '%s' exists; pass --force to overwrite it\n", out);
        free(ids);
        return 1;
    }
    int rc = 1;
    hr_err err = {0};
    gguf_ctx *g = NULL;
    hm_model *m = NULL;
    hm_ctx *c = NULL;
    float *logits = NULL;
    FILE *f = NULL;
    if (!(g = gguf_open(model, &err)) || !(m = hm_model_load(g, &err))) goto done;
    hm_ctx_params cp = hm_ctx_default_params();
    cp.n_ctx = (int32_t)n;
    cp.n_batch = (int32_t)n;
    cp.n_threads = (int32_t)threads;
    cp.kv_type = kv_type;
    hm_shard sh = hm_shard_full(m);
    if (hmem_check_ctx(hm_ctx_bytes_estimate(&m->hp, &cp), &err)) goto done;
    if (hmem_load_weights(NULL, m, &sh, wf.use_mmap, wf.no_repack, &err)) goto done;
    if (!(c = hm_ctx_create(m, &sh, &cp, &err))) goto done;
    logits = malloc(n * (size_t)m->hp.n_vocab * sizeof(float));
    if (!logits) { hr_fail(&err, HR_ENOMEM, "out of memory for logits"); goto done; }
    if (hm_eval(c, &(hm_batch){.tokens = ids, .n = (int32_t)n, .logits = logits, .all_logits = true}, &err)) goto done;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    if (!(f = fopen(tmp, "wb"))) { hr_fail(&err, HR_EIO, "cannot create '%s': %s", tmp, strerror(errno)); goto done; }
    /* the file format is little-endian; this build is for little-endian hosts (checked in base) */
    size_t cnt = n * (size_t)m->hp.n_vocab;
    if (fwrite(logits, sizeof(float), cnt, f) != cnt || fclose(f) != 0) {
        f = NULL;
        remove(tmp);
        hr_fail(&err, HR_EIO, "cannot write '%s': %s", tmp, strerror(errno));
        goto done;
    }
    f = NULL;
    if (rename(tmp, out) != 0) { hr_fail(&err, HR_EIO, "cannot rename to '%s': %s", out, strerror(errno)); goto done; }
    fprintf(stderr, "hearth eval: wrote %zu x %d logits to %s\n", n, m->hp.n_vocab, out);
    rc = 0;
done:
    if (rc) fprintf(stderr, "hearth eval: %s\n", err.msg[0] ? err.msg : "failed");
    if (f) fclose(f);
    free(logits);
    free(ids);
    hm_ctx_free(c);
    hm_model_free(m);
    gguf_close(g);
    return rc;
}
