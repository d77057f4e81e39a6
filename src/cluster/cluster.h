/*
 * cluster — the head and worker runtimes that run one model on several devices, by tensor
 * parallelism (every device computes every layer over its share of KV heads and FFN neurons; an
 * all-reduce sums the partial outputs after each block), by a piped-ring pipeline (every device
 * computes whole layers, in windows dealt round the ring of devices), or by both: a hybrid pipeline
 * whose stages are groups that split their layers by units. Prefix: hc_.
 *
 * The head (device 0) is the process the user runs: it alone holds the GGUF, the tokenizer, the
 * embedding, the output head and the sampler, and computes a share too. Workers (`hearth worker`)
 * see only their weight slices (cached per model and share) and hidden states. The engine knows
 * nothing of this: each device runs hm_eval over its shard, whose sync hook is the all-reduce.
 *
 * Ownership and threads: hc_head borrows the model; one thread drives a head. A worker serves one
 * head at a time on hc_worker_serve's thread; hc_worker_stop may be called from any thread.
 * docs/tensor-parallel.md (plan, slices, all-reduce, failures), docs/pipeline.md, docs/protocol.md.
 */
#ifndef HEARTH_CLUSTER_H
#define HEARTH_CLUSTER_H

#include "base/base.h"
#include "gguf/gguf.h"
#include "mem/mem.h"
#include "model/model.h"
#include "net/net.h"

#define HC_MAX_DEVICES 64
#define HC_MAX_MICRO 16
#define HC_MICRO_MAX_BYTES (4u << 20)

/* ---- plan ------------------------------------------------------------------------------------------ */
typedef struct hc_share {
    int32_t kv_begin, kv_end;   /* attention units (KV heads) */
    int32_t ff_begin, ff_end;   /* FFN neurons */
    uint64_t placement;         /* 0: the ranges are the model's units; else the hash of the per-layer group
                                   orders they index into (hc_order: importance-aware placement) */
} hc_share;

typedef struct hc_plan {
    int      n_devices;
    int32_t  att_group;                  /* KV heads per indivisible group */
    int32_t  ff_group;                   /* FFN neurons per indivisible group */
    double   weight[HC_MAX_DEVICES];     /* normalised to sum 1 */
    hc_share dev[HC_MAX_DEVICES];
} hc_plan;

/* An importance-aware placement (docs/lossy.md, "Placement in the runtime"): per layer, the order of its
   attention groups (plan.att_group KV heads each) and FFN groups (plan.ff_group neurons) that the
   shares' ranges index into, so that every device's groups, wherever they lie in the model, are one
   range. order[b][il * n_groups[b] + j] = the model's group at position j of layer il (b 0: attention,
   1: FFN); a permutation of 0..n_groups[b]-1 in every layer. A block's output is a sum over its units,
   so the order changes nothing but which device computes which unit. */
typedef struct hc_order {
    int32_t  n_layer, n_groups[2];
    int32_t *order[2];
    uint64_t hash;              /* of both orders: the shares' placement, in the slice files' key */
} hc_order;
/* Orders the groups of a tensor-parallel plan (whose ranges are then read as positions in the order):
   names[d] is device d ("head", then the worker addresses). Fills order->order[b] (allocated by the
   caller, n_layer x n_groups[b]); 0, or a negative code with err. */
typedef int (*hc_place_fn)(void *user, const hc_plan *plan, const char *const *names, hc_order *order, hr_err *err);

/* Deals the model's units to n devices in proportion to weights (docs/tensor-parallel.md, "The plan"). */
int hc_plan_make(const hm_model *m, const double *weights, int n, hc_plan *out, hr_err *err);
/* Shares from relative device speeds (head first) such that all devices finish a decode step
   together, counting the output norm and head, which only the head runs: with W_L the layers' weight
   bytes, W_O the output head's and S the sum of speeds, the head gets (s_0 (W_L + W_O) / S - W_O) /
   W_L of the layers (at least 0) and the workers the rest in proportion to their speed. *head_frac
   (may be NULL) = W_O / (W_L + W_O). */
int hc_plan_balance(const hm_model *m, const double *speed, int n, double *share, double *head_frac, hr_err *err);

/* Pipeline plan: the windows of every device (head first) and the order the pass runs them in. */
#define HC_MAX_STEPS (HC_MAX_DEVICES * HM_MAX_WINDOWS)
typedef struct hc_pp_plan {
    int       n_devices, n_layer;
    int       n_rounds;                                 /* trips of the hidden state round the ring per pass */
    int       n_win[HC_MAX_DEVICES];
    hm_window win[HC_MAX_DEVICES][HM_MAX_WINDOWS];      /* the head's may include [0,0) and [L,L) */
    int       n_steps;                                  /* windows per pass, all devices */
    uint8_t   step_dev[HC_MAX_STEPS];                   /* who runs the i-th window of a pass */
} hc_pp_plan;
/* Deals windows of sizes[d] layers round the ring (docs/pipeline.md). sizes NULL: one round, even. */
int hc_pp_plan_make(int n_layer, const int *sizes, int k, hc_pp_plan *out, hr_err *err);

/* ---- hashes -------------------------------------------------------------------------------------- */
uint64_t hc_model_hash(const gguf_ctx *g);

/* ---- device benchmark ------------------------------------------------------------------------------ */
/* Q8_0 matrix-vector products over a 32 MiB matrix on n_threads for about ms milliseconds: weight
   bytes read per second (GB/s), the figure decode speed follows. */
double hc_bench_matvec(int n_threads, int ms, hr_err *err);

/* ---- link measurement (the planner; a worker asked by LINK_PROBE) --------------------------------- */
/* A session of its own with a worker, for measuring: HELLO, requests, BYE. */
typedef struct hc_probe_conn {
    hn_conn *conn;
    hn_frame rx;
    uint32_t seq;
} hc_probe_conn;
/* Connects to addr (with key: the handshake first; NULL: plaintext) and says HELLO as `me`. On failure
   the caller still calls hc_probe_close. */
int  hc_probe_open(hc_probe_conn *pc, const char *addr, const hn_key *key, const char *me, int timeout_ms, hr_err *err);
/* Sends m; when want != 0 receives the answer into m (an ERROR becomes the error, with the peer's
   text escaped). */
int  hc_probe_request(hc_probe_conn *pc, hn_msg *m, int want, int timeout_ms, hr_err *err);
int  hc_probe_expect(hc_probe_conn *pc, int want, hn_msg *m, int timeout_ms, hr_err *err);
/* RTT: the median of n_pings empty PROFILE_REQ round trips (ms); throughput: one PROBE of `bytes`
   (<= HN_MAX_PROBE): bytes / (its round trip - RTT), GB/s (0 when bytes is 0). */
int  hc_probe_link(hc_probe_conn *pc, int n_pings, uint32_t bytes, int timeout_ms, double *rtt_ms, double *gbps,
                   hr_err *err);
void hc_probe_close(hc_probe_conn *pc, bool bye);   /* BYE when asked; frees everything */
/* Datagram loss (LOSS_PROBE): the worker sends `count` probe datagrams to a UDP socket of ours, paced
   interval_us apart, and we echo each; from what arrived each way: up (worker -> head), down (head ->
   worker) and the pooled loss (lost / tried, both directions). drop_*: the test hook, on both sides. */
typedef struct hc_loss_params {
    uint32_t count, interval_us, elems, wait_ms;
    uint64_t drop_seed;
    uint32_t drop_ppm;
} hc_loss_params;
typedef struct hc_loss_result {
    uint32_t count, received, echoed;   /* sent by the worker (asked), arrived here, echoes that arrived there */
    uint32_t foreign, duplicate;        /* datagrams here that were not this probe's, or seen already */
    double   up, down, loss;            /* fractions */
} hc_loss_result;
int  hc_probe_loss(hc_probe_conn *pc, const hc_loss_params *lp, int timeout_ms, hc_loss_result *out, hr_err *err);
/* The worker's side of LOSS_PROBE over its head connection: sends the burst (sealed when the session is),
   only to the head's address, counts the echoes; the answer's key/values in kv (vals holds their text). */
int  hc_loss_probe_answer(hn_conn *head, const hn_loss_probe *rq, uint16_t device, hn_kv *kv, char vals[3][24],
                          uint32_t *n_kv, hr_err *err);

/* ---- head ------------------------------------------------------------------------------------------ */
enum hc_allreduce { HC_ALLREDUCE_STAR = 0, HC_ALLREDUCE_RING = 1 };

typedef void (*hc_progress_fn)(void *user, uint64_t done, uint64_t total);
/* Sees every message the head sends, before it is sent (tests: the privacy check). */
typedef void (*hc_send_hook_fn)(void *user, int device, const hn_msg *m);

struct hc_head_params;
/* Re-plans over the devices that remain after a worker left (the caller's planner; recover.c): p
   arrives with the workers that remain (n_workers, workers; none: the head alone) and the old plan
   without the missing devices (shares, windows); the callback may set another plan and use fewer of
   the workers. A negative code (err: why, e.g. the remaining devices cannot hold the model) ends the
   answer with that error. */
typedef int (*hc_replan_fn)(void *user, struct hc_head_params *p, hr_err *err);

typedef struct hc_head_params {
    int         n_workers;                        /* at least one */
    const char *workers[HC_MAX_DEVICES - 1];      /* "HOST:PORT" each */
    bool        shares_auto;                      /* shares from the devices' measured speed */
    int         n_shares;                         /* 0 = equal; else one per device, head first */
    double      shares[HC_MAX_DEVICES];           /* non-negative, at least one positive */
    int   allreduce;         /* enum hc_allreduce */
    int   timeout_ms;        /* deadline of each receive inside a forward pass (plus 20 ms per token of a
                                batch) and of the set-up steps; 0 (default): automatic, 10 s for set-up
                                and until a decode step is timed (plus 1 s per token), then 10 times a
                                decode step, at least 3 s (plus a step per token) (cluster-impl.h,
                                HC_DEADLINE_*) */
    int   bench_ms;          /* auto shares: benchmark time per device (default 300) */
    bool  timings;           /* the caller asked for per-device figures (hc_head_stats) */
    bool  pp;                /* piped-ring pipeline instead of tensor parallelism */
    int   n_windows;                              /* pipeline: 0 = one even round; else one per device */
    int   pp_micro;          /* pipeline: a batch of several sequences goes round the ring as up to this
                                many micro-batches (whole sequences each; 0, 1: one pass), at most
                                HC_MAX_MICRO, and only batches of at most HC_MICRO_MAX_BYTES of hidden
                                states (docs/pipeline.md) */
    int   layer_windows[HC_MAX_DEVICES];          /* window sizes in layers, head first (hybrid: one per stage) */
    /* hybrid (with pp; docs/pipeline.md, "Hybrid plans"): the pipeline's stages are groups of
       consecutive devices, head first: stage s has stage_devs[s] devices. A group runs its stage's
       windows together by tensor parallelism — each device its share of every layer's units (n_shares
       weights, one per device of a group, in device order; 0: equal) with a star all-reduce around
       its first device, the leader (the head, or the worker that the previous stage hands the hidden
       state to, which passes it to its members) — and layer_windows has one size per stage. n_stages
       0: one device per stage (a plain pipeline). */
    int   n_stages;
    int   stage_devs[HC_MAX_DEVICES];
    /* tensor parallel, star: the lossy all-reduce (HALO; docs/lossy.md) — the workers' partials of
       a decoding step travel as UDP datagrams and the head merges what arrived by the deadline */
    bool     lossy;
    int      lossy_deadline_ms;                   /* 0: 10 (HALO's) */
    uint64_t lossy_drop_seed;                     /* test hook (HEARTH_LOSSY_DROP): every device drops */
    uint32_t lossy_drop_ppm;                      /* its outgoing datagrams with this probability (ppm) */
    bool     lossy_dup;                           /* test hook: and sends each of the others twice */
    uint64_t lossy_drop_devices;                  /* test hook: only the devices of these bits (0: all) */
    /* --lossy-protect (docs/lossy.md, "The head protects"): per token and layer the head computes the
       lossy_protect FFN groups of each protected worker's share that a rank lossy_protect_rank predictor
       (0: n_embd / 2, at most 64) ranks largest, and the worker leaves them out; 0: none */
    int32_t  lossy_protect, lossy_protect_rank;
    uint64_t lossy_protect_devices;               /* the protected workers' bits (device index; 0: every worker) */
    /* tensor parallel: importance-aware placement of unit groups (docs/lossy.md); NULL: contiguous */
    hc_place_fn place;       void *place_user;
    /* tensor parallel: the head's share, a slice file in its cache (docs/tensor-parallel.md) */
    const char  *cache_dir;  /* NULL: hc_default_cache_dir() */
    uint64_t     cache_max;  /* bytes the head's slice cache may take, least recently used evicted beyond, as
                                a worker's --cache-max (0: hc_cache_default_max) */
    bool         use_mmap;   /* run it from the file mapping (mem.h: hmem_load_weights) */
    bool         no_repack;  /* load it in the file's layout */
    bool         share_views;/* tests: compute on views of the model's mapping instead (no slice file) */
    /* the head's residency manager (src/mem; workers have their own): over its slice file, or over
       the GGUF (pipeline; views: only when a budget is given) */
    const char  *model_path; /* the GGUF the model was mapped from (needed to manage residency) */
    hmem_request mem;
    hc_progress_fn  progress;  void *progress_user;    /* weight transfer progress (bytes) */
    hc_send_hook_fn send_hook; void *send_hook_user;
    const hn_key *key;         /* the cluster key (borrowed until hc_head_free): every link is encrypted
                                  (docs/security.md); NULL: plaintext */
    /* a worker that leaves (dies, closes, misses a deadline): the head re-plans over the rest, rebuilds
       the caches from the token history and goes on (docs/reliability.md); no_recover: it fails */
    bool         no_recover;
    hc_replan_fn replan;     void *replan_user;        /* NULL: the given plan without the missing devices */
} hc_head_params;
hc_head_params hc_head_default_params(void);

/* The layout a head's plan flags (pp, n_shares / shares_auto, n_windows, n_stages, lossy) describe over k
   devices, the head and k-1 workers: tensor parallelism's unit ranges, or a pipeline's stages (a hybrid
   plan's groups with their ranges) and windows. hc_head_create takes its plan from here, and so does
   `hearth plan`, which costs a given plan without running it: the same checks, the same messages.
   speed[k]: the devices' matvec speeds for --tp-shares auto (NULL: shares_auto is an error). */
typedef struct hc_layout {
    int        k;
    hc_plan    plan;                       /* every device's units (a pipeline's single stages: all) */
    hc_pp_plan pp;                         /* pp: the windows, per stage */
    int        group;                      /* pp: devices of the head's stage (1: the head alone) */
    int        n_stages;                   /* pp: stages */
    uint8_t    stage[HC_MAX_DEVICES];      /* pp: device -> its stage */
    uint8_t    first[HC_MAX_DEVICES];      /* pp: stage -> its first device */
    double     head_frac;                  /* tp, shares from speeds: the output head's part of a token's reads */
} hc_layout;
int hc_layout_make(const hm_model *m, const hc_head_params *p, int k, const double *speed, hc_layout *out, hr_err *err);
/* devices of stage st */
int hc_layout_stage_size(const hc_layout *l, int st);

/* The head: one incarnation of the cluster at a time (head.c), and what rebuilds it when a worker
   leaves (recover.c): it keeps every sequence's tokens as the passes wrote them into the caches, and
   after a failure that a worker caused, plans again over the rest (hc_replan_fn), sets them up and runs
   the history through them before the failed call is made again: the caller sees the results a
   failure-free run gives, and one warning. A worker that fails during set-up leaves the same way. */
typedef struct hc_head hc_head;
/* Connects to the workers, makes the plan, sends the slices they lack, and creates the head's own
   context (cp: n_ctx, n_seq, n_batch, threads, kv_type; the workers use the same n_ctx, n_seq,
   n_batch and kv_type). */
hc_head *hc_head_create(const hm_model *m, const hc_head_params *p, const hm_ctx_params *cp, hr_err *err);
/* hm_eval for the whole cluster: tokens[0..n) at pos0.. -> logits of the last token (or of all). Batches
   larger than a FORWARD allows are split. */
int      hc_head_eval(hc_head *h, const int32_t *tokens, int n, int32_t pos0, float *logits, bool all_logits,
                      hr_err *err);
/* hm_eval for the whole cluster, for a batch of several sequences (continuous batching): b as
   hm_batch takes it (tokens, n <= the cluster's n_batch, pos or pos_of, seq, out, logits, all_logits),
   checked before any device sees it; each token's sequence and position travel in FORWARD. A
   sequence's logits are the bits the same cluster gives it alone (hm_batch). */
int      hc_head_eval_batch(hc_head *h, const hm_batch *b, hr_err *err);
int      hc_head_reset(hc_head *h, int32_t pos, hr_err *err);  /* forget KV positions >= pos everywhere */
/* hm_kv_seq_copy on every device (KV_COPY): a shared prompt prefix is not computed again */
int      hc_head_kv_seq_copy(hc_head *h, int32_t src, int32_t dst, int32_t n, hr_err *err);
/* Asks each worker that left whether it is back (a short HELLO; at most once every 2 s) and, when
   one is, sets the cluster up again with it and replays the history: call it between requests. */
int      hc_head_rejoin(hc_head *h, hr_err *err);
int      hc_head_recoveries(const hc_head *h);   /* times a worker left and the answer went on */
int      hc_head_n_devices(const hc_head *h);    /* devices in use now, the head included */
const char *hc_head_warning(const hc_head *h);  /* the last time a worker left, in words ("" if none did) */
int32_t  hc_head_n_ctx(const hc_head *h);
int32_t  hc_head_n_seq(const hc_head *h);
int32_t  hc_head_n_batch(const hc_head *h);  /* most tokens of one hc_head_eval_batch */
const hc_plan *hc_head_plan(const hc_head *h);
const hc_pp_plan *hc_head_pp_plan(const hc_head *h);            /* NULL unless --pp */
hmem    *hc_head_mem(const hc_head *h);                    /* the head's residency manager or NULL */
uint64_t hc_head_weight_bytes_sent(const hc_head *h);           /* slice bytes sent at create */
uint64_t hc_head_weight_bytes_total(const hc_head *h);          /* slice bytes the workers hold */
uint64_t hc_head_slice_bytes_written(const hc_head *h);         /* into the head's own slice file (0: reused) */
/* Sends BYE to every worker and frees everything. NULL is fine. */
void     hc_head_free(hc_head *h);

/* Run-time figures of one device, summed over forward passes since the previous hc_head_stats. */
typedef struct hc_dev_stats {
    char     name[80];          /* "head" or the worker's address */
    int64_t  evals, tokens;     /* forward passes, tokens in them */
    int64_t  compute_ns;        /* in the forward pass, outside the all-reduce */
    int64_t  wait_ns;           /* in the all-reduce, waiting for peers' data (their compute skew, link
                                   latency and transfer) */
    int64_t  send_ns;           /* in the all-reduce, sending and adding (the head: plus FORWARD) */
    uint64_t bytes_sent, bytes_received; /* on this device's cluster connections */
    int32_t  kv_units, ff_units;/* its share (pipeline: KV heads and neurons of each of its layers) */
    int32_t  n_layers;          /* layers it runs */
    /* weights (residency manager; 0 without one) */
    uint64_t resident_bytes;    /* the device's weight pages in memory now (mincore) */
    uint64_t resident_peak;
    uint64_t budget;            /* its memory budget (0: none) */
    uint64_t stream_bytes;      /* weight bytes it streams per pass (0: all kept) */
    uint64_t room_bytes;        /* what its loader may hold of them at once */
    int64_t  disk_read_bytes;   /* read from storage since the previous stats (-1 unknown) */
    int64_t  weights_wait_ns;   /* compute blocked waiting for weights */
    int64_t  mem_replans;       /* residency plans made again as the KV cache grew (hmem_stats.n_replans) */
    double   pressure;          /* prima.cpp: drop of MemAvailable since the start / MemTotal */
    /* per kind of block (attention, FFN), since the manager started (cumulative): blocks computed, time
       in them, loads by the loader and its time (TPI-LLM Prop. 3-4: t_attn, t_ffn, tau_attn, tau_ffn) */
    int64_t  blk_n[2], blk_compute_ns[2], blk_loads[2], blk_load_ns[2];
    /* the lossy all-reduce (cumulative over the session; docs/lossy.md). A worker's row: the datagrams
       it sent (dropped by the test hook, refused by its kernel) and what the head made of them; the
       head's row: all-reduces merged with datagrams, elements merged as zero (all, and the most in one) */
    uint64_t dg_sent, dg_hook_dropped, dg_send_fail;
    uint64_t dg_received, dg_lost, dg_late, dg_dup, dg_foreign, dg_malformed, dg_auth_failed, elems_lost;
    uint64_t lossy_syncs, elems_lost_max;
    uint64_t settles;           /* the head's: passes whose end waited for a worker behind on a sum, and how long */
    double   settle_ms;
    /* the sum's way back to a worker: RESULT datagrams the head sent it (first time, and again on its
       NACKs), that it received, NACKs it sent */
    uint64_t res_sent, res_resent, res_received, nacks;
    /* hash of every all-reduce sum the device continued from (the same on every device: they agree) */
    uint64_t sum_hash;
} hc_dev_stats;
/* The residency figures of one device's manager into s (takes a sample): resident, peak, budget,
   cumulative disk reads and blocked time, pressure, the block figures. */
void hc_dev_stats_mem(hc_dev_stats *s, hmem *mm);
/* Fills out[0..k) (head first; asks every worker: one round trip each) and restarts the counters.
   Returns k or a negative code. */
int hc_head_stats(hc_head *h, hc_dev_stats *out, int cap, hr_err *err);
/* A table of per-token milliseconds (compute / all-reduce wait / send) for every device. */
void hc_format_stats(const hc_dev_stats *s, int n, char *buf, size_t cap);

/* ---- worker ---------------------------------------------------------------------------------------- */
/* Key/value text a worker sends in its PROFILE (PROFILE_REQ with HN_PROFILE_DEVICE). */
typedef struct hc_kv_text {
    int  n;
    char key[HN_MAX_KV][HN_MAX_KEY];
    char val[HN_MAX_KV][HN_MAX_VALUE];
} hc_kv_text;
/* Describes this device into out (src/plan's profiler; cached by it): n_threads the worker's threads,
   disk_dir where its weights live (its slice cache), mem the budget it was started with; fresh: measure
   again rather than read the cache (PROFILE_REQ with HN_PROFILE_DEVICE | HN_PROFILE_BENCH); types: the
   weight types the head's model uses (hn_profile_req.types; 0: the profiler's standard set). */
typedef int (*hc_profile_fn)(void *user, int n_threads, const char *disk_dir, const hmem_request *mem, bool fresh,
                             uint32_t types, hc_kv_text *out, hr_err *err);

typedef struct hc_worker_params {
    const char *listen;      /* "ADDR:PORT" (port 0 = ephemeral) */
    const char *cache_dir;   /* NULL: hc_default_cache_dir() */
    uint64_t    cache_max;   /* bytes the cache's slice files may take, least recently used evicted beyond
                                (0: no bound of its own; the disk's free-space margin always holds) */
    int         n_threads;   /* 0: physical cores */
    const char *name;        /* shown to heads; NULL: "worker" */
    hmem_request mem;        /* residency manager over the slice file */
    bool        use_mmap;    /* --mmap: run the slice from its file mapping (mem.h: hmem_load_weights) */
    bool        no_repack;   /* --no-repack: load it in the file's layout */
    int         setup_ms;    /* a head that has said HELLO must have sent its plan by then (and each
                                message until it is loaded within it); else the session is dropped */
    hc_profile_fn profile;   /* answers PROFILE_REQ with HN_PROFILE_DEVICE; NULL: such a request is refused */
    void         *profile_user;
    const hn_key *key;       /* the cluster key (copied): every connection must begin with the handshake, and
                                the worker's own links (ring, LINK_PROBE) make one; NULL: plaintext only */
} hc_worker_params;
hc_worker_params hc_worker_default_params(void);

/* $XDG_CACHE_HOME/hearth/slices, else $HOME/.cache/hearth/slices */
int hc_default_cache_dir(char *buf, size_t cap, hr_err *err);

typedef struct hc_worker hc_worker;
hc_worker *hc_worker_create(const hc_worker_params *p, hr_err *err);
uint16_t   hc_worker_port(const hc_worker *w);
/* Serves heads one after another until hc_worker_stop (or max_sessions > 0 of them). A session or a
   connection that fails is logged and ended; the worker goes on (0). */
int        hc_worker_serve(hc_worker *w, int max_sessions, hr_err *err);
void       hc_worker_stop(hc_worker *w);
void       hc_worker_free(hc_worker *w);

#endif
