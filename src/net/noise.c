/* net/noise: the cryptography of hearth's links (issue 29; docs/security.md) — the Noise handshake
   NNpsk0 over X25519, ChaCha20-Poly1305 and BLAKE2b, built from libsodium's primitives to the letter of
   the Noise specification (revision 34), so that its published test vectors check it; the traffic
   ratchet; and the datagram seal with its replay window. What runs it on a connection is in tcp.c. */
#include "net.h"

#include <sodium.h>

#define HASHLEN  HN_NOISE_HASH_SIZE
#define BLOCKLEN 128 /* BLAKE2b's block: HMAC pads its key to it */

static const char noise_name[] = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2b";
/* a label for the datagram keys, derived from the final chaining key apart from the stream keys */
static const char dgram_label[] = "hearth datagram keys v1";

/* ---- HASH, HMAC, HKDF (Noise section 4.3) ---- */

static void hash2(uint8_t out[HASHLEN], const void *a, size_t an, const void *b, size_t bn) {
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, HASHLEN);
    crypto_generichash_update(&st, a, an);
    crypto_generichash_update(&st, b, bn);
    crypto_generichash_final(&st, out, HASHLEN);
}

/* HMAC-BLAKE2b (RFC 2104) of a || b; the key is at most HASHLEN bytes */
static void hmac(uint8_t out[HASHLEN], const uint8_t *key, size_t klen, const void *a, size_t an, const void *b, size_t bn) {
    uint8_t pad[BLOCKLEN], inner[HASHLEN];
    crypto_generichash_state st;
    memset(pad, 0x36, sizeof pad);
    for (size_t i = 0; i < klen; i++) pad[i] ^= key[i];
    crypto_generichash_init(&st, NULL, 0, HASHLEN);
    crypto_generichash_update(&st, pad, sizeof pad);
    crypto_generichash_update(&st, a, an);
    crypto_generichash_update(&st, b, bn);
    crypto_generichash_final(&st, inner, HASHLEN);
    memset(pad, 0x5c, sizeof pad);
    for (size_t i = 0; i < klen; i++) pad[i] ^= key[i];
    hash2(out, pad, sizeof pad, inner, sizeof inner);
    sodium_memzero(pad, sizeof pad);
    sodium_memzero(inner, sizeof inner);
}

/* HKDF(ck, ikm) -> o1, o2, o3 (o3 may be NULL) */
static void hkdf(const uint8_t ck[HASHLEN], const void *ikm, size_t n, uint8_t o1[HASHLEN], uint8_t o2[HASHLEN],
                 uint8_t *o3) {
    uint8_t temp[HASHLEN];
    const uint8_t b1 = 1, b2 = 2, b3 = 3;
    hmac(temp, ck, HASHLEN, ikm, n, NULL, 0);
    hmac(o1, temp, HASHLEN, &b1, 1, NULL, 0);
    hmac(o2, temp, HASHLEN, o1, HASHLEN, &b2, 1);
    if (o3) hmac(o3, temp, HASHLEN, o2, HASHLEN, &b3, 1);
    sodium_memzero(temp, sizeof temp);
}

/* ---- the AEAD with Noise's nonce ---- */

static void nonce12(uint8_t out[12], uint64_t n) {
    memset(out, 0, 4);
    for (int i = 0; i < 8; i++) out[4 + i] = (uint8_t)(n >> (8 * i));
}

void hn_aead_seal(const uint8_t k[HN_NOISE_KEY_SIZE], uint64_t nonce, const void *ad, size_t ad_len, const void *m,
                  size_t n, uint8_t *out) {
    uint8_t iv[12];
    nonce12(iv, nonce);
    crypto_aead_chacha20poly1305_ietf_encrypt_detached(out, out + n, NULL, m, n, ad, ad_len, NULL, iv, k);
}

int hn_aead_open(const uint8_t k[HN_NOISE_KEY_SIZE], uint64_t nonce, const void *ad, size_t ad_len, const uint8_t *c,
                 size_t n, uint8_t *out) {
    if (n < HN_AEAD_TAG_SIZE) return HR_EAUTH;
    uint8_t iv[12];
    nonce12(iv, nonce);
    size_t m = n - HN_AEAD_TAG_SIZE;
    /* libsodium checks the tag before it writes out, so a forgery never reaches the caller's buffer */
    return crypto_aead_chacha20poly1305_ietf_decrypt_detached(out, NULL, c, m, c + m, ad, ad_len, iv, k) ? HR_EAUTH : 0;
}

void hn_noise_rekey(uint8_t k[HN_NOISE_KEY_SIZE]) {
    uint8_t zeros[HN_NOISE_KEY_SIZE] = {0}, out[HN_NOISE_KEY_SIZE + HN_AEAD_TAG_SIZE];
    hn_aead_seal(k, UINT64_MAX, NULL, 0, zeros, sizeof zeros, out);
    memcpy(k, out, HN_NOISE_KEY_SIZE);
    sodium_memzero(out, sizeof out);
}

/* ---- SymmetricState (Noise section 5.2) ---- */

static void mix_hash(hn_noise *s, const void *data, size_t n) { hash2(s->h, s->h, HASHLEN, data, n); }

static void mix_key(hn_noise *s, const void *ikm, size_t n) {
    uint8_t tk[HASHLEN];
    hkdf(s->ck, ikm, n, s->ck, tk, NULL);
    memcpy(s->k, tk, HN_NOISE_KEY_SIZE);
    s->has_k = true;
    s->n = 0;
    sodium_memzero(tk, sizeof tk);
}

static void mix_key_and_hash(hn_noise *s, const void *ikm, size_t n) {
    uint8_t th[HASHLEN], tk[HASHLEN];
    hkdf(s->ck, ikm, n, s->ck, th, tk);
    mix_hash(s, th, HASHLEN);
    memcpy(s->k, tk, HN_NOISE_KEY_SIZE);
    s->has_k = true;
    s->n = 0;
    sodium_memzero(th, sizeof th);
    sodium_memzero(tk, sizeof tk);
}

/* out: n + 16 bytes (a key is always set by the time NNpsk0 sends a payload) */
static void encrypt_and_hash(hn_noise *s, const void *m, size_t n, uint8_t *out) {
    hn_aead_seal(s->k, s->n++, s->h, HASHLEN, m, n, out);
    mix_hash(s, out, n + HN_AEAD_TAG_SIZE);
}

static int decrypt_and_hash(hn_noise *s, const uint8_t *c, size_t n, uint8_t *out) {
    if (hn_aead_open(s->k, s->n, s->h, HASHLEN, c, n, out)) return HR_EAUTH;
    s->n++;
    mix_hash(s, c, n);
    return 0;
}

/* ---- HandshakeState for NNpsk0:  -> psk, e   <- e, ee ---- */

void hn_noise_wipe(hn_noise *s) { sodium_memzero(s, sizeof *s); }

int hn_noise_init(hn_noise *s, bool initiator, const uint8_t psk[HN_NOISE_KEY_SIZE], const void *prologue,
                  size_t prologue_len, const uint8_t *e_priv, hr_err *err) {
    memset(s, 0, sizeof *s);
    if (sodium_init() < 0) return hr_fail(err, HR_EIO, "libsodium could not be initialised");
    memcpy(s->h, noise_name, sizeof noise_name - 1); /* the name fits HASHLEN: h = name, zero padded */
    memcpy(s->ck, s->h, HASHLEN);
    mix_hash(s, prologue, prologue_len);
    memcpy(s->psk, psk, HN_NOISE_KEY_SIZE);
    s->initiator = initiator;
    if (e_priv) memcpy(s->e, e_priv, sizeof s->e);
    else randombytes_buf(s->e, sizeof s->e);
    crypto_scalarmult_base(s->e_pub, s->e);
    return 0;
}

static int noise_fail(hn_noise *s, int code, hr_err *err, const char *what) {
    hn_noise_wipe(s);
    s->step = -1;
    return hr_fail(err, code, "handshake: %s", what);
}

/* the "e" token: e's public key goes into h and, in a PSK handshake, into the key too */
static void token_e(hn_noise *s, const uint8_t pub[32]) {
    mix_hash(s, pub, 32);
    mix_key(s, pub, 32);
}

static int token_ee(hn_noise *s) {
    uint8_t dh[32];
    if (crypto_scalarmult(dh, s->e, s->re)) return HR_EAUTH; /* a low-order point: no shared secret */
    mix_key(s, dh, sizeof dh);
    sodium_memzero(dh, sizeof dh);
    return 0;
}

int hn_noise_write(hn_noise *s, const void *payload, size_t n, uint8_t *out, size_t cap, size_t *out_len, hr_err *err) {
    bool turn = s->initiator ? s->step == 0 : s->step == 1;
    if (!turn) return noise_fail(s, HR_EPROTO, err, "not this side's turn to write");
    if (n > HN_NOISE_MSG_MAX - 32 - HN_AEAD_TAG_SIZE || cap < 32 + n + HN_AEAD_TAG_SIZE)
        return noise_fail(s, HR_EINVAL, err, "payload too large");
    if (s->initiator) mix_key_and_hash(s, s->psk, HN_NOISE_KEY_SIZE);
    memcpy(out, s->e_pub, 32);
    token_e(s, s->e_pub);
    if (!s->initiator && token_ee(s)) return noise_fail(s, HR_EAUTH, err, "the peer's ephemeral key is invalid");
    encrypt_and_hash(s, payload, n, out + 32);
    *out_len = 32 + n + HN_AEAD_TAG_SIZE;
    s->step++;
    return 0;
}

int hn_noise_read(hn_noise *s, const uint8_t *msg, size_t n, uint8_t *out, size_t cap, size_t *out_len, hr_err *err) {
    bool turn = s->initiator ? s->step == 1 : s->step == 0;
    if (!turn) return noise_fail(s, HR_EPROTO, err, "a message out of turn");
    if (n < 32 + HN_AEAD_TAG_SIZE || n > HN_NOISE_MSG_MAX) return noise_fail(s, HR_EPROTO, err, "a message of the wrong size");
    size_t m = n - 32 - HN_AEAD_TAG_SIZE;
    if (cap < m) return noise_fail(s, HR_EINVAL, err, "no room for the payload");
    if (!s->initiator) mix_key_and_hash(s, s->psk, HN_NOISE_KEY_SIZE);
    memcpy(s->re, msg, 32);
    token_e(s, s->re);
    if (s->initiator && token_ee(s)) return noise_fail(s, HR_EAUTH, err, "the peer's ephemeral key is invalid");
    if (decrypt_and_hash(s, msg + 32, n - 32, out))
        return noise_fail(s, HR_EAUTH, err, "the peer does not hold this cluster key, or the message was altered");
    *out_len = m;
    s->step++;
    return 0;
}

void hn_noise_split(hn_noise *s, uint8_t send[HN_NOISE_KEY_SIZE], uint8_t recv[HN_NOISE_KEY_SIZE],
                    uint8_t dgram_send[HN_NOISE_KEY_SIZE], uint8_t dgram_recv[HN_NOISE_KEY_SIZE]) {
    HR_ASSERT(s->step == 2);
    uint8_t k1[HASHLEN], k2[HASHLEN];
    hkdf(s->ck, NULL, 0, k1, k2, NULL);
    memcpy(s->initiator ? send : recv, k1, HN_NOISE_KEY_SIZE);
    memcpy(s->initiator ? recv : send, k2, HN_NOISE_KEY_SIZE);
    hkdf(s->ck, dgram_label, sizeof dgram_label - 1, k1, k2, NULL);
    memcpy(s->initiator ? dgram_send : dgram_recv, k1, HN_NOISE_KEY_SIZE);
    memcpy(s->initiator ? dgram_recv : dgram_send, k2, HN_NOISE_KEY_SIZE);
    sodium_memzero(k1, sizeof k1);
    sodium_memzero(k2, sizeof k2);
    hn_noise_wipe(s);
}

/* ---- datagrams ---- */

void hn_dgram_seal(const hn_dgram_key *k, uint64_t counter, const void *ad, size_t ad_len, const void *m, size_t n,
                   uint8_t *out) {
    hn_aead_seal(k->k, counter, ad, ad_len, m, n, out);
}

int hn_dgram_open(const hn_dgram_key *k, uint64_t counter, const void *ad, size_t ad_len, const uint8_t *c, size_t n,
                  uint8_t *out) {
    if (n < HN_AEAD_TAG_SIZE) return HR_EFORMAT;
    return hn_aead_open(k->k, counter, ad, ad_len, c, n, out);
}

/* A sliding window of counters ending at `top`, the highest seen (RFC 6479's bitmap): words of 64
   bits used round-robin; bit c % 64 of word (c / 64) mod W says whether counter c was seen. A counter
   whose word has been reused (top's word is W or more words on) is too old to tell, and refused: the
   window covers at least the last HN_REPLAY_WINDOW - 64 counters. */
#define REPLAY_WORDS (HN_REPLAY_WINDOW / 64)

void hn_replay_init(hn_replay *w) { memset(w, 0, sizeof *w); }

bool hn_replay_check(const hn_replay *w, uint64_t c) {
    if (!w->any || c > w->top) return true;
    if (w->top / 64 - c / 64 >= REPLAY_WORDS) return false;
    return !((w->bits[(c / 64) % REPLAY_WORDS] >> (c % 64)) & 1);
}

bool hn_replay_accept(hn_replay *w, uint64_t c) {
    if (!hn_replay_check(w, c)) return false;
    if (!w->any) {
        memset(w->bits, 0, sizeof w->bits);
        w->top = c;
        w->any = true;
    } else if (c > w->top) {
        /* the words the window slides onto start empty (all of them after a long jump) */
        uint64_t to = c / 64, from = w->top / 64 + 1;
        if (to >= from && to - from >= REPLAY_WORDS) from = to + 1 - REPLAY_WORDS;
        for (uint64_t i = from; i <= to; i++) w->bits[i % REPLAY_WORDS] = 0;
        w->top = c;
    }
    w->bits[(c / 64) % REPLAY_WORDS] |= 1ull << (c % 64);
    return true;
}
