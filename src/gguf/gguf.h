/*
 * gguf — reader (over mmap) and writer for GGUF files, versions 2 and 3.  Prefix: gguf_.
 *
 * File layout (all little-endian):
 *   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x { string key | u32 value_type | value }
 *   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
 *   padding to `general.alignment` (default 32)
 *   tensor data: each tensor at data_start + offset, offsets aligned to the alignment
 *   string = u64 length + bytes (no NUL);  array = u32 elem_type + u64 count + elems
 * Version 1 (u32 counts) is refused with a message.
 *
 * The reader checks every count, length, type, offset and size against the bytes that remain: a
 * truncated or hostile file gives NULL and a message naming the key or tensor, never a crash.
 * Ownership: gguf_ctx owns the mapping; every pointer it hands out is borrowed until gguf_close().
 */
#ifndef HEARTH_GGUF_H
#define HEARTH_GGUF_H

#include "base/base.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" as a little-endian u32 */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

/* metadata value types (on disk; append only) */
enum gguf_vtype {
    GGUF_VT_UINT8 = 0, GGUF_VT_INT8 = 1, GGUF_VT_UINT16 = 2, GGUF_VT_INT16 = 3,
    GGUF_VT_UINT32 = 4, GGUF_VT_INT32 = 5, GGUF_VT_FLOAT32 = 6, GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8, GGUF_VT_ARRAY = 9, GGUF_VT_UINT64 = 10, GGUF_VT_INT64 = 11,
    GGUF_VT_FLOAT64 = 12, GGUF_VT_COUNT = 13,
};

typedef struct gguf_str { const char *s; uint64_t n; } gguf_str;  /* not NUL-terminated */

typedef struct gguf_tensor {
    const char *name;          /* NUL-terminated copy owned by the ctx */
    int         type;          /* hq_type (ggml type id) */
    int         n_dims;
    int64_t     ne[GGUF_MAX_DIMS]; /* ne[0] = row length (contiguous); unused dims are 1 */
    uint64_t    offset;        /* relative to the data section */
    uint64_t    nbytes;        /* checked: fits in the file */
    const void *data;          /* borrowed pointer into the mapping */
} gguf_tensor;

typedef struct gguf_ctx gguf_ctx;

/* Opens and validates `path` (read-only mmap). Returns NULL and fills err on any problem. */
gguf_ctx *gguf_open(const char *path, hr_err *err);
/* Same over a caller-owned buffer (not copied; must outlive the ctx). For tests and fuzzing. */
gguf_ctx *gguf_open_buffer(const void *data, size_t size, hr_err *err);
void      gguf_close(gguf_ctx *ctx);

uint32_t    gguf_version(const gguf_ctx *ctx);
size_t      gguf_alignment(const gguf_ctx *ctx);
size_t      gguf_file_size(const gguf_ctx *ctx);
const void *gguf_base(const gguf_ctx *ctx);          /* start of the mapping */
uint64_t    gguf_data_offset(const gguf_ctx *ctx);   /* file offset of the data section */

/* ---- metadata ---- */
int64_t     gguf_n_kv(const gguf_ctx *ctx);
int64_t     gguf_find_key(const gguf_ctx *ctx, const char *key);      /* index or -1 */
const char *gguf_key(const gguf_ctx *ctx, int64_t i);                 /* NUL-terminated */
int         gguf_kv_type(const gguf_ctx *ctx, int64_t i);             /* enum gguf_vtype */

/* Typed getters by key. They return false if the key is absent or holds another type (integer
   getters accept any integer type whose value fits; float getters accept f32/f64). */
bool gguf_get_u32(const gguf_ctx *ctx, const char *key, uint32_t *out);
bool gguf_get_i64(const gguf_ctx *ctx, const char *key, int64_t *out);
bool gguf_get_f32(const gguf_ctx *ctx, const char *key, float *out);
bool gguf_get_bool(const gguf_ctx *ctx, const char *key, bool *out);
bool gguf_get_str(const gguf_ctx *ctx, const char *key, gguf_str *out);
/* NUL-terminated copy of a string value into buf (truncated to cap-1); false if absent/not string */
bool gguf_get_cstr(const gguf_ctx *ctx, const char *key, char *buf, size_t cap);

/* Arrays: element type and count; numeric array data is a borrowed pointer (little-endian,
   possibly unaligned — read with memcpy). String arrays are read element by element. */
bool gguf_get_arr(const gguf_ctx *ctx, const char *key, int *elem_type, uint64_t *n, const void **data);
/* i-th string of a string array (O(1): the reader indexes string arrays when it opens the file) */
bool gguf_get_arr_str(const gguf_ctx *ctx, const char *key, uint64_t i, gguf_str *out);

/* ---- tensors ---- */
int64_t            gguf_n_tensors(const gguf_ctx *ctx);
const gguf_tensor *gguf_tensor_at(const gguf_ctx *ctx, int64_t i);
const gguf_tensor *gguf_find_tensor(const gguf_ctx *ctx, const char *name); /* NULL if absent */
int64_t            gguf_tensor_nelements(const gguf_tensor *t);

/* ---- writer ------------------------------------------------------------------------------------
 * Streams a GGUF v3 file: set metadata and declare tensors (name, type, shape), then
 * gguf_writer_begin() writes the header and tensor directory, then gguf_writer_write_data() is
 * called once per tensor in declaration order with exactly its bytes (the writer pads), then
 * gguf_writer_finish(). The file is written to "<path>.tmp" and renamed on finish, so a failed run
 * never leaves a half-written file under the final name. It refuses to replace an existing file
 * unless `overwrite` is set.
 */
typedef struct gguf_writer gguf_writer;
gguf_writer *gguf_writer_create(void);
void gguf_writer_free(gguf_writer *w);   /* also removes the .tmp file if not finished */
/* metadata setters: replace the value if the key exists, keep insertion order otherwise */
int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
int gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
int gguf_writer_set_bool(gguf_writer *w, const char *key, bool v);
int gguf_writer_set_str(gguf_writer *w, const char *key, const char *v);
int gguf_writer_set_arr(gguf_writer *w, const char *key, int elem_type, const void *data, uint64_t n); /* numeric */
int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const gguf_str *strs, uint64_t n);
/* copy one kv (any type, arrays included) from a reader */
int gguf_writer_copy_kv(gguf_writer *w, const gguf_ctx *src, int64_t i);
int gguf_writer_remove_key(gguf_writer *w, const char *key);
/* declare a tensor; nbytes is computed from type and shape (error if ne[0] is not a block multiple) */
int gguf_writer_add_tensor(gguf_writer *w, const char *name, int type, int n_dims, const int64_t *ne, hr_err *err);
int gguf_writer_begin(gguf_writer *w, const char *path, bool overwrite, hr_err *err);
int gguf_writer_write_data(gguf_writer *w, const void *data, size_t nbytes, hr_err *err);
/* The current tensor's bytes in parts (a converter that streams rows): the tensor is complete, and
   padded, once its parts add up to its size; a part past the end is an error. */
int gguf_writer_write_part(gguf_writer *w, const void *data, size_t nbytes, hr_err *err);
int gguf_writer_finish(gguf_writer *w, hr_err *err);

#endif
