/* plan/links: the head profiles the cluster — every worker's device profile (PROFILE_REQ with
   HN_PROFILE_DEVICE, measured on all devices at once) and every head <-> worker link (RTT: the median of
   small round trips; throughput: one PROBE of a few MiB), then every worker <-> worker link, measured by
   one of the two (LINK_PROBE) — see plan.h and docs/planner.md */
#include "plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

hpl_cluster_params hpl_cluster_default_params(void) {
    return (hpl_cluster_params){.self = hpl_profile_default_params(), .timeout_ms = 20000, .n_pings = 9,
                                .probe_bytes = 4u << 20, .peer_links = true, .loss_count = HPL_LOSS_COUNT,
                                .loss_interval_us = HPL_LOSS_INTERVAL_US};
}

static int hpl_peer_fail(int i, const char *addr, const hr_err *e, hr_err *err) {
    return hr_fail(err, e->code, "worker %d at %s: %s", i, addr, e->msg);
}

/* the link from worker a to worker b, measured by a (LINK_PROBE); false (the estimate stays) if a
   could not */
static bool hpl_peer_link(hc_probe_conn *pc, const char *b_addr, const hpl_cluster_params *p, hpl_link *out, hr_err *e) {
    hn_msg m = {.type = HN_MSG_LINK_PROBE};
    m.u.link_probe = (hn_link_probe){hn_cstr(b_addr), (uint32_t)HR_MAX(1, HR_MIN(p->n_pings, HN_MAX_PINGS)), p->probe_bytes};
    if (hc_probe_request(pc, &m, HN_MSG_PROFILE, p->timeout_ms, e)) return false;
    char v[HN_MAX_VALUE + 1], esc[HN_MAX_VALUE * 4 + 1];
    if (hn_profile_get(&m.u.profile, "error", v, sizeof v)) {
        hr_fail(e, HR_ENET, "%s", hr_escape(esc, sizeof esc, v, strlen(v)));
        return false;
    }
    const double rtt = hn_profile_num(&m.u.profile, "rtt_ms", -1), gbps = hn_profile_num(&m.u.profile, "gbps", -1);
    if (!(rtt > 0 && rtt < 1e6 && gbps > 0 && gbps < 1e6)) {
        hr_fail(e, HR_EPROTO, "an answer without rtt_ms and gbps");
        return false;
    }
    *out = (hpl_link){.rtt_ms = rtt, .gbps = gbps};
    return true;
}

/* the link's datagram loss (LOSS_PROBE), both ways; the worker waits for the echoes a few RTTs */
static int hpl_link_loss(hc_probe_conn *pc, const hpl_cluster_params *p, hpl_link *l, hr_err *e) {
    hc_loss_params lp = {.count = (uint32_t)HR_MIN(p->loss_count, HN_MAX_LOSS_PROBE),
                         .interval_us = (uint32_t)HR_MAX(0, p->loss_interval_us), .elems = HPL_LOSS_ELEMS,
                         .wait_ms = (uint32_t)HR_MIN(HN_MAX_LOSS_WAIT_MS, HR_MAX(30, 4 * l->rtt_ms)),
                         .drop_seed = p->loss_drop_seed, .drop_ppm = p->loss_drop_ppm};
    if ((uint64_t)lp.count * lp.interval_us > HN_MAX_LOSS_PROBE_US) lp.interval_us = HN_MAX_LOSS_PROBE_US / lp.count;
    hc_loss_result r;
    if (hc_probe_loss(pc, &lp, p->timeout_ms, &r, e)) return e->code;
    l->loss = r.loss;
    l->loss_to = r.down;   /* head -> worker */
    l->loss_from = r.up;
    l->loss_samples = (int)(r.count + r.received);
    return 0;
}

void hpl_link_both(hpl_cluster *c, int a, int b, hpl_link l) {
    c->link[a][b] = l;
    c->link[b][a] = l;
    c->link[b][a].loss_to = l.loss_from;
    c->link[b][a].loss_from = l.loss_to;
}

int hpl_cluster_profile(const char *const *workers, int nw, const hpl_cluster_params *p, hpl_cluster *out, hr_err *err) {
    int64_t t0 = hr_time_ns();
    memset(out, 0, sizeof *out);
    if (nw < 0 || nw + 1 > HPL_MAX_DEVICES) return hr_fail(err, HR_ERANGE, "the planner takes at most %d workers", HPL_MAX_DEVICES - 1);
    if (p->probe_bytes > HN_MAX_PROBE) return hr_fail(err, HR_ERANGE, "probe of %u bytes (at most %u)", p->probe_bytes, HN_MAX_PROBE);
    out->n = 1 + nw;
    snprintf(out->addr[0], sizeof out->addr[0], "head");
    hc_probe_conn w[HPL_MAX_DEVICES] = {0};
    int rc = 0;
    char host[64] = "head", me[HN_MAX_NAME];
    gethostname(host, sizeof host - 1);
    snprintf(me, sizeof me, "planner %s", host);
    hr_err e = {0};
    for (int i = 1; i <= nw && !rc; i++) {
        snprintf(out->addr[i], sizeof out->addr[i], "%s", workers[i - 1]);
        if (hc_probe_open(&w[i], workers[i - 1], p->key, me, p->timeout_ms, &e)) {
            rc = hpl_peer_fail(out->failed = i, workers[i - 1], &e, err);
            break;
        }
        /* every worker measures itself while the head does (or, serial, one after the other) */
        hn_msg m = {.type = HN_MSG_PROFILE_REQ};
        m.u.profile_req.flags = HN_PROFILE_DEVICE | (p->self.no_cache ? HN_PROFILE_BENCH : 0);
        m.u.profile_req.types = p->self.types;
        if (hc_probe_request(&w[i], &m, p->serial ? HN_MSG_PROFILE : 0, p->timeout_ms, &e) ||
            (p->serial && hpl_device_from_kv(&m.u.profile, &out->dev[i], &e)))
            rc = hpl_peer_fail(out->failed = i, workers[i - 1], &e, err);
    }
    if (!rc) rc = hpl_profile_self(&p->self, &out->dev[0], err);
    snprintf(out->dev[0].name, sizeof out->dev[0].name, "head %s", host);
    for (int i = 1; i <= nw && !rc && !p->serial; i++) {
        hn_msg m;
        if (hc_probe_expect(&w[i], HN_MSG_PROFILE, &m, p->timeout_ms, &e) || hpl_device_from_kv(&m.u.profile, &out->dev[i], &e))
            rc = hpl_peer_fail(out->failed = i, workers[i - 1], &e, err);
    }
    for (int i = 1; i <= nw && !rc; i++) {
        hpl_link *l = &out->link[0][i];
        if (hc_probe_link(&w[i], p->n_pings, p->probe_bytes, p->timeout_ms, &l->rtt_ms, &l->gbps, &e))
            rc = hpl_peer_fail(out->failed = i, workers[i - 1], &e, err);
        else if (p->loss_count > 0 && hpl_link_loss(&w[i], p, l, &e)) {
            /* a measurement, not the plan's premise: a worker that cannot (an older one refuses the
               message) leaves the loss unknown, taken as none, and the profile goes on */
            HR_LOGW("plan: the datagram loss of the link to worker %d at %s: %s; taken as none", i, workers[i - 1], e.msg);
            e = (hr_err){0};
        }
        hpl_link_both(out, 0, i, *l);
    }
    for (int i = 1; i <= nw; i++) hc_probe_close(&w[i], !rc); /* the workers are free again */
    /* worker <-> worker: first an estimate — a household's devices meet at one switch or access point,
       so a path between two workers is about half of each one's path to the head — then, when asked,
       measured by one of the two (LINK_PROBE; the other must be free: its session with us is over) */
    for (int a = 1; a <= nw && !rc; a++)
        for (int b = 1; b <= nw; b++)
            if (a != b)
                out->link[a][b] = (hpl_link){(out->link[0][a].rtt_ms + out->link[0][b].rtt_ms) / 2,
                                             HR_MIN(out->link[0][a].gbps, out->link[0][b].gbps), true,
                                             /* both paths cross the same access point: the mean */
                                             (out->link[0][a].loss + out->link[0][b].loss) / 2,
                                             (out->link[0][a].loss_from + out->link[0][b].loss_to) / 2,
                                             (out->link[0][b].loss_from + out->link[0][a].loss_to) / 2, 0, 0};
    for (int a = 1; a < nw && !rc && p->peer_links; a++) {
        hc_probe_conn pc;
        e = (hr_err){0};
        if (hc_probe_open(&pc, workers[a - 1], p->key, me, p->timeout_ms, &e)) {
            HR_LOGW("plan: worker %d at %s: %s; its links to the other workers are estimated", a, workers[a - 1], e.msg);
            hc_probe_close(&pc, false);
            continue;
        }
        for (int b = a + 1; b <= nw; b++) {
            hpl_link l;
            e = (hr_err){0};
            if (hpl_peer_link(&pc, workers[b - 1], p, &l, &e)) {
                /* RTT and throughput measured; the loss stays the estimate (no datagrams between workers) */
                l.loss = out->link[a][b].loss;
                l.loss_to = out->link[a][b].loss_to;
                l.loss_from = out->link[a][b].loss_from;
                hpl_link_both(out, a, b, l);
            }
            else HR_LOGW("plan: the link from worker %d to worker %d: %s; estimated", a, b, e.msg);
            if (e.code && e.code != HR_ENET) break; /* the session itself failed */
        }
        hc_probe_close(&pc, true);
    }
    if (!rc) hpl_links_unlimit(out); /* a TCP probe over a lossy link measured TCP's loss-limited rate (loss.c) */
    out->profile_ms = (double)(hr_time_ns() - t0) / 1e6;
    return rc;
}
