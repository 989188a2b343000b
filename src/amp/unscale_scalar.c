/* unscale_scalar.c: the scalar reference of the fused unscale + inf/NaN check and of the
 * early-exit check, for f32, f16 and bf16 buffers. These define the bits and the flag every
 * other dispatch level must reproduce: f32 products, f16/bf16 widened exactly, multiplied in
 * f32 and rounded back to nearest even with the core's reference conversions. */
#include "amp/amp_int.h"
#include "core/kernels/kernels.h"

#include <string.h>

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static bool unscale_f32(float *x, size_t n, float inv) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    float v = x[i] * inv;
    x[i] = v;
    bad |= (fbits(v) & 0x7f800000u) == 0x7f800000u;
  }
  return bad != 0;
}

/* A 16-bit format: widen exactly, multiply in f32, narrow to nearest even; `exp` is the
 * format's exponent field (all ones: inf or NaN). */
static inline bool unscale_h(uint16_t *x, size_t n, float inv, uint32_t (*widen)(uint16_t),
                             uint16_t (*narrow)(uint32_t), uint16_t exp) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t w = widen(x[i]);
    float v;
    memcpy(&v, &w, 4);
    uint16_t h = narrow(fbits(v * inv));
    x[i] = h;
    bad |= (h & exp) == exp;
  }
  return bad != 0;
}

static bool unscale_f16(uint16_t *x, size_t n, float inv) {
  return unscale_h(x, n, inv, loom__ref_f16_to_f32, loom__ref_f32_to_f16, 0x7c00u);
}

static bool unscale_bf16(uint16_t *x, size_t n, float inv) {
  return unscale_h(x, n, inv, loom__ref_bf16_to_f32, loom__ref_f32_to_bf16, 0x7f80u);
}

/* The exponent-all-ones test on raw bits, a block at a time, stopping at the first hit. */
static bool nonfinite_f32(const float *x, size_t n) {
  for (size_t i = 0; i < n;) {
    size_t end = n - i > LOOM__AMP_CHECK_BLOCK ? i + LOOM__AMP_CHECK_BLOCK : n;
    uint32_t bad = 0;
    for (; i < end; i++) bad |= (fbits(x[i]) & 0x7f800000u) == 0x7f800000u;
    if (bad) return true;
  }
  return false;
}

static bool nonfinite_h(const uint16_t *x, size_t n, uint16_t exp) {
  for (size_t i = 0; i < n;) {
    size_t end = n - i > LOOM__AMP_CHECK_BLOCK ? i + LOOM__AMP_CHECK_BLOCK : n;
    uint32_t bad = 0;
    for (; i < end; i++) bad |= (x[i] & exp) == exp;
    if (bad) return true;
  }
  return false;
}

static bool nonfinite_f16(const uint16_t *x, size_t n) { return nonfinite_h(x, n, 0x7c00u); }
static bool nonfinite_bf16(const uint16_t *x, size_t n) { return nonfinite_h(x, n, 0x7f80u); }

LOOM__AMP_KERNELS(loom__amp_kernels_scalar);
