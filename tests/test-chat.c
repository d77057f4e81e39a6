// modules: base quant gguf text
/* Chat templates: every family renders a fixed conversation to the string its published format
   gives; Jinja texts of real models (short excerpts of their tokenizer.chat_template, and the
   phi-3 template stored in shared/tokenizers) map to the right family and others are reported
   unknown; the model-level choice with its fallback note; special-token tokenization; stop
   strings over a stream. */
#include "test.h"
#include "text/chat.h"

static const char *g_dir;  /* ../shared, or NULL when it is not there (the model parts are skipped) */

/* system + user + assistant + user, then the assistant's turn is opened */
static const ht_chat_msg conv[] = {
    {"system", "You are a helpful assistant."},
    {"user", "Hello"},
    {"assistant", "Hi! How can I help?"},
    {"user", "Tell me a joke."},
};

static void check_render(int tmpl, const ht_chat_msg *msgs, int n, bool add, const char *want) {
    char buf[2048];
    int64_t k = ht_chat_render(tmpl, msgs, n, add, buf, sizeof buf);
    CHECKF(k == (int64_t)strlen(want) && !strcmp(buf, want), "%s:\n got: [%s]\nwant: [%s]", ht_chat_name(tmpl), buf, want);
}

/* The expected strings are written from each family's published format (model cards, Mistral's
   tokenization cookbook, the templates' Jinja texts). Where llama.cpp's built-in rendering — which
   hearth follows so that the two tokenize a conversation alike — settles a detail the published
   formats leave open or disagree on, the comment says so. */
static void test_render_families(void) {
    /* ChatML (Qwen, SmolLM2, Hermes): <|im_start|>ROLE\nCONTENT<|im_end|>\n */
    check_render(HT_CHAT_CHATML, conv, 4, true,
                 "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                 "<|im_start|>user\nHello<|im_end|>\n"
                 "<|im_start|>assistant\nHi! How can I help?<|im_end|>\n"
                 "<|im_start|>user\nTell me a joke.<|im_end|>\n"
                 "<|im_start|>assistant\n");
    check_render(HT_CHAT_CHATML, conv, 3, false,
                 "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                 "<|im_start|>user\nHello<|im_end|>\n"
                 "<|im_start|>assistant\nHi! How can I help?<|im_end|>\n");
    /* Llama 2 chat ("How to prompt Llama 2"): [INST] <<SYS>>\nSYS\n<</SYS>>\n\nUSER [/INST] with the
       answer and </s> after [/INST]; the leading <s> is BOS, added by the tokenizer. The answer
       follows [/INST] without a space, as in the HF Jinja templates llama.cpp's variants follow
       (Meta's reference code puts spaces around it). */
    check_render(HT_CHAT_LLAMA2_SYS, conv, 4, true,
                 "[INST] <<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\n"
                 "Hello [/INST]Hi! How can I help?</s>[INST] Tell me a joke. [/INST]");
    check_render(HT_CHAT_LLAMA2_SYS_BOS, conv, 4, true,
                 "[INST] <<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\n"
                 "Hello [/INST]Hi! How can I help?</s><s>[INST] Tell me a joke. [/INST]");
    /* Mistral 7B Instruct v0.1/v0.2: no system role; llama.cpp puts the system text, and a newline,
       at the start of the first [INST] */
    check_render(HT_CHAT_LLAMA2, conv, 4, true,
                 "[INST] You are a helpful assistant.\nHello [/INST]Hi! How can I help?</s>[INST] Tell me a joke. [/INST]");
    /* Mistral cookbook, v1: "<s> [INST] user [/INST] assistant</s> [INST] user [/INST]"; v3:
       "<s>[INST] user[/INST] assistant</s>[INST] user[/INST]"; v3-tekken: no spaces. The system
       prompt leads the first [INST] followed by a blank line. */
    check_render(HT_CHAT_MISTRAL_V1, conv, 4, true,
                 " [INST] You are a helpful assistant.\n\nHello [/INST] Hi! How can I help?</s> [INST] Tell me a joke. [/INST]");
    check_render(HT_CHAT_MISTRAL_V3, conv, 4, true,
                 "[INST] You are a helpful assistant.\n\nHello[/INST] Hi! How can I help?</s>[INST] Tell me a joke.[/INST]");
    check_render(HT_CHAT_MISTRAL_V3_TEKKEN, conv, 4, true,
                 "[INST]You are a helpful assistant.\n\nHello[/INST]Hi! How can I help?</s>[INST]Tell me a joke.[/INST]");
    /* v7 (Mistral Large 2411): "[SYSTEM_PROMPT] sys[/SYSTEM_PROMPT][INST] user[/INST] answer</s>";
       v7-tekken (Mistral Small 3): the same without the spaces */
    check_render(HT_CHAT_MISTRAL_V7, conv, 4, true,
                 "[SYSTEM_PROMPT] You are a helpful assistant.[/SYSTEM_PROMPT][INST] Hello[/INST] Hi! How can I help?</s>"
                 "[INST] Tell me a joke.[/INST]");
    check_render(HT_CHAT_MISTRAL_V7_TEKKEN, conv, 4, true,
                 "[SYSTEM_PROMPT]You are a helpful assistant.[/SYSTEM_PROMPT][INST]Hello[/INST]Hi! How can I help?</s>"
                 "[INST]Tell me a joke.[/INST]");
    /* Phi-3 model card: <|user|>\nQUESTION<|end|>\n<|assistant|>\n */
    check_render(HT_CHAT_PHI3, conv, 4, true,
                 "<|system|>\nYou are a helpful assistant.<|end|>\n<|user|>\nHello<|end|>\n"
                 "<|assistant|>\nHi! How can I help?<|end|>\n<|user|>\nTell me a joke.<|end|>\n<|assistant|>\n");
    /* Phi-4 model card: <|im_start|>ROLE<|im_sep|>CONTENT<|im_end|>, no newlines */
    check_render(HT_CHAT_PHI4, conv, 4, true,
                 "<|im_start|>system<|im_sep|>You are a helpful assistant.<|im_end|>"
                 "<|im_start|>user<|im_sep|>Hello<|im_end|>"
                 "<|im_start|>assistant<|im_sep|>Hi! How can I help?<|im_end|>"
                 "<|im_start|>user<|im_sep|>Tell me a joke.<|im_end|>"
                 "<|im_start|>assistant<|im_sep|>");
    /* Falcon 3: <|ROLE|>\nCONTENT\n */
    check_render(HT_CHAT_FALCON3, conv, 4, true,
                 "<|system|>\nYou are a helpful assistant.\n<|user|>\nHello\n<|assistant|>\nHi! How can I help?\n"
                 "<|user|>\nTell me a joke.\n<|assistant|>\n");
    /* Zephyr (StableLM 2 Zephyr, whose end of message is <|endoftext|>) */
    check_render(HT_CHAT_ZEPHYR, conv, 4, true,
                 "<|system|>\nYou are a helpful assistant.<|endoftext|>\n<|user|>\nHello<|endoftext|>\n"
                 "<|assistant|>\nHi! How can I help?<|endoftext|>\n<|user|>\nTell me a joke.<|endoftext|>\n<|assistant|>\n");
    /* Gemma model card: <start_of_turn>user\n...<end_of_turn>\n<start_of_turn>model\n; no system role:
       the system text opens the first user turn, followed by a blank line (as Gemma 3's template) */
    check_render(HT_CHAT_GEMMA, conv, 4, true,
                 "<start_of_turn>user\nYou are a helpful assistant.\n\nHello<end_of_turn>\n"
                 "<start_of_turn>model\nHi! How can I help?<end_of_turn>\n"
                 "<start_of_turn>user\nTell me a joke.<end_of_turn>\n<start_of_turn>model\n");
    /* Llama 3 model card: <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|> (BOS
       <|begin_of_text|> from the tokenizer) */
    check_render(HT_CHAT_LLAMA3, conv, 4, true,
                 "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\nHi! How can I help?<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nTell me a joke.<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\n");
    /* Llama 4 model card: <|header_start|>ROLE<|header_end|>\n\nCONTENT<|eot|> */
    check_render(HT_CHAT_LLAMA4, conv, 4, true,
                 "<|header_start|>system<|header_end|>\n\nYou are a helpful assistant.<|eot|>"
                 "<|header_start|>user<|header_end|>\n\nHello<|eot|>"
                 "<|header_start|>assistant<|header_end|>\n\nHi! How can I help?<|eot|>"
                 "<|header_start|>user<|header_end|>\n\nTell me a joke.<|eot|>"
                 "<|header_start|>assistant<|header_end|>\n\n");
    /* DeepSeek V3 / R1: SYSTEM<｜User｜>USER<｜Assistant｜>ANSWER<｜end▁of▁sentence｜>; llama.cpp
       separates the system text with a blank line */
    check_render(HT_CHAT_DEEPSEEK3, conv, 4, true,
                 "You are a helpful assistant.\n\n"
                 "<\xef\xbd\x9cUser\xef\xbd\x9c>Hello"
                 "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>Hi! How can I help?<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
                 "<\xef\xbd\x9cUser\xef\xbd\x9c>Tell me a joke."
                 "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>");
    /* Command R: <|START_OF_TURN_TOKEN|><|USER_TOKEN|>...<|END_OF_TURN_TOKEN|> */
    check_render(HT_CHAT_COMMAND_R, conv, 4, true,
                 "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a helpful assistant.<|END_OF_TURN_TOKEN|>"
                 "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hello<|END_OF_TURN_TOKEN|>"
                 "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hi! How can I help?<|END_OF_TURN_TOKEN|>"
                 "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Tell me a joke.<|END_OF_TURN_TOKEN|>"
                 "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");

    /* every family has a rendering and an end-of-turn text (falcon3's is its EOS token only) */
    for (int t = 0; t < HT_CHAT_COUNT; t++) {
        CHECKF(ht_chat_render(t, conv, 4, true, NULL, 0) > 0, "%s", ht_chat_name(t));
        CHECKF(ht_chat_end_of_turn(t) != NULL && (t == HT_CHAT_FALCON3 || ht_chat_end_of_turn(t)[0]), "%s", ht_chat_name(t));
    }
    CHECK(!strcmp(ht_chat_end_of_turn(HT_CHAT_CHATML), "<|im_end|>"));
    CHECK(!strcmp(ht_chat_end_of_turn(HT_CHAT_LLAMA3), "<|eot_id|>"));
    CHECK(!strcmp(ht_chat_end_of_turn(HT_CHAT_GEMMA), "<end_of_turn>"));
}

/* whitespace around contents: the templates that trim (Llama 3's and Gemma's "| trim", Llama 2's
   "content.strip()", Mistral v3 for answers) and those that keep it */
static void test_render_trim(void) {
    const ht_chat_msg m[] = {{"system", "  sys \n"}, {"user", " hi "}, {"assistant", "\n yo  "}, {"user", "q"}};
    check_render(HT_CHAT_CHATML, m + 1, 2, false, "<|im_start|>user\n hi <|im_end|>\n<|im_start|>assistant\n\n yo  <|im_end|>\n");
    check_render(HT_CHAT_LLAMA3, m + 1, 2, false,
                 "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nyo<|eot_id|>");
    check_render(HT_CHAT_GEMMA, m, 4, true,
                 "<start_of_turn>user\nsys\n\nhi<end_of_turn>\n<start_of_turn>model\nyo<end_of_turn>\n"
                 "<start_of_turn>user\nq<end_of_turn>\n<start_of_turn>model\n");
    check_render(HT_CHAT_LLAMA2_SYS_STRIP, m, 4, true,
                 "[INST] <<SYS>>\nsys\n<</SYS>>\n\nhi [/INST]yo</s>[INST] q [/INST]");
    check_render(HT_CHAT_MISTRAL_V3, m + 1, 3, true, "[INST]  hi [/INST] yo</s>[INST] q[/INST]");
    /* gemma without a user turn after the system text, and with an empty one */
    const ht_chat_msg g[] = {{"system", "   "}, {"user", "a"}};
    check_render(HT_CHAT_GEMMA, g, 2, false, "<start_of_turn>user\na<end_of_turn>\n");
}

static void test_render_api(void) {
    char buf[16];
    int64_t full = ht_chat_render(HT_CHAT_CHATML, conv + 1, 1, false, NULL, 0);
    CHECK(full == (int64_t)strlen("<|im_start|>user\nHello<|im_end|>\n"));
    memset(buf, 'x', sizeof buf);
    CHECK(ht_chat_render(HT_CHAT_CHATML, conv + 1, 1, false, buf, sizeof buf) == full);
    CHECK(!strcmp(buf, "<|im_start|>use"));  /* truncated like snprintf, NUL-terminated */
    CHECK(ht_chat_render(HT_CHAT_CHATML, conv, 0, true, buf, sizeof buf) == 22 && !strcmp(buf, "<|im_start|>ass"));
    CHECK(ht_chat_render(HT_CHAT_LLAMA3, NULL, 0, false, buf, sizeof buf) == 0 && buf[0] == 0);
    CHECK(ht_chat_render(HT_CHAT_UNKNOWN, conv, 4, true, buf, sizeof buf) == HR_EINVAL);
    CHECK(ht_chat_render(HT_CHAT_COUNT, conv, 4, true, buf, sizeof buf) == HR_EINVAL);
    const ht_chat_msg bad[] = {{"user", NULL}};
    CHECK(ht_chat_render(HT_CHAT_CHATML, bad, 1, true, buf, sizeof buf) == HR_EINVAL);
    CHECK(ht_chat_render_alloc(HT_CHAT_CHATML, bad, 1, true, NULL) == NULL);
    size_t len = 0;
    char *s = ht_chat_render_alloc(HT_CHAT_LLAMA3, conv, 4, true, &len);
    REQUIRE_VOID(s);
    CHECK(len == strlen(s) && (int64_t)len == ht_chat_render(HT_CHAT_LLAMA3, conv, 4, true, NULL, 0));
    free(s);
}

static void test_names(void) {
    for (int t = 0; t < HT_CHAT_COUNT; t++) {
        CHECKF(ht_chat_from_name(ht_chat_name(t)) == t, "%s", ht_chat_name(t));
        CHECKF(ht_chat_detect(ht_chat_name(t)) == t, "%s", ht_chat_name(t));  /* a name given as the template */
    }
    CHECK(ht_chat_from_name("qwen") == HT_CHAT_CHATML);
    CHECK(ht_chat_from_name("mistral") == HT_CHAT_MISTRAL_V3);
    CHECK(ht_chat_from_name("deepseek-r1") == HT_CHAT_DEEPSEEK3);
    CHECK(ht_chat_from_name("vicuna") == HT_CHAT_UNKNOWN);
    CHECK(ht_chat_from_name(NULL) == HT_CHAT_UNKNOWN);
    CHECK(!strcmp(ht_chat_name(HT_CHAT_UNKNOWN), "unknown"));
    CHECK(!strcmp(ht_chat_name(HT_CHAT_COUNT), "unknown"));
}

/* Short excerpts of the tokenizer.chat_template texts the models ship (enough of each to carry
   what identifies it). */
static void test_detect(void) {
    /* Meta-Llama-3-8B-Instruct */
    CHECK(ht_chat_detect(
              "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
              "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
              "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
              "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
              "{% endif %}") == HT_CHAT_LLAMA3);
    /* Llama 3.1/3.2 Instruct */
    CHECK(ht_chat_detect(
              "{{- bos_token }}\n{%- if not date_string is defined %}\n    {%- set date_string = \"26 Jul 2024\" %}\n"
              "{%- endif %}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
              "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
              "{{- system_message }}\n{{- \"<|eot_id|>\" }}\n") == HT_CHAT_LLAMA3);
    /* Qwen2.5-Instruct */
    CHECK(ht_chat_detect(
              "{%- if messages[0]['role'] == 'system' %}\n    {{- '<|im_start|>system\\n' + messages[0]['content'] + "
              "'<|im_end|>\\n' }}\n{%- else %}\n    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
              "You are a helpful assistant.<|im_end|>\\n' }}\n{%- endif %}\n") == HT_CHAT_CHATML);
    /* SmolLM2-Instruct */
    CHECK(ht_chat_detect(
              "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
              "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
              "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
              "{% endfor %}") == HT_CHAT_CHATML);
    /* Mistral-7B-Instruct-v0.1/v0.2: [INST] without a system role -> llama.cpp's "llama2" */
    CHECK(ht_chat_detect(
              "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
              "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
              "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] "
              "== 'assistant' %}{{ message['content'] + eos_token}}{% endif %}{% endfor %}") == HT_CHAT_LLAMA2);
    /* Mistral-7B-Instruct-v0.3 */
    CHECK(ht_chat_detect(
              "{%- for message in loop_messages %}\n    {%- if message[\"role\"] == \"user\" %}\n"
              "        {%- if tools is not none and (message == user_messages[-1]) %}\n"
              "            {{- \"[AVAILABLE_TOOLS] [\" }}\n"
              "        {%- endif %}\n        {%- if loop.last and system_message is defined %}\n"
              "            {{- \"[INST] \" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n"
              "        {%- else %}\n            {{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}\n"
              "        {%- endif %}\n    {%- elif message[\"role\"] == \"assistant\" %}\n"
              "        {{- \" \" + message[\"content\"]|trim + eos_token}}\n") == HT_CHAT_MISTRAL_V3);
    /* Mistral-Nemo-Instruct-2407 (tekken) */
    CHECK(ht_chat_detect(
              "{%- if tools is not none and (message == user_messages[-1]) %}{{- \"[AVAILABLE_TOOLS][\" }}{%- endif %}"
              "{%- if loop.last and system_message is defined %}{{- \"[INST]\" + system_message + \"\\n\\n\" + "
              "message[\"content\"] + \"[/INST]\" }}{%- else %}{{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}"
              "{%- endif %}") == HT_CHAT_MISTRAL_V3_TEKKEN);
    /* Mistral-Small-24B-Instruct-2501 */
    CHECK(ht_chat_detect(
              "{%- set today = strftime_now(\"%Y-%m-%d\") %}\n{{- bos_token }}\n{{- '[SYSTEM_PROMPT]' + system_message + "
              "'[/SYSTEM_PROMPT]' }}\n{%- for message in loop_messages %}\n    {%- if message['role'] == 'user' %}\n"
              "        {{- '[INST]' + message['content'] + '[/INST]' }}\n") == HT_CHAT_MISTRAL_V7);
    /* Llama-2-7b-chat-hf */
    CHECK(ht_chat_detect(
              "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
              "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
              "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
              "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}")
          == HT_CHAT_LLAMA2_SYS_STRIP);
    /* gemma-2-2b-it */
    CHECK(ht_chat_detect(
              "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
              "{% endif %}{% for message in messages %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
              "{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + "
              "message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}"
              "{{'<start_of_turn>model\\n'}}{% endif %}") == HT_CHAT_GEMMA);
    /* DeepSeek-R1-Distill-Qwen */
    CHECK(ht_chat_detect(
              "{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}{%- if message['role'] == 'user' %}"
              "{{'<\xef\xbd\x9cUser\xef\xbd\x9c>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' %}"
              "{{'<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>' + content + "
              "'<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>'}}{%- endif %}{%- endfor -%}"
              "{% if add_generation_prompt %}{{'<\xef\xbd\x9c" "Assistant\xef\xbd\x9c><think>\\n'}}{% endif %}")
          == HT_CHAT_DEEPSEEK3);
    /* phi-4 */
    CHECK(ht_chat_detect(
              "{% for message in messages %}{% if (message['role'] == 'system') %}{{'<|im_start|>system<|im_sep|>' + "
              "message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>' + "
              "message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}") == HT_CHAT_PHI4);
    /* c4ai-command-r */
    CHECK(ht_chat_detect(
              "{{ bos_token }}{% if system_message != false %}{{ '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + "
              "system_message + '<|END_OF_TURN_TOKEN|>' }}{% endif %}{% if message['role'] == 'user' %}"
              "{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + content.strip() + '<|END_OF_TURN_TOKEN|>' }}")
          == HT_CHAT_COMMAND_R);

    /* not recognised: reported as unknown (the front end then says so and falls back) */
    CHECK(ht_chat_detect(NULL) == HT_CHAT_UNKNOWN);
    CHECK(ht_chat_detect("") == HT_CHAT_UNKNOWN);
    CHECK(ht_chat_detect("{% for message in messages %}{{ message['content'] }}{% endfor %}") == HT_CHAT_UNKNOWN);
    /* vicuna, which hearth does not render */
    CHECK(ht_chat_detect("{% if message['role'] == 'user' %}{{ 'USER: ' + message['content'] + '\\n' }}{% else %}"
                         "{{ 'ASSISTANT: ' + message['content'] + eos_token + '\\n' }}{% endif %}") == HT_CHAT_UNKNOWN);
    /* GLM-Edge and ChatGLM 4 share <|user|>/<|assistant|> with falcon3/zephyr/phi3 but are none of them */
    CHECK(ht_chat_detect("{% for item in messages %}<|{{ item['role'] }}|>\\n{{ item['content'] }}{% endfor %}"
                         "<|user|><|assistant|>") == HT_CHAT_UNKNOWN);
    CHECK(ht_chat_detect("[gMASK]<sop>{% for item in messages %}<|user|>{{ item['content'] }}<|assistant|>"
                         "<|endoftext|>{% endfor %}") == HT_CHAT_UNKNOWN);
    /* a chatml-looking SmolVLM template is not chatml */
    CHECK(ht_chat_detect("<|im_start|>{% for message in messages %}{{ message['content'] }}<end_of_utterance>\\n"
                         "{% endfor %}") == HT_CHAT_UNKNOWN);
}

static gguf_ctx *open_gguf(const char *rel) {
    hr_err err = {0};
    gguf_ctx *g = gguf_open(test_path(g_dir, rel), &err);
    if (!g) fprintf(stderr, "%s: %s\n", rel, err.msg);
    return g;
}

/* the choice for a model: its own template, a forced name, or chatml with a note */
static void test_for_model(void) {
    char note[256];
    gguf_ctx *g = open_gguf("tokenizers/ggml-vocab-phi-3.gguf");  /* ships Phi-3's Jinja template */
    if (g) {
        CHECK(ht_chat_for_model(g, NULL, note, sizeof note) == HT_CHAT_PHI3 && note[0] == 0);
        CHECK(ht_chat_for_model(g, "gemma", note, sizeof note) == HT_CHAT_GEMMA && note[0] == 0);
        CHECK(ht_chat_for_model(g, "no-such-template", note, sizeof note) == HT_CHAT_UNKNOWN);
        gguf_close(g);
    } else CHECK(g);
    g = open_gguf("models/stories260K.gguf");  /* no template */
    REQUIRE_VOID(g);
    CHECK(ht_chat_for_model(g, NULL, note, sizeof note) == HT_CHAT_CHATML);
    CHECKF(strstr(note, "no chat template") && strstr(note, "chatml"), "note: %s", note);
    CHECK(ht_chat_for_model(g, "llama3", note, sizeof note) == HT_CHAT_LLAMA3 && note[0] == 0);
    gguf_close(g);
}

static int32_t *tok(const ht_vocab *v, const char *s, bool bos, bool special, int *n) {
    int need = special ? ht_chat_tokenize(v, s, strlen(s), bos, NULL, 0) : ht_tokenize(v, s, strlen(s), bos, NULL, 0);
    *n = need;
    if (need < 0) return NULL;
    int32_t *ids = malloc(sizeof *ids * (size_t)(need + 1));
    int got = special ? ht_chat_tokenize(v, s, strlen(s), bos, ids, need) : ht_tokenize(v, s, strlen(s), bos, ids, need);
    CHECK(got == need);
    return ids;
}

static int32_t find_token(const ht_vocab *v, const char *text) {
    for (int32_t i = 0; i < ht_vocab_size(v); i++)
        if (!strcmp(ht_token_text(v, i), text)) return i;
    return -1;
}

/* special tokens in a rendered conversation become their ids; the text between them is
   tokenized as plain text, fragment by fragment */
static void test_tokenize(void) {
    hr_err err = {0};
    gguf_ctx *g = open_gguf("tokenizers/ggml-vocab-phi-3.gguf");
    REQUIRE_VOID(g);
    ht_vocab *v = ht_vocab_load(g, &err);
    if (!v) fprintf(stderr, "phi-3: %s\n", err.msg);
    REQUIRE_VOID(v);
    int32_t user = find_token(v, "<|user|>"), end = find_token(v, "<|end|>"), asst = find_token(v, "<|assistant|>");
    REQUIRE_VOID(user >= 0 && end >= 0 && asst >= 0);
    int n, nh;
    int32_t *ids = tok(v, "<|user|>\nHello<|end|>\n<|assistant|>\n", true, true, &n);
    REQUIRE_VOID(ids && n >= 5);
    /* BOS <|user|> ...Hello... <|end|> ... <|assistant|> ...: the markers are single tokens, in order */
    CHECK(ids[0] == ht_token_bos(v) && ids[1] == user);
    int k_end = -1, k_asst = -1;
    for (int k = 2; k < n; k++) {
        if (ids[k] == end && k_end < 0) k_end = k;
        if (ids[k] == asst) k_asst = k;
    }
    CHECKF(k_end > 2 && k_asst > k_end, "<|end|> at %d, <|assistant|> at %d", k_end, k_asst);
    free(ids);
    /* without special tokens it is ht_tokenize; the cap contract is ht_tokenize's */
    int32_t *a = tok(v, "plain text, no markers", true, true, &n), *b = tok(v, "plain text, no markers", true, false, &nh);
    CHECK(a && b && n == nh && !memcmp(a, b, sizeof *a * (size_t)n));
    free(a);
    free(b);
    int32_t small[2];
    CHECK(ht_chat_tokenize(v, "<|user|>\nHi<|end|>", strlen("<|user|>\nHi<|end|>"), false, small, 2) > 2);
    CHECK(small[0] == user);
    /* BOS text at the start: no second BOS */
    ids = tok(v, "<s><|user|>", true, true, &n);
    CHECK(ids && n == 2 && ids[0] == ht_token_bos(v) && ids[1] == user);
    free(ids);
    ids = tok(v, "<|end|><|end|>", false, true, &n);
    CHECK(ids && n == 2 && ids[0] == end && ids[1] == end);
    free(ids);
    CHECK(ht_chat_tokenize(v, "", 0, false, NULL, 0) == 0);
    ht_vocab_free(v);
    gguf_close(g);

    /* stories260K: </s> is its EOS */
    g = open_gguf("models/stories260K.gguf");
    REQUIRE_VOID(g);
    v = ht_vocab_load(g, &err);
    REQUIRE_VOID(v);
    ids = tok(v, "Hi</s>", false, true, &n);
    CHECK(ids && n >= 2 && ids[n - 1] == ht_token_eos(v));
    free(ids);
    ht_vocab_free(v);
    gguf_close(g);
}

/* a stream fed byte by byte: what is shown never contains a stop string nor a part of one that
   then completes, and ends where the first stop string begins */
static void stream(const char *text, const char *const *stops, int n_stops, const char *want_shown, bool want_stop) {
    size_t len = strlen(text), safe = 0, shown = 0;
    bool hit = false;
    for (size_t i = 1; i <= len && !hit; i++) {
        hit = ht_chat_stop_scan(text, i, safe, stops, n_stops, &safe);
        CHECK(safe >= shown && safe <= i);
        shown = safe;
    }
    if (!hit) shown = len;  /* the end of the answer releases what was held back */
    CHECKF(hit == want_stop && shown == strlen(want_shown) && !memcmp(text, want_shown, shown),
           "[%s]: shown [%.*s] hit %d", text, (int)shown, text, hit);
}

static void test_stop(void) {
    const char *s1[] = {"User:"};
    stream("Sure. User: more", s1, 1, "Sure. ", true);
    stream("Use the force", s1, 1, "Use the force", false);
    stream("ends in Use", s1, 1, "ends in Use", false);
    const char *s2[] = {"", "abcd", "c"};
    stream("xxabcd", s2, 3, "xxab", true);  /* "c" completes before "abcd" could */
    const char *s3[] = {"\n\n", "###"};
    stream("one\ntwo\n\nthree", s3, 2, "one\ntwo", true);
    stream("#x##y###", s3, 2, "#x##y", true);
    stream("no stops at all", NULL, 0, "no stops at all", false);
    size_t safe = 99;
    CHECK(!ht_chat_stop_scan("abc", 3, 0, s1, 1, &safe) && safe == 3);
    CHECK(!ht_chat_stop_scan("abcU", 4, 0, s1, 1, &safe) && safe == 3);  /* "U" is held back */
    CHECK(!ht_chat_stop_scan("abcUs", 5, 3, s1, 1, &safe) && safe == 3);
    CHECK(!ht_chat_stop_scan("abcUx", 5, 3, s1, 1, &safe) && safe == 5);
    CHECK(ht_chat_stop_scan("User:", 5, 0, s1, 1, &safe) && safe == 0);
}

int main(void) {
    g_dir = getenv("HEARTH_SHARED") ? getenv("HEARTH_SHARED") : "../shared";
    FILE *f = fopen(test_path(g_dir, "models/stories260K.gguf"), "rb");
    if (f) fclose(f);
    else {
        printf("shared data not found at %s (set HEARTH_SHARED): skipping the tests that need models\n", g_dir);
        g_dir = NULL;
    }
    test_render_families();
    test_render_trim();
    test_render_api();
    test_names();
    test_detect();
    test_stop();
    if (g_dir) {
        test_for_model();
        test_tokenize();
    }
    return test_summary();
}
