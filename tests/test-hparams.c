// modules: base quant gguf model
/* test-hparams: the hyper-parameter codec (model.h, hparams.c).
 * - round trips hparams -> key/values -> hparams for the llama, qwen2 and qwen3 synth models, as
 *   LOAD_PLAN text and as a slice file's GGUF metadata (written and read back);
 * - what must be refused, from the wire and from a file: a missing required key, a value out of range
 *   or not a number, n_head not a multiple of n_head_kv, an odd head size, an unknown architecture. */
#include "test.h"

#include "gguf/gguf.h"
#include "model/model.h"

#include <unistd.h>

/* a LOAD_PLAN's params: text key/values, through the codec's text form */
typedef struct text_kv { char key[64][64], val[64][64]; int n; } text_kv;

static int text_set(void *user, const char *key, hm_kv_type type, hm_kv_val v) {
    text_kv *t = user;
    if (t->n == 64) return HR_ERANGE;
    snprintf(t->key[t->n], sizeof t->key[0], "%s", key);
    hm_kv_format(t->val[t->n], sizeof t->val[0], type, v);
    t->n++;
    return 0;
}

static char *text_find(text_kv *t, const char *key) {
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->key[i], key)) return t->val[i];
    return NULL;
}

static int text_get(void *user, const char *key, hm_kv_type type, hm_kv_val *v) {
    const char *s = text_find(user, key);
    if (!s) return 0;
    return hm_kv_parse(s, strlen(s), type, v) ? 1 : HR_EFORMAT;
}

static void text_remove(text_kv *t, const char *key) {
    char *v = text_find(t, key);
    if (v) t->key[(v - t->val[0]) / sizeof t->val[0]][0] = 0;
}

static hm_kv_io text_io(text_kv *t) { return (hm_kv_io){.form = HM_KV_PLAN, .user = t, .get = text_get, .set = text_set}; }

/* the fields the codec carries (not name, tied_output, has_rope_freqs: a model file's own) */
static bool same_hparams(const hm_hparams *a, const hm_hparams *b) {
    return a->arch == b->arch && !strcmp(a->arch_name, b->arch_name) && a->n_vocab == b->n_vocab &&
           a->n_embd == b->n_embd && a->n_layer == b->n_layer && a->n_head == b->n_head &&
           a->n_head_kv == b->n_head_kv && a->head_dim == b->head_dim && a->n_ff == b->n_ff &&
           a->n_ctx_train == b->n_ctx_train && a->rms_eps == b->rms_eps && a->rope_base == b->rope_base &&
           a->rope_neox == b->rope_neox && a->has_qkv_bias == b->has_qkv_bias && a->has_qk_norm == b->has_qk_norm;
}

/* a GGUF writer's store that leaves out one key, or writes another one's value doubled */
static hm_kv_io file_io;
static const char *file_skip, *file_double;
static int skip_set(void *user, const char *key, hm_kv_type type, hm_kv_val v) {
    if (file_double && !strcmp(key, file_double)) v.i *= 2;
    return file_skip && !strcmp(key, file_skip) ? 0 : file_io.set(user, key, type, v);
}

/* hp as a slice file's metadata (form HM_KV_SLICE, no tensors; without key file_skip) at path */
static int write_meta(const char *path, const hm_hparams *hp, hr_err *err) {
    gguf_writer *w = gguf_writer_create();
    file_io = hm_kv_gguf_writer(w, HM_KV_SLICE);
    hm_kv_io io = file_io;
    io.set = skip_set;
    int rc = gguf_writer_set_str(w, "general.architecture", hp->arch_name);
    if (!rc) rc = gguf_writer_set_u32(w, "hearth.slice.n_ff", 0);
    if (!rc) rc = hm_hparams_to_kv(hp, &io, err);
    if (!rc) rc = gguf_writer_begin(w, path, true, err);
    if (!rc) rc = gguf_writer_finish(w, err);
    gguf_writer_free(w);
    return rc;
}

/* hp written as a slice file's metadata and read back by the loader: 0 and *out, or its error */
static int file_round_trip(const hm_hparams *hp, hm_hparams *out, hr_err *err) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/test-hparams.%ld.gguf", (long)getpid());
    int rc = write_meta(path, hp, err);
    gguf_ctx *g = rc ? NULL : gguf_open(path, err);
    if (!rc && !g) rc = err->code;
    if (g) rc = hm_hparams_load(g, out, err);
    gguf_close(g);
    unlink(path);
    return rc;
}

static void test_round_trip(const char *shared, const char *model, hm_hparams *keep) {
    hr_err err = {0};
    gguf_ctx *g = gguf_open(test_path(shared, model), &err);
    REQUIRE_VOID(g);
    hm_hparams hp, back;
    CHECKF(hm_hparams_load(g, &hp, &err) == 0, "%s: %s", model, err.msg);
    gguf_close(g);
    *keep = hp;
    /* LOAD_PLAN text: every key the head used to send, no more */
    text_kv t = {0};
    hm_kv_io io = text_io(&t);
    CHECK(hm_hparams_to_kv(&hp, &io, &err) == 0);
    CHECKF(t.n == 12 && text_find(&t, "n_embd") && text_find(&t, "rms_eps") && text_find(&t, "qk_norm"), "%d keys",
           t.n);
    CHECKF(hm_hparams_from_kv(&back, hp.arch_name, &io, &err) == 0, "%s: %s", model, err.msg);
    CHECKF(same_hparams(&hp, &back), "%s: the LOAD_PLAN round trip differs", model);
    /* a slice file's metadata */
    memset(&back, 0, sizeof back);
    CHECKF(file_round_trip(&hp, &back, &err) == 0, "%s: %s", model, err.msg);
    CHECKF(same_hparams(&hp, &back), "%s: the slice metadata round trip differs", model);
}

/* a plan from hp with key set to val (NULL: left out); the error from_kv gives, or 0 */
static int plan_with(const hm_hparams *hp, const char *arch, const char *key, const char *val, hr_err *err) {
    text_kv t = {0};
    hm_kv_io io = text_io(&t);
    hm_hparams out;
    if (hm_hparams_to_kv(hp, &io, err)) return -1000;
    if (!val) text_remove(&t, key);
    else if (text_find(&t, key)) snprintf(text_find(&t, key), sizeof t.val[0], "%s", val);
    memset(err, 0, sizeof *err);
    return hm_hparams_from_kv(&out, arch, &io, err);
}

static void test_rejects(const hm_hparams *hp) {
    hr_err err = {0};
    struct { const char *key, *val, *says; int code; } cases[] = {
        {"n_embd", NULL, "missing parameter 'n_embd'", HR_EFORMAT},
        {"rms_eps", NULL, "missing parameter 'rms_eps'", HR_EFORMAT},
        {"n_layer", "5000", "'n_layer' = 5000 is out of range", HR_EFORMAT},
        {"n_vocab", "0", "'n_vocab' = 0 is out of range", HR_EFORMAT},
        {"head_dim", "2048", "'head_dim' = 2048 is out of range", HR_EFORMAT},
        {"rms_eps", "1.5", "'rms_eps' = 1.5 is out of range", HR_EFORMAT},
        {"rope_base", "nan", "'rope_base'", HR_EFORMAT},
        {"n_head_kv", "3", "'n_head' = 4 is not a multiple of 'n_head_kv' = 3", HR_EFORMAT},
        {"head_dim", "63", "'head_dim' = 63: the head dimension must be even", HR_EFORMAT},
        {"n_embd", "12a", "'n_embd' is not an integer", HR_EFORMAT},
        {"n_embd", "-512", "'n_embd' is not an integer", HR_EFORMAT},
        {"n_embd", " 512", "'n_embd' is not an integer", HR_EFORMAT},
        {"qkv_bias", "2", "'qkv_bias' is not a bool", HR_EFORMAT},
        {"rms_eps", "1e-5x", "'rms_eps' is not a number", HR_EFORMAT},
    };
    for (size_t i = 0; i < HR_ARRAY_LEN(cases); i++) {
        int rc = plan_with(hp, hp->arch_name, cases[i].key, cases[i].val, &err);
        CHECKF(rc == cases[i].code && strstr(err.msg, cases[i].says), "%s = %s: %d '%s'", cases[i].key,
               cases[i].val ? cases[i].val : "(none)", rc, err.msg);
    }
    CHECK(plan_with(hp, "gpt2", "n_embd", "512", &err) == HR_EUNSUPPORTED && strstr(err.msg, "'gpt2'"));
    /* optional keys take their defaults: n_head_kv = n_head, n_ctx_train = 4096 */
    text_kv t = {0};
    hm_kv_io io = text_io(&t);
    hm_hparams out;
    CHECK(hm_hparams_to_kv(hp, &io, &err) == 0);
    text_remove(&t, "n_head_kv");
    text_remove(&t, "n_ctx_train");
    CHECK(hm_hparams_from_kv(&out, hp->arch_name, &io, &err) == 0 && out.n_head_kv == out.n_head &&
          out.n_ctx_train == 4096);

    /* the same checks on a file's metadata, naming its keys */
    hm_hparams bad = *hp;
    bad.n_head_kv = 3;
    CHECK(file_round_trip(&bad, &out, &err) == HR_EFORMAT &&
          strstr(err.msg, "'llama.attention.head_count' = 4 is not a multiple of 'llama.attention.head_count_kv' = 3"));
    bad = *hp;
    bad.n_layer = 100000;
    CHECK(file_round_trip(&bad, &out, &err) == HR_EFORMAT &&
          strstr(err.msg, "metadata key 'llama.block_count' = 100000 is out of range"));
    file_skip = "llama.attention.layer_norm_rms_epsilon";
    CHECK(file_round_trip(hp, &out, &err) == HR_EFORMAT &&
          strstr(err.msg, "missing metadata key 'llama.attention.layer_norm_rms_epsilon'"));
    file_skip = "llama.attention.head_count_kv";   /* optional: n_head */
    CHECK(file_round_trip(hp, &out, &err) == 0 && out.n_head_kv == out.n_head);
    file_skip = NULL;
    file_double = "llama.attention.value_length";
    CHECK(file_round_trip(hp, &out, &err) == HR_EUNSUPPORTED && strstr(err.msg, "'llama.attention.value_length'"));
    file_double = NULL;
    bad = *hp;
    bad.n_vocab = 0;
    CHECK(file_round_trip(&bad, &out, &err) == HR_EFORMAT && strstr(err.msg, "'hearth.slice.n_vocab' = 0"));
}

static void test_text(void) {
    /* "%.9g" gives a float back bit for bit */
    const float fs[] = {1e-5f, 1e-6f, 9.99999975e-06f, 10000.0f, 500000.0f, 1.0f / 3, 3.4e38f};
    for (size_t i = 0; i < HR_ARRAY_LEN(fs); i++) {
        char b[64];
        hm_kv_val v = {.f = fs[i]}, w = {0};
        hm_kv_format(b, sizeof b, HM_KV_F32, v);
        CHECKF(hm_kv_parse(b, strlen(b), HM_KV_F32, &w) && w.f == fs[i], "%s", b);
    }
    hm_kv_val v;
    CHECK(hm_kv_parse("288", 3, HM_KV_I32, &v) && v.i == 288);
    CHECK(hm_kv_parse("2889", 3, HM_KV_I32, &v) && v.i == 288);   /* the length given, not the NUL */
    CHECK(!hm_kv_parse("", 0, HM_KV_I32, &v));
    CHECK(!hm_kv_parse("+1", 2, HM_KV_I32, &v));
    CHECK(!hm_kv_parse("99999999999999999999", 20, HM_KV_I32, &v));
    CHECK(hm_kv_parse("1", 1, HM_KV_BOOL, &v) && v.b);
    CHECK(hm_kv_parse("0", 1, HM_KV_BOOL, &v) && !v.b);
}

int main(void) {
    const char *shared = test_shared_dir();
    hm_hparams llama, other;
    test_round_trip(shared, "models/synth/synth-llama-Q8_0.gguf", &llama);
    test_round_trip(shared, "models/synth/synth-qwen2-Q8_0.gguf", &other);
    CHECK(other.has_qkv_bias && other.rope_neox);
    test_round_trip(shared, "models/synth/synth-qwen3-Q8_0.gguf", &other);
    CHECK(other.has_qk_norm && other.rope_neox);
    test_round_trip(shared, "models/stories260K.gguf", &other);
    test_rejects(&llama);
    test_text();
    return test_summary();
}
