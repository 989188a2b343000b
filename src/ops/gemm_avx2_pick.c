/* gemm_avx2_pick.c: when loom__gemm runs 16-bit operands on loom's own AVX2 GEMM
 * (gemm_avx2.h has the rule). Plain C: it runs on every CPU, the kernel only where it says. */
#include "ops/gemm_avx2.h"
#include "ops/gemm_int.h"

#include <pthread.h>
#include <stdlib.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool usable; /* the rule's parts that do not depend on the call */

static void probe(void) {
  const char *e = getenv("LOOM_GEMM_AVX2");
  if (e && !strcmp(e, "off")) return;
  if (loom_cpu_level_active() < LOOM_CPU_AVX2) return;
  dnnl_engine_t eng;
  (void)loom__dnnl_engine("loom__gemm_avx2_wanted", &eng); /* applies loom's ISA cap first */
  unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(), z = (unsigned)dnnl_cpu_isa_avx512_core;
  usable = (isa & z) != z;
}

bool loom__gemm_avx2_wanted(const loom__gemm_args *g) {
  if (g->ab_dtype != LOOM_BF16 && g->ab_dtype != LOOM_F16) return false;
  pthread_once(&once, probe);
  return usable;
}
