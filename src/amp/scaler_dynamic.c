/* scaler_dynamic.c: the dynamic loss scaler: its configuration (defaults, presets,
 * validation) and its update rule, exactly the seed spec's (amp-dynamic-loss-scaler.md). The
 * bookkeeping shared with the static scaler (statistics, step state) is in scaler.c. */
#include "amp/amp_int.h"

#include <math.h>
#include <string.h>

loom_dynamic_scaler_cfg loom_dynamic_scaler_cfg_default(void) {
  return (loom_dynamic_scaler_cfg){.initial_scale = 65536.0f,
                                   .growth_factor = 2.0f,
                                   .backoff_factor = 0.5f,
                                   .growth_interval = 2000,
                                   .min_scale = 1.0f,
                                   .max_scale = 16777216.0f,
                                   .enabled = true};
}

loom_dynamic_scaler_cfg loom_dynamic_scaler_cfg_conservative(void) {
  loom_dynamic_scaler_cfg cfg = loom_dynamic_scaler_cfg_default();
  cfg.initial_scale = 32768.0f;
  cfg.growth_interval = 5000;
  cfg.max_scale = 1048576.0f;
  return cfg;
}

loom_dynamic_scaler_cfg loom_dynamic_scaler_cfg_aggressive(void) {
  loom_dynamic_scaler_cfg cfg = loom_dynamic_scaler_cfg_default();
  cfg.growth_interval = 500;
  return cfg;
}

int loom_dynamic_scaler_cfg_preset(const char *name, loom_dynamic_scaler_cfg *cfg) {
  static const struct {
    const char *name;
    loom_dynamic_scaler_cfg (*make)(void);
  } presets[] = {{"default", loom_dynamic_scaler_cfg_default},
                 {"conservative", loom_dynamic_scaler_cfg_conservative},
                 {"aggressive", loom_dynamic_scaler_cfg_aggressive}};
  if (!name || !cfg)
    return loom__fail(LOOM_EINVAL, "loom_dynamic_scaler_cfg_preset: %s is NULL",
                      !name ? "name" : "cfg");
  for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
    if (strcmp(name, presets[i].name) == 0) {
      *cfg = presets[i].make();
      return LOOM_OK;
    }
  return loom__fail(LOOM_ENOTFOUND,
                    "loom_dynamic_scaler_cfg_preset: no preset \"%s\" (default, conservative, "
                    "aggressive)",
                    name);
}

/* A float field must be a finite number >= 0. */
static int check_value(const char *field, float v) {
  if (isnan(v))
    return loom__fail(LOOM_EINVAL, "loom_dynamic_scaler_cfg_validate: %s is NaN", field);
  if (isinf(v))
    return loom__fail(LOOM_EINVAL, "loom_dynamic_scaler_cfg_validate: %s is infinite", field);
  if (v < 0)
    return loom__fail(LOOM_EINVAL, "loom_dynamic_scaler_cfg_validate: %s is negative (%g)",
                      field, (double)v);
  return LOOM_OK;
}

int loom_dynamic_scaler_cfg_validate(const loom_dynamic_scaler_cfg *c) {
  static const char *who = "loom_dynamic_scaler_cfg_validate";
  if (!c) return loom__fail(LOOM_EINVAL, "%s: cfg is NULL", who);
  int rc;
  if ((rc = check_value("initial_scale", c->initial_scale)) ||
      (rc = check_value("growth_factor", c->growth_factor)) ||
      (rc = check_value("backoff_factor", c->backoff_factor)) ||
      (rc = check_value("min_scale", c->min_scale)) ||
      (rc = check_value("max_scale", c->max_scale)))
    return rc;
  if (c->growth_interval < 1)
    return loom__fail(LOOM_EINVAL, "%s: growth_interval must be >= 1 (got %lld)", who,
                      (long long)c->growth_interval);
  if (!(c->growth_factor > 1.0f))
    return loom__fail(LOOM_EINVAL, "%s: growth_factor must be > 1 (got %g)", who,
                      (double)c->growth_factor);
  if (!(c->backoff_factor > 0.0f && c->backoff_factor < 1.0f))
    return loom__fail(LOOM_EINVAL, "%s: backoff_factor must be in (0, 1) (got %g)", who,
                      (double)c->backoff_factor);
  if (!(c->min_scale > 0.0f))
    return loom__fail(LOOM_EINVAL, "%s: min_scale must be > 0 (got %g)", who,
                      (double)c->min_scale);
  if (c->min_scale > c->max_scale)
    return loom__fail(LOOM_EINVAL, "%s: min_scale %g is greater than max_scale %g", who,
                      (double)c->min_scale, (double)c->max_scale);
  if (c->initial_scale < c->min_scale || c->initial_scale > c->max_scale)
    return loom__fail(LOOM_EINVAL, "%s: initial_scale %g is outside [min_scale, max_scale] = "
                      "[%g, %g]", who, (double)c->initial_scale, (double)c->min_scale,
                      (double)c->max_scale);
  return LOOM_OK;
}

/* The spec's UpdateScale, with products in f32. */
static float dynamic_next(loom_scaler *s, bool overflow) {
  const loom_dynamic_scaler_cfg *c = &s->cfg;
  if (overflow) {
    s->growth_counter = 0;
    return fmaxf(s->scale * c->backoff_factor, c->min_scale);
  }
  if (++s->growth_counter >= c->growth_interval) {
    s->growth_counter = 0;
    return fminf(s->scale * c->growth_factor, c->max_scale);
  }
  return s->scale;
}

const loom__scaler_ops loom__scaler_dynamic_ops = {LOOM_SCALER_DYNAMIC, dynamic_next};

int loom_scaler_create_dynamic(const loom_dynamic_scaler_cfg *cfg, loom_scaler **out) {
  loom_dynamic_scaler_cfg def;
  if (!cfg) {
    def = loom_dynamic_scaler_cfg_default();
    cfg = &def;
  }
  return loom__scaler_new(&loom__scaler_dynamic_ops, cfg, out);
}
