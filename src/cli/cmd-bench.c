/* hearth bench: prompt-processing and generation speed, like llama-bench */
#include "cli.h"

#include "gguf/gguf.h"
#include "model/model.h"
#include "quant/quant.h"

#include <stdio.h>
#include <math.h>
#include <stdlib.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: hearth bench -m MODEL [options]\n\n"
            "Measures prompt processing (ppN: N tokens in batches of -b) and text generation (tgN: N\n"
            "tokens one at a time from an empty context), reporting the median tokens/s over -r runs\n"
            "after one warm-up run, as llama-bench does.\n\n"
            "options:\n"
            "  -m, --model FILE      GGUF model (required)\n"
            "  -t, --threads LIST    thread counts, comma-separated (default: physical cores = %d)\n"
            "  -p, --n-prompt LIST   prompt lengths, comma-separated (default 512; 0 skips)\n"
            "  -n, --n-gen LIST      generation lengths, comma-separated (default 128; 0 skips)\n"
            "  -b, --batch-size N    prompt batch size (default 512)\n"
            "  -r, --repetitions N   runs per test (default 5)\n"
            "  --kv-type f16|f32     KV cache element type (default f16)\n"
            "  --json                print a JSON list of {test, threads, tok_per_s, reps, ...}\n"
            "  -h, --help            this help\n",
            hr_physical_cores());
}

static int parse_list(const char *flag, const char *v, long lo, long hi, long *out, int cap) {
    int n = 0;
    char *copy = strdup(v), *save = NULL;
    if (!copy) return -1;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == cap || !cli_parse_int("bench", flag, tok, lo, hi, &out[n])) { free(copy); return -1; }
        n++;
    }
    free(copy);
    return n;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int cmd_bench(int argc, char **argv) {
    const char *model = NULL, *v;
    long th[16], pp[16] = {512}, tg[16] = {128}, reps = 5, n_batch = 512;
    int n_th = 1, n_pp = 1, n_tg = 1;
    th[0] = hr_physical_cores();
    bool json = false;
    int kv_type = HQ_TYPE_F16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { if (!(model = cli_value("bench", argc, argv, &i))) return 2; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!(v = cli_value("bench", argc, argv, &i)) || (n_th = parse_list(a, v, 1, 1024, th, 16)) < 1) return 2;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--n-prompt")) {
            if (!(v = cli_value("bench", argc, argv, &i)) || (n_pp = parse_list(a, v, 0, 1 << 20, pp, 16)) < 1) return 2;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-gen")) {
            if (!(v = cli_value("bench", argc, argv, &i)) || (n_tg = parse_list(a, v, 0, 1 << 20, tg, 16)) < 1) return 2;
        } else if (!strcmp(a, "-r") || !strcmp(a, "--repetitions")) {
            if (!(v = cli_value("bench", argc, argv, &i)) || !cli_parse_int("bench", a, v, 1, 1000, &reps)) return 2;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            if (!(v = cli_value("bench", argc, argv, &i)) || !cli_parse_int("bench", a, v, 1, 1 << 16, &n_batch)) return 2;
        } else if (!strcmp(a, "--kv-type")) {
            if (!(v = cli_value("bench", argc, argv, &i))) return 2;
            if (!strcmp(v, "f16")) kv_type = HQ_TYPE_F16;
            else if (!strcmp(v, "f32")) kv_type = HQ_TYPE_F32;
            else { fprintf(stderr, "hearth bench: --kv-type must be f16 or f32\n"); return 2; }
        } else if (!strcmp(a, "--json")) json = true;
        else { fprintf(stderr, "hearth bench: unknown option '%s'\n", a); usage(stderr); return 2; }
    }
    if (!model) { fprintf(stderr, "hearth bench: -m MODEL is required\n"); usage(stderr); return 2; }

    int rc = 1;
    hr_err err = {0};
    gguf_ctx *g = NULL;
    hm_model *m = NULL;
    float *logits = NULL;
    int32_t *toks = NULL;
    double *runs = NULL;
    if (!(g = gguf_open(model, &err)) || !(m = hm_model_load(g, &err))) goto done;
    long max_len = 1;
    for (int i = 0; i < n_pp; i++) max_len = HR_MAX(max_len, pp[i]);
    for (int i = 0; i < n_tg; i++) max_len = HR_MAX(max_len, tg[i]);
    logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
    toks = malloc((size_t)max_len * sizeof(int32_t));
    runs = malloc((size_t)reps * sizeof(double));
    if (!logits || !toks || !runs) { hr_fail(&err, HR_ENOMEM, "out of memory"); goto done; }
    uint64_t rng = 0x9e3779b97f4a7c15ULL;
    for (long i = 0; i < max_len; i++) {
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
        toks[i] = (int32_t)(rng % (uint64_t)m->hp.n_vocab);
    }
    double size_gib = hm_model_weight_bytes(m) / 1073741824.0;
    if (json) printf("[");
    else {
        printf("| model | size | threads | kernels | test | t/s |\n");
        printf("| ----- | ---: | ------: | ------- | ---- | --: |\n");
    }
    int n_out = 0;
    for (int ti = 0; ti < n_th; ti++) {
        hm_ctx_params cp = hm_ctx_default_params();
        cp.n_ctx = (int32_t)HR_MAX(max_len, 16);
        cp.n_batch = (int32_t)n_batch;
        cp.n_threads = (int32_t)th[ti];
        cp.kv_type = kv_type;
        hm_shard sh = hm_shard_full(m);
        hm_ctx *c = hm_ctx_create(m, &sh, &cp, &err);
        if (!c) goto done;
        for (int kind = 0; kind < 2; kind++) {
            long *lens = kind == 0 ? pp : tg;
            int nl = kind == 0 ? n_pp : n_tg;
            for (int li = 0; li < nl; li++) {
                long len = lens[li];
                if (len == 0) continue;
                for (long r = -1; r < reps; r++) { /* r = -1: warm-up */
                    int64_t t0 = hr_time_ns();
                    if (kind == 0) {
                        for (long i = 0; i < len; i += n_batch) {
                            int nb = (int)HR_MIN(n_batch, len - i);
                            if (hm_eval(c, toks + i, NULL, nb, (int32_t)i, logits, false, NULL, &err)) { hm_ctx_free(c); goto done; }
                        }
                    } else {
                        for (long i = 0; i < len; i++)
                            if (hm_eval(c, toks + i, NULL, 1, (int32_t)i, logits, false, NULL, &err)) { hm_ctx_free(c); goto done; }
                    }
                    double s = (hr_time_ns() - t0) * 1e-9;
                    if (r >= 0) runs[r] = len / s;
                }
                qsort(runs, (size_t)reps, sizeof(double), cmp_double);
                double med = reps % 2 ? runs[reps / 2] : 0.5 * (runs[reps / 2 - 1] + runs[reps / 2]);
                double mean = 0, var = 0;
                for (long r = 0; r < reps; r++) mean += runs[r];
                mean /= reps;
                for (long r = 0; r < reps; r++) var += (runs[r] - mean) * (runs[r] - mean);
                double sd = reps > 1 ? sqrt(var / (reps - 1)) : 0;
                char test[32];
                snprintf(test, sizeof test, "%s%ld", kind == 0 ? "pp" : "tg", len);
                if (json)
                    printf("%s\n  {\"test\": \"%s\", \"threads\": %ld, \"tok_per_s\": %.3f, \"reps\": %ld, "
                           "\"stddev\": %.3f, \"model\": \"%s\", \"model_bytes\": %llu, \"kernels\": \"%s\"}",
                           n_out ? "," : "", test, th[ti], med, reps, sd, m->hp.arch_name,
                           (unsigned long long)hm_model_weight_bytes(m), hq_simd_name());
                else
                    printf("| %s %s | %.2f GiB | %ld | %s | %s | %.2f ± %.2f |\n", m->hp.arch_name,
                           m->hp.name[0] ? m->hp.name : "", size_gib, th[ti], hq_simd_name(), test, med, sd);
                fflush(stdout);
                n_out++;
            }
        }
        hm_ctx_free(c);
    }
    if (json) printf("\n]\n");
    rc = 0;
done:
    if (rc) fprintf(stderr, "hearth bench: %s\n", err.msg[0] ? err.msg : "failed");
    free(logits);
    free(toks);
    free(runs);
    hm_model_free(m);
    gguf_close(g);
    return rc;
}
