/*
 * model — transformer architectures, their weights, and the forward pass over a *shard*.  Prefix: hm_.
 *
 * A decoder layer is an attention block and an FFN block, each ending in a residual add. hm_eval runs
 * a shard — some of the layers and, under tensor parallelism, a share of each one's heads and neurons
 * — with the token embedding first and the output head last where the shard has them. After each
 * block's output projection it calls the shard's sync hook (a no-op on one device, an all-reduce under
 * tensor parallelism) and knows nothing else about the cluster (docs/design.md).
 * Architectures: llama, qwen2, qwen3. Shards, windows, slice files (a worker's share of a model) and
 * the loaded weights: docs/model.md.
 *
 * Ownership: hm_model borrows tensor data from the gguf_ctx it was loaded from (mmap), which must
 * outlive it, until hm_model_load_weights gives it a copy of its own (freed with it); hm_ctx owns the
 * KV cache and scratch buffers.
 */
#ifndef HEARTH_MODEL_H
#define HEARTH_MODEL_H

#include "base/base.h"
#include "base/pool.h"
#include "gguf/gguf.h"

typedef enum hm_arch { HM_ARCH_LLAMA = 0, HM_ARCH_QWEN2 = 1, HM_ARCH_QWEN3 = 2, HM_ARCH_COUNT } hm_arch;

typedef struct hm_hparams {
    hm_arch arch;
    char    arch_name[32];  /* general.architecture */
    char    name[128];      /* general.name, or "" */
    int32_t n_vocab;
    int32_t n_embd;         /* hidden size */
    int32_t n_layer;
    int32_t n_head;         /* query heads */
    int32_t n_head_kv;      /* key/value heads (GQA: n_head % n_head_kv == 0) */
    int32_t head_dim;       /* key_length if given, else n_embd / n_head */
    int32_t n_ff;           /* FFN hidden size */
    int32_t n_ctx_train;
    float   rms_eps;
    float   rope_base;      /* rope.freq_base */
    bool    rope_neox;      /* rotate halves (qwen) instead of adjacent pairs (llama) */
    bool    has_qkv_bias;   /* qwen2 */
    bool    has_qk_norm;    /* qwen3 */
    bool    tied_output;    /* no output.weight: token_embd is the output head */
    bool    has_rope_freqs; /* Llama-3.1+ rope_freqs.weight scaling factors */
} hm_hparams;

/* Reads and validates hyper-parameters from GGUF metadata (and checks the tensors it implies exist). */
int hm_hparams_load(const gguf_ctx *g, hm_hparams *hp, hr_err *err);

/* ---- hyper-parameters as key/values (hparams.c) --------------------------------------------------
   One table names every stored hyper-parameter with its GGUF key ("<arch>.embedding_length"), its
   LOAD_PLAN key ("n_embd"), its field, type, default (none: required) and bounds; both directions
   walk it. The GGUF forms differ in what a model file tells by its tensors instead (n_vocab, q/k/v
   biases, q/k norms): a slice file stores those as hearth.slice.* keys, a LOAD_PLAN as plain keys.
   Reading checks every bound, GQA divisibility and an even head size, whatever the source, and
   names the key in its errors (a LOAD_PLAN is untrusted input). general.architecture is not in the
   table: the caller passes the arch name (a LOAD_PLAN carries it outside its key/values). */
typedef enum hm_kv_form { HM_KV_MODEL = 0, HM_KV_SLICE = 1, HM_KV_PLAN = 2 } hm_kv_form;
typedef enum hm_kv_type { HM_KV_I32 = 0, HM_KV_F32 = 1, HM_KV_BOOL = 2 } hm_kv_type;
typedef union hm_kv_val { int64_t i; float f; bool b; } hm_kv_val;
/* A store of typed key/values. get: 1 and *v set when key holds a value of that type, 0 when key is
   absent, HR_EFORMAT when it holds something else. set: 0 or a negative HR_E* code. key lives for
   the call only, except in HM_KV_PLAN form where it is a static string. */
typedef struct hm_kv_io {
    hm_kv_form form;
    void      *user;
    int      (*get)(void *user, const char *key, hm_kv_type type, hm_kv_val *v);
    int      (*set)(void *user, const char *key, hm_kv_type type, hm_kv_val v);
} hm_kv_io;

/* Writes every table key of hp (whose arch_name prefixes the GGUF keys) through io->set. */
int hm_hparams_to_kv(const hm_hparams *hp, const hm_kv_io *io, hr_err *err);
/* Reads and validates hp from io->get for architecture arch: table fields, arch, arch_name and
   rope_neox; the rest is zero (in HM_KV_MODEL form the caller fills n_vocab and the tensor flags). */
int hm_hparams_from_kv(hm_hparams *hp, const char *arch, const hm_kv_io *io, hr_err *err);
/* Adapters: GGUF metadata read (form HM_KV_MODEL or HM_KV_SLICE) and written. */
hm_kv_io hm_kv_gguf_reader(const gguf_ctx *g, hm_kv_form form);
hm_kv_io hm_kv_gguf_writer(gguf_writer *w, hm_kv_form form);
/* The text form of a value (LOAD_PLAN): "%lld", "%.9g" (round-trips a float) or "0"/"1". Parsing is
   strict: the whole text, decimal, no sign or space; false on anything else. */
void hm_kv_format(char *buf, size_t cap, hm_kv_type type, hm_kv_val v);
bool hm_kv_parse(const char *s, size_t n, hm_kv_type type, hm_kv_val *v);

/* A 2-D weight: rows of ne0 elements of `type`, row-major; data borrowed. */
typedef struct hm_tensor {
    int         type;      /* hq_type */
    int64_t     ne0;       /* elements per row (input dim) */
    int64_t     ne1;       /* rows (output dim) */
    size_t      row_bytes;
    const void *data;      /* what the kernels read: the file mapping, or the model's copy */
    const void *map;       /* where the bytes lie in the file mapping (= data until loaded) */
    bool        packed;    /* data is in the type's packed layout (docs/quant.md), bands of HQ_BAND rows */
} hm_tensor;

typedef struct hm_layer {
    hm_tensor attn_norm;                   /* [n_embd] F32 */
    hm_tensor wq, wk, wv;                  /* [n_embd] -> [n_head*hd], [n_head_kv*hd], [n_head_kv*hd] */
    hm_tensor bq, bk, bv;                  /* qwen2 biases, F32 (data NULL if absent) */
    hm_tensor q_norm, k_norm;              /* qwen3 per-head RMS norm weights [hd], F32 */
    hm_tensor wo;                          /* [n_head*hd] -> [n_embd] */
    hm_tensor ffn_norm;                    /* [n_embd] F32 */
    hm_tensor w_gate, w_up;                /* [n_embd] -> [n_ff] */
    hm_tensor w_down;                      /* [n_ff] -> [n_embd] */
} hm_layer;

typedef struct hm_model {
    hm_hparams hp;
    hm_tensor  tok_embd;                   /* [n_embd] x n_vocab rows */
    hm_tensor  output_norm;                /* [n_embd] F32 */
    hm_tensor  output;                     /* [n_embd] -> [n_vocab]; = tok_embd when tied */
    hm_tensor  rope_freqs;                 /* [hd/2] F32 or data NULL */
    hm_layer  *layers;                     /* n_layer */
    const gguf_ctx *gguf;                  /* borrowed */
    bool       is_slice;                   /* a slice file (see above): no embedding/output tensors */
    bool       slice_head;                 /* a head's slice file: token_embd, output_norm and output too */
    uint8_t   *has_layer;                  /* [n_layer]: the layer's tensors are in the file; NULL = all */
    int32_t    slice_n_head_kv, slice_n_ff;/* units a slice file holds (0..n_head_kv, 0..n_ff) */
    int64_t    out_part_rows;              /* rows of each part of the output head but the last (hm_output_parts) */
    void      *loaded;                     /* hm_model_load_weights's buffer (anonymous mmap) or NULL */
    size_t     loaded_cap;
} hm_model;

hm_model *hm_model_load(const gguf_ctx *g, hr_err *err);
void      hm_model_free(hm_model *m);
/* bytes of weight data the model maps (all tensors) */
uint64_t  hm_model_weight_bytes(const hm_model *m);

/* Token embedding lookup: out[n][n_embd] = rows tokens[0..n) of token_embd, as F32 (what a first
   shard starts from; a tensor-parallel head sends this, never the ids). HR_EINVAL for an id outside
   the vocabulary or a worker's slice file. */
int       hm_embed(const hm_model *m, const int32_t *tokens, int n, float *out, hr_err *err);

/* ---- shard and sync ------------------------------------------------------------------------------ */
enum hm_block { HM_BLOCK_ATTN = 0, HM_BLOCK_FFN = 1, HM_BLOCK_OUTPUT = 2 /* output norm + head */ };
enum hm_phase { HM_PHASE_BEGIN = 0, HM_PHASE_END = 1 };

/* Called just before a block's weights are used (BEGIN) and right after (END), on the thread that
   calls hm_eval: the residency manager's hook (stream the block in, release it, prefetch the next).
   NULL: weights stay mapped as they are. */
typedef void (*hm_weights_fn)(void *user, int layer, enum hm_block block, enum hm_phase phase);

/* The byte ranges of the mapped file a block reads, for madvise/fadvise: with shard NULL its tensors
   whole; with a (normalized) shard only the rows its share of wq/wk/wv/w_gate/w_up and the biases
   reads, while the column-sliced wo and w_down stay whole (a column range is one piece per row) and
   a block with no units reads only its norm. Writes at most cap ranges; returns the number of ranges
   the block has. HM_BLOCK_OUTPUT: layer = n_layer + k is part k of the output head (hm_output_parts). */
typedef struct hm_range { const void *ptr; size_t len; } hm_range;
struct hm_shard;
int hm_block_ranges(const hm_model *m, const struct hm_shard *shard, int layer, enum hm_block block, hm_range *out,
                    int cap);

/* The output head in parts (docs/memory.md, "The output head in parts"): the forward pass computes it
   part by part, calling the weights hook around each with layer = n_layer + k, so that the residency
   manager can stream it like any other blocks and a head whose budget cannot hold the whole output head
   beside its KV cache still gets a manager (a Q6_K head of a 128k vocabulary is 431 MB: four of an 8B
   model's FFN blocks). Each part is at most the model's largest attention or FFN block (or
   HM_OUTPUT_PART_MIN, for toy models), in rows of whole packed bands; part 0 holds the output norm too.
   hm_output_parts: how many (1 when the head is no larger than that, at most HM_OUTPUT_PARTS_MAX);
   hm_output_part_rows: rows [r[0], r[1]) of part k. */
#define HM_OUTPUT_PARTS_MAX 64
#define HM_OUTPUT_PART_MIN  ((uint64_t)64 << 10)
int  hm_output_parts(const hm_model *m);
void hm_output_part_rows(const hm_model *m, int k, int64_t r[2]);

/* The weights a block reads, whole tensors, where the kernels read them (the loaded copy, or the
   mapping): what hearth bench --roofline streams against a decode step. Same layer/block/cap/return
   conventions as hm_block_ranges. */
int hm_block_weights(const hm_model *m, int layer, enum hm_block block, hr_span *out, int cap);

/* Called after a block's output projection, before the residual add, with x = [n_tokens][n_embd]
   partial outputs; must leave the summed output in x. Return 0 or a negative HR_E* code (the
   forward pass then stops and returns it). */
typedef int (*hm_sync_fn)(void *user, int layer, enum hm_block block, float *x, int n_tokens, int n_embd);

/* Called after a block's output projection, before sync, with the block's normalized input in =
   [n_tokens][n_embd] (rmsnorm(x) * the block's norm weight), the input of its output projection —
   attention: the share's heads' outputs act = [n_tokens][act_dim = query heads x head_dim]; FFN:
   silu(gate) * up, act = [n_tokens][act_dim = the share's neurons] — and its output x = [n_tokens]
   [n_embd], which it may change. What it is for: measuring what each group of units contributes
   (hearth calibrate) and simulating lost all-reduce partials (docs/lossy.md), hm_groups below. NULL
   in every normal run, where it costs one test per block. */
typedef void (*hm_probe_fn)(void *user, int layer, enum hm_block block, const float *in, const float *act,
                            int64_t act_dim, float *x, int n_tokens, int n_embd);
/* An FFN hook (NULL in every normal run): called twice per layer's FFN block of this shard, with its input
   xn [n_tokens][n_embd]: before the down projection (after = false), with the activations act
   [n_tokens][n_ff] it may change (the lossy worker's protected groups, zeroed), and after it (after = true),
   with the block's partial o [n_tokens][n_embd] it may add to (the head's protected groups). */
typedef void (*hm_ffn_fn)(void *user, int layer, bool after, const float *xn, float *act, int64_t n_ff, float *o,
                          int n_tokens);

/* A shard: some layers — one range, or several windows run one hm_eval_window call each — and, for
   tensor parallelism, a share of every layer in it: the attention units [kv_begin, kv_end) (a unit
   is a KV head and its query heads) and the FFN neurons [ff_begin, ff_end), as row and column views
   of the tensors. Its block outputs are then partial sums, which sync adds up across the shards.
   kv_end / ff_end < 0 mean "to the end". The rules (empty shares, windows): docs/model.md. */
#define HM_MAX_WINDOWS 64
typedef struct hm_window { int32_t begin, end; } hm_window;
typedef struct hm_shard {
    int32_t layer_begin, layer_end;  /* layers this device runs (n_windows == 0), or the windows' span */
    int32_t n_windows;               /* 0: one window [layer_begin, layer_end) */
    hm_window windows[HM_MAX_WINDOWS];
    int32_t kv_begin, kv_end;        /* attention units (KV heads) of each layer */
    int32_t ff_begin, ff_end;        /* FFN neurons of each layer */
    bool    first;                   /* runs the token embedding (tokens in), in its first window */
    bool    last;                    /* runs final norm + output head (logits out), after its last window */
    hm_sync_fn sync;                 /* NULL: single device */
    void   *sync_user;
    hm_weights_fn weights;           /* NULL: no residency management */
    void   *weights_user;
    hm_probe_fn probe;               /* NULL: none (see hm_probe_fn) */
    void   *probe_user;
    hm_ffn_fn ffn;                   /* NULL: none (see hm_ffn_fn) */
    void   *ffn_user;
} hm_shard;
hm_shard hm_shard_full(const hm_model *m);   /* all layers and units, first and last, no sync */
/* The shard with kv_end/ff_end < 0 replaced by the model's counts, and its layers as n_windows >= 1
   windows with layer_begin/layer_end their span. */
hm_shard hm_shard_normalize(const hm_model *m, const hm_shard *s);
/* Checks a shard against a model: windows ascending and disjoint, layers inside it (and in the file),
   column slices on block boundaries. */
int hm_shard_validate(const hm_model *m, const hm_shard *s, hr_err *err);
/* Layers the shard runs (the sum of its windows' lengths). */
int32_t hm_shard_n_layers(const hm_shard *s);

/* Copies the weights a shard reads into one anonymous mapping of the model's own, packed for the
   dispatched kernels unless repack is false (docs/quant.md), and drops the file's pages from this process;
   why, and what stays a view of the file: docs/model.md. Never with a streaming residency manager.
   Call before hm_ctx_create; a second call does nothing. Reports the bytes copied and, of those,
   packed. HR_ENOMEM if the memory cannot be had. */
int hm_model_load_weights(hm_model *m, const hm_shard *shard, bool repack, uint64_t *copied, uint64_t *packed,
                          hr_err *err);
/* Row r of a weight as F32 (any layout): out[0..ne0) */
void hm_tensor_row_f32(const hm_tensor *t, int64_t r, float *out);

/* ---- context: KV cache + scratch, bound to a model ---------------------------------------------- */
#define HM_MAX_SEQ 4096
typedef struct hm_ctx_params {
    int32_t n_ctx;        /* KV cache length (tokens) of each sequence; default min(n_ctx_train, 4096) */
    int32_t n_seq;        /* sequences the KV cache holds (each n_ctx positions), 1..HM_MAX_SEQ; default 1 */
    int32_t n_batch;      /* max tokens per hm_eval call; default 512 */
    int32_t n_threads;    /* default: physical cores */
    int     kv_type;      /* HQ_TYPE_F16 (default) or HQ_TYPE_F32 */
    hr_pool *pool;        /* optional shared pool (borrowed); else the ctx creates one */
} hm_ctx_params;
hm_ctx_params hm_ctx_default_params(void);

typedef struct hm_ctx hm_ctx;
hm_ctx *hm_ctx_create(const hm_model *m, const hm_shard *shard, const hm_ctx_params *p, hr_err *err);
void    hm_ctx_free(hm_ctx *c);
/* bytes the ctx allocated (KV cache + scratch) */
uint64_t hm_ctx_bytes(const hm_ctx *c);
/* memory a context of these parameters needs, without creating it (every layer's KV cache) */
uint64_t hm_ctx_bytes_estimate(const hm_hparams *hp, const hm_ctx_params *p);
/* the positions a ctx made with hm_ctx_params.n_ctx = n_ctx holds (0: the default, min(n_ctx_train, 4096)) */
int32_t hm_ctx_resolve_n_ctx(const hm_hparams *hp, int32_t n_ctx);
/* the same for a shard: the KV cache of its layers only */
uint64_t hm_ctx_bytes_for_shard(const hm_hparams *hp, const hm_shard *s, const hm_ctx_params *p);
/* what such a context takes beside its cache's positions: the scratch at the batch hm_ctx_create gives it
   (n_batch, at most n_ctx) and one position's KV; the residency manager adds the positions in use
   (hmem_params.ctx_base_bytes) */
uint64_t hm_ctx_base_bytes_for_shard(const hm_hparams *hp, const hm_shard *s, const hm_ctx_params *p);

/* One call's tokens, what goes in and what comes out (all borrowed). A batch at pos overwrites the
   cache from pos on: to restart generation or drop a turn, run the next batch at the earlier pos.
   Several sequences (continuous batching): seq[i] and pos_of[i] give each token's sequence and
   position (pos is then unused); a sequence's tokens in one batch are consecutive positions in
   ascending order (HR_EINVAL otherwise), and each token attends to its own sequence's positions
   0..pos_of[i] only, those of its batch before it included. A token's results do not depend on the
   other sequences' tokens in the batch, nor on where its own sit in it: a sequence run alone or
   batched with others gives the same logits, bit for bit. What they do depend on is how many of its
   own sequence's tokens the batch has: fewer than 64 (a decode step, a short chunk of a prompt) and
   64 or more (a prompt chunk) take attention's two numerics (F16 cache: src/model/attention.c), so
   a prompt cut into chunks gives the bits of the same prompt in one batch when every chunk is on
   the same side of 64 as that batch (docs/model.md). */
/* A sequence with this many tokens or more in a batch takes attention's F32 path, else the F16 path:
   who replays a sequence (a cluster that rebuilds its caches) cuts it the same way for the same bits. */
#define HM_BATCH_F32_TOKENS 64
typedef struct hm_batch {
    const int32_t *tokens;     /* [n] token ids: the input of a first shard (its first window) */
    const float   *embd;       /* [n][n_embd] hidden states: the input of any other shard or window */
    int32_t        n;          /* tokens, 1..n_batch */
    int32_t        pos;        /* the first token's position: the batch fills pos..pos+n-1 (< n_ctx) */
    float         *logits;     /* last shard: [rows wanted][n_vocab] out, or NULL (rows: out, all_logits) */
    bool           all_logits; /* logits of every token, not only of the last */
    float         *embd_out;   /* [n][n_embd] hidden states out (after the layers), or NULL */
    const int32_t *seq;        /* [n] each token's sequence, 0..n_seq-1, or NULL: all sequence 0 */
    const int32_t *pos_of;     /* [n] each token's position, or NULL: pos + i */
    const uint8_t *out;        /* [n] nonzero where a token's logits are wanted (last shard), written in
                                  batch order, one row each; NULL: all_logits or the last token only */
} hm_batch;

/* Runs a batch through the shard. Returns 0 or a negative HR_E* code. A shard of several windows
   must use hm_eval_window (HR_EINVAL here). */
int hm_eval(hm_ctx *c, const hm_batch *b, hr_err *err);
/* The same for window w of the shard (0 <= w < n_windows): tokens in only in window 0 of a first
   shard, logits out only after the last window of a last shard; hidden states otherwise. */
int hm_eval_window(hm_ctx *c, int w, const hm_batch *b, hr_err *err);
int hm_ctx_n_windows(const hm_ctx *c);
/* Checks a batch against the context as hm_eval does before it computes anything (size, sequences,
   positions): 0 or HR_EINVAL / HR_ERANGE (a cluster's head checks before it sends the batch on). */
int hm_batch_check(hm_ctx *c, const hm_batch *b, hr_err *err);
int32_t hm_ctx_n_ctx(const hm_ctx *c);
int32_t hm_ctx_n_seq(const hm_ctx *c);
/* Copies positions [0, n) of sequence src's KV cache into sequence dst (a shared prompt prefix is
   then not computed again). */
int hm_kv_seq_copy(hm_ctx *c, int32_t src, int32_t dst, int32_t n, hr_err *err);

/* Per-phase timing of the last hm_eval, nanoseconds (for `--timings` and benchmarks). */
typedef struct hm_timings {
    int64_t matmul_ns, attn_ns, sync_ns, weights_ns, other_ns, total_ns; /* weights: time in the residency hook */
} hm_timings;
hm_timings hm_ctx_timings(const hm_ctx *c);

/* ---- unit groups: what each group contributes to a block's output (docs/lossy.md) ----------------
   A group is what tensor parallelism deals out indivisibly (docs/tensor-parallel.md): att_kv KV heads
   with their query heads, ff neurons. Its contribution to a token's block output is the group's
   columns of attn_output / ffn_down times its activations; hm_groups computes it in F32 from a
   dequantized copy of those two tensors (so it differs from the engine's own partial by the rounding
   of the activations to the weights' vec_dot_type, which does not matter for what it is for):
   - statistics (calibration): the sum over tokens of the L2 norm of each group's contribution;
   - loss simulation: for each partial a device would send (the sum over its groups), packets of
     `packet` elements of the [n_tokens][n_embd] partial are lost with the device's loss rate
     (deterministic: a hash of seed, the all-reduce's number, device and packet), and a lost packet's
     elements lose that device's contribution, which is what the head's merge does when a datagram
     does not arrive. Device 0 is the head (its partial is local: never lost); layer 0 is never lossy
     (it stays on the reliable transport, as in HALO).
   Works on a full model with a full shard (one device); set its probe with hm_groups_attach. */
typedef struct hm_groups hm_groups;
typedef struct hm_groups_loss {
    int            n_dev;      /* devices, head first (1..HM_GROUPS_MAX_DEV) */
    const double  *loss;       /* [n_dev] packet loss probability of each device's link, 0..1 (loss[0] unused) */
    const int32_t *assign;     /* [n_layer][2][max groups] the device of each group, block HM_BLOCK_ATTN/FFN;
                                  see hm_groups_count (copied) */
    int32_t        packet;     /* elements per datagram, >= 1 */
    uint64_t       seed;
    /* rank: HM_RANK_STATIC uses assign. Otherwise assign is ignored and every token's groups are ranked
       on their own, the largest to the least lossy devices, count[b * n_dev + d] groups to device d
       in block b: HM_RANK_TOKEN by their contributions to that very token (the best a runtime
       predictor of importance, HALO's SAPs, could do: a bound), HM_RANK_PREV by their contributions
       to the token before (what a runtime could know when it deals a decode step's groups) */
    int            rank;
    const int32_t *count;
    int32_t        lowrank;    /* HM_RANK_LOWRANK, HM_RANK_PROTECT: the predictor's rank (1..n_embd) */
    int32_t        protect;    /* HM_RANK_PROTECT: FFN groups per lossy device, token and layer moved to the head (>= 0) */
} hm_groups_loss;
/* HM_RANK_LOWRANK: the FFN's groups ranked per token by a cheap predictor from the block's input —
   rank-k approximations W ~ Q (Q^T W) of ffn_gate and ffn_up (a randomized range finder with one
   power iteration), giving each neuron's predicted activation silu(g) u, times its ffn_down column's
   norm; k (n_ff + n_embd) multiply-adds per token instead of 2 n_ff n_embd. Attention keeps assign.
   HM_RANK_PROTECT: assign for both blocks, but of each lossy device's (loss > 0) FFN groups, the `protect`
   that the same predictor ranks largest for the token are computed by the head instead (the head can
   compute them; the workers hold only their own groups and leave those out): --lossy-protect's runtime. */
enum hm_groups_rank { HM_RANK_STATIC = 0, HM_RANK_TOKEN = 1, HM_RANK_PREV = 2, HM_RANK_LOWRANK = 3, HM_RANK_PROTECT = 4 };
#define HM_GROUPS_MAX_DEV 64
typedef struct hm_groups_counters {
    uint64_t allreduces;       /* lossy all-reduces simulated (layer >= 1, per block call) */
    uint64_t packets, lost;    /* worker packets sent and lost */
    uint64_t elems, elems_lost;/* worker partial elements sent and lost */
} hm_groups_counters;

/* att_kv: KV heads per attention group; ff: neurons per FFN group (hc_plan_make's att_group, ff_group) */
hm_groups *hm_groups_create(const hm_model *m, int32_t att_kv, int32_t ff, hr_err *err);
void       hm_groups_free(hm_groups *g);
/* groups of a block (HM_BLOCK_ATTN or HM_BLOCK_FFN) in every layer; hm_groups_stride = the larger */
int32_t    hm_groups_count(const hm_groups *g, enum hm_block b);
int32_t    hm_groups_stride(const hm_groups *g);
/* Turns statistics on or off and clears them. */
void       hm_groups_stats(hm_groups *g, bool on);
/* The mean contribution norm of each group of block b of layer over the tokens seen: out[count]. 0 tokens: 0s */
void       hm_groups_mean_norms(const hm_groups *g, int layer, enum hm_block b, double *out);
uint64_t   hm_groups_tokens(const hm_groups *g);
/* Starts simulating loss (NULL: stops); counters cleared. HR_EINVAL for a bad setting. */
int        hm_groups_set_loss(hm_groups *g, const hm_groups_loss *l, hr_err *err);
hm_groups_counters hm_groups_get_counters(const hm_groups *g);
/* Makes s call g's probe. */
void       hm_groups_attach(hm_groups *g, hm_shard *s);

/* ---- protected groups: the lossy all-reduce's runtime protection (docs/lossy.md, "The head protects") --
   One lossy worker's FFN share (n_ff neurons in groups of `group`, in the order of its slice): per token
   and layer, a low-rank predictor from the FFN input xn (as HM_RANK_LOWRANK, over this share's rows only)
   ranks the share's groups, and the n_protect largest are computed by the head instead of the worker:
   the worker zeroes their activations (hm_protect_mask), the head adds their contribution to its own
   partial (hm_protect_add). Both sides build the predictor from the same rows (the worker from its slice,
   the head from the model through `neuron`) with the same seed, in plain double arithmetic compiled without
   fused multiply-adds, so both select the same groups without telling each other: exactly on devices of one
   kind; on another kind the FFN input itself may differ in its last bits (the engine's kernels, libm's exp),
   and a near tie may then go the other way, which costs that token one group counted twice or not at all,
   never a divergence (the devices continue from the head's sum). */
typedef struct hm_protect hm_protect;
typedef struct hm_protect_params {
    int32_t        n_ff;       /* neurons of the share (>= 1) */
    int32_t        group;      /* neurons per group (the plan's ff_group; the last group may be short) */
    int32_t        rank;       /* the predictor's rank, 1..n_embd */
    int32_t        n_protect;  /* groups protected per token and layer, 1..groups */
    const int32_t *neuron;     /* [n_layer][n_ff] the model's FFN row of the share's neuron j; NULL: row j (a slice) */
    bool           head;       /* keep F32 copies of the share's rows to compute their contribution */
} hm_protect_params;
hm_protect *hm_protect_create(const hm_model *m, const hm_protect_params *p, hr_err *err);
void        hm_protect_free(hm_protect *p);
int32_t     hm_protect_count(const hm_protect *p);     /* n_protect */
uint64_t    hm_protect_bytes(const hm_protect *p);     /* what it holds: the predictor (and the head's copies) */
/* the groups to protect for one token's FFN input xn[n_embd] of layer: sel[n_protect], ascending */
void        hm_protect_select(hm_protect *p, int layer, const float *xn, int32_t *sel);
/* the worker: act[n_ff] (silu(gate) * up of its share) with the selected groups zeroed */
void        hm_protect_mask(const hm_protect *p, const int32_t *sel, float *act);
/* the head (head = true): o[n_embd] += the selected groups' contribution for xn */
void        hm_protect_add(hm_protect *p, int layer, const float *xn, const int32_t *sel, float *o);

#endif
