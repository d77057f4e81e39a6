// modules: base net
/* test-net — the wire protocol (round trip of every message type, a seeded randomized decoder test)
   and the TCP transport on loopback (big frames both ways, deadlines, peer close, hostile headers).
   Binds 127.0.0.1 port 0 only; every thread is joined and every socket closed. */
#include "net/net.h"
#include "test.h"

#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- deterministic randomness ---- */
static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint64_t rnd(void) {
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return rng * 0x2545f4914f6cdd1dULL;
}
static uint32_t rnd_below(uint32_t n) { return (uint32_t)(rnd() % n); }

/* ---- sample messages ---- */
static const hn_unit sample_units[3] = {
    { 0, HN_UNIT_ATTN_HEADS, 0, 4 }, { 0, HN_UNIT_FFN_ROWS, 32, 96 }, { 5, HN_UNIT_LAYER, 0, 1 } };
static const uint64_t sample_hashes[4] = { 1, 0xfeedface12345678ULL, 42, UINT64_MAX };
static const int32_t sample_pos[3] = { 7, 8, -1 };
static const int32_t sample_seq[3] = { 2, 0, 2 };
static float sample_f32[15];
static uint8_t sample_chunk[37];

/* variant 0: every field set; variant 1: empty strings and arrays, zero counts */
static void make_sample(int type, int variant, hn_msg *m) {
    memset(m, 0, sizeof *m);
    m->type = type;
    m->seq = 1000u + (uint32_t)type;
    bool full = variant == 0;
    switch (type) {
    case HN_MSG_HELLO:
        m->u.hello.version_min = 1;
        m->u.hello.version_max = full ? 3 : 1;
        m->u.hello.caps = HN_CAP_F32_ACT | HN_CAP_SLICE_CACHE | (1ull << 63);
        for (int i = 0; i < HN_AUTH_TAG_SIZE; i++) m->u.hello.auth_tag[i] = (uint8_t)(i * 7 + 1);
        m->u.hello.device = hn_cstr(full ? "head (ryzen 7)" : "");
        break;
    case HN_MSG_HELLO_ACK:
        m->u.hello_ack.version = 1;
        m->u.hello_ack.caps = HN_CAP_F32_ACT;
        m->u.hello_ack.auth_tag[31] = 0xab;
        m->u.hello_ack.device = hn_cstr(full ? "raspberry pi 5" : "");
        break;
    case HN_MSG_ERROR:
        m->u.error.code = HR_EPROTO;
        m->u.error.message = hn_cstr(full ? "unexpected FORWARD before LOAD_PLAN" : "");
        break;
    case HN_MSG_PROFILE_REQ:
        m->u.profile_req.flags = HN_PROFILE_BENCH;
        m->u.profile_req.bench_ms = 250;
        break;
    case HN_MSG_PROFILE:
        if (full) {
            m->u.profile.n_kv = 3;
            m->u.profile.kv[0] = (hn_kv){ hn_cstr("threads"), hn_cstr("8") };
            m->u.profile.kv[1] = (hn_kv){ hn_cstr("mem_bytes"), hn_cstr("17179869184") };
            m->u.profile.kv[2] = (hn_kv){ hn_cstr("matvec_gflops"), hn_cstr("") };
        }
        break;
    case HN_MSG_LOAD_PLAN: {
        hn_load_plan *p = &m->u.load_plan;
        p->model_hash = 0x0123456789abcdefULL;
        p->device_index = full ? 2 : 0;
        p->n_devices = 3;
        if (full) {
            p->arch = hn_cstr("llama");
            p->n_params = 2;
            p->params[0] = (hn_kv){ hn_cstr("n_embd"), hn_cstr("288") };
            p->params[1] = (hn_kv){ hn_cstr("rms_eps"), hn_cstr("1e-05") };
            p->n_units = 3;
            p->units = sample_units;
        }
        break;
    }
    case HN_MSG_SLICE_HAVE:
        m->u.slice_have.model_hash = 77;
        if (full) { m->u.slice_have.n_hashes = 4; m->u.slice_have.hashes = sample_hashes; }
        break;
    case HN_MSG_SLICE_BEGIN: {
        hn_slice_begin *s = &m->u.slice_begin;
        s->hash = 0xdeadbeefULL;
        s->size = 5000000000ULL;
        s->dtype = 2;
        s->n_dims = full ? 2 : 0;
        s->ne[0] = 288; s->ne[1] = full ? 64 : 0;
        s->name = hn_cstr(full ? "blk.3.ffn_up.weight[32:96]" : "");
        break;
    }
    case HN_MSG_SLICE_CHUNK:
        m->u.slice_chunk.hash = 0xdeadbeefULL;
        m->u.slice_chunk.offset = 1ull << 33;
        if (full) { m->u.slice_chunk.n = sizeof sample_chunk; m->u.slice_chunk.data = sample_chunk; }
        break;
    case HN_MSG_SLICE_END:
        m->u.slice_end.hash = 0xdeadbeefULL;
        m->u.slice_end.size = 5000000000ULL;
        break;
    case HN_MSG_READY:
        m->u.ready.model_hash = 0x0123456789abcdefULL;
        m->u.ready.weight_bytes = 123456789;
        m->u.ready.n_slices = 17;
        break;
    case HN_MSG_FORWARD: {
        hn_forward *f = &m->u.forward;
        f->layer_begin = 2; f->layer_end = 3; f->stage = HN_STAGE_FFN;
        f->n_tokens = full ? 3 : 0; f->n_embd = 5;
        if (full) { f->pos = sample_pos; f->seq = sample_seq; f->data = sample_f32; }
        break;
    }
    case HN_MSG_PARTIAL: {
        hn_partial *p = &m->u.partial;
        p->layer = 4; p->stage = HN_STAGE_ATTN; p->n_tokens = 3; p->n_embd = 5;
        p->offset = full ? 5 : 15;
        p->n = full ? 10 : 0;
        p->compute_ns = 987654321;
        p->data = full ? sample_f32 : NULL;
        break;
    }
    case HN_MSG_RESULT: {
        hn_result *r = &m->u.result;
        r->layer_end = 12; r->n_tokens = full ? 3 : 0; r->n_embd = 5; r->compute_ns = 5;
        r->data = full ? sample_f32 : NULL;
        break;
    }
    case HN_MSG_RESET: m->u.reset.pos_begin = full ? 42 : 0; break;
    case HN_MSG_KV_COPY: m->u.kv_copy = (hn_kv_copy){full ? 3 : 0, full ? 1 : 0, full ? 77 : 0}; break;
    case HN_MSG_BYE:
        m->u.bye.code = 0;
        m->u.bye.reason = hn_cstr(full ? "head shutting down" : "");
        break;
    case HN_MSG_PROBE:
        m->u.probe.reply_bytes = full ? 4096 : 0;
        m->u.probe.n = full ? 5 : 0;
        m->u.probe.data = full ? (const uint8_t *)"probe" : NULL;
        break;
    case HN_MSG_LOSS_PROBE:
        m->u.loss_probe = (hn_loss_probe){.session = full ? 0x1122334455667788ULL : 1, .drop_seed = full ? 7 : 0,
                                          .port = full ? 50123 : 1, .count = full ? 400 : 1,
                                          .interval_us = full ? 250 : 0, .elems = full ? 64 : 1,
                                          .wait_ms = full ? 30 : 0, .drop_ppm = full ? 50000 : 0};
        break;
    case HN_MSG_LINK_PROBE:
        m->u.link_probe.addr = hn_cstr(full ? "10.77.0.3:7070" : "w");
        m->u.link_probe.n_pings = full ? 9 : 1;
        m->u.link_probe.probe_bytes = full ? 4u << 20 : 0;
        break;
    }
}

static bool str_same(hn_str a, hn_str b) { return a.n == b.n && (a.n == 0 || memcmp(a.s, b.s, a.n) == 0); }
static bool mem_same(const void *a, const void *b, size_t n) { return n == 0 || memcmp(a, b, n) == 0; }
static bool kv_same(uint32_t na, const hn_kv *a, uint32_t nb, const hn_kv *b) {
    if (na != nb) return false;
    for (uint32_t i = 0; i < na; i++)
        if (!str_same(a[i].key, b[i].key) || !str_same(a[i].value, b[i].value)) return false;
    return true;
}

/* field-by-field equality (the decoded side borrows from the payload) */
static bool msg_same(const hn_msg *a, const hn_msg *b) {
    if (a->type != b->type || a->seq != b->seq) return false;
    switch (a->type) {
    case HN_MSG_HELLO: {
        const hn_hello *x = &a->u.hello, *y = &b->u.hello;
        return x->version_min == y->version_min && x->version_max == y->version_max && x->caps == y->caps &&
               !memcmp(x->auth_tag, y->auth_tag, HN_AUTH_TAG_SIZE) && str_same(x->device, y->device);
    }
    case HN_MSG_HELLO_ACK: {
        const hn_hello_ack *x = &a->u.hello_ack, *y = &b->u.hello_ack;
        return x->version == y->version && x->caps == y->caps && !memcmp(x->auth_tag, y->auth_tag, HN_AUTH_TAG_SIZE) &&
               str_same(x->device, y->device);
    }
    case HN_MSG_ERROR: return a->u.error.code == b->u.error.code && str_same(a->u.error.message, b->u.error.message);
    case HN_MSG_PROFILE_REQ:
        return a->u.profile_req.flags == b->u.profile_req.flags && a->u.profile_req.bench_ms == b->u.profile_req.bench_ms;
    case HN_MSG_PROFILE: return kv_same(a->u.profile.n_kv, a->u.profile.kv, b->u.profile.n_kv, b->u.profile.kv);
    case HN_MSG_LOAD_PLAN: {
        const hn_load_plan *x = &a->u.load_plan, *y = &b->u.load_plan;
        return x->model_hash == y->model_hash && x->device_index == y->device_index && x->n_devices == y->n_devices &&
               str_same(x->arch, y->arch) && kv_same(x->n_params, x->params, y->n_params, y->params) &&
               x->n_units == y->n_units && mem_same(x->units, y->units, x->n_units * sizeof(hn_unit));
    }
    case HN_MSG_SLICE_HAVE:
        return a->u.slice_have.model_hash == b->u.slice_have.model_hash && a->u.slice_have.n_hashes == b->u.slice_have.n_hashes &&
               mem_same(a->u.slice_have.hashes, b->u.slice_have.hashes, a->u.slice_have.n_hashes * 8);
    case HN_MSG_SLICE_BEGIN: {
        const hn_slice_begin *x = &a->u.slice_begin, *y = &b->u.slice_begin;
        return x->hash == y->hash && x->size == y->size && x->dtype == y->dtype && x->n_dims == y->n_dims &&
               !memcmp(x->ne, y->ne, sizeof x->ne) && str_same(x->name, y->name);
    }
    case HN_MSG_SLICE_CHUNK:
        return a->u.slice_chunk.hash == b->u.slice_chunk.hash && a->u.slice_chunk.offset == b->u.slice_chunk.offset &&
               a->u.slice_chunk.n == b->u.slice_chunk.n && mem_same(a->u.slice_chunk.data, b->u.slice_chunk.data, a->u.slice_chunk.n);
    case HN_MSG_SLICE_END: return a->u.slice_end.hash == b->u.slice_end.hash && a->u.slice_end.size == b->u.slice_end.size;
    case HN_MSG_READY:
        return a->u.ready.model_hash == b->u.ready.model_hash && a->u.ready.weight_bytes == b->u.ready.weight_bytes &&
               a->u.ready.n_slices == b->u.ready.n_slices;
    case HN_MSG_FORWARD: {
        const hn_forward *x = &a->u.forward, *y = &b->u.forward;
        return x->layer_begin == y->layer_begin && x->layer_end == y->layer_end && x->stage == y->stage &&
               x->n_tokens == y->n_tokens && x->n_embd == y->n_embd && mem_same(x->pos, y->pos, x->n_tokens * 4) &&
               (x->seq == NULL) == (y->seq == NULL) && (!x->seq || mem_same(x->seq, y->seq, x->n_tokens * 4)) &&
               mem_same(x->data, y->data, (size_t)x->n_tokens * x->n_embd * 4);
    }
    case HN_MSG_PARTIAL: {
        const hn_partial *x = &a->u.partial, *y = &b->u.partial;
        return x->layer == y->layer && x->stage == y->stage && x->n_tokens == y->n_tokens && x->n_embd == y->n_embd &&
               x->offset == y->offset && x->n == y->n && x->compute_ns == y->compute_ns && mem_same(x->data, y->data, x->n * 4);
    }
    case HN_MSG_RESULT: {
        const hn_result *x = &a->u.result, *y = &b->u.result;
        return x->layer_end == y->layer_end && x->n_tokens == y->n_tokens && x->n_embd == y->n_embd &&
               x->compute_ns == y->compute_ns && mem_same(x->data, y->data, (size_t)x->n_tokens * x->n_embd * 4);
    }
    case HN_MSG_RESET: return a->u.reset.pos_begin == b->u.reset.pos_begin;
    case HN_MSG_KV_COPY:
        return a->u.kv_copy.src == b->u.kv_copy.src && a->u.kv_copy.dst == b->u.kv_copy.dst && a->u.kv_copy.n == b->u.kv_copy.n;
    case HN_MSG_BYE: return a->u.bye.code == b->u.bye.code && str_same(a->u.bye.reason, b->u.bye.reason);
    case HN_MSG_PROBE:
        return a->u.probe.reply_bytes == b->u.probe.reply_bytes && a->u.probe.n == b->u.probe.n &&
               mem_same(a->u.probe.data, b->u.probe.data, a->u.probe.n);
    case HN_MSG_LOSS_PROBE:
        return !memcmp(&a->u.loss_probe, &b->u.loss_probe, sizeof a->u.loss_probe);
    case HN_MSG_LINK_PROBE:
        return str_same(a->u.link_probe.addr, b->u.link_probe.addr) && a->u.link_probe.n_pings == b->u.link_probe.n_pings &&
               a->u.link_probe.probe_bytes == b->u.link_probe.probe_bytes;
    }
    return false;
}

/* decodes from an exact-size heap copy, so ASan sees any read past the end */
static int decode_copy(int type, const uint8_t *p, size_t n, hn_msg *m, uint8_t **copy, hr_err *err) {
    *copy = n ? malloc(n) : NULL;
    if (n) memcpy(*copy, p, n);
    return hn_msg_decode(type, 5, *copy, n, m, err);
}

/* a payload that decodes must re-encode to the same bytes (the format is canonical) */
static bool reencodes_same(const hn_msg *m, const uint8_t *p, size_t n) {
    hn_buf b;
    hn_buf_init(&b);
    hr_err err = { 0 };
    bool ok = hn_msg_encode_full(m, &b, &err) == 0 && b.len == n && mem_same(b.data, p, n);
    if (!ok) fprintf(stderr, "re-encode of %s differs (%s)\n", hn_msg_name(m->type), err.msg);
    hn_buf_free(&b);
    return ok;
}

/* ---- protocol tests ---- */
static void test_header(void) {
    uint8_t h[HN_HEADER_SIZE];
    hn_header hd;
    hr_err err = { 0 };
    hn_header_encode(h, HN_MSG_FORWARD, 1234, 99);
    CHECK(!memcmp(h, "HRTH", 4));
    CHECK(hn_header_decode(h, &hd, &err) == 0 && hd.type == HN_MSG_FORWARD && hd.len == 1234 && hd.seq == 99 &&
          hd.version == HN_PROTO_VERSION);
    hn_header_encode(h, HN_MSG_FORWARD, hn_msg_max_payload(HN_MSG_FORWARD), 0);
    CHECK(hn_header_decode(h, &hd, &err) == 0);
    hn_header_encode(h, HN_MSG_FORWARD, hn_msg_max_payload(HN_MSG_FORWARD) + 1, 0);
    CHECK(hn_header_decode(h, &hd, &err) == HR_EPROTO && strstr(err.msg, "FORWARD") && strstr(err.msg, "limit"));
    hn_header_encode(h, HN_MSG_HELLO, 0x80000000u, 0);
    CHECK(hn_header_decode(h, &hd, &err) == HR_EPROTO && strstr(err.msg, "HELLO"));
    hn_header_encode(h, HN_MSG_HELLO, 10, 0);
    h[0] ^= 1;
    CHECK(hn_header_decode(h, &hd, &err) == HR_EPROTO && strstr(err.msg, "magic"));
    hn_header_encode(h, HN_MSG_HELLO, 10, 0);
    h[4] = HN_PROTO_VERSION + 1;
    char vmsg[32];
    snprintf(vmsg, sizeof vmsg, "version %d", HN_PROTO_VERSION + 1);
    CHECKF(hn_header_decode(h, &hd, &err) == HR_EPROTO && strstr(err.msg, vmsg), "%s", err.msg);
    int bad_types[] = { 0, HN_MSG_COUNT, 0xffff };
    for (size_t i = 0; i < HR_ARRAY_LEN(bad_types); i++) {
        hn_header_encode(h, bad_types[i], 0, 0);
        CHECK(hn_header_decode(h, &hd, &err) == HR_EPROTO && strstr(err.msg, "unknown message type"));
    }
    for (int t = 1; t < HN_MSG_COUNT; t++) CHECK(hn_msg_max_payload(t) > 0 && strcmp(hn_msg_name(t), "?") != 0);
    CHECK(hn_msg_max_payload(0) == 0 && hn_msg_max_payload(HN_MSG_COUNT) == 0);
    CHECK(hn_msg_max_payload(HN_MSG_FORWARD) == 64u << 20 && hn_msg_max_payload(HN_MSG_HELLO) == 4096);
    /* 200k random headers: never accepted with a type or length outside the table */
    int accepted = 0;
    for (int i = 0; i < 200000; i++) {
        for (int k = 0; k < HN_HEADER_SIZE; k++) h[k] = (uint8_t)rnd();
        if (i & 1) { memcpy(h, "HRTH", 4); h[4] = HN_PROTO_VERSION; h[5] = 0; h[6] = (uint8_t)rnd_below(20); h[7] = 0; }
        if (hn_header_decode(h, &hd, NULL) == 0) {
            accepted++;
            if (!(hd.type > 0 && hd.type < HN_MSG_COUNT && hd.len <= hn_msg_max_payload(hd.type))) { CHECK(0); break; }
        }
    }
    CHECK(accepted > 0);
}

/* HEARTH_NET_SEED_DIR=dir: writes every sample as a seed for tests/fuzz-net.c (type byte + payload) */
static void write_seed(int type, int variant, const hn_buf *b) {
    const char *dir = getenv("HEARTH_NET_SEED_DIR");
    if (!dir) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s-%d", dir, hn_msg_name(type), variant);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    uint8_t t = (uint8_t)type;
    fwrite(&t, 1, 1, f);
    fwrite(b->data, 1, b->len, f);
    fclose(f);
}

static void test_round_trip(void) {
    for (int i = 0; i < 15; i++) sample_f32[i] = (float)i * 0.25f - 1.0f;
    for (size_t i = 0; i < sizeof sample_chunk; i++) sample_chunk[i] = (uint8_t)(i * 31);
    for (int type = 1; type < HN_MSG_COUNT; type++) {
        for (int variant = 0; variant < 2; variant++) {
            hn_msg m, d;
            hn_buf b;
            hn_buf_init(&b);
            hr_err err = { 0 };
            make_sample(type, variant, &m);
            int rc = hn_msg_encode_full(&m, &b, &err);
            CHECKF(rc == 0, "%s: %s", hn_msg_name(type), err.msg);
            write_seed(type, variant, &b);
            uint8_t *copy;
            rc = decode_copy(type, b.data, b.len, &d, &copy, &err);
            CHECKF(rc == 0, "%s variant %d: %s", hn_msg_name(type), variant, err.msg);
            d.seq = m.seq;
            CHECKF(rc == 0 && msg_same(&m, &d), "%s variant %d differs after decode", hn_msg_name(type), variant);
            CHECK(rc == 0 && reencodes_same(&d, copy, b.len));
            /* head + tail equals the full payload; only bulk types have a tail */
            hn_buf head;
            hn_buf_init(&head);
            hn_iov tail;
            CHECK(hn_msg_encode(&m, &head, &tail, &err) == 0 && head.len + tail.n == b.len &&
                  mem_same(head.data, b.data, head.len) && mem_same(tail.p, b.data + head.len, tail.n));
            bool bulk = type == HN_MSG_FORWARD || type == HN_MSG_PARTIAL || type == HN_MSG_RESULT || type == HN_MSG_SLICE_CHUNK ||
                        type == HN_MSG_PROBE;
            if (variant == 0) CHECKF(bulk == (tail.n > 0), "%s tail %zu", hn_msg_name(type), tail.n);
            if (bulk && tail.n) CHECK(head.len % 4 == 0); /* f32 arrays start aligned */
            /* strict: every truncation and any trailing byte fail */
            int trunc_ok = 1;
            for (size_t n = 0; n < b.len; n++) {
                uint8_t *c2;
                if (decode_copy(type, b.data, n, &d, &c2, &err) == 0) trunc_ok = 0;
                free(c2);
            }
            CHECKF(trunc_ok, "%s: a truncated payload decoded", hn_msg_name(type));
            hn_buf_put_u8(&b, 0);
            uint8_t *c3;
            CHECK(decode_copy(type, b.data, b.len, &d, &c3, &err) == HR_EFORMAT && strstr(err.msg, "after the last field"));
            free(c3);
            free(copy);
            hn_buf_free(&b);
            hn_buf_free(&head);
        }
    }
}

static void test_encoder_checks(void) {
    hn_msg m;
    hn_buf b;
    hn_buf_init(&b);
    hr_err err = { 0 };
    char longname[HN_MAX_NAME + 2];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;

    make_sample(HN_MSG_HELLO, 0, &m);
    m.u.hello.device = hn_cstr(longname);
    CHECK(hn_msg_encode_full(&m, &b, &err) == HR_EINVAL && strstr(err.msg, "HELLO.device"));
    m.u.hello.device = (hn_str){ "a\0b", 3 };
    CHECK(hn_msg_encode_full(&m, &b, &err) == HR_EINVAL && strstr(err.msg, "NUL"));
    make_sample(HN_MSG_HELLO, 0, &m);
    m.u.hello.version_min = 4;
    CHECK(hn_msg_encode_full(&m, &b, &err) == HR_EINVAL && strstr(err.msg, "HELLO.version_min"));

    make_sample(HN_MSG_FORWARD, 0, &m);
    m.u.forward.data = NULL;
    CHECK(hn_msg_encode_full(&m, &b, &err) == HR_EINVAL && strstr(err.msg, "FORWARD.data"));
    make_sample(HN_MSG_FORWARD, 0, &m);
    m.u.forward.stage = HN_STAGE_COUNT;
    CHECK(hn_msg_encode_full(&m, &b, &err) == HR_EINVAL && strstr(err.msg, "FORWARD.stage"));
    /* over the 64 MiB limit: the tail is never read, so a small buffer stands in for it */
    make_sample(HN_MSG_FORWARD, 0, &m);
    m.u.forward.n_tokens = 1;
    m.u.forward.n_embd = 16u << 20;
    hn_iov tail;
    CHECKF(hn_msg_encode(&m, &b, &tail, &err) == HR_EINVAL && strstr(err.msg, "exceeds its limit"), "%s", err.msg);
    m.u.forward.n_tokens = 1u << 16;
    m.u.forward.n_embd = 1u << 16; /* product overflows u32 */
    CHECK(hn_msg_encode(&m, &b, &tail, &err) == HR_EINVAL);

    make_sample(HN_MSG_PARTIAL, 0, &m);
    m.u.partial.offset = 6;
    CHECK(hn_msg_encode_full(&m, &b, &err) == HR_EINVAL && strstr(err.msg, "PARTIAL.data"));
    make_sample(HN_MSG_LOAD_PLAN, 0, &m);
    hn_unit bad_units[1] = { { 0, HN_UNIT_COUNT, 0, 1 } };
    m.u.load_plan.units = bad_units;
    m.u.load_plan.n_units = 1;
    CHECK(hn_msg_encode_full(&m, &b, &err) == HR_EINVAL && strstr(err.msg, "LOAD_PLAN.units"));
    make_sample(HN_MSG_LOAD_PLAN, 0, &m);
    m.u.load_plan.device_index = 3;
    CHECK(hn_msg_encode_full(&m, &b, &err) == HR_EINVAL && strstr(err.msg, "device_index"));
    make_sample(HN_MSG_PROFILE, 0, &m);
    m.u.profile.n_kv = HN_MAX_KV + 1;
    CHECK(hn_msg_encode_full(&m, &b, &err) == HR_EINVAL && strstr(err.msg, "PROFILE.kv"));
    make_sample(HN_MSG_SLICE_CHUNK, 0, &m);
    m.u.slice_chunk.n = HN_MAX_CHUNK + 1;
    CHECK(hn_msg_encode(&m, &b, &tail, &err) == HR_EINVAL && strstr(err.msg, "SLICE_CHUNK.data"));
    /* LOSS_PROBE: every bound of the burst a worker is asked to send */
    for (int c = 0; c < 8; c++) {
        make_sample(HN_MSG_LOSS_PROBE, 0, &m);
        hn_loss_probe *l = &m.u.loss_probe;
        const char *field[] = {"port", "port", "count", "count", "interval_us", "elems", "wait_ms", "drop_ppm"};
        switch (c) {
        case 0: l->port = 0; break;
        case 1: l->port = 65536; break;
        case 2: l->count = 0; break;
        case 3: l->count = HN_MAX_LOSS_PROBE + 1; break;
        case 4: l->interval_us = HN_MAX_LOSS_PROBE_US / l->count + 1; break;   /* the burst would last too long */
        case 5: l->elems = HN_DGRAM_MAX_ELEMS_SEALED + 1; break;
        case 6: l->wait_ms = HN_MAX_LOSS_WAIT_MS + 1; break;
        case 7: l->drop_ppm = 1000001; break;
        }
        char want[40];
        snprintf(want, sizeof want, "LOSS_PROBE.%s", field[c]);
        CHECKF(hn_msg_encode_full(&m, &b, &err) == HR_EINVAL && strstr(err.msg, want), "case %d: %s", c, err.msg);
    }
    /* and the decoder refuses the same bytes (a hostile head's request never reaches the worker's code) */
    make_sample(HN_MSG_LOSS_PROBE, 0, &m);
    CHECK(hn_msg_encode_full(&m, &b, &err) == 0 && b.len == 40);
    {
        uint8_t *c;
        hn_msg d;
        uint8_t raw[40];
        memcpy(raw, b.data, sizeof raw);
        raw[20] = raw[21] = raw[22] = raw[23] = 0xff;   /* count: 2^32 - 1 */
        CHECKF(decode_copy(HN_MSG_LOSS_PROBE, raw, sizeof raw, &d, &c, &err) == HR_EFORMAT && strstr(err.msg, "LOSS_PROBE.count"),
               "%s", err.msg);
        free(c);
        CHECK(decode_copy(HN_MSG_LOSS_PROBE, b.data, b.len - 1, &d, &c, &err) == HR_EFORMAT);   /* short */
        free(c);
        CHECKF(decode_copy(HN_MSG_LOSS_PROBE, b.data, b.len, &d, &c, &err) == 0 && d.u.loss_probe.count == 400, "%s", err.msg);
        free(c);
    }
    m.type = 0;
    CHECK(hn_msg_encode_full(&m, &b, &err) == HR_EINVAL);
    hn_buf_free(&b);
}

/* hand-made payloads whose counts disagree with the payload or with each other */
static void test_decoder_messages(void) {
    hn_msg m;
    hn_buf b;
    hn_buf_init(&b);
    hr_err err = { 0 };
    uint8_t *c;

    /* FORWARD with 2 positions for 3 tokens */
    for (int i = 0; i < 5; i++) hn_buf_put_u32(&b, i == 3 ? 3 : 1);
    int32_t p2[2] = { 0, 1 };
    hn_buf_put_i32s(&b, p2, 2);
    hn_buf_put_f32s(&b, sample_f32, 3);
    CHECKF(decode_copy(HN_MSG_FORWARD, b.data, b.len, &m, &c, &err) == HR_EFORMAT && strstr(err.msg, "FORWARD.pos"), "%s", err.msg);
    CHECK(m.u.forward.n_tokens == 0 && m.u.forward.data == NULL); /* no partial garbage */
    free(c);

    /* SLICE_HAVE whose count claims 2^28 hashes in a 16-byte payload */
    hn_buf_reset(&b);
    hn_buf_put_u64(&b, 1);
    hn_buf_put_u32(&b, 1u << 28);
    hn_buf_put_u32(&b, 0);
    hn_buf_put_u64(&b, 5);
    CHECKF(decode_copy(HN_MSG_SLICE_HAVE, b.data, b.len, &m, &c, &err) == HR_EFORMAT && strstr(err.msg, "SLICE_HAVE.hashes"), "%s", err.msg);
    free(c);
    /* non-zero padding */
    hn_buf_reset(&b);
    hn_buf_put_u64(&b, 1);
    hn_buf_put_u32(&b, 1);
    hn_buf_put_u32(&b, 0x01);
    hn_buf_put_u64(&b, 5);
    CHECKF(decode_copy(HN_MSG_SLICE_HAVE, b.data, b.len, &m, &c, &err) == HR_EFORMAT && strstr(err.msg, "padding"), "%s", err.msg);
    free(c);

    /* string longer than its limit, and a kv count above HN_MAX_KV */
    hn_buf_reset(&b);
    hn_buf_put_i32(&b, 0);
    hn_buf_put_u32(&b, HN_MAX_MESSAGE + 1);
    CHECK(decode_copy(HN_MSG_BYE, b.data, b.len, &m, &c, &err) == HR_EFORMAT && strstr(err.msg, "BYE.reason") &&
          strstr(err.msg, "limit"));
    free(c);
    hn_buf_reset(&b);
    hn_buf_put_u32(&b, HN_MAX_KV + 1);
    CHECK(decode_copy(HN_MSG_PROFILE, b.data, b.len, &m, &c, &err) == HR_EFORMAT && strstr(err.msg, "PROFILE.kv"));
    free(c);
    /* empty payload for a type with fields, unknown type */
    CHECK(hn_msg_decode(HN_MSG_READY, 0, NULL, 0, &m, &err) == HR_EFORMAT && strstr(err.msg, "READY.model_hash"));
    CHECK(hn_msg_decode(HN_MSG_COUNT, 0, NULL, 0, &m, &err) == HR_EPROTO);
    hn_buf_free(&b);
}

/* thousands of seeded hostile payloads: mutations of valid ones, inflated counts, random bytes */
static void test_decoder_random(void) {
    int n_cases = 0, n_decoded = 0, bad_reencode = 0;
    hr_err err;
    uint8_t *c;
    hn_msg m;
    for (int round = 0; round < 60; round++) {
        for (int type = 1; type < HN_MSG_COUNT; type++) {
            hn_msg s;
            hn_buf b;
            hn_buf_init(&b);
            make_sample(type, round & 1, &s);
            if (hn_msg_encode_full(&s, &b, NULL)) { CHECK(0); hn_buf_free(&b); continue; }
            size_t len = b.len;
            uint8_t *mut = malloc(len + 64);
            /* 1: flip a few bytes */
            memcpy(mut, b.data, len);
            int flips = 1 + (int)rnd_below(4);
            for (int k = 0; k < flips && len; k++) mut[rnd_below((uint32_t)len)] ^= (uint8_t)(1 + rnd_below(255));
            /* 2: overwrite one aligned word with a hostile count */
            if (len >= 4 && (round % 3) == 0) {
                static const uint32_t hostile[] = { 0xffffffffu, 0x7fffffffu, 0x80000000u, 0x10000000u, 65, 1u << 30 };
                uint32_t v = hostile[rnd_below(HR_ARRAY_LEN(hostile))];
                size_t off = rnd_below((uint32_t)(len / 4)) * 4;
                memcpy(mut + off, &v, 4);
            }
            /* 3: random length change */
            size_t mlen = len;
            if ((round % 5) == 1) mlen = rnd_below((uint32_t)len + 1);
            if ((round % 7) == 2) { for (int k = 0; k < 8; k++) mut[len + k] = (uint8_t)rnd(); mlen = len + 1 + rnd_below(8); }
            n_cases++;
            int rc = decode_copy(type, mut, mlen, &m, &c, &err);
            if (rc == 0) { n_decoded++; if (!reencodes_same(&m, c, mlen)) bad_reencode++; }
            else if (!strstr(err.msg, hn_msg_name(type))) { CHECKF(0, "error does not name the type: %s", err.msg); }
            free(c);
            free(mut);
            hn_buf_free(&b);
        }
    }
    /* random bytes under random types (including unknown ones) */
    for (int i = 0; i < 20000; i++) {
        int type = (int)rnd_below(HN_MSG_COUNT + 2);
        size_t n = rnd_below(i < 10000 ? 64 : 600);
        uint8_t buf[600];
        for (size_t k = 0; k < n; k++) buf[k] = (uint8_t)rnd();
        /* small counts make structured prefixes likely enough to go deep */
        if (n >= 8 && (i & 1)) for (size_t k = 0; k + 4 <= n; k += 4) if (rnd_below(3) == 0) { uint32_t v = rnd_below(6); memcpy(buf + k, &v, 4); }
        n_cases++;
        if (decode_copy(type, buf, n, &m, &c, &err) == 0) { n_decoded++; if (!reencodes_same(&m, c, n)) bad_reencode++; }
        free(c);
    }
    printf("randomized decoder: %d cases, %d decoded (all re-encoded identically: %s)\n", n_cases, n_decoded,
           bad_reencode ? "no" : "yes");
    CHECK(n_cases > 10000);
    CHECK(bad_reencode == 0);
}

static void test_addr_parse(void) {
    char host[64];
    uint16_t port;
    hr_err err = { 0 };
    CHECK(hn_parse_addr("127.0.0.1:7070", host, sizeof host, &port, &err) == 0 && !strcmp(host, "127.0.0.1") && port == 7070);
    CHECK(hn_parse_addr("[::1]:7070", host, sizeof host, &port, &err) == 0 && !strcmp(host, "::1") && port == 7070);
    CHECK(hn_parse_addr("[fe80::1%eth0]:1", host, sizeof host, &port, &err) == 0 && !strcmp(host, "fe80::1%eth0") && port == 1);
    CHECK(hn_parse_addr("pi5.local:0", host, sizeof host, &port, &err) == 0 && !strcmp(host, "pi5.local") && port == 0);
    CHECK(hn_parse_addr(":65535", host, sizeof host, &port, &err) == 0 && host[0] == 0 && port == 65535);
    CHECK(hn_parse_addr("::1:7070", host, sizeof host, &port, &err) == HR_EINVAL && strstr(err.msg, "brackets"));
    const char *bad[] = { "localhost", "host:", "host:65536", "host:12a", "host:-1", "[::1]7070", "[::1", "h:123456", "" };
    for (size_t i = 0; i < HR_ARRAY_LEN(bad); i++) CHECKF(hn_parse_addr(bad[i], host, sizeof host, &port, &err) == HR_EINVAL, "%s", bad[i]);
    char tiny[4];
    CHECK(hn_parse_addr("longhost:1", tiny, sizeof tiny, &port, &err) == HR_EINVAL);
}

/* ---- transport tests ---- */
static hn_listener *listen_local(char *addr, size_t cap) {
    hr_err err = { 0 };
    hn_listener *l = hn_listen("127.0.0.1:0", &err);
    if (!l) { fprintf(stderr, "listen: %s\n", err.msg); return NULL; }
    snprintf(addr, cap, "127.0.0.1:%u", hn_listener_port(l));
    return l;
}

/* connect + accept in one thread: the kernel completes the handshake before accept() */
static bool pair(hn_listener *l, const char *addr, hn_conn **client, hn_conn **server) {
    hr_err err = { 0 };
    *client = hn_connect(addr, hn_deadline_ms(2000), &err);
    if (!*client) { fprintf(stderr, "connect: %s\n", err.msg); return false; }
    *server = hn_accept(l, hn_deadline_ms(2000), &err);
    if (!*server) { fprintf(stderr, "accept: %s\n", err.msg); hn_conn_close(*client); return false; }
    return true;
}

#define BIG_TOKENS 2048u
#define BIG_EMBD   4096u /* 2048 x 4096 f32 = 32 MiB */

static float big_value(size_t i) { return (float)(i % 1009) * 0.5f - 3.0f; }

typedef struct server_ctx {
    hn_listener *l;
    int          failures;
    char         why[640];
    hn_conn_stats stats;
} server_ctx;

static void *echo_server(void *arg) {
    server_ctx *s = arg;
    hr_err err = { 0 };
    hn_conn *c = hn_accept(s->l, hn_deadline_ms(5000), &err);
    if (!c) { s->failures++; snprintf(s->why, sizeof s->why, "accept: %s", err.msg); return NULL; }
    hn_frame f = { 0 };
    hn_msg m;
    for (;;) {
        if (hn_msg_recv(c, &f, &m, hn_deadline_ms(5000), &err)) { s->failures++; snprintf(s->why, sizeof s->why, "recv: %s", err.msg); break; }
        hn_msg r;
        memset(&r, 0, sizeof r);
        r.seq = m.seq;
        if (m.type == HN_MSG_HELLO) {
            r.type = HN_MSG_HELLO_ACK;
            r.u.hello_ack.version = m.u.hello.version_max;
            r.u.hello_ack.caps = m.u.hello.caps & HN_CAP_F32_ACT;
            r.u.hello_ack.device = hn_cstr("echo worker");
        } else if (m.type == HN_MSG_FORWARD) {
            const hn_forward *fw = &m.u.forward;
            size_t n = (size_t)fw->n_tokens * fw->n_embd, bad = 0;
            for (size_t i = 0; i < n; i++) bad += fw->data[i] != big_value(i);
            for (uint32_t t = 0; t < fw->n_tokens; t++) bad += fw->pos[t] != (int32_t)t;
            if (bad) { s->failures++; snprintf(s->why, sizeof s->why, "FORWARD arrived with %zu wrong values", bad); }
            /* reply straight from the received payload: a second iovec, no copy */
            r.type = HN_MSG_PARTIAL;
            r.u.partial = (hn_partial){ .layer = fw->layer_begin, .stage = fw->stage, .n_tokens = fw->n_tokens,
                                        .n_embd = fw->n_embd, .offset = 0, .n = (uint32_t)n, .compute_ns = 1, .data = fw->data };
        } else if (m.type == HN_MSG_BYE) {
            r.type = HN_MSG_BYE;
            r.u.bye.reason = hn_cstr("bye");
        } else {
            continue; /* RESET: no answer */
        }
        if (hn_msg_send(c, &r, hn_deadline_ms(5000), &err)) { s->failures++; snprintf(s->why, sizeof s->why, "send: %s", err.msg); break; }
        if (m.type == HN_MSG_BYE) break;
    }
    /* wait for the client's close so the counters are final on both sides */
    if (hn_recv_frame(c, &f, hn_deadline_ms(5000), &err) != HR_ENET) s->failures++;
    hn_conn_get_stats(c, &s->stats);
    hn_frame_free(&f);
    hn_conn_close(c);
    return NULL;
}

static void test_loopback_exchange(void) {
    char addr[64];
    server_ctx s = { 0 };
    s.l = listen_local(addr, sizeof addr);
    REQUIRE_VOID(s.l);
    pthread_t th;
    REQUIRE_VOID(pthread_create(&th, NULL, echo_server, &s) == 0);

    hr_err err = { 0 };
    hn_conn *c = hn_connect(addr, hn_deadline_ms(2000), &err);
    CHECKF(c, "%s", err.msg);
    if (c) {
        hn_frame f = { 0 };
        hn_msg m, r;
        make_sample(HN_MSG_HELLO, 0, &m);
        m.seq = 1;
        CHECKF(hn_msg_send(c, &m, hn_deadline_ms(2000), &err) == 0, "%s", err.msg);
        CHECKF(hn_msg_recv(c, &f, &r, hn_deadline_ms(2000), &err) == 0, "%s", err.msg);
        CHECK(r.type == HN_MSG_HELLO_ACK && r.seq == 1 && r.u.hello_ack.version == 3 && hn_str_eq(r.u.hello_ack.device, "echo worker"));

        size_t n = (size_t)BIG_TOKENS * BIG_EMBD;
        float *data = malloc(n * sizeof(float));
        int32_t *pos = malloc(BIG_TOKENS * sizeof(int32_t));
        for (size_t i = 0; i < n; i++) data[i] = big_value(i);
        for (uint32_t t = 0; t < BIG_TOKENS; t++) pos[t] = (int32_t)t;
        memset(&m, 0, sizeof m);
        m.type = HN_MSG_FORWARD;
        m.seq = 2;
        m.u.forward = (hn_forward){ .layer_begin = 3, .layer_end = 4, .stage = HN_STAGE_ATTN, .n_tokens = BIG_TOKENS,
                                    .n_embd = BIG_EMBD, .pos = pos, .data = data };
        int64_t t0 = hr_time_ns();
        CHECKF(hn_msg_send(c, &m, hn_deadline_ms(5000), &err) == 0, "%s", err.msg);
        int rc = hn_msg_recv(c, &f, &r, hn_deadline_ms(5000), &err);
        double ms = (double)(hr_time_ns() - t0) * 1e-6;
        CHECKF(rc == 0, "%s", err.msg);
        CHECK(rc == 0 && r.type == HN_MSG_PARTIAL && r.seq == 2 && r.u.partial.n == n && r.u.partial.layer == 3);
        if (rc == 0 && r.type == HN_MSG_PARTIAL) {
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) bad += r.u.partial.data[i] != data[i];
            CHECK(bad == 0);
            CHECK(((uintptr_t)r.u.partial.data & 3) == 0);
        }
        printf("32 MiB FORWARD + 32 MiB PARTIAL round trip on loopback: %.1f ms\n", ms);

        memset(&m, 0, sizeof m);
        m.type = HN_MSG_RESET;
        m.seq = 3;
        CHECK(hn_msg_send(c, &m, hn_deadline_ms(2000), &err) == 0);
        m.type = HN_MSG_BYE;
        m.seq = 4;
        CHECK(hn_msg_send(c, &m, hn_deadline_ms(2000), &err) == 0);
        CHECK(hn_msg_recv(c, &f, &r, hn_deadline_ms(2000), &err) == 0 && r.type == HN_MSG_BYE && r.seq == 4);

        hn_conn_stats st;
        hn_conn_get_stats(c, &st);
        hn_frame_free(&f);
        hn_conn_close(c);
        free(data);
        free(pos);
        pthread_join(th, NULL);
        CHECKF(s.failures == 0, "server: %s", s.why);
        CHECK(st.frames_sent == 4 && st.frames_received == 3);
        CHECK(s.stats.frames_received == 4 && s.stats.frames_sent == 3);
        CHECK(st.bytes_sent == s.stats.bytes_received && st.bytes_received == s.stats.bytes_sent);
        CHECK(st.bytes_sent > n * 4 && st.bytes_received > n * 4);
    } else {
        pthread_join(th, NULL);
    }
    hn_listener_close(s.l);
}

/* one sending and one receiving thread on the same connection at once (the documented model) */
#define DUPLEX_FRAMES 300
#define DUPLEX_BYTES  (48 * 1024)

static void *duplex_echo(void *arg) {
    server_ctx *s = arg;
    hr_err err = { 0 };
    hn_conn *c = hn_accept(s->l, hn_deadline_ms(5000), &err);
    if (!c) { s->failures++; return NULL; }
    hn_frame f = { 0 };
    for (int i = 0; i < DUPLEX_FRAMES; i++) {
        if (hn_recv_frame(c, &f, hn_deadline_ms(5000), &err)) { s->failures++; snprintf(s->why, sizeof s->why, "%s", err.msg); break; }
        hn_iov part = { f.payload, f.len };
        if (hn_send_frame(c, f.type, f.seq, &part, 1, hn_deadline_ms(5000), &err)) { s->failures++; break; }
    }
    hn_frame_free(&f);
    hn_conn_close(c);
    return NULL;
}

typedef struct reader_ctx { hn_conn *c; int got, bad; } reader_ctx;

static void *duplex_reader(void *arg) {
    reader_ctx *r = arg;
    hn_frame f = { 0 };
    hr_err err = { 0 };
    for (int i = 0; i < DUPLEX_FRAMES; i++) {
        if (hn_recv_frame(r->c, &f, hn_deadline_ms(5000), &err)) { r->bad++; break; }
        if (f.seq != (uint32_t)i || f.len != DUPLEX_BYTES || f.payload[i % DUPLEX_BYTES] != (uint8_t)i) r->bad++;
        r->got++;
    }
    hn_frame_free(&f);
    return NULL;
}

static void test_duplex(void) {
    char addr[64];
    server_ctx s = { 0 };
    s.l = listen_local(addr, sizeof addr);
    REQUIRE_VOID(s.l);
    pthread_t srv, rd;
    REQUIRE_VOID(pthread_create(&srv, NULL, duplex_echo, &s) == 0);
    hr_err err = { 0 };
    hn_conn *c = hn_connect(addr, hn_deadline_ms(2000), &err);
    if (c) {
        reader_ctx r = { c, 0, 0 };
        pthread_create(&rd, NULL, duplex_reader, &r);
        uint8_t *buf = calloc(1, DUPLEX_BYTES);
        int sent = 0;
        for (int i = 0; i < DUPLEX_FRAMES; i++) {
            buf[i % DUPLEX_BYTES] = (uint8_t)i;
            hn_iov part = { buf, DUPLEX_BYTES };
            if (hn_send_frame(c, HN_MSG_SLICE_CHUNK, (uint32_t)i, &part, 1, hn_deadline_ms(5000), &err)) break;
            sent++;
            hn_conn_stats st; /* read while the reader thread updates the receive counters */
            hn_conn_get_stats(c, &st);
        }
        pthread_join(rd, NULL);
        CHECK(sent == DUPLEX_FRAMES && r.got == DUPLEX_FRAMES && r.bad == 0);
        free(buf);
        hn_conn_close(c);
    } else {
        CHECK(0);
    }
    pthread_join(srv, NULL);
    CHECKF(s.failures == 0, "%s", s.why);
    hn_listener_close(s.l);
}

static void test_deadlines_and_close(void) {
    char addr[64];
    hn_listener *l = listen_local(addr, sizeof addr);
    REQUIRE_VOID(l);
    hr_err err = { 0 };
    hn_conn *c, *s;
    hn_frame f = { 0 };

    /* accept with nobody knocking */
    int64_t t0 = hr_time_ns();
    CHECK(hn_accept(l, hn_deadline_ms(100), &err) == NULL && err.code == HR_ETIMEDOUT);
    CHECK(hr_time_ns() - t0 < 1000000000);

    /* a silent peer: HR_ETIMEDOUT within 150..1000 ms of a 200 ms deadline; the connection survives */
    REQUIRE_VOID(pair(l, addr, &c, &s));
    t0 = hr_time_ns();
    int rc = hn_recv_frame(c, &f, hn_deadline_ms(200), &err);
    double ms = (double)(hr_time_ns() - t0) * 1e-6;
    CHECKF(rc == HR_ETIMEDOUT && ms >= 150 && ms <= 1000, "rc %d after %.1f ms: %s", rc, ms, err.msg);
    printf("silent peer: HR_ETIMEDOUT after %.1f ms (deadline 200 ms)\n", ms);
    hn_iov part = { "hi", 2 };
    CHECK(hn_send_frame(s, HN_MSG_ERROR, 9, &part, 1, hn_deadline_ms(1000), &err) == 0);
    CHECK(hn_recv_frame(c, &f, hn_deadline_ms(1000), &err) == 0 && f.type == HN_MSG_ERROR && f.seq == 9 && f.len == 2);
    /* the peer closes: HR_ENET "peer closed the connection", at once */
    hn_conn_close(s);
    t0 = hr_time_ns();
    rc = hn_recv_frame(c, &f, hn_deadline_ms(2000), &err);
    CHECKF(rc == HR_ENET && strstr(err.msg, "peer closed the connection") && hr_time_ns() - t0 < 500000000, "%d %s", rc, err.msg);
    CHECK(hn_recv_frame(c, &f, hn_deadline_ms(100), &err) == HR_ENET); /* and stays closed */
    hn_conn_close(c);

    /* a header claiming 2 GiB is refused before anything is allocated */
    REQUIRE_VOID(pair(l, addr, &c, &s));
    uint8_t h[HN_HEADER_SIZE];
    hn_frame g = { 0 };
    hn_header_encode(h, HN_MSG_FORWARD, 0x80000000u, 1);
    CHECK(send(hn_conn_fd(s), h, sizeof h, MSG_NOSIGNAL) == (ssize_t)sizeof h);
    rc = hn_recv_frame(c, &g, hn_deadline_ms(1000), &err);
    CHECKF(rc == HR_EPROTO && strstr(err.msg, "2147483648") && strstr(err.msg, "FORWARD"), "%s", err.msg);
    CHECK(g.payload == NULL && g.cap == 0);
    CHECK(hn_recv_frame(c, &g, hn_deadline_ms(100), &err) == HR_ENET); /* lost its place: unusable */
    hn_conn_close(c);
    hn_conn_close(s);

    /* bad magic and a torn frame (peer closes mid-payload) */
    REQUIRE_VOID(pair(l, addr, &c, &s));
    CHECK(send(hn_conn_fd(s), "GET / HTTP/1.1\r\n\r\n", 18, MSG_NOSIGNAL) == 18);
    CHECK(hn_recv_frame(c, &g, hn_deadline_ms(1000), &err) == HR_EPROTO && strstr(err.msg, "magic"));
    hn_conn_close(c);
    hn_conn_close(s);
    REQUIRE_VOID(pair(l, addr, &c, &s));
    hn_header_encode(h, HN_MSG_HELLO, 100, 1);
    CHECK(send(hn_conn_fd(s), h, sizeof h, MSG_NOSIGNAL) == (ssize_t)sizeof h);
    CHECK(send(hn_conn_fd(s), "abc", 3, MSG_NOSIGNAL) == 3);
    hn_conn_close(s);
    CHECK(hn_recv_frame(c, &g, hn_deadline_ms(1000), &err) == HR_ENET && strstr(err.msg, "middle of a HELLO"));
    hn_conn_close(c);
    hn_frame_free(&g);

    /* a peer that does not read: a 60 MiB send gives HR_ETIMEDOUT, not a hang */
    REQUIRE_VOID(pair(l, addr, &c, &s));
    size_t big = 60u << 20;
    uint8_t *buf = calloc(1, big);
    hn_iov bp = { buf, big };
    t0 = hr_time_ns();
    rc = hn_send_frame(c, HN_MSG_PARTIAL, 1, &bp, 1, hn_deadline_ms(200), &err);
    ms = (double)(hr_time_ns() - t0) * 1e-6;
    CHECKF(rc == HR_ETIMEDOUT && ms < 1500, "rc %d after %.1f ms: %s", rc, ms, err.msg);
    CHECK(hn_send_frame(c, HN_MSG_BYE, 2, NULL, 0, hn_deadline_ms(100), &err) == HR_ENET); /* torn frame: unusable */
    /* a frame over its type's limit is refused before sending anything */
    hn_conn *c2, *s2;
    REQUIRE_VOID(pair(l, addr, &c2, &s2));
    bp.n = hn_msg_max_payload(HN_MSG_HELLO) + 1;
    CHECK(hn_send_frame(c2, HN_MSG_HELLO, 1, &bp, 1, hn_deadline_ms(100), &err) == HR_EINVAL);
    hn_conn_stats st;
    hn_conn_get_stats(c2, &st);
    CHECK(st.bytes_sent == 0);
    /* the peer closes while we send: HR_ENET, no SIGPIPE */
    hn_conn_close(s2);
    bp.n = 8u << 20;
    rc = HR_OK;
    for (int i = 0; i < 4 && rc == HR_OK; i++) rc = hn_send_frame(c2, HN_MSG_PARTIAL, 1, &bp, 1, hn_deadline_ms(1000), &err);
    CHECKF(rc == HR_ENET, "rc %d: %s", rc, err.msg);
    hn_conn_close(c2);
    free(buf);
    hn_conn_close(c);
    hn_conn_close(s);

    /* host names resolve (localhost may be ::1 first: connect falls through to 127.0.0.1) */
    char lh[64];
    snprintf(lh, sizeof lh, "localhost:%u", hn_listener_port(l));
    c = hn_connect(lh, hn_deadline_ms(2000), &err);
    CHECKF(c != NULL, "%s", err.msg);
    if (c) {
        s = hn_accept(l, hn_deadline_ms(2000), &err);
        CHECK(s && !strncmp(hn_conn_peer(s), "127.0.0.1:", 10));
        hn_conn_close(s);
        hn_conn_close(c);
    }
    uint16_t port = hn_listener_port(l);
    hn_frame_free(&f);
    hn_listener_close(l);

    /* nobody listening: HR_ENET "refused", quickly */
    snprintf(lh, sizeof lh, "127.0.0.1:%u", port);
    CHECK(hn_connect(lh, hn_deadline_ms(1000), &err) == NULL && err.code == HR_ENET && strstr(err.msg, "refused"));
    CHECK(hn_connect("127.0.0.1:0", hn_deadline_ms(100), &err) == NULL && err.code == HR_EINVAL);
    CHECK(hn_listen("127.0.0.1:notaport", &err) == NULL && err.code == HR_EINVAL);
}

/* hn_conn_shutdown from another thread wakes a receive that would wait 5 s */
static void *blocked_recv(void *arg) {
    hn_conn *c = arg;
    hn_frame f = { 0 };
    hr_err err = { 0 };
    int rc = hn_recv_frame(c, &f, hn_deadline_ms(5000), &err);
    hn_frame_free(&f);
    return (void *)(intptr_t)rc;
}

static void test_shutdown_wakes(void) {
    char addr[64];
    hn_listener *l = listen_local(addr, sizeof addr);
    REQUIRE_VOID(l);
    hn_conn *c, *s;
    if (!pair(l, addr, &c, &s)) { CHECK(0); hn_listener_close(l); return; }
    pthread_t th;
    int64_t t0 = hr_time_ns();
    pthread_create(&th, NULL, blocked_recv, c);
    usleep(50000);
    hn_conn_shutdown(c);
    void *ret;
    pthread_join(th, &ret);
    CHECK((int)(intptr_t)ret == HR_ENET && hr_time_ns() - t0 < 2000000000);
    hn_conn_close(c);
    hn_conn_close(s);
    hn_listener_close(l);
}

int main(void) {
    hr_init();
    int64_t t0 = hr_time_ns();
    test_header();
    test_round_trip();
    test_encoder_checks();
    test_decoder_messages();
    test_decoder_random();
    test_addr_parse();
    test_loopback_exchange();
    test_duplex();
    test_deadlines_and_close();
    test_shutdown_wakes();
    printf("test-net: %.2f s\n", (double)(hr_time_ns() - t0) * 1e-9);
    return test_summary();
}
