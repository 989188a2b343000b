/* test_amp_lazy_grad.c: the AMP calls that read gradients settle a pending lazy zero
 * (loom_tensor_zero_grad_lazy) themselves, now that loom_tensor_grad is a pure getter: a
 * parameter the step's backward does not reach, whose buffer still holds an old inf, is
 * unscaled and checked as the zeros it logically is (no overflow reported, zeros in its
 * buffer), by both the unscaling and the checking hooks. */
#include "lt.h"
#include "amp/amp_int.h"

#include <math.h>

/* w (reached by the loss) and u (not reached, its old gradient inf and lazily zeroed). */
static void lazy_unreached(bool checking) {
  loom_scaler *s = NULL;
  LT_OK(loom_scaler_create_dynamic(NULL, &s));
  const int64_t n = 4;
  loom_tensor *w = NULL, *u = NULL, *ug = NULL, *loss = NULL;
  LT_OK(loom_tensor_from_data(LOOM_F32, 1, &n, (float[]){1, 2, 3, 4}, &w));
  LT_OK(loom_tensor_zeros(LOOM_F32, 1, &n, &u));
  LT_OK(loom_tensor_from_data(LOOM_F32, 1, &n, (float[]){INFINITY, 1, 2, 3}, &ug));
  LT_OK(loom_tensor_set_requires_grad(w, true));
  LT_OK(loom_tensor_set_requires_grad(u, true));
  LT_OK(loom_tensor_set_grad(u, ug)); /* an old gradient holding inf ... */
  LT_OK(loom_tensor_zero_grad_lazy(u)); /* ... zeroed lazily: logically zero, not written */
  loom_tensor *ps[2] = {w, u};
  loom_amp_unscale_hooks *h = NULL;
  LT_OK((checking ? loom_amp_check_hooks_create : loom__amp_unscale_hooks_create)(s, ps, 2, &h));
  LT_OK(loom_amp_unscale_hooks_arm(h));
  LT_OK(loom_sum(w, NULL, 0, false, &loss));
  LT_OK(loom_backward_amp(loss, s, false));
  LT_TRUE(loom_tensor_grad(u) == ug); /* the getter wrote nothing: the buffer is the same */
  bool found = true;
  LT_OK(loom_amp_unscale_hooks_finish(h, &found));
  LT_TRUE(!found); /* the old inf is not this step's gradient */
  const float *g = loom_tensor_data(ug);
  for (int i = 0; i < n; i++) LT_NEAR(g[i], 0, 0); /* settled: zeros */
  const float *gw = loom_tensor_data(loom_tensor_grad(w));
  float scale = checking ? loom_scaler_get_scale(s) : 1.0f; /* checking leaves it scaled */
  for (int i = 0; i < n; i++) LT_NEAR(gw[i], scale, 0);
  loom_amp_unscale_hooks_free(h);
  loom_tensor *ts[] = {w, u, ug, loss};
  for (int i = 0; i < 4; i++) loom_tensor_free(ts[i]);
  loom_scaler_free(s);
}

LT_TEST(amp_unscale_hooks_settle_an_unreached_lazy_zero) { lazy_unreached(false); }
LT_TEST(amp_check_hooks_settle_an_unreached_lazy_zero) { lazy_unreached(true); }
