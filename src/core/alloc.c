/* alloc.c: the single allocation path of loom, with per-pool and per-account byte accounting,
 * failure injection and dry runs. A 64-byte header before each block records its size, pool,
 * account and whether it is a dry block, so loom__free needs only the pointer and the counters
 * stay exact whichever thread frees. A block the default allocator maps (large ones) has its
 * data on a page boundary (the header at the end of the page before), so the offload disk
 * tier's O_DIRECT transfers go straight to and from it. The default allocator keeps large freed blocks for reuse
 * (alloc_cache.c); the counters count blocks in use, not cached ones. In a dry run (alloc.h)
 * every block is zero-filled address space: small ones cleared, large ones fresh mappings
 * that reserve no memory (MAP_NORESERVE), never cached, so what is never written is never
 * resident. */
#include "core/core_int.h"
#include "core/alloc_cache.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HEADER 64u
#define PAGE 4096u /* a mapped block's data starts on a page: O_DIRECT reads and writes it as is */
#define BLOCK_MAGIC 0x6c6f6f6d626c6b31ull /* "loomblk1" */

typedef struct block_header {
  uint64_t magic;
  size_t size;
  int pool;
  int account; /* the allocating thread's account: loom__free credits it, not the freer's */
  int tag;     /* the allocating thread's tag (loom_mem_set_tag) */
  bool dry;    /* made in a dry run (dry_alloc): freed by dry_free whatever the mode then */
  unsigned dry_gen; /* a dry block counted as untouched zeros: loom__cache_dry_alloc's answer */
  unsigned lead;    /* bytes of the raw block before the header (PAGE - HEADER for a mapped one,
                     * so that its data starts on a page; else 0) */
} block_header;
_Static_assert(sizeof(block_header) <= HEADER, "the block header must fit in HEADER bytes");

typedef struct pool_counters {
  _Atomic size_t current, peak;
  _Atomic uint64_t allocs, frees, failures;
  _Atomic size_t tag_current[LOOM_MEM_TAGS], tag_at_peak[LOOM_MEM_TAGS];
} pool_counters;

static pool_counters pools[LOOM_POOL_COUNT];
/* One cache line (or two) per account, so ranks allocating at once do not share one. */
typedef struct account_counters {
  _Alignas(64) pool_counters pool[LOOM_POOL_COUNT];
} account_counters;
static account_counters accounts[LOOM_MEM_ACCOUNTS];
static _Thread_local int my_account; /* this thread's account; 0 until set */
static _Thread_local int my_tag;     /* this thread's tag; 0 until set */
static _Atomic uint64_t attempts;
static _Atomic uint64_t fail_at; /* attempt number that fails; 0 = none */
_Atomic bool loom__dry_flag;

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
  static const char *names[LOOM_POOL_COUNT] = {"compute", "host", "file", "meta"};
  return (unsigned)pool < LOOM_POOL_COUNT ? names[pool] : "?";
}

/* A pool's (or an account's pool's) counters as the public stats. */
static int stats_of(pool_counters *c, loom_pool_stats *out) {
  out->current_bytes = atomic_load(&c->current);
  out->peak_bytes = atomic_load(&c->peak);
  out->allocs = atomic_load(&c->allocs);
  out->frees = atomic_load(&c->frees);
  out->failures = atomic_load(&c->failures);
  return LOOM_OK;
}

int loom_mem_stats(loom_pool pool, loom_pool_stats *out) {
  if ((unsigned)pool >= LOOM_POOL_COUNT)
    return loom__fail(LOOM_EINVAL, "loom_mem_stats: pool %d out of range", (int)pool);
  if (!out) return loom__fail(LOOM_EINVAL, "loom_mem_stats: out is NULL");
  return stats_of(&pools[pool], out);
}

/* The peak is now: current bytes, and the tags' bytes as they are. */
static void peak_is_now(pool_counters *c) {
  atomic_store(&c->peak, atomic_load(&c->current));
  for (int t = 0; t < LOOM_MEM_TAGS; t++)
    atomic_store(&c->tag_at_peak[t], atomic_load(&c->tag_current[t]));
}

void loom_mem_reset_peak(loom_pool pool) {
  if ((unsigned)pool >= LOOM_POOL_COUNT) return;
  peak_is_now(&pools[pool]);
}

int loom_mem_set_tag(int tag) {
  if (tag < 0 || tag >= LOOM_MEM_TAGS)
    return loom__fail(LOOM_EINVAL, "loom_mem_set_tag: tag %d out of range 0..%d", tag,
                      LOOM_MEM_TAGS - 1);
  my_tag = tag;
  return LOOM_OK;
}

int loom_mem_tag(void) { return my_tag; }

int loom_mem_set_account(int account) {
  if (account < 0 || account >= LOOM_MEM_ACCOUNTS)
    return loom__fail(LOOM_EINVAL, "loom_mem_set_account: account %d out of range 0..%d",
                      account, LOOM_MEM_ACCOUNTS - 1);
  my_account = account;
  return LOOM_OK;
}

int loom_mem_account(void) { return my_account; }

/* An account's counters of a pool for `who`, or NULL after the message (LOOM_EINVAL in *rc)
 * for an account or pool out of range or a NULL out. */
static pool_counters *account_pool(const char *who, int account, loom_pool pool,
                                   const void *out, int *rc) {
  *rc = LOOM_EINVAL;
  if (account < 0 || account >= LOOM_MEM_ACCOUNTS)
    loom__fail(LOOM_EINVAL, "%s: account %d out of range 0..%d", who, account,
               LOOM_MEM_ACCOUNTS - 1);
  else if ((unsigned)pool >= LOOM_POOL_COUNT)
    loom__fail(LOOM_EINVAL, "%s: pool %d out of range", who, (int)pool);
  else if (!out)
    loom__fail(LOOM_EINVAL, "%s: the output is NULL", who);
  else
    return *rc = LOOM_OK, &accounts[account].pool[pool];
  return NULL;
}

int loom_mem_account_stats(int account, loom_pool pool, loom_pool_stats *out) {
  int rc;
  pool_counters *c = account_pool("loom_mem_account_stats", account, pool, out, &rc);
  return c ? stats_of(c, out) : rc;
}

void loom_mem_account_reset_peak(int account, loom_pool pool) {
  if (account < 0 || account >= LOOM_MEM_ACCOUNTS || (unsigned)pool >= LOOM_POOL_COUNT) return;
  peak_is_now(&accounts[account].pool[pool]);
}

int loom_mem_account_tags(int account, loom_pool pool, size_t at_peak[LOOM_MEM_TAGS]) {
  int rc;
  pool_counters *c = account_pool("loom_mem_account_tags", account, pool, at_peak, &rc);
  for (int t = 0; c && t < LOOM_MEM_TAGS; t++) at_peak[t] = atomic_load(&c->tag_at_peak[t]);
  return rc;
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

/* Add delta bytes (an allocation) or take -delta away (a free) from one set of counters, and
 * from the bytes of `tag`. A new peak copies the tags' bytes (exact when one thread allocates
 * on the account at a time, as a rank does; a close approximation otherwise). */
static void count(pool_counters *c, int tag, ptrdiff_t delta) {
  if (delta >= 0) {
    atomic_fetch_add(&c->tag_current[tag], (size_t)delta);
    size_t now = atomic_fetch_add(&c->current, (size_t)delta) + (size_t)delta;
    size_t peak = atomic_load(&c->peak);
    bool raised = false;
    while (now > peak && !(raised = atomic_compare_exchange_weak(&c->peak, &peak, now))) {
    }
    if (raised)
      for (int t = 0; t < LOOM_MEM_TAGS; t++)
        atomic_store(&c->tag_at_peak[t], atomic_load(&c->tag_current[t]));
    atomic_fetch_add(&c->allocs, 1);
  } else {
    atomic_fetch_sub(&c->tag_current[tag], (size_t)(-delta));
    atomic_fetch_sub(&c->current, (size_t)(-delta));
    atomic_fetch_add(&c->frees, 1);
  }
}

/* A failed allocation of this thread, process-wide and on its account. */
static void count_failure(loom_pool pool) {
  atomic_fetch_add(&pools[pool].failures, 1);
  atomic_fetch_add(&accounts[my_account].pool[pool].failures, 1);
}

/* The counting of every allocation and free: the process's pool and the account's. */
static void account_tagged(loom_pool pool, int account, int tag, ptrdiff_t delta) {
  if ((unsigned)account >= LOOM_MEM_ACCOUNTS) account = 0;
  if ((unsigned)tag >= LOOM_MEM_TAGS) tag = 0;
  count(&pools[pool], tag, delta);
  count(&accounts[account].pool[pool], tag, delta);
}

void loom__mem_account_to(loom_pool pool, int account, ptrdiff_t delta) {
  account_tagged(pool, account, 0, delta);
}

void loom__mem_account_only(loom_pool pool, int account, ptrdiff_t delta) {
  if ((unsigned)pool >= LOOM_POOL_COUNT) return;
  if ((unsigned)account >= LOOM_MEM_ACCOUNTS) account = 0;
  count(&accounts[account].pool[pool], 0, delta);
}

void loom__mem_account(loom_pool pool, ptrdiff_t delta) {
  loom__mem_account_to(pool, my_account, delta);
}

bool loom__alloc_should_fail(loom_pool pool) {
  uint64_t n = atomic_fetch_add(&attempts, 1) + 1;
  uint64_t f = atomic_load(&fail_at);
  if (f && n == f) {
    atomic_store(&fail_at, 0);
    count_failure(pool);
    return true;
  }
  return false;
}

void loom_mem_set_dry_run(bool on) {
  atomic_store(&loom__dry_flag, on);
  if (on) loom_mem_release_cache(); /* no block written by a real run is handed out */
  if (on) loom__cache_dry_reset();
}

bool loom_mem_dry_run(void) { return loom__dry(); }

/* A dry block of `bytes` (header included), all zero: at or above LOOM__MAP_MIN_BYTES a
 * mapping that reserves nothing, below it a cleared heap block. */
static void *dry_alloc(size_t bytes) {
  if (bytes >= LOOM__MAP_MIN_BYTES) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    return p == MAP_FAILED ? NULL : p;
  }
  void *p = aligned_alloc(HEADER, (bytes + HEADER - 1) & ~(size_t)(HEADER - 1));
  if (p) memset(p, 0, bytes);
  return p;
}

static void dry_free(void *raw, size_t bytes) {
  if (bytes >= LOOM__MAP_MIN_BYTES) munmap(raw, bytes);
  else free(raw);
}

/* The allocation behind loom__malloc and loom__calloc; *fresh_zero: the block is newly mapped
 * zero pages (nothing to clear). */
static void *alloc_block(loom_pool pool, size_t size, bool untouched, bool *fresh_zero) {
  *fresh_zero = false;
  if ((unsigned)pool >= LOOM_POOL_COUNT) pool = LOOM_POOL_COMPUTE;
  if (loom__alloc_should_fail(pool)) return NULL;
  if (size > SIZE_MAX - 2 * PAGE) {
    count_failure(pool);
    return NULL;
  }
  unsigned char *raw;
  unsigned gen = 0, lead = 0;
  bool dry = loom__dry();
  if (dry) {
    raw = dry_alloc(size + HEADER);
    *fresh_zero = true;
    if (raw)
      gen = loom__cache_dry_alloc(my_account, loom__cache_round(size + HEADER),
                                  hook.alloc == default_alloc, untouched);
  } else if (hook.alloc == default_alloc) {
    size_t bytes = loom__cache_round(size + HEADER);
    if (loom__raw_mapped(bytes)) { /* its data on a page of its own (the header before it) */
      lead = PAGE - HEADER;
      bytes = loom__cache_round(size + HEADER + lead);
    }
    raw = loom__cache_take(bytes);
    if (!raw) {
      raw = loom__raw_alloc(bytes, fresh_zero);
      if (!raw && loom_mem_cached_bytes()) { /* out of memory: give the cache back, try again */
        loom_mem_release_cache();
        raw = loom__raw_alloc(bytes, fresh_zero);
      }
      if (raw) loom__cache_track(bytes); /* a new block in use (a cached one was counted) */
    }
  } else {
    raw = hook.alloc(hook.ctx, size + HEADER, HEADER);
  }
  if (!raw) {
    count_failure(pool);
    return NULL;
  }
  raw += lead;
  block_header *h = (block_header *)raw;
  h->magic = BLOCK_MAGIC;
  h->lead = lead;
  h->size = size;
  h->pool = pool;
  h->account = my_account;
  h->tag = my_tag;
  h->dry = dry;
  h->dry_gen = gen;
  account_tagged(pool, h->account, h->tag, (ptrdiff_t)size);
  return raw + HEADER;
}

void *loom__malloc(loom_pool pool, size_t size) {
  bool fresh_zero;
  return alloc_block(pool, size, false, &fresh_zero);
}

/* A large fresh block is untouched zero pages: clearing it would only make them resident. */
static void *zeroed(loom_pool pool, size_t count, size_t elem, bool untouched) {
  if (elem && count > SIZE_MAX / elem) return NULL;
  bool fresh_zero;
  void *p = alloc_block(pool, count * elem, untouched, &fresh_zero);
  if (p && !fresh_zero) memset(p, 0, count * elem);
  return p;
}

void *loom__calloc(loom_pool pool, size_t count, size_t elem) {
  return zeroed(pool, count, elem, false);
}

void *loom__calloc_untouched(loom_pool pool, size_t count, size_t elem) {
  return zeroed(pool, count, elem, true);
}

void loom__mem_release(void *p, size_t bytes) {
#ifdef MADV_DONTNEED
  long pg = sysconf(_SC_PAGESIZE);
  if (!p || pg <= 0 || loom__dry()) return;
  uintptr_t lo = ((uintptr_t)p + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
  uintptr_t hi = ((uintptr_t)p + bytes) & ~((uintptr_t)pg - 1);
  if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
#else
  (void)p;
  (void)bytes;
#endif
}

void loom__free(void *p) {
  if (!p) return;
  unsigned char *raw = (unsigned char *)p - HEADER;
  block_header *h = (block_header *)raw;
  if (h->magic != BLOCK_MAGIC) return; /* not ours, or freed twice: leave it alone */
  h->magic = 0;
  account_tagged((loom_pool)h->pool, h->account, h->tag, -(ptrdiff_t)h->size);
  if (h->dry) {
    size_t size = h->size; /* before the block goes */
    unsigned gen = h->dry_gen;
    int account = h->account;
    dry_free(raw, size + HEADER);
    loom__cache_dry_free(account, loom__cache_round(size + HEADER), hook.free == default_free,
                         gen);
    return;
  }
  if (hook.free == default_free) {
    size_t bytes = loom__cache_round(h->size + HEADER + h->lead);
    raw -= h->lead;
    if (!loom__cache_put(raw, bytes)) loom__raw_free(raw, bytes);
    return;
  }
  hook.free(hook.ctx, raw);
}

char *loom__strdup(loom_pool pool, const char *s) {
  size_t n = strlen(s) + 1;
  char *d = loom__malloc(pool, n);
  if (d) memcpy(d, s, n);
  return d;
}
