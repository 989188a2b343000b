/* embedding.c: rows of a weight table picked by integer indices, forward and backward (the
 * backward scatter-adds gradient rows into a zeroed table, in f32). */
#include "ops/ops_int.h"

#include <string.h>

static int64_t index_at(const loom_tensor *idx, size_t i) {
  const char *base = (const char *)loom_tensor_data(idx);
  return idx->dtype == LOOM_I32 ? ((const int32_t *)base)[i] : ((const int64_t *)base)[i];
}

static int embedding_backward(loom__node *n, loom_tensor *g, loom_tensor **gin) {
  const loom_tensor *idx = n->saved[0];
  int64_t D = n->in[0].shape[1];
  int rc = loom__grad_new(2, n->in[0].shape, true, &gin[0]);
  if (rc) return rc;
  float *gw = loom__f(gin[0]);
  const float *gp = loom__f(g);
  size_t m = loom_tensor_numel(idx);
  for (size_t i = 0; i < m && !loom__dry(); i++) {
    float *row = gw + index_at(idx, i) * D;
    for (int64_t k = 0; k < D; k++) row[k] += gp[(int64_t)i * D + k];
  }
  return LOOM_OK;
}

int loom_embedding(loom_tensor *weight, loom_tensor *idx, loom_tensor **out) {
  static const char *name = "embedding";
  int rc = loom__check_out(name, out);
  if (rc) return rc;
  if ((rc = loom__check_float(name, weight, "weight")) || (rc = loom__check_in(name, idx, "idx")))
    return rc;
  if (idx->dtype != LOOM_I32 && idx->dtype != LOOM_I64)
    return loom__fail(LOOM_EDTYPE, "%s: idx must be i32 or i64, not %s", name,
                      loom_dtype_name(idx->dtype));
  char s1[96];
  if (weight->ndim != 2)
    return loom__fail(LOOM_ESHAPE, "%s: weight %s is not [num_embeddings, dim]", name,
                      loom__shape_str(weight->ndim, weight->shape, s1, sizeof s1));
  if (idx->ndim + 1 > LOOM_MAX_DIMS)
    return loom__fail(LOOM_ESHAPE, "%s: idx has too many dims (%d)", name, idx->ndim);
  loom__op c;
  loom_tensor *in[2] = {weight, NULL}, *ci = NULL, *cw = NULL, *y = NULL;
  loom__node *nd = NULL;
  if ((rc = loom__op_begin(&c, LOOM_OPK_EMBEDDING, in, 1))) return rc;
  weight = c.in[0];
  int64_t V = weight->shape[0], D = weight->shape[1];
  LOOM_TRY(loom_tensor_contiguous(idx, &ci));
  LOOM_TRY(loom_tensor_contiguous(weight, &cw));
  size_t m = loom_tensor_numel(ci), es = loom_dtype_size(weight->dtype);
  for (size_t i = 0; i < m; i++) {
    int64_t v = index_at(ci, i);
    if (v < 0 || v >= V) {
      rc = loom__fail(LOOM_EINVAL, "%s: index %lld at position %zu is outside [0, %lld)", name,
                      (long long)v, i, (long long)V);
      goto done;
    }
  }
  int64_t shape[LOOM_MAX_DIMS];
  memcpy(shape, idx->shape, (size_t)idx->ndim * sizeof *shape);
  shape[idx->ndim] = D;
  LOOM_TRY(loom_tensor_empty(weight->dtype, idx->ndim + 1, shape, &y));
  char *yp = loom_tensor_data(y);
  const char *wp = loom_tensor_data(cw);
  for (size_t i = 0; i < m && !loom__dry(); i++)
    memcpy(yp + i * (size_t)D * es, wp + (size_t)index_at(ci, i) * (size_t)D * es, (size_t)D * es);
  LOOM_TRY(loom__op_record(&c, y, embedding_backward, &nd));
  if (nd) LOOM_TRY(loom__node_save(nd, 0, ci));
done:
  loom_tensor_free(ci);
  loom_tensor_free(cw);
  return loom__op_finish(&c, rc, y, out);
}
