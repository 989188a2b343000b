/* tensor_data.c: reading and writing tensor elements: copy (with dtype conversion, any
 * strides), contiguous, cast, clone, fill, element get/set. */
#include "core/tensor_int.h"

#include <string.h>

void loom__for_each_offset(int ndim, const int64_t *shape, const int64_t *strides, size_t offset,
                           void (*fn)(size_t off, void *ctx), void *ctx) {
  int64_t idx[LOOM_MAX_DIMS] = {0};
  for (int i = 0; i < ndim; i++)
    if (shape[i] == 0) return;
  size_t off = offset;
  for (;;) {
    fn(off, ctx);
    int d = ndim - 1;
    for (; d >= 0; d--) {
      if (++idx[d] < shape[d]) {
        off += (size_t)strides[d];
        break;
      }
      off -= (size_t)(strides[d] * (shape[d] - 1));
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

/* Row-wise strided copy with conversion: the innermost dim is one loom_convert call when both
 * sides have unit stride there, element by element otherwise. */
static void copy_strided(loom_tensor *dst, const loom_tensor *src) {
  size_t ds = loom_dtype_size(dst->dtype), ss = loom_dtype_size(src->dtype);
  char *dbase = dst->storage->data;
  const char *sbase = src->storage->data;
  int nd = dst->ndim;
  if (nd == 0) {
    loom_convert(sbase + src->offset * ss, src->dtype, dbase + dst->offset * ds, dst->dtype, 1);
    return;
  }
  int64_t idx[LOOM_MAX_DIMS] = {0};
  for (int i = 0; i < nd; i++)
    if (dst->shape[i] == 0) return;
  int64_t inner = dst->shape[nd - 1];
  bool unit = dst->strides[nd - 1] == 1 && src->strides[nd - 1] == 1;
  for (;;) {
    size_t doff = dst->offset, soff = src->offset;
    for (int i = 0; i < nd - 1; i++) {
      doff += (size_t)(idx[i] * dst->strides[i]);
      soff += (size_t)(idx[i] * src->strides[i]);
    }
    if (unit) {
      loom_convert(sbase + soff * ss, src->dtype, dbase + doff * ds, dst->dtype, (size_t)inner);
    } else {
      for (int64_t j = 0; j < inner; j++)
        loom_convert(sbase + (soff + (size_t)(j * src->strides[nd - 1])) * ss, src->dtype,
                     dbase + (doff + (size_t)(j * dst->strides[nd - 1])) * ds, dst->dtype, 1);
    }
    int d = nd - 2;
    for (; d >= 0; d--) {
      if (++idx[d] < dst->shape[d]) break;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

int loom_tensor_copy(loom_tensor *dst, const loom_tensor *src) {
  static const char *who = "loom_tensor_copy";
  int rc = loom__tensor_check_data(dst, who);
  if (rc || (rc = loom__tensor_check_data(src, who))) return rc;
  if (!loom_tensor_same_shape(dst, src)) {
    char a[128], b[128];
    return loom__fail(LOOM_ESHAPE, "%s: destination %s and source %s differ in shape", who,
                      loom__shape_str(dst->ndim, dst->shape, a, sizeof a),
                      loom__shape_str(src->ndim, src->shape, b, sizeof b));
  }
  if (loom_tensor_is_contiguous(dst) && loom_tensor_is_contiguous(src))
    return loom_convert(loom_tensor_data(src), src->dtype, loom_tensor_data(dst), dst->dtype,
                        loom_tensor_numel(src));
  copy_strided(dst, src);
  return LOOM_OK;
}

int loom_tensor_cast(loom_tensor *t, loom_dtype dt, loom_tensor **out) {
  static const char *who = "loom_tensor_cast";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  int rc = loom__tensor_check_data(t, who);
  if (rc) return rc;
  if (!loom_dtype_valid(dt)) return loom__fail(LOOM_EDTYPE, "%s: invalid dtype %d", who, (int)dt);
  loom_tensor *c = NULL;
  if ((rc = loom_tensor_empty(dt, t->ndim, t->shape, &c))) return rc;
  rc = loom_tensor_copy(c, t);
  if (rc) {
    loom_tensor_free(c);
    return rc;
  }
  *out = c;
  return LOOM_OK;
}

int loom_tensor_clone(loom_tensor *t, loom_tensor **out) {
  int rc = loom__tensor_check_data(t, "loom_tensor_clone");
  if (rc) {
    if (out) *out = NULL;
    return rc;
  }
  return loom_tensor_cast(t, t->dtype, out);
}

int loom_tensor_contiguous(loom_tensor *t, loom_tensor **out) {
  static const char *who = "loom_tensor_contiguous";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  int rc = loom__tensor_check_data(t, who);
  if (rc) return rc;
  if (loom_tensor_is_contiguous(t)) {
    *out = loom_tensor_retain(t);
    return LOOM_OK;
  }
  return loom_tensor_cast(t, t->dtype, out);
}

typedef struct fill_ctx {
  char *base;
  size_t elem;
  unsigned char value[8];
} fill_ctx;

static void fill_one(size_t off, void *p) {
  fill_ctx *c = p;
  memcpy(c->base + off * c->elem, c->value, c->elem);
}

int loom_tensor_fill(loom_tensor *t, double v) {
  int rc = loom__tensor_check_data(t, "loom_tensor_fill");
  if (rc) return rc;
  fill_ctx c = {t->storage->data, loom_dtype_size(t->dtype), {0}};
  loom__store_f64(c.value, t->dtype, 0, v);
  loom__for_each_offset(t->ndim, t->shape, t->strides, t->offset, fill_one, &c);
  return LOOM_OK;
}

int loom_tensor_read(const loom_tensor *t, loom_dtype dt, void *buf, size_t cap) {
  static const char *who = "loom_tensor_read";
  int rc = loom__tensor_check_data(t, who);
  if (rc) return rc;
  if (!loom_dtype_valid(dt)) return loom__fail(LOOM_EDTYPE, "%s: invalid dtype %d", who, (int)dt);
  size_t need = loom_tensor_numel(t) * loom_dtype_size(dt);
  if (!buf && need) return loom__fail(LOOM_EINVAL, "%s: buf is NULL", who);
  if (cap < need)
    return loom__fail(LOOM_EINVAL, "%s: buffer of %zu bytes is smaller than the %zu needed", who,
                      cap, need);
  loom_tensor *w = NULL;
  if ((rc = loom_tensor_wrap(dt, t->ndim, t->shape, buf ? buf : (void *)t, &w))) return rc;
  rc = loom_tensor_copy(w, t);
  loom_tensor_free(w);
  return rc;
}

static int element_offset(const loom_tensor *t, const int64_t *index, const char *who,
                          size_t *off) {
  int rc = loom__tensor_check_data(t, who);
  if (rc) return rc;
  if (t->ndim && !index) return loom__fail(LOOM_EINVAL, "%s: index is NULL", who);
  size_t o = t->offset;
  for (int i = 0; i < t->ndim; i++) {
    if (index[i] < 0 || index[i] >= t->shape[i])
      return loom__fail(LOOM_EINVAL, "%s: index %lld out of range for dim %d of size %lld", who,
                        (long long)index[i], i, (long long)t->shape[i]);
    o += (size_t)(index[i] * t->strides[i]);
  }
  *off = o;
  return LOOM_OK;
}

int loom_tensor_get(const loom_tensor *t, const int64_t *index, double *out) {
  size_t off;
  if (!out) return loom__fail(LOOM_EINVAL, "loom_tensor_get: out is NULL");
  int rc = element_offset(t, index, "loom_tensor_get", &off);
  if (rc) return rc;
  *out = loom__load_f64(t->storage->data, t->dtype, off);
  return LOOM_OK;
}

int loom_tensor_set(loom_tensor *t, const int64_t *index, double v) {
  size_t off;
  int rc = element_offset(t, index, "loom_tensor_set", &off);
  if (rc) return rc;
  loom_tensor *one = NULL;
  if ((rc = loom__tensor_view(t, 0, NULL, NULL, off, &one))) return rc;
  rc = loom_tensor_fill(one, v);
  loom_tensor_free(one);
  return rc;
}

int loom_tensor_item(const loom_tensor *t, double *out) {
  int rc = loom__tensor_check_data(t, "loom_tensor_item");
  if (rc) return rc;
  if (loom_tensor_numel(t) != 1)
    return loom__fail(LOOM_ESHAPE, "loom_tensor_item: tensor has %zu elements, not 1",
                      loom_tensor_numel(t));
  int64_t zero[LOOM_MAX_DIMS] = {0};
  return loom_tensor_get(t, zero, out);
}
