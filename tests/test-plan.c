/* test-plan — the planner's cost model and solvers on synthetic profiles with known answers: the
   pipeline ILP against enumeration of every window set, the TP min-max shares against a brute-force
   grid, clusters where one device, TP, PP or a hybrid must win (and ones where a hybrid must not; a
   worker-led hybrid where it must win and where it must not), an
   impossible cluster, a single-device cost computed by hand, CPU quotas' bursts, the profile's key/values round trip and
   the cgroup cpu.max parser, the profile
   measuring only the types asked for (the rest from the cache); the residency manager's loader played out on
   layouts worked by hand; HALO's loss-aware placement of unit groups on the paper's own example,
   and the importance file's round trip. */
#include "test.h"

#include "mem/mem.h"
#include "plan/plan.h"
#include "quant/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB (1024.0 * 1024.0)

/* a device whose kernels read every type at `gbps`, with `budget` bytes and a disk of `disk` GB/s */
static hpl_device dev(double gbps, double budget, double disk) {
    hpl_device d = {.n_threads = 1, .mem_bw_gbps = gbps, .disk_gbps = disk, .budget = (uint64_t)budget,
                    .mem_usable = (uint64_t)(budget / 0.8)};
    snprintf(d.name, sizeof d.name, "synthetic %.1f GB/s", gbps);
    d.n_types = 1;
    d.ts[0] = (hpl_type_speed){HQ_TYPE_Q8_0, gbps, gbps * 4, gbps, gbps * 4};
    return d;
}

static void links(hpl_cluster *c, double rtt_ms, double gbps) {
    for (int a = 0; a < c->n; a++)
        for (int b = 0; b < c->n; b++) c->link[a][b] = (hpl_link){.rtt_ms = a == b ? 0 : rtt_ms, .gbps = gbps};
}

/* a model of L layers of `layer` bytes of Q8_0, an output head of `out` bytes, KV `kv` bytes per layer */
static hpl_model model(int L, double layer, double out, double kv) {
    hpl_model m = {.n_layer = L, .n_embd = 2048, .n_vocab = 32000, .n_ctx = 1024, .n_batch = 512, .n_types = 1,
                   .layer_bytes = layer, .block_max_bytes = layer * 2 / 3, .attn_bytes = layer / 3,
                   .ffn_bytes = layer * 2 / 3, .out_type = HQ_TYPE_Q8_0,
                   .out_bytes = out, .kv_bytes_per_layer = kv, .scratch_bytes = 8 * MIB};
    m.type[0] = HQ_TYPE_Q8_0;
    m.layer_bytes_of[0] = layer;
    snprintf(m.name, sizeof m.name, "synthetic");
    return m;
}

/* ---- the ILP against enumeration ------------------------------------------------------------------------ */
static void test_ilp_enumerate(void) {
    hpl_cluster c = {.n = 3};
    /* the head is fast with little memory, worker 1 slow with plenty, worker 2 medium with a slow disk */
    c.dev[0] = dev(8, 200 * MIB, 1.0);
    c.dev[1] = dev(3, 2000 * MIB, 0.5);
    c.dev[2] = dev(5, 300 * MIB, 0.2);
    links(&c, 1.0, 0.1);
    hpl_model m = model(12, 60 * MIB, 50 * MIB, 2 * MIB);
    for (int k = 1; k <= 4; k++) {
        hpl_plan p = {.kind = HPL_PP, .n = 3, .dev = {0, 1, 2}};
        double best = INFINITY;
        int w[3], bw[3] = {0};
        for (w[0] = 0; w[0] <= 12; w[0]++)
            for (w[1] = 1; w[1] <= 12; w[1]++)
                for (w[2] = 1; w[2] <= 12; w[2]++) {
                    memcpy(p.window, w, sizeof w);
                    double o = hpl_pp_objective(&c, &m, &p, k);
                    if (o >= 0 && o < best) { best = o; memcpy(bw, w, sizeof w); }
                }
        double obj = -1;
        hr_err err = {0};
        int rc = hpl_solve_pp_trips(&c, &m, &p, k, &obj, &err);
        if (!isfinite(best)) { CHECKF(rc != 0, "k=%d: no window set is valid, the solver found one", k); continue; }
        CHECKF(rc == 0, "k=%d: %s", k, err.msg);
        CHECKF(fabs(obj - best) <= 1e-6 * best, "k=%d: ILP %.6f, enumeration %.6f (%d,%d,%d)", k, obj, best, bw[0], bw[1], bw[2]);
        double again = hpl_pp_objective(&c, &m, &p, k);
        CHECKF(fabs(again - best) <= 1e-6 * best, "k=%d: the solver's windows %d,%d,%d evaluate to %.6f, not %.6f", k,
               p.window[0], p.window[1], p.window[2], again, best);
    }
}

/* ---- min-max against a grid ----------------------------------------------------------------------------- */
static void test_minmax_brute(void) {
    hpl_cluster c = {.n = 3};
    c.dev[0] = dev(6, 4000 * MIB, 1.0);
    c.dev[1] = dev(2, 4000 * MIB, 1.0);
    c.dev[2] = dev(9, 150 * MIB, 0.3); /* fast, but streams beyond ~130 MiB of layers */
    links(&c, 0.1, 1.0);
    hpl_model m = model(16, 40 * MIB, 30 * MIB, 1 * MIB);
    hpl_plan p = {.kind = HPL_TP, .n = 3, .dev = {0, 1, 2}};
    hr_err err = {0};
    CHECKF(hpl_solve_tp(&c, &m, &p, &err) == 0, "%s", err.msg);
    double solved = hpl_tp_objective(&c, &m, &p, p.share);
    CHECK(fabs(p.share[0] + p.share[1] + p.share[2] - 1) < 1e-9);
    const int N = 200;
    double best = INFINITY, x[3];
    for (int a = 0; a <= N; a++)
        for (int b = 0; a + b <= N; b++) {
            x[0] = (double)a / N;
            x[1] = (double)b / N;
            x[2] = 1 - x[0] - x[1];
            best = HR_MIN(best, hpl_tp_objective(&c, &m, &p, x));
        }
    /* the continuous optimum is no worse than any grid point, and a grid point is within one step of it */
    CHECKF(solved <= best * (1 + 1e-6), "min-max %.4f ms, grid best %.4f ms", solved, best);
    CHECKF(best <= solved * 1.03, "grid best %.4f ms far above min-max %.4f ms", best, solved);
    /* the fast device's memory binds: it gets less than its speed's share */
    CHECKF(p.share[2] < 9.0 / 17, "share of the memory-bound device %.3f", p.share[2]);
}

/* ---- who must win ----------------------------------------------------------------------------------------- */
static int choose(const hpl_cluster *c, const hpl_model *m, hpl_choice *ch) {
    hr_err err = {0};
    int rc = hpl_choose(c, m, 128, ch, &err);
    CHECKF(rc == 0, "%s", err.msg);
    return ch->chosen >= 0 ? ch->cand[ch->chosen].kind : -1;
}

static void test_winners(void) {
    static hpl_choice ch;
    /* one device: a small model, links of 5 ms: any split waits longer than it computes */
    hpl_cluster c = {.n = 3};
    for (int i = 0; i < 3; i++) c.dev[i] = dev(5, 4000 * MIB, 1.0);
    links(&c, 5.0, 0.1);
    hpl_model small = model(16, 4 * MIB, 10 * MIB, 0.1 * MIB);
    CHECKF(choose(&c, &small, &ch) == HPL_SINGLE, "small model, slow links: %s", ch.why);

    /* tensor parallel: a big model that fits everywhere, links of 0.02 ms: splitting every layer wins */
    links(&c, 0.02, 1.0);
    hpl_model big = model(16, 100 * MIB, 100 * MIB, 1 * MIB);
    int k = choose(&c, &big, &ch);
    CHECKF(k == HPL_TP && ch.cand[ch.chosen].n == 3, "fast links: %s", ch.why);

    /* pipeline: the model exceeds each device's budget but not their sum, the disks are slow and the
       links 5 ms: TP would pay 2L round trips, one device would stream from its slow disk */
    for (int i = 0; i < 3; i++) c.dev[i] = dev(5, 230 * MIB, 0.05);
    links(&c, 5.0, 0.1);
    hpl_model mid = model(16, 30 * MIB, 50 * MIB, 1 * MIB);
    k = choose(&c, &mid, &ch);
    CHECKF(k == HPL_PP && ch.cand[ch.chosen].n == 3, "memory-bound, slow links: %s", ch.why);
    /* and the chosen windows keep every device within its budget */
    const hpl_plan *p = &ch.cand[ch.chosen];
    for (int i = 0; i < p->n; i++)
        CHECKF(p->dc[i].stream_bytes == 0 && p->dc[i].mem_bytes <= p->dc[i].budget, "device %d: %.0f MiB streamed",
               i, p->dc[i].stream_bytes / MIB);

    /* impossible: the KV cache at the context length exceeds every budget */
    hpl_model kv = model(16, 10 * MIB, 10 * MIB, 200 * MIB);
    CHECK(choose(&c, &kv, &ch) == -1);
    CHECKF(strstr(ch.why, "shorter context") != NULL, "%s", ch.why);
}

/* ---- hybrid: where it must win, and where it must not ------------------------------------------------------ */
static void test_hybrid(void) {
    static hpl_choice ch;
    /* two fast devices with a fast link between them, too small together for the model, and a slower
       memory-rich device behind a 5 ms link; slow disks. Tensor parallelism over all three pays 2L round
       trips of 5 ms, over the fast pair it streams from the disks; a pipeline runs the fast pair's layers
       one device after the other; the hybrid runs them on both at once and the rest on device 2 */
    hpl_cluster c = {.n = 3};
    c.dev[0] = dev(10, 150 * MIB, 0.05);
    c.dev[1] = dev(10, 150 * MIB, 0.05);
    c.dev[2] = dev(5, 2000 * MIB, 0.05);
    links(&c, 5.0, 0.1);
    c.link[0][1] = c.link[1][0] = (hpl_link){.rtt_ms = 0.02, .gbps = 1.0};
    hpl_model m = model(16, 30 * MIB, 50 * MIB, 1 * MIB);
    int k = choose(&c, &m, &ch);
    CHECKF(k == HPL_HYBRID, "fast pair, slow third: %s", ch.why);
    const hpl_plan *p = &ch.cand[ch.chosen];
    if (k == HPL_HYBRID) {
        CHECKF(p->group == 2 && p->n == 3 && p->dev[1] == 1 && p->dev[2] == 2, "the group: %s", ch.why);
        /* within every budget */
        for (int i = 0; i < p->n; i++)
            CHECKF(p->dc[i].stream_bytes == 0 && p->dc[i].mem_bytes <= p->dc[i].budget, "device %d: %g bytes streamed, %.3f of %.3f MiB (%s)",
                   i, p->dc[i].stream_bytes, p->dc[i].mem_bytes / MIB, p->dc[i].budget / MIB, ch.why);
        /* the shares: the whole of every layer, and the head, which also holds the 50 MiB output head in
           the same budget, no more than its equal partner (the min-max keeps both off the slow disk) */
        CHECKF(p->share[0] > 0.25 && p->share[0] <= 0.5 + 1e-9 && fabs(p->share[0] + p->share[1] - 1) < 1e-9,
               "shares %.3f,%.3f", p->share[0], p->share[1]);
        CHECK(p->dc[0].layers == p->dc[1].layers && p->dc[0].layers + p->dc[2].layers == 16);
        /* the best pipeline is slower */
        double pp = INFINITY;
        for (int i = 0; i < ch.n; i++)
            if (ch.cand[i].kind == HPL_PP && ch.cand[i].feasible) pp = HR_MIN(pp, ch.cand[i].ms_per_token);
        CHECKF(p->ms_per_token < pp, "hybrid %.2f ms, pipeline %.2f ms", p->ms_per_token, pp);
        /* the messages: two hand-offs per trip (to device 2 and back), and in the group a FORWARD per
           window of the head and 4 per layer (PARTIAL and RESULT after each of its two blocks) */
        hc_pp_plan pl;
        CHECK(hc_pp_plan_make(16, p->window, 2, &pl, NULL) == 0 && pl.n_rounds == p->trips);
        int nwin = 0;
        for (int w = 0; w < pl.n_win[0]; w++) nwin += pl.win[0][w].end > pl.win[0][w].begin;
        CHECKF(p->n_messages == 2 * p->trips + nwin + 4 * p->dc[0].layers, "%d messages, %d trips, %d windows",
               p->n_messages, p->trips, nwin);
    }
    /* the same devices with a 5 ms link inside the pair: each layer's two all-reduces cost 10 ms, the
       hybrid loses to the pipeline (the worker-led one too) */
    c.link[0][1] = c.link[1][0] = c.link[0][2];
    k = choose(&c, &m, &ch);
    CHECKF(k == HPL_PP, "slow links everywhere: %s", ch.why);
    int nw = 0;
    for (int i = 0; i < ch.n; i++) nw += ch.cand[i].kind == HPL_HYBRID && ch.cand[i].gstage > 0;
    CHECKF(nw == 1, "%d worker-led candidates, want 1 (the pair 1+2)", nw);
    /* the search with hybrids on the largest exhaustive case: 5 workers (every subset), 32 layers */
    hpl_cluster c6 = {.n = 6};
    for (int i = 0; i < 6; i++) c6.dev[i] = dev(4 + i, 300 * MIB, 0.1);
    links(&c6, 1.0, 0.1);
    hpl_model m32 = model(32, 30 * MIB, 50 * MIB, 1 * MIB);
    int64_t t0 = hr_time_ns();
    choose(&c6, &m32, &ch);
    int nh = 0;
    for (int i = 0; i < ch.n; i++) nh += ch.cand[i].kind == HPL_HYBRID;
    printf("  hpl_choose, 6 devices, 32 layers: %d candidates (%d hybrid) in %.0f ms\n", ch.n, nh,
           (hr_time_ns() - t0) * 1e-6);
    /* head-led: per subset of k workers, groups of 2..min(k, 4) devices (48); worker-led: one per subset of
       two workers or more (26) */
    CHECKF(nh == 48 + 26 && ch.n <= HPL_MAX_CANDIDATES, "%d candidates, %d hybrid", ch.n, nh);
    /* a hybrid plan's cost: a group that leaves no stage after it is refused */
    hpl_plan h = {.kind = HPL_HYBRID, .n = 3, .group = 3, .dev = {0, 1, 2}, .share = {0.5, 0.5, 0}, .window = {8, 8}};
    hr_err err = {0};
    CHECK(hpl_cost(&c, &m, 100, &h, &err) == HR_EINVAL);
}

/* ---- worker-led hybrid: where it must win, and where it must not ------------------------------------------ */
static void test_hybrid_worker(void) {
    static hpl_choice ch;
    /* the head is slow, with little memory and 5 ms links; two workers are fast, each too small for the
       model but not together, with a 0.02 ms link between them; slow disks. Only a group of the two
       workers runs their layers at both speeds at once without 2L round trips to the head: every TP
       plan and the head's groups pay 2L x 5 ms, a pipeline runs the workers' layers one after the other,
       the head alone streams from its disk */
    hpl_cluster c = {.n = 4};
    c.dev[0] = dev(2, 120 * MIB, 0.05);
    c.dev[1] = dev(4, 400 * MIB, 0.05);    /* a third worker, slow, behind the same 5 ms links */
    c.dev[2] = dev(10, 300 * MIB, 0.05);
    c.dev[3] = dev(10, 300 * MIB, 0.05);
    links(&c, 5.0, 0.1);
    c.link[2][3] = c.link[3][2] = (hpl_link){.rtt_ms = 0.02, .gbps = 1.0};
    hpl_model m = model(16, 30 * MIB, 50 * MIB, 1 * MIB);
    int k = choose(&c, &m, &ch);
    const hpl_plan *p = &ch.cand[ch.chosen];
    CHECKF(k == HPL_HYBRID && p->gstage > 0, "fast worker pair, slow head: %s", ch.why);
    if (k == HPL_HYBRID && p->gstage > 0) {
        /* the group is the fast pair, led by the first of them; the head a stage before it */
        CHECKF(p->group == 2 && p->dev[0] == 0 && p->dev[p->gstage] == 2 && p->dev[p->gstage + 1] == 3, "the group: %s",
               ch.why);
        char desc[256];
        hpl_plan_describe(p, desc, sizeof desc);
        CHECKF(strstr(desc, ",2+3") != NULL, "%s", desc);
        for (int i = 0; i < p->n; i++)
            CHECKF(p->dc[i].dev == p->dev[i] && p->dc[i].stream_bytes == 0 && p->dc[i].mem_bytes <= p->dc[i].budget,
                   "device %d: %g bytes streamed (%s)", p->dev[i], p->dc[i].stream_bytes, ch.why);
        /* the shares: the whole of every layer, and the head, which also holds the 50 MiB output head in
           the same budget, no more than its equal partner (the min-max keeps both off the slow disk) */
        CHECKF(p->share[0] > 0.25 && p->share[0] <= 0.5 + 1e-9 && fabs(p->share[0] + p->share[1] - 1) < 1e-9,
               "shares %.3f,%.3f", p->share[0], p->share[1]);
        const hpl_dev_cost *g0 = &p->dc[p->gstage], *g1 = &p->dc[p->gstage + 1];
        CHECK(g0->layers == g1->layers && g0->layers > 0);
        int sum = 0;
        for (int i = 0; i < p->n; i++) sum += i == p->gstage + 1 ? 0 : p->dc[i].layers;
        CHECKF(sum == 16, "%d layers over the stages", sum);
        /* the group's messages: a FORWARD from its leader per window and 4 per layer, over the workers'
           link; what else a token sends is the ring's hand-offs, at least two per trip */
        hc_pp_plan pl;
        const int ns = p->n - 1;
        CHECK(hc_pp_plan_make(16, p->window, ns, &pl, NULL) == 0 && pl.n_rounds == p->trips);
        int nwin = 0;
        for (int w = 0; w < pl.n_win[p->gstage]; w++) nwin += pl.win[p->gstage][w].end > pl.win[p->gstage][w].begin;
        int hops = p->n_messages - nwin - 4 * g0->layers;
        CHECKF(hops >= 2 * p->trips && hops <= ns * p->trips + 1, "%d messages, %d trips, %d windows", p->n_messages,
               p->trips, nwin);
        /* faster than every other kind, and than the head's groups */
        for (int i = 0; i < ch.n; i++)
            if (i != ch.chosen && ch.cand[i].feasible && !ch.cand[i].lossy)
                CHECKF(ch.cand[i].ms_per_token >= p->ms_per_token, "candidate %d (%s, stage %d) %.2f ms < %.2f ms", i,
                       hpl_kind_name(ch.cand[i].kind), ch.cand[i].gstage, ch.cand[i].ms_per_token, p->ms_per_token);
        /* the cost model's all-reduces run over the leader's link: the same plan with the pair's link as
           slow as the head's costs 2 x (its layers) x ~5 ms more */
        hpl_plan q = *p;
        hpl_cluster c2 = c;
        c2.link[2][3] = c2.link[3][2] = c.link[0][2];
        hr_err err = {0};
        CHECK(hpl_cost(&c2, &m, 128, &q, &err) == 0 && q.feasible);
        CHECKF(q.ms_per_token - p->ms_per_token > 2 * g0->layers * 4.9, "%.2f ms, with a slow pair link %.2f ms",
               p->ms_per_token, q.ms_per_token);
    }
    /* the pair's link as slow as the rest: the worker-led hybrid loses (to the pipeline) */
    c.link[2][3] = c.link[3][2] = c.link[0][2];
    k = choose(&c, &m, &ch);
    CHECKF(k == HPL_PP, "slow links everywhere: %s", ch.why);
    /* a worker-led group is a stage: a gstage beyond the last stage is refused */
    hpl_plan h = {.kind = HPL_HYBRID, .n = 3, .group = 2, .gstage = 2, .dev = {0, 2, 3}, .share = {0.5, 0.5},
                  .window = {8, 8}};
    hr_err err = {0};
    CHECK(hpl_cost(&c, &m, 100, &h, &err) == HR_EINVAL);
}

/* ---- loss (docs/planner.md, "Loss") ---------------------------------------------------------------------------- */
static void lossy_links(hpl_cluster *c, double p) {
    for (int a = 0; a < c->n; a++)
        for (int b = 0; b < c->n; b++)
            if (a != b) c->link[a][b].loss = c->link[a][b].loss_to = c->link[a][b].loss_from = p;
}

/* the chosen candidate, and the fastest reliable TP candidate over all the devices */
static const hpl_plan *find(const hpl_choice *ch, int kind, bool lossy, int n) {
    for (int i = 0; i < ch->n; i++)
        if (ch->cand[i].kind == kind && ch->cand[i].lossy == lossy && ch->cand[i].n == n) return &ch->cand[i];
    return NULL;
}

static void test_loss(void) {
    static hpl_choice ch;
    /* a TCP recovery by hand: 8256 bytes = 6 segments at 1% loss, RTT 2 ms: five mid-message segments
       recovered in an RTT, the tail after 0.35 x 200 ms (timeout) + 0.65 x 10 ms (tail-loss probe) */
    hpl_cluster c = {.n = 8};
    links(&c, 2.0, 0.0375);
    CHECK(hpl_tcp_recovery_ms(&c, 0, 1, 8256) == 0);
    lossy_links(&c, 0.01);
    double want = 0.01 * (5 * 2.0 + 0.35 * 200 + 0.65 * 10);
    CHECKF(fabs(hpl_tcp_recovery_ms(&c, 0, 1, 8256) - want) < 1e-9, "%.6f, not %.6f", hpl_tcp_recovery_ms(&c, 0, 1, 8256), want);

    /* klonet8's shape: 8 equal devices of 1 GB/s, 300 Mbit/s links of 2 ms RTT, a 1B-shaped model (16
       layers of 40 MiB, n_embd 2048) that fits each. Without loss TP's 8-way split wins over the
       pipeline (which computes every layer on one device at a time), and the lossy all-reduce does not:
       it loses elements for no time */
    for (int i = 0; i < 8; i++) c.dev[i] = dev(1, 4000 * MIB, 1.0);
    links(&c, 2.0, 0.0375);
    hpl_model m = model(16, 40 * MIB, 100 * MIB, 0.5 * MIB);
    int k = choose(&c, &m, &ch);
    const hpl_plan *P = &ch.cand[ch.chosen];
    CHECKF(k == HPL_TP && !P->lossy && P->n >= 4 && P->loss_ms == 0, "0%% loss: %s", ch.why);
    const hpl_plan *lossy = find(&ch, HPL_TP, true, P->n);
    CHECKF(lossy && lossy->feasible && lossy->ms_per_token >= P->ms_per_token && lossy->elements_lost == 0,
           "the lossy twin at 0%%: %.2f ms", lossy ? lossy->ms_per_token : -1);

    /* 5% loss: TCP's 2L all-reduces of 7 workers' 6-segment partials and sums meet a loss almost every
       time; the lossy all-reduce pays only layer 0's and the way back's NACKs, and loses ~5% of the
       workers' elements (with 7 workers 7 x 2048 x 0.05 = 717 per all-reduce) */
    lossy_links(&c, 0.05);
    k = choose(&c, &m, &ch);
    P = &ch.cand[ch.chosen];
    const hpl_plan *tcp = find(&ch, HPL_TP, false, P->n), *pp = find(&ch, HPL_PP, false, 8);
    CHECKF(k == HPL_TP && P->lossy && P->n >= 4, "5%% loss: %s", ch.why);
    CHECKF(tcp && tcp->p_hit > 0.8 && tcp->ms_per_token > 2 * P->ms_per_token, "TCP TP %.1f ms, lossy %.1f ms",
           tcp ? tcp->ms_per_token : -1, P->ms_per_token);
    CHECKF(pp && pp->ms_per_token > P->ms_per_token && pp->loss_ms > 0, "PP %.1f ms", pp ? pp->ms_per_token : -1);
    CHECKF(fabs(P->elements_lost - 0.05 * (P->n - 1) * 2048) < 1 && fabs(P->lost_fraction - 0.05) < 1e-9,
           "%.1f elements lost", P->elements_lost);
    CHECKF(strstr(ch.why, "lossy") && strstr(ch.why, "loses") && strstr(ch.why, "5.0%"), "why: %s", ch.why);

    /* the throughput probe over a lossy link: klonet8 at 5% measured 35 MB/s on one link and 6.5 on
       another (TCP's loss-limited rate, Mathis: 1.22 x 1448 / (2 ms x sqrt(0.05)) = 4 MB/s); the limited
       one is costed at the other's rate, a link without loss keeps its figure */
    {
        hpl_cluster u = {.n = 3};
        links(&u, 2.0, 0.0352);
        lossy_links(&u, 0.05);
        u.link[0][2].gbps = u.link[2][0].gbps = 0.0065;
        u.link[1][2].loss = u.link[2][1].loss = 0;
        u.link[1][2].gbps = u.link[2][1].gbps = 0.001;   /* slow but not lossy: its own figure */
        hpl_links_unlimit(&u);
        CHECKF(u.link[0][2].gbps == 0.0352 && u.link[0][2].gbps_measured == 0.0065 && u.link[0][1].gbps == 0.0352,
               "%.4f %.4f", u.link[0][2].gbps, u.link[0][1].gbps);
        CHECK(u.link[1][2].gbps == 0.001);
    }

    /* a pipeline: fast devices whose budgets cannot hold the model alone, 5 ms links losing 5%: TP pays
       2L round trips even without retransmissions, a pipeline 8 hops */
    for (int i = 0; i < 8; i++) c.dev[i] = dev(10, 200 * MIB, 0.05);
    links(&c, 5.0, 0.0375);
    lossy_links(&c, 0.05);
    k = choose(&c, &m, &ch);
    CHECKF(k == HPL_PP && ch.cand[ch.chosen].loss_ms > 0, "slow links, 5%%: %s", ch.why);

}

/* ---- a cost computed by hand ------------------------------------------------------------------------------- */
static void test_single_cost(void) {
    hpl_cluster c = {.n = 1};
    c.dev[0] = dev(10, 4000 * MIB, 1.0);
    hpl_model m = model(10, 50 * MIB, 20 * MIB, 1 * MIB);
    hpl_plan p = {.kind = HPL_SINGLE, .n = 1};
    hr_err err = {0};
    CHECK(hpl_cost(&c, &m, 100, &p, &err) == 0 && p.feasible);
    /* 520 MiB at 10 GB/s, plus the sampler's 4 passes over 4-byte logits at 10 GB/s */
    double want = (10 * 50 + 20) * MIB / 10e6 + 16.0 * 32000 / 10e6;
    CHECKF(fabs(p.ms_per_token - want) < 1e-9, "%.6f ms, want %.6f", p.ms_per_token, want);
    CHECK(p.dc[0].stream_bytes == 0 && p.dc[0].resident_bytes == 520 * MIB);
    /* the same device with a budget of 300 MiB streams the rest from a 1 GB/s disk, which compute hides
       only partly */
    c.dev[0].budget = (uint64_t)(300 * MIB);
    CHECK(hpl_cost(&c, &m, 100, &p, &err) == 0 && p.feasible);
    /* 282 MiB for weights: the manager's best pins (LIME's allocator) hold the output head (20 MiB), so
       the window is two FFN blocks (2 x 33.3 MiB), and 195.3 MiB of layers hold 11 blocks' worth of
       16.7 MiB (an FFN block is two): 203.3 MiB pinned. (Two blocks of room less than the budget,
       the old model's figure, would pin 215.3 MiB, which no set of whole blocks does.) */
    double stream = 520 * MIB - (20 * MIB + 11 * (50 * MIB / 3));
    CHECKF(fabs(p.dc[0].stream_bytes - stream) < 64, "streams %.0f, want %.0f", p.dc[0].stream_bytes, stream);
    /* the time is the loader's, played out over the pins the manager makes at the start of a generation,
       when the KV cache holds a position, not the context's 10 MiB: layers 0-3 and layer 4's attention
       block (216.7 MiB, in execution order), so 303.3 MiB stream, and the pass waits for the disk to read
       them */
    const double start = 520 * MIB - (4 * 50 * MIB + 50 * MIB / 3);
    CHECKF(fabs(p.ms_per_token - HR_MAX(want, start / 1e6)) < 1e-3, "%.4f ms, want %.4f", p.ms_per_token, start / 1e6);
}

/* a pipeline's network time by hand: every trip goes round through the head, also when the head owns
   no layers and the next window is the same worker's (its hops d1 -> head -> d1, which a cost that
   skipped a device's consecutive windows left out: windows 0,1 x 16 costed as 0,16 x 1 on pair2,
   measured 55 ms/token slower) */
static void test_pp_trip_hops(void) {
    hpl_cluster c = {.n = 3};
    for (int i = 0; i < 3; i++) c.dev[i] = dev(5, 4000 * MIB, 1.0);
    links(&c, 4.0, 1e6); /* RTT 4 ms, bytes free: a hop is 2 ms */
    hpl_model m = model(16, 10 * MIB, 10 * MIB, 0.1 * MIB);
    const double hop = 2.0;
    static const struct { int n, w[3], trips, hops; } cases[] = {
        {2, {0, 16}, 1, 2}, {2, {0, 1}, 16, 32}, {2, {0, 4}, 4, 8}, {2, {2, 2}, 4, 8},
        {3, {0, 2, 2}, 4, 12}, {3, {4, 4, 8}, 1, 3}, {3, {0, 8, 8}, 1, 3},
    };
    for (size_t i = 0; i < HR_ARRAY_LEN(cases); i++) {
        hpl_plan p = {.kind = HPL_PP, .n = cases[i].n, .dev = {0, 1, 2}};
        memcpy(p.window, cases[i].w, sizeof cases[i].w);
        hr_err err = {0};
        CHECKF(hpl_cost(&c, &m, 16, &p, &err) == 0 && p.feasible, "case %zu: %s %s", i, err.msg, p.why);
        CHECKF(p.trips == cases[i].trips && p.n_messages == cases[i].hops, "windows %d,%d,%d: %d trips, %d hops (want %d, %d)",
               cases[i].w[0], cases[i].w[1], cases[i].w[2], p.trips, p.n_messages, cases[i].trips, cases[i].hops);
        CHECKF(fabs(p.comm_ms - cases[i].hops * hop) < 1e-6, "windows %d,%d,%d: network %.4f ms, want %d hops = %.4f",
               cases[i].w[0], cases[i].w[1], cases[i].w[2], p.comm_ms, cases[i].hops, cases[i].hops * hop);
    }
}

/* The CFS bandwidth model itself, by hand (docs/planner.md, "CPU quotas"): 0.25 core in 10 ms periods (2.5 ms
   of CPU a period), ticks every 4 ms from the period's start, a device that has not run before. */
static void test_quota_burst(void) {
    /* fits the pool: never throttled */
    CHECKF(fabs(hpl_quota_burst_ms(0.25, 10, 4, 0, 2) - 2) < 1e-9, "2 ms at 0: %.3f", hpl_quota_burst_ms(0.25, 10, 4, 0, 2));
    /* 5 ms from 0: the pool's 2.5 by 2.5, on to the tick at 4 (1.5 ms of debt), throttled to 10; the refill pays
       the debt and leaves 1 ms: done at 11 (without the tick's overrun: 12.5) */
    CHECKF(fabs(hpl_quota_burst_ms(0.25, 10, 4, 0, 5) - 11) < 1e-9, "5 ms at 0: %.3f", hpl_quota_burst_ms(0.25, 10, 4, 0, 5));
    /* 5 ms from 7: the pool's 2.5 by 9.5, on until the boundary at 10 (0.5 of debt; the tick at 8 was before
       the pool ran out), whose refill gives 2 more: never throttled, done at 12 — what a period granted is not
       lost at its end when it was taken before (with a tick at 1 ms: throttled from 10 to... the refill comes
       first either way) */
    CHECKF(fabs(hpl_quota_burst_ms(0.25, 10, 4, 7, 5) - 5) < 1e-9, "5 ms at 7: %.3f", hpl_quota_burst_ms(0.25, 10, 4, 7, 5));
    /* a tick of 1 ms (HZ 1000): 5 ms from 0 overruns to 3 only (0.5 of debt), throttled to 10, then 2 ms: 12 */
    CHECKF(fabs(hpl_quota_burst_ms(0.25, 10, 1, 0, 5) - 12) < 1e-9, "5 ms at 0, 1 ms ticks: %.3f",
           hpl_quota_burst_ms(0.25, 10, 1, 0, 5));
    /* a long burst averages the quota: 25 ms of CPU takes about 100 ms (10 periods of 2.5) */
    double w = hpl_quota_burst_ms(0.25, 10, 4, 0, 25);
    CHECKF(w > 90 && w <= 100, "25 ms at 0: %.3f", w);
}

/* CPU quotas (docs/planner.md, "CPU quotas"): devices of 1 thread at 0.5 core, 8 layers of 10 ms each at
   the quota-bound rate (5 ms of CPU), nearly free links. One device alone computes throughout: the quota
   model changes nothing. Four devices of a pipeline, two layers each, idle 3/4 of a token: a burst of
   10 ms of CPU takes 10-15 ms within 10 ms periods (5 ms of CPU a period, and 1 ms kept from the last
   burst, up to a tick's overrun), not 20; within 100 ms periods, 25 ms of CPU a period fit the 50 ms quota: never throttled. TP over two
   devices: never faster than their CPU time at the quota allows. */
static void test_quota(void) {
    hpl_cluster c = {.n = 4};
    for (int i = 0; i < 4; i++) {
        c.dev[i] = dev(1, 4000 * MIB, 1.0);
        c.dev[i].cpu_quota = 0.5;
        c.dev[i].cpu_period_ms = 10;
    }
    links(&c, 0.2, 1e6);
    hpl_model m = model(8, 10e6, 1e3, 0.1 * MIB);   /* a layer: 10e6 bytes at 1 GB/s = 10 ms */
    hr_err err = {0};
    hpl_plan s = {.kind = HPL_SINGLE, .n = 1};
    CHECK(hpl_cost(&c, &m, 16, &s, &err) == 0 && s.feasible);
    /* (the tick's overrun of a period and its repayment in the next telescope over the tokens played: what is
       left is at most one tick's CPU at the ends, a third of it per token) */
    CHECKF(fabs(s.quota_ms) < 0.5 && fabs(s.ms_per_token - 80) < 1.0, "single: %.2f ms/token, quota %.2f", s.ms_per_token,
           s.quota_ms);
    hpl_plan p = {.kind = HPL_PP, .n = 4, .dev = {0, 1, 2, 3}, .window = {2, 2, 2, 2}};
    CHECK(hpl_cost(&c, &m, 16, &p, &err) == 0 && p.feasible);
    const double hops = p.comm_ms, extra = p.head_extra_ms;
    CHECKF(p.ms_per_token >= 4 * 10 + hops + extra / 2 - 1e-6 && p.ms_per_token <= 4 * 15 + hops + extra + 1e-6 &&
           fabs(p.ms_per_token - (p.compute_ms + p.comm_ms + p.blocked_ms)) < 1e-9,
           "pp 2,2,2,2 at 10 ms periods: %.2f ms/token (hops %.2f), want 40-60 + hops", p.ms_per_token, hops);
    for (int i = 0; i < 4; i++) c.dev[i].cpu_period_ms = 100;
    CHECK(hpl_cost(&c, &m, 16, &p, &err) == 0 && p.feasible);
    /* the output head, too, at the thread's full speed: twice the quota-bound rate */
    CHECKF(fabs(p.ms_per_token - (40 + hops + extra / 2)) < 0.01, "pp at 100 ms periods: %.2f ms/token, want %.2f (never throttled)",
           p.ms_per_token, 40 + hops + extra / 2);
    for (int i = 0; i < 4; i++) c.dev[i].cpu_period_ms = 10;
    hpl_plan t = {.kind = HPL_TP, .n = 2, .dev = {0, 1}, .share = {0.5, 0.5}};
    CHECK(hpl_cost(&c, &m, 16, &t, &err) == 0 && t.feasible);
    /* each device: 40 ms at the quota-bound rate = 20 ms of CPU, at most 0.5 core on average */
    CHECKF(t.ms_per_token >= 40 - 1e-6 && t.quota_ms < 0,
           "tp: %.2f ms/token, quota %.2f", t.ms_per_token, t.quota_ms);
    /* no quota: the model as before */
    for (int i = 0; i < 4; i++) c.dev[i].cpu_quota = 0;
    CHECK(hpl_cost(&c, &m, 16, &p, &err) == 0 && p.feasible && p.quota_ms == 0);
    CHECKF(fabs(p.ms_per_token - (80 + hops + extra)) < 1e-9, "pp without quotas: %.2f", p.ms_per_token);
}

/* a default budget that cannot hold the output head (one block of its own): no manager, plain mmap,
   every page of a pass missed when the weights exceed the memory; a budget given explicitly fails */
static void test_mmap_fallback(void) {
    hpl_cluster c = {.n = 1};
    c.dev[0] = dev(10, 200 * MIB, 1.0);      /* mem_usable 250 MiB */
    hpl_model m = model(10, 50 * MIB, 190 * MIB, 1 * MIB);
    hpl_plan p = {.kind = HPL_SINGLE, .n = 1};
    hr_err err = {0};
    CHECK(hpl_cost(&c, &m, 100, &p, &err) == 0 && p.feasible && p.dc[0].mmap);
    double all = (10 * 50 + 190) * MIB;
    CHECKF(p.dc[0].stream_bytes == all && fabs(p.blocked_ms - all / 1e6) < 1e-6, "streams %.0f MiB, blocked %.1f ms",
           p.dc[0].stream_bytes / MIB, p.blocked_ms);
    c.dev[0].budget_set = true;
    CHECK(hpl_cost(&c, &m, 100, &p, &err) == 0 && !p.feasible && strstr(p.why, "budget"));
}

/* A device that computes from the file's mapping (its manager streams, or plain mmap) is costed at the
   kernels' speed on the file's layout; one whose weights fit is costed at the packed speed, and a
   profile without the mapping's speeds (saved before they were measured) at the packed speed too. */
static void test_mapped_speed(void) {
    hpl_cluster c = {.n = 1};
    c.dev[0] = dev(10, 4000 * MIB, 1.0);
    c.dev[0].ts[0].matvec_map_gbps = 5;     /* the file's layout at half the packed speed */
    hpl_model m = model(10, 50 * MIB, 20 * MIB, 1 * MIB);
    hpl_plan p = {.kind = HPL_SINGLE, .n = 1};
    hr_err err = {0};
    const double sampler = 16.0 * 32000 / 10e6, bytes = (10 * 50 + 20) * MIB;
    CHECK(hpl_cost(&c, &m, 100, &p, &err) == 0 && p.feasible && p.dc[0].stream_bytes == 0);
    CHECKF(fabs(p.compute_ms - (bytes / 10e6 + sampler)) < 1e-9, "resident: %.4f ms", p.compute_ms);
    c.dev[0].budget = (uint64_t)(300 * MIB);  /* streams (test_single_cost): every layer from the mapping */
    CHECK(hpl_cost(&c, &m, 100, &p, &err) == 0 && p.feasible && p.dc[0].stream_bytes > 0);
    CHECKF(fabs(p.compute_ms - (bytes / 5e6 + sampler)) < 1e-9, "streaming: %.4f ms, want %.4f", p.compute_ms,
           bytes / 5e6 + sampler);
    c.dev[0].ts[0].matvec_map_gbps = 0;       /* not measured: the packed speed */
    CHECK(hpl_cost(&c, &m, 100, &p, &err) == 0 && p.feasible);
    CHECKF(fabs(p.compute_ms - (bytes / 10e6 + sampler)) < 1e-9, "no map speed: %.4f ms", p.compute_ms);
    /* plain mmap (a default budget too small for a block) computes from the mapping as well */
    c.dev[0] = dev(10, 200 * MIB, 1.0);
    c.dev[0].ts[0].matvec_map_gbps = 5;
    hpl_model big = model(10, 50 * MIB, 190 * MIB, 1 * MIB);
    CHECK(hpl_cost(&c, &big, 100, &p, &err) == 0 && p.feasible && p.dc[0].mmap);
    CHECKF(fabs(p.compute_ms - ((10 * 50 + 190) * MIB / 5e6 + sampler)) < 1e-9, "mmap: %.4f ms", p.compute_ms);
    /* a pipeline: the worker that streams pays the mapping's speed, the head that keeps its layers does not */
    hpl_cluster c2 = {.n = 2};
    c2.dev[0] = dev(10, 4000 * MIB, 1.0);
    c2.dev[1] = dev(10, 300 * MIB, 1.0);
    c2.dev[0].ts[0].matvec_map_gbps = c2.dev[1].ts[0].matvec_map_gbps = 5;
    hpl_link l = {.rtt_ms = 1, .gbps = 0.1};
    hpl_link_both(&c2, 0, 1, l);
    hpl_plan pp = {.kind = HPL_PP, .n = 2, .dev = {0, 1}, .window = {2, 8}};
    CHECK(hpl_cost(&c2, &m, 100, &pp, &err) == 0 && pp.feasible);
    CHECK(pp.dc[0].stream_bytes == 0 && pp.dc[1].stream_bytes > 0);
    CHECKF(fabs(pp.dc[1].compute_ms - 8 * 50 * MIB / 5e6) < 1e-9 &&
           fabs(pp.dc[0].compute_ms - (2 * 50 * MIB + 20 * MIB) / 10e6 - sampler) < 1e-9,
           "head %.4f ms, worker %.4f ms", pp.dc[0].compute_ms, pp.dc[1].compute_ms);
}

/* TP: a device's loader reads while its compute thread waits for the all-reduces, so what blocks is the
   streaming its compute and those waits do not cover. */
static void test_tp_stream_waits(void) {
    hpl_cluster c = {.n = 2};
    c.dev[0] = dev(10, 150 * MIB, 0.2);        /* the head streams part of its share from a slow disk */
    c.dev[1] = dev(10, 4000 * MIB, 1.0);
    links(&c, 2.0, 0.1);
    hpl_model m = model(10, 50 * MIB, 20 * MIB, 1 * MIB);
    hpl_plan p = {.kind = HPL_TP, .n = 2, .dev = {0, 1}, .share = {0.5, 0.5}};
    hr_err err = {0};
    CHECK(hpl_cost(&c, &m, 100, &p, &err) == 0 && p.feasible && p.dc[0].stream_bytes > 0 && p.dc[1].stream_bytes == 0);
    /* the loader played out with a wait after every block: no less than what the disk cannot read in the
       whole token (compute and waits), no more than the whole read */
    const double own = p.dc[0].compute_ms - p.head_extra_ms, low = HR_MAX(0, p.dc[0].stream_ms - own - p.comm_ms);
    CHECKF(p.comm_ms > 0 && low > 0 && p.dc[0].blocked_ms >= low - 1e-6 && p.dc[0].blocked_ms <= p.dc[0].stream_ms + 1e-6 &&
           fabs(p.blocked_ms - p.dc[0].blocked_ms) < 1e-9,
           "blocked %.3f ms, want within [%.3f, %.3f] (compute %.3f, waits %.3f)", p.dc[0].blocked_ms, low,
           p.dc[0].stream_ms, own, p.comm_ms);
    links(&c, 400.0, 0.1);                     /* waits that cover it all: each block read in the wait before it */
    CHECK(hpl_cost(&c, &m, 100, &p, &err) == 0 && p.feasible && p.dc[0].blocked_ms == 0 && p.blocked_ms == 0);
}

/* A streaming device's loader spends CPU inside the device's quota: HPL_LOADER_CPU_X x the cold read's CPU per
   byte, over the cores the device gets; nothing when nothing streams, or under plain mmap (its faults are in
   its blocked time), or when the profile has no figure. */
static void test_loader_cpu(void) {
    hpl_cluster c = {.n = 1};
    c.dev[0] = dev(10, 300 * MIB, 1.0);
    c.dev[0].disk_cpu_ms_gb = 10;
    hpl_model m = model(10, 50 * MIB, 20 * MIB, 1 * MIB);
    hpl_plan p = {.kind = HPL_SINGLE, .n = 1};
    hr_err err = {0};
    const double sampler = 16.0 * 32000 / 10e6, bytes = (10 * 50 + 20) * MIB;
    CHECK(hpl_cost(&c, &m, 100, &p, &err) == 0 && p.feasible && p.dc[0].stream_bytes > 0 && !p.dc[0].mmap);
    double want = bytes / 10e6 + sampler + p.dc[0].stream_bytes / 1e9 * 10 * HPL_LOADER_CPU_X;
    CHECKF(fabs(p.dc[0].compute_ms - want) < 1e-9, "streaming: %.4f ms, want %.4f", p.dc[0].compute_ms, want);
    c.dev[0].n_threads = 2;                    /* two threads, no quota: over two cores */
    CHECK(hpl_cost(&c, &m, 100, &p, &err) == 0 && p.feasible);
    want = bytes / 10e6 + sampler + p.dc[0].stream_bytes / 1e9 * 10 * HPL_LOADER_CPU_X / 2;
    CHECKF(fabs(p.dc[0].compute_ms - want) < 1e-9, "2 threads: %.4f ms, want %.4f", p.dc[0].compute_ms, want);
    c.dev[0].cpu_quota = 0.5;                  /* a binding quota: over half a core */
    c.dev[0].cpu_period_ms = 100;
    CHECK(hpl_cost(&c, &m, 100, &p, &err) == 0 && p.feasible);
    want = bytes / 10e6 + sampler + p.dc[0].stream_bytes / 1e9 * 10 * HPL_LOADER_CPU_X / 0.5;
    CHECKF(fabs(p.dc[0].compute_ms - want) < 1e-9, "quota 0.5: %.4f ms, want %.4f", p.dc[0].compute_ms, want);
    c.dev[0].disk_cpu_ms_gb = 0;               /* not measured: not costed */
    CHECK(hpl_cost(&c, &m, 100, &p, &err) == 0 && p.feasible);
    CHECKF(fabs(p.dc[0].compute_ms - (bytes / 10e6 + sampler)) < 1e-9, "no figure: %.4f ms", p.dc[0].compute_ms);
    c.dev[0] = dev(10, 4000 * MIB, 1.0);       /* resident: nothing streams */
    c.dev[0].disk_cpu_ms_gb = 10;
    CHECK(hpl_cost(&c, &m, 100, &p, &err) == 0 && p.feasible && p.dc[0].stream_bytes == 0);
    CHECKF(fabs(p.dc[0].compute_ms - (bytes / 10e6 + sampler)) < 1e-9, "resident: %.4f ms", p.dc[0].compute_ms);
    c.dev[0] = dev(10, 200 * MIB, 1.0);        /* plain mmap */
    c.dev[0].disk_cpu_ms_gb = 10;
    hpl_model big = model(10, 50 * MIB, 190 * MIB, 1 * MIB);
    CHECK(hpl_cost(&c, &big, 100, &p, &err) == 0 && p.feasible && p.dc[0].mmap);
    CHECKF(fabs(p.dc[0].compute_ms - ((10 * 50 + 190) * MIB / 10e6 + sampler)) < 1e-9, "mmap: %.4f ms", p.dc[0].compute_ms);
}

/* Two devices that stream from one disk (the same disk_id): a token takes at least what that disk needs for
   both devices' streamed bytes; on disks of their own, each streams alone. */
static void test_shared_disk(void) {
    hpl_cluster c = {.n = 2};
    c.dev[0] = dev(10, 200 * MIB, 1.0);     /* 5 layers of 50 MiB each: both stream */
    c.dev[1] = dev(10, 200 * MIB, 1.0);
    links(&c, 1, 0.1);
    hpl_model m = model(10, 50 * MIB, 20 * MIB, 1 * MIB);
    hpl_plan pp = {.kind = HPL_PP, .n = 2, .dev = {0, 1}, .window = {5, 5}};
    hr_err err = {0};
    CHECK(hpl_cost(&c, &m, 100, &pp, &err) == 0 && pp.feasible && pp.shared_disk_ms == 0);
    CHECK(pp.dc[0].stream_bytes > 0 && pp.dc[1].stream_bytes > 0);
    const double alone = pp.ms_per_token, both = pp.dc[0].stream_ms + pp.dc[1].stream_ms;
    CHECKF(alone < both, "the plan (%.1f ms) is not disk-bound on two disks (%.1f ms in all)", alone, both);
    snprintf(c.dev[0].disk_id, sizeof c.dev[0].disk_id, "boot/8:1");
    snprintf(c.dev[1].disk_id, sizeof c.dev[1].disk_id, "boot/8:1");
    CHECK(hpl_cost(&c, &m, 100, &pp, &err) == 0 && pp.feasible);
    CHECKF(fabs(pp.ms_per_token - both) < 1e-9 && fabs(pp.shared_disk_ms - (both - alone)) < 1e-9,
           "one disk: %.2f ms (shared %.2f), want %.2f", pp.ms_per_token, pp.shared_disk_ms, both);
    /* one of them keeps its weights: nothing is shared */
    c.dev[1].budget = (uint64_t)(4000 * MIB);
    CHECK(hpl_cost(&c, &m, 100, &pp, &err) == 0 && pp.feasible && pp.dc[1].stream_bytes == 0 && pp.shared_disk_ms == 0);
    /* grouping: by id, wherever the devices stand; an unknown disk is nobody's */
    hpl_cluster g = {.n = 4};
    snprintf(g.dev[0].disk_id, sizeof g.dev[0].disk_id, "boot/8:1");
    snprintf(g.dev[1].disk_id, sizeof g.dev[1].disk_id, "boot/8:2");
    snprintf(g.dev[2].disk_id, sizeof g.dev[2].disk_id, "boot/8:1");
    CHECK(hpl_disk_first(&g, 0) == 0 && hpl_disk_first(&g, 1) == 1 && hpl_disk_first(&g, 2) == 0 && hpl_disk_first(&g, 3) == -1);
}

/* The loader played out (hpl_stream_blocked) on layouts whose waits are worked out by hand: blocks of 8 MiB
   (two of the loader's 4 MiB chunks), the disk 10 ms a block, the room two blocks. */
static void test_stream_blocked(void) {
    const double S = 8 * MIB, D = 10.0 / S;   /* ms per byte */
    /* streamed blocks between pinned ones: each read while the pinned block before it computes (10 ms) */
    double by[8] = {S, S, S, S, S, S, S, S}, c[8], gap[8] = {0};
    bool pin[8] = {true, false, true, false, true, false, true, false};
    for (int i = 0; i < 8; i++) c[i] = pin[i] ? 10 : 1;
    double b = hpl_stream_blocked(8, by, pin, c, gap, 2 * S, D);
    CHECKF(fabs(b) < 1e-9, "interleaved: blocked %.3f ms, want 0", b);
    /* one stretch after four pinned blocks: two read ahead while they compute, then the third can start only
       when the first is done (41 ms) and is ready at 51 (a wait of 9 after the second ends at 42), the fourth
       follows it (ready at 61, a wait of 9): 18 ms a pass; the next pass's two are read while its pinned compute */
    bool run[8] = {true, true, true, true, false, false, false, false};
    for (int i = 0; i < 8; i++) c[i] = run[i] ? 10 : 1;
    b = hpl_stream_blocked(8, by, run, c, gap, 2 * S, D);
    CHECKF(fabs(b - 18) < 1e-9, "stretch: blocked %.3f ms, want 18", b);
    /* a room of four blocks holds the whole stretch, read while the pinned blocks compute: blocked 0 */
    b = hpl_stream_blocked(8, by, run, c, gap, 4 * S, D);
    CHECKF(fabs(b) < 1e-9, "stretch, room 4: blocked %.3f ms, want 0", b);
    /* everything streamed, 1 ms of compute a block: the disk's pace, 80 ms a pass of 8 ms compute */
    bool none[8] = {false};
    for (int i = 0; i < 8; i++) c[i] = 1, gap[i] = 0;
    b = hpl_stream_blocked(8, by, none, c, gap, 2 * S, D);
    CHECKF(fabs(b - (80 - 8)) < 1e-9, "all streamed: blocked %.3f ms, want 72", b);
    /* the ring's idle time reads ahead only as far as the room: 80 ms idle after the pass reads the next pass's
       first two blocks, and each of the other six still waits 9 ms */
    gap[7] = 80;
    b = hpl_stream_blocked(8, by, none, c, gap, 2 * S, D);
    CHECKF(fabs(b - 54) < 1e-9, "all streamed, idle 80: blocked %.3f ms, want 54", b);
    /* nothing streamed: nothing to wait for */
    bool all[8] = {true, true, true, true, true, true, true, true};
    b = hpl_stream_blocked(8, by, all, c, gap, 2 * S, D);
    CHECKF(b == 0, "all pinned: blocked %.3f ms", b);
}

/* The pipeline's cost plays the loader out: a stage's blocked time lies between what the disk cannot read in
   the whole cycle (stream - compute - idle, the formula before) and the whole read, and a disk fast enough
   hides it all. */
static void test_pp_stream_sim(void) {
    hpl_cluster c = {.n = 2};
    c.dev[0] = dev(10, 4000 * MIB, 1.0);
    c.dev[1] = dev(10, 300 * MIB, 0.5);     /* 8 of 10 layers of 50 MiB: streams part of its window */
    links(&c, 1, 0.1);
    hpl_model m = model(10, 50 * MIB, 20 * MIB, 0);   /* no KV cache: the pins at the start are the pins */
    hpl_plan p = {.kind = HPL_PP, .n = 2, .dev = {0, 1}, .window = {2, 8}};
    hr_err err = {0};
    for (double disk = 0.5; disk < 64; disk *= 2) {
        c.dev[1].disk_gbps = disk;
        CHECK(hpl_cost(&c, &m, 100, &p, &err) == 0 && p.feasible && p.dc[1].stream_bytes > 0 && p.dc[0].stream_bytes == 0);
        /* the manager's pins may stream up to 1/32 fewer bytes than the memory model's best pins (src/mem) */
        const double idle = p.dc[0].compute_ms + p.comm_ms, L = p.dc[1].stream_ms, C = p.dc[1].compute_ms,
                     low = HR_MAX(0, L - C - idle) - L / HMEM_PIN_BEST_GAIN;
        CHECKF(p.dc[1].blocked_ms >= low && p.dc[1].blocked_ms <= L + 1e-6, "disk %.1f GB/s: blocked %.2f ms, want within "
               "[%.2f, %.2f]", disk, p.dc[1].blocked_ms, low, L);
    }
    c.dev[1].disk_gbps = 1000;
    CHECK(hpl_cost(&c, &m, 100, &p, &err) == 0 && p.feasible && p.dc[1].blocked_ms < 1e-3);
}

/* One device, and a hybrid's group member, play their loader out too: blocked within [stream - compute -
   what the manager's pins may leave over, stream], all of it hidden by a disk fast enough; and one device whose
   streamed blocks come as one stretch waits longer than the formula's stream - compute, since the loader is
   only its room ahead of the compute (the pins, every FFN block, leave the attention blocks of the last
   layers in a row). */
static void test_single_stream_sim(void) {
    hpl_cluster c = {.n = 1};
    hpl_model m = model(10, 60 * MIB, 20 * MIB, 0);
    c.dev[0] = dev(10, 400 * MIB, 0.5);
    links(&c, 1, 0.1);
    hr_err err = {0};
    for (double disk = 0.25; disk < 64; disk *= 2) {
        c.dev[0].disk_gbps = disk;
        hpl_plan p = {.kind = HPL_SINGLE, .n = 1, .dev = {0}};
        CHECK(hpl_cost(&c, &m, 100, &p, &err) == 0 && p.feasible && p.dc[0].stream_bytes > 0 && !p.dc[0].mmap);
        const double L = p.dc[0].stream_ms, C = p.dc[0].compute_ms, low = HR_MAX(0, L - C) - L / HMEM_PIN_BEST_GAIN;
        CHECKF(p.dc[0].blocked_ms >= low && p.dc[0].blocked_ms <= L + 1e-6 && fabs(p.blocked_ms - p.dc[0].blocked_ms) < 1e-9,
               "disk %.2f GB/s: blocked %.2f ms, want within [%.2f, %.2f]", disk, p.dc[0].blocked_ms, low, L);
    }
    c.dev[0].disk_gbps = 1000;
    hpl_plan p = {.kind = HPL_SINGLE, .n = 1, .dev = {0}};
    CHECK(hpl_cost(&c, &m, 100, &p, &err) == 0 && p.feasible && p.dc[0].blocked_ms < 1e-3);
    /* a disk that reads as fast as the compute: the formula says nothing blocks; the loader, held to its
       room, cannot read a stretch of streamed blocks ahead of the pinned blocks before it */
    c.dev[0].disk_gbps = 10.0 * (double)p.dc[0].stream_bytes / (m.layer_bytes * m.n_layer);
    p = (hpl_plan){.kind = HPL_SINGLE, .n = 1, .dev = {0}};
    CHECK(hpl_cost(&c, &m, 100, &p, &err) == 0 && p.feasible);
    CHECKF(p.dc[0].stream_ms <= p.dc[0].compute_ms + 1e-6 && p.dc[0].blocked_ms > 0.05 * p.dc[0].stream_ms,
           "stream %.2f ms within compute %.2f ms, blocked %.2f ms", p.dc[0].stream_ms, p.dc[0].compute_ms,
           p.dc[0].blocked_ms);
    /* a hybrid whose group's worker streams: within the same bounds (the all-reduce's waits hide more) */
    hpl_cluster h = {.n = 3};
    h.dev[0] = dev(10, 4000 * MIB, 1.0);
    h.dev[1] = dev(10, 4000 * MIB, 1.0);
    h.dev[2] = dev(10, 150 * MIB, 0.5);
    links(&h, 1, 0.1);
    hpl_plan y = {.kind = HPL_HYBRID, .n = 3, .dev = {0, 1, 2}, .group = 2, .gstage = 1, .share = {0.5, 0.5},
                  .window = {2, 8}};
    CHECKF(hpl_cost(&h, &m, 100, &y, &err) == 0 && y.feasible, "%s / %s", err.msg, y.why);
    const hpl_dev_cost *w = &y.dc[2];
    CHECKF(w->stream_bytes > 0 && w->blocked_ms >= HR_MAX(0, w->stream_ms - w->compute_ms - 2.0 * 8 * 1.5) -
                                                      w->stream_ms / HMEM_PIN_BEST_GAIN &&
           w->blocked_ms <= w->stream_ms + 1e-6,
           "member: stream %.2f ms, compute %.2f ms, blocked %.2f ms", w->stream_ms, w->compute_ms, w->blocked_ms);
}

static void test_kv_roundtrip(void) {
    hpl_device d = dev(7.5, 123 * MIB, 0.25), e;
    d.cpu_quota = 0.5;
    d.cpu_period_ms = 10;
    d.tick_ms = 4;
    d.ts[d.n_types++] = (hpl_type_speed){HQ_TYPE_Q4_K, 3.25, 11.5, 2.5, 9.75};
    snprintf(d.disk_id, sizeof d.disk_id, "0f1e2d3c-aaaa-bbbb-cccc-0123456789ab/259:1");
    d.disk_cpu_ms_gb = 11.5;
    hc_kv_text t;
    hpl_device_to_kv(&d, &t);
    hn_profile pr = {.n_kv = (uint32_t)t.n};
    for (int i = 0; i < t.n; i++) pr.kv[i] = (hn_kv){hn_cstr(t.key[i]), hn_cstr(t.val[i])};
    hr_err err = {0};
    CHECKF(hpl_device_from_kv(&pr, &e, &err) == 0, "%s", err.msg);
    CHECK(e.n_types == 2 && e.ts[1].type == HQ_TYPE_Q4_K && e.ts[1].matmul_gbps == 11.5 && e.ts[1].matvec_map_gbps == 2.5 &&
          e.ts[1].matmul_map_gbps == 9.75 && e.budget == d.budget &&
          e.cpu_quota == 0.5 && e.cpu_period_ms == 10 && e.tick_ms == 4 && e.disk_gbps == 0.25 && e.disk_cpu_ms_gb == 11.5 && !strcmp(e.name, d.name) &&
          !strcmp(e.disk_id, d.disk_id));
    /* a peer's nonsense is refused, not believed */
    pr.kv[1].value = hn_cstr("-3");
    CHECK(hpl_device_from_kv(&pr, &e, &err) == HR_EPROTO);
    CHECK(hpl_parse_cpu_max("50000 100000\n") == 0.5 && hpl_parse_cpu_max("max 100000") == 0 &&
          hpl_parse_cpu_max("") == 0 && hpl_parse_cpu_max("200000 100000") == 2);
}

/* HALO's Algorithm 3 example (III-B4): 8 groups prioritised 1..8, PLRs [0.0, 0.5, 0.1], ratios
   [0.4, 0.4, 0.2] -> [1,2,3], [6,7,8], [4,5] */
static void test_place_groups(void) {
    hr_err err = {0};
    double imp[8], loss[3] = {0.0, 0.5, 0.1}, ratio[3] = {0.4, 0.4, 0.2};
    for (int i = 0; i < 8; i++) imp[i] = 8 - i; /* group i has priority i+1 */
    int32_t count[3], assign[8];
    CHECK(hpl_group_counts(ratio, 3, 8, count, &err) == 0);
    CHECK(count[0] == 3 && count[1] == 3 && count[2] == 2);
    CHECK(hpl_place_groups(imp, 8, loss, count, 3, assign, &err) == 0);
    const int32_t want[8] = {0, 0, 0, 2, 2, 1, 1, 1};
    for (int i = 0; i < 8; i++) CHECKF(assign[i] == want[i], "group %d on device %d, want %d", i, assign[i], want[i]);
    /* importance out of order: the two least important go to the lossiest device whatever their index */
    double imp2[4] = {0.1, 5, 0.2, 3}, loss2[2] = {0.05, 0};
    int32_t count2[2] = {2, 2}, assign2[4];
    CHECK(hpl_place_groups(imp2, 4, loss2, count2, 2, assign2, &err) == 0);
    CHECK(assign2[0] == 0 && assign2[2] == 0 && assign2[1] == 1 && assign2[3] == 1);
    /* counts that do not add up, a loss rate outside [0, 1] */
    int32_t bad[2] = {1, 2};
    CHECK(hpl_place_groups(imp2, 4, loss2, bad, 2, assign2, &err) == HR_EINVAL);
    double loss3[2] = {0, 1.5};
    CHECK(hpl_place_groups(imp2, 4, loss3, count2, 2, assign2, &err) == HR_EINVAL);
}

static void test_importance_file(void) {
    hr_err err = {0};
    hpl_importance a = {.n_layer = 2, .n_embd = 8, .att_kv = 1, .ff = 32, .n_groups = {2, 3}, .tokens = 7};
    snprintf(a.model, sizeof a.model, "test");
    REQUIRE_VOID(hpl_importance_alloc(&a, &err) == 0);
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 2 * a.n_groups[b]; i++) a.imp[b][i] = 0.25 * (i + 1) + b;
    char path[] = "/tmp/test-plan-imp-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE_VOID(fd >= 0);
    close(fd);
    CHECK(hpl_importance_write(&a, path, &err) == 0);
    hpl_importance r;
    CHECK(hpl_importance_read(&r, path, &err) == 0);
    CHECK(r.n_layer == 2 && r.n_embd == 8 && r.att_kv == 1 && r.ff == 32 && r.n_groups[0] == 2 &&
          r.n_groups[1] == 3 && r.tokens == 7 && !strcmp(r.model, "test"));
    for (int b = 0; b < 2 && r.imp[b]; b++)
        for (int i = 0; i < 2 * a.n_groups[b]; i++) CHECK(fabs(r.imp[b][i] - a.imp[b][i]) < 1e-6);
    hpl_importance_free(&r);
    /* a row of the wrong length is refused */
    FILE *f = fopen(path, "w");
    REQUIRE_VOID(f);
    fputs("{\"format\":\"hearth-importance\",\"version\":1,\"n_layer\":1,\"n_embd\":8,\"tokens\":1,"
          "\"attention\":{\"kv_heads_per_group\":1,\"groups\":2,\"importance\":[[1]]},"
          "\"ffn\":{\"neurons_per_group\":1,\"groups\":1,\"importance\":[[1]]}}", f);
    fclose(f);
    CHECK(hpl_importance_read(&r, path, &err) == HR_EFORMAT);
    unlink(path);
    hpl_importance_free(&a);
}

/* The profile measures the types asked for (the model's) only, and a later profile for another model
   measures just the types the cache lacks, keeping the others as they were; a head's mask naming a
   type that is no weight type (Q8_K, an activation type) measures nothing for it. */
static void test_profile_types(void) {
    char dir[] = "/tmp/test-plan-prof.XXXXXX", file[64];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(file, sizeof file, "%s/profile.json", dir);
    hpl_profile_params p = hpl_profile_default_params();
    p.n_threads = 1;
    p.bench_ms = 6;
    p.cache_path = file;
    p.disk_path = dir;
    p.types = 1u << HQ_TYPE_Q4_0;
    hpl_device a, b, c;
    hr_err err = {0};
    CHECKF(hpl_profile_self(&p, &a, &err) == 0, "%s", err.msg);
    CHECK(!a.cached && a.n_types == 1 && a.ts[0].type == HQ_TYPE_Q4_0 && a.ts[0].matvec_gbps > 0 &&
          a.ts[0].matvec_map_gbps > 0 && a.ts[0].matmul_map_gbps > 0);
    CHECK(hpl_profile_self(&p, &b, &err) == 0 && b.cached && b.n_types == 1 && b.ts[0].matvec_map_gbps == a.ts[0].matvec_map_gbps);
    CHECKF(a.disk_gbps <= 0 || a.disk_cpu_ms_gb > 0, "a cold read of %.2f GB/s took no CPU", a.disk_gbps);
    CHECK(b.disk_gbps == a.disk_gbps && b.disk_cpu_ms_gb == a.disk_cpu_ms_gb);
    p.types |= 1u << HQ_TYPE_Q8_0;
    CHECK(hpl_profile_self(&p, &c, &err) == 0 && !c.cached && c.n_types == 2);
    bool q8 = false, q4_same = false;
    for (int i = 0; i < c.n_types; i++) {
        q8 |= c.ts[i].type == HQ_TYPE_Q8_0 && c.ts[i].matvec_gbps > 0;
        q4_same |= c.ts[i].type == HQ_TYPE_Q4_0 && c.ts[i].matvec_gbps == a.ts[0].matvec_gbps;
    }
    CHECK(q8 && q4_same && c.disk_gbps == a.disk_gbps && c.mem_bw_gbps == a.mem_bw_gbps);
    p.types = 1u << HQ_TYPE_Q8_K;
    CHECK(hpl_profile_self(&p, &b, &err) == 0 && b.n_types == 2);
    for (int i = 0; i < b.n_types; i++) CHECK(b.ts[i].type != HQ_TYPE_Q8_K);
    unlink(file);
    rmdir(dir);
}

/* ---- the neighbours of a pipeline (what --plan-trial measures beside the candidates) --------------------- */
static void test_neighbours(void) {
    hpl_cluster c = {.n = 3};
    for (int i = 0; i < 3; i++) c.dev[i] = dev(8, 2000 * MIB, 1.0);
    links(&c, 1.0, 0.1);
    hpl_model m = model(16, 30 * MIB, 50 * MIB, 1 * MIB);
    hr_err err = {0};
    static hpl_plan nb[HPL_MAX_NEIGHBOURS];
    /* 0,16 over the head and one worker: the head takes a layer (1,15); the windows halve (0,8: 2 trips); the
       worker never gives its last layer (16 is its only window, so 0,16 -> 0+1,15 is the one move), and one
       trip cannot be halved */
    hpl_plan p = {.kind = HPL_PP, .n = 2, .dev = {0, 2}, .window = {0, 16}};
    CHECK(hpl_cost(&c, &m, 128, &p, &err) == 0 && p.feasible && p.trips == 1);
    int n = hpl_neighbours(&c, &m, 128, &p, nb, HPL_MAX_NEIGHBOURS);
    CHECKF(n == 2, "%d neighbours of 0,16", n);
    bool one = false, halved = false;
    for (int i = 0; i < n; i++) {
        CHECK(nb[i].feasible && nb[i].kind == HPL_PP && nb[i].dev[1] == 2 && nb[i].ms_per_token > 0);
        one = one || (nb[i].window[0] == 1 && nb[i].window[1] == 15 && nb[i].trips == 1);
        halved = halved || (nb[i].window[0] == 0 && nb[i].window[1] == 8 && nb[i].trips == 2);
    }
    CHECK(one && halved);
    /* three stages, 2 trips: every move between two stages that leaves each worker a layer (6 of them), the
       windows doubled (1 trip); not halved (odd windows) */
    hpl_plan q = {.kind = HPL_PP, .n = 3, .dev = {0, 1, 2}, .window = {2, 3, 3}};
    CHECK(hpl_cost(&c, &m, 128, &q, &err) == 0 && q.trips == 2);
    n = hpl_neighbours(&c, &m, 128, &q, nb, HPL_MAX_NEIGHBOURS);
    CHECKF(n == 7, "%d neighbours of 2,3,3 x2", n);
    int sum_ok = 0, doubled = 0;
    for (int i = 0; i < n; i++) {
        int s = nb[i].window[0] + nb[i].window[1] + nb[i].window[2];
        sum_ok += s == 8 && nb[i].window[1] >= 1 && nb[i].window[2] >= 1;
        doubled += s == 16 && nb[i].trips == 1;
    }
    CHECK(sum_ok == 6 && doubled == 1);
    /* a cap, and a single device has none */
    CHECK(hpl_neighbours(&c, &m, 128, &q, nb, 3) == 3);
    hpl_plan one_dev = {.kind = HPL_SINGLE, .n = 1, .dev = {0}};
    CHECK(hpl_neighbours(&c, &m, 128, &one_dev, nb, HPL_MAX_NEIGHBOURS) == 0);
    /* TP: the head's share 0.1 and 0.2 up and 0.1 down, the workers' scaled in proportion (2:1 kept) */
    hpl_plan t = {.kind = HPL_TP, .n = 3, .dev = {0, 1, 2}, .share = {0.4, 0.4, 0.2}};
    n = hpl_neighbours(&c, &m, 128, &t, nb, HPL_MAX_NEIGHBOURS);
    CHECKF(n == 3, "%d neighbours of tp 0.4,0.4,0.2", n);
    const double want_head[3] = {0.5, 0.6, 0.3};
    for (int i = 0; i < n; i++) {
        CHECK(nb[i].kind == HPL_TP && nb[i].feasible && nb[i].ms_per_token > 0);
        CHECKF(fabs(nb[i].share[0] - want_head[i]) < 1e-12, "head %g", nb[i].share[0]);
        CHECK(fabs(nb[i].share[0] + nb[i].share[1] + nb[i].share[2] - 1) < 1e-12);
        CHECK(fabs(nb[i].share[1] - 2 * nb[i].share[2]) < 1e-12);
    }
    /* none that leaves a member under 1/64: the head at 0.05 can only go up */
    hpl_plan t2 = {.kind = HPL_TP, .n = 2, .dev = {0, 1}, .share = {0.05, 0.95}};
    CHECK(hpl_neighbours(&c, &m, 128, &t2, nb, HPL_MAX_NEIGHBOURS) == 2 && fabs(nb[0].share[0] - 0.15) < 1e-12);
    /* a neighbour that does not fit is left out: a worker whose budget (given) holds the scratch, one block
       of weights and the KV cache of 8 layers, not of 9 (its weights stream); of 8,8 that leaves 9,7 and 4,4 x2 */
    c.dev[2] = dev(8, 8 * MIB + 20 * MIB + 8.5 * MIB, 1.0);
    c.dev[2].budget_set = true;
    hpl_plan r = {.kind = HPL_PP, .n = 2, .dev = {0, 2}, .window = {8, 8}};
    CHECK(hpl_cost(&c, &m, 128, &r, &err) == 0 && r.feasible);
    hpl_plan r9 = r;
    r9.window[0] = 7, r9.window[1] = 9;
    CHECK(hpl_cost(&c, &m, 128, &r9, &err) == 0 && !r9.feasible);
    n = hpl_neighbours(&c, &m, 128, &r, nb, HPL_MAX_NEIGHBOURS);
    CHECKF(n == 2, "%d neighbours of 8,8 on a small worker", n);
    for (int i = 0; i < n; i++) CHECKF(nb[i].window[1] <= 8, "a neighbour beyond the worker's budget: %d,%d", nb[i].window[0], nb[i].window[1]);
}

int main(void) {
    test_profile_types();
    test_ilp_enumerate();
    test_minmax_brute();
    test_winners();
    test_hybrid();
    test_hybrid_worker();
    test_loss();
    test_single_cost();
    test_pp_trip_hops();
    test_quota_burst();
    test_quota();
    test_mmap_fallback();
    test_mapped_speed();
    test_loader_cpu();
    test_tp_stream_waits();
    test_shared_disk();
    test_stream_blocked();
    test_pp_stream_sim();
    test_single_stream_sim();
    test_neighbours();
    test_kv_roundtrip();
    test_place_groups();
    test_importance_file();
    return test_summary();
}
