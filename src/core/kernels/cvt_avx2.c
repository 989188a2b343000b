/* cvt_avx2.c: f32 <-> f16 / bf16 conversions with AVX2 and F16C, 16 elements a step.
 * Large outputs are written with non-temporal stores (they would only evict the cache);
 * the ragged ends go through the scalar reference. Built with -mavx2 -mfma -mf16c. */
#include "core/kernels/kernels.h"

#include <immintrin.h>

/* Elements to convert one by one before dst reaches 32-byte alignment. */
static size_t head_count(const void *dst, size_t elem, size_t n) {
  size_t mis = (uintptr_t)dst & 31u;
  if (!mis) return 0;
  size_t h = (32u - mis) / elem;
  if ((32u - mis) % elem) return n; /* dst not element-aligned: no vector path */
  return h < n ? h : n;
}

/* 16 f32 -> 16 bf16 (round to nearest even, NaN kept quiet). */
static inline __m256i bf16_round16(__m256i a, __m256i b) {
  const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
  const __m256i absmask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  __m256i ra = _mm256_srli_epi32(
      _mm256_add_epi32(a, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(a, 16), one))), 16);
  __m256i rb = _mm256_srli_epi32(
      _mm256_add_epi32(b, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(b, 16), one))), 16);
  __m256i nana = _mm256_cmpgt_epi32(_mm256_and_si256(a, absmask), inf);
  __m256i nanb = _mm256_cmpgt_epi32(_mm256_and_si256(b, absmask), inf);
  ra = _mm256_blendv_epi8(ra, _mm256_or_si256(_mm256_srli_epi32(a, 16), quiet), nana);
  rb = _mm256_blendv_epi8(rb, _mm256_or_si256(_mm256_srli_epi32(b, 16), quiet), nanb);
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(ra, rb), 0xd8);
}

static void f32_to_bf16(const float *src, uint16_t *dst, size_t n) {
  size_t i = head_count(dst, 2, n);
  loom__core_kernels_scalar.cvt_f32_to_bf16(src, dst, i);
  bool stream = n * 2 >= LOOM__STREAM_BYTES;
  for (; i + 16 <= n; i += 16) {
    __m256i a = _mm256_loadu_si256((const __m256i *)(src + i));
    __m256i b = _mm256_loadu_si256((const __m256i *)(src + i + 8));
    __m256i r = bf16_round16(a, b);
    if (stream) _mm256_stream_si256((__m256i *)(dst + i), r);
    else _mm256_store_si256((__m256i *)(dst + i), r);
  }
  if (stream) _mm_sfence();
  loom__core_kernels_scalar.cvt_f32_to_bf16(src + i, dst + i, n - i);
}

static void bf16_to_f32(const uint16_t *src, float *dst, size_t n) {
  size_t i = head_count(dst, 4, n);
  loom__core_kernels_scalar.cvt_bf16_to_f32(src, dst, i);
  bool stream = n * 4 >= LOOM__STREAM_BYTES;
  for (; i + 16 <= n; i += 16) {
    __m256i h = _mm256_loadu_si256((const __m256i *)(src + i));
    __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16);
    __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16);
    if (stream) {
      _mm256_stream_si256((__m256i *)(dst + i), lo);
      _mm256_stream_si256((__m256i *)(dst + i + 8), hi);
    } else {
      _mm256_store_si256((__m256i *)(dst + i), lo);
      _mm256_store_si256((__m256i *)(dst + i + 8), hi);
    }
  }
  if (stream) _mm_sfence();
  loom__core_kernels_scalar.cvt_bf16_to_f32(src + i, dst + i, n - i);
}

static void f32_to_f16(const float *src, uint16_t *dst, size_t n) {
  size_t i = head_count(dst, 2, n);
  loom__core_kernels_scalar.cvt_f32_to_f16(src, dst, i);
  bool stream = n * 2 >= LOOM__STREAM_BYTES;
  for (; i + 16 <= n; i += 16) {
    __m128i a = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    __m128i b = _mm256_cvtps_ph(_mm256_loadu_ps(src + i + 8), _MM_FROUND_TO_NEAREST_INT);
    __m256i r = _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
    if (stream) _mm256_stream_si256((__m256i *)(dst + i), r);
    else _mm256_store_si256((__m256i *)(dst + i), r);
  }
  if (stream) _mm_sfence();
  loom__core_kernels_scalar.cvt_f32_to_f16(src + i, dst + i, n - i);
}

static void f16_to_f32(const uint16_t *src, float *dst, size_t n) {
  size_t i = head_count(dst, 4, n);
  loom__core_kernels_scalar.cvt_f16_to_f32(src, dst, i);
  bool stream = n * 4 >= LOOM__STREAM_BYTES;
  for (; i + 16 <= n; i += 16) {
    __m256i h = _mm256_loadu_si256((const __m256i *)(src + i));
    __m256 lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    __m256 hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    if (stream) {
      _mm256_stream_ps(dst + i, lo);
      _mm256_stream_ps(dst + i + 8, hi);
    } else {
      _mm256_store_ps(dst + i, lo);
      _mm256_store_ps(dst + i + 8, hi);
    }
  }
  if (stream) _mm_sfence();
  loom__core_kernels_scalar.cvt_f16_to_f32(src + i, dst + i, n - i);
}

const loom__core_kernels loom__core_kernels_avx2 = {
    .cvt_f32_to_bf16 = f32_to_bf16,
    .cvt_bf16_to_f32 = bf16_to_f32,
    .cvt_f32_to_f16 = f32_to_f16,
    .cvt_f16_to_f32 = f16_to_f32,
};
