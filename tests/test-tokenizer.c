// modules: base quant gguf text
/* Tokenizer and detokenizer: llama.cpp's golden vectors for the SentencePiece vocabularies
   (shared/tokenizers/X.gguf.inp/.out), round trips, the stories260K reference prompts and
   continuations, a BPE vocabulary refused with a clear error, the streaming detokenizer's UTF-8
   handling, vocabulary validation on small hand-made GGUFs, and tokenizer speed (printed). */
#include "test.h"
#include "text/text.h"
#include "text/text-impl.h"  /* ht_vocab.spm_words: the word-by-word fast path is checked against the plain one */

#include <jansson.h>
#include <unistd.h>

static const char *g_dir;

static const char *find(const char *p, const char *end, const char *pat, size_t n) {
    for (; (size_t)(end - p) >= n; p++)
        if (memcmp(p, pat, n) == 0) return p;
    return NULL;
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
static void test_vectors(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizers/%s", name);
    gguf_ctx *g;
    ht_vocab *v = open_vocab(rel, &g);
    CHECK(v != NULL);
    if (!v) return;
    size_t inp_n, out_n;
    snprintf(rel, sizeof rel, "tokenizers/%s.inp", name);
    char *inp = test_read_file(test_path(g_dir, rel), &inp_n);
    snprintf(rel, sizeof rel, "tokenizers/%s.out", name);
    char *outf = test_read_file(test_path(g_dir, rel), &out_n);
    CHECK(inp && outf);
    if (!inp || !outf) { free(inp); free(outf); ht_vocab_free(v); gguf_close(g); return; }
    outf = realloc(outf, out_n + 1);
    outf[out_n] = 0;

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
        int32_t want[1024];
        int n_want = 0;
        for (const char *s = line; s < eol && n_want < 1024;) {
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
        v->spm_words = false;
        int32_t *plain = tokenize(v, p, len, false, &n_plain);
        v->spm_words = words;
        same = same && n_plain == n && (n == 0 || memcmp(plain, ids, sizeof *ids * (size_t)n) == 0);
        free(plain);
        match += same;
        if (!same) {
            fprintf(stderr, "%s: input %d '%.*s': got", name, total, (int)len, p);
            for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n   want");
            for (int i = 0; i < n_want; i++) fprintf(stderr, " %d", want[i]);
            fprintf(stderr, "\n");
        }
        /* round trip: the pieces give back the text behind the space prefix SentencePiece added */
        size_t dlen;
        char *d = detokenize(v, ids, n > 0 ? n : 0, &dlen);
        bool rt = len == 0 ? dlen == 0 : dlen == len + 1 && d[0] == ' ' && memcmp(d + 1, p, len) == 0;
        round += rt;
        if (!rt) fprintf(stderr, "%s: input %d does not round-trip: '%s'\n", name, total, d);
        free(d);
        free(ids);
        total++;
        p = q + sep_n;
    }
    printf("%s: %d/%d vectors match, %d/%d round-trip\n", name, match, total, round, total);
    CHECK(total == 46);
    CHECK(match == total);
    CHECK(round == total);
    free(inp);
    free(outf);
    ht_vocab_free(v);
    gguf_close(g);
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

/* ---- a byte-level BPE vocabulary is refused with a message that names it ----------------------- */
static void test_bpe_refused(void) {
    hr_err err = { 0 };
    gguf_ctx *g = gguf_open(test_path(g_dir, "tokenizers/ggml-vocab-gpt-2.gguf"), &err);
    CHECK(g != NULL);
    if (!g) return;
    ht_vocab *v = ht_vocab_load(g, &err);
    CHECK(v == NULL);
    CHECK(err.code == HR_EUNSUPPORTED);
    CHECKF(strstr(err.msg, "gpt2") != NULL, "message: %s", err.msg);
    printf("gpt-2 vocab: %s (%s)\n", hr_strerror(err.code), err.msg);
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

/* ---- speed: the GPL-3 text with the Llama vocabulary (printed, not asserted) --------------------- */
static void test_speed(void) {
    size_t len;
    char *text = test_read_file("/usr/share/common-licenses/GPL-3", &len);
    if (!text) { printf("speed: /usr/share/common-licenses/GPL-3 not found, skipped\n"); return; }
    gguf_ctx *g;
    ht_vocab *v = open_vocab("tokenizers/ggml-vocab-llama-spm.gguf", &g);
    CHECK(v != NULL);
    if (!v) { free(text); return; }
    int n = ht_tokenize(v, text, len, false, NULL, 0);
    CHECK(n > 0);
    int32_t *ids = malloc(sizeof *ids * (size_t)n);
    double t0 = hr_time_s(), t;
    int reps = 0;
    do {
        CHECK(ht_tokenize(v, text, len, false, ids, n) == n);
        reps++;
        t = hr_time_s() - t0;
    } while (t < 0.3);
    printf("speed: GPL-3 (%zu bytes) -> %d tokens, %.1f MB/s (%d runs)\n", len, n, (double)len * reps / t / 1e6, reps);
    size_t dlen;
    char *d = detokenize(v, ids, n, &dlen);
    CHECK(dlen == len + 1 && memcmp(d + 1, text, len) == 0);
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
    test_stories();
    test_bpe_refused();
    test_stream();
    test_mini();
    test_words_fuzz("tokenizers/ggml-vocab-llama-spm.gguf");
    test_words_fuzz("models/stories260K.gguf");
    test_speed();
    return test_summary();
}
