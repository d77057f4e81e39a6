/* net/discover: finding workers on the LAN (issue 29, docs/discovery.md). UDP multicast to an
   organisation-local IPv4 group with TTL 1: no daemon (DNS-SD would need avahi or a resolver of our
   own), one socket per side, and a packet small and strict enough to fuzz. Every packet is untrusted:
   it is read into a bounded buffer, decoded strictly, and a bad one is counted and dropped. What a
   head does with an announcement is connect, and the connection's handshake decides trust. */
#include "net.h"

#include <sodium.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#define DISC_MAGIC     0x53445248u /* "HRDS" as a little-endian u32 */
#define DISC_MAX_IFS   32
#define DISC_QUERIES   3           /* per window: one lost datagram does not hide a worker */
#define DISC_BURST     16          /* answers an announcer may give at once ... */
#define DISC_RATE      8           /* ... and per second after that (a query costs the sender little) */
#define DISC_DRAIN_MAX 64          /* packets read per wake-up, so a flood cannot starve the stop */

/* ---- the packet ------------------------------------------------------------------------------------ */

/* what both the encoder and the decoder require of an announcement; NULL or the reason */
static const char *disc_check(const hn_announce *a) {
    if (a->port == 0) return "port: 0";
    if (a->n_threads == 0 || a->n_threads > HN_DISCOVER_MAX_THREADS) return "n_threads: out of range";
    size_t hn = strnlen(a->host, sizeof a->host);
    if (hn > HN_DISCOVER_MAX_HOST) return "host: too long";
    if (hn) {
        uint8_t tmp[16];
        if (inet_pton(AF_INET, a->host, tmp) != 1 && inet_pton(AF_INET6, a->host, tmp) != 1)
            return "host: not a numeric IPv4 or IPv6 address";
    }
    size_t nn = strnlen(a->name, sizeof a->name);
    if (nn == 0 || nn > HN_MAX_NAME) return "name: empty or too long";
    for (size_t i = 0; i < nn; i++)
        if ((uint8_t)a->name[i] < 0x20 || (uint8_t)a->name[i] == 0x7f) return "name: a control character";
    return NULL;
}

int hn_discover_encode(int kind, const hn_announce *a, hn_buf *out, hr_err *err) {
    if (kind != HN_DISC_QUERY && kind != HN_DISC_ANNOUNCE) return hr_fail(err, HR_EINVAL, "discovery: kind %d", kind);
    hn_buf_reset(out);
    hn_buf_put_u32(out, DISC_MAGIC);
    hn_buf_put_u16(out, HN_DISCOVER_VERSION);
    hn_buf_put_u16(out, (uint16_t)kind);
    if (kind == HN_DISC_ANNOUNCE) {
        const char *why = disc_check(a);
        if (why) return hr_fail(err, HR_EINVAL, "announcement.%s", why);
        hn_buf_put_u16(out, a->proto_version);
        hn_buf_put_u16(out, a->port);
        hn_buf_put_raw(out, a->key_id, HN_KEY_ID_SIZE);
        hn_buf_put_u64(out, a->instance);
        hn_buf_put_u32(out, a->n_threads);
        hn_buf_put_u64(out, a->mem_budget);
        hn_buf_put_str(out, a->host, (uint32_t)strlen(a->host));
        hn_buf_put_str(out, a->name, (uint32_t)strlen(a->name));
    }
    if (out->oom) return hr_fail(err, HR_ENOMEM, "out of memory");
    HR_ASSERT(out->len <= HN_DISCOVER_MAX_PACKET);
    return 0;
}

int hn_discover_decode(const void *p, size_t n, int *kind, hn_announce *a, hr_err *err) {
    if (n > HN_DISCOVER_MAX_PACKET)
        return hr_fail(err, HR_ERANGE, "announcement: %zu bytes (at most %d)", n, HN_DISCOVER_MAX_PACKET);
    hn_rd r;
    hn_rd_init(&r, 0, p, n);
    if (hn_rd_u32(&r, "magic") != DISC_MAGIC || r.failed)
        return hr_fail(err, HR_EFORMAT, "not a hearth discovery packet");
    uint16_t version = hn_rd_u16(&r, "version");
    if (!r.failed && version != HN_DISCOVER_VERSION)
        return hr_fail(err, HR_EUNSUPPORTED, "discovery version %u (this is %d)", version, HN_DISCOVER_VERSION);
    uint16_t k = hn_rd_u16(&r, "kind");
    if (!r.failed && k != HN_DISC_QUERY && k != HN_DISC_ANNOUNCE) hn_rd_reject(&r, "kind", "%u", k);
    hn_announce x;
    memset(&x, 0, sizeof x);
    if (k == HN_DISC_ANNOUNCE) {
        x.proto_version = hn_rd_u16(&r, "proto_version");
        x.port = hn_rd_u16(&r, "port");
        hn_rd_raw(&r, x.key_id, HN_KEY_ID_SIZE, "key_id");
        x.instance = hn_rd_u64(&r, "instance");
        x.n_threads = hn_rd_u32(&r, "n_threads");
        x.mem_budget = hn_rd_u64(&r, "mem_budget");
        hn_str host = hn_rd_str(&r, HN_DISCOVER_MAX_HOST, "host");
        hn_str name = hn_rd_str(&r, HN_MAX_NAME, "name");
        if (!r.failed) {
            hn_str_copy(x.host, sizeof x.host, host);
            hn_str_copy(x.name, sizeof x.name, name);
            const char *why = disc_check(&x);
            if (why) hn_rd_reject(&r, "fields", "%s", why);
        }
    }
    if (r.failed) return hr_fail(err, HR_EFORMAT, "announcement.%s", r.why);
    if (r.pos != r.len) return hr_fail(err, HR_EFORMAT, "announcement: %zu bytes after the last field", r.len - r.pos);
    *kind = k;
    if (k == HN_DISC_ANNOUNCE && a) *a = x;
    return 0;
}

/* ---- sockets --------------------------------------------------------------------------------------- */

static int disc_group(const hn_discover_where *w, struct sockaddr_in *g, hr_err *err) {
    const char *s = w && w->group ? w->group : HN_DISCOVER_GROUP;
    char host[64];
    uint16_t port;
    if (hn_parse_addr(s, host, sizeof host, &port, err)) return err ? err->code : HR_EINVAL;
    memset(g, 0, sizeof *g);
    g->sin_family = AF_INET;
    g->sin_port = htons(port);
    if (inet_pton(AF_INET, host, &g->sin_addr) != 1 || !IN_MULTICAST(ntohl(g->sin_addr.s_addr)) || port == 0)
        return hr_fail(err, HR_EINVAL, "discovery group '%s': expected an IPv4 multicast address and a port, like %s",
                       s, HN_DISCOVER_GROUP);
    return 0;
}

/* An interface discovery uses: its index and an IPv4 address of it (the source of what is sent there,
   so that an answer to a query sent on lo comes back from 127.0.0.1, not the machine's LAN address). */
typedef struct disc_if { unsigned idx; struct in_addr addr; } disc_if;

/* The interfaces discovery uses: IPv4, up, multicast-capable or loopback (multicast works on lo when
   the socket names it, which keeps a one-machine cluster findable without a LAN); only `only` if
   given. Returns how many were written (0: none). With `all`, every address of every interface that
   is up (to tell this machine's own addresses). */
static int disc_ifaces(const char *only, bool all, disc_if out[DISC_MAX_IFS]) {
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) return 0;
    int n = 0;
    for (struct ifaddrs *i = ifs; i && n < DISC_MAX_IFS; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
        if (!all && !(i->ifa_flags & (IFF_MULTICAST | IFF_LOOPBACK))) continue;
        if (!all && only && strcmp(only, i->ifa_name)) continue;
        unsigned x = if_nametoindex(i->ifa_name);
        bool seen = x == 0;
        for (int k = 0; k < n && !seen && !all; k++) seen = out[k].idx == x;
        if (!seen) out[n++] = (disc_if){x, ((struct sockaddr_in *)i->ifa_addr)->sin_addr};
    }
    freeifaddrs(ifs);
    return n;
}

static bool v4_loopback(struct in_addr a) { return (ntohl(a.s_addr) >> 24) == 127; } /* 127.0.0.0/8 */

static int disc_socket(uint16_t port, hr_err *err) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return hr_fail(err, HR_ENET, "discovery socket: %s", strerror(errno));
    int one = 1, zero = 0, ttl = 1;
    /* several workers on one machine share the group's port; each gets every multicast packet */
    if (port && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) goto fail;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) goto fail;
    /* TTL 1: the LAN only. MULTICAST_ALL off: only the groups this socket joined (Linux otherwise
       delivers every group any socket of the machine joined on this port) */
    if (setsockopt(fd, IPPROTO_IP, IP_MULTICAST_TTL, &ttl, sizeof ttl) != 0 ||
        setsockopt(fd, IPPROTO_IP, IP_MULTICAST_LOOP, &one, sizeof one) != 0)
        goto fail;
#ifdef IP_MULTICAST_ALL
    (void)setsockopt(fd, IPPROTO_IP, IP_MULTICAST_ALL, &zero, sizeof zero);
#else
    (void)zero;
#endif
    return fd;
fail:;
    int e = errno;
    close(fd);
    return hr_fail(err, HR_ENET, "discovery socket on port %u: %s", port, strerror(e));
}

/* sends pkt to the group out of each interface, from that interface's address; how many sends worked */
static int disc_send_group(int fd, const struct sockaddr_in *g, const disc_if *ifs, int n, const hn_buf *pkt) {
    int ok = 0;
    for (int i = 0; i < n; i++) {
        struct ip_mreqn m = {.imr_ifindex = (int)ifs[i].idx};
        if (setsockopt(fd, IPPROTO_IP, IP_MULTICAST_IF, &m, sizeof m) != 0) continue;
        union { char b[CMSG_SPACE(sizeof(struct in_pktinfo))]; struct cmsghdr align; } cm;
        memset(&cm, 0, sizeof cm);
        struct iovec iov = {.iov_base = pkt->data, .iov_len = pkt->len};
        struct msghdr mh = {.msg_name = (void *)g, .msg_namelen = sizeof *g, .msg_iov = &iov, .msg_iovlen = 1,
                            .msg_control = cm.b, .msg_controllen = sizeof cm.b};
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = IPPROTO_IP;
        c->cmsg_type = IP_PKTINFO;
        c->cmsg_len = CMSG_LEN(sizeof(struct in_pktinfo));
        struct in_pktinfo pi = {.ipi_ifindex = (int)ifs[i].idx, .ipi_spec_dst = ifs[i].addr};
        memcpy(CMSG_DATA(c), &pi, sizeof pi);
        ok += sendmsg(fd, &mh, 0) == (ssize_t)pkt->len;
    }
    return ok;
}

/* one datagram into buf (HN_DISCOVER_MAX_PACKET + 1 bytes); its real length (MSG_TRUNC), or -1 when
   there is nothing (more) to read */
static ssize_t disc_recv(int fd, uint64_t *buf, struct sockaddr_storage *from) {
    socklen_t fl = sizeof *from;
    return recvfrom(fd, buf, HN_DISCOVER_MAX_PACKET + 1, MSG_TRUNC, (struct sockaddr *)from, &fl);
}

/* decodes one received datagram; counts what fails. 0 with *kind (and *a) on success. */
static int disc_take(const uint64_t *buf, ssize_t n, int *kind, hn_announce *a, hn_discover_stats *st) {
    hr_err e = {0};
    st->received++;
    int rc = hn_discover_decode(buf, (size_t)n, kind, a, &e);
    if (rc == HR_ERANGE) st->oversize++;
    else if (rc == HR_EUNSUPPORTED) st->other_version++;
    else if (rc) st->malformed++;
    if (rc && st->malformed + st->oversize + st->other_version <= 3) HR_LOGD("discovery: ignored a packet: %s", e.msg);
    return rc;
}

/* ---- the announcer (a worker) ---------------------------------------------------------------------- */

struct hn_announcer {
    int               fd, wake[2];
    pthread_t         th;
    atomic_bool       stop;
    struct sockaddr_in group;
    char              iface[IF_NAMESIZE];
    bool              one_iface;
    int               period_ms;
    hn_buf            pkt;          /* the encoded announcement */
    unsigned          joined[DISC_MAX_IFS];
    int               n_joined;
    hn_discover_stats st;           /* the thread's own until it is joined */
};

/* joins the group on interfaces not joined yet (a Wi-Fi link that came back is picked up on the next
   announcement); returns the current interfaces in idx */
static int announcer_join(hn_announcer *an, disc_if ifs[DISC_MAX_IFS]) {
    int n = disc_ifaces(an->one_iface ? an->iface : NULL, false, ifs);
    /* an interface that went away took its membership with it: forget it, so it is joined again */
    int kept = 0;
    for (int k = 0; k < an->n_joined; k++) {
        bool there = false;
        for (int i = 0; i < n && !there; i++) there = ifs[i].idx == an->joined[k];
        if (there) an->joined[kept++] = an->joined[k];
    }
    an->n_joined = kept;
    for (int i = 0; i < n; i++) {
        bool have = false;
        for (int k = 0; k < an->n_joined && !have; k++) have = an->joined[k] == ifs[i].idx;
        if (have) continue;
        struct ip_mreqn m = {.imr_multiaddr = an->group.sin_addr, .imr_ifindex = (int)ifs[i].idx};
        if (setsockopt(an->fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &m, sizeof m) != 0 && errno != EADDRINUSE) {
            char name[IF_NAMESIZE] = "?";
            if_indextoname(ifs[i].idx, name);
            HR_LOGD("discovery: cannot join the group on %s: %s", name, strerror(errno));
            continue;
        }
        if (an->n_joined < DISC_MAX_IFS) an->joined[an->n_joined++] = ifs[i].idx;
    }
    return n;
}

static void *announcer_main(void *arg) {
    hn_announcer *an = arg;
    int64_t next = 0, refill = hr_time_ns();
    double tokens = DISC_BURST;
    uint64_t buf[HN_DISCOVER_MAX_PACKET / 8 + 1];
    while (!atomic_load(&an->stop)) {
        int64_t now = hr_time_ns();
        if (now >= next) {
            disc_if ifs[DISC_MAX_IFS];
            int n = announcer_join(an, ifs);
            an->st.sent += (uint32_t)disc_send_group(an->fd, &an->group, ifs, n, &an->pkt);
            next = now + (int64_t)an->period_ms * 1000000;
        }
        struct pollfd pf[2] = {{.fd = an->fd, .events = POLLIN}, {.fd = an->wake[0], .events = POLLIN}};
        int wait_ms = (int)((next - now) / 1000000) + 1;
        if (poll(pf, 2, wait_ms) < 0 && errno != EINTR) break;
        if (pf[1].revents) break;
        if (!(pf[0].revents & POLLIN)) continue;
        for (int i = 0; i < DISC_DRAIN_MAX; i++) {
            struct sockaddr_storage from;
            ssize_t n = disc_recv(an->fd, buf, &from);
            if (n < 0) break;
            int kind;
            hn_announce other;
            if (disc_take(buf, n, &kind, &other, &an->st)) continue;
            if (kind != HN_DISC_QUERY || from.ss_family != AF_INET || ((struct sockaddr_in *)&from)->sin_port == 0) {
                an->st.ignored++;
                continue;
            }
            int64_t t = hr_time_ns();
            tokens = HR_MIN(DISC_BURST, tokens + (double)(t - refill) * 1e-9 * DISC_RATE);
            refill = t;
            if (tokens < 1) {
                an->st.rate_limited++;
                continue;
            }
            tokens -= 1;
            /* unicast back to the asker: only it wants the answer, and it needs no group membership */
            if (sendto(an->fd, an->pkt.data, an->pkt.len, 0, (struct sockaddr *)&from, sizeof(struct sockaddr_in)) ==
                (ssize_t)an->pkt.len)
                an->st.sent++;
        }
    }
    return NULL;
}

hn_announcer *hn_announcer_start(const hn_discover_where *w, const hn_announce *a, int period_ms, hr_err *err) {
    hn_announcer *an = calloc(1, sizeof *an);
    if (!an) { hr_fail(err, HR_ENOMEM, "out of memory"); return NULL; }
    an->fd = an->wake[0] = an->wake[1] = -1;
    hn_buf_init(&an->pkt);
    an->period_ms = period_ms > 0 ? period_ms : 5000;
    hn_announce x = *a;
    if (sodium_init() < 0) { hr_fail(err, HR_EIO, "libsodium could not be initialised"); goto fail; }
    while (x.instance == 0) randombytes_buf(&x.instance, sizeof x.instance);
    if (disc_group(w, &an->group, err) || hn_discover_encode(HN_DISC_ANNOUNCE, &x, &an->pkt, err)) goto fail;
    if (w && w->iface) {
        if (strlen(w->iface) >= sizeof an->iface || !if_nametoindex(w->iface)) {
            hr_fail(err, HR_EINVAL, "discovery: no network interface '%s'", w->iface);
            goto fail;
        }
        snprintf(an->iface, sizeof an->iface, "%s", w->iface);
        an->one_iface = true;
    }
    if ((an->fd = disc_socket(ntohs(an->group.sin_port), err)) < 0) goto fail;
    if (pipe(an->wake) != 0) { hr_fail(err, HR_EIO, "pipe: %s", strerror(errno)); goto fail; }
    for (int i = 0; i < 2; i++) fcntl(an->wake[i], F_SETFD, FD_CLOEXEC);
    disc_if ifs[DISC_MAX_IFS];
    if (announcer_join(an, ifs) == 0 || an->n_joined == 0) {
        hr_fail(err, HR_ENET, "discovery: no interface could join %s%s%s", w && w->group ? w->group : HN_DISCOVER_GROUP,
                an->one_iface ? " on " : "", an->one_iface ? an->iface : "");
        goto fail;
    }
    /* the thread takes no signals: the process's handlers (a worker's SIGTERM) run on its own threads */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&an->th, NULL, announcer_main, an);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) { hr_fail(err, HR_EIO, "cannot start the announcer thread: %s", strerror(rc)); goto fail; }
    return an;
fail:
    if (an->fd >= 0) close(an->fd);
    for (int i = 0; i < 2; i++) if (an->wake[i] >= 0) close(an->wake[i]);
    hn_buf_free(&an->pkt);
    free(an);
    return NULL;
}

void hn_announcer_stop(hn_announcer *an, hn_discover_stats *st) {
    if (!an) return;
    atomic_store(&an->stop, true);
    ssize_t w = write(an->wake[1], "x", 1); /* wakes the poll; the flag covers a thread not yet in it */
    (void)w;
    pthread_join(an->th, NULL);
    if (st) *st = an->st;
    close(an->fd);
    close(an->wake[0]);
    close(an->wake[1]);
    hn_buf_free(&an->pkt);
    free(an);
}

/* ---- the querier (a head, hearth workers) ---------------------------------------------------------- */

static int found_cmp(const void *a, const void *b) {
    return strcmp(((const hn_found *)a)->addr, ((const hn_found *)b)->addr);
}

/* the address a head should connect to, from the announcement and where it came from; false when it
   cannot be right (a loopback address announced from another machine) */
static bool found_addr(const hn_announce *a, const struct sockaddr_in *from, const disc_if *own, int n_own,
                       hn_found *f) {
    bool local = v4_loopback(from->sin_addr);
    for (int i = 0; i < n_own && !local; i++) local = own[i].addr.s_addr == from->sin_addr.s_addr;
    if (a->host[0]) {
        struct in6_addr v6;
        struct in_addr v4;
        bool six = inet_pton(AF_INET6, a->host, &v6) == 1;
        f->loopback = six ? IN6_IS_ADDR_LOOPBACK(&v6) : inet_pton(AF_INET, a->host, &v4) == 1 && v4_loopback(v4);
        if (f->loopback && !local) return false;
        snprintf(f->addr, sizeof f->addr, six ? "[%s]:%u" : "%s:%u", a->host, a->port);
    } else {
        char h[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &from->sin_addr, h, sizeof h);
        snprintf(f->addr, sizeof f->addr, "%s:%u", h, a->port);
        f->loopback = v4_loopback(from->sin_addr);
    }
    return true;
}

/* one answer into the list: a new instance is added, a known one heard over a LAN interface replaces
   what was heard over loopback (that address would not do for the other workers) */
static void found_add(hn_discovery *out, const hn_announce *a, const struct sockaddr_in *from, const disc_if *ifs,
                      int n_ifs, const uint8_t *key_id) {
    hn_found f = {.a = *a, .same_key = key_id && !memcmp(key_id, a->key_id, HN_KEY_ID_SIZE)};
    if (!found_addr(a, from, ifs, n_ifs, &f)) { out->st.malformed++; return; }
    if (!f.same_key) out->st.foreign_key++;
    for (int i = 0; i < out->n; i++) {
        if (out->w[i].a.instance != a->instance) continue;
        out->st.duplicates++;
        if (out->w[i].loopback && !f.loopback) out->w[i] = f;
        return;
    }
    if (out->n == HN_DISCOVER_MAX_FOUND) { out->st.ignored++; return; }
    out->w[out->n++] = f;
}

int hn_discover(const hn_discover_where *w, const uint8_t *key_id, int window_ms, hn_discovery *out, hr_err *err) {
    memset(out, 0, sizeof *out);
    struct sockaddr_in g;
    if (disc_group(w, &g, err)) return err ? err->code : HR_EINVAL;
    const char *only = w ? w->iface : NULL;
    if (only && !if_nametoindex(only)) return hr_fail(err, HR_EINVAL, "discovery: no network interface '%s'", only);
    disc_if ifs[DISC_MAX_IFS], own[DISC_MAX_IFS];
    int n_if = disc_ifaces(only, false, ifs), n_own = disc_ifaces(NULL, true, own);
    if (n_if == 0)
        return hr_fail(err, HR_ENET, "discovery: no network interface is up%s%s", only ? ": " : "", only ? only : "");
    int fd = disc_socket(0, err); /* an ephemeral port: the answers come back to it alone */
    if (fd < 0) return err ? err->code : HR_ENET;
    hn_buf q;
    hn_buf_init(&q);
    int rc = hn_discover_encode(HN_DISC_QUERY, NULL, &q, err);
    int64_t t0 = hr_time_ns(), end = t0 + (int64_t)HR_MAX(window_ms, 1) * 1000000;
    int sent_q = 0;
    uint64_t buf[HN_DISCOVER_MAX_PACKET / 8 + 1];
    while (!rc) {
        int64_t now = hr_time_ns();
        if (now >= end) break;
        int64_t next_q = sent_q < DISC_QUERIES ? t0 + (end - t0) * sent_q / DISC_QUERIES : end;
        if (now >= next_q) {
            int ok = disc_send_group(fd, &g, ifs, n_if, &q);
            out->st.sent += (uint32_t)ok;
            if (ok == 0 && sent_q == 0)
                rc = hr_fail(err, HR_ENET, "discovery: cannot send to %s on any interface: %s",
                             w && w->group ? w->group : HN_DISCOVER_GROUP, strerror(errno));
            sent_q++;
            continue;
        }
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int64_t until = HR_MIN(next_q, end);
        if (poll(&pf, 1, (int)((until - now + 999999) / 1000000)) < 0 && errno != EINTR) {
            rc = hr_fail(err, HR_ENET, "discovery: poll: %s", strerror(errno));
            break;
        }
        for (int i = 0; i < DISC_DRAIN_MAX && (pf.revents & POLLIN); i++) {
            struct sockaddr_storage from;
            ssize_t n = disc_recv(fd, buf, &from);
            if (n < 0) break;
            int kind;
            hn_announce a;
            if (disc_take(buf, n, &kind, &a, &out->st)) continue;
            if (kind != HN_DISC_ANNOUNCE || from.ss_family != AF_INET) { out->st.ignored++; continue; }
            int before = out->n;
            found_add(out, &a, (struct sockaddr_in *)&from, own, n_own, key_id);
            if (out->n > before)
                HR_LOGD("discovery: %s answered %.1f ms after the first query", out->w[out->n - 1].addr,
                        (double)(hr_time_ns() - t0) * 1e-6);
        }
    }
    hn_buf_free(&q);
    close(fd);
    if (!rc) qsort(out->w, (size_t)out->n, sizeof out->w[0], found_cmp);
    return rc;
}
