/* file.c: the io layer's file primitives: opening untrusted files without blocking (a FIFO,
 * a device), sizes and exact reads, and the atomic writer (temporary in the same folder,
 * fsync, rename, fsync of the folder) with its check of where it writes: never over what is not
 * a regular file (a device, FIFO, socket, folder), through a symlink to a regular file. */
#define _GNU_SOURCE /* sync_file_range */
#include "io/io_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FLUSH_BYTES ((size_t)64 << 20)

int loom__file_size(const char *who, const char *path, int fd, size_t *size) {
  struct stat st;
  if (fstat(fd, &st) != 0)
    return loom__fail(LOOM_EIO, "%s: cannot stat '%s': %s", who, path, strerror(errno));
  if (!S_ISREG(st.st_mode))
    return loom__fail(LOOM_EIO, "%s: '%s' is not a regular file", who, path);
  *size = (size_t)st.st_size;
  return LOOM_OK;
}

int loom__file_open_read(const char *who, const char *path, int *fd, size_t *size) {
  *fd = -1;
  int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (f < 0)
    return loom__fail(errno == ENOENT ? LOOM_ENOTFOUND : LOOM_EIO, "%s: cannot open '%s': %s", who,
                      path, strerror(errno));
  int rc = loom__file_size(who, path, f, size);
  int flags = rc ? 0 : fcntl(f, F_GETFL);
  if (!rc && (flags < 0 || fcntl(f, F_SETFL, flags & ~O_NONBLOCK) != 0))
    rc = loom__fail(LOOM_EIO, "%s: '%s': cannot clear O_NONBLOCK: %s", who, path, strerror(errno));
  if (rc) {
    close(f);
    return rc;
  }
  *fd = f;
  return LOOM_OK;
}

int loom__file_pread(const char *who, const char *path, int fd, void *buf, size_t n,
                     size_t offset) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      return loom__fail(LOOM_EIO, "%s: cannot read '%s': %s", who, path, strerror(errno));
    if (r == 0)
      return loom__fail(LOOM_EFORMAT, "%s: '%s' is truncated: %zu bytes missing at offset %zu",
                        who, path, n - done, offset + done);
    done += (size_t)r;
  }
  return LOOM_OK;
}

static const char *kind_of(mode_t m) {
  return S_ISDIR(m) ? "a folder" : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
       : S_ISFIFO(m) ? "a FIFO" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

int loom__output_path(const char *who, const char *path, char *resolved, size_t cap) {
  if (!path || !path[0]) return loom__fail(LOOM_EINVAL, "%s: empty path", who);
  struct stat l, st;
  if (lstat(path, &l) != 0) {
    if (errno != ENOENT)
      return loom__fail(LOOM_EIO, "%s: cannot stat '%s': %s", who, path, strerror(errno));
    l.st_mode = S_IFREG; /* a new file */
  } else if (S_ISLNK(l.st_mode)) {
    if (stat(path, &st) != 0)
      return loom__fail(LOOM_EIO, "%s: '%s' is a symlink to %s, not a regular file", who, path,
                        errno == ENOENT ? "nothing" : strerror(errno));
    if (!S_ISREG(st.st_mode))
      return loom__fail(LOOM_EIO, "%s: '%s' is a symlink to %s, not a regular file", who, path,
                        kind_of(st.st_mode));
    char *real = realpath(path, NULL);
    if (!real) return loom__fail(LOOM_EIO, "%s: cannot resolve '%s': %s", who, path, strerror(errno));
    size_t n = strlen(real);
    if (n >= cap) {
      free(real);
      return loom__fail(LOOM_EINVAL, "%s: the target of '%s' is too long a path", who, path);
    }
    memcpy(resolved, real, n + 1);
    free(real);
    return LOOM_OK;
  }
  if (!S_ISREG(l.st_mode))
    return loom__fail(LOOM_EIO, "%s: '%s' is %s, not a regular file", who, path,
                      kind_of(l.st_mode));
  if (strlen(path) >= cap) return loom__fail(LOOM_EINVAL, "%s: '%s' is too long a path", who, path);
  memmove(resolved, path, strlen(path) + 1);
  return LOOM_OK;
}

int loom_output_path(const char *path, char *resolved, size_t cap) {
  return loom__output_path("loom_output_path", path, resolved, cap);
}

void loom__afile_abort(loom__afile *a) {
  if (a->fd >= 0) close(a->fd);
  if (a->tmp) unlink(a->tmp);
  loom__free(a->tmp);
  loom__free(a->path);
  a->fd = -1;
  a->tmp = a->path = NULL;
}

int loom__afile_open(const char *who, const char *path, loom__afile *a) {
  a->fd = -1;
  a->tmp = a->path = NULL;
  a->written = a->flushed = 0;
  char target[4096];
  int rc = loom__output_path(who, path, target, sizeof target);
  if (rc) return rc;
  path = target;
  a->path = loom__strdup(LOOM_POOL_META, path);
  size_t len = strlen(path) + sizeof LOOM__AFILE_SUFFIX + LOOM__AFILE_RANDOM;
  a->tmp = loom__malloc(LOOM_POOL_META, len);
  if (!a->path || !a->tmp) {
    loom__free(a->tmp); /* not created yet: nothing to unlink */
    a->tmp = NULL;
    loom__afile_abort(a);
    return loom__fail(LOOM_ENOMEM, "%s: out of memory for the path", who);
  }
  snprintf(a->tmp, len, "%s" LOOM__AFILE_SUFFIX "%.*s", path, LOOM__AFILE_RANDOM, "XXXXXXXXXX");
  a->fd = mkstemp(a->tmp);
  if (a->fd < 0) {
    int e = errno;
    loom__free(a->tmp);
    a->tmp = NULL;
    loom__afile_abort(a);
    return loom__fail(LOOM_EIO, "%s: cannot create a temporary file for '%s': %s", who, path,
                      strerror(e));
  }
  fchmod(a->fd, 0644);
  return LOOM_OK;
}

int loom__afile_write(const char *who, loom__afile *a, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t w = write(a->fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      return loom__fail(LOOM_EIO, "%s: cannot write '%s': %s", who, a->path,
                        w < 0 ? strerror(errno) : "no progress");
    p += w;
    n -= (size_t)w;
    a->written += (size_t)w;
  }
  if (a->written - a->flushed >= FLUSH_BYTES) {
    off_t from = (off_t)a->flushed, len = (off_t)(a->written - a->flushed);
    (void)sync_file_range(a->fd, from, len,
                          SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                              SYNC_FILE_RANGE_WAIT_AFTER);
    (void)posix_fadvise(a->fd, from, len, POSIX_FADV_DONTNEED);
    a->flushed = a->written;
  }
  return LOOM_OK;
}

int loom__folder_of(const char *who, const char *path, char *dir, size_t cap) {
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, cap, ".");
  else if (slash == path) snprintf(dir, cap, "/");
  else if ((size_t)(slash - path) >= cap)
    return loom__fail(LOOM_EIO, "%s: folder of '%s' is too long a path", who, path);
  else snprintf(dir, cap, "%.*s", (int)(slash - path), path);
  return LOOM_OK;
}

/* fsync the folder holding path, so the rename itself is durable. */
static int sync_dir(const char *who, const char *path) {
  char dir[4096];
  int rc = loom__folder_of(who, path, dir, sizeof dir);
  if (rc) return rc;
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return loom__fail(LOOM_EIO, "%s: cannot open folder '%s': %s", who, dir, strerror(errno));
  rc = fsync(fd) == 0 || errno == EINVAL ? LOOM_OK
                                             : loom__fail(LOOM_EIO, "%s: cannot sync folder '%s': %s",
                                                          who, dir, strerror(errno));
  close(fd);
  return rc;
}

int loom__afile_commit(const char *who, loom__afile *a) {
  int rc = LOOM_OK;
  if (fsync(a->fd) != 0) {
    rc = loom__fail(LOOM_EIO, "%s: cannot sync '%s': %s", who, a->tmp, strerror(errno));
    goto fail;
  }
  int fd = a->fd;
  a->fd = -1;
  if (close(fd) != 0) {
    rc = loom__fail(LOOM_EIO, "%s: cannot close '%s': %s", who, a->tmp, strerror(errno));
    goto fail;
  }
  if (rename(a->tmp, a->path) != 0) {
    rc = loom__fail(LOOM_EIO, "%s: cannot rename '%s' to '%s': %s", who, a->tmp, a->path,
                    strerror(errno));
    goto fail;
  }
  loom__free(a->tmp);
  a->tmp = NULL;
  rc = sync_dir(who, a->path);
  loom__afile_abort(a); /* frees the names; the temporary is gone */
  return rc;
fail:
  loom__afile_abort(a);
  return rc;
}
