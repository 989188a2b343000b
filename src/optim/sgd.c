/* sgd.c: SGD with momentum, dampening, Nesterov and weight decay, as torch.optim.SGD (1.13):
 * its config (default, validate), create, the step's f32 kernel scalars from the config and the
 * update of a run of elements with them. */
#include "optim/optim_int.h"

#include <math.h>

loom_sgd_cfg loom_sgd_cfg_default(void) {
  return (loom_sgd_cfg){.lr = 0.01, .state_pool = LOOM_POOL_COMPUTE};
}

static int bad(const char *field, double v, const char *rule) {
  return loom__fail(LOOM_EINVAL, "loom_sgd_cfg: %s = %g %s", field, v, rule);
}

int loom_sgd_cfg_validate(const loom_sgd_cfg *c) {
  if (!c) return loom__fail(LOOM_EINVAL, "loom_sgd_cfg: cfg is NULL");
  if (!(c->lr >= 0) || !isfinite(c->lr)) return bad("lr", c->lr, "must be finite and >= 0");
  if (!(c->momentum >= 0) || !isfinite(c->momentum))
    return bad("momentum", c->momentum, "must be finite and >= 0");
  if (!isfinite(c->dampening)) return bad("dampening", c->dampening, "must be finite");
  if (!(c->weight_decay >= 0) || !isfinite(c->weight_decay))
    return bad("weight_decay", c->weight_decay, "must be finite and >= 0");
  if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
    return loom__fail(LOOM_EINVAL,
                      "loom_sgd_cfg: nesterov needs momentum > 0 and dampening = 0 (have %g, %g)",
                      c->momentum, c->dampening);
  if ((unsigned)c->state_pool >= LOOM_POOL_COUNT)
    return loom__fail(LOOM_EINVAL, "loom_sgd_cfg: state_pool %d out of range", (int)c->state_pool);
  return LOOM_OK;
}

int loom_optim_create_sgd(const loom_param_seg *segs, size_t nseg, const loom_sgd_cfg *cfg,
                          loom_optim **out) {
  if (out) *out = NULL;
  int rc = loom_sgd_cfg_validate(cfg);
  if (rc) return rc;
  static const char *const kinds[] = {"momentum_buffer"};
  rc = loom__optim_create("loom_optim_create_sgd", LOOM__SGD, segs, nseg,
                          cfg->momentum != 0 ? 1 : 0, kinds, cfg->state_pool, out);
  if (rc) return rc;
  (*out)->sgd = *cfg;
  (*out)->lr = cfg->lr;
  return LOOM_OK;
}

void loom__sgd_args_make(const loom_optim *o, float grad_scale, loom__sgd_args *a) {
  const loom_sgd_cfg *c = &o->sgd;
  *a = (loom__sgd_args){
      .wd = (float)c->weight_decay,
      .momentum = (float)c->momentum,
      .omd = (float)(1.0 - c->dampening),
      .neg_lr = (float)-o->lr,
      .has_momentum = c->momentum != 0,
      .first = o->step == 1,
      .nesterov = c->nesterov,
      .maximize = c->maximize,
      .grad_scale = grad_scale,
      .scaled = grad_scale != 1.0f,
  };
}

void loom__sgd_update(const loom_optim *o, const loom__sgd_args *a, unsigned flags, float *p,
                      const float *g, float *const *state, size_t n) {
  if (!n) return;
  loom__sgd_args sa = *a;
  sa.has_wd = o->sgd.weight_decay != 0 && !(flags & LOOM_SEG_NO_DECAY);
  if (!loom__dry()) loom__optim_k()->sgd(&sa, p, g, sa.has_momentum ? state[0] : NULL, n);
}
