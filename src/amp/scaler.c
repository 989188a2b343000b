/* scaler.c: the loss-scaler interface (ILossScaler): what every scaler does the same way,
 * whatever its update rule: the handle, the step's state machine (scale -> unscale once ->
 * update), loss scaling, the statistics and their printable form. The update rules live in
 * scaler_dynamic.c and scaler_static.c; save/restore in scaler_state.c; the fused kernels in
 * unscale*.c. */
#include "amp/amp_int.h"
#include "core/tensor_int.h"

#include <inttypes.h>
#include <stdio.h>

int loom__scaler_check(const loom_scaler *s, const char *who) {
  if (!s) return loom__fail(LOOM_EINVAL, "%s: scaler is NULL", who);
  if (s->magic != LOOM__SCALER_MAGIC)
    return loom__fail(LOOM_EMISUSE, "%s: scaler is not live (freed or not a scaler)", who);
  return LOOM_OK;
}

/* The initial state of a scaler with its config (create and reset). */
static void initial_state(loom_scaler *s) {
  s->scale = s->cfg.enabled ? s->cfg.initial_scale : 1.0f;
  s->growth_counter = 0;
  s->overflows = s->successes = s->increases = s->decreases = 0;
  s->min_reached = s->max_reached = s->scale;
  s->stage = LOOM__STAGE_IDLE;
}

int loom__scaler_new(const loom__scaler_ops *ops, const loom_dynamic_scaler_cfg *cfg,
                     loom_scaler **out) {
  if (!out) return loom__fail(LOOM_EINVAL, "loom_scaler_create: out is NULL");
  *out = NULL;
  int rc = loom_dynamic_scaler_cfg_validate(cfg);
  if (rc) return rc;
  loom_scaler *s = loom__calloc(LOOM_POOL_META, 1, sizeof *s);
  if (!s) return loom__fail(LOOM_ENOMEM, "loom_scaler_create: out of memory");
  s->magic = LOOM__SCALER_MAGIC;
  s->ops = ops;
  s->cfg = *cfg;
  initial_state(s);
  *out = s;
  return LOOM_OK;
}

void loom_scaler_free(loom_scaler *s) {
  if (!s || s->magic != LOOM__SCALER_MAGIC) return;
  s->magic = LOOM__SCALER_DEAD;
  loom__free(s);
}

/* ---- properties ---------------------------------------------------------------------------- */

static bool live(const loom_scaler *s) { return s && s->magic == LOOM__SCALER_MAGIC; }

loom_scaler_kind loom_scaler_get_kind(const loom_scaler *s) {
  return live(s) ? s->ops->kind : (loom_scaler_kind)0;
}

const char *loom_scaler_kind_name(loom_scaler_kind kind) {
  return kind == LOOM_SCALER_STATIC ? "static" : kind == LOOM_SCALER_DYNAMIC ? "dynamic" : "?";
}

float loom_scaler_get_scale(const loom_scaler *s) { return live(s) ? s->scale : 0.0f; }

double loom_scaler_get_inv_scale(const loom_scaler *s) {
  return live(s) ? 1.0 / (double)s->scale : 0.0;
}

bool loom_scaler_enabled(const loom_scaler *s) { return live(s) && s->cfg.enabled; }

int loom_scaler_get_config(const loom_scaler *s, loom_dynamic_scaler_cfg *out) {
  int rc = loom__scaler_check(s, "loom_scaler_get_config");
  if (rc) return rc;
  if (!out) return loom__fail(LOOM_EINVAL, "loom_scaler_get_config: out is NULL");
  *out = s->cfg;
  return LOOM_OK;
}

int64_t loom_scaler_growth_counter(const loom_scaler *s) {
  return live(s) ? s->growth_counter : 0;
}

int64_t loom_scaler_total_overflows(const loom_scaler *s) { return live(s) ? s->overflows : 0; }

/* ---- the step ------------------------------------------------------------------------------ */

/* Scaling a loss opens the step (or continues it: gradient accumulation). */
static int open_step(loom_scaler *s, const char *who) {
  int rc = loom__scaler_check(s, who);
  if (rc) return rc;
  if (s->stage == LOOM__STAGE_UNSCALED || s->stage == LOOM__STAGE_CHECKED)
    return loom__fail(LOOM_EMISUSE, "%s: this step's gradients were already %s; call "
                      "loom_scaler_update before scaling the next loss", who,
                      s->stage == LOOM__STAGE_CHECKED ? "checked" : "unscaled");
  return LOOM_OK;
}

int loom_scaler_scale_value(loom_scaler *s, float *value) {
  int rc = open_step(s, "loom_scaler_scale_value");
  if (rc) return rc;
  if (!value) return loom__fail(LOOM_EINVAL, "loom_scaler_scale_value: value is NULL");
  *value *= s->scale;
  s->stage = LOOM__STAGE_SCALED;
  return LOOM_OK;
}

typedef struct scale_ctx {
  unsigned char *base;
  loom_dtype dt;
  float scale;
} scale_ctx;

static void scale_one(size_t off, void *ctx) {
  scale_ctx *c = ctx;
  float v = (float)loom__load_f64(c->base, c->dt, off) * c->scale;
  loom__store_f64(c->base, c->dt, off, v);
}

int loom_scaler_scale_loss(loom_scaler *s, loom_tensor *loss) {
  static const char *who = "loom_scaler_scale_loss";
  int rc = open_step(s, who);
  if (rc || (rc = loom_tensor_check(loss, who))) return rc;
  if (!loom_dtype_is_float(loss->dtype))
    return loom__fail(LOOM_EDTYPE, "%s: loss has dtype %s, not f32, f16 or bf16", who,
                      loom_dtype_name(loss->dtype));
  scale_ctx c = {loss->storage->data, loss->dtype, s->scale};
  if (s->scale != 1.0f)
    loom__for_each_offset(loss->ndim, loss->shape, loss->strides, loss->offset, scale_one, &c);
  s->stage = LOOM__STAGE_SCALED;
  return LOOM_OK;
}

static int scalar_tensor(const loom_scaler *s, float v, const char *who, loom_tensor **out) {
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  int rc = loom__scaler_check(s, who);
  if (rc) return rc;
  return loom_tensor_from_data(LOOM_F32, 0, NULL, &v, out);
}

int loom_scaler_scale_tensor(const loom_scaler *s, loom_tensor **out) {
  return scalar_tensor(s, live(s) ? s->scale : 0.0f, "loom_scaler_scale_tensor", out);
}

int loom_scaler_inv_scale_tensor(const loom_scaler *s, loom_tensor **out) {
  return scalar_tensor(s, (float)loom_scaler_get_inv_scale(s), "loom_scaler_inv_scale_tensor",
                       out);
}

/* Unscale (in place or deferred) may run once per step, after a loss was scaled. */
static int begin_unscale(loom_scaler *s, const char *who) {
  int rc = loom__scaler_check(s, who);
  if (rc) return rc;
  if (s->stage == LOOM__STAGE_UNSCALED || s->stage == LOOM__STAGE_CHECKED)
    return loom__fail(LOOM_EMISUSE, "%s: gradients were already %s this step (unscale or "
                      "check runs once between loom_scaler_update calls)", who,
                      s->stage == LOOM__STAGE_CHECKED ? "checked for a deferred unscale"
                                                      : "unscaled");
  if (s->stage == LOOM__STAGE_IDLE)
    return loom__fail(LOOM_EMISUSE, "%s: no loss was scaled since the last loom_scaler_update "
                      "(unscale after the step, or before scaling a loss)", who);
  return LOOM_OK;
}

int loom__scaler_begin_unscale(loom_scaler *s, const char *who) { return begin_unscale(s, who); }

void loom__scaler_mark_unscaled(loom_scaler *s) { s->stage = LOOM__STAGE_UNSCALED; }

void loom__scaler_mark_checked(loom_scaler *s) { s->stage = LOOM__STAGE_CHECKED; }

int loom_scaler_unscale(loom_scaler *s, loom_tensor *const *grads, size_t n, bool *found_inf) {
  int rc = begin_unscale(s, "loom_scaler_unscale");
  if (rc) return rc;
  if ((rc = loom__amp_unscale_tensors(grads, n, loom_scaler_get_inv_scale(s), found_inf)))
    return rc;
  s->stage = LOOM__STAGE_UNSCALED;
  return LOOM_OK;
}

int loom__scaler_unscale_buffers(loom_scaler *s, const loom__amp_buffer *bufs, size_t n,
                                bool *found_inf) {
  static const char *who = "loom__scaler_unscale_buffers";
  int rc = begin_unscale(s, who);
  if (rc) return rc;
  if (n && !bufs) return loom__fail(LOOM_EINVAL, "%s: bufs is NULL", who);
  for (size_t i = 0; i < n; i++) /* check everything before changing anything */
    if (bufs[i].dtype != LOOM_F32 && bufs[i].dtype != LOOM_F16 && bufs[i].dtype != LOOM_BF16)
      return loom__fail(LOOM_EDTYPE, "%s: buffer %zu has dtype %s, not f32, f16 or bf16", who,
                        i, loom_dtype_name(bufs[i].dtype));
    else if (bufs[i].n && !bufs[i].data)
      return loom__fail(LOOM_EINVAL, "%s: buffer %zu has %zu elements and no data", who, i,
                        bufs[i].n);
  bool any = false;
  for (size_t i = 0; i < n; i++) {
    bool f = false;
    if ((rc = loom__amp_unscale(bufs[i].data, bufs[i].dtype, bufs[i].n,
                               loom_scaler_get_inv_scale(s), &f)))
      return rc;
    any |= f;
  }
  if (found_inf) *found_inf = any;
  s->stage = LOOM__STAGE_UNSCALED;
  return LOOM_OK;
}

/* ---- the deferred unscale: check now, the optimizer multiplies ------------------------------ */

int loom_scaler_check(loom_scaler *s, loom_tensor *const *grads, size_t n, bool *found_inf) {
  static const char *who = "loom_scaler_check";
  int rc = begin_unscale(s, who);
  if (rc || (rc = loom__amp_check_tensors(who, grads, n))) return rc;
  float inv = (float)loom_scaler_get_inv_scale(s);
  bool any = false;
  for (size_t i = 0; i < n && !any; i++)
    if (grads[i]) any = loom__amp_scaled_nonfinite(grads[i], inv);
  if (found_inf) *found_inf = any;
  s->stage = LOOM__STAGE_CHECKED;
  return LOOM_OK;
}

int loom_scaler_grad_scale(const loom_scaler *s, float *out) {
  static const char *who = "loom_scaler_grad_scale";
  int rc = loom__scaler_check(s, who);
  if (rc) return rc;
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  if (s->stage != LOOM__STAGE_UNSCALED && s->stage != LOOM__STAGE_CHECKED)
    return loom__fail(LOOM_EMISUSE, "%s: this step's gradients were neither unscaled nor "
                      "checked (call loom_scaler_check or loom_scaler_unscale after backward, "
                      "and read the factor before loom_scaler_update)", who);
  *out = s->stage == LOOM__STAGE_CHECKED ? (float)loom_scaler_get_inv_scale(s) : 1.0f;
  return LOOM_OK;
}

int loom__scaler_check_overflow(const loom_scaler *s, loom_tensor *const *grads, size_t n,
                               bool *overflow) {
  int rc = loom__scaler_check(s, "loom__scaler_check_overflow");
  if (rc) return rc;
  return loom__amp_has_nonfinite_tensors(grads, n, overflow);
}

int loom_scaler_update(loom_scaler *s, bool overflow) {
  int rc = loom__scaler_check(s, "loom_scaler_update");
  if (rc) return rc;
  s->stage = LOOM__STAGE_IDLE;
  if (!s->cfg.enabled) return LOOM_OK;
  float old = s->scale, next = s->ops->next_scale(s, overflow);
  if (overflow) s->overflows++;
  else s->successes++;
  if (next > old) s->increases++;
  if (next < old) s->decreases++;
  s->scale = next;
  if (next < s->min_reached) s->min_reached = next;
  if (next > s->max_reached) s->max_reached = next;
  return LOOM_OK;
}

int loom_scaler_reset(loom_scaler *s) {
  int rc = loom__scaler_check(s, "loom_scaler_reset");
  if (rc) return rc;
  initial_state(s);
  return LOOM_OK;
}

/* ---- statistics ---------------------------------------------------------------------------- */

int loom_scaler_stats_get(const loom_scaler *s, loom_scaler_stats *out) {
  int rc = loom__scaler_check(s, "loom_scaler_stats");
  if (rc) return rc;
  if (!out) return loom__fail(LOOM_EINVAL, "loom_scaler_stats: out is NULL");
  int64_t total = s->overflows + s->successes;
  *out = (loom_scaler_stats){.current_scale = s->scale,
                             .total_overflows = s->overflows,
                             .total_successful_iterations = s->successes,
                             .scale_increase_count = s->increases,
                             .scale_decrease_count = s->decreases,
                             .min_scale_reached = s->min_reached,
                             .max_scale_reached = s->max_reached,
                             .success_rate = total ? (double)s->successes / (double)total : 0.0};
  return LOOM_OK;
}

int loom_scaler_stats_format(const loom_scaler_stats *st, char *buf, size_t cap) {
  if (!st || !buf || !cap)
    return loom__fail(LOOM_EINVAL, "loom_scaler_stats_format: %s",
                      !st ? "stats is NULL" : !buf ? "buf is NULL" : "cap is 0");
  char rate[32];
  if (st->total_overflows + st->total_successful_iterations)
    snprintf(rate, sizeof rate, "%.2f%%", st->success_rate * 100.0);
  else
    snprintf(rate, sizeof rate, "n/a");
  snprintf(buf, cap,
           "scale %g, overflows %" PRId64 ", successful %" PRId64 ", increases %" PRId64
           ", decreases %" PRId64 ", min %g, max %g, success rate %s",
           (double)st->current_scale, st->total_overflows, st->total_successful_iterations,
           st->scale_increase_count, st->scale_decrease_count, (double)st->min_scale_reached,
           (double)st->max_scale_reached, rate);
  return LOOM_OK;
}
