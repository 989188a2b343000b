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

static inline float hmax_avx2(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

#define AV __m256
#define AW 8
#define AV_LOAD _mm256_loadu_ps
#define AV_STORE _mm256_storeu_ps
#define AV_FMA _mm256_fmadd_ps
#define AV_FNMA _mm256_fnmadd_ps
#define AV_SET1 _mm256_set1_ps
#define AV_ZERO _mm256_setzero_ps
#define AV_HSUM hsum_avx2
#define AV_ADD _mm256_add_ps
#define AV_MUL _mm256_mul_ps
#define AV_ROUND(x) _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define AV_MAX _mm256_max_ps
#define AV_HMAX hmax_avx2
#define AV_NV4 2
#define ATTN_TABLE loom__attn_kernels_avx2
#include "ops/attn_body.h"

/* 2^n built in the exponent bits, so lanes below -87.3 (where 2^n would leave the normal range)
 * give 0, and above 88.3 may give inf (only s - max or s - logsumexp <= 0 comes here). */
static inline __m256 av_exp(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3f);
  __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ), n;
  x = _mm256_max_ps(lo, _mm256_min_ps(_mm256_set1_ps(88.7f), x)); /* NaN kept */
  __m256 y = exp_reduced(x, &n);
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}
