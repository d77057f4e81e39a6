/* net/key: the cluster key — 32 random bytes every device of one household shares (issue 29).
   The file holds them as one line of base64 (44 characters, as WireGuard's key files do), so that a
   key can be copied between devices as text. Who holds the key may join the cluster; everything
   derived from it for the wire (handshake, traffic keys) lives in the transport, not here. */
#include "net.h"

#include <sodium.h>

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define KEY_FILE_MAX 1024 /* a key file is one line; anything bigger is not one */

static int sodium_ready(hr_err *err) {
    if (sodium_init() < 0) return hr_fail(err, HR_EIO, "libsodium could not be initialised");
    return 0;
}

int hn_key_default_path(char *out, size_t cap, hr_err *err) {
    const char *x = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    int n;
    if (x && *x) n = snprintf(out, cap, "%s/hearth/cluster.key", x);
    else if (home && *home) n = snprintf(out, cap, "%s/.config/hearth/cluster.key", home);
    else return hr_fail(err, HR_ENOTFOUND, "neither XDG_CONFIG_HOME nor HOME is set: no default place for the cluster key");
    if (n < 0 || (size_t)n >= cap) return hr_fail(err, HR_ERANGE, "the cluster key's default path is too long");
    return 0;
}

int hn_key_generate(const char *path, hn_key *out, hr_err *err) {
    if (sodium_ready(err)) return err ? err->code : HR_EIO;
    hn_key k;
    randombytes_buf(k.k, sizeof k.k);
    char line[sodium_base64_ENCODED_LEN(HN_KEY_SIZE, sodium_base64_VARIANT_ORIGINAL) + 1];
    sodium_bin2base64(line, sizeof line - 1, k.k, sizeof k.k, sodium_base64_VARIANT_ORIGINAL);
    size_t n = strlen(line);
    line[n++] = '\n';
    /* O_EXCL: an existing key (perhaps the only copy a cluster has) is never replaced */
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        int e = errno;
        sodium_memzero(&k, sizeof k);
        sodium_memzero(line, sizeof line);
        if (e == EEXIST) return hr_fail(err, HR_EEXIST, "%s exists: refusing to overwrite a cluster key (remove it first if you mean to)", path);
        return hr_fail(err, HR_EIO, "cannot create %s: %s", path, strerror(e));
    }
    ssize_t w = write(fd, line, n);
    int e = errno;
    int rc = (w == (ssize_t)n && fsync(fd) == 0) ? 0 : -1;
    if (close(fd) != 0 && rc == 0) { rc = -1; e = errno; }
    sodium_memzero(line, sizeof line);
    if (rc) {
        unlink(path);
        sodium_memzero(&k, sizeof k);
        return hr_fail(err, HR_EIO, "cannot write %s: %s", path, strerror(e));
    }
    if (out) *out = k;
    sodium_memzero(&k, sizeof k);
    return 0;
}

int hn_key_load(const char *path, hn_key *out, hr_err *err) {
    if (sodium_ready(err)) return err ? err->code : HR_EIO;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return hr_fail(err, errno == ENOENT ? HR_ENOTFOUND : HR_EIO, "cannot open the cluster key %s: %s%s", path,
                               strerror(errno), errno == ENOENT ? " (make one with 'hearth keygen')" : "");
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > KEY_FILE_MAX) {
        close(fd);
        return hr_fail(err, HR_EFORMAT, "%s is not a hearth cluster key (not a small regular file)", path);
    }
    if (st.st_mode & 077)
        HR_LOGW("the cluster key %s can be read by other users of this machine (chmod 600 it)", path);
    char buf[KEY_FILE_MAX + 1];
    ssize_t n = read(fd, buf, KEY_FILE_MAX);
    int e = errno;
    close(fd);
    if (n < 0) return hr_fail(err, HR_EIO, "cannot read %s: %s", path, strerror(e));
    size_t len = (size_t)n;
    while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' ' || buf[len - 1] == '\t')) len--;
    size_t got = 0;
    const char *end = NULL;
    hn_key k;
    int rc = sodium_base642bin(k.k, sizeof k.k, buf, len, NULL, &got, &end, sodium_base64_VARIANT_ORIGINAL);
    sodium_memzero(buf, sizeof buf);
    if (rc != 0 || got != HN_KEY_SIZE || end != buf + len) {
        sodium_memzero(&k, sizeof k);
        return hr_fail(err, HR_EFORMAT, "%s is not a hearth cluster key (expected one line of base64 holding %d bytes, as "
                       "'hearth keygen' writes)", path, HN_KEY_SIZE);
    }
    *out = k;
    sodium_memzero(&k, sizeof k);
    return 0;
}

void hn_key_id(const hn_key *k, uint8_t id[HN_KEY_ID_SIZE]) {
    /* a keyed hash of a fixed label: names the key (logs, discovery hints) without revealing it */
    static const char label[] = "hearth cluster key id v1";
    HR_ASSERT(sodium_init() >= 0);
    crypto_generichash(id, HN_KEY_ID_SIZE, (const uint8_t *)label, sizeof label - 1, k->k, sizeof k->k);
}

void hn_key_id_hex(const hn_key *k, char out[2 * HN_KEY_ID_SIZE + 1]) {
    uint8_t id[HN_KEY_ID_SIZE];
    hn_key_id(k, id);
    sodium_bin2hex(out, 2 * HN_KEY_ID_SIZE + 1, id, sizeof id);
}

void hn_key_wipe(hn_key *k) { sodium_memzero(k, sizeof *k); }
