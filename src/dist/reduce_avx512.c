/* reduce_avx512.c: the combine kernels with AVX-512: the generic loops of reduce_int.h
 * compiled with -mavx512f (512-bit vectors preferred), and f32 sum by hand, 64 floats a step
 * (four independent 16-lane adds) from where a reaches a cache line, the ragged ends with
 * masked steps. Plain adds, so every element is the scalar's a + b. The two-source sum/average
 * writes (a + b) * s straight to every destination (s = 1 or 0.5: exact, the accumulator path's
 * bits), from where the first destination reaches a cache line (loom__sum2_head). */
#include "dist/reduce_int.h"

#include <immintrin.h>

static void sum_f32_avx512(void *av, const void *bv, size_t n) {
  float *a = av;
  const float *b = bv;
  /* a masked first step up to where a reaches a cache line: then every store is a whole line */
  size_t i = (uintptr_t)a % 4 ? 0 : (64 - ((uintptr_t)a & 63)) % 64 / 4;
  if (i > n) i = n;
  if (i) {
    __mmask16 k = (__mmask16)((1u << i) - 1);
    __m512 x = _mm512_add_ps(_mm512_maskz_loadu_ps(k, a), _mm512_maskz_loadu_ps(k, b));
    _mm512_mask_storeu_ps(a, k, x);
  }
  for (; i + 64 <= n; i += 64) {
    __m512 x0 = _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i));
    __m512 x1 = _mm512_add_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16));
    __m512 x2 = _mm512_add_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32));
    __m512 x3 = _mm512_add_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48));
    _mm512_storeu_ps(a + i, x0);
    _mm512_storeu_ps(a + i + 16, x1);
    _mm512_storeu_ps(a + i + 32, x2);
    _mm512_storeu_ps(a + i + 48, x3);
  }
  for (; i < n; i += 16) {
    __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
    __m512 x = _mm512_add_ps(_mm512_maskz_loadu_ps(k, a + i), _mm512_maskz_loadu_ps(k, b + i));
    _mm512_mask_storeu_ps(a + i, k, x);
  }
}

static void sum2_f32_avx512(float *const *dsts, int ndst, const float *a, const float *b,
                            size_t n, float s) {
  const __m512 vs = _mm512_set1_ps(s);
  size_t i = loom__sum2_head(dsts, ndst, a, b, n, s);
  for (; i + 32 <= n; i += 32) {
    __m512 x0 = _mm512_mul_ps(_mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)), vs);
    __m512 x1 = _mm512_mul_ps(
        _mm512_add_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16)), vs);
    for (int j = 0; j < ndst; j++) {
      _mm512_storeu_ps(dsts[j] + i, x0);
      _mm512_storeu_ps(dsts[j] + i + 16, x1);
    }
  }
  for (; i < n; i += 16) {
    __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
    __m512 x = _mm512_mul_ps(
        _mm512_add_ps(_mm512_maskz_loadu_ps(k, a + i), _mm512_maskz_loadu_ps(k, b + i)), vs);
    for (int j = 0; j < ndst; j++) _mm512_mask_storeu_ps(dsts[j] + i, k, x);
  }
}

LOOM__COMBINE_TABLE2(loom__reduce_kernels_avx512, sum_f32_avx512, sum2_f32_avx512);
