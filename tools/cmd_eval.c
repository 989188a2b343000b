/* cmd_eval.c: `loom eval`: the test accuracy (overall and per class) of an image classifier
 * that `loom train --save DIR` wrote, from DIR/model.safetensors alone: the model's shape, the
 * input normalisation and the evaluation's autocast come from the file's metadata
 * (train_model_meta_image), the weights by name through the trainer's strict loader, and the
 * evaluation is the trainer's own (trainer_evaluate), so it prints the accuracy the run printed
 * on the same test images (--limit N: the run's --limit).
 * Exit codes: 0 done, 1 a failure at run time (the file, the data), 2 bad usage. */
#include "cli.h"
#include "commands.h"
#include "trainer.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

static const char usage[] = "--from DIR [--data DIR] [OPTIONS]\n\n"
    "Measure the test accuracy, overall and per class, of a model `loom train --save DIR`\n"
    "wrote (DIR/model.safetensors, or the file itself): its shape and input normalisation come\n"
    "from the file. Examples:\n"
    "  loom eval --from ck                  # on Fashion-MNIST's 10000 test images\n"
    "  loom eval --from ck --limit 512      # the first 512, as a run with --limit 512 did";

typedef struct eval_opts {
  const char *from, *data, *amp;
  long limit, eval_batch, threads;
} eval_opts;

/* Fashion-MNIST's class names, for the default data. */
static const char *const fashion[LOOM_MNIST_CLASSES] = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

/* The model file: --from names the file or the folder holding model.safetensors. */
static void model_path(const char *from, char *buf, size_t cap) {
  struct stat st;
  if (stat(from, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(buf, cap, "%s/model.safetensors", from);
  else snprintf(buf, cap, "%s", from);
}

static int evaluate(const eval_opts *e, train_opts *o) {
  char path[4200];
  model_path(e->from, path, sizeof path);
  loom_safetensors *f = NULL;
  float mean = 0, std = 1;
  int64_t step = -1, epoch = -1;
  if (access(path, F_OK) != 0)
    return strcmp(path, e->from) != 0
               ? train_fail(LOOM_ENOTFOUND, "--from %s: no %s (`loom train --save DIR` writes "
                            "one)", e->from, path)
               : train_fail(LOOM_ENOTFOUND, "--from %s: no such file or folder (give the "
                            "folder `loom train --save DIR` wrote)", e->from);
  int rc = loom_safetensors_open(path, 0, &f);
  if (rc) return train_fail_loom(rc, "--from");
  rc = train_model_meta_image(f, path, o, &mean, &std);
  if (loom_safetensors_meta_i64(f, "step", &step)) step = -1;
  if (loom_safetensors_meta_i64(f, "epoch", &epoch)) epoch = -1;
  loom_safetensors_free(f);
  if (rc) return rc;
  if (e->amp) o->amp = e->amp;
  trainer t;
  memset(&t, 0, sizeof t);
  t.o = o;
  size_t hit[LOOM_MNIST_CLASSES] = {0}, seen[LOOM_MNIST_CLASSES] = {0};
  t.class_hit = hit;
  t.class_seen = seen;
  if (loom_autocast_mode_parse(o->amp, &t.amp)) return train_fail(LOOM_EINVAL, "--amp %s", o->amp);
  rc = train_model_create(o, &t.model);
  loom_dtype fwd = t.amp == LOOM_AUTOCAST_OFF ? LOOM_F32
                   : strcmp(o->amp, "f16") == 0 ? LOOM_F16 : LOOM_BF16;
  if (!rc) rc = train_model_load(&t.model, path, fwd, "--from", NULL);
  char what[4200];
  snprintf(what, sizeof what, "loading the test data from %s%s",
           o->data ? o->data : LOOM_FASHION_MNIST_DIR, o->data ? "" : " (--data DIR names another folder)");
  if (!rc && (rc = loom_mnist_load(o->data, LOOM_SPLIT_TEST, &t.test))) train_fail_loom(rc, what);
  if (!rc && (rc = loom_dataset_check(t.test, LOOM_MNIST_CLASSES, LOOM_MNIST_SIDE, LOOM_MNIST_SIDE)))
    train_fail_loom(rc, what);
  if (!rc) {
    loom_loader_cfg c = loom_loader_cfg_default();
    c.batch = (size_t)o->eval_batch;
    c.shuffle = false;
    c.drop_last = false;
    c.norm = LOOM_NORM_STANDARD;
    c.mean = mean;
    c.std = std;
    c.flatten = train_model_flat_input(&t.model);
    if ((rc = loom_loader_create(t.test, &c, &t.test_loader))) train_fail_loom(rc, "the test data");
  }
  double acc = 0;
  if (!rc) {
    t.test_n = loom_dataset_size(t.test);
    if (o->limit > 0 && (size_t)o->limit < t.test_n) t.test_n = (size_t)o->limit;
    rc = trainer_evaluate(&t, &acc);
  }
  if (!rc) {
    char desc[96];
    train_model_describe(&t.model, o, desc, sizeof desc);
    printf("loom eval: %s from %s", desc, path);
    if (step >= 0) printf(" (step %lld, epoch %lld)", (long long)step, (long long)epoch);
    printf(", input (x / 255 - %g) / %g, amp %s\n", (double)mean, (double)std, o->amp);
    printf("  %5s %-12s %s\n", "class", o->data ? "" : "name", "accuracy");
    for (int k = 0; k < LOOM_MNIST_CLASSES; k++)
      if (seen[k])
        printf("  %5d %-12s %6.2f%%  (%zu of %zu)\n", k, o->data ? "" : fashion[k],
               100.0 * (double)hit[k] / (double)seen[k], hit[k], seen[k]);
    size_t right = 0;
    for (int k = 0; k < LOOM_MNIST_CLASSES; k++) right += hit[k];
    printf("loom eval: test accuracy %.2f%% (%zu of %zu test images)\n", acc, right, t.test_n);
  }
  loom_loader_free(t.test_loader);
  loom_dataset_free(t.test);
  train_model_free(&t.model);
  return rc;
}

int cmd_eval(int argc, char **argv) {
  eval_opts e = {.eval_batch = 1000};
  const cli_option table[] = {
      {"from", CLI_STRING, &e.from, "DIR", "the folder of a `loom train --save DIR` run (its model.safetensors), or a model file", NULL, 0, 0, NULL, 0},
      {"data", CLI_STRING, &e.data, "DIR", "MNIST-format dataset folder whose test set is used (default " LOOM_FASHION_MNIST_DIR ")", NULL, 0, 0, NULL, 0},
      {"limit", CLI_INT, &e.limit, "N", "only the first N test images (a run with --limit N evaluated those); 0: all", NULL, 0, 4294967296.0, NULL, 0},
      {"amp", CLI_CHOICE, &e.amp, NULL, "the forward's autocast (default: the run's, from the file)", "off|bf16|f16", 0, 0, NULL, 0},
      {"eval-batch", CLI_POS_INT, &e.eval_batch, "N", "images per forward", NULL, 1, 1 << 24, NULL, 0},
      {"threads", CLI_INT, &e.threads, "N", "compute threads; 0: OpenMP's default", NULL, 0, 1024, NULL, 0},
      {0}};
  int rc = cli_parse("loom eval", table, argc, argv, NULL, 0, NULL);
  if (rc == 1) {
    cli_help(stdout, "loom eval", usage, table);
    return 0;
  }
  if (rc < 0) return 2;
  if (!e.from) {
    fprintf(stderr, "loom eval: --from DIR is needed: the folder a `loom train --save DIR` run "
            "wrote (or its model.safetensors)\n");
    return 2;
  }
  train_opts o = {.data = e.data, .limit = e.limit, .eval_batch = e.eval_batch, .amp = "off"};
  rc = e.threads > 0 ? loom_set_num_threads((int)e.threads) : LOOM_OK;
  if (rc) train_fail_loom(rc, "--threads");
  else rc = evaluate(&e, &o);
  if (!rc) return 0;
  fflush(stdout);
  fprintf(stderr, "loom eval: %s\n", train_last_error());
  return 1;
}
