/* cvt_scalar.c: the scalar reference conversions between f32, f16 and bf16, one value and
 * array forms. These define the bits every other dispatch level must reproduce. */
#include "core/kernels/kernels.h"

#include <string.h>

uint16_t loom__ref_f32_to_bf16(uint32_t x) {
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u); /* quiet NaN */
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16); /* nearest, ties to even */
}

uint32_t loom__ref_bf16_to_f32(uint16_t h) { return (uint32_t)h << 16; }

uint16_t loom__ref_f32_to_f16(uint32_t x) {
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xffu) /* inf stays inf; NaN becomes a quiet NaN keeping the top payload bits */
    return (uint16_t)(sign | 0x7c00u | (mant ? 0x0200u | (mant >> 13) : 0));
  int e = (int)exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u); /* overflow: inf */
  if (e <= 0) {                                    /* f16 subnormal or zero */
    if (e < -10) return (uint16_t)sign;            /* below half the smallest subnormal */
    mant |= 0x800000u;
    int shift = 14 - e;
    uint32_t h = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) h++; /* may become the smallest normal */
    return (uint16_t)(sign | h);
  }
  uint32_t h = sign | ((uint32_t)e << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* a carry may reach inf: correct */
  return (uint16_t)h;
}

uint32_t loom__ref_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return sign;
    uint32_t e = 113; /* normalise a subnormal: 2^-14 * 0.m */
    while (!(mant & 0x400u)) {
      mant <<= 1;
      e--;
    }
    return sign | (e << 23) | ((mant & 0x3ffu) << 13);
  }
  if (exp == 31) return sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0);
  return sign | ((exp + 112u) << 23) | (mant << 13);
}

/* The buffer loops around the element references (inlined, one loop each way). */
static inline void narrow(const float *src, uint16_t *dst, size_t n, uint16_t (*ref)(uint32_t)) {
  for (size_t i = 0; i < n; i++) {
    uint32_t b;
    memcpy(&b, &src[i], 4);
    dst[i] = ref(b);
  }
}
static inline void widen(const uint16_t *src, float *dst, size_t n, uint32_t (*ref)(uint16_t)) {
  for (size_t i = 0; i < n; i++) {
    uint32_t b = ref(src[i]);
    memcpy(&dst[i], &b, 4);
  }
}

static void f32_to_bf16(const float *src, uint16_t *dst, size_t n) {
  narrow(src, dst, n, loom__ref_f32_to_bf16);
}
static void bf16_to_f32(const uint16_t *src, float *dst, size_t n) {
  widen(src, dst, n, loom__ref_bf16_to_f32);
}
static void f32_to_f16(const float *src, uint16_t *dst, size_t n) {
  narrow(src, dst, n, loom__ref_f32_to_f16);
}
static void f16_to_f32(const uint16_t *src, float *dst, size_t n) {
  widen(src, dst, n, loom__ref_f16_to_f32);
}

const loom__core_kernels loom__core_kernels_scalar = {
    .cvt_f32_to_bf16 = f32_to_bf16,
    .cvt_bf16_to_f32 = bf16_to_f32,
    .cvt_f32_to_f16 = f32_to_f16,
    .cvt_f16_to_f32 = f16_to_f32,
    .crc32c = loom__crc32c_scalar,
};
