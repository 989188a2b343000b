/* unary_kernels.c: the unary kernel tables, one per CPU level. The loops (unary_body.h) are
 * compiled three times: plain (the scalar reference, never vectorized), and with the AVX2 and
 * AVX-512 instruction sets and the vectorizer on. Only the table matching
 * loom_cpu_level_active() is used; tests compare every level with scalar. */
#include "ops/unary_int.h"

#include <math.h>

static const loom__unary_def defs[LOOM__U_COUNT] = {
    [LOOM__U_NEG] = {"neg", LOOM_OPK_NEG, false, false},
    [LOOM__U_RELU] = {"relu", LOOM_OPK_RELU, false, true},
    [LOOM__U_GELU] = {"gelu", LOOM_OPK_GELU, true, false},
    [LOOM__U_GELU_TANH] = {"gelu", LOOM_OPK_GELU, true, false},
    [LOOM__U_TANH] = {"tanh", LOOM_OPK_TANH, false, true},
    [LOOM__U_SIGMOID] = {"sigmoid", LOOM_OPK_SIGMOID, false, true},
    [LOOM__U_EXP] = {"exp", LOOM_OPK_EXP, false, true},
    [LOOM__U_LOG] = {"log", LOOM_OPK_LOG, true, false},
    [LOOM__U_SQRT] = {"sqrt", LOOM_OPK_SQRT, false, true},
    [LOOM__U_POW] = {"pow", LOOM_OPK_POW, true, false},
    [LOOM__U_ADD_SCALAR] = {"add_scalar", LOOM_OPK_ADD_SCALAR, false, false},
    [LOOM__U_MUL_SCALAR] = {"mul_scalar", LOOM_OPK_MUL_SCALAR, false, false},
    [LOOM__U_DIV_SCALAR] = {"div_scalar", LOOM_OPK_MUL_SCALAR, false, false},
};

const loom__unary_def *loom__unary_def_get(loom__unary u) { return &defs[u]; }

#pragma GCC push_options
#pragma GCC optimize("no-tree-vectorize")
#define UNARY_SFX scalar
#include "ops/unary_body.h"
#undef UNARY_SFX
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#pragma GCC optimize("O3")
#define UNARY_SFX avx2
#include "ops/unary_body.h"
#undef UNARY_SFX
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#pragma GCC optimize("O3")
#define UNARY_SFX avx512
#include "ops/unary_body.h"
#undef UNARY_SFX
#pragma GCC pop_options

const loom__unary_kernels_t *loom__unary_kernels_level(loom_cpu_level level) {
  switch (level) {
  case LOOM_CPU_AVX512: return &unary_table_avx512;
  case LOOM_CPU_AVX2: return &unary_table_avx2;
  default: return &unary_table_scalar;
  }
}

const loom__unary_kernels_t *loom__unary_kernels(void) {
  return loom__unary_kernels_level(loom_cpu_level_active());
}
