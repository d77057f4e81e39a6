/* cluster/probe: a link's RTT and throughput, measured over a session with a worker — by the planner
   (head <-> worker) and by a worker the planner asks (LINK_PROBE: worker <-> worker); see cluster.h */
#include "cluster-impl.h"

#include <stdio.h>
#include <stdlib.h>

static int hc_probe_send(hc_probe_conn *pc, hn_msg *m, int timeout_ms, hr_err *err) {
    m->seq = ++pc->seq;
    return hn_msg_send(pc->conn, m, hn_deadline_ms(timeout_ms), err);
}

int hc_probe_expect(hc_probe_conn *pc, int want, hn_msg *m, int timeout_ms, hr_err *err) {
    if (hn_msg_recv(pc->conn, &pc->rx, m, hn_deadline_ms(timeout_ms), err)) return err->code;
    if (m->type == HN_MSG_ERROR) {
        char why[HN_MAX_MESSAGE + 32];
        hr_escape(why, sizeof why, m->u.error.message.s, m->u.error.message.n);
        return hr_fail(err, m->u.error.code < 0 ? m->u.error.code : HR_EPROTO, "%s", why);
    }
    if (m->type != want)
        return hr_fail(err, HR_EPROTO, "answered %s where %s was expected", hn_msg_name(m->type), hn_msg_name(want));
    return 0;
}

int hc_probe_request(hc_probe_conn *pc, hn_msg *m, int want, int timeout_ms, hr_err *err) {
    if (hc_probe_send(pc, m, timeout_ms, err)) return err->code;
    return want ? hc_probe_expect(pc, want, m, timeout_ms, err) : 0;
}

int hc_probe_open(hc_probe_conn *pc, const char *addr, const hn_key *key, const char *me, int timeout_ms, hr_err *err) {
    memset(pc, 0, sizeof *pc);
    if (!(pc->conn = hn_connect_secure(addr, key, hn_deadline_ms(timeout_ms), err))) return err->code;
    hn_msg m = {.type = HN_MSG_HELLO};
    m.u.hello = (hn_hello){.version_min = HN_PROTO_VERSION, .version_max = HN_PROTO_VERSION,
                           .caps = HN_CAP_F32_ACT | (key ? HN_CAP_ENCRYPT : 0), .device = hn_cstr(me)};
    if (hc_probe_request(pc, &m, HN_MSG_HELLO_ACK, timeout_ms, err)) return err->code;
    if (m.u.hello_ack.version != HN_PROTO_VERSION) return hr_fail(err, HR_EUNSUPPORTED, "chose another protocol version");
    return 0;
}

void hc_probe_close(hc_probe_conn *pc, bool bye) {
    if (pc->conn && bye) {
        hn_msg m = {.type = HN_MSG_BYE};
        m.u.bye = (hn_bye){0, hn_cstr("measured")};
        hr_err e = {0};
        hc_probe_send(pc, &m, 1000, &e);
    }
    hn_conn_close(pc->conn);
    hn_frame_free(&pc->rx);
    memset(pc, 0, sizeof *pc);
}

static int hc_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int hc_probe_link(hc_probe_conn *pc, int n_pings, uint32_t bytes, int timeout_ms, double *rtt_ms, double *gbps,
                  hr_err *err) {
    double t[HN_MAX_PINGS];
    int n = HR_MAX(1, HR_MIN(n_pings, HN_MAX_PINGS));
    if (bytes > HN_MAX_PROBE) return hr_fail(err, HR_ERANGE, "a probe of %u bytes (at most %u)", bytes, HN_MAX_PROBE);
    for (int k = 0; k < n; k++) { /* empty PROFILE_REQs: the smallest round trip the protocol has */
        hn_msg m = {.type = HN_MSG_PROFILE_REQ};
        int64_t t0 = hr_time_ns();
        if (hc_probe_request(pc, &m, HN_MSG_PROFILE, timeout_ms, err)) return err->code;
        t[k] = (double)(hr_time_ns() - t0) / 1e6;
    }
    qsort(t, (size_t)n, sizeof t[0], hc_cmp_double);
    *rtt_ms = t[n / 2];
    *gbps = 0;
    if (!bytes) return 0;
    uint8_t *data = calloc(1, bytes);
    if (!data) return hr_fail(err, HR_ENOMEM, "out of memory");
    hn_msg m = {.type = HN_MSG_PROBE};
    m.u.probe = (hn_probe){.reply_bytes = 0, .n = bytes, .data = data};
    int64_t t0 = hr_time_ns();
    int rc = hc_probe_request(pc, &m, HN_MSG_PROBE, timeout_ms, err);
    double ms = (double)(hr_time_ns() - t0) / 1e6 - *rtt_ms;
    free(data);
    if (rc) return rc;
    *gbps = bytes / (HR_MAX(ms, 1e-3) * 1e6);
    return 0;
}
