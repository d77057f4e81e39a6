// modules: base quant gguf
/* test-gguf: the GGUF reader on real models, the writer by round trip, and the reader against
   hostile input — hand-built files with one field corrupted at a time, truncations at every offset
   of a real header, and seeded random byte flips. The hostile parts are what the ASan build is for:
   every bad file must give NULL and a message, never a crash or an out-of-bounds read (each input
   sits in its own exact-size allocation so ASan sees any over-read). */
#include "test.h"

#include "gguf/gguf.h"
#include "quant/quant.h"

#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------------------------- */


static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint64_t rng(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* little byte-buffer builder, to write GGUF files independently of the writer under test */
typedef struct bb { uint8_t *p; size_t n, cap; } bb;
static void bb_put(bb *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void bb_u8(bb *b, uint8_t v) { bb_put(b, &v, 1); }
static void bb_u32(bb *b, uint32_t v) { uint8_t x[4]; for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> 8 * i); bb_put(b, x, 4); }
static void bb_u64(bb *b, uint64_t v) { uint8_t x[8]; for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> 8 * i); bb_put(b, x, 8); }
static void bb_str(bb *b, const char *s) { bb_u64(b, strlen(s)); bb_put(b, s, strlen(s)); }
static void bb_pad(bb *b, size_t a) { while (b->n % a) bb_u8(b, 0); }
static void patch_u32(uint8_t *p, size_t off, uint32_t v) { for (int i = 0; i < 4; i++) p[off + i] = (uint8_t)(v >> 8 * i); }
static void patch_u64(uint8_t *p, size_t off, uint64_t v) { for (int i = 0; i < 8; i++) p[off + i] = (uint8_t)(v >> 8 * i); }

/* With HEARTH_GGUF_SEED_DIR set, the small files built here are also saved there as a seed corpus
   for tests/fuzz-gguf.c. */
static void save_seed(const char *name, const void *p, size_t n) {
    const char *dir = getenv("HEARTH_GGUF_SEED_DIR");
    if (!dir) return;
    FILE *f = fopen(test_path(dir, name), "wb");
    if (f) {
        fwrite(p, 1, n, f);
        fclose(f);
    }
}

/* true if [p, p+n) lies inside the ctx's file */
static bool in_file(const gguf_ctx *ctx, const void *p, uint64_t n) {
    const uint8_t *b = gguf_base(ctx), *q = p;
    return q >= b && (uint64_t)(q - b) <= gguf_file_size(ctx) && n <= gguf_file_size(ctx) - (uint64_t)(q - b);
}

/* Walks everything a ctx hands out and checks it is consistent and inside the file. Returns the
   number of problems (also counted as CHECK failures). */
static int check_ctx(const gguf_ctx *ctx) {
    int bad = test_n_fail;
    for (int64_t i = 0; i < gguf_n_kv(ctx); i++) {
        const char *k = gguf_key(ctx, i);
        CHECK(k && k[0]);
        CHECK(gguf_find_key(ctx, k) == i);
        int t = gguf_kv_type(ctx, i);
        CHECK(t >= 0 && t < GGUF_VT_COUNT);
        gguf_str s;
        if (t == GGUF_VT_STRING) CHECK(gguf_get_str(ctx, k, &s) && in_file(ctx, s.s, s.n));
        if (t == GGUF_VT_ARRAY) {
            int et;
            uint64_t n;
            const void *d;
            CHECK(gguf_get_arr(ctx, k, &et, &n, &d));
            if (et == GGUF_VT_STRING) {
                for (uint64_t j = 0; j < n; j++) CHECK(gguf_get_arr_str(ctx, k, j, &s) && in_file(ctx, s.s, s.n));
                CHECK(!gguf_get_arr_str(ctx, k, n, &s));
            } else {
                static const int sz[GGUF_VT_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
                CHECK(et >= 0 && et < GGUF_VT_COUNT && sz[et] && in_file(ctx, d, n * (uint64_t)sz[et]));
            }
        }
    }
    for (int64_t i = 0; i < gguf_n_tensors(ctx); i++) {
        const gguf_tensor *t = gguf_tensor_at(ctx, i);
        CHECK(gguf_find_tensor(ctx, t->name) == t);
        CHECK(t->n_dims >= 1 && t->n_dims <= GGUF_MAX_DIMS);
        CHECK(in_file(ctx, t->data, t->nbytes));
        CHECK(t->offset % gguf_alignment(ctx) == 0);
        CHECK((const uint8_t *)t->data == (const uint8_t *)gguf_base(ctx) + gguf_data_offset(ctx) + t->offset);
        int64_t rows = t->ne[0] ? gguf_tensor_nelements(t) / t->ne[0] : 0;
        CHECK(t->nbytes == hq_row_size(t->type, t->ne[0]) * (uint64_t)rows);
    }
    CHECK(gguf_tensor_at(ctx, gguf_n_tensors(ctx)) == NULL);
    CHECK(gguf_key(ctx, -1) == NULL);
    return test_n_fail - bad;
}

/* Opens buf[0..n) (which must be an allocation of exactly n bytes, for ASan's sake); returns true
   if it opened. A failure must come with a message, and the message must contain `want` if given. */
static bool open_exact(const uint8_t *buf, size_t n, const char *want, const char *label) {
    hr_err err = {0};
    gguf_ctx *ctx = gguf_open_buffer(buf, n, &err);
    if (ctx) {
        check_ctx(ctx);
        gguf_close(ctx);
    } else {
        CHECKF(err.msg[0] && err.code < 0, "%s: failure without a message", label);
        if (want) CHECKF(strstr(err.msg, want) != NULL, "%s: message '%s' lacks '%s'", label, err.msg, want);
    }
    return ctx != NULL;
}

/* the same on a private exact-size copy of buf[0..n) */
static bool try_open(const uint8_t *buf, size_t n, const char *want, const char *label) {
    uint8_t *copy = malloc(n ? n : 1);
    memcpy(copy, buf, n);
    bool ok = open_exact(copy, n, want, label);
    free(copy);
    return ok;
}

static void expect_fail(const uint8_t *buf, size_t n, const char *want, const char *label) {
    bool opened = try_open(buf, n, want, label);
    CHECKF(!opened, "%s: opened a bad file", label);
}

/* ---- real models --------------------------------------------------------------------------------- */

static void test_stories(const char *shared) {
    hr_err err = {0};
    gguf_ctx *ctx = gguf_open(test_path(shared, "models/stories260K.gguf"), &err);
    CHECKF(ctx != NULL, "%s", err.msg);
    if (!ctx) return;
    CHECK(gguf_version(ctx) == 3);
    CHECK(gguf_alignment(ctx) == 32);
    char arch[32];
    CHECK(gguf_get_cstr(ctx, "general.architecture", arch, sizeof arch) && !strcmp(arch, "llama"));
    char small[3];
    CHECK(gguf_get_cstr(ctx, "general.architecture", small, sizeof small) && !strcmp(small, "ll"));
    uint32_t u;
    int64_t i64;
    CHECK(gguf_get_u32(ctx, "llama.embedding_length", &u) && u == 64);
    CHECK(gguf_get_u32(ctx, "llama.block_count", &u) && u == 5);
    CHECK(gguf_get_i64(ctx, "llama.context_length", &i64) && i64 == 512);
    float eps;
    CHECK(gguf_get_f32(ctx, "llama.attention.layer_norm_rms_epsilon", &eps) && eps > 9e-6f && eps < 1.1e-5f);
    CHECK(!gguf_get_u32(ctx, "general.architecture", &u));    /* a string is not an integer */
    CHECK(!gguf_get_f32(ctx, "llama.block_count", &eps));      /* nor is an integer a float */
    CHECK(!gguf_get_u32(ctx, "no.such.key", &u));
    CHECK(gguf_find_key(ctx, "no.such.key") == -1);

    int et;
    uint64_t n;
    const void *data;
    CHECK(gguf_get_arr(ctx, "tokenizer.ggml.tokens", &et, &n, &data) && et == GGUF_VT_STRING && n == 512);
    gguf_str s;
    CHECK(gguf_get_arr_str(ctx, "tokenizer.ggml.tokens", 0, &s) && s.n == 5 && !memcmp(s.s, "<unk>", 5));
    CHECK(gguf_get_arr_str(ctx, "tokenizer.ggml.tokens", 1, &s) && s.n == 3 && !memcmp(s.s, "<s>", 3));
    CHECK(gguf_get_arr_str(ctx, "tokenizer.ggml.tokens", 511, &s) && s.n > 0);
    CHECK(!gguf_get_arr_str(ctx, "tokenizer.ggml.tokens", 512, &s));
    CHECK(!gguf_get_arr_str(ctx, "tokenizer.ggml.scores", 0, &s));
    CHECK(gguf_get_arr(ctx, "tokenizer.ggml.scores", &et, &n, &data) && et == GGUF_VT_FLOAT32 && n == 512);

    CHECK(gguf_n_tensors(ctx) == 48);
    const gguf_tensor *t = gguf_find_tensor(ctx, "token_embd.weight");
    CHECK(t && t->type == HQ_TYPE_F32 && t->n_dims == 2 && t->ne[0] == 64 && t->ne[1] == 512 &&
          t->ne[2] == 1 && t->ne[3] == 1 && t->nbytes == 64 * 512 * 4);
    CHECK(t && gguf_tensor_nelements(t) == 64 * 512);
    CHECK(gguf_find_tensor(ctx, "blk.4.ffn_down.weight") != NULL);
    CHECK(gguf_find_tensor(ctx, "blk.5.ffn_down.weight") == NULL);
    CHECK(gguf_data_offset(ctx) % 32 == 0 && gguf_data_offset(ctx) >= 14138);
    check_ctx(ctx);
    gguf_close(ctx);

    /* errors from the file layer */
    CHECK(gguf_open(test_path(shared, "models/no-such-file.gguf"), &err) == NULL && err.code == HR_ENOTFOUND &&
          strstr(err.msg, "no-such-file.gguf"));
    CHECK(gguf_open(test_path(shared, "models"), &err) == NULL && err.msg[0]);
}

static void test_models_dir(const char *shared) {
    const char *dirs[] = {"models/synth", "models"};
    int opened = 0;
    for (size_t d = 0; d < HR_ARRAY_LEN(dirs); d++) {
        const char *dir = test_path(shared, dirs[d]);
        DIR *dp = opendir(dir);
        if (!dp) continue;
        struct dirent *e;
        while ((e = readdir(dp))) {
            size_t len = strlen(e->d_name);
            if (len < 5 || strcmp(e->d_name + len - 5, ".gguf")) continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            hr_err err = {0};
            gguf_ctx *ctx = gguf_open(path, &err);
            CHECKF(ctx != NULL, "%s", err.msg);
            if (!ctx) continue;
            opened++;
            CHECKF(check_ctx(ctx) == 0, "%s", path);
            gguf_close(ctx);
        }
        closedir(dp);
    }
    CHECK(opened >= 10);

    /* a 32000-token vocabulary: the string index must give every element */
    hr_err err = {0};
    gguf_ctx *ctx = gguf_open(test_path(shared, "models/llama-2-tiny-random.gguf"), &err);
    if (ctx) {
        int et;
        uint64_t n;
        gguf_str s;
        CHECK(gguf_get_arr(ctx, "tokenizer.ggml.tokens", &et, &n, NULL) && n == 32000);
        CHECK(gguf_get_arr_str(ctx, "tokenizer.ggml.tokens", 31999, &s) && s.n > 0);
        gguf_close(ctx);
    }
}

/* ---- a small hand-built file, and every way to break it ----------------------------------------- */

typedef struct layout {
    size_t n_tensors, n_kv, kv0_keylen, kv0_key, kv0_strlen, align_type, align_val, bool_val, farr_etype,
        farr_count, sarr_count, sarr_s0len, dupkey, t0_ndims, t0_ne0, t0_ne1, t0_type, t1_name, t1_ne0,
        t1_off, t3_ne1, t3_ne2, dir_end, data_start;
} layout;

static uint8_t *build_small(size_t *size, layout *L) {
    bb b = {0};
    bb_u32(&b, GGUF_MAGIC);
    bb_u32(&b, 3);
    L->n_tensors = b.n; bb_u64(&b, 4);
    L->n_kv = b.n;      bb_u64(&b, 6);

    L->kv0_keylen = b.n; L->kv0_key = b.n + 8;
    bb_str(&b, "general.architecture"); bb_u32(&b, GGUF_VT_STRING);
    L->kv0_strlen = b.n; bb_str(&b, "llama");
    bb_str(&b, "general.alignment");
    L->align_type = b.n; bb_u32(&b, GGUF_VT_UINT32);
    L->align_val = b.n;  bb_u32(&b, 32);
    bb_str(&b, "test.bool"); bb_u32(&b, GGUF_VT_BOOL);
    L->bool_val = b.n; bb_u8(&b, 1);
    bb_str(&b, "test.farr"); bb_u32(&b, GGUF_VT_ARRAY);
    L->farr_etype = b.n; bb_u32(&b, GGUF_VT_FLOAT32);
    L->farr_count = b.n; bb_u64(&b, 3);
    for (int i = 0; i < 3; i++) bb_u32(&b, hr_f32_to_bits(0.5f * (float)i));
    bb_str(&b, "test.sarr"); bb_u32(&b, GGUF_VT_ARRAY); bb_u32(&b, GGUF_VT_STRING);
    L->sarr_count = b.n; bb_u64(&b, 2);
    L->sarr_s0len = b.n; bb_str(&b, "ab"); bb_str(&b, "cde");
    L->dupkey = b.n + 8; bb_str(&b, "test.boom"); bb_u32(&b, GGUF_VT_UINT8); bb_u8(&b, 7);

    /* ta: F32 [32, 2] = 256 bytes at 0; tb: Q4_0 [64] = 36 bytes at 256; tc: Q6_K [256, 1] = 210 at 320;
       td: F32 [5, 1, 1] = 20 bytes at 544, the end of the file (no trailing padding) */
    bb_str(&b, "ta");
    L->t0_ndims = b.n; bb_u32(&b, 2);
    L->t0_ne0 = b.n; bb_u64(&b, 32);
    L->t0_ne1 = b.n; bb_u64(&b, 2);
    L->t0_type = b.n; bb_u32(&b, HQ_TYPE_F32); bb_u64(&b, 0);
    L->t1_name = b.n + 8; bb_str(&b, "tb"); bb_u32(&b, 1);
    L->t1_ne0 = b.n; bb_u64(&b, 64); bb_u32(&b, HQ_TYPE_Q4_0);
    L->t1_off = b.n; bb_u64(&b, 256);
    bb_str(&b, "tc"); bb_u32(&b, 2); bb_u64(&b, 256); bb_u64(&b, 1); bb_u32(&b, HQ_TYPE_Q6_K); bb_u64(&b, 320);
    bb_str(&b, "td"); bb_u32(&b, 3); bb_u64(&b, 5);
    L->t3_ne1 = b.n; bb_u64(&b, 1);
    L->t3_ne2 = b.n; bb_u64(&b, 1); bb_u32(&b, HQ_TYPE_F32); bb_u64(&b, 544);
    L->dir_end = b.n;
    bb_pad(&b, 32);
    L->data_start = b.n;
    for (int i = 0; i < 544 + 20; i++) bb_u8(&b, (uint8_t)i);
    *size = b.n;
    return realloc(b.p, b.n); /* exact size, so ASan sees reads past the end */
}

static void test_small_valid(void) {
    layout L;
    size_t n;
    uint8_t *f = build_small(&n, &L);
    hr_err err = {0};
    save_seed("small.gguf", f, n);
    gguf_ctx *ctx = gguf_open_buffer(f, n, &err);
    CHECKF(ctx != NULL, "%s", err.msg);
    if (ctx) {
        CHECK(gguf_n_kv(ctx) == 6 && gguf_n_tensors(ctx) == 4);
        CHECK(gguf_file_size(ctx) == L.data_start + 564);
        CHECK(gguf_data_offset(ctx) == L.data_start);
        bool b;
        CHECK(gguf_get_bool(ctx, "test.bool", &b) && b);
        uint32_t u;
        CHECK(gguf_get_u32(ctx, "test.boom", &u) && u == 7);
        const gguf_tensor *t = gguf_find_tensor(ctx, "tc");
        CHECK(t && t->type == HQ_TYPE_Q6_K && t->nbytes == 210 && t->offset == 320);
        check_ctx(ctx);
        gguf_close(ctx);
    }
    free(f);
}

static void test_hostile_patches(void) {
    layout L;
    size_t n;
    uint8_t *base = build_small(&n, &L);
    uint8_t *f = malloc(n);
    struct {
        const char *label, *want;
        size_t off;
        int width; /* 1, 4 or 8 bytes */
        uint64_t val;
    } cases[] = {
        {"bad magic", "not a GGUF", 0, 1, 'X'},
        {"version 1", "version 1", 4, 4, 1},
        {"version 99", "version 99", 4, 4, 99},
        {"version 0", "version 0", 4, 4, 0},
        {"big-endian", "big-endian", 4, 4, 0x03000000},
        {"n_tensors 2^63", "tensors", L.n_tensors, 8, 1ULL << 63},
        {"n_tensors 2^64-1", "tensors", L.n_tensors, 8, UINT64_MAX},
        {"n_kv 2^40", "metadata entries", L.n_kv, 8, 1ULL << 40},
        {"n_kv too many", "metadata entries", L.n_kv, 8, n},
        {"key length 2^62", "key", L.kv0_keylen, 8, 1ULL << 62},
        {"key length 0", "empty key", L.kv0_keylen, 8, 0},
        {"key with NUL", "NUL", L.kv0_key + 3, 1, 0},
        {"string length 2^62", "truncated", L.kv0_strlen, 8, 1ULL << 62},
        {"string length 2^64-1", "truncated", L.kv0_strlen, 8, UINT64_MAX},
        {"array count 2^61", "does not fit", L.farr_count, 8, 1ULL << 61},
        {"array count 2^64-1", "does not fit", L.farr_count, 8, UINT64_MAX},
        {"string array count 2^61", "does not fit", L.sarr_count, 8, 1ULL << 61},
        {"string array count +1", NULL, L.sarr_count, 8, 3},
        {"array string length 2^62", "truncated", L.sarr_s0len, 8, 1ULL << 62},
        {"unknown value type", "unknown value type", L.align_type, 4, GGUF_VT_COUNT},
        {"value type 2^32-1", "unknown value type", L.align_type, 4, UINT32_MAX},
        {"array of arrays", "arrays of arrays", L.farr_etype, 4, GGUF_VT_ARRAY},
        {"unknown element type", "unknown array element type", L.farr_etype, 4, 77},
        {"bool 2", "neither 0 nor 1", L.bool_val, 1, 2},
        {"alignment as i32", "must be u32", L.align_type, 4, GGUF_VT_INT32},
        {"alignment 48", "power of two", L.align_val, 4, 48},
        {"alignment 0", "power of two", L.align_val, 4, 0},
        {"duplicate key", "duplicate key 'test.bool'", L.dupkey + 8, 1, 'l'},
        {"unknown tensor type", "does not support", L.t0_type, 4, 99},
        {"IQ2_XXS tensor", "IQ2_XXS", L.t0_type, 4, 16},
        {"Q8_K tensor", "does not support", L.t0_type, 4, HQ_TYPE_Q8_K},
        {"n_dims 5", "n_dims = 5", L.t0_ndims, 4, 5},
        {"n_dims 0", "n_dims = 0", L.t0_ndims, 4, 0},
        {"ne negative", "negative", L.t0_ne0, 8, 1ULL << 63},
        {"row not a block multiple", "multiple of Q4_0", L.t1_ne0, 8, 48},
        {"offset past end", "extends past end of file", L.t1_off, 8, 1ULL << 40},
        {"offset wraps", "extends past end of file", L.t1_off, 8, UINT64_MAX - 31},
        {"misaligned offset", "not a multiple of the alignment", L.t1_off, 8, 257},
        {"overlap", "overlap", L.t1_off, 8, 224},
        {"duplicate tensor", "duplicate tensor name 'ta'", L.t1_name + 1, 1, 'a'},
    };
    for (size_t c = 0; c < HR_ARRAY_LEN(cases); c++) {
        memcpy(f, base, n);
        if (cases[c].width == 1) f[cases[c].off] = (uint8_t)cases[c].val;
        else if (cases[c].width == 4) patch_u32(f, cases[c].off, (uint32_t)cases[c].val);
        else patch_u64(f, cases[c].off, cases[c].val);
        expect_fail(f, n, cases[c].want, cases[c].label);
    }

    /* dims whose product overflows: 2^32 x 2^32 */
    memcpy(f, base, n);
    patch_u64(f, L.t0_ne0, 1ULL << 32);
    patch_u64(f, L.t0_ne1, 1ULL << 32);
    expect_fail(f, n, "more elements", "dims product overflow");
    /* large but countable shape: caught by the size check */
    memcpy(f, base, n);
    patch_u64(f, L.t0_ne0, 1ULL << 31);
    patch_u64(f, L.t0_ne1, 1ULL << 31);
    expect_fail(f, n, "size in bytes overflows", "2^62 f32 elements");
    memcpy(f, base, n);
    patch_u64(f, L.t0_ne0, 1ULL << 30);
    patch_u64(f, L.t0_ne1, 1ULL << 30);
    expect_fail(f, n, "extends past end of file", "huge tensor");
    /* bytes of the last tensor missing */
    expect_fail(base, L.data_start + 563, "extends past end of file", "tensor cut short");
    /* empty tensors: a zero dim makes any other dims harmless, as long as they fit in an int64 */
    memcpy(f, base, n);
    patch_u64(f, L.t3_ne1, 1ULL << 60);
    patch_u64(f, L.t3_ne2, 0);
    CHECK(try_open(f, n, NULL, "empty tensor"));
    patch_u64(f, L.t3_ne2, 4);
    expect_fail(f, n, "more elements", "5 x 2^60 x 4");
    patch_u64(f, L.t3_ne1, 0);
    patch_u64(f, L.t3_ne2, 1ULL << 60);
    CHECK(try_open(f, n, NULL, "empty tensor"));

    expect_fail(base, L.dir_end - 1, "truncated", "directory cut short");
    expect_fail(base, 0, "not a GGUF", "empty buffer");
    expect_fail(base, 3, "not a GGUF", "3 bytes");
    expect_fail(base, 10, "truncated", "10 bytes");
    const uint8_t fugg[24] = {'F', 'U', 'G', 'G', 0, 0, 0, 3};
    expect_fail(fugg, sizeof fugg, "big-endian", "swapped magic");
    hr_err err = {0};
    CHECK(gguf_open_buffer(NULL, 10, &err) == NULL && err.msg[0]);
    gguf_ctx *ok = gguf_open_buffer(base, n, NULL); /* err may be NULL */
    CHECK(ok != NULL);
    gguf_close(ok);
    free(f);
    free(base);
}

/* Every truncation of a real file below its last tensor's end must fail; the header and directory
   at every offset, the data section at a spread of offsets. */
static void test_truncation(const char *shared) {
    size_t n;
    uint8_t *f = test_read_file(test_path(shared, "models/stories260K.gguf"), &n);
    REQUIRE_VOID(f);
    hr_err err = {0};
    gguf_ctx *ctx = gguf_open_buffer(f, n, &err);
    CHECKF(ctx != NULL, "%s", err.msg);
    if (!ctx) { free(f); return; }
    uint64_t need = 0, dir = gguf_data_offset(ctx);
    for (int64_t i = 0; i < gguf_n_tensors(ctx); i++) {
        const gguf_tensor *t = gguf_tensor_at(ctx, i);
        need = HR_MAX(need, dir + t->offset + t->nbytes);
    }
    gguf_close(ctx);
    int fails = 0;
    size_t every = HR_MIN((size_t)dir + 64, n);
    for (size_t cut = 0; cut < every; cut++) {
        int before = test_n_fail;
        expect_fail(f, cut, NULL, "truncated header");
        if (test_n_fail != before && ++fails > 5) break;
    }
    for (int k = 0; k <= 256; k++) {
        size_t cut = every + (n - every) * (size_t)k / 256;
        bool opened = try_open(f, cut, "extends past end of file", "truncated data");
        CHECKF(opened == (cut >= need), "cut at %zu of %zu: opened=%d", cut, n, opened);
    }
    free(f);
}

/* Seeded random corruption of the header region: either it opens (and then everything it hands out
   is inside the file) or it fails with a message. */
static void test_flips(const char *shared) {
    size_t n;
    uint8_t *f = test_read_file(test_path(shared, "models/stories260K.gguf"), &n);
    REQUIRE_VOID(f);
    layout L;
    size_t sn;
    uint8_t *small = build_small(&sn, &L);
    struct { uint8_t *p; size_t n, region; int trials; } targets[] = {
        {f, n, 14200, 1500}, {small, sn, L.dir_end, 2500},
    };
    rng_state = 12345;
    int opened = 0, failed = 0;
    for (size_t k = 0; k < HR_ARRAY_LEN(targets); k++) {
        uint8_t *p = targets[k].p;
        for (int trial = 0; trial < targets[k].trials; trial++) {
            size_t pos[4];
            uint8_t old[4];
            int nflip = 1 + (int)(rng() % 4);
            for (int j = 0; j < nflip; j++) {
                pos[j] = (size_t)(rng() % targets[k].region);
                old[j] = p[pos[j]];
                uint64_t r = rng();
                /* mostly small values: they reach the deeper checks more often than random bytes */
                p[pos[j]] = (r & 3) == 0 ? (uint8_t)(r >> 8) : (r & 3) == 1 ? 0 : (r & 3) == 2 ? 0xff : (uint8_t)(p[pos[j]] ^ 1);
            }
            if (open_exact(p, targets[k].n, NULL, "flipped")) opened++;
            else failed++;
            for (int j = nflip - 1; j >= 0; j--) p[pos[j]] = old[j];
        }
    }
    printf("flips: %d opened, %d refused\n", opened, failed);
    CHECK(opened > 0 && failed > 0);
    free(small);
    free(f);
}

/* ---- writer -------------------------------------------------------------------------------------- */

static char tmpdir[64];

static bool file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* a file holding one kv of each scalar type the writer has no setter for, to copy from */
static uint8_t *build_scalars(size_t *size) {
    bb b = {0};
    bb_u32(&b, GGUF_MAGIC); bb_u32(&b, 2); bb_u64(&b, 0); bb_u64(&b, 7);
    bb_str(&b, "s.u8");  bb_u32(&b, GGUF_VT_UINT8);  bb_u8(&b, 200);
    bb_str(&b, "s.i8");  bb_u32(&b, GGUF_VT_INT8);   bb_u8(&b, (uint8_t)-100);
    bb_str(&b, "s.u16"); bb_u32(&b, GGUF_VT_UINT16); bb_u8(&b, 0x34); bb_u8(&b, 0x12);
    bb_str(&b, "s.i16"); bb_u32(&b, GGUF_VT_INT16);  bb_u8(&b, 0x00); bb_u8(&b, 0x80);
    bb_str(&b, "s.i64"); bb_u32(&b, GGUF_VT_INT64);  bb_u64(&b, (uint64_t)-5000000000LL);
    double d = -2.25;
    uint64_t db;
    memcpy(&db, &d, 8);
    bb_str(&b, "s.f64"); bb_u32(&b, GGUF_VT_FLOAT64); bb_u64(&b, db);
    bb_str(&b, "s.iarr"); bb_u32(&b, GGUF_VT_ARRAY); bb_u32(&b, GGUF_VT_INT16); bb_u64(&b, 2);
    bb_u8(&b, 1); bb_u8(&b, 0); bb_u8(&b, 0xff); bb_u8(&b, 0xff);
    *size = b.n;
    return realloc(b.p, b.n); /* exact size, so ASan sees reads past the end */
}

typedef struct wt { const char *name; int type, n_dims; int64_t ne[4]; size_t nbytes; uint8_t *data; } wt;

static void test_writer_roundtrip(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/rt.gguf", tmpdir);
    hr_err err = {0};
    size_t sn;
    uint8_t *sf = build_scalars(&sn);
    save_seed("scalars.gguf", sf, sn);
    gguf_ctx *sc = gguf_open_buffer(sf, sn, &err);
    CHECKF(sc != NULL, "%s", err.msg);
    if (!sc) { free(sf); return; }
    CHECK(gguf_version(sc) == 2);

    gguf_writer *w = gguf_writer_create();
    CHECK(gguf_writer_set_str(w, "general.architecture", "test") == 0);
    CHECK(gguf_writer_set_u32(w, "k.u32", 4000000000u) == 0);
    CHECK(gguf_writer_set_i32(w, "k.i32", -7) == 0);
    CHECK(gguf_writer_set_u64(w, "k.u64", 1ULL << 40) == 0);
    CHECK(gguf_writer_set_u64(w, "k.u64big", UINT64_MAX) == 0);
    CHECK(gguf_writer_set_f32(w, "k.f32", 1.5f) == 0);
    CHECK(gguf_writer_set_bool(w, "k.bool", true) == 0);
    CHECK(gguf_writer_set_str(w, "k.empty", "") == 0);
    CHECK(gguf_writer_set_u32(w, "k.gone", 1) == 0);
    CHECK(gguf_writer_remove_key(w, "k.gone") == 0);
    CHECK(gguf_writer_remove_key(w, "k.gone") == HR_ENOTFOUND);
    CHECK(gguf_writer_set_i32(w, "k.i32", -8) == 0); /* replaced in place */
    const int32_t ia[5] = {1, -2, 3, -4, 5};
    CHECK(gguf_writer_set_arr(w, "k.iarr", GGUF_VT_INT32, ia, 5) == 0);
    const float fa[3] = {0.25f, -1.0f, 3.5f};
    CHECK(gguf_writer_set_arr(w, "k.farr", GGUF_VT_FLOAT32, fa, 3) == 0);
    CHECK(gguf_writer_set_arr(w, "k.none", GGUF_VT_UINT8, NULL, 0) == 0);
    const gguf_str sa[3] = {{"hello", 5}, {"", 0}, {"w\0rld", 5}};
    CHECK(gguf_writer_set_arr_str(w, "k.sarr", sa, 3) == 0);
    for (int64_t i = 0; i < gguf_n_kv(sc); i++) CHECK(gguf_writer_copy_kv(w, sc, i) == 0);
    /* refusals */
    CHECK(gguf_writer_set_u32(w, "", 1) == HR_EINVAL);
    CHECK(gguf_writer_set_str(w, "k.null", NULL) == HR_EINVAL);
    CHECK(gguf_writer_set_arr(w, "k.bad", GGUF_VT_STRING, ia, 1) == HR_EINVAL);
    CHECK(gguf_writer_set_arr(w, "k.bad", GGUF_VT_ARRAY, ia, 1) == HR_EINVAL);
    CHECK(gguf_writer_copy_kv(w, sc, 99) == HR_EINVAL);

    wt ts[] = {
        {"w.f32", HQ_TYPE_F32, 2, {8, 3, 1, 1}, 8 * 3 * 4, NULL},
        {"w.f16", HQ_TYPE_F16, 1, {5, 1, 1, 1}, 10, NULL},
        {"w.q4_0", HQ_TYPE_Q4_0, 2, {64, 3, 1, 1}, 2 * 3 * sizeof(block_q4_0), NULL},
        {"w.q6_K", HQ_TYPE_Q6_K, 3, {256, 2, 2, 1}, 4 * sizeof(block_q6_K), NULL},
        {"w.empty", HQ_TYPE_F32, 2, {4, 0, 1, 1}, 0, NULL},
        {"w.q8_0", HQ_TYPE_Q8_0, 4, {32, 1, 2, 1}, 2 * sizeof(block_q8_0), NULL},
    };
    for (size_t i = 0; i < HR_ARRAY_LEN(ts); i++) {
        ts[i].data = malloc(ts[i].nbytes + 1);
        for (size_t j = 0; j < ts[i].nbytes; j++) ts[i].data[j] = (uint8_t)rng();
        CHECKF(gguf_writer_add_tensor(w, ts[i].name, ts[i].type, ts[i].n_dims, ts[i].ne, &err) == 0, "%s", err.msg);
    }
    const int64_t bad_ne[2] = {48, 2};
    CHECK(gguf_writer_add_tensor(w, "w.bad", HQ_TYPE_Q4_0, 2, bad_ne, &err) < 0 && strstr(err.msg, "multiple"));
    CHECK(gguf_writer_add_tensor(w, "w.f32", HQ_TYPE_F32, 2, ts[0].ne, &err) < 0 && strstr(err.msg, "twice"));
    CHECK(gguf_writer_add_tensor(w, "w.bad", 99, 2, ts[0].ne, &err) < 0 && err.msg[0]);
    CHECK(gguf_writer_add_tensor(w, "w.bad", HQ_TYPE_F32, 5, ts[0].ne, &err) < 0 && err.msg[0]);

    CHECK(gguf_writer_write_data(w, ts[0].data, ts[0].nbytes, &err) < 0); /* before begin */
    CHECKF(gguf_writer_begin(w, path, false, &err) == 0, "%s", err.msg);
    CHECK(gguf_writer_set_u32(w, "k.late", 1) == HR_EINVAL);
    CHECK(gguf_writer_write_data(w, ts[0].data, ts[0].nbytes + 1, &err) < 0 && strstr(err.msg, "w.f32"));
    for (size_t i = 0; i < HR_ARRAY_LEN(ts); i++) {
        if (i != 2) {
            CHECKF(gguf_writer_write_data(w, ts[i].data, ts[i].nbytes, &err) == 0, "%s", err.msg);
            continue;
        }
        /* in parts (write_part): a whole write mid-tensor and a part past its end are refused */
        CHECKF(gguf_writer_write_part(w, ts[i].data, 5, &err) == 0, "%s", err.msg);
        CHECK(gguf_writer_write_data(w, ts[i].data, ts[i].nbytes, &err) < 0);
        CHECK(gguf_writer_write_part(w, ts[i].data + 5, ts[i].nbytes, &err) < 0 && strstr(err.msg, "more bytes"));
        CHECKF(gguf_writer_write_part(w, ts[i].data + 5, 0, &err) == 0, "%s", err.msg);
        CHECKF(gguf_writer_write_part(w, ts[i].data + 5, ts[i].nbytes - 5, &err) == 0, "%s", err.msg);
    }
    CHECK(gguf_writer_write_data(w, ts[0].data, ts[0].nbytes, &err) < 0 && strstr(err.msg, "already written"));
    CHECK(gguf_writer_write_part(w, ts[0].data, 1, &err) < 0 && strstr(err.msg, "already written"));
    CHECKF(gguf_writer_finish(w, &err) == 0, "%s", err.msg);
    gguf_writer_free(w);
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(file_exists(path) && !file_exists(tmp));

    gguf_ctx *ctx = gguf_open(path, &err);
    CHECKF(ctx != NULL, "%s", err.msg);
    if (ctx) {
        CHECK(gguf_version(ctx) == 3 && gguf_alignment(ctx) == 32);
        CHECK(gguf_n_kv(ctx) == 12 + gguf_n_kv(sc));
        CHECK(!strcmp(gguf_key(ctx, 0), "general.architecture"));
        CHECK(!strcmp(gguf_key(ctx, 2), "k.i32")); /* replacement kept its place */
        uint32_t u;
        int64_t i64;
        float f;
        bool b;
        gguf_str s;
        CHECK(gguf_get_u32(ctx, "k.u32", &u) && u == 4000000000u);
        CHECK(gguf_get_i64(ctx, "k.u32", &i64) && i64 == 4000000000LL);
        CHECK(gguf_get_i64(ctx, "k.i32", &i64) && i64 == -8);
        CHECK(!gguf_get_u32(ctx, "k.i32", &u));        /* negative does not fit */
        CHECK(gguf_get_i64(ctx, "k.u64", &i64) && i64 == 1LL << 40);
        CHECK(!gguf_get_u32(ctx, "k.u64", &u));
        CHECK(!gguf_get_i64(ctx, "k.u64big", &i64));
        CHECK(gguf_get_f32(ctx, "k.f32", &f) && f == 1.5f);
        CHECK(gguf_get_bool(ctx, "k.bool", &b) && b);
        CHECK(!gguf_get_bool(ctx, "k.u32", &b));
        CHECK(gguf_get_str(ctx, "k.empty", &s) && s.n == 0);
        CHECK(gguf_kv_type(ctx, gguf_find_key(ctx, "k.u64")) == GGUF_VT_UINT64);
        CHECK(gguf_find_key(ctx, "k.gone") < 0);
        int et;
        uint64_t n;
        const void *d;
        CHECK(gguf_get_arr(ctx, "k.iarr", &et, &n, &d) && et == GGUF_VT_INT32 && n == 5 && !memcmp(d, ia, sizeof ia));
        CHECK(gguf_get_arr(ctx, "k.farr", &et, &n, &d) && et == GGUF_VT_FLOAT32 && n == 3 && !memcmp(d, fa, sizeof fa));
        CHECK(gguf_get_arr(ctx, "k.none", &et, &n, &d) && et == GGUF_VT_UINT8 && n == 0);
        CHECK(gguf_get_arr(ctx, "k.sarr", &et, &n, NULL) && et == GGUF_VT_STRING && n == 3);
        for (uint64_t i = 0; i < 3; i++)
            CHECK(gguf_get_arr_str(ctx, "k.sarr", i, &s) && s.n == sa[i].n && !memcmp(s.s, sa[i].s, s.n));
        /* the copied scalars */
        CHECK(gguf_get_u32(ctx, "s.u8", &u) && u == 200);
        CHECK(gguf_get_i64(ctx, "s.i8", &i64) && i64 == -100);
        CHECK(gguf_get_u32(ctx, "s.u16", &u) && u == 0x1234);
        CHECK(gguf_get_i64(ctx, "s.i16", &i64) && i64 == -32768);
        CHECK(gguf_get_i64(ctx, "s.i64", &i64) && i64 == -5000000000LL);
        CHECK(gguf_get_f32(ctx, "s.f64", &f) && f == -2.25f);
        CHECK(gguf_get_arr(ctx, "s.iarr", &et, &n, &d) && et == GGUF_VT_INT16 && n == 2);
        for (int64_t i = 0; i < gguf_n_kv(sc); i++) {
            int64_t j = gguf_find_key(ctx, gguf_key(sc, i));
            CHECK(j >= 0 && gguf_kv_type(ctx, j) == gguf_kv_type(sc, i));
        }
        CHECK(gguf_n_tensors(ctx) == (int64_t)HR_ARRAY_LEN(ts));
        for (size_t i = 0; i < HR_ARRAY_LEN(ts); i++) {
            const gguf_tensor *t = gguf_tensor_at(ctx, (int64_t)i);
            CHECK(t && !strcmp(t->name, ts[i].name) && t->type == ts[i].type && t->n_dims == ts[i].n_dims);
            CHECK(t && !memcmp(t->ne, ts[i].ne, sizeof t->ne) && t->nbytes == ts[i].nbytes);
            CHECK(t && t->offset % 32 == 0 && !memcmp(t->data, ts[i].data, ts[i].nbytes));
        }
        CHECK(gguf_file_size(ctx) % 32 == 0);
        check_ctx(ctx);
        save_seed("written.gguf", gguf_base(ctx), gguf_file_size(ctx));
        gguf_close(ctx);
    }

    /* refusing to overwrite, then overwriting on request, with 64-byte alignment */
    w = gguf_writer_create();
    CHECK(gguf_writer_set_u32(w, "general.alignment", 64) == 0);
    CHECK(gguf_writer_add_tensor(w, ts[1].name, ts[1].type, ts[1].n_dims, ts[1].ne, &err) == 0);
    CHECK(gguf_writer_add_tensor(w, ts[0].name, ts[0].type, ts[0].n_dims, ts[0].ne, &err) == 0);
    CHECK(gguf_writer_begin(w, path, false, &err) == HR_EEXIST && strstr(err.msg, "--force") && strstr(err.msg, path));
    CHECKF(gguf_writer_begin(w, path, true, &err) == 0, "%s", err.msg);
    CHECK(gguf_writer_write_data(w, ts[1].data, ts[1].nbytes, &err) == 0);
    CHECK(gguf_writer_finish(w, &err) < 0 && strstr(err.msg, "1 of 2"));
    CHECK(gguf_writer_write_data(w, ts[0].data, ts[0].nbytes, &err) == 0);
    CHECKF(gguf_writer_finish(w, &err) == 0, "%s", err.msg);
    gguf_writer_free(w);
    ctx = gguf_open(path, &err);
    CHECKF(ctx != NULL, "%s", err.msg);
    if (ctx) {
        CHECK(gguf_alignment(ctx) == 64 && gguf_data_offset(ctx) % 64 == 0 && gguf_n_tensors(ctx) == 2);
        const gguf_tensor *t = gguf_find_tensor(ctx, "w.f32");
        CHECK(t && t->offset == 64 && !memcmp(t->data, ts[0].data, ts[0].nbytes));
        gguf_close(ctx);
    }

    /* a bad alignment is refused at begin */
    w = gguf_writer_create();
    CHECK(gguf_writer_set_u32(w, "general.alignment", 48) == 0);
    CHECK(gguf_writer_begin(w, path, true, &err) < 0 && strstr(err.msg, "power of two"));
    gguf_writer_free(w);

    /* freed before finish: nothing left behind, not even the .tmp */
    char path2[200];
    snprintf(path2, sizeof path2, "%s/abandoned.gguf", tmpdir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path2);
    w = gguf_writer_create();
    CHECK(gguf_writer_add_tensor(w, ts[0].name, ts[0].type, ts[0].n_dims, ts[0].ne, &err) == 0);
    CHECK(gguf_writer_begin(w, path2, false, &err) == 0);
    CHECK(file_exists(tmp) && !file_exists(path2));
    CHECK(gguf_writer_write_data(w, ts[0].data, ts[0].nbytes, &err) == 0);
    gguf_writer_free(w);
    CHECK(!file_exists(tmp) && !file_exists(path2));

    /* a directory that does not exist */
    w = gguf_writer_create();
    snprintf(path2, sizeof path2, "%s/no/such/dir.gguf", tmpdir);
    CHECK(gguf_writer_begin(w, path2, false, &err) < 0 && strstr(err.msg, "no/such"));
    gguf_writer_free(w);

    for (size_t i = 0; i < HR_ARRAY_LEN(ts); i++) free(ts[i].data);
    gguf_close(sc);
    free(sf);
    unlink(path);
}

/* Copy a real model kv by kv and tensor by tensor; the copy must read back identical. */
static void test_writer_copy_model(const char *shared) {
    hr_err err = {0};
    gguf_ctx *src = gguf_open(test_path(shared, "models/stories260K.gguf"), &err);
    CHECKF(src != NULL, "%s", err.msg);
    if (!src) return;
    char path[128];
    snprintf(path, sizeof path, "%s/copy.gguf", tmpdir);
    gguf_writer *w = gguf_writer_create();
    for (int64_t i = 0; i < gguf_n_kv(src); i++) CHECK(gguf_writer_copy_kv(w, src, i) == 0);
    for (int64_t i = 0; i < gguf_n_tensors(src); i++) {
        const gguf_tensor *t = gguf_tensor_at(src, i);
        CHECK(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, &err) == 0);
    }
    CHECKF(gguf_writer_begin(w, path, false, &err) == 0, "%s", err.msg);
    for (int64_t i = 0; i < gguf_n_tensors(src); i++) {
        const gguf_tensor *t = gguf_tensor_at(src, i);
        CHECK(gguf_writer_write_data(w, t->data, t->nbytes, &err) == 0);
    }
    CHECKF(gguf_writer_finish(w, &err) == 0, "%s", err.msg);
    gguf_writer_free(w);

    gguf_ctx *dst = gguf_open(path, &err);
    CHECKF(dst != NULL, "%s", err.msg);
    if (dst) {
        /* same layout as llama.cpp writes it: the whole file is byte-identical */
        CHECK(gguf_file_size(dst) == gguf_file_size(src) &&
              !memcmp(gguf_base(dst), gguf_base(src), gguf_file_size(src)));
        CHECK(gguf_n_kv(dst) == gguf_n_kv(src) && gguf_n_tensors(dst) == gguf_n_tensors(src));
        gguf_str a, b;
        for (uint64_t i = 0; i < 512; i += 37)
            CHECK(gguf_get_arr_str(dst, "tokenizer.ggml.tokens", i, &a) &&
                  gguf_get_arr_str(src, "tokenizer.ggml.tokens", i, &b) && a.n == b.n && !memcmp(a.s, b.s, a.n));
        gguf_close(dst);
    }
    gguf_close(src);
    unlink(path);
}

int main(void) {
    const char *shared = test_shared_dir();
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test-gguf-XXXXXX");
    REQUIRE(mkdtemp(tmpdir) != NULL);
    /* the reader takes block sizes from the quant table */
    REQUIRE(hq_type_valid(HQ_TYPE_F32) && hq_type_valid(HQ_TYPE_Q6_K));

    test_stories(shared);
    test_models_dir(shared);
    test_small_valid();
    test_hostile_patches();
    test_truncation(shared);
    test_flips(shared);
    test_writer_roundtrip();
    test_writer_copy_model(shared);

    rmdir(tmpdir);
    return test_summary();
}
