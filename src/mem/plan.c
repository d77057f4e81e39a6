/* mem: the residency plan — keep or stream, the window, and which blocks to pin (see mem.h) */
#include "mem.h"

#include <stdlib.h>

hmem_params hmem_default_params(void) {
    hmem_params p = {.mode = HMEM_AUTO, .budget = 0, .window = 2, .pin = HMEM_PIN_RUN, .ctx_bytes = 0, .n_ctx = 0, .ctx_base_bytes = 0,
                         .prefetch = true};
    return p;
}

const char *hmem_mode_name(hmem_mode m) {
    switch (m) {
    case HMEM_AUTO: return "auto";
    case HMEM_KEEP: return "keep";
    case HMEM_STREAM: return "stream";
    case HMEM_OBSERVE: return "observe";
    default: return "?";
    }
}

static int cmp_desc_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x < y) - (x > y);
}

/* room the window needs: the w largest streamed blocks, since any w consecutive streamed blocks
   (consecutive once pinned ones are skipped) may be resident together */
static uint64_t window_room(const uint64_t *bytes, const bool *pinned, int n, int w, uint64_t *tmp) {
    int k = 0;
    for (int i = 0; i < n; i++)
        if (!pinned[i]) tmp[k++] = bytes[i];
    qsort(tmp, (size_t)k, sizeof *tmp, cmp_desc_u64);
    uint64_t s = 0;
    for (int i = 0; i < k && i < w; i++) s += tmp[i];
    return s;
}

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

static bool is_candidate(hmem_pin pin, uint8_t kind) {
    return pin == HMEM_PIN_SPREAD || pin == HMEM_PIN_RUN || (pin == HMEM_PIN_FFN && kind == HM_BLOCK_FFN);
}

/* ---- the pins that stream the fewest bytes (LIME's allocator, lime.txt §IV) ----------------------------- */

typedef struct pin_search {
    const uint64_t *size;
    const int      *count, *ord;   /* ord: the classes by size, largest first */
    int             k, w;
    uint64_t        avail, best_bytes;
    const uint64_t *rest;          /* rest[i]: bytes of the classes ord[i..] */
    int            *cur, *best;
    bool            found;
    int64_t         visits;
} pin_search;

#define HMEM_PIN_SEARCH_MAX (1 << 20)   /* nodes; beyond it the search gives up (the caller keeps RUN) */

/* Class ord[i] on, with `pinned` bytes pinned so far and the window holding `slots` fewer than w of
   the largest streamed blocks (`win` bytes). Classes come largest first, so a streamed block enters
   the window exactly when fewer than w larger ones stream; the window only grows, so a partial choice
   over the room is dead. */
static void pin_rec(pin_search *s, int i, uint64_t pinned, int slots, uint64_t win) {
    if (++s->visits > HMEM_PIN_SEARCH_MAX) return;
    if (s->found && pinned + s->rest[i] <= s->best_bytes) return; /* cannot beat the best */
    if (i == s->k) {
        s->found = true;
        s->best_bytes = pinned;
        memcpy(s->best, s->cur, sizeof *s->cur * (size_t)s->k);
        return;
    }
    const int c = s->ord[i], cnt = s->count[c];
    const uint64_t sz = s->size[c];
    for (int np = cnt; np >= 0; np--) {
        int take = HR_MIN(cnt - np, slots);
        uint64_t nb = pinned + (uint64_t)np * sz, nw = win + (uint64_t)take * sz;
        if (nb > s->avail || nw > s->avail - nb) continue; /* fewer pins free room: try them */
        s->cur[c] = np;
        pin_rec(s, i + 1, nb, slots - take, nw);
        /* the smallest class: pinning one more never grows the window, so the most that fit is best */
        if (i == s->k - 1) break;
    }
}

int hmem_pin_best_classes(const uint64_t *size, const int *count, int k, int w, uint64_t avail, int *pin,
                          uint64_t *pinned_bytes) {
    if (k < 1 || w < 1) return -1;
    int *ord = malloc((size_t)k * sizeof *ord), *cur = calloc((size_t)k, sizeof *cur);
    uint64_t *rest = malloc((size_t)(k + 1) * sizeof *rest);
    int rc = -1;
    if (ord && cur && rest) {
        for (int i = 0; i < k; i++) ord[i] = i;
        for (int i = 1; i < k; i++) /* insertion sort: a handful of classes */
            for (int j = i; j > 0 && size[ord[j]] > size[ord[j - 1]]; j--) { int t = ord[j]; ord[j] = ord[j - 1]; ord[j - 1] = t; }
        rest[k] = 0;
        for (int i = k - 1; i >= 0; i--) rest[i] = rest[i + 1] + (uint64_t)count[ord[i]] * size[ord[i]];
        pin_search s = {.size = size, .count = count, .ord = ord, .k = k, .w = w, .avail = avail, .rest = rest,
                        .cur = cur, .best = pin};
        pin_rec(&s, 0, 0, w, 0);
        if (s.found && s.visits <= HMEM_PIN_SEARCH_MAX) {
            *pinned_bytes = s.best_bytes;
            rc = 0;
        }
    }
    free(ord);
    free(cur);
    free(rest);
    return rc;
}

int hmem_pin_best(const uint64_t *bytes, int n, int w, uint64_t avail, bool *pinned, uint64_t *pinned_bytes) {
    /* blocks of one size are one class: which of them are pinned changes nothing in the cost */
    uint64_t *size = calloc((size_t)n, sizeof *size);
    int *count = calloc((size_t)n, sizeof *count), *cls = malloc((size_t)n * sizeof *cls), *pin = calloc((size_t)n, sizeof *pin);
    int k = 0, rc = -1;
    if (size && count && cls && pin) {
        for (int i = 0; i < n; i++) {
            int c = 0;
            while (c < k && size[c] != bytes[i]) c++;
            if (c == k) size[k++] = bytes[i];
            count[c]++;
            cls[i] = c;
        }
        rc = hmem_pin_best_classes(size, count, k, w, avail, pin, pinned_bytes);
        /* the first blocks of each class in execution order: pins stay together, as RUN's do */
        for (int i = 0; !rc && i < n; i++) {
            pinned[i] = pin[cls[i]] > 0;
            if (pinned[i]) pin[cls[i]]--;
        }
    }
    free(size);
    free(count);
    free(cls);
    free(pin);
    return rc;
}

int hmem_plan_make(const uint64_t *bytes, const uint8_t *kinds, int n, const hmem_params *p, uint64_t budget,
                   bool *pinned, hmem_plan *out, hr_err *err) {
    if (!bytes || !kinds || !p || !pinned || !out || n < 1)
        return hr_fail(err, HR_EINVAL, "hmem_plan_make: no blocks to plan");
    if ((unsigned)p->mode >= HMEM_MODE_COUNT) return hr_fail(err, HR_EINVAL, "unknown residency mode %d", (int)p->mode);
    if ((unsigned)p->pin >= HMEM_PIN_COUNT) return hr_fail(err, HR_EINVAL, "unknown pin policy %d", (int)p->pin);
    if (p->window < 1) return hr_fail(err, HR_EINVAL, "window must be at least 1 block (got %d)", (int)p->window);
    if (budget == 0) return hr_fail(err, HR_EINVAL, "memory budget is zero");
    memset(out, 0, sizeof *out);
    uint64_t total = 0, largest = 0;
    for (int i = 0; i < n; i++) {
        pinned[i] = false;
        if (kinds[i] > HM_BLOCK_OUTPUT) return hr_fail(err, HR_EINVAL, "block %d has unknown kind %d", i, kinds[i]);
        total += bytes[i];
        largest = HR_MAX(largest, bytes[i]);
    }
    out->n_blocks = n;
    out->budget = budget;
    out->ctx_bytes = p->ctx_bytes;
    out->weight_bytes = total;
    out->largest_bytes = largest;
    out->stream_bytes = 0;
    if (p->mode == HMEM_OBSERVE || p->mode == HMEM_KEEP ||
        (p->mode == HMEM_AUTO && total <= budget && p->ctx_bytes <= budget - total)) {
        out->mode = p->mode == HMEM_OBSERVE ? HMEM_OBSERVE : HMEM_KEEP;
        return 0;
    }
    out->mode = HMEM_STREAM;
    if (p->ctx_bytes >= budget || largest > budget - p->ctx_bytes)
        return hr_fail(err, HR_ERANGE,
                       "memory budget %.1f MiB is too small: it must hold the KV cache and scratch (%.1f MiB) and "
                       "the largest block of weights (%.1f MiB), at least %.1f MiB",
                       mib(budget), mib(p->ctx_bytes), mib(largest), mib(p->ctx_bytes + largest));
    uint64_t avail = budget - p->ctx_bytes;
    uint64_t *tmp = malloc((size_t)n * sizeof *tmp);
    if (!tmp) return hr_fail(err, HR_ENOMEM, "out of memory planning %d blocks", n);
    int w = HR_MIN(p->window, n);
    while (w > 1 && window_room(bytes, pinned, n, w, tmp) > avail) w--;
    out->window = w;

    uint64_t pinned_bytes = 0;
    int n_pinned = 0;
    while (p->pin != HMEM_PIN_NONE) {
        uint64_t room = window_room(bytes, pinned, n, w, tmp);
        uint64_t left = avail > room + pinned_bytes ? avail - room - pinned_bytes : 0;
        uint64_t cand = 0;
        for (int i = 0; i < n; i++)
            if (!pinned[i] && is_candidate(p->pin, kinds[i])) cand += bytes[i];
        if (cand == 0 || left == 0) break;
        /* spread the pins: credit grows by f per byte walked, a block is pinned once the credit covers it */
        double f = p->pin == HMEM_PIN_RUN ? 1.0 : HR_MIN(1.0, (double)left / (double)cand), credit = 0;
        bool any = false;
        for (int i = 0; i < n; i++) {
            if (pinned[i] || !is_candidate(p->pin, kinds[i])) continue;
            credit += f * (double)bytes[i];
            if (credit + 1e-9 * (double)bytes[i] >= (double)bytes[i] && bytes[i] <= left) {
                pinned[i] = true;
                any = true;
                credit -= (double)bytes[i];
                left -= bytes[i];
                pinned_bytes += bytes[i];
                n_pinned++;
            }
        }
        if (!any) /* the credit never covered a block (sizes differ a lot): take the first that fits */
            for (int i = 0; i < n && !any; i++)
                if (!pinned[i] && is_candidate(p->pin, kinds[i]) && bytes[i] <= left) {
                    pinned[i] = any = true;
                    pinned_bytes += bytes[i];
                    n_pinned++;
                }
        if (!any) break;
    }
    if (p->pin == HMEM_PIN_RUN && p->mode == HMEM_AUTO) { /* forced STREAM is an ablation: RUN as it was */
        /* RUN walks in order and pins what fits, which can leave a large block (the output head) to the
           window and pin less than the budget allows. The best pins (hmem_pin_best) replace it when
           they stream clearly fewer bytes: a few percent do not pay for breaking the one stretch RUN
           streams (docs/memory.md, "Pins") */
        bool *best = malloc((size_t)n * sizeof *best);
        uint64_t best_bytes = 0;
        if (best && !hmem_pin_best(bytes, n, w, avail, best, &best_bytes) &&
            best_bytes > pinned_bytes + (total - pinned_bytes) / HMEM_PIN_BEST_GAIN) {
            memcpy(pinned, best, sizeof *best * (size_t)n);
            pinned_bytes = best_bytes;
            n_pinned = 0;
            for (int i = 0; i < n; i++) n_pinned += pinned[i];
        }
        free(best);
    }
    out->window_bytes = window_room(bytes, pinned, n, w, tmp);
    free(tmp);
    out->n_pinned = n_pinned;
    out->pinned_bytes = pinned_bytes;
    out->stream_bytes = total - pinned_bytes;
    out->room_bytes = avail - pinned_bytes;
    HR_ASSERT(out->pinned_bytes + out->window_bytes <= avail);
    return 0;
}

static bool adapts(const hmem_params *p) { return p->n_ctx > 0 && p->ctx_base_bytes <= p->ctx_bytes; }

uint64_t hmem_ctx_bytes_at(const hmem_params *p, int32_t n_pos) {
    if (!adapts(p) || n_pos >= p->n_ctx) return p->ctx_bytes;
    uint64_t kv = p->ctx_bytes - p->ctx_base_bytes;
    if (n_pos <= 0) return p->ctx_base_bytes;
    /* kv * n_pos / n_ctx, rounded up, without overflow for any 64-bit kv */
    uint64_t q = kv / (uint64_t)p->n_ctx, r = kv % (uint64_t)p->n_ctx;
    return p->ctx_base_bytes + q * (uint64_t)n_pos + (r * (uint64_t)n_pos + (uint64_t)p->n_ctx - 1) / (uint64_t)p->n_ctx;
}

int32_t hmem_plan_positions(const hmem_params *p, int32_t n_pos) {
    if (!adapts(p)) return 0;
    int32_t step = HR_MAX(1, p->n_ctx / HMEM_KV_STEPS);
    int64_t want = (int64_t)HR_MAX(n_pos, 0) + 1;
    int64_t r = (want + step - 1) / step * step;
    return (int32_t)HR_MIN(r, (int64_t)p->n_ctx);
}

int hmem_plan_at(const uint64_t *bytes, const uint8_t *kinds, int n, const hmem_params *p, uint64_t budget,
                 int32_t n_pos, bool *pinned, hmem_plan *out, hr_err *err) {
    int rc = hmem_plan_make(bytes, kinds, n, p, budget, pinned, out, err);
    if (rc || out->mode != HMEM_STREAM || !adapts(p)) return rc;
    int32_t pos = hmem_plan_positions(p, n_pos);
    hmem_params q = *p;
    q.ctx_bytes = hmem_ctx_bytes_at(p, pos);  /* AUTO streams below unless everything fits (the branch first) */
    if (p->mode == HMEM_AUTO && out->weight_bytes <= budget - q.ctx_bytes) {
        /* everything fits beside the cache in use: all pinned, nothing streams until the cache grows */
        for (int i = 0; i < n; i++) pinned[i] = true;
        out->window = HR_MIN(p->window, n);
        out->n_pinned = n;
        out->ctx_bytes = q.ctx_bytes;
        out->pinned_bytes = out->weight_bytes;
        out->stream_bytes = out->window_bytes = 0;
        out->room_bytes = budget - q.ctx_bytes - out->weight_bytes;
    } else if ((rc = hmem_plan_make(bytes, kinds, n, &q, budget, pinned, out, err)))
        return rc;
    out->pos_room = pos;
    return 0;
}
