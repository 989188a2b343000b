/* norm.c: layer normalisation over the last dims, forward and backward (llm.c's
 * layernorm_forward/backward in f32), with optional elementwise weight and bias. Forward
 * saves each row's mean and 1/std for backward. The loops are per CPU level (norm_int.h). */
#include "ops/gemm.h"
#include "ops/norm_int.h"
#include "ops/ops_int.h"

#include <string.h>

/* Rows (forward, dx) in blocks of ROWS and dw, db in blocks of COLS columns run over the GEMM's
 * thread count (loom_set_num_threads) once a tensor has PAR_MIN elements; a row's or a
 * column's values do not depend on the split. */
enum { ROWS = 16, COLS = 64, PAR_MIN = 1 << 15 };

static int threads(int64_t n) { return n >= PAR_MIN ? loom__gemm_threads() : 1; }

static int ln_backward(loom__node *n, loom_tensor *g, loom_tensor **gin) {
  int rc = LOOM_OK;
  loom__fbuf fx = {0}, fw = {0};
  const float *stats = loom__f(n->saved[3]); /* mean, rstd per row */
  int64_t C = n->i[0], R = n->i[1];
  LOOM_TRY(loom__f32_in(n->saved[0], &fx));
  if (n->saved[1]) LOOM_TRY(loom__f32_in(n->saved[1], &fw));
  for (int k = 0; k < 3; k++)
    if (k < n->n_in && loom__node_needs(n, k))
      LOOM_TRY(loom__grad_new(n->in[k].ndim, n->in[k].shape, k > 0, &gin[k]));
  float *dx = gin[0] ? loom__f(gin[0]) : NULL, *dw = gin[1] ? loom__f(gin[1]) : NULL;
  float *db = n->n_in > 2 && gin[2] ? loom__f(gin[2]) : NULL;
  if (!loom__dry()) { /* a dry run (loom/alloc.h): every buffer made, nothing computed */
    const loom__norm_kernels *k = loom__norm_k();
    const float *gp = loom__f(g);
    int64_t blocks = (R + ROWS - 1) / ROWS, cols = (C + COLS - 1) / COLS;
    int t = threads(R * C);
    (void)t; /* unused without OpenMP */
    if (dx) {
#pragma omp parallel for num_threads(t) if (t > 1 && blocks > 1)
      for (int64_t bl = 0; bl < blocks; bl++)
        k->bwd_dx(dx, gp, fx.p, fw.p, stats, (size_t)(bl * ROWS),
                  (size_t)(bl * ROWS + ROWS < R ? bl * ROWS + ROWS : R), (size_t)C);
    }
    if (dw || db) {
#pragma omp parallel for num_threads(t) if (t > 1 && cols > 1)
      for (int64_t cl = 0; cl < cols; cl++)
        k->bwd_dwb(dw, db, gp, fx.p, stats, (size_t)R, (size_t)C, (size_t)(cl * COLS),
                   (size_t)(cl * COLS + COLS < C ? cl * COLS + COLS : C));
    }
  }
done:
  loom__fbuf_free(&fx);
  loom__fbuf_free(&fw);
  return rc;
}

int loom_layer_norm(loom_tensor *x, int normalized_ndim, loom_tensor *w, loom_tensor *b,
                    double eps, loom_tensor **out) {
  static const char *name = "layer_norm";
  int rc = loom__check_out(name, out);
  if (rc) return rc;
  if ((rc = loom__check_float(name, x, "x")) || (w && (rc = loom__check_float(name, w, "w"))) ||
      (b && (rc = loom__check_float(name, b, "b"))))
    return rc;
  if (normalized_ndim < 1 || normalized_ndim > x->ndim)
    return loom__fail(LOOM_EINVAL, "%s: normalized_ndim %d out of range for a tensor of rank %d",
                      name, normalized_ndim, x->ndim);
  if (!(eps >= 0)) return loom__fail(LOOM_EINVAL, "%s: eps %g must be >= 0", name, eps);
  const int64_t *ns = x->shape + x->ndim - normalized_ndim;
  char s1[96], s2[96];
  const loom_tensor *wb[2] = {w, b};
  for (int k = 0; k < 2; k++)
    if (wb[k] && (wb[k]->ndim != normalized_ndim ||
                  memcmp(wb[k]->shape, ns, (size_t)normalized_ndim * sizeof *ns)))
      return loom__fail(LOOM_ESHAPE, "%s: %s has shape %s, the normalized dims are %s", name,
                        k ? "bias" : "weight",
                        loom__shape_str(wb[k]->ndim, wb[k]->shape, s1, sizeof s1),
                        loom__shape_str(normalized_ndim, ns, s2, sizeof s2));
  loom__op c;
  loom_tensor *in[3] = {x, w, b}, *y = NULL, *stats = NULL;
  loom__fbuf fx = {0}, fw = {0}, fb = {0}, fy = {0};
  loom__node *nd = NULL;
  if ((rc = loom__op_begin(&c, LOOM_OPK_LAYER_NORM, in, 3))) return rc;
  x = c.in[0];
  w = c.in[1];
  b = c.in[2];
  if (w) LOOM_TRY(loom__check_same_dtype(name, x, w));
  if (b) LOOM_TRY(loom__check_same_dtype(name, x, b));
  int64_t C = 1, R = 1;
  for (int i = 0; i < x->ndim; i++) *(i < x->ndim - normalized_ndim ? &R : &C) *= x->shape[i];
  int64_t sshape[2] = {R, 2};
  LOOM_TRY(loom_tensor_empty(LOOM_F32, 2, sshape, &stats));
  LOOM_TRY(loom__f32_in(x, &fx));
  if (w) LOOM_TRY(loom__f32_in(w, &fw));
  if (b) LOOM_TRY(loom__f32_in(b, &fb));
  LOOM_TRY(loom__f32_out(x->dtype, x->ndim, x->shape, &y, &fy));
  if (!loom__dry()) {
    const loom__norm_kernels *k = loom__norm_k();
    float *st = loom__f(stats);
    int64_t blocks = (R + ROWS - 1) / ROWS;
    int t = threads(R * C);
    (void)t; /* unused without OpenMP */
#pragma omp parallel for num_threads(t) if (t > 1 && blocks > 1)
    for (int64_t bl = 0; bl < blocks; bl++)
      k->fwd(fy.p, st, fx.p, fw.p, fb.p, (size_t)(bl * ROWS),
             (size_t)(bl * ROWS + ROWS < R ? bl * ROWS + ROWS : R), (size_t)C, (float)eps);
  }
  loom__f32_out_commit(y, &fy);
  LOOM_TRY(loom__op_record(&c, y, ln_backward, &nd));
  if (nd) {
    nd->i[0] = C;
    nd->i[1] = R;
    LOOM_TRY(loom__node_save(nd, 0, x));
    LOOM_TRY(loom__node_save(nd, 1, w));
    nd->saved[3] = stats;
    stats = NULL;
  }
done:
  loom__fbuf_free(&fx);
  loom__fbuf_free(&fw);
  loom__fbuf_free(&fb);
  loom__fbuf_free(&fy);
  loom_tensor_free(stats);
  return loom__op_finish(&c, rc, y, out);
}
