/* amp_graph.c: the AMP computation graph (the spec's ComputationGraph with CreateAmpGraph and
 * RunAmpBackward): a loss, the autocast mode and registry it was recorded under, and the named
 * parameters whose gradients an AMP backward gives back. */
#include "amp/amp_int.h"
#include "loom/autograd.h"

#include <string.h>

struct loom_amp_graph {
  loom_tensor *root;      /* retained */
  loom_amp_context ctx;
  size_t n;
  loom_named_tensor *params; /* tensors retained, names owned */
};

void loom_amp_graph_free(loom_amp_graph *g) {
  if (!g) return;
  for (size_t i = 0; i < g->n; i++) {
    loom__free((char *)g->params[i].name);
    loom_tensor_free(g->params[i].tensor);
  }
  loom__free(g->params);
  loom_tensor_free(g->root);
  loom__free(g);
}

static int check_params(const loom_named_tensor *p, size_t n, const char *who) {
  if (n && !p) return loom__fail(LOOM_EINVAL, "%s: params is NULL", who);
  for (size_t i = 0; i < n; i++) {
    int rc = loom_tensor_check(p[i].tensor, who);
    if (rc) return rc;
    if (!p[i].name) return loom__fail(LOOM_EINVAL, "%s: parameter %zu has no name", who, i);
    if (!loom_tensor_is_leaf(p[i].tensor) || !loom_tensor_requires_grad(p[i].tensor))
      return loom__fail(LOOM_EINVAL, "%s: parameter '%s' is not a leaf that requires grad", who,
                        p[i].name);
    for (size_t j = 0; j < i; j++)
      if (strcmp(p[j].name, p[i].name) == 0)
        return loom__fail(LOOM_EINVAL, "%s: parameter '%s' appears twice", who, p[i].name);
  }
  return LOOM_OK;
}

int loom_amp_graph_create(loom_tensor *root, loom_autocast_mode mode,
                          const loom_amp_registry *registry, const loom_named_tensor *params,
                          size_t n, loom_amp_graph **out) {
  static const char *who = "loom_amp_graph_create";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  loom_amp_context ctx = {.mode = mode, .registry = registry};
  int rc = loom_amp_context_validate(&ctx);
  if (rc || (rc = loom_tensor_check(root, who))) return rc;
  if (!loom_tensor_requires_grad(root))
    return loom__fail(LOOM_EINVAL, "%s: the root does not require grad", who);
  if ((rc = check_params(params, n, who))) return rc;
  loom_amp_graph *g = loom__calloc(LOOM_POOL_COMPUTE, 1, sizeof *g);
  if (!g) return loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
  g->ctx = ctx;
  g->root = loom_tensor_retain(root);
  if (n && !(g->params = loom__calloc(LOOM_POOL_COMPUTE, n, sizeof *g->params))) goto oom;
  for (size_t i = 0; i < n; i++, g->n++) {
    size_t len = strlen(params[i].name) + 1;
    char *name = loom__malloc(LOOM_POOL_COMPUTE, len);
    if (!name) goto oom;
    memcpy(name, params[i].name, len);
    g->params[i] = (loom_named_tensor){name, loom_tensor_retain(params[i].tensor)};
  }
  *out = g;
  return LOOM_OK;
oom:
  loom_amp_graph_free(g);
  return loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
}

loom_amp_context loom_amp_graph_context(const loom_amp_graph *g) {
  return g ? g->ctx : loom_amp_context_default();
}

int loom_amp_graph_backward(loom_amp_graph *g, loom_scaler *scaler, loom_named_tensor *grads) {
  static const char *who = "loom_amp_graph_backward";
  if (!g) return loom__fail(LOOM_EINVAL, "%s: graph is NULL", who);
  if (g->n && !grads) return loom__fail(LOOM_EINVAL, "%s: grads is NULL", who);
  loom_amp_context ctx = g->ctx;
  ctx.scaler = scaler;
  ctx.needs_unscaling = false;
  int rc = loom_backward_amp_ctx(g->root, &ctx, true);
  if (rc) return rc;
  g->ctx = ctx;
  for (size_t i = 0; i < g->n; i++) { /* a lazily zeroed gradient backward missed: its zeros */
    if ((rc = loom_tensor_settle_grad(g->params[i].tensor))) return rc;
    grads[i] = (loom_named_tensor){g->params[i].name, loom_tensor_grad(g->params[i].tensor)};
  }
  return LOOM_OK;
}
