/* net/udp — the lossy all-reduce's UDP socket beside a TCP connection (net.h, "datagrams") */
#define _GNU_SOURCE /* SOCK_NONBLOCK / SOCK_CLOEXEC */
#include "net.h"

#include <errno.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

struct hn_udp {
    int      fd;
    uint16_t port;
    bool     check_peer, has_reply;
    struct sockaddr_storage peer;   /* hn_udp_expect_peer: the address datagrams must come from */
    struct sockaddr_storage last, reply; /* the last datagram's source; where replies go */
    socklen_t last_len, reply_len;
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
    if (getpeername(hn_conn_fd(c), (struct sockaddr *)&ss, &sl))
        return hr_fail(err, HR_ENET, "getpeername: %s", strerror(errno));
    sa_set_port(&ss, port);
    if (connect(u->fd, (struct sockaddr *)&ss, sl)) return hr_fail(err, HR_ENET, "UDP connect: %s", strerror(errno));
    return 0;
}

void hn_udp_expect_peer(hn_udp *u, const hn_conn *c) {
    socklen_t sl = sizeof u->peer;
    u->check_peer = getpeername(hn_conn_fd(c), (struct sockaddr *)&u->peer, &sl) == 0;
}

void hn_udp_reply_to_last(hn_udp *u) {
    u->reply = u->last;
    u->reply_len = u->last_len;
    u->has_reply = u->last_len > 0;
}

int hn_udp_send(hn_udp *u, const void *p, size_t n) {
    int fl = MSG_DONTWAIT | MSG_NOSIGNAL;
    ssize_t r = u->has_reply ? sendto(u->fd, p, n, fl, (struct sockaddr *)&u->reply, u->reply_len) : send(u->fd, p, n, fl);
    return r == (ssize_t)n ? 0 : HR_ENET;
}

long hn_udp_recv(hn_udp *u, void *buf, size_t cap) {
    struct sockaddr_storage from;
    socklen_t fl = sizeof from;
    ssize_t r = recvfrom(u->fd, buf, cap, MSG_DONTWAIT | MSG_TRUNC, (struct sockaddr *)&from, &fl);
    if (r < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
    if (r == 0) return -2;   /* an empty datagram: nothing a decoder would take */
    if (u->check_peer && !sa_same_host(&from, &u->peer)) return -1;
    u->last = from;
    u->last_len = fl;
    return r > (ssize_t)cap ? -2 : (long)r;
}

int hn_dgram_crypt_init(hn_dgram_crypt *x, const hn_conn *c, hr_err *err) {
    memset(x, 0, sizeof *x);
    hn_replay_init(&x->seen);
    if (!hn_conn_secure(c)) return 0;   /* no cluster key: the datagrams stay plain, as the frames do */
    int rc = hn_conn_dgram_keys(c, &x->send, &x->recv, err);
    x->on = rc == 0;
    return rc;
}

void hn_dgram_crypt_wipe(hn_dgram_crypt *x) { sodium_memzero(x, sizeof *x); }
