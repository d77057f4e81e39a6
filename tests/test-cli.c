/* test-cli: the flag table of the hearth command (src/cli/flags.c).
 * - The table is consistent: every entry complete, no spelling meaning two flags to one command.
 * - Command lines become typed values: numbers in range, switches, repeated --stop, lists (bench),
 *   --mem-budget sizes / auto / off / N%, the cluster flags (--workers split into addresses,
 *   --tp-shares, --layer-windows), positional arguments; -h prints help.
 * - Bad command lines are usage errors (2): unknown flags, a flag of another command, missing values,
 *   values out of range or malformed, too many positional arguments.
 * - --help of every command lists every flag the table gives it. */
#include "test.h"

#include "cli/cli.h"
#include "quant/quant.h"

#include <stdarg.h>
#include <unistd.h>

/* parses a NULL-terminated list of arguments for command c into *o; returns cli_parse's result with
   stderr silenced */
static int parse(const cli_command *c, cli_opts *o, ...) {
    char *argv[32] = {(char *)c->name};
    int argc = 1;
    va_list ap;
    va_start(ap, o);
    for (char *a; (a = va_arg(ap, char *)) && argc < 31;) argv[argc++] = a;
    va_end(ap);
    cli_opts_free(o);
    *o = cli_opts_default();
    if (c->defaults) c->defaults(o);
    fflush(stderr);
    int saved = dup(2);
    FILE *null = freopen("/dev/null", "w", stderr);
    (void)null;
    int rc = cli_parse(c, argc, argv, o);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    return rc;
}

static void check_values(void) {
    cli_opts o = {0};
    CHECK(parse(&cli_run, &o, "-m", "x.gguf", "-p", "hi", "-n", "12", "-t", "3", "-c", "64", "--temp", "0",
                "--top-k", "5", "-s", "7", "--stop", "a", "--stop", "b", "--ignore-eos", "--kv-type", "f32",
                "--no-echo", "--mmap", NULL) == 0);
    CHECK(!strcmp(o.model, "x.gguf") && !strcmp(o.prompt, "hi") && o.n_predict == 12 && o.threads == 3 && o.n_ctx == 64);
    CHECK(o.sp.temp == 0 && o.sp.top_k == 5 && o.sp.seed == 7 && o.ignore_eos && o.no_echo && o.use_mmap);
    CHECK(o.n_stops == 2 && !strcmp(o.stops[0], "a") && !strcmp(o.stops[1], "b") && o.kv_type == HQ_TYPE_F32);
    CHECK(parse(&cli_run, &o, "-s", "-1", "--mmap", "--no-mmap", NULL) == 0 && o.sp.seed == HT_SEED_RANDOM && !o.use_mmap);
    /* defaults that differ by command */
    CHECK(parse(&cli_run, &o, NULL) == 0 && o.n_predict == 256 && o.n_batch == 512 && o.kv_type == HQ_TYPE_F16);
    CHECK(parse(&cli_chat, &o, NULL) == 0 && o.n_predict == -1);
    /* memory */
    CHECK(parse(&cli_run, &o, "--mem-budget", "300M", "--window", "3", "--no-prefetch", NULL) == 0);
    CHECK(o.mem.given && !o.mem.off && o.mem.bytes == 300ull << 20 && o.mem.window == 3 && o.mem.no_prefetch);
    CHECK(parse(&cli_run, &o, "--mem-budget", "1.5G", NULL) == 0 && o.mem.bytes == 1536ull << 20);
    CHECK(parse(&cli_run, &o, "--mem-budget", "off", NULL) == 0 && o.mem.given && o.mem.off);
    CHECK(parse(&cli_run, &o, "--mem-budget", "0", NULL) == 0 && o.mem.off);
    CHECK(parse(&cli_run, &o, "--mem-budget", "auto", NULL) == 0 && o.mem.given && !o.mem.off && o.mem.bytes == 0);
    CHECK(parse(&cli_run, &o, NULL) == 0 && !o.mem.given && o.mem.window == 2);
    CHECK(parse(&cli_bench, &o, "--mem-budget", "50%", "--pin", "ffn", NULL) == 0 && o.mem_pct == 50 &&
          o.pin == HMEM_PIN_FFN);
    /* the cluster */
    CHECK(parse(&cli_run, &o, "--workers", "a:1,b:2,c:3", "--tp-shares", "3,1,2,0.5", "--allreduce", "ring",
                "--timings", NULL) == 0);
    CHECK(o.head.n_workers == 3 && !strcmp(o.head.workers[0], "a:1") && !strcmp(o.head.workers[2], "c:3"));
    CHECK(o.head.n_shares == 4 && o.head.shares[3] == 0.5 && !o.head.shares_auto);
    CHECK(o.head.allreduce == HC_ALLREDUCE_RING && o.head.timings);
    CHECK(parse(&cli_run, &o, "--workers", "a:1", "--tp-shares", "auto", NULL) == 0 && o.head.shares_auto);
    CHECK(parse(&cli_run, &o, "--workers", "a:1", "--pp", "--layer-windows", "2,3", NULL) == 0 && o.head.pp &&
          o.head.n_windows == 2 && o.head.layer_windows[1] == 3);
    /* bench lists, eval tokens, positional arguments */
    CHECK(parse(&cli_bench, &o, "-t", "1,2,4", "-p", "0", "-d", "0,1024", NULL) == 0);
    CHECK(o.bench_threads.n == 3 && o.bench_threads.v[2] == 4 && o.bench_prompt.v[0] == 0 && o.bench_depth.v[1] == 1024);
    CHECK(parse(&cli_bench, &o, NULL) == 0 && o.bench_gen.n == 1 && o.bench_gen.v[0] == 128);
    CHECK(parse(&cli_eval, &o, "--tokens", "1,483,0", NULL) == 0 && o.n_tokens == 3 && o.tokens[1] == 483);
    CHECK(parse(&cli_quantize, &o, "in.gguf", "out.gguf", "Q4_0", "--force", NULL) == 0 && o.n_pos == 3 &&
          !strcmp(o.pos[2], "Q4_0") && o.force);
    CHECK(parse(&cli_synth, &o, "--shape", "custom", "--layers", "2", "--tied", "--seed", "9", NULL) == 0);
    CHECK(o.n_layer == 2 && o.tied == 1 && o.seed == 9 && !strcmp(o.type, "F16"));
    CHECK(parse(&cli_synth, &o, "--n-layer", "3", "--untied", NULL) == 0 && o.n_layer == 3 && o.tied == 0);
    CHECK(parse(&cli_worker, &o, "--listen", "127.0.0.1:0", "--sessions", "2", "--mem-budget", "2M", NULL) == 0);
    CHECK(!strcmp(o.listen, "127.0.0.1:0") && o.sessions == 2 && o.mem.bytes == 2ull << 20);
    CHECK(parse(&cli_run, &o, "-m", "x", "-h", NULL) == CLI_HELP); /* --help printed to stdout */
    cli_opts_free(&o);
}

/* llama.cpp's escapes in -p and --system (cli_unescape), on by default, off with --no-escape */
static void check_escapes(void) {
    cli_opts o = {0};
    CHECK(parse(&cli_run, &o, "-p", "a\\nb\\tc\\\\d\\'e\\\"f\\x41\\x4", NULL) == 0);
    CHECKF(o.prompt && !strcmp(o.prompt, "a\nb\tc\\d'e\"fA\\x4"), "%s", o.prompt ? o.prompt : "(null)");
    CHECK(parse(&cli_run, &o, "-p", "\\q\\", "--no-escape", NULL) == 0 && !strcmp(o.prompt, "\\q\\"));
    CHECK(parse(&cli_run, &o, "-p", "\\q\\x4g\\", NULL) == 0 && !strcmp(o.prompt, "\\q\\x4g\\")); /* unknown: kept */
    CHECK(parse(&cli_chat, &o, "--system", "one\\ntwo", NULL) == 0 && !strcmp(o.system, "one\ntwo"));
    char s[] = "x\\x7e\\X";
    CHECK(cli_unescape(s, strlen(s)) == 4 && !memcmp(s, "x~\\X", 4));
    cli_opts_free(&o);
}

static void check_errors(void) {
    cli_opts o = {0};
    const char *bad[][4] = {
        {"--frobnicate"}, {"-m"}, {"-n", "x"}, {"-n", "-2"}, {"-t", "0"}, {"--top-p", "1.5"}, {"--kv-type", "q8"},
        {"-s", "-5"}, {"--mem-budget", "lots"}, {"--mem-budget", "-5M"}, {"--mem-budget", ""}, {"--mem-budget", "50%"},
        {"--workers", "a:1,,b:2"}, {"--workers", ""}, {"--tp-shares", "1,x"}, {"--tp-shares", "1,-2"},
        {"--tp-shares", "0,0"}, {"--layer-windows", "2,1.5"}, {"--layer-windows", "2,-1"}, {"--layer-windows", "0,0"}, {"--allreduce", "tree"},
        {"--tokens", "1,2"}, {"--listen", "x"}, {"stray"},
        /* llama.cpp's GPU flags are refused, not ignored */
        {"-ngl", "99"}, {"--n-gpu-layers", "99"}, {"-ts", "1,1"}, {"-fa"}, {"-cnv"}, {"-p", "a\\x00b"},
    };
    for (size_t i = 0; i < HR_ARRAY_LEN(bad); i++)
        CHECKF(parse(&cli_run, &o, bad[i][0], bad[i][1], bad[i][2], NULL) == 2, "run %s %s", bad[i][0],
               bad[i][1] ? bad[i][1] : "");
    CHECK(parse(&cli_bench, &o, "-d", "-5", NULL) == 2);
    CHECK(parse(&cli_bench, &o, "-t", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", NULL) == 2);
    CHECK(parse(&cli_eval, &o, "--tokens", "1,x", NULL) == 2 && parse(&cli_eval, &o, "--tokens", "1,", NULL) == 2);
    CHECK(parse(&cli_info, &o, "a.gguf", "b.gguf", NULL) == 2 && parse(&cli_info, &o, "-c", "0", NULL) == 2);
    CHECK(parse(&cli_tokenize, &o, "--temp", "0", NULL) == 2);   /* a flag of another command */
    CHECK(parse(&cli_worker, &o, "--mem-budget", "50%", NULL) == 2);
    cli_opts_free(&o);
}

/* --help of every command names every flag of its own */
static void check_help(void) {
    char why[128] = "";
    CHECKF(cli_table_check(why, sizeof why) == 0, "%s", why);
    const cli_command *cmds[] = {&cli_run, &cli_chat, &cli_eval, &cli_bench, &cli_info, &cli_synth, &cli_quantize,
                                 &cli_tokenize, &cli_worker, &cli_convert};
    const char *expect[][3] = {{"--workers", "--stats-json", "--temp"}, {"--system", "--chat-template", "/reset"},
                               {"--tokens", "--logits", "--force"},     {"--n-depth", "--roofline", "--pin"},
                               {"--json", "--tensors", "-c, --ctx-size"}, {"--shape", "--rope-base", "recipes"},
                               {"--keep-embd", "TYPE", "--threads"},      {"--stdin", "--parse-special", "Exit status"},
                               {"--listen", "--sessions", "--mem-budget"}, {"--type", "--force", "Architectures"}};
    for (size_t i = 0; i < HR_ARRAY_LEN(cmds); i++) {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        REQUIRE_VOID(f);
        cli_usage(cmds[i], f);
        fclose(f);
        CHECKF(strstr(text, "usage: hearth ") && strstr(text, "-h, --help"), "%s", cmds[i]->name);
        for (int k = 0; k < 3; k++) CHECKF(strstr(text, expect[i][k]) != NULL, "%s --help lacks %s", cmds[i]->name, expect[i][k]);
        free(text);
    }
}

int main(void) {
    check_values();
    check_escapes();
    check_errors();
    check_help();
    return test_summary();
}
