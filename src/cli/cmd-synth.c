/* `hearth synth`: writes a random-weight GGUF model of a real (or custom) shape, streamed tensor by
   tensor, so memory, speed and sharding can be measured on shapes we cannot download. */
#include "cli.h"
#include "model-shapes.h"

#include "base/pool.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#define SYNTH_DEFAULT_VOCAB "../shared/models/stories260K.gguf"
#define SYNTH_SIGMA 0.02f

static void synth_epilog(FILE *f) {
    fprintf(f, "shapes: %s, custom; a named shape's parameters may be overridden by the flags above\n"
               "types and recipes: %s\n"
               "recipes (as llama.cpp's): Q4_K_M and Q5_K_M: Q4_K/Q5_K with attn_v and ffn_down in Q6_K on\n"
               "the first and last eighth of the layers and every third layer between, output in Q6_K;\n"
               "Q3_K_M: Q3_K, attn_v Q5_K (layers 0-1) / Q4_K, ffn_down Q5_K (first 1/16) / Q4_K, attn_output\n"
               "Q4_K, output Q6_K. Rows that are not a block multiple fall back to a type that fits.\n",
            cli_shape_names(), cli_recipe_names());
}

/* ---- random numbers ---------------------------------------------------------------------------- */
/* splitmix64: one multiply-xorshift chain per draw, and any seed (even 0) gives a good stream */
static inline uint64_t synth_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Approximately normal: the sum of the four 16-bit quarters of one draw (Irwin-Hall, n = 4) is
   within a few percent of a Gaussian's shape inside +-3 sigma and has no tail beyond 3.46 sigma.
   About 10x cheaper than Box-Muller, which matters at billions of weights; random weights need
   the right scale, not exact tails. */
#define SYNTH_IH_MEAN 131070.0f             /* 4 * 65535 / 2 */
#define SYNTH_IH_STD  37837.23f             /* sqrt(4 * (65536^2 - 1) / 12) */
static inline float synth_gauss(uint64_t *s) {
    uint64_t r = synth_next(s);
    uint32_t sum = (uint32_t)(r & 0xffff) + (uint32_t)(r >> 16 & 0xffff) + (uint32_t)(r >> 32 & 0xffff) +
                   (uint32_t)(r >> 48);
    return ((float)sum - SYNTH_IH_MEAN) * (1.0f / SYNTH_IH_STD);
}

typedef struct synth_gen {
    uint64_t tensor_seed;  /* seed mixed with the tensor name: tensors do not repeat each other */
    int      kind;         /* enum cli_tkind */
} synth_gen;

/* Each row has its own stream, derived from (seed, tensor, row), so the file does not depend on
   how rows are split between threads. */
static void synth_row(void *user, int64_t row, float *dst, int64_t ne0) {
    const synth_gen *g = user;
    uint64_t s = g->tensor_seed ^ ((uint64_t)row * 0xd1b54a32d192ed03ULL);
    synth_next(&s);
    float base = g->kind == CLI_T_NORM ? 1.0f : 0.0f;
    for (int64_t i = 0; i < ne0; i++) dst[i] = base + SYNTH_SIGMA * synth_gauss(&s);
}

/* ---- vocabulary -------------------------------------------------------------------------------- */
typedef struct synth_vocab {
    gguf_str *tokens;   /* padded token list (n entries) */
    char     *pad_text; /* storage of the [PAD<i>] strings */
    float    *scores;   /* padded, or NULL if the source has none */
    int32_t  *types;    /* padded, or NULL */
} synth_vocab;

static void synth_vocab_free(synth_vocab *v) {
    free(v->tokens);
    free(v->pad_text);
    free(v->scores);
    free(v->types);
}

/* Copies tokenizer.* from vg to w, padding tokens/scores/token_type from nv to n entries. */
static int synth_copy_vocab(gguf_writer *w, const gguf_ctx *vg, const char *vpath, uint64_t nv, uint64_t n,
                            synth_vocab *v, hr_err *err) {
    for (int64_t i = 0; i < gguf_n_kv(vg); i++) {
        if (strncmp(gguf_key(vg, i), "tokenizer.", 10)) continue;
        int rc = gguf_writer_copy_kv(w, vg, i);
        if (rc) return hr_fail(err, rc, "copying %s from %s failed", gguf_key(vg, i), vpath);
    }
    if (n == nv) return 0;

    v->tokens = calloc(n, sizeof(*v->tokens));
    v->pad_text = malloc((n - nv) * 24);
    if (!v->tokens || !v->pad_text) return hr_fail(err, HR_ENOMEM, "out of memory for the vocabulary");
    for (uint64_t i = 0; i < nv; i++)
        if (!gguf_get_arr_str(vg, "tokenizer.ggml.tokens", i, &v->tokens[i]))
            return hr_fail(err, HR_EFORMAT, "%s: cannot read token %llu", vpath, (unsigned long long)i);
    char *p = v->pad_text;
    for (uint64_t i = nv; i < n; i++) {
        int len = snprintf(p, 24, "[PAD%llu]", (unsigned long long)i);
        v->tokens[i] = (gguf_str){p, (uint64_t)len};
        p += len;
    }
    int rc = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", v->tokens, n);
    if (rc) return hr_fail(err, rc, "writing the padded token list failed");

    int et;
    uint64_t cnt;
    const void *data;
    if (gguf_get_arr(vg, "tokenizer.ggml.scores", &et, &cnt, &data)) {
        if (et != GGUF_VT_FLOAT32 || cnt != nv)
            return hr_fail(err, HR_EFORMAT, "%s: tokenizer.ggml.scores is not %llu float32 values", vpath,
                           (unsigned long long)nv);
        if (!(v->scores = malloc(n * sizeof(float)))) return hr_fail(err, HR_ENOMEM, "out of memory");
        memcpy(v->scores, data, nv * sizeof(float));
        /* pad tokens must never win a SentencePiece merge */
        for (uint64_t i = nv; i < n; i++) v->scores[i] = -1000.0f;
        if ((rc = gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, v->scores, n)))
            return hr_fail(err, rc, "writing the padded scores failed");
    }
    if (gguf_get_arr(vg, "tokenizer.ggml.token_type", &et, &cnt, &data)) {
        if ((et != GGUF_VT_INT32 && et != GGUF_VT_UINT32) || cnt != nv)
            return hr_fail(err, HR_EFORMAT, "%s: tokenizer.ggml.token_type is not %llu int32 values", vpath,
                           (unsigned long long)nv);
        if (!(v->types = malloc(n * sizeof(int32_t)))) return hr_fail(err, HR_ENOMEM, "out of memory");
        memcpy(v->types, data, nv * sizeof(int32_t));
        for (uint64_t i = nv; i < n; i++) v->types[i] = 3; /* CONTROL */
        if ((rc = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", et, v->types, n)))
            return hr_fail(err, rc, "writing the padded token types failed");
    }
    return 0;
}

/* ---- options ----------------------------------------------------------------------------------- */
static void synth_defaults(cli_opts *o) { o->type = "F16"; }

static int synth_check(const cli_command *c, cli_opts *o) {
    if (o->shape) return 0;
    return cli_usage_error(c, "--shape is required (%s, custom; see hearth synth --help)", cli_shape_names());
}

/* Builds the shape from --shape and the overrides; 0 ok or 2 (usage, message printed). */
static int synth_shape(const cli_opts *o, cli_shape *s) {
    if (!strcmp(o->shape, "custom")) {
        *s = (cli_shape){.n_embd = o->n_embd, .n_layer = o->n_layer, .n_head = o->n_head, .n_ff = o->n_ff,
                         .n_ctx = 4096};
        snprintf(s->name, sizeof(s->name), "custom");
        snprintf(s->arch, sizeof(s->arch), "%s", o->arch ? o->arch : "llama");
        cli_shape_arch_defaults(s);
        const char *missing = o->n_embd < 0 ? "--n-embd" : o->n_layer < 0 ? "--n-layer"
                            : o->n_head < 0 ? "--n-head" : o->n_ff < 0 ? "--n-ff" : NULL;
        if (missing) {
            fprintf(stderr, "hearth synth: --shape custom needs %s\n", missing);
            return 2;
        }
        s->n_head_kv = o->n_head;
    } else if (!cli_shape_find(o->shape, s)) {
        fprintf(stderr, "hearth synth: unknown shape '%s' (%s, custom)\n", o->shape, cli_shape_names());
        return 2;
    } else {
        if (o->arch) snprintf(s->arch, sizeof(s->arch), "%s", o->arch);
        if (o->n_embd >= 0) s->n_embd = o->n_embd;
        if (o->n_layer >= 0) s->n_layer = o->n_layer;
        if (o->n_head >= 0) s->n_head = o->n_head;
        if (o->n_ff >= 0) s->n_ff = o->n_ff;
        /* a named shape's head_dim follows a changed width unless given */
        if (o->n_embd >= 0 || o->n_head >= 0) s->head_dim = 0;
    }
    if (o->n_head_kv >= 0) s->n_head_kv = o->n_head_kv;
    if (o->n_vocab >= 0) s->n_vocab = o->n_vocab;
    if (o->head_dim >= 0) s->head_dim = o->head_dim;
    if (o->synth_n_ctx >= 0) s->n_ctx = o->synth_n_ctx;
    if (o->rope_base >= 0) s->rope_base = o->rope_base;
    if (o->tied >= 0) s->tied = o->tied;
    return 0;
}

static bool synth_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* what synth works on, from the vocabulary file to the written tensors */
typedef struct synth_job {
    const cli_opts  *o;
    cli_shape        s;
    cli_recipe       recipe;
    const char      *out, *vpath;
    char             out_default[128];
    gguf_ctx        *vg;      /* the vocabulary's file */
    uint64_t         nv;      /* its tokens */
    synth_vocab      voc;
    cli_tensor_desc *td;
    int64_t          nt;
    int             *types;   /* [nt] what each tensor is written as */
    uint64_t         total_elems, total_bytes;
    size_t           max_bytes;
    gguf_writer     *w;
    hr_pool         *pool;
    void            *buf;     /* one tensor's bytes */
} synth_job;

/* The vocabulary first: a custom shape may take its n_vocab from it; then the shape is checked
   and the output path chosen. 0, 1 (runtime) or 2 (usage), printed. */
static int synth_vocab_open(synth_job *j) {
    hr_err err = {0};
    j->vpath = j->o->vocab_from ? j->o->vocab_from : SYNTH_DEFAULT_VOCAB;
    if (!synth_file_exists(j->vpath)) {
        fprintf(stderr, "hearth synth: vocabulary file %s not found (give one with --vocab-from GGUF)\n", j->vpath);
        return 1;
    }
    if (!(j->vg = gguf_open(j->vpath, &err))) {
        fprintf(stderr, "hearth synth: %s\n", err.msg);
        return 1;
    }
    int et;
    const void *unused;
    if (!gguf_get_arr(j->vg, "tokenizer.ggml.tokens", &et, &j->nv, &unused) || et != GGUF_VT_STRING || j->nv == 0) {
        fprintf(stderr, "hearth synth: %s has no tokenizer.ggml.tokens string array\n", j->vpath);
        return 1;
    }
    if (j->s.n_vocab == 0) j->s.n_vocab = (int64_t)j->nv;
    if (cli_shape_check(&j->s, &err)) {
        fprintf(stderr, "hearth synth: shape %s: %s\n", j->s.name, err.msg);
        return 2;
    }
    if ((uint64_t)j->s.n_vocab < j->nv) {
        fprintf(stderr, "hearth synth: the vocabulary of %s has %llu tokens, more than the shape's n_vocab %lld\n",
                j->vpath, (unsigned long long)j->nv, (long long)j->s.n_vocab);
        return 1;
    }
    j->out = j->o->output;
    if (!j->out) {
        snprintf(j->out_default, sizeof j->out_default, "%s-%s.gguf", j->s.name, j->recipe.name);
        j->out = j->out_default;
    }
    if (synth_file_exists(j->out) && !j->o->force) {
        fprintf(stderr, "hearth synth: %s exists (use --force to overwrite)\n", j->out);
        return 1;
    }
    return 0;
}

/* tensors and their types (saying once which ones could not take the asked type) */
static int synth_types(synth_job *j) {
    if (!(j->td = cli_shape_tensors(&j->s, &j->nt)) || !(j->types = calloc((size_t)j->nt, sizeof(int)))) {
        fprintf(stderr, "hearth synth: out of memory\n");
        return 1;
    }
    cli_fallbacks fb = {0};
    for (int64_t i = 0; i < j->nt; i++) {
        const cli_tensor_desc *t = &j->td[i];
        int want = t->kind == CLI_T_WEIGHT ? cli_recipe_type(&j->recipe, t->name, j->s.n_layer, !j->s.tied) : HQ_TYPE_F32;
        int got = cli_type_fallback(want, t->ne[0]);
        if (got != want) cli_fallbacks_add(&fb, want, got, t->ne[0], t->name);
        const hq_traits *tr = hq_get_traits(got);
        if (!tr || !tr->from_float_ref) {
            fprintf(stderr, "hearth synth: type %s is not supported by this build\n", hq_type_name(got));
            return 1;
        }
        j->types[i] = got;
        size_t nb = hq_row_size(got, t->ne[0]) * (size_t)t->ne[1];
        j->total_elems += (uint64_t)t->ne[0] * (uint64_t)t->ne[1];
        j->total_bytes += nb;
        j->max_bytes = HR_MAX(j->max_bytes, nb);
    }
    cli_fallbacks_report(&fb, "synth");
    return 0;
}

/* the keys llama.cpp writes for these architectures, the vocabulary, the tensors' descriptions */
static int synth_metadata(synth_job *j) {
    const cli_shape *s = &j->s;
    hr_err err = {0};
    if (!(j->w = gguf_writer_create())) {
        fprintf(stderr, "hearth synth: out of memory\n");
        return 1;
    }
    gguf_writer *w = j->w;
    char key[96], name[96];
    int64_t hd = s->head_dim ? s->head_dim : s->n_embd / s->n_head;
    snprintf(name, sizeof(name), "synthetic %s", s->name);
    int rc = gguf_writer_set_str(w, "general.architecture", s->arch);
    rc = rc ? rc : gguf_writer_set_str(w, "general.name", name);
    const struct { const char *suffix; bool f32; double v; } keys[] = {
        {"context_length", false, s->n_ctx},          {"embedding_length", false, s->n_embd},
        {"feed_forward_length", false, s->n_ff},      {"block_count", false, s->n_layer},
        {"attention.head_count", false, s->n_head},   {"attention.head_count_kv", false, s->n_head_kv},
        {"attention.layer_norm_rms_epsilon", true, s->rms_eps}, {"rope.freq_base", true, s->rope_base},
        {"rope.dimension_count", false, hd},          {"attention.key_length", false, hd},
        {"attention.value_length", false, hd},        {"vocab_size", false, s->n_vocab},
    };
    for (size_t i = 0; i < HR_ARRAY_LEN(keys) && !rc; i++) {
        snprintf(key, sizeof key, "%s.%s", s->arch, keys[i].suffix);
        rc = keys[i].f32 ? gguf_writer_set_f32(w, key, (float)keys[i].v) : gguf_writer_set_u32(w, key, (uint32_t)keys[i].v);
    }
    rc = rc ? rc : gguf_writer_set_u32(w, "general.quantization_version", 2);
    rc = rc ? rc : gguf_writer_set_u32(w, "general.file_type", j->recipe.file_type);
    if (rc) {
        fprintf(stderr, "hearth synth: writing metadata failed: %s\n", hr_strerror(rc));
        return 1;
    }
    if (synth_copy_vocab(w, j->vg, j->vpath, j->nv, (uint64_t)s->n_vocab, &j->voc, &err)) {
        fprintf(stderr, "hearth synth: %s\n", err.msg);
        return 1;
    }
    if ((uint64_t)s->n_vocab > j->nv)
        fprintf(stderr, "hearth synth: the vocabulary of %s has %llu tokens; padded to n_vocab %lld with control "
                        "tokens [PAD%llu]..[PAD%lld]\n",
                j->vpath, (unsigned long long)j->nv, (long long)s->n_vocab, (unsigned long long)j->nv,
                (long long)s->n_vocab - 1);
    for (int64_t i = 0; i < j->nt; i++)
        if (gguf_writer_add_tensor(w, j->td[i].name, j->types[i], j->td[i].n_dims, j->td[i].ne, &err)) {
            fprintf(stderr, "hearth synth: %s\n", err.msg);
            return 1;
        }
    return 0;
}

/* generates, quantizes and writes the tensors one at a time: the largest tensor bounds the memory */
static int synth_write(synth_job *j) {
    hr_err err = {0};
    int n_threads = j->o->threads > 0 ? (int)j->o->threads : hr_physical_cores();
    if (!(j->pool = hr_pool_create(n_threads, &err))) {
        fprintf(stderr, "hearth synth: %s\n", err.msg);
        return 1;
    }
    if (!(j->buf = malloc(HR_MAX(j->max_bytes, (size_t)1)))) {
        fprintf(stderr, "hearth synth: out of memory for a %.1f MiB tensor buffer\n", j->max_bytes / 1048576.0);
        return 1;
    }
    if (gguf_writer_begin(j->w, j->out, j->o->force, &err)) {
        fprintf(stderr, "hearth synth: %s\n", err.msg);
        return 1;
    }
    double t0 = hr_time_s();
    cli_progress_state prog = {.label = "synth", .total = j->total_elems};
    for (int64_t i = 0; i < j->nt; i++) {
        const cli_tensor_desc *t = &j->td[i];
        synth_gen g = {.tensor_seed = hr_fnv1a(t->name, strlen(t->name), HR_FNV_SEED ^ (uint64_t)j->o->seed),
                       .kind = t->kind};
        size_t nb = hq_row_size(j->types[i], t->ne[0]) * (size_t)t->ne[1];
        if (cli_convert_rows(j->pool, j->types[i], t->ne[0], t->ne[1], synth_row, &g, j->buf, &prog, &err) ||
            gguf_writer_write_data(j->w, j->buf, nb, &err)) {
            cli_progress_end();
            fprintf(stderr, "hearth synth: %s: %s\n", t->name, err.msg);
            return 1;
        }
    }
    int rc = gguf_writer_finish(j->w, &err);
    cli_progress_end();
    if (rc) {
        fprintf(stderr, "hearth synth: %s\n", err.msg);
        return 1;
    }
    printf("wrote %s: %s %s, %lld layers, %lld tensors, %.1f M parameters, %.1f MiB of weights (%.1f s)\n", j->out,
           j->s.name, j->recipe.name, (long long)j->s.n_layer, (long long)j->nt, j->total_elems / 1e6,
           j->total_bytes / 1048576.0, hr_time_s() - t0);
    return 0;
}

static int synth(cli_opts *o) {
    synth_job j = {.o = o};
    int rc = synth_shape(o, &j.s);
    if (!rc && !cli_recipe_parse(o->type, &j.recipe)) {
        fprintf(stderr, "hearth synth: unknown type '%s' (%s)\n", o->type, cli_recipe_names());
        rc = 2;
    }
    if (!rc) rc = synth_vocab_open(&j);
    if (!rc) rc = synth_types(&j);
    if (!rc) rc = synth_metadata(&j);
    if (!rc) rc = synth_write(&j);
    free(j.buf);
    if (j.pool) hr_pool_free(j.pool);
    if (j.w) gguf_writer_free(j.w);
    synth_vocab_free(&j.voc);
    free(j.types);
    free(j.td);
    if (j.vg) gguf_close(j.vg);
    return rc;
}

const cli_command cli_synth = {
    "synth", CLI_SYNTH, "write a random-weight GGUF model of a given shape", "--shape NAME|custom [options]",
    "Writes a GGUF model with random weights (N(0, 0.02); norm weights 1 + N(0, 0.02); biases\n"
    "N(0, 0.02)) of a real model's shape, quantized to TYPE. Tensors are generated and quantized\n"
    "on all cores and streamed to the file one at a time.",
    .epilog = synth_epilog, .defaults = synth_defaults, .check = synth_check, .run = synth};
