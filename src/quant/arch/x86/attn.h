/* quant, x86: what the attention kernel files (attn.c, attn512.c) share. */
#ifndef HEARTH_QUANT_X86_ATTN_H
#define HEARTH_QUANT_X86_ATTN_H

#include "quant/quant-impl.h"

#include <immintrin.h>

/* 8 elements of a cache row (F16 widened by F16C, or F32) */
static inline __m256 hq_load8(const uint8_t *p, bool f16) {
    return f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)) : _mm256_loadu_ps((const float *)p);
}

/* F(NQ, ...) for m = 1..4 heads with NQ a constant, so that the kernel's per-head accumulators are
   arrays of known size the compiler keeps in registers */
#define HQ_BY_NQ(m, F, ...)                      \
    do {                                         \
        switch (m) {                             \
        case 1: F(1, __VA_ARGS__); break;        \
        case 2: F(2, __VA_ARGS__); break;        \
        case 3: F(3, __VA_ARGS__); break;        \
        default: F(4, __VA_ARGS__); break;       \
        }                                        \
    } while (0)

#endif
