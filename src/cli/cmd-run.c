/* hearth run: generate text from a prompt on one device, streaming it to stdout */
#include "cli.h"

#include "gguf/gguf.h"
#include "mem/mem.h"
#include "run-stats.h"
#include "model/model.h"
#include "quant/quant.h"
#include "text/chat.h"
#include "text/text.h"
#include "cluster/cluster.h"

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
            "%s"
            "  --ignore-eos            keep generating after end-of-text\n"
            "  --no-bos                do not add the BOS token\n"
            "  --kv-type f16|f32       KV cache element type (default f16)\n"
            "  --mem-budget SIZE       memory for weights + KV cache + scratch (300M, 1.5G; default auto = 80%% of\n"
            "                          MemAvailable or the cgroup limit; off = plain mmap); streams the weights if over\n"
            "  --window W              blocks of weights kept loading ahead when streaming (default 2)\n"
            "  --no-prefetch           when streaming, load a block only when compute reaches it\n"
            "%s"
            "  --stats-json FILE       write per-device figures to FILE as JSON: per token, resident weight\n"
            "                          bytes, disk bytes read and time blocked on weights; totals, memory\n"
            "                          pressure (with --workers: one round trip per worker per token)\n"
            "  --no-echo               do not echo the prompt\n"
            "  --no-display-prompt     same as --no-echo (llama.cpp spelling)\n"
            "  --stop STR              stop when the output would contain STR (repeatable; STR is not printed)\n"
            "  --chat                  a single chat turn: PROMPT is the user's message, put in the model's chat\n"
            "                          template (see `hearth chat --help`); the prompt is not echoed\n"
            "  -sys, --system TEXT     system prompt for --chat (implies --chat)\n"
            "  --chat-template NAME    template for --chat instead of the model's (implies --chat)\n"
            "  -h, --help              this help\n",
            hr_physical_cores(), cli_sampling_help, cli_weights_help);
    fputs(hc_head_flags_help(), f);
}

/* one forward pass on this device, or on the cluster when --workers was given; then, with
   --stats-json, one sample of every device's figures (its time is added to *stats_ns, which the
   speed figures leave out) */
static int eval_step(hm_ctx *c, hc_head *tp, hmem *mm, run_stats *rs, const int32_t *t, int n, int32_t pos,
                     float *logits, int64_t *stats_ns, hr_err *err) {
    int rc = tp ? hc_head_eval(tp, t, n, pos, logits, false, err)
                : hm_eval(c, &(hm_batch){.tokens = t, .n = n, .pos = pos, .logits = logits}, err);
    if (rc || !rs) return rc;
    int64_t t0 = hr_time_ns();
    rc = run_stats_sample(rs, mm, tp, n, err);
    *stats_ns += hr_time_ns() - t0;
    return rc;
}

/* weight transfer to the workers: a progress bar on a TTY */
static void tp_progress(void *user, uint64_t done, uint64_t total) {
    (void)user;
    cli_progress("weights", done, total);
    if (done >= total) cli_progress_end();
}

/* --timings: per-device figures of the passes since the last call */
static void tp_timings(hc_head *tp, run_stats *rs, const char *what) {
    hc_dev_stats st[HC_MAX_DEVICES];
    static char buf[16384];
    hr_err e = {0};
    /* with --stats-json the devices' counters are read after every pass and summed there */
    int n = rs ? run_stats_phase(rs, st, HC_MAX_DEVICES) : hc_head_stats(tp, st, HC_MAX_DEVICES, &e);
    if (n < 0) { fprintf(stderr, "hearth run: timings: %s\n", e.msg); return; }
    hc_format_stats(st, n, buf, sizeof buf);
    fprintf(stderr, "\n%s:\n%s", what, buf);
}

/* appends s[0..n) to the growing buffer *b (*len used of *cap bytes); false if out of memory */
static bool append(char **b, size_t *len, size_t *cap, const char *s, int n) {
    if (n <= 0) return true;
    if (*len + (size_t)n > *cap) {
        size_t nc = 2 * *cap + (size_t)n;
        char *nb = realloc(*b, nc);
        if (!nb) return false;
        *b = nb;
        *cap = nc;
    }
    memcpy(*b + *len, s, (size_t)n);
    *len += (size_t)n;
    return true;
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
    long n_predict = 256, threads = 0, n_ctx = 0, n_batch = 512;
    ht_sampler_params sp = ht_sampler_default_params();
    int sr;
    bool ignore_eos = false, no_bos = false, echo = true, chat = false;
    const char *system = NULL, *tmpl_name = NULL;
    int kv_type = HQ_TYPE_F16;
    const char *mem_budget = NULL; /* residency manager (src/mem) */
    long window = 2;
    bool no_prefetch = false;
    cli_weights wf = {0};
    const char *stats_json = NULL;  /* per-device figures (run-stats.c) */
    /* user stop strings, and room for the chat template's end-of-turn text */
    const char **stops = calloc((size_t)argc + 1, sizeof *stops);
    int n_stops = 0;
    if (!stops) { fprintf(stderr, "hearth run: out of memory\n"); return 1; }
    hc_head_params tpp = hc_head_default_params();  /* tensor parallelism (--workers) */
    tpp.progress = tp_progress;
    hr_err tperr = {0};
    int tpr;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
#define VAL() if (!(v = cli_value("run", argc, argv, &i))) goto usage_err
#define INT(var, lo, hi) do { VAL(); if (!cli_parse_int("run", a, v, lo, hi, &var)) goto usage_err; } while (0)
#define FLT(var, lo, hi) do { VAL(); if (!cli_parse_float("run", a, v, lo, hi, &var)) goto usage_err; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); free(stops); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { VAL(); model = v; }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { VAL(); prompt = v; }
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) { VAL(); pfile = v; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) INT(n_predict, -1, 1 << 24);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) INT(threads, 1, 1024);
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) INT(n_ctx, 0, 1 << 24);
        else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) INT(n_batch, 1, 1 << 16);
        else if ((sr = cli_sampling_flag("run", &sp, argc, argv, &i)) != 0) {
            if (sr < 0) goto usage_err;
} else if (!strcmp(a, "--ignore-eos")) ignore_eos = true;
        else if (!strcmp(a, "--no-bos")) no_bos = true;
        else if (!strcmp(a, "--no-echo") || !strcmp(a, "--no-display-prompt")) echo = false;
        else if (!strcmp(a, "--stop")) { VAL(); stops[n_stops++] = v; }
        else if (!strcmp(a, "--chat")) chat = true;
        else if (!strcmp(a, "--mem-budget")) { VAL(); mem_budget = v; }
        else if (!strcmp(a, "--window")) INT(window, 1, 1 << 20);
        else if (!strcmp(a, "--no-prefetch")) no_prefetch = true;
        else if (cli_weights_flag(&wf, argv, i)) continue;
        else if (!strcmp(a, "--stats-json")) { VAL(); stats_json = v; }
        else if (!strcmp(a, "-sys") || !strcmp(a, "--system") || !strcmp(a, "--system-prompt")) { VAL(); system = v; chat = true; }
        else if (!strcmp(a, "--chat-template")) { VAL(); tmpl_name = v; chat = true; }
        else if ((tpr = hc_head_parse_flag(&tpp, argc, argv, &i, &tperr)) != 0) {
            if (tpr < 0) { fprintf(stderr, "hearth run: %s\n", tperr.msg); goto usage_err; }
        } else if (!strcmp(a, "--kv-type")) {
            VAL();
            if (!strcmp(v, "f16")) kv_type = HQ_TYPE_F16;
            else if (!strcmp(v, "f32")) kv_type = HQ_TYPE_F32;
            else { fprintf(stderr, "hearth run: --kv-type must be f16 or f32\n"); goto usage_err; }
        } else { fprintf(stderr, "hearth run: unknown option '%s'\n", a); usage(stderr); goto usage_err; }
#undef VAL
#undef INT
#undef FLT
    }
    if (!model) { fprintf(stderr, "hearth run: -m MODEL is required\n"); usage(stderr); goto usage_err; }
    if (prompt && pfile) { fprintf(stderr, "hearth run: give -p or -f, not both\n"); goto usage_err; }
    if (!tpp.workers && (tpp.pp || tpp.layer_windows || tpp.shares || tpp.timings)) {
        fprintf(stderr, "hearth run: %s needs --workers\n",
                tpp.pp ? "--pp" : tpp.layer_windows ? "--layer-windows" : tpp.shares ? "--tp-shares" : "--timings");
        goto usage_err;
    }
    if (tmpl_name && ht_chat_from_name(tmpl_name) == HT_CHAT_UNKNOWN) {
        fprintf(stderr, "hearth run: unknown chat template '%s'; known:", tmpl_name);
        for (int t = 0; t < HT_CHAT_COUNT; t++) fprintf(stderr, " %s", ht_chat_name(t));
        fputc('\n', stderr);
        goto usage_err;
    }

    int rc = 1;
    hr_err err = {0};
    char *ptext = NULL;
    gguf_ctx *g = NULL;
    hm_model *m = NULL;
    ht_vocab *voc = NULL;
    hm_ctx *c = NULL;
    hmem *mm = NULL;
    hc_head *tp = NULL;
    run_stats *rs = NULL;
    int64_t stats_ns = 0;
    ht_sampler *smp = NULL;
    int32_t *toks = NULL;
    float *logits = NULL;
    char *ans = NULL, *buf = NULL;  /* the output so far; one token's text */
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
    if (chat) {
        /* the prompt becomes the user's message in the model's template */
        char note[256];
        int tmpl = ht_chat_for_model(g, tmpl_name, note, sizeof note);
        if (note[0]) fprintf(stderr, "hearth run: %s (--chat-template NAME chooses one)\n", note);
        HR_LOGI("hearth run: chat template %s", ht_chat_name(tmpl));
        ht_chat_msg msgs[2] = {{"system", system ? system : ""}, {"user", ptext}};
        size_t tlen;
        char *text = ht_chat_render_alloc(tmpl, system ? msgs : msgs + 1, system ? 2 : 1, true, &tlen);
        if (!text) { hr_fail(&err, HR_ENOMEM, "out of memory"); goto done; }
        HR_LOGD("hearth run: prompt text [%s]", text);
        free(ptext);
        ptext = text;
        plen = tlen;
        echo = false;
        if (ht_chat_end_of_turn(tmpl)[0]) stops[n_stops++] = ht_chat_end_of_turn(tmpl);
    }
    int cap = (int)HR_MIN(plen + 8, (size_t)1 << 24);
    toks = malloc((size_t)cap * sizeof *toks);
    if (!toks) { hr_fail(&err, HR_ENOMEM, "out of memory"); goto done; }
    /* a rendered chat holds special tokens (<|im_start|>, </s>, ...) that must become their ids */
    int n_prompt = chat ? ht_chat_tokenize(voc, ptext, plen, ht_add_bos(voc) && !no_bos, toks, cap)
                        : ht_tokenize(voc, ptext, plen, ht_add_bos(voc) && !no_bos, toks, cap);
    if (n_prompt < 0) { hr_fail(&err, n_prompt, "tokenization failed: %s", hr_strerror(n_prompt)); goto done; }
    if (n_prompt > cap) { hr_fail(&err, HR_ERANGE, "prompt too long (%d tokens)", n_prompt); goto done; }
    if (n_prompt == 0) { hr_fail(&err, HR_EINVAL, "empty prompt and the model has no BOS token"); goto done; }

    hm_ctx_params cp = hm_ctx_default_params();
    cp.n_ctx = (int32_t)n_ctx;
    cp.n_batch = (int32_t)n_batch;
    cp.n_threads = (int32_t)threads;
    cp.kv_type = kv_type;
    hm_shard sh = hm_shard_full(m);
    /* the residency manager: here for one device; the head makes its own for its shard */
    tpp.model_path = model;
    tpp.mem_budget = mem_budget;
    tpp.window = (int)window;
    tpp.no_prefetch = no_prefetch;
    if (!tpp.workers && hmem_setup(m, &sh, model, mem_budget, (int)window, !no_prefetch,
                                      hm_ctx_bytes_estimate(&m->hp, &cp), &mm, &err))
        goto done;
    if (!tpp.workers && hmem_load_weights(mm, m, &sh, wf.use_mmap, wf.no_repack, &err)) goto done;
    if (tpp.workers ? !(tp = hc_head_create(m, &tpp, &cp, &err)) : !(c = hm_ctx_create(m, &sh, &cp, &err))) goto done;
    int32_t ctx_len = tp ? hc_head_n_ctx(tp) : hm_ctx_n_ctx(c);
    if (n_prompt >= ctx_len) {
        hr_fail(&err, HR_ERANGE, "prompt of %d tokens does not fit the context of %d (use -c)", n_prompt, ctx_len);
        goto done;
    }
    if (!(smp = ht_sampler_create(&sp, m->hp.n_vocab))) { hr_fail(&err, HR_ENOMEM, "out of memory"); goto done; }
    logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
    if (!logits) { hr_fail(&err, HR_ENOMEM, "out of memory"); goto done; }
    HR_LOGI("hearth run: %s, %d layers, %d threads (%s kernels), prompt %d tokens, context %d",
            m->hp.arch_name, m->hp.n_layer, (int)(threads ? threads : hr_physical_cores()), hq_simd_name(), n_prompt,
            ctx_len);

    if (stats_json && !(rs = run_stats_create())) { hr_fail(&err, HR_ENOMEM, "out of memory"); goto done; }
    if (echo) { fwrite(ptext, 1, plen, stdout); fflush(stdout); }
    for (int i = 0; i < n_prompt; i++) ht_sampler_accept(smp, toks[i]);
    /* prompt, in batches */
    int64_t t0 = hr_time_ns();
    for (int i = 0; i < n_prompt; i += (int)n_batch) {
        int nb = HR_MIN((int)n_batch, n_prompt - i);
        if (eval_step(c, tp, mm, rs, toks + i, nb, i, logits, &stats_ns, &err)) goto done;
    }
    int64_t t1 = hr_time_ns(), pp_stats_ns = stats_ns;
    stats_ns = 0;
    if (rs) run_stats_end_prompt(rs);
    if (tp && tpp.timings) { tp_timings(tp, rs, "prompt, per forward pass"); t1 = hr_time_ns(); }
    /* generation: the output is kept whole so that stop strings are found across token boundaries;
       text that may be the start of a stop string is held back until it is known not to be */
    ht_detok dt;
    ht_detok_init(&dt, voc);
    int piece_cap = HR_MAX(ht_detok_max_bytes(voc), 64);
    size_t ans_cap = 4096, ans_n = 0, shown = 0, safe = 0;
    ans = malloc(ans_cap);
    buf = malloc((size_t)piece_cap);
    if (!ans || !buf) { hr_fail(&err, HR_ENOMEM, "out of memory"); goto done; }
    int n_gen = 0;
    int32_t pos = n_prompt;
    int64_t limit = n_predict < 0 ? ctx_len - n_prompt : HR_MIN(n_predict, (long)(ctx_len - n_prompt));
    for (;;) {
        bool end = n_gen >= limit;
        int32_t tok = -1;
        int nb = 0;
        if (!end) {
            tok = ht_sampler_sample(smp, logits);
            ht_sampler_accept(smp, tok);
            n_gen++;
            if (!ignore_eos && ht_is_eog(voc, tok)) end = true;
            else {
                nb = ht_detok_push(&dt, tok, buf, piece_cap);
                end = n_gen >= limit;
            }
        }
        if (!append(&ans, &ans_n, &ans_cap, buf, nb)) { hr_fail(&err, HR_ENOMEM, "out of memory"); goto done; }
        if (end) {
            nb = ht_detok_flush(&dt, buf, piece_cap);
            if (!append(&ans, &ans_n, &ans_cap, buf, nb)) { hr_fail(&err, HR_ENOMEM, "out of memory"); goto done; }
        }
        bool stopped = ht_chat_stop_scan(ans, ans_n, safe, stops, n_stops, &safe);
        if (!stopped && end) safe = ans_n;  /* the end: nothing held back can become a stop string now */
        if (safe > shown) { fwrite(ans + shown, 1, safe - shown, stdout); fflush(stdout); shown = safe; }
        if (stopped || end) break;
        if (eval_step(c, tp, mm, rs, &tok, 1, pos++, logits, &stats_ns, &err)) goto done;
    }
    fputc('\n', stdout);
    fflush(stdout);
    int64_t t2 = hr_time_ns();
    double pp_s = (t1 - t0 - pp_stats_ns) * 1e-9, tg_s = (t2 - t1 - stats_ns) * 1e-9;
    /* the last sampled token was not evaluated when generation stopped on the limit */
    fprintf(stderr, "\nprompt:     %5d tokens in %8.2f ms (%8.2f tok/s)\n", n_prompt, pp_s * 1e3,
            pp_s > 0 ? n_prompt / pp_s : 0.0);
    if (tp && tpp.timings) tp_timings(tp, rs, "generation, per token");
    fprintf(stderr, "generation: %5d tokens in %8.2f ms (%8.2f tok/s)\n", n_gen, tg_s * 1e3,
            tg_s > 0 ? n_gen / tg_s : 0.0);
    hmem *summary = tp ? hc_head_mem(tp) : mm;
    if (summary && mem_budget) {
        char line[512];
        hmem_summary(summary, line, sizeof line);
        fprintf(stderr, "%s%s\n", tp ? "head " : "", line);
    }
    if (rs && run_stats_write(rs, stats_json, pp_s * 1e3, tg_s * 1e3, &err)) goto done;
    rc = 0;
done:
    if (rc) fprintf(stderr, "hearth run: %s\n", err.msg[0] ? err.msg : "failed");
    free(ans);
    free(buf);
    free(logits);
    free(toks);
    free(ptext);
    ht_sampler_free(smp);
    run_stats_free(rs);
    hm_ctx_free(c);
    hmem_free(mm);
    hc_head_free(tp);
    ht_vocab_free(voc);
    hm_model_free(m);
    gguf_close(g);
    free(stops);
    return rc;
usage_err:
    free(stops);
    return 2;
}
