/* attn_avx2.c: fused attention's inner loops (attn_body.h) on 8-lane AVX2 vectors with FMA.
 * Built with -mavx2 -mfma (CMakeLists.txt). */
#include "ops/attn_int.h"

#include <immintrin.h>

static inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

#define AV __m256
#define AW 8
#define AV_LOAD _mm256_loadu_ps
#define AV_STORE _mm256_storeu_ps
#define AV_FMA _mm256_fmadd_ps
#define AV_SET1 _mm256_set1_ps
#define AV_ZERO _mm256_setzero_ps
#define AV_HSUM hsum_avx2
#define ATTN_TABLE loom__attn_kernels_avx2
#include "ops/attn_body.h"
