/* hearth perplexity: perplexity of a text in llama-perplexity's manner (same chunks, scoring, output and
   uncertainty, so figures compare), its KL-divergence mode against a saved base run, and the lossy-link
   simulation of docs/lossy.md */
#include "cli.h"

#include "engine.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

enum { PPL_MAX_BYTES = 256 << 20 };
static const char ppl_magic[8] = {'H', 'R', 'T', 'H', 'K', 'L', 'D', '1'};

/* sums over the scored tokens, as llama-perplexity keeps them */
typedef struct ppl_stats {
    double nll, nll2, nll_base, nll_base2, nll_nll_base, kld, kld2, p_diff2, p_diff4;
    double kld_max;
    uint64_t count, same_top;
} ppl_stats;

/* log-softmax of a row of logits: out[i] = l[i] - lse; returns the index of the largest logit */
static int ppl_log_softmax(const float *l, int64_t V, float *out) {
    int imax = 0;
    for (int64_t i = 1; i < V; i++)
        if (l[i] > l[imax]) imax = (int)i;
    const float mx = l[imax];
    double sum = 0;
    for (int64_t i = 0; i < V; i++) sum += expf(l[i] - mx);
    const float lse = mx + (float)log(sum);
    for (int64_t i = 0; i < V; i++) out[i] = l[i] - lse;
    return imax;
}

/* mean and its standard error, as llama-perplexity's mean_and_uncertainty */
static void ppl_mean_unc(double sum, double sum2, uint64_t n, double *mean, double *unc) {
    *mean = n ? sum / (double)n : 0;
    double v = n ? sum2 / (double)n - *mean * *mean : 0;
    *unc = v > 0 && n > 10 ? sqrt(v / (double)(n - 1)) : 0;
}

typedef struct ppl_run {
    cli_engine  e;
    cli_chunks  ck;
    int64_t     V;
    float      *logits;     /* [scored][V] */
    float      *lp;         /* [V] this run's log-probabilities */
    float      *lp_base;    /* [V] the base's */
    hr_fp16    *row16;      /* [scored][V] base rows in or out */
    FILE       *kld_f;      /* base file being read or written */
    hr_outfile  kld_out;
    bool        writing;
} ppl_run;

static int ppl_read_base_header(ppl_run *r, const char *path, int32_t *hdr, int32_t **tokens, hr_err *err) {
    struct stat st;
    if (!(r->kld_f = fopen(path, "rb")) || fstat(fileno(r->kld_f), &st))
        return hr_fail(err, HR_EIO, "cannot open '%s': %s", path, strerror(errno));
    char magic[8];
    if (fread(magic, 1, 8, r->kld_f) != 8 || memcmp(magic, ppl_magic, 8) || fread(hdr, 4, 3, r->kld_f) != 3)
        return hr_fail(err, HR_EFORMAT, "'%s' is not a hearth KL-divergence base file", path);
    const int32_t n_ctx = hdr[0], n_vocab = hdr[1], n_chunk = hdr[2];
    if (n_ctx < 4 || n_ctx > (1 << 24) || n_chunk < 1 || n_chunk > (1 << 24) || n_vocab != r->V)
        return hr_fail(err, HR_EFORMAT, "'%s': n_ctx %d, %d chunks, vocabulary %d (the model's: %lld)", path, n_ctx,
                       n_chunk, n_vocab, (long long)r->V);
    const uint64_t scored = (uint64_t)(n_ctx - 1 - n_ctx / 2);
    uint64_t rows, want; /* the header's sizes, which a hostile file may make overflow */
    if (__builtin_mul_overflow(scored * (uint64_t)n_chunk, (uint64_t)n_vocab, &rows) ||
        __builtin_mul_overflow(rows, 2ull, &want) ||
        __builtin_add_overflow(want, 20 + 4ull * (uint64_t)n_ctx * (uint64_t)n_chunk, &want) ||
        (uint64_t)st.st_size != want)
        return hr_fail(err, HR_EFORMAT, "'%s' is %lld bytes, not what its header says", path, (long long)st.st_size);
    const size_t nt = (size_t)n_ctx * (size_t)n_chunk;
    if (!(*tokens = malloc(sizeof **tokens * nt))) return hr_fail(err, HR_ENOMEM, "out of memory");
    if (fread(*tokens, 4, nt, r->kld_f) != nt) return hr_fail(err, HR_EIO, "'%s': short read", path);
    for (size_t i = 0; i < nt; i++)
        if ((*tokens)[i] < 0 || (*tokens)[i] >= n_vocab)
            return hr_fail(err, HR_EFORMAT, "'%s': token %zu is %d", path, i, (*tokens)[i]);
    return 0;
}

static int ppl_write_base_header(ppl_run *r, const char *path, hr_err *err) {
    if (hr_outfile_open(&r->kld_out, path, err)) return err->code;
    r->writing = true;
    const int32_t hdr[3] = {r->ck.n_ctx, (int32_t)r->V, r->ck.n_chunk};
    const size_t nt = (size_t)r->ck.n_ctx * (size_t)r->ck.n_chunk;
    if (fwrite(ppl_magic, 1, 8, r->kld_out.f) != 8 || fwrite(hdr, 4, 3, r->kld_out.f) != 3 ||
        fwrite(r->ck.tokens, 4, nt, r->kld_out.f) != nt)
        return hr_fail(err, HR_EIO, "cannot write '%s': %s", hr_outfile_name(&r->kld_out), strerror(errno));
    return 0;
}

/* one chunk's scored rows into st (and the base file, read or written) */
static int ppl_score(ppl_run *r, int chunk, bool compare, ppl_stats *st, hr_err *err) {
    const int first = r->ck.first, scored = r->ck.n_ctx - 1 - first;
    const int64_t V = r->V;
    const int32_t *tok = r->ck.tokens + (size_t)chunk * r->ck.n_ctx;
    if (compare && fread(r->row16, sizeof *r->row16, (size_t)scored * V, r->kld_f) != (size_t)scored * V)
        return hr_fail(err, HR_EIO, "the base file ends early (chunk %d)", chunk + 1);
    for (int k = 0; k < scored; k++) {
        const int32_t next = tok[first + k + 1];
        const int imax = ppl_log_softmax(r->logits + (size_t)k * V, V, r->lp);
        hr_fp16 *row = r->row16 ? r->row16 + (size_t)k * V : NULL;
        const double nll = -r->lp[next];
        st->nll += nll;
        st->nll2 += nll * nll;
        st->count++;
        if (r->writing)
            for (int64_t i = 0; i < V; i++) row[i] = hr_fp32_to_fp16(r->lp[i]);
        if (!compare) continue;
        int ibase = 0;
        double kld = 0;
        for (int64_t i = 0; i < V; i++) {
            const float b = r->lp_base[i] = hr_fp16_to_fp32(row[i]);
            if (b > r->lp_base[ibase]) ibase = (int)i;
            /* as llama-perplexity: the base's tail below e^-16 is left out */
            if (b > -16.f) kld += expf(b) * (double)(b - r->lp[i]);
        }
        const double nll_base = -r->lp_base[next];
        st->nll_base += nll_base;
        st->nll_base2 += nll_base * nll_base;
        st->nll_nll_base += nll * nll_base;
        st->kld += kld;
        st->kld2 += kld * kld;
        st->kld_max = HR_MAX(st->kld_max, kld);
        /* the top token agrees when this run's is a top token of the base at the base's F16 precision
           (two log-probabilities that round to the same F16 value are a tie there) */
        st->same_top += imax == ibase || r->lp_base[imax] == r->lp_base[ibase];
        const double dp = exp(-nll) - exp(-nll_base);
        st->p_diff2 += dp * dp;
        st->p_diff4 += dp * dp * dp * dp;
    }
    if (r->writing && fwrite(r->row16, sizeof *r->row16, (size_t)scored * V, r->kld_out.f) != (size_t)scored * V)
        return hr_fail(err, HR_EIO, "cannot write '%s': %s", hr_outfile_name(&r->kld_out), strerror(errno));
    return 0;
}

typedef struct ppl_kl_figures {
    double ppl, ppl_unc, ppl_base, ppl_base_unc, cor, lnr, lnr_unc, kld, kld_unc, dp_rms, dp_rms_unc, top, top_unc;
} ppl_kl_figures;

static ppl_kl_figures ppl_kl(const ppl_stats *s) {
    ppl_kl_figures f = {0};
    const uint64_t n = s->count;
    double lp, lpu, lb, lbu, msq, msqu;
    ppl_mean_unc(s->nll, s->nll2, n, &lp, &lpu);
    ppl_mean_unc(s->nll_base, s->nll_base2, n, &lb, &lbu);
    f.ppl = exp(lp), f.ppl_unc = f.ppl * lpu, f.ppl_base = exp(lb), f.ppl_base_unc = f.ppl_base * lbu;
    const double cov = n >= 10 ? (s->nll_nll_base / (double)n - lp * lb) / (double)(n - 1) : 0;
    f.cor = lpu > 0 && lbu > 0 ? cov / (lpu * lbu) : 0;
    f.lnr = lp - lb;
    f.lnr_unc = sqrt(HR_MAX(lpu * lpu + lbu * lbu - 2 * cov, 0.0));
    ppl_mean_unc(s->kld, s->kld2, n, &f.kld, &f.kld_unc);
    ppl_mean_unc(s->p_diff2, s->p_diff4, n, &msq, &msqu);
    f.dp_rms = sqrt(msq), f.dp_rms_unc = f.dp_rms > 0 ? 0.5 / f.dp_rms * msqu : 0;
    f.top = n ? (double)s->same_top / (double)n : 0;
    f.top_unc = n > 1 ? sqrt(f.top * (1 - f.top) / (double)(n - 1)) : 0;
    return f;
}

/* ---- the loss simulation: groups to devices, then loss on the workers' links ---------------------------- */

static int ppl_sim_setup(ppl_run *r, cli_opts *o, hr_err *err) {
    cli_engine *e = &r->e;
    hm_groups *g = e->groups;
    const int L = e->m->hp.n_layer, nd = (int)o->sim_devices, stride = hm_groups_stride(g);
    double loss[HC_MAX_DEVICES] = {0}, weight[HC_MAX_DEVICES];
    if (o->n_sim_loss != 1 && o->n_sim_loss != nd - 1)
        return hr_fail(err, HR_EINVAL, "--sim-loss has %d values for %d workers", o->n_sim_loss, nd - 1);
    for (int d = 1; d < nd; d++) loss[d] = o->sim_loss[o->n_sim_loss == 1 ? 0 : d - 1] / 100;
    for (int d = 0; d < nd; d++) weight[d] = 1;
    hpl_importance imp = {0};
    int rc = 0;
    if (o->sim_placement == CLI_SIM_ORACLE) {
        fprintf(stderr, "perplexity: oracle placement: measuring the groups' importance on this text first\n");
        rc = cli_importance_measure(e, &r->ck, &imp, err);
    } else if (o->importance)
        rc = cli_importance_load(e->m, o->importance, &imp, err);
    int32_t *assign = calloc((size_t)L * 2 * (size_t)stride, sizeof *assign), count2[2 * HC_MAX_DEVICES];
    for (int b = 0; !rc && b < 2; b++)
        rc = hpl_group_counts(weight, nd, hm_groups_count(g, b ? HM_BLOCK_FFN : HM_BLOCK_ATTN), count2 + b * nd, err);
    double *rnd = malloc(sizeof *rnd * (size_t)stride);
    if (!rc && (!assign || !rnd)) rc = hr_fail(err, HR_ENOMEM, "out of memory");
    uint64_t seed = (uint64_t)o->sim_seed * 0x9E3779B97F4A7C15ull + 12345;
    for (int il = 0; !rc && il < L; il++)
        for (int b = 0; !rc && b < 2; b++) {
            const int32_t n = hm_groups_count(g, b ? HM_BLOCK_FFN : HM_BLOCK_ATTN);
            int32_t count[HC_MAX_DEVICES], *as = assign + ((size_t)il * 2 + b) * (size_t)stride;
            if ((rc = hpl_group_counts(weight, nd, n, count, err))) break;
            if (o->sim_placement == CLI_SIM_CONTIGUOUS) {
                for (int d = 0, i = 0; d < nd; d++)
                    for (int32_t k = 0; k < count[d]; k++) as[i++] = d;
                continue;
            }
            const double *imp_row = imp.imp[b] ? imp.imp[b] + (size_t)il * n : NULL;
            if (o->sim_placement == CLI_SIM_RANDOM || (o->sim_placement >= CLI_SIM_PER_TOKEN && !imp_row)) {
                for (int32_t i = 0; i < n; i++) {
                    seed += 0x9E3779B97F4A7C15ull;
                    uint64_t z = seed;
                    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
                    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
                    rnd[i] = (double)((z ^ (z >> 31)) >> 11);
                }
                imp_row = rnd;
            }
            rc = hpl_place_groups(imp_row, n, loss, count, nd, as, err);
        }
    if (!rc) {
        const int rank = o->sim_placement == CLI_SIM_PER_TOKEN    ? HM_RANK_TOKEN
                       : o->sim_placement == CLI_SIM_PREV_TOKEN ? HM_RANK_PREV
                       : o->sim_placement == CLI_SIM_LOWRANK    ? HM_RANK_LOWRANK
                       : o->sim_placement == CLI_SIM_PROTECT    ? HM_RANK_PROTECT
                                                                : HM_RANK_STATIC;
        const int32_t nff = hm_groups_count(g, HM_BLOCK_FFN);
        const hm_groups_loss gl = {.n_dev = nd, .loss = loss, .assign = assign, .packet = (int32_t)o->sim_packet,
                                   .seed = (uint64_t)o->sim_seed, .rank = rank, .count = count2,
                                   .lowrank = o->sim_rank ? (int32_t)o->sim_rank : HR_MAX(1, e->m->hp.n_embd / 8),
                                   .protect = o->sim_protect >= 0 ? (int32_t)o->sim_protect : nff / (4 * nd)};
        rc = hm_groups_set_loss(g, &gl, err);
    }
    free(assign);
    free(rnd);
    hpl_importance_free(&imp);
    return rc;
}

/* ---- the command ---------------------------------------------------------------------------------------- */

/* --workers --lossy: what the lossy all-reduce lost over the run, the counters `hearth run` gives with
   --timings and --stats-json (docs/lossy.md): a summary line on stdout beside the figures, run's table
   of every device on stderr. Only one-token passes all-reduce by datagrams (-b 1 makes every pass one). */
static int ppl_lossy_report(cli_engine *e, hr_err *err) {
    hc_dev_stats st[HC_MAX_DEVICES];
    int n = hc_head_stats(e->tp, st, HC_MAX_DEVICES, err);
    if (n < 0) return n;
    unsigned long long sent = 0, dropped = 0, received = 0, lost = 0, late = 0;
    for (int i = 1; i < n; i++) {
        sent += st[i].dg_sent;
        dropped += st[i].dg_hook_dropped + st[i].dg_send_fail;
        received += st[i].dg_received;
        lost += st[i].dg_lost;
        late += st[i].dg_late;
    }
    printf("lossy: %llu all-reduces merged from datagrams; the workers sent %llu datagrams (%llu dropped before "
           "the wire), the head received %llu, lost %llu (%.2f%%), %llu late; %llu elements lost (at most %llu in one); "
           "%llu pass ends waited for a worker behind (%.1f ms)\n",
           (unsigned long long)st[0].lossy_syncs, sent, dropped, received, lost, sent ? 100.0 * (double)lost / (double)sent : 0.0,
           late, (unsigned long long)st[0].elems_lost, (unsigned long long)st[0].elems_lost_max,
           (unsigned long long)st[0].settles, st[0].settle_ms);
    /* every device must have continued from the same sums (docs/lossy.md): its hash of them, the head's */
    bool agree = true;
    for (int i = 1; i < n; i++) agree &= st[i].sum_hash == st[0].sum_hash;
    printf("lossy: %d devices to the end; their sums %s (hash %016llx at the head)\n", n, agree ? "agree" : "DIFFER",
           (unsigned long long)st[0].sum_hash);
    static char buf[16384];
    hc_format_stats(st, n, buf, sizeof buf);
    fprintf(stderr, "\nper device, over the run:\n%s", buf);
    return 0;
}

static int ppl_main(ppl_run *r, cli_opts *o, hr_err *err) {
    cli_engine *e = &r->e;
    const bool compare = o->kld, sim = o->n_sim_loss > 0;
    size_t len = 0;
    char *text = NULL;
    int32_t *base_tokens = NULL, hdr[3];
    if (!compare && !(text = cli_read_text(o->file, PPL_MAX_BYTES, &len, err))) return err->code;
    int rc = cli_engine_open(e, o, true, err);
    if (!rc && sim) rc = cli_groups_open(e, err);
    if (!rc) r->V = e->m->hp.n_vocab;
    if (!rc && compare) {
        rc = ppl_read_base_header(r, o->kld_file, hdr, &base_tokens, err);
        if (!rc) rc = cli_chunks_from_tokens(&r->ck, e, base_tokens, hdr[2], hdr[0], (int)o->n_batch, err);
    } else if (!rc) {
        rc = cli_chunks_init(&r->ck, e, text, len, (int)o->n_ctx, (int)o->n_batch, (int)o->n_chunks, err);
        if (!rc && r->ck.n_tokens < 2 * r->ck.n_ctx)
            rc = hr_fail(err, HR_EINVAL, "the text has %d tokens; a context of %d needs at least %d", r->ck.n_tokens,
                         r->ck.n_ctx, 2 * r->ck.n_ctx);
    }
    free(text);
    free(base_tokens);
    if (rc) return rc;
    cli_chunks *ck = &r->ck;
    hm_ctx_params cp = cli_ctx_params(o);
    cp.n_ctx = ck->n_ctx;
    cp.n_batch = ck->n_batch;
    if ((rc = cli_engine_start(e, o, &cp, false, NULL, err))) return rc;
    const int scored = ck->n_ctx - 1 - ck->first;
    r->logits = malloc(sizeof *r->logits * (size_t)scored * (size_t)r->V);
    r->lp = malloc(sizeof *r->lp * (size_t)r->V);
    r->lp_base = malloc(sizeof *r->lp_base * (size_t)r->V);
    if (o->kld_file) r->row16 = malloc(sizeof *r->row16 * (size_t)scored * (size_t)r->V); /* base rows in or out */
    if (!r->logits || !r->lp || !r->lp_base || (o->kld_file && !r->row16))
        return hr_fail(err, HR_ENOMEM, "out of memory for logits");
    if (sim && (rc = ppl_sim_setup(r, o, err))) return rc;
    if (o->kld_file && !compare && (rc = ppl_write_base_header(r, o->kld_file, err))) return rc;
    fprintf(stderr, "perplexity: %d tokens, calculating perplexity over %d chunks, n_ctx=%d, batch_size=%d\n",
            ck->n_tokens, ck->n_chunk, ck->n_ctx, ck->n_batch);
    if (compare)
        printf("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              "
               "\xce\x94p RMS            Same top p\n");
    ppl_stats st = {0};
    for (int i = 0; i < ck->n_chunk; i++) {
        if ((rc = cli_chunk_eval(e, ck, i, r->logits, err)) || (rc = ppl_score(r, i, compare, &st, err))) return rc;
        if (!compare) {
            printf("[%d]%.4lf,", i + 1, exp(st.nll / (double)st.count));
        } else {
            const ppl_kl_figures f = ppl_kl(&st);
            printf("%4d    %9.4lf \xc2\xb1 %9.4lf    %10.5lf \xc2\xb1 %10.5lf    %10.5lf \xc2\xb1 %10.5lf    "
                   "%6.3lf \xc2\xb1 %6.3lf %%    %6.3lf \xc2\xb1 %6.3lf %%\n",
                   i + 1, f.ppl, f.ppl_unc, f.lnr, f.lnr_unc, f.kld,
                   f.kld_unc, 100 * f.dp_rms, 100 * f.dp_rms_unc, 100 * f.top, 100 * f.top_unc);
        }
        fflush(stdout);
    }
    printf("\n");
    if (!compare) {
        /* llama-perplexity's estimate: exp(mean nll) +/- exp(mean) * standard error of the mean nll */
        const double mean = st.nll / (double)st.count, var = st.nll2 / (double)st.count - mean * mean;
        const double ppl = exp(mean);
        if (var > 0 && st.count > 1)
            printf("Final estimate: PPL = %.4lf +/- %.5lf\n", ppl, sqrt(var / (double)(st.count - 1)) * ppl);
        else printf("Final estimate: PPL = %.4lf (no uncertainty: the log-probabilities do not vary)\n", ppl);
    } else {
        const ppl_kl_figures f = ppl_kl(&st);
        printf("====== Perplexity statistics ======\n");
        printf("Mean PPL(Q)                   : %10.6lf \xc2\xb1 %10.6lf\n", f.ppl, f.ppl_unc);
        printf("Mean PPL(base)                : %10.6lf \xc2\xb1 %10.6lf\n", f.ppl_base, f.ppl_base_unc);
        printf("Cor(ln(PPL(Q)), ln(PPL(base))): %6.2lf%%\n", 100 * f.cor);
        printf("Mean ln(PPL(Q)/PPL(base))     : %10.6lf \xc2\xb1 %10.6lf\n", f.lnr, f.lnr_unc);
        printf("Mean PPL(Q)/PPL(base)         : %10.6lf \xc2\xb1 %10.6lf\n", exp(f.lnr), exp(f.lnr) * f.lnr_unc);
        printf("\n====== KL divergence statistics ======\n");
        printf("Mean    KLD: %10.6lf \xc2\xb1 %10.6lf\n", f.kld, f.kld_unc);
        printf("Maximum KLD: %10.6lf\n", st.kld_max);
        printf("\n====== Token probability statistics ======\n");
        printf("RMS \xce\x94p    : %6.3lf \xc2\xb1 %5.3lf %%\n", 100 * f.dp_rms, 100 * f.dp_rms_unc);
        printf("Same top p: %6.3lf \xc2\xb1 %5.3lf %%\n", 100 * f.top, 100 * f.top_unc);
    }
    if (sim) {
        const hm_groups_counters c = hm_groups_get_counters(e->groups);
        printf("sim: %llu lossy all-reduces, %llu of %llu worker datagrams lost (%.2f%%), %llu of %llu elements\n",
               (unsigned long long)c.allreduces, (unsigned long long)c.lost, (unsigned long long)c.packets,
               c.packets ? 100.0 * (double)c.lost / (double)c.packets : 0.0, (unsigned long long)c.elems_lost,
               (unsigned long long)c.elems);
    }
    if (e->tp && o->head.lossy && (rc = ppl_lossy_report(e, err))) return rc;
    if (r->writing) {
        r->writing = false;
        if ((rc = hr_outfile_commit(&r->kld_out, err))) return rc;
        fprintf(stderr, "perplexity: wrote the base log-probabilities to %s\n", o->kld_file);
    }
    return 0;
}

static int perplexity(cli_opts *o) {
    hr_err err = {0};
    ppl_run r = {0};
    int rc = ppl_main(&r, o, &err);
    if (rc) fprintf(stderr, "hearth perplexity: %s\n", err.msg[0] ? err.msg : "failed");
    if (r.writing) hr_outfile_abort(&r.kld_out);
    if (r.kld_f) fclose(r.kld_f);
    free(r.logits);
    free(r.lp);
    free(r.lp_base);
    free(r.row16);
    cli_chunks_free(&r.ck);
    cli_engine_close(&r.e);
    return rc ? 1 : 0;
}

static void ppl_defaults(cli_opts *o) {
    o->n_ctx = 512;
    o->n_batch = 0;
    o->sim_placement = CLI_SIM_IMPORTANCE;
}

static int ppl_check(const cli_command *c, cli_opts *o) {
    if (!o->model) return cli_usage_error(c, "-m MODEL is required");
    if (o->kld && !o->kld_file) return cli_usage_error(c, "--kl-divergence compares with --kl-divergence-base FILE");
    if (!o->kld && !o->file) return cli_usage_error(c, "-f TEXT is required");
    if (o->n_sim_loss && (o->sim_placement == CLI_SIM_IMPORTANCE || o->sim_placement == CLI_SIM_PROTECT) &&
        !o->importance)
        return cli_usage_error(c, "--sim-placement importance and protect need --importance FILE (hearth calibrate)");
    if (!o->n_sim_loss && o->importance && !o->head.n_workers)
        return cli_usage_error(c, "--importance is for --sim-loss or --workers (the runtime's placement)");
    if (o->n_sim_loss && o->head.n_workers)
        return cli_usage_error(c, "--sim-loss simulates a cluster in one process: no --workers");
    return cli_check_cluster(c, o);
}

static void ppl_epilog(FILE *f) {
    fprintf(f, "\nOutput (stdout) as llama-perplexity's: [chunk]running PPL, then \"Final estimate: PPL = X +/- U\"\n"
               "(U = PPL x the standard error of the mean negative log-likelihood); with --kl-divergence a\n"
               "table per chunk and the statistics. Exit status: 0 ok, 1 failed, 2 usage error.\n");
}

const cli_command cli_perplexity = {
    "perplexity", CLI_PERPLEXITY, "perplexity of a text and KL divergence against a base run (llama-perplexity's)",
    "-m MODEL -f TEXT [-c N] [-b N] [--kl-divergence-base FILE [--kl-divergence]] [options]",
    "Cuts the text's tokens into chunks of -c tokens (BOS first where the model adds one), runs each\n"
    "from position 0 and scores the tokens of its second half, as llama-perplexity does, so the\n"
    "figures compare. --kl-divergence-base FILE saves this run's log-probabilities; adding\n"
    "--kl-divergence compares a run (another quant, a lossy simulation) with them. --sim-loss and\n"
    "the --sim-* flags simulate tensor parallelism over lossy links in this one process\n"
    "(docs/lossy.md).",
    .epilog = ppl_epilog, .defaults = ppl_defaults, .check = ppl_check, .run = perplexity};
