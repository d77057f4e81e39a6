/* base: errors, logging, asserts, time, aligned memory, fp16 — see base.h */
#include "base.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

static const char *const hr_err_names[HR_ERR_COUNT] = {
    "ok", "invalid argument", "I/O error", "out of memory", "malformed input", "unsupported",
    "out of range", "not found", "already exists", "timed out", "network error", "protocol error",
    "authentication failed",
};

const char *hr_strerror(int code) {
    int i = -code;
    if (i < 0 || i >= HR_ERR_COUNT) return "unknown error";
    return hr_err_names[i];
}

int hr_fail(hr_err *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* ---- progress ---- */
static hr_progress_fn hr_progress_cb;
static void *hr_progress_user;
void hr_progress_set(hr_progress_fn fn, void *user) { hr_progress_cb = fn; hr_progress_user = user; }
void hr_progress(const char *label, uint64_t done, uint64_t total) {
    if (hr_progress_cb) hr_progress_cb(label, done, total, hr_progress_user);
}

/* ---- logging ---- */
static hr_log_fn hr_log_cb;
static void *hr_log_user;
static int hr_log_min = -1;

void hr_log_set(hr_log_fn fn, void *user) { hr_log_cb = fn; hr_log_user = user; }
void hr_log_set_level(enum hr_log_level lvl) { hr_log_min = (int)lvl; }

static int hr_log_level_now(void) {
    if (hr_log_min < 0) {
        const char *e = getenv("HEARTH_LOG");
        hr_log_min = HR_LOG_INFO;
        if (e && !strcasecmp(e, "debug")) hr_log_min = HR_LOG_DEBUG;
        else if (e && !strcasecmp(e, "warn")) hr_log_min = HR_LOG_WARN;
        else if (e && !strcasecmp(e, "error")) hr_log_min = HR_LOG_ERROR;
        else if (e && !strcasecmp(e, "none")) hr_log_min = HR_LOG_NONE;
    }
    return hr_log_min;
}

void hr_log(enum hr_log_level level, const char *fmt, ...) {
    if ((int)level < hr_log_level_now()) return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (hr_log_cb) { hr_log_cb(level, buf, hr_log_user); return; }
    static const char *const tag[] = {"debug: ", "", "warning: ", "error: ", ""};
    size_t n = strlen(buf);
    fprintf(stderr, "%s%s%s", tag[level], buf, (n && buf[n - 1] == '\n') ? "" : "\n");
}

void hr_abort(const char *file, int line, const char *expr) {
    fprintf(stderr, "%s:%d: internal error: assertion failed: %s\n", file, line, expr);
    fflush(stderr);
    abort();
}

int64_t hr_time_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int hr_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double hr_median(double *v, int n) {
    if (n < 1) return 0;
    qsort(v, (size_t)n, sizeof v[0], hr_cmp_double);
    return v[n / 2];
}

int64_t hr_cpu_time_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts)) return 0;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#if defined(__x86_64__) || defined(__i386__)
/* clflushopt where the CPU has it (CPUID.7.0:EBX bit 23): unordered, ~50x faster than clflush, whose
   serialised flushes took 90 ms for 32 MiB in a VM here */
__attribute__((target("clflushopt"))) static void hr_evict_opt(const char *c, const char *e) {
    for (; c < e; c += 64) __builtin_ia32_clflushopt(c);
    __builtin_ia32_sfence();
}
#endif

bool hr_cache_evict(const void *p, size_t n) {
#if defined(__x86_64__) || defined(__i386__)
    static int opt = -1;
    if (opt < 0) {
        unsigned a, b = 0, c, d;
        opt = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b >> 23 & 1);
    }
    const char *c = (const char *)((uintptr_t)p & ~(uintptr_t)63), *e = (const char *)p + n;
    if (opt) hr_evict_opt(c, e);
    else {
        for (; c < e; c += 64) __builtin_ia32_clflush(c);
        __builtin_ia32_mfence();
    }
    return true;
#elif defined(__aarch64__)
    uint64_t ctr;
    __asm__ __volatile__("mrs %0, ctr_el0" : "=r"(ctr));
    const uintptr_t line = (uintptr_t)4 << ((ctr >> 16) & 0xf); /* DminLine: log2 of words */
    for (uintptr_t c = (uintptr_t)p & ~(line - 1), e = (uintptr_t)p + n; c < e; c += line)
        __asm__ __volatile__("dc civac, %0" : : "r"(c) : "memory");
    __asm__ __volatile__("dsb ish" : : : "memory");
    return true;
#else
    (void)p;
    (void)n;
    return false;
#endif
}

void *hr_alloc_aligned(size_t size, size_t align) {
    void *p = NULL;
    if (size == 0) size = 1;
    if (posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, size) != 0) return NULL;
    memset(p, 0, size);
    return p;
}
void hr_free_aligned(void *p) { free(p); }

int hr_physical_cores(void) {
    /* count distinct (physical id, core id) pairs among CPUs we may run on */
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return (int)n;
    char line[256];
    int phys = -1, cores = 0, siblings = 0, cpu_cores = 0;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "physical id : %d", &phys) == 1) continue;
        if (sscanf(line, "siblings : %d", &siblings) == 1) continue;
        if (sscanf(line, "cpu cores : %d", &cpu_cores) == 1) continue;
    }
    fclose(f);
    (void)phys;
    if (siblings > 0 && cpu_cores > 0 && siblings > cpu_cores) cores = (int)(n * cpu_cores / siblings);
    else cores = (int)n;
    return cores < 1 ? 1 : cores;
}

/* ---- fp16 ---- */
float hr_fp16_table[65536];

float hr_fp16_to_fp32_slow(hr_fp16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0) {
        float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    if (exp == 31) return hr_bits_to_f32(sign | 0x7f800000 | (man << 13));
    return hr_bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}

static pthread_once_t hr_once = PTHREAD_ONCE_INIT;
static int hr_log_level_now(void);
static void hr_init_once(void) {
    hr_log_level_now(); /* read HEARTH_LOG once here, before threads exist (no lazy race) */
    for (uint32_t i = 0; i < 65536; i++) hr_fp16_table[i] = hr_fp16_to_fp32_slow((hr_fp16)i);
}
void hr_init(void) { pthread_once(&hr_once, hr_init_once); }

int64_t hr_parse_size(const char *s) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return -1;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end) return -1;
    v *= mul;
    if (v > 9.0e18) return -1;
    return (int64_t)v;
}

uint64_t hr_fnv1a(const void *data, size_t n, uint64_t h) {
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) { h ^= p[i]; h *= 0x100000001b3ULL; }
    return h;
}

char *hr_escape(char *dst, size_t cap, const char *src, size_t n) {
    if (!cap) return dst;
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)src[i];
        /* U+0080..U+009F (C1, CSI among them) are 0xc2 0x80..0x9f in UTF-8 */
        bool c1 = c == 0xc2 && i + 1 < n && (unsigned char)src[i + 1] >= 0x80 && (unsigned char)src[i + 1] <= 0x9f;
        if (c >= 0x20 && c != 0x7f && c != '\\' && !c1) {
            if (o + 1 >= cap) break;
            dst[o++] = (char)c;
            continue;
        }
        int k = c1 ? 2 : 1;
        if (o + 4 * (size_t)k >= cap) break;
        for (int j = 0; j < k; j++) {
            unsigned char b = (unsigned char)src[i + (size_t)j];
            dst[o++] = '\\';
            dst[o++] = 'x';
            dst[o++] = hex[b >> 4];
            dst[o++] = hex[b & 15];
        }
        i += (size_t)k - 1;
    }
    dst[o] = 0;
    return dst;
}

int hr_mkdirs(const char *path, unsigned mode, hr_err *err) {
    char tmp[PATH_MAX];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof tmp) return hr_fail(err, HR_EINVAL, "bad directory '%s'", path);
    memcpy(tmp, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (tmp[i] != '/' && tmp[i] != 0) continue;
        char c = tmp[i];
        tmp[i] = 0;
        if (mkdir(tmp, (mode_t)mode) && errno != EEXIST) return hr_fail(err, HR_EIO, "mkdir '%s': %s", tmp, strerror(errno));
        tmp[i] = c;
    }
    struct stat st;
    if (stat(path, &st) || !S_ISDIR(st.st_mode)) return hr_fail(err, HR_EIO, "'%s' is not a directory", path);
    return 0;
}
