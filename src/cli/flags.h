/* cli/flags: the one table of the hearth command's flags. Each entry names its spellings, the
   commands that take it, where its value goes in cli_opts and its help text; cli_parse reads a
   command line against the table and cli_usage prints a command's --help from it. Values are
   checked here (ranges, lists, sizes), so that library code only ever sees typed parameters. */
#ifndef HEARTH_CLI_FLAGS_H
#define HEARTH_CLI_FLAGS_H

#include "base/base.h"
#include "cluster/cluster.h"
#include "mem/mem.h"
#include "model/model.h"
#include "text/text.h"

#include <stdio.h>

/* the commands, as bits of cli_flag.cmds */
enum {
    CLI_RUN = 1u << 0, CLI_CHAT = 1u << 1, CLI_EVAL = 1u << 2, CLI_BENCH = 1u << 3, CLI_INFO = 1u << 4,
    CLI_SYNTH = 1u << 5, CLI_QUANTIZE = 1u << 6, CLI_TOKENIZE = 1u << 7, CLI_WORKER = 1u << 8,
    CLI_PLAN = 1u << 9, CLI_PROFILE = 1u << 10, CLI_CONVERT = 1u << 11,
    CLI_SERVE = 1u << 12, CLI_KEYGEN = 1u << 13, CLI_WORKERS = 1u << 14, CLI_PERPLEXITY = 1u << 15,
    CLI_CALIBRATE = 1u << 16,
};

/* perplexity --sim-placement: how the simulated devices get their unit groups (docs/lossy.md) */
enum cli_sim_placement { CLI_SIM_IMPORTANCE, CLI_SIM_RANDOM, CLI_SIM_ORACLE, CLI_SIM_CONTIGUOUS, CLI_SIM_PER_TOKEN,
                             CLI_SIM_PREV_TOKEN, CLI_SIM_LOWRANK, CLI_SIM_PROTECT };

#define CLI_MAX_LIST 16  /* entries of a bench list (-t 1,2,4) */

typedef struct cli_list { long v[CLI_MAX_LIST]; int n; } cli_list;

/* Every value any command takes; cli_opts_default() gives the defaults, a command may change them
   before cli_parse. Strings point into argv. */
typedef struct cli_opts {
    const char *model, *prompt, *file, *output, *logits_out, *listen, *cache_dir, *name;
    const char *system, *chat_template, *stats_json;
    const char *host, *api_key, *alias;  /* serve */
    long        port, parallel, queue;   /* serve */
    double      sse_ping;                /* serve */
    double      worker_timeout;          /* --worker-timeout SEC (0: automatic) */
    long        n_predict, threads, n_ctx, n_batch, sessions, reps, setup_timeout;
    int         kv_type;             /* HQ_TYPE_F16 or HQ_TYPE_F32 */
    bool        ignore_eos, no_bos, no_echo, chat, force, json, roofline, tensors, keep_embd;
    bool        from_stdin, ids_only, parse_special, escape, show_count;
    ht_sampler_params sp;
    const char **stops;              /* --stop, repeatable; room for one more (the template's) */
    int         n_stops;
    int32_t    *tokens;              /* eval --tokens (owned) */
    int         n_tokens;
    bool        use_mmap, no_repack; /* how the weights are held */
    hmem_request mem;                /* --mem-budget, --window, --no-prefetch */
    uint64_t    cache_max;           /* --cache-max: a worker's, or the head's slice cache (0: not given) */
    double      mem_pct;             /* bench --mem-budget N%: percent of the weights (0: not given) */
    int         pin;                 /* bench --pin: enum hmem_pin */
    hc_head_params head;             /* --workers and the cluster flags */
    bool        plan_given;          /* --tp-shares, --layer-windows or --allreduce given (the planner stays out) */
    bool        no_cache;            /* profile/plan --no-cache: measure this device again */
    bool        profile_serial;      /* plan/run --profile-serial: the devices measure one at a time */
    long        prompt_tokens;       /* plan: prompt length the prefill figure is for */
    long        plan_trial;          /* --plan-trial N: the planner's N best-predicted candidates measured (trial.c);
                                        -1 (no flag): a default trial where near-ties are cheap to measure; 0: none */
    long        plan_trial_tokens;   /* --plan-trial-tokens: timed decode passes a trial run (0: 8) */
    double      plan_trial_within;   /* --plan-trial-within X: candidates predicted within X of the best (0: 1.5) */
    double      plan_trial_budget;   /* --plan-trial-budget S: the default trial only when estimated at most S
                                        seconds (-1: the command's default, CLI_TRIAL_BUDGET_PLAN / _RUN) */
    const char *cluster_file;        /* plan --cluster: a saved `plan --json` (devices, links) instead of measuring */
    char       *workers_copy;        /* owned: the split --workers text, or the discovered addresses */
    bool        workers_auto;        /* --workers auto: found by discovery before the command runs */
    const char *key_file;            /* --key: the cluster key (default hn_key_default_path) */
    bool        insecure;            /* worker --insecure */
    bool        has_key;             /* key was loaded (cli_main, for the commands that talk to workers) */
    hn_key      key;                 /* wiped by cli_opts_free; o->head.key points here when loaded */
    bool        announce;            /* worker --announce */
    const char *discover_group, *discover_iface; /* --discover-group, --discover-iface */
    long        discover_ms;         /* --discover-ms: how long a head listens for answers */
    cli_list    bench_threads, bench_prompt, bench_gen, bench_depth;
    /* synth */
    const char *shape, *type, *vocab_from, *arch;
    long        seed, n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, head_dim, synth_n_ctx;
    double      rope_base;
    int         tied;                /* -1 not given, 0 untied, 1 tied */
    char       *unescaped[2];        /* owned: -p and --system with their escapes processed */
    /* perplexity, calibrate */
    long        n_chunks;            /* --chunks: at most this many (0: all) */
    const char *kld_file;            /* --kl-divergence-base */
    bool        kld;                 /* --kl-divergence: compare with kld_file instead of writing it */
    const char *importance;          /* --importance FILE (hearth calibrate's) */
    double      sim_loss[HC_MAX_DEVICES]; /* --sim-loss, percent per worker (one value: every worker) */
    int         n_sim_loss;          /* 0: no simulation */
    double      link_loss[HC_MAX_DEVICES]; /* --link-loss, percent per worker (one value: every worker) */
    int         n_link_loss;         /* 0: every link 0 */
    long        sim_devices, sim_packet, sim_seed, sim_rank, sim_protect;
    int         sim_placement;       /* enum cli_sim_placement */
    const char *pos[3];              /* positional arguments */
    int         n_pos;
} cli_opts;

/* A command: its page of --help, its positional arguments, and the three steps cli_main takes. */
typedef struct cli_command cli_command;
struct cli_command {
    const char *name;                /* "run" */
    unsigned    bit;                 /* CLI_RUN */
    const char *summary;             /* one line for `hearth --help` */
    const char *synopsis;            /* "-m MODEL -p PROMPT [options]" */
    const char *about;               /* what it does (printed after the synopsis) */
    int         max_pos;             /* positional arguments it takes (0..3) */
    void      (*epilog)(FILE *f);    /* more help after the options, or NULL */
    void      (*defaults)(cli_opts *o);                  /* before parsing, or NULL */
    int       (*check)(const cli_command *c, cli_opts *o); /* after parsing: 0, or 2 (printed); or NULL */
    int       (*run)(cli_opts *o);                       /* the work: the exit code (0 ok, 1 failed) */
};

/* defaults, parse, check, run: the process's exit code (0 ok, 1 runtime error, 2 usage error) */
int cli_main(const cli_command *c, int argc, char **argv);

cli_opts cli_opts_default(void);
void     cli_opts_free(cli_opts *o);

#define CLI_HELP (-1)
/* Reads argv[1..argc) into o. Returns 0 to go on, CLI_HELP when --help was printed, or 2 after
   printing why the command line is wrong. */
int  cli_parse(const cli_command *c, int argc, char **argv, cli_opts *o);
/* The command's --help: synopsis, about, every flag of the table it takes, epilog. */
void cli_usage(const cli_command *c, FILE *f);
/* Prints "hearth CMD: MSG" and returns 2 (a usage error). */
int  cli_usage_error(const cli_command *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Checks shared by the commands that run a model: a -m, the cluster flags that need --workers, the
   chat template's name. 0 or 2 (printed). */
int  cli_check_model(const cli_command *c, const cli_opts *o);
int  cli_check_cluster(const cli_command *c, const cli_opts *o);
int  cli_check_template(const cli_command *c, const cli_opts *o);
/* The context parameters the flags ask for. */
hm_ctx_params cli_ctx_params(const cli_opts *o);

/* Value parsers (exposed for the tests): 0 or a negative code with the reason in why. */
int cli_parse_size_budget(const char *s, hmem_request *rq, char *why, size_t cap);
int cli_parse_numbers(const char *s, double *v, int cap, char *why, size_t why_cap);

/* The table's own consistency (tests): every entry complete, no spelling taken twice by one command. */
int cli_table_check(char *why, size_t cap);

#endif
