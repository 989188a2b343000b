/* reduce_int.h: the dist layer's combine kernels, one table per CPU level (reduce_scalar.c,
 * reduce_avx2.c, reduce_avx512.c), chosen by reduce.c from loom_cpu_level_active(). A kernel
 * folds b into a elementwise (a[i] = a[i] op b[i], i < n); a and b do not overlap. Every level
 * gives the same bits as the scalar reference: sums, products, minima and maxima are single
 * IEEE / two's-complement operations per element, and min/max keep the scalar's operand
 * order (x < y ? x : y), so NaN and signed zeros come out the same. The generic loops are
 * written once here and compiled per level with that level's ISA flags; f32 SUM, the
 * all-reduce's hot kernel, is hand-vectorised on the SIMD levels. Tables are immutable. */
#ifndef LOOM_DIST_REDUCE_INT_H
#define LOOM_DIST_REDUCE_INT_H

#include "dist/dist_int.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Elements per block of loom__reduce's accumulator (kernels are called with n <= this). */
#define LOOM__REDUCE_BLK 1024

typedef void (*loom__combine_fn)(void *a, const void *b, size_t n);
/* a[i] = a[i] / d (IEEE division, as the scalar's), i < n: LOOM_AVG's last step in f32. */
typedef void (*loom__div_fn)(float *a, size_t n, float d);

/* dsts[j][i] = (a[i] + b[i]) * s for j < ndst, i < n: the two-source f32 sum (s = 1) and
 * average (s = 0.5, exact), read once and written straight to every destination. A
 * destination may be a or b (same address). NULL on levels without one (reduce.c then goes
 * through its accumulator); gives the accumulator path's bits. */
typedef void (*loom__sum2_fn)(float *const *dsts, int ndst, const float *a, const float *b,
                              size_t n, float s);

/* The first elements of a two-source sum, one by one, up to where the first destination
 * reaches a cache line, so that the SIMD levels' stores write whole lines (a chunk of a rank's
 * buffer may start anywhere); returns how many it did. */
static inline size_t loom__sum2_head(float *const *dsts, int ndst, const float *a, const float *b,
                                     size_t n, float s) {
  uintptr_t d = (uintptr_t)dsts[0];
  size_t h = d % sizeof(float) ? 0 : (64 - (d & 63)) % 64 / sizeof(float);
  if (h > n) h = n;
  for (size_t i = 0; i < h; i++) {
    float x = (a[i] + b[i]) * s;
    for (int j = 0; j < ndst; j++) dsts[j][i] = x;
  }
  return h;
}

/* combine is indexed [accumulator kind][op]: 0 f32 (also f16/bf16 widened), 1 i32, 2 i64.
 * AVG entries combine as SUM; loom__reduce then divides (div_f32 for f32). */
typedef struct loom__reduce_kernels {
  loom__combine_fn combine[3][LOOM_REDOP_COUNT];
  loom__div_fn div_f32;
  loom__sum2_fn sum2_f32;
} loom__reduce_kernels;

/* The tables, the table of a level (tests compare levels with it) and the active level's
 * (core_int.h's kernel-table pattern). */
LOOM__KERNEL_TABLES(loom__reduce_kernels, loom__reduce_kernels, loom__reduce_kernels_for,
                    loom__reduce_k);

/* a[i] = EXPR(x = a[i], y = b[i]): a full block (constant trip count, so the compiler
 * vectorises it for the file's ISA) and a partial one. */
#define LOOM__COMBINE(T, NAME, EXPR)                                                           \
  static inline void NAME##_full(T *restrict a, const T *restrict b) {                         \
    for (size_t i = 0; i < LOOM__REDUCE_BLK; i++) {                                            \
      T x = a[i], y = b[i];                                                                    \
      a[i] = (EXPR);                                                                           \
    }                                                                                          \
  }                                                                                            \
  static inline void NAME##_part(T *restrict a, const T *restrict b, size_t n) {               \
    for (size_t i = 0; i < n; i++) {                                                           \
      T x = a[i], y = b[i];                                                                    \
      a[i] = (EXPR);                                                                           \
    }                                                                                          \
  }                                                                                            \
  static inline void NAME(void *a, const void *b, size_t n) {                                  \
    if (n == LOOM__REDUCE_BLK) NAME##_full(a, b);                                              \
    else NAME##_part(a, b, n);                                                                 \
  }

/* a[i] /= d: a full block (vectorised for the file's ISA) and a partial one. A power-of-two d
 * (2 ranks, 4, ...) multiplies by its exact reciprocal, which rounds the same exact quotient
 * and so gives the division's bits at a tenth of its cost; any other d divides. */
#define LOOM__DIV_F32                                                                          \
  static inline void div_f32_full(float *restrict a, float d) {                                \
    for (size_t i = 0; i < LOOM__REDUCE_BLK; i++) a[i] /= d;                                   \
  }                                                                                            \
  static inline void mul_f32_full(float *restrict a, float r) {                                \
    for (size_t i = 0; i < LOOM__REDUCE_BLK; i++) a[i] *= r;                                   \
  }                                                                                            \
  static inline void div_f32(float *a, size_t n, float d) {                                    \
    int e;                                                                                     \
    bool pow2 = isnormal(d) && frexpf(d, &e) == 0.5f && e > -125 && e < 126;                   \
    if (n == LOOM__REDUCE_BLK) {                                                               \
      if (pow2) mul_f32_full(a, 1.0f / d);                                                     \
      else div_f32_full(a, d);                                                                 \
      return;                                                                                  \
    }                                                                                          \
    for (size_t i = 0; i < n; i++) a[i] = pow2 ? a[i] * (1.0f / d) : a[i] / d;                 \
  }

#define LOOM__COMBINE_ALL(T, U, SFX)                                                           \
  LOOM__COMBINE(T, sum_##SFX, (T)((U)x + (U)y))                                                \
  LOOM__COMBINE(T, min_##SFX, x < y ? x : y)                                                   \
  LOOM__COMBINE(T, max_##SFX, x > y ? x : y)                                                   \
  LOOM__COMBINE(T, prod_##SFX, (T)((U)x * (U)y))

/* The generic kernels of every dtype and op (static, per including file), and a table of them
 * with f32 SUM/AVG taken from SUM_F32. */
#define LOOM__COMBINE_TABLE(NAME, SUM_F32) LOOM__COMBINE_TABLE2(NAME, SUM_F32, NULL)
#define LOOM__COMBINE_TABLE2(NAME, SUM_F32, SUM2_F32)                                                     \
  LOOM__COMBINE_ALL(float, float, f32)                                                         \
  LOOM__COMBINE_ALL(int32_t, uint32_t, i32)                                                    \
  LOOM__COMBINE_ALL(int64_t, uint64_t, i64)                                                    \
  LOOM__DIV_F32                                                                                \
  const loom__reduce_kernels NAME = {{                                                         \
      {[LOOM_SUM] = SUM_F32, [LOOM_AVG] = SUM_F32, [LOOM_MIN] = min_f32,                       \
       [LOOM_MAX] = max_f32, [LOOM_PROD] = prod_f32},                                          \
      {[LOOM_SUM] = sum_i32, [LOOM_AVG] = sum_i32, [LOOM_MIN] = min_i32,                       \
       [LOOM_MAX] = max_i32, [LOOM_PROD] = prod_i32},                                          \
      {[LOOM_SUM] = sum_i64, [LOOM_AVG] = sum_i64, [LOOM_MIN] = min_i64,                       \
       [LOOM_MAX] = max_i64, [LOOM_PROD] = prod_i64},                                          \
  }, div_f32, SUM2_F32}

#endif
