/* SentencePiece ("llama" vocabularies) tokenization, with the same results as llama.cpp's
   llm_tokenizer_spm:
     1. spaces become U+2581 and, when asked (add_space_prefix, see ht_tokenize_ex), one U+2581 goes
        in front;
     2. the text is split into UTF-8 characters (a stray byte is a character of its own);
     3. repeatedly, of all adjacent symbol pairs whose concatenation is a token, the one whose token
        has the highest score is merged (ties: the leftmost pair) — a binary heap of candidate pairs
        whose stale entries are skipped when popped, so the whole run is O(n log n), and per word
        where the vocabulary guarantees that no merge crosses into a following '▁';
     4. each final symbol is its token, or, if the vocabulary lacks it (only single characters can
        be missing, since merges only form tokens), one <0xNN> byte token per byte (byte fallback),
        or the unknown token where the vocabulary has no byte tokens.
   User-defined and (when asked) control tokens never reach this: ht_tokenize_ex cuts them out of
   the text first, and passes each plain piece with or without the space prefix. */
#include "text-impl.h"

#include <stdlib.h>

typedef struct spm_sym {
    int32_t  prev, next;  /* neighbours in the chain, -1 at the ends */
    uint32_t off, n;      /* bytes [off, off + n) of the escaped text; n == 0 once merged away */
} spm_sym;

/* A queued pair. The heap order (higher score first, then the pair further left) is folded into
   one integer so the heap compares keys only: score as an order-preserving u32 in the high half,
   the bitwise-complemented left index in the low half. */
typedef struct spm_pair {
    uint64_t key;
    int32_t  right;
    uint32_t size;        /* bytes of left + right when the pair was queued, to detect staleness */
} spm_pair;

static inline uint64_t spm_key(float score, int32_t left) {
    if (score == 0.0f) score = 0.0f;  /* -0 ties with +0, as the float compare it replaces */
    uint32_t u = hr_f32_to_bits(score);
    u = (u & 0x80000000u) ? ~u : u | 0x80000000u;
    return (uint64_t)u << 32 | (uint32_t)~(uint32_t)left;
}

static inline int32_t spm_key_left(uint64_t key) { return (int32_t)~(uint32_t)key; }

typedef struct spm_heap {
    spm_pair *a;
    size_t    n, cap;
} spm_heap;

static inline bool spm_before(const spm_pair *x, const spm_pair *y) { return x->key > y->key; }

static int spm_heap_push(spm_heap *h, spm_pair p) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        spm_pair *a = realloc(h->a, cap * sizeof *a);
        if (!a) return HR_ENOMEM;
        h->a = a;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!spm_before(&p, &h->a[parent])) break;
        h->a[i] = h->a[parent];
        i = parent;
    }
    h->a[i] = p;
    return 0;
}

static spm_pair spm_heap_pop(spm_heap *h) {
    spm_pair top = h->a[0];
    spm_pair last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && spm_before(&h->a[c + 1], &h->a[c])) c++;
        if (!spm_before(&h->a[c], &last)) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n) h->a[i] = last;
    return top;
}

typedef struct spm_state {
    const ht_vocab *v;
    const char     *buf;  /* escaped text */
    spm_sym        *sym;
    spm_heap        heap;
} spm_state;

/* Queues left+right if their concatenation (contiguous in buf) is a token. */
static int spm_try_pair(spm_state *st, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return 0;
    const spm_sym *l = &st->sym[left], *r = &st->sym[right];
    uint32_t size = l->n + r->n;
    int32_t id = ht_vocab_lookup(st->v, st->buf + l->off, size);
    if (id < 0) return 0;
    spm_pair p = { .key = spm_key(st->v->score[id], left), .right = right, .size = size };
    return spm_heap_push(&st->heap, p);
}

/* Bytes of the UTF-8 character that starts with byte c, judged by its top four bits as
   SentencePiece does: continuation and invalid lead bytes count as one-byte characters. */
static inline uint32_t spm_utf8_len(unsigned char c) {
    static const uint8_t len[16] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4 };
    return len[c >> 4];
}

static inline bool spm_is_space(const spm_state *st, const spm_sym *s) {
    return s->n == HT_SPM_SPACE_LEN && memcmp(st->buf + s->off, HT_SPM_SPACE, HT_SPM_SPACE_LEN) == 0;
}

/* Steps 3 and 4 on the symbols [first, end), which no token spans out of. */
static int spm_segment(spm_state *st, int32_t first, int32_t end, ht_tokout *o) {
    const ht_vocab *v = st->v;
    spm_sym *sym = st->sym;
    int rc;
    sym[first].prev = -1;
    sym[end - 1].next = -1;
    st->heap.n = 0;
    for (int32_t i = first + 1; i < end; i++)
        if ((rc = spm_try_pair(st, i - 1, i)) < 0) return rc;
    while (st->heap.n) {
        spm_pair p = spm_heap_pop(&st->heap);
        int32_t left = spm_key_left(p.key);
        spm_sym *l = &sym[left], *r = &sym[p.right];
        /* stale: one side was merged into something else since the pair was queued */
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = left;
        if ((rc = spm_try_pair(st, l->prev, left)) < 0) return rc;
        if ((rc = spm_try_pair(st, left, l->next)) < 0) return rc;
    }

    for (int32_t i = first; i != -1; i = sym[i].next) {
        const spm_sym *s = &sym[i];
        int32_t id = ht_vocab_lookup(v, st->buf + s->off, s->n);
        if (id >= 0) { ht_tokout_push(o, id); continue; }
        for (uint32_t k = 0; k < s->n; k++) {
            int32_t b = v->byte_tok[(unsigned char)st->buf[s->off + k]];
            if (b < 0) return HR_EUNSUPPORTED;  /* no byte tokens and no <unk> */
            ht_tokout_push(o, b);
        }
    }
    return 0;
}

int ht_spm_tokenize(const ht_vocab *v, const char *text, size_t len, bool space_prefix, ht_tokout *o) {
    /* Like llama.cpp: empty text gives no tokens (not even the space prefix). */
    if (len == 0) return 0;

    size_t n_space = 0;
    for (size_t i = 0; i < len; i++) n_space += text[i] == ' ';
    size_t esz = len + n_space * (HT_SPM_SPACE_LEN - 1) + (space_prefix ? HT_SPM_SPACE_LEN : 0);

    int rc = 0;
    spm_state st = { .v = v };
    char *buf = malloc(esz);
    st.sym = malloc(esz * sizeof *st.sym);
    if (!buf || !st.sym) { rc = HR_ENOMEM; goto done; }
    st.buf = buf;

    /* 1. escape */
    size_t e = 0;
    if (space_prefix) { memcpy(buf, HT_SPM_SPACE, HT_SPM_SPACE_LEN); e = HT_SPM_SPACE_LEN; }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') { memcpy(buf + e, HT_SPM_SPACE, HT_SPM_SPACE_LEN); e += HT_SPM_SPACE_LEN; }
        else buf[e++] = text[i];
    }

    /* 2. characters */
    int32_t n_sym = 0;
    for (size_t off = 0; off < esz;) {
        uint32_t n = spm_utf8_len((unsigned char)buf[off]);
        if (n > esz - off) n = (uint32_t)(esz - off);
        st.sym[n_sym] = (spm_sym){ .prev = n_sym - 1, .next = n_sym + 1, .off = (uint32_t)off, .n = n };
        n_sym++;
        off += n;
    }

    /* 3, 4. merges, then ids. When the vocabulary allows it (ht_vocab.spm_words), every '▁' that
       follows another character starts a new word that no merge can cross, so each word gets its
       own small heap: same result, several times faster on long text. */
    int32_t first = 0;
    if (v->spm_words) {
        for (int32_t i = 1; i < n_sym; i++) {
            if (spm_is_space(&st, &st.sym[i]) && !spm_is_space(&st, &st.sym[i - 1])) {
                if ((rc = spm_segment(&st, first, i, o)) < 0) goto done;
                first = i;
            }
        }
    }
    rc = spm_segment(&st, first, n_sym, o);

done:
    free(st.heap.a);
    free(st.sym);
    free(buf);
    return rc;
}
