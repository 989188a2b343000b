/* reduce.c: the reduction kernels of the collectives: dst = op over sources, in source order,
 * for every dtype and operator. Work goes block by block through a small accumulator that
 * stays in L1, so dst may be one of the sources, and f16/bf16 are widened to f32 (the core
 * conversion kernels), combined in f32 and rounded once. Full blocks have a constant trip
 * count so the compiler vectorises them at -O2. */
#include "dist/dist_int.h"

#include <string.h>

#define BLK 1024

/* a[i] = EXPR(x = a[i], y = b[i]) over a full block and over a partial one. */
#define COMBINE(T, NAME, EXPR)                                                                \
  static void NAME##_full(T *restrict a, const T *restrict b) {                               \
    for (size_t i = 0; i < BLK; i++) {                                                        \
      T x = a[i], y = b[i];                                                                   \
      a[i] = (EXPR);                                                                          \
    }                                                                                         \
  }                                                                                           \
  static void NAME##_part(T *restrict a, const T *restrict b, size_t n) {                     \
    for (size_t i = 0; i < n; i++) {                                                          \
      T x = a[i], y = b[i];                                                                   \
      a[i] = (EXPR);                                                                          \
    }                                                                                         \
  }                                                                                           \
  static void NAME(void *a, const void *b, size_t n) {                                        \
    if (n == BLK) NAME##_full(a, b);                                                          \
    else NAME##_part(a, b, n);                                                                \
  }

#define COMBINE_ALL(T, U, SFX)                                                                \
  COMBINE(T, sum_##SFX, (T)((U)x + (U)y))                                                     \
  COMBINE(T, min_##SFX, x < y ? x : y)                                                        \
  COMBINE(T, max_##SFX, x > y ? x : y)                                                        \
  COMBINE(T, prod_##SFX, (T)((U)x * (U)y))

COMBINE_ALL(float, float, f32)
COMBINE_ALL(int32_t, uint32_t, i32)
COMBINE_ALL(int64_t, uint64_t, i64)

typedef void (*combine_fn)(void *a, const void *b, size_t n);

/* Indexed [accumulator kind][op]: 0 f32, 1 i32, 2 i64. AVG combines as SUM. */
static const combine_fn combine[3][LOOM_REDOP_COUNT] = {
    {[LOOM_SUM] = sum_f32, [LOOM_AVG] = sum_f32, [LOOM_MIN] = min_f32, [LOOM_MAX] = max_f32,
     [LOOM_PROD] = prod_f32},
    {[LOOM_SUM] = sum_i32, [LOOM_AVG] = sum_i32, [LOOM_MIN] = min_i32, [LOOM_MAX] = max_i32,
     [LOOM_PROD] = prod_i32},
    {[LOOM_SUM] = sum_i64, [LOOM_AVG] = sum_i64, [LOOM_MIN] = min_i64, [LOOM_MAX] = max_i64,
     [LOOM_PROD] = prod_i64},
};

static void avg_f32(float *a, size_t n, int div) {
  float d = (float)div;
  for (size_t i = 0; i < n; i++) a[i] /= d;
}

void loom__widen(loom_dtype dt, const void *src, float *dst, size_t n) {
  if (dt == LOOM_F16) loom_cvt_f16_to_f32(src, dst, n);
  else loom_cvt_bf16_to_f32(src, dst, n);
}
void loom__narrow(loom_dtype dt, const float *src, void *dst, size_t n) {
  if (dt == LOOM_F16) loom_cvt_f32_to_f16(src, dst, n);
  else loom_cvt_f32_to_bf16(src, dst, n);
}

void loom__reduce(void *dst, const void *const *srcs, int nsrc, size_t n, loom_dtype dt,
                  loom_redop op) {
  size_t es = loom_dtype_size(dt);
  bool half = dt == LOOM_F16 || dt == LOOM_BF16;
  int kind = dt == LOOM_I32 ? 1 : dt == LOOM_I64 ? 2 : 0;
  combine_fn f = combine[kind][op];
  _Alignas(64) unsigned char acc[BLK * 8], tmp[BLK * 4];
  size_t acc_es = half ? 4 : es;
  for (size_t off = 0; off < n; off += BLK) {
    size_t m = n - off < BLK ? n - off : BLK;
    if (half) loom__widen(dt, (const char *)srcs[0] + off * es, (float *)acc, m);
    else memcpy(acc, (const char *)srcs[0] + off * es, m * es);
    for (int k = 1; k < nsrc; k++) {
      const void *s = (const char *)srcs[k] + off * es;
      if (half) {
        loom__widen(dt, s, (float *)tmp, m);
        s = tmp;
      }
      f(acc, s, m);
    }
    if (op == LOOM_AVG) {
      if (kind == 0) avg_f32((float *)acc, m, nsrc);
      else if (kind == 1)
        for (size_t i = 0; i < m; i++) ((int32_t *)acc)[i] /= nsrc;
      else
        for (size_t i = 0; i < m; i++) ((int64_t *)acc)[i] /= nsrc;
    }
    if (half) loom__narrow(dt, (float *)acc, (char *)dst + off * es, m);
    else memcpy((char *)dst + off * es, acc, m * acc_es);
  }
}
