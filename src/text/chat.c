/* Chat templates: recognising a model's family from its Jinja text, rendering conversations in
   that family's format, tokenizing the result with special tokens, and stop strings.

   The formats and the recognition substrings are those of llama.cpp's built-in templates
   (src/llama-chat.cpp), which in turn follow each family's published format; where a family's
   Jinja program does more (tool calls, reasoning-trace stripping) the built-in rendering, and
   this one, keeps to plain messages. */
#include "chat.h"

#include <stdio.h>
#include <stdlib.h>

static const char *const ht_chat_names[HT_CHAT_COUNT] = {
    [HT_CHAT_CHATML] = "chatml",
    [HT_CHAT_LLAMA2] = "llama2",
    [HT_CHAT_LLAMA2_SYS] = "llama2-sys",
    [HT_CHAT_LLAMA2_SYS_BOS] = "llama2-sys-bos",
    [HT_CHAT_LLAMA2_SYS_STRIP] = "llama2-sys-strip",
    [HT_CHAT_MISTRAL_V1] = "mistral-v1",
    [HT_CHAT_MISTRAL_V3] = "mistral-v3",
    [HT_CHAT_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
    [HT_CHAT_MISTRAL_V7] = "mistral-v7",
    [HT_CHAT_MISTRAL_V7_TEKKEN] = "mistral-v7-tekken",
    [HT_CHAT_PHI3] = "phi3",
    [HT_CHAT_PHI4] = "phi4",
    [HT_CHAT_FALCON3] = "falcon3",
    [HT_CHAT_ZEPHYR] = "zephyr",
    [HT_CHAT_GEMMA] = "gemma",
    [HT_CHAT_LLAMA3] = "llama3",
    [HT_CHAT_LLAMA4] = "llama4",
    [HT_CHAT_DEEPSEEK3] = "deepseek3",
    [HT_CHAT_COMMAND_R] = "command-r",
};

static const struct { const char *alias; int tmpl; } ht_chat_aliases[] = {
    {"qwen", HT_CHAT_CHATML},
    {"mistral", HT_CHAT_MISTRAL_V3},
    {"deepseek-r1", HT_CHAT_DEEPSEEK3},
    {"llama-3", HT_CHAT_LLAMA3},
};

/* DeepSeek's markers use U+FF5C FULLWIDTH VERTICAL LINE and U+2581 (the SentencePiece space) */
#define DS_USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define DS_ASSISTANT "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
#define DS_EOS "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"

const char *ht_chat_name(int tmpl) {
    return tmpl >= 0 && tmpl < HT_CHAT_COUNT ? ht_chat_names[tmpl] : "unknown";
}

int ht_chat_from_name(const char *name) {
    if (!name) return HT_CHAT_UNKNOWN;
    for (int i = 0; i < HT_CHAT_COUNT; i++)
        if (!strcmp(name, ht_chat_names[i])) return i;
    for (size_t i = 0; i < HR_ARRAY_LEN(ht_chat_aliases); i++)
        if (!strcmp(name, ht_chat_aliases[i].alias)) return ht_chat_aliases[i].tmpl;
    return HT_CHAT_UNKNOWN;
}

/* ---- recognition --------------------------------------------------------------------------------- */

int ht_chat_detect(const char *t) {
    if (!t) return HT_CHAT_UNKNOWN;
    int byname = ht_chat_from_name(t);
    if (byname != HT_CHAT_UNKNOWN) return byname;
#define HAS(s) (strstr(t, s) != NULL)
    /* The order matters: several families share markers (phi4 and SmolVLM use <|im_start|>, the
       GLM and Falcon 3 templates use <|user|> and <|assistant|>), so the more specific tests come
       first, as in llama.cpp. Families hearth does not render but that would otherwise match a
       later test are answered UNKNOWN here. */
    if (HAS("<|im_start|>")) {
        if (HAS("<|im_sep|>")) return HT_CHAT_PHI4;
        if (HAS("<end_of_utterance>")) return HT_CHAT_UNKNOWN;  /* SmolVLM: <|im_start|> is its BOS */
        return HT_CHAT_CHATML;
    }
    if (!strncmp(t, "mistral", 7) || HAS("[INST]")) {
        if (HAS("[SYSTEM_PROMPT]")) return HT_CHAT_MISTRAL_V7;
        /* Mistral's own v1 and v3 templates: the v1 text adds ' [INST] ' before the system
           message; v3 and v3-tekken list tools in [AVAILABLE_TOOLS]; tekken has no space
           after [INST] */
        if (HAS("' [INST] ' + system_message") || HAS("[AVAILABLE_TOOLS]")) {
            if (HAS(" [INST]")) return HT_CHAT_MISTRAL_V1;
            if (HAS("\"[INST]\"")) return HT_CHAT_MISTRAL_V3_TEKKEN;
            return HT_CHAT_MISTRAL_V3;
        }
        if (HAS("content.strip()")) return HT_CHAT_LLAMA2_SYS_STRIP;
        if (HAS("bos_token + '[INST]")) return HT_CHAT_LLAMA2_SYS_BOS;
        if (HAS("<<SYS>>")) return HT_CHAT_LLAMA2_SYS;
        return HT_CHAT_LLAMA2;
    }
    if (HAS("<|assistant|>") && HAS("<|end|>")) return HT_CHAT_PHI3;
    if (HAS("[gMASK]<sop>")) return HT_CHAT_UNKNOWN;  /* ChatGLM 4 */
    if (HAS("<|assistant|>") && HAS("<|user|>")) return HAS("</s>") ? HT_CHAT_FALCON3 : HT_CHAT_UNKNOWN /* GLM-Edge */;
    if (HAS("<|user|>") && HAS("<|endoftext|>")) return HT_CHAT_ZEPHYR;
    if (HAS("bos_token + message['role']")) return HT_CHAT_UNKNOWN;  /* Monarch */
    if (HAS("<start_of_turn>")) return HT_CHAT_GEMMA;
    if (HAS("<|START_OF_TURN_TOKEN|>") && HAS("<|USER_TOKEN|>")) return HT_CHAT_COMMAND_R;
    if (HAS("<|start_header_id|>") && HAS("<|end_header_id|>")) return HT_CHAT_LLAMA3;
    if (HAS(DS_ASSISTANT) && HAS(DS_USER) && HAS(DS_EOS)) return HT_CHAT_DEEPSEEK3;
    if (HAS("<|header_start|>") && HAS("<|header_end|>")) return HT_CHAT_LLAMA4;
#undef HAS
    return HT_CHAT_UNKNOWN;
}

int ht_chat_for_model(const gguf_ctx *g, const char *name, char *note, size_t cap) {
    if (cap) note[0] = 0;
    if (name) return ht_chat_from_name(name);
    gguf_str s;
    if (!gguf_get_str(g, "tokenizer.chat_template", &s)) {
        if (cap) snprintf(note, cap, "the model has no chat template (tokenizer.chat_template); using chatml");
        return HT_CHAT_CHATML;
    }
    /* the GGUF string is not NUL-terminated and may hold a NUL of its own: detect on a copy */
    char *t = malloc(s.n + 1);
    if (!t) {
        if (cap) snprintf(note, cap, "out of memory reading the chat template; using chatml");
        return HT_CHAT_CHATML;
    }
    memcpy(t, s.s, s.n);
    t[s.n] = 0;
    int tmpl = ht_chat_detect(t);
    free(t);
    if (tmpl == HT_CHAT_UNKNOWN) {
        if (cap) snprintf(note, cap, "the model's chat template (tokenizer.chat_template, %llu bytes) is not one hearth "
                          "recognises; using chatml", (unsigned long long)s.n);
        return HT_CHAT_CHATML;
    }
    return tmpl;
}

/* ---- rendering ----------------------------------------------------------------------------------- */

/* Output that counts everything and writes what fits (snprintf semantics). */
typedef struct ht_sb {
    char   *out;
    size_t  cap;   /* bytes available for text: the caller's cap minus the NUL */
    int64_t n;
} ht_sb;

static void sb_put(ht_sb *b, const char *s, size_t n) {
    if ((uint64_t)b->n < b->cap) {
        size_t room = b->cap - (size_t)b->n;
        memcpy(b->out + b->n, s, n < room ? n : room);
    }
    b->n += (int64_t)n;
}
static void sb_str(ht_sb *b, const char *s) { sb_put(b, s, strlen(s)); }

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* s without leading and trailing ASCII whitespace (as Jinja's trim and Python's strip()) */
static const char *trimmed(const char *s, size_t *len) {
    size_t n = strlen(s), i = 0;
    while (i < n && is_space(s[i])) i++;
    while (n > i && is_space(s[n - 1])) n--;
    *len = n - i;
    return s + i;
}
static size_t trimmed_len(const char *s) { size_t n; trimmed(s, &n); return n; }
static void sb_trimmed(ht_sb *b, const char *s) {
    size_t n;
    const char *t = trimmed(s, &n);
    sb_put(b, t, n);
}

static bool role_is(const ht_chat_msg *m, const char *r) { return !strcmp(m->role, r); }

/* [INST] families: llama2 and its variants, mistral v1/v3/v3-tekken */
static void render_inst(ht_sb *b, int tmpl, const ht_chat_msg *msgs, int n) {
    if (tmpl >= HT_CHAT_LLAMA2 && tmpl <= HT_CHAT_LLAMA2_SYS_STRIP) {
        bool sys = tmpl != HT_CHAT_LLAMA2, bos_inside = tmpl == HT_CHAT_LLAMA2_SYS_BOS,
             strip = tmpl == HT_CHAT_LLAMA2_SYS_STRIP;
        /* the first [INST] is opened up front: the opening BOS is the tokenizer's */
        sb_str(b, "[INST] ");
        bool open = true;
        for (int i = 0; i < n; i++) {
            const ht_chat_msg *m = &msgs[i];
            if (!open) {
                sb_str(b, bos_inside ? "<s>[INST] " : "[INST] ");
                open = true;
            }
            bool s = role_is(m, "system"), u = role_is(m, "user");
            if (s && sys) sb_str(b, "<<SYS>>\n");
            if (strip) sb_trimmed(b, m->content); else sb_str(b, m->content);
            if (s) sb_str(b, sys ? "\n<</SYS>>\n\n" : "\n");  /* no <<SYS>>: the system text leads the first [INST] */
            else if (u) sb_str(b, " [/INST]");
            else { sb_str(b, "</s>"); open = false; }
        }
        return;
    }
    const char *lead = tmpl == HT_CHAT_MISTRAL_V1 ? " " : "";
    const char *trail = tmpl == HT_CHAT_MISTRAL_V3_TEKKEN ? "" : " ";
    bool open = false;
    for (int i = 0; i < n; i++) {
        const ht_chat_msg *m = &msgs[i];
        if (!open) {
            sb_str(b, lead); sb_str(b, "[INST]"); sb_str(b, trail);
            open = true;
        }
        if (role_is(m, "system")) { sb_str(b, m->content); sb_str(b, "\n\n"); }
        else if (role_is(m, "user")) { sb_str(b, m->content); sb_str(b, lead); sb_str(b, "[/INST]"); }
        else {
            sb_str(b, trail);
            if (tmpl == HT_CHAT_MISTRAL_V3) sb_trimmed(b, m->content); else sb_str(b, m->content);
            sb_str(b, "</s>");
            open = false;
        }
    }
}

/* families that write every message as PRE role MID content POST, and GEN to open the answer */
static void render_uniform(ht_sb *b, const ht_chat_msg *msgs, int n, bool add, const char *pre, const char *mid,
                           const char *post, bool trim, const char *gen) {
    for (int i = 0; i < n; i++) {
        sb_str(b, pre); sb_str(b, msgs[i].role); sb_str(b, mid);
        if (trim) sb_trimmed(b, msgs[i].content); else sb_str(b, msgs[i].content);
        sb_str(b, post);
    }
    if (add) sb_str(b, gen);
}

static void render(ht_sb *b, int tmpl, const ht_chat_msg *msgs, int n, bool add) {
    switch (tmpl) {
    case HT_CHAT_CHATML:
        render_uniform(b, msgs, n, add, "<|im_start|>", "\n", "<|im_end|>\n", false, "<|im_start|>assistant\n");
        break;
    case HT_CHAT_PHI3:
        render_uniform(b, msgs, n, add, "<|", "|>\n", "<|end|>\n", false, "<|assistant|>\n");
        break;
    case HT_CHAT_PHI4:
        render_uniform(b, msgs, n, add, "<|im_start|>", "<|im_sep|>", "<|im_end|>", false, "<|im_start|>assistant<|im_sep|>");
        break;
    case HT_CHAT_FALCON3:
        render_uniform(b, msgs, n, add, "<|", "|>\n", "\n", false, "<|assistant|>\n");
        break;
    case HT_CHAT_ZEPHYR:
        render_uniform(b, msgs, n, add, "<|", "|>\n", "<|endoftext|>\n", false, "<|assistant|>\n");
        break;
    case HT_CHAT_LLAMA3:
        render_uniform(b, msgs, n, add, "<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>", true,
                       "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case HT_CHAT_LLAMA4:
        render_uniform(b, msgs, n, add, "<|header_start|>", "<|header_end|>\n\n", "<|eot|>", true,
                       "<|header_start|>assistant<|header_end|>\n\n");
        break;
    case HT_CHAT_LLAMA2: case HT_CHAT_LLAMA2_SYS: case HT_CHAT_LLAMA2_SYS_BOS: case HT_CHAT_LLAMA2_SYS_STRIP:
    case HT_CHAT_MISTRAL_V1: case HT_CHAT_MISTRAL_V3: case HT_CHAT_MISTRAL_V3_TEKKEN:
        /* the answer follows [/INST] directly: no assistant header to add */
        render_inst(b, tmpl, msgs, n);
        break;
    case HT_CHAT_MISTRAL_V7: case HT_CHAT_MISTRAL_V7_TEKKEN: {
        const char *sp = tmpl == HT_CHAT_MISTRAL_V7 ? " " : "";
        for (int i = 0; i < n; i++) {
            const ht_chat_msg *m = &msgs[i];
            if (role_is(m, "system")) { sb_str(b, "[SYSTEM_PROMPT]"); sb_str(b, sp); sb_str(b, m->content); sb_str(b, "[/SYSTEM_PROMPT]"); }
            else if (role_is(m, "user")) { sb_str(b, "[INST]"); sb_str(b, sp); sb_str(b, m->content); sb_str(b, "[/INST]"); }
            else { sb_str(b, sp); sb_str(b, m->content); sb_str(b, "</s>"); }
        }
        break;
    }
    case HT_CHAT_GEMMA: {
        /* Gemma has no system role: the system texts seen so far join the next user turn, after a
           blank line (an answer in between does not take them) */
        int sys_from = -1;
        for (int i = 0; i < n; i++) {
            const ht_chat_msg *m = &msgs[i];
            if (role_is(m, "system")) {
                if (sys_from < 0 && trimmed_len(m->content)) sys_from = i;
                continue;
            }
            bool model = role_is(m, "assistant");
            sb_str(b, "<start_of_turn>"); sb_str(b, model ? "model" : m->role); sb_str(b, "\n");
            if (sys_from >= 0 && !model) {
                for (int k = sys_from; k < i; k++)
                    if (role_is(&msgs[k], "system")) sb_trimmed(b, msgs[k].content);
                sb_str(b, "\n\n");
                sys_from = -1;
            }
            sb_trimmed(b, m->content);
            sb_str(b, "<end_of_turn>\n");
        }
        if (add) sb_str(b, "<start_of_turn>model\n");
        break;
    }
    case HT_CHAT_DEEPSEEK3:
        for (int i = 0; i < n; i++) {
            const ht_chat_msg *m = &msgs[i];
            if (role_is(m, "system")) { sb_str(b, m->content); sb_str(b, "\n\n"); }
            else if (role_is(m, "user")) { sb_str(b, DS_USER); sb_str(b, m->content); }
            else if (role_is(m, "assistant")) { sb_str(b, DS_ASSISTANT); sb_str(b, m->content); sb_str(b, DS_EOS); }
        }
        if (add) sb_str(b, DS_ASSISTANT);
        break;
    case HT_CHAT_COMMAND_R:
        for (int i = 0; i < n; i++) {
            const ht_chat_msg *m = &msgs[i];
            const char *tok = role_is(m, "system") ? "<|SYSTEM_TOKEN|>" : role_is(m, "user") ? "<|USER_TOKEN|>"
                            : role_is(m, "assistant") ? "<|CHATBOT_TOKEN|>" : NULL;
            if (!tok) continue;
            sb_str(b, "<|START_OF_TURN_TOKEN|>"); sb_str(b, tok); sb_trimmed(b, m->content); sb_str(b, "<|END_OF_TURN_TOKEN|>");
        }
        if (add) sb_str(b, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");
        break;
    }
}

int64_t ht_chat_render(int tmpl, const ht_chat_msg *msgs, int n, bool add_assistant, char *out, size_t cap) {
    if (tmpl < 0 || tmpl >= HT_CHAT_COUNT || n < 0 || (n && !msgs) || (cap && !out)) return HR_EINVAL;
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content) return HR_EINVAL;
    ht_sb b = {.out = out, .cap = cap ? cap - 1 : 0, .n = 0};
    render(&b, tmpl, msgs, n, add_assistant);
    if (cap) out[(uint64_t)b.n < b.cap ? (size_t)b.n : b.cap] = 0;
    return b.n;
}

char *ht_chat_render_alloc(int tmpl, const ht_chat_msg *msgs, int n, bool add_assistant, size_t *len) {
    int64_t need = ht_chat_render(tmpl, msgs, n, add_assistant, NULL, 0);
    if (need < 0 || (uint64_t)need >= SIZE_MAX) return NULL;
    char *s = malloc((size_t)need + 1);
    if (!s) return NULL;
    ht_chat_render(tmpl, msgs, n, add_assistant, s, (size_t)need + 1);
    if (len) *len = (size_t)need;
    return s;
}

const char *ht_chat_end_of_turn(int tmpl) {
    switch (tmpl) {
    case HT_CHAT_CHATML: case HT_CHAT_PHI4: return "<|im_end|>";
    case HT_CHAT_LLAMA2: case HT_CHAT_LLAMA2_SYS: case HT_CHAT_LLAMA2_SYS_BOS: case HT_CHAT_LLAMA2_SYS_STRIP:
    case HT_CHAT_MISTRAL_V1: case HT_CHAT_MISTRAL_V3: case HT_CHAT_MISTRAL_V3_TEKKEN:
    case HT_CHAT_MISTRAL_V7: case HT_CHAT_MISTRAL_V7_TEKKEN: return "</s>";
    case HT_CHAT_PHI3: return "<|end|>";
    case HT_CHAT_ZEPHYR: return "<|endoftext|>";
    case HT_CHAT_GEMMA: return "<end_of_turn>";
    case HT_CHAT_LLAMA3: return "<|eot_id|>";
    case HT_CHAT_LLAMA4: return "<|eot|>";
    case HT_CHAT_DEEPSEEK3: return DS_EOS;
    case HT_CHAT_COMMAND_R: return "<|END_OF_TURN_TOKEN|>";
    default: return "";  /* falcon3 ends a message with a newline only: its EOS token ends the answer */
    }
}

/* ---- tokenizing with special tokens -------------------------------------------------------------- */

int ht_chat_tokenize(const ht_vocab *v, const char *text, size_t len, bool add_bos, int32_t *out, int cap) {
    if (!v || (len && !text)) return HR_EINVAL;
    /* a template or a user's text that already opens with BOS must not get a second one (llama.cpp
       warns of a double BOS: models answer worse after one) */
    int32_t bos = ht_token_bos(v);
    if (add_bos && bos >= 0) {
        const char *bt = ht_token_text(v, bos);
        size_t bl = bt ? strlen(bt) : 0;
        if (bl && bl <= len && !memcmp(text, bt, bl)) add_bos = false;
    }
    return ht_tokenize_ex(v, text, len, add_bos, true, out, cap);
}

/* ---- stop strings -------------------------------------------------------------------------------- */

bool ht_chat_stop_scan(const char *text, size_t len, size_t from, const char *const *stops, int n_stops,
                       size_t *safe) {
    size_t hold = len;  /* where the earliest tail that may grow into a stop string starts */
    for (size_t p = from; p < len; p++) {
        for (int k = 0; k < n_stops; k++) {
            size_t sl = stops[k] ? strlen(stops[k]) : 0;
            if (!sl) continue;
            size_t m = len - p < sl ? len - p : sl;
            if (memcmp(text + p, stops[k], m)) continue;
            if (m == sl) { *safe = p; return true; }
            if (hold == len) hold = p;
        }
    }
    *safe = hold;
    return false;
}
