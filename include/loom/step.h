/* loom/step.h: the end of a training step, one recipe whatever the strategy.
 *
 * A mixed-precision step is the same calls with no strategy, under DDP and under FSDP; the
 * strategy only changes which object the step is made over:
 *
 *   loom_step_cfg c = loom_step_cfg_default();
 *   c.module = model;  c.optim = opt;  c.scaler = scaler;     (no strategy)
 *   c.ddp = ddp;                                               (DDP: add it)
 *   c.fsdp = fsdp;  c.scaler = NULL;                           (FSDP: the scaler is its mp cfg's)
 *   c.clip = true;  c.max_norm = 1.0;                          (optional)
 *   loom_step *st;  loom_step_create(&c, &st);
 *   each step:
 *     loom_step_zero_grad(st);
 *     forward under autocast; loss
 *     loom_step_backward(st, loss);      loss x scale, backward, gradients averaged over ranks
 *     loom_step_result r;
 *     loom_step_apply(st, &r);           overflow over ranks, unscale, clip, optimizer step
 *                                         unless overflow, scaler update
 *
 * What apply does, in order (the same rule under every strategy):
 *   1. unscale the gradients by 1/scale (with a scaler; FSDP: its shards, its config's scaler)
 *      and note whether any holds inf or NaN; combine that flag over the ranks (MAX), so every
 *      rank skips the same steps and keeps the same scale. Without a scaler nothing is checked
 *      (PyTorch without GradScaler): a non-finite gradient reaches the optimizer.
 *   2. with clip, clip the global L2 norm of all gradients to max_norm (loom_clip_grad_norm's
 *      rule; under FSDP one all-reduce of the shards' sums of squares). Skipped steps are not
 *      clipped.
 *   3. the optimizer step, unless the step overflowed; 4. the scaler's update.
 *
 * The optimizer must be over the gradients the step finishes: with no strategy or DDP, every
 * segment inside the module's gradients (its arena, loom_module_arena, or its parameters'
 * gradients); with FSDP, over loom_fsdp_segments. loom_step_create refuses another optimizer
 * (LOOM_EMISUSE naming the segment): it would step on values backward never writes.
 *
 * Ownership: the step borrows everything in its cfg; they must outlive it. loom_step_free(NULL)
 * is a no-op. Errors: status codes with a message (loom_last_error); a failed collective leaves
 * the process group failed, as every collective does. Threads: one step per rank's thread. */
#ifndef LOOM_STEP_H
#define LOOM_STEP_H

#include "loom/amp.h"
#include "loom/ddp.h"
#include "loom/fsdp.h"
#include "loom/nn.h"
#include "loom/optim.h"

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- an optimizer straight from a module ------------------------------------------------
 * The optimizer over exactly the gradients a step finishes, whatever the strategy: with no
 * strategy or DDP one segment over the module's f32 arena (loom_module_arena: every weight and
 * every gradient, one buffer each; DDP's buckets are views of it), and once loom_fsdp_create
 * has wrapped the module, this rank's shards (loom_fsdp_segments, one segment a unit). So
 *   loom_adamw_create_for_module(model, NULL, &opt);
 * is the four lines of loom_module_arena, a loom_param_seg and loom_optim_create_adamw, and
 * the same line after loom_fsdp_create. cfg NULL: the defaults (loom_adamw_cfg_default,
 * loom_adam_cfg_default, loom_sgd_cfg_default). m must be a root module. Borrows the module
 * (and FSDP's shards): they must outlive the optimizer, which the caller frees with
 * loom_optim_free. Errors: LOOM_EINVAL (NULL module or out, or a bad cfg: the create's
 * messages), LOOM_EMISUSE (a child module), LOOM_EDTYPE (no f32 parameters: the optimizer
 * keeps f32 master weights; see loom_master in loom/optim.h). */
int loom_adamw_create_for_module(loom_module *m, const loom_adam_cfg *cfg, loom_optim **out);
int loom_adam_create_for_module(loom_module *m, const loom_adam_cfg *cfg, loom_optim **out);
int loom_sgd_create_for_module(loom_module *m, const loom_sgd_cfg *cfg, loom_optim **out);

typedef struct loom_step_cfg {
  loom_module *module; /* the model (no strategy, DDP); with FSDP the wrapper's (may be NULL) */
  loom_ddp *ddp;       /* DDP over the module's parameters, or NULL */
  loom_fsdp *fsdp;     /* FSDP, or NULL (not both with ddp) */
  loom_optim *optim;   /* required */
  loom_scaler *scaler; /* loss scaling (f16), or NULL; with FSDP NULL: its cfg.mp scaler */
  bool clip;           /* clip the gradients' global L2 norm (default false) */
  double max_norm;     /* the norm to clip to, >= 0 (default 1.0) */
  bool error_if_nonfinite; /* a NaN/inf norm fails apply (LOOM_EINVAL, nothing stepped) instead
                            * of poisoning the gradients (default false, as PyTorch) */
} loom_step_cfg;

loom_step_cfg loom_step_cfg_default(void);
/* LOOM_EINVAL naming the first bad field (no optimizer, no module without FSDP, ddp and fsdp
 * both set, a scaler with FSDP, max_norm negative or NaN with clip). */
int loom_step_cfg_validate(const loom_step_cfg *cfg);

typedef struct loom_step loom_step;

/* Also checks the optimizer's segments against the gradients (see the top). */
int loom_step_create(const loom_step_cfg *cfg, loom_step **out);
void loom_step_free(loom_step *st);

/* Zero the gradients the step finishes (FSDP overwrites its shards: nothing to do). */
int loom_step_zero_grad(loom_step *st);
/* Backward of loss x the loss scale (the loss itself without a scaler), then wait until the
 * gradients are averaged over the ranks (DDP's last bucket, FSDP's reduce-scatters). */
int loom_step_backward(loom_step *st, loom_tensor *loss);

typedef struct loom_step_result {
  bool skipped;     /* some rank's gradients held inf/NaN: no optimizer step this time */
  double grad_norm; /* the global norm before clipping (with clip and not skipped; else NAN) */
  float scale;      /* the loss scale for the next step (1 without loss scaling) */
} loom_step_result;

/* Finish the step (see the top). out may be NULL. */
int loom_step_apply(loom_step *st, loom_step_result *out);

/* The scaler the step scales its loss with: cfg.scaler, or with FSDP its mixed-precision
 * config's (loom_fsdp_mp_scaler); NULL without loss scaling (or st NULL). It is the one whose
 * state a checkpoint saves and restores (loom_scaler_save / _load) and whose scale a caller
 * reports before any step; borrowed, it lives as long as the step's cfg. */
loom_scaler *loom_step_scaler(const loom_step *st);

#ifdef __cplusplus
}
#endif
#endif
