/* test_rng.c: the counter-based generator of loom/rng.h. Philox4x32-10 against Random123's
 * known-answer vectors; loom_rng_at_uniform / _normal against values computed by an independent
 * (Python) implementation of the same counter layout; the draws' statistics (mean, variance,
 * neighbour correlation over a million indices); and the property sharded construction rests on:
 * a value depends on (seed, stream, index) only, whatever else was drawn before. */
#include "lt.h"

#include <stdlib.h>

LT_TEST(philox4x32_10_matches_random123_known_answers) {
  static const uint32_t ctr[3][4] = {{0, 0, 0, 0},
                                     {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                                     {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}};
  static const uint32_t key[3][2] = {{0, 0}, {0xffffffffu, 0xffffffffu},
                                     {0xa4093822u, 0x299f31d0u}};
  static const uint32_t want[3][4] = {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
                                      {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
                                      {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}};
  for (int k = 0; k < 3; k++) {
    uint32_t out[4];
    loom_philox4x32(ctr[k], key[k], out);
    for (int i = 0; i < 4; i++) LT_EQ_HEX(out[i], want[k][i]);
  }
}

/* (seed, stream, index) -> the uniform (exact: 53 bits) and the normal, from reference code
 * written apart from rng.c (Python's integers, math.log, math.cos and math.sin; block index/2,
 * words 0-1 for an even index and 2-3 for an odd one, cos for even and sin for odd). */
LT_TEST(rng_at_matches_an_independent_reference) {
  static const struct {
    uint64_t seed, stream, index;
    double u, z;
  } ref[] = {
      {0, 0, 0, 0x1.989fa35785a70p-2, -0.09047305844120267},
      {0, 0, 1, 0x1.78af58993601bp-1, -1.0051318150657187},
      {42, 1, 7, 0x1.b6c23160405b0p-3, 0.4914999619538212},
      {0x123456789abcdef0ull, 0xfedcba9876543210ull, (1ull << 40) + 3, 0x1.9bef59c635e00p-4,
       1.3672749366944414},
      {7, 0, 123456788, 0x1.4ba8d03ae1538p-1, -1.4436457186769776},
  };
  for (size_t k = 0; k < sizeof ref / sizeof ref[0]; k++) {
    double u = loom_rng_at_uniform(ref[k].seed, ref[k].stream, ref[k].index);
    LT_TRUE(u == ref[k].u);
    LT_NEAR(loom_rng_at_normal(ref[k].seed, ref[k].stream, ref[k].index), ref[k].z, 1e-13);
  }
}

LT_TEST(rng_at_uniform_and_normal_have_the_right_statistics) {
  enum { N = 1000000 };
  double su = 0, suu = 0, suv = 0, sz = 0, szz = 0, prev = 0, lo = 1, hi = 0;
  for (uint64_t i = 0; i < N; i++) {
    double u = loom_rng_at_uniform(2024, 3, i), z = loom_rng_at_normal(2024, 3, i);
    LT_TRUE(u >= 0.0 && u < 1.0);
    LT_TRUE(isfinite(z));
    su += u, suu += u * u, sz += z, szz += z * z;
    if (i) suv += (u - 0.5) * (prev - 0.5);
    prev = u;
    lo = u < lo ? u : lo, hi = u > hi ? u : hi;
  }
  double mu = su / N, varu = suu / N - mu * mu, mz = sz / N, varz = szz / N - mz * mz;
  /* 5 standard errors: mean of U sd 0.289/1000, of N(0,1) 1/1000; the variances' about 1.2e-4 and
   * 1.4e-3; the lag-1 covariance's about 0.083/1000 */
  LT_NEAR(mu, 0.5, 5 * 0.2887 / 1000);
  LT_NEAR(varu, 1.0 / 12.0, 5 * 0.0745 / 1000);
  LT_NEAR(mz, 0.0, 5.0 / 1000);
  LT_NEAR(sqrt(varz), 1.0, 5 * 0.7071 / 1000);
  LT_NEAR(suv / (N - 1), 0.0, 5 * (1.0 / 12.0) / 1000);
  LT_TRUE(lo < 1e-5 && hi > 1 - 1e-5);
}

/* A value is a function of its coordinates: the same whatever was drawn before or in what order,
 * and streams and seeds differ. */
LT_TEST(rng_at_depends_only_on_seed_stream_and_index) {
  double fwd[64], bwd[64];
  for (int i = 0; i < 64; i++) fwd[i] = loom_rng_at_uniform(9, 1, 1000 + (uint64_t)i);
  for (int i = 63; i >= 0; i--) bwd[i] = loom_rng_at_uniform(9, 1, 1000 + (uint64_t)i);
  LT_TRUE(memcmp(fwd, bwd, sizeof fwd) == 0);
  int same_stream = 0, same_seed = 0;
  for (int i = 0; i < 64; i++) {
    same_stream += loom_rng_at_uniform(9, 2, 1000 + (uint64_t)i) == fwd[i];
    same_seed += loom_rng_at_uniform(10, 1, 1000 + (uint64_t)i) == fwd[i];
  }
  LT_EQ(same_stream, 0);
  LT_EQ(same_seed, 0);
}

/* The fills equal the single-element functions bit for bit, from any start (odd or even) and
 * whatever the calling thread's team. */
LT_TEST(rng_at_fills_equal_the_single_elements) {
  enum { N = 200000 };
  float *u = malloc(N * sizeof *u), *z = malloc(N * sizeof *z);
  LT_TRUE(u && z);
  static const uint64_t starts[3] = {0, 1, 77777};
  for (int team = 1; team <= 2; team++) {
    LT_OK(loom_set_num_threads(team));
    for (int s = 0; s < 3; s++) {
      uint64_t lo = starts[s], hi = lo + N - (uint64_t)s; /* odd and even lengths */
      loom_rng_at_fill_uniform(5, 6, lo, hi, -0.25, 0.25, u);
      loom_rng_at_fill_normal(5, 6, lo, hi, 1.0, 0.5, z);
      int bad = 0;
      for (uint64_t i = lo; i < hi; i++) {
        bad += u[i - lo] != (float)(-0.25 + 0.5 * loom_rng_at_uniform(5, 6, i));
        bad += z[i - lo] != (float)(1.0 + 0.5 * loom_rng_at_normal(5, 6, i));
      }
      LT_EQ(bad, 0);
    }
  }
  free(u);
  free(z);
}
