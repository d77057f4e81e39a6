/* serve/backend: the engine behind the scheduler, on one device.

   With a context of several sequences the batch goes to hm_eval whole: one pass, the weights read once
   for every sequence's tokens. While the engine holds one sequence per context, each sequence has a
   context of its own (sharing the thread pool) and the batch is cut into its sequences' runs, one
   hm_eval each: the same tokens, without the shared weight reads. */
#include "serve-impl.h"

#include "cluster/cluster.h"

#include <stdlib.h>

typedef struct local_be {
    hm_ctx **c;
    int      n;
    int32_t  n_vocab;
    bool     multi;           /* one context of several sequences */
} local_be;

static int local_eval_one(local_be *L, const hm_batch *b, hr_err *err) { return hm_eval(L->c[0], b, err); }

/* one context per sequence: each run of one sequence's consecutive positions is one hm_eval; a run is
   cut after every token whose logits are wanted (hm_eval gives the last token's) */
static int local_eval_split(local_be *L, const hm_batch *b, hr_err *err) {
    float *row = b->logits;
    for (int i = 0; i < b->n;) {
        int32_t seq = b->seq ? b->seq[i] : 0;
        int32_t pos = b->pos_of ? b->pos_of[i] : b->pos + i;
        if (seq < 0 || seq >= L->n) return hr_fail(err, HR_EINVAL, "sequence %d outside 0..%d", seq, L->n - 1);
        int j = i + 1;
        bool out = b->out ? b->out[i] : (i == b->n - 1);
        while (!out && j < b->n && (b->seq ? b->seq[j] : 0) == seq &&
               (b->pos_of ? b->pos_of[j] : b->pos + j) == pos + (j - i)) {
            out = b->out ? b->out[j] : (j == b->n - 1);
            j++;
        }
        hm_batch one = {.tokens = b->tokens + i, .n = j - i, .pos = pos, .logits = out ? row : NULL};
        int rc = hm_eval(L->c[seq], &one, err);
        if (rc) return rc;
        if (out && row) row += L->n_vocab;
        i = j;
    }
    return 0;
}

static int local_eval(void *user, const hm_batch *b, hr_err *err) {
    local_be *L = user;
    return L->multi ? local_eval_one(L, b, err) : local_eval_split(L, b, err);
}

static int local_copy(void *user, int32_t src, int32_t dst, int32_t n, hr_err *err) {
    local_be *L = user;
    return hm_kv_seq_copy(L->c[0], src, dst, n, err);
}

static void local_free(void *user) { free(user); }

int hs_backend_local(hs_backend *b, hm_ctx **ctxs, int n_ctxs, int32_t n_vocab, hr_err *err) {
    local_be *L = calloc(1, sizeof *L);
    if (!L) return hr_fail(err, HR_ENOMEM, "out of memory");
    bool multi = n_ctxs == 1 && hm_ctx_n_seq(ctxs[0]) > 1;
    *L = (local_be){ctxs, n_ctxs, n_vocab, multi};
    *b = (hs_backend){.user = L, .n_seq = n_ctxs == 1 ? hm_ctx_n_seq(ctxs[0]) : n_ctxs, .n_ctx = hm_ctx_n_ctx(ctxs[0]),
                      .n_batch = 512, .n_vocab = n_vocab, .eval = local_eval, .seq_copy = multi ? local_copy : NULL,
                      .free = local_free,
                      .kind = multi ? "one context of several sequences" : n_ctxs == 1 ? "one context, one sequence"
                                                                              : "one context per sequence"};
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
