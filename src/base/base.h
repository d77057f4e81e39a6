/*
 * base — what every hearth module needs: error codes and messages, logging, asserts, clocks,
 * half-precision conversions and small helpers.  Prefix: hr_.
 *
 * Errors: library functions return 0 / a pointer on success and a negative HR_E* code / NULL on
 * failure; the caller passes an hr_err whose msg says what went wrong with context
 * ("gguf_open: tensor 'x' extends past end of file").  Library code never exits; only main() does.
 * Asserts (HR_ASSERT) are for programmer errors and stay on in release builds.
 */
#ifndef HEARTH_BASE_H
#define HEARTH_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* ---- error codes (append only; values are stable) ------------------------------------------------ */
enum {
    HR_OK           = 0,
    HR_EINVAL       = -1,  /* bad argument or flag */
    HR_EIO          = -2,  /* read/write/mmap failed */
    HR_ENOMEM       = -3,  /* allocation failed */
    HR_EFORMAT      = -4,  /* malformed file or message */
    HR_EUNSUPPORTED = -5,  /* valid but not supported (type, arch, version) */
    HR_ERANGE       = -6,  /* value out of range / too large */
    HR_ENOTFOUND    = -7,  /* key, tensor or file not found */
    HR_EEXIST       = -8,  /* refusing to overwrite */
    HR_ETIMEDOUT    = -9,  /* deadline passed */
    HR_ENET         = -10, /* network failure */
    HR_EPROTO       = -11, /* peer broke the protocol */
    HR_EAUTH        = -12, /* peer not authenticated: wrong or missing cluster key, altered data */
    HR_ERR_COUNT    = 13,
};
const char *hr_strerror(int code);

/* An error message buffer the caller owns; functions fill it on failure. May be NULL. */
typedef struct hr_err {
    int  code;
    char msg[512];
} hr_err;

/* Sets err->code and formats err->msg; returns code so callers can `return hr_fail(err, ...)`. */
int hr_fail(hr_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- progress of long steps through one callback ------------------------------------------------------
   Library code reports a long step (loading weights) as it goes; the command line draws a bar on a
   terminal. Called from the thread doing the step; done == total ends it. No callback: nothing. */
typedef void (*hr_progress_fn)(const char *label, uint64_t done, uint64_t total, void *user);
void hr_progress_set(hr_progress_fn fn, void *user);
void hr_progress(const char *label, uint64_t done, uint64_t total);

/* ---- logging through one callback ---------------------------------------------------------------- */
enum hr_log_level { HR_LOG_DEBUG = 0, HR_LOG_INFO = 1, HR_LOG_WARN = 2, HR_LOG_ERROR = 3, HR_LOG_NONE = 4 };
typedef void (*hr_log_fn)(enum hr_log_level level, const char *msg, void *user);
void hr_log_set(hr_log_fn fn, void *user);          /* NULL restores the default (stderr) */
void hr_log_set_level(enum hr_log_level min_level); /* default INFO; HEARTH_LOG=debug overrides */
void hr_log(enum hr_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define HR_LOGD(...) hr_log(HR_LOG_DEBUG, __VA_ARGS__)
#define HR_LOGI(...) hr_log(HR_LOG_INFO, __VA_ARGS__)
#define HR_LOGW(...) hr_log(HR_LOG_WARN, __VA_ARGS__)
#define HR_LOGE(...) hr_log(HR_LOG_ERROR, __VA_ARGS__)

/* ---- asserts: programmer errors, always on ------------------------------------------------------- */
void hr_abort(const char *file, int line, const char *expr) __attribute__((noreturn));
#define HR_ASSERT(x) do { if (__builtin_expect(!(x), 0)) hr_abort(__FILE__, __LINE__, #x); } while (0)

/* ---- time ---------------------------------------------------------------------------------------- */
int64_t hr_time_ns(void);          /* monotonic */
static inline double hr_time_s(void) { return (double)hr_time_ns() * 1e-9; }
int64_t hr_cpu_time_ns(void);      /* CPU time of the whole process (all threads): excludes CFS throttling */

/* ---- memory -------------------------------------------------------------------------------------- */
void *hr_alloc_aligned(size_t size, size_t align); /* zeroed; NULL on failure; free with hr_free_aligned */
void  hr_free_aligned(void *p);
int   hr_physical_cores(void);     /* cores (not SMT threads) usable by this process; >= 1 */
/* writes back and evicts [p, p+n) from every cache level (clflush on x86, dc civac on arm64), so the
   next read comes from memory; false where the architecture has no such instruction (nothing done) */
bool  hr_cache_evict(const void *p, size_t n);

/* ---- half precision ------------------------------------------------------------------------------ */
typedef uint16_t hr_fp16;  /* IEEE binary16 bits */
typedef uint16_t hr_bf16;  /* bfloat16 bits */

static inline float hr_bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t hr_f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

float   hr_fp16_to_fp32_slow(hr_fp16 h);     /* portable, exact */
static inline hr_fp16 hr_fp32_to_fp16(float f); /* round to nearest even, exact */
extern float hr_fp16_table[65536];           /* filled by hr_init(); hr_fp16_to_fp32 reads it */
static inline float hr_fp16_to_fp32(hr_fp16 h) { return hr_fp16_table[h]; }
static inline float hr_bf16_to_fp32(hr_bf16 h) { return hr_bits_to_f32((uint32_t)h << 16); }
static inline hr_bf16 hr_fp32_to_bf16(float f) {
    uint32_t u = hr_f32_to_bits(f);
    if ((u & 0x7fffffff) > 0x7f800000) return (hr_bf16)((u >> 16) | 64); /* quiet NaN */
    return (hr_bf16)((u + (0x7fff + ((u >> 16) & 1))) >> 16);          /* round to nearest even */
}

static inline hr_fp16 hr_fp32_to_fp16(float f) {
    uint32_t x = hr_f32_to_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffff;
    if (ax > 0x7f800000) return (hr_fp16)(sign | 0x7e00);          /* NaN */
    if (ax >= 0x477ff000) return (hr_fp16)(sign | 0x7c00);         /* >= 65520 rounds to inf */
    if (ax < 0x38800000) {                                          /* half subnormal or zero */
        if (ax < 0x33000000) return (hr_fp16)sign;                  /* < 2^-25 rounds to 0 */
        uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e;                                   /* value = m * 2^(e-150) = hm * 2^-24 */
        uint32_t hm = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (hm & 1))) hm++;
        return (hr_fp16)(sign | hm);
    }
    uint32_t r = ax + 0xfff + ((ax >> 13) & 1);                     /* round to nearest even */
    r -= 112u << 23;
    return (hr_fp16)(sign | (r >> 13));
}

/* One-time process init (fp16 table, CPU feature detection). Idempotent, thread-safe. */
void hr_init(void);

/* ---- small helpers ------------------------------------------------------------------------------- */
#define HR_MIN(a, b) ((a) < (b) ? (a) : (b))
#define HR_MAX(a, b) ((a) > (b) ? (a) : (b))
#define HR_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
double hr_median(double *v, int n); /* sorts v[0..n) in place; the middle value (upper of two); 0 when n < 1 */
static inline size_t hr_pad(size_t x, size_t n) { return (x + n - 1) / n * n; }

/* Parses sizes like "300M", "1.5G", "4096" (bytes; K/M/G/T are powers of 1024). -1 on error. */
int64_t hr_parse_size(const char *s);
/* mkdir -p: path and the directories above it that are missing, each made with mode (umask applies) */
int hr_mkdirs(const char *path, unsigned mode, hr_err *err);
/* Untrusted text (a peer's device name, a reason it gives) made safe to print: n bytes of src into dst
   (NUL-terminated, cut at cap, never inside an escape) with control characters — C0, DEL and C1 as
   UTF-8 — and the backslash written as \xNN, so that it cannot forge log lines or drive a terminal.
   Returns dst. */
char *hr_escape(char *dst, size_t cap, const char *src, size_t n);
/* An output file (outfile.c). A regular file, or a path that does not exist yet, is written to PATH.tmp
   and renamed over PATH by commit (readers never see half a file); a device, a FIFO or a symbolic
   link is written through in place, so /dev/null or a pipe stays what it is. commit reports every
   write error (a full disk, /dev/full); abort closes and removes the temporary file. */
typedef struct hr_outfile { FILE *f; char *path, *tmp; } hr_outfile;
int         hr_outfile_open(hr_outfile *o, const char *path, hr_err *err);
int         hr_outfile_commit(hr_outfile *o, hr_err *err);
void        hr_outfile_abort(hr_outfile *o);
const char *hr_outfile_name(const hr_outfile *o); /* the path being written, for messages */
/* 64-bit FNV-1a, for content hashes that need not be cryptographic. */
uint64_t hr_fnv1a(const void *data, size_t n, uint64_t seed);
#define HR_FNV_SEED 0xcbf29ce484222325ULL
/* A fast 64-bit content hash (hash.c; ~15x FNV-1a on large buffers): four multiply-xorshift lanes
   over 32-byte stripes. Streaming gives the same value as one call over the concatenation. Not
   cryptographic. */
typedef struct hr_hasher { uint64_t v[4]; uint8_t buf[32]; uint32_t nbuf; uint64_t total; } hr_hasher;
void     hr_hasher_init(hr_hasher *h, uint64_t seed);
void     hr_hasher_update(hr_hasher *h, const void *data, size_t n);
uint64_t hr_hasher_final(const hr_hasher *h);
uint64_t hr_hash64(const void *data, size_t n, uint64_t seed);

#endif
