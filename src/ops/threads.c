/* threads.c: the public thread-count setting of the compute ops (loom_set_num_threads), a thin
 * front of the GEMM layer's per-thread setting. */
#include "loom/ops.h"
#include "ops/gemm.h"

void loom_set_num_threads(int n) { loom__gemm_set_threads(n); }
