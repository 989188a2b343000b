/* kernels_dispatch.c: the optim layer's kernel table for each CPU level, picked by the core's
 * active level (loom_cpu_level_active), with entries a level lacks taken from scalar. */
#include "optim/optim_int.h"

#include <pthread.h>

static loom__optim_kernels tables[LOOM_CPU_LEVEL_COUNT];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static loom__optim_kernels merged(const loom__optim_kernels *t) {
  loom__optim_kernels m = *t;
  const loom__optim_kernels *s = &loom__optim_kernels_scalar;
  if (!m.adam) m.adam = s->adam;
  if (!m.sgd) m.sgd = s->sgd;
  if (!m.sumsq) m.sumsq = s->sumsq;
  if (!m.scale) m.scale = s->scale;
  return m;
}

static void init(void) {
  tables[LOOM_CPU_SCALAR] = merged(&loom__optim_kernels_scalar);
  tables[LOOM_CPU_AVX2] = merged(&loom__optim_kernels_avx2);
  tables[LOOM_CPU_AVX512] = merged(&loom__optim_kernels_avx512);
}

const loom__optim_kernels *loom__optim_k_level(loom_cpu_level level) {
  pthread_once(&once, init);
  if ((unsigned)level >= LOOM_CPU_LEVEL_COUNT || !loom_cpu_supports(level))
    return &tables[LOOM_CPU_SCALAR];
  return &tables[level];
}

const loom__optim_kernels *loom__optim_k(void) {
  return loom__optim_k_level(loom_cpu_level_active());
}
