/* gemm_int.h: what the oneDNN-backed kernels (gemm_dnnl.c, conv_dnnl.c) share, private to
 * them: oneDNN status mapping, the one CPU engine, a cache of built primitives keyed by
 * everything that shapes them, and running a cached primitive on caller buffers.
 *
 * Thread safety: every function here may be called from several threads at once. A cached
 * primitive is immutable and may run on several threads concurrently; each run makes its own
 * stream, memory objects and scratchpad (user scratchpad mode), so runs share no mutable
 * state. */
#ifndef LOOM_OPS_GEMM_INT_H
#define LOOM_OPS_GEMM_INT_H

#include "core/core_int.h"
#include "ops/gemm.h"

#include <dnnl.h>
#include <dnnl_debug.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* Argument checks shared by each kernel and its reference: LOOM_EINVAL for a NULL pointer, a
 * non-positive size or beta not 0/1; LOOM_EDTYPE for a dtype the kernel does not take;
 * LOOM_ESHAPE for a leading dimension or batch stride too small for the shape. The message
 * names `who` and the argument. */
int loom__gemm_check(const loom__gemm_args *g, const char *who);
int loom__conv2d_check(const loom__conv2d_args *a, const char *who, const void *p1, const char *n1,
                       const void *p2, const char *n2, const void *p3, const char *n3);

/* LOOM_OK for dnnl_success; otherwise LOOM_EBACKEND (LOOM_ENOMEM for dnnl_out_of_memory) with
 * the message "<who>: oneDNN <what> failed: <dnnl status text>". */
int loom__dnnl_check(dnnl_status_t st, const char *who, const char *what);

/* The process's CPU engine, created on first use (never freed). */
int loom__dnnl_engine(const char *who, dnnl_engine_t *out);

/* What identifies a primitive: the kernel kind and the values that shaped it (dims, strides,
 * dtypes, flags, alpha bits, and the thread count it was built for). Zero it before filling,
 * then compare as bytes. */
#define LOOM__PRIM_KEY_VALS 32
typedef struct loom__prim_key {
  int64_t kind;
  int64_t nthr;
  int64_t v[LOOM__PRIM_KEY_VALS];
} loom__prim_key;

/* A key of `kind` for `nthr` threads with every value zero. */
static inline loom__prim_key loom__prim_key_make(int64_t kind, int64_t nthr) {
  loom__prim_key k;
  memset(&k, 0, sizeof k);
  k.kind = kind, k.nthr = nthr;
  return k;
}

/* A primitive in use: from a cache slot (slot >= 0, which stays in the cache at least until
 * released) or built for this call only (slot -1, when every cache slot was in use). */
typedef struct loom__prim {
  dnnl_primitive_t prim;
  size_t scratch_bytes;
  int slot;
} loom__prim;

/* Builds the primitive descriptor for `key` (with the attr it is given, which already asks for
 * the user scratchpad mode); returns a loom status with a message naming `who`. */
typedef int (*loom__prim_build_fn)(const loom__prim_key *key, const_dnnl_primitive_attr_t attr,
                                   dnnl_engine_t engine, const char *who,
                                   dnnl_primitive_desc_t *out);

/* The primitive for `key`: from the cache, or built by `build` and inserted (evicting the
 * least recently used entry that no call is running). On success the caller runs *out and
 * gives it back with loom__prim_release. */
int loom__prim_get(const loom__prim_key *key, loom__prim_build_fn build, const char *who,
                   loom__prim *out);
void loom__prim_release(loom__prim *p);

/* True if oneDNN builds the primitive descriptor for the bf16 primitive `key` on this CPU
 * (false when it answers "unimplemented", as 2.6 does without AVX-512) and its kernel is faster
 * than widening the operands to f32 (loom__bf16_kernel_fast on oneDNN's effective ISA). Asked once: the answer is kept in *answer (0 until asked, then 1 or -1; a static the
 * caller owns). Builds nothing that stays and leaves the calling thread's last error as it was. */
bool loom__prim_probe_bf16(_Atomic int *answer, const loom__prim_key *key,
                           loom__prim_build_fn build);
/* Whether oneDNN's bf16 kernels beat widening to f32, given whether oneDNN's effective ISA has
 * AMX (amx) and the CPU's vendor: the per-CPU table of issue 27 (BENCHMARKS.md, "bf16 kernels
 * chosen by speed"). With AMX they run natively (Intel Sapphire/Emerald Rapids with AMX:
 * 2.7x the f32 MLP step); so does every non-Intel CPU (AMD Zen 4/5: full-rate VDPBF16PS, about
 * 2x f32); an Intel CPU without AMX widens (AVX512-BF16's VDPBF16PS issues at half the FMA
 * rate, so its peak is f32's, and oneDNN 2.6's avx512_core_bf16 kernels measured 1.4x slower
 * than f32 on the MLP step's GEMMs). LOOM_BF16_KERNELS=native|widen in the environment (read
 * once) overrides the table. */
bool loom__bf16_kernel_fast(bool amx, bool intel);

/* One buffer argument of a run: oneDNN's argument index (DNNL_ARG_SRC, ...) and the pointer. */
typedef struct loom__dnnl_buf {
  int arg;
  void *ptr;
} loom__dnnl_buf;

/* Runs the primitive on the calling thread over `n` caller buffers (laid out as the key
 * described), with a scratchpad allocated for this run. */
int loom__prim_run(const loom__prim *p, const char *who, int n, const loom__dnnl_buf *bufs);

/* Cache inspection and sizing (tests): entries held, lookups that hit and missed since start. */
typedef struct loom__prim_cache_stats {
  int64_t entries, capacity;
  uint64_t hits, misses, evictions;
} loom__prim_cache_info;
void loom__prim_cache_stats(loom__prim_cache_info *out);
/* Capacity in entries (1..LOOM__PRIM_CACHE_MAX); entries beyond it are evicted now, or when
 * the calls running them end. */
#define LOOM__PRIM_CACHE_MAX 512
int loom__prim_cache_set_capacity(int64_t capacity);

/* loom__malloc from the compute pool; on failure NULL with the message "<who>: out of memory
 * allocating <what> (<bytes> bytes)" set. */
void *loom__gemm_alloc(size_t bytes, const char *who, const char *what);
#define LOOM__GEMM_ALLOC(p, bytes, who, what)                                                      \
  do {                                                                                             \
    if (!((p) = loom__gemm_alloc((bytes), (who), (what)))) {                                       \
      rc = LOOM_ENOMEM;                                                                            \
      goto done;                                                                                   \
    }                                                                                              \
  } while (0)

#endif
