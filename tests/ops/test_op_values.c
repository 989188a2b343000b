/* test_op_values.c: forward values against hand-worked results (broadcasting edge cases,
 * softmax, cross entropy, layer norm, pooling, views, cat/stack), and a clear error (status
 * and message naming the op) for each kind of bad input of every op. */
#include "lt.h"

static loom_tensor *mk(int ndim, const int64_t *shape, const float *v) {
  loom_tensor *t = NULL;
  loom_tensor_from_data(LOOM_F32, ndim, shape, v, &t);
  return t;
}

static float f(const loom_tensor *t, size_t i) { return ((const float *)loom_tensor_data(t))[i]; }

LT_TEST(ops_forward_values) {
  float av[] = {1, 2, 3, 4, 5, 6}, bv[] = {10, 20, 30};
  loom_tensor *a = mk(2, (int64_t[]){2, 3}, av), *b = mk(1, (int64_t[]){3}, bv), *y = NULL;
  LT_OK(loom_add(a, b, &y)); /* row broadcast */
  LT_EQ(f(y, 4), 25);
  loom_tensor_free(y);
  loom_tensor *col = mk(2, (int64_t[]){2, 1}, bv);
  LT_OK(loom_sub(a, col, &y)); /* column broadcast */
  LT_EQ(f(y, 5), 6 - 20);
  loom_tensor_free(y);
  loom_tensor *s0 = mk(0, NULL, bv);
  LT_OK(loom_div(s0, a, &y)); /* rank-0 on the left */
  LT_NEAR(f(y, 3), 10.0 / 4, 1e-6);
  LT_EQ(loom_tensor_ndim(y), 2);
  loom_tensor_free(y);
  loom_tensor *e0 = NULL, *e = NULL; /* empty tensors broadcast to empty */
  LT_OK(loom_tensor_empty(LOOM_F32, 2, (int64_t[]){0, 3}, &e0));
  LT_OK(loom_mul(e0, b, &e));
  LT_EQ(loom_tensor_numel(e), 0);
  loom_tensor_free(e);
  LT_OK(loom_sum(e0, NULL, 0, false, &e));
  LT_EQ(f(e, 0), 0);
  loom_tensor_free(e);
  LT_OK(loom_softmax(a, 1, &y));
  LT_NEAR(f(y, 0) + f(y, 1) + f(y, 2), 1, 1e-6);
  LT_NEAR(f(y, 2), exp(2) / (1 + exp(1) + exp(2)), 1e-6);
  loom_tensor_free(y);
  int dims[] = {0};
  LT_OK(loom_max(a, dims, 1, false, &y));
  LT_EQ(f(y, 0), 4);
  LT_EQ(f(y, 2), 6);
  loom_tensor_free(y);
  LT_OK(loom_mean(a, NULL, 0, true, &y));
  LT_EQ(loom_tensor_ndim(y), 2);
  LT_NEAR(f(y, 0), 3.5, 1e-6);
  loom_tensor_free(y);
  /* cross entropy of uniform logits is log(C); an ignored row does not count */
  float z[6] = {0};
  int64_t labels[] = {1, -100};
  loom_tensor *lg = mk(2, (int64_t[]){2, 3}, z), *lb = NULL;
  LT_OK(loom_tensor_from_data(LOOM_I64, 1, (int64_t[]){2}, labels, &lb));
  LT_OK(loom_cross_entropy(lg, lb, LOOM_REDUCTION_MEAN, -100, &y));
  LT_NEAR(f(y, 0), log(3.0), 1e-6);
  loom_tensor_free(y);
  LT_OK(loom_cross_entropy(lg, lb, LOOM_REDUCTION_NONE, -100, &y));
  LT_EQ(f(y, 1), 0);
  loom_tensor_free(y);
  LT_OK(loom_layer_norm(a, 1, NULL, NULL, 0.0, &y));
  LT_NEAR(f(y, 0), -sqrt(1.5), 1e-5);
  LT_NEAR(f(y, 1), 0, 1e-6);
  loom_tensor_free(y);
  /* pooling a 4x4 ramp */
  float ramp[16];
  for (int i = 0; i < 16; i++) ramp[i] = (float)i;
  loom_tensor *img = mk(4, (int64_t[]){1, 1, 4, 4}, ramp);
  int64_t k2[2] = {2, 2}, s2[2] = {2, 2}, p0[2] = {0, 0};
  LT_OK(loom_max_pool2d(img, k2, s2, p0, &y));
  LT_EQ(f(y, 0), 5);
  LT_EQ(f(y, 3), 15);
  loom_tensor_free(y);
  LT_OK(loom_avg_pool2d(img, k2, s2, p0, &y));
  LT_NEAR(f(y, 1), (2 + 3 + 6 + 7) / 4.0, 1e-6);
  loom_tensor_free(y);
  /* views: slice and transpose share storage; cat and stack copy */
  loom_tensor *v = NULL, *w = NULL;
  LT_OK(loom_slice(a, 1, 1, 3, 1, &v));
  LT_TRUE(loom_tensor_shares_storage(v, a));
  LT_OK(loom_transpose(a, 0, 1, &w));
  LT_TRUE(loom_tensor_shares_storage(w, a));
  loom_tensor *parts[] = {a, a};
  LT_OK(loom_cat(parts, 2, 0, &y));
  LT_EQ(loom_tensor_dim(y, 0), 4);
  LT_EQ(f(y, 9), 4);
  loom_tensor_free(y);
  LT_OK(loom_stack(parts, 2, 1, &y));
  LT_EQ(loom_tensor_dim(y, 1), 2);
  LT_EQ(f(y, 3), 1); /* y[0][1][0] = a[0][0] */
  loom_tensor_free(y);
  loom_tensor *ts[] = {a, b, col, s0, e0, lg, lb, img, v, w};
  for (int i = 0; i < 10; i++) loom_tensor_free(ts[i]);
}

LT_TEST(ops_bad_inputs_name_the_op) {
  float v[24] = {0};
  loom_tensor *a = mk(2, (int64_t[]){2, 3}, v), *b = mk(2, (int64_t[]){4, 5}, v), *y = NULL;
  loom_tensor *h = NULL, *ints = NULL, *x4 = mk(4, (int64_t[]){1, 2, 3, 4}, v);
  LT_OK(loom_tensor_cast(a, LOOM_BF16, &h));
  LT_OK(loom_tensor_zeros(LOOM_I32, 2, (int64_t[]){2, 3}, &ints));
  /* NULLs */
  LT_ERR(loom_add(NULL, a, &y), LOOM_EINVAL, "add: a is NULL");
  LT_ERR(loom_add(a, a, NULL), LOOM_EINVAL, "add: out is NULL");
  LT_ERR(loom_relu(NULL, &y), LOOM_EINVAL, "relu: x is NULL");
  LT_ERR(loom_matmul(a, NULL, &y), LOOM_EINVAL, "matmul: b is NULL");
  LT_ERR(loom_cat(NULL, 2, 0, &y), LOOM_EINVAL, "cat: needs at least one");
  /* dtypes */
  LT_ERR(loom_mul(a, h, &y), LOOM_EDTYPE, "mul: inputs have different dtypes f32 and bf16");
  LT_ERR(loom_exp(ints, &y), LOOM_EDTYPE, "exp: x must be f32, f16 or bf16, not i32");
  LT_ERR(loom_cross_entropy(a, a, LOOM_REDUCTION_MEAN, -100, &y), LOOM_EDTYPE,
         "labels must be i32 or i64");
  LT_ERR(loom_cast(a, LOOM_I64, &y), LOOM_EDTYPE, "cast: target dtype");
  LT_ERR(loom_embedding(a, a, &y), LOOM_EDTYPE, "embedding: idx must be i32 or i64");
  /* shapes */
  LT_ERR(loom_add(a, b, &y), LOOM_ESHAPE, "add: shapes [2, 3] and [4, 5] do not broadcast");
  LT_ERR(loom_matmul(a, a, &y), LOOM_ESHAPE, "matmul: shapes [2, 3] and [2, 3] do not match");
  LT_ERR(loom_linear(a, b, NULL, &y), LOOM_ESHAPE, "linear: x [2, 3] and weight [4, 5]");
  LT_ERR(loom_mse(a, b, LOOM_REDUCTION_SUM, &y), LOOM_ESHAPE, "mse: shapes [2, 3] and [4, 5]");
  LT_ERR(loom_cross_entropy(a, ints, LOOM_REDUCTION_SUM, -100, &y), LOOM_ESHAPE,
         "are not [N, C] and [N]");
  LT_ERR(loom_conv2d(x4, a, NULL, (int64_t[]){1, 1}, (int64_t[]){0, 0}, &y), LOOM_ESHAPE,
         "conv2d: x [1, 2, 3, 4] and w [2, 3]");
  LT_ERR(loom_max_pool2d(a, (int64_t[]){2, 2}, (int64_t[]){1, 1}, (int64_t[]){0, 0}, &y),
         LOOM_ESHAPE, "max_pool2d: x [2, 3] is not [N, C, H, W]");
  LT_ERR(loom_reshape(a, 1, (int64_t[]){5}, &y), LOOM_ESHAPE, "");
  LT_ERR(loom_layer_norm(a, 1, b, NULL, 1e-5, &y), LOOM_ESHAPE, "layer_norm: weight has shape");
  loom_tensor *parts[] = {a, b};
  LT_ERR(loom_cat(parts, 2, 0, &y), LOOM_ESHAPE, "cat: tensor 1 has shape [4, 5]");
  /* dims and parameters */
  int bad[] = {2};
  LT_ERR(loom_sum(a, bad, 1, false, &y), LOOM_EINVAL, "sum: dim 2 out of range");
  int twice[] = {0, -2};
  LT_ERR(loom_mean(a, twice, 2, false, &y), LOOM_EINVAL, "given twice");
  LT_ERR(loom_softmax(a, -3, &y), LOOM_EINVAL, "softmax: dim -3 out of range");
  LT_ERR(loom_transpose(a, 0, 5, &y), LOOM_EINVAL, "transpose: dim 5");
  LT_ERR(loom_flatten(a, 1, 0, &y), LOOM_EINVAL, "flatten: start_dim 1 comes after");
  LT_ERR(loom_dropout(a, 1.0, 1, true, &y), LOOM_EINVAL, "dropout: p = 1");
  LT_ERR(loom_gelu(a, (loom_gelu_mode)7, &y), LOOM_EINVAL, "gelu: mode 7");
  LT_ERR(loom_layer_norm(a, 3, NULL, NULL, 1e-5, &y), LOOM_EINVAL, "normalized_ndim 3");
  LT_ERR(loom_cross_entropy(a, NULL, (loom_reduction)9, 0, &y), LOOM_EINVAL, "labels is NULL");
  int64_t badlab[] = {0, 3};
  loom_tensor *lb = NULL, *idx = NULL;
  LT_OK(loom_tensor_from_data(LOOM_I64, 1, (int64_t[]){2}, badlab, &lb));
  LT_ERR(loom_cross_entropy(a, lb, LOOM_REDUCTION_MEAN, -100, &y), LOOM_EINVAL,
         "label 3 of row 1 is outside [0, 3)");
  LT_OK(loom_tensor_from_data(LOOM_I64, 1, (int64_t[]){2}, badlab, &idx));
  LT_ERR(loom_embedding(a, idx, &y), LOOM_EINVAL, "index 3 at position 1 is outside [0, 2)");
  LT_ERR(loom_avg_pool2d(x4, (int64_t[]){2, 2}, (int64_t[]){1, 1}, (int64_t[]){2, 0}, &y),
         LOOM_EINVAL, "padding 2 must be in [0, kernel / 2 = 1]");
  LT_ERR(loom_conv2d(x4, x4, NULL, (int64_t[]){0, 1}, (int64_t[]){0, 0}, &y), LOOM_EINVAL,
         "stride (0, 1)");
  LT_TRUE(y == NULL);
  loom_tensor *ts[] = {a, b, h, ints, x4, lb, idx};
  for (int i = 0; i < 7; i++) loom_tensor_free(ts[i]);
}
