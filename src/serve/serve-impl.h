/* serve: what the scheduler (sched.c) and the HTTP side (http.c) share. One mutex (hs_sched.mu) guards the
   queue, the slots' public figures and every request's results; the scheduler thread alone touches a
   slot's engine state (cache, sampler, detokenizer). */
#ifndef HEARTH_SERVE_IMPL_H
#define HEARTH_SERVE_IMPL_H

#include "serve.h"

#include <jansson.h>
#include <pthread.h>

#define HS_MAX_STOPS 16
#define HS_MAX_TOP   20   /* top_logprobs */

enum hs_finish { HS_RUNNING = 0, HS_STOP = 1, HS_LENGTH = 2, HS_FAILED = 3, HS_CANCELLED = 4 };

/* one generated token's log-probability and its alternatives (logprobs requested) */
typedef struct hs_lp {
    int32_t id;
    float   lp;
    int     n_top;
    int32_t top_id[HS_MAX_TOP];
    float   top_lp[HS_MAX_TOP];
} hs_lp;

/* a piece of visible text (what one SSE chunk carries): text[start..end), tokens lp[lp0..lp1) */
typedef struct hs_piece { size_t end; int lp_end; } hs_piece;

typedef struct hs_req {
    /* set before hs_sched_submit, read-only after */
    int32_t *prompt;
    int      n_prompt;
    int32_t  n_predict;        /* -1: until the context is full */
    ht_sampler_params sp;
    char    *stops[HS_MAX_STOPS + 1];
    int      n_stops;
    int      n_probs;          /* -1: no logprobs; else alternatives per token */
    bool     ignore_eos;
    /* results, under the scheduler's mu */
    pthread_cond_t cv;         /* signalled when results change */
    char    *text;             /* visible text so far */
    size_t   text_len, text_cap;
    hs_piece *pieces;
    int      n_pieces, pieces_cap;
    hs_lp   *lps;
    int      n_lps, lps_cap;
    int      finish;           /* enum hs_finish */
    char     err[256];
    char     warning[256];     /* a device left while it ran (the answer went on): the reply says so */
    int      n_decoded, n_cached, slot;
    int64_t  t_queued, t_start, t_first, t_end;  /* ns */
    bool     cancelled;        /* the client went away: drop it at the next step */
    int      refs;             /* the connection and (while queued or running) the scheduler */
    int64_t  id_task;
} hs_req;

typedef struct hs_hist {
    int    n_bounds;
    double bounds[16];
    uint64_t counts[17];       /* per bucket (not cumulative); last: +Inf */
    double sum;
    uint64_t n;
} hs_hist;

typedef struct hs_metrics {
    uint64_t prompt_tokens, predicted_tokens, n_decode, busy_slots_sum, requests_done;
    double   prompt_s, predicted_s;
    hs_hist  ttft, itl, queue;
    int      n_links;          /* a cluster's devices (0 on one device) */
    hs_link  links[HS_MAX_LINKS]; /* bytes per device since the start, as of the last refresh */
} hs_metrics;

typedef struct hs_slot_view {   /* what /slots shows */
    int     id;
    bool    busy;
    int64_t id_task;
    int     n_prompt, n_decoded, n_cache;
} hs_slot_view;

typedef struct hs_sched hs_sched;
/* Starts the scheduler thread over b (taken). */
hs_sched *hs_sched_create(const hs_backend *b, const hs_model_info *mi, int n_slots, int max_queue, hr_err *err);
void      hs_sched_free(hs_sched *s);
int32_t   hs_sched_n_ctx(const hs_sched *s);   /* per slot */
int       hs_sched_n_slots(const hs_sched *s);
/* A new request (refs = 1, the caller's); free with hs_req_release. */
hs_req   *hs_req_new(void);
/* Queues r: 0, or HR_ERANGE when the queue is full. */
int       hs_sched_submit(hs_sched *s, hs_req *r);
/* The connection is gone: the request stops at the next step. */
void      hs_sched_cancel(hs_sched *s, hs_req *r);
/* Waits for r's results to change or for timeout_ns; true if they did (returns with mu held either way:
   call hs_sched_unlock). */
void      hs_sched_lock(hs_sched *s);
void      hs_sched_unlock(hs_sched *s);
bool      hs_sched_wait(hs_sched *s, hs_req *r, int64_t timeout_ns);  /* mu held */
void      hs_req_release(hs_sched *s, hs_req *r);
/* Copies (under mu): the slots, the metrics, queue and processing counts. */
int       hs_sched_slots(hs_sched *s, hs_slot_view *out, int cap);
void      hs_sched_metrics(hs_sched *s, hs_metrics *m, int *processing, int *deferred);

/* ---- reading requests (request.c): pure functions of what the client sent, fuzzed by tests/fuzz-serve.c */
typedef struct hs_gen_req {    /* a generation request's reply shape */
    bool chat, stream, include_usage;
    char id[64];
    json_int_t created;
} hs_gen_req;

/* What a request line asks for (the endpoints of docs/serve.md); any method OPTIONS is HS_EP_OPTIONS. */
enum hs_endpoint {
    HS_EP_NOT_FOUND, HS_EP_OPTIONS, HS_EP_INDEX, HS_EP_HEALTH, HS_EP_MODELS, HS_EP_SLOTS, HS_EP_METRICS,
    HS_EP_CHAT, HS_EP_COMPLETIONS, HS_EP_TOKENIZE, HS_EP_DETOKENIZE,
};
int  hs_route_of(const char *method, const char *url);
/* The Authorization header (NULL: none) carries api_key as a bearer token (compared in constant time);
   true when api_key is NULL. */
bool hs_bearer_ok(const char *api_key, const char *authorization);
/* A /v1/chat/completions (g->chat) or /v1/completions body[0..len) into r (from hs_req_new) and g:
   0, or -1 with the reason a 400 gives in why. The prompt is tokenized; it is never empty. */
int  hs_read_gen(const hs_model_info *mi, const char *body, size_t len, hs_req *r, hs_gen_req *g, char *why,
                 size_t cap);
/* /tokenize and /detokenize: the reply for body[0..len) (*status 200), or NULL with *status 400 or 500
   and the message in why. */
json_t *hs_tokenize_reply(const hs_model_info *mi, const char *body, size_t len, unsigned *status, char *why,
                          size_t cap);
json_t *hs_detokenize_reply(const hs_model_info *mi, const char *body, size_t len, unsigned *status, char *why,
                            size_t cap);
/* {id, token, bytes[, logprob]}: a token's bytes as JSON (invalid UTF-8 becomes U+FFFD) */
json_t *hs_token_json(const ht_vocab *v, int32_t id, float lp, bool with_lp);

void      hs_hist_init(hs_hist *h, const double *bounds, int n);
void      hs_hist_add(hs_hist *h, double v);

#endif
