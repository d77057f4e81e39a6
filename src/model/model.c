/* model: hyper-parameters and weights from GGUF — see model.h */
#include "model.h"

#include "base/pool.h"
#include "quant/quant.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int hm_hparams_load(const gguf_ctx *g, hm_hparams *hp, hr_err *err) {
    memset(hp, 0, sizeof *hp);
    char arch[32];
    if (!gguf_get_cstr(g, "general.architecture", arch, sizeof arch))
        return hr_fail(err, HR_EFORMAT, "missing metadata key 'general.architecture'");
    /* a slice file (model.h) stores what a model file's tensors would tell: a share without
       attention units has no q/k tensors to look at */
    bool slice = gguf_find_key(g, "hearth.slice.n_ff") >= 0;
    hm_kv_io io = hm_kv_gguf_reader(g, slice ? HM_KV_SLICE : HM_KV_MODEL);
    int rc = hm_hparams_from_kv(hp, arch, &io, err);
    if (rc) return rc;
    gguf_get_cstr(g, "general.name", hp->name, sizeof hp->name);
    hp->has_rope_freqs = gguf_find_tensor(g, "rope_freqs.weight") != NULL;
    if (slice) {
        /* a head's slice file has the model's embedding and output tensors (model.h) */
        hp->tied_output = gguf_find_tensor(g, "token_embd.weight") && !gguf_find_tensor(g, "output.weight");
    } else {
        const gguf_tensor *te = gguf_find_tensor(g, "token_embd.weight");
        if (!te) return hr_fail(err, HR_EFORMAT, "missing tensor 'token_embd.weight'");
        if (te->n_dims != 2 || te->ne[0] != hp->n_embd || te->ne[1] < 1 || te->ne[1] > (1 << 24))
            return hr_fail(err, HR_EFORMAT, "tensor 'token_embd.weight' has shape [%lld, %lld], expected [%d, n_vocab]",
                           (long long)te->ne[0], (long long)te->ne[1], hp->n_embd);
        hp->n_vocab = (int32_t)te->ne[1];
        hp->tied_output = gguf_find_tensor(g, "output.weight") == NULL;
        hp->has_qkv_bias = gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
        hp->has_qk_norm = gguf_find_tensor(g, "blk.0.attn_q_norm.weight") != NULL;
    }
    if (hp->arch == HM_ARCH_QWEN3 && !hp->has_qk_norm)
        return hr_fail(err, HR_EFORMAT, "qwen3 model without attn_q_norm tensors");
    return 0;
}

/* Binds a tensor and checks its shape: ne0 = input dim, ne1 = rows (1 for vectors). */
static int hm_bind(const gguf_ctx *g, hm_tensor *t, const char *name, int64_t ne0, int64_t ne1, bool optional,
                   bool f32_only, hr_err *err) {
    memset(t, 0, sizeof *t);
    const gguf_tensor *gt = gguf_find_tensor(g, name);
    if (ne1 == 0 || ne0 == 0) {
        /* an empty share of a slice file: no tensor; an empty F32 view, so the forward pass's
           block-alignment checks and view arithmetic see a valid type and size 0 */
        if (gt) return hr_fail(err, HR_EFORMAT, "tensor '%s' is present but the slice holds no units for it", name);
        t->type = HQ_TYPE_F32;
        t->ne0 = ne0;
        t->ne1 = ne1;
        t->row_bytes = (size_t)ne0 * 4;
        return 0;
    }
    if (!gt) return optional ? 0 : hr_fail(err, HR_EFORMAT, "missing tensor '%s'", name);
    int64_t rows = 1;
    for (int d = 1; d < gt->n_dims; d++) rows *= gt->ne[d];
    if (gt->ne[0] != ne0 || rows != ne1)
        return hr_fail(err, HR_EFORMAT, "tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]", name,
                       (long long)gt->ne[0], (long long)rows, (long long)ne0, (long long)ne1);
    if (f32_only && gt->type != HQ_TYPE_F32)
        return hr_fail(err, HR_EUNSUPPORTED, "tensor '%s' has type %s; norms and biases must be F32", name,
                       hq_type_name(gt->type));
    if (!hq_type_valid(gt->type))
        return hr_fail(err, HR_EUNSUPPORTED, "tensor '%s' has unsupported type %s", name, hq_type_name(gt->type));
    t->type = gt->type;
    t->ne0 = ne0;
    t->ne1 = ne1;
    t->row_bytes = hq_row_size(gt->type, ne0);
    t->data = t->map = gt->data;
    if (t->row_bytes == 0 || (uint64_t)t->row_bytes * (uint64_t)ne1 != gt->nbytes)
        return hr_fail(err, HR_EFORMAT, "tensor '%s': size does not match its shape and type", name);
    return 0;
}

static uint64_t hm_tensor_bytes(const hm_tensor *t) { return t->data ? (uint64_t)t->row_bytes * (uint64_t)t->ne1 : 0; }

/* the rows of each part but the last (hm_model.out_part_rows, set at load): the head's rows over the parts the
   size of the largest block gives, rounded up to whole row chunks (16 rows: packed bands, the matmul's work
   units) */
static int64_t hm_output_part_step(const hm_model *m) {
    const hm_tensor *o = &m->output;
    uint64_t big = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const hm_layer *L = &m->layers[il];
        const hm_tensor *a[] = {&L->wq, &L->wk, &L->wv, &L->wo}, *f[] = {&L->w_gate, &L->w_up, &L->w_down};
        uint64_t ab = 0, fb = 0;
        for (size_t i = 0; i < sizeof a / sizeof *a; i++) ab += hm_tensor_bytes(a[i]);
        for (size_t i = 0; i < sizeof f / sizeof *f; i++) fb += hm_tensor_bytes(f[i]);
        big = HR_MAX(big, HR_MAX(ab, fb));
    }
    const uint64_t ob = hm_tensor_bytes(o);
    big = HR_MAX(big, HM_OUTPUT_PART_MIN);
    if (!ob || ob <= big || o->ne1 < 32) return HR_MAX(o->ne1, 1);
    int64_t parts = (int64_t)HR_MIN((ob + big - 1) / big, (uint64_t)HM_OUTPUT_PARTS_MAX);
    int64_t step = (o->ne1 + parts - 1) / parts;
    return (step + 15) / 16 * 16;
}

hm_model *hm_model_load(const gguf_ctx *g, hr_err *err) {
    hm_model *m = calloc(1, sizeof *m);
    if (!m) { hr_fail(err, HR_ENOMEM, "out of memory"); return NULL; }
    m->gguf = g;
    if (hm_hparams_load(g, &m->hp, err)) goto err;
    const hm_hparams *hp = &m->hp;
    int64_t E = hp->n_embd, Dq = (int64_t)hp->n_head * hp->head_dim, Dkv = (int64_t)hp->n_head_kv * hp->head_dim;
    int64_t F = hp->n_ff;
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) { hr_fail(err, HR_ENOMEM, "out of memory"); goto err; }
    m->is_slice = gguf_find_key(g, "hearth.slice.n_ff") >= 0;
    if (m->is_slice) {
        /* only this file's units: the same shapes with fewer heads / neurons */
        int64_t skv, sff;
        if (!gguf_get_i64(g, "hearth.slice.n_head_kv", &skv) || skv < 0 || skv > hp->n_head_kv ||
            !gguf_get_i64(g, "hearth.slice.n_ff", &sff) || sff < 0 || sff > hp->n_ff) {
            hr_fail(err, HR_EFORMAT, "slice file: missing or bad 'hearth.slice.n_head_kv' / 'hearth.slice.n_ff'");
            goto err;
        }
        m->slice_n_head_kv = (int32_t)skv;
        m->slice_n_ff = (int32_t)sff;
        Dq = skv * (hp->n_head / hp->n_head_kv) * hp->head_dim;
        Dkv = skv * hp->head_dim;
        F = sff;
        bool head = false;
        m->slice_head = gguf_get_bool(g, "hearth.slice.head", &head) && head;
        if (!m->slice_head && (gguf_find_tensor(g, "token_embd.weight") || gguf_find_tensor(g, "output.weight"))) {
            hr_fail(err, HR_EFORMAT, "slice file holds token_embd or output, which must stay on the head");
            goto err;
        }
    }
    if (!m->is_slice || m->slice_head) {
        if (hm_bind(g, &m->tok_embd, "token_embd.weight", E, hp->n_vocab, false, false, err)) goto err;
        if (hm_bind(g, &m->output_norm, "output_norm.weight", E, 1, false, true, err)) goto err;
        if (hp->tied_output) m->output = m->tok_embd;
        else if (hm_bind(g, &m->output, "output.weight", E, hp->n_vocab, false, false, err)) goto err;
    }
    if (m->is_slice && gguf_find_key(g, "hearth.slice.layers") >= 0) {
        /* a pipeline stage's slice: whole layers, only these */
        int et;
        uint64_t nl;
        const void *ids;
        if (!gguf_get_arr(g, "hearth.slice.layers", &et, &nl, &ids) || et != GGUF_VT_UINT32 || nl > (uint64_t)hp->n_layer) {
            hr_fail(err, HR_EFORMAT, "slice file: 'hearth.slice.layers' must be a u32 array of at most %d layers",
                    hp->n_layer);
            goto err;
        }
        if (!(m->has_layer = calloc((size_t)hp->n_layer, 1))) { hr_fail(err, HR_ENOMEM, "out of memory"); goto err; }
        for (uint64_t i = 0; i < nl; i++) {
            uint32_t il;
            memcpy(&il, (const uint8_t *)ids + 4 * i, 4);
            if (il >= (uint32_t)hp->n_layer || m->has_layer[il]) {
                hr_fail(err, HR_EFORMAT, "slice file: 'hearth.slice.layers' lists layer %u twice or outside [0, %d)",
                        il, hp->n_layer);
                goto err;
            }
            m->has_layer[il] = 1;
        }
    }
    bool has_att = Dkv > 0;
    if (hm_bind(g, &m->rope_freqs, "rope_freqs.weight", hp->head_dim / 2, 1, true, true, err)) goto err;
    for (int il = 0; il < hp->n_layer; il++) {
        hm_layer *L = &m->layers[il];
        if (m->has_layer && !m->has_layer[il]) {
            /* not in this file: its tensors must not be either (they would be unaccounted bytes) */
            char n[96];
            snprintf(n, sizeof n, "blk.%d.attn_norm.weight", il);
            if (gguf_find_tensor(g, n)) {
                hr_fail(err, HR_EFORMAT, "slice file holds '%s' but does not list layer %d", n, il);
                goto err;
            }
            continue;
        }
        char n[96];
#define BIND(field, suffix, ne0, ne1, opt, f32)                                              \
        snprintf(n, sizeof n, "blk.%d.%s", il, suffix);                                      \
        if (hm_bind(g, &L->field, n, ne0, ne1, opt, f32, err)) goto err;
        BIND(attn_norm, "attn_norm.weight", E, 1, false, true)
        BIND(wq, "attn_q.weight", E, Dq, false, false)
        BIND(wk, "attn_k.weight", E, Dkv, false, false)
        BIND(wv, "attn_v.weight", E, Dkv, false, false)
        BIND(wo, "attn_output.weight", Dq, E, false, false)
        BIND(bq, "attn_q.bias", Dq, has_att, !hp->has_qkv_bias, true)
        BIND(bk, "attn_k.bias", Dkv, has_att, !hp->has_qkv_bias, true)
        BIND(bv, "attn_v.bias", Dkv, has_att, !hp->has_qkv_bias, true)
        BIND(q_norm, "attn_q_norm.weight", hp->head_dim, has_att, !hp->has_qk_norm, true)
        BIND(k_norm, "attn_k_norm.weight", hp->head_dim, has_att, !hp->has_qk_norm, true)
        BIND(ffn_norm, "ffn_norm.weight", E, 1, false, true)
        BIND(w_gate, "ffn_gate.weight", E, F, false, false)
        BIND(w_up, "ffn_up.weight", E, F, false, false)
        BIND(w_down, "ffn_down.weight", F, E, false, false)
#undef BIND
    }
    m->out_part_rows = hm_output_part_step(m);
    return m;
err:
    hm_model_free(m);
    return NULL;
}

void hm_model_free(hm_model *m) {
    if (!m) return;
    if (m->loaded) munmap(m->loaded, m->loaded_cap);
    free(m->has_layer);
    free(m->layers);
    free(m);
}

int hm_embed(const hm_model *m, const int32_t *tokens, int n, float *out, hr_err *err) {
    if (!m->tok_embd.data) return hr_fail(err, HR_EINVAL, "a worker's slice file has no token embedding");
    int64_t E = m->hp.n_embd;
    for (int t = 0; t < n; t++) {
        if (tokens[t] < 0 || tokens[t] >= m->hp.n_vocab)
            return hr_fail(err, HR_EINVAL, "token id %d outside the vocabulary [0, %d)", tokens[t], m->hp.n_vocab);
        hm_tensor_row_f32(&m->tok_embd, tokens[t], out + t * E);
    }
    return 0;
}

void hm_tensor_row_f32(const hm_tensor *t, int64_t r, float *out) {
    const hq_traits *tr = hq_get_traits(t->type);
    if (!t->packed) {
        tr->to_float((const uint8_t *)t->data + (size_t)r * t->row_bytes, out, t->ne0);
        return;
    }
    /* unpack and convert a stretch of the row at a time */
    enum { CHUNK = HQ_UNPACK_STEP };
    uint8_t tmp[CHUNK / 32 * 64];
    for (int64_t e0 = 0; e0 < t->ne0; e0 += CHUNK) {
        const int64_t ne = HR_MIN(CHUNK, t->ne0 - e0);
        static_assert(CHUNK % QK_K == 0 && sizeof tmp >= CHUNK / 32 * sizeof(block_q4_0) &&
                          sizeof tmp >= CHUNK / QK_K * sizeof(block_q6_K) && sizeof tmp >= CHUNK / QK_K * sizeof(block_q4_K),
                      "unpack chunk");
        tr->unpack(tmp, t->data, t->ne0, t->ne1, r, e0, ne);
        tr->to_float(tmp, out + e0, ne);
    }
}

/* ---- loading the weights into memory (model.h) ---- */

enum { HM_LOAD_ALIGN = 64 };
#define HM_ROUND_UP(x, a) (((x) + (a) - 1) / (a) * (a))

/* the tensors a shard reads whole: its layers' (unless it holds only part of their units), the
   output head (and token_embd with it, when tied) */
static int hm_load_list(hm_model *m, const hm_shard *shard, hm_tensor **out) {
    int n = 0;
    const hm_shard s = hm_shard_normalize(m, shard);
    const int32_t nkv = m->is_slice ? m->slice_n_head_kv : m->hp.n_head_kv, nff = m->is_slice ? m->slice_n_ff : m->hp.n_ff;
    const bool whole = s.kv_begin == 0 && s.kv_end == nkv && s.ff_begin == 0 && s.ff_end == nff;
    for (int w = 0; whole && w < s.n_windows; w++)
        for (int il = s.windows[w].begin; il < s.windows[w].end; il++) {
            hm_layer *L = &m->layers[il];
            hm_tensor *ts[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
            for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
                if (ts[i]->data && ts[i]->ne1 > 0) out[n++] = ts[i];
        }
    if (s.last && m->output.data) out[n++] = &m->output;
    return n;
}

/* the copy: each tensor's rows split over the pool's threads (whole bands where it is packed), so
   that the kernel's zeroing of the fresh pages (half the time of a load) and the packing run on
   every core */
typedef struct hm_load_job {
    hm_tensor **list;   /* packed already says which to pack; map is the source */
    uint8_t **dst;
    int n;
    uint64_t total;     /* bytes of all of them (progress, reported by thread 0) */
} hm_load_job;

static void hm_load_worker(void *arg, int ith, int nth) {
    const hm_load_job *j = arg;
    uint64_t done = 0;
    for (int i = 0; i < j->n; i++) {
        const hm_tensor *t = j->list[i];
        if (ith == 0) {
            hr_progress("load", done, j->total);
            done += (uint64_t)t->ne1 * t->row_bytes;
        }
        const bool pk = t->packed;
        int64_t r0, r1;
        hr_split(t->ne1, ith, nth, pk ? HQ_BAND : 1, &r0, &r1);
        const uint8_t *src = (const uint8_t *)t->map + (size_t)r0 * t->row_bytes;
        uint8_t *dst = j->dst[i] + (size_t)r0 * t->row_bytes;
        if (!pk) {
            if (r1 > r0) memcpy(dst, src, (size_t)(r1 - r0) * t->row_bytes);
            continue;
        }
        const hq_traits *tr = hq_get_traits(t->type);
        for (int64_t r = r0; r < r1; r += HQ_BAND, src += HQ_BAND * t->row_bytes, dst += HQ_BAND * t->row_bytes)
            tr->pack(dst, src, t->row_bytes, t->ne0, (int)HR_MIN(HQ_BAND, r1 - r));
    }
}

int hm_model_load_weights(hm_model *m, const hm_shard *shard, bool repack, uint64_t *copied, uint64_t *packed,
                          hr_err *err) {
    *copied = *packed = 0;
    if (m->loaded) return 0;
    const hm_shard full = hm_shard_full(m);
    hm_tensor **list = malloc(((size_t)m->hp.n_layer * 7 + 1) * sizeof *list);
    uint8_t **dst = malloc(((size_t)m->hp.n_layer * 7 + 1) * sizeof *dst);
    hr_pool *pool = NULL;
    void *buf = MAP_FAILED;
    size_t cap = 0;
    int rc = 0;
    if (!list || !dst) {
        rc = hr_fail(err, HR_ENOMEM, "out of memory");
        goto done;
    }
    const int n = hm_load_list(m, shard ? shard : &full, list);
    for (int i = 0; i < n; i++) cap += HM_ROUND_UP((size_t)list[i]->ne1 * list[i]->row_bytes, HM_LOAD_ALIGN);
    if (cap == 0) goto done;
    buf = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        rc = hr_fail(err, HR_ENOMEM, "cannot allocate %.1f MiB to load the weights into: %s", cap / 1048576.0,
                     strerror(errno));
        goto done;
    }
    (void)madvise(buf, cap, MADV_HUGEPAGE); /* advice only: without THP the copy still works */
    uint8_t *at = buf;
    for (int i = 0; i < n; i++) {
        dst[i] = at;
        at += HM_ROUND_UP((size_t)list[i]->ne1 * list[i]->row_bytes, HM_LOAD_ALIGN);
    }
    if (!(pool = hr_pool_create(hr_physical_cores(), err))) {
        rc = err->code;
        goto done;
    }
    for (int i = 0; i < n; i++) list[i]->packed = repack && hq_pack_ok(list[i]->type, list[i]->ne0, list[i]->ne1);
    hm_load_job job = {list, dst, n, 0};
    for (int i = 0; i < n; i++) job.total += (uint64_t)list[i]->ne1 * list[i]->row_bytes;
    hr_pool_run(pool, hm_load_worker, &job);
    hr_progress("load", job.total, job.total);
    const bool tied = m->output.map == m->tok_embd.map;
    const long pg = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    for (int i = 0; i < n; i++) {
        hm_tensor *t = list[i];
        const size_t bytes = (size_t)t->ne1 * t->row_bytes;
        if (t->packed) *packed += bytes;
        t->data = dst[i];
        *copied += bytes;
        /* this process's page table entries for the file's copy go; whole pages only, so that
           neighbouring tensors that stay mapped keep theirs */
        uintptr_t a = HM_ROUND_UP((uintptr_t)t->map, (uintptr_t)pg), e = ((uintptr_t)t->map + bytes) / pg * pg;
        if (e > a) (void)madvise((void *)a, e - a, MADV_DONTNEED);
    }
    if (tied) m->tok_embd = m->output;
    (void)mprotect(buf, cap, PROT_READ);
    m->loaded = buf;
    m->loaded_cap = cap;
    buf = MAP_FAILED;
done:
    if (buf != MAP_FAILED) munmap(buf, cap);
    hr_pool_free(pool);
    free(list);
    free(dst);
    return rc;
}

uint64_t hm_model_weight_bytes(const hm_model *m) {
    uint64_t s = 0;
    for (int64_t i = 0; i < gguf_n_tensors(m->gguf); i++) s += gguf_tensor_at(m->gguf, i)->nbytes;
    return s;
}

hm_shard hm_shard_full(const hm_model *m) {
    hm_shard s = {.layer_begin = 0, .layer_end = m->hp.n_layer, .kv_begin = 0, .kv_end = m->hp.n_head_kv,
                  .ff_begin = 0, .ff_end = m->hp.n_ff, .first = true, .last = true};
    if (m->is_slice) {
        s.kv_end = m->slice_n_head_kv;
        s.ff_end = m->slice_n_ff;
        s.first = false;
        s.last = m->slice_head;
    }
    if (m->has_layer) {
        /* the file's layers, as maximal runs (a pipeline stage's windows) */
        s.layer_begin = s.layer_end = 0;
        for (int il = 0; il < m->hp.n_layer && s.n_windows < HM_MAX_WINDOWS; il++) {
            if (!m->has_layer[il]) continue;
            if (s.n_windows > 0 && s.windows[s.n_windows - 1].end == il) s.windows[s.n_windows - 1].end++;
            else s.windows[s.n_windows++] = (hm_window){il, il + 1};
        }
        if (s.n_windows == 0) s.n_windows = 1; /* no layers: one empty window */
        s = hm_shard_normalize(m, &s);
    }
    return s;
}

static bool hm_cols_aligned(const hm_tensor *t, int64_t c0, int64_t c1) {
    const hq_traits *tr = hq_get_traits(t->type);
    return tr && c0 % tr->blck_size == 0 && c1 % tr->blck_size == 0;
}

hm_shard hm_shard_normalize(const hm_model *m, const hm_shard *in) {
    hm_shard s = *in;
    if (s.kv_end < 0) s.kv_end = m->is_slice ? m->slice_n_head_kv : m->hp.n_head_kv;
    if (s.ff_end < 0) s.ff_end = m->is_slice ? m->slice_n_ff : m->hp.n_ff;
    if (s.n_windows <= 0) {
        s.n_windows = 1;
        s.windows[0] = (hm_window){s.layer_begin, s.layer_end};
    } else if (s.n_windows <= HM_MAX_WINDOWS) {
        s.layer_begin = s.windows[0].begin;
        s.layer_end = s.windows[s.n_windows - 1].end;
    }
    return s;
}

int32_t hm_shard_n_layers(const hm_shard *s) {
    if (s->n_windows <= 0) return s->layer_end - s->layer_begin;
    int32_t n = 0;
    for (int w = 0; w < s->n_windows && w < HM_MAX_WINDOWS; w++) n += s->windows[w].end - s->windows[w].begin;
    return n;
}

int hm_shard_validate(const hm_model *m, const hm_shard *in, hr_err *err) {
    const hm_hparams *hp = &m->hp;
    if (in->n_windows > HM_MAX_WINDOWS)
        return hr_fail(err, HR_EINVAL, "a shard of %d windows (at most %d)", in->n_windows, HM_MAX_WINDOWS);
    hm_shard sn = hm_shard_normalize(m, in);
    const hm_shard *s = &sn;
    for (int w = 0; w < s->n_windows; w++) {
        const hm_window *x = &s->windows[w];
        if (x->begin < 0 || x->end > hp->n_layer || x->begin > x->end || (w > 0 && x->begin < s->windows[w - 1].end))
            return hr_fail(err, HR_EINVAL, "shard layers [%d, %d)%s outside the model's %d layers or not after the "
                           "previous window", x->begin, x->end, s->n_windows > 1 ? " (a window)" : "", hp->n_layer);
        for (int il = x->begin; il < x->end; il++)
            if (m->has_layer && !m->has_layer[il])
                return hr_fail(err, HR_EINVAL, "shard runs layer %d, which this slice file does not hold", il);
    }
    if (s->kv_begin < 0 || s->kv_end > hp->n_head_kv || s->kv_begin > s->kv_end)
        return hr_fail(err, HR_EINVAL, "shard attention units [%d, %d) outside the model's %d KV heads", s->kv_begin,
                       s->kv_end, hp->n_head_kv);
    if (s->ff_begin < 0 || s->ff_end > hp->n_ff || s->ff_begin > s->ff_end)
        return hr_fail(err, HR_EINVAL, "shard FFN neurons [%d, %d) outside the model's %d", s->ff_begin, s->ff_end,
                       hp->n_ff);
    if (m->is_slice && (s->kv_end > m->slice_n_head_kv || s->ff_end > m->slice_n_ff || ((s->first || s->last) && !m->slice_head)))
        return hr_fail(err, HR_EINVAL, "shard kv [%d, %d) ff [%d, %d)%s is not inside the slice file's %d KV heads and "
                       "%d FFN neurons", s->kv_begin, s->kv_end, s->ff_begin, s->ff_end,
                       s->first || s->last ? " with embedding/output" : "", m->slice_n_head_kv, m->slice_n_ff);
    int64_t unit = (int64_t)(hp->n_head / hp->n_head_kv) * hp->head_dim;
    for (int w = 0; w < s->n_windows; w++)
        for (int il = s->windows[w].begin; il < s->windows[w].end; il++) {
            const hm_layer *L = &m->layers[il];
            if (!hm_cols_aligned(&L->wo, s->kv_begin * unit, s->kv_end * unit))
                return hr_fail(err, HR_EINVAL, "layer %d: attention units [%d, %d) do not fall on %s block boundaries "
                               "of attn_output (%lld columns per unit)", il, s->kv_begin, s->kv_end,
                               hq_type_name(L->wo.type), (long long)unit);
            if (!hm_cols_aligned(&L->w_down, s->ff_begin, s->ff_end))
                return hr_fail(err, HR_EINVAL, "layer %d: FFN neurons [%d, %d) do not fall on %s block boundaries of "
                               "ffn_down", il, s->ff_begin, s->ff_end, hq_type_name(L->w_down.type));
        }
    return 0;
}

/* rows [r0, r1) of t (r1 < 0: all of them) */
static int hm_add_range(const hm_tensor *t, int64_t r0, int64_t r1, hm_range *out, int n, int cap) {
    if (!t->data) return n;
    if (r1 < 0) { r0 = 0; r1 = t->ne1; }
    if (r1 <= r0) return n;
    if (n < cap) out[n] = (hm_range){(const uint8_t *)t->map + (size_t)r0 * t->row_bytes, t->row_bytes * (size_t)(r1 - r0)};
    return n + 1;
}

/* elements [e0, e1) of an F32 vector (a bias) */
static int hm_add_elems(const hm_tensor *t, int64_t e0, int64_t e1, hm_range *out, int n, int cap) {
    if (!t->data || e1 <= e0) return n;
    if (n < cap) out[n] = (hm_range){(const float *)t->map + e0, (size_t)(e1 - e0) * sizeof(float)};
    return n + 1;
}

int hm_output_parts(const hm_model *m) {
    const int64_t step = HR_MAX(m->out_part_rows, 1), rows = HR_MAX(m->output.ne1, 1);
    return (int)((rows + step - 1) / step);
}

void hm_output_part_rows(const hm_model *m, int k, int64_t r[2]) {
    const int64_t step = HR_MAX(m->out_part_rows, 1), rows = m->output.ne1;
    r[0] = HR_MIN((int64_t)k * step, rows);
    r[1] = HR_MIN(r[0] + step, rows);
}

int hm_block_weights(const hm_model *m, int layer, enum hm_block block, hr_span *out, int cap) {
    const hm_tensor *ts[16];
    int nt = 0;
    if (block == HM_BLOCK_OUTPUT) {
        ts[nt++] = &m->output_norm;
        ts[nt++] = &m->output;
    } else if (layer >= 0 && layer < m->hp.n_layer) {
        const hm_layer *L = &m->layers[layer];
        if (block == HM_BLOCK_ATTN) {
            const hm_tensor *a[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->bq, &L->bk, &L->bv, &L->q_norm, &L->k_norm, &L->wo};
            for (size_t i = 0; i < sizeof a / sizeof *a; i++) ts[nt++] = a[i];
        } else {
            const hm_tensor *f[] = {&L->ffn_norm, &L->w_gate, &L->w_up, &L->w_down};
            for (size_t i = 0; i < sizeof f / sizeof *f; i++) ts[nt++] = f[i];
        }
    }
    int n = 0;
    for (int i = 0; i < nt; i++) {
        if (!ts[i]->data) continue;
        if (n < cap) out[n] = (hr_span){ts[i]->data, ts[i]->row_bytes * (size_t)ts[i]->ne1};
        n++;
    }
    return n;
}

int hm_block_ranges(const hm_model *m, const hm_shard *s, int layer, enum hm_block block, hm_range *out, int cap) {
    int n = 0;
    if (block == HM_BLOCK_OUTPUT) {
        const int k = layer - m->hp.n_layer;
        if (k < 0 || k >= hm_output_parts(m)) return 0;
        int64_t r[2];
        hm_output_part_rows(m, k, r);
        if (k == 0) n = hm_add_range(&m->output_norm, 0, -1, out, n, cap);
        return hm_add_range(&m->output, r[0], r[1], out, n, cap);
    }
    if (layer < 0 || layer >= m->hp.n_layer) return 0;
    const hm_layer *L = &m->layers[layer];
    const hm_hparams *hp = &m->hp;
    int64_t hd = hp->head_dim, unit = (int64_t)(hp->n_head / hp->n_head_kv) * hd;
    /* the whole model's units, or the shard's (a slice file's tensors hold just its units) */
    int64_t kv0 = 0, kv1 = m->is_slice ? m->slice_n_head_kv : hp->n_head_kv, f0 = 0, f1 = m->is_slice ? m->slice_n_ff : hp->n_ff;
    if (s) {
        kv0 = s->kv_begin;
        kv1 = s->kv_end < 0 ? kv1 : s->kv_end;
        f0 = s->ff_begin;
        f1 = s->ff_end < 0 ? f1 : s->ff_end;
    }
    if (block == HM_BLOCK_ATTN) {
        n = hm_add_range(&L->attn_norm, 0, -1, out, n, cap);
        if (kv1 <= kv0) return n;
        n = hm_add_range(&L->wq, kv0 * unit, kv1 * unit, out, n, cap);
        n = hm_add_range(&L->wk, kv0 * hd, kv1 * hd, out, n, cap);
        n = hm_add_range(&L->wv, kv0 * hd, kv1 * hd, out, n, cap);
        n = hm_add_elems(&L->bq, kv0 * unit, kv1 * unit, out, n, cap);
        n = hm_add_elems(&L->bk, kv0 * hd, kv1 * hd, out, n, cap);
        n = hm_add_elems(&L->bv, kv0 * hd, kv1 * hd, out, n, cap);
        n = hm_add_range(&L->q_norm, 0, -1, out, n, cap);
        n = hm_add_range(&L->k_norm, 0, -1, out, n, cap);
        return hm_add_range(&L->wo, 0, -1, out, n, cap);
    }
    n = hm_add_range(&L->ffn_norm, 0, -1, out, n, cap);
    if (f1 <= f0) return n;
    n = hm_add_range(&L->w_gate, f0, f1, out, n, cap);
    n = hm_add_range(&L->w_up, f0, f1, out, n, cap);
    return hm_add_range(&L->w_down, 0, -1, out, n, cap);
}
