/* hearth serve: an OpenAI-compatible HTTP server (src/serve) over one device or a cluster */
#include "cli.h"

#include "engine.h"
#include "serve/serve.h"
#include "text/chat.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the model's name: --alias, else the file's name without its folder */
static const char *model_id(const cli_opts *o) {
    if (o->alias) return o->alias;
    const char *s = strrchr(o->model, '/');
    return s ? s + 1 : o->model;
}

/* The engine, set up from the flags, as the scheduler's backend. */
static int serve_load(cli_opts *o, cli_engine *e, hs_backend *b, hs_model_info *mi, hr_err *err) {
    if (cli_engine_open(e, o, true, err)) return err->code;
    int32_t train = e->m->hp.n_ctx_train;
    long total = o->n_ctx > 0 ? o->n_ctx : train > 0 ? HR_MIN(train, 4096) : 4096;
    /* a cluster's head runs one sequence so far: one slot, with the whole context */
    long slots = o->head.n_workers ? 1 : o->parallel;
    if (total < slots)
        return hr_fail(err, HR_EINVAL, "-c %ld is fewer positions than the %ld slots (--parallel)", total, slots);
    hm_ctx_params cp = cli_ctx_params(o);
    cp.n_ctx = (int32_t)(total / slots);  /* each slot's share, as llama-server divides it */
    cp.n_seq = (int32_t)slots;
    if (cli_engine_start(e, o, &cp, true, NULL, err)) return err->code;
    char note[256];
    int tmpl = ht_chat_for_model(e->g, o->chat_template, note, sizeof note);
    if (note[0]) HR_LOGW("hearth serve: %s (--chat-template NAME chooses one)", note);
    *mi = (hs_model_info){.voc = e->voc, .chat_tmpl = tmpl, .add_bos = ht_add_bos(e->voc)};
    int32_t nv = e->m->hp.n_vocab;
    int rc = e->tp ? hs_backend_head(b, e->tp, nv, err) : hs_backend_local(b, e->c, nv, err);
    if (rc) return rc;
    /* a context takes at most n_ctx tokens per pass (hm_ctx_create clamps its n_batch so) */
    b->n_batch = (int32_t)HR_MIN(o->n_batch, (long)b->n_ctx);
    HR_LOGI("hearth serve: %s, %ld slots of %d positions, engine: %s, chat template %s", model_id(o), slots, b->n_ctx,
            b->kind, ht_chat_name(tmpl));
    return 0;
}

static int serve(cli_opts *o) {
    hr_err err = {0};
    /* SIGINT/SIGTERM are taken by sigwait below: blocked before any thread starts, so none takes them */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    hs_server_params sp = hs_server_default_params();
    sp.host = o->host;
    sp.port = (int)o->port;
    sp.n_slots = (int)o->parallel;
    sp.max_queue = (int)o->queue;
    sp.api_key = o->api_key;
    sp.ping_s = o->sse_ping;
    sp.model_id = model_id(o);
    cli_engine e = {0};
    hs_backend b = {0};
    hs_model_info mi;
    /* listening first: /health says 503 while the model loads */
    hs_server *s = hs_server_create(&sp, &err);
    if (!s) { fprintf(stderr, "hearth serve: %s\n", err.msg); return 1; }
    fprintf(stderr, "hearth serve: listening on http://%s%s%s:%d\n", strchr(o->host, ':') ? "[" : "", o->host,
            strchr(o->host, ':') ? "]" : "", hs_server_port(s));
    int rc = serve_load(o, &e, &b, &mi, &err);
    if (!rc && (rc = hs_server_ready(s, &b, &mi, &err)) == 0) b.free = NULL;  /* the server has it now */
    if (!rc) {
        fprintf(stderr, "hearth serve: ready (Ctrl-C stops)\n");
        int sig;
        sigwait(&stop, &sig);
        fprintf(stderr, "hearth serve: stopping\n");
    } else {
        fprintf(stderr, "hearth serve: %s\n", err.msg[0] ? err.msg : "failed");
    }
    hs_server_free(s);
    if (b.free) b.free(b.user);
    cli_engine_close(&e);
    return rc ? 1 : 0;
}

static int serve_check(const cli_command *c, cli_opts *o) {
    int rc = cli_check_model(c, o);
    if (!rc) rc = cli_check_cluster(c, o);
    return rc ? rc : cli_check_template(c, o);
}

const cli_command cli_serve = {
    "serve", CLI_SERVE, "an OpenAI-compatible HTTP server with a web chat", "-m MODEL [options]",
    "Answers the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models) and\n"
    "llama.cpp's (/health, /tokenize, /detokenize, /slots, /metrics), with a web chat\n"
    "at /. --parallel slots are answered at once, their tokens batched together.\n"
    "docs/serve.md has the endpoints and the scheduler.",
    .check = serve_check, .run = serve};
