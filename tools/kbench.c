/* kbench — single-thread throughput of the dispatched matmul tile kernels (hq_traits.gemm), called
 * the way the engine's forward pass calls them: prefill 16 weight rows per call, all activation
 * columns; decode all the rows in one call (the engine passes a thread's whole share).
 *
 *   decode  (nc = 1): GB/s of weight bytes and ns per row, with the matrix hot in the L3 and cold
 *                     (a fresh copy per pass, ~128 MiB in all, so every byte comes from DRAM)
 *   prefill (nc > 1): GOP/s (2 * rows * cols * nc / s) with the weights hot
 *
 * Weights are in the engine's layout (Q4_0, and with AVX-512 Q4_K, Q5_K and Q6_K, packed in groups of 4
 * rows, "Q4_0x4" etc., where the kernel table has a packed kernel) and are a few quantized random
 * rows repeated down the matrix (quantizing a whole K-quant matrix with the reference code takes
 * seconds); activations are quantized random rows.
 *
 * usage: kbench [-T TYPE,...] [-R ROWS] [-K COLS] [-n NC] [-r REPS] [--check]
 */
#include "base/base.h"
#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { KB_CHUNK = 16, KB_DISTINCT = 64 };

static uint64_t kb_rng = 0x2545F4914F6CDD1DULL;
static float kb_gauss(void) { /* Box-Muller on xorshift64 */
    kb_rng ^= kb_rng << 13, kb_rng ^= kb_rng >> 7, kb_rng ^= kb_rng << 17;
    const double u = ((kb_rng >> 11) + 0.5) * 0x1p-53;
    kb_rng ^= kb_rng << 13, kb_rng ^= kb_rng >> 7, kb_rng ^= kb_rng << 17;
    const double v = ((kb_rng >> 11) + 0.5) * 0x1p-53;
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static int kb_cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* the engine's loop: tiles of KB_CHUNK rows x all nc columns; decode (nc = 1) hands the kernel all
   the rows in one call, as the engine hands it a thread's whole share */
static void kb_matmul(hq_gemm_fn gemm, int K, int rows, const uint8_t *w, size_t rs, const void *y, size_t ys,
                      int nc, float *out) {
    if (nc == 1) {
        gemm(K, out, (size_t)rows, w, rs, rows, y, ys, 1);
        return;
    }
    for (int r = 0; r < rows; r += KB_CHUNK) {
        const int nr = rows - r < KB_CHUNK ? rows - r : KB_CHUNK;
        gemm(K, out + r, (size_t)rows, w + (size_t)r * rs, rs, nr, y, ys, nc);
    }
}

static double kb_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, kb_cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int kb_run(int type, int rows, int K, int nc, int reps, bool check) {
    const hq_traits *tr = hq_get_traits(type);
    if (!tr || !tr->is_quantized || type == HQ_TYPE_Q8_K || type == HQ_TYPE_Q8_1) {
        fprintf(stderr, "kbench: %s is not a weight type with a tile kernel\n", hq_type_name(type));
        return 1;
    }
    const hq_traits *vt = hq_get_traits(tr->vec_dot_type);
    const size_t rs = hq_row_size(type, K), ys = hq_row_size(tr->vec_dot_type, K);
    if (!rs || rows % KB_CHUNK) {
        fprintf(stderr, "kbench: K must be a multiple of %lld and ROWS of %d\n", (long long)tr->blck_size, KB_CHUNK);
        return 1;
    }
    const size_t mat = rs * (size_t)rows;
    int copies = (int)((128u << 20) / mat) + 1;
    if (copies < 2) copies = 2;
    uint8_t *w = hr_alloc_aligned(mat * copies, 64);
    void *y = hr_alloc_aligned(ys * (size_t)nc, 64);
    float *f = malloc((size_t)K * sizeof(float)), *out = malloc((size_t)rows * nc * sizeof(float));
    double *t = malloc((size_t)(reps > copies ? reps : copies) * sizeof(double));
    if (!w || !y || !f || !out || !t) {
        fprintf(stderr, "kbench: out of memory\n");
        return 1;
    }
    for (int r = 0; r < KB_DISTINCT && r < rows; r++) {
        for (int i = 0; i < K; i++) f[i] = kb_gauss() * 0.02f;
        tr->from_float_ref(f, w + (size_t)r * rs, K);
    }
    for (int r = KB_DISTINCT; r < rows; r++) memcpy(w + (size_t)r * rs, w + (size_t)(r % KB_DISTINCT) * rs, rs);
    /* the engine's layout: types with a packed kernel are packed where the shape allows (the first
       rows kept in the file layout for --check's reference) */
    const bool packed = hq_pack_ok(type, K, rows);
    const hq_gemm_fn gemm = packed ? tr->gemm_packed : tr->gemm;
    const int cr = rows < KB_DISTINCT ? rows : KB_DISTINCT;
    uint8_t *orig = malloc(rs * (size_t)cr);
    if (!orig) {
        fprintf(stderr, "kbench: out of memory\n");
        return 1;
    }
    memcpy(orig, w, rs * (size_t)cr);
    char name[24];
    snprintf(name, sizeof name, "%s%s", tr->name, packed ? "x4" : "");
    if (packed) {
        uint8_t *tmp = w + mat; /* the second copy's room, filled below */
        for (int r = 0; r < rows; r += HQ_BAND) tr->pack(tmp + (size_t)r * rs, w + (size_t)r * rs, rs, K, HQ_BAND);
        memcpy(w, tmp, mat);
    }
    for (int c = 1; c < copies; c++) memcpy(w + mat * c, w, mat);
    for (int j = 0; j < nc; j++) {
        for (int i = 0; i < K; i++) f[i] = kb_gauss();
        vt->from_float(f, (uint8_t *)y + (size_t)j * ys, K);
    }
    /* a packed kernel with its own activation form reads the rows prepared, as the engine hands them
       (prepared once per matmul, outside the timed calls) */
    void *ky = y;
    size_t kys = ys;
    if (packed && tr->prep) {
        kys = tr->prep_size(K);
        if (!(ky = hr_alloc_aligned(kys * (size_t)nc, 64))) {
            fprintf(stderr, "kbench: out of memory\n");
            return 1;
        }
        for (int j = 0; j < nc; j++) tr->prep((uint8_t *)ky + (size_t)j * kys, (const uint8_t *)y + (size_t)j * ys, K);
    }

    if (check) { /* the tile against vec_dot_ref, over the first 64 rows */
        double worst = 0;
        kb_matmul(gemm, K, cr, w, rs, ky, kys, nc, out);
        for (int j = 0; j < nc; j++)
            for (int r = 0; r < cr; r++) {
                float want;
                tr->vec_dot_ref(K, &want, orig + (size_t)r * rs, (const uint8_t *)y + (size_t)j * ys);
                const double e = fabs((double)out[(size_t)j * cr + r] - want) / (fabs(want) + 1e-3);
                if (e > worst) worst = e;
            }
        printf("%-6s %5dx%-5d nc=%-3d check: worst relative difference to vec_dot_ref %.2e\n", name, rows, K,
               nc, worst);
    }

    const double bytes = (double)mat;
    if (nc == 1) {
        kb_matmul(gemm, K, rows, w, rs, ky, kys, 1, out); /* warm */
        for (int i = 0; i < reps; i++) {
            const double t0 = hr_time_s();
            kb_matmul(gemm, K, rows, w, rs, ky, kys, 1, out);
            t[i] = hr_time_s() - t0;
        }
        const double hot = kb_median(t, reps);
        const int cold_reps = copies < 3 * reps ? copies : 3 * reps;
        for (int i = 0; i < cold_reps; i++) {
            const double t0 = hr_time_s();
            kb_matmul(gemm, K, rows, w + mat * (size_t)(i % copies), rs, ky, kys, 1, out);
            t[i] = hr_time_s() - t0;
        }
        const double cold = kb_median(t, cold_reps);
        printf("%-6s %5dx%-5d nc=1   hot %6.2f GB/s (%5.1f ns/row)   cold %6.2f GB/s (%5.1f ns/row)\n", name,
               rows, K, bytes / hot * 1e-9, hot / rows * 1e9, bytes / cold * 1e-9, cold / rows * 1e9);
    } else {
        kb_matmul(gemm, K, rows, w, rs, ky, kys, nc, out);
        for (int i = 0; i < reps; i++) {
            const double t0 = hr_time_s();
            kb_matmul(gemm, K, rows, w, rs, ky, kys, nc, out);
            t[i] = hr_time_s() - t0;
        }
        const double s = kb_median(t, reps);
        printf("%-6s %5dx%-5d nc=%-3d %7.2f GOP/s (%6.2f ms per matmul, %5.2f ns per row x column)\n", name,
               rows, K, nc, 2.0 * rows * K * nc / s * 1e-9, s * 1e3, s / ((double)rows * nc) * 1e9);
    }
    hr_free_aligned(w);
    if (ky != y) hr_free_aligned(ky);
    hr_free_aligned(y);
    free(f), free(out), free(t), free(orig);
    return 0;
}

int main(int argc, char **argv) {
    const char *types = "Q4_0,Q8_0,Q4_K,Q6_K";
    int rows = 2048, K = 8192, nc = 1, reps = 9;
    bool check = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-T") && i + 1 < argc) types = argv[++i];
        else if (!strcmp(argv[i], "-R") && i + 1 < argc) rows = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-K") && i + 1 < argc) K = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) nc = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--check")) check = true;
        else {
            printf("usage: kbench [-T TYPE,... (default %s)] [-R ROWS (2048)] [-K COLS (8192)] [-n NC (1)]\n"
                   "              [-r REPS (9)] [--check]\n"
                   "Single-thread speed of the dispatched tile kernels, called as the engine calls them\n"
                   "(decode: all rows in one call; prefill: 16 rows per call): GB/s hot and cold for\n"
                   "NC = 1, GOP/s for NC > 1.\n", types);
            return strcmp(argv[i], "-h") && strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    if (rows < KB_CHUNK || rows > (1 << 20) || K < 1 || K > (1 << 20) || nc < 1 || nc > 4096 || reps < 1 ||
        reps > 1000) {
        fprintf(stderr, "kbench: bad arguments\n");
        return 2;
    }
    hr_init();
    printf("kernels: %s\n", hq_simd_name());
    char buf[256];
    snprintf(buf, sizeof buf, "%s", types);
    int rc = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        const int t = hq_type_from_name(tok);
        if (t < 0) {
            fprintf(stderr, "kbench: unknown type %s\n", tok);
            return 2;
        }
        rc |= kb_run(t, rows, K, nc, reps, check);
    }
    return rc;
}
