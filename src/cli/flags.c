/* cli/flags: the flag table, the parser that reads a command line against it, and --help from it */
#include "cli.h"

#include "net/net.h"
#include "quant/quant.h"
#include "text/chat.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum flag_kind {
    F_ON,    /* a switch: the bool becomes true */
    F_OFF,   /* a switch: the bool becomes false */
    F_STR,   /* const char *: the value as given */
    F_LONG,  /* long in [lo, hi] */
    F_INT,   /* int in [lo, hi] */
    F_I32,   /* int32_t in [lo, hi] */
    F_F32,   /* float in [lo, hi] */
    F_F64,   /* double in [lo, hi] */
    F_FN,    /* fn parses the value */
    F_REFUSE,/* a llama.cpp flag whose meaning hearth has no use for: refused, the help line says why */
};

typedef struct cli_flag cli_flag;
/* 0, or -1 with the reason in why */
typedef int (*flag_fn)(cli_opts *o, const cli_flag *f, const char *v, char *why, size_t cap);

struct cli_flag {
    unsigned    cmds;   /* CLI_RUN | ...: the commands that take it */
    const char *names;  /* every spelling, ", "-separated */
    const char *arg;    /* the value's placeholder in --help; NULL for a switch */
    int         kind;   /* enum flag_kind */
    size_t      off;    /* where the value goes: offsetof(cli_opts, ...) */
    double      lo, hi; /* numbers: the accepted range */
    flag_fn     fn;     /* F_FN */
    const char *help;   /* lines separated by '\n'; "{cores}" is replaced by the physical cores */
};

/* ---- value parsers -------------------------------------------------------------------------------- */

int cli_parse_numbers(const char *s, double *v, int cap, char *why, size_t why_cap) {
    int n = 0;
    const char *p = s;
    if (!*p) { snprintf(why, why_cap, "an empty list"); return HR_EINVAL; }
    for (;;) {
        char *end;
        errno = 0;
        double x = strtod(p, &end);
        if (end == p || errno || !isfinite(x) || !(x >= 0)) {
            snprintf(why, why_cap, "expected non-negative numbers separated by commas");
            return HR_EINVAL;
        }
        if (n == cap) { snprintf(why, why_cap, "more than %d entries", cap); return HR_ERANGE; }
        v[n++] = x;
        if (!*end) return n;
        if (*end != ',') { snprintf(why, why_cap, "unexpected '%c'", *end); return HR_EINVAL; }
        p = end + 1;
    }
}

int cli_parse_size_budget(const char *s, hmem_request *rq, char *why, size_t cap) {
    rq->given = true;
    rq->off = false;
    rq->bytes = 0;
    if (!strcmp(s, "off") || !strcmp(s, "none") || !strcmp(s, "0")) rq->off = true;
    else if (strcmp(s, "auto")) {
        int64_t v = hr_parse_size(s);
        if (v <= 0) { snprintf(why, cap, "a size like 300M or 1.5G, auto or off"); return HR_EINVAL; }
        rq->bytes = (uint64_t)v;
    }
    return 0;
}

#define AT(field) offsetof(cli_opts, field)
#define FIELD(o, f, type) ((type *)((char *)(o) + (f)->off))

static int fn_kv_type(cli_opts *o, const cli_flag *f, const char *v, char *why, size_t cap) {
    if (!strcmp(v, "f16")) o->kv_type = HQ_TYPE_F16;
    else if (!strcmp(v, "f32")) o->kv_type = HQ_TYPE_F32;
    else { snprintf(why, cap, "f16 or f32"); return -1; }
    return 0;
}

static int fn_seed(cli_opts *o, const cli_flag *f, const char *v, char *why, size_t cap) {
    char *end;
    errno = 0;
    long long s = strtoll(v, &end, 10);
    if (errno || *end || end == v || s < -1) { snprintf(why, cap, "a non-negative integer, or -1 for random"); return -1; }
    o->sp.seed = s < 0 ? HT_SEED_RANDOM : (uint64_t)s;
    return 0;
}

static int fn_stop(cli_opts *o, const cli_flag *f, const char *v, char *why, size_t cap) {
    o->stops[o->n_stops++] = v;  /* room for every argument was made by cli_parse */
    return 0;
}

/* -t 1,2 / -p 128,512 / -n / -d of bench: integers in [lo, hi] */
static int fn_list(cli_opts *o, const cli_flag *f, const char *v, char *why, size_t cap) {
    double x[CLI_MAX_LIST];
    int n = cli_parse_numbers(v, x, CLI_MAX_LIST, why, cap);
    if (n < 0) return -1;
    cli_list *l = FIELD(o, f, cli_list);
    for (int i = 0; i < n; i++) {
        if (x[i] != floor(x[i]) || x[i] < f->lo || x[i] > f->hi) {
            snprintf(why, cap, "integers in [%.0f, %.0f], comma-separated", f->lo, f->hi);
            return -1;
        }
        l->v[i] = (long)x[i];
    }
    l->n = n;
    return 0;
}

static int fn_tokens(cli_opts *o, const cli_flag *f, const char *v, char *why, size_t cap) {
    int n = 1;
    for (const char *p = v; *p; p++) n += *p == ',';
    int32_t *t = realloc(o->tokens, (size_t)n * sizeof *t);
    if (!t) { snprintf(why, cap, "out of memory"); return -1; }
    o->tokens = t;
    o->n_tokens = 0;
    for (const char *p = v;;) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            snprintf(why, cap, "not a comma-separated list of token ids");
            return -1;
        }
        t[o->n_tokens++] = (int32_t)x;
        if (!*end) return 0;
        p = end + 1;
    }
}

/* P,...: percentages per worker (one value: every worker) */
static int cli_percent_list(const char *v, double *out, int *n_out, char *why, size_t cap) {
    int n = cli_parse_numbers(v, out, HC_MAX_DEVICES - 1, why, cap);
    if (n < 0) return -1;
    for (int i = 0; i < n; i++)
        if (out[i] > 100) { snprintf(why, cap, "percentages in [0, 100]"); return -1; }
    *n_out = n;
    return 0;
}

static int fn_sim_loss(cli_opts *o, const cli_flag *f, const char *v, char *why, size_t cap) {
    return cli_percent_list(v, o->sim_loss, &o->n_sim_loss, why, cap);
}

static int fn_link_loss(cli_opts *o, const cli_flag *f, const char *v, char *why, size_t cap) {
    return cli_percent_list(v, o->link_loss, &o->n_link_loss, why, cap);
}

static int fn_sim_placement(cli_opts *o, const cli_flag *f, const char *v, char *why, size_t cap) {
    static const char *const names[] = {"importance", "random", "oracle", "contiguous", "per-token",
                                        "prev-token", "lowrank", "protect"};
    for (int i = 0; i < (int)HR_ARRAY_LEN(names); i++)
        if (!strcmp(v, names[i])) { o->sim_placement = i; return 0; }
    snprintf(why, cap, "importance, random, oracle, contiguous, per-token, prev-token, lowrank or protect");
    return -1;
}

static int fn_budget(cli_opts *o, const cli_flag *f, const char *v, char *why, size_t cap) {
    size_t n = strlen(v);
    o->mem_pct = 0;
    if ((f->cmds & CLI_BENCH) && n >= 2 && v[n - 1] == '%') { /* bench: N% of the weights */
        char *end;
        double pct = strtod(v, &end);
        if (end != v + n - 1 || !(pct > 0 && pct <= 1000)) { snprintf(why, cap, "a percentage in (0, 1000]"); return -1; }
        o->mem_pct = pct;
        o->mem.given = true;
        o->mem.off = false;
        o->mem.bytes = 0;
        return 0;
    }
    return cli_parse_size_budget(v, &o->mem, why, cap) ? -1 : 0;
}

static int fn_cache_max(cli_opts *o, const cli_flag *f, const char *v, char *why, size_t cap) {
    int64_t x = hr_parse_size(v);
    if (x <= 0) { snprintf(why, cap, "a size like 500M or 2G"); return -1; }
    o->cache_max = (uint64_t)x;
    return 0;
}

static int fn_pin(cli_opts *o, const cli_flag *f, const char *v, char *why, size_t cap) {
    static const struct { const char *name; int pin; } pins[] = {
        {"run", HMEM_PIN_RUN}, {"spread", HMEM_PIN_SPREAD}, {"ffn", HMEM_PIN_FFN}, {"none", HMEM_PIN_NONE}};
    for (size_t i = 0; i < HR_ARRAY_LEN(pins); i++)
        if (!strcmp(v, pins[i].name)) { o->pin = pins[i].pin; return 0; }
    snprintf(why, cap, "run, spread, ffn or none");
    return -1;
}

static int fn_workers(cli_opts *o, const cli_flag *f, const char *v, char *why, size_t cap) {
    free(o->workers_copy);
    o->workers_copy = NULL;
    o->head.n_workers = 0;
    /* found on the LAN by cli_discover_workers before the command runs */
    if ((o->workers_auto = !strcmp(v, "auto"))) return 0;
    if (!(o->workers_copy = strdup(v))) { snprintf(why, cap, "out of memory"); return -1; }
    for (char *p = o->workers_copy;;) {
        char *c = strchr(p, ',');
        if (c) *c = 0;
        if (!*p) { snprintf(why, cap, "HOST:PORT entries separated by commas, none empty"); return -1; }
        if (o->head.n_workers == HC_MAX_DEVICES - 1) { snprintf(why, cap, "more than %d workers", HC_MAX_DEVICES - 1); return -1; }
        o->head.workers[o->head.n_workers++] = p;
        if (!c) return 0;
        p = c + 1;
    }
}

static int fn_shares(cli_opts *o, const cli_flag *f, const char *v, char *why, size_t cap) {
    o->plan_given = true;
    o->head.shares_auto = !strcmp(v, "auto");
    o->head.n_shares = 0;
    if (o->head.shares_auto || !strcmp(v, "equal")) return 0;
    int n = cli_parse_numbers(v, o->head.shares, HC_MAX_DEVICES, why, cap);
    if (n < 0) return -1;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += o->head.shares[i];
    if (!(sum > 0)) { snprintf(why, cap, "at least one share must be positive"); return -1; }
    o->head.n_shares = n;
    return 0;
}

static int fn_windows(cli_opts *o, const cli_flag *f, const char *v, char *why, size_t cap) {
    o->plan_given = true;
    double x[HC_MAX_DEVICES];
    int n = cli_parse_numbers(v, x, HC_MAX_DEVICES, why, cap);
    if (n < 0) return -1;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        if (x[i] != floor(x[i]) || x[i] > 1e6) { snprintf(why, cap, "window sizes are whole numbers of layers"); return -1; }
        o->head.layer_windows[i] = (int)x[i];
        sum += x[i];
    }
    if (!(sum > 0)) { snprintf(why, cap, "at least one window size must be positive"); return -1; }
    o->head.n_windows = n;
    return 0;
}

/* --stages 0+1,2,3: the pipeline's stages as groups of devices (0 the head, i the i-th worker), which go
   round the ring in the order --workers gives them; a hybrid plan (docs/pipeline.md, "Hybrid plans") */
static int fn_stages(cli_opts *o, const cli_flag *f, const char *v, char *why, size_t cap) {
    o->plan_given = true;
    o->head.pp = true;
    int n = 0, next = 0;
    for (const char *p = v;; p++) {
        if (n == HC_MAX_DEVICES) { snprintf(why, cap, "more than %d stages", HC_MAX_DEVICES); return -1; }
        int devs = 0;
        for (;; p++) {
            char *end;
            if (*p < '0' || *p > '9') {
                snprintf(why, cap, "stages of device numbers joined by +, separated by commas");
                return -1;
            }
            long d = strtol(p, &end, 10);
            if (d != next) {
                snprintf(why, cap, "device %ld where device %d comes next: every device once, in the ring's order "
                         "(0 the head, then the workers as --workers lists them)", d, next);
                return -1;
            }
            next++, devs++;
            p = end;
            if (*p != '+') break;
        }
        o->head.stage_devs[n++] = devs;
        if (!*p) break;
        if (*p != ',') { snprintf(why, cap, "stages of device numbers joined by +, separated by commas"); return -1; }
    }
    if (n < 2) { snprintf(why, cap, "a pipeline has at least two stages"); return -1; }
    o->head.n_stages = n;
    return 0;
}

static int fn_allreduce(cli_opts *o, const cli_flag *f, const char *v, char *why, size_t cap) {
    o->plan_given = true; /* an all-reduce is tensor parallelism */
    if (!strcmp(v, "star")) o->head.allreduce = HC_ALLREDUCE_STAR;
    else if (!strcmp(v, "ring")) o->head.allreduce = HC_ALLREDUCE_RING;
    else { snprintf(why, cap, "star or ring"); return -1; }
    return 0;
}

static int fn_lossy(cli_opts *o, const cli_flag *f, const char *v, char *why, size_t cap) {
    o->plan_given = true; /* the lossy all-reduce is tensor parallelism */
    o->head.lossy = true;
    return 0;
}

static int fn_tied(cli_opts *o, const cli_flag *f, const char *v, char *why, size_t cap) {
    o->tied = !strcmp(f->names, "--tied");
    return 0;
}

/* ---- the table ------------------------------------------------------------------------------------ */

#define MODEL_CMDS (CLI_RUN | CLI_CHAT | CLI_EVAL | CLI_BENCH | CLI_SERVE | CLI_PERPLEXITY | CLI_CALIBRATE)
#define MEM_CMDS (CLI_RUN | CLI_WORKER | CLI_SERVE)
#define THREAD_CMDS \
    (CLI_RUN | CLI_CHAT | CLI_EVAL | CLI_SYNTH | CLI_QUANTIZE | CLI_WORKER | CLI_PLAN | CLI_PROFILE | CLI_SERVE | \
     CLI_PERPLEXITY | CLI_CALIBRATE)
#define GEN_CMDS (CLI_RUN | CLI_CHAT)
#define I24 (1 << 24)

static const cli_flag flags[] = {
    /* model, input, output */
    {MODEL_CMDS, "-m, --model", "FILE", F_STR, AT(model), 0, 0, NULL, "GGUF model (required)"},
    {CLI_TOKENIZE, "-m, --model", "FILE", F_STR, AT(model), 0, 0, NULL, "GGUF model or vocabulary (required)"},
    {CLI_PLAN, "-m, --model", "FILE", F_STR, AT(model), 0, 0, NULL, "GGUF model to plan for (required)"},
    {CLI_PROFILE, "-m, --model", "FILE", F_STR, AT(model), 0, 0, NULL,
     "measure the read speed of the disk holding FILE (default: the cache's disk)"},
    {CLI_RUN | CLI_TOKENIZE, "-p, --prompt", "TEXT", F_STR, AT(prompt), 0, 0, NULL, "prompt text"},
    {CLI_RUN | CLI_TOKENIZE, "-f, --file", "FILE", F_STR, AT(file), 0, 0, NULL, "read the prompt from FILE"},
    {CLI_TOKENIZE, "--stdin", NULL, F_ON, AT(from_stdin), 0, 0, NULL, "read the text from standard input"},
    {CLI_RUN | CLI_CHAT | CLI_TOKENIZE, "-e, --escape", NULL, F_ON, AT(escape), 0, 0, NULL,
     "process escapes in -p and --system text, as llama.cpp does (the default):\n"
     "\\n \\r \\t \\\\ \\' \\\" \\xNN; text from a file or stdin is taken as it is"},
    {CLI_RUN | CLI_CHAT | CLI_TOKENIZE, "--no-escape", NULL, F_OFF, AT(escape), 0, 0, NULL,
     "keep backslashes in -p and --system text as typed"},
    {CLI_EVAL, "--tokens", "LIST", F_FN, 0, 0, 0, fn_tokens, "comma-separated token ids (required)"},
    {CLI_EVAL, "--logits", "FILE", F_STR, AT(logits_out), 0, 0, NULL,
     "output file (required; not overwritten unless --force)"},
    {CLI_KEYGEN, "-o, --output", "FILE", F_STR, AT(output), 0, 0, NULL,
     "where to write the key (default $XDG_CONFIG_HOME/hearth/cluster.key); never overwritten"},
    {CLI_SYNTH, "-o, --output", "OUT", F_STR, AT(output), 0, 0, NULL, "output file (default <shape>-<type>.gguf)"},
    {CLI_EVAL | CLI_SYNTH | CLI_QUANTIZE | CLI_CONVERT | CLI_CALIBRATE, "--force", NULL, F_ON, AT(force), 0, 0, NULL,
     "overwrite the output file if it exists (never the input itself)"},

    /* perplexity and calibrate (docs/lossy.md) */
    {CLI_PERPLEXITY | CLI_CALIBRATE, "-f, --file", "FILE", F_STR, AT(file), 0, 0, NULL,
     "the text (required, except with --kl-divergence: the base file has the tokens)"},
    {CLI_PERPLEXITY | CLI_CALIBRATE, "-c, --ctx-size", "N", F_LONG, AT(n_ctx), 4, I24, NULL,
     "tokens per chunk (default 512, as llama-perplexity)"},
    {CLI_PERPLEXITY | CLI_CALIBRATE, "-b, --batch-size", "N", F_LONG, AT(n_batch), 1, 1 << 16, NULL,
     "tokens per forward pass (default, and at most, a chunk)"},
    {CLI_PERPLEXITY | CLI_CALIBRATE, "--chunks", "N", F_LONG, AT(n_chunks), 1, I24, NULL,
     "at most N chunks (default: all the text has)"},
    {CLI_PERPLEXITY, "--kl-divergence-base", "FILE", F_STR, AT(kld_file), 0, 0, NULL,
     "write the log-probabilities of this run to FILE (or, with --kl-divergence,\n"
     "compare this run with those FILE holds); format in docs/lossy.md"},
    {CLI_PERPLEXITY, "--kl-divergence", NULL, F_ON, AT(kld), 0, 0, NULL,
     "compare with --kl-divergence-base FILE: KL divergence, top-token agreement,\nPPL ratio"},
    {CLI_CALIBRATE, "-o, --output", "FILE", F_STR, AT(output), 0, 0, NULL,
     "importance file to write (required; not overwritten unless --force)"},
    {CLI_PERPLEXITY, "--workers", "H:P,...", F_FN, 0, 0, 0, fn_workers,
     "run on these `hearth worker`s too, as `hearth run --workers` (the planner\n"
     "chooses unless --tp-shares, --pp, --layer-windows or --allreduce is given)"},
    {CLI_PERPLEXITY, "--tp-shares", "auto|equal|W,...", F_FN, 0, 0, 0, fn_shares,
     "with --workers: tensor parallel with these shares, head first"},
    {CLI_PERPLEXITY, "--allreduce", "star|ring", F_FN, 0, 0, 0, fn_allreduce, "all-reduce algorithm (default star)"},
    {CLI_PERPLEXITY, "--pp", NULL, F_ON, AT(head.pp), 0, 0, NULL, "with --workers: a pipeline"},
    {CLI_PERPLEXITY, "--layer-windows", "N,...", F_FN, 0, 0, 0, fn_windows,
     "with --pp: window sizes in layers per device (per stage with --stages), head\nfirst"},
    {CLI_PERPLEXITY, "--stages", "D+D,D,...", F_FN, 0, 0, 0, fn_stages,
     "a pipeline whose stages are these groups of devices, as `hearth run --stages`"},
    {CLI_PERPLEXITY, "--sim-loss", "P,...", F_FN, 0, 0, 0, fn_sim_loss,
     "simulate tensor parallelism over lossy links: each worker loses P percent of\n"
     "its all-reduce datagrams (one value: every worker; a list: worker by worker)"},
    {CLI_PERPLEXITY, "--sim-devices", "N", F_LONG, AT(sim_devices), 2, HC_MAX_DEVICES, NULL,
     "devices of the simulation, the head included (default 4); equal shares"},
    {CLI_PERPLEXITY, "--sim-placement", "NAME", F_FN, 0, 0, 0, fn_sim_placement,
     "which device gets which unit groups: importance (HALO's Alg. 3 over\n"
     "--importance FILE), oracle (importance measured on this text), random,\n"
     "contiguous (today's runtime: ranges in device order), per-token (each\n"
     "token's own largest contributions on the least lossy devices: the bound\n"
     "for a runtime predictor), prev-token (ranked by the token before's), or\n"
     "lowrank (FFN ranked per token by a rank --sim-rank predictor from the\n"
     "block's input, attention by --importance), or protect (--importance's\n"
     "placement, but each token's --sim-protect FFN groups of each lossy worker\n"
     "that the same predictor ranks largest computed by the head); default\n"
     "importance"},
    {CLI_PERPLEXITY, "--sim-rank", "K", F_LONG, AT(sim_rank), 1, 1 << 20, NULL,
     "rank of --sim-placement lowrank's and protect's predictor (default n_embd/8)"},
    {CLI_PERPLEXITY, "--sim-protect", "N", F_LONG, AT(sim_protect), 0, 1 << 20, NULL,
     "--sim-placement protect: FFN groups per token and layer that the head takes\n"
     "from each lossy worker (default: a quarter of one device's share)"},
    {CLI_PERPLEXITY, "--importance", "FILE", F_STR, AT(importance), 0, 0, NULL,
     "importance file from `hearth calibrate`: --sim-placement importance's, or\n"
     "with --workers the runtime's placement of unit groups (as for run)"},
    {CLI_PERPLEXITY, "--sim-packet", "N", F_LONG, AT(sim_packet), 1, 1 << 20, NULL,
     "elements of a partial per datagram (default 350: 1400 bytes of F32)"},
    {CLI_PERPLEXITY, "--sim-seed", "N", F_LONG, AT(sim_seed), 0, 1L << 40, NULL,
     "seed of the loss pattern and of random placement (default 1)"},

    /* generation */
    {CLI_RUN, "-n, --n-predict", "N", F_LONG, AT(n_predict), -1, I24, NULL,
     "tokens to generate (default 256; -1 = until end of text or context)"},
    {CLI_CHAT, "-n, --n-predict", "N", F_LONG, AT(n_predict), -1, I24, NULL,
     "most tokens per answer (default -1: until end of turn or context full)"},
    {THREAD_CMDS, "-t, --threads", "N", F_LONG, AT(threads), 1, 1024, NULL, "threads (default: physical cores = {cores})"},
    {CLI_RUN | CLI_CHAT | CLI_PLAN, "-c, --ctx-size", "N", F_LONG, AT(n_ctx), 0, I24, NULL,
     "context length (default: the model's, at most 4096)"},
    {CLI_INFO, "-c, --ctx-size", "N", F_LONG, AT(n_ctx), 1, I24, NULL,
     "context length for the memory estimate (default 4096, or the model's\ntraining context if smaller)"},
    {CLI_SERVE, "-c, --ctx-size", "N", F_LONG, AT(n_ctx), 0, I24, NULL,
     "context length of all slots together, divided among them (default: the\n"
     "model's, at most 4096)"},
    {CLI_SERVE, "-b, --batch-size", "N", F_LONG, AT(n_batch), 1, 1 << 16, NULL,
     "tokens per engine step: every generating slot's next token, then chunks of\n"
     "waiting prompts (default 512)"},
    {CLI_RUN | CLI_CHAT | CLI_BENCH | CLI_PLAN, "-b, --batch-size", "N", F_LONG, AT(n_batch), 1, 1 << 16, NULL,
     "prompt tokens per forward pass (default 512)"},
    {GEN_CMDS, "--temp", "X", F_F32, AT(sp.temp), 0, 100, NULL, "temperature (default 0.8; 0 = greedy)"},
    {GEN_CMDS, "--top-k", "N", F_I32, AT(sp.top_k), 0, I24, NULL, "top-k sampling (default 40; 0 = off)"},
    {GEN_CMDS, "--top-p", "X", F_F32, AT(sp.top_p), 0, 1, NULL, "top-p sampling (default 0.95; 1 = off)"},
    {GEN_CMDS, "--min-p", "X", F_F32, AT(sp.min_p), 0, 1, NULL, "min-p sampling (default 0.05; 0 = off)"},
    {GEN_CMDS, "--repeat-penalty", "X", F_F32, AT(sp.repeat_penalty), 0, 100, NULL,
     "repetition penalty (default 1.0 = off)"},
    {GEN_CMDS, "--repeat-last-n", "N", F_I32, AT(sp.repeat_last_n), 0, I24, NULL,
     "tokens the penalty looks back over (default 64)"},
    {GEN_CMDS, "-s, --seed", "N", F_FN, 0, 0, 0, fn_seed, "sampling seed (default: random)"},
    {GEN_CMDS, "--ignore-eos", NULL, F_ON, AT(ignore_eos), 0, 0, NULL,
     "do not stop at end-of-generation tokens (for testing)"},
    {CLI_RUN | CLI_TOKENIZE, "--no-bos", NULL, F_ON, AT(no_bos), 0, 0, NULL,
     "do not add the BOS token (added when the vocabulary asks for it)"},
    {GEN_CMDS, "--stop", "STR", F_FN, 0, 0, 0, fn_stop,
     "stop when the output would contain STR (repeatable; STR is not printed)"},
    {CLI_RUN, "--no-echo, --no-display-prompt", NULL, F_ON, AT(no_echo), 0, 0, NULL, "do not echo the prompt"},
    {CLI_RUN, "--chat", NULL, F_ON, AT(chat), 0, 0, NULL,
     "a single chat turn: PROMPT is the user's message, put in the model's chat\n"
     "template (see `hearth chat --help`); the prompt is not echoed"},
    {CLI_RUN, "-sys, --system, --system-prompt", "TEXT", F_STR, AT(system), 0, 0, NULL,
     "system prompt for --chat (implies --chat)"},
    {CLI_CHAT, "-sys, --system, --system-prompt", "TEXT", F_STR, AT(system), 0, 0, NULL, "system prompt"},
    {CLI_RUN, "--chat-template", "NAME", F_STR, AT(chat_template), 0, 0, NULL,
     "template for --chat instead of the model's (implies --chat)"},
    {CLI_SERVE, "--chat-template", "NAME", F_STR, AT(chat_template), 0, 0, NULL,
     "template for /v1/chat/completions instead of the model's (the names\n`hearth chat --help` lists)"},
    {CLI_CHAT, "--chat-template", "NAME", F_STR, AT(chat_template), 0, 0, NULL,
     "use this template instead of the model's (see below)"},

    /* memory and weights */
    {MODEL_CMDS | CLI_PLAN, "--kv-type", "f16|f32", F_FN, 0, 0, 0, fn_kv_type, "KV cache element type (default f16)"},
    {MEM_CMDS, "--mem-budget", "SIZE", F_FN, 0, 0, 0, fn_budget,
     "memory for this device's weights + KV cache + scratch (300M, 1.5G; default\n"
     "auto = 80% of MemAvailable or the cgroup limit; off = plain mmap); the weights\n"
     "are streamed from the file if they do not fit"},
    {CLI_BENCH, "--mem-budget", "SIZE", F_FN, 0, 0, 0, fn_budget,
     "memory for weights + KV cache + scratch: 300M, 1.5G, N% (of the model's\n"
     "weights, plus KV cache and scratch), auto (80% of MemAvailable / the cgroup\n"
     "limit; the default) or off (plain mmap). Given, the table adds memory figures\n"
     "per test: ms/token, disk bytes/token, time blocked on weights/token, resident\n"
     "weights, pressure"},
    {CLI_PLAN | CLI_PROFILE, "--mem-budget", "SIZE", F_FN, 0, 0, 0, fn_budget,
     "this device's memory budget as its runs will have it (default auto = 80% of\n"
     "MemAvailable or the cgroup limit): what the plan may keep resident here"},
    {MEM_CMDS | CLI_BENCH, "--window", "W", F_INT, AT(mem.window), 1, 1 << 20, NULL,
     "blocks of weights kept loading ahead when streaming (default 2)"},
    {MEM_CMDS, "--no-prefetch", NULL, F_ON, AT(mem.no_prefetch), 0, 0, NULL,
     "when streaming, load a block only when compute reaches it"},
    {CLI_BENCH, "--pin", "run|spread|ffn|none", F_FN, 0, 0, 0, fn_pin,
     "which blocks stay resident beside the window (default run)"},
    {MODEL_CMDS | CLI_WORKER, "--mmap", NULL, F_ON, AT(use_mmap), 0, 0, NULL,
     "run the weights from the file mapping instead of loading them into memory\n"
     "(the default loads them when they fit the memory budget: on some machines a\n"
     "mapping streams at half the speed, and Q4_0 and Q8_0 (and, with AVX-512, Q4_K,\n"
     "Q5_K and Q6_K) are then repacked for the kernels; see --no-repack)"},
    {MODEL_CMDS | CLI_WORKER, "--no-mmap", NULL, F_OFF, AT(use_mmap), 0, 0, NULL,
     "load the weights into memory (the default when they fit)"},
    {MODEL_CMDS | CLI_WORKER, "-nr, --no-repack", NULL, F_ON, AT(no_repack), 0, 0, NULL,
     "load the weights in the file's layout, not the kernels' packed one"},
    {CLI_RUN, "--stats-json", "FILE", F_STR, AT(stats_json), 0, 0, NULL,
     "write per-device figures to FILE as JSON: per token, resident weight\n"
     "bytes, disk bytes read and time blocked on weights; totals, memory\n"
     "pressure (with --workers: one round trip per worker per token)"},

    /* the cluster */
    {CLI_RUN | CLI_CHAT | CLI_SERVE, "--workers", "H:P,...|auto", F_FN, 0, 0, 0, fn_workers,
     "run on these `hearth worker`s too (the head computes as well). Without\n"
     "--tp-shares, --layer-windows, --pp or --allreduce the planner measures the\n"
     "devices and links and runs the fastest plan it predicts: one device, tensor\n"
     "parallel or a pipeline (`hearth plan` shows every candidate). auto: the\n"
     "workers on the LAN that announce this cluster key (`hearth worker --announce`;\n"
     "docs/discovery.md)"},
    {CLI_PLAN, "--workers", "H:P,...|auto", F_FN, 0, 0, 0, fn_workers,
     "the `hearth worker`s the plan may use (auto: those found on the LAN)"},
    {CLI_RUN | CLI_CHAT | CLI_SERVE | CLI_PLAN, "--tp-shares", "auto|equal|W,...", F_FN, 0, 0, 0, fn_shares,
     "tensor parallel with these shares, head first (equal; auto: measured\n"
     "matvec speed); with --stages: of the groups' devices"},
    {CLI_RUN | CLI_CHAT | CLI_SERVE, "--allreduce", "star|ring", F_FN, 0, 0, 0, fn_allreduce, "all-reduce algorithm (default star)"},
    {CLI_RUN | CLI_CHAT | CLI_SERVE | CLI_PLAN | CLI_PERPLEXITY, "--lossy", NULL, F_FN, 0, 0, 0, fn_lossy,
     "tensor parallel, star all-reduce: the workers' partial sums of each decoding\n"
     "step go over UDP and the head merges what arrived by --lossy-deadline; what\n"
     "is lost counts as zero (HALO; for lossy Wi-Fi, docs/lossy.md)"},
    {CLI_RUN | CLI_CHAT | CLI_SERVE | CLI_PLAN | CLI_PERPLEXITY, "--lossy-deadline", "MS", F_INT, AT(head.lossy_deadline_ms), 1, 60000, NULL,
     "with --lossy: how long the head waits for the partials of an all-reduce\n(default 10)"},
    {CLI_RUN | CLI_CHAT | CLI_SERVE | CLI_PERPLEXITY, "--lossy-protect", "N", F_INT, AT(head.lossy_protect), 1, 1 << 20, NULL,
     "with --lossy: per token and layer the head computes the N FFN groups of each\n"
     "lossy worker's share that a low-rank predictor ranks largest, and the worker\n"
     "leaves them out, so that its link cannot lose them; the head keeps an F32 copy\n"
     "of those shares' FFN weights. Lossy workers: those --link-loss gives a loss\n"
     "above 0 for, else every worker (docs/lossy.md, \"The head protects\")"},
    {CLI_RUN | CLI_CHAT | CLI_SERVE | CLI_PERPLEXITY, "--lossy-protect-rank", "K", F_INT, AT(head.lossy_protect_rank), 1, 1 << 20, NULL,
     "the rank of --lossy-protect's predictor (default n_embd/2, at most 64)"},
    {CLI_RUN | CLI_CHAT | CLI_SERVE, "--importance", "FILE", F_STR, AT(importance), 0, 0, NULL,
     "tensor parallel: place each layer's unit groups by this importance file\n"
     "(`hearth calibrate`): the least important on the lossiest links, the\n"
     "shares unchanged (HALO's Alg. 3; docs/lossy.md)"},
    {CLI_RUN | CLI_CHAT | CLI_SERVE | CLI_PERPLEXITY, "--link-loss", "P,...", F_FN, 0, 0, 0, fn_link_loss,
     "with --importance: the workers' packet loss in percent, in --workers order\n"
     "(one value: every worker), which orders them for the placement; default:\n"
     "what the planner's loss probe measured when it chose the plan, else 0"},
    {CLI_RUN | CLI_CHAT | CLI_SERVE | CLI_PLAN, "--pp", NULL, F_ON, AT(head.pp), 0, 0, NULL,
     "with --workers: a pipeline (whole layers per device) instead of tensor\nparallelism"},
    {CLI_RUN | CLI_CHAT | CLI_SERVE | CLI_PLAN, "--layer-windows", "N,...", F_FN, 0, 0, 0, fn_windows,
     "with --pp: window sizes in layers per device, head first, dealt round the\n"
     "ring until all layers are placed (2,3,2: several rounds per token;\n"
     "default: one round, layers split evenly); with --stages one per stage"},
    {CLI_RUN | CLI_CHAT | CLI_SERVE | CLI_PLAN, "--stages", "D+D,D,...", F_FN, 0, 0, 0, fn_stages,
     "a hybrid plan (implies --pp): the pipeline's stages as groups of devices,\n"
     "0 the head and i the i-th worker, every device once in ring order (0+1,2+3:\n"
     "the head and worker 1 run the first stage's layers tensor parallel, each\n"
     "its --tp-shares weight of every layer, workers 2 and 3 the second stage's;\n"
     "--tp-shares then has one weight per device of a group, --layer-windows one\n"
     "size per stage; docs/pipeline.md)"},
    {CLI_SERVE, "--pp-micro", "M", F_INT, AT(head.pp_micro), 1, HC_MAX_MICRO, NULL,
     "in a pipeline: each step's sequences go round the ring as up to M\n"
     "micro-batches, so that the stages compute at once (default 1: one pass;\n"
     "on CPU stages it is often slower, docs/pipeline.md)"},
    {CLI_RUN | CLI_CHAT | CLI_SERVE, "--worker-timeout", "SEC", F_F64, AT(worker_timeout), 0.1, 86400, NULL,
     "a worker that has not answered within SEC s of a forward pass (plus 20\n"
     "ms per token of the batch) has left: the answer goes on without it\n"
     "(default: 10 s plus 1 s per token of the batch until a token has been\n"
     "timed, then 10 times a token's time, at least 3 s, plus one token's time\n"
     "per token of the batch: a stopped or unplugged device is noticed\n"
     "quickly, a slow one is not mistaken for one)"},
    {CLI_RUN | CLI_CHAT | CLI_SERVE, "--no-recover", NULL, F_ON, AT(head.no_recover), 0, 0, NULL,
     "a worker that leaves ends the answer with an error (default: the head\n"
     "plans again over the devices that remain, recomputes the context and\n"
     "goes on; docs/reliability.md)"},
    {CLI_RUN, "--timings", NULL, F_ON, AT(head.timings), 0, 0, NULL,
     "with --workers: per-device compute / all-reduce times per forward pass"},
    {CLI_RUN | CLI_CHAT | CLI_SERVE | CLI_PLAN | CLI_WORKER | CLI_WORKERS | CLI_PERPLEXITY, "--key", "FILE", F_STR,
     AT(key_file), 0, 0, NULL,
     "the cluster key (`hearth keygen`): head and workers prove they hold it and\n"
     "encrypt every link (default: $XDG_CONFIG_HOME/hearth/cluster.key, or\n"
     "~/.config/hearth/cluster.key, when it exists; docs/security.md)"},
    {CLI_WORKER, "--insecure", NULL, F_ON, AT(insecure), 0, 0, NULL,
     "listen beyond loopback without a cluster key: anyone who can reach the port\n"
     "may use this worker and read its traffic (refused without this flag)"},
    {CLI_WORKER, "--listen", "ADDR:PORT", F_STR, AT(listen), 0, 0, NULL,
     "where to listen, e.g. 0.0.0.0:7070 (port 0: any free port; printed)"},
    {CLI_WORKER | CLI_RUN | CLI_CHAT | CLI_SERVE, "--cache", "DIR", F_STR, AT(cache_dir), 0, 0, NULL,
     "slice cache (run: the head's own share with --workers; default\n$XDG_CACHE_HOME/hearth/slices or ~/.cache/hearth/slices)"},
    {CLI_WORKER, "--cache-max", "SIZE", F_FN, 0, 0, 0, fn_cache_max,
     "most the slice cache's files may take (500M, 2G); beyond it the least\n"
     "recently used are removed, never one a session uses (default: no bound\n"
     "of its own; a slice file is never written into the disk's last 5%, at\n"
     "most 1 GiB: old ones are removed first, and if that is not enough the\n"
     "head is told)"},
    {CLI_RUN | CLI_CHAT | CLI_SERVE | CLI_PLAN, "--cache-max", "SIZE", F_FN, 0, 0, 0, fn_cache_max,
     "with --workers: most the head's slice cache (--cache) may take, as a\n"
     "worker's --cache-max: beyond it the least recently used slice files are\n"
     "removed, never one in use (default: twice the model file, or half of what\n"
     "the disk has free for the cache if that is less; and never the disk's\n"
     "last 5%, at most 1 GiB). plan: in the runs of its --plan-trial"},
    {CLI_WORKER, "--name", "NAME", F_STR, AT(name), 0, 0, NULL,
     "name shown to heads (default: worker) and in announcements (default: the\nhost name)"},
    {CLI_WORKER, "--sessions", "N", F_LONG, AT(sessions), 1, 1 << 30, NULL,
     "exit after serving N heads (default: serve until interrupted)"},
    {CLI_WORKER, "--announce", NULL, F_ON, AT(announce), 0, 0, NULL,
     "make this worker findable on the LAN (`--workers auto`, `hearth workers`):\n"
     "UDP multicast announcements carrying its port, name, threads, memory budget\n"
     "and the cluster key's public id, now and then and when asked (a hint only:\n"
     "the key is what lets a head in)"},
    {CLI_WORKER | CLI_RUN | CLI_CHAT | CLI_SERVE | CLI_PLAN | CLI_WORKERS, "--discover-group", "ADDR:PORT", F_STR,
     AT(discover_group), 0, 0, NULL,
     "the multicast group discovery uses (default " HN_DISCOVER_GROUP "; one\n"
     "per cluster if two share a LAN)"},
    {CLI_WORKER | CLI_RUN | CLI_CHAT | CLI_SERVE | CLI_PLAN | CLI_WORKERS, "--discover-iface", "NAME", F_STR,
     AT(discover_iface), 0, 0, NULL, "discover on this network interface only (default: every one that is up)"},
    {CLI_RUN | CLI_CHAT | CLI_SERVE | CLI_PLAN | CLI_WORKERS, "--discover-ms", "MS", F_LONG, AT(discover_ms), 50, 60000,
     NULL, "how long to collect the workers' answers (default 1000)"},
    {CLI_WORKERS, "--json", NULL, F_ON, AT(json), 0, 0, NULL, "print one JSON object instead of a table"},
    {CLI_WORKER, "--setup-timeout", "SEC", F_LONG, AT(setup_timeout), 1, 3600, NULL,
     "drop a head that has not sent its next set-up message within SEC s\n(default 20)"},

    /* serve */
    {CLI_SERVE, "--host", "ADDR", F_STR, AT(host), 0, 0, NULL,
     "address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every\n"
     "interface, then use --api-key)"},
    {CLI_SERVE, "--port", "N", F_LONG, AT(port), 0, 65535, NULL, "port (default 8080; 0: any free port, logged)"},
    {CLI_SERVE, "-np, --parallel", "N", F_LONG, AT(parallel), 1, 256, NULL,
     "slots: requests answered at once, batched together (default 4)"},
    {CLI_SERVE, "--queue", "N", F_LONG, AT(queue), 0, 1 << 20, NULL,
     "requests that may wait for a slot; more are answered 503 (default 64)"},
    {CLI_SERVE, "--api-key", "KEY", F_STR, AT(api_key), 0, 0, NULL,
     "require `Authorization: Bearer KEY` (not for / and /health)"},
    {CLI_SERVE, "--sse-ping", "SEC", F_F64, AT(sse_ping), 0.05, 3600, NULL,
     "a stream with nothing to send for SEC s gets a comment line, so that\n"
     "clients and proxies keep it open (default 5)"},
    {CLI_SERVE, "-a, --alias", "NAME", F_STR, AT(alias), 0, 0, NULL,
     "the model's name in /v1/models and replies (default: the file's name)"},
    /* llama.cpp's flags that do not apply: refused with the reason rather than silently ignored (a
       user who typed -ngl 99 expects a GPU to be used). No value is read: the command stops here. */
    {MODEL_CMDS | CLI_WORKER, "-ngl, --gpu-layers, --n-gpu-layers", NULL, F_REFUSE, 0, 0, 0, NULL,
     "not supported: hearth computes on CPUs only, nothing is offloaded to a GPU\n"
     "(to use more machines' memory and cores, see `hearth run --workers`)"},
    {MODEL_CMDS | CLI_WORKER, "-sm, --split-mode, -ts, --tensor-split, -mg, --main-gpu, -dev, --device", NULL,
     F_REFUSE, 0, 0, 0, NULL,
     "not supported: these place a model on GPUs; hearth splits a model across\n"
     "machines instead (`hearth run --workers`, --tp-shares, --pp)"},
    {MODEL_CMDS, "-fa, --flash-attn", NULL, F_REFUSE, 0, 0, 0, NULL,
     "not supported: hearth's CPU attention is one kernel, there is no other to\nchoose"},
    {CLI_RUN, "-cnv, --conversation, -i, --interactive", NULL, F_REFUSE, 0, 0, 0, NULL,
     "not supported by run: `hearth chat` is the conversation"},

    /* bench */
    {CLI_BENCH, "-t, --threads", "LIST", F_FN, AT(bench_threads), 1, 1024, fn_list,
     "thread counts, comma-separated (default: physical cores = {cores})"},
    {CLI_BENCH, "-p, --n-prompt", "LIST", F_FN, AT(bench_prompt), 0, 1 << 20, fn_list,
     "prompt lengths, comma-separated (default 512; 0 skips)"},
    {CLI_BENCH, "-n, --n-gen", "LIST", F_FN, AT(bench_gen), 0, 1 << 20, fn_list,
     "generation lengths, comma-separated (default 128; 0 skips)"},
    {CLI_BENCH, "-d, --n-depth", "LIST", F_FN, AT(bench_depth), 0, 1 << 20, fn_list,
     "tokens already in the context when a test starts, comma-separated\n"
     "(default 0): they are processed as a prompt once per test, untimed,\n"
     "and the test's tokens attend to them (shown as \"tg128 @ d1024\")"},
    {CLI_BENCH, "-r, --repetitions", "N", F_LONG, AT(reps), 1, 1000, NULL, "runs per test (default 5)"},
    {CLI_BENCH, "--roofline", NULL, F_ON, AT(roofline), 0, 0, NULL,
     "after every generated token (untimed), read the weights that token\n"
     "read once more as a plain stream with the same threads: the memory\n"
     "roofline measured in the same seconds as the token, so a machine\n"
     "whose bandwidth drifts still gives a true fraction. Adds roofline t/s\n"
     "(weights / stream time) and the fraction of it each tgN reached\n"
     "(tests at -d 0 only: at depth the KV cache is read too)"},
    {CLI_BENCH, "--json", NULL, F_ON, AT(json), 0, 0, NULL, "print a JSON list of {test, threads, tok_per_s, reps, ...}"},

    /* plan, profile */
    {CLI_PLAN | CLI_PROFILE, "--json", NULL, F_ON, AT(json), 0, 0, NULL, "print one JSON object instead of tables"},
    {CLI_PLAN | CLI_PROFILE, "--no-cache", NULL, F_ON, AT(no_cache), 0, 0, NULL,
     "measure again instead of using the cached profiles (plan: every device)"},
    {CLI_PLAN | CLI_RUN | CLI_CHAT, "--profile-serial", NULL, F_ON, AT(profile_serial), 0, 0, NULL,
     "the planner's devices measure themselves one after another instead of at\n"
     "once (devices that share one machine's cores, as on tools/testbed)"},
    {CLI_PLAN | CLI_RUN | CLI_CHAT | CLI_SERVE, "--plan-trial", "N", F_LONG, AT(plan_trial), 0, 16, NULL,
     "choose by measurement: run the planner's N best-predicted candidates\n"
     "(feasible, within 1.5x of the best: --plan-trial-within) and N/2\n"
     "neighbours of its best pipeline (a layer moved between stages, the trips\n"
     "doubled or halved) and of its best TP plan (the head's share moved) for\n"
     "a few tokens each, two rounds, and take the fastest measured. Kept in\n"
     "trial.json beside the profile cache: a later run that plans the same\n"
     "candidates takes that choice without measuring (plan --no-cache: measure\n"
     "again). Without the flag a trial of 4 (and 2 neighbours) runs by itself\n"
     "when other candidates are predicted within 1.5x of the best and the trial\n"
     "is estimated to take at most --plan-trial-budget seconds; 0: never, the\n"
     "prediction alone chooses"},
    {CLI_PLAN | CLI_RUN | CLI_CHAT | CLI_SERVE, "--plan-trial-budget", "S", F_F64, AT(plan_trial_budget), 0, 1e6, NULL,
     "the trial that runs without --plan-trial: only when its estimated time\n"
     "(its decode passes at their predicted speed, each run's start, each\n"
     "candidate's worker weights sent once) is at most S seconds (default 1200\n"
     "for plan, 120 for run, chat and serve; 0: no trial without --plan-trial)"},
    {CLI_PLAN | CLI_RUN | CLI_CHAT | CLI_SERVE, "--plan-trial-tokens", "N", F_LONG, AT(plan_trial_tokens), 1, 4096,
     NULL, "timed decode passes of each trial run (default 8; 2 untimed before)"},
    {CLI_PLAN | CLI_RUN | CLI_CHAT | CLI_SERVE, "--plan-trial-within", "X", F_F64, AT(plan_trial_within), 1, 1e6,
     NULL, "the trial measures only candidates predicted within X times the best\n"
     "(default 1.5)"},
    {CLI_PLAN, "--prompt-tokens", "N", F_LONG, AT(prompt_tokens), 1, I24, NULL,
     "prompt length the predicted prefill time is for (default 512)"},
    {CLI_PLAN, "--cluster", "FILE", F_STR, AT(cluster_file), 0, 0, NULL,
     "cost the plans for the devices and links saved in FILE (an earlier\n"
     "`hearth plan --json`'s output) instead of measuring: no worker is\n"
     "contacted. Another model, -c, prompt length or plan flags (as many\n"
     "devices as FILE has) can be costed on the same profile"},

    /* info, tokenize, quantize */
    {CLI_INFO, "--json", NULL, F_ON, AT(json), 0, 0, NULL,
     "print one JSON object (with every tensor's name, type, shape and bytes)"},
    {CLI_INFO, "--tensors", NULL, F_ON, AT(tensors), 0, 0, NULL, "also list every tensor (text output)"},
    {CLI_TOKENIZE, "--ids", NULL, F_ON, AT(ids_only), 0, 0, NULL,
     "print only the ids, as one bracketed list: [1, 15043, 3186]"},
    {CLI_TOKENIZE, "--parse-special", NULL, F_ON, AT(parse_special), 0, 0, NULL,
     "turn the texts of control tokens (<|im_start|>, <s>, ...) into those\n"
     "tokens (by default they are tokenized as plain text)"},
    {CLI_TOKENIZE, "--show-count", NULL, F_ON, AT(show_count), 0, 0, NULL, "also print the number of tokens"},
    {CLI_CONVERT, "--type, --outtype", "T", F_STR, AT(type), 0, 0, NULL,
     "type of the 2-D weights: f32, f16, bf16, q8_0, or auto (the default: bf16\n"
     "for a bf16 checkpoint, else f16); norms and biases stay f32"},
    {CLI_QUANTIZE, "--keep-embd", NULL, F_ON, AT(keep_embd), 0, 0, NULL, "leave token_embd.weight in its type"},

    /* synth */
    {CLI_SYNTH, "--shape", "NAME", F_STR, AT(shape), 0, 0, NULL,
     "shape to write (required); 'custom' takes the shape parameters below"},
    {CLI_SYNTH, "--type", "T", F_STR, AT(type), 0, 0, NULL,
     "weight type or recipe (default F16; see below): plain types are pure (every\n"
     "2-D weight is T; norms and biases stay F32)"},
    {CLI_SYNTH, "--layers, --n-layer", "N", F_LONG, AT(n_layer), 1, 100000, NULL,
     "number of layers, e.g. 2 to try a 70B shape cheaply"},
    {CLI_SYNTH, "--vocab-from", "GGUF", F_STR, AT(vocab_from), 0, 0, NULL,
     "copy tokenizer.* from this file (default ../shared/models/stories260K.gguf);\n"
     "a smaller vocabulary is padded with control tokens [PAD<i>] up to n_vocab"},
    {CLI_SYNTH, "--seed", "S", F_LONG, AT(seed), 0, 1e18, NULL,
     "random seed (default 1); the output does not depend on -t"},
    {CLI_SYNTH, "--arch", "A", F_STR, AT(arch), 0, 0, NULL,
     "llama | qwen2 (q/k/v biases) | qwen3 (per-head q/k norms); default llama"},
    {CLI_SYNTH, "--n-embd", "N", F_LONG, AT(n_embd), 1, 1 << 20, NULL, "width (shape parameter)"},
    {CLI_SYNTH, "--n-head", "N", F_LONG, AT(n_head), 1, 1 << 16, NULL, "query heads (shape parameter)"},
    {CLI_SYNTH, "--n-head-kv", "N", F_LONG, AT(n_head_kv), 1, 1 << 16, NULL, "KV heads (default n-head)"},
    {CLI_SYNTH, "--n-ff", "N", F_LONG, AT(n_ff), 1, 1 << 20, NULL, "FFN width (shape parameter)"},
    {CLI_SYNTH, "--n-vocab", "N", F_LONG, AT(n_vocab), 1, I24, NULL, "vocabulary size (default: the vocabulary's)"},
    {CLI_SYNTH, "--head-dim", "N", F_LONG, AT(head_dim), 2, 4096, NULL, "head size (default n-embd / n-head)"},
    {CLI_SYNTH, "--rope-base", "F", F_F64, AT(rope_base), 1e-3, 1e12, NULL,
     "RoPE base (default 10000 for llama, 1e6 for qwen)"},
    {CLI_SYNTH, "--n-ctx", "N", F_LONG, AT(synth_n_ctx), 1, I24, NULL,
     "context_length written to the file (default 4096 for custom)"},
    {CLI_SYNTH, "--tied", NULL, F_FN, 0, 0, 0, fn_tied, "output head shared with token_embd (custom default: untied)"},
    {CLI_SYNTH, "--untied", NULL, F_FN, 0, 0, 0, fn_tied, "output head separate from token_embd"},
};

/* ---- parsing -------------------------------------------------------------------------------------- */

cli_opts cli_opts_default(void) {
    cli_opts o = {.n_predict = 256, .n_batch = 512, .prompt_tokens = 512, .kv_type = HQ_TYPE_F16, .reps = 5,
                  .sp = ht_sampler_default_params(), .head = hc_head_default_params(), .seed = 1, .n_embd = -1,
                  .n_layer = -1, .n_head = -1, .n_head_kv = -1, .n_ff = -1, .n_vocab = -1, .head_dim = -1,
                  .synth_n_ctx = -1, .rope_base = -1, .tied = -1, .escape = true, .host = "127.0.0.1",
                  .port = 8080, .parallel = 4, .queue = 64, .sse_ping = 5, .discover_ms = 1000, .sim_devices = 4,
                  .sim_packet = 350, .sim_seed = 1, .sim_protect = -1, .plan_trial = -1,
                  .plan_trial_budget = -1};
    o.mem = o.head.mem;
    o.pin = hmem_default_params().pin;
    o.bench_threads = (cli_list){{hr_physical_cores()}, 1};
    o.bench_prompt = (cli_list){{512}, 1};
    o.bench_gen = (cli_list){{128}, 1};
    o.bench_depth = (cli_list){{0}, 1};
    return o;
}

void cli_opts_free(cli_opts *o) {
    free(o->stops);
    free(o->tokens);
    free(o->workers_copy);
    hn_key_wipe(&o->key);
    for (int i = 0; i < 2; i++) free(o->unescaped[i]);
    o->unescaped[0] = o->unescaped[1] = NULL;
    o->stops = NULL;
    o->tokens = NULL;
    o->workers_copy = NULL;
}

/* true if a is one of the ", "-separated spellings in names */
static bool flag_named(const char *names, const char *a) {
    size_t n = strlen(a);
    for (const char *p = names; *p;) {
        const char *e = strstr(p, ", ");
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !memcmp(p, a, n)) return true;
        if (!e) break;
        p = e + 2;
    }
    return false;
}

int cli_usage_error(const cli_command *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "hearth %s: ", c->name);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return 2;
}

/* stores v into the flag's field; 0 or 2 (printed) */
static int flag_set(const cli_command *c, const cli_flag *f, const char *a, const char *v, cli_opts *o) {
    char why[160] = "";
    long n;
    double x;
    switch (f->kind) {
    case F_ON: *FIELD(o, f, bool) = true; return 0;
    case F_OFF: *FIELD(o, f, bool) = false; return 0;
    case F_STR: *FIELD(o, f, const char *) = v; return 0;
    case F_LONG: case F_INT: case F_I32:
        if (!cli_parse_int(c->name, a, v, (long)f->lo, (long)f->hi, &n)) return 2;
        if (f->kind == F_LONG) *FIELD(o, f, long) = n;
        else if (f->kind == F_INT) *FIELD(o, f, int) = (int)n;
        else *FIELD(o, f, int32_t) = (int32_t)n;
        return 0;
    case F_F32: case F_F64:
        if (!cli_parse_float(c->name, a, v, f->lo, f->hi, &x)) return 2;
        if (f->kind == F_F32) *FIELD(o, f, float) = (float)x;
        else *FIELD(o, f, double) = x;
        return 0;
    case F_REFUSE: {
        char reason[256];
        snprintf(reason, sizeof reason, "%s", f->help);
        for (char *p = reason; (p = strchr(p, '\n'));) *p = ' ';
        return cli_usage_error(c, "%s: %s", a, reason);
    }
    default:
        if (f->fn(o, f, v, why, sizeof why) == 0) return 0;
        return cli_usage_error(c, "invalid value '%s' for %s (%s)", v, a, why);
    }
}

/* -p and --system with llama.cpp's escapes processed (into copies: argv stays as it is) */
static int unescape_typed(const cli_command *c, cli_opts *o) {
    const char **texts[2] = {&o->prompt, &o->system};
    for (int i = 0; i < 2; i++) {
        if (!*texts[i] || !strchr(*texts[i], '\\')) continue;
        free(o->unescaped[i]);
        if (!(o->unescaped[i] = strdup(*texts[i]))) return cli_usage_error(c, "out of memory");
        size_t n = strlen(o->unescaped[i]);
        size_t k = cli_unescape(o->unescaped[i], n);
        if (memchr(o->unescaped[i], 0, k))
            return cli_usage_error(c, "\\x00 cannot be part of %s (give --no-escape to keep escapes as typed)",
                                   i ? "--system" : "-p");
        o->unescaped[i][k] = 0;
        *texts[i] = o->unescaped[i];
    }
    return 0;
}

int cli_parse(const cli_command *c, int argc, char **argv, cli_opts *o) {
    free(o->stops);
    if (!(o->stops = calloc((size_t)argc + 2, sizeof *o->stops))) return cli_usage_error(c, "out of memory");
    o->n_stops = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            cli_usage(c, stdout);
            return CLI_HELP;
        }
        const cli_flag *f = NULL;
        for (size_t k = 0; k < HR_ARRAY_LEN(flags) && !f; k++)
            if ((flags[k].cmds & c->bit) && flag_named(flags[k].names, a)) f = &flags[k];
        if (!f) {
            if (a[0] != '-' || !a[1]) {
                if (o->n_pos < c->max_pos) { o->pos[o->n_pos++] = a; continue; }
                return cli_usage_error(c, "unexpected argument '%s' (see hearth %s --help)", a, c->name);
            }
            return cli_usage_error(c, "unknown option '%s' (see hearth %s --help)", a, c->name);
        }
        const char *v = NULL;
        if (f->arg) {
            if (i + 1 >= argc) return cli_usage_error(c, "%s needs a value", a);
            v = argv[++i];
        }
        int rc = flag_set(c, f, a, v, o);
        if (rc) return rc;
    }
    return o->escape ? unescape_typed(c, o) : 0;
}

/* one flag's lines of --help */
static void flag_usage(const cli_flag *f, FILE *out) {
    char head[96], help[1024];
    snprintf(head, sizeof head, "%s%s%s", f->names, f->arg ? " " : "", f->arg ? f->arg : "");
    /* {cores} -> the physical cores */
    const char *mark = strstr(f->help, "{cores}");
    if (mark) snprintf(help, sizeof help, "%.*s%d%s", (int)(mark - f->help), f->help, hr_physical_cores(), mark + 7);
    else snprintf(help, sizeof help, "%s", f->help);
    if (strlen(head) > 20) fprintf(out, "  %s\n%24s", head, ""); /* a long head: its help on the next line */
    else fprintf(out, "  %-22s", head);
    for (const char *p = help;;) {
        const char *nl = strchr(p, '\n');
        fprintf(out, "%.*s\n", nl ? (int)(nl - p) : (int)strlen(p), p);
        if (!nl) break;
        p = nl + 1;
        fprintf(out, "%24s", "");
    }
}

void cli_usage(const cli_command *c, FILE *f) {
    fprintf(f, "usage: hearth %s %s\n\n%s\n\noptions:\n", c->name, c->synopsis, c->about);
    for (size_t k = 0; k < HR_ARRAY_LEN(flags); k++)
        if (flags[k].cmds & c->bit) flag_usage(&flags[k], f);
    fprintf(f, "  %-22sthis help\n", "-h, --help");
    if (c->epilog) {
        fputc('\n', f);
        c->epilog(f);
    }
}

int cli_table_check(char *why, size_t cap) {
    for (size_t k = 0; k < HR_ARRAY_LEN(flags); k++) {
        const cli_flag *f = &flags[k];
        if (!f->help || !f->help[0] || !f->cmds || (f->kind == F_FN) != (f->fn != NULL) ||
            ((f->kind == F_ON || f->kind == F_OFF || f->kind == F_REFUSE) && f->arg)) {
            snprintf(why, cap, "%s: incomplete entry", f->names);
            return HR_EINVAL;
        }
        /* no spelling may mean two flags to one command */
        for (size_t j = k + 1; j < HR_ARRAY_LEN(flags); j++) {
            if (!(flags[j].cmds & f->cmds)) continue;
            for (const char *p = flags[j].names; *p;) {
                const char *e = strstr(p, ", ");
                char one[48];
                snprintf(one, sizeof one, "%.*s", e ? (int)(e - p) : (int)strlen(p), p);
                if (flag_named(f->names, one)) {
                    snprintf(why, cap, "%s is two flags to one command", one);
                    return HR_EINVAL;
                }
                if (!e) break;
                p = e + 2;
            }
        }
    }
    return 0;
}

/* ---- checks shared by the commands ---------------------------------------------------------------- */

int cli_check_model(const cli_command *c, const cli_opts *o) {
    if (o->model) return 0;
    cli_usage_error(c, "-m MODEL is required (see hearth %s --help)", c->name);
    return 2;
}

int cli_check_cluster(const cli_command *c, const cli_opts *o) {
    const hc_head_params *h = &o->head;
    if (o->plan_trial > 0 && (o->plan_given || h->pp))
        return cli_usage_error(c, "--plan-trial measures the planner's candidates; a plan flag (--tp-shares, --pp, "
                               "--layer-windows, --stages, --allreduce, --lossy) chooses by hand: not both");
    if (h->n_workers || o->workers_auto) return 0;
    if (o->plan_trial > 0) return cli_usage_error(c, "--plan-trial needs --workers");
    const char *f = h->n_stages ? "--stages" : h->pp ? "--pp" : h->n_windows ? "--layer-windows"
                  : h->n_shares || h->shares_auto ? "--tp-shares"
                  : h->timings ? "--timings" : h->pp_micro > 1 ? "--pp-micro" : h->no_recover ? "--no-recover"
                  : o->worker_timeout > 0 ? "--worker-timeout" : o->cache_max ? "--cache-max" : NULL;
    return f ? cli_usage_error(c, "%s needs --workers", f) : 0;
}

int cli_check_template(const cli_command *c, const cli_opts *o) {
    if (!o->chat_template || ht_chat_from_name(o->chat_template) != HT_CHAT_UNKNOWN) return 0;
    fprintf(stderr, "hearth %s: unknown chat template '%s'; known:", c->name, o->chat_template);
    for (int t = 0; t < HT_CHAT_COUNT; t++) fprintf(stderr, " %s", ht_chat_name(t));
    fputc('\n', stderr);
    return 2;
}

hm_ctx_params cli_ctx_params(const cli_opts *o) {
    hm_ctx_params cp = hm_ctx_default_params();
    cp.n_ctx = (int32_t)o->n_ctx;
    cp.n_batch = (int32_t)o->n_batch;
    cp.n_threads = (int32_t)o->threads;
    cp.kv_type = o->kv_type;
    return cp;
}

/* The cluster key of a command that talks to workers (a worker; a head with --workers): --key FILE,
   else the default file when it exists. 0, or 1 with the reason printed. */
static int cli_key_setup(const cli_command *c, cli_opts *o) {
    bool wanted = c->bit == CLI_WORKER || o->head.n_workers > 0;
    if (!(c->bit & (CLI_RUN | CLI_CHAT | CLI_SERVE | CLI_PLAN | CLI_WORKER | CLI_PERPLEXITY)) || !wanted) return 0;
    char def[4096];
    hr_err err = {0};
    const char *path = o->key_file;
    if (!path) {
        if (hn_key_default_path(def, sizeof def, NULL) || access(def, F_OK) != 0) return 0; /* no key: plaintext */
        path = def;
    }
    if (hn_key_load(path, &o->key, &err)) {
        fprintf(stderr, "hearth %s: %s\n", c->name, err.msg);
        return 1;
    }
    char id[2 * HN_KEY_ID_SIZE + 1];
    hn_key_id_hex(&o->key, id);
    HR_LOGI("cluster key %s from %s: links are authenticated and encrypted", id, path);
    o->has_key = true;
    o->head.key = &o->key;
    return 0;
}

int cli_main(const cli_command *c, int argc, char **argv) {
    cli_opts o = cli_opts_default();
    if (c->defaults) c->defaults(&o);
    int rc = cli_parse(c, argc, argv, &o);
    if (!rc && c->check) rc = c->check(c, &o);
    if (!rc && o.workers_auto) rc = cli_discover_workers(c, &o); /* before the key: it sets the workers */
    if (!rc) rc = cli_key_setup(c, &o);
    if (!rc) rc = c->run(&o);
    cli_opts_free(&o);
    return rc == CLI_HELP ? 0 : rc;
}
