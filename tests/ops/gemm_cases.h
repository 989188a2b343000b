/* gemm_cases.h: the GEMM cases of test_gemm.c, shared with the tests of the other loom__gemm
 * paths (test_gemm_avx2.c): one case run through a kernel against loom__gemm_ref with the
 * f32 summation bound as tolerance (test_gemm.c's header explains it), and the sweep of shapes,
 * transposes, pads, alphas and betas. */
#ifndef LOOM_TEST_GEMM_CASES_H
#define LOOM_TEST_GEMM_CASES_H

#include "ops/gemm.h"

typedef struct shape {
  int64_t batch, M, N, K;
  bool ta, tb;
  int64_t pad; /* added to every leading dimension */
  bool bcast_a, bcast_b;
  float alpha, beta;
  bool bias; /* an f32 bias row (alpha must be 1) */
} shape;

typedef int (*gemm_fn)(const loom__gemm_args *);

/* The number of C's elements out of tolerance (the first reported as a test failure). */
int check_with(gemm_fn kernel, shape s, loom_dtype ab, loom_dtype cdt);
/* Every shape of the sweep with every transpose, through `kernel`. */
void sweep_with(gemm_fn kernel, loom_dtype ab, loom_dtype cdt);

#endif
