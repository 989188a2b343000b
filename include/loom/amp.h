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
 * The step is a small state machine: scaling a loss (any number of times: gradient
 * accumulation) opens the step, unscale may run once, update closes it. Unscaling twice in one
 * step, or after update without a new scaled loss, is refused with LOOM_EMISUSE (the second
 * unscale would divide by the scale again; unscaling after update would divide by the updated
 * scale, which is wrong whenever that update grew or shrank it). The seed spec's usage example
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
void loom_dynamic_scaler_cfg_default(loom_dynamic_scaler_cfg *cfg);
/* Slower growth, lower ceiling (CreateConservative): initial 2^15, growth 2, backoff 0.5,
 * interval 5000, min 1, max 2^20. For models that overflow often: fewer skipped steps. */
void loom_dynamic_scaler_cfg_conservative(loom_dynamic_scaler_cfg *cfg);
/* Faster growth (CreateAggressive): initial 2^16, growth 2, backoff 0.5, interval 500, min 1,
 * max 2^24. Recovers the scale four times as fast after an overflow; more skipped steps.
 * Every preset uses powers of two, so the scale stays a power of two and unscaling is exact. */
void loom_dynamic_scaler_cfg_aggressive(loom_dynamic_scaler_cfg *cfg);
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
/* Replace s's whole state (config included). LOOM_EINVAL with a message if the state's kind
 * differs from s's, its config is invalid, the scale lies outside [min_scale, max_scale] (or
 * is not 1 when disabled), or a counter is negative. The step's state returns to "no loss
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

#ifdef __cplusplus
}
#endif
#endif
