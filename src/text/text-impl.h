/* text internals shared by vocab.c (loading, lookup, special-token splitting, dispatch), spm.c (the
   SentencePiece tokenizer), bpe.c (the byte-level BPE tokenizer), detok.c and sampler.c. Not part
   of the module's interface.

   A vocabulary is loaded once into flat arrays: every token's text back to back (NUL-terminated so
   ht_token_text can hand it out), its detokenized piece likewise, and an open-addressing hash table
   from text to id that the tokenizers use for every candidate merge. ht_tokenize_ex (vocab.c) cuts
   special tokens out of the text, then hands each plain piece to the tokenizer of the vocabulary's
   kind. */
#ifndef HEARTH_TEXT_IMPL_H
#define HEARTH_TEXT_IMPL_H

#include "text.h"

/* tokenizer.ggml.model values we implement (append only) */
enum ht_vocab_kind {
    HT_VOCAB_SPM = 1,  /* "llama": SentencePiece with score-ordered bigram merges, byte fallback */
    HT_VOCAB_BPE = 2,  /* "gpt2": byte-level BPE with rank-ordered merges after a regex pre-tokenizer */
};

/* per-token flags beside the type: llama.cpp's LSTRIP/RSTRIP attributes, which make the special-token
   split eat the whitespace before/after the token (phi-3's chat tokens) */
enum ht_token_strip {
    HT_STRIP_LEFT  = 1,
    HT_STRIP_RIGHT = 2,
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

    int32_t   byte_tok[256];  /* token for a raw byte (SPM: byte fallback; BPE: the byte's stand-in character), -1 if none */

    /* control, user-defined and unknown tokens, longest text first (ties: lower id first): the
       order in which ht_tokenize_ex cuts them out of the text, as llama.cpp does */
    int32_t  *special;        /* [n_special] */
    int32_t   n_special;
    int32_t   n_user_defined; /* of them USER_DEFINED: the ones cut out even without parse_special */
    uint8_t  *strip;          /* [n_tokens] enum ht_token_strip bits */

    struct ht_bpe *bpe;       /* BPE merges and pre-tokenizer (bpe.c); NULL for SPM */

    /* SPM: no token holds a '▁' after another character ('▁' only in a leading run, as in vocabularies
       trained with split_by_whitespace), so a merge never crosses from a character into a
       following '▁' and text can be tokenized word by word */
    bool      spm_words;

    int32_t   bos, eos, unk, pad, eot, eom;  /* -1 if none */
    bool      add_bos, add_eos, add_space_prefix;
};

/* FNV-1a, inlined: the tokenizers hash every candidate merge */
static inline uint32_t ht_hash(const char *s, size_t n) {
    uint64_t h = HR_FNV_SEED;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ULL;
    return (uint32_t)(h ^ (h >> 32));
}

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

/* SentencePiece tokenization of text[0..len) (whitespace escaping included; one '▁' in front when
   space_prefix). Returns 0 or a negative HR_E* code. */
int ht_spm_tokenize(const ht_vocab *v, const char *text, size_t len, bool space_prefix, ht_tokout *o);

/* ---- byte-level BPE (bpe.c) ---- */
/* Reads tokenizer.ggml.merges and tokenizer.ggml.pre into v->bpe and applies the pre-tokenizer's
   defaults to v (add_bos, bos); called after the token texts and the text map are loaded and
   before the file's own bos/eos/add_bos keys are read, so those override. */
int  ht_bpe_load(ht_vocab *v, const gguf_ctx *g, hr_err *err);
void ht_bpe_free(struct ht_bpe *b);
const char *ht_bpe_pre_name(const struct ht_bpe *b);
/* Switches merging by token id (the fast path, where the vocabulary allows it) on or off and
   returns the previous setting; tests compare the two paths. */
bool ht_bpe_by_id(struct ht_bpe *b, bool by_id);
/* Writes the bytes a byte-level token text stands for to dst (at most n bytes: never longer than
   the text) and returns their count. */
int32_t ht_bpe_decode(const struct ht_bpe *b, const char *s, int32_t n, char *dst);
/* UTF-8 of the character that stands for byte c in token texts; returns its length (1 or 2). */
int  ht_bpe_byte_char(const struct ht_bpe *b, unsigned char c, char out[2]);
/* BPE tokenization of text[0..len) (no special tokens: ht_tokenize_ex has cut them out). */
int  ht_bpe_tokenize(const ht_vocab *v, const char *text, size_t len, ht_tokout *o);

#endif
