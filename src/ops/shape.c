/* shape.c: reshape, flatten, transpose and slice (views of the input when the strides allow,
 * as in core's tensor views) and cat / stack (copies), forward and backward. */
#include "ops/ops_int.h"

#include <limits.h>
#include <string.h>

/* ---- views ---------------------------------------------------------------------------- */

static int reshape_backward(loom__node *n, loom_tensor *g, loom_tensor **gin) {
  return loom_tensor_reshape(g, n->in[0].ndim, n->in[0].shape, &gin[0]);
}

static int transpose_backward(loom__node *n, loom_tensor *g, loom_tensor **gin) {
  loom_tensor *t = NULL;
  int rc = loom_tensor_transpose(g, (int)n->i[0], (int)n->i[1], &t);
  if (!rc) rc = loom_tensor_clone(t, &gin[0]);
  loom_tensor_free(t);
  return rc;
}

static int slice_backward(loom__node *n, loom_tensor *g, loom_tensor **gin) {
  loom_tensor *v = NULL;
  int rc = loom__grad_new(n->in[0].ndim, n->in[0].shape, true, &gin[0]);
  if (!rc) rc = loom_tensor_slice(gin[0], (int)n->i[0], n->i[1], n->i[2], n->i[3], &v);
  if (!rc) rc = loom_tensor_copy(v, g);
  loom_tensor_free(v);
  return rc;
}

/* Record a view op whose output y was made by core; on failure y is freed. */
static int view_finish(loom__op *c, loom_tensor *y, loom__backward_fn bwd, const int64_t *params,
                       int np, loom_tensor **out) {
  loom__node *nd = NULL;
  int rc = loom__op_record(c, y, bwd, &nd);
  if (rc) {
    loom_tensor_free(y);
  } else {
    if (nd && np) memcpy(nd->i, params, (size_t)np * sizeof *params);
    *out = y;
  }
  loom__op_end(c);
  return rc;
}

int loom_reshape(loom_tensor *x, int ndim, const int64_t *shape, loom_tensor **out) {
  int rc = loom__check_out("reshape", out);
  if (!rc) rc = loom__check_in("reshape", x, "x");
  if (rc) return rc;
  loom__op c;
  loom_tensor *y = NULL;
  if ((rc = loom__op_begin(&c, LOOM_OPK_RESHAPE, &x, 1))) return rc;
  if ((rc = loom_tensor_reshape(c.in[0], ndim, shape, &y))) {
    loom__op_end(&c);
    return rc;
  }
  return view_finish(&c, y, reshape_backward, NULL, 0, out);
}

int loom_flatten(loom_tensor *x, int start_dim, int end_dim, loom_tensor **out) {
  int rc = loom__check_out("flatten", out);
  if (!rc) rc = loom__check_in("flatten", x, "x");
  if (rc) return rc;
  int nd = x->ndim ? x->ndim : 1, s, e;
  if ((rc = loom__norm_dim("flatten", start_dim, nd, &s)) ||
      (rc = loom__norm_dim("flatten", end_dim, nd, &e)))
    return rc;
  if (s > e)
    return loom__fail(LOOM_EINVAL, "flatten: start_dim %d comes after end_dim %d", start_dim,
                      end_dim);
  int64_t shape[LOOM_MAX_DIMS];
  int k = 0;
  for (int i = 0; i < x->ndim; i++) {
    if (i <= s || i > e) shape[k++] = x->shape[i];
    else shape[k - 1] *= x->shape[i];
  }
  if (x->ndim == 0) shape[k++] = 1;
  return loom_reshape(x, k, shape, out);
}

int loom_transpose(loom_tensor *x, int dim0, int dim1, loom_tensor **out) {
  int rc = loom__check_out("transpose", out);
  if (!rc) rc = loom__check_in("transpose", x, "x");
  if (rc) return rc;
  loom__op c;
  loom_tensor *y = NULL;
  if ((rc = loom__op_begin(&c, LOOM_OPK_TRANSPOSE, &x, 1))) return rc;
  int d0 = dim0, d1 = dim1;
  if ((rc = loom__norm_dim("transpose", dim0, c.in[0]->ndim, &d0)) ||
      (rc = loom__norm_dim("transpose", dim1, c.in[0]->ndim, &d1)) ||
      (rc = loom_tensor_transpose(c.in[0], d0, d1, &y))) {
    loom__op_end(&c);
    return rc;
  }
  int64_t p[2] = {d0, d1};
  return view_finish(&c, y, transpose_backward, p, 2, out);
}

int loom_slice(loom_tensor *x, int dim, int64_t start, int64_t end, int64_t step,
               loom_tensor **out) {
  int rc = loom__check_out("slice", out);
  if (!rc) rc = loom__check_in("slice", x, "x");
  if (rc) return rc;
  loom__op c;
  loom_tensor *y = NULL;
  if ((rc = loom__op_begin(&c, LOOM_OPK_SLICE, &x, 1))) return rc;
  int d = dim;
  if ((rc = loom__norm_dim("slice", dim, c.in[0]->ndim, &d)) ||
      (rc = loom_tensor_slice(c.in[0], d, start, end, step, &y))) {
    loom__op_end(&c);
    return rc;
  }
  int64_t p[4] = {d, start, end, step};
  return view_finish(&c, y, slice_backward, p, 4, out);
}

/* ---- cat and stack -------------------------------------------------------------------- */

/* Backward of cat along i[0] (for stack i[1] = 1: the dim is new and is dropped). */
static int cat_backward(loom__node *n, loom_tensor *g, loom_tensor **gin) {
  int dim = (int)n->i[0];
  bool stack = n->i[1];
  int64_t off = 0;
  for (int k = 0; k < n->n_in; k++) {
    const loom__edge *e = &n->in[k];
    int64_t len = stack ? 1 : e->shape[dim];
    if (loom__node_needs(n, k)) {
      loom_tensor *v = NULL;
      int rc = loom_tensor_narrow(g, dim, off, len, &v);
      if (!rc) rc = loom__grad_new(e->ndim, e->shape, false, &gin[k]);
      if (!rc) {
        loom_tensor *r = NULL; /* view gin[k] in g's narrowed shape, then copy */
        rc = loom_tensor_reshape(gin[k], v->ndim, v->shape, &r);
        if (!rc) rc = loom_tensor_copy(r, v);
        loom_tensor_free(r);
      }
      loom_tensor_free(v);
      if (rc) return rc;
    }
    off += len;
  }
  return LOOM_OK;
}

static int join(const char *name, loom_op_kind kind, loom_tensor *const *xs, size_t count,
                int dim, bool stack, loom_tensor **out) {
  int rc = loom__check_out(name, out);
  if (rc) return rc;
  if (!xs || count < 1) return loom__fail(LOOM_EINVAL, "%s: needs at least one tensor", name);
  if (count > INT_MAX) return loom__fail(LOOM_EINVAL, "%s: %zu tensors is too many", name, count);
  int n = (int)count;
  for (int i = 0; i < n; i++) {
    char arg[32];
    snprintf(arg, sizeof arg, "tensor %d", i);
    if ((rc = loom__check_in(name, xs[i], arg))) return rc;
  }
  loom__op c;
  loom_tensor *y = NULL;
  loom__node *nd = NULL;
  if ((rc = loom__op_begin(&c, kind, xs, n))) return rc;
  const loom_tensor *x0 = c.in[0];
  int nd_out = x0->ndim + (stack ? 1 : 0), d;
  int64_t shape[LOOM_MAX_DIMS];
  if (nd_out > LOOM_MAX_DIMS) {
    rc = loom__fail(LOOM_EINVAL, "%s: result would have more than %d dims", name, LOOM_MAX_DIMS);
    goto done;
  }
  LOOM_TRY(loom__norm_dim(name, dim, nd_out, &d));
  for (int i = 0, j = 0; i < nd_out; i++) shape[i] = (stack && i == d) ? n : x0->shape[j++];
  for (int k = 1; k < n; k++) {
    const loom_tensor *x = c.in[k];
    LOOM_TRY(loom__check_same_dtype(name, x0, x));
    bool ok = x->ndim == x0->ndim;
    for (int i = 0; ok && i < x->ndim; i++) ok = (!stack && i == d) || x->shape[i] == x0->shape[i];
    if (!ok) {
      char a[96], b[96];
      rc = loom__fail(LOOM_ESHAPE, "%s: tensor %d has shape %s, tensor 0 has %s", name, k,
                      loom__shape_str(x->ndim, x->shape, a, sizeof a),
                      loom__shape_str(x0->ndim, x0->shape, b, sizeof b));
      goto done;
    }
    if (!stack) shape[d] += x->shape[d];
  }
  LOOM_TRY(loom_tensor_empty(x0->dtype, nd_out, shape, &y));
  int64_t off = 0;
  for (int k = 0; k < n; k++) {
    loom_tensor *v = NULL, *src = NULL;
    int64_t len = stack ? 1 : c.in[k]->shape[d];
    rc = loom_tensor_narrow(y, d, off, len, &v);
    if (!rc) rc = loom_tensor_reshape(c.in[k], v->ndim, v->shape, &src);
    if (!rc) rc = loom_tensor_copy(v, src);
    loom_tensor_free(v);
    loom_tensor_free(src);
    if (rc) goto done;
    off += len;
  }
  LOOM_TRY(loom__op_record(&c, y, cat_backward, &nd));
  if (nd) {
    nd->i[0] = d;
    nd->i[1] = stack;
  }
done:
  return loom__op_finish(&c, rc, y, out);
}

int loom_cat(loom_tensor *const *xs, size_t n, int dim, loom_tensor **out) {
  return join("cat", LOOM_OPK_CAT, xs, n, dim, false, out);
}

int loom_stack(loom_tensor *const *xs, size_t n, int dim, loom_tensor **out) {
  return join("stack", LOOM_OPK_STACK, xs, n, dim, true, out);
}
