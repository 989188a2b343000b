/* absmax.c: the largest magnitude in a buffer of f32, f16 or bf16, or INFINITY if it holds an
 * inf or NaN: what linear's backward reads to bound the weight gradient it writes
 * (loom_tensor_grad_bound). Works on the bits: with the sign cleared, every NaN compares
 * above inf and inf above every finite value, so one unsigned maximum answers both. A scalar
 * reference, an AVX2 and an AVX-512 loop (chosen by loom_cpu_level_active), each with four
 * independent accumulators. */
#include "ops/ops_int.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* The bits' magnitude as a value (finite) or INFINITY (inf, NaN). */
static double of_bits32(uint32_t m) {
  if (m >= 0x7f800000u) return INFINITY;
  float f;
  memcpy(&f, &m, sizeof f);
  return f;
}

static double of_bits16(uint32_t m, loom_dtype dt) {
  if (dt == LOOM_BF16) return of_bits32(m << 16);
  if (m >= 0x7c00u) return INFINITY;
  uint16_t h = (uint16_t)m;
  float f;
  loom_cvt_f16_to_f32(&h, &f, 1);
  return f;
}

static uint32_t max32_scalar(const uint32_t *x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t v = x[i] & 0x7fffffffu;
    m = v > m ? v : m;
  }
  return m;
}

static uint32_t max16_scalar(const uint16_t *x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t v = x[i] & 0x7fffu;
    m = v > m ? v : m;
  }
  return m;
}

#define AVX2 __attribute__((target("avx2")))

/* The largest of the 8 unsigned 32-bit lanes. */
AVX2 static uint32_t hmax32_avx2(__m256i a) {
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4e));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xb1));
  return (uint32_t)_mm_cvtsi128_si32(m);
}

/* Lane-wise unsigned maximum of 32-bit (w32) or 16-bit lanes. */
AVX2 static inline __m256i umax_avx2(__m256i a, __m256i b, bool w32) {
  return w32 ? _mm256_max_epu32(a, b) : _mm256_max_epu16(a, b);
}

/* Per-lane maxima of the sign-cleared elements in whole vectors of x (32-bit elements when
 * w32, else 16-bit), four accumulators; *done: the elements covered. */
AVX2 static inline __attribute__((always_inline)) __m256i lanes_max_avx2(const void *x, size_t n,
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

AVX2 static uint32_t max32_avx2(const uint32_t *x, size_t n) {
  size_t i;
  uint32_t m = hmax32_avx2(lanes_max_avx2(x, n, true, &i)), t = max32_scalar(x + i, n - i);
  return t > m ? t : m;
}

AVX2 static uint32_t max16_avx2(const uint16_t *x, size_t n) {
  size_t i;
  __m256i a = lanes_max_avx2(x, n, false, &i);
  /* widen the 16 lanes' maxima to 8 x 32 bits and reduce */
  __m256i lo = _mm256_and_si256(a, _mm256_set1_epi32(0xffff)), hi = _mm256_srli_epi32(a, 16);
  uint32_t m = hmax32_avx2(_mm256_max_epu32(lo, hi)), t = max16_scalar(x + i, n - i);
  return t > m ? t : m;
}

#define AVX512 __attribute__((target("avx512f,avx512bw")))

AVX512 static uint32_t max32_avx512(const uint32_t *x, size_t n) {
  const __m512i mask = _mm512_set1_epi32(0x7fffffff);
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    a = _mm512_max_epu32(a, _mm512_and_si512(_mm512_loadu_si512(x + i), mask));
    b = _mm512_max_epu32(b, _mm512_and_si512(_mm512_loadu_si512(x + i + 16), mask));
    c = _mm512_max_epu32(c, _mm512_and_si512(_mm512_loadu_si512(x + i + 32), mask));
    d = _mm512_max_epu32(d, _mm512_and_si512(_mm512_loadu_si512(x + i + 48), mask));
  }
  a = _mm512_max_epu32(_mm512_max_epu32(a, b), _mm512_max_epu32(c, d));
  uint32_t m = _mm512_reduce_max_epu32(a), t = max32_scalar(x + i, n - i);
  return t > m ? t : m;
}

AVX512 static uint32_t max16_avx512(const uint16_t *x, size_t n) {
  const __m512i mask = _mm512_set1_epi16(0x7fff);
  __m512i a = _mm512_setzero_si512(), b = a;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    a = _mm512_max_epu16(a, _mm512_and_si512(_mm512_loadu_si512(x + i), mask));
    b = _mm512_max_epu16(b, _mm512_and_si512(_mm512_loadu_si512(x + i + 32), mask));
  }
  a = _mm512_max_epu16(a, b);
  /* widen the 32 lanes' maxima to 16 x 32 bits and reduce */
  __m512i lo = _mm512_and_si512(a, _mm512_set1_epi32(0xffff)), hi = _mm512_srli_epi32(a, 16);
  uint32_t m = _mm512_reduce_max_epu32(_mm512_max_epu32(lo, hi)), t = max16_scalar(x + i, n - i);
  return t > m ? t : m;
}

double loom__absmax_level(const void *p, loom_dtype dt, size_t n, loom_cpu_level level) {
  if (dt == LOOM_F32)
    return of_bits32(level >= LOOM_CPU_AVX512 ? max32_avx512(p, n)
                     : level == LOOM_CPU_AVX2 ? max32_avx2(p, n)
                                              : max32_scalar(p, n));
  return of_bits16(level >= LOOM_CPU_AVX512 ? max16_avx512(p, n)
                   : level == LOOM_CPU_AVX2 ? max16_avx2(p, n)
                                            : max16_scalar(p, n),
                   dt);
}

double loom__absmax(const void *p, loom_dtype dt, size_t n) {
  return loom__absmax_level(p, dt, n, loom_cpu_level_active());
}
