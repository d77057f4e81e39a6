/*
 * plan — the planner: what each device can do (profile), what a plan would cost (cost model), and
 * which plan to run (solvers). Prefix: hpl_.
 *
 * - Profile: a device measures itself once (matrix-vector and matrix-matrix speed per weight type
 *   with the real kernels, memory bandwidth, the memory it may use, its CPU quota, the cold read speed
 *   of the disk that holds its weights) and caches the figures in a JSON file, keyed by what they
 *   depend on (CPU, cores, threads, memory and CPU limits, the disk). The head measures the links to
 *   its workers (RTT, throughput) with PROFILE_REQ and PROBE messages (src/net) and asks every worker
 *   for its own profile (PROFILE_REQ with HN_PROFILE_DEVICE).
 * - Cost model: decode ms/token, prefill ms and per-device memory of a candidate plan — one device,
 *   tensor parallel with shares, or a piped-ring pipeline with windows — from the profiles (prima.cpp's
 *   latency model, TPI-LLM Prop. 4 for the streaming the prefetch hides, messages x RTT + bytes /
 *   throughput per link).
 * - Solvers: TP shares by HALO's min-max (minimise the slowest device's time, memory-aware); pipeline
 *   windows and trip count by a Halda-style ILP per trip count (GLPK); hybrid plans (a pipeline one of
 *   whose stages is a tensor-parallel group: the head's, or a pair of workers later in the ring) by the
 *   same ILP with the group as one virtual device, and min-max shares inside the group.
 *
 * Library code: no printing to stdout; errors as negative HR_E* codes in an hr_err.
 * docs/planner.md explains the measurements, the formulas and the solvers.
 */
#ifndef HEARTH_PLAN_H
#define HEARTH_PLAN_H

#include "base/base.h"
#include "cluster/cluster.h"
#include "mem/mem.h"
#include "model/model.h"

#define HPL_MAX_TYPES   10   /* weight types a profile holds speeds for */
#define HPL_MAX_DEVICES 16
#define HPL_TICK_DEFAULT_MS 4.0   /* CONFIG_HZ 250, Debian's kernels */
#define HPL_CPU_PERIOD_DEFAULT_MS 100.0   /* the kernel's default CFS period (cgroup v1 and v2) */   /* devices a plan considers (the head and up to 15 workers) */
/* the loss probe's defaults (docs/planner.md, "Loss"): 400 datagrams each way resolve 1% (8 +- 3 lost)
   in 0.1 s of sending plus a few RTTs of waiting per link; small datagrams, so that the probe itself
   does not congest a slow link */
#define HPL_LOSS_COUNT       400
#define HPL_LOSS_INTERVAL_US 250
#define HPL_LOSS_ELEMS       64

/* ---- device profile -------------------------------------------------------------------------------- */
typedef struct hpl_type_speed {
    int    type;         /* hq_type */
    double matvec_gbps;  /* decode: weight bytes read per second (1e9), one activation row */
    double matmul_gbps;  /* prefill: weight bytes x activation rows per second (1e9), HPL_MATMUL_ROWS rows */
    /* the same with the kernels a device runs on the file's layout, as it computes from the mapping (a
       device that streams, or runs on plain mmap, never repacks): below the two above for the types that
       pack (Q4_0, Q8_0; with AVX-512 the K types), the same for the others; 0: not measured (a profile
       saved before session 27), costed as the packed speeds */
    double matvec_map_gbps, matmul_map_gbps;
} hpl_type_speed;
#define HPL_MATMUL_ROWS 32
/* a streaming device's loader spends this many times the CPU per byte of the profile's cold read
   (disk_cpu_ms_gb), inside the device's quota (cost.c, hpl_loader_ms) */
#define HPL_LOADER_CPU_X 2.6

typedef struct hpl_device {
    char     name[80];
    int      n_threads;
    double   cpu_quota;       /* cores the cgroup grants (cpu.max / cfs_quota); 0 = no limit */
    double   cpu_period_ms;   /* the quota's CFS period: cpu_quota x period of CPU time per period (0: none
                                 or unknown, costed as HPL_CPU_PERIOD_DEFAULT_MS; docs/planner.md, "CPU quotas") */
    double   tick_ms;         /* the kernel's scheduler tick (1000 / CONFIG_HZ), which is when a quota is enforced
                                 (0: unknown, costed as HPL_TICK_DEFAULT_MS) */
    uint64_t mem_total;       /* MemTotal */
    uint64_t mem_available;   /* MemAvailable when profiled (not cached: read every time) */
    uint64_t mem_limit;       /* the tightest of the cgroup limit and TESTBED_MEM_LIMIT; 0 = none */
    uint64_t mem_usable;      /* the smallest of MemAvailable and mem_limit */
    uint64_t budget;          /* what its residency manager will use: --mem-budget, else 80% of mem_usable */
    bool     budget_set;      /* --mem-budget was given (a budget that cannot work is then an error; the
                                 default one falls back to plain mmap) */
    double   mem_bw_gbps;     /* streaming read bandwidth, all threads */
    double   disk_gbps;       /* cold read of the disk holding its weights; 0 unknown */
    double   disk_cpu_ms_gb;  /* the CPU time that cold read took per GB (the page cache's work: readahead,
                                 mapping, eviction), which a streaming device's loader spends inside its
                                 quota beside the compute; 0 unknown (saved before session 28: not costed) */
    char     disk_id[64];     /* that disk, as "boot id/major:minor" (read fresh, not cached): devices with the
                                 same id read from one disk and share its throughput (two workers on one machine,
                                 the testbed's devices); "" unknown */
    int      n_types;
    hpl_type_speed ts[HPL_MAX_TYPES];
    bool     cached;          /* the speeds came from the cache */
    double   profile_ms;      /* time the profile took */
} hpl_device;

typedef struct hpl_profile_params {
    int         n_threads;    /* 0: physical cores */
    const char *disk_path;    /* a file or folder on the disk the weights are read from (NULL: the cache folder) */
    const char *cache_path;   /* the cache file; NULL: $XDG_CACHE_HOME/hearth/profile.json (or ~/.cache/...) */
    bool        no_cache;     /* measure again (the result is still written) */
    int         bench_ms;     /* per measurement (default 90: three runs of 30 ms at most) */
    uint32_t    types;        /* the weight types to measure, bit (1 << hq type id): the model's
                                 (hpl_model_types); 0: the standard set (F16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K).
                                 Types the cache holds are not measured again (unless no_cache) */
    hmem_request mem;         /* the memory flags the device runs with (its budget) */
} hpl_profile_params;
hpl_profile_params hpl_profile_default_params(void);

/* Measures this device, or reads its figures from the cache when the cache key (docs/planner.md)
   matches; the memory figures are read fresh every time. */
int hpl_profile_self(const hpl_profile_params *p, hpl_device *out, hr_err *err);
/* The file `name` in the profile cache's folder (p->cache_path's, or the default's): the link cache. */
int hpl_cache_file(const hpl_profile_params *p, const char *name, char *buf, size_t cap, hr_err *err);
/* Writes root to file under a private name, then renames it: no reader ever sees half a file (a cache:
   failures are ignored). */
struct json_t;
void hpl_json_save(const char *file, struct json_t *root);
/* The cache key of this device for n_threads and the disk of disk_path (what invalidates a profile). */
int hpl_profile_key(int n_threads, const char *disk_path, char *buf, size_t cap, hr_err *err);
/* The speed of `type` (matvec or matmul), GB/s, from weights loaded into memory (packed where the type
   packs) or, mapped, from the file's mapping; a type that was not measured: Q8_0's byte rate. */
double hpl_speed(const hpl_device *d, int type, bool matmul, bool mapped);

/* The device as PROFILE key/values and back (a worker's answer to HN_PROFILE_DEVICE). */
int hpl_device_to_kv(const hpl_device *d, hc_kv_text *out);
int hpl_device_from_kv(const hn_profile *p, hpl_device *out, hr_err *err);
/* JSON object text of a device (jansson; caller frees) */
char *hpl_device_json(const hpl_device *d);

/* The worker's hook (hc_worker_params.profile): hpl_profile_self with the defaults, as key/values. */
int hpl_worker_profile(void *user, int n_threads, const char *disk_dir, const hmem_request *mem, bool fresh, uint32_t types,
                       hc_kv_text *out, hr_err *err);

/* CPU quota of this process's cgroup in cores (cgroup v2 cpu.max, v1 cpu.cfs_quota_us / period), the
   tightest along the path to the root; 0 = none. Parsers exposed for tests. */
double hpl_cpu_quota(void);
double hpl_parse_cpu_max(const char *text);            /* "50000 100000" -> 0.5; "max 100000" -> 0 */

/* ---- the cluster as measured -------------------------------------------------------------------------- */
typedef struct hpl_link {
    double rtt_ms;        /* median round trip of a small message */
    double gbps;          /* throughput, 1e9 bytes/s */
    bool   estimated;     /* not measured (a worker <-> worker link a worker could not measure: from the two
                             devices' links to the head) */
    double loss;          /* datagram loss rate, 0..1, both directions pooled (LOSS_PROBE; docs/planner.md, "Loss") */
    double loss_to, loss_from; /* link[a][b]: of datagrams a -> b, and b -> a */
    int    loss_samples;  /* datagrams that measured it (both directions); 0: not measured (worker <-> worker:
                             estimated from the two devices' links to the head; or no probe) */
    double gbps_measured; /* what the throughput probe measured; gbps is more where that was TCP's loss-limited
                             rate (hpl_links_unlimit) */
    bool   cached;        /* the throughput (and a worker <-> worker link's RTT) from the link cache: the RTT
                             measured now matched the cached one (links.c, docs/planner.md "Link cache") */
} hpl_link;

typedef struct hpl_cluster {
    int        n;                                  /* devices, the head first */
    char       addr[HPL_MAX_DEVICES][64];          /* "head" or HOST:PORT */
    hpl_device dev[HPL_MAX_DEVICES];
    hpl_link   link[HPL_MAX_DEVICES][HPL_MAX_DEVICES];
    double     profile_ms;                          /* wall time of the whole profile */
    int        failed;                              /* the worker (1..) whose failure ended the profile, 0: none */
} hpl_cluster;

typedef struct hpl_cluster_params {
    hpl_profile_params self;   /* the head's own profile */
    int timeout_ms;            /* per message (default 20000: a worker may be measuring itself) */
    int n_pings;               /* RTT samples per link (default 9) */
    uint32_t probe_bytes;      /* throughput message size (default 4 MiB) */
    bool peer_links;           /* measure worker <-> worker links too (LINK_PROBE; default true) */
    bool serial;               /* the devices measure themselves one after another, not at once: for
                                  "devices" that share a machine's cores (tools/testbed) */
    const hn_key *key;         /* the cluster key (docs/security.md); NULL: plaintext */
    int loss_count;            /* loss probe datagrams per head <-> worker link (default 400; 0: no probe) */
    int loss_interval_us;      /* their pacing (default 250: 0.1 s a link) */
    uint64_t loss_drop_seed;   /* test hook (HEARTH_LOSSY_DROP): the probes are dropped with this rate too */
    uint32_t loss_drop_ppm;
} hpl_cluster_params;
hpl_cluster_params hpl_cluster_default_params(void);

/* Sets link a -> b to l and b -> a to the same link seen from b's end (its loss directions swapped). */
void hpl_link_both(hpl_cluster *c, int a, int b, hpl_link l);

/* The devices and links of a saved cluster: `hearth plan --json`'s output ("devices", "links"), read and
   checked (every device's memory, threads, quota and speeds; a link between every two devices); nothing is
   measured. For costing plans again with another model, context or cost model (`hearth plan --cluster`). */
int hpl_cluster_read(const char *path, hpl_cluster *out, hr_err *err);

/* Connects to the workers, asks each for its device profile (they measure at the same time as the
   head), measures every head <-> worker link and says BYE; then asks worker a to measure its link
   to each worker b > a (kept as an estimate, with a warning, where that fails). */
int hpl_cluster_profile(const char *const *workers, int n_workers, const hpl_cluster_params *p, hpl_cluster *out,
                        hr_err *err);

/* ---- the model, as the cost model sees it ------------------------------------------------------------- */
#define HPL_MAX_LAYERS 512
typedef struct hpl_model {
    char     name[128];
    int      n_layer, n_embd, n_vocab, n_ctx, n_batch;
    int      n_types;
    int      type[HPL_MAX_TYPES];
    double   layer_bytes_of[HPL_MAX_TYPES];  /* per layer (average), bytes of each type */
    double   layer_bytes;                    /* per layer, all types */
    double   block_max_bytes;                /* the largest block (attention or FFN half of a layer) */
    double   attn_bytes, ffn_bytes;          /* per layer (average): its attention and FFN blocks */
    double   attn_bytes_of[HPL_MAX_LAYERS],  /* each layer's: their sizes differ (Q4_K_M gives some layers Q6_K), */
             ffn_bytes_of[HPL_MAX_LAYERS];   /* which changes the blocks the residency manager pins; 0: unknown,
                                                the averages (layers past HPL_MAX_LAYERS, hand-made models) */
    int      out_type;
    double   out_bytes;                      /* output norm + head */
    int      out_parts;                      /* the blocks the residency manager streams it as (hm_output_parts);
                                                0 or 1: one */
    double   embd_bytes;                     /* token_embd (not read whole per token; counted in memory only
                                                when tied, as the output head) */
    double   kv_bytes_per_layer;             /* K + V at n_ctx */
    double   scratch_bytes;                  /* the context's scratch (beyond the KV cache), on every device: its
                                                batches are at most min(n_batch, n_ctx) tokens, which the head
                                                sends the workers (src/cluster/head.c) and the estimate counts */
} hpl_model;

/* The blocked ms of one pass of a device whose residency manager streams (cost.c, the loader played out):
   n blocks in execution order of bytes[i] each, pinned or streamed, computing compute_ms[i] and then idle
   gap_ms[i] (the rest of the ring); room: the bytes of streamed blocks that may be resident at once (the
   manager's room), ms_per_byte: the disk. -1: out of memory. */
double hpl_stream_blocked(int n, const double *bytes, const bool *pinned, const double *compute_ms, const double *gap_ms,
                          double room, double ms_per_byte);

/* From a loaded model (weights not needed) and the context the run will use. */
int hpl_model_from(const hm_model *m, const hm_ctx_params *cp, hpl_model *out, hr_err *err);
/* The weight types the model's layers and output head use, as hpl_profile_params.types. */
uint32_t hpl_model_types(const hpl_model *m);

/* ---- plans and their cost ----------------------------------------------------------------------------- */
enum hpl_kind { HPL_SINGLE = 0, HPL_TP = 1, HPL_PP = 2, HPL_HYBRID = 3 };
const char *hpl_kind_name(int kind);   /* "single", "tp", "pp", "hybrid" */

typedef struct hpl_dev_cost {
    int    dev;              /* index in the cluster */
    double share;            /* TP: fraction of every layer's units */
    int    layers;           /* layers it runs (PP: of all its windows; TP/single: all) */
    int    window;           /* PP: window size */
    double compute_ms;       /* per token, its own compute (head: with the output head) */
    double stream_ms;        /* per token, reading its streamed weights from disk */
    double blocked_ms;       /* per token, compute blocked on weights (what the prefetch does not hide) */
    double resident_bytes;   /* weights kept in memory */
    double stream_bytes;     /* weights read from disk per token */
    double kv_bytes, scratch_bytes;
    double mem_bytes;        /* resident + kv + scratch (+ the loader's room when streaming) */
    bool   mmap;             /* no residency manager (the default budget cannot hold the KV cache, the
                                scratch and the largest block): plain mmap, the kernel pages */
    double budget;           /* its budget */
} hpl_dev_cost;

typedef struct hpl_plan {
    int    kind;                        /* enum hpl_kind */
    int    n;                           /* devices used */
    int    dev[HPL_MAX_DEVICES];        /* their cluster indices, the head (0) first */
    double share[HPL_MAX_DEVICES];      /* TP; hybrid: of the group's members in their order, share[0..group) */
    int    window[HPL_MAX_DEVICES];     /* PP; hybrid: one per stage, window[0..n - group + 1) */
    int    trips;                       /* PP, hybrid: trips round the ring */
    int    group;                       /* hybrid: devices of the one stage that is a tensor-parallel group
                                           (cluster/cluster.h, n_stages); every other device a stage */
    int    gstage;                      /* hybrid: that stage; its members are dev[gstage..gstage + group), led
                                           by dev[gstage] (0: the head's group; > 0: a worker-led group, every
                                           stage before it one device) */
    /* predictions */
    bool   feasible;
    char   why[256];                    /* when not feasible: what is missing */
    double ms_per_token;
    double compute_ms, comm_ms, blocked_ms, head_extra_ms;  /* its parts */
    double shared_disk_ms;              /* in blocked_ms: what devices that share a disk wait beyond their own
                                           streaming (the disk reads all their streamed bytes in turn; 0: none) */
    double quota_ms;                    /* in compute_ms: what CPU quotas change against every device computing at its
                                           quota-bound rate throughout (a device idle part of a token computes in
                                           bursts; docs/planner.md, "CPU quotas"), usually < 0 */
    double prefill_ms;                  /* for hpl_cost's n_prompt tokens */
    int    n_messages;                  /* per token, on the network */
    /* lossy links (issue 28; docs/planner.md, "Loss"): lossy is TP with the lossy all-reduce (`--lossy`,
       UDP partials with a deadline); the figures are per token and in comm_ms already */
    bool   lossy;
    double deadline_ms;                 /* lossy: the head's deadline (0: HPL_LOSSY_DEADLINE_MS) */
    double loss_ms;                     /* expected time lost to loss: TCP's recoveries; lossy: layer 0's and the
                                           hops' TCP recoveries, the way back's NACK round trips, deadline waits */
    double p_hit;                       /* TP: probability that an all-reduce over TCP meets a lost segment */
    double elements_lost;               /* lossy: expected elements lost per all-reduce (of (n-1) x n_embd) */
    double lost_fraction;               /* lossy: elements_lost / ((n-1) x n_embd) */
    hpl_dev_cost dc[HPL_MAX_DEVICES];
} hpl_plan;

/* the first device of c whose weights are on device i's disk (disk_id), i itself when it is the first;
   -1 when i's disk is unknown */
int hpl_disk_first(const hpl_cluster *c, int i);
/* Predicts decode ms/token, prefill ms for n_prompt tokens and every device's memory. Sets feasible
   (false with why when a device's KV cache and scratch do not fit its budget). */
int hpl_cost(const hpl_cluster *c, const hpl_model *m, int n_prompt, hpl_plan *p, hr_err *err);
/* The CFS bandwidth model of the cost model (docs/planner.md, "CPU quotas"), for tests: the wall time of cpu_ms of
   CPU at one thread under a quota of q cores per period_ms, enforced at ticks of tick_ms, on a device that has
   not run before, starting `start` ms after a period began (its ticks at multiples of tick_ms from there). */
double hpl_quota_burst_ms(double q, double period_ms, double tick_ms, double start, double cpu_ms);

/* ---- solvers -------------------------------------------------------------------------------------------- */
/* Min-max shares (HALO): for the devices p->dev[0..n), shares minimising the slowest device's time per
   block, under their budgets (a share beyond its memory streams). Writes p->share. */
int hpl_solve_tp(const hpl_cluster *c, const hpl_model *m, hpl_plan *p, hr_err *err);
/* Device i's (index into p->dev) time per token for share x: compute and unhidden streaming (ms;
   INFINITY when its KV cache and scratch do not fit). */
double hpl_tp_dev_time(const hpl_cluster *c, const hpl_model *m, const hpl_plan *p, int i, double x);
/* The slowest device's time per token for shares x (ms): the min-max objective (tests). */
double hpl_tp_objective(const hpl_cluster *c, const hpl_model *m, const hpl_plan *p, const double *x);

/* Piped ring (Halda-style): for p->dev[0..n) and `trips` trips, the window sizes minimising the ILP's
   token time (GLPK). HR_ERANGE when no window set fits the budgets. Writes p->window, p->trips and
   *objective (ms) if not NULL. */
int hpl_solve_pp_trips(const hpl_cluster *c, const hpl_model *m, hpl_plan *p, int trips, double *objective, hr_err *err);
/* The ILP's objective for given windows (the same linear model, evaluated; tests compare it with the
   solver's optimum). Returns a negative value when the windows break a constraint. */
double hpl_pp_objective(const hpl_cluster *c, const hpl_model *m, const hpl_plan *p, int trips);
/* Every trip count; the best by hpl_cost. */
int hpl_solve_pp(const hpl_cluster *c, const hpl_model *m, int n_prompt, hpl_plan *p, hr_err *err);
/* Hybrid (p->kind HPL_HYBRID, p->dev, p->group, p->gstage set): for every trip count, the windows of the
   pipeline ILP with the group as one virtual device at its stage (its members' speeds, budgets and disks
   summed, each layer's two all-reduces inside the group, around its leader, added to its time per
   layer), then min-max shares inside the group for its layers; the best by hpl_cost. Infeasible (why)
   when nothing fits. */
int hpl_solve_hybrid(const hpl_cluster *c, const hpl_model *m, int n_prompt, hpl_plan *p, hr_err *err);

#define HPL_MAX_CANDIDATES 192
typedef struct hpl_choice {
    int      n;
    hpl_plan cand[HPL_MAX_CANDIDATES];
    int      chosen;                 /* index of the fastest feasible candidate; -1 when none is */
    char     why[768];               /* the deciding numbers, or what is missing */
} hpl_choice;
/* Every candidate (one device; TP, PP and hybrid over the head plus each subset of the workers, or
   prefixes of them by speed for many workers — hybrid: the head's group the head and the g-1 workers of
   the subset with the fastest links to it, for every g that leaves a stage after it; and, for a subset
   of two workers or more, a worker-led group of the pair with the fastest link between them, the head
   and the other workers a stage each), costed; the fastest feasible one chosen. */
int hpl_choose(const hpl_cluster *c, const hpl_model *m, int n_prompt, hpl_choice *out, hr_err *err);
/* The fastest feasible candidate of `kind` (TP: exact, not lossy); -1 when there is none. */
int hpl_best_of_kind(const hpl_choice *ch, int kind);

/* The neighbours of a pipeline, hybrid or TP plan p, each costed by hpl_cost, the feasible ones into
   out[0..cap): one layer moved from one stage to another (a worker's stage keeps one at least, the head's
   may have none), and the windows halved (twice the trips; every window even) or doubled (half the trips;
   p has two or more). What `--plan-trial` measures beside the candidates (src/cli/trial.c): the sweeps'
   fastest plans were often one such step from the prediction's choice, closer than the cost model's error.
   A TP plan's: the head's share 0.1 and 0.2 larger and 0.1 smaller, the workers' scaled in proportion
   (each member keeps 1/64 at least). The count; 0 for other kinds. */
#define HPL_MAX_NEIGHBOURS (HPL_MAX_DEVICES * HPL_MAX_DEVICES + 2)
int hpl_neighbours(const hpl_cluster *c, const hpl_model *m, int n_prompt, const hpl_plan *p, hpl_plan *out, int cap);

/* The plan a user gave with `hearth run`'s plan flags (hp: pp, shares, windows, stages, lossy) over every
   device of c, in c's order (the head, then the workers as --workers lists them), laid out by
   hc_layout_make — the head's own checks and messages — and costed by hpl_cost (feasible false with why
   when it does not fit). m: the model (its unit groups); --tp-shares auto weighs the devices by their
   profiled matvec speed over the model's layer types. Hybrid plans: the head's group, then one device per
   stage (what the cost model prices; HR_EUNSUPPORTED otherwise). */
int hpl_plan_given(const hpl_cluster *c, const hpl_model *pm, const hm_model *m, const hc_head_params *hp,
                   int n_prompt, hpl_plan *out, hr_err *err);

/* ---- loss (loss.c; docs/planner.md, "Loss") ------------------------------------------------------------- */
#define HPL_LOSSY_DEADLINE_MS 10.0   /* the lossy all-reduce's default deadline (HALO's) */
#define HPL_LOSSY_MARGIN      0.05   /* lossy TP is chosen only when this much faster than the best exact plan:
                                        it costs quality */
/* TCP's expected recovery time (ms) for one message of `bytes` sent a -> b at the link's loss: a lost
   segment with later ones behind it is recovered in about an RTT (SACK / fast retransmit); a lost tail
   waits for the tail-loss probe or the retransmission timeout (Linux: 200 ms at least) */
double hpl_tcp_recovery_ms(const hpl_cluster *c, int a, int b, double bytes);
/* Adds the expected cost of loss to a costed TP plan (reliable or lossy): p->loss_ms (in comm_ms and
   ms_per_token; prompts' recoveries in prefill_ms), p_hit, elements_lost, lost_fraction */
void hpl_loss_tp(const hpl_cluster *c, const hpl_model *m, int n_prompt, hpl_plan *p);
/* A bulk TCP transfer over a lossy link runs at TCP's loss-limited rate (Mathis et al.: about
   1.22 MSS / (RTT sqrt(p))), not the link's: where the throughput probe measured less than 3 times that
   bound, the link's gbps becomes the best measured among the links that were not so limited (a
   household's links meet at one access point), since the all-reduce's and the pipeline's messages are
   too small to be held to that rate and their losses are costed apart (hpl_tcp_recovery_ms). Keeps
   every measured figure in gbps_measured. Called by hpl_cluster_profile. */
void hpl_links_unlimit(hpl_cluster *c);

/* One line naming a plan: "tp over 3 devices, shares 0.40,0.30,0.30" */
void hpl_plan_describe(const hpl_plan *p, char *buf, size_t cap);

/* ---- importance of unit groups, and their placement on lossy links (issue 28; docs/lossy.md) ------
   Groups are tensor parallelism's indivisible units (hc_plan's att_group KV heads, ff_group neurons).
   An importance file (`hearth calibrate`) holds, per layer, each group's mean contribution norm to
   its block's output over a text: the L2 norm of the group's columns of attn_output / ffn_down times
   its activations, averaged over the tokens. */
typedef struct hpl_importance {
    char     model[128];     /* general.name of the model measured */
    int32_t  n_layer, n_embd;
    int32_t  att_kv, ff;     /* group sizes: KV heads per attention group, neurons per FFN group */
    int32_t  n_groups[2];    /* groups per layer: [0] attention, [1] FFN */
    uint64_t tokens;         /* tokens measured */
    double  *imp[2];         /* [n_layer][n_groups[b]] */
} hpl_importance;
/* Allocates imp[] for the sizes already set; zeroed. */
int  hpl_importance_alloc(hpl_importance *imp, hr_err *err);
void hpl_importance_free(hpl_importance *imp);
/* JSON (format in docs/lossy.md), written atomically; reading checks every field and size. */
int  hpl_importance_write(const hpl_importance *imp, const char *path, hr_err *err);
int  hpl_importance_read(hpl_importance *imp, const char *path, hr_err *err);

/* HALO's Algorithm 3 (PLR-aware ratio-guided scheduler): the devices ordered by loss rate, lowest
   first (ties: lower index first), take the groups ordered by importance, highest first (ties: lower
   index first), count[d] groups each — so the lossiest link carries the least important groups and
   every device still gets the number of groups its share (min-max balanced, hpl_solve_tp) gave it.
   importance[n_groups], loss[n_dev] (0..1; the head's 0), count[n_dev] summing to n_groups; writes
   assign[n_groups] = device. The runtime then permutes each layer's units so that every device's
   groups are one contiguous range (a permutation of heads / neurons is exact: docs/lossy.md). */
int  hpl_place_groups(const double *importance, int32_t n_groups, const double *loss, const int32_t *count, int n_dev,
                      int32_t *assign, hr_err *err);
/* count[n_dev]: n_groups dealt in proportion to weights by largest remainder (ties: lower index). */
int  hpl_group_counts(const double *weights, int n_dev, int32_t n_groups, int32_t *count, hr_err *err);

#endif
