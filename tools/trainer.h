/* trainer.h: the state of one `loom train` run and the steps its files share (private to the
 * tool): train_run.c (setup, the step, evaluation, the loop; cmd_eval.c evaluates a saved
 * model through it), train_data.c (the data: images,
 * text, or a dry run's zeros) and train_dry.c (the dry run behind `loom plan`). */
#ifndef LOOM_TOOLS_TRAINER_H
#define LOOM_TOOLS_TRAINER_H

#include "train_api.h"

typedef struct trainer {
  const train_opts *o;
  train_par *par;
  loom_fsdp *fsdp; /* --strategy fsdp: the shards train, every rank evaluates and saves */
  bool lead; /* rank 0: prints, evaluates, writes */
  int rank, nranks;
  loom_dataset *train, *test;
  loom_loader *loader, *test_loader;
  loom_text *text;   /* --model gpt: the text, its windows the batches */
  int64_t per_sample; /* tokens a sample holds: the context for the GPT, else 1 */
  const char *unit;   /* what the rate counts: "samples", or "tokens" for the GPT */
  train_model model;
  loom_param_seg *segs;
  loom_optim *opt;
  loom_scaler *scaler; /* without FSDP (owned; FSDP's is its mixed precision's) */
  loom_step *step;     /* the step recipe over the model, DDP or FSDP, optimizer and scaler */
  loom_autocast_mode amp;
  loom_lr_schedule sched;
  train_metrics *metrics;
  train_state st;
  int64_t total_steps, stop_step, overflows;
  size_t test_n;
  double train_s;  /* seconds inside steps */
  int64_t samples; /* global samples trained by this run */
  double accuracy;  /* test accuracy after the last evaluation, %; the GPT's validation loss */
  double test_loss; /* the classifier's mean test loss after the last evaluation */
  int64_t eval_step; /* the step of the last evaluation, -1 before the first */
  size_t setup_peak; /* ranks as threads: this rank's compute peak while building (then reset) */
  size_t *class_hit, *class_seen; /* NULL, or per class: correct and all (loom eval) */
  bool evaluated;
  bool dry; /* train_run_dry: loom's dry run, batches of zeros, no data read (train_plan.c) */
} trainer;

/* Record loom's message behind `what` and return the status, if call fails. */
#define TRY(call, what)                                                                       \
  do {                                                                                        \
    rc = (call);                                                                              \
    if (rc) return train_fail_loom(rc, what);                                                 \
  } while (0)

/* Build everything a run needs (model, DDP or FSDP, data, optimizer, scaler, step; restore
 * --resume), a training step, an evaluation (test accuracy, or the GPT's validation loss), and
 * the teardown (t may be partly built). Each failing call records its message (train_fail). */
int trainer_setup(trainer *t, loom_pg *pg);
int trainer_step(trainer *t, double *loss_value, loom_step_result *res);
int trainer_evaluate(trainer *t, double *accuracy);
void trainer_teardown(trainer *t);

/* The data (train_data.c): the steps per epoch and evaluation sizes, and the data itself unless
 * dry; a dry run's batch of `rows` samples (zeros of the shapes the loader or the text makes). */
int trainer_load_data(trainer *t);
int trainer_dry_batch(trainer *t, int64_t rows, loom_tensor **x, loom_tensor **y);

#endif
