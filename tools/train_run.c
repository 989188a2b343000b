/* train_run.c: the training loop of `loom train`. A step is the library's recipe (loom/step.h,
 * the same calls with no strategy, DDP and FSDP): the learning rate of the step, batch (epoch,
 * index) from the random-access loader (this rank's rows of it), zero_grad, forward under
 * autocast, cross-entropy, loom_step_backward (loss x scale, gradients averaged over ranks;
 * with --optim-in-backward each FSDP unit steps there); then the tool's own check over the
 * ranks (a non-finite loss or a signal stops every rank before the update); then
 * loom_step_apply (overflow flag over ranks, unscale, optimizer step unless the step overflowed
 * or backward took it, scaler update). The learning rate is a function of the step
 * index and the data of (seed, epoch, index), so a run resumed from a checkpoint takes exactly
 * the steps an uninterrupted one would. After each epoch: test accuracy, checkpoint (with the
 * step's scaler). At the end: a one-line summary (and one about FSDP offload when it is on). */
#include "progress.h"
#include "trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>



/* ---- setup ------------------------------------------------------------------------------ */

/* The optimizer's segments: every parameter (by name) with its gradient, or FSDP's shards (one
 * per unit): the gradients loom_step finishes. */
static int make_segments(trainer *t, const loom_param_seg **segs, size_t *n) {
  const train_model *m = &t->model;
  if (t->fsdp) {
    int rc = loom_fsdp_segments(t->fsdp, segs, n);
    return rc ? train_fail_loom(rc, "--strategy fsdp") : LOOM_OK;
  }
  t->segs = calloc(m->nparams ? m->nparams : 1, sizeof *t->segs);
  if (!t->segs) return train_fail(LOOM_ENOMEM, "train: out of memory");
  for (size_t i = 0; i < m->nparams; i++) {
    loom_tensor *v = m->params[i].value, *g = loom_tensor_grad(v);
    if (!g) return train_fail(LOOM_EMISUSE, "train: parameter %s has no gradient buffer",
                              m->params[i].name);
    t->segs[i] = (loom_param_seg){m->params[i].name, loom_tensor_data(v), loom_tensor_data(g),
                                  m->params[i].numel, 0};
  }
  *segs = t->segs;
  *n = m->nparams;
  return LOOM_OK;
}

static int make_optimizer(trainer *t) {
  const train_opts *o = t->o;
  const loom_param_seg *segs = NULL;
  size_t nseg = 0;
  int rc = make_segments(t, &segs, &nseg);
  if (rc) return rc;
  if (strcmp(o->optim, "sgd") == 0) {
    loom_sgd_cfg c = loom_sgd_cfg_default();
    c.lr = o->lr, c.momentum = o->momentum, c.weight_decay = o->weight_decay;
    c.state_pool = train_offload_state_pool(o);
    TRY(loom_optim_create_sgd(segs, nseg, &c, &t->opt), "--optim sgd");
  } else {
    bool w = strcmp(o->optim, "adamw") == 0;
    loom_adam_cfg c = w ? loom_adamw_cfg_default() : loom_adam_cfg_default();
    c.lr = o->lr, c.weight_decay = o->weight_decay;
    c.state_pool = train_offload_state_pool(o);
    TRY((w ? loom_optim_create_adamw : loom_optim_create_adam)(segs, nseg, &c, &t->opt),
        w ? "--optim adamw" : "--optim adam");
  }
  t->sched = loom_lr_schedule_default();
  t->sched.lr = o->lr;
  t->sched.warmup_steps = o->warmup;
  t->sched.min_lr = o->min_lr;
  if (o->warmup_auto && t->sched.warmup_steps > t->total_steps / 10)
    t->sched.warmup_steps = t->total_steps / 10; /* the GPT's default: a tenth at most */
  t->sched.kind = strcmp(o->schedule, "cosine") == 0   ? LOOM_LR_COSINE
                  : strcmp(o->schedule, "warmup") == 0 ? LOOM_LR_WARMUP
                                                       : LOOM_LR_CONSTANT;
  t->sched.total_steps = t->total_steps;
  if (!o->warmup_auto && o->warmup > t->total_steps)
    return train_fail(LOOM_EINVAL, "--warmup %ld is more than the %lld steps of the run",
                      o->warmup, (long long)t->total_steps);
  if (t->sched.kind == LOOM_LR_COSINE && t->sched.total_steps <= t->sched.warmup_steps)
    t->sched.total_steps = t->sched.warmup_steps + 1;
  TRY(loom_lr_schedule_validate(&t->sched), "--schedule");
  return LOOM_OK;
}

static int make_scaler(trainer *t) {
  const train_opts *o = t->o;
  int rc = LOOM_OK;
  if (t->fsdp) return LOOM_OK; /* FSDP's mixed precision holds the scale */
  if (strcmp(o->scaler, "dynamic") == 0) {
    loom_dynamic_scaler_cfg c = loom_dynamic_scaler_cfg_default();
    c.initial_scale = (float)o->loss_scale;
    TRY(loom_scaler_create_dynamic(&c, &t->scaler), "--scaler dynamic");
  } else if (strcmp(o->scaler, "static") == 0) {
    TRY(loom_scaler_create_static((float)o->loss_scale, &t->scaler), "--scaler static");
  }
  return rc;
}

/* The step recipe over what setup made (no strategy, the DDP of train_par, or its FSDP). */
static int make_step(trainer *t) {
  loom_step_cfg c = loom_step_cfg_default();
  c.module = t->model.root;
  c.ddp = train_par_ddp(t->par);
  c.fsdp = t->fsdp;
  c.optim = t->opt;
  c.scaler = t->scaler;
  int rc = loom_step_create(&c, &t->step);
  return rc ? train_fail_loom(rc, "the training step") : LOOM_OK;
}

/* Whether the run scales its loss (a scaler, or FSDP's mixed precision with loss scaling). */
int train_progress_mode(const train_opts *o) {
  const char *m = o->progress ? o->progress : "auto";
  return strcmp(m, "bar") == 0 ? PROGRESS_BAR : strcmp(m, "lines") == 0 ? PROGRESS_LINES
                                                                       : PROGRESS_AUTO;
}

static bool scales_loss(const trainer *t) { return loom_step_scaler(t->step) != NULL; }

/* ---- a step ----------------------------------------------------------------------------- */

/* This rank's rows of the global batch (the GPT's batches are this rank's rows already). */
static int shard(trainer *t, loom_tensor **x, loom_tensor **y) {
  if (t->nranks == 1 || t->model.gpt) return LOOM_OK;
  int64_t b = t->o->batch;
  loom_tensor *xs = NULL, *ys = NULL;
  int rc = loom_tensor_narrow(*x, 0, t->rank * b, b, &xs);
  if (!rc) rc = loom_tensor_narrow(*y, 0, t->rank * b, b, &ys);
  loom_tensor_free(*x);
  loom_tensor_free(*y);
  *x = xs, *y = ys;
  return rc;
}

/* Forward and loss under autocast. */
static int forward_loss(trainer *t, loom_tensor *x, loom_tensor *y, loom_tensor **loss) {
  loom_autocast_token tok;
  int rc = loom_autocast_enter(t->amp, NULL, &tok);
  if (rc) return rc;
  loom_tensor *logits = NULL;
  rc = train_model_forward(&t->model, x, &logits);
  if (!rc) rc = train_model_loss(&t->model, logits, y, loss);
  loom_tensor_free(logits);
  int rc2 = loom_autocast_exit(&tok);
  return rc ? rc : rc2;
}

static int diverged(int64_t s, double loss, const char *when) {
  return train_fail(LOOM_EINVAL, "step %lld: the loss is %s: training diverged (too high a "
                    "--lr?); stopped %s, no checkpoint written", (long long)s + 1,
                    isfinite(loss) ? "not finite on another rank" : isnan(loss) ? "nan" : "inf",
                    when);
}

int trainer_step(trainer *t, double *loss_value, loom_step_result *res) {
  int64_t s = t->st.step, spe = t->st.steps_per_epoch;
  loom_tensor *x = NULL, *y = NULL, *loss = NULL;
  /* the step's learning rate before backward: with --optim-in-backward, backward steps */
  int rc;
  TRY(loom_optim_set_lr(t->opt, loom_lr_at(&t->sched, s)), "learning rate");
  loom_mem_set_tag(TRAIN_TAG_BATCH);
  int64_t b = t->o->batch;
  rc = t->dry && t->model.gpt ? trainer_dry_batch(t, b, &x, &y)
           : t->dry               ? trainer_dry_batch(t, b * t->nranks, &x, &y)
           : t->model.gpt ? loom_text_batch(t->text, (uint64_t)t->o->seed, (uint64_t)s,
                                            (size_t)(t->rank * b), (size_t)b,
                                            (size_t)t->o->context, &x, &y)
                          : loom_loader_batch(t->loader, (uint64_t)(s / spe), (size_t)(s % spe),
                                              &x, &y);
  loom_mem_set_tag(TRAIN_TAG_FORWARD);
  if (rc) return train_fail_loom(rc, "the training data");
  rc = shard(t, &x, &y);
  if (!rc) rc = loom_step_zero_grad(t->step);
  if (!rc) rc = forward_loss(t, x, y, &loss);
  if (rc) train_fail_loom(rc, "forward");
  loom_tensor_free(x);
  loom_tensor_free(y);
  if (!rc) rc = loom_tensor_item(loss, loss_value);
  loom_mem_set_tag(TRAIN_TAG_BACKWARD);
  if (!rc && (rc = loom_step_backward(t->step, loss))) train_fail_loom(rc, "backward");
  loom_tensor_free(loss);
  loom_mem_set_tag(TRAIN_TAG_UPDATE);
  if (rc) return rc;
  /* The tool's check between backward and the update, one flag over the ranks per step: a
   * non-finite loss or SIGINT / SIGTERM / SIGHUP on any rank. Only when it is up does a second
   * exchange tell the two apart. A signal stops every rank here, before the update, saving
   * nothing; so does a non-finite loss without loss scaling (diverged). With loss scaling a
   * non-finite loss is the scaler's case, an overflow step: its gradients are not finite, so
   * apply skips the update and backs the scale off (had they been finite, every rank stops
   * after it, saving nothing all the same). */
  bool stop = false, interrupted = false;
  TRY(train_par_any(t->par, !isfinite(*loss_value) || train_signal_pending(), &stop), "stop check");
  if (stop) TRY(train_par_any(t->par, train_signal_pending() != 0, &interrupted), "interrupt check");
  if (interrupted)
    return train_fail(LOOM_EABORTED, "interrupted before step %lld; %s", (long long)s + 1,
                      t->o->save ? "the last checkpoint written is intact" : "nothing saved");
  if (stop && !scales_loss(t)) return diverged(s, *loss_value, "before the update");
  TRY(loom_step_apply(t->step, res), "optimizer step");
  loom_mem_set_tag(TRAIN_TAG_OTHER);
  if (stop && !res->skipped) return diverged(s, *loss_value, "after the update");
  t->overflows += res->skipped;
  t->st.step++;
  return LOOM_OK;
}

/* ---- evaluation ------------------------------------------------------------------------- */

/* The rows of a batch (at most n) whose largest logit is the label's, into *correct; per
 * class too (hit[label], seen[label]) when hit is not NULL. */
static int count_correct(loom_tensor *logits, loom_tensor *y, size_t n, size_t *correct,
                         size_t *hit, size_t *seen) {
  size_t rows = (size_t)loom_tensor_dim(logits, 0), cls = (size_t)loom_tensor_dim(logits, 1);
  float *l = malloc(rows * cls * sizeof *l);
  int64_t *lab = malloc(rows * sizeof *lab);
  int rc = !l || !lab ? LOOM_ENOMEM : LOOM_OK;
  if (!rc) rc = loom_tensor_read(logits, LOOM_F32, l, rows * cls * sizeof *l);
  if (!rc) rc = loom_tensor_read(y, LOOM_I64, lab, rows * sizeof *lab);
  for (size_t r = 0; r < rows && r < n && !rc; r++) {
    size_t best = 0;
    for (size_t c = 1; c < cls; c++)
      if (l[r * cls + c] > l[r * cls + best]) best = c;
    *correct += (int64_t)best == lab[r];
    if (hit && lab[r] >= 0 && (size_t)lab[r] < cls) {
      hit[lab[r]] += (int64_t)best == lab[r];
      seen[lab[r]]++;
    }
  }
  free(l);
  free(lab);
  return rc;
}

/* The batch's summed loss over its first n rows (at most all) into *sum: the model's mean
 * loss over those rows times their count. */
static int add_loss(const trainer *t, loom_tensor *logits, loom_tensor *y, size_t n,
                    double *sum) {
  int64_t rows = loom_tensor_dim(logits, 0);
  if ((int64_t)n < rows) rows = (int64_t)n;
  loom_tensor *l = NULL, *yy = NULL, *loss = NULL;
  int rc = loom_tensor_narrow(logits, 0, 0, rows, &l);
  if (!rc) rc = loom_tensor_narrow(y, 0, 0, rows, &yy);
  if (!rc) rc = train_model_loss(&t->model, l, yy, &loss);
  double v = 0;
  if (!rc) rc = loom_tensor_item(loss, &v);
  *sum += v * (double)rows;
  loom_tensor_free(l);
  loom_tensor_free(yy);
  loom_tensor_free(loss);
  return rc;
}

/* The GPT's validation loss: the mean cross entropy over the validation windows (every
 * token of each), in batches of --eval-batch windows (a dry run: the first batch). */
static int evaluate_text(trainer *t, double *val_loss) {
  size_t count = t->test_n, most = (size_t)t->o->eval_batch, ctx = (size_t)t->o->context;
  double sum = 0;
  int rc = LOOM_OK;
  for (size_t first = 0; first < count && !rc; first += most) {
    size_t rows = count - first < most ? count - first : most;
    loom_tensor *x = NULL, *y = NULL, *logits = NULL, *loss = NULL;
    rc = t->dry ? trainer_dry_batch(t, (int64_t)rows, &x, &y)
                : loom_text_val_batch(t->text, count, first, rows, ctx, &x, &y);
    if (!rc) rc = train_model_forward(&t->model, x, &logits);
    if (!rc) rc = train_model_loss(&t->model, logits, y, &loss);
    double v = 0;
    if (!rc) rc = loom_tensor_item(loss, &v);
    sum += v * (double)rows;
    loom_tensor_free(x);
    loom_tensor_free(y);
    loom_tensor_free(logits);
    loom_tensor_free(loss);
    if (t->dry) break;
  }
  *val_loss = count ? sum / (double)count : 0;
  return rc;
}

int trainer_evaluate(trainer *t, double *accuracy) {
  size_t correct = 0, done = 0;
  double loss_sum = 0;
  size_t nb = t->dry || t->model.gpt ? 1 : loom_loader_batches(t->test_loader);
  int rc = LOOM_OK;
  loom_autocast_token tok = {0};
  loom_mem_set_tag(TRAIN_TAG_EVAL);
  loom_no_grad_enter();
  loom_module_set_training(t->model.root, false);
  rc = loom_autocast_enter(t->amp, NULL, &tok);
  if (!rc && t->model.gpt) rc = evaluate_text(t, accuracy);
  for (size_t b = 0; b < nb && done < t->test_n && !rc && !t->model.gpt; b++) {
    loom_tensor *x = NULL, *y = NULL, *logits = NULL;
    rc = t->dry ? trainer_dry_batch(t, (int64_t)(t->test_n < (size_t)t->o->eval_batch ? t->test_n
                                          : (size_t)t->o->eval_batch), &x, &y)
                : loom_loader_batch(t->test_loader, 0, b, &x, &y);
    if (!rc) rc = train_model_forward(&t->model, x, &logits);
    if (!rc) rc = count_correct(logits, y, t->test_n - done, &correct, t->class_hit,
                                   t->class_seen);
    if (!rc) rc = add_loss(t, logits, y, t->test_n - done, &loss_sum);
    if (!rc) done += (size_t)loom_tensor_dim(x, 0);
    loom_tensor_free(x);
    loom_tensor_free(y);
    loom_tensor_free(logits);
  }
  if (rc) train_fail_loom(rc, "evaluation");
  if (tok.owner) loom_autocast_exit(&tok);
  loom_module_set_training(t->model.root, true);
  loom_no_grad_exit();
  loom_mem_set_tag(TRAIN_TAG_OTHER);
  t->eval_step = t->st.step;
  if (!t->model.gpt) *accuracy = 100.0 * (double)correct / (double)(t->test_n ? t->test_n : 1);
  if (!t->model.gpt) t->test_loss = loss_sum / (double)(t->test_n ? t->test_n : 1);
  return rc;
}

/* ---- the run ---------------------------------------------------------------------------- */

static void fmt_rate(char *buf, size_t cap, double r) {
  if (r >= 1e4)
    snprintf(buf, cap, "%.1fk", r / 1e3);
  else
    snprintf(buf, cap, "%.0f", r);
}

static int write_record(trainer *t, double loss, const loom_step_result *res, double step_s) {
  char extra[2048];
  train_par_json(t->par, extra, sizeof extra);
  bool gpt = t->model.gpt;
  train_record r = {t->st.step, (t->st.step - 1) / t->st.steps_per_epoch, loss,
                    loom_lr_at(&t->sched, t->st.step - 1),
                    res->scale, res->skipped,
                    (double)(t->o->batch * t->nranks) / step_s, extra,
                    t->eval_step == t->st.step, gpt ? t->accuracy : t->test_loss,
                    gpt ? 0 : t->accuracy,
                    (double)t->st.step / (double)t->st.steps_per_epoch,
                    t->st.step * t->o->batch * t->nranks, !gpt};
  return train_metrics_write(t->metrics, &r);
}

/* What the last evaluation found: "test accuracy 85.21%", or the GPT's "val loss 2.3456". */
static void result_text(const trainer *t, char *buf, size_t cap) {
  if (t->model.gpt) snprintf(buf, cap, "val loss %.4f", t->accuracy);
  else snprintf(buf, cap, "test accuracy %.2f%%", t->accuracy);
}

/* Evaluations run after the epoch's last step, before its metrics record (which carries the
 * result), and the GPT's also after every --eval-every steps (rank 0, or every rank under
 * FSDP, whose gathers need them all). */
static bool evaluates_now(const trainer *t, int64_t end) {
  if (!t->lead && !t->fsdp) return false;
  return t->st.step == end ||
         (t->model.gpt && t->o->eval_every > 0 && t->st.step % t->o->eval_every == 0);
}

/* Steps to the end of this epoch or of the run, then (rank 0) test accuracy and checkpoint. */
static int run_epoch(trainer *t) {
  const train_opts *o = t->o;
  int64_t spe = t->st.steps_per_epoch, epoch = t->st.step / spe;
  int64_t end = (epoch + 1) * spe < t->stop_step ? (epoch + 1) * spe : t->stop_step;
  char label[48], figures[160], rate[32], result[48];
  snprintf(label, sizeof label, "epoch %lld/%ld", (long long)epoch + 1, o->epochs);
  progress pr;
  if (t->lead && !o->quiet) {
    progress_begin(&pr, o->out, label, (long)spe, train_progress_mode(o));
    progress_set_run(&pr, (long)(epoch * spe), (long)t->stop_step);
  }
  double t0 = progress_now(), loss = 0, loss_sum = 0;
  int64_t n = 0;
  int rc = LOOM_OK;
  while (t->st.step < end && !rc) {
    double s0 = progress_now();
    loom_step_result res;
    rc = trainer_step(t, &loss, &res);
    double dt = progress_now() - s0;
    t->train_s += dt;
    if (rc) break;
    n++;
    loss_sum += loss;
    t->samples += o->batch * t->nranks;
    if (evaluates_now(t, end) && (rc = trainer_evaluate(t, &t->accuracy))) break;
    if (t->lead && t->metrics) rc = write_record(t, loss, &res, dt);
    if (t->lead && !o->quiet) {
      fmt_rate(rate, sizeof rate,
               (double)(n * o->batch * t->nranks * t->per_sample) / (progress_now() - t0));
      result_text(t, result, sizeof result);
      char scale[40] = ""; /* only where the loss is scaled (f16, or a scaler asked for) */
      if (scales_loss(t)) snprintf(scale, sizeof scale, "  scale %g", (double)res.scale);
      snprintf(figures, sizeof figures, "loss %.4f%s  %s %s/s%s%s", loss, scale, rate, t->unit,
               t->eval_step >= 0 ? "  " : "", t->eval_step >= 0 ? result : "");
      progress_update(&pr, (long)(t->st.step - epoch * spe), figures);
    }
  }
  if (rc || (!t->lead && !t->fsdp)) return rc; /* FSDP: every rank takes part in the gathers */
  double acc = t->accuracy;
  if (t->eval_step != t->st.step) rc = trainer_evaluate(t, &acc); /* the GPT's is done at the end */
  t->accuracy = acc;
  if (!rc && t->lead && !o->quiet) {
    fmt_rate(rate, sizeof rate,
             (double)(n * o->batch * t->nranks * t->per_sample) / (progress_now() - t0));
    result_text(t, result, sizeof result);
    snprintf(figures, sizeof figures, "%s  loss %.4f (mean %.4f)  %s %s/s", result, loss,
             n ? loss_sum / (double)n : 0.0, rate, t->unit); /* the result first: a narrow
                                                             * terminal cuts the end */
    progress_end(&pr, (long)(t->st.step - epoch * spe), figures);
  }
  t->evaluated = true;
  if (!rc && o->save)
    rc = t->fsdp ? train_ckpt_save_fsdp(o->save, o, &t->model, t->fsdp, t->opt, &t->st)
                 : train_ckpt_save(o->save, o, &t->model, t->opt, loom_step_scaler(t->step),
                                   &t->st);
  return rc;
}

static void summary(trainer *t, double wall_s) {
  const train_opts *o = t->o;
  char desc[96], rate[32], peak[32], result[48];
  loom_pool_stats ps = {0};
  bool per_rank = t->nranks > 1 && loom_mem_account() > 0; /* ranks as threads: rank 0's own */
  if (per_rank) loom_mem_account_stats(loom_mem_account(), LOOM_POOL_COMPUTE, &ps);
  else loom_mem_stats(LOOM_POOL_COMPUTE, &ps);
  progress_bytes(peak, sizeof peak, ps.peak_bytes);
  char setup[80] = "";
  if (per_rank) {
    char b[32];
    progress_bytes(b, sizeof b, t->setup_peak);
    snprintf(setup, sizeof setup, " per rank (%s while building)", b);
  }
  fmt_rate(rate, sizeof rate,
           t->train_s > 0 ? (double)(t->samples * t->per_sample) / t->train_s : 0);
  train_model_describe(&t->model, o, desc, sizeof desc);
  result_text(t, result, sizeof result);
  fprintf(o->out,
          "loom train: %s, %s, amp %s: %s after %lld steps (%.2f epochs), "
          "%s %s/s, wall %.1f s, peak memory %s%s",
          desc, o->optim, o->amp, result, (long long)t->st.step,
          (double)t->st.step / (double)t->st.steps_per_epoch, rate, t->unit, wall_s, peak, setup);
  if (scales_loss(t)) fprintf(o->out, ", %lld overflow steps skipped", (long long)t->overflows);
  fputc('\n', o->out);
  if (t->fsdp) train_offload_summary(o, t->fsdp, o->out);
  fflush(o->out);
}

void trainer_teardown(trainer *t) {
  train_metrics_close(t->metrics);
  loom_step_free(t->step);
  loom_scaler_free(t->scaler);
  loom_optim_free(t->opt);
  free(t->segs);
  train_par_free(t->par);
  train_model_free(&t->model);
  loom_loader_free(t->loader);
  loom_loader_free(t->test_loader);
  loom_dataset_free(t->train);
  loom_dataset_free(t->test);
  loom_text_free(t->text);
}

int trainer_setup(trainer *t, loom_pg *pg) {
  const train_opts *o = t->o;
  loom_mem_set_tag(TRAIN_TAG_MODEL);
  /* FSDP and HSDP: built deferred, so that each rank only ever makes its shards (sharded
   * construction) */
  bool sharded = pg && (strcmp(o->strategy, "fsdp") == 0 || strcmp(o->strategy, "hsdp") == 0);
  bool was = loom_nn_set_deferred_init(sharded);
  int rc = train_model_create(o, &t->model);
  loom_nn_set_deferred_init(was);
  t->eval_step = -1;
  t->per_sample = t->model.gpt ? o->context : 1;
  t->unit = t->model.gpt ? "tokens" : "samples";
  loom_dtype forward = LOOM_F32; /* --amp off, bf16 or f16 */
  if (strcmp(o->amp, "off") != 0) loom_dtype_parse(o->amp, &forward);
  if (!rc && o->init && !t->dry && !sharded)
    rc = train_model_load(&t->model, o->init, forward, "--init", NULL);
  if (!rc) rc = train_par_create(pg, o, &t->model, &t->par);
  if (rc) return rc;
  t->fsdp = train_par_fsdp(t->par);
  if (o->init && !t->dry && sharded &&
      (rc = train_model_load(&t->model, o->init, forward, "--init", t->fsdp)))
    return rc;
  t->rank = train_par_rank(t->par), t->nranks = train_par_size(t->par);
  t->lead = t->rank == 0;
  if (!rc) rc = trainer_load_data(t);
  if (rc) return rc;
  t->total_steps = o->epochs * t->st.steps_per_epoch;
  t->stop_step = o->max_steps > 0 && o->max_steps < t->total_steps ? o->max_steps : t->total_steps;
  loom_mem_set_tag(TRAIN_TAG_OPTIM);
  rc = make_optimizer(t);
  loom_mem_set_tag(TRAIN_TAG_MODEL);
  if (!rc) rc = make_scaler(t);
  if (!rc) rc = make_step(t);
  if (!rc && loom_autocast_mode_parse(o->amp, &t->amp))
    rc = train_fail(LOOM_EINVAL, "--amp: unknown mode '%s'", o->amp);
  if (!rc && o->resume && !t->dry)
    rc = t->fsdp ? train_ckpt_load_fsdp(o->resume, o, &t->model, t->fsdp, t->opt, &t->st)
                 : train_ckpt_load(o->resume, o, &t->model, t->opt, loom_step_scaler(t->step),
                                   &t->st);
  if (!rc) rc = train_par_check_start(t->par, t->st.steps_per_epoch, t->st.step);
  if (!rc && t->lead && o->metrics && !t->dry) rc = train_metrics_open(o->metrics, o->resume != NULL, &t->metrics);
  loom_mem_set_tag(TRAIN_TAG_OTHER);
  return rc;
}

/* The units' names, "layers.0, layers.2" (the root unit, whose name is "", as "(root)"), up
 * to cap bytes ("..." ends a list cut short). */
static void unit_names(loom_fsdp *f, size_t n, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  for (size_t u = 0; u < n; u++) {
    loom_fsdp_unit_info info;
    if (loom_fsdp_unit_info_get(f, u, &info)) break;
    const char *name = *info.name ? info.name : "(root)";
    if (len + strlen(name) + 8 > cap) {
      snprintf(buf + len, cap - len, "%s...", u ? ", " : "");
      return;
    }
    len += (size_t)snprintf(buf + len, cap - len, "%s%s", u ? ", " : "", name);
  }
}

/* What FSDP made of the model, on one line. */
static void fsdp_header(const trainer *t) {
  loom_fsdp_stats s;
  loom_fsdp_stats_get(t->fsdp, &s);
  char shard[32], offload[160], names[160];
  unit_names(t->fsdp, s.units, names, sizeof names);
  progress_bytes(shard, sizeof shard, s.shard_numel * sizeof(float));
  train_offload_describe(t->o, offload, sizeof offload);
  loom_fsdp_mp *mp = loom_fsdp_mp_manager(t->fsdp);
  const loom_fsdp_mp_cfg *mc = mp ? loom_fsdp_mp_config(mp) : NULL;
  char what[96] = "fsdp:";
  if (strcmp(t->o->strategy, "hsdp") == 0)
    snprintf(what, sizeof what, "hsdp: %d copies, each sharded over %ld ranks,",
             t->nranks / (int)t->o->shard_size, t->o->shard_size);
  fprintf(t->o->out, "loom train: %s %zu unit%s (--wrap %s: %s), %zu elements per rank (%s of "
          "f32 shards), reshard after forward %s, gather prefetch %ld, forward in %s%s%s\n",
          what, s.units, s.units == 1 ? "" : "s", t->o->wrap, names, s.shard_numel, shard, t->o->reshard, t->o->gather_prefetch,
          mc ? loom_dtype_name(mc->forward_dtype) : "f32",
          !mc ? "" : mc->use_loss_scaling ? " with loss scaling" : " without loss scaling",
          offload);
}

int train_run(const train_opts *o, loom_pg *pg) {
  double t0 = progress_now();
  trainer t;
  memset(&t, 0, sizeof t);
  t.o = o;
  int rc = o->threads > 0 ? loom_set_num_threads((int)o->threads) : LOOM_OK;
  if (rc) return train_fail_loom(rc, "--threads");
  /* this run's peaks, not an earlier one's in the same process: the process's pools with one
   * rank (with ranks as threads, cmd_train.c resets them before the ranks start), and the
   * rank's own account */
  for (int p = 0; p < LOOM_POOL_COUNT; p++) {
    if (!pg) loom_mem_reset_peak((loom_pool)p);
    if (loom_mem_account() > 0) loom_mem_account_reset_peak(loom_mem_account(), (loom_pool)p);
  }
  rc = trainer_setup(&t, pg);
  if (!rc && t.nranks > 1 && loom_mem_account() > 0) { /* the training peak, apart */
    loom_pool_stats ps = {0};
    loom_mem_account_stats(loom_mem_account(), LOOM_POOL_COMPUTE, &ps);
    t.setup_peak = ps.peak_bytes;
    loom_mem_account_reset_peak(loom_mem_account(), LOOM_POOL_COMPUTE);
  }
  if (!rc && t.lead && !o->quiet) {
    char desc[96];
    train_model_describe(&t.model, o, desc, sizeof desc);
    loom_dtype amp_dt = LOOM_F32;
    if (strcmp(o->amp, "off") != 0) loom_dtype_parse(o->amp, &amp_dt);
    fprintf(o->out, "loom train: %s (%zu parameters), %s lr %g, batch %ld x %d rank%s, amp %s%s%s%s, "
            "%lld steps per epoch%s\n",
            desc, loom_module_numel(t.model.root), o->optim, o->lr, o->batch, t.nranks,
            t.nranks > 1 ? "s" : "", o->amp,
            loom_ops_native_dtype(amp_dt) ? "" : " (products in f32 on this CPU)",
            scales_loss(&t) ? ", scaler " : "", scales_loss(&t) ? o->scaler : "",
            (long long)t.st.steps_per_epoch, o->resume ? ", resumed" : "");
    if (t.fsdp) fsdp_header(&t);
    if (o->resume)
      fprintf(o->out, "loom train: resuming at step %lld (epoch %lld, batch %lld)\n",
              (long long)t.st.step, (long long)(t.st.step / t.st.steps_per_epoch) + 1,
              (long long)(t.st.step % t.st.steps_per_epoch));
    if (o->resume && t.st.from_ranks)
      fprintf(o->out, "loom train: the checkpoint was written by %lld rank%s x batch %lld; "
              "this run has %d rank%s x batch %ld, the same global batch of %lld\n",
              (long long)t.st.from_ranks, t.st.from_ranks > 1 ? "s" : "",
              (long long)t.st.from_batch, t.nranks, t.nranks > 1 ? "s" : "", o->batch,
              (long long)(t.st.from_ranks * t.st.from_batch));
    fflush(o->out); /* before any failure message on stderr, also under a pipe */
  }
  if (!rc && t.lead && o->resume && t.st.model_step >= 0 && t.st.model_step != t.st.step)
    fprintf(stderr, "loom train: note: %s/model.safetensors holds step %lld but the checkpoint "
            "step %lld (a save was interrupted between the two files); resuming from the "
            "checkpoint\n", o->resume, (long long)t.st.model_step, (long long)t.st.step);
  while (!rc && t.st.step < t.stop_step) {
    rc = run_epoch(&t);
  }
  if (!rc && (t.lead || t.fsdp) && !t.evaluated) rc = trainer_evaluate(&t, &t.accuracy); /* nothing left to run */
  if (!rc && t.lead) summary(&t, progress_now() - t0);
  if (t.metrics) {
    int rc2 = train_metrics_close(t.metrics);
    t.metrics = NULL;
    if (!rc) rc = rc2;
  }
  trainer_teardown(&t);
  return rc;
}
