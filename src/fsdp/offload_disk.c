/* offload_disk.c: the offload store's disk tier (offload_store.h, "Page cache" and
 * "Integrity"): the scratch file (created O_EXCL 0600, the files of dead processes swept), each
 * slot's reserved range, pread/pwrite through the page cache with POSIX_FADV_RANDOM and bounded
 * writeback, or O_DIRECT through aligned bounce blocks, and the CRC-32C of every transfer. The
 * slots, queue and workers are offload_store.c's. */
#define _GNU_SOURCE /* sync_file_range */
#include "fsdp/offload_store_int.h"
#include "core/kernels/kernels.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the disk tier's file -------------------------------------------------------------- */

static bool errno_is_full(int e) { return e == ENOSPC || e == EDQUOT || e == EFBIG; }

/* The file range a slot of `bytes` takes: O_DIRECT writes the last block whole, so its range
 * goes up to the alignment. */
static size_t span(const loom__ostore *s, size_t bytes) {
  return s->direct ? round_up(bytes, DIRECT_ALIGN) : bytes;
}

/* Give `slot` (bytes) the next aligned range of the file, reserved with posix_fallocate so
 * that writing it can no longer run out of space. On failure the file is as it was. */
int loom__odisk_reserve(loom__ostore *s, const char *who, size_t slot, size_t bytes,
                        size_t *off) {
  int rc = LOOM_OK;
  pthread_mutex_lock(&s->space_mu);
  size_t start = (s->end + SLOT_ALIGN - 1) & ~(SLOT_ALIGN - 1);
  if (start < s->end || bytes > (size_t)INT64_MAX - start) {
    rc = loom__fail(LOOM_EIO, "%s: '%s' would grow past the largest file offset for slot %zu",
                    who, s->path, slot);
    goto done;
  }
  if (bytes && !s->dry) {
    int e;
    off_t len = (off_t)span(s, bytes);
    do e = posix_fallocate(s->fd, (off_t)start, len);
    while (e == EINTR);
    if (e && errno_is_full(e)) {
      if (ftruncate(s->fd, (off_t)s->end) != 0) { /* best effort: drop what was reserved */
      }
      rc = loom__fail(LOOM_EIO, "%s: '%s' is full: no room for slot %zu (%zu bytes): %s", who,
                      s->path, slot, bytes, strerror(e));
      goto done;
    }
    /* a filesystem that cannot reserve space (EOPNOTSUPP and the like): the writes grow it */
    if (e && e != EOPNOTSUPP && e != ENOSYS && e != EINVAL) {
      if (ftruncate(s->fd, (off_t)s->end) != 0) {
      }
      rc = loom__fail(LOOM_EIO, "%s: cannot reserve %zu bytes for slot %zu in '%s': %s", who,
                      bytes, slot, s->path, strerror(e));
      goto done;
    }
  }
  *off = start;
  s->end = start + span(s, bytes);
done:
  pthread_mutex_unlock(&s->space_mu);
  if (!rc) loom__mem_account_to(LOOM_POOL_FILE, s->account, (ptrdiff_t)bytes);
  return rc;
}

/* Undo loom__odisk_reserve after the slot's first put failed: the range goes back if nothing was
 * placed after it (otherwise it stays a hole, harmless). */
void loom__odisk_unreserve(loom__ostore *s, size_t off, size_t bytes) {
  pthread_mutex_lock(&s->space_mu);
  if (s->end == off + span(s, bytes)) {
    s->end = off;
    if (ftruncate(s->fd, (off_t)off) != 0) { /* the file just stays longer */
    }
  }
  pthread_mutex_unlock(&s->space_mu);
  loom__mem_account_to(LOOM_POOL_FILE, s->account, -(ptrdiff_t)bytes);
}

/* ---- O_DIRECT: bytes through an aligned bounce block, straight to and from the device ---- */

static _Atomic bool bounce_only;        /* loom__ostore_bounce_only_for_test */
static _Atomic uint64_t straight_bytes; /* loom__ostore_straight_bytes */

/* A bounce block (raw pointer: the free list's link lives in its first bytes; the aligned
 * block is bounce_at), NULL if out of memory. */
static void *bounce_take(loom__ostore *s) {
  pthread_mutex_lock(&s->mu);
  void *raw = s->bounce;
  if (raw) s->bounce = *(void **)raw;
  pthread_mutex_unlock(&s->mu);
  if (!raw) raw = loom__malloc(LOOM_POOL_META, DIRECT_BLOCK + 2 * DIRECT_ALIGN);
  return raw;
}

static unsigned char *bounce_at(void *raw) {
  uintptr_t a = ((uintptr_t)raw + sizeof(void *) + DIRECT_ALIGN - 1) & ~(uintptr_t)(DIRECT_ALIGN - 1);
  return (unsigned char *)a;
}

static void bounce_give(loom__ostore *s, void *raw) {
  pthread_mutex_lock(&s->mu);
  *(void **)raw = s->bounce;
  s->bounce = raw;
  pthread_mutex_unlock(&s->mu);
}

/* Write the aligned block b's first len bytes (a multiple of the alignment) at `at`. */
static int direct_pwrite(loom__ostore *s, const char *who, size_t slot, size_t off, size_t bytes,
                         const unsigned char *b, size_t len, size_t at) {
  for (size_t w = 0; w < len;) {
    ssize_t r = pwrite(s->fd, b + w, len - w, (off_t)(at + w));
    if (r < 0 && errno == EINTR) continue;
    int e = r < 0 ? errno : 0;
    if (r == 0 || (r < 0 && errno_is_full(e)) || (r > 0 && ((size_t)r % DIRECT_ALIGN)))
      return loom__fail(LOOM_EIO, "%s: '%s' is full: cannot write slot %zu (%zu bytes at offset "
                        "%zu): %s", who, s->path, slot, bytes, off,
                        r < 0 ? strerror(e) : "the write made no progress");
    if (r < 0)
      return loom__fail(LOOM_EIO, "%s: cannot write slot %zu to '%s': %s", who, slot, s->path,
                        strerror(e));
    w += (size_t)r;
  }
  return LOOM_OK;
}

/* Read n bytes (len rounded up to the alignment) at `at` into the aligned block b; a read that
 * ends before them is a truncated file. `done`: the slot's bytes before this block. */
static int direct_pread(loom__ostore *s, const char *who, size_t slot, size_t bytes,
                        unsigned char *b, size_t n, size_t len, size_t at, size_t done) {
  for (size_t r = 0; r < n;) {
    ssize_t got = pread(s->fd, b + r, len - r, (off_t)(at + r));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0)
      return loom__fail(LOOM_EIO, "%s: cannot read slot %zu from '%s': %s", who, slot, s->path,
                        strerror(errno));
    r += (size_t)got;
    if (got == 0 || (r < n && r % DIRECT_ALIGN))
      return loom__fail(LOOM_EFORMAT, "%s: '%s' slot %zu: the file is truncated (%zu of its %zu "
                        "bytes there): it changed behind loom's back", who, s->path, slot,
                        done + r, bytes);
  }
  return LOOM_OK;
}

/* loom__odisk_write and loom__odisk_read with O_DIRECT. Where the caller's buffer starts on an
 * aligned address (loom's allocator puts a large block's data on a page: core/alloc.c) its
 * whole aligned blocks move straight between the device and it, READ_BLOCK bytes a request,
 * the CRC-32C taken on it; the rest (all of an unaligned buffer, the ragged tail of an aligned
 * one) block by block through a bounce block, the CRC-32C taken there. A written block is
 * padded with zeros to the alignment (the slot's range goes up to it). Straight transfers save
 * the bounce copy of every byte (about 1 GB per rank per step in bench_offload's disk runs). */
static int direct_move(loom__ostore *s, const char *who, size_t slot, size_t off,
                       unsigned char *p, size_t bytes, bool write, uint32_t *crc_out) {
  const loom__core_kernels *k = loom__k();
  uint32_t crc = 0;
  int rc = LOOM_OK;
  size_t done = 0;
  if (!((uintptr_t)p & (DIRECT_ALIGN - 1)) && !atomic_load(&bounce_only)) {
    size_t whole = bytes & ~(DIRECT_ALIGN - 1);
    while (done < whole && !rc) {
      size_t n = whole - done < READ_BLOCK ? whole - done : READ_BLOCK;
      if (write) {
        crc = k->crc32c(crc, p + done, n);
        rc = direct_pwrite(s, who, slot, off, bytes, p + done, n, off + done);
      } else if (!(rc = direct_pread(s, who, slot, bytes, p + done, n, n, off + done, done))) {
        crc = k->crc32c(crc, p + done, n);
      }
      done += n;
    }
    atomic_fetch_add_explicit(&straight_bytes, done, memory_order_relaxed);
  }
  if (rc || done == bytes) {
    *crc_out = crc;
    return rc;
  }
  void *raw = bounce_take(s);
  if (!raw)
    return loom__fail(LOOM_ENOMEM, "%s: out of memory for an I/O block of slot %zu", who, slot);
  unsigned char *b = bounce_at(raw);
  while (done < bytes && !rc) {
    size_t n = bytes - done < DIRECT_BLOCK ? bytes - done : DIRECT_BLOCK;
    size_t len = round_up(n, DIRECT_ALIGN);
    if (write) {
      memcpy(b, p + done, n);
      crc = k->crc32c(crc, b, n);
      if (len > n) memset(b + n, 0, len - n);
      rc = direct_pwrite(s, who, slot, off, bytes, b, len, off + done);
    } else if (!(rc = direct_pread(s, who, slot, bytes, b, n, len, off + done, done))) {
      memcpy(p + done, b, n);
      crc = k->crc32c(crc, b, n);
    }
    done += n;
  }
  bounce_give(s, raw);
  *crc_out = crc;
  return rc;
}

static _Atomic bool refuse_direct; /* loom__ostore_refuse_direct_for_test */

void loom__ostore_refuse_direct_for_test(bool refuse) { atomic_store(&refuse_direct, refuse); }

void loom__ostore_bounce_only_for_test(bool on) { atomic_store(&bounce_only, on); }

uint64_t loom__ostore_straight_bytes(void) { return atomic_load(&straight_bytes); }

/* Open the file for O_DIRECT if the filesystem takes it (tmpfs before Linux 6.6 does not; some
 * take the flag and refuse the transfers): a 4096-byte write and read at offset 0 must go
 * through, then the file is empty again. Otherwise it stays buffered. */
int loom__odisk_direct_try(loom__ostore *s) {
  void *raw = bounce_take(s); /* the first transfer's block, kept */
  if (!raw)
    return loom__fail(LOOM_ENOMEM, "fsdp offload (disk tier): out of memory for an I/O block");
  unsigned char *b = bounce_at(raw);
  memset(b, 0, DIRECT_ALIGN);
  int fl = fcntl(s->fd, F_GETFL);
  bool ok = fl >= 0 && fcntl(s->fd, F_SETFL, fl | O_DIRECT) == 0;
  ok = ok && pwrite(s->fd, b, DIRECT_ALIGN, 0) == (ssize_t)DIRECT_ALIGN &&
       !atomic_load(&refuse_direct) && pread(s->fd, b, DIRECT_ALIGN, 0) == (ssize_t)DIRECT_ALIGN;
  bounce_give(s, raw);
  if (ftruncate(s->fd, 0) != 0) ok = false;
  if (ok) s->direct = true;
  else if (fl >= 0) (void)fcntl(s->fd, F_SETFL, fl);
  return LOOM_OK;
}

/* Write src to the slot's range, computing its CRC-32C on the way (chunk by chunk, while the
 * chunk is in cache). */
int loom__odisk_write(loom__ostore *s, const char *who, size_t slot, size_t off,
                      const void *src, size_t bytes, uint32_t *crc_out) {
  const unsigned char *p = src;
  const loom__core_kernels *k = loom__k();
  uint32_t crc = 0;
  if (s->dry) bytes = 0;
  if (s->direct) return direct_move(s, who, slot, off, (unsigned char *)p, bytes, true, crc_out);
  for (size_t done = 0; done < bytes;) {
    size_t n = bytes - done < IO_CHUNK ? bytes - done : IO_CHUNK;
    crc = k->crc32c(crc, p + done, n);
    for (size_t w = 0; w < n;) {
      ssize_t r = pwrite(s->fd, p + done + w, n - w, (off_t)(off + done + w));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        int e = r < 0 ? errno : 0;
        if (r == 0 || errno_is_full(e))
          return loom__fail(LOOM_EIO, "%s: '%s' is full: cannot write slot %zu (%zu bytes at "
                            "offset %zu): %s", who, s->path, slot, bytes, off,
                            r == 0 ? "the write made no progress" : strerror(e));
        return loom__fail(LOOM_EIO, "%s: cannot write slot %zu to '%s': %s", who, slot, s->path,
                          strerror(e));
      }
      w += (size_t)r;
    }
    done += n;
  }
  /* start writing the range out; every WRITEBACK_BYTES wait for what was written and let the
   * kernel drop those pages: the caller holds these bytes (or chose to put them away), and a
   * second copy in the page cache is memory a cgroup limit counts. Dirty pages cannot be
   * dropped, and without the wait a memory limit fills with them faster than the kernel writes
   * them back (the run is killed); waiting after every put instead stalls the worker's reads
   * behind the disk's writes */
  if (bytes) {
    (void)sync_file_range(s->fd, (off_t)off, (off_t)bytes, SYNC_FILE_RANGE_WRITE);
    if (atomic_fetch_add(&s->unsynced, bytes) + bytes >= WRITEBACK_BYTES) {
      atomic_store(&s->unsynced, 0);
      (void)sync_file_range(s->fd, 0, 0, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                             SYNC_FILE_RANGE_WAIT_AFTER);
      (void)posix_fadvise(s->fd, 0, 0, POSIX_FADV_DONTNEED);
    }
  }
  *crc_out = crc;
  return LOOM_OK;
}

/* Read the slot's range into dst and check it against the size and CRC-32C of its put. */
int loom__odisk_read(loom__ostore *s, const char *who, size_t slot, size_t off, void *dst,
                     size_t bytes, uint32_t want) {
  unsigned char *p = dst;
  const loom__core_kernels *k = loom__k();
  uint32_t crc = 0;
  if (s->dry) bytes = 0;
  if (s->direct) {
    int rc = direct_move(s, who, slot, off, p, bytes, false, &crc);
    if (!rc && crc != want)
      rc = loom__fail(LOOM_EFORMAT, "%s: '%s' slot %zu: the bytes changed behind loom's back "
                      "(CRC-32C %08x, %08x when put)", who, s->path, slot, (unsigned)crc,
                      (unsigned)want);
    return rc;
  }
  for (size_t done = 0; done < bytes;) {
    size_t n = bytes - done < READ_BLOCK ? bytes - done : READ_BLOCK;
    for (size_t r = 0; r < n;) {
      ssize_t got = pread(s->fd, p + done + r, n - r, (off_t)(off + done + r));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0)
        return loom__fail(LOOM_EIO, "%s: cannot read slot %zu from '%s': %s", who, slot, s->path,
                          strerror(errno));
      if (got == 0)
        return loom__fail(LOOM_EFORMAT, "%s: '%s' slot %zu: the file is truncated (%zu of its "
                          "%zu bytes there): it changed behind loom's back", who, s->path, slot,
                          done + r, bytes);
      r += (size_t)got;
    }
    crc = k->crc32c(crc, p + done, n);
    done += n;
  }
  if (bytes) (void)posix_fadvise(s->fd, (off_t)off, (off_t)bytes, POSIX_FADV_DONTNEED);
  if (crc != want)
    return loom__fail(LOOM_EFORMAT, "%s: '%s' slot %zu: the bytes changed behind loom's back "
                      "(CRC-32C %08x, %08x when put)", who, s->path, slot, (unsigned)crc,
                      (unsigned)want);
  return LOOM_OK;
}

/* Create the store's file in dir, naming the folder in every error. */
/* This machine's name for file names: the hostname with anything but [A-Za-z0-9.] as '_'. */
static void host_name(char *buf, size_t cap) {
  if (gethostname(buf, cap) != 0) snprintf(buf, cap, "host");
  buf[cap - 1] = 0;
  for (char *c = buf; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
          *c == '.'))
      *c = '_';
}

/* Remove the files a process of this machine and user left in dir when it died without
 * cleaning up (killed by a signal or the OOM killer): loom-offload-<host>-<pid>-<rank>-<n>.bin
 * whose pid no longer exists. Files of other machines (a shared folder), of other users and of
 * live processes stay. */
static void sweep_stale(const char *dir, const char *host) {
  DIR *d = opendir(dir);
  if (!d) return;
  char prefix[300];
  int plen = snprintf(prefix, sizeof prefix, "loom-offload-%s-", host);
  for (struct dirent *e; (e = readdir(d));) {
    if (plen <= 0 || (size_t)plen >= sizeof prefix || strncmp(e->d_name, prefix, (size_t)plen))
      continue;
    long pid;
    int rank, used = 0;
    unsigned n;
    if (sscanf(e->d_name + plen, "%ld-%d-%u.bin%n", &pid, &rank, &n, &used) != 3 || !used ||
        e->d_name[plen + used] != 0 || pid <= 0 || pid == (long)getpid())
      continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive, or not ours to judge */
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
        st.st_uid == geteuid())
      (void)unlinkat(dirfd(d), e->d_name, 0);
  }
  closedir(d);
}

static bool is_folder(const char *dir) {
  struct stat st;
  return stat(dir, &st) == 0 && S_ISDIR(st.st_mode);
}

int loom__odisk_open(loom__ostore *s, const char *dir) {
  static _Atomic unsigned counter; /* stores made by this process */
  const char *who = "fsdp offload (disk tier)"; /* the user meets these: loom_fsdp_create */
  size_t len = strlen(dir);
  const char *sep = len && dir[len - 1] == '/' ? "" : "/";
  char host[256];
  host_name(host, sizeof host);
  sweep_stale(dir, host);
  for (int attempt = 0; attempt < 100; attempt++) {
    unsigned n = atomic_fetch_add(&counter, 1);
    int need = snprintf(NULL, 0, "%s%sloom-offload-%s-%ld-%d-%u.bin", dir, sep, host,
                        (long)getpid(), s->rank, n);
    char *path = need < 0 ? NULL : loom__malloc(LOOM_POOL_META, (size_t)need + 1);
    if (!path) return loom__fail(LOOM_ENOMEM, "%s: out of memory for a path in '%s'", who, dir);
    snprintf(path, (size_t)need + 1, "%s%sloom-offload-%s-%ld-%d-%u.bin", dir, sep, host,
             (long)getpid(), s->rank, n);
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, 0600);
    if (fd >= 0) {
      s->path = path;
      s->fd = fd;
      /* no readahead: every read is of one slot's range, which the caller asked for whole;
       * the kernel's readahead (8 MiB on a virtio disk here) read past each 4 MiB slot into
       * the next, bytes that were dropped with the slot before anyone used them */
      (void)posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
      return LOOM_OK;
    }
    int e = errno;
    loom__free(path);
    switch (e) {
    case EEXIST: continue; /* left by an earlier process with our pid: take the next name */
    case ENOENT: /* the folder, or (in /proc) a file made in it */
      if (is_folder(dir))
        return loom__fail(LOOM_EIO, "%s: offload folder '%s' takes no regular files (a "
                          "pseudo-filesystem such as /proc?): creating one failed: %s", who, dir,
                          strerror(e));
      return loom__fail(LOOM_EIO, "%s: offload folder '%s' does not exist", who, dir);
    case ENOTDIR: return loom__fail(LOOM_EIO, "%s: offload folder '%s' is not a folder", who, dir);
    case EACCES:
    case EPERM:
    case EROFS:
      return loom__fail(LOOM_EIO, "%s: offload folder '%s' is read-only (cannot create a file "
                        "in it: %s)", who, dir, strerror(e));
    case ENOSPC:
    case EDQUOT:
      return loom__fail(LOOM_EIO, "%s: offload folder '%s' is full: %s", who, dir, strerror(e));
    default:
      return loom__fail(LOOM_EIO, "%s: cannot create a file in offload folder '%s': %s", who,
                        dir, strerror(e));
    }
  }
  return loom__fail(LOOM_EIO, "%s: no free file name in offload folder '%s'", who, dir);
}

/* A dry run's disk tier makes no file: it only says what loom__odisk_open would of a folder that
 * cannot take one. */
int loom__odisk_check(const char *dir) {
  const char *who = "fsdp offload (disk tier)";
  struct stat st;
  if (stat(dir, &st) != 0)
    return loom__fail(LOOM_EIO, "%s: offload folder '%s': %s", who, dir, strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return loom__fail(LOOM_EIO, "%s: offload folder '%s' is not a folder", who, dir);
  if (access(dir, W_OK | X_OK) != 0)
    return loom__fail(LOOM_EIO, "%s: offload folder '%s' is read-only (cannot create a file "
                      "in it: %s)", who, dir, strerror(errno));
  return LOOM_OK;
}

/* O_DIRECT for the disk tier unless LOOM_OFFLOAD_DIRECT=0 in the environment. */
bool loom__odisk_direct_wanted(void) {
  const char *e = getenv("LOOM_OFFLOAD_DIRECT");
  return !(e && !strcmp(e, "0"));
}
