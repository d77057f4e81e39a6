/* `hearth quantize`: converts a GGUF model's float weights to a quantized type or recipe, streamed
   tensor by tensor from the mapped input to the output file. */
#include "cli.h"
#include "model-shapes.h"

#include "base/pool.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

static void quantize_epilog(FILE *f) {
    fprintf(f, "TYPE: %s\n"
               "  plain types are pure (every converted weight is TYPE); Q4_K_M / Q5_K_M / Q3_K_M are\n"
               "  llama.cpp's mixes (see hearth synth --help). Rows that are not a multiple of the type's block\n"
               "  fall back to a type that fits.\n", cli_recipe_names());
}

typedef struct quantize_src {
    const hq_traits *t;
    const uint8_t   *data;
    size_t           row_bytes;
} quantize_src;

static void quantize_row(void *user, int64_t row, float *dst, int64_t ne0) {
    const quantize_src *s = user;
    s->t->to_float(s->data + (size_t)row * s->row_bytes, dst, ne0);
}

static bool quantize_is_float(int type) {
    return type == HQ_TYPE_F32 || type == HQ_TYPE_F16 || type == HQ_TYPE_BF16;
}

/* Number of blocks: <arch>.block_count, else one more than the highest blk.N in the tensor names. */
static int64_t quantize_n_layer(const gguf_ctx *g) {
    char arch[64], key[96];
    int64_t n = -1;
    if (gguf_get_cstr(g, "general.architecture", arch, sizeof(arch))) {
        snprintf(key, sizeof(key), "%s.block_count", arch);
        if (gguf_get_i64(g, key, &n) && n > 0 && n <= 100000) return n;
    }
    n = 0;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        long long l;
        if (sscanf(gguf_tensor_at(g, i)->name, "blk.%lld.", &l) == 1 && l >= 0 && l < 100000 && l + 1 > n) n = l + 1;
    }
    return n;
}

static int quantize_check(const cli_command *c, cli_opts *o) {
    return o->n_pos == 3 ? 0 : cli_usage_error(c, "needs IN OUT TYPE (see hearth quantize --help)");
}

/* what quantize works on */
typedef struct quantize_job {
    const cli_opts *o;
    const char     *in, *out;
    cli_recipe      recipe;
    gguf_ctx       *g;
    int64_t         nt;
    int            *types;     /* [nt] what each tensor is written as */
    int             n_conv;
    uint64_t        conv_elems, bytes_in, bytes_out;
    size_t          max_bytes; /* the largest converted tensor */
    gguf_writer    *w;
    hr_pool        *pool;
    void           *buf;
} quantize_job;

/* IN must exist, OUT must not be IN, and is overwritten only with --force */
static int quantize_paths(const quantize_job *j) {
    struct stat st_in, st_out;
    if (stat(j->in, &st_in) != 0) {
        fprintf(stderr, "hearth quantize: cannot open %s: %s\n", j->in, strerror(errno));
        return 1;
    }
    if (stat(j->out, &st_out) == 0) {
        if (st_out.st_dev == st_in.st_dev && st_out.st_ino == st_in.st_ino) {
            fprintf(stderr, "hearth quantize: %s and %s are the same file; write to another file\n", j->in, j->out);
            return 1;
        }
        if (!j->o->force) {
            fprintf(stderr, "hearth quantize: %s exists (use --force to overwrite)\n", j->out);
            return 1;
        }
    }
    return 0;
}

/* Chooses each tensor's type (a tensor that keeps its type is copied byte for byte) and says what
   was kept and why. */
static int quantize_types(quantize_job *j) {
    bool keep_embd = j->o->keep_embd;
    int64_t n_layer = quantize_n_layer(j->g);
    bool has_output = gguf_find_tensor(j->g, "output.weight") != NULL;
    if (!(j->types = calloc((size_t)HR_MAX(j->nt, 1), sizeof(int)))) {
        fprintf(stderr, "hearth quantize: out of memory\n");
        return 1;
    }
    cli_fallbacks fb = {0};
    int n_1d = 0, n_quant = 0, n_other = 0, n_same = 0;
    for (int64_t i = 0; i < j->nt; i++) {
        const gguf_tensor *t = gguf_tensor_at(j->g, i);
        j->types[i] = t->type;
        j->bytes_in += t->nbytes;
        size_t nb = t->nbytes;
        bool is_weight = t->n_dims >= 2 && strlen(t->name) > 7 && !strcmp(t->name + strlen(t->name) - 7, ".weight");
        if (t->n_dims < 2) {
            n_1d++;
        } else if (!quantize_is_float(t->type)) {
            n_quant++;
        } else if (!is_weight || (keep_embd && !strcmp(t->name, "token_embd.weight")) || t->ne[0] <= 0) {
            n_other++;
        } else {
            int want = cli_recipe_type(&j->recipe, t->name, n_layer, has_output);
            int got = cli_type_fallback(want, t->ne[0]);
            if (got != want) cli_fallbacks_add(&fb, want, got, t->ne[0], t->name);
            const hq_traits *src = hq_get_traits(t->type), *dst = hq_get_traits(got);
            if (!src || !dst || !dst->from_float_ref) {
                fprintf(stderr, "hearth quantize: converting %s to %s is not supported by this build\n",
                        hq_type_name(t->type), hq_type_name(got));
                return 1;
            }
            if (got != t->type) {
                j->types[i] = got;
                j->n_conv++;
                int64_t n = gguf_tensor_nelements(t);
                j->conv_elems += (uint64_t)n;
                nb = hq_row_size(got, t->ne[0]) * (size_t)(n / t->ne[0]);
                j->max_bytes = HR_MAX(j->max_bytes, nb);
            } else {
                n_same++;
            }
        }
        j->bytes_out += nb;
    }
    cli_fallbacks_report(&fb, "quantize");
    if (n_1d) fprintf(stderr, "hearth quantize: %d 1-D tensors (norms, biases) copied as they are\n", n_1d);
    if (n_quant) fprintf(stderr, "hearth quantize: %d already-quantized tensors copied as they are\n", n_quant);
    if (n_other)
        fprintf(stderr, "hearth quantize: %d tensors kept in their type (%s)\n", n_other,
                keep_embd ? "not named *.weight, or token_embd with --keep-embd" : "not named *.weight");
    if (n_same) fprintf(stderr, "hearth quantize: %d tensors already have the type chosen for them\n", n_same);
    return 0;
}

/* IN's metadata (general.file_type updated) and the tensors' descriptions */
static int quantize_metadata(quantize_job *j) {
    hr_err err = {0};
    if (!(j->w = gguf_writer_create())) {
        fprintf(stderr, "hearth quantize: out of memory\n");
        return 1;
    }
    int rc = 0;
    for (int64_t i = 0; i < gguf_n_kv(j->g) && !rc; i++) rc = gguf_writer_copy_kv(j->w, j->g, i);
    rc = rc ? rc : gguf_writer_set_u32(j->w, "general.quantization_version", 2);
    rc = rc ? rc : gguf_writer_set_u32(j->w, "general.file_type", j->recipe.file_type);
    if (rc) {
        fprintf(stderr, "hearth quantize: copying metadata failed: %s\n", hr_strerror(rc));
        return 1;
    }
    for (int64_t i = 0; i < j->nt; i++) {
        const gguf_tensor *t = gguf_tensor_at(j->g, i);
        if (gguf_writer_add_tensor(j->w, t->name, j->types[i], t->n_dims, t->ne, &err)) {
            fprintf(stderr, "hearth quantize: %s\n", err.msg);
            return 1;
        }
    }
    return 0;
}

/* converts and writes the tensors one at a time (kept ones straight from the mapping) */
static int quantize_write(quantize_job *j) {
    hr_err err = {0};
    long threads = j->o->threads;
    if (!(j->pool = hr_pool_create(threads > 0 ? (int)threads : hr_physical_cores(), &err))) {
        fprintf(stderr, "hearth quantize: %s\n", err.msg);
        return 1;
    }
    if (j->max_bytes && !(j->buf = malloc(j->max_bytes))) {
        fprintf(stderr, "hearth quantize: out of memory for a %.1f MiB tensor buffer\n", j->max_bytes / 1048576.0);
        return 1;
    }
    if (gguf_writer_begin(j->w, j->out, j->o->force, &err)) {
        fprintf(stderr, "hearth quantize: %s\n", err.msg);
        return 1;
    }
    double t0 = hr_time_s();
    cli_progress_state prog = {.label = "quantize", .total = j->conv_elems};
    for (int64_t i = 0; i < j->nt; i++) {
        const gguf_tensor *t = gguf_tensor_at(j->g, i);
        int wrc;
        if (j->types[i] == t->type) {
            wrc = gguf_writer_write_data(j->w, t->data, t->nbytes, &err);
        } else {
            int64_t nrows = gguf_tensor_nelements(t) / t->ne[0];
            quantize_src src = {.t = hq_get_traits(t->type), .data = t->data,
                                .row_bytes = hq_row_size(t->type, t->ne[0])};
            wrc = cli_convert_rows(j->pool, j->types[i], t->ne[0], nrows, quantize_row, &src, j->buf, &prog, &err);
            if (!wrc) wrc = gguf_writer_write_data(j->w, j->buf, hq_row_size(j->types[i], t->ne[0]) * (size_t)nrows, &err);
        }
        if (wrc) {
            cli_progress_end();
            fprintf(stderr, "hearth quantize: %s: %s\n", t->name, err.msg);
            return 1;
        }
    }
    int rc = gguf_writer_finish(j->w, &err);
    cli_progress_end();
    if (rc) {
        fprintf(stderr, "hearth quantize: %s\n", err.msg);
        return 1;
    }
    printf("wrote %s: %s, %d of %lld tensors converted, %.1f MiB -> %.1f MiB (%.1f s)\n", j->out, j->recipe.name,
           j->n_conv, (long long)j->nt, j->bytes_in / 1048576.0, j->bytes_out / 1048576.0, hr_time_s() - t0);
    return 0;
}

static int quantize(cli_opts *o) {
    quantize_job j = {.o = o, .in = o->pos[0], .out = o->pos[1]};
    hr_err err = {0};
    int rc = 0;
    if (!cli_recipe_parse(o->pos[2], &j.recipe)) {
        fprintf(stderr, "hearth quantize: unknown type '%s' (%s)\n", o->pos[2], cli_recipe_names());
        return 2;
    }
    if (!(rc = quantize_paths(&j)) && !(j.g = gguf_open(j.in, &err))) {
        fprintf(stderr, "hearth quantize: %s\n", err.msg);
        rc = 1;
    }
    if (!rc) j.nt = gguf_n_tensors(j.g);
    if (!rc) rc = quantize_types(&j);
    if (!rc) rc = quantize_metadata(&j);
    if (!rc) rc = quantize_write(&j);
    free(j.buf);
    if (j.pool) hr_pool_free(j.pool);
    if (j.w) gguf_writer_free(j.w);
    free(j.types);
    if (j.g) gguf_close(j.g);
    return rc;
}

const cli_command cli_quantize = {
    "quantize", CLI_QUANTIZE, "convert a GGUF model's weights to another type", "IN OUT TYPE [options]",
    "Converts the F32/F16/BF16 2-D weights of the GGUF model IN to TYPE and writes OUT. 1-D tensors\n"
    "(norms, biases) and tensors that are already quantized are copied as they are; token_embd is\n"
    "quantized too (as llama.cpp does) unless --keep-embd. Metadata is copied; general.file_type is\n"
    "updated.",
    3, .epilog = quantize_epilog, .check = quantize_check, .run = quantize};
