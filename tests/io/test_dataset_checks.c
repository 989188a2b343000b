/* test_dataset_checks.c: a dataset is checked when it is loaded: no images is an error naming
 * the file (it used to give "test accuracy 0.00%"), and loom_dataset_check refuses a label at
 * or above the number of classes (naming the labels file, the index and the value) and images
 * of another size than the model needs (naming the images file and the size wanted). */
#include "lt.h"
#include "io_test.h"

/* dir/prefix-images-idx3-ubyte (n images of side x side, pixel i = i % 251) and
 * dir/prefix-labels-idx1-ubyte (label i = i % 10, then `bad` at index bad_at if < n). */
static void make_set(const char *dir, const char *prefix, uint32_t n, uint32_t side,
                     uint32_t bad_at, unsigned char bad) {
  size_t px = (size_t)n * side * side;
  unsigned char *img = malloc(px + 1), *lab = malloc(n + 1), *buf = malloc(px + n + 64);
  for (size_t i = 0; i < px; i++) img[i] = (unsigned char)(i % 251);
  for (uint32_t i = 0; i < n; i++) lab[i] = (unsigned char)(i % 10);
  if (bad_at < n) lab[bad_at] = bad;
  char p[160];
  snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte", dir, prefix);
  iot_write(p, buf, iot_make_idx(buf, 0x08, 3, (uint32_t[]){n, side, side}, img, px));
  snprintf(p, sizeof p, "%s/%s-labels-idx1-ubyte", dir, prefix);
  iot_write(p, buf, iot_make_idx(buf, 0x08, 1, (uint32_t[]){n}, lab, n));
  free(img), free(lab), free(buf);
}

LT_TEST(dataset_empty_sets_are_refused_by_file) {
  char dir[64];
  iot_mkdtemp(dir, sizeof dir);
  make_set(dir, "t10k", 0, 28, (uint32_t)-1, 0);
  loom_dataset *d = NULL;
  LT_ERR(loom_mnist_load(dir, LOOM_SPLIT_TEST, &d), LOOM_EFORMAT,
         "t10k-images-idx3-ubyte' holds no images");
  LT_TRUE(d == NULL);
  iot_rmdir(dir);
}

LT_TEST(dataset_check_names_the_label_and_the_size) {
  char dir[64];
  iot_mkdtemp(dir, sizeof dir);
  make_set(dir, "train", 12, 28, 5, 12);
  loom_dataset *d = NULL;
  LT_OK(loom_mnist_load(dir, LOOM_SPLIT_TRAIN, &d));
  LT_ERR(loom_dataset_check(d, LOOM_MNIST_CLASSES, LOOM_MNIST_SIDE, LOOM_MNIST_SIDE), LOOM_EFORMAT,
         "train-labels-idx1-ubyte': label 12 at index 5 is not below 10 (the number of classes)");
  LT_OK(loom_dataset_check(d, 13, 28, 28));
  LT_OK(loom_dataset_check(d, 0, 0, 0)); /* nothing asked */
  loom_dataset_free(d);
  make_set(dir, "train", 4, 14, (uint32_t)-1, 0);
  LT_OK(loom_mnist_load(dir, LOOM_SPLIT_TRAIN, &d));
  LT_ERR(loom_dataset_check(d, LOOM_MNIST_CLASSES, LOOM_MNIST_SIDE, LOOM_MNIST_SIDE), LOOM_EFORMAT,
         "train-images-idx3-ubyte' holds images of 14x14 pixels, expected 28x28");
  LT_OK(loom_dataset_check(d, 10, 14, 0));
  loom_dataset_free(d);
  LT_ERR(loom_dataset_check(NULL, 10, 28, 28), LOOM_EINVAL, "dataset is NULL");
  iot_rmdir(dir);
}
