/* test_ddp_lazy_grad.c: DDP settles a pending lazy zero (loom_tensor_zero_grad_lazy) itself now
 * that loom_tensor_grad is a pure getter: a parameter no rank's backward reaches, whose gradient
 * buffer still holds old values and was zeroed lazily, is sent as zeros by loom_ddp_finish (which
 * still reports it, naming it), so its gradient after the step is zero, not the average of the
 * old values; the reached parameters' gradients are overwritten, not added to. */
#include "lt.h"
#include "ddp_model.h"
#include "loom/ddp.h"

#include <math.h>
#include <stdlib.h>

enum { NRANKS = 2, B = 4, EXTRA = 3 };

typedef struct lazy_run {
  int backward_rc[NRANKS], finish_rc[NRANKS];
  float extra_grad[NRANKS][EXTRA]; /* the unreached parameter's gradient after the step */
  float *stepped[NRANKS];          /* the model's gradients after the step */
} lazy_run;

static int rank_fn(loom_pg *pg, void *arg) {
  lazy_run *r = arg;
  int rank = loom_pg_rank(pg);
  model m;
  loom_tensor *extra = NULL, *old = NULL, *ps[MODEL_NPARAMS + 1];
  const char *names[MODEL_NPARAMS + 1];
  int rc = model_init(&m, 11);
  const int64_t n = EXTRA;
  if (!rc) rc = loom_tensor_zeros(LOOM_F32, 1, &n, &extra);
  if (!rc) rc = loom_tensor_from_data(LOOM_F32, 1, &n, (float[]){5, -6, 7}, &old);
  if (!rc) rc = loom_tensor_set_requires_grad(extra, true);
  if (!rc) rc = loom_tensor_set_grad(extra, old);
  /* old gradients everywhere (a backward of other rows), then zeroed lazily */
  if (!rc) rc = model_backward(&m, 100 + rank * B, B, 1.0f);
  for (int i = 0; i < MODEL_NPARAMS; i++) ps[i] = m.p[i], names[i] = model_names[i];
  ps[MODEL_NPARAMS] = extra;
  names[MODEL_NPARAMS] = "extra";
  for (int i = 0; i <= MODEL_NPARAMS && !rc; i++) rc = loom_tensor_zero_grad_lazy(ps[i]);
  loom_ddp_cfg cfg = loom_ddp_cfg_default();
  loom_ddp *d = NULL;
  if (!rc) rc = loom_ddp_create(pg, ps, names, MODEL_NPARAMS + 1, &cfg, &d);
  if (!rc) {
    /* DDP finishes from backward's queued callback: "extra" got no gradient, reported there
     * and by loom_ddp_finish */
    r->backward_rc[rank] = model_backward(&m, (int64_t)rank * B, B, 1.0f);
    r->finish_rc[rank] = loom_ddp_finish(d);
    const float *g = loom_tensor_data(loom_tensor_grad(extra));
    for (int i = 0; i < EXTRA; i++) r->extra_grad[rank][i] = g[i];
    model_flatten(&m, r->stepped[rank], true);
  }
  loom_ddp_free(d);
  loom_tensor_free(extra);
  loom_tensor_free(old);
  model_free(&m);
  return rc;
}

LT_TEST(ddp_sends_an_unreached_lazily_zeroed_gradient_as_zeros) {
  size_t np = model_numel();
  lazy_run r = {0};
  for (int k = 0; k < NRANKS; k++) r.stepped[k] = calloc(np, sizeof(float));
  LT_OK(loom_threads_run(NRANKS, NULL, rank_fn, &r));
  /* the reference: one process, batch NRANKS * B, gradients from zero */
  model m;
  LT_OK(model_init(&m, 11));
  LT_OK(model_backward(&m, 0, NRANKS * B, 1.0f));
  float *want = calloc(np, sizeof(float));
  model_flatten(&m, want, true);
  model_free(&m);
  for (int k = 0; k < NRANKS; k++) {
    LT_EQ(r.backward_rc[k], LOOM_EMISUSE);
    LT_EQ(r.finish_rc[k], LOOM_EMISUSE);
    for (int i = 0; i < EXTRA; i++) LT_NEAR(r.extra_grad[k][i], 0, 0);
    size_t off = 0;
    for (size_t i = 0; i < np; i++) off += fabsf(r.stepped[k][i] - want[i]) > 1e-6f;
    LT_EQ(off, 0); /* this step's gradients only, averaged */
  }
  for (int k = 0; k < NRANKS; k++) free(r.stepped[k]);
  free(want);
}
