/* serve/sched: N slots over one engine, continuous batching.

   One thread runs the loop. Each step: requests that wait get free slots (the slot whose cached tokens
   share the longest prefix with the prompt, so a repeated system prompt is not computed again); then
   one batch holds every generating slot's next token and, in the budget left (n_batch tokens), chunks
   of the prompts being read, shortest remainder first. A prompt longer than the budget is read over
   several steps, so it delays the others by at most one chunk per token, and a short prompt that
   arrives meanwhile is read at the next step. The batch's logits (one row per slot that
   needs a token) are sampled per slot, the text checked for stop strings, and the results published
   to the connection's thread. A cancelled request is dropped at the next step, queued or running. */
#include "serve-impl.h"

#include "text/chat.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct hs_slot {
    int      id;              /* = its sequence */
    hs_req  *req;             /* NULL: free */
    int32_t *cache;           /* [n_ctx] the tokens whose KV the sequence holds */
    int32_t  n_cache;
    bool     generating;      /* prompt read: next is last_tok at n_cache */
    int32_t  last_tok;
    ht_sampler *smp;
    ht_detok dt;
    char    *raw;             /* everything generated (stop strings are found across tokens) */
    size_t   raw_len, raw_cap, safe, shown;
    int64_t  t_tok;           /* time of the last token (inter-token latency) */
    int64_t  order;           /* when its request started (ties between prompts go to the oldest) */
} hs_slot;

struct hs_sched {
    hs_backend      be;
    hs_model_info   mi;
    int             n_slots, max_queue;
    hs_slot        *slots;
    pthread_mutex_t mu;
    pthread_cond_t  work;     /* the scheduler waits here for requests */
    hs_req        **queue;    /* FIFO of waiting requests */
    int             n_queue;
    bool            stop;
    pthread_t       thread;
    bool            started;
    hs_metrics      met;
    int64_t         next_task;
    /* batch buffers (scheduler thread) */
    int32_t        *b_tok, *b_seq, *b_pos;
    uint8_t        *b_out;
    int            *b_slot;   /* per out row: its slot */
    float          *logits;   /* [n_slots][n_vocab] */
    float          *lp_buf;   /* [n_vocab] logits before sampling (logprobs) */
    char           *piece;
    int             piece_cap;
    /* the cluster's link bytes (scheduler thread; the sums in met under mu) */
    hs_link        *link_buf;  /* [HS_MAX_LINKS] */
    int64_t         t_links;   /* last refresh */
    bool            links_due; /* steps ran since it */
    int             n_events;  /* be.events' count when last looked at */
};

/* ---- histograms ----------------------------------------------------------------------------------- */
void hs_hist_init(hs_hist *h, const double *bounds, int n) {
    memset(h, 0, sizeof *h);
    h->n_bounds = HR_MIN(n, 16);
    memcpy(h->bounds, bounds, (size_t)h->n_bounds * sizeof *bounds);
}

void hs_hist_add(hs_hist *h, double v) {
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->n++;
}

/* ---- requests ------------------------------------------------------------------------------------- */
hs_req *hs_req_new(void) {
    hs_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_cond_init(&r->cv, NULL);
    r->refs = 1;
    r->n_predict = -1;
    r->n_probs = -1;
    r->slot = -1;
    r->sp = ht_sampler_default_params();
    return r;
}

static void req_free(hs_req *r) {
    pthread_cond_destroy(&r->cv);
    free(r->prompt);
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    free(r->text);
    free(r->pieces);
    free(r->lps);
    free(r);
}

/* mu held */
static void req_unref(hs_req *r) {
    if (--r->refs == 0) req_free(r);
}

void hs_req_release(hs_sched *s, hs_req *r) {
    if (!s) { req_free(r); return; }
    pthread_mutex_lock(&s->mu);
    req_unref(r);
    pthread_mutex_unlock(&s->mu);
}

void hs_sched_lock(hs_sched *s) { pthread_mutex_lock(&s->mu); }
void hs_sched_unlock(hs_sched *s) { pthread_mutex_unlock(&s->mu); }

bool hs_sched_wait(hs_sched *s, hs_req *r, int64_t timeout_ns) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t ns = ts.tv_nsec + timeout_ns;
    ts.tv_sec += ns / 1000000000;
    ts.tv_nsec = ns % 1000000000;
    return pthread_cond_timedwait(&r->cv, &s->mu, &ts) == 0;
}

int hs_sched_submit(hs_sched *s, hs_req *r) {
    pthread_mutex_lock(&s->mu);
    /* queued requests beyond the free slots wait; more than max_queue of those is too many */
    int free_slots = 0;
    for (int i = 0; i < s->n_slots; i++) free_slots += s->slots[i].req == NULL;
    if (s->n_queue >= s->max_queue + free_slots) { pthread_mutex_unlock(&s->mu); return HR_ERANGE; }
    r->refs++;
    r->t_queued = hr_time_ns();
    r->id_task = s->next_task++;
    s->queue[s->n_queue++] = r;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void hs_sched_cancel(hs_sched *s, hs_req *r) {
    pthread_mutex_lock(&s->mu);
    r->cancelled = true;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
}

int32_t hs_sched_n_ctx(const hs_sched *s) { return s->be.n_ctx; }
int hs_sched_n_slots(const hs_sched *s) { return s->n_slots; }

int hs_sched_slots(hs_sched *s, hs_slot_view *out, int cap) {
    pthread_mutex_lock(&s->mu);
    int n = HR_MIN(cap, s->n_slots);
    for (int i = 0; i < n; i++) {
        const hs_slot *sl = &s->slots[i];
        out[i] = (hs_slot_view){.id = i, .busy = sl->req != NULL, .id_task = sl->req ? sl->req->id_task : -1,
                                .n_prompt = sl->req ? sl->req->n_prompt : 0,
                                .n_decoded = sl->req ? sl->req->n_decoded : 0, .n_cache = sl->n_cache};
    }
    pthread_mutex_unlock(&s->mu);
    return n;
}

void hs_sched_metrics(hs_sched *s, hs_metrics *m, int *processing, int *deferred) {
    pthread_mutex_lock(&s->mu);
    *m = s->met;
    *deferred = s->n_queue;
    *processing = 0;
    for (int i = 0; i < s->n_slots; i++) *processing += s->slots[i].req != NULL;
    pthread_mutex_unlock(&s->mu);
}

/* ---- results (mu held) ---------------------------------------------------------------------------- */
static bool grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return true;
    int nc = HR_MAX(need, *cap * 2 + 8);
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q) return false;
    *p = q;
    *cap = nc;
    return true;
}

static bool text_append(char **b, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t nc = HR_MAX(*len + n + 1, 2 * *cap + 256);
        char *q = realloc(*b, nc);
        if (!q) return false;
        *b = q;
        *cap = nc;
    }
    memcpy(*b + *len, s, n);
    *len += n;
    (*b)[*len] = 0;
    return true;
}

/* The slot's request is done: metrics, the slot free, the connection told; mu held. */
static void slot_finish(hs_sched *s, hs_slot *sl, int finish, const char *why) {
    hs_req *r = sl->req;
    int64_t now = hr_time_ns();
    r->finish = finish;
    if (why) snprintf(r->err, sizeof r->err, "%s", why);
    r->t_end = now;
    if (!r->t_first) r->t_first = now;
    s->met.prompt_tokens += (uint64_t)(r->n_prompt - r->n_cached);
    s->met.prompt_s += (double)(r->t_first - r->t_start) * 1e-9;
    s->met.predicted_tokens += (uint64_t)r->n_decoded;
    s->met.predicted_s += (double)(r->t_end - r->t_first) * 1e-9;
    s->met.requests_done++;
    pthread_cond_broadcast(&r->cv);
    req_unref(r);
    sl->req = NULL;
    sl->generating = false;
}

/* ---- slots ---------------------------------------------------------------------------------------- */
static int32_t common_prefix(const int32_t *a, int32_t na, const int32_t *b, int32_t nb) {
    int32_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

/* Gives r a free slot (mu held): the one whose cache shares the longest prefix with the prompt; with
   seq_copy, a longer prefix in another slot's cache is copied over. false if no slot is free. */
static bool slot_assign(hs_sched *s, hs_req *r, hr_err *err) {
    int best = -1;
    int32_t best_n = -1;
    for (int i = 0; i < s->n_slots; i++) {
        hs_slot *sl = &s->slots[i];
        if (sl->req) continue;
        int32_t n = common_prefix(sl->cache, sl->n_cache, r->prompt, r->n_prompt);
        if (n > best_n) { best = i; best_n = n; }
    }
    if (best < 0) return false;
    hs_slot *sl = &s->slots[best];
    /* one token at least is read again: its logits start the answer */
    int32_t keep = HR_MIN(best_n, r->n_prompt - 1);
    if (s->be.seq_copy) {
        int src = -1;
        int32_t src_n = keep;
        for (int i = 0; i < s->n_slots; i++) {
            if (i == best) continue;
            int32_t n = HR_MIN(common_prefix(s->slots[i].cache, s->slots[i].n_cache, r->prompt, r->n_prompt),
                               r->n_prompt - 1);
            if (n > src_n) { src = i; src_n = n; }
        }
        /* a busy slot's cache below its n_cache does not change while it runs: safe to copy */
        if (src >= 0 && s->be.seq_copy(s->be.user, src, best, src_n, err) == 0) {
            memcpy(sl->cache, r->prompt, (size_t)src_n * sizeof *sl->cache);
            keep = src_n;
        }
    }
    sl->n_cache = HR_MAX(keep, 0);
    sl->req = r;
    sl->generating = false;
    sl->raw_len = sl->safe = sl->shown = 0;
    ht_detok_init(&sl->dt, s->mi.voc);
    ht_sampler_free(sl->smp);
    sl->smp = ht_sampler_create(&r->sp, s->be.n_vocab);
    r->slot = best;
    r->n_cached = sl->n_cache;
    r->t_start = hr_time_ns();
    sl->order = r->t_start;
    hs_hist_add(&s->met.queue, (double)(r->t_start - r->t_queued) * 1e-9);
    if (!sl->smp) { slot_finish(s, sl, HS_FAILED, "out of memory"); return true; }
    for (int i = 0; i < r->n_prompt; i++) ht_sampler_accept(sl->smp, r->prompt[i]);
    return true;
}

/* Dequeues cancelled requests and gives waiting ones free slots; drops cancelled running ones. mu held. */
static void sched_admit(hs_sched *s) {
    for (int i = 0; i < s->n_slots; i++) {
        hs_slot *sl = &s->slots[i];
        if (sl->req && sl->req->cancelled) slot_finish(s, sl, HS_CANCELLED, "cancelled");
    }
    int w = 0;
    for (int i = 0; i < s->n_queue; i++) {
        hs_req *r = s->queue[i];
        hr_err err = {0};
        if (r->cancelled) {
            r->finish = HS_CANCELLED;
            pthread_cond_broadcast(&r->cv);
            req_unref(r);
        } else if (!slot_assign(s, r, &err)) {
            s->queue[w++] = r;
        }
    }
    s->n_queue = w;
}

/* log-probabilities of logits[0..n): the chosen token's and the top k */
static void logprobs(const float *x, int32_t n, int32_t tok, int k, hs_lp *out) {
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += exp((double)(x[i] - mx));
    float lse = mx + (float)log(sum);
    out->id = tok;
    out->lp = x[tok] - lse;
    out->n_top = 0;
    for (int32_t i = 0; i < n && k > 0; i++) {
        /* insertion into the sorted top k */
        int j = out->n_top;
        if (j == k && x[i] - lse <= out->top_lp[k - 1]) continue;
        if (j < k) out->n_top++;
        else j = k - 1;
        while (j > 0 && out->top_lp[j - 1] < x[i] - lse) {
            out->top_lp[j] = out->top_lp[j - 1];
            out->top_id[j] = out->top_id[j - 1];
            j--;
        }
        out->top_lp[j] = x[i] - lse;
        out->top_id[j] = i;
    }
}

/* One token sampled for slot sl from logits: its text, stop strings, limits. mu NOT held (publishes
   under it). */
static void slot_token(hs_sched *s, hs_slot *sl, float *logits) {
    hs_req *r = sl->req;
    hs_lp lp;
    bool want_lp = r->n_probs >= 0;
    int64_t now_pre = hr_time_ns();
    /* the distribution the model gave, before the sampler's penalties and truncations change it */
    if (want_lp) memcpy(s->lp_buf, logits, (size_t)s->be.n_vocab * sizeof(float));
    int32_t tok = ht_sampler_sample(sl->smp, logits);
    ht_sampler_accept(sl->smp, tok);
    if (want_lp) logprobs(s->lp_buf, s->be.n_vocab, tok, HR_MIN(r->n_probs, HS_MAX_TOP), &lp);
    int limit = r->n_predict < 0 ? s->be.n_ctx - r->n_prompt : HR_MIN(r->n_predict, s->be.n_ctx - r->n_prompt);
    bool eog = !r->ignore_eos && ht_is_eog(s->mi.voc, tok);
    int n_dec = r->n_decoded + 1;
    bool end = eog || n_dec >= limit;
    int nb = eog ? 0 : ht_detok_push(&sl->dt, tok, s->piece, s->piece_cap);
    bool ok = text_append(&sl->raw, &sl->raw_len, &sl->raw_cap, s->piece, (size_t)nb);
    if (end && !eog) ok = ok && text_append(&sl->raw, &sl->raw_len, &sl->raw_cap, s->piece,
                                            (size_t)ht_detok_flush(&sl->dt, s->piece, s->piece_cap));
    bool stopped = ok && ht_chat_stop_scan(sl->raw, sl->raw_len, sl->safe, (const char *const *)r->stops, r->n_stops,
                                           &sl->safe);
    if (!stopped && end) sl->safe = sl->raw_len;

    pthread_mutex_lock(&s->mu);
    int64_t now = hr_time_ns();
    if (!r->t_first) {
        r->t_first = now;
        hs_hist_add(&s->met.ttft, (double)(now - r->t_queued) * 1e-9);
    } else {
        hs_hist_add(&s->met.itl, (double)(now_pre - sl->t_tok) * 1e-9);
    }
    sl->t_tok = now;
    r->n_decoded = n_dec;
    if (want_lp && !eog && grow((void **)&r->lps, &r->lps_cap, r->n_lps + 1, sizeof *r->lps)) r->lps[r->n_lps++] = lp;
    if (ok && sl->safe > sl->shown) {
        ok = text_append(&r->text, &r->text_len, &r->text_cap, sl->raw + sl->shown, sl->safe - sl->shown) &&
             grow((void **)&r->pieces, &r->pieces_cap, r->n_pieces + 1, sizeof *r->pieces);
        if (ok) r->pieces[r->n_pieces++] = (hs_piece){r->text_len, r->n_lps};
        sl->shown = sl->safe;
    }
    if (!ok) slot_finish(s, sl, HS_FAILED, "out of memory");
    else if (stopped || eog) slot_finish(s, sl, HS_STOP, NULL);
    else if (end) slot_finish(s, sl, HS_LENGTH, NULL);
    else {
        pthread_cond_broadcast(&r->cv);
        sl->generating = true;
        sl->last_tok = tok;
    }
    pthread_mutex_unlock(&s->mu);
}

/* ---- cluster links -------------------------------------------------------------------------------- */
/* Adds the bytes the devices moved since the previous refresh to the metrics (scheduler thread, mu NOT
   held: the backend asks every worker, between steps so that nothing else is on the connections). A
   failure (the cluster is gone; the next step says so) stops the refreshes. */
static void sched_links(hs_sched *s) {
    hr_err err = {0};
    int k = s->be.links(s->be.user, s->link_buf, HS_MAX_LINKS, &err);
    s->t_links = hr_time_ns();
    s->links_due = false;
    if (k < 0) {
        HR_LOGW("hearth serve: the cluster's link bytes: %s (no more in /metrics)", err.msg);
        s->be.links = NULL;
        return;
    }
    pthread_mutex_lock(&s->mu);
    s->met.n_links = k;
    for (int d = 0; d < k; d++) {
        hs_link *l = &s->met.links[d];
        memcpy(l->name, s->link_buf[d].name, sizeof l->name);
        l->sent += s->link_buf[d].sent;
        l->received += s->link_buf[d].received;
        l->dg_lost = s->link_buf[d].dg_lost;       /* cumulative already */
        l->elems_lost = s->link_buf[d].elems_lost;
    }
    pthread_mutex_unlock(&s->mu);
}

/* ---- the loop ------------------------------------------------------------------------------------- */
/* Builds one step's batch from the slots (scheduler thread; mu not needed: only this thread changes a
   slot's engine fields, and the request pointers change under mu in this thread too). */
static int sched_batch(hs_sched *s, int *n_out) {
    int n = 0, budget = s->be.n_batch;
    *n_out = 0;
    for (int i = 0; i < s->n_slots && n < budget; i++) {
        hs_slot *sl = &s->slots[i];
        if (!sl->req || !sl->generating) continue;
        s->b_tok[n] = sl->last_tok;
        s->b_seq[n] = sl->id;
        s->b_pos[n] = sl->n_cache;
        s->b_out[n] = 1;
        s->b_slot[(*n_out)++] = i;
        n++;
    }
    /* prompts, the shortest remainder first: a short prompt is read at the next step whatever long one
       is being read (its first token waits one step, not the long prompt's), and a long one takes what
       the step has left, so it still advances every step */
    for (;;) {
        int pick = -1;
        int32_t pick_left = 0;
        for (int i = 0; i < s->n_slots; i++) {
            hs_slot *sl = &s->slots[i];
            if (!sl->req || sl->generating || sl->n_cache >= sl->req->n_prompt) continue;
            bool in = false;
            for (int k = 0; k < n; k++) in |= s->b_seq[k] == sl->id;
            int32_t left = sl->req->n_prompt - sl->n_cache;
            if (!in && (pick < 0 || left < pick_left || (left == pick_left && sl->order < s->slots[pick].order))) {
                pick = i;
                pick_left = left;
            }
        }
        if (pick < 0 || n >= budget) break;
        hs_slot *sl = &s->slots[pick];
        int take = HR_MIN(budget - n, pick_left);
        for (int k = 0; k < take; k++, n++) {
            s->b_tok[n] = sl->req->prompt[sl->n_cache + k];
            s->b_seq[n] = sl->id;
            s->b_pos[n] = sl->n_cache + k;
            s->b_out[n] = 0;
        }
        if (take == pick_left) {
            s->b_out[n - 1] = 1;
            s->b_slot[(*n_out)++] = pick;
        }
    }
    return n;
}

static void *sched_main(void *arg) {
    hs_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        if (s->be.rejoin && s->n_queue > 0) {
            /* a worker that left and is back computes from the next request on */
            hr_err err = {0};
            pthread_mutex_unlock(&s->mu);
            int rc = s->be.rejoin(s->be.user, &err);
            pthread_mutex_lock(&s->mu);
            if (rc) HR_LOGE("hearth serve: engine: %s", err.msg);
        }
        sched_admit(s);
        int busy = 0;
        for (int i = 0; i < s->n_slots; i++) busy += s->slots[i].req != NULL;
        if (!busy) {
            if (s->be.links && s->links_due) {
                /* going idle: the figures /metrics shows are complete until the next request */
                pthread_mutex_unlock(&s->mu);
                sched_links(s);
                pthread_mutex_lock(&s->mu);
                continue;
            }
            pthread_cond_wait(&s->work, &s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);

        int n_out, n = sched_batch(s, &n_out);
        hr_err err = {0};
        int rc = 0;
        if (n > 0) {
            hm_batch b = {.tokens = s->b_tok, .n = n, .pos = s->b_pos[0], .logits = s->logits, .seq = s->b_seq,
                          .pos_of = s->b_pos, .out = s->b_out};
            rc = s->be.eval(s->be.user, &b, &err);
        }
        pthread_mutex_lock(&s->mu);
        s->met.n_decode++;
        s->met.busy_slots_sum += (uint64_t)busy;
        const char *warn = NULL;
        int ev = s->be.events ? s->be.events(s->be.user, &warn) : 0;
        if (ev != s->n_events && warn && warn[0]) {
            /* a device left during the step and the answer went on: the running requests' replies say so */
            for (int i = 0; i < s->n_slots; i++)
                if (s->slots[i].req && !s->slots[i].req->warning[0])
                    snprintf(s->slots[i].req->warning, sizeof s->slots[i].req->warning, "%s", warn);
        }
        s->n_events = ev;
        /* the batch's tokens are in the caches now */
        for (int k = 0; k < n && !rc; k++) {
            hs_slot *sl = &s->slots[s->b_seq[k]];
            sl->cache[s->b_pos[k]] = s->b_tok[k];
            sl->n_cache = s->b_pos[k] + 1;
        }
        if (rc) {
            /* an engine failure ends every request of the step; the caches are unknown now */
            for (int k = 0; k < n; k++) {
                hs_slot *sl = &s->slots[s->b_seq[k]];
                sl->n_cache = 0;
                if (sl->req) slot_finish(s, sl, HS_FAILED, err.msg);
            }
            HR_LOGE("hearth serve: engine: %s", err.msg);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        for (int o = 0; o < n_out; o++) {
            hs_slot *sl = &s->slots[s->b_slot[o]];
            /* cancelled during the step: dropped at admit; its token is not needed */
            if (sl->req) slot_token(s, sl, s->logits + (size_t)o * (size_t)s->be.n_vocab);
        }
        if (n > 0) s->links_due = true;
        if (s->be.links && hr_time_ns() - s->t_links >= 1000000000) sched_links(s);
        pthread_mutex_lock(&s->mu);
    }
    /* shutting down: every request ends */
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].req) slot_finish(s, &s->slots[i], HS_CANCELLED, "server stopping");
    for (int i = 0; i < s->n_queue; i++) {
        s->queue[i]->finish = HS_CANCELLED;
        pthread_cond_broadcast(&s->queue[i]->cv);
        req_unref(s->queue[i]);
    }
    s->n_queue = 0;
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

hs_sched *hs_sched_create(const hs_backend *b, const hs_model_info *mi, int n_slots, int max_queue, hr_err *err) {
    hs_sched *s = calloc(1, sizeof *s);
    if (!s) { hr_fail(err, HR_ENOMEM, "out of memory"); return NULL; }
    s->be = *b;
    s->mi = *mi;
    s->n_slots = HR_MAX(1, HR_MIN(n_slots, b->n_seq));
    if (s->n_slots < n_slots)
        HR_LOGW("hearth serve: the engine (%s) holds %d sequence(s): %d slot(s), not %d", b->kind, b->n_seq,
                s->n_slots, n_slots);
    s->max_queue = HR_MAX(max_queue, 0);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    static const double t_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
    static const double itl_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 5};
    hs_hist_init(&s->met.ttft, t_bounds, HR_ARRAY_LEN(t_bounds));
    hs_hist_init(&s->met.queue, t_bounds, HR_ARRAY_LEN(t_bounds));
    hs_hist_init(&s->met.itl, itl_bounds, HR_ARRAY_LEN(itl_bounds));
    size_t nb = (size_t)HR_MAX(b->n_batch, s->n_slots);
    s->be.n_batch = (int32_t)nb;
    s->piece_cap = HR_MAX(ht_detok_max_bytes(mi->voc), 64);
    s->slots = calloc((size_t)s->n_slots, sizeof *s->slots);
    s->queue = calloc((size_t)(s->max_queue + s->n_slots) + 1, sizeof *s->queue);
    s->b_tok = malloc(nb * sizeof(int32_t));
    s->b_seq = malloc(nb * sizeof(int32_t));
    s->b_pos = malloc(nb * sizeof(int32_t));
    s->b_out = malloc(nb);
    s->b_slot = malloc((size_t)s->n_slots * sizeof(int));
    s->logits = malloc((size_t)s->n_slots * (size_t)b->n_vocab * sizeof(float));
    s->piece = malloc((size_t)s->piece_cap);
    s->lp_buf = malloc((size_t)b->n_vocab * sizeof(float));
    s->link_buf = b->links ? calloc(HS_MAX_LINKS, sizeof *s->link_buf) : NULL;
    s->t_links = hr_time_ns();
    bool ok = s->slots && s->queue && s->b_tok && s->b_seq && s->b_pos && s->b_out && s->b_slot && s->logits &&
              s->piece && s->lp_buf && (s->link_buf || !b->links);
    for (int i = 0; ok && i < s->n_slots; i++) {
        s->slots[i].id = i;
        ok = (s->slots[i].cache = malloc((size_t)b->n_ctx * sizeof(int32_t))) != NULL;
    }
    if (!ok) {
        hr_fail(err, HR_ENOMEM, "out of memory");
        s->be.free = NULL;  /* the caller keeps the backend */
        hs_sched_free(s);
        return NULL;
    }
    if (pthread_create(&s->thread, NULL, sched_main, s)) {
        hr_fail(err, HR_ENOMEM, "cannot start the scheduler thread");
        s->be.free = NULL;
        hs_sched_free(s);
        return NULL;
    }
    s->started = true;
    return s;
}

void hs_sched_free(hs_sched *s) {
    if (!s) return;
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_cond_signal(&s->work);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    for (int i = 0; s->slots && i < s->n_slots; i++) {
        free(s->slots[i].cache);
        free(s->slots[i].raw);
        ht_sampler_free(s->slots[i].smp);
    }
    if (s->be.free) s->be.free(s->be.user);
    free(s->slots);
    free(s->queue);
    free(s->b_tok);
    free(s->b_seq);
    free(s->b_pos);
    free(s->b_out);
    free(s->b_slot);
    free(s->logits);
    free(s->piece);
    free(s->lp_buf);
    free(s->link_buf);
    pthread_cond_destroy(&s->work);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
