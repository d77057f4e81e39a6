/* serve/http: the HTTP side — libmicrohttpd with one thread per connection (a connection's thread may
   block on its request's results), routes, requests read from JSON and checked field by field, replies
   shaped as llama.cpp's server shapes them (docs/serve.md), Server-Sent Events for streams.

   Hostile clients: the body is bounded (413 beyond max_body, refused from Content-Length before it is
   read), headers by the connection memory limit, connections by max_conns, silence by conn_timeout.
   A client that goes away is noticed by its socket (polled while its request waits) or by a failed
   write, and its request is cancelled. */
#define _GNU_SOURCE  /* POLLRDHUP */
#include "serve-impl.h"

#include "text/chat.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

struct hs_server {
    hs_server_params p;
    struct MHD_Daemon *d;
    int        port;
    hs_sched  *sched;         /* NULL while loading (atomic: set once by hs_server_ready) */
    hs_model_info mi;
    bool       stopping;      /* atomic */
    uint64_t   id_seq;        /* atomic: response ids */
    char       model_id[256];
};

typedef struct hs_conn {
    char  *body;
    size_t len, cap;
    bool   too_big;
    bool   replied;           /* a response was queued before the body (413) */
} hs_conn;

hs_server_params hs_server_default_params(void) {
    return (hs_server_params){.host = "127.0.0.1", .port = 8080, .n_slots = 4, .max_queue = 64, .max_conns = 128,
                              .max_body = 8u << 20, .conn_timeout = 60, .ping_s = 5, .model_id = "model"};
}

int hs_server_port(const hs_server *s) { return s->port; }

static hs_sched *server_sched(hs_server *S) { return __atomic_load_n(&S->sched, __ATOMIC_ACQUIRE); }
static bool server_stopping(hs_server *S) { return __atomic_load_n(&S->stopping, __ATOMIC_ACQUIRE); }

/* ---- responses ------------------------------------------------------------------------------------ */
static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *type, const char *body,
                             size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    if (status == MHD_HTTP_SERVICE_UNAVAILABLE) MHD_add_response_header(r, "Retry-After", "1");
    if (status == MHD_HTTP_UNAUTHORIZED) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

/* takes j */
static enum MHD_Result reply_json(struct MHD_Connection *c, unsigned status, json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) return reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "text/plain", "out of memory\n", 14);
    enum MHD_Result rc = reply(c, status, "application/json; charset=utf-8", s, strlen(s));
    free(s);
    return rc;
}

static json_t *error_obj(unsigned status, const char *type, const char *msg) {
    return json_pack("{s:{s:i,s:s,s:s}}", "error", "code", (int)status, "message", msg, "type", type);
}

static enum MHD_Result reply_error(struct MHD_Connection *c, unsigned status, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static enum MHD_Result reply_error(struct MHD_Connection *c, unsigned status, const char *type, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return reply_json(c, status, error_obj(status, type, msg));
}

#define BAD(c, ...) reply_error(c, MHD_HTTP_BAD_REQUEST, "invalid_request_error", __VA_ARGS__)

/* ---- text helpers --------------------------------------------------------------------------------- */
/* {"content": [{id, token, logprob, bytes, top_logprobs: [...]}, ...]} for lps[a..b) */
static json_t *logprobs_json(const ht_vocab *v, const hs_lp *lps, int a, int b) {
    json_t *arr = json_array();
    for (int i = a; i < b; i++) {
        json_t *t = hs_token_json(v, lps[i].id, lps[i].lp, true);
        json_t *top = json_array();
        for (int k = 0; k < lps[i].n_top; k++)
            json_array_append_new(top, hs_token_json(v, lps[i].top_id[k], lps[i].top_lp[k], true));
        json_object_set_new(t, "top_logprobs", top);
        json_array_append_new(arr, t);
    }
    return json_pack("{s:o}", "content", arr);
}

static json_t *timings_json(const hs_req *r) {
    int64_t now = hr_time_ns();
    int64_t t_first = r->t_first ? r->t_first : now, t_end = r->t_end ? r->t_end : now;
    double pms = (double)(t_first - r->t_start) * 1e-6, gms = (double)(t_end - t_first) * 1e-6;
    int pn = r->n_prompt - r->n_cached, gn = r->n_decoded;
    return json_pack("{s:i,s:i,s:f,s:f,s:f,s:i,s:f,s:f,s:f}", "cache_n", r->n_cached, "prompt_n", pn, "prompt_ms", pms,
                     "prompt_per_token_ms", pn ? pms / pn : 0.0, "prompt_per_second", pms > 0 ? pn * 1e3 / pms : 0.0,
                     "predicted_n", gn, "predicted_ms", gms, "predicted_per_token_ms", gn ? gms / gn : 0.0,
                     "predicted_per_second", gms > 0 ? gn * 1e3 / gms : 0.0);
}

static json_t *usage_json(const hs_req *r) {
    return json_pack("{s:i,s:i,s:i}", "completion_tokens", r->n_decoded, "prompt_tokens", r->n_prompt, "total_tokens",
                     r->n_decoded + r->n_prompt);
}

static const char *finish_name(int f) { return f == HS_LENGTH ? "length" : "stop"; }

/* ---- generation: replies -------------------------------------------------------------------------- */
static json_t *base_obj(hs_server *S, const hs_gen_req *g, const char *object) {
    return json_pack("{s:s,s:I,s:s,s:s,s:s}", "id", g->id, "created", g->created, "model", S->model_id,
                     "system_fingerprint", "hearth", "object", object);
}

/* the whole answer (under mu) */
static json_t *final_json(hs_server *S, const hs_gen_req *g, hs_req *r) {
    json_t *o = base_obj(S, g, g->chat ? "chat.completion" : "text_completion");
    json_t *lp = r->n_probs >= 0 ? logprobs_json(S->mi.voc, r->lps, 0, r->n_lps) : json_null();
    json_t *text = json_stringn(r->text ? r->text : "", r->text_len);
    const char *fin = finish_name(r->finish);
    json_t *choice = g->chat ? json_pack("{s:s,s:i,s:{s:s,s:o},s:o}", "finish_reason", fin, "index", 0, "message",
                                         "role", "assistant", "content", text, "logprobs", lp)
                             : json_pack("{s:o,s:i,s:o,s:s}", "text", text, "index", 0, "logprobs", lp, "finish_reason",
                                         fin);
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    json_object_set_new(o, "usage", usage_json(r));
    json_object_set_new(o, "timings", timings_json(r));
    if (r->warning[0]) json_object_set_new(o, "warning", json_string(r->warning));
    return o;
}

/* The connection's socket says the client is gone (closed or reset). */
static bool client_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) return true;
    char c;
    return (p.revents & POLLIN) && recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

typedef struct stream {
    hs_server *S;
    hs_req    *r;
    hs_gen_req    g;
    int        fd;
    int        phase;          /* 0 role chunk, 1 content, 2 done */
    int        sent_pieces;
    int        sent_lps;
    char      *buf;
    size_t     len, off, cap;
    int64_t    last_send;
} stream;

static bool st_append(stream *st, const char *s, size_t n) {
    if (st->len + n > st->cap) {
        size_t nc = HR_MAX(st->len + n, 2 * st->cap + 1024);
        char *b = realloc(st->buf, nc);
        if (!b) return false;
        st->buf = b;
        st->cap = nc;
    }
    memcpy(st->buf + st->len, s, n);
    st->len += n;
    return true;
}

/* "data: JSON\n\n"; takes j */
static bool st_event(stream *st, json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) return false;
    bool ok = st_append(st, "data: ", 6) && st_append(st, s, strlen(s)) && st_append(st, "\n\n", 2);
    free(s);
    return ok;
}

static json_t *chunk_json(stream *st, json_t *delta_or_text, json_t *finish, json_t *lp) {
    const hs_gen_req *g = &st->g;
    json_t *o = base_obj(st->S, g, g->chat ? "chat.completion.chunk" : "text_completion");
    json_t *choice = g->chat ? json_pack("{s:o,s:i,s:o}", "finish_reason", finish, "index", 0, "delta", delta_or_text)
                             : json_pack("{s:o,s:i,s:o,s:o}", "text", delta_or_text, "index", 0, "logprobs",
                                         lp ? json_incref(lp) : json_null(), "finish_reason", finish);
    if (g->chat && lp) json_object_set(choice, "logprobs", lp);
    json_decref(lp);
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    return o;
}

/* What the request has produced since the last call, as events (mu held). */
static void st_produce(stream *st) {
    hs_req *r = st->r;
    const hs_gen_req *g = &st->g;
    if (st->phase == 0) {
        st->phase = 1;
        if (g->chat)
            st_event(st, chunk_json(st, json_pack("{s:s,s:n}", "role", "assistant", "content"), json_null(), NULL));
    }
    for (; st->sent_pieces < r->n_pieces; st->sent_pieces++) {
        const hs_piece *pc = &r->pieces[st->sent_pieces];
        size_t a = st->sent_pieces ? r->pieces[st->sent_pieces - 1].end : 0;
        json_t *text = json_stringn(r->text + a, pc->end - a);
        json_t *lp = r->n_probs >= 0 ? logprobs_json(st->S->mi.voc, r->lps, st->sent_lps, pc->lp_end) : NULL;
        st->sent_lps = pc->lp_end;
        st_event(st, chunk_json(st, g->chat ? json_pack("{s:o}", "content", text) : text, json_null(), lp));
    }
    if (r->finish == HS_RUNNING || st->phase == 2) return;
    st->phase = 2;
    if (r->finish == HS_FAILED) {
        st_event(st, error_obj(500, "server_error", r->err));
    } else if (r->finish == HS_STOP || r->finish == HS_LENGTH) {
        json_t *fin = json_string(finish_name(r->finish));
        json_t *o = chunk_json(st, g->chat ? json_object() : json_string(""), fin, NULL);
        json_object_set_new(o, "timings", timings_json(r));
        if (r->warning[0]) json_object_set_new(o, "warning", json_string(r->warning));
        st_event(st, o);
        if (g->include_usage) {
            json_t *u = base_obj(st->S, g, g->chat ? "chat.completion.chunk" : "text_completion");
            json_object_set_new(u, "choices", json_array());
            json_object_set_new(u, "usage", usage_json(r));
            json_object_set_new(u, "timings", timings_json(r));
            st_event(st, u);
        }
    }
    st_append(st, "data: [DONE]\n\n", 14);
}

static ssize_t st_read(void *cls, uint64_t pos, char *out, size_t max) {
    stream *st = cls;
    hs_sched *sc = server_sched(st->S);
    for (;;) {
        if (st->off < st->len) {
            size_t n = HR_MIN(max, st->len - st->off);
            memcpy(out, st->buf + st->off, n);
            st->off += n;
            st->last_send = hr_time_ns();
            return (ssize_t)n;
        }
        st->len = st->off = 0;
        if (st->phase == 2) return MHD_CONTENT_READER_END_OF_STREAM;
        hs_sched_lock(sc);
        st_produce(st);
        if (st->len == 0) hs_sched_wait(sc, st->r, 100 * 1000000);
        hs_sched_unlock(sc);
        if (st->len) continue;
        if (client_gone(st->fd) || server_stopping(st->S)) return MHD_CONTENT_READER_END_WITH_ERROR;
        /* a comment keeps proxies and clients from timing out while a prompt waits or is read */
        if ((double)(hr_time_ns() - st->last_send) * 1e-9 >= st->S->p.ping_s) st_append(st, ": ping\n\n", 8);
    }
}

static void st_free(void *cls) {
    stream *st = cls;
    hs_sched *sc = server_sched(st->S);
    hs_sched_lock(sc);
    bool running = st->r->finish == HS_RUNNING;
    hs_sched_unlock(sc);
    if (running) hs_sched_cancel(sc, st->r);
    hs_req_release(sc, st->r);
    free(st->buf);
    free(st);
}

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

static enum MHD_Result handle_gen(hs_server *S, struct MHD_Connection *c, hs_conn *hc, bool chat) {
    hs_sched *sc = server_sched(S);
    hs_req *r = hs_req_new();
    if (!r) return reply_error(c, 500, "server_error", "out of memory");
    hs_gen_req g = {.chat = chat, .created = (json_int_t)time(NULL)};
    uint64_t seq = __atomic_add_fetch(&S->id_seq, 1, __ATOMIC_RELAXED);
    snprintf(g.id, sizeof g.id, "%s-%016llx%08llx", chat ? "chatcmpl" : "cmpl", (unsigned long long)hr_time_ns(),
             (unsigned long long)seq);
    char why[512] = "";
    int rc = hs_read_gen(&S->mi, hc->body, hc->len, r, &g, why, sizeof why);
    enum MHD_Result res;
    int32_t n_ctx = hs_sched_n_ctx(sc);
    if (rc) { res = BAD(c, "%s", why); goto done; }
    if (r->n_prompt >= n_ctx) {
        res = reply_error(c, MHD_HTTP_BAD_REQUEST, "exceed_context_size_error",
                          "the request exceeds the available context size: %d prompt tokens, %d per slot (-c is "
                          "divided among the --parallel slots)", r->n_prompt, n_ctx);
        goto done;
    }
    if (hs_sched_submit(sc, r)) {
        res = reply_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "unavailable_error",
                          "the server is busy: every slot is taken and the queue is full; retry later");
        goto done;
    }
    if (g.stream) {
        stream *st = calloc(1, sizeof *st);
        if (!st) { hs_sched_cancel(sc, r); res = reply_error(c, 500, "server_error", "out of memory"); goto done; }
        *st = (stream){.S = S, .r = r, .g = g, .fd = conn_fd(c), .last_send = hr_time_ns()};
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, st_read, st, st_free);
        if (!resp) { st_free(st); return MHD_NO; }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", "*");
        res = MHD_queue_response(c, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);
        return res;  /* the stream owns r now */
    }
    /* not streaming: wait for the whole answer, watching the client */
    int fd = conn_fd(c);
    hs_sched_lock(sc);
    while (r->finish == HS_RUNNING) {
        hs_sched_wait(sc, r, 100 * 1000000);
        if (r->finish != HS_RUNNING) break;
        hs_sched_unlock(sc);
        bool gone = client_gone(fd) || server_stopping(S);
        if (gone) {
            hs_sched_cancel(sc, r);
            hs_req_release(sc, r);
            return MHD_NO;
        }
        hs_sched_lock(sc);
    }
    json_t *o = r->finish == HS_FAILED ? error_obj(500, "server_error", r->err)
              : r->finish == HS_CANCELLED ? error_obj(503, "unavailable_error", "the server is stopping")
                                          : final_json(S, &g, r);
    unsigned status = r->finish == HS_FAILED ? 500 : r->finish == HS_CANCELLED ? 503 : 200;
    hs_sched_unlock(sc);
    res = reply_json(c, status, o);
done:
    hs_req_release(sc, r);
    return res;
}

/* ---- the other endpoints -------------------------------------------------------------------------- */
/* /tokenize and /detokenize (request.c reads them) */
static enum MHD_Result reply_text_op(struct MHD_Connection *c, json_t *o, unsigned status, const char *why) {
    if (o) return reply_json(c, status, o);
    if (status == MHD_HTTP_BAD_REQUEST) return BAD(c, "%s", why);
    return reply_error(c, status, "server_error", "%s", why);
}

static enum MHD_Result handle_tokenize(hs_server *S, struct MHD_Connection *c, hs_conn *hc) {
    char why[256];
    unsigned status;
    json_t *o = hs_tokenize_reply(&S->mi, hc->body, hc->len, &status, why, sizeof why);
    return reply_text_op(c, o, status, why);
}

static enum MHD_Result handle_detokenize(hs_server *S, struct MHD_Connection *c, hs_conn *hc) {
    char why[256];
    unsigned status;
    json_t *o = hs_detokenize_reply(&S->mi, hc->body, hc->len, &status, why, sizeof why);
    return reply_text_op(c, o, status, why);
}

static enum MHD_Result handle_models(hs_server *S, struct MHD_Connection *c) {
    hs_sched *sc = server_sched(S);
    json_t *m = json_pack("{s:s,s:s,s:I,s:s,s:{s:i,s:i,s:i}}", "id", S->model_id, "object", "model", "created",
                          (json_int_t)time(NULL), "owned_by", "hearth", "meta", "n_vocab", ht_vocab_size(S->mi.voc),
                          "n_ctx_slot", hs_sched_n_ctx(sc), "n_slots", hs_sched_n_slots(sc));
    return reply_json(c, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", m));
}

static enum MHD_Result handle_slots(hs_server *S, struct MHD_Connection *c) {
    hs_sched *sc = server_sched(S);
    hs_slot_view v[256];
    int n = hs_sched_slots(sc, v, 256);
    json_t *arr = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(arr, json_pack("{s:i,s:I,s:i,s:b,s:i,s:i,s:{s:i}}", "id", v[i].id, "id_task",
                                             (json_int_t)v[i].id_task, "n_ctx", hs_sched_n_ctx(sc), "is_processing",
                                             v[i].busy, "n_prompt_tokens", v[i].n_prompt, "n_cache_tokens",
                                             v[i].n_cache, "next_token", "n_decoded", v[i].n_decoded));
    return reply_json(c, 200, arr);
}

typedef struct sbuf { char *s; size_t len, cap; bool oom; } sbuf;
static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    for (int tries = 0; tries < 2 && !b->oom; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) { b->oom = true; return; }
        if (b->s && b->len + (size_t)n < b->cap) { b->len += (size_t)n; return; }
        size_t nc = HR_MAX(2 * b->cap, b->len + (size_t)n + 4096);
        char *q = realloc(b->s, nc);
        if (!q) { b->oom = true; return; }
        b->s = q;
        b->cap = nc;
    }
}

static void metric(sbuf *b, const char *name, const char *type, const char *help, double v) {
    sb_printf(b, "# HELP hearth:%s %s\n# TYPE hearth:%s %s\nhearth:%s %.9g\n", name, help, name, type, name, v);
}

static void histogram(sbuf *b, const char *name, const char *help, const hs_hist *h) {
    sb_printf(b, "# HELP hearth:%s %s\n# TYPE hearth:%s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i <= h->n_bounds; i++) {
        cum += h->counts[i];
        if (i < h->n_bounds)
            sb_printf(b, "hearth:%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
        else sb_printf(b, "hearth:%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    }
    sb_printf(b, "hearth:%s_sum %.9g\nhearth:%s_count %llu\n", name, h->sum, name, (unsigned long long)h->n);
}

/* a counter per cluster device, labelled with its name ("head" or HOST:PORT, escaped as Prometheus
   label values are) */
static void link_counter(sbuf *b, const char *name, const char *help, const hs_metrics *m, int which) {
    sb_printf(b, "# HELP hearth:%s %s\n# TYPE hearth:%s counter\n", name, help, name);
    for (int d = 0; d < m->n_links; d++) {
        char lab[2 * sizeof m->links[d].name];
        size_t k = 0;
        for (const char *p = m->links[d].name; *p && k + 2 < sizeof lab; p++) {
            if (*p == '\\' || *p == '"' || *p == '\n') lab[k++] = '\\';
            lab[k++] = *p == '\n' ? 'n' : *p;
        }
        lab[k] = 0;
        const hs_link *l = &m->links[d];
        uint64_t v = which == 0 ? l->sent : which == 1 ? l->received : which == 2 ? l->dg_lost : l->elems_lost;
        sb_printf(b, "hearth:%s{device=\"%s\"} %llu\n", name, lab, (unsigned long long)v);
    }
}

static enum MHD_Result handle_metrics(hs_server *S, struct MHD_Connection *c) {
    hs_metrics m;
    int proc, def;
    hs_sched_metrics(server_sched(S), &m, &proc, &def);
    sbuf b = {0};
    metric(&b, "prompt_tokens_total", "counter", "Number of prompt tokens processed.", (double)m.prompt_tokens);
    metric(&b, "prompt_seconds_total", "counter", "Prompt process time", m.prompt_s);
    metric(&b, "tokens_predicted_total", "counter", "Number of generation tokens processed.",
           (double)m.predicted_tokens);
    metric(&b, "tokens_predicted_seconds_total", "counter", "Predict process time", m.predicted_s);
    metric(&b, "n_decode_total", "counter", "Total number of engine steps (batches).", (double)m.n_decode);
    metric(&b, "n_busy_slots_per_decode", "gauge", "Average number of busy slots per engine step.",
           m.n_decode ? (double)m.busy_slots_sum / (double)m.n_decode : 0.0);
    metric(&b, "prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.",
           m.prompt_s > 0 ? (double)m.prompt_tokens / m.prompt_s : 0.0);
    metric(&b, "predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
           m.predicted_s > 0 ? (double)m.predicted_tokens / m.predicted_s : 0.0);
    metric(&b, "requests_processing", "gauge", "Number of requests processing.", proc);
    metric(&b, "requests_deferred", "gauge", "Number of requests deferred.", def);
    histogram(&b, "time_to_first_token_seconds", "Time from a request's arrival to its first token.", &m.ttft);
    histogram(&b, "inter_token_latency_seconds", "Time between a request's consecutive tokens.", &m.itl);
    histogram(&b, "queue_time_seconds", "Time a request waited for a slot.", &m.queue);
    if (m.n_links) {
        link_counter(&b, "cluster_bytes_sent_total", "Bytes a cluster device sent on its cluster connections.", &m,
                     0);
        link_counter(&b, "cluster_bytes_received_total",
                     "Bytes a cluster device received on its cluster connections.", &m, 1);
        link_counter(&b, "cluster_lossy_datagrams_lost_total",
                     "Partial-sum datagrams of a worker missing when the head merged them (--lossy).", &m, 2);
        link_counter(&b, "cluster_lossy_elements_lost_total",
                     "Elements of all-reduces merged as zero (--lossy; the head's row: all of them).", &m, 3);
    }
    enum MHD_Result rc = b.oom ? reply_error(c, 500, "server_error", "out of memory")
                               : reply(c, 200, "text/plain; version=0.0.4", b.s, b.len);
    free(b.s);
    return rc;
}

/* ---- dispatch ------------------------------------------------------------------------------------- */
static bool authorized(hs_server *S, struct MHD_Connection *c) {
    return hs_bearer_ok(S->p.api_key, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"));
}

static enum MHD_Result route(hs_server *S, struct MHD_Connection *c, const char *url, const char *method, hs_conn *hc) {
    int ep = hs_route_of(method, url);
    if (ep == HS_EP_OPTIONS) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
        enum MHD_Result rc = MHD_queue_response(c, MHD_HTTP_NO_CONTENT, r);
        MHD_destroy_response(r);
        return rc;
    }
    if (ep == HS_EP_INDEX) return reply(c, 200, "text/html; charset=utf-8", hs_web_index, hs_web_index_len);
    bool ready = server_sched(S) != NULL;
    if (ep == HS_EP_HEALTH) {
        if (!ready) return reply_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "unavailable_error", "Loading model");
        return reply_json(c, 200, json_pack("{s:s}", "status", "ok"));
    }
    if (!authorized(S, c)) return reply_error(c, MHD_HTTP_UNAUTHORIZED, "authentication_error", "Invalid API Key");
    if (ep == HS_EP_NOT_FOUND) return reply_error(c, MHD_HTTP_NOT_FOUND, "not_found_error", "File Not Found");
    if (!ready) return reply_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "unavailable_error", "Loading model");
    if (hc->too_big)
        return reply_error(c, 413, "invalid_request_error", "the request body is over %zu bytes",
                           S->p.max_body);
    switch (ep) {
    case HS_EP_MODELS: return handle_models(S, c);
    case HS_EP_SLOTS: return handle_slots(S, c);
    case HS_EP_METRICS: return handle_metrics(S, c);
    case HS_EP_TOKENIZE: return handle_tokenize(S, c, hc);
    case HS_EP_DETOKENIZE: return handle_detokenize(S, c, hc);
    default: return handle_gen(S, c, hc, ep == HS_EP_CHAT);
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *data, size_t *data_size, void **con_cls) {
    hs_server *S = cls;
    hs_conn *hc = *con_cls;
    if (!hc) {
        if (!(hc = calloc(1, sizeof *hc))) return MHD_NO;
        *con_cls = hc;
        /* a body announced too big is refused before it is read */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > S->p.max_body) {
            hc->replied = true;
            return reply_error(c, 413, "invalid_request_error",
                               "the request body is over %zu bytes", S->p.max_body);
        }
        return MHD_YES;
    }
    if (*data_size) {
        if (!hc->replied && !hc->too_big) {
            if (hc->len + *data_size > S->p.max_body) {
                hc->too_big = true;
                free(hc->body);
                hc->body = NULL;
                hc->len = 0;
            } else {
                if (hc->len + *data_size + 1 > hc->cap) {
                    size_t nc = HR_MIN(HR_MAX(2 * hc->cap, hc->len + *data_size + 1), S->p.max_body + 1);
                    char *b = realloc(hc->body, nc);
                    if (!b) return MHD_NO;
                    hc->body = b;
                    hc->cap = nc;
                }
                memcpy(hc->body + hc->len, data, *data_size);
                hc->len += *data_size;
            }
        }
        *data_size = 0;
        return MHD_YES;
    }
    if (hc->replied) return MHD_YES;
    return route(S, c, url, method, hc);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    hs_conn *hc = *con_cls;
    if (!hc) return;
    free(hc->body);
    free(hc);
    *con_cls = NULL;
}

static void on_log(void *cls, const char *fmt, va_list ap) {
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = 0;
    HR_LOGD("hearth serve: http: %s", msg);
}

hs_server *hs_server_create(const hs_server_params *p, hr_err *err) {
    hs_server *S = calloc(1, sizeof *S);
    if (!S) { hr_fail(err, HR_ENOMEM, "out of memory"); return NULL; }
    S->p = *p;
    snprintf(S->model_id, sizeof S->model_id, "%s", p->model_id ? p->model_id : "model");
    struct sockaddr_storage ss = {0};
    socklen_t sl;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, p->host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)p->port);
        sl = sizeof *a4;
    } else if (inet_pton(AF_INET6, p->host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)p->port);
        sl = sizeof *a6;
        flags |= MHD_USE_IPv6;
    } else {
        free(S);
        hr_fail(err, HR_EINVAL, "'%s' is not an IPv4 or IPv6 address", p->host);
        return NULL;
    }
    (void)sl;
    S->d = MHD_start_daemon(flags, (uint16_t)p->port, NULL, NULL, on_request, S, MHD_OPTION_SOCK_ADDR, &ss,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)p->max_conns, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)p->conn_timeout, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, S, MHD_OPTION_EXTERNAL_LOGGER, on_log, S,
                            MHD_OPTION_END);
    if (!S->d) {
        free(S);
        hr_fail(err, HR_ENET, "cannot listen on %s:%d (in use, or not an address of this machine)", p->host, p->port);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(S->d, MHD_DAEMON_INFO_LISTEN_FD);
    struct sockaddr_storage got;
    socklen_t gl = sizeof got;
    S->port = p->port;
    if (di && getsockname(di->listen_fd, (struct sockaddr *)&got, &gl) == 0)
        S->port = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                                  : ((struct sockaddr_in *)&got)->sin_port);
    return S;
}

int hs_server_ready(hs_server *S, const hs_backend *b, const hs_model_info *mi, hr_err *err) {
    S->mi = *mi;
    hs_sched *sc = hs_sched_create(b, mi, S->p.n_slots, S->p.max_queue, err);
    if (!sc) return err->code;
    __atomic_store_n(&S->sched, sc, __ATOMIC_RELEASE);
    return 0;
}

void hs_server_free(hs_server *S) {
    if (!S) return;
    __atomic_store_n(&S->stopping, true, __ATOMIC_RELEASE);
    /* the connections' threads end first (they see stopping), then the scheduler they wait on */
    if (S->d) MHD_stop_daemon(S->d);
    hs_sched_free(S->sched);
    free(S);
}
