/* main: `hearth COMMAND ...` dispatch */
#include "cli.h"

#include <stdio.h>


static const struct { const char *name; int (*fn)(int, char **); const char *help; } commands[] = {
    {"run", cmd_run, "generate text from a prompt"},
    {"chat", cmd_chat, "chat with a model on the terminal, in its chat template"},
    {"eval", cmd_eval, "write the logits of a token sequence (for comparison with references)"},
    {"bench", cmd_bench, "measure prompt-processing and generation speed"},
    {"info", cmd_info, "describe a GGUF model: architecture, shapes, tensor types, memory"},
    {"synth", cmd_synth, "write a random-weight GGUF model of a given shape"},
    {"quantize", cmd_quantize, "convert a GGUF model's weights to another type"},
    {"tokenize", cmd_tokenize, "print the tokens of a text under a model's vocabulary"},
    {"worker", cmd_worker, "serve tensor-parallel heads: hold a share of a model's weights and compute it"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: hearth COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < HR_ARRAY_LEN(commands); i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n'hearth COMMAND --help' describes each command's options.\n"
               "Environment: HEARTH_LOG=debug|info|warn|error|none sets the log level;\n"
               "             HEARTH_NO_SIMD=1 forces the portable kernels.\n");
}

int main(int argc, char **argv) {
    hr_init();
    if (argc < 2) { usage(stderr); return 2; }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < HR_ARRAY_LEN(commands); i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "hearth: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
