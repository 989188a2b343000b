/* loom/amp.h: AMP autograd integration (seed spec amp-autograd-integration.md): the AMP
 * context, backward with loss scaling, gradients prepared for the optimizer, AMP graphs and
 * custom AMP functions. Loss scaling itself is loom/scaler.h (included); a whole training step
 * is loom/step.h.
 *
 * A step with AMP autograd (the spec's "Basic AMP Autograd"):
 *
 *   loom_autocast_token tok;  loom_autocast_enter(LOOM_AUTOCAST_F16, NULL, &tok);
 *   forward ... loss                                   (casts on the tape, cached per region)
 *   loom_autocast_exit(&tok);
 *   loom_backward_amp(loss, s, false)                  (backward of loss * scale)
 *   bool ok;  loom_amp_prepare_gradients(s, grads, n, true, NULL, &ok)  (unscale + check)
 *   if (ok) optimizer step;   loom_scaler_update(s, !ok)
 *
 * Gradient accumulation over k micro-batches: loom_backward_amp on each micro-batch's loss
 * (each scaled by the same scale; the gradients add up scaled), then one prepare (one unscale)
 * and one update. Clipping: loom_clip_grad_norm_tensors (loom/optim.h) after prepare (the
 * norm of the unscaled gradients; clipping scaled gradients would clip at max_norm * scale).
 * With the deferred unscale (loom_scaler_check), loom_clip_grad_norm_scaled (loom/optim.h)
 * takes the norm of the scaled gradients times 1/scale and folds the clip coefficient into the
 * optimizer's grad_scale: the same bits as unscale + clip for power-of-two scales.
 *
 * Ownership: tensors passed in are borrowed unless a call says it retains them; tensors
 * returned through `out` arrays are new references the caller frees. Threads: like ops, each
 * call works on the calling thread's autocast and grad state. */

#ifndef LOOM_AMP_H
#define LOOM_AMP_H

#include "loom/autocast.h"
#include "loom/scaler.h"
#include "loom/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the AMP autograd context (AmpAutogradContext) ---------------------------------------- */

/* A value: what an AMP backward needs to know. Borrowed handles (the registry and the scaler
 * must outlive the context's use). */
typedef struct loom_amp_context {
  loom_autocast_mode mode;            /* Mode; default LOOM_AUTOCAST_BF16 (the spec's) */
  const loom_amp_registry *registry;  /* Registry; NULL: loom_amp_registry_default(mode) */
  loom_scaler *scaler;                /* LossScaler; NULL: no loss scaling */
  bool needs_unscaling;               /* NeedsGradientUnscaling: gradients are still scaled */
} loom_amp_context;

/* mode bf16, registry NULL, scaler NULL, needs_unscaling false (the spec's constructor). */
loom_amp_context loom_amp_context_default(void);
/* LOOM_EINVAL naming the field: a mode out of range, needs_unscaling without a scaler. */
int loom_amp_context_validate(const loom_amp_context *ctx);
/* The registry in force: ctx->registry, else the default of ctx->mode (NULL when mode is off). */
const loom_amp_registry *loom_amp_context_registry(const loom_amp_context *ctx);

/* ---- backward with loss scaling (AmpTensorExtensions) ------------------------------------- */

/* BackwardAmp: backward of loss * scale (scaler NULL or disabled: plain backward). loss must
 * have one element and require grad. A low-precision loss is cast to f32 first (on the tape),
 * so the scaled seed cannot overflow f16. Opens the scaler's step (as loom_scaler_scale_value;
 * may be called once per micro-batch). retain_graph as for loom_backward. The leaves'
 * gradients accumulate scaled: unscale them (loom_amp_prepare_gradients) before stepping. */
int loom_backward_amp(loom_tensor *loss, loom_scaler *scaler, bool retain_graph);
/* The same with a context: uses ctx->scaler and sets ctx->needs_unscaling when it scaled. */
int loom_backward_amp_ctx(loom_tensor *loss, loom_amp_context *ctx, bool retain_graph);

/* GradAmp: the gradients of a one-element `output` with respect to inputs[0..n)
 * (loom_autograd_grad), computed from output * scale and unscaled by 1/scale before they are
 * rounded to each input's dtype, so small gradients of low-precision tensors do not flush to
 * zero on the way. Leaves' gradients are not touched. grads[k]: a new tensor of inputs[k]'s
 * dtype and shape, or NULL when output does not depend on it. *found_inf (may be NULL): some
 * gradient is inf or NaN (the caller decides; the scaler's step is not opened or closed). */
int loom_grad_amp(loom_tensor *output, loom_tensor *const *inputs, size_t n, loom_scaler *scaler,
                  bool retain_graph, loom_tensor **grads, bool *found_inf);

/* NeedsAmpBackward: true if t requires grad and its graph holds a low-precision (f16 / bf16)
 * tensor, an op output or an input, where unscaled gradients can underflow; false otherwise
 * (including NULL and tensors that do not require grad). */
bool loom_needs_amp_backward(const loom_tensor *t);

/* ---- gradients for the optimizer (AmpAutogradHelper) -------------------------------------- */

/* A named tensor: an entry of the spec's Dictionary<string, Tensor>. */
typedef struct loom_named_tensor {
  const char *name;    /* borrowed */
  loom_tensor *tensor; /* borrowed; NULL entries are skipped where documented */
} loom_named_tensor;

/* PrepareGradientsForOptimizer: unscale every gradient in place and check it for inf/NaN in
 * one fused pass (loom_scaler_unscale), then, if f32 is non-NULL, give f32[i] the gradient in
 * f32 (a new reference: the gradient itself if it is f32, else a converted copy; NULL for a
 * NULL gradient). *ok: true if the optimizer may step (no inf/NaN, or check_overflow false).
 * scaler NULL: no unscale and no check (*ok true), only the conversion. The scaler's step
 * rules apply (LOOM_EMISUSE for a second unscale). On failure every f32[i] is NULL. */
int loom_amp_prepare_gradients(loom_scaler *scaler, const loom_named_tensor *grads, size_t n,
                               bool check_overflow, loom_tensor **f32, bool *ok);
/* The same with a context: its scaler, and needs_unscaling cleared once unscaled. */
int loom_amp_prepare_gradients_ctx(loom_amp_context *ctx, const loom_named_tensor *grads,
                                   size_t n, bool check_overflow, loom_tensor **f32, bool *ok);

/* ConvertGradientsDtype: out[i] = grads[i] in dtype dt (f32, f16, bf16): a new reference to the
 * gradient itself when it has dt already, else a converted copy; NULL for a NULL gradient. */
int loom_amp_convert_gradients(const loom_named_tensor *grads, size_t n, loom_dtype dt,
                               loom_tensor **out);

/* EnsureGradientCompatibility: LOOM_OK if every (non-NULL) gradient belongs to a parameter of
 * the same name with the same dtype and shape; otherwise the first fault, with a message
 * naming the parameter: LOOM_ENOTFOUND (no parameter of that name), LOOM_EDTYPE (gradient
 * f16, parameter f32), LOOM_ESHAPE ([4, 3] vs [3, 4]), LOOM_EINVAL (a duplicate or NULL name).
 * Parameters without a gradient are fine (unused in this step). *compatible (may be NULL)
 * is the spec's bool. */
int loom_amp_ensure_gradient_compatibility(const loom_named_tensor *params, size_t n_params,
                                           const loom_named_tensor *grads, size_t n_grads,
                                           bool *compatible);

/* ---- AMP graphs (CreateAmpGraph / RunAmpBackward; the spec's ComputationGraph) ------------- */

typedef struct loom_amp_graph loom_amp_graph;

/* The graph under `root` (a one-element loss, recorded under `mode` / `registry`), with the
 * named parameters whose gradients RunAmpBackward returns. Retains root and the parameter
 * tensors; copies the names. LOOM_EINVAL if root does not require grad, a parameter is not a
 * leaf requiring grad, or names repeat. */
int loom_amp_graph_create(loom_tensor *root, loom_autocast_mode mode,
                          const loom_amp_registry *registry, const loom_named_tensor *params,
                          size_t n, loom_amp_graph **out);
void loom_amp_graph_free(loom_amp_graph *g);
/* The graph's context (mode, registry, and after a backward the scaler and needs_unscaling). */
loom_amp_context loom_amp_graph_context(const loom_amp_graph *g);
/* Run the AMP backward (loom_backward_amp with retain_graph, so it may run again) and fill
 * grads[0..n) with each parameter's name and gradient (borrowed: the leaf's gradient, in the
 * parameter's dtype, still scaled: prepare it next). */
int loom_amp_graph_backward(loom_amp_graph *g, loom_scaler *scaler, loom_named_tensor *grads);

/* ---- AMP autograd functions (AmpAutogradFunction, AmpCustomFunction<TContext>) ------------ */

#define LOOM_AMP_CALL_SAVED 4
#define LOOM_AMP_FUNCTION_MAX_IN 8

/* One application of a function: the spec's TContext. create_context fills it; forward may
 * save tensors and state in it; backward reads them. The function's node owns it: saved
 * tensors are released and state_free(state) runs when the node is freed or spent. */
typedef struct loom_amp_call {
  loom_amp_context ctx;      /* mode: the forward dtype's mode in forward, the backward's in
                              * backward (MapDataTypeToMode); registry; scaler */
  loom_dtype forward_dtype;  /* the dtype the inputs were cast to for forward */
  loom_dtype backward_dtype; /* the dtype grad_out is given to backward in */
  loom_tensor *saved[LOOM_AMP_CALL_SAVED]; /* set by forward (new references), or NULL */
  void *state;                             /* the user's per-call state, or NULL */
  void (*state_free)(void *state);
} loom_amp_call;

/* CreateContext (optional): set up call (call->ctx starts as the thread's mode and the
 * function's registry). */
typedef int (*loom_amp_create_context_fn)(void *user, loom_tensor *const *inputs, int n_in,
                                          loom_amp_call *call);
/* ForwardImpl: compute *out from the inputs, already cast to call->forward_dtype (grad mode is
 * off). out must be a new tensor. */
typedef int (*loom_amp_forward_fn)(void *user, loom_amp_call *call, loom_tensor *const *inputs,
                                   int n_in, loom_tensor **out);
/* BackwardImpl: given grad_out in call->backward_dtype (contiguous, the output's shape), set
 * grad_in[i] for each input with needs[i] to a new tensor of input i's shape in any floating
 * dtype (it is widened to f32 and accumulated into the input's gradient in its own dtype).
 * NULL entries contribute nothing. */
typedef int (*loom_amp_backward_fn)(void *user, loom_amp_call *call, loom_tensor *grad_out,
                                    int n_in, const bool *needs, loom_tensor **grad_in);

typedef struct loom_amp_function_def {
  const char *name;      /* static storage; names the node and messages */
  loom_amp_op op;        /* its kind: the registry's policy gives the automatic dtypes */
  int n_in;              /* inputs, 1 .. LOOM_AMP_FUNCTION_MAX_IN */
  loom_amp_create_context_fn create_context; /* may be NULL */
  loom_amp_forward_fn forward;               /* required */
  loom_amp_backward_fn backward;             /* required */
  void *user;            /* the function's own context, passed to every callback; borrowed */
} loom_amp_function_def;

typedef struct loom_amp_function loom_amp_function;

/* A function from its definition (copied) and registry (NULL: the registry of the autocast
 * region in force at each forward, or the default registry of its mode). LOOM_EINVAL naming
 * the field for a NULL name or callback, n_in out of range, or op not a kind. */
int loom_amp_function_create(const loom_amp_function_def *def, const loom_amp_registry *reg,
                             loom_amp_function **out);
/* NULL ok. Nodes recorded by the function keep working after it is freed only if def->user
 * outlives them. */
void loom_amp_function_free(loom_amp_function *f);

/* GetForwardDtype: the dtype of an input of dtype `in` under `mode` for the function's kind
 * (LOWER: the mode's low dtype; FP32: f32; NONE, PROMOTE or mode off: `in`). */
loom_dtype loom_amp_function_forward_dtype(const loom_amp_function *f, loom_autocast_mode mode,
                                           loom_dtype in);
/* GetBackwardDtype: the dtype backward computes in: the forward dtype (PyTorch's custom_bwd
 * runs backward under the forward's autocast state). */
loom_dtype loom_amp_function_backward_dtype(const loom_amp_function *f, loom_autocast_mode mode,
                                            loom_dtype in);

/* Forward (automatic): floating inputs cast to the forward dtype of the thread's autocast mode
 * (promote: the widest input dtype), forward run without grad, the output recorded on the tape
 * (loom_autograd_record_custom) with the backward dtype. n_in must equal def->n_in. */
int loom_amp_function_forward(loom_amp_function *f, loom_tensor *const *inputs, int n_in,
                              loom_tensor **out);
/* ForwardManual: the same with the dtypes given (f32, f16 or bf16). */
int loom_amp_function_forward_manual(loom_amp_function *f, loom_tensor *const *inputs, int n_in,
                                     loom_dtype forward_dtype, loom_dtype backward_dtype,
                                     loom_tensor **out);

#ifdef __cplusplus
}
#endif
#endif
