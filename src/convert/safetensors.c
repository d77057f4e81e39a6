/* Reading safetensors: an 8-byte little-endian header length, a JSON header naming each tensor's
   dtype, shape and [begin, end) byte range in the data that follows. The files are mapped, not
   read: a converter touches each weight once, in order, and the page cache does the rest. Every
   number of the header is checked against the file before any byte of the data is used. */
#include "convert-impl.h"

#include "quant/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum { HCV_MAX_HEADER = 100 << 20 };  /* safetensors' own limit */

json_t *hcv_json_load(const char *dir, const char *name, bool optional, size_t flags, hr_err *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (optional && access(path, F_OK) != 0 && errno == ENOENT) return NULL;
    json_error_t je;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES | flags, &je);
    if (!j) hr_fail(err, HR_EFORMAT, "%s: %s (line %d)", path, je.text, je.line);
    return j;
}

static int dtype_of(const char *s) {
    return !strcmp(s, "F32") ? HQ_TYPE_F32 : !strcmp(s, "F16") ? HQ_TYPE_F16 : !strcmp(s, "BF16") ? HQ_TYPE_BF16 : -1;
}

static int add_tensor(hcv_st *st, const char *path, const char *name, json_t *v, const uint8_t *data,
                      uint64_t data_size, int file, hr_err *err) {
    json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"), *offs = json_object_get(v, "data_offsets");
    if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs) || json_array_size(offs) != 2)
        return hr_fail(err, HR_EFORMAT, "%s: tensor '%s': the header lacks dtype, shape or data_offsets", path, name);
    int dtype = dtype_of(json_string_value(dt));
    if (dtype < 0)
        return hr_fail(err, HR_EUNSUPPORTED, "%s: tensor '%s' is %s; only F32, F16 and BF16 weights can be converted",
                       path, name, json_string_value(dt));
    size_t nd = json_array_size(shape);
    if (nd > 4) return hr_fail(err, HR_EUNSUPPORTED, "%s: tensor '%s' has %zu dimensions", path, name, nd);
    hcv_st_tensor t = {.dtype = dtype, .n_dims = (int)nd, .file = file};
    uint64_t n = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0 || json_integer_value(d) > (1LL << 40))
            return hr_fail(err, HR_EFORMAT, "%s: tensor '%s' has a bad shape", path, name);
        t.shape[i] = json_integer_value(d);
        n *= (uint64_t)t.shape[i];
        if (n > (1ULL << 40)) return hr_fail(err, HR_EFORMAT, "%s: tensor '%s' is impossibly large", path, name);
    }
    json_t *b = json_array_get(offs, 0), *e = json_array_get(offs, 1);
    if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 || json_integer_value(e) < json_integer_value(b))
        return hr_fail(err, HR_EFORMAT, "%s: tensor '%s' has bad data_offsets", path, name);
    uint64_t begin = (uint64_t)json_integer_value(b), end = (uint64_t)json_integer_value(e);
    t.nbytes = n * hq_get_traits(dtype)->type_size;
    if (end - begin != t.nbytes)
        return hr_fail(err, HR_EFORMAT, "%s: tensor '%s': data_offsets span %llu bytes, its shape needs %llu", path,
                       name, (unsigned long long)(end - begin), (unsigned long long)t.nbytes);
    if (end > data_size)
        return hr_fail(err, HR_EFORMAT, "%s is truncated: tensor '%s' ends at byte %llu of the data, the file holds %llu",
                       path, name, (unsigned long long)end, (unsigned long long)data_size);
    t.data = data + begin;
    if (st->n == st->cap) {
        size_t cap = st->cap ? st->cap * 2 : 64;
        hcv_st_tensor *nt = realloc(st->t, cap * sizeof *nt);
        if (!nt) return hr_fail(err, HR_ENOMEM, "out of memory");
        st->t = nt;
        st->cap = cap;
    }
    for (size_t i = 0; i < st->n; i++)
        if (!strcmp(st->t[i].name, name))
            return hr_fail(err, HR_EFORMAT, "tensor '%s' is in %s and in %s", name, st->files[st->t[i].file].path, path);
    if (!(t.name = strdup(name))) return hr_fail(err, HR_ENOMEM, "out of memory");
    st->t[st->n++] = t;
    return 0;
}

/* maps one safetensors file and adds its tensors */
static int open_file(hcv_st *st, const char *dir, const char *name, hr_err *err) {
    struct hcv_st_file *nf = realloc(st->files, (size_t)(st->n_files + 1) * sizeof *nf);
    if (!nf) return hr_fail(err, HR_ENOMEM, "out of memory");
    st->files = nf;
    struct hcv_st_file *f = &st->files[st->n_files];
    *f = (struct hcv_st_file){0};
    size_t plen = strlen(dir) + strlen(name) + 2;
    if (!(f->path = malloc(plen))) return hr_fail(err, HR_ENOMEM, "out of memory");
    snprintf(f->path, plen, "%s/%s", dir, name);
    int file = st->n_files++;
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return hr_fail(err, HR_EIO, "cannot open %s: %s", f->path, strerror(errno));
    struct stat sb;
    int rc = 0;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) rc = hr_fail(err, HR_EIO, "%s is not a regular file", f->path);
    else if (sb.st_size < 8) rc = hr_fail(err, HR_EFORMAT, "%s is truncated: %lld bytes, no safetensors header", f->path, (long long)sb.st_size);
    if (!rc) {
        f->map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            f->map = NULL;
            rc = hr_fail(err, HR_EIO, "cannot map %s: %s", f->path, strerror(errno));
        } else {
            f->size = (size_t)sb.st_size;
        }
    }
    close(fd);
    if (rc) return rc;
    const uint8_t *p = f->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | p[i];
    if (hlen > HCV_MAX_HEADER || hlen > f->size - 8)
        return hr_fail(err, HR_EFORMAT, "%s is truncated or not safetensors: a %llu-byte header in a %zu-byte file",
                       f->path, (unsigned long long)hlen, f->size);
    json_error_t je;
    json_t *h = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(h)) {
        json_decref(h);
        return hr_fail(err, HR_EFORMAT, "%s: the safetensors header is not a JSON object (%s)", f->path, je.text);
    }
    const char *key;
    json_t *v;
    json_object_foreach(h, key, v) {
        if (!strcmp(key, "__metadata__")) continue;
        if ((rc = add_tensor(st, f->path, key, v, p + 8 + hlen, f->size - 8 - hlen, file, err))) break;
    }
    json_decref(h);
    return rc;
}

/* a shard's name from the index: a plain file name beside the index, nothing else */
static bool plain_name(const char *s) {
    return s[0] && s[0] != '.' && !strchr(s, '/');
}

int hcv_st_open_dir(hcv_st *st, const char *dir, hr_err *err) {
    *st = (hcv_st){0};
    json_t *index = hcv_json_load(dir, "model.safetensors.index.json", true, 0, err);
    if (!index && err->code) return err->code;
    if (!index) {
        char path[4096];
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (access(path, F_OK) != 0) {
            snprintf(path, sizeof path, "%s/pytorch_model.bin", dir);
            return hr_fail(err, HR_ENOTFOUND, "%s has no model.safetensors or model.safetensors.index.json%s", dir,
                           access(path, F_OK) == 0 ? " (PyTorch .bin checkpoints are not read: only safetensors)" : "");
        }
        return open_file(st, dir, "model.safetensors", err);
    }
    int rc = 0;
    json_t *map = json_object_get(index, "weight_map");
    if (!json_is_object(map)) rc = hr_fail(err, HR_EFORMAT, "%s/model.safetensors.index.json has no weight_map", dir);
    const char *key;
    json_t *v;
    /* every shard once, in the order the index first names them */
    json_object_foreach(map, key, v) {
        if (rc) break;
        if (!json_is_string(v) || !plain_name(json_string_value(v))) {
            rc = hr_fail(err, HR_EFORMAT, "model.safetensors.index.json: tensor '%s' names a bad file", key);
            break;
        }
        bool seen = false;
        for (int i = 0; i < st->n_files && !seen; i++) {
            const char *base = strrchr(st->files[i].path, '/') + 1;
            seen = !strcmp(base, json_string_value(v));
        }
        if (!seen) rc = open_file(st, dir, json_string_value(v), err);
    }
    /* and every tensor the index names is in the shard it names */
    json_object_foreach(map, key, v) {
        if (rc) break;
        const hcv_st_tensor *t = hcv_st_find(st, key);
        if (!t) rc = hr_fail(err, HR_EFORMAT, "tensor '%s' is missing: the index puts it in %s, which lacks it", key,
                             json_string_value(v));
        else if (strcmp(strrchr(st->files[t->file].path, '/') + 1, json_string_value(v)))
            rc = hr_fail(err, HR_EFORMAT, "tensor '%s' is in %s, not in %s as the index says", key,
                         st->files[t->file].path, json_string_value(v));
    }
    json_decref(index);
    return rc;
}

void hcv_st_close(hcv_st *st) {
    for (size_t i = 0; i < st->n; i++) free(st->t[i].name);
    for (int i = 0; i < st->n_files; i++) {
        if (st->files[i].map) munmap(st->files[i].map, st->files[i].size);
        free(st->files[i].path);
    }
    free(st->t);
    free(st->files);
    *st = (hcv_st){0};
}

const hcv_st_tensor *hcv_st_find(const hcv_st *st, const char *name) {
    for (size_t i = 0; i < st->n; i++)
        if (!strcmp(st->t[i].name, name)) return &st->t[i];
    return NULL;
}
