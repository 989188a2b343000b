/* test_offload_io.c: how the offload store's disk tier uses the disk (src/fsdp/offload_store.h):
 * the bytes a get reads from storage are its slot's and no more (no readahead into the slots
 * around it: /proc/thread-self/io's read_bytes, where the kernel counts them), with O_DIRECT,
 * buffered, and buffered as the fallback where the filesystem refuses O_DIRECT (a test hook
 * makes its check fail); several workers
 * moving jobs of different slots at once while the jobs of one slot stay in submission order
 * (every get sees the put queued just before it, over many rounds of put-get on few slots); the
 * worker count's checks; a job's failure on one worker of several returned by its wait; O_DIRECT
 * straight into and out of aligned buffers, the same bytes as through the bounce block.
 *
 * Tolerance: the read bytes are compared with the slots' bytes rounded up to pages, plus 5%
 * (the target of the disk-tier issue); nothing else has a tolerance (bytes, status codes and
 * messages). Where the folder's filesystem counts no reads (tmpfs: TMPDIR there), the
 * read-bytes test says so and checks only the bytes. */
#include "lt.h"

#include "fsdp/offload_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void io_tmp_dir(char *dir, size_t cap) {
  const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/var/tmp";
  snprintf(dir, cap, "%s/loom_oio_XXXXXX", base);
  if (!mkdtemp(dir)) dir[0] = 0;
  LT_TRUE(dir[0] != 0);
}

static uint64_t io_rng = 0x243f6a8885a308d3ull;
static void io_fill(void *p, size_t n) {
  unsigned char *b = p;
  for (size_t i = 0; i < n; i++) {
    io_rng = io_rng * 6364136223846793005ull + 1442695040888963407ull;
    b[i] = (unsigned char)(io_rng >> 56);
  }
}

/* read_bytes of the calling thread (what it made the kernel read from storage); -1 if the
 * kernel does not say. */
static double thread_read_bytes(void) {
  FILE *p = fopen("/proc/thread-self/io", "r");
  char line[256];
  double v = -1;
  while (p && fgets(line, sizeof line, p))
    if (!strncmp(line, "read_bytes:", 11)) v = atof(line + 11);
  if (p) fclose(p);
  return v;
}

/* Land the file's writes and drop its pages: the next reads come from storage. */
static void make_cold(const char *path) {
  int fd = open(path, O_RDONLY);
  LT_TRUE(fd >= 0);
  LT_EQ(fdatasync(fd), 0);
  LT_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  close(fd);
}

static void rm_dir(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    unlink(p);
  }
  if (d) closedir(d);
  rmdir(dir);
}

/* 24 slots of 1 MiB, every third one read back cold, synchronously (on this thread, where
 * read_bytes counts it): with a disk's readahead (8 MiB on a virtio disk) each 1 MiB read also
 * read the two slots after it; the store reads its slot and nothing else, with O_DIRECT (the
 * default where the filesystem takes it) and buffered: turned off (LOOM_OFFLOAD_DIRECT=0), or
 * the fallback of a filesystem that refuses O_DIRECT (its check made to fail: the flag taken
 * off the file again and the check's write gone, so an unaligned buffer still round-trips).
 * Every get lands on an odd address: O_DIRECT or not, the caller's buffer needs no
 * alignment. */
enum { IO_DIRECT_DEFAULT, IO_DIRECT_OFF, IO_DIRECT_REFUSED };
static void reads_only_the_slot(int mode) {
  enum { N = 24, SZ = 1 << 20, STRIDE = 3 };
  char dir[256];
  io_tmp_dir(dir, sizeof dir);
  loom__ostore *s = NULL;
  if (mode == IO_DIRECT_OFF) setenv("LOOM_OFFLOAD_DIRECT", "0", 1);
  loom__ostore_refuse_direct_for_test(mode == IO_DIRECT_REFUSED);
  LT_OK(loom__ostore_create(LOOM__OTIER_DISK, dir, 0, &s));
  loom__ostore_refuse_direct_for_test(false);
  unsetenv("LOOM_OFFLOAD_DIRECT");
  if (mode != IO_DIRECT_DEFAULT) LT_TRUE(!loom__ostore_direct(s)); /* the page cache, no readahead */
  if (mode == IO_DIRECT_REFUSED) { /* the check's 4096 bytes are not left in the file */
    struct stat st;
    LT_EQ(stat(loom__ostore_path(s), &st), 0);
    LT_EQ((long long)st.st_size, 0);
  }
  printf("  %s\n", loom__ostore_direct(s) ? "O_DIRECT" : "buffered, POSIX_FADV_RANDOM");
  unsigned char *src = malloc((size_t)N * SZ), *raw = malloc(SZ + 1), *dst = raw + 1;
  io_fill(src, (size_t)N * SZ);
  for (int i = 0; i < N; i++) LT_OK(loom__ostore_put(s, (size_t)i, src + (size_t)i * SZ, SZ));
  /* an odd size, the last page partly the slot's */
  LT_OK(loom__ostore_put(s, N, src, 10000));
  make_cold(loom__ostore_path(s));
  double r0 = thread_read_bytes();
  size_t want = 0;
  for (int i = 0; i < N; i += STRIDE) {
    LT_OK(loom__ostore_get(s, (size_t)i, dst, SZ));
    LT_TRUE(memcmp(dst, src + (size_t)i * SZ, SZ) == 0);
    want += SZ;
  }
  LT_OK(loom__ostore_get(s, N, dst, 10000));
  LT_TRUE(memcmp(dst, src, 10000) == 0);
  want += 12288; /* 10000 bytes: three pages */
  double got = thread_read_bytes() - r0;
  if (r0 < 0 || got == 0) {
    printf("  (no read_bytes counted for '%s': a filesystem without storage; bytes checked "
           "only)\n", dir);
  } else {
    printf("  read %.0f bytes from storage for %zu bytes of slots (%.3f)\n", got, want,
           got / (double)want);
    LT_TRUE(got >= (double)want * 0.99); /* they were cold: really read */
    LT_TRUE(got <= (double)want * 1.05);
  }
  loom__ostore_free(s);
  free(src);
  free(raw);
  rm_dir(dir);
}

LT_TEST(ostore_io_disk_reads_only_the_slot) { reads_only_the_slot(IO_DIRECT_DEFAULT); }

LT_TEST(ostore_io_disk_reads_only_the_slot_buffered) { reads_only_the_slot(IO_DIRECT_OFF); }

LT_TEST(ostore_io_disk_reads_only_the_slot_where_o_direct_is_refused) {
  reads_only_the_slot(IO_DIRECT_REFUSED);
}

/* Many rounds of put-get-put-get on few slots through 8 workers: each get sees exactly the put
 * submitted before it on its slot, whatever runs at once; the workers' statistics add up. */
/* O_DIRECT straight into and out of the caller's buffer: a put from a buffer of loom's
 * allocator (large blocks start on a page) of a ragged size (whole blocks straight, the tail
 * bounced), read back cold into an aligned buffer, an unaligned one and, with every transfer
 * made to bounce, the aligned one again: the same bytes each way, the CRC-32C taken over both
 * paths agreeing (a get checks it against the put's), and the straight bytes counted exactly
 * (the whole blocks of the put and of the aligned get; none for the unaligned get or while
 * bouncing). Where the allocator does not align (address-sanitizer builds) or the store is
 * buffered, only the bytes are checked. */
LT_TEST(ostore_io_direct_moves_aligned_buffers_straight) {
  const size_t sz = (3u << 20) + 1000, whole = sz & ~(size_t)4095;
  char dir[256];
  io_tmp_dir(dir, sizeof dir);
  loom__ostore *s = NULL;
  LT_OK(loom__ostore_create(LOOM__OTIER_DISK, dir, 0, &s));
  unsigned char *src = loom__malloc(LOOM_POOL_HOST, sz), *dst = loom__malloc(LOOM_POOL_HOST, sz);
  unsigned char *raw = malloc(sz + 1), *odd = raw + 1;
  LT_TRUE(src && dst && raw);
  bool straight = loom__ostore_direct(s) && !((uintptr_t)src & 4095) && !((uintptr_t)dst & 4095);
  printf("  %s\n", straight ? "O_DIRECT, aligned buffers: straight"
                            : "buffered or unaligned buffers: bytes checked only");
  io_fill(src, sz);
  uint64_t s0 = loom__ostore_straight_bytes();
  LT_OK(loom__ostore_put(s, 0, src, sz));
  uint64_t s1 = loom__ostore_straight_bytes();
  make_cold(loom__ostore_path(s));
  memset(dst, 0, sz);
  LT_OK(loom__ostore_get(s, 0, dst, sz));
  LT_TRUE(memcmp(dst, src, sz) == 0);
  uint64_t s2 = loom__ostore_straight_bytes();
  LT_OK(loom__ostore_get(s, 0, odd, sz));
  LT_TRUE(memcmp(odd, src, sz) == 0);
  uint64_t s3 = loom__ostore_straight_bytes();
  loom__ostore_bounce_only_for_test(true);
  memset(dst, 0, sz);
  LT_OK(loom__ostore_get(s, 0, dst, sz));
  LT_TRUE(memcmp(dst, src, sz) == 0);
  LT_OK(loom__ostore_put(s, 1, src, sz)); /* bounced put, straight get: one CRC */
  loom__ostore_bounce_only_for_test(false);
  uint64_t s4 = loom__ostore_straight_bytes();
  memset(dst, 0, sz);
  LT_OK(loom__ostore_get(s, 1, dst, sz));
  LT_TRUE(memcmp(dst, src, sz) == 0);
  if (straight) { /* other tests of this process run one at a time: the counter is ours */
    LT_EQ((long long)(s1 - s0), (long long)whole);
    LT_EQ((long long)(s2 - s1), (long long)whole);
    LT_EQ((long long)(s3 - s2), 0);
    LT_EQ((long long)(s4 - s3), 0);
    LT_EQ((long long)(loom__ostore_straight_bytes() - s4), (long long)whole);
  }
  loom__ostore_free(s);
  loom__free(src);
  loom__free(dst);
  free(raw);
  rm_dir(dir);
}

LT_TEST(ostore_io_workers_keep_each_slots_order) {
  enum { SLOTS = 5, ROUNDS = 40, SZ = 65536 + 12 };
  char dir[256];
  io_tmp_dir(dir, sizeof dir);
  for (int tier = 0; tier < 2; tier++) {
    loom__ostore *s = NULL;
    LT_OK(loom__ostore_create(tier ? LOOM__OTIER_DISK : LOOM__OTIER_HOST, dir, 0, &s));
    LT_OK(loom__ostore_set_workers(s, 8));
    static unsigned char src[ROUNDS][SLOTS][SZ], dst[ROUNDS][SLOTS][SZ];
    loom__ojob put[ROUNDS][SLOTS], get[ROUNDS][SLOTS];
    for (int r = 0; r < ROUNDS; r++)
      for (int k = 0; k < SLOTS; k++) {
        io_fill(src[r][k], SZ);
        memset(dst[r][k], 0, SZ);
        LT_OK(loom__ostore_submit_put(s, (size_t)k * 7, src[r][k], SZ, &put[r][k]));
        LT_OK(loom__ostore_submit_get(s, (size_t)k * 7, dst[r][k], SZ, &get[r][k]));
      }
    /* the worker count is fixed once a job was submitted */
    LT_ERR(loom__ostore_set_workers(s, 2), LOOM_EMISUSE, "started");
    for (int r = ROUNDS - 1; r >= 0; r--)
      for (int k = 0; k < SLOTS; k++) {
        LT_OK(loom__ostore_wait(s, get[r][k], NULL));
        LT_OK(loom__ostore_wait(s, put[r][k], NULL));
        LT_TRUE(memcmp(dst[r][k], src[r][k], SZ) == 0);
      }
    loom__ostore_stats st;
    loom__ostore_get_stats(s, &st);
    LT_EQ(st.puts, (uint64_t)ROUNDS * SLOTS);
    LT_EQ(st.gets, (uint64_t)ROUNDS * SLOTS);
    LT_EQ(st.bytes_read, (uint64_t)ROUNDS * SLOTS * SZ);
    LT_EQ(loom__ostore_bytes(s), (size_t)SLOTS * SZ);
    /* a synchronous get after all that: the last round's bytes */
    LT_OK(loom__ostore_get(s, 14, dst[0][0], SZ));
    LT_TRUE(memcmp(dst[0][0], src[ROUNDS - 1][2], SZ) == 0);
    loom__ostore_free(s);
  }
  rm_dir(dir);
}

LT_TEST(ostore_io_worker_count_checked) {
  loom__ostore *s = NULL;
  LT_OK(loom__ostore_create(LOOM__OTIER_HOST, NULL, 0, &s));
  LT_ERR(loom__ostore_set_workers(s, 0), LOOM_EINVAL, "1..16");
  LT_ERR(loom__ostore_set_workers(s, LOOM__OSTORE_MAX_WORKERS + 1), LOOM_EINVAL, "must be 1..");
  LT_ERR(loom__ostore_set_workers(NULL, 2), LOOM_EINVAL, "NULL");
  LT_OK(loom__ostore_set_workers(s, LOOM__OSTORE_MAX_WORKERS));
  loom__ostore_free(s);
}

/* A changed file found by one of several workers: that get's wait says so, naming the slot;
 * the gets of the other slots, on other workers, are unaffected. */
LT_TEST(ostore_io_failure_on_one_worker_of_several) {
  enum { SLOTS = 6, SZ = 200000 };
  char dir[256];
  io_tmp_dir(dir, sizeof dir);
  loom__ostore *s = NULL;
  LT_OK(loom__ostore_create(LOOM__OTIER_DISK, dir, 0, &s));
  LT_OK(loom__ostore_set_workers(s, 4));
  static unsigned char src[SLOTS][SZ], dst[SLOTS][SZ];
  for (int k = 0; k < SLOTS; k++) {
    io_fill(src[k], SZ);
    LT_OK(loom__ostore_put(s, (size_t)k, src[k], SZ));
  }
  /* flip a byte of slot 3 behind the store's back (slots start on 4096: 200704 apart) */
  int fd = open(loom__ostore_path(s), O_RDWR);
  LT_TRUE(fd >= 0);
  unsigned char b = (unsigned char)(src[3][100] ^ 0x40);
  LT_EQ(pwrite(fd, &b, 1, 3 * 200704 + 100), 1);
  close(fd);
  loom__ojob g[SLOTS];
  for (int k = 0; k < SLOTS; k++) LT_OK(loom__ostore_submit_get(s, (size_t)k, dst[k], SZ, &g[k]));
  for (int k = 0; k < SLOTS; k++) {
    if (k == 3) {
      LT_ERR(loom__ostore_wait(s, g[k], NULL), LOOM_EFORMAT, "slot 3");
    } else {
      LT_OK(loom__ostore_wait(s, g[k], NULL));
      LT_TRUE(memcmp(dst[k], src[k], SZ) == 0);
    }
  }
  loom__ostore_free(s);
  rm_dir(dir);
}
