/* hearth tokenize: the tokens of a text under a model's vocabulary, printed like llama.cpp's
   llama-tokenize (one `ID -> 'piece'` per line, or `[1, 2, 3]` with --ids), so scripts can check
   tokenization. Only the vocabulary is read: vocabulary-only GGUFs work. */
#include "cli.h"

#include "gguf/gguf.h"
#include "text/text.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

static void tokenize_epilog(FILE *f) {
    fprintf(f, "Exit status: 0 ok, 1 the model or text could not be read or tokenized, 2 usage error.\n");
}

enum { TOKENIZE_MAX_BYTES = 64 << 20 };

static int tokenize_check(const cli_command *c, cli_opts *o) {
    if (!o->model) return cli_usage_error(c, "-m MODEL is required");
    if ((o->prompt != NULL) + (o->file != NULL) + o->from_stdin != 1)
        return cli_usage_error(c, "give exactly one of -p TEXT, -f FILE, --stdin");
    return 0;
}

static int tokenize(cli_opts *o) {
    const char *model = o->model, *prompt = o->prompt, *pfile = o->file;
    bool ids_only = o->ids_only, no_bos = o->no_bos, special = o->parse_special;
    bool count = o->show_count;
    int rc = 1;
    hr_err err = { 0 };
    gguf_ctx *g = NULL;
    ht_vocab *voc = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    size_t len = 0;

    if (!(g = gguf_open(model, &err)) || !(voc = ht_vocab_load(g, &err))) {
        fprintf(stderr, "hearth tokenize: %s: %s\n", model, err.msg);
        goto done;
    }
    if (prompt) {
        len = strlen(prompt);  /* its escapes were processed by cli_parse (a file's text is taken as it is) */
        text = malloc(len + 1);
        if (text) memcpy(text, prompt, len + 1);
    } else {
        /* a fixed limit: a text this long would not fit any model's context anyway */
        if (!(text = cli_read_text(pfile, TOKENIZE_MAX_BYTES, &len, &err))) {
            fprintf(stderr, "hearth tokenize: %s\n", err.msg);
            goto done;
        }
    }
    if (!text) { fprintf(stderr, "hearth tokenize: out of memory\n"); goto done; }

    bool bos = ht_add_bos(voc) && !no_bos;
    int n = ht_tokenize_ex(voc, text, len, bos, special, NULL, 0);
    if (n >= 0 && !(ids = malloc(sizeof *ids * (size_t)(n ? n : 1)))) n = HR_ENOMEM;
    if (n >= 0) n = ht_tokenize_ex(voc, text, len, bos, special, ids, n);
    if (n < 0) { fprintf(stderr, "hearth tokenize: tokenizing failed: %s\n", hr_strerror(n)); goto done; }

    if (ids_only) {
        putchar('[');
        for (int i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
        printf("]\n");
    } else {
        int cap = 256;
        char *piece = malloc((size_t)cap);
        for (int i = 0; piece && i < n; i++) {
            int k = ht_token_to_bytes(voc, ids[i], piece, cap);
            if (k > cap) {
                char *np = realloc(piece, (size_t)k);
                if (!np) { free(piece); piece = NULL; break; }
                piece = np;
                cap = k;
                k = ht_token_to_bytes(voc, ids[i], piece, cap);
            }
            const char *p = piece;
            if (k <= 0) {  /* control and unknown tokens print nothing in text: show what they are */
                p = ht_token_text(voc, ids[i]);
                k = (int)strlen(p);
            }
            printf("%6d -> '", ids[i]);
            fwrite(p, 1, (size_t)k, stdout);
            printf("'\n");
        }
        if (!piece) { fprintf(stderr, "hearth tokenize: out of memory\n"); goto done; }
        free(piece);
    }
    if (count) printf("Total number of tokens: %d\n", n);
    rc = fflush(stdout) == 0 ? 0 : 1;

done:
    free(ids);
    free(text);
    ht_vocab_free(voc);
    gguf_close(g);
    return rc;
}

const cli_command cli_tokenize = {
    "tokenize", CLI_TOKENIZE, "print the tokens of a text under a model's vocabulary",
    "-m MODEL (-p TEXT | -f FILE | --stdin) [options]",
    "Tokenizes TEXT with the vocabulary of the GGUF file MODEL (a vocabulary-only file will do) and\n"
    "prints the tokens to stdout, one per line as `ID -> 'piece'` (the piece is the token's text as\n"
    "it prints; control tokens show their own text), like llama.cpp's llama-tokenize.",
    .epilog = tokenize_epilog, .check = tokenize_check, .run = tokenize};
