/* amp_grad.c: gradients on their way to the optimizer (AmpAutogradHelper): preparation
 * (unscale + inf/NaN check in one pass, then f32), dtype conversion and the compatibility check
 * of gradients against parameters. Clipping is optim's (loom_clip_grad_norm_tensors). */
#include "amp/amp_int.h"
#include "core/tensor_int.h"

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
