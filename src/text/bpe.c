/* Byte-level BPE ("gpt2" vocabularies: GPT-2, Llama 3, Qwen 2, DeepSeek, StarCoder, Falcon, SmolLM),
   with the same results as llama.cpp's llm_tokenizer_bpe:
     1. the text is split into words by the pre-tokenizer that tokenizer.ggml.pre names: a list of
        regexes applied one after the other, each one cutting every piece of the previous split
        into its matches and the stretches between them (PCRE2 in UTF + UCP mode does the Unicode
        classes; the regexes are llama.cpp's, see bpe_pres below);
     2. each word's bytes become GPT-2's stand-in characters (bytes_to_unicode: printable Latin-1
        bytes stand for themselves, the other 68 for U+0100..U+0143, in byte order), one symbol per
        byte;
     3. repeatedly, of all adjacent symbol pairs listed in tokenizer.ggml.merges, the pair with the
        lowest rank (its index in the list) merges, ties going to the leftmost pair — a binary heap
        of candidate pairs whose stale entries are skipped when popped;
     4. each final symbol is its token; one the vocabulary lacks (a stand-in character StarCoder
        has no token for, or the result of an odd merge list) becomes one token per stand-in
        character, dropping those that have none — never <unk>, which in BPE vocabularies is often
        <|endoftext|> (llama.cpp drops them too).
   Invalid UTF-8 is replaced by U+FFFD, one per bad byte, before all this, as llama.cpp does (PCRE2
   needs valid UTF-8, and llama.cpp's decoder does the same).

   Where llama.cpp's results come from its own code rather than from the regex, the regexes here
   are adjusted to agree (noted at each; \s is llama.cpp's whitespace set, see BPE_WS). Known
   remaining differences, all on exotic input: Unicode version skew between PCRE2's tables and
   llama.cpp's. */
#include "text-impl.h"

#include <stdio.h>
#include <stdlib.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#define BPE_MAX_RE     6
#define BPE_MAX_MERGES (1 << 24)  /* real merge lists are below 300k */

/* ---- pre-tokenizers ------------------------------------------------------------------------------
   The regex lists llama.cpp uses per tokenizer.ggml.pre value (src/llama-vocab.cpp, llm_tokenizer_bpe),
   with non-ASCII characters written as \x{...}. Checked against llama.cpp's test vectors: gpt-2,
   starcoder, falcon, deepseek-llm (shared/tokenizers, in CTest) and llama-bpe, qwen2, qwen35,
   deepseek-coder, command-r, mpt, refact (llama.cpp's models/, see HEARTH_TOKENIZER_VECTORS in
   tests/test-tokenizer.c); the other names share one of those regex lists. */

/* GPT-2's own regex without its final "|\s+": a lone whitespace character before a non-space is
   then left between matches, which makes it a word of its own all the same */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
/* Llama 3's, with the case-insensitive contractions spelled out: PCRE2's (?i) would also fold
   characters such as U+017F (long s) into 's', which llama.cpp does not */
#define RE_LLAMA3 "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}" \
                  "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2 "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" \
                 "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Qwen 3.5's: combining marks join letters */
#define RE_QWEN35 "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}" \
                  "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_CJK "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
#define RE_PORO " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+"

static const char *const re_gpt2[] = { RE_GPT2 };
static const char *const re_llama3[] = { RE_LLAMA3 };
static const char *const re_qwen2[] = { RE_QWEN2 };
static const char *const re_qwen35[] = { RE_QWEN35 };
static const char *const re_starcoder[] = { "\\p{N}", RE_GPT2 };
static const char *const re_falcon[] = { "[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]" };
static const char *const re_default[] = { "[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]" };
static const char *const re_deepseek_llm[] = {
    "[\\r\\n]",
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}"
    "\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}"
    "\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}"
    "\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"
    "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}"
    "\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}"
    "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}"
    "\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}"
    "\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"
    "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}"
    "\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}"
    "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"
    "\\x{1E900}-\\x{1E943}]+",
    /* llama.cpp's class runs U+3000..U+3002, but it matches a copy of the text in which non-ASCII
       whitespace was replaced by U+000B, so U+3000 (ideographic space) never matches it */
    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3001}-\\x{3002}]+",
    "\\s+$",
    RE_CJK,
    "\\p{N}+",
};
static const char *const re_deepseek_coder[] = { "[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK, "\\p{N}" };
static const char *const re_deepseek_v3[] = {
    "\\p{N}{1,3}",
    "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};
static const char *const re_poro[] = { RE_PORO };
static const char *const re_viking[] = { RE_PORO, "\\p{N}" };
static const char *const re_tekken[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+"
    "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*"
    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};
static const char *const re_chameleon[] = {
    "<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
    "[\\p{P}!-/:-@\\[-`{-~]", RE_GPT2,
};

enum {
    BPE_IGNORE_MERGES = 1,  /* a word that is a token as a whole is that token (Llama 3, Tekken) */
    BPE_ADD_BOS       = 2,  /* add_bos defaults to true */
    BPE_NO_BOS        = 4,  /* the default BOS id is none */
};

typedef struct bpe_pre {
    const char        *name;
    const char *const *re;
    int                n_re;
    int                flags;
} bpe_pre;

#define PRE(name, re, flags) { name, re, (int)HR_ARRAY_LEN(re), flags }
static const bpe_pre bpe_pres[] = {
    PRE("default", re_default, 0),
    PRE("gpt-2", re_gpt2, 0),
    PRE("phi-2", re_gpt2, 0),
    PRE("mpt", re_gpt2, 0),
    PRE("olmo", re_gpt2, 0),
    PRE("jais", re_gpt2, 0),
    PRE("roberta-bpe", re_gpt2, 0),
    PRE("exaone4", re_gpt2, 0),
    PRE("a.x-4.0", re_gpt2, 0),
    PRE("mellum", re_gpt2, 0),
    PRE("gigachat", re_gpt2, 0),
    PRE("jina-es", re_gpt2, 0),
    PRE("jina-de", re_gpt2, 0),
    PRE("jina-v1-en", re_gpt2, 0),
    PRE("jina-v2-es", re_gpt2, 0),
    PRE("jina-v2-de", re_gpt2, 0),
    PRE("jina-v2-code", re_gpt2, 0),
    PRE("llama-bpe", re_llama3, BPE_IGNORE_MERGES | BPE_ADD_BOS),
    PRE("llama3", re_llama3, BPE_IGNORE_MERGES | BPE_ADD_BOS),
    PRE("llama-v3", re_llama3, BPE_IGNORE_MERGES | BPE_ADD_BOS),
    PRE("falcon3", re_llama3, BPE_IGNORE_MERGES | BPE_ADD_BOS),
    PRE("falcon-h1", re_llama3, BPE_IGNORE_MERGES | BPE_ADD_BOS),
    PRE("pixtral", re_llama3, BPE_IGNORE_MERGES | BPE_ADD_BOS),
    PRE("lfm2", re_llama3, BPE_IGNORE_MERGES | BPE_ADD_BOS),
    PRE("midm-2.0", re_llama3, BPE_IGNORE_MERGES | BPE_ADD_BOS),
    PRE("dbrx", re_llama3, 0),
    PRE("smaug-bpe", re_llama3, 0),
    PRE("chatglm-bpe", re_llama3, BPE_NO_BOS),
    PRE("glm4", re_llama3, BPE_NO_BOS),
    PRE("qwen2", re_qwen2, 0),
    PRE("deepseek-r1-qwen", re_qwen2, 0),
    PRE("megrez", re_qwen2, 0),
    PRE("kormo", re_qwen2, 0),
    PRE("f2llmv2", re_qwen2, 0),
    PRE("solar-open", re_qwen2, 0),
    PRE("qwen35", re_qwen35, 0),
    PRE("stablelm2", re_qwen2, 0),
    PRE("starcoder", re_starcoder, 0),
    PRE("smollm", re_starcoder, 0),
    PRE("refact", re_starcoder, 0),
    PRE("command-r", re_starcoder, 0),
    PRE("codeshell", re_starcoder, 0),
    PRE("exaone", re_starcoder, 0),
    PRE("minerva-7b", re_starcoder, 0),
    PRE("falcon", re_falcon, 0),
    PRE("deepseek-llm", re_deepseek_llm, 0),
    PRE("deepseek-coder", re_deepseek_coder, 0),
    PRE("deepseek-v3", re_deepseek_v3, 0),
    PRE("poro-chat", re_poro, 0),
    PRE("bloom", re_poro, 0),
    PRE("gpt3-finnish", re_poro, 0),
    PRE("viking", re_viking, 0),
    PRE("tekken", re_tekken, BPE_IGNORE_MERGES | BPE_ADD_BOS),
    PRE("chameleon", re_chameleon, BPE_ADD_BOS),
};
#undef PRE

/* ---- the loaded state ---------------------------------------------------------------------------- */
struct ht_bpe {
    const bpe_pre *pre;
    char           pre_name[64];
    pcre2_code    *re[BPE_MAX_RE];
    int            n_re;
    bool           ignore_merges;

    /* merge r is the pair mtext[moff[r] .. moff[r] + mleft[r]) + mtext[.. moff[r + 1]) (the two
       halves back to back, without the separating space); an unusable entry is empty */
    char          *mtext;
    uint32_t      *moff;     /* [n_merges + 1] */
    uint32_t      *mleft;    /* [n_merges] */
    int32_t        n_merges;
    struct bpe_slot { uint32_t hash; int32_t rank; } *mmap;  /* rank -1 = empty */
    uint32_t       mmask;

    /* The same merges by token id, when every merge half and every merge result is a token (true of
       real vocabularies): one probe of one table per candidate pair instead of hashing and comparing
       strings. by_id is false otherwise, and the string table above does the work. */
    bool           by_id;
    struct bpe_idslot { uint64_t key; int32_t rank, merged; } *imap;  /* key: left id << 32 | right id; rank -1 = empty */
    uint32_t       imask;

    char           enc[256][2];  /* byte -> UTF-8 of its stand-in character */
    uint8_t        enc_n[256];
    int16_t        dec[0x144];   /* stand-in code point -> byte, -1 if none */
};

const char *ht_bpe_pre_name(const struct ht_bpe *b) { return b->pre_name; }

bool ht_bpe_by_id(struct ht_bpe *b, bool by_id) {
    bool was = b->by_id;
    b->by_id = by_id && b->imap;
    return was;
}

int ht_bpe_byte_char(const struct ht_bpe *b, unsigned char c, char out[2]) {
    memcpy(out, b->enc[c], 2);
    return b->enc_n[c];
}

/* GPT-2's bytes_to_unicode */
static void bpe_build_byte_map(struct ht_bpe *b) {
    for (int i = 0; i < (int)HR_ARRAY_LEN(b->dec); i++) b->dec[i] = -1;
    int extra = 0;
    for (int c = 0; c < 256; c++) {
        bool printable = (c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || (c >= 0xae && c <= 0xff);
        int cp = printable ? c : 256 + extra++;
        if (cp < 0x80) {
            b->enc[c][0] = (char)cp;
            b->enc_n[c] = 1;
        } else {
            b->enc[c][0] = (char)(0xc0 | (cp >> 6));
            b->enc[c][1] = (char)(0x80 | (cp & 0x3f));
            b->enc_n[c] = 2;
        }
        b->dec[cp] = (int16_t)c;
    }
}

static inline uint32_t bpe_merge_hash(const char *s, uint32_t n, uint32_t nl) {
    return ht_hash(s, n) ^ (nl * 0x9e3779b1u);
}

/* Rank of the merge of s[0..nl) with s[nl..n), or -1. */
static inline int32_t bpe_rank(const struct ht_bpe *b, const char *s, uint32_t nl, uint32_t n) {
    uint32_t h = bpe_merge_hash(s, n, nl);
    for (uint32_t i = h & b->mmask;; i = (i + 1) & b->mmask) {
        int32_t r = b->mmap[i].rank;
        if (r < 0) return -1;
        if (b->mmap[i].hash == h && b->mleft[r] == nl && b->moff[r + 1] - b->moff[r] == n &&
            memcmp(b->mtext + b->moff[r], s, n) == 0)
            return r;
    }
}

static int bpe_load_merges(struct ht_bpe *b, const gguf_ctx *g, hr_err *err) {
    const char *key = "tokenizer.ggml.merges";
    int et;
    uint64_t n;
    const void *data;
    if (gguf_find_key(g, key) < 0)
        return hr_fail(err, HR_EFORMAT, "ht_vocab_load: a 'gpt2' (BPE) vocabulary needs %s, which the file lacks", key);
    if (!gguf_get_arr(g, key, &et, &n, &data) || et != GGUF_VT_STRING)
        return hr_fail(err, HR_EFORMAT, "ht_vocab_load: %s is not a string array", key);
    if (n > BPE_MAX_MERGES)
        return hr_fail(err, HR_EFORMAT, "ht_vocab_load: %s has %llu entries", key, (unsigned long long)n);
    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s;
        if (!gguf_get_arr_str(g, key, i, &s))
            return hr_fail(err, HR_EFORMAT, "ht_vocab_load: %s[%llu] unreadable", key, (unsigned long long)i);
        total += (size_t)s.n;
        if (total >= UINT32_MAX)
            return hr_fail(err, HR_ERANGE, "ht_vocab_load: %s holds more than 4 GiB of text", key);
    }
    b->n_merges = (int32_t)n;
    b->mtext = malloc(total ? total : 1);
    b->moff = malloc(((size_t)n + 1) * sizeof *b->moff);
    b->mleft = malloc((n ? (size_t)n : 1) * sizeof *b->mleft);
    uint32_t size = 16;
    while (size < 2u * (uint32_t)n) size *= 2;
    b->mmap = malloc((size_t)size * sizeof *b->mmap);
    if (!b->mtext || !b->moff || !b->mleft || !b->mmap)
        return hr_fail(err, HR_ENOMEM, "ht_vocab_load: out of memory for %llu merges", (unsigned long long)n);
    memset(b->mmap, 0xff, (size_t)size * sizeof *b->mmap);
    b->mmask = size - 1;

    uint32_t off = 0;
    int n_bad = 0;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s;
        gguf_get_arr_str(g, key, i, &s);
        b->moff[i] = off;
        b->mleft[i] = 0;
        /* "left right", split at the first space after the first byte (a left half may be a
           space itself in vocabularies that do not map bytes); anything else is unusable */
        const char *sp = s.n > 1 ? memchr(s.s + 1, ' ', (size_t)s.n - 1) : NULL;
        if (!sp || sp + 1 == s.s + s.n) { n_bad++; continue; }
        uint32_t nl = (uint32_t)(sp - s.s), nr = (uint32_t)(s.n - nl - 1);
        memcpy(b->mtext + off, s.s, nl);
        memcpy(b->mtext + off + nl, sp + 1, nr);
        uint32_t h = bpe_merge_hash(b->mtext + off, nl + nr, nl);
        if (bpe_rank(b, b->mtext + off, nl, nl + nr) >= 0) continue;  /* a repeat: the first rank counts */
        b->mleft[i] = nl;
        off += nl + nr;
        b->moff[i + 1] = off;  /* provisional, so the map can compare the entry */
        uint32_t j = h & b->mmask;
        while (b->mmap[j].rank >= 0) j = (j + 1) & b->mmask;
        b->mmap[j] = (struct bpe_slot){ h, (int32_t)i };
    }
    b->moff[n] = off;  /* a skipped entry i ends where it starts: moff[i + 1] == moff[i] */
    if (n_bad) HR_LOGW("ht_vocab_load: %d entries of %s are not 'left right' pairs; ignored", n_bad, key);
    return 0;
}

static inline uint32_t bpe_id_hash(uint64_t key) {
    return (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 32);
}

/* the slot for key (empty or holding it) */
static inline const struct bpe_idslot *bpe_id_find(const struct ht_bpe *b, uint64_t key) {
    for (uint32_t i = bpe_id_hash(key) & b->imask;; i = (i + 1) & b->imask)
        if (b->imap[i].rank < 0 || b->imap[i].key == key) return &b->imap[i];
}

/* Builds the by-id table if the vocabulary allows it (see ht_bpe.by_id); not being able to is
   not an error. */
static int bpe_build_ids(struct ht_bpe *b, const ht_vocab *v, hr_err *err) {
    uint32_t size = 16;
    while (size < 2u * (uint32_t)b->n_merges) size *= 2;
    b->imap = malloc((size_t)size * sizeof *b->imap);
    if (!b->imap) return hr_fail(err, HR_ENOMEM, "ht_vocab_load: out of memory for the merge table");
    memset(b->imap, 0xff, (size_t)size * sizeof *b->imap);
    b->imask = size - 1;
    for (int32_t r = 0; r < b->n_merges; r++) {
        uint32_t n = b->moff[r + 1] - b->moff[r], nl = b->mleft[r];
        if (n == 0) continue;  /* unusable or repeated entry */
        const char *s = b->mtext + b->moff[r];
        int32_t l = ht_vocab_lookup(v, s, nl), rt = ht_vocab_lookup(v, s + nl, n - nl), m = ht_vocab_lookup(v, s, n);
        if (l < 0 || rt < 0 || m < 0) {
            HR_LOGD("ht_vocab_load: merge %d makes or uses a string that is no token; merging by text", r);
            free(b->imap);
            b->imap = NULL;
            return 0;
        }
        uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)rt;
        struct bpe_idslot *slot = (struct bpe_idslot *)bpe_id_find(b, key);
        if (slot->rank < 0) *slot = (struct bpe_idslot){ key, r, m };
    }
    b->by_id = true;
    return 0;
}

/* Whitespace as llama.cpp has it (Unicode's White_Space property). PCRE2's \s in UCP mode also
   matches U+180E, so the regexes get this class instead. */
#define BPE_WS "\\t\\n\\x0B\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

/* re with \s and \S spelled out as BPE_WS (inside a character class, \s becomes its members);
   false if it does not fit in out */
static bool bpe_rewrite_ws(const char *re, char *out, size_t cap) {
    size_t o = 0;
    bool in_class = false;
    for (size_t i = 0; re[i]; i++) {
        const char *put = NULL;
        char two[3] = { re[i], 0, 0 };
        if (re[i] == '\\' && re[i + 1]) {
            char c = re[++i];
            if (c == 's') put = in_class ? BPE_WS : "[" BPE_WS "]";
            else if (c == 'S' && !in_class) put = "[^" BPE_WS "]";
            else { two[1] = c; put = two; }  /* \S inside a class: not in any list, left as PCRE2's */
        } else {
            if (re[i] == '[' && !in_class) {
                in_class = true;
                /* a ']' right after '[' or '[^' is a member, not the end */
                size_t j = i + 1 + (re[i + 1] == '^');
                if (re[j] == ']') {
                    size_t n = j + 1 - i;
                    if (o + n >= cap) return false;
                    memcpy(out + o, re + i, n);
                    o += n;
                    i = j;
                    continue;
                }
            } else if (re[i] == ']' && in_class) {
                in_class = false;
            }
            put = two;
        }
        size_t n = strlen(put);
        if (o + n >= cap) return false;
        memcpy(out + o, put, n);
        o += n;
    }
    out[o] = 0;
    return true;
}

static int bpe_compile(struct ht_bpe *b, hr_err *err) {
    char buf[4096];
    for (int i = 0; i < b->pre->n_re; i++) {
        int ec;
        PCRE2_SIZE eo;
        HR_ASSERT(bpe_rewrite_ws(b->pre->re[i], buf, sizeof buf));  /* the lists are ours: sized to fit */
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)buf, PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &ec, &eo, NULL);
        if (!re) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(ec, msg, sizeof msg);
            return hr_fail(err, HR_EUNSUPPORTED, "ht_vocab_load: pre-tokenizer '%s': regex %d does not compile at %zu: %s",
                           b->pre_name, i, (size_t)eo, (const char *)msg);
        }
        /* JIT is several times faster; without it (no JIT on this CPU) the interpreter still works */
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
        b->re[b->n_re++] = re;
    }
    return 0;
}

int ht_bpe_load(ht_vocab *v, const gguf_ctx *g, hr_err *err) {
    struct ht_bpe *b = calloc(1, sizeof *b);
    if (!b) return hr_fail(err, HR_ENOMEM, "ht_vocab_load: out of memory");
    v->bpe = b;
    bpe_build_byte_map(b);

    const char *key = "tokenizer.ggml.pre";
    gguf_str pre = { 0 };
    if (gguf_find_key(g, key) >= 0 && !gguf_get_str(g, key, &pre))
        return hr_fail(err, HR_EFORMAT, "ht_vocab_load: %s is not a string", key);
    if (pre.n == 0) {
        /* llama.cpp's fallback for files converted before the key existed */
        HR_LOGW("ht_vocab_load: no %s in the file; using the 'default' pre-tokenizer (tokenization may "
                "differ from the model's own: consider regenerating the GGUF)", key);
        pre = (gguf_str){ "default", 7 };
    }
    for (size_t i = 0; i < HR_ARRAY_LEN(bpe_pres); i++)
        if (strlen(bpe_pres[i].name) == (size_t)pre.n && memcmp(bpe_pres[i].name, pre.s, (size_t)pre.n) == 0)
            b->pre = &bpe_pres[i];
    if (!b->pre)
        return hr_fail(err, HR_EUNSUPPORTED, "ht_vocab_load: unknown BPE pre-tokenizer %s = '%.*s'", key,
                       (int)HR_MIN(pre.n, 64), pre.s);
    snprintf(b->pre_name, sizeof b->pre_name, "%s", b->pre->name);
    b->ignore_merges = b->pre->flags & BPE_IGNORE_MERGES;
    if (b->pre->flags & BPE_ADD_BOS) v->add_bos = true;
    if (b->pre->flags & BPE_NO_BOS) v->bos = -1;

    int rc = bpe_load_merges(b, g, err);
    if (rc < 0 || (rc = bpe_build_ids(b, v, err)) < 0) return rc;
    return bpe_compile(b, err);
}

void ht_bpe_free(struct ht_bpe *b) {
    if (!b) return;
    for (int i = 0; i < b->n_re; i++) pcre2_code_free(b->re[i]);
    free(b->mtext);
    free(b->moff);
    free(b->mleft);
    free(b->mmap);
    free(b->imap);
    free(b);
}

/* ---- decoding a token text ----------------------------------------------------------------------- */
/* Length of the valid UTF-8 sequence at p[0..n) (strictly: no overlong forms, surrogates or code
   points above U+10FFFF, exactly what PCRE2 accepts), or 0 if none starts there. */
static int utf8_valid_len(const unsigned char *p, size_t n) {
    unsigned c = p[0];
    if (c < 0x80) return 1;
    int len;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) { len = 3; if (c == 0xe0) lo = 0xa0; if (c == 0xed) hi = 0x9f; }
    else if (c >= 0xf0 && c <= 0xf4) { len = 4; if (c == 0xf0) lo = 0x90; if (c == 0xf4) hi = 0x8f; }
    else return 0;
    if ((size_t)len > n) return 0;
    if (p[1] < lo || p[1] > hi) return 0;
    for (int i = 2; i < len; i++)
        if (p[i] < 0x80 || p[i] > 0xbf) return 0;
    return len;
}

int32_t ht_bpe_decode(const struct ht_bpe *b, const char *s, int32_t n, char *dst) {
    const unsigned char *p = (const unsigned char *)s;
    int32_t m = 0;
    for (int32_t i = 0; i < n;) {
        int k = utf8_valid_len(p + i, (size_t)(n - i));
        uint32_t cp = k == 1 ? p[i] : k == 2 ? (uint32_t)(p[i] & 0x1f) << 6 | (p[i + 1] & 0x3f) : UINT32_MAX;
        if (cp < HR_ARRAY_LEN(b->dec) && b->dec[cp] >= 0) {
            dst[m++] = (char)b->dec[cp];
            i += k;
        } else {
            /* not a stand-in character (added tokens can hold any text): its bytes as they are.
               llama.cpp prints an [UNK_BYTE_...] marker here instead. */
            if (k == 0) k = 1;
            memcpy(dst + m, p + i, (size_t)k);
            m += k;
            i += k;
        }
    }
    return m;
}

/* ---- tokenizing ------------------------------------------------------------------------------------ */
typedef struct bpe_sym {
    int32_t  prev, next;  /* neighbours in the word, -1 at the ends */
    uint32_t off, n;      /* bytes [off, off + n) of the encoded word; n == 0 once merged away */
} bpe_sym;

/* a queued pair; key = rank << 32 | left index, so the smallest key is the lowest rank, leftmost */
typedef struct bpe_pair {
    uint64_t key;
    int32_t  right;
    uint32_t size;        /* bytes of left + right when queued (by id: the right side's id), to detect staleness */
    int32_t  merged;      /* by id: the token the merge makes */
} bpe_pair;

typedef struct bpe_span { uint32_t off, n; } bpe_span;

typedef struct bpe_state {
    const ht_vocab      *v;
    const struct ht_bpe *b;
    char                *enc;     /* the current word in stand-in characters */
    const char          *word;    /* the current word's bytes */
    bpe_sym             *sym;
    int32_t             *id;      /* by id: each symbol's token */
    size_t               word_cap;
    bpe_pair            *heap;
    size_t               heap_n, heap_cap;
    bpe_span            *span[2];  /* the current split and the next one */
    size_t               span_n[2], span_cap[2];
    pcre2_match_data    *md;
} bpe_state;

static int bpe_heap_push(bpe_state *st, bpe_pair p) {
    if (st->heap_n == st->heap_cap) {
        size_t cap = st->heap_cap ? st->heap_cap * 2 : 64;
        bpe_pair *a = realloc(st->heap, cap * sizeof *a);
        if (!a) return HR_ENOMEM;
        st->heap = a;
        st->heap_cap = cap;
    }
    size_t i = st->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (st->heap[parent].key <= p.key) break;
        st->heap[i] = st->heap[parent];
        i = parent;
    }
    st->heap[i] = p;
    return 0;
}

static bpe_pair bpe_heap_pop(bpe_state *st) {
    bpe_pair top = st->heap[0], last = st->heap[--st->heap_n];
    size_t i = 0, n = st->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && st->heap[c + 1].key < st->heap[c].key) c++;
        if (last.key <= st->heap[c].key) break;
        st->heap[i] = st->heap[c];
        i = c;
    }
    if (n) st->heap[i] = last;
    return top;
}

static int bpe_try_pair(bpe_state *st, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return 0;
    const bpe_sym *l = &st->sym[left], *r = &st->sym[right];
    uint32_t size = l->n + r->n;
    int32_t rank = bpe_rank(st->b, st->enc + l->off, l->n, size);
    if (rank < 0) return 0;
    return bpe_heap_push(st, (bpe_pair){ (uint64_t)(uint32_t)rank << 32 | (uint32_t)left, right, size, -1 });
}

static void bpe_emit(bpe_state *st, const char *s, uint32_t n, ht_tokout *o) {
    const ht_vocab *v = st->v;
    int32_t id = ht_vocab_lookup(v, s, n);
    if (id >= 0) { ht_tokout_push(o, id); return; }
    /* a merge produced a string the vocabulary lacks: its characters one by one */
    for (uint32_t i = 0; i < n;) {
        uint32_t k = (unsigned char)s[i] < 0x80 ? 1 : 2;  /* stand-in characters are 1 or 2 bytes */
        if (k > n - i) k = n - i;
        id = ht_vocab_lookup(v, s + i, k);
        if (id >= 0) ht_tokout_push(o, id);
        i += k;
    }
}

static int bpe_reserve_word(bpe_state *st, size_t n) {
    if (n <= st->word_cap) return 0;
    size_t cap = HR_MAX(n, 2 * st->word_cap);
    char *enc = realloc(st->enc, 2 * cap);
    if (!enc) return HR_ENOMEM;
    st->enc = enc;
    bpe_sym *sym = realloc(st->sym, cap * sizeof *sym);
    if (!sym) return HR_ENOMEM;
    st->sym = sym;
    int32_t *id = realloc(st->id, cap * sizeof *id);
    if (!id) return HR_ENOMEM;
    st->id = id;
    st->word_cap = cap;
    return 0;
}

/* by id: a queued pair is stale when either side merged away (n == 0) or the right side grew
   (its id changed; the left side cannot grow without its right neighbour merging away) */
static int bpe_try_pair_id(bpe_state *st, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return 0;
    uint64_t key = (uint64_t)(uint32_t)st->id[left] << 32 | (uint32_t)st->id[right];
    const struct bpe_idslot *slot = bpe_id_find(st->b, key);
    if (slot->rank < 0) return 0;
    return bpe_heap_push(st, (bpe_pair){ (uint64_t)(uint32_t)slot->rank << 32 | (uint32_t)left, right,
                                         (uint32_t)st->id[right], slot->merged });
}

/* Steps 3 and 4 by token id on the n symbols of the encoded word (set up by bpe_word). */
static int bpe_word_ids(bpe_state *st, uint32_t n, ht_tokout *o) {
    const ht_vocab *v = st->v;
    int rc;
    for (uint32_t i = 0; i < n; i++) st->id[i] = v->byte_tok[(unsigned char)st->word[i]];
    st->heap_n = 0;
    for (uint32_t i = 1; i < n; i++)
        if ((rc = bpe_try_pair_id(st, (int32_t)i - 1, (int32_t)i)) < 0) return rc;
    while (st->heap_n) {
        bpe_pair p = bpe_heap_pop(st);
        int32_t left = (int32_t)(uint32_t)p.key;
        bpe_sym *l = &st->sym[left], *r = &st->sym[p.right];
        if (l->n == 0 || r->n == 0 || (uint32_t)st->id[p.right] != p.size) continue;
        st->id[left] = p.merged;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) st->sym[r->next].prev = left;
        if ((rc = bpe_try_pair_id(st, l->prev, left)) < 0) return rc;
        if ((rc = bpe_try_pair_id(st, left, l->next)) < 0) return rc;
    }
    for (int32_t i = 0; i != -1; i = st->sym[i].next) {
        /* a byte whose stand-in is no token (StarCoder lacks a few) never merges and is dropped,
           as on the text path */
        if (st->id[i] >= 0) ht_tokout_push(o, st->id[i]);
    }
    return 0;
}

/* Steps 2-4 on one word of n bytes. */
static int bpe_word(bpe_state *st, const char *w, uint32_t n, ht_tokout *o) {
    const struct ht_bpe *b = st->b;
    int rc = bpe_reserve_word(st, n);
    if (rc < 0) return rc;
    uint32_t e = 0;
    for (uint32_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)w[i];
        st->sym[i] = (bpe_sym){ .prev = (int32_t)i - 1, .next = i + 1 < n ? (int32_t)i + 1 : -1, .off = e, .n = b->enc_n[c] };
        memcpy(st->enc + e, b->enc[c], b->enc_n[c]);
        e += b->enc_n[c];
    }
    if (n == 1 || (b->ignore_merges && ht_vocab_lookup(st->v, st->enc, e) >= 0)) {
        bpe_emit(st, st->enc, e, o);
        return 0;
    }
    if (b->by_id) {
        st->word = w;
        return bpe_word_ids(st, n, o);
    }

    st->heap_n = 0;
    for (uint32_t i = 1; i < n; i++)
        if ((rc = bpe_try_pair(st, (int32_t)i - 1, (int32_t)i)) < 0) return rc;
    while (st->heap_n) {
        bpe_pair p = bpe_heap_pop(st);
        int32_t left = (int32_t)(uint32_t)p.key;
        bpe_sym *l = &st->sym[left], *r = &st->sym[p.right];
        /* stale: one side merged into something else since the pair was queued (symbols only grow) */
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) st->sym[r->next].prev = left;
        if ((rc = bpe_try_pair(st, l->prev, left)) < 0) return rc;
        if ((rc = bpe_try_pair(st, left, l->next)) < 0) return rc;
    }
    for (int32_t i = 0; i != -1; i = st->sym[i].next) bpe_emit(st, st->enc + st->sym[i].off, st->sym[i].n, o);
    return 0;
}

static int bpe_span_push(bpe_state *st, int k, uint32_t off, uint32_t n) {
    if (st->span_n[k] == st->span_cap[k]) {
        size_t cap = st->span_cap[k] ? st->span_cap[k] * 2 : 256;
        bpe_span *a = realloc(st->span[k], cap * sizeof *a);
        if (!a) return HR_ENOMEM;
        st->span[k] = a;
        st->span_cap[k] = cap;
    }
    st->span[k][st->span_n[k]++] = (bpe_span){ off, n };
    return 0;
}

/* One regex over every span of split `from`, into split `to`: each span becomes its matches and
   the stretches between them. The subject of each match is the span alone, so anchors and
   lookaheads stop at its ends, as in llama.cpp. */
static int bpe_split(bpe_state *st, const pcre2_code *re, const char *text, int from, int to) {
    st->span_n[to] = 0;
    int rc;
    for (size_t s = 0; s < st->span_n[from]; s++) {
        bpe_span sp = st->span[from][s];
        PCRE2_SPTR subj = (PCRE2_SPTR)text + sp.off;
        PCRE2_SIZE pos = 0, done = 0;
        uint32_t opts = PCRE2_NO_UTF_CHECK;  /* checked once for the whole text */
        while (pos < sp.n) {
            int m = pcre2_match(re, subj, sp.n, pos, opts, st->md, NULL);
            if (m == PCRE2_ERROR_NOMATCH) break;
            if (m == PCRE2_ERROR_JIT_STACKLIMIT && !(opts & PCRE2_NO_JIT)) {
                opts |= PCRE2_NO_JIT;  /* the interpreter keeps its backtracking on the heap */
                continue;
            }
            if (m < 0) return HR_ERANGE;  /* match or heap limit: pathological input */
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
            if (ov[1] <= ov[0]) {  /* empty match (none of the regexes make one): step a character */
                pos = ov[0] + 1;
                while (pos < sp.n && (subj[pos] & 0xc0) == 0x80) pos++;
                continue;
            }
            if (ov[0] > done && (rc = bpe_span_push(st, to, sp.off + (uint32_t)done, (uint32_t)(ov[0] - done))) < 0) return rc;
            if ((rc = bpe_span_push(st, to, sp.off + (uint32_t)ov[0], (uint32_t)(ov[1] - ov[0]))) < 0) return rc;
            pos = done = ov[1];
        }
        if (done < sp.n && (rc = bpe_span_push(st, to, sp.off + (uint32_t)done, sp.n - (uint32_t)done)) < 0) return rc;
    }
    return 0;
}

/* text with every byte that does not start a valid UTF-8 sequence (or continue one) replaced by
   U+FFFD; NULL (and *rc = 0) if it is valid as it is */
static char *bpe_sanitize(const char *text, size_t len, size_t *out_len, int *rc) {
    *rc = 0;
    size_t i = 0, bad = 0;
    for (; i < len;) {
        int k = utf8_valid_len((const unsigned char *)text + i, len - i);
        if (k) i += (size_t)k;
        else { bad++; i++; }
    }
    if (!bad) return NULL;
    char *s = malloc(len + 2 * bad);
    if (!s) { *rc = HR_ENOMEM; return NULL; }
    size_t m = 0;
    for (i = 0; i < len;) {
        int k = utf8_valid_len((const unsigned char *)text + i, len - i);
        if (k) {
            memcpy(s + m, text + i, (size_t)k);
            m += (size_t)k;
            i += (size_t)k;
        } else {
            memcpy(s + m, "\xef\xbf\xbd", 3);
            m += 3;
            i++;
        }
    }
    *out_len = m;
    return s;
}

int ht_bpe_tokenize(const ht_vocab *v, const char *text, size_t len, ht_tokout *o) {
    if (len == 0) return 0;
    const struct ht_bpe *b = v->bpe;
    int rc;
    char *clean = bpe_sanitize(text, len, &len, &rc);
    if (rc < 0) return rc;
    if (clean) text = clean;
    if (len > UINT32_MAX) { free(clean); return HR_ERANGE; }

    bpe_state st = { .v = v, .b = b };
    st.md = pcre2_match_data_create(1, NULL);  /* only the whole match is needed */
    if (!st.md) { rc = HR_ENOMEM; goto done; }

    /* 1. the split: regex after regex, alternating between the two span lists */
    int cur = 0;
    if ((rc = bpe_span_push(&st, cur, 0, (uint32_t)len)) < 0) goto done;
    for (int r = 0; r < b->n_re; r++) {
        if ((rc = bpe_split(&st, b->re[r], text, cur, 1 - cur)) < 0) goto done;
        cur = 1 - cur;
    }
    /* 2-4. words to tokens */
    for (size_t s = 0; s < st.span_n[cur]; s++) {
        bpe_span sp = st.span[cur][s];
        if ((rc = bpe_word(&st, text + sp.off, sp.n, o)) < 0) goto done;
    }

done:
    pcre2_match_data_free(st.md);
    free(st.span[0]);
    free(st.span[1]);
    free(st.heap);
    free(st.sym);
    free(st.id);
    free(st.enc);
    free(clean);
    return rc;
}
