/* cli-util: number parsing and progress bars shared by the subcommands */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

char *cli_read_text(const char *path, size_t max, size_t *len, hr_err *err) {
    FILE *f = path ? fopen(path, "rb") : stdin;
    const char *name = path ? path : "stdin";
    if (!f) { hr_fail(err, HR_EIO, "cannot open '%s': %s", name, strerror(errno)); return NULL; }
    struct stat st;
    /* a directory reads as nothing and /dev/zero as everything: neither is a prompt */
    if (path && (fstat(fileno(f), &st) != 0 || !(S_ISREG(st.st_mode) || S_ISFIFO(st.st_mode)))) {
        hr_fail(err, HR_EINVAL, "'%s' is not a regular file or a pipe", path);
        fclose(f);
        return NULL;
    }
    size_t cap = 4096, n = 0, r;
    char *buf = malloc(cap + 1);
    while (buf && n <= max && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap && n <= max) {
            char *nb = realloc(buf, (cap *= 2) + 1);
            if (!nb) { free(buf); buf = NULL; }
            buf = nb;
        }
    }
    bool bad = buf && ferror(f);
    if (path) fclose(f);
    if (!buf) { hr_fail(err, HR_ENOMEM, "out of memory reading '%s'", name); return NULL; }
    if (bad) { hr_fail(err, HR_EIO, "reading '%s' failed", name); free(buf); return NULL; }
    if (n > max) {
        hr_fail(err, HR_ERANGE, "'%s' holds more than %zu bytes, the most this command reads", name, max);
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* llama.cpp's escapes (common's string_process_escapes), with one difference: NN of \xNN must be two
   hex digits (llama.cpp reads them with strtol, which also takes "+1" or " 1"). */
size_t cli_unescape(char *s, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) { s[o++] = s[i]; continue; }
        char c = s[++i];
        switch (c) {
        case 'n': s[o++] = '\n'; break;
        case 'r': s[o++] = '\r'; break;
        case 't': s[o++] = '\t'; break;
        case '\\': case '\'': case '"': s[o++] = c; break;
        case 'x':
            if (i + 2 < n && hexval(s[i + 1]) >= 0 && hexval(s[i + 2]) >= 0) {
                s[o++] = (char)(hexval(s[i + 1]) * 16 + hexval(s[i + 2]));
                i += 2;
                break;
            }
            /* fall through */
        default: s[o++] = '\\'; s[o++] = c; break;  /* unknown escapes stay as they are */
        }
    }
    return o;
}

bool cli_is_tty(void) { return isatty(STDERR_FILENO); }

static int cli_progress_drawn;
void cli_progress(const char *label, uint64_t done, uint64_t total) {
    static int last_pct = -1;
    if (!cli_is_tty() || total == 0) return;
    const int pct = (int)(done * 100 / total);
    if (cli_progress_drawn && pct == last_pct) return; /* redraw on a change only */
    last_pct = pct;
    int width = 40, fill = (int)(done * (uint64_t)width / total);
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '-';
    bar[width] = 0;
    fprintf(stderr, "\r%-12s [%s] %3d%%", label, bar, pct);
    fflush(stderr);
    cli_progress_drawn = 1;
}
void cli_progress_end(void) {
    if (cli_progress_drawn) fputc('\n', stderr);
    cli_progress_drawn = 0;
}
void cli_progress_hook(const char *label, uint64_t done, uint64_t total, void *user) {
    (void)user;
    cli_progress(label, done, total);
    if (done >= total) cli_progress_end();
}

bool cli_output_taken(const char *cmd, const char *path, bool force) {
    struct stat st;
    if (force || stat(path, &st) != 0) return false;
    fprintf(stderr, "hearth %s: '%s' exists; pass --force to overwrite it\n", cmd, path);
    return true;
}
