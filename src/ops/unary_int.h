/* unary_int.h: the elementwise unary functions shared by unary.c (the ops) and
 * unary_kernels.c (the math, one table per CPU level, each level checked against scalar). */
#ifndef LOOM_OPS_UNARY_INT_H
#define LOOM_OPS_UNARY_INT_H

#include "core/core_int.h"
#include "loom/cpu.h"
#include "loom/ops.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum loom__unary {
  LOOM__U_NEG,
  LOOM__U_RELU,
  LOOM__U_GELU,
  LOOM__U_GELU_TANH,
  LOOM__U_TANH,
  LOOM__U_SIGMOID,
  LOOM__U_EXP,
  LOOM__U_LOG,
  LOOM__U_SQRT,
  LOOM__U_POW,
  LOOM__U_ADD_SCALAR,
  LOOM__U_MUL_SCALAR,
  LOOM__U_DIV_SCALAR,
  LOOM__U_COUNT
} loom__unary;

typedef struct loom__unary_def {
  const char *name;
  loom_op_kind kind;
  bool saves_x, saves_y; /* what backward reads */
} loom__unary_def;

const loom__unary_def *loom__unary_def_get(loom__unary u);

/* y = f(x; p) over n elements; gx = g * f'(x; p) (x or y may be NULL if the def says the
 * function does not save it). */
typedef void (*loom__unary_fwd_fn)(float *y, const float *x, size_t n, float p);
typedef void (*loom__unary_bwd_fn)(float *gx, const float *g, const float *x, const float *y,
                                   size_t n, double p);

/* relu straight on f16/bf16 bits (exact, so no f32 staging): y = x where x > 0, else +0;
 * gx (f32) = g where the saved output y > 0, else 0. `inf` is the dtype's +inf bits (0x7c00
 * f16, 0x7f80 bf16): above it are NaNs, which relu maps to 0 as the f32 kernel does. */
typedef void (*loom__relu16_fn)(uint16_t *y, const uint16_t *x, size_t n, uint16_t inf);
typedef void (*loom__relu16_bwd_fn)(float *gx, const float *g, const uint16_t *y, size_t n,
                                    uint16_t inf);

/* GELU (tanh form) straight on contiguous bf16 x, widened and rounded in registers: y (bf16) =
 * gelu(x); gx (f32) = g * gelu'(x). The same values as staging x through f32 and running the
 * table's f32 kernels (tests/ops/test_unary_levels.c checks it bit for bit). */
typedef void (*loom__gelu_bf16_fn)(uint16_t *y, const uint16_t *x, size_t n);
typedef void (*loom__gelu_bf16_bwd_fn)(float *gx, const float *g, const uint16_t *x, size_t n);

typedef struct loom__unary_kernels_t {
  loom__unary_fwd_fn fwd[LOOM__U_COUNT];
  loom__unary_bwd_fn bwd[LOOM__U_COUNT];
  loom__relu16_fn relu16;
  loom__relu16_bwd_fn relu16_bwd;
  loom__gelu_bf16_fn gelu_tanh_bf16;
  loom__gelu_bf16_bwd_fn gelu_tanh_bf16_bwd;
} loom__unary_kernels_t;

/* One table per level (unary_scalar.c, unary_avx2.c, unary_avx512.c: unary_body.h compiled
 * three times), and the table for the active CPU level, and for a given level (tests; scalar
 * for a level the CPU lacks). */
LOOM__KERNEL_TABLES(loom__unary_kernels_t, loom__unary_kernels, loom__unary_kernels_level,
                    loom__unary_kernels);

/* The unary op u with parameter p (the public functions call this). */
int loom__unary_op(loom__unary u, loom_tensor *x, double p, loom_tensor **out);

#endif
