/* Loading a vocabulary from tokenizer.ggml.*, the lookups every tokenizer shares, and
   ht_tokenize_ex: special tokens cut out of the text, the rest handed to the SentencePiece (spm.c)
   or byte-level BPE (bpe.c) tokenizer. */
#define _GNU_SOURCE  /* memmem */
#include "text-impl.h"

#include <ctype.h>
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
    "</s>",  /* llama.cpp since 2025 (phi-3 ships it as USER_DEFINED, Qwen 2 as an added token) */
};

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
    free(v->special);
    free(v->strip);
    ht_bpe_free(v->bpe);
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
        if (v->kind == HT_VOCAB_BPE) {
            /* llama.cpp decodes only NORMAL tokens; BYTE-typed ones hold stand-in characters too */
            if (v->type[id] == HT_TT_USER_DEFINED) {
                memcpy(dst, s, (size_t)n);
                m = n;
            } else if (v->type[id] == HT_TT_NORMAL || v->type[id] == HT_TT_BYTE) {
                m = ht_bpe_decode(v->bpe, s, n, dst);
            }
        } else if (b >= 0) {
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
    if (v->kind == HT_VOCAB_BPE) {
        for (int b = 0; b < 256; b++) {
            char c[2];
            int n = ht_bpe_byte_char(v->bpe, (unsigned char)b, c);
            v->byte_tok[b] = ht_vocab_lookup(v, c, (size_t)n);
        }
        return;
    }
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

/* longest text first, then lower id */
static int ht_special_cmp(const void *a, const void *b) {
    const int64_t *x = a, *y = b;
    return *x < *y ? -1 : *x > *y;
}

static void ht_set_strip(ht_vocab *v, const char *text, int bits, bool on) {
    int32_t id = ht_vocab_lookup(v, text, strlen(text));
    if (id < 0) return;
    v->strip[id] = (uint8_t)(on ? v->strip[id] | bits : v->strip[id] & ~bits);
}

/* The tokens ht_tokenize_ex cuts out of the text, in the order it tries them, and their strip
   flags, which llama.cpp sets by model name (phi-3's chat tokens swallow the whitespace after
   them, as its HF tokenizer's rstrip=True says). */
static int ht_build_special(ht_vocab *v, const gguf_ctx *g, hr_err *err) {
    v->strip = calloc((size_t)v->n_tokens, 1);
    if (!v->strip) return hr_fail(err, HR_ENOMEM, "ht_vocab_load: out of memory");
    int32_t n = 0;
    for (int32_t id = 0; id < v->n_tokens; id++)
        n += v->type[id] == HT_TT_CONTROL || v->type[id] == HT_TT_USER_DEFINED || v->type[id] == HT_TT_UNKNOWN;
    v->special = malloc((n ? (size_t)n : 1) * sizeof *v->special);
    if (!v->special) return hr_fail(err, HR_ENOMEM, "ht_vocab_load: out of memory");
    int64_t *keys = malloc((n ? (size_t)n : 1) * sizeof *keys);
    if (!keys) return hr_fail(err, HR_ENOMEM, "ht_vocab_load: out of memory");
    for (int32_t id = 0; id < v->n_tokens; id++)
        if (v->type[id] == HT_TT_CONTROL || v->type[id] == HT_TT_USER_DEFINED || v->type[id] == HT_TT_UNKNOWN)
            keys[v->n_special++] = (int64_t)(INT32_MAX - ht_text_len(v, id)) << 32 | id;
    for (int32_t id = 0; id < v->n_tokens; id++) v->n_user_defined += v->type[id] == HT_TT_USER_DEFINED;
    qsort(keys, (size_t)n, sizeof *keys, ht_special_cmp);
    for (int32_t i = 0; i < n; i++) v->special[i] = (int32_t)(keys[i] & 0xffffffff);
    free(keys);

    char name[128] = "", pre[64] = "";
    gguf_get_cstr(g, "general.name", name, sizeof name);
    gguf_get_cstr(g, "tokenizer.ggml.pre", pre, sizeof pre);
    for (char *c = name; *c; c++) *c = (char)tolower((unsigned char)*c);
    if (strstr(pre, "jina-v2-de") || strstr(pre, "jina-v2-es") || strstr(pre, "jina-v2-code")) {
        ht_set_strip(v, "<mask>", HT_STRIP_LEFT, true);
    } else if (strstr(name, "phi-3") || strstr(name, "phi3")) {
        for (int32_t i = 0; i < v->n_special; i++) v->strip[v->special[i]] |= HT_STRIP_RIGHT;
        ht_set_strip(v, "</s>", HT_STRIP_RIGHT, true);
        ht_set_strip(v, "<unk>", HT_STRIP_RIGHT, false);
        ht_set_strip(v, "<s>", HT_STRIP_RIGHT, false);
        ht_set_strip(v, "<|endoftext|>", HT_STRIP_RIGHT, false);
    }
    return 0;
}

ht_vocab *ht_vocab_load(const gguf_ctx *g, hr_err *err) {
    char model[64];
    if (!gguf_get_cstr(g, "tokenizer.ggml.model", model, sizeof model)) {
        hr_fail(err, HR_ENOTFOUND, "ht_vocab_load: no tokenizer.ggml.model in the file");
        return NULL;
    }
    int kind = !strcmp(model, "llama") ? HT_VOCAB_SPM : !strcmp(model, "gpt2") ? HT_VOCAB_BPE : 0;
    if (!kind) {
        hr_fail(err, HR_EUNSUPPORTED,
                "ht_vocab_load: tokenizer model '%s' is not supported (only 'llama' SentencePiece and 'gpt2' "
                "byte-level BPE vocabularies)", model);
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
    v->kind = kind;
    v->n_tokens = (int32_t)n;
    /* defaults when the file does not say (llama.cpp's, odd as GPT-2's are) */
    v->pad = -1; v->eot = -1; v->eom = -1; v->add_eos = false;
    if (kind == HT_VOCAB_SPM) {
        v->bos = 1; v->eos = 2; v->unk = 0;
        v->add_bos = true; v->add_space_prefix = true;
    } else {
        v->bos = 11; v->eos = 11; v->unk = -1;
        v->add_bos = false; v->add_space_prefix = false;
    }
    if (v->bos >= v->n_tokens) v->bos = -1;
    if (v->eos >= v->n_tokens) v->eos = -1;

    if (ht_load_texts(v, g, err) < 0 || ht_load_scores_types(v, g, err) < 0 || ht_build_map(v, err) < 0)
        goto fail;
    if (kind == HT_VOCAB_BPE && ht_bpe_load(v, g, err) < 0) goto fail;
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
    if (ht_build_special(v, g, err) < 0) goto fail;
    v->spm_words = kind == HT_VOCAB_SPM && ht_spm_words_ok(v);
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

const char *ht_vocab_kind_name(const ht_vocab *v) { return v->kind == HT_VOCAB_BPE ? "bpe" : "spm"; }
const char *ht_vocab_pre_name(const ht_vocab *v) { return v->bpe ? ht_bpe_pre_name(v->bpe) : NULL; }

/* ---- special tokens ----------------------------------------------------------------------------------
   llama.cpp's tokenizer_st_partition: for each special token, longest first, every stretch of plain
   text still left is cut at each occurrence of it (leftmost first). Doing it token by token rather
   than in one left-to-right scan matters: a longer token wins over a shorter one that starts
   earlier and overlaps it. */
typedef struct ht_frag {
    uint32_t off, n;  /* plain text: bytes [off, off + n) */
    int32_t  id;      /* >= 0: a special token */
} ht_frag;

typedef struct ht_frags {
    ht_frag *a;
    size_t   n, cap;
} ht_frags;

static int ht_frag_push(ht_frags *f, uint32_t off, uint32_t n, int32_t id) {
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 16;
        ht_frag *a = realloc(f->a, cap * sizeof *a);
        if (!a) return HR_ENOMEM;
        f->a = a;
        f->cap = cap;
    }
    f->a[f->n++] = (ht_frag){ off, n, id };
    return 0;
}

/* Cuts token id out of every plain fragment of `in`, writing the result to `out`. */
static int ht_cut(const ht_vocab *v, const char *text, int32_t id, const ht_frags *in, ht_frags *out) {
    const char *s = v->text + v->text_off[id];
    uint32_t n = (uint32_t)ht_text_len(v, id);
    int rc;
    out->n = 0;
    for (size_t k = 0; k < in->n; k++) {
        ht_frag f = in->a[k];
        if (f.id >= 0) {
            if ((rc = ht_frag_push(out, f.off, f.n, f.id)) < 0) return rc;
            continue;
        }
        uint32_t base = f.off, left = f.n;
        while (left) {
            const char *p = memmem(text + base, left, s, n);
            if (!p) {
                if ((rc = ht_frag_push(out, base, left, -1)) < 0) return rc;
                break;
            }
            uint32_t at = (uint32_t)(p - text), before = at - base;
            if (v->strip[id] & HT_STRIP_LEFT)
                while (before && isspace((unsigned char)text[base + before - 1])) before--;
            if (before && (rc = ht_frag_push(out, base, before, -1)) < 0) return rc;
            if ((rc = ht_frag_push(out, 0, 0, id)) < 0) return rc;
            uint32_t end = base + left;
            base = at + n;
            if (v->strip[id] & HT_STRIP_RIGHT)
                while (base < end && isspace((unsigned char)text[base])) base++;
            left = end - base;
        }
    }
    return 0;
}

/* Splits text into plain fragments and special tokens (into *f, which the caller frees). Tokens
   whose bytes, or pairs of adjacent bytes, do not all occur in the text are ruled out before any
   search: with the thousands of user-defined tokens some vocabularies have (DeepSeek's single
   accented letters), most are. */
static int ht_partition(const ht_vocab *v, const char *text, size_t len, bool parse_special, ht_frags *f) {
    int rc = ht_frag_push(f, 0, (uint32_t)len, -1);
    if (rc < 0 || (parse_special ? v->n_special : v->n_user_defined) == 0) return rc;
    uint64_t *pairs = calloc(65536 / 64, sizeof *pairs);
    if (!pairs) return HR_ENOMEM;
    uint64_t bytes[4] = { 0 };
    const unsigned char *t = (const unsigned char *)text;
    for (size_t i = 0; i < len; i++) {
        bytes[t[i] >> 6] |= 1ULL << (t[i] & 63);
        if (i + 1 < len) {
            unsigned pr = (unsigned)t[i] << 8 | t[i + 1];
            pairs[pr >> 6] |= 1ULL << (pr & 63);
        }
    }
    ht_frags tmp = { 0 };
    for (int32_t k = 0; k < v->n_special; k++) {
        int32_t id = v->special[k];
        if (!parse_special && v->type[id] != HT_TT_USER_DEFINED) continue;
        const unsigned char *s = (const unsigned char *)v->text + v->text_off[id];
        int32_t n = ht_text_len(v, id);
        if ((size_t)n > len) continue;
        bool maybe = true;
        for (int32_t i = 0; maybe && i < n; i++) {
            maybe = bytes[s[i] >> 6] >> (s[i] & 63) & 1;
            if (maybe && i + 1 < n) {
                unsigned pr = (unsigned)s[i] << 8 | s[i + 1];
                maybe = pairs[pr >> 6] >> (pr & 63) & 1;
            }
        }
        if (!maybe || !memmem(text, len, s, (size_t)n)) continue;
        if ((rc = ht_cut(v, text, id, f, &tmp)) < 0) break;
        ht_frags swap = *f;
        *f = tmp;
        tmp = swap;
    }
    free(tmp.a);
    free(pairs);
    return rc;
}

int ht_tokenize_ex(const ht_vocab *v, const char *text, size_t len, bool add_bos, bool parse_special,
                   int32_t *out, int cap) {
    if (!v || (len && !text) || cap < 0 || (cap && !out)) return HR_EINVAL;
    if (len > HT_MAX_TEXT) return HR_ERANGE;
    ht_tokout o = { .out = out, .cap = cap, .n = 0 };
    if (add_bos && v->bos >= 0) ht_tokout_push(&o, v->bos);
    if (len == 0) return (int)o.n;

    ht_frags f = { 0 };
    int rc = ht_partition(v, text, len, parse_special, &f);
    /* SentencePiece: the space prefix goes before the first plain piece and before each one that
       follows a special token (llama.cpp) */
    bool prev_special = true;
    for (size_t k = 0; rc >= 0 && k < f.n; k++) {
        if (f.a[k].id >= 0) {
            ht_tokout_push(&o, f.a[k].id);
            prev_special = true;
            continue;
        }
        const char *s = text + f.a[k].off;
        switch (v->kind) {
        case HT_VOCAB_SPM: rc = ht_spm_tokenize(v, s, f.a[k].n, v->add_space_prefix && prev_special, &o); break;
        case HT_VOCAB_BPE: rc = ht_bpe_tokenize(v, s, f.a[k].n, &o); break;
        default: rc = HR_EUNSUPPORTED; break;
        }
        prev_special = false;
    }
    free(f.a);
    if (rc < 0) return rc;
    if (o.n > INT32_MAX) return HR_ERANGE;
    return (int)o.n;
}

int ht_tokenize(const ht_vocab *v, const char *text, size_t len, bool add_bos, int32_t *out, int cap) {
    return ht_tokenize_ex(v, text, len, add_bos, false, out, cap);
}
