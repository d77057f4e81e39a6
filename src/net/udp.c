/* net/udp — datagrams of the lossy all-reduce: their codec and their socket (net.h, "datagrams";
   docs/lossy.md). The codec is the one place a datagram becomes bytes and back: the seam where the
   AEAD of encrypted links will seal and open them (see net.h). */
#define _GNU_SOURCE /* SOCK_NONBLOCK / SOCK_CLOEXEC */
#include "net.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- codec ---- */

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint16_t get16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static bool hn_dgram_ok(uint32_t total, uint32_t offset, uint32_t n) {
    return n >= 1 && n <= HN_DGRAM_MAX_ELEMS && total <= HN_DGRAM_MAX_TOTAL && offset <= total && n <= total - offset;
}

size_t hn_dgram_encode(const hn_dgram *d, uint8_t *out, size_t cap) {
    size_t len = HN_DGRAM_HEADER + (size_t)d->n * 4;
    if (!hn_dgram_ok(d->total, d->offset, d->n) || !d->data || len > cap) return 0;
    put32(out, HN_DGRAM_MAGIC);
    put16(out + 4, HN_DGRAM_VERSION);
    put16(out + 6, HN_DGRAM_PARTIAL);
    put64(out + 8, d->session);
    put32(out + 16, d->seq);
    put16(out + 20, d->device);
    put16(out + 22, 0);
    put32(out + 24, d->total);
    put32(out + 28, d->offset);
    put32(out + 32, d->n);
    memcpy(out + HN_DGRAM_HEADER, d->data, (size_t)d->n * 4);
    /* SEAL SEAM (issue 29): seal out[0, len) here, header as associated data, and return the sealed size */
    return len;
}

static int hn_dgram_bad(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int hn_dgram_bad(char *why, size_t cap, const char *fmt, ...) {
    if (why && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, cap, fmt, ap);
        va_end(ap);
    }
    return HR_EFORMAT;
}

int hn_dgram_decode(const uint8_t *p, size_t len, hn_dgram *out, char *why, size_t why_cap) {
    memset(out, 0, sizeof *out);
    /* SEAL SEAM (issue 29): open (authenticate and decrypt) p[0, len) here, before any field is read */
    if (len < HN_DGRAM_HEADER) return hn_dgram_bad(why, why_cap, "%zu bytes: shorter than a header", len);
    if (get32(p) != HN_DGRAM_MAGIC) return hn_dgram_bad(why, why_cap, "bad magic");
    if (get16(p + 4) != HN_DGRAM_VERSION) return hn_dgram_bad(why, why_cap, "version %u", get16(p + 4));
    if (get16(p + 6) != HN_DGRAM_PARTIAL) return hn_dgram_bad(why, why_cap, "kind %u", get16(p + 6));
    if (get16(p + 22) != 0) return hn_dgram_bad(why, why_cap, "flags %#x", get16(p + 22));
    uint32_t total = get32(p + 24), offset = get32(p + 28), n = get32(p + 32);
    if (!hn_dgram_ok(total, offset, n))
        return hn_dgram_bad(why, why_cap, "elements %u+%u of %u out of range", offset, n, total);
    if (len != HN_DGRAM_HEADER + (size_t)n * 4)
        return hn_dgram_bad(why, why_cap, "%zu bytes for %u elements", len, n);
    *out = (hn_dgram){.session = get64(p + 8), .seq = get32(p + 16), .device = get16(p + 20), .total = total,
                      .offset = offset, .n = n, .data = p + HN_DGRAM_HEADER};
    return 0;
}

/* ---- socket ---- */

struct hn_udp {
    int      fd;
    uint16_t port;
    bool     check_peer;
    struct sockaddr_storage peer;   /* hn_udp_expect_peer: the address datagrams must come from */
};

static uint16_t sa_port(const struct sockaddr_storage *ss) {
    if (ss->ss_family == AF_INET) return ntohs(((const struct sockaddr_in *)ss)->sin_port);
    if (ss->ss_family == AF_INET6) return ntohs(((const struct sockaddr_in6 *)ss)->sin6_port);
    return 0;
}

static void sa_set_port(struct sockaddr_storage *ss, uint16_t port) {
    if (ss->ss_family == AF_INET) ((struct sockaddr_in *)ss)->sin_port = htons(port);
    else if (ss->ss_family == AF_INET6) ((struct sockaddr_in6 *)ss)->sin6_port = htons(port);
}

static bool sa_same_host(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
    if (a->ss_family != b->ss_family) return false;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr, 16);
    return false;
}

hn_udp *hn_udp_open(const hn_conn *beside, hr_err *err) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(hn_conn_fd(beside), (struct sockaddr *)&ss, &sl))
        return hr_fail(err, HR_ENET, "getsockname: %s", strerror(errno)), NULL;
    sa_set_port(&ss, 0);
    hn_udp *u = calloc(1, sizeof *u);
    if (!u) return hr_fail(err, HR_ENOMEM, "out of memory"), NULL;
    u->fd = socket(ss.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (u->fd < 0 || bind(u->fd, (struct sockaddr *)&ss, sl)) {
        hr_fail(err, HR_ENET, "UDP socket: %s", strerror(errno));
        hn_udp_close(u);
        return NULL;
    }
    /* a burst of a batch's partials from several workers must fit while the receiver computes */
    int sz = 4 << 20;
    setsockopt(u->fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
    setsockopt(u->fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    sl = sizeof ss;
    getsockname(u->fd, (struct sockaddr *)&ss, &sl);
    u->port = sa_port(&ss);
    return u;
}

void hn_udp_close(hn_udp *u) {
    if (!u) return;
    if (u->fd >= 0) close(u->fd);
    free(u);
}

uint16_t hn_udp_port(const hn_udp *u) { return u->port; }
int hn_udp_fd(const hn_udp *u) { return u->fd; }

int hn_udp_connect(hn_udp *u, const hn_conn *c, uint16_t port, hr_err *err) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getpeername(hn_conn_fd(c), (struct sockaddr *)&ss, &sl)) return hr_fail(err, HR_ENET, "getpeername: %s", strerror(errno));
    sa_set_port(&ss, port);
    if (connect(u->fd, (struct sockaddr *)&ss, sl)) return hr_fail(err, HR_ENET, "UDP connect: %s", strerror(errno));
    return 0;
}

void hn_udp_expect_peer(hn_udp *u, const hn_conn *c) {
    socklen_t sl = sizeof u->peer;
    u->check_peer = getpeername(hn_conn_fd(c), (struct sockaddr *)&u->peer, &sl) == 0;
}

int hn_udp_send(hn_udp *u, const void *p, size_t n) {
    return send(u->fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)n ? 0 : HR_ENET;
}

long hn_udp_recv(hn_udp *u, void *buf, size_t cap) {
    struct sockaddr_storage from;
    socklen_t fl = sizeof from;
    ssize_t r = recvfrom(u->fd, buf, cap, MSG_DONTWAIT | MSG_TRUNC, (struct sockaddr *)&from, &fl);
    if (r < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
    if (r == 0) return -2;   /* an empty datagram: nothing a decoder would take */
    if (u->check_peer && !sa_same_host(&from, &u->peer)) return -1;
    return r > (ssize_t)cap ? -2 : (long)r;
}
