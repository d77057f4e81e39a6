// fuzz-noise — libFuzzer harness for the handshake and the sealed frames of issue 29 (src/net/noise.c;
// built with clang by scripts/fuzz.sh, not CMake).
//
// An honest initiator and responder (fixed key and ephemerals) run the handshake and then seal one
// frame as the transport does (its 16-byte header as associated data). Input byte 0 picks the message
// the fuzzer controls (mod 3: message 1, message 2, the sealed frame); the rest is XORed onto that
// message, and its length becomes the message's length (longer: the extra bytes are the input's). So
// the empty difference is the honest run, which must succeed end to end, and any other must be refused
// by the side that reads it — every bit of each message is authenticated — without a crash or a
// sanitizer report. Bit 0x80 of byte 0 makes the rest replace the message outright (arbitrary bytes,
// which must be refused unless they happen to equal it). Byte 1 onwards also drives a replay window.
//
// Corpus: tests/corpus/fuzz-noise/ (scripts/fuzz.sh copies it in).
//
// fuzz-sources: src/net/noise.c src/net/proto.c src/base/*.c
// fuzz-max-len: 512
#include "net/net.h"

#include <stdio.h>
#include <stdlib.h>

#define FUZZ_CHECK(x) do { if (!(x)) { fprintf(stderr, "fuzz-noise: check failed: %s\n", #x); abort(); } } while (0)

static const uint8_t psk[32] = {7, 1, 2, 3};
static const uint8_t ei[32] = {0x40, 1, 1}, er[32] = {0x41, 2, 2};

/* msg (len *n, room cap) becomes the fuzzer's version; true if it still equals the original */
static bool mutate(uint8_t *msg, size_t *n, size_t cap, const uint8_t *in, size_t in_n, bool replace) {
    uint8_t orig[HN_NOISE_MSG_MAX + 128];
    size_t on = *n;
    memcpy(orig, msg, on);
    size_t m = in_n < cap ? in_n : cap;
    if (replace) {
        memcpy(msg, in, m);
    } else {
        for (size_t i = 0; i < m; i++) msg[i] = (uint8_t)((i < on ? msg[i] : 0) ^ in[i]);
        if (m < on) m = in_n == 0 ? on : m; /* an empty difference keeps the message whole */
    }
    *n = m;
    return m == on && !memcmp(orig, msg, on);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int target = (data[0] & 0x7f) % 3;
    bool replace = data[0] & 0x80;
    const uint8_t *in = data + 1;
    size_t in_n = size - 1;

    hn_noise i, r;
    FUZZ_CHECK(hn_noise_init(&i, true, psk, "fuzz", 4, ei, NULL) == 0);
    FUZZ_CHECK(hn_noise_init(&r, false, psk, "fuzz", 4, er, NULL) == 0);
    uint8_t msg[HN_NOISE_MSG_MAX + 128], out[HN_NOISE_MSG_MAX + 128];
    size_t n, pn;
    FUZZ_CHECK(hn_noise_write(&i, "a", 1, msg, HN_NOISE_MSG_MAX, &n, NULL) == 0);
    bool same = target == 0 ? mutate(msg, &n, sizeof msg, in, in_n, replace) : true;
    int rc = hn_noise_read(&r, msg, n, out, sizeof out, &pn, NULL);
    FUZZ_CHECK(same ? rc == 0 && pn == 1 && out[0] == 'a' : rc != 0);
    if (rc) { FUZZ_CHECK(r.step == -1); return 0; }

    FUZZ_CHECK(hn_noise_write(&r, "bc", 2, msg, HN_NOISE_MSG_MAX, &n, NULL) == 0);
    same = target == 1 ? mutate(msg, &n, sizeof msg, in, in_n, replace) : true;
    rc = hn_noise_read(&i, msg, n, out, sizeof out, &pn, NULL);
    FUZZ_CHECK(same ? rc == 0 && pn == 2 && !memcmp(out, "bc", 2) : rc != 0);
    if (rc) return 0;

    uint8_t is[32], ir[32], rs[32], rr[32], d[4][32];
    hn_noise_split(&i, is, ir, d[0], d[1]);
    hn_noise_split(&r, rs, rr, d[2], d[3]);
    FUZZ_CHECK(!memcmp(is, rr, 32) && !memcmp(ir, rs, 32));

    /* a sealed frame: header (AD) | ciphertext | tag, as tcp.c sends it */
    uint8_t frame[16 + 64 + 16 + 128], pt[64];
    for (int k = 0; k < 64; k++) pt[k] = (uint8_t)(k * 3);
    hn_header_encode(frame, HN_MSG_RESULT, sizeof pt, 5);
    hn_aead_seal(is, 0, frame, 16, pt, sizeof pt, frame + 16);
    n = 16 + sizeof pt + 16;
    same = target == 2 ? mutate(frame, &n, sizeof frame, in, in_n, replace) : true;
    uint8_t dec[sizeof frame];
    rc = n >= 16 ? hn_aead_open(rr, 0, frame, 16, frame + 16, n - 16, dec) : HR_EAUTH;
    FUZZ_CHECK(same ? rc == 0 && !memcmp(dec, pt, sizeof pt) : rc == HR_EAUTH);

    /* the replay window: no counter is accepted twice */
    hn_replay w;
    hn_replay_init(&w);
    for (size_t k = 0; k + 2 <= in_n; k += 2) {
        uint64_t c = (uint64_t)in[k] << (in[k + 1] % 40);
        bool fresh = hn_replay_check(&w, c);
        FUZZ_CHECK(hn_replay_accept(&w, c) == fresh);
        FUZZ_CHECK(!hn_replay_accept(&w, c) && !hn_replay_check(&w, c));
    }
    return 0;
}
