/* plan/profile: a device measures itself (kernels per weight type, memory, CPU quota, disk) and caches
   the figures — see plan.h and docs/planner.md */
#include "plan.h"

#include "base/pool.h"
#include "quant/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/utsname.h>
#include <unistd.h>

/* the weight types every profile measures: those of the models hearth meets (a model's other types
   are costed at Q8_0's byte rate) */
static const int hpl_std_types[] = {HQ_TYPE_F16, HQ_TYPE_Q8_0, HQ_TYPE_Q4_0, HQ_TYPE_Q4_K, HQ_TYPE_Q5_K, HQ_TYPE_Q6_K};
#define HPL_BENCH_BYTES (32u << 20)   /* matrix size: beyond the caches, like a model's weights */
#define HPL_BENCH_COLS  4096
#define HPL_DISK_BYTES  (128u << 20) /* 32 MiB read 1.0 GB/s here, short of the 1.3 a long stream reaches */

hpl_profile_params hpl_profile_default_params(void) {
    return (hpl_profile_params){.bench_ms = 90, .mem.window = 2};
}

/* ---- small readers -------------------------------------------------------------------------------- */

static bool hpl_read_text(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = 0;
    return n > 0;
}

double hpl_parse_cpu_max(const char *text) {
    char a[32];
    double period = 0;
    if (sscanf(text, "%31s %lf", a, &period) != 2 || !strcmp(a, "max") || !(period > 0)) return 0;
    double quota = atof(a);
    return quota > 0 ? quota / period : 0;
}

/* the cgroup path of this process for controller `ctl` (v1) or the unified one (ctl NULL) */
static bool hpl_cgroup_path(const char *ctl, char *out, size_t cap) {
    char text[4096];
    if (!hpl_read_text("/proc/self/cgroup", text, sizeof text)) return false;
    for (char *line = text, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (nl) *nl = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c2 = 0;
        bool match = false;
        if (!ctl) match = !strcmp(line, "0") && c1[1] == 0;
        else {
            char *save = NULL;
            for (char *t = strtok_r(c1 + 1, ",", &save); t; t = strtok_r(NULL, ",", &save)) match |= !strcmp(t, ctl);
        }
        if (match && strlen(c2 + 1) < cap) { strcpy(out, c2 + 1); return true; }
    }
    return false;
}

/* The scheduler tick, ms: CONFIG_HZ from the running kernel's config in /boot (Debian, Ubuntu, Fedora
   install it there); 0 when it is not there (the cost model then takes HPL_TICK_DEFAULT_MS). A CPU quota is
   enforced when the tick finds the runtime spent, so a burst overruns it by up to a tick (docs/planner.md,
   "CPU quotas"). */
static double hpl_tick_ms(void) {
    struct utsname u;
    if (uname(&u)) return 0;
    char path[512], line[256];
    snprintf(path, sizeof path, "/boot/config-%s", u.release);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    double ms = 0;
    while (fgets(line, sizeof line, f)) {
        long hz;
        if (sscanf(line, "CONFIG_HZ=%ld", &hz) == 1 && hz >= 24 && hz <= 10000) {
            ms = 1000.0 / (double)hz;
            break;
        }
    }
    fclose(f);
    return ms;
}

/* the tightest CPU quota (cores) along the cgroup path, and its CFS period (ms); 0 = none */
static double hpl_cpu_limits(double *period_ms) {
    char cg[2048], dir[2600], f[2700], text[128];
    double best = 0, best_period = 0;
    /* v2: cpu.max from the process's cgroup up to the root; v1: cfs_quota_us / cfs_period_us */
    for (int v1 = 0; v1 < 2; v1++) {
        if (!hpl_cgroup_path(v1 ? "cpu" : NULL, cg, sizeof cg)) continue;
        const char *mnt = v1 ? "/sys/fs/cgroup/cpu" : "/sys/fs/cgroup";
        snprintf(dir, sizeof dir, "%s%s", mnt, cg);
        for (;;) {
            double q = 0, per = 0;
            if (!v1) {
                snprintf(f, sizeof f, "%s/cpu.max", dir);
                if (hpl_read_text(f, text, sizeof text)) {
                    q = hpl_parse_cpu_max(text);
                    if (sscanf(text, "%*s %lf", &per) != 1) per = 0;
                    per /= 1000;
                }
            } else {
                char t2[64];
                snprintf(f, sizeof f, "%s/cpu.cfs_quota_us", dir);
                if (hpl_read_text(f, text, sizeof text)) {
                    snprintf(f, sizeof f, "%s/cpu.cfs_period_us", dir);
                    if (hpl_read_text(f, t2, sizeof t2) && atof(text) > 0 && atof(t2) > 0) {
                        q = atof(text) / atof(t2);
                        per = atof(t2) / 1000;
                    }
                }
            }
            if (q > 0 && (best == 0 || q < best)) { best = q; best_period = per; }
            char *slash = strrchr(dir, '/');
            if (!slash || (size_t)(slash - dir) < strlen(mnt)) break;
            *slash = 0;
        }
    }
    /* tools/testbed exec runs in a network namespace whose /sys has no cgroup mounts: it passes the
       device's quota as TESTBED_CPUS and its period as TESTBED_CPU_PERIOD_MS (as TESTBED_MEM_LIMIT for
       memory, src/mem) */
    const char *env = getenv("TESTBED_CPUS");
    double q = env ? atof(env) : 0;
    if (q > 0 && (best == 0 || q < best)) {
        best = q;
        env = getenv("TESTBED_CPU_PERIOD_MS");
        best_period = env ? atof(env) : 0;
    }
    if (period_ms) *period_ms = best > 0 && best_period > 0 ? best_period : best > 0 ? HPL_CPU_PERIOD_DEFAULT_MS : 0;
    return best;
}

double hpl_cpu_quota(void) { return hpl_cpu_limits(NULL); }

static void hpl_cpu_model(char *out, size_t cap) {
    char text[16384];
    snprintf(out, cap, "?");
    if (!hpl_read_text("/proc/cpuinfo", text, sizeof text)) return;
    static const char *keys[] = {"model name", "CPU part", "Hardware"};
    for (size_t k = 0; k < HR_ARRAY_LEN(keys); k++) {
        char *p = strstr(text, keys[k]);
        if (!p || !(p = strchr(p, ':'))) continue;
        p++;
        while (*p == ' ' || *p == '\t') p++;
        size_t n = strcspn(p, "\n");
        snprintf(out, cap, "%.*s", (int)HR_MIN(n, cap - 1), p);
        return;
    }
}

/* the folder (or the file's folder) the disk figure is about */
static void hpl_disk_dir(const char *path, char *out, size_t cap) {
    struct stat st;
    if (path && !stat(path, &st) && S_ISDIR(st.st_mode)) { snprintf(out, cap, "%s", path); return; }
    if (path && strchr(path, '/')) {
        snprintf(out, cap, "%s", path);
        *strrchr(out, '/') = 0;
        if (!out[0]) snprintf(out, cap, "/");
        return;
    }
    snprintf(out, cap, ".");
}

/* the major:minor of the disk that holds path (the folder or the file's folder); false when unknown */
static bool hpl_disk_dev(const char *path, unsigned *maj, unsigned *min) {
    char dir[2048];
    struct stat st;
    hpl_disk_dir(path, dir, sizeof dir);
    *maj = *min = 0;
    if (stat(dir, &st)) return false;
    *maj = major(st.st_dev);
    *min = minor(st.st_dev);
    return true;
}

/* "boot id/major:minor" of the disk that holds path; "" when unknown */
static void hpl_disk_id(const char *path, char *out, size_t cap) {
    char boot[64] = "";
    unsigned maj, min;
    out[0] = 0;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = 0;
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = 0;
    if (boot[0] && hpl_disk_dev(path, &maj, &min)) snprintf(out, cap, "%.40s/%u:%u", boot, maj, min);
}

static int hpl_default_cache_file(char *buf, size_t cap, hr_err *err) {
    const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (x && *x) snprintf(buf, cap, "%s/hearth/profile.json", x);
    else if (home && *home) snprintf(buf, cap, "%s/.cache/hearth/profile.json", home);
    else return hr_fail(err, HR_ENOTFOUND, "neither XDG_CACHE_HOME nor HOME is set: no place for the profile cache");
    return 0;
}

int hpl_cache_file(const hpl_profile_params *p, const char *name, char *buf, size_t cap, hr_err *err) {
    char file[2048];
    if (p->cache_path) snprintf(file, sizeof file, "%s", p->cache_path);
    else if (hpl_default_cache_file(file, sizeof file, err)) return err->code;
    char *slash = strrchr(file, '/');
    if (slash) snprintf(buf, cap, "%.*s/%s", (int)(slash - file), file, name);
    else snprintf(buf, cap, "%s", name);
    return 0;
}

void hpl_json_save(const char *file, json_t *root) {
    char tmp[2200];
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", file, (long)getpid());
    if (!json_dump_file(root, tmp, JSON_INDENT(1)) && rename(tmp, file)) unlink(tmp);
}

int hpl_profile_key(int n_threads, const char *disk_path, char *buf, size_t cap, hr_err *err) {
    char cpu[128];
    hpl_cpu_model(cpu, sizeof cpu);
    hmem_sysmem sm;
    if (hmem_sysmem_read(&sm, err)) return err->code;
    uint64_t lim = sm.cgroup_limit;
    if (sm.env_limit && (!lim || sm.env_limit < lim)) lim = sm.env_limit;
    unsigned dmaj, dmin;
    hpl_disk_dev(disk_path, &dmaj, &dmin);
    snprintf(buf, cap, "v7|%s|cpus %ld|cores %d|simd %s|threads %d|quota %.2f|memtotal %" PRIu64 "|memlimit %" PRIu64
             "|disk %u:%u", cpu, sysconf(_SC_NPROCESSORS_ONLN), hr_physical_cores(), hq_simd_name(), n_threads,
             hpl_cpu_quota(), sm.mem_total, lim, dmaj, dmin);
    return 0;
}

/* ---- measurements ------------------------------------------------------------------------------------ */

/* The test matrix in 2 MiB pages where the kernel gives them, as a model's weights are mapped: the
   page cache maps a GGUF file's large folios with 2 MiB entries (FileHugePages in /proc/meminfo),
   while anonymous memory gets them only when asked (transparent_hugepage "madvise", this machine's
   setting). With 4 KiB pages the matvec read 10-25% slower per CPU-second than the decode does
   (more TLB misses; the hardware prefetchers stop at page boundaries). Zeroed; hpl_free_huge frees. */
#define HPL_HUGE (2u << 20)
static void *hpl_alloc_huge(size_t n) {
    size_t len = hr_pad(n, HPL_HUGE) + HPL_HUGE;
    uint8_t *raw = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    uint8_t *p = (uint8_t *)hr_pad((size_t)(uintptr_t)raw, HPL_HUGE);
    if (p > raw) munmap(raw, (size_t)(p - raw));
    size_t tail = len - (size_t)(p - raw) - hr_pad(n, HPL_HUGE);
    if (tail) munmap(p + hr_pad(n, HPL_HUGE), tail);
#ifdef MADV_HUGEPAGE
    madvise(p, hr_pad(n, HPL_HUGE), MADV_HUGEPAGE); /* a hint: 4 KiB pages where the kernel declines */
#endif
    return p;
}

static void hpl_free_huge(void *p, size_t n) {
    if (p) munmap(p, hr_pad(n, HPL_HUGE));
}

typedef struct hpl_bench {
    hr_pool *pool;
    const hq_traits *tr;
    hq_gemm_fn fn;
    const uint8_t *w;
    size_t bx, by;
    int64_t rows, cols;
    const uint8_t *y;
    int nc;
    float *s;
    const uint8_t *base;   /* several copies of the matrix, stride bytes apart: each pass reads the next */
    size_t stride;
    int ncopy, next;
} hpl_bench;

static void hpl_bench_worker(void *arg, int ith, int nth) {
    hpl_bench *b = arg;
    int64_t r0, r1;
    hr_split(b->rows, ith, nth, HQ_BAND, &r0, &r1);
    for (int64_t r = r0; r < r1; r += HQ_BAND) {
        int nr = (int)HR_MIN(HQ_BAND, r1 - r);
        b->fn((int)b->cols, b->s + r, (size_t)b->rows, b->w + (size_t)r * b->bx, b->bx, nr, b->y, b->by, b->nc);
    }
}

typedef struct hpl_cpu_share {
    double n;   /* the cores the threads get */
    bool quota; /* n is a binding CPU quota */
} hpl_cpu_share;

/* How a device's rate on one kernel is timed, bytes/ns: pass by pass, the median of the passes.
   - Each pass reads its matrix from memory, as a decode reads a model's weights: the matrix is evicted
     from the caches first (hr_cache_evict). A 32 MiB matrix sits in a large L3 (300 MiB on the
     machine of docs/planner.md), and read from there it ran 3x a real decode.
   - Under a binding CFS quota (quota < threads) a pass's time is its CPU time / quota: the quota counts
     the same whether the pass fell inside a period's unused quota (wall time alone: the unthrottled
     speed) or across a throttled stretch. Not the wall time: the cache eviction before each pass spends
     the same quota, and the throttling it causes lands on the pass (klonet8, 0.25 core at 10 ms
     periods: max(wall, CPU / quota) read 1.58 GB/s where a decode runs 666 MiB in 88 ms of CPU, 1.98 at
     the quota). Without a quota: max(wall, CPU time / threads), as a shared core's steal shows in wall.
   - The median, not the best: the best of short runs caught moments a device cannot sustain, and the
     profiles of one device moved 2-3x from one minute to the next.
   hpl_time_passes times passes for about ms (at least min_passes), appending their rates to rate[]. */
#define HPL_MIN_PASSES 3
#define HPL_MAX_PASSES 64
static void hpl_time_passes(void (*pass)(void *), void *arg, int ms, int min_passes, double bytes_per_pass,
                            const void *evict, size_t evict_len, hpl_cpu_share cores, double *rate, int *n, int cap) {
    const int64_t start = hr_time_ns(), budget = (int64_t)ms * 1000000;
    for (int k = 0; *n < cap && (k < min_passes || hr_time_ns() - start < budget); k++) {
        if (evict) hr_cache_evict(evict, evict_len);
        int64_t w0 = hr_time_ns(), c0 = hr_cpu_time_ns();
        pass(arg);
        int64_t w1 = hr_time_ns(), c1 = hr_cpu_time_ns();
        double cpu = (double)(c1 - c0) / cores.n, t = cores.quota ? cpu : HR_MAX((double)(w1 - w0), cpu);
        rate[(*n)++] = bytes_per_pass / HR_MAX(t, 1.0);
    }
}

/* one kernel's rate in one stretch: a warm-up pass (page faults, the threads' first wake), then passes
   for ms; the median */
static double hpl_run_for(void (*pass)(void *), void *arg, int ms, double bytes_per_pass, const void *evict,
                          size_t evict_len, hpl_cpu_share cores) {
    double rate[HPL_MAX_PASSES];
    int n = 0;
    pass(arg);
    hpl_time_passes(pass, arg, ms, HPL_MIN_PASSES, bytes_per_pass, evict, evict_len, cores, rate, &n, HPL_MAX_PASSES);
    return hr_median(rate, n);
}

/* the cores a device's threads get: its thread count, or its CPU quota when that is lower */
static hpl_cpu_share hpl_cores(int n_threads) {
    double q = hpl_cpu_quota();
    return q > 0 && q < n_threads ? (hpl_cpu_share){q, true} : (hpl_cpu_share){(double)n_threads, false};
}

static void hpl_bench_pass(void *arg) {
    hpl_bench *b = arg;
    if (b->ncopy > 1) b->w = b->base + b->stride * (size_t)(b->next++ % b->ncopy);
    hr_pool_run(b->pool, hpl_bench_worker, b);
}

/* One weight type in one layout (packed, or the file's), measured by hpl_bench_kernels. */
typedef struct hpl_kjob {
    const hq_traits *tr;
    hq_gemm_fn fn;
    uint8_t *band;   /* HQ_BAND rows in the layout, copied over the whole test matrix before each turn */
    uint8_t *y;      /* HPL_MATMUL_ROWS activation rows as the kernel takes them */
    size_t bx, by;
    int64_t rows;    /* the test matrix's rows for this type: HPL_BENCH_BYTES of them, whole bands */
    double *out_mv, *out_mm;
    double mv[HPL_MAX_PASSES], mm[HPL_MAX_PASSES];
    int n_mv, n_mm;
} hpl_kjob;

/* The rounds a kernel's figure is spread over. The memory-bound figures (matvec) of a device under a
   quota on a shared host moved with the host's load, which changes over half-seconds: 90 ms at a
   stretch, type after type, read d1 of home4-8b-small (0.4 core) at Q4_K 7.1-12.1 GB/s in 8 profiles
   of a minute (session 28), session 27's profile 39% below session 26's, and a type's packed and mapped
   figures came from different moments (d3: 2.6 mapped, 8.5 packed). Every job takes a turn in every
   round, so each figure's median is over passes from the whole kernel phase, at moments every figure
   shares. */
#define HPL_ROUNDS 5

/* A decode reads a model's weights: hundreds of MiB, each byte once a token. The test matrix is 32 MiB,
   read again and again, evicted from the caches before each pass; on the AMD EPYC VM of session 33 (32 MiB
   L3) its matvec read 14-30% faster than a decode of the 1B Q4_0 model did in the same minutes, both under
   a testbed quota and without (29-32 GB/s at one thread against a decode's 22-24), while the same kernel
   over 256 MiB of copies, a pass on each in turn, read within 3-6% of the decode. Whatever the cause (the
   VM's nested page tables, the host's caches), it is the footprint's: so the first layout's matvec is also
   timed over copies of its matrix filling up to HPL_FOOT_BYTES (a quarter of the device's budget at most),
   and every layout's matvec figure is scaled by the ratio of the two (hpl_bench_kernels; at most 1: a
   decode never reads faster than the test). */
#define HPL_FOOT_BYTES (256u << 20)

/* the footprint's bytes on this device (whole test matrices, at least two of them; 0: none) */
static size_t hpl_foot_bytes(void) {
    hmem_sysmem sm;
    hr_err e = {0};
    if (hmem_sysmem_read(&sm, &e)) return 0;
    const uint64_t quarter = hmem_default_budget(&sm) / 4;
    const size_t n = (size_t)HR_MIN((uint64_t)HPL_FOOT_BYTES, quarter) / HPL_BENCH_BYTES * HPL_BENCH_BYTES;
    return n >= 2 * (size_t)HPL_BENCH_BYTES ? n : 0;
}

/* the jobs' matvec and matmul rates, bytes/ns, into *out_mv / *out_mm; w: the test matrix
   (HPL_BENCH_BYTES), s: the results (the most rows x HPL_MATMUL_ROWS); foot: foot_n bytes for the
   footprint's copies of job 0's matrix (NULL: none) */
static void hpl_bench_kernels(hr_pool *pool, hpl_kjob *job, int n_jobs, uint8_t *w, float *s, int ms, hpl_cpu_share cores,
                              uint8_t *foot, size_t foot_n) {
    /* each turn takes at most its share of a job's HPL_MAX_PASSES, so that a fast device's early rounds
       do not use them all */
    const int turn = HR_MAX(1, ms / HPL_ROUNDS), per_turn = HPL_MAX_PASSES / HPL_ROUNDS;
    double fr[HPL_MAX_PASSES];
    int n_fr = 0;
    const size_t mat0 = (size_t)job[0].rows * job[0].bx;
    const int copies = foot ? (int)(foot_n / mat0) : 0;
    if (copies >= 2) { /* job 0's band over the footprint, once */
        const size_t band = (size_t)HQ_BAND * job[0].bx;
        memcpy(foot, job[0].band, band);
        for (size_t at = band, all = mat0 * (size_t)copies; at < all; at += HR_MIN(at, all - at))
            memcpy(foot + at, foot, HR_MIN(at, all - at));
    }
    for (int r = 0; r < HPL_ROUNDS; r++)
        for (int j = 0; j < n_jobs; j++) {
            hpl_kjob *k = &job[j];
            const int64_t rows = k->rows;
            const size_t band = (size_t)HQ_BAND * k->bx;
            memcpy(w, k->band, band);
            for (size_t at = band, all = (size_t)rows * k->bx; at < all; at += HR_MIN(at, all - at))
                memcpy(w + at, w, HR_MIN(at, all - at));
            hpl_bench b = {.pool = pool, .tr = k->tr, .fn = k->fn, .w = w, .bx = k->bx, .by = k->by, .rows = rows,
                           .cols = HPL_BENCH_COLS, .y = k->y, .nc = 1, .s = s};
            if (r == 0) hpl_bench_pass(&b); /* warm-up: the threads' first wake, the kernel's code */
            const int min = r == 0 ? 1 : 0;
            hpl_time_passes(hpl_bench_pass, &b, turn, min, (double)rows * (double)k->bx, w, (size_t)rows * k->bx, cores,
                            k->mv, &k->n_mv, k->n_mv + per_turn);
            if (j == 0 && copies >= 2) { /* the same kernel over the footprint: a copy a pass, nothing evicted */
                hpl_bench f = b;
                f.base = foot;
                f.stride = mat0;
                f.ncopy = copies;
                f.next = r * per_turn;
                hpl_time_passes(hpl_bench_pass, &f, turn, min, (double)mat0, NULL, 0, cores, fr, &n_fr, n_fr + per_turn);
            }
            /* prefill: compute-bound (each weight byte serves 32 rows), so a quarter of the matrix gives the
               same rate in a quarter of the time of a pass — which, at 1 thread, is longer than a turn */
            b.nc = HPL_MATMUL_ROWS;
            b.rows = HR_MAX(HQ_BAND, rows / 4 / HQ_BAND * HQ_BAND);
            hpl_time_passes(hpl_bench_pass, &b, turn, min, (double)b.rows * (double)k->bx * HPL_MATMUL_ROWS, w,
                            (size_t)b.rows * k->bx, cores, k->mm, &k->n_mm, k->n_mm + per_turn);
        }
    double scale = 1;
    if (n_fr > 0 && job[0].n_mv > 0) {
        const double test = hr_median(job[0].mv, job[0].n_mv), wide = hr_median(fr, n_fr);
        scale = test > 0 ? HR_MAX(0.5, HR_MIN(1.0, wide / test)) : 1;
        HR_LOGD("profile: the first layout's matvec over %d copies (%.0f MiB) at %.2f GB/s, the test matrix at %.2f: "
                "figures x %.3f", copies, (double)(mat0 * (size_t)copies) / 1048576.0, wide, test, scale);
    }
    for (int j = 0; j < n_jobs; j++) {
        *job[j].out_mv = hr_median(job[j].mv, job[j].n_mv) * scale;
        *job[j].out_mm = hr_median(job[j].mm, job[j].n_mm);
    }
}

/* one HQ_BAND of small random values in type's layout (packed or not) and its activations; 0 or an error */
static int hpl_kjob_init(hpl_kjob *k, int type, bool packed, hpl_type_speed *out, hr_err *err) {
    const hq_traits *tr = hq_get_traits(type), *vt = hq_get_traits(tr->vec_dot_type);
    const int64_t cols = HPL_BENCH_COLS;
    const size_t bx = hq_row_size(type, cols), vrow = hq_row_size(tr->vec_dot_type, cols);
    const size_t by = packed && tr->prep ? tr->prep_size(cols) : vrow;
    *k = (hpl_kjob){.tr = tr, .fn = packed ? tr->gemm_packed : tr->gemm, .bx = bx, .by = by,
                    .rows = (int64_t)(HPL_BENCH_BYTES / bx) / HQ_BAND * HQ_BAND};
    k->band = hr_alloc_aligned((size_t)HQ_BAND * bx, 64);
    k->y = hr_alloc_aligned(HR_MAX(by, vrow) * HPL_MATMUL_ROWS, 64);
    uint8_t *src = hr_alloc_aligned((size_t)HQ_BAND * bx, 64), *vq = hr_alloc_aligned(vrow, 64);
    float *f = hr_alloc_aligned((size_t)cols * sizeof(float), 64);
    int rc = 0;
    if (!k->band || !k->y || !src || !vq || !f) { rc = hr_fail(err, HR_ENOMEM, "profile: out of memory"); goto done; }
    /* one quantized row of small random values, repeated: realistic scales, no NaN */
    uint64_t r = 0x9e3779b97f4a7c15ULL;
    for (int64_t i = 0; i < cols; i++) {
        r ^= r << 13; r ^= r >> 7; r ^= r << 17;
        f[i] = (float)((int64_t)(r % 2001) - 1000) * 1e-4f;
    }
    if (type == HQ_TYPE_F32) memcpy(src, f, bx);
    else tr->from_float_ref(f, src, cols);
    for (int i = 1; i < HQ_BAND; i++) memcpy(src + (size_t)i * bx, src, bx);
    if (tr->vec_dot_type == HQ_TYPE_F32) memcpy(vq, f, vrow);
    else vt->from_float(f, vq, cols);
    if (packed) tr->pack(k->band, src, bx, cols, HQ_BAND);
    else memcpy(k->band, src, (size_t)HQ_BAND * bx);
    for (int j = 0; j < HPL_MATMUL_ROWS; j++) {
        if (packed && tr->prep) tr->prep(k->y + (size_t)j * by, vq, cols);
        else memcpy(k->y + (size_t)j * by, vq, vrow);
    }
    out->type = type;
    k->out_mv = packed ? &out->matvec_gbps : &out->matvec_map_gbps;
    k->out_mm = packed ? &out->matmul_gbps : &out->matmul_map_gbps;
done:
    hr_free_aligned(src);
    hr_free_aligned(vq);
    hr_free_aligned(f);
    return rc;
}

/* matvec and matmul speed of the weight types in mask with the kernels the engine runs: packed when the
   type packs, as loaded weights are; and in the file's layout, as a device that computes from the
   mapping runs them (hpl_type_speed.matvec_map_gbps). Appended to out[*n] (at most cap). */
static int hpl_bench_types(hr_pool *pool, uint32_t mask, int ms, hpl_cpu_share cores, hpl_type_speed *out, int *n, int cap,
                           hr_err *err) {
    const int64_t t0 = hr_time_ns();
    hpl_kjob job[2 * 32];
    int n_jobs = 0, first = *n, rc = 0;
    for (int t = 0; t < 32 && !rc; t++) {
        if (!(mask >> t & 1) || !hq_type_valid(t) || *n >= cap) continue;
        const hq_traits *tr = hq_get_traits(t);
        if (!tr || !hq_get_traits(tr->vec_dot_type)) { rc = hr_fail(err, HR_EUNSUPPORTED, "profile: type %d", t); break; }
        const size_t bx = hq_row_size(t, HPL_BENCH_COLS);
        const int64_t rows = (int64_t)(HPL_BENCH_BYTES / bx) / HQ_BAND * HQ_BAND;
        const bool packed = tr->gemm_packed && hq_pack_ok(t, HPL_BENCH_COLS, rows);
        hpl_type_speed *ts = &out[(*n)++];
        *ts = (hpl_type_speed){.type = t};
        for (int pk = packed; pk >= 0 && !rc; pk--) rc = hpl_kjob_init(&job[n_jobs++], t, pk, ts, err);
        if (!packed) { /* one layout: its figures are the packed ones, copied to the mapped ones below */
            job[n_jobs - 1].out_mv = &ts->matvec_gbps;
            job[n_jobs - 1].out_mm = &ts->matmul_gbps;
        }
    }
    int64_t rows_max = 0;
    for (int j = 0; j < n_jobs; j++) rows_max = HR_MAX(rows_max, job[j].rows);
    uint8_t *w = rc || !n_jobs ? NULL : hpl_alloc_huge(HPL_BENCH_BYTES);
    const size_t foot_n = rc || !n_jobs ? 0 : hpl_foot_bytes();
    uint8_t *foot = foot_n ? hpl_alloc_huge(foot_n) : NULL;   /* none: the test matrix's figures as they are */
    float *s = rc || !n_jobs ? NULL : hr_alloc_aligned((size_t)rows_max * HPL_MATMUL_ROWS * sizeof(float), 64);
    if (!rc && n_jobs && (!w || !s)) rc = hr_fail(err, HR_ENOMEM, "profile: out of memory");
    if (!rc && n_jobs) hpl_bench_kernels(pool, job, n_jobs, w, s, ms, cores, foot, foot_n);
    for (int i = first; !rc && i < *n; i++) {
        hpl_type_speed *ts = &out[i];
        if (ts->matvec_map_gbps <= 0) { /* a type that does not pack: one layout, both figures */
            ts->matvec_map_gbps = ts->matvec_gbps;
            ts->matmul_map_gbps = ts->matmul_gbps;
        } else {
            /* the kernels pack a type because its packed layout computes faster: a mapped figure above the
               packed one is noise (home4-8b-tiny's d0 at 0.5 core, session 27: Q4_K 7.0 packed, 8.5 mapped) */
            ts->matvec_map_gbps = HR_MIN(ts->matvec_map_gbps, ts->matvec_gbps);
            ts->matmul_map_gbps = HR_MIN(ts->matmul_map_gbps, ts->matmul_gbps);
        }
    }
    hpl_free_huge(w, HPL_BENCH_BYTES);
    hpl_free_huge(foot, foot_n);
    hr_free_aligned(s);
    for (int j = 0; j < n_jobs; j++) {
        hr_free_aligned(job[j].band);
        hr_free_aligned(job[j].y);
    }
    HR_LOGD("profile: kernels of %d types in %d layouts: %.0f ms", *n - first, n_jobs, (hr_time_ns() - t0) / 1e6);
    return rc;
}

typedef struct hpl_read {
    hr_pool *pool;
    hr_span sp;
    uint64_t sum;
} hpl_read;

static void hpl_read_pass(void *arg) {
    hpl_read *r = arg;
    r->sum += hr_pool_read(r->pool, &r->sp, 1);
}

/* the rate the device's threads read memory at (from memory, not the caches, as hpl_run_for says) */
static double hpl_bench_membw(hr_pool *pool, int ms, hpl_cpu_share cores) {
    const size_t n = 64u << 20;
    uint8_t *buf = hpl_alloc_huge(n);
    if (!buf) return 0;
    memset(buf, 1, n);
    hpl_read r = {pool, {buf, n}, 0};
    double v = hpl_run_for(hpl_read_pass, &r, ms, (double)n, buf, n, cores);
    hpl_free_huge(buf, n);
    return r.sum ? v : 0;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14; older kernels answer EINVAL and the pages are touched instead */
#endif

/* reads [off, off+len) of fd after dropping it from the page cache, the way the residency manager's
   loader streams (src/mem, load_range): the range mapped, then made resident 16 MiB at a time with
   MADV_POPULATE_READ (the fault path's readahead, large folios), or a read per page where the kernel
   lacks it. Until session 22 this was 4 MiB preads with WILLNEED ahead: 0.9-1.3 GB/s on the testbed's
   disk, where the loader streams at 1.6-1.7 (docs/planner.md). bytes/ns; off is page-aligned. *cpu: the
   process CPU time it took, ns per byte, from the first drop to the last (the loader drops what it has
   streamed too) */
static double hpl_cold_read(int fd, off_t off, size_t len, double *cpu) {
    const int64_t c0 = hr_cpu_time_ns();
    *cpu = 0;
    posix_fadvise(fd, off, (off_t)len, POSIX_FADV_DONTNEED);
    uint8_t *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, off);
    if (p == MAP_FAILED) return 0;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, len, MADV_HUGEPAGE); /* as the loader's mapping (src/mem, hmem_create) */
#endif
    const size_t chunk = 16u << 20, page = (size_t)sysconf(_SC_PAGESIZE);
    bool ok = true, populate = true;
    int64_t t0 = hr_time_ns();
    for (size_t at = 0; ok && at < len; at += chunk) {
        size_t n = HR_MIN(chunk, len - at);
        if (populate && !madvise(p + at, n, MADV_POPULATE_READ)) continue;
        if (populate && errno != EINVAL) { ok = false; break; }
        populate = false;
        volatile const uint8_t *q = p + at;
        uint8_t acc = 0;
        for (size_t o = 0; o < n; o += page) acc ^= q[o];
        (void)acc;
    }
    int64_t t1 = hr_time_ns();
    munmap(p, len);
    posix_fadvise(fd, off, (off_t)len, POSIX_FADV_DONTNEED);
    if (ok) *cpu = (double)(hr_cpu_time_ns() - c0) / (double)len;
    return ok && t1 > t0 ? (double)len / (double)(t1 - t0) : 0;
}

/* cold read speed of the disk holding path: HPL_DISK_BYTES of the file itself when it is that large,
   else of a file written (and synced) for the purpose in its folder; 0 when neither can be done */
/* the better of two cold reads; *cpu_ms_gb: the smaller CPU figure (what else the process did in one of
   them only adds to it) */
static double hpl_cold_reads(int fd, off_t off, size_t len, double *cpu_ms_gb) {
    double c1, c2, v = HR_MAX(hpl_cold_read(fd, off, len, &c1), hpl_cold_read(fd, off, len, &c2));
    *cpu_ms_gb = (c1 > 0 && c2 > 0 ? HR_MIN(c1, c2) : HR_MAX(c1, c2)) * 1e3;   /* ns/byte = 1e3 ms/GB */
    return v;
}

static double hpl_bench_disk(const char *path, double *cpu_ms_gb) {
    *cpu_ms_gb = 0;
    struct stat st;
    if (path && !stat(path, &st) && S_ISREG(st.st_mode) && st.st_size >= (off_t)(HPL_DISK_BYTES / 2)) {
        int fd = open(path, O_RDONLY);
        if (fd < 0) return 0;
        size_t len = (size_t)HR_MIN((off_t)HPL_DISK_BYTES, st.st_size);
        off_t at = (st.st_size - (off_t)len) / 2 / 4096 * 4096;
        double v = hpl_cold_reads(fd, at, len, cpu_ms_gb);
        close(fd);
        return v;
    }
    char dir[2048], tmp[2200];
    hpl_disk_dir(path, dir, sizeof dir);
    snprintf(tmp, sizeof tmp, "%s/.hearth-disk-probe.%ld", dir, (long)getpid());
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return 0;
    unlink(tmp);
    double v = 0;
    uint8_t *buf = malloc(1u << 20);
    bool ok = buf != NULL;
    for (size_t i = 0; ok && i < HPL_DISK_BYTES; i += 1u << 20) {
        for (size_t j = 0; j < (1u << 20); j += 8) memcpy(buf + j, &(uint64_t){i + j}, 8); /* not zeros: no sparse tricks */
        ok = write(fd, buf, 1u << 20) == (ssize_t)(1u << 20);
    }
    free(buf);
    if (ok && !fsync(fd)) v = hpl_cold_reads(fd, 0, HPL_DISK_BYTES, cpu_ms_gb);
    close(fd);
    return v;
}

/* ---- cache (JSON) -------------------------------------------------------------------------------------- */

static json_t *hpl_device_to_json(const hpl_device *d, bool speeds_only) {
    json_t *o = json_object(), *ts = json_array();
    if (!speeds_only) {
        json_object_set_new(o, "name", json_string(d->name));
        json_object_set_new(o, "mem_total", json_integer((json_int_t)d->mem_total));
        json_object_set_new(o, "mem_available", json_integer((json_int_t)d->mem_available));
        json_object_set_new(o, "mem_limit", json_integer((json_int_t)d->mem_limit));
        json_object_set_new(o, "mem_usable", json_integer((json_int_t)d->mem_usable));
        json_object_set_new(o, "budget", json_integer((json_int_t)d->budget));
        json_object_set_new(o, "budget_set", json_boolean(d->budget_set));
        json_object_set_new(o, "cached", json_boolean(d->cached));
        json_object_set_new(o, "profile_ms", json_real(d->profile_ms));
        json_object_set_new(o, "disk_id", json_string(d->disk_id));
    }
    json_object_set_new(o, "threads", json_integer(d->n_threads));
    json_object_set_new(o, "cpu_quota", json_real(d->cpu_quota));
    json_object_set_new(o, "cpu_period_ms", json_real(d->cpu_period_ms));
    json_object_set_new(o, "tick_ms", json_real(d->tick_ms));
    json_object_set_new(o, "mem_bw_gbps", json_real(d->mem_bw_gbps));
    json_object_set_new(o, "disk_gbps", json_real(d->disk_gbps));
    if (d->disk_cpu_ms_gb > 0) json_object_set_new(o, "disk_cpu_ms_per_gb", json_real(d->disk_cpu_ms_gb));
    for (int i = 0; i < d->n_types; i++) {
        json_t *t = json_object();
        json_object_set_new(t, "type", json_string(hq_type_name(d->ts[i].type)));
        json_object_set_new(t, "matvec_gbps", json_real(d->ts[i].matvec_gbps));
        json_object_set_new(t, "matmul_gbps", json_real(d->ts[i].matmul_gbps));
        if (d->ts[i].matvec_map_gbps > 0) json_object_set_new(t, "matvec_map_gbps", json_real(d->ts[i].matvec_map_gbps));
        if (d->ts[i].matmul_map_gbps > 0) json_object_set_new(t, "matmul_map_gbps", json_real(d->ts[i].matmul_map_gbps));
        json_array_append_new(ts, t);
    }
    json_object_set_new(o, "types", ts);
    return o;
}

char *hpl_device_json(const hpl_device *d) {
    json_t *o = hpl_device_to_json(d, false);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

static bool hpl_speeds_from_json(json_t *o, hpl_device *d) {
    json_t *ts = json_object_get(o, "types");
    if (!json_is_array(ts) || json_array_size(ts) > HPL_MAX_TYPES) return false;
    d->mem_bw_gbps = json_number_value(json_object_get(o, "mem_bw_gbps"));
    d->disk_gbps = json_number_value(json_object_get(o, "disk_gbps"));
    d->disk_cpu_ms_gb = json_number_value(json_object_get(o, "disk_cpu_ms_per_gb")); /* 0 when absent */
    d->n_types = 0;
    for (size_t i = 0; i < json_array_size(ts); i++) {
        json_t *t = json_array_get(ts, i);
        int type = hq_type_from_name(json_string_value(json_object_get(t, "type")) ? json_string_value(json_object_get(t, "type")) : "");
        double mv = json_number_value(json_object_get(t, "matvec_gbps")), mm = json_number_value(json_object_get(t, "matmul_gbps"));
        if (type < 0 || !(mv > 0) || !(mm > 0)) return false;
        /* the mapping's speeds are optional (saved before session 27: costed as the packed ones) */
        double mvm = json_number_value(json_object_get(t, "matvec_map_gbps")), mmm = json_number_value(json_object_get(t, "matmul_map_gbps"));
        d->ts[d->n_types++] = (hpl_type_speed){type, mv, mm, isfinite(mvm) && mvm > 0 ? mvm : 0, isfinite(mmm) && mmm > 0 ? mmm : 0};
    }
    return d->n_types > 0 && d->mem_bw_gbps > 0;
}

/* ---- a saved cluster (`hearth plan --json`'s devices and links) ------------------------------------------- */

static bool hpl_json_num(json_t *o, const char *key, double lo, double hi, double *v) {
    json_t *x = json_object_get(o, key);
    if (!json_is_number(x)) return false;
    *v = json_number_value(x);
    return isfinite(*v) && *v >= lo && *v <= hi;
}

static int hpl_cluster_device_json(const char *path, json_t *o, int i, hpl_cluster *c, hr_err *err) {
    hpl_device *d = &c->dev[i];
    memset(d, 0, sizeof *d);
    static const char *const mem_keys[] = {"mem_total", "mem_available", "mem_limit", "mem_usable", "budget"};
    uint64_t *mem[] = {&d->mem_total, &d->mem_available, &d->mem_limit, &d->mem_usable, &d->budget};
    double v;
    for (int k = 0; k < 5; k++) {
        if (!hpl_json_num(o, mem_keys[k], 0, 1e18, &v)) return hr_fail(err, HR_EINVAL, "%s: device %d: no %s (bytes)", path, i, mem_keys[k]);
        *mem[k] = (uint64_t)v;
    }
    if (!hpl_json_num(o, "threads", 1, 4096, &v)) return hr_fail(err, HR_EINVAL, "%s: device %d: no threads (1 or more)", path, i);
    d->n_threads = (int)v;
    if (!hpl_json_num(o, "cpu_quota", 0, 4096, &d->cpu_quota) || !hpl_json_num(o, "cpu_period_ms", 0, 1e6, &d->cpu_period_ms))
        return hr_fail(err, HR_EINVAL, "%s: device %d: no cpu_quota / cpu_period_ms (0: none)", path, i);
    if (!hpl_json_num(o, "tick_ms", 0, 1000, &d->tick_ms)) d->tick_ms = 0;   /* saved before session 25: unknown */
    if (!hpl_speeds_from_json(o, d) || !(d->disk_gbps >= 0) || !(d->disk_cpu_ms_gb >= 0 && d->disk_cpu_ms_gb < 1e6))
        return hr_fail(err, HR_EINVAL, "%s: device %d: no speeds (types: [{type, matvec_gbps, matmul_gbps}], mem_bw_gbps, "
                       "disk_gbps; disk_cpu_ms_per_gb >= 0 if given)", path, i);
    d->budget_set = json_is_true(json_object_get(o, "budget_set"));
    d->cached = true;
    const char *disk = json_string_value(json_object_get(o, "disk_id"));   /* saved before session 27: none */
    snprintf(d->disk_id, sizeof d->disk_id, "%s", disk ? disk : "");
    const char *name = json_string_value(json_object_get(o, "name")), *addr = json_string_value(json_object_get(o, "address"));
    snprintf(d->name, sizeof d->name, "%s", name ? name : "");
    snprintf(c->addr[i], sizeof c->addr[i], "%s", addr ? addr : i ? "worker" : "head");
    return 0;
}

int hpl_cluster_read(const char *path, hpl_cluster *out, hr_err *err) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) return hr_fail(err, HR_EIO, "%s: %s", path, strerror(errno));
    json_error_t je;
    json_t *root = json_loadf(f, 0, &je);
    fclose(f);
    if (!root) return hr_fail(err, HR_EINVAL, "%s: not JSON (line %d: %s)", path, je.line, je.text);
    int rc = 0;
    json_t *devs = json_object_get(root, "devices"), *links = json_object_get(root, "links");
    size_t n = json_array_size(devs);
    if (!json_is_array(devs) || n < 1 || n > HPL_MAX_DEVICES || !json_is_array(links)) {
        rc = hr_fail(err, HR_EINVAL, "%s: want `hearth plan --json`'s output: \"devices\" (1 to %d) and \"links\"", path,
                     HPL_MAX_DEVICES);
        goto done;
    }
    out->n = (int)n;
    for (size_t i = 0; i < n && !rc; i++) rc = hpl_cluster_device_json(path, json_array_get(devs, i), (int)i, out, err);
    bool have[HPL_MAX_DEVICES][HPL_MAX_DEVICES] = {{false}};
    for (size_t k = 0; k < json_array_size(links) && !rc; k++) {
        json_t *o = json_array_get(links, k);
        double a, b;
        hpl_link l = {0};
        double samples = 0;
        if (!hpl_json_num(o, "a", 0, (double)n - 1, &a) || !hpl_json_num(o, "b", 0, (double)n - 1, &b) || a == b ||
            a != floor(a) || b != floor(b) || !hpl_json_num(o, "rtt_ms", 0, 1e6, &l.rtt_ms) ||
            !hpl_json_num(o, "gbps", 1e-9, 1e6, &l.gbps) || !hpl_json_num(o, "loss", 0, 1, &l.loss)) {
            rc = hr_fail(err, HR_EINVAL, "%s: link %zu: want a and b (device indices), rtt_ms, gbps (> 0), loss (0..1)", path, k);
            break;
        }
        if (!hpl_json_num(o, "loss_ab", 0, 1, &l.loss_to)) l.loss_to = l.loss;
        if (!hpl_json_num(o, "loss_ba", 0, 1, &l.loss_from)) l.loss_from = l.loss;
        if (!hpl_json_num(o, "gbps_measured", 1e-9, 1e6, &l.gbps_measured)) l.gbps_measured = l.gbps;
        if (hpl_json_num(o, "loss_samples", 0, 1e9, &samples)) l.loss_samples = (int)samples;
        l.estimated = json_is_true(json_object_get(o, "estimated"));
        l.cached = json_is_true(json_object_get(o, "cached"));
        hpl_link_both(out, (int)a, (int)b, l);
        have[(int)a][(int)b] = have[(int)b][(int)a] = true;
    }
    for (int a = 0; a < out->n && !rc; a++)
        for (int b = a + 1; b < out->n && !rc; b++)
            if (!have[a][b]) rc = hr_fail(err, HR_EINVAL, "%s: no link between devices %d and %d", path, a, b);
done:
    json_decref(root);
    return rc;
}

/* the cached speeds for key, if any */
static bool hpl_cache_get(const char *file, const char *key, hpl_device *d) {
    json_t *root = json_load_file(file, 0, NULL);
    bool ok = false;
    if (root) {
        json_t *e = json_object_get(json_object_get(root, "entries"), key);
        ok = json_is_object(e) && hpl_speeds_from_json(e, d);
        json_decref(root);
    }
    return ok;
}

/* makes the folders on the way to file (the cache may be new) */
static void hpl_mkdirs_for(const char *file) {
    char dir[2048];
    snprintf(dir, sizeof dir, "%s", file);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return;
    *slash = 0;
    for (char *q = dir + 1; *q; q++)
        if (*q == '/') { *q = 0; mkdir(dir, 0755); *q = '/'; }
    mkdir(dir, 0755);
}

/* writes the speeds under key (the file keeps at most 16 keys: the machine's thread counts, disks);
   a private name, then a rename, so two processes never see half a file */
static void hpl_cache_put(const char *file, const char *key, const hpl_device *d) {
    json_t *root = json_load_file(file, 0, NULL);
    if (!json_is_object(root)) { json_decref(root); root = json_object(); }
    json_t *entries = json_object_get(root, "entries");
    if (!json_is_object(entries)) { entries = json_object(); json_object_set_new(root, "entries", entries); }
    while (json_object_size(entries) >= 16) json_object_del(entries, json_object_iter_key(json_object_iter(entries)));
    json_object_set_new(entries, key, hpl_device_to_json(d, true));
    hpl_json_save(file, root);
    json_decref(root);
}

/* ---- the profile --------------------------------------------------------------------------------------- */

static void hpl_read_memory(const hmem_request *rq, hpl_device *d) {
    hmem_sysmem sm;
    hr_err e = {0};
    if (hmem_sysmem_read(&sm, &e)) return;
    d->mem_total = sm.mem_total;
    d->mem_available = sm.mem_available;
    d->mem_limit = sm.cgroup_limit;
    if (sm.env_limit && (!d->mem_limit || sm.env_limit < d->mem_limit)) d->mem_limit = sm.env_limit;
    d->mem_usable = sm.mem_available ? sm.mem_available : sm.mem_total;
    if (d->mem_limit && d->mem_limit < d->mem_usable) d->mem_usable = d->mem_limit;
    d->budget_set = rq && rq->given && !rq->off && rq->bytes;
    d->budget = d->budget_set ? rq->bytes : hmem_default_budget(&sm);
}

int hpl_profile_self(const hpl_profile_params *p, hpl_device *out, hr_err *err) {
    int64_t t0 = hr_time_ns();
    memset(out, 0, sizeof *out);
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    snprintf(out->name, sizeof out->name, "%s", host);
    out->n_threads = p->n_threads > 0 ? p->n_threads : hr_physical_cores();
    out->cpu_quota = hpl_cpu_limits(&out->cpu_period_ms);
    out->tick_ms = hpl_tick_ms();
    hpl_read_memory(&p->mem, out);
    char file[2048], key[1024];
    if (p->cache_path) snprintf(file, sizeof file, "%s", p->cache_path);
    else if (hpl_default_cache_file(file, sizeof file, err)) return err->code;
    hpl_mkdirs_for(file); /* before the key: it names the disk the folder is on */
    hpl_disk_id(p->disk_path ? p->disk_path : file, out->disk_id, sizeof out->disk_id);
    if (hpl_profile_key(out->n_threads, p->disk_path ? p->disk_path : file, key, sizeof key, err)) return err->code;
    /* the types asked for (the model's) that the cache does not hold yet: a profile made for one model
       measures another model's other types when that model comes */
    uint32_t want = 0, have = 0;
    for (size_t i = 0; i < HR_ARRAY_LEN(hpl_std_types); i++) want |= 1u << hpl_std_types[i];
    if (p->types) want = p->types;
    hpl_device old;
    memset(&old, 0, sizeof old);
    bool cached = hpl_cache_get(file, key, &old);
    for (int i = 0; cached && i < old.n_types; i++)
        if (old.ts[i].type < 32) have |= 1u << old.ts[i].type;
    if (!p->no_cache && cached && !(want & ~have)) {
        hpl_cache_get(file, key, out);
        out->cached = true;
        out->profile_ms = (double)(hr_time_ns() - t0) / 1e6;
        return 0;
    }
    uint32_t todo = p->no_cache || !cached ? want : want & ~have;
    int ms = p->bench_ms > 0 ? p->bench_ms : 60;
    hr_pool *pool = hr_pool_create(out->n_threads, err);
    if (!pool) return err->code;
    const hpl_cpu_share cores = hpl_cores(out->n_threads);
    int rc = 0;
    out->n_types = 0;
    rc = hpl_bench_types(pool, todo, ms, cores, out->ts, &out->n_types, HPL_MAX_TYPES, err);
    /* the cache's other types stay (measured on this device, under this key) */
    for (int i = 0; cached && i < old.n_types && out->n_types < HPL_MAX_TYPES; i++)
        if (old.ts[i].type >= 32 || !(todo >> old.ts[i].type & 1)) out->ts[out->n_types++] = old.ts[i];
    bool again = p->no_cache || !cached;
    if (!rc) out->mem_bw_gbps = again ? hpl_bench_membw(pool, ms, cores) : old.mem_bw_gbps;
    hr_pool_free(pool);
    if (rc) return rc;
    int64_t td = hr_time_ns();
    out->disk_cpu_ms_gb = old.disk_cpu_ms_gb;
    out->disk_gbps = again ? hpl_bench_disk(p->disk_path ? p->disk_path : file, &out->disk_cpu_ms_gb) : old.disk_gbps;
    HR_LOGD("profile: kernels %.0f ms, disk %.0f ms", (td - t0) / 1e6, (hr_time_ns() - td) / 1e6);
    hpl_cache_put(file, key, out);
    out->profile_ms = (double)(hr_time_ns() - t0) / 1e6;
    return 0;
}

static double hpl_type_rate(const hpl_type_speed *t, bool matmul, bool mapped) {
    double map = matmul ? t->matmul_map_gbps : t->matvec_map_gbps;
    return mapped && map > 0 ? map : matmul ? t->matmul_gbps : t->matvec_gbps;
}

double hpl_speed(const hpl_device *d, int type, bool matmul, bool mapped) {
    const hpl_type_speed *q8 = NULL;
    for (int i = 0; i < d->n_types; i++) {
        if (d->ts[i].type == type) return hpl_type_rate(&d->ts[i], matmul, mapped);
        if (d->ts[i].type == HQ_TYPE_Q8_0) q8 = &d->ts[i];
    }
    if (q8) return hpl_type_rate(q8, matmul, mapped);
    return d->n_types ? hpl_type_rate(&d->ts[0], matmul, mapped) : 1;
}

/* ---- key/values (PROFILE) -------------------------------------------------------------------------------- */

#define HPL_KV(o, k, ...) do { if ((o)->n < HN_MAX_KV) { snprintf((o)->key[(o)->n], HN_MAX_KEY, "%s", k); \
        snprintf((o)->val[(o)->n], HN_MAX_VALUE, __VA_ARGS__); (o)->n++; } } while (0)

int hpl_device_to_kv(const hpl_device *d, hc_kv_text *o) {
    o->n = 0;
    HPL_KV(o, "name", "%s", d->name);
    HPL_KV(o, "threads", "%d", d->n_threads);
    HPL_KV(o, "cpu_quota", "%.4f", d->cpu_quota);
    HPL_KV(o, "cpu_period_ms", "%.3f", d->cpu_period_ms);
    HPL_KV(o, "tick_ms", "%.3f", d->tick_ms);
    HPL_KV(o, "mem_total", "%" PRIu64, d->mem_total);
    HPL_KV(o, "mem_available", "%" PRIu64, d->mem_available);
    HPL_KV(o, "mem_limit", "%" PRIu64, d->mem_limit);
    HPL_KV(o, "mem_usable", "%" PRIu64, d->mem_usable);
    HPL_KV(o, "budget", "%" PRIu64, d->budget);
    HPL_KV(o, "budget_set", "%d", d->budget_set);
    HPL_KV(o, "mem_bw_gbps", "%.6g", d->mem_bw_gbps);
    HPL_KV(o, "disk_gbps", "%.6g", d->disk_gbps);
    HPL_KV(o, "disk_cpu", "%.6g", d->disk_cpu_ms_gb);
    if (d->disk_id[0]) HPL_KV(o, "disk_id", "%s", d->disk_id);
    HPL_KV(o, "cached", "%d", d->cached);
    HPL_KV(o, "profile_ms", "%.3f", d->profile_ms);
    for (int i = 0; i < d->n_types; i++) {
        char k[HN_MAX_KEY];
        snprintf(k, sizeof k, "mv.%s", hq_type_name(d->ts[i].type));
        HPL_KV(o, k, "%.6g", d->ts[i].matvec_gbps);
        snprintf(k, sizeof k, "mm.%s", hq_type_name(d->ts[i].type));
        HPL_KV(o, k, "%.6g", d->ts[i].matmul_gbps);
        if (d->ts[i].matvec_map_gbps > 0 && d->ts[i].matmul_map_gbps > 0) {
            snprintf(k, sizeof k, "mvm.%s", hq_type_name(d->ts[i].type));
            HPL_KV(o, k, "%.6g", d->ts[i].matvec_map_gbps);
            snprintf(k, sizeof k, "mmm.%s", hq_type_name(d->ts[i].type));
            HPL_KV(o, k, "%.6g", d->ts[i].matmul_map_gbps);
        }
    }
    return 0;
}

static bool hpl_kv_num(hn_str s, double *out) {
    char buf[64];
    if (s.n == 0 || s.n >= sizeof buf) return false;
    memcpy(buf, s.s, s.n);
    buf[s.n] = 0;
    char *end;
    errno = 0;
    double v = strtod(buf, &end);
    if (errno || *end || !isfinite(v) || v < 0) return false;
    *out = v;
    return true;
}

int hpl_device_from_kv(const hn_profile *p, hpl_device *d, hr_err *err) {
    memset(d, 0, sizeof *d);
    for (uint32_t i = 0; i < p->n_kv; i++) {
        const hn_kv *kv = &p->kv[i];
        char key[HN_MAX_KEY + 1];
        hn_str_copy(key, sizeof key, kv->key);
        if (!strcmp(key, "name")) {
            char raw[HN_MAX_VALUE + 1];
            hn_str_copy(raw, sizeof raw, kv->value);
            hr_escape(d->name, sizeof d->name, raw, strlen(raw)); /* a peer's text */
            continue;
        }
        if (!strcmp(key, "disk_id")) {   /* compared, never shown raw: a peer's text, escaped all the same */
            char raw[HN_MAX_VALUE + 1];
            hn_str_copy(raw, sizeof raw, kv->value);
            hr_escape(d->disk_id, sizeof d->disk_id, raw, strlen(raw));
            continue;
        }
        double v;
        if (!hpl_kv_num(kv->value, &v)) return hr_fail(err, HR_EPROTO, "profile: '%s' is not a number >= 0", key);
        if (!strcmp(key, "threads")) d->n_threads = (int)HR_MIN(v, 1e6);
        else if (!strcmp(key, "cpu_quota")) d->cpu_quota = v;
        else if (!strcmp(key, "cpu_period_ms")) d->cpu_period_ms = v;
        else if (!strcmp(key, "tick_ms")) d->tick_ms = HR_MIN(v, 1000);
        else if (!strcmp(key, "mem_total")) d->mem_total = (uint64_t)HR_MIN(v, 1e18);
        else if (!strcmp(key, "mem_available")) d->mem_available = (uint64_t)HR_MIN(v, 1e18);
        else if (!strcmp(key, "mem_limit")) d->mem_limit = (uint64_t)HR_MIN(v, 1e18);
        else if (!strcmp(key, "mem_usable")) d->mem_usable = (uint64_t)HR_MIN(v, 1e18);
        else if (!strcmp(key, "budget")) d->budget = (uint64_t)HR_MIN(v, 1e18);
        else if (!strcmp(key, "budget_set")) d->budget_set = v != 0;
        else if (!strcmp(key, "mem_bw_gbps")) d->mem_bw_gbps = v;
        else if (!strcmp(key, "disk_gbps")) d->disk_gbps = v;
        else if (!strcmp(key, "disk_cpu")) d->disk_cpu_ms_gb = HR_MIN(v, 1e6);
        else if (!strcmp(key, "cached")) d->cached = v != 0;
        else if (!strcmp(key, "profile_ms")) d->profile_ms = v;
        else if (!strncmp(key, "mv.", 3) || !strncmp(key, "mm.", 3) || !strncmp(key, "mvm.", 4) || !strncmp(key, "mmm.", 4)) {
            const bool map = key[3] == '.';
            int type = hq_type_from_name(key + (map ? 4 : 3));
            if (type < 0 || !(v > 0)) return hr_fail(err, HR_EPROTO, "profile: '%s' names no weight type or is 0", key);
            int j = 0;
            while (j < d->n_types && d->ts[j].type != type) j++;
            if (j == d->n_types) {
                if (d->n_types == HPL_MAX_TYPES) return hr_fail(err, HR_EPROTO, "profile: more than %d types", HPL_MAX_TYPES);
                d->ts[d->n_types++] = (hpl_type_speed){.type = type};
            }
            double *slot = key[1] == 'v' ? (map ? &d->ts[j].matvec_map_gbps : &d->ts[j].matvec_gbps)
                                         : (map ? &d->ts[j].matmul_map_gbps : &d->ts[j].matmul_gbps);
            *slot = v;
        }
        /* other keys (the worker's plain PROFILE figures) are not the device's */
    }
    for (int j = 0; j < d->n_types; j++)
        if (!(d->ts[j].matvec_gbps > 0 && d->ts[j].matmul_gbps > 0))
            return hr_fail(err, HR_EPROTO, "profile: %s lacks its matvec or matmul speed", hq_type_name(d->ts[j].type));
    if (!d->n_types || !(d->n_threads > 0)) return hr_fail(err, HR_EPROTO, "profile: no speeds (a worker without the planner?)");
    return 0;
}

int hpl_worker_profile(void *user, int n_threads, const char *disk_dir, const hmem_request *mem, bool fresh, uint32_t types,
                       hc_kv_text *out, hr_err *err) {
    hpl_profile_params p = hpl_profile_default_params();
    p.no_cache = fresh;
    p.types = types;
    p.n_threads = n_threads;
    p.disk_path = disk_dir;
    if (mem) p.mem = *mem;
    hpl_device d;
    if (hpl_profile_self(&p, &d, err)) return err->code;
    return hpl_device_to_kv(&d, out);
}
