/* net/dgram — the codec of the lossy all-reduce's datagrams (net.h, "datagrams"; docs/lossy.md): the
   one place a datagram becomes bytes and back, so the seam where the AEAD of encrypted links will seal
   and open them (see net.h). No sockets here (udp.c): the fuzz harness links this alone. */
#include "net.h"

#include <stdarg.h>
#include <stdio.h>

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
    if (!hn_dgram_ok(d->total, d->offset, d->n) || !d->data || len > cap || d->kind < HN_DGRAM_PARTIAL ||
        d->kind > HN_DGRAM_NACK || (d->flags & ~HN_DGRAM_REPEAT))
        return 0;
    put32(out, HN_DGRAM_MAGIC);
    put16(out + 4, HN_DGRAM_VERSION);
    put16(out + 6, (uint16_t)d->kind);
    put64(out + 8, d->session);
    put32(out + 16, d->seq);
    put16(out + 20, d->device);
    put16(out + 22, d->flags);
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
    uint16_t kind = get16(p + 6);
    if (kind < HN_DGRAM_PARTIAL || kind > HN_DGRAM_NACK) return hn_dgram_bad(why, why_cap, "kind %u", kind);
    uint16_t flags = get16(p + 22);
    if (flags & ~HN_DGRAM_REPEAT) return hn_dgram_bad(why, why_cap, "flags %#x", flags);
    uint32_t total = get32(p + 24), offset = get32(p + 28), n = get32(p + 32);
    if (!hn_dgram_ok(total, offset, n))
        return hn_dgram_bad(why, why_cap, "elements %u+%u of %u out of range", offset, n, total);
    if (len != HN_DGRAM_HEADER + (size_t)n * 4)
        return hn_dgram_bad(why, why_cap, "%zu bytes for %u elements", len, n);
    *out = (hn_dgram){.kind = kind, .flags = flags, .session = get64(p + 8), .seq = get32(p + 16), .device = get16(p + 20),
                      .total = total,
                      .offset = offset, .n = n, .data = p + HN_DGRAM_HEADER};
    return 0;
}
