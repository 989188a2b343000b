/* safetensors_read.c: opening a safetensors file (read into memory or mapped), and access to
 * its tensors (info, copy, view, checked read into a caller buffer) and metadata. */
#include "io/safetensors_int.h"
#include "core/tensor_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int check(const loom_safetensors *f, const char *who) {
  if (!f) return loom__fail(LOOM_EINVAL, "%s: file is NULL", who);
  if (f->magic != LOOM__ST_MAGIC)
    return loom__fail(LOOM_EMISUSE, "%s: %p is a freed or invalid safetensors handle", who,
                      (const void *)f);
  return LOOM_OK;
}

void loom_safetensors_free(loom_safetensors *f) {
  if (!f) return;
  if (f->mapped) {
    munmap(f->buf, f->size ? f->size : 1);
    loom__mem_account_to(LOOM_POOL_FILE, f->account, -(ptrdiff_t)f->size);
  } else {
    loom__free(f->buf);
  }
  loom__vec_free(&f->strings);
  loom__vec_free(&f->shapes);
  loom__vec_free(&f->tensors);
  loom__vec_free(&f->meta);
  loom__free(f->by_name);
  loom__free(f->label);
  f->magic = 0;
  loom__free(f);
}

static loom_safetensors *alloc_file(const char *who, const char *label) {
  loom_safetensors *f = loom__calloc(LOOM_POOL_META, 1, sizeof *f);
  if (!f) {
    loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
    return NULL;
  }
  f->magic = LOOM__ST_MAGIC;
  f->label = loom__strdup(LOOM_POOL_META, label);
  if (!f->label) {
    loom__free(f);
    loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
    return NULL;
  }
  return f;
}

int loom_safetensors_open_memory(const void *buf, size_t size, const char *label,
                                 loom_safetensors **out) {
  const char *who = "loom_safetensors_open_memory";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  if (!buf && size) return loom__fail(LOOM_EINVAL, "%s: buf is NULL", who);
  loom_safetensors *f = alloc_file(who, label ? label : "(memory)");
  if (!f) return LOOM_ENOMEM;
  f->buf = loom__malloc(LOOM_POOL_META, size ? size : 1);
  if (!f->buf) {
    loom_safetensors_free(f);
    return loom__fail(LOOM_ENOMEM, "%s: out of memory for %zu bytes", who, size);
  }
  if (size) memcpy(f->buf, buf, size);
  f->size = size;
  int rc = loom__st_parse(f, who);
  if (rc) {
    loom_safetensors_free(f);
    return rc;
  }
  *out = f;
  return LOOM_OK;
}

int loom_safetensors_open(const char *path, unsigned flags, loom_safetensors **out) {
  const char *who = "loom_safetensors_open";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  if (!path) return loom__fail(LOOM_EINVAL, "%s: path is NULL", who);
  if (flags & ~LOOM_SAFETENSORS_MMAP) return loom__fail(LOOM_EINVAL, "%s: unknown flags 0x%x", who, flags);
  int fd = -1;
  size_t size;
  int rc = loom__file_open_read(who, path, &fd, &size);
  if (rc) return rc;
  loom_safetensors *f = alloc_file(who, path);
  if (!f) {
    close(fd);
    return LOOM_ENOMEM;
  }
  f->size = size;
  if ((flags & LOOM_SAFETENSORS_MMAP) && f->size) {
    if (loom__alloc_should_fail(LOOM_POOL_FILE)) {
      rc = loom__fail(LOOM_ENOMEM, "%s: cannot map '%s' (injected failure)", who, path);
      goto done;
    }
    void *p = mmap(NULL, f->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      rc = loom__fail(LOOM_EIO, "%s: cannot map '%s': %s", who, path, strerror(errno));
      goto done;
    }
    f->buf = p;
    f->mapped = true;
    f->account = loom_mem_account();
    loom__mem_account_to(LOOM_POOL_FILE, f->account, (ptrdiff_t)f->size);
  } else {
    f->buf = loom__malloc(LOOM_POOL_META, f->size ? f->size : 1);
    if (!f->buf) {
      rc = loom__fail(LOOM_ENOMEM, "%s: out of memory reading '%s' (%zu bytes)", who, path, f->size);
      goto done;
    }
    LOOM_TRY(loom__file_pread(who, path, fd, f->buf, f->size, 0));
  }
  LOOM_TRY(loom__st_parse(f, who));
  close(fd);
  *out = f;
  return LOOM_OK;
done:
  close(fd);
  loom_safetensors_free(f);
  return rc;
}

size_t loom_safetensors_count(const loom_safetensors *f) { return f ? f->tensors.len : 0; }

static void fill_info(const loom_safetensors *f, const loom__st_tensor *t,
                      loom_safetensors_info *out) {
  out->name = loom__st_str(f, t->name);
  out->dtype_name = t->dt->name;
  out->has_loom_dtype = t->dt->loom >= 0;
  out->dtype = t->dt->loom >= 0 ? (loom_dtype)t->dt->loom : LOOM_F32;
  out->ndim = t->ndim;
  /* a file whose every tensor is a scalar has no shape array: its shape stays NULL */
  out->shape = f->shapes.p ? (const int64_t *)f->shapes.p + t->shape : NULL;
  out->numel = t->numel;
  out->nbytes = (size_t)(t->end - t->begin);
  out->data = f->buf + f->data_start + t->begin;
}

int loom_safetensors_info_at(const loom_safetensors *f, size_t i, loom_safetensors_info *out) {
  int rc = check(f, "loom_safetensors_info_at");
  if (rc) return rc;
  if (!out) return loom__fail(LOOM_EINVAL, "loom_safetensors_info_at: out is NULL");
  if (i >= f->tensors.len)
    return loom__fail(LOOM_EINVAL, "loom_safetensors_info_at: index %zu out of range (%zu tensors)",
                      i, f->tensors.len);
  fill_info(f, (const loom__st_tensor *)f->tensors.p + i, out);
  return LOOM_OK;
}

static int find(const loom_safetensors *f, const char *who, const char *name,
                loom_safetensors_info *out) {
  int rc = check(f, who);
  if (rc) return rc;
  if (!name || !out) return loom__fail(LOOM_EINVAL, "%s: NULL argument", who);
  const loom__st_tensor *t = f->tensors.p;
  size_t lo = 0, hi = f->tensors.len;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(loom__st_str(f, t[f->by_name[mid]].name), name);
    if (c == 0) {
      fill_info(f, &t[f->by_name[mid]], out);
      return LOOM_OK;
    }
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return loom__fail(LOOM_ENOTFOUND, "%s: %s has no tensor \"%s\"", who, f->label, name);
}

int loom_safetensors_find(const loom_safetensors *f, const char *name,
                          loom_safetensors_info *out) {
  return find(f, "loom_safetensors_find", name, out);
}

/* The tensor's info, checked to be something a loom tensor can hold. */
static int loomable(const loom_safetensors *f, const char *who, const char *name,
                    loom_safetensors_info *in) {
  int rc = find(f, who, name, in);
  if (rc) return rc;
  if (!in->has_loom_dtype)
    return loom__fail(LOOM_EDTYPE, "%s: %s: tensor \"%s\" has dtype %s, which loom cannot hold",
                      who, f->label, name, in->dtype_name);
  if (in->ndim > LOOM_MAX_DIMS)
    return loom__fail(LOOM_ESHAPE, "%s: %s: tensor \"%s\" has rank %d, above loom's %d", who,
                      f->label, name, in->ndim, LOOM_MAX_DIMS);
  return LOOM_OK;
}

int loom_safetensors_get(const loom_safetensors *f, const char *name, loom_tensor **out) {
  if (out) *out = NULL;
  loom_safetensors_info in;
  int rc = loomable(f, "loom_safetensors_get", name, &in);
  if (rc) return rc;
  return loom_tensor_from_data(in.dtype, in.ndim, in.shape, in.data, out);
}

int loom_safetensors_view(const loom_safetensors *f, const char *name, loom_tensor **out) {
  if (out) *out = NULL;
  loom_safetensors_info in;
  int rc = loomable(f, "loom_safetensors_view", name, &in);
  if (rc) return rc;
  if ((uintptr_t)in.data % loom_dtype_size(in.dtype))
    return loom__fail(LOOM_EFORMAT,
                      "loom_safetensors_view: %s: tensor \"%s\" is not aligned for %s; use "
                      "loom_safetensors_get",
                      f->label, name, loom_dtype_name(in.dtype));
  return loom_tensor_wrap(in.dtype, in.ndim, in.shape, (void *)in.data, out);
}

int loom__st_check(const loom_safetensors *f, const char *who, const char *name, loom_dtype dt,
                  int ndim, const int64_t *shape, loom_safetensors_info *in) {
  int rc = loomable(f, who, name, in);
  if (rc) return rc;
  if (in->dtype != dt)
    return loom__fail(LOOM_EDTYPE, "%s: %s: tensor \"%s\" is %s, expected %s", who, f->label,
                      name, in->dtype_name, loom_dtype_name(dt));
  bool same = ndim == in->ndim &&
              (ndim == 0 || (shape && memcmp(shape, in->shape, (size_t)ndim * sizeof *shape) == 0));
  if (!same) {
    char a[160], b[160];
    loom__shape_str(in->ndim, in->shape, a, sizeof a);
    loom__shape_str(ndim >= 0 && ndim <= LOOM_MAX_DIMS && shape ? ndim : 0, shape, b, sizeof b);
    return loom__fail(LOOM_ESHAPE, "%s: %s: tensor \"%s\" has shape %s, expected %s", who,
                      f->label, name, a, b);
  }
  return LOOM_OK;
}

int loom_safetensors_read(const loom_safetensors *f, const char *name, loom_dtype dt, int ndim,
                          const int64_t *shape, void *dst) {
  loom_safetensors_info in;
  int rc = loom__st_check(f, "loom_safetensors_read", name, dt, ndim, shape, &in);
  if (rc) return rc;
  if (in.nbytes && !dst) return loom__fail(LOOM_EINVAL, "loom_safetensors_read: dst is NULL");
  if (in.nbytes) memcpy(dst, in.data, in.nbytes);
  return LOOM_OK;
}

size_t loom_safetensors_meta_count(const loom_safetensors *f) { return f ? f->meta.len : 0; }

int loom_safetensors_meta_at(const loom_safetensors *f, size_t i, const char **key,
                             const char **value) {
  int rc = check(f, "loom_safetensors_meta_at");
  if (rc) return rc;
  if (i >= f->meta.len)
    return loom__fail(LOOM_EINVAL, "loom_safetensors_meta_at: index %zu out of range (%zu keys)",
                      i, f->meta.len);
  const loom__st_meta *m = (const loom__st_meta *)f->meta.p + i;
  if (key) *key = loom__st_str(f, m->key);
  if (value) *value = loom__st_str(f, m->value);
  return LOOM_OK;
}

const char *loom_safetensors_meta(const loom_safetensors *f, const char *key) {
  if (!f || !key || f->magic != LOOM__ST_MAGIC) return NULL;
  const loom__st_meta *m = f->meta.p;
  for (size_t i = 0; i < f->meta.len; i++)
    if (strcmp(loom__st_str(f, m[i].key), key) == 0) return loom__st_str(f, m[i].value);
  return NULL;
}

static int meta_number(const loom_safetensors *f, const char *who, const char *key, bool integer,
                       int64_t *i, double *d) {
  int rc = check(f, who);
  if (rc) return rc;
  if (!key) return loom__fail(LOOM_EINVAL, "%s: key is NULL", who);
  const char *v = loom_safetensors_meta(f, key);
  if (!v) return loom__fail(LOOM_ENOTFOUND, "%s: %s has no metadata \"%s\"", who, f->label, key);
  char *end = NULL;
  errno = 0;
  if (integer) *i = strtoll(v, &end, 10);
  else *d = strtod(v, &end);
  if (!v[0] || *end || (integer && errno) || v[0] == ' ' || v[0] == '\t' || v[0] == '\n')
    return loom__fail(LOOM_EFORMAT, "%s: %s: metadata \"%s\" = \"%s\" is not %s", who, f->label,
                      key, v, integer ? "a 64-bit integer" : "a number");
  return LOOM_OK;
}

int loom_safetensors_meta_i64(const loom_safetensors *f, const char *key, int64_t *out) {
  double unused;
  if (!out) return loom__fail(LOOM_EINVAL, "loom_safetensors_meta_i64: out is NULL");
  return meta_number(f, "loom_safetensors_meta_i64", key, true, out, &unused);
}

int loom_safetensors_meta_f64(const loom_safetensors *f, const char *key, double *out) {
  int64_t unused;
  if (!out) return loom__fail(LOOM_EINVAL, "loom_safetensors_meta_f64: out is NULL");
  return meta_number(f, "loom_safetensors_meta_f64", key, false, &unused, out);
}
