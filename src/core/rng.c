/* rng.c: the seeded generator of loom/rng.h: xoshiro256** (Blackman and Vigna) seeded through
 * splitmix64, and a stateless splitmix64 hash of (seed, index). */
#include "loom/rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void loom_rng_seed(loom_rng *r, uint64_t seed) {
  uint64_t x = seed;
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

uint64_t loom_rng_next(loom_rng *r) {
  uint64_t *s = r->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

float loom_rng_uniform(loom_rng *r) {
  return (float)(loom_rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

double loom_rng_uniform_f64(loom_rng *r) {
  return (double)(loom_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

float loom_rng_uniform_range(loom_rng *r, float lo, float hi) {
  float v = lo + (hi - lo) * loom_rng_uniform(r);
  return v < hi ? v : lo; /* rounding could reach hi */
}

double loom_rng_normal(loom_rng *r) {
  double u1 = loom_rng_uniform_f64(r), u2 = loom_rng_uniform_f64(r);
  return sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
}

uint64_t loom_rng_hash(uint64_t seed, uint64_t index) {
  uint64_t x = seed ^ (index * 0xd1342543de82ef95ull);
  splitmix64(&x);
  return splitmix64(&x);
}
