/* model-shapes: named shapes, tensor lists, quantization recipes, the row converter — see model-shapes.h */
#include "model-shapes.h"

#include "cli.h"
#include "quant/quant.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

/* ---- shapes ------------------------------------------------------------------------------------ */
/* Real configurations (the models' config.json), so memory and speed estimates made on synthetic
   files hold for the real ones. The test shapes are tiny, with every row a multiple of 256 so each
   type (K-quants included) applies without fallback. */
static const cli_shape cli_shapes[] = {
    /* name            arch     embd  layer head kv  hd  n_ff   vocab   n_ctx   rope     eps   tied */
    {"llama-3.2-1b", "llama", 2048, 16, 32, 8, 64, 8192, 128256, 131072, 500000.0, 1e-5, true},
    {"llama-3-8b", "llama", 4096, 32, 32, 8, 128, 14336, 128256, 8192, 500000.0, 1e-5, false},
    {"qwen2.5-7b", "qwen2", 3584, 28, 28, 4, 128, 18944, 152064, 32768, 1000000.0, 1e-6, false},
    {"llama-2-70b", "llama", 8192, 80, 64, 8, 128, 28672, 32000, 4096, 10000.0, 1e-5, false},
    {"test", "llama", 256, 2, 4, 2, 64, 512, 0, 2048, 10000.0, 1e-5, false},
    {"test-qwen2", "qwen2", 256, 2, 4, 2, 64, 512, 0, 2048, 1000000.0, 1e-6, false},
    {"test-qwen3", "qwen3", 256, 2, 4, 2, 64, 512, 0, 2048, 1000000.0, 1e-6, false},
};

bool cli_shape_find(const char *name, cli_shape *out) {
    for (size_t i = 0; i < HR_ARRAY_LEN(cli_shapes); i++)
        if (!strcmp(cli_shapes[i].name, name)) {
            *out = cli_shapes[i];
            return true;
        }
    return false;
}

const char *cli_shape_names(void) {
    static char buf[256];
    if (!buf[0]) {
        size_t off = 0;
        for (size_t i = 0; i < HR_ARRAY_LEN(cli_shapes); i++)
            off += (size_t)snprintf(buf + off, sizeof(buf) - off, "%s%s", i ? ", " : "", cli_shapes[i].name);
    }
    return buf;
}

void cli_shape_arch_defaults(cli_shape *s) {
    bool qwen = !strcmp(s->arch, "qwen2") || !strcmp(s->arch, "qwen3");
    s->rope_base = qwen ? 1000000.0 : 10000.0;
    s->rms_eps = qwen ? 1e-6 : 1e-5;
}

int cli_shape_check(const cli_shape *s, hr_err *err) {
    if (strcmp(s->arch, "llama") && strcmp(s->arch, "qwen2") && strcmp(s->arch, "qwen3"))
        return hr_fail(err, HR_EUNSUPPORTED, "unsupported architecture '%s' (llama, qwen2, qwen3)", s->arch);
    /* caps keep every product below (and every GGUF u32 field) far from overflow */
    const int64_t cap = 1 << 20;
    struct { const char *what; int64_t v; } f[] = {
        {"n_embd", s->n_embd}, {"n_layer", s->n_layer}, {"n_head", s->n_head}, {"n_head_kv", s->n_head_kv},
        {"n_ff", s->n_ff},
    };
    for (size_t i = 0; i < HR_ARRAY_LEN(f); i++)
        if (f[i].v < 1 || f[i].v > cap) return hr_fail(err, HR_EINVAL, "%s must be in [1, %lld]", f[i].what, (long long)cap);
    if (s->n_vocab < 0 || s->n_vocab > (1 << 24)) return hr_fail(err, HR_EINVAL, "n_vocab must be in [1, %d]", 1 << 24);
    if (s->n_head % s->n_head_kv)
        return hr_fail(err, HR_EINVAL, "n_head (%lld) must be a multiple of n_head_kv (%lld)",
                       (long long)s->n_head, (long long)s->n_head_kv);
    int64_t hd = s->head_dim ? s->head_dim : s->n_embd / s->n_head;
    if (!s->head_dim && s->n_embd % s->n_head)
        return hr_fail(err, HR_EINVAL, "n_embd (%lld) is not a multiple of n_head (%lld); give --head-dim",
                       (long long)s->n_embd, (long long)s->n_head);
    if (hd < 2 || hd % 2 || hd > 4096) return hr_fail(err, HR_EINVAL, "head_dim must be even and in [2, 4096]");
    if (s->n_head * hd > cap) return hr_fail(err, HR_EINVAL, "n_head * head_dim is too large");
    if (!(s->rope_base > 0)) return hr_fail(err, HR_EINVAL, "rope base must be positive");
    return 0;
}

static void cli_desc(cli_tensor_desc *d, int kind, int64_t ne0, int64_t ne1, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void cli_desc(cli_tensor_desc *d, int kind, int64_t ne0, int64_t ne1, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->name, sizeof(d->name), fmt, ap);
    va_end(ap);
    d->kind = kind;
    d->ne[0] = ne0;
    d->ne[1] = ne1;
    d->n_dims = ne1 > 0 ? 2 : 1;
    if (ne1 <= 0) d->ne[1] = 1;
}

cli_tensor_desc *cli_shape_tensors(const cli_shape *s, int64_t *n) {
    bool qwen2 = !strcmp(s->arch, "qwen2"), qwen3 = !strcmp(s->arch, "qwen3");
    int64_t hd = s->head_dim ? s->head_dim : s->n_embd / s->n_head;
    int64_t q_dim = s->n_head * hd, kv_dim = s->n_head_kv * hd;
    int64_t cap = 3 + s->n_layer * 14;
    cli_tensor_desc *t = calloc((size_t)cap, sizeof(*t));
    if (!t) return NULL;
    int64_t k = 0;
    cli_desc(&t[k++], CLI_T_WEIGHT, s->n_embd, s->n_vocab, "token_embd.weight");
    for (int64_t l = 0; l < s->n_layer; l++) {
        long long L = (long long)l;
        cli_desc(&t[k++], CLI_T_NORM, s->n_embd, 0, "blk.%lld.attn_norm.weight", L);
        cli_desc(&t[k++], CLI_T_WEIGHT, s->n_embd, q_dim, "blk.%lld.attn_q.weight", L);
        cli_desc(&t[k++], CLI_T_WEIGHT, s->n_embd, kv_dim, "blk.%lld.attn_k.weight", L);
        cli_desc(&t[k++], CLI_T_WEIGHT, s->n_embd, kv_dim, "blk.%lld.attn_v.weight", L);
        if (qwen2) {
            cli_desc(&t[k++], CLI_T_BIAS, q_dim, 0, "blk.%lld.attn_q.bias", L);
            cli_desc(&t[k++], CLI_T_BIAS, kv_dim, 0, "blk.%lld.attn_k.bias", L);
            cli_desc(&t[k++], CLI_T_BIAS, kv_dim, 0, "blk.%lld.attn_v.bias", L);
        }
        if (qwen3) {
            cli_desc(&t[k++], CLI_T_NORM, hd, 0, "blk.%lld.attn_q_norm.weight", L);
            cli_desc(&t[k++], CLI_T_NORM, hd, 0, "blk.%lld.attn_k_norm.weight", L);
        }
        cli_desc(&t[k++], CLI_T_WEIGHT, q_dim, s->n_embd, "blk.%lld.attn_output.weight", L);
        cli_desc(&t[k++], CLI_T_NORM, s->n_embd, 0, "blk.%lld.ffn_norm.weight", L);
        cli_desc(&t[k++], CLI_T_WEIGHT, s->n_embd, s->n_ff, "blk.%lld.ffn_gate.weight", L);
        cli_desc(&t[k++], CLI_T_WEIGHT, s->n_embd, s->n_ff, "blk.%lld.ffn_up.weight", L);
        cli_desc(&t[k++], CLI_T_WEIGHT, s->n_ff, s->n_embd, "blk.%lld.ffn_down.weight", L);
    }
    cli_desc(&t[k++], CLI_T_NORM, s->n_embd, 0, "output_norm.weight");
    if (!s->tied) cli_desc(&t[k++], CLI_T_WEIGHT, s->n_embd, s->n_vocab, "output.weight");
    HR_ASSERT(k <= cap);
    *n = k;
    return t;
}

/* ---- recipes ----------------------------------------------------------------------------------- */
static const struct { const char *name; int base, mix; uint32_t ftype; } cli_recipes[] = {
    /* file_type values are llama.cpp's LLAMA_FTYPE_MOSTLY_*; a pure K type is its _S variant */
    {"F32", HQ_TYPE_F32, 0, 0},      {"F16", HQ_TYPE_F16, 0, 1},      {"BF16", HQ_TYPE_BF16, 0, 32},
    {"Q4_0", HQ_TYPE_Q4_0, 0, 2},    {"Q4_1", HQ_TYPE_Q4_1, 0, 3},    {"Q5_0", HQ_TYPE_Q5_0, 0, 8},
    {"Q5_1", HQ_TYPE_Q5_1, 0, 9},    {"Q8_0", HQ_TYPE_Q8_0, 0, 7},    {"Q2_K", HQ_TYPE_Q2_K, 0, 10},
    {"Q3_K", HQ_TYPE_Q3_K, 0, 11},   {"Q4_K", HQ_TYPE_Q4_K, 0, 14},   {"Q5_K", HQ_TYPE_Q5_K, 0, 16},
    {"Q6_K", HQ_TYPE_Q6_K, 0, 18},   {"Q3_K_M", HQ_TYPE_Q3_K, 3, 12}, {"Q4_K_M", HQ_TYPE_Q4_K, 4, 15},
    {"Q5_K_M", HQ_TYPE_Q5_K, 5, 17},
};

bool cli_recipe_parse(const char *s, cli_recipe *out) {
    for (size_t i = 0; i < HR_ARRAY_LEN(cli_recipes); i++)
        if (!strcasecmp(cli_recipes[i].name, s)) {
            snprintf(out->name, sizeof(out->name), "%s", cli_recipes[i].name);
            out->base = cli_recipes[i].base;
            out->mix = cli_recipes[i].mix;
            out->file_type = cli_recipes[i].ftype;
            return true;
        }
    return false;
}

const char *cli_recipe_names(void) {
    static char buf[256];
    if (!buf[0]) {
        size_t off = 0;
        for (size_t i = 0; i < HR_ARRAY_LEN(cli_recipes); i++)
            off += (size_t)snprintf(buf + off, sizeof(buf) - off, "%s%s", i ? " " : "", cli_recipes[i].name);
    }
    return buf;
}

const char *cli_file_type_name(uint32_t file_type) {
    for (size_t i = 0; i < HR_ARRAY_LEN(cli_recipes); i++)
        if (cli_recipes[i].ftype == file_type) return cli_recipes[i].name;
    return NULL;
}

/* llama.cpp's choice of the layers that get more bits: the first and last eighth, and every third
   layer in between */
static bool cli_more_bits(int64_t i, int64_t n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static bool cli_ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

int cli_recipe_type(const cli_recipe *r, const char *name, int64_t n_layer, bool has_output) {
    if (!r->mix) return r->base;
    bool is_output = !strcmp(name, "output.weight") || (!has_output && !strcmp(name, "token_embd.weight"));
    if (is_output) return HQ_TYPE_Q6_K;
    long long layer = -1;
    if (sscanf(name, "blk.%lld.", &layer) != 1 || layer < 0 || n_layer <= 0) return r->base;
    int64_t i = layer;
    if (cli_ends_with(name, ".attn_v.weight")) {
        if (r->mix == 3) return i < 2 ? HQ_TYPE_Q5_K : HQ_TYPE_Q4_K;
        return cli_more_bits(i, n_layer) ? HQ_TYPE_Q6_K : r->base;
    }
    if (cli_ends_with(name, ".ffn_down.weight")) {
        if (r->mix == 3) return i < n_layer / 16 ? HQ_TYPE_Q5_K : HQ_TYPE_Q4_K;
        return cli_more_bits(i, n_layer) ? HQ_TYPE_Q6_K : r->base;
    }
    if (cli_ends_with(name, ".attn_output.weight") && r->mix == 3) return HQ_TYPE_Q4_K;
    return r->base;
}

int cli_type_fallback(int type, int64_t ne0) {
    for (int guard = 0; guard < 4; guard++) {
        const hq_traits *t = hq_get_traits(type);
        if (t && ne0 % t->blck_size == 0) return type;
        switch (type) {
        /* a K-quant's 256-element superblock does not fit: the 32-element quant of about the same
           size (llama.cpp takes IQ4_NL for Q2_K/Q3_K; Q4_0 is the nearest type we have) */
        case HQ_TYPE_Q2_K: case HQ_TYPE_Q3_K: type = HQ_TYPE_Q4_0; break;
        case HQ_TYPE_Q4_K: type = HQ_TYPE_Q5_0; break;
        case HQ_TYPE_Q5_K: type = HQ_TYPE_Q5_1; break;
        case HQ_TYPE_Q6_K: type = HQ_TYPE_Q8_0; break;
        default: type = HQ_TYPE_F16; break;   /* block of 1: always fits */
        }
    }
    return HQ_TYPE_F16;
}

void cli_fallbacks_add(cli_fallbacks *f, int want, int got, int64_t ne0, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (f->e[i].want == want && f->e[i].got == got && f->e[i].ne0 == ne0) {
            f->e[i].count++;
            return;
        }
    if (f->n == (int)HR_ARRAY_LEN(f->e)) return;
    f->e[f->n].want = want;
    f->e[f->n].got = got;
    f->e[f->n].ne0 = ne0;
    f->e[f->n].count = 1;
    snprintf(f->e[f->n].example, sizeof(f->e[f->n].example), "%s", name);
    f->n++;
}

void cli_fallbacks_report(const cli_fallbacks *f, const char *cmd) {
    for (int i = 0; i < f->n; i++) {
        const hq_traits *t = hq_get_traits(f->e[i].want);
        fprintf(stderr, "hearth %s: %d tensor%s with rows of %lld (not a multiple of %s's block of %lld, e.g. %s) "
                        "stored as %s instead of %s\n",
                cmd, f->e[i].count, f->e[i].count == 1 ? "" : "s", (long long)f->e[i].ne0,
                hq_type_name(f->e[i].want), t ? (long long)t->blck_size : 0LL, f->e[i].example,
                hq_type_name(f->e[i].got), hq_type_name(f->e[i].want));
    }
}

/* ---- converter --------------------------------------------------------------------------------- */
/* Rows per pool job: about this many elements, so the progress bar moves and the per-job overhead
   (a fork/join and a scratch allocation per thread) stays negligible. */
#define CLI_CONVERT_CHUNK_ELEMS (4 << 20)

typedef struct cli_conv_job {
    const hq_traits *dst;
    int64_t ne0, row0, row1;
    size_t row_bytes;
    cli_row_fn fn;
    void *user;
    uint8_t *out;
    _Atomic int failed;
} cli_conv_job;

static void cli_conv_worker(void *arg, int ith, int nth) {
    cli_conv_job *j = arg;
    int64_t b, e;
    hr_split(j->row1 - j->row0, ith, nth, 1, &b, &e);
    if (b >= e) return;
    float *buf = malloc((size_t)j->ne0 * sizeof(float));
    if (!buf) {
        atomic_store(&j->failed, 1);
        return;
    }
    for (int64_t r = j->row0 + b; r < j->row0 + e; r++) {
        j->fn(j->user, r, buf, j->ne0);
        j->dst->from_float_ref(buf, j->out + (size_t)r * j->row_bytes, j->ne0);
    }
    free(buf);
}

int cli_convert_rows(hr_pool *pool, int dst_type, int64_t ne0, int64_t nrows, cli_row_fn fn, void *user,
                void *out, cli_progress_state *prog, hr_err *err) {
    const hq_traits *t = hq_get_traits(dst_type);
    if (!t || !t->from_float_ref)
        return hr_fail(err, HR_EUNSUPPORTED, "type %s is not supported by this build", hq_type_name(dst_type));
    size_t rb = hq_row_size(dst_type, ne0);
    if (!rb) return hr_fail(err, HR_EINVAL, "rows of %lld do not fit type %s", (long long)ne0, hq_type_name(dst_type));
    int64_t chunk = HR_MAX((int64_t)1, CLI_CONVERT_CHUNK_ELEMS / ne0);
    cli_conv_job j = {.dst = t, .ne0 = ne0, .row_bytes = rb, .fn = fn, .user = user, .out = out};
    for (int64_t r = 0; r < nrows; r += chunk) {
        j.row0 = r;
        j.row1 = HR_MIN(nrows, r + chunk);
        hr_pool_run(pool, cli_conv_worker, &j);
        if (atomic_load(&j.failed)) return hr_fail(err, HR_ENOMEM, "out of memory for a row buffer");
        if (prog) {
            prog->done += (uint64_t)(j.row1 - j.row0) * (uint64_t)ne0;
            cli_progress(prog->label, prog->done, prog->total);
        }
    }
    return 0;
}
