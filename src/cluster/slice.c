/* cluster/slice: which bytes of the model each device holds, their hashes, the cache key, and the
   slice files — see cluster.h ("Slice cache") */
#define _GNU_SOURCE
#include "cluster-impl.h"

#include "quant/quant.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

typedef struct hc_slist {
    hc_slice *v;
    int n, cap;
    bool oom;
} hc_slist;

/* appends the slice of t named blk.<il>.<suffix> (il < 0: just suffix) */
static hc_slice *hc_slist_add(hc_slist *l, const hm_tensor *t, int cut, int64_t a, int64_t b, const char *suffix, int il,
                              int n_dims) {
    if (l->oom) return NULL;
    if (l->n == l->cap) {
        int nc = l->cap ? 2 * l->cap : 64;
        hc_slice *nv = realloc(l->v, (size_t)nc * sizeof *nv);
        if (!nv) { l->oom = true; return NULL; }
        l->v = nv;
        l->cap = nc;
    }
    hc_slice *s = &l->v[l->n++];
    memset(s, 0, sizeof *s);
    if (il < 0) snprintf(s->name, sizeof s->name, "%s", suffix);
    else snprintf(s->name, sizeof s->name, "blk.%d.%s", il, suffix);
    s->type = t->type;
    s->src = t;
    s->cut = cut;
    s->a = a;
    s->b = b;
    s->n_dims = n_dims;
    s->ne[0] = t->ne0;
    s->ne[1] = t->ne1;
    s->ne[2] = s->ne[3] = 1;
    if (cut == HC_CUT_ROWS) s->ne[1] = b - a;
    if (cut == HC_CUT_COLS) s->ne[0] = b - a;
    if (n_dims == 1) s->ne[1] = 1;
    s->size = (uint64_t)hq_row_size(t->type, s->ne[0]) * (uint64_t)s->ne[1];
    return s;
}

/* the slice just added takes positions [a, b) of the layer's group order, grp rows/columns a group */
static void hc_slist_perm(hc_slist *l, const int32_t *perm, int64_t grp) {
    if (l->oom || !perm) return;
    l->v[l->n - 1].perm = perm;
    l->v[l->n - 1].grp = grp;
}

int hc_slices_make(const hm_model *m, const hc_share *sh, const hc_order *ord, const uint8_t *layers, bool head,
                   hc_slice **out, int *n_out, hr_err *err) {
    const hm_hparams *hp = &m->hp;
    hc_slist l = {0};
    int64_t hd = hp->head_dim, unit = (int64_t)(hp->n_head / hp->n_head_kv) * hd;
    /* with a placement: KV heads and neurons per group, from the group counts */
    int64_t ga = ord ? hp->n_head_kv / ord->n_groups[0] : 0, gf = ord ? hp->n_ff / ord->n_groups[1] : 0;
    if (ord && (ord->n_layer != hp->n_layer || ga * ord->n_groups[0] != hp->n_head_kv || gf * ord->n_groups[1] != hp->n_ff))
        return hr_fail(err, HR_EINVAL, "a placement of %d layers, %d + %d groups does not fit this model", ord->n_layer,
                       ord->n_groups[0], ord->n_groups[1]);
    int64_t q0 = sh->kv_begin * unit, q1 = sh->kv_end * unit, k0 = sh->kv_begin * hd, k1 = sh->kv_end * hd;
    bool att = sh->kv_end > sh->kv_begin, ffn = sh->ff_end > sh->ff_begin;
    if (head) hc_slist_add(&l, &m->tok_embd, HC_CUT_WHOLE, 0, 0, "token_embd.weight", -1, 2);
    if (m->rope_freqs.data) hc_slist_add(&l, &m->rope_freqs, HC_CUT_WHOLE, 0, 0, "rope_freqs.weight", -1, 1);
    for (int il = 0; il < hp->n_layer; il++) {
        if (layers && !layers[il]) continue;
        const hm_layer *L = &m->layers[il];
        const int32_t *pa = ord ? ord->order[0] + (size_t)il * ord->n_groups[0] : NULL;
        const int32_t *pf = ord ? ord->order[1] + (size_t)il * ord->n_groups[1] : NULL;
        hc_slist_add(&l, &L->attn_norm, HC_CUT_WHOLE, 0, 0, "attn_norm.weight", il, 1);
        if (att) {
            hc_slist_add(&l, &L->wq, HC_CUT_ROWS, q0, q1, "attn_q.weight", il, 2);
            hc_slist_perm(&l, pa, ga * unit);
            hc_slist_add(&l, &L->wk, HC_CUT_ROWS, k0, k1, "attn_k.weight", il, 2);
            hc_slist_perm(&l, pa, ga * hd);
            hc_slist_add(&l, &L->wv, HC_CUT_ROWS, k0, k1, "attn_v.weight", il, 2);
            hc_slist_perm(&l, pa, ga * hd);
            if (L->bq.data) {
                /* a bias is one row: its slice is a column range */
                hc_slist_add(&l, &L->bq, HC_CUT_COLS, q0, q1, "attn_q.bias", il, 1);
                hc_slist_perm(&l, pa, ga * unit);
                hc_slist_add(&l, &L->bk, HC_CUT_COLS, k0, k1, "attn_k.bias", il, 1);
                hc_slist_perm(&l, pa, ga * hd);
                hc_slist_add(&l, &L->bv, HC_CUT_COLS, k0, k1, "attn_v.bias", il, 1);
                hc_slist_perm(&l, pa, ga * hd);
            }
            if (L->q_norm.data) {
                hc_slist_add(&l, &L->q_norm, HC_CUT_WHOLE, 0, 0, "attn_q_norm.weight", il, 1);
                hc_slist_add(&l, &L->k_norm, HC_CUT_WHOLE, 0, 0, "attn_k_norm.weight", il, 1);
            }
            hc_slist_add(&l, &L->wo, HC_CUT_COLS, q0, q1, "attn_output.weight", il, 2);
            hc_slist_perm(&l, pa, ga * unit);
        }
        hc_slist_add(&l, &L->ffn_norm, HC_CUT_WHOLE, 0, 0, "ffn_norm.weight", il, 1);
        if (ffn) {
            hc_slist_add(&l, &L->w_gate, HC_CUT_ROWS, sh->ff_begin, sh->ff_end, "ffn_gate.weight", il, 2);
            hc_slist_perm(&l, pf, gf);
            hc_slist_add(&l, &L->w_up, HC_CUT_ROWS, sh->ff_begin, sh->ff_end, "ffn_up.weight", il, 2);
            hc_slist_perm(&l, pf, gf);
            hc_slist_add(&l, &L->w_down, HC_CUT_COLS, sh->ff_begin, sh->ff_end, "ffn_down.weight", il, 2);
            hc_slist_perm(&l, pf, gf);
        }
    }
    if (head) {
        hc_slist_add(&l, &m->output_norm, HC_CUT_WHOLE, 0, 0, "output_norm.weight", -1, 1);
        if (!m->hp.tied_output) hc_slist_add(&l, &m->output, HC_CUT_WHOLE, 0, 0, "output.weight", -1, 2);
    }
    if (l.oom) {
        free(l.v);
        return hr_fail(err, HR_ENOMEM, "out of memory listing slices");
    }
    for (int i = 0; i < l.n; i++) {
        const hc_slice *s = &l.v[i];
        const hq_traits *tr = hq_get_traits(s->type);
        if (s->cut == HC_CUT_COLS && (s->a % tr->blck_size || s->b % tr->blck_size || (s->perm && s->grp % tr->blck_size))) {
            free(l.v);
            return hr_fail(err, HR_EINVAL, "%s: columns [%lld, %lld) are not on %s block boundaries", s->name,
                           (long long)s->a, (long long)s->b, tr->name);
        }
    }
    *out = l.v;
    *n_out = l.n;
    return 0;
}

bool hc_slice_gathers(const hc_slice *s) { return s->cut == HC_CUT_COLS || (s->cut == HC_CUT_ROWS && s->perm); }

/* the model's row (HC_CUT_ROWS) or column (HC_CUT_COLS) of the slice's i-th one */
static int64_t hc_slice_src(const hc_slice *s, int64_t i) {
    int64_t at = s->a + i;
    return s->perm ? (int64_t)s->perm[at / s->grp] * s->grp + at % s->grp : at;
}

const void *hc_slice_bytes(const hc_slice *s, uint64_t off, size_t len, void *tmp) {
    const hm_tensor *t = s->src;
    const uint8_t *base = t->map; /* the file's bytes, whatever layout the model loaded them in */
    if (s->cut == HC_CUT_WHOLE) return base + off;
    uint8_t *d = tmp;
    size_t done = 0;
    if (s->cut == HC_CUT_ROWS) {
        if (!s->perm) return base + (size_t)s->a * t->row_bytes + off;
        /* a placement's rows: whole rows of the model's, a group's lying together */
        while (done < len) {
            uint64_t at = off + done;
            size_t r = (size_t)(at / t->row_bytes), in = (size_t)(at % t->row_bytes);
            size_t take = HR_MIN(t->row_bytes - in, len - done);
            memcpy(d + done, base + (size_t)hc_slice_src(s, (int64_t)r) * t->row_bytes + in, take);
            done += take;
        }
        return tmp;
    }
    /* columns: in every row, one run of whole blocks (a range), or one per group (a placement) */
    const hq_traits *tr = hq_get_traits(t->type);
    size_t seg = (size_t)((s->b - s->a) / tr->blck_size) * tr->type_size;
    size_t run = s->perm ? (size_t)(s->grp / tr->blck_size) * tr->type_size : seg;
    int64_t run_cols = s->perm ? s->grp : s->b - s->a;
    while (done < len) {
        uint64_t at = off + done;
        size_t r = (size_t)(at / seg), in = (size_t)(at % seg), j = in / run, in_run = in % run;
        size_t col0 = (size_t)(hc_slice_src(s, (int64_t)j * run_cols) / tr->blck_size) * tr->type_size;
        size_t take = HR_MIN(run - in_run, len - done);
        memcpy(d + done, base + r * t->row_bytes + col0 + in_run, take);
        done += take;
    }
    return tmp;
}

void hc_slices_hash(hc_slice *v, int n) {
    for (int i = 0; i < n; i++) {
        hc_slice *s = &v[i];
        if (!hc_slice_gathers(s)) {
            s->hash = hr_hash64(hc_slice_bytes(s, 0, (size_t)s->size, NULL), (size_t)s->size, 0);
            continue;
        }
        if (!s->perm) {
            /* a column range: one segment per row, streamed through the hasher without a copy */
            const hm_tensor *t = s->src;
            const hq_traits *tr = hq_get_traits(t->type);
            size_t seg = (size_t)((s->b - s->a) / tr->blck_size) * tr->type_size;
            size_t col0 = (size_t)(s->a / tr->blck_size) * tr->type_size;
            hr_hasher h;
            hr_hasher_init(&h, 0);
            for (int64_t r = 0; r < t->ne1; r++)
                hr_hasher_update(&h, (const uint8_t *)t->map + (size_t)r * t->row_bytes + col0, seg);
            s->hash = hr_hasher_final(&h);
            continue;
        }
        /* a placement's: gathered a row at a time and streamed through the hasher (the one-shot value) */
        size_t row = (size_t)(s->size / (uint64_t)s->ne[1]);
        uint8_t *tmp = malloc(HR_MAX(row, 1));
        hr_hasher h;
        hr_hasher_init(&h, 0);
        if (!tmp) { /* cannot happen for a row of a mapped tensor; a wrong hash only costs a resend */
            s->hash = 0;
            continue;
        }
        for (int64_t r = 0; r < s->ne[1]; r++) hr_hasher_update(&h, hc_slice_bytes(s, (uint64_t)r * row, row, tmp), row);
        s->hash = hr_hasher_final(&h);
        free(tmp);
    }
}

static void hc_put64(uint8_t *b, size_t *n, uint64_t v) {
    for (int i = 0; i < 8; i++) b[(*n)++] = (uint8_t)(v >> (8 * i));
}

uint64_t hc_slice_key(uint64_t model_hash, const hc_share *sh, const hc_slice *v, int n, bool all_listed) {
    hr_hasher h;
    hr_hasher_init(&h, model_hash);
    uint8_t b[128];
    size_t k = 0;
    hc_put64(b, &k, (uint64_t)(uint32_t)sh->kv_begin << 32 | (uint32_t)sh->kv_end);
    hc_put64(b, &k, (uint64_t)(uint32_t)sh->ff_begin << 32 | (uint32_t)sh->ff_end);
    hc_put64(b, &k, (uint64_t)n);
    if (sh->placement) hc_put64(b, &k, sh->placement);   /* a contiguous share's key is unchanged */
    if (all_listed) hc_put64(b, &k, 0x4c41594552534c53ull);  /* every other key is unchanged */
    hr_hasher_update(&h, b, k);
    for (int i = 0; i < n; i++) {
        const hc_slice *s = &v[i];
        hr_hasher_update(&h, s->name, strlen(s->name) + 1);
        k = 0;
        hc_put64(b, &k, (uint64_t)s->type << 32 | (uint32_t)s->n_dims);
        for (int d = 0; d < 4; d++) hc_put64(b, &k, (uint64_t)s->ne[d]);
        hc_put64(b, &k, s->size);
        hc_put64(b, &k, s->hash);
        hr_hasher_update(&h, b, k);
    }
    return hr_hasher_final(&h);
}

/* ---- slice files ---- */

int hc_slice_path(const char *cache, uint64_t model_hash, uint64_t key, char *dir, size_t dir_cap, char *path,
                  size_t cap, hr_err *err) {
    if ((size_t)snprintf(dir, dir_cap, "%s/%016llx", cache, (unsigned long long)model_hash) >= dir_cap)
        return hr_fail(err, HR_ERANGE, "cache path too long");
    int rc = hr_mkdirs(dir, 0755, err);
    if (rc) return rc;
    if ((size_t)snprintf(path, cap, "%s/%016llx.gguf", dir, (unsigned long long)key) >= cap)
        return hr_fail(err, HR_ERANGE, "cache path too long");
    return 0;
}

/* the hyper-parameters and hearth.slice.* keys (docs/model.md, "Slice files"); nonzero: out of memory */
static int hc_slice_meta_put(gguf_writer *gw, const hc_slice_meta *mt, const uint64_t *hashes, int n) {
    hm_kv_io io = hm_kv_gguf_writer(gw, HM_KV_SLICE);
    int rc = gguf_writer_set_str(gw, "general.architecture", mt->hp->arch_name);
    hr_err e = {0};
    if (rc || (rc = hm_hparams_to_kv(mt->hp, &io, &e))) return rc;
    const hc_share *sh = &mt->share;
    rc |= gguf_writer_set_u32(gw, "hearth.slice.n_head_kv", (uint32_t)(sh->kv_end - sh->kv_begin));
    rc |= gguf_writer_set_u32(gw, "hearth.slice.n_ff", (uint32_t)(sh->ff_end - sh->ff_begin));
    rc |= gguf_writer_set_u32(gw, "hearth.slice.kv_begin", (uint32_t)sh->kv_begin);
    rc |= gguf_writer_set_u32(gw, "hearth.slice.ff_begin", (uint32_t)sh->ff_begin);
    rc |= gguf_writer_set_u64(gw, "hearth.slice.model_hash", mt->model_hash);
    if (sh->placement) rc |= gguf_writer_set_arr(gw, "hearth.slice.placement", GGUF_VT_UINT64, &sh->placement, 1);
    rc |= gguf_writer_set_arr(gw, "hearth.slice.hashes", GGUF_VT_UINT64, hashes, (uint64_t)n);
    if (mt->head) rc |= gguf_writer_set_bool(gw, "hearth.slice.head", true);
    if (mt->layers) {
        uint32_t ids[HC_PP_MAX_LAYERS];
        int k = 0;
        for (int il = 0; il < mt->hp->n_layer && il < HC_PP_MAX_LAYERS; il++)
            if (mt->layers[il]) ids[k++] = (uint32_t)il;
        rc |= gguf_writer_set_arr(gw, "hearth.slice.layers", GGUF_VT_UINT32, ids, (uint64_t)k);
    }
    return rc;
}

/* ---- the cache's bound (docs/model.md, "The slice cache's bound") ---- */

uint64_t hc_slice_file_bytes(const hc_slice *dir, int n) {
    uint64_t b = 64 << 10;  /* the metadata: hyper-parameters, hearth.slice.* and the tensor infos */
    for (int i = 0; i < n; i++) b += (dir[i].size + 31) / 32 * 32 + 8 + 128;
    return b;
}

/* b as "12.3 MiB" (KiB below one MiB), for messages */
typedef struct hc_sz { char s[32]; } hc_sz;
static hc_sz hc_size(uint64_t b) {
    hc_sz z;
    if (b < (1 << 20)) snprintf(z.s, sizeof z.s, "%.1f KiB", (double)b / 1024);
    else snprintf(z.s, sizeof z.s, "%.1f MiB", (double)b / (1 << 20));
    return z;
}

uint64_t hc_disk_margin(uint64_t fs_bytes) { return HR_MIN((uint64_t)1 << 30, fs_bytes / 20); }

int hc_disk_room(const char *dir, uint64_t need, hr_err *err) {
    struct statvfs st;
    if (statvfs(dir, &st)) return 0;  /* nothing to go by: the write itself will tell */
    uint64_t avail = (uint64_t)st.f_bavail * st.f_frsize, total = (uint64_t)st.f_blocks * st.f_frsize;
    uint64_t margin = hc_disk_margin(total);
    if (avail >= margin && avail - margin >= need) return 0;
    return hr_fail(err, HR_ERANGE, "no room on the disk of %s for a %s slice file: %s free, of which %s are kept "
                   "free (5%% of the disk, at most 1 GiB)", dir, hc_size(need).s, hc_size(avail).s, hc_size(margin).s);
}

int hc_cache_hold(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0 && flock(fd, LOCK_SH | LOCK_NB)) {
        close(fd);
        fd = -1;
    }
    return fd;
}

void hc_cache_touch(const char *path) {
    struct timespec ts[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_nsec = UTIME_NOW}};
    (void)utimensat(AT_FDCWD, path, ts, 0);
}

typedef struct hc_cfile { char path[PATH_MAX]; uint64_t bytes; struct timespec used; } hc_cfile;

/* every slice file of the cache (cache/MODEL/KEY.gguf) */
static int hc_cache_list(const char *cache, hc_cfile **out, int *n_out) {
    hc_cfile *v = NULL;
    int n = 0, cap = 0;
    DIR *d = opendir(cache);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char sub[PATH_MAX];
        if ((size_t)snprintf(sub, sizeof sub, "%s/%s", cache, de->d_name) >= sizeof sub) continue;
        DIR *e = opendir(sub);
        struct dirent *fe;
        while (e && (fe = readdir(e))) {
            size_t k = strlen(fe->d_name);
            if (k < 6 || strcmp(fe->d_name + k - 5, ".gguf")) continue;
            hc_cfile f;
            struct stat st;
            if ((size_t)snprintf(f.path, sizeof f.path, "%s/%s", sub, fe->d_name) >= sizeof f.path ||
                stat(f.path, &st) || !S_ISREG(st.st_mode))
                continue;
            f.bytes = (uint64_t)st.st_blocks * 512;
            f.used = st.st_mtim;
            if (n == cap) {
                hc_cfile *nv = realloc(v, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *nv);
                if (!nv) { closedir(e); closedir(d); free(v); return HR_ENOMEM; }
                v = nv;
            }
            v[n++] = f;
        }
        if (e) closedir(e);
    }
    if (d) closedir(d);
    *out = v;
    *n_out = n;
    return 0;
}

static int hc_cfile_older(const void *a, const void *b) {
    const struct timespec *x = &((const hc_cfile *)a)->used, *y = &((const hc_cfile *)b)->used;
    if (x->tv_sec != y->tv_sec) return x->tv_sec < y->tv_sec ? -1 : 1;
    return x->tv_nsec < y->tv_nsec ? -1 : x->tv_nsec > y->tv_nsec;
}

/* removes f unless a session holds it (a shared flock: hc_cache_hold); true if removed */
static bool hc_cache_evict(const hc_cfile *f) {
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool gone = flock(fd, LOCK_EX | LOCK_NB) == 0 && unlink(f->path) == 0;
    close(fd);
    if (gone) HR_LOGI("slice cache: evicted %s (%s, least recently used)", f->path, hc_size(f->bytes).s);
    return gone;
}

int hc_cache_make_room(const char *cache, uint64_t need, uint64_t max_bytes, const char *const *keep, int n_keep,
                       uint64_t *evicted, hr_err *err) {
    if (evicted) *evicted = 0;
    if (max_bytes && need > max_bytes)
        return hr_fail(err, HR_ERANGE, "the share's slice file needs %s, more than the cache may hold (--cache-max %s)",
                       hc_size(need).s, hc_size(max_bytes).s);
    hc_cfile *v;
    int n, rc = hc_cache_list(cache, &v, &n);
    if (rc) return hr_fail(err, rc, "out of memory listing the slice cache");
    if (n > 1) qsort(v, (size_t)n, sizeof *v, hc_cfile_older);  /* v is NULL when the cache is empty */
    uint64_t total = 0;
    for (int i = 0; i < n; i++) total += v[i].bytes;
    hr_err room = {0};
    for (int i = 0;; i++) {
        bool over = max_bytes && total + need > max_bytes;
        if (!over && hc_disk_room(cache, need, &room) == 0) break;
        if (i == n) {
            free(v);
            if (over)
                return hr_fail(err, HR_ERANGE, "the slice cache cannot make room for %s under --cache-max %s: the rest "
                               "is in use", hc_size(need).s, hc_size(max_bytes).s);
            *err = room;
            return room.code;
        }
        bool kept = false;
        for (int k = 0; k < n_keep && !kept; k++) kept = keep[k] && !strcmp(keep[k], v[i].path);
        if (kept || !hc_cache_evict(&v[i])) continue;
        total -= v[i].bytes;
        if (evicted) *evicted += v[i].bytes;
    }
    free(v);
    return 0;
}

uint64_t hc_cache_default_max(const char *cache, uint64_t model_bytes) {
    uint64_t max = 2 * model_bytes;
    struct statvfs st;
    hc_cfile *v;
    int n;
    if (statvfs(cache, &st) || hc_cache_list(cache, &v, &n)) return max;
    uint64_t have = (uint64_t)st.f_bavail * st.f_frsize, margin = hc_disk_margin((uint64_t)st.f_blocks * st.f_frsize);
    for (int i = 0; i < n; i++) have += v[i].bytes;
    free(v);
    return HR_MIN(max, have > margin ? (have - margin) / 2 : 0);
}

int hc_slice_file_write(const char *path, const hc_slice_meta *mt, const hc_slice *dir, int n, hc_slice_src_fn src,
                        void *user, hr_err *err) {
    uint64_t *hashes = malloc((size_t)n * sizeof *hashes);
    gguf_writer *gw = gguf_writer_create();
    char part[PATH_MAX + 64];
    int rc = 0;
    if (!hashes || !gw) { rc = hr_fail(err, HR_ENOMEM, "out of memory for the slice file"); goto done; }
    for (int i = 0; i < n; i++) hashes[i] = dir[i].hash;
    if (hc_slice_meta_put(gw, mt, hashes, n)) { rc = hr_fail(err, HR_ENOMEM, "out of memory for the slice file"); goto done; }
    for (int i = 0; i < n; i++)
        if ((rc = gguf_writer_add_tensor(gw, dir[i].name, dir[i].type, dir[i].n_dims, dir[i].ne, err))) goto done;
    /* never fill the disk: a file that would not leave the margin free is not begun */
    char folder[PATH_MAX];
    snprintf(folder, sizeof folder, "%s", path);
    char *slash = strrchr(folder, '/');
    if (slash) *slash = 0;
    if ((rc = hc_disk_room(slash ? folder : ".", hc_slice_file_bytes(dir, n), err))) goto done;
    /* a name of our own: two processes sharing a cache may write the same file at once */
    snprintf(part, sizeof part, "%s.%ld.%llx", path, (long)getpid(), (unsigned long long)hr_time_ns());
    if ((rc = gguf_writer_begin(gw, part, false, err))) goto done;
    for (int i = 0; i < n; i++) {
        const void *bytes = NULL;
        if ((rc = src(user, i, &bytes, err)) || (rc = gguf_writer_write_data(gw, bytes, (size_t)dir[i].size, err)))
            goto done;
    }
    if ((rc = gguf_writer_finish(gw, err))) goto done;
    if (rename(part, path)) {
        rc = hr_fail(err, HR_EIO, "rename to %s: %s", path, strerror(errno));
        unlink(part);
    }
done:
    gguf_writer_free(gw);
    free(hashes);
    return rc;
}

int hc_slice_file_check(const gguf_ctx *g, const hc_slice *dir, int n) {
    for (int i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_find_tensor(g, dir[i].name);
        if (!t || t->nbytes != dir[i].size || hr_hash64(t->data, (size_t)t->nbytes, 0) != dir[i].hash) return i;
    }
    return -1;
}

void hc_drop_pages(const gguf_ctx *g) {
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        if (!t->nbytes) continue;
        lo = HR_MIN(lo, (uintptr_t)t->data);
        hi = HR_MAX(hi, (uintptr_t)t->data + t->nbytes);
    }
    const uintptr_t pg = sysconf(_SC_PAGESIZE) > 0 ? (uintptr_t)sysconf(_SC_PAGESIZE) : 4096;
    lo = (lo + pg - 1) / pg * pg;
    hi = hi / pg * pg;
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);   /* advice: the bytes stay the file's */
}

int hc_send(const hc_hook *hk, int dev, hn_conn *c, hn_msg *m, int64_t deadline, hr_err *err) {
    if (hk && hk->fn) hk->fn(hk->user, dev, m);
    return hn_msg_send(c, m, deadline, err);
}

void hc_send_error(hn_conn *c, uint32_t seq, int code, const char *msg) {
    if (!c) return;
    hn_msg m = {.type = HN_MSG_ERROR, .seq = seq};
    m.u.error.code = code;
    m.u.error.message = hn_cstr(msg);
    if (m.u.error.message.n > HN_MAX_MESSAGE) m.u.error.message.n = HN_MAX_MESSAGE;
    hn_msg_send(c, &m, hn_deadline_ms(1000), NULL);
}

/* hm_hparams_to_kv's sink that compares instead of writing: HR_EFORMAT at the first key the slice
   file lacks or holds another value of */
typedef struct hc_kv_cmp { hm_kv_io file; char key[128]; } hc_kv_cmp;
static int hc_kv_same(void *user, const char *key, hm_kv_type type, hm_kv_val v) {
    hc_kv_cmp *c = user;
    hm_kv_val f = {0};
    if (c->file.get(c->file.user, key, type, &f) == 1 &&
        (type == HM_KV_F32 ? hr_f32_to_bits(f.f) == hr_f32_to_bits(v.f) : type == HM_KV_BOOL ? f.b == v.b : f.i == v.i))
        return 0;
    snprintf(c->key, sizeof c->key, "%s", key);
    return HR_EFORMAT;
}

bool hc_slice_file_matches(const gguf_ctx *g, const hm_model *m, const hc_slice_meta *mt, const hc_slice *dir, int n,
                           char *why, size_t cap) {
    hc_kv_cmp c = {.file = hm_kv_gguf_reader(g, HM_KV_SLICE)};
    hm_kv_io io = {.form = HM_KV_SLICE, .user = &c, .set = hc_kv_same};
    hr_err e = {0};
    char arch[64];
    if (!gguf_get_cstr(g, "general.architecture", arch, sizeof arch) || strcmp(arch, mt->hp->arch_name))
        return snprintf(why, cap, "another architecture"), false;
    if (hm_hparams_to_kv(mt->hp, &io, &e)) return snprintf(why, cap, "hyper-parameter %.120s differs", c.key), false;
    uint32_t kb, fb;
    if (!gguf_get_u32(g, "hearth.slice.kv_begin", &kb) || kb != (uint32_t)mt->share.kv_begin ||
        !gguf_get_u32(g, "hearth.slice.ff_begin", &fb) || fb != (uint32_t)mt->share.ff_begin)
        return snprintf(why, cap, "its share's place differs"), false;
    uint64_t placement = 0, np;   /* an array of one u64 (a u64 value has no getter) */
    int pt;
    const void *pv;
    if (gguf_find_key(g, "hearth.slice.placement") >= 0) {
        if (gguf_get_arr(g, "hearth.slice.placement", &pt, &np, &pv) && pt == GGUF_VT_UINT64 && np == 1) memcpy(&placement, pv, 8);
        else placement = ~(uint64_t)0;
    }
    if (placement != mt->share.placement) return snprintf(why, cap, "its share's placement of unit groups differs"), false;
    bool layers_ok = !mt->layers ? !m->has_layer : m->has_layer && !memcmp(m->has_layer, mt->layers, (size_t)m->hp.n_layer);
    if (!m->is_slice || !layers_ok || m->slice_head != mt->head ||
        m->slice_n_head_kv != mt->share.kv_end - mt->share.kv_begin || m->slice_n_ff != mt->share.ff_end - mt->share.ff_begin)
        return snprintf(why, cap, "its share's size or layers differ"), false;
    int et;
    uint64_t nh;
    const void *hashes;
    if (gguf_n_tensors(g) != n || !gguf_get_arr(g, "hearth.slice.hashes", &et, &nh, &hashes) ||
        et != GGUF_VT_UINT64 || nh != (uint64_t)n)
        return snprintf(why, cap, "another number of tensors"), false;
    for (int i = 0; i < n; i++) {
        const hc_slice *d = &dir[i];
        const gguf_tensor *t = gguf_tensor_at(g, i);
        uint64_t h;
        memcpy(&h, (const uint8_t *)hashes + (size_t)i * 8, 8);
        bool same = !strcmp(t->name, d->name) && t->type == d->type && t->n_dims == d->n_dims && h == d->hash &&
                    t->nbytes == d->size;
        for (int k = 0; same && k < d->n_dims; k++) same = t->ne[k] == d->ne[k];
        if (!same) return snprintf(why, cap, "tensor %d ('%s') differs", i, t->name), false;
    }
    return true;
}
