/* unscale_avx512.c: the fused unscale + inf/NaN check and the early-exit check with AVX-512,
 * 64 elements a step (f32: four vectors; f16/bf16: two vectors widened to four), in place.
 * The finite test is on the stored bits (exponent all ones), accumulated in a mask register,
 * so it costs no extra pass. bf16 rounds with integer arithmetic (exact for subnormal products,
 * which VCVTNEPS2BF16 would flush). Ragged ends go through the scalar reference. Built with
 * -mavx512f -mavx512bw -mavx512vl -mf16c. */
#include "amp/amp_int.h"

#include "core/kernels/bf16_avx512.h"

#include <immintrin.h>

static bool unscale_f32(float *x, size_t n, float inv) {
  const __m512 s = _mm512_set1_ps(inv);
  const __m512i e = _mm512_set1_epi32(0x7f800000);
  __mmask16 bad = 0;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512 a = _mm512_mul_ps(_mm512_loadu_ps(x + i), s);
    __m512 b = _mm512_mul_ps(_mm512_loadu_ps(x + i + 16), s);
    __m512 c = _mm512_mul_ps(_mm512_loadu_ps(x + i + 32), s);
    __m512 d = _mm512_mul_ps(_mm512_loadu_ps(x + i + 48), s);
    _mm512_storeu_ps(x + i, a);
    _mm512_storeu_ps(x + i + 16, b);
    _mm512_storeu_ps(x + i + 32, c);
    _mm512_storeu_ps(x + i + 48, d);
    /* exponent all ones in any lane of the four vectors */
    bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(a), e), e) |
           _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(b), e), e) |
           _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(c), e), e) |
           _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(d), e), e);
  }
  for (; i + 16 <= n; i += 16) {
    __m512 a = _mm512_mul_ps(_mm512_loadu_ps(x + i), s);
    _mm512_storeu_ps(x + i, a);
    bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(a), e), e);
  }
  bool tail = loom__amp_kernels_scalar.unscale_f32(x + i, n - i, inv);
  return bad != 0 || tail;
}

/* f16: F16C widen, multiply, round to nearest even (VCVTPS2PH gives the reference's bits). */
static inline __m256i f16_step(const uint16_t *p, __m512 s) {
  __m512 v = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)), s);
  return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

static inline __m256i bf16_step(const uint16_t *p, __m512 s) {
  __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16);
  return loom__bf16_round_avx512(_mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(w), s)));
}

/* 64 half-precision values a step through `step`; `exp` is the format's exponent field. The
 * ragged end goes through `tail` (the scalar reference). */
static inline __attribute__((always_inline)) bool
unscale_h(uint16_t *x, size_t n, float inv, __m256i (*step)(const uint16_t *, __m512), short exp,
          bool (*tail)(uint16_t *, size_t, float)) {
  const __m512 s = _mm512_set1_ps(inv);
  const __m512i e = _mm512_set1_epi16(exp);
  __mmask32 bad = 0;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512i r0 = _mm512_inserti64x4(_mm512_castsi256_si512(step(x + i, s)), step(x + i + 16, s), 1);
    __m512i r1 =
        _mm512_inserti64x4(_mm512_castsi256_si512(step(x + i + 32, s)), step(x + i + 48, s), 1);
    _mm512_storeu_si512(x + i, r0);
    _mm512_storeu_si512(x + i + 32, r1);
    bad |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(r0, e), e) |
           _mm512_cmpeq_epi16_mask(_mm512_and_si512(r1, e), e);
  }
  bool t = tail(x + i, n - i, inv);
  return bad != 0 || t;
}

static bool unscale_f16(uint16_t *x, size_t n, float inv) {
  return unscale_h(x, n, inv, f16_step, 0x7c00, loom__amp_kernels_scalar.unscale_f16);
}

static bool unscale_bf16(uint16_t *x, size_t n, float inv) {
  return unscale_h(x, n, inv, bf16_step, 0x7f80, loom__amp_kernels_scalar.unscale_bf16);
}

/* Early exit: 32-bit lanes with exponent all ones (f32), 16-bit lanes for f16/bf16, tested once
 * per block. */
static bool nonfinite_f32(const float *x, size_t n) {
  const __m512i e = _mm512_set1_epi32(0x7f800000);
  size_t i = 0;
  while (i + LOOM__AMP_CHECK_BLOCK <= n) {
    __mmask16 bad = 0;
    for (size_t end = i + LOOM__AMP_CHECK_BLOCK; i < end; i += 64)
      bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_loadu_si512(x + i), e), e) |
             _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_loadu_si512(x + i + 16), e), e) |
             _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_loadu_si512(x + i + 32), e), e) |
             _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_loadu_si512(x + i + 48), e), e);
    if (bad) return true;
  }
  return loom__amp_kernels_scalar.nonfinite_f32(x + i, n - i);
}

static inline __attribute__((always_inline)) bool
nonfinite_h(const uint16_t *x, size_t n, short exp, bool (*tail)(const uint16_t *, size_t)) {
  const __m512i e = _mm512_set1_epi16(exp);
  size_t i = 0;
  while (i + LOOM__AMP_CHECK_BLOCK <= n) {
    __mmask32 bad = 0;
    for (size_t end = i + LOOM__AMP_CHECK_BLOCK; i < end; i += 128)
      bad |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(_mm512_loadu_si512(x + i), e), e) |
             _mm512_cmpeq_epi16_mask(_mm512_and_si512(_mm512_loadu_si512(x + i + 32), e), e) |
             _mm512_cmpeq_epi16_mask(_mm512_and_si512(_mm512_loadu_si512(x + i + 64), e), e) |
             _mm512_cmpeq_epi16_mask(_mm512_and_si512(_mm512_loadu_si512(x + i + 96), e), e);
    if (bad) return true;
  }
  return tail(x + i, n - i);
}

static bool nonfinite_f16(const uint16_t *x, size_t n) {
  return nonfinite_h(x, n, 0x7c00, loom__amp_kernels_scalar.nonfinite_f16);
}
static bool nonfinite_bf16(const uint16_t *x, size_t n) {
  return nonfinite_h(x, n, 0x7f80, loom__amp_kernels_scalar.nonfinite_bf16);
}

LOOM__AMP_KERNELS(loom__amp_kernels_avx512);
