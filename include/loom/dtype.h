/* loom/dtype.h: element types and the conversion kernels between f32, f16 and bf16.
 *
 * f16 is IEEE 754 binary16; bf16 is the top half of an f32. Narrowing conversions round to
 * nearest, ties to even, keep subnormals, send f16 overflow to +-inf, and turn a NaN into a
 * quiet NaN of the same sign. Widening conversions are exact. The kernels are chosen once from
 * the CPU's features (see loom/cpu.h); every level gives the same bits as the scalar
 * reference. All conversion functions are thread-safe; src and dst must not overlap. */
#ifndef LOOM_DTYPE_H
#define LOOM_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* name, element size in bytes, is floating point */
#define LOOM_DTYPE_MAP(XX)                                                                    \
  XX(F32, "f32", 4, true)                                                                     \
  XX(F16, "f16", 2, true)                                                                     \
  XX(BF16, "bf16", 2, true)                                                                   \
  XX(I32, "i32", 4, false)                                                                    \
  XX(I64, "i64", 8, false)

typedef enum loom_dtype {
#define LOOM__DTYPE_ENUM(name, str, size, is_float) LOOM_##name,
  LOOM_DTYPE_MAP(LOOM__DTYPE_ENUM)
#undef LOOM__DTYPE_ENUM
  LOOM_DTYPE_COUNT
} loom_dtype;

/* Element size in bytes; 0 for a value that is not a dtype. */
size_t loom_dtype_size(loom_dtype dt);
/* "f32", "f16", "bf16", "i32", "i64"; "?" for a value that is not a dtype. */
const char *loom_dtype_name(loom_dtype dt);
/* True for f32, f16 and bf16. */
bool loom_dtype_is_float(loom_dtype dt);
/* True if dt is one of the dtypes above. */
bool loom_dtype_valid(loom_dtype dt);
/* Parse a name as loom_dtype_name prints it (also "float32", "float16", "bfloat16").
 * LOOM_EINVAL with a message for an unknown name. */
int loom_dtype_parse(const char *name, loom_dtype *out);

/* Array conversions (n elements). */
void loom_cvt_f32_to_bf16(const float *src, uint16_t *dst, size_t n);
void loom_cvt_bf16_to_f32(const uint16_t *src, float *dst, size_t n);
void loom_cvt_f32_to_f16(const float *src, uint16_t *dst, size_t n);
void loom_cvt_f16_to_f32(const uint16_t *src, float *dst, size_t n);

/* One value, scalar reference semantics (the same bits as the array kernels). */
uint16_t loom_f32_to_bf16(float x);
float loom_bf16_to_f32(uint16_t h);
uint16_t loom_f32_to_f16(float x);
float loom_f16_to_f32(uint16_t h);

/* Convert n elements between any two dtypes (integers convert through double with C's
 * conversion rules; float to integer truncates toward zero and saturates). LOOM_EDTYPE for
 * a dtype that is not valid. src and dst must not overlap unless src == dst and sizes match.
 * Long conversions between f32 and f16 / bf16 split over the calling thread's OpenMP team
 * (loom_set_num_threads), with the same values as on one thread. */
int loom_convert(const void *src, loom_dtype src_dt, void *dst, loom_dtype dst_dt, size_t n);

#ifdef __cplusplus
}
#endif
#endif
