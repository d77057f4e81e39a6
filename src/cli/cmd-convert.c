/* hearth convert: a Hugging Face checkpoint directory to a GGUF file (src/convert does the work;
   this file reads the command line and draws the progress bar). */
#include "cli.h"

#include "convert/convert.h"
#include "quant/quant.h"

#include <signal.h>
#include <stdio.h>
#include <strings.h>
#include <sys/stat.h>

static void convert_epilog(FILE *f) {
    fprintf(f, "Architectures: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM.\n"
               "Tokenizers: tokenizer.json BPE, SentencePiece-style (Llama 2, Mistral) or byte-level (Llama 3,\n"
               "Qwen); the chat template comes from tokenizer_config.json or chat_template.jinja.\n"
               "The output is written under a temporary name and renamed when complete: a failure leaves\n"
               "no file. Exit status: 0 ok, 1 the checkpoint could not be read or converted, 2 usage error.\n");
}

static int convert_check(const cli_command *c, cli_opts *o) {
    if (o->n_pos != 2) return cli_usage_error(c, "give HF_DIR and OUT.gguf (see hearth convert --help)");
    struct stat st;
    if (stat(o->pos[0], &st) != 0 || !S_ISDIR(st.st_mode))
        return cli_usage_error(c, "'%s' is not a directory (a Hugging Face checkpoint directory)", o->pos[0]);
    return 0;
}

/* Ctrl-C or SIGTERM: stop writing, so that the writer removes its temporary file and no partial
   output is left behind (a converter of a 70B checkpoint runs for minutes) */
static volatile sig_atomic_t convert_cancel;
static void convert_on_signal(int sig) { convert_cancel = 1; }

static void convert_progress(void *user, uint64_t done, uint64_t total) { cli_progress("convert", done, total); }

static int convert(cli_opts *o) {
    int type = -1;
    if (o->type && strcasecmp(o->type, "auto")) {
        type = hq_type_from_name(o->type);
        if (type != HQ_TYPE_F32 && type != HQ_TYPE_F16 && type != HQ_TYPE_BF16 && type != HQ_TYPE_Q8_0) {
            fprintf(stderr, "hearth convert: --type '%s': one of f32, f16, bf16, q8_0, auto "
                            "(for other types, `hearth quantize` the converted file)\n", o->type);
            return 2;
        }
    }
    hr_err err = {0};
    double t0 = hr_time_s();
    hcv_model *m = hcv_open(o->pos[0], &err);
    if (!m) {
        fprintf(stderr, "hearth convert: %s\n", err.msg);
        return 1;
    }
    struct sigaction sa = {.sa_handler = convert_on_signal}, old_int, old_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    hcv_params p = {.type = type, .overwrite = o->force, .progress = convert_progress, .cancel = &convert_cancel};
    int rc = hcv_write(m, o->pos[1], &p, &err);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    cli_progress_end();
    if (rc) fprintf(stderr, "hearth convert: %s\n", err.msg);
    else
        printf("wrote %s: %s, %lld tensors, %.1f M weights (%.1f s)\n", o->pos[1], hcv_arch(m),
               (long long)hcv_n_tensors(m), hcv_n_elements(m) / 1e6, hr_time_s() - t0);
    hcv_free(m);
    return rc ? 1 : 0;
}

const cli_command cli_convert = {
    "convert", CLI_CONVERT, "convert a Hugging Face checkpoint (safetensors) to GGUF", "HF_DIR OUT.gguf [options]",
    "Reads the checkpoint in HF_DIR (config.json, model.safetensors or the shards of\n"
    "model.safetensors.index.json with F32/F16/BF16 weights, tokenizer.json, tokenizer_config.json)\n"
    "and writes OUT.gguf with llama.cpp's metadata keys and tensor names, one tensor at a time, so\n"
    "memory stays small whatever the model's size. Everything is checked before writing: missing\n"
    "tensors, shapes that disagree with config.json, truncated files, unknown architectures.",
    2, .epilog = convert_epilog, .check = convert_check, .run = convert};
