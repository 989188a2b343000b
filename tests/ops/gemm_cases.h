/* gemm_cases.h: the GEMM test cases of test_gemm.c, shared with the tests of the other GEMM
 * kernels (test_gemm_amx.c): one case against loom__gemm_ref within the f32 summation bound
 * (test_gemm.c's header comment), and the sweep of shapes x transposes x pad / alpha / beta. */
#ifndef LOOM_TESTS_OPS_GEMM_CASES_H
#define LOOM_TESTS_OPS_GEMM_CASES_H

#include "ops/gemm.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct shape {
  int64_t batch, M, N, K;
  bool ta, tb;
  int64_t pad; /* added to every leading dimension */
  bool bcast_a, bcast_b;
  float alpha, beta;
  bool bias; /* an f32 bias row (alpha must be 1) */
} shape;

typedef int (*gemm_fn)(const loom__gemm_args *);

/* Runs one case through `kernel` (loom__gemm, or another with its contract); returns the number
 * of elements out of tolerance (and reports the first). */
int check_with(gemm_fn kernel, shape s, loom_dtype ab, loom_dtype cdt);
/* Every shape of sizes[0..n) ({M, N, K}) with every transpose, cycling through pad / alpha /
 * beta; sweep_with: over test_gemm.c's list of shapes. */
void sweep_dims(gemm_fn kernel, const int64_t (*sizes)[3], int n, loom_dtype ab, loom_dtype cdt);
void sweep_with(gemm_fn kernel, loom_dtype ab, loom_dtype cdt);
/* Every (operands, C) dtype pair a kernel takes: bf16 and f16 with an f32 or 16-bit C, f32. */
#define GEMM_DTYPE_PAIRS 5
extern const loom_dtype gemm_dtype_pairs[GEMM_DTYPE_PAIRS][2];
/* A packed kernel (loom's AVX2 and AVX-512 GEMMs) on shapes past each of its blocks, every dtype
 * pair: K over the piece (KC) and over an f32 C's B block, M over the row block with a ragged
 * sliver, N over NC and, for a 16-bit C with a long K, over its narrower B block, each
 * transpose; and two OpenMP threads. */
void check_packed_blocks(gemm_fn kernel);
/* A kernel's rounding of a bf16 and an f16 C (M x 45, from a zero product plus a bias of ties,
 * NaN, inf, subnormals, values past f16's range) bit for bit against loom_convert's. */
void check_c_rounding(gemm_fn kernel, int64_t M);
/* A kernel's errors: NULL arguments, short leading dimensions, beta, dtypes; messages name
 * `who` or the argument. */
void check_kernel_errors(gemm_fn kernel, const char *who);

#endif
