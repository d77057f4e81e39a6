// modules: base net
/* test-discover — the discovery packet (docs/discovery.md) against hand-written bytes, its strict
   decoder (every truncation, a trailing byte, oversize, other versions, bad fields, random
   corruption), and announcers and a querier live on the loopback interface: workers of two keys are
   found with the right key marks, junk and duplicates are counted and change nothing, a query flood
   is rate-limited. Uses only "lo" (multicast never leaves the machine) and a random group port.
   HEARTH_DISCOVER_SEED_DIR=dir writes seeds for tests/fuzz-discover.c. */
#include "net/net.h"
#include "test.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <time.h>

static hn_announce sample(void) {
    hn_announce a;
    memset(&a, 0, sizeof a);
    a.proto_version = 2;
    a.port = 7070;
    for (int i = 0; i < HN_KEY_ID_SIZE; i++) a.key_id[i] = (uint8_t)(0xa0 + i);
    a.instance = 0x0102030405060708ULL;
    a.n_threads = 4;
    a.mem_budget = 3ull << 30;
    snprintf(a.host, sizeof a.host, "10.0.0.5");
    snprintf(a.name, sizeof a.name, "kitchen-pi");
    return a;
}

static bool same(const hn_announce *a, const hn_announce *b) {
    return a->proto_version == b->proto_version && a->port == b->port &&
           !memcmp(a->key_id, b->key_id, HN_KEY_ID_SIZE) && a->instance == b->instance &&
           a->n_threads == b->n_threads && a->mem_budget == b->mem_budget &&
           !strcmp(a->host, b->host) && !strcmp(a->name, b->name);
}

/* decodes n bytes from an aligned heap copy (as a receive buffer is); the error code */
static int decode(const void *p, size_t n, int *kind, hn_announce *a) {
    uint64_t *c = malloc(n + 8);
    memcpy(c, p, n);
    hr_err e = {0};
    int rc = hn_discover_decode(c, n, kind, a, &e);
    if (rc) CHECKF(e.msg[0] != 0, "a refusal says why");
    free(c);
    return rc;
}

static void put_le(uint8_t **p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) *(*p)++ = (uint8_t)(v >> (8 * i));
}

static void test_layout(void) {
    /* the documented layout, written out by hand */
    uint8_t want[256], *p = want;
    memcpy(p, "HRDS", 4); p += 4;
    put_le(&p, 1, 2);  /* version */
    put_le(&p, 2, 2);  /* ANNOUNCE */
    put_le(&p, 2, 2);  /* proto_version */
    put_le(&p, 7070, 2);
    for (int i = 0; i < 8; i++) *p++ = (uint8_t)(0xa0 + i);
    put_le(&p, 0x0102030405060708ULL, 8);
    put_le(&p, 4, 4);
    put_le(&p, 3ull << 30, 8);
    put_le(&p, 8, 4); memcpy(p, "10.0.0.5", 8); p += 8;
    put_le(&p, 10, 4); memcpy(p, "kitchen-pi", 10); p += 10;
    size_t n = (size_t)(p - want);

    hn_announce a = sample(), b;
    hn_buf out;
    hn_buf_init(&out);
    hr_err err = {0};
    CHECK(hn_discover_encode(HN_DISC_ANNOUNCE, &a, &out, &err) == 0);
    CHECKF(out.len == n && !memcmp(out.data, want, n), "encoded %zu bytes, the layout has %zu", out.len, n);
    int kind = 0;
    CHECK(decode(want, n, &kind, &b) == 0 && kind == HN_DISC_ANNOUNCE && same(&a, &b));

    uint8_t q[8] = {'H', 'R', 'D', 'S', 1, 0, 1, 0};
    CHECK(hn_discover_encode(HN_DISC_QUERY, NULL, &out, &err) == 0 && out.len == 8 && !memcmp(out.data, q, 8));
    CHECK(decode(q, 8, &kind, NULL) == 0 && kind == HN_DISC_QUERY);

    /* other hosts: empty (the sender's address), IPv6 */
    const char *hosts[] = {"", "fe80::1", "::1", "192.168.1.20"};
    for (size_t i = 0; i < HR_ARRAY_LEN(hosts); i++) {
        snprintf(a.host, sizeof a.host, "%s", hosts[i]);
        CHECK(hn_discover_encode(HN_DISC_ANNOUNCE, &a, &out, &err) == 0);
        CHECKF(decode(out.data, out.len, &kind, &b) == 0 && same(&a, &b), "host '%s'", hosts[i]);
    }
    /* the longest announcement fits the packet limit */
    a = sample();
    snprintf(a.host, sizeof a.host, "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255");
    memset(a.name, 'n', HN_MAX_NAME);
    a.name[HN_MAX_NAME] = 0;
    CHECK(strlen(a.host) == HN_DISCOVER_MAX_HOST);
    CHECK(hn_discover_encode(HN_DISC_ANNOUNCE, &a, &out, &err) == 0 && out.len <= HN_DISCOVER_MAX_PACKET);
    CHECK(decode(out.data, out.len, &kind, &b) == 0 && same(&a, &b));
    hn_buf_free(&out);
}

static void test_refusals(void) {
    hn_announce a = sample(), b;
    hn_buf out;
    hn_buf_init(&out);
    hr_err err = {0};
    REQUIRE_VOID(hn_discover_encode(HN_DISC_ANNOUNCE, &a, &out, &err) == 0);
    uint8_t good[HN_DISCOVER_MAX_PACKET + 8];
    size_t n = out.len;
    memcpy(good, out.data, n);
    int kind;

    int bad = 0;
    for (size_t k = 0; k < n; k++) bad += decode(good, k, &kind, &b) != 0;
    CHECKF(bad == (int)n, "every truncation is refused (%d of %zu)", bad, n);
    good[n] = 0;
    CHECK(decode(good, n + 1, &kind, &b) == HR_EFORMAT);   /* a trailing byte */
    uint8_t big[HN_DISCOVER_MAX_PACKET + 1];
    memset(big, 0, sizeof big);
    memcpy(big, good, n);
    CHECK(decode(big, sizeof big, &kind, &b) == HR_ERANGE);

    uint8_t c[HN_DISCOVER_MAX_PACKET];
#define MUTATE(off, val, want) do { memcpy(c, good, n); c[off] = (uint8_t)(val); \
        CHECKF(decode(c, n, &kind, &b) == (want), "byte %d = %d", (int)(off), (int)(val)); } while (0)
    MUTATE(0, 'X', HR_EFORMAT);            /* magic */
    MUTATE(4, 2, HR_EUNSUPPORTED);         /* version 2 */
    MUTATE(6, 0, HR_EFORMAT);              /* kind 0 */
    MUTATE(6, 3, HR_EFORMAT);              /* kind 3 */
    memcpy(c, good, n);
    c[10] = c[11] = 0;                     /* port 0 */
    CHECK(decode(c, n, &kind, &b) == HR_EFORMAT);
    MUTATE(28, 0, HR_EFORMAT);             /* n_threads 0 */
    MUTATE(30, 0xff, HR_EFORMAT);          /* n_threads > HN_DISCOVER_MAX_THREADS */
    MUTATE(44, 'x', HR_EFORMAT);           /* host "x0.0.0.5" */
    MUTATE(56, 0, HR_EFORMAT);             /* NUL in the name */
    MUTATE(56, '\n', HR_EFORMAT);          /* a control character in the name */
    MUTATE(56, 0x7f, HR_EFORMAT);
    MUTATE(40, 200, HR_EFORMAT);           /* host length past the limit */
    MUTATE(43, 0xff, HR_EFORMAT);          /* host length huge */
    MUTATE(52, 0, HR_EFORMAT);             /* empty name (and 10 bytes left over) */
#undef MUTATE
    /* the encoder refuses what the decoder would */
    hn_announce e = a;
    e.port = 0;
    CHECK(hn_discover_encode(HN_DISC_ANNOUNCE, &e, &out, &err) == HR_EINVAL);
    e = a;
    snprintf(e.host, sizeof e.host, "localhost");
    CHECK(hn_discover_encode(HN_DISC_ANNOUNCE, &e, &out, &err) == HR_EINVAL);
    e = a;
    e.name[0] = 0;
    CHECK(hn_discover_encode(HN_DISC_ANNOUNCE, &e, &out, &err) == HR_EINVAL);
    e = a;
    e.name[2] = '\t';
    CHECK(hn_discover_encode(HN_DISC_ANNOUNCE, &e, &out, &err) == HR_EINVAL);
    CHECK(hn_discover_encode(7, &a, &out, &err) == HR_EINVAL);

    /* random corruption: refused, or decoded and canonical (re-encodes to the same bytes) */
    uint64_t s = 29;
    int ok = 0, refused = 0, wrong = 0;
    for (int it = 0; it < 20000; it++) {
        memcpy(c, good, n);
        size_t m = n;
        int flips = 1 + (int)(test_splitmix64(&s) % 4);
        for (int f = 0; f < flips; f++) c[test_splitmix64(&s) % m] ^= (uint8_t)(1u << (test_splitmix64(&s) % 8));
        if (test_splitmix64(&s) % 8 == 0) m = test_splitmix64(&s) % (n + 1);
        int rc = decode(c, m, &kind, &b);
        if (rc == 0) {
            ok++;
            if (hn_discover_encode(kind, &b, &out, &err) || out.len != m || memcmp(out.data, c, m)) wrong++;
        } else if (rc == HR_EFORMAT || rc == HR_EUNSUPPORTED || rc == HR_ERANGE) refused++;
        else wrong++;
    }
    CHECKF(wrong == 0 && ok > 0 && refused > 0, "random corruption: %d decoded, %d refused, %d wrong", ok, refused,
           wrong);
    hn_buf_free(&out);
}

/* HEARTH_DISCOVER_SEED_DIR: the fuzzer's seeds (a query, announcements) */
static void write_seeds(void) {
    const char *dir = getenv("HEARTH_DISCOVER_SEED_DIR");
    if (!dir) return;
    hn_announce a = sample();
    hn_buf out;
    hn_buf_init(&out);
    for (int i = 0; i < 3; i++) {
        if (i == 1) a.host[0] = 0;
        if (i == 2) snprintf(a.host, sizeof a.host, "fe80::1");
        if (hn_discover_encode(i == 0 ? HN_DISC_QUERY : HN_DISC_ANNOUNCE, &a, &out, NULL)) continue;
        FILE *f = fopen(test_path(dir, i == 0 ? "query" : i == 1 ? "announce" : "announce-v6"), "wb");
        if (f) { fwrite(out.data, 1, out.len, f); fclose(f); }
    }
    hn_buf_free(&out);
}

/* ---- live, on lo ---- */
static char group[64];
static uint16_t gport;

/* a socket that sends to the group out of lo */
static int lo_sender(void) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct ip_mreqn m = {.imr_ifindex = (int)if_nametoindex("lo")};
    setsockopt(fd, IPPROTO_IP, IP_MULTICAST_IF, &m, sizeof m);
    return fd;
}
static void to_group(int fd, const void *p, size_t n) {
    struct sockaddr_in g = {.sin_family = AF_INET, .sin_port = htons(gport)};
    inet_pton(AF_INET, "239.255.72.82", &g.sin_addr);
    CHECK(sendto(fd, p, n, 0, (struct sockaddr *)&g, sizeof g) == (ssize_t)n);
}

/* A fake worker: answers every query with junk, another version, and a copy of a real worker's
   announcement (a duplicate) — none of which may change what the querier finds. */
typedef struct fake { int fd; atomic_bool stop; hn_announce dup; atomic_int answered; } fake;
static void *fake_main(void *arg) {
    fake *f = arg;
    uint64_t buf[128];
    hn_buf pkt;
    hn_buf_init(&pkt);
    hn_discover_encode(HN_DISC_ANNOUNCE, &f->dup, &pkt, NULL);
    while (!atomic_load(&f->stop)) {
        struct pollfd pf = {.fd = f->fd, .events = POLLIN};
        if (poll(&pf, 1, 20) <= 0) continue;
        struct sockaddr_in from;
        socklen_t fl = sizeof from;
        ssize_t n = recvfrom(f->fd, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
        if (n != 8) continue; /* only queries */
        uint8_t junk[600];
        memset(junk, 0x41, sizeof junk);
        sendto(f->fd, junk, 20, 0, (struct sockaddr *)&from, fl);            /* malformed */
        sendto(f->fd, junk, sizeof junk, 0, (struct sockaddr *)&from, fl);   /* oversize */
        uint8_t v2[8] = {'H', 'R', 'D', 'S', 2, 0, 2, 0};
        sendto(f->fd, v2, 8, 0, (struct sockaddr *)&from, fl);               /* another version */
        sendto(f->fd, pkt.data, pkt.len, 0, (struct sockaddr *)&from, fl);   /* a duplicate */
        f->answered++;
    }
    hn_buf_free(&pkt);
    return NULL;
}

static void test_live(void) {
    if (!if_nametoindex("lo")) { printf("no lo interface: live discovery not tested\n"); return; }
    gport = (uint16_t)(20000 + (getpid() * 7 + time(NULL)) % 40000);
    snprintf(group, sizeof group, "239.255.72.82:%u", gport);
    hn_discover_where w = {.group = group, .iface = "lo"};
    hr_err err = {0};

    hn_announce a = sample(), b = sample();
    a.host[0] = 0;                  /* any address: the querier uses the sender's */
    a.port = 7101;
    a.instance = 0;                 /* made random */
    snprintf(b.host, sizeof b.host, "127.0.0.1");
    b.port = 7102;
    b.instance = 0x5eedULL;
    b.key_id[0] ^= 1;               /* another cluster */
    snprintf(b.name, sizeof b.name, "neighbour");
    hn_announcer *an = hn_announcer_start(&w, &a, 60000, &err);
    if (!an && err.code == HR_ENET) { printf("SKIP live: %s\n", err.msg); return; }
    REQUIRE_VOID(an);
    hn_announcer *bn = hn_announcer_start(&w, &b, 60000, &err);
    REQUIRE_VOID(bn);

    /* junk at the announcers (they read the group): counted, and they go on answering */
    int snd = lo_sender();
    uint8_t junk[600];
    memset(junk, 0x42, sizeof junk);
    to_group(snd, junk, 12);
    to_group(snd, junk, sizeof junk);
    uint8_t v2[8] = {'H', 'R', 'D', 'S', 2, 0, 1, 0};
    to_group(snd, v2, 8);

    /* the fake worker */
    fake f = {.dup = b};
    f.fd = socket(AF_INET, SOCK_DGRAM, 0);
    int one = 1;
    setsockopt(f.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in ba = {.sin_family = AF_INET, .sin_port = htons(gport)};
    CHECK(bind(f.fd, (struct sockaddr *)&ba, sizeof ba) == 0);
    struct ip_mreqn m = {.imr_ifindex = (int)if_nametoindex("lo")};
    inet_pton(AF_INET, "239.255.72.82", &m.imr_multiaddr);
    CHECK(setsockopt(f.fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &m, sizeof m) == 0);
    pthread_t ft;
    pthread_create(&ft, NULL, fake_main, &f);

    uint8_t kid[HN_KEY_ID_SIZE];
    memcpy(kid, a.key_id, sizeof kid);
    hn_discovery *d = malloc(sizeof *d);
    int rc = hn_discover(&w, kid, 2000, d, &err); /* long: the announcers' threads may wait for a core */
    CHECKF(rc == 0, "%s", err.msg);
    CHECKF(d->n == 2, "found %d workers (want 2)", d->n);
    if (d->n == 2) {
        /* sorted by address: 127.0.0.1:7101 (a), 127.0.0.1:7102 (b) */
        CHECKF(!strcmp(d->w[0].addr, "127.0.0.1:7101") && !strcmp(d->w[1].addr, "127.0.0.1:7102"), "%s %s",
               d->w[0].addr, d->w[1].addr);
        CHECK(d->w[0].same_key && !d->w[1].same_key);
        CHECK(!strcmp(d->w[0].a.name, "kitchen-pi") && !strcmp(d->w[1].a.name, "neighbour"));
        CHECK(d->w[0].a.n_threads == 4 && d->w[0].a.mem_budget == 3ull << 30 && d->w[0].a.proto_version == 2);
        CHECK(d->w[0].a.instance != 0 && d->w[1].a.instance == 0x5eedULL && d->w[0].loopback);
    }
    CHECKF(atomic_load(&f.answered) >= 1, "the fake worker heard %d queries", atomic_load(&f.answered));
    CHECKF(d->st.malformed >= 1 && d->st.oversize >= 1 && d->st.other_version >= 1 && d->st.duplicates >= 1 &&
           d->st.foreign_key >= 1, "querier counted malformed %u oversize %u version %u duplicates %u foreign %u",
           d->st.malformed, d->st.oversize, d->st.other_version, d->st.duplicates, d->st.foreign_key);
    CHECK(d->st.sent >= 3);

    /* without a key id nothing is the same key; with a short window, still found */
    rc = hn_discover(&w, NULL, 1500, d, &err);
    CHECK(rc == 0 && d->n == 2 && !d->w[0].same_key && !d->w[1].same_key);

    atomic_store(&f.stop, true);
    pthread_join(ft, NULL);
    close(f.fd);

    /* a query flood straight at the announcers' port: answered at most at the burst + rate */
    int q = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(gport)};
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    uint8_t query[8] = {'H', 'R', 'D', 'S', 1, 0, 1, 0};
    int64_t t0 = hr_time_ns();
    for (int i = 0; i < 200; i++) sendto(q, query, 8, 0, (struct sockaddr *)&to, sizeof to);
    /* the burst's answers, then a second for the announcer to get through the rest (it may wait for a
       core on a loaded machine) */
    int answers = 0;
    uint64_t buf[128];
    for (int64_t end = t0 + 10 * 1000000000LL; answers < 16 && hr_time_ns() < end;) {
        struct pollfd pf = {.fd = q, .events = POLLIN};
        if (poll(&pf, 1, 100) > 0)
            while (recv(q, buf, sizeof buf, 0) > 0) answers++;
    }
    usleep(1000 * 1000);

    hn_discover_stats sa, sb;
    hn_announcer_stop(an, &sa);
    hn_announcer_stop(bn, &sb);
    double secs = (double)(hr_time_ns() - t0) * 1e-9;
    while (recv(q, buf, sizeof buf, 0) > 0) answers++;
    close(q);
    close(snd);
    /* a unicast to a shared port reaches one of the sockets; whichever it was, it limited */
    CHECKF(sa.rate_limited + sb.rate_limited > 0 && answers >= 16 && answers <= 16 + 8 * (secs + 1),
           "flood: %d answers in %.1f s, %u + %u limited", answers, secs, sa.rate_limited, sb.rate_limited);
    CHECKF(sa.malformed >= 1 && sa.oversize >= 1 && sa.other_version >= 1, "announcer counted malformed %u oversize %u "
           "version %u", sa.malformed, sa.oversize, sa.other_version);
    CHECK(sa.sent >= 3);
    hn_announcer_stop(NULL, NULL);

    /* bad places */
    hn_discover_where bad = {.group = "10.0.0.1:7072"};
    CHECK(hn_discover(&bad, NULL, 10, d, &err) == HR_EINVAL);
    bad.group = "239.255.72.82:0";
    CHECK(hn_announcer_start(&bad, &a, 0, &err) == NULL && err.code == HR_EINVAL);
    bad.group = NULL;
    bad.iface = "no-such-if0";
    CHECK(hn_discover(&bad, NULL, 10, d, &err) == HR_EINVAL);
    CHECK(hn_announcer_start(&bad, &a, 0, &err) == NULL && err.code == HR_EINVAL);
    free(d);
}

int main(void) {
    hr_log_set_level(HR_LOG_WARN); /* set before any thread logs (the level is read without a lock) */
    test_layout();
    test_refusals();
    write_seeds();
    test_live();
    return test_summary();
}
