/* The serve scheduler against a scripted backend of several sequences — the path a multi-sequence
   engine takes (one batch, seq/pos_of/out, hm_kv_seq_copy) — checked where the engine cannot be yet:
   every batch is well formed (within the budget, each sequence's tokens consecutive and continuing its
   cache, a logits row only where a slot needs a token); every request gets the tokens it would get
   alone, whatever runs beside it; a long prompt is read in chunks while others keep generating and a
   short prompt arriving meanwhile gets its first token before the long one; a shared prefix is copied
   from another slot, not computed again; a cancelled request frees its slot. */
#include "test.h"

#include "gguf/gguf.h"
#include "serve/serve-impl.h"
#include "text/text.h"

#include <pthread.h>
#include <unistd.h>

#define NSEQ 4
#define NCTX 256
#define NBATCH 16

/* The scripted model: a sequence's next token is a hash of everything in its cache, so a token that
   landed in the wrong sequence or position, or a prefix copied wrong, changes what follows. */
typedef struct mock {
    int32_t hist[NSEQ][NCTX];
    int32_t len[NSEQ];
    int32_t n_vocab;
    int     steps, copies, copied_tokens, max_n, bad;
    int     gen_rows_with_prompt;   /* steps that held generated tokens and prompt tokens together */
    char    why[256];
} mock;

static int32_t next_of(const int32_t *t, int n, int32_t n_vocab) {
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < n; i++) h = (h ^ (uint64_t)t[i]) * 1099511628211ULL;
    return 3 + (int32_t)(h % (uint64_t)(n_vocab - 3));  /* never BOS/EOS (0..2) */
}

static int mock_eval(void *user, const hm_batch *b, hr_err *err) {
    mock *M = user;
    M->steps++;
    usleep(1000);  /* a step takes time, as an engine's does: requests overlap */
    M->max_n = HR_MAX(M->max_n, b->n);
    if (!b->seq || !b->pos_of || !b->out || b->n > NBATCH) {
        M->bad++;
        snprintf(M->why, sizeof M->why, "batch without seq/pos_of/out or over the budget (%d)", b->n);
        return hr_fail(err, HR_EINVAL, "bad batch");
    }
    float *row = b->logits;
    int single = 0, multi = 0;
    for (int i = 0; i < b->n; i++) {
        int32_t s = b->seq[i], p = b->pos_of[i];
        if (s < 0 || s >= NSEQ || p < 0 || p >= NCTX || p > M->len[s] ||
            (i > 0 && b->seq[i - 1] == s && b->pos_of[i - 1] != p - 1)) {
            M->bad++;
            snprintf(M->why, sizeof M->why, "token %d: seq %d pos %d, cache %d", i, s, p,
                     s >= 0 && s < NSEQ ? M->len[s] : -1);
            return hr_fail(err, HR_EINVAL, "bad batch");
        }
        M->hist[s][p] = b->tokens[i];
        M->len[s] = p + 1;  /* a batch at pos overwrites from pos on */
        bool run1 = (i == 0 || b->seq[i - 1] != s) && (i == b->n - 1 || b->seq[i + 1] != s);
        if (run1) single++; else multi++;
        if (b->out[i]) {
            for (int32_t v = 0; v < M->n_vocab; v++) row[v] = -10.0f;
            row[next_of(M->hist[s], p + 1, M->n_vocab)] = 10.0f;
            row += M->n_vocab;
        }
    }
    if (single && multi) M->gen_rows_with_prompt++;
    return 0;
}

static int mock_copy(void *user, int32_t src, int32_t dst, int32_t n, hr_err *err) {
    mock *M = user;
    if (n > M->len[src]) { M->bad++; return hr_fail(err, HR_EINVAL, "copy beyond the source's cache"); }
    memcpy(M->hist[dst], M->hist[src], (size_t)n * sizeof(int32_t));
    M->len[dst] = n;
    M->copies++;
    M->copied_tokens += n;
    return 0;
}

/* what a request gets alone: its prompt, then n tokens each the hash of all before */
static void expect_alone(const int32_t *prompt, int np, int n, int32_t n_vocab, int32_t *out) {
    int32_t seq[NCTX];
    memcpy(seq, prompt, (size_t)np * sizeof *seq);
    for (int i = 0; i < n; i++) out[i] = seq[np + i] = next_of(seq, np + i, n_vocab);
}

static char *detok_all(const ht_vocab *v, const int32_t *t, int n) {
    ht_detok d;
    ht_detok_init(&d, v);
    int pc = ht_detok_max_bytes(v);
    char *s = malloc((size_t)(n + 1) * (size_t)pc + 1);
    size_t len = 0;
    for (int i = 0; i < n; i++) len += (size_t)ht_detok_push(&d, t[i], s + len, pc);
    len += (size_t)ht_detok_flush(&d, s + len, pc);
    s[len] = 0;
    return s;
}

static hs_req *request(const int32_t *prompt, int np, int n_predict) {
    hs_req *r = hs_req_new();
    r->prompt = malloc((size_t)np * sizeof *r->prompt);
    memcpy(r->prompt, prompt, (size_t)np * sizeof *r->prompt);
    r->n_prompt = np;
    r->n_predict = n_predict;
    r->sp.temp = 0;
    r->ignore_eos = true;
    return r;
}

static void wait_tokens(hs_sched *s, hs_req *r, int n) {
    hs_sched_lock(s);
    while (r->finish == HS_RUNNING && r->n_decoded < n) hs_sched_wait(s, r, 50 * 1000000);
    hs_sched_unlock(s);
}

static void wait_done(hs_sched *s, hs_req *r) {
    hs_sched_lock(s);
    while (r->finish == HS_RUNNING) hs_sched_wait(s, r, 50 * 1000000);
    hs_sched_unlock(s);
}

int main(void) {
    const char *dir = test_shared_dir();
    hr_err err = {0};
    gguf_ctx *g = gguf_open(test_path(dir, "models/stories260K.gguf"), &err);
    REQUIRE(g);
    ht_vocab *voc = ht_vocab_load(g, &err);
    REQUIRE(voc);
    int32_t nv = ht_vocab_size(voc);

    static mock M;
    M.n_vocab = nv;
    hs_backend be = {.user = &M, .n_seq = NSEQ, .n_ctx = NCTX, .n_batch = NBATCH, .n_vocab = nv, .eval = mock_eval,
                     .seq_copy = mock_copy, .kind = "scripted"};
    hs_model_info mi = {.voc = voc, .chat_tmpl = 0, .add_bos = true};
    hs_sched *s = hs_sched_create(&be, &mi, NSEQ, 2, &err);
    REQUIRE(s);

    /* a long prompt (read in chunks of at most NBATCH) beside short ones that generate meanwhile */
    int32_t longp[120], p[6][24];
    for (int i = 0; i < 120; i++) longp[i] = 3 + (i * 7) % (nv - 3);
    for (int k = 0; k < 6; k++)
        for (int i = 0; i < 24; i++) p[k][i] = 3 + (k * 31 + i * 13) % (nv - 3);
    /* p[5] shares p[4]'s first 20 tokens: its prefix is copied from p[4]'s slot */
    memcpy(p[5], p[4], 20 * sizeof(int32_t));
    hs_req *a = request(p[0], 24, 40), *b = request(p[1], 24, 40), *lng = request(longp, 120, 10);
    CHECK(hs_sched_submit(s, a) == 0 && hs_sched_submit(s, b) == 0);
    wait_tokens(s, a, 2);  /* a and b are generating */
    wait_tokens(s, b, 2);
    hs_req *c = request(p[2], 5, 8);
    CHECK(hs_sched_submit(s, lng) == 0);
    CHECK(hs_sched_submit(s, c) == 0);
    wait_done(s, b);
    wait_done(s, lng);
    wait_done(s, c);
    hs_req *all[] = {a, b, lng, c};
    const int32_t *prompts[] = {p[0], p[1], longp, p[2]};
    int nps[] = {24, 24, 120, 5}, nps_pred[] = {40, 40, 10, 8};
    for (int k = 0; k < 4; k++) {
        int32_t want[64];
        expect_alone(prompts[k], nps[k], nps_pred[k], nv, want);
        char *wt = detok_all(voc, want, nps_pred[k]);
        CHECKF(all[k]->finish == HS_LENGTH && all[k]->n_decoded == nps_pred[k], "request %d: finish %d, %d tokens", k,
               all[k]->finish, all[k]->n_decoded);
        CHECKF(all[k]->text && !strcmp(all[k]->text, wt), "request %d: got [%s], alone [%s]", k,
               all[k]->text ? all[k]->text : "(null)", wt);
        free(wt);
    }
    CHECKF(M.bad == 0, "%s", M.why);
    CHECKF(M.max_n <= NBATCH, "a batch of %d tokens, budget %d", M.max_n, NBATCH);
    CHECKF(M.gen_rows_with_prompt > 0, "no step held generated tokens beside prompt chunks");
    /* the short prompt submitted after the long one got its first token before it */
    CHECKF(c->t_first < lng->t_first, "short request's first token at %lld, the long prompt's at %lld",
           (long long)c->t_first, (long long)lng->t_first);

    /* a shared prefix held by a busy slot: copied into the new request's slot, not computed again */
    hs_req *d = request(p[4], 24, 60);
    CHECK(hs_sched_submit(s, d) == 0);
    wait_tokens(s, d, 3);
    int copies0 = M.copies;
    hs_req *e = request(p[5], 24, 6);
    CHECK(hs_sched_submit(s, e) == 0);
    wait_done(s, e);
    wait_done(s, d);
    CHECKF(M.copies > copies0, "no prefix copied (%d copies)", M.copies);
    CHECKF(e->n_cached >= 20, "prefix of 20 shared tokens: %d cached", e->n_cached);
    int32_t want[8];
    expect_alone(p[5], 24, 6, nv, want);
    char *wt = detok_all(voc, want, 6);
    CHECKF(e->text && !strcmp(e->text, wt), "after a prefix copy: got [%s], alone [%s]", e->text ? e->text : "", wt);
    free(wt);

    /* cancel: the request ends and its slot is free; a full queue refuses */
    hs_req *f = request(p[3], 24, -1);
    CHECK(hs_sched_submit(s, f) == 0);
    wait_tokens(s, f, 4);
    hs_sched_cancel(s, f);
    wait_done(s, f);
    CHECK(f->finish == HS_CANCELLED);
    hs_slot_view v[NSEQ];
    bool idle = false;
    for (int i = 0; i < 200 && !idle; i++) {
        int n = hs_sched_slots(s, v, NSEQ);
        idle = true;
        for (int k = 0; k < n; k++) idle &= !v[k].busy;
        if (!idle) usleep(1000);
    }
    CHECK(idle);

    hs_req *reqs[] = {a, b, lng, c, d, e, f};
    for (size_t i = 0; i < HR_ARRAY_LEN(reqs); i++) hs_req_release(s, reqs[i]);
    hs_sched_free(s);
    ht_vocab_free(voc);
    gguf_close(g);
    return test_summary();
}
