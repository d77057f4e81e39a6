/* gguf internals shared by the reader (gguf.c) and the writer (gguf-write.c): value-type sizes,
   the limits both sides apply, little-endian helpers, and the reader's raw view of a kv that
   gguf_writer_copy_kv copies byte for byte. Not part of the module's interface. */
#ifndef HEARTH_GGUF_IMPL_H
#define HEARTH_GGUF_IMPL_H

#include "gguf.h"

/* Keys longer than this are refused (the GGUF spec caps keys at 65535 bytes). Tensor names are
   much shorter in practice (ggml keeps 63 bytes); the cap only keeps messages and hashing sane. */
#define GGUF_MAX_KEY_LEN  65535u
#define GGUF_MAX_NAME_LEN 1024u

/* Bytes of one scalar of type t; 0 for strings, arrays and unknown types. */
static inline size_t gguf_vt_size(int t) {
    static const uint8_t sz[GGUF_VT_COUNT] = {
        [GGUF_VT_UINT8] = 1,  [GGUF_VT_INT8] = 1,  [GGUF_VT_UINT16] = 2, [GGUF_VT_INT16] = 2,
        [GGUF_VT_UINT32] = 4, [GGUF_VT_INT32] = 4, [GGUF_VT_FLOAT32] = 4, [GGUF_VT_BOOL] = 1,
        [GGUF_VT_UINT64] = 8, [GGUF_VT_INT64] = 8, [GGUF_VT_FLOAT64] = 8,
    };
    return t >= 0 && t < GGUF_VT_COUNT ? sz[t] : 0;
}
const char *gguf_vt_name(int t);

/* Explicit little-endian access, so neither side depends on the host's byte order or alignment. */
static inline uint32_t gguf_rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t gguf_rd_u64(const uint8_t *p) {
    return (uint64_t)gguf_rd_u32(p) | (uint64_t)gguf_rd_u32(p + 4) << 32;
}
static inline void gguf_wr_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void gguf_wr_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* The on-disk bytes of kv i's value (what follows its u32 type), already validated by the reader.
   False if i is out of range. */
bool gguf_kv_raw(const gguf_ctx *ctx, int64_t i, const uint8_t **val, uint64_t *size);

#endif
