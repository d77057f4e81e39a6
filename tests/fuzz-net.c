// fuzz-net — libFuzzer harness for the wire protocol's decoders (built with clang by scripts/fuzz.sh,
// not CMake).
//
// Input: byte 0 picks the message type (any value, so unknown types are tried too), the rest is the
// payload. It is decoded from an exact-size heap copy (so ASan sees any read past the end); when it
// decodes, every borrowed pointer must lie inside the payload and the message must re-encode to the
// very same bytes (the format is canonical), both as one buffer and as head + tail. Inputs of 16 or
// more bytes are also run through the frame header check. A crash, sanitizer report or failed check
// is a bug; a refusal is not.
//
// `scripts/fuzz.sh -t SECONDS` builds it, seeds it with one message per type from test-net
// (HEARTH_NET_SEED_DIR) and runs it; CI runs it for 30 s.
//
// fuzz-sources: src/net/proto.c src/base/*.c
// fuzz-max-len: 4096
// fuzz-seed-test: test-net HEARTH_NET_SEED_DIR
#include "net/net.h"

#include <stdio.h>
#include <stdlib.h>

#define FUZZ_CHECK(x) do { if (!(x)) { fprintf(stderr, "fuzz-net: check failed: %s\n", #x); abort(); } } while (0)

static bool inside(const uint8_t *base, size_t size, const void *p, uint64_t n) {
    if (n == 0) return true;
    const uint8_t *q = p;
    return q >= base && (uint64_t)(q - base) <= size && n <= size - (uint64_t)(q - base);
}

static void check_str(const uint8_t *base, size_t size, hn_str s, uint32_t max) {
    FUZZ_CHECK(s.n <= max && inside(base, size, s.s, s.n) && (s.n == 0 || !memchr(s.s, 0, s.n)));
}

static void check_kv(const uint8_t *base, size_t size, uint32_t n, const hn_kv *kv) {
    FUZZ_CHECK(n <= HN_MAX_KV);
    for (uint32_t i = 0; i < n; i++) {
        check_str(base, size, kv[i].key, HN_MAX_KEY);
        check_str(base, size, kv[i].value, HN_MAX_VALUE);
    }
}

static void check_borrowed(const hn_msg *m, const uint8_t *p, size_t n) {
    switch (m->type) {
    case HN_MSG_HELLO: check_str(p, n, m->u.hello.device, HN_MAX_NAME); break;
    case HN_MSG_HELLO_ACK: check_str(p, n, m->u.hello_ack.device, HN_MAX_NAME); break;
    case HN_MSG_ERROR: check_str(p, n, m->u.error.message, HN_MAX_MESSAGE); break;
    case HN_MSG_PROFILE: check_kv(p, n, m->u.profile.n_kv, m->u.profile.kv); break;
    case HN_MSG_LOAD_PLAN:
        check_str(p, n, m->u.load_plan.arch, HN_MAX_NAME);
        check_kv(p, n, m->u.load_plan.n_params, m->u.load_plan.params);
        FUZZ_CHECK(inside(p, n, m->u.load_plan.units, (uint64_t)m->u.load_plan.n_units * sizeof(hn_unit)));
        FUZZ_CHECK(((uintptr_t)m->u.load_plan.units & 3) == 0);
        break;
    case HN_MSG_SLICE_HAVE:
        FUZZ_CHECK(inside(p, n, m->u.slice_have.hashes, (uint64_t)m->u.slice_have.n_hashes * 8));
        FUZZ_CHECK(((uintptr_t)m->u.slice_have.hashes & 7) == 0);
        break;
    case HN_MSG_SLICE_BEGIN: check_str(p, n, m->u.slice_begin.name, HN_MAX_SLICE_NAME); break;
    case HN_MSG_SLICE_CHUNK: FUZZ_CHECK(inside(p, n, m->u.slice_chunk.data, m->u.slice_chunk.n)); break;
    case HN_MSG_FORWARD:
        FUZZ_CHECK(inside(p, n, m->u.forward.pos, (uint64_t)m->u.forward.n_tokens * 4));
        FUZZ_CHECK(!m->u.forward.seq || inside(p, n, m->u.forward.seq, (uint64_t)m->u.forward.n_tokens * 4));
        FUZZ_CHECK(inside(p, n, m->u.forward.data, (uint64_t)m->u.forward.n_tokens * m->u.forward.n_embd * 4));
        FUZZ_CHECK(((uintptr_t)m->u.forward.data & 3) == 0 && ((uintptr_t)m->u.forward.pos & 3) == 0);
        break;
    case HN_MSG_PARTIAL:
        FUZZ_CHECK(inside(p, n, m->u.partial.data, (uint64_t)m->u.partial.n * 4));
        FUZZ_CHECK((uint64_t)m->u.partial.offset + m->u.partial.n <= (uint64_t)m->u.partial.n_tokens * m->u.partial.n_embd);
        break;
    case HN_MSG_RESULT:
        FUZZ_CHECK(inside(p, n, m->u.result.data, (uint64_t)m->u.result.n_tokens * m->u.result.n_embd * 4));
        break;
    case HN_MSG_BYE: check_str(p, n, m->u.bye.reason, HN_MAX_MESSAGE); break;
    case HN_MSG_LINK_PROBE: check_str(p, n, m->u.link_probe.addr, HN_MAX_NAME); break;
    case HN_MSG_PROBE: FUZZ_CHECK(inside(p, n, m->u.probe.data, m->u.probe.n) && m->u.probe.reply_bytes <= HN_MAX_PROBE); break;
    default: break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size >= HN_HEADER_SIZE) {
        hn_header h;
        if (hn_header_decode(data, &h, NULL) == 0)
            FUZZ_CHECK(h.type > 0 && h.type < HN_MSG_COUNT && h.len <= hn_msg_max_payload(h.type));
    }
    if (size == 0) return 0;
    int type = data[0] % (HN_MSG_COUNT + 2);
    size_t n = size - 1;
    uint8_t *p = n ? malloc(n) : NULL;
    if (n) memcpy(p, data + 1, n);

    hn_msg m;
    hr_err err = { 0 };
    if (hn_msg_decode(type, 7, p, n, &m, &err) == 0) {
        check_borrowed(&m, p, n);
        hn_buf b;
        hn_buf_init(&b);
        FUZZ_CHECK(hn_msg_encode_full(&m, &b, &err) == 0);
        FUZZ_CHECK(b.len == n && (n == 0 || memcmp(b.data, p, n) == 0));
        hn_iov tail;
        FUZZ_CHECK(hn_msg_encode(&m, &b, &tail, &err) == 0);
        FUZZ_CHECK(b.len + tail.n == n && (b.len == 0 || memcmp(b.data, p, b.len) == 0));
        FUZZ_CHECK(tail.n == 0 || tail.p == p + b.len);
        hn_buf_free(&b);
    } else {
        FUZZ_CHECK(err.code == HR_EFORMAT || err.code == HR_EPROTO);
        FUZZ_CHECK(err.msg[0] != 0);
    }
    free(p);
    return 0;
}
