/* The sampler: repetition penalty, then greedy (temp <= 0) or
     top-k -> softmax at temperature -> min-p -> top-p -> one draw from a seeded PRNG.

   Order: temperature is applied before top-p and min-p (as Hugging Face does; llama.cpp's default
   chain applies it after them), so a low temperature also narrows the nucleus. min-p and top-p
   each keep a prefix of the candidates in probability order, so together they keep the shorter of
   the two prefixes; top-p's cumulative sum is always over the probabilities of the full top-k set.

   Cost per token for a vocabulary of n: O(n) for the penalty-free greedy path and for top-k (a
   k-element heap, most logits rejected with one compare), O(k log k) to order the top k. With
   top-k off, min-p filters in O(n) and top-p pops from a heap only as many candidates as the
   nucleus needs, so the 150k-entry vocabulary is never fully sorted.

   Randomness: xoshiro256** seeded through splitmix64, so a seed gives the same draws on every run
   and machine. seed == UINT64_MAX asks for a random seed (time and address mixed), chosen once at
   create; ht_sampler_reset rewinds the generator to that seed. */
#include "text-impl.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef struct cand {
    float   x;   /* logit, then unnormalized probability */
    int32_t id;
} cand;

struct ht_sampler {
    ht_sampler_params p;
    int32_t  n_vocab;
    uint64_t seed;       /* resolved (never UINT64_MAX) */
    uint64_t rng[4];
    cand    *c;          /* [n_vocab] scratch */

    /* repetition window: ring of the last repeat_last_n accepted tokens (unbounded if < 0), and
       per token its count in the window and its index in `distinct` (the ids with count > 0) */
    int32_t *ring;
    int32_t  ring_cap, ring_len, ring_head;
    int32_t *count;      /* [n_vocab] */
    int32_t *pos;        /* [n_vocab] */
    int32_t *distinct;   /* [n_vocab] */
    int32_t  n_distinct;
};

ht_sampler_params ht_sampler_default_params(void) {
    return (ht_sampler_params){
        .temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
        .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = UINT64_MAX,
    };
}

/* ---- PRNG ---------------------------------------------------------------------------------------- */
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4]) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

static void rng_seed(ht_sampler *s) {
    uint64_t x = s->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
}

/* uniform in [0, 1) with 53 random bits */
static double rng_uniform(ht_sampler *s) { return (double)(xoshiro_next(s->rng) >> 11) * 0x1.0p-53; }

static uint64_t random_seed(const void *salt) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    x ^= (uint64_t)hr_time_ns() << 1;
    x ^= (uint64_t)(uintptr_t)salt * 0x9e3779b97f4a7c15ULL;
    x ^= (uint64_t)getpid() << 32;
    uint64_t seed = splitmix64(&x);
    return seed == UINT64_MAX ? 0 : seed;
}

/* ---- lifecycle ----------------------------------------------------------------------------------- */
ht_sampler *ht_sampler_create(const ht_sampler_params *p, int32_t n_vocab) {
    if (!p || n_vocab <= 0) return NULL;
    ht_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->seed = p->seed == UINT64_MAX ? random_seed(s) : p->seed;
    rng_seed(s);
    s->ring_cap = p->repeat_last_n > 0 ? p->repeat_last_n : 0;
    size_t n = (size_t)n_vocab;
    s->c = malloc(n * sizeof *s->c);
    s->count = calloc(n, sizeof *s->count);
    s->pos = malloc(n * sizeof *s->pos);
    s->distinct = malloc(n * sizeof *s->distinct);
    s->ring = s->ring_cap ? malloc((size_t)s->ring_cap * sizeof *s->ring) : NULL;
    if (!s->c || !s->count || !s->pos || !s->distinct || (s->ring_cap && !s->ring)) {
        ht_sampler_free(s);
        return NULL;
    }
    return s;
}

void ht_sampler_free(ht_sampler *s) {
    if (!s) return;
    free(s->c);
    free(s->count);
    free(s->pos);
    free(s->distinct);
    free(s->ring);
    free(s);
}

void ht_sampler_reset(ht_sampler *s) {
    for (int32_t i = 0; i < s->n_distinct; i++) s->count[s->distinct[i]] = 0;
    s->n_distinct = 0;
    s->ring_len = s->ring_head = 0;
    rng_seed(s);
}

/* ---- repetition window --------------------------------------------------------------------------- */
static void window_add(ht_sampler *s, int32_t id) {
    if (s->count[id]++ == 0) {
        s->pos[id] = s->n_distinct;
        s->distinct[s->n_distinct++] = id;
    }
}

static void window_remove(ht_sampler *s, int32_t id) {
    if (--s->count[id] == 0) {
        int32_t last = s->distinct[--s->n_distinct];
        s->distinct[s->pos[id]] = last;
        s->pos[last] = s->pos[id];
    }
}

void ht_sampler_accept(ht_sampler *s, int32_t token) {
    if (token < 0 || token >= s->n_vocab || s->p.repeat_last_n == 0) return;
    if (s->p.repeat_last_n < 0) {  /* whole history: only the distinct set is needed */
        window_add(s, token);
        return;
    }
    if (s->ring_len == s->ring_cap) {
        window_remove(s, s->ring[s->ring_head]);
        s->ring_len--;
        s->ring_head = (s->ring_head + 1) % s->ring_cap;
    }
    s->ring[(s->ring_head + s->ring_len) % s->ring_cap] = token;
    s->ring_len++;
    window_add(s, token);
}

/* llama.cpp semantics: each distinct recent token once, positive logits divided, others multiplied */
static void apply_penalty(ht_sampler *s, float *logits) {
    float pen = s->p.repeat_penalty;
    if (pen == 1.0f || !(pen > 0.0f)) return;
    for (int32_t i = 0; i < s->n_distinct; i++) {
        float *x = &logits[s->distinct[i]];
        *x = *x > 0.0f ? *x / pen : *x * pen;
    }
}

/* ---- selection ----------------------------------------------------------------------------------- */
/* "a ranks before b": larger value, then smaller id, so every order here is total and
   deterministic, and top-1 is exactly the argmax with the lowest index. */
static inline bool ranks_before(const cand *a, const cand *b) {
    return a->x > b->x || (a->x == b->x && a->id < b->id);
}

static int cmp_rank(const void *pa, const void *pb) {
    const cand *a = pa, *b = pb;
    return ranks_before(a, b) ? -1 : ranks_before(b, a) ? 1 : 0;
}

/* NaN would break every comparison; such a logit can never be chosen */
static inline float clean(float x) { return x == x ? x : -INFINITY; }

static int32_t argmax(const float *logits, int32_t n) {
    int32_t best = 0;
    float bx = clean(logits[0]);
    for (int32_t i = 1; i < n; i++) {
        float x = clean(logits[i]);
        if (x > bx) { bx = x; best = i; }
    }
    return best;
}

/* Binary heaps over candidates: with worst_root the root is the candidate that ranks last (the
   top-k selection evicts it), otherwise the one that ranks first (top-p pops it). */
static void sift_down(cand *h, int32_t n, int32_t i, bool worst_root) {
    cand e = h[i];
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && (worst_root ? ranks_before(&h[c], &h[c + 1]) : ranks_before(&h[c + 1], &h[c]))) c++;
        if (worst_root ? !ranks_before(&e, &h[c]) : !ranks_before(&h[c], &e)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = e;
}

static void heapify(cand *h, int32_t n, bool worst_root) {
    for (int32_t i = n / 2 - 1; i >= 0; i--) sift_down(h, n, i, worst_root);
}

/* The k best logits into s->c[0..k), in rank order. */
static int32_t top_k(ht_sampler *s, const float *logits, int32_t k) {
    cand *h = s->c;
    for (int32_t i = 0; i < k; i++) h[i] = (cand){ clean(logits[i]), i };
    heapify(h, k, true);
    for (int32_t i = k; i < s->n_vocab; i++) {
        cand e = { clean(logits[i]), i };
        if (ranks_before(&e, &h[0])) {
            h[0] = e;
            sift_down(h, k, 0, true);
        }
    }
    qsort(h, (size_t)k, sizeof *h, cmp_rank);
    return k;
}

int32_t ht_sampler_sample(ht_sampler *s, float *logits) {
    const ht_sampler_params *p = &s->p;
    int32_t n_vocab = s->n_vocab;
    apply_penalty(s, logits);
    if (!(p->temp > 0.0f)) return argmax(logits, n_vocab);

    cand *c = s->c;
    int32_t n;
    bool sorted;
    if (p->top_k > 0 && p->top_k < n_vocab) {
        n = top_k(s, logits, p->top_k);
        sorted = true;
    } else {
        for (int32_t i = 0; i < n_vocab; i++) c[i] = (cand){ clean(logits[i]), i };
        n = n_vocab;
        sorted = false;
    }

    /* softmax at temperature, shifted by the max so the best candidate has weight exactly 1 */
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (ranks_before(&c[i], &c[best])) best = i;
    float mx = c[best].x;
    if (mx == -INFINITY) return c[best].id;  /* nothing has any probability; stay deterministic */
    double z = 0.0;
    float inv_t = 1.0f / p->temp;
    for (int32_t i = 0; i < n; i++) {
        c[i].x = expf((c[i].x - mx) * inv_t);
        z += c[i].x;
    }

    /* min-p: relative to the best, whose weight is 1 (the best always survives) */
    if (p->min_p > 0.0f) {
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++)
            if (c[i].x >= p->min_p || i == best) c[m++] = c[i];  /* keeps order */
        n = m;
    }

    /* top-p: the smallest prefix in probability order whose mass reaches top_p of z */
    cand *kept = c;
    if (p->top_p < 1.0f) {
        double target = (double)p->top_p * z, cum = 0.0;
        int32_t m = 0;
        if (sorted) {
            while (m < n) {
                cum += c[m++].x;
                if (cum >= target) break;
            }
        } else {
            /* pop the best from a heap until the mass is reached: O(n + m log n) for m kept;
               each popped candidate is parked in the slot the shrinking heap frees */
            heapify(c, n, false);
            int32_t hn = n;
            while (hn > 0) {
                cand top = c[0];
                c[0] = c[--hn];
                if (hn) sift_down(c, hn, 0, false);
                c[hn] = top;
                m++;
                cum += top.x;
                if (cum >= target) break;
            }
            kept = c + (n - m);  /* in reverse rank order, which the draw does not mind */
        }
        n = m;
    }

    /* draw */
    double total = 0.0;
    for (int32_t i = 0; i < n; i++) total += kept[i].x;
    double r = rng_uniform(s) * total, acc = 0.0;
    for (int32_t i = 0; i < n; i++) {
        acc += kept[i].x;
        if (r < acc) return kept[i].id;
    }
    return kept[n - 1].id;
}
