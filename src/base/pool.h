/*
 * pool — a persistent thread pool for data-parallel kernels.  Prefix: hr_pool_.
 *
 * hr_pool_run(pool, fn, arg) calls fn(arg, ith, nth) on every thread (the caller is thread 0) and
 * returns when all have finished: the fork/join step of each operation of the forward pass. Workers
 * spin briefly on an atomic generation counter before sleeping on a condition variable, so the many
 * small operations of a decode step do not pay a futex wake each (a spin costs ~0.1 us; a wake ~5-50).
 * Not reentrant: one hr_pool_run at a time per pool.
 */
#ifndef HEARTH_POOL_H
#define HEARTH_POOL_H

#include "base.h"

typedef struct hr_pool hr_pool;
typedef void (*hr_pool_fn)(void *arg, int ith, int nth);

hr_pool *hr_pool_create(int n_threads, hr_err *err); /* n_threads >= 1 (including the caller) */
void     hr_pool_free(hr_pool *pool);
int      hr_pool_size(const hr_pool *pool);
void     hr_pool_run(hr_pool *pool, hr_pool_fn fn, void *arg);

/* A byte range to read. */
typedef struct hr_span { const void *ptr; size_t len; } hr_span;

/* Reads every byte of the n spans once, with all the pool's threads, each one contiguous share of
   their concatenation (an equal split of the bytes, as memory bandwidth benchmarks split a buffer),
   and returns the sum of the bytes (a checksum independent of the split). The pure streaming read of
   those bytes: the roofline a decode step, which reads the same weights once, is measured against
   (hearth bench --roofline). */
uint64_t hr_pool_read(hr_pool *pool, const hr_span *spans, int n);

/* [begin, end) of n items for thread ith of nth, in chunks aligned to `align` items */
static inline void hr_split(int64_t n, int ith, int nth, int64_t align, int64_t *begin, int64_t *end) {
    int64_t chunks = (n + align - 1) / align;
    int64_t per = chunks / nth, extra = chunks % nth;
    int64_t c0 = ith * per + (ith < extra ? ith : extra);
    int64_t c1 = c0 + per + (ith < extra ? 1 : 0);
    *begin = HR_MIN(n, c0 * align);
    *end = HR_MIN(n, c1 * align);
}

#endif
