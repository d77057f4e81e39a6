/* cluster/head: the head's side — connects to the workers, plans the shares (tensor parallel) or the
   layer windows (pipeline), sends the slices they lack, and runs forward passes with them (see
   cluster.h) */
#define _GNU_SOURCE
#include "cluster-impl.h"

#include "quant/quant.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <unistd.h>

struct hc_core {
    const hm_model *m;
    hc_head_params p;
    hc_plan    plan;
    hc_order   order;                      /* importance-aware placement (order[0] NULL: none) */
    hc_pp_plan pp;                         /* --pp: the windows, per stage (the head's first) */
    int        k;                          /* devices, the head included */
    int        group;                      /* --pp: devices of the head's stage, the head and workers 1..group-1
                                              (a hybrid plan's tensor-parallel group; 1: the head alone) */
    int        n_stages;                   /* --pp: stages (a plain pipeline: one per device) */
    uint8_t    stage[HC_MAX_DEVICES];      /* --pp: device -> its stage */
    uint8_t    first[HC_MAX_DEVICES];      /* --pp: stage -> its first device (a group's leader) */
    char       names[HC_MAX_DEVICES][80];  /* "head", then the worker addresses as given */
    const char *name_ptr[HC_MAX_DEVICES];
    hn_conn   *conn[HC_MAX_DEVICES];       /* [1..k): the workers */
    hn_frame   rx[HC_MAX_DEVICES];
    hc_hook    hook;
    /* tensor parallel: the head's share as a slice file of its own, run like a worker's */
    char       slice_path[PATH_MAX];
    gguf_ctx  *sg;
    hm_model  *sm;
    hm_model  *pm;                         /* pipeline: the head's model over the file, its weights loaded (or NULL) */
    uint64_t   slice_written;              /* bytes written into it by this head (0: reused) */
    int        slice_hold;                 /* a shared flock on it while the head runs (hc_cache_hold; -1: none) */
    const hm_model *run;                   /* what the head computes with: sm, or m (pipeline, views) */
    hm_ctx    *ctx;
    hmem      *mem;                        /* the head's residency manager, or NULL */
    hc_ar      ar;
    hc_lossy_link ll[HC_MAX_DEVICES];      /* --lossy: the UDP link from each worker */
    int32_t    n_ctx, n_batch;
    float     *x;                          /* [n_batch][n_embd]: embeddings of the current batch */
    float     *y;                          /* pipeline: the head's window output */
    int32_t   *pos;                        /* [n_batch]: the batch's positions */
    int32_t   *sq;                         /* [n_batch]: the batch's sequences (hc_core_eval_batch) */
    int32_t    n_seq;                      /* sequences every device's KV cache holds */
    uint32_t   seq;
    uint64_t   bytes_sent, bytes_total;
    int64_t    evals, tokens;
    hn_conn_stats base[HC_MAX_DEVICES];
    int64_t    base_disk[HC_MAX_DEVICES], base_wwait[HC_MAX_DEVICES]; /* cumulative weights figures at the last stats */
    bool       failed;                     /* a pass failed: the workers' state is unknown */
    int        fail_dev;                   /* the worker blamed for it (0: none) */
    bool       timeout_auto;               /* the pass deadline follows step_ms (timeout_ms 0) */
    double     step_ms;                    /* a decode pass's time: a slowly decaying maximum */
    hm_protect *prot[HC_MAX_DEVICES];      /* --lossy-protect: each protected worker's share (or NULL) */
    int32_t   *prot_sel;                   /* [most protected groups] */
};

/* a session id of the lossy all-reduce: datagrams of another session (a previous head's, late) are
   foreign. Not a secret: authenticity is the AEAD's job (issue 29). */
static uint64_t hc_random64(const hm_model *m) {
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
        v = (uint64_t)hr_time_ns() * 0x9e3779b97f4a7c15ULL ^ (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)m;
    return v;
}

hc_head_params hc_head_default_params(void) {
    hc_head_params p = {.allreduce = HC_ALLREDUCE_STAR, .timeout_ms = 0, .bench_ms = 300, .mem.window = 2,
                        .lossy_deadline_ms = 10};
    return p;
}

/* a pipeline's stage of device d, and its size */
static int hc_stage_of(const hc_core *h, int d) { return h->stage[d]; }
static int hc_stage_size(const hc_core *h, int st) {
    return (st + 1 < h->n_stages ? h->first[st + 1] : h->k) - h->first[st];
}


/* the lossy test hook: whether device d drops (and duplicates) its datagrams */
static bool hc_drops(const hc_head_params *p, int d) {
    return !p->lossy_drop_devices || (d < 64 && (p->lossy_drop_devices >> d & 1));
}

/* the placement the shares' ranges index into, or NULL (contiguous) */
static const hc_order *hc_core_order(const hc_core *h) { return h->order.order[0] ? &h->order : NULL; }

#define HC_PROTECT_RANK 64 /* --lossy-protect's default predictor rank, at most (stories260K: 32 = n_embd / 2) */

/* --lossy-protect: whether worker d's share is protected, and the groups per token (0: not) and the
   predictor's rank it is told */
static bool hc_protected(const hc_head_params *p, int d) {
    return p->lossy && p->lossy_protect > 0 && d > 0 &&
           (!p->lossy_protect_devices || (d < 64 && (p->lossy_protect_devices >> d & 1)));
}
static int32_t hc_protect_group(const hc_core *h) {
    const hc_order *o = hc_core_order(h);
    return o ? h->m->hp.n_ff / o->n_groups[1] : h->plan.ff_group;
}
static int32_t hc_protect_n(const hc_core *h, int d) {
    const int32_t F = h->plan.dev[d].ff_end - h->plan.dev[d].ff_begin, G = hc_protect_group(h);
    return hc_protected(&h->p, d) && F > 0 ? HR_MIN(h->p.lossy_protect, (F + G - 1) / G) : 0;
}
static int32_t hc_protect_rank(const hc_core *h) {
    const int32_t E = h->m->hp.n_embd;
    return h->p.lossy_protect_rank > 0 ? HR_MIN(h->p.lossy_protect_rank, E) : HR_MIN(HC_PROTECT_RANK, HR_MAX(1, E / 2));
}

/* the head's copy of each protected worker's FFN share (its rows in the share's order) and predictor */
static int hc_protect_setup(hc_core *h, hr_err *err) {
    const hm_hparams *hp = &h->m->hp;
    const hc_order *o = hc_core_order(h);
    const int32_t G = hc_protect_group(h);
    int32_t most = 0;
    for (int d = 1; d < h->k; d++) {
        const int32_t N = hc_protect_n(h, d), F = h->plan.dev[d].ff_end - h->plan.dev[d].ff_begin;
        if (!N) continue;
        int32_t *nr = malloc(sizeof *nr * (size_t)hp->n_layer * (size_t)F);
        if (!nr) return hr_fail(err, HR_ENOMEM, "out of memory");
        for (int il = 0; il < hp->n_layer; il++)
            for (int32_t j = 0; j < F; j++) {
                const int32_t at = h->plan.dev[d].ff_begin + j;
                nr[(size_t)il * F + j] = o ? o->order[1][(size_t)il * o->n_groups[1] + at / G] * G + at % G : at;
            }
        const hm_protect_params pp = {.n_ff = F, .group = G, .rank = hc_protect_rank(h), .n_protect = N, .neuron = nr,
                                      .head = true};
        const int64_t t0 = hr_time_ns();
        h->prot[d] = hm_protect_create(h->m, &pp, err);
        free(nr);
        if (!h->prot[d]) return err->code;
        most = HR_MAX(most, N);
        HR_LOGI("head: protects %d of the %d FFN groups of %s's share per token (predictor rank %d; %.1f MiB, made in "
                "%.2f s)", N, (F + G - 1) / G, h->names[d], pp.rank, (double)hm_protect_bytes(h->prot[d]) / (1 << 20),
                (double)(hr_time_ns() - t0) / 1e9);
    }
    if (most && !(h->prot_sel = malloc(sizeof *h->prot_sel * (size_t)most))) return hr_fail(err, HR_ENOMEM, "out of memory");
    return 0;
}

/* the head's FFN hook: adds the protected groups' contribution to its partial, in a lossy pass */
static void hc_head_ffn(void *user, int layer, bool after, const float *xn, float *act, int64_t n_ff, float *o, int n) {
    (void)act, (void)n_ff;
    hc_core *h = user;
    if (!after || !hc_ar_lossy_on(&h->ar, layer, n)) return;
    const int64_t E = h->m->hp.n_embd;
    for (int d = 1; d < h->k; d++)
        for (int t = 0; h->prot[d] && t < n; t++) {
            hm_protect_select(h->prot[d], layer, xn + t * E, h->prot_sel);
            hm_protect_add(h->prot[d], layer, xn + t * E, h->prot_sel, o + t * E);
        }
}

static int hc_dev_fail(hc_core *h, int d, int rc, const char *msg, hr_err *err) {
    h->failed = true;
    h->fail_dev = d;
    return hr_fail(err, rc, "worker %d at %s: %s", d, h->names[d], hc_skip_peer(msg, h->names[d]));
}

/* fails device d with the reason its ERROR message gives */
static int hc_worker_error(hc_core *h, int d, const hn_msg *m, hr_err *err) {
    char why[HN_MAX_MESSAGE + 32];
    hr_escape(why, sizeof why, m->u.error.message.s, m->u.error.message.n);
    return hc_dev_fail(h, d, m->u.error.code < 0 ? m->u.error.code : HR_EPROTO, why, err);
}

/* receives the reply to a set-up request from worker d; ERROR from it becomes the error */
static int hc_expect(hc_core *h, int d, int want, hn_msg *m, int64_t timeout_ms, hr_err *err) {
    hr_err e = {0};
    int64_t deadline = hn_deadline_ms(timeout_ms);
    hc_ar_lossy_wait(&h->ar, h->conn[d], deadline);   /* lossy: a worker may still miss a sum of the last pass */
    if (hn_msg_recv(h->conn[d], &h->rx[d], m, deadline, &e)) return hc_dev_fail(h, d, e.code, e.msg, err);
    if (m->type == HN_MSG_ERROR) return hc_worker_error(h, d, m, err);
    if (m->type != want) {
        char why[128];
        snprintf(why, sizeof why, "answered %s where %s was expected", hn_msg_name(m->type), hn_msg_name(want));
        return hc_dev_fail(h, d, HR_EPROTO, why, err);
    }
    return 0;
}

/* how long a failed send waits for the worker's ERROR that may explain it */
#define HC_REFUSAL_MS 500

static int hc_hsend(hc_core *h, int d, hn_msg *m, int64_t timeout_ms, hr_err *err) {
    hr_err e = {0};
    m->seq = ++h->seq;
    if (hc_send(&h->hook, d, h->conn[d], m, hn_deadline_ms(timeout_ms), &e)) {
        /* a worker that refuses a message says why and closes, so the head's next send finds a
           closed connection: the reason is in the receive queue, and more use than "peer closed" */
        hn_msg r;
        hr_err e2 = {0};
        if (!hn_msg_recv(h->conn[d], &h->rx[d], &r, hn_deadline_ms(HC_REFUSAL_MS), &e2) && r.type == HN_MSG_ERROR)
            return hc_worker_error(h, d, &r, err);
        return hc_dev_fail(h, d, e.code, e.msg, err);
    }
    return 0;
}

static int hc_connect_all(hc_core *h, hr_err *err) {
    if (h->p.n_workers < 1) return hr_fail(err, HR_EINVAL, "no workers given");
    if (h->p.n_workers > HC_MAX_DEVICES - 1) return hr_fail(err, HR_ERANGE, "more than %d workers", HC_MAX_DEVICES - 1);
    h->k = 1 + h->p.n_workers;
    snprintf(h->names[0], sizeof h->names[0], "head");
    for (int d = 1; d < h->k; d++) {
        const char *a = h->p.workers[d - 1];
        if (!a || !a[0] || strlen(a) >= sizeof h->names[d])
            return hr_fail(err, HR_EINVAL, "worker %d: bad address '%s'", d, a ? a : "");
        snprintf(h->names[d], sizeof h->names[d], "%s", a);
    }
    for (int d = 0; d < h->k; d++) h->name_ptr[d] = h->names[d];
    char host[64] = "head";
    gethostname(host, sizeof host - 1);
    char me[HN_MAX_NAME];
    snprintf(me, sizeof me, "head %s", host);
    for (int d = 1; d < h->k; d++) {
        hr_err e = {0};
        int64_t hello_ms = HR_MIN(h->p.timeout_ms, HC_HELLO_DEADLINE_MS);
        if (!(h->conn[d] = hn_connect_secure(h->names[d], h->p.key, hn_deadline_ms(hello_ms), &e)))
            return hc_dev_fail(h, d, e.code, e.msg, err);
        hn_msg m = {.type = HN_MSG_HELLO};
        m.u.hello = (hn_hello){.version_min = HN_PROTO_VERSION, .version_max = HN_PROTO_VERSION,
                               .caps = HN_CAP_F32_ACT | (h->p.key ? HN_CAP_ENCRYPT : 0) |
                                       (h->p.lossy ? HN_CAP_LOSSY_UDP : 0),
                               .device = hn_cstr(me)};
        int rc = hc_hsend(h, d, &m, hello_ms, err);
        if (!rc) rc = hc_expect(h, d, HN_MSG_HELLO_ACK, &m, hello_ms, err);
        if (rc) return rc;
        if (m.u.hello_ack.version != HN_PROTO_VERSION)
            return hc_dev_fail(h, d, HR_EUNSUPPORTED, "chose another protocol version", err);
        if (h->p.lossy && !(m.u.hello_ack.caps & HN_CAP_LOSSY_UDP))
            return hc_dev_fail(h, d, HR_EUNSUPPORTED, "cannot take the lossy all-reduce (--lossy)", err);
        /* a worker that ignored lossy_protect would compute the groups the head adds: each counted twice */
        if (hc_protected(&h->p, d) && !(m.u.hello_ack.caps & HN_CAP_LOSSY_PROTECT))
            return hc_dev_fail(h, d, HR_EUNSUPPORTED, "cannot leave out protected groups (--lossy-protect: an older hearth)",
                               err);
        if (h->p.lossy) {
            /* its partials come to this socket, beside the connection, and only from its address */
            hr_err e = {0};
            if (!(h->ll[d].udp = hn_udp_open(h->conn[d], &e))) return hc_dev_fail(h, d, e.code, e.msg, err);
            hn_udp_expect_peer(h->ll[d].udp, h->conn[d]);
            /* sealed with this connection's datagram keys when it is encrypted (a cluster key) */
            if (hn_dgram_crypt_init(&h->ll[d].crypt, h->conn[d], &e)) return hc_dev_fail(h, d, e.code, e.msg, err);
        }
    }
    return 0;
}

/* auto shares: every device's matvec throughput, measured at the same time */
static int hc_profile_all(hc_core *h, double *w, int n_threads, hr_err *err) {
    for (int d = 1; d < h->k; d++) {
        hn_msg m = {.type = HN_MSG_PROFILE_REQ};
        m.u.profile_req = (hn_profile_req){.flags = HN_PROFILE_BENCH, .bench_ms = (uint32_t)h->p.bench_ms};
        if (hc_hsend(h, d, &m, h->p.timeout_ms, err)) return err->code;
    }
    hr_err e = {0};
    w[0] = hc_bench_matvec(n_threads, h->p.bench_ms, &e);
    if (w[0] < 0) return hr_fail(err, e.code, "head benchmark: %s", e.msg);
    for (int d = 1; d < h->k; d++) {
        hn_msg m;
        if (hc_expect(h, d, HN_MSG_PROFILE, &m, h->p.timeout_ms + 10 * (int64_t)h->p.bench_ms, err)) return err->code;
        w[d] = hn_profile_num(&m.u.profile, "matvec_gbps", -1);
        if (!(w[d] > 0)) return hc_dev_fail(h, d, HR_EPROTO, "PROFILE without a matvec_gbps figure", err);
    }
    for (int d = 0; d < h->k; d++) HR_LOGI("tp: device %d (%s): matvec %.2f GB/s", d, h->names[d], w[d]);
    return 0;
}

typedef struct hc_kvbuf { hn_kv kv[HN_MAX_KV]; char val[HN_MAX_KV][HN_MAX_VALUE]; uint32_t n; } hc_kvbuf;
static void hc_kv(hc_kvbuf *b, const char *k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void hc_kv(hc_kvbuf *b, const char *k, const char *fmt, ...) {
    HR_ASSERT(b->n < HN_MAX_KV);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->val[b->n], sizeof b->val[b->n], fmt, ap);
    va_end(ap);
    b->kv[b->n] = (hn_kv){hn_cstr(k), hn_cstr(b->val[b->n])};
    b->n++;
}

/* LOAD_PLAN's hyper-parameters as text (hm_hparams_to_kv's store; its keys are static there) */
static int hc_kv_set(void *user, const char *key, hm_kv_type type, hm_kv_val v) {
    char t[64];
    hm_kv_format(t, sizeof t, type, v);
    hc_kv(user, key, "%s", t);
    return 0;
}

/* LOAD_PLAN, the slice directory, SLICE_HAVE, the missing slices, READY — for worker d */
static int hc_load_worker(hc_core *h, int d, uint64_t model_hash, uint64_t token, const hm_ctx_params *cp,
                          uint64_t *done, uint64_t total, uint8_t *tmp, hr_err *err) {
    const hm_model *m = h->m;
    const hm_hparams *hp = &m->hp;
    const hc_share *sh = &h->plan.dev[d];
    hc_slice *sl = NULL;
    int ns = 0, rc, nu = 0;
    hn_unit *units = NULL;
    uint64_t *hv = NULL;
    bool *missing = NULL;
    uint8_t layers[HC_PP_MAX_LAYERS];
    /* a hybrid plan's group: its leader (the head, or a worker that is a stage of the ring) and its
       members, which run their shares of the stage's layers when the leader tells them to */
    const int st = h->p.pp ? hc_stage_of(h, d) : 0, gs = h->p.pp ? hc_stage_size(h, st) : 1;
    const bool member = h->p.pp && d != h->first[st], leader = h->p.pp && !member && gs > 1;
    if (h->p.pp) hc_pp_layers(&h->pp, st, layers);
    if ((rc = hc_slices_make(m, sh, hc_core_order(h), h->p.pp ? layers : NULL, false, &sl, &ns, err))) return rc;
    hc_slices_hash(sl, ns);
    units = malloc((size_t)hp->n_layer * 2 * sizeof *units);
    hv = malloc((size_t)ns * sizeof *hv);
    missing = calloc((size_t)ns, sizeof *missing);
    if (!units || !hv || !missing) { rc = hr_fail(err, HR_ENOMEM, "out of memory"); goto done; }
    int gqa = hp->n_head / hp->n_head_kv;
    for (int il = 0; il < hp->n_layer; il++) {
        if (gs > 1 && !layers[il]) continue;
        if (h->p.pp && gs == 1) {
            /* a pipeline stage: whole layers */
            if (layers[il]) units[nu++] = (hn_unit){(uint32_t)il, HN_UNIT_LAYER, 0, 1};
            continue;
        }
        units[nu++] = (hn_unit){(uint32_t)il, HN_UNIT_ATTN_HEADS, (uint32_t)(sh->kv_begin * gqa), (uint32_t)(sh->kv_end * gqa)};
        units[nu++] = (hn_unit){(uint32_t)il, HN_UNIT_FFN_ROWS, (uint32_t)sh->ff_begin, (uint32_t)sh->ff_end};
    }
    hc_kvbuf kb = {0};
    hm_kv_io io = {.form = HM_KV_PLAN, .user = &kb, .set = hc_kv_set};
    if ((rc = hm_hparams_to_kv(hp, &io, err))) goto done;
    hc_kv(&kb, "n_ctx", "%d", h->n_ctx);
    hc_kv(&kb, "n_batch", "%d", h->n_batch);
    hc_kv(&kb, "n_seq", "%d", h->n_seq);
    hc_kv(&kb, "kv_type", "%d", cp->kv_type);
    hc_kv(&kb, "allreduce", "%d", h->p.allreduce);
    hc_kv(&kb, "timeout_ms", "%d", h->p.timeout_ms);
    hc_kv(&kb, "n_slices", "%d", ns);
    /* the ring (a ring all-reduce, or the pipeline's stages after the head's) starts after the head's
       group and links the stages' leaders; a member all-reduces with its leader only, over the
       head's session connection or one its worker leader opens (that group's own token) */
    const int nx = h->p.pp ? (st + 1 < h->n_stages ? h->first[st + 1] : 0) : (d + 1) % h->k;
    hc_kv(&kb, "ring_prev_worker", "%d", member ? st > 0 : h->p.pp ? st > 1 : d > 1);
    hc_kv(&kb, "ring_next", "%s", !member && nx ? h->names[nx] : "");
    hc_kv(&kb, "ring_token", "%016llx", (unsigned long long)(member ? token ^ (uint64_t)st << 48 : token));
    hc_kv(&kb, "pp", "%d", h->p.pp && !member);
    if (member || leader) {
        hc_kv(&kb, "tp_group", "%d", gs);
        hc_kv(&kb, "group_index", "%d", d - h->first[st]);
    }
    if (leader) { /* the members it connects to, with the group's token */
        char list[HN_MAX_VALUE] = "";
        for (int i = d + 1; i < d + gs; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i > d + 1 ? "," : "", h->names[i]);
        if (strlen(list) + 1 >= sizeof list) {
            rc = hr_fail(err, HR_ERANGE, "stage %d: its members' addresses are too long", st);
            goto done;
        }
        hc_kv(&kb, "group_members", "%s", list);
        hc_kv(&kb, "group_token", "%016llx", (unsigned long long)(token ^ (uint64_t)st << 48));
    }
    if (sh->placement) hc_kv(&kb, "placement", "%016llx", (unsigned long long)sh->placement);
    if (h->p.lossy) {
        hc_kv(&kb, "lossy_port", "%u", (unsigned)hn_udp_port(h->ll[d].udp));
        hc_kv(&kb, "lossy_session", "%016llx", (unsigned long long)h->ar.session);
        hc_kv(&kb, "lossy_max_tokens", "%d", h->ar.lossy_max_tokens);
        hc_kv(&kb, "lossy_deadline_ms", "%d", h->p.lossy_deadline_ms);
        if (hc_protect_n(h, d))
            hc_kv(&kb, "lossy_protect", "%d:%d:%d", hc_protect_n(h, d), hc_protect_rank(h), hc_protect_group(h));
        if ((h->p.lossy_drop_ppm || h->p.lossy_dup) && hc_drops(&h->p, d))
            hc_kv(&kb, "lossy_drop", "%016llx:%u:%d", (unsigned long long)h->p.lossy_drop_seed, h->p.lossy_drop_ppm,
                  h->p.lossy_dup);
    }
    hn_msg msg = {.type = HN_MSG_LOAD_PLAN};
    hn_load_plan *lp = &msg.u.load_plan;
    lp->model_hash = model_hash;
    lp->device_index = (uint32_t)d;
    lp->n_devices = (uint32_t)h->k;
    lp->arch = hn_cstr(hp->arch_name);
    lp->n_params = kb.n;
    memcpy(lp->params, kb.kv, kb.n * sizeof kb.kv[0]);
    lp->n_units = (uint32_t)nu;
    lp->units = units;
    if ((rc = hc_hsend(h, d, &msg, h->p.timeout_ms, err))) goto done;
    for (int i = 0; i < ns; i++) {
        hn_msg b = {.type = HN_MSG_SLICE_BEGIN};
        b.u.slice_begin = (hn_slice_begin){.hash = sl[i].hash, .size = sl[i].size, .dtype = (uint32_t)sl[i].type,
                                           .n_dims = (uint32_t)sl[i].n_dims, .name = hn_cstr(sl[i].name)};
        for (int k = 0; k < 4; k++) b.u.slice_begin.ne[k] = (uint64_t)sl[i].ne[k];
        if ((rc = hc_hsend(h, d, &b, h->p.timeout_ms, err))) goto done;
        hv[i] = sl[i].hash;
    }
    hn_msg q = {.type = HN_MSG_SLICE_HAVE};
    q.u.slice_have = (hn_slice_have){.model_hash = model_hash, .n_hashes = (uint32_t)ns, .hashes = hv};
    if ((rc = hc_hsend(h, d, &q, h->p.timeout_ms, err))) goto done;
    if ((rc = hc_expect(h, d, HN_MSG_SLICE_HAVE, &q, HC_SETUP_TIMEOUT_MS, err))) goto done;
    for (int i = 0; i < ns; i++) missing[i] = true;
    for (uint32_t j = 0; j < q.u.slice_have.n_hashes; j++) {
        uint64_t hj;
        memcpy(&hj, &q.u.slice_have.hashes[j], 8);
        bool known = false;
        for (int i = 0; i < ns; i++)
            if (sl[i].hash == hj) { missing[i] = false; known = true; }
        if (!known) { rc = hc_dev_fail(h, d, HR_EPROTO, "SLICE_HAVE lists a hash that was not asked about", err); goto done; }
    }
    for (int i = 0; i < ns; i++) {
        h->bytes_total += sl[i].size;
        if (!missing[i]) {
            *done += sl[i].size;
            continue;
        }
        for (uint64_t off = 0; off < sl[i].size; off += HC_CHUNK_BYTES) {
            size_t len = (size_t)HR_MIN((uint64_t)HC_CHUNK_BYTES, sl[i].size - off);
            hn_msg c = {.type = HN_MSG_SLICE_CHUNK};
            c.u.slice_chunk = (hn_slice_chunk){.hash = sl[i].hash, .offset = off, .n = (uint32_t)len,
                                               .data = hc_slice_bytes(&sl[i], off, len, tmp)};
            if ((rc = hc_hsend(h, d, &c, HC_SETUP_TIMEOUT_MS, err))) goto done;
            h->bytes_sent += len;
            *done += len;
            if (h->p.progress && *done < total) h->p.progress(h->p.progress_user, *done, total);
        }
        hn_msg e = {.type = HN_MSG_SLICE_END};
        e.u.slice_end = (hn_slice_end){.hash = sl[i].hash, .size = sl[i].size};
        if ((rc = hc_hsend(h, d, &e, h->p.timeout_ms, err))) goto done;
    }
    /* the worker may copy cached slices into a new file before it answers */
    if ((rc = hc_expect(h, d, HN_MSG_READY, &q, 10 * HC_SETUP_TIMEOUT_MS, err))) goto done;
    if (q.u.ready.model_hash != model_hash || q.u.ready.n_slices != (uint32_t)ns)
        rc = hc_dev_fail(h, d, HR_EPROTO, "READY for another model or slice count", err);
done:
    free(sl);
    free(units);
    free(hv);
    free(missing);
    return rc;
}

/* bytes of slices every worker will hold, for the progress bar */
static uint64_t hc_total_slice_bytes(const hc_core *h) {
    uint64_t t = 0;
    for (int d = 1; d < h->k; d++) {
        hc_slice *sl;
        int ns;
        uint8_t layers[HC_PP_MAX_LAYERS];
        if (h->p.pp) hc_pp_layers(&h->pp, hc_stage_of(h, d), layers);
        if (hc_slices_make(h->m, &h->plan.dev[d], hc_core_order(h), h->p.pp ? layers : NULL, false, &sl, &ns, NULL))
            continue;
        for (int i = 0; i < ns; i++) t += sl[i].size;
        free(sl);
    }
    return t;
}

/* ---- the two plans ---- */

/* importance-aware placement: the caller orders every layer's groups (hc_place_fn); checked to be
   permutations, hashed, and the hash marks every share (the slice files' key) */
static int hc_place(hc_core *h, hr_err *err) {
    const hm_hparams *hp = &h->m->hp;
    hc_order *o = &h->order;
    if (h->p.share_views) return hr_fail(err, HR_EINVAL, "a placement of unit groups needs the head's slice file");
    o->n_layer = hp->n_layer;
    o->n_groups[0] = hp->n_head_kv / h->plan.att_group;
    o->n_groups[1] = hp->n_ff / h->plan.ff_group;
    uint8_t *seen = NULL;
    int rc = 0;
    for (int b = 0; b < 2; b++)
        if (!(o->order[b] = malloc((size_t)o->n_layer * (size_t)o->n_groups[b] * sizeof(int32_t))))
            return hr_fail(err, HR_ENOMEM, "out of memory");
    if ((rc = h->p.place(h->p.place_user, &h->plan, h->name_ptr, o, err))) return rc;
    if (!(seen = malloc((size_t)HR_MAX(o->n_groups[0], o->n_groups[1])))) return hr_fail(err, HR_ENOMEM, "out of memory");
    hr_hasher hs;
    hr_hasher_init(&hs, 0x706c616365ULL);
    for (int b = 0; b < 2 && !rc; b++)
        for (int il = 0; il < o->n_layer && !rc; il++) {
            const int32_t *v = o->order[b] + (size_t)il * o->n_groups[b];
            memset(seen, 0, (size_t)o->n_groups[b]);
            for (int32_t j = 0; j < o->n_groups[b] && !rc; j++) {
                if (v[j] < 0 || v[j] >= o->n_groups[b] || seen[v[j]]++)
                    rc = hr_fail(err, HR_EINVAL, "layer %d's placement of %s groups is not a permutation", il,
                                 b ? "FFN" : "attention");
            }
            hr_hasher_update(&hs, v, (size_t)o->n_groups[b] * sizeof *v);
        }
    free(seen);
    if (rc) return rc;
    o->hash = hr_hasher_final(&hs) | 1;   /* never 0, which means no placement */
    for (int d = 0; d < h->k; d++) h->plan.dev[d].placement = o->hash;
    HR_LOGI("tp: unit groups placed by importance (placement %016llx)", (unsigned long long)o->hash);
    return 0;
}

/* the layout of the plan flags (hc_layout_make, checked before connecting unless the shares come from the
   devices' measured speeds) -> the head's plan, stages and windows */
static void hc_layout_take(hc_core *h, const hc_layout *l) {
    h->plan = l->plan;
    h->pp = l->pp;
    h->group = l->group;
    h->n_stages = l->n_stages;
    memcpy(h->stage, l->stage, sizeof h->stage);
    memcpy(h->first, l->first, sizeof h->first);
}

/* tensor parallel: shares (given, equal or measured) -> unit ranges */
static int hc_tp_setup(hc_core *h, hc_layout *l, int n_threads, hr_err *err) {
    const hc_head_params *p = &h->p;
    if (p->shares_auto) {
        double w[HC_MAX_DEVICES];
        if (hc_profile_all(h, w, n_threads, err)) return err ? err->code : HR_ENET;
        if (hc_layout_make(h->m, p, h->k, w, l, err)) return err ? err->code : HR_EINVAL;
    }
    hc_layout_take(h, l);
    if (!p->n_shares)
        HR_LOGI("tp: the output head is %.0f%% of a token's weight reads and runs on the head only: the head "
                "takes %.3f of the layers", 100 * l->head_frac, h->plan.weight[0]);
    if (p->place && hc_place(h, err)) return err ? err->code : HR_EINVAL;
    for (int d = 0; d < h->k; d++) {
        const hc_share *s = &h->plan.dev[d];
        HR_LOGI("tp: device %d (%s): share %.3f: KV heads [%d, %d), FFN neurons [%d, %d)%s", d, h->names[d],
                h->plan.weight[d], s->kv_begin, s->kv_end, s->ff_begin, s->ff_end,
                s->placement ? " of each layer's placement order" : "");
    }
    return 0;
}

/* pipeline: every stage's windows (a hybrid plan's groups: their shares of every layer), as logged */
static void hc_pp_setup(hc_core *h, const hc_layout *l) {
    const hc_head_params *p = &h->p;
    hc_layout_take(h, l);
    const int ns = h->n_stages;
    for (int st = 0; st < ns; st++) {
        char buf[512];
        size_t len = 0;
        for (int i = 0; i < h->pp.n_win[st] && len < sizeof buf - 32; i++) {
            const hm_window *x = &h->pp.win[st][i];
            len += (size_t)snprintf(buf + len, sizeof buf - len, "%s", i ? ", " : "");
            if (x->begin == x->end) len += (size_t)snprintf(buf + len, sizeof buf - len, x->begin ? "output" : "embedding");
            else len += (size_t)snprintf(buf + len, sizeof buf - len, "%d-%d", x->begin, x->end - 1);
        }
        const int f = h->first[st], n = hc_stage_size(h, st);
        if (!p->n_stages) HR_LOGI("pp: device %d (%s): layers %s", st, h->names[st], buf);
        else if (n == 1) HR_LOGI("pp: stage %d, device %d (%s): layers %s", st, f, h->names[f], buf);
        else {
            HR_LOGI("pp: stage %d (devices %d-%d, tensor parallel): layers %s", st, f, f + n - 1, buf);
            for (int d = f; d < f + n; d++) {
                const hc_share *s = &h->plan.dev[d];
                HR_LOGI("pp: stage %d, device %d (%s): share %.3f: KV heads [%d, %d), FFN neurons [%d, %d)", st, d,
                        h->names[d], h->plan.weight[d], s->kv_begin, s->kv_end, s->ff_begin, s->ff_end);
            }
        }
    }
    HR_LOGI("pp: %d windows per token, %d trip%s round the ring", h->pp.n_steps, h->pp.n_rounds,
            h->pp.n_rounds == 1 ? "" : "s");
}

/* the head's slice file: its bytes from the model's mapping, column slices gathered into buf */
typedef struct hc_own_src { const hc_slice *dir; uint8_t *buf; } hc_own_src;
static int hc_own_bytes(void *user, int i, const void **bytes, hr_err *err) {
    (void)err;
    const hc_own_src *o = user;
    *bytes = hc_slice_bytes(&o->dir[i], 0, (size_t)o->dir[i].size, o->buf);
    return 0;
}

/* Tensor parallel, or a hybrid plan whose head leads a group: the head's share as a slice file in its
   cache, as a worker holds its own — reused when the cache has it (checked against the content hashes),
   else cut from the mapping and
   written — then opened as a slice model. Besides a worker's tensors it holds the embedding and the
   output head, so that the head's computation never reads the model's mapping again. */
static int hc_own_slice(hc_core *h, uint64_t model_hash, hr_err *err) {
    const hc_share *sh = &h->plan.dev[0];
    char cache[PATH_MAX - 64], dir[PATH_MAX];
    hc_slice *sl = NULL;
    uint8_t *buf = NULL;
    int ns = 0, rc;
    if (h->p.cache_dir && h->p.cache_dir[0]) {
        if (strlen(h->p.cache_dir) >= sizeof cache) return hr_fail(err, HR_ERANGE, "cache path too long");
        snprintf(cache, sizeof cache, "%s", h->p.cache_dir);
    } else if ((rc = hc_default_cache_dir(cache, sizeof cache, err))) return rc;
    /* a hybrid plan's head leads a group: its share of its stage's layers only (what a worker of the group
       holds, plus the embedding and the output head) */
    uint8_t layers[HC_PP_MAX_LAYERS];
    const uint8_t *ly = NULL;
    if (h->p.pp) {
        hc_pp_layers(&h->pp, 0, layers);
        ly = layers;
    }
    if ((rc = hc_slices_make(h->m, sh, hc_core_order(h), ly, true, &sl, &ns, err))) return rc;
    hc_slices_hash(sl, ns);
    uint64_t key = hc_slice_key(model_hash, sh, sl, ns, false), bytes = 0, max = 0;  /* the head's lists no layers */
    if ((rc = hc_slice_path(cache, model_hash, key, dir, sizeof dir, h->slice_path, sizeof h->slice_path, err))) goto done;
    for (int i = 0; i < ns; i++) {
        bytes += sl[i].size;
        if (hc_slice_gathers(&sl[i])) max = HR_MAX(max, sl[i].size);
    }
    hr_err e = {0};
    hc_slice_meta mt = {.hp = &h->m->hp, .share = *sh, .model_hash = model_hash, .layers = ly, .head = true};
    char why[256] = "";
    if (access(h->slice_path, R_OK) == 0) {
        /* a reused file is checked in full, not trusted: its data, and its metadata against the share */
        int bad = -1;
        if ((h->sg = gguf_open(h->slice_path, &e)) && (h->sm = hm_model_load(h->sg, &e)) &&
            (bad = hc_slice_file_check(h->sg, sl, ns)) < 0 && hc_slice_file_matches(h->sg, h->sm, &mt, sl, ns, why, sizeof why)) {
            HR_LOGI("tp: head: its share (%.1f MiB) from %s", bytes / 1048576.0, h->slice_path);
            hc_cache_touch(h->slice_path);   /* a use: the least recently used files are evicted first */
            h->slice_hold = hc_cache_hold(h->slice_path);
            goto done;
        }
        if (bad >= 0) snprintf(why, sizeof why, "'%s' differs", sl[bad].name);
        HR_LOGW("tp: head: rewriting %s: %s", h->slice_path, why[0] ? why : e.msg);
        hm_model_free(h->sm);
        h->sm = NULL;
        if (h->sg) gguf_close(h->sg);
        h->sg = NULL;
        unlink(h->slice_path);
    }
    /* the cache's bound, as a worker's (--cache-max; by default twice the model, at most half the disk's room) */
    const uint64_t cap = h->p.cache_max ? h->p.cache_max : hc_cache_default_max(cache, gguf_file_size(h->m->gguf));
    const char *self = h->slice_path;
    uint64_t evicted = 0;
    if ((rc = hc_cache_make_room(cache, hc_slice_file_bytes(sl, ns), cap, &self, 1, &evicted, &e))) {
        rc = hr_fail(err, rc, "the head's slice file (its share; --cache DIR puts it elsewhere): %s%s", e.msg,
                     h->p.cache_max ? "" : " — the head's default bound, twice the model file or half of what its "
                     "disk has free (--cache-max SIZE sets another)");
        goto done;
    }
    if (evicted)
        HR_LOGI("tp: head: evicted %.1f MiB of least recently used slice files to stay under %.1f MiB",
                evicted / 1048576.0, cap / 1048576.0);
    int64_t t0 = hr_time_ns();
    if (max && !(buf = malloc((size_t)max))) { rc = hr_fail(err, HR_ENOMEM, "out of memory"); goto done; }
    if ((rc = hc_slice_file_write(h->slice_path, &mt, sl, ns, hc_own_bytes, &(hc_own_src){sl, buf}, &e))) {
        rc = hr_fail(err, rc, "the head's slice file (its share; --cache DIR puts it elsewhere): %s", e.msg);
        goto done;
    }
    h->slice_written = bytes;
    HR_LOGI("tp: head: wrote its share (%.1f MiB) to %s in %.2f s", bytes / 1048576.0, h->slice_path,
            (hr_time_ns() - t0) * 1e-9);
    h->slice_hold = hc_cache_hold(h->slice_path);
    if (!(h->sg = gguf_open(h->slice_path, &e)) || !(h->sm = hm_model_load(h->sg, &e)))
        rc = hr_fail(err, e.code, "%s: %s", h->slice_path, e.msg);
    else if (!hc_slice_file_matches(h->sg, h->sm, &mt, sl, ns, why, sizeof why))
        rc = hr_fail(err, HR_EFORMAT, "%s does not hold the head's share: %s", h->slice_path, why);
done:
    free(buf);
    free(sl);
    return rc;
}

hc_core *hc_core_create(const hm_model *m, const hc_head_params *p, const hm_ctx_params *cp_in, int *failed_worker,
                        hr_err *err) {
    if (failed_worker) *failed_worker = 0;
    hc_core *h = calloc(1, sizeof *h);
    uint8_t *tmp = NULL;
    hc_layout *lay = NULL;
    if (!h) { hr_fail(err, HR_ENOMEM, "out of memory"); return NULL; }
    h->m = m;
    h->p = *p;
    h->group = 1;
    h->slice_hold = -1;
    h->timeout_auto = h->p.timeout_ms <= 0;
    if (h->timeout_auto) h->p.timeout_ms = HC_SETUP_DEADLINE_MS;
    if (h->p.bench_ms <= 0) h->p.bench_ms = 300;
    if (h->p.lossy_deadline_ms <= 0) h->p.lossy_deadline_ms = 10;
    /* the plan flags' checks before connecting (shares from measured speeds: after, hc_tp_setup) */
    if (!(lay = malloc(sizeof *lay))) { hr_fail(err, HR_ENOMEM, "out of memory"); goto err; }
    if (p->n_workers && !(p->shares_auto && !p->pp) && hc_layout_make(m, p, 1 + p->n_workers, NULL, lay, err)) goto err;
    h->hook = (hc_hook){p->send_hook, p->send_hook_user};
    const hm_hparams *hp = &m->hp;
    if (m->is_slice) { hr_fail(err, HR_EINVAL, "the head needs the whole model, not a slice file"); goto err; }
    hm_ctx_params cp = *cp_in;
    if (cp.n_threads <= 0) cp.n_threads = hr_physical_cores();
    const bool alone = p->n_workers == 0; /* the workers left (recover.c): the whole model here */
    if (alone) {
        h->k = 1;
        h->p.pp = false;
        snprintf(h->names[0], sizeof h->names[0], "head");
        h->name_ptr[0] = h->names[0];
        h->plan = (hc_plan){.n_devices = 1, .att_group = 1, .ff_group = 1, .weight = {1}};
        h->plan.dev[0] = (hc_share){0, hp->n_head_kv, 0, hp->n_ff, 0};
        HR_LOGI("head: alone, the whole model from its mapping");
    } else if (hc_connect_all(h, err)) goto err;

    /* shares and the plan */
    p = &h->p;
    if (alone) {
        /* planned above */
    } else if (p->pp) hc_pp_setup(h, lay);
    else if (hc_tp_setup(h, lay, cp.n_threads, err)) goto err;

    /* the head's own context: every layer (tensor parallel; its units) or its windows (pipeline), and
       the output head; the sync hook is the all-reduce (none in a pipeline) */
    int32_t fwd_max = (int32_t)(HC_FORWARD_MAX_BYTES / ((size_t)hp->n_embd * 4 + 8)); /* + pos, seq */
    if (cp.n_batch <= 0) cp.n_batch = 512;
    cp.n_batch = HR_MIN(cp.n_batch, fwd_max);
    h->ar = (hc_ar){.mode = p->allreduce, .k = p->pp ? h->group : h->k, .me = 0, .conn = h->conn, .rx = h->rx,
                    .names = h->name_ptr,
                    .hook = &h->hook, .timeout_ms = h->p.timeout_ms, .token_ms = h->timeout_auto ? HC_UNTIMED_TOKEN_MS : 0,
                    .lossy = p->lossy,
                    .lossy_deadline_ms = h->p.lossy_deadline_ms, .drop_seed = p->lossy_drop_seed,
                    .drop_ppm = hc_drops(p, 0) ? p->lossy_drop_ppm : 0, .dup = hc_drops(p, 0) && p->lossy_dup,
                    .ll = h->ll, .n_layer = hp->n_layer};
    if (p->lossy) h->ar.session = hc_random64(m);
    if (p->allreduce == HC_ALLREDUCE_RING && !p->pp) {
        h->ar.next = h->conn[1];
        h->ar.prev = h->conn[h->k - 1];
        h->ar.next_dev = 1;
        h->ar.prev_dev = h->k - 1;
        hc_ar_ring_init(&h->ar);
    }
    uint64_t model_hash = hc_model_hash(m->gguf);
    /* tensor parallel, or a hybrid plan whose head leads a group: the head computes a share of its layers,
       from its own slice file as a worker does. From views of the model, the manager would hold whole
       blocks (a share's columns of attn_output and ffn_down are not contiguous): on home4-8b-small the
       head of `0+2,1` (share 0.23 of 31 layers, 0.96 GiB) streamed every block and ran 3.7 s a token
       where its plan was predicted 0.8 (session 25). A pipeline stage's blocks are all its own. */
    bool own = (!p->pp || h->group > 1) && !p->share_views && !alone;
    if (own) {
        if (hc_own_slice(h, model_hash, err)) goto err;
        /* hashing the share and checking the file mapped both in: neither is what the head computes
           with until the weights are loaded (or streamed) below */
        hc_drop_pages(m->gguf);
        hc_drop_pages(h->sg);
    }
    h->run = own ? h->sm : m;
    hm_shard sh = hm_shard_full(h->run);
    if (!own) {
        sh.kv_begin = h->plan.dev[0].kv_begin;
        sh.kv_end = h->plan.dev[0].kv_end;
        sh.ff_begin = h->plan.dev[0].ff_begin;
        sh.ff_end = h->plan.dev[0].ff_end;
    }
    sh.first = false;   /* the head embeds the tokens itself, so that it can send the hidden states */
    if (p->pp) {
        sh.n_windows = h->pp.n_win[0];
        memcpy(sh.windows, h->pp.win[0], sizeof sh.windows);
    }
    if ((p->pp && h->group > 1) || (!p->pp && !alone)) {  /* a hybrid plan's head all-reduces in its group */
        sh.sync = hc_ar_sync;
        sh.sync_user = &h->ar;
    }
    const bool protect = !p->pp && !alone && p->lossy && p->lossy_protect > 0;
    if (protect) { /* its predictors are made once the workers have their weights (below): no pass runs before */
        sh.ffn = hc_head_ffn;
        sh.ffn_user = h;
    }
    /* as on one device: the head's share of the KV cache must fit before any of it is committed */
    if (hmem_check_ctx(hm_ctx_bytes_for_shard(hp, &sh, &cp), err)) goto err;
    /* as on one device, the plan follows the KV cache's use (hc_core_eval says how many positions);
       with several sequences the whole cache counts from the start */
    const uint64_t ctx_all = hm_ctx_bytes_for_shard(hp, &sh, &cp), ctx_one = hm_ctx_base_bytes_for_shard(hp, &sh, &cp);
    const int32_t kv_n_ctx = cp.n_seq <= 1 ? hm_ctx_resolve_n_ctx(hp, cp.n_ctx) : 0;
    if (own) {
        /* as a worker: a manager over the slice file, and the weights loaded and packed when they fit */
        if (hmem_setup_kv(h->sm, &sh, h->slice_path, &p->mem, ctx_all, ctx_one, kv_n_ctx, &h->mem, err) ||
            hmem_load_weights(h->mem, h->sm, &sh, p->use_mmap, p->no_repack, err))
            goto err;
    } else if (p->model_path && p->pp) {
        /* a pipeline stage's blocks are all its own: a model of the head's own over the same file, so that,
           as on one device, its windows and output head are loaded and packed when its manager keeps them
           all (computing from the file's layout, the head of home4's pp 0,16 took 9.6 ms a token for its
           141 MiB output head, at the mapping's rate, where the packed kernels take ~6) */
        if (!(h->pm = hm_model_load(m->gguf, err)) ||
            hmem_setup_kv(h->pm, &sh, p->model_path, &p->mem, ctx_all, ctx_one, kv_n_ctx, &h->mem, err) ||
            hmem_load_weights(h->mem, h->pm, &sh, p->use_mmap, p->no_repack, err))
            goto err;
        h->run = h->pm;
    } else if (p->model_path && (p->mem.given || alone) &&
               hmem_setup_kv(m, &sh, p->model_path, &p->mem, ctx_all, ctx_one, kv_n_ctx, &h->mem, err)) {
        /* views of the model (tests): only when asked for — wo and w_down are column slices the
           manager handles whole (hm_block_ranges) */
        goto err;
    }
    if (!(h->ctx = hm_ctx_create(h->run, &sh, &cp, err))) goto err;
    h->n_ctx = hm_ctx_n_ctx(h->ctx);
    h->n_batch = HR_MIN(cp.n_batch, h->n_ctx);
    h->n_seq = hm_ctx_n_seq(h->ctx);
    h->ar.lossy_max_tokens = HR_MIN(h->n_seq, HC_LOSSY_MAX_TOKENS);
    if (p->lossy && hc_ar_lossy_alloc(&h->ar, hp->n_embd)) { hr_fail(err, HR_ENOMEM, "out of memory"); goto err; }
    h->x = hr_alloc_aligned((size_t)h->n_batch * hp->n_embd * sizeof(float), 64);
    h->y = hr_alloc_aligned((size_t)h->n_batch * hp->n_embd * sizeof(float), 64);
    h->pos = malloc((size_t)h->n_batch * sizeof *h->pos);
    h->sq = malloc((size_t)h->n_batch * sizeof *h->sq);
    tmp = malloc(HC_CHUNK_BYTES);
    if (!h->x || !h->y || !h->pos || !h->sq || !tmp) { hr_fail(err, HR_ENOMEM, "out of memory"); goto err; }

    /* the workers' weights */
    uint64_t token = (uint64_t)hr_time_ns() * 0x9e3779b97f4a7c15ULL ^ (uint64_t)getpid() << 32 ^ model_hash;
    uint64_t done = 0, total = hc_total_slice_bytes(h);
    int64_t t0 = hr_time_ns();
    for (int d = 1; d < h->k; d++)
        if (hc_load_worker(h, d, model_hash, token, &cp, &done, total, tmp, err)) goto err;
    if (h->p.progress && h->bytes_sent) h->p.progress(h->p.progress_user, total, total);
    if (own) hc_drop_pages(m->gguf);   /* the workers' slices were read from the mapping */
    free(tmp);
    tmp = NULL;
    double s = (hr_time_ns() - t0) * 1e-9;
    HR_LOGI("%s: weight bytes sent: %llu (%.1f MiB in %.2f s; the workers hold %.1f MiB, the rest was in their "
            "caches)", p->pp ? "pp" : "tp", (unsigned long long)h->bytes_sent, h->bytes_sent / 1048576.0, s,
            h->bytes_total / 1048576.0);
    for (int d = 1; d < h->k; d++) hn_conn_get_stats(h->conn[d], &h->base[d]);
    if (p->lossy) {
        char ports[HC_MAX_DEVICES * 8] = "";
        for (int d = 1; d < h->k; d++)
            snprintf(ports + strlen(ports), sizeof ports - strlen(ports), "%s%u", d > 1 ? "," : "", hn_udp_port(h->ll[d].udp));
        HR_LOGI("tp: lossy all-reduce: session %016llx, deadline %d ms, the workers' datagrams to UDP ports %s",
                (unsigned long long)h->ar.session, h->p.lossy_deadline_ms, ports);
    }
    /* after the workers' set-up, which would otherwise wait on the head's predictors (seconds for a large share) */
    if (protect && hc_protect_setup(h, err)) goto err;
    free(lay);
    return h;
err:
    if (failed_worker) *failed_worker = h->failed ? h->fail_dev : 0;
    free(lay);
    free(tmp);
    hc_core_free(h);
    return NULL;
}

/* A pipeline failed at worker `from` (err says how). When a stage dies, its neighbours fail too and
   tell the head about the broken link, sometimes before the head sees the dead stage's connection
   close: wait a moment for the others, and blame a worker whose connection closed without an ERROR
   (the one that died) rather than one that reported its neighbour's failure. */
static int hc_pp_blame(hc_core *h, int from, int rc, hr_err *err) {
    int64_t until = hr_time_ns() + 200 * 1000000LL;
    bool reported[HC_MAX_DEVICES] = {0};
    reported[from] = true;
    while (hr_time_ns() < until) {
        struct pollfd pf[HC_MAX_DEVICES];
        for (int d = 1; d < h->k; d++)
            pf[d - 1] = (struct pollfd){.fd = reported[d] ? -1 : hn_conn_fd(h->conn[d]), .events = POLLIN};
        if (poll(pf, (nfds_t)(h->k - 1), 20) <= 0) continue;
        for (int d = 1; d < h->k; d++) {
            if (!pf[d - 1].revents) continue;
            hn_msg m;
            hr_err e = {0};
            reported[d] = true;
            if (hn_msg_recv(h->conn[d], &h->rx[d], &m, hn_deadline_ms(100), &e) == 0) continue; /* its ERROR */
            if (e.code == HR_ENET) return hc_dev_fail(h, d, e.code, e.msg, err);  /* closed: it died */
        }
    }
    return rc;
}

/* A pipeline's pass missed its deadline: which worker stopped? Every worker is asked for its figures
   (PROFILE_REQ, answered between passes); the first that does not answer within HC_PING_MS, or whose
   connection closed, is the one (else the last, as before). A late hidden state is dropped. */
static int hc_pp_stalled(hc_core *h, hr_err *err) {
    bool answered[HC_MAX_DEVICES] = {0};
    for (int d = 1; d < h->k; d++) {
        hn_msg m = {.type = HN_MSG_PROFILE_REQ};
        m.u.profile_req = (hn_profile_req){.flags = HN_PROFILE_STATS};
        if (hc_hsend(h, d, &m, HC_PING_MS, err)) return err ? err->code : HR_ENET;
    }
    int64_t until = hr_time_ns() + (int64_t)HC_PING_MS * 1000000;
    for (int left = h->k - 1; left > 0 && hr_time_ns() < until;) {
        struct pollfd pf[HC_MAX_DEVICES];
        for (int d = 1; d < h->k; d++)
            pf[d - 1] = (struct pollfd){.fd = answered[d] ? -1 : hn_conn_fd(h->conn[d]), .events = POLLIN};
        if (poll(pf, (nfds_t)(h->k - 1), 20) <= 0) continue;
        for (int d = 1; d < h->k; d++) {
            if (!pf[d - 1].revents) continue;
            hn_msg m;
            hr_err e = {0};
            /* (a late hidden state may be large: it gets the whole wait) */
            if (hn_msg_recv(h->conn[d], &h->rx[d], &m, hn_deadline_ms(HC_PING_MS), &e))
                return hc_dev_fail(h, d, e.code, e.msg, err);
            if (m.type == HN_MSG_PROFILE) answered[d] = true, left--;
        }
    }
    for (int d = 1; d < h->k; d++)
        if (!answered[d]) return hc_dev_fail(h, d, HR_ETIMEDOUT, "stopped answering (the pipeline's pass missed its deadline)", err);
    return hc_dev_fail(h, h->k - 1, HR_ETIMEDOUT, "no hidden state back from the pipeline in time", err);
}

/* Pipeline: waits for the hidden state to come back to the head — round the ring from the last worker,
   or straight from the worker whose window ended the model's layers. An ERROR or a closed connection
   from any worker on the way ends the wait at once and names that worker. The pass must have moved
   on: its layer_begin is past `after`. */
/* the next FORWARD back from any worker (a pass's hidden state), within the deadline of a pass of nb
   tokens; *from: who sent it */
static int hc_pp_recv(hc_core *h, int nb, hn_msg *m, int *from_out, hr_err *err) {
    int64_t deadline = hc_ar_deadline(&h->ar, nb);
    for (;;) {
        struct pollfd pf[HC_MAX_DEVICES];
        for (int d = 1; d < h->k; d++) pf[d - 1] = (struct pollfd){.fd = hn_conn_fd(h->conn[d]), .events = POLLIN};
        int64_t left = (deadline - hr_time_ns()) / 1000000;
        if (left <= 0) return hc_pp_stalled(h, err);
        int r = poll(pf, (nfds_t)(h->k - 1), (int)HR_MIN(left, 1000));
        if (r < 0 && errno != EINTR) return hr_fail(err, HR_ENET, "poll: %s", strerror(errno));
        int from = -1;
        for (int d = 1; d < h->k && r > 0 && from < 0; d++)
            if (pf[d - 1].revents) from = d;
        if (from < 0) continue;
        /* a connection that closes without an ERROR is the stage that died (a neighbour that noticed
           says so first): no need to wait for the others */
        hr_err e = {0};
        if (hn_msg_recv(h->conn[from], &h->rx[from], m, hn_deadline_ms(HR_MAX(left, 1)), &e))
            return hc_dev_fail(h, from, e.code, e.msg, err);
        if (m->type == HN_MSG_ERROR) return hc_pp_blame(h, from, hc_worker_error(h, from, m, err), err);
        if (m->type != HN_MSG_FORWARD)
            return hc_dev_fail(h, from, HR_EPROTO, "sent something else where FORWARD was expected", err);
        *from_out = from;
        return 0;
    }
}

static int hc_pp_wait(hc_core *h, int nb, int32_t after, hn_msg *m, hr_err *err) {
    int from, rc = hc_pp_recv(h, nb, m, &from, err);
    if (rc) return rc;
    const hn_forward *f = &m->u.forward;
    if (f->layer_begin <= (uint32_t)after || f->layer_begin > (uint32_t)h->m->hp.n_layer ||
        f->n_tokens != (uint32_t)nb || f->n_embd != (uint32_t)h->m->hp.n_embd || f->pos[0] != h->pos[0])
        return hc_dev_fail(h, from, HR_EPROTO, "returned the hidden state of another pass or window", err);
    return 0;
}

/* Runs the head's part of a pass over b (its hidden state in b->embd, positions pos) with the devices
   that share its layers: w < 0, tensor parallelism — every worker gets the hidden state (FORWARD of
   [0, L)) and runs its share of every layer; else the head's window w of a pipeline — in a hybrid plan
   with the members of its group, each of which gets the window's layers [begin, end) to run its share
   of. The all-reduces after each block join the shares. */
static int hc_head_run(hc_core *h, int w, const hm_batch *b, const int32_t *pos, hr_err *err) {
    int32_t lb = 0, le = h->m->hp.n_layer;
    int nd = h->k;
    if (w >= 0) lb = h->pp.win[0][w].begin, le = h->pp.win[0][w].end, nd = h->group;
    int64_t t0 = hr_time_ns();
    if (lb < le) {
        hn_msg f = {.type = HN_MSG_FORWARD};
        f.u.forward = (hn_forward){.layer_begin = (uint32_t)lb, .layer_end = (uint32_t)le, .stage = HN_STAGE_BLOCK,
                                   .n_tokens = (uint32_t)b->n, .n_embd = (uint32_t)h->m->hp.n_embd, .pos = pos,
                                   .seq = b->seq, .data = b->embd};
        for (int d = 1; d < nd; d++) {
            int rc = hc_hsend(h, d, &f, h->ar.timeout_ms, err);
            if (rc) return rc;
        }
    }
    memset(&h->ar.err, 0, sizeof h->ar.err);
    h->ar.err_dev = -1;
    h->ar.mark = hr_time_ns();
    h->ar.send_ns += h->ar.mark - t0;
    hr_err e = {0};
    int rc = w < 0 ? hm_eval(h->ctx, b, &e) : hm_eval_window(h->ctx, w, b, &e);
    h->ar.compute_ns += hr_time_ns() - h->ar.mark;
    if (rc) {
        h->failed = true;
        if (h->ar.err.msg[0] && h->ar.err_dev > 0) h->fail_dev = h->ar.err_dev;
        return hr_fail(err, rc, "%s", h->ar.err.msg[0] ? h->ar.err.msg : e.msg);
    }
    return 0;
}

/* ---- pipeline micro-batches ------------------------------------------------------------------------
   A batch of several sequences is split by sequence into micro-batches that follow each other round
   the ring, so that while one is on a worker the head and the other workers compute the others
   (docs/pipeline.md). Each goes its own pass, window after window as a whole batch would; a token's
   results do not depend on the other tokens of its batch (hm_batch), so the logits are those of the
   batch in one pass. */
typedef struct hc_mb {
    int      n, n_out;        /* tokens, rows of logits wanted */
    int32_t  layer;           /* where its pass is: the next layer to run */
    int      w;               /* the head's next window */
    bool     done;
    int32_t *idx, *pos, *seq; /* [n]: its tokens' indices in the batch, positions, sequences */
    uint8_t *out;             /* [n] */
    float   *x;               /* [n][n_embd]: its hidden state */
    float   *lg;              /* [n_out][n_vocab] */
} hc_mb;

/* mb's pass from where it is: the head's windows as the pass reaches them (the last one: logits, the
   pass done), else on to worker 1 */
static int hc_mb_advance(hc_core *h, hc_mb *mb, hr_err *err) {
    const hm_hparams *hp = &h->m->hp;
    const int nw = h->pp.n_win[0];
    for (;;) {
        int64_t t1 = hr_time_ns();
        if (mb->w < nw && h->pp.win[0][mb->w].begin == mb->layer) {
            const bool last = mb->w == nw - 1;
            const hm_batch b = {.embd = mb->x, .n = mb->n, .pos_of = mb->pos, .seq = mb->seq, .out = mb->out,
                                .logits = last ? mb->lg : NULL, .embd_out = h->y};
            int rc = hc_head_run(h, mb->w, &b, mb->pos, err);
            if (rc) return rc;
            if (last) { mb->done = true; return 0; }
            mb->layer = h->pp.win[0][mb->w++].end;
            memcpy(mb->x, h->y, (size_t)mb->n * hp->n_embd * sizeof(float));
            continue;
        }
        if (mb->layer == hp->n_layer) {
            h->failed = true;
            return hr_fail(err, HR_EPROTO, "the pipeline returned at layer %d, where the head has no window", mb->layer);
        }
        hn_msg f = {.type = HN_MSG_FORWARD};
        f.u.forward = (hn_forward){.layer_begin = (uint32_t)mb->layer, .layer_end = (uint32_t)hp->n_layer,
                                   .stage = HN_STAGE_BLOCK, .n_tokens = (uint32_t)mb->n, .n_embd = (uint32_t)hp->n_embd,
                                   .pos = mb->pos, .seq = mb->seq, .data = mb->x};
        int rc = hc_hsend(h, h->group, &f, h->ar.timeout_ms, err);
        h->ar.send_ns += hr_time_ns() - t1;
        return rc;
    }
}

/* Splits pb (several sequences, pb->seq set) into n_mb micro-batches, whole sequences each, the
   largest first onto the one with the fewest tokens; runs them round the ring together. */
static int hc_pp_micro(hc_core *h, const hm_batch *pb, int n_mb, hr_err *err) {
    const hm_hparams *hp = &h->m->hp;
    const int n = pb->n, V = hp->n_vocab;
    const int64_t E = hp->n_embd;
    hc_mb mb[HC_MAX_MICRO] = {0};
    int32_t *cnt = calloc((size_t)h->n_seq, sizeof *cnt), *grp = malloc(sizeof(int32_t) * (size_t)h->n_seq);
    int32_t *idx = malloc(sizeof(int32_t) * 3 * (size_t)n);
    uint8_t *out = malloc((size_t)n);
    float *x = malloc(sizeof(float) * (size_t)n * E);
    int rc = 0;
    if (!cnt || !grp || !idx || !out || !x) { rc = hr_fail(err, HR_ENOMEM, "out of memory"); goto done; }
    for (int i = 0; i < n; i++) cnt[pb->seq[i]]++;
    int load[HC_MAX_MICRO] = {0};
    for (;;) { /* the largest unplaced sequence onto the lightest micro-batch */
        int32_t s = -1;
        for (int32_t q = 0; q < h->n_seq; q++)
            if (cnt[q] > 0 && (s < 0 || cnt[q] > cnt[s])) s = q;
        if (s < 0) break;
        int g = 0;
        for (int k = 1; k < n_mb; k++)
            if (load[k] < load[g]) g = k;
        grp[s] = g, load[g] += cnt[s], cnt[s] = -cnt[s];
    }
    /* each micro-batch's tokens in batch order, its rows of x, its wanted rows */
    for (int k = 0, at = 0; k < n_mb; at += mb[k++].n) {
        mb[k].idx = idx + at, mb[k].pos = idx + n + at, mb[k].seq = idx + 2 * n + at, mb[k].out = out + at;
        mb[k].x = x + (int64_t)at * E;
        for (int i = 0; i < n; i++) {
            if (grp[pb->seq[i]] != k) continue;
            const int j = mb[k].n++;
            mb[k].idx[j] = i, mb[k].pos[j] = h->pos[i], mb[k].seq[j] = pb->seq[i];
            mb[k].out[j] = pb->out ? pb->out[i] != 0 : pb->all_logits || i == n - 1;
            mb[k].n_out += mb[k].out[j];
            memcpy(mb[k].x + (int64_t)j * E, pb->embd + (int64_t)i * E, sizeof(float) * E);
        }
        if (pb->logits && mb[k].n_out && !(mb[k].lg = malloc(sizeof(float) * (size_t)mb[k].n_out * V))) {
            rc = hr_fail(err, HR_ENOMEM, "out of memory");
            goto done;
        }
    }
    int in_flight = 0;
    for (int k = 0; k < n_mb && !rc; k++)
        if (mb[k].n && !(rc = hc_mb_advance(h, &mb[k], err))) in_flight += !mb[k].done;
    while (!rc && in_flight > 0) {
        hn_msg m;
        int from;
        if ((rc = hc_pp_recv(h, n, &m, &from, err))) break;
        const hn_forward *f = &m.u.forward;
        hc_mb *b = NULL;  /* whose pass it is: its sequences are its own */
        for (int k = 0; k < n_mb && !b; k++)
            if (mb[k].n && !mb[k].done && f->n_tokens == (uint32_t)mb[k].n && f->seq && f->seq[0] == mb[k].seq[0] &&
                f->pos[0] == mb[k].pos[0] && f->layer_begin > (uint32_t)mb[k].layer)
                b = &mb[k];
        if (!b || f->layer_begin > (uint32_t)hp->n_layer || f->n_embd != (uint32_t)E) {
            rc = hc_dev_fail(h, from, HR_EPROTO, "returned the hidden state of another pass or window", err);
            break;
        }
        int64_t t0 = hr_time_ns();
        memcpy(b->x, f->data, sizeof(float) * (size_t)b->n * E);
        b->layer = (int32_t)f->layer_begin;
        h->ar.wait_ns += hr_time_ns() - t0;
        if (!(rc = hc_mb_advance(h, b, err))) in_flight -= b->done;
    }
    /* the logits in batch order: each micro-batch's rows to where its tokens' rows go */
    if (!rc && pb->logits) {
        int row = 0;
        for (int i = 0; i < n; i++) {
            const bool want = pb->out ? pb->out[i] != 0 : pb->all_logits || i == n - 1;
            if (!want) continue;
            for (int k = 0; k < n_mb; k++)
                for (int j = 0, r = 0; j < mb[k].n; r += mb[k].out[j++])
                    if (mb[k].idx[j] == i) memcpy(pb->logits + (size_t)row * V, mb[k].lg + (size_t)r * V, sizeof(float) * V);
            row++;
        }
    }
done:
    for (int k = 0; k < HC_MAX_MICRO; k++) free(mb[k].lg);
    free(cnt), free(grp), free(idx), free(out), free(x);
    return rc;
}

/* One batch through the pipeline: the head runs its windows as the pass reaches them and otherwise
   hands the hidden state to worker 1 (the ring's first stage) — also when the ring brings it back
   before a worker's window, as with a head that owns no layers in between. */
static int hc_pp_batch(hc_core *h, const hm_batch *pb, hr_err *err) {
    const hm_hparams *hp = &h->m->hp;
    const int nb = pb->n;
    int nw = h->pp.n_win[0], w = 0;
    int32_t layer = 0;
    for (;;) {
        int rc;
        int64_t t1 = hr_time_ns();
        if (w < nw && h->pp.win[0][w].begin == layer) {
            hm_batch b = *pb;
            b.embd = h->x, b.embd_out = h->y;
            if (w != nw - 1) b.logits = NULL;
            if ((rc = hc_head_run(h, w, &b, h->pos, err))) return rc;
            t1 = hr_time_ns();
            if (w == nw - 1) return 0;   /* the head's last window ends the pass with the output head */
            layer = h->pp.win[0][w++].end;
            float *t = h->x; h->x = h->y; h->y = t;
            if (h->pp.win[0][w].begin == layer) continue;
        }
        hn_msg f = {.type = HN_MSG_FORWARD};
        f.u.forward = (hn_forward){.layer_begin = (uint32_t)layer, .layer_end = (uint32_t)hp->n_layer,
                                   .stage = HN_STAGE_BLOCK, .n_tokens = (uint32_t)nb, .n_embd = (uint32_t)hp->n_embd,
                                   .pos = h->pos, .seq = pb->seq, .data = h->x};
        if ((rc = hc_hsend(h, h->group, &f, h->ar.timeout_ms, err))) return rc;
        int64_t t2 = hr_time_ns();
        h->ar.send_ns += t2 - t1;
        hn_msg m;
        if ((rc = hc_pp_wait(h, nb, layer, &m, err))) return rc;
        layer = (int32_t)m.u.forward.layer_begin;
        if (w >= nw || (h->pp.win[0][w].begin != layer && layer == hp->n_layer)) {
            h->failed = true;
            return hr_fail(err, HR_EPROTO, "the pipeline returned at layer %d, where the head has no window", layer);
        }
        memcpy(h->x, m.u.forward.data, (size_t)nb * hp->n_embd * sizeof(float));
        h->ar.wait_ns += hr_time_ns() - t2;
    }
}

/* One batch of at most n_batch tokens through the cluster: its embeddings in h->x, its positions in
   h->pos (what FORWARD carries), b the head's hm_batch over them (seq: h->sq or NULL). */
static int hc_pass(hc_core *h, const hm_batch *b, hr_err *err) {
    const hm_hparams *hp = &h->m->hp;
    if (h->p.pp && h->p.pp_micro > 1 && b->seq &&
        (uint64_t)b->n * hp->n_embd * sizeof(float) <= HC_MICRO_MAX_BYTES) {
        /* micro-batches: as many as asked for, at most one per sequence */
        int n_mb = 0;
        for (int i = 0; i < b->n && n_mb < HR_MIN(h->p.pp_micro, HC_MAX_MICRO); i++) {
            bool seen = false;
            for (int j = 0; j < i && !seen; j++) seen = b->seq[j] == b->seq[i];
            n_mb += !seen;
        }
        if (n_mb > 1) return hc_pp_micro(h, b, n_mb, err);
    }
    if (h->p.pp) return hc_pp_batch(h, b, err);
    return hc_head_run(h, -1, b, h->pos, err);
}

/* after a pass of n tokens that took ns: a decode step's time, as a slowly decaying maximum (one quick
   step does not shorten the deadline, one slow one lengthens it at once), and with the automatic
   deadline the pass deadline from it */
static void hc_step_done(hc_core *h, int n, int64_t ns) {
    if (n > HC_STEP_MAX_TOKENS) return;
    double ms = (double)ns * 1e-6;
    h->step_ms = ms > h->step_ms ? ms : 0.9 * h->step_ms + 0.1 * ms;
    if (h->timeout_auto) {
        h->ar.timeout_ms = (int64_t)HR_MAX((double)HC_DEADLINE_FLOOR_MS, HC_DEADLINE_FACTOR * h->step_ms);
        h->ar.token_ms = (int64_t)HR_MAX((double)HC_TOKEN_MS, h->step_ms);
    }
}

/* the embeddings of tokens[0..n) into h->x: the embedding stays here, workers get hidden states,
   never token ids */
static int hc_embed(hc_core *h, const int32_t *tokens, int n, hr_err *err) {
    int64_t t0 = hr_time_ns();
    int rc = hm_embed(h->run, tokens, n, h->x, err);
    h->ar.compute_ns += hr_time_ns() - t0;
    return rc;
}

int hc_core_eval(hc_core *h, const int32_t *tokens, int n, int32_t pos0, float *logits, bool all_logits, hr_err *err) {
    if (h->failed) return hr_fail(err, HR_ENET, "the cluster failed earlier; start again");
    const hm_hparams *hp = &h->m->hp;
    for (int off = 0; off < n; off += h->n_batch) {
        int nb = HR_MIN(h->n_batch, n - off);
        int32_t p0 = pos0 + off;
        int rc = hc_embed(h, tokens + off, nb, err);
        if (rc) return rc;
        for (int i = 0; i < nb; i++) h->pos[i] = p0 + i;
        float *lg = all_logits ? logits + (size_t)off * hp->n_vocab : (off + nb == n ? logits : NULL);
        const hm_batch b = {.embd = h->x, .n = nb, .pos = p0, .logits = lg, .all_logits = all_logits};
        if (h->mem && (rc = hmem_set_positions(h->mem, p0 + nb, err))) return rc;
        int64_t t0 = hr_time_ns();
        if ((rc = hc_pass(h, &b, err))) return rc;
        hc_step_done(h, nb, hr_time_ns() - t0);
        hc_ar_lossy_settle(&h->ar);
    }
    h->evals++;
    h->tokens += n;
    return 0;
}

int hc_core_eval_batch(hc_core *h, const hm_batch *b, hr_err *err) {
    if (h->failed) return hr_fail(err, HR_ENET, "the cluster failed earlier; start again");
    if (!b->tokens) return hr_fail(err, HR_EINVAL, "a cluster batch takes token ids");
    if (b->n > h->n_batch) return hr_fail(err, HR_EINVAL, "batch of %d tokens over the cluster's %d", b->n, h->n_batch);
    /* checked here, before any device has it: a worker's own check failing would end its session */
    int rc = hm_batch_check(h->ctx, b, err);
    if (rc) return rc;
    if ((rc = hc_embed(h, b->tokens, b->n, err))) return rc;
    for (int i = 0; i < b->n; i++) h->pos[i] = b->pos_of ? b->pos_of[i] : b->pos + i;
    if (b->seq) memcpy(h->sq, b->seq, sizeof *h->sq * (size_t)b->n);
    const hm_batch pb = {.embd = h->x, .n = b->n, .pos = b->pos, .pos_of = h->pos, .seq = b->seq ? h->sq : NULL,
                         .logits = b->logits, .all_logits = b->all_logits, .out = b->out};
    int32_t top = 0;
    for (int i = 0; i < b->n; i++) top = HR_MAX(top, h->pos[i] + 1);
    if (h->mem && (rc = hmem_set_positions(h->mem, top, err))) return rc;
    int64_t t0 = hr_time_ns();
    if ((rc = hc_pass(h, &pb, err))) return rc;
    hc_step_done(h, b->n, hr_time_ns() - t0);
    hc_ar_lossy_settle(&h->ar);
    h->evals++;
    h->tokens += b->n;
    return 0;
}

int hc_core_reset(hc_core *h, int32_t pos, hr_err *err) {
    if (h->failed) return hr_fail(err, HR_ENET, "the cluster failed earlier; start again");
    for (int d = 1; d < h->k; d++) {
        hn_msg m = {.type = HN_MSG_RESET};
        m.u.reset.pos_begin = (uint32_t)HR_MAX(pos, 0);
        int rc = hc_hsend(h, d, &m, h->p.timeout_ms, err);
        if (rc) return rc;
    }
    return 0;
}

int hc_core_kv_seq_copy(hc_core *h, int32_t src, int32_t dst, int32_t n, hr_err *err) {
    if (h->failed) return hr_fail(err, HR_ENET, "the cluster failed earlier; start again");
    int rc = hm_kv_seq_copy(h->ctx, src, dst, n, err); /* checks the arguments before any worker sees them */
    for (int d = 1; !rc && d < h->k; d++) {
        hn_msg m = {.type = HN_MSG_KV_COPY};
        m.u.kv_copy = (hn_kv_copy){(uint32_t)src, (uint32_t)dst, (uint32_t)n};
        rc = hc_hsend(h, d, &m, h->p.timeout_ms, err);
    }
    return rc;
}

int32_t hc_core_n_ctx(const hc_core *h) { return h->n_ctx; }
int32_t hc_core_n_seq(const hc_core *h) { return h->n_seq; }
int32_t hc_core_n_batch(const hc_core *h) { return h->n_batch; }
const hc_plan *hc_core_plan(const hc_core *h) { return &h->plan; }
const hc_pp_plan *hc_core_pp_plan(const hc_core *h) { return h->p.pp ? &h->pp : NULL; }
hmem *hc_core_mem(const hc_core *h) { return h->mem; }
uint64_t hc_core_weight_bytes_sent(const hc_core *h) { return h->bytes_sent; }
uint64_t hc_core_weight_bytes_total(const hc_core *h) { return h->bytes_total; }
uint64_t hc_core_slice_bytes_written(const hc_core *h) { return h->slice_written; }
int hc_core_failed_worker(const hc_core *h) { return h->failed ? h->fail_dev : 0; }
double hc_core_step_ms(const hc_core *h) { return h->step_ms; }

/* a PROFILE value by key as a number in base `base` (0 when absent) */
static uint64_t hc_kv_num(const hn_profile *p, const char *key, int base) {
    char b[40];
    if (!hn_profile_get(p, key, b, sizeof b)) return 0;
    return base == 10 ? (uint64_t)strtoll(b, NULL, 10) : strtoull(b, NULL, base);
}
static int64_t hc_kv_i64(const hn_profile *p, const char *key) { return (int64_t)hc_kv_num(p, key, 10); }

void hc_dev_stats_mem(hc_dev_stats *s, hmem *mm) {
    hmem_sample smp;
    hmem_take_sample(mm, &smp);
    hmem_stats ms = hmem_get_stats(mm);
    s->resident_bytes = smp.resident;
    s->resident_peak = ms.resident_peak;
    const hmem_plan *pl = hmem_get_plan(mm);
    s->budget = pl->mode == HMEM_OBSERVE ? 0 : pl->budget;   /* plain mmap: figures, no budget */
    s->stream_bytes = pl->mode == HMEM_STREAM ? pl->stream_bytes : 0;
    s->room_bytes = pl->mode == HMEM_STREAM ? pl->room_bytes : 0;
    s->disk_read_bytes = ms.disk_read_bytes;
    s->weights_wait_ns = ms.wait_ns;
    s->mem_replans = ms.n_replans;
    s->pressure = ms.pressure;
    for (int k = 0; k < 2; k++) {
        s->blk_n[k] = ms.kind[k].n_begin;
        s->blk_compute_ns[k] = ms.kind[k].compute_ns;
        s->blk_loads[k] = ms.kind[k].n_loads;
        s->blk_load_ns[k] = ms.kind[k].load_ns;
    }
}

int hc_core_stats(hc_core *h, hc_dev_stats *out, int cap, hr_err *err) {
    if (cap < h->k) return hr_fail(err, HR_ERANGE, "room for %d devices, %d needed", cap, h->k);
    if (h->failed) return hr_fail(err, HR_ENET, "the cluster failed earlier");
    hc_dev_stats *s = &out[0];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "head");
    s->evals = h->evals;
    s->tokens = h->tokens;
    s->compute_ns = h->ar.compute_ns;
    s->wait_ns = h->ar.wait_ns;
    s->send_ns = h->ar.send_ns;
    s->kv_units = h->plan.dev[0].kv_end - h->plan.dev[0].kv_begin;
    s->ff_units = h->plan.dev[0].ff_end - h->plan.dev[0].ff_begin;
    s->n_layers = h->m->hp.n_layer;
    s->sum_hash = h->ar.sum_hash;
    s->lossy_syncs = h->ar.lossy_syncs;
    s->settles = h->ar.settles;
    s->settle_ms = (double)h->ar.settle_ns * 1e-6;
    s->elems_lost_max = h->ar.elems_lost_max;
    for (int d = 1; d < h->k; d++) s->elems_lost += h->ll[d].elems_lost;
    if (h->p.pp) {
        s->n_layers = 0;
        for (int i = 0; i < h->pp.n_win[0]; i++) s->n_layers += h->pp.win[0][i].end - h->pp.win[0][i].begin;
    }
    if (h->mem) hc_dev_stats_mem(s, h->mem);
    for (int d = 1; d < h->k; d++) {
        hn_conn_stats st;
        hn_conn_get_stats(h->conn[d], &st);
        s->bytes_sent += st.bytes_sent - h->base[d].bytes_sent;
        s->bytes_received += st.bytes_received - h->base[d].bytes_received;
    }
    /* the workers' figures travel after the head's own were taken, so they are not counted in them */
    for (int d = 1; d < h->k; d++) {
        hn_msg m = {.type = HN_MSG_PROFILE_REQ};
        m.u.profile_req = (hn_profile_req){.flags = HN_PROFILE_STATS, .bench_ms = 0};
        if (hc_hsend(h, d, &m, h->p.timeout_ms, err) || hc_expect(h, d, HN_MSG_PROFILE, &m, h->p.timeout_ms, err))
            return err ? err->code : HR_ENET;
        hc_dev_stats *w = &out[d];
        memset(w, 0, sizeof *w);
        snprintf(w->name, sizeof w->name, "%s", h->names[d]);
        const hn_profile *p = &m.u.profile;
        w->evals = hc_kv_i64(p, "evals");
        w->tokens = hc_kv_i64(p, "tokens");
        w->compute_ns = hc_kv_i64(p, "compute_ns");
        w->wait_ns = hc_kv_i64(p, "wait_ns");
        w->send_ns = hc_kv_i64(p, "send_ns");
        w->bytes_sent = (uint64_t)hc_kv_i64(p, "bytes_sent");
        w->bytes_received = (uint64_t)hc_kv_i64(p, "bytes_received");
        w->kv_units = h->plan.dev[d].kv_end - h->plan.dev[d].kv_begin;
        w->ff_units = h->plan.dev[d].ff_end - h->plan.dev[d].ff_begin;
        w->n_layers = (int32_t)hc_kv_i64(p, "n_layers");
        w->resident_bytes = (uint64_t)hc_kv_i64(p, "resident_bytes");
        w->resident_peak = (uint64_t)hc_kv_i64(p, "resident_peak");
        w->budget = (uint64_t)hc_kv_i64(p, "budget");
        w->stream_bytes = (uint64_t)hc_kv_i64(p, "stream_bytes");
        w->room_bytes = (uint64_t)hc_kv_i64(p, "room_bytes");
        w->disk_read_bytes = hc_kv_i64(p, "disk_read_bytes");
        w->weights_wait_ns = hc_kv_i64(p, "weights_wait_ns");
        w->mem_replans = hc_kv_i64(p, "mem_replans");
        w->pressure = (double)hc_kv_i64(p, "pressure_ppm") * 1e-6;
        w->sum_hash = hc_kv_num(p, "sum_hash", 16);
        w->dg_sent = (uint64_t)hc_kv_i64(p, "dg_sent");
        w->dg_hook_dropped = (uint64_t)hc_kv_i64(p, "dg_hook_dropped");
        w->dg_send_fail = (uint64_t)hc_kv_i64(p, "dg_send_fail");
        const hc_lossy_link *l = &h->ll[d];
        w->dg_received = l->received;
        w->dg_lost = l->lost;
        w->dg_late = l->late;
        w->dg_dup = l->dup;
        w->dg_foreign = l->foreign;
        w->dg_malformed = l->malformed;
        w->dg_auth_failed = l->auth_failed;
        w->elems_lost = l->elems_lost;
        w->res_sent = l->res_sent;
        w->res_resent = l->resends;
        w->res_received = (uint64_t)hc_kv_i64(p, "res_received");
        w->nacks = (uint64_t)hc_kv_i64(p, "nacks");
        static const char *const bk[2][4] = {{"attn_n", "attn_compute_ns", "attn_loads", "attn_load_ns"},
                                             {"ffn_n", "ffn_compute_ns", "ffn_loads", "ffn_load_ns"}};
        for (int k = 0; k < 2; k++) {
            w->blk_n[k] = hc_kv_i64(p, bk[k][0]);
            w->blk_compute_ns[k] = hc_kv_i64(p, bk[k][1]);
            w->blk_loads[k] = hc_kv_i64(p, bk[k][2]);
            w->blk_load_ns[k] = hc_kv_i64(p, bk[k][3]);
        }
    }
    /* cumulative -> since the previous call */
    for (int d = 0; d < h->k; d++) {
        int64_t disk = out[d].disk_read_bytes, ww = out[d].weights_wait_ns;
        if (disk >= 0) out[d].disk_read_bytes -= h->base_disk[d];
        out[d].weights_wait_ns -= h->base_wwait[d];
        h->base_disk[d] = disk >= 0 ? disk : 0;
        h->base_wwait[d] = ww;
    }
    h->evals = h->tokens = 0;
    h->ar.compute_ns = h->ar.wait_ns = h->ar.send_ns = 0;
    for (int d = 1; d < h->k; d++) hn_conn_get_stats(h->conn[d], &h->base[d]);
    return h->k;
}

void hc_format_stats(const hc_dev_stats *s, int n, char *buf, size_t cap) {
    size_t len = 0;
#define OUT(...) do { int w_ = snprintf(buf + len, len < cap ? cap - len : 0, __VA_ARGS__); \
        if (w_ > 0) len += (size_t)w_; } while (0)
    if (cap) buf[0] = 0;
    /* wait/send: the all-reduce (tensor parallel), or the ring trip and the hand-off (pipeline) */
    OUT("%-24s %6s %7s %7s %10s %10s %10s %10s %12s\n", "device", "layers", "KV", "FFN", "compute", "wait", "send",
        "total", "KiB out");
    OUT("%-24s %6s %7s %7s %10s %10s %10s %10s %12s\n", "", "", "heads", "neurons", "ms/pass", "ms/pass", "ms/pass",
        "ms/pass", "per pass");
    bool mem = false;
    for (int i = 0; i < n; i++) {
        double ev = s[i].evals > 0 ? (double)s[i].evals : 1;
        double c = s[i].compute_ns / ev * 1e-6, wt = s[i].wait_ns / ev * 1e-6, sd = s[i].send_ns / ev * 1e-6;
        OUT("%-24s %6d %7d %7d %10.3f %10.3f %10.3f %10.3f %12.1f\n", s[i].name, s[i].n_layers, s[i].kv_units,
            s[i].ff_units, c, wt, sd, c + wt + sd, s[i].bytes_sent / ev / 1024.0);
        mem |= s[i].budget > 0 || s[i].resident_peak > 0;
    }
    if (mem) {
        OUT("%-24s %10s %10s %10s %12s %12s %9s\n", "weights", "budget", "resident", "peak", "disk read",
            "blocked", "pressure");
        OUT("%-24s %10s %10s %10s %12s %12s %9s\n", "", "MiB", "MiB", "MiB", "MiB/pass", "ms/pass", "%");
        for (int i = 0; i < n; i++) {
            double ev = s[i].evals > 0 ? (double)s[i].evals : 1;
            if (!s[i].budget && !s[i].resident_peak) { OUT("%-24s %10s\n", s[i].name, "(none)"); continue; }
            char b[16] = "mmap";   /* no budget: plain mmap, observed */
            if (s[i].budget) snprintf(b, sizeof b, "%.1f", s[i].budget / 1048576.0);
            OUT("%-24s %10s %10.1f %10.1f %12.2f %12.3f %9.2f\n", s[i].name, b,
                s[i].resident_bytes / 1048576.0, s[i].resident_peak / 1048576.0,
                s[i].disk_read_bytes < 0 ? -1.0 : s[i].disk_read_bytes / ev / 1048576.0, s[i].weights_wait_ns / ev * 1e-6,
                100 * s[i].pressure);
        }
    }
    bool lossy = false;
    for (int i = 0; i < n; i++) lossy |= s[i].lossy_syncs > 0 || s[i].dg_sent > 0;
    if (lossy) {
        /* the lossy all-reduce, over the session: what each worker sent and what reached the head */
        OUT("%-24s %9s %9s %9s %9s %9s %9s %9s %9s %9s %11s %9s %9s %9s\n", "lossy", "sent", "dropped", "received",
            "lost", "late", "dup", "foreign", "malformed", "auth fail", "elems lost", "sums out", "sums in", "NACKs");
        for (int i = 1; i < n; i++)
            OUT("%-24s %9llu %9llu %9llu %9llu %9llu %9llu %9llu %9llu %9llu %11llu %9llu %9llu %9llu\n", s[i].name,
                (unsigned long long)s[i].dg_sent, (unsigned long long)(s[i].dg_hook_dropped + s[i].dg_send_fail),
                (unsigned long long)s[i].dg_received, (unsigned long long)s[i].dg_lost,
                (unsigned long long)s[i].dg_late, (unsigned long long)s[i].dg_dup, (unsigned long long)s[i].dg_foreign,
                (unsigned long long)s[i].dg_malformed, (unsigned long long)s[i].dg_auth_failed,
                (unsigned long long)s[i].elems_lost,
                (unsigned long long)(s[i].res_sent + s[i].res_resent), (unsigned long long)s[i].res_received,
                (unsigned long long)s[i].nacks);
        OUT("%-24s %llu all-reduces merged from datagrams, %llu elements lost (at most %llu in one); %llu pass ends "
            "waited %.1f ms for a worker behind\n", "head",
            (unsigned long long)s[0].lossy_syncs, (unsigned long long)s[0].elems_lost,
            (unsigned long long)s[0].elems_lost_max, (unsigned long long)s[0].settles, s[0].settle_ms);
    }
#undef OUT
    (void)len;
}

void hc_core_free(hc_core *h) {
    if (!h) return;
    for (int d = 1; d < h->k; d++) {
        if (!h->conn[d]) continue;
        hn_msg m = {.type = HN_MSG_BYE, .seq = ++h->seq};
        m.u.bye = (hn_bye){.code = h->failed ? HR_ENET : 0, .reason = hn_cstr(h->failed ? "head failed" : "done")};
        hc_send(&h->hook, d, h->conn[d], &m, hn_deadline_ms(1000), NULL);
        hn_conn_close(h->conn[d]);
        hn_frame_free(&h->rx[d]);
    }
    hn_frame_free(&h->ar.ring_rx);
    for (int d = 1; d < h->k; d++) {
        hn_udp_close(h->ll[d].udp);
        hn_dgram_crypt_wipe(&h->ll[d].crypt);
    }
    hc_ar_lossy_free(&h->ar);
    for (int d = 0; d < HC_MAX_DEVICES; d++) hm_protect_free(h->prot[d]);
    free(h->prot_sel);
    hm_ctx_free(h->ctx);
    hmem_free(h->mem);
    hm_model_free(h->pm);
    hm_model_free(h->sm);
    gguf_close(h->sg);
    if (h->slice_hold >= 0) close(h->slice_hold);   /* the slice file may be evicted from now on */
    hr_free_aligned(h->x);
    hr_free_aligned(h->y);
    free(h->order.order[0]);
    free(h->order.order[1]);
    free(h->pos);
    free(h->sq);
    free(h);
}
