/* cluster internals shared by head.c, worker.c, slice.c and allreduce.c — see cluster.h */
#ifndef HEARTH_CLUSTER_IMPL_H
#define HEARTH_CLUSTER_IMPL_H

#include "cluster.h"

#define HC_CHUNK_BYTES       (4u << 20)           /* SLICE_CHUNK payload the head sends */
#define HC_MAX_SLICE_BYTES   (8ull << 30)         /* one tensor slice; the worker buffers one at a time */
#define HC_MAX_SLICES        (1 << 16)
#define HC_SLICE_NAME_MAX    96
#define HC_FORWARD_MAX_BYTES ((64u << 20) - 4096) /* a FORWARD's hidden states must leave room for its head */
#define HC_SETUP_TIMEOUT_MS  60000                /* per receive while setting up */
/* deadlines (docs/reliability.md, "A device that leaves"): timeout_ms 0 (automatic) waits
   HC_SETUP_DEADLINE_MS for set-up replies and for passes until a decode step has been timed, then
   HC_DEADLINE_FACTOR times the decode step (passes of up to HC_STEP_MAX_TOKENS tokens), at least
   HC_DEADLINE_FLOOR_MS; every pass adds HC_TOKEN_MS per token of its batch (hc_ar_deadline) — with the
   automatic deadline HC_UNTIMED_TOKEN_MS until a decode step has been timed, then the step itself (no token
   of a prompt costs more than a decode step: a batch reads the weights once for all its tokens) */
#define HC_SETUP_DEADLINE_MS 10000
#define HC_DEADLINE_FLOOR_MS 3000
#define HC_DEADLINE_FACTOR   10
#define HC_STEP_MAX_TOKENS   16
#define HC_TOKEN_MS          20
#define HC_UNTIMED_TOKEN_MS  1000   /* a 225-token prompt's first pass on home4-8b-tiny (8B, devices streaming
                                       at 0.3-0.8 core) took minutes: at 20 ms a token its deadline of 14.5 s
                                       dropped every worker in turn (session 32) */
#define HC_HELLO_DEADLINE_MS 3000   /* a live worker answers HELLO at once (or says it is busy) */
#define HC_PING_MS           1000   /* a pipeline that missed its deadline: how long each worker has to answer */

#define HC_PP_MAX_LAYERS     4096                 /* layers of a model a pipeline can place */

/* mask[il] = 1 for the layers device d runs in the pipeline plan (mask has n_layer entries) */
void hc_pp_layers(const hc_pp_plan *p, int d, uint8_t *mask);

/* ---- slices ---- */
enum hc_cut { HC_CUT_WHOLE = 0, HC_CUT_ROWS = 1, HC_CUT_COLS = 2 };

typedef struct hc_slice {
    char     name[HC_SLICE_NAME_MAX];
    int      type;             /* hq_type */
    int      n_dims;
    int64_t  ne[4];
    uint64_t size;             /* bytes as stored in the slice file */
    uint64_t hash;             /* hr_hash64 of those bytes */
    /* head only: where the bytes are in the model's mapping */
    const hm_tensor *src;
    int      cut;              /* enum hc_cut */
    int64_t  a, b;             /* rows or columns [a, b) */
    const int32_t *perm;       /* NULL, or the layer's group order (hc_order): [a, b) are then positions in
                                  it, and position i holds the model's rows/columns of group perm[i / grp] */
    int64_t  grp;              /* rows or columns per group (with perm) */
} hc_slice;

/* The slices a device with share s of the layers marked in `layers` (NULL: all) holds, in slice-file
   order (unhashed); head: also token_embd, output_norm and output (unless tied), which only the
   head's own slice file holds. ord (NULL: none): the placement the share's ranges index into. *out is
   malloc'd. */
int  hc_slices_make(const hm_model *m, const hc_share *s, const hc_order *ord, const uint8_t *layers, bool head,
                    hc_slice **out, int *n, hr_err *err);
/* Whether hc_slice_bytes gathers the slice's bytes into tmp (column slices, permuted slices). */
bool hc_slice_gathers(const hc_slice *s);
void hc_slices_hash(hc_slice *s, int n);
/* The slice's bytes [off, off + len) in file layout: a pointer into the mapping when they are
   contiguous there (rows, whole tensors), else gathered into tmp (hc_slice_gathers). */
const void *hc_slice_bytes(const hc_slice *s, uint64_t off, size_t len, void *tmp);
/* The cache file name of a share: model hash + units + directory, and all_listed: the file lists every
   layer (hearth.slice.layers: a pipeline stage or a hybrid group given the whole model), which the
   directory alone does not tell from a tensor-parallel share of every layer, whose file lists none —
   the worker takes its windows from the list, so one cannot serve the other. */
uint64_t hc_slice_key(uint64_t model_hash, const hc_share *sh, const hc_slice *s, int n, bool all_listed);

/* ---- slice files: CACHE/<model hash>/<slice key>.gguf ---- */
/* dir = CACHE/<model hash> (created), path = the file of that key in it */
int hc_slice_path(const char *cache, uint64_t model_hash, uint64_t key, char *dir, size_t dir_cap, char *path,
                  size_t cap, hr_err *err);
/* what a slice file says about itself besides its tensors (docs/model.md, "Slice files") */
typedef struct hc_slice_meta {
    const hm_hparams *hp;      /* the whole model's */
    hc_share share;
    uint64_t model_hash;
    const uint8_t *layers;     /* a pipeline stage: [n_layer], the layers it holds; NULL: all */
    bool     head;             /* the head's own: hearth.slice.head (embedding and output tensors too) */
} hc_slice_meta;
/* The bytes of dir[i] while its file is written: 0 and *bytes (valid until the next call), or a
   negative code with err set. */
typedef int (*hc_slice_src_fn)(void *user, int i, const void **bytes, hr_err *err);
/* The slice cache's bound (docs/model.md, "The slice cache's bound"). A slice file's size on disk, at
   most (metadata included). */
uint64_t hc_slice_file_bytes(const hc_slice *dir, int n);
/* The free space a slice file never eats into: 5% of the filesystem, at most 1 GiB. */
uint64_t hc_disk_margin(uint64_t fs_bytes);
/* 0 if need bytes fit on dir's filesystem leaving the margin free, else HR_ERANGE saying so. */
int      hc_disk_room(const char *dir, uint64_t need, hr_err *err);
/* Makes room in the cache for a file of need bytes: removes the least recently used slice files
   (modification time: hc_cache_touch marks a use) until the cache's files and need fit max_bytes (0:
   no bound of its own) and the disk keeps its margin. Files in keep[0..n_keep) and files a session
   holds (hc_cache_hold, any process) stay. HR_ERANGE with the reason when it cannot; *evicted (may
   be NULL): bytes removed. */
int      hc_cache_make_room(const char *cache, uint64_t need, uint64_t max_bytes, const char *const *keep, int n_keep,
                            uint64_t *evicted, hr_err *err);
/* The head's slice cache bound when --cache-max is not given (docs/model.md, "The slice cache's bound"):
   twice the model's file, or half of what the cache's disk can give it (its free space beyond the margin
   plus the cache's own files) when that is less. */
uint64_t hc_cache_default_max(const char *cache, uint64_t model_bytes);
/* Marks a cached file in use by this session (a shared flock on the returned fd, -1 if it cannot be
   opened or is being evicted); close the fd to let it go. */
int      hc_cache_hold(const char *path);
/* Marks a use of a cached file (its modification time: atime is often not kept). */
void     hc_cache_touch(const char *path);
/* Writes path with dir's tensors in order (their content hashes in hearth.slice.hashes): under a
   private name first, renamed when complete, so that two processes sharing a cache cannot clobber
   each other and no half-written file ever has the final name. A file that would leave less
   than the disk's margin free (hc_disk_room) is refused before it is begun. */
int hc_slice_file_write(const char *path, const hc_slice_meta *mt, const hc_slice *dir, int n, hc_slice_src_fn src,
                        void *user, hr_err *err);
/* The first of dir's tensors that the opened slice file lacks or holds with another content hash,
   or -1 when it has them all (a reused file is checked, not trusted). */
int hc_slice_file_check(const gguf_ctx *g, const hc_slice *dir, int n);
/* An opened slice file (g, loaded as m) against what it should hold, in full: the hyper-parameters,
   the hearth.slice.* keys, head or not, the layers, every tensor's name, type, shape and announced
   hash in dir's order. false with what differs in why: such a file is to be removed and made again. */
bool hc_slice_file_matches(const gguf_ctx *g, const hm_model *m, const hc_slice_meta *mt, const hc_slice *dir, int n,
                           char *why, size_t cap);
/* Unmaps from this process the pages of g's tensor data that reading them (hashing, copying) mapped
   in; the page cache keeps them, and a later read maps them again. A head that computes from its own
   slice file keeps only what it computes with. */
void hc_drop_pages(const gguf_ctx *g);

/* ---- sending with the test hook ---- */
typedef struct hc_hook { hc_send_hook_fn fn; void *user; } hc_hook;
int hc_send(const hc_hook *hk, int dev, hn_conn *c, hn_msg *m, int64_t deadline, hr_err *err);
/* ERROR to a peer (best effort, short deadline) */
void hc_send_error(hn_conn *c, uint32_t seq, int code, const char *msg);

/* msg without a leading "NAME: " (net messages start with the peer's address, which ours name already) */
static inline const char *hc_skip_peer(const char *msg, const char *name) {
    size_t n = strlen(name);
    return !strncmp(msg, name, n) && msg[n] == ':' && msg[n + 1] == ' ' ? msg + n + 2 : msg;
}

/* ---- all-reduce: the sync hook of one device's shard ---- */
/* The lossy all-reduce (docs/lossy.md) carries the all-reduces of decoding steps but layer 0's: passes
   of at most one token per sequence the session holds (n_seq, at most HC_LOSSY_MAX_TOKENS). A prompt
   stays on TCP: its burst of datagrams is long, and what it loses stays in the KV cache. */
#define HC_LOSSY_MAX_TOKENS 64
/* a partial of at least this many datagrams is never lost whole in practice: none of them yet means
   its sender is still computing (allreduce.c, hc_lossy_head) */
#define HC_LOSSY_SURE_NP    3
/* once a burst's last datagram is in, how long a missing one may still be on its way (reordering) */
#define HC_LOSSY_GRACE_NS   (500 * 1000LL)
#define HC_LOSSY_SETTLE_MS  1000   /* hc_ar_lossy_settle: the longest a pass's end waits for a worker that asks */

/* One UDP link of the lossy all-reduce and its counters (cumulative over the session). The head has
   one per worker and counts what it received; a worker has one, to the head, and counts what it sent. */
typedef struct hc_lossy_link {
    hn_udp  *udp;
    hn_dgram_crypt crypt;                                /* sealed when the connection beside is encrypted */
    uint64_t sent, hook_dropped, send_fail;              /* sender */
    uint64_t received, lost, late, dup, foreign, malformed; /* receiver (dup: also a replayed counter): lost = missing at the merge;
                                                            late = arrived for an all-reduce already merged */
    uint64_t elems_lost;                                 /* receiver: elements merged as zero */
    uint64_t auth_failed;                                /* receiver: did not open (altered, another key, plain) */
    /* the sum's way back: RESULT datagrams (head to worker) and NACKs (worker to head), sent (the head:
       resent), received, late, dropped by the test hook (the head: RESULTs; a worker: NACKs) */
    uint64_t res_sent, res_received, res_late, nacks, resends, res_dropped;
    uint32_t heard;                /* head: the latest all-reduce any genuine PARTIAL datagram of this worker was
                                      for (it had every sum before that one) */
    int64_t  skew_ns, skew_dev_ns; /* receiver: when the sender's first datagram of an all-reduce arrives
                                  after the receiver began waiting (its compute skew): running mean and
                                  mean deviation, as TCP estimates its RTO (RFC 6298) */
} hc_lossy_link;

typedef struct hc_ar {
    int       mode;            /* enum hc_allreduce */
    int       k, me;           /* devices, this device's index */
    /* star: the head has conn[1..k-1] (workers), a worker has conn[0] (the head) */
    hn_conn **conn;
    hn_frame *rx;              /* one receive frame per conn (star) */
    /* ring: links to the next and from the previous device (may be the same connection) */
    hn_conn  *next, *prev;
    int       next_dev, prev_dev;
    hn_frame  ring_rx;
    const char *const *names;  /* [k]: device names for messages */
    const hc_hook *hook;
    uint32_t  seq;             /* all-reduces so far in this session */
    int64_t   timeout_ms;      /* base deadline of a receive */
    int64_t   token_ms;        /* and per token of the pass's batch; 0: HC_TOKEN_MS */
    /* counters since the last stats read */
    int64_t   compute_ns, wait_ns, send_ns;
    int64_t   mark;            /* end of the previous sync (or start of the pass): compute since then */
    hr_err    err;             /* why the last sync failed */
    int       err_dev;         /* the peer it blames (-1: none) */
    /* every sum this device continued from, hashed in order (hr_hash64 chain): equal on every device
       of a session unless they diverged (the lossy tests compare them) */
    uint64_t  sum_hash;
    /* lossy star all-reduce (docs/lossy.md) */
    bool      lossy;
    int       lossy_deadline_ms;
    int       lossy_max_tokens;  /* passes of at most this many tokens are lossy (a decoding step) */
    int       n_layer;           /* the last all-reduce of a pass (layer n_layer - 1, FFN) needs no way back */
    /* head: the sums it sent back as datagrams, kept for the workers' NACKs: slot seq % nkeep holds
       sum seq (keep_seq; keep_cnt elements, room for keep_cap). nkeep = 2 n_layer, the all-reduces of
       a pass: a worker never needs an older sum (allreduce.c, hc_lossy_keep) */
    float   **keep;
    uint32_t *keep_seq;
    size_t   *keep_cnt, *keep_cap;
    int       nkeep;
    uint64_t  session;         /* random per session: a datagram of another one is foreign */
    uint64_t  drop_seed;       /* test hook: drop outgoing datagrams with probability drop_ppm / 1e6 */
    uint32_t  drop_ppm;
    bool      dup;             /* test hook: every datagram is sent twice */
    hc_lossy_link *ll;         /* head: [k] (1..k-1 used); worker: [1], its link to the head */
    float    *lbuf;            /* head: [k][lcap] what each worker's datagrams brought (zero: missing) */
    uint8_t  *got;             /* head: [k][lmaxp] which of a worker's datagrams arrived */
    size_t    lcap, lmaxp;
    uint64_t  lossy_syncs, elems_lost_max;
    uint32_t  settle_seq;      /* head: the last all-reduce merged from datagrams */
    uint64_t  settles;         /* head: passes whose end waited for a worker behind (hc_ar_lossy_settle) */
    int64_t   settle_ns;
} hc_ar;

/* whether layer's all-reduces of an n-token pass go over the lossy transport */
bool hc_ar_lossy_on(const hc_ar *a, int layer, int n);
/* head: the buffers of the lossy merge for passes of up to a->lossy_max_tokens tokens */
int  hc_ar_lossy_alloc(hc_ar *a, int n_embd);
void hc_ar_lossy_free(hc_ar *a);
/* head, lossy mode: before it reads a worker's TCP message, waits (until c is readable or the
   deadline) answering the workers' NACKs: a worker may still wait for a sum of the previous pass */
void hc_ar_lossy_wait(hc_ar *a, hn_conn *c, int64_t deadline);
/* head, lossy mode, at the end of a pass: a worker none of whose datagrams of the pass's last all-reduce
   arrived may still wait for a sum of the pass (the head merged without it, and the sum's datagrams were
   lost): answers its NACKs until its partial of the last all-reduce comes (late), so that a head that
   goes idle now (serve, chat between requests) leaves no worker waiting. Waits 2 deadlines for a sign
   (its late partial, or a NACK: a worker that waits asks a deadline after it began), 4 more after each
   NACK, HC_LOSSY_SETTLE_MS at most; a worker that gives no sign had its partial lost, not a sum. */
void hc_ar_lossy_settle(hc_ar *a);

int  hc_ar_sync(void *user, int layer, enum hm_block b, float *x, int n, int n_embd);
/* ring mode: socket buffers of the link to the next device (call once the links exist) */
void hc_ar_ring_init(hc_ar *a);
/* receive deadline for a pass of n tokens */
int64_t hc_ar_deadline(const hc_ar *a, int n);

/* ---- one incarnation of a head (head.c): what hc_head (recover.c) runs, rebuilds and replays over.
   Same contracts as the hc_head_* functions of cluster.h; p->n_workers 0 is the head alone (the whole
   model from the mapping, no plan). */
typedef struct hc_core hc_core;
/* *failed_worker (may be NULL): as hc_core_failed_worker, for a create that failed */
hc_core *hc_core_create(const hm_model *m, const hc_head_params *p, const hm_ctx_params *cp, int *failed_worker,
                        hr_err *err);
int      hc_core_eval(hc_core *h, const int32_t *tokens, int n, int32_t pos0, float *logits, bool all_logits,
                      hr_err *err);
int      hc_core_eval_batch(hc_core *h, const hm_batch *b, hr_err *err);
int      hc_core_reset(hc_core *h, int32_t pos, hr_err *err);
int      hc_core_kv_seq_copy(hc_core *h, int32_t src, int32_t dst, int32_t n, hr_err *err);
int      hc_core_stats(hc_core *h, hc_dev_stats *out, int cap, hr_err *err);
int32_t  hc_core_n_ctx(const hc_core *h);
int32_t  hc_core_n_seq(const hc_core *h);
int32_t  hc_core_n_batch(const hc_core *h);
const hc_plan *hc_core_plan(const hc_core *h);
const hc_pp_plan *hc_core_pp_plan(const hc_core *h);
hmem    *hc_core_mem(const hc_core *h);
uint64_t hc_core_weight_bytes_sent(const hc_core *h);
uint64_t hc_core_weight_bytes_total(const hc_core *h);
uint64_t hc_core_slice_bytes_written(const hc_core *h);
/* The worker (1..n_workers, as in p->workers + 1) a failure was blamed on: it died, closed its
   connection, missed a deadline or broke the protocol. 0: the failure was not a worker's (a bad
   argument, the head's own memory or computation), or nothing failed. */
int      hc_core_failed_worker(const hc_core *h);
/* The measured time of a decode pass (ms, 0 before one was seen): the automatic deadline's base. */
double   hc_core_step_ms(const hc_core *h);
void     hc_core_free(hc_core *h);

#endif
