/* test_ce_levels.c: cross entropy (its rows on the per-level row kernels of attn_int.h, its
 * backward rows over the thread team) at every CPU level and with 1 and 2 threads, against
 * the scalar level: loss and logits' gradient, rows wider than the stack scratch, an ignored
 * label, huge and -inf logits. */
#include "lt.h"
#include "ops/gemm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { N = 70, C = 1100 }; /* C over two scratch blocks of 512 */

/* The mean loss and the gradient of the logits into out[0], out[1..N*C]. */
static void ce_run(loom_tensor *x, loom_tensor *lab, float *out) {
  loom_tensor *loss = NULL;
  loom_tensor_zero_grad(x);
  LT_OK(loom_cross_entropy(x, lab, LOOM_REDUCTION_MEAN, 3, &loss));
  LT_OK(loom_backward(loss, NULL, false));
  out[0] = *(const float *)loom_tensor_data(loss);
  memcpy(out + 1, loom_tensor_data(loom_tensor_grad(x)), sizeof(float) * N * C);
  loom_tensor_free(loss);
}

LT_TEST(cross_entropy_every_level_and_thread_count_matches_scalar) {
  int64_t xs[] = {N, C}, ls[] = {N};
  loom_tensor *x = NULL, *lab = NULL;
  LT_OK(loom_tensor_empty(LOOM_F32, 2, xs, &x));
  LT_OK(loom_tensor_empty(LOOM_I32, 1, ls, &lab));
  float *xp = loom_tensor_data(x);
  int32_t *lp = loom_tensor_data(lab);
  for (int i = 0; i < N * C; i++) xp[i] = (float)((i * 37) % 211) / 20.0f - 5.0f;
  xp[5 * C + 7] = 80.0f, xp[6 * C + 9] = -INFINITY, xp[6 * C + 10] = -1e30f;
  for (int i = 0; i < N; i++) lp[i] = (i * 101) % C;
  lp[4] = 3; /* the ignore index */
  LT_OK(loom_tensor_set_requires_grad(x, true));
  float *ref = malloc(sizeof(float) * (1 + N * C)), *got = malloc(sizeof(float) * (1 + N * C));
  LT_TRUE(ref && got);
  loom_cpu_level keep = loom_cpu_level_active();
  int keep_threads = loom__gemm_threads();
  LT_OK(loom_set_cpu_level(LOOM_CPU_SCALAR));
  LT_OK(loom_set_num_threads(1));
  ce_run(x, lab, ref);
  for (int lv = 0; lv < LOOM_CPU_LEVEL_COUNT; lv++)
    for (int th = 1; th <= 2 && loom_cpu_supports((loom_cpu_level)lv); th++) {
      LT_OK(loom_set_cpu_level((loom_cpu_level)lv));
      LT_OK(loom_set_num_threads(th));
      ce_run(x, lab, got);
      for (int i = 0; i < 1 + N * C; i++)
        if (!(fabsf(got[i] - ref[i]) <= 1e-6f * (1 + fabsf(ref[i]))))
          lt_fail_at(__FILE__, __LINE__, "level %s, %d threads, [%d]: %g vs scalar %g",
                     loom_cpu_level_name((loom_cpu_level)lv), th, i, got[i], ref[i]);
    }
  loom_set_cpu_level(keep);
  loom_set_num_threads(keep_threads);
  free(ref), free(got);
  loom_tensor_free(x), loom_tensor_free(lab);
}
