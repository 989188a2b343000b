/* alloc_cache.c: the default allocator's cache of large blocks. A training step frees and
 * allocates the same large buffers (activations, temporaries) every iteration; handing them
 * back to the C library returns their pages to the kernel, and the next step takes page
 * faults and clears every page again (3% of an f32 MLP step here). So blocks of at least
 * LOOM__CACHE_MIN_BYTES that the default allocator frees are kept, up to a byte limit, and
 * the next allocation of the same rounded size takes one. The cache holds whole blocks and is
 * exact-size: a hit is a block that was allocated for this size. One mutex guards it (large
 * allocations only, each followed by at least 256 KiB of work).
 * The limit: by default automatic (LOOM_MEM_CACHE_AUTO): the cache keeps blocks as long as the
 * bytes of large blocks in use plus cached stay within the most ever in use at once (`high`)
 * plus 256 MiB (plus what is reserved); a miss first drops cached blocks to stay within it. So a
 * training step whose working set is larger than 256 MiB gets all of it back the next step,
 * and the process never holds more than it could with the fixed 256 MiB limit (in use + 256).
 * LOOM_ALLOC_CACHE_MB from the environment, or loom_mem_set_cache_limit, sets a fixed limit
 * on the cached bytes instead; address sanitizer builds start with the cache off, so a use
 * after free is still caught. In a dry run the cache is simulated by size (what a real
 * run's cache would keep), for loom_mem_dry_footprint_peak. */
#include "core/alloc_cache.h"

#include <pthread.h>
#include <sys/mman.h>
#include <stdint.h>
#include <stdlib.h>

#define SLOTS 1024 /* a GPT step frees a few hundred large blocks */

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LOOM__ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(LOOM__ASAN)
#define DEFAULT_LIMIT ((size_t)0)
#define DEFAULT_AUTO false
#define MAP_MIN SIZE_MAX /* every block through malloc, where the sanitizer watches it */
#else
#define DEFAULT_LIMIT ((size_t)256 << 20)
#define DEFAULT_AUTO true
#define MAP_MIN LOOM__MAP_MIN_BYTES
#endif
#define SLACK ((size_t)256 << 20) /* automatic: cached bytes beyond the high-water mark */

typedef struct slot {
  void *raw;
  size_t bytes;
} slot;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static slot slots[SLOTS];
static int used;
static size_t cached, limit = DEFAULT_LIMIT;
static size_t reserved; /* loom__mem_cache_reserve: room added on top of a limit that is on */
static bool automatic = DEFAULT_AUTO; /* the limit follows the high-water mark (see the top) */
static size_t live, high; /* bytes of cacheable blocks in use now, and the most ever */

/* With mu held: the cached bytes allowed with `extra` more bytes in use: in automatic mode
 * what keeps in use + cached within max(high, in use) + SLACK + reserved; else what a user
 * set, plus what is reserved, if it is on. */
static size_t effective(size_t extra) {
  if (!automatic) return limit ? limit + reserved : 0;
  size_t now = live + extra, top = high > now ? high : now;
  return top - now + SLACK + reserved;
}

static void init_limit(void) {
  const char *e = getenv("LOOM_ALLOC_CACHE_MB");
  char *end = NULL;
  unsigned long long mb = e ? strtoull(e, &end, 10) : 0;
  if (e && end != e && *end == '\0' && mb <= (SIZE_MAX >> 20)) {
    limit = (size_t)mb << 20;
    automatic = false;
  }
}

void *loom__raw_alloc(size_t bytes, bool *fresh_zero) {
  *fresh_zero = false;
  if (bytes >= MAP_MIN) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    *fresh_zero = true;
    return p;
  }
  return aligned_alloc(64, (bytes + 63) & ~(size_t)63);
}

void loom__raw_free(void *raw, size_t bytes) {
  if (!raw) return;
  if (bytes >= MAP_MIN) munmap(raw, bytes);
  else free(raw);
}

size_t loom__cache_round(size_t bytes) {
  if (bytes < LOOM__CACHE_MIN_BYTES || bytes > SIZE_MAX - 4095) return bytes;
  return (bytes + 4095) & ~(size_t)4095;
}

static void shrink(size_t keep);

void *loom__cache_take(size_t bytes) {
  if (bytes < LOOM__CACHE_MIN_BYTES) return NULL;
  pthread_once(&once, init_limit);
  void *raw = NULL;
  pthread_mutex_lock(&mu);
  for (int i = used - 1; i >= 0; i--)
    if (slots[i].bytes == bytes) {
      raw = slots[i].raw;
      cached -= bytes;
      slots[i] = slots[--used];
      live += bytes;
      break;
    }
  if (!raw) shrink(effective(bytes)); /* room for the block the caller maps next */
  pthread_mutex_unlock(&mu);
  return raw;
}

void loom__cache_track(size_t bytes) {
  if (bytes < LOOM__CACHE_MIN_BYTES) return;
  pthread_mutex_lock(&mu);
  live += bytes;
  if (live > high) high = live;
  pthread_mutex_unlock(&mu);
}

bool loom__cache_put(void *raw, size_t bytes) {
  if (bytes < LOOM__CACHE_MIN_BYTES) return false;
  pthread_once(&once, init_limit);
  bool kept = false;
  pthread_mutex_lock(&mu);
  live -= bytes < live ? bytes : live;
  size_t lim = effective(0);
  if (used < SLOTS && bytes <= lim && cached <= lim - bytes) {
    slots[used++] = (slot){raw, bytes};
    cached += bytes;
    kept = true;
  }
  pthread_mutex_unlock(&mu);
  return kept;
}

/* With mu held: free cached blocks until at most keep bytes stay (the latest kept go first). */
static void shrink(size_t keep) {
  while (used && cached > keep) {
    slot s = slots[--used];
    cached -= s.bytes;
    loom__raw_free(s.raw, s.bytes);
  }
}

void loom_mem_set_cache_limit(size_t bytes) {
  pthread_once(&once, init_limit);
  pthread_mutex_lock(&mu);
  automatic = bytes == LOOM_MEM_CACHE_AUTO;
  limit = automatic ? DEFAULT_LIMIT : bytes;
  shrink(effective(0));
  pthread_mutex_unlock(&mu);
}

void loom__mem_cache_reserve(ptrdiff_t delta) {
  pthread_once(&once, init_limit);
  pthread_mutex_lock(&mu);
  if (delta >= 0) reserved += (size_t)delta;
  else reserved -= (size_t)-delta <= reserved ? (size_t)-delta : reserved;
  shrink(effective(0));
  pthread_mutex_unlock(&mu);
}

size_t loom_mem_cache_limit(void) {
  pthread_once(&once, init_limit);
  pthread_mutex_lock(&mu);
  size_t v = automatic ? LOOM_MEM_CACHE_AUTO : effective(0);
  pthread_mutex_unlock(&mu);
  return v;
}

size_t loom_mem_cached_bytes(void) {
  pthread_once(&once, init_limit);
  pthread_mutex_lock(&mu);
  size_t v = cached;
  pthread_mutex_unlock(&mu);
  return v;
}

void loom_mem_release_cache(void) {
  pthread_once(&once, init_limit);
  pthread_mutex_lock(&mu);
  shrink(0);
  pthread_mutex_unlock(&mu);
}

/* ---- the cache as a real run would fill it, in a dry run: sizes only (alloc.c) ------------- */

static size_t dry_sizes[SLOTS];
static int dry_used;
static size_t dry_cached, dry_live, dry_peak;
static size_t dry_clive, dry_chigh; /* the dry run's cacheable bytes in use, and their most */

/* With mu held: effective()'s limit for the dry run's own counts. */
static size_t dry_effective(size_t extra) {
  if (!automatic) return limit ? limit + reserved : 0;
  size_t now = dry_clive + extra, top = dry_chigh > now ? dry_chigh : now;
  return top - now + SLACK + reserved;
}

void loom__cache_dry_reset(void) {
  pthread_mutex_lock(&mu);
  dry_used = 0;
  dry_cached = dry_live = dry_peak = dry_clive = dry_chigh = 0;
  pthread_mutex_unlock(&mu);
}

void loom__cache_dry_alloc(size_t bytes, bool cacheable) {
  pthread_once(&once, init_limit);
  pthread_mutex_lock(&mu);
  bool large = cacheable && bytes >= LOOM__CACHE_MIN_BYTES, hit = false;
  for (int i = dry_used - 1; large && i >= 0; i--)
    if (dry_sizes[i] == bytes) { /* the block a real run would take from its cache */
      dry_cached -= bytes;
      dry_sizes[i] = dry_sizes[--dry_used];
      hit = true;
      break;
    }
  if (large && !hit) { /* a miss: the cache shrinks as loom__cache_take's does */
    size_t keep = dry_effective(bytes);
    while (dry_used > 0 && dry_cached > keep) dry_cached -= dry_sizes[--dry_used];
  }
  if (large) {
    dry_clive += bytes;
    if (dry_clive > dry_chigh) dry_chigh = dry_clive;
  }
  dry_live += bytes;
  if (dry_live + dry_cached > dry_peak) dry_peak = dry_live + dry_cached;
  pthread_mutex_unlock(&mu);
}

void loom__cache_dry_free(size_t bytes, bool cacheable) {
  pthread_once(&once, init_limit);
  pthread_mutex_lock(&mu);
  dry_live -= bytes <= dry_live ? bytes : dry_live;
  if (cacheable && bytes >= LOOM__CACHE_MIN_BYTES)
    dry_clive -= bytes <= dry_clive ? bytes : dry_clive;
  size_t lim = dry_effective(0);
  if (cacheable && bytes >= LOOM__CACHE_MIN_BYTES && dry_used < SLOTS && bytes <= lim &&
      dry_cached <= lim - bytes) { /* as loom__cache_put would keep it */
    dry_sizes[dry_used++] = bytes;
    dry_cached += bytes;
  }
  pthread_mutex_unlock(&mu);
}

size_t loom_mem_dry_footprint_peak(void) {
  pthread_mutex_lock(&mu);
  size_t v = dry_peak;
  pthread_mutex_unlock(&mu);
  return v;
}
