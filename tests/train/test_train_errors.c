/* test_train_errors.c: every bad option gets a message naming it and exit code 2; a missing,
 * truncated or corrupt data file gets a message naming the file and exit code 1. */
#include "lt.h"
#include "train_test.h"

#include <stdlib.h>
#include <unistd.h>

LT_TEST(train_bad_options_name_the_option) {
  const struct { const char *args, *want; } cases[] = {
      {"--epochs 0", "--epochs: expected a positive integer, got '0'"},
      {"--epochs x", "--epochs: expected a positive integer, got 'x'"},
      {"--batch -3", "--batch: expected a positive integer"},
      {"--lr abc", "--lr: expected a number, got 'abc'"},
      {"--lr -1", "--lr: expected a number >= 0"},
      {"--model rnn", "--model: expected one of mlp|cnn|gpt, got 'rnn'"},
      {"--optim lamb", "--optim: expected one of sgd|adam|adamw, got 'lamb'"},
      {"--amp fp8", "--amp: expected one of off|bf16|f16, got 'fp8'"},
      {"--scaler auto", "--scaler: expected one of dynamic|static|off"},
      {"--schedule step", "--schedule: expected one of constant|warmup|cosine"},
      {"--hidden 0", "--hidden: expected up to 8 positive sizes"},
      {"--hidden 12,x", "--hidden: expected up to 8 positive sizes"},
      {"--hidden 1,2,3,4,5,6,7,8,9", "--hidden: expected up to 8"},
      {"--channels 3", "--channels: expected two sizes"},
      {"--fc 0", "--fc: expected a positive integer"},
      {"--threads -1", "--threads: expected an integer >= 0, got '-1'"},
      {"--limit -5", "--limit: expected an integer >= 0"},
      {"--max-steps -1", "--max-steps: expected an integer >= 0"},
      {"--warmup -2", "--warmup: expected an integer >= 0"},
      {"--weight-decay -0.1", "--weight-decay: expected a number >= 0"},
      {"--momentum -1", "--momentum: expected a number >= 0"},
      {"--loss-scale 0", "--loss-scale: expected a positive number"},
      {"--loss-scale 1e9", "--loss-scale: expected a number in [1, 2^24]"},
      {"--eval-batch 0", "--eval-batch: expected a positive integer"},
      {"--seed 1.5", "--seed: expected an integer, got '1.5'"},
      {"--no-shuffle=1", "--no-shuffle takes no value"},
      {"--save", "--save needs a value (DIR)"},
      {"--frobnicate 3", "unknown option --frobnicate"},
      {"extra", "unexpected argument 'extra'"},
      {"--ranks 0", "--ranks: expected a positive integer"},
      {"--backend tcp", "--backend: expected one of threads|mpi"},
      {"--strategy zero", "--strategy: expected one of none|ddp|fsdp"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tt_run r = tt_train("%s", cases[i].args);
    LT_EQ(r.rc, 2);
    LT_TRUE(strstr(r.err, cases[i].want) != NULL);
    if (r.rc != 2 || !strstr(r.err, cases[i].want))
      fprintf(stderr, "case '%s': rc %d, stderr \"%s\"\n", cases[i].args, r.rc, r.err);
    tt_run_free(&r);
  }
}

/* An IDX file: magic, dims, then `have` of the bytes the dims call for. */
static int write_idx(const char *dir, const char *name, int ndim, const uint32_t *dims,
                     size_t have) {
  size_t n = 1;
  for (int i = 0; i < ndim; i++) n *= dims[i];
  size_t hdr = 4 + 4 * (size_t)ndim;
  unsigned char *b = calloc(1, hdr + n);
  b[2] = 0x08, b[3] = (unsigned char)ndim;
  for (int i = 0; i < ndim; i++)
    for (int k = 0; k < 4; k++) b[4 + 4 * i + k] = (unsigned char)(dims[i] >> (24 - 8 * k));
  for (size_t i = 0; i < n; i++) b[hdr + i] = (unsigned char)(i % (ndim == 1 ? 10 : 251));
  char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  int rc = tt_write_file(p, b, hdr + (have < n ? have : n));
  free(b);
  return rc;
}

LT_TEST(train_bad_data_is_a_clear_error) {
  const char *d = tt_tempdir();
  /* missing folder */
  tt_run r = tt_train("--hidden 8 --data %s/none", d);
  LT_EQ(r.rc, 1);
  LT_TRUE(strstr(r.err, "loading the data from") && strstr(r.err, "/none"));
  tt_run_free(&r);
  /* a valid small dataset trains */
  const uint32_t img[3] = {64, 28, 28}, lab[1] = {64};
  LT_EQ(write_idx(d, "train-images-idx3-ubyte", 3, img, 64 * 784), 0);
  LT_EQ(write_idx(d, "train-labels-idx1-ubyte", 1, lab, 64), 0);
  LT_EQ(write_idx(d, "t10k-images-idx3-ubyte", 3, img, 64 * 784), 0);
  LT_EQ(write_idx(d, "t10k-labels-idx1-ubyte", 1, lab, 64), 0);
  r = tt_train("--hidden 8 --batch 16 --epochs 1 --threads 1 --quiet --data %s", d);
  LT_EQ(r.rc, 0);
  LT_TRUE(strstr(r.out, "after 4 steps"));
  if (r.rc) fprintf(stderr, "%s", r.err);
  tt_run_free(&r);
  /* truncated images */
  LT_EQ(write_idx(d, "train-images-idx3-ubyte", 3, img, 64 * 784 - 100), 0);
  r = tt_train("--hidden 8 --batch 16 --data %s", d);
  LT_EQ(r.rc, 1);
  LT_TRUE(strstr(r.err, "train-images-idx3-ubyte") && strstr(r.err, "need 50176 bytes of data but the file has 50076"));
  if (!strstr(r.err, "50076")) fprintf(stderr, "%s", r.err);
  tt_run_free(&r);
  /* labels that do not match the images */
  LT_EQ(write_idx(d, "train-images-idx3-ubyte", 3, img, 64 * 784), 0);
  const uint32_t lab2[1] = {63};
  LT_EQ(write_idx(d, "train-labels-idx1-ubyte", 1, lab2, 63), 0);
  r = tt_train("--hidden 8 --batch 16 --data %s", d);
  LT_EQ(r.rc, 1);
  LT_TRUE(strstr(r.err, "64 images") && strstr(r.err, "63 labels"));
  tt_run_free(&r);
  /* a corrupt gzip file in place of the test labels */
  LT_EQ(write_idx(d, "train-labels-idx1-ubyte", 1, lab, 64), 0);
  char p[512];
  snprintf(p, sizeof p, "%s/t10k-labels-idx1-ubyte", d);
  unlink(p);
  snprintf(p, sizeof p, "%s/t10k-labels-idx1-ubyte.gz", d);
  const unsigned char junk[] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 0xde, 0xad, 0xbe, 0xef};
  LT_EQ(tt_write_file(p, junk, sizeof junk), 0);
  r = tt_train("--hidden 8 --batch 16 --data %s", d);
  LT_EQ(r.rc, 1);
  LT_TRUE(strstr(r.err, "t10k-labels-idx1-ubyte.gz") && strstr(r.err, "corrupt"));
  if (!strstr(r.err, "corrupt")) fprintf(stderr, "%s", r.err);
  tt_run_free(&r);
  tt_cleanup();
}
