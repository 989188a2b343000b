/* engine_int.h: what the backward engine's two files share (autograd layer, private): the
 * per-thread backward state, run by engine.c, and the leaf side of a backward, engine_leaf.c
 * (accumulating into a leaf's gradient, completing it for its hooks, and sinks: a backward
 * writing straight into it). */
#ifndef LOOM_AUTOGRAD_ENGINE_INT_H
#define LOOM_AUTOGRAD_ENGINE_INT_H

#include "autograd/autograd_int.h"

typedef struct callback {
  int (*fn)(void *);
  void *ctx;
} callback;

typedef struct bwd_state {
  callback *cbs;
  int n, cap;
  /* capture mode (loom_autograd_grad): gradients of cap_in[k] go to cap_out[k] (f32), leaves
   * keep their gradients and their hooks do not run */
  loom_tensor *const *cap_in;
  loom_tensor **cap_out;
  int cap_n;
  /* a reentrant backward (loom__backward_reentrant: a checkpoint's recomputed graph) run from
   * a node of the backward `parent`: leaves accumulate and fire hooks as in a plain backward,
   * only cap_in are captured; callbacks go to the outermost backward */
  bool reentrant;
  struct bwd_state *parent;
  uint64_t epoch;
  loom__node *transfer; /* its leaf edges pass to this backward's graph
                         * (loom__backward_reentrant) */
} bwd_state;

/* The backward running on this thread (the innermost, for a reentrant one), or NULL. */
extern _Thread_local bwd_state *loom__bwd_cur;

/* True if this backward captures gradients instead of accumulating into leaves (the
 * loom_autograd_grad mode; a reentrant backward captures only its inputs). */
static inline bool bwd_capturing(const bwd_state *s) { return s->cap_n && !s->reentrant; }

/* The index k of t among the captured inputs (cap_in), or -1. */
static inline int bwd_capture_index(const bwd_state *s, const loom_tensor *t) {
  for (int k = 0; k < s->cap_n; k++)
    if (s->cap_in[k] == t) return k;
  return -1;
}

/* Add g (f32, or NULL: nothing) into leaf's gradient (engine_leaf.c). */
int loom__leaf_add(loom_tensor *leaf, loom_tensor *g);
/* Leaf's gradient is complete: settle it and run its hooks. */
int loom__leaf_done(loom_tensor *leaf);
/* After n's backward: the gradient buffers sinks made for it are kept, or dropped if it failed. */
void loom__sinks_settle(const loom__node *n, bool failed);

#endif
