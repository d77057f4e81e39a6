/* net/dgram — the codec of the lossy all-reduce's datagrams (net.h, "datagrams"; docs/lossy.md): the
   one place a datagram becomes bytes and back, and so where the datagrams of an encrypted link are sealed
   and opened (issue 29; see net.h). No sockets here (udp.c): the fuzz harness links this and noise.c. */
#include "net.h"

#include <stdarg.h>
#include <stdio.h>

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint16_t get16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

uint32_t hn_dgram_max_elems(const hn_dgram_crypt *x) {
    return x && x->on ? HN_DGRAM_MAX_ELEMS_SEALED : HN_DGRAM_MAX_ELEMS;
}

static bool hn_dgram_ok(uint32_t total, uint32_t offset, uint32_t n, uint32_t max) {
    return n >= 1 && n <= max && total <= HN_DGRAM_MAX_TOTAL && offset <= total && n <= total - offset;
}

size_t hn_dgram_encode(const hn_dgram *d, hn_dgram_crypt *x, uint8_t *out, size_t cap) {
    const bool seal = x && x->on;
    size_t body = (size_t)d->n * 4, len = HN_DGRAM_HEADER + body + (seal ? HN_DGRAM_SEAL_OVERHEAD : 0);
    if (!hn_dgram_ok(d->total, d->offset, d->n, hn_dgram_max_elems(x)) || !d->data || len > cap ||
        d->kind < HN_DGRAM_PARTIAL || d->kind > HN_DGRAM_PROBE || (d->flags & ~HN_DGRAM_REPEAT) ||
        (seal && x->next >= HN_REKEY_MESSAGES))   /* a counter is never reused under one key */
        return 0;
    put32(out, HN_DGRAM_MAGIC);
    put16(out + 4, seal ? HN_DGRAM_VERSION_SEALED : HN_DGRAM_VERSION);
    put16(out + 6, (uint16_t)d->kind);
    put64(out + 8, d->session);
    put32(out + 16, d->seq);
    put16(out + 20, d->device);
    put16(out + 22, d->flags);
    put32(out + 24, d->total);
    put32(out + 28, d->offset);
    put32(out + 32, d->n);
    if (!seal) {
        memcpy(out + HN_DGRAM_HEADER, d->data, body);
        return len;
    }
    /* header | counter in clear, both associated data; the elements encrypted, then the tag */
    uint64_t ctr = x->next++;
    put64(out + HN_DGRAM_HEADER, ctr);
    hn_dgram_seal(&x->send, ctr, out, HN_DGRAM_HEADER + 8, d->data, body, out + HN_DGRAM_HEADER + 8);
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

/* opens a sealed datagram's elements into x->plain: their bytes, or a negative HR_E* */
static long hn_dgram_unseal(const uint8_t *p, size_t len, hn_dgram_crypt *x, char *why, size_t why_cap) {
    if (len < HN_DGRAM_HEADER + HN_DGRAM_SEAL_OVERHEAD || len > HN_DGRAM_MAX_BYTES ||
        get32(p) != HN_DGRAM_MAGIC || get16(p + 4) != HN_DGRAM_VERSION_SEALED) {
        hn_dgram_bad(why, why_cap, "%zu bytes: not a sealed datagram", len);
        return HR_EAUTH;
    }
    /* opened before the counter is judged: a forged datagram with a seen counter counts as forged, and
       only a genuine copy (a replay, a network duplicate) as seen */
    uint64_t ctr = get64(p + HN_DGRAM_HEADER);
    size_t clen = len - HN_DGRAM_HEADER - 8;
    if (hn_dgram_open(&x->recv, ctr, p, HN_DGRAM_HEADER + 8, p + HN_DGRAM_HEADER + 8, clen, x->plain)) {
        hn_dgram_bad(why, why_cap, "did not open (altered, or another key)");
        return HR_EAUTH;
    }
    if (!hn_replay_accept(&x->seen, ctr)) {
        hn_dgram_bad(why, why_cap, "counter %llu seen already (or older than the window)", (unsigned long long)ctr);
        return HR_EEXIST;
    }
    return (long)(clen - HN_AEAD_TAG_SIZE);
}

int hn_dgram_decode(const uint8_t *p, size_t len, hn_dgram_crypt *x, hn_dgram *out, char *why, size_t why_cap) {
    memset(out, 0, sizeof *out);
    const bool seal = x && x->on;
    const uint8_t *body = len >= HN_DGRAM_HEADER ? p + HN_DGRAM_HEADER : p;
    size_t blen = len >= HN_DGRAM_HEADER ? len - HN_DGRAM_HEADER : 0;
    if (seal) {
        /* authenticate before any field is trusted: only the header's magic and version are read first */
        long r = hn_dgram_unseal(p, len, x, why, why_cap);
        if (r < 0) return (int)r;
        body = x->plain;
        blen = (size_t)r;
    }
    if (len < HN_DGRAM_HEADER) return hn_dgram_bad(why, why_cap, "%zu bytes: shorter than a header", len);
    if (get32(p) != HN_DGRAM_MAGIC) return hn_dgram_bad(why, why_cap, "bad magic");
    if (get16(p + 4) != (seal ? HN_DGRAM_VERSION_SEALED : HN_DGRAM_VERSION))
        return hn_dgram_bad(why, why_cap, "version %u", get16(p + 4));
    uint16_t kind = get16(p + 6);
    if (kind < HN_DGRAM_PARTIAL || kind > HN_DGRAM_PROBE) return hn_dgram_bad(why, why_cap, "kind %u", kind);
    uint16_t flags = get16(p + 22);
    if (flags & ~HN_DGRAM_REPEAT) return hn_dgram_bad(why, why_cap, "flags %#x", flags);
    uint32_t total = get32(p + 24), offset = get32(p + 28), n = get32(p + 32);
    if (!hn_dgram_ok(total, offset, n, hn_dgram_max_elems(x)))
        return hn_dgram_bad(why, why_cap, "elements %u+%u of %u out of range", offset, n, total);
    if (blen != (size_t)n * 4) return hn_dgram_bad(why, why_cap, "%zu bytes for %u elements", len, n);
    *out = (hn_dgram){.kind = kind, .flags = flags, .session = get64(p + 8), .seq = get32(p + 16), .device = get16(p + 20),
                      .total = total,
                      .offset = offset, .n = n, .data = body};
    return 0;
}
