/* plan/links: the head profiles the cluster — every worker's device profile (PROFILE_REQ with
   HN_PROFILE_DEVICE, measured on all devices at once) and every head <-> worker link (RTT: the median of
   small round trips; throughput: one PROBE of a few MiB) — see plan.h and docs/planner.md */
#include "plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

hpl_cluster_params hpl_cluster_default_params(void) {
    return (hpl_cluster_params){.self = hpl_profile_default_params(), .timeout_ms = 20000, .n_pings = 9,
                                .probe_bytes = 4u << 20};
}

typedef struct hpl_peer {
    hn_conn  *conn;
    hn_frame  rx;
    uint32_t  seq;
    const char *addr;
} hpl_peer;

static int hpl_peer_fail(const hpl_peer *w, int i, int code, const char *msg, hr_err *err) {
    return hr_fail(err, code, "worker %d at %s: %s", i, w->addr, msg);
}

static int hpl_send(hpl_peer *w, int i, hn_msg *m, int timeout_ms, hr_err *err) {
    hr_err e = {0};
    m->seq = ++w->seq;
    if (hn_msg_send(w->conn, m, hn_deadline_ms(timeout_ms), &e)) return hpl_peer_fail(w, i, e.code, e.msg, err);
    return 0;
}

static int hpl_expect(hpl_peer *w, int i, int want, hn_msg *m, int timeout_ms, hr_err *err) {
    hr_err e = {0};
    if (hn_msg_recv(w->conn, &w->rx, m, hn_deadline_ms(timeout_ms), &e)) return hpl_peer_fail(w, i, e.code, e.msg, err);
    if (m->type == HN_MSG_ERROR) {
        char why[HN_MAX_MESSAGE + 32];
        hr_escape(why, sizeof why, m->u.error.message.s, m->u.error.message.n);
        return hpl_peer_fail(w, i, HR_EPROTO, why, err);
    }
    if (m->type != want) {
        char why[128];
        snprintf(why, sizeof why, "answered %s where %s was expected", hn_msg_name(m->type), hn_msg_name(want));
        return hpl_peer_fail(w, i, HR_EPROTO, why, err);
    }
    return 0;
}

static int hpl_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* RTT (median of n small round trips) and throughput (one PROBE of `bytes`) of the link to w */
static int hpl_measure_link(hpl_peer *w, int i, const hpl_cluster_params *p, const uint8_t *data, hpl_link *out,
                            hr_err *err) {
    double t[64];
    int n = HR_MAX(1, HR_MIN(p->n_pings, 64));
    for (int k = 0; k < n; k++) {
        hn_msg m = {.type = HN_MSG_PROFILE_REQ};
        int64_t t0 = hr_time_ns();
        if (hpl_send(w, i, &m, p->timeout_ms, err) || hpl_expect(w, i, HN_MSG_PROFILE, &m, p->timeout_ms, err))
            return err->code;
        t[k] = (double)(hr_time_ns() - t0) / 1e6;
    }
    qsort(t, (size_t)n, sizeof t[0], hpl_cmp_double);
    out->rtt_ms = t[n / 2];
    hn_msg m = {.type = HN_MSG_PROBE};
    m.u.probe = (hn_probe){.reply_bytes = 0, .n = p->probe_bytes, .data = data};
    int64_t t0 = hr_time_ns();
    if (hpl_send(w, i, &m, p->timeout_ms, err) || hpl_expect(w, i, HN_MSG_PROBE, &m, p->timeout_ms, err)) return err->code;
    double ms = (double)(hr_time_ns() - t0) / 1e6 - out->rtt_ms;
    out->gbps = p->probe_bytes / (HR_MAX(ms, 1e-3) * 1e6);
    out->estimated = false;
    return 0;
}

int hpl_cluster_profile(const char *const *workers, int nw, const hpl_cluster_params *p, hpl_cluster *out, hr_err *err) {
    int64_t t0 = hr_time_ns();
    memset(out, 0, sizeof *out);
    if (nw < 0 || nw + 1 > HPL_MAX_DEVICES) return hr_fail(err, HR_ERANGE, "the planner takes at most %d workers", HPL_MAX_DEVICES - 1);
    if (p->probe_bytes > HN_MAX_PROBE) return hr_fail(err, HR_ERANGE, "probe of %u bytes (at most %u)", p->probe_bytes, HN_MAX_PROBE);
    out->n = 1 + nw;
    snprintf(out->addr[0], sizeof out->addr[0], "head");
    hpl_peer w[HPL_MAX_DEVICES] = {0};
    uint8_t *data = NULL;
    int rc = 0;
    char host[64] = "head", me[HN_MAX_NAME];
    gethostname(host, sizeof host - 1);
    snprintf(me, sizeof me, "planner %s", host);
    for (int i = 1; i <= nw && !rc; i++) {
        hr_err e = {0};
        w[i].addr = workers[i - 1];
        snprintf(out->addr[i], sizeof out->addr[i], "%s", workers[i - 1]);
        if (!(w[i].conn = hn_connect(w[i].addr, hn_deadline_ms(p->timeout_ms), &e))) {
            rc = hpl_peer_fail(&w[i], i, e.code, e.msg, err);
            break;
        }
        hn_msg m = {.type = HN_MSG_HELLO};
        m.u.hello = (hn_hello){.version_min = HN_PROTO_VERSION, .version_max = HN_PROTO_VERSION, .caps = HN_CAP_F32_ACT,
                               .device = hn_cstr(me)};
        if ((rc = hpl_send(&w[i], i, &m, p->timeout_ms, err)) || (rc = hpl_expect(&w[i], i, HN_MSG_HELLO_ACK, &m, p->timeout_ms, err)))
            break;
        /* every worker measures itself while the head does */
        m = (hn_msg){.type = HN_MSG_PROFILE_REQ};
        m.u.profile_req.flags = HN_PROFILE_DEVICE;
        rc = hpl_send(&w[i], i, &m, p->timeout_ms, err);
    }
    if (!rc) rc = hpl_profile_self(&p->self, &out->dev[0], err);
    snprintf(out->dev[0].name, sizeof out->dev[0].name, "head %s", host);
    for (int i = 1; i <= nw && !rc; i++) {
        hn_msg m;
        if ((rc = hpl_expect(&w[i], i, HN_MSG_PROFILE, &m, p->timeout_ms, err))) break;
        hr_err e = {0};
        if (hpl_device_from_kv(&m.u.profile, &out->dev[i], &e)) rc = hpl_peer_fail(&w[i], i, e.code, e.msg, err);
    }
    if (!rc && nw > 0 && !(data = calloc(1, p->probe_bytes ? p->probe_bytes : 1))) rc = hr_fail(err, HR_ENOMEM, "out of memory");
    for (int i = 1; i <= nw && !rc; i++) {
        rc = hpl_measure_link(&w[i], i, p, data, &out->link[0][i], err);
        out->link[i][0] = out->link[0][i];
    }
    /* worker <-> worker: not measured; a household's devices meet at one switch or access point, so
       a path between two workers is taken as half of each one's path to the head */
    for (int a = 1; a <= nw && !rc; a++)
        for (int b = 1; b <= nw; b++) {
            if (a == b) continue;
            out->link[a][b] = (hpl_link){(out->link[0][a].rtt_ms + out->link[0][b].rtt_ms) / 2,
                                         HR_MIN(out->link[0][a].gbps, out->link[0][b].gbps), true};
        }
    for (int i = 1; i <= nw; i++) {
        if (!w[i].conn) continue;
        if (!rc) {
            hn_msg m = {.type = HN_MSG_BYE};
            m.u.bye = (hn_bye){0, hn_cstr("profile done")};
            hr_err e = {0};
            hpl_send(&w[i], i, &m, 1000, &e);
        }
        hn_conn_close(w[i].conn);
        hn_frame_free(&w[i].rx);
    }
    free(data);
    out->profile_ms = (double)(hr_time_ns() - t0) / 1e6;
    return rc;
}
