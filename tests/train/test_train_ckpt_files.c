/* test_train_ckpt_files.c: the two files of `--save DIR` after crashes: temporaries a killed
 * save left (`checkpoint.safetensors.tmp.XXXXXX`, `model.safetensors.tmp.XXXXXX`) are removed
 * by the next save and nothing else is; model.safetensors records its step and is written
 * before the checkpoint, so the checkpoint is never ahead of it; and a resume whose model
 * file holds another step than the checkpoint says so. */
#include "lt.h"
#include "train_test.h"

#include <loom/loom.h>

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define RUN "--hidden 16 --limit 512 --batch 64 --epochs 2 --threads 1 --quiet" /* 8 steps/epoch */

static void touch(const char *dir, const char *name) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  LT_EQ(tt_write_file(p, "stale", 5), 0);
}

static bool exists(const char *dir, const char *name) {
  char p[512];
  struct stat st;
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return stat(p, &st) == 0;
}

/* The metadata "step" of dir/name, or -1. */
static long long step_of(const char *dir, const char *name) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  loom_safetensors *f = NULL;
  int64_t step = -1;
  if (loom_safetensors_open(p, 0, &f) || loom_safetensors_meta_i64(f, "step", &step)) step = -1;
  loom_safetensors_free(f);
  return (long long)step;
}

LT_TEST(train_save_removes_stale_temporaries_of_its_files_only) {
  const char *d = tt_tempdir();
  const char *gone[] = {"checkpoint.safetensors.tmp.Ab12Cd", "model.safetensors.tmp.zZ9yY8"};
  const char *kept[] = {"checkpoint.safetensors.tmp.Ab12C", "notes.tmp.Ab12Cd",
                        "model.safetensors.tmp.zZ9yY8.bak"};
  for (int i = 0; i < 2; i++) touch(d, gone[i]);
  for (int i = 0; i < 3; i++) touch(d, kept[i]);
  tt_run r = tt_train(RUN " --max-steps 2 --save %s", d);
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
  for (int i = 0; i < 2; i++) LT_TRUE(!exists(d, gone[i]));
  for (int i = 0; i < 3; i++) LT_TRUE(exists(d, kept[i]));
  LT_TRUE(exists(d, "checkpoint.safetensors") && exists(d, "model.safetensors"));
  tt_cleanup();
}

LT_TEST(train_model_file_is_written_first_and_records_its_step) {
  const char *a = tt_tempdir(), *b = tt_tempdir(), *c = tt_tempdir();
  tt_run r = tt_train(RUN " --max-steps 8 --save %s", a);
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
  LT_EQ(step_of(a, "model.safetensors"), 8);
  LT_EQ(step_of(a, "checkpoint.safetensors"), 8);
  /* the checkpoint cannot be written (a folder of its name): the model file already is */
  char p[512];
  snprintf(p, sizeof p, "%s/checkpoint.safetensors", c);
  LT_EQ(mkdir(p, 0700), 0);
  r = tt_train(RUN " --max-steps 8 --save %s", c);
  LT_EQ(r.rc, 1);
  LT_TRUE(strstr(r.err, "checkpoint.safetensors") != NULL);
  tt_run_free(&r);
  LT_EQ(step_of(c, "model.safetensors"), 8);
  rmdir(p);
  /* a kill between the two renames leaves the model file ahead: the resume says so */
  r = tt_train(RUN " --save %s", b);
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
  char from[512], to[512];
  snprintf(from, sizeof from, "%s/model.safetensors", b);
  snprintf(to, sizeof to, "%s/model.safetensors", a);
  LT_EQ(tt_copy_file(from, to), 0);
  r = tt_train(RUN " --max-steps 9 --resume %s", a);
  LT_EQ(r.rc, 0);
  LT_TRUE(strstr(r.err, "model.safetensors holds step 16 but the checkpoint step 8") != NULL);
  if (!strstr(r.err, "holds step 16")) fprintf(stderr, "stderr: %s\n", r.err);
  tt_run_free(&r);
  /* when they agree, nothing is said */
  r = tt_train(RUN " --max-steps 17 --resume %s", b);
  LT_EQ(r.rc, 0);
  LT_TRUE(strstr(r.err, "holds step") == NULL);
  tt_run_free(&r);
  tt_cleanup();
}
