/* attention: RoPE, the KV cache store, and attention's numerics — see model-impl.h
 *
 * The cache holds K and V of each sequence's KV heads as rows of hd values, position after position
 * ([n_seq][n_kv][n_ctx][hd], F16 or F32).  The numerics are those of llama.cpp's CPU flash attention (below,
 * before hm_att_f32); RoPE angles are made by repeated float multiplication, as ggml's rope cache does.
 */
#include "model-impl.h"

#define HM_ATT_PF_POS 256 /* decode: cache rows per KV head a thread requests ahead of its heads (hm_att_warm) */

/* Attention for one (token, head): one pass over the cache with an online softmax (running max M,
   running sum S, running output acc), so K and V are each read once. Two numerics, chosen as
   llama.cpp's CPU flash attention (its default, against which hearth is tested) chooses them:
   - F32 path (a token whose sequence has >= HM_KV_TILE tokens in the batch, and always with an F32
     cache): q stays F32, an F16 cache is converted on load, scores are sequential sums over the head
     dimension, positions go in tiles of HM_KV_TILE with the softmax normalised per tile, the output
     accumulates in F32;
   - F16 path (fewer of its sequence's tokens in the batch, F16 cache): q is rounded to F16 for the
     dot with K, and the output is accumulated in F16, rounded after every position, as llama.cpp's
     per-row kernel does.
   Both are exact softmax attention; they differ only in rounding (~3e-4 relative on the logits). The
   choice is the token's sequence's, never the batch's: the other sequences of a batch do not change
   a token's numerics (hm_batch). */

/* F32 path for nq (<= HM_ATT_NQ) heads of one token that share a KV head (GQA): the scores of a tile
   for all of them in one kernel call (each K tile transposed once), each head's online softmax, then
   the values for all of them in one call (each V row read once); per head the steps of one head
   alone, in the same order. acc: [nq][hd], sc: [nq][HM_KV_TILE], q and out: nq heads of hd
   in a row. */
static void hm_att_f32(const hq_att_kernels *ak, int nq, const float *q, const uint8_t *kbase, const uint8_t *vbase,
                       size_t row, bool f16, int32_t npos, int hd, float scale, float *acc, float *sc, float *out) {
    float M[HM_ATT_NQ], S[HM_ATT_NQ];
    for (int j = 0; j < nq; j++) M[j] = -INFINITY, S[j] = 0.0f;
    memset(acc, 0, (size_t)nq * hd * sizeof(float));
    /* the loops over a tile's positions below run the HM_ATT_NQ heads' chains side by side (each
       head's running maximum and its double-precision sum, each in its own order as one head alone
       would), so that a step waits on its own head's previous step only; a group of fewer heads runs
       the missing ones over a tile of zeros */
    float pad[HM_ATT_NQ][HM_KV_TILE]; /* row j stands in for a missing head j */
    float *r[HM_ATT_NQ];
    for (int j = 0; j < HM_ATT_NQ; j++) r[j] = j < nq ? sc + j * HM_KV_TILE : pad[j];
    if (nq < HM_ATT_NQ) memset(pad, 0, sizeof pad);
    for (int32_t p0 = 0; p0 < npos; p0 += HM_KV_TILE) {
        int nt = HR_MIN(HM_KV_TILE, npos - p0);
        ak->kq(nt, hd, nq, q, (size_t)hd, kbase + (size_t)p0 * row, row, f16, sc, HM_KV_TILE); /* sequential sums over d */
        float tmax[HM_ATT_NQ];
        for (int j = 0; j < HM_ATT_NQ; j++) tmax[j] = -INFINITY;
        for (int i = 0; i < nt; i++)
#pragma GCC unroll 4
            for (int j = 0; j < HM_ATT_NQ; j++) {
                r[j][i] *= scale;
                tmax[j] = r[j][i] > tmax[j] ? r[j][i] : tmax[j];
            }
        for (int j = 0; j < nq; j++) {
            float *scj = sc + j * HM_KV_TILE, *accj = acc + (size_t)j * hd;
            if (tmax[j] > M[j]) {
                float ms = hq_expf(M[j] - tmax[j]);
                for (int d = 0; d < hd; d++) accj[d] *= ms;
                S[j] *= ms;
                M[j] = tmax[j];
            }
            const float mj = M[j];
            for (int i = 0; i < nt; i++) scj[i] -= mj;
            ak->exp(nt, scj, scj);
        }
        double sum[HM_ATT_NQ] = {0};
        for (int i = 0; i < nt; i++)
#pragma GCC unroll 4
            for (int j = 0; j < HM_ATT_NQ; j++) sum[j] += r[j][i];
        for (int j = 0; j < nq; j++) S[j] += (float)sum[j];
        ak->kv(nt, hd, nq, sc, HM_KV_TILE, vbase + (size_t)p0 * row, row, f16, acc, (size_t)hd);
    }
    for (int j = 0; j < nq; j++) {
        float inv = S[j] == 0.0f ? 0.0f : 1.0f / S[j];
        for (int d = 0; d < hd; d++) out[(size_t)j * hd + d] = acc[(size_t)j * hd + d] * inv;
    }
}

/* Requests the lines of K and V rows (one KV head's bytes of n positions, rows `row` apart) into L1,
   or into L2 (l2): in a decode a layer's cache was last read a whole token ago, so it comes from DRAM,
   a stride of rows the hardware prefetchers do not follow far enough ahead */
static inline void hm_att_prefetch(const uint8_t *k, const uint8_t *v, size_t row, int n, size_t bytes, bool l2) {
    for (int i = 0; i < n; i++)
        for (size_t b = 0; b < bytes; b += 64) {
            if (l2) {
                __builtin_prefetch(k + (size_t)i * row + b, 0, 2);
                __builtin_prefetch(v + (size_t)i * row + b, 0, 2);
            } else {
                __builtin_prefetch(k + (size_t)i * row + b, 0, 3);
                __builtin_prefetch(v + (size_t)i * row + b, 0, 3);
            }
        }
}

/* F16 path for nq (<= HM_ATT_NQ) heads of one token that share a KV head, a tile of positions at a
   time: the scores (q16 . k_p) of all of them in one kernel call (each K row widened once), then each
   head's online-softmax factors in order (m: the accumulator's rescale when the running max rises,
   else 1; w: the position's weight), then the accumulators' F16 steps over the tile in one call
   (each V row widened once).  Per head the steps of one head alone, position by position, in the
   same order.  q16, acc16: [nq][hd]; m, w: [nq][HM_KV_TILE]; q and out: nq heads of hd in a row. */
static void hm_att_f16(const hq_att_kernels *ak, int nq, const float *q, const uint8_t *kbase, const uint8_t *vbase,
                       size_t row, int32_t npos, int hd, float scale, hr_fp16 *q16, hr_fp16 *acc16, float *m,
                       float *w, float *out) {
    float M[HM_ATT_NQ], S[HM_ATT_NQ];
    for (int j = 0; j < nq; j++) M[j] = -INFINITY, S[j] = 0.0f;
    hq_get_traits(HQ_TYPE_F16)->from_float(q, q16, (int64_t)nq * hd); /* hr_fp32_to_fp16's bits */
    memset(acc16, 0, (size_t)nq * hd * sizeof(hr_fp16));
    for (int32_t p0 = 0; p0 < npos; p0 += HM_KV_TILE) {
        const int nt = HR_MIN(HM_KV_TILE, npos - p0);
        hm_att_prefetch(kbase + (size_t)p0 * row, vbase + (size_t)p0 * row, row, nt, (size_t)hd * sizeof(hr_fp16), false);
        ak->kq16(nt, hd, nq, q16, (size_t)hd, kbase + (size_t)p0 * row, row, w, HM_KV_TILE);
        /* the running maxima's steps first, each position's one exponential's argument in w (rises:
           it is the rescale's), then the exponentials in one call per head, then the running sums;
           the heads side by side, so that each step waits on its own head's previous one only */
        bool rises[HM_ATT_NQ][HM_KV_TILE];
        for (int i = 0; i < nt; i++)
            for (int j = 0; j < nq; j++) {
                float *wj = w + j * HM_KV_TILE;
                const float s = wj[i] * scale;
                rises[j][i] = s > M[j];
                wj[i] = rises[j][i] ? M[j] - s : s - M[j];
                M[j] = rises[j][i] ? s : M[j];
            }
        for (int j = 0; j < nq; j++) ak->exp(nt, w + j * HM_KV_TILE, w + j * HM_KV_TILE);
        for (int i = 0; i < nt; i++)
            for (int j = 0; j < nq; j++) {
                float *mj = m + j * HM_KV_TILE, *wj = w + j * HM_KV_TILE;
                mj[i] = rises[j][i] ? wj[i] : 1.0f;
                wj[i] = rises[j][i] ? 1.0f : wj[i];
                S[j] = S[j] * mj[i] + wj[i];
            }
        ak->acc16(nt, hd, nq, acc16, (size_t)hd, vbase + (size_t)p0 * row, row, m, w, HM_KV_TILE);
    }
    for (int j = 0; j < nq; j++) {
        const float inv = S[j] == 0.0f ? 0.0f : 1.0f / S[j];
        for (int d = 0; d < hd; d++) out[(size_t)j * hd + d] = hr_fp16_to_fp32(acc16[(size_t)j * hd + d]) * inv;
    }
}

/* Thread ith's items [w0, w1) of the n * nh (token, head) items of a batch, in order: contiguous
   ranges of equal cost, an item of token t costing its pos[t] + 1 positions. (Equal item counts
   gave the second of two threads 3/4 of a 512-token prompt's attention, the first waiting.) */
static void hm_att_split(int n, int nh, const int32_t *pos, int ith, int nth, int64_t *w0, int64_t *w1) {
    double total = 0;
    for (int t = 0; t < n; t++) total += (double)(pos[t] + 1);
    int64_t bound[2];
    for (int e = 0; e < 2; e++) {
        const int i = ith + e;
        if (i == 0 || i == nth) { bound[e] = i == 0 ? 0 : (int64_t)n * nh; continue; }
        const double target = total * i / nth;   /* in positions per head */
        double cum = 0;
        int t = 0;
        while (t < n - 1 && cum + (pos[t] + 1) <= target) cum += (double)(pos[t] + 1), t++;
        int64_t h = (int64_t)((target - cum) / (pos[t] + 1) * nh + 0.5);
        bound[e] = (int64_t)t * nh + HR_MIN(h, (int64_t)nh);
    }
    *w0 = bound[0];
    *w1 = HR_MAX(bound[0], bound[1]);
}

void hm_att_worker(void *arg, int ith, int nth) {
    hm_att_job *j = arg;
    hm_ctx *c = j->c;
    const hm_hparams *hp = &c->m->hp;
    int hd = hp->head_dim, nh = c->nh, gqa = hp->n_head / hp->n_head_kv;
    const int64_t Dq = c->Dq;
    const float scale = 1.0f / sqrtf((float)hd);
    /* scratch: F32 path acc [HM_ATT_NQ][hd] and sc [HM_ATT_NQ][HM_KV_TILE]; the F16 path's q16 and acc16
       ([HM_ATT_NQ][hd] each, in acc's place), m (in sc's place) and w [HM_ATT_NQ][HM_KV_TILE] */
    float *acc = (float *)(c->att_scratch + (size_t)ith * c->att_scratch_stride);
    float *sc = acc + HM_ATT_NQ * hd, *sw = sc + HM_ATT_NQ * HM_KV_TILE;
    hr_fp16 *q16 = (hr_fp16 *)acc, *acc16 = q16 + HM_ATT_NQ * hd;
    const uint8_t *K = c->k_cache[j->li], *V = c->v_cache[j->li];
    const size_t es = c->kv_esize, row = (size_t)hd * es;
    bool f16 = c->kv_type == HQ_TYPE_F16;
    const hq_att_kernels *ak = hq_get_att(false);
    int64_t w0, w1;
    hm_att_split(j->n, nh, c->tpos, ith, nth, &w0, &w1);
    for (int64_t w = w0, g = 1; w < w1; w += g) {
        int t = (int)(w / nh), h = (int)(w % nh), kvh = h / gqa;
        int32_t npos = c->tpos[t] + 1;  /* causal: its sequence's positions 0..pos */
        bool f16_path = f16 && !c->tf32[t];
        const float *q = c->q + (int64_t)t * Dq + (int64_t)h * hd;
        const uint8_t *kb = K + hm_kv_off(c, c->tseq[t], kvh, 0), *vb = V + hm_kv_off(c, c->tseq[t], kvh, 0);
        float *out = c->att + (int64_t)t * Dq + (int64_t)h * hd;
        /* this head and the next heads of this token on the same KV head, in this thread's range */
        g = 1;
        while (g < HM_ATT_NQ && w + g < w1 && h + g < nh && (h + g) / gqa == kvh) g++;
        if (f16_path) hm_att_f16(ak, (int)g, q, kb, vb, row, npos, hd, scale, q16, acc16, sc, sw, out);
        else hm_att_f32(ak, (int)g, q, kb, vb, row, f16, npos, hd, scale, acc, sc, out);
    }
}

/* Each thread of a decode's QKV matmul job ends its share with this: it requests into L2 the first
   HM_ATT_PF_POS cache rows of each KV head its attention heads will read (hm_att_worker's split),
   thread 0 also the rows the new position's K and V go to (hm_qk_worker's stores).  Those lines come
   from DRAM: a token's weight stream evicts the whole cache between two uses of a layer, and its 1 KiB
   stride of rows (before the cache was laid out per KV head) was not one the hardware prefetchers
   followed.  Requested here, their latency overlaps with the other thread's last rows, the RoPE and
   the KV stores, not with the attention's own work: at two threads, Llama-3.2-1B Q4_K_M, 128 tokens
   from position 0, the attention step (RoPE, stores, the heads) took ~0.50-0.61 -> 0.41-0.45 ms a
   token, the stores alone ~3.5 -> ~0.7 us a layer (each a DRAM read for ownership). */
void hm_att_warm(const void *arg, int ith, int nth) {
    const hm_att_job *j = arg;
    const hm_ctx *c = j->c;
    const int hd = c->m->hp.head_dim, nh = c->nh, gqa = c->m->hp.n_head / c->m->hp.n_head_kv;
    const uint8_t *K = c->k_cache[j->li], *V = c->v_cache[j->li];
    const size_t row = (size_t)hd * c->kv_esize;
    const int32_t s = c->tseq[0], pos = c->tpos[0];
    if (ith == 0)
        for (int h = 0; h < c->nkv; h++)
            hm_att_prefetch(K + hm_kv_off(c, s, h, pos), V + hm_kv_off(c, s, h, pos), row, 1, row, true);
    int64_t w0, w1;
    hm_att_split(1, nh, c->tpos, ith, nth, &w0, &w1);
    const int32_t np = HR_MIN(pos, HM_ATT_PF_POS);
    for (int64_t w = w0; w < w1; w++) {
        const int h = (int)(w % nh);
        if (w > w0 && h % gqa) continue; /* once per KV head */
        hm_att_prefetch(K + hm_kv_off(c, s, h / gqa, 0), V + hm_kv_off(c, s, h / gqa, 0), row, np, row, true);
    }
}

/* RoPE on one head vector in place: llama rotates adjacent pairs, NeoX rotates the two halves */
static inline __attribute__((always_inline)) void hm_rope_hd(float *restrict x, const float *restrict cs, int hd,
                                                              bool neox) {
    const int half = hd / 2;
    if (neox) {
        for (int i = 0; i < half; i++) {
            const float cth = cs[2 * i], sth = cs[2 * i + 1], x0 = x[i], x1 = x[i + half];
            x[i] = x0 * cth - x1 * sth;
            x[i + half] = x0 * sth + x1 * cth;
        }
    } else {
        for (int i = 0; i < half; i++) {
            const float cth = cs[2 * i], sth = cs[2 * i + 1], x0 = x[2 * i], x1 = x[2 * i + 1];
            x[2 * i] = x0 * cth - x1 * sth;
            x[2 * i + 1] = x0 * sth + x1 * cth;
        }
    }
}
/* the common head sizes as constants, so that the compiler vectorizes their loops (a variable count
   and one loop choosing its indices per pair did not vectorize: ~1.5 ns a pair, RoPE ~30 us of a
   Llama-3.2-1B token) */
static void hm_rope(float *restrict x, const float *restrict cs, int hd, bool neox) {
    if (hd == 64) hm_rope_hd(x, cs, 64, neox);
    else if (hd == 128) hm_rope_hd(x, cs, 128, neox);
    else hm_rope_hd(x, cs, hd, neox);
}

/* biases, q/k norms, RoPE, and the KV cache store, per token */
void hm_qk_worker(void *arg, int ith, int nth) {
    hm_qk_job *j = arg;
    hm_ctx *c = j->c;
    const hm_hparams *hp = &c->m->hp;
    const hm_layer *L = j->L;
    int hd = hp->head_dim, nh = c->nh, nkv = c->nkv;
    int64_t Dq = c->Dq, Dkv = c->Dkv;
    int64_t t0, t1;
    hr_split(j->n, ith, nth, 1, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        float *q = c->q + t * Dq, *k = c->k + t * Dkv, *v = c->v + t * Dkv;
        if (L->bq.data) {
            const float *bq = L->bq.data, *bk = L->bk.data, *bv = L->bv.data;
            for (int64_t i = 0; i < Dq; i++) q[i] += bq[i];
            for (int64_t i = 0; i < Dkv; i++) k[i] += bk[i];
            for (int64_t i = 0; i < Dkv; i++) v[i] += bv[i];
        }
        const float *cs = c->rope_cs + t * hd;
        for (int h = 0; h < nh; h++) {
            if (L->q_norm.data) hm_rmsnorm(q + h * hd, q + h * hd, L->q_norm.data, hd, hp->rms_eps);
            hm_rope(q + h * hd, cs, hd, hp->rope_neox);
        }
        for (int h = 0; h < nkv; h++) {
            if (L->k_norm.data) hm_rmsnorm(k + h * hd, k + h * hd, L->k_norm.data, hd, hp->rms_eps);
            hm_rope(k + h * hd, cs, hd, hp->rope_neox);
        }
        /* the dispatched F32 -> F16 rows: hr_fp32_to_fp16's bits */
        const hq_from_float_fn to16 = hq_get_traits(HQ_TYPE_F16)->from_float;
        for (int h = 0; h < nkv; h++) { /* KV head h's row at the token's position in its sequence */
            uint8_t *K = c->k_cache[j->li] + hm_kv_off(c, c->tseq[t], h, c->tpos[t]);
            uint8_t *V = c->v_cache[j->li] + hm_kv_off(c, c->tseq[t], h, c->tpos[t]);
            if (c->kv_type == HQ_TYPE_F16) {
                to16(k + h * hd, K, hd);
                to16(v + h * hd, V, hd);
            } else {
                memcpy(K, k + h * hd, (size_t)hd * 4);
                memcpy(V, v + h * hd, (size_t)hd * 4);
            }
        }
    }
}

/* cos/sin of each token's RoPE angles: theta_i = pos * base^(-2i/hd) / freq_factor_i, computed by
   repeated multiplication in float as ggml's rope cache does */
void hm_rope_cache(hm_ctx *c, int n) {
    const hm_hparams *hp = &c->m->hp;
    int hd = hp->head_dim;
    const float theta_scale = powf(hp->rope_base, -2.0f / (float)hd);
    const float *ff = c->m->rope_freqs.data;
    for (int t = 0; t < n; t++) {
        float theta = (float)c->tpos[t];
        float *cs = c->rope_cs + (int64_t)t * hd;
        for (int i = 0; i < hd / 2; i++) {
            float th = ff ? theta / ff[i] : theta;
            cs[2 * i] = cosf(th);
            cs[2 * i + 1] = sinf(th);
            theta *= theta_scale;
        }
    }
}
