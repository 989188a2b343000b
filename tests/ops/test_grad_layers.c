/* test_grad_layers.c: finite-difference gradient checks of layer_norm, embedding, dropout and
 * the pooling ops, in f32 and in f16/bf16 against f32 (gradcheck.h). */
#include "gradcheck.h"

G1(op_ln, loom_layer_norm(in[0], 1, in[1], in[2], 1e-5, out))
G1(op_ln2, loom_layer_norm(in[0], 2, in[1], in[2], 1e-5, out))
G1(op_ln_plain, loom_layer_norm(in[0], 1, NULL, NULL, 1e-5, out))

LT_TEST(grad_layer_norm) {
  gc_opts o = {.lp_tol = 5e-2}; /* normalising amplifies input rounding */
  gc_input a[] = {S(2, 4, 6), S(1, 6), S(1, 6)};
  gc_run("layer_norm", op_ln, NULL, 3, a, &o);
  gc_input b[] = {S(3, 2, 3, 4), S(2, 3, 4), S(2, 3, 4)};
  gc_run("layer_norm 2 dims", op_ln2, NULL, 3, b, &o);
  gc_input c[] = {S(2, 3, 5)};
  gc_run("layer_norm no affine", op_ln_plain, NULL, 1, c, &o);
}

static int op_emb(loom_tensor **in, loom_tensor **out, void *ctx) {
  return loom_embedding(in[0], ctx, out);
}

LT_TEST(grad_embedding) {
  int64_t shape[2] = {2, 3};
  int64_t i64[] = {0, 4, 2, 4, 4, 1}; /* repeated rows accumulate */
  int32_t i32[] = {3, 3, 0, 1, 2, 4};
  loom_tensor *a = NULL, *b = NULL;
  LT_OK(loom_tensor_from_data(LOOM_I64, 2, shape, i64, &a));
  LT_OK(loom_tensor_from_data(LOOM_I32, 2, shape, i32, &b));
  gc_input w[] = {S(2, 5, 4)};
  gc_run("embedding i64", op_emb, a, 1, w, NULL);
  gc_run("embedding i32", op_emb, b, 1, w, NULL);
  loom_tensor_free(a);
  loom_tensor_free(b);
}

G1(op_dropout, loom_dropout(in[0], 0.3, 42, true, out))
G1(op_dropout_eval, loom_dropout(in[0], 0.3, 42, false, out))

LT_TEST(grad_dropout) {
  CHECK("dropout", op_dropout, 1, S(2, 8, 9));
  CHECK("dropout eval", op_dropout_eval, 1, S(2, 8, 9));
}

static const int64_t k2[2] = {2, 2}, k3[2] = {3, 3}, s2[2] = {2, 2}, s1[2] = {1, 1},
                     p0[2] = {0, 0}, p1[2] = {1, 1};
G1(op_maxpool, loom_max_pool2d(in[0], k2, s2, p0, out))
G1(op_maxpool_pad, loom_max_pool2d(in[0], k3, s2, p1, out))
G1(op_avgpool, loom_avg_pool2d(in[0], k2, s2, p0, out))
G1(op_avgpool_pad, loom_avg_pool2d(in[0], k3, s1, p1, out))

LT_TEST(grad_pooling) {
  gc_opts f32 = {.f32_only = true, .eps = 1e-3}; /* max: rounding makes ties in low precision */
  gc_input x[] = {S(4, 2, 3, 6, 5)};
  gc_run("max_pool2d", op_maxpool, NULL, 1, x, &f32);
  gc_run("max_pool2d pad", op_maxpool_pad, NULL, 1, x, &f32);
  gc_run("avg_pool2d", op_avgpool, NULL, 1, x, NULL);
  gc_run("avg_pool2d pad", op_avgpool_pad, NULL, 1, x, NULL);
}
