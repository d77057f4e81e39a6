/* `hearth profile`: this device's profile for the planner (src/plan), measured once and cached */
#include "cli.h"

#include "plan/plan.h"
#include "quant/quant.h"

#include <stdio.h>
#include <stdlib.h>

void cli_print_device(int i, const char *addr, const hpl_device *d) {
    char types[1024] = "";
    size_t n = 0;
    for (int t = 0; t < d->n_types && n < sizeof types; t++) {
        const hpl_type_speed *s = &d->ts[t];
        n += (size_t)snprintf(types + n, sizeof types - n, "%s%s %.1f/%.1f", t ? ", " : "", hq_type_name(s->type),
                              s->matvec_gbps, s->matmul_gbps);
        /* a type the loaded weights pack: its speed in the file's layout (a device that streams) */
        if (n < sizeof types && s->matvec_map_gbps > 0 && (s->matvec_map_gbps != s->matvec_gbps || s->matmul_map_gbps != s->matmul_gbps))
            n += (size_t)snprintf(types + n, sizeof types - n, " (mapped %.1f/%.1f)", s->matvec_map_gbps, s->matmul_map_gbps);
    }
    printf("  %-2d %-22s %-24.24s %3d thr  quota %-5s usable %6.0f MiB  budget %6.0f MiB  mem %5.1f GB/s  disk %5.2f GB/s%s\n",
           i, addr, d->name, d->n_threads, d->cpu_quota > 0 ? "" : "none", d->mem_usable / 1048576.0, d->budget / 1048576.0,
           d->mem_bw_gbps, d->disk_gbps, d->cached ? "  (cached)" : "");
    if (d->cpu_quota > 0) printf("     cpu quota %.2f cores per %.0f ms period\n", d->cpu_quota, d->cpu_period_ms);
    if (d->disk_cpu_ms_gb > 0) printf("     streaming costs %.0f ms of CPU per GB read (the page cache's work)\n", d->disk_cpu_ms_gb);
    printf("     matvec/matmul GB/s: %s\n", types);
}

static int profile_run(cli_opts *o) {
    hpl_profile_params p = hpl_profile_default_params();
    p.n_threads = (int)o->threads;
    p.disk_path = o->model;
    p.no_cache = o->no_cache;
    p.mem = o->mem;
    hpl_device d;
    hr_err err = {0};
    if (hpl_profile_self(&p, &d, &err)) { fprintf(stderr, "hearth profile: %s\n", err.msg); return 1; }
    if (o->json) {
        char *s = hpl_device_json(&d);
        if (s) puts(s);
        free(s);
    } else {
        printf("this device (%s in %.0f ms):\n", d.cached ? "from the cache" : "measured", d.profile_ms);
        cli_print_device(0, "here", &d);
    }
    return 0;
}

const cli_command cli_profile = {
    "profile", CLI_PROFILE, "measure this device for the planner (cached)", "[-t N] [-m MODEL] [--json] [--no-cache]",
    "Measures this device once — matrix-vector and matrix-matrix speed per weight type with hearth's\n"
    "kernels, memory bandwidth, the memory it may use, its CPU quota, the cold read speed of the disk\n"
    "holding MODEL and the CPU time that read takes per GB — and caches it in\n"
    "$XDG_CACHE_HOME/hearth/profile.json (or ~/.cache/...), keyed by the CPU, core count, threads,\n"
    "memory and CPU limits and the disk: a change of any of them measures again. The memory figures\n"
    "are read fresh every time. docs/planner.md.",
    .run = profile_run};
