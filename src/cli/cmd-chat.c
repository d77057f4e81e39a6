/* hearth chat: interactive multi-turn chat on a terminal.

   The KV cache outlives the turns. Each turn renders the whole conversation with the chat template,
   tokenizes it, and evaluates only what the cache does not already hold: the tokens after the
   longest common prefix with the cached ones (the earlier turns, and the answer just generated,
   are there already). When the conversation no longer fits the context it is reset to the system
   prompt and the new message. Ctrl-C while an answer streams ends that answer (a SIGINT handler
   sets a flag read between tokens; the partial answer stays in the conversation); Ctrl-C at the
   prompt, Ctrl-D and /exit end the program. Answers go to stdout, notes and figures to stderr. */
#include "cli.h"

#include "engine.h"

#include "gguf/gguf.h"
#include "mem/mem.h"
#include "model/model.h"
#include "quant/quant.h"
#include "text/chat.h"
#include "text/text.h"

#include <errno.h>
#include <signal.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/select.h>
#include <unistd.h>

/* after the options in --help: the commands inside the chat and the templates' names */
static void chat_epilog(FILE *f) {
    fprintf(f, "In the chat:\n"
               "  /help  /stats  /reset  /exit     (see /help)\n"
               "  a line ending in \\ continues on the next line\n"
               "  Ctrl-C stops the answer being written; at the prompt, Ctrl-C or Ctrl-D ends the chat\n\n"
               "Templates: the model's tokenizer.chat_template is recognised by family; without one, or\n"
               "when it is not recognised, chatml is used (and a note says so). Names:\n ");
    for (int t = 0; t < HT_CHAT_COUNT; t++) fprintf(f, " %s", ht_chat_name(t));
    fprintf(f, "\n  (aliases: qwen, mistral = mistral-v3, deepseek-r1 = deepseek3, llama-3)\n");
}

static void help_commands(void) {
    fprintf(stderr,
            "  /stats        prompt tokens evaluated, tokens generated and speed: last turn and session\n"
            "  /reset        forget the conversation (the system prompt stays) and clear the cache\n"
            "  /set n N      most tokens per answer from now on (-1: until end of turn or context full)\n"
            "  /exit         end the chat (also /quit, Ctrl-D, or Ctrl-C at the prompt)\n"
            "  /help         this list\n"
            "  Ctrl-C while an answer is written stops it; a line ending in \\ continues on the next.\n");
}

static volatile sig_atomic_t g_interrupted;
static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

typedef struct chat_msg {
    const char *role;  /* static */
    char       *content;
} chat_msg;

typedef struct turn_stats {
    int64_t prompt, reused, gen;  /* tokens evaluated from the prompt, taken from the cache, generated */
    int64_t pp_ns, tg_ns;
} turn_stats;

typedef struct chat_state {
    const ht_vocab *voc;
    cli_engine     *e;        /* this device, or a cluster (--workers) */
    ht_sampler     *smp;
    int             tmpl;
    int32_t         n_ctx, n_batch;
    long            n_predict;
    bool            ignore_eos;
    const char    **stops;    /* user's stop strings, then the template's end-of-turn text */
    int             n_stops;

    chat_msg *msgs;           /* the conversation; msgs[0] is the system prompt if there is one */
    int       n_msgs, cap_msgs;
    int       n_keep_msgs;    /* what /reset and an overflow keep: the system prompt */

    int32_t *kv;              /* [n_ctx] the tokens whose keys and values are at positions 0..n_kv-1 */
    int32_t  n_kv;
    int32_t *toks;            /* [cap_toks] the rendered conversation, tokenized */
    int      cap_toks;
    float   *logits;          /* [n_vocab] */
    int32_t  n_vocab;

    turn_stats last, total;
    int        turns;
} chat_state;

static int msg_push(chat_state *ch, const char *role, const char *content, size_t len) {
    if (ch->n_msgs == ch->cap_msgs) {
        int cap = ch->cap_msgs ? ch->cap_msgs * 2 : 16;
        chat_msg *nm = realloc(ch->msgs, (size_t)cap * sizeof *nm);
        if (!nm) return HR_ENOMEM;
        ch->msgs = nm;
        ch->cap_msgs = cap;
    }
    char *s = malloc(len + 1);
    if (!s) return HR_ENOMEM;
    memcpy(s, content, len);
    s[len] = 0;
    ch->msgs[ch->n_msgs++] = (chat_msg){role, s};
    return 0;
}

static void msgs_truncate(chat_state *ch, int n) {
    while (ch->n_msgs > n) free(ch->msgs[--ch->n_msgs].content);
}

static void cache_clear(chat_state *ch) {
    ch->n_kv = 0;
}

/* Renders and tokenizes the conversation into ch->toks; returns the token count or a negative code. */
static int render_tokens(chat_state *ch, hr_err *err) {
    ht_chat_msg *view = malloc((size_t)(ch->n_msgs ? ch->n_msgs : 1) * sizeof *view);
    if (!view) return hr_fail(err, HR_ENOMEM, "out of memory");
    for (int i = 0; i < ch->n_msgs; i++) view[i] = (ht_chat_msg){ch->msgs[i].role, ch->msgs[i].content};
    size_t len;
    char *text = ht_chat_render_alloc(ch->tmpl, view, ch->n_msgs, true, &len);
    free(view);
    if (!text) return hr_fail(err, HR_ENOMEM, "out of memory rendering the conversation");
    HR_LOGD("hearth chat: prompt text [%s]", text);
    int n = ht_chat_tokenize(ch->voc, text, len, ht_add_bos(ch->voc), ch->toks, ch->cap_toks);
    if (n > ch->cap_toks) {
        int32_t *nt = realloc(ch->toks, (size_t)n * sizeof *nt);
        if (!nt) { free(text); return hr_fail(err, HR_ENOMEM, "out of memory"); }
        ch->toks = nt;
        ch->cap_toks = n;
        n = ht_chat_tokenize(ch->voc, text, len, ht_add_bos(ch->voc), ch->toks, ch->cap_toks);
    }
    free(text);
    if (n < 0) return hr_fail(err, n, "tokenization failed: %s", hr_strerror(n));
    return n;
}

/* room an answer needs beyond the prompt before the conversation counts as full */
static int32_t answer_room(const chat_state *ch) {
    int32_t quarter = ch->n_ctx / 4;
    return ch->n_predict > 0 ? (int32_t)HR_MIN((long)quarter, ch->n_predict) : quarter;
}

static void out_text(const char *s, size_t n) {
    if (n) { fwrite(s, 1, n, stdout); fflush(stdout); }
}

typedef struct strbuf { char *s; size_t n, cap; } strbuf;
static int sb_append(strbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) return HR_ENOMEM;
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
    return 0;
}

/* One turn: the user's message in, the answer streamed out and added to the conversation.
   Returns 0 (also when the turn was interrupted or the message did not fit) or a negative code
   for errors that end the chat. */
static int chat_turn(chat_state *ch, const char *user, size_t user_len, hr_err *err) {
    int rc = msg_push(ch, "user", user, user_len);
    if (rc) return hr_fail(err, rc, "out of memory");
    int n = render_tokens(ch, err);
    if (n < 0) return n;
    if (n + answer_room(ch) > ch->n_ctx && ch->n_msgs - 1 > ch->n_keep_msgs) {
        /* the conversation is full: start again from the system prompt and this message */
        fprintf(stderr, "[the conversation (%d tokens) no longer fits the context of %d: it is reset%s]\n", n,
                ch->n_ctx, ch->n_keep_msgs ? ", keeping the system prompt" : "");
        chat_msg um = ch->msgs[--ch->n_msgs];
        msgs_truncate(ch, ch->n_keep_msgs);
        ch->msgs[ch->n_msgs++] = um;
        if ((n = render_tokens(ch, err)) < 0) return n;
    }
    if (n >= ch->n_ctx) {
        fprintf(stderr, "[the message is too long: %d tokens with the template, the context holds %d (use -c)]\n", n,
                ch->n_ctx);
        msgs_truncate(ch, ch->n_msgs - 1);
        return 0;
    }
    if (n == 0) { msgs_truncate(ch, ch->n_msgs - 1); return 0; }

    /* a new turn is a new request: workers that left and came back compute it */
    if ((rc = cli_engine_rejoin(ch->e, err))) return rc;
    /* reuse what the cache holds; at least the last token is evaluated, for its logits */
    int32_t keep = 0;
    while (keep < ch->n_kv && keep < n && ch->kv[keep] == ch->toks[keep]) keep++;
    if (keep == n) keep = n - 1;
    ch->n_kv = keep;

    turn_stats st = {.reused = keep};
    int64_t t0 = hr_time_ns();
    for (int32_t i = keep; i < n; i += ch->n_batch) {
        if (g_interrupted) break;
        int nb = (int)HR_MIN(ch->n_batch, n - i);
        if ((rc = cli_engine_eval(ch->e, ch->toks + i, nb, i, ch->logits, false, err)) || (rc = cli_engine_check_logits(ch->logits, (size_t)ch->n_vocab, err)))
            return rc;
        for (int k = 0; k < nb; k++) ht_sampler_accept(ch->smp, ch->toks[i + k]);
        memcpy(ch->kv + i, ch->toks + i, (size_t)nb * sizeof *ch->kv);
        ch->n_kv = i + nb;
        st.prompt += nb;
    }
    int64_t t1 = hr_time_ns();
    st.pp_ns = t1 - t0;
    if (g_interrupted) {
        /* stopped before the answer began: the message is dropped (what was evaluated stays cached) */
        fprintf(stderr, "[interrupted]\n");
        msgs_truncate(ch, ch->n_msgs - 1);
        ch->last = st;
        return 0;
    }

    /* the answer: streamed, holding back text that may be the start of a stop string */
    ht_detok dt;
    ht_detok_init(&dt, ch->voc);
    int piece_cap = ht_detok_max_bytes(ch->voc);
    char *piece = malloc((size_t)piece_cap);
    strbuf ans = {0};
    if (!piece || sb_append(&ans, "", 0)) { free(piece); free(ans.s); return hr_fail(err, HR_ENOMEM, "out of memory"); }
    size_t shown = 0, safe = 0;
    bool stopped = false, interrupted = false, full = false;
    int64_t limit = ch->n_predict < 0 ? INT64_MAX : ch->n_predict;
    while (st.gen < limit) {
        if (g_interrupted) { interrupted = true; break; }
        int32_t tok = ht_sampler_sample(ch->smp, ch->logits);
        ht_sampler_accept(ch->smp, tok);
        if (!ch->ignore_eos && ht_is_eog(ch->voc, tok)) break;
        st.gen++;
        int k = ht_detok_push(&dt, tok, piece, piece_cap);
        if (k > 0 && sb_append(&ans, piece, (size_t)k)) { rc = hr_fail(err, HR_ENOMEM, "out of memory"); break; }
        stopped = ht_chat_stop_scan(ans.s, ans.n, safe, ch->stops, ch->n_stops, &safe);
        out_text(ans.s + shown, safe - shown);
        shown = safe;
        if (stopped || st.gen >= limit) break;
        if (ch->n_kv >= ch->n_ctx) { full = true; break; }
        if ((rc = cli_engine_eval(ch->e, &tok, 1, ch->n_kv, ch->logits, false, err)) || (rc = cli_engine_check_logits(ch->logits, (size_t)ch->n_vocab, err)))
            break;
        ch->kv[ch->n_kv++] = tok;
    }
    free(piece);
    if (rc) { free(ans.s); return rc; }
    if (!stopped) {
        char tail[64];
        int k = ht_detok_flush(&dt, tail, sizeof tail);
        if (k > 0 && sb_append(&ans, tail, (size_t)k)) { free(ans.s); return hr_fail(err, HR_ENOMEM, "out of memory"); }
        stopped = ht_chat_stop_scan(ans.s, ans.n, safe, ch->stops, ch->n_stops, &safe);
        if (!stopped) safe = ans.n;  /* nothing more can complete a stop string: show what was held back */
    }
    out_text(ans.s + shown, safe - shown);
    fputc('\n', stdout);
    fflush(stdout);
    if (interrupted) fprintf(stderr, "[interrupted]\n");
    if (full) fprintf(stderr, "[the context is full: the answer was cut; the next message resets the conversation]\n");
    st.tg_ns = hr_time_ns() - t1;

    rc = msg_push(ch, "assistant", ans.s, safe);
    free(ans.s);
    if (rc) return hr_fail(err, rc, "out of memory");
    ch->last = st;
    ch->total.prompt += st.prompt;
    ch->total.reused += st.reused;
    ch->total.gen += st.gen;
    ch->total.pp_ns += st.pp_ns;
    ch->total.tg_ns += st.tg_ns;
    ch->turns++;
    return 0;
}

static double rate(int64_t n, int64_t ns) { return ns > 0 ? (double)n * 1e9 / (double)ns : 0.0; }

static void print_stats(const chat_state *ch) {
    const turn_stats *l = &ch->last, *t = &ch->total;
    fprintf(stderr,
            "last turn: %lld prompt tokens evaluated (%lld reused from the cache) in %.2f ms (%.1f tok/s); "
            "%lld tokens generated in %.2f ms (%.1f tok/s)\n",
            (long long)l->prompt, (long long)l->reused, l->pp_ns * 1e-6, rate(l->prompt, l->pp_ns),
            (long long)l->gen, l->tg_ns * 1e-6, rate(l->gen, l->tg_ns));
    fprintf(stderr,
            "session: %d turns; %lld prompt tokens evaluated (%.1f tok/s), %lld tokens generated (%.1f tok/s); "
            "context %d of %d tokens in use\n",
            ch->turns, (long long)t->prompt, rate(t->prompt, t->pp_ns), (long long)t->gen, rate(t->gen, t->tg_ns),
            ch->n_kv, ch->n_ctx);
}

/* Input lines, read with read(2) rather than stdio so that waiting for input and Ctrl-C cannot
   race: SIGINT stays blocked while this thread is not generating, and is let in only inside
   pselect, atomically, so a Ctrl-C either ends the wait or is seen before it starts. */
typedef struct line_reader {
    char  *buf;
    size_t n, cap;
    bool   eof;
} line_reader;

/* The next line, without its newline, in *line (malloc'd, NUL-terminated; replaces the previous
   one). Returns its length, -1 at end of input (or on a read error), -2 if Ctrl-C came first. */
static long read_line(line_reader *r, char **line, const sigset_t *waitmask) {
    for (;;) {
        char *nl = r->n ? memchr(r->buf, '\n', r->n) : NULL;
        if (nl || (r->eof && r->n)) {
            size_t len = nl ? (size_t)(nl - r->buf) : r->n;
            char *l = malloc(len + 1);
            if (!l) return -1;
            memcpy(l, r->buf, len);
            l[len] = 0;
            size_t used = nl ? len + 1 : len;
            memmove(r->buf, r->buf + used, r->n - used);
            r->n -= used;
            if (len && l[len - 1] == '\r') l[--len] = 0;
            free(*line);
            *line = l;
            return (long)len;
        }
        if (r->eof) return -1;
        if (g_interrupted) return -2;
        fd_set fds;
        FD_ZERO(&fds);
        FD_SET(STDIN_FILENO, &fds);
        if (pselect(STDIN_FILENO + 1, &fds, NULL, NULL, NULL, waitmask) < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r->n + 4096 > r->cap) {
            size_t cap = r->cap ? r->cap * 2 : 8192;
            char *nb = realloc(r->buf, cap);
            if (!nb) return -1;
            r->buf = nb;
            r->cap = cap;
        }
        ssize_t k = read(STDIN_FILENO, r->buf + r->n, r->cap - r->n);
        if (k < 0 && errno != EINTR && errno != EAGAIN) return -1;
        if (k == 0) r->eof = true;
        if (k > 0) r->n += (size_t)k;
    }
}

/* One message: a line, continued on the next while it ends in a backslash. Same returns. */
static long read_message(line_reader *r, char **msg, const sigset_t *waitmask) {
    strbuf b = {0};
    char *line = NULL;
    for (;;) {
        long k = read_line(r, &line, waitmask);
        if (k < 0) {
            free(line);
            if (k == -1 && b.n) break;  /* a continued message cut by the end of input: take it */
            free(b.s);
            return k;
        }
        bool more = k && line[k - 1] == '\\';
        if (more) line[k - 1] = '\n';
        if (sb_append(&b, line, (size_t)k)) { free(line); free(b.s); return -1; }
        if (!more) break;
        fputs(". ", stdout);
        fflush(stdout);
    }
    free(line);
    if (!b.s && sb_append(&b, "", 0)) return -1;
    free(*msg);
    *msg = b.s;
    return (long)b.n;
}

static bool is_cmd(const char *line, const char *cmd) {
    size_t n = strlen(cmd);
    return !strncmp(line, cmd, n) && (line[n] == 0 || line[n] == ' ');
}

/* the model, its template, the context and the buffers of a chat */
static int chat_setup(chat_state *ch, cli_engine *e, cli_opts *o, hr_err *err) {
    hm_ctx_params cp = cli_ctx_params(o);
    if (cli_engine_open(e, o, true, err)) return err->code;
    char note[256];
    ch->tmpl = ht_chat_for_model(e->g, o->chat_template, note, sizeof note);
    if (note[0]) fprintf(stderr, "hearth chat: %s (--chat-template NAME chooses one)\n", note);
    if (cli_engine_start(e, o, &cp, false, NULL, err)) return err->code;
    ch->e = e;
    ch->voc = e->voc;
    ch->n_ctx = cli_engine_n_ctx(e);
    ch->n_batch = (int32_t)HR_MIN(o->n_batch, (long)ch->n_ctx);
    ch->n_predict = o->n_predict;
    ch->ignore_eos = o->ignore_eos;
    const char *eot = ht_chat_end_of_turn(ch->tmpl);
    if (eot[0]) o->stops[o->n_stops++] = eot;
    ch->stops = o->stops;
    ch->n_stops = o->n_stops;
    int n_vocab = ch->n_vocab = e->m->hp.n_vocab;
    ch->smp = ht_sampler_create(&o->sp, n_vocab);
    ch->kv = malloc((size_t)ch->n_ctx * sizeof *ch->kv);
    ch->logits = malloc((size_t)n_vocab * sizeof *ch->logits);
    if (!ch->smp || !ch->kv || !ch->logits) return hr_fail(err, HR_ENOMEM, "out of memory");
    if (o->system && msg_push(ch, "system", o->system, strlen(o->system))) return hr_fail(err, HR_ENOMEM, "out of memory");
    ch->n_keep_msgs = ch->n_msgs;
    fprintf(stderr, "hearth chat: %s, template %s, context %d tokens, %d threads (%s kernels)\n",
            e->m->hp.name[0] ? e->m->hp.name : e->m->hp.arch_name, ht_chat_name(ch->tmpl), ch->n_ctx,
            (int)(o->threads ? o->threads : hr_physical_cores()), hq_simd_name());
    return 0;
}

/* a line that starts with '/': false for /exit */
static bool chat_command(chat_state *ch, const char *line) {
    if (is_cmd(line, "/exit") || is_cmd(line, "/quit") || is_cmd(line, "/bye")) return false;
    else if (is_cmd(line, "/help") || is_cmd(line, "/?")) help_commands();
    else if (is_cmd(line, "/stats")) print_stats(ch);
    else if (is_cmd(line, "/reset") || is_cmd(line, "/clear")) {
        msgs_truncate(ch, ch->n_keep_msgs);
        cache_clear(ch);
        ht_sampler_reset(ch->smp);
        fprintf(stderr, "[the conversation was reset%s]\n", ch->n_keep_msgs ? " (the system prompt stays)" : "");
    } else if (is_cmd(line, "/set")) {
        long nv;
        if (!strncmp(line, "/set n ", 7) && cli_parse_int("chat", "/set n", line + 7, -1, 1 << 24, &nv)) {
            ch->n_predict = nv;
            fprintf(stderr, "[answers: at most %ld tokens%s]\n", nv, nv < 0 ? " (no limit)" : "");
        } else if (strncmp(line, "/set n ", 7)) fprintf(stderr, "[usage: /set n N]\n");
    } else fprintf(stderr, "[unknown command %s: /help lists them]\n", line);
    return true;
}

/* Reads messages and answers them until /exit, end of input or Ctrl-C at the prompt. SIGINT is
   blocked (sigint) except while an answer is generated and inside read_line's pselect (unblocked). */
static int chat_loop(chat_state *ch, const sigset_t *sigint, const sigset_t *unblocked, hr_err *err) {
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  /* no SA_RESTART: Ctrl-C at the prompt must end the read */
    sigaction(SIGINT, &sa, NULL);
    fprintf(stderr, "Type a message and Enter. /help lists the commands; Ctrl-C stops an answer; Ctrl-D or /exit quits.\n");
    char *line = NULL;
    line_reader reader = {0};
    int rc = 0;
    for (;;) {
        /* a Ctrl-C that came after the answer had ended is not one at the prompt: drop it */
        sigset_t pending;
        int sig;
        if (!sigpending(&pending) && sigismember(&pending, SIGINT)) sigwait(sigint, &sig);
        g_interrupted = 0;
        fputs("> ", stdout);
        fflush(stdout);
        long n = read_message(&reader, &line, unblocked);
        if (n < 0) { fputc('\n', stdout); break; }  /* end of input (-1) or Ctrl-C at the prompt (-2) */
        if (n == 0) continue;
        if (line[0] == '/') {
            if (!chat_command(ch, line)) break;
            continue;
        }
        pthread_sigmask(SIG_SETMASK, unblocked, NULL);
        rc = chat_turn(ch, line, (size_t)n, err);
        pthread_sigmask(SIG_BLOCK, sigint, NULL);
        if (rc < 0) break;
    }
    free(line);
    free(reader.buf);
    return rc < 0 ? rc : 0;
}

static void chat_defaults(cli_opts *o) { o->n_predict = -1; }

static int chat_check(const cli_command *c, cli_opts *o) {
    int rc = cli_check_model(c, o);
    if (!rc) rc = cli_check_cluster(c, o);
    return rc ? rc : cli_check_template(c, o);
}

static int chat(cli_opts *o) {
    /* SIGINT is for this thread only: blocked before the context's pool starts its workers, which keep
       the mask they start with */
    sigset_t sigint, unblocked;
    sigemptyset(&sigint);
    sigaddset(&sigint, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigint, &unblocked);
    sigdelset(&unblocked, SIGINT);
    hr_err err = {0};
    cli_engine e = {0};
    chat_state ch = {0};
    int rc = chat_setup(&ch, &e, o, &err) || chat_loop(&ch, &sigint, &unblocked, &err) ? 1 : 0;
    if (rc) fprintf(stderr, "hearth chat: %s\n", err.msg[0] ? err.msg : "failed");
    msgs_truncate(&ch, 0);
    free(ch.msgs);
    free(ch.kv);
    free(ch.toks);
    free(ch.logits);
    ht_sampler_free(ch.smp);
    cli_engine_close(&e);
    return rc;
}

const cli_command cli_chat = {
    "chat", CLI_CHAT, "chat with a model on the terminal, in its chat template", "-m MODEL [options]",
    "Interactive chat with MODEL on the terminal, in the model's chat template. Earlier turns\n"
    "stay in the KV cache, so each turn processes only the new message. With --workers the model\n"
    "runs on a cluster, as `hearth run` does (the planner's plan unless a plan flag is given).",
    .epilog = chat_epilog, .defaults = chat_defaults, .check = chat_check, .run = chat};
