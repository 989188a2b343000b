/* cvt_avx2.c: f32 <-> f16 / bf16 conversions with AVX2 and F16C, 32 elements a step.
 * Large outputs (LOOM__STREAM_BYTES) are written with non-temporal stores (they would only
 * evict the cache), whole cache lines a step, and their input is read as interleaved
 * prefetched streams (sweep_avx2.h). The ragged ends go through the scalar reference. Built
 * with -mavx2 -mfma -mf16c. */
#include "core/kernels/bf16_avx2.h"
#include "core/kernels/kernels.h"
#include "core/kernels/sweep_avx2.h"

#include <immintrin.h>

#define STEP 32 /* elements a step: 128 bytes of f32, 64 of f16 / bf16 */



/* A 32-byte store to a 32-byte aligned d, non-temporal when streaming. */
static inline void put(const loom__cvt_ctx *c, char *d, __m256i v) {
  if (c->stream) _mm256_stream_si256((__m256i *)d, v);
  else _mm256_store_si256((__m256i *)d, v);
}


/* 16 f32 -> 16 bf16, in order. */
static inline __m256i bf16_16(const char *s) {
  __m256i a = loom__bf16_round_avx2(_mm256_loadu_si256((const __m256i *)s));
  __m256i b = loom__bf16_round_avx2(_mm256_loadu_si256((const __m256i *)(s + 32)));
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
}

static inline void step_f32_bf16(void *ctx, size_t i) {
  loom__cvt_ctx *c = ctx;
  __m256i a = bf16_16(c->src + i * 4), b = bf16_16(c->src + i * 4 + 64);
  put(c, c->dst + i * 2, a);
  put(c, c->dst + i * 2 + 32, b);
}

/* 16 f32 -> 16 f16 (F16C: nearest even, subnormals kept, overflow to inf, NaN quiet). */
static inline __m256i f16_16(const char *s) {
  __m128i a = _mm256_cvtps_ph(_mm256_loadu_ps((const float *)s), _MM_FROUND_TO_NEAREST_INT);
  __m128i b = _mm256_cvtps_ph(_mm256_loadu_ps((const float *)(s + 32)), _MM_FROUND_TO_NEAREST_INT);
  return _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
}

static inline void step_f32_f16(void *ctx, size_t i) {
  loom__cvt_ctx *c = ctx;
  __m256i a = f16_16(c->src + i * 4), b = f16_16(c->src + i * 4 + 64);
  put(c, c->dst + i * 2, a);
  put(c, c->dst + i * 2 + 32, b);
}

static inline void step_bf16_f32(void *ctx, size_t i) {
  loom__cvt_ctx *c = ctx;
  for (int k = 0; k < 2; k++) {
    __m256i h = _mm256_loadu_si256((const __m256i *)(c->src + i * 2 + 32 * k));
    char *d = c->dst + i * 4 + 64 * k;
    put(c, d, _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16));
    put(c, d + 32, _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16));
  }
}

static inline void step_f16_f32(void *ctx, size_t i) {
  loom__cvt_ctx *c = ctx;
  for (int k = 0; k < 2; k++) {
    __m256i h = _mm256_loadu_si256((const __m256i *)(c->src + i * 2 + 32 * k));
    char *d = c->dst + i * 4 + 64 * k;
    put(c, d, _mm256_castps_si256(_mm256_cvtph_ps(_mm256_castsi256_si128(h))));
    put(c, d + 32, _mm256_castps_si256(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))));
  }
}

static void f32_to_bf16(const float *src, uint16_t *dst, size_t n) {
  size_t i = loom__cvt_head(dst, 2, n);
  loom__core_kernels_scalar.cvt_f32_to_bf16(src, dst, i);
  i = loom__cvt_body(src, 4, dst, 2, i, n, STEP, step_f32_bf16);
  loom__core_kernels_scalar.cvt_f32_to_bf16(src + i, dst + i, n - i);
}

static void bf16_to_f32(const uint16_t *src, float *dst, size_t n) {
  size_t i = loom__cvt_head(dst, 4, n);
  loom__core_kernels_scalar.cvt_bf16_to_f32(src, dst, i);
  i = loom__cvt_body(src, 2, dst, 4, i, n, STEP, step_bf16_f32);
  loom__core_kernels_scalar.cvt_bf16_to_f32(src + i, dst + i, n - i);
}

static void f32_to_f16(const float *src, uint16_t *dst, size_t n) {
  size_t i = loom__cvt_head(dst, 2, n);
  loom__core_kernels_scalar.cvt_f32_to_f16(src, dst, i);
  i = loom__cvt_body(src, 4, dst, 2, i, n, STEP, step_f32_f16);
  loom__core_kernels_scalar.cvt_f32_to_f16(src + i, dst + i, n - i);
}

static void f16_to_f32(const uint16_t *src, float *dst, size_t n) {
  size_t i = loom__cvt_head(dst, 4, n);
  loom__core_kernels_scalar.cvt_f16_to_f32(src, dst, i);
  i = loom__cvt_body(src, 2, dst, 4, i, n, STEP, step_f16_f32);
  loom__core_kernels_scalar.cvt_f16_to_f32(src + i, dst + i, n - i);
}

const loom__core_kernels loom__core_kernels_avx2 = {
    .cvt_f32_to_bf16 = f32_to_bf16,
    .cvt_bf16_to_f32 = bf16_to_f32,
    .cvt_f32_to_f16 = f32_to_f16,
    .cvt_f16_to_f32 = f16_to_f32,
};
