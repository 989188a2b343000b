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
  tt_run r = tt_train("--hidden 16 " DATA " --epochs 1 --max-steps 2 --save %s", d);
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
  r = tt_train("--hidden 16 " DATA " --epochs 1 --optim sgd --resume %s", d);
  LT_EQ(r.rc, 1);
  LT_TRUE(strstr(r.err, "--optim adamw") && strstr(r.err, "this run has sgd"));
  tt_run_free(&r);
  /* numbers as the user wrote them (not 0.90000000000000002), the shuffle flag by its name */
  static const char *const other[][2] = {
      {"--weight-decay 0.09", "--weight-decay 0.01, this run has 0.09"},
      {"--no-shuffle", "written with shuffled batches (no --no-shuffle), this run has --no-shuffle"}};
  for (int i = 0; i < 2; i++) {
    r = tt_train("--hidden 16 " DATA " --epochs 1 %s --resume %s", other[i][0], d);
    LT_EQ(r.rc, 1);
    LT_TRUE(strstr(r.err, other[i][1]));
    tt_run_free(&r);
  }
  r = tt_train("--hidden 17 " DATA " --epochs 1 --resume %s", d);
  LT_EQ(r.rc, 1);
  LT_TRUE(strstr(r.err, "--model (and its sizes) mlp 784-16-10"));
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
