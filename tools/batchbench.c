/* batchbench — what a decode step of k sequences costs (issue 27: continuous batching): k sequences,
 * each with a prompt of DEPTH tokens in the cache, advance one token each per hm_eval (one batch of k
 * rows, seq/pos_of set, logits of every row); ms per step, tokens/s (k per step) and the step's cost
 * against k = 1.  The weights are loaded and packed as `hearth run` loads them; one context holds
 * every sequence (n_seq = the largest k).  Steps of each k are interleaved round by round (k = 1, 2,
 * 4, 8, then again) so that a drift of the machine's speed falls on every k; the figure is the median
 * step; "vs k=1" compares with the first k given.
 *
 * usage: batchbench MODEL [-t THREADS] [-k 1,2,4,8] [-n STEPS] [-d DEPTH] [-r ROUNDS]
 */
#include "base/base.h"
#include "gguf/gguf.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BB_MAX_K = 64 };

static int bb_cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const char *path = NULL;
    int threads = 2, steps = 16, depth = 64, rounds = 4, nk = 0, ks[16];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-t") && v) threads = atoi(v), i++;
        else if (!strcmp(a, "-n") && v) steps = atoi(v), i++;
        else if (!strcmp(a, "-d") && v) depth = atoi(v), i++;
        else if (!strcmp(a, "-r") && v) rounds = atoi(v), i++;
        else if (!strcmp(a, "-k") && v) {
            for (char *s = argv[++i], *e; *s && nk < 16; s = *e ? e + 1 : e) ks[nk++] = (int)strtol(s, &e, 10);
        } else if (a[0] != '-' && !path) path = a;
        else {
            fprintf(stderr, "usage: batchbench MODEL [-t THREADS] [-k 1,2,4,8] [-n STEPS] [-d DEPTH] [-r ROUNDS]\n");
            return 2;
        }
    }
    if (!nk) ks[0] = 1, ks[1] = 2, ks[2] = 4, ks[3] = 8, nk = 4;
    int kmax = 0;
    for (int i = 0; i < nk; i++) {
        if (ks[i] < 1 || ks[i] > BB_MAX_K) { fprintf(stderr, "k out of 1..%d\n", BB_MAX_K); return 2; }
        kmax = HR_MAX(kmax, ks[i]);
    }
    if (!path || threads < 1 || steps < 1 || depth < 1 || rounds < 1) { fprintf(stderr, "bad arguments\n"); return 2; }
    hr_err err = {0};
    gguf_ctx *g = gguf_open(path, &err);
    hm_model *m = g ? hm_model_load(g, &err) : NULL;
    hm_shard sh = m ? hm_shard_full(m) : (hm_shard){0};
    uint64_t copied, packed;
    if (!m || hm_model_load_weights(m, &sh, true, &copied, &packed, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    hm_ctx_params p = hm_ctx_default_params();
    p.n_ctx = depth + rounds * steps + 1;
    p.n_seq = kmax;
    p.n_threads = threads;
    p.n_batch = HR_MAX(depth, kmax);
    hm_ctx *c = hm_ctx_create(m, &sh, &p, &err);
    if (!c) { fprintf(stderr, "%s\n", err.msg); return 1; }
    const int V = m->hp.n_vocab;
    float *logits = malloc(sizeof(float) * (size_t)V * (size_t)HR_MAX(kmax, 1));
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)p.n_batch), seq[BB_MAX_K], pos[BB_MAX_K];
    uint8_t want[BB_MAX_K];
    if (!logits || !tok) return 1;
    for (int i = 0; i < p.n_batch; i++) tok[i] = (int32_t)((i * 7919u + 13u) % (unsigned)V);
    /* every sequence's prompt (the cache the steps' attention reads) */
    for (int s = 0; s < kmax; s++) {
        int32_t *sv = malloc(sizeof(int32_t) * (size_t)depth), *pv = malloc(sizeof(int32_t) * (size_t)depth);
        for (int i = 0; i < depth; i++) sv[i] = s, pv[i] = i;
        const hm_batch b = {.tokens = tok, .n = depth, .seq = sv, .pos_of = pv};
        if (hm_eval(c, &b, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
        free(sv), free(pv);
    }
    double *ms = malloc(sizeof(double) * (size_t)nk * rounds * steps);
    int *cnt = calloc((size_t)nk, sizeof(int));
    hm_timings *tm = calloc((size_t)nk, sizeof *tm); /* summed over the steps: where a step's time goes */
    if (!ms || !cnt || !tm) return 1;
    for (int r = 0; r < rounds; r++)
        for (int ki = 0; ki < nk; ki++) {
            const int k = ks[ki];
            for (int st = 0; st < steps; st++) {
                const int32_t at = depth + r * steps + st; /* every round's steps go on from where the last stopped */
                for (int i = 0; i < k; i++) seq[i] = i, pos[i] = at, want[i] = 1;
                const hm_batch b = {.tokens = tok, .n = k, .logits = logits, .seq = seq, .pos_of = pos, .out = want};
                const int64_t t0 = hr_time_ns();
                if (hm_eval(c, &b, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
                ms[(size_t)ki * rounds * steps + cnt[ki]++] = (double)(hr_time_ns() - t0) / 1e6;
                const hm_timings t = hm_ctx_timings(c);
                tm[ki].matmul_ns += t.matmul_ns, tm[ki].attn_ns += t.attn_ns, tm[ki].total_ns += t.total_ns;
            }
        }
    printf("%s: %d threads, depth %d, %d steps x %d rounds per k (median step)\n", path, threads, depth, steps, rounds);
    printf("| k | ms/step | tokens/s | step cost vs k=1 | tokens/s vs k=1 | matmul, attention, other (mean ms) |\n"
           "|---|---|---|---|---|---|\n");
    double base = 0;
    for (int ki = 0; ki < nk; ki++) {
        double *v = ms + (size_t)ki * rounds * steps;
        qsort(v, (size_t)cnt[ki], sizeof *v, bb_cmp);
        const double med = v[cnt[ki] / 2];
        if (ki == 0) base = med;
        const double per = 1e6 * cnt[ki];
        printf("| %d | %.2f | %.1f | %.2fx | %.2fx | %.2f, %.2f, %.2f |\n", ks[ki], med, ks[ki] * 1000.0 / med,
               med / base, (double)ks[ki] / ks[0] * base / med, tm[ki].matmul_ns / per, tm[ki].attn_ns / per,
               (tm[ki].total_ns - tm[ki].matmul_ns - tm[ki].attn_ns) / per);
    }
    free(ms), free(cnt), free(tm), free(logits), free(tok);
    hm_ctx_free(c);
    hm_model_free(m);
    gguf_close(g);
    return 0;
}
