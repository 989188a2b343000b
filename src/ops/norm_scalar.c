/* norm_scalar.c: layer norm's loops at the scalar level, loom__norm_kernels_scalar
 * (norm_body.h), the scalar reference: built with -fno-tree-vectorize, so never vectorized
 * (CMakeLists.txt). The level pickers live here. */
#include "ops/norm_int.h"

#include <math.h>

#define NORM_SFX scalar
#include "ops/norm_body.h"

LOOM__KERNEL_PICKERS(loom__norm_kernels, loom__norm_kernels, loom__norm_kernels_for,
                     loom__norm_k)
