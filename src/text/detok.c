/* Token ids back to bytes: the per-token pieces (built at load, see ht_build_pieces) and the
   streaming detokenizer that only ever emits valid UTF-8.

   Byte-fallback tokens (SentencePiece's <0xNN>) and byte-level BPE tokens split a character over
   several ids, so a stream must hold back a character until its last byte arrives. Bytes that can never become valid UTF-8 (a stray continuation byte,
   an invalid lead byte, a sequence cut short by a byte that cannot continue it, overlong forms,
   surrogates, code points above U+10FFFF) are replaced by U+FFFD, one per maximal invalid subpart
   as Unicode recommends, so bad model output neither stalls the stream nor leaks broken UTF-8. */
#include "text-impl.h"

#define HT_REPLACEMENT "\xef\xbf\xbd"  /* U+FFFD */

int ht_token_to_bytes(const ht_vocab *v, int32_t id, char *buf, int cap) {
    if (id < 0 || id >= v->n_tokens) return HR_EINVAL;
    int n = (int)(v->piece_off[id + 1] - v->piece_off[id] - 1);
    if (n > cap) return n;
    if (n) memcpy(buf, v->piece + v->piece_off[id], (size_t)n);
    return n;
}

int ht_detok_max_bytes(const ht_vocab *v) {
    /* worst case: the held-back bytes and every byte of the piece each become U+FFFD */
    return 3 * (v->max_piece_len + 3);
}

/* Classifies the UTF-8 sequence at p[0..n): its length if complete and valid, 0 if it is a valid
   but incomplete prefix, or -k if its first k bytes are a maximal invalid subpart (k >= 1). */
static int utf8_classify(const unsigned char *p, int n) {
    unsigned char c = p[0];
    if (c < 0x80) return 1;
    int len;
    unsigned char lo = 0x80, hi = 0xbf;  /* allowed range of the second byte */
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0) lo = 0xa0;        /* overlong */
        if (c == 0xed) hi = 0x9f;        /* surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0) lo = 0x90;        /* overlong */
        if (c == 0xf4) hi = 0x8f;        /* above U+10FFFF */
    } else {
        return -1;
    }
    for (int i = 1; i < len; i++) {
        if (i >= n) return 0;
        bool ok = i == 1 ? p[i] >= lo && p[i] <= hi : p[i] >= 0x80 && p[i] <= 0xbf;
        if (!ok) return -i;
    }
    return len;
}

typedef struct detok_out {
    char *out;
    int   cap, n;
} detok_out;

/* Whole characters only: if one does not fit it is dropped, never split. */
static void emit(detok_out *o, const void *s, int n) {
    if (o->n + n > o->cap) return;
    memcpy(o->out + o->n, s, (size_t)n);
    o->n += n;
}

void ht_detok_init(ht_detok *d, const ht_vocab *v) {
    d->v = v;
    d->n_pending = 0;
}

int ht_detok_push(ht_detok *d, int32_t id, char *out, int cap) {
    detok_out o = { .out = out, .cap = cap > 0 ? cap : 0, .n = 0 };
    const ht_vocab *v = d->v;
    if (id < 0 || id >= v->n_tokens) return 0;
    const unsigned char *p = (const unsigned char *)v->piece + v->piece_off[id];
    int n = (int)(v->piece_off[id + 1] - v->piece_off[id] - 1);
    int i = 0;

    /* finish the held-back character with the first bytes of this piece */
    if (d->n_pending) {
        unsigned char tmp[8];
        int np = d->n_pending, take = HR_MIN(n, 4 - np);
        memcpy(tmp, d->pending, (size_t)np);
        memcpy(tmp + np, p, (size_t)take);
        int r = utf8_classify(tmp, np + take);
        if (r == 0) {  /* still incomplete: the whole piece was consumed */
            memcpy(d->pending + np, p, (size_t)take);
            d->n_pending = np + take;
            return 0;
        }
        if (r > 0) {
            emit(&o, tmp, r);
            i = r - np;
        } else {
            /* the held bytes were a valid prefix, so the invalid subpart is exactly them */
            emit(&o, HT_REPLACEMENT, 3);
        }
        d->n_pending = 0;
    }

    while (i < n) {
        int r = utf8_classify(p + i, n - i);
        if (r > 0) {
            emit(&o, p + i, r);
            i += r;
        } else if (r == 0) {
            memcpy(d->pending, p + i, (size_t)(n - i));
            d->n_pending = n - i;
            break;
        } else {
            emit(&o, HT_REPLACEMENT, 3);
            i += -r;
        }
    }
    return o.n;
}

int ht_detok_flush(ht_detok *d, char *out, int cap) {
    detok_out o = { .out = out, .cap = cap > 0 ? cap : 0, .n = 0 };
    if (d->n_pending) emit(&o, HT_REPLACEMENT, 3);  /* a character the stream never finished */
    d->n_pending = 0;
    return o.n;
}
