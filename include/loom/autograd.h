/* loom/autograd.h: define-by-run automatic differentiation.
 *
 * The tape. An op (loom/ops.h) records a node when grad mode is on for the calling thread and
 * at least one of its floating inputs requires grad; its output then has a grad_fn and
 * requires grad itself. Leaf tensors are those the caller marks with
 * loom_tensor_set_requires_grad. loom_backward(loss, ...) walks the graph that produced
 * `loss` and accumulates (+=) into each leaf's gradient, loom_tensor_grad(leaf), which has
 * the leaf's dtype and shape. Gradients flowing between nodes are f32.
 *
 * Order. Backward runs nodes in a deterministic order: among the nodes whose gradient is
 * complete, the one recorded last goes first (the reverse of recording order, restricted to
 * what is ready). A leaf's gradient is complete when every path from the loss to it has been
 * run; at that moment its hooks fire, by phase, then in registration order (loom_hook_phase).
 * An op that writes a leaf's gradient in place (below) completes it as soon as that write is
 * done: linear fires its weight's and bias' hooks before it computes its input's gradient.
 * So hooks fire in the same
 * order on every rank that runs the same program (DDP launches bucket all-reduces from them),
 * and as early as the gradient is ready.
 *
 * Gradient buffers. loom_tensor_set_grad points a leaf's gradient at a tensor the caller
 * provides (a view into a DDP bucket or a flat gradient arena); backward then accumulates
 * into that buffer in place. Some ops (linear, matmul) write their contribution to an f32
 * leaf's gradient straight into its buffer while backward runs (a first contribution to a
 * leaf without a buffer makes one and overwrites it, instead of zeroing then adding); the
 * buffer is complete only when the leaf's hooks fire, so read it from a hook or after
 * backward, not from a hook on another tensor.
 *
 * Ownership. A tensor produced by an op retains its node, and a node retains the nodes and
 * leaves it needs for backward (never the tensors it produced, so there are no cycles).
 * Freeing the last tensor of a graph frees the graph. Saved values are views of storage, not
 * references to tensors. loom_tensor_grad returns a borrowed pointer.
 *
 * Errors. loom_backward fails with a message and changes nothing when: the loss does not
 * require grad (LOOM_EINVAL), the loss has more than one element and no grad_output is given
 * (LOOM_ESHAPE), grad_output's shape or dtype differs from the loss (LOOM_ESHAPE /
 * LOOM_EDTYPE), or a node on the path was already run by a backward without retain_graph
 * (LOOM_EMISUSE). A backward function that returns a gradient of the wrong shape stops
 * backward with LOOM_ESHAPE naming the op. A hook that returns an error stops backward with
 * that error.
 *
 * Threads. Grad mode and the no-grad scope are per thread. Each thread may build and run its
 * own graphs at the same time as others (ranks as threads): node ids and backward state
 * are per graph. One graph (and the leaves it reaches) must be used by one thread at a time;
 * two threads must not run backward into the same leaf at once. */
#ifndef LOOM_AUTOGRAD_H
#define LOOM_AUTOGRAD_H

#include "loom/tensor.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- grad mode ---------------------------------------------------------------------- */

/* True if ops on this thread record nodes (the default). */
bool loom_grad_enabled(void);
/* Enter a no-grad scope on this thread: ops record nothing until the matching exit. Scopes
 * nest. loom_no_grad_exit without an enter returns LOOM_EMISUSE. */
void loom_no_grad_enter(void);
int loom_no_grad_exit(void);

/* ---- leaves and gradients ----------------------------------------------------------- */

/* Mark a leaf as needing a gradient (or not). LOOM_EDTYPE for a non-floating tensor;
 * LOOM_EMISUSE when clearing the flag on a tensor an op produced (it is not a leaf). */
int loom_tensor_set_requires_grad(loom_tensor *t, bool requires_grad);
/* True if t is a leaf marked requires_grad or the output of a recorded op. */
bool loom_tensor_requires_grad(const loom_tensor *t);
/* True unless t was produced by a recorded op. */
bool loom_tensor_is_leaf(const loom_tensor *t);
/* The leaf's gradient buffer (borrowed; NULL before the first backward that reaches it, after
 * loom_tensor_set_grad(t, NULL), and for NULL or a tensor without autograd state). Same dtype
 * and shape as t, contiguous. A pure getter: it writes nothing, so any number of threads may
 * call it at once. While a lazy zero is pending (loom_tensor_zero_grad_lazy, and no backward
 * has written the gradient since) the buffer still holds the old values: call
 * loom_tensor_settle_grad(t) before reading it. */
loom_tensor *loom_tensor_grad(const loom_tensor *t);
/* Write a pending lazy zero (loom_tensor_zero_grad_lazy) into t's gradient buffer now and end
 * it; a no-op when none is pending or t has no gradient. Afterwards the buffer holds what the
 * gradient logically is. Two threads must not call it on the same leaf at once. */
int loom_tensor_settle_grad(loom_tensor *t);
/* Use `grad` as t's gradient buffer: backward accumulates into it in place. Retains grad.
 * It must have t's dtype and shape and be contiguous (LOOM_EDTYPE / LOOM_ESHAPE otherwise),
 * and t must be a leaf (LOOM_EMISUSE). NULL drops the gradient (the next backward allocates
 * a new zeroed one). */
int loom_tensor_set_grad(loom_tensor *t, loom_tensor *grad);
/* Fill t's gradient with zeros, keeping its buffer (no-op if it has none). */
int loom_tensor_zero_grad(loom_tensor *t);
/* Zero t's gradient without writing it (what PyTorch's zero_grad(set_to_none=True) saves, with
 * the buffer kept, so DDP's bucket views and arenas stay in place): the next backward that
 * reaches t overwrites the buffer instead of adding to it (a GEMM with beta = 0, a copy), and
 * loom_tensor_settle_grad(t) writes the zeros if nothing did. Until one of them runs, the
 * buffer's memory still holds the old values: code that reads it (through loom_tensor_grad,
 * or a pointer or tensor taken earlier: an optimizer segment, a gradient list given to the AMP
 * scaler) must do so after a backward that reached t, or call loom_tensor_settle_grad(t)
 * first. loom_ddp_finish, loom_fsdp_finish, loom_step_apply, the AMP unscale hooks and
 * loom_amp_graph_backward settle the gradients they read. A backward that fails
 * leaves each such gradient complete (its hooks ran) or zero. DDP sends the gradient of a
 * parameter backward did not reach as zeros. No-op if t has no gradient buffer. */
int loom_tensor_zero_grad_lazy(loom_tensor *t);

/* Gradient bounds: what backward knows of a leaf's gradient without reading it, so that a
 * check of every element (the AMP loss scaler's inf/NaN test, loom/amp.h) can be skipped.
 * loom_tensor_zero_grad and a newly made gradient start the bound at 0. While the leaf's bound
 * is tracked, an op that writes the gradient in place and can bound what it adds raises it:
 * linear adds at most rows * max|x| * max|grad_out| to each weight gradient element and
 * rows * max|grad_out| to each bias element (the maxima read from its inputs, which are far
 * smaller than the weight gradient, while they are in cache), or marks the gradient
 * non-finite when those inputs held inf/NaN (inf * y and inf + y are never finite, so the
 * gradient then holds one). Any other write autograd makes (another op, a temporary added in,
 * loom_tensor_set_grad) makes the bound unknown, as does a bound past half of FLT_MAX.
 * Writes through the gradient's data pointer are not seen: after one, call
 * loom_tensor_zero_grad or treat the bound as unknown. */
typedef enum loom_grad_bound_kind {
  LOOM_GRAD_BOUND_UNKNOWN = 0, /* read the gradient to know */
  LOOM_GRAD_BOUND_FINITE,      /* every element is finite, |element| <= *bound (a bound on the
                                  exact sums: a computed element may pass it by their rounding,
                                  a relative rows * 2^-24) */
  LOOM_GRAD_BOUND_NONFINITE,   /* some element is inf or NaN */
} loom_grad_bound_kind;

/* Ask ops to bound t's gradient (on) or stop (off); calls nest (a count), so independent users
 * can each turn it on and off. t must be a leaf (LOOM_EMISUSE). Tracking costs each linear
 * backward that writes t's gradient a read of its input and output gradient. */
int loom_tensor_track_grad_bound(loom_tensor *t, bool on);
/* The bound of leaf t's gradient: *kind, and for FINITE *bound (may be NULL). UNKNOWN when t
 * has no gradient. */
int loom_tensor_grad_bound(const loom_tensor *t, loom_grad_bound_kind *kind, double *bound);
/* What tracking has cost this thread so far: the wall time its ops spent reading their inputs
 * to bound gradients, and how many bounds they made (for benchmarks). Either may be NULL. */
void loom_grad_bound_cost(double *seconds, uint64_t *count);
/* A tensor sharing t's storage that is not part of any graph (requires_grad false). */
int loom_tensor_detach(loom_tensor *t, loom_tensor **out);
/* The name of the op that produced t ("matmul"), or NULL for a leaf. Borrowed, static. */
const char *loom_tensor_grad_fn_name(const loom_tensor *t);

/* ---- hooks -------------------------------------------------------------------------- */

/* A gradient hook. On a leaf it runs once per backward, when the leaf's gradient is complete
 * for that backward; `grad` is loom_tensor_grad(leaf). On an op's output it runs when the
 * gradient with respect to that output is complete, before it flows further; `grad` is that
 * gradient (f32, contiguous; the hook may modify it). Return LOOM_OK, or an error status (set
 * a message with it) to stop backward. */
typedef int (*loom_grad_hook_fn)(loom_tensor *grad, void *ctx);

/* When a hook runs among the hooks of one tensor: phase by phase, and within a phase in
 * registration order. So the order of creation does not matter: AMP's checking hooks read a
 * rank's own gradient before DDP's hook hands it to the all-reduce, whichever was made first. */
typedef enum loom_hook_phase {
  LOOM_HOOK_LOCAL = 0,  /* the gradient as this rank computed it: checks, logging, edits */
  LOOM_HOOK_REDUCE = 1, /* hands the gradient to communication (DDP's buckets, FSDP's
                         * reduce-scatter): after every LOCAL hook of the tensor */
} loom_hook_phase;

/* Register a LOOM_HOOK_LOCAL hook on t (which must require grad: LOOM_EMISUSE otherwise).
 * *id (may be NULL) receives an id for loom_tensor_remove_hook. The hook stays until removed
 * or until t (a leaf) or t's node (an op output) is freed. */
int loom_tensor_register_hook(loom_tensor *t, loom_grad_hook_fn fn, void *ctx, int *id);
/* The same in a given phase (LOOM_EINVAL for a phase not in the enum). */
int loom_tensor_register_hook_phase(loom_tensor *t, loom_hook_phase phase, loom_grad_hook_fn fn,
                                    void *ctx, int *id);
/* Remove a hook by the id register gave. LOOM_ENOTFOUND if there is none with that id. */
int loom_tensor_remove_hook(loom_tensor *t, int id);

/* Run fn(ctx) once, after the backward that is running on this thread has finished every
 * node and hook (PyTorch's queue_callback; DDP waits for its last bucket from here).
 * LOOM_EMISUSE if no backward is running on this thread. */
int loom_backward_queue_callback(int (*fn)(void *ctx), void *ctx);

/* ---- backward ----------------------------------------------------------------------- */

/* Run backward from `loss`. grad_output: the gradient with respect to loss (same dtype and
 * shape as loss), or NULL for a one-element loss (gradient 1). retain_graph: keep the saved
 * values so backward can run through this graph again; without it the graph's nodes are
 * spent. Gradients accumulate into leaves (+=). Grad mode is off while backward runs. */
int loom_backward(loom_tensor *loss, loom_tensor *grad_output, bool retain_graph);

/* Gradients of `output` with respect to inputs[0..n) (torch.autograd.grad), without touching
 * any leaf's gradient and without running leaf hooks (hooks on op outputs still run).
 * grad_output and retain_graph are as for loom_backward. grads[k] receives a new tensor of
 * inputs[k]'s dtype and shape (the caller frees it), or NULL if output does not depend on
 * inputs[k] (torch's allow_unused). Inputs may be leaves or op outputs; each must require grad
 * (LOOM_EINVAL). On failure every grads[k] is NULL. */
int loom_autograd_grad(loom_tensor *output, loom_tensor *grad_output, loom_tensor *const *inputs,
                       size_t n, bool retain_graph, loom_tensor **grads);

/* ---- custom functions --------------------------------------------------------------- */

/* The backward of a custom function: given grad_out (f32, contiguous, the output's shape),
 * set grad_in[i] for each input i that needs a gradient (needs[i] true) to a new f32
 * contiguous tensor of input i's shape (the engine takes the reference). Entries left NULL
 * contribute nothing. */
typedef int (*loom_custom_backward_fn)(void *ctx, loom_tensor *grad_out, int n_in,
                                       const bool *needs, loom_tensor **grad_in);

/* Record `output` (which the caller computed from `inputs`, typically in a no-grad scope) as
 * the result of a custom function with backward `bwd`. Does nothing if grad mode is off or
 * no input requires grad. ctx is owned by the node from a successful call on (also when
 * nothing is recorded): ctx_free(ctx) runs when the node is freed or spent (may be NULL).
 * output must be a fresh tensor that is not already part of a graph (LOOM_EMISUSE).
 * `name` (static storage) names the function in messages. */
int loom_autograd_record_custom(const char *name, loom_tensor **inputs, int n_in,
                                loom_tensor *output, loom_custom_backward_fn bwd, void *ctx,
                                void (*ctx_free)(void *ctx));

/* ---- activation checkpointing ------------------------------------------------------- */

/* A function to checkpoint: compute *out (a new reference) from inputs[0..n_in) with ops, as
 * a module's forward does. It runs twice, in forward and again in backward, and must do the
 * same both times on the same inputs (what it reads besides them, parameters included, must
 * not change in between; randomness must come from state it restores itself: a module's
 * dropout is restored by loom_module_set_checkpoint). */
typedef int (*loom_checkpoint_fn)(void *ctx, loom_tensor *const *inputs, int n_in,
                                  loom_tensor **out);

/* torch.utils.checkpoint.checkpoint(fn, *inputs) (its reentrant form): *out = fn(inputs), run
 * without recording its inner graph, so none of its intermediate tensors is kept. When grad
 * mode is on and an input or a parameter requires grad, one node stands for it, holding
 * detached views of the inputs (their storage stays alive until backward), the autocast mode
 * and registry in force, and ctx; its backward runs fn again on detached copies of the inputs
 * with grad mode on under that autocast state, then backpropagates the incoming gradient
 * through the graph just recorded (a reentrant backward): each input that requires grad gets
 * its gradient (f32 between nodes, as any op's, so the sums are those the graph without the
 * checkpoint makes: bit-identical gradients), and the leaves inside accumulate theirs with
 * their hooks firing as in any backward, DDP's bucket hooks and FSDP's gradient hooks
 * included. Callbacks queued meanwhile (loom_backward_queue_callback) run at the end of the
 * outermost backward. Otherwise (no-grad, nothing requires grad) fn simply runs.
 *
 * params[0..n_params) are the leaves fn uses (a module's parameters; may be 0). They are
 * edges of the node, so the enclosing backward counts them: a leaf's gradient completes (its
 * hooks fire) once, when the paths through the recomputation and any outside it have all run
 * (a parameter also used outside fn, like a tied embedding, is handled; one whose gradient the
 * enclosing backward completed before fn's backward ran is LOOM_EMISUSE then). A listed
 * parameter that the recomputation does not reach gets a zero gradient (as a parameter no path
 * reaches, loom_tensor_grad's rule).
 *
 * Ownership: ctx belongs to the checkpoint from the call on (on failure too): ctx_free(ctx)
 * (may be NULL) runs when the node is freed or spent, or before the call returns when nothing
 * was recorded. The node retains the inputs' storage and the params; *out is a new reference
 * (NULL on failure). The registry in force must outlive the graph. `name` (static storage)
 * names the node in messages ("checkpoint" if NULL).
 *
 * retain_graph: the node keeps what it saved, so a second backward recomputes again and gives
 * the same gradients. A backward without it spends the node. Double backward does not exist in
 * loom (backward records nothing). Under loom_autograd_grad the node's backward fails with
 * LOOM_EMISUSE (the recomputation accumulates into leaves' gradients; PyTorch's reentrant
 * checkpoint has the same rule).
 *
 * Errors: LOOM_EINVAL for a NULL fn or out, n_in < 1, NULL inputs or params arrays;
 * LOOM_EMISUSE for a freed tensor; LOOM_EDTYPE for a non-floating output; fn's own status;
 * LOOM_ENOMEM. In backward: LOOM_EMISUSE when the recomputation gives an output of another
 * shape or dtype, or its graph reaches a node of the enclosing backward. */
int loom_autograd_checkpoint(const char *name, loom_checkpoint_fn fn, void *ctx,
                             void (*ctx_free)(void *ctx), loom_tensor *const *inputs, int n_in,
                             loom_tensor *const *params, int n_params, loom_tensor **out);

#ifdef __cplusplus
}
#endif
#endif
