// modules: base
/* test-base: the thread pool's streaming read (hr_pool_read, the roofline of hearth bench
 * --roofline): every byte of every span read once, whatever the spans' lengths and alignment and
 * however many threads split them; hr_escape, which makes a peer's text safe to print; hr_median;
 * hr_cache_evict (the profiler's, src/plan: evicting leaves the bytes as they were, odd ends included);
 * hr_cpu_time_ns moves with work done. */
#include "test.h"

#include "base/pool.h"

static uint64_t serial_sum(const hr_span *sp, int n) {
    uint64_t s = 0;
    for (int k = 0; k < n; k++)
        for (size_t i = 0; i < sp[k].len; i++) s += ((const uint8_t *)sp[k].ptr)[i];
    return s;
}

static void test_pool_read(void) {
    size_t cap = 3u << 20;
    uint8_t *buf = malloc(cap);
    CHECK(buf != NULL);
    if (!buf) return;
    uint64_t rng = 0x2545f4914f6cdd1dULL;
    for (size_t i = 0; i < cap; i++) {
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
        buf[i] = (uint8_t)(rng >> 56) | 0x80; /* high bytes: a lane that overflowed would show */
    }
    /* spans of odd lengths at odd offsets, one empty, one of a single byte, one large */
    hr_span sp[] = {{buf + 1, 1000003}, {buf + 1000100, 0}, {buf + 1000107, 1}, {buf + 1000200, 77},
                    {buf + 1000333, 2000000}, {buf + 3000400, 63}};
    int n = (int)HR_ARRAY_LEN(sp);
    uint64_t want = serial_sum(sp, n);
    for (int nt = 1; nt <= 5; nt++) {
        hr_err err = {0};
        hr_pool *pool = hr_pool_create(nt, &err);
        CHECK(pool != NULL);
        if (!pool) continue;
        CHECKF(hr_pool_read(pool, sp, n) == want, "hr_pool_read on %d threads: wrong byte sum", nt);
        CHECKF(hr_pool_read(pool, sp, 1) == serial_sum(sp, 1), "hr_pool_read of one span on %d threads", nt);
        CHECKF(hr_pool_read(pool, sp + 2, 2) == serial_sum(sp + 2, 2), "hr_pool_read of 78 bytes on %d threads", nt);
        CHECKF(hr_pool_read(pool, sp, 0) == 0, "hr_pool_read of nothing on %d threads", nt);
        hr_pool_free(pool);
    }
    free(buf);
}

static void test_escape(void) {
    char out[64];
    const char evil[] = "a\nb\rc\x1b[31m\\d\x7f\xc2\x9b\xc3\xa9\0z";
    hr_escape(out, sizeof out, evil, sizeof evil - 1);
    /* controls, DEL, the backslash and a UTF-8 C1 escaped; printable UTF-8 (é) and the NUL's successor kept */
    CHECKF(!strcmp(out, "a\\x0ab\\x0dc\\x1b[31m\\x5cd\\x7f\\xc2\\x9b\xc3\xa9\\x00z"), "hr_escape gave '%s'", out);
    /* cut at cap, never inside an escape */
    char small[8];
    hr_escape(small, sizeof small, "ab\ncd", 5);
    CHECKF(!strcmp(small, "ab\\x0ac"), "hr_escape into 8 bytes gave '%s'", small);
    hr_escape(small, 6, "ab\ncd", 5);
    CHECKF(!strcmp(small, "ab"), "hr_escape into 6 bytes gave '%s'", small);
    hr_escape(small, 1, "ab", 2);
    CHECK(small[0] == 0);
}

static void test_median_evict_cpu(void) {
    double v[] = {5, 1, 4, 2, 3}, w[] = {2, 1}, one[] = {7};
    CHECK(hr_median(v, 5) == 3 && v[0] == 1 && v[4] == 5); /* sorted in place */
    CHECK(hr_median(w, 2) == 2);                          /* the upper of two */
    CHECK(hr_median(one, 1) == 7 && hr_median(one, 0) == 0);
    size_t n = (1u << 20) + 37;
    uint8_t *buf = malloc(n);
    CHECK(buf != NULL);
    if (!buf) return;
    uint64_t want = 0;
    for (size_t i = 0; i < n; i++) want += buf[i] = (uint8_t)(i * 131 + 7);
    bool done = hr_cache_evict(buf + 3, n - 3); /* unaligned start, odd length */
#if defined(__x86_64__) || defined(__aarch64__)
    CHECK(done);
#else
    (void)done;
#endif
    uint64_t got = 0;
    for (size_t i = 0; i < n; i++) got += buf[i];
    CHECK(got == want);
    int64_t c0 = hr_cpu_time_ns();
    volatile uint64_t spin = 0;
    int64_t t0 = hr_time_ns();
    while (hr_cpu_time_ns() - c0 < 2000000 && hr_time_ns() - t0 < 10000000000LL) spin++; /* a loaded machine: wait */
    CHECKF(hr_cpu_time_ns() - c0 >= 2000000, "10 s of spinning counted %.1f ms of CPU", (hr_cpu_time_ns() - c0) / 1e6);
    free(buf);
}

int main(void) {
    hr_init();
    test_pool_read();
    test_escape();
    test_median_evict_cpu();
    return test_summary();
}
