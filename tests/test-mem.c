// modules: base quant gguf model mem
/* test-mem: the residency manager.
 * - the planner on made-up block sizes: keep vs stream, window shrinking, pins within the budget,
 *   TPI-LLM's every-T-th FFN block, errors for budgets that cannot work;
 * - LIME's online KV adaptation: a budget where every block is pinned while the cache is short and some
 *   must stream once it is full; when a re-plan is due and what it counts; on the models, a manager
 *   re-planned as the positions grow (pins demoted and released) keeps the logits bit-identical;
 * - LIME's allocator (hmem_pin_best) against enumeration on small cases; RUN kept where it is optimal
 *   (blocks of one size), replaced where pinning the large output head frees the window;
 * - /proc/meminfo parsing, the default budget (TESTBED_MEM_LIMIT honoured) (--mem-budget values: test-cli);
 * - on stories260K and the ../shared synth models: budgets of 100%, 50%, 25% of the weights and one
 *   block (window 1) give logits bit-identical to an unmanaged run, and below 100% the manager's
 *   accounting shows it streamed (bytes loaded, blocks released) within its budget;
 * - bad parameters are errors, including a model read from a heap buffer (never MADV_DONTNEED'd). */
#include "test.h"

#include "gguf/gguf.h"
#include "mem/mem.h"
#include "model/model.h"

#include <math.h>

#define MiB (1024ull * 1024ull)

/* ---- planner ------------------------------------------------------------------------------------- */

/* L layers of attention `a` and FFN `f` bytes, then the output head `o` */
static int blocks(int L, uint64_t a, uint64_t f, uint64_t o, uint64_t *bytes, uint8_t *kinds) {
    int n = 0;
    for (int i = 0; i < L; i++) {
        bytes[n] = a; kinds[n++] = HM_BLOCK_ATTN;
        bytes[n] = f; kinds[n++] = HM_BLOCK_FFN;
    }
    bytes[n] = o; kinds[n++] = HM_BLOCK_OUTPUT;
    return n;
}

static void test_plan(void) {
    uint64_t bytes[64];
    uint8_t kinds[64];
    bool pinned[64];
    hmem_plan pl;
    hr_err err = {0};
    int n = blocks(8, 10 * MiB, 30 * MiB, 50 * MiB, bytes, kinds); /* 370 MiB */
    hmem_params p = hmem_default_params();
    p.ctx_bytes = 20 * MiB;

    /* everything fits: keep */
    CHECK(hmem_plan_make(bytes, kinds, n, &p, 390 * MiB, pinned, &pl, &err) == 0);
    CHECK(pl.mode == HMEM_KEEP && pl.weight_bytes == 370 * MiB && pl.largest_bytes == 50 * MiB);
    /* one byte short: stream, with a window of 2 (50 + 30 MiB) and pins in what is left */
    CHECK(hmem_plan_make(bytes, kinds, n, &p, 390 * MiB - 1, pinned, &pl, &err) == 0);
    CHECK(pl.mode == HMEM_STREAM && pl.window == 2);
    CHECK(pl.n_pinned > 0 && pl.pinned_bytes + pl.window_bytes <= 370 * MiB - 1);
    CHECK(pl.stream_bytes == pl.weight_bytes - pl.pinned_bytes);
    /* forced keep and observe ignore the budget */
    p.mode = HMEM_KEEP;
    CHECK(hmem_plan_make(bytes, kinds, n, &p, 1 * MiB, pinned, &pl, &err) == 0 && pl.mode == HMEM_KEEP);
    p.mode = HMEM_OBSERVE;
    CHECK(hmem_plan_make(bytes, kinds, n, &p, 1 * MiB, pinned, &pl, &err) == 0 && pl.mode == HMEM_OBSERVE);
    /* forced stream under a budget that holds everything: all but the window gets pinned */
    p.mode = HMEM_STREAM;
    CHECK(hmem_plan_make(bytes, kinds, n, &p, 1000 * MiB, pinned, &pl, &err) == 0 && pl.mode == HMEM_STREAM);
    CHECK(pl.n_pinned == n);
    p.mode = HMEM_AUTO;

    /* exactly the window: no pins */
    CHECK(hmem_plan_make(bytes, kinds, n, &p, 20 * MiB + 80 * MiB, pinned, &pl, &err) == 0);
    CHECK(pl.mode == HMEM_STREAM && pl.window == 2 && pl.n_pinned == 0 && pl.window_bytes == 80 * MiB);
    /* the window of 2 does not fit: shrunk to 1, and 10 MiB left pins one attention block */
    CHECK(hmem_plan_make(bytes, kinds, n, &p, 20 * MiB + 60 * MiB, pinned, &pl, &err) == 0);
    CHECK(pl.window == 1 && pl.n_pinned == 1 && pl.pinned_bytes == 10 * MiB);
    /* below KV + largest block: an error that says the minimum */
    err.msg[0] = 0;
    CHECK(hmem_plan_make(bytes, kinds, n, &p, 20 * MiB + 50 * MiB - 1, pinned, &pl, &err) == HR_ERANGE);
    CHECK(strstr(err.msg, "at least 70.0 MiB") != NULL);
    CHECK(hmem_plan_make(bytes, kinds, n, &p, 20 * MiB, pinned, &pl, &err) == HR_ERANGE);
    /* the largest block alone, window 1: streams everything */
    p.window = 1;
    CHECK(hmem_plan_make(bytes, kinds, n, &p, 20 * MiB + 50 * MiB, pinned, &pl, &err) == 0);
    CHECK(pl.window == 1 && pl.n_pinned == 0 && pl.stream_bytes == 370 * MiB);
    p.window = 2;

    /* TPI-LLM's retention: FFN blocks only, every T-th. 8 equal FFN blocks, room for 2: T = 4 */
    n = blocks(8, 10 * MiB, 30 * MiB, 10 * MiB, bytes, kinds);
    p.pin = HMEM_PIN_FFN;
    CHECK(hmem_plan_make(bytes, kinds, n, &p, 20 * MiB + 60 * MiB + 60 * MiB, pinned, &pl, &err) == 0);
    CHECK(pl.n_pinned == 2 && pinned[2 * 3 + 1] && pinned[2 * 7 + 1]);
    for (int i = 0; i < n; i++) CHECK(!pinned[i] || kinds[i] == HM_BLOCK_FFN);
    p.pin = HMEM_PIN_NONE;
    CHECK(hmem_plan_make(bytes, kinds, n, &p, 20 * MiB + 60 * MiB + 60 * MiB, pinned, &pl, &err) == 0);
    CHECK(pl.n_pinned == 0);
    /* a run of pins from the first block on (100 MiB: a10 f30 a10 f30 a10, then a10 fills the gap) */
    p.pin = HMEM_PIN_RUN;
    CHECK(hmem_plan_make(bytes, kinds, n, &p, 20 * MiB + 60 * MiB + 100 * MiB, pinned, &pl, &err) == 0);
    CHECK(pl.n_pinned == 6 && pl.pinned_bytes == 100 * MiB);
    for (int i = 0; i < 5; i++) CHECK(pinned[i]);
    CHECK(!pinned[5] && pinned[6]);
    /* spread pins are spread: not all at the start */
    p.pin = HMEM_PIN_SPREAD;
    CHECK(hmem_plan_make(bytes, kinds, n, &p, 20 * MiB + 60 * MiB + 100 * MiB, pinned, &pl, &err) == 0);
    int first_half = 0, second_half = 0;
    for (int i = 0; i < n; i++) {
        if (pinned[i] && i < n / 2) first_half++;
        if (pinned[i] && i >= n / 2) second_half++;
    }
    CHECK(first_half > 0 && second_half > 0);

    /* random shapes: the plan always fits the budget */
    uint64_t rng = 12345;
    int bad = 0;
    for (int t = 0; t < 2000; t++) {
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
        int L = 1 + (int)(rng % 20);
        n = blocks(L, (1 + rng % 7) * MiB, (1 + (rng >> 8) % 23) * MiB, (1 + (rng >> 16) % 40) * MiB, bytes, kinds);
        hmem_params q = hmem_default_params();
        q.ctx_bytes = ((rng >> 24) % 16) * MiB;
        q.window = 1 + (int)((rng >> 30) % 5);
        q.pin = (hmem_pin)((rng >> 34) % HMEM_PIN_COUNT);
        uint64_t budget = q.ctx_bytes + ((rng >> 36) % 600 + 1) * MiB;
        int rc = hmem_plan_make(bytes, kinds, n, &q, budget, pinned, &pl, NULL);
        if (rc == HR_ERANGE) continue;
        if (rc) { bad++; continue; }
        uint64_t pb = 0;
        for (int i = 0; i < n; i++) {
            if (pinned[i]) pb += bytes[i];
            if (pinned[i] && q.pin == HMEM_PIN_NONE) bad++;
            if (pinned[i] && q.pin == HMEM_PIN_FFN && kinds[i] != HM_BLOCK_FFN) bad++;
        }
        if (pl.mode == HMEM_STREAM &&
            (pb != pl.pinned_bytes || pl.window < 1 || pl.window > q.window || pb + pl.window_bytes > budget - q.ctx_bytes))
            bad++;
        if (pl.mode == HMEM_KEEP && pl.weight_bytes + q.ctx_bytes > budget) bad++;
    }
    CHECKF(bad == 0, "%d random plans broke the budget", bad);

    /* bad parameters */
    p = hmem_default_params();
    n = blocks(2, MiB, MiB, MiB, bytes, kinds);
    p.window = 0;
    CHECK(hmem_plan_make(bytes, kinds, n, &p, 100 * MiB, pinned, &pl, &err) == HR_EINVAL);
    p.window = 2;
    CHECK(hmem_plan_make(bytes, kinds, n, &p, 0, pinned, &pl, &err) == HR_EINVAL);
    CHECK(hmem_plan_make(bytes, kinds, 0, &p, 100 * MiB, pinned, &pl, &err) == HR_EINVAL);
    p.pin = (hmem_pin)9;
    CHECK(hmem_plan_make(bytes, kinds, n, &p, 100 * MiB, pinned, &pl, &err) == HR_EINVAL);
    p.pin = HMEM_PIN_SPREAD;
    kinds[0] = 7;
    CHECK(hmem_plan_make(bytes, kinds, n, &p, 100 * MiB, pinned, &pl, &err) == HR_EINVAL);
}

/* the most bytes any pins can hold beside the window (the w largest streamed blocks), by enumeration */
static uint64_t pin_brute(const uint64_t *bytes, int n, int w, uint64_t avail) {
    uint64_t best = 0;
    for (uint32_t set = 0; set < (1u << n); set++) {
        uint64_t pb = 0, top[8] = {0};
        for (int i = 0; i < n; i++) {
            if (set >> i & 1) { pb += bytes[i]; continue; }
            for (int j = 0; j < w; j++) /* keep the w largest streamed ones */
                if (bytes[i] > top[j]) { memmove(top + j + 1, top + j, sizeof *top * (size_t)(w - 1 - j)); top[j] = bytes[i]; break; }
        }
        uint64_t win = 0;
        for (int j = 0; j < w; j++) win += top[j];
        if (pb + win <= avail && pb > best) best = pb;
    }
    return best;
}

/* LIME's allocator: hmem_pin_best against enumeration; where RUN is already optimal (blocks of one
   size) and where it is not (a large output head: pinning it shrinks the window) */
static void test_pin_best(void) {
    uint64_t bytes[40], rng = 777, got = 0;
    uint8_t kinds[40];
    bool pinned[40];
    int bad = 0, cases = 0;
    for (int t = 0; t < 3000; t++) {
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
        int n = 1 + (int)(rng % 12), w = 1 + (int)((rng >> 8) % 3);
        bool few = (rng >> 12) & 1; /* sizes from a few values (classes), or all different */
        uint64_t total = 0, r = rng;
        for (int i = 0; i < n; i++) {
            r ^= r << 13; r ^= r >> 7; r ^= r << 17;
            bytes[i] = few ? (uint64_t)(1 + r % 3) * 10 : 1 + r % 100;
            total += bytes[i];
        }
        uint64_t avail = (rng >> 20) % (total + 20);
        uint64_t want = pin_brute(bytes, n, w, avail);
        int rc = hmem_pin_best(bytes, n, w, avail, pinned, &got);
        /* infeasible even with nothing pinned (the window alone exceeds avail): brute gives 0 too */
        if (rc) { bad += want != 0 || pin_brute(bytes, n, w, UINT64_MAX) == 0; continue; }
        cases++;
        uint64_t pb = 0, top[8] = {0}, win = 0;
        for (int i = 0; i < n; i++) {
            if (pinned[i]) { pb += bytes[i]; continue; }
            for (int j = 0; j < w; j++)
                if (bytes[i] > top[j]) { memmove(top + j + 1, top + j, sizeof *top * (size_t)(w - 1 - j)); top[j] = bytes[i]; break; }
        }
        for (int j = 0; j < w; j++) win += top[j];
        if (got != want || pb != got || pb + win > avail) bad++;
    }
    CHECKF(bad == 0 && cases > 1000, "%d of %d cases differ from enumeration", bad, cases);

    /* blocks of one size: RUN (pins from the first on) is already optimal, and stays */
    hmem_params p = hmem_default_params();
    hmem_plan pl;
    for (int i = 0; i < 20; i++) { bytes[i] = 8 * MiB; kinds[i] = i % 2 ? HM_BLOCK_FFN : HM_BLOCK_ATTN; }
    for (uint64_t b = 16; b <= 160; b += 5) {
        CHECK(hmem_plan_make(bytes, kinds, 20, &p, b * MiB, pinned, &pl, NULL) == 0);
        int run = 0;
        while (run < 20 && pinned[run]) run++;
        CHECKF(pl.mode == HMEM_KEEP || pl.n_pinned == run, "budget %llu MiB: %d pinned, run %d", (unsigned long long)b, pl.n_pinned, run);                                      /* one run from the first block */
        CHECKF(pl.mode == HMEM_KEEP || pl.pinned_bytes == (b * MiB / (8 * MiB) - 2) * 8 * MiB, "budget %llu MiB: %.0f MiB pinned",
               (unsigned long long)b, (double)pl.pinned_bytes / MiB);  /* all but the window's two: the optimum */
    }

    /* the 1B shape (16 layers of 6 + 28 MiB, a 141 MiB output head) at about half its weights: RUN pins
       layers from the first and leaves the head to the window (141 + 28 MiB); pinning the head
       shrinks the window to 2 x 28 MiB, so 113 MiB more stay resident */
    int n = blocks(16, 6 * MiB, 28 * MiB, 141 * MiB, bytes, kinds);
    p.ctx_bytes = 10 * MiB;
    CHECK(hmem_plan_make(bytes, kinds, n, &p, p.ctx_bytes + 330 * MiB, pinned, &pl, NULL) == 0);
    CHECK(pl.mode == HMEM_STREAM && pinned[n - 1]);
    CHECK(pl.window_bytes == 56 * MiB && pl.pinned_bytes + pl.window_bytes <= 330 * MiB);
    CHECK(pl.pinned_bytes >= 330 * MiB - 56 * MiB - 6 * MiB); /* within one attention block of the room */
    CHECK(pinned[0] && pinned[1]);                             /* the layers pinned from the first on */
    /* what RUN alone pins there: 161 MiB (330 - 169 of window), so the best pins stream 113 MiB less */
    CHECK(pl.pinned_bytes >= 161 * MiB + 100 * MiB);
}

/* The KV cache grows into the budget: 370 MiB of weights; a context of 800 positions whose KV cache
   is 16 MiB (2 MiB per 100 positions) beside 4 MiB of scratch */
static void test_plan_kv(void) {
    uint64_t bytes[64];
    uint8_t kinds[64];
    bool pinned[64];
    hmem_plan pl;
    hr_err err = {0};
    int n = blocks(8, 10 * MiB, 30 * MiB, 50 * MiB, bytes, kinds);
    hmem_params p = hmem_default_params();
    p.ctx_bytes = 20 * MiB;
    p.ctx_base_bytes = 4 * MiB;
    p.n_ctx = 800;
    /* the bytes of n positions: the scratch plus n/800 of 16 MiB */
    CHECK(hmem_ctx_bytes_at(&p, 0) == 4 * MiB && hmem_ctx_bytes_at(&p, 400) == 12 * MiB);
    CHECK(hmem_ctx_bytes_at(&p, 800) == 20 * MiB && hmem_ctx_bytes_at(&p, 5000) == 20 * MiB);
    /* steps of 800 / 8 = 100 positions, always beyond the positions in use */
    CHECK(hmem_plan_positions(&p, 0) == 100 && hmem_plan_positions(&p, 99) == 100);
    CHECK(hmem_plan_positions(&p, 100) == 200 && hmem_plan_positions(&p, 799) == 800 && hmem_plan_positions(&p, 900) == 800);

    /* 385 MiB: 370 + 20 does not fit, 370 + 4 + 2 does: every block pinned at first */
    uint64_t budget = 385 * MiB;
    CHECK(hmem_plan_at(bytes, kinds, n, &p, budget, 0, pinned, &pl, &err) == 0);
    CHECK(pl.mode == HMEM_STREAM && pl.n_pinned == n && pl.stream_bytes == 0 && pl.pos_room == 100);
    CHECK(pl.ctx_bytes == 6 * MiB && pl.pinned_bytes + pl.ctx_bytes <= budget);
    /* 370 + 4 + 2 * 5.5 = 385: still everything at 500 positions, and no more at 600 */
    CHECK(hmem_plan_at(bytes, kinds, n, &p, budget, 499, pinned, &pl, &err) == 0);
    CHECK(pl.n_pinned == n && pl.pos_room == 500);
    CHECK(hmem_plan_at(bytes, kinds, n, &p, budget, 500, pinned, &pl, &err) == 0);
    CHECK(pl.pos_room == 600 && pl.n_pinned < n && pl.stream_bytes > 0);
    CHECK(pl.pinned_bytes + pl.window_bytes + pl.ctx_bytes <= budget && pl.ctx_bytes == 16 * MiB);
    /* at the end: the whole cache counts, as the plan that never adapts would count it */
    bool pinned_full[64];
    hmem_plan full;
    CHECK(hmem_plan_at(bytes, kinds, n, &p, budget, 799, pinned, &pl, &err) == 0 && pl.pos_room == 800);
    hmem_params q = p;
    q.n_ctx = 0;
    CHECK(hmem_plan_at(bytes, kinds, n, &q, budget, 799, pinned_full, &full, &err) == 0 && full.pos_room == 0);
    CHECK(pl.ctx_bytes == full.ctx_bytes && pl.n_pinned == full.n_pinned && pl.pinned_bytes == full.pinned_bytes);
    for (int i = 0; i < n; i++) CHECK(pinned[i] == pinned_full[i]);

    /* everything fits even with the whole cache: keep, as before */
    CHECK(hmem_plan_at(bytes, kinds, n, &p, 390 * MiB, 0, pinned, &pl, &err) == 0 && pl.mode == HMEM_KEEP);
    /* a budget that can never hold the whole cache beside the largest block is refused at once */
    CHECK(hmem_plan_at(bytes, kinds, n, &p, 20 * MiB + 50 * MiB - 1, 0, pinned, &pl, &err) == HR_ERANGE);
    /* forced stream adapts too, but keeps the window's room free */
    p.mode = HMEM_STREAM;
    CHECK(hmem_plan_at(bytes, kinds, n, &p, budget, 0, pinned, &pl, &err) == 0);
    CHECK(pl.mode == HMEM_STREAM && pl.pos_room == 100 && pl.n_pinned < n && pl.pinned_bytes + pl.window_bytes <= budget - 6 * MiB);
}

/* ---- system memory and flags --------------------------------------------------------------------- */

static void test_sysmem(void) {
    uint64_t t = 0, a = 0;
    CHECK(hmem_parse_meminfo("MemTotal:       24683656 kB\nMemFree:        22644020 kB\n"
                             "MemAvailable:   23523064 kB\nBuffers:            6752 kB\n", &t, &a) == 0);
    CHECK(t == 24683656ull * 1024 && a == 23523064ull * 1024);
    /* no MemAvailable (old kernels): free + buffers + cached */
    CHECK(hmem_parse_meminfo("MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 10 kB\nCached: 200 kB\n", &t, &a) == 0);
    CHECK(t == 1000 * 1024 && a == 310 * 1024);
    CHECK(hmem_parse_meminfo("MemFree: 100 kB\n", &t, &a) == HR_EFORMAT);
    CHECK(hmem_parse_meminfo("", &t, &a) == HR_EFORMAT);
    CHECK(hmem_parse_meminfo("MemTotal: x kB\n", &t, &a) == HR_EFORMAT);

    hmem_sysmem s;
    hr_err err = {0};
    unsetenv("TESTBED_MEM_LIMIT");
    REQUIRE_VOID(hmem_sysmem_read(&s, &err) == 0);
    CHECK(s.mem_total > 0 && s.mem_available > 0 && s.mem_available <= s.mem_total);
    uint64_t b = hmem_default_budget(&s);
    CHECK(b > 0 && b <= s.mem_available);
    if (s.cgroup_limit) CHECK(b <= s.cgroup_limit);
    printf("memory: total %.0f MiB, available %.0f MiB, cgroup limit %.0f MiB, default budget %.0f MiB\n",
           (double)s.mem_total / MiB, (double)s.mem_available / MiB, (double)s.cgroup_limit / MiB, (double)b / MiB);
    setenv("TESTBED_MEM_LIMIT", "123M", 1);
    CHECK(hmem_sysmem_read(&s, &err) == 0 && s.env_limit == 123 * MiB);
    CHECK(hmem_default_budget(&s) <= 123 * MiB && hmem_default_budget(&s) >= 98 * MiB);
    setenv("TESTBED_MEM_LIMIT", "0", 1);
    CHECK(hmem_sysmem_read(&s, &err) == 0 && s.env_limit == 0);
    unsetenv("TESTBED_MEM_LIMIT");
    CHECK(hmem_proc_read_bytes() >= -1);
}

/* ---- end to end ---------------------------------------------------------------------------------- */

enum { N_TOK = 10, N_PROMPT = 4 };

/* evaluates toks: the first N_PROMPT as one batch, the rest one by one, like a prompt and
   generation; returns the logits of every token (or the last layer's hidden states of every token
   when the shard is not last). h (may be NULL) is attached and sampled per eval. */
static float *run(const hm_model *m, const hm_shard *shard_in, hmem *h, const int32_t *toks, size_t *n_out) {
    hr_err err = {0};
    hm_shard sh = *shard_in;
    if (h) hmem_attach(h, &sh);
    hm_ctx_params cp = hm_ctx_default_params();
    cp.n_ctx = 32;
    cp.n_batch = 8;
    cp.n_threads = 2;
    hm_ctx *c = hm_ctx_create(m, &sh, &cp, &err);
    if (!c) { fprintf(stderr, "%s\n", err.msg); return NULL; }
    size_t row = sh.last ? (size_t)m->hp.n_vocab : (size_t)m->hp.n_embd;
    *n_out = row * N_TOK;
    float *out = calloc(*n_out, sizeof *out);
    for (int i = 0; out && i < N_TOK;) {
        int nb = i == 0 ? N_PROMPT : 1;
        hm_batch b = {.tokens = toks + i, .n = nb, .pos = i};
        if (sh.last) b.logits = out + row * (size_t)i, b.all_logits = true;
        else b.embd_out = out + row * (size_t)i;
        int rc = h ? hmem_set_positions(h, i + nb, &err) : 0;
        if (!rc) rc = hm_eval(c, &b, &err);
        if (rc) { fprintf(stderr, "%s\n", err.msg); free(out); out = NULL; break; }
        if (h) CHECK(hmem_take_sample(h, NULL) == 0);
        i += nb;
    }
    hm_ctx_free(c);
    return out;
}

static uint64_t ctx_bytes(const hm_model *m) {
    hm_ctx_params cp = hm_ctx_default_params();
    cp.n_ctx = 32;
    cp.n_batch = 8;
    cp.n_threads = 2;
    return hm_ctx_bytes_estimate(&m->hp, &cp);
}

typedef struct { const char *label; double frac; int window; hmem_pin pin; hmem_mode mode; bool no_prefetch; } budget_case;

/* the output head's parts (hm_output_parts): rows [0, n_vocab) in order, no gap or overlap, every part but
   the last a whole number of 16-row bands, none larger than the largest layer block (or HM_OUTPUT_PART_MIN)
   when there are several (unless the cap on their number binds),
   and block ranges that are those rows (the norm with part 0) */
static void test_output_parts(const hm_model *m, const char *path) {
    const int np = hm_output_parts(m);
    CHECKF(np >= 1 && np <= HM_OUTPUT_PARTS_MAX, "%s: %d parts", path, np);
    uint64_t big = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        hm_range r[16];
        for (int b = HM_BLOCK_ATTN; b <= HM_BLOCK_FFN; b++) {
            int nr = hm_block_ranges(m, NULL, il, (enum hm_block)b, r, 16);
            uint64_t sum = 0;
            for (int k = 0; k < nr && k < 16; k++) sum += r[k].len;
            big = HR_MAX(big, sum);
        }
    }
    big = HR_MAX(big, HM_OUTPUT_PART_MIN);
    const uint64_t ob = (uint64_t)m->output.row_bytes * (uint64_t)m->output.ne1;
    const bool capped = (ob + big - 1) / big > HM_OUTPUT_PARTS_MAX;
    int64_t at = 0;
    for (int k = 0; k < np; k++) {
        int64_t rows[2];
        hm_output_part_rows(m, k, rows);
        CHECKF(rows[0] == at && rows[1] > rows[0], "%s: part %d rows [%lld, %lld) after %lld", path, k,
               (long long)rows[0], (long long)rows[1], (long long)at);
        CHECK(k == np - 1 || (rows[1] - rows[0]) % 16 == 0);
        hm_range r[4];
        int nr = hm_block_ranges(m, NULL, m->hp.n_layer + k, HM_BLOCK_OUTPUT, r, 4);
        const hm_range *head = &r[nr - 1];
        CHECK(nr == (k == 0 && m->output_norm.data ? 2 : 1));
        CHECK(head->ptr == (const uint8_t *)m->output.map + rows[0] * (int64_t)m->output.row_bytes);
        CHECK(head->len == (size_t)(rows[1] - rows[0]) * m->output.row_bytes);
        if (np > 1 && !capped) CHECKF(head->len <= big + 16 * m->output.row_bytes, "%s: part %d of %zu bytes, block %llu", path, k,
                           head->len, (unsigned long long)big);
        at = rows[1];
    }
    CHECK(at == m->output.ne1);
    CHECK(hm_block_ranges(m, NULL, m->hp.n_layer + np, HM_BLOCK_OUTPUT, NULL, 0) == 0);
    printf("  %-40s output head in %d part(s)\n", strrchr(path, '/') + 1, np);
}

static void test_model(const char *path, bool last) {
    hr_err err = {0};
    gguf_ctx *g = gguf_open(path, &err);
    hm_model *m = g ? hm_model_load(g, &err) : NULL;
    if (!m) { fprintf(stderr, "%s: %s\n", path, err.msg); CHECK(0); gguf_close(g); return; }
    int32_t toks[N_TOK];
    uint64_t rng = 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < N_TOK; i++) {
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
        toks[i] = (int32_t)(rng % (uint64_t)m->hp.n_vocab);
    }
    hm_shard shard = hm_shard_full(m);
    shard.last = last;
    size_t n_ref = 0, n_got = 0;
    float *ref = run(m, &shard, NULL, toks, &n_ref);
    REQUIRE_VOID(ref);

    /* the weights of the shard, as the manager counts them */
    hmem_params p = hmem_default_params();
    p.mode = HMEM_OBSERVE;
    p.ctx_bytes = ctx_bytes(m);
    hmem *h = hmem_create(m, &shard, path, &p, &err);
    REQUIRE_VOID(h);
    uint64_t W = hmem_get_plan(h)->weight_bytes, big = hmem_get_plan(h)->largest_bytes;
    int n_blocks = hmem_get_plan(h)->n_blocks;
    float *got = run(m, &shard, h, toks, &n_got); /* observe: no hook, same numbers */
    CHECK(got && n_got == n_ref && !memcmp(got, ref, n_ref * sizeof *ref));
    free(got);
    hmem_free(h);
    const int n_out = hm_output_parts(m);
    CHECK(n_blocks == 2 * m->hp.n_layer + (last ? n_out : 0));
    test_output_parts(m, path);
    if (last && n_out > 1) /* the "1 block" budget below cannot hold the whole output head beside the ctx */
        CHECKF(big < (uint64_t)m->output.row_bytes * (uint64_t)m->output.ne1, "%s: largest block %llu", path,
               (unsigned long long)big);

    const budget_case cases[] = {
        {"100%", 1.0, 2, HMEM_PIN_RUN, HMEM_AUTO, false},        {"50%", 0.5, 2, HMEM_PIN_RUN, HMEM_AUTO, false},
        {"25%", 0.25, 2, HMEM_PIN_RUN, HMEM_AUTO, false},        {"1 block", 0, 1, HMEM_PIN_RUN, HMEM_AUTO, false},
        {"50% spread", 0.5, 2, HMEM_PIN_SPREAD, HMEM_AUTO, false}, {"50% ffn", 0.5, 3, HMEM_PIN_FFN, HMEM_AUTO, false},
        {"100% stream", 1.0, 2, HMEM_PIN_NONE, HMEM_STREAM, false}, {"25% w=8", 0.25, 8, HMEM_PIN_SPREAD, HMEM_AUTO, false},
        {"50% no prefetch", 0.5, 2, HMEM_PIN_RUN, HMEM_AUTO, true},
    };
    for (size_t ci = 0; ci < HR_ARRAY_LEN(cases); ci++) {
        const budget_case *bc = &cases[ci];
        p = hmem_default_params();
        p.ctx_bytes = ctx_bytes(m);
        p.window = bc->window;
        p.pin = bc->pin;
        p.mode = bc->mode;
        p.prefetch = !bc->no_prefetch;
        uint64_t wb = bc->frac > 0 ? (uint64_t)(bc->frac * (double)W) : big;
        if (wb < big) wb = big; /* a block must fit: 25% of a model with a big output head may not */
        p.budget = p.ctx_bytes + wb;
        h = hmem_create(m, &shard, path, &p, &err);
        if (!h) { fprintf(stderr, "%s %s: %s\n", path, bc->label, err.msg); CHECK(0); continue; }
        const hmem_plan *pl = hmem_get_plan(h);
        got = run(m, &shard, h, toks, &n_got);
        hmem_stats st = hmem_get_stats(h);
        CHECKF(got && n_got == n_ref && !memcmp(got, ref, n_ref * sizeof *ref), "%s %s: outputs differ", path, bc->label);
        int ns = 0;
        const hmem_sample *smp = hmem_samples(h, &ns);
        CHECK(ns == N_TOK - N_PROMPT + 1);
        CHECK(st.kind[HM_BLOCK_ATTN].n_begin == (int64_t)m->hp.n_layer * ns);
        CHECK(st.kind[HM_BLOCK_OUTPUT].n_begin == (last ? (int64_t)n_out * ns : 0));
        bool want_stream = bc->mode == HMEM_STREAM || bc->frac < 1.0;
        CHECKF(pl->mode == (want_stream ? HMEM_STREAM : HMEM_KEEP), "%s %s: mode %s", path, bc->label,
               hmem_mode_name(pl->mode));
        if (pl->mode == HMEM_STREAM) {
            CHECK(pl->window >= 1 && pl->window <= bc->window);
            CHECKF(st.loaded_bytes >= W, "%s %s: loaded %llu of %llu", path,
                   bc->label, (unsigned long long)st.loaded_bytes, (unsigned long long)W);
            CHECK(st.n_loads >= n_blocks);
            CHECK(pl->room_bytes >= pl->window_bytes &&
                  pl->room_bytes + pl->pinned_bytes + p.ctx_bytes + pl->slack_bytes <= p.budget);
            if (pl->stream_bytes > pl->room_bytes) {
                CHECKF(st.n_releases > 0, "%s %s: nothing released", path, bc->label);
                /* every pass loads again what did not stay in the room */
                CHECK(st.loaded_bytes >= W + (uint64_t)(ns - 1) * (pl->stream_bytes - pl->room_bytes));
            } else CHECK(st.n_releases == 0 && st.loaded_bytes == W);
            CHECKF(st.held_peak <= p.budget - p.ctx_bytes, "%s %s: held %llu > %llu", path, bc->label,
                   (unsigned long long)st.held_peak, (unsigned long long)(p.budget - p.ctx_bytes));
            CHECK(st.n_errors == 0);
            if (bc->pin == HMEM_PIN_NONE) CHECK(pl->n_pinned == 0);
            /* without prefetch every streamed block is loaded while compute waits for it */
            if (bc->no_prefetch) CHECK(st.n_waits >= (int64_t)ns * (pl->n_blocks - pl->n_pinned));
        } else {
            CHECK(st.n_loads == 0 && st.n_releases == 0);
        }
        /* streaming may have released everything by the last sample; keeping never does */
        CHECK(ns > 0 && smp[ns - 1].resident <= W && (pl->mode != HMEM_KEEP || smp[ns - 1].resident > 0));
        char line[512];
        hmem_summary(h, line, sizeof line);
        printf("  %-40s %-12s %s\n", strrchr(path, '/') + 1, bc->label, line);
        free(got);
        hmem_free(h);
    }

    /* the KV cache grows into the budget: a made-up cache of N_TOK + 1 positions and 1.2 W bytes,
       beside the real scratch; the budget holds the whole of it and the largest block and nothing
       more, so every block is pinned at first and at the last token, whose plan counts the whole
       cache, only what fits beside the largest block; re-planned at every position */
    p = hmem_default_params();
    p.ctx_base_bytes = ctx_bytes(m);
    p.ctx_bytes = p.ctx_base_bytes + W / 5 * 6;
    p.n_ctx = N_TOK + 1;
    p.budget = p.ctx_bytes + big;
    h = hmem_create(m, &shard, path, &p, &err);
    if (!h) { fprintf(stderr, "%s kv: %s\n", path, err.msg); CHECK(0); }
    else {
        const hmem_plan *pl = hmem_get_plan(h);
        CHECK(pl->mode == HMEM_STREAM && pl->n_pinned == n_blocks && pl->pos_room == 1);
        got = run(m, &shard, h, toks, &n_got);
        hmem_stats st = hmem_get_stats(h);
        CHECKF(got && n_got == n_ref && !memcmp(got, ref, n_ref * sizeof *ref), "%s kv: outputs differ", path);
        /* demoted blocks are released once what streams no longer fits the room — by the loader
           thread, which may still be at it when the last token is out: give it up to 2 s */
        for (int i = 0; i < 200 && st.n_releases == 0 && pl->stream_bytes > pl->room_bytes; i++) {
            usleep(10000);
            st = hmem_get_stats(h);
        }
        CHECKF(st.n_replans >= 2 && pl->pos_room == N_TOK + 1 && pl->n_pinned < n_blocks &&
                   (pl->stream_bytes <= pl->room_bytes || st.n_releases > 0),
               "%s kv: %lld re-plans, room for %d positions, %d pinned, %lld releases", path, (long long)st.n_replans,
               pl->pos_room, pl->n_pinned, (long long)st.n_releases);
        CHECK(pl->pinned_bytes + pl->room_bytes + pl->ctx_bytes + pl->slack_bytes <= p.budget);
        CHECK(st.n_errors == 0);
        free(got);
        hmem_free(h);
    }

    /* bad parameters */
    p = hmem_default_params();
    p.ctx_bytes = ctx_bytes(m);
    p.window = 0;
    CHECK(!hmem_create(m, &shard, path, &p, &err) && err.code == HR_EINVAL);
    p.window = 2;
    p.budget = p.ctx_bytes + big - 1;
    CHECK(!hmem_create(m, &shard, path, &p, &err) && err.code == HR_ERANGE);
    p.budget = 0;
    p.mode = (hmem_mode)42;
    CHECK(!hmem_create(m, &shard, path, &p, &err) && err.code == HR_EINVAL);
    p.mode = HMEM_AUTO;
    CHECK(!hmem_create(m, &shard, "/nonexistent/model.gguf", &p, &err) && err.code == HR_ENOTFOUND);
    CHECK(!hmem_create(NULL, &shard, path, &p, &err) && err.code == HR_EINVAL);
    CHECK(!hmem_create(m, &shard, NULL, &p, &err) && err.code == HR_EINVAL);
    hm_shard bad = shard;
    bad.layer_end = m->hp.n_layer + 1;
    CHECK(!hmem_create(m, &bad, path, &p, &err) && err.code == HR_EINVAL);
    bad = shard;
    bad.layer_end = bad.layer_begin;
    bad.last = false;
    CHECK(!hmem_create(m, &bad, path, &p, &err) && err.code == HR_EINVAL);
    free(ref);
    hm_model_free(m);
    gguf_close(g);
}

/* a model whose bytes are a heap copy (gguf_open_buffer) must never be released: that would zero it */
static void test_not_a_mapping(const char *path, const char *other) {
    size_t size = 0;
    void *buf = test_read_file(path, &size);
    REQUIRE_VOID(buf);
    hr_err err = {0};
    gguf_ctx *g = gguf_open_buffer(buf, size, &err);
    hm_model *m = g ? hm_model_load(g, &err) : NULL;
    if (!m) { fprintf(stderr, "%s\n", err.msg); CHECK(0); }
    else {
        hmem_params p = hmem_default_params();
        p.mode = HMEM_STREAM;
        p.budget = 1ull << 30;
        CHECK(!hmem_create(m, NULL, path, &p, &err) && err.code == HR_EINVAL);
        printf("heap copy refused: %s\n", err.msg);
    }
    hm_model_free(m);
    gguf_close(g);
    free(buf);
    /* the path of another file than the one the model was mapped from */
    g = gguf_open(path, &err);
    m = g ? hm_model_load(g, &err) : NULL;
    REQUIRE_VOID(m);
    hmem_params p = hmem_default_params();
    p.mode = HMEM_STREAM;
    CHECK(!hmem_create(m, NULL, other, &p, &err) && err.code == HR_EINVAL);
    hm_model_free(m);
    gguf_close(g);
}

int main(void) {
    hr_init();
    const char *shared = test_shared_dir();
    test_plan();
    test_plan_kv();
    test_pin_best();
    test_sysmem();
    const char *models[] = {"models/stories260K.gguf", "models/synth/synth-llama-Q4_0.gguf",
                            "models/synth/synth-llama-Q4_K_M-mix.gguf", "models/synth/synth-qwen2-Q8_0.gguf",
                            "models/synth/synth-qwen3-Q4_K_M-mix.gguf", "models/llama-2-tiny-random.gguf"};
    for (size_t i = 0; i < HR_ARRAY_LEN(models); i++) {
        const char *path = test_path(shared, models[i]);
        FILE *f = fopen(path, "rb");
        if (!f) { printf("  (no %s)\n", models[i]); continue; }
        fclose(f);
        test_model(path, true);
    }
    /* a shard that stops before the output head (a pipeline stage): its hidden states */
    test_model(test_path(shared, "models/synth/synth-llama-Q8_0.gguf"), false);
    test_not_a_mapping(test_path(shared, "models/stories260K.gguf"), test_path(shared, "models/synth/synth-llama-Q4_0.gguf"));
    return test_summary();
}
