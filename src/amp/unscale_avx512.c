/* unscale_avx512.c: the fused unscale + inf/NaN check and the early-exit check with AVX-512,
 * 64 elements a step (f32: four vectors; f16/bf16: two vectors widened to four), in place;
 * buffers larger than the cache are walked as interleaved prefetched streams (sweep_avx2.h),
 * as the AVX2 level walks them. The finite test is on the stored bits (exponent all ones),
 * accumulated in a mask register, so it costs no extra pass. bf16 rounds with integer
 * arithmetic (exact for subnormal products, which VCVTNEPS2BF16 would flush). Ragged ends go
 * through the scalar reference. Built with -mavx512f -mavx512bw -mavx512vl -mf16c. */
#include "amp/amp_int.h"

#include "core/kernels/bf16_avx512.h"
#include "core/kernels/kernels.h"
#include "core/kernels/sweep_avx2.h"

#include <immintrin.h>

/* An unscale in progress: the buffer, the factor, the format's exponent field (32-bit lanes
 * for f32, 16-bit for f16/bf16) and the running OR of the lanes found inf or NaN. */
typedef struct unscale_ctx {
  char *x;
  __m512 s;
  __m512i e;
  __mmask32 bad;
} unscale_ctx;

/* 64 f32 in place from element i: four vectors, each multiplied, stored and tested for an
 * exponent of all ones. */
static inline void f32_step(void *ctx, size_t i) {
  unscale_ctx *c = ctx;
  float *x = (float *)c->x + i;
#pragma GCC unroll 4
  for (int k = 0; k < 4; k++) {
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + 16 * k), c->s);
    _mm512_storeu_ps(x + 16 * k, v);
    c->bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), c->e), c->e);
  }
}

/* f16: F16C widen, multiply, round to nearest even (VCVTPS2PH gives the reference's bits). */
static inline __m256i f16_16(const uint16_t *p, __m512 s) {
  __m512 v = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)), s);
  return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

static inline __m256i bf16_16(const uint16_t *p, __m512 s) {
  __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16);
  return loom__bf16_round_avx512(_mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(w), s)));
}

/* 64 half-precision values in place from element i, 16 at a time through `half`. */
static inline __attribute__((always_inline)) void
half_step(unscale_ctx *c, size_t i, __m256i (*half)(const uint16_t *, __m512)) {
  uint16_t *x = (uint16_t *)c->x + i;
  __m512i r0 = _mm512_inserti64x4(_mm512_castsi256_si512(half(x, c->s)), half(x + 16, c->s), 1);
  __m512i r1 =
      _mm512_inserti64x4(_mm512_castsi256_si512(half(x + 32, c->s)), half(x + 48, c->s), 1);
  _mm512_storeu_si512(x, r0);
  _mm512_storeu_si512(x + 32, r1);
  c->bad |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(r0, c->e), c->e) |
            _mm512_cmpeq_epi16_mask(_mm512_and_si512(r1, c->e), c->e);
}
static inline void f16_step(void *ctx, size_t i) { half_step(ctx, i, f16_16); }
static inline void bf16_step(void *ctx, size_t i) { half_step(ctx, i, bf16_16); }

/* x[0, n) (es bytes an element) in place through `step`, 64 elements a step; a buffer past
 * LOOM__STREAM_BYTES (no longer cache-sized) as interleaved prefetched streams, as the AVX2
 * level walks it. *done: where the steps stopped (the caller's ragged end). True iff a stored
 * result is inf or NaN. */
static inline __attribute__((always_inline)) bool
unscale(void *x, size_t es, size_t n, float inv, __m512i e, loom__sweep_fn *step, size_t *done) {
  unscale_ctx c = {x, _mm512_set1_ps(inv), e, 0};
  *done = loom__sweep_avx2(0, n, 64, n * es >= LOOM__STREAM_BYTES, x, es, step, &c);
  return c.bad != 0;
}

static bool unscale_f32(float *x, size_t n, float inv) {
  size_t i;
  bool bad = unscale(x, 4, n, inv, _mm512_set1_epi32(0x7f800000), f32_step, &i);
  return loom__amp_kernels_scalar.unscale_f32(x + i, n - i, inv) || bad;
}

static bool unscale_f16(uint16_t *x, size_t n, float inv) {
  size_t i;
  bool bad = unscale(x, 2, n, inv, _mm512_set1_epi16(0x7c00), f16_step, &i);
  return loom__amp_kernels_scalar.unscale_f16(x + i, n - i, inv) || bad;
}

static bool unscale_bf16(uint16_t *x, size_t n, float inv) {
  size_t i;
  bool bad = unscale(x, 2, n, inv, _mm512_set1_epi16(0x7f80), bf16_step, &i);
  return loom__amp_kernels_scalar.unscale_bf16(x + i, n - i, inv) || bad;
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
