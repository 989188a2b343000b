/* unscale_avx2.c: the fused unscale + inf/NaN check and the early-exit check with AVX2 and
 * F16C, 32 elements a step, in place; buffers larger than the cache are walked as interleaved
 * prefetched streams (sweep_avx2.h). The finite test is on the stored bits (exponent all
 * ones), OR-ed into an accumulator register and tested once at the end (the early-exit check
 * tests once per block). Ragged ends go through the scalar reference. Built with -mavx2 -mfma
 * -mf16c. */
#include "amp/amp_int.h"

#include "core/kernels/bf16_avx2.h"
#include "core/kernels/kernels.h"
#include "core/kernels/sweep_avx2.h"

#include <immintrin.h>

/* Lanes of v whose masked bits equal e: all ones, else zero. */
static inline __m256i hit32(__m256i v, __m256i e) {
  return _mm256_cmpeq_epi32(_mm256_and_si256(v, e), e);
}
static inline __m256i hit16(__m256i v, __m256i e) {
  return _mm256_cmpeq_epi16(_mm256_and_si256(v, e), e);
}

/* An unscale in progress: the buffer, the factor, the format's exponent field in every lane
 * and the running OR of the lanes found inf or NaN. */
typedef struct unscale_ctx {
  char *x;
  __m256 s;
  __m256i e, bad;
} unscale_ctx;

/* 32 f32 in place from element i. */
static inline void f32_step(void *ctx, size_t i) {
  unscale_ctx *c = ctx;
  float *x = (float *)c->x + i;
  __m256 a = _mm256_mul_ps(_mm256_loadu_ps(x), c->s);
  __m256 b = _mm256_mul_ps(_mm256_loadu_ps(x + 8), c->s);
  __m256 d = _mm256_mul_ps(_mm256_loadu_ps(x + 16), c->s);
  __m256 f = _mm256_mul_ps(_mm256_loadu_ps(x + 24), c->s);
  _mm256_storeu_ps(x, a);
  _mm256_storeu_ps(x + 8, b);
  _mm256_storeu_ps(x + 16, d);
  _mm256_storeu_ps(x + 24, f);
  c->bad = _mm256_or_si256(
      c->bad, _mm256_or_si256(_mm256_or_si256(hit32(_mm256_castps_si256(a), c->e),
                                              hit32(_mm256_castps_si256(b), c->e)),
                              _mm256_or_si256(hit32(_mm256_castps_si256(d), c->e),
                                              hit32(_mm256_castps_si256(f), c->e))));
}

/* 16 f16 -> f32, multiply, back with round to nearest even. */
static inline __m256i f16_16(const uint16_t *p, __m256 s) {
  __m256 lo = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)), s);
  __m256 hi = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8))), s);
  __m128i a = _mm256_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m128i b = _mm256_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm256_set_m128i(b, a);
}

/* 16 bf16 -> f32, multiply, back. Widened by unpacking under zeros: lo holds elements 0-3
 * and 8-11, hi 4-7 and 12-15, which packus (per 128-bit lane) puts back in order. */
static inline __m256i bf16_16(const uint16_t *p, __m256 s) {
  __m256i h = _mm256_loadu_si256((const __m256i *)p), z = _mm256_setzero_si256();
  __m256 lo = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, h)), s);
  __m256 hi = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(z, h)), s);
  return _mm256_packus_epi32(loom__bf16_round_avx2(_mm256_castps_si256(lo)),
                             loom__bf16_round_avx2(_mm256_castps_si256(hi)));
}

/* 32 half-precision values in place from element i, 16 at a time through `half`. */
static inline __attribute__((always_inline)) void
half_step(unscale_ctx *c, size_t i, __m256i (*half)(const uint16_t *, __m256)) {
  uint16_t *x = (uint16_t *)c->x + i;
  __m256i r0 = half(x, c->s), r1 = half(x + 16, c->s);
  _mm256_storeu_si256((__m256i *)x, r0);
  _mm256_storeu_si256((__m256i *)(x + 16), r1);
  c->bad = _mm256_or_si256(c->bad, _mm256_or_si256(hit16(r0, c->e), hit16(r1, c->e)));
}
static inline void f16_step(void *ctx, size_t i) { half_step(ctx, i, f16_16); }
static inline void bf16_step(void *ctx, size_t i) { half_step(ctx, i, bf16_16); }

/* x[0, n) (es bytes an element) in place through `step`, 32 elements a step; a buffer past
 * LOOM__STREAM_BYTES (no longer cache-sized) as interleaved prefetched streams. *done: where
 * the steps stopped (the caller's ragged end). True iff a stored result is inf or NaN. */
static inline __attribute__((always_inline)) bool
unscale(void *x, size_t es, size_t n, float inv, __m256i e, loom__sweep_fn *step, size_t *done) {
  unscale_ctx c = {x, _mm256_set1_ps(inv), e, _mm256_setzero_si256()};
  *done = loom__sweep_avx2(0, n, 32, n * es >= LOOM__STREAM_BYTES, x, es, step, &c);
  return !_mm256_testz_si256(c.bad, c.bad);
}

static bool unscale_f32(float *x, size_t n, float inv) {
  size_t i;
  bool bad = unscale(x, 4, n, inv, _mm256_set1_epi32(0x7f800000), f32_step, &i);
  return loom__amp_kernels_scalar.unscale_f32(x + i, n - i, inv) || bad;
}

static bool unscale_f16(uint16_t *x, size_t n, float inv) {
  size_t i;
  bool bad = unscale(x, 2, n, inv, _mm256_set1_epi16(0x7c00), f16_step, &i);
  return loom__amp_kernels_scalar.unscale_f16(x + i, n - i, inv) || bad;
}

static bool unscale_bf16(uint16_t *x, size_t n, float inv) {
  size_t i;
  bool bad = unscale(x, 2, n, inv, _mm256_set1_epi16(0x7f80), bf16_step, &i);
  return loom__amp_kernels_scalar.unscale_bf16(x + i, n - i, inv) || bad;
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

LOOM__AMP_KERNELS(loom__amp_kernels_avx2);
