/* unary_kernels.c: the unary ops' definitions and the pick of their kernel table by CPU level.
 * The loops (unary_body.h) are compiled three times: plain (unary_scalar.c, the scalar
 * reference, never vectorized), and with the AVX2 and AVX-512 instruction sets and the
 * vectorizer on (unary_avx2.c, unary_avx512.c). Only the table matching
 * loom_cpu_level_active() is used; tests compare every level with scalar. */
#include "ops/unary_int.h"

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

LOOM__KERNEL_PICKERS(loom__unary_kernels_t, loom__unary_kernels, loom__unary_kernels_level,
                     loom__unary_kernels)
