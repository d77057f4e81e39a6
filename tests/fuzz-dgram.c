// fuzz-dgram — libFuzzer harness for the lossy all-reduce's datagram decoder (src/net/dgram.c; built
// with clang by scripts/fuzz.sh, not CMake).
//
// Input: one datagram. It is decoded from an exact-size heap copy (so ASan sees any read past the
// end); when it decodes, the element range must lie inside the total, the data inside the input, and
// the datagram must re-encode to the very same bytes (the format is canonical). The same input is also
// decoded by a sealing receiver (key 0x11 in every byte, as test-dgram's sealed seeds): what opens
// must re-seal, under its counter, to the same bytes. A crash, sanitizer report or failed check is a
// bug; a refusal is not.
//
// Seeds: the valid datagrams of test-dgram (HEARTH_DGRAM_SEED_DIR) and tests/corpus/fuzz-dgram (one of
// each kind: a PARTIAL, a flagged RESULT tail, a NACK, a stale partial).
// fuzz-sources: src/net/dgram.c src/net/noise.c src/net/proto.c src/base/*.c
// fuzz-max-len: 2048
// fuzz-seed-test: test-dgram HEARTH_DGRAM_SEED_DIR

#include "net/net.h"

#include <stdio.h>
#include <stdlib.h>

#define FUZZ_CHECK(x) do { if (!(x)) { fprintf(stderr, "fuzz-dgram: check failed: %s\n", #x); abort(); } } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *p = malloc(size ? size : 1);
    if (!p) return 0;
    memcpy(p, data, size);
    hn_dgram d;
    char why[128];
    if (hn_dgram_decode(p, size, NULL, &d, why, sizeof why) == 0) {
        FUZZ_CHECK(d.n >= 1 && d.n <= HN_DGRAM_MAX_ELEMS && (uint64_t)d.offset + d.n <= d.total);
        FUZZ_CHECK((const uint8_t *)d.data == p + HN_DGRAM_HEADER && size == HN_DGRAM_HEADER + 4 * (size_t)d.n);
        float v[HN_DGRAM_MAX_ELEMS];
        memcpy(v, d.data, 4 * (size_t)d.n);
        hn_dgram e = d;
        e.data = v;
        uint8_t out[HN_DGRAM_MAX_BYTES];
        size_t len = hn_dgram_encode(&e, NULL, out, sizeof out);
        FUZZ_CHECK(len == size && !memcmp(out, p, size));
    }
    static hn_dgram_crypt rx, tx;
    memset(&rx, 0, sizeof rx);
    rx.on = true;
    memset(rx.recv.k, 0x11, sizeof rx.recv.k);
    hn_replay_init(&rx.seen);
    if (hn_dgram_decode(p, size, &rx, &d, why, sizeof why) == 0) {
        FUZZ_CHECK(d.n >= 1 && d.n <= HN_DGRAM_MAX_ELEMS_SEALED && (uint64_t)d.offset + d.n <= d.total);
        FUZZ_CHECK((const uint8_t *)d.data == rx.plain &&
                   size == HN_DGRAM_HEADER + HN_DGRAM_SEAL_OVERHEAD + 4 * (size_t)d.n);
        memset(&tx, 0, sizeof tx);
        tx.on = true;
        memset(tx.send.k, 0x11, sizeof tx.send.k);
        memcpy(&tx.next, p + HN_DGRAM_HEADER, 8);
        uint8_t out[HN_DGRAM_MAX_BYTES];
        size_t len = hn_dgram_encode(&d, &tx, out, sizeof out);
        FUZZ_CHECK(len == size && !memcmp(out, p, size));
    }
    free(p);
    return 0;
}
