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

uint32_t loom__absmax32_scalar(const uint32_t *x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t v = x[i] & 0x7fffffffu;
    m = v > m ? v : m;
  }
  return m;
}

uint32_t loom__absmax16_scalar(const uint16_t *x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t v = x[i] & 0x7fffu;
    m = v > m ? v : m;
  }
  return m;
}

const loom__absmax_kernels loom__absmax_kernels_scalar = {loom__absmax32_scalar,
                                                          loom__absmax16_scalar};

double loom__absmax_level(const void *p, loom_dtype dt, size_t n, loom_cpu_level level) {
  static const loom__absmax_kernels *const tables[LOOM_CPU_LEVEL_COUNT] = {
      &loom__absmax_kernels_scalar, &loom__absmax_kernels_avx2, &loom__absmax_kernels_avx512};
  const loom__absmax_kernels *k = tables[loom__kernel_level(level)];
  if (dt == LOOM_F32) return of_bits32(k->max32(p, n));
  return of_bits16(k->max16(p, n), dt);
}

double loom__absmax(const void *p, loom_dtype dt, size_t n) {
  return loom__absmax_level(p, dt, n, loom_cpu_level_active());
}
