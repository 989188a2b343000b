/* test_scaler_deferred.c: the deferred unscale of a scaler (loom_scaler_check +
 * loom_scaler_grad_scale): the step order (check once, the factor only between check/unscale
 * and update), a read-only check that reports what unscale would (inf, NaN, and products that
 * overflow for a scale below 1), and its errors. Training with it is in test_amp_train.c. */
#include "lt.h"

#include <math.h>
#include <string.h>

static loom_scaler *small_scaler(void) {
  loom_dynamic_scaler_cfg c = {8, 2, 0.5f, 3, 1, 64, true};
  loom_scaler *s = NULL;
  LT_OK(loom_scaler_create_dynamic(&c, &s));
  return s;
}

LT_TEST(scaler_check_step_order_is_enforced) {
  loom_scaler *s = small_scaler();
  float g[3] = {8, 16, -24}, keep[3];
  memcpy(keep, g, sizeof g);
  loom_tensor *t = NULL;
  LT_OK(loom_tensor_wrap(LOOM_F32, 1, (int64_t[]){3}, g, &t));
  bool found = true;
  float gs = 0, loss = 1;
  LT_ERR(loom_scaler_check(s, &t, 1, &found), LOOM_EMISUSE, "no loss was scaled");
  LT_ERR(loom_scaler_grad_scale(s, &gs), LOOM_EMISUSE, "neither unscaled nor checked");
  LT_OK(loom_scaler_scale_value(s, &loss));
  LT_ERR(loom_scaler_grad_scale(s, &gs), LOOM_EMISUSE, "neither unscaled nor checked");
  LT_OK(loom_scaler_check(s, &t, 1, &found));
  LT_TRUE(!found);
  LT_TRUE(memcmp(g, keep, sizeof g) == 0); /* read only */
  LT_OK(loom_scaler_grad_scale(s, &gs));
  LT_TRUE(gs == 0.125f); /* 1/8 */
  LT_ERR(loom_scaler_check(s, &t, 1, &found), LOOM_EMISUSE, "already checked for a deferred");
  LT_ERR(loom_scaler_unscale(s, &t, 1, &found), LOOM_EMISUSE, "already checked");
  LT_ERR(loom_scaler_scale_value(s, &loss), LOOM_EMISUSE, "already checked");
  LT_TRUE(memcmp(g, keep, sizeof g) == 0);
  LT_OK(loom_scaler_update(s, found));
  LT_ERR(loom_scaler_grad_scale(s, &gs), LOOM_EMISUSE, "before loom_scaler_update");
  LT_ERR(loom_scaler_check(s, &t, 1, &found), LOOM_EMISUSE, "no loss was scaled");
  /* after an in-place unscale the optimizer has nothing left to apply; check is refused */
  LT_OK(loom_scaler_scale_value(s, &loss));
  LT_OK(loom_scaler_unscale(s, &t, 1, &found));
  LT_OK(loom_scaler_grad_scale(s, &gs));
  LT_TRUE(gs == 1.0f);
  LT_ERR(loom_scaler_check(s, &t, 1, &found), LOOM_EMISUSE, "already unscaled");
  LT_OK(loom_scaler_update(s, found));
  /* a skipped step: check finds the inf, update backs off */
  g[1] = INFINITY;
  LT_OK(loom_scaler_scale_value(s, &loss));
  LT_OK(loom_scaler_check(s, &t, 1, &found));
  LT_TRUE(found);
  LT_OK(loom_scaler_update(s, found));
  LT_NEAR(loom_scaler_get_scale(s), 4, 0);
  loom_tensor_free(t);
  loom_scaler_free(s);
}

/* The flag equals unscale's on the same gradients: NaN, inf, f16/bf16, NULL entries, strided
 * views, and a scale below 1 whose products overflow although every stored value is finite
 * (f16 products that overflow only f16, not f32, are left out: deferred, they stay finite). */
LT_TEST(scaler_check_flag_equals_unscale_flag) {
  struct { float scale; float v; loom_dtype dt; } cases[] = {
      {1024, 1.5f, LOOM_F32},       {1024, NAN, LOOM_F32},      {1024, -INFINITY, LOOM_F32},
      {1024, 3e38f, LOOM_F32},      {0.5f, 3e38f, LOOM_F32},    {0.5f, 1e38f, LOOM_F32},
      {0.25f, 1e38f, LOOM_F32},     {0.5f, 30000.f, LOOM_F16},
      {1024, INFINITY, LOOM_F16},   {0.5f, 3e38f, LOOM_BF16},   {1024, NAN, LOOM_BF16},
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    bool flag[2];
    for (int path = 0; path < 2; path++) {
      loom_scaler *s = NULL;
      LT_OK(loom_scaler_create_static(cases[c].scale, &s));
      loom_tensor *base = NULL, *view = NULL;
      LT_OK(loom_tensor_zeros(cases[c].dt, 2, (int64_t[]){4, 5}, &base));
      LT_OK(loom_tensor_set(base, (int64_t[]){3, 1}, cases[c].v));
      LT_OK(loom_tensor_transpose(base, 0, 1, &view)); /* strided */
      loom_tensor *list[3] = {NULL, base, view};
      float loss = 1;
      LT_OK(loom_scaler_scale_value(s, &loss));
      if (path) LT_OK(loom_scaler_check(s, list + (c & 1), 2 - (c & 1), &flag[1]));
      else LT_OK(loom_scaler_unscale(s, list + 1, 1, &flag[0]));
      loom_tensor_free(view);
      loom_tensor_free(base);
      loom_scaler_free(s);
    }
    if (flag[0] != flag[1])
      lt_fail_at(__FILE__, __LINE__, "case %zu (scale %g, value %g, %s): unscale %d, check %d",
                 c, (double)cases[c].scale, (double)cases[c].v, loom_dtype_name(cases[c].dt),
                 flag[0], flag[1]);
  }
}

LT_TEST(scaler_check_errors) {
  loom_scaler *s = small_scaler();
  loom_tensor *i32 = NULL, *f = NULL;
  LT_OK(loom_tensor_zeros(LOOM_I32, 1, (int64_t[]){2}, &i32));
  LT_OK(loom_tensor_zeros(LOOM_F32, 1, (int64_t[]){2}, &f));
  float loss = 1, gs;
  bool found;
  LT_OK(loom_scaler_scale_value(s, &loss));
  loom_tensor *list[2] = {f, i32};
  LT_ERR(loom_scaler_check(s, list, 2, &found), LOOM_EDTYPE, "loom_scaler_check: tensor 1 has "
         "dtype i32");
  LT_ERR(loom_scaler_check(s, NULL, 2, &found), LOOM_EINVAL, "tensor list is NULL");
  LT_ERR(loom_scaler_check(NULL, list, 1, &found), LOOM_EINVAL, "loom_scaler_check: scaler is "
         "NULL");
  LT_ERR(loom_scaler_grad_scale(s, NULL), LOOM_EINVAL, "out is NULL");
  LT_ERR(loom_scaler_grad_scale(NULL, &gs), LOOM_EINVAL, "scaler is NULL");
  LT_OK(loom_scaler_check(s, list, 1, NULL)); /* the refused calls did not close the step */
  loom_tensor_free(i32);
  loom_tensor_free(f);
  loom_scaler_free(s);
}

/* The check hooks over a linear layer: what the gradient bounds let them skip gives the same
 * flag as loom_scaler_check reading every gradient (finite; an inf input; finite inputs whose
 * weight gradient overflows, which no bound covers; a static scale below 1 whose unscaled
 * gradients would overflow although every stored value is finite). */
static bool hooks_flag(loom_scaler *s, float x00, float c00, bool *ref) {
  enum { R = 4, I = 5, O = 3 };
  float xv[R * I], wv[O * I], cv[R * O];
  for (int i = 0; i < R * I; i++) xv[i] = (float)((i * 7) % 11 - 5) / 4.0f;
  for (int i = 0; i < O * I; i++) wv[i] = (float)((i * 5) % 9 - 4) / 8.0f;
  for (int i = 0; i < R * O; i++) cv[i] = (float)((i * 3) % 7 - 3) / 2.0f;
  for (int r = 0; r < R; r++) xv[r * I] = x00, cv[r * O] = c00;
  loom_tensor *x = NULL, *w = NULL, *c = NULL, *y = NULL, *p = NULL, *l = NULL;
  LT_OK(loom_tensor_from_data(LOOM_F32, 2, (int64_t[]){R, I}, xv, &x));
  LT_OK(loom_tensor_from_data(LOOM_F32, 2, (int64_t[]){O, I}, wv, &w));
  LT_OK(loom_tensor_from_data(LOOM_F32, 2, (int64_t[]){R, O}, cv, &c));
  LT_OK(loom_tensor_set_requires_grad(w, true));
  loom_amp_unscale_hooks *h = NULL;
  LT_OK(loom_amp_check_hooks_create(s, &w, 1, &h));
  LT_OK(loom_amp_unscale_hooks_arm(h));
  LT_OK(loom_linear(x, w, NULL, &y));
  LT_OK(loom_mul(y, c, &p));
  LT_OK(loom_sum(p, NULL, 0, false, &l));
  LT_OK(loom_backward_amp(l, s, false));
  bool found = false;
  LT_OK(loom_amp_unscale_hooks_finish(h, &found));
  LT_OK(loom_scaler_update(s, found));
  /* the reference: the same gradient through loom_scaler_check */
  loom_tensor *g = loom_tensor_grad(w);
  float loss = 1;
  LT_OK(loom_scaler_scale_value(s, &loss));
  LT_OK(loom_scaler_check(s, &g, 1, ref));
  LT_OK(loom_scaler_update(s, *ref));
  loom_amp_unscale_hooks_free(h);
  loom_tensor_free(x), loom_tensor_free(w), loom_tensor_free(c);
  loom_tensor_free(y), loom_tensor_free(p), loom_tensor_free(l);
  return found;
}

LT_TEST(scaler_check_hooks_with_gradient_bounds_match_a_full_check) {
  loom_scaler *s = NULL;
  LT_OK(loom_scaler_create_static(1024, &s));
  bool ref = true;
  LT_TRUE(!hooks_flag(s, 1.0f, 1.0f, &ref) && !ref);        /* bounded: nothing read */
  LT_TRUE(hooks_flag(s, INFINITY, 1.0f, &ref) && ref);      /* known non-finite */
  LT_TRUE(hooks_flag(s, 1e18f, 1e18f, &ref) && ref);        /* 4 * 1e36 * 1024 overflows */
  loom_scaler_free(s);
  LT_OK(loom_scaler_create_static(1.0f / 1024, &s));        /* inv 1024 */
  LT_TRUE(hooks_flag(s, 1e19f, 2.56e19f, &ref) && ref); /* stored 1e36, x 1024 overflows */
  LT_TRUE(!hooks_flag(s, 1.0f, 1.0f, &ref) && !ref);
  loom_scaler_free(s);
}

/* A gradient zeroed through its data pointer (not loom_tensor_zero_grad) after an overflow step
 * keeps its "non-finite" bound; the check hooks read such a gradient instead of trusting it,
 * so the next, finite step is not skipped. */
LT_TEST(scaler_check_hooks_read_a_gradient_said_to_be_non_finite) {
  enum { R = 2, I = 3, O = 2 };
  float xv[R * I] = {1, 2, 3, 4, 5, 6}, wv[O * I] = {1, 0, -1, 0.5f, 0.5f, 0.5f};
  loom_tensor *x = NULL, *w = NULL;
  LT_OK(loom_tensor_from_data(LOOM_F32, 2, (int64_t[]){R, I}, xv, &x));
  LT_OK(loom_tensor_from_data(LOOM_F32, 2, (int64_t[]){O, I}, wv, &w));
  LT_OK(loom_tensor_set_requires_grad(w, true));
  loom_scaler *s = NULL;
  LT_OK(loom_scaler_create_static(8, &s));
  loom_amp_unscale_hooks *h = NULL;
  LT_OK(loom_amp_check_hooks_create(s, &w, 1, &h));
  for (int step = 0; step < 2; step++) {
    LT_OK(loom_tensor_set(x, (int64_t[]){1, 1}, step == 0 ? INFINITY : 5.0));
    loom_tensor *g = loom_tensor_grad(w);
    if (g) memset(loom_tensor_data(g), 0, loom_tensor_nbytes(g)); /* behind autograd's back */
    LT_OK(loom_amp_unscale_hooks_arm(h));
    loom_tensor *y = NULL, *l = NULL;
    LT_OK(loom_linear(x, w, NULL, &y));
    LT_OK(loom_sum(y, NULL, 0, false, &l));
    LT_OK(loom_backward_amp(l, s, false));
    bool found = !step;
    LT_OK(loom_amp_unscale_hooks_finish(h, &found));
    LT_EQ(found, step == 0);
    LT_OK(loom_scaler_update(s, found));
    loom_tensor_free(y), loom_tensor_free(l);
  }
  loom_grad_bound_kind k;
  LT_OK(loom_tensor_grad_bound(w, &k, NULL));
  LT_EQ(k, LOOM_GRAD_BOUND_NONFINITE); /* what autograd still believes */
  loom_amp_unscale_hooks_free(h);
  loom_scaler_free(s);
  loom_tensor_free(x), loom_tensor_free(w);
}
