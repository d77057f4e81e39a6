// modules: base quant gguf text
/* Tokenizer and detokenizer: llama.cpp's golden vectors for the SentencePiece and byte-level BPE
   vocabularies (shared/tokenizers/X.gguf.inp/.out), round trips, the stories260K reference prompts
   and continuations, special-token parsing against llama.cpp, BPE merge order and pre-tokenizer
   choice on hand-made vocabularies (an unknown pre-tokenizer refused by name), the streaming
   detokenizer's UTF-8 handling, long and invalid input (the GPL-3 text round trip among it), and
   vocabulary validation; tools/textbench measures the tokenizer's speed.
   HEARTH_TOKENIZER_VECTORS=DIR adds the vectors of every vocabulary in DIR (e.g. llama.cpp's
   models/ folder, which has llama-bpe, qwen2 and more). */
#include "test.h"
#include "text/text.h"
#include "text/text-impl.h"  /* ht_vocab.spm_words, ht_bpe_by_id: fast paths are checked against the plain ones */

#include <dirent.h>
#include <jansson.h>
#include <unistd.h>

static const char *g_dir;

static const char *find(const char *p, const char *end, const char *pat, size_t n) {
    for (; (size_t)(end - p) >= n; p++)
        if (memcmp(p, pat, n) == 0) return p;
    return NULL;
}

static ht_vocab *open_vocab_at(const char *path, gguf_ctx **gp, hr_err *errp) {
    hr_err err = { 0 };
    gguf_ctx *g = gguf_open(path, &err);
    if (!g) { fprintf(stderr, "%s: %s\n", path, err.msg); if (errp) *errp = err; return NULL; }
    ht_vocab *v = ht_vocab_load(g, &err);
    if (!v) { if (errp) *errp = err; else fprintf(stderr, "%s: %s\n", path, err.msg); gguf_close(g); return NULL; }
    *gp = g;
    return v;
}

static ht_vocab *open_vocab(const char *rel, gguf_ctx **gp) {
    hr_err err = { 0 };
    gguf_ctx *g = gguf_open(test_path(g_dir, rel), &err);
    if (!g) { fprintf(stderr, "%s: %s\n", rel, err.msg); return NULL; }
    ht_vocab *v = ht_vocab_load(g, &err);
    if (!v) { fprintf(stderr, "%s: %s\n", rel, err.msg); gguf_close(g); return NULL; }
    *gp = g;
    return v;
}

/* ids of text (no BOS unless asked) in a malloc'd array; *n = count, or negative on error */
static int32_t *tokenize(const ht_vocab *v, const char *text, size_t len, bool bos, int *n) {
    int need = ht_tokenize(v, text, len, bos, NULL, 0);
    *n = need;
    if (need < 0) return NULL;
    int32_t *ids = malloc(sizeof *ids * (size_t)(need + 1));
    int got = ht_tokenize(v, text, len, bos, ids, need);
    CHECK(got == need);
    return ids;
}

/* concatenated pieces of ids (malloc'd, NUL-terminated), through ht_token_to_bytes */
static char *detokenize(const ht_vocab *v, const int32_t *ids, int n, size_t *len) {
    size_t cap = 64, m = 0;
    char *s = malloc(cap);
    for (int i = 0; i < n; i++) {
        int k = ht_token_to_bytes(v, ids[i], NULL, 0);
        if (k < 0) { CHECK(k >= 0); continue; }
        while (m + (size_t)k + 1 > cap) { cap *= 2; s = realloc(s, cap); }
        int k2 = ht_token_to_bytes(v, ids[i], s + m, k);
        CHECK(k2 == k);
        m += (size_t)k;
    }
    s[m] = 0;
    *len = m;
    return s;
}

/* ---- llama.cpp vectors: inputs separated by "\n__ggml_vocab_test__\n" (every input, the last
   too, is followed by one), expected ids one line per input without BOS ---------------------------- */
/* dir/name and its .inp/.out; returns false without checking anything when `optional` and the
   vocabulary is of a kind hearth does not support */
static bool test_vectors_in(const char *dir, const char *name, bool optional) {
    char rel[512];
    gguf_ctx *g;
    hr_err err = { 0 };
    ht_vocab *v = open_vocab_at(test_path(dir, name), &g, optional ? &err : NULL);
    if (!v && optional && err.code == HR_EUNSUPPORTED) {
        printf("%s: not supported (%s)\n", name, err.msg);
        return false;
    }
    CHECK(v != NULL);
    if (!v) return false;
    size_t inp_n, out_n;
    snprintf(rel, sizeof rel, "%s.inp", name);
    char *inp = test_read_file(test_path(dir, rel), &inp_n);
    snprintf(rel, sizeof rel, "%s.out", name);
    char *outf = test_read_file(test_path(dir, rel), &out_n);
    CHECK(inp && outf);
    if (!inp || !outf) { free(inp); free(outf); ht_vocab_free(v); gguf_close(g); return false; }
    outf = realloc(outf, out_n + 1);
    outf[out_n] = 0;
    bool bpe = strcmp(ht_vocab_kind_name(v), "bpe") == 0;

    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t sep_n = sizeof sep - 1;
    int total = 0, match = 0, round = 0;
    const char *p = inp, *end = inp + inp_n, *line = outf;
    while (p < end) {
        const char *q = find(p, end, sep, sep_n);
        if (!q) break;
        size_t len = (size_t)(q - p);
        /* expected ids: this line of .out */
        const char *eol = strchr(line, '\n');
        if (!eol) eol = line + strlen(line);
        int32_t want[4096];
        int n_want = 0;
        for (const char *s = line; s < eol && n_want < 4096;) {
            char *e;
            long x = strtol(s, &e, 10);
            if (e == s) break;
            want[n_want++] = (int32_t)x;
            s = e;
        }
        line = *eol ? eol + 1 : eol;

        int n, n_plain;
        int32_t *ids = tokenize(v, p, len, false, &n);
        bool same = n == n_want && (n == 0 || memcmp(ids, want, sizeof *ids * (size_t)n) == 0);
        bool words = v->spm_words;
        if (words || bpe) {
            /* SentencePiece's word-by-word path gives what the whole-text merge gives; BPE's merges
               by token id give what merges by text give */
            v->spm_words = false;
            bool by_id = bpe && ht_bpe_by_id(v->bpe, false);
            if (bpe && !optional) CHECK(by_id);
            int32_t *plain = tokenize(v, p, len, false, &n_plain);
            v->spm_words = words;
            if (bpe) ht_bpe_by_id(v->bpe, by_id);
            same = same && n_plain == n && (n == 0 || memcmp(plain, ids, sizeof *ids * (size_t)n) == 0);
            free(plain);
        }
        match += same;
        if (!same) {
            fprintf(stderr, "%s: input %d '%.*s': got", name, total, (int)len, p);
            for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n   want");
            for (int i = 0; i < n_want; i++) fprintf(stderr, " %d", want[i]);
            fprintf(stderr, "\n");
        }
        /* round trip: the pieces give back the text (behind the space prefix SentencePiece adds) */
        size_t dlen;
        char *d = detokenize(v, ids, n > 0 ? n : 0, &dlen);
        bool rt = len == 0 ? dlen == 0
                : bpe ? dlen == len && memcmp(d, p, len) == 0
                : dlen == len + 1 && d[0] == ' ' && memcmp(d + 1, p, len) == 0;
        round += rt;
        if (!rt) fprintf(stderr, "%s: input %d does not round-trip: '%s'\n", name, total, d);
        free(d);
        free(ids);
        total++;
        p = q + sep_n;
    }
    printf("%s (%s%s%s): %d/%d vectors match, %d/%d round-trip\n", name, ht_vocab_kind_name(v),
           bpe ? ", pre " : "", bpe ? ht_vocab_pre_name(v) : "", match, total, round, total);
    if (!optional) CHECK(total == 46);
    CHECK(total > 0);
    CHECK(match == total);
    CHECK(round == total);
    free(inp);
    free(outf);
    ht_vocab_free(v);
    gguf_close(g);
    return true;
}

static void test_vectors(const char *name) {
    test_vectors_in(test_path(g_dir, "tokenizers"), name, false);
}

/* HEARTH_TOKENIZER_VECTORS=DIR (e.g. llama.cpp's models/) also checks every ggml-vocab-*.gguf there
   that has .inp/.out vectors and a vocabulary kind hearth supports */
static void test_vectors_extra(void) {
    const char *dir = getenv("HEARTH_TOKENIZER_VECTORS");
    if (!dir || !*dir) return;
    DIR *d = opendir(dir);
    CHECKF(d != NULL, "HEARTH_TOKENIZER_VECTORS=%s: cannot open", dir);
    if (!d) return;
    int n_checked = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, "ggml-vocab-", 11) != 0 || n < 5 || strcmp(e->d_name + n - 5, ".gguf") != 0) continue;
        char inp[512];
        snprintf(inp, sizeof inp, "%s/%s.inp", dir, e->d_name);
        if (access(inp, R_OK) != 0) continue;
        n_checked += test_vectors_in(dir, e->d_name, true);
    }
    closedir(d);
    printf("HEARTH_TOKENIZER_VECTORS: %d extra vocabularies checked\n", n_checked);
}

/* ---- stories260K: the reference prompts (BOS added) and the greedy continuations' text ---------- */
static void test_stories(void) {
    gguf_ctx *g;
    ht_vocab *v = open_vocab("models/stories260K.gguf", &g);
    CHECK(v != NULL);
    if (!v) return;
    CHECK(ht_vocab_size(v) == 512);
    CHECK(ht_token_bos(v) == 1 && ht_token_eos(v) == 2 && ht_add_bos(v));
    CHECK(ht_is_eog(v, 2) && !ht_is_eog(v, 1) && !ht_is_eog(v, 400) && !ht_is_eog(v, -1));
    CHECK(ht_token_text(v, 1) && strcmp(ht_token_text(v, 1), "<s>") == 0);
    CHECK(ht_token_text(v, 512) == NULL);

    int n_files = 0;
    for (int k = 1; k <= 16; k++) {
        char rel[128];
        snprintf(rel, sizeof rel, "reference/stories260K/public-%d.gen.json", k);
        json_error_t jerr;
        json_t *j = json_load_file(test_path(g_dir, rel), 0, &jerr);
        if (!j) break;
        n_files++;
        const char *prompt = json_string_value(json_object_get(j, "prompt"));
        json_t *want = json_object_get(j, "prompt_tokens");
        CHECK(prompt && json_is_array(want));
        if (prompt && json_is_array(want)) {
            int n;
            int32_t *ids = tokenize(v, prompt, strlen(prompt), ht_add_bos(v), &n);
            bool same = n == (int)json_array_size(want);
            for (int i = 0; same && i < n; i++) same = ids[i] == json_integer_value(json_array_get(want, (size_t)i));
            CHECKF(same, "%s: prompt '%s' tokenizes differently", rel, prompt);
            free(ids);
        }
        /* the continuation through the streaming detokenizer gives the reference text */
        const char *text = json_string_value(json_object_get(j, "text"));
        json_t *toks = json_object_get(j, "tokens");
        if (text && json_is_array(toks)) {
            ht_detok d;
            ht_detok_init(&d, v);
            int cap = ht_detok_max_bytes(v);
            size_t m = 0, size = strlen(text) + 64;
            char *got = malloc(size + (size_t)cap);
            for (size_t i = 0; i < json_array_size(toks) && m < size; i++)
                m += (size_t)ht_detok_push(&d, (int32_t)json_integer_value(json_array_get(toks, i)), got + m, cap);
            m += (size_t)ht_detok_flush(&d, got + m, cap);
            CHECKF(m == strlen(text) && memcmp(got, text, m) == 0, "%s: continuation text differs", rel);
            free(got);
        }
        json_decref(j);
    }
    printf("stories260K: %d reference prompts checked\n", n_files);
    CHECK(n_files >= 4);

    /* "Once upon a time" with BOS, spelled out */
    int n;
    int32_t *ids = tokenize(v, "Once upon a time", 16, true, &n);
    const int32_t want[] = { 1, 403, 407, 261, 378 };
    CHECK(n == 5 && memcmp(ids, want, sizeof want) == 0);
    /* a short buffer still reports the full count and fills what fits */
    int32_t two[2] = { -7, -7 };
    CHECK(ht_tokenize(v, "Once upon a time", 16, true, two, 2) == 5);
    CHECK(two[0] == 1 && two[1] == 403);
    free(ids);
    CHECK(ht_tokenize(v, "", 0, true, two, 2) == 1);   /* just BOS */
    CHECK(ht_tokenize(v, "", 0, false, two, 2) == 0);
    CHECK(ht_tokenize(v, NULL, 3, false, two, 2) == HR_EINVAL);
    ht_vocab_free(v);
    gguf_close(g);
}

/* ---- byte-level BPE on hand-made vocabularies: merge order, pre-tokenizer choice, errors -------- */
typedef struct mini_bpe {
    const char *pre;          /* NULL: key absent */
    int         n;
    const char *tok[12];
    int32_t     type[12];     /* 0 = NORMAL */
    int         n_merges;     /* -1: key absent */
    const char *merges[8];
} mini_bpe;

static ht_vocab *load_mini_bpe(const mini_bpe *m, hr_err *err, gguf_ctx **gp) {
    char path[256];
    snprintf(path, sizeof path, "/tmp/hearth-test-tokenizer-bpe-%d.gguf", (int)getpid());
    gguf_writer *w = gguf_writer_create();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    if (m->pre) gguf_writer_set_str(w, "tokenizer.ggml.pre", m->pre);
    gguf_str s[12];
    int32_t type[12];
    for (int i = 0; i < m->n; i++) {
        s[i] = (gguf_str){ m->tok[i], strlen(m->tok[i]) };
        type[i] = m->type[i] ? m->type[i] : 1;
    }
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", s, (uint64_t)m->n);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, type, (uint64_t)m->n);
    if (m->n_merges >= 0) {
        gguf_str ms[8];
        for (int i = 0; i < m->n_merges; i++) ms[i] = (gguf_str){ m->merges[i], strlen(m->merges[i]) };
        gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", ms, (uint64_t)m->n_merges);
    }
    hr_err werr = { 0 };
    if (gguf_writer_begin(w, path, true, &werr) < 0 || gguf_writer_finish(w, &werr) < 0) {
        fprintf(stderr, "writing %s: %s\n", path, werr.msg);
        gguf_writer_free(w);
        return NULL;
    }
    gguf_writer_free(w);
    gguf_ctx *g = gguf_open(path, err);
    unlink(path);
    if (!g) return NULL;
    ht_vocab *v = ht_vocab_load(g, err);
    if (!v) { gguf_close(g); return NULL; }
    *gp = g;
    return v;
}

static bool ids_are(const ht_vocab *v, const char *text, bool special, const int32_t *want, int n_want) {
    int32_t got[64];
    int n = ht_tokenize_ex(v, text, strlen(text), false, special, got, 64);
    bool ok = n == n_want && memcmp(got, want, sizeof *got * (size_t)(n > 0 ? n : 0)) == 0;
    if (!ok) {
        fprintf(stderr, "'%s':", text);
        for (int i = 0; i < n && i < 64; i++) fprintf(stderr, " %d", got[i]);
        fprintf(stderr, " (%d tokens), want", n);
        for (int i = 0; i < n_want; i++) fprintf(stderr, " %d", want[i]);
        fprintf(stderr, "\n");
    }
    return ok;
}
#define IDS(v, text, special, ...) \
    ids_are(v, text, special, (const int32_t[]){ __VA_ARGS__ }, (int)(sizeof((const int32_t[]){ __VA_ARGS__ }) / sizeof(int32_t)))

static void test_bpe_mini(void) {
    hr_err err = { 0 };
    gguf_ctx *g = NULL;
    /* "\xc4\xa0" is U+0120, GPT-2's stand-in for a space */
    mini_bpe m = { .pre = "gpt-2", .n = 10,
                   .tok = { "a", "b", "c", "ab", "bc", "abc", "\xc4\xa0", "\xc4\xa0" "a", "aa", "<|x|>" },
                   .type = { [9] = 3 },
                   .n_merges = 5, .merges = { "b c", "a b", "a bc", "\xc4\xa0 a", "a a" } };
    ht_vocab *v = load_mini_bpe(&m, &err, &g);
    CHECKF(v != NULL, "%s", err.msg);
    if (v) {
        CHECK(strcmp(ht_vocab_kind_name(v), "bpe") == 0 && strcmp(ht_vocab_pre_name(v), "gpt-2") == 0);
        CHECK(!ht_add_bos(v));  /* BPE vocabularies add no BOS unless the file says so */
        /* rank order, not position: "b c" (rank 0) before "a b" (rank 1), then "a bc" */
        CHECK(IDS(v, "abc", false, 5));
        CHECK(IDS(v, "ab", false, 3));
        /* equal ranks: the leftmost pair first */
        CHECK(IDS(v, "aaa", false, 8, 0));
        /* the pre-tokenizer keeps a space with the word after it */
        CHECK(IDS(v, "a a", false, 0, 7));
        /* bytes the vocabulary lacks have no token (llama.cpp drops them too) */
        CHECK(IDS(v, "adb", false, 0, 1));
        /* a control token is text unless parse_special */
        CHECK(IDS(v, "<|x|>", true, 9));
        int32_t ids[16];  /* (and this vocabulary has none of its characters) */
        CHECK(ht_tokenize_ex(v, "<|x|>", 5, false, false, ids, 16) == 0);
        char buf[8];
        CHECK(ht_token_to_bytes(v, 7, buf, 8) == 2 && memcmp(buf, " a", 2) == 0);
        CHECK(ht_token_to_bytes(v, 9, buf, 8) == 0);
        ht_vocab_free(v);
        gguf_close(g);
    }
    /* Llama 3's pre-tokenizer ignores merges for words that are tokens as they stand */
    mini_bpe l3 = m;
    l3.pre = "llama-bpe";
    l3.n_merges = 1;  /* only "b c": without the whole-word rule "abc" would be [a, bc] */
    v = load_mini_bpe(&l3, &err, &g);
    CHECKF(v != NULL, "%s", err.msg);
    if (v) {
        CHECK(IDS(v, "abc", false, 5));
        CHECK(IDS(v, "abcb", false, 0, 4, 1));
        CHECK(ht_add_bos(v) == false);  /* llama-bpe defaults add_bos on, but this vocab has no BOS token */
        ht_vocab_free(v);
        gguf_close(g);
    }
    /* no pre key: llama.cpp's 'default' pre-tokenizer, with a warning */
    mini_bpe nopre = m;
    nopre.pre = NULL;
    v = load_mini_bpe(&nopre, &err, &g);
    CHECKF(v != NULL, "%s", err.msg);
    if (v) {
        CHECK(strcmp(ht_vocab_pre_name(v), "default") == 0);
        CHECK(IDS(v, "abc", false, 5));
        ht_vocab_free(v);
        gguf_close(g);
    }
    /* an unknown pre-tokenizer is refused, by name */
    mini_bpe bad = m;
    bad.pre = "no-such-pre";
    CHECK(load_mini_bpe(&bad, &err, &g) == NULL && err.code == HR_EUNSUPPORTED);
    CHECKF(strstr(err.msg, "no-such-pre") != NULL, "message: %s", err.msg);
    printf("unknown pre: %s\n", err.msg);
    /* merges are required; malformed entries are skipped */
    bad = m;
    bad.n_merges = -1;
    CHECK(load_mini_bpe(&bad, &err, &g) == NULL && err.code == HR_EFORMAT && strstr(err.msg, "merges"));
    printf("no merges: %s\n", err.msg);
    bad = m;
    bad.merges[0] = "bc";
    bad.merges[2] = "a  bc";
    v = load_mini_bpe(&bad, &err, &g);
    CHECKF(v != NULL, "%s", err.msg);
    if (v) {
        CHECK(IDS(v, "abc", false, 3, 2));  /* only "a b" applies; "ab c" is not a merge */
        ht_vocab_free(v);
        gguf_close(g);
    }
}

/* ---- special tokens (parse_special, user-defined tokens, phi-3's rstrip, SentencePiece's space
   prefix after a special token) and Unicode whitespace, against llama.cpp: the ids are what
   llama_tokenize(add_special = false) of a late-2025 libllama returned ------------------------------ */
static void test_special(void) {
    static const struct {
        const char *vocab, *text;
        bool        special;
        int32_t     want[24];
        int         n;
    } cases[] = {
        { "ggml-vocab-gpt-2.gguf", "Hello world<|endoftext|> it's", false, { 15496, 995, 27, 91, 437, 1659, 5239, 91, 29, 340, 338 }, 11 },
        { "ggml-vocab-gpt-2.gguf", "Hello world<|endoftext|> it's", true, { 15496, 995, 50256, 340, 338 }, 5 },
        { "ggml-vocab-gpt-2.gguf", "a<|endoftext|><|endoftext|>b", true, { 64, 50256, 50256, 65 }, 4 },
        { "ggml-vocab-llama-spm.gguf", "<s>Hello</s>", false, { 529, 29879, 29958, 10994, 829, 29879, 29958 }, 7 },
        { "ggml-vocab-llama-spm.gguf", "<s>Hello</s>", true, { 1, 15043, 2 }, 3 },
        { "ggml-vocab-llama-spm.gguf", " <s> Hello", true, { 259, 1, 29871, 15043 }, 4 },
        { "ggml-vocab-llama-spm.gguf", "Hello<s>world", true, { 15043, 1, 3186 }, 3 },
        { "ggml-vocab-phi-3.gguf", "<|user|>\nHello<|end|>\n<|assistant|>\n", true, { 32010, 15043, 32007, 32001 }, 4 },
        { "ggml-vocab-phi-3.gguf", "<|system|> You are  nice.<|end|>\n<|user|>  hi \n<|end|>", true, { 32006, 887, 526, 29871, 7575, 29889, 32007, 32010, 7251, 29871, 13, 32007 }, 12 },
        { "ggml-vocab-phi-3.gguf", "</s>  after", false, { 1533, 29879, 29958, 29871, 1156 }, 5 },
        { "ggml-vocab-phi-3.gguf", "</s>  after", true, { 2, 1156 }, 2 },
        { "ggml-vocab-deepseek-llm.gguf", "\xc3\x84pfel \xc3\xb6 \xc3\xbc \xc3\x9f \xc3\xa9", false, { 82077, 26723, 282, 207, 100003, 207, 100014, 3842, 240, 1450 }, 10 },
        { "ggml-vocab-deepseek-llm.gguf", "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>hi<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", true, { 100000, 4824, 100001 }, 3 },
        { "ggml-vocab-starcoder.gguf", "<fim_prefix>def f():<fim_suffix>\n<fim_middle>", true, { 1, 610, 315, 2284, 3, 222, 2 }, 7 },
        { "ggml-vocab-falcon.gguf", ">>TITLE<<Hello>>ABSTRACT<<", true, { 0, 9856, 1 }, 3 },
        { "ggml-vocab-gpt-2.gguf", "naive caf\xc3\xa9\xcc\x81 \xc2\xa0nbsp\xe3\x80\x80ideo\xe2\x80\xa8ls\xc2\x85nel", false, { 2616, 425, 40304, 136, 223, 220, 1849, 77, 24145, 5099, 222, 1651, 447, 101, 7278, 126, 227, 4954 }, 18 },
        { "ggml-vocab-deepseek-llm.gguf", "\xe4\xb8\xad\xe6\x96\x87\xe6\xb5\x8b\xe8\xaf\x95\xef\xbc\x8c\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x81 x\xe3\x80\x80y 12345", false, { 43757, 21370, 19304, 84313, 2160, 1376, 88946, 88, 207, 16, 17, 18, 19, 20 }, 14 },
    };
    gguf_ctx *g = NULL;
    ht_vocab *v = NULL;
    const char *loaded = "";
    for (size_t i = 0; i < HR_ARRAY_LEN(cases); i++) {
        if (strcmp(loaded, cases[i].vocab) != 0) {
            ht_vocab_free(v);
            gguf_close(g);
            char rel[128];
            snprintf(rel, sizeof rel, "tokenizers/%s", cases[i].vocab);
            v = open_vocab(rel, &g);
            CHECK(v != NULL);
            if (!v) return;
            loaded = cases[i].vocab;
        }
        CHECKF(ids_are(v, cases[i].text, cases[i].special, cases[i].want, cases[i].n), "%s: case %zu", cases[i].vocab, i);
    }
    ht_vocab_free(v);
    gguf_close(g);
}

/* ---- BPE: streaming, invalid UTF-8, long and pathological input ------------------------------------ */
static void test_bpe_stream(void) {
    gguf_ctx *g;
    ht_vocab *v = open_vocab("tokenizers/ggml-vocab-gpt-2.gguf", &g);
    CHECK(v != NULL);
    if (!v) return;
    char out[512];
    int cap = ht_detok_max_bytes(v);
    CHECK(cap > 0 && cap <= (int)sizeof out);
    /* "\xf0\x9f\xa6\x99" (the llama emoji) is several byte-level tokens: nothing until it is whole */
    const char *text = "llama \xf0\x9f\xa6\x99!";
    int n;
    int32_t *ids = tokenize(v, text, strlen(text), false, &n);
    CHECK(n >= 4);
    ht_detok d;
    ht_detok_init(&d, v);
    size_t m = 0;
    char got[64];
    bool broken = false;
    for (int i = 0; i < n; i++) {
        int k = ht_detok_push(&d, ids[i], out, cap);
        /* every push is whole UTF-8 */
        for (int j = 0; j < k;) {
            unsigned c = (unsigned char)out[j];
            int len = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
            if (j + len > k) { broken = true; break; }
            j += len;
        }
        if (m + (size_t)k < sizeof got) { memcpy(got + m, out, (size_t)k); m += (size_t)k; }
    }
    m += (size_t)ht_detok_flush(&d, got + m, (int)(sizeof got - m));
    CHECK(!broken);
    CHECK(m == strlen(text) && memcmp(got, text, m) == 0);
    free(ids);

    /* invalid UTF-8 reaches the tokenizer as U+FFFD, one per bad byte (llama.cpp does the same) */
    ids = tokenize(v, "a\xff\xc3" "b", 4, false, &n);
    size_t dl;
    char *dec = detokenize(v, ids, n, &dl);
    CHECKF(dl == 8 && memcmp(dec, "a\xef\xbf\xbd\xef\xbf\xbd" "b", 8) == 0, "got '%s'", dec);
    free(dec);
    free(ids);

    /* long runs: one 256 KiB word, 256 KiB of spaces and of newlines; each must round-trip */
    const size_t big = 256 * 1024;
    char *s = malloc(big);
    const char fill[3] = { 'a', ' ', '\n' };
    for (int k = 0; k < 3; k++) {
        memset(s, fill[k], big);
        ids = tokenize(v, s, big, false, &n);
        CHECKF(n > 0, "run of '%c': %d", fill[k], n);
        if (n > 0) {
            dec = detokenize(v, ids, n, &dl);
            CHECK(dl == big && memcmp(dec, s, big) == 0);
            free(dec);
        }
        free(ids);
    }
    free(s);
    ht_vocab_free(v);
    gguf_close(g);
}

/* ---- streaming detokenizer and special tokens on the Llama vocabulary ----------------------------- */
static int32_t byte_token(const ht_vocab *v, unsigned b) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    for (int32_t i = 0; i < ht_vocab_size(v); i++)
        if (strcmp(ht_token_text(v, i), name) == 0) return i;
    return -1;
}

static void test_stream(void) {
    gguf_ctx *g;
    ht_vocab *v = open_vocab("tokenizers/ggml-vocab-llama-spm.gguf", &g);
    CHECK(v != NULL);
    if (!v) return;
    char out[256];
    int cap = ht_detok_max_bytes(v);
    CHECK(cap > 0 && cap <= (int)sizeof out);

    /* U+1F600 as four byte tokens: nothing until the last one */
    const unsigned char smile[4] = { 0xf0, 0x9f, 0x98, 0x80 };
    ht_detok d;
    ht_detok_init(&d, v);
    int n[4];
    for (int i = 0; i < 4; i++) n[i] = ht_detok_push(&d, byte_token(v, smile[i]), out, cap);
    CHECK(n[0] == 0 && n[1] == 0 && n[2] == 0);
    CHECK(n[3] == 4 && memcmp(out, smile, 4) == 0);
    CHECK(ht_detok_flush(&d, out, cap) == 0);

    /* a stray continuation byte can never become valid: U+FFFD right away */
    CHECK(ht_detok_push(&d, byte_token(v, 0x80), out, cap) == 3 && memcmp(out, "\xef\xbf\xbd", 3) == 0);
    /* a lead byte followed by a normal token: U+FFFD, then the token */
    int32_t the;
    int32_t *ids;
    int k;
    ids = tokenize(v, "the", 3, false, &k);  /* "▁the" */
    CHECK(k == 1);
    the = ids[0];
    free(ids);
    CHECK(ht_detok_push(&d, byte_token(v, 0xe2), out, cap) == 0);
    int m = ht_detok_push(&d, the, out, cap);
    CHECK(m == 7 && memcmp(out, "\xef\xbf\xbd the", 7) == 0);
    /* an unfinished character at the end: flush turns it into U+FFFD */
    CHECK(ht_detok_push(&d, byte_token(v, 0xc3), out, cap) == 0);
    CHECK(ht_detok_flush(&d, out, cap) == 3 && memcmp(out, "\xef\xbf\xbd", 3) == 0);
    CHECK(ht_detok_flush(&d, out, cap) == 0);
    /* overlong and surrogate forms are invalid too */
    CHECK(ht_detok_push(&d, byte_token(v, 0xe0), out, cap) == 0);
    CHECK(ht_detok_push(&d, byte_token(v, 0x80), out, cap) == 6);  /* E0 80: two subparts */
    CHECK(ht_detok_push(&d, byte_token(v, 0xed), out, cap) == 0);
    CHECK(ht_detok_push(&d, byte_token(v, 0xa0), out, cap) == 6);
    /* two-byte character split over two byte tokens, then a multi-character token */
    CHECK(ht_detok_push(&d, byte_token(v, 0xc3), out, cap) == 0);
    CHECK(ht_detok_push(&d, byte_token(v, 0xa9), out, cap) == 2 && memcmp(out, "\xc3\xa9", 2) == 0);
    /* a character that does not fit is held out whole, never split */
    CHECK(ht_detok_push(&d, the, out, 2) == 2 && memcmp(out, " t", 2) == 0);
    /* control and unknown tokens print nothing; ids outside the vocabulary neither */
    CHECK(ht_detok_push(&d, ht_token_bos(v), out, cap) == 0);
    CHECK(ht_detok_push(&d, 0, out, cap) == 0);
    CHECK(ht_detok_push(&d, -5, out, cap) == 0);
    CHECK(ht_detok_push(&d, ht_vocab_size(v), out, cap) == 0);
    CHECK(ht_token_to_bytes(v, ht_token_bos(v), out, cap) == 0);
    CHECK(ht_token_to_bytes(v, ht_vocab_size(v), out, cap) == HR_EINVAL);
    CHECK(ht_token_to_bytes(v, the, out, 2) == 4);  /* needed count, nothing written */
    CHECK(ht_token_to_bytes(v, the, out, 4) == 4 && memcmp(out, " the", 4) == 0);

    /* the leading space of the first token is kept (llama.cpp's generation output does too) */
    ids = tokenize(v, "Hello world", 11, true, &k);
    ht_detok_init(&d, v);
    m = 0;
    for (int i = 0; i < k; i++) m += ht_detok_push(&d, ids[i], out + m, cap);
    CHECK(m == 12 && memcmp(out, " Hello world", 12) == 0);
    free(ids);
    ht_vocab_free(v);
    gguf_close(g);

    /* phi-3: EOS is <|endoftext|>, and <|end|> ends a chat turn */
    v = open_vocab("tokenizers/ggml-vocab-phi-3.gguf", &g);
    CHECK(v != NULL);
    if (!v) return;
    CHECK(ht_token_eos(v) == 32000 && ht_is_eog(v, 32000));
    CHECK(strcmp(ht_token_text(v, 32007), "<|end|>") == 0 && ht_is_eog(v, 32007));
    CHECK(!ht_is_eog(v, 32001) && !ht_is_eog(v, 1));
    CHECK(ht_token_to_bytes(v, 32007, out, cap) == 0);
    ht_vocab_free(v);
    gguf_close(g);
}

/* ---- validation and the merge order on hand-made vocabularies ----------------------------------- */
typedef struct mini {
    const char *model;
    int         n;
    const char *tok[8];
    float       score[8];
    int32_t     type[8];
    int         n_score;     /* entries written to .scores (normally n) */
    int64_t     bos;         /* -2: key absent */
    bool        space_prefix;
} mini;

static ht_vocab *load_mini(const mini *m, hr_err *err, gguf_ctx **gp) {
    char path[256];
    snprintf(path, sizeof path, "/tmp/hearth-test-tokenizer-%d.gguf", (int)getpid());
    gguf_writer *w = gguf_writer_create();
    if (m->model) gguf_writer_set_str(w, "tokenizer.ggml.model", m->model);
    gguf_str s[8];
    for (int i = 0; i < m->n; i++) s[i] = (gguf_str){ m->tok[i], strlen(m->tok[i]) };
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", s, (uint64_t)m->n);
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, m->score, (uint64_t)m->n_score);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_INT32, m->type, (uint64_t)m->n);
    if (m->bos != -2) gguf_writer_set_i32(w, "tokenizer.ggml.bos_token_id", (int32_t)m->bos);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", m->space_prefix);
    hr_err werr = { 0 };
    if (gguf_writer_begin(w, path, true, &werr) < 0 || gguf_writer_finish(w, &werr) < 0) {
        fprintf(stderr, "writing %s: %s\n", path, werr.msg);
        gguf_writer_free(w);
        return NULL;
    }
    gguf_writer_free(w);
    gguf_ctx *g = gguf_open(path, err);
    unlink(path);  /* the mapping stays valid */
    if (!g) return NULL;
    ht_vocab *v = ht_vocab_load(g, err);
    if (!v) { gguf_close(g); return NULL; }
    *gp = g;
    return v;
}

static void test_mini(void) {
    /* "aaa": both pairs make "aa" with the same score; the leftmost merges first -> [aa, a] */
    mini m = { .model = "llama", .n = 5, .tok = { "<unk>", "<s>", "</s>", "a", "aa" },
               .score = { 0, 0, 0, -1, -2 }, .type = { 2, 3, 3, 1, 1 }, .n_score = 5, .bos = 1 };
    hr_err err = { 0 };
    gguf_ctx *g = NULL;
    ht_vocab *v = load_mini(&m, &err, &g);
    CHECKF(v != NULL, "%s", err.msg);
    if (v) {
        int32_t ids[8];
        CHECK(ht_tokenize(v, "aaa", 3, false, ids, 8) == 2 && ids[0] == 4 && ids[1] == 3);
        /* no byte tokens: a character the vocabulary lacks becomes <unk>, byte by byte */
        CHECK(ht_tokenize(v, "a\xc3\xa9", 3, true, ids, 8) == 4 && ids[0] == 1 && ids[1] == 3 && ids[2] == 0 && ids[3] == 0);
        ht_vocab_free(v);
        gguf_close(g);
    }
    /* higher score wins over position: "abc" with "bc" scoring above "ab" -> [a, bc] */
    mini m2 = { .model = "llama", .n = 6, .tok = { "<unk>", "a", "b", "c", "ab", "bc" },
                .score = { 0, -1, -1, -1, -5, -3 }, .type = { 2, 1, 1, 1, 1, 1 }, .n_score = 6, .bos = -2 };
    v = load_mini(&m2, &err, &g);
    CHECKF(v != NULL, "%s", err.msg);
    if (v) {
        int32_t ids[8];
        CHECK(ht_tokenize(v, "abc", 3, false, ids, 8) == 2 && ids[0] == 1 && ids[1] == 5);
        CHECK(ht_token_bos(v) == 1);  /* SentencePiece default */
        ht_vocab_free(v);
        gguf_close(g);
    }

    mini bad = m;
    bad.n_score = 4;
    CHECK(load_mini(&bad, &err, &g) == NULL && err.code == HR_EFORMAT);
    printf("mismatched scores: %s\n", err.msg);
    bad = m;
    bad.bos = 5;
    CHECK(load_mini(&bad, &err, &g) == NULL && err.code == HR_EFORMAT);
    printf("bos out of range: %s\n", err.msg);
    bad = m;
    bad.tok[4] = "a";
    CHECK(load_mini(&bad, &err, &g) == NULL && err.code == HR_EFORMAT);
    printf("duplicate: %s\n", err.msg);
    bad = m;
    bad.model = NULL;
    CHECK(load_mini(&bad, &err, &g) == NULL && err.code == HR_ENOTFOUND);
    bad = m;
    bad.model = "bert";
    CHECK(load_mini(&bad, &err, &g) == NULL && err.code == HR_EUNSUPPORTED && strstr(err.msg, "bert"));
}

/* ---- the word-by-word path gives what the whole-text merge gives, on random nasty text ---------- */
static void test_words_fuzz(const char *rel) {
    static const char *frag[] = {
        "a", "b", "the", "ing", " ", "  ", "   ", "\n", "\t", "\xc3\xa9", "\xe2\x96\x81", "\xe2\x96\x81\xe2\x96\x81",
        "\xe2", "\x96", "\x81", "\xf0", "\xf0\x9f\x98\x80", "<0x0A>", "<s>", "Hello", "1234", ".", "'s", "\xff",
    };
    gguf_ctx *g;
    ht_vocab *v = open_vocab(rel, &g);
    CHECK(v != NULL);
    if (!v) return;
    CHECK(v->spm_words);
    uint64_t x = 12345;
    int bad = 0;
    for (int it = 0; it < 300; it++) {
        char text[512];
        size_t len = 0;
        int parts = 1 + it % 60;
        for (int k = 0; k < parts; k++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            const char *f = frag[(x >> 33) % HR_ARRAY_LEN(frag)];
            size_t fl = strlen(f);
            if (len + fl >= sizeof text) break;
            memcpy(text + len, f, fl);
            len += fl;
        }
        int n1, n2;
        int32_t *a = tokenize(v, text, len, true, &n1);
        v->spm_words = false;
        int32_t *b = tokenize(v, text, len, true, &n2);
        v->spm_words = true;
        bad += !(n1 == n2 && n1 > 0 && memcmp(a, b, sizeof *a * (size_t)n1) == 0);
        free(a);
        free(b);
    }
    CHECKF(bad == 0, "%s: %d of 300 random texts differ between word-by-word and whole-text merging", rel, bad);
    ht_vocab_free(v);
    gguf_close(g);
}

/* ---- BPE on random nasty text: merges by id == merges by text, and (valid UTF-8) round trips ---- */
static void test_bpe_fuzz(const char *rel) {
    static const char *frag[] = {
        "a", "the", "ing", " ", "  ", "   ", "\n", "\r\n", "\t", "\xc3\xa9", "\xc3\xb6", "\xe2\x96\x81",
        "\xf0\x9f\x98\x80", "\xe4\xb8\xad", "\xe3\x80\x80", "\xc2\xa0", "Hello", "1234", "3", ".", "'s", "'S",
        "<|endoftext|>", "<s>", "</s>", "<fim_prefix>", ">>TITLE<<", "!!", "``", "\xd0\xbd\xd0\xb5",
        /* invalid from here on */
        "\xff", "\xe2", "\x96", "\xf0\x9f", "\xc0\x80", "\xed\xa0\x80",
    };
    const size_t n_valid = HR_ARRAY_LEN(frag) - 6;
    gguf_ctx *g;
    ht_vocab *v = open_vocab(rel, &g);
    CHECK(v != NULL);
    if (!v) return;
    uint64_t x = 777;
    int bad_path = 0, bad_rt = 0;
    for (int it = 0; it < 300; it++) {
        char text[512];
        size_t len = 0;
        bool valid_only = it % 2 == 0;
        for (int k = 0, parts = 1 + it % 50; k < parts; k++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            const char *f = frag[(x >> 33) % (valid_only ? n_valid : HR_ARRAY_LEN(frag))];
            size_t fl = strlen(f);
            if (len + fl >= sizeof text) break;
            memcpy(text + len, f, fl);
            len += fl;
        }
        bool special = it % 3 == 0;
        int32_t a[600], b[600];
        int n1 = ht_tokenize_ex(v, text, len, false, special, a, 600);
        bool by_id = ht_bpe_by_id(v->bpe, false);
        int n2 = ht_tokenize_ex(v, text, len, false, special, b, 600);
        ht_bpe_by_id(v->bpe, by_id);
        bad_path += !(n1 > 0 && n1 == n2 && n1 <= 600 && memcmp(a, b, sizeof *a * (size_t)n1) == 0);
        if (valid_only && !special && n1 > 0 && n1 <= 600) {
            size_t dl;
            char *d = detokenize(v, a, n1, &dl);
            bad_rt += !(dl == len && memcmp(d, text, len) == 0);
            free(d);
        }
    }
    CHECKF(bad_path == 0, "%s: %d of 300 random texts differ between merging by id and by text", rel, bad_path);
    CHECKF(bad_rt == 0, "%s: %d of 150 random valid texts do not round-trip", rel, bad_rt);
    ht_vocab_free(v);
    gguf_close(g);
}

/* ---- the GPL-3 text with a SentencePiece and a BPE vocabulary: tokenize, detokenize, compare ------ */
static void test_gpl3(const char *rel) {
    size_t len;
    char *text = test_read_file("/usr/share/common-licenses/GPL-3", &len);
    if (!text) { printf("GPL-3 round trip: /usr/share/common-licenses/GPL-3 not found, skipped\n"); return; }
    gguf_ctx *g;
    ht_vocab *v = open_vocab(rel, &g);
    CHECK(v != NULL);
    if (!v) { free(text); return; }
    int n = ht_tokenize(v, text, len, false, NULL, 0);
    CHECK(n > 0);
    int32_t *ids = malloc(sizeof *ids * (size_t)n);
    CHECK(ht_tokenize(v, text, len, false, ids, n) == n);
    size_t dlen;
    char *d = detokenize(v, ids, n, &dlen);
    bool spm = strcmp(ht_vocab_kind_name(v), "spm") == 0;
    CHECK(spm ? dlen == len + 1 && memcmp(d + 1, text, len) == 0 : dlen == len && memcmp(d, text, len) == 0);
    free(d);
    free(ids);
    free(text);
    ht_vocab_free(v);
    gguf_close(g);
}

int main(void) {
    hr_init();
    g_dir = test_shared_dir();
    test_vectors("ggml-vocab-llama-spm.gguf");
    test_vectors("ggml-vocab-phi-3.gguf");
    test_vectors("ggml-vocab-gpt-2.gguf");
    test_vectors("ggml-vocab-starcoder.gguf");
    test_vectors("ggml-vocab-falcon.gguf");
    test_vectors("ggml-vocab-deepseek-llm.gguf");
    test_vectors_extra();
    test_stories();
    test_bpe_mini();
    test_special();
    test_bpe_stream();
    test_bpe_fuzz("tokenizers/ggml-vocab-gpt-2.gguf");
    test_bpe_fuzz("tokenizers/ggml-vocab-starcoder.gguf");
    test_bpe_fuzz("tokenizers/ggml-vocab-deepseek-llm.gguf");
    test_stream();
    test_mini();
    test_words_fuzz("tokenizers/ggml-vocab-llama-spm.gguf");
    test_words_fuzz("models/stories260K.gguf");
    test_gpl3("tokenizers/ggml-vocab-llama-spm.gguf");
    test_gpl3("tokenizers/ggml-vocab-gpt-2.gguf");
    return test_summary();
}
