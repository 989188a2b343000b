/* kernels_dispatch.c: the optim layer's kernel table for each CPU level (core_int.h's
 * kernel-table pattern): the given level's, or the core's active level's. */
#include "optim/optim_int.h"

const loom__optim_kernels *loom__optim_k_level(loom_cpu_level level) {
  static const loom__optim_kernels *const tables[LOOM_CPU_LEVEL_COUNT] = {
      &loom__optim_kernels_scalar, &loom__optim_kernels_avx2, &loom__optim_kernels_avx512};
  return tables[loom__kernel_level(level)];
}

const loom__optim_kernels *loom__optim_k(void) {
  return loom__optim_k_level(loom_cpu_level_active());
}
