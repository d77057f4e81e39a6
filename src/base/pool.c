/* pool: persistent fork/join thread pool — see pool.h */
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define hr_cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define hr_cpu_relax() __asm__ __volatile__("yield")
#else
#define hr_cpu_relax() ((void)0)
#endif

/* A worker waiting for the next job spins (pause) long enough to bridge the gaps between the
   operations of one forward pass, then yields the core for a while (so an oversubscribed machine
   still makes progress: a spinning thread must not keep a descheduled peer off the CPU), then
   sleeps on the condition variable. */
#define HR_POOL_SPIN_ITERS  4096
#define HR_POOL_YIELD_ITERS 2048

struct hr_pool {
    int n;
    pthread_t *threads;
    _Atomic uint64_t gen;      /* incremented for every job */
    _Atomic int      pending;  /* workers still running the current job */
    _Atomic int      quit;
    _Atomic int      sleepers;
    hr_pool_fn fn;
    void *arg;
    pthread_mutex_t mu;
    pthread_cond_t  cv;
};

struct hr_pool_worker { hr_pool *pool; int ith; };

static void *hr_pool_main(void *p) {
    struct hr_pool_worker *w = p;
    hr_pool *pool = w->pool;
    int ith = w->ith;
    free(w);
    uint64_t seen = 0;
    for (;;) {
        uint64_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&pool->gen, memory_order_acquire)) == seen) {
            ++spins;
            if (spins < HR_POOL_SPIN_ITERS) { hr_cpu_relax(); continue; }
            if (spins < HR_POOL_SPIN_ITERS + HR_POOL_YIELD_ITERS) { sched_yield(); continue; }
            pthread_mutex_lock(&pool->mu);
            atomic_fetch_add(&pool->sleepers, 1);
            while (atomic_load(&pool->gen) == seen && !atomic_load(&pool->quit))
                pthread_cond_wait(&pool->cv, &pool->mu);
            atomic_fetch_sub(&pool->sleepers, 1);
            pthread_mutex_unlock(&pool->mu);
            spins = 0;
        }
        seen = g;
        if (atomic_load(&pool->quit)) return NULL;
        pool->fn(pool->arg, ith, pool->n);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_acq_rel);
    }
}

hr_pool *hr_pool_create(int n, hr_err *err) {
    if (n < 1 || n > 1024) { hr_fail(err, HR_EINVAL, "thread count %d out of range [1, 1024]", n); return NULL; }
    hr_pool *pool = calloc(1, sizeof *pool);
    if (!pool) { hr_fail(err, HR_ENOMEM, "out of memory"); return NULL; }
    pool->n = n;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    pool->threads = calloc((size_t)n, sizeof(pthread_t));
    if (!pool->threads) goto err;
    for (int i = 1; i < n; i++) {
        struct hr_pool_worker *w = malloc(sizeof *w);
        if (w) w->pool = pool, w->ith = i;
        /* threads 1..i-1 already run: a failure here stops them (hr_pool_free), not only frees */
        if (!w || pthread_create(&pool->threads[i], NULL, hr_pool_main, w) != 0) {
            free(w);
            pool->n = i; /* threads 1..i-1 exist */
            hr_fail(err, HR_ENOMEM, "cannot create thread %d of %d", i, n);
            hr_pool_free(pool);
            return NULL;
        }
    }
    return pool;
err:
    hr_fail(err, HR_ENOMEM, "out of memory");
    free(pool->threads);
    free(pool);
    return NULL;
}

void hr_pool_free(hr_pool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    atomic_store(&pool->quit, 1);
    atomic_fetch_add(&pool->gen, 1);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 1; i < pool->n; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->cv);
    free(pool->threads);
    free(pool);
}

int hr_pool_size(const hr_pool *pool) { return pool->n; }

void hr_pool_run(hr_pool *pool, hr_pool_fn fn, void *arg) {
    if (pool->n == 1) { fn(arg, 0, 1); return; }
    pool->fn = fn;
    pool->arg = arg;
    atomic_store_explicit(&pool->pending, pool->n - 1, memory_order_relaxed);
    atomic_fetch_add(&pool->gen, 1); /* seq_cst: pairs with the sleepers check (Dekker) */
    if (atomic_load(&pool->sleepers) > 0) {
        pthread_mutex_lock(&pool->mu);
        pthread_cond_broadcast(&pool->cv);
        pthread_mutex_unlock(&pool->mu);
    }
    fn(arg, 0, pool->n);
    for (unsigned spins = 0; atomic_load_explicit(&pool->pending, memory_order_acquire) > 0; spins++) {
        if ((spins & 1023) == 1023) sched_yield();
        else hr_cpu_relax();
    }
}

/* ---- hr_pool_read ---------------------------------------------------------------------------------- */
typedef struct { const hr_span *spans; int n; size_t total; uint64_t sum[1024]; } hr_read_job;

/* The sum of the bytes of [p, p + len), portably: 8 bytes at a time in 16-bit lanes, folded before
   a lane can overflow (128 words of 2 x 255) */
static uint64_t hr_sum_bytes(const uint8_t *p, size_t len) {
    const uint64_t m = 0x00ff00ff00ff00ffULL;
    uint64_t s = 0;
    size_t i = 0;
    while (i + 8 <= len) {
        uint64_t lanes = 0;
        for (int k = 0; k < 128 && i + 8 <= len; k++, i += 8) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            lanes += (w & m) + ((w >> 8) & m);
        }
        for (int k = 0; k < 4; k++) s += (lanes >> (16 * k)) & 0xffff;
    }
    for (; i < len; i++) s += p[i];
    return s;
}

/* The same sum as a read as fast as the core streams, the checksum independent of how the bytes
   are split: on x86 one psadbw per 16-byte load (16-byte loads are as fast here as 8-, 32- or
   64-byte ones: the memory is the limit), four accumulators so the loads are not serialized. */
static uint64_t hr_read_bytes(const uint8_t *p, size_t len) {
    size_t i = 0;
    uint64_t s = 0;
#if defined(__x86_64__)
    const __m128i z = _mm_setzero_si128();
    __m128i a0 = z, a1 = z, a2 = z, a3 = z;
    for (; i + 64 <= len; i += 64) {
        a0 = _mm_add_epi64(a0, _mm_sad_epu8(_mm_loadu_si128((const __m128i *)(p + i)), z));
        a1 = _mm_add_epi64(a1, _mm_sad_epu8(_mm_loadu_si128((const __m128i *)(p + i + 16)), z));
        a2 = _mm_add_epi64(a2, _mm_sad_epu8(_mm_loadu_si128((const __m128i *)(p + i + 32)), z));
        a3 = _mm_add_epi64(a3, _mm_sad_epu8(_mm_loadu_si128((const __m128i *)(p + i + 48)), z));
    }
    a0 = _mm_add_epi64(_mm_add_epi64(a0, a1), _mm_add_epi64(a2, a3));
    s = (uint64_t)_mm_cvtsi128_si64(a0) + (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(a0, a0));
#endif
    return s + hr_sum_bytes(p + i, len - i);
}

static void hr_read_worker(void *arg, int ith, int nth) {
    hr_read_job *j = arg;
    /* this thread's share of the concatenated bytes, in 256-byte units */
    int64_t b, e;
    hr_split((int64_t)j->total, ith, nth, 256, &b, &e);
    uint64_t s = 0;
    size_t off = 0;
    for (int k = 0; k < j->n && (int64_t)off < e; k++) {
        size_t s0 = off, s1 = off + j->spans[k].len;
        off = s1;
        size_t lo = HR_MAX(s0, (size_t)b), hi = HR_MIN(s1, (size_t)e);
        if (lo < hi) s += hr_read_bytes((const uint8_t *)j->spans[k].ptr + (lo - s0), hi - lo);
    }
    j->sum[ith] = s;
}

uint64_t hr_pool_read(hr_pool *pool, const hr_span *spans, int n) {
    hr_read_job j = {.spans = spans, .n = n, .total = 0};
    for (int k = 0; k < n; k++) j.total += spans[k].len;
    hr_pool_run(pool, hr_read_worker, &j);
    uint64_t s = 0;
    for (int k = 0; k < pool->n; k++) s += j.sum[k];
    return s;
}
