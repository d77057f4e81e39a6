/* mem: how much memory there is — /proc/meminfo, the cgroup limit, TESTBED_MEM_LIMIT, /proc/self/io */
#include "mem.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

/* reads a small text file (proc/sysfs) into buf, NUL-terminated; false if it cannot */
static bool read_text(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, cap - 1, f);
    bool ok = !ferror(f);
    fclose(f);
    buf[n] = 0;
    return ok;
}

/* value of "Key:   123 kB" in meminfo-style text, in bytes; false if absent */
static bool meminfo_field(const char *text, const char *key, uint64_t *out) {
    size_t kl = strlen(key);
    for (const char *line = text, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (strncmp(line, key, kl) || line[kl] != ':') continue;
        char *end;
        errno = 0;
        unsigned long long v = strtoull(line + kl + 1, &end, 10);
        if (errno || end == line + kl + 1) return false;
        while (*end == ' ' || *end == '\t') end++;
        uint64_t mult = strncmp(end, "kB", 2) == 0 ? 1024 : 1;
        if (v > UINT64_MAX / mult) return false;
        *out = (uint64_t)v * mult;
        return true;
    }
    return false;
}

int hmem_parse_meminfo(const char *text, uint64_t *total, uint64_t *available) {
    if (!text || !meminfo_field(text, "MemTotal", total)) return HR_EFORMAT;
    if (meminfo_field(text, "MemAvailable", available)) return 0;
    /* kernels before 3.14 have no MemAvailable: free + buffers + page cache approximates it */
    uint64_t fr = 0, bu = 0, ca = 0;
    if (!meminfo_field(text, "MemFree", &fr)) return HR_EFORMAT;
    meminfo_field(text, "Buffers", &bu);
    meminfo_field(text, "Cached", &ca);
    *available = fr + bu + ca;
    return 0;
}

/* a cgroup limit file: a byte count, "max" (v2) or a huge number (v1's "unlimited"); 0 = no limit */
static uint64_t read_limit(const char *path) {
    char buf[64];
    if (!read_text(path, buf, sizeof buf)) return 0;
    if (!strncmp(buf, "max", 3)) return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(buf, &end, 10);
    if (errno || end == buf || v >= (1ull << 60)) return 0;
    return (uint64_t)v;
}

/* The mount point and mount root of the cgroup hierarchy that has the memory controller, from
   /proc/self/mountinfo: v1 (fstype cgroup, "memory" among the super options) or v2 (cgroup2). */
static bool find_cgroup_mount(bool v2, char *mnt, size_t mcap, char *root, size_t rcap) {
    FILE *f = fopen("/proc/self/mountinfo", "r");
    if (!f) return false;
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        /* id parent maj:min root mountpoint options [optional...] - fstype source superoptions */
        char *sep = strstr(line, " - ");
        if (!sep) continue;
        char fstype[32], source[256], super[1024] = "";
        if (sscanf(sep + 3, "%31s %255s %1023s", fstype, source, super) < 2) continue;
        if (strcmp(fstype, v2 ? "cgroup2" : "cgroup")) continue;
        if (!v2) {
            bool has = false;
            char *save = NULL;
            for (char *t = strtok_r(super, ",", &save); t; t = strtok_r(NULL, ",", &save)) has |= !strcmp(t, "memory");
            if (!has) continue;
        }
        char r[1024], m[1024];
        if (sscanf(line, "%*s %*s %*s %1023s %1023s", r, m) != 2) continue;
        if (strlen(m) >= mcap || strlen(r) >= rcap) continue;
        strcpy(mnt, m);
        strcpy(root, r);
        found = true;
    }
    fclose(f);
    return found;
}

/* The tightest limit on the way from the process's cgroup up to the mount point, and the usage of
   the process's own cgroup. */
static void read_cgroup(hmem_sysmem *s) {
    char text[4096];
    if (!read_text("/proc/self/cgroup", text, sizeof text)) return;
    char path_v1[1024] = "", path_v2[1024] = "";
    bool have_v1 = false, have_v2 = false;
    for (char *line = text; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        /* id:controllers:path */
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (c2 && strlen(c2 + 1) < sizeof path_v1) {
            *c2 = 0;
            const char *ctl = c1 + 1;
            if (!strcmp(line, "0") && !*ctl) { strcpy(path_v2, c2 + 1); have_v2 = true; }
            else {
                char copy[256];
                snprintf(copy, sizeof copy, "%s", ctl);
                char *save = NULL;
                for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
                    if (!strcmp(t, "memory")) { strcpy(path_v1, c2 + 1); have_v1 = true; }
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    bool v2 = !have_v1;
    if (!have_v1 && !have_v2) return;
    char mnt[1024], root[1024];
    if (!find_cgroup_mount(v2, mnt, sizeof mnt, root, sizeof root)) return;
    const char *cg = v2 ? path_v2 : path_v1;
    /* the path in /proc/self/cgroup is relative to the hierarchy's root; the mount may show a subtree */
    size_t rl = strlen(root);
    if (strcmp(root, "/") && !strncmp(cg, root, rl) && (cg[rl] == '/' || !cg[rl])) cg += rl;
    char dir[2200];
    snprintf(dir, sizeof dir, "%s%s", mnt, cg);
    size_t ml = strlen(mnt);
    while (strlen(dir) > ml && dir[strlen(dir) - 1] == '/') dir[strlen(dir) - 1] = 0;
    const char *limit_name = v2 ? "memory.max" : "memory.limit_in_bytes";
    const char *usage_name = v2 ? "memory.current" : "memory.usage_in_bytes";
    char f[2400];
    snprintf(f, sizeof f, "%s/%s", dir, usage_name);
    s->cgroup_usage = read_limit(f);
    for (;;) {
        snprintf(f, sizeof f, "%s/%s", dir, limit_name);
        uint64_t lim = read_limit(f);
        if (lim && (!s->cgroup_limit || lim < s->cgroup_limit)) s->cgroup_limit = lim;
        char *slash = strrchr(dir, '/');
        if (strlen(dir) <= ml || !slash || (size_t)(slash - dir) < ml) break;
        *slash = 0;
    }
}

int hmem_read_meminfo(uint64_t *total, uint64_t *available) {
    char text[8192];
    if (!read_text("/proc/meminfo", text, sizeof text)) return HR_EIO;
    return hmem_parse_meminfo(text, total, available);
}

int hmem_sysmem_read(hmem_sysmem *out, hr_err *err) {
    memset(out, 0, sizeof *out);
    int rc = hmem_read_meminfo(&out->mem_total, &out->mem_available);
    if (rc == HR_EIO) return hr_fail(err, rc, "cannot read /proc/meminfo: %s", strerror(errno));
    if (rc) return hr_fail(err, rc, "/proc/meminfo has no MemTotal/MemAvailable");
    read_cgroup(out);
    const char *env = getenv("TESTBED_MEM_LIMIT");
    if (env && *env) {
        int64_t v = hr_parse_size(env);
        if (v > 0) out->env_limit = (uint64_t)v;
        else if (v < 0) HR_LOGW("mem: ignoring TESTBED_MEM_LIMIT='%s' (not a size)", env);
    }
    return 0;
}

/* the smallest of MemAvailable (MemTotal if unknown), the cgroup limit and TESTBED_MEM_LIMIT */
static uint64_t sysmem_base(const hmem_sysmem *s) {
    uint64_t base = s->mem_available ? s->mem_available : s->mem_total;
    if (s->cgroup_limit && s->cgroup_limit < base) base = s->cgroup_limit;
    if (s->env_limit && s->env_limit < base) base = s->env_limit;
    return base;
}

uint64_t hmem_default_budget(const hmem_sysmem *s) { return (uint64_t)((double)sysmem_base(s) * HMEM_DEFAULT_FRACTION); }

int hmem_check_ctx(uint64_t ctx_bytes, hr_err *err) {
    hmem_sysmem s;
    hr_err e = {0};
    if (hmem_sysmem_read(&s, &e)) return 0; /* no figures: the allocation will tell */
    const uint64_t base = sysmem_base(&s);
    if (ctx_bytes <= base) return 0;
    return hr_fail(err, HR_ENOMEM,
                   "the context's KV cache and scratch need %.1f MiB, more than the %.1f MiB of memory available "
                   "(MemAvailable, cgroup limit): use a shorter context",
                   ctx_bytes / 1048576.0, base / 1048576.0);
}

int64_t hmem_proc_read_bytes(void) {
    char text[1024];
    if (!read_text("/proc/self/io", text, sizeof text)) return -1;
    uint64_t v;
    if (!meminfo_field(text, "read_bytes", &v) || v > INT64_MAX) return -1;
    return (int64_t)v;
}
