/* main: `hearth COMMAND ...` dispatch */
#include "cli.h"

#include <stdio.h>

static const cli_command *const commands[] = {&cli_run,  &cli_chat,     &cli_eval,     &cli_bench, &cli_info,
                                              &cli_synth, &cli_quantize, &cli_tokenize, &cli_worker,
                                              &cli_convert, &cli_plan, &cli_profile,
                                              &cli_serve, &cli_keygen, &cli_workers, &cli_perplexity, &cli_calibrate};

#ifndef HEARTH_VERSION
#define HEARTH_VERSION "unknown"
#endif
#ifndef HEARTH_COMMIT
#define HEARTH_COMMIT "unknown"
#endif

static void usage(FILE *f) {
    fprintf(f, "usage: hearth COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < HR_ARRAY_LEN(commands); i++)
        fprintf(f, "  %-10s %s\n", commands[i]->name, commands[i]->summary);
    fprintf(f, "\n'hearth COMMAND --help' describes each command's options; 'hearth --version' the build.\n"
               "Environment: HEARTH_LOG=debug|info|warn|error|none sets the log level;\n"
               "             HEARTH_NO_SIMD=1 forces the portable kernels.\n");
}

int main(int argc, char **argv) {
    hr_init();
    hr_progress_set(cli_progress_hook, NULL); /* long library steps (loading weights) get a bar on a TTY */
    if (argc < 2) { usage(stderr); return 2; }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        /* both baked in when the build was configured (CMakeLists.txt) */
        printf("hearth %s (commit %s)\n", HEARTH_VERSION, HEARTH_COMMIT);
        return 0;
    }
    for (size_t i = 0; i < HR_ARRAY_LEN(commands); i++)
        if (!strcmp(argv[1], commands[i]->name)) return cli_main(commands[i], argc - 1, argv + 1);
    fprintf(stderr, "hearth: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
