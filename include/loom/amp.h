/* loom/amp.h: loss scaling for mixed-precision training: the scaler interface with its static
 * and dynamic implementations, and the fused unscale + inf/NaN check over gradients.
 *
 * A training step with a scaler (seed spec amp-dynamic-loss-scaler.md):
 *
 *   loom_scaler *s;  loom_scaler_create_dynamic(NULL, &s);          (the defaults)
 *   for each step:
 *     forward; loss;  loom_scaler_scale_loss(s, loss)                (loss *= scale)
 *     backward
 *     bool overflow;  loom_scaler_unscale(s, grads, n, &overflow)    (grads *= 1/scale, one pass)
 *     [DDP/FSDP: overflow = all-reduce MAX of overflow over the ranks]
 *     if (!overflow) optimizer step
 *     loom_scaler_update(s, overflow)                                 (ends the step)
 *
 * The fast step defers the unscale to the optimizer, which multiplies each gradient by 1/scale
 * as it loads it (loom/optim.h), so no pass writes the gradients:
 *
 *     backward
 *     bool overflow;  loom_scaler_check(s, grads, n, &overflow)      (read-only, early exit)
 *     float gs;       loom_scaler_grad_scale(s, &gs)                 (1/scale, before update!)
 *     [clipping: loom_clip_grad_norm_scaled(segs, nseg, max_norm, gs, ..., &gs)]
 *     if (!overflow) loom_optim_step_scaled(opt, gs)
 *     loom_scaler_update(s, overflow)
 *
 * For f32 gradients it gives the bits of unscale + loom_optim_step (same flag, same products;
 * with clipping, the same bits for power-of-two scales, which every preset keeps). The checking
 * hooks (loom_amp_check_hooks_create) run the check from backward instead.
 *
 * The step is a small state machine: scaling a loss (any number of times: gradient
 * accumulation) opens the step, unscale or check may run once, update closes it. Unscaling twice in one
 * step, or after update without a new scaled loss, is refused with LOOM_EMISUSE (the second
 * unscale would divide by the scale again; unscaling after update would divide by the updated
 * scale, which is wrong whenever that update grew or shrank it). The same holds for check, and
 * for a check after an unscale or the reverse; loom_scaler_grad_scale is refused (LOOM_EMISUSE)
 * outside the window between unscale/check and update, where 1/scale is the right factor. The seed spec's usage example
 * unscales after UpdateScale; loom refuses that order for this reason.
 *
 * Update rule (dynamic, exactly the spec's):
 *   overflow:  scale = max(scale * backoff_factor, min_scale); growth_counter = 0; overflows++
 *   else:      growth_counter++; if growth_counter >= growth_interval:
 *                scale = min(scale * growth_factor, max_scale); growth_counter = 0
 * (products in f32, as the spec's float arithmetic). A static scaler's scale never changes;
 * both count overflows and successful iterations. A disabled dynamic scaler has scale 1 and
 * its update changes nothing (PyTorch GradScaler(enabled=False)).
 *
 * Unscale multiplies by 1/scale, the reciprocal computed in double and rounded once to f32
 * (PyTorch's `scale.double().reciprocal().float()`), in f32 arithmetic. f16 and bf16 buffers
 * are unscaled in place: each value widened to f32, multiplied, and written back rounded to
 * nearest even. "Found inf" is true iff some unscaled value, as stored, is inf or NaN (which
 * includes every non-finite input, since 1/scale is finite and positive).
 *
 * Ownership: scalers are opaque, made by loom_scaler_create_* and released by loom_scaler_free
 * (NULL ok). Tensors passed in are borrowed. Errors: every fallible call returns a status with
 * a message naming the function and the field or argument at fault; on a failed create *out
 * is NULL. Threads: one scaler belongs to one thread at a time (each rank has its own); the
 * buffer functions are thread-safe on disjoint buffers. */
#ifndef LOOM_AMP_H
#define LOOM_AMP_H

#include "loom/autocast.h"
#include "loom/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- dynamic scaler configuration -------------------------------------------------------- */

typedef struct loom_dynamic_scaler_cfg {
  float initial_scale;     /* default 65536 (2^16) */
  float growth_factor;     /* > 1; default 2 */
  float backoff_factor;    /* in (0, 1); default 0.5 */
  int64_t growth_interval; /* >= 1 clean steps before growth; default 2000 */
  float min_scale;         /* > 0; default 1 */
  float max_scale;         /* >= min_scale, finite; default 2^24 */
  bool enabled;            /* default true */
} loom_dynamic_scaler_cfg;

/* The spec's defaults (DynamicScalerConfig.CreateDefault). */
loom_dynamic_scaler_cfg loom_dynamic_scaler_cfg_default(void);
/* Slower growth, lower ceiling (CreateConservative): initial 2^15, growth 2, backoff 0.5,
 * interval 5000, min 1, max 2^20. For models that overflow often: fewer skipped steps. */
loom_dynamic_scaler_cfg loom_dynamic_scaler_cfg_conservative(void);
/* Faster growth (CreateAggressive): initial 2^16, growth 2, backoff 0.5, interval 500, min 1,
 * max 2^24. Recovers the scale four times as fast after an overflow; more skipped steps.
 * Every preset uses powers of two, so the scale stays a power of two and unscaling is exact. */
loom_dynamic_scaler_cfg loom_dynamic_scaler_cfg_aggressive(void);
/* A preset by name: "default", "conservative", "aggressive". LOOM_ENOTFOUND for another name,
 * LOOM_EINVAL for NULL arguments. */
int loom_dynamic_scaler_cfg_preset(const char *name, loom_dynamic_scaler_cfg *cfg);
/* LOOM_OK, or LOOM_EINVAL with a message naming the first bad field: a NaN, infinite or
 * negative value; growth_factor <= 1; backoff_factor outside (0, 1); min_scale <= 0;
 * min_scale > max_scale; initial_scale outside [min_scale, max_scale]; growth_interval < 1. */
int loom_dynamic_scaler_cfg_validate(const loom_dynamic_scaler_cfg *cfg);

/* ---- creating scalers -------------------------------------------------------------------- */

typedef struct loom_scaler loom_scaler;

typedef enum loom_scaler_kind { LOOM_SCALER_STATIC = 1, LOOM_SCALER_DYNAMIC = 2 } loom_scaler_kind;

/* A dynamic scaler (DynamicLossScaler). cfg NULL means loom_dynamic_scaler_cfg_default. The
 * config is validated (loom_dynamic_scaler_cfg_validate) and copied. */
int loom_scaler_create_dynamic(const loom_dynamic_scaler_cfg *cfg, loom_scaler **out);
/* A static scaler (StaticLossScaler) with a fixed scale: finite and > 0. */
int loom_scaler_create_static(float scale, loom_scaler **out);
/* NULL ok. */
void loom_scaler_free(loom_scaler *s);

/* ---- properties (s must be a live scaler; values of a NULL scaler are 0 / false) --------- */

loom_scaler_kind loom_scaler_get_kind(const loom_scaler *s);
/* "static" or "dynamic". */
const char *loom_scaler_kind_name(loom_scaler_kind kind);
/* The current scale (1 when disabled). */
float loom_scaler_get_scale(const loom_scaler *s);
/* 1/scale computed in double (what unscale rounds to f32 and multiplies by). */
double loom_scaler_get_inv_scale(const loom_scaler *s);
bool loom_scaler_enabled(const loom_scaler *s);
/* The scaler's configuration (a static scaler reports its scale as initial, min and max, and
 * growth = backoff = 1 would be invalid, so they read 2 and 0.5 but are never used). */
int loom_scaler_get_config(const loom_scaler *s, loom_dynamic_scaler_cfg *out);
/* Consecutive clean updates since the last change of scale (GrowthCounter). */
int64_t loom_scaler_growth_counter(const loom_scaler *s);
/* Total overflows seen by update (TotalOverflows). */
int64_t loom_scaler_total_overflows(const loom_scaler *s);

/* ---- the step ---------------------------------------------------------------------------- */

/* *value *= scale (ScaleLoss on a plain float). Opens the step. */
int loom_scaler_scale_value(loom_scaler *s, float *value);
/* loss *= scale in place (f32, f16 or bf16, any shape, strided ok). Opens the step. The
 * autograd-aware form (a new tensor on the tape) is in the AMP autograd layer. */
int loom_scaler_scale_loss(loom_scaler *s, loom_tensor *loss);
/* A new 0-d f32 tensor holding the scale (GetScaleTensor) / 1/scale rounded to f32
 * (GetInverseScaleTensor). */
int loom_scaler_scale_tensor(const loom_scaler *s, loom_tensor **out);
int loom_scaler_inv_scale_tensor(const loom_scaler *s, loom_tensor **out);

/* Unscale n gradients in place (UnscaleGradients) in one fused pass that also finds inf/NaN;
 * *found_inf (may be NULL) says whether any unscaled value is inf or NaN. NULL entries are
 * skipped. Gradients must be f32, f16 or bf16 (LOOM_EDTYPE otherwise); strided views are fine.
 * LOOM_EMISUSE if this step was already unscaled or no loss was scaled since the last update.
 * A disabled scaler (scale 1) only checks. */
int loom_scaler_unscale(loom_scaler *s, loom_tensor *const *grads, size_t n, bool *found_inf);

/* One raw gradient buffer (an FSDP shard, a DDP bucket). */
typedef struct loom_amp_buffer {
  void *data;
  loom_dtype dtype; /* f32, f16, bf16 */
  size_t n;         /* elements */
} loom_amp_buffer;

/* The same over raw buffers (the whole step's gradients in one call). */
int loom_scaler_unscale_buffers(loom_scaler *s, const loom_amp_buffer *bufs, size_t n,
                                bool *found_inf);
/* Whether any gradient holds inf or NaN (CheckOverflow), without unscaling: stops at the first
 * one found. Does not change the step's state. */
int loom_scaler_check_overflow(const loom_scaler *s, loom_tensor *const *grads, size_t n,
                               bool *overflow);

/* The deferred unscale (see the top of this file): close the step's unscale without writing
 * the gradients; *found_inf (may be NULL) is what loom_scaler_unscale would report for f32
 * gradients: some gradient holds inf or NaN (early exit at the first), or, for a scale below 1
 * (1/scale > 1), some product g * (1/scale) overflows in f32. The gradients stay multiplied by
 * the scale: pass loom_scaler_grad_scale to loom_optim_step_scaled. Same arguments, errors and
 * step rules as loom_scaler_unscale. f16/bf16 gradients are checked as stored; an optimizer
 * reads them widened to f32 (loom_master_load_grads), where the deferred product is exact f32,
 * not the in-place unscale's rounding to f16/bf16. */
int loom_scaler_check(loom_scaler *s, loom_tensor *const *grads, size_t n, bool *found_inf);

/* The factor the optimizer must still multiply this step's gradients by: 1/scale rounded to
 * f32 after loom_scaler_check (or the checking hooks), 1 after an in-place unscale. LOOM_EMISUSE
 * before the step's unscale/check or after update (the scale may have changed). */
int loom_scaler_grad_scale(const loom_scaler *s, float *out);

/* Close the step with the (all-rank) overflow flag: apply the update rule and count the
 * iteration (UpdateScale). Under DDP/FSDP pass the flag all-reduced with MAX over the ranks,
 * so every rank keeps the same scale. May be called without unscale (a skipped step). */
int loom_scaler_update(loom_scaler *s, bool overflow);

/* Back to the state just after create: scale = initial, counters and statistics zero. */
int loom_scaler_reset(loom_scaler *s);

/* ---- statistics -------------------------------------------------------------------------- */

typedef struct loom_scaler_stats {
  float current_scale;
  int64_t total_overflows;             /* updates with overflow */
  int64_t total_successful_iterations; /* updates without overflow */
  int64_t scale_increase_count;        /* updates that raised the scale (not those capped) */
  int64_t scale_decrease_count;        /* updates that lowered it (not those at min_scale) */
  float min_scale_reached;             /* lowest scale held since create/reset */
  float max_scale_reached;             /* highest scale held since create/reset */
  double success_rate;                 /* successful / (successful + overflows); 0 if none */
} loom_scaler_stats;

/* The scaler's statistics (GetStats). */
int loom_scaler_stats_get(const loom_scaler *s, loom_scaler_stats *out);
/* loom_scaler_stats(s, &st): the same call under the name the issue gives it. C has one
 * namespace for types and functions, so the name is a function-like macro: `loom_scaler_stats
 * st;` declares the struct and `loom_scaler_stats(s, &st)` calls loom_scaler_stats_get. */
#define loom_scaler_stats(s, out) loom_scaler_stats_get((s), (out))
/* One line of text (ToString): "scale 65536, overflows 3, successful 997, increases 1,
 * decreases 3, min 8192, max 131072, success rate 99.70%". LOOM_OK even if truncated
 * (always NUL-terminated); LOOM_EINVAL for NULL arguments or cap 0. */
int loom_scaler_stats_format(const loom_scaler_stats *st, char *buf, size_t cap);

/* ---- save / restore ---------------------------------------------------------------------- */

/* The whole state of a scaler: what a checkpoint must carry to resume bit-exactly. */
typedef struct loom_scaler_state {
  loom_scaler_kind kind;
  loom_dynamic_scaler_cfg cfg;
  float scale;
  int64_t growth_counter;
  int64_t total_overflows, total_successful_iterations;
  int64_t scale_increase_count, scale_decrease_count;
  float min_scale_reached, max_scale_reached;
} loom_scaler_state;

int loom_scaler_save(const loom_scaler *s, loom_scaler_state *out);
/* Replace s's whole state (config included). LOOM_EINVAL with a message naming the field if
 * the state's kind differs from s's, its config is invalid, the scale (or the min / max scale
 * reached) lies outside [min_scale, max_scale] (or is not 1 when disabled), a counter is
 * negative or above 2^62, or the counters contradict each other (increases above successful
 * iterations, decreases above overflows, growth_counter above successful iterations). The step's state returns to "no loss
 * scaled yet". On failure s is unchanged. */
int loom_scaler_restore(loom_scaler *s, const loom_scaler_state *st);

/* The flat form, for a checkpoint (one i64 tensor "amp.scaler" of LOOM_SCALER_STATE_WORDS
 * values): word 0 a magic and version, then every field, f32 fields as their bit patterns.
 * Round-trips exactly. unpack: LOOM_EFORMAT for a wrong magic/version or a field out of
 * range (a bool other than 0/1, a float bit pattern wider than 32 bits). */
#define LOOM_SCALER_STATE_WORDS 17
int loom_scaler_state_pack(const loom_scaler_state *st, int64_t out[LOOM_SCALER_STATE_WORDS]);
int loom_scaler_state_unpack(const int64_t in[LOOM_SCALER_STATE_WORDS], loom_scaler_state *out);
/* The name of word i ("magic", "kind", "initial_scale", ...), NULL past the end. */
const char *loom_scaler_state_word_name(size_t i);

/* ---- the kernels, without a scaler ------------------------------------------------------- */

/* Unscale n values of a raw buffer in place by inv_scale (rounded once to f32) and report
 * whether any result is inf or NaN. inv_scale must be finite and > 0. */
int loom_amp_unscale(void *data, loom_dtype dt, size_t n, double inv_scale, bool *found_inf);
/* The same over a list of tensors (NULL entries skipped, strided ok). */
int loom_amp_unscale_tensors(loom_tensor *const *ts, size_t n, double inv_scale,
                             bool *found_inf);
/* Whether a raw buffer / any tensor of a list holds inf or NaN; stops at the first found. */
int loom_amp_has_nonfinite(const void *data, loom_dtype dt, size_t n, bool *out);
int loom_amp_has_nonfinite_tensors(loom_tensor *const *ts, size_t n, bool *out);

/* ==== AMP autograd integration (seed spec amp-autograd-integration.md) ===================== *
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

/* ---- unscaling from the gradient hooks (the fast step) ------------------------------------ */

/* The unscale + inf/NaN check of each parameter's gradient run from its autograd hook, the
 * moment backward completes that gradient, while it is still in cache: the step's scaler work
 * overlaps backward and no separate pass over the gradients is left after it.
 *
 *   loom_amp_unscale_hooks_create(s, params, n, &h)      (once: registers a hook per param)
 *   each step:  loom_amp_unscale_hooks_arm(h)            (before the step's last backward)
 *               forward; loom_backward_amp(loss, s, false)
 *               loom_amp_unscale_hooks_finish(h, &found) (unscales what no hook reached)
 *               if (!found) optimizer step;  loom_scaler_update(s, found)
 *
 * Arm before the backward of the last micro-batch only (earlier micro-batches accumulate
 * scaled; the hooks then unscale the complete sums). finish closes the step's unscale exactly
 * as loom_scaler_unscale would (LOOM_EMISUSE if no loss was scaled or it was unscaled
 * already) and disarms. Gradients of f32, f16, bf16. Retains the parameter tensors; the scaler
 * is borrowed and must outlive h. One thread (the one running backward). Not with loom_ddp:
 * it writes the gradients that DDP is about to reduce (use the checking form below). */
typedef struct loom_amp_unscale_hooks loom_amp_unscale_hooks;

/* params: leaves that require grad (LOOM_EINVAL otherwise). */
int loom_amp_unscale_hooks_create(loom_scaler *s, loom_tensor *const *params, size_t n,
                                  loom_amp_unscale_hooks **out);
/* The deferred form: each hook only checks its gradient (loom_scaler_check's rule, skipped
 * once something was found) and writes nothing; finish closes the step as loom_scaler_check
 * does, so the optimizer applies loom_scaler_grad_scale (loom_optim_step_scaled). It turns on
 * each parameter's gradient bound (loom_tensor_track_grad_bound, loom/autograd.h; off again at
 * free) and reads a gradient only when backward could not bound it: a linear weight or bias
 * gradient written since loom_tensor_zero_grad is known finite (|x * 1/scale| <= bound / scale)
 * and not read; anything else (unknown, or said to hold inf/NaN) is read as loom_scaler_check
 * would. So do not write values into a gradient's memory between zero_grad and finish other
 * than through loom's backward (such a write would not be seen). With loom_ddp, before or
 * after loom_ddp_create: the hooks run in the LOCAL phase (loom_hook_phase, loom/autograd.h),
 * so they check each rank's own gradients before DDP's REDUCE-phase hook starts the bucket's
 * all-reduce; combine the flag with loom_ddp_any (all ranks then skip the same steps:
 * tests/ddp/test_ddp_amp.c). Arm, finish and free as above:
 *   arm; forward; loom_backward_amp; finish(h, &found); loom_scaler_grad_scale(s, &gs);
 *   if (!found) loom_optim_step_scaled(opt, gs);  loom_scaler_update(s, found) */
int loom_amp_check_hooks_create(loom_scaler *s, loom_tensor *const *params, size_t n,
                                loom_amp_unscale_hooks **out);
/* Removes the hooks. NULL ok. */
void loom_amp_unscale_hooks_free(loom_amp_unscale_hooks *h);
int loom_amp_unscale_hooks_arm(loom_amp_unscale_hooks *h);
/* *found_inf: some gradient holds inf or NaN after unscaling (checking hooks: would hold). */
int loom_amp_unscale_hooks_finish(loom_amp_unscale_hooks *h, bool *found_inf);

#ifdef __cplusplus
}
#endif
#endif
