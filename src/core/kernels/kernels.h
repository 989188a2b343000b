/* kernels.h: the core kernel table and its dispatch levels (private to loom).
 *
 * Each level (scalar, avx2, avx512) defines one `loom__core_kernels` table; entries a level
 * does not have stay NULL and are filled from scalar when the table is picked. Call sites go
 * through loom__k(): `loom__k()->cvt_f32_to_bf16(src, dst, n)`. Layers above core keep their
 * own tables indexed by loom_cpu_level_active(). Only dispatch.c tests the CPU. */
#ifndef LOOM_CORE_KERNELS_H
#define LOOM_CORE_KERNELS_H

#include "core/core_int.h"

#include <stdint.h>

typedef struct loom__core_kernels {
  void (*cvt_f32_to_bf16)(const float *src, uint16_t *dst, size_t n);
  void (*cvt_bf16_to_f32)(const uint16_t *src, float *dst, size_t n);
  void (*cvt_f32_to_f16)(const float *src, uint16_t *dst, size_t n);
  void (*cvt_f16_to_f32)(const uint16_t *src, float *dst, size_t n);
  /* CRC-32C of data[0..n) continuing from crc (0 to start): crc32c(crc32c(0, a), b) is the
   * CRC of a followed by b. */
  uint32_t (*crc32c)(uint32_t crc, const void *data, size_t n);
} loom__core_kernels;

extern const loom__core_kernels loom__core_kernels_scalar;
extern const loom__core_kernels loom__core_kernels_avx2;
extern const loom__core_kernels loom__core_kernels_avx512;
/* The avx512 f32->bf16 kernel that uses VCVTNEPS2BF16 (needs AVX512-BF16); dispatch.c puts
 * it in the table only on CPUs that have the instruction. */
void loom__cvt_f32_to_bf16_avx512bf16(const float *src, uint16_t *dst, size_t n);

/* CRC-32C: portable (crc32c_scalar.c, the reference) and with SSE4.2 (crc32c_sse42.c). */
uint32_t loom__crc32c_scalar(uint32_t crc, const void *data, size_t n);
uint32_t loom__crc32c_sse42(uint32_t crc, const void *data, size_t n);

/* The active table (picked on first call). */
const loom__core_kernels *loom__k(void);

/* Scalar references, one value each (cvt_scalar.c). */
uint16_t loom__ref_f32_to_bf16(uint32_t bits);
uint32_t loom__ref_bf16_to_f32(uint16_t h);
uint16_t loom__ref_f32_to_f16(uint32_t bits);
uint32_t loom__ref_f16_to_f32(uint16_t h);

/* Size above which conversion kernels use non-temporal stores (bytes written); below it the
 * output is likely to be read again soon and should stay in cache. */
#define LOOM__STREAM_BYTES ((size_t)4 << 20)

#endif
