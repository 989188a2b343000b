/* test_gemm_avx2.c: loom's own AVX2 GEMM for 16-bit operands (src/ops/gemm_avx2.c) against
 * the scalar reference loom__gemm_ref, with test_gemm.c's cases and tolerance (gemm_cases.h):
 * every dtype pair, transposes, pads, alpha, beta, bias, batches with a broadcast operand;
 * shapes that cross each of its blocks (KC, MC, NC, the B block) with ragged edges, where a
 * 16-bit C keeps partial sums in f32 before its one rounding; two OpenMP threads; its rounding
 * of a bf16 / f16 C bit for bit against loom_convert (ties, NaN, inf, subnormals); its errors;
 * and the rule that sends loom__gemm there. Skipped on a CPU without AVX2. */
#include "gemm_cases.h"
#include "lt.h"
#include "ops/gemm_avx2.h"

#include <stdlib.h>

static bool have_avx2(void) {
  if (loom_cpu_supports(LOOM_CPU_AVX2)) return true;
  lt_skip("this CPU has no AVX2");
  return false;
}

static const loom_dtype pairs[][2] = {{LOOM_BF16, LOOM_F32}, {LOOM_BF16, LOOM_BF16},
                                      {LOOM_F16, LOOM_F32},  {LOOM_F16, LOOM_F16},
                                      {LOOM_F32, LOOM_F32}};
#define NPAIRS (int)(sizeof pairs / sizeof pairs[0])

LT_TEST(gemm_avx2_matches_ref) {
  if (!have_avx2()) return;
  for (int p = 0; p < NPAIRS; p++) sweep_with(loom__gemm_avx2, pairs[p][0], pairs[p][1]);
  for (int p = 0; p < NPAIRS; p++)
    for (int bc = 0; bc < 4; bc++) /* batches: none, A, B, both broadcast */
      for (int t = 0; t < 4; t++) {
        shape s = {4,     9,     13, 21, t & 1, (t >> 1) & 1, t == 3 ? 2 : 0, bc & 1, bc >> 1,
                   t == 2 ? 0.25f : 1.0f, (float)(t & 1), false};
        LT_EQ(check_with(loom__gemm_avx2, s, pairs[p][0], pairs[p][1]), 0);
      }
  for (int p = 0; p < NPAIRS; p++)
    for (int t = 0; t < 8; t++) { /* bias, beta 0 and 1, 2-D and batched */
      shape s = {t & 4 ? 3 : 1, 17, 33, 65, t & 1, t & 2, 0, false, (t & 4) && (t & 1), 1.0f,
                 (float)((t >> 1) & 1), true};
      LT_EQ(check_with(loom__gemm_avx2, s, pairs[p][0], pairs[p][1]), 0);
    }
}

/* Shapes past every block: K over KC (256) and over the f32 C's B block (kb rows), M over MC
 * (96) with a ragged 6-row sliver, N over NC (1536) and, for a 16-bit C with a long K, over
 * its narrower B block; each transpose (the packings' vector and scalar ways). */
LT_TEST(gemm_avx2_crosses_blocks) {
  if (!have_avx2()) return;
  const shape shapes[] = {
      {1, 200, 40, 600, false, true, 0, false, false, 1.0f, 0.0f, true},
      {1, 101, 45, 777, true, false, 1, false, false, 1.0f, 1.0f, false},
      {1, 13, 1600, 300, false, false, 0, false, false, 0.5f, 1.0f, false},
      {1, 7, 500, 3000, true, true, 3, false, false, 1.0f, 0.0f, true},
      {2, 98, 33, 520, false, false, 0, false, true, 1.0f, 1.0f, false},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
    for (int p = 0; p < NPAIRS; p++)
      LT_EQ(check_with(loom__gemm_avx2, shapes[i], pairs[p][0], pairs[p][1]), 0);
}

LT_TEST(gemm_avx2_two_threads) {
  if (!have_avx2()) return;
  int before = loom__gemm_threads();
  loom__gemm_set_threads(2);
  shape s = {2, 300, 130, 400, false, true, 0, false, false, 1.0f, 1.0f, true};
  LT_EQ(check_with(loom__gemm_avx2, s, LOOM_BF16, LOOM_BF16), 0);
  LT_EQ(check_with(loom__gemm_avx2, s, LOOM_BF16, LOOM_F32), 0);
  loom__gemm_set_threads(before);
}

/* C = 0 * 0 + bias rounded once: exactly loom_convert's rounding of the bias. */
LT_TEST(gemm_avx2_rounds_c_as_loom_convert) {
  if (!have_avx2()) return;
  enum { M = 7, N = 37 };
  float bias[N];
  for (int j = 0; j < N; j++) bias[j] = ldexpf(1.0f + (float)j * 0x1p-12f, j % 9 - 4);
  bias[0] = 1.0f + 0x1p-8f;      /* a bf16 tie: to even (down) */
  bias[1] = 1.0f + 3 * 0x1p-8f;  /* a bf16 tie: to even (up) */
  bias[2] = 1.0f + 0x1p-11f;     /* an f16 tie */
  bias[3] = NAN, bias[4] = -INFINITY, bias[5] = 0x1p-130f, bias[6] = -0x1p-20f;
  bias[7] = 3.4e38f; /* near the top of f32's range (f16: overflows to inf) */
  for (int d = 0; d < 2; d++) {
    loom_dtype dt = d ? LOOM_F16 : LOOM_BF16;
    uint16_t A[M] = {0}, B[N] = {0}, C[M * N], want[N];
    loom__gemm_args g = {.batch = 1, .M = M, .N = N, .K = 1, .alpha = 1, .A = A, .lda = 1,
                         .B = B, .ldb = N, .C = C, .ldc = N, .ab_dtype = dt, .c_dtype = dt,
                         .bias = bias};
    LT_OK(loom__gemm_avx2(&g));
    loom_convert(bias, LOOM_F32, want, dt, N);
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) LT_EQ_HEX(C[i * N + j], want[j]);
  }
}

LT_TEST(gemm_avx2_bad_arguments) {
  if (!have_avx2()) return;
  uint16_t A[4] = {0}, B[4] = {0}, C[4] = {0};
  loom__gemm_args g = {.batch = 1, .M = 2, .N = 2, .K = 2, .alpha = 1, .A = A, .lda = 2,
                       .B = B, .ldb = 2, .C = C, .ldc = 2, .ab_dtype = LOOM_BF16,
                       .c_dtype = LOOM_BF16};
  LT_OK(loom__gemm_avx2(&g));
  LT_ERR(loom__gemm_avx2(NULL), LOOM_EINVAL, "loom__gemm_avx2");
  loom__gemm_args b = g;
  b.A = NULL;
  LT_ERR(loom__gemm_avx2(&b), LOOM_EINVAL, "A is NULL");
  b = g, b.lda = 1;
  LT_ERR(loom__gemm_avx2(&b), LOOM_ESHAPE, "leading dimension 1 of A");
  b = g, b.beta = 0.5f;
  LT_ERR(loom__gemm_avx2(&b), LOOM_EINVAL, "beta");
  b = g, b.c_dtype = LOOM_I32;
  LT_ERR(loom__gemm_avx2(&b), LOOM_EDTYPE, "loom__gemm_avx2");
  b = g, b.c_dtype = LOOM_F16; /* C f16 with bf16 operands */
  LT_ERR(loom__gemm_avx2(&b), LOOM_EDTYPE, "loom__gemm_avx2");
}

/* The rule: never for f32 operands; for 16-bit ones exactly when loom's level is AVX2 or
 * above and oneDNN has no AVX-512 (under LOOM_CPU=avx2, as `make check-avx2` runs the tests). */
LT_TEST(gemm_avx2_rule) {
  loom__gemm_args g = {.ab_dtype = LOOM_F32, .c_dtype = LOOM_F32};
  LT_TRUE(!loom__gemm_avx2_wanted(&g));
  g.ab_dtype = LOOM_BF16;
  const char *cap = getenv("LOOM_CPU"), *off = getenv("LOOM_GEMM_AVX2");
  bool capped = cap && !strcmp(cap, "avx2") && loom_cpu_supports(LOOM_CPU_AVX2);
  if (capped && !(off && !strcmp(off, "off"))) LT_TRUE(loom__gemm_avx2_wanted(&g));
  if (cap && !strcmp(cap, "scalar")) LT_TRUE(!loom__gemm_avx2_wanted(&g));
}
