/* module.c: what every module shares: creation, local parameters, the flat per-dtype arenas
 * (llm.c's malloc_and_point_parameters: one buffer per dtype, each parameter a view at its
 * offset in core's flat layout, gradients at the same offsets in a second buffer), dotted names,
 * parameter lookup, forward, training mode and freeing. */
#include "nn/nn_int.h"
#include "core/layout.h"

#include <stdio.h>
#include <string.h>

int loom__module_new(const char *type, int (*forward)(loom_module *, loom_tensor *, loom_tensor **),
                     loom_module **out) {
  *out = NULL;
  loom_module *m = loom__calloc(LOOM_POOL_COMPUTE, 1, sizeof *m);
  if (!m) return loom__fail(LOOM_ENOMEM, "%s: out of memory", type);
  m->type = type;
  m->forward = forward;
  m->training = true;
  *out = m;
  return LOOM_OK;
}

int loom__module_add_param(loom_module *m, const char *name, loom_tensor *value) {
  m->params[m->n_params++] = (loom__param){.name = name, .value = value};
  return LOOM_OK;
}

void loom__module_drop_arenas(loom_module *m) {
  for (int d = 0; d < LOOM_DTYPE_COUNT; d++) {
    loom_tensor_free(m->arena[d]);
    loom_tensor_free(m->grad_arena[d]);
    m->arena[d] = m->grad_arena[d] = NULL;
    m->arena_numel[d] = 0;
  }
  for (size_t i = 0; i < m->n_flat; i++) {
    loom__free(m->flat[i]->full);
    m->flat[i]->full = NULL;
  }
  loom__free(m->flat);
  m->flat = NULL;
  m->n_flat = 0;
}

void loom__module_release_arenas(loom_module *root) {
  for (size_t i = 0; i < root->n_flat; i++) {
    loom__param *p = root->flat[i];
    (void)loom_tensor_set_grad(p->value, NULL);
    loom_tensor_free(p->grad);
    p->grad = NULL;
    loom__tensor_rebind(p->value, NULL, 0, loom_tensor_dtype(p->value));
  }
  for (int d = 0; d < LOOM_DTYPE_COUNT; d++) {
    loom_tensor_free(root->arena[d]);
    loom_tensor_free(root->grad_arena[d]);
    root->arena[d] = root->grad_arena[d] = NULL;
    root->arena_numel[d] = 0;
  }
}

void loom_module_free(loom_module *m) {
  if (!m) return;
  loom__module_drop_arenas(m);
  for (int i = 0; i < m->n_params; i++) {
    loom_tensor_free(m->params[i].value);
    loom_tensor_free(m->params[i].grad);
  }
  for (int i = 0; i < m->n_children; i++) {
    loom_module_free(m->children[i]);
    loom__free(m->child_names[i]);
  }
  loom__free(m->children);
  loom__free(m->child_names);
  loom__free(m);
}

/* Adopt n children under names (NULL: "0", "1", ...); frees them all on failure. */
int loom__module_adopt(loom_module *m, loom_module **children, size_t n,
                       const char *const *names) {
  int rc = LOOM_OK;
  m->children = loom__calloc(LOOM_POOL_COMPUTE, n, sizeof *m->children);
  m->child_names = loom__calloc(LOOM_POOL_COMPUTE, n, sizeof *m->child_names);
  if (!m->children || !m->child_names) {
    for (size_t i = 0; i < n; i++) loom_module_free(children[i]);
    return loom__fail(LOOM_ENOMEM, "%s: out of memory for %zu children", m->type, n);
  }
  for (size_t i = 0; i < n; i++) {
    char num[24];
    snprintf(num, sizeof num, "%zu", i);
    m->children[i] = children[i];
    m->n_children = (int)i + 1;
    children[i]->parent = m;
    m->child_names[i] = loom__strdup(LOOM_POOL_COMPUTE, names ? names[i] : num);
    if (!m->child_names[i] && !rc) rc = loom__fail(LOOM_ENOMEM, "%s: out of memory", m->type);
  }
  for (size_t i = 0; i < n; i++) loom__module_drop_arenas(children[i]); /* the root's now */
  return rc;
}

int loom__module_compose(const char *type,
                         int (*forward)(loom_module *, loom_tensor *, loom_tensor **),
                         loom_module **children, size_t n, const char *const *names,
                         loom_module **out) {
  loom_module *m = NULL;
  int rc = loom__module_new(type, forward, &m);
  if (rc) {
    for (size_t i = 0; i < n; i++) loom_module_free(children[i]);
    return rc;
  }
  if ((rc = loom__module_adopt(m, children, n, names))) {
    loom_module_free(m);
    return rc;
  }
  *out = m;
  return LOOM_OK;
}

/* ---- packing ---------------------------------------------------------------------------- */

/* Walk the tree: own parameters first, then children, depth first (module trees are shallow,
 * so recursion is fine). With flat == NULL only counts. */
static int collect(loom_module *m, const char *prefix, loom__param **flat, size_t *n) {
  for (int i = 0; i < m->n_params; i++) {
    loom__param *p = &m->params[i];
    size_t len = strlen(prefix) + strlen(p->name) + 1;
    if (flat) {
      p->full = loom__malloc(LOOM_POOL_COMPUTE, len);
      if (!p->full) return loom__fail(LOOM_ENOMEM, "module: out of memory for names");
      snprintf(p->full, len, "%s%s", prefix, p->name);
      flat[*n] = p;
    }
    (*n)++;
  }
  for (int c = 0; c < m->n_children; c++) {
    char pre[512];
    snprintf(pre, sizeof pre, "%s%s.", prefix, m->child_names[c]);
    int rc = collect(m->children[c], pre, flat, n);
    if (rc) return rc;
  }
  return LOOM_OK;
}

int loom__module_pack(loom_module *m) { return loom__module_pack_as(m, loom_nn_deferred_init()); }

/* Deferred: the parameters keep no memory; they are leaves that require grad, as in an arena. */
static int defer_params(loom_module *m) {
  for (size_t i = 0; i < m->n_flat; i++) {
    int rc = loom_tensor_set_requires_grad(m->flat[i]->value, true);
    if (rc) return rc;
  }
  m->deferred = true;
  return LOOM_OK;
}

int loom__module_pack_as(loom_module *m, bool defer) {
  int rc = LOOM_OK;
  size_t n = 0;
  loom_tensor **views = NULL; /* value and gradient view of each parameter, in order */
  loom__module_drop_arenas(m);
  m->deferred = false;
  collect(m, "", NULL, &n);
  m->flat = loom__calloc(LOOM_POOL_COMPUTE, n ? n : 1, sizeof *m->flat);
  LOOM_TRY_ALLOC(m->flat, "the parameter list");
  m->n_flat = 0;
  LOOM_TRY(collect(m, "", m->flat, &m->n_flat));
  loom__layout lay[LOOM_DTYPE_COUNT];
  size_t total[LOOM_DTYPE_COUNT] = {0};
  for (int d = 0; d < LOOM_DTYPE_COUNT; d++) loom__layout_init(&lay[d], (loom_dtype)d);
  for (size_t i = 0; i < n; i++) { /* one flat layout per dtype, in parameter order */
    loom__param *p = m->flat[i];
    p->offset = loom__layout_add(&lay[loom_tensor_dtype(p->value)], loom_tensor_numel(p->value));
    if (!loom__tensor_released(p->value)) defer = false; /* values to keep: an arena */
  }
  if (defer && n) {
    rc = defer_params(m);
    goto done;
  }
  for (int d = 0; d < LOOM_DTYPE_COUNT; d++) total[d] = lay[d].end;
  for (int d = 0; d < LOOM_DTYPE_COUNT; d++) {
    if (!total[d]) continue;
    int64_t len = (int64_t)total[d];
    LOOM_TRY(loom_tensor_zeros((loom_dtype)d, 1, &len, &m->arena[d]));
    /* written by the first backward, not before: a fresh mapping's pages stay out of the
     * resident set until then (and those of an arena a parent's packing replaces, never) */
    LOOM_TRY(loom__tensor_zeros_untouched((loom_dtype)d, 1, &len, &m->grad_arena[d]));
    m->arena_numel[d] = total[d];
  }
  /* every view made first, the parameters changed only once all are: a failure leaves them as
   * they were (a deferred root's shells stay shells) */
  views = loom__calloc(LOOM_POOL_COMPUTE, 2 * (n ? n : 1), sizeof *views);
  LOOM_TRY_ALLOC(views, "the parameter views");
  for (size_t i = 0; i < n; i++) {
    loom__param *p = m->flat[i];
    loom_dtype dt = loom_tensor_dtype(p->value);
    loom_tensor **v = &views[2 * i], **g = &views[2 * i + 1];
    const loom_tensor *old = p->value;
    int64_t strides[LOOM_MAX_DIMS], s = 1;
    for (int k = old->ndim - 1; k >= 0; k--) strides[k] = s, s *= old->shape[k];
    LOOM_TRY(loom__tensor_view(m->arena[dt], old->ndim, old->shape, strides, p->offset, v));
    LOOM_TRY(loom__tensor_view(m->grad_arena[dt], old->ndim, old->shape, strides, p->offset, g));
    if (loom__tensor_released(old)) /* a shell: its initialiser's values */
      rc = loom__param_init_into(p, 0, loom_tensor_numel(*v), loom_tensor_data(*v), dt);
    else rc = loom_tensor_copy(*v, old);
    if (!rc) rc = loom_tensor_set_requires_grad(*v, true);
    if (!rc) rc = loom_tensor_set_grad(*v, *g);
    if (rc) goto done;
  }
  for (size_t i = 0; i < n; i++) {
    loom__param *p = m->flat[i];
    loom_tensor_free(p->value);
    loom_tensor_free(p->grad);
    p->value = views[2 * i];
    p->grad = views[2 * i + 1];
  }
done:
  if (rc) {
    for (size_t i = 0; views && i < 2 * n; i++) loom_tensor_free(views[i]);
    loom__module_drop_arenas(m);
  }
  loom__free(views);
  return rc;
}

/* ---- running ---------------------------------------------------------------------------- */

/* ---- activation checkpointing ------------------------------------------------------------ */

/* What a checkpointed forward keeps for its recomputation: the module and its subtree's
 * forward counters (dropout's seed is seed + calls: the recomputation must draw the masks the
 * forward drew), as the forward found them. */
typedef struct ckpt_run {
  loom_module *m;
  bool ran;
  size_t n;
  uint64_t calls[]; /* [0, n): at the forward; [n, 2n): scratch for the recomputation */
} ckpt_run;

static size_t tree_size(const loom_module *m) {
  size_t n = 1;
  for (int i = 0; i < m->n_children; i++) n += tree_size(m->children[i]);
  return n;
}

/* Copy the subtree's counters into v (get) or from v (set), depth first. */
static void tree_calls(loom_module *m, uint64_t *v, size_t *k, bool set) {
  if (set) m->calls = v[*k];
  else v[*k] = m->calls;
  (*k)++;
  for (int i = 0; i < m->n_children; i++) tree_calls(m->children[i], v, k, set);
}

static int ckpt_fn(void *ctx, loom_tensor *const *in, int n_in, loom_tensor **out) {
  (void)n_in;
  ckpt_run *c = ctx;
  size_t k = 0;
  if (!c->ran) { /* the forward */
    c->ran = true;
    tree_calls(c->m, c->calls, &k, false);
    return c->m->forward(c->m, in[0], out);
  }
  tree_calls(c->m, c->calls + c->n, &k, false); /* where the module is now */
  k = 0;
  tree_calls(c->m, c->calls, &k, true); /* back to the forward's draws */
  int rc = c->m->forward(c->m, in[0], out);
  k = 0;
  tree_calls(c->m, c->calls + c->n, &k, true);
  return rc;
}

static void ckpt_free(void *ctx) { loom__free(ctx); }

/* m's forward through loom_autograd_checkpoint, with its subtree's parameters as the leaves. */
static int run_checkpointed(loom_module *m, loom_tensor *x, loom_tensor **out) {
  size_t n = tree_size(m), np = loom_module_param_count(m);
  ckpt_run *c = loom__calloc(LOOM_POOL_COMPUTE, 1, sizeof *c + 2 * n * sizeof(uint64_t));
  loom_tensor **params = loom__calloc(LOOM_POOL_COMPUTE, np ? np : 1, sizeof *params);
  if (!c || !params) {
    loom__free(c);
    loom__free(params);
    return loom__fail(LOOM_ENOMEM, "%s: out of memory checkpointing", m->type);
  }
  c->m = m;
  c->n = n;
  int rc = LOOM_OK;
  for (size_t i = 0; i < np && !rc; i++) {
    loom_param p;
    if (!(rc = loom_module_param(m, i, &p))) params[i] = p.value;
  }
  if (rc) {
    loom__free(c);
    loom__free(params);
    return rc;
  }
  rc = loom_autograd_checkpoint(m->type, ckpt_fn, c, ckpt_free, &x, 1, params, (int)np, out);
  loom__free(params);
  return rc;
}

int loom_module_set_checkpoint(loom_module *m, bool on) {
  if (!m) return loom__fail(LOOM_EINVAL, "loom_module_set_checkpoint: module is NULL");
  m->checkpoint = on;
  return LOOM_OK;
}

bool loom_module_checkpoint(const loom_module *m) { return m && m->checkpoint; }

/* ---- running ------------------------------------------------------------------------------ */

int loom__module_run(loom_module *m, loom_tensor *x, loom_tensor **out) {
  const loom__module_hooks *h = m->hooks;
  void *ctx = m->hooks_ctx;
  int rc = h && h->pre ? h->pre(m, ctx) : LOOM_OK;
  if (rc) return rc;
  /* inside the hooks, as PyTorch's FSDP(checkpoint_wrapper(block)): a unit's gather is around
   * the forward and, through its output's gradient hook, around the recomputation */
  if (m->checkpoint && m->training && loom_grad_enabled()) rc = run_checkpointed(m, x, out);
  else rc = m->forward(m, x, out);
  if (h && h->post) {
    int rc2 = h->post(m, rc ? NULL : *out, rc, ctx);
    if (!rc && rc2) {
      loom_tensor_free(*out);
      *out = NULL;
      rc = rc2;
    }
  }
  return rc;
}

void loom__module_set_hooks(loom_module *m, const loom__module_hooks *hooks, void *ctx) {
  m->hooks = hooks;
  m->hooks_ctx = hooks ? ctx : NULL;
}

int loom_module_forward(loom_module *m, loom_tensor *x, loom_tensor **out) {
  if (out) *out = NULL;
  if (!m || !out) return loom__fail(LOOM_EINVAL, "loom_module_forward: module or out is NULL");
  int rc = loom_tensor_check(x, "loom_module_forward");
  return rc ? rc : loom__module_run(m, x, out);
}

void loom_module_set_training(loom_module *m, bool training) {
  if (!m) return;
  m->training = training;
  for (int i = 0; i < m->n_children; i++) loom_module_set_training(m->children[i], training);
}

const char *loom_module_type(const loom_module *m) { return m ? m->type : "?"; }

/* ---- parameters ------------------------------------------------------------------------- */

static const loom_module *root_of(const loom_module *m) {
  while (m->parent) m = m->parent;
  return m;
}

static const loom__param *first_param(const loom_module *m) {
  if (m->n_params) return &m->params[0];
  for (int i = 0; i < m->n_children; i++) {
    const loom__param *p = first_param(m->children[i]);
    if (p) return p;
  }
  return NULL;
}

/* The parameters of m's subtree are a contiguous run of the root's flat list. */
static void span(const loom_module *m, size_t *first, size_t *count) {
  const loom_module *r = root_of(m);
  const loom__param *p0 = first_param(m);
  size_t n = 0;
  collect((loom_module *)m, "", NULL, &n);
  *first = 0;
  *count = n;
  for (size_t i = 0; p0 && i < r->n_flat; i++)
    if (r->flat[i] == p0) *first = i;
}

size_t loom_module_param_count(const loom_module *m) {
  if (!m) return 0;
  size_t first, count;
  span(m, &first, &count);
  return count;
}

static void fill(const loom__param *p, loom_param *out) {
  *out = (loom_param){.name = p->full, .value = p->value, .grad = p->grad,
                      .dtype = loom_tensor_dtype(p->value), .offset = p->offset,
                      .numel = loom_tensor_numel(p->value)};
}

int loom_module_param(const loom_module *m, size_t i, loom_param *out) {
  if (!m || !out) return loom__fail(LOOM_EINVAL, "loom_module_param: module or out is NULL");
  size_t first, count;
  span(m, &first, &count);
  if (i >= count)
    return loom__fail(LOOM_EINVAL, "loom_module_param: index %zu out of range (%zu parameters)",
                      i, count);
  fill(root_of(m)->flat[first + i], out);
  return LOOM_OK;
}

int loom_module_param_by_name(const loom_module *m, const char *name, loom_param *out) {
  if (!m || !name || !out)
    return loom__fail(LOOM_EINVAL, "loom_module_param_by_name: an argument is NULL");
  if (m->parent)
    return loom__fail(LOOM_EMISUSE,
                      "loom_module_param_by_name: the module is inside another; look names up "
                      "on the root");
  for (size_t i = 0; i < m->n_flat; i++)
    if (!strcmp(m->flat[i]->full, name)) {
      fill(m->flat[i], out);
      return LOOM_OK;
    }
  return loom__fail(LOOM_ENOTFOUND, "loom_module_param_by_name: no parameter named \"%s\"", name);
}

int loom_module_arena(const loom_module *m, loom_dtype dt, loom_tensor **values,
                      loom_tensor **grads, size_t *numel) {
  if (!m) return loom__fail(LOOM_EINVAL, "loom_module_arena: module is NULL");
  if (!loom_dtype_valid(dt)) return loom__fail(LOOM_EDTYPE, "loom_module_arena: bad dtype %d", dt);
  if (m->parent)
    return loom__fail(LOOM_EMISUSE, "loom_module_arena: the module is inside another %s; the "
                      "root holds the arena", m->parent->type);
  if (values) *values = m->arena[dt];
  if (grads) *grads = m->grad_arena[dt];
  if (numel) *numel = m->arena_numel[dt];
  return LOOM_OK;
}

size_t loom_module_numel(const loom_module *m) {
  size_t n = 0;
  for (size_t i = 0, c = loom_module_param_count(m); i < c; i++) {
    loom_param p;
    if (!loom_module_param(m, i, &p)) n += p.numel;
  }
  return n;
}

/* Each parameter's gradient through loom_tensor_zero_grad, so that autograd knows it is zero
 * (its gradient bound, loom_tensor_grad_bound: a bound that said non-finite must not outlive
 * the zeroing), and its arena view too when the user pointed the gradient elsewhere
 * (loom_tensor_set_grad). The arena's padding is never written: it stays zero. */
int loom_module_zero_grad(loom_module *m) {
  if (!m) return loom__fail(LOOM_EINVAL, "loom_module_zero_grad: module is NULL");
  for (size_t i = 0, c = loom_module_param_count(m); i < c; i++) {
    loom_param p;
    int rc = loom_module_param(m, i, &p);
    loom_tensor *g = rc ? NULL : loom_tensor_grad(p.value);
    if (!rc) rc = loom_tensor_zero_grad(p.value);
    if (!rc && p.grad && g != p.grad) rc = loom_tensor_fill(p.grad, 0.0);
    if (rc) return rc;
  }
  return LOOM_OK;
}
