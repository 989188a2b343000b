/* test_unary_levels.c: every unary kernel (forward and backward) on every CPU level this
 * machine has, against the scalar reference table, at ragged lengths and misalignments. */
#include "lt.h"
#include "ops/unary_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

LT_TEST(unary_kernels_every_level_matches_scalar) {
  const loom__unary_kernels_t *ref = loom__unary_kernels_level(LOOM_CPU_SCALAR);
  enum { N = 300 };
  float x[N + 1], g[N + 1], y0[N + 1], y1[N + 1], gx0[N + 1], gx1[N + 1];
  int levels = 0;
  for (int lv = LOOM_CPU_AVX2; lv < LOOM_CPU_LEVEL_COUNT; lv++) {
    if (!loom_cpu_supports((loom_cpu_level)lv)) continue;
    levels++;
    const loom__unary_kernels_t *k = loom__unary_kernels_level((loom_cpu_level)lv);
    for (int u = 0; u < LOOM__U_COUNT; u++) {
      bool positive = u == LOOM__U_LOG || u == LOOM__U_SQRT || u == LOOM__U_POW;
      for (int i = 0; i <= N; i++) {
        x[i] = positive ? 0.1f + (float)((i * 37) % 101) / 25.0f : (float)((i * 37) % 101) / 12.5f - 4.0f;
        g[i] = (float)((i * 13) % 29) / 7.0f - 2.0f;
      }
      for (size_t n = 1; n <= N; n = n < 40 ? n + 1 : n * 2) {
        size_t off = n % 2; /* misaligned starts too */
        float p = u == LOOM__U_POW ? 1.7f : 0.75f;
        ref->fwd[u](y0 + off, x + off, n, p);
        k->fwd[u](y1 + off, x + off, n, p);
        ref->bwd[u](gx0 + off, g + off, x + off, y0 + off, n, p);
        k->bwd[u](gx1 + off, g + off, x + off, y0 + off, n, p);
        for (size_t i = off; i < n + off; i++) {
          if (!(fabsf(y0[i] - y1[i]) <= 1e-6f * (1 + fabsf(y0[i]))))
            lt_fail_at(__FILE__, __LINE__, "%s level %s fwd[%zu]: %g vs scalar %g",
                       loom__unary_def_get((loom__unary)u)->name,
                       loom_cpu_level_name((loom_cpu_level)lv), i, y1[i], y0[i]);
          if (!(fabsf(gx0[i] - gx1[i]) <= 1e-6f * (1 + fabsf(gx0[i]))))
            lt_fail_at(__FILE__, __LINE__, "%s level %s bwd[%zu]: %g vs scalar %g",
                       loom__unary_def_get((loom__unary)u)->name,
                       loom_cpu_level_name((loom_cpu_level)lv), i, gx1[i], gx0[i]);
        }
      }
    }
  }
  if (!levels) lt_skip("no SIMD level on this CPU");
}

LT_TEST(unary_ops_agree_across_levels) {
  /* the op itself, run with each level active, gives the scalar level's values */
  int64_t shape[] = {257};
  loom_tensor *x = NULL, *y[LOOM_CPU_LEVEL_COUNT] = {0};
  LT_OK(loom_tensor_empty(LOOM_F32, 1, shape, &x));
  float *xp = loom_tensor_data(x);
  for (int i = 0; i < 257; i++) xp[i] = (float)(i % 17) / 4.0f - 2.0f;
  loom_cpu_level keep = loom_cpu_level_active();
  for (int lv = 0; lv < LOOM_CPU_LEVEL_COUNT; lv++) {
    if (!loom_cpu_supports((loom_cpu_level)lv)) continue;
    LT_OK(loom_set_cpu_level((loom_cpu_level)lv));
    LT_OK(loom_gelu(x, LOOM_GELU_TANH, &y[lv]));
  }
  loom_set_cpu_level(keep);
  for (int lv = 1; lv < LOOM_CPU_LEVEL_COUNT; lv++) {
    if (!y[lv]) continue;
    const float *a = loom_tensor_data(y[0]), *b = loom_tensor_data(y[lv]);
    for (int i = 0; i < 257; i++) LT_NEAR(a[i], b[i], 1e-6 * (1 + fabs(a[i])));
  }
  for (int lv = 0; lv < LOOM_CPU_LEVEL_COUNT; lv++) loom_tensor_free(y[lv]);
  loom_tensor_free(x);
}

/* The all-bit-pattern tests' buffers of NPAT elements: x every 16-bit pattern, y / yr 16-bit
 * results, xf / yf f32 ones, g a gradient, gx / gr f32 gradients. */
enum { NPAT = 65536 };
typedef struct pats {
  uint16_t *x, *y, *yr;
  float *xf, *yf, *g, *gx, *gr;
} pats;

static void pats_free(pats *p) {
  free(p->x), free(p->y), free(p->yr), free(p->xf), free(p->yf), free(p->g), free(p->gx),
      free(p->gr);
}

static bool pats_new(pats *p) {
  p->x = malloc(NPAT * sizeof *p->x), p->y = malloc(NPAT * sizeof *p->y);
  p->yr = malloc(NPAT * sizeof *p->yr), p->xf = malloc(NPAT * sizeof *p->xf);
  p->yf = malloc(NPAT * sizeof *p->yf), p->g = malloc(NPAT * sizeof *p->g);
  p->gx = malloc(NPAT * sizeof *p->gx), p->gr = malloc(NPAT * sizeof *p->gr);
  if (!(p->x && p->y && p->yr && p->xf && p->yf && p->g && p->gx && p->gr)) {
    pats_free(p);
    return false;
  }
  for (int i = 0; i < NPAT; i++) p->x[i] = (uint16_t)i;
  return true;
}

LT_TEST(unary_relu16_every_level_matches_the_f32_kernel_on_all_bit_patterns) {
  /* relu on f16/bf16 bits against the f32 kernel through exact conversions, for every one of
   * the 65536 values (NaNs, -0, subnormals, infinities), forward and backward */
  enum { N = NPAT };
  pats p;
  LT_TRUE(pats_new(&p));
  uint16_t *x = p.x, *y = p.y, *yr = p.yr;
  float *xf = p.xf, *yf = p.yf, *g = p.g, *gx = p.gx, *gr = p.gr;
  const loom__unary_kernels_t *ref = loom__unary_kernels_level(LOOM_CPU_SCALAR);
  for (int i = 0; i < N; i++) g[i] = (float)(i % 7) - 3.0f;
  for (int bf = 0; bf < 2; bf++) {
    loom_dtype dt = bf ? LOOM_BF16 : LOOM_F16;
    uint16_t inf = bf ? 0x7f80 : 0x7c00;
    LT_OK(loom_convert(x, dt, xf, LOOM_F32, N));
    ref->fwd[LOOM__U_RELU](yf, xf, N, 0);
    LT_OK(loom_convert(yf, LOOM_F32, yr, dt, N));
    ref->bwd[LOOM__U_RELU](gr, g, xf, yf, N, 0);
    for (int lv = 0; lv < LOOM_CPU_LEVEL_COUNT; lv++) {
      if (!loom_cpu_supports((loom_cpu_level)lv)) continue;
      const loom__unary_kernels_t *k = loom__unary_kernels_level((loom_cpu_level)lv);
      k->relu16(y, x, N, inf);
      k->relu16_bwd(gx, g, yr, N, inf);
      int bad = 0;
      for (int i = 0; i < N && bad < 5; i++) {
        if (y[i] != yr[i] || gx[i] != gr[i]) {
          bad++;
          lt_fail_at(__FILE__, __LINE__, "%s relu16 level %s at 0x%04x: y 0x%04x gx %g, want 0x%04x %g",
                     loom_dtype_name(dt), loom_cpu_level_name((loom_cpu_level)lv), i, y[i], gx[i],
                     yr[i], gr[i]);
        }
      }
    }
  }
  pats_free(&p);
}

LT_TEST(unary_gelu_tanh_bf16_direct_equals_staged_f32_on_all_bit_patterns) {
  /* GELU (tanh) read and written as bf16 directly, on every level, against the same level's f32
   * kernels on the widened values with the core's rounding, bit for bit, for all 65536 inputs
   * (NaNs, -0, subnormals, infinities); whole and from an odd start (a ragged tail) */
  enum { N = NPAT };
  pats p;
  LT_TRUE(pats_new(&p));
  uint16_t *x = p.x, *y = p.y, *yr = p.yr;
  float *xf = p.xf, *yf = p.yf, *g = p.g, *gx = p.gx, *gr = p.gr;
  for (int i = 0; i < N; i++) g[i] = (float)(i % 11) / 3.0f - 1.5f;
  LT_OK(loom_convert(x, LOOM_BF16, xf, LOOM_F32, N));
  for (int lv = 0; lv < LOOM_CPU_LEVEL_COUNT; lv++) {
    if (!loom_cpu_supports((loom_cpu_level)lv)) continue;
    const loom__unary_kernels_t *k = loom__unary_kernels_level((loom_cpu_level)lv);
    k->fwd[LOOM__U_GELU_TANH](yf, xf, N, 0);
    LT_OK(loom_convert(yf, LOOM_F32, yr, LOOM_BF16, N));
    k->bwd[LOOM__U_GELU_TANH](gr, g, xf, NULL, N, 0);
    for (int off = 0; off < 2; off++) {
      memset(y, 0, N * sizeof *y);
      memset(gx, 0, N * sizeof *gx);
      k->gelu_tanh_bf16(y + off, x + off, N - off);
      k->gelu_tanh_bf16_bwd(gx + off, g + off, x + off, N - off);
      int bad = 0;
      for (int i = off; i < N && bad < 5; i++) {
        if (y[i] != yr[i] || memcmp(&gx[i], &gr[i], sizeof gx[i]) != 0) {
          bad++;
          lt_fail_at(__FILE__, __LINE__,
                     "gelu_tanh bf16 level %s at 0x%04x: y 0x%04x gx %g, staged 0x%04x %g",
                     loom_cpu_level_name((loom_cpu_level)lv), i, y[i], gx[i], yr[i], gr[i]);
        }
      }
    }
  }
  pats_free(&p);
}

/* Distance in units in the last place between two floats of the same sign (the ordered bit
 * patterns' difference), 0 for two NaNs, huge for a NaN against a number. */
static int64_t ulps(float a, float b) {
  if (a != a || b != b) return (a != a && b != b) ? 0 : INT64_MAX;
  int32_t ia, ib;
  memcpy(&ia, &a, 4), memcpy(&ib, &b, 4);
  int64_t oa = ia < 0 ? (int64_t)INT32_MIN - ia : ia, ob = ib < 0 ? (int64_t)INT32_MIN - ib : ib;
  return oa > ob ? oa - ob : ob - oa;
}

LT_TEST(unary_tanh_every_level_within_3_ulp_of_libm_over_all_floats) {
  /* the SIMD levels' tanh (tanh itself, and inside GELU's tanh form) against glibc's tanhf on
   * every 127th bit pattern of the 2^32 (all exponents, both signs, subnormals, NaNs, infs), and
   * on the specials; measured: max 2 ulp at avx2 and avx512 (documented bound 3) */
  enum { CH = 4096 };
  static float x[CH], y[CH];
  static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 0.625f,
                                  -0.625f, 0.62499994f, 9.0f, 9.02f, -9.02f, 88.0f, 1e30f,
                                  -1e30f, 1e-40f, -1e-40f, 3.4e38f, -3.4e38f};
  int levels = 0;
  for (int lv = LOOM_CPU_AVX2; lv < LOOM_CPU_LEVEL_COUNT; lv++) {
    if (!loom_cpu_supports((loom_cpu_level)lv)) continue;
    levels++;
    const loom__unary_kernels_t *k = loom__unary_kernels_level((loom_cpu_level)lv);
    int64_t worst = 0;
    float worst_x = 0, worst_y = 0;
    uint64_t u = 0;
    size_t ns = sizeof special / sizeof special[0];
    for (int first = 1; u < (1ull << 32); first = 0) {
      size_t m = 0;
      if (first) for (; m < ns; m++) x[m] = special[m];
      for (; m < CH && u < (1ull << 32); m++, u += 127) {
        uint32_t b = (uint32_t)u;
        memcpy(&x[m], &b, 4);
      }
      k->fwd[LOOM__U_TANH](y, x, m, 0);
      for (size_t i = 0; i < m; i++) {
        int64_t d = ulps(y[i], tanhf(x[i]));
        if (x[i] == 0 && signbit(y[i]) != signbit(x[i])) d = INT64_MAX; /* -0 stays -0 */
        if (d > worst) worst = d, worst_x = x[i], worst_y = y[i];
      }
    }
    if (worst > 3)
      lt_fail_at(__FILE__, __LINE__, "tanh level %s: %lld ulp from tanhf at x = %.9g (%.9g vs "
                 "%.9g)", loom_cpu_level_name((loom_cpu_level)lv), (long long)worst, worst_x,
                 worst_y, tanhf(worst_x));
    else
      printf("  tanh level %s: max %lld ulp from tanhf (at x = %.9g)\n",
             loom_cpu_level_name((loom_cpu_level)lv), (long long)worst, worst_x);
  }
  if (!levels) lt_skip("no SIMD level on this CPU");
}
