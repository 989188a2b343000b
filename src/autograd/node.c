/* node.c: recording nodes on the tape: creation with one edge per input that requires grad,
 * saved views, attaching a node to its output, iterative release, and custom functions. */
#include "autograd/autograd_int.h"

#include <string.h>

static _Atomic uint64_t next_seq = 1;

int loom__node_new(loom_op_kind kind, const char *name, loom_tensor *const *in, int n,
                   loom__backward_fn bwd, loom__node **out) {
  *out = NULL;
  loom__node *nd = loom__calloc(LOOM_POOL_COMPUTE, 1, sizeof *nd + (size_t)n * sizeof(loom__edge));
  if (!nd) return loom__fail(LOOM_ENOMEM, "%s: out of memory recording the node", name);
  atomic_init(&nd->refcount, 1);
  nd->kind = kind;
  nd->name = name;
  nd->backward = bwd;
  nd->n_in = n;
  nd->seq = atomic_fetch_add_explicit(&next_seq, 1, memory_order_relaxed);
  for (int i = 0; i < n; i++) {
    loom_tensor *t = in[i];
    if (!t) continue;
    loom__edge *e = &nd->in[i];
    e->ndim = t->ndim;
    memcpy(e->shape, t->shape, sizeof e->shape);
    e->dtype = t->dtype;
    loom__meta *m = t->autograd;
    if (!m || !m->requires_grad) continue;
    if (m->grad_fn) {
      e->node = m->grad_fn;
      atomic_fetch_add(&e->node->refcount, 1);
    } else {
      e->leaf = loom_tensor_retain(t);
    }
  }
  *out = nd;
  return LOOM_OK;
}

int loom__node_save(loom__node *n, int slot, const loom_tensor *t) {
  if (!t) return LOOM_OK;
  /* A parameter (a leaf that requires grad) is kept itself: it cannot form a cycle through this
   * node, and backward then reads whatever storage it has then (FSDP frees a unit's gathered
   * parameters after its forward and points them at a new gather before its backward; a view
   * would keep the first gather alive until backward). Anything else is kept as a view, which
   * an op's own output needs (saving the output itself would be a cycle). */
  if (t->autograd && loom_tensor_is_leaf(t) && loom_tensor_requires_grad(t)) {
    n->saved[slot] = loom_tensor_retain((loom_tensor *)t);
    return LOOM_OK;
  }
  return loom__tensor_view(t, t->ndim, t->shape, t->strides, t->offset, &n->saved[slot]);
}

int loom__node_attach(loom__node *n, loom_tensor *out) {
  loom__meta *m = loom__meta_get(out);
  if (!m) {
    const char *name = n->name; /* the caller's string, not the node's */
    loom__node_release(n);
    return loom__fail(LOOM_ENOMEM, "%s: out of memory recording the node", name);
  }
  n->out_dtype = out->dtype;
  n->out_ndim = out->ndim;
  memcpy(n->out_shape, out->shape, sizeof n->out_shape);
  loom__node_release(m->grad_fn);
  m->grad_fn = n;
  m->requires_grad = true;
  return LOOM_OK;
}

/* Free what a node holds for backward (saved views, ctx); the graph structure stays. */
static void node_spend(loom__node *n) {
  for (int i = 0; i < LOOM__NODE_SAVED; i++) {
    loom_tensor_free(n->saved[i]);
    n->saved[i] = NULL;
  }
  if (n->ctx_free && n->ctx) n->ctx_free(n->ctx);
  n->ctx = NULL;
}

void loom__node_spend(loom__node *n) {
  node_spend(n);
  n->released = true;
}

void loom__node_release(loom__node *n) {
  /* Nodes whose count drops to zero are chained through free_next, so a chain of any
   * length is freed without recursion. */
  loom__node *todo = NULL;
  if (n && atomic_fetch_sub(&n->refcount, 1) == 1) {
    n->free_next = NULL;
    todo = n;
  }
  while (todo) {
    loom__node *x = todo;
    todo = x->free_next;
    node_spend(x);
    loom__hooks_free(&x->hooks);
    loom_tensor_free(x->bwd_grad);
    for (int i = 0; i < x->n_in; i++) {
      loom_tensor_free(x->in[i].leaf);
      loom__node *c = x->in[i].node;
      if (c && atomic_fetch_sub(&c->refcount, 1) == 1) {
        c->free_next = todo;
        todo = c;
      }
    }
    loom__free(x);
  }
}

/* ---- custom functions ----------------------------------------------------------------- */

typedef struct custom_ctx {
  loom_custom_backward_fn bwd;
  void *user;
  void (*user_free)(void *);
} custom_ctx;

static void custom_free(void *p) {
  custom_ctx *c = p;
  if (c->user_free) c->user_free(c->user);
  loom__free(c);
}

static int custom_backward(loom__node *n, loom_tensor *gout, loom_tensor **gin) {
  custom_ctx *c = n->ctx;
  bool needs_small[8] = {0}, *needs = needs_small;
  if (n->n_in > 8) {
    needs = loom__malloc(LOOM_POOL_COMPUTE, (size_t)n->n_in * sizeof *needs);
    if (!needs) return loom__fail(LOOM_ENOMEM, "%s: out of memory in backward", n->name);
  }
  for (int i = 0; i < n->n_in; i++) needs[i] = loom__node_needs(n, i);
  int rc = c->bwd(c->user, gout, n->n_in, needs, gin);
  if (needs != needs_small) loom__free(needs);
  return rc;
}

int loom_autograd_record_custom(const char *name, loom_tensor **inputs, int n_in,
                                loom_tensor *output, loom_custom_backward_fn bwd, void *ctx,
                                void (*ctx_free)(void *ctx)) {
  static const char *who = "loom_autograd_record_custom";
  int rc = LOOM_OK;
  loom__node *nd = NULL;
  if (!name) name = "custom";
  if (!bwd || n_in < 0 || (n_in > 0 && !inputs)) {
    rc = loom__fail(LOOM_EINVAL, "%s (%s): bwd and inputs must be given", who, name);
    goto fail;
  }
  if ((rc = loom_tensor_check(output, who))) goto fail;
  for (int i = 0; i < n_in; i++)
    if ((rc = loom_tensor_check(inputs[i], who))) goto fail;
  if (output->autograd && ((loom__meta *)output->autograd)->grad_fn) {
    rc = loom__fail(LOOM_EMISUSE, "%s (%s): the output is already part of a graph (made by %s)",
                    who, name, ((loom__meta *)output->autograd)->grad_fn->name);
    goto fail;
  }
  if (!loom__ag_needs(inputs, n_in)) goto fail; /* nothing to record: still frees ctx */
  if (!loom_dtype_is_float(output->dtype)) {
    rc = loom__fail(LOOM_EDTYPE, "%s (%s): the output must be floating, not %s", who, name,
                    loom_dtype_name(output->dtype));
    goto fail;
  }
  custom_ctx *c = loom__malloc(LOOM_POOL_COMPUTE, sizeof *c);
  if (!c) {
    rc = loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
    goto fail;
  }
  *c = (custom_ctx){bwd, ctx, ctx_free};
  if ((rc = loom__node_new(LOOM_OPK_CUSTOM, name, inputs, n_in, custom_backward, &nd))) {
    loom__free(c);
    goto fail;
  }
  nd->ctx = c;
  nd->ctx_free = custom_free;
  return loom__node_attach(nd, output);
fail:
  if (ctx_free && ctx) ctx_free(ctx);
  return rc;
}
