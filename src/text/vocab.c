/* Loading a vocabulary from tokenizer.ggml.* and the lookups every tokenizer shares. */
#include "text-impl.h"

#include <stdio.h>
#include <stdlib.h>

/* Largest vocabulary we accept. Real ones are below 300k; the cap keeps the hash table size and
   the 32-bit text offsets far from overflow whatever a hostile file claims. */
#define HT_MAX_TOKENS (1 << 24)
/* Longest text ht_tokenize takes in one call: SentencePiece escaping can triple it and symbol
   indices are int32. */
#define HT_MAX_TEXT ((size_t)1 << 29)

/* Token texts that end generation whatever their type says (llama.cpp marks the same ones, because
   converters often leave them NORMAL or USER_DEFINED): chat-turn ends of common model families. */
static const char *const ht_eog_names[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
};

/* FNV-1a, inlined: the tokenizers hash every candidate merge */
static inline uint32_t ht_hash(const char *s, size_t n) {
    uint64_t h = HR_FNV_SEED;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ULL;
    return (uint32_t)(h ^ (h >> 32));
}

int32_t ht_vocab_lookup(const ht_vocab *v, const char *s, size_t n) {
    if (n > (size_t)v->max_token_len) return -1;
    uint32_t h = ht_hash(s, n);
    for (uint32_t i = h & v->map_mask;; i = (i + 1) & v->map_mask) {
        int32_t id = v->map[i].id;
        if (id < 0) return -1;
        /* the stored hash spares most mismatches a trip to the token text */
        if (v->map[i].hash == h && (size_t)ht_text_len(v, id) == n &&
            memcmp(v->text + v->text_off[id], s, n) == 0)
            return id;
    }
}

void ht_vocab_free(ht_vocab *v) {
    if (!v) return;
    free(v->text);
    free(v->text_off);
    free(v->piece);
    free(v->piece_off);
    free(v->score);
    free(v->type);
    free(v->eog);
    free(v->map);
    free(v);
}

/* A special-token id from `key`: absent keeps *id; present must be an integer naming a token
   (or -1 for "none"). */
static int ht_read_id(const gguf_ctx *g, const char *key, int32_t n_tokens, int32_t *id, hr_err *err) {
    if (gguf_find_key(g, key) < 0) return 0;
    int64_t x;
    if (!gguf_get_i64(g, key, &x)) return hr_fail(err, HR_EFORMAT, "ht_vocab_load: %s is not an integer", key);
    if (x == -1) { *id = -1; return 0; }
    if (x < 0 || x >= n_tokens)
        return hr_fail(err, HR_EFORMAT, "ht_vocab_load: %s = %lld is outside the vocabulary (%d tokens)",
                       key, (long long)x, n_tokens);
    *id = (int32_t)x;
    return 0;
}

static int ht_read_flag(const gguf_ctx *g, const char *key, bool *flag, hr_err *err) {
    if (gguf_find_key(g, key) < 0) return 0;
    if (!gguf_get_bool(g, key, flag)) return hr_fail(err, HR_EFORMAT, "ht_vocab_load: %s is not a bool", key);
    return 0;
}

/* The byte a "<0xNN>" token stands for, or -1 if the text has another shape. */
static int ht_parse_byte_token(const char *s, int32_t n) {
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int b = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
              : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        b = b * 16 + d;
    }
    return b;
}

/* Token texts, with the same rule as llama.cpp for empty entries (they would break the text->id
   map): an empty token becomes "[EMPTY_<id>]". */
static int ht_load_texts(ht_vocab *v, const gguf_ctx *g, hr_err *err) {
    const char *key = "tokenizer.ggml.tokens";
    size_t total = 0;
    char empty[32];
    for (int32_t i = 0; i < v->n_tokens; i++) {
        gguf_str s;
        if (!gguf_get_arr_str(g, key, (uint64_t)i, &s))
            return hr_fail(err, HR_EFORMAT, "ht_vocab_load: %s[%d] unreadable", key, i);
        size_t n = s.n ? (size_t)s.n : (size_t)snprintf(empty, sizeof empty, "[EMPTY_%d]", i);
        if (n > INT32_MAX / 4)
            return hr_fail(err, HR_ERANGE, "ht_vocab_load: %s[%d] is %zu bytes long", key, i, n);
        total += n + 1;
        if (total >= UINT32_MAX)
            return hr_fail(err, HR_ERANGE, "ht_vocab_load: %s holds more than 4 GiB of text", key);
    }
    v->text = malloc(total ? total : 1);
    v->piece = malloc(total ? total : 1);  /* pieces are never longer than texts */
    v->text_off = malloc(((size_t)v->n_tokens + 1) * sizeof *v->text_off);
    v->piece_off = malloc(((size_t)v->n_tokens + 1) * sizeof *v->piece_off);
    if (!v->text || !v->piece || !v->text_off || !v->piece_off)
        return hr_fail(err, HR_ENOMEM, "ht_vocab_load: out of memory for %d tokens", v->n_tokens);
    uint32_t off = 0;
    for (int32_t i = 0; i < v->n_tokens; i++) {
        gguf_str s;
        gguf_get_arr_str(g, key, (uint64_t)i, &s);
        size_t n;
        if (s.n) {
            n = (size_t)s.n;
            memcpy(v->text + off, s.s, n);
        } else {
            n = (size_t)snprintf(v->text + off, 32, "[EMPTY_%d]", i);
            HR_LOGW("ht_vocab_load: empty token at id %d", i);
        }
        v->text_off[i] = off;
        v->text[off + n] = 0;
        off += (uint32_t)n + 1;
        if ((int32_t)n > v->max_token_len) v->max_token_len = (int32_t)n;
    }
    v->text_off[v->n_tokens] = off;
    return 0;
}

static int ht_load_scores_types(ht_vocab *v, const gguf_ctx *g, hr_err *err) {
    size_t n = (size_t)v->n_tokens;
    v->score = calloc(n, sizeof *v->score);
    v->type = malloc(n);
    v->eog = calloc(n, 1);
    if (!v->score || !v->type || !v->eog) return hr_fail(err, HR_ENOMEM, "ht_vocab_load: out of memory");
    memset(v->type, HT_TT_NORMAL, n);

    int et;
    uint64_t cnt;
    const void *data;
    const char *key = "tokenizer.ggml.scores";
    if (gguf_find_key(g, key) >= 0) {
        if (!gguf_get_arr(g, key, &et, &cnt, &data) || (et != GGUF_VT_FLOAT32 && et != GGUF_VT_INT32))
            return hr_fail(err, HR_EFORMAT, "ht_vocab_load: %s is not an f32 or i32 array", key);
        if (cnt != n)
            return hr_fail(err, HR_EFORMAT, "ht_vocab_load: %s has %llu entries for %zu tokens",
                           key, (unsigned long long)cnt, n);
        for (size_t i = 0; i < n; i++) {
            if (et == GGUF_VT_FLOAT32) {
                memcpy(&v->score[i], (const char *)data + 4 * i, 4);
            } else {
                int32_t x;
                memcpy(&x, (const char *)data + 4 * i, 4);
                v->score[i] = (float)x;
            }
        }
    }
    key = "tokenizer.ggml.token_type";
    if (gguf_find_key(g, key) >= 0) {
        if (!gguf_get_arr(g, key, &et, &cnt, &data) || et != GGUF_VT_INT32)
            return hr_fail(err, HR_EFORMAT, "ht_vocab_load: %s is not an i32 array", key);
        if (cnt != n)
            return hr_fail(err, HR_EFORMAT, "ht_vocab_load: %s has %llu entries for %zu tokens",
                           key, (unsigned long long)cnt, n);
        for (size_t i = 0; i < n; i++) {
            int32_t t;
            memcpy(&t, (const char *)data + 4 * i, 4);
            v->type[i] = (uint8_t)(t >= HT_TT_NORMAL && t <= HT_TT_BYTE ? t : HT_TT_UNDEFINED);
        }
    }
    return 0;
}

static int ht_build_map(ht_vocab *v, hr_err *err) {
    uint32_t size = 16;
    while (size < 2u * (uint32_t)v->n_tokens) size *= 2;
    v->map = malloc((size_t)size * sizeof *v->map);
    if (!v->map) return hr_fail(err, HR_ENOMEM, "ht_vocab_load: out of memory for the token map");
    memset(v->map, 0xff, (size_t)size * sizeof *v->map);
    v->map_mask = size - 1;
    for (int32_t id = 0; id < v->n_tokens; id++) {
        const char *s = v->text + v->text_off[id];
        size_t n = (size_t)ht_text_len(v, id);
        int32_t dup = ht_vocab_lookup(v, s, n);
        if (dup >= 0)  /* llama.cpp refuses these too: one of the two ids could never be produced */
            return hr_fail(err, HR_EFORMAT, "ht_vocab_load: duplicate token '%.64s' at ids %d and %d", s, dup, id);
        uint32_t h = ht_hash(s, n), i = h & v->map_mask;
        while (v->map[i].id >= 0) i = (i + 1) & v->map_mask;
        v->map[i] = (struct ht_slot){ h, id };
    }
    return 0;
}

static void ht_mark_eog(ht_vocab *v) {
    for (size_t k = 0; k < HR_ARRAY_LEN(ht_eog_names); k++) {
        int32_t id = ht_vocab_lookup(v, ht_eog_names[k], strlen(ht_eog_names[k]));
        if (id < 0) continue;
        v->eog[id] = 1;
        /* an end-of-turn marker is never text to show (phi-3 ships "</s>"-like ones as USER_DEFINED) */
        if (v->type[id] != HT_TT_CONTROL) {
            HR_LOGD("ht_vocab_load: token %d '%s' ends generation; treating it as a control token",
                    id, ht_eog_names[k]);
            v->type[id] = HT_TT_CONTROL;
        }
    }
    const int32_t ids[3] = { v->eos, v->eot, v->eom };
    for (int k = 0; k < 3; k++)
        if (ids[k] >= 0) v->eog[ids[k]] = 1;
}

/* What each token prints as; see ht_token_to_bytes. Same rules as llama.cpp's token_to_piece
   without special-token rendering. */
static void ht_build_pieces(ht_vocab *v) {
    uint32_t off = 0;
    for (int32_t id = 0; id < v->n_tokens; id++) {
        const char *s = v->text + v->text_off[id];
        int32_t n = ht_text_len(v, id);
        char *dst = v->piece + off;
        int32_t m = 0;
        int b = v->type[id] == HT_TT_BYTE ? ht_parse_byte_token(s, n) : -1;
        if (b >= 0) {
            dst[m++] = (char)b;
        } else if (v->type[id] == HT_TT_USER_DEFINED) {
            memcpy(dst, s, (size_t)n);
            m = n;
        } else if (v->type[id] == HT_TT_NORMAL || v->type[id] == HT_TT_BYTE) {
            for (int32_t i = 0; i < n; i++) {
                if (i + HT_SPM_SPACE_LEN <= n && memcmp(s + i, HT_SPM_SPACE, HT_SPM_SPACE_LEN) == 0) {
                    dst[m++] = ' ';
                    i += HT_SPM_SPACE_LEN - 1;
                } else {
                    dst[m++] = s[i];
                }
            }
        }  /* control, unknown, unused, undefined: nothing */
        dst[m] = 0;
        v->piece_off[id] = off;
        off += (uint32_t)m + 1;
        if (m > v->max_piece_len) v->max_piece_len = m;
    }
    v->piece_off[v->n_tokens] = off;
}

static bool ht_spm_words_ok(const ht_vocab *v) {
    for (int32_t id = 0; id < v->n_tokens; id++) {
        const char *s = v->text + v->text_off[id];
        int32_t n = ht_text_len(v, id), i = 0;
        while (i + HT_SPM_SPACE_LEN <= n && memcmp(s + i, HT_SPM_SPACE, HT_SPM_SPACE_LEN) == 0) i += HT_SPM_SPACE_LEN;
        for (; i + HT_SPM_SPACE_LEN <= n; i++)
            if (memcmp(s + i, HT_SPM_SPACE, HT_SPM_SPACE_LEN) == 0) return false;
    }
    return true;
}

static void ht_build_byte_fallback(ht_vocab *v) {
    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        char name[7] = { '<', '0', 'x', hex[b >> 4], hex[b & 15], '>', 0 };
        int32_t id = ht_vocab_lookup(v, name, 6);
        if (id < 0) {  /* vocabularies without <0xNN> tokens may still hold the byte itself */
            char c = (char)b;
            id = ht_vocab_lookup(v, &c, 1);
        }
        v->byte_tok[b] = id >= 0 ? id : v->unk;
    }
}

ht_vocab *ht_vocab_load(const gguf_ctx *g, hr_err *err) {
    char model[64];
    if (!gguf_get_cstr(g, "tokenizer.ggml.model", model, sizeof model)) {
        hr_fail(err, HR_ENOTFOUND, "ht_vocab_load: no tokenizer.ggml.model in the file");
        return NULL;
    }
    if (strcmp(model, "llama") != 0) {
        hr_fail(err, HR_EUNSUPPORTED,
                "ht_vocab_load: tokenizer model '%s' is not supported (only 'llama' SentencePiece vocabularies)",
                model);
        return NULL;
    }
    int et;
    uint64_t n;
    const void *data;
    if (!gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &data) || et != GGUF_VT_STRING) {
        hr_fail(err, HR_EFORMAT, "ht_vocab_load: tokenizer.ggml.tokens is missing or not a string array");
        return NULL;
    }
    if (n == 0 || n > HT_MAX_TOKENS) {
        hr_fail(err, HR_EFORMAT, "ht_vocab_load: tokenizer.ggml.tokens has %llu entries", (unsigned long long)n);
        return NULL;
    }

    ht_vocab *v = calloc(1, sizeof *v);
    if (!v) {
        hr_fail(err, HR_ENOMEM, "ht_vocab_load: out of memory");
        return NULL;
    }
    v->kind = HT_VOCAB_SPM;
    v->n_tokens = (int32_t)n;
    /* SentencePiece defaults when the file does not say (as llama.cpp) */
    v->bos = 1; v->eos = 2; v->unk = 0; v->pad = -1; v->eot = -1; v->eom = -1;
    v->add_bos = true; v->add_eos = false; v->add_space_prefix = true;
    if (v->bos >= v->n_tokens) v->bos = -1;
    if (v->eos >= v->n_tokens) v->eos = -1;

    if (ht_load_texts(v, g, err) < 0 || ht_load_scores_types(v, g, err) < 0 || ht_build_map(v, err) < 0)
        goto fail;
    if (ht_read_id(g, "tokenizer.ggml.bos_token_id", v->n_tokens, &v->bos, err) < 0 ||
        ht_read_id(g, "tokenizer.ggml.eos_token_id", v->n_tokens, &v->eos, err) < 0 ||
        ht_read_id(g, "tokenizer.ggml.unknown_token_id", v->n_tokens, &v->unk, err) < 0 ||
        ht_read_id(g, "tokenizer.ggml.padding_token_id", v->n_tokens, &v->pad, err) < 0 ||
        ht_read_id(g, "tokenizer.ggml.eot_token_id", v->n_tokens, &v->eot, err) < 0 ||
        ht_read_id(g, "tokenizer.ggml.eom_token_id", v->n_tokens, &v->eom, err) < 0 ||
        ht_read_flag(g, "tokenizer.ggml.add_bos_token", &v->add_bos, err) < 0 ||
        ht_read_flag(g, "tokenizer.ggml.add_eos_token", &v->add_eos, err) < 0 ||
        ht_read_flag(g, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix, err) < 0)
        goto fail;
    if (v->add_bos && v->bos < 0) HR_LOGW("ht_vocab_load: add_bos_token is set but there is no BOS token");

    ht_mark_eog(v);
    ht_build_pieces(v);
    ht_build_byte_fallback(v);
    v->spm_words = ht_spm_words_ok(v);
    return v;

fail:
    ht_vocab_free(v);
    return NULL;
}

int32_t ht_vocab_size(const ht_vocab *v) { return v->n_tokens; }
int32_t ht_token_bos(const ht_vocab *v) { return v->bos; }
int32_t ht_token_eos(const ht_vocab *v) { return v->eos; }
bool    ht_add_bos(const ht_vocab *v) { return v->add_bos && v->bos >= 0; }

bool ht_is_eog(const ht_vocab *v, int32_t id) {
    return id >= 0 && id < v->n_tokens && v->eog[id];
}

const char *ht_token_text(const ht_vocab *v, int32_t id) {
    if (id < 0 || id >= v->n_tokens) return NULL;
    return v->text + v->text_off[id];
}

int ht_tokenize(const ht_vocab *v, const char *text, size_t len, bool add_bos, int32_t *out, int cap) {
    if (!v || (len && !text) || cap < 0 || (cap && !out)) return HR_EINVAL;
    if (len > HT_MAX_TEXT) return HR_ERANGE;
    ht_tokout o = { .out = out, .cap = cap, .n = 0 };
    if (add_bos && v->bos >= 0) ht_tokout_push(&o, v->bos);
    int rc = 0;
    switch (v->kind) {
    case HT_VOCAB_SPM: rc = ht_spm_tokenize(v, text, len, &o); break;
    default: rc = HR_EUNSUPPORTED; break;
    }
    if (rc < 0) return rc;
    if (o.n > INT32_MAX) return HR_ERANGE;
    return (int)o.n;
}
