// fuzz-serve — libFuzzer harness for what `hearth serve` reads from a client (src/serve/request.c;
// built with clang by scripts/fuzz.sh, not CMake). libmicrohttpd parses the HTTP framing; this
// fuzzes the code of ours that interprets a request: the route of a method and path, the bearer
// token check, the body of /v1/chat/completions and /v1/completions into a request (every field,
// the messages through the chat template, the prompt through the tokenizer), and /tokenize and
// /detokenize into their replies. Vocabularies (stories260K: SentencePiece; gpt-2: BPE) are loaded
// once from $HEARTH_SHARED.
//
// Input: byte 0 picks the operation (bits 0-2: chat, completions, tokenize, detokenize, route,
// bearer), the vocabulary (bit 3) and add_bos (bit 4); byte 1 the chat template; the rest is the
// body (route: method NUL path; bearer: key NUL header). Checked beyond "no crash, no sanitizer
// report, no leak": a refusal says why; an accepted generation request has a prompt of ids inside
// the vocabulary, at most HS_MAX_STOPS stop strings (plus the template's end of turn), none empty,
// and sampling values inside the ranges docs/serve.md gives; /tokenize and /detokenize answer 200
// with a reply or 400 with a reason, never 500 (nothing may fail inside on input alone); the route
// and bearer check agree with their definitions.
//
// fuzz-sources: src/serve/request.c src/serve/sched.c src/text/*.c src/gguf/*.c src/quant/*.c src/base/*.c
// fuzz-max-len: 8192
// fuzz-dict: tests/fuzz-corpus/fuzz-serve.dict
#include "serve/serve-impl.h"
#include "text/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define FUZZ_CHECK(x) do { if (!(x)) { fprintf(stderr, "fuzz-serve: check failed: %s\n", #x); abort(); } } while (0)

static ht_vocab *g_vocab[2];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    static const char *const files[2] = {"models/stories260K.gguf", "tokenizers/ggml-vocab-gpt-2.gguf"};
    const char *dir = getenv("HEARTH_SHARED");
    for (int i = 0; i < 2; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir ? dir : "../shared", files[i]);
        hr_err err = {0};
        gguf_ctx *g = gguf_open(path, &err);
        if (g) g_vocab[i] = ht_vocab_load(g, &err);
        if (!g_vocab[i]) {
            fprintf(stderr, "fuzz-serve: %s: %s (set HEARTH_SHARED)\n", path, err.msg);
            exit(2);
        }
        gguf_close(g);
    }
    return 0;
}

static void fuzz_gen(const hs_model_info *mi, bool chat, const char *body, size_t len) {
    hs_req *r = hs_req_new();
    FUZZ_CHECK(r);
    hs_gen_req g = {.chat = chat};
    char why[512] = "";
    if (hs_read_gen(mi, body, len, r, &g, why, sizeof why)) {
        FUZZ_CHECK(why[0]);
    } else {
        FUZZ_CHECK(r->n_prompt >= 1 && r->prompt);
        for (int i = 0; i < r->n_prompt; i++) FUZZ_CHECK(r->prompt[i] >= 0 && r->prompt[i] < ht_vocab_size(mi->voc));
        FUZZ_CHECK(r->n_stops >= 0 && r->n_stops <= HS_MAX_STOPS + 1);
        for (int i = 0; i < r->n_stops; i++) FUZZ_CHECK(r->stops[i] && r->stops[i][0]);
        FUZZ_CHECK(r->n_probs >= -1 && r->n_probs <= HS_MAX_TOP);
        FUZZ_CHECK(r->n_predict == -1 || (r->n_predict >= 1 && r->n_predict <= 1 << 24));
        const ht_sampler_params *sp = &r->sp;
        FUZZ_CHECK(sp->temp >= 0 && sp->temp <= 100 && sp->top_p >= 0 && sp->top_p <= 1 && sp->min_p >= 0 &&
                   sp->min_p <= 1 && sp->top_k >= 0 && sp->repeat_penalty >= 0 && sp->repeat_last_n >= -1);
    }
    hs_req_release(NULL, r);
}

static void fuzz_text_op(const hs_model_info *mi, bool detok, const char *body, size_t len) {
    char why[256] = "";
    unsigned status = 0;
    json_t *o = detok ? hs_detokenize_reply(mi, body, len, &status, why, sizeof why)
                      : hs_tokenize_reply(mi, body, len, &status, why, sizeof why);
    FUZZ_CHECK((o != NULL) == (status == 200));
    FUZZ_CHECK(status == 200 || (status == 400 && why[0]));
    if (o && !detok) {
        json_t *t = json_object_get(o, "tokens"), *e;
        size_t i;
        FUZZ_CHECK(json_is_array(t));
        json_array_foreach(t, i, e) {
            json_t *id = json_is_object(e) ? json_object_get(e, "id") : e;
            FUZZ_CHECK(json_is_integer(id) && json_integer_value(id) >= 0 &&
                       json_integer_value(id) < ht_vocab_size(mi->voc));
        }
    }
    if (o && detok) FUZZ_CHECK(json_is_string(json_object_get(o, "content")));
    json_decref(o);
}

/* the first two NUL-separated fields of p[0..n) as NUL-terminated heap copies (b NULL if only one) */
static void two_fields(const char *p, size_t n, char **a, char **b) {
    const char *z = memchr(p, 0, n);
    size_t na = z ? (size_t)(z - p) : n;
    *a = strndup(p, na);
    *b = z ? strndup(z + 1, n - na - 1) : NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    int op = data[0] & 7;
    hs_model_info mi = {.voc = g_vocab[(data[0] >> 3) & 1], .add_bos = data[0] & 16,
                        .chat_tmpl = data[1] % HT_CHAT_COUNT};
    size_t n = size - 2;
    char *body = malloc(n ? n : 1);  /* exact size: a read past the end is seen */
    memcpy(body, data + 2, n);
    char *a, *b;
    switch (op) {
    case 0: case 1: fuzz_gen(&mi, op == 0, body, n); break;
    case 2: case 3: fuzz_text_op(&mi, op == 3, body, n); break;
    case 4: {
        two_fields(body, n, &a, &b);
        int ep = hs_route_of(a, b ? b : "");
        FUZZ_CHECK(ep >= HS_EP_NOT_FOUND && ep <= HS_EP_DETOKENIZE);
        FUZZ_CHECK((ep == HS_EP_OPTIONS) == !strcmp(a, "OPTIONS"));
        if (ep == HS_EP_CHAT || ep == HS_EP_COMPLETIONS || ep == HS_EP_TOKENIZE || ep == HS_EP_DETOKENIZE)
            FUZZ_CHECK(!strcmp(a, "POST"));
        if (ep == HS_EP_CHAT) FUZZ_CHECK(strstr(b, "chat") != NULL);
        free(a);
        free(b);
        break;
    }
    case 5: {
        two_fields(body, n, &a, &b);
        bool want = b && !strncasecmp(b, "Bearer ", 7) && !strcmp(b + 7, a);
        FUZZ_CHECK(hs_bearer_ok(a, b) == want);
        FUZZ_CHECK(hs_bearer_ok(NULL, b));
        free(a);
        free(b);
        break;
    }
    default: break;
    }
    free(body);
    return 0;
}
