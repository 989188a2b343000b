/* test_grad_matmul.c: finite-difference gradient checks of matmul (2-D, batched, broadcast
 * batch, transposed views) and linear (with and without bias, batched), each in f16 and bf16
 * against f32 (tolerances in gradcheck.h). */
#include "gradcheck.h"

G1(op_matmul, loom_matmul(in[0], in[1], out))
G1(op_linear, loom_linear(in[0], in[1], in[2], out))
G1(op_linear_nb, loom_linear(in[0], in[1], NULL, out))
static int op_matmul_t(loom_tensor **in, loom_tensor **out, void *ctx) {
  loom_tensor *t = NULL;
  int rc = loom_transpose(in[1], 0, 1, &t);
  if (!rc) rc = loom_matmul(in[0], t, out);
  loom_tensor_free(t);
  return rc;
}

LT_TEST(grad_matmul_linear) {
  CHECK("matmul 2d", op_matmul, 2, S(2, 3, 5), S(2, 5, 4));
  CHECK("matmul batched", op_matmul, 2, S(3, 2, 3, 5), S(3, 2, 5, 4));
  CHECK("matmul batched x 2d", op_matmul, 2, S(3, 2, 3, 5), S(2, 5, 4));
  CHECK("matmul 2d x batched", op_matmul, 2, S(2, 3, 5), S(3, 2, 5, 4));
  CHECK("matmul transposed view", op_matmul_t, 2, S(2, 3, 5), S(2, 4, 5));
  CHECK("linear", op_linear, 3, S(2, 4, 6), S(2, 3, 6), S(1, 3));
  CHECK("linear batched no bias", op_linear_nb, 2, S(3, 2, 4, 6), S(2, 3, 6));
}

static const int64_t st1[2] = {1, 1}, st2[2] = {2, 1}, pad0[2] = {0, 0}, pad1[2] = {1, 1};
G1(op_conv, loom_conv2d(in[0], in[1], in[2], st1, pad0, out))
G1(op_conv_sp, loom_conv2d(in[0], in[1], in[2], st2, pad1, out))
G1(op_conv_nb, loom_conv2d(in[0], in[1], NULL, st2, pad1, out))

LT_TEST(grad_conv2d) {
  CHECK("conv2d", op_conv, 3, S(4, 2, 3, 5, 5), S(4, 4, 3, 3, 3), S(1, 4));
  CHECK("conv2d stride 2 pad 1", op_conv_sp, 3, S(4, 2, 2, 6, 5), S(4, 3, 2, 3, 2), S(1, 3));
  CHECK("conv2d no bias", op_conv_nb, 2, S(4, 1, 2, 5, 6), S(4, 3, 2, 2, 3));
}
