/* hearth worker: serve heads (src/cluster: tensor parallel or pipeline) until interrupted */
#include "cli.h"

#include "cluster/cluster.h"
#include "net/net.h"
#include "plan/plan.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <unistd.h>

static hc_worker *volatile g_worker;

static void on_signal(int sig) {
    (void)sig;
    if (g_worker) hc_worker_stop(g_worker); /* an atomic store: safe in a handler */
}

static int worker_check(const cli_command *c, cli_opts *o) {
    return o->listen ? 0 : cli_usage_error(c, "--listen ADDR:PORT is required (see hearth worker --help)");
}

/* --announce: what this worker tells the LAN (docs/discovery.md), announced until it stops */
static hn_announcer *worker_announce(const cli_opts *o, const hc_worker_params *p, uint16_t port, hr_err *err) {
    hn_announce a = {.proto_version = HN_PROTO_VERSION, .port = port};
    char path[4096], host[256], hex[2 * HN_KEY_ID_SIZE + 1];
    if (cli_key_id(o, a.key_id, path, sizeof path, err)) return NULL;
    a.n_threads = (uint32_t)(p->n_threads > 0 ? p->n_threads : hr_physical_cores());
    /* the budget its residency manager will use (--mem-budget, else the default of now); 0: unknown */
    hmem_sysmem sm;
    if (o->mem.given && !o->mem.off && o->mem.bytes) a.mem_budget = o->mem.bytes;
    else if (!(o->mem.given && o->mem.off) && hmem_sysmem_read(&sm, NULL) == 0) a.mem_budget = hmem_default_budget(&sm);
    if (o->name) snprintf(a.name, sizeof a.name, "%s", o->name);
    else if (gethostname(a.name, sizeof a.name - 1) != 0 || !a.name[0]) snprintf(a.name, sizeof a.name, "worker");
    /* a worker bound to one address announces it; one bound to a loopback address is reachable from
       this machine alone, so it announces on lo alone */
    uint16_t lport;
    bool loopback = false;
    if (hn_parse_addr(p->listen, host, sizeof host, &lport, err)) return NULL;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res = NULL;
    if (host[0] && !getaddrinfo(host, NULL, &hints, &res) && res) {
        if (res->ai_family == AF_INET) {
            struct in_addr v4 = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
            loopback = (ntohl(v4.s_addr) >> 24) == 127;
            if (v4.s_addr != htonl(INADDR_ANY)) inet_ntop(AF_INET, &v4, a.host, sizeof a.host);
        } else if (res->ai_family == AF_INET6) {
            struct in6_addr v6 = ((struct sockaddr_in6 *)res->ai_addr)->sin6_addr;
            loopback = IN6_IS_ADDR_LOOPBACK(&v6);
            if (!IN6_IS_ADDR_UNSPECIFIED(&v6)) inet_ntop(AF_INET6, &v6, a.host, sizeof a.host);
        }
    }
    if (res) freeaddrinfo(res);
    hn_discover_where w = {.group = o->discover_group, .iface = o->discover_iface};
    if (loopback && !w.iface) w.iface = "lo";
    /* said before the thread starts, which may log too (the log level is set by the first line) */
    sodium_bin2hex(hex, sizeof hex, a.key_id, HN_KEY_ID_SIZE);
    HR_LOGI("announcing '%s' on %s%s%s (cluster key id %s, %s)", a.name, w.group ? w.group : HN_DISCOVER_GROUP,
            w.iface ? " via " : "", w.iface ? w.iface : "", hex, path);
    return hn_announcer_start(&w, &a, 0, err);
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
    p.key = o->has_key ? &o->key : NULL;
    /* a worker reachable from the network without a key serves (and shows its traffic to) anyone */
    if (!p.key && !hn_addr_is_loopback(o->listen)) {
        if (!o->insecure) {
            fprintf(stderr, "hearth worker: refusing to listen on %s without a cluster key: anyone who can reach it "
                    "could use this worker and read its traffic. Make a key with 'hearth keygen', give every device "
                    "--key FILE, or pass --insecure to do it anyway\n", o->listen);
            return 1;
        }
        HR_LOGW("worker: --insecure: listening on %s without a cluster key; links are neither authenticated nor "
                "encrypted", o->listen);
    }
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
    hn_announcer *an = NULL;
    if (o->announce && !(an = worker_announce(o, &p, hc_worker_port(w), &err))) {
        fprintf(stderr, "hearth worker: --announce: %s\n", err.msg);
        g_worker = NULL;
        hc_worker_free(w);
        return 1;
    }
    printf("hearth worker: listening on %s (port %u), cache %s, %d threads\n", p.listen, hc_worker_port(w),
           p.cache_dir ? p.cache_dir : cache, p.n_threads > 0 ? p.n_threads : hr_physical_cores());
    fflush(stdout);
    int rc = hc_worker_serve(w, (int)o->sessions, &err);
    if (rc) fprintf(stderr, "hearth worker: %s\n", err.msg);
    if (an) {
        hn_discover_stats st;
        hn_announcer_stop(an, &st);
        HR_LOGI("discovery: %u packets sent; ignored %u malformed, %u oversize, %u of another version; %u queries over "
                "the rate limit", st.sent, st.malformed, st.oversize, st.other_version, st.rate_limited);
    }
    g_worker = NULL;
    hc_worker_free(w);
    return rc ? 1 : 0;
}

const cli_command cli_worker = {
    "worker", CLI_WORKER, "serve heads: hold a share of a model's weights and compute it", "--listen ADDR:PORT [options]",
    "Serves heads (`hearth run --workers ...`) one at a time: receives this device's share of the\n"
    "model's weights once (kept in the slice cache), then computes its share of every layer\n"
    "(tensor parallel) or its windows of whole layers (`--pp`: a pipeline stage).\n"
    "It never needs the GGUF file and never sees token ids, text or logits. With --announce heads\n"
    "find it on the LAN (`hearth run --workers auto`, `hearth workers`; docs/discovery.md).",
    .check = worker_check, .run = worker};
