/* ppbench — aggregate decode speed of k sequences over a cluster (issue 27): a head over the given
 * workers (a pipeline with --pp, else tensor parallel) runs k sequences, each with a short prompt,
 * then STEPS decode steps of one token per sequence in one hc_head_eval_batch each; prints, per k,
 * the median step and the aggregate tokens/s.  --micro M splits each step round a pipeline into up to
 * M micro-batches (hc_head_params.pp_micro; 0: one pass).  Run it twice, --micro 0 and --micro M,
 * alternately, to compare (docs/benchmarks.md, issue 27).
 *
 * usage: ppbench MODEL --workers H:P,... [--pp [W,W,...]] [--micro M] [-k 1,2,4,8] [-n STEPS] [-t THREADS]
 */
#include "base/base.h"
#include "cluster/cluster.h"
#include "gguf/gguf.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int pb_cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* "a,b,c" -> v[0..n) (ints), or the workers' addresses (strdup'd) */
static int pb_ints(const char *s, int *v, int cap) {
    int n = 0;
    for (char *e; *s && n < cap; s = *e ? e + 1 : e) v[n++] = (int)strtol(s, &e, 10);
    return n;
}

int main(int argc, char **argv) {
    const char *path = NULL, *workers = NULL, *windows = NULL;
    bool pp = false;
    int micro = 0, steps = 16, threads = 1, nk = 0, ks[16];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--workers") && v) workers = v, i++;
        else if (!strcmp(a, "--pp")) {
            pp = true;
            if (v && v[0] >= '0' && v[0] <= '9') windows = v, i++;
        } else if (!strcmp(a, "--micro") && v) micro = atoi(v), i++;
        else if (!strcmp(a, "-n") && v) steps = atoi(v), i++;
        else if (!strcmp(a, "-t") && v) threads = atoi(v), i++;
        else if (!strcmp(a, "-k") && v) nk = pb_ints(v, ks, 16), i++;
        else if (a[0] != '-' && !path) path = a;
        else {
            fprintf(stderr, "usage: ppbench MODEL --workers H:P,... [--pp [W,W,...]] [--micro M] [-k 1,2,4,8] "
                            "[-n STEPS] [-t THREADS]\n");
            return 2;
        }
    }
    if (!nk) ks[0] = 1, ks[1] = 2, ks[2] = 4, ks[3] = 8, nk = 4;
    int kmax = 1;
    for (int i = 0; i < nk; i++) kmax = HR_MAX(kmax, ks[i]);
    if (!path || !workers || steps < 1 || kmax > 64) { fprintf(stderr, "ppbench: bad arguments\n"); return 2; }
    hr_err err = {0};
    gguf_ctx *g = gguf_open(path, &err);
    hm_model *m = g ? hm_model_load(g, &err) : NULL;
    if (!m) { fprintf(stderr, "%s\n", err.msg); return 1; }
    hc_head_params hp = hc_head_default_params();
    char *list = strdup(workers);
    for (char *s = list, *save = NULL, *t; (t = strtok_r(s, ",", &save)) && hp.n_workers < HC_MAX_DEVICES - 1; s = NULL)
        hp.workers[hp.n_workers++] = t;
    hp.pp = pp;
    hp.pp_micro = micro;
    if (windows) hp.n_windows = pb_ints(windows, hp.layer_windows, HC_MAX_DEVICES);
    enum { PROMPT = 8 };
    hm_ctx_params cp = hm_ctx_default_params();
    cp.n_ctx = PROMPT + steps * nk + 1;
    cp.n_seq = kmax;
    cp.n_batch = HR_MAX(PROMPT, kmax);
    cp.n_threads = threads;
    hc_head *h = hc_head_create(m, &hp, &cp, &err);
    if (!h) { fprintf(stderr, "%s\n", err.msg); return 1; }
    const int V = m->hp.n_vocab;
    float *lg = malloc(sizeof(float) * (size_t)V * kmax);
    double *ms = malloc(sizeof(double) * (size_t)steps);
    int32_t tok[64], seq[64], pos[64], done[64] = {0};
    uint8_t want[64];
    memset(want, 1, sizeof want);
    printf("%s, %d workers, %s%s, micro-batches %d, %d threads\n", path, hp.n_workers, pp ? "pipeline " : "tensor parallel",
           windows ? windows : "", micro, threads);
    printf("| k | ms/step (median of %d) | aggregate tokens/s |\n|---|---|---|\n", steps);
    for (int s = 0; s < kmax; s++) { /* the prompts */
        for (int i = 0; i < PROMPT; i++) tok[i] = (int32_t)((s * 31 + i * 7 + 1) % V), seq[i] = s, pos[i] = i;
        const hm_batch b = {.tokens = tok, .n = PROMPT, .seq = seq, .pos_of = pos, .logits = lg};
        if (hc_head_eval_batch(h, &b, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
        done[s] = PROMPT;
    }
    for (int ki = 0; ki < nk; ki++) {
        const int k = ks[ki];
        for (int st = 0; st < steps; st++) {
            for (int i = 0; i < k; i++) tok[i] = (int32_t)((st * 13 + i) % V), seq[i] = i, pos[i] = done[i];
            const hm_batch b = {.tokens = tok, .n = k, .seq = seq, .pos_of = pos, .out = want, .logits = lg};
            const int64_t t0 = hr_time_ns();
            if (hc_head_eval_batch(h, &b, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
            ms[st] = (double)(hr_time_ns() - t0) / 1e6;
            for (int i = 0; i < k; i++) done[i]++;
        }
        qsort(ms, (size_t)steps, sizeof *ms, pb_cmp);
        printf("| %d | %.1f | %.1f |\n", k, ms[steps / 2], k * 1000.0 / ms[steps / 2]);
        fflush(stdout);
    }
    hc_head_free(h);
    free(lg), free(ms), free(list);
    hm_model_free(m);
    gguf_close(g);
    return 0;
}
