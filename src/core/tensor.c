/* tensor.c: tensor and storage lifetime (create, wrap, retain, free), shape checking and the
 * property getters. Views are in tensor_view.c, element data in tensor_data.c. */
#include "core/tensor_int.h"

#include <stdio.h>
#include <string.h>

void (*loom__tensor_autograd_release)(loom_tensor *t) = NULL;

const char *loom__shape_str(int ndim, const int64_t *shape, char *buf, size_t cap) {
  size_t used = 0;
  used += (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < ndim && used < cap; i++)
    used += (size_t)snprintf(buf + used, cap - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (used < cap) snprintf(buf + used, cap - used, "]");
  return buf;
}

int loom__check_shape(const char *who, loom_dtype dt, int ndim, const int64_t *shape,
                      size_t *numel) {
  if (!loom_dtype_valid(dt)) return loom__fail(LOOM_EDTYPE, "%s: invalid dtype %d", who, (int)dt);
  if (ndim < 0 || ndim > LOOM_MAX_DIMS)
    return loom__fail(LOOM_EINVAL, "%s: rank %d out of range 0..%d", who, ndim, LOOM_MAX_DIMS);
  if (ndim > 0 && !shape) return loom__fail(LOOM_EINVAL, "%s: shape is NULL", who);
  size_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      return loom__fail(LOOM_EINVAL, "%s: dim %d has negative size %lld", who, i,
                        (long long)shape[i]);
    if (!loom__mul_ok(n, (size_t)shape[i], &n))
      return loom__fail(LOOM_EOVERFLOW, "%s: element count overflows at dim %d", who, i);
  }
  size_t bytes;
  if (!loom__mul_ok(n, loom_dtype_size(dt), &bytes) || bytes > (SIZE_MAX >> 2))
    return loom__fail(LOOM_EOVERFLOW, "%s: %zu elements of %s overflow the byte size", who, n,
                      loom_dtype_name(dt));
  *numel = n;
  return LOOM_OK;
}

/* The storage of a released tensor: never freed, never written (nbytes 0, data NULL). */
static loom__storage released_storage = {.refcount = 1 << 30, .data = NULL, .nbytes = 0,
                                         .pool = LOOM_POOL_COMPUTE, .owned = false};

static void storage_release(loom__storage *s);

int loom_tensor_check(const loom_tensor *t, const char *who) {
  if (!t) return loom__fail(LOOM_EINVAL, "%s: tensor is NULL", who);
  if (t->magic != LOOM__TENSOR_MAGIC)
    return loom__fail(LOOM_EMISUSE, "%s: tensor %p is freed or not a tensor", who, (void *)t);
  return LOOM_OK;
}

int loom__tensor_check_data(const loom_tensor *t, const char *who) {
  int rc = loom_tensor_check(t, who);
  if (!rc && t->storage == &released_storage)
    return loom__fail(LOOM_EMISUSE, "%s: the tensor holds no data (a sharded FSDP parameter "
                      "outside its unit's forward and backward, or a deferred module's: "
                      "loom_module_materialize?)", who);
  return rc;
}

bool loom__tensor_released(const loom_tensor *t) { return t->storage == &released_storage; }

void loom__tensor_rebind(loom_tensor *t, const loom_tensor *base, size_t offset, loom_dtype dt) {
  loom__storage *old = t->storage;
  if (base) {
    t->storage = base->storage;
    atomic_fetch_add(&t->storage->refcount, 1);
    t->offset = base->offset + offset;
    t->dtype = base->dtype;
  } else {
    t->storage = &released_storage;
    t->offset = 0;
    t->dtype = dt;
  }
  storage_release(old);
}

static void contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    strides[i] = s;
    s *= shape[i] ? shape[i] : 1;
  }
}

/* A tensor header with contiguous geometry over `storage` (which it takes over). */
static int make_header(loom_dtype dt, int ndim, const int64_t *shape, loom__storage *storage,
                       loom_tensor **out) {
  loom_tensor *t = loom__calloc(LOOM_POOL_COMPUTE, 1, sizeof *t);
  if (!t) return loom__fail(LOOM_ENOMEM, "tensor: out of memory for the tensor header");
  t->magic = LOOM__TENSOR_MAGIC;
  atomic_init(&t->refcount, 1);
  t->dtype = dt;
  t->ndim = ndim;
  if (ndim) memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
  contiguous_strides(ndim, shape, t->strides);
  t->storage = storage;
  *out = t;
  return LOOM_OK;
}

static void storage_release(loom__storage *s) {
  if (!s || s == &released_storage || atomic_fetch_sub(&s->refcount, 1) != 1) return;
  if (s->owned) loom__free(s->data);
  loom__free(s);
}

/* zero: 0 uninitialised, 1 zeros, 2 zeros nothing writes before a step
 * (loom__calloc_untouched). */
static int create(const char *who, loom_pool pool, loom_dtype dt, int ndim, const int64_t *shape,
                  void *user_data, int zero, loom_tensor **out) {
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  size_t numel;
  int rc = loom__check_shape(who, dt, ndim, shape, &numel);
  if (rc) return rc;
  if ((unsigned)pool >= LOOM_POOL_COUNT)
    return loom__fail(LOOM_EINVAL, "%s: pool %d out of range", who, (int)pool);
  size_t nbytes = numel * loom_dtype_size(dt);
  loom__storage *s = loom__calloc(pool, 1, sizeof *s);
  if (!s) return loom__fail(LOOM_ENOMEM, "%s: out of memory for the storage header", who);
  atomic_init(&s->refcount, 1);
  s->nbytes = nbytes;
  s->pool = pool;
  if (user_data) {
    s->data = user_data;
  } else {
    s->owned = true;
    s->data = zero == 2 ? loom__calloc_untouched(pool, 1, nbytes)
              : zero   ? loom__calloc(pool, 1, nbytes)
                       : loom__malloc(pool, nbytes);
    if (!s->data) {
      loom__free(s);
      return loom__fail(LOOM_ENOMEM, "%s: out of memory for %zu bytes (%s pool)", who, nbytes,
                        loom_pool_name(pool));
    }
  }
  rc = make_header(dt, ndim, shape, s, out);
  if (rc) storage_release(s);
  return rc;
}

int loom__tensor_shell(loom_dtype dt, int ndim, const int64_t *shape, loom_tensor **out) {
  *out = NULL;
  size_t numel;
  int rc = loom__check_shape("tensor", dt, ndim, shape, &numel);
  return rc ? rc : make_header(dt, ndim, shape, &released_storage, out);
}

int loom_tensor_empty(loom_dtype dt, int ndim, const int64_t *shape, loom_tensor **out) {
  return create("loom_tensor_empty", LOOM_POOL_COMPUTE, dt, ndim, shape, NULL, 0, out);
}

int loom_tensor_zeros(loom_dtype dt, int ndim, const int64_t *shape, loom_tensor **out) {
  return create("loom_tensor_zeros", LOOM_POOL_COMPUTE, dt, ndim, shape, NULL, 1, out);
}

int loom__tensor_zeros_untouched(loom_dtype dt, int ndim, const int64_t *shape,
                                 loom_tensor **out) {
  return create("loom_tensor_zeros", LOOM_POOL_COMPUTE, dt, ndim, shape, NULL, 2, out);
}

int loom_tensor_empty_pool(loom_pool pool, loom_dtype dt, int ndim, const int64_t *shape,
                           loom_tensor **out) {
  return create("loom_tensor_empty_pool", pool, dt, ndim, shape, NULL, 0, out);
}

int loom_tensor_wrap(loom_dtype dt, int ndim, const int64_t *shape, void *data,
                     loom_tensor **out) {
  if (!data) {
    if (out) *out = NULL;
    return loom__fail(LOOM_EINVAL, "loom_tensor_wrap: data is NULL");
  }
  return create("loom_tensor_wrap", LOOM_POOL_COMPUTE, dt, ndim, shape, data, 0, out);
}

int loom_tensor_from_data(loom_dtype dt, int ndim, const int64_t *shape, const void *data,
                          loom_tensor **out) {
  if (!data) {
    if (out) *out = NULL;
    return loom__fail(LOOM_EINVAL, "loom_tensor_from_data: data is NULL");
  }
  int rc = create("loom_tensor_from_data", LOOM_POOL_COMPUTE, dt, ndim, shape, NULL, 0, out);
  if (rc == LOOM_OK) memcpy((*out)->storage->data, data, (*out)->storage->nbytes);
  return rc;
}

int loom__tensor_view(const loom_tensor *base, int ndim, const int64_t *shape,
                      const int64_t *strides, size_t offset, loom_tensor **out) {
  loom_tensor *t = loom__calloc(LOOM_POOL_COMPUTE, 1, sizeof *t);
  if (!t) return loom__fail(LOOM_ENOMEM, "tensor view: out of memory for the tensor header");
  t->magic = LOOM__TENSOR_MAGIC;
  atomic_init(&t->refcount, 1);
  t->dtype = base->dtype;
  t->ndim = ndim;
  if (ndim) {
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    memcpy(t->strides, strides, (size_t)ndim * sizeof *strides);
  }
  t->offset = offset;
  t->storage = base->storage;
  atomic_fetch_add(&t->storage->refcount, 1);
  *out = t;
  return LOOM_OK;
}

loom_tensor *loom_tensor_retain(loom_tensor *t) {
  if (t && t->magic == LOOM__TENSOR_MAGIC) atomic_fetch_add(&t->refcount, 1);
  return t;
}

void loom_tensor_free(loom_tensor *t) {
  if (!t || t->magic != LOOM__TENSOR_MAGIC) return;
  if (atomic_fetch_sub(&t->refcount, 1) != 1) return;
  if (t->autograd && loom__tensor_autograd_release) loom__tensor_autograd_release(t);
  storage_release(t->storage);
  t->magic = LOOM__TENSOR_DEAD;
  loom__free(t);
}

loom_dtype loom_tensor_dtype(const loom_tensor *t) { return t->dtype; }
int loom_tensor_ndim(const loom_tensor *t) { return t->ndim; }
const int64_t *loom_tensor_shape(const loom_tensor *t) { return t->shape; }
const int64_t *loom_tensor_strides(const loom_tensor *t) { return t->strides; }
loom_pool loom_tensor_pool(const loom_tensor *t) { return t->storage->pool; }

int64_t loom_tensor_dim(const loom_tensor *t, int dim) {
  if (dim < 0) dim += t->ndim;
  return (dim >= 0 && dim < t->ndim) ? t->shape[dim] : -1;
}

size_t loom_tensor_numel(const loom_tensor *t) {
  size_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
  return n;
}

size_t loom_tensor_nbytes(const loom_tensor *t) {
  return loom_tensor_numel(t) * loom_dtype_size(t->dtype);
}

bool loom_tensor_is_contiguous(const loom_tensor *t) {
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->strides[i] != s) return false;
    s *= t->shape[i];
  }
  return true;
}

void *loom_tensor_data(const loom_tensor *t) {
  return (char *)t->storage->data + t->offset * loom_dtype_size(t->dtype);
}

bool loom_tensor_same_shape(const loom_tensor *a, const loom_tensor *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

bool loom_tensor_shares_storage(const loom_tensor *a, const loom_tensor *b) {
  return a->storage == b->storage;
}
