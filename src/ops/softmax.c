/* softmax.c: softmax and log_softmax along one dim, forward and backward, in f32 with the
 * max subtracted first. The tensor is seen as [outer, D, inner]; rows along D are strided by
 * inner. Backward uses the saved output. */
#include "ops/ops_int.h"

#include <math.h>

static void split(int ndim, const int64_t *shape, int d, int64_t *outer, int64_t *D,
                  int64_t *inner) {
  *outer = *inner = 1;
  for (int i = 0; i < d; i++) *outer *= shape[i];
  for (int i = d + 1; i < ndim; i++) *inner *= shape[i];
  *D = shape[d];
}

/* One row of D values at stride s. */
static void row_fwd(float *y, const float *x, int64_t D, int64_t s, bool log) {
  float m = -INFINITY;
  for (int64_t k = 0; k < D; k++) m = x[k * s] > m ? x[k * s] : m;
  float sum = 0;
  for (int64_t k = 0; k < D; k++) {
    float e = expf(x[k * s] - m);
    sum += e;
    if (!log) y[k * s] = e;
  }
  if (log) {
    float lse = m + logf(sum);
    for (int64_t k = 0; k < D; k++) y[k * s] = x[k * s] - lse;
  } else {
    float inv = 1.0f / sum;
    for (int64_t k = 0; k < D; k++) y[k * s] *= inv;
  }
}

static void row_bwd(float *gx, const float *g, const float *y, int64_t D, int64_t s, bool log) {
  float acc = 0;
  if (log) {
    for (int64_t k = 0; k < D; k++) acc += g[k * s];
    for (int64_t k = 0; k < D; k++) gx[k * s] = g[k * s] - expf(y[k * s]) * acc;
  } else {
    for (int64_t k = 0; k < D; k++) acc += g[k * s] * y[k * s];
    for (int64_t k = 0; k < D; k++) gx[k * s] = y[k * s] * (g[k * s] - acc);
  }
}

static int softmax_backward(loom__node *n, loom_tensor *g, loom_tensor **gin) {
  int rc = LOOM_OK;
  loom__fbuf fy = {0};
  bool log = n->kind == LOOM_OPK_LOG_SOFTMAX;
  int64_t outer, D, inner;
  split(n->out_ndim, n->out_shape, (int)n->i[0], &outer, &D, &inner);
  LOOM_TRY(loom__f32_in(n->saved[0], &fy));
  LOOM_TRY(loom__grad_new(n->in[0].ndim, n->in[0].shape, false, &gin[0]));
  float *gx = loom__f(gin[0]);
  const float *gp = loom__f(g);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < inner; j++) {
      size_t base = (size_t)(o * D * inner + j);
      row_bwd(gx + base, gp + base, fy.p + base, D, inner, log);
    }
done:
  loom__fbuf_free(&fy);
  return rc;
}

static int softmax_op(loom_op_kind kind, loom_tensor *x, int dim, loom_tensor **out) {
  const char *name = loom_op_kind_name(kind);
  int rc = loom__check_out(name, out);
  if (rc) return rc;
  if ((rc = loom__check_float(name, x, "x"))) return rc;
  int d;
  if ((rc = loom__norm_dim(name, dim, x->ndim, &d))) return rc;
  loom__op c;
  loom_tensor *y = NULL;
  loom__fbuf fx = {0}, fy = {0};
  loom__node *nd = NULL;
  if ((rc = loom__op_begin(&c, kind, &x, 1))) return rc;
  x = c.in[0];
  int64_t outer, D, inner;
  split(x->ndim, x->shape, d, &outer, &D, &inner);
  LOOM_TRY(loom__f32_in(x, &fx));
  LOOM_TRY(loom__f32_out(x->dtype, x->ndim, x->shape, &y, &fy));
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < inner; j++) {
      size_t base = (size_t)(o * D * inner + j);
      row_fwd(fy.p + base, fx.p + base, D, inner, kind == LOOM_OPK_LOG_SOFTMAX);
    }
  loom__f32_out_commit(y, &fy);
  LOOM_TRY(loom__op_record(&c, y, softmax_backward, &nd));
  if (nd) {
    nd->i[0] = d;
    LOOM_TRY(loom__node_save(nd, 0, y));
  }
done:
  loom__fbuf_free(&fx);
  loom__fbuf_free(&fy);
  return loom__op_finish(&c, rc, y, out);
}

int loom_softmax(loom_tensor *x, int dim, loom_tensor **out) {
  return softmax_op(LOOM_OPK_SOFTMAX, x, dim, out);
}

int loom_log_softmax(loom_tensor *x, int dim, loom_tensor **out) {
  return softmax_op(LOOM_OPK_LOG_SOFTMAX, x, dim, out);
}
