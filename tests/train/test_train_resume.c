/* test_train_resume.c: an interrupted run (--max-steps) resumed with --resume ends with the
 * same parameters and optimizer/scaler state, byte for byte, as one uninterrupted run: MLP with
 * AdamW under f16 autocast and dynamic scaling, SGD with momentum under bf16 with a static scaler, and the CNN; and a
 * resume with other options is refused naming the option. */
#include "lt.h"
#include "train_test.h"

#include <stdlib.h>

#define DATA "--limit 512 --batch 64 --threads 1 --quiet"

/* Straight through, then interrupted at `cut` and resumed; the two end states must match. */
static void check_resume(const char *opts, int cut) {
  const char *a = tt_tempdir(), *b = tt_tempdir();
  tt_run r = tt_train("%s " DATA " --save %s", opts, a);
  LT_EQ(r.rc, 0);
  if (r.rc) fprintf(stderr, "%s", r.err);
  tt_run_free(&r);
  r = tt_train("%s " DATA " --max-steps %d --save %s", opts, cut, b);
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
  char pa[512], pb[512];
  snprintf(pa, sizeof pa, "%s/model.safetensors", a);
  snprintf(pb, sizeof pb, "%s/model.safetensors", b);
  LT_TRUE(!tt_same_file(pa, pb)); /* the interrupted run really stopped early */
  r = tt_train("%s " DATA " --resume %s --save %s", opts, b, b);
  LT_EQ(r.rc, 0);
  LT_TRUE(strstr(r.out, "after 16 steps") != NULL);
  tt_run_free(&r);
  LT_TRUE(tt_same_file(pa, pb));
  snprintf(pa, sizeof pa, "%s/checkpoint.safetensors", a);
  snprintf(pb, sizeof pb, "%s/checkpoint.safetensors", b);
  LT_TRUE(tt_same_file(pa, pb)); /* optimizer moments, scaler, step too */
  tt_cleanup();
}

/* 512 samples / 64 = 8 steps per epoch; 2 epochs; cut mid-epoch and on an epoch boundary. */
LT_TEST(train_resume_mlp_adamw_f16_bitwise) {
  check_resume("--hidden 48,32 --epochs 2 --amp f16 --loss-scale 1024", 5);
}

LT_TEST(train_resume_sgd_bf16_at_epoch_boundary_bitwise) {
  check_resume("--hidden 40 --epochs 2 --optim sgd --lr 0.05 --amp bf16 --scaler static --loss-scale 128 --schedule constant", 8);
}

LT_TEST(train_resume_cnn_bitwise) {
  check_resume("--model cnn --channels 4,8 --fc 16 --epochs 2 --optim adam --warmup 3", 11);
}

LT_TEST(train_resume_refuses_other_options) {
  const char *d = tt_tempdir();
  tt_run r = tt_train("--hidden 16 " DATA " --epochs 10 --weight-decay 1e-2 --max-steps 2 --save %s", d);
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
  /* a usage error naming the option, with the recorded value as the user wrote it */
  static const char *const other[][2] = {
      {"--optim sgd", "--optim sgd: the run in "},
      {"--optim sgd", "trained with --optim adamw (the default)"},
      {"--weight-decay 0.09", "--weight-decay 0.09: the run in"},
      {"--weight-decay 0.09", "trained with --weight-decay 1e-2 "},
      {"--hidden 17", "trained with --hidden 16 "},
      {"--no-shuffle", "trained without --no-shuffle"},
      {"--lr 0.002 --epochs 12", "drop --lr to continue it"}};
  for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
    r = tt_train("%s --resume %s", other[i][0], d);
    LT_TRUE(tt_ended(&r, 2, other[i][1], other[i][0]));
    LT_TRUE(!strstr(r.err, "e+0")); /* 10 is never 1e+01 */
    tt_run_free(&r);
  }
  /* the same values again, or only those that may change: accepted */
  r = tt_train("--hidden 16 " DATA " --epochs 10 --weight-decay 0.01 --threads 2 --max-steps 3 "
               "--resume %s", d);
  LT_TRUE(tt_ended(&r, 0, "", "the recorded values again"));
  tt_run_free(&r);
  r = tt_train("--hidden 16 " DATA " --epochs 1 --resume %s/nope", d);
  LT_EQ(r.rc, 1);
  LT_TRUE(strstr(r.err, "--resume") && strstr(r.err, "nope/checkpoint.safetensors"));
  tt_run_free(&r);
  /* a damaged checkpoint: the CRC catches it */
  char p[512];
  snprintf(p, sizeof p, "%s/checkpoint.safetensors", d);
  size_t n = 0;
  char *bytes = tt_read_file(p, &n);
  LT_TRUE(bytes && n > 100);
  if (bytes) {
    bytes[n - 3] ^= 0x40;
    LT_EQ(tt_write_file(p, bytes, n), 0);
    free(bytes);
  }
  r = tt_train("--hidden 16 " DATA " --epochs 1 --resume %s", d);
  LT_EQ(r.rc, 1);
  LT_TRUE(strstr(r.err, "--resume") && strstr(r.err, "CRC"));
  if (!strstr(r.err, "CRC")) fprintf(stderr, "stderr: %s\n", r.err);
  tt_run_free(&r);
  tt_cleanup();
}

/* Two files of two folders hold the same bytes. */
static int same_in(const char *a, const char *b, const char *file) {
  char pa[512], pb[512];
  snprintf(pa, sizeof pa, "%s/%s", a, file);
  snprintf(pb, sizeof pb, "%s/%s", b, file);
  return tt_same_file(pa, pb);
}

/* The checkpoint records the command line: `--resume DIR` alone continues the run (into DIR)
 * and ends as the uninterrupted run, byte for byte. */
LT_TEST(train_resume_alone_continues_bitwise) {
  const char *a = tt_tempdir(), *b = tt_tempdir();
  const char *opts = "--hidden 24 --epochs 2 --amp f16 --loss-scale 1024 --optim sgd "
                     "--lr 5e-2 --limit 512 --batch 64 --seed 7";
  tt_run r = tt_train("%s --threads 1 --quiet --save %s", opts, a);
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
  r = tt_train("%s --threads 1 --quiet --max-steps 6 --save %s", opts, b);
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
  LT_TRUE(!same_in(a, b, "model.safetensors"));
  r = tt_train("--resume %s", b);
  LT_TRUE(tt_ended(&r, 0, "", "--resume alone"));
  LT_TRUE(strstr(r.out, "resumed") && strstr(r.out, "after 16 steps"));
  tt_run_free(&r);
  LT_TRUE(same_in(a, b, "model.safetensors"));
  LT_TRUE(same_in(a, b, "checkpoint.safetensors"));
  tt_cleanup();
}

/* A finished run extended with a larger --epochs ends as the run given that --epochs from the
 * start (a schedule that does not depend on the total: warmup), checkpoint and all; under the
 * cosine schedule, which spans all the epochs, the extension says the rates change. */
LT_TEST(train_resume_extends_a_finished_run) {
  const char *a = tt_tempdir(), *b = tt_tempdir(), *c = tt_tempdir();
  const char *opts = "--hidden 20 --schedule warmup --warmup 3 " DATA;
  tt_run r = tt_train("%s --epochs 3 --save %s", opts, a);
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
  r = tt_train("%s --epochs 2 --save %s", opts, b);
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
  r = tt_train("--resume %s --epochs 3 --quiet", b);
  LT_TRUE(tt_ended(&r, 0, "", "--resume --epochs 3"));
  LT_TRUE(strstr(r.out, "after 24 steps") != NULL);
  LT_TRUE(!strstr(r.err, "cosine"));
  tt_run_free(&r);
  LT_TRUE(same_in(a, b, "model.safetensors"));
  LT_TRUE(same_in(a, b, "checkpoint.safetensors"));
  /* fewer epochs than the checkpoint's step: refused naming --epochs */
  r = tt_train("--resume %s --epochs 1", b);
  LT_TRUE(tt_ended(&r, 1, "--epochs 1", "--resume --epochs 1"));
  tt_run_free(&r);
  r = tt_train("--hidden 20 " DATA " --epochs 1 --save %s", c);
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
  r = tt_train("--resume %s --epochs 2", c);
  LT_TRUE(tt_ended(&r, 0, "the cosine schedule now spans 2 epochs instead of 1", "cosine"));
  tt_run_free(&r);
  tt_cleanup();
}
