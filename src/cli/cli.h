/* cli — the `hearth` command: one file per subcommand, each a cli_command (flags.h) whose run step
   returns the process exit code (0 ok, 1 runtime error, 2 usage error); the flags of every command
   are one table (flags.c). Only this layer prints to stdout or decides to exit. */
#ifndef HEARTH_CLI_H
#define HEARTH_CLI_H

#include "base/base.h"
#include "flags.h"

extern const cli_command cli_run, cli_chat, cli_eval, cli_bench, cli_info, cli_synth, cli_quantize, cli_tokenize,
    cli_worker, cli_convert, cli_plan, cli_profile, cli_serve, cli_keygen, cli_workers, cli_perplexity, cli_calibrate;

/* shared helpers (cli-util.c) */
/* Parses an integer flag value; prints "hearth CMD: invalid value 'V' for FLAG" and returns false. */
bool cli_parse_int(const char *cmd, const char *flag, const char *v, long min, long max, long *out);
bool cli_parse_float(const char *cmd, const char *flag, const char *v, double min, double max, double *out);
/* The whole of PATH (NULL: stdin) in a malloc'd, NUL-terminated buffer, at most max bytes: more is an
   error (HR_ERANGE), and so is a PATH that is neither a regular file nor a pipe. NULL on failure. */
char *cli_read_text(const char *path, size_t max, size_t *len, hr_err *err);
/* Escape sequences in typed text, processed in place as llama.cpp does by default: \n \r \t \\ \' \"
   and \xNN; any other backslash stays. Returns the new length. */
size_t cli_unescape(char *s, size_t n);
/* An output file that exists and may not be replaced (no --force): prints "hearth CMD: 'PATH' exists;
   pass --force to overwrite it" and returns true. */
bool cli_output_taken(const char *cmd, const char *path, bool force);
/* true if stderr is a terminal (progress bars only then) */
bool cli_is_tty(void);
/* One device's profile as two or three lines of text (hearth profile, hearth plan). */
struct hpl_device;
void cli_print_device(int i, const char *addr, const struct hpl_device *d);
/* The cluster key's public id (hn_key_id) from --key FILE or the default path, whose name goes to
   path (cap bytes). HR_ENOTFOUND (no key there), HR_EFORMAT, HR_EIO. */
int  cli_key_id(const cli_opts *o, uint8_t id[8], char *path, size_t cap, hr_err *err);
/* --workers auto (cli_main, before the command runs): the workers discovery finds that announce this
   cluster's key become o->head.workers, as if typed. 0, or 1 (printed: no key, nobody answered). */
int  cli_discover_workers(const cli_command *c, cli_opts *o);
/* A progress bar on stderr, drawn only on a TTY: cli_progress("quantize", done, total). */
void cli_progress(const char *label, uint64_t done, uint64_t total);
void cli_progress_end(void);
/* hr_progress's callback (set by main): library steps drawn with cli_progress */
void cli_progress_hook(const char *label, uint64_t done, uint64_t total, void *user);

#endif
