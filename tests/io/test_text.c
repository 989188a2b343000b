/* test_text.c: byte-level text (loom_text): the split (the last tenth is validation), training
 * windows that are the text's bytes with next-byte targets, a pure function of (seed, step,
 * row) (so a resumed run and the ranks of DDP take the rows one process would), validation
 * windows spread over the split, the fortunes as the default text, and bad input named by file:
 * missing, empty, a folder, a FIFO, too short for a window. */
#define _GNU_SOURCE /* memmem */
#include "lt.h"
#include "io_test.h"

#include <sys/stat.h>

/* 1000 bytes of text, byte i = 'a' + i % 26. */
static loom_text *alphabet(void) {
  char b[1000];
  for (int i = 0; i < 1000; i++) b[i] = (char)('a' + i % 26);
  loom_text *t = NULL;
  LT_OK(loom_text_from_bytes(b, sizeof b, "alphabet", &t));
  return t;
}

LT_TEST(text_split_is_the_last_tenth) {
  loom_text *t = alphabet();
  LT_EQ(loom_text_size(t, LOOM_SPLIT_TRAIN), 900);
  LT_EQ(loom_text_size(t, LOOM_SPLIT_TEST), 100);
  LT_EQ(loom_text_bytes(t, LOOM_SPLIT_TEST)[0], 'a' + 900 % 26);
  LT_EQ(loom_text_val_windows(t, 16), 99 / 16);
  loom_text_free(t);
}

/* Every row is a window of the training split, targets the inputs shifted by one. */
LT_TEST(text_windows_are_the_text_with_next_byte_targets) {
  loom_text *t = alphabet();
  loom_tensor *x = NULL, *y = NULL;
  LT_OK(loom_text_batch(t, 7, 3, 0, 5, 16, &x, &y));
  LT_EQ(loom_tensor_dim(x, 0), 5);
  LT_EQ(loom_tensor_dim(x, 1), 16);
  LT_EQ(loom_tensor_dtype(x), LOOM_I64);
  const int64_t *xi = loom_tensor_data(x), *yi = loom_tensor_data(y);
  for (int r = 0; r < 5; r++)
    for (int c = 0; c < 16; c++) {
      LT_EQ(yi[r * 16 + c], 'a' + (xi[r * 16 + c] - 'a' + 1) % 26);
      if (c) LT_EQ(xi[r * 16 + c], yi[r * 16 + c - 1]);
    }
  loom_tensor_free(x);
  loom_tensor_free(y);
  loom_text_free(t);
}

/* Rows [k b, (k+1) b) taken alone (a rank's) equal those rows of the whole batch; the same
 * (seed, step) gives the same rows, another step or seed other rows. */
LT_TEST(text_windows_depend_on_seed_step_and_row_alone) {
  loom_text *t = alphabet();
  size_t n = 2000;
  uint8_t big[2000];
  for (size_t i = 0; i < n; i++) big[i] = (uint8_t)(loom_rng_hash(1, i) & 0xff);
  loom_text *u = NULL;
  LT_OK(loom_text_from_bytes(big, n, "random", &u));
  loom_tensor *all = NULL, *ya = NULL, *half = NULL, *yh = NULL, *again = NULL, *yg = NULL,
              *other = NULL, *yo = NULL;
  LT_OK(loom_text_batch(u, 5, 11, 0, 8, 32, &all, &ya));
  LT_OK(loom_text_batch(u, 5, 11, 4, 4, 32, &half, &yh));
  LT_OK(loom_text_batch(u, 5, 11, 0, 8, 32, &again, &yg));
  LT_OK(loom_text_batch(u, 5, 12, 0, 8, 32, &other, &yo));
  const int64_t *a = loom_tensor_data(all), *h = loom_tensor_data(half);
  LT_TRUE(memcmp(a + 4 * 32, h, 4 * 32 * sizeof *a) == 0);
  LT_TRUE(memcmp(a, loom_tensor_data(again), 8 * 32 * sizeof *a) == 0);
  LT_TRUE(memcmp(a, loom_tensor_data(other), 8 * 32 * sizeof *a) != 0);
  loom_tensor *ts[] = {all, ya, half, yh, again, yg, other, yo};
  for (int i = 0; i < 8; i++) loom_tensor_free(ts[i]);
  loom_text_free(u);
  loom_text_free(t);
}

/* The validation set of count windows takes window floor(k W / count), in order. */
LT_TEST(text_validation_windows_are_fixed_and_spread) {
  loom_text *t = alphabet();
  size_t w = loom_text_val_windows(t, 16); /* 6 */
  loom_tensor *x = NULL, *y = NULL;
  LT_OK(loom_text_val_batch(t, 3, 1, 2, 16, &x, &y));
  const int64_t *xi = loom_tensor_data(x);
  const uint8_t *val = loom_text_bytes(t, LOOM_SPLIT_TEST);
  LT_EQ(xi[0], val[(1 * w / 3) * 16]);
  LT_EQ(xi[16], val[(2 * w / 3) * 16]);
  loom_tensor_free(x);
  loom_tensor_free(y);
  LT_ERR(loom_text_val_batch(t, w + 1, 0, 1, 16, &x, &y), LOOM_EINVAL, "validation windows");
  LT_ERR(loom_text_val_batch(t, 3, 2, 2, 16, &x, &y), LOOM_EINVAL, "pass the 3");
  loom_text_free(t);
}

LT_TEST(text_too_short_for_a_window_names_the_split) {
  loom_text *t = alphabet();
  loom_tensor *x = NULL, *y = NULL;
  LT_OK(loom_text_check(t, 99));
  LT_ERR(loom_text_check(t, 100), LOOM_EFORMAT, "'alphabet' is too short: its validation split");
  LT_ERR(loom_text_batch(t, 0, 0, 0, 1, 100, &x, &y), LOOM_EFORMAT, "too short");
  LT_TRUE(x == NULL && y == NULL);
  LT_ERR(loom_text_batch(t, 0, 0, 0, 0, 8, &x, &y), LOOM_EINVAL, "rows is 0");
  loom_text_free(t);
}

LT_TEST(text_bad_files_are_named) {
  char dir[64], p[160];
  iot_mkdtemp(dir, sizeof dir);
  loom_text *t = NULL;
  iot_path(p, sizeof p, dir, "missing.txt");
  LT_ERR(loom_text_load(p, &t), LOOM_ENOTFOUND, "missing.txt");
  iot_path(p, sizeof p, dir, "empty.txt");
  iot_write(p, "", 0);
  LT_ERR(loom_text_load(p, &t), LOOM_EFORMAT, "empty.txt' is empty");
  LT_ERR(loom_text_load(dir, &t), LOOM_EIO, "is not a regular file");
  iot_path(p, sizeof p, dir, "fifo");
  LT_EQ(mkfifo(p, 0600), 0);
  LT_ERR(loom_text_load(p, &t), LOOM_EIO, "fifo' is not a regular file");
  unlink(p);
  iot_path(p, sizeof p, dir, "ok.txt");
  iot_write(p, "hello, world\n", 13);
  LT_OK(loom_text_load(p, &t));
  LT_EQ(loom_text_size(t, LOOM_SPLIT_TRAIN) + loom_text_size(t, LOOM_SPLIT_TEST), 13);
  LT_ERR(loom_text_check(t, 8), LOOM_EFORMAT, "ok.txt' is too short");
  loom_text_free(t);
  iot_rmdir(dir);
}

/* Debian's fortunes (when installed): about 2.5 MB of English, no "%" separator lines left. */
LT_TEST(text_fortunes_are_the_default) {
  if (access(LOOM_FORTUNES_DIR "/fortunes", F_OK) != 0) {
    fprintf(stderr, "skipped: %s not installed (apt-get install fortunes)\n", LOOM_FORTUNES_DIR);
    return;
  }
  loom_text *t = NULL;
  LT_OK(loom_text_load(NULL, &t));
  size_t n = loom_text_size(t, LOOM_SPLIT_TRAIN) + loom_text_size(t, LOOM_SPLIT_TEST);
  LT_TRUE(n > 2000000 && n < 4000000);
  LT_TRUE(memmem(loom_text_bytes(t, LOOM_SPLIT_TRAIN), loom_text_size(t, LOOM_SPLIT_TRAIN),
                 "\n%\n", 3) == NULL);
  LT_STREQ(loom_text_source(t), LOOM_FORTUNES_DIR);
  loom_text_free(t);
}
