/* gemm_avx2_pick.c: when loom__gemm runs 16-bit operands on loom's own AVX2 GEMM (gemm_avx2.h
 * has the rule) or AVX-512 GEMM (gemm_avx512.h). Plain C: it runs on every CPU, the kernels
 * only where it says. */
#include "ops/gemm_avx2.h"
#include "ops/gemm_avx512.h"
#include "ops/gemm_int.h"

#include <pthread.h>
#include <stdlib.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool usable, usable512; /* the rules' parts that do not depend on the call */

static bool off(const char *var) {
  const char *e = getenv(var);
  return e && !strcmp(e, "off");
}

static void probe(void) {
  loom_cpu_level level = loom_cpu_level_active();
  if (level < LOOM_CPU_AVX2) return;
  dnnl_engine_t eng;
  (void)loom__dnnl_engine("loom__gemm_avx2_wanted", &eng); /* applies loom's ISA cap first */
  unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(), z = (unsigned)dnnl_cpu_isa_avx512_core;
  bool dnnl512 = (isa & z) == z;
  usable = !dnnl512 && !off("LOOM_GEMM_AVX2");
  usable512 = dnnl512 && level >= LOOM_CPU_AVX512 && !off("LOOM_GEMM_AVX512");
}

bool loom__gemm_avx2_wanted(const loom__gemm_args *g) {
  if (g->ab_dtype != LOOM_BF16 && g->ab_dtype != LOOM_F16) return false;
  pthread_once(&once, probe);
  return usable;
}

bool loom__gemm_avx512_wanted(const loom__gemm_args *g) {
  if (g->ab_dtype != LOOM_BF16 && g->ab_dtype != LOOM_F16) return false;
  pthread_once(&once, probe);
  return usable512;
}
