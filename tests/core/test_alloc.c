/* test_alloc.c: pool accounting, the allocator hook, failure injection (every tensor
 * create path swept through out-of-memory at each of its allocations, with no leak), the
 * default allocator's large-block cache (reuse, limit, bypass, threads) and the per-account
 * counters (allocations, frees from another thread, peaks, bad arguments). */
#include "lt.h"
#include "core/core_int.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t current(loom_pool p) {
  loom_pool_stats s;
  loom_mem_stats(p, &s);
  return s.current_bytes;
}

LT_TEST(pool_accounting_current_and_peak) {
  size_t base = current(LOOM_POOL_HOST);
  loom_mem_reset_peak(LOOM_POOL_HOST);
  void *a = loom__malloc(LOOM_POOL_HOST, 1000);
  void *b = loom__malloc(LOOM_POOL_HOST, 3000);
  LT_TRUE(a && b);
  LT_TRUE(((uintptr_t)a & 63) == 0);
  LT_EQ(current(LOOM_POOL_HOST), base + 4000);
  loom__free(a);
  LT_EQ(current(LOOM_POOL_HOST), base + 3000);
  loom_pool_stats s;
  LT_OK(loom_mem_stats(LOOM_POOL_HOST, &s));
  LT_EQ(s.peak_bytes, base + 4000);
  loom__free(b);
  loom__free(NULL);
  LT_EQ(current(LOOM_POOL_HOST), base);
  LT_ERR(loom_mem_stats((loom_pool)9, &s), LOOM_EINVAL, "pool 9 out of range");
  LT_STREQ(loom_pool_name(LOOM_POOL_FILE), "file");
  LT_STREQ(loom_pool_name(LOOM_POOL_META), "meta");
  LT_STREQ(loom_pool_name(LOOM_POOL_COUNT), "?");
}

static int hook_allocs, hook_frees;
static void *counting_alloc(void *ctx, size_t size, size_t align) {
  (void)ctx;
  hook_allocs++;
  return aligned_alloc(align, (size + align - 1) / align * align);
}
static void counting_free(void *ctx, void *p) {
  (void)ctx;
  hook_frees++;
  free(p);
}

LT_TEST(allocator_hook_sees_every_allocation) {
  loom_allocator a = {counting_alloc, counting_free, NULL};
  LT_OK(loom_set_allocator(&a));
  hook_allocs = hook_frees = 0;
  loom_tensor *t = NULL;
  int64_t shape[] = {4, 5};
  LT_OK(loom_tensor_zeros(LOOM_F32, 2, shape, &t));
  LT_TRUE(hook_allocs >= 2);
  /* the allocator cannot change while bytes are outstanding */
  LT_ERR(loom_set_allocator(NULL), LOOM_EBUSY, "still holds");
  loom_tensor_free(t);
  LT_EQ(hook_allocs, hook_frees);
  LT_OK(loom_set_allocator(NULL));
  loom_allocator half = {counting_alloc, NULL, NULL};
  LT_ERR(loom_set_allocator(&half), LOOM_EINVAL, "must both be set");
}

LT_TEST(failure_injection_fails_the_nth_allocation_once) {
  loom_alloc_fail_nth(2);
  void *a = loom__malloc(LOOM_POOL_COMPUTE, 8);
  void *b = loom__malloc(LOOM_POOL_COMPUTE, 8);
  void *c = loom__malloc(LOOM_POOL_COMPUTE, 8);
  LT_TRUE(a != NULL);
  LT_TRUE(b == NULL);
  LT_TRUE(c != NULL);
  loom__free(a);
  loom__free(c);
}

/* Runs `create` with allocation n failing, for n = 1, 2, ... until it succeeds; each failure
 * must be LOOM_ENOMEM and leave every pool as it was. Returns the number of failing runs. */
typedef int (*create_fn)(loom_tensor **out);
static int oom_sweep(create_fn create) {
  int n = 1;
  for (; n < 100; n++) {
    size_t before = current(LOOM_POOL_COMPUTE);
    loom_tensor *t = NULL;
    loom_alloc_fail_nth((uint64_t)n);
    int rc = create(&t);
    loom_alloc_fail_nth(0);
    if (rc == LOOM_OK) {
      loom_tensor_free(t);
      LT_EQ(current(LOOM_POOL_COMPUTE), before);
      return n - 1;
    }
    LT_EQ(rc, LOOM_ENOMEM);
    LT_TRUE(strstr(loom_last_error(), "out of memory") != NULL);
    LT_TRUE(t == NULL);
    LT_EQ(current(LOOM_POOL_COMPUTE), before);
  }
  LT_TRUE(!"create never succeeded");
  return n;
}

static const int64_t shape3[] = {2, 3, 4};
static float data24[24];
static int mk_empty(loom_tensor **o) { return loom_tensor_empty(LOOM_F32, 3, shape3, o); }
static int mk_zeros(loom_tensor **o) { return loom_tensor_zeros(LOOM_BF16, 3, shape3, o); }
static int mk_wrap(loom_tensor **o) { return loom_tensor_wrap(LOOM_F32, 3, shape3, data24, o); }
static int mk_copy(loom_tensor **o) { return loom_tensor_from_data(LOOM_F32, 3, shape3, data24, o); }
static int mk_views(loom_tensor **o) {
  loom_tensor *t = NULL, *tr = NULL, *r = NULL;
  int rc = loom_tensor_from_data(LOOM_F32, 3, shape3, data24, &t);
  if (!rc) rc = loom_tensor_transpose(t, 0, 2, &tr);
  int64_t flat[] = {-1};
  if (!rc) rc = loom_tensor_reshape(tr, 1, flat, &r); /* needs a copy: more allocations */
  loom_tensor_free(t);
  loom_tensor_free(tr);
  *o = r;
  return rc;
}
static int mk_cast(loom_tensor **o) {
  loom_tensor *t = NULL;
  int rc = loom_tensor_from_data(LOOM_F32, 3, shape3, data24, &t);
  if (!rc) rc = loom_tensor_cast(t, LOOM_F16, o);
  loom_tensor_free(t);
  return rc;
}

LT_TEST(every_create_path_survives_out_of_memory) {
  LT_TRUE(oom_sweep(mk_empty) >= 2);
  LT_TRUE(oom_sweep(mk_zeros) >= 2);
  LT_TRUE(oom_sweep(mk_wrap) >= 1);
  LT_TRUE(oom_sweep(mk_copy) >= 2);
  LT_TRUE(oom_sweep(mk_views) >= 5);
  LT_TRUE(oom_sweep(mk_cast) >= 4);
}

/* ---- the default allocator's cache of large blocks ---- */

#define BIG ((size_t)1 << 20)

/* A mapped block's data starts on a page (the offload disk tier's O_DIRECT moves it as is),
 * fresh or taken from the cache, and its size class is that of its data (with the header page
 * counted once); address-sanitizer builds map nothing and keep 64-byte alignment. */
LT_TEST(large_blocks_start_on_a_page) {
  size_t old_limit = loom_mem_cache_limit();
  loom_mem_set_cache_limit((size_t)64 << 20);
  loom_mem_release_cache();
  static const size_t sizes[] = {BIG, BIG + 1, 3 * BIG + 4096, 5 * BIG + 77};
  for (int round = 0; round < 2; round++) /* fresh, then from the cache */
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
      unsigned char *p = loom__malloc(LOOM_POOL_COMPUTE, sizes[i]);
      LT_TRUE(p != NULL);
#ifdef LOOM_SANITIZED
      LT_EQ((long long)((uintptr_t)p & 63), 0);
#else
      LT_EQ((long long)((uintptr_t)p & 4095), 0);
#endif
      p[0] = p[sizes[i] - 1] = 1; /* all of it is ours */
      loom__free(p);
    }
  loom_mem_release_cache();
  loom_mem_set_cache_limit(old_limit);
}

LT_TEST(cache_reuses_a_freed_large_block_and_counts_it_apart) {
  size_t old_limit = loom_mem_cache_limit();
  loom_mem_set_cache_limit((size_t)64 << 20);
  loom_mem_release_cache();
  size_t base = current(LOOM_POOL_COMPUTE);
  unsigned char *a = loom__malloc(LOOM_POOL_COMPUTE, BIG + 100);
  LT_TRUE(a != NULL && ((uintptr_t)a & 63) == 0);
  a[0] = a[BIG - 1] = 7;
  loom__free(a);
  LT_EQ(current(LOOM_POOL_COMPUTE), base); /* cached bytes are not in use */
  LT_TRUE(loom_mem_cached_bytes() >= BIG);
  /* a size in the same 4 KiB class takes the same block; the cache is empty again */
  unsigned char *b = loom__malloc(LOOM_POOL_COMPUTE, BIG + 200);
  LT_TRUE(b == a);
  LT_EQ(loom_mem_cached_bytes(), 0);
  LT_EQ(current(LOOM_POOL_COMPUTE), base + BIG + 200);
  /* a different size does not */
  unsigned char *c = loom__malloc(LOOM_POOL_COMPUTE, 2 * BIG);
  LT_TRUE(c != NULL && c != a);
  loom__free(b);
  loom__free(c);
  LT_TRUE(loom_mem_cached_bytes() >= 3 * BIG);
  /* small blocks are never cached */
  size_t cached = loom_mem_cached_bytes();
  loom__free(loom__malloc(LOOM_POOL_HOST, 1000));
  LT_EQ(loom_mem_cached_bytes(), cached);
  loom_mem_release_cache();
  LT_EQ(loom_mem_cached_bytes(), 0);
  loom_mem_set_cache_limit(old_limit);
}

LT_TEST(cache_respects_its_limit) {
  size_t old_limit = loom_mem_cache_limit();
  loom_mem_release_cache();
  loom_mem_set_cache_limit(BIG + BIG / 2); /* room for one 1 MiB block, not two */
  void *a = loom__malloc(LOOM_POOL_COMPUTE, BIG), *b = loom__malloc(LOOM_POOL_COMPUTE, BIG);
  LT_TRUE(a && b);
  loom__free(a);
  loom__free(b);
  LT_TRUE(loom_mem_cached_bytes() > BIG && loom_mem_cached_bytes() <= BIG + BIG / 2);
  loom_mem_set_cache_limit(BIG / 2); /* lowering the limit frees what no longer fits */
  LT_EQ(loom_mem_cached_bytes(), 0);
  loom_mem_set_cache_limit(0); /* off */
  loom__free(loom__malloc(LOOM_POOL_COMPUTE, BIG));
  LT_EQ(loom_mem_cached_bytes(), 0);
  LT_EQ(loom_mem_cache_limit(), 0);
  loom_mem_set_cache_limit(old_limit);
}

/* The automatic limit keeps a working set larger than 256 MiB (the blocks are mapped, never
 * touched: no memory is used), and before mapping a new block drops cached ones so that in use
 * plus cached stays within the high-water mark plus 256 MiB. */
LT_TEST(cache_automatic_limit_follows_the_working_set) {
  size_t old_limit = loom_mem_cache_limit(); /* 0 in a sanitizer build: turned on here */
  loom_mem_set_cache_limit(LOOM_MEM_CACHE_AUTO);
  LT_EQ(loom_mem_cache_limit(), LOOM_MEM_CACHE_AUTO);
  loom_mem_release_cache();
  enum { N = 6 };
  const size_t piece = (size_t)64 << 20; /* 6 x 64 MiB = 384 MiB, over the old fixed limit */
  void *p[N], *q[N];
  for (int i = 0; i < N; i++) LT_TRUE((p[i] = loom__malloc(LOOM_POOL_COMPUTE, piece)) != NULL);
  for (int i = 0; i < N; i++) loom__free(p[i]);
  LT_TRUE(loom_mem_cached_bytes() >= N * piece); /* all of the step's blocks kept */
  for (int i = 0; i < N; i++) LT_TRUE((q[i] = loom__malloc(LOOM_POOL_COMPUTE, piece)) != NULL);
  LT_EQ(loom_mem_cached_bytes(), 0); /* every one a hit */
  for (int i = 0; i < N; i++) {
    bool found = false;
    for (int j = 0; j < N; j++) found = found || q[i] == p[j];
    LT_TRUE(found);
  }
  for (int i = 0; i < N; i++) loom__free(q[i]);
  /* a new block of another size, 1 GiB, above the high-water mark of this test binary: the
   * cache drops blocks until at most 256 MiB stay (in use + cached <= that mark + 256 MiB) */
  void *big = loom__malloc(LOOM_POOL_COMPUTE, (size_t)1 << 30);
  LT_TRUE(big != NULL);
  LT_TRUE(loom_mem_cached_bytes() <= ((size_t)256 << 20));
  LT_TRUE(loom_mem_cached_bytes() >= 3 * piece); /* not more than needed: 4 x 64 fit */
  loom__free(big);
  /* a fixed limit again caps the cached bytes themselves */
  loom_mem_set_cache_limit(piece);
  LT_TRUE(loom_mem_cached_bytes() <= piece);
  loom_mem_release_cache();
  loom_mem_set_cache_limit(old_limit);
}

LT_TEST(cache_does_not_hide_injected_failures_or_custom_allocators) {
  size_t old_limit = loom_mem_cache_limit();
  loom_mem_set_cache_limit((size_t)64 << 20);
  loom__free(loom__malloc(LOOM_POOL_COMPUTE, BIG)); /* a cached block of this size exists */
  LT_TRUE(loom_mem_cached_bytes() >= BIG);
  loom_alloc_fail_nth(1);
  LT_TRUE(loom__malloc(LOOM_POOL_COMPUTE, BIG) == NULL);
  /* a custom allocator sees every large allocation and free; installing it drops the cache */
  loom_allocator a = {counting_alloc, counting_free, NULL};
  LT_OK(loom_set_allocator(&a));
  LT_EQ(loom_mem_cached_bytes(), 0);
  hook_allocs = hook_frees = 0;
  for (int i = 0; i < 3; i++) loom__free(loom__malloc(LOOM_POOL_COMPUTE, BIG));
  LT_EQ(hook_allocs, 3);
  LT_EQ(hook_frees, 3);
  LT_EQ(loom_mem_cached_bytes(), 0);
  LT_OK(loom_set_allocator(NULL));
  loom_mem_set_cache_limit(old_limit);
}

static void *churn(void *arg) {
  size_t salt = (size_t)(uintptr_t)arg;
  for (int i = 0; i < 200; i++) {
    size_t n = BIG / 4 + ((size_t)(i + salt) % 3) * 8192;
    unsigned char *p = loom__malloc(LOOM_POOL_COMPUTE, n);
    if (!p) return (void *)1;
    for (size_t k = 0; k < n; k += 4096) p[k] = (unsigned char)salt; /* owned: nobody else writes */
    for (size_t k = 0; k < n; k += 4096)
      if (p[k] != (unsigned char)salt) return (void *)1;
    loom__free(p);
  }
  return NULL;
}

LT_TEST(cache_is_shared_safely_by_threads) {
  size_t old_limit = loom_mem_cache_limit();
  loom_mem_set_cache_limit((size_t)8 << 20);
  size_t base = current(LOOM_POOL_COMPUTE);
  pthread_t th[4];
  for (int i = 0; i < 4; i++) LT_EQ(pthread_create(&th[i], NULL, churn, (void *)(uintptr_t)(i + 1)), 0);
  for (int i = 0; i < 4; i++) {
    void *r = NULL;
    pthread_join(th[i], &r);
    LT_TRUE(r == NULL);
  }
  LT_EQ(current(LOOM_POOL_COMPUTE), base);
  LT_TRUE(loom_mem_cached_bytes() <= ((size_t)8 << 20));
  loom_mem_release_cache();
  loom_mem_set_cache_limit(old_limit);
}

/* ---- accounts: the same counters per account (per rank of the threads backend) ---- */

static loom_pool_stats acct(int account, loom_pool p) {
  loom_pool_stats s;
  memset(&s, 0, sizeof s);
  loom_mem_account_stats(account, p, &s);
  return s;
}

LT_TEST(account_stats_follow_allocations_and_frees) {
  int old = loom_mem_account();
  LT_EQ(old, 0); /* the default */
  loom_pool_stats a0 = acct(0, LOOM_POOL_HOST), a5 = acct(5, LOOM_POOL_HOST);
  size_t all = current(LOOM_POOL_HOST);
  LT_OK(loom_mem_set_account(5));
  LT_EQ(loom_mem_account(), 5);
  void *a = loom__malloc(LOOM_POOL_HOST, 1000);
  void *b = loom__malloc(LOOM_POOL_HOST, 3000);
  LT_TRUE(a && b);
  loom_pool_stats s = acct(5, LOOM_POOL_HOST);
  LT_EQ(s.current_bytes, a5.current_bytes + 4000);
  LT_EQ(s.allocs, a5.allocs + 2);
  LT_EQ(s.frees, a5.frees);
  LT_EQ(current(LOOM_POOL_HOST), all + 4000); /* the process-wide figure counts them too */
  LT_EQ(acct(0, LOOM_POOL_HOST).current_bytes, a0.current_bytes); /* no other account does */
  LT_EQ(acct(5, LOOM_POOL_COMPUTE).current_bytes, 0);
  loom__free(a);
  s = acct(5, LOOM_POOL_HOST);
  LT_EQ(s.current_bytes, a5.current_bytes + 3000);
  LT_EQ(s.frees, a5.frees + 1);
  /* the account of a free is the block's, not the freeing thread's current one */
  LT_OK(loom_mem_set_account(0));
  loom__free(b);
  LT_EQ(acct(5, LOOM_POOL_HOST).current_bytes, a5.current_bytes);
  LT_EQ(acct(5, LOOM_POOL_HOST).frees, a5.frees + 2);
  LT_EQ(acct(0, LOOM_POOL_HOST).current_bytes, a0.current_bytes);
  LT_EQ(acct(0, LOOM_POOL_HOST).frees, a0.frees);
  LT_EQ(current(LOOM_POOL_HOST), all);
  /* bytes from outside loom__malloc (a mapped file) count on the calling thread's account */
  LT_OK(loom_mem_set_account(7));
  size_t f7 = acct(7, LOOM_POOL_FILE).current_bytes;
  loom__mem_account(LOOM_POOL_FILE, 8192);
  LT_EQ(acct(7, LOOM_POOL_FILE).current_bytes, f7 + 8192);
  LT_OK(loom_mem_set_account(0));
  loom__mem_account_to(LOOM_POOL_FILE, 7, -8192); /* given back from another account */
  LT_EQ(acct(7, LOOM_POOL_FILE).current_bytes, f7);
  /* failures (injected here) count on the account of the failing allocation */
  LT_OK(loom_mem_set_account(6));
  uint64_t fails = acct(6, LOOM_POOL_COMPUTE).failures;
  loom_alloc_fail_nth(1);
  LT_TRUE(loom__malloc(LOOM_POOL_COMPUTE, 64) == NULL);
  LT_EQ(acct(6, LOOM_POOL_COMPUTE).failures, fails + 1);
  LT_OK(loom_mem_set_account(old));
}

typedef struct freer {
  void *block;
  int account; /* the freeing thread's account, as it saw it */
} freer;

static void *free_on_new_thread(void *arg) {
  freer *f = arg;
  f->account = loom_mem_account();
  loom__free(f->block);
  return NULL;
}

LT_TEST(account_is_credited_back_when_another_thread_frees) {
  int old = loom_mem_account();
  size_t base3 = acct(3, LOOM_POOL_COMPUTE).current_bytes;
  size_t base0 = acct(0, LOOM_POOL_COMPUTE).current_bytes;
  uint64_t frees0 = acct(0, LOOM_POOL_COMPUTE).frees;
  LT_OK(loom_mem_set_account(3));
  freer f = {loom__malloc(LOOM_POOL_COMPUTE, BIG), -1};
  LT_TRUE(f.block != NULL);
  LT_OK(loom_mem_set_account(old));
  LT_EQ(acct(3, LOOM_POOL_COMPUTE).current_bytes, base3 + BIG);
  pthread_t th;
  LT_EQ(pthread_create(&th, NULL, free_on_new_thread, &f), 0);
  pthread_join(th, NULL);
  LT_EQ(f.account, 0); /* a new thread starts on account 0: it does not inherit its creator's */
  LT_EQ(acct(3, LOOM_POOL_COMPUTE).current_bytes, base3);
  LT_EQ(acct(0, LOOM_POOL_COMPUTE).current_bytes, base0);
  LT_EQ(acct(0, LOOM_POOL_COMPUTE).frees, frees0);
}

LT_TEST(account_peaks_are_per_account) {
  int old = loom_mem_account();
  loom_mem_reset_peak(LOOM_POOL_HOST);
  loom_mem_account_reset_peak(8, LOOM_POOL_HOST);
  loom_mem_account_reset_peak(9, LOOM_POOL_HOST);
  size_t b8 = acct(8, LOOM_POOL_HOST).current_bytes, b9 = acct(9, LOOM_POOL_HOST).current_bytes;
  LT_EQ(acct(8, LOOM_POOL_HOST).peak_bytes, b8);
  LT_OK(loom_mem_set_account(8));
  void *a = loom__malloc(LOOM_POOL_HOST, 1000), *b = loom__malloc(LOOM_POOL_HOST, 3000);
  LT_TRUE(a && b);
  loom__free(a);
  LT_OK(loom_mem_set_account(9));
  void *c = loom__malloc(LOOM_POOL_HOST, 10000);
  LT_TRUE(c != NULL);
  LT_OK(loom_mem_set_account(old));
  LT_EQ(acct(8, LOOM_POOL_HOST).peak_bytes, b8 + 4000); /* account 9's bytes are not in it */
  LT_EQ(acct(8, LOOM_POOL_HOST).current_bytes, b8 + 3000);
  LT_EQ(acct(9, LOOM_POOL_HOST).peak_bytes, b9 + 10000);
  /* resetting one account's peak leaves the other accounts' and the process-wide one */
  loom_pool_stats s;
  LT_OK(loom_mem_stats(LOOM_POOL_HOST, &s));
  size_t process_peak = s.peak_bytes;
  loom_mem_account_reset_peak(8, LOOM_POOL_HOST);
  LT_EQ(acct(8, LOOM_POOL_HOST).peak_bytes, b8 + 3000);
  LT_EQ(acct(9, LOOM_POOL_HOST).peak_bytes, b9 + 10000);
  LT_OK(loom_mem_stats(LOOM_POOL_HOST, &s));
  LT_EQ(s.peak_bytes, process_peak);
  loom__free(b);
  loom__free(c);
  LT_EQ(acct(8, LOOM_POOL_HOST).peak_bytes, b8 + 3000);
  LT_EQ(acct(9, LOOM_POOL_HOST).current_bytes, b9);
}

LT_TEST(account_bad_arguments_are_refused) {
  int old = loom_mem_account();
  loom_pool_stats s;
  LT_ERR(loom_mem_set_account(-1), LOOM_EINVAL, "account -1 out of range 0..64");
  LT_ERR(loom_mem_set_account(LOOM_MEM_ACCOUNTS), LOOM_EINVAL, "account 65 out of range");
  LT_EQ(loom_mem_account(), old); /* unchanged */
  LT_OK(loom_mem_set_account(LOOM_MEM_ACCOUNTS - 1));
  LT_EQ(loom_mem_account(), LOOM_MEM_ACCOUNTS - 1);
  LT_OK(loom_mem_set_account(old));
  LT_ERR(loom_mem_account_stats(-1, LOOM_POOL_HOST, &s), LOOM_EINVAL, "account -1 out of range");
  LT_ERR(loom_mem_account_stats(LOOM_MEM_ACCOUNTS, LOOM_POOL_HOST, &s), LOOM_EINVAL,
         "account 65 out of range");
  LT_ERR(loom_mem_account_stats(0, (loom_pool)9, &s), LOOM_EINVAL, "pool 9 out of range");
  LT_ERR(loom_mem_account_stats(0, LOOM_POOL_COUNT, &s), LOOM_EINVAL, "pool 4 out of range");
  LT_ERR(loom_mem_account_stats(0, LOOM_POOL_HOST, NULL), LOOM_EINVAL, "output is NULL");
  LT_OK(loom_mem_account_stats(LOOM_MEM_ACCOUNTS - 1, LOOM_POOL_FILE, &s));
  /* out of range: a no-op, not a crash */
  loom_mem_account_reset_peak(-1, LOOM_POOL_HOST);
  loom_mem_account_reset_peak(LOOM_MEM_ACCOUNTS, LOOM_POOL_HOST);
  loom_mem_account_reset_peak(0, (loom_pool)9);
}

/* VmRSS of this process, bytes (0 if unknown). */
static size_t rss_now(void) {
  FILE *p = fopen("/proc/self/status", "r");
  char line[256];
  size_t kb = 0;
  while (p && fgets(line, sizeof line, p))
    if (!strncmp(line, "VmRSS:", 6)) kb = (size_t)strtoull(line + 6, NULL, 10);
  if (p) fclose(p);
  return kb * 1024;
}

LT_TEST(calloc_is_zero_fresh_and_reused_and_leaves_fresh_pages_untouched) {
  size_t limit = loom_mem_cache_limit();
  const size_t n = (size_t)64 << 20;
  for (int pass = 0; pass < 2; pass++) { /* with the cache, and without */
    loom_mem_set_cache_limit(pass == 0 ? (size_t)256 << 20 : 0);
    unsigned char *a = loom__calloc(LOOM_POOL_COMPUTE, n, 1);
    LT_TRUE(a != NULL);
    for (size_t i = 0; i < n; i += 4093) LT_EQ(a[i], 0);
    memset(a, 0xab, n);
    loom__free(a);
    unsigned char *b = loom__calloc(LOOM_POOL_COMPUTE, n, 1); /* the cached block, or a new one */
    LT_TRUE(b != NULL);
    bool zero = true;
    for (size_t i = 0; i < n; i++) zero = zero && b[i] == 0;
    LT_TRUE(zero);
    loom__free(b);
  }
#ifndef LOOM_SANITIZED
  /* a fresh large zeroed block is not written: its pages do not become resident */
  loom_mem_set_cache_limit(0);
  size_t r0 = rss_now();
  unsigned char *c = loom__calloc(LOOM_POOL_HOST, n, 1);
  LT_TRUE(c != NULL);
  size_t r1 = rss_now();
  if (r0 && !(r1 < r0 + n / 4))
    lt_fail_at(__FILE__, __LINE__, "RSS grew by %zu bytes for an untouched %zu-byte calloc", r1 - r0, n);
  loom__free(c);
#endif
  loom_mem_set_cache_limit(limit);
}

/* Resident pages of this process, bytes (/proc/self/statm's second field). */
static size_t resident_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long long size = 0, res = 0;
  if (f) {
    if (fscanf(f, "%llu %llu", &size, &res) != 2) res = 0;
    fclose(f);
  }
  return (size_t)res * 4096;
}

LT_TEST(dry_blocks_are_zero_counted_and_never_resident) {
  size_t base = current(LOOM_POOL_COMPUTE);
  loom_mem_set_dry_run(true);
  LT_TRUE(loom_mem_dry_run());
  unsigned char *small = loom__malloc(LOOM_POOL_COMPUTE, 100);
  unsigned char *large = loom__malloc(LOOM_POOL_COMPUTE, 3 << 20);
  LT_TRUE(small && large);
  size_t zero = 0;
  for (size_t i = 0; i < 100; i++) zero += small[i] == 0;
  for (size_t i = 0; i < (3u << 20); i += 4096) zero += large[i] == 0;
  LT_EQ(zero, 100 + 768);
  LT_EQ(current(LOOM_POOL_COMPUTE), base + 100 + (3u << 20));
  /* 16 GiB of blocks: counted, reserving no memory and never resident */
  size_t rss0 = resident_bytes();
  void *big[16];
  for (int i = 0; i < 16; i++) LT_TRUE((big[i] = loom__malloc(LOOM_POOL_COMPUTE, (size_t)1 << 30)));
  LT_EQ(current(LOOM_POOL_COMPUTE), base + 100 + (3u << 20) + ((size_t)16 << 30));
  LT_TRUE(resident_bytes() < rss0 + ((size_t)64 << 20));
  for (int i = 0; i < 16; i++) loom__free(big[i]);
  loom_mem_set_dry_run(false);
  LT_TRUE(!loom_mem_dry_run());
  /* a dry block freed after the dry run ends goes back the way it came */
  loom__free(small);
  loom__free(large);
  LT_EQ(current(LOOM_POOL_COMPUTE), base);
  LT_EQ(loom_mem_cached_bytes(), 0); /* never cached */
}

LT_TEST(tags_say_what_was_live_at_the_peak) {
  int a = loom_mem_account();
  LT_EQ(loom_mem_tag(), 0);
  loom_mem_account_reset_peak(a, LOOM_POOL_HOST);
  size_t at[LOOM_MEM_TAGS], before[LOOM_MEM_TAGS];
  LT_OK(loom_mem_account_tags(a, LOOM_POOL_HOST, before));
  LT_OK(loom_mem_set_tag(1));
  void *x = loom__malloc(LOOM_POOL_HOST, 1000);
  LT_OK(loom_mem_set_tag(2));
  void *y = loom__malloc(LOOM_POOL_HOST, 3000);
  loom__free(x); /* freed by tag 2's code: still tag 1's bytes that go */
  LT_OK(loom_mem_set_tag(3));
  void *z = loom__malloc(LOOM_POOL_HOST, 500); /* 3500 live: below the peak of 4000 */
  LT_OK(loom_mem_account_tags(a, LOOM_POOL_HOST, at));
  LT_EQ(at[1] - before[1], 1000);
  LT_EQ(at[2] - before[2], 3000);
  LT_EQ(at[3] - before[3], 0);
  void *w = loom__malloc(LOOM_POOL_HOST, 2000); /* 5500: a new peak, with tag 1's gone */
  LT_OK(loom_mem_account_tags(a, LOOM_POOL_HOST, at));
  LT_EQ(at[1] - before[1], 0);
  LT_EQ(at[3] - before[3], 2500);
  loom__free(y);
  loom__free(z);
  loom__free(w);
  LT_OK(loom_mem_set_tag(0));
  LT_ERR(loom_mem_set_tag(LOOM_MEM_TAGS), LOOM_EINVAL, "tag 8 out of range");
  LT_ERR(loom_mem_set_tag(-1), LOOM_EINVAL, "out of range");
  LT_EQ(loom_mem_tag(), 0);
  LT_ERR(loom_mem_account_tags(LOOM_MEM_ACCOUNTS, LOOM_POOL_HOST, at), LOOM_EINVAL, "account");
  LT_ERR(loom_mem_account_tags(0, LOOM_POOL_COUNT, at), LOOM_EINVAL, "pool");
  LT_ERR(loom_mem_account_tags(0, LOOM_POOL_HOST, NULL), LOOM_EINVAL, "NULL");
}
