/* absmax_avx512.c: the largest magnitude (absmax.c) with AVX-512, four (f32) or two (16-bit)
 * independent accumulators, the ragged tail through the scalar loop. Built with -mavx512f
 * -mavx512bw (CMakeLists.txt). */
#include "ops/ops_int.h"

#include <immintrin.h>

static uint32_t max32(const uint32_t *x, size_t n) {
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
  uint32_t m = _mm512_reduce_max_epu32(a), t = loom__absmax32_scalar(x + i, n - i);
  return t > m ? t : m;
}

static uint32_t max16(const uint16_t *x, size_t n) {
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
  uint32_t m = _mm512_reduce_max_epu32(_mm512_max_epu32(lo, hi)), t = loom__absmax16_scalar(x + i, n - i);
  return t > m ? t : m;
}

const loom__absmax_kernels loom__absmax_kernels_avx512 = {max32, max16};
