/* test.h — the few macros every tests/test-*.c uses. A failed CHECK prints file:line and the
   expression, counts a failure and goes on; main returns test_summary() which prints
   "N passed, N failed" and is non-zero on any failure. Exit code 77 = skipped (CTest). */
#ifndef HEARTH_TEST_H
#define HEARTH_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int test_n_pass, test_n_fail;

#define CHECK(x) do { if (x) test_n_pass++; else { test_n_fail++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #x); } } while (0)
#define CHECKF(x, ...) do { if (x) test_n_pass++; else { test_n_fail++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #x); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define REQUIRE(x) do { if (!(x)) { fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #x); \
    test_n_fail++; return test_summary(); } } while (0)

#define REQUIRE_VOID(x) do { if (!(x)) { fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #x); \
    test_n_fail++; return; } } while (0)

/* splitmix64: the tests' reproducible pseudo-random numbers (*state is the stream) */
static inline uint64_t test_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline int test_summary(void) {
    printf("%d passed, %d failed\n", test_n_pass, test_n_fail);
    return test_n_fail ? 1 : 0;
}

/* ../shared (HEARTH_SHARED from CTest); skips the test (exit 77) with a message if absent */
static inline const char *test_shared_dir(void) {
    const char *d = getenv("HEARTH_SHARED");
    if (!d) d = "../shared";
    char p[4096];
    if (snprintf(p, sizeof p, "%s/models/stories260K.gguf", d) >= (int)sizeof p) exit(1);
    FILE *f = fopen(p, "rb");
    if (!f) { printf("SKIPPED: shared data not found at %s (set HEARTH_SHARED)\n", d); exit(77); }
    fclose(f);
    return d;
}

static inline char *test_path(const char *dir, const char *rel) {
    static char buf[8][4096];
    static int k;
    char *b = buf[k++ & 7];
    if (snprintf(b, 4096, "%s/%s", dir, rel) >= 4096) { fprintf(stderr, "path too long\n"); exit(1); }
    return b;
}

/* whole file into memory (caller frees); NULL if unreadable */
static inline void *test_read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(n > 0 ? (size_t)n : 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) { free(p); p = NULL; }
    fclose(f);
    if (size) *size = (size_t)n;
    return p;
}

/* runs this test again with env=1 (HEARTH_NO_SIMD: the generic kernel table; HEARTH_NO_AVX512: the
   AVX2 family on a CPU that has AVX-512) and the flag --no-reexec, in a child process (the kernel
   table is filled once per process); its failure is one failed check here */
static inline void test_rerun_with(const char *self, const char *env) {
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
        setenv(env, "1", 1);
        execl("/proc/self/exe", self, "--no-reexec", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s=1 run failed (status %d)", env, status);
}

#endif
