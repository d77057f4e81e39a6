/*
 * chat — chat templates: the text a conversation (system / user / assistant messages) becomes
 * before it is tokenized, in the format each model family was fine-tuned on, and the helpers a
 * chat front end needs around it (special-token tokenization, stop strings).  Prefix: ht_chat_.
 *
 * No Jinja: a GGUF's tokenizer.chat_template is recognised by distinctive substrings, as llama.cpp
 * recognises its built-in templates, and each family is rendered by fixed code to llama.cpp's text.
 * Rendered text never begins with BOS (the tokenizer adds it) but holds other special tokens, so it
 * is tokenized with ht_chat_tokenize. docs/design.md, "Chat templates", has the details.
 *
 * Ownership: nothing here keeps a pointer to its arguments; rendered text is written to the
 * caller's buffer (ht_chat_render) or returned malloc'd (ht_chat_render_alloc, caller frees).
 */
#ifndef HEARTH_CHAT_H
#define HEARTH_CHAT_H

#include "text/text.h"

/* Template families (values are stable: append only). Names as in llama.cpp. */
typedef enum ht_chat_tmpl {
    HT_CHAT_UNKNOWN = -1,
    HT_CHAT_CHATML = 0,           /* "chatml": Qwen 2/2.5/3, SmolLM2, Hermes, ... */
    HT_CHAT_LLAMA2,               /* "llama2": [INST] without <<SYS>> (Mistral v0.1/v0.2 style) */
    HT_CHAT_LLAMA2_SYS,           /* "llama2-sys": [INST] <<SYS>> (Llama 2 chat) */
    HT_CHAT_LLAMA2_SYS_BOS,       /* "llama2-sys-bos": later turns start with <s>[INST] */
    HT_CHAT_LLAMA2_SYS_STRIP,     /* "llama2-sys-strip": contents stripped of outer whitespace */
    HT_CHAT_MISTRAL_V1,           /* "mistral-v1": " [INST] ... [/INST]" */
    HT_CHAT_MISTRAL_V3,           /* "mistral-v3": "[INST] ...[/INST]" (Mistral 7B v0.3) */
    HT_CHAT_MISTRAL_V3_TEKKEN,    /* "mistral-v3-tekken": "[INST]...[/INST]" (Mistral Nemo) */
    HT_CHAT_MISTRAL_V7,           /* "mistral-v7": [SYSTEM_PROMPT] (Mistral Large 2411) */
    HT_CHAT_MISTRAL_V7_TEKKEN,    /* "mistral-v7-tekken": same without spaces (Mistral Small 3) */
    HT_CHAT_PHI3,                 /* "phi3": <|user|>\n ... <|end|>\n */
    HT_CHAT_PHI4,                 /* "phi4": <|im_start|>role<|im_sep|> */
    HT_CHAT_FALCON3,              /* "falcon3": <|user|>\n ... \n */
    HT_CHAT_ZEPHYR,               /* "zephyr": <|user|>\n ... <|endoftext|>\n */
    HT_CHAT_GEMMA,                /* "gemma": <start_of_turn>user / model; system merged into the first user turn */
    HT_CHAT_LLAMA3,               /* "llama3": <|start_header_id|>role<|end_header_id|>\n\n ... <|eot_id|> */
    HT_CHAT_LLAMA4,               /* "llama4": <|header_start|>role<|header_end|>\n\n ... <|eot|> */
    HT_CHAT_DEEPSEEK3,            /* "deepseek3": <｜User｜> / <｜Assistant｜> (DeepSeek V3, R1 and its distills) */
    HT_CHAT_COMMAND_R,            /* "command-r": <|START_OF_TURN_TOKEN|><|USER_TOKEN|> */
    HT_CHAT_COUNT
} ht_chat_tmpl;

typedef struct ht_chat_msg {
    const char *role;     /* "system", "user" or "assistant" (other roles: see ht_chat_render) */
    const char *content;
} ht_chat_msg;

/* The family of a Jinja chat template (or of a template name), HT_CHAT_UNKNOWN if not
   recognised or NULL. */
int ht_chat_detect(const char *jinja);
/* "chatml", "llama3", ...; "unknown" for anything else */
const char *ht_chat_name(int tmpl);
/* A family by name: the names above, plus the aliases "qwen" (chatml), "mistral" (mistral-v3),
   "deepseek-r1" (deepseek3), "llama-3" (llama3). HT_CHAT_UNKNOWN if none. */
int ht_chat_from_name(const char *name);

/* Renders msgs[0..n) in family tmpl, followed by the assistant's turn header when add_assistant
   (so that generation continues with the assistant's answer). Like snprintf: writes at most cap
   bytes including a terminating NUL (nothing if cap is 0) and returns the full length without
   the NUL; HR_EINVAL for an unknown family or a message without role or content. Roles other
   than system/user/assistant are written as given by the families that name roles in the text;
   the others treat them as llama.cpp does (as assistant messages, or leave them out). */
int64_t ht_chat_render(int tmpl, const ht_chat_msg *msgs, int n, bool add_assistant, char *out, size_t cap);
/* The same into a malloc'd, NUL-terminated string (*len = its length if len is not NULL); NULL if
   out of memory or on the errors above. */
char *ht_chat_render_alloc(int tmpl, const ht_chat_msg *msgs, int n, bool add_assistant, size_t *len);

/* The text that closes an assistant message in this family ("<|im_end|>", "<|eot_id|>",
   "</s>", ...), "" if none. A model that has it as a special token ends its turn with that
   token (an end-of-generation token, see ht_is_eog); when the vocabulary lacks it — e.g. a base
   model run with a fallback template — the model can only write it out as text, so front ends
   also use it as a stop string. */
const char *ht_chat_end_of_turn(int tmpl);

/* The template for a model: `name` if not NULL (HT_CHAT_UNKNOWN if it names no family), else the
   family of the GGUF's tokenizer.chat_template; when the model has no template, or one that is
   not recognised, HT_CHAT_CHATML, and a sentence saying so and naming the fallback is written to
   note (NUL-terminated, at most cap bytes). note is "" when nothing needs saying. */
int ht_chat_for_model(const gguf_ctx *g, const char *name, char *note, size_t cap);

/* Tokenizes a rendered chat text: ht_tokenize_ex with parse_special (same return contract), so
   the texts of special tokens (<|im_start|>, </s>, ...) become their ids. add_bos prepends BOS
   unless the text already starts with the BOS token's text (no double BOS). */
int ht_chat_tokenize(const ht_vocab *v, const char *text, size_t len, bool add_bos, int32_t *out, int cap);

/* Stop strings over a growing text (an answer being streamed). Looks at text[from..len), where
   `from` is the value *safe had after the previous call (0 at first): if one of stops[0..n_stops)
   occurs starting at or after `from`, returns true with *safe = the offset of the earliest
   occurrence (the answer ends there). Otherwise returns false with *safe = the end of what can
   be shown: len minus the longest tail of the text that could still grow into a stop string, so
   no part of a stop string is ever printed. Empty stop strings are ignored. */
bool ht_chat_stop_scan(const char *text, size_t len, size_t from, const char *const *stops, int n_stops,
                       size_t *safe);

#endif
