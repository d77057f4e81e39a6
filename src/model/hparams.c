/* model: hyper-parameters to and from key/values (GGUF metadata, LOAD_PLAN text) — see model.h */
#include "model.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

static const char *const hm_arch_names[HM_ARCH_COUNT] = {"llama", "qwen2", "qwen3"};

/* One stored hyper-parameter. gguf: the key after "<arch>.", or a whole key starting with "hearth."
   (a slice file's; a model file tells it by its tensors, so HM_KV_MODEL skips it). plan: the LOAD_PLAN
   key, NULL when a LOAD_PLAN leaves it out. echo: a second key for the field (value_length =
   key_length): written with its value, and when read, must equal it. Without a default the key is
   required. Bounds: lo <= x <= hi for integers, lo < x < hi for floats. */
typedef struct hm_hp_key {
    const char *gguf, *plan;
    size_t      off;
    hm_kv_type  type;
    bool        echo;
    bool        has_def;
    double      def;
    double    (*def_fn)(const hm_hparams *hp);  /* a default that depends on fields read before */
    double      lo, hi;
} hm_hp_key;

static double hm_def_n_head_kv(const hm_hparams *hp) { return hp->n_head; }
static double hm_def_head_dim(const hm_hparams *hp) { return hp->n_embd / hp->n_head; }

#define F(field) offsetof(hm_hparams, field)
static const hm_hp_key hm_hp_keys[] = {
    {"hearth.slice.n_vocab", "n_vocab", F(n_vocab), HM_KV_I32, .lo = 1, .hi = 1 << 24},
    {"embedding_length", "n_embd", F(n_embd), HM_KV_I32, .lo = 1, .hi = 1 << 24},
    {"block_count", "n_layer", F(n_layer), HM_KV_I32, .lo = 1, .hi = 4096},
    {"attention.head_count", "n_head", F(n_head), HM_KV_I32, .lo = 1, .hi = 1 << 24},
    {"attention.head_count_kv", "n_head_kv", F(n_head_kv), HM_KV_I32, .has_def = true, .def_fn = hm_def_n_head_kv,
     .lo = 1, .hi = 1 << 24},
    {"attention.key_length", "head_dim", F(head_dim), HM_KV_I32, .has_def = true, .def_fn = hm_def_head_dim,
     .lo = 1, .hi = 1024},
    {"attention.value_length", NULL, F(head_dim), HM_KV_I32, .echo = true, .lo = 1, .hi = 1024},
    {"feed_forward_length", "n_ff", F(n_ff), HM_KV_I32, .lo = 1, .hi = 1 << 24},
    {"context_length", "n_ctx_train", F(n_ctx_train), HM_KV_I32, .has_def = true, .def = 4096, .lo = 1,
     .hi = 1 << 30},
    {"attention.layer_norm_rms_epsilon", "rms_eps", F(rms_eps), HM_KV_F32, .lo = 0, .hi = 1},
    {"rope.freq_base", "rope_base", F(rope_base), HM_KV_F32, .has_def = true, .def = 10000, .lo = 1, .hi = 1e30},
    {"hearth.slice.qkv_bias", "qkv_bias", F(has_qkv_bias), HM_KV_BOOL, .lo = 0, .hi = 1},
    {"hearth.slice.qk_norm", "qk_norm", F(has_qk_norm), HM_KV_BOOL, .lo = 0, .hi = 1},
};
#undef F

/* The key's name in io's form, or NULL where that form does not store it. */
static const char *hm_hp_name(const hm_hp_key *k, const char *arch, hm_kv_form form, char *buf, size_t cap) {
    bool own = !strncmp(k->gguf, "hearth.", 7);
    if (form == HM_KV_PLAN) return k->plan;
    if (own) return form == HM_KV_MODEL ? NULL : k->gguf;
    int n = snprintf(buf, cap, "%s.%s", arch, k->gguf);
    HR_ASSERT(n > 0 && (size_t)n < cap);   /* arch names are short (hm_hparams.arch_name) */
    return buf;
}

/* the (first) key of a field */
static const hm_hp_key *hm_hp_key_of(size_t off) {
    for (size_t i = 0; i < HR_ARRAY_LEN(hm_hp_keys); i++)
        if (hm_hp_keys[i].off == off) return &hm_hp_keys[i];
    HR_ASSERT(0);
    return NULL;
}

static hm_kv_val hm_hp_field(const hm_hparams *hp, const hm_hp_key *k) {
    const char *p = (const char *)hp + k->off;
    hm_kv_val v = {0};
    if (k->type == HM_KV_I32) v.i = *(const int32_t *)p;
    else if (k->type == HM_KV_F32) v.f = *(const float *)p;
    else v.b = *(const bool *)p;
    return v;
}

static void hm_hp_store(hm_hparams *hp, const hm_hp_key *k, hm_kv_val v) {
    char *p = (char *)hp + k->off;
    if (k->type == HM_KV_I32) *(int32_t *)p = (int32_t)v.i;
    else if (k->type == HM_KV_F32) *(float *)p = v.f;
    else *(bool *)p = v.b;
}

static bool hm_hp_in_range(const hm_hp_key *k, hm_kv_val v) {
    if (k->type == HM_KV_I32) return v.i >= (int64_t)k->lo && v.i <= (int64_t)k->hi;
    if (k->type == HM_KV_F32) return v.f > k->lo && v.f < k->hi;   /* false for NaN */
    return true;
}

/* One key from io into its field of hp: its default when absent, bounds checked. */
static int hm_hp_read(hm_hparams *hp, const hm_hp_key *k, const char *name, const char *what, const hm_kv_io *io,
                      hr_err *err) {
    hm_kv_val v = {0};
    int got = io->get(io->user, name, k->type, &v);
    if (got < 0)
        return hr_fail(err, HR_EFORMAT, "%s '%s' is not %s", what, name,
                       k->type == HM_KV_I32 ? "an integer" : k->type == HM_KV_F32 ? "a number" : "a bool");
    if (k->echo) {
        if (got && v.i != hm_hp_field(hp, k).i)
            return hr_fail(err, HR_EUNSUPPORTED, "%s '%s' = %lld differs from the key length %d: not supported",
                           what, name, (long long)v.i, hp->head_dim);
        return 0;
    }
    if (!got && !k->has_def) return hr_fail(err, HR_EFORMAT, "missing %s '%s'", what, name);
    if (!got && k->type == HM_KV_F32) v.f = (float)k->def;
    else if (!got) v.i = (int64_t)(k->def_fn ? k->def_fn(hp) : k->def);
    if (!hm_hp_in_range(k, v)) {
        if (k->type == HM_KV_F32)
            return hr_fail(err, HR_EFORMAT, "%s '%s' = %g is out of range (%g, %g)", what, name, v.f, k->lo, k->hi);
        return hr_fail(err, HR_EFORMAT, "%s '%s' = %lld is out of range [%.0f, %.0f]", what, name, (long long)v.i,
                       k->lo, k->hi);
    }
    hm_hp_store(hp, k, v);
    return 0;
}

int hm_hparams_to_kv(const hm_hparams *hp, const hm_kv_io *io, hr_err *err) {
    char buf[128];
    for (size_t i = 0; i < HR_ARRAY_LEN(hm_hp_keys); i++) {
        const hm_hp_key *k = &hm_hp_keys[i];
        const char *name = hm_hp_name(k, hp->arch_name, io->form, buf, sizeof buf);
        if (!name) continue;
        int rc = io->set(io->user, name, k->type, hm_hp_field(hp, k));
        if (rc) return hr_fail(err, rc, "writing hyper-parameter '%s' failed", name);
    }
    return 0;
}

int hm_hparams_from_kv(hm_hparams *hp, const char *arch, const hm_kv_io *io, hr_err *err) {
    memset(hp, 0, sizeof *hp);
    int a = -1;
    for (int i = 0; i < HM_ARCH_COUNT; i++)
        if (!strcmp(arch, hm_arch_names[i])) a = i;
    if (a < 0)
        return hr_fail(err, HR_EUNSUPPORTED, "architecture '%s' is not supported (supported: llama, qwen2, qwen3)",
                       arch);
    hp->arch = (hm_arch)a;
    snprintf(hp->arch_name, sizeof hp->arch_name, "%s", arch);
    hp->rope_neox = hp->arch == HM_ARCH_QWEN2 || hp->arch == HM_ARCH_QWEN3;
    const char *what = io->form == HM_KV_PLAN ? "parameter" : "metadata key";
    char buf[128];
    for (size_t i = 0; i < HR_ARRAY_LEN(hm_hp_keys); i++) {
        const hm_hp_key *k = &hm_hp_keys[i];
        const char *name = hm_hp_name(k, arch, io->form, buf, sizeof buf);
        if (!name) continue;
        int rc = hm_hp_read(hp, k, name, what, io, err);
        if (rc) return rc;
    }
    char b2[128];
    if (hp->n_head % hp->n_head_kv != 0)
        return hr_fail(err, HR_EFORMAT, "%s '%s' = %d is not a multiple of '%s' = %d", what,
                       hm_hp_name(hm_hp_key_of(offsetof(hm_hparams, n_head)), arch, io->form, buf, sizeof buf),
                       hp->n_head,
                       hm_hp_name(hm_hp_key_of(offsetof(hm_hparams, n_head_kv)), arch, io->form, b2, sizeof b2),
                       hp->n_head_kv);
    if (hp->head_dim % 2 != 0)
        return hr_fail(err, HR_EFORMAT, "%s '%s' = %d: the head dimension must be even", what,
                       hm_hp_name(hm_hp_key_of(offsetof(hm_hparams, head_dim)), arch, io->form, buf, sizeof buf),
                       hp->head_dim);
    return 0;
}

/* ---- GGUF adapters ---- */

static int hm_gguf_get(void *user, const char *key, hm_kv_type type, hm_kv_val *v) {
    const gguf_ctx *g = user;
    if (gguf_find_key(g, key) < 0) return 0;
    bool ok = type == HM_KV_I32 ? gguf_get_i64(g, key, &v->i)
            : type == HM_KV_F32 ? gguf_get_f32(g, key, &v->f)
                                : gguf_get_bool(g, key, &v->b);
    return ok ? 1 : HR_EFORMAT;
}

static int hm_gguf_set(void *user, const char *key, hm_kv_type type, hm_kv_val v) {
    gguf_writer *w = user;
    if (type == HM_KV_I32) return v.i < 0 || v.i > UINT32_MAX ? HR_ERANGE : gguf_writer_set_u32(w, key, (uint32_t)v.i);
    if (type == HM_KV_F32) return gguf_writer_set_f32(w, key, v.f);
    return gguf_writer_set_bool(w, key, v.b);
}

hm_kv_io hm_kv_gguf_reader(const gguf_ctx *g, hm_kv_form form) {
    /* get only reads: the const is dropped for the generic user pointer */
    return (hm_kv_io){.form = form, .user = (void *)g, .get = hm_gguf_get};
}

hm_kv_io hm_kv_gguf_writer(gguf_writer *w, hm_kv_form form) {
    return (hm_kv_io){.form = form, .user = w, .set = hm_gguf_set};
}

/* ---- text ---- */

void hm_kv_format(char *buf, size_t cap, hm_kv_type type, hm_kv_val v) {
    if (type == HM_KV_I32) snprintf(buf, cap, "%lld", (long long)v.i);
    else if (type == HM_KV_F32) snprintf(buf, cap, "%.9g", v.f);
    else snprintf(buf, cap, "%d", v.b ? 1 : 0);
}

bool hm_kv_parse(const char *s, size_t n, hm_kv_type type, hm_kv_val *v) {
    char b[64];
    if (n == 0 || n >= sizeof b) return false;
    memcpy(b, s, n);
    b[n] = 0;
    /* strtof/strtoull would skip spaces and take a sign */
    if (memchr(b, 0, n) || !((b[0] >= '0' && b[0] <= '9') || b[0] == '.')) return false;
    char *end;
    errno = 0;
    if (type == HM_KV_F32) {
        float x = strtof(b, &end);
        if (errno || *end) return false;
        v->f = x;
        return true;
    }
    unsigned long long x = strtoull(b, &end, 10);
    if (errno || *end || x > INT64_MAX || (type == HM_KV_BOOL && x > 1)) return false;
    if (type == HM_KV_BOOL) v->b = x == 1;
    else v->i = (int64_t)x;
    return true;
}
