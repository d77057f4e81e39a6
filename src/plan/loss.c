/* plan/loss: what lost packets cost a plan (issue 28) — TCP's recoveries for reliable tensor
   parallelism and pipelines, and for the lossy all-reduce (`--lossy`) what it waits for and what it
   loses. The model and its calibration are in docs/planner.md, "Loss". */
#include "plan.h"

#include <math.h>

#define HPL_TCP_MSS        1448.0  /* payload bytes of a TCP segment under a 1500-byte MTU (with timestamps) */
#define HPL_TCP_RTO_MIN_MS 200.0   /* Linux's minimum retransmission timeout */
#define HPL_TCP_PTO_MIN_MS 10.0    /* a tail-loss probe fires after about 2 RTTs, not much sooner than this */
/* the share of lost tails that wait for the retransmission timeout rather than the tail-loss probe:
   calibrated on the issue-28 testbed runs (docs/benchmarks.md: TCP TP on pi8-lossy and klonet8 at 1, 2
   and 5% loss grows by 330-500 ms/token per percent), which give a lost tail 63-110 ms */
#define HPL_TCP_TAIL_RTO   0.35
#define HPL_DGRAM_BYTES    1400.0  /* a full datagram (net.h: HN_DGRAM_MAX_BYTES) */
#define HPL_NACK_MS        1.0     /* a worker asks for the sum again 1 ms after its first datagram came */

static double hpl_loss_of(const hpl_cluster *c, int a, int b) {
    double p = c->link[a][b].loss_to;
    return p > 0 && p < 1 ? p : p >= 1 ? 0.999 : 0;
}

double hpl_tcp_recovery_ms(const hpl_cluster *c, int a, int b, double bytes) {
    double p = hpl_loss_of(c, a, b);
    if (p <= 0) return 0;
    double rtt = c->link[a][b].rtt_ms, s = HR_MAX(1, ceil(bytes / HPL_TCP_MSS));
    double tail = HPL_TCP_TAIL_RTO * HPL_TCP_RTO_MIN_MS + (1 - HPL_TCP_TAIL_RTO) * HR_MAX(2 * rtt, HPL_TCP_PTO_MIN_MS);
    return p * ((s - 1) * rtt + tail);
}

void hpl_loss_tp(const hpl_cluster *c, const hpl_model *m, int n_prompt, hpl_plan *p) {
    const double B = m->n_embd * 4.0 + 64;
    const int L = m->n_layer, np = HR_MAX(1, n_prompt), per = HR_MIN(np, HR_MAX(1, m->n_batch));
    const int nb = (np + per - 1) / per;
    double fwd = 0, ar = 0, pf = 0, no_hit = 1, rtt = 0;
    double s = HR_MAX(1, ceil(B / HPL_TCP_MSS));
    for (int i = 1; i < p->n; i++) {
        int d = p->dev[i];
        fwd += hpl_tcp_recovery_ms(c, 0, d, B);
        ar += hpl_tcp_recovery_ms(c, d, 0, B) + hpl_tcp_recovery_ms(c, 0, d, B);
        pf += hpl_tcp_recovery_ms(c, 0, d, B * per) + 2 * L * (hpl_tcp_recovery_ms(c, d, 0, B * per) +
                                                               hpl_tcp_recovery_ms(c, 0, d, B * per));
        no_hit *= pow(1 - hpl_loss_of(c, d, 0), s) * pow(1 - hpl_loss_of(c, 0, d), s);
        rtt = HR_MAX(rtt, c->link[0][d].rtt_ms);
    }
    p->p_hit = 1 - no_hit;
    /* prompts stay on TCP in both modes (docs/lossy.md): every batch's messages */
    if (isfinite(p->prefill_ms)) p->prefill_ms += nb * pf;
    if (!p->lossy) {
        p->loss_ms = fwd + 2.0 * L * ar;
    } else {
        /* layer 0's two all-reduces and FORWARD stay on TCP; the others go as datagrams of at most 341
           elements: a partial's loss costs elements, not time, unless its tail and the tail's copy are
           both lost (then the head waits the deadline); a worker that misses any of the sum's datagrams
           asks again (NACK) and waits a round trip and the resend before its next partial */
        const double D = p->deadline_ms > 0 ? p->deadline_ms : HPL_LOSSY_DEADLINE_MS;
        const double r = ceil(m->n_embd / (double)HN_DGRAM_MAX_ELEMS);
        double wait = 0, got_all = 1, resend = 0, extra_bytes = 0, lost = 0;
        for (int i = 1; i < p->n; i++) {
            int d = p->dev[i];
            double up = hpl_loss_of(c, d, 0), down = hpl_loss_of(c, 0, d);
            double g = c->link[0][d].gbps > 0 ? c->link[0][d].gbps : 0.1;
            wait += up * up * D;
            got_all *= pow(1 - down, r);
            resend = HR_MAX(resend, r * HPL_DGRAM_BYTES / (g * 1e6));
            /* the datagrams' headers and the tail's copy, both ways, beyond TCP's bytes */
            double tail = m->n_embd - (r - 1) * HN_DGRAM_MAX_ELEMS;
            extra_bytes += 2 * ((r + 1) * HN_DGRAM_HEADER + 4 * tail) / (g * 1e6);
            lost += up * m->n_embd;
        }
        double back = (1 - got_all) * (HPL_NACK_MS + rtt + resend);
        p->loss_ms = fwd + 2.0 * ar + 2.0 * (L - 1) * (wait + back);
        p->comm_ms += 2.0 * (L - 1) * extra_bytes;
        p->ms_per_token += 2.0 * (L - 1) * extra_bytes;
        p->elements_lost = lost;
        p->lost_fraction = p->n > 1 ? lost / ((p->n - 1) * (double)m->n_embd) : 0;
    }
    p->comm_ms += p->loss_ms;
    p->ms_per_token += p->loss_ms;
}

static bool hpl_loss_limited(const hpl_link *l) {
    double p = l->loss, rtt = l->rtt_ms > 0 ? l->rtt_ms : 1;
    if (!(p > 0)) return false;
    double mathis = 1.22 * HPL_TCP_MSS / (rtt * 1e-3 * sqrt(p)) / 1e9;   /* GB/s */
    return l->gbps_measured < 3 * mathis;
}

void hpl_links_unlimit(hpl_cluster *c) {
    double best = 0;
    for (int a = 0; a < c->n; a++)
        for (int b = 0; b < c->n; b++) {
            hpl_link *l = &c->link[a][b];
            if (a == b) continue;
            l->gbps_measured = l->gbps;
            if (!l->estimated && !hpl_loss_limited(l)) best = HR_MAX(best, l->gbps);
        }
    for (int a = 0; a < c->n; a++)
        for (int b = 0; b < c->n; b++)
            if (a != b && hpl_loss_limited(&c->link[a][b])) c->link[a][b].gbps = HR_MAX(c->link[a][b].gbps, best);
}
