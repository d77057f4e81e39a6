// modules: base net
/* test-noise: the handshake and the encrypted links of issue 29 (src/net/noise.c, tcp.c).
   - the Noise primitives against cacophony's published vector for Noise_NNpsk0_25519_ChaChaPoly_BLAKE2b
     (messages, handshake hash, transport messages) and the ratchet against libsodium's AEAD;
   - real connections on loopback through a relay (a man in the middle the test controls): the honest
     session; a wrong key, a keyless worker, a plaintext head; a flipped bit in every byte position class
     of a sealed frame (header: magic, type, length, seq; payload; tag) and of each handshake message; a
     truncated frame; a replayed handshake (with the recorded first sealed frame): every one refused with
     HR_EAUTH (or a protocol/closed error) on the side that saw it, and nothing crashes;
   - rekeying by count and by time; the datagram keys, seal/open and the replay window. */
#include "test.h"

#include "net/net.h"

#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <sys/socket.h>

static size_t unhex(const char *h, uint8_t *out) {
    size_t n = strlen(h) / 2;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        out[i] = (uint8_t)v;
    }
    return n;
}

static bool same_hex(const uint8_t *p, size_t n, const char *h) {
    uint8_t b[512];
    return strlen(h) == 2 * n && unhex(h, b) == n && !memcmp(p, b, n);
}

/* ---- known answers ---- */

/* cacophony's vector (github.com/haskell-cryptography/cacophony, vectors/cacophony.txt) */
static void test_vector(void) {
    uint8_t prologue[64], psk[32], ei[32], er[32], pay[64], msg[HN_NOISE_MSG_MAX], out[64];
    size_t np = unhex("4a6f686e2047616c74", prologue);
    unhex("54686973206973206d7920417573747269616e20706572737065637469766521", psk);
    unhex("893e28b9dc6ca8d611ab664754b8ceb7bac5117349a4439a6b0569da977c464a", ei);
    unhex("bbdb4cdbd309f1a1f2e1456967fe288cadd6f712d65dc7b7793d5e63da6b375b", er);
    static const char *const v[6][2] = {
        {"4c756477696720766f6e204d69736573",
         "ca35def5ae56cec33dc2036731ab14896bc4c75dbb07a61f879f8e3afa4c7944ed63df2f5a12aee1185ee9c50305f2ecf12421dcb53c0"
         "47a63b784cf7c54a105"},
        {"4d757272617920526f746862617264",
         "95ebc60d2b1fa672c1f46a8aa265ef51bfe38e7ccb39ec5be34069f1448088430e0fe7d5c0c9b92f7478716c8852f1b4f389edb75e3eb"
         "e546fafafd5b6f0f7"},
        {"462e20412e20486179656b", "0fe04b26dcfbb69f8a6a94c61f1a26ef88769218d32f5d17c068a6"},
        {"4361726c204d656e676572", "2239e0c540c01f09eb1f4cc5258fd5acfefff18a5a3773f21b7bfe"},
        {"4a65616e2d426170746973746520536179", "f216cb03d30fb8af1e561fe02a07552d09b416e27a75e62c77d193718b0bdaae9f"},
        {"457567656e2042f6686d20766f6e2042617765726b",
         "6e8baf98b944184dd7dc5ef14d8108cbeca626de118a5460f3308e294d61e17238bce29bd9"},
    };
    hn_noise i, r;
    hr_err err = {0};
    size_t n, m;
    REQUIRE_VOID(hn_noise_init(&i, true, psk, prologue, np, ei, &err) == 0);
    REQUIRE_VOID(hn_noise_init(&r, false, psk, prologue, np, er, &err) == 0);
    size_t pn = unhex(v[0][0], pay);
    CHECK(hn_noise_write(&i, pay, pn, msg, sizeof msg, &n, &err) == 0 && same_hex(msg, n, v[0][1]));
    CHECK(hn_noise_read(&r, msg, n, out, sizeof out, &m, &err) == 0 && m == pn && !memcmp(out, pay, pn));
    pn = unhex(v[1][0], pay);
    CHECK(hn_noise_write(&r, pay, pn, msg, sizeof msg, &n, &err) == 0 && same_hex(msg, n, v[1][1]));
    CHECK(hn_noise_read(&i, msg, n, out, sizeof out, &m, &err) == 0 && m == pn && !memcmp(out, pay, pn));
    static const char hh[] = "ed5e9692d0ab507b6c2beec3f584fd5b127817a9d20b26cd50aa72c507260fa31aa7d88dd3723316338af37ce0b4cfb"
                             "2923aeb848bbf2b934911306f01ffc963";
    CHECK(same_hex(i.h, sizeof i.h, hh) && same_hex(r.h, sizeof r.h, hh));
    uint8_t is[32], ir[32], rs[32], rr[32], ids[32], idr[32], rds[32], rdr[32];
    hn_noise_split(&i, is, ir, ids, idr);
    hn_noise_split(&r, rs, rr, rds, rdr);
    CHECK(!memcmp(is, rr, 32) && !memcmp(ir, rs, 32) && memcmp(is, ir, 32));
    CHECK(!memcmp(ids, rdr, 32) && !memcmp(idr, rds, 32) && memcmp(ids, is, 32) && memcmp(ids, idr, 32));
    for (int k = 2; k < 6; k++) { /* initiator's then responder's, nonces 0, 0, 1, 1 */
        pn = unhex(v[k][0], pay);
        uint8_t *key = k % 2 == 0 ? is : rs;
        hn_aead_seal(key, (uint64_t)(k - 2) / 2, NULL, 0, pay, pn, msg);
        CHECKF(same_hex(msg, pn + 16, v[k][1]), "transport message %d", k);
        CHECK(hn_aead_open(k % 2 == 0 ? rr : ir, (uint64_t)(k - 2) / 2, NULL, 0, msg, pn + 16, out) == 0 &&
              !memcmp(out, pay, pn));
    }
    CHECK(i.step == 0 && r.step == 0); /* split wiped the states */
}

/* REKEY(k) = ENCRYPT(k, 2^64 - 1, "", zeros)[0..32], by libsodium directly */
static void test_rekey_primitive(void) {
    uint8_t k[32], k0[32], z[32] = {0}, c[48], iv[12] = {0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    for (int i = 0; i < 32; i++) k[i] = (uint8_t)(i * 13 + 5);
    memcpy(k0, k, 32);
    crypto_aead_chacha20poly1305_ietf_encrypt(c, NULL, z, 32, NULL, 0, NULL, iv, k0);
    hn_noise_rekey(k);
    CHECK(!memcmp(k, c, 32) && memcmp(k, k0, 32));
}

/* the handshake state machine refuses what is out of turn, short, long or altered */
static void test_noise_misuse(void) {
    uint8_t psk[32] = {1}, psk2[32] = {2}, msg[HN_NOISE_MSG_MAX], out[HN_NOISE_MSG_MAX];
    size_t n, m;
    hn_noise i, r;
    hr_err err = {0};
    hn_noise_init(&i, true, psk, "p", 1, NULL, &err);
    hn_noise_init(&r, false, psk, "p", 1, NULL, &err);
    CHECK(hn_noise_write(&r, NULL, 0, msg, sizeof msg, &n, &err) == HR_EPROTO && r.step == -1);
    CHECK(hn_noise_read(&i, msg, 48, out, sizeof out, &m, &err) == HR_EPROTO);
    /* the wrong PSK, another prologue, a flipped bit in each byte of message 1 */
    hn_noise_init(&i, true, psk, "p", 1, NULL, &err);
    CHECK(hn_noise_write(&i, NULL, 0, msg, sizeof msg, &n, &err) == 0 && n == 48);
    hn_noise_init(&r, false, psk2, "p", 1, NULL, &err);
    CHECK(hn_noise_read(&r, msg, n, out, sizeof out, &m, &err) == HR_EAUTH && strstr(err.msg, "cluster key"));
    hn_noise_init(&r, false, psk, "q", 1, NULL, &err);
    CHECK(hn_noise_read(&r, msg, n, out, sizeof out, &m, &err) == HR_EAUTH);
    int refused = 0;
    for (size_t b = 0; b < n; b++) {
        msg[b] ^= 0x10;
        hn_noise_init(&r, false, psk, "p", 1, NULL, &err);
        refused += hn_noise_read(&r, msg, n, out, sizeof out, &m, &err) == HR_EAUTH;
        msg[b] ^= 0x10;
    }
    CHECKF(refused == (int)n, "%d of %zu flipped bytes refused", refused, n);
    hn_noise_init(&r, false, psk, "p", 1, NULL, &err);
    CHECK(hn_noise_read(&r, msg, n - 1, out, sizeof out, &m, &err) == HR_EPROTO); /* shorter than e + tag */
    hn_noise_init(&r, false, psk, "p", 1, NULL, &err);
    CHECK(hn_noise_read(&r, msg, 20, out, sizeof out, &m, &err) == HR_EPROTO);
    /* a low-order ephemeral key (all zeros) gives no shared secret: refused */
    hn_noise_init(&r, false, psk, "p", 1, NULL, &err);
    CHECK(hn_noise_read(&r, msg, n, out, sizeof out, &m, &err) == 0);
    CHECK(hn_noise_write(&r, NULL, 0, msg, sizeof msg, &n, &err) == 0);
    memset(msg, 0, 32);
    CHECK(hn_noise_read(&i, msg, n, out, sizeof out, &m, &err) == HR_EAUTH);
    hn_noise_wipe(&i);
    hn_noise_wipe(&r);
}

/* ---- connections: a server thread, a client thread, and the test's relay between them ---- */

static const hn_key key_a = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25,
                              26, 27, 28, 29, 30, 31, 32}};
static const hn_key key_b = {{9}};

#define N_FLOATS 3000 /* a FORWARD of a few KB, as a decode step sends */
static float fdata[N_FLOATS];
static int32_t fpos[1];

typedef struct side {
    hn_listener *l;          /* server: where it accepts */
    const char  *addr;       /* client: where it connects */
    const hn_key *key;
    bool         plaintext_hello; /* client: skip the handshake though the server wants one */
    int          rc;         /* the first failure's code (0: the whole exchange went through) */
    char         why[600];
    int          step;       /* how far it got */
    hn_dgram_key dsend, drecv;
    bool         has_dgram;
} side;

static void side_fail(side *s, int rc, const char *why) {
    if (!s->rc) {
        s->rc = rc;
        snprintf(s->why, sizeof s->why, "%s", why);
    }
}

static void forward_msg(hn_msg *m, uint32_t seq) {
    memset(m, 0, sizeof *m);
    m->type = HN_MSG_FORWARD;
    m->seq = seq;
    m->u.forward = (hn_forward){.layer_begin = 0, .layer_end = 1, .stage = HN_STAGE_BLOCK, .n_tokens = 1,
                                .n_embd = N_FLOATS, .pos = fpos, .data = fdata};
}

/* HELLO, then FORWARD -> RESULT twice, then BYE */
static void *client_main(void *arg) {
    side *s = arg;
    hr_err err = {0};
    hn_conn *c = hn_connect(s->addr, hn_deadline_ms(2000), &err);
    if (!c) { side_fail(s, err.code, err.msg); return NULL; }
    hn_frame f = {0};
    hn_msg m;
    int rc = s->plaintext_hello ? 0 : hn_conn_handshake(c, s->key, hn_deadline_ms(2000), &err);
    if (!rc) {
        s->step = 1;
        if (hn_conn_secure(c)) s->has_dgram = hn_conn_dgram_keys(c, &s->dsend, &s->drecv, &err) == 0;
        memset(&m, 0, sizeof m);
        m.type = HN_MSG_HELLO;
        m.u.hello = (hn_hello){.version_min = HN_PROTO_VERSION, .version_max = HN_PROTO_VERSION, .device = hn_cstr("t")};
        rc = hn_msg_send(c, &m, hn_deadline_ms(2000), &err);
        if (!rc) rc = hn_msg_recv(c, &f, &m, hn_deadline_ms(2000), &err);
        if (!rc && m.type == HN_MSG_ERROR) rc = hr_fail(&err, HR_EAUTH, "ERROR: %.*s", (int)m.u.error.message.n, m.u.error.message.s);
        else if (!rc && m.type != HN_MSG_HELLO_ACK) rc = hr_fail(&err, HR_EPROTO, "got %s", hn_msg_name(m.type));
    }
    for (uint32_t k = 0; k < 2 && !rc; k++) {
        s->step = 2 + (int)k;
        forward_msg(&m, 10 + k);
        rc = hn_msg_send(c, &m, hn_deadline_ms(2000), &err);
        if (!rc) rc = hn_msg_recv(c, &f, &m, hn_deadline_ms(2000), &err);
        if (!rc && (m.type != HN_MSG_RESULT || m.seq != 10 + k || m.u.result.n_embd != N_FLOATS ||
                    memcmp(m.u.result.data, fdata, sizeof fdata)))
            rc = hr_fail(&err, HR_EPROTO, "a wrong RESULT");
    }
    if (!rc) {
        s->step = 4;
        memset(&m, 0, sizeof m);
        m.type = HN_MSG_BYE;
        rc = hn_msg_send(c, &m, hn_deadline_ms(2000), &err);
    }
    if (rc) side_fail(s, rc, err.msg);
    hn_frame_free(&f);
    hn_conn_close(c);
    return NULL;
}

static void *server_main(void *arg) {
    side *s = arg;
    hr_err err = {0};
    hn_conn *c = hn_accept(s->l, hn_deadline_ms(2000), &err);
    if (!c) { side_fail(s, err.code, err.msg); return NULL; }
    hn_frame f = {0};
    hn_msg m;
    int rc = hn_msg_recv_first(c, s->key, &f, &m, 2000, &err);
    if (!rc && m.type != HN_MSG_HELLO) rc = hr_fail(&err, HR_EPROTO, "expected HELLO");
    if (!rc) {
        s->step = 1;
        if (hn_conn_secure(c)) s->has_dgram = hn_conn_dgram_keys(c, &s->dsend, &s->drecv, &err) == 0;
        hn_msg a = {.type = HN_MSG_HELLO_ACK, .seq = m.seq};
        a.u.hello_ack = (hn_hello_ack){.version = HN_PROTO_VERSION, .device = hn_cstr("s")};
        rc = hn_msg_send(c, &a, hn_deadline_ms(2000), &err);
    }
    while (!rc) {
        rc = hn_msg_recv(c, &f, &m, hn_deadline_ms(2000), &err);
        if (rc || m.type == HN_MSG_BYE) break;
        s->step++;
        if (m.type != HN_MSG_FORWARD || memcmp(m.u.forward.data, fdata, sizeof fdata)) {
            rc = hr_fail(&err, HR_EPROTO, "a wrong FORWARD");
            break;
        }
        hn_msg r = {.type = HN_MSG_RESULT, .seq = m.seq};
        r.u.result = (hn_result){.layer_end = 1, .n_tokens = 1, .n_embd = N_FLOATS, .data = m.u.forward.data};
        rc = hn_msg_send(c, &r, hn_deadline_ms(2000), &err);
    }
    if (rc) side_fail(s, rc, err.msg);
    hn_frame_free(&f);
    hn_conn_close(c);
    return NULL;
}

/* The relay: passes whole frames between the client and the server, keeping a copy of each; the
   frame `tamper_frame` (counted over both directions in order, from 0) gets byte `tamper_byte` XORed
   with 0x01 or, with truncate, only its first tamper_byte bytes sent before both links close. */
typedef struct relay {
    int  tamper_frame, tamper_byte;
    bool truncate;
    int  n_frames;
    int  tampered_at;       /* the byte flipped, within its frame */
    uint8_t rec[8][8 + 16 + N_FLOATS * 4 + 64]; /* the client's first frames (replay) */
    size_t  rec_len[8];
    int     n_rec;
} relay;

static int read_all(int fd, uint8_t *p, size_t n) {
    size_t got = 0;
    while (got < n) {
        struct pollfd q = {.fd = fd, .events = POLLIN};
        if (poll(&q, 1, 3000) <= 0) return -1;
        ssize_t k = recv(fd, p + got, n - got, 0);
        if (k <= 0) return -1;
        got += (size_t)k;
    }
    return 0;
}

static int write_all(int fd, const uint8_t *p, size_t n) {
    while (n) {
        struct pollfd q = {.fd = fd, .events = POLLOUT};
        if (poll(&q, 1, 3000) <= 0) return -1;
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* one frame from fd: header, payload, and a tag when the frame is sealed (after the handshake, whose
   frames are the only ones of type HN_FRAME_HANDSHAKE; `sealed` says whether this side's session is) */
static int read_frame(int fd, uint8_t *buf, size_t cap, size_t *len, bool *sealed) {
    if (read_all(fd, buf, 16)) return -1;
    uint32_t n;
    memcpy(&n, buf + 8, 4);
    uint16_t type;
    memcpy(&type, buf + 6, 2);
    if (type == HN_FRAME_HANDSHAKE) *sealed = true; /* the next frames of this direction are sealed */
    else if (*sealed) n += 16;
    if (16 + (size_t)n > cap) return -1;
    if (read_all(fd, buf + 16, n)) return -1;
    *len = 16 + n;
    return 0;
}

static void run_relay(relay *r, hn_listener *front, const char *back_addr) {
    hr_err err = {0};
    hn_conn *a = hn_accept(front, hn_deadline_ms(2000), &err);
    hn_conn *b = a ? hn_connect(back_addr, hn_deadline_ms(2000), &err) : NULL;
    if (!a || !b) { hn_conn_close(a); return; }
    int fa = hn_conn_fd(a), fb = hn_conn_fd(b);
    static uint8_t buf[16 + 16 + N_FLOATS * 4 + 4096];
    bool sealed[2] = {false, false};
    for (;;) {
        struct pollfd q[2] = {{.fd = fa, .events = POLLIN}, {.fd = fb, .events = POLLIN}};
        if (poll(q, 2, 2000) <= 0) break;
        int from = q[0].revents ? 0 : 1;
        size_t len;
        if (read_frame(from ? fb : fa, buf, sizeof buf, &len, &sealed[from])) break;
        if (!from && r->n_rec < 8 && len <= sizeof r->rec[0]) {
            memcpy(r->rec[r->n_rec], buf, len);
            r->rec_len[r->n_rec++] = len;
        }
        int to = from ? fa : fb;
        if (r->n_frames++ == r->tamper_frame) {
            if (r->truncate) {
                write_all(to, buf, HR_MIN(len, (size_t)r->tamper_byte));
                break;
            }
            r->tampered_at = (int)((size_t)r->tamper_byte % len);
            buf[r->tampered_at] ^= 0x01;
        }
        if (write_all(to, buf, len)) break;
    }
    hn_conn_close(a);
    hn_conn_close(b);
}

typedef struct scenario {
    const hn_key *ck, *sk;
    bool plaintext_hello, via_relay;
    relay r;
    side c, s;
} scenario;

/* runs a client and a server (through the relay when asked) to the end */
static void run_scenario(scenario *sc) {
    char sa[64], fa[64];
    hr_err err = {0};
    hn_listener *ls = hn_listen("127.0.0.1:0", &err), *lf = sc->via_relay ? hn_listen("127.0.0.1:0", &err) : NULL;
    REQUIRE_VOID(ls && (lf || !sc->via_relay));
    snprintf(sa, sizeof sa, "127.0.0.1:%u", hn_listener_port(ls));
    if (lf) snprintf(fa, sizeof fa, "127.0.0.1:%u", hn_listener_port(lf));
    sc->s = (side){.l = ls, .key = sc->sk};
    sc->c = (side){.addr = lf ? fa : sa, .key = sc->ck, .plaintext_hello = sc->plaintext_hello};
    pthread_t ts, tc;
    pthread_create(&ts, NULL, server_main, &sc->s);
    pthread_create(&tc, NULL, client_main, &sc->c);
    if (lf) run_relay(&sc->r, lf, sa);
    pthread_join(tc, NULL);
    pthread_join(ts, NULL);
    hn_listener_close(ls);
    hn_listener_close(lf);
}

static void test_honest(void) {
    for (int relayed = 0; relayed < 2; relayed++) {
        scenario sc = {.ck = &key_a, .sk = &key_a, .via_relay = relayed, .r.tamper_frame = -1};
        run_scenario(&sc);
        CHECKF(sc.c.rc == 0 && sc.s.rc == 0, "client: %s; server: %s", sc.c.why, sc.s.why);
        CHECK(sc.c.has_dgram && sc.s.has_dgram && !memcmp(sc.c.dsend.k, sc.s.drecv.k, 32) &&
              !memcmp(sc.c.drecv.k, sc.s.dsend.k, 32) && memcmp(sc.c.dsend.k, sc.c.drecv.k, 32));
        if (relayed) {
            /* the relay saw the client's frames: none of them holds the FORWARD's floats in clear */
            bool found = false;
            for (int i = 0; i < sc.r.n_rec; i++)
                for (size_t o = 0; o + 64 <= sc.r.rec_len[i] && !found; o++)
                    found = !memcmp(sc.r.rec[i] + o, fdata + 100, 64);
            CHECK(sc.r.n_rec >= 4 && !found);
        }
    }
    /* both without keys: plaintext, and the floats are there to be seen (the check above can fail) */
    scenario sc = {.via_relay = true, .r.tamper_frame = -1};
    run_scenario(&sc);
    CHECKF(sc.c.rc == 0 && sc.s.rc == 0 && !sc.c.has_dgram, "client: %s; server: %s", sc.c.why, sc.s.why);
    bool found = false;
    for (int i = 0; i < sc.r.n_rec; i++)
        for (size_t o = 0; o + 64 <= sc.r.rec_len[i] && !found; o++) found = !memcmp(sc.r.rec[i] + o, fdata + 100, 64);
    CHECK(found);
}

static void test_mismatch(void) {
    scenario sc = {.ck = &key_a, .sk = &key_b};
    run_scenario(&sc);
    CHECKF(sc.c.rc == HR_EAUTH && strstr(sc.c.why, "not the same cluster key") && sc.c.step == 0, "%s", sc.c.why);
    CHECKF(sc.s.rc == HR_EAUTH && strstr(sc.s.why, "does not hold this cluster key"), "%s", sc.s.why);
    /* a keyed head, a keyless worker */
    sc = (scenario){.ck = &key_a};
    run_scenario(&sc);
    CHECKF(sc.c.rc == HR_EAUTH && strstr(sc.c.why, "has no cluster key"), "%s", sc.c.why);
    CHECKF(sc.s.rc == HR_EAUTH && strstr(sc.s.why, "no cluster key"), "%s", sc.s.why);
    /* a plaintext head, a keyed worker */
    sc = (scenario){.sk = &key_a};
    run_scenario(&sc);
    CHECKF(sc.c.rc == HR_EAUTH && strstr(sc.c.why, "needs the cluster key"), "%s", sc.c.why);
    CHECKF(sc.s.rc == HR_EAUTH && strstr(sc.s.why, "plaintext HELLO refused"), "%s", sc.s.why);
    /* keys differ in one bit */
    hn_key k1 = key_a;
    k1.k[31] ^= 0x80;
    sc = (scenario){.ck = &k1, .sk = &key_a};
    run_scenario(&sc);
    CHECK(sc.c.rc == HR_EAUTH && sc.s.rc == HR_EAUTH);
}

/* Frames on the wire, in order: 0 msg1 (c->s), 1 msg2 (s->c), 2 HELLO, 3 HELLO_ACK, 4 FORWARD, 5 RESULT,
   6 FORWARD, 7 RESULT, 8 BYE. A flipped bit anywhere must end the session with a refusal. */
static void test_tamper(void) {
    static const int offsets[] = {0, 4, 6, 7, 8, 12, 15, 16, 20, 40, 47, 5000, 12027, 12030};
    for (int frame = 0; frame <= 8; frame++) {
        for (size_t o = 0; o < sizeof offsets / sizeof offsets[0]; o++) {
            if (frame != 4 && offsets[o] > 60) continue; /* the big offsets are for the FORWARD */
            scenario sc = {.ck = &key_a, .sk = &key_a, .via_relay = true, .r.tamper_frame = frame,
                           .r.tamper_byte = offsets[o]};
            run_scenario(&sc);
            bool refused = sc.c.rc != 0 || sc.s.rc != 0;
            /* the one who received the frame says why: a header that no longer parses (magic, version,
               a type no longer known, a length over the type's limit) is a protocol error; a length that still parses tears
               the stream (the tag is read from the wrong place: refused, or the peer times out and
               closes); anything else fails authentication */
            int rc = frame % 2 == 0 ? sc.s.rc : sc.c.rc, at = sc.r.tampered_at;
            CHECKF(refused && rc != 0, "frame %d byte %d: client %d '%s', server %d '%s'", frame, at, sc.c.rc,
                   sc.c.why, sc.s.rc, sc.s.why);
            if (at < 6) CHECKF(rc == HR_EPROTO, "frame %d byte %d: %d %s / %s", frame, at, rc, sc.c.why, sc.s.why);
            else if (at < 8) CHECKF(rc == HR_EPROTO || rc == HR_EAUTH, "frame %d byte %d: %d", frame, at, rc);
            else if (at >= 12 && frame >= 2) CHECKF(rc == HR_EAUTH, "frame %d byte %d: %d %s / %s", frame, at, rc, sc.c.why, sc.s.why);
            else if (at >= 12) CHECKF(rc == HR_EAUTH || rc == HR_EPROTO, "frame %d byte %d: %d %s", frame, at, rc, sc.s.why);
        }
    }
    /* truncated: the FORWARD cut short, then the link closes */
    scenario sc = {.ck = &key_a, .sk = &key_a, .via_relay = true, .r.tamper_frame = 4, .r.tamper_byte = 1000,
                   .r.truncate = true};
    run_scenario(&sc);
    CHECKF(sc.s.rc == HR_ENET && strstr(sc.s.why, "middle"), "%s", sc.s.why);
}

/* the recorded msg1 and first sealed frame of an honest session, sent again to the same worker key */
static void test_replay(void) {
    scenario sc = {.ck = &key_a, .sk = &key_a, .via_relay = true, .r.tamper_frame = -1};
    run_scenario(&sc);
    REQUIRE_VOID(sc.c.rc == 0 && sc.r.n_rec >= 2);
    char sa[64];
    hr_err err = {0};
    side s = {.key = &key_a};
    s.l = hn_listen("127.0.0.1:0", &err);
    REQUIRE_VOID(s.l);
    snprintf(sa, sizeof sa, "127.0.0.1:%u", hn_listener_port(s.l));
    pthread_t ts;
    pthread_create(&ts, NULL, server_main, &s);
    hn_conn *c = hn_connect(sa, hn_deadline_ms(2000), &err);
    uint8_t buf[512];
    size_t len;
    bool sealed = false;
    if (c) {
        int fd = hn_conn_fd(c);
        CHECK(write_all(fd, sc.r.rec[0], sc.r.rec_len[0]) == 0);
        /* the worker answers with a fresh ephemeral key: not the answer recorded */
        CHECK(read_frame(fd, buf, sizeof buf, &len, &sealed) == 0 && len == 16 + 48);
        CHECK(write_all(fd, sc.r.rec[1], sc.r.rec_len[1]) == 0);
    }
    pthread_join(ts, NULL);
    CHECKF(s.rc == HR_EAUTH && strstr(s.why, "failed authentication") && s.step == 0, "%d %s", s.rc, s.why);
    hn_conn_close(c);
    hn_listener_close(s.l);
}

/* ---- rekeying: by count (every 3rd frame) and by time (1 ms); the receiver follows the flag ---- */
typedef struct rk_ctx { hn_conn *c; int n, fails; char why[600]; } rk_ctx;

static void *rk_responder(void *arg) {
    rk_ctx *x = arg;
    hn_frame f = {0};
    hn_msg m;
    hr_err err = {0};
    int rc = hn_msg_recv_first(x->c, &key_a, &f, &m, 2000, &err);
    for (int i = 0; i < x->n && !rc; i++) {
        rc = hn_msg_recv(x->c, &f, &m, hn_deadline_ms(2000), &err);
        if (!rc && (m.type != HN_MSG_FORWARD || m.seq != (uint32_t)i || memcmp(m.u.forward.data, fdata, sizeof fdata)))
            rc = hr_fail(&err, HR_EPROTO, "FORWARD %d arrived wrong", i);
    }
    if (rc) { x->fails++; snprintf(x->why, sizeof x->why, "%s", err.msg); }
    hn_frame_free(&f);
    return NULL;
}

static void test_rekey(void) {
    for (int by_time = 0; by_time < 2; by_time++) {
        hr_err err = {0};
        hn_listener *l = hn_listen("127.0.0.1:0", &err);
        REQUIRE_VOID(l);
        char a[64];
        snprintf(a, sizeof a, "127.0.0.1:%u", hn_listener_port(l));
        hn_conn *c = hn_connect(a, hn_deadline_ms(2000), &err), *sv = c ? hn_accept(l, hn_deadline_ms(2000), &err) : NULL;
        REQUIRE_VOID(c && sv);
        hn_conn_set_rekey(c, by_time ? 0 : 3, by_time ? 1 : 0);
        rk_ctx x = {.c = sv, .n = 10};
        pthread_t t;
        pthread_create(&t, NULL, rk_responder, &x);
        int rc = hn_conn_handshake(c, &key_a, hn_deadline_ms(2000), &err);
        hn_msg m = {.type = HN_MSG_HELLO};
        m.u.hello = (hn_hello){.version_min = HN_PROTO_VERSION, .version_max = HN_PROTO_VERSION, .device = hn_cstr("x")};
        if (!rc) rc = hn_msg_send(c, &m, hn_deadline_ms(2000), &err);
        for (uint32_t i = 0; i < 10 && !rc; i++) {
            if (by_time) usleep(2000);
            forward_msg(&m, i);
            rc = hn_msg_send(c, &m, hn_deadline_ms(2000), &err);
        }
        pthread_join(t, NULL);
        CHECKF(rc == 0 && x.fails == 0, "%s / %s", err.msg, x.why);
        hn_conn_stats cs, ss;
        hn_conn_get_stats(c, &cs);
        hn_conn_get_stats(sv, &ss);
        /* 11 frames: by count the 3rd, 6th and 9th ratchet; by time every FORWARD (2 ms apart) */
        if (by_time) CHECKF(cs.rekeys_sent >= 10 && ss.rekeys_received == cs.rekeys_sent, "%llu %llu",
                            (unsigned long long)cs.rekeys_sent, (unsigned long long)ss.rekeys_received);
        else CHECKF(cs.rekeys_sent == 3 && ss.rekeys_received == 3 && ss.rekeys_sent == 0, "%llu %llu",
                    (unsigned long long)cs.rekeys_sent, (unsigned long long)ss.rekeys_received);
        hn_conn_close(c);
        hn_conn_close(sv);
        hn_listener_close(l);
    }
}

/* ---- datagrams ---- */
static void test_dgram(void) {
    hn_dgram_key k = {{7}}, k2 = {{8}};
    uint8_t m[100], c[116], o[100], ad[5] = {1, 2, 3, 4, 5};
    for (int i = 0; i < 100; i++) m[i] = (uint8_t)i;
    hn_dgram_seal(&k, 42, ad, sizeof ad, m, sizeof m, c);
    CHECK(memcmp(c, m, sizeof m) != 0);
    CHECK(hn_dgram_open(&k, 42, ad, sizeof ad, c, sizeof c, o) == 0 && !memcmp(o, m, sizeof m));
    CHECK(hn_dgram_open(&k, 43, ad, sizeof ad, c, sizeof c, o) == HR_EAUTH);
    CHECK(hn_dgram_open(&k2, 42, ad, sizeof ad, c, sizeof c, o) == HR_EAUTH);
    CHECK(hn_dgram_open(&k, 42, ad, 4, c, sizeof c, o) == HR_EAUTH);
    CHECK(hn_dgram_open(&k, 42, ad, sizeof ad, c, sizeof c - 1, o) == HR_EAUTH);
    CHECK(hn_dgram_open(&k, 42, ad, sizeof ad, c, 15, o) == HR_EFORMAT);
    int refused = 0;
    for (size_t b = 0; b < sizeof c; b++) {
        c[b] ^= 0x40;
        refused += hn_dgram_open(&k, 42, ad, sizeof ad, c, sizeof c, o) == HR_EAUTH;
        c[b] ^= 0x40;
    }
    CHECK(refused == (int)sizeof c);

    hn_replay w;
    hn_replay_init(&w);
    CHECK(hn_replay_accept(&w, 0) && !hn_replay_accept(&w, 0) && !hn_replay_check(&w, 0));
    for (uint64_t i = 2; i < 200; i += 2) CHECK(hn_replay_accept(&w, i));
    CHECK(hn_replay_accept(&w, 1) && hn_replay_accept(&w, 101) && !hn_replay_accept(&w, 101) && !hn_replay_accept(&w, 100));
    CHECK(hn_replay_check(&w, 99) && hn_replay_accept(&w, 99));
    CHECK(hn_replay_accept(&w, 5000));              /* a jump: the old ones are now too old */
    CHECK(!hn_replay_check(&w, 99) && !hn_replay_check(&w, 3000) && !hn_replay_accept(&w, 5000 - HN_REPLAY_WINDOW));
    CHECK(hn_replay_accept(&w, 5000 - (HN_REPLAY_WINDOW - 64)) && hn_replay_accept(&w, 4999));
    CHECK(!hn_replay_accept(&w, 4999) && hn_replay_accept(&w, 5001) && !hn_replay_accept(&w, 5001));
    /* against a plain set of seen counters, over a random walk */
    hn_replay_init(&w);
    static uint8_t seen[1 << 16];
    memset(seen, 0, sizeof seen);
    uint64_t st = 7, top = 0;
    int wrong = 0;
    for (int i = 0; i < 200000; i++) {
        uint64_t r = test_splitmix64(&st);
        uint64_t ctr = r % 3 == 0 ? top + 1 + (r >> 8) % 40 : (top > (r >> 8) % 1200 ? top - (r >> 8) % 1200 : 0);
        if (ctr >= sizeof seen) break;
        bool fresh = !seen[ctr] && (i == 0 || top / 64 - HR_MIN(ctr, top) / 64 < HN_REPLAY_WINDOW / 64 || ctr > top);
        bool got = hn_replay_accept(&w, ctr);
        wrong += got != fresh;
        if (got) { seen[ctr] = 1; if (ctr > top) top = ctr; }
    }
    CHECKF(wrong == 0, "%d decisions differ from the reference", wrong);
}

int main(void) {
    for (int i = 0; i < N_FLOATS; i++) fdata[i] = (float)i * 0.37f - 11.0f;
    test_vector();
    test_rekey_primitive();
    test_noise_misuse();
    test_honest();
    test_mismatch();
    test_tamper();
    test_replay();
    test_rekey();
    test_dgram();
    return test_summary();
}
