/* mem: the residency manager — blocks of the mapping, the loader thread, the hook, figures (see mem.h) */
#include "mem.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14; older kernels answer EINVAL and we touch pages instead */
#endif

typedef struct hmem_span { uint64_t off, len; } hmem_span; /* bytes of the file, not page-rounded */

typedef struct hmem_blk {
    int32_t  layer;
    uint8_t  kind;        /* enum hm_block */
    bool     pinned;
    uint64_t loaded;      /* bytes made resident so far, in span order; under mu */
    int32_t  span0, n_span;
    uint64_t bytes;       /* page-rounded outward: what loading it makes resident */
} hmem_blk;

struct hmem {
    const hm_model *m;
    hm_shard        shard;
    const uint8_t  *base;       /* the mapping: file offset 0 */
    uint64_t        file_size;
    uint64_t        page;
    int             fd;
    hmem_plan       plan;
    hmem_params     params;     /* what the plan was made from (hmem_set_positions makes it again) */

    int         n;              /* blocks, in execution order */
    hmem_blk   *blk;
    int32_t    *layer_blk;      /* [n_layer]: index of the layer's attention block, or -1 (not the shard's) */
    int         n_out;          /* the output head's parts (hm_output_parts), the last blocks; 0: not the shard's */
    hmem_span  *spans;
    hmem_span  *res;            /* page-aligned union of all blocks, for mincore */
    int         n_res;
    unsigned char *vec;         /* mincore output */
    size_t      vec_pages;

    pthread_mutex_t mu;
    pthread_cond_t  cv_loader;  /* loader: something changed */
    pthread_cond_t  cv_ready;   /* hook: a block finished loading */
    pthread_t       thread;
    bool            thread_started, stop;
    int             pos;        /* next block to compute, or the one computing */
    bool            computing;  /* between BEGIN and END of block pos */
    bool            prefetch;   /* load ahead of compute (else only the block compute waits on) */
    uint64_t        room;       /* bytes for streamed blocks (hmem_plan.room_bytes) */
    uint64_t        streamed;   /* bytes of streamed blocks resident now; under mu */
    uint64_t       *allow;      /* loader scratch: how much of each block may be resident */
    bool            populate_ok;/* loader only */

    hmem_stats      st;         /* counters; under mu */
    int64_t         t_block;    /* hook: when the current block started computing */
    int64_t         t0_ns, read0;
    hmem_sample    *samples;
    int             n_samples, cap_samples;
};

static uint64_t round_down(uint64_t x, uint64_t p) { return x / p * p; }
static uint64_t round_up(uint64_t x, uint64_t p) { return (x + p - 1) / p * p; }
static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

static int cmp_span(const void *a, const void *b) {
    uint64_t x = ((const hmem_span *)a)->off, y = ((const hmem_span *)b)->off;
    return (x > y) - (x < y);
}

/* sorts spans and merges those that touch or are `gap` bytes apart; returns the new count */
static int merge_spans(hmem_span *s, int n, uint64_t gap) {
    if (n == 0) return 0;
    qsort(s, (size_t)n, sizeof *s, cmp_span);
    int k = 0;
    for (int i = 1; i < n; i++) {
        uint64_t end = s[k].off + s[k].len;
        if (s[i].off <= end + gap) {
            uint64_t e2 = s[i].off + s[i].len;
            if (e2 > end) s[k].len = e2 - s[k].off;
        } else s[++k] = s[i];
    }
    return k + 1;
}

/* ---- the mapping really is the file ------------------------------------------------------------ */

/* MADV_DONTNEED on anything but a file mapping would zero the weights, so the manager streams only
   after /proc/self/maps shows that the mapping at base is the file at path from offset 0 */
static int check_mapping(const uint8_t *base, const char *path, const struct stat *st, hr_err *err) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return hr_fail(err, HR_EIO, "cannot read /proc/self/maps to check the weights are a file mapping");
    char line[4096 + 256], real[PATH_MAX];
    bool have_real = realpath(path, real) != NULL;
    int rc = HR_EINVAL;
    while (fgets(line, sizeof line, f)) {
        unsigned long long lo, hi, off, ino;
        char perms[8];
        int name_at = 0;
        if (sscanf(line, "%llx-%llx %7s %llx %*s %llu %n", &lo, &hi, perms, &off, &ino, &name_at) < 5) continue;
        if ((uintptr_t)lo != (uintptr_t)base) continue;
        char *name = line + name_at;
        name[strcspn(name, "\n")] = 0;
        if (off == 0 && ((ino == (unsigned long long)st->st_ino && ino != 0) || (have_real && !strcmp(name, real))))
            rc = 0;
        break;
    }
    fclose(f);
    if (rc) return hr_fail(err, rc, "the model's weights are not a mapping of '%s'; refusing to stream them", path);
    return 0;
}

/* ---- loading and releasing (loader thread, without the lock) ----------------------------------- */

/* Makes bytes [from, to) of block b resident (offsets in the block's page-rounded spans, page
   multiples) and mapped, before compute needs them: MADV_POPULATE_READ, or a read per page. Not
   MADV_WILLNEED: on Linux 6.x it reads into single-page folios and ran at a third of the speed of
   the fault path's readahead, which builds large folios (docs/memory.md has the measurements). */
static int64_t load_range(hmem *h, const hmem_blk *b, uint64_t from, uint64_t to) {
    int64_t errs = 0;
    uint64_t pos = 0;
    for (int i = 0; i < b->n_span && pos < to; i++) {
        const hmem_span *s = &h->spans[b->span0 + i];
        uint64_t a = round_down(s->off, h->page), e = round_up(s->off + s->len, h->page), len = e - a;
        uint64_t lo = HR_MAX(from, pos), hi = HR_MIN(to, pos + len);
        if (lo < hi) {
            const uint8_t *p0 = h->base + a + (lo - pos);
            size_t n = (size_t)(hi - lo);
            bool done = false;
            if (h->populate_ok) {
                if (!madvise((void *)p0, n, MADV_POPULATE_READ)) done = true;
                else if (errno == EINVAL) h->populate_ok = false; /* kernel before 5.14 */
                else errs++;
            }
            if (!done) { /* one read per page faults it in (and maps it for the compute threads) */
                volatile const uint8_t *p = p0;
                uint8_t acc = 0;
                for (size_t o = 0; o < n; o += h->page) acc ^= p[o];
                (void)acc;
            }
        }
        pos += len;
    }
    return errs;
}

/* Page-cache folios can be up to 2 MiB (x86-64 PMD) and POSIX_FADV_DONTNEED skips a folio that
   is only partly inside its range, so a release limited to the block's own pages leaves about a
   folio at each edge behind (measured: ~2 MiB per block, 50 MiB over a 1B model's pass). */
#define HMEM_FOLIO_MAX ((uint64_t)2 << 20)

/* Releases block b (loader thread; it alone writes `loaded`, so reading it here needs no lock).
   Each span's edges reach out to the 2 MiB boundary unless a resident block's bytes lie in the way:
   a page shared with, or near, a block that is loaded or loading stays, so a block about to be
   computed never loses pages; bytes of blocks not resident, or of no block, may go. */
static int64_t release_block(hmem *h, const hmem_blk *b) {
    int64_t errs = 0;
    uint64_t file_end = round_up(h->file_size, h->page);
    for (int i = 0; i < b->n_span; i++) {
        const hmem_span *s = &h->spans[b->span0 + i];
        uint64_t lo = round_down(s->off, HMEM_FOLIO_MAX), hi = HR_MIN(round_up(s->off + s->len, HMEM_FOLIO_MAX), file_end);
        for (int j = 0; j < h->n; j++) {
            const hmem_blk *o = &h->blk[j];
            if (o == b || o->loaded == 0) continue;
            for (int k = 0; k < o->n_span; k++) {
                const hmem_span *t = &h->spans[o->span0 + k];
                uint64_t t_end = t->off + t->len;
                if (t_end <= s->off && t_end > lo) lo = round_up(t_end, h->page);
                if (t->off >= s->off + s->len && t->off < hi) hi = round_down(t->off, h->page);
            }
        }
        /* never less than the block's own whole pages */
        uint64_t a = HR_MIN(lo, round_up(s->off, h->page)), e = HR_MAX(hi, round_down(s->off + s->len, h->page));
        if (e <= a) continue;
        if (madvise((void *)(h->base + a), e - a, MADV_DONTNEED)) errs++;
        if (posix_fadvise(h->fd, (off_t)a, (off_t)(e - a), POSIX_FADV_DONTNEED)) errs++;
    }
    return errs;
}

/* The window: walking the streamed blocks from pos in execution order, each may be resident up to
   what is left of the room (the first one that does not fit, in part; the ones after it, not at
   all). Fills h->allow. */
static void plan_window(hmem *h) {
    uint64_t left = h->room;
    for (int k = 0; k < h->n; k++) {
        int i = (h->pos + k) % h->n;
        hmem_blk *b = &h->blk[i];
        if (b->pinned) { h->allow[i] = b->bytes; continue; }
        if (!h->prefetch && (k > 0 || !h->computing)) { h->allow[i] = 0; continue; }  /* on demand only */
        h->allow[i] = HR_MIN(b->bytes, round_down(left, h->page));
        left -= h->allow[i];
    }
}

static void *loader_main(void *arg) {
    hmem *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        plan_window(h);
        /* release first, so resident streamed bytes never exceed the room */
        int rel = -1;
        for (int i = 0; i < h->n && rel < 0; i++)
            if (!h->blk[i].pinned && h->blk[i].loaded > h->allow[i]) rel = i;
        if (rel >= 0) {
            hmem_blk *b = &h->blk[rel];
            uint64_t was = b->loaded;
            b->loaded = 0;
            h->streamed -= was;
            h->st.held_bytes -= was;
            pthread_mutex_unlock(&h->mu);
            int64_t errs = release_block(h, b);
            pthread_mutex_lock(&h->mu);
            h->st.n_releases++;
            h->st.released_bytes += was;
            h->st.n_errors += errs;
            continue;
        }
        /* then the next chunk: the first block from pos on that is not as resident as it may be,
           stopping where the window ends — a pinned block beyond it waits, because the kernel's
           readahead behind its pages would fill the streamed block after it (measured: ~19 MiB each,
           150 MiB over the budget during the first pass of a 1B model) */
        int todo = -1;
        for (int k = 0; k < h->n && todo < 0; k++) {
            int i = (h->pos + k) % h->n;
            if (h->blk[i].loaded < h->allow[i]) todo = i;
            else if (!h->blk[i].pinned && h->allow[i] < h->blk[i].bytes) break;
        }
        if (todo >= 0) {
            hmem_blk *b = &h->blk[todo];
            uint64_t from = b->loaded, to = HR_MIN(h->allow[todo], from + HMEM_CHUNK);
            /* counted as held before it is, so the figures never undercount; b->loaded (what the
               hook waits on) moves only once the pages are in */
            if (!b->pinned) h->streamed += to - from;
            HR_ASSERT(h->streamed <= h->room);
            h->st.held_bytes += to - from;
            h->st.held_peak = HR_MAX(h->st.held_peak, h->st.held_bytes);
            bool was_pinned = b->pinned;
            pthread_mutex_unlock(&h->mu);
            int64_t t0 = hr_time_ns();
            int64_t errs = load_range(h, b, from, to);
            int64_t dt = hr_time_ns() - t0;
            pthread_mutex_lock(&h->mu);
            /* a re-plan meanwhile (hmem_set_positions) moved only b->loaded between the pins and the
               room: the chunk in flight moves now */
            if (was_pinned && !b->pinned) h->streamed += to - from;
            else if (!was_pinned && b->pinned) h->streamed -= to - from;
            b->loaded = to;
            h->st.loaded_bytes += to - from;
            h->st.n_errors += errs;
            h->st.kind[b->kind].load_ns += dt;
            if (b->loaded == b->bytes) {
                h->st.n_loads++;
                h->st.kind[b->kind].n_loads++;
                pthread_cond_broadcast(&h->cv_ready);
            }
            continue;
        }
        pthread_cond_wait(&h->cv_loader, &h->mu);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* ---- the hook ------------------------------------------------------------------------------------ */

static int block_index(const hmem *h, int layer, enum hm_block block) {
    if (block == HM_BLOCK_OUTPUT) {
        const int k = layer - h->m->hp.n_layer;
        return k >= 0 && k < h->n_out ? h->n - h->n_out + k : -1;
    }
    if (layer < 0 || layer >= h->m->hp.n_layer || h->layer_blk[layer] < 0 || (block != HM_BLOCK_ATTN && block != HM_BLOCK_FFN))
        return -1;
    return h->layer_blk[layer] + (block == HM_BLOCK_FFN);
}

static void hmem_hook(void *user, int layer, enum hm_block block, enum hm_phase phase) {
    hmem *h = user;
    int i = block_index(h, layer, block);
    if (i < 0) return; /* not one of this shard's blocks: nothing to manage */
    hmem_blk *b = &h->blk[i];
    pthread_mutex_lock(&h->mu);
    if (phase == HM_PHASE_BEGIN) {
        h->st.kind[b->kind].n_begin++;
        if (h->plan.mode == HMEM_STREAM) {
            h->computing = true;
            if (h->pos != i || !h->prefetch) { h->pos = i; pthread_cond_signal(&h->cv_loader); }
            if (b->loaded < b->bytes) {
                int64_t t0 = hr_time_ns();
                h->st.n_waits++;
                while (b->loaded < b->bytes) pthread_cond_wait(&h->cv_ready, &h->mu);
                int64_t dt = hr_time_ns() - t0;
                h->st.wait_ns += dt;
                h->st.kind[b->kind].wait_ns += dt;
            }
        }
        h->t_block = hr_time_ns();
    } else {
        h->st.kind[b->kind].compute_ns += hr_time_ns() - h->t_block;
        if (h->plan.mode == HMEM_STREAM) {
            /* the window slides: the loader releases this block and loads the next one */
            h->pos = (i + 1) % h->n;
            h->computing = false;
            pthread_cond_signal(&h->cv_loader);
        }
    }
    pthread_mutex_unlock(&h->mu);
}

/* readahead of the device the file is on (/sys/class/bdi/MAJ:MIN/read_ahead_kb), 128 KiB if unknown */
static uint64_t file_readahead(const struct stat *st) {
    char path[96], buf[32];
    snprintf(path, sizeof path, "/sys/class/bdi/%u:%u/read_ahead_kb", major(st->st_dev), minor(st->st_dev));
    uint64_t kb = 128;
    FILE *f = fopen(path, "r");
    if (f) {
        unsigned long long v;
        if (fgets(buf, sizeof buf, f) && sscanf(buf, "%llu", &v) == 1 && v < (1ull << 30)) kb = v;
        fclose(f);
    }
    return kb * 1024;
}

/* ---- create / free ------------------------------------------------------------------------------- */

void hmem_free(hmem *h) {
    if (!h) return;
    if (h->thread_started) {
        pthread_mutex_lock(&h->mu);
        h->stop = true;
        pthread_cond_signal(&h->cv_loader);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->thread, NULL);
    }
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv_loader);
    pthread_cond_destroy(&h->cv_ready);
    if (h->fd >= 0) close(h->fd);
    free(h->blk);
    free(h->layer_blk);
    free(h->spans);
    free(h->res);
    free(h->vec);
    free(h->allow);
    free(h->samples);
    free(h);
}

/* the blocks of the shard in execution order and their spans of the file */
static int build_blocks(hmem *h, hr_err *err) {
    const hm_model *m = h->m;
    int nl = hm_shard_n_layers(&h->shard);
    h->n_out = h->shard.last ? hm_output_parts(m) : 0;
    h->n = 2 * nl + h->n_out;
    if (h->n == 0) return hr_fail(err, HR_EINVAL, "the shard has no blocks of weights to manage");
    enum { CAP = 16 };
    h->layer_blk = malloc((size_t)m->hp.n_layer * sizeof *h->layer_blk);
    h->blk = calloc((size_t)h->n, sizeof *h->blk);
    h->spans = calloc((size_t)h->n * CAP, sizeof *h->spans);
    h->res = calloc((size_t)h->n * CAP, sizeof *h->res);
    h->allow = calloc((size_t)h->n, sizeof *h->allow);
    if (!h->layer_blk || !h->blk || !h->spans || !h->res || !h->allow) return hr_fail(err, HR_ENOMEM, "out of memory");
    /* execution order: the windows' layers (attention, FFN), then the output head's parts */
    for (int il = 0; il < m->hp.n_layer; il++) h->layer_blk[il] = -1;
    for (int w = 0, i = 0; w < h->shard.n_windows; w++)
        for (int il = h->shard.windows[w].begin; il < h->shard.windows[w].end; il++, i += 2) {
            h->layer_blk[il] = i;
            h->blk[i] = (hmem_blk){.layer = il, .kind = HM_BLOCK_ATTN};
            h->blk[i + 1] = (hmem_blk){.layer = il, .kind = HM_BLOCK_FFN};
        }
    for (int k = 0; k < h->n_out; k++)
        h->blk[h->n - h->n_out + k] = (hmem_blk){.layer = m->hp.n_layer + k, .kind = HM_BLOCK_OUTPUT};
    uint64_t align = gguf_alignment(m->gguf);
    int ns = 0;
    for (int i = 0; i < h->n; i++) {
        hmem_blk *b = &h->blk[i];
        hm_range r[CAP];
        int nr = hm_block_ranges(m, &h->shard, b->layer, (enum hm_block)b->kind, r, CAP);
        if (nr > CAP) return hr_fail(err, HR_EUNSUPPORTED, "block %d of layer %d has %d tensors", b->kind, b->layer, nr);
        b->span0 = ns;
        for (int k = 0; k < nr; k++) {
            const uint8_t *p = r[k].ptr;
            if (r[k].len == 0) continue;
            if (p < h->base || (uint64_t)(p - h->base) > h->file_size || r[k].len > h->file_size - (uint64_t)(p - h->base))
                return hr_fail(err, HR_EINVAL, "layer %d: a tensor lies outside the mapped file", b->layer);
            h->spans[ns + b->n_span++] = (hmem_span){(uint64_t)(p - h->base), r[k].len};
        }
        /* tensors of a block that are only padding apart form one span */
        b->n_span = merge_spans(h->spans + ns, b->n_span, align);
        for (int k = 0; k < b->n_span; k++) {
            const hmem_span *s = &h->spans[ns + k];
            uint64_t a = round_down(s->off, h->page), e = round_up(s->off + s->len, h->page);
            b->bytes += e - a;
            h->res[h->n_res++] = (hmem_span){a, e - a};
        }
        ns += b->n_span;
    }
    h->n_res = merge_spans(h->res, h->n_res, 0);
    size_t maxp = 0;
    for (int k = 0; k < h->n_res; k++) maxp = HR_MAX(maxp, (size_t)(h->res[k].len / h->page));
    h->vec_pages = HR_MIN(maxp, (size_t)1 << 16); /* mincore in chunks of at most 256 MiB of 4K pages */
    h->vec = malloc(h->vec_pages ? h->vec_pages : 1);
    if (!h->vec) return hr_fail(err, HR_ENOMEM, "out of memory");
    return 0;
}

/* The plan for n_pos positions in use (hmem_plan_at) into h->plan, and the pins into the blocks.
   first: also works out the slack for readahead (else the plan's own is kept). Under h->mu or before
   the loader starts; a streamed block that becomes pinned (or the reverse) moves its resident bytes
   between the pins and the room. */
static int make_plan(hmem *h, uint64_t budget, int32_t n_pos, const struct stat *st, bool first, hr_err *err) {
    const hmem_params *p = &h->params;
    uint64_t *bytes = malloc((size_t)h->n * sizeof *bytes);
    uint8_t *kinds = malloc((size_t)h->n);
    bool *pinned = malloc((size_t)h->n * sizeof *pinned);
    hmem_plan pl;
    uint64_t slack = first ? 0 : h->plan.slack_bytes;
    int rc = bytes && kinds && pinned ? 0 : hr_fail(err, HR_ENOMEM, "out of memory");
    for (int i = 0; !rc && i < h->n; i++) { bytes[i] = h->blk[i].bytes; kinds[i] = h->blk[i].kind; }
    if (!rc) rc = hmem_plan_at(bytes, kinds, h->n, p, budget - slack, n_pos, pinned, &pl, err);
    if (!rc && first && pl.mode == HMEM_STREAM) {
        /* plan again without the slack for readahead (the kernel reads ahead of the loader's faults
           into pages the loader did not ask for yet); the whole context counts, so that the slack
           stays as the cache grows */
        uint64_t need = p->ctx_bytes + pl.largest_bytes;
        slack = 2 * file_readahead(st);
        slack = HR_MIN(slack, (budget - p->ctx_bytes) / 8);
        slack = HR_MIN(slack, budget - need); /* never what makes a workable budget fail */
        rc = hmem_plan_at(bytes, kinds, h->n, p, budget - slack, n_pos, pinned, &pl, err);
    }
    if (!rc) {
        pl.budget = budget;
        pl.slack_bytes = pl.mode == HMEM_STREAM ? slack : 0;
        for (int i = 0; i < h->n; i++) {
            hmem_blk *b = &h->blk[i];
            if (b->pinned && !pinned[i]) h->streamed += b->loaded;
            else if (!b->pinned && pinned[i]) h->streamed -= b->loaded;
            b->pinned = pinned[i];
        }
        h->plan = pl;
        h->room = pl.room_bytes;
    }
    free(bytes);
    free(kinds);
    free(pinned);
    return rc;
}

int hmem_set_positions(hmem *h, int32_t n_pos, hr_err *err) {
    if (!h || h->plan.mode != HMEM_STREAM || h->plan.pos_room <= 0 || n_pos <= h->plan.pos_room) return 0;
    pthread_mutex_lock(&h->mu);
    int32_t was_pos = h->plan.pos_room, was_pinned = h->plan.n_pinned;
    uint64_t was_bytes = h->plan.pinned_bytes;
    int rc = make_plan(h, h->plan.budget, n_pos, NULL, false, err);
    if (!rc) {
        h->st.n_replans++;
        pthread_cond_signal(&h->cv_loader); /* it releases what is no longer pinned */
    }
    pthread_mutex_unlock(&h->mu);
    if (rc) return rc;
    HR_LOGI("mem: the KV cache passed %d positions (%d in use): re-planned for %d, KV+scratch %.1f MiB, pinned %d -> %d "
            "blocks (%.1f -> %.1f MiB), streaming %.1f MiB per token", was_pos, n_pos, h->plan.pos_room,
            mib(h->plan.ctx_bytes), was_pinned, h->plan.n_pinned, mib(was_bytes), mib(h->plan.pinned_bytes),
            mib(h->plan.stream_bytes));
    return 0;
}

hmem *hmem_create(const hm_model *m, const hm_shard *shard, const char *path, const hmem_params *p, hr_err *err) {
    if (!m || !m->gguf || !path || !p) {
        hr_fail(err, HR_EINVAL, "hmem_create: model, file path and parameters are required");
        return NULL;
    }
    if (p->window < 1) {
        hr_fail(err, HR_EINVAL, "window must be at least 1 block (got %d)", (int)p->window);
        return NULL;
    }
    if ((unsigned)p->mode >= HMEM_MODE_COUNT || (unsigned)p->pin >= HMEM_PIN_COUNT) {
        hr_fail(err, HR_EINVAL, "unknown residency mode %d or pin policy %d", (int)p->mode, (int)p->pin);
        return NULL;
    }
    hmem *h = calloc(1, sizeof *h);
    if (!h) { hr_fail(err, HR_ENOMEM, "out of memory"); return NULL; }
    h->fd = -1;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv_loader, NULL);
    pthread_cond_init(&h->cv_ready, NULL);
    h->m = m;
    h->populate_ok = true;
    h->prefetch = p->prefetch;
    h->shard = shard ? hm_shard_normalize(m, shard) : hm_shard_full(m);
    if (hm_shard_validate(m, &h->shard, err)) goto fail;
    h->base = gguf_base(m->gguf);
    h->file_size = gguf_file_size(m->gguf);
    long pg = sysconf(_SC_PAGESIZE);
    h->page = pg > 0 ? (uint64_t)pg : 4096;
    if ((uintptr_t)h->base % h->page) {
        hr_fail(err, HR_EINVAL, "the model's weights are not page-aligned (not an mmap)");
        goto fail;
    }
    h->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (h->fd < 0) {
        hr_fail(err, errno == ENOENT ? HR_ENOTFOUND : HR_EIO, "cannot open '%s': %s", path, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(h->fd, &st)) { hr_fail(err, HR_EIO, "cannot stat '%s': %s", path, strerror(errno)); goto fail; }
    if ((uint64_t)st.st_size != h->file_size) {
        hr_fail(err, HR_EINVAL, "'%s' has %llu bytes but the model's file has %llu: not the file it was loaded from", path,
                (unsigned long long)st.st_size, (unsigned long long)h->file_size);
        goto fail;
    }
    if (build_blocks(h, err)) goto fail;

    hmem_sysmem sm;
    bool have_sm = hmem_sysmem_read(&sm, NULL) == 0;
    uint64_t budget = p->budget;
    if (!budget) {
        if (!have_sm) { hr_fail(err, HR_EIO, "no memory budget given and /proc/meminfo is unreadable"); goto fail; }
        budget = hmem_default_budget(&sm);
    }
    h->params = *p;
    if (make_plan(h, budget, 0, &st, true, err)) goto fail;

    h->t0_ns = hr_time_ns();
    h->read0 = hmem_proc_read_bytes();
    h->st.mem_total = have_sm ? sm.mem_total : 0;
    h->st.mem_available_start = h->st.mem_available_min = have_sm ? sm.mem_available : 0;
    if (h->plan.mode == HMEM_KEEP) {
        /* everything fits: ask for all of it now, in the background, and keep it */
        for (int k = 0; k < h->n_res; k++)
            if (madvise((void *)(h->base + h->res[k].off), h->res[k].len, MADV_WILLNEED)) h->st.n_errors++;
    } else if (h->plan.mode == HMEM_STREAM) {
        h->room = h->plan.room_bytes;
        /* the loader's faults then read 2 MiB folios and map them whole (PMD entries): on Linux 6.18, 8B Q4_K_M
           streaming 1.5 GB a token at 0.8 core (docs/memory.md, "Huge folios"), the loader spent 27 ms of CPU
           per GB instead of 72 and a token took 10% less. Advice only: a kernel without file THP ignores it */
#ifdef MADV_HUGEPAGE
        if (madvise((void *)h->base, round_up(h->file_size, h->page), MADV_HUGEPAGE)) HR_LOGD("mem: MADV_HUGEPAGE: %s", strerror(errno));
#endif
        if (check_mapping(h->base, path, &st, err)) goto fail;
        if (pthread_create(&h->thread, NULL, loader_main, h)) {
            hr_fail(err, HR_ENOMEM, "cannot start the loader thread");
            goto fail;
        }
        h->thread_started = true;
    }
    if (h->plan.mode == HMEM_STREAM && h->plan.window < HR_MIN(p->window, h->n))
        HR_LOGW("mem: a window of %d blocks does not fit the budget (%.1f MiB); using %d", (int)p->window,
                mib(h->plan.budget), h->plan.window);
    HR_LOGD("mem: %s, budget %.1f MiB (ctx %.1f), %d blocks %.1f MiB, window %d, pinned %d (%.1f MiB)",
            hmem_mode_name(h->plan.mode), mib(h->plan.budget), mib(h->plan.ctx_bytes), h->n, mib(h->plan.weight_bytes),
            h->plan.window, h->plan.n_pinned, mib(h->plan.pinned_bytes));
    return h;
fail:
    hmem_free(h);
    return NULL;
}

void hmem_attach(hmem *h, hm_shard *shard) {
    HR_ASSERT(h && shard);
    hm_shard n = hm_shard_normalize(h->m, shard);
    HR_ASSERT(n.n_windows == h->shard.n_windows && !memcmp(n.windows, h->shard.windows, sizeof n.windows[0] * (size_t)n.n_windows) &&
              n.last == h->shard.last);
    if (h->plan.mode == HMEM_OBSERVE) return;
    shard->weights = hmem_hook;
    shard->weights_user = h;
}

const hmem_plan *hmem_get_plan(const hmem *h) { return &h->plan; }

/* ---- figures ------------------------------------------------------------------------------------- */

static uint64_t resident_bytes(hmem *h) {
    uint64_t res = 0;
    for (int k = 0; k < h->n_res; k++) {
        uint64_t off = h->res[k].off, end = off + h->res[k].len;
        while (off < end) {
            size_t np = (size_t)HR_MIN((end - off) / h->page, (uint64_t)h->vec_pages);
            if (np == 0) break;
            if (mincore((void *)(h->base + off), np * h->page, h->vec)) return res;
            for (size_t i = 0; i < np; i++) res += h->vec[i] & 1;
            off += np * h->page;
        }
    }
    return res * h->page;
}

hmem_stats hmem_get_stats(const hmem *hc) {
    hmem *h = (hmem *)hc; /* the lock is not part of the value */
    pthread_mutex_lock(&h->mu);
    hmem_stats s = h->st;
    pthread_mutex_unlock(&h->mu);
    if (s.mem_total && s.mem_available_start > s.mem_available_min)
        s.pressure = (double)(s.mem_available_start - s.mem_available_min) / (double)s.mem_total;
    int64_t r = hmem_proc_read_bytes();
    s.disk_read_bytes = r >= 0 && h->read0 >= 0 ? r - h->read0 : -1;
    return s;
}

int hmem_take_sample(hmem *h, hmem_sample *out) {
    hmem_sample s = {0};
    s.t_ns = hr_time_ns() - h->t0_ns;
    s.resident = resident_bytes(h);
    int64_t r = hmem_proc_read_bytes();
    s.disk_read = r >= 0 && h->read0 >= 0 ? r - h->read0 : -1;
    uint64_t total = 0, avail = 0;
    bool have_mi = hmem_read_meminfo(&total, &avail) == 0;
    pthread_mutex_lock(&h->mu);
    s.held = h->st.held_bytes;
    s.loaded = h->st.loaded_bytes;
    s.wait_ns = h->st.wait_ns;
    if (have_mi) {
        s.mem_available = avail;
        if (!h->st.mem_total) h->st.mem_total = total;
        if (!h->st.mem_available_start) h->st.mem_available_start = h->st.mem_available_min = avail;
        h->st.mem_available_min = HR_MIN(h->st.mem_available_min, avail);
    }
    h->st.resident_peak = HR_MAX(h->st.resident_peak, s.resident);
    pthread_mutex_unlock(&h->mu);
    if (h->n_samples == h->cap_samples) {
        int nc = h->cap_samples ? 2 * h->cap_samples : 256;
        hmem_sample *ns = realloc(h->samples, (size_t)nc * sizeof *ns);
        if (!ns) return HR_ENOMEM;
        h->samples = ns;
        h->cap_samples = nc;
    }
    h->samples[h->n_samples++] = s;
    if (out) *out = s;
    return 0;
}

const hmem_sample *hmem_samples(const hmem *h, int *n) {
    *n = h->n_samples;
    return h->samples;
}

void hmem_summary(const hmem *h, char *buf, size_t cap) {
    const hmem_plan *p = &h->plan;
    hmem_stats s = hmem_get_stats(h);
    int n = p->mode == HMEM_OBSERVE
                ? snprintf(buf, cap, "mem: observe (plain mmap, no budget), weights %.1f MiB in %d blocks",
                           mib(p->weight_bytes), p->n_blocks)
                : snprintf(buf, cap, "mem: %s, budget %.1f MiB (KV+scratch %.1f), weights %.1f MiB in %d blocks",
                           hmem_mode_name(p->mode), mib(p->budget), mib(p->ctx_bytes), mib(p->weight_bytes), p->n_blocks);
    if (n < 0 || (size_t)n >= cap) return;
    if (p->mode == HMEM_STREAM)
        n += snprintf(buf + n, cap - (size_t)n,
                      ", window %d%s, pinned %d (%.1f MiB), streamed %.1f MiB/pass; loaded %.1f MiB, blocked %.1f ms",
                      p->window, h->prefetch ? "" : " (no prefetch)", p->n_pinned, mib(p->pinned_bytes), mib(p->stream_bytes), mib(s.loaded_bytes),
                      (double)s.wait_ns * 1e-6);
    if (n < 0 || (size_t)n >= cap) return;
    if (s.disk_read_bytes >= 0)
        n += snprintf(buf + n, cap - (size_t)n, ", disk read %.1f MiB", mib((uint64_t)s.disk_read_bytes));
    if (n < 0 || (size_t)n >= cap) return;
    if (s.mem_total) snprintf(buf + n, cap - (size_t)n, ", pressure %.2f%%", 100.0 * s.pressure);
}
