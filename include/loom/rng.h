/* loom/rng.h: a small seeded random number generator (xoshiro256** seeded by splitmix64) and
 * a counter-based hash for values that must depend only on (seed, index), whatever the
 * threading (dropout masks, initialisers).
 *
 * A loom_rng is a plain value the caller owns; it is not thread-safe (give each thread its
 * own). Same seed, same sequence, on every machine. */
#ifndef LOOM_RNG_H
#define LOOM_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_rng {
  uint64_t s[4];
} loom_rng;

/* Seed the generator (any value, 0 included). */
void loom_rng_seed(loom_rng *r, uint64_t seed);
/* The next 64 random bits. */
uint64_t loom_rng_next(loom_rng *r);
/* Uniform in [0, 1) with 24 random bits (exact in f32), or 53 bits as a double. */
float loom_rng_uniform(loom_rng *r);
double loom_rng_uniform_f64(loom_rng *r);
/* Uniform in [lo, hi). */
float loom_rng_uniform_range(loom_rng *r, float lo, float hi);
/* Standard normal (Box-Muller, in double). */
double loom_rng_normal(loom_rng *r);
/* 64 bits that depend only on (seed, index): a stateless stream (splitmix64 of a mix). */
uint64_t loom_rng_hash(uint64_t seed, uint64_t index);

#ifdef __cplusplus
}
#endif
#endif
