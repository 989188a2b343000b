/* optim_for_module.c: optimizers built straight from a module (loom/step.h): over the module's
 * f32 arena (no strategy, DDP: one segment, all weights and all gradients), or over this
 * rank's shards when FSDP wraps the module (loom_fsdp_segments). The segments are the same ones
 * the four-line form builds by hand; this file only finds them. */
#include "core/core_int.h"
#include "nn/nn_int.h"
#include "loom/step.h"

typedef enum { KIND_SGD, KIND_ADAM, KIND_ADAMW } optim_kind;

static int create_for_module(const char *who, loom_module *m, optim_kind kind,
                             const loom_sgd_cfg *sgd, const loom_adam_cfg *adam,
                             loom_optim **out) {
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  if (!m) return loom__fail(LOOM_EINVAL, "%s: module is NULL", who);
  const loom_param_seg *segs = NULL;
  size_t nseg = 0;
  loom_param_seg arena;
  int rc;
  if (m->sharded_by) { /* FSDP holds the parameters: this rank's shards, one segment a unit */
    rc = loom_fsdp_segments((loom_fsdp *)m->sharded_by, &segs, &nseg);
    if (rc) return rc;
  } else if (loom_module_deferred(m)) {
    return loom__fail(LOOM_EMISUSE, "%s: the module was built deferred and holds no parameters "
                      "yet: loom_module_materialize it, or wrap it with loom_fsdp_create, first",
                      who);
  } else {
    loom_tensor *w = NULL, *g = NULL;
    size_t numel = 0;
    if ((rc = loom_module_arena(m, LOOM_F32, &w, &g, &numel))) return rc;
    if (!w || !g)
      return loom__fail(LOOM_EDTYPE, "%s: the module has no f32 parameters (an optimizer steps "
                        "f32 master weights; for low-precision parameters see loom_master in "
                        "loom/optim.h)", who);
    arena = (loom_param_seg){"module", loom_tensor_data(w), loom_tensor_data(g), numel, 0};
    segs = &arena;
    nseg = 1;
  }
  switch (kind) {
  case KIND_SGD: {
    loom_sgd_cfg c = sgd ? *sgd : loom_sgd_cfg_default();
    return loom_optim_create_sgd(segs, nseg, &c, out);
  }
  case KIND_ADAM: {
    loom_adam_cfg c = adam ? *adam : loom_adam_cfg_default();
    return loom_optim_create_adam(segs, nseg, &c, out);
  }
  default: {
    loom_adam_cfg c = adam ? *adam : loom_adamw_cfg_default();
    return loom_optim_create_adamw(segs, nseg, &c, out);
  }
  }
}

int loom_adamw_create_for_module(loom_module *m, const loom_adam_cfg *cfg, loom_optim **out) {
  return create_for_module("loom_adamw_create_for_module", m, KIND_ADAMW, NULL, cfg, out);
}

int loom_adam_create_for_module(loom_module *m, const loom_adam_cfg *cfg, loom_optim **out) {
  return create_for_module("loom_adam_create_for_module", m, KIND_ADAM, NULL, cfg, out);
}

int loom_sgd_create_for_module(loom_module *m, const loom_sgd_cfg *cfg, loom_optim **out) {
  return create_for_module("loom_sgd_create_for_module", m, KIND_SGD, cfg, NULL, out);
}
