/* autograd_int.h: the tape's data structures, shared by the ops layer (which records nodes)
 * and the backward engine. Private to loom.
 *
 * A node is one recorded op application with exactly one output. Its edges lead to what
 * each input's gradient flows into: the node that produced the input, or the input itself
 * when it is a leaf that requires grad, or nothing. Nodes are reference-counted (atomics):
 * the output tensor's metadata and downstream nodes hold references. Saved values are plain
 * tensor views (no autograd metadata), so a node never holds a tensor that holds it. */
#ifndef LOOM_AUTOGRAD_INT_H
#define LOOM_AUTOGRAD_INT_H

#include "core/tensor_int.h"
#include "loom/autograd.h"
#include "loom/ops.h"

#include <stdatomic.h>

typedef struct loom__node loom__node;

/* Backward of one node: grad_out is f32, contiguous, of the node's output shape. Set gin[i]
 * (a new f32 contiguous tensor of input i's shape) for each input with
 * loom__node_needs(n, i); others stay NULL. */
typedef int (*loom__backward_fn)(loom__node *n, loom_tensor *grad_out, loom_tensor **gin);

typedef struct loom__edge {
  loom__node *node;  /* retained: the node that produced this input, or NULL */
  loom_tensor *leaf; /* retained: the input itself, a leaf that requires grad, or NULL */
  int ndim;          /* the input's shape (what its gradient must be) */
  int64_t shape[LOOM_MAX_DIMS];
  loom_dtype dtype; /* the input's dtype */
  bool bwd_finished; /* this backward: the op finished the leaf's gradient (loom__sink_finish) */
} loom__edge;

typedef struct loom__hook {
  loom_grad_hook_fn fn;
  void *ctx;
  int id;
  loom_hook_phase phase;
} loom__hook;

typedef struct loom__hooks {
  loom__hook *v;
  int n, cap, next_id;
} loom__hooks;

#define LOOM__NODE_SAVED 6

struct loom__node {
  _Atomic int refcount;
  loom_op_kind kind;
  const char *name;
  uint64_t seq; /* recording order: later nodes run first among those ready */
  loom__backward_fn backward;
  loom_tensor *saved[LOOM__NODE_SAVED]; /* views without autograd metadata, or NULL */
  double f[4];                          /* op parameters */
  int64_t i[8];
  void *ctx; /* op- or user-owned state, freed by ctx_free */
  void (*ctx_free)(void *ctx);
  loom_dtype out_dtype;
  int out_ndim;
  int64_t out_shape[LOOM_MAX_DIMS];
  loom__hooks hooks; /* hooks on the output tensor (run with its gradient) */
  bool released;     /* spent by a backward without retain_graph */
  /* a checkpoint (checkpoint.c): backward recomputes; linear in its gradient, so it is skipped
   * when none reaches it, as an op's node is (a custom function's never is) */
  bool recompute;
  /* backward hands the output's gradient to input 0 unchanged but for rounding to the output
   * dtype (a cast): a gradient sink (loom__grad_sink) may look through this node */
  bool passthrough;
  /* per-backward state (one backward at a time per graph) */
  uint64_t bwd_epoch;
  int bwd_deps;
  loom_tensor *bwd_grad;
  loom__node *bwd_next; /* intrusive list: discovery stack, then all nodes of the graph */
  loom__node *free_next;
  int n_in;
  loom__edge in[];
};

/* Per-tensor autograd state, in loom_tensor.autograd. */
typedef struct loom__meta {
  bool requires_grad;
  loom__node *grad_fn; /* retained; NULL for a leaf */
  loom_tensor *grad;   /* leaves: accumulated gradient (tensor's dtype), or NULL */
  loom__hooks hooks;   /* leaves: run when grad is complete */
  uint64_t bwd_epoch;
  int bwd_pending;
  uint64_t bwd_seen; /* leaves: the last backward whose discovery counted an edge to it */
  bool sink_fresh; /* grad was allocated by a sink in the node running now (error cleanup) */
  /* leaves: grad's buffer is logically zero but not written (loom_tensor_zero_grad_lazy); the
   * first write overwrites it, and anything that reads it zeroes it first (loom__grad_settle) */
  bool grad_lazy_zero;
  /* this backward wrote into a lazy-zero buffer and the leaf is not complete yet: if backward
   * fails, the buffer is lazily zero again (run_backward) */
  bool lazy_consumed;
  /* leaves: what is known of grad's content without reading it (loom_tensor_grad_bound) */
  int bound_track;               /* loom_tensor_track_grad_bound count */
  loom_grad_bound_kind bound_kind;
  double bound;                  /* FINITE: every |element| <= bound */
} loom__meta;

/* The leaf's gradient bound becomes unknown / zero (a write autograd cannot bound; zeroing). */
void loom__bound_forget(loom__meta *m);
void loom__bound_zero(loom__meta *m);
/* Write the zeros of a leaf's gradient buffer (m->grad set) and end its lazy zero. */
void loom__grad_settle_zero(loom__meta *m);

/* The tensor's metadata, created on first use (NULL only when out of memory). */
loom__meta *loom__meta_get(loom_tensor *t);

/* True if grad mode is on and some non-NULL input requires grad. */
bool loom__ag_needs(loom_tensor *const *in, int n);

/* A node for an op over inputs in[0..n) (NULL entries allowed: no edge), with one edge per
 * input that requires grad. Refcount 1, owned by the caller until attached. */
int loom__node_new(loom_op_kind kind, const char *name, loom_tensor *const *in, int n,
                   loom__backward_fn bwd, loom__node **out);
/* Save a plain view of t in slot i (NULL t saves nothing). */
int loom__node_save(loom__node *n, int slot, const loom_tensor *t);
/* Make node n the grad_fn of out (out takes the caller's reference to n, on success and on
 * failure alike) and mark out as requiring grad. */
int loom__node_attach(loom__node *n, loom_tensor *out);
/* Free the node's saved values and mark it spent (backward without retain_graph). */
void loom__node_spend(loom__node *n);
/* Drop a reference; the last one frees the node (iteratively, however long the chain). */
void loom__node_release(loom__node *n);
/* True if input i's gradient is wanted. */
static inline bool loom__node_needs(const loom__node *n, int i) {
  return n->in[i].node || n->in[i].leaf;
}

/* Hook lists. */
int loom__hooks_add(loom__hooks *h, loom_hook_phase phase, loom_grad_hook_fn fn, void *ctx,
                    int *id);
int loom__hooks_remove(loom__hooks *h, int id);
int loom__hooks_run(const loom__hooks *h, loom_tensor *grad);
void loom__hooks_free(loom__hooks *h);

/* ---- writing straight into a leaf's gradient -----------------------------------------
 * Instead of returning a temporary in gin[i], a backward function may write input i's
 * gradient into its final buffer. When input i's gradient ends, unchanged, in the gradient
 * of an f32 leaf (the edge is that leaf, or goes through pass-through nodes with no hooks to
 * it), loom__grad_sink gives that buffer (f32, contiguous, input i's shape) and beta: 0 when
 * it holds nothing yet (overwrite every element), 1 when it holds earlier gradients (add).
 * The caller must then write all of it (p = beta * p + its gradient) before it asks for
 * another sink, and leave gin[i] NULL. Returns false (and the caller returns a temporary as
 * usual) for another dtype, a hook on the way, in loom_autograd_grad, outside backward, or
 * when the buffer cannot be allocated. The leaf's hooks still fire once, after its last
 * contribution (when its last edge has run). Through a pass-through node (a cast) the
 * gradient skips that node's rounding: an f32 master weight under autocast gets the f32 sum
 * of its gradients. If the backward function then fails, a buffer the sink allocated is
 * dropped again, so the leaf has no gradient as before.
 *
 * Bounds: handing out a sink makes the leaf's gradient bound unknown. If s.bound_wanted (the
 * leaf's bound is tracked), the op may then call loom__sink_bound with a bound on what it
 * added: the largest |value| of its contribution (INFINITY: its inputs held inf/NaN, so the
 * buffer now holds a non-finite value), and the bound is restored from the one before. */
typedef struct loom__sink {
  float *p;
  float beta;
  bool bound_wanted;
  loom_tensor *leaf;              /* internal: the leaf written */
  loom_grad_bound_kind prev_kind; /* internal: the bound before this write (beta 0: zero) */
  double prev;
} loom__sink;

bool loom__grad_sink(loom__node *n, int i, loom__sink *s);
void loom__sink_bound(const loom__sink *s, double added);
/* The op has written input i's whole gradient into sink s and will not touch it again: when
 * the edge is the leaf itself and this was the leaf's last pending contribution, its gradient
 * is complete now, and its hooks run now, before the op goes on (so that DDP can launch the
 * gradient's bucket while the op computes its other inputs' gradients). No-op when s was not
 * granted, through pass-through nodes, or in capture mode. A hook's error is returned. */
int loom__sink_finish(loom__node *n, int i, const loom__sink *s);
/* Where ops add up the time (core's loom__now) their bound reads take (loom_grad_bound_cost). */
void loom__bound_spent(double seconds);

/* True if gradient g (f32, contiguous) is held by nobody else and owns its whole buffer: a
 * backward may overwrite it and hand it on as an input's gradient (same shape), and the
 * engine may adopt it as a leaf's gradient, instead of copying. */
bool loom__grad_exclusive(const loom_tensor *g);

/* loom_tensor_set_grad that also accepts an f32 gradient for a low-precision leaf (FSDP's
 * mixed precision: the parameter is the gathered f16/bf16 copy, its gradient stays f32). */
int loom__tensor_set_grad_f32(loom_tensor *t, loom_tensor *grad);

/* dst (any float dtype, contiguous) += src (f32), n elements, through f32. */
void loom__accumulate_f32(loom_tensor *dst, const float *src, size_t n);

/* A reentrant backward (a checkpoint's, checkpoint.c) from output, run by node `from`'s backward
 * while the enclosing backward runs (or with none running): grad_output is f32 of output's shape
 * (output may be f16/bf16); leaves accumulate and fire their hooks as loom_backward's do, a leaf
 * of the enclosing graph (an edge of `from`, which the graph here takes over, or another) being
 * complete once every path of both backwards has run; the gradients of inputs[0..n) (leaves made
 * for the purpose) are captured into grads[k] (f32, NULL if none reached it) instead. Callbacks
 * queued meanwhile run at the end of the outermost backward. LOOM_EMISUSE under
 * loom_autograd_grad. The graph below output is spent. */
int loom__backward_reentrant(loom__node *from, loom_tensor *output, loom_tensor *grad_output,
                             loom_tensor *const *inputs, int n, loom_tensor **grads);
/* True while a loom_autograd_grad runs on this thread. */
bool loom__backward_capturing(void);
/* Grad mode for a recomputation inside backward: suspend returns the no-grad depth and turns
 * grad mode on; resume puts the depth back. */
int loom__grad_mode_suspend(void);
void loom__grad_mode_resume(int depth);

/* Per-thread state: grad mode depth and whether a backward is running. */
void loom__grad_mode_push(void);
void loom__grad_mode_pop(void);

#endif
