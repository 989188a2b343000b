/* scaler_static.c: the static loss scaler (StaticLossScaler): one fixed scale. It shares the
 * interface, the step's state machine, overflow detection and statistics with the dynamic
 * scaler (scaler.c); its update rule keeps the scale. */
#include "amp/amp_int.h"

#include <math.h>

static float static_next(loom_scaler *s, bool overflow) {
  (void)overflow;
  return s->scale;
}

const loom__scaler_ops loom__scaler_static_ops = {LOOM_SCALER_STATIC, static_next};

int loom_scaler_create_static(float scale, loom_scaler **out) {
  if (!out) return loom__fail(LOOM_EINVAL, "loom_scaler_create_static: out is NULL");
  *out = NULL;
  if (!isfinite(scale) || !(scale > 0.0f))
    return loom__fail(LOOM_EINVAL, "loom_scaler_create_static: scale must be finite and > 0 "
                      "(got %g)", (double)scale);
  loom_dynamic_scaler_cfg cfg = loom_dynamic_scaler_cfg_default();
  cfg.initial_scale = cfg.min_scale = cfg.max_scale = scale;
  return loom__scaler_new(&loom__scaler_static_ops, &cfg, out);
}
