/* loom/rng.h: a small seeded random number generator (xoshiro256** seeded by splitmix64), a
 * counter-based hash for values that must depend only on (seed, index), whatever the
 * threading (dropout masks), and the counter-based generator Philox4x32-10 behind the
 * parameter initialisers (loom/nn.h): a value is a pure function of (seed, stream, index), so
 * any slice of a parameter (an FSDP shard) is computed without the rest, bit for bit.
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

/* Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3",
 * SC'11; Random123's philox4x32_R(10, ctr, key), whose known-answer vectors it gives): the four
 * 32-bit words of block `ctr` under `key`. Pure: no state, any thread. */
void loom_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* Element `index` of stream `stream` under `seed`. Philox block k (counter words: k low, k high,
 * stream low, stream high; key words: seed low, seed high) gives elements 2k and 2k + 1:
 *   loom_rng_at_uniform: uniform in [0, 1), 53 bits: words 0-1 (element 2k), 2-3 (2k + 1);
 *   loom_rng_at_normal: standard normal by Box-Muller over the block's two uniforms u1, u2:
 *   sqrt(-2 log(1 - u1)) cos(2 pi u2) for element 2k, the same times sin for 2k + 1, in double
 *   (libm's log, cos, sin: the same bits wherever the same C library runs). */
double loom_rng_at_uniform(uint64_t seed, uint64_t stream, uint64_t index);
double loom_rng_at_normal(uint64_t seed, uint64_t stream, uint64_t index);
/* dst[i - lo] for the elements i in [lo, hi): (float)(a + (b - a) u(i)) (uniform in [a, b);
 * U(-c, c) is a = -c, b = c), or (float)(mean + std z(i)); the values of the single-element
 * functions above, bit for bit, a block per pair and over the calling thread's OpenMP team when
 * there are many (the team's size changes no value). dst holds hi - lo floats. */
void loom_rng_at_fill_uniform(uint64_t seed, uint64_t stream, uint64_t lo, uint64_t hi,
                              double a, double b, float *dst);
void loom_rng_at_fill_normal(uint64_t seed, uint64_t stream, uint64_t lo, uint64_t hi,
                             double mean, double std, float *dst);

#ifdef __cplusplus
}
#endif
#endif
