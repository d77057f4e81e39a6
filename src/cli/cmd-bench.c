/* hearth bench: prompt-processing and generation speed, like llama-bench */
#include "cli.h"

#include "gguf/gguf.h"
#include "mem/mem.h"
#include "model/model.h"
#include "quant/quant.h"

#include <stdio.h>
#include <math.h>
#include <stdlib.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: hearth bench -m MODEL [options]\n\n"
            "Measures prompt processing (ppN: N tokens in batches of -b) and text generation (tgN: N\n"
            "tokens one at a time), each from an empty context or after -d tokens already in it,\n"
            "reporting the median tokens/s over -r runs after one warm-up run, as llama-bench does.\n\n"
            "options:\n"
            "  -m, --model FILE      GGUF model (required)\n"
            "  -t, --threads LIST    thread counts, comma-separated (default: physical cores = %d)\n"
            "  -p, --n-prompt LIST   prompt lengths, comma-separated (default 512; 0 skips)\n"
            "  -n, --n-gen LIST      generation lengths, comma-separated (default 128; 0 skips)\n"
            "  -d, --n-depth LIST    tokens already in the context when a test starts, comma-separated\n"
            "                        (default 0): they are processed as a prompt once per test, untimed,\n"
            "                        and the test's tokens attend to them (shown as \"tg128 @ d1024\")\n"
            "  -b, --batch-size N    prompt batch size (default 512)\n"
            "  -r, --repetitions N   runs per test (default 5)\n"
            "  --kv-type f16|f32     KV cache element type (default f16)\n"
            "  --mem-budget SIZE     memory for weights + KV cache + scratch: 300M, 1.5G, N%% (of the\n"
            "                        model's weights, plus KV cache and scratch), auto (%.0f%% of\n"
            "                        MemAvailable / the cgroup limit; the default) or off (plain mmap).\n"
            "                        Given, the table adds memory figures per test: ms/token, disk\n"
            "                        bytes/token, time blocked on weights/token, resident weights, pressure\n"
            "  --window W            blocks streamed ahead when the weights do not fit (default 2)\n"
            "  --pin run|spread|ffn|none  which blocks stay resident beside the window (default run)\n"
            "%s"
            "  --roofline            after every generated token (untimed), read the weights that token\n"
            "                        read once more as a plain stream with the same threads: the memory\n"
            "                        roofline measured in the same seconds as the token, so a machine\n"
            "                        whose bandwidth drifts still gives a true fraction. Adds roofline t/s\n"
            "                        (weights / stream time) and the fraction of it each tgN reached\n"
            "                        (tests at -d 0 only: at depth the KV cache is read too)\n"
            "  --json                print a JSON list of {test, threads, tok_per_s, reps, ...}\n"
            "  -h, --help            this help\n",
            hr_physical_cores(), 100 * HMEM_DEFAULT_FRACTION, cli_weights_help);
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

/* memory figures of one run of a test */
typedef struct mem_run {
    double disk_per_tok;     /* bytes read from storage */
    double loaded_per_tok;   /* bytes the manager loaded */
    double blocked_ms_per_tok;
    double resident_med, resident_max;
} mem_run;

/* the weights a generated token reads: every block's, the output head's; the embedding table gives
   one row (not counted, unless it is also the head) */
static int decode_spans(const hm_model *m, hr_span **out, uint64_t *bytes, hr_err *err) {
    int cap = (m->hp.n_layer + 1) * 2 * 16, k = 0; /* a block has at most 10 tensors */
    hr_span *sp = malloc((size_t)cap * sizeof *sp);
    if (!sp) return hr_fail(err, HR_ENOMEM, "out of memory");
    for (int l = 0; l < m->hp.n_layer; l++) {
        k += hm_block_weights(m, l, HM_BLOCK_ATTN, sp + k, cap - k);
        k += hm_block_weights(m, l, HM_BLOCK_FFN, sp + k, cap - k);
    }
    k += hm_block_weights(m, m->hp.n_layer, HM_BLOCK_OUTPUT, sp + k, cap - k);
    HR_ASSERT(k <= cap);
    *bytes = 0;
    for (int i = 0; i < k; i++) *bytes += sp[i].len;
    *out = sp;
    return k;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static double median(double *v, long n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* --mem-budget N%: N% of the weights plus KV cache and scratch */
static bool parse_percent(const char *v, double *pct) {
    char *end;
    size_t n = strlen(v);
    if (n < 2 || v[n - 1] != '%') return false;
    *pct = strtod(v, &end);
    return end == v + n - 1 && *pct > 0 && *pct <= 1000;
}

int cmd_bench(int argc, char **argv) {
    const char *model = NULL, *v;
    long th[16], pp[16] = {512}, tg[16] = {128}, dp[16] = {0}, reps = 5, n_batch = 512, window = 2;
    int n_th = 1, n_pp = 1, n_tg = 1, n_dp = 1;
    th[0] = hr_physical_cores();
    bool json = false, figures = false, mem_on = true, roofline = false;
    uint64_t mem_budget = 0;
    double mem_pct = 0;
    hmem_pin pin = hmem_default_params().pin;
    int kv_type = HQ_TYPE_F16;
    cli_weights wf = {0};
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
        } else if (!strcmp(a, "-d") || !strcmp(a, "--n-depth")) {
            if (!(v = cli_value("bench", argc, argv, &i)) || (n_dp = parse_list(a, v, 0, 1 << 20, dp, 16)) < 1) return 2;
        } else if (!strcmp(a, "-r") || !strcmp(a, "--repetitions")) {
            if (!(v = cli_value("bench", argc, argv, &i)) || !cli_parse_int("bench", a, v, 1, 1000, &reps)) return 2;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            if (!(v = cli_value("bench", argc, argv, &i)) || !cli_parse_int("bench", a, v, 1, 1 << 16, &n_batch)) return 2;
        } else if (!strcmp(a, "--kv-type")) {
            if (!(v = cli_value("bench", argc, argv, &i))) return 2;
            if (!strcmp(v, "f16")) kv_type = HQ_TYPE_F16;
            else if (!strcmp(v, "f32")) kv_type = HQ_TYPE_F32;
            else { fprintf(stderr, "hearth bench: --kv-type must be f16 or f32\n"); return 2; }
        } else if (!strcmp(a, "--mem-budget")) {
            if (!(v = cli_value("bench", argc, argv, &i))) return 2;
            figures = true;
            mem_pct = 0;
            if (parse_percent(v, &mem_pct)) mem_on = true;
            else if (hmem_parse_budget(v, &mem_on, &mem_budget)) {
                fprintf(stderr, "hearth bench: invalid --mem-budget '%s' (a size like 300M, N%%, auto or off)\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--window")) {
            if (!(v = cli_value("bench", argc, argv, &i)) || !cli_parse_int("bench", a, v, 1, 1 << 20, &window)) return 2;
        } else if (!strcmp(a, "--pin")) {
            if (!(v = cli_value("bench", argc, argv, &i))) return 2;
            if (!strcmp(v, "spread")) pin = HMEM_PIN_SPREAD;
            else if (!strcmp(v, "ffn")) pin = HMEM_PIN_FFN;
            else if (!strcmp(v, "none")) pin = HMEM_PIN_NONE;
            else if (!strcmp(v, "run")) pin = HMEM_PIN_RUN;
            else { fprintf(stderr, "hearth bench: --pin must be spread, run, ffn or none\n"); return 2; }
        } else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--roofline")) roofline = true;
        else if (cli_weights_flag(&wf, argv, i)) continue;
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
    mem_run *mruns = NULL;
    double *tmp = NULL;
    uint64_t *res = NULL;
    hmem *mm = NULL;
    hm_ctx *c = NULL;
    hr_pool *pool = NULL;
    hr_span *spans = NULL;
    double *roof = NULL;
    int n_spans = 0;
    uint64_t roof_bytes = 0;
    if (!(g = gguf_open(model, &err)) || !(m = hm_model_load(g, &err))) goto done;
    long max_len = 1;
    for (int i = 0; i < n_pp; i++) max_len = HR_MAX(max_len, pp[i]);
    for (int i = 0; i < n_tg; i++) max_len = HR_MAX(max_len, tg[i]);
    long max_depth = 0;
    for (int i = 0; i < n_dp; i++) max_depth = HR_MAX(max_depth, dp[i]);
    logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
    toks = malloc((size_t)(max_depth + max_len) * sizeof(int32_t));
    runs = malloc((size_t)reps * sizeof(double));
    mruns = calloc((size_t)reps, sizeof *mruns);
    tmp = malloc((size_t)reps * sizeof(double));
    res = malloc((size_t)(max_len + 1) * sizeof *res);
    roof = malloc((size_t)reps * sizeof *roof);
    if (!logits || !toks || !runs || !mruns || !tmp || !res || !roof) { hr_fail(&err, HR_ENOMEM, "out of memory"); goto done; }
    uint64_t rng = 0x9e3779b97f4a7c15ULL;
    for (long i = 0; i < max_depth + max_len; i++) {
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
        toks[i] = (int32_t)(rng % (uint64_t)m->hp.n_vocab);
    }
    double size_gib = hm_model_weight_bytes(m) / 1073741824.0;
    if (json) printf("[");
    else if (figures) {
        printf("| model | size | threads | kernels | test | t/s | mem | ms/tok | disk MiB/tok | blocked ms/tok | "
               "resident MiB | pressure |%s\n", roofline ? " roofline t/s | of roofline |" : "");
        printf("| ----- | ---: | ------: | ------- | ---- | --: | --- | -----: | -----------: | -------------: | "
               "-----------: | -------: |%s\n", roofline ? " -----------: | ----------: |" : "");
    } else {
        printf("| model | size | threads | kernels | test | t/s |%s\n", roofline ? " roofline t/s | of roofline |" : "");
        printf("| ----- | ---: | ------: | ------- | ---- | --: |%s\n", roofline ? " -----------: | ----------: |" : "");
    }
    int n_out = 0;
    for (int ti = 0; ti < n_th; ti++) {
        hm_ctx_params cp = hm_ctx_default_params();
        cp.n_ctx = (int32_t)HR_MAX(max_depth + max_len, 16);
        cp.n_batch = (int32_t)n_batch;
        cp.n_threads = (int32_t)th[ti];
        cp.kv_type = kv_type;
        if (!(pool = hr_pool_create((int)th[ti], &err))) goto done;
        cp.pool = pool;
        hm_shard sh = hm_shard_full(m);
        /* the residency manager (observing only with --mem-budget off, for the figures) */
        hmem_params mp = hmem_default_params();
        mp.ctx_bytes = hm_ctx_bytes_estimate(&m->hp, &cp);
        if (hmem_check_ctx(mp.ctx_bytes, &err)) goto done;
        mp.window = (int32_t)window;
        mp.pin = pin;
        mp.mode = mem_on ? HMEM_AUTO : HMEM_OBSERVE;
        mp.budget = mem_budget;
        if (mem_pct > 0) {
            hmem_params op = mp;
            op.mode = HMEM_OBSERVE;
            hmem *probe = hmem_create(m, &sh, model, &op, &err);
            if (!probe) goto done;
            mp.budget = (uint64_t)(mem_pct / 100.0 * (double)hmem_get_plan(probe)->weight_bytes) + mp.ctx_bytes;
            hmem_free(probe);
        }
        mm = hmem_create(m, &sh, model, &mp, &err);
        if (!mm && (figures || mp.budget)) goto done;
        if (!mm) { /* the default manager is a convenience, not a requirement */
            HR_LOGD("hearth bench: no residency manager: %s", err.msg);
            err.msg[0] = 0;
        }
        if (mm) hmem_attach(mm, &sh);
        if (hmem_load_weights(mm, m, &sh, wf.use_mmap, wf.no_repack, &err)) goto done;
        if (!(c = hm_ctx_create(m, &sh, &cp, &err))) goto done;
        if (roofline) { /* where the kernels read the weights now, after hmem_load_weights */
            if (mm && hmem_get_plan(mm)->mode == HMEM_STREAM) {
                hr_fail(&err, HR_EINVAL, "--roofline needs the weights resident, and under this --mem-budget they stream");
                goto done;
            }
            free(spans);
            spans = NULL;
            if ((n_spans = decode_spans(m, &spans, &roof_bytes, &err)) < 0) goto done;
        }
        /* every eval writes position p's KV from toks[p], so positions [0, filled) hold that prefix,
           whichever test wrote them: a test at depth d needs only [filled, d) filled first (its runs
           then write d .. d + len - 1 and overwrite nothing below) */
        long filled = 0;
        for (int kind = 0; kind < 2; kind++) {
            long *lens = kind == 0 ? pp : tg;
            int nl = kind == 0 ? n_pp : n_tg;
            for (int li = 0; li < nl * n_dp; li++) {
                const long len = lens[li / n_dp], depth = dp[li % n_dp];
                if (len == 0) continue;
                /* the context the test starts from: -d tokens as a prompt, untimed */
                for (long i = filled; i < depth;) {
                    const int nb = (int)HR_MIN(n_batch, depth - i);
                    const hm_batch b = {.tokens = toks + i, .n = nb, .pos = (int32_t)i, .logits = logits};
                    if (hm_eval(c, &b, &err)) goto done;
                    i += nb;
                }
                filled = HR_MAX(filled, depth + len);
                for (long r = -1; r < reps; r++) { /* r = -1: warm-up */
                    int64_t blocked = 0, sample_ns = 0, roof_ns = 0, read0 = hmem_proc_read_bytes();
                    uint64_t load0 = mm ? hmem_get_stats(mm).loaded_bytes : 0;
                    long n_res = 0;
                    int64_t t0 = hr_time_ns();
                    for (long i = 0; i < len;) {
                        int nb = kind == 0 ? (int)HR_MIN(n_batch, len - i) : 1;
                        const hm_batch b = {.tokens = toks + depth + i, .n = nb, .pos = (int32_t)(depth + i),
                                            .logits = logits};
                        if (hm_eval(c, &b, &err))
                            goto done;
                        blocked += hm_ctx_timings(c).weights_ns;
                        i += nb;
                        if (roofline && kind == 1 && depth == 0) { /* the same weights as one stream, not timed */
                            int64_t s0 = hr_time_ns();
                            (void)hr_pool_read(pool, spans, n_spans); /* a call through the pool: not elided */
                            roof_ns += hr_time_ns() - s0;
                        }
                        if (figures && mm) { /* per token (per batch for prompts), not timed */
                            int64_t s0 = hr_time_ns();
                            hmem_sample smp;
                            if (hmem_take_sample(mm, &smp) == 0) res[n_res++] = smp.resident;
                            sample_ns += hr_time_ns() - s0;
                        }
                    }
                    double s = (hr_time_ns() - t0 - sample_ns - roof_ns) * 1e-9;
                    if (r < 0) continue;
                    runs[r] = len / s;
                    roof[r] = roof_ns > 0 ? len / (roof_ns * 1e-9) : 0;
                    int64_t read1 = hmem_proc_read_bytes();
                    mem_run *mr = &mruns[r];
                    mr->disk_per_tok = read0 >= 0 && read1 >= 0 ? (double)(read1 - read0) / len : -1;
                    mr->loaded_per_tok = mm ? (double)(hmem_get_stats(mm).loaded_bytes - load0) / len : 0;
                    mr->blocked_ms_per_tok = blocked * 1e-6 / len;
                    qsort(res, (size_t)n_res, sizeof *res, cmp_u64);
                    mr->resident_med = n_res ? (double)res[n_res / 2] : 0;
                    mr->resident_max = n_res ? (double)res[n_res - 1] : 0;
                }
                double med = median(memcpy(tmp, runs, (size_t)reps * sizeof *tmp), reps);
                /* --roofline: medians of each run's stream rate and of its fraction */
                bool has_roof = roofline && kind == 1 && depth == 0;
                double roof_med = 0, frac_med = 0;
                if (has_roof) {
                    roof_med = median(memcpy(tmp, roof, (size_t)reps * sizeof *tmp), reps);
                    for (long r = 0; r < reps; r++) tmp[r] = roof[r] > 0 ? runs[r] / roof[r] : 0;
                    frac_med = median(tmp, reps);
                }
                char roof_cells[96] = "";
                if (roofline)
                    snprintf(roof_cells, sizeof roof_cells, has_roof ? " %.2f | %.1f%% |" : " | |", roof_med, 100 * frac_med);
                double mean = 0, var = 0;
                for (long r = 0; r < reps; r++) mean += runs[r];
                mean /= reps;
                for (long r = 0; r < reps; r++) var += (runs[r] - mean) * (runs[r] - mean);
                double sd = reps > 1 ? sqrt(var / (reps - 1)) : 0;
                /* medians of the memory figures over the runs */
                mem_run mf;
#define MED(field) do { for (long r = 0; r < reps; r++) tmp[r] = mruns[r].field; mf.field = median(tmp, reps); } while (0)
                MED(disk_per_tok); MED(loaded_per_tok); MED(blocked_ms_per_tok); MED(resident_med); MED(resident_max);
#undef MED
                hmem_stats ms = mm ? hmem_get_stats(mm) : (hmem_stats){0};
                const hmem_plan *pl = mm ? hmem_get_plan(mm) : NULL;
                const char *mode = pl ? hmem_mode_name(pl->mode) : "none";
                char test[32], shown[48];
                snprintf(test, sizeof test, "%s%ld", kind == 0 ? "pp" : "tg", len);
                if (depth) snprintf(shown, sizeof shown, "%s @ d%ld", test, depth);
                else snprintf(shown, sizeof shown, "%s", test);
                if (json) {
                    printf("%s\n  {\"test\": \"%s\", \"threads\": %ld, \"tok_per_s\": %.3f, \"reps\": %ld, "
                           "\"stddev\": %.3f, \"model\": \"%s\", \"model_bytes\": %llu, \"kernels\": \"%s\", "
                           "\"weights\": \"%s\", \"n_depth\": %ld",
                           n_out ? "," : "", test, th[ti], med, reps, sd, m->hp.arch_name,
                           (unsigned long long)hm_model_weight_bytes(m), hq_simd_name(),
                           m->loaded ? "memory" : "mmap", depth);
                    if (figures && pl)
                        printf(", \"mem_mode\": \"%s\", \"mem_budget\": %llu, \"ctx_bytes\": %llu, \"window\": %d, "
                               "\"pinned_bytes\": %llu, \"stream_bytes\": %llu, \"ms_per_tok\": %.3f, "
                               "\"disk_bytes_per_tok\": %.0f, \"loaded_bytes_per_tok\": %.0f, "
                               "\"blocked_ms_per_tok\": %.3f, \"resident_bytes_median\": %.0f, "
                               "\"resident_bytes_max\": %.0f, \"pressure\": %.5f, "
                               "\"t_attn_ms\": %.3f, \"t_ffn_ms\": %.3f, \"tau_attn_ms\": %.3f, \"tau_ffn_ms\": %.3f",
                               mode, (unsigned long long)pl->budget, (unsigned long long)pl->ctx_bytes, pl->window,
                               (unsigned long long)pl->pinned_bytes, (unsigned long long)pl->stream_bytes, 1e3 / med,
                               mf.disk_per_tok, mf.loaded_per_tok, mf.blocked_ms_per_tok, mf.resident_med,
                               mf.resident_max, ms.pressure,
                               ms.kind[0].n_begin ? ms.kind[0].compute_ns * 1e-6 / ms.kind[0].n_begin : 0.0,
                               ms.kind[1].n_begin ? ms.kind[1].compute_ns * 1e-6 / ms.kind[1].n_begin : 0.0,
                               ms.kind[0].n_loads ? ms.kind[0].load_ns * 1e-6 / ms.kind[0].n_loads : 0.0,
                               ms.kind[1].n_loads ? ms.kind[1].load_ns * 1e-6 / ms.kind[1].n_loads : 0.0);
                    if (has_roof)
                        printf(", \"decode_bytes\": %llu, \"roofline_tok_per_s\": %.3f, \"stream_gb_per_s\": %.3f, "
                               "\"of_roofline\": %.4f",
                               (unsigned long long)roof_bytes, roof_med, roof_med * (double)roof_bytes * 1e-9, frac_med);
                    printf("}");
                } else if (figures)
                    printf("| %s %s | %.2f GiB | %ld | %s | %s | %.2f ± %.2f | %s | %.1f | %.1f | %.1f | %.0f | %.2f%% |%s\n",
                           m->hp.arch_name, m->hp.name[0] ? m->hp.name : "", size_gib, th[ti], hq_simd_name(), shown,
                           med, sd, mode, 1e3 / med, mf.disk_per_tok / 1048576.0, mf.blocked_ms_per_tok,
                           mf.resident_med / 1048576.0, 100.0 * ms.pressure, roof_cells);
                else
                    printf("| %s %s | %.2f GiB | %ld | %s | %s | %.2f ± %.2f |%s\n", m->hp.arch_name,
                           m->hp.name[0] ? m->hp.name : "", size_gib, th[ti], hq_simd_name(), shown, med, sd, roof_cells);
                fflush(stdout);
                n_out++;
            }
        }
        if (figures && mm && !json) {
            char line[512];
            hmem_summary(mm, line, sizeof line);
            fprintf(stderr, "%s\n", line);
        }
        hm_ctx_free(c);
        c = NULL;
        hmem_free(mm);
        mm = NULL;
        hr_pool_free(pool);
        pool = NULL;
    }
    if (json) printf("\n]\n");
    rc = 0;
done:
    if (rc) fprintf(stderr, "hearth bench: %s\n", err.msg[0] ? err.msg : "failed");
    hm_ctx_free(c);
    hmem_free(mm);
    hr_pool_free(pool);
    free(spans);
    free(roof);
    free(logits);
    free(toks);
    free(runs);
    free(mruns);
    free(tmp);
    free(res);
    hm_model_free(m);
    gguf_close(g);
    return rc;
}
