/* cvt_avx512.c: f32 <-> f16 / bf16 conversions with AVX-512 (and AVX512-BF16), 32 elements a
 * step. VCVTNEPS2BF16 flushes subnormal inputs to zero, so lanes holding an f32 subnormal are
 * redone with the integer rounding; everything else it gets exactly right. Large outputs use
 * non-temporal stores, whole lines a step, and their input is read as interleaved prefetched
 * streams (sweep_avx2.h). Built with -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -mf16c. */
#include "core/kernels/bf16_avx512.h"
#include "core/kernels/kernels.h"
#include "core/kernels/sweep_avx2.h"

#include <immintrin.h>



/* A 64-byte store to a 64-byte aligned d, non-temporal when streaming. */
static inline void put(const loom__cvt_ctx *c, char *d, __m512i v) {
  if (c->stream) _mm512_stream_si512((void *)d, v);
  else _mm512_store_si512((void *)d, v);
}


static inline __m512i join(__m256i a, __m256i b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

static inline void step_f32_bf16_int(void *ctx, size_t i) {
  loom__cvt_ctx *c = ctx;
  const char *s = c->src + i * 4;
  put(c, c->dst + i * 2, join(loom__bf16_round_avx512(_mm512_loadu_si512(s)),
                              loom__bf16_round_avx512(_mm512_loadu_si512(s + 64))));
}

static void f32_to_bf16_int(const float *src, uint16_t *dst, size_t n) {
  size_t i = loom__cvt_head(dst, 2, n);
  loom__core_kernels_scalar.cvt_f32_to_bf16(src, dst, i);
  i = loom__cvt_body(src, 4, dst, 2, i, n, 32, step_f32_bf16_int);
  loom__core_kernels_scalar.cvt_f32_to_bf16(src + i, dst + i, n - i);
}

/* 16 f32 -> 16 bf16 with VCVTNEPS2BF16, subnormal-input lanes redone in integer. */
static inline __m256i bf16_round_hw(__m512 v) {
  __m512i x = _mm512_castps_si512(v);
  __m256i r = (__m256i)_mm512_cvtneps_pbh(v);
  __mmask16 zero_exp = _mm512_testn_epi32_mask(x, _mm512_set1_epi32(0x7f800000));
  __mmask16 nonzero = _mm512_test_epi32_mask(x, _mm512_set1_epi32(0x7fffffff));
  __mmask16 sub = zero_exp & nonzero;
  if (sub) r = _mm256_mask_mov_epi16(r, sub, loom__bf16_round_avx512(x));
  return r;
}

static inline void step_f32_bf16_hw(void *ctx, size_t i) {
  loom__cvt_ctx *c = ctx;
  const float *s = (const float *)(c->src + i * 4);
  put(c, c->dst + i * 2, join(bf16_round_hw(_mm512_loadu_ps(s)),
                              bf16_round_hw(_mm512_loadu_ps(s + 16))));
}

void loom__cvt_f32_to_bf16_avx512bf16(const float *src, uint16_t *dst, size_t n) {
  size_t i = loom__cvt_head(dst, 2, n);
  loom__core_kernels_scalar.cvt_f32_to_bf16(src, dst, i);
  i = loom__cvt_body(src, 4, dst, 2, i, n, 32, step_f32_bf16_hw);
  loom__core_kernels_scalar.cvt_f32_to_bf16(src + i, dst + i, n - i);
}

static inline void step_bf16_f32(void *ctx, size_t i) {
  loom__cvt_ctx *c = ctx;
  __m512i h = _mm512_loadu_si512(c->src + i * 2);
  put(c, c->dst + i * 4, _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16));
  put(c, c->dst + i * 4 + 64,
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16));
}

static void bf16_to_f32(const uint16_t *src, float *dst, size_t n) {
  size_t i = loom__cvt_head(dst, 4, n);
  loom__core_kernels_scalar.cvt_bf16_to_f32(src, dst, i);
  i = loom__cvt_body(src, 2, dst, 4, i, n, 32, step_bf16_f32);
  loom__core_kernels_scalar.cvt_bf16_to_f32(src + i, dst + i, n - i);
}

static inline void step_f32_f16(void *ctx, size_t i) {
  loom__cvt_ctx *c = ctx;
  const float *s = (const float *)(c->src + i * 4);
  put(c, c->dst + i * 2, join(_mm512_cvtps_ph(_mm512_loadu_ps(s), _MM_FROUND_TO_NEAREST_INT),
                              _mm512_cvtps_ph(_mm512_loadu_ps(s + 16), _MM_FROUND_TO_NEAREST_INT)));
}

static void f32_to_f16(const float *src, uint16_t *dst, size_t n) {
  size_t i = loom__cvt_head(dst, 2, n);
  loom__core_kernels_scalar.cvt_f32_to_f16(src, dst, i);
  i = loom__cvt_body(src, 4, dst, 2, i, n, 32, step_f32_f16);
  loom__core_kernels_scalar.cvt_f32_to_f16(src + i, dst + i, n - i);
}

static inline void step_f16_f32(void *ctx, size_t i) {
  loom__cvt_ctx *c = ctx;
  __m512i h = _mm512_loadu_si512(c->src + i * 2);
  put(c, c->dst + i * 4, _mm512_castps_si512(_mm512_cvtph_ps(_mm512_castsi512_si256(h))));
  put(c, c->dst + i * 4 + 64,
      _mm512_castps_si512(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1))));
}

static void f16_to_f32(const uint16_t *src, float *dst, size_t n) {
  size_t i = loom__cvt_head(dst, 4, n);
  loom__core_kernels_scalar.cvt_f16_to_f32(src, dst, i);
  i = loom__cvt_body(src, 2, dst, 4, i, n, 32, step_f16_f32);
  loom__core_kernels_scalar.cvt_f16_to_f32(src + i, dst + i, n - i);
}

const loom__core_kernels loom__core_kernels_avx512 = {
    .cvt_f32_to_bf16 = f32_to_bf16_int,
    .cvt_bf16_to_f32 = bf16_to_f32,
    .cvt_f32_to_f16 = f32_to_f16,
    .cvt_f16_to_f32 = f16_to_f32,
};
