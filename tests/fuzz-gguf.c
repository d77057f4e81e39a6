// fuzz-gguf — libFuzzer harness for the GGUF reader (built with clang by scripts/fuzz.sh, not CMake).
//
// Every input is opened with gguf_open_buffer; when it opens, everything the ctx hands out is
// walked and checked to lie inside the input, and every kv is copied into a writer (exercising
// gguf_writer_copy_kv). A crash, sanitizer report or failed check is a bug; a refusal is not.
//
// `scripts/fuzz.sh -t SECONDS` builds it, seeds it with the small valid files test-gguf writes
// (HEARTH_GGUF_SEED_DIR; every value type and several tensor types, so the fuzzer need not
// rediscover the magic and the header) and runs it; CI runs it for 30 s.
//
// fuzz-sources: src/gguf/*.c src/base/*.c src/quant/*.c
// fuzz-max-len: 65536
// fuzz-seed-test: test-gguf HEARTH_GGUF_SEED_DIR
#include "gguf/gguf.h"
#include "quant/quant.h"

#include <stdio.h>
#include <stdlib.h>

#define FUZZ_CHECK(x) do { if (!(x)) { fprintf(stderr, "fuzz-gguf: check failed: %s\n", #x); abort(); } } while (0)

static bool inside(const uint8_t *base, size_t size, const void *p, uint64_t n) {
    const uint8_t *q = p;
    return q >= base && (uint64_t)(q - base) <= size && n <= size - (uint64_t)(q - base);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    hr_err err = {0};
    gguf_ctx *ctx = gguf_open_buffer(data, size, &err);
    if (!ctx) {
        FUZZ_CHECK(err.code < 0 && err.msg[0]);
        return 0;
    }
    static const int vsz[GGUF_VT_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    gguf_writer *w = gguf_writer_create();
    for (int64_t i = 0; i < gguf_n_kv(ctx); i++) {
        const char *k = gguf_key(ctx, i);
        FUZZ_CHECK(k && gguf_find_key(ctx, k) == i);
        int t = gguf_kv_type(ctx, i);
        gguf_str s;
        uint32_t u;
        int64_t i64;
        float f;
        bool b;
        char buf[16];
        (void)gguf_get_u32(ctx, k, &u);
        (void)gguf_get_i64(ctx, k, &i64);
        (void)gguf_get_f32(ctx, k, &f);
        (void)gguf_get_bool(ctx, k, &b);
        (void)gguf_get_cstr(ctx, k, buf, sizeof buf);
        if (t == GGUF_VT_STRING) FUZZ_CHECK(gguf_get_str(ctx, k, &s) && inside(data, size, s.s, s.n));
        if (t == GGUF_VT_ARRAY) {
            int et;
            uint64_t n;
            const void *d;
            FUZZ_CHECK(gguf_get_arr(ctx, k, &et, &n, &d));
            if (et == GGUF_VT_STRING)
                for (uint64_t j = 0; j < n; j++)
                    FUZZ_CHECK(gguf_get_arr_str(ctx, k, j, &s) && inside(data, size, s.s, s.n));
            else
                FUZZ_CHECK(et >= 0 && et < GGUF_VT_COUNT && vsz[et] && inside(data, size, d, n * (uint64_t)vsz[et]));
        }
        FUZZ_CHECK(gguf_writer_copy_kv(w, ctx, i) == 0);
    }
    gguf_writer_free(w);
    for (int64_t i = 0; i < gguf_n_tensors(ctx); i++) {
        const gguf_tensor *t = gguf_tensor_at(ctx, i);
        FUZZ_CHECK(gguf_find_tensor(ctx, t->name) == t);
        FUZZ_CHECK(inside(data, size, t->data, t->nbytes));
        FUZZ_CHECK(t->offset % gguf_alignment(ctx) == 0);
        int64_t rows = t->ne[0] ? gguf_tensor_nelements(t) / t->ne[0] : 0;
        FUZZ_CHECK(t->nbytes == hq_row_size(t->type, t->ne[0]) * (uint64_t)rows);
        /* touch the first and last byte so ASan checks the range really is readable */
        if (t->nbytes) {
            volatile uint8_t x = ((const uint8_t *)t->data)[0];
            x = ((const uint8_t *)t->data)[t->nbytes - 1];
            (void)x;
        }
    }
    gguf_close(ctx);
    return 0;
}
