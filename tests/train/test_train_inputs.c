/* test_train_inputs.c: `loom train`'s input files are checked before they are used: an --init
 * file with NaN or infinite weights is refused by tensor name (the loss used to become NaN
 * and the run "succeed"), and so is a finite one the --amp forward dtype cannot hold; a FIFO as --init file, as checkpoint or as data file is refused at
 * once (open() used to block forever); test labels above 9, an empty test set and images of
 * another size than 28x28 are errors naming the file (and the index), not "test accuracy
 * 0.00%" or a shape error inside linear. */
#include "lt.h"
#include "train_forge.h"
#include "train_test.h"
#include "../io/io_test.h"

#define RUN "--hidden 16 --batch 16 --epochs 1 --threads 1 --quiet"

/* dir/prefix-{images-idx3,labels-idx1}-ubyte: n images of side x side, labels i % 10 but
 * `bad` at index bad_at (if < n). */
static void write_set(const char *dir, const char *prefix, uint32_t n, uint32_t side,
                      uint32_t bad_at, unsigned char bad) {
  size_t px = (size_t)n * side * side;
  unsigned char *img = calloc(px + 1, 1), *lab = calloc(n + 1, 1), *buf = malloc(px + n + 64);
  for (size_t i = 0; i < px; i++) img[i] = (unsigned char)(i % 251);
  for (uint32_t i = 0; i < n; i++) lab[i] = (unsigned char)(i % 10);
  if (bad_at < n) lab[bad_at] = bad;
  char p[512];
  snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte", dir, prefix);
  LT_EQ(tt_write_file(p, buf, iot_make_idx(buf, 0x08, 3, (uint32_t[]){n, side, side}, img, px)), 0);
  snprintf(p, sizeof p, "%s/%s-labels-idx1-ubyte", dir, prefix);
  LT_EQ(tt_write_file(p, buf, iot_make_idx(buf, 0x08, 1, (uint32_t[]){n}, lab, n)), 0);
  free(img), free(lab), free(buf);
}

static void expect_failure(const char *args, const char *want1, const char *want2) {
  tt_run r = tt_train(RUN " %s", args);
  LT_EQ(r.rc, 1);
  LT_TRUE(strstr(r.err, want1) && strstr(r.err, want2));
  if (r.rc != 1 || !strstr(r.err, want1) || !strstr(r.err, want2))
    fprintf(stderr, "%s: rc %d, stdout \"%s\", stderr \"%s\"\n", args, r.rc, r.out, r.err);
  tt_run_free(&r);
}

LT_TEST(train_data_labels_counts_and_sizes_are_checked_at_load) {
  const char *d = tt_tempdir();
  char args[600];
  snprintf(args, sizeof args, "--data %s", d);
  write_set(d, "train", 64, 28, (uint32_t)-1, 0);
  write_set(d, "t10k", 32, 28, 5, 12);
  expect_failure(args, "t10k-labels-idx1-ubyte': label 12 at index 5 is not below 10", "");
  write_set(d, "t10k", 0, 28, (uint32_t)-1, 0);
  expect_failure(args, "t10k-images-idx3-ubyte' holds no images", "");
  write_set(d, "t10k", 32, 28, (uint32_t)-1, 0);
  write_set(d, "train", 64, 14, (uint32_t)-1, 0);
  expect_failure(args, "train-images-idx3-ubyte' holds images of 14x14 pixels, expected 28x28", "");
  write_set(d, "train", 64, 28, 63, 10);
  expect_failure(args, "train-labels-idx1-ubyte': label 10 at index 63", "");
  write_set(d, "train", 64, 28, (uint32_t)-1, 0);
  tt_run r = tt_train(RUN " %s", args);
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
  tt_cleanup();
}

/* A model file of a short run (RUN) at init (a new folder's model.safetensors): its bytes
 * (malloc'd, *n of them), for the --init tests to rewrite it from. */
static char *saved_model(char *init, size_t cap, size_t *n) {
  const char *d = tt_tempdir();
  tt_run r = tt_train(RUN " --limit 64 --save %s", d);
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
  snprintf(init, cap, "%s/model.safetensors", d);
  char *good = tt_read_file(init, n);
  LT_TRUE(good != NULL);
  return good;
}

LT_TEST(train_init_refuses_nonfinite_weights) {
  char init[512];
  size_t n = 0;
  char *good = saved_model(init, sizeof init, &n);
  const struct { const char *tensor; size_t at; float v; const char *want; } cases[] = {
      {"layers.0.weight", 100, NAN, "tensor \"layers.0.weight\" holds nan at element 100"},
      {"layers.2.bias", 9, INFINITY, "tensor \"layers.2.bias\" holds inf at element 9"},
  };
  char args[600];
  snprintf(args, sizeof args, "--limit 64 --init %s", init);
  for (size_t i = 0; i < 2; i++) {
    LT_EQ(tt_write_file(init, good, n), 0);
    LT_EQ(tf_set_f32(init, cases[i].tensor, cases[i].at, cases[i].v), 0);
    expect_failure(args, "--init", cases[i].want);
  }
  LT_EQ(tt_write_file(init, good, n), 0);
  tt_run r = tt_train(RUN " %s", args);
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
  free(good);
  tt_cleanup();
}

/* Finite --init values the forward dtype cannot hold (above its largest finite value: 65504
 * for f16) are refused naming the tensor, the element and the value; they would be inf in
 * every forward. */
LT_TEST(train_init_refuses_values_the_forward_dtype_cannot_hold) {
  char init[512];
  size_t n = 0;
  char *good = saved_model(init, sizeof init, &n);
  const struct { const char *amp, *tensor; size_t at; float v; const char *most; } cases[] = {
      {"f16", "layers.0.weight", 100, 3e38f, "f16 value 65504"},
      {"f16", "layers.2.bias", 3, -70000.0f, "f16 value 65504"},
      {"bf16", "layers.0.bias", 7, 3.39e38f, "bf16 value 3.38953139e+38"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    LT_EQ(tt_write_file(init, good, n), 0);
    LT_EQ(tf_set_f32(init, cases[i].tensor, cases[i].at, cases[i].v), 0);
    char args[700], want[200], most[100];
    snprintf(args, sizeof args, "--limit 64 --amp %s --init %s", cases[i].amp, init);
    snprintf(want, sizeof want, "tensor '%s' element %zu is %.9g, above the", cases[i].tensor,
             cases[i].at, (double)cases[i].v);
    snprintf(most, sizeof most, "largest finite %s", cases[i].most);
    expect_failure(args, want, most);
  }
  free(good);
  tt_cleanup();
}

/* ---- FIFOs: each run in a child with a time limit, since the bug was a hang ------------ */

typedef struct fifo_case {
  const char *args, *want;
} fifo_case;

static int run_fifo_case(void *arg) {
  const fifo_case *c = arg;
  tt_run r = tt_train(RUN " %s", c->args);
  int ok = r.rc == 1 && strstr(r.err, c->want) && strstr(r.err, "is not a regular file");
  if (!ok) fprintf(stderr, "%s: rc %d, stderr \"%s\"\n", c->args, r.rc, r.err);
  tt_run_free(&r);
  return ok ? 0 : 1;
}

LT_TEST(train_fifo_inputs_are_refused_at_once) {
  const char *d = tt_tempdir(), *data = tt_tempdir();
  char fifo[512], ck[512], img[512];
  snprintf(fifo, sizeof fifo, "%s/weights.safetensors", d);
  snprintf(ck, sizeof ck, "%s/checkpoint.safetensors", d);
  snprintf(img, sizeof img, "%s/train-images-idx3-ubyte", data);
  LT_EQ(mkfifo(fifo, 0600), 0);
  LT_EQ(mkfifo(ck, 0600), 0);
  write_set(data, "t10k", 16, 28, (uint32_t)-1, 0);
  write_set(data, "train", 16, 28, (uint32_t)-1, 0);
  unlink(img);
  LT_EQ(mkfifo(img, 0600), 0);
  char a[3][600];
  snprintf(a[0], sizeof a[0], "--limit 64 --init %s", fifo);
  snprintf(a[1], sizeof a[1], "--limit 64 --resume %s", d);
  snprintf(a[2], sizeof a[2], "--data %s", data);
  fifo_case cases[3] = {{a[0], "weights.safetensors"}, {a[1], "checkpoint.safetensors"},
                        {a[2], "train-images-idx3-ubyte"}};
  for (int i = 0; i < 3; i++) {
    double t0 = iot_now();
    LT_EQ(iot_run_limited(run_fifo_case, &cases[i], 60), 0); /* -1: blocked in open() */
    LT_TRUE(iot_now() - t0 < 60);
  }
  tt_cleanup();
}
