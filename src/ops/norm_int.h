/* norm_int.h: layer norm's row and column loops (norm.c runs them over its thread team), one
 * table per CPU level: norm_body.h compiled as the scalar reference (norm_scalar.c, never
 * vectorized) and for AVX2 and AVX-512 (norm_avx2.c, norm_avx512.c, vectorized). Every level
 * sums a row in the same order (16 running sums, then added in order), so levels differ only
 * by fused multiply-adds; tests compare each level with scalar. */
#ifndef LOOM_OPS_NORM_INT_H
#define LOOM_OPS_NORM_INT_H

#include "core/core_int.h"
#include "loom/cpu.h"

#include <stddef.h>

typedef struct loom__norm_kernels {
  /* rows [r0, r1) of C: y = (x - mean) * rstd * w + b (w, b may be NULL: 1, 0), and each
   * row's mean and rstd = 1 / sqrt(var + eps) into stats[2r], stats[2r + 1]. */
  void (*fwd)(float *y, float *stats, const float *x, const float *w, const float *b,
              size_t r0, size_t r1, size_t C, float eps);
  /* rows [r0, r1): dx = rstd (dn - mean(dn) - norm mean(dn norm)), dn = dy * w (w may be
   * NULL), norm = (x - mean) * rstd. */
  void (*bwd_dx)(float *dx, const float *dy, const float *x, const float *w,
                 const float *stats, size_t r0, size_t r1, size_t C);
  /* columns [c0, c1), over all R rows in order: dw[i] += dy * norm, db[i] += dy (either may
   * be NULL). */
  void (*bwd_dwb)(float *dw, float *db, const float *dy, const float *x, const float *stats,
                  size_t R, size_t C, size_t c0, size_t c1);
} loom__norm_kernels;

LOOM__KERNEL_TABLES(loom__norm_kernels, loom__norm_kernels, loom__norm_kernels_for,
                    loom__norm_k);

#endif
