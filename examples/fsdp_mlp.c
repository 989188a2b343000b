/* fsdp_mlp.c: fully sharded training from C, as a user writes it. Each rank (a thread of this
 * process; the same code runs under mpirun with loom_mpi_pg_create) builds the same MLP and
 * wraps it with FSDP, which keeps only this rank's shard of every layer's parameters,
 * gradients and AdamW state, gathers each layer in bf16 just before it runs, and
 * reduce-scatters its gradients while backward goes on. The optimizer steps on the shards;
 * the loss scale and overflow check come from FSDP's mixed precision (bf16: none needed).
 * At the end rank 0 writes the whole model under PyTorch's names. One epoch, a few seconds.
 * Usage: fsdp_mlp [ranks] [out.safetensors] */
#include <loom/dist.h>
#include <loom/fsdp.h>
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
  const char *out = arg;
  int rank = loom_pg_rank(pg), nranks = loom_pg_size(pg), rc = LOOM_OK;
  loom_set_num_threads(loom_pg_compute_threads(pg)); /* share the cores between the ranks */
  loom_module *model = NULL;
  loom_fsdp *fsdp = NULL;
  loom_optim *opt = NULL;
  loom_dataset *data = NULL;
  loom_loader *loader = NULL;
  loom_named_tensor *state = NULL;
  size_t nstate = 0;
  const int64_t sizes[] = {784, 512, 256, 10};

  TRY(loom_nn_mlp_create(sizes, 4, LOOM_ACT_RELU, LOOM_F32, /*seed*/ 1, &model));
  loom_fsdp_cfg cfg;
  loom_fsdp_cfg_default(&cfg);                 /* one unit per Linear, reshard after forward */
  loom_fsdp_mp_cfg_for(LOOM_BF16, &cfg.mp);    /* gather and compute in bf16, f32 gradients */
  TRY(loom_fsdp_create(pg, model, &cfg, &fsdp));
  const loom_param_seg *segs = NULL;
  size_t nseg = 0;
  TRY(loom_fsdp_segments(fsdp, &segs, &nseg)); /* this rank's shards, one per unit */
  loom_adam_cfg ac = loom_adamw_cfg_default();
  TRY(loom_optim_create_adamw(segs, nseg, &ac, &opt));

  TRY(loom_mnist_load(NULL, LOOM_SPLIT_TRAIN, &data));
  loom_loader_cfg lc = loom_loader_cfg_default();
  lc.batch = (size_t)BATCH * (size_t)nranks; /* a global batch; each rank takes its rows */
  lc.flatten = true;
  lc.drop_last = true;
  TRY(loom_loader_create(data, &lc, &loader));

  for (size_t b = 0; b < loom_loader_batches(loader); b++) {
    loom_tensor *x = NULL, *y = NULL, *xr = NULL, *yr = NULL, *logits = NULL, *loss = NULL;
    loom_tensor *scaled = NULL;
    bool overflow = false;
    rc = loom_loader_batch(loader, 0, b, &x, &y);
    if (!rc) rc = loom_tensor_narrow(x, 0, (int64_t)rank * BATCH, BATCH, &xr);
    if (!rc) rc = loom_tensor_narrow(y, 0, (int64_t)rank * BATCH, BATCH, &yr);
    /* autocast around forward and loss, as with AMP alone: the loss in f32 (the units would
     * enter a bf16 region by themselves, but the loss outside them would be bf16) */
    loom_autocast_token tok = {0};
    if (!rc) rc = loom_autocast_enter(LOOM_AUTOCAST_BF16, NULL, &tok);
    if (!rc) rc = loom_module_forward(model, xr, &logits);
    if (!rc) rc = loom_cross_entropy(logits, yr, LOOM_REDUCTION_MEAN, -100, &loss);
    if (tok.owner) {
      int rc2 = loom_autocast_exit(&tok);
      if (!rc) rc = rc2;
    }
    if (!rc) rc = loom_fsdp_scale_loss(fsdp, loss, &scaled);
    if (!rc) rc = loom_backward(scaled, NULL, false); /* reduce-scatters as units complete */
    if (!rc) rc = loom_fsdp_finish(fsdp);
    if (!rc) rc = loom_fsdp_check_overflow(fsdp, &overflow); /* the same answer on every rank */
    if (!rc && !overflow) rc = loom_optim_step(opt);
    double v = 0;
    if (!rc && rank == 0 && b % 50 == 0 && !loom_tensor_item(loss, &v))
      printf("step %4zu  loss %.4f\n", b, v);
    loom_tensor_free(x), loom_tensor_free(y), loom_tensor_free(xr), loom_tensor_free(yr);
    loom_tensor_free(logits), loom_tensor_free(loss), loom_tensor_free(scaled);
    if (rc) goto done;
  }
  TRY(loom_fsdp_full_state(fsdp, &state, &nstate)); /* every rank takes part; rank 0 gets it */
  if (rank == 0) {
    loom_fsdp_stats st;
    TRY(loom_fsdp_stats_get(fsdp, &st));
    printf("rank 0: %llu steps, %zu units, %zu of %zu parameters held here, %llu all-gathers, "
           "%llu reduce-scatters, %.1f ms waiting for them\n",
           (unsigned long long)st.steps, st.units, st.shard_numel, loom_module_numel(model),
           (unsigned long long)st.gathers, (unsigned long long)st.reduce_scatters,
           st.exposed_s * 1e3);
    if (out) {
      loom_safetensors_entry e[16];
      for (size_t i = 0; i < nstate && i < 16; i++)
        e[i] = (loom_safetensors_entry){.name = state[i].name, .tensor = state[i].tensor};
      TRY(loom_safetensors_write(out, e, nstate, NULL, 0));
      printf("rank 0: wrote %s\n", out);
    }
  }
done:
  loom_fsdp_state_free(state, nstate);
  loom_loader_free(loader);
  loom_dataset_free(data);
  loom_optim_free(opt);
  loom_fsdp_free(fsdp);
  loom_module_free(model);
  return rc;
}

int main(int argc, char **argv) {
  int ranks = argc > 1 ? atoi(argv[1]) : 2;
  int rc = loom_threads_run(ranks, NULL, train_rank, argc > 2 ? argv[2] : NULL);
  if (rc) {
    fprintf(stderr, "fsdp_mlp: %s: %s\n", loom_strerror(rc), loom_last_error());
    return 1;
  }
  return 0;
}
