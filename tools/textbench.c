/* textbench — speed of the text module: the tokenizer's MB/s on a text file with each given
 * vocabulary, and the sampler's ms per token on a 151936-entry vocabulary (Qwen2's) under common
 * settings. Prints figures, asserts nothing; the tests check correctness.
 *
 * usage: textbench [-f TEXT (default /usr/share/common-licenses/GPL-3)] [VOCAB.gguf ...]
 */
#include "gguf/gguf.h"
#include "text/text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n == cap) {
            char *nb = realloc(buf, cap = cap ? 2 * cap : 1 << 16);
            if (!nb) { free(buf); fclose(f); return NULL; }
            buf = nb;
        }
        const size_t got = fread(buf + n, 1, cap - n, f);
        if (got == 0) break;
        n += got;
    }
    fclose(f);
    *len = n;
    return buf;
}

/* tokenizes the text repeatedly for at least half a second */
static int bench_tokenizer(const char *vocab_path, const char *text, size_t len) {
    hr_err err = {0};
    gguf_ctx *g = gguf_open(vocab_path, &err);
    ht_vocab *v = g ? ht_vocab_load(g, &err) : NULL;
    if (!v) {
        fprintf(stderr, "textbench: %s: %s\n", vocab_path, err.msg);
        gguf_close(g);
        return 1;
    }
    const int n = ht_tokenize(v, text, len, false, NULL, 0);
    int32_t *ids = n > 0 ? malloc(sizeof *ids * (size_t)n) : NULL;
    int rc = 1;
    if (ids) {
        const double t0 = hr_time_s();
        double t;
        int reps = 0;
        do {
            ht_tokenize(v, text, len, false, ids, n);
            reps++;
            t = hr_time_s() - t0;
        } while (t < 0.5);
        printf("tokenizer %s: %zu bytes -> %d tokens, %.1f MB/s (%d runs)\n", vocab_path, len, n,
               (double)len * reps / t / 1e6, reps);
        rc = 0;
    } else {
        fprintf(stderr, "textbench: %s: tokenize gave %d\n", vocab_path, n);
    }
    free(ids);
    ht_vocab_free(v);
    gguf_close(g);
    return rc;
}

static void bench_sampler(void) {
    enum { N = 151936, RUNS = 50 };
    float *logits = malloc(sizeof *logits * N), *tmp = malloc(sizeof *tmp * N);
    if (!logits || !tmp) { free(logits), free(tmp); return; }
    uint64_t rng = 99;
    for (int i = 0; i < N; i++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        logits[i] = (float)(rng >> 40) / (float)(1 << 24) * 8.0f + (i % 97 == 0 ? 6.0f : 0.0f);
    }
    struct { const char *name; float top_p, min_p; int top_k; float temp; } cfg[] = {
        {"defaults (top-k 40)", -1, -1, -1, -1},
        {"top-k off, top-p 0.95", 0.95f, 0.0f, 0, 0.8f},
        {"top-k off, min-p 0.05, top-p 0.95", 0.95f, 0.05f, 0, 0.8f},
        {"greedy", 1.0f, 0.0f, 0, 0.0f},
    };
    for (size_t c = 0; c < HR_ARRAY_LEN(cfg); c++) {
        ht_sampler_params p = ht_sampler_default_params();
        if (cfg[c].temp >= 0) {
            p.temp = cfg[c].temp, p.top_k = cfg[c].top_k, p.top_p = cfg[c].top_p, p.min_p = cfg[c].min_p;
            p.seed = 1;
        }
        p.repeat_penalty = 1.1f;
        ht_sampler *s = ht_sampler_create(&p, N);
        if (!s) continue;
        for (int i = 0; i < 64; i++) ht_sampler_accept(s, i * 17);
        const double t0 = hr_time_s();
        for (int r = 0; r < RUNS; r++) {
            memcpy(tmp, logits, sizeof *tmp * N);
            ht_sampler_sample(s, tmp);
        }
        printf("sampler, %d-token vocab, %s: %.3f ms/token\n", N, cfg[c].name, (hr_time_s() - t0) * 1e3 / RUNS);
        ht_sampler_free(s);
    }
    free(logits);
    free(tmp);
}

int main(int argc, char **argv) {
    const char *text_path = "/usr/share/common-licenses/GPL-3";
    int first_vocab = 1;
    if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf("usage: textbench [-f TEXT] [VOCAB.gguf ...]\n");
        return 0;
    }
    if (argc > 2 && !strcmp(argv[1], "-f")) text_path = argv[2], first_vocab = 3;
    hr_init();
    int rc = 0;
    if (first_vocab < argc) {
        size_t len = 0;
        char *text = read_all(text_path, &len);
        if (!text) {
            fprintf(stderr, "textbench: cannot read %s\n", text_path);
            return 1;
        }
        for (int i = first_vocab; i < argc; i++) rc |= bench_tokenizer(argv[i], text, len);
        free(text);
    }
    bench_sampler();
    return rc;
}
