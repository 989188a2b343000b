/* bf16_avx2.h: the AVX2 form of the scalar reference's f32 -> bf16 rounding (nearest even,
 * NaN kept quiet), shared by the core conversions and the AMP unscale kernels. Include only
 * from files built with -mavx2. */
#ifndef LOOM_CORE_BF16_AVX2_H
#define LOOM_CORE_BF16_AVX2_H

#include <immintrin.h>

/* 8 f32 (as bits) -> 8 bf16 in the low halves of the 32-bit lanes (high halves zero): add
 * 0x7fff and the kept lsb, shift; a NaN is made quiet instead (its rounding could carry into
 * the exponent). */
static inline __m256i loom__bf16_round_avx2(__m256i x) {
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  __m256 f = _mm256_castsi256_ps(x);
  __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(x, _mm256_set1_epi32(0x00400000)), nan);
  return _mm256_srli_epi32(r, 16);
}

#endif
