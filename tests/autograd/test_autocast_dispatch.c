/* test_autocast_dispatch.c: ops consult autocast at dispatch: under a bf16 region a linear of
 * f32 tensors runs in bf16 while the f32 parameters get f32 gradients (the casts are on the
 * tape), a loss runs in f32, a parameter used twice is cast once (cached for the region), and
 * op kinds are the first autocast kinds with the same names. */
#include "lt.h"
#include "loom/autocast.h"

LT_TEST(autocast_kinds_match_ops) {
  for (int k = 0; k < LOOM_OPK_COUNT; k++)
    LT_STREQ(loom_op_kind_name((loom_op_kind)k), loom_amp_op_name((loom_amp_op)k));
}

LT_TEST(autocast_bf16_linear_gives_f32_gradients) {
  float wv[6] = {0.5f, -1, 2, 0.25f, 1, -0.5f}, xv[6] = {1, 2, 3, -1, 0.5f, 2};
  loom_tensor *w = NULL, *x = NULL, *y = NULL, *y2 = NULL, *s = NULL, *l = NULL;
  LT_OK(loom_tensor_from_data(LOOM_F32, 2, (int64_t[]){2, 3}, wv, &w));
  LT_OK(loom_tensor_from_data(LOOM_F32, 2, (int64_t[]){2, 3}, xv, &x));
  LT_OK(loom_tensor_set_requires_grad(w, true));
  loom_autocast_token tok;
  LT_OK(loom_autocast_enter(LOOM_AUTOCAST_BF16, NULL, &tok));
  LT_OK(loom_linear(x, w, NULL, &y));
  LT_EQ(loom_tensor_dtype(y), LOOM_BF16);
  LT_OK(loom_linear(x, w, NULL, &y2)); /* w again: the cached cast */
  LT_OK(loom_add(y, y2, &s));
  LT_OK(loom_sum(s, NULL, 0, false, &l));
  LT_OK(loom_autocast_exit(&tok));
  LT_OK(loom_backward(l, NULL, false));
  loom_tensor *g = loom_tensor_grad(w);
  LT_TRUE(g != NULL);
  LT_EQ(loom_tensor_dtype(g), LOOM_F32);
  /* d/dW sum(x W^T) twice = 2 * column sums of x */
  const float *gp = loom_tensor_data(g);
  for (int o = 0; o < 2; o++)
    for (int i = 0; i < 3; i++) LT_NEAR(gp[o * 3 + i], 2 * (xv[i] + xv[3 + i]), 1e-2);
  loom_tensor *ts[] = {w, x, y, y2, s, l};
  for (int i = 0; i < 6; i++) loom_tensor_free(ts[i]);
}
