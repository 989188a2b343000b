/* test_alloc.c: pool accounting, the allocator hook, failure injection (every tensor
 * create path swept through out-of-memory at each of its allocations, with no leak) and the
 * default allocator's large-block cache (reuse, limit, bypass, threads). */
#include "lt.h"
#include "core/core_int.h"

#include <pthread.h>
#include <stdlib.h>

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

LT_TEST(cache_reuses_a_freed_large_block_and_counts_it_apart) {
  size_t old_limit = loom_mem_cache_limit();
  loom_mem_set_cache_limit((size_t)64 << 20);
  loom_mem_release_cache();
  size_t base = current(LOOM_POOL_COMPUTE);
  unsigned char *a = loom__malloc(LOOM_POOL_COMPUTE, BIG);
  LT_TRUE(a != NULL && ((uintptr_t)a & 63) == 0);
  a[0] = a[BIG - 1] = 7;
  loom__free(a);
  LT_EQ(current(LOOM_POOL_COMPUTE), base); /* cached bytes are not in use */
  LT_TRUE(loom_mem_cached_bytes() >= BIG);
  /* a size in the same 4 KiB class takes the same block; the cache is empty again */
  unsigned char *b = loom__malloc(LOOM_POOL_COMPUTE, BIG + 100);
  LT_TRUE(b == a);
  LT_EQ(loom_mem_cached_bytes(), 0);
  LT_EQ(current(LOOM_POOL_COMPUTE), base + BIG + 100);
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
