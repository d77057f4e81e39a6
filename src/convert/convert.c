/* config.json and the checkpoint's tensors -> GGUF: the architecture's hyper-parameters under
   llama.cpp's keys, each Hugging Face tensor under llama.cpp's name with its shape checked, and the
   streaming writer (docs/convert.md). */
#include "convert-impl.h"

#include "gguf/gguf.h"
#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum { ARCH_LLAMA, ARCH_QWEN2, ARCH_QWEN3 };
static const char *const arch_names[] = {"llama", "qwen2", "qwen3"};

/* the transformers class names each architecture goes by */
static const struct { const char *cls; int arch; } arch_classes[] = {
    {"LlamaForCausalLM", ARCH_LLAMA}, {"MistralForCausalLM", ARCH_LLAMA},
    {"Qwen2ForCausalLM", ARCH_QWEN2}, {"Qwen3ForCausalLM", ARCH_QWEN3},
};

/* one GGUF tensor and where its values come from */
typedef struct plan_tensor {
    char                 name[64];     /* GGUF name */
    const hcv_st_tensor *src;
    int                  n_dims;
    int64_t              ne[2];        /* GGUF order: ne[0] is the row length */
    int                  permute;      /* llama's Q/K: the heads whose rotary halves are interleaved; 0 none */
    float               *values;       /* computed here instead (rope_freqs), owned */
} plan_tensor;

struct hcv_model {
    char        *dir;
    int          arch;
    hcv_st       st;
    gguf_writer *w;                    /* metadata set by hcv_open; tensors declared by hcv_write */
    plan_tensor *t;
    int          n_t;
    int32_t      n_embd, n_layer, n_head, n_kv, n_ff, n_vocab, head_dim;
    bool         tied, bf16_source;
};

/* ---- config.json ------------------------------------------------------------------------------- */

static int cfg_int(json_t *cfg, const char *key, int64_t def, int64_t lo, int64_t hi, int32_t *out, hr_err *err) {
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) {
        if (def < 0) return hr_fail(err, HR_EFORMAT, "config.json has no '%s'", key);
        *out = (int32_t)def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return hr_fail(err, HR_EFORMAT, "config.json: '%s' must be an integer in [%lld, %lld]", key, (long long)lo, (long long)hi);
    *out = (int32_t)json_integer_value(v);
    return 0;
}

static double cfg_num(json_t *cfg, const char *key, double def) {
    json_t *v = json_object_get(cfg, key);
    return json_is_number(v) ? json_number_value(v) : def;
}

/* Llama 3.1's rope scaling as a per-frequency factor (rope_freqs.weight, which hearth's attention
   divides each rotary frequency by): wavelengths shorter than the original context's
   high_freq_factor-th part keep their frequency, longer than its low_freq_factor-th part are slowed
   by `factor`, and those between are blended linearly in the inverse of the wavelength. */
static int llama3_freqs(hcv_model *m, json_t *rs, float base, hr_err *err) {
    double factor = cfg_num(rs, "factor", 8), lo = cfg_num(rs, "low_freq_factor", 1), hi = cfg_num(rs, "high_freq_factor", 4);
    double ctx = cfg_num(rs, "original_max_position_embeddings", 8192);
    if (!(factor > 0 && lo > 0 && hi > lo && ctx > 0)) return hr_fail(err, HR_EFORMAT, "config.json: bad llama3 rope_scaling");
    int n = m->head_dim / 2;
    float *f = malloc((size_t)n * sizeof *f);
    if (!f) return hr_fail(err, HR_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        double freq = pow(base, -2.0 * i / m->head_dim), wavelen = 2 * M_PI / freq;
        if (wavelen < ctx / hi) f[i] = 1;
        else if (wavelen > ctx / lo) f[i] = (float)factor;
        else {
            double smooth = (ctx / wavelen - lo) / (hi - lo);
            f[i] = (float)(1 / ((1 - smooth) / factor + smooth));
        }
    }
    plan_tensor *t = &m->t[m->n_t++];
    *t = (plan_tensor){.n_dims = 1, .ne = {n, 1}, .values = f};
    snprintf(t->name, sizeof t->name, "rope_freqs.weight");
    return 0;
}

static int read_config(hcv_model *m, json_t *cfg, hr_err *err) {
    json_t *archs = json_object_get(cfg, "architectures");
    const char *cls = json_string_value(json_array_get(archs, 0));
    m->arch = -1;
    for (size_t i = 0; cls && i < sizeof arch_classes / sizeof arch_classes[0]; i++)
        if (!strcmp(cls, arch_classes[i].cls)) m->arch = arch_classes[i].arch;
    if (m->arch < 0)
        return hr_fail(err, HR_EUNSUPPORTED, "config.json: unknown architecture '%s' (hearth converts LlamaForCausalLM, "
                       "MistralForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM)", cls ? cls : "(none given)");
    int rc = cfg_int(cfg, "hidden_size", -1, 1, 1 << 20, &m->n_embd, err);
    if (!rc) rc = cfg_int(cfg, "num_hidden_layers", -1, 1, 4096, &m->n_layer, err);
    if (!rc) rc = cfg_int(cfg, "num_attention_heads", -1, 1, 1 << 16, &m->n_head, err);
    if (!rc) rc = cfg_int(cfg, "num_key_value_heads", m->n_head, 1, m->n_head, &m->n_kv, err);
    if (!rc) rc = cfg_int(cfg, "intermediate_size", -1, 1, 1 << 22, &m->n_ff, err);
    if (!rc) rc = cfg_int(cfg, "vocab_size", -1, 1, 1 << 24, &m->n_vocab, err);
    if (!rc) rc = cfg_int(cfg, "head_dim", m->n_embd / m->n_head, 2, 4096, &m->head_dim, err);
    if (rc) return rc;
    if (m->n_head % m->n_kv) return hr_fail(err, HR_EFORMAT, "config.json: %d heads do not share %d KV heads evenly", m->n_head, m->n_kv);
    if (m->head_dim % 2) return hr_fail(err, HR_EFORMAT, "config.json: head_dim %d is odd", m->head_dim);
    const char *act = json_string_value(json_object_get(cfg, "hidden_act"));
    if (act && strcmp(act, "silu"))
        return hr_fail(err, HR_EUNSUPPORTED, "config.json: hidden_act '%s' (hearth's FFN is SiLU-gated)", act);
    if (json_is_true(json_object_get(cfg, "mlp_bias")) || (m->arch == ARCH_LLAMA && json_is_true(json_object_get(cfg, "attention_bias"))))
        return hr_fail(err, HR_EUNSUPPORTED, "config.json: biases on llama's projections are not supported");
    if (json_is_true(json_object_get(cfg, "use_sliding_window")))
        return hr_fail(err, HR_EUNSUPPORTED, "config.json: sliding-window attention is not supported");
    m->tied = json_is_true(json_object_get(cfg, "tie_word_embeddings"));

    float base = (float)cfg_num(cfg, "rope_theta", m->arch == ARCH_LLAMA ? 10000 : 1000000);
    double eps = cfg_num(cfg, "rms_norm_eps", 1e-6);
    int32_t n_ctx = 0;
    if ((rc = cfg_int(cfg, "max_position_embeddings", 4096, 1, 1 << 24, &n_ctx, err))) return rc;
    json_t *rs = json_object_get(cfg, "rope_scaling");
    if (rs && !json_is_null(rs)) {
        const char *type = json_string_value(json_object_get(rs, "rope_type"));
        if (!type) type = json_string_value(json_object_get(rs, "type"));
        if (!type || strcmp(type, "llama3"))
            return hr_fail(err, HR_EUNSUPPORTED, "config.json: rope_scaling '%s' is not supported (only llama3's)", type ? type : "?");
        if ((rc = llama3_freqs(m, rs, base, err))) return rc;
    }

    /* llama.cpp's keys: general.* and <arch>.* */
    const char *a = arch_names[m->arch];
    char key[128];
    const char *slash = strrchr(m->dir, '/');
    const char *name = slash && slash[1] ? slash + 1 : m->dir;
    rc = gguf_writer_set_str(m->w, "general.architecture", a) || gguf_writer_set_str(m->w, "general.name", name);
#define KEY(k) (snprintf(key, sizeof key, "%s.%s", a, k), key)
    rc = rc || gguf_writer_set_u32(m->w, KEY("context_length"), (uint32_t)n_ctx);
    rc = rc || gguf_writer_set_u32(m->w, KEY("embedding_length"), (uint32_t)m->n_embd);
    rc = rc || gguf_writer_set_u32(m->w, KEY("block_count"), (uint32_t)m->n_layer);
    rc = rc || gguf_writer_set_u32(m->w, KEY("feed_forward_length"), (uint32_t)m->n_ff);
    rc = rc || gguf_writer_set_u32(m->w, KEY("attention.head_count"), (uint32_t)m->n_head);
    rc = rc || gguf_writer_set_u32(m->w, KEY("attention.head_count_kv"), (uint32_t)m->n_kv);
    rc = rc || gguf_writer_set_f32(m->w, KEY("rope.freq_base"), base);
    rc = rc || gguf_writer_set_f32(m->w, KEY("attention.layer_norm_rms_epsilon"), (float)eps);
    rc = rc || gguf_writer_set_u32(m->w, KEY("vocab_size"), (uint32_t)m->n_vocab);
    rc = rc || gguf_writer_set_u32(m->w, KEY("rope.dimension_count"), (uint32_t)m->head_dim);
    if (m->head_dim != m->n_embd / m->n_head || json_object_get(cfg, "head_dim")) {
        rc = rc || gguf_writer_set_u32(m->w, KEY("attention.key_length"), (uint32_t)m->head_dim);
        rc = rc || gguf_writer_set_u32(m->w, KEY("attention.value_length"), (uint32_t)m->head_dim);
    }
#undef KEY
    return rc ? hr_fail(err, HR_ENOMEM, "out of memory") : 0;
}

/* ---- tensors ------------------------------------------------------------------------------------ */

/* Adds GGUF tensor `name` from HF tensor `hf`, whose shape must be [rows, cols] (cols 0: a vector
   of rows). optional: absent is fine. */
static int plan(hcv_model *m, const char *name, const char *hf, int64_t rows, int64_t cols, int permute, bool optional,
                hr_err *err) {
    const hcv_st_tensor *s = hcv_st_find(&m->st, hf);
    if (!s) return optional ? 0 : hr_fail(err, HR_ENOTFOUND, "tensor '%s' is missing from the checkpoint", hf);
    int nd = cols ? 2 : 1;
    if (s->n_dims != nd || s->shape[0] != rows || (nd == 2 && s->shape[1] != cols)) {
        char got[64] = "";
        for (int i = 0; i < s->n_dims; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)s->shape[i]);
        return hr_fail(err, HR_EFORMAT, "tensor '%s' has shape [%s]; config.json implies [%lld%s%.0lld]", hf, got,
                       (long long)rows, cols ? ", " : "", (long long)cols);
    }
    plan_tensor *t = &m->t[m->n_t++];
    *t = (plan_tensor){.src = s, .n_dims = nd, .ne = {nd == 2 ? cols : rows, nd == 2 ? rows : 1}, .permute = permute};
    snprintf(t->name, sizeof t->name, "%s", name);
    if (s->dtype == HQ_TYPE_BF16) m->bf16_source = true;
    return 0;
}

static int plan_tensors(hcv_model *m, hr_err *err) {
    int64_t E = m->n_embd, q = (int64_t)m->n_head * m->head_dim, kv = (int64_t)m->n_kv * m->head_dim;
    bool llama = m->arch == ARCH_LLAMA;
    /* a tied checkpoint may keep only one name for the shared matrix (safetensors saves a shared
       tensor once; transformers keeps lm_head.weight and notes the alias in __metadata__) */
    const char *embd = m->tied && !hcv_st_find(&m->st, "model.embed_tokens.weight") && hcv_st_find(&m->st, "lm_head.weight")
                     ? "lm_head.weight" : "model.embed_tokens.weight";
    int rc = plan(m, "token_embd.weight", embd, m->n_vocab, E, 0, false, err);
    if (!rc) rc = plan(m, "output_norm.weight", "model.norm.weight", E, 0, 0, false, err);
    if (!rc && !m->tied) rc = plan(m, "output.weight", "lm_head.weight", m->n_vocab, E, 0, false, err);
    for (int l = 0; l < m->n_layer && !rc; l++) {
        const struct { const char *gguf, *hf; int64_t rows, cols; int permute; bool want; } ts[] = {
            {"attn_norm.weight", "input_layernorm.weight", E, 0, 0, true},
            {"attn_q.weight", "self_attn.q_proj.weight", q, E, llama ? m->n_head : 0, true},
            {"attn_k.weight", "self_attn.k_proj.weight", kv, E, llama ? m->n_kv : 0, true},
            {"attn_v.weight", "self_attn.v_proj.weight", kv, E, 0, true},
            {"attn_output.weight", "self_attn.o_proj.weight", E, q, 0, true},
            {"attn_q.bias", "self_attn.q_proj.bias", q, 0, 0, m->arch == ARCH_QWEN2},
            {"attn_k.bias", "self_attn.k_proj.bias", kv, 0, 0, m->arch == ARCH_QWEN2},
            {"attn_v.bias", "self_attn.v_proj.bias", kv, 0, 0, m->arch == ARCH_QWEN2},
            {"attn_q_norm.weight", "self_attn.q_norm.weight", m->head_dim, 0, 0, m->arch == ARCH_QWEN3},
            {"attn_k_norm.weight", "self_attn.k_norm.weight", m->head_dim, 0, 0, m->arch == ARCH_QWEN3},
            {"ffn_norm.weight", "post_attention_layernorm.weight", E, 0, 0, true},
            {"ffn_gate.weight", "mlp.gate_proj.weight", m->n_ff, E, 0, true},
            {"ffn_up.weight", "mlp.up_proj.weight", m->n_ff, E, 0, true},
            {"ffn_down.weight", "mlp.down_proj.weight", E, m->n_ff, 0, true},
        };
        for (size_t i = 0; i < sizeof ts / sizeof ts[0] && !rc; i++) {
            if (!ts[i].want) continue;
            char g[64], h[96];
            snprintf(g, sizeof g, "blk.%d.%s", l, ts[i].gguf);
            snprintf(h, sizeof h, "model.layers.%d.%s", l, ts[i].hf);
            rc = plan(m, g, h, ts[i].rows, ts[i].cols, ts[i].permute, false, err);
        }
    }
    if (rc) return rc;
    /* nothing left unexplained: a tensor we do not map means a model we do not understand */
    for (size_t i = 0; i < m->st.n; i++) {
        const char *n = m->st.t[i].name;
        bool used = strstr(n, "rotary_emb.inv_freq") || (m->tied && !strcmp(n, "lm_head.weight"));
        for (int k = 0; k < m->n_t && !used; k++) used = m->t[k].src == &m->st.t[i];
        if (!used) return hr_fail(err, HR_EUNSUPPORTED, "tensor '%s' has no place in a %s model", n, arch_names[m->arch]);
    }
    return 0;
}

hcv_model *hcv_open(const char *dir, hr_err *err) {
    hcv_model *m = calloc(1, sizeof *m);
    json_t *cfg = NULL;
    if (!m || !(m->dir = strdup(dir)) || !(m->w = gguf_writer_create())) {
        hr_fail(err, HR_ENOMEM, "out of memory");
        goto fail;
    }
    size_t len = strlen(m->dir);
    while (len > 1 && m->dir[len - 1] == '/') m->dir[--len] = 0;
    if (!(cfg = hcv_json_load(m->dir, "config.json", false, 0, err))) goto fail;
    if (!json_is_object(cfg)) { hr_fail(err, HR_EFORMAT, "%s/config.json is not a JSON object", m->dir); goto fail; }
    int rc = 0;
    /* every tensor of a layer, the three outside the layers and rope_freqs */
    int32_t nl = 0;
    if ((rc = cfg_int(cfg, "num_hidden_layers", -1, 1, 4096, &nl, err))) goto fail;
    if (!(m->t = calloc((size_t)nl * 16 + 8, sizeof *m->t))) { hr_fail(err, HR_ENOMEM, "out of memory"); goto fail; }
    if ((rc = read_config(m, cfg, err))) goto fail;
    if ((rc = hcv_st_open_dir(&m->st, m->dir, err))) goto fail;
    if ((rc = plan_tensors(m, err))) goto fail;
    hcv_vocab_info vi = {.n_vocab = m->n_vocab, .bos = -1, .eos = -1};
    json_t *b = json_object_get(cfg, "bos_token_id"), *e = json_object_get(cfg, "eos_token_id");
    if (json_is_integer(b)) vi.bos = (int32_t)json_integer_value(b);
    if (json_is_integer(e)) vi.eos = (int32_t)json_integer_value(e);
    if ((rc = hcv_vocab_add(m->w, m->dir, &vi, err))) goto fail;
    json_decref(cfg);
    return m;
fail:
    json_decref(cfg);
    hcv_free(m);
    return NULL;
}

void hcv_free(hcv_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_t; i++) free(m->t[i].values);
    free(m->t);
    hcv_st_close(&m->st);
    gguf_writer_free(m->w);
    free(m->dir);
    free(m);
}

const char *hcv_arch(const hcv_model *m) { return arch_names[m->arch]; }
int64_t     hcv_n_tensors(const hcv_model *m) { return m->n_t; }

uint64_t hcv_n_elements(const hcv_model *m) {
    uint64_t n = 0;
    for (int i = 0; i < m->n_t; i++) n += (uint64_t)(m->t[i].ne[0] * m->t[i].ne[1]);
    return n;
}

/* ---- writing ------------------------------------------------------------------------------------ */

/* the GGUF type of a tensor: vectors F32, matrices the asked type where its blocks fit the rows */
static int out_type(const plan_tensor *t, int type) {
    if (t->n_dims == 1) return HQ_TYPE_F32;
    return t->ne[0] % hq_get_traits(type)->blck_size ? HQ_TYPE_F16 : type;
}

/* llama.cpp's general.file_type for the 2-D type */
static uint32_t file_type(int type) {
    return type == HQ_TYPE_F32 ? 0 : type == HQ_TYPE_F16 ? 1 : type == HQ_TYPE_Q8_0 ? 7 : 32;
}

/* The source row of output row r. llama's Q and K: Hugging Face orders each head's rows as two
   halves (rotary pairs (i, i + d/2), the "rotate half" form) where GGUF has the pairs adjacent
   ((2i, 2i + 1), the form llama.cpp's rope for llama rotates), so output row 2i + j of a head is
   its row j * d/2 + i. */
static int64_t source_row(const plan_tensor *t, int64_t r) {
    if (!t->permute) return r;
    int64_t d = t->ne[1] / t->permute, h = r / d, k = r % d;
    return h * d + (k % 2) * (d / 2) + k / 2;
}

static int write_tensor(hcv_model *m, const plan_tensor *t, int type, uint8_t *buf, size_t cap, float *row, void *src_row,
                        uint64_t *done, uint64_t total, const hcv_params *p, hr_err *err) {
    int64_t ne0 = t->ne[0], rows = t->ne[1];
    size_t rsz = hq_row_size(type, ne0);
    if (t->values) {  /* computed here */
        int rc = gguf_writer_write_data(m->w, t->values, (size_t)ne0 * sizeof(float), err);
        *done += (uint64_t)ne0;
        return rc;
    }
    const hq_traits *st = hq_get_traits(t->src->dtype), *dt = hq_get_traits(type);
    size_t srsz = (size_t)ne0 * st->type_size;
    int64_t per = (int64_t)(cap / rsz);
    for (int64_t r0 = 0; r0 < rows; r0 += per) {
        if (p->cancel && *p->cancel) return hr_fail(err, HR_EINVAL, "cancelled while writing '%s'", t->name);
        int64_t n = rows - r0 < per ? rows - r0 : per;
        for (int64_t r = r0; r < r0 + n; r++) {
            /* through an aligned copy: safetensors promises no alignment of a tensor's bytes */
            memcpy(src_row, t->src->data + (size_t)source_row(t, r) * srsz, srsz);
            st->to_float(src_row, row, ne0);
            uint8_t *out = buf + (size_t)(r - r0) * rsz;
            if (type == HQ_TYPE_F32) memcpy(out, row, rsz);
            else dt->from_float_ref(row, out, ne0);
        }
        int rc = gguf_writer_write_part(m->w, buf, (size_t)n * rsz, err);
        if (rc) return rc;
        *done += (uint64_t)(n * ne0);
        if (p->progress) p->progress(p->progress_user, *done, total);
    }
    /* the source pages are read once: let the page cache have them back */
    uintptr_t pg = 4096, a = (uintptr_t)t->src->data & ~(pg - 1);
    madvise((void *)a, (uintptr_t)t->src->data + t->src->nbytes - a, MADV_DONTNEED);
    return 0;
}

int hcv_write(const hcv_model *mc, const char *path, const hcv_params *p, hr_err *err) {
    hcv_model *m = (hcv_model *)mc;  /* the writer's state changes; the model's description does not */
    int type = p->type >= 0 ? p->type : m->bf16_source ? HQ_TYPE_BF16 : HQ_TYPE_F16;
    if (type != HQ_TYPE_F32 && type != HQ_TYPE_F16 && type != HQ_TYPE_BF16 && type != HQ_TYPE_Q8_0)
        return hr_fail(err, HR_EINVAL, "hcv_write: type %s is not one convert writes (F32, F16, BF16, Q8_0)", hq_type_name(type));
    int rc = gguf_writer_set_u32(m->w, "general.file_type", file_type(type));
    if (!rc && type == HQ_TYPE_Q8_0) rc = gguf_writer_set_u32(m->w, "general.quantization_version", 2);
    if (rc) return hr_fail(err, HR_ENOMEM, "out of memory");
    int64_t max_ne0 = 1;
    for (int i = 0; i < m->n_t && !rc; i++) {
        rc = gguf_writer_add_tensor(m->w, m->t[i].name, out_type(&m->t[i], type), m->t[i].n_dims, m->t[i].ne, err);
        if (m->t[i].ne[0] > max_ne0) max_ne0 = m->t[i].ne[0];
    }
    if (rc) return rc;
    size_t cap = (size_t)4 << 20;
    if (cap < (size_t)max_ne0 * 4) cap = (size_t)max_ne0 * 4;  /* at least one row of the widest tensor */
    uint8_t *buf = malloc(cap);
    float *row = malloc((size_t)max_ne0 * sizeof *row);
    void *src_row = malloc((size_t)max_ne0 * sizeof(float));
    if (!buf || !row || !src_row) rc = hr_fail(err, HR_ENOMEM, "out of memory");
    if (!rc) rc = gguf_writer_begin(m->w, path, p->overwrite, err);
    uint64_t done = 0, total = hcv_n_elements(m);
    for (int i = 0; i < m->n_t && !rc; i++)
        rc = write_tensor(m, &m->t[i], out_type(&m->t[i], type), buf, cap, row, src_row, &done, total, p, err);
    if (!rc) rc = gguf_writer_finish(m->w, err);
    free(buf);
    free(row);
    free(src_row);
    return rc;
}
