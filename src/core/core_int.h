/* core_int.h: what the core layer shares with the layers above it (never with users):
 * failure with a message, the allocation path, the single-exit helper, the monotonic clock,
 * the FNV-1a hash, and f16/bf16 widen / narrow in f32 blocks. */
#ifndef LOOM_CORE_INT_H
#define LOOM_CORE_INT_H

#include "loom/alloc.h"
#include "loom/cpu.h"
#include "loom/dtype.h"
#include "loom/status.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Set this thread's last-error message (printf-style) and return `code`:
 *   return loom__fail(LOOM_ESHAPE, "matmul: inner dims %lld vs %lld", a, b); */
int loom__fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Allocate from a pool: 64-byte aligned, counted, NULL on failure (real or injected).
 * loom__free(NULL) is a no-op. */
void *loom__malloc(loom_pool pool, size_t size);
void *loom__calloc(loom_pool pool, size_t count, size_t elem);
/* loom__calloc for zeros nothing writes before a training step runs (a module's gradient
 * arena): the same block; a dry run counts it as not resident (a fresh mapping's untouched
 * pages) until loom_mem_dry_mark_written (alloc.h), for loom_mem_dry_footprint_peak. */
void *loom__calloc_untouched(loom_pool pool, size_t count, size_t elem);
void loom__free(void *p);
/* Give the whole pages inside [p, p + bytes) of a live block back to the system (madvise
 * MADV_DONTNEED): bytes whose value is no longer needed while their block lives on (the offload
 * tier's gradient once it is on disk). They read as zero afterwards; the block's size, pool
 * and accounting are unchanged. A no-op in a dry run, for ranges under a page, or where the
 * system has no such call. */
void loom__mem_release(void *p, size_t bytes);
char *loom__strdup(loom_pool pool, const char *s);

/* Whether a dry run is on (loom_mem_set_dry_run): kernels, copies, initialisers, collectives'
 * data and file I/O are skipped, allocations made as always. One relaxed load: check it at
 * every place that computes or moves data, after the allocations it makes. */
extern _Atomic bool loom__dry_flag;
static inline bool loom__dry(void) {
  return atomic_load_explicit(&loom__dry_flag, memory_order_relaxed);
}

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
/* Count bytes on an account only, not on the process's pool: a rank's share of a block that
 * several ranks use and another account holds (FSDP's shared gathered units, fsdp_share.c:
 * each holder counts its 1/n while it holds the block). Give them back the same way. */
void loom__mem_account_only(loom_pool pool, int account, ptrdiff_t delta);
/* True if the failure injector says this allocation attempt fails (counts the attempt).
 * For allocation paths that do not go through loom__malloc (mmap). */
bool loom__alloc_should_fail(loom_pool pool);

/* Whether the CPU is Intel's (cpuid's vendor; dispatch.c, the one file that tests the CPU):
 * the bf16 kernel rule (ops/gemm_prim.c) depends on it. */
bool loom__cpu_intel(void);
/* Whether bf16 products may run on AMX tiles (loom's AMX GEMM, fused attention): the CPU has
 * AMX-TILE and AMX-BF16, the kernel granted the tile state to this process, the active level
 * is avx512 (so LOOM_CPU=avx2 or scalar turns AMX off too), and oneDNN's ISA cap, read once
 * from the environment, leaves AMX on (loom__onednn_caps_amx). */
bool loom__cpu_amx_bf16(void);
/* Whether oneDNN's ISA cap rules AMX out, given the values of ONEDNN_MAX_CPU_ISA and
 * DNNL_MAX_CPU_ISA (NULL: unset; the first wins, as in oneDNN): a value (any case) other than
 * empty or "ALL" without "AMX" in it (AVX2, AVX512_CORE_BF16, ...). So the cap emulates a CPU
 * without AMX for loom as for oneDNN (issue 27: an Intel CPU with AVX512-BF16 and no AMX). */
bool loom__onednn_caps_amx(const char *onednn, const char *dnnl);

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

/* Seconds on the monotonic clock (clock.c): for intervals only, never wall time. */
double loom__now(void);

/* 64-bit FNV-1a of n bytes at p, continuing from h (hash.c): start from LOOM__FNV1A_BASIS, feed
 * the result back in to hash several pieces as one. Not for anything an attacker chooses. */
#define LOOM__FNV1A_BASIS 14695981039346656037ull
uint64_t loom__fnv1a(uint64_t h, const void *p, size_t n);

/* f16 / bf16 (dt) to f32 and back, n elements (dtype.c; the dispatched conversion kernels, so
 * the round trip is exact and the narrowing rounds to nearest even once). */
void loom__widen(loom_dtype dt, const void *src, float *dst, size_t n);
void loom__narrow(loom_dtype dt, const float *src, void *dst, size_t n);
/* Whether loom's own OpenMP loops (conversions, elementwise ops, the optimizer step) may run a
 * team: not under ThreadSanitizer, which cannot see libgomp's barriers (gemm_prim.c caps
 * oneDNN to the calling thread there too). Use as `#pragma omp parallel for if (LOOM__OMP_TEAM
 * && ...)`. */
#ifdef __SANITIZE_THREAD__
#define LOOM__OMP_TEAM 0
#else
#define LOOM__OMP_TEAM 1
#endif

/* dst = src rounded to dt (f16 / bf16: to nearest even, as loom__narrow) and widened back to
 * f32, n elements, in one pass without a 16-bit copy (dt f32: a copy); src == dst allowed.
 * Long runs go over the caller's OpenMP team, as loom_convert's. Nothing in a dry run. */
void loom__round_via(loom_dtype dt, const float *src, float *dst, size_t n);

/* x[0..n) of dtype dt (f32, f16 or bf16) seen as f32, a block at a time (dtype.c): the one
 * widen-apply-narrow loop. f32 is one block, x itself; f16 / bf16 come in blocks of at most
 * LOOM__F32_BLOCK elements, each widened into the iterator's buffer and rounded back once
 * when the next block is asked for (so finish the loop: a break leaves the block unwritten).
 *   loom__f32_iter it;
 *   for (loom__f32_begin(&it, x, dt, n); loom__f32_next(&it);)
 *     for (size_t j = 0; j < it.k; j++) it.p[j] *= factor;   (element it.off + j of x) */
#define LOOM__F32_BLOCK 512
typedef struct loom__f32_iter {
  void *x;
  loom_dtype dt;
  size_t n, off, k; /* the block is x[off, off + k) */
  float *p;         /* its f32 values */
  float buf[LOOM__F32_BLOCK];
} loom__f32_iter;
void loom__f32_begin(loom__f32_iter *it, void *x, loom_dtype dt, size_t n);
bool loom__f32_next(loom__f32_iter *it);

/* The kernel-table pattern of every layer with SIMD kernels: one const table per CPU level
 * (scalar, avx2, avx512), each level's kernels in their own file compiled with that level's
 * ISA flags (CMakeLists.txt, set_source_files_properties; no target attributes or pragmas),
 * and one picker, tables[loom__kernel_level(level)] for a given level and
 * tables[loom__kernel_level(loom_cpu_level_active())] for the active one. loom__kernel_level
 * (kernels/dispatch.c) is `level` where the CPU has it, else scalar, so a level's table is
 * never called on a CPU without its instructions. */
loom_cpu_level loom__kernel_level(loom_cpu_level level);
/* A layer's tables of type T, NAME_scalar, NAME_avx2 and NAME_avx512, and its two pickers,
 * `const T *FOR(loom_cpu_level)` (scalar for a level the CPU lacks) and, for the active level,
 * `const T *ACTIVE(void)`: declared in the layer's header with LOOM__KERNEL_TABLES, the pickers
 * defined once in a .c file with LOOM__KERNEL_PICKERS. */
#define LOOM__KERNEL_TABLES(T, NAME, FOR, ACTIVE)                                              \
  extern const T NAME##_scalar, NAME##_avx2, NAME##_avx512;                                    \
  const T *FOR(loom_cpu_level level);                                                          \
  const T *ACTIVE(void)
#define LOOM__KERNEL_PICKERS(T, NAME, FOR, ACTIVE)                                             \
  const T *FOR(loom_cpu_level level) {                                                         \
    static const T *const tables[LOOM_CPU_LEVEL_COUNT] = {&NAME##_scalar, &NAME##_avx2,        \
                                                          &NAME##_avx512};                     \
    return tables[loom__kernel_level(level)];                                                  \
  }                                                                                            \
  const T *ACTIVE(void) { return FOR(loom_cpu_level_active()); }

/* a * b into *out; false if it overflows size_t. */
static inline bool loom__mul_ok(size_t a, size_t b, size_t *out) {
  return !__builtin_mul_overflow(a, b, out);
}

#endif
