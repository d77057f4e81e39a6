/* hearth worker: serve heads (src/cluster: tensor parallel or pipeline) until interrupted */
#include "cli.h"

#include "cluster/cluster.h"
#include "plan/plan.h"

#include <signal.h>
#include <stdio.h>

static hc_worker *volatile g_worker;

static void on_signal(int sig) {
    (void)sig;
    if (g_worker) hc_worker_stop(g_worker); /* an atomic store: safe in a handler */
}

static int worker_check(const cli_command *c, cli_opts *o) {
    return o->listen ? 0 : cli_usage_error(c, "--listen ADDR:PORT is required (see hearth worker --help)");
}

static int worker(cli_opts *o) {
    hc_worker_params p = hc_worker_default_params();
    p.listen = o->listen;
    p.cache_dir = o->cache_dir;
    p.cache_max = o->cache_max;
    p.name = o->name;
    p.n_threads = (int)o->threads;
    p.mem = o->mem;
    p.use_mmap = o->use_mmap;
    p.no_repack = o->no_repack;
    if (o->setup_timeout > 0) p.setup_ms = (int)o->setup_timeout * 1000;
    p.profile = hpl_worker_profile; /* heads that plan ask for this device's profile */
    hr_err err = {0};
    hc_worker *w = hc_worker_create(&p, &err);
    if (!w) { fprintf(stderr, "hearth worker: %s\n", err.msg); return 1; }
    g_worker = w;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    char cache[4096];
    if (!p.cache_dir) hc_default_cache_dir(cache, sizeof cache, NULL);
    printf("hearth worker: listening on %s (port %u), cache %s, %d threads\n", p.listen, hc_worker_port(w),
           p.cache_dir ? p.cache_dir : cache, p.n_threads > 0 ? p.n_threads : hr_physical_cores());
    fflush(stdout);
    int rc = hc_worker_serve(w, (int)o->sessions, &err);
    if (rc) fprintf(stderr, "hearth worker: %s\n", err.msg);
    g_worker = NULL;
    hc_worker_free(w);
    return rc ? 1 : 0;
}

const cli_command cli_worker = {
    "worker", CLI_WORKER, "serve heads: hold a share of a model's weights and compute it", "--listen ADDR:PORT [options]",
    "Serves heads (`hearth run --workers ...`) one at a time: receives this device's share of the\n"
    "model's weights once (kept in the slice cache), then computes its share of every layer\n"
    "(tensor parallel) or its windows of whole layers (`--pp`: a pipeline stage).\n"
    "It never needs the GGUF file and never sees token ids, text or logits.",
    .check = worker_check, .run = worker};
