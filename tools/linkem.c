/*
 * linkem — a link emulator for the hearth testbed: it puts delay, jitter, a rate limit and loss on
 * traffic between emulated devices when the kernel cannot (no netem), so that cluster figures are
 * measured over links that behave like Wi-Fi or a home LAN.
 *
 * Two modes share one event loop (epoll + timerfd + signalfd) and one timer heap:
 *
 *   linkem tun   — an L3 forwarder: it owns a TUN interface; the testbed routes every packet between
 *                  devices into it, linkem holds each packet for the sender's uplink and then the
 *                  receiver's downlink (rate, delay, jitter, loss per direction) and writes it back.
 *                  All protocols get the delay (ping included); packets on one link leave in the
 *                  order they came, so jitter never reorders a TCP stream.
 *   linkem relay — a TCP and UDP port relay for machines without namespaces or TUN: it accepts on
 *                  LISTEN, connects to TARGET and forwards bytes (TCP, order preserved) or datagrams
 *                  (UDP, with loss) after the configured delay, at the configured rate.
 *
 * Link model (both modes): a unit of `b` bytes entering a link at time t starts when the link is free,
 * takes b*8/rate to serialize, then `delay + U(-jitter, +jitter)` to propagate; release times on one
 * link never decrease (FIFO).  A unit whose wait for the link exceeds --queue is dropped (packets) or
 * not read yet (TCP: the relay stops reading, so the sender sees back-pressure instead of loss).
 *
 * Exit status: 0 after SIGTERM/SIGINT, 1 on a runtime error, 2 on a bad command line.
 */
#define _GNU_SOURCE /* accept4 */
#include "base/base.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <linux/virtio_net.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define LK_CONTAINER(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))
#define LK_MAX_NODES 250
#define LK_MAX_MAPS  64
#define LK_PKT_MAX   (65536 + 64)

/* ---- command-line units --------------------------------------------------------------------------- */

/* "1.5ms", "200us", "2s", "750ns"; a bare number is milliseconds. */
static int parse_time_ns(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v < 0) return -1;
    double mul = 1e6;
    if (*end == 0 || !strcmp(end, "ms")) mul = 1e6;
    else if (!strcmp(end, "us")) mul = 1e3;
    else if (!strcmp(end, "ns")) mul = 1;
    else if (!strcmp(end, "s")) mul = 1e9;
    else return -1;
    if (v * mul > 3600e9) return -1; /* an hour of delay is a typo, not a link */
    *out = (int64_t)llround(v * mul);
    return 0;
}

/* Bits per second, decimal prefixes: "300mbit", "300M", "1gbit", "1G", "100kbit", "2.5mbps"; a bare
 * number is bit/s; 0 means unlimited. */
static int parse_rate_bps(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v < 0) return -1;
    double mul = 1;
    char unit[16];
    size_t n = strlen(end);
    if (n >= sizeof unit) return -1;
    for (size_t i = 0; i <= n; i++) unit[i] = (char)((end[i] >= 'A' && end[i] <= 'Z') ? end[i] + 32 : end[i]);
    if (n == 0 || !strcmp(unit, "bit") || !strcmp(unit, "bps")) mul = 1;
    else if (!strcmp(unit, "k") || !strcmp(unit, "kbit") || !strcmp(unit, "kbps")) mul = 1e3;
    else if (!strcmp(unit, "m") || !strcmp(unit, "mbit") || !strcmp(unit, "mbps")) mul = 1e6;
    else if (!strcmp(unit, "g") || !strcmp(unit, "gbit") || !strcmp(unit, "gbps")) mul = 1e9;
    else return -1;
    if (v * mul > 1e12) return -1;
    *out = v * mul;
    return 0;
}

/* Percent in [0, 100]: "2", "2%", "0.5". Returned as a probability. */
static int parse_loss(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v < 0 || v > 100) return -1;
    if (*end && strcmp(end, "%")) return -1;
    *out = v / 100.0;
    return 0;
}

static int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end || errno || s[0] == '-' || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* ---- random numbers (splitmix64: small, seedable, good enough for loss and jitter) --------------- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ULL;
static uint64_t rng_next(void)
{
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static double rng_unit(void) { return (double)(rng_next() >> 11) * (1.0 / 9007199254740992.0); }

/* ---- timer heap ----------------------------------------------------------------------------------- */

typedef struct lk_timer lk_timer;
typedef void (*lk_fire_fn)(lk_timer *t, int64_t now);
struct lk_timer {
    int64_t    when;
    uint64_t   seq;  /* ties fire in the order they were armed, so FIFO links stay FIFO */
    size_t     idx;  /* position in the heap, SIZE_MAX when not armed */
    lk_fire_fn fire;
};

typedef struct {
    lk_timer **a;
    size_t     n, cap;
    uint64_t   seq;
} lk_heap;

static lk_heap g_heap;

static bool timer_before(const lk_timer *x, const lk_timer *y)
{
    return x->when < y->when || (x->when == y->when && x->seq < y->seq);
}
static void heap_set(size_t i, lk_timer *t) { g_heap.a[i] = t; t->idx = i; }
static void heap_up(size_t i)
{
    lk_timer *t = g_heap.a[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!timer_before(t, g_heap.a[p])) break;
        heap_set(i, g_heap.a[p]);
        i = p;
    }
    heap_set(i, t);
}
static void heap_down(size_t i)
{
    lk_timer *t = g_heap.a[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= g_heap.n) break;
        if (c + 1 < g_heap.n && timer_before(g_heap.a[c + 1], g_heap.a[c])) c++;
        if (!timer_before(g_heap.a[c], t)) break;
        heap_set(i, g_heap.a[c]);
        i = c;
    }
    heap_set(i, t);
}
static void timer_init(lk_timer *t, lk_fire_fn fire) { t->idx = SIZE_MAX; t->fire = fire; t->when = 0; t->seq = 0; }
static void timer_cancel(lk_timer *t)
{
    if (t->idx == SIZE_MAX) return;
    size_t i = t->idx;
    t->idx = SIZE_MAX;
    lk_timer *last = g_heap.a[--g_heap.n];
    if (i == g_heap.n) return;
    heap_set(i, last);
    heap_up(i);
    heap_down(last->idx);
}
/* Arms (or re-arms) t at `when`. Returns -1 only when the heap cannot grow. */
static int timer_arm(lk_timer *t, int64_t when)
{
    timer_cancel(t);
    if (g_heap.n == g_heap.cap) {
        size_t cap = g_heap.cap ? g_heap.cap * 2 : 1024;
        lk_timer **a = realloc(g_heap.a, cap * sizeof *a);
        if (!a) return -1;
        g_heap.a = a;
        g_heap.cap = cap;
    }
    t->when = when;
    t->seq = g_heap.seq++;
    heap_set(g_heap.n++, t);
    heap_up(t->idx);
    return 0;
}

/* ---- the link model ------------------------------------------------------------------------------- */

typedef struct {
    int64_t delay_ns, jitter_ns;
    double  rate_bps; /* 0: unlimited */
    double  loss;     /* probability */
} lk_shape;

typedef struct {
    lk_shape s;
    int64_t  busy_until;   /* when the serializer is free */
    int64_t  last_release; /* FIFO: releases never go backwards */
    int64_t  last_armed;   /* ... nor the early-armed times derived from them */
    uint64_t units, bytes, drops;
} lk_link;

/* Release time of `bytes` entering the link at t, or -1 when the wait for the serializer would exceed
 * qlimit_ns (0: no limit). */
static int64_t link_admit(lk_link *l, int64_t t, size_t bytes, int64_t qlimit_ns)
{
    int64_t start = HR_MAX(t, l->busy_until);
    if (qlimit_ns > 0 && start - t > qlimit_ns) return -1;
    int64_t ser = l->s.rate_bps > 0 ? (int64_t)((double)bytes * 8e9 / l->s.rate_bps) : 0;
    l->busy_until = start + ser;
    int64_t rel = l->busy_until + l->s.delay_ns;
    if (l->s.jitter_ns > 0) rel += (int64_t)((2.0 * rng_unit() - 1.0) * (double)l->s.jitter_ns);
    rel = HR_MAX(rel, l->busy_until);
    rel = HR_MAX(rel, l->last_release);
    l->last_release = rel;
    l->units++;
    l->bytes += bytes;
    return rel;
}
static bool link_lose(const lk_link *l) { return l->s.loss > 0 && rng_unit() < l->s.loss; }

/* Applies "key=value" to an up/down shape pair; keys without up-/down- set both directions. */
static int shape_set(lk_shape *up, lk_shape *down, const char *key, const char *val, char *why, size_t whyn)
{
    const char *k = key;
    lk_shape *targets[2] = {up, down};
    int nt = 2;
    if (!strncmp(k, "up-", 3)) { k += 3; targets[0] = up; nt = 1; }
    else if (!strncmp(k, "down-", 5)) { k += 5; targets[0] = down; nt = 1; }
    for (int i = 0; i < nt; i++) {
        lk_shape *s = targets[i];
        int rc;
        if (!strcmp(k, "delay")) rc = parse_time_ns(val, &s->delay_ns);
        else if (!strcmp(k, "jitter")) rc = parse_time_ns(val, &s->jitter_ns);
        else if (!strcmp(k, "rate")) rc = parse_rate_bps(val, &s->rate_bps);
        else if (!strcmp(k, "loss")) rc = parse_loss(val, &s->loss);
        else { snprintf(why, whyn, "unknown key '%s' (delay, jitter, rate, loss, with up-/down- prefix)", key); return -1; }
        if (rc) {
            snprintf(why, whyn, "bad value '%s' for %s (%s)", val, key,
                     !strcmp(k, "rate") ? "e.g. 300mbit, 1G" : !strcmp(k, "loss") ? "percent 0-100" : "e.g. 1ms, 250us");
            return -1;
        }
    }
    return 0;
}

/* "key=value,key=value" */
static int shape_set_list(lk_shape *up, lk_shape *down, const char *list, char *why, size_t whyn)
{
    char buf[512];
    if (strlen(list) >= sizeof buf) { snprintf(why, whyn, "option too long"); return -1; }
    strcpy(buf, list);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) { snprintf(why, whyn, "'%s' is not key=value", tok); return -1; }
        *eq = 0;
        if (shape_set(up, down, tok, eq + 1, why, whyn)) return -1;
    }
    return 0;
}

/* ---- the event loop ------------------------------------------------------------------------------- */

enum { W_SIGNAL, W_TIMER, W_TUN, W_LISTEN_TCP, W_LISTEN_UDP, W_CONN_FD, W_USESS_FD };

typedef struct {
    int   kind;
    int   fd;
    void *obj;
    int   side;     /* connections: 0 = client socket, 1 = target socket */
    uint32_t mask;  /* current epoll interest; 0 = not registered */
} lk_watch;

static int     g_ep = -1;
static int     g_tfd = -1;
static int64_t g_armed = -1;
static bool    g_stop;
static bool    g_verbose;

static int watch_add(lk_watch *w, uint32_t mask)
{
    struct epoll_event ev = {.events = mask, .data.ptr = w};
    w->mask = mask;
    return epoll_ctl(g_ep, EPOLL_CTL_ADD, w->fd, &ev);
}
/* An fd we want nothing from leaves epoll: otherwise a socket shut both ways reports EPOLLHUP on
 * every wait while its other direction is still draining, and the loop would spin. */
static void watch_mod(lk_watch *w, uint32_t mask)
{
    if (w->mask == mask) return;
    struct epoll_event ev = {.events = mask, .data.ptr = w};
    int op = mask == 0 ? EPOLL_CTL_DEL : w->mask == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD;
    if (epoll_ctl(g_ep, op, w->fd, &ev) == 0) w->mask = mask;
}

static void rearm_timerfd(void)
{
    int64_t want = g_heap.n ? g_heap.a[0]->when : -1;
    if (want == g_armed) return;
    struct itimerspec its = {0};
    if (want >= 0) {
        int64_t w = HR_MAX(want, 1);
        its.it_value.tv_sec = w / 1000000000;
        its.it_value.tv_nsec = w % 1000000000;
    }
    timerfd_settime(g_tfd, TFD_TIMER_ABSTIME, &its, NULL);
    g_armed = want;
}

/* How late timers fire (wake-up latency): without correction every hold would be this much longer
 * than configured. Release times are armed early by a running average of it (g_late_avg) plus a
 * fixed --compensate for the rest of the path (the kernel's forwarding around us). */
static uint64_t g_late_n;
static int64_t  g_late_sum, g_late_max, g_late_avg, g_comp_ns;

/* When to arm a unit that should leave at `rel`: early by the expected lateness, never before `floor`
 * (the time it arrived), so a zero delay stays zero, and never before the previous unit of the same
 * link (*last): the average moves, and a FIFO link must stay FIFO. */
static int64_t lk_due(int64_t rel, int64_t floor, int64_t *last)
{
    int64_t t = HR_MAX(HR_MAX(floor, rel - g_late_avg - g_comp_ns), *last);
    *last = t;
    return t;
}

static void run_due_timers(void)
{
    int64_t now = hr_time_ns();
    while (g_heap.n && g_heap.a[0]->when <= now) {
        lk_timer *t = g_heap.a[0];
        int64_t late = now - t->when;
        g_late_n++;
        g_late_sum += late;
        g_late_max = HR_MAX(g_late_max, late);
        /* one wake-up that met a busy CPU must not make every later packet early: clip before averaging */
        g_late_avg += (HR_MIN(late, 100000) - g_late_avg) / 16;
        timer_cancel(t);
        t->fire(t, now);
        now = hr_time_ns();
    }
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* ---- tun mode ------------------------------------------------------------------------------------- */

typedef struct {
    uint32_t addr;          /* network order; 0 for the default node */
    lk_link  up, down;      /* up: leaving this node; down: arriving at it */
} tun_node;

typedef struct {
    lk_timer t;
    int      stage;         /* 0: on the sender's uplink, 1: on the receiver's downlink */
    int      src, dst;      /* node indexes */
    size_t   len, wire;     /* bytes we hold; bytes on the emulated wire */
    unsigned char data[];
} tun_pkt;

static struct {
    int      fd;
    size_t   hdr;           /* bytes of virtio_net_hdr before the IP header (offload mode) */
    tun_node nodes[LK_MAX_NODES + 1]; /* [n] is the default node */
    int      n;
    int64_t *pair_last;     /* [(n+1)*(n+1)]: last release per sender->receiver, for the one-stage path */
    int64_t *pair_armed;    /* [(n+1)*(n+1)]: last early-armed time per sender->receiver */
    int64_t  qlimit_ns;
    size_t   overhead;      /* link-layer bytes per frame that the rate counts */
    size_t   queued, max_queued;
    uint64_t dropped_mem, write_err, nonip;
    lk_watch w;
} T;

/* Bytes this packet occupies on an Ethernet link: a GSO super-packet (offload mode) is gso_segs
 * frames, each with its own IP/TCP headers and --overhead bytes of link header. Counting it once would
 * make TCP run ~4% faster than the configured rate. */
static size_t tun_wire_bytes(const unsigned char *pkt, size_t len)
{
    const unsigned char *ip = pkt + T.hdr;
    size_t iplen = len - T.hdr;
    size_t segs = 1, hdrs = 0;
    if (T.hdr) {
        struct virtio_net_hdr vh;
        memcpy(&vh, pkt, sizeof vh);
        size_t gso = vh.gso_size;
        size_t ihl = (size_t)(ip[0] & 15) * 4;
        if (vh.gso_type != VIRTIO_NET_HDR_GSO_NONE && gso > 0 && ihl >= 20 && iplen > ihl) {
            hdrs = ihl;
            if (ip[9] == IPPROTO_TCP && iplen >= ihl + 20) hdrs += (size_t)(ip[ihl + 12] >> 4) * 4;
            else if (ip[9] == IPPROTO_UDP) hdrs += 8;
            if (iplen > hdrs) segs = (iplen - hdrs + gso - 1) / gso;
        }
    }
    return iplen + (segs - 1) * hdrs + segs * T.overhead;
}

static int tun_node_of(const unsigned char *addr4)
{
    uint32_t a;
    memcpy(&a, addr4, 4);
    for (int i = 0; i < T.n; i++)
        if (T.nodes[i].addr == a) return i;
    return T.n;
}

static void tun_free(tun_pkt *p)
{
    T.queued -= p->len;
    free(p);
}

static void tun_pkt_fire(lk_timer *t, int64_t now)
{
    (void)now;
    tun_pkt *p = LK_CONTAINER(t, tun_pkt, t);
    if (p->stage == 0) {
        /* the packet reaches the switch when its uplink releases it; that, not the time we woke up,
         * is when it starts to wait for the receiver's downlink */
        lk_link *dl = &T.nodes[p->dst].down;
        int64_t at = p->t.when;
        int64_t rel = link_lose(dl) ? -1 : link_admit(dl, at, p->wire, T.qlimit_ns);
        if (rel < 0 || timer_arm(&p->t, lk_due(rel, at, &dl->last_armed))) { dl->drops++; tun_free(p); return; }
        p->stage = 1;
        return;
    }
    if (write(T.fd, p->data, p->len) < 0) T.write_err++;
    tun_free(p);
}

static void tun_on_readable(void)
{
    static unsigned char buf[LK_PKT_MAX];
    for (int burst = 0; burst < 256; burst++) {
        ssize_t n = read(T.fd, buf, sizeof buf);
        if (n < 0) {
            if (errno != EAGAIN && errno != EINTR) HR_LOGW("linkem: tun read: %s", strerror(errno));
            return;
        }
        int64_t now = hr_time_ns();
        size_t len = (size_t)n;
        if (len < T.hdr + 20 || (buf[T.hdr] >> 4) != 4) {
            /* not IPv4 (the testbed disables IPv6): pass through undelayed */
            T.nonip++;
            if (write(T.fd, buf, len) < 0) T.write_err++;
            continue;
        }
        if (T.queued + len > T.max_queued) { T.dropped_mem++; continue; }
        int src = tun_node_of(buf + T.hdr + 12), dst = tun_node_of(buf + T.hdr + 16);
        lk_link *ul = &T.nodes[src].up, *dl = &T.nodes[dst].down;
        if (link_lose(ul)) { ul->drops++; continue; }
        size_t wire = tun_wire_bytes(buf, len);
        int64_t rel = link_admit(ul, now, wire, T.qlimit_ns);
        if (rel < 0) { ul->drops++; continue; }
        int stage = 0;
        int64_t arm = rel;
        if (dl->s.rate_bps <= 0) {
            /* a downlink without a rate limit is pure delay: add it now and save a timer wake-up
             * (each costs tens of microseconds); FIFO per sender->receiver keeps TCP in order without
             * making one sender's packets wait behind another's */
            if (link_lose(dl)) { dl->drops++; continue; }
            int64_t *last = &T.pair_last[src * (T.n + 1) + dst];
            int64_t r2 = rel + dl->s.delay_ns;
            if (dl->s.jitter_ns > 0) r2 += (int64_t)((2.0 * rng_unit() - 1.0) * (double)dl->s.jitter_ns);
            rel = HR_MAX(HR_MAX(r2, rel), *last);
            *last = rel;
            arm = lk_due(rel, now, &T.pair_armed[src * (T.n + 1) + dst]);
            dl->units++;
            dl->bytes += wire;
            stage = 1;
        }
        tun_pkt *p = malloc(sizeof *p + len);
        if (!p) { T.dropped_mem++; continue; }
        timer_init(&p->t, tun_pkt_fire);
        p->stage = stage;
        p->src = src;
        p->dst = dst;
        p->len = len;
        p->wire = wire;
        memcpy(p->data, buf, len);
        T.queued += len;
        /* the two-stage path keeps the uplink release exact: the downlink's queue starts from it */
        if (timer_arm(&p->t, arm)) { T.dropped_mem++; tun_free(p); }
    }
}

static int tun_open(const char *name, bool offload)
{
    int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
    if (fd < 0) { fprintf(stderr, "linkem: open /dev/net/tun: %s\n", strerror(errno)); return -1; }
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI | (offload ? IFF_VNET_HDR : 0);
    snprintf(ifr.ifr_name, IFNAMSIZ, "%s", name);
    if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
        fprintf(stderr, "linkem: TUNSETIFF %s: %s\n", name, strerror(errno));
        close(fd);
        return -1;
    }
    T.hdr = 0;
    if (offload) {
        /* with a virtio header the kernel hands us whole GSO super-packets (up to 64 KiB), so a
         * 1 Gbit/s TCP stream costs a few thousand reads per second instead of ~85000 */
        int hdr = (int)sizeof(struct virtio_net_hdr);
        if (ioctl(fd, TUNSETVNETHDRSZ, &hdr) < 0 ||
            ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN) < 0) {
            fprintf(stderr, "linkem: tun offload: %s\n", strerror(errno));
            close(fd);
            return -1;
        }
        T.hdr = (size_t)hdr;
    }
    if (set_nonblock(fd) < 0) { close(fd); return -1; }
    return fd;
}

static void print_lateness(FILE *f)
{
    fprintf(f, "linkem: %llu timers, woke %.1f us after the (early-armed) time on average, %.1f us at most; "
            "arming %.1f us early now\n", (unsigned long long)g_late_n,
            g_late_n ? (double)g_late_sum / (double)g_late_n / 1e3 : 0.0, (double)g_late_max / 1e3,
            (double)(g_late_avg + g_comp_ns) / 1e3);
}

static void tun_print_stats(FILE *f)
{
    print_lateness(f);
    for (int i = 0; i <= T.n; i++) {
        tun_node *nd = &T.nodes[i];
        if (!nd->up.units && !nd->down.units && !nd->up.drops && !nd->down.drops) continue;
        char a[INET_ADDRSTRLEN] = "default";
        if (i < T.n) inet_ntop(AF_INET, &nd->addr, a, sizeof a);
        fprintf(f, "linkem: node %s: up %llu pkts %llu bytes %llu drops; down %llu pkts %llu bytes %llu drops\n", a,
                (unsigned long long)nd->up.units, (unsigned long long)nd->up.bytes, (unsigned long long)nd->up.drops,
                (unsigned long long)nd->down.units, (unsigned long long)nd->down.bytes,
                (unsigned long long)nd->down.drops);
    }
    fprintf(f, "linkem: queued %zu bytes, %llu dropped for memory, %llu write errors, %llu non-IPv4\n", T.queued,
            (unsigned long long)T.dropped_mem, (unsigned long long)T.write_err, (unsigned long long)T.nonip);
}

/* ---- relay mode: shared parts --------------------------------------------------------------------- */

typedef struct {
    int  proto;                 /* SOCK_STREAM or SOCK_DGRAM */
    struct sockaddr_in listen, target;
    lk_watch w;
} relay_map;

typedef struct chunk {
    struct chunk *next;
    int64_t       release;
    size_t        len, off;
    unsigned char data[];
} chunk;

/* One direction of a relayed flow: bytes or datagrams wait in a FIFO until their release time. */
typedef struct {
    lk_link  link;
    chunk   *head, *tail;
    size_t   queued;
    lk_timer t;
    bool     eof, shut, blocked;
    int      side;              /* 0: up (client -> target), 1: down */
    void    *owner;
} relay_dir;

static struct {
    relay_map maps[LK_MAX_MAPS];
    int       nmaps;
    lk_shape  up, down;
    size_t    buffer;           /* TCP: most bytes held per direction before we stop reading */
    int64_t   qlimit_ns;
    int64_t   udp_idle_ns;
    int       max_conns, nconns, nsess;
    uint64_t  accepted, refused;
} R;

static void dir_init(relay_dir *d, int side, void *owner, lk_fire_fn fire)
{
    memset(d, 0, sizeof *d);
    d->link.s = side == 0 ? R.up : R.down;
    d->side = side;
    d->owner = owner;
    timer_init(&d->t, fire);
}

static void dir_free(relay_dir *d)
{
    timer_cancel(&d->t);
    for (chunk *c = d->head, *nx; c; c = nx) { nx = c->next; free(c); }
    d->head = d->tail = NULL;
    d->queued = 0;
}

static void dir_push(relay_dir *d, chunk *c)
{
    c->next = NULL;
    if (d->tail) d->tail->next = c; else d->head = c;
    d->tail = c;
    d->queued += c->len;
}

static chunk *dir_pop(relay_dir *d)
{
    chunk *c = d->head;
    d->head = c->next;
    if (!d->head) d->tail = NULL;
    d->queued -= c->len;
    return c;
}

/* ---- relay mode: TCP ------------------------------------------------------------------------------ */

typedef struct conn {
    int        fd[2];           /* 0: client, 1: target */
    lk_watch   w[2];
    bool       connecting;
    relay_dir  d[2];            /* d[0]: client -> target, d[1]: target -> client */
    bool       dead;
    struct conn *prev, *next;
} conn;

static conn *g_conns;
static conn *g_dead; /* closed during an epoll batch; freed after it, since later events may name them */

static void conn_close(conn *c, bool reset)
{
    if (c->dead) return;
    for (int i = 0; i < 2; i++) {
        dir_free(&c->d[i]);
        if (c->fd[i] >= 0) {
            if (reset) {
                struct linger lg = {1, 0};
                setsockopt(c->fd[i], SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
            }
            if (c->w[i].mask) epoll_ctl(g_ep, EPOLL_CTL_DEL, c->fd[i], NULL);
            close(c->fd[i]);
            c->fd[i] = -1;
        }
    }
    if (c->prev) c->prev->next = c->next; else g_conns = c->next;
    if (c->next) c->next->prev = c->prev;
    R.nconns--;
    c->dead = true;
    c->next = g_dead;
    g_dead = c;
}

static void conn_reap(void)
{
    while (g_dead) {
        conn *c = g_dead;
        g_dead = c->next;
        free(c);
    }
}

/* Interest for socket `side`: read when its outgoing direction has room, write when the direction
 * into it is blocked on a full socket buffer (or while connecting). */
static void conn_update(conn *c)
{
    for (int s = 0; s < 2; s++) {
        relay_dir *out = &c->d[s], *in = &c->d[1 - s];
        uint32_t m = 0;
        if (!out->eof && out->queued < R.buffer && !(s == 1 && c->connecting)) m |= EPOLLIN;
        if ((s == 1 && c->connecting) || in->blocked) m |= EPOLLOUT;
        watch_mod(&c->w[s], m);
    }
}

/* Writes every due chunk of d; returns -1 when the connection died. */
static int conn_flush(conn *c, relay_dir *d, int64_t now)
{
    int to = c->fd[1 - d->side];
    if (d->side == 0 && c->connecting) return 0;
    d->blocked = false;
    while (d->head && d->head->release <= now) {
        chunk *h = d->head;
        ssize_t n = send(to, h->data + h->off, h->len - h->off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) { d->blocked = true; break; }
            if (errno == EINTR) continue;
            return -1;
        }
        h->off += (size_t)n;
        if (h->off < h->len) { d->blocked = true; break; }
        free(dir_pop(d));
    }
    if (d->head && !d->blocked) timer_arm(&d->t, d->head->release);
    if (!d->head && d->eof && !d->shut) {
        shutdown(to, SHUT_WR);
        d->shut = true;
    }
    return 0;
}

static void conn_after(conn *c, int rc)
{
    if (rc < 0 || (c->d[0].shut && c->d[1].shut)) { conn_close(c, rc < 0); return; }
    conn_update(c);
}

static void conn_dir_fire(lk_timer *t, int64_t now)
{
    relay_dir *d = LK_CONTAINER(t, relay_dir, t);
    conn *c = d->owner;
    conn_after(c, conn_flush(c, d, now));
}

static int conn_read(conn *c, int side)
{
    relay_dir *d = &c->d[side];
    /* read at most ~1 ms of link time at once, so a rate-limited stream leaves in small steps */
    size_t want = 65536;
    if (d->link.s.rate_bps > 0) want = (size_t)HR_MAX(1500.0, HR_MIN(65536.0, d->link.s.rate_bps / 8e3));
    want = HR_MIN(want, R.buffer - HR_MIN(R.buffer, d->queued));
    for (int burst = 0; burst < 16 && want > 0 && !d->eof; burst++) {
        chunk *ch = malloc(sizeof *ch + want);
        if (!ch) return -1;
        ssize_t n = recv(c->fd[side], ch->data, want, 0);
        if (n < 0) {
            free(ch);
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
            return -1;
        }
        if (n == 0) {
            free(ch);
            d->eof = true;
            break;
        }
        ch->len = (size_t)n;
        ch->off = 0;
        /* TCP has no loss here: back-pressure (not reading) stands in for a full queue */
        int64_t now = hr_time_ns();
        ch->release = lk_due(link_admit(&d->link, now, ch->len, 0), now, &d->link.last_armed);
        bool was_empty = d->head == NULL;
        dir_push(d, ch);
        if (was_empty && !d->blocked) timer_arm(&d->t, ch->release);
        want = HR_MIN(want, R.buffer - HR_MIN(R.buffer, d->queued));
    }
    if (d->eof && !d->head) return conn_flush(c, d, hr_time_ns());
    return 0;
}

static void conn_on_event(lk_watch *w, uint32_t ev)
{
    conn *c = w->obj;
    int side = w->side;
    int rc = 0;
    if (c->dead) return;
    if (side == 1 && c->connecting) {
        if (!(ev & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(c->fd[1], SOL_SOCKET, SO_ERROR, &err, &el);
        if (err) {
            if (g_verbose) HR_LOGI("linkem: connect to target: %s", strerror(err));
            R.refused++;
            conn_close(c, true);
            return;
        }
        c->connecting = false;
        rc = conn_flush(c, &c->d[0], hr_time_ns());
        conn_after(c, rc);
        return;
    }
    if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) rc = conn_read(c, side);
    if (rc == 0 && (ev & EPOLLOUT)) rc = conn_flush(c, &c->d[1 - side], hr_time_ns());
    conn_after(c, rc);
}

static void tcp_on_accept(relay_map *m)
{
    for (int burst = 0; burst < 64; burst++) {
        int cfd = accept4(m->w.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
                HR_LOGW("linkem: accept: %s", strerror(errno));
            return;
        }
        if (R.nconns >= R.max_conns) { close(cfd); R.refused++; continue; }
        int tfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        conn *c = tfd >= 0 ? calloc(1, sizeof *c) : NULL;
        if (!c) { close(cfd); if (tfd >= 0) close(tfd); R.refused++; continue; }
        int one = 1;
        setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(tfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        c->fd[0] = cfd;
        c->fd[1] = tfd;
        c->connecting = true;
        for (int s = 0; s < 2; s++) {
            dir_init(&c->d[s], s, c, conn_dir_fire);
            c->w[s] = (lk_watch){.kind = W_CONN_FD, .fd = c->fd[s], .obj = c, .side = s};
        }
        c->next = g_conns;
        if (g_conns) g_conns->prev = c;
        g_conns = c;
        R.nconns++;
        R.accepted++;
        if (connect(tfd, (struct sockaddr *)&m->target, sizeof m->target) < 0 && errno != EINPROGRESS) {
            R.refused++;
            conn_close(c, true);
            continue;
        }
        if (watch_add(&c->w[0], EPOLLIN) < 0 || watch_add(&c->w[1], EPOLLOUT) < 0) { conn_close(c, true); continue; }
    }
}

/* ---- relay mode: UDP ------------------------------------------------------------------------------ */

typedef struct usess {
    relay_map   *map;
    struct sockaddr_in peer;   /* the client */
    int          fd;           /* connected to the target */
    lk_watch     w;
    relay_dir    d[2];
    int64_t      last;
    lk_timer     idle;
    struct usess *hnext, *prev, *next;
} usess;

#define USESS_BUCKETS 1024
static usess *g_ubucket[USESS_BUCKETS];
static usess *g_usess;
static uint64_t g_udp_drops;

static unsigned usess_hash(const relay_map *m, const struct sockaddr_in *a)
{
    uint64_t h = hr_fnv1a(&a->sin_addr, 4, HR_FNV_SEED);
    h = hr_fnv1a(&a->sin_port, 2, h);
    h = hr_fnv1a(&m, sizeof m, h);
    return (unsigned)(h % USESS_BUCKETS);
}

static void usess_close(usess *s)
{
    unsigned b = usess_hash(s->map, &s->peer);
    for (usess **pp = &g_ubucket[b]; *pp; pp = &(*pp)->hnext)
        if (*pp == s) { *pp = s->hnext; break; }
    if (s->prev) s->prev->next = s->next; else g_usess = s->next;
    if (s->next) s->next->prev = s->prev;
    dir_free(&s->d[0]);
    dir_free(&s->d[1]);
    timer_cancel(&s->idle);
    epoll_ctl(g_ep, EPOLL_CTL_DEL, s->fd, NULL);
    close(s->fd);
    R.nsess--;
    free(s);
}

static void usess_dir_fire(lk_timer *t, int64_t now)
{
    relay_dir *d = LK_CONTAINER(t, relay_dir, t);
    usess *s = d->owner;
    while (d->head && d->head->release <= now) {
        chunk *c = dir_pop(d);
        ssize_t n = d->side == 0 ? send(s->fd, c->data, c->len, 0)
                                 : sendto(s->map->w.fd, c->data, c->len, 0, (struct sockaddr *)&s->peer, sizeof s->peer);
        if (n < 0) g_udp_drops++; /* a full socket buffer drops, as a real queue would */
        free(c);
    }
    if (d->head) timer_arm(&d->t, d->head->release);
}

static void usess_idle_fire(lk_timer *t, int64_t now)
{
    usess *s = LK_CONTAINER(t, usess, idle);
    if (now - s->last >= R.udp_idle_ns && !s->d[0].head && !s->d[1].head) { usess_close(s); return; }
    timer_arm(&s->idle, HR_MAX(now, s->last) + R.udp_idle_ns);
}

static void udp_enqueue(relay_dir *d, const unsigned char *buf, size_t n)
{
    if (link_lose(&d->link)) { d->link.drops++; return; }
    int64_t now = hr_time_ns();
    int64_t rel = link_admit(&d->link, now, n, R.qlimit_ns);
    if (rel >= 0) rel = lk_due(rel, now, &d->link.last_armed);
    chunk *c = rel < 0 ? NULL : malloc(sizeof *c + n);
    if (!c) { d->link.drops++; return; }
    memcpy(c->data, buf, n);
    c->len = n;
    c->off = 0;
    c->release = rel;
    bool was_empty = d->head == NULL;
    dir_push(d, c);
    if (was_empty) timer_arm(&d->t, rel);
}

static usess *usess_get(relay_map *m, const struct sockaddr_in *peer)
{
    unsigned b = usess_hash(m, peer);
    for (usess *s = g_ubucket[b]; s; s = s->hnext)
        if (s->map == m && s->peer.sin_addr.s_addr == peer->sin_addr.s_addr && s->peer.sin_port == peer->sin_port)
            return s;
    if (R.nsess >= R.max_conns) return NULL;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return NULL;
    if (connect(fd, (struct sockaddr *)&m->target, sizeof m->target) < 0) { close(fd); return NULL; }
    usess *s = calloc(1, sizeof *s);
    if (!s) { close(fd); return NULL; }
    s->map = m;
    s->peer = *peer;
    s->fd = fd;
    s->w = (lk_watch){.kind = W_USESS_FD, .fd = fd, .obj = s};
    if (watch_add(&s->w, EPOLLIN) < 0) { close(fd); free(s); return NULL; }
    dir_init(&s->d[0], 0, s, usess_dir_fire);
    dir_init(&s->d[1], 1, s, usess_dir_fire);
    timer_init(&s->idle, usess_idle_fire);
    s->last = hr_time_ns();
    timer_arm(&s->idle, s->last + R.udp_idle_ns);
    s->hnext = g_ubucket[b];
    g_ubucket[b] = s;
    s->next = g_usess;
    if (g_usess) g_usess->prev = s;
    g_usess = s;
    R.nsess++;
    R.accepted++;
    return s;
}

static void udp_on_listen(relay_map *m)
{
    static unsigned char buf[65536];
    for (int burst = 0; burst < 256; burst++) {
        struct sockaddr_in peer;
        socklen_t pl = sizeof peer;
        ssize_t n = recvfrom(m->w.fd, buf, sizeof buf, 0, (struct sockaddr *)&peer, &pl);
        if (n < 0) return;
        if (peer.sin_family != AF_INET) continue;
        usess *s = usess_get(m, &peer);
        if (!s) { g_udp_drops++; continue; }
        s->last = hr_time_ns();
        udp_enqueue(&s->d[0], buf, (size_t)n);
    }
}

static void udp_on_sess(usess *s)
{
    static unsigned char buf[65536];
    for (int burst = 0; burst < 256; burst++) {
        ssize_t n = recv(s->fd, buf, sizeof buf, 0);
        if (n < 0) return; /* includes ECONNREFUSED from an ICMP unreachable: keep the session */
        s->last = hr_time_ns();
        udp_enqueue(&s->d[1], buf, (size_t)n);
    }
}

/* "[host:]port[-port]" or "host:port" -> address; *count gets the number of ports (ranges) */
static int parse_hostport(const char *s, bool allow_range, bool default_any, struct sockaddr_in *out, int *count)
{
    char buf[128];
    if (strlen(s) >= sizeof buf) return -1;
    strcpy(buf, s);
    char *colon = strrchr(buf, ':');
    char *port = colon ? colon + 1 : buf;
    memset(out, 0, sizeof *out);
    out->sin_family = AF_INET;
    if (colon) {
        *colon = 0;
        if (inet_pton(AF_INET, buf, &out->sin_addr) != 1) return -1;
    } else if (default_any) {
        out->sin_addr.s_addr = htonl(INADDR_ANY);
    } else {
        return -1;
    }
    char *dash = strchr(port, '-');
    uint64_t lo, hi;
    if (dash) {
        if (!allow_range) return -1;
        *dash = 0;
        if (parse_u64(port, 1, 65535, &lo) || parse_u64(dash + 1, 1, 65535, &hi) || hi < lo) return -1;
    } else {
        if (parse_u64(port, 1, 65535, &lo)) return -1;
        hi = lo;
    }
    out->sin_port = htons((uint16_t)lo);
    *count = (int)(hi - lo + 1);
    return 0;
}

/* "LISTEN=TARGET" with an optional port range on LISTEN mapped to consecutive target ports */
static int add_mapping(int proto, const char *spec)
{
    char buf[256];
    if (strlen(spec) >= sizeof buf) return -1;
    strcpy(buf, spec);
    char *eq = strchr(buf, '=');
    if (!eq) return -1;
    *eq = 0;
    struct sockaddr_in l, t;
    int nl, nt;
    if (parse_hostport(buf, true, true, &l, &nl) || parse_hostport(eq + 1, false, false, &t, &nt)) return -1;
    if ((int)ntohs(t.sin_port) + nl - 1 > 65535) return -1;
    for (int i = 0; i < nl; i++) {
        if (R.nmaps >= LK_MAX_MAPS) return -2;
        relay_map *m = &R.maps[R.nmaps++];
        m->proto = proto;
        m->listen = l;
        m->listen.sin_port = htons((uint16_t)(ntohs(l.sin_port) + i));
        m->target = t;
        m->w.fd = -1;
        m->target.sin_port = htons((uint16_t)(ntohs(t.sin_port) + i));
    }
    return 0;
}

static int map_open(relay_map *m)
{
    int fd = socket(AF_INET, m->proto | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    char a[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &m->listen.sin_addr, a, sizeof a);
    if (bind(fd, (struct sockaddr *)&m->listen, sizeof m->listen) < 0 ||
        (m->proto == SOCK_STREAM && listen(fd, 512) < 0)) {
        fprintf(stderr, "linkem: cannot listen on %s %s:%d: %s\n", m->proto == SOCK_STREAM ? "tcp" : "udp", a,
                ntohs(m->listen.sin_port), strerror(errno));
        close(fd);
        return -1;
    }
    m->w = (lk_watch){.kind = m->proto == SOCK_STREAM ? W_LISTEN_TCP : W_LISTEN_UDP, .fd = fd, .obj = m};
    return watch_add(&m->w, EPOLLIN);
}

/* ---- main ----------------------------------------------------------------------------------------- */

static const char *USAGE =
    "usage: linkem tun   --name IF [options]\n"
    "       linkem relay (--tcp MAP | --udp MAP)... [options]\n"
    "\n"
    "Link emulator for the hearth testbed: delay, jitter, rate limit and loss per direction.\n"
    "\n"
    "tun mode: an L3 forwarder. linkem creates TUN interface IF (it disappears when linkem exits);\n"
    "route packets into IF and linkem writes each one back after the sender's uplink and the\n"
    "receiver's downlink have held it. Only IPv4 is shaped; other packets pass undelayed.\n"
    "  --name IF              TUN interface to create (required)\n"
    "  --node ADDR,K=V,...    a device with IPv4 address ADDR and its link (repeat per device);\n"
    "                         keys: delay, jitter, rate, loss, or up-/down- prefixed for one direction\n"
    "                         (up = packets this node sends, down = packets it receives)\n"
    "  --default K=V,...      link of any address not given with --node (default: none)\n"
    "  --no-offload           no virtio header / GSO: one read per MTU-sized packet (slower)\n"
    "  --overhead BYTES       link-layer bytes per frame counted by the rate (default 14, an Ethernet\n"
    "                         header, as tbf and interface counters count; 38 adds FCS, preamble, gap)\n"
    "  --max-queued BYTES     memory for held packets before new ones are dropped (default 256M)\n"
    "\n"
    "relay mode: TCP/UDP port relay. 'up' is the direction from the connecting client to TARGET.\n"
    "  --tcp [HOST:]PORT[-PORT]=HOST:PORT   relay TCP; a listen range maps to consecutive target ports\n"
    "  --udp [HOST:]PORT[-PORT]=HOST:PORT   relay UDP (one target socket per client address)\n"
    "  --delay T, --jitter T, --rate R, --loss P      both directions\n"
    "  --up-delay T, --down-delay T, --up-jitter T, --down-jitter T,\n"
    "  --up-rate R, --down-rate R, --up-loss P, --down-loss P   one direction\n"
    "                         loss applies to UDP only: TCP bytes are never dropped, order is kept\n"
    "  --buffer BYTES         TCP bytes held per direction before linkem stops reading (default 4M)\n"
    "  --udp-idle T           forget a UDP client after this idle time (default 60s)\n"
    "  --max-conns N          concurrent TCP connections / UDP clients (default 4096)\n"
    "\n"
    "common options:\n"
    "  --queue T              drop a packet that would wait longer than T for a rate-limited link\n"
    "                         (default 50ms; 0 = never)\n"
    "  --compensate T         release every unit T earlier than the model says, never earlier than\n"
    "                         it arrived: the fixed cost of the path around linkem (default 0)\n"
    "  --rt-prio N            run under SCHED_FIFO priority N (1-99): on a busy machine the link\n"
    "                         keeps its timing instead of waiting for the CPU (default 0 = off)\n"
    "  --seed N               random seed for jitter and loss (default: from the clock)\n"
    "  --ready-file PATH      write 'ready PID' to PATH once listening (for scripts)\n"
    "  --stats                print per-link counters to stderr on exit (SIGUSR1: print now)\n"
    "  -v, --verbose          log connection events\n"
    "  -h, --help             this text\n"
    "\n"
    "Units: T = 1.5ms, 200us, 2s (bare number: ms); R = 300mbit, 300M, 1G, 1gbit (bit/s, decimal;\n"
    "0 = unlimited); P = percent 0-100 (2 or 2%); BYTES = 4096, 64K, 4M (powers of 1024).\n"
    "Jitter is uniform in [-jitter, +jitter] and never reorders a link. Stops cleanly on SIGTERM/SIGINT.\n";

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "linkem: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(linkem --help for usage)\n");
    return 2;
}

int main(int argc, char **argv)
{
    if (argc < 2) { fputs(USAGE, stderr); return 2; }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) { fputs(USAGE, stdout); return 0; }
    bool tun = !strcmp(argv[1], "tun"), relay = !strcmp(argv[1], "relay");
    if (!tun && !relay) return usage_error("unknown mode '%s' (tun or relay)", argv[1]);

    const char *name = NULL, *ready_file = NULL;
    bool offload = true, stats = false, seeded = false;
    int64_t qlimit = 50000000;
    uint64_t seed = 0, rt_prio = 0;
    R.buffer = 4u << 20;
    R.udp_idle_ns = 60000000000LL;
    R.max_conns = 4096;
    T.max_queued = 256u << 20;
    T.overhead = 14;
    T.fd = -1;
    lk_shape def_up = {0}, def_down = {0};
    char why[256];

    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { fputs(USAGE, stdout); return 0; }
        if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) { g_verbose = true; continue; }
        if (!strcmp(a, "--stats")) { stats = true; continue; }
        if (!strcmp(a, "--no-offload")) { if (!tun) return usage_error("%s is a tun-mode option", a); offload = false; continue; }
        if (a[0] != '-' || a[1] != '-') return usage_error("unexpected argument '%s'", a);
        if (i + 1 >= argc) return usage_error("%s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--name")) {
            if (!tun) return usage_error("%s is a tun-mode option", a);
            if (!*v || strlen(v) >= IFNAMSIZ) return usage_error("bad interface name '%s'", v);
            name = v;
        } else if (!strcmp(a, "--node")) {
            if (!tun) return usage_error("%s is a tun-mode option", a);
            if (T.n >= LK_MAX_NODES) return usage_error("too many nodes (at most 250)%s", "");
            char addr[64];
            const char *comma = strchr(v, ',');
            size_t al = comma ? (size_t)(comma - v) : strlen(v);
            if (al >= sizeof addr) return usage_error("bad --node '%s'", v);
            memcpy(addr, v, al);
            addr[al] = 0;
            tun_node *nd = &T.nodes[T.n];
            if (inet_pton(AF_INET, addr, &nd->addr) != 1) return usage_error("bad IPv4 address in --node '%s'", v);
            for (int k = 0; k < T.n; k++)
                if (T.nodes[k].addr == nd->addr) return usage_error("node %s given twice", addr);
            if (comma && shape_set_list(&nd->up.s, &nd->down.s, comma + 1, why, sizeof why))
                return usage_error("--node: %s", why);
            T.n++;
        } else if (!strcmp(a, "--default")) {
            if (!tun) return usage_error("%s is a tun-mode option", a);
            if (shape_set_list(&def_up, &def_down, v, why, sizeof why)) return usage_error("--default: %s", why);
        } else if (!strcmp(a, "--overhead")) {
            uint64_t o;
            if (!tun) return usage_error("%s is a tun-mode option", a);
            if (parse_u64(v, 0, 1000, &o)) return usage_error("bad --overhead '%s' (0-1000)", v);
            T.overhead = (size_t)o;
        } else if (!strcmp(a, "--max-queued")) {
            int64_t b = hr_parse_size(v);
            if (b < 65536) return usage_error("bad --max-queued '%s' (at least 64K)", v);
            T.max_queued = (size_t)b;
        } else if (!strcmp(a, "--tcp") || !strcmp(a, "--udp")) {
            if (!relay) return usage_error("%s is a relay-mode option", a);
            int rc = add_mapping(!strcmp(a, "--tcp") ? SOCK_STREAM : SOCK_DGRAM, v);
            if (rc == -2) return usage_error("too many ports (at most 64 in all)%s", "");
            if (rc) return usage_error("bad mapping '%s' (want [HOST:]PORT[-PORT]=HOST:PORT)", v);
        } else if (!strcmp(a, "--buffer")) {
            int64_t b = hr_parse_size(v);
            if (b < 1500 || b > (1LL << 30)) return usage_error("bad --buffer '%s'", v);
            R.buffer = (size_t)b;
        } else if (!strcmp(a, "--udp-idle")) {
            if (parse_time_ns(v, &R.udp_idle_ns) || R.udp_idle_ns <= 0) return usage_error("bad --udp-idle '%s'", v);
        } else if (!strcmp(a, "--max-conns")) {
            uint64_t n;
            if (parse_u64(v, 1, 1000000, &n)) return usage_error("bad --max-conns '%s'", v);
            R.max_conns = (int)n;
        } else if (!strcmp(a, "--queue")) {
            if (parse_time_ns(v, &qlimit)) return usage_error("bad --queue '%s'", v);
        } else if (!strcmp(a, "--compensate")) {
            if (parse_time_ns(v, &g_comp_ns) || g_comp_ns > 10000000) return usage_error("bad --compensate '%s' (0-10ms)", v);
        } else if (!strcmp(a, "--rt-prio")) {
            if (parse_u64(v, 0, 99, &rt_prio)) return usage_error("bad --rt-prio '%s' (0-99)", v);
        } else if (!strcmp(a, "--seed")) {
            if (parse_u64(v, 0, UINT64_MAX, &seed)) return usage_error("bad --seed '%s'", v);
            seeded = true;
        } else if (!strcmp(a, "--ready-file")) {
            ready_file = v;
        } else if (relay && strlen(a) > 2) {
            /* --delay, --up-rate, ... */
            if (shape_set(&R.up, &R.down, a + 2, v, why, sizeof why)) {
                if (!strncmp(why, "unknown key", 11)) return usage_error("unknown option '%s'", a);
                return usage_error("%s", why);
            }
        } else {
            return usage_error("unknown option '%s'", a);
        }
    }
    if (tun && !name) return usage_error("tun mode needs --name IF%s", "");
    if (relay && R.nmaps == 0) return usage_error("relay mode needs at least one --tcp or --udp mapping%s", "");

    g_rng = seeded ? seed : (uint64_t)hr_time_ns() ^ ((uint64_t)getpid() << 32);
    /* sub-millisecond delays need timers that fire on time, not up to 50 us late */
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    if (rt_prio > 0) {
        struct sched_param sp = {.sched_priority = (int)rt_prio};
        if (sched_setscheduler(0, SCHED_FIFO, &sp) < 0)
            fprintf(stderr, "linkem: warning: SCHED_FIFO %d: %s; timing will suffer on a busy machine\n",
                    (int)rt_prio, strerror(errno));
    }

    sigset_t ss;
    sigemptyset(&ss);
    sigaddset(&ss, SIGTERM);
    sigaddset(&ss, SIGINT);
    sigaddset(&ss, SIGUSR1);
    sigaddset(&ss, SIGHUP);
    sigprocmask(SIG_BLOCK, &ss, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = 1;
    int sfd = -1;
    g_ep = epoll_create1(EPOLL_CLOEXEC);
    g_tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    sfd = signalfd(-1, &ss, SFD_NONBLOCK | SFD_CLOEXEC);
    if (g_ep < 0 || g_tfd < 0 || sfd < 0) { fprintf(stderr, "linkem: %s\n", strerror(errno)); goto out; }
    lk_watch wsig = {.kind = W_SIGNAL, .fd = sfd}, wtim = {.kind = W_TIMER, .fd = g_tfd};
    if (watch_add(&wsig, EPOLLIN) < 0 || watch_add(&wtim, EPOLLIN) < 0) goto out;

    if (tun) {
        T.nodes[T.n].up.s = def_up;
        T.nodes[T.n].down.s = def_down;
        T.qlimit_ns = qlimit;
        T.pair_last = calloc((size_t)(T.n + 1) * (size_t)(T.n + 1), sizeof *T.pair_last);
        T.pair_armed = calloc((size_t)(T.n + 1) * (size_t)(T.n + 1), sizeof *T.pair_armed);
        if (!T.pair_last || !T.pair_armed) { fprintf(stderr, "linkem: out of memory\n"); goto out; }
        T.fd = tun_open(name, offload);
        if (T.fd < 0) goto out;
        T.w = (lk_watch){.kind = W_TUN, .fd = T.fd};
        if (watch_add(&T.w, EPOLLIN) < 0) goto out;
    } else {
        R.qlimit_ns = qlimit;
        for (int i = 0; i < R.nmaps; i++)
            if (map_open(&R.maps[i]) < 0) goto out;
    }
    if (ready_file) {
        FILE *f = fopen(ready_file, "w");
        if (!f || fprintf(f, "ready %d\n", (int)getpid()) < 0 || fclose(f) != 0) {
            fprintf(stderr, "linkem: cannot write %s: %s\n", ready_file, strerror(errno));
            goto out;
        }
    }
    if (g_verbose) HR_LOGI("linkem: %s mode ready", tun ? "tun" : "relay");

    struct epoll_event evs[64];
    while (!g_stop) {
        rearm_timerfd();
        int n = epoll_wait(g_ep, evs, 64, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            fprintf(stderr, "linkem: epoll_wait: %s\n", strerror(errno));
            goto out;
        }
        for (int i = 0; i < n && !g_stop; i++) {
            lk_watch *w = evs[i].data.ptr;
            switch (w->kind) {
            case W_SIGNAL: {
                struct signalfd_siginfo si;
                while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
                    if (si.ssi_signo == SIGUSR1) { if (tun) tun_print_stats(stderr); }
                    else g_stop = true;
                }
                break;
            }
            case W_TIMER: {
                uint64_t ticks;
                if (read(g_tfd, &ticks, sizeof ticks) < 0) { /* spurious wake: nothing to do */ }
                g_armed = -1;
                break;
            }
            case W_TUN: tun_on_readable(); break;
            case W_LISTEN_TCP: tcp_on_accept(w->obj); break;
            case W_LISTEN_UDP: udp_on_listen(w->obj); break;
            case W_CONN_FD: conn_on_event(w, evs[i].events); break;
            case W_USESS_FD: udp_on_sess(w->obj); break;
            }
            /* connection handlers may free watches later in this batch: only timers run between
             * events, and a closed connection's fd events were removed from epoll with it */
        }
        run_due_timers();
        conn_reap();
    }
    rc = 0;
    if (stats) {
        if (tun) tun_print_stats(stderr);
        else print_lateness(stderr), fprintf(stderr, "linkem: %llu flows accepted, %llu refused, %llu UDP drops\n",
                     (unsigned long long)R.accepted, (unsigned long long)R.refused, (unsigned long long)g_udp_drops);
    }
out:
    while (g_conns) conn_close(g_conns, false);
    conn_reap();
    while (g_usess) usess_close(g_usess);
    for (int i = 0; i < R.nmaps; i++)
        if (R.maps[i].w.fd >= 0) close(R.maps[i].w.fd);
    while (g_heap.n) {
        lk_timer *t = g_heap.a[0];
        timer_cancel(t);
        if (t->fire == tun_pkt_fire) tun_free(LK_CONTAINER(t, tun_pkt, t));
    }
    free(g_heap.a);
    if (tun && T.fd >= 0) close(T.fd);
    free(T.pair_last);
    free(T.pair_armed);
    if (sfd >= 0) close(sfd);
    if (g_tfd >= 0) close(g_tfd);
    if (g_ep >= 0) close(g_ep);
    return rc;
}
