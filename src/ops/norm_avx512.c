/* norm_avx512.c: layer norm's loops at the avx512 level, loom__norm_kernels_avx512 (norm_body.h),
 * built with -mavx512f -mavx2 -mfma -O3 (vectorized for AVX-512) (CMakeLists.txt). */
#include "ops/norm_int.h"

#include <math.h>

#define NORM_SFX avx512
#include "ops/norm_body.h"
