/* core_int.h: what the core layer shares with the layers above it (never with users):
 * failure with a message, the allocation path, and the single-exit helper. */
#ifndef LOOM_CORE_INT_H
#define LOOM_CORE_INT_H

#include "loom/alloc.h"
#include "loom/cpu.h"
#include "loom/dtype.h"
#include "loom/status.h"

#include <stdbool.h>
#include <stddef.h>

/* Set this thread's last-error message (printf-style) and return `code`:
 *   return loom__fail(LOOM_ESHAPE, "matmul: inner dims %lld vs %lld", a, b); */
int loom__fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Allocate from a pool: 64-byte aligned, counted, NULL on failure (real or injected).
 * loom__free(NULL) is a no-op. */
void *loom__malloc(loom_pool pool, size_t size);
void *loom__calloc(loom_pool pool, size_t count, size_t elem);
void loom__free(void *p);
char *loom__strdup(loom_pool pool, const char *s);

/* Raise (delta > 0) or lower the allocator cache's limit by what an object will free and take
 * again every step (FSDP's gathers and local gradients), while the cache is on (a limit of 0,
 * which a user or a sanitizer build chose, stays 0). loom_mem_cache_limit includes it. */
void loom__mem_cache_reserve(ptrdiff_t delta);

/* Count bytes that did not come from loom__malloc (a mapped file) against a pool, process-wide
 * and on the calling thread's account (loom_mem_account). Where the release may happen on
 * another thread, record the account at allocation and give it back with loom__mem_account_to
 * (an account out of range counts as 0), so the account's bytes cannot go below zero. */
void loom__mem_account(loom_pool pool, ptrdiff_t delta);
void loom__mem_account_to(loom_pool pool, int account, ptrdiff_t delta);
/* True if the failure injector says this allocation attempt fails (counts the attempt).
 * For allocation paths that do not go through loom__malloc (mmap). */
bool loom__alloc_should_fail(loom_pool pool);

/* Single exit on error: `int rc = LOOM_OK; ... LOOM_TRY(f()); ... done: cleanup; return rc;` */
#define LOOM_TRY(call)                                                                        \
  do {                                                                                        \
    rc = (call);                                                                              \
    if (rc != LOOM_OK) goto done;                                                             \
  } while (0)

/* Fail with LOOM_ENOMEM and a message if p is NULL. */
#define LOOM_TRY_ALLOC(p, what)                                                               \
  do {                                                                                        \
    if (!(p)) {                                                                               \
      rc = loom__fail(LOOM_ENOMEM, "%s: out of memory allocating %s", __func__, what);        \
      goto done;                                                                              \
    }                                                                                         \
  } while (0)

/* Element i of a buffer of dtype dt as double (exact for every dtype but i64 beyond 2^53),
 * and the reverse (floats round to nearest even; integers truncate toward zero and saturate,
 * NaN gives 0). */
double loom__load_f64(const void *p, loom_dtype dt, size_t i);
void loom__store_f64(void *p, loom_dtype dt, size_t i, double v);

/* a * b into *out; false if it overflows size_t. */
static inline bool loom__mul_ok(size_t a, size_t b, size_t *out) {
  return !__builtin_mul_overflow(a, b, out);
}

#endif
