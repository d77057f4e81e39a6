// fuzz-discover — libFuzzer harness for discovery's packet decoder (src/net/discover.c), built with
// clang by scripts/fuzz.sh, not CMake.
//
// Input: one datagram, as a worker or a head would read it from the LAN (anyone may send one). It is
// decoded from an exact-size, 8-byte aligned heap copy (so ASan sees any read past the end); when it
// decodes, the announcement must pass the encoder's checks and re-encode to the very same bytes (the
// format is canonical), its strings must be NUL-terminated within their fields, and a refusal must be
// one of the documented codes with a message. A crash, sanitizer report or failed check is a bug.
//
// Seeds: tests/data/fuzz-discover/ (a query, announcements with an IPv4, empty and IPv6 host), which
// `HEARTH_DISCOVER_SEED_DIR=DIR build/test-discover` writes anew.
//
// fuzz-sources: src/net/discover.c src/net/proto.c src/net/tcp.c src/net/noise.c src/base/*.c
// fuzz-max-len: 1024
// fuzz-seed-test: test-discover HEARTH_DISCOVER_SEED_DIR
#include "net/net.h"

#include <stdio.h>
#include <stdlib.h>

#define FUZZ_CHECK(x) do { if (!(x)) { fprintf(stderr, "fuzz-discover: check failed: %s\n", #x); abort(); } } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *p = malloc(size ? size : 1); /* malloc's alignment is at least 8 */
    if (size) memcpy(p, data, size);
    int kind = 0;
    hn_announce a;
    memset(&a, 0x5a, sizeof a); /* a decoder that left a field unset would show here */
    hr_err err = {0};
    int rc = hn_discover_decode(p, size, &kind, &a, &err);
    if (rc == 0) {
        FUZZ_CHECK(size <= HN_DISCOVER_MAX_PACKET);
        FUZZ_CHECK(kind == HN_DISC_QUERY || kind == HN_DISC_ANNOUNCE);
        if (kind == HN_DISC_ANNOUNCE) {
            FUZZ_CHECK(memchr(a.host, 0, sizeof a.host) && memchr(a.name, 0, sizeof a.name));
            FUZZ_CHECK(a.port != 0 && a.n_threads >= 1 && a.n_threads <= HN_DISCOVER_MAX_THREADS && a.name[0]);
        }
        hn_buf b;
        hn_buf_init(&b);
        FUZZ_CHECK(hn_discover_encode(kind, &a, &b, &err) == 0);
        FUZZ_CHECK(b.len == size && memcmp(b.data, p, size) == 0);
        hn_buf_free(&b);
    } else {
        FUZZ_CHECK(rc == HR_EFORMAT || rc == HR_ERANGE || rc == HR_EUNSUPPORTED);
        FUZZ_CHECK(err.code == rc && err.msg[0] != 0);
        FUZZ_CHECK(rc != HR_ERANGE || size > HN_DISCOVER_MAX_PACKET);
    }
    free(p);
    return 0;
}
