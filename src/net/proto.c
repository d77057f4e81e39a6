/* net/proto — frame header, payload writer/reader, and every message's encoder and decoder (net.h) */
#include "net.h"

#include <stdio.h>
#include <stdlib.h>

/* f32/i32/u64 arrays travel in host order and are read in place (see net.h) */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "hearth's wire protocol sends arrays in host order and needs a little-endian host"
#endif

_Static_assert(sizeof(hn_unit) == 16, "hn_unit must match its 16-byte wire layout");

/* ---- message table ---- */
typedef struct msg_info { const char *name; uint32_t max_payload; } msg_info;

#define KIB 1024u
#define MIB (1024u * 1024u)
static const msg_info msg_table[HN_MSG_COUNT] = {
    [HN_MSG_HELLO]       = { "HELLO",       4 * KIB },
    [HN_MSG_HELLO_ACK]   = { "HELLO_ACK",   4 * KIB },
    [HN_MSG_ERROR]       = { "ERROR",       4 * KIB },
    [HN_MSG_PROFILE_REQ] = { "PROFILE_REQ", 256 },
    [HN_MSG_PROFILE]     = { "PROFILE",     64 * KIB },
    [HN_MSG_LOAD_PLAN]   = { "LOAD_PLAN",   1 * MIB },
    [HN_MSG_SLICE_HAVE]  = { "SLICE_HAVE",  1 * MIB },
    [HN_MSG_SLICE_BEGIN] = { "SLICE_BEGIN", 4 * KIB },
    [HN_MSG_SLICE_CHUNK] = { "SLICE_CHUNK", HN_MAX_CHUNK + 64 },
    [HN_MSG_SLICE_END]   = { "SLICE_END",   256 },
    [HN_MSG_READY]       = { "READY",       256 },
    [HN_MSG_FORWARD]     = { "FORWARD",     64 * MIB },
    [HN_MSG_PARTIAL]     = { "PARTIAL",     64 * MIB },
    [HN_MSG_RESULT]      = { "RESULT",      64 * MIB },
    [HN_MSG_RESET]       = { "RESET",       256 },
    [HN_MSG_BYE]         = { "BYE",         4 * KIB },
    [HN_MSG_PROBE]       = { "PROBE",       HN_MAX_PROBE + 64 },
    [HN_MSG_LINK_PROBE]  = { "LINK_PROBE",  512 },
    [HN_MSG_KV_COPY]     = { "KV_COPY",     256 },
    [HN_MSG_LOSS_PROBE]  = { "LOSS_PROBE",  256 },
};

static bool type_known(int type) { return type > 0 && type < HN_MSG_COUNT; }

const char *hn_msg_name(int type) { return type_known(type) ? msg_table[type].name : "?"; }
uint32_t hn_msg_max_payload(int type) { return type_known(type) ? msg_table[type].max_payload : 0; }

/* ---- little-endian scalars ---- */
static void st16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void st32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void st64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t ld32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t ld64(const uint8_t *p) { return (uint64_t)ld32(p) | (uint64_t)ld32(p + 4) << 32; }

/* ---- header ---- */
void hn_header_encode(uint8_t out[HN_HEADER_SIZE], int type, uint32_t len, uint32_t seq) {
    st32(out, HN_MAGIC);
    st16(out + 4, HN_PROTO_VERSION);
    st16(out + 6, (uint16_t)type);
    st32(out + 8, len);
    st32(out + 12, seq);
}

int hn_header_decode(const uint8_t in[HN_HEADER_SIZE], hn_header *h, hr_err *err) {
    h->magic = ld32(in);
    h->version = ld16(in + 4);
    h->type = ld16(in + 6);
    h->len = ld32(in + 8);
    h->seq = ld32(in + 12);
    if (h->magic != HN_MAGIC)
        return hr_fail(err, HR_EPROTO, "bad frame magic 0x%08x (expected 0x%08x \"HRTH\"): not a hearth peer, "
                       "or the stream lost its place", h->magic, HN_MAGIC);
    if (h->version != HN_PROTO_VERSION)
        return hr_fail(err, HR_EPROTO, "peer speaks protocol version %u, this build speaks %u",
                       h->version, HN_PROTO_VERSION);
    if (!type_known(h->type))
        return hr_fail(err, HR_EPROTO, "unknown message type %u (seq %u)", h->type, h->seq);
    if (h->len > msg_table[h->type].max_payload)
        return hr_fail(err, HR_EPROTO, "%s frame claims %u payload bytes, over its limit of %u",
                       msg_table[h->type].name, h->len, msg_table[h->type].max_payload);
    return HR_OK;
}

/* ---- writer ---- */
void hn_buf_init(hn_buf *b) { memset(b, 0, sizeof *b); }
void hn_buf_free(hn_buf *b) { free(b->data); hn_buf_init(b); }
void hn_buf_reset(hn_buf *b) { b->len = 0; b->oom = false; }

/* room for n more bytes; NULL (and oom set) if it cannot grow */
static uint8_t *buf_grow(hn_buf *b, size_t n) {
    if (b->oom) return NULL;
    if (n > SIZE_MAX / 2 - b->len) { b->oom = true; return NULL; }
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        uint8_t *d = realloc(b->data, cap);
        if (!d) { b->oom = true; return NULL; }
        b->data = d;
        b->cap = cap;
    }
    uint8_t *p = b->data + b->len;
    b->len += n;
    return p;
}

void hn_buf_put_u8(hn_buf *b, uint8_t v)   { uint8_t *p = buf_grow(b, 1); if (p) *p = v; }
void hn_buf_put_u16(hn_buf *b, uint16_t v) { uint8_t *p = buf_grow(b, 2); if (p) st16(p, v); }
void hn_buf_put_u32(hn_buf *b, uint32_t v) { uint8_t *p = buf_grow(b, 4); if (p) st32(p, v); }
void hn_buf_put_u64(hn_buf *b, uint64_t v) { uint8_t *p = buf_grow(b, 8); if (p) st64(p, v); }
void hn_buf_put_i32(hn_buf *b, int32_t v)  { hn_buf_put_u32(b, (uint32_t)v); }
void hn_buf_put_f32(hn_buf *b, float v)    { hn_buf_put_u32(b, hr_f32_to_bits(v)); }

void hn_buf_put_raw(hn_buf *b, const void *src, size_t n) {
    if (!n) return;
    uint8_t *p = buf_grow(b, n);
    if (p) memcpy(p, src, n);
}
void hn_buf_put_blob(hn_buf *b, const void *p, uint32_t n) { hn_buf_put_u32(b, n); hn_buf_put_raw(b, p, n); }
void hn_buf_put_str(hn_buf *b, const char *s, uint32_t n)  { hn_buf_put_blob(b, s, n); }

static size_t elem_align(size_t elem_size) { return elem_size < 8 ? elem_size : 8; }

void hn_buf_put_array_head(hn_buf *b, uint32_t count, size_t elem_size) {
    hn_buf_put_u32(b, count);
    size_t a = elem_align(elem_size);
    size_t pad = (a - b->len % a) % a;
    uint8_t *p = buf_grow(b, pad);
    if (p) memset(p, 0, pad);
}
/* arrays go out in host order: the host is little-endian (checked at the top) */
static void put_array(hn_buf *b, const void *v, uint32_t n, size_t elem_size) {
    hn_buf_put_array_head(b, n, elem_size);
    hn_buf_put_raw(b, v, (size_t)n * elem_size);
}
void hn_buf_put_f32s(hn_buf *b, const float *v, uint32_t n)    { put_array(b, v, n, 4); }
void hn_buf_put_i32s(hn_buf *b, const int32_t *v, uint32_t n)  { put_array(b, v, n, 4); }
void hn_buf_put_u64s(hn_buf *b, const uint64_t *v, uint32_t n) { put_array(b, v, n, 8); }

/* ---- reader ---- */
void hn_rd_init(hn_rd *r, int type, const void *p, size_t len) {
    HR_ASSERT(len == 0 || ((uintptr_t)p & 7) == 0); /* arrays are handed out in place */
    memset(r, 0, sizeof *r);
    r->p = p;
    r->len = len;
    r->type = type;
}

bool hn_rd_reject(hn_rd *r, const char *field, const char *fmt, ...) {
    if (r->failed) return false; /* the first failure is the one worth reporting */
    r->failed = true;
    int k = snprintf(r->why, sizeof r->why, "%s: ", field);
    if (k < 0 || (size_t)k >= sizeof r->why) return false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why + k, sizeof r->why - (size_t)k, fmt, ap);
    va_end(ap);
    return false;
}

/* pointer to the next n bytes (consumed), or NULL after marking the reader failed */
static const uint8_t *rd_take(hn_rd *r, size_t n, const char *field) {
    if (r->failed) return NULL;
    size_t left = r->len - r->pos;
    if (n > left) {
        hn_rd_reject(r, field, "needs %zu bytes, %zu left", n, left);
        return NULL;
    }
    /* an empty payload may come as NULL; zero-length takes still need a non-NULL pointer */
    const uint8_t *p = r->p ? r->p + r->pos : (const uint8_t *)"";
    r->pos += n;
    return p;
}

uint8_t hn_rd_u8(hn_rd *r, const char *field)   { const uint8_t *p = rd_take(r, 1, field); return p ? *p : 0; }
uint16_t hn_rd_u16(hn_rd *r, const char *field) { const uint8_t *p = rd_take(r, 2, field); return p ? ld16(p) : 0; }
uint32_t hn_rd_u32(hn_rd *r, const char *field) { const uint8_t *p = rd_take(r, 4, field); return p ? ld32(p) : 0; }
uint64_t hn_rd_u64(hn_rd *r, const char *field) { const uint8_t *p = rd_take(r, 8, field); return p ? ld64(p) : 0; }
int32_t hn_rd_i32(hn_rd *r, const char *field)  { return (int32_t)hn_rd_u32(r, field); }
float hn_rd_f32(hn_rd *r, const char *field)    { return hr_bits_to_f32(hn_rd_u32(r, field)); }

bool hn_rd_raw(hn_rd *r, void *out, size_t n, const char *field) {
    const uint8_t *p = rd_take(r, n, field);
    if (p) memcpy(out, p, n);
    else memset(out, 0, n);
    return p != NULL;
}

const uint8_t *hn_rd_blob(hn_rd *r, uint32_t *n, uint32_t max_len, const char *field) {
    *n = 0;
    uint32_t len = hn_rd_u32(r, field);
    if (r->failed) return NULL;
    if (len > max_len) { hn_rd_reject(r, field, "length %u exceeds its limit of %u", len, max_len); return NULL; }
    const uint8_t *p = rd_take(r, len, field);
    if (p) *n = len;
    return p;
}

hn_str hn_rd_str(hn_rd *r, uint32_t max_len, const char *field) {
    hn_str s = { "", 0 };
    uint32_t n;
    const uint8_t *p = hn_rd_blob(r, &n, max_len, field);
    if (!p) return s;
    if (memchr(p, 0, n)) { hn_rd_reject(r, field, "string contains a NUL byte"); return s; }
    s.s = (const char *)p;
    s.n = n;
    return s;
}

const void *hn_rd_array(hn_rd *r, uint32_t *count, size_t elem_size, const char *field) {
    *count = 0;
    uint32_t n = hn_rd_u32(r, field);
    if (r->failed) return NULL;
    size_t a = elem_align(elem_size);
    size_t pad = (a - r->pos % a) % a;
    const uint8_t *pp = rd_take(r, pad, field);
    if (!pp) return NULL;
    for (size_t i = 0; i < pad; i++)
        if (pp[i]) { hn_rd_reject(r, field, "non-zero padding byte"); return NULL; }
    size_t left = r->len - r->pos;
    if (n > left / elem_size) { /* division, so a huge count cannot overflow the product */
        hn_rd_reject(r, field, "count %u of %zu-byte elements needs more than the %zu bytes left",
                     n, elem_size, left);
        return NULL;
    }
    const uint8_t *p = rd_take(r, (size_t)n * elem_size, field);
    if (!p || n == 0) return NULL;
    *count = n;
    return p;
}

int hn_rd_finish(hn_rd *r, hr_err *err) {
    if (r->failed) return hr_fail(err, HR_EFORMAT, "%s.%s", hn_msg_name(r->type), r->why);
    if (r->pos != r->len)
        return hr_fail(err, HR_EFORMAT, "%s: %zu bytes after the last field", hn_msg_name(r->type),
                       r->len - r->pos);
    return HR_OK;
}

/* ---- strings ---- */
hn_str hn_cstr(const char *s) {
    hn_str r = { s ? s : "", s ? (uint32_t)strlen(s) : 0 };
    return r;
}

size_t hn_str_copy(char *dst, size_t cap, hn_str s) {
    if (cap) {
        size_t n = HR_MIN((size_t)s.n, cap - 1);
        if (n) memcpy(dst, s.s, n);
        dst[n] = 0;
    }
    return s.n;
}

bool hn_str_eq(hn_str s, const char *cstr) {
    size_t n = strlen(cstr);
    return n == s.n && (n == 0 || memcmp(s.s, cstr, n) == 0);
}

bool hn_profile_get(const hn_profile *p, const char *key, char *out, size_t cap) {
    bool found = false;
    for (uint32_t i = 0; i < p->n_kv; i++)
        if (hn_str_eq(p->kv[i].key, key)) {
            hn_str_copy(out, cap, p->kv[i].value);
            found = true;
        }
    return found;
}

double hn_profile_num(const hn_profile *p, const char *key, double absent) {
    char v[HN_MAX_VALUE + 1];
    return hn_profile_get(p, key, v, sizeof v) ? strtod(v, NULL) : absent;
}

/* ---- message validity, shared by encoder and decoder ----
   The reader checks structure (lengths against what remains); this checks what the fields mean
   together. Returning the field and reason lets both sides word the error the same way. */
typedef struct why { const char *field; char reason[120]; } why;

static bool bad(why *w, const char *field, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool bad(why *w, const char *field, const char *fmt, ...) {
    w->field = field;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->reason, sizeof w->reason, fmt, ap);
    va_end(ap);
    return false;
}

static bool str_ok(hn_str s, uint32_t max, const char *field, why *w) {
    if (s.n > max) return bad(w, field, "length %u exceeds its limit of %u", s.n, max);
    if (s.n && !s.s) return bad(w, field, "NULL with length %u", s.n);
    if (s.n && memchr(s.s, 0, s.n)) return bad(w, field, "string contains a NUL byte");
    return true;
}

static bool kv_ok(uint32_t n, const hn_kv *kv, const char *field, why *w) {
    if (n > HN_MAX_KV) return bad(w, field, "count %u exceeds its limit of %u", n, HN_MAX_KV);
    for (uint32_t i = 0; i < n; i++)
        if (!str_ok(kv[i].key, HN_MAX_KEY, field, w) || !str_ok(kv[i].value, HN_MAX_VALUE, field, w)) return false;
    return true;
}

static bool array_ok(const void *p, uint64_t n, const char *field, why *w) {
    if (n > UINT32_MAX) return bad(w, field, "count %llu does not fit in u32", (unsigned long long)n);
    if (n && !p) return bad(w, field, "NULL with count %llu", (unsigned long long)n);
    return true;
}

static bool stage_ok(uint32_t stage, why *w) {
    return stage < HN_STAGE_COUNT || bad(w, "stage", "unknown stage %u", stage);
}

static bool msg_ok(const hn_msg *m, why *w) {
    switch (m->type) {
    case HN_MSG_HELLO: {
        const hn_hello *h = &m->u.hello;
        if (h->version_min > h->version_max)
            return bad(w, "version_min", "version range %u..%u is empty", h->version_min, h->version_max);
        return str_ok(h->device, HN_MAX_NAME, "device", w);
    }
    case HN_MSG_HELLO_ACK: return str_ok(m->u.hello_ack.device, HN_MAX_NAME, "device", w);
    case HN_MSG_ERROR:     return str_ok(m->u.error.message, HN_MAX_MESSAGE, "message", w);
    case HN_MSG_PROFILE_REQ: return true;
    case HN_MSG_PROFILE:   return kv_ok(m->u.profile.n_kv, m->u.profile.kv, "kv", w);
    case HN_MSG_LOAD_PLAN: {
        const hn_load_plan *p = &m->u.load_plan;
        if (p->device_index >= p->n_devices)
            return bad(w, "device_index", "%u is not below n_devices %u", p->device_index, p->n_devices);
        if (!str_ok(p->arch, HN_MAX_NAME, "arch", w) || !kv_ok(p->n_params, p->params, "params", w) ||
            !array_ok(p->units, p->n_units, "units", w))
            return false;
        for (uint32_t i = 0; i < p->n_units; i++) {
            const hn_unit *u = &p->units[i];
            if (u->kind == 0 || u->kind >= HN_UNIT_COUNT)
                return bad(w, "units", "unit %u has unknown kind %u", i, u->kind);
            if (u->begin > u->end)
                return bad(w, "units", "unit %u has range %u..%u", i, u->begin, u->end);
        }
        return true;
    }
    case HN_MSG_SLICE_HAVE: return array_ok(m->u.slice_have.hashes, m->u.slice_have.n_hashes, "hashes", w);
    case HN_MSG_SLICE_BEGIN: {
        const hn_slice_begin *s = &m->u.slice_begin;
        if (s->n_dims > HN_MAX_DIMS) return bad(w, "n_dims", "%u exceeds %u", s->n_dims, HN_MAX_DIMS);
        return str_ok(s->name, HN_MAX_SLICE_NAME, "name", w);
    }
    case HN_MSG_SLICE_CHUNK: {
        const hn_slice_chunk *c = &m->u.slice_chunk;
        if (c->n > HN_MAX_CHUNK) return bad(w, "data", "%u bytes exceed the chunk limit of %u", c->n, HN_MAX_CHUNK);
        if (c->n && !c->data) return bad(w, "data", "NULL with %u bytes", c->n);
        if (c->offset > UINT64_MAX - c->n) return bad(w, "offset", "offset + length overflows");
        return true;
    }
    case HN_MSG_SLICE_END: case HN_MSG_READY: case HN_MSG_RESET: case HN_MSG_KV_COPY: return true;
    case HN_MSG_PROBE: {
        const hn_probe *p = &m->u.probe;
        if (p->reply_bytes > HN_MAX_PROBE) return bad(w, "reply_bytes", "%u exceed %u", p->reply_bytes, HN_MAX_PROBE);
        if (p->n > HN_MAX_PROBE) return bad(w, "data", "%u bytes exceed %u", p->n, HN_MAX_PROBE);
        if (p->n && !p->data) return bad(w, "data", "NULL with %u bytes", p->n);
        return true;
    }
    case HN_MSG_LINK_PROBE: {
        const hn_link_probe *l = &m->u.link_probe;
        if (l->n_pings < 1 || l->n_pings > HN_MAX_PINGS) return bad(w, "n_pings", "%u is not in 1..%u", l->n_pings, HN_MAX_PINGS);
        if (l->probe_bytes > HN_MAX_PROBE) return bad(w, "probe_bytes", "%u exceed %u", l->probe_bytes, HN_MAX_PROBE);
        if (l->addr.n == 0) return bad(w, "addr", "empty");
        return str_ok(l->addr, HN_MAX_NAME, "addr", w);
    }
    case HN_MSG_LOSS_PROBE: {
        const hn_loss_probe *l = &m->u.loss_probe;
        if (l->port < 1 || l->port > 65535) return bad(w, "port", "%u is not a port", l->port);
        if (l->count < 1 || l->count > HN_MAX_LOSS_PROBE) return bad(w, "count", "%u is not in 1..%u", l->count, HN_MAX_LOSS_PROBE);
        if ((uint64_t)l->count * l->interval_us > HN_MAX_LOSS_PROBE_US)
            return bad(w, "interval_us", "%u datagrams every %u us take longer than %u us", l->count, l->interval_us,
                       HN_MAX_LOSS_PROBE_US);
        if (l->elems < 1 || l->elems > HN_DGRAM_MAX_ELEMS_SEALED)
            return bad(w, "elems", "%u is not in 1..%u", l->elems, (unsigned)HN_DGRAM_MAX_ELEMS_SEALED);
        if (l->wait_ms > HN_MAX_LOSS_WAIT_MS) return bad(w, "wait_ms", "%u exceeds %u", l->wait_ms, HN_MAX_LOSS_WAIT_MS);
        if (l->drop_ppm > 1000000) return bad(w, "drop_ppm", "%u exceeds 1000000", l->drop_ppm);
        return true;
    }
    case HN_MSG_FORWARD: {
        const hn_forward *f = &m->u.forward;
        if (f->layer_begin > f->layer_end)
            return bad(w, "layer_begin", "layer range %u..%u", f->layer_begin, f->layer_end);
        if (!stage_ok(f->stage, w)) return false;
        return array_ok(f->pos, f->n_tokens, "pos", w) && array_ok(f->seq, f->seq ? f->n_tokens : 0, "seq", w) &&
               array_ok(f->data, (uint64_t)f->n_tokens * f->n_embd, "data", w);
    }
    case HN_MSG_PARTIAL: {
        const hn_partial *p = &m->u.partial;
        if (!stage_ok(p->stage, w)) return false;
        uint64_t total = (uint64_t)p->n_tokens * p->n_embd;
        if ((uint64_t)p->offset + p->n > total)
            return bad(w, "data", "elements %u..%llu lie outside n_tokens x n_embd = %llu", p->offset,
                       (unsigned long long)p->offset + p->n, (unsigned long long)total);
        return array_ok(p->data, p->n, "data", w);
    }
    case HN_MSG_RESULT: {
        const hn_result *r = &m->u.result;
        return array_ok(r->data, (uint64_t)r->n_tokens * r->n_embd, "data", w);
    }
    case HN_MSG_BYE: return str_ok(m->u.bye.reason, HN_MAX_MESSAGE, "reason", w);
    default: return bad(w, "type", "unknown message type %d", m->type);
    }
}

/* ---- encoder ---- */
static void put_hstr(hn_buf *b, hn_str s) { hn_buf_put_str(b, s.s, s.n); }

static void put_kv(hn_buf *b, uint32_t n, const hn_kv *kv) {
    hn_buf_put_u32(b, n);
    for (uint32_t i = 0; i < n; i++) { put_hstr(b, kv[i].key); put_hstr(b, kv[i].value); }
}

int hn_msg_encode(const hn_msg *m, hn_buf *b, hn_iov *tail, hr_err *err) {
    hn_buf_reset(b);
    tail->p = NULL;
    tail->n = 0;
    why w = { 0 };
    if (!type_known(m->type)) return hr_fail(err, HR_EINVAL, "hn_msg_encode: unknown message type %d", m->type);
    if (!msg_ok(m, &w)) return hr_fail(err, HR_EINVAL, "%s.%s: %s", hn_msg_name(m->type), w.field, w.reason);

    switch (m->type) {
    case HN_MSG_HELLO: {
        const hn_hello *h = &m->u.hello;
        hn_buf_put_u32(b, h->version_min);
        hn_buf_put_u32(b, h->version_max);
        hn_buf_put_u64(b, h->caps);
        hn_buf_put_raw(b, h->auth_tag, HN_AUTH_TAG_SIZE);
        put_hstr(b, h->device);
        break;
    }
    case HN_MSG_HELLO_ACK: {
        const hn_hello_ack *h = &m->u.hello_ack;
        hn_buf_put_u32(b, h->version);
        hn_buf_put_u64(b, h->caps);
        hn_buf_put_raw(b, h->auth_tag, HN_AUTH_TAG_SIZE);
        put_hstr(b, h->device);
        break;
    }
    case HN_MSG_ERROR:
        hn_buf_put_i32(b, m->u.error.code);
        put_hstr(b, m->u.error.message);
        break;
    case HN_MSG_PROFILE_REQ:
        hn_buf_put_u32(b, m->u.profile_req.flags);
        hn_buf_put_u32(b, m->u.profile_req.bench_ms);
        break;
    case HN_MSG_PROFILE:
        put_kv(b, m->u.profile.n_kv, m->u.profile.kv);
        break;
    case HN_MSG_LOAD_PLAN: {
        const hn_load_plan *p = &m->u.load_plan;
        hn_buf_put_u64(b, p->model_hash);
        hn_buf_put_u32(b, p->device_index);
        hn_buf_put_u32(b, p->n_devices);
        put_hstr(b, p->arch);
        put_kv(b, p->n_params, p->params);
        hn_buf_put_array_head(b, p->n_units, sizeof(hn_unit));
        hn_buf_put_raw(b, p->units, (size_t)p->n_units * sizeof(hn_unit));
        break;
    }
    case HN_MSG_SLICE_HAVE:
        hn_buf_put_u64(b, m->u.slice_have.model_hash);
        hn_buf_put_u64s(b, m->u.slice_have.hashes, m->u.slice_have.n_hashes);
        break;
    case HN_MSG_SLICE_BEGIN: {
        const hn_slice_begin *s = &m->u.slice_begin;
        hn_buf_put_u64(b, s->hash);
        hn_buf_put_u64(b, s->size);
        hn_buf_put_u32(b, s->dtype);
        hn_buf_put_u32(b, s->n_dims);
        for (int i = 0; i < HN_MAX_DIMS; i++) hn_buf_put_u64(b, s->ne[i]);
        put_hstr(b, s->name);
        break;
    }
    case HN_MSG_SLICE_CHUNK: {
        const hn_slice_chunk *c = &m->u.slice_chunk;
        hn_buf_put_u64(b, c->hash);
        hn_buf_put_u64(b, c->offset);
        hn_buf_put_u32(b, c->n);
        tail->p = c->data;
        tail->n = c->n;
        break;
    }
    case HN_MSG_SLICE_END:
        hn_buf_put_u64(b, m->u.slice_end.hash);
        hn_buf_put_u64(b, m->u.slice_end.size);
        break;
    case HN_MSG_READY:
        hn_buf_put_u64(b, m->u.ready.model_hash);
        hn_buf_put_u64(b, m->u.ready.weight_bytes);
        hn_buf_put_u32(b, m->u.ready.n_slices);
        break;
    case HN_MSG_FORWARD: {
        const hn_forward *f = &m->u.forward;
        hn_buf_put_u32(b, f->layer_begin);
        hn_buf_put_u32(b, f->layer_end);
        hn_buf_put_u32(b, f->stage);
        hn_buf_put_u32(b, f->n_tokens);
        hn_buf_put_u32(b, f->n_embd);
        hn_buf_put_i32s(b, f->pos, f->n_tokens);
        hn_buf_put_i32s(b, f->seq, f->seq ? f->n_tokens : 0);
        uint32_t n = f->n_tokens * f->n_embd; /* fits: checked by msg_ok */
        hn_buf_put_array_head(b, n, 4);
        tail->p = f->data;
        tail->n = (size_t)n * 4;
        break;
    }
    case HN_MSG_PARTIAL: {
        const hn_partial *p = &m->u.partial;
        hn_buf_put_u32(b, p->layer);
        hn_buf_put_u32(b, p->stage);
        hn_buf_put_u32(b, p->n_tokens);
        hn_buf_put_u32(b, p->n_embd);
        hn_buf_put_u32(b, p->offset);
        hn_buf_put_u64(b, p->compute_ns);
        hn_buf_put_array_head(b, p->n, 4);
        tail->p = p->data;
        tail->n = (size_t)p->n * 4;
        break;
    }
    case HN_MSG_RESULT: {
        const hn_result *r = &m->u.result;
        hn_buf_put_u32(b, r->layer_end);
        hn_buf_put_u32(b, r->n_tokens);
        hn_buf_put_u32(b, r->n_embd);
        hn_buf_put_u64(b, r->compute_ns);
        uint32_t n = r->n_tokens * r->n_embd;
        hn_buf_put_array_head(b, n, 4);
        tail->p = r->data;
        tail->n = (size_t)n * 4;
        break;
    }
    case HN_MSG_KV_COPY:
        hn_buf_put_u32(b, m->u.kv_copy.src);
        hn_buf_put_u32(b, m->u.kv_copy.dst);
        hn_buf_put_u32(b, m->u.kv_copy.n);
        break;
    case HN_MSG_RESET:
        hn_buf_put_u32(b, m->u.reset.pos_begin);
        break;
    case HN_MSG_BYE:
        hn_buf_put_i32(b, m->u.bye.code);
        put_hstr(b, m->u.bye.reason);
        break;
    case HN_MSG_PROBE:
        hn_buf_put_u32(b, m->u.probe.reply_bytes);
        hn_buf_put_u32(b, m->u.probe.n);
        tail->p = m->u.probe.data;
        tail->n = m->u.probe.n;
        break;
    case HN_MSG_LINK_PROBE:
        put_hstr(b, m->u.link_probe.addr);
        hn_buf_put_u32(b, m->u.link_probe.n_pings);
        hn_buf_put_u32(b, m->u.link_probe.probe_bytes);
        break;
    case HN_MSG_LOSS_PROBE: {
        const hn_loss_probe *l = &m->u.loss_probe;
        hn_buf_put_u64(b, l->session);
        hn_buf_put_u64(b, l->drop_seed);
        hn_buf_put_u32(b, l->port);
        hn_buf_put_u32(b, l->count);
        hn_buf_put_u32(b, l->interval_us);
        hn_buf_put_u32(b, l->elems);
        hn_buf_put_u32(b, l->wait_ms);
        hn_buf_put_u32(b, l->drop_ppm);
        break;
    }
    }
    if (b->oom) return hr_fail(err, HR_ENOMEM, "%s: out of memory encoding the payload", hn_msg_name(m->type));
    uint32_t max = msg_table[m->type].max_payload;
    if (b->len + tail->n > max)
        return hr_fail(err, HR_EINVAL, "%s: payload of %zu bytes exceeds its limit of %u",
                       hn_msg_name(m->type), b->len + tail->n, max);
    return HR_OK;
}

int hn_msg_encode_full(const hn_msg *m, hn_buf *out, hr_err *err) {
    hn_iov tail;
    int rc = hn_msg_encode(m, out, &tail, err);
    if (rc) return rc;
    hn_buf_put_raw(out, tail.p, tail.n);
    if (out->oom) return hr_fail(err, HR_ENOMEM, "%s: out of memory encoding the payload", hn_msg_name(m->type));
    return HR_OK;
}

/* ---- decoder ---- */
static void rd_kv(hn_rd *r, uint32_t *n, hn_kv *kv, const char *field) {
    *n = 0;
    uint32_t count = hn_rd_u32(r, field);
    if (r->failed) return;
    if (count > HN_MAX_KV) { hn_rd_reject(r, field, "count %u exceeds its limit of %u", count, HN_MAX_KV); return; }
    for (uint32_t i = 0; i < count && !r->failed; i++) {
        kv[i].key = hn_rd_str(r, HN_MAX_KEY, field);
        kv[i].value = hn_rd_str(r, HN_MAX_VALUE, field);
    }
    if (!r->failed) *n = count;
}

int hn_msg_decode(int type, uint32_t seq, const void *payload, size_t len, hn_msg *m, hr_err *err) {
    memset(m, 0, sizeof *m);
    m->type = type;
    m->seq = seq;
    if (!type_known(type)) return hr_fail(err, HR_EPROTO, "unknown message type %d", type);
    if (len > msg_table[type].max_payload)
        return hr_fail(err, HR_EPROTO, "%s: payload of %zu bytes exceeds its limit of %u", hn_msg_name(type),
                       len, msg_table[type].max_payload);
    hn_rd rd, *r = &rd;
    hn_rd_init(r, type, payload, len);
    uint32_t n;

    switch (type) {
    case HN_MSG_HELLO: {
        hn_hello *h = &m->u.hello;
        h->version_min = hn_rd_u32(r, "version_min");
        h->version_max = hn_rd_u32(r, "version_max");
        h->caps = hn_rd_u64(r, "caps");
        hn_rd_raw(r, h->auth_tag, HN_AUTH_TAG_SIZE, "auth_tag");
        h->device = hn_rd_str(r, HN_MAX_NAME, "device");
        break;
    }
    case HN_MSG_HELLO_ACK: {
        hn_hello_ack *h = &m->u.hello_ack;
        h->version = hn_rd_u32(r, "version");
        h->caps = hn_rd_u64(r, "caps");
        hn_rd_raw(r, h->auth_tag, HN_AUTH_TAG_SIZE, "auth_tag");
        h->device = hn_rd_str(r, HN_MAX_NAME, "device");
        break;
    }
    case HN_MSG_ERROR:
        m->u.error.code = hn_rd_i32(r, "code");
        m->u.error.message = hn_rd_str(r, HN_MAX_MESSAGE, "message");
        break;
    case HN_MSG_PROFILE_REQ:
        m->u.profile_req.flags = hn_rd_u32(r, "flags");
        m->u.profile_req.bench_ms = hn_rd_u32(r, "bench_ms");
        break;
    case HN_MSG_PROFILE:
        rd_kv(r, &m->u.profile.n_kv, m->u.profile.kv, "kv");
        break;
    case HN_MSG_LOAD_PLAN: {
        hn_load_plan *p = &m->u.load_plan;
        p->model_hash = hn_rd_u64(r, "model_hash");
        p->device_index = hn_rd_u32(r, "device_index");
        p->n_devices = hn_rd_u32(r, "n_devices");
        p->arch = hn_rd_str(r, HN_MAX_NAME, "arch");
        rd_kv(r, &p->n_params, p->params, "params");
        p->units = hn_rd_array(r, &p->n_units, sizeof(hn_unit), "units");
        break;
    }
    case HN_MSG_SLICE_HAVE:
        m->u.slice_have.model_hash = hn_rd_u64(r, "model_hash");
        m->u.slice_have.hashes = hn_rd_array(r, &m->u.slice_have.n_hashes, 8, "hashes");
        break;
    case HN_MSG_SLICE_BEGIN: {
        hn_slice_begin *s = &m->u.slice_begin;
        s->hash = hn_rd_u64(r, "hash");
        s->size = hn_rd_u64(r, "size");
        s->dtype = hn_rd_u32(r, "dtype");
        s->n_dims = hn_rd_u32(r, "n_dims");
        for (int i = 0; i < HN_MAX_DIMS; i++) s->ne[i] = hn_rd_u64(r, "ne");
        s->name = hn_rd_str(r, HN_MAX_SLICE_NAME, "name");
        break;
    }
    case HN_MSG_SLICE_CHUNK: {
        hn_slice_chunk *c = &m->u.slice_chunk;
        c->hash = hn_rd_u64(r, "hash");
        c->offset = hn_rd_u64(r, "offset");
        c->data = hn_rd_blob(r, &c->n, HN_MAX_CHUNK, "data");
        break;
    }
    case HN_MSG_SLICE_END:
        m->u.slice_end.hash = hn_rd_u64(r, "hash");
        m->u.slice_end.size = hn_rd_u64(r, "size");
        break;
    case HN_MSG_READY:
        m->u.ready.model_hash = hn_rd_u64(r, "model_hash");
        m->u.ready.weight_bytes = hn_rd_u64(r, "weight_bytes");
        m->u.ready.n_slices = hn_rd_u32(r, "n_slices");
        break;
    case HN_MSG_FORWARD: {
        hn_forward *f = &m->u.forward;
        f->layer_begin = hn_rd_u32(r, "layer_begin");
        f->layer_end = hn_rd_u32(r, "layer_end");
        f->stage = hn_rd_u32(r, "stage");
        f->n_tokens = hn_rd_u32(r, "n_tokens");
        f->n_embd = hn_rd_u32(r, "n_embd");
        f->pos = hn_rd_array(r, &n, 4, "pos");
        if (!r->failed && n != f->n_tokens)
            hn_rd_reject(r, "pos", "count %u, but n_tokens is %u", n, f->n_tokens);
        f->seq = hn_rd_array(r, &n, 4, "seq");
        if (!r->failed && n != 0 && n != f->n_tokens)
            hn_rd_reject(r, "seq", "count %u, but n_tokens is %u (or 0)", n, f->n_tokens);
        if (n == 0) f->seq = NULL;
        f->data = hn_rd_array(r, &n, 4, "data");
        if (!r->failed && (uint64_t)n != (uint64_t)f->n_tokens * f->n_embd)
            hn_rd_reject(r, "data", "count %u, but n_tokens x n_embd is %llu", n,
                         (unsigned long long)f->n_tokens * f->n_embd);
        break;
    }
    case HN_MSG_PARTIAL: {
        hn_partial *p = &m->u.partial;
        p->layer = hn_rd_u32(r, "layer");
        p->stage = hn_rd_u32(r, "stage");
        p->n_tokens = hn_rd_u32(r, "n_tokens");
        p->n_embd = hn_rd_u32(r, "n_embd");
        p->offset = hn_rd_u32(r, "offset");
        p->compute_ns = hn_rd_u64(r, "compute_ns");
        p->data = hn_rd_array(r, &p->n, 4, "data");
        break;
    }
    case HN_MSG_RESULT: {
        hn_result *res = &m->u.result;
        res->layer_end = hn_rd_u32(r, "layer_end");
        res->n_tokens = hn_rd_u32(r, "n_tokens");
        res->n_embd = hn_rd_u32(r, "n_embd");
        res->compute_ns = hn_rd_u64(r, "compute_ns");
        res->data = hn_rd_array(r, &n, 4, "data");
        if (!r->failed && (uint64_t)n != (uint64_t)res->n_tokens * res->n_embd)
            hn_rd_reject(r, "data", "count %u, but n_tokens x n_embd is %llu", n,
                         (unsigned long long)res->n_tokens * res->n_embd);
        break;
    }
    case HN_MSG_KV_COPY:
        m->u.kv_copy.src = hn_rd_u32(r, "src");
        m->u.kv_copy.dst = hn_rd_u32(r, "dst");
        m->u.kv_copy.n = hn_rd_u32(r, "n");
        break;
    case HN_MSG_RESET:
        m->u.reset.pos_begin = hn_rd_u32(r, "pos_begin");
        break;
    case HN_MSG_BYE:
        m->u.bye.code = hn_rd_i32(r, "code");
        m->u.bye.reason = hn_rd_str(r, HN_MAX_MESSAGE, "reason");
        break;
    case HN_MSG_PROBE:
        m->u.probe.reply_bytes = hn_rd_u32(r, "reply_bytes");
        m->u.probe.data = hn_rd_blob(r, &m->u.probe.n, HN_MAX_PROBE, "data");
        break;
    case HN_MSG_LINK_PROBE:
        m->u.link_probe.addr = hn_rd_str(r, HN_MAX_NAME, "addr");
        m->u.link_probe.n_pings = hn_rd_u32(r, "n_pings");
        m->u.link_probe.probe_bytes = hn_rd_u32(r, "probe_bytes");
        break;
    case HN_MSG_LOSS_PROBE: {
        hn_loss_probe *l = &m->u.loss_probe;
        l->session = hn_rd_u64(r, "session");
        l->drop_seed = hn_rd_u64(r, "drop_seed");
        l->port = hn_rd_u32(r, "port");
        l->count = hn_rd_u32(r, "count");
        l->interval_us = hn_rd_u32(r, "interval_us");
        l->elems = hn_rd_u32(r, "elems");
        l->wait_ms = hn_rd_u32(r, "wait_ms");
        l->drop_ppm = hn_rd_u32(r, "drop_ppm");
        break;
    }
    }
    why w = { 0 };
    if (!r->failed && !msg_ok(m, &w)) hn_rd_reject(r, w.field, "%s", w.reason);
    int rc = hn_rd_finish(r, err);
    if (rc) {
        /* no partial garbage: a failed decode leaves only type and seq */
        memset(&m->u, 0, sizeof m->u);
    }
    return rc;
}
