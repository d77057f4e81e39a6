/*
 * text — everything between strings and token ids on the head: the tokenizers (SentencePiece
 * "llama" vocabularies and byte-level BPE "gpt2" ones with their tokenizer.ggml.pre pre-tokenizer),
 * streaming detokenization and the sampler.  Prefix: ht_.
 *
 * Ownership: an ht_vocab copies what it needs out of the GGUF, so it outlives the gguf_ctx.
 */
#ifndef HEARTH_TEXT_H
#define HEARTH_TEXT_H

#include "base/base.h"
#include "gguf/gguf.h"

/* ---- vocabulary and tokenizer ------------------------------------------------------------------- */
typedef struct ht_vocab ht_vocab;

/* Loads tokenizer.ggml.* from a GGUF. Errors (missing tokens, unsupported model, mismatched array
   lengths) are returned with a message. */
ht_vocab *ht_vocab_load(const gguf_ctx *g, hr_err *err);
void      ht_vocab_free(ht_vocab *v);

int32_t ht_vocab_size(const ht_vocab *v);
int32_t ht_token_bos(const ht_vocab *v);     /* -1 if none */
int32_t ht_token_eos(const ht_vocab *v);     /* -1 if none */
bool    ht_add_bos(const ht_vocab *v);       /* tokenizer.ggml.add_bos_token (default per model) */
bool    ht_is_eog(const ht_vocab *v, int32_t id);  /* end of generation: EOS, EOT, ... */
const char *ht_token_text(const ht_vocab *v, int32_t id); /* raw vocab string, NUL-terminated; NULL if out of range */

/* Tokenizes text[0..len). Writes at most cap ids to out and returns the total number of tokens
   (which may exceed cap: call again with a bigger buffer), or a negative HR_E* code. add_bos
   prepends BOS when the vocab has one. Control tokens in the text are not parsed (their text is
   tokenized as plain text); user-defined tokens are, as llama.cpp and HF tokenizers do. Same as
   ht_tokenize_ex(v, text, len, add_bos, false, out, cap). */
int ht_tokenize(const ht_vocab *v, const char *text, size_t len, bool add_bos, int32_t *out, int cap);

/* As ht_tokenize; with parse_special, the texts of control and unknown tokens (<|im_start|>,
   <|eot_id|>, </s>, ...) in the text become their ids too (llama.cpp's parse_special): special
   tokens are cut out of the text longest first, and the text between them is tokenized piece by
   piece (SentencePiece puts its space prefix in front of the first piece and of every piece that
   follows a special token; phi-3's chat tokens swallow the whitespace after them, as llama.cpp
   has it). Invalid UTF-8 reaches a BPE vocabulary as U+FFFD, one per bad byte, as in llama.cpp. */
int ht_tokenize_ex(const ht_vocab *v, const char *text, size_t len, bool add_bos, bool parse_special,
                   int32_t *out, int cap);

/* "spm" or "bpe" */
const char *ht_vocab_kind_name(const ht_vocab *v);
/* The BPE pre-tokenizer in use (tokenizer.ggml.pre, "default" when the file names none); NULL for
   SentencePiece vocabularies. */
const char *ht_vocab_pre_name(const ht_vocab *v);

/* The bytes a token stands for (the same wherever it occurs in a sequence): SentencePiece '▁'
   becomes ' ', byte tokens <0xNN> become that byte, byte-level BPE tokens their bytes (GPT-2's
   byte-to-character mapping undone), user-defined tokens their text, control, unknown and unused
   tokens "". (A leading space after BOS is kept, as llama.cpp does.) Returns
   the byte count written to buf (at most cap), or the needed count, writing nothing, if larger
   than cap; HR_EINVAL for an id outside the vocabulary. */
int ht_token_to_bytes(const ht_vocab *v, int32_t id, char *buf, int cap);

/* Streaming detokenizer: feed ids one at a time; it emits only whole UTF-8 sequences and holds
   back an incomplete tail until the next token completes it (flush emits what is left). Output is
   always valid UTF-8: bytes that can never form a valid sequence (stray continuation bytes, a
   sequence broken off by the next byte, overlong forms, surrogates) come out as U+FFFD, one per
   maximal invalid subpart, and flush turns a held-back incomplete tail into one U+FFFD. */
typedef struct ht_detok {
    const ht_vocab *v;
    char pending[8];
    int  n_pending;
} ht_detok;
void ht_detok_init(ht_detok *d, const ht_vocab *v);
/* Appends the printable text of `id` to out (cap bytes); returns bytes written (>= 0). Ids outside
   the vocabulary emit nothing. A character that does not fit in cap is dropped (never split); a
   cap of ht_detok_max_bytes(v) always fits. */
int  ht_detok_push(ht_detok *d, int32_t id, char *out, int cap);
int  ht_detok_flush(ht_detok *d, char *out, int cap);
int  ht_detok_max_bytes(const ht_vocab *v);  /* most bytes one push or flush can emit */

/* ---- sampler ------------------------------------------------------------------------------------ */
typedef struct ht_sampler_params {
    float    temp;            /* <= 0: greedy */
    int32_t  top_k;           /* <= 0: off */
    float    top_p;           /* >= 1: off */
    float    min_p;           /* <= 0: off */
    float    repeat_penalty;  /* 1: off (llama.cpp semantics: divide positive logits, multiply negative) */
    int32_t  repeat_last_n;   /* window of recent tokens the penalty looks at (0: off, < 0: all since reset) */
    uint64_t seed;            /* HT_SEED_RANDOM: random */
} ht_sampler_params;
ht_sampler_params ht_sampler_default_params(void);  /* llama.cpp defaults: temp 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat 1.0/64, seed random */
#define HT_SEED_RANDOM UINT64_MAX  /* seed value asking for a random seed (time-based, fixed at create) */

typedef struct ht_sampler ht_sampler;
ht_sampler *ht_sampler_create(const ht_sampler_params *p, int32_t n_vocab); /* NULL: bad args / no memory */
void        ht_sampler_free(ht_sampler *s);
/* Picks the next token from logits[n_vocab] (logits may be modified). Deterministic for a seed. */
int32_t     ht_sampler_sample(ht_sampler *s, float *logits);
/* Tells the sampler a token was added to the context (for the repetition penalty). */
void        ht_sampler_accept(ht_sampler *s, int32_t token);
void        ht_sampler_reset(ht_sampler *s);  /* forgets accepted tokens, rewinds the PRNG to its seed */

#endif
