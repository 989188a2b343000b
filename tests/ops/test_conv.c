/* test_conv.c: the oneDNN convolution kernels (forward with and without bias, backward data,
 * backward weights with and without bias) against their scalar references, in f32, bf16 and
 * f16, over shapes with stride, padding, 1x1 kernels, kernels as large as the padded input and
 * a stride that leaves input rows unused; the references against hand-worked values and
 * against each other through the adjoint identity <conv(x, w), dy> = <x, dX> = <w, dW>; and
 * bad arguments.
 *
 * Tolerance: as in test_gemm.c, the f32 summation bound 2 (R + 2) 2^-24 sum |terms| per
 * element (R the reduction length, sum |terms| from the reference on absolute values), plus
 * one ulp of a bf16 (2^-7) or f16 (2^-10) result for its final rounding. */
#include "lt.h"
#include "ops/gemm.h"

#include <stdlib.h>

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float rnd(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((rng >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

static void *rand_buf(loom_dtype dt, size_t n) {
  void *b = malloc(n * loom_dtype_size(dt));
  for (size_t i = 0; i < n; i++) loom__store_f64(b, dt, i, rnd());
  return b;
}
static void *abs_buf(const void *src, loom_dtype dt, size_t n) {
  void *b = malloc(n * loom_dtype_size(dt));
  for (size_t i = 0; i < n; i++) loom__store_f64(b, dt, i, fabs(loom__load_f64(src, dt, i)));
  return b;
}

typedef struct sizes {
  size_t x, w, b, y;
  int64_t oh, ow;
} sizes;
static sizes sizes_of(const loom__conv2d_args *a) {
  sizes s;
  s.oh = (a->H + 2 * a->pad_h - a->KH) / a->stride_h + 1;
  s.ow = (a->W + 2 * a->pad_w - a->KW) / a->stride_w + 1;
  s.x = (size_t)(a->N * a->C * a->H * a->W), s.w = (size_t)(a->O * a->C * a->KH * a->KW);
  s.b = (size_t)a->O, s.y = (size_t)(a->N * a->O * s.oh * s.ow);
  return s;
}

/* Compares n elements of got against want with the tolerance above. */
static int compare(const char *what, const loom__conv2d_args *a, const void *got, const void *want,
                   const void *mag_dt, size_t n, int64_t reduction) {
  double ulp = a->dtype == LOOM_BF16 ? 1.0 / 128 : a->dtype == LOOM_F16 ? 1.0 / 1024 : 0.0;
  double sub = a->dtype == LOOM_F16 ? 0x1p-24 : 0.0;
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    double g = loom__load_f64(got, a->dtype, i), w = loom__load_f64(want, a->dtype, i);
    double m = loom__load_f64(mag_dt, a->dtype, i);
    double tol = 2.0 * (double)(reduction + 2) * 0x1p-24 * m * (1 + ulp) + ulp * fabs(w) + sub;
    if (fabs(g - w) <= tol) continue;
    if (!bad++)
      lt_fail_at(
          __FILE__, __LINE__,
          "%s %s N%lld C%lld H%lld W%lld O%lld K%lldx%lld s%lldx%lld p%lldx%lld: element %zu "
          "is %.9g, reference %.9g (tol %.3g)",
          what, loom_dtype_name(a->dtype), (long long)a->N, (long long)a->C, (long long)a->H,
          (long long)a->W, (long long)a->O, (long long)a->KH, (long long)a->KW,
          (long long)a->stride_h, (long long)a->stride_w, (long long)a->pad_h, (long long)a->pad_w,
          i, g, w, tol);
  }
  return bad;
}

static void check_conv(loom__conv2d_args a, bool bias) {
  sizes s = sizes_of(&a);
  size_t es = loom_dtype_size(a.dtype);
  void *x = rand_buf(a.dtype, s.x), *w = rand_buf(a.dtype, s.w), *b = rand_buf(a.dtype, s.b);
  void *dy = rand_buf(a.dtype, s.y);
  void *xa = abs_buf(x, a.dtype, s.x), *wa = abs_buf(w, a.dtype, s.w),
       *ba = abs_buf(b, a.dtype, s.b);
  void *dya = abs_buf(dy, a.dtype, s.y);
  void *got = malloc(s.x * es + s.w * es + s.y * es),
       *want = malloc(s.x * es + s.w * es + s.y * es);
  void *mag = malloc(s.x * es + s.w * es + s.y * es);
  void *gb = malloc(s.b * es), *wb = malloc(s.b * es), *mb = malloc(s.b * es);

  LT_OK(loom__conv2d_fwd(&a, x, w, bias ? b : NULL, got));
  LT_OK(loom__conv2d_fwd_ref(&a, x, w, bias ? b : NULL, want));
  LT_OK(loom__conv2d_fwd_ref(&a, xa, wa, bias ? ba : NULL, mag));
  LT_EQ(compare("fwd", &a, got, want, mag, s.y, a.C * a.KH * a.KW), 0);

  LT_OK(loom__conv2d_bwd_data(&a, dy, w, got));
  LT_OK(loom__conv2d_bwd_data_ref(&a, dy, w, want));
  LT_OK(loom__conv2d_bwd_data_ref(&a, dya, wa, mag));
  LT_EQ(compare("bwd_data", &a, got, want, mag, s.x, a.O * a.KH * a.KW), 0);

  LT_OK(loom__conv2d_bwd_weights(&a, x, dy, got, bias ? gb : NULL));
  LT_OK(loom__conv2d_bwd_weights_ref(&a, x, dy, want, bias ? wb : NULL));
  LT_OK(loom__conv2d_bwd_weights_ref(&a, xa, dya, mag, bias ? mb : NULL));
  LT_EQ(compare("bwd_weights", &a, got, want, mag, s.w, a.N * s.oh * s.ow), 0);
  if (bias) LT_EQ(compare("bwd_bias", &a, gb, wb, mb, s.b, a.N * s.oh * s.ow), 0);

  free(x), free(w), free(b), free(dy), free(xa), free(wa), free(ba), free(dya);
  free(got), free(want), free(mag), free(gb), free(wb), free(mb);
}

/* N C H W O KH KW sh sw ph pw */
static const int64_t shapes[][11] = {
    {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0},    {2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1},
    {2, 3, 8, 9, 5, 3, 2, 2, 2, 1, 0},    {1, 4, 5, 5, 2, 5, 5, 1, 1, 2, 2},
    {2, 2, 6, 6, 3, 1, 1, 2, 2, 0, 0}, /* stride 2 over 6 with 1x1: the last row unused */
    {1, 16, 12, 12, 8, 3, 3, 2, 1, 1, 1}, {3, 2, 4, 4, 2, 4, 4, 1, 1, 0, 0},
};

static void sweep(loom_dtype dt) {
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const int64_t *v = shapes[i];
    loom__conv2d_args a = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], dt};
    check_conv(a, i % 2 == 0);
    check_conv(a, i % 2 == 1);
  }
}

LT_TEST(conv_matches_ref_f32) {
  sweep(LOOM_F32);
}
LT_TEST(conv_matches_ref_bf16) {
  sweep(LOOM_BF16);
}
LT_TEST(conv_matches_ref_f16) {
  sweep(LOOM_F16);
}

/* x = 1..9 in 3x3, w = [1 0; 0 -1] (+ bias 10), stride 1, no padding: y[i][j] = x[i][j] -
 * x[i+1][j+1] + 10 = 6 everywhere; with padding 1 and stride 2 by hand. */
LT_TEST(conv_ref_hand_values) {
  float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w[4] = {1, 0, 0, -1}, b[1] = {10}, y[9];
  loom__conv2d_args a = {1, 1, 3, 3, 1, 2, 2, 1, 1, 0, 0, LOOM_F32};
  LT_OK(loom__conv2d_fwd_ref(&a, x, w, b, y));
  for (int i = 0; i < 4; i++) LT_EQ(y[i], -4 + 10);
  LT_OK(loom__conv2d_fwd(&a, x, w, b, y));
  for (int i = 0; i < 4; i++) LT_EQ(y[i], 6);
  /* pad 1, stride 2: output 2x2 at padded positions (0,0),(0,2),(2,0),(2,2) of the 5x5 */
  loom__conv2d_args p = {1, 1, 3, 3, 1, 2, 2, 2, 2, 1, 1, LOOM_F32};
  LT_OK(loom__conv2d_fwd_ref(&p, x, w, NULL, y));
  LT_EQ(y[0], 0 - 1);
  LT_EQ(y[1], 0 - 3);
  LT_EQ(y[2], 0 - 7);
  LT_EQ(y[3], 5 - 9);
  /* backward of that, dy = 1: dx gathers w over the windows that cover each input */
  float dy[4] = {1, 1, 1, 1}, dx[9], dw[4], db[1];
  LT_OK(loom__conv2d_bwd_data_ref(&p, dy, w, dx));
  float dx_want[9] = {-1, 0, -1, 0, 1, 0, -1, 0, -1};
  for (int i = 0; i < 9; i++) LT_EQ(dx[i], dx_want[i]);
  LT_OK(loom__conv2d_bwd_weights_ref(&p, x, dy, dw, db));
  /* dw[kh][kw] = sum over windows of x at (2i - 1 + kh, 2j - 1 + kw) */
  LT_EQ(dw[0], 5);
  LT_EQ(dw[1], 4 + 6);
  LT_EQ(dw[2], 2 + 8);
  LT_EQ(dw[3], 1 + 3 + 7 + 9);
  LT_EQ(db[0], 4);
}

/* <fwd(x, w), dy> = <x, bwd_data(dy, w)> = <w, bwd_weights(x, dy)>, in double. */
LT_TEST(conv_refs_are_adjoint) {
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const int64_t *v = shapes[i];
    loom__conv2d_args a = {v[0], v[1], v[2], v[3], v[4],  v[5],
                           v[6], v[7], v[8], v[9], v[10], LOOM_F32};
    sizes s = sizes_of(&a);
    float *x = rand_buf(LOOM_F32, s.x), *w = rand_buf(LOOM_F32, s.w), *dy = rand_buf(LOOM_F32, s.y);
    float *y = malloc(s.y * 4), *dx = malloc(s.x * 4), *dw = malloc(s.w * 4);
    LT_OK(loom__conv2d_fwd_ref(&a, x, w, NULL, y));
    LT_OK(loom__conv2d_bwd_data_ref(&a, dy, w, dx));
    LT_OK(loom__conv2d_bwd_weights_ref(&a, x, dy, dw, NULL));
    double p1 = 0, p2 = 0, p3 = 0, m = 0;
    for (size_t k = 0; k < s.y; k++) p1 += (double)y[k] * dy[k], m += fabs((double)y[k] * dy[k]);
    for (size_t k = 0; k < s.x; k++) p2 += (double)x[k] * dx[k];
    for (size_t k = 0; k < s.w; k++) p3 += (double)w[k] * dw[k];
    LT_NEAR(p2, p1, 1e-5 * (m + 1));
    LT_NEAR(p3, p1, 1e-5 * (m + 1));
    free(x), free(w), free(dy), free(y), free(dx), free(dw);
  }
}

LT_TEST(conv_bad_arguments) {
  float buf[256] = {0};
  const loom__conv2d_args ok = {1, 1, 4, 4, 1, 3, 3, 1, 1, 1, 1, LOOM_F32};
  loom__conv2d_args a;
  LT_ERR(loom__conv2d_fwd(NULL, buf, buf, NULL, buf), LOOM_EINVAL,
         "loom__conv2d_fwd: args is NULL");
  LT_ERR(loom__conv2d_fwd(&ok, NULL, buf, NULL, buf), LOOM_EINVAL, "loom__conv2d_fwd: x is NULL");
  LT_ERR(loom__conv2d_fwd(&ok, buf, NULL, NULL, buf), LOOM_EINVAL, "w is NULL");
  LT_ERR(loom__conv2d_fwd(&ok, buf, buf, NULL, NULL), LOOM_EINVAL, "y is NULL");
  LT_ERR(loom__conv2d_bwd_data(&ok, NULL, buf, buf), LOOM_EINVAL,
         "loom__conv2d_bwd_data: dy is NULL");
  LT_ERR(loom__conv2d_bwd_data(&ok, buf, buf, NULL), LOOM_EINVAL, "dx is NULL");
  LT_ERR(loom__conv2d_bwd_weights(&ok, buf, buf, NULL, NULL), LOOM_EINVAL,
         "loom__conv2d_bwd_weights: dw is NULL");
  LT_ERR(loom__conv2d_bwd_weights_ref(&ok, NULL, buf, buf, NULL), LOOM_EINVAL,
         "loom__conv2d_bwd_weights_ref: x is NULL");
  a = ok, a.C = 0;
  LT_ERR(loom__conv2d_fwd(&a, buf, buf, NULL, buf), LOOM_EINVAL, "C must be positive, got 0");
  a = ok, a.KW = -1;
  LT_ERR(loom__conv2d_fwd_ref(&a, buf, buf, NULL, buf), LOOM_EINVAL, "KW must be positive");
  a = ok, a.stride_h = 0;
  LT_ERR(loom__conv2d_bwd_data(&a, buf, buf, buf), LOOM_EINVAL, "stride_h must be positive");
  a = ok, a.pad_w = -1;
  LT_ERR(loom__conv2d_fwd(&a, buf, buf, NULL, buf), LOOM_EINVAL, "padding must not be negative");
  a = ok, a.KH = 7; /* 4 + 2 * 1 < 7 */
  LT_ERR(loom__conv2d_fwd(&a, buf, buf, NULL, buf), LOOM_ESHAPE,
         "kernel 7 x 3 is larger than the padded input 6 x 6");
  a = ok, a.dtype = LOOM_I64;
  LT_ERR(loom__conv2d_bwd_weights(&a, buf, buf, buf, NULL), LOOM_EDTYPE,
         "dtype i64 is not supported");
}
