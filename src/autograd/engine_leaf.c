/* engine_leaf.c: the leaf side of a backward (engine_int.h): gradients accumulated into a
 * leaf's (loom__accumulate_f32; the first one adopted, or converted to the leaf's dtype), the
 * leaf completed when its last edge has delivered and its hooks run, and sinks, through which
 * an op's backward writes straight into a leaf's f32 gradient, with the bound on its values. */
#include "autograd/engine_int.h"

#include <math.h>
#include <string.h>

void loom__accumulate_f32(loom_tensor *dst, const float *src, size_t n) {
  enum { PAR_MIN = 1 << 17, CHUNK = 1 << 14 }; /* an f32 dst: chunks over the caller's team */
  if (loom__dry()) return; /* a dry run's blocks are never written (loom/alloc.h) */
  if (dst->dtype == LOOM_F32 && n >= PAR_MIN) {
    float *restrict d = loom_tensor_data(dst);
    const float *restrict s = src;
    int64_t chunks = (int64_t)((n + CHUNK - 1) / CHUNK);
#pragma omp parallel for if (LOOM__OMP_TEAM)
    for (int64_t c = 0; c < chunks; c++) {
      size_t at = (size_t)c * CHUNK, m = n - at < CHUNK ? n - at : CHUNK;
      for (size_t j = at; j < at + m; j++) d[j] += s[j];
    }
    return;
  }
  loom__f32_iter it;
  for (loom__f32_begin(&it, loom_tensor_data(dst), dst->dtype, n); loom__f32_next(&it);)
    for (size_t j = 0; j < it.k; j++) it.p[j] += src[it.off + j];
}

bool loom__grad_exclusive(const loom_tensor *g) {
  return atomic_load(&g->refcount) == 1 && atomic_load(&g->storage->refcount) == 1 &&
         g->storage->owned && g->offset == 0 && !g->autograd;
}

/* Add g (f32, or NULL: nothing) into leaf's gradient. The first contribution becomes the
 * gradient (adopted, or converted to the leaf's dtype); with none, a zeroed one is made. */
int loom__leaf_add(loom_tensor *leaf, loom_tensor *g) {
  loom__meta *m = leaf->autograd;
  if (m->grad && m->grad_lazy_zero) { /* logically zero: the first contribution is copied */
    m->grad_lazy_zero = false;
    if (!g) {
      loom__grad_settle_zero(m);
      return LOOM_OK;
    }
    loom__bound_forget(m);
    int rc = loom_tensor_copy(m->grad, g); /* converts to the leaf's dtype */
    if (rc) m->grad_lazy_zero = true;     /* untouched on failure: still logically zero */
    else m->lazy_consumed = true;
    return rc;
  }
  if (m->grad) {
    if (g) {
      loom__accumulate_f32(m->grad, loom_tensor_data(g), loom_tensor_numel(g));
      loom__bound_forget(m);
    }
    return LOOM_OK;
  }
  if (!g) {
    loom__bound_zero(m);
    return loom_tensor_zeros(leaf->dtype, leaf->ndim, leaf->shape, &m->grad);
  }
  loom__bound_forget(m);
  if (leaf->dtype == LOOM_F32 && loom__grad_exclusive(g)) {
    m->grad = loom_tensor_retain(g);
    return LOOM_OK;
  }
  return loom_tensor_cast(g, leaf->dtype, &m->grad);
}

int loom__leaf_done(loom_tensor *leaf) {
  loom__meta *m = leaf->autograd;
  int rc = loom__leaf_add(leaf, NULL);
  if (!rc) { /* complete and published to its hooks: a later failure keeps it */
    m->lazy_consumed = false;
    m->sink_fresh = false;
  }
  return rc ? rc : loom__hooks_run(&m->hooks, m->grad);
}

/* ---- sinks: backward writing straight into a leaf's gradient --------------------------- */

/* The leaf in whose f32 gradient input i of n's gradient ends unchanged, or NULL: the edge is
 * the leaf, or leads to it through pass-through nodes without hooks. The leaf is f32, or has an
 * f32 gradient bound to it already (an FSDP parameter gathered in bf16/f16: its gradient stays
 * f32, loom__tensor_set_grad_f32); a low-precision leaf without one gets a gradient of its own
 * dtype the usual way. */
static loom_tensor *sink_leaf(const loom__node *n, int i) {
  const loom__edge *e = &n->in[i];
  while (e->node) {
    const loom__node *c = e->node;
    if (!c->passthrough || c->hooks.n || c->n_in < 1) return NULL;
    e = &c->in[0];
  }
  if (!e->leaf) return NULL;
  if (e->leaf->dtype == LOOM_F32) return e->leaf;
  const loom__meta *m = e->leaf->autograd;
  return m && m->grad && m->grad->dtype == LOOM_F32 ? e->leaf : NULL;
}

bool loom__grad_sink(loom__node *n, int i, loom__sink *s) {
  *s = (loom__sink){NULL, 0.0f, false, NULL, LOOM_GRAD_BOUND_UNKNOWN, 0.0};
  if (!loom__bwd_cur || bwd_capturing(loom__bwd_cur) || i < 0 || i >= n->n_in) return false;
  loom_tensor *leaf = sink_leaf(n, i);
  if (!leaf || (loom__bwd_cur->cap_n && bwd_capture_index(loom__bwd_cur, leaf) >= 0)) return false;
  loom__meta *m = leaf->autograd;
  if (!m->grad) {
    if (loom_tensor_empty(LOOM_F32, leaf->ndim, leaf->shape, &m->grad)) return false;
    m->sink_fresh = true;
  } else if (m->grad->dtype != LOOM_F32 || !loom_tensor_is_contiguous(m->grad)) {
    return false;
  } else if (m->grad_lazy_zero) { /* logically zero: overwrite */
    m->grad_lazy_zero = false;
    m->lazy_consumed = true;
  } else {
    s->beta = 1.0f;
  }
  s->p = loom_tensor_data(m->grad);
  s->leaf = leaf;
  s->bound_wanted = m->bound_track > 0;
  s->prev_kind = s->beta == 0.0f ? LOOM_GRAD_BOUND_FINITE : m->bound_kind;
  s->prev = s->beta == 0.0f ? 0.0 : m->bound;
  loom__bound_forget(m);
  return true;
}

int loom__sink_finish(loom__node *n, int i, const loom__sink *s) {
  if (!loom__bwd_cur || bwd_capturing(loom__bwd_cur) || !s->p || i < 0 || i >= n->n_in)
    return LOOM_OK;
  loom__edge *e = &n->in[i];
  if (e->node || e->leaf != s->leaf || e->bwd_finished) return LOOM_OK;
  e->bwd_finished = true;
  loom__meta *m = e->leaf->autograd;
  return --m->bwd_pending == 0 ? loom__leaf_done(e->leaf) : LOOM_OK;
}

/* Largest bound that still certifies finite elements, with room for the rounding of the sums
 * that produced them (a few ulps at most). */
#define BOUND_MAX (3.0e38 / 2)

void loom__sink_bound(const loom__sink *s, double added) {
  loom__meta *m = s->leaf ? s->leaf->autograd : NULL;
  if (!m) return;
  if (added == INFINITY || s->prev_kind == LOOM_GRAD_BOUND_NONFINITE) {
    /* the write put a non-finite value in, or one was there: inf + x, inf - inf, NaN + x */
    m->bound_kind = LOOM_GRAD_BOUND_NONFINITE;
    m->bound = INFINITY;
  } else if (s->prev_kind == LOOM_GRAD_BOUND_FINITE && added >= 0 && s->prev + added <= BOUND_MAX) {
    m->bound_kind = LOOM_GRAD_BOUND_FINITE;
    m->bound = s->prev + added;
  } /* else unknown, as the sink left it */
}

/* After n's backward: buffers sinks allocated for it are now written (or, if it failed and
 * the leaf was not completed, dropped, so the leaves are as they were). Lazy-zero buffers
 * are settled for the whole backward by run_backward. */
void loom__sinks_settle(const loom__node *n, bool failed) {
  for (int i = 0; i < n->n_in; i++) {
    loom_tensor *leaf = sink_leaf(n, i);
    loom__meta *m = leaf ? leaf->autograd : NULL;
    if (!m || !m->sink_fresh) continue;
    m->sink_fresh = false;
    if (failed) {
      loom_tensor_free(m->grad);
      m->grad = NULL;
    }
  }
}
