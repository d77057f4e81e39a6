/* hearth run: generate text from a prompt on one device or a cluster, streaming it to stdout */
#include "cli.h"

#include "engine.h"
#include "quant/quant.h"
#include "run-stats.h"
#include "text/chat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct run_job {
    cli_opts   *o;
    cli_engine  e;
    run_stats  *rs;          /* --stats-json */
    int64_t     stats_ns;    /* time spent sampling the figures: left out of the speed figures */
    char       *text;        /* the prompt's text (with --chat: rendered in the template) */
    size_t      len;
    int32_t    *toks;
    int         n_prompt;
    float      *logits;
    ht_sampler *smp;
    bool        echo;
} run_job;

/* weight transfer to the workers: a progress bar on a TTY */
static void tp_progress(void *user, uint64_t done, uint64_t total) {
    (void)user;
    cli_progress("weights", done, total);
    if (done >= total) cli_progress_end();
}

/* --timings: per-device figures of the passes since the last call */
static void tp_timings(run_job *j, const char *what) {
    hc_dev_stats st[HC_MAX_DEVICES];
    static char buf[16384];
    hr_err e = {0};
    /* with --stats-json the devices' counters are read after every pass and summed there */
    int n = j->rs ? run_stats_phase(j->rs, st, HC_MAX_DEVICES) : hc_head_stats(j->e.tp, st, HC_MAX_DEVICES, &e);
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

/* The prompt's text and tokens: -p or -f, with --chat the user's message in the model's template
   (its end-of-turn text becomes one more stop string). */
static int run_tokenize(run_job *j, hr_err *err) {
    cli_opts *o = j->o;
    if (o->file) {
        /* no more than the context could hold: a token seldom covers 32 bytes of text */
        int32_t ctx = o->n_ctx > 0 ? (int32_t)o->n_ctx : j->e.m->hp.n_ctx_train > 0 ? j->e.m->hp.n_ctx_train : 4096;
        size_t len;
        if (!(j->text = cli_read_text(o->file, (size_t)ctx * 32 + 4096, &len, err))) {
            if (err->code != HR_ERANGE) return err->code;
            return hr_fail(err, HR_ERANGE, "'%s' holds more text than a context of %d tokens can take (use -c)",
                           o->file, ctx);
        }
    } else if (!(j->text = strdup(o->prompt ? o->prompt : ""))) {
        return hr_fail(err, HR_ENOMEM, "out of memory");
    }
    j->len = strlen(j->text);
    if (o->chat) {
        char note[256];
        int tmpl = ht_chat_for_model(j->e.g, o->chat_template, note, sizeof note);
        if (note[0]) fprintf(stderr, "hearth run: %s (--chat-template NAME chooses one)\n", note);
        HR_LOGI("hearth run: chat template %s", ht_chat_name(tmpl));
        ht_chat_msg msgs[2] = {{"system", o->system ? o->system : ""}, {"user", j->text}};
        size_t tlen;
        char *text = ht_chat_render_alloc(tmpl, o->system ? msgs : msgs + 1, o->system ? 2 : 1, true, &tlen);
        if (!text) return hr_fail(err, HR_ENOMEM, "out of memory");
        HR_LOGD("hearth run: prompt text [%s]", text);
        free(j->text);
        j->text = text;
        j->len = tlen;
        j->echo = false;
        if (ht_chat_end_of_turn(tmpl)[0]) o->stops[o->n_stops++] = ht_chat_end_of_turn(tmpl);
    }
    int cap = (int)HR_MIN(j->len + 8, (size_t)1 << 24);
    if (!(j->toks = malloc((size_t)cap * sizeof *j->toks))) return hr_fail(err, HR_ENOMEM, "out of memory");
    bool bos = ht_add_bos(j->e.voc) && !o->no_bos;
    /* a rendered chat holds special tokens (<|im_start|>, </s>, ...) that must become their ids */
    int n = o->chat ? ht_chat_tokenize(j->e.voc, j->text, j->len, bos, j->toks, cap)
                    : ht_tokenize(j->e.voc, j->text, j->len, bos, j->toks, cap);
    if (n < 0) return hr_fail(err, n, "tokenization failed: %s", hr_strerror(n));
    if (n > cap) return hr_fail(err, HR_ERANGE, "prompt too long (%d tokens)", n);
    if (n == 0) return hr_fail(err, HR_EINVAL, "empty prompt and the model has no BOS token");
    j->n_prompt = n;
    return 0;
}

/* one forward pass; then, with --stats-json, one sample of every device's figures */
static int run_eval(run_job *j, const int32_t *t, int n, int32_t pos, hr_err *err) {
    int rc = cli_engine_eval(&j->e, t, n, pos, j->logits, false, err);
    if (!rc) rc = cli_engine_check_logits(j->logits, (size_t)j->e.m->hp.n_vocab, err);
    if (rc || !j->rs) return rc;
    int64_t t0 = hr_time_ns();
    rc = run_stats_sample(j->rs, j->e.mm, j->e.tp, n, err);
    j->stats_ns += hr_time_ns() - t0;
    return rc;
}

/* the model, the engine, the prompt's tokens, the sampler */
static int run_setup(run_job *j, hr_err *err) {
    cli_opts *o = j->o;
    hm_ctx_params cp = cli_ctx_params(o);
    if (cli_engine_open(&j->e, o, true, err) || run_tokenize(j, err) ||
        cli_engine_start(&j->e, o, &cp, true, tp_progress, err))
        return err->code;
    int32_t ctx_len = cli_engine_n_ctx(&j->e);
    if (j->n_prompt >= ctx_len)
        return hr_fail(err, HR_ERANGE, "prompt of %d tokens does not fit the context of %d (use -c)", j->n_prompt,
                       ctx_len);
    const hm_hparams *hp = &j->e.m->hp;
    if (!(j->smp = ht_sampler_create(&o->sp, hp->n_vocab)) || !(j->logits = malloc((size_t)hp->n_vocab * sizeof(float))))
        return hr_fail(err, HR_ENOMEM, "out of memory");
    if (o->stats_json && !(j->rs = run_stats_create())) return hr_fail(err, HR_ENOMEM, "out of memory");
    HR_LOGI("hearth run: %s, %d layers, %d threads (%s kernels), prompt %d tokens, context %d", hp->arch_name,
            hp->n_layer, (int)(o->threads ? o->threads : hr_physical_cores()), hq_simd_name(), j->n_prompt, ctx_len);
    return 0;
}

/* The prompt, in batches; its time (less the figures' sampling) in *ms. */
static int run_prompt(run_job *j, double *ms, hr_err *err) {
    int nb = (int)j->o->n_batch;
    for (int i = 0; i < j->n_prompt; i++) ht_sampler_accept(j->smp, j->toks[i]);
    int64_t t0 = hr_time_ns();
    j->stats_ns = 0;
    for (int i = 0; i < j->n_prompt; i += nb)
        if (run_eval(j, j->toks + i, HR_MIN(nb, j->n_prompt - i), i, err)) return err->code;
    *ms = (hr_time_ns() - t0 - j->stats_ns) * 1e-6;
    if (j->rs) run_stats_end_prompt(j->rs);
    if (j->e.tp && j->o->head.timings) tp_timings(j, "prompt, per forward pass");
    return 0;
}

/* Samples and streams tokens until the limit, end of text or a stop string. The output is kept whole
   so that stop strings are found across token boundaries; text that may be the start of a stop string
   is held back until it is known not to be. */
static int run_generate(run_job *j, int *n_gen, double *ms, hr_err *err) {
    const cli_opts *o = j->o;
    int rc = HR_ENOMEM;
    ht_detok dt;
    ht_detok_init(&dt, j->e.voc);
    int piece_cap = HR_MAX(ht_detok_max_bytes(j->e.voc), 64);
    size_t ans_cap = 4096, ans_n = 0, shown = 0, safe = 0;
    char *ans = malloc(ans_cap), *buf = malloc((size_t)piece_cap);  /* the output so far; one token's text */
    int32_t ctx_len = cli_engine_n_ctx(&j->e), pos = j->n_prompt;
    int64_t limit = o->n_predict < 0 ? ctx_len - j->n_prompt : HR_MIN(o->n_predict, (long)(ctx_len - j->n_prompt));
    int64_t t0 = hr_time_ns();
    j->stats_ns = 0;
    *n_gen = 0;
    if (!ans || !buf) goto oom;
    for (;;) {
        bool end = *n_gen >= limit;
        int32_t tok = -1;
        int nb = 0;
        if (!end) {
            tok = ht_sampler_sample(j->smp, j->logits);
            ht_sampler_accept(j->smp, tok);
            ++*n_gen;
            if (!o->ignore_eos && ht_is_eog(j->e.voc, tok)) end = true;
            else {
                nb = ht_detok_push(&dt, tok, buf, piece_cap);
                end = *n_gen >= limit;
            }
        }
        if (!append(&ans, &ans_n, &ans_cap, buf, nb)) goto oom;
        if (end && !append(&ans, &ans_n, &ans_cap, buf, ht_detok_flush(&dt, buf, piece_cap))) goto oom;
        bool stopped = ht_chat_stop_scan(ans, ans_n, safe, o->stops, o->n_stops, &safe);
        if (!stopped && end) safe = ans_n;  /* the end: nothing held back can become a stop string now */
        if (safe > shown) { fwrite(ans + shown, 1, safe - shown, stdout); fflush(stdout); shown = safe; }
        if (stopped || end) break;
        if ((rc = run_eval(j, &tok, 1, pos++, err))) goto out;
    }
    fputc('\n', stdout);
    fflush(stdout);
    *ms = (hr_time_ns() - t0 - j->stats_ns) * 1e-6;
    rc = 0;
    goto out;
oom:
    rc = hr_fail(err, HR_ENOMEM, "out of memory");
out:
    free(ans);
    free(buf);
    return rc;
}

/* speed to stderr (the last sampled token was not evaluated when generation stopped on the limit),
   the memory summary, --stats-json */
static int run_report(run_job *j, double pp_ms, int n_gen, double tg_ms, hr_err *err) {
    fprintf(stderr, "\nprompt:     %5d tokens in %8.2f ms (%8.2f tok/s)\n", j->n_prompt, pp_ms,
            pp_ms > 0 ? j->n_prompt / pp_ms * 1e3 : 0.0);
    if (j->e.tp && j->o->head.timings) tp_timings(j, "generation, per token");
    fprintf(stderr, "generation: %5d tokens in %8.2f ms (%8.2f tok/s)\n", n_gen, tg_ms,
            tg_ms > 0 ? n_gen / tg_ms * 1e3 : 0.0);
    hmem *summary = j->e.tp ? hc_head_mem(j->e.tp) : j->e.mm;
    if (summary && j->o->mem.given) {
        char line[512];
        hmem_summary(summary, line, sizeof line);
        fprintf(stderr, "%s%s\n", j->e.tp ? "head " : "", line);
    }
    return j->rs ? run_stats_write(j->rs, j->o->stats_json, pp_ms, tg_ms, err) : 0;
}

static int run(cli_opts *o) {
    hr_err err = {0};
    run_job j = {.o = o, .echo = !o->no_echo && !o->chat};
    double pp_ms = 0, tg_ms = 0;
    int n_gen = 0;
    int rc = run_setup(&j, &err);
    if (!rc && j.echo) { fwrite(j.text, 1, j.len, stdout); fflush(stdout); }
    if (!rc) rc = run_prompt(&j, &pp_ms, &err);
    if (!rc) rc = run_generate(&j, &n_gen, &tg_ms, &err);
    if (!rc) rc = run_report(&j, pp_ms, n_gen, tg_ms, &err);
    if (rc) fprintf(stderr, "hearth run: %s\n", err.msg[0] ? err.msg : "failed");
    free(j.logits);
    free(j.toks);
    free(j.text);
    ht_sampler_free(j.smp);
    run_stats_free(j.rs);
    cli_engine_close(&j.e);
    return rc ? 1 : 0;
}

static int run_check(const cli_command *c, cli_opts *o) {
    if (o->system || o->chat_template) o->chat = true;
    if (o->prompt && o->file) return cli_usage_error(c, "give -p or -f, not both");
    int rc = cli_check_model(c, o);
    if (!rc) rc = cli_check_cluster(c, o);
    return rc ? rc : cli_check_template(c, o);
}

const cli_command cli_run = {
    "run", CLI_RUN, "generate text from a prompt", "-m MODEL -p PROMPT [options]",
    "Generates text after PROMPT and streams it to stdout (the prompt is echoed first).\n"
    "Logs and speed figures go to stderr.",
    .check = run_check, .run = run};
