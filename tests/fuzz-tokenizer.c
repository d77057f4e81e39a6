// fuzz-tokenizer — libFuzzer harness for the tokenizers (SentencePiece and byte-level BPE) and the
// streaming detokenizer (built with clang by scripts/fuzz.sh, not CMake).
//
// The vocabularies are loaded once, at start-up, from $HEARTH_SHARED (scripts/fuzz.sh sets it):
// stories260K (SentencePiece, 512 tokens, byte fallback), llama-spm (SentencePiece, 32000),
// phi-3 (SentencePiece with special tokens that strip whitespace), gpt-2 (BPE, default
// pre-tokenizer) and deepseek-llm (BPE, its own pre-tokenizer regexes).
//
// Input: byte 0 picks the vocabulary (bits 0-2), add_bos (bit 3), parse_special (bit 4) and the mode
// (bit 5): encode the rest as text, or decode it as token ids (3 bytes each, spread over
// [-4, n_vocab + 4) so ids outside the vocabulary are tried too). Checked, beyond "no crash, no
// sanitizer report, no leak":
// - encode: every id inside the vocabulary; BOS first when asked; the count is the same with a
//   buffer too small (nothing written past it: the buffers are exact-size heap copies); the other
//   merge path (BPE by text instead of by id, SentencePiece over the whole text instead of word by
//   word) gives the same ids; valid UTF-8 without special parsing round-trips through the pieces
//   (behind SentencePiece's space prefix).
// - decode: ht_token_to_bytes's size contract (cap 0 asks the size; an id outside is HR_EINVAL),
//   ht_token_text NULL outside, and the streaming detokenizer's output is valid UTF-8 within
//   ht_detok_max_bytes per push.
//
// fuzz-sources: src/text/*.c src/gguf/*.c src/quant/*.c src/base/*.c
// fuzz-max-len: 4096
#define _GNU_SOURCE  /* memmem */
#include "text/text-impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(x) do { if (!(x)) { fprintf(stderr, "fuzz-tokenizer: check failed: %s\n", #x); abort(); } } while (0)

static const char *const g_files[] = {
    "models/stories260K.gguf", "tokenizers/ggml-vocab-llama-spm.gguf", "tokenizers/ggml-vocab-phi-3.gguf",
    "tokenizers/ggml-vocab-gpt-2.gguf", "tokenizers/ggml-vocab-deepseek-llm.gguf",
};
#define N_VOCABS ((int)(sizeof g_files / sizeof g_files[0]))
static ht_vocab *g_vocab[N_VOCABS];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *dir = getenv("HEARTH_SHARED");
    if (!dir) dir = "../shared";
    for (int i = 0; i < N_VOCABS; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, g_files[i]);
        hr_err err = {0};
        gguf_ctx *g = gguf_open(path, &err);
        if (g) g_vocab[i] = ht_vocab_load(g, &err);
        if (!g_vocab[i]) {
            fprintf(stderr, "fuzz-tokenizer: %s: %s (set HEARTH_SHARED)\n", path, err.msg);
            exit(2);
        }
        gguf_close(g);  /* the vocabulary keeps copies */
    }
    return 0;
}

/* strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF */
static bool utf8_valid(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t k = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!k || i + k > n) return false;
        uint32_t cp = k == 1 ? c : k == 2 ? c & 0x1Fu : k == 3 ? c & 0x0Fu : c & 0x07u;
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return false;
            cp = cp << 6 | (s[i + j] & 0x3Fu);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += k;
    }
    return true;
}

/* ids of text, in an exact-size heap array (*n of them) */
static int32_t *encode(ht_vocab *v, const char *text, size_t len, bool bos, bool special, int *n) {
    *n = ht_tokenize_ex(v, text, len, bos, special, NULL, 0);
    FUZZ_CHECK(*n >= 0);
    int32_t *ids = malloc(sizeof *ids * (size_t)(*n ? *n : 1));
    FUZZ_CHECK(ids);
    FUZZ_CHECK(ht_tokenize_ex(v, text, len, bos, special, ids, *n) == *n);
    return ids;
}

static void fuzz_encode(ht_vocab *v, const char *text, size_t len, bool bos, bool special) {
    int n;
    int32_t *ids = encode(v, text, len, bos, special, &n);
    for (int i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < ht_vocab_size(v));
    if (bos && ht_token_bos(v) >= 0 && ht_add_bos(v)) FUZZ_CHECK(n >= 1);
    if (bos && n >= 1 && ht_token_bos(v) >= 0) FUZZ_CHECK(ids[0] == ht_token_bos(v));
    /* a buffer too small: the same count, nothing past it written (ASan sees the exact-size copy) */
    if (n > 1) {
        int half = n / 2;
        int32_t *part = malloc(sizeof *part * (size_t)half);
        FUZZ_CHECK(ht_tokenize_ex(v, text, len, bos, special, part, half) == n);
        FUZZ_CHECK(memcmp(part, ids, sizeof *part * (size_t)half) == 0);
        free(part);
    }
    /* the other merge path gives the same ids */
    int n2;
    int32_t *ids2;
    if (v->kind == HT_VOCAB_BPE) {
        bool by_id = ht_bpe_by_id(v->bpe, false);
        ids2 = encode(v, text, len, bos, special, &n2);
        ht_bpe_by_id(v->bpe, by_id);
    } else {
        bool words = v->spm_words;
        v->spm_words = false;
        ids2 = encode(v, text, len, bos, special, &n2);
        v->spm_words = words;
    }
    FUZZ_CHECK(n2 == n && memcmp(ids2, ids, sizeof *ids * (size_t)n) == 0);
    free(ids2);
    /* valid UTF-8 round-trips (SentencePiece puts one space in front, and a '▁' of the text's own
       comes back as the space it stands for, as in SentencePiece itself) */
    bool spm = v->kind == HT_VOCAB_SPM && v->add_space_prefix;
    if (!bos && !special && len && utf8_valid((const uint8_t *)text, len) &&
        !(v->kind == HT_VOCAB_SPM && memmem(text, len, HT_SPM_SPACE, HT_SPM_SPACE_LEN))) {
        size_t cap = 16, dl = 0;
        for (int i = 0; i < n; i++) cap += (size_t)ht_token_to_bytes(v, ids[i], NULL, 0);
        char *d = malloc(cap);
        for (int i = 0; i < n; i++) {
            int k = ht_token_to_bytes(v, ids[i], d + dl, (int)(cap - dl));
            FUZZ_CHECK(k >= 0 && (size_t)k <= cap - dl);
            dl += (size_t)k;
        }
        if (spm) FUZZ_CHECK(dl == len + 1 && d[0] == ' ' && memcmp(d + 1, text, len) == 0);
        else FUZZ_CHECK(dl == len && memcmp(d, text, len) == 0);
        free(d);
    }
    free(ids);
}

static void fuzz_decode(ht_vocab *v, const uint8_t *p, size_t n) {
    int32_t nv = ht_vocab_size(v);
    int max = ht_detok_max_bytes(v);
    FUZZ_CHECK(max > 0);
    char *out = malloc((size_t)max);
    ht_detok d;
    ht_detok_init(&d, v);
    for (size_t i = 0; i + 3 <= n; i += 3) {
        uint32_t x = (uint32_t)p[i] | (uint32_t)p[i + 1] << 8 | (uint32_t)p[i + 2] << 16;
        int32_t id = (int32_t)(x % (uint32_t)(nv + 8)) - 4;
        bool inside = id >= 0 && id < nv;
        FUZZ_CHECK((ht_token_text(v, id) != NULL) == inside);
        int need = ht_token_to_bytes(v, id, NULL, 0);
        if (!inside) {
            FUZZ_CHECK(need == HR_EINVAL);
        } else {
            FUZZ_CHECK(need >= 0);
            char *b = malloc((size_t)(need ? need : 1));
            FUZZ_CHECK(ht_token_to_bytes(v, id, b, need) == need);
            free(b);
        }
        int k = ht_detok_push(&d, id, out, max);
        FUZZ_CHECK(k >= 0 && k <= max && utf8_valid((const uint8_t *)out, (size_t)k));
        if (!inside) FUZZ_CHECK(k == 0);
        (void)ht_is_eog(v, id);
    }
    int k = ht_detok_flush(&d, out, max);
    FUZZ_CHECK(k >= 0 && k <= max && utf8_valid((const uint8_t *)out, (size_t)k));
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    uint8_t op = data[0];
    ht_vocab *v = g_vocab[(op & 7) % N_VOCABS];
    size_t n = size - 1;
    char *p = malloc(n ? n : 1);  /* exact size: a read past the end is seen */
    memcpy(p, data + 1, n);
    if (op & 0x20) fuzz_decode(v, (const uint8_t *)p, n);
    else fuzz_encode(v, p, n, op & 8, op & 0x10);
    free(p);
    return 0;
}
