/* serve/backend: the engines behind the scheduler.

   One device: one context of N sequences; a step's batch goes to hm_eval whole, so the weights are
   read once for every slot's tokens, and hm_kv_seq_copy shares a prompt prefix between slots. */
#include "serve-impl.h"

#include "cluster/cluster.h"

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

/* ---- the head of a cluster: one sequence until hc_head takes several --------------------------------- */
typedef struct head_be {
    hc_head *h;
    int32_t  next;            /* the position the workers' caches end at */
} head_be;

static int head_eval(void *user, const hm_batch *b, hr_err *err) {
    head_be *H = user;
    int32_t pos = b->pos_of ? b->pos_of[0] : b->pos;
    for (int i = 0; i < b->n; i++)
        if ((b->seq && b->seq[i]) || (b->pos_of && b->pos_of[i] != pos + i) || (b->out && b->out[i] && i != b->n - 1))
            return hr_fail(err, HR_EUNSUPPORTED, "a cluster runs one sequence's consecutive tokens per pass");
    /* a new request that keeps less of the cache than it holds: the workers forget the rest */
    if (pos != H->next) {
        int rc = hc_head_reset(H->h, pos, err);
        if (rc) return rc;
    }
    int rc = hc_head_eval(H->h, b->tokens, b->n, pos, b->logits, false, err);
    H->next = rc ? 0 : pos + b->n;
    return rc;
}

static void head_free(void *user) { free(user); }

int hs_backend_head(hs_backend *b, struct hc_head *h, int32_t n_vocab, hr_err *err) {
    head_be *H = calloc(1, sizeof *H);
    if (!H) return hr_fail(err, HR_ENOMEM, "out of memory");
    H->h = h;
    *b = (hs_backend){.user = H, .n_seq = 1, .n_ctx = hc_head_n_ctx(h), .n_batch = 512, .n_vocab = n_vocab,
                      .eval = head_eval, .free = head_free, .kind = "the head of a cluster, one sequence"};
    return 0;
}
