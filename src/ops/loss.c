/* loss.c: cross entropy (logits [N, C] against i32/i64 class labels, mean/sum/none, ignore
 * index) and mean squared error, forward and backward, computed in f32. Cross entropy's rows
 * (max, exp and sum) run on fused attention's per-level row kernels (attn_int.h: SIMD exp at
 * the SIMD levels), backward's rows over loom_set_num_threads' team. */
#include "ops/attn_int.h"
#include "ops/gemm.h"
#include "ops/ops_int.h"

#include <math.h>

static int check_reduction(const char *name, loom_reduction r) {
  if (r != LOOM_REDUCTION_MEAN && r != LOOM_REDUCTION_SUM && r != LOOM_REDUCTION_NONE)
    return loom__fail(LOOM_EINVAL, "%s: reduction %d is not MEAN, SUM or NONE", name, (int)r);
  return LOOM_OK;
}

static int64_t label_at(const loom_tensor *labels, int64_t i) {
  const char *base = (const char *)labels->storage->data;
  size_t off = labels->offset + (size_t)(i * labels->strides[0]);
  if (labels->dtype == LOOM_I32) return ((const int32_t *)base)[off];
  return ((const int64_t *)base)[off];
}

/* Per-row weight of the gradient: g is the output gradient. */
static float row_weight(const loom__node *n, const float *g, int64_t i, int64_t count) {
  loom_reduction r = (loom_reduction)n->i[0];
  if (r == LOOM_REDUCTION_NONE) return g[i];
  if (r == LOOM_REDUCTION_SUM) return g[0];
  return g[0] / (float)count;
}

/* A row's max (into *m) and sum of exp(x - m); the exps go into e (C floats), or with e NULL
 * into a scratch block of SCRATCH on the stack. */
enum { SCRATCH = 512, ROWS = 16 };
static float row_expsum(const loom__attn_kernels *k, const float *x, int64_t C, float *e,
                        float *m) {
  float buf[SCRATCH], sum = 0;
  *m = k->max(x, (size_t)C, -INFINITY);
  for (int64_t j = 0; j < C; j += SCRATCH) {
    size_t n = (size_t)(C - j < SCRATCH ? C - j : SCRATCH);
    sum += k->expsum(e ? e + j : buf, x + j, n, *m);
  }
  return sum;
}

static int ce_backward(loom__node *n, loom_tensor *g, loom_tensor **gin) {
  int rc = LOOM_OK;
  loom__fbuf fx = {0};
  const loom_tensor *labels = n->saved[1];
  int64_t N = n->in[0].shape[0], C = n->in[0].shape[1], ignore = n->i[1], count = n->i[2];
  LOOM_TRY(loom__f32_in(n->saved[0], &fx));
  LOOM_TRY(loom__grad_new(2, n->in[0].shape, false, &gin[0]));
  float *gx = loom__f(gin[0]);
  const loom__attn_kernels *k = loom__attn_k();
  int64_t blocks = loom__dry() ? 0 : (N + ROWS - 1) / ROWS;
  int t = N * C >= (1 << 15) ? loom__gemm_threads() : 1;
  (void)t; /* unused without OpenMP */
#pragma omp parallel for num_threads(t) if (t > 1 && blocks > 1)
  for (int64_t b = 0; b < blocks; b++)
    for (int64_t i = b * ROWS; i < N && i < b * ROWS + ROWS; i++) {
      const float *x = fx.p + i * C;
      float *d = gx + i * C;
      int64_t lab = label_at(labels, i);
      if (lab == ignore) {
        for (int64_t j = 0; j < C; j++) d[j] = 0;
        continue;
      }
      float w = row_weight(n, loom__f(g), i, count), m;
      float inv = w / row_expsum(k, x, C, d, &m);
      for (int64_t j = 0; j < C; j++) d[j] *= inv;
      d[lab] -= w;
    }
done:
  loom__fbuf_free(&fx);
  return rc;
}

int loom_cross_entropy(loom_tensor *logits, loom_tensor *labels, loom_reduction reduction,
                       int64_t ignore_index, loom_tensor **out) {
  static const char *name = "cross_entropy";
  int rc = loom__check_out(name, out);
  if (rc) return rc;
  if ((rc = loom__check_float(name, logits, "logits")) ||
      (rc = loom__check_in(name, labels, "labels")) || (rc = check_reduction(name, reduction)))
    return rc;
  if (labels->dtype != LOOM_I32 && labels->dtype != LOOM_I64)
    return loom__fail(LOOM_EDTYPE, "%s: labels must be i32 or i64, not %s", name,
                      loom_dtype_name(labels->dtype));
  char a[96], b[96];
  if (logits->ndim != 2 || labels->ndim != 1 || labels->shape[0] != logits->shape[0])
    return loom__fail(LOOM_ESHAPE, "%s: logits %s and labels %s are not [N, C] and [N]", name,
                      loom__shape_str(logits->ndim, logits->shape, a, sizeof a),
                      loom__shape_str(labels->ndim, labels->shape, b, sizeof b));
  int64_t N = logits->shape[0], C = logits->shape[1], count = 0;
  for (int64_t i = 0; i < N; i++) {
    int64_t lab = label_at(labels, i);
    if (lab == ignore_index) continue;
    if (lab < 0 || lab >= C)
      return loom__fail(LOOM_EINVAL, "%s: label %lld of row %lld is outside [0, %lld)", name,
                        (long long)lab, (long long)i, (long long)C);
    count++;
  }
  loom__op c;
  loom_tensor *y = NULL, *in[2] = {logits, NULL};
  loom__fbuf fx = {0}, fy = {0};
  loom__node *nd = NULL;
  if ((rc = loom__op_begin(&c, LOOM_OPK_CROSS_ENTROPY, in, 1))) return rc;
  logits = c.in[0];
  LOOM_TRY(loom__f32_in(logits, &fx));
  LOOM_TRY(loom__f32_out(logits->dtype, reduction == LOOM_REDUCTION_NONE ? 1 : 0, &N, &y, &fy));
  double total = 0;
  const loom__attn_kernels *k = loom__attn_k();
  for (int64_t i = 0; i < N && !loom__dry(); i++) {
    const float *x = fx.p + i * C;
    int64_t lab = label_at(labels, i);
    float l = 0;
    if (lab != ignore_index) {
      float m, sum = row_expsum(k, x, C, NULL, &m);
      l = m + logf(sum) - x[lab];
    }
    if (reduction == LOOM_REDUCTION_NONE) fy.p[i] = l;
    total += l;
  }
  if (reduction == LOOM_REDUCTION_SUM) fy.p[0] = (float)total;
  if (reduction == LOOM_REDUCTION_MEAN) fy.p[0] = count ? (float)(total / (double)count) : NAN;
  loom__f32_out_commit(y, &fy);
  LOOM_TRY(loom__op_record(&c, y, ce_backward, &nd));
  if (nd) {
    nd->i[0] = reduction;
    nd->i[1] = ignore_index;
    nd->i[2] = count;
    LOOM_TRY(loom__node_save(nd, 0, logits));
    LOOM_TRY(loom__node_save(nd, 1, labels));
  }
done:
  loom__fbuf_free(&fx);
  loom__fbuf_free(&fy);
  return loom__op_finish(&c, rc, y, out);
}

/* ---- mse ------------------------------------------------------------------------------ */

static int mse_backward(loom__node *n, loom_tensor *g, loom_tensor **gin) {
  int rc = LOOM_OK;
  loom__fbuf fa = {0}, fb = {0};
  const loom__edge *e = &n->in[0];
  size_t cnt = 1;
  for (int i = 0; i < e->ndim; i++) cnt *= (size_t)e->shape[i];
  LOOM_TRY(loom__f32_in(n->saved[0], &fa));
  LOOM_TRY(loom__f32_in(n->saved[1], &fb));
  for (int w = 0; w < 2; w++)
    if (loom__node_needs(n, w)) LOOM_TRY(loom__grad_new(e->ndim, e->shape, false, &gin[w]));
  const float *gp = loom__f(g);
  for (size_t i = 0; i < cnt; i++) {
    float wgt = row_weight(n, gp, (int64_t)i, (int64_t)cnt);
    float d = 2.0f * (fa.p[i] - fb.p[i]) * wgt;
    if (gin[0]) loom__f(gin[0])[i] = d;
    if (gin[1]) loom__f(gin[1])[i] = -d;
  }
done:
  loom__fbuf_free(&fa);
  loom__fbuf_free(&fb);
  return rc;
}

int loom_mse(loom_tensor *a, loom_tensor *b, loom_reduction reduction, loom_tensor **out) {
  static const char *name = "mse";
  int rc = loom__check_out(name, out);
  if (rc) return rc;
  if ((rc = loom__check_float(name, a, "a")) || (rc = loom__check_float(name, b, "b")) ||
      (rc = check_reduction(name, reduction)))
    return rc;
  if (!loom_tensor_same_shape(a, b)) {
    char x[96], y2[96];
    return loom__fail(LOOM_ESHAPE, "%s: shapes %s and %s differ", name,
                      loom__shape_str(a->ndim, a->shape, x, sizeof x),
                      loom__shape_str(b->ndim, b->shape, y2, sizeof y2));
  }
  loom__op c;
  loom_tensor *y = NULL, *in[2] = {a, b};
  loom__fbuf fa = {0}, fb = {0}, fy = {0};
  loom__node *nd = NULL;
  if ((rc = loom__op_begin(&c, LOOM_OPK_MSE, in, 2))) return rc;
  a = c.in[0];
  b = c.in[1];
  LOOM_TRY(loom__check_same_dtype(name, a, b));
  LOOM_TRY(loom__f32_in(a, &fa));
  LOOM_TRY(loom__f32_in(b, &fb));
  size_t cnt = loom_tensor_numel(a);
  if (reduction == LOOM_REDUCTION_NONE)
    LOOM_TRY(loom__f32_out(a->dtype, a->ndim, a->shape, &y, &fy));
  else
    LOOM_TRY(loom__f32_out(a->dtype, 0, NULL, &y, &fy));
  double total = 0;
  for (size_t i = 0; i < cnt; i++) {
    float d = fa.p[i] - fb.p[i];
    if (reduction == LOOM_REDUCTION_NONE) fy.p[i] = d * d;
    total += (double)(d * d);
  }
  if (reduction == LOOM_REDUCTION_SUM) fy.p[0] = (float)total;
  if (reduction == LOOM_REDUCTION_MEAN) fy.p[0] = cnt ? (float)(total / (double)cnt) : NAN;
  loom__f32_out_commit(y, &fy);
  LOOM_TRY(loom__op_record(&c, y, mse_backward, &nd));
  if (nd) {
    nd->i[0] = reduction;
    LOOM_TRY(loom__node_save(nd, 0, a));
    LOOM_TRY(loom__node_save(nd, 1, b));
  }
done:
  loom__fbuf_free(&fa);
  loom__fbuf_free(&fb);
  loom__fbuf_free(&fy);
  return loom__op_finish(&c, rc, y, out);
}
