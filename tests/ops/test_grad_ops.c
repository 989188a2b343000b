/* test_grad_ops.c: finite-difference gradient checks of every op in f32, and each op in f16
 * and bf16 against the f32 op (tolerances in gradcheck.h), including broadcasting and views. */
#include "gradcheck.h"
#include "ops/gemm.h"

G1(op_add, loom_add(in[0], in[1], out))
G1(op_sub, loom_sub(in[0], in[1], out))
G1(op_mul, loom_mul(in[0], in[1], out))
G1(op_div, loom_div(in[0], in[1], out))

LT_TEST(grad_binary_same_shape) {
  CHECK("add", op_add, 2, S(2, 3, 4), S(2, 3, 4));
  CHECK("sub", op_sub, 2, S(2, 3, 4), S(2, 3, 4));
  CHECK("mul", op_mul, 2, S(2, 3, 4), S(2, 3, 4));
  CHECK("div", op_div, 2, S(2, 3, 4), SR(2, 0.5f, 2.0f, 3, 4));
}

LT_TEST(grad_binary_broadcast) {
  CHECK("add row", op_add, 2, S(2, 3, 4), S(1, 4));
  CHECK("add col", op_add, 2, S(2, 3, 4), S(2, 3, 1));
  CHECK("sub both", op_sub, 2, S(3, 3, 1, 4), S(4, 2, 3, 1, 1));
  CHECK("mul scalar", op_mul, 2, S(2, 3, 4), S(0));
  CHECK("mul both", op_mul, 2, S(2, 1, 5), S(2, 4, 1));
  CHECK("div bcast", op_div, 2, S(1, 5), SR(2, 0.5f, 2.0f, 3, 1));
}

/* Long operands of one shape run in chunks over the thread team (binary.c): on 2 threads,
 * past the threshold with a ragged last chunk, every output and gradient element must be the
 * one-element formula's, bit for bit. */
LT_TEST(binary_long_same_shape_on_two_threads) {
  int before = loom__gemm_threads();
  loom_set_num_threads(2);
  uint64_t st = 11;
  int64_t shape[2] = {401, 353}; /* 141553 elements */
  size_t n = 401 * 353;
  int (*ops[4])(loom_tensor *, loom_tensor *, loom_tensor **) = {loom_add, loom_sub, loom_mul,
                                                                   loom_div};
  for (int op = 0; op < 4; op++) {
    loom_tensor *a = gc_rand(2, shape, -1, 1, &st), *b = gc_rand(2, shape, 0.5f, 2, &st);
    loom_tensor *y = NULL, *l = NULL;
    LT_OK(loom_tensor_set_requires_grad(a, true));
    LT_OK(loom_tensor_set_requires_grad(b, true));
    LT_OK(ops[op](a, b, &y));
    LT_OK(loom_sum(y, NULL, 0, false, &l));
    LT_OK(loom_backward(l, NULL, false));
    const float *av = loom_tensor_data(a), *bv = loom_tensor_data(b), *yv = loom_tensor_data(y);
    const float *ga = loom_tensor_data(loom_tensor_grad(a)),
                *gb = loom_tensor_data(loom_tensor_grad(b));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
      float x = av[i], z = bv[i], one = 1.0f;
      float want = op == 0 ? x + z : op == 1 ? x - z : op == 2 ? x * z : x / z;
      float wa = op == 2 ? one * z : op == 3 ? one / z : one;
      float wb = op == 0 ? one : op == 1 ? -one : op == 2 ? one * x : (-x / (z * z)) * one;
      bad += yv[i] != want || ga[i] != wa || gb[i] != wb;
    }
    LT_EQ(bad, 0);
    loom_tensor_free(a), loom_tensor_free(b), loom_tensor_free(y), loom_tensor_free(l);
  }
  loom__gemm_set_threads(before);
}

G1(op_add_s, loom_add_scalar(in[0], 1.5, out))
G1(op_sub_s, loom_sub_scalar(in[0], 0.25, out))
G1(op_mul_s, loom_mul_scalar(in[0], -3.0, out))
G1(op_div_s, loom_div_scalar(in[0], 4.0, out))
G1(op_neg, loom_neg(in[0], out))
G1(op_relu, loom_relu(in[0], out))
G1(op_gelu, loom_gelu(in[0], LOOM_GELU_EXACT, out))
G1(op_gelu_tanh, loom_gelu(in[0], LOOM_GELU_TANH, out))
G1(op_tanh, loom_tanh(in[0], out))
G1(op_sigmoid, loom_sigmoid(in[0], out))
G1(op_exp, loom_exp(in[0], out))
G1(op_log, loom_log(in[0], out))
G1(op_sqrt, loom_sqrt(in[0], out))
G1(op_pow2, loom_pow(in[0], 2.0, out))
G1(op_pow_frac, loom_pow(in[0], 1.5, out))

LT_TEST(grad_unary) {
  CHECK("add_scalar", op_add_s, 1, S(2, 5, 7));
  CHECK("sub_scalar", op_sub_s, 1, S(2, 5, 7));
  CHECK("mul_scalar", op_mul_s, 1, S(2, 5, 7));
  CHECK("div_scalar", op_div_s, 1, S(2, 5, 7));
  CHECK("neg", op_neg, 1, S(2, 5, 7));
  CHECK("relu", op_relu, 1, S(3, 2, 5, 7));
  CHECK("gelu", op_gelu, 1, SR(2, -3, 3, 5, 7));
  CHECK("gelu_tanh", op_gelu_tanh, 1, SR(2, -3, 3, 5, 7));
  CHECK("tanh", op_tanh, 1, SR(2, -2, 2, 5, 7));
  CHECK("sigmoid", op_sigmoid, 1, SR(2, -4, 4, 5, 7));
  CHECK("exp", op_exp, 1, S(2, 5, 7));
  CHECK("log", op_log, 1, SR(2, 0.5f, 3, 5, 7));
  CHECK("sqrt", op_sqrt, 1, SR(2, 0.5f, 3, 5, 7));
  CHECK("pow2", op_pow2, 1, S(2, 5, 7));
  CHECK("pow1.5", op_pow_frac, 1, SR(2, 0.5f, 2, 5, 7));
}

static const int d0[] = {0}, d1[] = {1}, dl[] = {-1}, d02[] = {0, 2};
G1(op_sum_all, loom_sum(in[0], NULL, 0, false, out))
G1(op_sum_1, loom_sum(in[0], d1, 1, false, out))
G1(op_sum_02k, loom_sum(in[0], d02, 2, true, out))
G1(op_mean_all, loom_mean(in[0], NULL, 0, false, out))
G1(op_mean_l, loom_mean(in[0], dl, 1, true, out))
G1(op_max_all, loom_max(in[0], NULL, 0, false, out))
G1(op_max_0, loom_max(in[0], d0, 1, false, out))
G1(op_max_02, loom_max(in[0], d02, 2, true, out))

LT_TEST(grad_reductions) {
  CHECK("sum all", op_sum_all, 1, S(3, 2, 3, 4));
  CHECK("sum dim 1", op_sum_1, 1, S(3, 2, 3, 4));
  CHECK("sum dims 0,2 keepdim", op_sum_02k, 1, S(3, 2, 3, 4));
  CHECK("mean all", op_mean_all, 1, S(3, 2, 3, 4));
  CHECK("mean last keepdim", op_mean_l, 1, S(3, 2, 3, 4));
  /* max: f32 only for finite differences (ties from bf16 rounding flip the argmax) */
  gc_opts f32 = {.f32_only = true, .eps = 1e-3};
  gc_input x[] = {S(3, 2, 3, 4)};
  gc_run("max all", op_max_all, NULL, 1, x, &f32);
  gc_run("max dim 0", op_max_0, NULL, 1, x, &f32);
  gc_run("max dims 0,2", op_max_02, NULL, 1, x, &f32);
}

G1(op_softmax, loom_softmax(in[0], -1, out))
G1(op_softmax0, loom_softmax(in[0], 0, out))
G1(op_log_softmax, loom_log_softmax(in[0], 1, out))
G1(op_log_softmax0, loom_log_softmax(in[0], 0, out))

LT_TEST(grad_softmax) {
  CHECK("softmax last", op_softmax, 1, SR(2, -3, 3, 4, 6));
  CHECK("softmax dim 0", op_softmax0, 1, SR(3, -3, 3, 4, 3, 2));
  CHECK("log_softmax", op_log_softmax, 1, SR(2, -3, 3, 4, 6));
  CHECK("log_softmax dim 0", op_log_softmax0, 1, SR(3, -3, 3, 4, 3, 2));
}

typedef struct ce_ctx {
  loom_tensor *labels;
  loom_reduction red;
  int64_t ignore;
} ce_ctx;

static int op_ce(loom_tensor **in, loom_tensor **out, void *ctx) {
  ce_ctx *c = ctx;
  return loom_cross_entropy(in[0], c->labels, c->red, c->ignore, out);
}

LT_TEST(grad_cross_entropy) {
  int64_t n = 6;
  int32_t l32[] = {0, 4, 2, 3, 1, 4};
  int64_t l64[] = {0, 4, -100, 3, 1, 4};
  loom_tensor *a = NULL, *b = NULL;
  LT_OK(loom_tensor_from_data(LOOM_I32, 1, &n, l32, &a));
  LT_OK(loom_tensor_from_data(LOOM_I64, 1, &n, l64, &b));
  gc_input x[] = {SR(2, -3, 3, 6, 5)};
  ce_ctx cs[] = {{a, LOOM_REDUCTION_MEAN, -100}, {a, LOOM_REDUCTION_SUM, -100},
                 {a, LOOM_REDUCTION_NONE, -100}, {b, LOOM_REDUCTION_MEAN, -100},
                 {a, LOOM_REDUCTION_SUM, 4}};
  const char *names[] = {"ce mean i32", "ce sum", "ce none", "ce mean i64 ignore", "ce ignore 4"};
  for (int i = 0; i < 5; i++) gc_run(names[i], op_ce, &cs[i], 1, x, NULL);
  loom_tensor_free(a);
  loom_tensor_free(b);
}

G1(op_mse_mean, loom_mse(in[0], in[1], LOOM_REDUCTION_MEAN, out))
G1(op_mse_sum, loom_mse(in[0], in[1], LOOM_REDUCTION_SUM, out))
G1(op_mse_none, loom_mse(in[0], in[1], LOOM_REDUCTION_NONE, out))

LT_TEST(grad_mse) {
  CHECK("mse mean", op_mse_mean, 2, S(2, 3, 4), S(2, 3, 4));
  CHECK("mse sum", op_mse_sum, 2, S(2, 3, 4), S(2, 3, 4));
  CHECK("mse none", op_mse_none, 2, S(2, 3, 4), S(2, 3, 4));
}

static const int64_t shp_r[] = {4, 6};
G1(op_reshape, loom_reshape(in[0], 2, shp_r, out))
G1(op_transpose, loom_transpose(in[0], 0, 2, out))
G1(op_slice, loom_slice(in[0], 1, 1, 6, 2, out))
G1(op_flatten, loom_flatten(in[0], 1, -1, out))
static int op_cat(loom_tensor **in, loom_tensor **out, void *ctx) {
  return loom_cat(in, 3, 1, out);
}
static int op_stack(loom_tensor **in, loom_tensor **out, void *ctx) {
  return loom_stack(in, 2, -1, out);
}
/* a view of a view, then an op, so strided inputs reach the kernels */
static int op_transpose_mul(loom_tensor **in, loom_tensor **out, void *ctx) {
  loom_tensor *t = NULL;
  int rc = loom_transpose(in[0], 0, 1, &t);
  if (!rc) rc = loom_mul(t, in[1], out);
  loom_tensor_free(t);
  return rc;
}

LT_TEST(grad_shapes) {
  CHECK("reshape", op_reshape, 1, S(3, 2, 3, 4));
  CHECK("transpose", op_transpose, 1, S(3, 2, 3, 4));
  CHECK("slice", op_slice, 1, S(2, 3, 7));
  CHECK("flatten", op_flatten, 1, S(3, 2, 3, 4));
  CHECK("cat", op_cat, 3, S(2, 2, 3), S(2, 2, 1), S(2, 2, 4));
  CHECK("stack", op_stack, 2, S(2, 2, 3), S(2, 2, 3));
  CHECK("transpose then mul", op_transpose_mul, 2, S(2, 3, 4), S(2, 4, 3));
}

G1(op_cast_bf16, loom_cast(in[0], LOOM_BF16, out))
static int op_cast_roundtrip(loom_tensor **in, loom_tensor **out, void *ctx) {
  loom_tensor *t = NULL, *u = NULL;
  int rc = loom_cast(in[0], LOOM_F16, &t);
  if (!rc) rc = loom_tanh(t, &u);
  if (!rc) rc = loom_cast(u, loom_tensor_dtype(in[0]), out);
  loom_tensor_free(t);
  loom_tensor_free(u);
  return rc;
}

LT_TEST(grad_cast) {
  /* finite differences across a rounding step need a step well above the dtype's spacing */
  gc_opts coarse = {.f32_only = true, .tol = 3e-2, .eps = 0.25};
  gc_opts fine = {.f32_only = true, .tol = 3e-2, .eps = 0.05};
  gc_input x[] = {S(2, 3, 4)};
  gc_run("cast to bf16", op_cast_bf16, NULL, 1, x, &coarse);
  gc_run("cast f16 roundtrip", op_cast_roundtrip, NULL, 1, x, &fine);
}

/* cast's backward rounds the gradient through the cast's low dtype a piece at a time: bit for
 * bit the two whole conversions (f32 -> low -> f32), over more than one piece with a ragged
 * end, on ties, subnormals, the largest values, inf and NaN. */
LT_TEST(grad_cast_rounds_through_low_dtype_bitwise) {
  enum { N = 5003 };
  static float x[N], g[N], want[N];
  static uint16_t low[N];
  const float special[] = {1.00390625f, 1.01171875f, -1.00390625f, 1e-40f, -3e-39f, 65504.0f,
                           65520.0f, 3.4e38f, INFINITY, -INFINITY, NAN, 0.0f, -0.0f};
  uint32_t r = 12345;
  for (int i = 0; i < N; i++) {
    r = r * 1664525u + 1013904223u;
    g[i] = ldexpf((float)(r >> 8) / 16777216.0f - 0.5f, (int)(r % 40) - 20);
    x[i] = (float)i;
  }
  for (size_t i = 0; i < sizeof special / sizeof *special; i++) g[2040 + i] = special[i];
  const loom_dtype lows[] = {LOOM_BF16, LOOM_F16};
  for (int d = 0; d < 2; d++) {
    int64_t shape[1] = {N};
    loom_tensor *xt = NULL, *gt = NULL, *y = NULL, *z = NULL;
    LT_OK(loom_tensor_from_data(LOOM_F32, 1, shape, x, &xt));
    LT_OK(loom_tensor_from_data(LOOM_F32, 1, shape, g, &gt));
    LT_OK(loom_tensor_set_requires_grad(xt, true));
    LT_OK(loom_cast(xt, lows[d], &y));
    LT_OK(loom_cast(y, LOOM_F32, &z)); /* its backward hands g on unrounded */
    LT_OK(loom_backward(z, gt, false));
    LT_OK(loom_convert(g, LOOM_F32, low, lows[d], N));
    LT_OK(loom_convert(low, lows[d], want, LOOM_F32, N));
    const loom_tensor *gx = loom_tensor_grad(xt);
    LT_TRUE(gx != NULL && loom_tensor_dtype(gx) == LOOM_F32);
    const uint32_t *got = loom_tensor_data((loom_tensor *)gx), *exp = (const uint32_t *)want;
    int bad = 0;
    for (int i = 0; i < N; i++) bad += got[i] != exp[i];
    LT_EQ(bad, 0);
    loom_tensor_free(xt);
    loom_tensor_free(gt);
    loom_tensor_free(y);
    loom_tensor_free(z);
  }
}
