/* alloc.c: the single allocation path of loom, with per-pool byte accounting and failure
 * injection. A 64-byte header before each block records its size and pool, so loom__free
 * needs only the pointer and the counters stay exact. The default allocator keeps large
 * freed blocks for reuse (alloc_cache.c); the counters count blocks in use, not cached ones. */
#include "core/core_int.h"
#include "core/alloc_cache.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define HEADER 64u
#define BLOCK_MAGIC 0x6c6f6f6d626c6b31ull /* "loomblk1" */

typedef struct block_header {
  uint64_t magic;
  size_t size;
  int pool;
} block_header;

typedef struct pool_counters {
  _Atomic size_t current, peak;
  _Atomic uint64_t allocs, frees, failures;
} pool_counters;

static pool_counters pools[LOOM_POOL_COUNT];
static _Atomic uint64_t attempts;
static _Atomic uint64_t fail_at; /* attempt number that fails; 0 = none */

static void *default_alloc(void *ctx, size_t size, size_t align) {
  (void)ctx;
  size_t rounded = (size + align - 1) & ~(align - 1);
  return aligned_alloc(align, rounded ? rounded : align);
}
static void default_free(void *ctx, void *p) {
  (void)ctx;
  free(p);
}
static loom_allocator hook = {default_alloc, default_free, NULL};

const char *loom_pool_name(loom_pool pool) {
  static const char *names[LOOM_POOL_COUNT] = {"compute", "host", "file"};
  return (unsigned)pool < LOOM_POOL_COUNT ? names[pool] : "?";
}

int loom_mem_stats(loom_pool pool, loom_pool_stats *out) {
  if ((unsigned)pool >= LOOM_POOL_COUNT)
    return loom__fail(LOOM_EINVAL, "loom_mem_stats: pool %d out of range", (int)pool);
  if (!out) return loom__fail(LOOM_EINVAL, "loom_mem_stats: out is NULL");
  pool_counters *c = &pools[pool];
  out->current_bytes = atomic_load(&c->current);
  out->peak_bytes = atomic_load(&c->peak);
  out->allocs = atomic_load(&c->allocs);
  out->frees = atomic_load(&c->frees);
  out->failures = atomic_load(&c->failures);
  return LOOM_OK;
}

void loom_mem_reset_peak(loom_pool pool) {
  if ((unsigned)pool >= LOOM_POOL_COUNT) return;
  atomic_store(&pools[pool].peak, atomic_load(&pools[pool].current));
}

int loom_set_allocator(const loom_allocator *a) {
  for (int p = 0; p < LOOM_POOL_COUNT; p++)
    if (atomic_load(&pools[p].current) != 0)
      return loom__fail(LOOM_EBUSY, "loom_set_allocator: pool '%s' still holds %zu bytes",
                        loom_pool_name((loom_pool)p), atomic_load(&pools[p].current));
  if (!a) {
    hook = (loom_allocator){default_alloc, default_free, NULL};
    return LOOM_OK;
  }
  if (!a->alloc || !a->free)
    return loom__fail(LOOM_EINVAL, "loom_set_allocator: alloc and free must both be set");
  loom_mem_release_cache(); /* only the default allocator uses it */
  hook = *a;
  return LOOM_OK;
}

void loom_alloc_fail_nth(uint64_t n) {
  atomic_store(&fail_at, n ? atomic_load(&attempts) + n : 0);
}

uint64_t loom_alloc_attempts(void) { return atomic_load(&attempts); }

void loom__mem_account(loom_pool pool, ptrdiff_t delta) {
  pool_counters *c = &pools[pool];
  if (delta >= 0) {
    size_t now = atomic_fetch_add(&c->current, (size_t)delta) + (size_t)delta;
    size_t peak = atomic_load(&c->peak);
    while (now > peak && !atomic_compare_exchange_weak(&c->peak, &peak, now)) {
    }
    atomic_fetch_add(&c->allocs, 1);
  } else {
    atomic_fetch_sub(&c->current, (size_t)(-delta));
    atomic_fetch_add(&c->frees, 1);
  }
}

bool loom__alloc_should_fail(loom_pool pool) {
  uint64_t n = atomic_fetch_add(&attempts, 1) + 1;
  uint64_t f = atomic_load(&fail_at);
  if (f && n == f) {
    atomic_store(&fail_at, 0);
    atomic_fetch_add(&pools[pool].failures, 1);
    return true;
  }
  return false;
}

void *loom__malloc(loom_pool pool, size_t size) {
  if ((unsigned)pool >= LOOM_POOL_COUNT) pool = LOOM_POOL_COMPUTE;
  if (loom__alloc_should_fail(pool)) return NULL;
  if (size > SIZE_MAX - 2 * HEADER) {
    atomic_fetch_add(&pools[pool].failures, 1);
    return NULL;
  }
  unsigned char *raw;
  if (hook.alloc == default_alloc) {
    size_t bytes = loom__cache_round(size + HEADER);
    raw = loom__cache_take(bytes);
    if (!raw) raw = default_alloc(NULL, bytes, HEADER);
    if (!raw && loom_mem_cached_bytes()) { /* out of memory: give the cache back, try again */
      loom_mem_release_cache();
      raw = default_alloc(NULL, bytes, HEADER);
    }
  } else {
    raw = hook.alloc(hook.ctx, size + HEADER, HEADER);
  }
  if (!raw) {
    atomic_fetch_add(&pools[pool].failures, 1);
    return NULL;
  }
  block_header *h = (block_header *)raw;
  h->magic = BLOCK_MAGIC;
  h->size = size;
  h->pool = pool;
  loom__mem_account(pool, (ptrdiff_t)size);
  return raw + HEADER;
}

void *loom__calloc(loom_pool pool, size_t count, size_t elem) {
  if (elem && count > SIZE_MAX / elem) return NULL;
  void *p = loom__malloc(pool, count * elem);
  if (p) memset(p, 0, count * elem);
  return p;
}

void loom__free(void *p) {
  if (!p) return;
  unsigned char *raw = (unsigned char *)p - HEADER;
  block_header *h = (block_header *)raw;
  if (h->magic != BLOCK_MAGIC) return; /* not ours, or freed twice: leave it alone */
  h->magic = 0;
  loom__mem_account((loom_pool)h->pool, -(ptrdiff_t)h->size);
  if (hook.free == default_free && loom__cache_put(raw, loom__cache_round(h->size + HEADER)))
    return;
  hook.free(hook.ctx, raw);
}

char *loom__strdup(loom_pool pool, const char *s) {
  size_t n = strlen(s) + 1;
  char *d = loom__malloc(pool, n);
  if (d) memcpy(d, s, n);
  return d;
}
