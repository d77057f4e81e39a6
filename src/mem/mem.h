/*
 * mem — the residency manager: which of a shard's weights are in memory, under a memory budget
 * (weights + the ctx's KV cache and scratch). Prefix: hmem_.
 *
 * The weights stay an mmap of the GGUF file; the manager only changes which pages are resident,
 * through the forward pass's weights hook (hm_weights_fn), called around every block (attention or
 * FFN half of a layer, or output). KEEP: everything fits, one MADV_WILLNEED. STREAM: some blocks are
 * pinned, a loader thread prefetches the rest in execution order and releases each after use.
 * OBSERVE: figures only. Bytes never change: a managed run gives bit-identical logits.
 *
 * Ownership: hmem borrows the model and its mapping, which must outlive it. Threads: the hook runs
 * on hm_eval's thread; the loader thread only advises and touches the mapping.
 * docs/memory.md has the plan, the loader, the figures and the measurements.
 */
#ifndef HEARTH_MEM_H
#define HEARTH_MEM_H

#include "base/base.h"
#include "model/model.h"

/* ---- system memory ------------------------------------------------------------------------------- */
typedef struct hmem_sysmem {
    uint64_t mem_total;      /* /proc/meminfo MemTotal, bytes */
    uint64_t mem_available;  /* MemAvailable */
    uint64_t cgroup_limit;   /* tightest memory limit of this process's cgroup and its ancestors (v1
                                memory.limit_in_bytes or v2 memory.max); 0 = none */
    uint64_t cgroup_usage;   /* that cgroup's usage (page cache included); 0 if unknown */
    uint64_t env_limit;      /* TESTBED_MEM_LIMIT (set by tools/testbed exec); 0 = unset */
} hmem_sysmem;

/* Reads /proc/meminfo, the cgroup files and the environment. Missing cgroup files are not errors. */
int hmem_sysmem_read(hmem_sysmem *out, hr_err *err);
/* MemTotal and MemAvailable from /proc/meminfo (cheap: for per-token samples). */
int hmem_read_meminfo(uint64_t *total, uint64_t *available);
/* Parses /proc/meminfo text: MemTotal and MemAvailable in bytes. HR_EFORMAT if either is missing. */
int hmem_parse_meminfo(const char *text, uint64_t *total, uint64_t *available);

#define HMEM_DEFAULT_FRACTION 0.8
/* The default budget: HMEM_DEFAULT_FRACTION of the smallest of MemAvailable, the cgroup limit and
   TESTBED_MEM_LIMIT (/proc/meminfo shows the whole machine inside a cgroup). */
uint64_t hmem_default_budget(const hmem_sysmem *s);

/* A context's KV cache and scratch are written, not paged in from the model file, so they must fit
   the memory there is: HR_ENOMEM, with the figures, when ctx_bytes exceed the smallest of
   MemAvailable, the cgroup limit and TESTBED_MEM_LIMIT (what an -c or -d that cannot be met would
   otherwise meet as the OOM killer, partway through zeroing the cache); 0 when they fit or the
   figures cannot be read. */
int hmem_check_ctx(uint64_t ctx_bytes, hr_err *err);

/* Bytes this process has caused to be read from storage (/proc/self/io read_bytes); -1 if unknown. */
int64_t hmem_proc_read_bytes(void);

/* ---- parameters and plan ------------------------------------------------------------------------- */
typedef enum hmem_mode {
    HMEM_AUTO = 0,     /* KEEP if the shard's weights + ctx_bytes fit the budget, else STREAM */
    HMEM_KEEP = 1,
    HMEM_STREAM = 2,   /* stream even when everything would fit (pins then take what fits) */
    HMEM_OBSERVE = 3,  /* manage nothing; figures only */
    HMEM_MODE_COUNT
} hmem_mode;

typedef enum hmem_pin {
    HMEM_PIN_SPREAD = 0,  /* blocks of any kind, spread evenly over the execution order */
    HMEM_PIN_FFN = 1,     /* TPI-LLM's choice: FFN blocks only, every T-th */
    HMEM_PIN_NONE = 2,    /* stream every block */
    HMEM_PIN_RUN = 3,     /* the default: one run of blocks from the first on, so what streams is one
                             stretch of the file, which the kernel reads fastest (docs/memory.md:
                             14-40% fewer ms/token than SPREAD at 50% of a 1B model); replaced by the
                             best pins (hmem_pin_best) where those stream clearly fewer bytes */
    HMEM_PIN_COUNT
} hmem_pin;

typedef struct hmem_params {
    hmem_mode mode;       /* default AUTO */
    uint64_t  budget;     /* bytes for resident weights + ctx_bytes; 0 = hmem_default_budget() */
    int32_t   window;     /* room kept for at least this many streamed blocks (the largest), the
                             computing one included; >= 1, default 2 (TPI-LLM's default). Shrunk
                             (with a warning) if the budget cannot hold that many */
    hmem_pin  pin;        /* default RUN */
    uint64_t  ctx_bytes;  /* KV cache + scratch of the ctx (hm_ctx_bytes_estimate); counts against budget */
    /* LIME's online KV adaptation (docs/memory.md, "The KV cache grows into the budget"): with n_ctx > 0, a
       plan that streams counts the KV cache only up to the positions in use (rounded up to a step of
       n_ctx / HMEM_KV_STEPS), pins what that leaves room for, and is made again, demoting pins, when
       the positions in use pass it (hmem_set_positions). 0: the whole of ctx_bytes from the start. */
    int32_t   n_ctx;          /* positions the KV cache holds */
    uint64_t  ctx_base_bytes; /* ctx_bytes with no positions in use (the scratch); <= ctx_bytes */
    bool      prefetch;   /* STREAM: load ahead of compute (default). false: load a block only when compute
                             reaches it, still releasing used ones (the ablation of prima.cpp's prefetch) */
} hmem_params;
hmem_params hmem_default_params(void);

typedef struct hmem_plan {
    hmem_mode mode;           /* resolved: KEEP, STREAM or OBSERVE */
    int32_t   window;         /* effective window (STREAM) */
    int32_t   n_blocks, n_pinned;
    uint64_t  budget;         /* resolved budget */
    uint64_t  ctx_bytes;
    uint64_t  weight_bytes;   /* all blocks, page-rounded */
    uint64_t  pinned_bytes;   /* resident for good */
    uint64_t  stream_bytes;   /* read once per pass (= per token) when streaming */
    uint64_t  window_bytes;   /* room the plan keeps for streaming: the `window` largest streamed blocks */
    uint64_t  room_bytes;     /* what the loader may fill with streamed blocks at run time: budget -
                                 slack_bytes - ctx_bytes - pinned_bytes (>= window_bytes) */
    uint64_t  slack_bytes;    /* STREAM (set by hmem_create): kept free for what the kernel reads beyond
                                 the loader's requests — twice the file's readahead, at most 1/8 of
                                 the budget and never more than leaves room for the largest block */
    uint64_t  largest_bytes;  /* the largest block: a budget needs at least ctx_bytes + this to stream */
    int32_t   pos_room;       /* positions of the KV cache the plan leaves room for (ctx_bytes counts them);
                                 0: the whole context (not adapting) */
} hmem_plan;

#define HMEM_KV_STEPS 8
/* Bytes of the ctx (KV + scratch) with n_pos positions in use: ctx_base_bytes plus n_pos/n_ctx of
   the KV cache (rounded up); ctx_bytes when p does not adapt. */
uint64_t hmem_ctx_bytes_at(const hmem_params *p, int32_t n_pos);
/* The positions a plan made with n_pos in use leaves room for: n_pos + 1 rounded up to a step of
   n_ctx / HMEM_KV_STEPS, at most n_ctx; 0 when p does not adapt. A plan must be made again once
   the positions in use exceed it. */
int32_t hmem_plan_positions(const hmem_params *p, int32_t n_pos);
/* hmem_plan_make for a ctx with n_pos positions in use: the plan for the whole context first (KEEP
   if everything fits even then, and the error if the budget can never hold the whole cache beside
   the largest block); when that streams and p adapts, the plan for hmem_plan_positions(n_pos):
   every block pinned (AUTO) if they fit beside that much of the cache, else hmem_plan_make's. */
int hmem_plan_at(const uint64_t *bytes, const uint8_t *kinds, int n, const hmem_params *p, uint64_t budget,
                 int32_t n_pos, bool *pinned, hmem_plan *out, hr_err *err);

/* The pins that stream the fewest bytes (LIME's offload allocator, lime.txt §IV, under the cost model of
   docs/memory.md "Pins"): pinned[] maximising the pinned bytes subject to pinned + the w largest
   streamed blocks <= avail. Exact: blocks of one size form a class, and a branch and bound over the
   number pinned per class (largest first; the smallest class takes the most that fit) finds the
   optimum; of a class the first blocks in execution order are pinned. -1 (nothing written) when the
   sizes are so varied that the search would pass 2^20 nodes, or out of memory. */
int hmem_pin_best(const uint64_t *bytes, int n, int w, uint64_t avail, bool *pinned, uint64_t *pinned_bytes);
/* The same over k classes of count[c] blocks of size[c] bytes: pin[c] of each pinned. */
int hmem_pin_best_classes(const uint64_t *size, const int *count, int k, int w, uint64_t avail, int *pin,
                          uint64_t *pinned_bytes);
/* RUN gives way to hmem_pin_best when that streams more than 1/HMEM_PIN_BEST_GAIN fewer bytes */
#define HMEM_PIN_BEST_GAIN 32
/* The loader makes a block resident a chunk at a time, so that a block too big for the room left can
   be loaded in part ahead of time and finished as soon as the block before it is released (the planner's
   cost model plays the loader out in the same steps: src/plan/cost.c, hpl_stream_blocked). */
#define HMEM_CHUNK ((uint64_t)4 << 20)

/* The residency plan for n blocks of the given byte sizes and kinds (enum hm_block) in execution
   order, under budget (resolved, > 0): KEEP when everything fits (or mode is KEEP), else STREAM with
   the window shrunk to fit and then blocks pinned (pinned[i] = true) by p->pin while they fit beside
   the window's room (docs/memory.md, "Stream"). Errors: HR_EINVAL for bad parameters, HR_ERANGE
   (message with the minimum) if the budget cannot hold ctx_bytes and the largest block. */
int hmem_plan_make(const uint64_t *bytes, const uint8_t *kinds, int n, const hmem_params *p, uint64_t budget,
                   bool *pinned, hmem_plan *out, hr_err *err);

/* ---- the manager --------------------------------------------------------------------------------- */
typedef struct hmem hmem;

/* Plans residency for `shard` of m (NULL: the whole model), whose GGUF was opened (gguf_open, i.e.
   mmap'd) from `path`; checks that m's mapping really is that file (a heap buffer must never be
   MADV_DONTNEED'd). STREAM starts the loader thread, which begins prefetching at once. */
hmem *hmem_create(const hm_model *m, const hm_shard *shard, const char *path, const hmem_params *p, hr_err *err);
/* Tells the manager how many positions of the KV cache are in use (before an eval that fills them):
   when they pass what the plan left room for, the plan is made again (hmem_plan_at) and the blocks
   it no longer pins become streamed blocks, whose pages the loader releases. Cheap otherwise (one
   comparison). Call between evals, on hm_eval's thread. Errors: those of hmem_plan_at. */
int hmem_set_positions(hmem *h, int32_t n_pos, hr_err *err);
/* Sets shard->weights / weights_user (nothing in OBSERVE mode). Call before hm_ctx_create, which
   copies the shard; the shard must be the one given to hmem_create. */
void hmem_attach(hmem *h, hm_shard *shard);
/* Stops the loader. Leaves residency as it is (the page cache may serve the next run). */
void hmem_free(hmem *h);

const hmem_plan *hmem_get_plan(const hmem *h);

typedef struct hmem_block_stats {  /* per kind of block (enum hm_block) */
    int64_t n_begin;      /* blocks entered */
    int64_t compute_ns;   /* between BEGIN and END: t_attn / t_ffn of TPI-LLM Prop. 3-4 */
    int64_t n_loads;      /* loads done by the loader */
    int64_t load_ns;      /* loader time; / n_loads = tau_attn / tau_ffn */
    int64_t wait_ns;      /* compute thread blocked in BEGIN */
} hmem_block_stats;

typedef struct hmem_stats {
    uint64_t held_bytes;     /* loaded or loading now (pinned + window), own accounting */
    uint64_t held_peak;
    uint64_t loaded_bytes;   /* total bytes made resident by the loader (page-rounded) */
    uint64_t released_bytes;
    int64_t  n_loads, n_releases, n_waits;
    int64_t  wait_ns;        /* total time the hook blocked waiting for a block */
    int64_t  n_errors;       /* failed madvise/fadvise calls (harmless: mmap faults pages in) */
    int64_t  n_replans;      /* plans made again as the KV cache grew (hmem_set_positions) */
    hmem_block_stats kind[3];
    /* from the samples */
    uint64_t mem_total, mem_available_start, mem_available_min;
    double   pressure;       /* (available_start - available_min) / mem_total, >= 0 */
    uint64_t resident_peak;  /* largest sampled resident weight bytes */
    int64_t  disk_read_bytes;/* read_bytes since hmem_create (-1 unknown) */
} hmem_stats;
hmem_stats hmem_get_stats(const hmem *h);

typedef struct hmem_sample {
    int64_t  t_ns;           /* since hmem_create */
    uint64_t resident;       /* bytes of the shard's weight pages in the page cache (mincore) */
    uint64_t held;           /* the manager's own accounting (pinned + window) */
    uint64_t loaded;         /* cumulative bytes loaded */
    int64_t  disk_read;      /* cumulative read_bytes since create (-1 unknown) */
    int64_t  wait_ns;        /* cumulative time blocked */
    uint64_t mem_available;  /* /proc/meminfo */
} hmem_sample;
/* Takes a sample (one mincore pass over the blocks, two small /proc reads), records it and copies it
   to *out if out is not NULL. Call once per token, from one thread. HR_ENOMEM if the history cannot
   grow. */
int hmem_take_sample(hmem *h, hmem_sample *out);
const hmem_sample *hmem_samples(const hmem *h, int *n);

/* What a device's memory flags ask for (--mem-budget, --window, --no-prefetch), as typed values. */
typedef struct hmem_request {
    bool     given;       /* a budget was asked for; if not, the default is tried and, when it cannot be
                             set up, the weights stay plain mmap without an error */
    bool     off;         /* plain mmap: a manager that only observes (the figures) */
    uint64_t bytes;       /* the budget; 0 = hmem_default_budget() */
    int      window;      /* blocks kept loading ahead when streaming; 0 = 2 */
    bool     no_prefetch; /* load a block only when compute reaches it */
} hmem_request;

/* The manager a request asks for, created for `shard` and attached to it (before hm_ctx_create).
   `off` gives an OBSERVE manager (plain mmap; the figures only), or *out = NULL if even that cannot be
   made; *out = NULL and 0 too when the default budget cannot be set up (the weights stay plain mmap);
   a budget given explicitly that cannot work is an error. */
int hmem_setup(const hm_model *m, hm_shard *shard, const char *path, const hmem_request *rq, uint64_t ctx_bytes,
               hmem **out, hr_err *err);
/* hmem_setup with a plan that follows the KV cache's use (hmem_params.n_ctx, .ctx_base_bytes): the
   caller then calls hmem_set_positions before each eval. */
int hmem_setup_kv(const hm_model *m, hm_shard *shard, const char *path, const hmem_request *rq, uint64_t ctx_bytes,
                  uint64_t ctx_base_bytes, int32_t n_ctx, hmem **out, hr_err *err);

/* The weights in memory or in the file mapping: loads the shard's weights into memory of the model's
   own (hm_model_load_weights, packed unless no_repack) when h keeps every block (KEEP), unless
   use_mmap is asked for: a streamed block must stay a mapping of the file, and OBSERVE (--mem-budget
   off) is plain mmap. h may be NULL (no manager): then only if the model fits the default budget.
   Logs what it did. Errors: those of hm_model_load_weights. */
int hmem_load_weights(const hmem *h, hm_model *m, const hm_shard *shard, bool use_mmap, bool no_repack, hr_err *err);

/* One line for logs: "mem: stream, budget 250.0 MiB, window 2, pinned 12/33 blocks (180.2 MiB), ..." */
void hmem_summary(const hmem *h, char *buf, size_t cap);
const char *hmem_mode_name(hmem_mode m);

#endif
