/* gguf: the streaming writer — see gguf.h.
 *
 * Each metadata value is kept already encoded as its on-disk bytes (what follows the u32 type), so
 * writing is a copy and gguf_writer_copy_kv can take a reader's bytes verbatim. Tensor data never
 * passes through memory held by the writer: the caller hands it over tensor by tensor.
 */
#include "gguf-impl.h"

#include "quant/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct wkv {
    char    *key;
    uint32_t type;
    uint8_t *val;      /* encoded value */
    size_t   val_size;
} wkv;

typedef struct wtensor {
    char    *name;
    int      type;
    int      n_dims;
    int64_t  ne[GGUF_MAX_DIMS];
    uint64_t nbytes;
    uint64_t offset;   /* assigned by gguf_writer_begin */
} wtensor;

enum { W_BUILDING, W_WRITING, W_DONE, W_FAILED };

struct gguf_writer {
    wkv     *kv;
    size_t   n_kv, kv_cap;
    wtensor *t;
    size_t   n_t, t_cap;

    int      state;
    hr_outfile out;
    char    *path;
    bool     overwrite;
    size_t   alignment;
    size_t   next;        /* the tensor write_data expects */
    uint64_t part;        /* bytes of it write_part has written so far */
    uint64_t pos;         /* bytes written so far */
};

gguf_writer *gguf_writer_create(void) {
    return calloc(1, sizeof(gguf_writer));
}

void gguf_writer_free(gguf_writer *w) {
    if (!w) return;
    hr_outfile_abort(&w->out);
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val);
    }
    for (size_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->kv);
    free(w->t);
    free(w->path);
    free(w);
}

/* ---- metadata ------------------------------------------------------------------------------------ */

static bool key_ok(const char *key) {
    return key && key[0] && strlen(key) <= GGUF_MAX_KEY_LEN;
}

static int64_t find_wkv(const gguf_writer *w, const char *key) {
    for (size_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kv[i].key, key)) return (int64_t)i;
    return -1;
}

/* Takes ownership of val (freed on failure too). */
static int set_encoded(gguf_writer *w, const char *key, uint32_t type, uint8_t *val, size_t val_size) {
    if (!w || w->state != W_BUILDING || !key_ok(key)) {
        free(val);
        return HR_EINVAL;
    }
    int64_t i = find_wkv(w, key);
    if (i >= 0) {
        free(w->kv[i].val);
        w->kv[i].type = type;
        w->kv[i].val = val;
        w->kv[i].val_size = val_size;
        return 0;
    }
    if (w->n_kv == w->kv_cap) {
        size_t ncap = w->kv_cap ? w->kv_cap * 2 : 32;
        wkv *nk = realloc(w->kv, ncap * sizeof *nk);
        if (!nk) { free(val); return HR_ENOMEM; }
        w->kv = nk;
        w->kv_cap = ncap;
    }
    char *k = strdup(key);
    if (!k) { free(val); return HR_ENOMEM; }
    w->kv[w->n_kv++] = (wkv){k, type, val, val_size};
    return 0;
}

static int set_scalar(gguf_writer *w, const char *key, uint32_t type, uint64_t bits) {
    size_t n = gguf_vt_size((int)type);
    uint8_t *v = malloc(8);
    if (!v) return HR_ENOMEM;
    for (size_t i = 0; i < n; i++) v[i] = (uint8_t)(bits >> (8 * i));
    return set_encoded(w, key, type, v, n);
}

int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v) { return set_scalar(w, key, GGUF_VT_UINT32, v); }
int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v) { return set_scalar(w, key, GGUF_VT_INT32, (uint32_t)v); }
int gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v) { return set_scalar(w, key, GGUF_VT_UINT64, v); }
int gguf_writer_set_f32(gguf_writer *w, const char *key, float v) { return set_scalar(w, key, GGUF_VT_FLOAT32, hr_f32_to_bits(v)); }
int gguf_writer_set_bool(gguf_writer *w, const char *key, bool v) { return set_scalar(w, key, GGUF_VT_BOOL, v ? 1 : 0); }

int gguf_writer_set_str(gguf_writer *w, const char *key, const char *v) {
    if (!v) return HR_EINVAL;
    size_t n = strlen(v);
    uint8_t *b = malloc(8 + n);
    if (!b) return HR_ENOMEM;
    gguf_wr_u64(b, n);
    memcpy(b + 8, v, n);
    return set_encoded(w, key, GGUF_VT_STRING, b, 8 + n);
}

int gguf_writer_set_arr(gguf_writer *w, const char *key, int elem_type, const void *data, uint64_t n) {
    size_t esz = gguf_vt_size(elem_type);
    if (!esz || (n && !data) || n > (SIZE_MAX - 12) / esz) return HR_EINVAL;
    size_t nb = (size_t)n * esz;
    if (elem_type == GGUF_VT_BOOL)
        for (size_t i = 0; i < nb; i++)
            if (((const uint8_t *)data)[i] > 1) return HR_EINVAL;
    uint8_t *b = malloc(12 + nb);
    if (!b) return HR_ENOMEM;
    gguf_wr_u32(b, (uint32_t)elem_type);
    gguf_wr_u64(b + 4, n);
    if (nb) memcpy(b + 12, data, nb); /* callers pass little-endian host values */
    return set_encoded(w, key, GGUF_VT_ARRAY, b, 12 + nb);
}

int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const gguf_str *strs, uint64_t n) {
    if (n && !strs) return HR_EINVAL;
    size_t total = 12;
    for (uint64_t i = 0; i < n; i++) {
        if (strs[i].n && !strs[i].s) return HR_EINVAL;
        if (strs[i].n > SIZE_MAX - 8 - total) return HR_EINVAL;
        total += 8 + (size_t)strs[i].n;
    }
    uint8_t *b = malloc(total), *q = b + 12;
    if (!b) return HR_ENOMEM;
    gguf_wr_u32(b, GGUF_VT_STRING);
    gguf_wr_u64(b + 4, n);
    for (uint64_t i = 0; i < n; i++) {
        gguf_wr_u64(q, strs[i].n);
        if (strs[i].n) memcpy(q + 8, strs[i].s, (size_t)strs[i].n);
        q += 8 + strs[i].n;
    }
    return set_encoded(w, key, GGUF_VT_ARRAY, b, total);
}

int gguf_writer_copy_kv(gguf_writer *w, const gguf_ctx *src, int64_t i) {
    const uint8_t *val;
    uint64_t size;
    if (!src || !gguf_kv_raw(src, i, &val, &size) || size > SIZE_MAX) return HR_EINVAL;
    uint8_t *b = malloc(size ? (size_t)size : 1);
    if (!b) return HR_ENOMEM;
    memcpy(b, val, (size_t)size);
    return set_encoded(w, gguf_key(src, i), (uint32_t)gguf_kv_type(src, i), b, (size_t)size);
}

int gguf_writer_remove_key(gguf_writer *w, const char *key) {
    if (!w || w->state != W_BUILDING || !key) return HR_EINVAL;
    int64_t i = find_wkv(w, key);
    if (i < 0) return HR_ENOTFOUND;
    free(w->kv[i].key);
    free(w->kv[i].val);
    memmove(&w->kv[i], &w->kv[i + 1], (w->n_kv - (size_t)i - 1) * sizeof *w->kv);
    w->n_kv--;
    return 0;
}

/* ---- tensors ------------------------------------------------------------------------------------- */

int gguf_writer_add_tensor(gguf_writer *w, const char *name, int type, int n_dims, const int64_t *ne, hr_err *err) {
    if (!w || w->state != W_BUILDING)
        return hr_fail(err, HR_EINVAL, "gguf writer: tensors must be declared before gguf_writer_begin");
    if (!name || !name[0] || strlen(name) > GGUF_MAX_NAME_LEN)
        return hr_fail(err, HR_EINVAL, "gguf writer: tensor name is empty or longer than %u bytes",
                       GGUF_MAX_NAME_LEN);
    for (size_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return hr_fail(err, HR_EINVAL, "gguf writer: tensor '%s' declared twice", name);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS || !ne)
        return hr_fail(err, HR_EINVAL, "gguf writer: tensor '%s': n_dims = %d (must be 1..%d)", name, n_dims,
                       GGUF_MAX_DIMS);
    if (!hq_type_valid(type))
        return hr_fail(err, HR_EUNSUPPORTED, "gguf writer: tensor '%s': type %d (%s) is not supported", name,
                       type, hq_type_name(type));
    const hq_traits *tr = hq_get_traits(type);
    wtensor t = {.type = type, .n_dims = n_dims, .ne = {1, 1, 1, 1}};
    /* the reader's rule: zero dims are allowed and count as 1 in the int64 bound */
    uint64_t bound = 1;
    bool empty = false;
    for (int d = 0; d < n_dims; d++) {
        uint64_t v = ne[d] > 0 ? (uint64_t)ne[d] : 1;
        if (ne[d] < 0 || __builtin_mul_overflow(bound, v, &bound) || bound > (uint64_t)INT64_MAX)
            return hr_fail(err, HR_EINVAL, "gguf writer: tensor '%s': bad or too large shape", name);
        empty |= ne[d] == 0;
        t.ne[d] = ne[d];
    }
    uint64_t nel = empty ? 0 : bound;
    if (t.ne[0] % tr->blck_size)
        return hr_fail(err, HR_EINVAL, "gguf writer: tensor '%s': row length %lld is not a multiple of %s's "
                       "block size %lld", name, (long long)t.ne[0], tr->name, (long long)tr->blck_size);
    if (__builtin_mul_overflow(nel / (uint64_t)tr->blck_size, (uint64_t)tr->type_size, &t.nbytes))
        return hr_fail(err, HR_EINVAL, "gguf writer: tensor '%s': size in bytes overflows", name);
    if (w->n_t == w->t_cap) {
        size_t ncap = w->t_cap ? w->t_cap * 2 : 64;
        wtensor *nt = realloc(w->t, ncap * sizeof *nt);
        if (!nt) return hr_fail(err, HR_ENOMEM, "gguf writer: out of memory");
        w->t = nt;
        w->t_cap = ncap;
    }
    if (!(t.name = strdup(name))) return hr_fail(err, HR_ENOMEM, "gguf writer: out of memory");
    w->t[w->n_t++] = t;
    return 0;
}

/* ---- streaming ----------------------------------------------------------------------------------- */

static int put(gguf_writer *w, const void *p, size_t n, hr_err *err) {
    if (n && fwrite(p, 1, n, w->out.f) != n) {
        w->state = W_FAILED;
        return hr_fail(err, HR_EIO, "%s: write failed: %s", hr_outfile_name(&w->out), strerror(errno));
    }
    w->pos += n;
    return 0;
}

static int put_u32(gguf_writer *w, uint32_t v, hr_err *err) {
    uint8_t b[4];
    gguf_wr_u32(b, v);
    return put(w, b, 4, err);
}

static int put_u64(gguf_writer *w, uint64_t v, hr_err *err) {
    uint8_t b[8];
    gguf_wr_u64(b, v);
    return put(w, b, 8, err);
}

static int put_str(gguf_writer *w, const char *s, hr_err *err) {
    size_t n = strlen(s);
    int rc = put_u64(w, n, err);
    return rc ? rc : put(w, s, n, err);
}

static int pad_to_alignment(gguf_writer *w, hr_err *err) {
    static const uint8_t zeros[256];
    size_t pad = (size_t)(hr_pad((size_t)w->pos, w->alignment) - w->pos);
    int rc = 0;
    while (pad && !rc) {
        size_t n = HR_MIN(pad, sizeof zeros);
        rc = put(w, zeros, n, err);
        pad -= n;
    }
    return rc;
}

static bool path_exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

int gguf_writer_begin(gguf_writer *w, const char *path, bool overwrite, hr_err *err) {
    if (!w || w->state != W_BUILDING || !path || !path[0])
        return hr_fail(err, HR_EINVAL, "gguf writer: begin called twice or without a path");
    if (!overwrite && path_exists(path))
        return hr_fail(err, HR_EEXIST, "%s already exists; pass --force to overwrite it or choose another name",
                       path);
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t ai = find_wkv(w, "general.alignment");
    if (ai >= 0) {
        const wkv *kv = &w->kv[ai];
        uint32_t a = kv->type == GGUF_VT_UINT32 ? gguf_rd_u32(kv->val) : 0;
        if (kv->type != GGUF_VT_UINT32 || a == 0 || (a & (a - 1)))
            return hr_fail(err, HR_EINVAL, "gguf writer: general.alignment must be a u32 power of two");
        w->alignment = a;
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        w->t[i].offset = off;
        uint64_t padded = (w->t[i].nbytes + w->alignment - 1) / w->alignment * w->alignment;
        if (padded < w->t[i].nbytes || __builtin_add_overflow(off, padded, &off))
            return hr_fail(err, HR_EINVAL, "gguf writer: tensor data exceeds 2^64 bytes");
    }

    w->overwrite = overwrite;
    if (!(w->path = strdup(path))) return hr_fail(err, HR_ENOMEM, "gguf writer: out of memory");
    int orc = hr_outfile_open(&w->out, path, err);
    if (orc) {
        w->state = W_FAILED;
        return orc;
    }
    w->state = W_WRITING;

    int rc;
    if ((rc = put_u32(w, GGUF_MAGIC, err)) || (rc = put_u32(w, 3, err)) ||
        (rc = put_u64(w, w->n_t, err)) || (rc = put_u64(w, w->n_kv, err)))
        return rc;
    for (size_t i = 0; i < w->n_kv; i++)
        if ((rc = put_str(w, w->kv[i].key, err)) || (rc = put_u32(w, w->kv[i].type, err)) ||
            (rc = put(w, w->kv[i].val, w->kv[i].val_size, err)))
            return rc;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        if ((rc = put_str(w, t->name, err)) || (rc = put_u32(w, (uint32_t)t->n_dims, err))) return rc;
        for (int d = 0; d < t->n_dims; d++)
            if ((rc = put_u64(w, (uint64_t)t->ne[d], err))) return rc;
        if ((rc = put_u32(w, (uint32_t)t->type, err)) || (rc = put_u64(w, t->offset, err))) return rc;
    }
    return pad_to_alignment(w, err);
}

int gguf_writer_write_data(gguf_writer *w, const void *data, size_t nbytes, hr_err *err) {
    if (!w || w->state != W_WRITING)
        return hr_fail(err, HR_EINVAL, "gguf writer: write_data outside begin..finish (or after a failure)");
    if (w->next >= w->n_t)
        return hr_fail(err, HR_EINVAL, "%s: all %zu declared tensors are already written", w->path, w->n_t);
    const wtensor *t = &w->t[w->next];
    if (nbytes != t->nbytes || w->part)
        return hr_fail(err, HR_EINVAL, "%s: tensor '%s' (%s) needs %llu bytes, got %zu", w->path, t->name,
                       hq_type_name(t->type), (unsigned long long)t->nbytes, nbytes);
    if (nbytes && !data) return hr_fail(err, HR_EINVAL, "%s: tensor '%s': NULL data", w->path, t->name);
    int rc = put(w, data, nbytes, err);
    if (!rc) rc = pad_to_alignment(w, err);
    if (!rc) w->next++;
    return rc;
}

int gguf_writer_write_part(gguf_writer *w, const void *data, size_t nbytes, hr_err *err) {
    if (!w || w->state != W_WRITING)
        return hr_fail(err, HR_EINVAL, "gguf writer: write_part outside begin..finish (or after a failure)");
    if (w->next >= w->n_t)
        return hr_fail(err, HR_EINVAL, "%s: all %zu declared tensors are already written", w->path, w->n_t);
    const wtensor *t = &w->t[w->next];
    if (nbytes > t->nbytes - w->part)
        return hr_fail(err, HR_EINVAL, "%s: tensor '%s' needs %llu more bytes, got %zu", w->path, t->name,
                       (unsigned long long)(t->nbytes - w->part), nbytes);
    if (nbytes && !data) return hr_fail(err, HR_EINVAL, "%s: tensor '%s': NULL data", w->path, t->name);
    int rc = put(w, data, nbytes, err);
    if (rc) return rc;
    w->part += nbytes;
    if (w->part < t->nbytes) return 0;
    if ((rc = pad_to_alignment(w, err))) return rc;
    w->part = 0;
    w->next++;
    return 0;
}

int gguf_writer_finish(gguf_writer *w, hr_err *err) {
    if (!w || w->state != W_WRITING)
        return hr_fail(err, HR_EINVAL, "gguf writer: finish without a successful begin");
    if (w->next != w->n_t)
        return hr_fail(err, HR_EINVAL, "%s: only %zu of %zu tensors were written (next: '%s')", w->path, w->next,
                       w->n_t, w->t[w->next].name);
    w->state = W_FAILED; /* until the file is in place */
    /* checked again: the file may have appeared while we were writing */
    if (!w->overwrite && w->out.tmp && path_exists(w->path))
        return hr_fail(err, HR_EEXIST, "%s already exists; pass --force to overwrite it or choose another name",
                       w->path);
    int rc = hr_outfile_commit(&w->out, err);
    if (rc) return rc;
    w->state = W_DONE;
    return 0;
}
