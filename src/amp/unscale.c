/* unscale.c: the fused unscale + inf/NaN check and the early-exit check over raw buffers and
 * lists of tensors: argument checks, the choice of the kernel table by CPU level, and strided
 * tensors (element by element through the scalar reference). The kernels are unscale_*.c. */
#include "amp/amp_int.h"
#include "core/tensor_int.h"

#include <math.h>

LOOM__KERNEL_PICKERS(loom__amp_kernels, loom__amp_kernels, loom__amp_kernels_for, loom__amp_k)

static bool is_grad_dtype(loom_dtype dt) {
  return dt == LOOM_F32 || dt == LOOM_F16 || dt == LOOM_BF16;
}

/* inv_scale as the f32 the kernels multiply by: finite and > 0 after rounding. */
static int inv_f32(const char *who, double inv_scale, float *out) {
  float f = (float)inv_scale;
  if (!(inv_scale > 0) || !isfinite(inv_scale) || !isfinite(f) || f == 0.0f)
    return loom__fail(LOOM_EINVAL, "%s: inv_scale %g is not a finite f32 > 0", who, inv_scale);
  *out = f;
  return LOOM_OK;
}

static bool check_only(const loom__amp_kernels *k, const void *data, loom_dtype dt, size_t n) {
  switch (dt) {
  case LOOM_F32: return k->nonfinite_f32(data, n);
  case LOOM_F16: return k->nonfinite_f16(data, n);
  default: return k->nonfinite_bf16(data, n);
  }
}

/* One contiguous run with table k: unscale, or only check when inv is 1 (x * 1 == x). */
static bool run(const loom__amp_kernels *k, void *data, loom_dtype dt, size_t n, float inv) {
  if (loom__dry()) return false;
  if (inv == 1.0f) return check_only(k, data, dt, n);
  switch (dt) {
  case LOOM_F32: return k->unscale_f32(data, n, inv);
  case LOOM_F16: return k->unscale_f16(data, n, inv);
  default: return k->unscale_bf16(data, n, inv);
  }
}

static int check_buffer(const char *who, const void *data, loom_dtype dt, size_t n) {
  if (!is_grad_dtype(dt))
    return loom__fail(LOOM_EDTYPE, "%s: dtype %s is not f32, f16 or bf16", who,
                      loom_dtype_name(dt));
  if (n && !data) return loom__fail(LOOM_EINVAL, "%s: data is NULL for %zu elements", who, n);
  return LOOM_OK;
}

int loom__amp_unscale(void *data, loom_dtype dt, size_t n, double inv_scale, bool *found_inf) {
  static const char *who = "loom__amp_unscale";
  float inv = 1.0f;
  int rc;
  if ((rc = check_buffer(who, data, dt, n)) || (rc = inv_f32(who, inv_scale, &inv))) return rc;
  bool f = n ? run(loom__amp_k(), data, dt, n, inv) : false;
  if (found_inf) *found_inf = f;
  return LOOM_OK;
}

int loom__amp_has_nonfinite(const void *data, loom_dtype dt, size_t n, bool *out) {
  int rc = check_buffer("loom__amp_has_nonfinite", data, dt, n);
  if (rc) return rc;
  if (!out) return loom__fail(LOOM_EINVAL, "loom__amp_has_nonfinite: out is NULL");
  *out = n ? check_only(loom__amp_k(), data, dt, n) : false;
  return LOOM_OK;
}

/* ---- tensor lists ---------------------------------------------------------------------------- */

int loom__amp_check_tensors(const char *who, loom_tensor *const *ts, size_t n) {
  if (n && !ts) return loom__fail(LOOM_EINVAL, "%s: tensor list is NULL", who);
  for (size_t i = 0; i < n; i++) {
    if (!ts[i]) continue;
    int rc = loom_tensor_check(ts[i], who);
    if (rc) return rc;
    if (!is_grad_dtype(ts[i]->dtype))
      return loom__fail(LOOM_EDTYPE, "%s: tensor %zu has dtype %s, not f32, f16 or bf16", who,
                        i, loom_dtype_name(ts[i]->dtype));
  }
  return LOOM_OK;
}

typedef struct strided_ctx {
  unsigned char *base;
  size_t elem;
  loom_dtype dt;
  float inv;
  bool product; /* only test x * inv in f32, write nothing */
  bool found;
} strided_ctx;

static void strided_one(size_t off, void *p) {
  strided_ctx *c = p;
  if (c->product) {
    c->found |= !isfinite((float)loom__load_f64(c->base, c->dt, off) * c->inv);
    return;
  }
  c->found |= run(&loom__amp_kernels_scalar, c->base + off * c->elem, c->dt, 1, c->inv);
}

/* t element by element (any strides) with the scalar reference, or the product test. */
static bool strided_pass(const loom_tensor *t, float inv, bool product) {
  strided_ctx c = {t->storage->data, loom_dtype_size(t->dtype), t->dtype, inv, product, false};
  loom__for_each_offset(t->ndim, t->shape, t->strides, t->offset, strided_one, &c);
  return c.found;
}

/* One tensor (inv 1: check only): contiguous through the table, strided element by element. */
static bool tensor_pass(const loom_tensor *t, float inv) {
  size_t n = loom_tensor_numel(t);
  if (!n) return false;
  if (loom_tensor_is_contiguous(t)) return run(loom__amp_k(), loom_tensor_data(t), t->dtype, n, inv);
  return strided_pass(t, inv, false);
}

int loom__amp_unscale_tensors(loom_tensor *const *ts, size_t n, double inv_scale,
                             bool *found_inf) {
  static const char *who = "loom__amp_unscale_tensors";
  float inv = 1.0f;
  int rc;
  if ((rc = loom__amp_check_tensors(who, ts, n)) || (rc = inv_f32(who, inv_scale, &inv))) return rc;
  bool any = false;
  for (size_t i = 0; i < n; i++)
    if (ts[i]) any |= tensor_pass(ts[i], inv);
  if (found_inf) *found_inf = any;
  return LOOM_OK;
}

bool loom__amp_scaled_nonfinite(const loom_tensor *t, float inv) {
  if (inv <= 1.0f) return tensor_pass(t, 1.0f); /* |x * inv| <= |x|: finite iff x is */
  return loom_tensor_numel(t) ? strided_pass(t, inv, true) : false;
}

int loom__amp_has_nonfinite_tensors(loom_tensor *const *ts, size_t n, bool *out) {
  static const char *who = "loom__amp_has_nonfinite_tensors";
  int rc = loom__amp_check_tensors(who, ts, n);
  if (rc) return rc;
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = false;
  for (size_t i = 0; i < n && !*out; i++)
    if (ts[i]) *out = tensor_pass(ts[i], 1.0f);
  return LOOM_OK;
}
