/* absmax_avx2.c: the largest magnitude (absmax.c) with AVX2, four independent accumulators,
 * the ragged tail through the scalar loop. Built with -mavx2 (CMakeLists.txt). */
#include "ops/ops_int.h"

#include <immintrin.h>

/* The largest of the 8 unsigned 32-bit lanes. */
static uint32_t hmax32_avx2(__m256i a) {
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4e));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xb1));
  return (uint32_t)_mm_cvtsi128_si32(m);
}

/* Lane-wise unsigned maximum of 32-bit (w32) or 16-bit lanes. */
static inline __m256i umax_avx2(__m256i a, __m256i b, bool w32) {
  return w32 ? _mm256_max_epu32(a, b) : _mm256_max_epu16(a, b);
}

/* Per-lane maxima of the sign-cleared elements in whole vectors of x (32-bit elements when
 * w32, else 16-bit), four accumulators; *done: the elements covered. */
static inline __attribute__((always_inline)) __m256i lanes_max_avx2(const void *x, size_t n,
                                                                    bool w32, size_t *done) {
  const __m256i mask = w32 ? _mm256_set1_epi32(0x7fffffff) : _mm256_set1_epi16(0x7fff);
  const size_t per = w32 ? 8 : 16; /* elements a vector */
  const __m256i *p = x;
  __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                    _mm256_setzero_si256()};
  size_t v = 0, nv = n / per;
  for (; v + 4 <= nv; v += 4) {
#pragma GCC unroll 4 /* the accumulators stay in registers */
    for (int k = 0; k < 4; k++) {
      acc[k] = umax_avx2(acc[k], _mm256_and_si256(_mm256_loadu_si256(p + v + k), mask), w32);
    }
  }
  for (; v < nv; v++)
    acc[0] = umax_avx2(acc[0], _mm256_and_si256(_mm256_loadu_si256(p + v), mask), w32);
  acc[0] = umax_avx2(umax_avx2(acc[0], acc[1], w32), umax_avx2(acc[2], acc[3], w32), w32);
  *done = v * per;
  return acc[0];
}

static uint32_t max32(const uint32_t *x, size_t n) {
  size_t i;
  uint32_t m = hmax32_avx2(lanes_max_avx2(x, n, true, &i)), t = loom__absmax32_scalar(x + i, n - i);
  return t > m ? t : m;
}

static uint32_t max16(const uint16_t *x, size_t n) {
  size_t i;
  __m256i a = lanes_max_avx2(x, n, false, &i);
  /* widen the 16 lanes' maxima to 8 x 32 bits and reduce */
  __m256i lo = _mm256_and_si256(a, _mm256_set1_epi32(0xffff)), hi = _mm256_srli_epi32(a, 16);
  uint32_t m = hmax32_avx2(_mm256_max_epu32(lo, hi)), t = loom__absmax16_scalar(x + i, n - i);
  return t > m ? t : m;
}

const loom__absmax_kernels loom__absmax_kernels_avx2 = {max32, max16};
