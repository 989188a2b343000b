/* test_ddp_amp.c: AMP under DDP. f16 autocast with a dynamic loss scaler on every rank; one
 * rank alone sees an overflow; loom_ddp_any spreads the flag, so every rank skips that same
 * step, halves its scale the same way, and the replicas stay identical: with the unscale after
 * the all-reduce, and with the scaler's check hooks checking before it. */
#include "lt.h"
#include "ddp_model.h"
#include "loom/amp.h"
#include "loom/ddp.h"

#include <stdlib.h>
#include <string.h>

enum { STEPS = 6, BAD_STEP = 3, B = 8, NR = 3 };

typedef struct amp_run {
  bool hooks; /* the fast check: the scaler's check hooks (see the second test) */
  bool hooks_after_ddp; /* made after loom_ddp_create: the hook phases keep them first */
  float scale[NR];
  int skipped[NR];
  float *params[NR];
} amp_run;

/* Six steps on one rank. The plain way: unscale after loom_ddp_finish, rank 1's gradients get an
 * inf after the all-reduce at BAD_STEP. With hooks: the check hooks, which run before DDP's hook
 * launches each bucket (hook phases) whether made before or after loom_ddp_create, check each rank's
 * local gradients (from their bounds, reading nothing, or reading before the all-reduce
 * starts); the optimizer folds 1/scale in; rank 1's loss overflows f16 at BAD_STEP (a local
 * fault before the all-reduce). Either way loom_ddp_any spreads the flag. */
static int amp_rank(loom_pg *pg, void *arg) {
  amp_run *r = arg;
  int rank = loom_pg_rank(pg), n = loom_pg_size(pg);
  model m;
  loom_ddp *d = NULL;
  loom_scaler *sc = NULL;
  loom_amp_unscale_hooks *h = NULL;
  int rc = model_init(&m, 5);
  if (!rc) rc = loom_scaler_create_dynamic(NULL, &sc);
  if (!rc && r->hooks && !r->hooks_after_ddp)
    rc = loom_amp_check_hooks_create(sc, m.p, MODEL_NPARAMS, &h);
  if (!rc) rc = loom_ddp_create(pg, m.p, model_names, MODEL_NPARAMS, NULL, &d);
  if (!rc && r->hooks && r->hooks_after_ddp)
    rc = loom_amp_check_hooks_create(sc, m.p, MODEL_NPARAMS, &h);
  for (int i = 0; i < MODEL_NPARAMS && !rc; i++) rc = loom_tensor_zero_grad(m.p[i]);
  for (int s = 0; s < STEPS && !rc; s++) {
    bool fault = s == BAD_STEP && rank == 1; /* on this rank only */
    float scale = 1, gs = 1; /* scale_value multiplies its argument: the loss scale itself */
    rc = loom_scaler_scale_value(sc, &scale);
    if (!rc && h) rc = loom_amp_unscale_hooks_arm(h);
    if (!rc)
      rc = model_backward_amp(&m, (int64_t)s * n * B + rank * B, B,
                              scale * (h && fault ? 1e30f : 1.0f), LOOM_AUTOCAST_F16);
    if (!rc) rc = loom_ddp_finish(d);
    if (!rc && !h && fault) ((float *)loom_tensor_data(loom_tensor_grad(m.p[2])))[7] = INFINITY;
    loom_tensor *grads[MODEL_NPARAMS];
    for (int i = 0; i < MODEL_NPARAMS; i++) grads[i] = loom_tensor_grad(m.p[i]);
    bool local = false, any = false;
    if (!rc) rc = h ? loom_amp_unscale_hooks_finish(h, &local)
                    : loom_scaler_unscale(sc, grads, MODEL_NPARAMS, &local);
    if (!rc) rc = loom_ddp_any(d, local, &any);
    if (!rc && h) rc = loom_scaler_grad_scale(sc, &gs);
    if (!rc && !any) model_sgd(&m, 0.05f * gs); /* with hooks, the deferred unscale */
    if (!rc && any) {
      r->skipped[rank]++;
      for (int i = 0; i < MODEL_NPARAMS; i++) loom_tensor_zero_grad(m.p[i]);
    }
    if (!rc) rc = loom_scaler_update(sc, any);
  }
  if (!rc) {
    r->scale[rank] = loom_scaler_get_scale(sc);
    model_flatten(&m, r->params[rank], false);
  }
  loom_ddp_free(d);
  loom_amp_unscale_hooks_free(h);
  loom_scaler_free(sc);
  model_free(&m);
  return rc;
}

/* Every rank skipped the one bad step, halved its scale once and holds the same parameters,
 * which moved from their initial values (the other steps trained). */
static void run_and_check(bool hooks, bool hooks_after_ddp, float *out) {
  amp_run r = {.hooks = hooks, .hooks_after_ddp = hooks_after_ddp};
  size_t np = model_numel();
  for (int k = 0; k < NR; k++) r.params[k] = calloc(np, sizeof(float));
  LT_OK(loom_threads_run(NR, NULL, amp_rank, &r));
  loom_dynamic_scaler_cfg c = loom_dynamic_scaler_cfg_default();
  for (int k = 0; k < NR; k++) {
    LT_EQ(r.skipped[k], 1);
    LT_EQ(r.scale[k], c.initial_scale * c.backoff_factor); /* halved once, no growth yet */
    LT_TRUE(memcmp(r.params[k], r.params[0], np * sizeof(float)) == 0);
  }
  model m0;
  LT_OK(model_init(&m0, 5));
  float *p0 = calloc(np, sizeof(float));
  model_flatten(&m0, p0, false);
  size_t moved = 0;
  for (size_t i = 0; i < np; i++) moved += p0[i] != r.params[0][i];
  LT_TRUE(moved > np / 2);
  free(p0);
  model_free(&m0);
  if (out) memcpy(out, r.params[0], np * sizeof(float));
  for (int k = 0; k < NR; k++) free(r.params[k]);
}

LT_TEST(ddp_amp_every_rank_skips_the_same_step) { run_and_check(false, false, NULL); }

/* The check hooks made before or after loom_ddp_create: the same steps skipped, the same bits. */
LT_TEST(ddp_amp_check_hooks_before_or_after_ddp_skip_the_same_step) {
  size_t np = model_numel();
  float *before = calloc(np, sizeof(float)), *after = calloc(np, sizeof(float));
  run_and_check(true, false, before);
  run_and_check(true, true, after);
  LT_TRUE(memcmp(before, after, np * sizeof(float)) == 0);
  free(before);
  free(after);
}
