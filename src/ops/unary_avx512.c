/* unary_avx512.c: the unary kernels' table of the avx512 level, loom__unary_kernels_avx512
 * (unary_body.h), built with -mavx512f -mavx512bw -mavx512vl -mavx2 -mfma -mf16c -O3
 * (vectorized for AVX-512; -fno-trapping-math lets the tanh branches become blends)
 * (CMakeLists.txt). */
#include "ops/unary_int.h"

#include <math.h>
#include <string.h>

#define UNARY_SFX avx512
#include "ops/unary_body.h"
