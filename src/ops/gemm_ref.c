/* gemm_ref.c: the scalar reference of loom__gemm, for the tests. Plain loops: each element
 * of C is an f32 sum over k in order of the f32 values of A and B, then alpha * sum + bias +
 * beta * C, rounded once to C's dtype. */
#include "ops/gemm_int.h"

int loom__gemm_ref(const loom__gemm_args *g) {
  int rc = loom__gemm_check(g, "loom__gemm_ref");
  if (rc != LOOM_OK || loom__dry()) return rc;
  for (int64_t p = 0; p < g->batch; p++) {
    size_t a0 = (size_t)(p * g->stride_a), b0 = (size_t)(p * g->stride_b);
    size_t c0 = (size_t)(p * g->stride_c);
    if (g->batch == 1) a0 = b0 = c0 = 0;
    for (int64_t i = 0; i < g->M; i++)
      for (int64_t j = 0; j < g->N; j++) {
        float acc = 0.0f;
        for (int64_t k = 0; k < g->K; k++) {
          size_t ai = a0 + (size_t)(g->trans_a ? k * g->lda + i : i * g->lda + k);
          size_t bi = b0 + (size_t)(g->trans_b ? j * g->ldb + k : k * g->ldb + j);
          acc += (float)loom__load_f64(g->A, g->ab_dtype, ai) *
                 (float)loom__load_f64(g->B, g->ab_dtype, bi);
        }
        size_t ci = c0 + (size_t)(i * g->ldc + j);
        float out = g->alpha * acc;
        if (g->bias) out += g->bias[j];
        if (g->beta != 0.0f) out += g->beta * (float)loom__load_f64(g->C, g->c_dtype, ci);
        loom__store_f64(g->C, g->c_dtype, ci, out);
      }
  }
  return LOOM_OK;
}
