/* test_gemm_avx512.c: loom's own AVX-512 GEMM for 16-bit operands (src/ops/gemm_avx512.c)
 * against the scalar reference loom__gemm_ref, with test_gemm.c's cases and tolerance
 * (gemm_cases.h): every dtype pair (bf16 and f16 operands, f32 or 16-bit C, and f32), every
 * transpose, pads, alpha, beta (accumulate), bias, batches with a broadcast operand; shapes
 * with ragged edges in each of its blocks (12-row and 32-column tiles, 16-deep transposes, KC,
 * MC, NC, the B block), where a 16-bit C keeps partial sums in f32 before its one rounding;
 * two OpenMP threads; its rounding of a bf16 / f16 C bit for bit against loom_convert (ties,
 * NaN, inf, subnormals); its errors; and the rule that sends loom__gemm there. Skipped on a
 * CPU without AVX-512. */
#include "gemm_cases.h"
#include "lt.h"
#include "ops/gemm_avx512.h"

#include <stdlib.h>

static bool have_avx512(void) {
  if (loom_cpu_supports(LOOM_CPU_AVX512)) return true;
  lt_skip("this CPU has no AVX-512");
  return false;
}

static void each_dtype(shape s) {
  for (int p = 0; p < GEMM_DTYPE_PAIRS; p++)
    LT_EQ(check_with(loom__gemm_avx512, s, gemm_dtype_pairs[p][0], gemm_dtype_pairs[p][1]), 0);
}

LT_TEST(gemm_avx512_sweep_matches_ref) {
  if (!have_avx512()) return;
  for (int p = 0; p < GEMM_DTYPE_PAIRS; p++)
    sweep_with(loom__gemm_avx512, gemm_dtype_pairs[p][0], gemm_dtype_pairs[p][1]);
}

/* Small shapes around the tile (12 x 32) and the 16-deep transposes, every transpose, with
 * batches (none, A, B or both broadcast), alpha, beta, bias. */
LT_TEST(gemm_avx512_ragged_tiles) {
  if (!have_avx512()) return;
  static const int64_t sizes[][3] = {{1, 1, 1},   {11, 31, 15}, {12, 32, 16}, {13, 33, 17},
                                     {25, 65, 3}, {5, 10, 47},  {24, 16, 32}, {37, 29, 70}};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
    for (int t = 0; t < 16; t++) {
      int bc = (int)i % 4;
      bool bias = (t & 4) && !(t & 8);
      shape s = {1 + (bc != 0) * 2, sizes[i][0], sizes[i][1], sizes[i][2], t & 1, (t >> 1) & 1,
                 t & 8 ? 3 : 0, bc & 1, bc >> 1, bias || !(t & 8) ? 1.0f : 0.5f,
                 (float)((t >> 2) & 1), bias};
      each_dtype(s);
    }
}

/* Shapes past every block (KC 1024 for a 16-bit C, the f32 C's 256-row B blocks, MC 48 with a
 * ragged 12-row sliver, NC 1536, the 16-bit C's B block), each transpose; two threads. */
LT_TEST(gemm_avx512_crosses_blocks) {
  if (have_avx512()) check_packed_blocks(loom__gemm_avx512);
}

/* C = 0 * 0 + bias rounded once: exactly loom_convert's rounding of the bias, also in the
 * masked columns past the last whole 16 of a tile and in a ragged 12-row sliver. */
LT_TEST(gemm_avx512_rounds_c_as_loom_convert) {
  if (have_avx512()) check_c_rounding(loom__gemm_avx512, 13);
}

LT_TEST(gemm_avx512_bad_arguments) {
  if (have_avx512()) check_kernel_errors(loom__gemm_avx512, "loom__gemm_avx512");
}

/* The rule: never for f32 operands, never below loom's avx512 level or with oneDNN capped below
 * AVX-512 (loom's AVX2 GEMM's turn), and for f16 operands (never native) on an AVX-512 CPU
 * with neither cap. */
LT_TEST(gemm_avx512_rule) {
  loom__gemm_args g = {.ab_dtype = LOOM_F32, .c_dtype = LOOM_F32};
  LT_TRUE(!loom__gemm_avx512_wanted(&g));
  g.ab_dtype = LOOM_F16;
  const char *cap = getenv("LOOM_CPU"), *off = getenv("LOOM_GEMM_AVX512");
  const char *isa = getenv("ONEDNN_MAX_CPU_ISA");
  if (cap && (!strcmp(cap, "avx2") || !strcmp(cap, "scalar")))
    LT_TRUE(!loom__gemm_avx512_wanted(&g));
  if (isa && !strcmp(isa, "AVX2")) LT_TRUE(!loom__gemm_avx512_wanted(&g));
  bool open = loom_cpu_supports(LOOM_CPU_AVX512) && !cap && !off && !isa &&
              !getenv("DNNL_MAX_CPU_ISA");
  if (open) LT_TRUE(loom__gemm_avx512_wanted(&g));
}
