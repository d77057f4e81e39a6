/* cli/run-stats: per-device figures of a run, as JSON (see run-stats.h) */
#include "run-stats.h"

#include <jansson.h>
#include <stdlib.h>

typedef struct rs_sample {
    double   t_ms;             /* since the first sample */
    int32_t  tokens;           /* tokens in the pass */
    bool     gen;              /* a generation pass (after the prompt) */
    uint64_t resident;         /* weight bytes in memory after the pass */
    int64_t  disk_read;        /* bytes read from storage during the pass (-1 unknown) */
    int64_t  wait_ns;          /* blocked on weights during the pass */
} rs_sample;

typedef struct rs_dev {
    hc_dev_stats last;         /* the latest figures (cumulative block figures, pressure, peak) */
    hc_dev_stats phase;        /* summed since run_stats_phase */
    rs_sample   *s;
    int          n, cap;
} rs_dev;

struct run_stats {
    rs_dev  dev[HC_MAX_DEVICES];
    int     k;
    bool    gen;
    int64_t t0;
    int64_t mm_disk, mm_wait;  /* one device: cumulative at the previous sample */
};

run_stats *run_stats_create(void) { return calloc(1, sizeof(run_stats)); }

void run_stats_free(run_stats *rs) {
    if (!rs) return;
    for (int d = 0; d < HC_MAX_DEVICES; d++) free(rs->dev[d].s);
    free(rs);
}

void run_stats_end_prompt(run_stats *rs) { rs->gen = true; }

static int rs_push(rs_dev *d, rs_sample s) {
    if (d->n == d->cap) {
        int nc = d->cap ? 2 * d->cap : 256;
        rs_sample *nv = realloc(d->s, (size_t)nc * sizeof *nv);
        if (!nv) return HR_ENOMEM;
        d->s = nv;
        d->cap = nc;
    }
    d->s[d->n++] = s;
    return 0;
}

/* adds the counters of b to a (the run-time ones; the state ones are taken from b) */
static void rs_add(hc_dev_stats *a, const hc_dev_stats *b) {
    hc_dev_stats sum = *b;
    sum.evals += a->evals;
    sum.tokens += a->tokens;
    sum.compute_ns += a->compute_ns;
    sum.wait_ns += a->wait_ns;
    sum.send_ns += a->send_ns;
    sum.bytes_sent += a->bytes_sent;
    sum.bytes_received += a->bytes_received;
    sum.disk_read_bytes = a->disk_read_bytes < 0 || b->disk_read_bytes < 0 ? -1 : a->disk_read_bytes + b->disk_read_bytes;
    sum.weights_wait_ns += a->weights_wait_ns;
    *a = sum;
}

int run_stats_sample(run_stats *rs, hmem *mm, hc_head *tp, int n_tokens, hr_err *err) {
    int64_t now = hr_time_ns();
    if (!rs->t0) rs->t0 = now;
    double t_ms = (now - rs->t0) * 1e-6;
    if (tp) {
        hc_dev_stats st[HC_MAX_DEVICES];
        int k = hc_head_stats(tp, st, HC_MAX_DEVICES, err);
        if (k < 0) return k;
        rs->k = k;
        for (int d = 0; d < k; d++) {
            rs_dev *v = &rs->dev[d];
            rs_add(&v->phase, &st[d]);
            v->last = st[d];
            rs_sample s = {t_ms, n_tokens, rs->gen, st[d].resident_bytes, st[d].disk_read_bytes, st[d].weights_wait_ns};
            if (rs_push(v, s)) return hr_fail(err, HR_ENOMEM, "out of memory");
        }
        return 0;
    }
    rs->k = 1;
    rs_dev *v = &rs->dev[0];
    snprintf(v->last.name, sizeof v->last.name, "local");
    rs_sample s = {t_ms, n_tokens, rs->gen, 0, -1, 0};
    if (mm) {
        /* per pass: the cumulative figures' growth since the previous sample */
        hc_dev_stats_mem(&v->last, mm);
        v->last.n_layers = hmem_get_plan(mm)->n_blocks / 2;   /* 2 per layer (+ the output head) */
        s.resident = v->last.resident_bytes;
        s.disk_read = v->last.disk_read_bytes < 0 ? -1 : v->last.disk_read_bytes - rs->mm_disk;
        s.wait_ns = v->last.weights_wait_ns - rs->mm_wait;
        rs->mm_disk = v->last.disk_read_bytes;
        rs->mm_wait = v->last.weights_wait_ns;
    }
    if (rs_push(v, s)) return hr_fail(err, HR_ENOMEM, "out of memory");
    return 0;
}

int run_stats_phase(run_stats *rs, hc_dev_stats *out, int cap) {
    int k = HR_MIN(rs->k, cap);
    for (int d = 0; d < k; d++) {
        out[d] = rs->dev[d].phase;
        memset(&rs->dev[d].phase, 0, sizeof rs->dev[d].phase);
    }
    return k;
}

/* the lossy all-reduce's counters (cumulative over the session; docs/lossy.md) */
static json_t *rs_lossy(const hc_dev_stats *l) {
    json_t *o = json_object();
    const struct { const char *k; uint64_t v; } f[] = {
        {"datagrams_sent", l->dg_sent}, {"datagrams_dropped_by_hook", l->dg_hook_dropped},
        {"datagrams_send_failed", l->dg_send_fail}, {"datagrams_received", l->dg_received},
        {"datagrams_lost", l->dg_lost}, {"datagrams_late", l->dg_late}, {"datagrams_duplicate", l->dg_dup},
        {"datagrams_foreign", l->dg_foreign}, {"datagrams_malformed", l->dg_malformed},
        {"datagrams_auth_failed", l->dg_auth_failed},
        {"elements_lost", l->elems_lost}, {"allreduces", l->lossy_syncs}, {"elements_lost_max", l->elems_lost_max},
        {"sum_datagrams_sent", l->res_sent}, {"sum_datagrams_resent", l->res_resent},
        {"sum_datagrams_received", l->res_received}, {"nacks", l->nacks}, {"pass_ends_waited", l->settles}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) json_object_set_new(o, f[i].k, json_integer((json_int_t)f[i].v));
    json_object_set_new(o, "pass_ends_waited_ms", json_real(l->settle_ms));
    return o;
}

static json_t *rs_blocks(const hc_dev_stats *l) {
    json_t *o = json_object();
    static const char *const kind[2] = {"attn", "ffn"};
    for (int k = 0; k < 2; k++) {
        json_t *b = json_object();
        json_object_set_new(b, "n", json_integer(l->blk_n[k]));
        json_object_set_new(b, "compute_ms_per_block", json_real(l->blk_n[k] ? l->blk_compute_ns[k] * 1e-6 / l->blk_n[k] : 0));
        json_object_set_new(b, "loads", json_integer(l->blk_loads[k]));
        json_object_set_new(b, "load_ms_per_block", json_real(l->blk_loads[k] ? l->blk_load_ns[k] * 1e-6 / l->blk_loads[k] : 0));
        json_object_set_new(o, kind[k], b);
    }
    return o;
}

int run_stats_write(const run_stats *rs, const char *path, double prompt_ms, double gen_ms, hr_err *err) {
    json_t *root = json_object(), *devs = json_array();
    int64_t gen_tokens = 0, prompt_tokens = 0;
    if (rs->k > 0)
        for (int i = 0; i < rs->dev[0].n; i++) {
            if (rs->dev[0].s[i].gen) gen_tokens += rs->dev[0].s[i].tokens;
            else prompt_tokens += rs->dev[0].s[i].tokens;
        }
    for (int d = 0; d < rs->k; d++) {
        const rs_dev *v = &rs->dev[d];
        json_t *o = json_object(), *arr = json_array();
        int64_t disk = 0, wait = 0;
        bool disk_known = true;
        for (int i = 0; i < v->n; i++) {
            const rs_sample *s = &v->s[i];
            json_t *e = json_object();
            json_object_set_new(e, "t_ms", json_real(s->t_ms));
            json_object_set_new(e, "phase", json_string(s->gen ? "generation" : "prompt"));
            json_object_set_new(e, "tokens", json_integer(s->tokens));
            json_object_set_new(e, "resident_bytes", json_integer((json_int_t)s->resident));
            json_object_set_new(e, "disk_read_bytes", json_integer(s->disk_read));
            json_object_set_new(e, "weights_wait_ms", json_real(s->wait_ns * 1e-6));
            json_array_append_new(arr, e);
            if (!s->gen) continue;
            if (s->disk_read < 0) disk_known = false;
            else disk += s->disk_read;
            wait += s->wait_ns;
        }
        const hc_dev_stats *l = &v->last;
        json_object_set_new(o, "name", json_string(l->name));
        json_object_set_new(o, "n_layers", json_integer(l->n_layers));
        json_object_set_new(o, "budget_bytes", json_integer((json_int_t)l->budget));
        json_object_set_new(o, "stream_bytes_per_token", json_integer((json_int_t)l->stream_bytes));
        json_object_set_new(o, "room_bytes", json_integer((json_int_t)l->room_bytes));
        json_object_set_new(o, "resident_peak_bytes", json_integer((json_int_t)l->resident_peak));
        json_object_set_new(o, "pressure", json_real(l->pressure));
        json_object_set_new(o, "mem_replans", json_integer(l->mem_replans));
        json_object_set_new(o, "disk_read_bytes_per_token",
                            disk_known && gen_tokens ? json_real((double)disk / (double)gen_tokens) : json_null());
        json_object_set_new(o, "weights_wait_ms_per_token", json_real(gen_tokens ? wait * 1e-6 / (double)gen_tokens : 0));
        json_object_set_new(o, "blocks", rs_blocks(l));
        if (rs->k > 1) {
            char hx[20];
            snprintf(hx, sizeof hx, "%016llx", (unsigned long long)l->sum_hash);
            json_object_set_new(o, "sum_hash", json_string(hx));
            json_object_set_new(o, "lossy", rs_lossy(l));
        }
        json_object_set_new(o, "samples", arr);
        json_array_append_new(devs, o);
    }
    json_object_set_new(root, "prompt_tokens", json_integer(prompt_tokens));
    json_object_set_new(root, "generated_tokens", json_integer(gen_tokens));
    json_object_set_new(root, "prompt_ms", json_real(prompt_ms));
    json_object_set_new(root, "generation_ms", json_real(gen_ms));
    json_object_set_new(root, "ms_per_token", json_real(gen_tokens ? gen_ms / (double)gen_tokens : 0));
    json_object_set_new(root, "devices", devs);
    int rc = json_dump_file(root, path, JSON_INDENT(1));
    json_decref(root);
    if (rc) return hr_fail(err, HR_EIO, "cannot write '%s'", path);
    return 0;
}
