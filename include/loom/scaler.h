/* loom/scaler.h: loss scaling for mixed-precision training: the scaler interface with its
 * static and dynamic implementations, and the two ways to unscale the gradients: in place
 * (loom_scaler_unscale), or deferred to the optimizer (loom_scaler_check, from backward's
 * hooks with loom_amp_check_hooks_create). loom/step.h runs a whole step with it; loom/amp.h
 * has the AMP autograd helpers.
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
#ifndef LOOM_SCALER_H
#define LOOM_SCALER_H

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

/* ---- checking from the gradient hooks (the fast deferred step) ---------------------------- */

/* The deferred check (loom_scaler_check) run from each parameter's autograd hook, the moment
 * backward completes its gradient: the step's scaler work overlaps backward and no pass over
 * the gradients is left after it. Arm before the backward of the last micro-batch only
 * (earlier micro-batches accumulate scaled). The scaler is borrowed and must outlive h; the
 * parameter tensors are retained. One thread (the one running backward). */
typedef struct loom_amp_unscale_hooks loom_amp_unscale_hooks;

/* params: leaves that require grad (LOOM_EINVAL otherwise). Each hook only checks its gradient (loom_scaler_check's rule, skipped
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
