/* cvt_avx512.c: f32 <-> f16 / bf16 conversions with AVX-512 (and AVX512-BF16), 32 elements a
 * step. VCVTNEPS2BF16 flushes subnormal inputs to zero, so lanes holding an f32 subnormal are
 * redone with the integer rounding; everything else it gets exactly right. Large outputs use
 * non-temporal stores. Built with -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -mf16c. */
#include "core/kernels/bf16_avx512.h"
#include "core/kernels/kernels.h"

#include <immintrin.h>

/* Elements to convert one by one before dst reaches 64-byte alignment. */
static size_t head_count(const void *dst, size_t elem, size_t n) {
  size_t mis = (uintptr_t)dst & 63u;
  if (!mis) return 0;
  if ((64u - mis) % elem) return n; /* dst not element-aligned: no vector path */
  size_t h = (64u - mis) / elem;
  return h < n ? h : n;
}

static void f32_to_bf16_int(const float *src, uint16_t *dst, size_t n) {
  size_t i = head_count(dst, 2, n);
  loom__core_kernels_scalar.cvt_f32_to_bf16(src, dst, i);
  bool stream = n * 2 >= LOOM__STREAM_BYTES;
  for (; i + 32 <= n; i += 32) {
    __m256i a = loom__bf16_round_avx512(_mm512_loadu_si512(src + i));
    __m256i b = loom__bf16_round_avx512(_mm512_loadu_si512(src + i + 16));
    __m512i r = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
    if (stream) _mm512_stream_si512((void *)(dst + i), r);
    else _mm512_store_si512(dst + i, r);
  }
  if (stream) _mm_sfence();
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

void loom__cvt_f32_to_bf16_avx512bf16(const float *src, uint16_t *dst, size_t n) {
  size_t i = head_count(dst, 2, n);
  loom__core_kernels_scalar.cvt_f32_to_bf16(src, dst, i);
  bool stream = n * 2 >= LOOM__STREAM_BYTES;
  for (; i + 32 <= n; i += 32) {
    __m256i a = bf16_round_hw(_mm512_loadu_ps(src + i));
    __m256i b = bf16_round_hw(_mm512_loadu_ps(src + i + 16));
    __m512i r = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
    if (stream) _mm512_stream_si512((void *)(dst + i), r);
    else _mm512_store_si512(dst + i, r);
  }
  if (stream) _mm_sfence();
  loom__core_kernels_scalar.cvt_f32_to_bf16(src + i, dst + i, n - i);
}

static void bf16_to_f32(const uint16_t *src, float *dst, size_t n) {
  size_t i = head_count(dst, 4, n);
  loom__core_kernels_scalar.cvt_bf16_to_f32(src, dst, i);
  bool stream = n * 4 >= LOOM__STREAM_BYTES;
  for (; i + 32 <= n; i += 32) {
    __m512i h = _mm512_loadu_si512(src + i);
    __m512i lo = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16);
    __m512i hi = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16);
    if (stream) {
      _mm512_stream_si512((void *)(dst + i), lo);
      _mm512_stream_si512((void *)(dst + i + 16), hi);
    } else {
      _mm512_store_si512(dst + i, lo);
      _mm512_store_si512(dst + i + 16, hi);
    }
  }
  if (stream) _mm_sfence();
  loom__core_kernels_scalar.cvt_bf16_to_f32(src + i, dst + i, n - i);
}

static void f32_to_f16(const float *src, uint16_t *dst, size_t n) {
  size_t i = head_count(dst, 2, n);
  loom__core_kernels_scalar.cvt_f32_to_f16(src, dst, i);
  bool stream = n * 2 >= LOOM__STREAM_BYTES;
  for (; i + 32 <= n; i += 32) {
    __m256i a = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    __m256i b = _mm512_cvtps_ph(_mm512_loadu_ps(src + i + 16), _MM_FROUND_TO_NEAREST_INT);
    __m512i r = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
    if (stream) _mm512_stream_si512((void *)(dst + i), r);
    else _mm512_store_si512(dst + i, r);
  }
  if (stream) _mm_sfence();
  loom__core_kernels_scalar.cvt_f32_to_f16(src + i, dst + i, n - i);
}

static void f16_to_f32(const uint16_t *src, float *dst, size_t n) {
  size_t i = head_count(dst, 4, n);
  loom__core_kernels_scalar.cvt_f16_to_f32(src, dst, i);
  bool stream = n * 4 >= LOOM__STREAM_BYTES;
  for (; i + 32 <= n; i += 32) {
    __m512i h = _mm512_loadu_si512(src + i);
    __m512 lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    __m512 hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
    if (stream) {
      _mm512_stream_ps(dst + i, lo);
      _mm512_stream_ps(dst + i + 16, hi);
    } else {
      _mm512_store_ps(dst + i, lo);
      _mm512_store_ps(dst + i + 16, hi);
    }
  }
  if (stream) _mm_sfence();
  loom__core_kernels_scalar.cvt_f16_to_f32(src + i, dst + i, n - i);
}

const loom__core_kernels loom__core_kernels_avx512 = {
    .cvt_f32_to_bf16 = f32_to_bf16_int,
    .cvt_bf16_to_f32 = bf16_to_f32,
    .cvt_f32_to_f16 = f32_to_f16,
    .cvt_f16_to_f32 = f16_to_f32,
};
