/* meta.c: per-tensor autograd state (requires_grad, grad_fn, the leaf gradient and its hooks),
 * grad mode and the no-grad scope, detach, and the release hook core calls when a tensor
 * with autograd state is freed. */
#include "autograd/autograd_int.h"

#include <string.h>

static _Thread_local int no_grad_depth;

static void meta_release(loom_tensor *t) {
  loom__meta *m = t->autograd;
  t->autograd = NULL;
  if (!m) return;
  loom_tensor_free(m->grad);
  loom__hooks_free(&m->hooks);
  loom__node_release(m->grad_fn);
  loom__free(m);
}

/* Core calls this pointer when it frees a tensor that has autograd state. It is set before
 * main() runs, so no thread ever sees it change. */
__attribute__((constructor)) static void install_release_hook(void) {
  loom__tensor_autograd_release = meta_release;
}

loom__meta *loom__meta_get(loom_tensor *t) {
  if (!t->autograd) t->autograd = loom__calloc(LOOM_POOL_COMPUTE, 1, sizeof(loom__meta));
  return t->autograd;
}

static const loom__meta *meta_of(const loom_tensor *t) {
  return (t && t->magic == LOOM__TENSOR_MAGIC) ? t->autograd : NULL;
}

bool loom_grad_enabled(void) { return no_grad_depth == 0; }
void loom_no_grad_enter(void) { no_grad_depth++; }
int loom_no_grad_exit(void) {
  if (no_grad_depth == 0)
    return loom__fail(LOOM_EMISUSE, "loom_no_grad_exit: no matching loom_no_grad_enter");
  no_grad_depth--;
  return LOOM_OK;
}
void loom__grad_mode_push(void) { no_grad_depth++; }
void loom__grad_mode_pop(void) { no_grad_depth--; }
int loom__grad_mode_suspend(void) {
  int d = no_grad_depth;
  no_grad_depth = 0;
  return d;
}
void loom__grad_mode_resume(int depth) { no_grad_depth = depth; }

bool loom__ag_needs(loom_tensor *const *in, int n) {
  if (no_grad_depth) return false;
  for (int i = 0; i < n; i++) {
    const loom__meta *m = meta_of(in[i]);
    if (m && m->requires_grad) return true;
  }
  return false;
}

int loom_tensor_set_requires_grad(loom_tensor *t, bool requires_grad) {
  int rc = loom_tensor_check(t, "loom_tensor_set_requires_grad");
  if (rc) return rc;
  if (!loom_dtype_is_float(t->dtype))
    return loom__fail(LOOM_EDTYPE,
                      "loom_tensor_set_requires_grad: only floating tensors can require "
                      "grad, not %s",
                      loom_dtype_name(t->dtype));
  loom__meta *m = t->autograd;
  if (m && m->grad_fn) {
    if (requires_grad) return LOOM_OK;
    return loom__fail(LOOM_EMISUSE,
                      "loom_tensor_set_requires_grad: the tensor is the output of %s, not a "
                      "leaf; detach it instead",
                      m->grad_fn->name);
  }
  if (!m && !requires_grad) return LOOM_OK;
  if (!(m = loom__meta_get(t)))
    return loom__fail(LOOM_ENOMEM, "loom_tensor_set_requires_grad: out of memory");
  m->requires_grad = requires_grad;
  return LOOM_OK;
}

bool loom_tensor_requires_grad(const loom_tensor *t) {
  const loom__meta *m = meta_of(t);
  return m && m->requires_grad;
}

bool loom_tensor_is_leaf(const loom_tensor *t) {
  const loom__meta *m = meta_of(t);
  return !m || !m->grad_fn;
}

void loom__grad_settle_zero(loom__meta *m) {
  m->grad_lazy_zero = false;
  if (!loom__dry()) memset(loom_tensor_data(m->grad), 0, loom_tensor_nbytes(m->grad)); /* contiguous */
  loom__bound_zero(m);
}

loom_tensor *loom_tensor_grad(const loom_tensor *t) {
  const loom__meta *m = meta_of(t);
  return m ? m->grad : NULL;
}

int loom_tensor_settle_grad(loom_tensor *t) {
  int rc = loom_tensor_check(t, "loom_tensor_settle_grad");
  if (rc) return rc;
  loom__meta *m = t->autograd;
  if (m && m->grad && m->grad_lazy_zero) loom__grad_settle_zero(m);
  return LOOM_OK;
}

const char *loom_tensor_grad_fn_name(const loom_tensor *t) {
  const loom__meta *m = meta_of(t);
  return m && m->grad_fn ? m->grad_fn->name : NULL;
}

static int set_grad(loom_tensor *t, loom_tensor *grad, bool f32_ok);

int loom_tensor_set_grad(loom_tensor *t, loom_tensor *grad) { return set_grad(t, grad, false); }

int loom__tensor_set_grad_f32(loom_tensor *t, loom_tensor *grad) {
  return set_grad(t, grad, true);
}

/* A live leaf tensor (LOOM_EMISUSE naming the op that made it otherwise). */
static int check_leaf(loom_tensor *t, const char *who) {
  int rc = loom_tensor_check(t, who);
  if (rc) return rc;
  if (!loom_tensor_is_leaf(t))
    return loom__fail(LOOM_EMISUSE, "%s: the tensor is the output of %s, not a leaf", who,
                      loom_tensor_grad_fn_name(t));
  return LOOM_OK;
}

static int set_grad(loom_tensor *t, loom_tensor *grad, bool f32_ok) {
  static const char *who = "loom_tensor_set_grad";
  int rc = check_leaf(t, who);
  if (rc) return rc;
  if (grad) {
    if ((rc = loom_tensor_check(grad, who))) return rc;
    if (grad->dtype != t->dtype && !(f32_ok && grad->dtype == LOOM_F32))
      return loom__fail(LOOM_EDTYPE, "%s: gradient dtype %s differs from the tensor's %s", who,
                        loom_dtype_name(grad->dtype), loom_dtype_name(t->dtype));
    if (!loom_tensor_same_shape(grad, t)) {
      char a[96], b[96];
      return loom__fail(LOOM_ESHAPE, "%s: gradient shape %s differs from the tensor's %s", who,
                        loom__shape_str(grad->ndim, grad->shape, a, sizeof a),
                        loom__shape_str(t->ndim, t->shape, b, sizeof b));
    }
    if (!loom_tensor_is_contiguous(grad))
      return loom__fail(LOOM_EINVAL, "%s: the gradient buffer must be contiguous", who);
  }
  loom__meta *m = loom__meta_get(t);
  if (!m) return loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
  loom_tensor_retain(grad);
  loom_tensor_free(m->grad);
  m->grad = grad;
  m->grad_lazy_zero = false;
  loom__bound_forget(m);
  return LOOM_OK;
}

int loom_tensor_zero_grad(loom_tensor *t) {
  int rc = loom_tensor_check(t, "loom_tensor_zero_grad");
  if (rc) return rc;
  loom__meta *m = t->autograd;
  if (m && m->grad) loom__grad_settle_zero(m); /* contiguous, all-zero bits */
  return LOOM_OK;
}

int loom_tensor_zero_grad_lazy(loom_tensor *t) {
  int rc = loom_tensor_check(t, "loom_tensor_zero_grad_lazy");
  if (rc) return rc;
  loom__meta *m = t->autograd;
  if (m && m->grad) {
    m->grad_lazy_zero = true;
    loom__bound_zero(m);
  }
  return LOOM_OK;
}

/* ---- gradient bounds ---- */

void loom__bound_forget(loom__meta *m) {
  m->bound_kind = LOOM_GRAD_BOUND_UNKNOWN;
  m->bound = 0;
}

void loom__bound_zero(loom__meta *m) {
  m->bound_kind = LOOM_GRAD_BOUND_FINITE;
  m->bound = 0;
}

static _Thread_local double bound_seconds;
static _Thread_local uint64_t bound_count;

void loom__bound_spent(double seconds) {
  bound_seconds += seconds;
  bound_count++;
}

void loom_grad_bound_cost(double *seconds, uint64_t *count) {
  if (seconds) *seconds = bound_seconds;
  if (count) *count = bound_count;
}

int loom_tensor_track_grad_bound(loom_tensor *t, bool on) {
  static const char *who = "loom_tensor_track_grad_bound";
  int rc = check_leaf(t, who);
  if (rc) return rc;
  loom__meta *m = loom__meta_get(t);
  if (!m) return loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
  if (on) m->bound_track++;
  else if (m->bound_track > 0) m->bound_track--;
  return LOOM_OK;
}

int loom_tensor_grad_bound(const loom_tensor *t, loom_grad_bound_kind *kind, double *bound) {
  static const char *who = "loom_tensor_grad_bound";
  int rc = loom_tensor_check(t, who);
  if (rc) return rc;
  if (!kind) return loom__fail(LOOM_EINVAL, "%s: kind is NULL", who);
  const loom__meta *m = meta_of(t);
  *kind = m && m->grad ? m->bound_kind : LOOM_GRAD_BOUND_UNKNOWN;
  if (bound) *bound = *kind == LOOM_GRAD_BOUND_FINITE ? m->bound : 0;
  return LOOM_OK;
}

int loom_tensor_detach(loom_tensor *t, loom_tensor **out) {
  if (out) *out = NULL;
  int rc = loom_tensor_check(t, "loom_tensor_detach");
  if (rc) return rc;
  if (!out) return loom__fail(LOOM_EINVAL, "loom_tensor_detach: out is NULL");
  return loom__tensor_view(t, t->ndim, t->shape, t->strides, t->offset, out);
}

int loom_tensor_register_hook_phase(loom_tensor *t, loom_hook_phase phase, loom_grad_hook_fn fn,
                                    void *ctx, int *id) {
  static const char *who = "loom_tensor_register_hook";
  int rc = loom_tensor_check(t, who);
  if (rc) return rc;
  if (!fn) return loom__fail(LOOM_EINVAL, "%s: fn is NULL", who);
  if (phase != LOOM_HOOK_LOCAL && phase != LOOM_HOOK_REDUCE)
    return loom__fail(LOOM_EINVAL, "%s: phase %d is not a loom_hook_phase", who, (int)phase);
  loom__meta *m = t->autograd;
  if (!m || !m->requires_grad)
    return loom__fail(LOOM_EMISUSE, "%s: the tensor does not require grad", who);
  return loom__hooks_add(m->grad_fn ? &m->grad_fn->hooks : &m->hooks, phase, fn, ctx, id);
}

int loom_tensor_register_hook(loom_tensor *t, loom_grad_hook_fn fn, void *ctx, int *id) {
  return loom_tensor_register_hook_phase(t, LOOM_HOOK_LOCAL, fn, ctx, id);
}

int loom_tensor_remove_hook(loom_tensor *t, int id) {
  static const char *who = "loom_tensor_remove_hook";
  int rc = loom_tensor_check(t, who);
  if (rc) return rc;
  loom__meta *m = t->autograd;
  if (!m) return loom__fail(LOOM_ENOTFOUND, "%s: no hook with id %d", who, id);
  return loom__hooks_remove(m->grad_fn ? &m->grad_fn->hooks : &m->hooks, id);
}

/* ---- hook lists ---------------------------------------------------------------------- */

/* Kept sorted by phase; within a phase, in registration order. */
int loom__hooks_add(loom__hooks *h, loom_hook_phase phase, loom_grad_hook_fn fn, void *ctx,
                    int *id) {
  if (h->n == h->cap) {
    int cap = h->cap ? 2 * h->cap : 4;
    loom__hook *v = loom__malloc(LOOM_POOL_COMPUTE, (size_t)cap * sizeof *v);
    if (!v) return loom__fail(LOOM_ENOMEM, "loom_tensor_register_hook: out of memory");
    if (h->n) memcpy(v, h->v, (size_t)h->n * sizeof *v);
    loom__free(h->v);
    h->v = v;
    h->cap = cap;
  }
  int hid = ++h->next_id, at = h->n;
  while (at > 0 && h->v[at - 1].phase > phase) at--;
  memmove(&h->v[at + 1], &h->v[at], (size_t)(h->n - at) * sizeof *h->v);
  h->v[at] = (loom__hook){fn, ctx, hid, phase};
  h->n++;
  if (id) *id = hid;
  return LOOM_OK;
}

int loom__hooks_remove(loom__hooks *h, int id) {
  for (int i = 0; i < h->n; i++) {
    if (h->v[i].id != id) continue;
    memmove(&h->v[i], &h->v[i + 1], (size_t)(h->n - i - 1) * sizeof *h->v);
    h->n--;
    return LOOM_OK;
  }
  return loom__fail(LOOM_ENOTFOUND, "loom_tensor_remove_hook: no hook with id %d", id);
}

int loom__hooks_run(const loom__hooks *h, loom_tensor *grad) {
  for (int i = 0; i < h->n; i++) {
    int rc = h->v[i].fn(grad, h->v[i].ctx);
    if (rc) return rc;
  }
  return LOOM_OK;
}

void loom__hooks_free(loom__hooks *h) {
  loom__free(h->v);
  memset(h, 0, sizeof *h);
}
