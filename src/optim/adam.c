/* adam.c: Adam (L2 weight decay added to the gradient) and AdamW (decoupled decay), as
 * torch.optim.Adam / AdamW (1.13, single-tensor path): their config (defaults, validate),
 * create, the step's scalars (bias corrections in double as PyTorch computes them) and the
 * update of a run of elements with them. */
#include "optim/optim_int.h"

#include <math.h>

loom_adam_cfg loom_adam_cfg_default(void) {
  return (loom_adam_cfg){.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                         .state_pool = LOOM_POOL_COMPUTE};
}

loom_adam_cfg loom_adamw_cfg_default(void) {
  loom_adam_cfg c = loom_adam_cfg_default();
  c.weight_decay = 0.01;
  return c;
}

static int bad(const char *field, double v, const char *rule) {
  return loom__fail(LOOM_EINVAL, "loom_adam_cfg: %s = %g %s", field, v, rule);
}

int loom_adam_cfg_validate(const loom_adam_cfg *c) {
  if (!c) return loom__fail(LOOM_EINVAL, "loom_adam_cfg: cfg is NULL");
  if (!(c->lr >= 0) || !isfinite(c->lr)) return bad("lr", c->lr, "must be finite and >= 0");
  if (!(c->beta1 >= 0 && c->beta1 < 1)) return bad("beta1", c->beta1, "is outside [0, 1)");
  if (!(c->beta2 >= 0 && c->beta2 < 1)) return bad("beta2", c->beta2, "is outside [0, 1)");
  if (!(c->eps > 0) || !isfinite(c->eps)) return bad("eps", c->eps, "must be finite and > 0");
  if (!(c->weight_decay >= 0) || !isfinite(c->weight_decay))
    return bad("weight_decay", c->weight_decay, "must be finite and >= 0");
  if ((unsigned)c->state_pool >= LOOM_POOL_COUNT)
    return loom__fail(LOOM_EINVAL, "loom_adam_cfg: state_pool %d out of range",
                      (int)c->state_pool);
  return LOOM_OK;
}

static const char *const kinds[] = {"exp_avg", "exp_avg_sq"};

static int create(const char *who, loom__optim_kind kind, const loom_param_seg *segs, size_t nseg,
                  const loom_adam_cfg *cfg, loom_optim **out) {
  if (out) *out = NULL;
  int rc = loom_adam_cfg_validate(cfg);
  if (rc) return rc;
  rc = loom__optim_create(who, kind, segs, nseg, 2, kinds, cfg->state_pool, out);
  if (rc) return rc;
  (*out)->adam = *cfg;
  (*out)->lr = cfg->lr;
  return LOOM_OK;
}

int loom_optim_create_adam(const loom_param_seg *segs, size_t nseg, const loom_adam_cfg *cfg,
                           loom_optim **out) {
  return create("loom_optim_create_adam", LOOM__ADAM, segs, nseg, cfg, out);
}

int loom_optim_create_adamw(const loom_param_seg *segs, size_t nseg, const loom_adam_cfg *cfg,
                            loom_optim **out) {
  return create("loom_optim_create_adamw", LOOM__ADAMW, segs, nseg, cfg, out);
}

void loom__adam_args_make(const loom_optim *o, float grad_scale, loom__adam_args *a) {
  const loom_adam_cfg *c = &o->adam;
  double step = (double)o->step;
  double bc1 = 1.0 - pow(c->beta1, step);
  double bc2 = 1.0 - pow(c->beta2, step);
  *a = (loom__adam_args){
      .beta1 = (float)c->beta1,
      .omb1 = (float)(1.0 - c->beta1),
      .beta2 = (float)c->beta2,
      .omb2 = (float)(1.0 - c->beta2),
      .wd = (float)c->weight_decay,
      .decay = (float)(1.0 - o->lr * c->weight_decay),
      .bc2_sqrt = (float)sqrt(bc2),
      .eps = (float)c->eps,
      .neg_step = (float)-(o->lr / bc1),
      .maximize = c->maximize,
      .grad_scale = grad_scale,
      .scaled = grad_scale != 1.0f,
  };
}

void loom__adam_update(const loom_optim *o, const loom__adam_args *a, unsigned flags, float *p,
                       const float *g, float *const *state, size_t n) {
  if (!n) return;
  loom__adam_args sa = *a;
  bool decay = o->adam.weight_decay != 0 && !(flags & LOOM_SEG_NO_DECAY);
  sa.l2 = decay && o->kind == LOOM__ADAM;
  sa.decoupled = decay && o->kind == LOOM__ADAMW;
  if (!loom__dry()) loom__optim_k()->adam(&sa, p, g, state[0], state[1], n);
}
