/* test_train_run_checks.c: what `loom train` checks once the data and the folders are known:
 * a batch larger than the samples of an epoch, a warmup longer than the run, the --save folder
 * before the first step (not after the first epoch), a checkpoint of another run in it (kept
 * unless --overwrite), a loss that stops being finite (the run stops, the last checkpoint
 * stays; with loss scaling its step is an overflow, skipped), folder names joined with one
 * slash, and more compute threads than CPUs warned once. */
#include "lt.h"
#include "train_test.h"

#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#define RUN "--hidden 16 --limit 512 --batch 64 --epochs 1 --threads 1 --quiet" /* 8 steps */

static void expect(tt_run *r, int rc, const char *want) {
  if (r->rc != rc || !strstr(r->err, want))
    fprintf(stderr, "rc %d (want %d), stdout \"%s\", stderr \"%s\" (want \"%s\")\n", r->rc, rc,
            r->out, r->err, want);
  LT_EQ(r->rc, rc);
  LT_TRUE(strstr(r->err, want) != NULL);
  tt_run_free(r);
}

LT_TEST(train_batch_above_the_samples_of_an_epoch_is_refused) {
  tt_run r = tt_train("--hidden 16 --batch 600000 --limit 512 --epochs 1 --threads 1");
  expect(&r, 2, "--batch: 600000 samples per step is more than the 512 samples per epoch of --limit 512");
  r = tt_train("--hidden 16 --batch 300 --ranks 2 --strategy ddp --limit 512");
  expect(&r, 2, "--batch: 600 samples per step (all ranks) is more than the 512 samples");
  r = tt_train("--hidden 16 --batch 60001 --epochs 1 --threads 1 --quiet");
  expect(&r, 1, "--batch 60001 is more than the 60000 training samples per epoch");
  r = tt_train("--hidden 16 --batch 512 --limit 512 --epochs 1 --threads 1 --quiet");
  LT_EQ(r.rc, 0);
  LT_TRUE(strstr(r.out, "after 1 steps") != NULL);
  tt_run_free(&r);
}

LT_TEST(train_warmup_longer_than_the_run_is_refused) {
  tt_run r = tt_train(RUN " --warmup 9");
  expect(&r, 1, "--warmup 9 is more than the 8 steps of the run");
  r = tt_train(RUN " --warmup 8 --max-steps 1");
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
}

/* Whether folder d holds a file whose name starts with prefix. */
static int holds(const char *d, const char *prefix) {
  DIR *dir = opendir(d);
  struct dirent *e;
  int found = 0;
  while (dir && (e = readdir(dir)))
    found |= strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  if (dir) closedir(dir);
  return found;
}

LT_TEST(train_save_folder_is_checked_before_the_first_step) {
  const char *d = tt_tempdir();
  char file[512], sub[600];
  snprintf(file, sizeof file, "%s/file", d);
  LT_EQ(tt_write_file(file, "x", 1), 0);
  snprintf(sub, sizeof sub, "%s/sub", file);
  tt_run r = tt_train("--hidden 16 --limit 512 --batch 64 --epochs 1 --threads 1 --save %s", sub);
  LT_TRUE(strstr(r.out, "loom train: mlp") == NULL); /* refused before the run's header */
  expect(&r, 1, "/file/sub: cannot create the folder: Not a directory");
  r = tt_train(RUN " --save %s", file);
  expect(&r, 1, "/file: not a folder");
  /* a new folder is made at the start; the probe written into it is gone */
  snprintf(sub, sizeof sub, "%s/new", d);
  r = tt_train(RUN " --max-steps 1 --save %s", sub);
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
  LT_TRUE(holds(sub, "checkpoint.safetensors") && !holds(sub, ".loom"));
  tt_cleanup();
}

/* A run of RUN + extra that saves into d; ck: its checkpoint, before: a copy of it in e. */
static void save_and_copy(const char *extra, const char *d, const char *e, char ck[512],
                          char before[512]) {
  snprintf(ck, 512, "%s/checkpoint.safetensors", d);
  snprintf(before, 512, "%s/before", e);
  tt_run r = tt_train(RUN " %s --save %s", extra, d);
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
  size_t n = 0;
  char *bytes = tt_read_file(ck, &n);
  LT_TRUE(bytes != NULL);
  LT_EQ(tt_write_file(before, bytes, n), 0);
  free(bytes);
}

LT_TEST(train_existing_checkpoint_needs_overwrite_or_resume) {
  const char *d = tt_tempdir(), *e = tt_tempdir();
  char ck[512], before[512];
  save_and_copy("--max-steps 2", d, e, ck, before);
  tt_run r = tt_train(RUN " --save %s", d);
  expect(&r, 2, "holds checkpoint.safetensors of another run: give --overwrite to replace it");
  LT_TRUE(tt_same_file(ck, before)); /* untouched */
  r = tt_train(RUN " --max-steps 4 --resume %s --save %s", d, d); /* continuing it: fine */
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
  r = tt_train(RUN " --max-steps 1 --save %s --overwrite", d);
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
  /* a model file alone is another run's too */
  char model[512];
  snprintf(model, sizeof model, "%s/model.safetensors", e);
  LT_EQ(tt_write_file(model, "x", 1), 0);
  r = tt_train(RUN " --save %s", e);
  expect(&r, 2, "holds model.safetensors of another run");
  tt_cleanup();
}

LT_TEST(train_nonfinite_loss_stops_the_run_and_keeps_the_checkpoint) {
  const char *d = tt_tempdir(), *e = tt_tempdir();
  char ck[512], before[512];
  save_and_copy("--optim sgd", d, e, ck, before);
  /* lr 1e30 is finite in f32, and the weights blow up after one step */
  tt_run r = tt_train(RUN " --optim sgd --lr 1e30 --save %s --overwrite", d);
  LT_TRUE(strstr(r.out, "test accuracy") == NULL);
  expect(&r, 1, "training diverged (too high a --lr?); stopped before the update, no checkpoint");
  LT_TRUE(tt_same_file(ck, before));
  /* the same over two ranks: every rank stops at the same step, under DDP and FSDP */
  r = tt_train(RUN " --optim sgd --lr 1e30 --batch 32 --ranks 2 --strategy ddp");
  expect(&r, 1, "training diverged");
  r = tt_train(RUN " --optim sgd --lr 1e30 --batch 32 --ranks 2 --strategy fsdp");
  expect(&r, 1, "stopped before the update");
  /* with loss scaling a non-finite loss is an overflow step: skipped, and the run goes on */
  const char *scaled[] = {"", " --ranks 2 --strategy ddp", " --ranks 2 --strategy fsdp"};
  for (int i = 0; i < 3; i++) {
    r = tt_train(RUN " --optim sgd --lr 1e30 --batch 32 --amp f16%s", scaled[i]);
    if (r.rc != 0) fprintf(stderr, "%s: %s\n", scaled[i], r.err);
    LT_EQ(r.rc, 0);
    LT_TRUE(strstr(r.out, "overflow steps skipped") != NULL);
    tt_run_free(&r);
  }
  tt_cleanup();
}

LT_TEST(train_folder_names_are_joined_with_one_slash) {
  const char *d = tt_tempdir();
  char want[512];
  snprintf(want, sizeof want, "%s/checkpoint.safetensors", d);
  tt_run r = tt_train(RUN " --resume %s//", d);
  LT_TRUE(strstr(r.err, "//") == NULL);
  expect(&r, 1, want);
  r = tt_train(RUN " --max-steps 1 --save %s/", d);
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
  r = tt_train(RUN " --max-steps 2 --resume %s/ --save %s/", d, d);
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
  tt_cleanup();
}

/* Count of needle in s. */
static int occurrences(const char *s, const char *needle) {
  int n = 0;
  for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

/* More compute threads than online CPUs (--ranks x --threads) is warned once, with the
 * figures, and the run goes on; as many as the CPUs is not. */
LT_TEST(train_oversubscription_is_warned_once) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  tt_run r = tt_train("--hidden 16 --limit 512 --batch 64 --max-steps 1 --quiet --ranks 2 "
                      "--strategy ddp --threads %ld", cpus);
  char want[160];
  snprintf(want, sizeof want, "loom train: warning: --ranks 2 x --threads %ld = %ld compute "
           "threads on %ld online CPUs", cpus, 2 * cpus, cpus);
  LT_TRUE(tt_ended(&r, 0, want, "--ranks 2"));
  LT_EQ(occurrences(r.err, "warning"), 1);
  tt_run_free(&r);
  r = tt_train("--hidden 16 --limit 512 --batch 64 --max-steps 1 --quiet --ranks %ld "
               "--strategy ddp --threads 0", cpus + 1);
  snprintf(want, sizeof want, "loom train: warning: --ranks %ld, a compute thread each at "
           "least, on %ld online CPUs", cpus + 1, cpus);
  LT_TRUE(tt_ended(&r, 0, want, "--threads 0"));
  LT_EQ(occurrences(r.err, "warning"), 1);
  tt_run_free(&r);
  r = tt_train(RUN); /* one rank, one thread */
  LT_EQ(r.rc, 0);
  LT_TRUE(strstr(r.err, "warning") == NULL);
  tt_run_free(&r);
}
