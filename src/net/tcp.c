/* net/tcp — listening, connecting, and whole frames over TCP with deadlines (net.h)
 *
 * Every socket is non-blocking; each wait is a poll() bounded by the caller's deadline, so a silent
 * or vanished peer turns into HR_ETIMEDOUT instead of a hang, on the sending side too (a peer that
 * stops reading fills our socket buffer). */
#define _GNU_SOURCE /* accept4, SOCK_NONBLOCK / SOCK_CLOEXEC */
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define HN_MAX_PARTS 8

/* Linux makes sockets non-blocking and close-on-exec in the creating call; elsewhere (macOS, untested)
   fcntl does it afterwards and SO_NOSIGPIPE stands in for MSG_NOSIGNAL. */
#if defined(SOCK_NONBLOCK) && defined(SOCK_CLOEXEC) && defined(__linux__)
#define HN_SOCK_ATOMIC 1 /* (glibc's SOCK_* are enums: #if cannot test their values) */
#define HN_SOCK_FLAGS  (SOCK_NONBLOCK | SOCK_CLOEXEC)
#else
#define HN_SOCK_ATOMIC 0
#define HN_SOCK_FLAGS  0
#endif
#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0
#endif

struct hn_listener {
    int      fd;
    uint16_t port;
};

/* one direction of an encrypted session: its key, the next nonce, and when it ratchets */
typedef struct hn_dir {
    uint8_t  k[HN_NOISE_KEY_SIZE];
    uint64_t n;         /* frames under this direction so far: the next frame's nonce */
    uint64_t since;     /* frames since the last ratchet */
    int64_t  t0;        /* time of the last ratchet (sender side only) */
} hn_dir;

typedef struct hn_sec {
    hn_dir  tx, rx;     /* each touched only by the thread using that direction */
    hn_buf  txbuf;      /* the frame being sealed: sending thread only */
    uint8_t dg_send[HN_NOISE_KEY_SIZE], dg_recv[HN_NOISE_KEY_SIZE];
} hn_sec;

struct hn_conn {
    int  fd;
    char peer[INET6_ADDRSTRLEN + 10];
    /* a partial frame went out / came in: that direction has lost its place in the stream.
       Each flag is touched only by the thread using that direction. */
    bool tx_broken, rx_broken;
    _Atomic uint64_t bytes_sent, bytes_received, frames_sent, frames_received;
    hn_buf scratch; /* hn_msg_send's encoded head: sending thread only */
    hn_sec *sec;    /* NULL: plaintext; set once, by the handshake, before any other traffic */
    uint64_t rekey_messages;
    int64_t  rekey_ns;
    _Atomic uint64_t rekeys_sent, rekeys_received;
};

/* ---- helpers ---- */

/* what HN_SOCK_FLAGS could not do at creation; 0 or -1 (errno set) */
static int sock_prepare(int fd) {
#if !HN_SOCK_ATOMIC
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) return -1;
#endif
#ifdef SO_NOSIGPIPE
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
    (void)fd;
    return 0;
}

static int new_socket(const struct addrinfo *ai) {
    int fd = socket(ai->ai_family, ai->ai_socktype | HN_SOCK_FLAGS, ai->ai_protocol);
    if (fd >= 0 && sock_prepare(fd)) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* Waits until fd has `events` or the deadline passes: 1 ready (or error/hangup pending, which the
   following call reports), 0 deadline passed, negative errno. */
static int wait_fd(int fd, short events, int64_t deadline) {
    for (;;) {
        int timeout = -1;
        if (deadline != HN_NO_DEADLINE) {
            int64_t left = deadline - hr_time_ns();
            if (left <= 0) return 0;
            int64_t ms = (left + 999999) / 1000000; /* round up: waking early would spin */
            timeout = ms > INT_MAX ? INT_MAX : (int)ms;
        }
        struct pollfd p = { .fd = fd, .events = events };
        int r = poll(&p, 1, timeout);
        if (r > 0) return 1;
        if (r < 0 && errno != EINTR) return -errno;
    }
}

static void format_sockaddr(const struct sockaddr *sa, socklen_t len, char *out, size_t cap) {
    char host[INET6_ADDRSTRLEN], serv[16];
    if (getnameinfo(sa, len, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV)) {
        snprintf(out, cap, "?");
        return;
    }
    snprintf(out, cap, sa->sa_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, serv);
}

int hn_parse_addr(const char *s, char *host, size_t host_cap, uint16_t *port, hr_err *err) {
    if (!s) return hr_fail(err, HR_EINVAL, "address is missing");
    const char *hb, *he, *ps;
    if (s[0] == '[') {
        hb = s + 1;
        he = strchr(hb, ']');
        if (!he) return hr_fail(err, HR_EINVAL, "address '%s': missing ']'", s);
        if (he[1] != ':') return hr_fail(err, HR_EINVAL, "address '%s': expected ':PORT' after ']'", s);
        ps = he + 2;
    } else {
        const char *c = strrchr(s, ':');
        if (!c) return hr_fail(err, HR_EINVAL, "address '%s': expected HOST:PORT", s);
        if (memchr(s, ':', (size_t)(c - s)))
            return hr_fail(err, HR_EINVAL, "address '%s': write IPv6 addresses in brackets, like [::1]:7070", s);
        hb = s;
        he = c;
        ps = c + 1;
    }
    unsigned long v = 0;
    size_t nd = 0;
    for (const char *q = ps; *q; q++, nd++) {
        if (*q < '0' || *q > '9' || nd >= 5) return hr_fail(err, HR_EINVAL, "address '%s': bad port '%s'", s, ps);
        v = v * 10 + (unsigned long)(*q - '0');
    }
    if (nd == 0 || v > 65535) return hr_fail(err, HR_EINVAL, "address '%s': bad port '%s'", s, ps);
    size_t hn = (size_t)(he - hb);
    if (hn >= host_cap) return hr_fail(err, HR_EINVAL, "address '%s': host name too long", s);
    memcpy(host, hb, hn);
    host[hn] = 0;
    *port = (uint16_t)v;
    return HR_OK;
}

static int resolve(const char *addr, bool passive, char *host, size_t host_cap, struct addrinfo **res, hr_err *err) {
    uint16_t port;
    int rc = hn_parse_addr(addr, host, host_cap, &port, err);
    if (rc) return rc;
    if (!passive && !host[0]) return hr_fail(err, HR_EINVAL, "address '%s': a host is needed to connect", addr);
    if (!passive && port == 0) return hr_fail(err, HR_EINVAL, "address '%s': port 0 cannot be connected to", addr);
    char serv[8];
    snprintf(serv, sizeof serv, "%u", port);
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                              .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0) };
    int g = getaddrinfo(host[0] ? host : NULL, serv, &hints, res);
    if (g)
        return hr_fail(err, HR_ENET, "address '%s': %s", addr, g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
    return HR_OK;
}

bool hn_addr_is_loopback(const char *addr) {
    char host[256];
    struct addrinfo *res = NULL;
    if (resolve(addr, true, host, sizeof host, &res, NULL)) return false;
    bool lo = host[0] != 0 && res != NULL;
    for (struct addrinfo *ai = res; ai && lo; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET)
            lo = (ntohl(((struct sockaddr_in *)ai->ai_addr)->sin_addr.s_addr) >> 24) == 127;
        else if (ai->ai_family == AF_INET6)
            lo = IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr);
        else
            lo = false;
    }
    freeaddrinfo(res);
    return lo;
}

/* ---- listener ---- */

hn_listener *hn_listen(const char *addr, hr_err *err) {
    char host[256];
    struct addrinfo *res = NULL;
    if (resolve(addr, true, host, sizeof host, &res, err)) return NULL;
    int fd = -1, last_errno = 0;
    const char *last_op = "socket";
    /* "any address" (empty host): prefer one dual-stack IPv6 socket, which also takes IPv4 */
    for (int pass = 0; pass < 2 && fd < 0; pass++) {
        for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
            bool v6_first = !host[0] && ai->ai_family == AF_INET6;
            if (pass == 0 ? !v6_first : v6_first) continue;
            fd = new_socket(ai);
            if (fd < 0) { last_errno = errno; last_op = "socket"; continue; }
            int one = 1, zero = 0;
            /* a restarted worker must be able to rebind while old connections sit in TIME_WAIT */
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            if (v6_first) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
            const char *op = bind(fd, ai->ai_addr, ai->ai_addrlen) ? "bind" : listen(fd, 64) ? "listen" : NULL;
            if (op) {
                last_errno = errno;
                last_op = op;
                close(fd);
                fd = -1;
            }
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        hr_fail(err, HR_ENET, "listen on %s: %s: %s", addr, last_op, strerror(last_errno));
        return NULL;
    }
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    uint16_t port = 0;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) == 0)
        port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                              : ((struct sockaddr_in *)&ss)->sin_port);
    hn_listener *l = malloc(sizeof *l);
    if (!l) {
        close(fd);
        hr_fail(err, HR_ENOMEM, "listen on %s: out of memory", addr);
        return NULL;
    }
    l->fd = fd;
    l->port = port;
    return l;
}

uint16_t hn_listener_port(const hn_listener *l) { return l->port; }
int hn_listener_fd(const hn_listener *l) { return l->fd; }

void hn_listener_close(hn_listener *l) {
    if (!l) return;
    close(l->fd);
    free(l);
}

/* ---- connections ---- */

static hn_conn *conn_new(int fd, const struct sockaddr *sa, socklen_t salen, hr_err *err) {
    int one = 1;
    /* frames are written whole; Nagle would only delay the last segment of each */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* waits with HN_NO_DEADLINE still notice a peer that vanished (power off, Wi-Fi gone): about 50 s */
    int idle = 30, intvl = 5, cnt = 4;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
#if defined(TCP_KEEPIDLE)
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
#elif defined(TCP_KEEPALIVE)
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPALIVE, &idle, sizeof idle); /* macOS spelling */
#endif
#ifdef TCP_KEEPINTVL
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
#endif
#ifdef TCP_KEEPCNT
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
#endif
    (void)idle; (void)intvl; (void)cnt;
    hn_conn *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        hr_fail(err, HR_ENOMEM, "out of memory for a connection");
        return NULL;
    }
    c->fd = fd;
    c->rekey_messages = HN_REKEY_MESSAGES;
    c->rekey_ns = (int64_t)HN_REKEY_MS * 1000000;
    format_sockaddr(sa, salen, c->peer, sizeof c->peer);
    hn_buf_init(&c->scratch);
    return c;
}

hn_conn *hn_accept(hn_listener *l, int64_t deadline, hr_err *err) {
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
#if HN_SOCK_ATOMIC
        int fd = accept4(l->fd, (struct sockaddr *)&ss, &len, HN_SOCK_FLAGS);
#else
        int fd = accept(l->fd, (struct sockaddr *)&ss, &len);
        if (fd >= 0 && sock_prepare(fd)) {
            hr_fail(err, HR_ENET, "accept on port %u: fcntl: %s", l->port, strerror(errno));
            close(fd);
            return NULL;
        }
#endif
        if (fd >= 0) return conn_new(fd, (struct sockaddr *)&ss, len, err);
        /* ECONNABORTED: that client gave up before we took it; wait for the next */
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
            hr_fail(err, HR_ENET, "accept on port %u: %s", l->port, strerror(errno));
            return NULL;
        }
        int w = wait_fd(l->fd, POLLIN, deadline);
        if (w == 0) {
            hr_fail(err, HR_ETIMEDOUT, "accept on port %u: no connection by the deadline", l->port);
            return NULL;
        }
        if (w < 0) { hr_fail(err, HR_ENET, "accept on port %u: poll: %s", l->port, strerror(-w)); return NULL; }
    }
}

hn_conn *hn_connect(const char *addr, int64_t deadline, hr_err *err) {
    char host[256];
    struct addrinfo *res = NULL;
    if (resolve(addr, false, host, sizeof host, &res, err)) return NULL;
    int last_errno = ECONNREFUSED;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = new_socket(ai);
        if (fd < 0) { last_errno = errno; continue; }
        int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (r < 0 && errno == EINPROGRESS) {
            int w = wait_fd(fd, POLLOUT, deadline);
            if (w == 0) {
                close(fd);
                freeaddrinfo(res);
                hr_fail(err, HR_ETIMEDOUT, "connect to %s: no answer by the deadline", addr);
                return NULL;
            }
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (w < 0) soerr = -w;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl)) soerr = errno;
            r = soerr ? -1 : 0;
            errno = soerr;
        }
        if (r == 0) {
            hn_conn *c = conn_new(fd, ai->ai_addr, ai->ai_addrlen, err);
            freeaddrinfo(res);
            return c;
        }
        last_errno = errno;
        close(fd);
    }
    freeaddrinfo(res);
    hr_fail(err, HR_ENET, "connect to %s: %s", addr, strerror(last_errno));
    return NULL;
}

void hn_conn_close(hn_conn *c) {
    if (!c) return;
    close(c->fd);
    hn_buf_free(&c->scratch);
    if (c->sec) {
        hn_buf_free(&c->sec->txbuf);
        sodium_memzero(c->sec, sizeof *c->sec);
        free(c->sec);
    }
    free(c);
}

void hn_conn_shutdown(hn_conn *c) { shutdown(c->fd, SHUT_RDWR); }
const char *hn_conn_peer(const hn_conn *c) { return c->peer; }
int hn_conn_fd(const hn_conn *c) { return c->fd; }

void hn_conn_get_stats(const hn_conn *c, hn_conn_stats *out) {
    hn_conn *m = (hn_conn *)c; /* atomic loads take non-const pointers in C11 */
    out->bytes_sent = atomic_load_explicit(&m->bytes_sent, memory_order_relaxed);
    out->bytes_received = atomic_load_explicit(&m->bytes_received, memory_order_relaxed);
    out->frames_sent = atomic_load_explicit(&m->frames_sent, memory_order_relaxed);
    out->frames_received = atomic_load_explicit(&m->frames_received, memory_order_relaxed);
    out->rekeys_sent = atomic_load_explicit(&m->rekeys_sent, memory_order_relaxed);
    out->rekeys_received = atomic_load_explicit(&m->rekeys_received, memory_order_relaxed);
}

bool hn_conn_secure(const hn_conn *c) { return c->sec != NULL; }

void hn_conn_set_rekey(hn_conn *c, uint64_t messages, int64_t ms) {
    c->rekey_messages = messages ? messages : HN_REKEY_MESSAGES;
    c->rekey_ns = (ms ? ms : HN_REKEY_MS) * 1000000;
}

/* ---- the capture hook (tests): HEARTH_NET_CAPTURE=FILE gets every byte sent ---- */

static pthread_once_t capture_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t capture_lock = PTHREAD_MUTEX_INITIALIZER;
static int capture_fd = -1;

static void capture_open(void) {
    const char *p = getenv("HEARTH_NET_CAPTURE");
    if (p && *p) capture_fd = open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
}

/* the first k bytes of iov (what one sendmsg took), one write per piece under a lock */
static void capture(const struct iovec *iov, int n_iov, size_t k) {
    pthread_once(&capture_once, capture_open);
    if (capture_fd < 0) return;
    pthread_mutex_lock(&capture_lock);
    for (int i = 0; i < n_iov && k; i++) {
        size_t n = HR_MIN(k, iov[i].iov_len);
        if (write(capture_fd, iov[i].iov_base, n) != (ssize_t)n) break;
        k -= n;
    }
    pthread_mutex_unlock(&capture_lock);
}

void hn_frame_free(hn_frame *f) {
    free(f->payload);
    memset(f, 0, sizeof *f);
}

/* ---- frames ---- */

/* Sends header + parts; an encrypted session seals them into sec->txbuf first (one copy, then the
   cipher in place: the cost is measured in docs/benchmarks.md, "Issue 29"). `max` is the payload limit. */
static int send_impl(hn_conn *c, int type, uint32_t seq, const hn_iov *parts, int n_parts, uint32_t max,
                     int64_t deadline, hr_err *err) {
    HR_ASSERT(n_parts >= 0 && n_parts <= HN_MAX_PARTS);
    if (c->tx_broken)
        return hr_fail(err, HR_ENET, "send to %s: connection unusable after an earlier send error", c->peer);

    uint8_t hdr[HN_HEADER_SIZE];
    struct iovec iov[HN_MAX_PARTS + 1];
    int n_iov = 1;
    size_t total = 0;
    iov[0].iov_base = hdr;
    iov[0].iov_len = sizeof hdr;
    for (int i = 0; i < n_parts; i++) {
        if (!parts[i].n) continue;
        if (parts[i].n > max - total)
            return hr_fail(err, HR_EINVAL, "send %s to %s: payload exceeds its limit of %u bytes",
                           hn_msg_name(type), c->peer, max);
        total += parts[i].n;
        iov[n_iov].iov_base = (void *)parts[i].p;
        iov[n_iov].iov_len = parts[i].n;
        n_iov++;
    }
    hn_sec *sec = c->sec;
    bool ratchet = false;
    if (sec) {
        hn_dir *d = &sec->tx;
        if (d->n >= UINT64_MAX - 1) /* 2^64 frames: never in practice, but a nonce must not repeat */
            return hr_fail(err, HR_EAUTH, "send to %s: the session has used all its nonces", c->peer);
        ratchet = d->since + 1 >= c->rekey_messages || hr_time_ns() - d->t0 >= c->rekey_ns;
        hn_header_encode(hdr, type | (ratchet ? (int)HN_FRAME_REKEY : 0), (uint32_t)total, seq);
        hn_buf_reset(&sec->txbuf);
        for (int i = 1; i < n_iov; i++) hn_buf_put_raw(&sec->txbuf, iov[i].iov_base, iov[i].iov_len);
        static const uint8_t tag_room[HN_AEAD_TAG_SIZE];
        hn_buf_put_raw(&sec->txbuf, tag_room, sizeof tag_room);
        if (sec->txbuf.oom) return hr_fail(err, HR_ENOMEM, "send %s to %s: out of memory", hn_msg_name(type), c->peer);
        hn_aead_seal(d->k, d->n, hdr, sizeof hdr, sec->txbuf.data, total, sec->txbuf.data);
        iov[1].iov_base = sec->txbuf.data;
        iov[1].iov_len = total + HN_AEAD_TAG_SIZE;
        n_iov = 2;
    } else {
        hn_header_encode(hdr, type, (uint32_t)total, seq);
    }

    size_t left = sizeof hdr + total + (sec ? HN_AEAD_TAG_SIZE : 0), all = left;
    int first = 0;
    while (left) {
        struct msghdr mh = { .msg_iov = iov + first, .msg_iovlen = (size_t)(n_iov - first) };
        ssize_t k = sendmsg(c->fd, &mh, MSG_NOSIGNAL); /* MSG_NOSIGNAL: a closed peer is an error, not SIGPIPE */
        if (k < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int w = wait_fd(c->fd, POLLOUT, deadline);
                if (w > 0) continue;
                /* nothing sent: the nonce was not used on the wire, and is used again by the next frame */
                c->tx_broken = left != all;
                if (w == 0)
                    return hr_fail(err, HR_ETIMEDOUT,
                                   "send %s to %s: peer not reading (%zu of %zu bytes sent by the deadline)",
                                   hn_msg_name(type), c->peer, all - left, all);
                return hr_fail(err, HR_ENET, "send %s to %s: poll: %s", hn_msg_name(type), c->peer, strerror(-w));
            }
            c->tx_broken = true;
            if (errno == EPIPE || errno == ECONNRESET)
                return hr_fail(err, HR_ENET, "send %s to %s: peer closed the connection", hn_msg_name(type), c->peer);
            return hr_fail(err, HR_ENET, "send %s to %s: %s", hn_msg_name(type), c->peer, strerror(errno));
        }
        capture(iov + first, n_iov - first, (size_t)k);
        atomic_fetch_add_explicit(&c->bytes_sent, (uint64_t)k, memory_order_relaxed);
        left -= (size_t)k;
        size_t adv = (size_t)k;
        while (adv) {
            if (adv >= iov[first].iov_len) {
                adv -= iov[first].iov_len;
                first++;
            } else {
                iov[first].iov_base = (uint8_t *)iov[first].iov_base + adv;
                iov[first].iov_len -= adv;
                adv = 0;
            }
        }
    }
    if (sec) {
        hn_dir *d = &sec->tx;
        d->n++;
        d->since++;
        if (ratchet) {
            hn_noise_rekey(d->k);
            d->since = 0;
            d->t0 = hr_time_ns();
            atomic_fetch_add_explicit(&c->rekeys_sent, 1, memory_order_relaxed);
        }
    }
    atomic_fetch_add_explicit(&c->frames_sent, 1, memory_order_relaxed);
    return HR_OK;
}

int hn_send_frame(hn_conn *c, int type, uint32_t seq, const hn_iov *parts, int n_parts,
                  int64_t deadline, hr_err *err) {
    uint32_t max = hn_msg_max_payload(type);
    if (!max) return hr_fail(err, HR_EINVAL, "send to %s: unknown message type %d", c->peer, type);
    return send_impl(c, type, seq, parts, n_parts, max, deadline, err);
}

/* Reads exactly n bytes into buf. `what` names them in messages; *got counts what arrived;
   frame_start: a close before the first byte is the peer's orderly goodbye, not a torn frame. */
static int read_full(hn_conn *c, uint8_t *buf, size_t n, size_t *got, int64_t deadline, const char *what,
                     bool frame_start, hr_err *err) {
    while (*got < n) {
        ssize_t k = recv(c->fd, buf + *got, n - *got, 0);
        if (k > 0) {
            *got += (size_t)k;
            atomic_fetch_add_explicit(&c->bytes_received, (uint64_t)k, memory_order_relaxed);
            continue;
        }
        if (k == 0) {
            if (*got == 0 && frame_start)
                return hr_fail(err, HR_ENET, "%s: peer closed the connection", c->peer);
            return hr_fail(err, HR_ENET, "%s: peer closed the connection in the middle of a %s (%zu of %zu bytes)",
                           c->peer, what, *got, n);
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int w = wait_fd(c->fd, POLLIN, deadline);
            if (w > 0) continue;
            if (w == 0)
                return hr_fail(err, HR_ETIMEDOUT, "%s: timed out waiting for a %s (%zu of %zu bytes by the deadline)",
                               c->peer, what, *got, n);
            return hr_fail(err, HR_ENET, "%s: poll: %s", c->peer, strerror(-w));
        }
        if (errno == ECONNRESET) return hr_fail(err, HR_ENET, "%s: connection reset by peer", c->peer);
        return hr_fail(err, HR_ENET, "%s: recv: %s", c->peer, strerror(errno));
    }
    return HR_OK;
}

/* hs_ok: a handshake frame (HN_FRAME_HANDSHAKE, at most HN_NOISE_MSG_MAX bytes) is taken too */
static int recv_impl(hn_conn *c, hn_frame *f, int64_t deadline, bool hs_ok, hr_err *err) {
    if (c->rx_broken) return hr_fail(err, HR_ENET, "%s: connection unusable after an earlier receive error", c->peer);
    uint8_t hdr[HN_HEADER_SIZE], plain[HN_HEADER_SIZE];
    size_t got = 0;
    int rc = read_full(c, hdr, sizeof hdr, &got, deadline, "frame header", true, err);
    if (rc) {
        c->rx_broken = !(rc == HR_ETIMEDOUT && got == 0); /* nothing consumed: the stream is intact */
        return rc;
    }
    hn_sec *sec = c->sec;
    memcpy(plain, hdr, sizeof hdr);
    bool ratchet = false;
    if (sec) { /* the flag lives in the type's top bit; the header as sent is what the tag covers */
        ratchet = plain[7] & (HN_FRAME_REKEY >> 8);
        plain[7] &= (uint8_t)~(HN_FRAME_REKEY >> 8);
    }
    hn_header h;
    hr_err e = { 0 };
    if (hs_ok && !sec && hdr[6] == (HN_FRAME_HANDSHAKE & 0xff) && hdr[7] == (HN_FRAME_HANDSHAKE >> 8)) {
        plain[6] = HN_MSG_ERROR; /* magic and version checked as for an ERROR; the length below */
        plain[7] = 0;
        rc = hn_header_decode(plain, &h, &e);
        h.type = (int)HN_FRAME_HANDSHAKE;
        /* the handshake's headers are not authenticated: they must be exactly what a hearth peer sends */
        if (!rc && (h.len != HN_NOISE_MSG_SIZE || h.seq != 0))
            rc = hr_fail(&e, HR_EPROTO, "a handshake message of %u bytes, seq %u (expected %d, 0)", h.len, h.seq,
                         HN_NOISE_MSG_SIZE);
    } else {
        rc = hn_header_decode(plain, &h, &e);
    }
    if (rc) {
        c->rx_broken = true;
        return hr_fail(err, rc, "frame from %s: %s", c->peer, e.msg);
    }
    size_t need = h.len + (sec ? HN_AEAD_TAG_SIZE : 0);
    /* h.len is within the type's limit here, so this allocation is bounded (64 MiB at most) */
    if (need > f->cap) {
        free(f->payload);
        f->cap = 0;
        f->payload = aligned_alloc(64, hr_pad(need, 64));
        if (!f->payload) {
            c->rx_broken = true;
            return hr_fail(err, HR_ENOMEM, "frame from %s: out of memory for a %u-byte %s", c->peer, h.len,
                           hn_msg_name(h.type));
        }
        f->cap = need;
    }
    got = 0;
    rc = read_full(c, f->payload, need, &got, deadline, hn_msg_name(h.type), false, err);
    if (rc) {
        c->rx_broken = true;
        return rc;
    }
    if (sec) {
        hn_dir *d = &sec->rx;
        if (hn_aead_open(d->k, d->n, hdr, sizeof hdr, f->payload, need, f->payload)) {
            c->rx_broken = true;
            return hr_fail(err, HR_EAUTH, "frame from %s failed authentication (altered, replayed, truncated, "
                           "or not from the peer of this session): closing", c->peer);
        }
        d->n++;
        if (ratchet) {
            hn_noise_rekey(d->k);
            atomic_fetch_add_explicit(&c->rekeys_received, 1, memory_order_relaxed);
        }
    }
    f->type = h.type;
    f->seq = h.seq;
    f->len = h.len;
    atomic_fetch_add_explicit(&c->frames_received, 1, memory_order_relaxed);
    return HR_OK;
}

int hn_recv_frame(hn_conn *c, hn_frame *f, int64_t deadline, hr_err *err) { return recv_impl(c, f, deadline, false, err); }

/* ---- messages ---- */

int hn_msg_send(hn_conn *c, const hn_msg *m, int64_t deadline, hr_err *err) {
    hn_iov parts[2] = { { 0 } };
    int rc = hn_msg_encode(m, &c->scratch, &parts[1], err);
    if (rc) return rc;
    parts[0].p = c->scratch.data;
    parts[0].n = c->scratch.len;
    return hn_send_frame(c, m->type, m->seq, parts, 2, deadline, err);
}

int hn_msg_recv(hn_conn *c, hn_frame *f, hn_msg *m, int64_t deadline, hr_err *err) {
    int rc = hn_recv_frame(c, f, deadline, err);
    if (rc) return rc;
    hr_err e = { 0 };
    rc = hn_msg_decode(f->type, f->seq, f->payload, f->len, m, &e);
    if (rc) return hr_fail(err, rc, "message from %s: %s", c->peer, e.msg);
    return HR_OK;
}

/* ---- the handshake on a connection (docs/security.md) ---- */

/* Both sides mix the protocol version into the handshake: peers of different versions fail it. */
static const char noise_prologue[] = "hearth wire v3";
_Static_assert(HN_PROTO_VERSION == 3, "noise_prologue names the protocol version");

static int send_handshake(hn_conn *c, const uint8_t *msg, size_t n, int64_t deadline, hr_err *err) {
    hn_iov part = {msg, n};
    return send_impl(c, (int)HN_FRAME_HANDSHAKE, 0, &part, 1, HN_NOISE_MSG_MAX, deadline, err);
}

static int install_keys(hn_conn *c, hn_noise *ns, hr_err *err) {
    hn_sec *sec = calloc(1, sizeof *sec);
    if (!sec) {
        hn_noise_wipe(ns);
        return hr_fail(err, HR_ENOMEM, "%s: out of memory", c->peer);
    }
    hn_noise_split(ns, sec->tx.k, sec->rx.k, sec->dg_send, sec->dg_recv);
    sec->tx.t0 = hr_time_ns();
    hn_buf_init(&sec->txbuf);
    c->sec = sec;
    return 0;
}

/* a peer's ERROR in place of a handshake message, as text safe to print */
static void peer_error_text(const hn_frame *f, char *out, size_t cap) {
    hn_msg m;
    hr_err e = {0};
    if (hn_msg_decode(f->type, f->seq, f->payload, f->len, &m, &e)) {
        snprintf(out, cap, "(an ERROR that does not decode)");
        return;
    }
    hr_escape(out, cap, m.u.error.message.s, m.u.error.message.n);
}

int hn_conn_handshake(hn_conn *c, const hn_key *key, int64_t deadline, hr_err *err) {
    if (!key) return 0;
    if (c->sec) return hr_fail(err, HR_EINVAL, "%s: the session is already encrypted", c->peer);
    hn_noise ns;
    uint8_t msg[HN_NOISE_MSG_MAX];
    size_t n;
    int rc = hn_noise_init(&ns, true, key->k, noise_prologue, sizeof noise_prologue - 1, NULL, err);
    if (!rc) rc = hn_noise_write(&ns, NULL, 0, msg, sizeof msg, &n, err);
    if (!rc) rc = send_handshake(c, msg, n, deadline, err);
    hn_frame f = {0};
    if (!rc) rc = recv_impl(c, &f, deadline, true, err);
    if (!rc && f.type == HN_MSG_ERROR) {
        char why[HN_MAX_MESSAGE * 4 + 1];
        peer_error_text(&f, why, sizeof why);
        rc = hr_fail(err, HR_EAUTH, "%s refused the encrypted session: %s", c->peer, why);
    } else if (!rc && f.type != (int)HN_FRAME_HANDSHAKE) {
        rc = hr_fail(err, HR_EPROTO, "%s answered the handshake with %s", c->peer, hn_msg_name(f.type));
    } else if (!rc) {
        size_t pn;
        hr_err e = {0};
        if ((rc = hn_noise_read(&ns, f.payload, f.len, msg, sizeof msg, &pn, &e)))
            hr_fail(err, rc, "%s: %s", c->peer, e.msg);
        else
            rc = install_keys(c, &ns, err);
    }
    hn_noise_wipe(&ns);
    hn_frame_free(&f);
    return rc;
}

hn_conn *hn_connect_secure(const char *addr, const hn_key *key, int64_t deadline, hr_err *err) {
    hn_conn *c = hn_connect(addr, deadline, err);
    if (c && hn_conn_handshake(c, key, deadline, err)) {
        hn_conn_close(c);
        return NULL;
    }
    return c;
}

/* tells the peer why (best effort, in clear: nothing secret in it) and returns HR_EAUTH with `why` */
static int refuse(hn_conn *c, const char *to_peer, const char *why, hr_err *err) {
    hn_msg m = {.type = HN_MSG_ERROR};
    m.u.error = (hn_error){HR_EAUTH, hn_cstr(to_peer)};
    hn_msg_send(c, &m, hn_deadline_ms(200), NULL);
    return hr_fail(err, HR_EAUTH, "%s: %s", c->peer, why);
}

int hn_msg_recv_first(hn_conn *c, const hn_key *key, hn_frame *f, hn_msg *m, int frame_ms, hr_err *err) {
    int rc = recv_impl(c, f, hn_deadline_ms(frame_ms), !c->sec, err);
    if (rc) return rc;
    if (f->type == (int)HN_FRAME_HANDSHAKE) {
        if (!key)
            return refuse(c, "this worker has no cluster key, and the head uses one: give the worker the same --key",
                          "asks for an encrypted session, but this worker has no cluster key (--key): refused", err);
        hn_noise ns;
        uint8_t msg[HN_NOISE_MSG_MAX];
        size_t n;
        hr_err e = {0};
        rc = hn_noise_init(&ns, false, key->k, noise_prologue, sizeof noise_prologue - 1, NULL, &e);
        if (!rc && (rc = hn_noise_read(&ns, f->payload, f->len, msg, sizeof msg, &n, &e)))
            rc = refuse(c, "the handshake failed: not the same cluster key", e.msg, err);
        else if (!rc && (rc = hn_noise_write(&ns, NULL, 0, msg, sizeof msg, &n, &e)) == 0 &&
                 (rc = send_handshake(c, msg, n, hn_deadline_ms(frame_ms), err)) == 0)
            rc = install_keys(c, &ns, err);
        else if (rc && e.code)
            hr_fail(err, rc, "%s: %s", c->peer, e.msg);
        hn_noise_wipe(&ns);
        if (rc) return rc;
        /* the first sealed frame proves the initiator live: a replayed handshake stops here */
        return hn_msg_recv(c, f, m, hn_deadline_ms(frame_ms), err);
    }
    if (key && !c->sec) {
        char why[160];
        snprintf(why, sizeof why, "a plaintext %s refused: this worker needs the cluster key", hn_msg_name(f->type));
        return refuse(c, "this worker needs the cluster key: give the head the same --key", why, err);
    }
    hr_err e = {0};
    rc = hn_msg_decode(f->type, f->seq, f->payload, f->len, m, &e);
    if (rc) return hr_fail(err, rc, "message from %s: %s", c->peer, e.msg);
    return 0;
}

int hn_conn_dgram_keys(const hn_conn *c, hn_dgram_key *send, hn_dgram_key *recv, hr_err *err) {
    if (!c->sec) return hr_fail(err, HR_EINVAL, "%s: a plaintext session has no datagram keys", c->peer);
    memcpy(send->k, c->sec->dg_send, sizeof send->k);
    memcpy(recv->k, c->sec->dg_recv, sizeof recv->k);
    return 0;
}
