// fuzz-chat — libFuzzer harness for the chat templates (src/text/chat.c; built with clang by
// scripts/fuzz.sh, not CMake).
//
// hearth renders no Jinja: a GGUF's template text is only searched for distinctive substrings
// (ht_chat_detect), and each family is rendered by fixed code. So the harness feeds arbitrary text
// to the recogniser and the name lookup, arbitrary conversations (any roles, any contents, any
// family, with and without the assistant's header) to the renderer, the rendered text to the
// special-token tokenizer (phi-3's vocabulary, loaded once from $HEARTH_SHARED), and arbitrary
// texts and stop strings to the stop-string scanner.
//
// Input: byte 0 picks the family (bits 0-4; past the last family: an unknown one), add_assistant
// (bit 5) and the mode (bits 6-7: render, detect, stop strings); the rest is split at NUL bytes into
// fields (render: role, content, role, content...; a one-byte role below 4 is system, user,
// assistant or tool; stop strings: the text, then the stop strings, byte 1 the scan's start).
// Checked: render's snprintf contract (cap 0 gives the length and writes nothing; every smaller cap
// writes the same prefix, NUL-terminated; exact-size heap buffers), render_alloc's text the same;
// every family's end-of-turn text and name exist; detect and from_name give a family or unknown;
// the tokens lie in the vocabulary; the stop scan agrees with a naive one.
//
// fuzz-sources: src/text/*.c src/gguf/*.c src/quant/*.c src/base/*.c
// fuzz-max-len: 4096
#include "text/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(x) do { if (!(x)) { fprintf(stderr, "fuzz-chat: check failed: %s\n", #x); abort(); } } while (0)

static ht_vocab *g_vocab;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *dir = getenv("HEARTH_SHARED");
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizers/ggml-vocab-phi-3.gguf", dir ? dir : "../shared");
    hr_err err = {0};
    gguf_ctx *g = gguf_open(path, &err);
    if (g) g_vocab = ht_vocab_load(g, &err);
    if (!g_vocab) {
        fprintf(stderr, "fuzz-chat: %s: %s (set HEARTH_SHARED)\n", path, err.msg);
        exit(2);
    }
    gguf_close(g);
    return 0;
}

#define MAX_FIELDS 64

/* splits p[0..n) at NUL bytes into NUL-terminated heap copies (exact size + NUL) */
static int split(const uint8_t *p, size_t n, char **f) {
    int k = 0;
    size_t a = 0;
    for (size_t i = 0; i <= n && k < MAX_FIELDS; i++) {
        if (i < n && p[i]) continue;
        f[k] = malloc(i - a + 1);
        memcpy(f[k], p + a, i - a);
        f[k][i - a] = 0;
        k++;
        a = i + 1;
    }
    return k;
}

static void fuzz_render(int tmpl, bool add_assistant, char **f, int nf) {
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    int n = nf / 2;
    ht_chat_msg *m = malloc(sizeof *m * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) {
        const char *r = f[2 * i];
        m[i].role = strlen(r) == 1 && (unsigned char)r[0] < 4 ? roles[(unsigned char)r[0]] : r;
        m[i].content = f[2 * i + 1];
    }
    int64_t len = ht_chat_render(tmpl, m, n, add_assistant, NULL, 0);
    if (tmpl < 0 || tmpl >= HT_CHAT_COUNT) {
        FUZZ_CHECK(len == HR_EINVAL && ht_chat_render_alloc(tmpl, m, n, add_assistant, NULL) == NULL);
        free(m);
        return;
    }
    FUZZ_CHECK(len >= 0 && len < (1 << 24));
    size_t alen = 0;
    char *full = ht_chat_render_alloc(tmpl, m, n, add_assistant, &alen);
    FUZZ_CHECK(full && alen == (size_t)len && strlen(full) == alen);
    /* every smaller buffer: the same prefix, NUL-terminated (a few caps, exact-size allocations) */
    size_t caps[4] = {1, (size_t)len / 2 + 1, (size_t)len, (size_t)len + 1};
    for (int c = 0; c < 4; c++) {
        if (!caps[c]) continue;
        char *b = malloc(caps[c]);
        FUZZ_CHECK(ht_chat_render(tmpl, m, n, add_assistant, b, caps[c]) == len);
        size_t k = caps[c] - 1;
        FUZZ_CHECK(b[k] == 0 && memcmp(b, full, k) == 0);
        free(b);
    }
    /* a message without content is refused */
    if (n) {
        const char *keep = m[n - 1].content;
        m[n - 1].content = NULL;
        FUZZ_CHECK(ht_chat_render(tmpl, m, n, add_assistant, NULL, 0) == HR_EINVAL);
        m[n - 1].content = keep;
    }
    int nt = ht_chat_tokenize(g_vocab, full, alen, true, NULL, 0);
    FUZZ_CHECK(nt >= 0);
    int32_t *ids = malloc(sizeof *ids * (size_t)(nt ? nt : 1));
    FUZZ_CHECK(ht_chat_tokenize(g_vocab, full, alen, true, ids, nt) == nt);
    for (int i = 0; i < nt; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < ht_vocab_size(g_vocab));
    free(ids);
    free(full);
    free(m);
}

/* the stop scan against a naive one: the earliest stop at or after from, else the earliest place
   from which the rest of the text is a proper prefix of a stop string */
static void fuzz_stops(const char *text, size_t len, size_t from, char **stops, int n) {
    size_t safe = (size_t)-1;
    bool hit = ht_chat_stop_scan(text, len, from, (const char *const *)stops, n, &safe);
    size_t want = len;
    bool want_hit = false;
    for (size_t p = from; p < len && !want_hit; p++)
        for (int k = 0; k < n; k++) {
            size_t sl = strlen(stops[k]);
            if (sl && sl <= len - p && !memcmp(text + p, stops[k], sl)) { want = p; want_hit = true; break; }
        }
    if (!want_hit)
        for (size_t p = from; p < len && want == len; p++)
            for (int k = 0; k < n; k++) {
                size_t sl = strlen(stops[k]);
                if (sl > len - p && !memcmp(text + p, stops[k], len - p)) { want = p; break; }
            }
    FUZZ_CHECK(hit == want_hit && safe == want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    uint8_t op = data[0];
    int tmpl = (op & 31) % (HT_CHAT_COUNT + 1);
    if (tmpl == HT_CHAT_COUNT) tmpl = HT_CHAT_UNKNOWN;
    FUZZ_CHECK(ht_chat_name(tmpl) && ht_chat_end_of_turn(tmpl));
    int mode = op >> 6;
    char *f[MAX_FIELDS];
    if (mode == 1 || mode == 3) {
        /* the template text or a family's name: any bytes (one NUL-terminated copy) */
        char *t = malloc(size - 1 + 1);
        memcpy(t, data + 1, size - 1);
        t[size - 1] = 0;
        int d = ht_chat_detect(t), k = ht_chat_from_name(t);
        FUZZ_CHECK(d >= HT_CHAT_UNKNOWN && d < HT_CHAT_COUNT && k >= HT_CHAT_UNKNOWN && k < HT_CHAT_COUNT);
        if (k >= 0) FUZZ_CHECK(ht_chat_name(k) && strcmp(ht_chat_name(k), "unknown"));
        free(t);
        return 0;
    }
    if (mode == 2) {
        int nf = split(data + 2, size - 2, f);
        size_t len = strlen(f[0]);
        fuzz_stops(f[0], len, data[1] % (len + 1), f + 1, nf - 1);
        for (int i = 0; i < nf; i++) free(f[i]);
        return 0;
    }
    int nf = split(data + 1, size - 1, f);
    fuzz_render(tmpl, op & 32, f, nf);
    for (int i = 0; i < nf; i++) free(f[i]);
    return 0;
}
