/* reduce.c: the reductions of the collectives: dst = op over sources, in source order, for
 * every dtype and operator. Work goes block by block through a small accumulator that stays
 * in L1, so dst may be one of the sources, and f16/bf16 are widened to f32 (the core
 * conversion kernels), combined in f32 and rounded once. The combine kernels are the CPU
 * level's table (reduce_int.h). */
#include "dist/reduce_int.h"

#include <string.h>

#define BLK LOOM__REDUCE_BLK

LOOM__KERNEL_PICKERS(loom__reduce_kernels, loom__reduce_kernels, loom__reduce_kernels_for,
                     loom__reduce_k)

void loom__reduce(void *dst, const void *const *srcs, int nsrc, size_t n, loom_dtype dt,
                  loom_redop op) {
  loom__reduce_to_all(&dst, 1, srcs, nsrc, n, dt, op);
}

void loom__reduce_to_all(void *const *dsts, int ndst, const void *const *srcs, int nsrc,
                         size_t n, loom_dtype dt, loom_redop op) {
  if (loom__dry()) return;
  size_t es = loom_dtype_size(dt);
  bool half = dt == LOOM_F16 || dt == LOOM_BF16;
  int kind = dt == LOOM_I32 ? 1 : dt == LOOM_I64 ? 2 : 0;
  const loom__reduce_kernels *kt = loom__reduce_k();
  loom__combine_fn f = kt->combine[kind][op];
  if (kt->sum2_f32 && dt == LOOM_F32 && nsrc == 2 && (op == LOOM_SUM || op == LOOM_AVG)) {
    kt->sum2_f32((float *const *)dsts, ndst, srcs[0], srcs[1], n, op == LOOM_AVG ? 0.5f : 1.0f);
    return;
  }
  _Alignas(64) unsigned char acc[BLK * 8], tmp[BLK * 4];
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
      if (kind == 0) kt->div_f32((float *)acc, m, (float)nsrc);
      else if (kind == 1)
        for (size_t i = 0; i < m; i++) ((int32_t *)acc)[i] /= nsrc;
      else
        for (size_t i = 0; i < m; i++) ((int64_t *)acc)[i] /= nsrc;
    }
    const void *out = acc;
    if (half) { /* round once, copy the rounded block to every destination */
      loom__narrow(dt, (float *)acc, tmp, m);
      out = tmp;
    }
    for (int j = 0; j < ndst; j++) memcpy((char *)dsts[j] + off * es, out, m * es);
  }
}
