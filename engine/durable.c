/* durable.c — how the engine puts a file in place so that a crash never
 * leaves half of one: write a temp file (hashing what it writes), fsync it,
 * rename it over the target, fsync the directory. Checkpoints and
 * training-state files both go this way. A target that exists and is not a
 * plain regular file (a pipe, a terminal, a device, or a link such as
 * /dev/stdout, which names whatever the process's output is) is written
 * straight instead: renaming over it would replace the link or device
 * itself. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graph_internal.h"

int kn_write_all(int fd, const void *buf, size_t len, kc_sha256 *h) {
  const char *p = buf;
  if (h) kc_sha256_update(h, buf, len);
  while (len > 0) {
    ssize_t w = write(fd, p, len);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

int kn_durable_open(const char *path, char *tmp, size_t tmplen, const char *what, char *err,
                    size_t errlen) {
  struct stat st;
  const int stream = lstat(path, &st) == 0 && !S_ISREG(st.st_mode);
  if (stream)
    tmp[0] = '\0';
  else
    snprintf(tmp, tmplen, "%s.tmp", path);
  const int fd = stream ? open(path, O_WRONLY | O_TRUNC | O_CLOEXEC)
                        : open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    snprintf(err, errlen, "%s: cannot create %s: %s", what, stream ? path : tmp, strerror(errno));
  return fd;
}

int kn_durable_finish(int fd, int write_failed, const char *tmp, const char *path, const char *what,
                      char *err, size_t errlen) {
  int rc = KN_OK;
  const char *written = tmp[0] ? tmp : path;
  if (write_failed || (tmp[0] && fsync(fd) != 0)) {
    snprintf(err, errlen, "%s: cannot write %s: %s", what, written, strerror(errno));
    rc = KN_EIO;
  }
  if (close(fd) != 0 && !rc) {
    snprintf(err, errlen, "%s: cannot close %s: %s", what, written, strerror(errno));
    rc = KN_EIO;
  }
  if (!tmp[0]) return rc; /* written straight: nothing to rename */
  if (!rc && rename(tmp, path) != 0) {
    snprintf(err, errlen, "%s: cannot rename %s to %s: %s", what, tmp, path, strerror(errno));
    rc = KN_EIO;
  }
  if (rc) {
    unlink(tmp);
    return rc;
  }
  /* Make the rename itself durable. */
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return KN_OK;
}
