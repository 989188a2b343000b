/* amp_grad.c: gradients on their way to the optimizer (AmpAutogradHelper): preparation
 * (unscale + inf/NaN check in one pass, then f32), dtype conversion, the compatibility check of
 * gradients against parameters, and clipping of the unscaled gradients by their global norm. */
#include "amp/amp_int.h"
#include "core/tensor_int.h"

#include <math.h>
#include <string.h>

/* The tensors of a named list as a plain array (a small one on the stack). */
typedef struct tensor_list {
  loom_tensor **v;
  loom_tensor *small[16];
} tensor_list;

static int list_of(const loom_named_tensor *g, size_t n, tensor_list *l, const char *who) {
  l->v = n <= 16 ? l->small : loom__malloc(LOOM_POOL_COMPUTE, n * sizeof *l->v);
  if (!l->v) return loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
  for (size_t i = 0; i < n; i++) l->v[i] = g[i].tensor;
  return LOOM_OK;
}

static void list_free(tensor_list *l) {
  if (l->v != l->small) loom__free(l->v);
}

int loom_amp_convert_gradients(const loom_named_tensor *grads, size_t n, loom_dtype dt,
                               loom_tensor **out) {
  static const char *who = "loom_amp_convert_gradients";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  for (size_t i = 0; i < n; i++) out[i] = NULL;
  if (n && !grads) return loom__fail(LOOM_EINVAL, "%s: grads is NULL", who);
  if (!loom_dtype_is_float(dt))
    return loom__fail(LOOM_EDTYPE, "%s: target dtype %s is not f32, f16 or bf16", who,
                      loom_dtype_name(dt));
  int rc = LOOM_OK;
  for (size_t i = 0; i < n && !rc; i++) {
    loom_tensor *g = grads[i].tensor;
    if (!g) continue;
    if (!(rc = loom_tensor_check(g, who)) && !loom_dtype_is_float(g->dtype))
      rc = loom__fail(LOOM_EDTYPE, "%s: gradient '%s' has dtype %s", who,
                      grads[i].name ? grads[i].name : "?", loom_dtype_name(g->dtype));
    if (!rc) {
      if (g->dtype == dt) out[i] = loom_tensor_retain(g);
      else rc = loom_tensor_cast(g, dt, &out[i]);
    }
  }
  for (size_t i = 0; i < n && rc; i++) {
    loom_tensor_free(out[i]);
    out[i] = NULL;
  }
  return rc;
}

int loom_amp_prepare_gradients(loom_scaler *scaler, const loom_named_tensor *grads, size_t n,
                               bool check_overflow, loom_tensor **f32, bool *ok) {
  static const char *who = "loom_amp_prepare_gradients";
  if (f32)
    for (size_t i = 0; i < n; i++) f32[i] = NULL;
  if (!ok) return loom__fail(LOOM_EINVAL, "%s: ok is NULL", who);
  *ok = false;
  if (n && !grads) return loom__fail(LOOM_EINVAL, "%s: grads is NULL", who);
  bool found = false;
  if (scaler) {
    tensor_list l;
    int rc = list_of(grads, n, &l, who);
    if (rc) return rc;
    rc = loom_scaler_unscale(scaler, l.v, n, &found);
    list_free(&l);
    if (rc) return rc;
  }
  if (f32) {
    int rc = loom_amp_convert_gradients(grads, n, LOOM_F32, f32);
    if (rc) return rc;
  }
  *ok = !(check_overflow && found);
  return LOOM_OK;
}

int loom_amp_prepare_gradients_ctx(loom_amp_context *ctx, const loom_named_tensor *grads,
                                   size_t n, bool check_overflow, loom_tensor **f32, bool *ok) {
  int rc = loom_amp_context_validate(ctx);
  if (rc) {
    if (ok) *ok = false;
    if (f32)
      for (size_t i = 0; i < n; i++) f32[i] = NULL;
    return rc;
  }
  if (!ctx->needs_unscaling) /* already unscaled, or never scaled: convert only */
    return loom_amp_prepare_gradients(NULL, grads, n, check_overflow, f32, ok);
  if ((rc = loom_amp_prepare_gradients(ctx->scaler, grads, n, check_overflow, f32, ok)))
    return rc;
  ctx->needs_unscaling = false;
  return LOOM_OK;
}

/* ---- compatibility ------------------------------------------------------------------------ */

static const loom_named_tensor *find(const loom_named_tensor *v, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (v[i].name && strcmp(v[i].name, name) == 0) return &v[i];
  return NULL;
}

static int fail_compat(bool *compatible, int code) {
  if (compatible) *compatible = false;
  return code;
}

int loom_amp_ensure_gradient_compatibility(const loom_named_tensor *params, size_t n_params,
                                           const loom_named_tensor *grads, size_t n_grads,
                                           bool *compatible) {
  static const char *who = "loom_amp_ensure_gradient_compatibility";
  if (compatible) *compatible = false;
  if ((n_params && !params) || (n_grads && !grads))
    return loom__fail(LOOM_EINVAL, "%s: %s is NULL", who, n_params && !params ? "params" : "grads");
  for (size_t i = 0; i < n_params; i++) {
    if (!params[i].name)
      return fail_compat(compatible, loom__fail(LOOM_EINVAL, "%s: parameter %zu has no name",
                                                who, i));
    if (find(params + i + 1, n_params - i - 1, params[i].name))
      return fail_compat(compatible, loom__fail(LOOM_EINVAL, "%s: parameter '%s' appears twice",
                                                who, params[i].name));
  }
  for (size_t i = 0; i < n_grads; i++) {
    const loom_named_tensor *g = &grads[i];
    if (!g->name)
      return fail_compat(compatible, loom__fail(LOOM_EINVAL, "%s: gradient %zu has no name",
                                                who, i));
    if (find(grads + i + 1, n_grads - i - 1, g->name))
      return fail_compat(compatible, loom__fail(LOOM_EINVAL, "%s: gradient '%s' appears twice",
                                                who, g->name));
    if (!g->tensor) continue;
    const loom_named_tensor *p = find(params, n_params, g->name);
    int rc = LOOM_OK;
    if (!p)
      rc = loom__fail(LOOM_ENOTFOUND, "%s: gradient '%s' has no parameter of that name", who,
                      g->name);
    else if (!p->tensor)
      rc = loom__fail(LOOM_EINVAL, "%s: parameter '%s' is NULL", who, g->name);
    if (!rc && !(rc = loom_tensor_check(g->tensor, who)))
      rc = loom_tensor_check(p->tensor, who);
    if (rc) return fail_compat(compatible, rc);
    if (g->tensor->dtype != p->tensor->dtype)
      return fail_compat(compatible,
                         loom__fail(LOOM_EDTYPE, "%s: gradient of '%s' is %s, the parameter is %s",
                                    who, g->name, loom_dtype_name(g->tensor->dtype),
                                    loom_dtype_name(p->tensor->dtype)));
    if (!loom_tensor_same_shape(g->tensor, p->tensor)) {
      char a[96], b[96];
      return fail_compat(
          compatible,
          loom__fail(LOOM_ESHAPE, "%s: gradient of '%s' has shape %s, the parameter %s", who,
                     g->name, loom__shape_str(g->tensor->ndim, g->tensor->shape, a, sizeof a),
                     loom__shape_str(p->tensor->ndim, p->tensor->shape, b, sizeof b)));
    }
  }
  if (compatible) *compatible = true;
  return LOOM_OK;
}

/* ---- clipping after unscaling ------------------------------------------------------------- */

typedef struct clip_ctx {
  unsigned char *base;
  loom_dtype dt;
  double sumsq;
  float coef;
} clip_ctx;

static void sq_one(size_t off, void *ctx) {
  clip_ctx *c = ctx;
  double v = loom__load_f64(c->base, c->dt, off);
  c->sumsq += v * v;
}

static void mul_one(size_t off, void *ctx) {
  clip_ctx *c = ctx;
  loom__store_f64(c->base, c->dt, off, (float)loom__load_f64(c->base, c->dt, off) * c->coef);
}

static void for_each(loom_tensor *t, void (*fn)(size_t, void *), clip_ctx *c) {
  c->base = t->storage->data;
  c->dt = t->dtype;
  loom__for_each_offset(t->ndim, t->shape, t->strides, t->offset, fn, c);
}

int loom_amp_clip_grad_norm(loom_tensor *const *grads, size_t n, double max_norm,
                            float *total_norm) {
  static const char *who = "loom_amp_clip_grad_norm";
  if (!(max_norm >= 0) || isinf(max_norm))
    return loom__fail(LOOM_EINVAL, "%s: max_norm = %g must be finite and >= 0", who, max_norm);
  int rc = loom__amp_check_tensors(who, grads, n);
  if (rc) return rc;
  clip_ctx c = {0};
  for (size_t i = 0; i < n; i++) {
    loom_tensor *g = grads[i];
    if (!g) continue;
    if (g->dtype == LOOM_F32 && loom_tensor_is_contiguous(g)) { /* the common case, fast */
      const float *p = loom_tensor_data(g);
      size_t m = loom_tensor_numel(g);
      double s = 0;
      for (size_t j = 0; j < m; j++) s += (double)p[j] * p[j];
      c.sumsq += s;
    } else {
      for_each(g, sq_one, &c);
    }
  }
  float total = (float)sqrt(c.sumsq);
  if (total_norm) *total_norm = total;
  if (!isfinite(total)) return LOOM_OK;
  c.coef = (1.0f / (total + 1e-6f)) * (float)max_norm; /* as optim's loom_clip_coef */
  if (c.coef >= 1.0f) return LOOM_OK;
  for (size_t i = 0; i < n; i++) {
    loom_tensor *g = grads[i];
    if (!g) continue;
    if (g->dtype == LOOM_F32 && loom_tensor_is_contiguous(g)) {
      float *p = loom_tensor_data(g);
      size_t m = loom_tensor_numel(g);
      for (size_t j = 0; j < m; j++) p[j] *= c.coef;
    } else {
      for_each(g, mul_one, &c);
    }
  }
  return LOOM_OK;
}
