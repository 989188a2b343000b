/* unscale_avx2.c: the fused unscale + inf/NaN check and the early-exit check with AVX2 and
 * F16C, 32 elements a step, in place. The finite test is on the stored bits (exponent all
 * ones), OR-ed into an accumulator register and tested once at the end (the early-exit check
 * tests once per block). Ragged ends go through the scalar reference. Built with -mavx2 -mfma
 * -mf16c. */
#include "amp/amp_int.h"

#include <immintrin.h>

/* Lanes of v whose masked bits equal e: all ones, else zero. */
static inline __m256i hit32(__m256i v, __m256i e) {
  return _mm256_cmpeq_epi32(_mm256_and_si256(v, e), e);
}
static inline __m256i hit16(__m256i v, __m256i e) {
  return _mm256_cmpeq_epi16(_mm256_and_si256(v, e), e);
}

static bool unscale_f32(float *x, size_t n, float inv) {
  const __m256 s = _mm256_set1_ps(inv);
  const __m256i e = _mm256_set1_epi32(0x7f800000);
  __m256i bad = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 a = _mm256_mul_ps(_mm256_loadu_ps(x + i), s);
    __m256 b = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8), s);
    __m256 c = _mm256_mul_ps(_mm256_loadu_ps(x + i + 16), s);
    __m256 d = _mm256_mul_ps(_mm256_loadu_ps(x + i + 24), s);
    _mm256_storeu_ps(x + i, a);
    _mm256_storeu_ps(x + i + 8, b);
    _mm256_storeu_ps(x + i + 16, c);
    _mm256_storeu_ps(x + i + 24, d);
    bad = _mm256_or_si256(bad, _mm256_or_si256(_mm256_or_si256(hit32(_mm256_castps_si256(a), e),
                                                               hit32(_mm256_castps_si256(b), e)),
                                               _mm256_or_si256(hit32(_mm256_castps_si256(c), e),
                                                               hit32(_mm256_castps_si256(d), e))));
  }
  bool tail = loom__amp_kernels_scalar.unscale_f32(x + i, n - i, inv);
  return !_mm256_testz_si256(bad, bad) || tail;
}

/* 16 f16 -> f32, multiply, back with round to nearest even. */
static inline __m256i f16_step(const uint16_t *p, __m256 s) {
  __m256 lo = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)), s);
  __m256 hi = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8))), s);
  __m128i a = _mm256_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m128i b = _mm256_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm256_set_m128i(b, a);
}

/* 8 f32 (as bits) -> 8 bf16 in the low halves of 32-bit lanes: nearest even, NaN quiet. */
static inline __m256i bf16_round(__m256i x) {
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                   _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40)),
                            nan);
}

/* 16 bf16 -> f32, multiply, back. */
static inline __m256i bf16_step(const uint16_t *p, __m256 s) {
  __m256i h = _mm256_loadu_si256((const __m256i *)p);
  __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16);
  __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16);
  lo = bf16_round(_mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(lo), s)));
  hi = bf16_round(_mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(hi), s)));
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
}

/* 32 half-precision values a step through `step`; `exp` is the format's exponent field. The
 * ragged end goes through `tail` (the scalar reference). */
static inline __attribute__((always_inline)) bool
unscale_h(uint16_t *x, size_t n, float inv, __m256i (*step)(const uint16_t *, __m256), short exp,
          bool (*tail)(uint16_t *, size_t, float)) {
  const __m256 s = _mm256_set1_ps(inv);
  const __m256i e = _mm256_set1_epi16(exp);
  __m256i bad = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i r0 = step(x + i, s), r1 = step(x + i + 16, s);
    _mm256_storeu_si256((__m256i *)(x + i), r0);
    _mm256_storeu_si256((__m256i *)(x + i + 16), r1);
    bad = _mm256_or_si256(bad, _mm256_or_si256(hit16(r0, e), hit16(r1, e)));
  }
  bool t = tail(x + i, n - i, inv);
  return !_mm256_testz_si256(bad, bad) || t;
}

static bool unscale_f16(uint16_t *x, size_t n, float inv) {
  return unscale_h(x, n, inv, f16_step, 0x7c00, loom__amp_kernels_scalar.unscale_f16);
}

static bool unscale_bf16(uint16_t *x, size_t n, float inv) {
  return unscale_h(x, n, inv, bf16_step, 0x7f80, loom__amp_kernels_scalar.unscale_bf16);
}

static bool nonfinite_f32(const float *x, size_t n) {
  const __m256i e = _mm256_set1_epi32(0x7f800000);
  size_t i = 0;
  while (i + LOOM__AMP_CHECK_BLOCK <= n) {
    __m256i bad = _mm256_setzero_si256();
    for (size_t end = i + LOOM__AMP_CHECK_BLOCK; i < end; i += 32) {
      const __m256i *p = (const __m256i *)(x + i);
      bad = _mm256_or_si256(bad, _mm256_or_si256(_mm256_or_si256(hit32(_mm256_loadu_si256(p), e),
                                                                 hit32(_mm256_loadu_si256(p + 1), e)),
                                                 _mm256_or_si256(hit32(_mm256_loadu_si256(p + 2), e),
                                                                 hit32(_mm256_loadu_si256(p + 3), e))));
    }
    if (!_mm256_testz_si256(bad, bad)) return true;
  }
  return loom__amp_kernels_scalar.nonfinite_f32(x + i, n - i);
}

static inline __attribute__((always_inline)) bool
nonfinite_h(const uint16_t *x, size_t n, short exp, bool (*tail)(const uint16_t *, size_t)) {
  const __m256i e = _mm256_set1_epi16(exp);
  size_t i = 0;
  while (i + LOOM__AMP_CHECK_BLOCK <= n) {
    __m256i bad = _mm256_setzero_si256();
    for (size_t end = i + LOOM__AMP_CHECK_BLOCK; i < end; i += 64) {
      const __m256i *p = (const __m256i *)(x + i);
      bad = _mm256_or_si256(bad, _mm256_or_si256(_mm256_or_si256(hit16(_mm256_loadu_si256(p), e),
                                                                 hit16(_mm256_loadu_si256(p + 1), e)),
                                                 _mm256_or_si256(hit16(_mm256_loadu_si256(p + 2), e),
                                                                 hit16(_mm256_loadu_si256(p + 3), e))));
    }
    if (!_mm256_testz_si256(bad, bad)) return true;
  }
  return tail(x + i, n - i);
}

static bool nonfinite_f16(const uint16_t *x, size_t n) {
  return nonfinite_h(x, n, 0x7c00, loom__amp_kernels_scalar.nonfinite_f16);
}
static bool nonfinite_bf16(const uint16_t *x, size_t n) {
  return nonfinite_h(x, n, 0x7f80, loom__amp_kernels_scalar.nonfinite_bf16);
}

const loom__amp_kernels loom__amp_kernels_avx2 = {
    .unscale_f32 = unscale_f32,
    .unscale_f16 = unscale_f16,
    .unscale_bf16 = unscale_bf16,
    .nonfinite_f32 = nonfinite_f32,
    .nonfinite_f16 = nonfinite_f16,
    .nonfinite_bf16 = nonfinite_bf16,
};
