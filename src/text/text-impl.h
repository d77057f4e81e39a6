/* text internals shared by vocab.c (loading, lookup, dispatch), spm.c (the SentencePiece tokenizer),
   detok.c and sampler.c. Not part of the module's interface.

   A vocabulary is loaded once into flat arrays: every token's text back to back (NUL-terminated so
   ht_token_text can hand it out), its detokenized piece likewise, and an open-addressing hash table
   from text to id that the tokenizers use for every candidate merge. A second tokenizer (byte-level
   BPE for "gpt2" vocabularies) goes beside spm.c as bpe.c with its own HT_VOCAB_* kind; ht_tokenize
   in vocab.c picks the implementation by kind. */
#ifndef HEARTH_TEXT_IMPL_H
#define HEARTH_TEXT_IMPL_H

#include "text.h"

/* tokenizer.ggml.model values we implement (append only) */
enum ht_vocab_kind {
    HT_VOCAB_SPM = 1,  /* "llama": SentencePiece with score-ordered bigram merges, byte fallback */
};

/* tokenizer.ggml.token_type values, as GGUF stores them; anything else is kept as UNDEFINED */
enum ht_token_type {
    HT_TT_UNDEFINED    = 0,
    HT_TT_NORMAL       = 1,
    HT_TT_UNKNOWN      = 2,
    HT_TT_CONTROL      = 3,
    HT_TT_USER_DEFINED = 4,
    HT_TT_UNUSED       = 5,
    HT_TT_BYTE         = 6,
};

/* U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's stand-in for a space */
#define HT_SPM_SPACE     "\xe2\x96\x81"
#define HT_SPM_SPACE_LEN 3

struct ht_vocab {
    int      kind;            /* enum ht_vocab_kind */
    int32_t  n_tokens;

    /* token i's text is text + text_off[i], text_off[i + 1] - text_off[i] - 1 bytes (+ NUL) */
    char     *text;
    uint32_t *text_off;       /* [n_tokens + 1] */
    /* what token i prints as (see ht_token_to_bytes), laid out the same way */
    char     *piece;
    uint32_t *piece_off;      /* [n_tokens + 1] */
    float    *score;          /* [n_tokens] merge priority (SPM: log probability) */
    uint8_t  *type;           /* [n_tokens] enum ht_token_type, after EOG fix-ups */
    uint8_t  *eog;            /* [n_tokens] 1 if the token ends generation */

    struct ht_slot { uint32_t hash; int32_t id; } *map;  /* [map_mask + 1], id -1 = empty */
    uint32_t  map_mask;
    int32_t   max_token_len;  /* longest token text in bytes: no merge can be longer */
    int32_t   max_piece_len;

    int32_t   byte_tok[256];  /* token for a raw byte (byte fallback), -1 if none */

    /* SPM: no token holds a '▁' after another character ('▁' only in a leading run, as in vocabularies
       trained with split_by_whitespace), so a merge never crosses from a character into a
       following '▁' and text can be tokenized word by word */
    bool      spm_words;

    int32_t   bos, eos, unk, pad, eot, eom;  /* -1 if none */
    bool      add_bos, add_eos, add_space_prefix;
};

static inline int32_t ht_text_len(const ht_vocab *v, int32_t id) {
    return (int32_t)(v->text_off[id + 1] - v->text_off[id] - 1);
}

/* Id of the token whose text is exactly s[0..n), or -1. */
int32_t ht_vocab_lookup(const ht_vocab *v, const char *s, size_t n);

/* Where tokenizers write ids: the first `cap` go to out, all are counted in n. */
typedef struct ht_tokout {
    int32_t *out;
    int      cap;
    int64_t  n;
} ht_tokout;

static inline void ht_tokout_push(ht_tokout *o, int32_t id) {
    if (o->n < o->cap) o->out[o->n] = id;
    o->n++;
}

/* SentencePiece tokenization of text[0..len) (whitespace escaping and the space prefix included).
   Returns 0 or a negative HR_E* code. */
int ht_spm_tokenize(const ht_vocab *v, const char *text, size_t len, ht_tokout *o);

#endif
