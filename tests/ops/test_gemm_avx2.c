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

LT_TEST(gemm_avx2_matches_ref) {
  if (!have_avx2()) return;
  for (int p = 0; p < GEMM_DTYPE_PAIRS; p++)
    sweep_with(loom__gemm_avx2, gemm_dtype_pairs[p][0], gemm_dtype_pairs[p][1]);
  for (int p = 0; p < GEMM_DTYPE_PAIRS; p++)
    for (int bc = 0; bc < 4; bc++) /* batches: none, A, B, both broadcast */
      for (int t = 0; t < 4; t++) {
        shape s = {4,     9,     13, 21, t & 1, (t >> 1) & 1, t == 3 ? 2 : 0, bc & 1, bc >> 1,
                   t == 2 ? 0.25f : 1.0f, (float)(t & 1), false};
        LT_EQ(check_with(loom__gemm_avx2, s, gemm_dtype_pairs[p][0], gemm_dtype_pairs[p][1]), 0);
      }
  for (int p = 0; p < GEMM_DTYPE_PAIRS; p++)
    for (int t = 0; t < 8; t++) { /* bias, beta 0 and 1, 2-D and batched */
      shape s = {t & 4 ? 3 : 1, 17, 33, 65, t & 1, t & 2, 0, false, (t & 4) && (t & 1), 1.0f,
                 (float)((t >> 1) & 1), true};
      LT_EQ(check_with(loom__gemm_avx2, s, gemm_dtype_pairs[p][0], gemm_dtype_pairs[p][1]), 0);
    }
}

/* Shapes past every block: K over KC (384) and over the f32 C's B block (kb rows), M over MC
 * (96) with a ragged 6-row sliver, N over NC (1536) and, for a 16-bit C with a long K, over
 * its narrower B block; each transpose (the packings' vector and scalar ways); two threads. */
LT_TEST(gemm_avx2_crosses_blocks) {
  if (have_avx2()) check_packed_blocks(loom__gemm_avx2);
}

/* C = 0 * 0 + bias rounded once: exactly loom_convert's rounding of the bias. */
LT_TEST(gemm_avx2_rounds_c_as_loom_convert) {
  if (have_avx2()) check_c_rounding(loom__gemm_avx2, 7);
}

LT_TEST(gemm_avx2_bad_arguments) {
  if (have_avx2()) check_kernel_errors(loom__gemm_avx2, "loom__gemm_avx2");
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
