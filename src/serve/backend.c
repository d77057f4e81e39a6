/* serve/backend: the engines behind the scheduler.

   One device: one context of N sequences; a step's batch goes to hm_eval whole, so the weights are
   read once for every slot's tokens, and hm_kv_seq_copy shares a prompt prefix between slots. A cluster's
   head: the same batch through hc_head_eval_batch (every device's context holds the n_seq sequences),
   KV_COPY for the prefix. */
#include "serve-impl.h"

#include "cluster/cluster.h"

#include <stdio.h>
#include <stdlib.h>

static int local_eval(void *user, const hm_batch *b, hr_err *err) { return hm_eval(user, b, err); }

static int local_copy(void *user, int32_t src, int32_t dst, int32_t n, hr_err *err) {
    return hm_kv_seq_copy(user, src, dst, n, err);
}

int hs_backend_local(hs_backend *b, hm_ctx *c, int32_t n_vocab, hr_err *err) {
    bool multi = hm_ctx_n_seq(c) > 1;
    *b = (hs_backend){.user = c, .n_seq = hm_ctx_n_seq(c), .n_ctx = hm_ctx_n_ctx(c), .n_batch = 512,
                      .n_vocab = n_vocab, .eval = local_eval, .seq_copy = multi ? local_copy : NULL,
                      .kind = multi ? "one context of several sequences" : "one context, one sequence"};
    return 0;
}

/* ---- the head of a cluster: every device's cache holds the slots' sequences ------------------------- */
typedef struct head_be {
    hc_head      *h;
    hc_dev_stats *st;         /* [HC_MAX_DEVICES] hc_head_stats' answer */
} head_be;

static int head_eval(void *user, const hm_batch *b, hr_err *err) {
    return hc_head_eval_batch(((head_be *)user)->h, b, err);
}

static int head_copy(void *user, int32_t src, int32_t dst, int32_t n, hr_err *err) {
    return hc_head_kv_seq_copy(((head_be *)user)->h, src, dst, n, err);
}

static int head_rejoin(void *user, hr_err *err) { return hc_head_rejoin(((head_be *)user)->h, err); }

static int head_events(void *user, const char **warning) {
    const hc_head *h = ((head_be *)user)->h;
    *warning = hc_head_warning(h);
    return hc_head_recoveries(h);
}

static int head_links(void *user, hs_link *out, int cap, hr_err *err) {
    head_be *H = user;
    int k = hc_head_stats(H->h, H->st, HC_MAX_DEVICES, err);
    for (int d = 0; d < k && d < cap; d++) {
        snprintf(out[d].name, sizeof out[d].name, "%s", H->st[d].name);
        out[d].sent = H->st[d].bytes_sent;
        out[d].received = H->st[d].bytes_received;
        out[d].dg_lost = H->st[d].dg_lost;
        out[d].elems_lost = H->st[d].elems_lost;
    }
    return k < 0 ? k : HR_MIN(k, cap);
}

static void head_free(void *user) {
    head_be *H = user;
    free(H->st);
    free(H);
}

int hs_backend_head(hs_backend *b, struct hc_head *h, int32_t n_vocab, hr_err *err) {
    head_be *H = calloc(1, sizeof *H);
    if (H) H->st = calloc(HC_MAX_DEVICES, sizeof *H->st);
    if (!H || !H->st) {
        free(H);
        return hr_fail(err, HR_ENOMEM, "out of memory");
    }
    H->h = h;
    bool pp = hc_head_pp_plan(h) != NULL;
    *b = (hs_backend){.user = H, .n_seq = hc_head_n_seq(h), .n_ctx = hc_head_n_ctx(h), .n_batch = hc_head_n_batch(h),
                      .n_vocab = n_vocab, .eval = head_eval, .seq_copy = head_copy, .links = head_links,
                      .rejoin = head_rejoin, .events = head_events,
                      .free = head_free,
                      .kind = pp ? "the head of a pipeline, several sequences"
                                 : "the head of a tensor-parallel cluster, several sequences"};
    return 0;
}
