/* tensor_print.c: a readable debug print of a tensor: header line, then nested rows of values,
 * eliding the middle of any dimension longer than 6 (first 3 ... last 3), as numpy does. */
#include "core/tensor_int.h"

#include <stdarg.h>
#include <string.h>

typedef struct out_buf {
  char *buf;
  size_t cap, used;
} out_buf;

static void put(out_buf *o, const char *fmt, ...) {
  if (o->used + 1 >= o->cap) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(o->buf + o->used, o->cap - o->used, fmt, ap);
  va_end(ap);
  if (n > 0) o->used += (size_t)n < o->cap - o->used ? (size_t)n : o->cap - o->used - 1;
}

#define EDGE 3

static void put_dim(out_buf *o, const loom_tensor *t, int d, size_t off) {
  if (d == t->ndim) {
    double v = loom__load_f64(t->storage->data, t->dtype, off);
    if (loom_dtype_is_float(t->dtype)) put(o, "%.6g", v);
    else put(o, "%.0f", v);
    return;
  }
  put(o, "[");
  int64_t n = t->shape[d];
  for (int64_t i = 0; i < n; i++) {
    if (n > 2 * EDGE && i == EDGE) {
      put(o, "..., ");
      i = n - EDGE;
    }
    put_dim(o, t, d + 1, off + (size_t)(i * t->strides[d]));
    if (i + 1 < n) put(o, d + 1 == t->ndim ? ", " : ",\n%*s", d + 1, "");
  }
  put(o, "]");
}

int loom_tensor_format(const loom_tensor *t, char *buf, size_t cap) {
  if (!buf || cap == 0) return loom__fail(LOOM_EINVAL, "loom_tensor_format: buf is NULL or empty");
  buf[0] = '\0';
  int rc = loom_tensor_check(t, "loom_tensor_format");
  if (rc) return rc;
  out_buf o = {buf, cap, 0};
  char s[160];
  put(&o, "tensor(%s, shape=%s", loom_dtype_name(t->dtype),
      loom__shape_str(t->ndim, t->shape, s, sizeof s));
  if (!loom_tensor_is_contiguous(t))
    put(&o, ", strides=%s", loom__shape_str(t->ndim, t->strides, s, sizeof s));
  put(&o, ")\n");
  if (loom_tensor_numel(t) > 0) put_dim(&o, t, 0, t->offset);
  put(&o, "\n");
  return LOOM_OK;
}

int loom_tensor_print(const loom_tensor *t, FILE *f) {
  if (!f) return loom__fail(LOOM_EINVAL, "loom_tensor_print: file is NULL");
  char buf[16384];
  int rc = loom_tensor_format(t, buf, sizeof buf);
  if (rc) return rc;
  if (fputs(buf, f) < 0) return loom__fail(LOOM_EIO, "loom_tensor_print: write failed");
  return LOOM_OK;
}
