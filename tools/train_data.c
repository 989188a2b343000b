/* train_data.c: the data of a `loom train` run: Fashion-MNIST's images through the loader, the
 * GPT's text and its windows, or, in a dry run, no file at all and batches of zeros of the same
 * shapes; and the epoch's steps and the evaluation's size that follow from them. */
#include "trainer.h"

#include <string.h>

/* The GPT's steps per epoch: --limit windows, else as many windows as the training text has
 * whole contexts (its tokens once), in whole global batches, at least one. */
static int64_t text_steps(const trainer *t, size_t train_bytes) {
  const train_opts *o = t->o;
  int64_t g = o->batch * t->nranks;
  int64_t windows = o->limit > 0 ? o->limit : (int64_t)(train_bytes / (size_t)o->context);
  return windows / g > 0 ? windows / g : 1;
}

/* The GPT's validation windows an evaluation takes: --eval-windows (0: all the text holds),
 * at most --limit, at most the text's. */
static size_t text_val_count(const train_opts *o, size_t have) {
  size_t n = o->eval_windows > 0 && (size_t)o->eval_windows < have ? (size_t)o->eval_windows
                                                                     : have;
  return o->limit > 0 && (size_t)o->limit < n ? (size_t)o->limit : n;
}

/* A dry run's data: no file is read; an epoch of --limit samples (else Fashion-MNIST's 60000
 * and 10000; the GPT's: a nominal 1 MB of training text, --eval-windows or 128 windows),
 * batches made by dry_batch. */
static void dry_data(trainer *t) {
  const train_opts *o = t->o;
  if (t->model.gpt) {
    t->st.steps_per_epoch = text_steps(t, (size_t)1 << 20);
    t->test_n = text_val_count(o, o->eval_windows > 0 ? (size_t)o->eval_windows : 128);
    return;
  }
  int64_t g = o->batch * t->nranks, n = o->limit > 0 && o->limit < 60000 ? o->limit : 60000;
  t->st.steps_per_epoch = n / g > 0 ? n / g : 1;
  t->test_n = o->limit > 0 && o->limit < 10000 ? (size_t)o->limit : 10000;
}

/* What loom_loader_batch makes for `rows` samples: the images (flat for the MLP) and labels. */
int trainer_dry_batch(trainer *t, int64_t rows, loom_tensor **x, loom_tensor **y) {
  if (t->model.gpt) { /* token windows: i64 [rows, context], inputs and targets */
    int64_t tok[2] = {rows, t->o->context};
    int rc = loom_tensor_empty(LOOM_I64, 2, tok, x);
    if (!rc) rc = loom_tensor_empty(LOOM_I64, 2, tok, y);
    return rc;
  }
  int64_t flat[2] = {rows, LOOM_MNIST_SIDE * LOOM_MNIST_SIDE};
  int64_t img[4] = {rows, 1, LOOM_MNIST_SIDE, LOOM_MNIST_SIDE};
  int rc = train_model_flat_input(&t->model) ? loom_tensor_empty(LOOM_F32, 2, flat, x)
                                             : loom_tensor_empty(LOOM_F32, 4, img, x);
  if (!rc) rc = loom_tensor_empty(LOOM_I64, 1, &rows, y);
  return rc;
}

/* The GPT's text (--text FILE, else the fortunes), checked to hold a window in each split. */
static int load_text(trainer *t) {
  const train_opts *o = t->o;
  char what[4200];
  snprintf(what, sizeof what, "loading the text from %s%s", o->text ? o->text : LOOM_FORTUNES_DIR,
           o->text ? "" : " (--text FILE names another)");
  int rc;
  TRY(loom_text_load(o->text, &t->text), what);
  TRY(loom_text_check(t->text, (size_t)o->context), "--text");
  t->st.steps_per_epoch = text_steps(t, loom_text_size(t->text, LOOM_SPLIT_TRAIN));
  t->test_n = text_val_count(o, loom_text_val_windows(t->text, (size_t)o->context));
  return LOOM_OK;
}

int trainer_load_data(trainer *t) {
  const train_opts *o = t->o;
  if (t->dry) {
    dry_data(t);
    return LOOM_OK;
  }
  if (t->model.gpt) return load_text(t);
  const char *where = o->data ? o->data : LOOM_FASHION_MNIST_DIR;
  char what[4200];
  snprintf(what, sizeof what, "loading the data from %s%s", where,
           o->data ? "" : " (--data DIR names another folder)");
  int rc;
  TRY(loom_mnist_load(o->data, LOOM_SPLIT_TRAIN, &t->train), what);
  TRY(loom_mnist_load(o->data, LOOM_SPLIT_TEST, &t->test), what);
  TRY(loom_dataset_check(t->train, LOOM_MNIST_CLASSES, LOOM_MNIST_SIDE, LOOM_MNIST_SIDE), what);
  TRY(loom_dataset_check(t->test, LOOM_MNIST_CLASSES, LOOM_MNIST_SIDE, LOOM_MNIST_SIDE), what);
  loom_loader_cfg c = loom_loader_cfg_default();
  c.batch = (size_t)(o->batch * t->nranks);
  c.shuffle = o->shuffle;
  c.seed = (uint64_t)o->seed;
  c.drop_last = t->nranks > 1; /* every rank needs a full shard */
  c.norm = LOOM_NORM_STANDARD;
  c.flatten = train_model_flat_input(&t->model);
  TRY(loom_loader_create(t->train, &c, &t->loader), "the training data");
  c.batch = (size_t)o->eval_batch;
  c.shuffle = false;
  c.drop_last = false;
  TRY(loom_loader_create(t->test, &c, &t->test_loader), "the test data");
  int64_t spe = (int64_t)loom_loader_batches(t->loader), g = o->batch * t->nranks;
  size_t n = loom_dataset_size(t->train);
  if (o->limit > 0 && (size_t)o->limit < n) n = (size_t)o->limit;
  if ((size_t)g > n) /* one step would see fewer samples than it counts */
    return train_fail(LOOM_EINVAL, "--batch %ld%s is more than the %zu training samples per epoch",
                      o->batch, t->nranks > 1 ? " x the ranks" : "", n);
  if (o->limit > 0 && (o->limit + g - 1) / g < spe) spe = (o->limit + g - 1) / g;
  t->st.steps_per_epoch = spe;
  t->test_n = loom_dataset_size(t->test);
  if (o->limit > 0 && (size_t)o->limit < t->test_n) t->test_n = (size_t)o->limit;
  return LOOM_OK;
}

