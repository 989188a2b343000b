/* test_grad_matmul.c: finite-difference gradient checks of matmul (2-D, batched, broadcast
 * batch, transposed views) and linear (with and without bias, batched), each in f16 and bf16
 * against f32 (tolerances in gradcheck.h). */
#include "gradcheck.h"
#include "ops/gemm.h"

#include <math.h>

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

/* linear's backward on bf16 / f16 with a bias: G rounded and its column sums taken in one pass
 * over G, a piece of rows at a time (matmul.c, cast_col_sums; rows here span many pieces).
 * The bias gradient must be the f32 column sums of G in row order, bit for bit, and x's and
 * w's gradients those of the same op without a bias gradient (the separate cast); on 1 thread
 * and on 2 (stripes of columns over the team). */
LT_TEST(linear_low_precision_bias_grad_one_pass) {
  loom_dtype dts[2] = {LOOM_BF16, LOOM_F16};
  uint64_t st = 5;
  int threads = loom__gemm_threads();
  /* d 2, 3: bf16, f16 on 2 threads, long enough for stripes of columns (128 + 72) */
  for (int d = 0; d < 4; d++) {
    loom_set_num_threads(d < 2 ? 1 : 2);
    int64_t R = d < 2 ? 301 : 1001, I = 24, O = d < 2 ? 72 : 200, xs[2] = {R, I}, ws[2] = {O, I}, bs[1] = {O}, gs[2] = {R, O};
    loom_tensor *x = NULL, *w = NULL, *b = NULL, *g32 = gc_rand(2, gs, -1, 1, &st), *gx[2],
                *gw[2];
    loom_tensor *x32 = gc_rand(2, xs, -1, 1, &st), *w32 = gc_rand(2, ws, -1, 1, &st),
                *b32 = gc_rand(1, bs, -1, 1, &st);
    LT_OK(loom_cast(x32, dts[d % 2], &x));
    LT_OK(loom_cast(w32, dts[d % 2], &w));
    LT_OK(loom_cast(b32, dts[d % 2], &b));
    const float *gv = loom_tensor_data(g32);
    for (int with_bias = 1; with_bias >= 0; with_bias--) {
      loom_tensor *y = NULL, *y32 = NULL, *l = NULL, *yg = NULL;
      LT_OK(loom_tensor_set_requires_grad(x, true));
      LT_OK(loom_tensor_set_requires_grad(w, true));
      LT_OK(loom_tensor_set_requires_grad(b, with_bias));
      LT_OK(loom_tensor_set_grad(x, NULL));
      LT_OK(loom_tensor_set_grad(w, NULL));
      LT_OK(loom_tensor_set_grad(b, NULL));
      LT_OK(loom_linear(x, w, b, &y));
      LT_OK(loom_cast(y, LOOM_F32, &y32)); /* L = sum(y32 * g32): dL/dy = g32 in f32 */
      LT_OK(loom_mul(y32, g32, &yg));
      LT_OK(loom_sum(yg, NULL, 0, false, &l));
      LT_OK(loom_backward(l, NULL, false));
      gx[with_bias] = loom_tensor_retain(loom_tensor_grad(x));
      gw[with_bias] = loom_tensor_retain(loom_tensor_grad(w));
      if (with_bias) {
        loom_tensor *gb = NULL;
        LT_OK(loom_cast(loom_tensor_grad(b), LOOM_F32, &gb));
        const float *got = loom_tensor_data(gb);
        int bad = 0;
        for (int64_t o = 0; o < O; o++) {
          float want = 0;
          for (int64_t r = 0; r < R; r++) want += gv[r * O + o];
          float want_dt = 0; /* the leaf's gradient is in dt: round the f32 sum the same way */
          uint16_t h = 0;
          LT_OK(loom_convert(&want, LOOM_F32, &h, dts[d % 2], 1));
          LT_OK(loom_convert(&h, dts[d % 2], &want_dt, LOOM_F32, 1));
          bad += got[o] != want_dt;
        }
        LT_EQ(bad, 0);
        loom_tensor_free(gb);
      }
      loom_tensor_free(y);
      loom_tensor_free(y32);
      loom_tensor_free(yg);
      loom_tensor_free(l);
    }
    LT_TRUE(gc_rel_diff(gx[0], gx[1], 1e-30) == 0);
    LT_TRUE(gc_rel_diff(gw[0], gw[1], 1e-30) == 0);
    for (int k = 0; k < 2; k++) {
      loom_tensor_free(gx[k]);
      loom_tensor_free(gw[k]);
    }
    loom_tensor_free(x);
    loom_tensor_free(w);
    loom_tensor_free(b);
    loom_tensor_free(x32);
    loom_tensor_free(w32);
    loom_tensor_free(b32);
    loom_tensor_free(g32);
  }
  loom__gemm_set_threads(threads);
}

/* Whether got is k times sum_j a[j * sa] b[j * sb] (j < n) within f32 rounding: 2e-5 of the
 * sum of the terms' magnitudes, against double-precision sums. */
static bool near_dot(float got, int k, const float *a, int64_t sa, const float *b, int64_t sb,
                     int64_t n) {
  double d = 0, m = 0;
  for (int64_t j = 0; j < n; j++) {
    d += (double)a[j * sa] * b[j * sb];
    m += fabs((double)a[j * sa] * b[j * sb]);
  }
  return fabs(got - k * d) <= 2e-5 * k * m + 1e-30;
}

/* linear's f32 gradients where matmul.c takes its own ways: a weight far wider than tall (O 64,
 * I 160, R 400: the weight gradient computed transposed, X^T G, and transposed into place) and
 * bias column sums over the GEMM's threads in strips of 64 (O 200: ragged strips). At 1 and 2
 * threads: gW and gX within f32 rounding (2e-5 of the sum of |terms|) of double-precision sums, gb bit for bit the f32
 * column sums in row order, and a second backward into the same leaves (beta 1) doubles them. */
LT_TEST(linear_f32_transposed_weight_grad_and_threaded_bias_sums) {
  static const int64_t shapes[2][3] = {{400, 160, 64}, {400, 24, 200}}; /* R, I, O */
  int keep_threads = loom__gemm_threads();
  uint64_t st = 11;
  for (int s = 0; s < 2; s++) {
    int64_t R = shapes[s][0], I = shapes[s][1], O = shapes[s][2];
    int64_t xs[2] = {R, I}, ws[2] = {O, I}, bs[1] = {O}, gs[2] = {R, O};
    loom_tensor *x = gc_rand(2, xs, -1, 1, &st), *w = gc_rand(2, ws, -1, 1, &st),
                *b = gc_rand(1, bs, -1, 1, &st), *g = gc_rand(2, gs, -1, 1, &st);
    const float *xv = loom_tensor_data(x), *wv = loom_tensor_data(w), *gv = loom_tensor_data(g);
    for (int th = 1; th <= 2; th++) {
      LT_OK(loom_set_num_threads(th));
      LT_OK(loom_tensor_set_requires_grad(x, true));
      LT_OK(loom_tensor_set_requires_grad(w, true));
      LT_OK(loom_tensor_set_requires_grad(b, true));
      LT_OK(loom_tensor_set_grad(x, NULL));
      LT_OK(loom_tensor_set_grad(w, NULL));
      LT_OK(loom_tensor_set_grad(b, NULL));
      for (int pass = 1; pass <= 2; pass++) { /* the second accumulates */
        loom_tensor *y = NULL, *yg = NULL, *l = NULL;
        LT_OK(loom_linear(x, w, b, &y));
        LT_OK(loom_mul(y, g, &yg)); /* L = sum(y * g): dL/dy = g */
        LT_OK(loom_sum(yg, NULL, 0, false, &l));
        LT_OK(loom_backward(l, NULL, false));
        const float *gw = loom_tensor_data(loom_tensor_grad(w)),
                    *gx = loom_tensor_data(loom_tensor_grad(x)),
                    *gb = loom_tensor_data(loom_tensor_grad(b));
        int bad = 0;
        for (int64_t o = 0; o < O; o++) {
          float want = 0;
          for (int64_t r = 0; r < R; r++) want += gv[r * O + o];
          bad += gb[o] != (pass == 1 ? want : want + want);
          for (int64_t i = 0; i < I; i++) /* gW[o][i] = sum_r G[r][o] X[r][i] */
            bad += !near_dot(gw[o * I + i], pass, gv + o, O, xv + i, I, R);
        }
        for (int64_t r = 0; r < R; r++)
          for (int64_t i = 0; i < I; i++) /* gX[r][i] = sum_o G[r][o] W[o][i] */
            bad += !near_dot(gx[r * I + i], pass, gv + r * O, 1, wv + i, I, O);
        if (bad)
          lt_fail_at(__FILE__, __LINE__, "R %lld I %lld O %lld, %d threads, pass %d: %d values "
                     "off", (long long)R, (long long)I, (long long)O, th, pass, bad);
        loom_tensor_free(y);
        loom_tensor_free(yg);
        loom_tensor_free(l);
      }
    }
    loom_tensor_free(x);
    loom_tensor_free(w);
    loom_tensor_free(b);
    loom_tensor_free(g);
  }
  loom_set_num_threads(keep_threads);
}
