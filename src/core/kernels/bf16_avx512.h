/* bf16_avx512.h: the AVX-512 form of the scalar reference's f32 -> bf16 rounding (nearest
 * even, NaN kept quiet), shared by the core conversions and the AMP unscale kernels. Include
 * only from files built with -mavx512f -mavx512bw. */
#ifndef LOOM_CORE_BF16_AVX512_H
#define LOOM_CORE_BF16_AVX512_H

#include <immintrin.h>

/* 16 f32 (as bits) -> 16 bf16. */
static inline __m256i loom__bf16_round_avx512(__m512i x) {
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                          _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(r);
}

#endif
