/* mem: a device's memory request (--mem-budget, --window, --no-prefetch) turned into a manager (see mem.h) */
#include "mem.h"

#include "quant/quant.h"

int hmem_load_weights(const hmem *h, hm_model *m, const hm_shard *shard, bool use_mmap, bool no_repack, hr_err *err) {
    /* OBSERVE is --mem-budget off, "plain mmap": its figures are the mapping's */
    if (use_mmap || (h && hmem_get_plan(h)->mode != HMEM_KEEP)) return 0;
    if (!h) { /* no manager: load only what fits the default budget, else the mapping pages as it can */
        hmem_sysmem s;
        hr_err e = {0};
        if (hmem_sysmem_read(&s, &e) || hm_model_weight_bytes(m) > hmem_default_budget(&s)) return 0;
    }
    uint64_t copied = 0, packed = 0;
    const int64_t t0 = hr_time_ns();
    if (hm_model_load_weights(m, shard, !no_repack, &copied, &packed, err)) return err->code;
    if (copied)
        HR_LOGI("weights: %.1f MiB loaded into memory (%.1f MiB of it packed for the %s kernels) in %.0f ms",
                copied / 1048576.0, packed / 1048576.0, hq_simd_name(), (hr_time_ns() - t0) / 1e6);
    return 0;
}

int hmem_setup(const hm_model *m, hm_shard *shard, const char *path, const hmem_request *rq, uint64_t ctx_bytes,
               hmem **out, hr_err *err) {
    return hmem_setup_kv(m, shard, path, rq, ctx_bytes, 0, 0, out, err);
}

int hmem_setup_kv(const hm_model *m, hm_shard *shard, const char *path, const hmem_request *rq, uint64_t ctx_bytes,
                  uint64_t ctx_base_bytes, int32_t n_ctx, hmem **out, hr_err *err) {
    *out = NULL;
    if (hmem_check_ctx(ctx_bytes, err)) return err->code;
    hmem_params p = hmem_default_params();
    p.budget = rq->bytes;
    p.window = rq->window > 0 ? rq->window : 2;
    p.ctx_bytes = ctx_bytes;
    p.n_ctx = n_ctx;
    p.ctx_base_bytes = HR_MIN(ctx_base_bytes, ctx_bytes);
    if (rq->off) {
        /* plain mmap: a manager that only observes, so that the figures still exist */
        p.mode = HMEM_OBSERVE;
        hr_err e = {0};
        *out = hmem_create(m, shard, path, &p, &e);
        if (!*out) HR_LOGD("mem: no figures for plain mmap: %s", e.msg);
        return 0;
    }
    p.prefetch = !rq->no_prefetch;
    hr_err e = {0};
    hmem *h = hmem_create(m, shard, path, &p, &e);
    if (!h) {
        /* the default budget is a convenience: without it the weights stay plain mmap */
        if (!rq->given) {
            HR_LOGD("mem: no residency manager: %s", e.msg);
            return 0;
        }
        return hr_fail(err, e.code ? e.code : HR_EINVAL, "%s", e.msg);
    }
    const hmem_plan *pl = hmem_get_plan(h);
    if (pl->mode == HMEM_STREAM && pl->pos_room > 0)
        HR_LOGI("mem: %.1f MiB of weights and a KV cache of %d positions do not fit the budget of %.1f MiB: planned "
                "for the first %d positions (KV+scratch %.1f MiB), %d of %d blocks pinned, streaming %.1f MiB per "
                "token; re-planned as the cache grows", pl->weight_bytes / 1048576.0, n_ctx, pl->budget / 1048576.0,
                pl->pos_room, pl->ctx_bytes / 1048576.0, pl->n_pinned, pl->n_blocks, pl->stream_bytes / 1048576.0);
    else if (pl->mode == HMEM_STREAM)
        HR_LOGI("mem: %.1f MiB of weights do not fit the budget of %.1f MiB: streaming %.1f MiB per token, "
                "%d of %d blocks pinned", pl->weight_bytes / 1048576.0, pl->budget / 1048576.0,
                pl->stream_bytes / 1048576.0, pl->n_pinned, pl->n_blocks);
    hmem_attach(h, shard);
    *out = h;
    return 0;
}
