/* checkpoint.c: activation checkpointing (torch.utils.checkpoint, the reentrant form). The
 * function runs without recording; one node stands for it, holding detached views of its
 * inputs and the autocast state in force; its backward runs the function again with grad on
 * and backpropagates through that graph with a reentrant backward (engine.c), which hands the
 * parameters' gradients to their leaves (hooks included) and the inputs' to the node. */
#include "autograd/autograd_int.h"
#include "loom/autocast.h"

#include <string.h>

typedef struct ckpt {
  loom_checkpoint_fn fn;
  void *user;
  void (*user_free)(void *);
  loom_autocast_mode mode;      /* the autocast state the function ran under */
  const loom_amp_registry *reg; /* NULL: off, or mode's default */
  int n_in;
  loom_tensor *saved[]; /* detached views of the inputs */
} ckpt;

static void ckpt_free(void *p) {
  ckpt *c = p;
  for (int i = 0; i < c->n_in; i++) loom_tensor_free(c->saved[i]);
  if (c->user_free) c->user_free(c->user);
  loom__free(c);
}

/* Run c's function on x under the autocast state of the forward, grad mode on. */
static int rerun(ckpt *c, loom_tensor *const *x, loom_tensor **y) {
  loom_autocast_token tok;
  int depth = loom__grad_mode_suspend();
  int rc = loom_autocast_enter(c->mode, c->reg, &tok);
  if (!rc) {
    rc = c->fn(c->user, x, c->n_in, y);
    int rc2 = loom_autocast_exit(&tok);
    if (!rc) rc = rc2;
  }
  loom__grad_mode_resume(depth);
  return rc;
}

/* Whether input i's gradient reached a leaf's f32 buffer straight (an f32 leaf, or one with an
 * f32 gradient bound: the rule of the engine's gradient sinks, which write it in place, past
 * any cast): the recomputation gives its copy of the input the same kind of buffer, so the
 * writes, and their rounding, are the same. Otherwise (an op's output, a low-precision leaf)
 * the gradient is captured as a node's pending gradient is summed. */
static bool as_leaf(const loom__node *n, int i) {
  const loom_tensor *leaf = n->in[i].leaf;
  const loom__meta *m = leaf ? leaf->autograd : NULL;
  return m && (leaf->dtype == LOOM_F32 || (m->grad && m->grad->dtype == LOOM_F32));
}

static int ckpt_backward(loom__node *n, loom_tensor *gout, loom_tensor **gin) {
  ckpt *c = n->ctx;
  int rc = LOOM_OK, ncap = 0;
  if (loom__backward_capturing())
    return loom__fail(LOOM_EMISUSE, "backward of %s: a checkpoint cannot run under "
                      "loom_autograd_grad (its recomputation accumulates into parameters' "
                      "gradients, as PyTorch's reentrant checkpoint): use loom_backward",
                      n->name);
  size_t bytes = (size_t)c->n_in * sizeof(loom_tensor *);
  loom_tensor **x = loom__calloc(LOOM_POOL_COMPUTE, 3, bytes ? bytes : 1), *y = NULL;
  if (!x) return loom__fail(LOOM_ENOMEM, "backward of %s: out of memory", n->name);
  loom_tensor **cap = x + c->n_in, **grads = cap + c->n_in;
  int *idx = loom__calloc(LOOM_POOL_COMPUTE, (size_t)c->n_in + 1, sizeof *idx);
  LOOM_TRY_ALLOC(idx, "the checkpoint's inputs");
  for (int i = 0; i < c->n_in; i++) {
    LOOM_TRY(loom_tensor_detach(c->saved[i], &x[i]));
    if (!loom__node_needs(n, i)) continue;
    LOOM_TRY(loom_tensor_set_requires_grad(x[i], true));
    if (as_leaf(n, i)) { /* a leaf as the input was: its gradient, in an f32 buffer, later */
      LOOM_TRY(loom_tensor_empty(LOOM_F32, x[i]->ndim, x[i]->shape, &grads[i]));
      LOOM_TRY(loom__tensor_set_grad_f32(x[i], grads[i]));
      loom_tensor_free(grads[i]);
      grads[i] = NULL;
      LOOM_TRY(loom_tensor_zero_grad_lazy(x[i]));
      continue;
    }
    cap[ncap] = x[i];
    idx[ncap++] = i;
  }
  LOOM_TRY(rerun(c, x, &y));
  if (y->ndim != n->out_ndim || y->dtype != n->out_dtype ||
      memcmp(y->shape, n->out_shape, (size_t)y->ndim * sizeof *y->shape)) {
    rc = loom__fail(LOOM_EMISUSE, "backward of %s: the recomputation gave a %d-D %s output, "
                    "the forward a %d-D %s one (the function must do the same on the same "
                    "inputs)", n->name, y->ndim, loom_dtype_name(y->dtype), n->out_ndim,
                    loom_dtype_name(n->out_dtype));
    goto done;
  }
  if (!loom_tensor_requires_grad(y)) goto done; /* nothing inside needs a gradient */
  LOOM_TRY(loom__backward_reentrant(n, y, gout, cap, ncap, grads));
  for (int k = 0; k < ncap; k++) {
    gin[idx[k]] = grads[k];
    grads[k] = NULL;
  }
  for (int i = 0; i < c->n_in; i++) { /* the leaves' gradients, unless nothing reached them */
    loom__meta *m = loom__node_needs(n, i) && as_leaf(n, i) ? x[i]->autograd : NULL;
    if (m && m->grad && !m->grad_lazy_zero) gin[i] = loom_tensor_retain(m->grad);
  }
done:
  for (int i = 0; i < c->n_in; i++) {
    loom_tensor_free(x[i]);
    loom_tensor_free(grads[i]);
  }
  loom_tensor_free(y);
  loom__free(idx);
  loom__free(x);
  return rc;
}

int loom_autograd_checkpoint(const char *name, loom_checkpoint_fn fn, void *ctx,
                             void (*ctx_free)(void *ctx), loom_tensor *const *inputs, int n_in,
                             loom_tensor *const *params, int n_params, loom_tensor **out) {
  static const char *who = "loom_autograd_checkpoint";
  int rc = LOOM_OK;
  ckpt *c = NULL;
  loom_tensor **all = NULL, *y = NULL;
  loom__node *nd = NULL;
  if (!name) name = "checkpoint";
  if (out) *out = NULL;
  if (!fn || !out || n_in < 1 || !inputs || n_params < 0 || (n_params > 0 && !params)) {
    rc = loom__fail(LOOM_EINVAL, "%s (%s): fn, out and at least one input must be given, and "
                    "params when n_params > 0 (n_in %d, n_params %d)", who, name, n_in, n_params);
    goto fail;
  }
  for (int i = 0; i < n_in && !rc; i++) rc = loom_tensor_check(inputs[i], who);
  for (int i = 0; i < n_params && !rc; i++) rc = loom_tensor_check(params[i], who);
  if (rc) goto fail;
  if (!loom__ag_needs(inputs, n_in) && !loom__ag_needs(params, n_params)) {
    rc = fn(ctx, inputs, n_in, out); /* nothing to save: it simply runs (no-grad, eval) */
    goto fail;
  }
  c = loom__calloc(LOOM_POOL_COMPUTE, 1, sizeof *c + (size_t)n_in * sizeof(loom_tensor *));
  all = loom__calloc(LOOM_POOL_COMPUTE, (size_t)(n_in + n_params), sizeof *all);
  if (!c || !all) {
    rc = loom__fail(LOOM_ENOMEM, "%s (%s): out of memory", who, name);
    goto fail;
  }
  *c = (ckpt){fn, ctx, ctx_free, loom_autocast_get_mode(), loom_autocast_get_registry(), n_in};
  ctx = NULL, ctx_free = NULL; /* c's now */
  for (int i = 0; i < n_in && !rc; i++) rc = loom_tensor_detach(inputs[i], &c->saved[i]);
  if (rc) goto fail;
  loom_no_grad_enter();
  rc = fn(c->user, inputs, n_in, &y);
  (void)loom_no_grad_exit();
  if (rc) goto fail;
  if (rc = loom_tensor_check(y, who), rc) goto fail;
  if (!loom_dtype_is_float(y->dtype)) {
    rc = loom__fail(LOOM_EDTYPE, "%s (%s): the output must be floating, not %s", who, name,
                    loom_dtype_name(y->dtype));
    goto fail;
  }
  if (y->autograd) { /* the function gave back a tensor of a graph (an input): a fresh one */
    loom_tensor *d = NULL;
    if ((rc = loom_tensor_detach(y, &d))) goto fail;
    loom_tensor_free(y);
    y = d;
  }
  memcpy(all, inputs, (size_t)n_in * sizeof *all);
  if (n_params) memcpy(all + n_in, params, (size_t)n_params * sizeof *all);
  if ((rc = loom__node_new(LOOM_OPK_CUSTOM, name, all, n_in + n_params, ckpt_backward, &nd)))
    goto fail;
  nd->recompute = true;
  nd->ctx = c;
  nd->ctx_free = ckpt_free;
  c = NULL;
  if ((rc = loom__node_attach(nd, y))) goto fail; /* attach released nd */
  loom__free(all);
  *out = y;
  return LOOM_OK;
fail:
  if (c) ckpt_free(c);
  if (ctx_free && ctx) ctx_free(ctx);
  loom__free(all);
  loom_tensor_free(y);
  return rc;
}
