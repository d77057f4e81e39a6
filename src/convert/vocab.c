/* tokenizer.json -> tokenizer.ggml.*: the two kinds of BPE tokenizer hearth (and llama.cpp) run.
   - SentencePiece-style BPE (Llama 2, Mistral, TinyStories models: '▁' for spaces, byte fallback):
     tokenizer.ggml.model "llama". llama.cpp's tokenizer for it merges the adjacent pair whose joined
     text is the token of highest score, so each token's score is minus the rank of the merge that
     makes it, and that order of merges is tokenizer.json's. (llama.cpp's converter gives every
     token -1000 here, which leaves the merge order to position alone.) A token no merge makes gets
     the lowest score: BPE never produces it.
   - Byte-level BPE (Qwen2/3, Llama 3): tokenizer.ggml.model "gpt2" with the merges as they are and
     tokenizer.ggml.pre naming the pre-tokenizer, recognised by its regex.
   Special tokens come from tokenizer_config.json (or config.json's ids), the chat template from
   tokenizer_config.json or chat_template.jinja. */
#include "convert-impl.h"

#include <errno.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

/* pre-tokenizer regexes of the byte-level tokenizers hearth runs, and llama.cpp's names for them */
static const struct { const char *pre, *regex; } known_pres[] = {
    {"qwen2", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
              "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {"llama-bpe", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                  "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
};

typedef struct vocab {
    int32_t n;
    char  **text;     /* [n], owned */
    float  *score;    /* [n] */
    int32_t *type;    /* [n] */
    struct ventry { const char *text; int32_t id; } *sorted;  /* [n] by text, then id: find_token */
} vocab;

/* true if the JSON component (a normalizer, pre-tokenizer or decoder, or a Sequence of them) has
   a part of this type; with field/value, one whose field equals value */
static bool has_part(json_t *j, const char *type) {
    if (!json_is_object(j)) return false;
    const char *t = json_string_value(json_object_get(j, "type"));
    if (t && !strcmp(t, type)) return true;
    const char *lists[] = {"normalizers", "pretokenizers", "decoders"};
    for (int k = 0; k < 3; k++) {
        json_t *a = json_object_get(j, lists[k]), *e;
        size_t i;
        json_array_foreach(a, i, e) if (has_part(e, type)) return true;
    }
    return false;
}

static json_t *find_part(json_t *j, const char *type) {
    if (!json_is_object(j)) return NULL;
    const char *t = json_string_value(json_object_get(j, "type"));
    if (t && !strcmp(t, type)) return j;
    json_t *a = json_object_get(j, "pretokenizers"), *e;
    size_t i;
    json_array_foreach(a, i, e) {
        json_t *r = find_part(e, type);
        if (r) return r;
    }
    return NULL;
}

static int set_token(vocab *v, int64_t id, const char *text, int type, hr_err *err) {
    if (id < 0 || id >= v->n)
        return hr_fail(err, HR_EFORMAT, "tokenizer.json: token '%s' has id %lld, outside the model's vocabulary of %d",
                       text, (long long)id, v->n);
    char *s = strdup(text);
    if (!s) return hr_fail(err, HR_ENOMEM, "out of memory");
    free(v->text[id]);
    v->text[id] = s;
    v->type[id] = type;
    return 0;
}

static int by_text(const void *a, const void *b) {
    const struct ventry *x = a, *y = b;
    int c = strcmp(x->text, y->text);
    return c ? c : (x->id > y->id) - (x->id < y->id);
}

/* the id of a token's text (the lowest id where two tokens share a text); -1 if none */
static int32_t find_token(const vocab *v, const char *text) {
    int32_t lo = 0, hi = v->n;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (strcmp(v->sorted[mid].text, text) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo < v->n && !strcmp(v->sorted[lo].text, text) ? v->sorted[lo].id : -1;
}

/* a merge: "a b" (older files) or ["a", "b"]; the two halves into a and b */
static bool merge_parts(json_t *m, const char **a, size_t *na, const char **b) {
    if (json_is_string(m)) {
        const char *s = json_string_value(m), *sp = strchr(s, ' ');
        if (!sp || sp == s || !sp[1]) return false;
        *a = s, *na = (size_t)(sp - s), *b = sp + 1;
        return true;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0)), *na = strlen(*a), *b = json_string_value(json_array_get(m, 1));
        return true;
    }
    return false;
}

/* tokenizer_config.json's token: "text" or {"content": "text", ...} */
static const char *token_content(json_t *j) {
    if (json_is_string(j)) return json_string_value(j);
    return json_string_value(json_object_get(j, "content"));
}

static int add_specials(gguf_writer *w, const vocab *v, json_t *tcfg, const hcv_vocab_info *vi, hr_err *err) {
    static const struct { const char *field, *key; } sp[] = {
        {"bos_token", "tokenizer.ggml.bos_token_id"}, {"eos_token", "tokenizer.ggml.eos_token_id"},
        {"unk_token", "tokenizer.ggml.unknown_token_id"}, {"pad_token", "tokenizer.ggml.padding_token_id"}};
    for (size_t k = 0; k < sizeof sp / sizeof sp[0]; k++) {
        int32_t id = k == 0 ? vi->bos : k == 1 ? vi->eos : -1;
        const char *text = token_content(json_object_get(tcfg, sp[k].field));
        if (text) {
            int32_t t = find_token(v, text);
            if (t < 0) return hr_fail(err, HR_EFORMAT, "tokenizer_config.json: %s '%s' is not a token", sp[k].field, text);
            id = t;
        }
        if (id >= v->n) return hr_fail(err, HR_EFORMAT, "config.json: %s id %d is outside the vocabulary", sp[k].field, id);
        if (id >= 0 && gguf_writer_set_u32(w, sp[k].key, (uint32_t)id)) return hr_fail(err, HR_ENOMEM, "out of memory");
    }
    const char *flags[][2] = {{"add_bos_token", "tokenizer.ggml.add_bos_token"}, {"add_eos_token", "tokenizer.ggml.add_eos_token"}};
    for (int k = 0; k < 2; k++) {
        json_t *b = json_object_get(tcfg, flags[k][0]);
        if (json_is_boolean(b) && gguf_writer_set_bool(w, flags[k][1], json_is_true(b)))
            return hr_fail(err, HR_ENOMEM, "out of memory");
    }
    return 0;
}

/* tokenizer_config.json's chat_template (a string, or a list of {name, template}: "default"), or
   chat_template.jinja beside it */
static int add_chat_template(gguf_writer *w, const char *dir, json_t *tcfg, hr_err *err) {
    json_t *ct = json_object_get(tcfg, "chat_template"), *e;
    const char *tmpl = json_string_value(ct);
    size_t i;
    json_array_foreach(ct, i, e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        if (name && !strcmp(name, "default")) tmpl = json_string_value(json_object_get(e, "template"));
    }
    if (tmpl) return gguf_writer_set_str(w, "tokenizer.chat_template", tmpl) ? hr_fail(err, HR_ENOMEM, "out of memory") : 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;  /* a base model has none */
    char *buf = NULL;
    size_t n = 0, cap = 0, r;
    do {
        if (n + 4096 + 1 > cap) {
            char *nb = realloc(buf, cap = cap * 2 + 8192);
            if (!nb) { free(buf); fclose(f); return hr_fail(err, HR_ENOMEM, "out of memory"); }
            buf = nb;
        }
        n += (r = fread(buf + n, 1, 4096, f));
    } while (r > 0 && n < (1u << 24));
    fclose(f);
    buf[n] = 0;
    int rc = gguf_writer_set_str(w, "tokenizer.chat_template", buf) ? hr_fail(err, HR_ENOMEM, "out of memory") : 0;
    free(buf);
    return rc;
}

static int write_vocab(gguf_writer *w, const vocab *v, bool scores, hr_err *err) {
    gguf_str *strs = malloc((size_t)v->n * sizeof *strs);
    if (!strs) return hr_fail(err, HR_ENOMEM, "out of memory");
    for (int32_t i = 0; i < v->n; i++) strs[i] = (gguf_str){.n = strlen(v->text[i]), .s = v->text[i]};
    int rc = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, (uint64_t)v->n);
    free(strs);
    if (!rc && scores) rc = gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, v->score, (uint64_t)v->n);
    if (!rc) rc = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, v->type, (uint64_t)v->n);
    return rc ? hr_fail(err, HR_ENOMEM, "out of memory") : 0;
}

/* the merges as "a b" strings (byte-level BPE) */
static int write_merges(gguf_writer *w, json_t *merges, hr_err *err) {
    size_t n = json_array_size(merges), i;
    gguf_str *strs = calloc(n ? n : 1, sizeof *strs);
    char **own = calloc(n ? n : 1, sizeof *own);
    int rc = strs && own ? 0 : hr_fail(err, HR_ENOMEM, "out of memory");
    json_t *m;
    json_array_foreach(merges, i, m) {
        if (rc) break;
        const char *a, *b;
        size_t na;
        if (!merge_parts(m, &a, &na, &b)) { rc = hr_fail(err, HR_EFORMAT, "tokenizer.json: merge %zu is malformed", i); break; }
        size_t len = na + 1 + strlen(b);
        if (!(own[i] = malloc(len + 1))) { rc = hr_fail(err, HR_ENOMEM, "out of memory"); break; }
        snprintf(own[i], len + 1, "%.*s %s", (int)na, a, b);
        strs[i] = (gguf_str){.n = len, .s = own[i]};
    }
    if (!rc && gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", strs, n)) rc = hr_fail(err, HR_ENOMEM, "out of memory");
    for (size_t k = 0; own && k < n; k++) free(own[k]);
    free(own);
    free(strs);
    return rc;
}

/* SentencePiece-style scores from the merge ranks (see the top of this file) */
static int spm_scores(vocab *v, json_t *merges, hr_err *err) {
    for (int32_t i = 0; i < v->n; i++) v->score[i] = -1e9f;  /* byte, control and added tokens too: no merge makes them */
    /* a single character (one UTF-8 sequence) is where merging starts: score 0 */
    for (int32_t i = 0; i < v->n; i++) {
        const unsigned char *s = (const unsigned char *)v->text[i];
        size_t len = strlen(v->text[i]), cl = s[0] < 0x80 ? 1 : s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : 2;
        if (len == cl) v->score[i] = 0;
    }
    size_t i, cap = 256;
    char *buf = malloc(cap);
    if (!buf) return hr_fail(err, HR_ENOMEM, "out of memory");
    json_t *m;
    json_array_foreach(merges, i, m) {
        const char *a, *b;
        size_t na;
        if (!merge_parts(m, &a, &na, &b)) { free(buf); return hr_fail(err, HR_EFORMAT, "tokenizer.json: merge %zu is malformed", i); }
        size_t len = na + strlen(b);
        if (len + 1 > cap) {
            char *nb = realloc(buf, cap = len + 1);
            if (!nb) { free(buf); return hr_fail(err, HR_ENOMEM, "out of memory"); }
            buf = nb;
        }
        snprintf(buf, len + 1, "%.*s%s", (int)na, a, b);
        int32_t id = find_token(v, buf);
        if (id < 0) {
            hr_fail(err, HR_EFORMAT, "tokenizer.json: merge %zu makes '%s', not a token", i, buf);
            free(buf);
            return err->code;
        }
        if (v->score[id] == -1e9f) v->score[id] = -(float)(i + 1);  /* the first merge that makes it */
    }
    free(buf);
    return 0;
}

int hcv_vocab_add(gguf_writer *w, const char *dir, const hcv_vocab_info *vi, hr_err *err) {
    json_t *tok = hcv_json_load(dir, "tokenizer.json", false, 0, err);
    if (!tok) return err->code;
    /* model_max_length is often 1e30 written as an integer; nothing read from this file is one */
    json_t *tcfg = hcv_json_load(dir, "tokenizer_config.json", true, JSON_DECODE_INT_AS_REAL, err);
    if (!tcfg && err->code) { json_decref(tok); return err->code; }
    vocab v = {.n = vi->n_vocab};
    v.text = calloc((size_t)v.n, sizeof *v.text);
    v.score = calloc((size_t)v.n, sizeof *v.score);
    v.type = calloc((size_t)v.n, sizeof *v.type);
    int rc = v.text && v.score && v.type ? 0 : hr_fail(err, HR_ENOMEM, "out of memory");

    json_t *model = json_object_get(tok, "model"), *vmap = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges"), *pre = json_object_get(tok, "pre_tokenizer");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!rc && (!mtype || strcmp(mtype, "BPE")))
        rc = hr_fail(err, HR_EUNSUPPORTED, "tokenizer.json: a %s tokenizer; only BPE tokenizers are converted",
                     mtype ? mtype : "model-less");
    if (!rc && (!json_is_object(vmap) || !json_is_array(merges)))
        rc = hr_fail(err, HR_EFORMAT, "tokenizer.json: the BPE model has no vocab or no merges");
    bool byte_level = has_part(pre, "ByteLevel");
    bool spm = !byte_level && (json_is_true(json_object_get(model, "byte_fallback")) ||
                               has_part(json_object_get(tok, "decoder"), "ByteFallback") || has_part(pre, "Metaspace"));
    if (!rc && !byte_level && !spm)
        rc = hr_fail(err, HR_EUNSUPPORTED, "tokenizer.json: neither a byte-level nor a SentencePiece-style BPE tokenizer");

    const char *key;
    json_t *val, *e;
    size_t i;
    json_object_foreach(vmap, key, val) {
        if (rc) break;
        if (!json_is_integer(val)) { rc = hr_fail(err, HR_EFORMAT, "tokenizer.json: token '%s' has no integer id", key); break; }
        int type = TT_NORMAL;
        size_t len = strlen(key);
        if (spm && len == 6 && !strncmp(key, "<0x", 3) && key[5] == '>') type = TT_BYTE;
        rc = set_token(&v, json_integer_value(val), key, type, err);
    }
    json_array_foreach(json_object_get(tok, "added_tokens"), i, e) {
        if (rc) break;
        const char *content = json_string_value(json_object_get(e, "content"));
        json_t *id = json_object_get(e, "id");
        if (!content || !json_is_integer(id)) { rc = hr_fail(err, HR_EFORMAT, "tokenizer.json: added token %zu is malformed", i); break; }
        rc = set_token(&v, json_integer_value(id), content, json_is_true(json_object_get(e, "special")) ? TT_CONTROL : TT_USER, err);
    }
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    for (int32_t k = 0; !rc && k < v.n; k++) {
        if (v.text[k]) {
            if (unk && !strcmp(v.text[k], unk)) v.type[k] = TT_UNKNOWN;
            continue;
        }
        char pad[32];
        snprintf(pad, sizeof pad, "[PAD%d]", k);  /* ids the tokenizer leaves out, as llama.cpp names them */
        rc = set_token(&v, k, pad, TT_UNUSED, err);
    }

    if (!rc && !(v.sorted = malloc((size_t)v.n * sizeof *v.sorted))) rc = hr_fail(err, HR_ENOMEM, "out of memory");
    if (!rc) {
        for (int32_t k = 0; k < v.n; k++) v.sorted[k] = (struct ventry){v.text[k], k};
        qsort(v.sorted, (size_t)v.n, sizeof *v.sorted, by_text);
    }
    if (!rc && spm) {
        rc = spm_scores(&v, merges, err);
        bool prefix = false;  /* a '▁' in front of the text: the normalizer's Prepend, or Metaspace's */
        json_t *norm = json_object_get(tok, "normalizer"), *ms = find_part(pre, "Metaspace");
        if (has_part(norm, "Prepend")) prefix = true;
        if (ms) {
            const char *scheme = json_string_value(json_object_get(ms, "prepend_scheme"));
            prefix = scheme ? strcmp(scheme, "never") != 0 : json_is_true(json_object_get(ms, "add_prefix_space"));
        }
        if (!rc && (gguf_writer_set_str(w, "tokenizer.ggml.model", "llama") ||
                    gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", prefix)))
            rc = hr_fail(err, HR_ENOMEM, "out of memory");
        if (!rc) rc = write_vocab(w, &v, true, err);
    } else if (!rc) {
        json_t *split = find_part(pre, "Split");
        const char *regex = json_string_value(json_object_get(json_object_get(split, "pattern"), "Regex"));
        const char *name = NULL;
        for (size_t k = 0; regex && k < sizeof known_pres / sizeof known_pres[0]; k++)
            if (!strcmp(regex, known_pres[k].regex)) name = known_pres[k].pre;
        json_t *bl = find_part(pre, "ByteLevel");
        if (!split && json_is_true(json_object_get(bl, "use_regex"))) name = "gpt-2";
        if (!name)
            rc = hr_fail(err, HR_EUNSUPPORTED, "tokenizer.json: the byte-level pre-tokenizer is not one hearth knows "
                                               "(Qwen2's, Llama 3's or GPT-2's)");
        if (!rc && (gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2") || gguf_writer_set_str(w, "tokenizer.ggml.pre", name)))
            rc = hr_fail(err, HR_ENOMEM, "out of memory");
        if (!rc) rc = write_vocab(w, &v, false, err);
        if (!rc) rc = write_merges(w, merges, err);
    }
    if (!rc) rc = add_specials(w, &v, tcfg, vi, err);
    if (!rc) rc = add_chat_template(w, dir, tcfg, err);

    for (int32_t k = 0; v.text && k < v.n; k++) free(v.text[k]);
    free(v.text);
    free(v.score);
    free(v.type);
    free(v.sorted);
    json_decref(tcfg);
    json_decref(tok);
    return rc;
}
