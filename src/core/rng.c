/* rng.c: the seeded generator of loom/rng.h: xoshiro256** (Blackman and Vigna) seeded through
 * splitmix64, a stateless splitmix64 hash of (seed, index), and the counter-based Philox4x32-10
 * with its uniform and normal draws at (seed, stream, index). */
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

/* ---- Philox4x32-10 ------------------------------------------------------------------------ */

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u /* golden ratio */
#define PHILOX_W1 0xBB67AE85u /* sqrt(3) - 1 */

void loom_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; round++) {
    if (round) k0 += PHILOX_W0, k1 += PHILOX_W1; /* the key bumps between rounds */
    uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* Block `block` of stream `stream` under `seed`: counter words block low, block high, stream
 * low, stream high; key words seed low, seed high. */
static void philox_at(uint64_t seed, uint64_t stream, uint64_t block, uint32_t out[4]) {
  const uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream,
                           (uint32_t)(stream >> 32)};
  const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  loom_philox4x32(ctr, key, out);
}

/* 53 bits of words a (high) and b as a fraction in [0, 1). */
static double fraction53(uint32_t a, uint32_t b) {
  return (double)((((uint64_t)a << 32) | b) >> 11) * (1.0 / 9007199254740992.0);
}

/* The two uniforms of block k: elements 2k and 2k + 1. */
static void uniform_pair(uint64_t seed, uint64_t stream, uint64_t k, double u[2]) {
  uint32_t w[4];
  philox_at(seed, stream, k, w);
  u[0] = fraction53(w[0], w[1]);
  u[1] = fraction53(w[2], w[3]);
}

/* The two normals of block k (Box-Muller over its two uniforms). */
static void normal_pair(uint64_t seed, uint64_t stream, uint64_t k, double z[2]) {
  double u[2];
  uniform_pair(seed, stream, k, u);
  double r = sqrt(-2.0 * log(1.0 - u[0])), a = 2.0 * M_PI * u[1];
  z[0] = r * cos(a);
  z[1] = r * sin(a);
}

double loom_rng_at_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  double u[2];
  uniform_pair(seed, stream, index >> 1, u);
  return u[index & 1];
}

double loom_rng_at_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  double z[2];
  normal_pair(seed, stream, index >> 1, z);
  return z[index & 1];
}

/* Fill dst[0, hi - lo) with f(element) for elements [lo, hi), a pair (one block) at a time, in
 * chunks over the calling thread's OpenMP team when there are many: each element is a pure
 * function of its coordinates, so the team's size changes no value. */
enum { FILL_CHUNK = 8192, FILL_PAR_MIN = 1 << 16 };

#define FILL_BODY(PAIR, EXPR)                                                                    \
  uint64_t first = lo & ~(uint64_t)1, nchunks = (hi - first + FILL_CHUNK - 1) / FILL_CHUNK;    \
  _Pragma("omp parallel for if (hi - lo >= FILL_PAR_MIN)")                                       \
  for (int64_t c = 0; c < (int64_t)nchunks; c++) {                                              \
    uint64_t from = first + (uint64_t)c * FILL_CHUNK, to = from + FILL_CHUNK;                    \
    if (to > hi) to = hi;                                                                        \
    for (uint64_t k = from; k < to; k += 2) {                                                    \
      double v[2];                                                                               \
      PAIR(seed, stream, k >> 1, v);                                                             \
      if (k >= lo) dst[k - lo] = (float)(EXPR(v[0]));                                            \
      if (k + 1 < to) dst[k + 1 - lo] = (float)(EXPR(v[1]));                                     \
    }                                                                                            \
  }

void loom_rng_at_fill_uniform(uint64_t seed, uint64_t stream, uint64_t lo, uint64_t hi,
                              double a, double b, float *dst) {
  if (lo >= hi) return;
#define UNIFORM(u) (a + (b - a) * (u))
  FILL_BODY(uniform_pair, UNIFORM)
#undef UNIFORM
}

void loom_rng_at_fill_normal(uint64_t seed, uint64_t stream, uint64_t lo, uint64_t hi,
                             double mean, double std, float *dst) {
  if (lo >= hi) return;
#define NORMAL(z) (mean + std * (z))
  FILL_BODY(normal_pair, NORMAL)
#undef NORMAL
}
