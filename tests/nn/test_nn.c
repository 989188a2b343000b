/* test_nn.c: modules: PyTorch names and layouts, seeded default initialisers, the flat
 * parameter and gradient arenas (views at aligned offsets; backward writes into the gradient
 * arena), forward against the ops, training/eval, bad arguments, and a tiny MLP trained by
 * SGD over the flat arena whose loss falls. */
#include "lt.h"

#include <stdlib.h>
#include <string.h>

static size_t compute_bytes(void) {
  loom_pool_stats s;
  loom_mem_stats(LOOM_POOL_COMPUTE, &s);
  return s.current_bytes;
}

LT_TEST(nn_linear_names_layout_and_init) {
  loom_module *m = NULL, *m2 = NULL, *m3 = NULL;
  LT_OK(loom_nn_linear_create(20, 7, true, LOOM_F32, 5, &m));
  LT_STREQ(loom_module_type(m), "Linear");
  LT_EQ(loom_module_param_count(m), 2);
  LT_EQ(loom_module_numel(m), 20 * 7 + 7);
  loom_param w, b;
  LT_OK(loom_module_param_by_name(m, "weight", &w));
  LT_OK(loom_module_param_by_name(m, "bias", &b));
  LT_EQ(loom_tensor_dim(w.value, 0), 7); /* [out, in] */
  LT_EQ(loom_tensor_dim(w.value, 1), 20);
  LT_EQ(loom_tensor_dim(b.value, 0), 7);
  LT_TRUE(loom_tensor_requires_grad(w.value));
  LT_TRUE(loom_tensor_is_leaf(w.value));
  double bound = 1 / sqrt(20.0), mx = 0, sum = 0;
  const float *wp = loom_tensor_data(w.value);
  for (int i = 0; i < 140; i++) {
    mx = fmax(mx, fabs(wp[i]));
    sum += wp[i];
  }
  LT_TRUE(mx <= bound);
  LT_TRUE(mx > 0.9 * bound); /* the whole range is used */
  LT_NEAR(sum / 140, 0, 0.05);
  const float *bp = loom_tensor_data(b.value);
  for (int i = 0; i < 7; i++) LT_TRUE(fabs(bp[i]) <= bound);
  /* same seed, same values; another seed, other values */
  LT_OK(loom_nn_linear_create(20, 7, true, LOOM_F32, 5, &m2));
  LT_OK(loom_nn_linear_create(20, 7, true, LOOM_F32, 6, &m3));
  loom_param w2, w3;
  LT_OK(loom_module_param(m2, 0, &w2));
  LT_OK(loom_module_param(m3, 0, &w3));
  LT_TRUE(!memcmp(wp, loom_tensor_data(w2.value), 140 * sizeof(float)));
  LT_TRUE(memcmp(wp, loom_tensor_data(w3.value), 140 * sizeof(float)) != 0);
  LT_ERR(loom_module_param_by_name(m, "weights", &w), LOOM_ENOTFOUND, "\"weights\"");
  LT_ERR(loom_module_param(m, 2, &w), LOOM_EINVAL, "out of range");
  loom_module_free(m);
  loom_module_free(m2);
  loom_module_free(m3);
}

LT_TEST(nn_mlp_arena_and_gradients) {
  size_t before = compute_bytes();
  int64_t sizes[] = {5, 9, 3};
  loom_module *m = NULL;
  LT_OK(loom_nn_mlp_create(sizes, 3, LOOM_ACT_RELU, LOOM_F32, 1, &m));
  LT_EQ(loom_module_param_count(m), 4);
  const char *names[] = {"layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias"};
  loom_tensor *arena = NULL, *garena = NULL;
  size_t numel = 0;
  LT_OK(loom_module_arena(m, LOOM_F32, &arena, &garena, &numel));
  LT_TRUE(arena && garena);
  LT_EQ(loom_tensor_numel(arena), numel);
  size_t prev_end = 0;
  for (size_t i = 0; i < 4; i++) {
    loom_param p;
    LT_OK(loom_module_param(m, i, &p));
    LT_STREQ(p.name, names[i]);
    LT_EQ(p.offset % 16, 0); /* 64-byte aligned f32 */
    LT_TRUE(p.offset >= prev_end);
    prev_end = p.offset + p.numel;
    LT_TRUE((char *)loom_tensor_data(p.value) ==
            (char *)loom_tensor_data(arena) + p.offset * sizeof(float));
    LT_TRUE(loom_tensor_grad(p.value) == p.grad);
    LT_TRUE((char *)loom_tensor_data(p.grad) ==
            (char *)loom_tensor_data(garena) + p.offset * sizeof(float));
  }
  LT_TRUE(prev_end <= numel);
  loom_tensor *arena_b = NULL;
  size_t numel_b = 1;
  LT_OK(loom_module_arena(m, LOOM_BF16, &arena_b, NULL, &numel_b));
  LT_TRUE(arena_b == NULL);
  LT_EQ(numel_b, 0);
  /* forward equals linear -> relu -> linear by hand; backward fills the gradient arena */
  int64_t xs[] = {4, 5};
  loom_tensor *x = NULL, *y = NULL, *h = NULL, *r = NULL, *y2 = NULL, *l = NULL;
  LT_OK(loom_tensor_empty(LOOM_F32, 2, xs, &x));
  float *xp = loom_tensor_data(x);
  for (int i = 0; i < 20; i++) xp[i] = (float)((i * 7) % 11) / 5.0f - 1.0f;
  LT_OK(loom_module_forward(m, x, &y));
  loom_param p[4];
  for (int i = 0; i < 4; i++) LT_OK(loom_module_param(m, (size_t)i, &p[i]));
  loom_no_grad_enter();
  LT_OK(loom_linear(x, p[0].value, p[1].value, &h));
  LT_OK(loom_relu(h, &r));
  LT_OK(loom_linear(r, p[2].value, p[3].value, &y2));
  loom_no_grad_exit();
  for (int i = 0; i < 12; i++)
    LT_NEAR(((float *)loom_tensor_data(y))[i], ((float *)loom_tensor_data(y2))[i], 1e-6);
  LT_OK(loom_sum(y, NULL, 0, false, &l));
  LT_OK(loom_backward(l, NULL, false));
  double gsum = 0; /* d sum / d bias2 = batch size for every output */
  for (int i = 0; i < 3; i++) LT_NEAR(((float *)loom_tensor_data(p[3].grad))[i], 4.0, 1e-6);
  for (size_t i = 0; i < numel; i++) gsum += fabs(((float *)loom_tensor_data(garena))[i]);
  LT_TRUE(gsum >= 12.0 - 1e-4); /* bias2 alone gives 12 */
  LT_OK(loom_module_zero_grad(m));
  for (size_t i = 0; i < loom_tensor_numel(garena); i++)
    LT_EQ(((float *)loom_tensor_data(garena))[i], 0);
  loom_tensor *ts[] = {x, y, h, r, y2, l};
  for (int i = 0; i < 6; i++) loom_tensor_free(ts[i]);
  loom_module_free(m);
  LT_EQ(compute_bytes(), before);
}

LT_TEST(nn_sequential_conv_layernorm_embedding_names) {
  int64_t k[2] = {3, 3}, s[2] = {1, 1}, pad[2] = {1, 1}, ln_shape[1] = {4};
  loom_module *c[4] = {0}, *seq = NULL;
  LT_OK(loom_nn_conv2d_create(2, 4, k, s, pad, true, LOOM_F32, 3, &c[0]));
  LT_OK(loom_nn_activation_create(LOOM_ACT_GELU, &c[1]));
  LT_OK(loom_nn_dropout_create(0.5, 9, &c[2]));
  LT_OK(loom_nn_layer_norm_create(1, ln_shape, 1e-5, true, LOOM_F32, &c[3]));
  loom_param w;
  LT_OK(loom_module_param(c[0], 0, &w));
  LT_EQ(loom_tensor_ndim(w.value), 4);
  LT_EQ(loom_tensor_dim(w.value, 0), 4);
  LT_EQ(loom_tensor_dim(w.value, 1), 2);
  LT_OK(loom_nn_sequential_create(c, 4, &seq));
  const char *names[] = {"0.weight", "0.bias", "3.weight", "3.bias"};
  LT_EQ(loom_module_param_count(seq), 4);
  for (size_t i = 0; i < 4; i++) {
    loom_param p;
    LT_OK(loom_module_param(seq, i, &p));
    LT_STREQ(p.name, names[i]);
  }
  loom_param lw, lb;
  LT_OK(loom_module_param_by_name(seq, "3.weight", &lw));
  LT_OK(loom_module_param_by_name(seq, "3.bias", &lb));
  LT_EQ(((float *)loom_tensor_data(lw.value))[2], 1);
  LT_EQ(((float *)loom_tensor_data(lb.value))[2], 0);
  LT_ERR(loom_module_arena(c[0], LOOM_F32, NULL, NULL, NULL), LOOM_EMISUSE, "root holds");
  LT_EQ(loom_module_param_count(c[3]), 2); /* a child still lists its own */
  int64_t xs[4] = {2, 2, 4, 4};
  loom_tensor *x = NULL, *y = NULL, *y_eval = NULL, *y_eval2 = NULL;
  LT_OK(loom_tensor_zeros(LOOM_F32, 4, xs, &x));
  LT_OK(loom_tensor_fill(x, 0.5));
  LT_OK(loom_module_forward(seq, x, &y));
  LT_EQ(loom_tensor_dim(y, 1), 4);
  LT_EQ(loom_tensor_dim(y, 3), 4);
  loom_module_set_training(seq, false);
  LT_OK(loom_module_forward(seq, x, &y_eval));
  LT_OK(loom_module_forward(seq, x, &y_eval2)); /* eval: no dropout, same result */
  LT_TRUE(!memcmp(loom_tensor_data(y_eval), loom_tensor_data(y_eval2), 32 * 4 * sizeof(float)));
  loom_tensor_free(x);
  loom_tensor_free(y);
  loom_tensor_free(y_eval);
  loom_tensor_free(y_eval2);
  loom_module_free(seq);

  loom_module *e = NULL;
  LT_OK(loom_nn_embedding_create(10, 3, LOOM_BF16, 4, &e));
  int64_t idx[] = {9, 0, 9}, n3 = 3;
  loom_tensor *it = NULL, *out = NULL;
  LT_OK(loom_tensor_from_data(LOOM_I64, 1, &n3, idx, &it));
  LT_OK(loom_module_forward(e, it, &out));
  LT_EQ(loom_tensor_dtype(out), LOOM_BF16);
  LT_EQ(loom_tensor_dim(out, 1), 3);
  double a = 0, b2 = 0;
  LT_OK(loom_tensor_get(out, (int64_t[]){0, 1}, &a));
  LT_OK(loom_tensor_get(out, (int64_t[]){2, 1}, &b2));
  LT_EQ(a, b2);
  loom_tensor_free(it);
  loom_tensor_free(out);
  loom_module_free(e);
}

LT_TEST(nn_bad_arguments) {
  loom_module *m = (loom_module *)1;
  LT_ERR(loom_nn_linear_create(0, 3, true, LOOM_F32, 1, &m), LOOM_EINVAL, "must be >= 1");
  LT_TRUE(m == NULL);
  LT_ERR(loom_nn_linear_create(2, 3, true, LOOM_I32, 1, &m), LOOM_EDTYPE, "not i32");
  LT_ERR(loom_nn_dropout_create(1.0, 1, &m), LOOM_EINVAL, "outside [0, 1)");
  LT_ERR(loom_nn_activation_create((loom_activation)42, &m), LOOM_EINVAL, "unknown activation");
  int64_t one[] = {3};
  LT_ERR(loom_nn_mlp_create(one, 1, LOOM_ACT_RELU, LOOM_F32, 1, &m), LOOM_EINVAL, "2 sizes");
  LT_ERR(loom_nn_layer_norm_create(0, one, 1e-5, true, LOOM_F32, &m), LOOM_EINVAL, "out of range");
  LT_ERR(loom_nn_sequential_create(NULL, 0, &m), LOOM_EINVAL, "n >= 1");
  int64_t k[2] = {0, 3}, s[2] = {1, 1}, p[2] = {0, 0};
  LT_ERR(loom_nn_conv2d_create(1, 1, k, s, p, true, LOOM_F32, 1, &m), LOOM_EINVAL, ">= 1");
  LT_OK(loom_nn_linear_create(4, 2, false, LOOM_F32, 1, &m));
  loom_tensor *x = NULL, *y = NULL;
  LT_OK(loom_tensor_zeros(LOOM_F32, 2, (int64_t[]){3, 5}, &x));
  LT_ERR(loom_module_forward(m, x, &y), LOOM_ESHAPE, "linear: x [3, 5] and weight [2, 4]");
  LT_ERR(loom_module_forward(NULL, x, &y), LOOM_EINVAL, "module or out is NULL");
  LT_EQ(loom_module_param_count(m), 1);
  loom_tensor_free(x);
  loom_module_free(m);
  loom_module_free(NULL);
}

/* Two Gaussian blobs per class in 2-D; a 2-16-3 MLP trained by SGD over the flat arena. */
static double train_mlp(loom_dtype dt, int steps) {
  int64_t sizes[] = {2, 16, 3}, xs[] = {48, 2}, n48 = 48;
  loom_module *m = NULL;
  loom_nn_mlp_create(sizes, 3, LOOM_ACT_TANH, dt, 7, &m);
  float xv[96];
  int32_t lab[48];
  loom_rng r;
  loom_rng_seed(&r, 3);
  for (int i = 0; i < 48; i++) {
    lab[i] = i % 3;
    xv[2 * i] = (float)(lab[i] - 1) + 0.3f * (float)loom_rng_normal(&r);
    xv[2 * i + 1] = (lab[i] == 1 ? 1.0f : -0.5f) + 0.3f * (float)loom_rng_normal(&r);
  }
  loom_tensor *x32 = NULL, *x = NULL, *labels = NULL, *arena = NULL, *garena = NULL;
  loom_tensor_from_data(LOOM_F32, 2, xs, xv, &x32);
  loom_tensor_cast(x32, dt, &x);
  loom_tensor_from_data(LOOM_I32, 1, &n48, lab, &labels);
  size_t n = 0;
  loom_module_arena(m, dt, &arena, &garena, &n);
  double first = 0, last = 0;
  for (int step = 0; step < steps; step++) {
    loom_tensor *logits = NULL, *loss = NULL;
    loom_module_zero_grad(m);
    loom_module_forward(m, x, &logits);
    loom_cross_entropy(logits, labels, LOOM_REDUCTION_MEAN, -100, &loss);
    loom_tensor_item(loss, &last);
    if (step == 0) first = last;
    loom_backward(loss, NULL, false);
    for (size_t i = 0; i < n; i++) { /* SGD, lr 0.5, over the whole arena */
      int64_t k = (int64_t)i;
      double p, g;
      loom_tensor_get(arena, &k, &p);
      loom_tensor_get(garena, &k, &g);
      loom_tensor_set(arena, &k, p - 0.5 * g);
    }
    loom_tensor_free(logits);
    loom_tensor_free(loss);
  }
  loom_tensor_free(x32);
  loom_tensor_free(x);
  loom_tensor_free(labels);
  loom_module_free(m);
  return last / first;
}

LT_TEST(nn_tiny_mlp_sgd_loss_falls) {
  double f32 = train_mlp(LOOM_F32, 60), bf16 = train_mlp(LOOM_BF16, 60);
  LT_TRUE(f32 < 0.3);
  LT_TRUE(bf16 < 0.4);
}

/* loom_module_zero_grad zeroes the gradients as loom_tensor_zero_grad does, gradient bounds
 * included (loom/autograd.h): a bound that said "non-finite" before must not survive the
 * zeroing (a scaler's check hooks would skip every later step), on the root and on a child. */
static loom_grad_bound_kind nn_bound_kind(loom_tensor *t, double *bound) {
  loom_grad_bound_kind k = LOOM_GRAD_BOUND_UNKNOWN;
  LT_OK(loom_tensor_grad_bound(t, &k, bound));
  return k;
}

static void nn_linear_step(loom_module *m, float x0) {
  loom_tensor *x = NULL, *y = NULL, *l = NULL;
  LT_OK(loom_tensor_empty(LOOM_F32, 2, (int64_t[]){2, 4}, &x));
  float *xp = loom_tensor_data(x);
  for (int i = 0; i < 8; i++) xp[i] = (float)(i % 3) - 1.0f;
  xp[0] = x0;
  LT_OK(loom_module_forward(m, x, &y));
  LT_OK(loom_sum(y, NULL, 0, false, &l));
  LT_OK(loom_backward(l, NULL, false));
  loom_tensor_free(x), loom_tensor_free(y), loom_tensor_free(l);
}

LT_TEST(nn_zero_grad_resets_gradient_bounds) {
  loom_module *lin[2] = {0}, *seq = NULL;
  LT_OK(loom_nn_linear_create(4, 4, true, LOOM_F32, 1, &lin[0]));
  LT_OK(loom_nn_linear_create(4, 3, true, LOOM_F32, 2, &lin[1]));
  LT_OK(loom_nn_sequential_create(lin, 2, &seq));
  loom_param w[2];
  LT_OK(loom_module_param_by_name(seq, "0.weight", &w[0]));
  LT_OK(loom_module_param_by_name(seq, "1.weight", &w[1]));
  for (int i = 0; i < 2; i++) LT_OK(loom_tensor_track_grad_bound(w[i].value, true));
  for (int root = 1; root >= 0; root--) {
    nn_linear_step(seq, INFINITY); /* x holds inf: the first weight's gradient does too */
    LT_EQ(nn_bound_kind(w[0].value, NULL), LOOM_GRAD_BOUND_NONFINITE);
    LT_OK(loom_module_zero_grad(root ? seq : lin[0]));
    const float *g = loom_tensor_data(loom_tensor_grad(w[0].value));
    for (int i = 0; i < 16; i++) LT_EQ(g[i], 0);
    double b = -1;
    LT_EQ(nn_bound_kind(w[0].value, &b), LOOM_GRAD_BOUND_FINITE);
    LT_TRUE(b == 0);
    nn_linear_step(seq, 1.0f); /* finite: bounded again, and the bound holds */
    LT_EQ(nn_bound_kind(w[0].value, &b), LOOM_GRAD_BOUND_FINITE);
    g = loom_tensor_data(loom_tensor_grad(w[0].value));
    for (int i = 0; i < 16; i++) LT_TRUE(fabsf(g[i]) <= b);
    LT_OK(loom_module_zero_grad(seq));
  }
  loom_module_free(seq);
}

/* MaxPool2d and Flatten modules run their ops: the same values, and gradients through them
 * match the ops'; they hold no parameters and refuse bad windows. */
LT_TEST(nn_max_pool_and_flatten_modules_run_their_ops) {
  const int64_t k2[2] = {2, 2}, s1[2] = {1, 1}, p1[2] = {1, 1};
  loom_module *pool = NULL, *flat = NULL, *bad = NULL;
  LT_OK(loom_nn_max_pool2d_create(k2, NULL, NULL, &pool));
  LT_OK(loom_nn_flatten_create(1, -1, &flat));
  LT_TRUE(strcmp(loom_module_type(pool), "MaxPool2d") == 0);
  LT_TRUE(strcmp(loom_module_type(flat), "Flatten") == 0);
  LT_EQ(loom_module_param_count(pool), 0);
  LT_EQ(loom_module_param_count(flat), 0);
  loom_tensor *x = NULL, *a = NULL, *b = NULL, *fa = NULL, *fb = NULL;
  LT_OK(loom_tensor_empty(LOOM_F32, 4, (int64_t[]){2, 3, 6, 6}, &x));
  float *d = loom_tensor_data(x);
  for (int i = 0; i < 2 * 3 * 36; i++) d[i] = (float)((i * 37) % 101) - 50.0f;
  LT_OK(loom_tensor_set_requires_grad(x, true));
  LT_OK(loom_module_forward(pool, x, &a));
  LT_OK(loom_module_forward(flat, a, &fa));
  LT_OK(loom_max_pool2d(x, k2, k2, (int64_t[]){0, 0}, &b));
  LT_OK(loom_flatten(b, 1, -1, &fb));
  LT_EQ(loom_tensor_ndim(fa), 2);
  LT_EQ(loom_tensor_dim(fa, 1), 3 * 3 * 3);
  LT_TRUE(memcmp(loom_tensor_data(fa), loom_tensor_data(fb), 2 * 27 * sizeof(float)) == 0);
  /* the module's gradient with respect to x is the op's */
  loom_tensor *sa = NULL, *sb = NULL;
  LT_OK(loom_sum(fa, NULL, 0, false, &sa));
  LT_OK(loom_backward(sa, NULL, false));
  float *g1 = malloc(2 * 3 * 36 * sizeof(float));
  LT_TRUE(g1 != NULL);
  memcpy(g1, loom_tensor_data(loom_tensor_grad(x)), 2 * 3 * 36 * sizeof(float));
  LT_OK(loom_tensor_zero_grad(x));
  LT_OK(loom_sum(fb, NULL, 0, false, &sb));
  LT_OK(loom_backward(sb, NULL, false));
  LT_TRUE(memcmp(g1, loom_tensor_data(loom_tensor_grad(x)), 2 * 3 * 36 * sizeof(float)) == 0);
  double nonzero = 0;
  for (int i = 0; i < 2 * 3 * 36; i++) nonzero += g1[i] != 0;
  LT_EQ(nonzero, 2 * 27); /* one winner per window */
  free(g1);
  /* bad windows, strides and paddings are refused, naming the dim */
  LT_ERR(loom_nn_max_pool2d_create((int64_t[]){0, 2}, NULL, NULL, &bad), LOOM_EINVAL, "dim 0");
  LT_ERR(loom_nn_max_pool2d_create(k2, (int64_t[]){1, 0}, NULL, &bad), LOOM_EINVAL, "dim 1");
  LT_ERR(loom_nn_max_pool2d_create(k2, s1, (int64_t[]){2, 0}, &bad), LOOM_EINVAL, "kernel/2");
  LT_ERR(loom_nn_max_pool2d_create(NULL, s1, p1, &bad), LOOM_EINVAL, "kernel is NULL");
  LT_ERR(loom_nn_flatten_create(9, -1, &bad), LOOM_EINVAL, "out of range");
  LT_TRUE(bad == NULL);
  loom_tensor *t4 = NULL, *y = NULL;
  LT_OK(loom_tensor_zeros(LOOM_F32, 2, (int64_t[]){2, 3}, &t4));
  LT_TRUE(loom_module_forward(pool, t4, &y) != LOOM_OK); /* a 2-D input: the op's own error */
  loom_tensor_free(t4);
  loom_tensor_free(sa), loom_tensor_free(sb);
  loom_tensor_free(a), loom_tensor_free(b), loom_tensor_free(fa), loom_tensor_free(fb);
  loom_tensor_free(x);
  loom_module_free(pool);
  loom_module_free(flat);
}
