/* cluster/worker: `hearth worker` — serves one head at a time: receives its weight slices into the
   slice cache, loads them as a model, and runs forward passes over them: its share of every layer
   (tensor parallel), its windows of whole layers (pipeline), or its share of its stage's layers (a
   hybrid plan's group, as its leader or a member) (see cluster.h) */
#define _GNU_SOURCE
#include "cluster-impl.h"

#include "quant/quant.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HC_IDLE_POLL_MS   250
#define HC_HELLO_WAIT_MS  10000 /* a new connection must have begun its HELLO by then, or is dropped */
#define HC_HELLO_READ_MS  500   /* and its first frame, once begun, must be complete within this */
#define HC_DOOR_MAX       16    /* connections not yet past HELLO; the oldest goes when one more comes */

/* a connection that has not said who it is yet */
typedef struct hc_guest { hn_conn *c; int64_t deadline; } hc_guest;

struct hc_worker {
    char        cache[PATH_MAX];
    uint64_t    cache_max;        /* --cache-max: bytes the cache's files may take (0: the disk's margin alone) */
    char        name[HN_MAX_NAME];
    int         n_threads;
    hmem_request mem;
    bool        use_mmap, no_repack;  /* how a session holds its slice (hmem_load_weights) */
    int         setup_ms;
    hc_profile_fn profile;
    void        *profile_user;
    hn_key      key;                  /* the cluster key, when has_key */
    bool        has_key;
    hn_listener *l;
    hc_guest    door[HC_DOOR_MAX];
    int         n_door;
    _Atomic int stop;
};

hc_worker_params hc_worker_default_params(void) {
    hc_worker_params p = {.listen = "0.0.0.0:7070", .cache_dir = NULL, .n_threads = 0, .name = NULL, .mem.window = 2,
                          .setup_ms = 20000};
    return p;
}

int hc_default_cache_dir(char *buf, size_t cap, hr_err *err) {
    const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (x && x[0] == '/') n = snprintf(buf, cap, "%s/hearth/slices", x);
    else if (home && home[0]) n = snprintf(buf, cap, "%s/.cache/hearth/slices", home);
    else return hr_fail(err, HR_ENOTFOUND, "neither XDG_CACHE_HOME nor HOME is set: give --cache DIR");
    if (n < 0 || (size_t)n >= cap) return hr_fail(err, HR_ERANGE, "cache path too long");
    return 0;
}

hc_worker *hc_worker_create(const hc_worker_params *p, hr_err *err) {
    hc_worker *w = calloc(1, sizeof *w);
    if (!w) { hr_fail(err, HR_ENOMEM, "out of memory"); return NULL; }
    if (p->cache_dir && p->cache_dir[0]) {
        if (strlen(p->cache_dir) >= sizeof w->cache - 64) { hr_fail(err, HR_ERANGE, "cache path too long"); goto err; }
        snprintf(w->cache, sizeof w->cache, "%s", p->cache_dir);
    } else if (hc_default_cache_dir(w->cache, sizeof w->cache - 64, err)) goto err;
    if (hr_mkdirs(w->cache, 0755, err)) goto err;
    w->cache_max = p->cache_max;
    snprintf(w->name, sizeof w->name, "%s", p->name && p->name[0] ? p->name : "worker");
    w->n_threads = p->n_threads > 0 ? p->n_threads : hr_physical_cores();
    w->mem = p->mem;
    w->use_mmap = p->use_mmap;
    w->no_repack = p->no_repack;
    w->setup_ms = p->setup_ms > 0 ? p->setup_ms : 20000;
    if (p->key) {
        w->key = *p->key;
        w->has_key = true;
    }
    w->profile = p->profile;
    w->profile_user = p->profile_user;
    if (!(w->l = hn_listen(p->listen, err))) goto err;
    return w;
err:
    free(w);
    return NULL;
}

uint16_t hc_worker_port(const hc_worker *w) { return hn_listener_port(w->l); }
void hc_worker_stop(hc_worker *w) { atomic_store(&w->stop, 1); }
void hc_worker_free(hc_worker *w) {
    if (!w) return;
    for (int i = 0; i < w->n_door; i++) hn_conn_close(w->door[i].c);
    hn_listener_close(w->l);
    hn_key_wipe(&w->key);
    free(w);
}

/* ---- a session with one head ------------------------------------------------------------------------ */

typedef struct hc_src { gguf_ctx *g; char path[PATH_MAX]; } hc_src;

typedef struct hc_session {
    hc_worker *w;
    hn_conn   *head;
    char       head_name[80];
    hn_frame   rx;               /* control messages from the head */
    bool       planned;
    /* the plan */
    uint64_t   model_hash;
    uint32_t   index, n_dev;
    hc_share   share;
    hm_hparams hp;               /* the model's, as the plan says (hm_hparams_from_kv) */
    int32_t    n_ctx, n_batch, kv_type, n_seq;
    int        mode, timeout_ms;
    char       ring_next[256];
    bool       pp;               /* a pipeline stage: whole layers, hidden states passed on */
    bool       stage_tp;         /* a member of a tensor-parallel group in a hybrid plan: its share of the group's
                                    layers, window by window as its leader (the head or a worker) sends them */
    bool       lead;             /* the leader of a group (a pipeline stage): its members run each window with it */
    int        tp_group;         /* devices of the all-reduce (a hybrid plan's group; else all) */
    int        group_index;      /* this device's place in it (0: the leader, the star's centre) */
    char       group_members[HN_MAX_VALUE + 1]; /* a leader: its members' addresses, comma-separated */
    uint64_t   group_token;      /* a leader: what its connections to them say (HELLO "ring <token>") */
    uint8_t   *layers;           /* pipeline, hybrid: [n_layer] the layers this worker runs (NULL: all) */
    int        n_layers;
    bool       ring_prev_worker;
    uint64_t   ring_token;
    /* the slices */
    hc_slice  *dir;
    int        n_dir;
    char       path[PATH_MAX];
    int        hold_fd;          /* a shared flock on the slice file while the session uses it (-1: none) */
    /* the model */
    gguf_ctx  *g;
    hm_model  *m;
    hm_ctx    *ctx;
    hmem      *mem;              /* residency manager over the slice file, or NULL */
    float     *pp_out;           /* pipeline: [n_batch][n_embd], the window's output */
    hm_window  win[HM_MAX_WINDOWS];/* pipeline: the windows, as the ctx runs them */
    hc_ar      ar;
    hc_lossy_link ll;            /* the lossy all-reduce's link to the head (lossy_port != 0) */
    uint16_t   lossy_port;
    uint64_t   lossy_session, drop_seed;
    uint32_t   drop_ppm;
    bool       drop_dup;
    int        lossy_max_tokens, lossy_deadline_ms;
    int32_t    prot_n, prot_rank, prot_group; /* lossy_protect: the head computes prot_n of this share's groups */
    hm_protect *prot;
    int32_t   *prot_sel;
    hn_conn   *ar_conn[HC_MAX_DEVICES]; /* the all-reduce's links: [0] the centre (a worker), or a leader's
                                        [1..tp_group) members (connections it opened) */
    hn_frame   ar_rx[HC_MAX_DEVICES];
    char       names[HC_MAX_DEVICES][260];
    const char *name_ptr[HC_MAX_DEVICES];
    hn_conn   *ring_next_conn, *ring_prev_conn;
    hn_conn   *pending_ring;     /* a ring connection accepted early, and its token */
    uint64_t   pending_token;
    /* counters */
    int64_t    evals, tokens;
    uint64_t   weight_bytes;
    hn_conn_stats base_stats, base_next, base_prev; /* counters at the last STATS */
} hc_session;

static void hc_session_free(hc_session *s) {
    hm_ctx_free(s->ctx);
    hm_protect_free(s->prot);
    free(s->prot_sel);
    hmem_free(s->mem);
    hr_free_aligned(s->pp_out);
    free(s->layers);
    hm_model_free(s->m);
    gguf_close(s->g);
    free(s->dir);
    hn_frame_free(&s->rx);
    for (int i = 0; i < HC_MAX_DEVICES; i++) hn_frame_free(&s->ar_rx[i]);
    for (int i = 1; s->lead && i < s->tp_group; i++) hn_conn_close(s->ar_conn[i]);
    hn_frame_free(&s->ar.ring_rx);
    hn_udp_close(s->ll.udp);
    hn_dgram_crypt_wipe(&s->ll.crypt);
    hn_conn_close(s->ring_next_conn);
    hn_conn_close(s->ring_prev_conn);
    hn_conn_close(s->pending_ring);
    hn_conn_close(s->head);
    if (s->hold_fd >= 0) close(s->hold_fd);
    free(s);
}

/* A protocol failure: tell the head (best effort), log, end the session. */
static int hc_bad(hc_session *s, uint32_t seq, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int hc_bad(hc_session *s, uint32_t seq, int code, const char *fmt, ...) {
    char msg[HN_MAX_MESSAGE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    HR_LOGW("worker: head %s: %s; closing the session", s->head_name, msg);
    hc_send_error(s->head, seq, code, msg);
    return code;
}

static bool hc_parse_u64(hn_str v, uint64_t *out, int base) {
    char b[40];
    if (v.n == 0 || v.n >= sizeof b) return false;
    memcpy(b, v.s, v.n);
    b[v.n] = 0;
    if (b[0] == '-' || b[0] == '+' || b[0] == ' ') return false;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(b, &end, base);
    if (errno || *end) return false;
    *out = x;
    return true;
}

static const hn_str *hc_param(const hn_load_plan *p, const char *key) {
    for (uint32_t i = 0; i < p->n_params; i++)
        if (hn_str_eq(p->params[i].key, key)) return &p->params[i].value;
    return NULL;
}

/* LOAD_PLAN's hyper-parameters as text (hm_hparams_from_kv's store) */
static int hc_plan_get(void *user, const char *key, hm_kv_type type, hm_kv_val *v) {
    const hn_str *t = hc_param(user, key);
    if (!t) return 0;
    return hm_kv_parse(t->s, t->n, type, v) ? 1 : HR_EFORMAT;
}

/* A ring connection is announced by HELLO with device "ring <token, 16 hex>". */
static bool hc_ring_hello(const hn_msg *m, uint64_t *token) {
    if (m->type != HN_MSG_HELLO || m->u.hello.device.n != 21 || memcmp(m->u.hello.device.s, "ring ", 5)) return false;
    hn_str t = {m->u.hello.device.s + 5, 16};
    return hc_parse_u64(t, token, 16);
}

/* ---- the door: connections until their HELLO ------------------------------------------------------- */

static const hn_key *hc_key(const hc_worker *w) { return w->has_key ? &w->key : NULL; }

static void hc_door_drop(hc_worker *w, int i, const char *why) {
    HR_LOGI("worker: dropped %s (%s)", hn_conn_peer(w->door[i].c), why);
    hn_conn_close(w->door[i].c);
    w->door[i] = w->door[--w->n_door];
}

/* Takes waiting connections in and waits up to wait_ms for one of them to send something: returns
   that connection with its first message in *m (borrowing *f), or with e->code set when that message
   was slow or malformed; NULL if none spoke. A connection silent past HC_HELLO_WAIT_MS is closed, and
   the oldest makes room when HC_DOOR_MAX wait: idle or half-open connections never keep a head out. */
static hn_conn *hc_door_next(hc_worker *w, int wait_ms, hn_frame *f, hn_msg *m, hr_err *e) {
    hn_conn *c;
    while ((c = hn_accept(w->l, hr_time_ns(), NULL))) {
        if (w->n_door == HC_DOOR_MAX) {
            int old = 0;
            for (int i = 1; i < w->n_door; i++) if (w->door[i].deadline < w->door[old].deadline) old = i;
            hc_door_drop(w, old, "too many connections waiting for their HELLO");
        }
        w->door[w->n_door++] = (hc_guest){c, hn_deadline_ms(HC_HELLO_WAIT_MS)};
    }
    struct pollfd p[HC_DOOR_MAX + 1] = {{.fd = hn_listener_fd(w->l), .events = POLLIN}};
    for (int i = 0; i < w->n_door; i++) p[i + 1] = (struct pollfd){.fd = hn_conn_fd(w->door[i].c), .events = POLLIN};
    int n = w->n_door;
    if (poll(p, (nfds_t)n + 1, wait_ms) < 0) return NULL;
    int64_t now = hr_time_ns();
    /* from the last, so that dropping (which moves the last guest into the gap) skips none */
    for (int i = n - 1; i >= 0; i--) {
        if (!p[i + 1].revents) {
            if (now > w->door[i].deadline) hc_door_drop(w, i, "no HELLO in time");
            continue;
        }
        c = w->door[i].c;
        w->door[i] = w->door[--w->n_door];
        hn_msg_recv_first(c, hc_key(w), f, m, HC_HELLO_READ_MS, e);
        return c;
    }
    return NULL;
}

/* Someone connected while a head is being served: keep it if it is a ring peer, else say busy at once. */
static void hc_check_pending(hc_session *s) {
    hn_frame f = {0};
    hn_msg m;
    hr_err e = {0};
    uint64_t tok;
    hn_conn *c = hc_door_next(s->w, 0, &f, &m, &e);
    if (c && !e.code && hc_ring_hello(&m, &tok)) {
        hn_conn_close(s->pending_ring);
        s->pending_ring = c;
        s->pending_token = tok;
    } else if (c) {
        char msg[256];
        snprintf(msg, sizeof msg, "busy: serving head %s", s->head_name);
        HR_LOGI("worker: refused %s (%s)", hn_conn_peer(c), e.msg[0] ? e.msg : "busy");
        hc_send_error(c, 0, HR_EUNSUPPORTED, msg);
        hn_conn_close(c);
    }
    hn_frame_free(&f);
}

/* Waits for the head's next message, checking for stop requests and turning away other heads
   meanwhile; the message itself, once it starts, has a deadline. Until the model is loaded the wait
   has one too (w->setup_ms: a peer that says HELLO and then nothing must not hold the worker); after
   that none (the head may wait on its user). A pipeline stage after the first also listens to the
   previous worker (*from_prev). */
static int hc_recv_idle(hc_session *s, hn_msg *m, bool *from_prev, hr_err *err) {
    *from_prev = false;
    int64_t deadline = s->planned ? HN_NO_DEADLINE : hn_deadline_ms(s->w->setup_ms);
    for (;;) {
        if (atomic_load(&s->w->stop)) return hr_fail(err, HR_ENET, "worker stopping");
        if (hr_time_ns() > deadline)
            return hr_fail(err, HR_ETIMEDOUT, "no message for %d ms while setting up", s->w->setup_ms);
        struct pollfd p[2] = {{.fd = hn_conn_fd(s->head), .events = POLLIN}};
        int np = 1;
        if ((s->pp || s->stage_tp) && s->ring_prev_conn)  /* the previous stage, or a member's leader */
            p[np++] = (struct pollfd){.fd = hn_conn_fd(s->ring_prev_conn), .events = POLLIN};
        /* what the head (or the previous stage) already sent comes first: a head that says BYE
           and reconnects at once must not be told it is busy with itself */
        int r = poll(p, (nfds_t)np, 0);
        if (r == 0) {
            hc_check_pending(s);
            r = poll(p, (nfds_t)np, HC_IDLE_POLL_MS);
        }
        if (r < 0 && errno != EINTR) return hr_fail(err, HR_ENET, "poll: %s", strerror(errno));
        if (r > 0 && p[0].revents) return hn_msg_recv(s->head, &s->rx, m, hn_deadline_ms(HC_SETUP_TIMEOUT_MS), err);
        if (r > 0 && np > 1 && p[1].revents) {
            *from_prev = true;
            int rc = hn_msg_recv(s->ring_prev_conn, &s->ar.ring_rx, m, hn_deadline_ms(s->timeout_ms), err);
            if (!rc && m->type != HN_MSG_FORWARD)
                return hr_fail(err, HR_EPROTO, "the previous worker sent %s where FORWARD was expected",
                               hn_msg_name(m->type));
            return rc;
        }
    }
}

/* ---- PROFILE ---- */
static int hc_handle_profile(hc_session *s, const hn_msg *req) {
    char vals[40][40];
    hn_msg r = {.type = HN_MSG_PROFILE, .seq = req->seq};
    hn_profile *p = &r.u.profile;
    int nv = 0;
#define KV(k, ...) do { snprintf(vals[nv], sizeof vals[nv], __VA_ARGS__); \
        p->kv[p->n_kv++] = (hn_kv){hn_cstr(k), hn_cstr(vals[nv])}; nv++; } while (0)
    KV("threads", "%d", s->w->n_threads);
    if ((req->u.profile_req.flags & HN_PROFILE_BENCH) && !(req->u.profile_req.flags & HN_PROFILE_DEVICE)) {
        hr_err e = {0};
        int ms = (int)HR_MIN(req->u.profile_req.bench_ms, 5000u);
        double gbps = hc_bench_matvec(s->w->n_threads, ms, &e);
        if (gbps < 0) return hc_bad(s, req->seq, e.code, "benchmark failed: %s", e.msg);
        KV("matvec_gbps", "%.4f", gbps);
    }
    hc_kv_text *dev = NULL;
    if (req->u.profile_req.flags & HN_PROFILE_DEVICE) {
        if (!s->w->profile) return hc_bad(s, req->seq, HR_EUNSUPPORTED, "this worker cannot describe its device");
        if (!(dev = calloc(1, sizeof *dev))) return hc_bad(s, req->seq, HR_ENOMEM, "out of memory");
        hr_err e = {0};
        if (s->w->profile(s->w->profile_user, s->w->n_threads, s->w->cache, &s->w->mem,
                          req->u.profile_req.flags & HN_PROFILE_BENCH, req->u.profile_req.types, dev, &e)) {
            free(dev);
            return hc_bad(s, req->seq, e.code, "device profile failed: %s", e.msg);
        }
        for (int i = 0; i < dev->n && p->n_kv < HN_MAX_KV; i++)
            p->kv[p->n_kv++] = (hn_kv){hn_cstr(dev->key[i]), hn_cstr(dev->val[i])};
    }
    if (req->u.profile_req.flags & HN_PROFILE_STATS) {
        hn_conn_stats st, nx = {0}, pv = {0};
        hn_conn_get_stats(s->head, &st);
        if (s->ring_next_conn) hn_conn_get_stats(s->ring_next_conn, &nx);
        if (s->ring_prev_conn) hn_conn_get_stats(s->ring_prev_conn, &pv);
        uint64_t sent = st.bytes_sent - s->base_stats.bytes_sent + nx.bytes_sent - s->base_next.bytes_sent +
                        pv.bytes_sent - s->base_prev.bytes_sent;   /* a group member's partial sums */
        uint64_t recv = st.bytes_received - s->base_stats.bytes_received + pv.bytes_received - s->base_prev.bytes_received;
        KV("evals", "%" PRId64, s->evals);
        KV("tokens", "%" PRId64, s->tokens);
        KV("compute_ns", "%" PRId64, s->ar.compute_ns);
        KV("wait_ns", "%" PRId64, s->ar.wait_ns);
        KV("send_ns", "%" PRId64, s->ar.send_ns);
        KV("bytes_sent", "%" PRIu64, sent);
        KV("bytes_received", "%" PRIu64, recv);
        KV("n_layers", "%d", s->layers ? s->n_layers : s->hp.n_layer);
        KV("sum_hash", "%016llx", (unsigned long long)s->ar.sum_hash);
        if (s->ll.udp) {
            KV("dg_sent", "%" PRIu64, s->ll.sent);
            KV("dg_hook_dropped", "%" PRIu64, s->ll.hook_dropped);
            KV("dg_send_fail", "%" PRIu64, s->ll.send_fail);
            KV("res_received", "%" PRIu64, s->ll.res_received);
            KV("nacks", "%" PRIu64, s->ll.nacks);
        }
        if (s->mem) {
            hmem_sample smp;
            hmem_take_sample(s->mem, &smp);
            hmem_stats ms = hmem_get_stats(s->mem);
            KV("resident_bytes", "%" PRIu64, smp.resident);
            KV("resident_peak", "%" PRIu64, ms.resident_peak);
            const hmem_plan *pl = hmem_get_plan(s->mem);
            KV("budget", "%" PRIu64, pl->mode == HMEM_OBSERVE ? 0 : pl->budget);
            KV("stream_bytes", "%" PRIu64, pl->mode == HMEM_STREAM ? pl->stream_bytes : 0);
            KV("room_bytes", "%" PRIu64, pl->mode == HMEM_STREAM ? pl->room_bytes : 0);
            KV("disk_read_bytes", "%" PRId64, ms.disk_read_bytes);
            KV("weights_wait_ns", "%" PRId64, ms.wait_ns);
            KV("mem_replans", "%" PRId64, ms.n_replans);
            KV("pressure_ppm", "%.0f", ms.pressure * 1e6);
            for (int k = 0; k < 2; k++) {
                const hmem_block_stats *b = &ms.kind[k];
                KV(k ? "ffn_n" : "attn_n", "%" PRId64, b->n_begin);
                KV(k ? "ffn_compute_ns" : "attn_compute_ns", "%" PRId64, b->compute_ns);
                KV(k ? "ffn_loads" : "attn_loads", "%" PRId64, b->n_loads);
                KV(k ? "ffn_load_ns" : "attn_load_ns", "%" PRId64, b->load_ns);
            }
        }
        s->evals = s->tokens = 0;
        s->ar.compute_ns = s->ar.wait_ns = s->ar.send_ns = 0;
        s->base_stats = st;
        s->base_next = nx;
        s->base_prev = pv;
    }
#undef KV
    hr_err e = {0};
    int rc = hn_msg_send(s->head, &r, hn_deadline_ms(HC_SETUP_TIMEOUT_MS), &e);
    free(dev);
    if (rc) {
        HR_LOGW("worker: head %s: %s", s->head_name, e.msg);
        return e.code;
    }
    return 0;
}

/* PROBE: the head measures the link (docs/planner.md); the answer carries reply_bytes (bounded by the
   decoder) of zeros */
static int hc_handle_probe(hc_session *s, const hn_msg *req) {
    uint32_t n = req->u.probe.reply_bytes;
    uint8_t *zeros = n ? calloc(n, 1) : NULL;
    if (n && !zeros) return hc_bad(s, req->seq, HR_ENOMEM, "out of memory");
    hn_msg r = {.type = HN_MSG_PROBE, .seq = req->seq};
    r.u.probe = (hn_probe){.reply_bytes = 0, .n = n, .data = zeros};
    hr_err e = {0};
    int rc = hn_msg_send(s->head, &r, hn_deadline_ms(HC_SETUP_TIMEOUT_MS), &e);
    free(zeros);
    if (rc) HR_LOGW("worker: head %s: %s", s->head_name, e.msg);
    return rc ? e.code : 0;
}

/* LOSS_PROBE: the planner measures this link's datagram loss (docs/planner.md, "Loss"): a burst of
   probe datagrams to the head's own address (bounded by the decoder), the echoes counted */
static int hc_handle_loss_probe(hc_session *s, const hn_msg *req) {
    hn_msg r = {.type = HN_MSG_PROFILE, .seq = req->seq};
    char vals[3][24];
    hr_err e = {0};
    if (hc_loss_probe_answer(s->head, &req->u.loss_probe, 1, r.u.profile.kv, vals, &r.u.profile.n_kv, &e))
        return hc_bad(s, req->seq, e.code, "LOSS_PROBE: %s", e.msg);
    e = (hr_err){0};
    if (hn_msg_send(s->head, &r, hn_deadline_ms(HC_SETUP_TIMEOUT_MS), &e)) {
        HR_LOGW("worker: head %s: %s", s->head_name, e.msg);
        return e.code;
    }
    return 0;
}

/* LINK_PROBE: the planner asks this worker to measure its link to another worker (which must answer
   as a hearth worker before any data is sent; the sizes are bounded by the decoder: at most
   HN_MAX_PINGS small messages and one PROBE of HN_MAX_PROBE bytes per request) */
static int hc_handle_link_probe(hc_session *s, const hn_msg *req) {
    const hn_link_probe *l = &req->u.link_probe;
    char addr[HN_MAX_NAME + 1], me[HN_MAX_NAME], vals[2][40];
    hn_str_copy(addr, sizeof addr, l->addr);
    snprintf(me, sizeof me, "probe from %.100s", s->w->name);
    hc_probe_conn pc;
    hr_err e = {0};
    double rtt = 0, gbps = 0;
    int rc = hc_probe_open(&pc, addr, hc_key(s->w), me, HC_SETUP_TIMEOUT_MS, &e);
    if (!rc) rc = hc_probe_link(&pc, (int)l->n_pings, l->probe_bytes, HC_SETUP_TIMEOUT_MS, &rtt, &gbps, &e);
    hc_probe_close(&pc, !rc);
    hn_msg r = {.type = HN_MSG_PROFILE, .seq = req->seq};
    char why[HN_MAX_VALUE];
    if (rc) { /* the head learns why and keeps its estimate; the session goes on */
        char esc[HN_MAX_NAME * 4 + 1];
        snprintf(why, sizeof why, "%.80s: %.160s", hr_escape(esc, sizeof esc, addr, strlen(addr)), e.msg);
        HR_LOGW("worker: measuring the link to %s", why);
        r.u.profile.kv[0] = (hn_kv){hn_cstr("error"), hn_cstr(why)};
        r.u.profile.n_kv = 1;
    } else {
        snprintf(vals[0], sizeof vals[0], "%.6g", rtt);
        snprintf(vals[1], sizeof vals[1], "%.6g", gbps);
        r.u.profile.kv[0] = (hn_kv){hn_cstr("rtt_ms"), hn_cstr(vals[0])};
        r.u.profile.kv[1] = (hn_kv){hn_cstr("gbps"), hn_cstr(vals[1])};
        r.u.profile.n_kv = 2;
    }
    e = (hr_err){0};
    if (hn_msg_send(s->head, &r, hn_deadline_ms(HC_SETUP_TIMEOUT_MS), &e)) {
        HR_LOGW("worker: head %s: %s", s->head_name, e.msg);
        return e.code;
    }
    return 0;
}

/* ---- LOAD_PLAN and the slices ---- */

/* pipeline units: whole layers, ascending, at least one; the share is every unit of them */
static int hc_parse_layers(hc_session *s, const hn_load_plan *p, uint32_t seq) {
    int L = s->hp.n_layer;
    if (p->n_units < 1 || p->n_units > (uint32_t)L)
        return hc_bad(s, seq, HR_EPROTO, "LOAD_PLAN: a pipeline stage of %u layers out of %d", p->n_units, L);
    if (!(s->layers = calloc((size_t)L, 1))) return hc_bad(s, seq, HR_ENOMEM, "out of memory");
    int runs = 0;
    for (uint32_t i = 0; i < p->n_units; i++) {
        const hn_unit *u = &p->units[i];
        if (u->kind != HN_UNIT_LAYER || u->begin != 0 || u->end != 1 || u->layer >= (uint32_t)L ||
            (i > 0 && u->layer <= p->units[i - 1].layer))
            return hc_bad(s, seq, HR_EPROTO, "LOAD_PLAN: pipeline unit %u is not a whole layer after the previous one", i);
        s->layers[u->layer] = 1;
        runs += i == 0 || u->layer != p->units[i - 1].layer + 1;
    }
    if (runs > HM_MAX_WINDOWS)
        return hc_bad(s, seq, HR_EUNSUPPORTED, "LOAD_PLAN: %d windows of layers (at most %d per device)", runs,
                      HM_MAX_WINDOWS);
    s->n_layers = (int)p->n_units;
    s->share = (hc_share){0, s->hp.n_head_kv, 0, s->hp.n_ff, 0};
    return 0;
}

/* tensor-parallel units: the same attention heads and FFN rows in every layer (one share per device
   for now) — of every layer, or (a member of the head's group in a hybrid plan) of the head's layers,
   ascending */
static int hc_parse_share(hc_session *s, const hn_load_plan *p, uint32_t seq) {
    int64_t gqa = s->hp.n_head / s->hp.n_head_kv;
    const uint32_t L = (uint32_t)s->hp.n_layer;
    const bool part = s->stage_tp || s->lead; /* a hybrid plan's group: some layers */
    if (part ? p->n_units < 2 || p->n_units > 2 * L || p->n_units % 2 : p->n_units != 2 * L)
        return hc_bad(s, seq, HR_EPROTO, "LOAD_PLAN: %u units for %d layers (expected 2 per layer%s)", p->n_units,
                      s->hp.n_layer, part ? " of the group's stage" : "");
    if (part && !(s->layers = calloc(L, 1))) return hc_bad(s, seq, HR_ENOMEM, "out of memory");
    int runs = 0;
    for (uint32_t i = 0; i < p->n_units; i++) {
        const hn_unit *u = &p->units[i];
        bool att = u->kind == HN_UNIT_ATTN_HEADS;
        /* the layer of a pair: all of them in order, or any ascending ones of a hybrid group's member */
        uint32_t want = part ? (i % 2 ? p->units[i - 1].layer : u->layer) : i / 2;
        if (u->layer != want || u->layer >= L || u->kind != (i % 2 ? HN_UNIT_FFN_ROWS : HN_UNIT_ATTN_HEADS) ||
            (part && i >= 2 && i % 2 == 0 && u->layer <= p->units[i - 2].layer))
            return hc_bad(s, seq, HR_EUNSUPPORTED, "LOAD_PLAN: unit %u is not layer %u's %s", i, want,
                          i % 2 ? "FFN rows" : "attention heads");
        if (att && (u->begin % gqa || u->end % gqa || u->end > (uint32_t)s->hp.n_head))
            return hc_bad(s, seq, HR_EPROTO, "LOAD_PLAN: attention heads [%u, %u) do not cover whole KV groups",
                          u->begin, u->end);
        if (!att && u->end > (uint32_t)s->hp.n_ff) return hc_bad(s, seq, HR_EPROTO, "LOAD_PLAN: FFN rows beyond n_ff");
        hc_share sh = s->share;
        if (att) { sh.kv_begin = (int32_t)(u->begin / gqa); sh.kv_end = (int32_t)(u->end / gqa); }
        else { sh.ff_begin = (int32_t)u->begin; sh.ff_end = (int32_t)u->end; }
        if (i >= 2 && memcmp(&sh, &s->share, sizeof sh))
            return hc_bad(s, seq, HR_EUNSUPPORTED, "LOAD_PLAN: shares that differ between layers are not supported");
        s->share = sh;
        if (part && att) {
            runs += i == 0 || u->layer != p->units[i - 2].layer + 1;
            s->layers[u->layer] = 1;
            s->n_layers++;
        }
    }
    if (runs > HM_MAX_WINDOWS)
        return hc_bad(s, seq, HR_EUNSUPPORTED, "LOAD_PLAN: %d windows of layers (at most %d per device)", runs,
                      HM_MAX_WINDOWS);
    return 0;
}

/* The plan into the session: devices, hyper-parameters (untrusted: the model's checks), settings, units. */
static int hc_parse_plan(hc_session *s, const hn_msg *msg) {
    const hn_load_plan *p = &msg->u.load_plan;
    uint32_t seq = msg->seq;
    s->model_hash = p->model_hash;
    s->index = p->device_index;
    s->n_dev = p->n_devices;
    if (s->n_dev < 2 || s->n_dev > HC_MAX_DEVICES || s->index == 0)
        return hc_bad(s, seq, HR_EPROTO, "LOAD_PLAN: device %u of %u is not a worker's place", s->index, s->n_dev);
    char arch[sizeof s->hp.arch_name];
    if (p->arch.n == 0 || p->arch.n >= sizeof arch) return hc_bad(s, seq, HR_EPROTO, "LOAD_PLAN: bad arch");
    hr_escape(arch, sizeof arch, p->arch.s, p->arch.n); /* it may end up in a message */
    hm_kv_io io = {.form = HM_KV_PLAN, .user = (void *)p, .get = hc_plan_get};
    hr_err e = {0};
    if (hm_hparams_from_kv(&s->hp, arch, &io, &e)) return hc_bad(s, seq, HR_EPROTO, "LOAD_PLAN: %s", e.msg);
    const hn_str *v;
    uint64_t x;
#define U(key, var, lo, hi) \
    if (!(v = hc_param(p, key)) || !hc_parse_u64(*v, &x, 10) || (int64_t)x < (int64_t)(lo) || x > (hi)) \
        return hc_bad(s, seq, HR_EPROTO, "LOAD_PLAN: parameter '%s' missing or out of range", key); \
    var = x;
    U("n_ctx", s->n_ctx, 1, 1u << 24)
    U("n_batch", s->n_batch, 1, 1u << 16)
    s->n_seq = 1; /* optional: a head of before issue 27 sends none */
    if ((v = hc_param(p, "n_seq")) && (!hc_parse_u64(*v, &x, 10) || x < 1 || x > HM_MAX_SEQ))
        return hc_bad(s, seq, HR_EPROTO, "LOAD_PLAN: bad 'n_seq'");
    if (v) s->n_seq = (int32_t)x;
    U("kv_type", s->kv_type, 0, 64)
    U("allreduce", s->mode, 0, 1)
    U("timeout_ms", s->timeout_ms, 100, 24u * 3600 * 1000)
    U("n_slices", s->n_dir, 1, HC_MAX_SLICES)
    U("ring_prev_worker", s->ring_prev_worker, 0, 1)
#undef U
    if ((v = hc_param(p, "pp")) && (!hc_parse_u64(*v, &x, 10) || x > 1))
        return hc_bad(s, seq, HR_EPROTO, "LOAD_PLAN: bad 'pp'");
    s->pp = v && x == 1;
    /* hybrid: a group of tp_group devices, this one at group_index — 0 the leader (a worker that is a
       pipeline stage; it connects to its members), else a member (it all-reduces with its leader only:
       the head over the session connection, or a worker over the connection that one opens) */
    s->tp_group = (int)s->n_dev;
    s->group_index = (int)s->index;
    if ((v = hc_param(p, "tp_group"))) {
        const hn_str *gi = hc_param(p, "group_index");
        uint64_t y;
        if (!hc_parse_u64(*v, &x, 10) || x < 2 || x > s->n_dev || !gi || !hc_parse_u64(*gi, &y, 10) || y >= x ||
            (y == 0) != s->pp || s->mode)
            return hc_bad(s, seq, HR_EPROTO, "LOAD_PLAN: bad 'tp_group' or 'group_index'");
        s->tp_group = (int)x, s->group_index = (int)y;
        s->stage_tp = y > 0, s->lead = y == 0;
    }
    if (s->lead) {
        if (!(v = hc_param(p, "group_members")) || !(v = hc_param(p, "group_token")) ||
            !hc_parse_u64(*v, &s->group_token, 16))
            return hc_bad(s, seq, HR_EPROTO, "LOAD_PLAN: a group's leader without 'group_members' or 'group_token'");
        hr_escape(s->group_members, sizeof s->group_members, hc_param(p, "group_members")->s,
                  hc_param(p, "group_members")->n);
    }
    if (s->kv_type != HQ_TYPE_F16 && s->kv_type != HQ_TYPE_F32) return hc_bad(s, seq, HR_EPROTO, "LOAD_PLAN: bad kv_type");
    if ((v = hc_param(p, "ring_next"))) hr_escape(s->ring_next, sizeof s->ring_next, v->s, v->n);
    if ((v = hc_param(p, "ring_token")) && !hc_parse_u64(*v, &s->ring_token, 16))
        return hc_bad(s, seq, HR_EPROTO, "LOAD_PLAN: bad ring_token");
    /* the lossy all-reduce: where the head takes the datagrams, the session they carry, the test hook */
    if ((v = hc_param(p, "lossy_port")) && (!hc_parse_u64(*v, &x, 10) || x < 1 || x > 65535 || s->pp || s->mode))
        return hc_bad(s, seq, HR_EPROTO, "LOAD_PLAN: bad 'lossy_port' (or lossy with a pipeline or ring)");
    if (v) {
        s->lossy_port = (uint16_t)x;
        if (!(v = hc_param(p, "lossy_session")) || !hc_parse_u64(*v, &s->lossy_session, 16))
            return hc_bad(s, seq, HR_EPROTO, "LOAD_PLAN: bad 'lossy_session'");
        if (!(v = hc_param(p, "lossy_max_tokens")) || !hc_parse_u64(*v, &x, 10) || x < 1 || x > HC_LOSSY_MAX_TOKENS)
            return hc_bad(s, seq, HR_EPROTO, "LOAD_PLAN: bad 'lossy_max_tokens'");
        s->lossy_max_tokens = (int)x;
        if (!(v = hc_param(p, "lossy_deadline_ms")) || !hc_parse_u64(*v, &x, 10) || x < 1 || x > 60000)
            return hc_bad(s, seq, HR_EPROTO, "LOAD_PLAN: bad 'lossy_deadline_ms'");
        s->lossy_deadline_ms = (int)x;
        if ((v = hc_param(p, "lossy_protect"))) { /* N:RANK:GROUP */
            char b[64], *end;
            hn_str_copy(b, sizeof b, *v);
            long n = strtol(b, &end, 10), k = *end == ':' ? strtol(end + 1, &end, 10) : 0;
            long g = *end == ':' ? strtol(end + 1, &end, 10) : 0;
            if (*end || n < 1 || k < 1 || k > s->hp.n_embd || g < 1 || g > s->hp.n_ff || n > s->hp.n_ff)
                return hc_bad(s, seq, HR_EPROTO, "LOAD_PLAN: bad 'lossy_protect'");
            s->prot_n = (int32_t)n, s->prot_rank = (int32_t)k, s->prot_group = (int32_t)g;
        }
        if ((v = hc_param(p, "lossy_drop"))) {
            char b[64], *colon;
            hn_str_copy(b, sizeof b, *v);
            unsigned long long seed = strtoull(b, &colon, 16);
            char *end = colon;
            unsigned long ppm = *colon == ':' ? strtoul(colon + 1, &end, 10) : 1000001;
            unsigned long dup = *end == ':' ? strtoul(end + 1, &end, 10) : 2;
            if (ppm > 1000000 || dup > 1 || *end) return hc_bad(s, seq, HR_EPROTO, "LOAD_PLAN: bad 'lossy_drop'");
            s->drop_seed = seed;
            s->drop_ppm = (uint32_t)ppm;
            s->drop_dup = dup == 1;
        }
    }
    int rc = s->pp && !s->lead ? hc_parse_layers(s, p, seq) : hc_parse_share(s, p, seq);
    /* importance-aware placement: the worker's ranges are positions in orders only the head knows;
       their hash keeps the slice files of different placements apart (docs/lossy.md) */
    if (!rc && (v = hc_param(p, "placement")) && (!hc_parse_u64(*v, &s->share.placement, 16) || !s->share.placement || s->pp))
        return hc_bad(s, seq, HR_EPROTO, "LOAD_PLAN: bad 'placement'");
    return rc;
}

static bool hc_name_ok(const char *n) {
    if (!n[0]) return false;
    for (const char *c = n; *c; c++)
        if (*c < 0x21 || *c > 0x7e) return false;
    return true;
}

static int hc_recv_directory(hc_session *s) {
    if (!(s->dir = calloc((size_t)s->n_dir, sizeof *s->dir))) return hc_bad(s, 0, HR_ENOMEM, "out of memory");
    for (int i = 0; i < s->n_dir; i++) {
        hn_msg m;
        hr_err e = {0};
        if (hn_msg_recv(s->head, &s->rx, &m, hn_deadline_ms(HC_SETUP_TIMEOUT_MS), &e))
            return hc_bad(s, 0, e.code, "receiving the slice directory: %s", e.msg);
        if (m.type != HN_MSG_SLICE_BEGIN)
            return hc_bad(s, m.seq, HR_EPROTO, "expected SLICE_BEGIN %d of %d, got %s", i + 1, s->n_dir,
                          hn_msg_name(m.type));
        const hn_slice_begin *b = &m.u.slice_begin;
        hc_slice *d = &s->dir[i];
        if (b->name.n >= sizeof d->name) return hc_bad(s, m.seq, HR_EPROTO, "slice name too long");
        hn_str_copy(d->name, sizeof d->name, b->name);
        if (!hc_name_ok(d->name)) return hc_bad(s, m.seq, HR_EPROTO, "slice %d: bad name", i);
        if (!hq_type_valid((int)b->dtype) || b->n_dims < 1 || b->n_dims > 4)
            return hc_bad(s, m.seq, HR_EPROTO, "slice '%s': type %u / %u dims not supported", d->name, b->dtype,
                          b->n_dims);
        d->type = (int)b->dtype;
        d->n_dims = (int)b->n_dims;
        uint64_t rows = 1;
        for (int k = 0; k < 4; k++) {
            d->ne[k] = k < d->n_dims ? (int64_t)b->ne[k] : 1;
            if (b->ne[k] < 1 || b->ne[k] > (1u << 30) || (k >= d->n_dims && b->ne[k] != 1))
                return hc_bad(s, m.seq, HR_EPROTO, "slice '%s': bad shape", d->name);
            if (k > 0) rows *= b->ne[k];
        }
        const hq_traits *tr = hq_get_traits(d->type);
        size_t rb = hq_row_size(d->type, d->ne[0]);
        if (d->ne[0] % tr->blck_size || rb == 0 || rows > HC_MAX_SLICE_BYTES / rb || (uint64_t)rb * rows != b->size ||
            b->size > HC_MAX_SLICE_BYTES)
            return hc_bad(s, m.seq, HR_EPROTO, "slice '%s': %llu bytes do not match its %s shape", d->name,
                          (unsigned long long)b->size, tr->name);
        d->size = b->size;
        d->hash = b->hash;
        for (int j = 0; j < i; j++)
            if (!strcmp(s->dir[j].name, d->name)) return hc_bad(s, m.seq, HR_EPROTO, "slice '%s' twice", d->name);
    }
    return 0;
}

/* The cached slice files of this model: their mappings, to find tensors by content hash. */
typedef struct hc_index {
    hc_src  *src;
    int      n;
} hc_index;

static void hc_index_free(hc_index *x) {
    for (int i = 0; i < x->n; i++) gguf_close(x->src[i].g);  /* NULL: closed already */
    free(x->src);
    memset(x, 0, sizeof *x);
}

static void hc_index_scan(const char *dir, hc_index *x) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n < 6 || strcmp(de->d_name + n - 5, ".gguf")) continue;
        hc_src s = {0};
        if ((size_t)snprintf(s.path, sizeof s.path, "%s/%s", dir, de->d_name) >= sizeof s.path) continue;
        hr_err e = {0};
        if (!(s.g = gguf_open(s.path, &e))) {
            HR_LOGW("worker: ignoring unreadable cache file %s: %s", s.path, e.msg);
            continue;
        }
        hc_src *nv = realloc(x->src, (size_t)(x->n + 1) * sizeof *nv);
        if (!nv) { gguf_close(s.g); break; }
        x->src = nv;
        x->src[x->n++] = s;
    }
    closedir(d);
}

/* a cached tensor with this content hash and size: its bytes, or NULL */
static const void *hc_index_find(const hc_index *x, uint64_t hash, uint64_t size, int *which) {
    for (int f = 0; f < x->n; f++) {
        int et;
        uint64_t n;
        const void *data;
        if (!x->src[f].g || !gguf_get_arr(x->src[f].g, "hearth.slice.hashes", &et, &n, &data) || et != GGUF_VT_UINT64 ||
            n != (uint64_t)gguf_n_tensors(x->src[f].g))
            continue;
        for (uint64_t t = 0; t < n; t++) {
            uint64_t h;
            memcpy(&h, (const uint8_t *)data + t * 8, 8);
            const gguf_tensor *gt = gguf_tensor_at(x->src[f].g, (int64_t)t);
            if (h == hash && gt->nbytes == size) {
                if (which) *which = f;
                return gt->data;
            }
        }
    }
    return NULL;
}

/* Receives one missing slice's chunks and SLICE_END into buf (its size) and checks the hash. */
/* Tests (tests/test-recover.sh): HEARTH_TEST_FAULT=ACTION:EVENT:N makes the worker raise SIGKILL
   (ACTION kill) or SIGSTOP (stop) on itself when it receives its N-th message of kind EVENT (plan:
   LOAD_PLAN, slice: SLICE_CHUNK, forward: FORWARD) — once per process — so that a test fails a worker
   at an exact moment of set-up, prompt or generation with the real signal. */
static void hc_test_fault(int type) {
    static int sig = -1, want, seen;
    if (sig == 0) return;
    if (sig < 0) {
        const char *v = getenv("HEARTH_TEST_FAULT");
        char act[8] = "", ev[8] = "";
        sig = 0;
        if (!v || sscanf(v, "%7[a-z]:%7[a-z]:%d", act, ev, &want) != 3 || want < 1) return;
        want = want * 16 + (!strcmp(ev, "plan") ? 1 : !strcmp(ev, "slice") ? 2 : !strcmp(ev, "forward") ? 3 : 0);
        sig = !strcmp(act, "kill") ? SIGKILL : !strcmp(act, "stop") ? SIGSTOP : 0;
    }
    int kind = type == HN_MSG_LOAD_PLAN ? 1 : type == HN_MSG_SLICE_CHUNK ? 2 : type == HN_MSG_FORWARD ? 3 : 0;
    if (!kind || kind != want % 16 || ++seen < want / 16) return;
    int s = sig;
    sig = 0;
    HR_LOGW("worker: HEARTH_TEST_FAULT: raising %s", s == SIGKILL ? "SIGKILL" : "SIGSTOP");
    raise(s);
}

static int hc_recv_slice(hc_session *s, const hc_slice *d, uint8_t *buf) {
    uint64_t got = 0;
    for (;;) {
        hn_msg m;
        hr_err e = {0};
        if (hn_msg_recv(s->head, &s->rx, &m, hn_deadline_ms(HC_SETUP_TIMEOUT_MS), &e))
            return hc_bad(s, 0, e.code, "receiving slice '%s': %s", d->name, e.msg);
        hc_test_fault(m.type);
        if (m.type == HN_MSG_SLICE_CHUNK) {
            const hn_slice_chunk *c = &m.u.slice_chunk;
            if (c->hash != d->hash || c->offset != got || c->n > d->size - got)
                return hc_bad(s, m.seq, HR_EPROTO, "SLICE_CHUNK for '%s' at %llu+%u does not continue it (%llu of %llu "
                              "bytes so far)", d->name, (unsigned long long)c->offset, c->n, (unsigned long long)got,
                              (unsigned long long)d->size);
            memcpy(buf + got, c->data, c->n);
            got += c->n;
            s->weight_bytes += c->n;
            continue;
        }
        if (m.type != HN_MSG_SLICE_END)
            return hc_bad(s, m.seq, HR_EPROTO, "expected SLICE_CHUNK or SLICE_END for '%s', got %s", d->name,
                          hn_msg_name(m.type));
        if (m.u.slice_end.hash != d->hash || m.u.slice_end.size != d->size || got != d->size)
            return hc_bad(s, m.seq, HR_EPROTO, "SLICE_END for '%s' after %llu of %llu bytes", d->name,
                          (unsigned long long)got, (unsigned long long)d->size);
        if (hr_hash64(buf, (size_t)d->size, 0) != d->hash)
            return hc_bad(s, m.seq, HR_EPROTO, "slice '%s' arrived with another content hash than announced", d->name);
        return 0;
    }
}

/* Where hc_write_slices takes a slice's bytes from: the cache or the head. */
typedef struct hc_fill {
    hc_session *s;
    const hc_index *x;
    const bool *have;
    uint8_t *buf;      /* a received slice */
    bool reported;     /* the failure was told to the head already */
} hc_fill;

static int hc_fill_src(void *user, int i, const void **bytes, hr_err *err) {
    hc_fill *f = user;
    const hc_slice *d = &f->s->dir[i];
    if (!f->have[i]) {
        int rc = hc_recv_slice(f->s, d, f->buf);
        f->reported = rc != 0;
        *bytes = f->buf;
        return rc;
    }
    int k = -1;
    *bytes = hc_index_find(f->x, d->hash, d->size, &k);
    if (!*bytes || hr_hash64(*bytes, (size_t)d->size, 0) != d->hash) {
        /* the cache lied: drop that file so the next run re-sends it */
        if (k >= 0) unlink(f->x->src[k].path);
        return hr_fail(err, HR_EIO, "cached slice '%s' is corrupt (removed it; run again)", d->name);
    }
    return 0;
}

/* Writes the share's slice file from cached tensors and received ones. */
static int hc_write_slices(hc_session *s, const hc_index *x, const bool *have) {
    uint64_t max = 0;
    for (int i = 0; i < s->n_dir; i++) if (!have[i]) max = HR_MAX(max, s->dir[i].size);
    hc_fill f = {.s = s, .x = x, .have = have, .buf = max ? malloc((size_t)max) : NULL};
    if (max && !f.buf) return hc_bad(s, 0, HR_ENOMEM, "out of memory for the slice file");
    hc_slice_meta mt = {.hp = &s->hp, .share = s->share, .model_hash = s->model_hash, .layers = s->layers};
    hr_err e = {0};
    int rc = hc_slice_file_write(s->path, &mt, s->dir, s->n_dir, hc_fill_src, &f, &e);
    if (rc && !f.reported) rc = hc_bad(s, 0, rc, "%s", e.msg);
    free(f.buf);
    return rc;
}

/* Every tensor of the file has the announced content hash (a reused file is checked, not trusted). */
static int hc_verify_file(hc_session *s) {
    int bad = hc_slice_file_check(s->g, s->dir, s->n_dir);
    if (bad < 0) return 0;
    unlink(s->path);
    return hc_bad(s, 0, HR_EIO, "cached slice file %s is corrupt at '%s' (removed it; run again)", s->path,
                  s->dir[bad].name);
}

static int hc_ring_setup(hc_session *s) {
    hr_err e = {0};
    char tok[17];
    snprintf(tok, sizeof tok, "%016llx", (unsigned long long)s->ring_token);
    if (s->ring_next[0]) {
        if (!(s->ring_next_conn = hn_connect_secure(s->ring_next, hc_key(s->w), hn_deadline_ms(10000), &e)))
            return hc_bad(s, 0, e.code, "ring: %s", e.msg);
        char dev[32];
        snprintf(dev, sizeof dev, "ring %s", tok);
        hn_msg h = {.type = HN_MSG_HELLO};
        h.u.hello = (hn_hello){.version_min = HN_PROTO_VERSION, .version_max = HN_PROTO_VERSION,
                               .caps = HN_CAP_F32_ACT, .device = hn_cstr(dev)};
        if (hn_msg_send(s->ring_next_conn, &h, hn_deadline_ms(10000), &e)) return hc_bad(s, 0, e.code, "ring: %s", e.msg);
    }
    if (s->ring_prev_worker) {
        int64_t deadline = hn_deadline_ms(HC_SETUP_TIMEOUT_MS);
        while (!(s->pending_ring && s->pending_token == s->ring_token)) {
            if (hr_time_ns() > deadline) return hc_bad(s, 0, HR_ETIMEDOUT, "ring: the previous worker did not connect");
            hc_check_pending(s);
            if (!(s->pending_ring && s->pending_token == s->ring_token)) {
                struct timespec ts = {0, 20 * 1000000};
                nanosleep(&ts, NULL);
            }
        }
        s->ring_prev_conn = s->pending_ring;
        s->pending_ring = NULL;
    }
    return 0;
}

/* Receives the head's SLICE_HAVE question (every slice of the directory, in its order); its seq. */
static int hc_recv_have(hc_session *s, uint32_t *seq) {
    hn_msg m;
    hr_err e = {0};
    if (hn_msg_recv(s->head, &s->rx, &m, hn_deadline_ms(HC_SETUP_TIMEOUT_MS), &e))
        return hc_bad(s, 0, e.code, "waiting for SLICE_HAVE: %s", e.msg);
    if (m.type != HN_MSG_SLICE_HAVE || m.u.slice_have.model_hash != s->model_hash ||
        m.u.slice_have.n_hashes != (uint32_t)s->n_dir)
        return hc_bad(s, m.seq, HR_EPROTO, "expected SLICE_HAVE for the %d slices, got %s", s->n_dir, hn_msg_name(m.type));
    for (int i = 0; i < s->n_dir; i++) {
        uint64_t h;
        memcpy(&h, &m.u.slice_have.hashes[i], 8);
        if (h != s->dir[i].hash) return hc_bad(s, m.seq, HR_EPROTO, "SLICE_HAVE hash %d differs from the directory's", i);
    }
    *seq = m.seq;
    return 0;
}

/* The model's cache folder (created) into model_dir, and the share's slice file in it into s->path. */
static int hc_cache_path(hc_session *s, char *model_dir, size_t cap) {
    hr_err e = {0};
    bool all = s->layers != NULL;
    for (int il = 0; all && il < s->hp.n_layer; il++) all = s->layers[il];
    uint64_t key = hc_slice_key(s->model_hash, &s->share, s->dir, s->n_dir, all);
    if (hc_slice_path(s->w->cache, s->model_hash, key, model_dir, cap, s->path, sizeof s->path, &e))
        return hc_bad(s, 0, e.code, "%s", e.msg);
    return 0;
}

/* Room in the cache for the share's file (before the head is told what to send, so that a share that
   cannot be kept ends the set-up with a clear ERROR, not a half-written file): the files that give
   tensors to it are marked used and kept, the other mapped ones closed so that evicting them frees
   their space. */
static int hc_cache_room(hc_session *s, hc_index *x, const bool *have) {
    bool *used = calloc((size_t)x->n + 1, sizeof *used);
    const char **keep = calloc((size_t)x->n + 1, sizeof *keep);
    int nk = 0, rc = 0;
    if (!used || !keep) { rc = hc_bad(s, 0, HR_ENOMEM, "out of memory"); goto done; }
    for (int i = 0; i < s->n_dir; i++) {
        int k = -1;
        if (have[i] && hc_index_find(x, s->dir[i].hash, s->dir[i].size, &k) && k >= 0) used[k] = true;
    }
    for (int f = 0; f < x->n; f++) {
        if (used[f]) {
            keep[nk++] = x->src[f].path;
            hc_cache_touch(x->src[f].path);
        } else {
            gguf_close(x->src[f].g);
            x->src[f].g = NULL;
        }
    }
    keep[nk++] = s->path;
    hr_err e = {0};
    uint64_t need = hc_slice_file_bytes(s->dir, s->n_dir), evicted = 0, more = 0;
    const char *self = s->path;
    /* the files that give tensors go last: evicted, they stay readable through their mappings until
       the new file is written (but their space comes back only then) */
    if (hc_cache_make_room(s->w->cache, need, s->w->cache_max, keep, nk, &evicted, &e) &&
        (e = (hr_err){0}, hc_cache_make_room(s->w->cache, need, s->w->cache_max, &self, 1, &more, &e)))
        rc = hc_bad(s, 0, e.code, "%s", e.msg);
    else if ((evicted += more))
        HR_LOGI("worker: evicted %.1f MiB of least recently used slice files to make room",
                (double)evicted / (1 << 20));
done:
    free(used);
    free(keep);
    return rc;
}

/* Answers SLICE_HAVE from the cache and writes the share's slice file unless it is there whole
   (*complete: then it is to be verified once loaded). */
static int hc_fill_cache(hc_session *s, bool *complete) {
    uint32_t have_seq = 0;
    char model_dir[PATH_MAX];
    int rc;
    if ((rc = hc_recv_have(s, &have_seq)) || (rc = hc_cache_path(s, model_dir, sizeof model_dir))) return rc;
    hc_index x = {0};
    hc_index_scan(model_dir, &x);
    bool *have = calloc((size_t)s->n_dir, sizeof *have);
    uint64_t *hv = malloc((size_t)s->n_dir * sizeof *hv);
    hr_err e = {0};
    if (!have || !hv) { rc = hc_bad(s, 0, HR_ENOMEM, "out of memory"); goto done; }
    uint32_t nh = 0;
    for (int i = 0; i < s->n_dir; i++)
        if (hc_index_find(&x, s->dir[i].hash, s->dir[i].size, NULL)) { have[i] = true; hv[nh++] = s->dir[i].hash; }
    *complete = nh == (uint32_t)s->n_dir && access(s->path, R_OK) == 0;
    if (*complete) hc_cache_touch(s->path);
    else if ((rc = hc_cache_room(s, &x, have))) goto done;
    hn_msg r = {.type = HN_MSG_SLICE_HAVE, .seq = have_seq};
    r.u.slice_have = (hn_slice_have){.model_hash = s->model_hash, .n_hashes = nh, .hashes = hv};
    if (hn_msg_send(s->head, &r, hn_deadline_ms(HC_SETUP_TIMEOUT_MS), &e)) { rc = hc_bad(s, 0, e.code, "%s", e.msg); goto done; }
    HR_LOGI("worker: share kv [%d, %d) ff [%d, %d): %u of %d slices cached%s", s->share.kv_begin, s->share.kv_end,
            s->share.ff_begin, s->share.ff_end, nh, s->n_dir, *complete ? " (the whole file)" : "");
    if (!*complete) rc = hc_write_slices(s, &x, have);
done:
    hc_index_free(&x);
    free(have);
    free(hv);
    return rc;
}

/* Loads the slice file as a model and checks it holds the planned share (verified first if reused).
   A file that fails any of it is removed, as one with a corrupt byte is, so that the next run sends
   the share again. */
static int hc_open_slices(hc_session *s, bool complete) {
    hr_err e = {0};
    char why[256];
    int rc;
    if (s->hold_fd < 0) s->hold_fd = hc_cache_hold(s->path);  /* not evicted while this session runs */
    if (!(s->g = gguf_open(s->path, &e)) || !(s->m = hm_model_load(s->g, &e))) {
        unlink(s->path);
        return hc_bad(s, 0, e.code ? e.code : HR_EFORMAT, "slice file %s: %s (removed it; run again)", s->path, e.msg);
    }
    hc_slice_meta mt = {.hp = &s->hp, .share = s->share, .model_hash = s->model_hash, .layers = s->layers};
    if (!hc_slice_file_matches(s->g, s->m, &mt, s->dir, s->n_dir, why, sizeof why)) {
        unlink(s->path);
        return hc_bad(s, 0, HR_EFORMAT, "slice file %s does not hold the planned share: %s (removed it; run again)",
                      s->path, why);
    }
    if (complete && (rc = hc_verify_file(s))) return rc;
    return 0;
}

/* A group's leader: connects to its members (HELLO "ring <group token>"), the all-reduce's links
   [1..tp_group). */
static int hc_group_connect(hc_session *s) {
    char list[sizeof s->group_members], *save = NULL;
    snprintf(list, sizeof list, "%s", s->group_members);
    int n = 1;
    for (char *a = strtok_r(list, ",", &save); a; a = strtok_r(NULL, ",", &save), n++) {
        if (n >= s->tp_group) break;
        hr_err e = {0};
        if (!(s->ar_conn[n] = hn_connect_secure(a, hc_key(s->w), hn_deadline_ms(10000), &e)))
            return hc_bad(s, 0, e.code, "group member %s: %s", a, e.msg);
        char dev[32];
        snprintf(dev, sizeof dev, "ring %016llx", (unsigned long long)s->group_token);
        hn_msg h = {.type = HN_MSG_HELLO};
        h.u.hello = (hn_hello){.version_min = HN_PROTO_VERSION, .version_max = HN_PROTO_VERSION,
                               .caps = HN_CAP_F32_ACT, .device = hn_cstr(dev)};
        if (hn_msg_send(s->ar_conn[n], &h, hn_deadline_ms(10000), &e))
            return hc_bad(s, 0, e.code, "group member %s: %s", a, e.msg);
        snprintf(s->names[n], sizeof s->names[n], "%s", a);
    }
    if (n != s->tp_group)
        return hc_bad(s, 0, HR_EPROTO, "LOAD_PLAN: 'group_members' names %d devices for a group of %d", n - 1,
                      s->tp_group);
    return 0;
}

/* The all-reduce over the head, and the ring links to the neighbours (a ring all-reduce, or a
   pipeline, which passes hidden states over them). */
static int hc_link(hc_session *s) {
    int rc;
    s->ar = (hc_ar){.mode = s->mode, .k = s->tp_group, .me = s->group_index, .timeout_ms = s->timeout_ms,
                    .n_layer = s->hp.n_layer};
    s->ar_conn[0] = s->head;
    s->ar.conn = s->ar_conn;
    s->ar.rx = s->ar_rx;
    for (int i = 0; i < (int)s->n_dev; i++) {
        snprintf(s->names[i], sizeof s->names[i], "%s", i == 0 ? s->head_name : "(ring peer)");
        s->name_ptr[i] = s->names[i];
    }
    s->ar.names = s->name_ptr;
    if (s->lossy_port) {
        hr_err e = {0};
        if (!(s->ll.udp = hn_udp_open(s->head, &e)) || hn_udp_connect(s->ll.udp, s->head, s->lossy_port, &e) ||
            hn_dgram_crypt_init(&s->ll.crypt, s->head, &e))
            return hc_bad(s, 0, e.code, "lossy all-reduce: %s", e.msg);
        s->ar.lossy = true;
        s->ar.session = s->lossy_session;
        s->ar.drop_seed = s->drop_seed;
        s->ar.drop_ppm = s->drop_ppm;
        s->ar.dup = s->drop_dup;
        s->ar.lossy_max_tokens = s->lossy_max_tokens;
        s->ar.lossy_deadline_ms = s->lossy_deadline_ms;
        s->ar.ll = &s->ll;
    }
    /* links: a ring all-reduce's, a pipeline stage's, or a worker-led group member's to its leader */
    if (s->mode != HC_ALLREDUCE_RING && !s->pp && !(s->stage_tp && s->ring_prev_worker)) return 0;
    if ((rc = hc_ring_setup(s))) return rc;
    if (s->stage_tp) { /* a member of a worker's group: the leader connected, the star's centre */
        s->ar_conn[0] = s->ring_prev_conn;
        snprintf(s->names[0], sizeof s->names[0], "%s", hn_conn_peer(s->ring_prev_conn));
        return 0;
    }
    if (s->lead && (rc = hc_group_connect(s))) return rc;
    /* the ring's first worker (worker 1, or the first stage after a hybrid plan's group) hears from the
       head; a pipeline's neighbours are the stages' leaders, wherever the plan put them */
    int nx = (int)(s->index + 1) % (int)s->n_dev, pv = s->ring_prev_worker ? (int)s->index - 1 : 0;
    if (s->pp) nx = s->ring_next_conn ? nx : 0;
    s->ar.next_dev = nx;
    s->ar.prev_dev = pv;
    s->ar.next = s->ring_next_conn ? s->ring_next_conn : s->head;
    s->ar.prev = s->ring_prev_conn ? s->ring_prev_conn : s->head;
    if (s->ring_next_conn) snprintf(s->names[nx], sizeof s->names[nx], "%s", s->ring_next);
    if (s->ring_prev_conn) snprintf(s->names[pv], sizeof s->names[pv], "%s", hn_conn_peer(s->ring_prev_conn));
    if ((nx == 0) != (s->ring_next_conn == NULL) || (pv == 0) != (s->ring_prev_conn == NULL))
        return hc_bad(s, 0, HR_EPROTO, "LOAD_PLAN: ring links do not match device %u of %u", s->index, s->n_dev);
    hc_ar_ring_init(&s->ar);
    return 0;
}

/* the worker's FFN hook, in a lossy pass: zeroes the groups the head computes (hm_protect) */
static void hc_worker_ffn(void *user, int layer, bool after, const float *xn, float *act, int64_t n_ff, float *o, int n) {
    (void)o;
    hc_session *s = user;
    if (after || !hc_ar_lossy_on(&s->ar, layer, n)) return;
    for (int t = 0; t < n; t++) {
        hm_protect_select(s->prot, layer, xn + (size_t)t * s->hp.n_embd, s->prot_sel);
        hm_protect_mask(s->prot, s->prot_sel, act + (size_t)t * n_ff);
    }
}

/* The residency manager, the weights in memory and the context (KV cache) of the share. */
static int hc_create_context(hc_session *s) {
    hr_err e = {0};
    const hm_hparams *hp = &s->m->hp;
    hm_ctx_params cp = hm_ctx_default_params();
    cp.n_ctx = s->n_ctx;
    cp.n_seq = s->n_seq;
    cp.n_batch = s->n_batch;
    cp.n_threads = s->w->n_threads;
    cp.kv_type = s->kv_type;
    hm_shard sh = hm_shard_full(s->m);   /* a pipeline stage: its windows */
    if (!s->pp || s->lead) {
        sh.sync = hc_ar_sync;
        sh.sync_user = &s->ar;
    }
    if (s->prot_n) { /* the head computes the protected groups: from the slice's rows, before they may stream */
        const hm_protect_params pp = {.n_ff = s->share.ff_end - s->share.ff_begin, .group = s->prot_group,
                                      .rank = s->prot_rank, .n_protect = s->prot_n};
        if (!(s->prot = hm_protect_create(s->m, &pp, &e)) ||
            !(s->prot_sel = malloc(sizeof *s->prot_sel * (size_t)s->prot_n)))
            return hc_bad(s, 0, s->prot ? HR_ENOMEM : e.code, "lossy_protect: %s", s->prot ? "out of memory" : e.msg);
        sh.ffn = hc_worker_ffn;
        sh.ffn_user = s;
        HR_LOGI("worker: the head computes %d of this share's FFN groups per token (predictor rank %d)", s->prot_n,
                s->prot_rank);
    }
    /* the plan follows the KV cache's use, as on one device (docs/memory.md, "The KV cache grows into
       the budget"): each FORWARD says how many positions are in use. With several sequences the cache
       fills per sequence, so the whole of it counts from the start, as before */
    if (hmem_setup_kv(s->m, &sh, s->path, &s->w->mem, hm_ctx_bytes_for_shard(hp, &sh, &cp),
                      hm_ctx_base_bytes_for_shard(hp, &sh, &cp), s->n_seq == 1 ? s->n_ctx : 0, &s->mem, &e))
        return hc_bad(s, 0, e.code, "%s", e.msg);
    if (s->mem) {
        char line[512];
        hmem_summary(s->mem, line, sizeof line);
        HR_LOGI("worker: %s", line);
    }
    if (hmem_load_weights(s->mem, s->m, &sh, s->w->use_mmap, s->w->no_repack, &e)) return hc_bad(s, 0, e.code, "%s", e.msg);
    if (!(s->ctx = hm_ctx_create(s->m, &sh, &cp, &e))) return hc_bad(s, 0, e.code, "%s", e.msg);
    memcpy(s->win, sh.windows, sizeof s->win);
    if ((s->pp || s->stage_tp) && !(s->pp_out = hr_alloc_aligned((size_t)s->n_batch * hp->n_embd * sizeof(float), 64)))
        return hc_bad(s, 0, HR_ENOMEM, "out of memory");
    return 0;
}

/* READY to the plan's seq; the links' counters from here on are the session's. */
static int hc_send_ready(hc_session *s, uint32_t seq) {
    hr_err e = {0};
    hn_msg rd = {.type = HN_MSG_READY, .seq = seq};
    rd.u.ready = (hn_ready){.model_hash = s->model_hash, .weight_bytes = s->weight_bytes, .n_slices = (uint32_t)s->n_dir};
    if (hn_msg_send(s->head, &rd, hn_deadline_ms(HC_SETUP_TIMEOUT_MS), &e)) return hc_bad(s, 0, e.code, "%s", e.msg);
    hn_conn_get_stats(s->head, &s->base_stats);
    if (s->ring_next_conn) hn_conn_get_stats(s->ring_next_conn, &s->base_next);
    if (s->ring_prev_conn) hn_conn_get_stats(s->ring_prev_conn, &s->base_prev);
    s->planned = true;
    HR_LOGI("worker: ready: device %u of %u, %.1f MiB of weights (%.1f MiB received), %s", s->index, s->n_dev,
            hm_model_weight_bytes(s->m) / 1048576.0, s->weight_bytes / 1048576.0,
            s->pp ? "pipeline stage" : s->mode == HC_ALLREDUCE_RING ? "ring all-reduce" : "star all-reduce");
    return 0;
}

/* LOAD_PLAN: the plan and the slice directory, the slices (cache or head), the model, the links, the
   context, READY. Any failure has told the head and ends the session. */
/* This worker's share of the KV cache (and scratch) must fit the memory there is: checked when the plan
   arrives, before any weight is sent or any of the cache committed. */
static int hc_check_mem(hc_session *s, uint32_t seq) {
    hm_ctx_params cp = hm_ctx_default_params();
    cp.n_ctx = s->n_ctx;
    cp.n_seq = s->n_seq;
    cp.n_batch = s->n_batch;
    cp.kv_type = s->kv_type;
    hm_shard sh = {.layer_end = s->layers ? s->n_layers : s->hp.n_layer, .kv_begin = 0, .kv_end = -1};
    if (!s->pp || s->lead) {
        sh.kv_begin = s->share.kv_begin;
        sh.kv_end = s->share.kv_end;
    }
    hr_err e = {0};
    if (hmem_check_ctx(hm_ctx_bytes_for_shard(&s->hp, &sh, &cp), &e)) return hc_bad(s, seq, e.code, "%s", e.msg);
    return 0;
}

static int hc_handle_load(hc_session *s, const hn_msg *plan) {
    bool complete = false;
    int rc;
    if ((rc = hc_parse_plan(s, plan)) || (rc = hc_check_mem(s, plan->seq)) || (rc = hc_recv_directory(s)) || (rc = hc_fill_cache(s, &complete)) ||
        (rc = hc_open_slices(s, complete)) || (rc = hc_link(s)) || (rc = hc_create_context(s)))
        return rc;
    return hc_send_ready(s, plan->seq);
}

/* ---- FORWARD ---- */

/* A FORWARD's shape against the session: [layer_begin, n_layer) (tensor parallel: from 0), n_embd,
   a batch that fits; its sequences and positions as hm_eval takes them (each sequence's
   consecutive, inside the context). */
static int hc_check_forward(hc_session *s, const hn_msg *m) {
    const hn_forward *f = &m->u.forward;
    const hm_hparams *hp = &s->m->hp;
    if ((!s->pp && !s->stage_tp && f->layer_begin != 0) || f->layer_begin >= (uint32_t)hp->n_layer ||
        (f->layer_end != (uint32_t)hp->n_layer && !s->stage_tp) || f->stage != HN_STAGE_BLOCK || f->n_embd != (uint32_t)hp->n_embd ||
        f->n_tokens < 1 || f->n_tokens > (uint32_t)s->n_batch)
        return hc_bad(s, m->seq, HR_EPROTO, "FORWARD of layers %u..%u, %u x %u does not fit this session (%d layers, "
                      "n_embd %d, batch %d)", f->layer_begin, f->layer_end, f->n_tokens, f->n_embd, hp->n_layer,
                      hp->n_embd, s->n_batch);
    hr_err e = {0};
    if (hm_batch_check(s->ctx, &(hm_batch){.n = (int32_t)f->n_tokens, .pos_of = f->pos, .seq = f->seq}, &e))
        return hc_bad(s, m->seq, HR_EPROTO, "FORWARD: %s", e.msg);
    return 0;
}

/* Tells the residency manager how many positions the FORWARD fills (it re-plans when the KV cache
   grows past what its plan left room for). Between evals, as hmem_set_positions wants. */
static int hc_mem_positions(hc_session *s, const hn_msg *m) {
    const hn_forward *f = &m->u.forward;
    int32_t top = 0;
    for (uint32_t i = 0; i < f->n_tokens; i++) top = HR_MAX(top, f->pos[i] + 1);
    hr_err e = {0};
    if (s->mem && hmem_set_positions(s->mem, top, &e)) return hc_bad(s, m->seq, e.code, "%s", e.msg);
    return 0;
}

static int hc_handle_forward(hc_session *s, const hn_msg *m) {
    const hn_forward *f = &m->u.forward;
    int rc = hc_check_forward(s, m);
    if (rc || (rc = hc_mem_positions(s, m))) return rc;
    hr_err e = {0};
    /* a member of a hybrid plan's group: the head's window that FORWARD names, [begin, end) */
    int w = -1;
    for (int i = 0; s->stage_tp && i < hm_ctx_n_windows(s->ctx); i++)
        if (s->win[i].begin == (int32_t)f->layer_begin && s->win[i].end == (int32_t)f->layer_end) w = i;
    if (s->stage_tp && w < 0)
        return hc_bad(s, m->seq, HR_EPROTO, "FORWARD of layers %u..%u, which are no window of this worker",
                      f->layer_begin, f->layer_end);
    memset(&s->ar.err, 0, sizeof s->ar.err);
    s->ar.mark = hr_time_ns();
    const hm_batch b = {.embd = f->data, .n = (int32_t)f->n_tokens, .pos_of = f->pos, .seq = f->seq,
                        .embd_out = s->pp_out};
    rc = s->stage_tp ? hm_eval_window(s->ctx, w, &b, &e) : hm_eval(s->ctx, &b, &e);
    s->ar.compute_ns += hr_time_ns() - s->ar.mark;
    if (rc) {
        /* the all-reduce's own message says which peer failed */
        const char *why = s->ar.err.msg[0] ? s->ar.err.msg : e.msg;
        return hc_bad(s, m->seq, rc, "forward pass failed: %s", why);
    }
    if (w <= 0) { /* once per pass */
        s->evals++;
        s->tokens += f->n_tokens;
    }
    return 0;
}

/* Pipeline: runs this worker's window that starts where the pass is and sends the rest of the pass
   on — to the next worker, or back to the head from the last one. */
static int hc_pp_forward(hc_session *s, const hn_msg *m) {
    const hn_forward *f = &m->u.forward;
    const hm_hparams *hp = &s->m->hp;
    int rc = hc_check_forward(s, m);
    if (rc || (rc = hc_mem_positions(s, m))) return rc;
    int w = -1, nw = hm_ctx_n_windows(s->ctx);
    for (int i = 0; i < nw; i++)
        if (s->win[i].begin == (int32_t)f->layer_begin) w = i;
    if (w < 0) return hc_bad(s, m->seq, HR_EPROTO, "FORWARD at layer %u, where no window of this worker begins", f->layer_begin);
    hr_err e = {0};
    int64_t t0 = hr_time_ns();
    if (s->lead) { /* a group's leader: its members run the window with it */
        hn_msg g = *m;
        g.u.forward.layer_begin = (uint32_t)s->win[w].begin;
        g.u.forward.layer_end = (uint32_t)s->win[w].end;
        for (int i = 1; i < s->tp_group; i++) {
            g.seq = m->seq;
            if (hn_msg_send(s->ar_conn[i], &g, hn_deadline_ms(s->timeout_ms + 20 * (int64_t)f->n_tokens), &e))
                return hc_bad(s, m->seq, e.code, "group member %s: %s", s->names[i], e.msg);
        }
        memset(&s->ar.err, 0, sizeof s->ar.err);
        s->ar.send_ns += hr_time_ns() - t0;
        t0 = hr_time_ns();
    }
    s->ar.mark = t0;
    const hm_batch b = {.embd = f->data, .n = (int32_t)f->n_tokens, .pos_of = f->pos, .seq = f->seq,
                        .embd_out = s->pp_out};
    rc = hm_eval_window(s->ctx, w, &b, &e);
    int64_t t1 = hr_time_ns();
    s->ar.compute_ns += t1 - s->ar.mark;
    if (rc) return hc_bad(s, m->seq, rc, "forward pass failed: %s", s->ar.err.msg[0] ? s->ar.err.msg : e.msg);
    hn_msg o = {.type = HN_MSG_FORWARD, .seq = m->seq};
    o.u.forward = (hn_forward){.layer_begin = (uint32_t)s->win[w].end, .layer_end = (uint32_t)hp->n_layer,
                               .stage = HN_STAGE_BLOCK, .n_tokens = f->n_tokens, .n_embd = f->n_embd, .pos = f->pos,
                               .seq = f->seq,
                               .data = s->pp_out};
    /* the last layer done: straight back to the head, which runs the output head */
    bool to_head = !s->ring_next_conn || s->win[w].end == hp->n_layer;
    hn_conn *next = to_head ? s->head : s->ring_next_conn;
    if (hn_msg_send(next, &o, hn_deadline_ms(s->timeout_ms + 20 * (int64_t)f->n_tokens), &e))
        return hc_bad(s, m->seq, e.code, "passing the hidden state on to %s: %s", to_head ? "the head" : s->ring_next,
                      e.msg);
    s->ar.send_ns += hr_time_ns() - t1;
    if (w == 0) { /* once per pass (the residency figures are sampled when the head asks: STATS) */
        s->evals++;
        s->tokens += f->n_tokens;
    }
    return 0;
}

/* One head, from HELLO to BYE (or failure): its first message is m (borrowing f, which the session
   takes). Takes ownership of c. */
static void hc_session_run(hc_worker *w, hn_conn *c, hn_frame *f, hn_msg m) {
    hc_session *s = calloc(1, sizeof *s);
    if (!s) { hn_conn_close(c); return; }
    s->w = w;
    s->head = c;
    s->hold_fd = -1;
    s->rx = *f;
    *f = (hn_frame){0};
    snprintf(s->head_name, sizeof s->head_name, "%s", hn_conn_peer(c));
    hr_err e = {0};
    if (m.type != HN_MSG_HELLO) { hc_bad(s, m.seq, HR_EPROTO, "expected HELLO, got %s", hn_msg_name(m.type)); goto end; }
    if (hc_ring_hello(&m, &(uint64_t){0})) { hc_bad(s, m.seq, HR_EPROTO, "ring connection outside a session"); goto end; }
    if (m.u.hello.version_min > HN_PROTO_VERSION || m.u.hello.version_max < HN_PROTO_VERSION) {
        hc_bad(s, m.seq, HR_EUNSUPPORTED, "protocol versions %u..%u are not supported (this worker speaks %d)",
               m.u.hello.version_min, m.u.hello.version_max, HN_PROTO_VERSION);
        goto end;
    }
    char peer_dev[4 * HN_MAX_NAME + 1];
    hr_escape(peer_dev, sizeof peer_dev, m.u.hello.device.s, m.u.hello.device.n);
    hn_msg ack = {.type = HN_MSG_HELLO_ACK, .seq = m.seq};
    ack.u.hello_ack = (hn_hello_ack){.version = HN_PROTO_VERSION,
                                     .caps = HN_CAP_F32_ACT | HN_CAP_SLICE_CACHE | HN_CAP_LOSSY_UDP |
                                             HN_CAP_LOSSY_PROTECT | (w->has_key ? HN_CAP_ENCRYPT : 0),
                                     .device = hn_cstr(w->name)};
    if (hn_msg_send(c, &ack, hn_deadline_ms(HC_HELLO_WAIT_MS), &e)) {
        HR_LOGW("worker: head %s: %s", s->head_name, e.msg);
        goto end;
    }
    HR_LOGI("worker: head %s (%s) connected", s->head_name, peer_dev);
    for (;;) {
        e = (hr_err){0};
        bool from_prev;
        if (hc_recv_idle(s, &m, &from_prev, &e)) {
            if (atomic_load(&w->stop)) break;
            if (from_prev) {
                /* the previous pipeline stage failed: tell the head, so that it blames that one */
                char msg[HN_MAX_MESSAGE];
                snprintf(msg, sizeof msg, "the previous pipeline stage: %s", e.msg);
                HR_LOGW("worker: %s; session ended", msg);
                hc_send_error(c, 0, e.code, msg);
                break;
            }
            HR_LOGW("worker: head %s: %s; session ended", s->head_name, e.msg);
            if (e.code == HR_EPROTO || e.code == HR_EFORMAT) hc_send_error(c, 0, e.code, e.msg);
            break;
        }
        int rc = 0;
        char why[HN_MAX_MESSAGE + 1]; /* a peer's text, escaped */
        hc_test_fault(m.type);
        switch (m.type) {
        case HN_MSG_PROFILE_REQ: rc = hc_handle_profile(s, &m); break;
        case HN_MSG_PROBE:
            rc = s->planned ? hc_bad(s, m.seq, HR_EPROTO, "PROBE after LOAD_PLAN") : hc_handle_probe(s, &m);
            break;
        case HN_MSG_LINK_PROBE:
            rc = s->planned ? hc_bad(s, m.seq, HR_EPROTO, "LINK_PROBE after LOAD_PLAN") : hc_handle_link_probe(s, &m);
            break;
        case HN_MSG_LOSS_PROBE:
            rc = s->planned ? hc_bad(s, m.seq, HR_EPROTO, "LOSS_PROBE after LOAD_PLAN") : hc_handle_loss_probe(s, &m);
            break;
        case HN_MSG_LOAD_PLAN:
            rc = s->planned ? hc_bad(s, m.seq, HR_EUNSUPPORTED, "a second LOAD_PLAN in one session") : hc_handle_load(s, &m);
            break;
        case HN_MSG_FORWARD:
            if (!s->planned) rc = hc_bad(s, m.seq, HR_EPROTO, "FORWARD before LOAD_PLAN");
            else if (s->pp && (from_prev || !s->ring_prev_worker)) rc = hc_pp_forward(s, &m);
            else if (s->stage_tp && from_prev != (s->ring_prev_conn != NULL))
                rc = hc_bad(s, m.seq, HR_EPROTO, "FORWARD from another device than this group's leader");
            else if (s->pp) rc = hc_bad(s, m.seq, HR_EPROTO, "FORWARD from the head to a pipeline stage after the first");
            else rc = hc_handle_forward(s, &m);
            break;
        case HN_MSG_RESET:
            /* nothing to forget: the next FORWARD overwrites the positions from pos_begin on */
            break;
        case HN_MSG_KV_COPY: {
            hr_err e = {0};
            const hn_kv_copy *k = &m.u.kv_copy;
            if (!s->planned) rc = hc_bad(s, m.seq, HR_EPROTO, "KV_COPY before LOAD_PLAN");
            else if (k->src > INT32_MAX || k->dst > INT32_MAX || k->n > INT32_MAX ||
                     hm_kv_seq_copy(s->ctx, (int32_t)k->src, (int32_t)k->dst, (int32_t)k->n, &e))
                rc = hc_bad(s, m.seq, HR_EPROTO, "KV_COPY: %s", e.msg[0] ? e.msg : "out of range");
            break;
        }
        case HN_MSG_BYE:
            HR_LOGI("worker: head %s said goodbye (%s)", s->head_name,
                    hr_escape(why, sizeof why, m.u.bye.reason.s, m.u.bye.reason.n));
            goto end;
        case HN_MSG_ERROR:
            HR_LOGW("worker: head %s reported: %s; session ended", s->head_name,
                    hr_escape(why, sizeof why, m.u.error.message.s, m.u.error.message.n));
            goto end;
        default: rc = hc_bad(s, m.seq, HR_EPROTO, "unexpected %s", hn_msg_name(m.type)); break;
        }
        if (rc) break;
    }
end:
    hc_session_free(s);
}

int hc_worker_serve(hc_worker *w, int max_sessions, hr_err *err) {
    (void)err; /* a connection's failure ends that connection only (hc_door_next) */
    int served = 0;
    while (!atomic_load(&w->stop) && (max_sessions <= 0 || served < max_sessions)) {
        hn_frame f = {0};
        hn_msg m;
        hr_err e = {0};
        hn_conn *c = hc_door_next(w, HC_IDLE_POLL_MS, &f, &m, &e);
        if (c && e.code) {
            HR_LOGW("worker: connection from %s: %s; closed", hn_conn_peer(c), e.msg);
            if (e.code == HR_EPROTO || e.code == HR_EFORMAT) hc_send_error(c, 0, e.code, e.msg);
            hn_conn_close(c);
            c = NULL;
        }
        if (!c) {
            hn_frame_free(&f);
            continue;
        }
        hc_session_run(w, c, &f, m);
        served++;
        HR_LOGI("worker: waiting for the next head");
    }
    return 0;
}
