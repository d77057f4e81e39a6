/* membw — measures this machine's memory read bandwidth, the roofline of decoding (every weight is
 * read once per generated token). Reads a buffer much larger than the caches with T threads, each
 * summing its share, and reports the median of several passes in GB/s (10^9 bytes/s).
 *
 * With --huge the buffer is anonymous memory in 2 MiB pages (MADV_HUGEPAGE): fewer TLB misses,
 * as when a model's page-cache folios are mapped whole; on this project's machines 2-15% faster
 * than 4 KiB pages, so it is the roofline's upper figure.
 *
 * usage: membw [-t THREADS] [-s SIZE_MIB] [-r REPS] [--huge] [--json]
 */
#include "base/pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

int main(int argc, char **argv) {
    int threads = hr_physical_cores(), reps = 7;
    size_t mib = 1024;
    int json = 0, huge = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc) mib = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--huge")) huge = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: membw [-t THREADS] [-s SIZE_MIB (default 1024)] [-r REPS (default 7)] [--huge] [--json]\n"
                   "Median memory read bandwidth in GB/s (10^9 bytes/s) over REPS passes.\n"
                   "  --huge  read a buffer of 2 MiB pages (MADV_HUGEPAGE) instead of 4 KiB ones\n");
            return 0;
        } else { fprintf(stderr, "membw: unknown or incomplete option '%s'\n", argv[i]); return 2; }
    }
    if (threads < 1 || threads > 256 || mib < 16 || reps < 1 || reps > 1000) { fprintf(stderr, "membw: bad arguments\n"); return 2; }
    size_t n = mib * 1024 * 1024 / 8;
    uint64_t *buf = mmap(NULL, n * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) { fprintf(stderr, "membw: cannot allocate %zu MiB\n", mib); return 1; }
    if (madvise(buf, n * 8, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) && huge) {
        fprintf(stderr, "membw: this kernel gives no huge pages (MADV_HUGEPAGE failed)\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++) buf[i] = i;
    double *gbs = calloc((size_t)reps, sizeof *gbs);
    hr_err err = {0};
    hr_pool *pool = hr_pool_create(threads, &err);
    if (!gbs || !pool) { fprintf(stderr, "membw: %s\n", pool ? "out of memory" : err.msg); return 1; }
    const hr_span span = {buf, n * 8};
    for (int r = -1; r < reps; r++) { /* the same reader as hearth bench --roofline (hr_pool_read) */
        int64_t t0 = hr_time_ns();
        (void)hr_pool_read(pool, &span, 1);
        double s = (hr_time_ns() - t0) * 1e-9;
        if (r >= 0) gbs[r] = n * 8.0 / s / 1e9;
    }
    qsort(gbs, (size_t)reps, sizeof *gbs, cmpd);
    double med = gbs[reps / 2];
    if (json)
        printf("{\"threads\": %d, \"gb_per_s\": %.3f, \"size_mib\": %zu, \"reps\": %d, \"huge_pages\": %s}\n", threads, med,
               mib, reps, huge ? "true" : "false");
    else
        printf("memory read bandwidth: %.2f GB/s (%d threads, %zu MiB, %s pages, median of %d)\n", med, threads, mib,
               huge ? "2 MiB" : "4 KiB", reps);
    hr_pool_free(pool);
    free(gbs);
    munmap(buf, n * 8);
    return 0;
}
