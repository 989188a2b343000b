/* test_grad_bounds.c: gradient bounds (loom_tensor_grad_bound): linear's weight and bias
 * gradients are bounded by rows * max|x| * max|grad_out| and rows * max|grad_out| without
 * being read, the bound holds against the gradients actually written (first write,
 * accumulation, under bf16 autocast through the master weight's cast), inf/NaN inputs mark
 * the gradient non-finite exactly when it holds one, a bound past half of FLT_MAX, another
 * op's write, set_grad and an untracked leaf give unknown, zero_grad gives 0, and bad calls
 * get named errors; the absmax kernel on every CPU level against its scalar reference and an
 * independent answer (f32, f16, bf16; lengths 0..200 and two large ones; inf, NaN, -0,
 * subnormals and the largest finite at every position, tails included). */
#include "lt.h"
#include "loom/autocast.h"
#include "ops/ops_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { R = 5, I = 7, O = 3 };

typedef struct fix {
  loom_tensor *x, *w, *b, *c;
} fix;

static loom_tensor *mk(int ndim, const int64_t *shape, const float *v, bool grad) {
  loom_tensor *t = NULL;
  LT_OK(loom_tensor_from_data(LOOM_F32, ndim, shape, v, &t));
  if (grad) LT_OK(loom_tensor_set_requires_grad(t, true));
  return t;
}

/* x [R, I], w [O, I], b [O], c [R, O] (loss = sum(linear(x, w, b) * c): grad_out is c),
 * with x scaled by xs and c by cs; w and b tracked. */
static void fix_init(fix *f, float xs, float cs) {
  float xv[R * I], wv[O * I], bv[O], cv[R * O];
  for (int i = 0; i < R * I; i++) xv[i] = xs * (float)((i * 7) % 11 - 5) / 4.0f;
  for (int i = 0; i < O * I; i++) wv[i] = (float)((i * 5) % 9 - 4) / 8.0f;
  for (int i = 0; i < O; i++) bv[i] = 0.25f * (float)i;
  for (int i = 0; i < R * O; i++) cv[i] = cs * (float)((i * 3) % 7 - 3) / 2.0f;
  f->x = mk(2, (int64_t[]){R, I}, xv, false);
  f->w = mk(2, (int64_t[]){O, I}, wv, true);
  f->b = mk(1, (int64_t[]){O}, bv, true);
  f->c = mk(2, (int64_t[]){R, O}, cv, false);
  LT_OK(loom_tensor_track_grad_bound(f->w, true));
  LT_OK(loom_tensor_track_grad_bound(f->b, true));
}

static void fix_free(fix *f) {
  loom_tensor_free(f->x), loom_tensor_free(f->w), loom_tensor_free(f->b), loom_tensor_free(f->c);
}

static void backward(fix *f, loom_autocast_mode mode) {
  loom_autocast_token tok;
  LT_OK(loom_autocast_enter(mode, NULL, &tok));
  loom_tensor *y = NULL, *p = NULL, *s = NULL;
  LT_OK(loom_linear(f->x, f->w, f->b, &y));
  LT_OK(loom_mul(y, f->c, &p));
  LT_OK(loom_sum(p, NULL, 0, false, &s));
  LT_OK(loom_autocast_exit(&tok));
  LT_OK(loom_backward(s, NULL, false));
  loom_tensor_free(y), loom_tensor_free(p), loom_tensor_free(s);
}

static double max_abs(const loom_tensor *t) {
  const float *v = loom_tensor_data(t);
  double m = 0;
  for (size_t i = 0; i < loom_tensor_numel(t); i++) m = fmax(m, fabs((double)v[i]));
  return m;
}

static bool any_nonfinite(const loom_tensor *t) {
  const float *v = loom_tensor_data(t);
  for (size_t i = 0; i < loom_tensor_numel(t); i++)
    if (!isfinite(v[i])) return true;
  return false;
}

static loom_grad_bound_kind kind_of(const loom_tensor *t, double *bound) {
  loom_grad_bound_kind k = LOOM_GRAD_BOUND_UNKNOWN;
  LT_OK(loom_tensor_grad_bound(t, &k, bound));
  return k;
}

LT_TEST(grad_bound_linear_bounds_weight_and_bias_without_reading_them) {
  fix f;
  fix_init(&f, 1.0f, 1.0f);
  LT_EQ(kind_of(f.w, NULL), LOOM_GRAD_BOUND_UNKNOWN); /* no gradient yet */
  backward(&f, LOOM_AUTOCAST_OFF);
  double xm = max_abs(f.x), cm = max_abs(f.c), bw = 0, bb = 0;
  LT_EQ(kind_of(f.w, &bw), LOOM_GRAD_BOUND_FINITE);
  LT_EQ(kind_of(f.b, &bb), LOOM_GRAD_BOUND_FINITE);
  LT_NEAR(bw, R * xm * cm, 1e-12);
  LT_NEAR(bb, R * cm, 1e-12);
  double gw = max_abs(loom_tensor_grad(f.w)), gb = max_abs(loom_tensor_grad(f.b));
  LT_TRUE(gw > 0 && gw <= bw);
  LT_TRUE(gb > 0 && gb <= bb);
  /* a second backward adds into the gradients: the bounds add up and still hold */
  backward(&f, LOOM_AUTOCAST_OFF);
  LT_EQ(kind_of(f.w, &bw), LOOM_GRAD_BOUND_FINITE);
  LT_NEAR(bw, 2 * R * xm * cm, 1e-12);
  LT_TRUE(max_abs(loom_tensor_grad(f.w)) <= bw);
  LT_NEAR(max_abs(loom_tensor_grad(f.w)), 2 * gw, 1e-6);
  /* zero_grad: 0; set_grad: unknown */
  LT_OK(loom_tensor_zero_grad(f.w));
  LT_EQ(kind_of(f.w, &bw), LOOM_GRAD_BOUND_FINITE);
  LT_TRUE(bw == 0);
  loom_tensor *mine = NULL;
  LT_OK(loom_tensor_zeros(LOOM_F32, 2, (int64_t[]){O, I}, &mine));
  LT_OK(loom_tensor_set_grad(f.w, mine));
  LT_EQ(kind_of(f.w, NULL), LOOM_GRAD_BOUND_UNKNOWN);
  backward(&f, LOOM_AUTOCAST_OFF); /* adds into a buffer autograd knows nothing of */
  LT_EQ(kind_of(f.w, NULL), LOOM_GRAD_BOUND_UNKNOWN);
  LT_OK(loom_tensor_zero_grad(f.w));
  backward(&f, LOOM_AUTOCAST_OFF);
  LT_EQ(kind_of(f.w, &bw), LOOM_GRAD_BOUND_FINITE);
  LT_NEAR(bw, R * xm * cm, 1e-12);
  /* tracking off: writes leave the bound unknown */
  LT_OK(loom_tensor_track_grad_bound(f.w, false));
  LT_OK(loom_tensor_zero_grad(f.w));
  backward(&f, LOOM_AUTOCAST_OFF);
  LT_EQ(kind_of(f.w, NULL), LOOM_GRAD_BOUND_UNKNOWN);
  LT_EQ(kind_of(f.b, NULL), LOOM_GRAD_BOUND_FINITE); /* b is still tracked */
  loom_tensor_free(mine);
  fix_free(&f);
}

LT_TEST(grad_bound_nonfinite_inputs_mark_exactly_the_gradients_that_hold_one) {
  fix f;
  fix_init(&f, 1.0f, 1.0f);
  LT_OK(loom_tensor_set(f.x, (int64_t[]){2, 3}, INFINITY)); /* x: the weight's, not the bias' */
  backward(&f, LOOM_AUTOCAST_OFF);
  LT_EQ(kind_of(f.w, NULL), LOOM_GRAD_BOUND_NONFINITE);
  LT_TRUE(any_nonfinite(loom_tensor_grad(f.w)));
  LT_EQ(kind_of(f.b, NULL), LOOM_GRAD_BOUND_FINITE);
  LT_TRUE(!any_nonfinite(loom_tensor_grad(f.b)));
  /* non-finite stays so when more is added, even finite */
  LT_OK(loom_tensor_set(f.x, (int64_t[]){2, 3}, 1.0));
  backward(&f, LOOM_AUTOCAST_OFF);
  LT_EQ(kind_of(f.w, NULL), LOOM_GRAD_BOUND_NONFINITE);
  LT_TRUE(any_nonfinite(loom_tensor_grad(f.w)));
  /* NaN in grad_out: both */
  LT_OK(loom_tensor_zero_grad(f.w));
  LT_OK(loom_tensor_zero_grad(f.b));
  LT_OK(loom_tensor_set(f.c, (int64_t[]){1, 1}, NAN));
  backward(&f, LOOM_AUTOCAST_OFF);
  LT_EQ(kind_of(f.w, NULL), LOOM_GRAD_BOUND_NONFINITE);
  LT_EQ(kind_of(f.b, NULL), LOOM_GRAD_BOUND_NONFINITE);
  LT_TRUE(any_nonfinite(loom_tensor_grad(f.w)) && any_nonfinite(loom_tensor_grad(f.b)));
  fix_free(&f);
}

LT_TEST(grad_bound_past_half_flt_max_is_unknown_and_the_gradient_may_overflow) {
  fix f;
  fix_init(&f, 1.0f, 1.0f);
  for (int64_t r = 0; r < R; r++) { /* finite inputs; gw[0, 0] = 5 * 1e38 overflows */
    LT_OK(loom_tensor_set(f.x, (int64_t[]){r, 0}, 1e19));
    LT_OK(loom_tensor_set(f.c, (int64_t[]){r, 0}, 1e19));
  }
  backward(&f, LOOM_AUTOCAST_OFF);
  LT_EQ(kind_of(f.w, NULL), LOOM_GRAD_BOUND_UNKNOWN);
  LT_TRUE(any_nonfinite(loom_tensor_grad(f.w)));
  double bb = 0;
  LT_EQ(kind_of(f.b, &bb), LOOM_GRAD_BOUND_FINITE);
  LT_NEAR(bb, 5e19, 1e13);
  fix_free(&f);
}

LT_TEST(grad_bound_other_ops_make_it_unknown) {
  fix f;
  fix_init(&f, 1.0f, 1.0f);
  loom_tensor *y = NULL, *p = NULL, *s = NULL, *s2 = NULL, *t = NULL;
  LT_OK(loom_linear(f.x, f.w, f.b, &y));
  LT_OK(loom_sum(y, NULL, 0, false, &s));
  LT_OK(loom_mul(f.w, f.w, &p)); /* w also feeds an op that cannot bound what it writes */
  LT_OK(loom_sum(p, NULL, 0, false, &s2));
  LT_OK(loom_add(s, s2, &t));
  LT_OK(loom_backward(t, NULL, false));
  LT_EQ(kind_of(f.w, NULL), LOOM_GRAD_BOUND_UNKNOWN);
  LT_EQ(kind_of(f.b, NULL), LOOM_GRAD_BOUND_FINITE);
  loom_tensor_free(y), loom_tensor_free(p), loom_tensor_free(s), loom_tensor_free(s2);
  loom_tensor_free(t);
  fix_free(&f);
}

LT_TEST(grad_bound_under_bf16_autocast_holds_for_the_f32_master_weight) {
  fix f;
  fix_init(&f, 3.0f, 2.0f);
  backward(&f, LOOM_AUTOCAST_BF16);
  double bw = 0;
  LT_EQ(kind_of(f.w, &bw), LOOM_GRAD_BOUND_FINITE);
  double gw = max_abs(loom_tensor_grad(f.w));
  LT_TRUE(gw > 0 && gw <= bw);
  /* the bound comes from the bf16 copies the GEMM used: within bf16 rounding of the f32 one */
  LT_NEAR(bw, R * max_abs(f.x) * max_abs(f.c), R * max_abs(f.x) * max_abs(f.c) * 1e-2);
  fix_free(&f);
}

LT_TEST(grad_bound_bad_calls_are_named_errors) {
  fix f;
  fix_init(&f, 1.0f, 1.0f);
  loom_tensor *y = NULL;
  LT_OK(loom_linear(f.x, f.w, f.b, &y));
  LT_ERR(loom_tensor_track_grad_bound(y, true), LOOM_EMISUSE, "not a leaf");
  LT_ERR(loom_tensor_track_grad_bound(NULL, true), LOOM_EINVAL, "loom_tensor_track_grad_bound");
  loom_grad_bound_kind k;
  LT_ERR(loom_tensor_grad_bound(f.w, NULL, NULL), LOOM_EINVAL, "kind is NULL");
  LT_ERR(loom_tensor_grad_bound(NULL, &k, NULL), LOOM_EINVAL, "loom_tensor_grad_bound");
  /* off more often than on: stays off */
  LT_OK(loom_tensor_track_grad_bound(f.w, false));
  LT_OK(loom_tensor_track_grad_bound(f.w, false));
  loom_tensor_free(y);
  fix_free(&f);
}

static float bits_f32(uint32_t b) {
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}

/* ---- the absmax kernels: every level against the scalar reference ------------------------ */

enum { AM_NSP = 12, AM_BIG = (1 << 17) + 45 };

/* Per dtype (f32, f16, bf16): +-inf, quiet and signalling NaN, negative NaNs (one all ones),
 * -0, the smallest and largest subnormal, the largest finite of both signs, the smallest normal. */
static const uint32_t am_specials[3][AM_NSP] = {
    {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffc00000u, 0xffffffffu, 0x80000000u,
     0x00000001u, 0x807fffffu, 0x7f7fffffu, 0xff7fffffu, 0x00800000u},
    {0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfe00, 0xffff, 0x8000, 0x0001, 0x83ff, 0x7bff, 0xfbff,
     0x0400},
    {0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffc0, 0xffff, 0x8000, 0x0001, 0x807f, 0x7f7f, 0xff7f,
     0x0080},
};
static const loom_dtype am_dts[3] = {LOOM_F32, LOOM_F16, LOOM_BF16};

static uint32_t am_get(const void *p, size_t es, size_t i) {
  return es == 4 ? ((const uint32_t *)p)[i] : ((const uint16_t *)p)[i];
}
static void am_set(void *p, size_t es, size_t i, uint32_t v) {
  if (es == 4) ((uint32_t *)p)[i] = v;
  else ((uint16_t *)p)[i] = (uint16_t)v;
}

/* The magnitude of the bits v of dt, INFINITY for inf and NaN: the answer worked out apart
 * from the kernels (through the public conversions). */
static double am_mag(loom_dtype dt, uint32_t v) {
  float f;
  if (dt == LOOM_F32) memcpy(&f, &v, 4);
  else {
    uint16_t h = (uint16_t)v;
    if (dt == LOOM_F16) loom_cvt_f16_to_f32(&h, &f, 1);
    else loom_cvt_bf16_to_f32(&h, &f, 1);
  }
  return isfinite(f) ? fabs(f) : INFINITY;
}

static uint64_t am_rng = 0x2545f4914f6cdd1dull;
static uint32_t am_rand(void) {
  am_rng ^= am_rng << 13, am_rng ^= am_rng >> 7, am_rng ^= am_rng << 17;
  return (uint32_t)(am_rng >> 32);
}

/* p[0..n) of dt: random finite values of magnitude below 2 (some -0, some subnormal), or, when
 * zeros, all -0 (so whatever special goes in is the maximum); pre[i] / suf[i] the largest
 * magnitude before i / from i on (suf has n + 1 entries). */
static void am_fill(loom_dtype d, void *p, size_t n, bool zeros, double *pre, double *suf) {
  size_t es = loom_dtype_size(am_dts[d]);
  for (size_t i = 0; i < n; i++) {
    uint32_t r = am_rand(), v;
    if (zeros) v = 0x80000000u;
    else if ((r & 31) == 0) v = (r & 0x80000000u) | ((r >> 5) & 0x7fffffu); /* f32 subnormal */
    else v = (r & 0x807fffffu) | ((uint32_t)(96 + (r >> 8) % 32) << 23); /* 2^-31 .. < 2 */
    uint16_t h = 0;
    if (am_dts[d] == LOOM_F16) {
      float f;
      memcpy(&f, &v, 4);
      loom_cvt_f32_to_f16(&f, &h, 1);
    }
    am_set(p, es, i, am_dts[d] == LOOM_F32 ? v : am_dts[d] == LOOM_F16 ? h : v >> 16);
  }
  pre[0] = 0;
  for (size_t i = 0; i < n; i++) pre[i + 1] = fmax(pre[i], am_mag(am_dts[d], am_get(p, es, i)));
  suf[n] = 0;
  for (size_t i = n; i-- > 0;) suf[i] = fmax(suf[i + 1], am_mag(am_dts[d], am_get(p, es, i)));
}

/* Every supported level (scalar included) on p[0..n) with special s at pos: the independent
 * answer, and the scalar reference's bits on every SIMD level. False (after reporting) on
 * the first mismatch. */
static bool am_check(int d, const void *p, size_t n, size_t pos, uint32_t s, const double *pre,
                     const double *suf) {
  double want = fmax(fmax(pre[pos], suf[pos + 1]), am_mag(am_dts[d], s));
  for (int lv = 0; lv < LOOM_CPU_LEVEL_COUNT; lv++) {
    if (!loom_cpu_supports((loom_cpu_level)lv)) continue;
    double got = loom__absmax_level(p, am_dts[d], n, (loom_cpu_level)lv);
    if (got != want) {
      lt_fail_at(__FILE__, __LINE__, "absmax %s level %s n %zu: 0x%x at %zu gives %g, want %g",
                 loom_dtype_name(am_dts[d]), loom_cpu_level_name((loom_cpu_level)lv), n,
                 (unsigned)s, pos, got, want);
      return false;
    }
  }
  return true;
}

/* One length: each special at each position in `at` (all of them when NULL), over a random
 * background and an all -0 one, the buffer starting off = n % 3 elements past an aligned one. */
static bool am_sweep(int d, unsigned char *buf, size_t n, const size_t *at, size_t nat,
                     double *pre, double *suf) {
  size_t es = loom_dtype_size(am_dts[d]);
  void *p = buf + (n % 3) * es; /* misaligned starts */
  for (int zeros = 0; zeros < 2; zeros++) {
    am_fill(d, p, n, zeros, pre, suf);
    for (size_t k = 0; k < (at ? nat : n); k++) {
      size_t pos = at ? at[k] : k;
      uint32_t keep = am_get(p, es, pos);
      for (int j = 0; j < AM_NSP; j++) {
        am_set(p, es, pos, am_specials[d][j]);
        bool ok = am_check(d, p, n, pos, am_specials[d][j], pre, suf);
        am_set(p, es, pos, keep);
        if (!ok) return false;
      }
    }
    if (n && !am_check(d, p, n, 0, am_get(p, es, 0), pre, suf)) return false; /* unchanged */
  }
  return true;
}

LT_TEST(grad_bound_absmax_every_level_matches_scalar) {
  unsigned char *buf = malloc((AM_BIG + 3) * 4);
  double *pre = malloc((AM_BIG + 1) * sizeof *pre), *suf = malloc((AM_BIG + 1) * sizeof *suf);
  LT_TRUE(buf && pre && suf);
  for (int d = 0; d < 3 && buf && pre && suf; d++) {
    bool ok = true;
    for (size_t n = 0; n <= 200 && ok; n++) ok = am_sweep(d, buf, n, NULL, 0, pre, suf);
    static const size_t bigs[2] = {4096 + 67, AM_BIG};
    for (int b = 0; b < 2 && ok; b++) { /* the ends of the vector loops and the tails */
      size_t n = bigs[b], at[] = {0,      1,      7,      8,      15,     16,     31,    32,
                                  63,     64,     65,     n / 2,  n - 70, n - 64, n - 63, n - 33,
                                  n - 32, n - 17, n - 16, n - 9,  n - 8,  n - 2,  n - 1};
      ok = am_sweep(d, buf, n, at, sizeof at / sizeof at[0], pre, suf);
    }
  }
  free(buf);
  free(pre);
  free(suf);
  if (loom_cpu_level_best() == LOOM_CPU_SCALAR) lt_skip("no SIMD level on this CPU");
}

LT_TEST(grad_bound_absmax_reference) {
  /* the reference itself: the largest magnitude, -0 and subnormals, inf and NaN anywhere */
  float v[67];
  for (int i = 0; i < 67; i++) v[i] = (float)(i % 5) - 2.0f;
  v[40] = -6.5f;
  LT_TRUE(loom__absmax(v, LOOM_F32, 67) == 6.5);
  v[3] = bits_f32(0x80000001u); /* negative subnormal: smaller than 6.5 */
  LT_TRUE(loom__absmax(v, LOOM_F32, 67) == 6.5);
  LT_TRUE(loom__absmax(v, LOOM_F32, 0) == 0);
  for (int at = 0; at < 67; at += 33) {
    float w[67];
    memcpy(w, v, sizeof w);
    w[at] = -INFINITY;
    LT_TRUE(loom__absmax(w, LOOM_F32, 67) == INFINITY);
    w[at] = NAN;
    LT_TRUE(loom__absmax(w, LOOM_F32, 67) == INFINITY);
    uint16_t hw[67], bw[67];
    loom_cvt_f32_to_f16(w, hw, 67);
    loom_cvt_f32_to_bf16(w, bw, 67);
    LT_TRUE(loom__absmax(hw, LOOM_F16, 67) == INFINITY);
    LT_TRUE(loom__absmax(bw, LOOM_BF16, 67) == INFINITY);
  }
  uint16_t hv[67], bv[67];
  loom_cvt_f32_to_f16(v, hv, 67);
  loom_cvt_f32_to_bf16(v, bv, 67);
  LT_TRUE(loom__absmax(hv, LOOM_F16, 67) == 6.5);
  LT_TRUE(loom__absmax(bv, LOOM_BF16, 67) == 6.5);
  hv[10] = 0x7bff; /* f16's largest finite, 65504 */
  LT_TRUE(loom__absmax(hv, LOOM_F16, 67) == 65504.0);
}
