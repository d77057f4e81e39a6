/* convert's internals: the safetensors reader (safetensors.c) and the tokenizer (vocab.c), shared
   with convert.c which maps config.json and the tensors to GGUF. */
#ifndef HEARTH_CONVERT_IMPL_H
#define HEARTH_CONVERT_IMPL_H

#include "convert.h"
#include "gguf/gguf.h"

#include <jansson.h>

/* one tensor of a safetensors file, as its header describes it */
typedef struct hcv_st_tensor {
    char          *name;
    int            dtype;      /* HQ_TYPE_F32, HQ_TYPE_F16 or HQ_TYPE_BF16 */
    int            n_dims;
    int64_t        shape[4];   /* as stored: row-major, shape[0] outermost */
    const uint8_t *data;       /* in the file's mapping */
    uint64_t       nbytes;
    int            file;       /* index into hcv_st.files */
} hcv_st_tensor;

typedef struct hcv_st {
    hcv_st_tensor *t;
    size_t         n, cap;
    struct hcv_st_file { char *path; void *map; size_t size; } *files;
    int            n_files;
} hcv_st;

/* The checkpoint's weights: model.safetensors, or the shards model.safetensors.index.json names. */
int  hcv_st_open_dir(hcv_st *st, const char *dir, hr_err *err);
void hcv_st_close(hcv_st *st);
const hcv_st_tensor *hcv_st_find(const hcv_st *st, const char *name);

/* A JSON file of the checkpoint (dir/name), read with jansson's flags (JSON_DECODE_INT_AS_REAL for
   a file whose integers may exceed 64 bits); NULL with the reason in err, or (optional) NULL and no
   error when the file does not exist. */
json_t *hcv_json_load(const char *dir, const char *name, bool optional, size_t flags, hr_err *err);

/* What the tokenizer needs from config.json. */
typedef struct hcv_vocab_info {
    int32_t n_vocab;            /* rows of the embedding */
    int32_t bos, eos;           /* config.json's ids, -1 when not given */
} hcv_vocab_info;

/* tokenizer.json and tokenizer_config.json -> tokenizer.ggml.* and tokenizer.chat_template. */
int hcv_vocab_add(gguf_writer *w, const char *dir, const hcv_vocab_info *vi, hr_err *err);

#endif
