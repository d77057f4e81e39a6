/* serve/request: what a request's body and its request line ask for, read without the HTTP connection
   (libmicrohttpd parses the framing; this is the part of the server that interprets what a client
   sent): the route, the API key, a generation request's fields into an hs_req, /tokenize and
   /detokenize into their replies. http.c calls these; tests/fuzz-serve.c fuzzes them. Every field is
   checked and refused with a reason (a 400) rather than ignored (docs/serve.md). */
#include "serve-impl.h"

#include "text/chat.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- text helpers --------------------------------------------------------------------------------- */
/* A token's bytes as a JSON string: invalid UTF-8 (a token may hold part of a character) becomes U+FFFD. */
static json_t *json_utf8_lossy(const char *s, size_t n) {
    json_t *j = json_stringn(s, n);
    if (j) return j;
    char *o = malloc(3 * n + 1);
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        unsigned char b = (unsigned char)s[i];
        int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
        json_t *t = len && i + (size_t)len <= n ? json_stringn(s + i, (size_t)len) : NULL;
        if (t) {
            memcpy(o + k, s + i, (size_t)len);
            k += (size_t)len;
            i += (size_t)len;
            json_decref(t);
        } else {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i++;
        }
    }
    j = json_stringn(o, k);
    free(o);
    return j;
}

json_t *hs_token_json(const ht_vocab *v, int32_t id, float lp, bool with_lp) {
    char buf[256];
    int n = ht_token_to_bytes(v, id, buf, sizeof buf);
    if (n < 0 || n > (int)sizeof buf) n = 0;
    json_t *bytes = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(bytes, json_integer((unsigned char)buf[i]));
    json_t *t = json_pack("{s:i,s:o,s:o}", "id", id, "token", json_utf8_lossy(buf, (size_t)n), "bytes", bytes);
    if (t && with_lp) json_object_set_new(t, "logprob", json_real(lp));
    return t;
}

/* ---- generation requests ------------------------------------------------------------------------- */
/* a number field: absent (0), within [lo, hi] (0, *v set), else -1 with the reason written */
static int field_num(json_t *o, const char *k, double lo, double hi, bool integer, double *v, char *why, size_t cap) {
    json_t *x = json_object_get(o, k);
    if (!x || json_is_null(x)) return 0;
    if (!json_is_number(x) || (integer && !json_is_integer(x))) {
        snprintf(why, cap, "\"%s\" must be %s", k, integer ? "an integer" : "a number");
        return -1;
    }
    double d = json_number_value(x);
    if (!(d >= lo && d <= hi)) {
        snprintf(why, cap, "\"%s\" must be in [%g, %g]", k, lo, hi);
        return -1;
    }
    *v = d;
    return 0;
}

static int field_bool(json_t *o, const char *k, bool *v, char *why, size_t cap) {
    json_t *x = json_object_get(o, k);
    if (!x || json_is_null(x)) return 0;
    if (!json_is_boolean(x)) { snprintf(why, cap, "\"%s\" must be a boolean", k); return -1; }
    *v = json_is_true(x);
    return 0;
}

/* tokenizes text into r->prompt (chat: special tokens parsed) */
static int req_tokenize(const hs_model_info *mi, hs_req *r, const char *text, size_t len, bool chat) {
    int cap = (int)HR_MIN(len + 8, (size_t)1 << 26);
    for (int tries = 0; tries < 2; tries++) {
        free(r->prompt);
        if (!(r->prompt = malloc((size_t)cap * sizeof *r->prompt))) return HR_ENOMEM;
        int n = chat ? ht_chat_tokenize(mi->voc, text, len, mi->add_bos, r->prompt, cap)
                     : ht_tokenize(mi->voc, text, len, mi->add_bos, r->prompt, cap);
        if (n < 0) return n;
        if (n <= cap) { r->n_prompt = n; return 0; }
        cap = n;
    }
    return HR_ERANGE;
}

/* The chat's messages in the model's template -> r's prompt; 0 or -1 with why. */
static int read_messages(const hs_model_info *mi, json_t *body, hs_req *r, char *why, size_t cap) {
    json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        snprintf(why, cap, "\"messages\" must be a non-empty array");
        return -1;
    }
    size_t n = json_array_size(msgs);
    ht_chat_msg *m = calloc(n, sizeof *m);
    char **owned = calloc(n, sizeof *owned);
    int rc = -1;
    if (!m || !owned) { snprintf(why, cap, "out of memory"); goto out; }
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(msgs, i), *role = json_object_get(e, "role");
        json_t *content = json_object_get(e, "content");
        if (!json_is_object(e) || !json_is_string(role)) {
            snprintf(why, cap, "messages[%zu] must be an object with a string \"role\"", i);
            goto out;
        }
        m[i].role = json_string_value(role);
        if (json_is_string(content)) {
            m[i].content = json_string_value(content);
        } else if (json_is_array(content)) {
            /* parts: only text parts; they are joined */
            size_t len = 0;
            for (size_t k = 0; k < json_array_size(content); k++) {
                json_t *part = json_array_get(content, k), *type = json_object_get(part, "type");
                json_t *text = json_object_get(part, "text");
                if (!json_is_string(type) || strcmp(json_string_value(type), "text") || !json_is_string(text)) {
                    snprintf(why, cap, "messages[%zu].content[%zu]: only {\"type\": \"text\", \"text\": ...} parts are "
                             "supported", i, k);
                    goto out;
                }
                len += json_string_length(text) + 1;
            }
            if (!(owned[i] = calloc(len + 1, 1))) { snprintf(why, cap, "out of memory"); goto out; }
            for (size_t k = 0; k < json_array_size(content); k++) {
                if (k) strcat(owned[i], "\n");
                strcat(owned[i], json_string_value(json_object_get(json_array_get(content, k), "text")));
            }
            m[i].content = owned[i];
        } else if (json_is_null(content) && !strcmp(m[i].role, "assistant")) {
            m[i].content = "";
        } else {
            snprintf(why, cap, "messages[%zu].content must be a string or an array of text parts", i);
            goto out;
        }
    }
    size_t len;
    char *text = ht_chat_render_alloc(mi->chat_tmpl, m, (int)n, true, &len);
    if (!text) { snprintf(why, cap, "the messages cannot be put in the chat template"); goto out; }
    HR_LOGD("hearth serve: prompt text [%s]", text);
    rc = req_tokenize(mi, r, text, len, true);
    free(text);
    if (rc) { snprintf(why, cap, "tokenization failed: %s", hr_strerror(rc)); rc = -1; }
out:
    for (size_t i = 0; owned && i < n; i++) free(owned[i]);
    free(owned);
    free(m);
    return rc;
}

/* /v1/completions' prompt: a string, an array of one string, or an array of token ids */
static int read_prompt(const hs_model_info *mi, json_t *body, hs_req *r, char *why, size_t cap) {
    json_t *p = json_object_get(body, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0))) p = json_array_get(p, 0);
    if (json_is_string(p)) {
        int rc = req_tokenize(mi, r, json_string_value(p), json_string_length(p), false);
        if (rc) snprintf(why, cap, "tokenization failed: %s", hr_strerror(rc));
        return rc ? -1 : 0;
    }
    if (json_is_array(p) && json_array_size(p) > 0) {
        size_t n = json_array_size(p);
        if (!(r->prompt = malloc(n * sizeof *r->prompt))) { snprintf(why, cap, "out of memory"); return -1; }
        for (size_t i = 0; i < n; i++) {
            json_t *t = json_array_get(p, i);
            json_int_t id = json_is_integer(t) ? json_integer_value(t) : -1;
            if (id < 0 || id >= ht_vocab_size(mi->voc)) {
                snprintf(why, cap, "\"prompt\" must be a string or an array of token ids (0..%d)",
                         ht_vocab_size(mi->voc) - 1);
                return -1;
            }
            r->prompt[i] = (int32_t)id;
        }
        r->n_prompt = (int)n;
        return 0;
    }
    snprintf(why, cap, "\"prompt\" must be a string or an array of token ids");
    return -1;
}

/* Every field of a generation request into r and g; 0, or -1 with why (a 400). */
static int read_gen(const hs_model_info *mi, json_t *body, hs_req *r, hs_gen_req *g, char *why, size_t cap) {
    double v;
    bool b = false;
    json_t *x;
    /* what is not supported is refused rather than ignored: the client would get something else */
    if (field_num(body, "n", 1, 1, true, &v, why, cap)) { snprintf(why, cap, "only \"n\": 1 is supported"); return -1; }
    x = json_object_get(body, "tools");
    if (x && !json_is_null(x) && !(json_is_array(x) && json_array_size(x) == 0)) {
        snprintf(why, cap, "\"tools\" are not supported");
        return -1;
    }
    x = json_object_get(body, "response_format");
    if (x && !json_is_null(x)) {
        json_t *t = json_object_get(x, "type");
        if (!json_is_object(x) || !json_is_string(t) || strcmp(json_string_value(t), "text")) {
            snprintf(why, cap, "\"response_format\": only {\"type\": \"text\"} is supported");
            return -1;
        }
    }
    if (field_bool(body, "stream", &g->stream, why, cap)) return -1;
    x = json_object_get(body, "stream_options");
    if (x && !json_is_null(x)) {
        if (!json_is_object(x)) { snprintf(why, cap, "\"stream_options\" must be an object"); return -1; }
        if (field_bool(x, "include_usage", &g->include_usage, why, cap)) return -1;
    }
    ht_sampler_params *sp = &r->sp;
#define NUM(key, lo, hi, integer, dst, type)                                                       \
    do {                                                                                           \
        v = NAN;                                                                                   \
        if (field_num(body, key, lo, hi, integer, &v, why, cap)) return -1;                        \
        if (!isnan(v)) dst = (type)v;                                                              \
    } while (0)
    NUM("temperature", 0, 100, false, sp->temp, float);
    NUM("top_k", 0, 1 << 24, true, sp->top_k, int32_t);
    NUM("top_p", 0, 1, false, sp->top_p, float);
    NUM("min_p", 0, 1, false, sp->min_p, float);
    NUM("repeat_penalty", 0, 100, false, sp->repeat_penalty, float);
    NUM("repeat_last_n", -1, 1 << 24, true, sp->repeat_last_n, int32_t);
    NUM("n_predict", -1, 1 << 24, true, r->n_predict, int32_t);
    NUM("max_tokens", 0, 1 << 24, true, r->n_predict, int32_t);
    NUM("max_completion_tokens", 0, 1 << 24, true, r->n_predict, int32_t);
    if (r->n_predict == 0) { snprintf(why, cap, "\"max_tokens\" must be at least 1"); return -1; }
    v = NAN;
    if (field_num(body, "seed", -1, 9.007199254740991e15, true, &v, why, cap)) return -1;
    if (!isnan(v)) sp->seed = v < 0 ? HT_SEED_RANDOM : (uint64_t)v;
    if (field_bool(body, "ignore_eos", &r->ignore_eos, why, cap)) return -1;
    /* logprobs: chat takes a boolean and top_logprobs; completions an integer (the alternatives) */
    x = json_object_get(body, "logprobs");
    if (x && !json_is_null(x)) {
        if (g->chat) {
            if (field_bool(body, "logprobs", &b, why, cap)) return -1;
            if (b) {
                double k = 0;
                if (field_num(body, "top_logprobs", 0, HS_MAX_TOP, true, &k, why, cap)) return -1;
                r->n_probs = (int)k;
            }
        } else {
            double k = 0;
            if (field_num(body, "logprobs", 0, HS_MAX_TOP, true, &k, why, cap)) return -1;
            r->n_probs = (int)k;
        }
    }
    x = json_object_get(body, "stop");
    if (json_is_string(x)) x = json_pack("[O]", x);
    else json_incref(x);
    if (x && !json_is_null(x)) {
        if (!json_is_array(x) || json_array_size(x) > HS_MAX_STOPS) {
            json_decref(x);
            snprintf(why, cap, "\"stop\" must be a string or an array of at most %d strings", HS_MAX_STOPS);
            return -1;
        }
        for (size_t i = 0; i < json_array_size(x); i++) {
            json_t *s = json_array_get(x, i);
            if (!json_is_string(s)) {
                json_decref(x);
                snprintf(why, cap, "\"stop\" must be a string or an array of strings");
                return -1;
            }
            if (json_string_length(s) && (r->stops[r->n_stops] = strdup(json_string_value(s)))) r->n_stops++;
        }
    }
    json_decref(x);
    /* the chat's end-of-turn text ends the answer when the model writes it out as text */
    const char *eot = ht_chat_end_of_turn(mi->chat_tmpl);
    if (g->chat && eot[0] && (r->stops[r->n_stops] = strdup(eot))) r->n_stops++;
#undef NUM
    return g->chat ? read_messages(mi, body, r, why, cap) : read_prompt(mi, body, r, why, cap);
}

int hs_read_gen(const hs_model_info *mi, const char *body, size_t len, hs_req *r, hs_gen_req *g, char *why,
                size_t cap) {
    json_error_t je;
    json_t *j = json_loadb(body ? body : "", len, 0, &je);
    if (!j) {
        snprintf(why, cap, "invalid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
        return -1;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        snprintf(why, cap, "the request body must be a JSON object");
        return -1;
    }
    int rc = read_gen(mi, j, r, g, why, cap);
    json_decref(j);
    if (rc) return -1;
    if (r->n_prompt == 0) { snprintf(why, cap, "the prompt is empty"); return -1; }
    return 0;
}

/* ---- /tokenize and /detokenize -------------------------------------------------------------------- */
/* the body as JSON; NULL with *status 400 and why if it is not (*status is 400 either way) */
static json_t *load_body(const char *body, size_t len, unsigned *status, char *why, size_t cap) {
    json_error_t je;
    json_t *j = json_loadb(body ? body : "", len, 0, &je);
    *status = 400;
    if (!j) snprintf(why, cap, "invalid JSON: %s", je.text);
    return j;
}

json_t *hs_tokenize_reply(const hs_model_info *mi, const char *body, size_t blen, unsigned *status, char *why,
                          size_t cap) {
    json_t *j = load_body(body, blen, status, why, cap);
    if (!j) return NULL;
    json_t *content = json_object_get(j, "content");
    bool special = false, pieces = false;
    why[0] = 0;
    if (!json_is_string(content) || field_bool(j, "add_special", &special, why, cap) ||
        field_bool(j, "with_pieces", &pieces, why, cap)) {
        json_decref(j);
        if (!why[0]) snprintf(why, cap, "\"content\" must be a string");
        return NULL;
    }
    size_t len = json_string_length(content);
    int n_cap = (int)HR_MIN(len + 8, (size_t)1 << 26);
    int32_t *t = malloc((size_t)n_cap * sizeof *t);
    int n = t ? ht_tokenize(mi->voc, json_string_value(content), len, special && mi->add_bos, t, n_cap) : HR_ENOMEM;
    json_decref(j);
    if (n < 0 || n > n_cap) {
        free(t);
        *status = 500;
        snprintf(why, cap, "tokenization failed");
        return NULL;
    }
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        if (!pieces) { json_array_append_new(arr, json_integer(t[i])); continue; }
        json_t *tj = hs_token_json(mi->voc, t[i], 0, false);
        json_t *piece = json_incref(json_object_get(tj, "token"));
        json_array_append_new(arr, json_pack("{s:i,s:o}", "id", t[i], "piece", piece));
        json_decref(tj);
    }
    free(t);
    *status = 200;
    return json_pack("{s:o}", "tokens", arr);
}

json_t *hs_detokenize_reply(const hs_model_info *mi, const char *body, size_t blen, unsigned *status, char *why,
                            size_t cap) {
    json_t *j = load_body(body, blen, status, why, cap);
    if (!j) return NULL;
    json_t *toks = json_object_get(j, "tokens");
    if (!json_is_array(toks)) {
        json_decref(j);
        snprintf(why, cap, "\"tokens\" must be an array of token ids");
        return NULL;
    }
    ht_detok d;
    ht_detok_init(&d, mi->voc);
    int pc = ht_detok_max_bytes(mi->voc);
    size_t n = json_array_size(toks), ocap = (n + 1) * (size_t)pc + 1, len = 0;
    char *out = malloc(ocap);
    if (!out) {
        json_decref(j);
        *status = 500;
        snprintf(why, cap, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(toks, i);
        json_int_t id = json_is_integer(t) ? json_integer_value(t) : -1;
        if (id < 0 || id >= ht_vocab_size(mi->voc)) {
            free(out);
            json_decref(j);
            snprintf(why, cap, "tokens[%zu] is not a token id (0..%d)", i, ht_vocab_size(mi->voc) - 1);
            return NULL;
        }
        len += (size_t)ht_detok_push(&d, (int32_t)id, out + len, pc);
    }
    len += (size_t)ht_detok_flush(&d, out + len, pc);
    json_decref(j);
    json_t *o = json_pack("{s:s%}", "content", out, len);
    free(out);
    *status = 200;
    return o;
}

/* ---- the request line and headers ----------------------------------------------------------------- */
int hs_route_of(const char *method, const char *url) {
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (!strcmp(method, "OPTIONS")) return HS_EP_OPTIONS;
    if (get && (!strcmp(url, "/") || !strcmp(url, "/index.html"))) return HS_EP_INDEX;
    if (get && (!strcmp(url, "/health") || !strcmp(url, "/v1/health"))) return HS_EP_HEALTH;
    if (get && (!strcmp(url, "/v1/models") || !strcmp(url, "/models"))) return HS_EP_MODELS;
    if (get && !strcmp(url, "/slots")) return HS_EP_SLOTS;
    if (get && !strcmp(url, "/metrics")) return HS_EP_METRICS;
    if (post && (!strcmp(url, "/v1/chat/completions") || !strcmp(url, "/chat/completions"))) return HS_EP_CHAT;
    if (post && (!strcmp(url, "/v1/completions") || !strcmp(url, "/completions"))) return HS_EP_COMPLETIONS;
    if (post && !strcmp(url, "/tokenize")) return HS_EP_TOKENIZE;
    if (post && !strcmp(url, "/detokenize")) return HS_EP_DETOKENIZE;
    return HS_EP_NOT_FOUND;
}

bool hs_bearer_ok(const char *api_key, const char *h) {
    if (!api_key) return true;
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    h += 7;
    size_t n = strlen(h), k = strlen(api_key);
    unsigned diff = n != k;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)h[i] ^ (unsigned char)api_key[i % (k ? k : 1)];
    return diff == 0;
}
