/* test_norm_levels.c: layer norm's loops (forward, dx, dw and db) on every CPU level this
 * machine has, against the scalar reference table, at ragged widths, with and without weight
 * and bias; and the op itself, run with each level active and with 1 and 2 threads. */
#include "lt.h"
#include "ops/gemm.h"
#include "ops/norm_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int close_to(float a, float ref) { return fabsf(a - ref) <= 2e-5f * (1 + fabsf(ref)); }

LT_TEST(norm_kernels_every_level_matches_scalar) {
  const loom__norm_kernels *ref = loom__norm_kernels_for(LOOM_CPU_SCALAR);
  enum { R = 5, CMAX = 131 };
  static float x[R * CMAX], dy[R * CMAX], w[CMAX], b[CMAX], y0[R * CMAX], y1[R * CMAX],
      s0[2 * R], s1[2 * R], dx0[R * CMAX], dx1[R * CMAX], dw0[CMAX], dw1[CMAX], db0[CMAX],
      db1[CMAX];
  int levels = 0;
  for (int i = 0; i < R * CMAX; i++) {
    x[i] = (float)((i * 37) % 101) / 12.5f - 3.0f + (float)(i % 7);
    dy[i] = (float)((i * 13) % 29) / 7.0f - 2.0f;
  }
  for (int i = 0; i < CMAX; i++) w[i] = 0.5f + (float)(i % 5) / 4, b[i] = (float)(i % 3) - 1;
  for (int lv = LOOM_CPU_AVX2; lv < LOOM_CPU_LEVEL_COUNT; lv++) {
    if (!loom_cpu_supports((loom_cpu_level)lv)) continue;
    levels++;
    const loom__norm_kernels *k = loom__norm_kernels_for((loom_cpu_level)lv);
    const char *name = loom_cpu_level_name((loom_cpu_level)lv);
    for (size_t C = 1; C <= CMAX; C += C < 20 ? 1 : 37) {
      for (int wb = 0; wb < 4; wb++) {
        const float *wp = wb & 1 ? w : NULL, *bp = wb & 2 ? b : NULL;
        ref->fwd(y0, s0, x, wp, bp, 0, R, C, 1e-5f);
        k->fwd(y1, s1, x, wp, bp, 0, R, C, 1e-5f);
        ref->bwd_dx(dx0, dy, x, wp, s0, 0, R, C);
        k->bwd_dx(dx1, dy, x, wp, s0, 0, R, C);
        for (size_t i = 0; i < C; i++) dw0[i] = dw1[i] = db0[i] = db1[i] = 0.25f;
        ref->bwd_dwb(dw0, db0, dy, x, s0, R, C, 0, C);
        k->bwd_dwb(dw1, db1, dy, x, s0, R, C, C / 2, C); /* columns in two calls, any split */
        k->bwd_dwb(dw1, db1, dy, x, s0, R, C, 0, C / 2);
        for (size_t i = 0; i < 2 * R; i++)
          if (!close_to(s1[i], s0[i]))
            lt_fail_at(__FILE__, __LINE__, "%s C=%zu stats[%zu] %g vs %g", name, C, i, s1[i],
                       s0[i]);
        for (size_t i = 0; i < R * C; i++)
          if (!close_to(y1[i], y0[i]) || !close_to(dx1[i], dx0[i]))
            lt_fail_at(__FILE__, __LINE__, "%s C=%zu wb=%d [%zu]: y %g vs %g, dx %g vs %g",
                       name, C, wb, i, y1[i], y0[i], dx1[i], dx0[i]);
        for (size_t i = 0; i < C; i++)
          if (!close_to(dw1[i], dw0[i]) || db1[i] != db0[i])
            lt_fail_at(__FILE__, __LINE__, "%s C=%zu [%zu]: dw %g vs %g, db %g vs %g", name, C,
                       i, dw1[i], dw0[i], db1[i], db0[i]);
      }
    }
  }
  if (!levels) lt_skip("no SIMD level on this CPU");
}

LT_TEST(norm_op_agrees_across_levels_and_thread_counts) {
  /* forward and backward of the op (rows and columns split over the team), every level with
   * 1 and 2 threads against scalar with 1 thread; each level's results the same bits with 1
   * and 2 threads */
  enum { R = 300, C = 384, N = R * C };
  int64_t shape[] = {R, C}, wshape[] = {C};
  loom_tensor *x = NULL, *w = NULL, *b = NULL;
  LT_OK(loom_tensor_empty(LOOM_F32, 2, shape, &x));
  LT_OK(loom_tensor_empty(LOOM_F32, 1, wshape, &w));
  LT_OK(loom_tensor_empty(LOOM_F32, 1, wshape, &b));
  float *xp = loom_tensor_data(x), *wp = loom_tensor_data(w), *bp = loom_tensor_data(b);
  for (int i = 0; i < N; i++) xp[i] = (float)((i * 37) % 101) / 25.0f - 2.0f;
  for (int i = 0; i < C; i++) wp[i] = 1.0f + (float)(i % 5) / 8, bp[i] = (float)(i % 3) / 4;
  LT_OK(loom_tensor_set_requires_grad(x, true));
  LT_OK(loom_tensor_set_requires_grad(w, true));
  LT_OK(loom_tensor_set_requires_grad(b, true));
  size_t bytes = sizeof(float) * (2 * N + 2 * C);
  float *ref = malloc(bytes), *got = malloc(bytes);
  LT_TRUE(ref && got);
  loom_cpu_level keep = loom_cpu_level_active();
  int keep_threads = loom__gemm_threads();
  for (int lv = 0; lv < LOOM_CPU_LEVEL_COUNT; lv++) {
    if (!loom_cpu_supports((loom_cpu_level)lv)) continue;
    LT_OK(loom_set_cpu_level((loom_cpu_level)lv));
    float *one = malloc(bytes);
    LT_TRUE(one != NULL);
    for (int th = 1; th <= 2; th++) {
      LT_OK(loom_set_num_threads(th));
      float *dst = lv == 0 && th == 1 ? ref : th == 1 ? one : got;
      loom_tensor *y = NULL, *loss = NULL;
      loom_tensor_zero_grad(x), loom_tensor_zero_grad(w), loom_tensor_zero_grad(b);
      LT_OK(loom_layer_norm(x, 1, w, b, 1e-5, &y));
      loom_tensor *sq = NULL; /* loss sum(y^2): every row and column has its own gradient */
      LT_OK(loom_mul(y, y, &sq));
      LT_OK(loom_sum(sq, NULL, 0, false, &loss));
      LT_OK(loom_backward(loss, NULL, false));
      memcpy(dst, loom_tensor_data(y), sizeof(float) * N);
      memcpy(dst + N, loom_tensor_data(loom_tensor_grad(x)), sizeof(float) * N);
      memcpy(dst + 2 * N, loom_tensor_data(loom_tensor_grad(w)), sizeof(float) * C);
      memcpy(dst + 2 * N + C, loom_tensor_data(loom_tensor_grad(b)), sizeof(float) * C);
      loom_tensor_free(loss), loom_tensor_free(sq), loom_tensor_free(y);
      if (th == 2 && lv > 0)
        for (int i = 0; i < 2 * N + 2 * C; i++) LT_NEAR(got[i], ref[i], 1e-4 * (1 + fabs(ref[i])));
      if (th == 2 && lv > 0) LT_TRUE(memcmp(got, one, bytes) == 0);
      if (th == 2 && lv == 0) LT_TRUE(memcmp(got, ref, bytes) == 0);
    }
    free(one);
  }
  loom_set_cpu_level(keep);
  loom_set_num_threads(keep_threads);
  free(ref), free(got);
  loom_tensor_free(x), loom_tensor_free(w), loom_tensor_free(b);
}
