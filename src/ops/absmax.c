/* absmax.c: the largest magnitude in a buffer of f32, f16 or bf16, or INFINITY if it holds an
 * inf or NaN: what linear's backward reads to bound the weight gradient it writes
 * (loom_tensor_grad_bound). Works on the bits: with the sign cleared, every NaN compares
 * above inf and inf above every finite value, so one unsigned maximum answers both. The scalar
 * reference is here; the AVX2 and AVX-512 loops are absmax_avx2.c and absmax_avx512.c, one
 * table per level picked as core_int.h's kernel-table pattern says. */
#include "ops/ops_int.h"

#include <math.h>
#include <string.h>

/* The bits' magnitude as a value (finite) or INFINITY (inf, NaN). */
static double of_bits32(uint32_t m) {
  if (m >= 0x7f800000u) return INFINITY;
  float f;
  memcpy(&f, &m, sizeof f);
  return f;
}

static double of_bits16(uint32_t m, loom_dtype dt) {
  if (dt == LOOM_BF16) return of_bits32(m << 16);
  if (m >= 0x7c00u) return INFINITY;
  uint16_t h = (uint16_t)m;
  float f;
  loom_cvt_f16_to_f32(&h, &f, 1);
  return f;
}

/* The largest sign-cleared element: one loop, for 32-bit (w32) or 16-bit elements. */
static inline uint32_t max_scalar(const void *x, size_t n, bool w32) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t v = w32 ? ((const uint32_t *)x)[i] & 0x7fffffffu : ((const uint16_t *)x)[i] & 0x7fffu;
    m = v > m ? v : m;
  }
  return m;
}

uint32_t loom__absmax32_scalar(const uint32_t *x, size_t n) { return max_scalar(x, n, true); }
uint32_t loom__absmax16_scalar(const uint16_t *x, size_t n) { return max_scalar(x, n, false); }

const loom__absmax_kernels loom__absmax_kernels_scalar = {loom__absmax32_scalar,
                                                          loom__absmax16_scalar};

LOOM__KERNEL_PICKERS(loom__absmax_kernels, loom__absmax_kernels, loom__absmax_kernels_for,
                     loom__absmax_k)

static double absmax(const loom__absmax_kernels *k, const void *p, loom_dtype dt, size_t n) {
  if (dt == LOOM_F32) return of_bits32(k->max32(p, n));
  return of_bits16(k->max16(p, n), dt);
}

double loom__absmax_level(const void *p, loom_dtype dt, size_t n, loom_cpu_level level) {
  return absmax(loom__absmax_kernels_for(level), p, dt, n);
}

double loom__absmax(const void *p, loom_dtype dt, size_t n) {
  return loom__dry() ? 0 : absmax(loom__absmax_k(), p, dt, n);
}
