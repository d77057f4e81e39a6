/* hearth bench: prompt-processing and generation speed, like llama-bench */
#include "cli.h"

#include "gguf/gguf.h"
#include "mem/mem.h"
#include "model/model.h"
#include "quant/quant.h"

#include <stdio.h>
#include <math.h>
#include <stdlib.h>

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


typedef struct bench {
    cli_opts *o;
    gguf_ctx *g;
    hm_model *m;
    bool      figures;        /* --mem-budget given: the memory columns */
    long      max_len, max_depth;
    int32_t  *toks;           /* [max_depth + max_len] random tokens */
    float    *logits;
    double   *runs, *roof, *tmp;  /* [reps]: tok/s, roofline tok/s, scratch for medians */
    mem_run  *mruns;          /* [reps] */
    uint64_t *res;            /* resident samples of one run */
    hr_span  *spans;          /* --roofline: the weights a token reads */
    int       n_spans;
    uint64_t  roof_bytes;
    /* one thread count */
    long      threads;
    hr_pool  *pool;
    hmem     *mm;
    hm_ctx   *c;
    long      filled;         /* KV positions [0, filled) hold toks' prefix */
    int       n_out;          /* rows printed */
} bench;

/* medians over the runs of one test */
typedef struct bench_result {
    double  med, sd;
    bool    has_roof;
    double  roof_med, frac_med;
    mem_run mf;
} bench_result;

static long list_max(const cli_list *l) {
    long x = 0;
    for (int i = 0; i < l->n; i++) x = HR_MAX(x, l->v[i]);
    return x;
}

/* the model, the random tokens and the buffers every test uses */
static int bench_open(bench *b, hr_err *err) {
    const cli_opts *o = b->o;
    if (!(b->g = gguf_open(o->model, err)) || !(b->m = hm_model_load(b->g, err))) return err->code;
    b->figures = o->mem.given;
    b->max_len = HR_MAX(1, HR_MAX(list_max(&o->bench_prompt), list_max(&o->bench_gen)));
    b->max_depth = list_max(&o->bench_depth);
    size_t reps = (size_t)o->reps;
    b->logits = malloc((size_t)b->m->hp.n_vocab * sizeof(float));
    b->toks = malloc((size_t)(b->max_depth + b->max_len) * sizeof(int32_t));
    b->runs = malloc(reps * sizeof(double));
    b->mruns = calloc(reps, sizeof *b->mruns);
    b->tmp = malloc(reps * sizeof(double));
    b->res = malloc((size_t)(b->max_len + 1) * sizeof *b->res);
    b->roof = malloc(reps * sizeof *b->roof);
    if (!b->logits || !b->toks || !b->runs || !b->mruns || !b->tmp || !b->res || !b->roof)
        return hr_fail(err, HR_ENOMEM, "out of memory");
    uint64_t rng = 0x9e3779b97f4a7c15ULL;
    for (long i = 0; i < b->max_depth + b->max_len; i++) {
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
        b->toks[i] = (int32_t)(rng % (uint64_t)b->m->hp.n_vocab);
    }
    return 0;
}

static void bench_header(const bench *b) {
    bool roofline = b->o->roofline;
    if (b->o->json) printf("[");
    else if (b->figures) {
        printf("| model | size | threads | kernels | test | t/s | mem | ms/tok | disk MiB/tok | blocked ms/tok | "
               "resident MiB | pressure |%s\n", roofline ? " roofline t/s | of roofline |" : "");
        printf("| ----- | ---: | ------: | ------- | ---- | --: | --- | -----: | -----------: | -------------: | "
               "-----------: | -------: |%s\n", roofline ? " -----------: | ----------: |" : "");
    } else {
        printf("| model | size | threads | kernels | test | t/s |%s\n", roofline ? " roofline t/s | of roofline |" : "");
        printf("| ----- | ---: | ------: | ------- | ---- | --: |%s\n", roofline ? " -----------: | ----------: |" : "");
    }
}

/* The pool, residency manager, weights and context for one thread count. */
static int bench_start(bench *b, long threads, hr_err *err) {
    const cli_opts *o = b->o;
    hm_model *m = b->m;
    hm_ctx_params cp = cli_ctx_params(o);
    cp.n_ctx = (int32_t)HR_MAX(b->max_depth + b->max_len, 16);
    cp.n_threads = (int32_t)threads;
    b->threads = threads;
    b->filled = 0;
    if (!(b->pool = hr_pool_create((int)threads, err))) return err->code;
    cp.pool = b->pool;
    hm_shard sh = hm_shard_full(m);
    /* the residency manager (observing only with --mem-budget off, for the figures) */
    hmem_params mp = hmem_default_params();
    mp.ctx_bytes = hm_ctx_bytes_estimate(&m->hp, &cp);
    if (hmem_check_ctx(mp.ctx_bytes, err)) return err->code;
    mp.window = o->mem.window;
    mp.pin = (hmem_pin)o->pin;
    mp.mode = o->mem.off ? HMEM_OBSERVE : HMEM_AUTO;
    mp.budget = o->mem.bytes;
    if (o->mem_pct > 0) {
        hmem_params op = mp;
        op.mode = HMEM_OBSERVE;
        hmem *probe = hmem_create(m, &sh, o->model, &op, err);
        if (!probe) return err->code;
        mp.budget = (uint64_t)(o->mem_pct / 100.0 * (double)hmem_get_plan(probe)->weight_bytes) + mp.ctx_bytes;
        hmem_free(probe);
    }
    b->mm = hmem_create(m, &sh, o->model, &mp, err);
    if (!b->mm && (b->figures || mp.budget)) return err->code;
    if (!b->mm) { /* the default manager is a convenience, not a requirement */
        HR_LOGD("hearth bench: no residency manager: %s", err->msg);
        err->msg[0] = 0;
    }
    if (b->mm) hmem_attach(b->mm, &sh);
    if (hmem_load_weights(b->mm, m, &sh, o->use_mmap, o->no_repack, err)) return err->code;
    if (!(b->c = hm_ctx_create(m, &sh, &cp, err))) return err->code;
    if (o->roofline) { /* where the kernels read the weights now, after hmem_load_weights */
        if (b->mm && hmem_get_plan(b->mm)->mode == HMEM_STREAM)
            return hr_fail(err, HR_EINVAL, "--roofline needs the weights resident, and under this --mem-budget they stream");
        free(b->spans);
        b->spans = NULL;
        if ((b->n_spans = decode_spans(m, &b->spans, &b->roof_bytes, err)) < 0) return err->code;
    }
    return 0;
}

static void bench_stop(bench *b) {
    if (b->figures && b->mm && !b->o->json) {
        char line[512];
        hmem_summary(b->mm, line, sizeof line);
        fprintf(stderr, "%s\n", line);
    }
    hm_ctx_free(b->c);
    b->c = NULL;
    hmem_free(b->mm);
    b->mm = NULL;
    hr_pool_free(b->pool);
    b->pool = NULL;
}

/* The context a test at depth d starts from: -d tokens as a prompt, untimed. Every eval writes
   position p's KV from toks[p], so positions [0, filled) hold that prefix, whichever test wrote them:
   a test at depth d needs only [filled, d) filled first (its runs then write d .. d + len - 1 and
   overwrite nothing below). */
static int bench_fill(bench *b, long depth, long len, hr_err *err) {
    for (long i = b->filled; i < depth;) {
        const int nb = (int)HR_MIN(b->o->n_batch, depth - i);
        const hm_batch hb = {.tokens = b->toks + i, .n = nb, .pos = (int32_t)i, .logits = b->logits};
        if (hm_eval(b->c, &hb, err)) return err->code;
        i += nb;
    }
    b->filled = HR_MAX(b->filled, depth + len);
    return 0;
}

/* One run of a test (kind 0: a prompt of len tokens in batches; 1: len tokens one at a time) at depth;
   r < 0 is the warm-up, else its figures go to runs[r], roof[r], mruns[r]. */
static int bench_run(bench *b, int kind, long len, long depth, long r, hr_err *err) {
    const cli_opts *o = b->o;
    hmem *mm = b->mm;
    int64_t blocked = 0, sample_ns = 0, roof_ns = 0, read0 = hmem_proc_read_bytes();
    uint64_t load0 = mm ? hmem_get_stats(mm).loaded_bytes : 0;
    long n_res = 0;
    int64_t t0 = hr_time_ns();
    for (long i = 0; i < len;) {
        int nb = kind == 0 ? (int)HR_MIN(o->n_batch, len - i) : 1;
        const hm_batch hb = {.tokens = b->toks + depth + i, .n = nb, .pos = (int32_t)(depth + i), .logits = b->logits};
        if (hm_eval(b->c, &hb, err)) return err->code;
        blocked += hm_ctx_timings(b->c).weights_ns;
        i += nb;
        if (o->roofline && kind == 1 && depth == 0) { /* the same weights as one stream, not timed */
            int64_t s0 = hr_time_ns();
            (void)hr_pool_read(b->pool, b->spans, b->n_spans); /* a call through the pool: not elided */
            roof_ns += hr_time_ns() - s0;
        }
        if (b->figures && mm) { /* per token (per batch for prompts), not timed */
            int64_t s0 = hr_time_ns();
            hmem_sample smp;
            if (hmem_take_sample(mm, &smp) == 0) b->res[n_res++] = smp.resident;
            sample_ns += hr_time_ns() - s0;
        }
    }
    double s = (hr_time_ns() - t0 - sample_ns - roof_ns) * 1e-9;
    if (r < 0) return 0;
    b->runs[r] = len / s;
    b->roof[r] = roof_ns > 0 ? len / (roof_ns * 1e-9) : 0;
    int64_t read1 = hmem_proc_read_bytes();
    mem_run *mr = &b->mruns[r];
    mr->disk_per_tok = read0 >= 0 && read1 >= 0 ? (double)(read1 - read0) / len : -1;
    mr->loaded_per_tok = mm ? (double)(hmem_get_stats(mm).loaded_bytes - load0) / len : 0;
    mr->blocked_ms_per_tok = blocked * 1e-6 / len;
    qsort(b->res, (size_t)n_res, sizeof *b->res, cmp_u64);
    mr->resident_med = n_res ? (double)b->res[n_res / 2] : 0;
    mr->resident_max = n_res ? (double)b->res[n_res - 1] : 0;
    return 0;
}

/* medians (and the standard deviation of tok/s) over the runs */
static void bench_summarize(const bench *b, bool has_roof, bench_result *out) {
    long reps = b->o->reps;
    double *tmp = b->tmp;
    *out = (bench_result){.has_roof = has_roof};
    out->med = median(memcpy(tmp, b->runs, (size_t)reps * sizeof *tmp), reps);
    /* --roofline: medians of each run's stream rate and of its fraction */
    if (has_roof) {
        out->roof_med = median(memcpy(tmp, b->roof, (size_t)reps * sizeof *tmp), reps);
        for (long r = 0; r < reps; r++) tmp[r] = b->roof[r] > 0 ? b->runs[r] / b->roof[r] : 0;
        out->frac_med = median(tmp, reps);
    }
    double mean = 0, var = 0;
    for (long r = 0; r < reps; r++) mean += b->runs[r];
    mean /= reps;
    for (long r = 0; r < reps; r++) var += (b->runs[r] - mean) * (b->runs[r] - mean);
    out->sd = reps > 1 ? sqrt(var / (reps - 1)) : 0;
#define MED(field) do { for (long r = 0; r < reps; r++) tmp[r] = b->mruns[r].field; out->mf.field = median(tmp, reps); } while (0)
    MED(disk_per_tok); MED(loaded_per_tok); MED(blocked_ms_per_tok); MED(resident_med); MED(resident_max);
#undef MED
}

/* one row of the table (or one JSON object) */
static void bench_row(bench *b, int kind, long len, long depth, const bench_result *x) {
    const cli_opts *o = b->o;
    const hm_model *m = b->m;
    const mem_run *mf = &x->mf;
    hmem_stats ms = b->mm ? hmem_get_stats(b->mm) : (hmem_stats){0};
    const hmem_plan *pl = b->mm ? hmem_get_plan(b->mm) : NULL;
    const char *mode = pl ? hmem_mode_name(pl->mode) : "none";
    double size_gib = hm_model_weight_bytes(m) / 1073741824.0;
    char test[32], shown[48], roof_cells[96] = "";
    snprintf(test, sizeof test, "%s%ld", kind == 0 ? "pp" : "tg", len);
    if (depth) snprintf(shown, sizeof shown, "%s @ d%ld", test, depth);
    else snprintf(shown, sizeof shown, "%s", test);
    if (o->roofline)
        snprintf(roof_cells, sizeof roof_cells, x->has_roof ? " %.2f | %.1f%% |" : " | |", x->roof_med, 100 * x->frac_med);
    if (o->json) {
        printf("%s\n  {\"test\": \"%s\", \"threads\": %ld, \"tok_per_s\": %.3f, \"reps\": %ld, "
               "\"stddev\": %.3f, \"model\": \"%s\", \"model_bytes\": %llu, \"kernels\": \"%s\", "
               "\"weights\": \"%s\", \"n_depth\": %ld",
               b->n_out ? "," : "", test, b->threads, x->med, o->reps, x->sd, m->hp.arch_name,
               (unsigned long long)hm_model_weight_bytes(m), hq_simd_name(), m->loaded ? "memory" : "mmap", depth);
        if (b->figures && pl)
            printf(", \"mem_mode\": \"%s\", \"mem_budget\": %llu, \"ctx_bytes\": %llu, \"window\": %d, "
                   "\"pinned_bytes\": %llu, \"stream_bytes\": %llu, \"ms_per_tok\": %.3f, "
                   "\"disk_bytes_per_tok\": %.0f, \"loaded_bytes_per_tok\": %.0f, "
                   "\"blocked_ms_per_tok\": %.3f, \"resident_bytes_median\": %.0f, "
                   "\"resident_bytes_max\": %.0f, \"pressure\": %.5f, "
                   "\"t_attn_ms\": %.3f, \"t_ffn_ms\": %.3f, \"tau_attn_ms\": %.3f, \"tau_ffn_ms\": %.3f",
                   mode, (unsigned long long)pl->budget, (unsigned long long)pl->ctx_bytes, pl->window,
                   (unsigned long long)pl->pinned_bytes, (unsigned long long)pl->stream_bytes, 1e3 / x->med,
                   mf->disk_per_tok, mf->loaded_per_tok, mf->blocked_ms_per_tok, mf->resident_med,
                   mf->resident_max, ms.pressure,
                   ms.kind[0].n_begin ? ms.kind[0].compute_ns * 1e-6 / ms.kind[0].n_begin : 0.0,
                   ms.kind[1].n_begin ? ms.kind[1].compute_ns * 1e-6 / ms.kind[1].n_begin : 0.0,
                   ms.kind[0].n_loads ? ms.kind[0].load_ns * 1e-6 / ms.kind[0].n_loads : 0.0,
                   ms.kind[1].n_loads ? ms.kind[1].load_ns * 1e-6 / ms.kind[1].n_loads : 0.0);
        if (x->has_roof)
            printf(", \"decode_bytes\": %llu, \"roofline_tok_per_s\": %.3f, \"stream_gb_per_s\": %.3f, "
                   "\"of_roofline\": %.4f",
                   (unsigned long long)b->roof_bytes, x->roof_med, x->roof_med * (double)b->roof_bytes * 1e-9,
                   x->frac_med);
        printf("}");
    } else if (b->figures)
        printf("| %s %s | %.2f GiB | %ld | %s | %s | %.2f ± %.2f | %s | %.1f | %.1f | %.1f | %.0f | %.2f%% |%s\n",
               m->hp.arch_name, m->hp.name[0] ? m->hp.name : "", size_gib, b->threads, hq_simd_name(), shown, x->med,
               x->sd, mode, 1e3 / x->med, mf->disk_per_tok / 1048576.0, mf->blocked_ms_per_tok,
               mf->resident_med / 1048576.0, 100.0 * ms.pressure, roof_cells);
    else
        printf("| %s %s | %.2f GiB | %ld | %s | %s | %.2f ± %.2f |%s\n", m->hp.arch_name,
               m->hp.name[0] ? m->hp.name : "", size_gib, b->threads, hq_simd_name(), shown, x->med, x->sd, roof_cells);
    fflush(stdout);
    b->n_out++;
}

/* every test (prompts, then generations; each length at each depth) at one thread count */
static int bench_tests(bench *b, hr_err *err) {
    const cli_opts *o = b->o;
    const cli_list *dp = &o->bench_depth;
    for (int kind = 0; kind < 2; kind++) {
        const cli_list *lens = kind == 0 ? &o->bench_prompt : &o->bench_gen;
        for (int li = 0; li < lens->n * dp->n; li++) {
            const long len = lens->v[li / dp->n], depth = dp->v[li % dp->n];
            if (len == 0) continue;
            if (bench_fill(b, depth, len, err)) return err->code;
            for (long r = -1; r < o->reps; r++) /* r = -1: warm-up */
                if (bench_run(b, kind, len, depth, r, err)) return err->code;
            bench_result x;
            bench_summarize(b, o->roofline && kind == 1 && depth == 0, &x);
            bench_row(b, kind, len, depth, &x);
        }
    }
    return 0;
}

static int bench_check(const cli_command *c, cli_opts *o) { return cli_check_model(c, o); }

static int bench_main(cli_opts *o) {
    hr_err err = {0};
    bench b = {.o = o};
    int rc = bench_open(&b, &err);
    if (!rc) bench_header(&b);
    for (int ti = 0; !rc && ti < o->bench_threads.n; ti++) {
        rc = bench_start(&b, o->bench_threads.v[ti], &err);
        if (!rc) rc = bench_tests(&b, &err);
        bench_stop(&b);
    }
    if (!rc && o->json) printf("\n]\n");
    if (rc) fprintf(stderr, "hearth bench: %s\n", err.msg[0] ? err.msg : "failed");
    free(b.spans);
    free(b.roof);
    free(b.logits);
    free(b.toks);
    free(b.runs);
    free(b.mruns);
    free(b.tmp);
    free(b.res);
    hm_model_free(b.m);
    gguf_close(b.g);
    return rc ? 1 : 0;
}

const cli_command cli_bench = {
    "bench", CLI_BENCH, "measure prompt-processing and generation speed", "-m MODEL [options]",
    "Measures prompt processing (ppN: N tokens in batches of -b) and text generation (tgN: N\n"
    "tokens one at a time), each from an empty context or after -d tokens already in it,\n"
    "reporting the median tokens/s over -r runs after one warm-up run, as llama-bench does.",
    .check = bench_check, .run = bench_main};
