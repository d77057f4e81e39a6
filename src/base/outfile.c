/* outfile: an output path written safely — a regular file (or a new one) through a temporary file
   renamed over it, anything else (a device, a FIFO, a symbolic link) written through in place so
   that it is never replaced by a regular file. See base.h. */
#include "base.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

int hr_outfile_open(hr_outfile *o, const char *path, hr_err *err) {
    *o = (hr_outfile){0};
    struct stat st = {0};
    bool through = lstat(path, &st) == 0 && !S_ISREG(st.st_mode);
    if (through && S_ISDIR(st.st_mode)) return hr_fail(err, HR_EINVAL, "'%s' is a directory", path);
    size_t n = strlen(path);
    if (!(o->path = strdup(path))) return hr_fail(err, HR_ENOMEM, "out of memory");
    if (!through) {
        if (!(o->tmp = malloc(n + 5))) { hr_outfile_abort(o); return hr_fail(err, HR_ENOMEM, "out of memory"); }
        memcpy(o->tmp, path, n);
        memcpy(o->tmp + n, ".tmp", 5);
    }
    /* a .tmp left by a crashed run is ours to replace; a device or FIFO is only opened, never created */
    const char *p = o->tmp ? o->tmp : path;
    int fd = open(p, O_WRONLY | O_CLOEXEC | (o->tmp || S_ISLNK(st.st_mode) ? O_CREAT | O_TRUNC : 0), 0644);
    if (fd < 0) {
        hr_fail(err, HR_EIO, "%s: cannot open for writing: %s", p, strerror(errno));
        free(o->tmp);
        o->tmp = NULL; /* nothing of ours to remove */
        hr_outfile_abort(o);
        return HR_EIO;
    }
    if (!(o->f = fdopen(fd, "wb"))) {
        hr_fail(err, HR_EIO, "%s: fdopen failed: %s", p, strerror(errno));
        close(fd);
        hr_outfile_abort(o);
        return HR_EIO;
    }
    return 0;
}

const char *hr_outfile_name(const hr_outfile *o) { return o->tmp ? o->tmp : o->path; }

int hr_outfile_commit(hr_outfile *o, hr_err *err) {
    FILE *f = o->f;
    o->f = NULL;
    struct stat st;
    bool reg = fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode);
    /* fsync means nothing to a pipe or a device (and fails there); a regular file must reach the disk
       before it replaces the old one */
    bool ok = fflush(f) == 0 && !ferror(f) && (!reg || fsync(fileno(f)) == 0);
    int e = errno;
    if (fclose(f) != 0 && ok) { ok = false; e = errno; }
    if (!ok) {
        hr_fail(err, HR_EIO, "%s: write failed: %s", hr_outfile_name(o), strerror(e));
        hr_outfile_abort(o);
        return HR_EIO;
    }
    if (o->tmp && rename(o->tmp, o->path) != 0) {
        hr_fail(err, HR_EIO, "cannot rename %s to %s: %s", o->tmp, o->path, strerror(errno));
        hr_outfile_abort(o);
        return HR_EIO;
    }
    free(o->tmp);
    free(o->path);
    *o = (hr_outfile){0};
    return 0;
}

void hr_outfile_abort(hr_outfile *o) {
    if (o->f) fclose(o->f);
    if (o->tmp) unlink(o->tmp);
    free(o->tmp);
    free(o->path);
    *o = (hr_outfile){0};
}
