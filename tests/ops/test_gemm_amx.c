/* test_gemm_amx.c: loom's AMX bf16 GEMM (loom__gemm_bf16_amx) against the scalar reference on
 * shapes that exercise every edge of its blocking: sizes that are not multiples of a tile (16
 * rows / columns, 32 deep), K longer than one K block (256) and N wider than one B panel
 * (256 columns), one and two threads, every transpose, padded leading dimensions, alpha, beta
 * 0 and 1, a bias, batches with a broadcast operand, C in f32 and bf16; loom__gemm routed to it
 * (mode ALWAYS) on the same; its errors; and the rule that chooses it (loom__gemm_prefer_amx),
 * including the LOOM_CPU cap routing away. Skipped where the CPU or the kernel grants no AMX
 * (the rule then never picks it, which is tested everywhere). Tolerance: test_gemm.c's. */
#include "gemm_cases.h"
#include "lt.h"
#include "ops/gemm.h"

#include <loom/loom.h>

static bool have_amx(void) {
  if (!loom__gemm_amx_available()) {
    lt_skip("this CPU (or the kernel) runs no AMX");
    return false;
  }
  return true;
}

/* M, N, K: ragged tiles; K > 256 (several K blocks) and N > 256 (several panels). */
static const int64_t amx_dims[][3] = {{1, 1, 1},     {15, 17, 31},   {16, 16, 32},
                                      {33, 47, 95},  {64, 64, 64},   {129, 31, 257},
                                      {40, 520, 70}, {40, 290, 300}, {50, 33, 520}};
#define NAMX (int)(sizeof amx_dims / sizeof amx_dims[0])

/* Shapes whose C tiles are whole (M, N multiples of 16), for the direct f32 path. */
static const int64_t whole_dims[][3] = {{16, 16, 32}, {48, 16, 64}, {32, 288, 300}};

static void amx_sweep(gemm_fn kernel, loom_dtype cdt) {
  sweep_dims(kernel, amx_dims, NAMX, LOOM_BF16, cdt);
  for (int d = 0; d < 3; d++) /* alpha 1, no bias, beta 0 and 1: f32 C copied, or summed from */
    for (int t = 0; t < 8; t++) {
      const int64_t *w = whole_dims[d];
      shape s = {1,     w[0],  w[1], w[2], t & 1, (t >> 1) & 1, 0, false,
                 false, 1.0f, (float)(t >> 2), false};
      LT_EQ(check_with(kernel, s, LOOM_BF16, cdt), 0);
    }
  for (int bc = 0; bc < 4; bc++) /* batches: none, A, B, both broadcast */
    for (int t = 0; t < 4; t++) {
      shape s = {3,      33,      40, 260, t & 1, (t >> 1) & 1, t == 3 ? 2 : 0, bc & 1, bc >> 1,
                 t == 2 ? 0.25f : 1.0f, (float)(t & 1), false};
      LT_EQ(check_with(kernel, s, LOOM_BF16, cdt), 0);
    }
  for (int t = 0; t < 8; t++) { /* a bias, beta 0 and 1, 2-D and batched */
    shape s = {t & 4 ? 2 : 1, 17, 290, 65, t & 1, false, 0, false, (t & 4) && (t & 1), 1.0f,
               (float)((t >> 1) & 1), true};
    LT_EQ(check_with(kernel, s, LOOM_BF16, cdt), 0);
  }
}

LT_TEST(gemm_amx_matches_ref) {
  if (!have_amx()) return;
  int threads = loom__gemm_threads();
  loom__gemm_set_threads(1);
  amx_sweep(loom__gemm_bf16_amx, LOOM_F32);
  amx_sweep(loom__gemm_bf16_amx, LOOM_BF16);
  loom__gemm_set_threads(2);
  amx_sweep(loom__gemm_bf16_amx, LOOM_F32);
  loom__gemm_set_threads(threads);
  /* test_gemm.c's own sweep too */
  sweep_with(loom__gemm_bf16_amx, LOOM_BF16, LOOM_F32);
  sweep_with(loom__gemm_bf16_amx, LOOM_BF16, LOOM_BF16);
}

/* loom__gemm with the choice forced: every bf16 call goes to AMX, and gives the same answers. */
LT_TEST(gemm_amx_through_loom_gemm) {
  if (!have_amx()) return;
  loom__gemm_amx_set_mode(LOOM__GEMM_AMX_ALWAYS);
  amx_sweep(loom__gemm, LOOM_F32);
  loom__gemm_amx_set_mode(LOOM__GEMM_AMX_FROM_ENV);
}

LT_TEST(gemm_amx_bad_arguments) {
  uint16_t A[4] = {0}, B[4] = {0}, C[4] = {0};
  const loom__gemm_args ok = {.batch = 1, .M = 2, .N = 2, .K = 2, .alpha = 1, .A = A,
                              .lda = 2, .B = B, .ldb = 2, .C = C, .ldc = 2,
                              .ab_dtype = LOOM_BF16, .c_dtype = LOOM_BF16};
  loom__gemm_args g;
  LT_ERR(loom__gemm_bf16_amx(NULL), LOOM_EINVAL, "args is NULL");
  g = ok, g.B = NULL;
  LT_ERR(loom__gemm_bf16_amx(&g), LOOM_EINVAL, "B is NULL");
  g = ok, g.beta = 2.0f;
  LT_ERR(loom__gemm_bf16_amx(&g), LOOM_EINVAL, "beta must be 0 or 1");
  g = ok, g.ldb = 1;
  LT_ERR(loom__gemm_bf16_amx(&g), LOOM_ESHAPE, "leading dimension 1 of B");
  g = ok, g.ab_dtype = LOOM_F32, g.c_dtype = LOOM_F32;
  LT_ERR(loom__gemm_bf16_amx(&g), LOOM_EDTYPE, "takes bf16 A and B");
  g = ok, g.ab_dtype = LOOM_F16, g.c_dtype = LOOM_F16;
  LT_ERR(loom__gemm_bf16_amx(&g), LOOM_EDTYPE, "got f16 x f16 -> f16");
  g = ok;
  if (!loom__gemm_amx_available())
    LT_ERR(loom__gemm_bf16_amx(&g), LOOM_ENOSYS, "runs no AMX");
  else
    LT_OK(loom__gemm_bf16_amx(&g));
}

/* The rule: bf16 only, never below the avx512 level (the LOOM_CPU cap), one GEMM thread and
 * no small dimension in auto; the modes override the size part, never eligibility. */
LT_TEST(gemm_amx_choice) {
  uint16_t x[1] = {0};
  loom__gemm_args g = {.batch = 1, .M = 1024, .N = 1024, .K = 1024, .alpha = 1, .A = x,
                       .lda = 1024, .B = x, .ldb = 1024, .C = x, .ldc = 1024,
                       .ab_dtype = LOOM_BF16, .c_dtype = LOOM_F32};
  bool avail = loom__gemm_amx_available();
  int threads = loom__gemm_threads();
  loom__gemm_set_threads(1);
  loom__gemm_amx_set_mode(LOOM__GEMM_AMX_NEVER);
  LT_TRUE(!loom__gemm_prefer_amx(&g));
  loom__gemm_amx_set_mode(LOOM__GEMM_AMX_AUTO);
  LT_EQ(loom__gemm_prefer_amx(&g), avail); /* (the rule only: x is too small to run g) */
  loom__gemm_args h = g;
  h.ab_dtype = LOOM_F32;
  LT_TRUE(!loom__gemm_prefer_amx(&h));
  h = g, h.N = 10; /* an MLP's last layer: oneDNN */
  LT_TRUE(!loom__gemm_prefer_amx(&h));
  h = g, h.M = h.N = h.K = 256;
  LT_TRUE(!loom__gemm_prefer_amx(&h));
  h = g, h.M = 128; /* a thin product: oneDNN */
  LT_TRUE(!loom__gemm_prefer_amx(&h));
  h = g, h.M = 256, h.K = 784; /* the MLP's first layer: AMX */
  LT_EQ(loom__gemm_prefer_amx(&h), avail);
  h = g, h.M = 4096, h.N = 384, h.K = 1536; /* the GPT's narrow products (N 384): oneDNN */
  LT_TRUE(!loom__gemm_prefer_amx(&h));
  h = g, h.M = 4096, h.N = 1536, h.K = 384, h.trans_b = true; /* its c_fc forward: AMX */
  LT_EQ(loom__gemm_prefer_amx(&h), avail);
  h = g, h.M = 384, h.N = 1536, h.K = 4096, h.trans_a = true; /* a weight gradient over 4096 rows */
  LT_TRUE(!loom__gemm_prefer_amx(&h));
  h.K = 1024; /* over 1024 rows: AMX */
  LT_EQ(loom__gemm_prefer_amx(&h), avail);
  loom__gemm_set_threads(2);
  LT_TRUE(!loom__gemm_prefer_amx(&g));
  loom__gemm_amx_set_mode(LOOM__GEMM_AMX_ALWAYS);
  LT_EQ(loom__gemm_prefer_amx(&g), avail);
  h = g, h.M = 10;
  LT_EQ(loom__gemm_prefer_amx(&h), avail);
  /* LOOM_CPU=avx2 (here: the same cap from code) routes away, whatever the mode */
  loom_cpu_level level = loom_cpu_level_active();
  if (loom_cpu_supports(LOOM_CPU_AVX2)) {
    LT_OK(loom_set_cpu_level(LOOM_CPU_AVX2));
    LT_TRUE(!loom__gemm_amx_available());
    LT_TRUE(!loom__gemm_prefer_amx(&g));
    h = g, h.C = NULL; /* checked first: EINVAL, not the level */
    LT_ERR(loom__gemm_bf16_amx(&h), LOOM_EINVAL, "C is NULL");
    uint16_t a[4] = {0}, b[4] = {0}, c[4] = {0};
    loom__gemm_args small = {.batch = 1, .M = 2, .N = 2, .K = 2, .alpha = 1, .A = a, .lda = 2,
                             .B = b, .ldb = 2, .C = c, .ldc = 2, .ab_dtype = LOOM_BF16,
                             .c_dtype = LOOM_BF16};
    LT_ERR(loom__gemm_bf16_amx(&small), LOOM_ENOSYS, "runs no AMX");
    LT_OK(loom__gemm(&small)); /* loom__gemm takes the oneDNN (or widened) path */
    LT_OK(loom_set_cpu_level(level));
  }
  loom__gemm_amx_set_mode(LOOM__GEMM_AMX_FROM_ENV);
  loom__gemm_set_threads(threads);
}
