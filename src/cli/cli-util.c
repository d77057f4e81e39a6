/* cli-util: flag parsing and progress bars shared by the subcommands */
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

const char *cli_value(const char *cmd, int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "hearth %s: %s needs a value\n", cmd, argv[*i]);
        return NULL;
    }
    return argv[++*i];
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

int cli_weights_flag(cli_weights *w, char **argv, int i) {
    const char *a = argv[i];
    if (!strcmp(a, "--mmap")) w->use_mmap = true;
    else if (!strcmp(a, "--no-mmap")) w->use_mmap = false;
    else if (!strcmp(a, "--no-repack") || !strcmp(a, "-nr")) w->no_repack = true;
    else return 0;
    return 1;
}

const char cli_weights_help[] =
    "  --mmap                  run the weights from the file mapping instead of loading them into memory\n"
    "                          (the default loads them when they fit the memory budget: on some machines a\n"
    "                          mapping streams at half the speed, and Q4_0 (and, with AVX-512, Q4_K, Q5_K\n"
    "                          and Q6_K) is then repacked for the kernels; see --no-repack)\n"
    "  --no-mmap               load the weights into memory (the default when they fit)\n"
    "  -nr, --no-repack        load the weights in the file's layout, not the kernels' packed one\n";

const char cli_sampling_help[] =
    "  --temp X                temperature (default 0.8; 0 = greedy)\n"
    "  --top-k N               top-k sampling (default 40; 0 = off)\n"
    "  --top-p X               top-p sampling (default 0.95; 1 = off)\n"
    "  --min-p X               min-p sampling (default 0.05; 0 = off)\n"
    "  --repeat-penalty X      repetition penalty (default 1.0 = off)\n"
    "  --repeat-last-n N       tokens the penalty looks back over (default 64)\n"
    "  -s, --seed N            sampling seed (default: random)\n";

int cli_sampling_flag(const char *cmd, ht_sampler_params *sp, int argc, char **argv, int *i) {
    const char *a = argv[*i], *v;
    long n;
    double x;
    bool is_int = !strcmp(a, "--top-k") || !strcmp(a, "--repeat-last-n");
    bool is_flt = !strcmp(a, "--temp") || !strcmp(a, "--top-p") || !strcmp(a, "--min-p") || !strcmp(a, "--repeat-penalty");
    bool is_seed = !strcmp(a, "-s") || !strcmp(a, "--seed");
    if (!is_int && !is_flt && !is_seed) return 0;
    if (!(v = cli_value(cmd, argc, argv, i))) return -1;
    if (is_seed) {
        char *end;
        errno = 0;
        long long sd = strtoll(v, &end, 10);
        if (errno || *end || end == v || sd < -1) {
            fprintf(stderr, "hearth %s: invalid seed '%s' (a non-negative integer, or -1 for random)\n", cmd, v);
            return -1;
        }
        sp->seed = sd < 0 ? HT_SEED_RANDOM : (uint64_t)sd;
    } else if (is_int) {
        if (!cli_parse_int(cmd, a, v, 0, 1 << 24, &n)) return -1;
        if (!strcmp(a, "--top-k")) sp->top_k = (int32_t)n;
        else sp->repeat_last_n = (int32_t)n;
    } else {
        bool prob = !strcmp(a, "--top-p") || !strcmp(a, "--min-p");
        if (!cli_parse_float(cmd, a, v, 0, prob ? 1 : 100, &x)) return -1;
        if (!strcmp(a, "--temp")) sp->temp = (float)x;
        else if (!strcmp(a, "--top-p")) sp->top_p = (float)x;
        else if (!strcmp(a, "--min-p")) sp->min_p = (float)x;
        else sp->repeat_penalty = (float)x;
    }
    return 1;
}
