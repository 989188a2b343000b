/* fsdp_mp.c: FSDP mixed precision, the specification fsdp-mixed-precision's
 * FSDPMixedPrecisionConfig (defaults, per-dtype defaults, validation) and
 * FSDPMixedPrecisionManager (parameter cast to the forward dtype, gradient cast to f32, loss
 * scaling, the overflow check and the loss scale). The integration with the FSDP wrapper
 * (FSDPAmpIntegration) is in the other fsdp*.c files.
 *
 * The loss scale is loom's dynamic scaler (src/amp/scaler_dynamic.c) made from the
 * specification's fields; nothing here repeats its rule. That rule is the specification's
 * CheckOverflow rule to the bit (products in f32; checked by tests/fsdp/test_fsdp_mp.c against
 * a transcription of the spec):
 *   overflow: scale = max(scale * backoff, min); clean-step counter = 0
 *   clean:    counter++; if counter >= loss_scale_steps: scale = min(scale * growth, max),
 *             counter = 0
 * Where this file departs from the C# text, deliberately (loom/fsdp.h is the contract):
 *   - the loss scale is active only when enabled && use_loss_scaling; otherwise the current
 *     scale reads 1 (the C# manager reports InitialLossScale even without loss scaling, and
 *     still runs CheckOverflow's rule when Enabled is false);
 *   - a disabled configuration is valid whatever its fields (C# validates it anyway), and
 *     ConvertToMixedPrecision returns the tensor itself when disabled (C# casts anyway);
 *   - validation also applies the dynamic scaler's checks when loss scaling is on (finite
 *     values, min > 0, growth > 1, backoff in (0, 1), steps >= 1), and a NaN initial scale is
 *     outside [min, max] (C#'s `<`/`>` test lets NaN through);
 *   - casts round to nearest even (the C# CastTensor copies floats without rounding);
 *   - reset also clears the scaler's statistics (the C# manager has none);
 *   - only floating tensors (f32, f16, bf16) are converted: LOOM_EDTYPE for integer ones. */
#include "core/core_int.h"
#include "amp/amp_int.h"
#include "core/tensor_int.h"
#include "loom/fsdp.h"
#include "loom/ops.h"

#include <string.h>

#define MP_MAGIC 0x46534d50u /* "FSMP" */
#define MP_DEAD 0xdeadbeefu

struct loom_fsdp_mp {
  uint32_t magic;
  loom_fsdp_mp_cfg cfg;
  loom_scaler *scaler; /* NULL unless cfg.enabled && cfg.use_loss_scaling */
};

/* ---- configuration ---------------------------------------------------------------------- */

loom_fsdp_mp_cfg loom_fsdp_mp_cfg_default(void) {
  return (loom_fsdp_mp_cfg){.enabled = true,
                            .forward_dtype = LOOM_F16,
                            .backward_dtype = LOOM_F32,
                            .use_loss_scaling = true,
                            .initial_loss_scale = 2.0f,
                            .min_loss_scale = 1.0f,
                            .max_loss_scale = 65536.0f,
                            .loss_scale_growth_factor = 2.0f,
                            .loss_scale_backoff_factor = 0.5f,
                            .loss_scale_steps = 2000};
}

loom_fsdp_mp_cfg loom_fsdp_mp_cfg_for(loom_dtype forward_dtype) {
  loom_fsdp_mp_cfg cfg = loom_fsdp_mp_cfg_default();
  if (forward_dtype == LOOM_BF16) {
    cfg.forward_dtype = LOOM_BF16;
    cfg.use_loss_scaling = false;
  } else if (forward_dtype != LOOM_F16) {
    cfg.enabled = false;
  }
  return cfg;
}

/* The dynamic scaler's configuration for the specification's fields. */
static void scaler_cfg(const loom_fsdp_mp_cfg *c, loom_dynamic_scaler_cfg *d) {
  *d = (loom_dynamic_scaler_cfg){.initial_scale = c->initial_loss_scale,
                                 .growth_factor = c->loss_scale_growth_factor,
                                 .backoff_factor = c->loss_scale_backoff_factor,
                                 .growth_interval = c->loss_scale_steps,
                                 .min_scale = c->min_loss_scale,
                                 .max_scale = c->max_loss_scale,
                                 .enabled = true};
}

/* The scaler's field names and ours, for its validation messages. */
static const char *const field_map[][2] = {
    {"initial_scale", "initial_loss_scale"},   {"growth_factor", "loss_scale_growth_factor"},
    {"backoff_factor", "loss_scale_backoff_factor"}, {"growth_interval", "loss_scale_steps"},
    {"min_scale", "min_loss_scale"},           {"max_scale", "max_loss_scale"}};

static bool ident_char(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
         ch == '_';
}

/* msg with every scaler field name (a whole word) replaced by the configuration's, in one
 * left-to-right pass (so a replacement is never matched again). */
static void rename_fields(const char *msg, char *out, size_t cap) {
  size_t o = 0;
  for (size_t i = 0; msg[i] && o + 1 < cap;) {
    const char *rep = NULL;
    size_t len = 0;
    if (i == 0 || !ident_char(msg[i - 1]))
      for (size_t k = 0; k < sizeof field_map / sizeof field_map[0] && !rep; k++) {
        size_t l = strlen(field_map[k][0]);
        if (strncmp(msg + i, field_map[k][0], l) == 0 && !ident_char(msg[i + l])) {
          rep = field_map[k][1];
          len = l;
        }
      }
    if (rep) {
      for (size_t k = 0; rep[k] && o + 1 < cap; k++) out[o++] = rep[k];
      i += len;
    } else {
      out[o++] = msg[i++];
    }
  }
  out[o] = '\0';
}

int loom_fsdp_mp_cfg_validate(const loom_fsdp_mp_cfg *c) {
  static const char *who = "loom_fsdp_mp_cfg_validate";
  if (!c) return loom__fail(LOOM_EINVAL, "%s: cfg is NULL", who);
  if (!c->enabled) return LOOM_OK;
  if (c->forward_dtype != LOOM_F16 && c->forward_dtype != LOOM_BF16)
    return loom__fail(LOOM_EINVAL, "%s: forward_dtype must be f16 or bf16 (got %s)", who,
                      loom_dtype_name(c->forward_dtype));
  if (c->backward_dtype != LOOM_F32)
    return loom__fail(LOOM_EINVAL, "%s: backward_dtype must be f32 for stability (got %s)", who,
                      loom_dtype_name(c->backward_dtype));
  if (!(c->initial_loss_scale >= c->min_loss_scale && c->initial_loss_scale <= c->max_loss_scale))
    return loom__fail(LOOM_EINVAL,
                      "%s: initial_loss_scale %g must be within [min_loss_scale %g, "
                      "max_loss_scale %g]",
                      who, (double)c->initial_loss_scale, (double)c->min_loss_scale,
                      (double)c->max_loss_scale);
  if (!c->use_loss_scaling) return LOOM_OK;
  loom_dynamic_scaler_cfg d;
  scaler_cfg(c, &d);
  int rc = loom_dynamic_scaler_cfg_validate(&d);
  if (rc) {
    static const char prefix[] = "loom_dynamic_scaler_cfg_validate: ";
    const char *msg = loom_last_error();
    if (strncmp(msg, prefix, sizeof prefix - 1) == 0) msg += sizeof prefix - 1;
    char named[512];
    rename_fields(msg, named, sizeof named);
    return loom__fail(rc, "%s: %s (the dynamic loss scaler's rule)", who, named);
  }
  return LOOM_OK;
}

/* ---- the manager ------------------------------------------------------------------------ */

static int mp_check(const loom_fsdp_mp *m, const char *who) {
  if (!m) return loom__fail(LOOM_EINVAL, "%s: manager is NULL", who);
  if (m->magic != MP_MAGIC)
    return loom__fail(LOOM_EMISUSE, "%s: manager is not live (freed or not a manager)", who);
  return LOOM_OK;
}

int loom_fsdp_mp_create(const loom_fsdp_mp_cfg *cfg, loom_fsdp_mp **out) {
  static const char *who = "loom_fsdp_mp_create";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  if (!cfg) return loom__fail(LOOM_EINVAL, "%s: cfg is NULL", who);
  int rc = loom_fsdp_mp_cfg_validate(cfg);
  if (rc) return rc;
  loom_fsdp_mp *m = loom__calloc(LOOM_POOL_META, 1, sizeof *m);
  if (!m) return loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
  m->magic = MP_MAGIC;
  m->cfg = *cfg;
  if (cfg->enabled && cfg->use_loss_scaling) {
    loom_dynamic_scaler_cfg d;
    scaler_cfg(cfg, &d);
    if ((rc = loom_scaler_create_dynamic(&d, &m->scaler))) {
      m->magic = MP_DEAD;
      loom__free(m);
      return rc;
    }
  }
  *out = m;
  return LOOM_OK;
}

void loom_fsdp_mp_free(loom_fsdp_mp *m) {
  if (!m || m->magic != MP_MAGIC) return;
  m->magic = MP_DEAD;
  loom_scaler_free(m->scaler);
  loom__free(m);
}

const loom_fsdp_mp_cfg *loom_fsdp_mp_config(const loom_fsdp_mp *m) {
  return mp_check(m, "loom_fsdp_mp_config") ? NULL : &m->cfg;
}

/* *out = t cast to the forward dtype (to_forward; t itself when disabled) or to f32; t itself
 * (retained) when it has that dtype already. */
static int convert(const char *who, const loom_fsdp_mp *m, loom_tensor *t, const char *what,
                   bool to_forward, loom_tensor **out) {
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  int rc = mp_check(m, who);
  if (rc) return rc;
  if (!t) return loom__fail(LOOM_EINVAL, "%s: %s is NULL", who, what);
  if ((rc = loom_tensor_check(t, who))) return rc;
  loom_dtype dt = to_forward ? m->cfg.forward_dtype : LOOM_F32;
  if ((to_forward && !m->cfg.enabled) || t->dtype == dt) {
    *out = loom_tensor_retain(t);
    return LOOM_OK;
  }
  if (!loom_dtype_is_float(t->dtype))
    return loom__fail(LOOM_EDTYPE, "%s: %s has dtype %s, not f32, f16 or bf16", who, what,
                      loom_dtype_name(t->dtype));
  return loom_tensor_cast(t, dt, out);
}

int loom_fsdp_mp_convert_to_mixed_precision(const loom_fsdp_mp *m, loom_tensor *t,
                                            loom_tensor **out) {
  return convert("loom_fsdp_mp_convert_to_mixed_precision", m, t, "parameter", true, out);
}

int loom_fsdp_mp_convert_gradient_to_fp32(const loom_fsdp_mp *m, loom_tensor *grad,
                                          loom_tensor **out) {
  return convert("loom_fsdp_mp_convert_gradient_to_fp32", m, grad, "gradient", false, out);
}

/* The scaler's step is opened through loom_scaler_scale_value (which also gives the scale), so
 * that an unscale of the gradients through loom_fsdp_mp_scaler (loom__scaler_unscale_buffers,
 * loom_scaler_check) is allowed afterwards, as after loom_scaler_scale_loss. */
int loom_fsdp_mp_scale_loss(loom_fsdp_mp *m, loom_tensor *loss, loom_tensor **out) {
  static const char *who = "loom_fsdp_mp_scale_loss";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  int rc = mp_check(m, who);
  if (rc) return rc;
  if (!loss) return loom__fail(LOOM_EINVAL, "%s: loss is NULL", who);
  if ((rc = loom_tensor_check(loss, who))) return rc;
  if (!m->scaler) {
    *out = loom_tensor_retain(loss);
    return LOOM_OK;
  }
  if (!loom_dtype_is_float(loss->dtype))
    return loom__fail(LOOM_EDTYPE, "%s: loss has dtype %s, not f32, f16 or bf16", who,
                      loom_dtype_name(loss->dtype));
  float scale = 1.0f;
  if ((rc = loom_scaler_scale_value(m->scaler, &scale))) return rc;
  return loom_mul_scalar(loss, (double)scale, out);
}

int loom_fsdp_mp_check_overflow(loom_fsdp_mp *m, loom_tensor *const *grads, size_t n,
                                bool *overflow) {
  static const char *who = "loom_fsdp_mp_check_overflow";
  if (!overflow) return loom__fail(LOOM_EINVAL, "%s: overflow is NULL", who);
  *overflow = false;
  int rc = mp_check(m, who);
  if (rc) return rc;
  if (n && !grads) return loom__fail(LOOM_EINVAL, "%s: grads is NULL (n = %zu)", who, n);
  if (!m->scaler) return LOOM_OK; /* the spec: no loss scaling, no overflow, no change */
  bool found = false;
  if ((rc = loom__amp_has_nonfinite_tensors(grads, n, &found))) return rc;
  if ((rc = loom_fsdp_mp_update(m, found))) return rc;
  *overflow = found;
  return LOOM_OK;
}

int loom_fsdp_mp_update(loom_fsdp_mp *m, bool overflow) {
  int rc = mp_check(m, "loom_fsdp_mp_update");
  if (rc) return rc;
  return m->scaler ? loom_scaler_update(m->scaler, overflow) : LOOM_OK;
}

float loom_fsdp_mp_current_loss_scale(const loom_fsdp_mp *m) {
  if (mp_check(m, "loom_fsdp_mp_current_loss_scale")) return 0.0f;
  return m->scaler ? loom_scaler_get_scale(m->scaler) : 1.0f;
}

int loom_fsdp_mp_reset_loss_scale(loom_fsdp_mp *m) {
  int rc = mp_check(m, "loom_fsdp_mp_reset_loss_scale");
  if (rc) return rc;
  return m->scaler ? loom_scaler_reset(m->scaler) : LOOM_OK;
}

loom_scaler *loom_fsdp_mp_scaler(loom_fsdp_mp *m) {
  return mp_check(m, "loom_fsdp_mp_scaler") ? NULL : m->scaler;
}
