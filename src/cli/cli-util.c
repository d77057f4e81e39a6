/* cli-util: number parsing and progress bars shared by the subcommands */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

bool cli_parse_int(const char *cmd, const char *flag, const char *v, long min, long max, long *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < min || x > max) {
        fprintf(stderr, "hearth %s: invalid value '%s' for %s (expected an integer in [%ld, %ld])\n",
                cmd, v, flag, min, max);
        return false;
    }
    *out = x;
    return true;
}

bool cli_parse_float(const char *cmd, const char *flag, const char *v, double min, double max, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !(x >= min && x <= max)) {
        fprintf(stderr, "hearth %s: invalid value '%s' for %s (expected a number in [%g, %g])\n",
                cmd, v, flag, min, max);
        return false;
    }
    *out = x;
    return true;
}

bool cli_is_tty(void) { return isatty(STDERR_FILENO); }

static int cli_progress_drawn;
void cli_progress(const char *label, uint64_t done, uint64_t total) {
    if (!cli_is_tty() || total == 0) return;
    int width = 40, fill = (int)(done * (uint64_t)width / total);
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '-';
    bar[width] = 0;
    fprintf(stderr, "\r%-12s [%s] %3d%%", label, bar, (int)(done * 100 / total));
    fflush(stderr);
    cli_progress_drawn = 1;
}
void cli_progress_end(void) {
    if (cli_progress_drawn) fputc('\n', stderr);
    cli_progress_drawn = 0;
}
