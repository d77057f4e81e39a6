// modules: base quant gguf model mem net cluster text
/* test-cache-bound: the worker's slice cache stays within --cache-max and never fills the disk
 * (src/cluster/slice.c, docs/model.md "The slice cache's bound").
 * - Eviction order: the least recently used file goes first (modification time; a touch is a use),
 *   only as many as the bound needs, and the bound then holds.
 * - A file a session holds (a shared flock, from this process or another) and a file in the keep
 *   list are never evicted; when only they are left, a clear HR_ERANGE.
 * - A share larger than the bound is refused before anything is evicted.
 * - On a small tmpfs (mounted in a private mount namespace; skipped where that is not allowed): the
 *   free-space check refuses what would eat into the margin, evicting old files first frees room,
 *   and a held file still stays. */
#define _GNU_SOURCE
#include "cluster/cluster-impl.h"
#include "test.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>

#define MIB (1u << 20)

/* a file of bytes pseudo-random bytes (real blocks: tmpfs and compressing filesystems count them),
   last used `age` seconds ago */
static void make_file(const char *path, size_t bytes, int age) {
    static uint64_t x = 7;
    FILE *f = fopen(path, "wb");
    REQUIRE_VOID(f);
    uint64_t buf[512];
    for (size_t done = 0; done < bytes; done += sizeof buf) {
        for (int i = 0; i < 512; i++) buf[i] = test_splitmix64(&x);
        fwrite(buf, 1, HR_MIN(sizeof buf, bytes - done), f);
    }
    fclose(f);
    struct timespec ts[2] = {{.tv_sec = time(NULL) - age}, {.tv_sec = time(NULL) - age}};
    utimensat(AT_FDCWD, path, ts, 0);
}

static bool exists(const char *dir, const char *name) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static void test_bound(const char *cache) {
    char m[128], p[256];
    snprintf(m, sizeof m, "%s/0123456789abcdef", cache);
    /* a cache with nothing in it yet (or no folder): room, and nothing to sort (UBSan saw qsort(NULL)) */
    hr_err e0 = {0};
    CHECK(hc_cache_make_room(cache, MIB, 4 * MIB, NULL, 0, NULL, &e0) == 0);
    REQUIRE_VOID(mkdir(cache, 0755) == 0);
    CHECK(hc_cache_make_room(cache, MIB, 4 * MIB, NULL, 0, NULL, &e0) == 0);
    REQUIRE_VOID(mkdir(m, 0755) == 0);
    const char *names[4] = {"a.gguf", "b.gguf", "c.gguf", "d.gguf"};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", m, names[i]);
        make_file(p, MIB, 400 - 100 * i);  /* a oldest, d newest */
    }
    /* b is used now: it becomes the newest, so a then c go first */
    snprintf(p, sizeof p, "%s/b.gguf", m);
    hc_cache_touch(p);
    hr_err e = {0};
    uint64_t ev = 0;
    CHECK(hc_cache_make_room(cache, 3 * MIB / 2, 4 * MIB, NULL, 0, &ev, &e) == 0);
    CHECK(!exists(m, "a.gguf") && !exists(m, "c.gguf") && exists(m, "b.gguf") && exists(m, "d.gguf"));
    CHECKF(ev >= 2 * MIB && ev < 3 * MIB, "evicted %llu bytes", (unsigned long long)ev);
    /* the bound holds with the new file: 2 MiB left + 1.5 <= 4 */
    CHECK(hc_cache_make_room(cache, 2 * MIB, 4 * MIB, NULL, 0, &ev, &e) == 0 && ev == 0);

    /* d (the oldest now) is held by a session, b is in the keep list: nothing can go */
    char pd[256], pb[256];
    snprintf(pd, sizeof pd, "%s/d.gguf", m);
    snprintf(pb, sizeof pb, "%s/b.gguf", m);
    utimensat(AT_FDCWD, pd, (struct timespec[2]){{.tv_sec = 1}, {.tv_sec = 1}}, 0);
    int hold = hc_cache_hold(pd);
    CHECK(hold >= 0);
    const char *keep[1] = {pb};
    e = (hr_err){0};
    CHECK(hc_cache_make_room(cache, 3 * MIB, 4 * MIB, keep, 1, &ev, &e) == HR_ERANGE);
    CHECKF(strstr(e.msg, "in use") != NULL, "%s", e.msg);
    CHECK(exists(m, "b.gguf") && exists(m, "d.gguf") && ev == 0);
    /* held by another process too */
    pid_t pid = fork();
    if (pid == 0) _exit(hc_cache_make_room(cache, 3 * MIB, 4 * MIB, keep, 1, NULL, &e) == HR_ERANGE &&
                        access(pd, F_OK) == 0 ? 0 : 1);
    int st;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* let d go: now it is evicted (the oldest), b still kept */
    close(hold);
    CHECK(hc_cache_make_room(cache, 3 * MIB, 4 * MIB, keep, 1, &ev, &e) == 0);
    CHECK(!exists(m, "d.gguf") && exists(m, "b.gguf") && ev >= MIB);

    /* a share bigger than the bound: refused, nothing evicted */
    e = (hr_err){0};
    CHECK(hc_cache_make_room(cache, 5 * MIB, 4 * MIB, NULL, 0, &ev, &e) == HR_ERANGE);
    CHECKF(strstr(e.msg, "--cache-max") != NULL, "%s", e.msg);
    CHECK(exists(m, "b.gguf"));
    /* files that are not slice files are left alone */
    snprintf(p, sizeof p, "%s/notes.txt", m);
    make_file(p, MIB, 999);
    CHECK(hc_cache_make_room(cache, 4 * MIB, 4 * MIB, NULL, 0, &ev, &e) == 0);
    CHECK(exists(m, "notes.txt") && !exists(m, "b.gguf"));
}

/* the free-space check on an 8 MiB tmpfs (margin: 5% = 0.4 MiB) */
static void test_disk(const char *dir) {
    if (unshare(CLONE_NEWNS) || mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
        mount("tmpfs", dir, "tmpfs", 0, "size=8m")) {
        printf("test-cache-bound: cannot mount a tmpfs here (not root?): free-space checks skipped\n");
        return;
    }
    CHECK(hc_disk_margin(8 * MIB) == 8 * MIB / 20 && hc_disk_margin(1ull << 40) == 1ull << 30);
    hr_err e = {0};
    CHECK(hc_disk_room(dir, 7 * MIB, &e) == 0);
    CHECK(hc_disk_room(dir, 15 * MIB / 2 + MIB / 4, &e) == HR_ERANGE);  /* would eat into the margin */
    CHECKF(strstr(e.msg, "no room on the disk") && strstr(e.msg, "kept free"), "%s", e.msg);
    char cache[128], m[192], p[256];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    snprintf(m, sizeof m, "%s/00000000000000aa", cache);
    REQUIRE_VOID(mkdir(cache, 0755) == 0 && mkdir(m, 0755) == 0);
    snprintf(p, sizeof p, "%s/old.gguf", m);
    make_file(p, 3 * MIB, 100);
    snprintf(p, sizeof p, "%s/new.gguf", m);
    make_file(p, 3 * MIB, 10);
    /* 2 MiB free: a 2.5 MiB file needs the old one gone (no --cache-max: the disk alone bounds) */
    uint64_t ev = 0;
    CHECK(hc_cache_make_room(cache, 5 * MIB / 2, 0, NULL, 0, &ev, &e) == 0);
    CHECK(!exists(m, "old.gguf") && exists(m, "new.gguf") && ev == 3 * MIB);
    /* the held new file stays, and 6 MiB cannot fit: a clear error naming the disk */
    int hold = hc_cache_hold(p);
    e = (hr_err){0};
    CHECK(hc_cache_make_room(cache, 6 * MIB, 0, NULL, 0, &ev, &e) == HR_ERANGE);
    CHECKF(strstr(e.msg, "no room on the disk") != NULL, "%s", e.msg);
    CHECK(exists(m, "new.gguf"));
    close(hold);
    umount(dir);
}

int main(void) {
    char tmp[] = "/tmp/test-cache-bound-XXXXXX";
    REQUIRE(mkdtemp(tmp));
    char cache[64], disk[64];
    snprintf(cache, sizeof cache, "%s/cache", tmp);
    snprintf(disk, sizeof disk, "%s/disk", tmp);
    test_bound(cache);
    REQUIRE(mkdir(disk, 0755) == 0);
    test_disk(disk);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    CHECK(system(cmd) == 0);
    return test_summary();
}
