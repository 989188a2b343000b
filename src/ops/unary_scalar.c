/* unary_scalar.c: the unary kernels' table of the scalar level, loom__unary_kernels_scalar
 * (unary_body.h), the scalar reference: built with -fno-tree-vectorize, so never vectorized (CMakeLists.txt). */
#include "ops/unary_int.h"

#include <math.h>
#include <string.h>

#define UNARY_SFX scalar
#define UNARY_TANH(x) tanhf(x) /* the reference: libm */
#include "ops/unary_body.h"
