/* test_offload_store.c: the offload store under FSDP offload (src/fsdp/offload_store.h), on
 * its own. Round trips on both tiers (random bytes, sparse slots, sizes that are not multiples
 * of 4096, zero bytes, re-puts), the 4096-aligned layout of the file, sizes refused; the disk
 * tier's faults: bytes flipped and the file truncated behind the store's back (named
 * LOOM_EFORMAT, synchronously and from the worker), a folder that is missing, read-only or a
 * file, a full disk (a 64 KiB tmpfs where mounting works, and RLIMIT_FSIZE everywhere) leaving
 * the slot as it was, the file removed by free; the worker: many jobs waited for out of order,
 * synchronous calls ordered after the jobs of their slot, clear dropping what has not started,
 * free with jobs pending; memory: pools and the creator's account back to their start, and an
 * allocation-failure sweep over create + put + submit + wait on both tiers.
 *
 * Tolerance: none; every comparison is of bytes, status codes, messages or byte counts. The
 * clear test needs the worker to still be busy when clear runs: it waits until the worker has
 * taken a 32 MiB copy, then queues ~60 small jobs behind it and clears. It checks only what
 * holds whatever the timing (completed jobs are a prefix in submission order, dropped ones the
 * rest, their buffers untouched) and retries a few times for at least one drop. The folder and
 * full-disk tests mount tmpfs (read-only; 64 KiB) where they can (root with CAP_SYS_ADMIN) and
 * unmount before checking; RLIMIT_FSIZE covers "full" everywhere. */
#include "lt.h"
#include "fsdp_model.h"

#include "fsdp/offload_store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void) {
  uint64_t x = rng_state += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
static void fill_random(void *p, size_t n) {
  unsigned char *b = p;
  for (size_t i = 0; i < n; i++) b[i] = (unsigned char)next_u64();
}

static size_t pool_now(loom_pool p) {
  loom_pool_stats s;
  loom_mem_stats(p, &s);
  return s.current_bytes;
}
static size_t account_now(int account, loom_pool p) {
  loom_pool_stats s;
  loom_mem_account_stats(account, p, &s);
  return s.current_bytes;
}

static void tmp_dir(char *dir, size_t cap) {
  const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(dir, cap, "%s/loom_ostore_XXXXXX", base);
  if (!mkdtemp(dir)) dir[0] = 0;
  LT_TRUE(dir[0] != 0);
}

/* Entries of a folder (besides . and ..). */
static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

static bool exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* ---- round trips ---------------------------------------------------------------------- */

enum { NS = 5 };
static const size_t rt_slot[NS] = {0, 1, 5, 2, 7};
static const size_t rt_size[NS] = {1, 4097, 10000, 123457, 0};

/* Put NS slots of random bytes (first and again with new bytes), read each back, check
 * has/bytes and the refusals. Returns the sum of the sizes. */
static void round_trip(loom__ostore *s) {
  unsigned char *src[NS], *dst[NS];
  size_t sum = 0;
  for (int i = 0; i < NS; i++) {
    src[i] = malloc(rt_size[i] + 1);
    dst[i] = malloc(rt_size[i] + 1);
    fill_random(src[i], rt_size[i]);
    sum += rt_size[i];
  }
  for (int i = 0; i < NS; i++) {
    LT_TRUE(!loom__ostore_has(s, rt_slot[i]));
    LT_OK(loom__ostore_put(s, rt_slot[i], src[i], rt_size[i]));
    LT_TRUE(loom__ostore_has(s, rt_slot[i]));
  }
  LT_TRUE(!loom__ostore_has(s, 3));
  LT_TRUE(!loom__ostore_has(s, 1000));
  LT_EQ(loom__ostore_bytes(s), sum);
  for (int round = 0; round < 2; round++) {
    for (int i = NS - 1; i >= 0; i--) {
      memset(dst[i], 0xA5, rt_size[i] + 1);
      LT_OK(loom__ostore_get(s, rt_slot[i], dst[i], rt_size[i]));
      LT_TRUE(memcmp(dst[i], src[i], rt_size[i]) == 0);
      LT_EQ(dst[i][rt_size[i]], 0xA5); /* not a byte past the end */
    }
    /* re-put every slot with new bytes: same space, new content */
    for (int i = 0; i < NS; i++) {
      fill_random(src[i], rt_size[i]);
      LT_OK(loom__ostore_put(s, rt_slot[i], src[i], rt_size[i]));
    }
    LT_EQ(loom__ostore_bytes(s), sum);
  }
  /* a size that is not the slot's, a slot never put */
  LT_ERR(loom__ostore_put(s, 1, src[2], 4096), LOOM_EINVAL, "slot 1 holds 4097 bytes, not 4096");
  LT_ERR(loom__ostore_get(s, 5, dst[2], 9999), LOOM_EINVAL, "slot 5 holds 10000 bytes, not 9999");
  LT_ERR(loom__ostore_get(s, 3, dst[2], 10), LOOM_EINVAL, "slot 3 holds no data");
  LT_ERR(loom__ostore_get(s, 1u << 20, dst[2], 10), LOOM_EINVAL, "holds no data");
  LT_ERR(loom__ostore_put(s, 9, NULL, 10), LOOM_EINVAL, "src is NULL");
  LT_ERR(loom__ostore_put(s, SIZE_MAX, src[0], 1), LOOM_EINVAL, "out of range");
  LT_TRUE(loom__ostore_has(s, 1)); /* refusals changed nothing */
  LT_EQ(loom__ostore_bytes(s), sum);
  loom__ostore_stats st;
  loom__ostore_get_stats(s, &st);
  LT_EQ(st.bytes_written, 3 * sum);
  LT_EQ(st.bytes_read, 2 * sum);
  LT_EQ(st.puts, 3 * NS);
  LT_EQ(st.gets, 2 * NS);
  LT_TRUE(st.transfer_s >= 0 && st.wait_s == 0);
  for (int i = 0; i < NS; i++) {
    free(src[i]);
    free(dst[i]);
  }
}

LT_TEST(ostore_host_round_trip) {
  size_t host0 = pool_now(LOOM_POOL_HOST), file0 = pool_now(LOOM_POOL_FILE);
  loom__ostore *s = NULL;
  LT_OK(loom__ostore_create(LOOM__OTIER_HOST, NULL, 0, &s));
  LT_TRUE(loom__ostore_path(s) == NULL);
  LT_EQ(loom__ostore_tier(s), LOOM__OTIER_HOST);
  round_trip(s);
  /* the slot buffers are host-pool bytes, and nothing else is (the store's own records are
   * bookkeeping, in the meta pool) */
  size_t sum = 0;
  for (int i = 0; i < NS; i++) sum += rt_size[i];
  LT_EQ(pool_now(LOOM_POOL_HOST), host0 + sum);
  LT_EQ(pool_now(LOOM_POOL_FILE), file0);
  loom__ostore_free(s);
  loom__ostore_free(NULL);
  LT_EQ(pool_now(LOOM_POOL_HOST), host0);
  /* arguments */
  LT_ERR(loom__ostore_create(LOOM__OTIER_HOST, NULL, 0, NULL), LOOM_EINVAL, "out is NULL");
  s = (loom__ostore *)&s;
  LT_ERR(loom__ostore_create((loom__otier)7, NULL, 0, &s), LOOM_EINVAL, "tier 7");
  LT_TRUE(s == NULL);
  LT_ERR(loom__ostore_create(LOOM__OTIER_DISK, NULL, 0, &s), LOOM_EINVAL, "needs a folder");
  LT_ERR(loom__ostore_create(LOOM__OTIER_DISK, "", 0, &s), LOOM_EINVAL, "needs a folder");
  LT_EQ(pool_now(LOOM_POOL_HOST), host0);
}

LT_TEST(ostore_disk_round_trip_and_layout) {
  char dir[256];
  tmp_dir(dir, sizeof dir);
  size_t host0 = pool_now(LOOM_POOL_HOST), file0 = pool_now(LOOM_POOL_FILE);
  loom__ostore *s = NULL;
  LT_OK(loom__ostore_create(LOOM__OTIER_DISK, dir, 3, &s));
  LT_EQ(loom__ostore_tier(s), LOOM__OTIER_DISK);
  const char *path = loom__ostore_path(s);
  char want[300], mid[64];
  snprintf(want, sizeof want, "%s/loom-offload-", dir);
  snprintf(mid, sizeof mid, "-%ld-3-", (long)getpid()); /* after the host's name */
  LT_TRUE(strncmp(path, want, strlen(want)) == 0);
  LT_TRUE(strstr(path + strlen(want), mid) != NULL);
  LT_TRUE(strcmp(path + strlen(path) - 4, ".bin") == 0);
  struct stat st;
  LT_TRUE(stat(path, &st) == 0 && S_ISREG(st.st_mode));
  LT_EQ_HEX(st.st_mode & 0777, 0600);
  round_trip(s);
  size_t sum = 0;
  for (int i = 0; i < NS; i++) sum += rt_size[i];
  LT_EQ(pool_now(LOOM_POOL_FILE), file0 + sum);
  /* ranges in order of first put, each on a 4096 boundary: 0 @0, 1 @4096, 5 @12288,
   * 2 @24576 (123457 bytes), 7 (0 bytes) */
  LT_TRUE(stat(path, &st) == 0);
  /* (O_DIRECT writes the last block whole: the range ends on the next 4096) */
  LT_EQ(st.st_size, 24576 + (loom__ostore_direct(s) ? 126976 : 123457));
  unsigned char a[4097], b[4097];
  LT_OK(loom__ostore_get(s, 1, a, sizeof a));
  int fd = open(path, O_RDONLY);
  LT_TRUE(fd >= 0);
  LT_EQ(pread(fd, b, sizeof b, 4096), (ssize_t)sizeof b);
  close(fd);
  LT_TRUE(memcmp(a, b, sizeof a) == 0);
  /* a second store of the same rank gets its own file */
  loom__ostore *s2 = NULL;
  LT_OK(loom__ostore_create(LOOM__OTIER_DISK, dir, 3, &s2));
  LT_TRUE(strcmp(loom__ostore_path(s2), path) != 0);
  LT_EQ(count_entries(dir), 2);
  loom__ostore_free(s2);
  char saved[512];
  snprintf(saved, sizeof saved, "%s", path);
  loom__ostore_free(s);
  LT_TRUE(!exists(saved)); /* free unlinks the file */
  LT_EQ(count_entries(dir), 0);
  LT_EQ(pool_now(LOOM_POOL_HOST), host0);
  LT_EQ(pool_now(LOOM_POOL_FILE), file0);
  /* a trailing slash on the folder makes no double slash */
  char slash[300];
  snprintf(slash, sizeof slash, "%s/", dir);
  LT_OK(loom__ostore_create(LOOM__OTIER_DISK, slash, 0, &s));
  LT_TRUE(strstr(loom__ostore_path(s), "//") == NULL);
  loom__ostore_free(s);
  fm_rm_tree(dir);
}

/* ---- changed behind the store's back ---------------------------------------------------- */

LT_TEST(ostore_disk_detects_flipped_and_truncated) {
  char dir[256];
  tmp_dir(dir, sizeof dir);
  size_t file0 = pool_now(LOOM_POOL_FILE);
  loom__ostore *s = NULL;
  LT_OK(loom__ostore_create(LOOM__OTIER_DISK, dir, 0, &s));
  enum { A = 5000, B = 70000 };
  static unsigned char x[A], y[B], out[B];
  fill_random(x, A);
  fill_random(y, B);
  LT_OK(loom__ostore_put(s, 0, x, A));
  LT_OK(loom__ostore_put(s, 1, y, B)); /* at 8192 */
  const char *path = loom__ostore_path(s);
  char msg[600];

  /* flip one byte of slot 1 */
  int fd = open(path, O_RDWR);
  LT_TRUE(fd >= 0);
  unsigned char c;
  LT_EQ(pread(fd, &c, 1, 8192 + 12345), 1);
  c ^= 0x10;
  LT_EQ(pwrite(fd, &c, 1, 8192 + 12345), 1);
  LT_ERR(loom__ostore_get(s, 1, out, B), LOOM_EFORMAT, "changed behind loom's back");
  snprintf(msg, sizeof msg, "%s", loom_last_error());
  LT_TRUE(strstr(msg, path) != NULL);
  LT_TRUE(strstr(msg, "slot 1") != NULL);
  /* the same from the worker: the error comes back from wait, with its message */
  loom__ojob j = 0;
  LT_OK(loom__ostore_submit_get(s, 1, out, B, &j));
  LT_ERR(loom__ostore_wait(s, j, NULL), LOOM_EFORMAT, "changed behind loom's back");
  LT_TRUE(strstr(loom_last_error(), path) != NULL);
  LT_TRUE(strstr(loom_last_error(), "slot 1") != NULL);
  LT_TRUE(strstr(loom_last_error(), "worker") != NULL);
  /* slot 0 is untouched and still reads; a re-put of slot 1 repairs it */
  LT_OK(loom__ostore_get(s, 0, out, A));
  LT_TRUE(memcmp(out, x, A) == 0);
  LT_OK(loom__ostore_put(s, 1, y, B));
  LT_OK(loom__ostore_get(s, 1, out, B));
  LT_TRUE(memcmp(out, y, B) == 0);

  /* truncate the file in the middle of slot 1 */
  LT_TRUE(ftruncate(fd, 8192 + 100) == 0);
  close(fd);
  LT_ERR(loom__ostore_get(s, 1, out, B), LOOM_EFORMAT, "truncated");
  snprintf(msg, sizeof msg, "%s", loom_last_error());
  LT_TRUE(strstr(msg, path) != NULL);
  LT_TRUE(strstr(msg, "slot 1") != NULL);
  LT_TRUE(strstr(msg, "changed behind loom's back") != NULL);
  LT_OK(loom__ostore_submit_get(s, 1, out, B, &j));
  LT_ERR(loom__ostore_wait(s, j, NULL), LOOM_EFORMAT, "truncated");
  LT_OK(loom__ostore_get(s, 0, out, A)); /* still whole */
  LT_TRUE(memcmp(out, x, A) == 0);
  loom__ostore_free(s);
  LT_EQ(count_entries(dir), 0);
  LT_EQ(pool_now(LOOM_POOL_FILE), file0);
  fm_rm_tree(dir);
}

/* ---- folders that cannot be used -------------------------------------------------------- */

/* Mount a tmpfs on dir (root only, where the sandbox allows). */
static bool try_mount_tmpfs(const char *dir, unsigned long flags, const char *opts) {
  return mount("tmpfs", dir, "tmpfs", flags, opts) == 0;
}

LT_TEST(ostore_disk_bad_folders) {
  char dir[256], p[400];
  tmp_dir(dir, sizeof dir);
  size_t host0 = pool_now(LOOM_POOL_HOST), file0 = pool_now(LOOM_POOL_FILE);
  loom__ostore *s = NULL;

  snprintf(p, sizeof p, "%s/missing", dir);
  LT_ERR(loom__ostore_create(LOOM__OTIER_DISK, p, 0, &s), LOOM_EIO, "does not exist");
  LT_TRUE(strstr(loom_last_error(), p) != NULL);
  LT_TRUE(s == NULL);

  snprintf(p, sizeof p, "%s/a-file", dir);
  FILE *f = fopen(p, "w");
  LT_TRUE(f != NULL);
  fclose(f);
  LT_ERR(loom__ostore_create(LOOM__OTIER_DISK, p, 0, &s), LOOM_EIO, "is not a folder");
  LT_TRUE(strstr(loom_last_error(), p) != NULL);
  unlink(p);

  /* a folder that exists but takes no regular files (/proc: ENOENT for a new file) is not
   * said to be missing */
  int pfd = open("/proc/loom-probe", O_RDWR | O_CREAT | O_EXCL, 0600);
  if (pfd < 0 && errno == ENOENT && access("/proc", F_OK) == 0) {
    LT_ERR(loom__ostore_create(LOOM__OTIER_DISK, "/proc", 0, &s), LOOM_EIO,
           "'/proc' takes no regular files");
    LT_TRUE(strstr(loom_last_error(), "does not exist") == NULL);
    LT_TRUE(strstr(loom_last_error(), "No such file or directory") != NULL);
  }
  if (pfd >= 0) close(pfd);

  /* read-only: permission bits where they bind (not root); for root, a read-only tmpfs, or
   * sysfs (no file can be made in /sys, root or not) */
  snprintf(p, sizeof p, "%s/ro", dir);
  LT_TRUE(mkdir(p, 0700) == 0);
  const char *ro = NULL;
  bool mounted = false;
  if (geteuid() != 0) {
    LT_TRUE(chmod(p, 0500) == 0);
    ro = p;
  } else if (try_mount_tmpfs(p, MS_RDONLY, "size=4k")) {
    mounted = true;
    ro = p;
  } else {
    struct stat st;
    if (stat("/sys", &st) == 0 && S_ISDIR(st.st_mode) && access("/sys", F_OK) == 0) {
      int fd = open("/sys/loom-probe", O_RDWR | O_CREAT | O_EXCL, 0600);
      if (fd >= 0) { /* a writable /sys: not a read-only folder after all */
        close(fd);
        unlink("/sys/loom-probe");
      } else {
        ro = "/sys";
      }
    }
  }
  if (ro) {
    loom_clear_error();
    int rc = loom__ostore_create(LOOM__OTIER_DISK, ro, 0, &s);
    char msg[600];
    snprintf(msg, sizeof msg, "%s", loom_last_error());
    if (rc == LOOM_OK) loom__ostore_free(s);
    if (mounted) umount2(p, MNT_DETACH);
    LT_EQ(rc, LOOM_EIO);
    LT_TRUE(strstr(msg, "read-only") != NULL);
    LT_TRUE(strstr(msg, ro) != NULL);
  } else {
    lt_skip("running as root with no read-only filesystem to try (mount refused, /sys writable)");
  }
  chmod(p, 0700);
  LT_EQ(count_entries(p), 0);
  LT_EQ(pool_now(LOOM_POOL_HOST), host0);
  LT_EQ(pool_now(LOOM_POOL_FILE), file0);
  fm_rm_tree(dir);
}

/* ---- full ------------------------------------------------------------------------------- */

/* Fill a store until a put does not fit: slot 0 (small) fits, slot 1 (big) does not, and
 * afterwards slot 1 is as it was (no size, no space), slot 0 still reads and re-puts, the
 * file holds no more than it did, and the same from the worker. Results are checked by the
 * caller after it restored the limit (a failed check leaves the test at once). */
typedef struct full_result {
  int rc_small, rc_big, rc_job, rc_after, rc_reput, rc_get;
  char msg[600], job_msg[600];
  bool has_big, same_bytes, file_back, read_ok;
} full_result;

static void fill_until_full(loom__ostore *s, size_t small, size_t big, full_result *r) {
  unsigned char *a = malloc(small), *b = malloc(big), *o = malloc(small);
  fill_random(a, small);
  fill_random(b, big);
  r->rc_small = loom__ostore_put(s, 0, a, small);
  size_t held = loom__ostore_bytes(s);
  struct stat st0, st1;
  stat(loom__ostore_path(s), &st0);
  r->rc_big = loom__ostore_put(s, 1, b, big);
  snprintf(r->msg, sizeof r->msg, "%s", loom_last_error());
  r->has_big = loom__ostore_has(s, 1);
  r->same_bytes = loom__ostore_bytes(s) == held;
  stat(loom__ostore_path(s), &st1);
  r->file_back = st1.st_size == st0.st_size;
  loom__ojob j = 0;
  r->rc_job = loom__ostore_submit_put(s, 2, b, big, &j);
  if (!r->rc_job) r->rc_job = loom__ostore_wait(s, j, NULL);
  snprintf(r->job_msg, sizeof r->job_msg, "%s", loom_last_error());
  /* slot 1 has no size any more: a smaller put of it is fine */
  r->rc_after = loom__ostore_put(s, 1, b, 1000);
  r->rc_reput = loom__ostore_put(s, 0, a, small);
  r->rc_get = loom__ostore_get(s, 0, o, small);
  r->read_ok = memcmp(o, a, small) == 0;
  free(a);
  free(b);
  free(o);
}

static void check_full(const full_result *r, const char *path) {
  LT_OK(r->rc_small);
  LT_EQ(r->rc_big, LOOM_EIO);
  LT_TRUE(strstr(r->msg, "full") != NULL);
  LT_TRUE(strstr(r->msg, path) != NULL);
  LT_TRUE(strstr(r->msg, "slot 1") != NULL);
  LT_TRUE(!r->has_big);
  LT_TRUE(r->same_bytes);
  LT_TRUE(r->file_back);
  LT_EQ(r->rc_job, LOOM_EIO);
  LT_TRUE(strstr(r->job_msg, "full") != NULL);
  LT_TRUE(strstr(r->job_msg, path) != NULL);
  LT_OK(r->rc_after);
  LT_OK(r->rc_reput);
  LT_OK(r->rc_get);
  LT_TRUE(r->read_ok);
}

LT_TEST(ostore_disk_full_rlimit) {
  char dir[256];
  tmp_dir(dir, sizeof dir);
  size_t file0 = pool_now(LOOM_POOL_FILE);
  loom__ostore *s = NULL;
  LT_OK(loom__ostore_create(LOOM__OTIER_DISK, dir, 0, &s));
  char path[512];
  snprintf(path, sizeof path, "%s", loom__ostore_path(s));
  /* a file size limit of 64 KiB: growing past it is EFBIG (SIGXFSZ ignored), as a full disk */
  struct rlimit old, lim;
  LT_TRUE(getrlimit(RLIMIT_FSIZE, &old) == 0);
  lim = old;
  lim.rlim_cur = 64 * 1024;
  void (*old_sig)(int) = signal(SIGXFSZ, SIG_IGN);
  full_result r;
  memset(&r, 0, sizeof r);
  int set = setrlimit(RLIMIT_FSIZE, &lim);
  if (set == 0) fill_until_full(s, 20000, 100000, &r);
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, old_sig);
  LT_EQ(set, 0);
  check_full(&r, path);
  loom__ostore_free(s);
  LT_TRUE(!exists(path));
  LT_EQ(pool_now(LOOM_POOL_FILE), file0);
  fm_rm_tree(dir);
}

LT_TEST(ostore_disk_full_tmpfs) {
  char dir[256];
  tmp_dir(dir, sizeof dir);
  if (geteuid() != 0 || !try_mount_tmpfs(dir, 0, "size=64k")) {
    fm_rm_tree(dir);
    lt_skip("cannot mount a 64 KiB tmpfs here (ostore_disk_full_rlimit covers full)");
    return;
  }
  size_t file0 = pool_now(LOOM_POOL_FILE);
  loom__ostore *s = NULL;
  int rc = loom__ostore_create(LOOM__OTIER_DISK, dir, 0, &s);
  full_result r;
  memset(&r, 0, sizeof r);
  char path[512] = "";
  if (!rc) {
    snprintf(path, sizeof path, "%s", loom__ostore_path(s));
    fill_until_full(s, 20000, 100000, &r);
      loom__ostore_free(s);
  }
  int left = count_entries(dir);
  umount2(dir, MNT_DETACH);
  fm_rm_tree(dir);
  LT_OK(rc);
  check_full(&r, path);
  LT_EQ(left, 0);
  LT_EQ(pool_now(LOOM_POOL_FILE), file0);
}

/* ---- the worker --------------------------------------------------------------------------- */

enum { NJ = 24 };

static void worker_many(loom__otier tier, const char *dir) {
  size_t host0 = pool_now(LOOM_POOL_HOST), file0 = pool_now(LOOM_POOL_FILE);
  loom__ostore *s = NULL;
  LT_OK(loom__ostore_create(tier, dir, 1, &s));
  unsigned char *a[NJ], *b[NJ], *c[NJ];
  size_t size[NJ], sum = 0;
  for (int i = 0; i < NJ; i++) {
    size[i] = 1 + (size_t)(next_u64() % 50000);
    a[i] = malloc(size[i]);
    b[i] = malloc(size[i]);
    c[i] = malloc(size[i]);
    fill_random(a[i], size[i]);
    fill_random(c[i], size[i]);
    sum += size[i];
  }
  loom__ojob put[NJ], get[NJ], put2[NJ];
  /* puts of new slots, then gets of them queued behind, before any put ran */
  for (int i = 0; i < NJ; i++) LT_OK(loom__ostore_submit_put(s, (size_t)i * 3, a[i], size[i], &put[i]));
  for (int i = 0; i < NJ; i++) {
    memset(b[i], 0, size[i]);
    LT_OK(loom__ostore_submit_get(s, (size_t)i * 3, b[i], size[i], &get[i]));
    LT_TRUE(get[i] > put[i]);
  }
  /* refused at submit: a size not the slot's (declared by the queued put), a slot never put */
  loom__ojob bad = 77;
  LT_ERR(loom__ostore_submit_get(s, 3, b[1], size[1] + 1, &bad), LOOM_EINVAL, "not");
  LT_EQ(bad, 0);
  LT_ERR(loom__ostore_submit_get(s, 4, b[1], size[1], &bad), LOOM_EINVAL, "slot 4 was never put");
  LT_ERR(loom__ostore_submit_put(s, 3, a[1], size[1] + 1, &bad), LOOM_EINVAL, "slot 3 holds");
  LT_ERR(loom__ostore_submit_put(s, 3, NULL, 5, &bad), LOOM_EINVAL, "src is NULL");
  LT_ERR(loom__ostore_submit_get(s, 3, b[1], size[1], NULL), LOOM_EINVAL, "job is NULL");
  /* wait out of order: gets from the last, then puts from the middle */
  for (int i = NJ - 1; i >= 0; i--) {
    double w = -1;
    LT_OK(loom__ostore_wait(s, get[i], &w));
    LT_TRUE(w >= 0);
    LT_TRUE(memcmp(b[i], a[i], size[i]) == 0);
  }
  for (int k = 0; k < NJ; k++) LT_OK(loom__ostore_wait(s, put[(k + NJ / 2) % NJ], NULL));
  /* waited already, 0, never submitted: OK at once */
  double w = -1;
  LT_OK(loom__ostore_wait(s, put[0], &w));
  LT_EQ(w, 0);
  LT_OK(loom__ostore_wait(s, 0, NULL));
  LT_OK(loom__ostore_wait(s, 1u << 30, NULL));
  LT_EQ(loom__ostore_bytes(s), sum);
  /* new bytes through the worker; a synchronous get of a slot waits for its queued put */
  for (int i = 0; i < NJ; i++) LT_OK(loom__ostore_submit_put(s, (size_t)i * 3, c[i], size[i], &put2[i]));
  for (int i = 0; i < NJ; i += 5) {
    LT_OK(loom__ostore_get(s, (size_t)i * 3, b[i], size[i]));
    LT_TRUE(memcmp(b[i], c[i], size[i]) == 0);
  }
  /* a synchronous put after a queued get: the get sees the bytes from before */
  loom__ojob g;
  LT_OK(loom__ostore_submit_get(s, 3, b[1], size[1], &g));
  LT_OK(loom__ostore_put(s, 3, a[1], size[1]));
  LT_OK(loom__ostore_wait(s, g, NULL));
  LT_TRUE(memcmp(b[1], c[1], size[1]) == 0);
  LT_OK(loom__ostore_get(s, 3, b[1], size[1]));
  LT_TRUE(memcmp(b[1], a[1], size[1]) == 0);
  for (int i = NJ - 1; i >= 0; i--) LT_OK(loom__ostore_wait(s, put2[i], NULL));
  loom__ostore_stats st;
  loom__ostore_get_stats(s, &st);
  LT_EQ(st.jobs, 3 * NJ + 1);
  LT_EQ(st.jobs_cleared, 0);
  LT_TRUE(st.bytes_written >= 2 * sum);
  LT_TRUE(st.transfer_s > 0);
  LT_TRUE(st.wait_s >= 0);
  loom__ostore_free(s);
  for (int i = 0; i < NJ; i++) {
    free(a[i]);
    free(b[i]);
    free(c[i]);
  }
  LT_EQ(pool_now(LOOM_POOL_HOST), host0);
  LT_EQ(pool_now(LOOM_POOL_FILE), file0);
}

LT_TEST(ostore_worker_many_jobs_host) { worker_many(LOOM__OTIER_HOST, NULL); }

LT_TEST(ostore_worker_many_jobs_disk) {
  char dir[256];
  tmp_dir(dir, sizeof dir);
  worker_many(LOOM__OTIER_DISK, dir);
  LT_EQ(count_entries(dir), 0);
  fm_rm_tree(dir);
}

LT_TEST(ostore_worker_clear_drops_unstarted) {
  size_t host0 = pool_now(LOOM_POOL_HOST);
  enum { BIG = 32 << 20, N = 60, SMALL = 256 };
  unsigned char *big = malloc(BIG);
  memset(big, 7, BIG);
  static unsigned char src[N][SMALL], dst[N][SMALL];
  bool dropped_some = false;
  for (int attempt = 0; attempt < 5 && !dropped_some; attempt++) {
    loom__ostore *s = NULL;
    LT_OK(loom__ostore_create(LOOM__OTIER_HOST, NULL, 0, &s));
    for (int i = 0; i < N; i++) {
      fill_random(src[i], SMALL);
      LT_OK(loom__ostore_put(s, 1 + (size_t)i, src[i], SMALL));
      memset(dst[i], 0xEE, SMALL);
    }
    loom__ojob first, jobs[N], newslot;
    LT_OK(loom__ostore_submit_put(s, 0, big, BIG, &first)); /* keeps the worker busy */
    while (loom__ostore_queued(s) != 0) sched_yield(); /* until the worker has taken it */
    for (int i = 0; i < N; i++) LT_OK(loom__ostore_submit_get(s, 1 + (size_t)i, dst[i], SMALL, &jobs[i]));
    LT_OK(loom__ostore_submit_put(s, 500, src[0], 10, &newslot)); /* a new slot, queued */
    LT_TRUE(loom__ostore_queued(s) >= 1);
    loom__ostore_clear(s);
    LT_EQ(loom__ostore_queued(s), 0);
    LT_OK(loom__ostore_wait(s, first, NULL)); /* the running one completed */
    LT_TRUE(loom__ostore_has(s, 0));
    /* the jobs that ran are a prefix; the rest were dropped and never touched their buffer */
    int ok = 0, aborted = 0;
    for (int i = 0; i < N; i++) {
      loom_clear_error();
      int rc = loom__ostore_wait(s, jobs[i], NULL);
      if (rc == LOOM_OK) {
        LT_EQ(aborted, 0);
        LT_TRUE(memcmp(dst[i], src[i], SMALL) == 0);
        ok++;
      } else {
        LT_EQ(rc, LOOM_EABORTED);
        LT_TRUE(strstr(loom_last_error(), "dropped before it started") != NULL);
        LT_EQ(dst[i][0], 0xEE);
        LT_EQ(dst[i][SMALL - 1], 0xEE);
        aborted++;
      }
    }
    int rc_new = loom__ostore_wait(s, newslot, NULL);
    loom__ostore_stats st;
    loom__ostore_get_stats(s, &st);
    LT_EQ(st.jobs_cleared, (uint64_t)aborted + (rc_new == LOOM_EABORTED));
    if (aborted) {
      LT_EQ(rc_new, LOOM_EABORTED);
      /* the dropped put of a new slot left it with no size: another size is fine */
      LT_TRUE(!loom__ostore_has(s, 500));
      LT_OK(loom__ostore_put(s, 500, src[0], 20));
      dropped_some = true;
    }
    /* free with jobs still queued: they are dropped, nothing leaks */
    for (int i = 0; i < N; i++) LT_OK(loom__ostore_submit_get(s, 1 + (size_t)i, dst[i], SMALL, &jobs[i]));
    loom__ostore_free(s);
    LT_EQ(pool_now(LOOM_POOL_HOST), host0);
  }
  free(big);
  LT_TRUE(dropped_some);
}

/* ---- memory accounts --------------------------------------------------------------------- */

LT_TEST(ostore_counts_on_the_creators_account) {
  char dir[256];
  tmp_dir(dir, sizeof dir);
  int acc0 = loom_mem_account();
  enum { ACC = 9, SZ = 50000 };
  LT_OK(loom_mem_set_account(ACC));
  size_t host0 = account_now(ACC, LOOM_POOL_HOST), file0 = account_now(ACC, LOOM_POOL_FILE);
  size_t zero_host0 = account_now(0, LOOM_POOL_HOST);
  static unsigned char x[SZ];
  fill_random(x, SZ);
  loom__ostore *h = NULL, *d = NULL;
  int rc = loom__ostore_create(LOOM__OTIER_HOST, NULL, 0, &h);
  if (!rc) rc = loom__ostore_create(LOOM__OTIER_DISK, dir, 0, &d);
  loom__ojob j1 = 0, j2 = 0;
  /* first puts on the worker: the host buffer is allocated there, for the creator */
  if (!rc) rc = loom__ostore_submit_put(h, 0, x, SZ, &j1);
  if (!rc) rc = loom__ostore_submit_put(d, 0, x, SZ, &j2);
  LT_OK(loom_mem_set_account(acc0)); /* waiting from another account changes nothing */
  if (!rc) rc = loom__ostore_wait(h, j1, NULL);
  if (!rc) rc = loom__ostore_wait(d, j2, NULL);
  size_t host_mid = account_now(ACC, LOOM_POOL_HOST), file_mid = account_now(ACC, LOOM_POOL_FILE);
  size_t zero_host_mid = account_now(0, LOOM_POOL_HOST);
  loom__ostore_free(h);
  loom__ostore_free(d);
  LT_OK(rc);
  LT_EQ(host_mid, host0 + SZ); /* the slot's buffer, the store's records being in meta */
  LT_EQ(file_mid, file0 + SZ);
  if (acc0 != 0) LT_EQ(zero_host_mid, zero_host0);
  LT_EQ(account_now(ACC, LOOM_POOL_HOST), host0);
  LT_EQ(account_now(ACC, LOOM_POOL_FILE), file0);
  fm_rm_tree(dir);
}

/* ---- allocation failures ---------------------------------------------------------------- */

/* create + put + put + submit_put (new slot: allocates on the worker) + submit_get + waits +
 * get + free, with the nth allocation failing. Returns the first failure's status, LOOM_OK if
 * none failed. */
static int alloc_scenario(loom__otier tier, const char *dir, uint64_t nth, char *msg, size_t cap) {
  static unsigned char a[3000], b[70000], c[5000], o[70000];
  fill_random(a, sizeof a);
  fill_random(b, sizeof b);
  fill_random(c, sizeof c);
  loom__ostore *s = NULL;
  loom__ojob j1 = 0, j2 = 0;
  loom_alloc_fail_nth(nth);
  int rc = loom__ostore_create(tier, dir, 0, &s);
  if (!rc) rc = loom__ostore_put(s, 0, a, sizeof a);
  if (!rc) rc = loom__ostore_put(s, 40, b, sizeof b); /* grows the slot table */
  if (!rc) rc = loom__ostore_submit_put(s, 2, c, sizeof c, &j1);
  if (!rc) rc = loom__ostore_submit_get(s, 40, o, sizeof b, &j2);
  int rc1 = s ? loom__ostore_wait(s, j1, NULL) : LOOM_OK;
  if (!rc) rc = rc1;
  int rc2 = s ? loom__ostore_wait(s, j2, NULL) : LOOM_OK;
  if (!rc) rc = rc2;
  if (!rc && memcmp(o, b, sizeof b) != 0) rc = LOOM_EFORMAT;
  if (!rc) rc = loom__ostore_get(s, 2, o, sizeof c);
  if (!rc && memcmp(o, c, sizeof c) != 0) rc = LOOM_EFORMAT;
  loom_alloc_fail_nth(0);
  snprintf(msg, cap, "%s", loom_last_error());
  loom__ostore_free(s);
  return rc;
}

static void alloc_sweep(loom__otier tier, const char *dir) {
  size_t host0 = pool_now(LOOM_POOL_HOST), file0 = pool_now(LOOM_POOL_FILE);
  char msg[600];
  int failures = 0;
  bool finished = false;
  for (uint64_t n = 1; n < 200 && !finished; n++) {
    loom_clear_error();
    int rc = alloc_scenario(tier, dir, n, msg, sizeof msg);
    if (rc == LOOM_OK) {
      finished = true;
    } else {
      LT_EQ(rc, LOOM_ENOMEM);
      LT_TRUE(strstr(msg, "out of memory") != NULL);
      failures++;
    }
    LT_EQ(pool_now(LOOM_POOL_HOST), host0);
    LT_EQ(pool_now(LOOM_POOL_FILE), file0);
    if (dir) LT_EQ(count_entries(dir), 0);
  }
  LT_TRUE(finished);
  /* every allocation failed once: the store, the path (disk), the slot table twice, the host
   * buffers of slots 0 and 40 (sync) and 2 (on the worker: its failure comes back from wait),
   * the two job records */
  LT_TRUE(failures >= (tier == LOOM__OTIER_HOST ? 8 : 6));
}

LT_TEST(ostore_alloc_failure_sweep_host) { alloc_sweep(LOOM__OTIER_HOST, NULL); }

LT_TEST(ostore_alloc_failure_sweep_disk) {
  char dir[256];
  tmp_dir(dir, sizeof dir);
  alloc_sweep(LOOM__OTIER_DISK, dir);
  fm_rm_tree(dir);
}

/* A process killed mid-run leaves its file; the next store of this host removes it if that
 * process is gone, and leaves files of live processes, of other hosts, and other names. */
LT_TEST(ostore_disk_removes_files_left_by_dead_processes_only) {
  char dir[256];
  tmp_dir(dir, sizeof dir);
  loom__ostore *s = NULL;
  LT_OK(loom__ostore_create(LOOM__OTIER_DISK, dir, 0, &s)); /* learn this host's file prefix */
  const char *mine = strrchr(loom__ostore_path(s), '/') + 1;
  char host_prefix[300], self[64];
  snprintf(self, sizeof self, "-%ld-0-", (long)getpid());
  size_t hp = (size_t)(strstr(mine, self) - mine); /* "loom-offload-<host>" */
  snprintf(host_prefix, sizeof host_prefix, "%.*s", (int)hp, mine);
  loom__ostore_free(s);
  pid_t dead = fork(); /* a pid that surely existed and no longer does */
  if (dead == 0) _exit(0);
  waitpid(dead, NULL, 0);
  char stale[1024], live[1024], other_host[1024], other_name[1024];
  snprintf(stale, sizeof stale, "%s/%s-%ld-0-0.bin", dir, host_prefix, (long)dead);
  snprintf(live, sizeof live, "%s/%s-%ld-1-0.bin", dir, host_prefix, (long)getppid());
  snprintf(other_host, sizeof other_host, "%s/loom-offload-elsewhere.example-%ld-0-0.bin", dir,
           (long)dead);
  snprintf(other_name, sizeof other_name, "%s/%s-%ld-0-0.bin.keep", dir, host_prefix, (long)dead);
  const char *files[] = {stale, live, other_host, other_name};
  for (int i = 0; i < 4; i++) {
    FILE *f = fopen(files[i], "w");
    LT_TRUE(f != NULL);
    fputs("x", f);
    fclose(f);
  }
  LT_OK(loom__ostore_create(LOOM__OTIER_DISK, dir, 0, &s));
  LT_TRUE(access(stale, F_OK) != 0); /* its process is gone: removed */
  LT_TRUE(access(live, F_OK) == 0);
  LT_TRUE(access(other_host, F_OK) == 0);
  LT_TRUE(access(other_name, F_OK) == 0);
  loom__ostore_free(s);
  for (int i = 1; i < 4; i++) unlink(files[i]);
  rmdir(dir);
}

/* submit_put_ex with LOOM__OJOB_RELEASE: once the put has succeeded, the source's whole pages read as zero and
 * the slot holds the bytes; a put that fails (the file may not grow: RLIMIT_FSIZE) leaves the
 * source as it was. Both tiers (the host tier's put copies, then releases the same way). */
static void put_release(loom__otier tier, const char *dir) {
  loom__ostore *s = NULL;
  LT_OK(loom__ostore_create(tier, dir, 0, &s));
  size_t bytes = ((size_t)3 << 20) + 4096 + 12; /* whole pages inside, ragged edges */
  unsigned char *src = loom__malloc(LOOM_POOL_COMPUTE, bytes), *want = malloc(bytes),
                *got = malloc(bytes);
  LT_TRUE(src && want && got);
  fill_random(src, bytes);
  memcpy(want, src, bytes);
  loom__ojob job = 0;
  LT_OK(loom__ostore_submit_put_ex(s, 4, src, bytes, LOOM__OJOB_RELEASE, &job));
  LT_OK(loom__ostore_wait(s, job, NULL));
  LT_OK(loom__ostore_get(s, 4, got, bytes));
  LT_TRUE(memcmp(got, want, bytes) == 0);
  long pg = sysconf(_SC_PAGESIZE);
  uintptr_t lo = ((uintptr_t)src + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
  uintptr_t hi = ((uintptr_t)src + bytes) & ~((uintptr_t)pg - 1);
  LT_TRUE(hi > lo);
  size_t nonzero = 0;
  for (uintptr_t p = lo; p < hi; p++) nonzero += *(unsigned char *)p != 0;
  LT_EQ(nonzero, 0);
  /* the bytes outside the whole pages are kept */
  LT_TRUE(memcmp(src, want, lo - (uintptr_t)src) == 0);
  LT_TRUE(memcmp((unsigned char *)hi, want + (hi - (uintptr_t)src), (uintptr_t)src + bytes - hi) == 0);
  if (tier == LOOM__OTIER_DISK) { /* a failed put: the source stays */
    fill_random(src, bytes);
    memcpy(want, src, bytes);
    struct rlimit old, lim;
    LT_TRUE(getrlimit(RLIMIT_FSIZE, &old) == 0);
    lim = old;
    lim.rlim_cur = 64 * 1024;
    void (*old_sig)(int) = signal(SIGXFSZ, SIG_IGN);
    int set = setrlimit(RLIMIT_FSIZE, &lim);
    int rc = LOOM_OK;
    if (set == 0 && (rc = loom__ostore_submit_put_ex(s, 9, src, bytes, LOOM__OJOB_RELEASE, &job)) == LOOM_OK)
      rc = loom__ostore_wait(s, job, NULL);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, old_sig);
    LT_EQ(set, 0);
    LT_EQ(rc, LOOM_EIO);
    LT_TRUE(memcmp(src, want, bytes) == 0);
  }
  loom__free(src);
  free(want);
  free(got);
  loom__ostore_free(s);
}

LT_TEST(ostore_put_release_gives_pages_back_only_after_success_host) {
  put_release(LOOM__OTIER_HOST, NULL);
}

LT_TEST(ostore_put_release_gives_pages_back_only_after_success_disk) {
  char dir[256];
  tmp_dir(dir, sizeof dir);
  put_release(LOOM__OTIER_DISK, dir);
  fm_rm_tree(dir);
}

/* LOOM__OJOB_FIRST: a put submitted behind queued jobs of other slots runs before them (one
 * worker: the host tier's). Ten 16 MiB puts are queued behind a running one, then a FIRST put
 * of another slot: once it is done, puts queued before it are still waiting (in submission
 * order they would all have run first); a FIRST put of a slot with a job queued keeps its
 * place behind that job (its bytes are the last put's). */
LT_TEST(ostore_first_put_passes_queued_jobs_of_other_slots) {
  loom__ostore *s = NULL;
  LT_OK(loom__ostore_create(LOOM__OTIER_HOST, NULL, 0, &s));
  enum { N = 10 };
  size_t big = (size_t)16 << 20;
  unsigned char *buf = malloc(big), *small = malloc(4096), *small2 = malloc(4096),
                *got = malloc(4096);
  LT_TRUE(buf && small && small2 && got);
  memset(buf, 7, big);
  memset(small, 1, 4096);
  memset(small2, 2, 4096);
  loom__ojob jobs[N + 1], first = 0, same = 0, late = 0;
  for (int i = 0; i <= N; i++) LT_OK(loom__ostore_submit_put(s, (size_t)i, buf, big, &jobs[i]));
  LT_OK(loom__ostore_submit_put_ex(s, 50, small, 4096, LOOM__OJOB_FIRST, &first));
  LT_OK(loom__ostore_wait(s, first, NULL));
  LT_TRUE(loom__ostore_queued(s) >= 1);
  /* slot 60 has a put queued: a FIRST put of it stays behind it */
  LT_OK(loom__ostore_submit_put_ex(s, 60, small, 4096, 0, &same));
  LT_OK(loom__ostore_submit_put_ex(s, 60, small2, 4096, LOOM__OJOB_FIRST, &late));
  for (int i = 0; i <= N; i++) LT_OK(loom__ostore_wait(s, jobs[i], NULL));
  LT_OK(loom__ostore_wait(s, same, NULL));
  LT_OK(loom__ostore_wait(s, late, NULL));
  LT_OK(loom__ostore_get(s, 60, got, 4096));
  LT_TRUE(memcmp(got, small2, 4096) == 0);
  LT_OK(loom__ostore_get(s, 50, got, 4096));
  LT_TRUE(memcmp(got, small, 4096) == 0);
  loom__ostore_free(s);
  free(buf);
  free(small);
  free(small2);
  free(got);
}
