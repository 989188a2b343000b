/* amp_hooks.c: unscale + inf/NaN check of each gradient from its autograd hook, run as soon as
 * backward completes the gradient (hot in cache), so the step's scaler work overlaps backward;
 * finish unscales what no hook reached and closes the scaler's unscale for the step. The
 * checking form (loom_amp_check_hooks_create) only reads: the unscale is deferred to the
 * optimizer (loom_scaler_grad_scale, loom_optim_step_scaled). It tracks each parameter's
 * gradient bound (loom_tensor_grad_bound) and reads a gradient only when backward could not
 * bound it. */
#include <float.h>

#include "amp/amp_int.h"
#include "loom/autograd.h"

typedef struct hook_slot {
  loom_amp_unscale_hooks *owner;
  loom_tensor *param; /* retained */
  int id;
  bool done;    /* unscaled this step */
  bool tracked; /* its gradient bound is tracked (the checking form) */
} hook_slot;

struct loom_amp_unscale_hooks {
  loom_scaler *scaler;
  size_t n;
  hook_slot *slots;
  bool armed, found;
  bool defer; /* check only; finish closes the step as loom_scaler_check */
  int error; /* the first failure inside a hook, reported by finish */
};

/* One gradient: unscale + check, or (deferred) the check alone, skipped once something was
 * found (the step is skipped whatever the other gradients hold). */
static int pass(loom_amp_unscale_hooks *h, const hook_slot *sl, loom_tensor *g) {
  static const char *who = "loom_amp_check_hooks";
  double inv = loom_scaler_get_inv_scale(h->scaler);
  if (!h->defer) {
    bool f = false;
    int rc = loom__amp_unscale_tensors(&g, 1, inv, &f);
    h->found |= f;
    return rc;
  }
  int rc = loom__amp_check_tensors(who, &g, 1);
  if (rc || h->found) return rc;
  /* what backward knows: every |x| <= bound, so |x * inv| <= bound * inv (half of FLT_MAX
   * leaves room for the multiply's rounding): nothing to read. A non-finite claim is read
   * anyway (overflow steps are rare, and a gradient zeroed behind autograd's back, through its
   * data pointer, must not skip every later step). */
  loom_grad_bound_kind kind = LOOM_GRAD_BOUND_UNKNOWN;
  double bound = 0;
  if (sl->tracked && (rc = loom_tensor_grad_bound(sl->param, &kind, &bound))) return rc;
  if (kind != LOOM_GRAD_BOUND_FINITE || !(bound * inv <= FLT_MAX / 2))
    h->found = loom__amp_scaled_nonfinite(g, (float)inv);
  return LOOM_OK;
}

static int on_grad(loom_tensor *grad, void *ctx) {
  hook_slot *sl = ctx;
  loom_amp_unscale_hooks *h = sl->owner;
  if (!h->armed || sl->done || h->scaler->stage != LOOM__STAGE_SCALED) return LOOM_OK;
  int rc = pass(h, sl, grad);
  if (rc) return h->error = rc;
  sl->done = true;
  return LOOM_OK;
}

void loom_amp_unscale_hooks_free(loom_amp_unscale_hooks *h) {
  if (!h) return;
  for (size_t i = 0; i < h->n; i++) {
    if (h->slots[i].id >= 0) loom_tensor_remove_hook(h->slots[i].param, h->slots[i].id);
    if (h->slots[i].tracked) loom_tensor_track_grad_bound(h->slots[i].param, false);
    loom_tensor_free(h->slots[i].param);
  }
  loom__free(h->slots);
  loom__free(h);
}

static int create(const char *who, bool defer, loom_scaler *s, loom_tensor *const *params,
                  size_t n, loom_amp_unscale_hooks **out) {
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  int rc = loom__scaler_check(s, who);
  if (rc || (rc = loom__amp_check_tensors(who, params, n))) return rc;
  for (size_t i = 0; i < n; i++)
    if (!params[i] || !loom_tensor_is_leaf(params[i]) || !loom_tensor_requires_grad(params[i]))
      return loom__fail(LOOM_EINVAL, "%s: parameter %zu is not a leaf that requires grad", who, i);
  loom_amp_unscale_hooks *h = loom__calloc(LOOM_POOL_COMPUTE, 1, sizeof *h);
  if (!h || (n && !(h->slots = loom__calloc(LOOM_POOL_COMPUTE, n, sizeof *h->slots)))) {
    loom__free(h);
    return loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
  }
  h->scaler = s;
  h->defer = defer;
  for (size_t i = 0; i < n; i++, h->n++) {
    hook_slot *sl = &h->slots[i];
    *sl = (hook_slot){h, loom_tensor_retain(params[i]), -1, false, false};
    if ((rc = loom_tensor_register_hook(params[i], on_grad, sl, &sl->id))) {
      sl->id = -1;
      h->n++;
      loom_amp_unscale_hooks_free(h);
      return rc;
    }
    if (defer) {
      if ((rc = loom_tensor_track_grad_bound(params[i], true))) {
        h->n++;
        loom_amp_unscale_hooks_free(h);
        return rc;
      }
      sl->tracked = true;
    }
  }
  *out = h;
  return LOOM_OK;
}

int loom__amp_unscale_hooks_create(loom_scaler *s, loom_tensor *const *params, size_t n,
                                  loom_amp_unscale_hooks **out) {
  return create("loom__amp_unscale_hooks_create", false, s, params, n, out);
}

int loom_amp_check_hooks_create(loom_scaler *s, loom_tensor *const *params, size_t n,
                                loom_amp_unscale_hooks **out) {
  return create("loom_amp_check_hooks_create", true, s, params, n, out);
}

int loom_amp_unscale_hooks_arm(loom_amp_unscale_hooks *h) {
  if (!h) return loom__fail(LOOM_EINVAL, "loom_amp_unscale_hooks_arm: hooks is NULL");
  h->armed = true;
  h->found = false;
  h->error = LOOM_OK;
  for (size_t i = 0; i < h->n; i++) h->slots[i].done = false;
  return LOOM_OK;
}

int loom_amp_unscale_hooks_finish(loom_amp_unscale_hooks *h, bool *found_inf) {
  static const char *who = "loom_amp_unscale_hooks_finish";
  if (!h) return loom__fail(LOOM_EINVAL, "%s: hooks is NULL", who);
  bool armed = h->armed;
  h->armed = false;
  if (!armed) return loom__fail(LOOM_EMISUSE, "%s: not armed (call loom_amp_unscale_hooks_arm "
                                "before the step's last backward)", who);
  int rc = h->error ? h->error : loom__scaler_begin_unscale(h->scaler, who);
  if (rc) return rc;
  for (size_t i = 0; i < h->n; i++) { /* gradients no hook reached (not used this step) */
    hook_slot *sl = &h->slots[i];
    if (sl->done) continue;
    if ((rc = loom_tensor_settle_grad(sl->param))) return rc; /* a lazy zero: zeros, checked */
    loom_tensor *g = loom_tensor_grad(sl->param);
    if (!g) continue;
    if ((rc = pass(h, sl, g))) return rc;
  }
  if (h->defer) loom__scaler_mark_checked(h->scaler);
  else loom__scaler_mark_unscaled(h->scaler);
  if (found_inf) *found_inf = h->found;
  return LOOM_OK;
}
