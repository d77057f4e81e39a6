/* hearth run: generate text from a prompt on one device, streaming it to stdout */
#include "cli.h"

#include "gguf/gguf.h"
#include "model/model.h"
#include "quant/quant.h"
#include "text/text.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: hearth run -m MODEL -p PROMPT [options]\n\n"
            "Generates text after PROMPT and streams it to stdout (the prompt is echoed first).\n"
            "Logs and speed figures go to stderr.\n\n"
            "options:\n"
            "  -m, --model FILE        GGUF model (required)\n"
            "  -p, --prompt TEXT       prompt text\n"
            "  -f, --file FILE         read the prompt from FILE\n"
            "  -n, --n-predict N       tokens to generate (default 256; -1 = until end of text or context)\n"
            "  -t, --threads N         threads (default: physical cores = %d)\n"
            "  -c, --ctx-size N        context length (default: the model's, at most 4096)\n"
            "  -b, --batch-size N      prompt tokens per forward pass (default 512)\n"
            "  --temp X                temperature (default 0.8; 0 = greedy)\n"
            "  --top-k N               top-k sampling (default 40; 0 = off)\n"
            "  --top-p X               top-p sampling (default 0.95; 1 = off)\n"
            "  --min-p X               min-p sampling (default 0.05; 0 = off)\n"
            "  --repeat-penalty X      repetition penalty (default 1.0 = off)\n"
            "  --repeat-last-n N       tokens the penalty looks back over (default 64)\n"
            "  -s, --seed N            sampling seed (default: random)\n"
            "  --ignore-eos            keep generating after end-of-text\n"
            "  --no-bos                do not add the BOS token\n"
            "  --kv-type f16|f32       KV cache element type (default f16)\n"
            "  --no-echo               do not echo the prompt\n"
            "  --no-display-prompt     same as --no-echo (llama.cpp spelling)\n"
            "  -h, --help              this help\n",
            hr_physical_cores());
}

static char *read_file(const char *path, hr_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) { hr_fail(err, HR_EIO, "cannot open '%s': %s", path, strerror(errno)); return NULL; }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) { free(buf); buf = NULL; }
            buf = nb;
        }
    }
    fclose(f);
    if (!buf) { hr_fail(err, HR_ENOMEM, "out of memory reading '%s'", path); return NULL; }
    buf[n] = 0;
    return buf;
}

int cmd_run(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *pfile = NULL, *v;
    long n_predict = 256, threads = 0, n_ctx = 0, n_batch = 512, top_k = 40, rep_n = 64;
    double temp = 0.8, top_p = 0.95, min_p = 0.05, rep = 1.0;
    uint64_t seed = UINT64_MAX;
    bool ignore_eos = false, no_bos = false, echo = true;
    int kv_type = HQ_TYPE_F16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
#define VAL() if (!(v = cli_value("run", argc, argv, &i))) return 2
#define INT(var, lo, hi) do { VAL(); if (!cli_parse_int("run", a, v, lo, hi, &var)) return 2; } while (0)
#define FLT(var, lo, hi) do { VAL(); if (!cli_parse_float("run", a, v, lo, hi, &var)) return 2; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { VAL(); model = v; }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { VAL(); prompt = v; }
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) { VAL(); pfile = v; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) INT(n_predict, -1, 1 << 24);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) INT(threads, 1, 1024);
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) INT(n_ctx, 0, 1 << 24);
        else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) INT(n_batch, 1, 1 << 16);
        else if (!strcmp(a, "--temp")) FLT(temp, 0, 100);
        else if (!strcmp(a, "--top-k")) INT(top_k, 0, 1 << 24);
        else if (!strcmp(a, "--top-p")) FLT(top_p, 0, 1);
        else if (!strcmp(a, "--min-p")) FLT(min_p, 0, 1);
        else if (!strcmp(a, "--repeat-penalty")) FLT(rep, 0, 100);
        else if (!strcmp(a, "--repeat-last-n")) INT(rep_n, 0, 1 << 24);
        else if (!strcmp(a, "-s") || !strcmp(a, "--seed")) {
            long long s;
            VAL();
            char *end;
            errno = 0;
            s = strtoll(v, &end, 10);
            if (errno || *end || end == v || s < -1) { fprintf(stderr, "hearth run: invalid seed '%s'\n", v); return 2; }
            seed = s < 0 ? UINT64_MAX : (uint64_t)s;
        } else if (!strcmp(a, "--ignore-eos")) ignore_eos = true;
        else if (!strcmp(a, "--no-bos")) no_bos = true;
        else if (!strcmp(a, "--no-echo") || !strcmp(a, "--no-display-prompt")) echo = false;
        else if (!strcmp(a, "--kv-type")) {
            VAL();
            if (!strcmp(v, "f16")) kv_type = HQ_TYPE_F16;
            else if (!strcmp(v, "f32")) kv_type = HQ_TYPE_F32;
            else { fprintf(stderr, "hearth run: --kv-type must be f16 or f32\n"); return 2; }
        } else { fprintf(stderr, "hearth run: unknown option '%s'\n", a); usage(stderr); return 2; }
#undef VAL
#undef INT
#undef FLT
    }
    if (!model) { fprintf(stderr, "hearth run: -m MODEL is required\n"); usage(stderr); return 2; }
    if (prompt && pfile) { fprintf(stderr, "hearth run: give -p or -f, not both\n"); return 2; }

    int rc = 1;
    hr_err err = {0};
    char *ptext = NULL;
    gguf_ctx *g = NULL;
    hm_model *m = NULL;
    ht_vocab *voc = NULL;
    hm_ctx *c = NULL;
    ht_sampler *smp = NULL;
    int32_t *toks = NULL;
    float *logits = NULL;
    if (pfile && !(ptext = read_file(pfile, &err))) goto done;
    if (!pfile) ptext = strdup(prompt ? prompt : "");
    if (!ptext) { hr_fail(&err, HR_ENOMEM, "out of memory"); goto done; }
    if (!(g = gguf_open(model, &err)) || !(m = hm_model_load(g, &err)) || !(voc = ht_vocab_load(g, &err))) goto done;
    if (ht_vocab_size(voc) > m->hp.n_vocab) {
        hr_fail(&err, HR_EFORMAT, "vocabulary has %d tokens but the model's embedding has %d rows", ht_vocab_size(voc),
                m->hp.n_vocab);
        goto done;
    }
    size_t plen = strlen(ptext);
    int cap = (int)HR_MIN(plen + 8, (size_t)1 << 24);
    toks = malloc((size_t)cap * sizeof *toks);
    if (!toks) { hr_fail(&err, HR_ENOMEM, "out of memory"); goto done; }
    int n_prompt = ht_tokenize(voc, ptext, plen, ht_add_bos(voc) && !no_bos, toks, cap);
    if (n_prompt < 0) { hr_fail(&err, n_prompt, "tokenization failed: %s", hr_strerror(n_prompt)); goto done; }
    if (n_prompt > cap) { hr_fail(&err, HR_ERANGE, "prompt too long (%d tokens)", n_prompt); goto done; }
    if (n_prompt == 0) { hr_fail(&err, HR_EINVAL, "empty prompt and the model has no BOS token"); goto done; }

    hm_ctx_params cp = hm_ctx_default_params();
    cp.n_ctx = (int32_t)n_ctx;
    cp.n_batch = (int32_t)n_batch;
    cp.n_threads = (int32_t)threads;
    cp.kv_type = kv_type;
    hm_shard sh = hm_shard_full(m);
    if (!(c = hm_ctx_create(m, &sh, &cp, &err))) goto done;
    int32_t ctx_len = hm_ctx_n_ctx(c);
    if (n_prompt >= ctx_len) {
        hr_fail(&err, HR_ERANGE, "prompt of %d tokens does not fit the context of %d (use -c)", n_prompt, ctx_len);
        goto done;
    }
    ht_sampler_params sp = ht_sampler_default_params();
    sp.temp = (float)temp;
    sp.top_k = (int32_t)top_k;
    sp.top_p = (float)top_p;
    sp.min_p = (float)min_p;
    sp.repeat_penalty = (float)rep;
    sp.repeat_last_n = (int32_t)rep_n;
    sp.seed = seed;
    if (!(smp = ht_sampler_create(&sp, m->hp.n_vocab))) { hr_fail(&err, HR_ENOMEM, "out of memory"); goto done; }
    logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
    if (!logits) { hr_fail(&err, HR_ENOMEM, "out of memory"); goto done; }
    HR_LOGI("hearth run: %s, %d layers, %d threads (%s kernels), prompt %d tokens, context %d",
            m->hp.arch_name, m->hp.n_layer, (int)(threads ? threads : hr_physical_cores()), hq_simd_name(), n_prompt,
            ctx_len);

    if (echo) { fwrite(ptext, 1, plen, stdout); fflush(stdout); }
    for (int i = 0; i < n_prompt; i++) ht_sampler_accept(smp, toks[i]);
    /* prompt, in batches */
    int64_t t0 = hr_time_ns();
    for (int i = 0; i < n_prompt; i += (int)n_batch) {
        int nb = HR_MIN((int)n_batch, n_prompt - i);
        if (hm_eval(c, toks + i, NULL, nb, i, logits, false, NULL, &err)) goto done;
    }
    int64_t t1 = hr_time_ns();
    /* generation */
    ht_detok dt;
    ht_detok_init(&dt, voc);
    char buf[256];
    int n_gen = 0;
    int32_t pos = n_prompt;
    int64_t limit = n_predict < 0 ? ctx_len - n_prompt : HR_MIN(n_predict, (long)(ctx_len - n_prompt));
    while (n_gen < limit) {
        int32_t tok = ht_sampler_sample(smp, logits);
        ht_sampler_accept(smp, tok);
        n_gen++;
        if (!ignore_eos && ht_is_eog(voc, tok)) break;
        int nb = ht_detok_push(&dt, tok, buf, sizeof buf);
        if (nb > 0) { fwrite(buf, 1, (size_t)nb, stdout); fflush(stdout); }
        if (n_gen >= limit) break;
        if (hm_eval(c, &tok, NULL, 1, pos++, logits, false, NULL, &err)) goto done;
    }
    int nb = ht_detok_flush(&dt, buf, sizeof buf);
    if (nb > 0) fwrite(buf, 1, (size_t)nb, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    int64_t t2 = hr_time_ns();
    double pp_s = (t1 - t0) * 1e-9, tg_s = (t2 - t1) * 1e-9;
    /* the last sampled token was not evaluated when generation stopped on the limit */
    fprintf(stderr, "\nprompt:     %5d tokens in %8.2f ms (%8.2f tok/s)\n", n_prompt, pp_s * 1e3,
            pp_s > 0 ? n_prompt / pp_s : 0.0);
    fprintf(stderr, "generation: %5d tokens in %8.2f ms (%8.2f tok/s)\n", n_gen, tg_s * 1e3,
            tg_s > 0 ? n_gen / tg_s : 0.0);
    rc = 0;
done:
    if (rc) fprintf(stderr, "hearth run: %s\n", err.msg[0] ? err.msg : "failed");
    free(logits);
    free(toks);
    free(ptext);
    ht_sampler_free(smp);
    hm_ctx_free(c);
    ht_vocab_free(voc);
    hm_model_free(m);
    gguf_close(g);
    return rc;
}
