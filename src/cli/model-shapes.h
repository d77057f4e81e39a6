/*
 * model-shapes — what `hearth synth` and `hearth quantize` share: the named model shapes, the list
 * of tensors (llama.cpp names, GGUF ne order) a shape implies, the quantization recipes that pick a
 * type per tensor, and a multi-threaded row converter (float rows in, rows of any type out).
 * Part of the cli layer (prefix cli_); nothing here prints except cli_convert_rows's progress bar.
 *
 * A recipe is a type name (every 2-D weight gets that type) or one of llama.cpp's mixes Q3_K_M,
 * Q4_K_M, Q5_K_M, which give the same tensors the same types as llama.cpp does (docs/design.md,
 * "Quantization recipes"). Rows whose length is no multiple of a type's block fall back to a type
 * that fits.
 */
#ifndef HEARTH_CLI_MODEL_SHAPES_H
#define HEARTH_CLI_MODEL_SHAPES_H

#include "base/base.h"
#include "base/pool.h"

/* ---- shapes ------------------------------------------------------------------------------------ */
typedef struct cli_shape {
    char    name[32];
    char    arch[16];      /* general.architecture: llama, qwen2 (q/k/v biases), qwen3 (q/k norms) */
    int64_t n_embd, n_layer, n_head, n_head_kv;
    int64_t head_dim;      /* 0: n_embd / n_head */
    int64_t n_ff;
    int64_t n_vocab;       /* 0: the size of the vocabulary it is given */
    int64_t n_ctx;         /* context_length written to the file */
    double  rope_base;
    double  rms_eps;
    bool    tied;          /* no output.weight: token_embd is the output head */
} cli_shape;

/* Copies the named shape into *out; false if there is none of that name. */
bool cli_shape_find(const char *name, cli_shape *out);
/* "llama-3.2-1b, llama-3-8b, ..." for usage messages */
const char *cli_shape_names(void);
/* arch-dependent defaults for a custom shape: rope base, eps */
void cli_shape_arch_defaults(cli_shape *s);
/* Checks the numbers are sane and consistent (heads divide, dims positive); message in err. */
int cli_shape_check(const cli_shape *s, hr_err *err);

enum cli_tkind { CLI_T_WEIGHT = 0, CLI_T_NORM = 1, CLI_T_BIAS = 2 };

typedef struct cli_tensor_desc {
    char    name[64];
    int     n_dims;
    int64_t ne[2];         /* ne[0] = row length (input dim), ne[1] = rows */
    int     kind;          /* enum cli_tkind */
} cli_tensor_desc;

/* The tensors of a shape (n_vocab resolved), in file order: token_embd, the blocks, output_norm,
   output. Returns a malloc'd array (caller frees) and its length in *n, or NULL on ENOMEM. */
cli_tensor_desc *cli_shape_tensors(const cli_shape *s, int64_t *n);

/* ---- recipes ----------------------------------------------------------------------------------- */
typedef struct cli_recipe {
    char     name[16];     /* as the user wrote it, canonical case: "Q4_K_M", "Q8_0" */
    int      base;         /* hq_type of most 2-D weights */
    int      mix;          /* 0 pure, else 3/4/5 for Q3_K_M/Q4_K_M/Q5_K_M */
    uint32_t file_type;    /* llama.cpp's general.file_type (LLAMA_FTYPE_*) */
} cli_recipe;

/* Parses a type or recipe name (case-insensitive); false if unknown or not supported. */
bool cli_recipe_parse(const char *s, cli_recipe *out);
/* "F32 F16 BF16 Q4_0 ... Q4_K_M Q5_K_M Q3_K_M" */
const char *cli_recipe_names(void);
/* The type the recipe gives the 2-D weight `name` (before any fallback). n_layer: blocks in the
   model; has_output: whether the model has a separate output.weight. */
int cli_recipe_type(const cli_recipe *r, const char *name, int64_t n_layer, bool has_output);
/* The recipe name of a general.file_type value ("Q4_K_M"), or NULL if not one of ours. */
const char *cli_file_type_name(uint32_t file_type);
/* A type whose block divides ne0, starting from `type` (itself if it fits). */
int cli_type_fallback(int type, int64_t ne0);

/* Collects "N tensors stored as X instead of Y" notes so they are said once, not per layer. */
typedef struct cli_fallbacks {
    struct { int want, got; int64_t ne0; int count; char example[64]; } e[16];
    int n;
} cli_fallbacks;
void cli_fallbacks_add(cli_fallbacks *f, int want, int got, int64_t ne0, const char *name);
void cli_fallbacks_report(const cli_fallbacks *f, const char *cmd);  /* to stderr */

/* ---- converter --------------------------------------------------------------------------------- */
/* Fills dst[0..ne0) with the float values of row `row`. Called from several threads at once. */
typedef void (*cli_row_fn)(void *user, int64_t row, float *dst, int64_t ne0);

typedef struct cli_progress_state {
    const char *label;
    uint64_t    done, total;   /* elements */
} cli_progress_state;

/* out[nrows * hq_row_size(dst_type, ne0)] = dst_type rows of fn's float rows, converted with the
   reference quantizer on all threads of `pool`. Advances and draws `prog` (may be NULL). */
int cli_convert_rows(hr_pool *pool, int dst_type, int64_t ne0, int64_t nrows, cli_row_fn fn, void *user,
                void *out, cli_progress_state *prog, hr_err *err);

#endif
