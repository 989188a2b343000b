/* test_rng.c: the counter-based generator of loom/rng.h. Philox4x32-10 against Random123's
 * known-answer vectors; loom_rng_at_uniform / _normal against values computed by an independent
 * (Python) implementation of the same counter layout; the draws' statistics (mean, variance,
 * neighbour correlation over a million indices); and the property sharded construction rests on:
 * a value depends on (seed, stream, index) only, whatever else was drawn before. */
#include "lt.h"

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

/* (seed, stream, index) -> the uniform (exact: 53 bits) and the normal, from philox.py-style
 * reference code written apart from rng.c (Python's integers, math.log and math.cos). */
LT_TEST(rng_at_matches_an_independent_reference) {
  static const struct {
    uint64_t seed, stream, index;
    double u, z;
  } ref[] = {
      {0, 0, 0, 0x1.989fa35785a70p-2, -0.09047305844120267},
      {42, 1, 7, 0x1.31e3117d4a070p-2, 0.6734744436817002},
      {0x123456789abcdef0ull, 0xfedcba9876543210ull, (1ull << 40) + 3, 0x1.27efb8000b3d7p-1,
       1.072383919938655},
      {7, 0, 123456789, 0x1.a85bc5f90b74ap-2, -1.029599711782639},
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
