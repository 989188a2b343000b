/* norm_avx2.c: layer norm's loops at the avx2 level, loom__norm_kernels_avx2 (norm_body.h),
 * built with -mavx2 -mfma -O3 (vectorized for AVX2) (CMakeLists.txt). */
#include "ops/norm_int.h"

#include <math.h>

#define NORM_SFX avx2
#include "ops/norm_body.h"
