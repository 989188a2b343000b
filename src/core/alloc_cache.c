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
#include <string.h>

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

/* Transparent huge pages for mapped blocks of at least HUGE_MIN bytes, unless
 * LOOM_ALLOC_HUGEPAGES=0: a block faulted in 2 MiB at a time takes one page fault where 4 KiB
 * pages take 512, each with its locking, memory-cgroup charge and LRU bookkeeping (most of the
 * offload disk tier's system time with the allocator cache off: issue 29, BENCHMARKS.md). A
 * kernel whose THP setting is "never" ignores the advice. */
#define HUGE_MIN ((size_t)4 << 20)

static bool huge_wanted(void) {
  const char *e = getenv("LOOM_ALLOC_HUGEPAGES");
  return !(e && !strcmp(e, "0"));
}

void *loom__raw_alloc(size_t bytes, bool *fresh_zero) {
  *fresh_zero = false;
  if (bytes >= MAP_MIN) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    if (bytes >= HUGE_MIN && huge_wanted()) (void)madvise(p, bytes, MADV_HUGEPAGE);
#endif
    *fresh_zero = true;
    return p;
  }
  return aligned_alloc(64, (bytes + 63) & ~(size_t)63);
}

bool loom__raw_mapped(size_t bytes) { return bytes >= MAP_MIN; }

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

/* A block's residence in a real run: a fresh mapping (at least MAP_MIN) made for zeros is not
 * resident until written, and a block nothing writes before the step (a gradient arena, made
 * by loom__calloc_untouched) is only written once the step runs (loom_mem_dry_mark_written). So
 * the dry run counts such a block as untouched (not in the footprint) from its making to that
 * mark, and a cached one stays untouched until the cache hands it out again (cleared or
 * written by its new owner). Generations tell a block made before the last mark (written
 * since) from one made after it.
 * Each account (a rank, or the process) is followed on its own: its blocks, a cache of its
 * own with a share of the slack, and its own peak; the footprint is the sum of the accounts'
 * peaks. The ranks of a data-parallel run take the same steps in lockstep, so their peaks
 * coincide and their frees refill the shared cache with the sizes each takes back; one cache
 * shared by dry ranks, which run unsynchronised, would give a peak that depends on how their
 * threads happen to interleave (15% apart from one plan to the next). */
typedef struct dry_account {
  size_t sizes[SLOTS];
  bool untouched[SLOTS];
  int used;
  size_t cached;       /* bytes cached, for the limit */
  size_t cres;         /* the cached bytes that are resident (written) */
  size_t live;         /* resident blocks in use */
  size_t ulive;        /* blocks in use, untouched since their mapping */
  size_t clive, chigh; /* cacheable bytes in use, and their most */
  size_t peak;         /* of live + cres */
  bool active;
} dry_account;

static dry_account dry[LOOM_MEM_ACCOUNTS];
static int dry_active;       /* accounts that made a block in this dry run */
static unsigned dry_gen = 1; /* bumped by each mark and reset; 0 is never a generation */

static dry_account *dry_of(int account) {
  return &dry[account >= 0 && account < LOOM_MEM_ACCOUNTS ? account : 0];
}

/* With mu held: effective()'s limit for an account's own counts, the slack and the reserve
 * shared by the accounts that allocate. */
static size_t dry_effective(const dry_account *a, size_t extra) {
  size_t n = dry_active > 0 ? (size_t)dry_active : 1;
  if (!automatic) return limit ? (limit + reserved) / n : 0;
  size_t now = a->clive + extra, top = a->chigh > now ? a->chigh : now;
  return top - now + (SLACK + reserved) / n;
}

static void dry_note_peak(dry_account *a) {
  if (a->live + a->cres > a->peak) a->peak = a->live + a->cres;
}

/* With mu held: drop the account's latest cached slot. */
static void dry_drop_last(dry_account *a) {
  a->used--;
  a->cached -= a->sizes[a->used];
  if (!a->untouched[a->used]) a->cres -= a->sizes[a->used];
}

void loom__cache_dry_reset(void) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < LOOM_MEM_ACCOUNTS; i++)
    if (dry[i].active || dry[i].used || dry[i].peak) memset(&dry[i], 0, sizeof dry[i]);
  dry_active = 0;
  dry_gen = dry_gen + 1 ? dry_gen + 1 : 1;
  pthread_mutex_unlock(&mu);
}

unsigned loom__cache_dry_alloc(int account, size_t bytes, bool cacheable, bool untouched) {
  pthread_once(&once, init_limit);
  pthread_mutex_lock(&mu);
  dry_account *a = dry_of(account);
  if (!a->active) a->active = true, dry_active++;
  bool large = cacheable && bytes >= LOOM__CACHE_MIN_BYTES, hit = false;
  for (int i = a->used - 1; large && i >= 0; i--)
    if (a->sizes[i] == bytes) { /* the block a real run would take from its cache */
      a->cached -= bytes;
      if (!a->untouched[i]) a->cres -= bytes;
      a->sizes[i] = a->sizes[--a->used];
      a->untouched[i] = a->untouched[a->used];
      hit = true;
      break;
    }
  if (large && !hit) { /* a miss: the cache shrinks as loom__cache_take's does */
    size_t keep = dry_effective(a, bytes);
    while (a->used > 0 && a->cached > keep) dry_drop_last(a);
  }
  if (large) {
    a->clive += bytes;
    if (a->clive > a->chigh) a->chigh = a->clive;
  }
  /* a fresh mapping (a miss, or the C library's maps when not cacheable) of zeros */
  unsigned gen = untouched && !hit && bytes >= MAP_MIN ? dry_gen : 0;
  if (gen) a->ulive += bytes;
  else a->live += bytes;
  dry_note_peak(a);
  pthread_mutex_unlock(&mu);
  return gen;
}

void loom__cache_dry_free(int account, size_t bytes, bool cacheable, unsigned gen) {
  pthread_once(&once, init_limit);
  pthread_mutex_lock(&mu);
  dry_account *a = dry_of(account);
  bool untouched = gen && gen == dry_gen; /* not written since it was made */
  if (untouched) a->ulive -= bytes <= a->ulive ? bytes : a->ulive;
  else a->live -= bytes <= a->live ? bytes : a->live;
  if (cacheable && bytes >= LOOM__CACHE_MIN_BYTES) a->clive -= bytes <= a->clive ? bytes : a->clive;
  size_t lim = dry_effective(a, 0);
  if (cacheable && bytes >= LOOM__CACHE_MIN_BYTES && a->used < SLOTS && bytes <= lim &&
      a->cached <= lim - bytes) { /* as loom__cache_put would keep it */
    a->untouched[a->used] = untouched;
    a->sizes[a->used++] = bytes;
    a->cached += bytes;
    if (!untouched) a->cres += bytes;
  }
  pthread_mutex_unlock(&mu);
}

void loom_mem_dry_mark_written(void) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < LOOM_MEM_ACCOUNTS; i++) {
    dry[i].live += dry[i].ulive;
    dry[i].ulive = 0;
    dry_note_peak(&dry[i]);
  }
  dry_gen = dry_gen + 1 ? dry_gen + 1 : 1;
  pthread_mutex_unlock(&mu);
}

size_t loom_mem_dry_footprint_peak(void) {
  pthread_mutex_lock(&mu);
  size_t v = 0;
  for (int i = 0; i < LOOM_MEM_ACCOUNTS; i++) v += dry[i].peak;
  pthread_mutex_unlock(&mu);
  return v;
}
