/* test_amp_function.c: custom AMP functions (AmpAutogradFunction / AmpCustomFunction): the
 * dtypes forward and backward see (automatic from the registry under each mode, and manual),
 * gradients against the analytic ones and finite differences, the per-call context (saved
 * tensors, user state freed with the node), and the errors. */
#include "lt.h"

#include <math.h>

/* y = c * x * w elementwise; dy/dx = c * w, dy/dw = c * x. */
typedef struct fn_user {
  float c;
  loom_dtype fwd_seen, bwd_seen;
  loom_autocast_mode fwd_mode, bwd_mode;
  bool autocast_in_forward;
  int contexts, states_freed;
} fn_user;

static void state_free(void *p) { ((fn_user *)p)->states_freed++; }

static int fn_ctx(void *user, loom_tensor *const *in, int n, loom_amp_call *call) {
  (void)in;
  (void)n;
  fn_user *u = user;
  u->contexts++;
  call->state = u;
  call->state_free = state_free;
  return LOOM_OK;
}

static int fn_fwd(void *user, loom_amp_call *call, loom_tensor *const *in, int n,
                  loom_tensor **out) {
  (void)n;
  fn_user *u = user;
  u->fwd_seen = loom_tensor_dtype(in[0]);
  u->fwd_mode = call->ctx.mode;
  u->autocast_in_forward = loom_autocast_enabled();
  call->saved[0] = loom_tensor_retain(in[0]);
  call->saved[1] = loom_tensor_retain(in[1]);
  loom_tensor *p = NULL;
  int rc = loom_mul(in[0], in[1], &p);
  if (!rc) rc = loom_mul_scalar(p, u->c, out);
  loom_tensor_free(p);
  return rc;
}

static int fn_bwd(void *user, loom_amp_call *call, loom_tensor *g, int n, const bool *needs,
                  loom_tensor **gin) {
  (void)n;
  fn_user *u = user;
  u->bwd_seen = loom_tensor_dtype(g);
  u->bwd_mode = call->ctx.mode;
  for (int i = 0; i < 2; i++) {
    if (!needs[i]) continue;
    loom_tensor *other = NULL, *p = NULL;
    int rc = loom_tensor_cast(call->saved[1 - i], loom_tensor_dtype(g), &other);
    if (!rc) rc = loom_mul(g, other, &p);
    if (!rc) rc = loom_mul_scalar(p, u->c, &gin[i]);
    loom_tensor_free(other);
    loom_tensor_free(p);
    if (rc) return rc;
  }
  return LOOM_OK;
}

static loom_tensor *vec(loom_dtype dt, const float *v, int n, bool grad) {
  loom_tensor *f = NULL, *t = NULL;
  LT_OK(loom_tensor_from_data(LOOM_F32, 1, (int64_t[]){n}, v, &f));
  LT_OK(loom_tensor_cast(f, dt, &t));
  loom_tensor_free(f);
  if (grad) LT_OK(loom_tensor_set_requires_grad(t, true));
  return t;
}

static double el(const loom_tensor *t, int64_t i) {
  double v = 0;
  loom_tensor_get(t, &i, &v);
  return v;
}

static loom_amp_function *make_fn(fn_user *u, loom_amp_op op) {
  loom_amp_function_def d = {"scaled_mul", op, 2, fn_ctx, fn_fwd, fn_bwd, u};
  loom_amp_function *f = NULL;
  LT_OK(loom_amp_function_create(&d, NULL, &f));
  return f;
}

static const float X[4] = {0.5f, -1.25f, 2.0f, 3.0f}, W[4] = {1.5f, 0.25f, -0.75f, 2.5f};

/* sum(f(x, w)) and its gradients through the function. */
static loom_tensor *sum_of(loom_amp_function *f, loom_tensor *x, loom_tensor *w, bool manual,
                           loom_dtype fdt, loom_dtype bdt) {
  loom_tensor *in[2] = {x, w}, *y = NULL, *y32 = NULL, *s = NULL;
  if (manual) LT_OK(loom_amp_function_forward_manual(f, in, 2, fdt, bdt, &y));
  else LT_OK(loom_amp_function_forward(f, in, 2, &y));
  LT_OK(loom_cast(y, LOOM_F32, &y32));
  LT_OK(loom_sum(y32, NULL, 0, false, &s));
  loom_tensor_free(y);
  loom_tensor_free(y32);
  return s;
}

LT_TEST(amp_function_manual_f32_matches_analytic_and_finite_differences) {
  fn_user u = {.c = 3};
  loom_amp_function *f = make_fn(&u, LOOM_AMP_OP_CUSTOM);
  loom_tensor *x = vec(LOOM_F32, X, 4, true), *w = vec(LOOM_F32, W, 4, true);
  loom_tensor *s = sum_of(f, x, w, true, LOOM_F32, LOOM_F32);
  LT_EQ(u.contexts, 1);
  LT_TRUE(!u.autocast_in_forward);
  LT_STREQ(loom_tensor_grad_fn_name(s), "sum");
  LT_OK(loom_backward(s, NULL, false));
  LT_EQ(u.states_freed, 1); /* the node was spent: its call state released */
  for (int i = 0; i < 4; i++) {
    LT_NEAR(el(loom_tensor_grad(x), i), 3 * W[i], 1e-6);
    LT_NEAR(el(loom_tensor_grad(w), i), 3 * X[i], 1e-6);
    /* central difference of the forward alone */
    float xp[4], xm[4];
    memcpy(xp, X, sizeof xp);
    memcpy(xm, X, sizeof xm);
    xp[i] += 1e-2f;
    xm[i] -= 1e-2f;
    double fp = 0, fm = 0;
    for (int j = 0; j < 4; j++) fp += 3.0 * xp[j] * W[j], fm += 3.0 * xm[j] * W[j];
    LT_NEAR(el(loom_tensor_grad(x), i), (fp - fm) / 2e-2, 1e-3);
  }
  loom_tensor_free(s);
  loom_tensor_free(x);
  loom_tensor_free(w);
  loom_amp_function_free(f);
}

LT_TEST(amp_function_manual_dtypes_reach_the_callbacks) {
  fn_user u = {.c = 2};
  loom_amp_function *f = make_fn(&u, LOOM_AMP_OP_CUSTOM);
  loom_tensor *x = vec(LOOM_F32, X, 4, true), *w = vec(LOOM_F32, W, 4, true);
  loom_tensor *s = sum_of(f, x, w, true, LOOM_BF16, LOOM_F32);
  LT_EQ(u.fwd_seen, LOOM_BF16);
  LT_EQ(u.fwd_mode, LOOM_AUTOCAST_BF16); /* MapDataTypeToMode */
  LT_OK(loom_backward(s, NULL, false));
  LT_EQ(u.bwd_seen, LOOM_F32);
  LT_EQ(u.bwd_mode, LOOM_AUTOCAST_OFF);
  /* the gradient lands in the parameter's dtype (f32); its value used the bf16-saved inputs */
  LT_EQ(loom_tensor_dtype(loom_tensor_grad(x)), LOOM_F32);
  for (int i = 0; i < 4; i++) LT_NEAR(el(loom_tensor_grad(x), i), 2 * W[i], 0); /* exact in bf16 */
  loom_tensor_free(s);
  /* f16 forward, f16 backward on a bf16 leaf: gradient back in bf16 */
  loom_tensor *xb = vec(LOOM_BF16, X, 4, true);
  s = sum_of(f, xb, w, true, LOOM_F16, LOOM_F16);
  LT_EQ(u.fwd_seen, LOOM_F16);
  LT_OK(loom_backward(s, NULL, false));
  LT_EQ(u.bwd_seen, LOOM_F16);
  LT_EQ(u.bwd_mode, LOOM_AUTOCAST_F16);
  LT_EQ(loom_tensor_dtype(loom_tensor_grad(xb)), LOOM_BF16);
  for (int i = 0; i < 4; i++) LT_NEAR(el(loom_tensor_grad(xb), i), 2 * W[i], 0);
  LT_EQ(u.states_freed, 2);
  loom_tensor_free(s);
  loom_tensor_free(xb);
  loom_tensor_free(x);
  loom_tensor_free(w);
  loom_amp_function_free(f);
}

LT_TEST(amp_function_automatic_dtypes_follow_the_registry_in_every_mode) {
  fn_user u = {.c = 1};
  loom_amp_function *mm = make_fn(&u, LOOM_AMP_OP_MATMUL);   /* lower precision */
  loom_amp_function *sm = make_fn(&u, LOOM_AMP_OP_SOFTMAX);  /* f32 under the f16 preset */
  LT_EQ(loom_amp_function_forward_dtype(mm, LOOM_AUTOCAST_F16, LOOM_F32), LOOM_F16);
  LT_EQ(loom_amp_function_forward_dtype(mm, LOOM_AUTOCAST_BF16, LOOM_F32), LOOM_BF16);
  LT_EQ(loom_amp_function_forward_dtype(mm, LOOM_AUTOCAST_OFF, LOOM_F32), LOOM_F32);
  LT_EQ(loom_amp_function_forward_dtype(sm, LOOM_AUTOCAST_F16, LOOM_BF16), LOOM_F32);
  LT_EQ(loom_amp_function_backward_dtype(mm, LOOM_AUTOCAST_F16, LOOM_F32), LOOM_F16);
  loom_tensor *x = vec(LOOM_F32, X, 4, true), *w = vec(LOOM_F32, W, 4, true);
  const loom_autocast_mode modes[3] = {LOOM_AUTOCAST_OFF, LOOM_AUTOCAST_F16, LOOM_AUTOCAST_BF16};
  const loom_dtype want[3] = {LOOM_F32, LOOM_F16, LOOM_BF16};
  for (int m = 0; m < 3; m++) {
    loom_autocast_token tok;
    LT_OK(loom_autocast_enter(modes[m], NULL, &tok));
    loom_tensor *s = sum_of(mm, x, w, false, 0, 0);
    LT_OK(loom_autocast_exit(&tok));
    LT_EQ(u.fwd_seen, want[m]);
    LT_TRUE(!u.autocast_in_forward); /* the callbacks run with autocast off */
    LT_OK(loom_backward(s, NULL, false));
    LT_EQ(u.bwd_seen, want[m]);
    loom_tensor_free(s);
  }
  /* a registry change at run time changes the automatic dtype */
  loom_amp_registry *r = NULL;
  LT_OK(loom_amp_registry_create(LOOM_AUTOCAST_F16, &r));
  LT_OK(loom_amp_registry_set(r, LOOM_AMP_OP_MATMUL, LOOM_AMP_FP32));
  loom_autocast_token tok;
  LT_OK(loom_autocast_enter(LOOM_AUTOCAST_F16, r, &tok));
  loom_tensor *s = sum_of(mm, x, w, false, 0, 0);
  LT_EQ(u.fwd_seen, LOOM_F32);
  loom_tensor_free(s);
  s = sum_of(sm, x, w, false, 0, 0);
  LT_EQ(u.fwd_seen, LOOM_F32);
  LT_OK(loom_autocast_exit(&tok));
  loom_tensor_free(s);
  loom_amp_registry_free(r);
  loom_tensor_free(x);
  loom_tensor_free(w);
  loom_amp_function_free(mm);
  loom_amp_function_free(sm);
}

static int bad_bwd(void *user, loom_amp_call *call, loom_tensor *g, int n, const bool *needs,
                   loom_tensor **gin) {
  (void)user, (void)call, (void)n, (void)needs;
  return loom_tensor_zeros(LOOM_F32, 1, (int64_t[]){loom_tensor_dim(g, 0) + 1}, &gin[0]);
}

LT_TEST(amp_function_errors) {
  fn_user u = {.c = 1};
  loom_amp_function *f = NULL;
  loom_amp_function_def d = {"scaled_mul", LOOM_AMP_OP_CUSTOM, 2, NULL, fn_fwd, NULL, &u};
  LT_ERR(loom_amp_function_create(&d, NULL, &f), LOOM_EINVAL, "def.backward is NULL");
  LT_TRUE(f == NULL);
  d.backward = fn_bwd;
  d.n_in = 0;
  LT_ERR(loom_amp_function_create(&d, NULL, &f), LOOM_EINVAL, "def.n_in = 0");
  d.n_in = 2;
  d.op = LOOM_AMP_OP_COUNT;
  LT_ERR(loom_amp_function_create(&d, NULL, &f), LOOM_EINVAL, "not an op kind");
  d.op = LOOM_AMP_OP_CUSTOM;
  d.name = NULL;
  LT_ERR(loom_amp_function_create(&d, NULL, &f), LOOM_EINVAL, "def.name");
  d.name = "scaled_mul";
  LT_OK(loom_amp_function_create(&d, NULL, &f));
  loom_tensor *x = vec(LOOM_F32, X, 4, true), *w = vec(LOOM_F32, W, 4, true), *y = NULL;
  loom_tensor *in[2] = {x, w};
  LT_ERR(loom_amp_function_forward(f, in, 1, &y), LOOM_EINVAL, "takes 2 inputs, got 1");
  LT_ERR(loom_amp_function_forward_manual(f, in, 2, LOOM_I32, LOOM_F32, &y), LOOM_EDTYPE,
         "forward dtype i32");
  LT_TRUE(y == NULL);
  loom_amp_function_free(f);
  /* a backward that gives a gradient of the wrong shape stops backward, naming the function */
  d.backward = bad_bwd;
  LT_OK(loom_amp_function_create(&d, NULL, &f));
  LT_OK(loom_amp_function_forward(f, in, 2, &y));
  loom_tensor *s = NULL;
  LT_OK(loom_sum(y, NULL, 0, false, &s));
  LT_ERR(loom_backward(s, NULL, false), LOOM_ESHAPE, "scaled_mul");
  loom_tensor_free(s);
  loom_tensor_free(y);
  loom_amp_function_free(f);
  loom_amp_function_free(NULL);
  loom_tensor_free(x);
  loom_tensor_free(w);
}
