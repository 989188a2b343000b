/* tensor_view.c: views that share a tensor's storage: reshape, permute, transpose, narrow and
 * slice. Each only computes a new shape, strides and offset. */
#include "core/tensor_int.h"

#include <string.h>

static int norm_dim(const char *who, const loom_tensor *t, int dim, int *out) {
  int d = dim < 0 ? dim + t->ndim : dim;
  if (d < 0 || d >= t->ndim)
    return loom__fail(LOOM_EINVAL, "%s: dim %d out of range for a rank-%d tensor", who, dim,
                      t->ndim);
  *out = d;
  return LOOM_OK;
}

/* A view's checks: out non-NULL (set to NULL), t live, dim normalised into *d. */
static int view_begin(const char *who, loom_tensor *t, int dim, loom_tensor **out, int *d) {
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  int rc = loom_tensor_check(t, who);
  return rc ? rc : norm_dim(who, t, dim, d);
}

/* Strides for `shape` viewing t's elements, or false if t's strides do not allow a view
 * (the algorithm of torch's computeStride: merge t's dims into contiguous chunks). */
static bool view_strides(const loom_tensor *t, int ndim, const int64_t *shape, int64_t *strides) {
  if (loom_tensor_numel(t) == 0 || t->ndim == 0) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
      strides[i] = s;
      s *= shape[i] ? shape[i] : 1;
    }
    return true;
  }
  int view_d = ndim - 1;
  int64_t chunk_base_stride = t->strides[t->ndim - 1];
  int64_t tensor_numel = 1, view_numel = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    tensor_numel *= t->shape[d];
    if (d == 0 || (t->shape[d - 1] != 1 && t->strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = t->strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

int loom_tensor_reshape(loom_tensor *t, int ndim, const int64_t *shape, loom_tensor **out) {
  static const char *who = "loom_tensor_reshape";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  int rc = loom_tensor_check(t, who);
  if (rc) return rc;
  if (ndim < 0 || ndim > LOOM_MAX_DIMS)
    return loom__fail(LOOM_EINVAL, "%s: rank %d out of range 0..%d", who, ndim, LOOM_MAX_DIMS);
  if (ndim && !shape) return loom__fail(LOOM_EINVAL, "%s: shape is NULL", who);
  int64_t s[LOOM_MAX_DIMS];
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < ndim; i++) {
    s[i] = shape[i];
    if (shape[i] == -1) {
      if (infer >= 0) return loom__fail(LOOM_EINVAL, "%s: more than one dim is -1", who);
      infer = i;
    } else if (shape[i] < 0) {
      return loom__fail(LOOM_EINVAL, "%s: dim %d has negative size %lld", who, i,
                        (long long)shape[i]);
    } else if (__builtin_mul_overflow(known, shape[i], &known)) {
      return loom__fail(LOOM_EOVERFLOW, "%s: element count overflows", who);
    }
  }
  int64_t numel = (int64_t)loom_tensor_numel(t);
  char a[128], b[128];
  if (infer >= 0) {
    if (known == 0 || numel % known)
      return loom__fail(LOOM_ESHAPE, "%s: cannot infer the -1 dim of %s from %lld elements", who,
                        loom__shape_str(ndim, shape, a, sizeof a), (long long)numel);
    s[infer] = numel / known;
    known = numel;
  }
  if (known != numel)
    return loom__fail(LOOM_ESHAPE, "%s: shape %s has %lld elements, tensor %s has %lld", who,
                      loom__shape_str(ndim, s, a, sizeof a), (long long)known,
                      loom__shape_str(t->ndim, t->shape, b, sizeof b), (long long)numel);
  int64_t strides[LOOM_MAX_DIMS];
  if (view_strides(t, ndim, s, strides)) return loom__tensor_view(t, ndim, s, strides, t->offset, out);
  loom_tensor *c = NULL;
  rc = loom_tensor_contiguous(t, &c);
  if (rc) return rc;
  view_strides(c, ndim, s, strides);
  rc = loom__tensor_view(c, ndim, s, strides, c->offset, out);
  loom_tensor_free(c);
  return rc;
}

int loom_tensor_permute(loom_tensor *t, const int *perm, loom_tensor **out) {
  static const char *who = "loom_tensor_permute";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  int rc = loom_tensor_check(t, who);
  if (rc) return rc;
  if (t->ndim && !perm) return loom__fail(LOOM_EINVAL, "%s: perm is NULL", who);
  int64_t shape[LOOM_MAX_DIMS], strides[LOOM_MAX_DIMS];
  bool seen[LOOM_MAX_DIMS] = {false};
  for (int i = 0; i < t->ndim; i++) {
    int d = 0;
    if ((rc = norm_dim(who, t, perm[i], &d))) return rc;
    if (seen[d]) return loom__fail(LOOM_EINVAL, "%s: dim %d appears twice in perm", who, d);
    seen[d] = true;
    shape[i] = t->shape[d];
    strides[i] = t->strides[d];
  }
  return loom__tensor_view(t, t->ndim, shape, strides, t->offset, out);
}

int loom_tensor_transpose(loom_tensor *t, int dim0, int dim1, loom_tensor **out) {
  static const char *who = "loom_tensor_transpose";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  int rc = loom_tensor_check(t, who);
  int d0 = 0, d1 = 0;
  if (rc || (rc = norm_dim(who, t, dim0, &d0)) || (rc = norm_dim(who, t, dim1, &d1))) return rc;
  int perm[LOOM_MAX_DIMS];
  for (int i = 0; i < t->ndim; i++) perm[i] = i;
  perm[d0] = d1;
  perm[d1] = d0;
  return loom_tensor_permute(t, perm, out);
}

int loom_tensor_slice(loom_tensor *t, int dim, int64_t start, int64_t end, int64_t step,
                      loom_tensor **out) {
  static const char *who = "loom_tensor_slice";
  int d = 0, rc = view_begin(who, t, dim, out, &d);
  if (rc) return rc;
  if (step < 1) return loom__fail(LOOM_EINVAL, "%s: step %lld must be >= 1", who, (long long)step);
  int64_t n = t->shape[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  if (start < 0) start = 0;
  if (start > n) start = n;
  if (end > n) end = n;
  if (end < start) end = start;
  int64_t shape[LOOM_MAX_DIMS], strides[LOOM_MAX_DIMS];
  memcpy(shape, t->shape, sizeof shape);
  memcpy(strides, t->strides, sizeof strides);
  shape[d] = (end - start + step - 1) / step;
  strides[d] = t->strides[d] * step;
  size_t offset = t->offset + (size_t)(start * t->strides[d]);
  return loom__tensor_view(t, t->ndim, shape, strides, shape[d] ? offset : t->offset, out);
}

int loom_tensor_narrow(loom_tensor *t, int dim, int64_t start, int64_t length,
                       loom_tensor **out) {
  static const char *who = "loom_tensor_narrow";
  int d = 0, rc = view_begin(who, t, dim, out, &d);
  if (rc) return rc;
  if (start < 0 || length < 0 || start > t->shape[d] || length > t->shape[d] - start)
    return loom__fail(LOOM_EINVAL, "%s: range [%lld, %lld) out of bounds for dim %d of size %lld",
                      who, (long long)start, (long long)(start + length), d,
                      (long long)t->shape[d]);
  return loom_tensor_slice(t, d, start, start + length, 1, out);
}
