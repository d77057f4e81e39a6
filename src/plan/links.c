/* plan/links: the head profiles the cluster — every worker's device profile (PROFILE_REQ with
   HN_PROFILE_DEVICE, measured on all devices at once) and every head <-> worker link (RTT: the median of
   small round trips; throughput: one PROBE of a few MiB, or the link cache; datagram loss: the loss probes,
   all at once), then every worker <-> worker link, measured by one of the two (LINK_PROBE) or cached — see
   plan.h and docs/planner.md */
#include "plan.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
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

/* the link's datagram loss (LOSS_PROBE), both ways; the worker waits for the echoes a few RTTs, and while
   they still come, HPL_LOSS_GAP_MS after the latest: a head with a quarter core echoing seven probes at
   once (klonet8) paused one probe's echoes 30-45 ms, and 30 ms had priced its lossless links at 2-86% */
#define HPL_LOSS_GAP_MS 100
static int hpl_link_loss(hc_probe_conn *pc, const hpl_cluster_params *p, hpl_link *l, hr_err *e) {
    hc_loss_params lp = {.count = (uint32_t)HR_MIN(p->loss_count, HN_MAX_LOSS_PROBE),
                         .interval_us = (uint32_t)HR_MAX(0, p->loss_interval_us), .elems = HPL_LOSS_ELEMS,
                         .wait_ms = (uint32_t)HR_MIN(HN_MAX_LOSS_WAIT_MS, HR_MAX(HPL_LOSS_GAP_MS, 4 * l->rtt_ms)),
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

/* ---- the link cache (docs/planner.md, "Link cache") ------------------------------------------------------
   A link's throughput takes a 4 MiB probe: on a home's links (30-60 MB/s) ~0.1 s a link, and a 4-device
   cluster has 6 links, so most of a profile whose devices come from their caches. It
   changes little while the devices stay where they are, and when a path changes (another access point, a
   device moved from Ethernet to Wi-Fi) its RTT moves too. So the head keeps every measured link in
   links.json beside its profile cache: a later profile that finds an entry younger than HPL_LINK_CACHE_S
   sends HPL_LINK_CHECK_PINGS pings and, when their median is within 25% (or 0.3 ms) of the cached RTT, takes
   the cached throughput. The loss probe runs every time (what Wi-Fi's interference moves from one minute
   to the next, and what decides lossy plans). A worker <-> worker link comes from the cache when both
   workers' links to the head held. --no-cache measures everything and writes the cache again. */
#define HPL_LINK_CACHE_S      3600
#define HPL_LINK_CHECK_PINGS  5
#define HPL_LINK_CACHE_MAX    256   /* entries kept (the oldest go first) */

/* the key of the link between the devices at two addresses (one "head": this machine) and their names */
static void hpl_link_key(char *buf, size_t cap, const hpl_cluster *c, int a, int b) {
    snprintf(buf, cap, "%s|%s > %s|%s", c->addr[a], c->dev[a].name, c->addr[b], c->dev[b].name);
}

/* the cached link under key, if it is there, whole and younger than HPL_LINK_CACHE_S */
static bool hpl_link_cached(json_t *root, const char *key, hpl_link *out) {
    json_t *e = json_object_get(json_object_get(root, "links"), key);
    json_t *at = json_object_get(e, "at"), *rtt = json_object_get(e, "rtt_ms"), *g = json_object_get(e, "gbps");
    if (!json_is_number(at) || !json_is_number(rtt) || !json_is_number(g)) return false;
    double age = (double)time(NULL) - json_number_value(at), r = json_number_value(rtt), v = json_number_value(g);
    if (!(age >= 0 && age < HPL_LINK_CACHE_S && r > 0 && r < 1e6 && v > 0 && v < 1e6)) return false;
    *out = (hpl_link){.rtt_ms = r, .gbps = v, .cached = true};
    return true;
}

/* a link measured now, into the cache (the probe's throughput, before hpl_links_unlimit) */
static void hpl_link_store(json_t *root, const char *key, const hpl_link *l) {
    json_t *links = json_object_get(root, "links");
    if (!json_is_object(links)) json_object_set_new(root, "links", links = json_object());
    while (json_object_size(links) >= HPL_LINK_CACHE_MAX) {   /* the oldest entry goes */
        const char *old = NULL, *k;
        double t_old = INFINITY;
        json_t *v;
        json_object_foreach(links, k, v) {
            double t = json_number_value(json_object_get(v, "at"));
            if (!old || t < t_old) { old = k; t_old = t; }
        }
        json_object_del(links, old);
    }
    json_t *e = json_object();
    json_object_set_new(e, "at", json_integer((json_int_t)time(NULL)));
    json_object_set_new(e, "rtt_ms", json_real(l->rtt_ms));
    json_object_set_new(e, "gbps", json_real(l->gbps));
    json_object_set_new(links, key, e);
}

/* whether an RTT measured now agrees with the cached one */
static bool hpl_rtt_holds(double now, double cached) { return fabs(now - cached) <= HR_MAX(0.25 * cached, 0.3); }

/* the link to worker i: from the cache when its RTT holds (lc: the cache, NULL: measure), else measured;
   *held says which */
static int hpl_head_link(hc_probe_conn *pc, const hpl_cluster_params *p, json_t *lc, const char *key, hpl_link *l,
                         bool *held, hr_err *e) {
    hpl_link c;
    *held = false;
    if (lc && hpl_link_cached(lc, key, &c)) {
        double rtt, g;
        if (hc_probe_link(pc, HPL_LINK_CHECK_PINGS, 0, p->timeout_ms, &rtt, &g, e)) return e->code;
        if (hpl_rtt_holds(rtt, c.rtt_ms)) {
            *l = c;
            l->rtt_ms = rtt;
            *held = true;
            return 0;
        }
        HR_LOGI("plan: link %s: RTT %.2f ms, cached %.2f ms: measured again", key, rtt, c.rtt_ms);
    }
    *l = (hpl_link){0};
    return hc_probe_link(pc, p->n_pings, p->probe_bytes, p->timeout_ms, &l->rtt_ms, &l->gbps, e);
}

/* the loss probes of the head's links run at once, a thread each: a probe is ~0.1 s of small datagrams
   (1.2 MB/s) and the wait for their echoes, which do not crowd a link as the throughput probes would; one
   after another they were 0.45 s of a 4-device profile from the caches */
typedef struct hpl_loss_job {
    hc_probe_conn *pc;
    const hpl_cluster_params *p;
    hpl_link *l;
    hr_err e;
    int rc;
    pthread_t th;
    bool started;
} hpl_loss_job;

static void *hpl_loss_main(void *arg) {
    hpl_loss_job *j = arg;
    j->rc = hpl_link_loss(j->pc, j->p, j->l, &j->e);
    return NULL;
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
    /* the link cache: read unless --no-cache; written with what is measured now either way */
    char lfile[2200] = "";
    json_t *lc = NULL;
    if (!rc && !hpl_cache_file(&p->self, "links.json", lfile, sizeof lfile, &e)) lc = json_load_file(lfile, 0, NULL);
    if (!json_is_object(lc)) { json_decref(lc); lc = json_object(); }
    e = (hr_err){0};
    bool held[HPL_MAX_DEVICES] = {0}, stored = false;
    char key[512];
    for (int i = 1; i <= nw && !rc; i++) {
        hpl_link *l = &out->link[0][i];
        hpl_link_key(key, sizeof key, out, 0, i);
        if (hpl_head_link(&w[i], p, p->self.no_cache ? NULL : lc, key, l, &held[i], &e))
            rc = hpl_peer_fail(out->failed = i, workers[i - 1], &e, err);
        else if (!held[i]) {
            hpl_link_store(lc, key, l);
            stored = true;
        }
    }
    hpl_loss_job lj[HPL_MAX_DEVICES] = {0};
    for (int i = 1; i <= nw && !rc && p->loss_count > 0; i++) {
        lj[i] = (hpl_loss_job){.pc = &w[i], .p = p, .l = &out->link[0][i]};
        lj[i].started = !pthread_create(&lj[i].th, NULL, hpl_loss_main, &lj[i]);
        if (!lj[i].started) hpl_loss_main(&lj[i]);   /* no thread: this one now */
    }
    for (int i = 1; i <= nw && !rc; i++) {
        if (lj[i].started) pthread_join(lj[i].th, NULL);
        if (lj[i].rc)
            /* a measurement, not the plan's premise: a worker that cannot (an older one refuses the
               message) leaves the loss unknown, taken as none, and the profile goes on */
            HR_LOGW("plan: the datagram loss of the link to worker %d at %s: %s; taken as none", i, workers[i - 1], lj[i].e.msg);
        hpl_link_both(out, 0, i, out->link[0][i]);
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
                                             (out->link[0][b].loss_from + out->link[0][a].loss_to) / 2, 0, 0, false};
    for (int a = 1; a < nw && !rc && p->peer_links; a++) {
        /* both ends' links to the head held: their link from the cache, if it is there */
        int todo = 0;
        for (int b = a + 1; b <= nw; b++) {
            hpl_link l;
            hpl_link_key(key, sizeof key, out, a, b);
            if (!p->self.no_cache && held[a] && held[b] && hpl_link_cached(lc, key, &l)) {
                l.loss = out->link[a][b].loss;
                l.loss_to = out->link[a][b].loss_to;
                l.loss_from = out->link[a][b].loss_from;
                hpl_link_both(out, a, b, l);
            } else todo++;
        }
        if (!todo) continue;
        hc_probe_conn pc;
        e = (hr_err){0};
        if (hc_probe_open(&pc, workers[a - 1], p->key, me, p->timeout_ms, &e)) {
            HR_LOGW("plan: worker %d at %s: %s; its links to the other workers are estimated", a, workers[a - 1], e.msg);
            hc_probe_close(&pc, false);
            continue;
        }
        for (int b = a + 1; b <= nw; b++) {
            hpl_link l;
            if (out->link[a][b].cached) continue;
            e = (hr_err){0};
            if (hpl_peer_link(&pc, workers[b - 1], p, &l, &e)) {
                hpl_link_key(key, sizeof key, out, a, b);
                hpl_link_store(lc, key, &l);
                stored = true;
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
    if (!rc && stored && *lfile) hpl_json_save(lfile, lc);
    json_decref(lc);
    if (!rc) hpl_links_unlimit(out); /* a TCP probe over a lossy link measured TCP's loss-limited rate (loss.c) */
    out->profile_ms = (double)(hr_time_ns() - t0) / 1e6;
    return rc;
}
