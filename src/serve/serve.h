/*
 * serve — `hearth serve`'s library: an OpenAI-compatible HTTP server (libmicrohttpd, JSON with
 * jansson) over a scheduler of N slots with continuous batching.  Prefix: hs_.
 *
 * The shape (docs/serve.md): HTTP threads parse requests, tokenize them and queue them; one scheduler
 * thread runs the engine: every step is one batch holding each running slot's next token and chunks
 * of waiting prompts, and each slot's results (text pieces, its finish) go back to the connection's
 * thread, which writes them (Server-Sent Events when streaming). The engine is behind hs_backend, a
 * batch of several sequences: one device's context, or the head of a cluster (tensor parallel or a
 * pipeline, every device's KV cache holding the slots' sequences).
 *
 * Library code: no exit, nothing on stdout, no command-line text; hs_server_params holds numbers.
 */
#ifndef HEARTH_SERVE_H
#define HEARTH_SERVE_H

#include "base/base.h"
#include "model/model.h"
#include "text/text.h"

/* ---- backend: what the scheduler needs of an engine --------------------------------------------- */
/* eval runs one batch of several sequences (hm_batch with seq, pos_of and out set; logits: one row of
   n_vocab per token marked in out, in batch order). seq_copy copies positions [0, n) of sequence src
   into dst, or is NULL when the engine cannot (then a prefix is reused only within its own slot).
   links, NULL on one device: the bytes each device of a cluster sent and received on its cluster
   connections since the previous call (the head first), into out[0..cap); returns how many devices, or
   a negative code. It asks every worker (a round trip each), so the scheduler calls it on its own
   thread between steps, at most once a second and when it goes idle. */
#define HS_MAX_LINKS 64
typedef struct hs_link {
    char     name[80];        /* "head" or the worker's address */
    uint64_t sent, received;
    /* the lossy all-reduce (--lossy), over the session: the device's partial datagrams lost (missing at
       the merge), and the elements merged as zero (the head: all of them) */
    uint64_t dg_lost, elems_lost;
} hs_link;

typedef struct hs_backend {
    void   *user;
    int32_t n_seq;    /* sequences (the scheduler runs min(slots, n_seq) slots) */
    int32_t n_ctx;    /* positions per sequence */
    int32_t n_batch;  /* most tokens per eval */
    int32_t n_vocab;
    int   (*eval)(void *user, const hm_batch *b, hr_err *err);
    int   (*seq_copy)(void *user, int32_t src, int32_t dst, int32_t n, hr_err *err);
    int   (*links)(void *user, hs_link *out, int cap, hr_err *err);
    /* before a waiting request is admitted: a cluster takes workers that left and came back in again
       (NULL: nothing to do) */
    int   (*rejoin)(void *user, hr_err *err);
    /* how many times a device left and the answers went on, and the last time in words (NULL: never) */
    int   (*events)(void *user, const char **warning);
    void  (*free)(void *user);
    const char *kind; /* "one context of N sequences", ... (for the log and /slots) */
} hs_backend;

/* One device: a context of one or more sequences (borrowed): one hm_eval per step, hm_kv_seq_copy for
   shared prefixes. */
int hs_backend_local(hs_backend *b, hm_ctx *c, int32_t n_vocab, hr_err *err);

/* The head of a cluster (borrowed), created with n_seq sequences: one hc_head_eval_batch per step (a
   pipeline may cut it into micro-batches, hc_head_params.pp_micro), hc_head_kv_seq_copy on every device,
   and the devices' link bytes from hc_head_stats. */
struct hc_head;
int hs_backend_head(hs_backend *b, struct hc_head *h, int32_t n_vocab, hr_err *err);

/* ---- the server --------------------------------------------------------------------------------- */
typedef struct hs_server_params {
    const char *host;          /* address to bind ("127.0.0.1") */
    int         port;          /* 0: any free port (hs_server_port says which) */
    int         n_slots;       /* parallel requests (default 4) */
    int         max_queue;     /* requests waiting for a slot beyond which 503 (default 64) */
    int         max_conns;     /* open connections (default 128) */
    size_t      max_body;      /* request body bytes (default 8 MiB) */
    int         conn_timeout;  /* seconds of silence before a connection is dropped (default 60) */
    double      ping_s;        /* SSE comment after this much silence (default 5) */
    const char *api_key;       /* NULL: no authentication */
    const char *model_id;      /* the name /v1/models shows */
} hs_server_params;
hs_server_params hs_server_default_params(void);

/* What the scheduler needs beside the backend: the vocabulary (borrowed), the chat template family
   (ht_chat_tmpl), whether prompts get BOS. */
typedef struct hs_model_info {
    const ht_vocab *voc;
    int             chat_tmpl;
    bool            add_bos;
} hs_model_info;

typedef struct hs_server hs_server;
/* Binds and starts answering (/health says 503 until hs_server_ready). */
hs_server *hs_server_create(const hs_server_params *p, hr_err *err);
int        hs_server_port(const hs_server *s);
/* The model is loaded: starts the scheduler over backend b (taken: freed with the server). */
int        hs_server_ready(hs_server *s, const hs_backend *b, const hs_model_info *mi, hr_err *err);
/* Stops answering, cancels what runs, frees everything. */
void       hs_server_free(hs_server *s);

/* The web page (generated at build time from src/serve/web/index.html). */
extern const char hs_web_index[];
extern const size_t hs_web_index_len;

#endif
