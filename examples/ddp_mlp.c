/* ddp_mlp.c: data-parallel training from C, as a user writes it. Two ranks (threads of this
 * process; the same code runs under mpirun with loom_mpi_pg_create) each build the same MLP,
 * wrap its parameters with DDP, and train on their half of every Fashion-MNIST batch with
 * AdamW; rank 0 prints the loss. One epoch, a few seconds.
 * Usage: ddp_mlp [ranks] */
#include <loom/ddp.h>
#include <loom/dist.h>
#include <loom/loom.h>

#include <stdio.h>
#include <stdlib.h>

#define BATCH 128 /* per rank */

#define TRY(call)                                                                             \
  do {                                                                                        \
    rc = (call);                                                                              \
    if (rc) goto done;                                                                        \
  } while (0)

static int train_rank(loom_pg *pg, void *arg) {
  (void)arg;
  int rank = loom_pg_rank(pg), nranks = loom_pg_size(pg), rc = LOOM_OK;
  loom_set_num_threads(loom_pg_compute_threads(pg)); /* share the cores between the ranks */
  loom_module *model = NULL;
  loom_ddp *ddp = NULL;
  loom_optim *opt = NULL;
  loom_dataset *data = NULL;
  loom_loader *loader = NULL;
  loom_tensor *params[8] = {0};
  const int64_t sizes[] = {784, 256, 10};

  TRY(loom_nn_mlp_create(sizes, 3, LOOM_ACT_RELU, LOOM_F32, /*seed*/ 1, &model));
  size_t np = loom_module_param_count(model);
  for (size_t i = 0; i < np; i++) {
    loom_param p;
    TRY(loom_module_param(model, i, &p));
    params[i] = p.value;
  }
  /* The optimizer runs over the model's flat arena: all weights and all gradients, one buffer
   * each. */
  loom_tensor *weights = NULL, *grads = NULL;
  size_t numel = 0;
  TRY(loom_module_arena(model, LOOM_F32, &weights, &grads, &numel));
  loom_param_seg seg = {"mlp", loom_tensor_data(weights), loom_tensor_data(grads), numel, 0};
  loom_adam_cfg ac = loom_adamw_cfg_default();
  TRY(loom_optim_create_adamw(&seg, 1, &ac, &opt));
  /* DDP: checks the ranks agree, broadcasts rank 0's weights, and makes its buckets views of
   * the gradient arena, each all-reduced while backward still runs: the optimizer reads the
   * averaged gradients where it always did. */
  TRY(loom_ddp_create(pg, params, NULL, np, NULL, &ddp));

  TRY(loom_mnist_load(NULL, LOOM_SPLIT_TRAIN, &data));
  loom_loader_cfg lc = loom_loader_cfg_default();
  lc.batch = (size_t)BATCH * (size_t)nranks; /* a global batch; each rank takes its rows */
  lc.flatten = true;
  lc.drop_last = true;
  TRY(loom_loader_create(data, &lc, &loader));

  for (size_t b = 0; b < loom_loader_batches(loader); b++) {
    loom_tensor *x = NULL, *y = NULL, *xr = NULL, *yr = NULL, *logits = NULL, *loss = NULL;
    rc = loom_loader_batch(loader, 0, b, &x, &y);
    if (!rc) rc = loom_tensor_narrow(x, 0, (int64_t)rank * BATCH, BATCH, &xr);
    if (!rc) rc = loom_tensor_narrow(y, 0, (int64_t)rank * BATCH, BATCH, &yr);
    if (!rc) rc = loom_module_zero_grad(model);
    if (!rc) rc = loom_module_forward(model, xr, &logits);
    if (!rc) rc = loom_cross_entropy(logits, yr, LOOM_REDUCTION_MEAN, -100, &loss);
    if (!rc) rc = loom_backward(loss, NULL, false);
    if (!rc) rc = loom_ddp_finish(ddp); /* gradients are now the average over ranks */
    if (!rc) rc = loom_optim_step(opt);
    double v = 0;
    if (!rc && rank == 0 && b % 50 == 0 && !loom_tensor_item(loss, &v))
      printf("step %4zu  loss %.4f\n", b, v);
    loom_tensor_free(x), loom_tensor_free(y), loom_tensor_free(xr), loom_tensor_free(yr);
    loom_tensor_free(logits), loom_tensor_free(loss);
    if (rc) goto done;
  }
  if (rank == 0) {
    loom_ddp_stats st;
    TRY(loom_ddp_stats_get(ddp, &st));
    printf("rank 0: %llu steps, %zu buckets, %llu all-reduces, %.1f MB reduced, %.1f ms waiting "
           "after backward in all\n",
           (unsigned long long)st.steps, st.buckets, (unsigned long long)st.collectives,
           (double)st.bytes / 1e6, st.exposed_s * 1e3);
  }
done:
  loom_loader_free(loader);
  loom_dataset_free(data);
  loom_optim_free(opt);
  loom_ddp_free(ddp);
  loom_module_free(model);
  return rc;
}

int main(int argc, char **argv) {
  int ranks = argc > 1 ? atoi(argv[1]) : 2;
  int rc = loom_threads_run(ranks, NULL, train_rank, NULL);
  if (rc) {
    fprintf(stderr, "ddp_mlp: %s: %s\n", loom_strerror(rc), loom_last_error());
    return 1;
  }
  return 0;
}
