/* train_mlp.c: mixed-precision training from C, one recipe under every strategy. Each rank
 * (threads of this process; under mpirun the same code runs with loom_mpi_pg_create) builds the
 * same MLP and trains on its part of every Fashion-MNIST batch with AdamW for one epoch. The
 * training loop is the same whatever the strategy: only the object the step is made over
 * changes (the model alone, DDP over its parameters, or FSDP over the model).
 * Usage: train_mlp [none|ddp|fsdp] [ranks] [f32|bf16|f16]   (default: ddp 2 f16) */
#include <loom/loom.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BATCH 128 /* per rank */

typedef struct options {
  const char *strategy; /* "none", "ddp", "fsdp" */
  loom_dtype amp;       /* LOOM_F32 (no autocast), LOOM_BF16, LOOM_F16 */
} options;

static int train_rank(loom_pg *pg, void *arg) {
  const options *o = arg;
  int rank = loom_pg_rank(pg), nranks = loom_pg_size(pg), rc = LOOM_OK;
  loom_set_num_threads(loom_pg_compute_threads(pg)); /* share the cores between the ranks */
  loom_module *model = NULL;
  loom_ddp *ddp = NULL;
  loom_fsdp *fsdp = NULL;
  loom_optim *opt = NULL;
  loom_scaler *scaler = NULL;
  loom_step *step = NULL;
  loom_scope *step_scope = NULL;
  loom_dataset *data = NULL;
  loom_loader *loader = NULL;
  const int64_t sizes[] = {784, 256, 10};
  loom_adam_cfg ac = loom_adamw_cfg_default();
  loom_step_cfg sc = loom_step_cfg_default();

  /* FSDP: build the model deferred (no parameter memory): loom_fsdp_create then makes only this
   * rank's shards, from the same initial values as a whole build (sharded construction) */
  bool was = loom_nn_set_deferred_init(strcmp(o->strategy, "fsdp") == 0);
  rc = loom_nn_mlp_create(sizes, 3, LOOM_ACT_RELU, LOOM_F32, /*seed*/ 1, &model);
  loom_nn_set_deferred_init(was);
  LOOM_CHECK(rc);
  sc.module = model;
  if (strcmp(o->strategy, "fsdp") == 0) {
    /* FSDP: one unit per Linear; gathers in the autocast dtype, f32 gradients; with f16 its
     * mixed-precision config makes the loss scaler */
    loom_fsdp_cfg fc = loom_fsdp_cfg_default();
    fc.mp = loom_fsdp_mp_cfg_for(o->amp);
    LOOM_CHECK(loom_fsdp_create(pg, model, &fc, &fsdp));
    sc.fsdp = fsdp;
  } else {
    if (o->amp == LOOM_F16) LOOM_CHECK(loom_scaler_create_dynamic(NULL, &scaler));
    sc.scaler = scaler;
    /* DDP: broadcasts rank 0's weights; its buckets are views of the gradient arena, each
     * all-reduced while backward still runs */
    if (strcmp(o->strategy, "ddp") == 0) LOOM_CHECK(loom_ddp_create_for_module(pg, model, NULL, &ddp));
    sc.ddp = ddp;
  }
  /* The optimizer over the gradients the step finishes: the model's flat arena (all weights
   * and gradients, one buffer each), or under FSDP this rank's shards, one per unit */
  LOOM_CHECK(loom_adamw_create_for_module(model, &ac, &opt));
  sc.optim = opt;
  sc.clip = true; /* clip the global gradient norm to 1 */
  LOOM_CHECK(loom_step_create(&sc, &step));

  LOOM_CHECK(loom_mnist_load(NULL, LOOM_SPLIT_TRAIN, &data));
  loom_loader_cfg lc = loom_loader_cfg_default();
  lc.batch = (size_t)BATCH * (size_t)nranks; /* a global batch; each rank takes its rows */
  lc.flatten = true;
  lc.drop_last = true;
  LOOM_CHECK(loom_loader_create(data, &lc, &loader));

  /* the step's tensors belong to a scope: one call frees them all after each step */
  loom_tensor *x = NULL, *y = NULL, *xr = NULL, *yr = NULL, *logits = NULL, *loss = NULL;
  LOOM_CHECK(loom_scope_create(&step_scope));
  LOOM_CHECK(loom_scope_track(step_scope, &x, &y, &xr, &yr, &logits, &loss));
  int skipped = 0;
  for (size_t b = 0; b < loom_loader_batches(loader); b++) {
    loom_autocast_token tok = {0};
    loom_step_result r;
    LOOM_CHECK(loom_loader_batch(loader, 0, b, &x, &y));
    LOOM_CHECK(loom_tensor_narrow(x, 0, (int64_t)rank * BATCH, BATCH, &xr));
    LOOM_CHECK(loom_tensor_narrow(y, 0, (int64_t)rank * BATCH, BATCH, &yr));
    /* the recipe: the same five calls under every strategy */
    LOOM_CHECK(loom_step_zero_grad(step));
    if (o->amp != LOOM_F32)
      LOOM_CHECK(loom_autocast_enter(o->amp == LOOM_F16 ? LOOM_AUTOCAST_F16 : LOOM_AUTOCAST_BF16,
                                     NULL, &tok));
    rc = loom_module_forward(model, xr, &logits);
    if (!rc) rc = loom_cross_entropy(logits, yr, LOOM_REDUCTION_MEAN, -100, &loss);
    if (tok.owner) { /* leave the autocast region whatever happened inside it */
      int rc2 = loom_autocast_exit(&tok);
      if (!rc) rc = rc2;
    }
    LOOM_CHECK(rc);
    LOOM_CHECK(loom_step_backward(step, loss));
    LOOM_CHECK(loom_step_apply(step, &r));
    skipped += r.skipped;
    double v = 0;
    if (rank == 0 && b % 50 == 0 && !loom_tensor_item(loss, &v))
      printf("step %4zu  loss %.4f  grad norm %.3f  loss scale %g\n", b, v, r.grad_norm, r.scale);
    loom_scope_release(step_scope);
  }
  if (rank == 0)
    printf("rank 0: %s, %d ranks, %zu steps, %d skipped for overflow\n", o->strategy, nranks,
           loom_loader_batches(loader), skipped);
done:
  loom_scope_free(step_scope); /* a failed step's tensors too */
  loom_loader_free(loader);
  loom_dataset_free(data);
  loom_step_free(step);
  loom_optim_free(opt);
  loom_scaler_free(scaler);
  loom_ddp_free(ddp);
  loom_fsdp_free(fsdp);
  loom_module_free(model);
  return rc;
}

int main(int argc, char **argv) {
  options o = {argc > 1 ? argv[1] : "ddp", LOOM_F16};
  int ranks = argc > 2 ? atoi(argv[2]) : 2;
  const char *amp = argc > 3 ? argv[3] : "f16";
  if (strcmp(o.strategy, "none") && strcmp(o.strategy, "ddp") && strcmp(o.strategy, "fsdp")) {
    fprintf(stderr, "train_mlp: strategy '%s' is not none, ddp or fsdp\n", o.strategy);
    return 2;
  }
  if (!strcmp(amp, "f32")) o.amp = LOOM_F32;
  else if (!strcmp(amp, "bf16")) o.amp = LOOM_BF16;
  else if (strcmp(amp, "f16")) {
    fprintf(stderr, "train_mlp: precision '%s' is not f32, bf16 or f16\n", amp);
    return 2;
  }
  if (ranks < 1 || (!strcmp(o.strategy, "none") && ranks != 1)) {
    fprintf(stderr, "train_mlp: %d ranks (none takes 1)\n", ranks);
    return 2;
  }
  int rc = loom_threads_run(ranks, NULL, train_rank, &o);
  if (rc) {
    fprintf(stderr, "train_mlp: %s: %s\n", loom_strerror(rc), loom_last_error());
    return 1;
  }
  return 0;
}
