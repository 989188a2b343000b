/* amp_int.h: what the amp files share (private to loom): the scaler object and its vtable
 * (one interface, a static and a dynamic implementation), and the unscale kernel table with
 * its dispatch levels. */
#ifndef LOOM_AMP_INT_H
#define LOOM_AMP_INT_H

#include "core/core_int.h"
#include "loom/amp.h"

#include <stdint.h>

/* ---- private unscale and check forms (the public ones: loom/scaler.h) ---------------------- */

/* One raw gradient buffer (an FSDP shard, a DDP bucket). */
typedef struct loom__amp_buffer {
  void *data;
  loom_dtype dtype; /* f32, f16, bf16 */
  size_t n;         /* elements */
} loom__amp_buffer;

/* loom_scaler_unscale over raw buffers (the whole step's gradients in one call). */
int loom__scaler_unscale_buffers(loom_scaler *s, const loom__amp_buffer *bufs, size_t n,
                                 bool *found_inf);
/* Whether any gradient holds inf or NaN (the spec's CheckOverflow), without unscaling: stops at
 * the first one found. Does not change the step's state. */
int loom__scaler_check_overflow(const loom_scaler *s, loom_tensor *const *grads, size_t n,
                                bool *overflow);
/* The kernels, without a scaler. */

/* Unscale n values of a raw buffer in place by inv_scale (rounded once to f32) and report
 * whether any result is inf or NaN. inv_scale must be finite and > 0. */
int loom__amp_unscale(void *data, loom_dtype dt, size_t n, double inv_scale, bool *found_inf);
/* The same over a list of tensors (NULL entries skipped, strided ok). */
int loom__amp_unscale_tensors(loom_tensor *const *ts, size_t n, double inv_scale,
                             bool *found_inf);
/* Whether a raw buffer / any tensor of a list holds inf or NaN; stops at the first found. */
int loom__amp_has_nonfinite(const void *data, loom_dtype dt, size_t n, bool *out);
int loom__amp_has_nonfinite_tensors(loom_tensor *const *ts, size_t n, bool *out);

/* The in-place form of the hooks (loom_amp_check_hooks_create's sibling): each hook unscales
 * its gradient as backward completes it; finish closes the step as loom_scaler_unscale does.
 * Not with loom_ddp (it writes the gradients DDP is about to reduce). Arm, finish and free as
 * the checking hooks. params: leaves that require grad. */
int loom__amp_unscale_hooks_create(loom_scaler *s, loom_tensor *const *params, size_t n,
                                   loom_amp_unscale_hooks **out);

/* ---- scalers ------------------------------------------------------------------------------ */

#define LOOM__SCALER_MAGIC 0x53434c52u /* "SCLR" */
#define LOOM__SCALER_DEAD 0xdeadbeefu

/* Where the step is: nothing scaled since the last update, a loss scaled, gradients unscaled
 * in place, or gradients checked with their unscale deferred to the optimizer. */
typedef enum loom__scaler_stage {
  LOOM__STAGE_IDLE = 0,
  LOOM__STAGE_SCALED = 1,
  LOOM__STAGE_UNSCALED = 2,
  LOOM__STAGE_CHECKED = 3
} loom__scaler_stage;

typedef struct loom__scaler_ops {
  loom_scaler_kind kind;
  /* The scale after an update with this overflow flag (growth_counter already maintained by
   * the implementation in s->growth_counter). */
  float (*next_scale)(loom_scaler *s, bool overflow);
} loom__scaler_ops;

struct loom_scaler {
  uint32_t magic;
  const loom__scaler_ops *ops;
  loom_dynamic_scaler_cfg cfg; /* static: initial = min = max = the scale */
  float scale;
  int64_t growth_counter;
  int64_t overflows, successes, increases, decreases;
  float min_reached, max_reached;
  loom__scaler_stage stage;
};

/* A new scaler with ops and a validated cfg, in its initial state. */
int loom__scaler_new(const loom__scaler_ops *ops, const loom_dynamic_scaler_cfg *cfg,
                     loom_scaler **out);
/* Validate a scaler handle: LOOM_EINVAL for NULL, LOOM_EMISUSE for a freed one. */
int loom__scaler_check(const loom_scaler *s, const char *who);

/* The step's rule for unscaling (LOOM_EMISUSE if already unscaled or nothing was scaled), and
 * marking the step unscaled once done (the hooked unscale of amp_hooks.c). */
int loom__scaler_begin_unscale(loom_scaler *s, const char *who);
void loom__scaler_mark_unscaled(loom_scaler *s);
/* The same end for a deferred unscale (loom_scaler_check, the checking hooks). */
void loom__scaler_mark_checked(loom_scaler *s);

extern const loom__scaler_ops loom__scaler_static_ops;
extern const loom__scaler_ops loom__scaler_dynamic_ops;

/* ---- unscale kernels ---------------------------------------------------------------------- */

/* One table per dispatch level. unscale_*: x[i] *= inv in f32 (f16/bf16 widened, multiplied,
 * rounded back to nearest even), in place; returns true iff a stored result is inf or NaN.
 * nonfinite_*: true iff some x[i] is inf or NaN, stopping early once one is found. */
typedef struct loom__amp_kernels {
  bool (*unscale_f32)(float *x, size_t n, float inv);
  bool (*unscale_f16)(uint16_t *x, size_t n, float inv);
  bool (*unscale_bf16)(uint16_t *x, size_t n, float inv);
  bool (*nonfinite_f32)(const float *x, size_t n);
  bool (*nonfinite_f16)(const uint16_t *x, size_t n);
  bool (*nonfinite_bf16)(const uint16_t *x, size_t n);
} loom__amp_kernels;

/* A level's table (unscale_<level>.c), from the kernels every level's file names alike. */
#define LOOM__AMP_KERNELS(NAME)                                                                \
  const loom__amp_kernels NAME = {unscale_f32,   unscale_f16,   unscale_bf16,                  \
                                  nonfinite_f32, nonfinite_f16, nonfinite_bf16}

/* The tables, the table for a given level (tests compare each level against scalar) and the
 * active level's (core_int.h's kernel-table pattern). */
LOOM__KERNEL_TABLES(loom__amp_kernels, loom__amp_kernels, loom__amp_kernels_for, loom__amp_k);

/* Checks a gradient list: LOOM_EINVAL for a NULL list with n > 0, each non-NULL entry a live
 * tensor of dtype f32, f16 or bf16 (LOOM_EDTYPE naming its index). */
int loom__amp_check_tensors(const char *who, loom_tensor *const *ts, size_t n);

/* Whether unscaling tensor t (f32, f16 or bf16, live) by inv would find inf or NaN, without
 * writing it: the early-exit check of its stored values, and, when inv > 1 (a scale below 1),
 * of every product x * inv in f32 (which can overflow). For f32 gradients this is exactly the
 * flag loom__amp_unscale_tensors would give. */
bool loom__amp_scaled_nonfinite(const loom_tensor *t, float inv);

/* Elements the early-exit check scans between tests of its running flag. */
#define LOOM__AMP_CHECK_BLOCK 1024

#endif
