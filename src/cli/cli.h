/* cli — the `hearth` command: one file per subcommand, each `int cmd_X(int argc, char **argv)`
   returning the process exit code (0 ok, 1 runtime error, 2 usage error). argv[0] is the
   subcommand name. Only this layer prints to stdout or decides to exit. */
#ifndef HEARTH_CLI_H
#define HEARTH_CLI_H

#include "base/base.h"
#include "text/text.h"

int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_worker(int argc, char **argv);

/* shared helpers (cli-util.c) */
/* Parses an integer flag value; prints "hearth CMD: invalid value 'V' for FLAG" and returns false. */
bool cli_parse_int(const char *cmd, const char *flag, const char *v, long min, long max, long *out);
bool cli_parse_float(const char *cmd, const char *flag, const char *v, double min, double max, double *out);
/* Returns argv[++*i] or prints "hearth CMD: FLAG needs a value" and returns NULL. */
const char *cli_value(const char *cmd, int argc, char **argv, int *i);
/* true if stderr is a terminal (progress bars only then) */
bool cli_is_tty(void);
/* A progress bar on stderr, drawn only on a TTY: cli_progress("quantize", done, total). */
void cli_progress(const char *label, uint64_t done, uint64_t total);
void cli_progress_end(void);

/* The sampling flags `run` and `chat` share: --temp, --top-k, --top-p, --min-p, --repeat-penalty,
   --repeat-last-n, -s/--seed. Returns 1 if argv[*i] was one of them (its value parsed into *sp,
   *i advanced), 0 if not, -1 after printing why its value is invalid. */
int cli_sampling_flag(const char *cmd, ht_sampler_params *sp, int argc, char **argv, int *i);
/* Their usage lines, as the commands' --help prints them. */
extern const char cli_sampling_help[];

/* How the weights are held, the flags every command that runs a model shares: --mmap (run them from
   the file mapping, as llama.cpp does by default) and --no-repack (load them in the file's layout).
   Returns 1 if argv[i] was one of them, 0 if not. */
typedef struct cli_weights { bool use_mmap, no_repack; } cli_weights;
int cli_weights_flag(cli_weights *w, char **argv, int i);
extern const char cli_weights_help[];

#endif
