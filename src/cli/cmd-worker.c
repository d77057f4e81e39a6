/* hearth worker: serve heads (src/cluster: tensor parallel or pipeline) until interrupted */
#include "cli.h"

#include "cluster/cluster.h"

#include <signal.h>
#include <stdio.h>

static hc_worker *volatile g_worker;

static void on_signal(int sig) {
    (void)sig;
    if (g_worker) hc_worker_stop(g_worker); /* an atomic store: safe in a handler */
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: hearth worker --listen ADDR:PORT [options]\n\n"
            "Serves heads (`hearth run --workers ...`) one at a time: receives this device's share of the\n"
            "model's weights once (kept in the slice cache), then computes its share of every layer\n"
            "(tensor parallel) or its windows of whole layers (`--pp`: a pipeline stage).\n"
            "It never needs the GGUF file and never sees token ids, text or logits.\n\n"
            "options:\n"
            "  --listen ADDR:PORT      where to listen, e.g. 0.0.0.0:7070 (port 0: any free port; printed)\n"
            "  --cache DIR             slice cache (default $XDG_CACHE_HOME/hearth/slices or\n"
            "                          ~/.cache/hearth/slices)\n"
            "  -t, --threads N         threads (default: physical cores = %d)\n"
            "  --name NAME             name shown to heads (default: worker)\n"
            "  --sessions N            exit after serving N heads (default: serve until interrupted)\n"
            "  --mem-budget SIZE       memory for this device's weights + KV cache + scratch (300M, 1.5G; default\n"
            "                          auto = 80%% of MemAvailable or the cgroup limit; off = plain mmap); streams\n"
            "                          the weights from the slice cache if they do not fit\n"
            "  --window W              blocks of weights kept loading ahead when streaming (default 2)\n"
            "  --no-prefetch           when streaming, load a block only when compute reaches it\n"
            "%s"
            "  -h, --help              this help\n",
            hr_physical_cores(), cli_weights_help);
}

int cmd_worker(int argc, char **argv) {
    hc_worker_params p = hc_worker_default_params();
    p.listen = NULL;
    long threads = 0, sessions = 0;
    cli_weights wf = {0};
    const char *v;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--listen")) { if (!(v = cli_value("worker", argc, argv, &i))) return 2; p.listen = v; }
        else if (!strcmp(a, "--cache")) { if (!(v = cli_value("worker", argc, argv, &i))) return 2; p.cache_dir = v; }
        else if (!strcmp(a, "--name")) { if (!(v = cli_value("worker", argc, argv, &i))) return 2; p.name = v; }
        else if (!strcmp(a, "--mem-budget")) { if (!(v = cli_value("worker", argc, argv, &i))) return 2; p.mem_budget = v; }
        else if (!strcmp(a, "--no-prefetch")) p.no_prefetch = true;
        else if (cli_weights_flag(&wf, argv, i)) p.use_mmap = wf.use_mmap, p.no_repack = wf.no_repack;
        else if (!strcmp(a, "--window")) {
            long wv;
            if (!(v = cli_value("worker", argc, argv, &i)) || !cli_parse_int("worker", a, v, 1, 1 << 20, &wv)) return 2;
            p.window = (int)wv;
        }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!(v = cli_value("worker", argc, argv, &i)) || !cli_parse_int("worker", a, v, 1, 1024, &threads)) return 2;
        } else if (!strcmp(a, "--sessions")) {
            if (!(v = cli_value("worker", argc, argv, &i)) || !cli_parse_int("worker", a, v, 1, 1 << 30, &sessions)) return 2;
        } else {
            fprintf(stderr, "hearth worker: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!p.listen) { fprintf(stderr, "hearth worker: --listen ADDR:PORT is required\n"); usage(stderr); return 2; }
    p.n_threads = (int)threads;
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
           p.cache_dir ? p.cache_dir : cache, threads > 0 ? (int)threads : hr_physical_cores());
    fflush(stdout);
    int rc = hc_worker_serve(w, (int)sessions, &err);
    if (rc) fprintf(stderr, "hearth worker: %s\n", err.msg);
    g_worker = NULL;
    hc_worker_free(w);
    return rc ? 1 : 0;
}
