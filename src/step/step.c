/* step.c: the end of a training step, one recipe over the three strategies (loom/step.h):
 * backward of the scaled loss with the gradients averaged over ranks, then the overflow flag
 * over ranks, unscale, clipping, the optimizer step and the scaler update. Each strategy's
 * part is the library call it already has; this file owns only the order and the rule. */
#include "core/core_int.h"
#include "loom/autograd.h"
#include "loom/step.h"

#include <math.h>
#include <string.h>

struct loom_step {
  loom_step_cfg cfg;
  loom_tensor **params; /* no strategy, DDP: the module's parameters (borrowed) */
  loom_tensor **grads;  /* scratch: their gradients at apply */
  size_t nparams;
  loom_param_seg *segs; /* scratch: the optimizer's segments at apply (for clipping) */
  size_t nseg;
};

loom_step_cfg loom_step_cfg_default(void) { return (loom_step_cfg){.max_norm = 1.0}; }

int loom_step_cfg_validate(const loom_step_cfg *cfg) {
  if (!cfg) return loom__fail(LOOM_EINVAL, "step cfg: NULL");
  if (!cfg->optim) return loom__fail(LOOM_EINVAL, "step cfg: optim is NULL");
  if (cfg->ddp && cfg->fsdp)
    return loom__fail(LOOM_EINVAL, "step cfg: ddp and fsdp are both set; a step has one strategy");
  if (!cfg->fsdp && !cfg->module)
    return loom__fail(LOOM_EINVAL, "step cfg: module is NULL (it is needed without FSDP)");
  if (cfg->fsdp && cfg->scaler)
    return loom__fail(LOOM_EINVAL, "step cfg: scaler is set with fsdp; FSDP scales its loss "
                      "with the scaler of its mixed-precision config (loom_fsdp_cfg.mp)");
  if (cfg->clip && !(cfg->max_norm >= 0))
    return loom__fail(LOOM_EINVAL, "step cfg: max_norm = %g must be >= 0", cfg->max_norm);
  return LOOM_OK;
}

void loom_step_free(loom_step *st) {
  if (!st) return;
  loom__free(st->params);
  loom__free(st->grads);
  loom__free(st->segs);
  loom__free(st);
}

/* True if [p, p + n) lies inside the gradient buffer g. */
static bool inside(const float *p, size_t n, const loom_tensor *g) {
  if (!g || loom_tensor_dtype(g) != LOOM_F32) return false;
  const float *lo = loom_tensor_data(g);
  return lo && p >= lo && p + n <= lo + loom_tensor_numel(g);
}

/* Every optimizer segment must read gradients this step finishes. */
static int check_segments(loom_step *st) {
  static const char *who = "loom_step_create";
  loom_optim *o = st->cfg.optim;
  const loom_param_seg *fsegs = NULL;
  size_t nf = 0;
  int rc = st->cfg.fsdp ? loom_fsdp_segments(st->cfg.fsdp, &fsegs, &nf) : LOOM_OK;
  if (rc) return rc;
  if (st->cfg.fsdp && nf != st->nseg)
    return loom__fail(LOOM_EMISUSE, "%s: the optimizer has %zu segments, FSDP %zu; build it over "
                      "loom_fsdp_segments", who, st->nseg, nf);
  loom_tensor *arena = NULL;
  if (!st->cfg.fsdp && (rc = loom_module_arena(st->cfg.module, LOOM_F32, NULL, &arena, NULL)))
    return rc;
  for (size_t i = 0; i < st->nseg; i++) {
    loom_param_seg s;
    if ((rc = loom_optim_segment(o, i, &s))) return rc;
    bool ok;
    if (st->cfg.fsdp) ok = s.n == fsegs[i].n && s.grad == fsegs[i].grad;
    else ok = s.n == 0 || inside(s.grad, s.n, arena);
    for (size_t k = 0; k < st->nparams && !ok; k++) /* no strategy, DDP: or one parameter's */
      ok = inside(s.grad, s.n, loom_tensor_grad(st->params[k]));
    if (!ok)
      return loom__fail(LOOM_EMISUSE, "%s: optimizer segment %zu (%s) does not read the %s; it "
                        "would step on values backward never writes", who, i,
                        s.name ? s.name : "unnamed", st->cfg.fsdp
                        ? "FSDP shards' gradients (build it over loom_fsdp_segments)"
                        : "module's gradients (build it over loom_module_arena or the "
                          "parameters' gradients)");
  }
  return LOOM_OK;
}

int loom_step_create(const loom_step_cfg *cfg, loom_step **out) {
  if (!out) return loom__fail(LOOM_EINVAL, "loom_step_create: out is NULL");
  *out = NULL;
  int rc = loom_step_cfg_validate(cfg);
  if (rc) return rc;
  loom_step *st = loom__calloc(LOOM_POOL_META, 1, sizeof *st);
  LOOM_TRY_ALLOC(st, "the step");
  st->cfg = *cfg;
  st->nseg = loom_optim_segments(cfg->optim);
  st->segs = loom__calloc(LOOM_POOL_META, st->nseg ? st->nseg : 1, sizeof *st->segs);
  LOOM_TRY_ALLOC(st->segs, "the segment list");
  if (!cfg->fsdp) {
    st->nparams = loom_module_param_count(cfg->module);
    st->params = loom__calloc(LOOM_POOL_META, st->nparams ? st->nparams : 1, sizeof *st->params);
    st->grads = loom__calloc(LOOM_POOL_META, st->nparams ? st->nparams : 1, sizeof *st->grads);
    LOOM_TRY_ALLOC(st->params && st->grads ? st : NULL, "the parameter list");
    for (size_t i = 0; i < st->nparams; i++) {
      loom_param p;
      LOOM_TRY(loom_module_param(cfg->module, i, &p));
      st->params[i] = p.value;
    }
  }
  LOOM_TRY(check_segments(st));
  if (cfg->fsdp && loom_fsdp_optim_in_backward(cfg->fsdp)) {
    if (cfg->clip) {
      rc = loom__fail(LOOM_EINVAL, "loom_step_create: clip with FSDP's optim_in_backward: "
                      "backward steps each unit before the whole gradient's norm exists; turn "
                      "one of them off");
      goto done;
    }
    LOOM_TRY(loom_fsdp_set_optim(cfg->fsdp, cfg->optim)); /* backward steps with it */
  }
  *out = st;
  return LOOM_OK;
done:
  loom_step_free(st);
  return rc;
}

int loom_step_zero_grad(loom_step *st) {
  if (!st) return loom__fail(LOOM_EINVAL, "loom_step_zero_grad: step is NULL");
  return st->cfg.fsdp ? LOOM_OK : loom_module_zero_grad(st->cfg.module);
}

int loom_step_backward(loom_step *st, loom_tensor *loss) {
  if (!st) return loom__fail(LOOM_EINVAL, "loom_step_backward: step is NULL");
  int rc;
  if (st->cfg.fsdp) {
    loom_tensor *scaled = NULL;
    if ((rc = loom_fsdp_scale_loss(st->cfg.fsdp, loss, &scaled))) return rc;
    rc = loom_backward(scaled, NULL, false);
    loom_tensor_free(scaled);
    return rc ? rc : loom_fsdp_finish(st->cfg.fsdp);
  }
  rc = loom_backward_amp(loss, st->cfg.scaler, false);
  return rc || !st->cfg.ddp ? rc : loom_ddp_finish(st->cfg.ddp);
}

/* No strategy or DDP: unscale the gradients, the flag over the ranks. */
static int unscale_replicated(loom_step *st, bool *overflow) {
  if (!st->cfg.scaler) return LOOM_OK;
  int rc = LOOM_OK;
  for (size_t i = 0; i < st->nparams && !rc; i++) { /* a lazy zero backward missed: its zeros */
    rc = loom_tensor_settle_grad(st->params[i]);
    st->grads[i] = loom_tensor_grad(st->params[i]);
  }
  bool found = false;
  if (!rc) rc = loom_scaler_unscale(st->cfg.scaler, st->grads, st->nparams, &found);
  if (rc) return rc;
  if (!st->cfg.ddp) {
    *overflow = found;
    return LOOM_OK;
  }
  return loom_ddp_any(st->cfg.ddp, found, overflow);
}

static int clip_replicated(loom_step *st, double *norm) {
  for (size_t i = 0; i < st->nseg; i++) {
    int rc = loom_optim_segment(st->cfg.optim, i, &st->segs[i]);
    if (rc) return rc;
  }
  return loom_clip_grad_norm(st->segs, st->nseg, st->cfg.max_norm, st->cfg.error_if_nonfinite,
                             norm);
}

loom_scaler *loom_step_scaler(const loom_step *st) {
  if (!st) return NULL;
  loom_fsdp_mp *mp = st->cfg.fsdp ? loom_fsdp_mp_manager(st->cfg.fsdp) : NULL;
  return mp ? loom_fsdp_mp_scaler(mp) : st->cfg.scaler;
}

int loom_step_apply(loom_step *st, loom_step_result *out) {
  if (!st) return loom__fail(LOOM_EINVAL, "loom_step_apply: step is NULL");
  loom_fsdp *f = st->cfg.fsdp;
  loom_scaler *scaler = loom_step_scaler(st);
  loom_step_result r = {.skipped = false, .grad_norm = NAN, .scale = 1.0f};
  int rc;
  /* 1. unscale and the overflow flag over the ranks (FSDP's also updates its scale) */
  if (f) rc = scaler ? loom_fsdp_check_overflow(f, &r.skipped) : LOOM_OK;
  else rc = unscale_replicated(st, &r.skipped);
  /* 2. clipping */
  if (!rc && st->cfg.clip && !r.skipped && f)
    rc = loom_fsdp_clip_grad_norm(f, st->cfg.max_norm, st->cfg.error_if_nonfinite, &r.grad_norm);
  else if (!rc && st->cfg.clip && !r.skipped)
    rc = clip_replicated(st, &r.grad_norm);
  /* 3. the optimizer step */
  if (!rc && !r.skipped) rc = f ? loom_fsdp_optim_step(f, st->cfg.optim, 1.0f)
                                : loom_optim_step(st->cfg.optim);
  /* 4. the scaler's update (FSDP's happened with its check) */
  if (!rc && st->cfg.scaler) rc = loom_scaler_update(st->cfg.scaler, r.skipped);
  if (!rc && scaler) r.scale = loom_scaler_get_scale(scaler);
  if (out) *out = r;
  return rc;
}
