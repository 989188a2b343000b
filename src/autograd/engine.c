/* engine.c: the backward engine. Finds the graph below the loss (iteratively), counts each
 * node's and leaf's incoming edges, then runs nodes from a max-heap keyed by recording order,
 * so the order is deterministic; hands gradients to the leaves (engine_leaf.c accumulates them
 * and fires their hooks when complete) or to the captured inputs; runs queued callbacks at the
 * end. */
#include "autograd/engine_int.h"

#include <limits.h>
#include <math.h>
#include <string.h>

/* ---- per-thread backward state -------------------------------------------------------- */

_Thread_local bwd_state *loom__bwd_cur;
static _Atomic uint64_t next_epoch = 1;

int loom_backward_queue_callback(int (*fn)(void *ctx), void *ctx) {
  static const char *who = "loom_backward_queue_callback";
  if (!loom__bwd_cur)
    return loom__fail(LOOM_EMISUSE, "%s: no backward is running on this thread", who);
  if (!fn) return loom__fail(LOOM_EINVAL, "%s: fn is NULL", who);
  bwd_state *s = loom__bwd_cur;
  while (s->parent) s = s->parent; /* a reentrant backward's callbacks run at the very end */
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 4;
    callback *v = loom__malloc(LOOM_POOL_COMPUTE, (size_t)cap * sizeof *v);
    if (!v) return loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
    if (s->n) memcpy(v, s->cbs, (size_t)s->n * sizeof *v);
    loom__free(s->cbs);
    s->cbs = v;
    s->cap = cap;
  }
  s->cbs[s->n++] = (callback){fn, ctx};
  return LOOM_OK;
}

/* ---- helpers ------------------------------------------------------------------------- */

/* Add gradient g (f32, contiguous, retained by the caller's reference which this takes) into
 * a pending node gradient. */
static int pend_add(loom__node *n, loom_tensor *g) {
  if (!n->bwd_grad) {
    n->bwd_grad = g;
    return LOOM_OK;
  }
  loom_tensor *p = n->bwd_grad;
  size_t cnt = loom_tensor_numel(p);
  bool exclusive = atomic_load(&p->refcount) == 1 && atomic_load(&p->storage->refcount) == 1;
  if (!exclusive) {
    loom_tensor *c = NULL;
    int rc = loom_tensor_clone(p, &c);
    if (rc) {
      loom_tensor_free(g);
      return rc;
    }
    loom_tensor_free(p);
    n->bwd_grad = p = c;
  }
  loom__accumulate_f32(p, loom_tensor_data(g), cnt);
  loom_tensor_free(g);
  return LOOM_OK;
}

/* Capture mode: add g (f32, the input's shape) into the captured gradient of input k. */
static int capture_add(bwd_state *s, int k, const loom_tensor *g) {
  if (!s->cap_out[k]) /* the first contribution as it is (a pending node gradient's rule: so
                       * -0.0 stays -0.0 and the sum is the one the graph would make) */
    return loom_tensor_clone((loom_tensor *)g, &s->cap_out[k]);
  loom__accumulate_f32(s->cap_out[k], loom_tensor_data(g), loom_tensor_numel(g));
  return LOOM_OK;
}

/* Capture mode: node n is about to run with gradient g; capture it for inputs it produced. */
static int capture_node(bwd_state *s, const loom__node *n, const loom_tensor *g) {
  for (int k = 0; k < s->cap_n; k++) {
    const loom__meta *m = s->cap_in[k]->autograd;
    int rc = m && m->grad_fn == n ? capture_add(s, k, g) : LOOM_OK;
    if (rc) return rc;
  }
  return LOOM_OK;
}

static int check_grad(const loom__node *n, int i, const loom_tensor *g) {
  const loom__edge *e = &n->in[i];
  if (g->dtype != LOOM_F32 || !loom_tensor_is_contiguous(g))
    return loom__fail(LOOM_EDTYPE, "backward of %s: gradient %d is not contiguous f32", n->name,
                      i);
  if (g->ndim != e->ndim || memcmp(g->shape, e->shape, (size_t)e->ndim * sizeof *e->shape)) {
    char a[96], b[96];
    return loom__fail(LOOM_ESHAPE,
                      "backward of %s: gradient of input %d has shape %s, the input has %s",
                      n->name, i, loom__shape_str(g->ndim, g->shape, a, sizeof a),
                      loom__shape_str(e->ndim, e->shape, b, sizeof b));
  }
  return LOOM_OK;
}

/* ---- the max-heap of ready nodes, by seq ---------------------------------------------- */

typedef struct heap {
  loom__node **v;
  size_t n;
} heap;

static void heap_push(heap *h, loom__node *x) {
  size_t i = h->n++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (h->v[p]->seq >= x->seq) break;
    h->v[i] = h->v[p];
    i = p;
  }
  h->v[i] = x;
}

static loom__node *heap_pop(heap *h) {
  loom__node *top = h->v[0], *x = h->v[--h->n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= h->n) break;
    if (c + 1 < h->n && h->v[c + 1]->seq > h->v[c]->seq) c++;
    if (x->seq >= h->v[c]->seq) break;
    h->v[i] = h->v[c];
    i = c;
  }
  if (h->n) h->v[i] = x;
  return top;
}

/* ---- backward ------------------------------------------------------------------------ */

/* Discover the graph under root: marks nodes with epoch, counts incoming edges, chains every
 * node through bwd_next (returned in *all) and counts them. Fails without side effects on
 * user-visible state if a spent node is found. */
/* True if epoch is that of a backward enclosing st (st runs from one of its nodes). */
static bool enclosing(const bwd_state *st, uint64_t epoch) {
  for (const bwd_state *p = st->parent; p; p = p->parent)
    if (p->epoch == epoch) return true;
  return false;
}

/* A reentrant backward's graph meets a leaf of an enclosing one (a parameter used inside and
 * outside a checkpointed function): the leaf keeps the enclosing count, raised by this graph's
 * edges, so it is complete (and its hooks fire) once, when every path of both has run. A node
 * of an enclosing graph cannot be shared: its pending gradient belongs to that backward. */
static int discover_leaf(const bwd_state *st, loom_tensor *leaf, uint64_t epoch) {
  loom__meta *m = leaf->autograd;
  if (m->bwd_epoch != epoch) {
    if (!enclosing(st, m->bwd_epoch)) {
      m->bwd_epoch = epoch;
      m->bwd_pending = 0;
    } else if (m->bwd_pending == 0 && m->bwd_seen != epoch) {
      return loom__fail(LOOM_EMISUSE,
                        "loom_backward: a checkpoint's recomputed graph uses a tensor whose "
                        "gradient the enclosing backward has already completed (a parameter "
                        "used outside the checkpointed function too, by ops backward ran "
                        "first); checkpoint a function that holds every use of it");
    }
  }
  m->bwd_seen = epoch;
  m->bwd_pending++;
  return LOOM_OK;
}

static int discover(const bwd_state *st, loom__node *root, uint64_t epoch, loom__node **all,
                    size_t *count) {
  loom__node *stack = root, *list = NULL;
  size_t cnt = 0;
  root->bwd_epoch = epoch;
  root->bwd_deps = 0;
  root->bwd_next = NULL;
  int rc = LOOM_OK;
  /* stack uses free_next (unused while a node is alive); the visited list uses bwd_next */
  root->free_next = NULL;
  while (stack) {
    loom__node *n = stack;
    stack = n->free_next;
    n->bwd_next = list;
    list = n;
    cnt++;
    if (n->released && rc == LOOM_OK)
      rc = loom__fail(LOOM_EMISUSE,
                      "loom_backward: the graph through %s was already spent by a backward "
                      "without retain_graph",
                      n->name);
    for (int i = 0; i < n->n_in; i++) {
      loom__edge *e = &n->in[i];
      if (e->node) {
        loom__node *c = e->node;
        if (c->bwd_epoch != epoch && enclosing(st, c->bwd_epoch) && rc == LOOM_OK)
          rc = loom__fail(LOOM_EMISUSE, "loom_backward: a checkpoint's recomputed graph reaches "
                          "%s, a node of the enclosing backward (its inputs must be detached)",
                          c->name);
        if (c->bwd_epoch != epoch) {
          c->bwd_epoch = epoch;
          c->bwd_deps = 0;
          c->free_next = stack;
          stack = c;
        }
        c->bwd_deps++;
      } else if (e->leaf) {
        int rc2 = discover_leaf(st, e->leaf, epoch);
        if (rc == LOOM_OK) rc = rc2;
      }
    }
  }
  *all = list;
  *count = cnt;
  return rc;
}

static int run_node(loom__node *n, heap *h, bool retain) {
  int rc = LOOM_OK;
  loom_tensor *gout = n->bwd_grad;
  n->bwd_grad = NULL;
  loom_tensor *small[4] = {0}, **gin = small;
  /* No gradient reached n (its consumers wrote into sinks, or gave none): backward is linear
   * in the gradient, so its inputs get none either, unless a hook, a capture or a custom
   * function must see it. */
  bool skip = !gout && !n->hooks.n && !bwd_capturing(loom__bwd_cur) &&
              (n->kind != LOOM_OPK_CUSTOM || n->recompute);
  if (!gout && !skip) rc = loom_tensor_zeros(LOOM_F32, n->out_ndim, n->out_shape, &gout);
  if (rc) return rc;
  if (n->n_in > 4) {
    gin = loom__calloc(LOOM_POOL_COMPUTE, (size_t)n->n_in, sizeof *gin);
    LOOM_TRY_ALLOC(gin, "gradients");
  }
  for (int i = 0; i < n->n_in; i++) n->in[i].bwd_finished = false;
  if (!skip) {
    LOOM_TRY(loom__hooks_run(&n->hooks, gout));
    if (loom__bwd_cur->cap_n) LOOM_TRY(capture_node(loom__bwd_cur, n, gout));
    rc = n->backward(n, gout, gin);
    loom__sinks_settle(n, rc != LOOM_OK);
    if (rc) goto done;
  }
  for (int i = 0; i < n->n_in; i++) {
    loom__edge *e = &n->in[i];
    loom_tensor *g = gin[i];
    gin[i] = NULL;
    if (!e->node && !e->leaf) {
      loom_tensor_free(g);
      continue;
    }
    if (g && (rc = check_grad(n, i, g))) {
      loom_tensor_free(g);
      goto done;
    }
    if (e->node) {
      if (g) LOOM_TRY(pend_add(e->node, g));
      if (--e->node->bwd_deps == 0) heap_push(h, e->node);
    } else if (loom__bwd_cur->cap_n &&
               (!loom__bwd_cur->reentrant || bwd_capture_index(loom__bwd_cur, e->leaf) >= 0)) {
      int k = bwd_capture_index(loom__bwd_cur, e->leaf);
      rc = g && k >= 0 ? capture_add(loom__bwd_cur, k, g) : LOOM_OK;
      loom_tensor_free(g);
      if (rc) goto done;
    } else if (e->bwd_finished) { /* the op completed it already (loom__sink_finish) */
      loom_tensor_free(g);
    } else {
      loom__meta *m = e->leaf->autograd;
      rc = g ? loom__leaf_add(e->leaf, g) : LOOM_OK;
      loom_tensor_free(g);
      if (rc) goto done;
      if (--m->bwd_pending == 0) LOOM_TRY(loom__leaf_done(e->leaf));
    }
  }
  if (!retain) loom__node_spend(n);
done:
  if (gin) {
    for (int i = 0; i < n->n_in; i++) loom_tensor_free(gin[i]);
    if (gin != small) loom__free(gin);
  }
  loom_tensor_free(gout);
  return rc;
}

static int check_loss(loom_tensor *loss, loom_tensor *gout, bool reentrant) {
  static const char *who = "loom_backward";
  int rc = loom_tensor_check(loss, who);
  if (rc) return rc;
  if (!loom_tensor_requires_grad(loss))
    return loom__fail(LOOM_EINVAL,
                      "%s: the loss does not require grad (no leaf of its graph requires "
                      "grad, or it was computed without grad mode)",
                      who);
  char a[96], b[96];
  if (!gout) {
    if (loom_tensor_numel(loss) != 1)
      return loom__fail(LOOM_ESHAPE,
                        "%s: the loss has shape %s (%zu elements); pass grad_output for a "
                        "loss that is not a single value",
                        who, loom__shape_str(loss->ndim, loss->shape, a, sizeof a),
                        loom_tensor_numel(loss));
    return LOOM_OK;
  }
  if ((rc = loom_tensor_check(gout, who))) return rc;
  if (gout->dtype != loss->dtype && !(reentrant && gout->dtype == LOOM_F32))
    return loom__fail(LOOM_EDTYPE, "%s: grad_output dtype %s differs from the loss's %s", who,
                      loom_dtype_name(gout->dtype), loom_dtype_name(loss->dtype));
  if (!loom_tensor_same_shape(gout, loss))
    return loom__fail(LOOM_ESHAPE, "%s: grad_output shape %s differs from the loss's %s", who,
                      loom__shape_str(gout->ndim, gout->shape, a, sizeof a),
                      loom__shape_str(loss->ndim, loss->shape, b, sizeof b));
  return LOOM_OK;
}

/* Backward from loss with the state st (capture mode when st->cap_n > 0). */
static int run_backward(loom_tensor *loss, loom_tensor *grad_output, bool retain_graph,
                        bwd_state *st) {
  int rc = check_loss(loss, grad_output, st->reentrant);
  if (rc) return rc;
  if (loom__bwd_cur && !st->reentrant)
    return loom__fail(LOOM_EMISUSE,
                      "loom_backward: a backward is already running on this thread (called "
                      "from a hook?)");
  loom__meta *m = loss->autograd;
  loom_tensor *g = NULL;
  loom__node *all = NULL;
  size_t count = 0;
  heap h = {0};
  if (grad_output) rc = loom_tensor_cast(grad_output, LOOM_F32, &g);
  else if (!(rc = loom_tensor_empty(LOOM_F32, loss->ndim, loss->shape, &g)))
    rc = loom_tensor_fill(g, 1.0);
  if (rc) return rc;

  st->parent = loom__bwd_cur;
  loom__bwd_cur = st;
  loom__grad_mode_push();
  if (!m->grad_fn) { /* the loss is itself a leaf */
    int k = st->cap_n ? bwd_capture_index(st, loss) : -1;
    if (!st->reentrant) m->bwd_pending = 0;
    if (bwd_capturing(st) || k >= 0) rc = k >= 0 ? capture_add(st, k, g) : LOOM_OK;
    else if (!(rc = loom__leaf_add(loss, g))) rc = loom__leaf_done(loss);
    goto finish;
  }
  uint64_t epoch = atomic_fetch_add_explicit(&next_epoch, 1, memory_order_relaxed);
  st->epoch = epoch;
  LOOM_TRY(discover(st, m->grad_fn, epoch, &all, &count));
  if (st->transfer) /* the checkpoint's leaf edges pass to this graph where it has their uses */
    for (int i = 0; i < st->transfer->n_in; i++) {
      loom__edge *e = &st->transfer->in[i];
      loom__meta *lm = e->leaf ? e->leaf->autograd : NULL;
      if (!lm || lm->bwd_seen != epoch || bwd_capture_index(st, e->leaf) >= 0) continue;
      lm->bwd_pending--; /* this graph's own edges keep it above zero */
      e->bwd_finished = true;
    }
  h.v = loom__malloc(LOOM_POOL_COMPUTE, count * sizeof *h.v);
  LOOM_TRY_ALLOC(h.v, "the ready queue");
  m->grad_fn->bwd_grad = g;
  g = NULL;
  heap_push(&h, m->grad_fn);
  while (h.n) LOOM_TRY(run_node(heap_pop(&h), &h, retain_graph));
finish:
  for (int i = 0; rc == LOOM_OK && i < st->n; i++) rc = st->cbs[i].fn(st->cbs[i].ctx);
done:
  for (loom__node *n = all; n; n = n->bwd_next) { /* after an error, drop pending grads */
    loom_tensor_free(n->bwd_grad);
    n->bwd_grad = NULL;
    /* a lazily zeroed leaf written but not completed: zero again after an error */
    for (int i = 0; i < n->n_in; i++) {
      loom__meta *lm = n->in[i].leaf ? n->in[i].leaf->autograd : NULL;
      if (!lm || !lm->lazy_consumed) continue;
      lm->lazy_consumed = false;
      if (rc) {
        lm->grad_lazy_zero = true;
        loom__bound_zero(lm);
      }
    }
  }
  loom__grad_mode_pop();
  loom__bwd_cur = st->parent;
  loom__free(st->cbs);
  st->cbs = NULL;
  loom__free(h.v);
  loom_tensor_free(g);
  return rc;
}

int loom__backward_reentrant(loom__node *from, loom_tensor *output, loom_tensor *grad_output,
                             loom_tensor *const *inputs, int n, loom_tensor **grads) {
  for (int k = 0; k < n; k++) grads[k] = NULL;
  if (loom__bwd_cur && bwd_capturing(loom__bwd_cur))
    return loom__fail(LOOM_EMISUSE, "backward of %s: a checkpoint cannot run under "
                      "loom_autograd_grad (its recomputation accumulates into parameters' "
                      "gradients; PyTorch's reentrant checkpoint has the same rule): use "
                      "loom_backward", from ? from->name : "a checkpoint");
  bwd_state st = {.cap_in = inputs, .cap_out = grads, .cap_n = n, .reentrant = true,
                  .transfer = from};
  int rc = run_backward(output, grad_output, false, &st);
  for (int k = 0; k < n && rc; k++) {
    loom_tensor_free(grads[k]);
    grads[k] = NULL;
  }
  return rc;
}

bool loom__backward_capturing(void) { return loom__bwd_cur && bwd_capturing(loom__bwd_cur); }

int loom_backward(loom_tensor *loss, loom_tensor *grad_output, bool retain_graph) {
  bwd_state st = {0};
  return run_backward(loss, grad_output, retain_graph, &st);
}

int loom_autograd_grad(loom_tensor *output, loom_tensor *grad_output, loom_tensor *const *inputs,
                       size_t n, bool retain_graph, loom_tensor **grads) {
  static const char *who = "loom_autograd_grad";
  if (!grads) return loom__fail(LOOM_EINVAL, "%s: grads is NULL", who);
  for (size_t k = 0; k < n; k++) grads[k] = NULL;
  if (n < 1 || !inputs) return loom__fail(LOOM_EINVAL, "%s: no inputs (n = %zu)", who, n);
  if (n > INT_MAX) return loom__fail(LOOM_EINVAL, "%s: %zu inputs is too many", who, n);
  for (size_t k = 0; k < n; k++) {
    int rc = loom_tensor_check(inputs[k], who);
    if (rc) return rc;
    if (!loom_tensor_requires_grad(inputs[k]))
      return loom__fail(LOOM_EINVAL, "%s: input %zu does not require grad", who, k);
  }
  bwd_state st = {.cap_in = inputs, .cap_out = grads, .cap_n = (int)n};
  int rc = run_backward(output, grad_output, retain_graph, &st);
  for (size_t k = 0; k < n && rc == LOOM_OK; k++) { /* f32 -> each input's dtype */
    loom_tensor *c = NULL;
    if (!grads[k] || inputs[k]->dtype == LOOM_F32) continue;
    if (!(rc = loom_tensor_cast(grads[k], inputs[k]->dtype, &c))) {
      loom_tensor_free(grads[k]);
      grads[k] = c;
    }
  }
  for (size_t k = 0; k < n && rc; k++) {
    loom_tensor_free(grads[k]);
    grads[k] = NULL;
  }
  return rc;
}
