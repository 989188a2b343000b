/* test_widened.c: bf16 and f16 GEMMs and convolutions on CPUs where oneDNN has no kernel for
 * them (bf16 without AVX-512, f16 everywhere): loom widens the operands to f32 (as copies, or
 * as loom's own AVX2 or AVX-512 GEMM packs them) and must give bit for bit the f32 product of
 * the same values by the same f32 kernel, with a 16-bit output rounded once from it.
 * Also: the one-time probe says "not native" whenever the CPU, LOOM_CPU or oneDNN's own cap
 * rules AVX-512 out, and f32 is always native. Where bf16 is native (an AVX-512 machine with no
 * cap) the bitwise checks do not apply and test_gemm / test_conv's tolerances cover it. */
#include "lt.h"
#include "ops/gemm.h"
#include "ops/gemm_avx2.h"
#include "ops/gemm_avx512.h"

#include <stdlib.h>

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float rnd(void) { /* uniform in [-1, 1) */
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((rng >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

/* n random values rounded to dt, and their exact f32 copy. */
static void rand_pair(loom_dtype dt, size_t n, void **low, float **wide) {
  *wide = malloc(n * sizeof(float));
  *low = malloc(n * loom_dtype_size(dt));
  for (size_t i = 0; i < n; i++) (*wide)[i] = rnd();
  loom_convert(*wide, LOOM_F32, *low, dt, n);
  loom_convert(*low, dt, *wide, LOOM_F32, n);
}

/* got (dt) is want (f32) rounded to dt, element for element. */
static int rounded_equal(const void *got, loom_dtype dt, const float *want, size_t n,
                         const char *what) {
  void *r = malloc(n * loom_dtype_size(dt));
  loom_convert(want, LOOM_F32, r, dt, n);
  int bad = memcmp(got, r, n * loom_dtype_size(dt)) != 0;
  if (bad) lt_fail_at(__FILE__, __LINE__, "%s: %s output is not the f32 result rounded once", what,
                      loom_dtype_name(dt));
  free(r);
  return bad;
}

static bool capped_below_avx512(void) {
  const char *l = getenv("LOOM_CPU"), *o = getenv("ONEDNN_MAX_CPU_ISA");
  const char *d = getenv("DNNL_MAX_CPU_ISA");
  bool loom_cap = l && (strcmp(l, "avx2") == 0 || strcmp(l, "scalar") == 0);
  bool dnnl_cap = (o && strncmp(o, "AVX512", 6) != 0) || (!o && d && strncmp(d, "AVX512", 6) != 0);
  return !loom_cpu_supports(LOOM_CPU_AVX512) || (o || d ? dnnl_cap : loom_cap);
}

LT_TEST(widened_probe_answers) {
  LT_TRUE(loom__gemm_native(LOOM_F32));
  LT_TRUE(loom__conv2d_native(LOOM_F32));
  LT_TRUE(!loom__gemm_native(LOOM_F16));
  LT_TRUE(!loom__conv2d_native(LOOM_F16));
  if (capped_below_avx512()) {
    LT_TRUE(!loom__gemm_native(LOOM_BF16));
    LT_TRUE(!loom__conv2d_native(LOOM_BF16));
  }
  /* the probe does not leave its failure behind as the thread's last error */
  loom_clear_error();
  (void)loom__gemm_native(LOOM_BF16);
  LT_STREQ(loom_last_error(), "");
}

/* C = alpha A op(B) + bias + beta C on 16-bit operands against the f32 GEMM of their values. */
static void gemm_case(loom_dtype dt, loom_dtype cdt, bool tb, float beta, int64_t batch) {
  const int64_t M = 37, N = 29, K = 70;
  size_t na = (size_t)(batch * M * K), nb = (size_t)(batch * K * N), nc = (size_t)(batch * M * N);
  void *A, *B, *C;
  float *a, *b, *c, *bias = malloc((size_t)N * sizeof *bias);
  rand_pair(dt, na, &A, &a);
  rand_pair(dt, nb, &B, &b);
  rand_pair(cdt == LOOM_F32 ? dt : cdt, nc, &C, &c);
  if (cdt == LOOM_F32) { /* an f32 C starts from the same values */
    free(C);
    C = malloc(nc * sizeof(float));
    memcpy(C, c, nc * sizeof(float));
  }
  for (int64_t i = 0; i < N; i++) bias[i] = rnd();
  loom__gemm_args g = {.trans_b = tb, .batch = batch, .M = M, .N = N, .K = K, .alpha = 1.0f,
                       .beta = beta, .lda = K, .stride_a = M * K, .ldb = tb ? K : N,
                       .stride_b = K * N, .ldc = N, .stride_c = M * N, .ab_dtype = dt,
                       .c_dtype = cdt, .bias = bias};
  loom__gemm_args f = g;
  g.A = A, g.B = B, g.C = C;
  f.A = a, f.B = b, f.C = c, f.ab_dtype = LOOM_F32, f.c_dtype = LOOM_F32;
  LT_OK(loom__gemm(&g));
  /* where loom's own AVX2 or AVX-512 GEMM takes 16-bit operands (widened as it packs them),
   * the f32 product is that kernel's on the f32 copies: the same sums in the same order */
  LT_OK(loom__gemm_avx2_wanted(&g)     ? loom__gemm_avx2(&f)
        : loom__gemm_avx512_wanted(&g) ? loom__gemm_avx512(&f)
                                       : loom__gemm(&f));
  char what[96];
  snprintf(what, sizeof what, "gemm %s->%s tb %d beta %g batch %lld", loom_dtype_name(dt),
           loom_dtype_name(cdt), tb, (double)beta, (long long)batch);
  if (cdt == LOOM_F32) {
    if (memcmp(C, c, nc * sizeof(float)) != 0)
      lt_fail_at(__FILE__, __LINE__, "%s: not the f32 product bit for bit", what);
  } else {
    rounded_equal(C, cdt, c, nc, what);
  }
  free(A), free(B), free(C), free(a), free(b), free(c), free(bias);
}

static void gemm_sweep(loom_dtype dt) {
  if (loom__gemm_native(dt)) {
    lt_skip("oneDNN has a native kernel for this dtype here (test_gemm covers it)");
    return;
  }
  for (int c = 0; c < 2; c++)
    for (int t = 0; t < 4; t++) gemm_case(dt, c ? dt : LOOM_F32, t & 1, (float)(t >> 1), 1 + c * 2);
}

LT_TEST(widened_gemm_bf16_is_the_f32_product) { gemm_sweep(LOOM_BF16); }
LT_TEST(widened_gemm_f16_is_the_f32_product) { gemm_sweep(LOOM_F16); }

/* Forward, backward-data and backward-weights (with bias) against the f32 passes. */
static void conv_sweep(loom_dtype dt) {
  if (loom__conv2d_native(dt)) {
    lt_skip("oneDNN has native convolutions for this dtype here (test_conv covers them)");
    return;
  }
  loom__conv2d_args s = {.N = 2, .C = 3, .H = 9, .W = 8, .O = 5, .KH = 3, .KW = 3,
                         .stride_h = 2, .stride_w = 1, .pad_h = 1, .pad_w = 1, .dtype = dt};
  loom__conv2d_args f = s;
  f.dtype = LOOM_F32;
  int64_t oh = (s.H + 2 * s.pad_h - s.KH) / s.stride_h + 1, ow = (s.W + 2 * s.pad_w - s.KW) + 1;
  size_t nx = (size_t)(s.N * s.C * s.H * s.W), nw = (size_t)(s.O * s.C * s.KH * s.KW);
  size_t ny = (size_t)(s.N * s.O * oh * ow), nb = (size_t)s.O;
  void *x, *w, *b, *dy;
  float *xf, *wf, *bf, *dyf;
  rand_pair(dt, nx, &x, &xf);
  rand_pair(dt, nw, &w, &wf);
  rand_pair(dt, nb, &b, &bf);
  rand_pair(dt, ny, &dy, &dyf);
  size_t most = nx > ny ? nx : ny;
  void *got = malloc(most * 2), *gotb = malloc(nb * 2);
  float *want = malloc(most * sizeof(float)), *wantb = malloc(nb * sizeof(float));
  LT_OK(loom__conv2d_fwd(&s, x, w, b, got));
  LT_OK(loom__conv2d_fwd(&f, xf, wf, bf, want));
  rounded_equal(got, dt, want, ny, "conv forward");
  LT_OK(loom__conv2d_bwd_data(&s, dy, w, got));
  LT_OK(loom__conv2d_bwd_data(&f, dyf, wf, want));
  rounded_equal(got, dt, want, nx, "conv backward-data");
  LT_OK(loom__conv2d_bwd_weights(&s, x, dy, got, gotb));
  LT_OK(loom__conv2d_bwd_weights(&f, xf, dyf, want, wantb));
  rounded_equal(got, dt, want, nw, "conv backward-weights");
  rounded_equal(gotb, dt, wantb, nb, "conv backward-bias");
  free(x), free(w), free(b), free(dy), free(xf), free(wf), free(bf), free(dyf);
  free(got), free(gotb), free(want), free(wantb);
}

LT_TEST(widened_conv_bf16_is_the_f32_convolution) { conv_sweep(LOOM_BF16); }
LT_TEST(widened_conv_f16_is_the_f32_convolution) { conv_sweep(LOOM_F16); }
