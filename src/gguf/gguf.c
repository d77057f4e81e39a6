/* gguf: the reader — see gguf.h for the format and the ownership rules.
 *
 * gguf_open parses the header and directory in one pass with a bounds-checked cursor, copying only
 * what must be NUL-terminated (keys, tensor names) and an index of string-array elements; values and
 * tensor data stay in the mapping. Every count is checked against the bytes left before anything is
 * sized from it, and the parse arrays grow as entries are actually read, so a file that claims 2^40
 * entries costs nothing more than one that holds them.
 */
#include "gguf-impl.h"

#include "quant/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Smallest possible directory entries, used to bound the counts in the header before the loops:
   key length (8) + key (>= 1 byte) + type (4) + smallest value (1);
   name length (8) + name (>= 1) + n_dims (4) + one dim (8) + type (4) + offset (8). */
#define GGUF_MIN_KV_BYTES     14u
#define GGUF_MIN_TENSOR_BYTES 33u
#define GGUF_HEADER_BYTES     24u

typedef struct gguf_kv {
    const char *key;       /* into ctx->names once the parse is done */
    size_t      key_off;   /* offset in ctx->names while parsing (the arena may move) */
    int         type;
    int         elem_type; /* arrays only */
    uint64_t    n;         /* arrays: element count; strings: byte length */
    uint64_t    val_off;   /* file offset of the value (after its u32 type) */
    uint64_t    val_size;  /* bytes the value takes on disk */
    uint64_t    data_off;  /* scalar: the value; string: its bytes; array: the first element */
    uint64_t    str_first; /* string arrays: index of element 0 in ctx->str_index */
} gguf_kv;

struct gguf_ctx {
    const uint8_t *base;
    size_t         size;
    void          *map;          /* our mmap, or NULL for a caller's buffer */
    uint32_t       version;
    size_t         alignment;
    uint64_t       data_start;

    gguf_kv     *kv;
    int64_t      n_kv;
    gguf_tensor *tensors;
    int64_t      n_tensors;

    uint64_t *str_index;         /* file offset of each string-array element's length prefix */
    uint64_t  n_str_index;
    char     *names;             /* NUL-terminated keys and tensor names */
    size_t    names_len;

    /* open-addressing hash tables of index+1 (0 = empty); sizes are powers of two */
    int64_t *kv_hash;
    size_t   kv_hash_cap;
    int64_t *tensor_hash;
    size_t   tensor_hash_cap;
};

const char *gguf_vt_name(int t) {
    static const char *const names[GGUF_VT_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
    };
    return t >= 0 && t < GGUF_VT_COUNT ? names[t] : "unknown";
}

/* ggml's names for types hearth does not run, so a refusal says what the file holds */
static const char *gguf_ggml_type_name(uint32_t t) {
    static const char *const names[] = {
        [4] = "Q4_2 (removed)", [5] = "Q4_3 (removed)", [16] = "IQ2_XXS", [17] = "IQ2_XS",
        [18] = "IQ3_XXS", [19] = "IQ1_S", [20] = "IQ4_NL", [21] = "IQ3_S", [22] = "IQ2_S",
        [23] = "IQ4_XS", [24] = "I8", [25] = "I16", [26] = "I32", [27] = "I64", [28] = "F64",
        [29] = "IQ1_M", [31] = "Q4_0_4_4 (removed)", [32] = "Q4_0_4_8 (removed)",
        [33] = "Q4_0_8_8 (removed)", [34] = "TQ1_0", [35] = "TQ2_0", [39] = "MXFP4",
    };
    if (t < HQ_TYPE_COUNT && strcmp(hq_type_name((int)t), "unknown") != 0) return hq_type_name((int)t);
    if (t < HR_ARRAY_LEN(names) && names[t]) return names[t];
    return "unknown";
}

/* ---- growable arrays (parse state) --------------------------------------------------------------- */

/* Makes room for one more element; capacities double so the total cost stays linear. */
static bool grow(void **p, size_t *cap, size_t len, size_t elem) {
    if (len < *cap) return true;
    size_t ncap = *cap ? *cap * 2 : 16;
    if (ncap > SIZE_MAX / elem) return false;
    void *np = realloc(*p, ncap * elem);
    if (!np) return false;
    *p = np;
    *cap = ncap;
    return true;
}

/* ---- hash tables --------------------------------------------------------------------------------- */

static uint64_t name_hash(const char *s, size_t n) { return hr_fnv1a(s, n, HR_FNV_SEED); }

static size_t hash_cap_for(int64_t n) {
    size_t cap = 16;
    while (cap < (size_t)n * 2) cap *= 2;
    return cap;
}

/* Inserts entry idx (named name) into tab; returns the index of an earlier entry with the same
   name instead, or -1 when inserted. */
static int64_t hash_insert(int64_t *tab, size_t cap, const char *name, int64_t idx,
                           const char *(*name_of)(const gguf_ctx *, int64_t), const gguf_ctx *ctx) {
    size_t mask = cap - 1, h = (size_t)name_hash(name, strlen(name)) & mask;
    for (;; h = (h + 1) & mask) {
        if (!tab[h]) { tab[h] = idx + 1; return -1; }
        if (!strcmp(name_of(ctx, tab[h] - 1), name)) return tab[h] - 1;
    }
}

static int64_t hash_find(const int64_t *tab, size_t cap, const char *name,
                         const char *(*name_of)(const gguf_ctx *, int64_t), const gguf_ctx *ctx) {
    if (!tab || !name) return -1;
    size_t mask = cap - 1, h = (size_t)name_hash(name, strlen(name)) & mask;
    for (;; h = (h + 1) & mask) {
        if (!tab[h]) return -1;
        if (!strcmp(name_of(ctx, tab[h] - 1), name)) return tab[h] - 1;
    }
}

static const char *kv_name_of(const gguf_ctx *ctx, int64_t i) { return ctx->kv[i].key; }
static const char *tensor_name_of(const gguf_ctx *ctx, int64_t i) { return ctx->tensors[i].name; }

/* ---- the parser ---------------------------------------------------------------------------------- */

typedef struct parser {
    gguf_ctx   *ctx;
    const char *file;      /* path or "<buffer>", for messages */
    hr_err     *err;
    uint64_t    pos;
    size_t      names_cap, kv_cap, tensor_cap, str_cap;
    size_t     *name_off;   /* tensor names' offsets in ctx->names (the arena moves while it grows) */
    char        where[160]; /* what is being read: "header", "key 'x'", "tensor 'y'" */
} parser;

static uint64_t left(const parser *p) { return p->ctx->size - p->pos; }

static int truncated(parser *p, uint64_t need, const char *what) {
    return hr_fail(p->err, HR_EFORMAT, "%s: %s: file truncated reading %s (need %llu bytes at offset %llu, "
                   "file has %zu)", p->file, p->where, what, (unsigned long long)need,
                   (unsigned long long)p->pos, p->ctx->size);
}

static int rd_u32(parser *p, uint32_t *v, const char *what) {
    if (left(p) < 4) return truncated(p, 4, what);
    *v = gguf_rd_u32(p->ctx->base + p->pos);
    p->pos += 4;
    return 0;
}

static int rd_u64(parser *p, uint64_t *v, const char *what) {
    if (left(p) < 8) return truncated(p, 8, what);
    *v = gguf_rd_u64(p->ctx->base + p->pos);
    p->pos += 8;
    return 0;
}

/* A string's length, checked against the bytes left (and against max, if non-zero); on success the
   cursor is at its bytes. */
static int rd_str_len(parser *p, uint64_t *n, uint64_t max, const char *what) {
    int rc = rd_u64(p, n, what);
    if (rc) return rc;
    if (max && *n > max)
        return hr_fail(p->err, HR_EFORMAT, "%s: %s: %s is %llu bytes long (at most %llu allowed)", p->file,
                       p->where, what, (unsigned long long)*n, (unsigned long long)max);
    if (*n > left(p)) return truncated(p, *n, what);
    return 0;
}

/* Reads a key or tensor name into the names arena; *off is where it starts there. */
static int rd_name(parser *p, size_t *off, uint64_t max, const char *what) {
    uint64_t n;
    int rc = rd_str_len(p, &n, max, what);
    if (rc) return rc;
    const char *s = (const char *)p->ctx->base + p->pos;
    if (n == 0) return hr_fail(p->err, HR_EFORMAT, "%s: %s: empty %s", p->file, p->where, what);
    if (memchr(s, 0, n))
        return hr_fail(p->err, HR_EFORMAT, "%s: %s: %s '%.*s' contains a NUL byte", p->file, p->where, what,
                       (int)strnlen(s, 64), s);
    gguf_ctx *ctx = p->ctx;
    while (ctx->names_len + n + 1 > p->names_cap) {
        size_t ncap = p->names_cap ? p->names_cap * 2 : 4096;
        char *nb = realloc(ctx->names, ncap);
        if (!nb) return hr_fail(p->err, HR_ENOMEM, "%s: out of memory reading names", p->file);
        ctx->names = nb;
        p->names_cap = ncap;
    }
    memcpy(ctx->names + ctx->names_len, s, n);
    ctx->names[ctx->names_len + n] = 0;
    *off = ctx->names_len;
    ctx->names_len += n + 1;
    p->pos += n;
    return 0;
}

static int check_bools(parser *p, const uint8_t *b, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if (b[i] > 1)
            return hr_fail(p->err, HR_EFORMAT, "%s: %s: bool value %u at offset %llu is neither 0 nor 1",
                           p->file, p->where, b[i], (unsigned long long)(b - p->ctx->base));
    return 0;
}

static int parse_value(parser *p, gguf_kv *kv) {
    gguf_ctx *ctx = p->ctx;
    kv->val_off = p->pos;
    int rc;
    if (kv->type == GGUF_VT_STRING) {
        if ((rc = rd_str_len(p, &kv->n, 0, "string value"))) return rc;
        kv->data_off = p->pos;
        p->pos += kv->n;
    } else if (kv->type == GGUF_VT_ARRAY) {
        uint32_t et;
        if ((rc = rd_u32(p, &et, "array element type"))) return rc;
        if (et >= GGUF_VT_COUNT)
            return hr_fail(p->err, HR_EFORMAT, "%s: %s: unknown array element type %u", p->file, p->where, et);
        if (et == GGUF_VT_ARRAY)
            return hr_fail(p->err, HR_EUNSUPPORTED, "%s: %s: arrays of arrays are not supported", p->file,
                           p->where);
        kv->elem_type = (int)et;
        if ((rc = rd_u64(p, &kv->n, "array length"))) return rc;
        kv->data_off = p->pos;
        /* each string element takes at least its 8-byte length */
        size_t esz = et == GGUF_VT_STRING ? 8 : gguf_vt_size((int)et);
        if (kv->n > left(p) / esz)
            return hr_fail(p->err, HR_EFORMAT, "%s: %s: array of %llu %s elements does not fit in the %llu "
                           "bytes left in the file", p->file, p->where, (unsigned long long)kv->n,
                           gguf_vt_name((int)et), (unsigned long long)left(p));
        if (et == GGUF_VT_STRING) {
            kv->str_first = ctx->n_str_index;
            for (uint64_t i = 0; i < kv->n; i++) {
                if (!grow((void **)&ctx->str_index, &p->str_cap, ctx->n_str_index, sizeof(uint64_t)))
                    return hr_fail(p->err, HR_ENOMEM, "%s: out of memory indexing %s", p->file, p->where);
                ctx->str_index[ctx->n_str_index++] = p->pos;
                uint64_t n;
                if ((rc = rd_str_len(p, &n, 0, "array string"))) return rc;
                p->pos += n;
            }
        } else {
            uint64_t nb = kv->n * esz;
            if (et == GGUF_VT_BOOL && (rc = check_bools(p, ctx->base + p->pos, kv->n))) return rc;
            p->pos += nb;
        }
    } else {
        size_t sz = gguf_vt_size(kv->type);
        if (left(p) < sz) return truncated(p, sz, "value");
        kv->data_off = p->pos;
        if (kv->type == GGUF_VT_BOOL && (rc = check_bools(p, ctx->base + p->pos, 1))) return rc;
        p->pos += sz;
    }
    kv->val_size = p->pos - kv->val_off;
    return 0;
}

static int parse_kvs(parser *p, uint64_t n_kv) {
    gguf_ctx *ctx = p->ctx;
    int rc;
    for (uint64_t i = 0; i < n_kv; i++) {
        snprintf(p->where, sizeof p->where, "key #%llu", (unsigned long long)i);
        if (!grow((void **)&ctx->kv, &p->kv_cap, (size_t)ctx->n_kv, sizeof(gguf_kv)))
            return hr_fail(p->err, HR_ENOMEM, "%s: out of memory reading metadata", p->file);
        gguf_kv *kv = &ctx->kv[ctx->n_kv];
        memset(kv, 0, sizeof *kv);
        if ((rc = rd_name(p, &kv->key_off, GGUF_MAX_KEY_LEN, "key"))) return rc;
        snprintf(p->where, sizeof p->where, "key '%.120s'", ctx->names + kv->key_off);
        uint32_t t;
        if ((rc = rd_u32(p, &t, "value type"))) return rc;
        if (t >= GGUF_VT_COUNT)
            return hr_fail(p->err, HR_EFORMAT, "%s: %s: unknown value type %u", p->file, p->where, t);
        kv->type = (int)t;
        if ((rc = parse_value(p, kv))) return rc;
        ctx->n_kv++;
    }
    return 0;
}

static int parse_tensors(parser *p, uint64_t n_tensors) {
    gguf_ctx *ctx = p->ctx;
    int rc;
    for (uint64_t i = 0; i < n_tensors; i++) {
        snprintf(p->where, sizeof p->where, "tensor #%llu", (unsigned long long)i);
        size_t name_cap = p->tensor_cap;
        if (!grow((void **)&ctx->tensors, &p->tensor_cap, (size_t)ctx->n_tensors, sizeof(gguf_tensor)) ||
            !grow((void **)&p->name_off, &name_cap, (size_t)ctx->n_tensors, sizeof(size_t)))
            return hr_fail(p->err, HR_ENOMEM, "%s: out of memory reading the tensor directory", p->file);
        gguf_tensor *t = &ctx->tensors[ctx->n_tensors];
        memset(t, 0, sizeof *t);
        size_t name_off;
        if ((rc = rd_name(p, &name_off, GGUF_MAX_NAME_LEN, "tensor name"))) return rc;
        p->name_off[ctx->n_tensors] = name_off;
        snprintf(p->where, sizeof p->where, "tensor '%.120s'", ctx->names + name_off);

        uint32_t nd;
        if ((rc = rd_u32(p, &nd, "n_dims"))) return rc;
        if (nd < 1 || nd > GGUF_MAX_DIMS)
            return hr_fail(p->err, HR_EFORMAT, "%s: %s: n_dims = %u (must be 1..%d)", p->file, p->where, nd,
                           GGUF_MAX_DIMS);
        t->n_dims = (int)nd;
        /* Zero dims are allowed (an empty tensor), but they count as 1 in the bound: then every
           partial product of the dims, in any order, fits in an int64 too. */
        uint64_t bound = 1;
        bool overflow = false, empty = false;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t ne;
            if ((rc = rd_u64(p, &ne, "dimension"))) return rc;
            if (ne > (uint64_t)INT64_MAX)
                return hr_fail(p->err, HR_EFORMAT, "%s: %s: dimension %u is %llu (negative as int64)", p->file,
                               p->where, d, (unsigned long long)ne);
            t->ne[d] = (int64_t)ne;
            empty |= ne == 0;
            overflow |= __builtin_mul_overflow(bound, ne ? ne : 1, &bound) || bound > (uint64_t)INT64_MAX;
        }
        uint64_t nel = empty ? 0 : bound;
        if (overflow)
            return hr_fail(p->err, HR_EFORMAT, "%s: %s: shape [%lld, %lld, %lld, %lld] has more elements than "
                           "int64 can count", p->file, p->where, (long long)t->ne[0], (long long)t->ne[1],
                           (long long)t->ne[2], (long long)t->ne[3]);

        uint32_t type;
        if ((rc = rd_u32(p, &type, "tensor type"))) return rc;
        if (type >= HQ_TYPE_COUNT || !hq_type_valid((int)type))
            return hr_fail(p->err, HR_EUNSUPPORTED, "%s: %s has type %s (%u), which hearth does not support",
                           p->file, p->where, gguf_ggml_type_name(type), type);
        t->type = (int)type;
        const hq_traits *tr = hq_get_traits(t->type);
        if (t->ne[0] % tr->blck_size)
            return hr_fail(p->err, HR_EFORMAT, "%s: %s: row length %lld is not a multiple of %s's block "
                           "size %lld", p->file, p->where, (long long)t->ne[0], tr->name,
                           (long long)tr->blck_size);
        /* ne0 / blck blocks per row, nel / ne0 rows, or 0 rows of nothing when ne0 == 0 */
        uint64_t blocks = nel / (uint64_t)tr->blck_size;
        if (__builtin_mul_overflow(blocks, (uint64_t)tr->type_size, &t->nbytes))
            return hr_fail(p->err, HR_EFORMAT, "%s: %s: size in bytes overflows", p->file, p->where);
        if ((rc = rd_u64(p, &t->offset, "tensor offset"))) return rc;
        ctx->n_tensors++;
    }
    return 0;
}

/* Offsets, sizes and overlaps, once the data section's start is known. */
typedef struct span { uint64_t start, end; int64_t idx; } span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int check_tensor_data(parser *p) {
    gguf_ctx *ctx = p->ctx;
    uint64_t avail = ctx->data_start <= ctx->size ? ctx->size - ctx->data_start : 0;
    for (int64_t i = 0; i < ctx->n_tensors; i++) {
        gguf_tensor *t = &ctx->tensors[i];
        if (t->offset % ctx->alignment)
            return hr_fail(p->err, HR_EFORMAT, "%s: tensor '%s': offset %llu is not a multiple of the "
                           "alignment %zu", p->file, t->name, (unsigned long long)t->offset, ctx->alignment);
        if (ctx->data_start > ctx->size || t->offset > avail || t->nbytes > avail - t->offset)
            return hr_fail(p->err, HR_EFORMAT, "%s: tensor '%s' extends past end of file (data at %llu + "
                           "offset %llu + %llu bytes > %zu)", p->file, t->name,
                           (unsigned long long)ctx->data_start, (unsigned long long)t->offset,
                           (unsigned long long)t->nbytes, ctx->size);
        t->data = ctx->base + ctx->data_start + t->offset;
    }
    if (ctx->n_tensors < 2) return 0;
    span *s = malloc((size_t)ctx->n_tensors * sizeof *s);
    if (!s) return hr_fail(p->err, HR_ENOMEM, "%s: out of memory", p->file);
    int64_t n = 0;
    for (int64_t i = 0; i < ctx->n_tensors; i++)
        if (ctx->tensors[i].nbytes) /* empty tensors occupy nothing */
            s[n++] = (span){ctx->tensors[i].offset, ctx->tensors[i].offset + ctx->tensors[i].nbytes, i};
    qsort(s, (size_t)n, sizeof *s, span_cmp);
    int rc = 0;
    for (int64_t i = 1; i < n && !rc; i++)
        if (s[i].start < s[i - 1].end)
            rc = hr_fail(p->err, HR_EFORMAT, "%s: tensors '%s' (bytes %llu..%llu) and '%s' (bytes %llu..%llu) "
                         "overlap", p->file, ctx->tensors[s[i - 1].idx].name,
                         (unsigned long long)s[i - 1].start, (unsigned long long)s[i - 1].end,
                         ctx->tensors[s[i].idx].name, (unsigned long long)s[i].start,
                         (unsigned long long)s[i].end);
    free(s);
    return rc;
}

static int parse(parser *p) {
    gguf_ctx *ctx = p->ctx;
    snprintf(p->where, sizeof p->where, "header");
    if (ctx->size < 4)
        return hr_fail(p->err, HR_EFORMAT, "%s: not a GGUF file (only %zu bytes)", p->file, ctx->size);
    uint32_t magic = gguf_rd_u32(ctx->base);
    if (magic != GGUF_MAGIC && magic != __builtin_bswap32(GGUF_MAGIC))
        return hr_fail(p->err, HR_EFORMAT, "%s: not a GGUF file (magic bytes %02x %02x %02x %02x, expected "
                       "'GGUF')", p->file, ctx->base[0], ctx->base[1], ctx->base[2], ctx->base[3]);
    p->pos = 4;
    uint32_t version;
    int rc;
    if ((rc = rd_u32(p, &version, "version"))) return rc;
    /* a big-endian writer stores the version (and everything after it) byte-swapped */
    if (magic != GGUF_MAGIC || ((version & 0xffff) == 0 && version != 0))
        return hr_fail(p->err, HR_EUNSUPPORTED, "%s: big-endian GGUF file (version field %#x); hearth reads "
                       "little-endian files only", p->file, version);
    if (version == 1)
        return hr_fail(p->err, HR_EUNSUPPORTED, "%s: GGUF version 1 is not supported (it predates 64-bit "
                       "counts); convert the model again with a current llama.cpp", p->file);
    if (version != 2 && version != 3)
        return hr_fail(p->err, HR_EUNSUPPORTED, "%s: unsupported GGUF version %u (hearth reads 2 and 3)",
                       p->file, version);
    ctx->version = version;

    uint64_t n_tensors, n_kv;
    if ((rc = rd_u64(p, &n_tensors, "tensor count"))) return rc;
    if ((rc = rd_u64(p, &n_kv, "metadata count"))) return rc;
    uint64_t rest = left(p);
    if (n_kv > rest / GGUF_MIN_KV_BYTES)
        return hr_fail(p->err, HR_EFORMAT, "%s: header claims %llu metadata entries, more than the %llu bytes "
                       "after it can hold", p->file, (unsigned long long)n_kv, (unsigned long long)rest);
    if (n_tensors > (rest - n_kv * GGUF_MIN_KV_BYTES) / GGUF_MIN_TENSOR_BYTES)
        return hr_fail(p->err, HR_EFORMAT, "%s: header claims %llu tensors and %llu metadata entries, more "
                       "than the %llu bytes after it can hold", p->file, (unsigned long long)n_tensors,
                       (unsigned long long)n_kv, (unsigned long long)rest);

    if ((rc = parse_kvs(p, n_kv))) return rc;
    for (int64_t i = 0; i < ctx->n_kv; i++) ctx->kv[i].key = ctx->names + ctx->kv[i].key_off;
    ctx->kv_hash_cap = hash_cap_for(ctx->n_kv);
    ctx->kv_hash = calloc(ctx->kv_hash_cap, sizeof *ctx->kv_hash);
    if (!ctx->kv_hash) return hr_fail(p->err, HR_ENOMEM, "%s: out of memory", p->file);
    for (int64_t i = 0; i < ctx->n_kv; i++)
        if (hash_insert(ctx->kv_hash, ctx->kv_hash_cap, ctx->kv[i].key, i, kv_name_of, ctx) >= 0)
            return hr_fail(p->err, HR_EFORMAT, "%s: duplicate key '%s'", p->file, ctx->kv[i].key);

    ctx->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t ai = gguf_find_key(ctx, "general.alignment");
    if (ai >= 0) {
        const gguf_kv *kv = &ctx->kv[ai];
        if (kv->type != GGUF_VT_UINT32)
            return hr_fail(p->err, HR_EFORMAT, "%s: key 'general.alignment' has type %s (must be u32)", p->file,
                           gguf_vt_name(kv->type));
        uint32_t a = gguf_rd_u32(ctx->base + kv->data_off);
        if (a == 0 || (a & (a - 1)))
            return hr_fail(p->err, HR_EFORMAT, "%s: key 'general.alignment' is %u (must be a power of two)",
                           p->file, a);
        ctx->alignment = a;
    }

    /* the names arena is final only now: pointers into it are taken here */
    char *names_before = ctx->names;
    if ((rc = parse_tensors(p, n_tensors))) return rc;
    if (ctx->names != names_before)
        for (int64_t i = 0; i < ctx->n_kv; i++) ctx->kv[i].key = ctx->names + ctx->kv[i].key_off;
    for (int64_t i = 0; i < ctx->n_tensors; i++) ctx->tensors[i].name = ctx->names + p->name_off[i];
    ctx->tensor_hash_cap = hash_cap_for(ctx->n_tensors);
    ctx->tensor_hash = calloc(ctx->tensor_hash_cap, sizeof *ctx->tensor_hash);
    if (!ctx->tensor_hash) return hr_fail(p->err, HR_ENOMEM, "%s: out of memory", p->file);
    for (int64_t i = 0; i < ctx->n_tensors; i++)
        if (hash_insert(ctx->tensor_hash, ctx->tensor_hash_cap, ctx->tensors[i].name, i, tensor_name_of, ctx) >= 0)
            return hr_fail(p->err, HR_EFORMAT, "%s: duplicate tensor name '%s'", p->file, ctx->tensors[i].name);

    /* the data section starts at the next alignment boundary after the directory */
    ctx->data_start = (p->pos + ctx->alignment - 1) / ctx->alignment * ctx->alignment;
    return check_tensor_data(p);
}

static gguf_ctx *open_mem(const void *data, size_t size, void *map, const char *file, hr_err *err) {
    gguf_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) {
        if (map) munmap(map, size);
        hr_fail(err, HR_ENOMEM, "%s: out of memory", file);
        return NULL;
    }
    ctx->base = data;
    ctx->size = size;
    ctx->map = map;
    parser p = {.ctx = ctx, .file = file, .err = err};
    int rc = parse(&p);
    free(p.name_off);
    if (rc) {
        gguf_close(ctx);
        return NULL;
    }
    return ctx;
}

gguf_ctx *gguf_open_buffer(const void *data, size_t size, hr_err *err) {
    if (!data && size) {
        hr_fail(err, HR_EINVAL, "<buffer>: NULL data");
        return NULL;
    }
    static const uint8_t empty[1];
    return open_mem(data ? data : empty, size, NULL, "<buffer>", err);
}

gguf_ctx *gguf_open(const char *path, hr_err *err) {
    if (!path) {
        hr_fail(err, HR_EINVAL, "gguf_open: no path");
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        hr_fail(err, errno == ENOENT ? HR_ENOTFOUND : HR_EIO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        hr_fail(err, HR_EIO, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        hr_fail(err, HR_EINVAL, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    if (st.st_size == 0) {
        hr_fail(err, HR_EFORMAT, "%s: empty file, not a GGUF model", path);
        close(fd);
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd); /* the mapping keeps the file alive */
    if (map == MAP_FAILED) {
        hr_fail(err, HR_EIO, "%s: mmap of %zu bytes failed: %s", path, size, strerror(map_errno));
        return NULL;
    }
    return open_mem(map, size, map, path, err);
}

void gguf_close(gguf_ctx *ctx) {
    if (!ctx) return;
    if (ctx->map) munmap(ctx->map, ctx->size);
    free(ctx->kv);
    free(ctx->tensors);
    free(ctx->str_index);
    free(ctx->names);
    free(ctx->kv_hash);
    free(ctx->tensor_hash);
    free(ctx);
}

/* ---- accessors ----------------------------------------------------------------------------------- */

uint32_t    gguf_version(const gguf_ctx *ctx) { return ctx->version; }
size_t      gguf_alignment(const gguf_ctx *ctx) { return ctx->alignment; }
size_t      gguf_file_size(const gguf_ctx *ctx) { return ctx->size; }
const void *gguf_base(const gguf_ctx *ctx) { return ctx->base; }
uint64_t    gguf_data_offset(const gguf_ctx *ctx) { return ctx->data_start; }
int64_t     gguf_n_kv(const gguf_ctx *ctx) { return ctx->n_kv; }
int64_t     gguf_n_tensors(const gguf_ctx *ctx) { return ctx->n_tensors; }

int64_t gguf_find_key(const gguf_ctx *ctx, const char *key) {
    return hash_find(ctx->kv_hash, ctx->kv_hash_cap, key, kv_name_of, ctx);
}

const char *gguf_key(const gguf_ctx *ctx, int64_t i) {
    return i >= 0 && i < ctx->n_kv ? ctx->kv[i].key : NULL;
}

int gguf_kv_type(const gguf_ctx *ctx, int64_t i) {
    return i >= 0 && i < ctx->n_kv ? ctx->kv[i].type : -1;
}

bool gguf_kv_raw(const gguf_ctx *ctx, int64_t i, const uint8_t **val, uint64_t *size) {
    if (i < 0 || i >= ctx->n_kv) return false;
    *val = ctx->base + ctx->kv[i].val_off;
    *size = ctx->kv[i].val_size;
    return true;
}

static const gguf_kv *find_kv(const gguf_ctx *ctx, const char *key) {
    int64_t i = gguf_find_key(ctx, key);
    return i >= 0 ? &ctx->kv[i] : NULL;
}

/* An integer kv as a signed or unsigned 64-bit value; false for non-integers. */
static bool kv_int(const gguf_ctx *ctx, const gguf_kv *kv, bool *is_signed, int64_t *s, uint64_t *u) {
    const uint8_t *b = ctx->base + kv->data_off;
    *is_signed = true;
    switch (kv->type) {
    case GGUF_VT_UINT8:  *s = b[0]; break;
    case GGUF_VT_INT8:   *s = (int8_t)b[0]; break;
    case GGUF_VT_UINT16: *s = (uint16_t)(b[0] | b[1] << 8); break;
    case GGUF_VT_INT16:  *s = (int16_t)(uint16_t)(b[0] | b[1] << 8); break;
    case GGUF_VT_UINT32: *s = gguf_rd_u32(b); break;
    case GGUF_VT_INT32:  *s = (int32_t)gguf_rd_u32(b); break;
    case GGUF_VT_INT64:  *s = (int64_t)gguf_rd_u64(b); break;
    case GGUF_VT_UINT64: *is_signed = false; *u = gguf_rd_u64(b); return true;
    default: return false;
    }
    return true;
}

bool gguf_get_u32(const gguf_ctx *ctx, const char *key, uint32_t *out) {
    const gguf_kv *kv = find_kv(ctx, key);
    bool sg;
    int64_t s;
    uint64_t u;
    if (!kv || !kv_int(ctx, kv, &sg, &s, &u)) return false;
    if (sg) {
        if (s < 0 || s > UINT32_MAX) return false;
        *out = (uint32_t)s;
    } else {
        if (u > UINT32_MAX) return false;
        *out = (uint32_t)u;
    }
    return true;
}

bool gguf_get_i64(const gguf_ctx *ctx, const char *key, int64_t *out) {
    const gguf_kv *kv = find_kv(ctx, key);
    bool sg;
    int64_t s;
    uint64_t u;
    if (!kv || !kv_int(ctx, kv, &sg, &s, &u)) return false;
    if (!sg) {
        if (u > (uint64_t)INT64_MAX) return false;
        s = (int64_t)u;
    }
    *out = s;
    return true;
}

bool gguf_get_f32(const gguf_ctx *ctx, const char *key, float *out) {
    const gguf_kv *kv = find_kv(ctx, key);
    if (!kv) return false;
    const uint8_t *b = ctx->base + kv->data_off;
    if (kv->type == GGUF_VT_FLOAT32) {
        *out = hr_bits_to_f32(gguf_rd_u32(b));
        return true;
    }
    if (kv->type == GGUF_VT_FLOAT64) {
        uint64_t bits = gguf_rd_u64(b);
        double d;
        memcpy(&d, &bits, 8);
        *out = (float)d;
        return true;
    }
    return false;
}

bool gguf_get_bool(const gguf_ctx *ctx, const char *key, bool *out) {
    const gguf_kv *kv = find_kv(ctx, key);
    if (!kv || kv->type != GGUF_VT_BOOL) return false;
    *out = ctx->base[kv->data_off] != 0;
    return true;
}

bool gguf_get_str(const gguf_ctx *ctx, const char *key, gguf_str *out) {
    const gguf_kv *kv = find_kv(ctx, key);
    if (!kv || kv->type != GGUF_VT_STRING) return false;
    out->s = (const char *)ctx->base + kv->data_off;
    out->n = kv->n;
    return true;
}

bool gguf_get_cstr(const gguf_ctx *ctx, const char *key, char *buf, size_t cap) {
    gguf_str s;
    if (!cap || !gguf_get_str(ctx, key, &s)) return false;
    size_t n = s.n < cap - 1 ? (size_t)s.n : cap - 1;
    memcpy(buf, s.s, n);
    buf[n] = 0;
    return true;
}

bool gguf_get_arr(const gguf_ctx *ctx, const char *key, int *elem_type, uint64_t *n, const void **data) {
    const gguf_kv *kv = find_kv(ctx, key);
    if (!kv || kv->type != GGUF_VT_ARRAY) return false;
    if (elem_type) *elem_type = kv->elem_type;
    if (n) *n = kv->n;
    if (data) *data = ctx->base + kv->data_off;
    return true;
}

bool gguf_get_arr_str(const gguf_ctx *ctx, const char *key, uint64_t i, gguf_str *out) {
    const gguf_kv *kv = find_kv(ctx, key);
    if (!kv || kv->type != GGUF_VT_ARRAY || kv->elem_type != GGUF_VT_STRING || i >= kv->n) return false;
    uint64_t off = ctx->str_index[kv->str_first + i];
    out->n = gguf_rd_u64(ctx->base + off);
    out->s = (const char *)ctx->base + off + 8;
    return true;
}

const gguf_tensor *gguf_tensor_at(const gguf_ctx *ctx, int64_t i) {
    return i >= 0 && i < ctx->n_tensors ? &ctx->tensors[i] : NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_ctx *ctx, const char *name) {
    int64_t i = hash_find(ctx->tensor_hash, ctx->tensor_hash_cap, name, tensor_name_of, ctx);
    return i >= 0 ? &ctx->tensors[i] : NULL;
}

int64_t gguf_tensor_nelements(const gguf_tensor *t) {
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}
