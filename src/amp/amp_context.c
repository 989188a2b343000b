/* amp_context.c: the AMP autograd context (AmpAutogradContext) and the AMP forms of backward
 * (AmpTensorExtensions): backward of the scaled loss, gradients of outputs with respect to
 * inputs through the scale, and whether a graph holds low-precision tensors. */
#include "amp/amp_int.h"
#include "autograd/autograd_int.h"
#include "loom/ops.h"

#include <string.h>

/* ---- the context -------------------------------------------------------------------------- */

loom_amp_context loom_amp_context_default(void) {
  return (loom_amp_context){.mode = LOOM_AUTOCAST_BF16};
}

int loom_amp_context_validate(const loom_amp_context *ctx) {
  static const char *who = "loom_amp_context";
  if (!ctx) return loom__fail(LOOM_EINVAL, "%s: ctx is NULL", who);
  if ((unsigned)ctx->mode >= LOOM_AUTOCAST_MODE_COUNT)
    return loom__fail(LOOM_EINVAL, "%s: mode = %d is not an autocast mode", who, (int)ctx->mode);
  if (ctx->needs_unscaling && !ctx->scaler)
    return loom__fail(LOOM_EINVAL, "%s: needs_unscaling is set but there is no scaler", who);
  if (ctx->scaler) return loom__scaler_check(ctx->scaler, who);
  return LOOM_OK;
}

const loom_amp_registry *loom_amp_context_registry(const loom_amp_context *ctx) {
  if (!ctx) return NULL;
  return ctx->registry ? ctx->registry : loom_amp_registry_default(ctx->mode);
}

/* ---- backward of the scaled loss ---------------------------------------------------------- */

static int check_scalar_output(loom_tensor *t, const char *who) {
  int rc = loom_tensor_check(t, who);
  if (rc) return rc;
  if (loom_tensor_numel(t) != 1)
    return loom__fail(LOOM_ESHAPE, "%s: the loss has %zu elements, not one", who,
                      loom_tensor_numel(t));
  if (!loom_tensor_requires_grad(t))
    return loom__fail(LOOM_EINVAL, "%s: the loss does not require grad", who);
  return LOOM_OK;
}

/* *out = t * scale on the tape, in f32 (t cast first if it is not f32). */
static int scaled(loom_tensor *t, float scale, loom_tensor **out) {
  loom_tensor *w = NULL;
  int rc = LOOM_OK;
  if (t->dtype != LOOM_F32 && (rc = loom_cast(t, LOOM_F32, &w))) return rc;
  rc = loom_mul_scalar(w ? w : t, scale, out);
  loom_tensor_free(w);
  return rc;
}

int loom_backward_amp(loom_tensor *loss, loom_scaler *scaler, bool retain_graph) {
  static const char *who = "loom_backward_amp";
  int rc = check_scalar_output(loss, who);
  if (rc) return rc;
  float scale = 1.0f;
  if (scaler && (rc = loom_scaler_scale_value(scaler, &scale))) return rc;
  if (scale == 1.0f) return loom_backward(loss, NULL, retain_graph);
  loom_tensor *s = NULL;
  if ((rc = scaled(loss, scale, &s))) return rc;
  rc = loom_backward(s, NULL, retain_graph);
  loom_tensor_free(s);
  return rc;
}

int loom_backward_amp_ctx(loom_tensor *loss, loom_amp_context *ctx, bool retain_graph) {
  int rc = loom_amp_context_validate(ctx);
  if (rc) return rc;
  if ((rc = loom_backward_amp(loss, ctx->scaler, retain_graph))) return rc;
  if (ctx->scaler) ctx->needs_unscaling = true;
  return LOOM_OK;
}

/* ---- gradients with respect to inputs, through the scale ---------------------------------- */

int loom_grad_amp(loom_tensor *output, loom_tensor *const *inputs, size_t n, loom_scaler *scaler,
                  bool retain_graph, loom_tensor **grads, bool *found_inf) {
  static const char *who = "loom_grad_amp";
  if (!grads) return loom__fail(LOOM_EINVAL, "%s: grads is NULL", who);
  for (size_t k = 0; k < n; k++) grads[k] = NULL;
  if (n < 1 || !inputs) return loom__fail(LOOM_EINVAL, "%s: no inputs (n = %zu)", who, n);
  int rc = check_scalar_output(output, who);
  if (!rc && scaler) rc = loom__scaler_check(scaler, who);
  if (rc) return rc;
  float scale = scaler ? loom_scaler_get_scale(scaler) : 1.0f;
  loom_tensor *s = NULL, *f32[LOOM_AMP_FUNCTION_MAX_IN] = {0}, **g = f32;
  if (n > LOOM_AMP_FUNCTION_MAX_IN) {
    g = loom__calloc(LOOM_POOL_COMPUTE, n, sizeof *g);
    if (!g) return loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
  }
  /* the gradients come back scaled in each input's dtype (where an overflow shows as inf);
   * unscaling them by a power-of-two scale (every preset's) is exact but for subnormals */
  if ((rc = scale == 1.0f ? LOOM_OK : scaled(output, scale, &s))) goto done;
  if ((rc = loom_autograd_grad(s ? s : output, NULL, inputs, n, retain_graph, g))) goto done;
  bool any = false;
  for (size_t k = 0; k < n; k++) {
    bool f = false;
    if (!g[k]) continue;
    if (scale != 1.0f) rc = loom__amp_unscale_tensors(&g[k], 1, 1.0 / (double)scale, &f);
    else rc = loom__amp_has_nonfinite_tensors(&g[k], 1, &f);
    if (rc) goto done;
    any |= f;
  }
  if (found_inf) *found_inf = any;
  for (size_t k = 0; k < n; k++) {
    grads[k] = g[k];
    g[k] = NULL;
  }
done:
  for (size_t k = 0; k < n; k++) loom_tensor_free(g[k]);
  if (g != f32) loom__free(g);
  loom_tensor_free(s);
  return rc;
}

/* ---- does the graph hold low-precision tensors? ------------------------------------------- */

static bool low(loom_dtype dt) { return dt == LOOM_F16 || dt == LOOM_BF16; }

/* A set of visited nodes: open addressing over pointers, grown at half load. */
typedef struct node_set {
  const loom__node **v;
  size_t cap, n;
} node_set;

static size_t slot_of(const node_set *s, const loom__node *p) {
  size_t h = ((uintptr_t)p >> 4) * 0x9e3779b97f4a7c15ull, m = s->cap - 1;
  for (size_t i = h & m;; i = (i + 1) & m)
    if (!s->v[i] || s->v[i] == p) return i;
}

/* 1 if p was added, 0 if present, -1 out of memory. */
static int set_add(node_set *s, const loom__node *p) {
  if (2 * (s->n + 1) > s->cap) {
    node_set t = {loom__calloc(LOOM_POOL_COMPUTE, s->cap ? 2 * s->cap : 64, sizeof *t.v),
                  s->cap ? 2 * s->cap : 64, s->n};
    if (!t.v) return -1;
    for (size_t i = 0; i < s->cap; i++)
      if (s->v[i]) t.v[slot_of(&t, s->v[i])] = s->v[i];
    loom__free(s->v);
    *s = t;
  }
  size_t i = slot_of(s, p);
  if (s->v[i]) return 0;
  s->v[i] = p;
  s->n++;
  return 1;
}

bool loom_needs_amp_backward(const loom_tensor *t) {
  if (!t || !loom_tensor_requires_grad(t)) return false;
  if (low(loom_tensor_dtype(t))) return true;
  const loom__meta *m = t->autograd;
  if (!m || !m->grad_fn) return false; /* an f32 leaf */
  node_set seen = {0};
  const loom__node **stack = NULL;
  size_t top = 0, cap = 0;
  bool found = false;
  const loom__node *n = m->grad_fn;
  if (set_add(&seen, n) < 0) goto done;
  for (;;) {
    if (low(n->out_dtype)) found = true;
    for (int i = 0; i < n->n_in && !found; i++) {
      const loom__edge *e = &n->in[i];
      if (low(e->dtype)) found = true;
      int added = e->node ? set_add(&seen, e->node) : 0;
      if (added < 0) goto done;
      if (!added) continue;
      if (top == cap) {
        size_t c = cap ? 2 * cap : 64;
        const loom__node **v = loom__malloc(LOOM_POOL_COMPUTE, c * sizeof *v);
        if (!v) goto done;
        if (top) memcpy(v, stack, top * sizeof *v);
        loom__free(stack);
        stack = v;
        cap = c;
      }
      stack[top++] = e->node;
    }
    if (found || !top) break;
    n = stack[--top];
  }
done: /* out of memory: answer with what was seen (false unless found) */
  loom__free(stack);
  loom__free(seen.v);
  return found;
}
