/* reduce_avx2.c: the combine kernels with AVX2: the generic loops of reduce_int.h compiled
 * with -mavx2 -mfma, and f32 sum by hand, 32 floats a step (four independent 8-lane adds, so
 * loads and adds overlap), the ragged end through the scalar table. Plain adds, no FMA, so
 * every element is the scalar's a + b. The two-source sum/average writes (a + b) * s straight
 * to every destination (s = 1 or 0.5: exact, the accumulator path's bits), from where the first
 * destination reaches a cache line (loom__sum2_head). */
#include "dist/reduce_int.h"

#include <immintrin.h>

static void sum_f32_avx2(void *av, const void *bv, size_t n) {
  float *a = av;
  const float *b = bv;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 x0 = _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
    __m256 x1 = _mm256_add_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8));
    __m256 x2 = _mm256_add_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16));
    __m256 x3 = _mm256_add_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24));
    _mm256_storeu_ps(a + i, x0);
    _mm256_storeu_ps(a + i + 8, x1);
    _mm256_storeu_ps(a + i + 16, x2);
    _mm256_storeu_ps(a + i + 24, x3);
  }
  if (i < n) loom__reduce_kernels_scalar.combine[0][LOOM_SUM](a + i, b + i, n - i);
}

static void sum2_f32_avx2(float *const *dsts, int ndst, const float *a, const float *b, size_t n,
                          float s) {
  const __m256 vs = _mm256_set1_ps(s);
  size_t i = loom__sum2_head(dsts, ndst, a, b, n, s);
  for (; i + 16 <= n; i += 16) {
    __m256 x0 = _mm256_mul_ps(_mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)), vs);
    __m256 x1 =
        _mm256_mul_ps(_mm256_add_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8)), vs);
    for (int j = 0; j < ndst; j++) {
      _mm256_storeu_ps(dsts[j] + i, x0);
      _mm256_storeu_ps(dsts[j] + i + 8, x1);
    }
  }
  for (; i < n; i++) {
    float x = (a[i] + b[i]) * s;
    for (int j = 0; j < ndst; j++) dsts[j][i] = x;
  }
}

LOOM__COMBINE_TABLE2(loom__reduce_kernels_avx2, sum_f32_avx2, sum2_f32_avx2);
