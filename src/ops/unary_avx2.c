/* unary_avx2.c: the unary kernels' table of the avx2 level, loom__unary_kernels_avx2
 * (unary_body.h), built with -mavx2 -mfma -mf16c -O3 (vectorized for AVX2; -fno-trapping-math
 * lets the tanh branches become blends) (CMakeLists.txt). */
#include "ops/unary_int.h"

#include <math.h>
#include <string.h>

#define UNARY_SFX avx2
#include "ops/unary_body.h"
