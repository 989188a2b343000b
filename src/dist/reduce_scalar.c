/* reduce_scalar.c: the combine kernels for plain x86-64 (the reference every other level must
 * reproduce bit for bit): the generic loops of reduce_int.h, compiled without ISA flags. */
#include "dist/reduce_int.h"

LOOM__COMBINE_TABLE(loom__reduce_kernels_scalar, sum_f32);
