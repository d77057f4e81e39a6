/* `hearth info`: what a GGUF model is (architecture, shapes, tensor types) and the memory a run of it
   needs (mapped weights + KV cache + compute scratch), as text or as one JSON object. */
#include "cli.h"
#include "model-shapes.h"

#include "gguf/gguf.h"
#include "model/model.h"
#include "quant/quant.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#define INFO_DEFAULT_CTX 4096


typedef struct info_type_stat {
    int64_t  count;
    uint64_t params, bytes;
} info_type_stat;

typedef struct info_mem {
    int32_t  n_ctx;
    uint64_t weights, kv, scratch, total;
} info_mem;

static const char *info_bytes(uint64_t b, char *buf, size_t cap) {
    if (b >= (1ULL << 30)) snprintf(buf, cap, "%.2f GiB", b / 1073741824.0);
    else if (b >= (1ULL << 20)) snprintf(buf, cap, "%.1f MiB", b / 1048576.0);
    else if (b >= 1024) snprintf(buf, cap, "%.1f KiB", b / 1024.0);
    else snprintf(buf, cap, "%llu B", (unsigned long long)b);
    return buf;
}

static const char *info_count(uint64_t n, char *buf, size_t cap) {
    if (n >= 1000000000ULL) snprintf(buf, cap, "%.2f B", n / 1e9);
    else if (n >= 1000000ULL) snprintf(buf, cap, "%.1f M", n / 1e6);
    else if (n >= 1000ULL) snprintf(buf, cap, "%.1f K", n / 1e3);
    else snprintf(buf, cap, "%llu", (unsigned long long)n);
    return buf;
}

/* json_string refuses invalid UTF-8 (a name cut at 127 bytes may end mid-character); keep the key */
static json_t *info_jstr(const char *s) {
    json_t *j = json_string(s);
    return j ? j : json_string("(not UTF-8)");
}

static json_t *info_json(const char *path, const gguf_ctx *g, const hm_hparams *hp, const info_type_stat *st,
                         uint64_t n_params, uint64_t n_bytes, const info_mem *mem) {
    json_t *o = json_object(), *h = json_object(), *types = json_object(), *m = json_object(),
           *tensors = json_array();
    json_object_set_new(o, "file", info_jstr(path));
    json_object_set_new(o, "file_size", json_integer((json_int_t)gguf_file_size(g)));
    json_object_set_new(o, "gguf_version", json_integer(gguf_version(g)));
    json_object_set_new(o, "alignment", json_integer((json_int_t)gguf_alignment(g)));
    json_object_set_new(o, "n_kv", json_integer(gguf_n_kv(g)));
    json_object_set_new(o, "n_tensors", json_integer(gguf_n_tensors(g)));
    json_object_set_new(o, "architecture", info_jstr(hp->arch_name));
    json_object_set_new(o, "name", info_jstr(hp->name));
    uint32_t ft;
    if (gguf_get_u32(g, "general.file_type", &ft)) {
        json_object_set_new(o, "file_type", json_integer(ft));
        const char *ftn = cli_file_type_name(ft);
        if (ftn) json_object_set_new(o, "file_type_name", json_string(ftn));
    }

    json_object_set_new(h, "n_vocab", json_integer(hp->n_vocab));
    json_object_set_new(h, "n_embd", json_integer(hp->n_embd));
    json_object_set_new(h, "n_layer", json_integer(hp->n_layer));
    json_object_set_new(h, "n_head", json_integer(hp->n_head));
    json_object_set_new(h, "n_head_kv", json_integer(hp->n_head_kv));
    json_object_set_new(h, "head_dim", json_integer(hp->head_dim));
    json_object_set_new(h, "n_ff", json_integer(hp->n_ff));
    json_object_set_new(h, "n_ctx_train", json_integer(hp->n_ctx_train));
    json_object_set_new(h, "rope_base", json_real(hp->rope_base));
    json_object_set_new(h, "rms_eps", json_real(hp->rms_eps));
    json_object_set_new(h, "rope_neox", json_boolean(hp->rope_neox));
    json_object_set_new(h, "tied_output", json_boolean(hp->tied_output));
    json_object_set_new(h, "qkv_bias", json_boolean(hp->has_qkv_bias));
    json_object_set_new(h, "qk_norm", json_boolean(hp->has_qk_norm));
    json_object_set_new(h, "rope_freqs", json_boolean(hp->has_rope_freqs));
    json_object_set_new(o, "hparams", h);

    for (int t = 0; t < HQ_TYPE_COUNT; t++) {
        if (!st[t].count) continue;
        json_t *e = json_object();
        json_object_set_new(e, "count", json_integer(st[t].count));
        json_object_set_new(e, "params", json_integer((json_int_t)st[t].params));
        json_object_set_new(e, "bytes", json_integer((json_int_t)st[t].bytes));
        json_object_set_new(types, hq_type_name(t), e);
    }
    json_object_set_new(o, "types", types);
    json_object_set_new(o, "n_params", json_integer((json_int_t)n_params));
    json_object_set_new(o, "n_bytes", json_integer((json_int_t)n_bytes));

    json_object_set_new(m, "n_ctx", json_integer(mem->n_ctx));
    json_object_set_new(m, "kv_type", json_string("F16"));
    json_object_set_new(m, "weights", json_integer((json_int_t)mem->weights));
    json_object_set_new(m, "kv_cache", json_integer((json_int_t)mem->kv));
    json_object_set_new(m, "scratch", json_integer((json_int_t)mem->scratch));
    json_object_set_new(m, "total", json_integer((json_int_t)mem->total));
    json_object_set_new(o, "memory", m);

    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        json_t *e = json_object(), *shape = json_array();
        for (int d = 0; d < t->n_dims; d++) json_array_append_new(shape, json_integer(t->ne[d]));
        json_object_set_new(e, "name", info_jstr(t->name));
        json_object_set_new(e, "type", json_string(hq_type_name(t->type)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "bytes", json_integer((json_int_t)t->nbytes));
        json_array_append_new(tensors, e);
    }
    json_object_set_new(o, "tensors", tensors);
    return o;
}

static void info_text(const char *path, const gguf_ctx *g, const hm_hparams *hp, const info_type_stat *st,
                      uint64_t n_params, uint64_t n_bytes, const info_mem *mem, bool list_tensors) {
    char b1[32], b2[32];
    printf("model          %s (%s)\n", path, info_bytes(gguf_file_size(g), b1, sizeof(b1)));
    printf("format         GGUF v%u, %lld tensors, %lld metadata keys, alignment %zu\n", gguf_version(g),
           (long long)gguf_n_tensors(g), (long long)gguf_n_kv(g), gguf_alignment(g));
    printf("architecture   %s\n", hp->arch_name);
    printf("name           %s\n", hp->name[0] ? hp->name : "(none)");
    uint32_t ft;
    if (gguf_get_u32(g, "general.file_type", &ft)) {
        const char *ftn = cli_file_type_name(ft);
        printf("file type      %u%s%s%s\n", ft, ftn ? " (" : "", ftn ? ftn : "", ftn ? ")" : "");
    }

    printf("\nhyper-parameters\n");
    printf("  n_vocab      %d\n", hp->n_vocab);
    printf("  n_embd       %d\n", hp->n_embd);
    printf("  n_layer      %d\n", hp->n_layer);
    printf("  n_head       %d\n", hp->n_head);
    printf("  n_head_kv    %d\n", hp->n_head_kv);
    printf("  head_dim     %d\n", hp->head_dim);
    printf("  n_ff         %d\n", hp->n_ff);
    printf("  n_ctx_train  %d\n", hp->n_ctx_train);
    printf("  rope_base    %g (%s)\n", hp->rope_base, hp->rope_neox ? "NeoX halves" : "adjacent pairs");
    printf("  rms_eps      %g\n", hp->rms_eps);
    printf("  tied_output  %s\n", hp->tied_output ? "yes (token_embd is the output head)" : "no");
    if (hp->has_qkv_bias) printf("  qkv_bias     yes\n");
    if (hp->has_qk_norm) printf("  qk_norm      yes\n");
    if (hp->has_rope_freqs) printf("  rope_freqs   yes\n");

    printf("\ntensors\n  %-8s %7s %12s %12s\n", "type", "count", "parameters", "bytes");
    for (int t = 0; t < HQ_TYPE_COUNT; t++) {
        if (!st[t].count) continue;
        printf("  %-8s %7lld %12s %12s\n", hq_type_name(t), (long long)st[t].count,
               info_count(st[t].params, b1, sizeof(b1)), info_bytes(st[t].bytes, b2, sizeof(b2)));
    }
    printf("  %-8s %7lld %12s %12s   (%.2f bits per parameter)\n", "total", (long long)gguf_n_tensors(g),
           info_count(n_params, b1, sizeof(b1)), info_bytes(n_bytes, b2, sizeof(b2)),
           n_params ? 8.0 * (double)n_bytes / (double)n_params : 0.0);

    if (list_tensors) {
        printf("\n");
        for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
            const gguf_tensor *t = gguf_tensor_at(g, i);
            char shape[96];
            size_t off = 0;
            for (int d = 0; d < t->n_dims; d++)
                off += (size_t)snprintf(shape + off, sizeof(shape) - off, "%s%lld", d ? " x " : "",
                                        (long long)t->ne[d]);
            printf("  %-32s %-6s %-20s %12s\n", t->name, hq_type_name(t->type), shape,
                   info_bytes(t->nbytes, b1, sizeof(b1)));
        }
    }

    printf("\nmemory for a run (n_ctx %d, F16 KV cache)\n", mem->n_ctx);
    printf("  weights (mapped)  %12s\n", info_bytes(mem->weights, b1, sizeof(b1)));
    printf("  KV cache          %12s\n", info_bytes(mem->kv, b1, sizeof(b1)));
    printf("  compute scratch   %12s\n", info_bytes(mem->scratch, b1, sizeof(b1)));
    printf("  total             %12s\n", info_bytes(mem->total, b1, sizeof(b1)));
}

static int info_check(const cli_command *c, cli_opts *o) {
    return o->n_pos ? 0 : cli_usage_error(c, "needs a MODEL file (see hearth info --help)");
}

static int info(cli_opts *o) {
    const char *path = o->pos[0];
    bool json = o->json, list_tensors = o->tensors;
    long n_ctx = o->n_ctx;
    hr_err err = {0};
    gguf_ctx *g = gguf_open(path, &err);
    if (!g) {
        fprintf(stderr, "hearth info: %s: %s\n", path, err.msg);
        return 1;
    }
    hm_hparams hp;
    if (hm_hparams_load(g, &hp, &err)) {
        fprintf(stderr, "hearth info: %s: %s\n", path, err.msg);
        gguf_close(g);
        return 1;
    }

    info_type_stat st[HQ_TYPE_COUNT] = {{0}};
    uint64_t n_params = 0, n_bytes = 0;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        uint64_t n = (uint64_t)gguf_tensor_nelements(t);
        if (t->type >= 0 && t->type < HQ_TYPE_COUNT) {
            st[t->type].count++;
            st[t->type].params += n;
            st[t->type].bytes += t->nbytes;
        }
        n_params += n;
        n_bytes += t->nbytes;
    }

    /* the memory a run needs: what hm_ctx_create would allocate, plus the mapped weights */
    hm_ctx_params cp = hm_ctx_default_params();
    int32_t ctx = n_ctx > 0 ? (int32_t)n_ctx
                : hp.n_ctx_train > 0 ? HR_MIN(hp.n_ctx_train, INFO_DEFAULT_CTX) : INFO_DEFAULT_CTX;
    cp.n_ctx = ctx;
    cp.kv_type = HQ_TYPE_F16;
    info_mem mem = {.n_ctx = ctx, .weights = n_bytes};
    mem.kv = 2ULL * (uint64_t)hp.n_layer * (uint64_t)ctx * (uint64_t)hp.n_head_kv * (uint64_t)hp.head_dim *
             sizeof(hr_fp16);
    uint64_t ctx_bytes = hm_ctx_bytes_estimate(&hp, &cp);
    mem.scratch = ctx_bytes > mem.kv ? ctx_bytes - mem.kv : 0;
    mem.total = mem.weights + mem.kv + mem.scratch;

    int ret = 0;
    if (json) {
        json_t *o = info_json(path, g, &hp, st, n_params, n_bytes, &mem);
        char *s = o ? json_dumps(o, JSON_INDENT(2)) : NULL;
        if (s) {
            printf("%s\n", s);
            free(s);
        } else {
            fprintf(stderr, "hearth info: out of memory formatting JSON\n");
            ret = 1;
        }
        json_decref(o);
    } else {
        info_text(path, g, &hp, st, n_params, n_bytes, &mem, list_tensors);
    }
    gguf_close(g);
    return ret;
}

const cli_command cli_info = {
    "info", CLI_INFO, "describe a GGUF model: architecture, shapes, tensor types, memory", "MODEL [options]",
    "Describes the GGUF model MODEL: architecture, name, file version, hyper-parameters, tensor\n"
    "counts and bytes per type, total parameters, and the memory a run needs: the weights (mapped\n"
    "from the file), an F16 KV cache for N_CTX tokens and the compute scratch.",
    1, .check = info_check, .run = info};
