/* importance: the importance file of unit groups (hearth calibrate) and HALO's loss-aware placement of
 * groups on devices (plan.h; docs/lossy.md) */
#include "plan.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define HPL_IMP_FORMAT "hearth-importance"
#define HPL_IMP_VERSION 1
#define HPL_IMP_MAX_GROUPS (1 << 20)

int hpl_importance_alloc(hpl_importance *imp, hr_err *err) {
    for (int b = 0; b < 2; b++) {
        free(imp->imp[b]);
        imp->imp[b] = NULL;
    }
    for (int b = 0; b < 2; b++)
        if (!(imp->imp[b] = calloc((size_t)HR_MAX(imp->n_layer, 1) * (size_t)HR_MAX(imp->n_groups[b], 1),
                                   sizeof(double)))) {
            hpl_importance_free(imp);
            return hr_fail(err, HR_ENOMEM, "out of memory");
        }
    return 0;
}

void hpl_importance_free(hpl_importance *imp) {
    for (int b = 0; b < 2; b++) {
        free(imp->imp[b]);
        imp->imp[b] = NULL;
    }
}

static const char *const hpl_imp_block[2] = {"attention", "ffn"};
static const char *const hpl_imp_size[2] = {"kv_heads_per_group", "neurons_per_group"};

int hpl_importance_write(const hpl_importance *imp, const char *path, hr_err *err) {
    json_t *o = json_object();
    json_object_set_new(o, "format", json_string(HPL_IMP_FORMAT));
    json_object_set_new(o, "version", json_integer(HPL_IMP_VERSION));
    json_object_set_new(o, "model", json_string(imp->model));
    json_object_set_new(o, "n_layer", json_integer(imp->n_layer));
    json_object_set_new(o, "n_embd", json_integer(imp->n_embd));
    json_object_set_new(o, "tokens", json_integer((json_int_t)imp->tokens));
    json_object_set_new(o, "metric", json_string("mean L2 norm of the group's contribution to the block output"));
    for (int b = 0; b < 2; b++) {
        json_t *blk = json_object(), *layers = json_array();
        json_object_set_new(blk, hpl_imp_size[b], json_integer(b ? imp->ff : imp->att_kv));
        json_object_set_new(blk, "groups", json_integer(imp->n_groups[b]));
        for (int il = 0; il < imp->n_layer; il++) {
            json_t *row = json_array();
            for (int32_t i = 0; i < imp->n_groups[b]; i++)
                json_array_append_new(row, json_real(imp->imp[b][(size_t)il * imp->n_groups[b] + i]));
            json_array_append_new(layers, row);
        }
        json_object_set_new(blk, "importance", layers);
        json_object_set_new(o, hpl_imp_block[b], blk);
    }
    hr_outfile out;
    int rc = hr_outfile_open(&out, path, err);
    if (!rc && json_dumpf(o, out.f, JSON_COMPACT | JSON_REAL_PRECISION(7)) == 0 && fputc('\n', out.f) != EOF)
        rc = hr_outfile_commit(&out, err);
    else if (!rc) {
        hr_outfile_abort(&out);
        rc = hr_fail(err, HR_EIO, "cannot write '%s'", path);
    }
    json_decref(o);
    return rc;
}

static int hpl_imp_int(json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *v, const char *path, hr_err *err) {
    json_t *j = json_object_get(o, key);
    if (!json_is_integer(j) || json_integer_value(j) < lo || json_integer_value(j) > hi)
        return hr_fail(err, HR_EFORMAT, "%s: '%s' missing or outside [%lld, %lld]", path, key, (long long)lo,
                       (long long)hi);
    *v = json_integer_value(j);
    return 0;
}

int hpl_importance_read(hpl_importance *imp, const char *path, hr_err *err) {
    memset(imp, 0, sizeof *imp);
    json_error_t je;
    json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!o) return hr_fail(err, HR_EFORMAT, "%s: %s (line %d)", path, je.text, je.line);
    int rc = 0;
    int64_t v = 0;
    json_t *f = json_object_get(o, "format");
    if (!json_is_string(f) || strcmp(json_string_value(f), HPL_IMP_FORMAT)) {
        rc = hr_fail(err, HR_EFORMAT, "%s: not an importance file (no \"format\": \"%s\")", path, HPL_IMP_FORMAT);
        goto done;
    }
    if ((rc = hpl_imp_int(o, "version", HPL_IMP_VERSION, HPL_IMP_VERSION, &v, path, err))) goto done;
    json_t *name = json_object_get(o, "model");
    if (json_is_string(name)) snprintf(imp->model, sizeof imp->model, "%s", json_string_value(name));
    if ((rc = hpl_imp_int(o, "n_layer", 1, 1 << 16, &v, path, err))) goto done;
    imp->n_layer = (int32_t)v;
    if ((rc = hpl_imp_int(o, "n_embd", 1, 1 << 20, &v, path, err))) goto done;
    imp->n_embd = (int32_t)v;
    if ((rc = hpl_imp_int(o, "tokens", 0, INT64_MAX, &v, path, err))) goto done;
    imp->tokens = (uint64_t)v;
    json_t *blk[2];
    for (int b = 0; b < 2; b++) {
        blk[b] = json_object_get(o, hpl_imp_block[b]);
        if (!json_is_object(blk[b])) {
            rc = hr_fail(err, HR_EFORMAT, "%s: no \"%s\" object", path, hpl_imp_block[b]);
            goto done;
        }
        if ((rc = hpl_imp_int(blk[b], hpl_imp_size[b], 1, 1 << 20, &v, path, err))) goto done;
        *(b ? &imp->ff : &imp->att_kv) = (int32_t)v;
        if ((rc = hpl_imp_int(blk[b], "groups", 1, HPL_IMP_MAX_GROUPS, &v, path, err))) goto done;
        imp->n_groups[b] = (int32_t)v;
    }
    if ((rc = hpl_importance_alloc(imp, err))) goto done;
    for (int b = 0; b < 2; b++) {
        json_t *layers = json_object_get(blk[b], "importance");
        if (!json_is_array(layers) || json_array_size(layers) != (size_t)imp->n_layer) {
            rc = hr_fail(err, HR_EFORMAT, "%s: %s.importance is not %d rows", path, hpl_imp_block[b], imp->n_layer);
            goto done;
        }
        for (int il = 0; il < imp->n_layer; il++) {
            json_t *row = json_array_get(layers, (size_t)il);
            if (!json_is_array(row) || json_array_size(row) != (size_t)imp->n_groups[b]) {
                rc = hr_fail(err, HR_EFORMAT, "%s: %s.importance[%d] is not %d numbers", path, hpl_imp_block[b], il,
                             imp->n_groups[b]);
                goto done;
            }
            for (int32_t i = 0; i < imp->n_groups[b]; i++) {
                json_t *x = json_array_get(row, (size_t)i);
                double d = json_is_number(x) ? json_number_value(x) : -1;
                if (!(d >= 0) || !isfinite(d)) {
                    rc = hr_fail(err, HR_EFORMAT, "%s: %s.importance[%d][%d] is not a finite number >= 0", path,
                                 hpl_imp_block[b], il, i);
                    goto done;
                }
                imp->imp[b][(size_t)il * imp->n_groups[b] + i] = d;
            }
        }
    }
done:
    json_decref(o);
    if (rc) hpl_importance_free(imp);
    return rc;
}

/* ---- placement ---------------------------------------------------------------------------------------- */

typedef struct hpl_key { double v; int32_t i; } hpl_key;

/* descending value, then ascending index: a total order, so the result does not depend on qsort */
static int hpl_key_desc(const void *a, const void *b) {
    const hpl_key *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

int hpl_place_groups(const double *importance, int32_t n_groups, const double *loss, const int32_t *count, int n_dev,
                     int32_t *assign, hr_err *err) {
    if (n_groups < 0 || n_dev < 1 || n_dev > HC_MAX_DEVICES)
        return hr_fail(err, HR_EINVAL, "placing %d groups on %d devices", n_groups, n_dev);
    int64_t sum = 0;
    for (int d = 0; d < n_dev; d++) {
        if (count[d] < 0 || !(loss[d] >= 0 && loss[d] <= 1))
            return hr_fail(err, HR_EINVAL, "device %d: %d groups, loss rate %g", d, count[d], loss[d]);
        sum += count[d];
    }
    if (sum != n_groups) return hr_fail(err, HR_EINVAL, "the devices' counts add up to %lld, not %d groups",
                                        (long long)sum, n_groups);
    hpl_key *g = malloc(sizeof *g * (size_t)HR_MAX(n_groups, 1));
    if (!g) return hr_fail(err, HR_ENOMEM, "out of memory");
    for (int32_t i = 0; i < n_groups; i++) {
        if (!isfinite(importance[i])) {
            free(g);
            return hr_fail(err, HR_EINVAL, "group %d's importance is not finite", i);
        }
        g[i] = (hpl_key){importance[i], i};
    }
    qsort(g, (size_t)n_groups, sizeof *g, hpl_key_desc);
    hpl_key dev[HC_MAX_DEVICES];
    for (int d = 0; d < n_dev; d++) dev[d] = (hpl_key){-loss[d], d}; /* descending -loss: lowest loss first */
    qsort(dev, (size_t)n_dev, sizeof *dev, hpl_key_desc);
    int32_t next = 0;
    for (int k = 0; k < n_dev; k++)
        for (int32_t j = 0; j < count[dev[k].i]; j++) assign[g[next++].i] = dev[k].i;
    free(g);
    return 0;
}

int hpl_group_counts(const double *weights, int n_dev, int32_t n_groups, int32_t *count, hr_err *err) {
    double total = 0;
    if (n_dev < 1 || n_dev > HC_MAX_DEVICES || n_groups < 0)
        return hr_fail(err, HR_EINVAL, "%d groups on %d devices", n_groups, n_dev);
    for (int d = 0; d < n_dev; d++) {
        if (!(weights[d] >= 0) || !isfinite(weights[d])) return hr_fail(err, HR_EINVAL, "device %d's weight", d);
        total += weights[d];
    }
    if (!(total > 0)) return hr_fail(err, HR_EINVAL, "the weights add up to 0");
    hpl_key rem[HC_MAX_DEVICES];
    int32_t given = 0;
    for (int d = 0; d < n_dev; d++) {
        const double want = n_groups * weights[d] / total;
        count[d] = (int32_t)floor(want);
        given += count[d];
        rem[d] = (hpl_key){want - count[d], d};
    }
    qsort(rem, (size_t)n_dev, sizeof *rem, hpl_key_desc);
    for (int k = 0; given < n_groups; k = (k + 1) % n_dev, given++) count[rem[k].i]++;
    return 0;
}
