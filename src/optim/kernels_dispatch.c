/* kernels_dispatch.c: the optim layer's kernel table for each CPU level (core_int.h's
 * kernel-table pattern): the given level's, or the core's active level's. */
#include "optim/optim_int.h"

LOOM__KERNEL_PICKERS(loom__optim_kernels, loom__optim_kernels, loom__optim_k_level, loom__optim_k)
