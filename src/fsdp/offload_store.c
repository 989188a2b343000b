/* offload_store.c: the offload store of offload_store.h. Owns the slot table, the two tiers
 * (host-pool buffers; one scratch file read and written with pread/pwrite, a CRC-32C per slot),
 * the synchronous put/get, the job queue with its worker thread, and the statistics.
 *
 * Locking: `mu` guards the slot table, the queue, the job records' states and the statistics;
 * nobody holds it while bytes move, so the caller can submit and wait while the worker copies.
 * `space_mu` guards the disk file's used length, the one thing a synchronous first put and the
 * worker may both change at once (each giving a different slot its range). Bytes of a slot are
 * only ever moved by one party at a time: jobs run one by one in order, and a synchronous call
 * on a slot first waits until no job of that slot is queued or running. */
#define _GNU_SOURCE /* sync_file_range */
#include "fsdp/offload_store.h"
#include "core/kernels/kernels.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SLOT_ALIGN ((size_t)4096) /* each slot's range in the file starts on a page */
#define IO_CHUNK ((size_t)1 << 20) /* CRC and pwrite one cache-warm MiB at a time */
#define READ_BLOCK ((size_t)4 << 20) /* pread up to 4 MiB at once: with no readahead (the file is
                                      * POSIX_FADV_RANDOM), one request is all the disk sees */
#define WRITEBACK_BYTES ((size_t)64 << 20) /* dirty bytes of the file at most */
#define DIRECT_ALIGN ((size_t)4096)  /* O_DIRECT: buffer address, offset and length */
#define DIRECT_BLOCK ((size_t)1 << 20) /* O_DIRECT: the bounce block of one transfer */

static size_t round_up(size_t n, size_t a) { return (n + a - 1) & ~(a - 1); }

typedef struct oslot {
  size_t bytes;     /* the slot's size, fixed by its first put (meaningful if declared) */
  size_t off;       /* disk: where its range starts (if space) */
  void *buf;        /* host: its buffer (if space and bytes > 0) */
  uint32_t crc;     /* disk: CRC-32C of what the last put wrote (if data) */
  uint32_t pending; /* queued or running jobs on this slot */
  bool running;     /* a worker is moving its bytes now */
  bool declared;    /* it has a size: it has space, or a job of it is pending */
  bool space;       /* it has its buffer / file range */
  bool data;        /* a put completed and no later put failed */
} oslot;

enum { JOB_GET = 0, JOB_PUT = 1 };
enum { JOB_QUEUED = 0, JOB_RUNNING = 1, JOB_DONE = 2 };

typedef struct ojob {
  struct ojob *next, *prev; /* live list (submitted, not yet waited for); next: free list */
  struct ojob *qnext;       /* queue of jobs not yet started */
  loom__ojob id;
  int kind, state, status;
  size_t slot, bytes;
  void *buf; /* dst of a get, src of a put (on loan) */
  char msg[512];
} ojob;

struct loom__ostore {
  loom__otier tier;
  int rank;
  int account; /* the creator's memory account: the worker's too, and the file bytes' */
  char *path;  /* disk tier */
  int fd;
  bool dry; /* made in a dry run (loom_mem_set_dry_run): no file, no bytes moved */

  pthread_mutex_t mu;
  pthread_cond_t cv_work; /* the worker: a job was queued, or stop */
  pthread_cond_t cv_done; /* waiters: a job finished (or was dropped) */
  oslot *slots;
  size_t nslots; /* table length (slots beyond are undeclared) */
  size_t held;   /* sum of the sizes of the slots with space */
  ojob *live_head, *live_tail, *q_head, *q_tail, *free_jobs;
  loom__ojob last_id;
  pthread_t threads[LOOM__OSTORE_MAX_WORKERS];
  int nthreads, max_workers, idle; /* started, allowed, waiting for work */
  bool stop;
  loom__ostore_stats st;

  pthread_mutex_t space_mu;
  size_t end; /* disk: the file's used length (under space_mu) */
  _Atomic size_t unsynced; /* disk: bytes written since the last wait for writeback */
  bool direct;             /* disk: the file is open with O_DIRECT (no page cache at all) */
  void *bounce;            /* O_DIRECT: free bounce blocks (raw, linked through their start;
                            * under mu), one per transfer running at once */
};

static const char *tier_name(loom__otier t) { return t == LOOM__OTIER_DISK ? "disk" : "host"; }

/* ---- the slot table (under mu) -------------------------------------------------------- */

/* The slot's entry, growing the table if `grow` (NULL if out of range and not growing, or out
 * of memory: LOOM_ENOMEM set in *rc). */
static oslot *slot_at(loom__ostore *s, size_t slot, bool grow, int *rc) {
  *rc = LOOM_OK;
  if (slot < s->nslots) return &s->slots[slot];
  if (!grow) return NULL;
  if (slot >= SIZE_MAX / sizeof(oslot) / 4) {
    *rc = loom__fail(LOOM_EINVAL, "loom__ostore: slot number %zu is out of range", slot);
    return NULL;
  }
  size_t cap = s->nslots ? s->nslots : 16;
  while (cap <= slot) cap *= 2;
  oslot *t = loom__calloc(LOOM_POOL_META, cap, sizeof *t);
  if (!t) {
    *rc = loom__fail(LOOM_ENOMEM, "loom__ostore: out of memory for a table of %zu slots", cap);
    return NULL;
  }
  if (s->nslots) memcpy(t, s->slots, s->nslots * sizeof *t);
  loom__free(s->slots);
  s->slots = t;
  s->nslots = cap;
  return &s->slots[slot];
}

/* A slot whose first put failed (or was dropped) and that nothing else is pending on goes back
 * to having no size at all. */
static void slot_settle(oslot *o) {
  if (!o->space && !o->data && o->pending == 0) {
    o->declared = false;
    o->bytes = 0;
  }
}

/* Wait (mu held) until no job of `slot` is queued or running; the time counts as exposed. */
static void slot_wait_idle(loom__ostore *s, size_t slot) {
  if (slot >= s->nslots || s->slots[slot].pending == 0) return;
  double t0 = loom__now();
  while (slot < s->nslots && s->slots[slot].pending) pthread_cond_wait(&s->cv_done, &s->mu);
  s->st.wait_s += loom__now() - t0;
}

/* ---- the disk tier's file -------------------------------------------------------------- */

static bool errno_is_full(int e) { return e == ENOSPC || e == EDQUOT || e == EFBIG; }

/* The file range a slot of `bytes` takes: O_DIRECT writes the last block whole, so its range
 * goes up to the alignment. */
static size_t span(const loom__ostore *s, size_t bytes) {
  return s->direct ? round_up(bytes, DIRECT_ALIGN) : bytes;
}

/* Give `slot` (bytes) the next aligned range of the file, reserved with posix_fallocate so
 * that writing it can no longer run out of space. On failure the file is as it was. */
static int disk_reserve(loom__ostore *s, const char *who, size_t slot, size_t bytes,
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

/* Undo disk_reserve after the slot's first put failed: the range goes back if nothing was
 * placed after it (otherwise it stays a hole, harmless). */
static void disk_unreserve(loom__ostore *s, size_t off, size_t bytes) {
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

/* Write the bounce block's first len bytes (a multiple of the alignment) at `at`. */
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

/* Read n bytes (len rounded up to the alignment) at `at` into the bounce block; a read that
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

/* disk_write and disk_read with O_DIRECT: block by block through a bounce block, the CRC-32C
 * taken there; a written block is padded with zeros to the alignment (the slot's range goes up
 * to it). */
static int direct_move(loom__ostore *s, const char *who, size_t slot, size_t off,
                       unsigned char *p, size_t bytes, bool write, uint32_t *crc_out) {
  void *raw = bounce_take(s);
  if (!raw)
    return loom__fail(LOOM_ENOMEM, "%s: out of memory for an I/O block of slot %zu", who, slot);
  unsigned char *b = bounce_at(raw);
  const loom__core_kernels *k = loom__k();
  uint32_t crc = 0;
  int rc = LOOM_OK;
  for (size_t done = 0; done < bytes && !rc;) {
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

/* Open the file for O_DIRECT if the filesystem takes it (tmpfs before Linux 6.6 does not; some
 * take the flag and refuse the transfers): a 4096-byte write and read at offset 0 must go
 * through, then the file is empty again. Otherwise it stays buffered. */
static int direct_try(loom__ostore *s) {
  void *raw = bounce_take(s); /* the first transfer's block, kept */
  if (!raw)
    return loom__fail(LOOM_ENOMEM, "fsdp offload (disk tier): out of memory for an I/O block");
  unsigned char *b = bounce_at(raw);
  memset(b, 0, DIRECT_ALIGN);
  int fl = fcntl(s->fd, F_GETFL);
  bool ok = fl >= 0 && fcntl(s->fd, F_SETFL, fl | O_DIRECT) == 0;
  ok = ok && pwrite(s->fd, b, DIRECT_ALIGN, 0) == (ssize_t)DIRECT_ALIGN &&
       pread(s->fd, b, DIRECT_ALIGN, 0) == (ssize_t)DIRECT_ALIGN;
  bounce_give(s, raw);
  if (ftruncate(s->fd, 0) != 0) ok = false;
  if (ok) s->direct = true;
  else if (fl >= 0) (void)fcntl(s->fd, F_SETFL, fl);
  return LOOM_OK;
}

/* Write src to the slot's range, computing its CRC-32C on the way (chunk by chunk, while the
 * chunk is in cache). */
static int disk_write(loom__ostore *s, const char *who, size_t slot, size_t off,
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
static int disk_read(loom__ostore *s, const char *who, size_t slot, size_t off, void *dst,
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

static int disk_open(loom__ostore *s, const char *dir) {
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

/* A dry run's disk tier makes no file: it only says what disk_open would of a folder that
 * cannot take one. */
static int disk_check(const char *dir) {
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

/* ---- put and get, shared by the synchronous calls and the worker ------------------------ */

static int put_impl(loom__ostore *s, size_t slot, const void *src, size_t bytes,
                    const char *who, bool sync) {
  int rc = LOOM_OK;
  pthread_mutex_lock(&s->mu);
  if (sync) slot_wait_idle(s, slot);
  oslot *o = slot_at(s, slot, sync, &rc); /* a worker's slot was declared at submit */
  if (!o && !rc) rc = loom__fail(LOOM_EINVAL, "%s: slot %zu was never declared", who, slot);
  if (!rc && o->declared && o->bytes != bytes)
    rc = loom__fail(LOOM_EINVAL, "%s: slot %zu holds %zu bytes, not %zu", who, slot, o->bytes,
                    bytes);
  if (rc) {
    pthread_mutex_unlock(&s->mu);
    return rc;
  }
  o->declared = true;
  o->bytes = bytes;
  bool had_space = o->space;
  void *buf = o->buf;
  size_t off = o->off;
  pthread_mutex_unlock(&s->mu);

  double t0 = loom__now();
  uint32_t crc = 0;
  if (!had_space) { /* the slot's first put: give it its space */
    if (s->tier == LOOM__OTIER_HOST) {
      buf = bytes ? loom__malloc(LOOM_POOL_HOST, bytes) : NULL;
      if (bytes && !buf)
        rc = loom__fail(LOOM_ENOMEM, "%s: out of memory for slot %zu's %zu-byte host buffer", who,
                        slot, bytes);
    } else {
      rc = disk_reserve(s, who, slot, bytes, &off);
    }
  }
  bool reserved = !had_space && !rc;
  if (!rc) {
    if (s->tier == LOOM__OTIER_HOST) {
      if (bytes && !s->dry) memcpy(buf, src, bytes);
    } else {
      rc = disk_write(s, who, slot, off, src, bytes, &crc);
    }
  }
  if (rc && reserved) { /* a failed first put leaves the slot as it was: no space */
    if (s->tier == LOOM__OTIER_HOST) loom__free(buf);
    else disk_unreserve(s, off, bytes);
  }
  double dt = loom__now() - t0;

  pthread_mutex_lock(&s->mu);
  o = &s->slots[slot]; /* the table may have moved */
  if (!rc) {
    if (!had_space) {
      o->space = true;
      o->buf = buf;
      o->off = off;
      s->held += bytes;
    }
    o->data = true;
    o->crc = crc;
    s->st.bytes_written += bytes;
    s->st.puts++;
  } else if (had_space) {
    o->data = false; /* its old bytes may be partly overwritten */
  }
  s->st.transfer_s += dt;
  slot_settle(o);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

static int get_impl(loom__ostore *s, size_t slot, void *dst, size_t bytes, const char *who,
                    bool sync) {
  int rc = LOOM_OK;
  pthread_mutex_lock(&s->mu);
  if (sync) slot_wait_idle(s, slot);
  oslot *o = slot < s->nslots ? &s->slots[slot] : NULL;
  if (!o || !o->data)
    rc = loom__fail(LOOM_EINVAL, "%s: slot %zu holds no data%s", who, slot,
                    o && o->space ? " (its last put failed)" : "");
  else if (o->bytes != bytes)
    rc = loom__fail(LOOM_EINVAL, "%s: slot %zu holds %zu bytes, not %zu", who, slot, o->bytes,
                    bytes);
  void *buf = o ? o->buf : NULL;
  size_t off = o ? o->off : 0;
  uint32_t crc = o ? o->crc : 0;
  pthread_mutex_unlock(&s->mu);
  if (rc) return rc;

  double t0 = loom__now();
  if (s->tier == LOOM__OTIER_HOST) {
    if (bytes && !s->dry) memcpy(dst, buf, bytes);
  } else {
    rc = disk_read(s, who, slot, off, dst, bytes, crc);
  }
  double dt = loom__now() - t0;

  pthread_mutex_lock(&s->mu);
  if (!rc) {
    s->st.bytes_read += bytes;
    s->st.gets++;
  }
  s->st.transfer_s += dt;
  pthread_mutex_unlock(&s->mu);
  return rc;
}

/* ---- the public calls ------------------------------------------------------------------ */

/* O_DIRECT for the disk tier unless LOOM_OFFLOAD_DIRECT=0 in the environment. */
static bool direct_wanted(void) {
  const char *e = getenv("LOOM_OFFLOAD_DIRECT");
  return !(e && !strcmp(e, "0"));
}

int loom__ostore_create(loom__otier tier, const char *dir, int rank, loom__ostore **out) {
  const char *who = "loom__ostore_create";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  if (tier != LOOM__OTIER_HOST && tier != LOOM__OTIER_DISK)
    return loom__fail(LOOM_EINVAL, "%s: tier %d is neither host (0) nor disk (1)", who, (int)tier);
  if (tier == LOOM__OTIER_DISK && (!dir || !dir[0]))
    return loom__fail(LOOM_EINVAL, "%s: the disk tier needs a folder", who);
  loom__ostore *s = loom__calloc(LOOM_POOL_META, 1, sizeof *s);
  if (!s) return loom__fail(LOOM_ENOMEM, "%s: out of memory for the %s store", who, tier_name(tier));
  s->tier = tier;
  s->rank = rank;
  s->account = loom_mem_account();
  s->fd = -1;
  s->dry = loom__dry();
  s->max_workers = tier == LOOM__OTIER_DISK ? LOOM__OSTORE_DISK_WORKERS : 1;
  int made = 0; /* how many of the four synchronisation objects exist */
  if (pthread_mutex_init(&s->mu, NULL) == 0 && ++made && pthread_mutex_init(&s->space_mu, NULL) == 0 &&
      ++made && pthread_cond_init(&s->cv_work, NULL) == 0 && ++made &&
      pthread_cond_init(&s->cv_done, NULL) == 0)
    ++made;
  int rc = made == 4 ? LOOM_OK
                     : loom__fail(LOOM_EBACKEND, "%s: cannot make the store's locks", who);
  if (!rc && tier == LOOM__OTIER_DISK) rc = s->dry ? disk_check(dir) : disk_open(s, dir);
  if (!rc && tier == LOOM__OTIER_DISK && !s->dry && direct_wanted()) rc = direct_try(s);
  if (rc) {
    if (s->fd >= 0) close(s->fd);
    if (s->path) unlink(s->path);
    loom__free(s->path);
    if (made > 3) pthread_cond_destroy(&s->cv_done);
    if (made > 2) pthread_cond_destroy(&s->cv_work);
    if (made > 1) pthread_mutex_destroy(&s->space_mu);
    if (made > 0) pthread_mutex_destroy(&s->mu);
    loom__free(s);
    return rc;
  }
  *out = s;
  return LOOM_OK;
}

void loom__ostore_free(loom__ostore *s) {
  if (!s) return;
  loom__ostore_clear(s); /* what has not started never will */
  pthread_mutex_lock(&s->mu);
  s->stop = true;
  pthread_cond_broadcast(&s->cv_work);
  pthread_mutex_unlock(&s->mu);
  for (int i = 0; i < s->nthreads; i++) pthread_join(s->threads[i], NULL); /* after the running jobs */
  for (ojob *j = s->live_head, *n; j; j = n) {
    n = j->next;
    loom__free(j);
  }
  for (ojob *j = s->free_jobs, *n; j; j = n) {
    n = j->next;
    loom__free(j);
  }
  for (size_t i = 0; i < s->nslots; i++) {
    oslot *o = &s->slots[i];
    if (!o->space) continue;
    if (s->tier == LOOM__OTIER_HOST) loom__free(o->buf);
    else loom__mem_account_to(LOOM_POOL_FILE, s->account, -(ptrdiff_t)o->bytes);
  }
  for (void *raw = s->bounce, *next; raw; raw = next) {
    next = *(void **)raw;
    loom__free(raw);
  }
  if (s->fd >= 0) close(s->fd);
  if (s->path) unlink(s->path);
  loom__free(s->path);
  loom__free(s->slots);
  pthread_cond_destroy(&s->cv_done);
  pthread_cond_destroy(&s->cv_work);
  pthread_mutex_destroy(&s->space_mu);
  pthread_mutex_destroy(&s->mu);
  loom__free(s);
}

int loom__ostore_put(loom__ostore *s, size_t slot, const void *src, size_t bytes) {
  if (!s) return loom__fail(LOOM_EINVAL, "loom__ostore_put: store is NULL");
  if (!src && bytes) return loom__fail(LOOM_EINVAL, "loom__ostore_put: src is NULL");
  return put_impl(s, slot, src, bytes, "loom__ostore_put", true);
}

int loom__ostore_get(loom__ostore *s, size_t slot, void *dst, size_t bytes) {
  if (!s) return loom__fail(LOOM_EINVAL, "loom__ostore_get: store is NULL");
  if (!dst && bytes) return loom__fail(LOOM_EINVAL, "loom__ostore_get: dst is NULL");
  return get_impl(s, slot, dst, bytes, "loom__ostore_get", true);
}

/* The accessors lock a const store's mutex: the lock is not part of its value. */
static pthread_mutex_t *mu_of(const loom__ostore *s) { return (pthread_mutex_t *)&s->mu; }

void *loom__ostore_host_buffer(loom__ostore *s, size_t slot, size_t bytes) {
  if (!s || s->tier != LOOM__OTIER_HOST) return NULL;
  pthread_mutex_lock(&s->mu);
  slot_wait_idle(s, slot);
  oslot *o = slot < s->nslots ? &s->slots[slot] : NULL;
  void *p = o && o->data && o->bytes == bytes ? o->buf : NULL;
  pthread_mutex_unlock(&s->mu);
  return p;
}

bool loom__ostore_has(const loom__ostore *s, size_t slot) {
  if (!s) return false;
  pthread_mutex_lock(mu_of(s));
  bool has = slot < s->nslots && s->slots[slot].data;
  pthread_mutex_unlock(mu_of(s));
  return has;
}

size_t loom__ostore_bytes(const loom__ostore *s) {
  if (!s) return 0;
  pthread_mutex_lock(mu_of(s));
  size_t held = s->held;
  pthread_mutex_unlock(mu_of(s));
  return held;
}

const char *loom__ostore_path(const loom__ostore *s) { return s ? s->path : NULL; }

bool loom__ostore_direct(const loom__ostore *s) { return s && s->direct; }

int loom__ostore_set_workers(loom__ostore *s, int n) {
  if (!s) return loom__fail(LOOM_EINVAL, "loom__ostore_set_workers: store is NULL");
  if (n < 1 || n > LOOM__OSTORE_MAX_WORKERS)
    return loom__fail(LOOM_EINVAL, "loom__ostore_set_workers: %d workers: must be 1..%d", n,
                      LOOM__OSTORE_MAX_WORKERS);
  pthread_mutex_lock(&s->mu);
  bool started = s->nthreads > 0;
  if (!started) s->max_workers = n;
  pthread_mutex_unlock(&s->mu);
  return started ? loom__fail(LOOM_EMISUSE, "loom__ostore_set_workers: the workers have started "
                              "(a job was submitted)")
                 : LOOM_OK;
}

loom__otier loom__ostore_tier(const loom__ostore *s) { return s ? s->tier : LOOM__OTIER_HOST; }

void loom__ostore_get_stats(const loom__ostore *s, loom__ostore_stats *out) {
  if (!out) return;
  memset(out, 0, sizeof *out);
  if (!s) return;
  pthread_mutex_lock(mu_of(s));
  *out = s->st;
  pthread_mutex_unlock(mu_of(s));
}

/* ---- the worker ------------------------------------------------------------------------ */

/* The first queued job whose slot no worker is moving now (under mu), taken off the queue;
 * NULL if none. Jobs of one slot thus run one at a time in submission order, and with one
 * worker every job does. */
static ojob *take_job(loom__ostore *s) {
  for (ojob *j = s->q_head, *prev = NULL; j; prev = j, j = j->qnext) {
    if (s->slots[j->slot].running) continue;
    if (prev) prev->qnext = j->qnext;
    else s->q_head = j->qnext;
    if (s->q_tail == j) s->q_tail = prev;
    j->qnext = NULL;
    return j;
  }
  return NULL;
}

static void *worker_main(void *arg) {
  loom__ostore *s = arg;
  loom_mem_set_account(s->account); /* host buffers it makes are the creator's (the rank's) */
  pthread_mutex_lock(&s->mu);
  for (;;) {
    ojob *j;
    while (!(j = take_job(s)) && !s->stop) {
      s->idle++;
      pthread_cond_wait(&s->cv_work, &s->mu);
      s->idle--;
    }
    if (!j) break; /* stopping, and free dropped what was queued */
    j->state = JOB_RUNNING;
    s->slots[j->slot].running = true;
    pthread_mutex_unlock(&s->mu);

    char who[96];
    snprintf(who, sizeof who, "loom__ostore worker (job %llu, %s)", (unsigned long long)j->id,
             j->kind == JOB_PUT ? "put" : "get");
    int rc = j->kind == JOB_PUT ? put_impl(s, j->slot, j->buf, j->bytes, who, false)
                                : get_impl(s, j->slot, j->buf, j->bytes, who, false);
    if (rc) snprintf(j->msg, sizeof j->msg, "%s", loom_last_error());

    pthread_mutex_lock(&s->mu);
    j->status = rc;
    j->state = JOB_DONE;
    oslot *o = &s->slots[j->slot];
    o->running = false;
    o->pending--;
    slot_settle(o);
    pthread_cond_broadcast(&s->cv_done);
    if (s->q_head && s->idle) pthread_cond_broadcast(&s->cv_work); /* its slot's next job */
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

static int submit(loom__ostore *s, int kind, size_t slot, void *buf, size_t bytes,
                  loom__ojob *job) {
  const char *who = kind == JOB_PUT ? "loom__ostore_submit_put" : "loom__ostore_submit_get";
  if (job) *job = 0;
  if (!s || !job) return loom__fail(LOOM_EINVAL, "%s: %s is NULL", who, s ? "job" : "store");
  if (!buf && bytes)
    return loom__fail(LOOM_EINVAL, "%s: %s is NULL", who, kind == JOB_PUT ? "src" : "dst");
  int rc = LOOM_OK;
  pthread_mutex_lock(&s->mu);
  oslot *o = slot_at(s, slot, kind == JOB_PUT, &rc);
  ojob *j = NULL;
  if (rc) goto done;
  if (kind == JOB_GET && (!o || !o->declared)) {
    rc = loom__fail(LOOM_EINVAL, "%s: slot %zu was never put (nor has a put queued)", who, slot);
    goto done;
  }
  if (o->declared && o->bytes != bytes) {
    rc = loom__fail(LOOM_EINVAL, "%s: slot %zu holds %zu bytes, not %zu", who, slot, o->bytes,
                    bytes);
    goto done;
  }
  j = s->free_jobs;
  if (j) s->free_jobs = j->next;
  else j = loom__malloc(LOOM_POOL_META, sizeof *j);
  if (!j) {
    rc = loom__fail(LOOM_ENOMEM, "%s: out of memory for a job record", who);
    goto done;
  }
  if (s->idle == 0 && s->nthreads < s->max_workers) { /* every worker busy: one more */
    int e = pthread_create(&s->threads[s->nthreads], NULL, worker_main, s);
    if (e && s->nthreads == 0) {
      j->next = s->free_jobs;
      s->free_jobs = j;
      rc = loom__fail(LOOM_EBACKEND, "%s: cannot start the offload worker thread: %s", who,
                      strerror(e));
      goto done;
    }
    if (!e) s->nthreads++; /* else the workers there are do the job */
  }
  o->declared = true; /* a put's size holds from now on, for the jobs and calls after it */
  o->bytes = bytes;
  o->pending++;
  *j = (ojob){.id = ++s->last_id, .kind = kind, .state = JOB_QUEUED, .slot = slot,
              .bytes = bytes, .buf = buf, .prev = s->live_tail};
  if (s->live_tail) s->live_tail->next = j;
  else s->live_head = j;
  s->live_tail = j;
  if (s->q_tail) s->q_tail->qnext = j;
  else s->q_head = j;
  s->q_tail = j;
  s->st.jobs++;
  *job = j->id;
  pthread_cond_signal(&s->cv_work);
done:
  pthread_mutex_unlock(&s->mu);
  return rc;
}

int loom__ostore_submit_get(loom__ostore *s, size_t slot, void *dst, size_t bytes,
                            loom__ojob *job) {
  return submit(s, JOB_GET, slot, dst, bytes, job);
}

int loom__ostore_submit_put(loom__ostore *s, size_t slot, const void *src, size_t bytes,
                            loom__ojob *job) {
  return submit(s, JOB_PUT, slot, (void *)src, bytes, job); /* never written through */
}

int loom__ostore_wait(loom__ostore *s, loom__ojob job, double *waited) {
  if (waited) *waited = 0;
  if (!s) return loom__fail(LOOM_EINVAL, "loom__ostore_wait: store is NULL");
  pthread_mutex_lock(&s->mu);
  ojob *j = s->live_head;
  while (j && j->id != job) j = j->next;
  if (!j) { /* 0, never submitted, or already waited for */
    pthread_mutex_unlock(&s->mu);
    return LOOM_OK;
  }
  if (j->state != JOB_DONE) {
    double t0 = loom__now();
    while (j->state != JOB_DONE) pthread_cond_wait(&s->cv_done, &s->mu);
    double dt = loom__now() - t0;
    s->st.wait_s += dt;
    s->st.waits_blocked++;
    if (waited) *waited = dt;
  }
  int rc = j->status;
  if (rc) loom__fail(rc, "%s", j->msg); /* the worker's message, now this thread's */
  if (j->prev) j->prev->next = j->next;
  else s->live_head = j->next;
  if (j->next) j->next->prev = j->prev;
  else s->live_tail = j->prev;
  j->next = s->free_jobs;
  s->free_jobs = j;
  pthread_mutex_unlock(&s->mu);
  return rc;
}

size_t loom__ostore_queued(const loom__ostore *s) {
  if (!s) return 0;
  pthread_mutex_lock(mu_of(s));
  size_t n = 0;
  for (const ojob *j = s->q_head; j; j = j->qnext) n++;
  pthread_mutex_unlock(mu_of(s));
  return n;
}

void loom__ostore_clear(loom__ostore *s) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  for (ojob *j = s->q_head; j; j = j->qnext) {
    j->state = JOB_DONE;
    j->status = LOOM_EABORTED;
    snprintf(j->msg, sizeof j->msg, "loom__ostore_clear: job %llu (%s of slot %zu) was dropped "
             "before it started", (unsigned long long)j->id, j->kind == JOB_PUT ? "put" : "get",
             j->slot);
    oslot *o = &s->slots[j->slot];
    o->pending--;
    slot_settle(o);
    s->st.jobs_cleared++;
  }
  s->q_head = s->q_tail = NULL;
  pthread_cond_broadcast(&s->cv_done);
  pthread_mutex_unlock(&s->mu);
}
