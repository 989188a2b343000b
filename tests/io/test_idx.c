/* test_idx.c: the IDX reader, the MNIST-family dataset and the loader: synthetic files made
 * here (plain and gzip'd, valid, corrupt, truncated, inconsistent), the real Fashion-MNIST
 * files when the Debian package is installed, seeded shuffles pinned to an independent
 * implementation, batching with and without the last partial batch, normalisation, and
 * out-of-memory sweeps. */
#include "lt.h"
#include "io_test.h"

#include <zlib.h>

static int write_gz(const char *path, const void *buf, size_t n) {
  gzFile g = gzopen(path, "wb");
  if (!g) return -1;
  int w = gzwrite(g, buf, (unsigned)n);
  gzclose(g);
  return (size_t)w == n ? 0 : -1;
}

LT_TEST(idx_reads_plain_and_gzip_every_type) {
  char dir[64], p[128];
  iot_mkdtemp(dir, sizeof dir);
  unsigned char buf[256];
  /* u8 [2, 3] */
  uint32_t d23[2] = {2, 3};
  unsigned char u8[6] = {0, 1, 2, 253, 254, 255};
  size_t n = iot_make_idx(buf, 0x08, 2, d23, u8, 6);
  for (int gz = 0; gz < 2; gz++) {
    iot_path(p, sizeof p, dir, gz ? "u8.gz" : "u8");
    LT_EQ(gz ? write_gz(p, buf, n) : iot_write(p, buf, n), 0);
    loom_idx *x = NULL;
    LT_OK(loom_idx_read(p, &x));
    loom_idx_info in;
    loom_idx_get_info(x, &in);
    LT_EQ(in.type, 0x08);
    LT_EQ(in.ndim, 2);
    LT_EQ(in.dims[1], 3);
    LT_EQ(in.numel, 6);
    LT_TRUE(in.data && memcmp(in.data, u8, 6) == 0);
    loom_idx_free(x);
  }
  /* i32 and f32, big-endian in the file */
  uint32_t d2[1] = {2};
  unsigned char i32be[8] = {0xff, 0xff, 0xff, 0xfe, 0x01, 0x02, 0x03, 0x04};
  n = iot_make_idx(buf, 0x0C, 1, d2, i32be, 8);
  iot_path(p, sizeof p, dir, "i32");
  iot_write(p, buf, n);
  loom_idx *x = NULL;
  LT_OK(loom_idx_read(p, &x));
  loom_idx_info in;
  loom_idx_get_info(x, &in);
  LT_EQ(((const int32_t *)in.data)[0], -2);
  LT_EQ(((const int32_t *)in.data)[1], 0x01020304);
  loom_idx_free(x);
  unsigned char f32be[8] = {0x3f, 0x80, 0, 0, 0xc0, 0x49, 0x0f, 0xdb}; /* 1.0, -pi */
  n = iot_make_idx(buf, 0x0D, 1, d2, f32be, 8);
  iot_path(p, sizeof p, dir, "f32.gz");
  write_gz(p, buf, n);
  LT_OK(loom_idx_read(p, &x));
  loom_idx_get_info(x, &in);
  LT_NEAR(((const float *)in.data)[0], 1.0, 0);
  LT_NEAR(((const float *)in.data)[1], -3.14159274, 1e-7);
  LT_EQ(in.elem_size, 4);
  loom_idx_free(x);
  iot_rmdir(dir);
}

typedef struct bad_idx {
  const char *name;
  bool gz;
  unsigned char bytes[40];
  size_t n;
  const char *msg;
} bad_idx;

LT_TEST(idx_rejects_corrupt_and_truncated_files) {
  char dir[64], p[128];
  iot_mkdtemp(dir, sizeof dir);
  static const bad_idx cases[] = {
      {"magic", false, {1, 0, 8, 1, 0, 0, 0, 1, 7}, 9, "is not an IDX file: magic 01 00 08 01"},
      {"type", false, {0, 0, 7, 1, 0, 0, 0, 1, 7}, 9, "is not an IDX file"},
      {"ndim0", false, {0, 0, 8, 0}, 4, "is not an IDX file"},
      {"short_magic", false, {0, 0}, 2, "is truncated: 2 of 4 bytes of the magic number"},
      {"short_dims", false, {0, 0, 8, 2, 0, 0, 0, 1, 0, 0}, 10, "of the dimensions"},
      {"short_data", false, {0, 0, 8, 1, 0, 0, 0, 3, 1, 2}, 10,
       "the dimensions need 3 bytes of data but the file has 2"},
      {"long_data", false, {0, 0, 8, 1, 0, 0, 0, 1, 1, 2}, 10,
       "the dimensions need 1 bytes of data but the file has 2"},
      {"overflow", false, {0, 0, 8, 4, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
                           255, 255, 255, 255}, 20, "overflow the element count"},
      {"extra.gz", true, {0, 0, 8, 1, 0, 0, 0, 1, 1, 2}, 10, "has data after the 1 elements"},
      {"short.gz", true, {0, 0, 8, 1, 0, 0, 0, 4, 1, 2}, 10, "is truncated: 2 of 4 bytes of the data"},
      {"huge.gz", true, {0, 0, 8, 3, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0}, 16,
       "the dimensions need 1099511627776 bytes of data but the gzip file has only"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    iot_path(p, sizeof p, dir, cases[i].name);
    if (cases[i].gz) write_gz(p, cases[i].bytes, cases[i].n);
    else iot_write(p, cases[i].bytes, cases[i].n);
    loom_idx *x = (loom_idx *)1;
    loom_clear_error();
    int rc = loom_idx_read(p, &x);
    if (rc != LOOM_EFORMAT || !strstr(loom_last_error(), cases[i].msg) || !strstr(loom_last_error(), p))
      lt_fail_at(__FILE__, __LINE__, "%s: %s \"%s\", expected \"%s\"", cases[i].name,
                 loom_status_name(rc), loom_last_error(), cases[i].msg);
    LT_TRUE(x == NULL);
  }
  /* a gzip stream cut short, and one with a flipped byte */
  unsigned char img[4 + 4 + 4000];
  static unsigned char data[4000];
  for (int i = 0; i < 4000; i++) data[i] = (unsigned char)(i * 7 % 251);
  size_t n = iot_make_idx(img, 0x08, 1, (uint32_t[]){4000}, data, 4000);
  iot_path(p, sizeof p, dir, "good.gz");
  write_gz(p, img, n);
  size_t gl = 0;
  unsigned char *g = iot_read(p, &gl);
  loom_idx *x = NULL;
  iot_path(p, sizeof p, dir, "cut.gz");
  iot_write(p, g, gl / 2);
  loom_clear_error();
  LT_EQ(loom_idx_read(p, &x), LOOM_EFORMAT);
  LT_TRUE(strstr(loom_last_error(), "cut.gz") != NULL);
  g[gl / 2] ^= 0x55;
  iot_path(p, sizeof p, dir, "flip.gz");
  iot_write(p, g, gl);
  LT_EQ(loom_idx_read(p, &x), LOOM_EFORMAT);
  g[gl / 2] ^= 0x55;
  g[gl - 6] ^= 1; /* the CRC-32 in the gzip trailer */
  iot_write(p, g, gl);
  LT_EQ(loom_idx_read(p, &x), LOOM_EFORMAT);
  LT_TRUE(x == NULL);
  free(g);
  iot_path(p, sizeof p, dir, "absent");
  LT_ERR(loom_idx_read(p, &x), LOOM_ENOTFOUND, "cannot open");
  LT_ERR(loom_idx_read(dir, &x), LOOM_EIO, "is not a regular file");
  iot_rmdir(dir);
}

/* A 10-sample 2x3 dataset in `dir` as prefix-images-idx3-ubyte(.gz) / -labels-idx1-ubyte. */
static void make_set(const char *dir, const char *prefix, uint32_t n_img, uint32_t n_lab) {
  unsigned char buf[512], px[60], lab[16];
  for (int i = 0; i < 60; i++) px[i] = (unsigned char)(i * 4);
  for (int i = 0; i < 16; i++) lab[i] = (unsigned char)(i % 10);
  char p[160];
  size_t n = iot_make_idx(buf, 0x08, 3, (uint32_t[]){n_img, 2, 3}, px, 6 * n_img);
  snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte", dir, prefix);
  iot_write(p, buf, n);
  n = iot_make_idx(buf, 0x08, 1, (uint32_t[]){n_lab}, lab, n_lab);
  snprintf(p, sizeof p, "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
  write_gz(p, buf, n);
}

LT_TEST(dataset_from_a_folder_and_its_errors) {
  char dir[64];
  iot_mkdtemp(dir, sizeof dir);
  make_set(dir, "train", 10, 10);
  make_set(dir, "t10k", 4, 3);
  loom_dataset *d = NULL;
  LT_OK(loom_mnist_load(dir, LOOM_SPLIT_TRAIN, &d));
  LT_EQ(loom_dataset_size(d), 10);
  LT_EQ(loom_dataset_rows(d), 2);
  LT_EQ(loom_dataset_cols(d), 3);
  LT_EQ(loom_dataset_images(d)[7], 28);
  LT_EQ(loom_dataset_labels(d)[9], 9);
  loom_dataset_free(d);
  LT_ERR(loom_mnist_load(dir, LOOM_SPLIT_TEST, &d), LOOM_EFORMAT, "has 4 images but");
  LT_TRUE(d == NULL);
  LT_ERR(loom_mnist_load("/nonexistent/fm", LOOM_SPLIT_TRAIN, &d), LOOM_ENOTFOUND,
         "no train-images-idx3-ubyte[.gz] in '/nonexistent/fm'");
  LT_ERR(loom_mnist_load(dir, (loom_split)5, &d), LOOM_EINVAL, "split 5");
  char a[160], b[160];
  snprintf(a, sizeof a, "%s/train-labels-idx1-ubyte.gz", dir);
  snprintf(b, sizeof b, "%s/train-images-idx3-ubyte", dir);
  LT_ERR(loom_dataset_from_idx(a, b, &d), LOOM_EFORMAT, "is not u8 images");
  LT_ERR(loom_dataset_from_idx(b, b, &d), LOOM_EFORMAT, "is not u8 labels");
  iot_rmdir(dir);
}

LT_TEST(loader_batches_order_and_normalisation) {
  char dir[64];
  iot_mkdtemp(dir, sizeof dir);
  make_set(dir, "train", 10, 10);
  loom_dataset *d = NULL;
  LT_OK(loom_mnist_load(dir, LOOM_SPLIT_TRAIN, &d));
  loom_loader_cfg c = loom_loader_cfg_default();
  LT_EQ(c.batch, 256);
  LT_TRUE(c.shuffle);
  LT_EQ(c.label_dtype, LOOM_I64);
  c.batch = 4, c.shuffle = false;
  loom_loader *l = NULL;
  LT_OK(loom_loader_create(d, &c, &l));
  LT_EQ(loom_loader_batches(l), 3); /* 4 + 4 + 2 */
  loom_tensor *x = NULL, *y = NULL;
  LT_OK(loom_loader_batch(l, 0, 2, &x, &y));
  LT_EQ(loom_tensor_ndim(x), 4);
  LT_EQ(loom_tensor_dim(x, 0), 2);
  LT_EQ(loom_tensor_dim(x, 1), 1);
  LT_EQ(loom_tensor_dim(x, 3), 3);
  const float *xd = loom_tensor_data(x);
  LT_NEAR(xd[0], (float)(48 * 4 % 256) / 255.0f, 0); /* sample 8, pixel 0 = (8*6)*4 */
  LT_EQ(((const int64_t *)loom_tensor_data(y))[1], 9);
  loom_tensor_free(x), loom_tensor_free(y);
  LT_ERR(loom_loader_batch(l, 0, 3, &x, &y), LOOM_EINVAL, "batch 3 out of range (3 batches)");
  loom_loader_free(l);
  /* drop_last, flatten, standard normalisation, i32 labels */
  c.drop_last = true, c.flatten = true, c.norm = LOOM_NORM_STANDARD, c.label_dtype = LOOM_I32;
  LT_OK(loom_loader_create(d, &c, &l));
  LT_EQ(loom_loader_batches(l), 2);
  LT_OK(loom_loader_batch(l, 0, 1, &x, &y));
  LT_EQ(loom_tensor_ndim(x), 2);
  LT_EQ(loom_tensor_dim(x, 1), 6);
  LT_EQ(loom_tensor_dtype(y), LOOM_I32);
  xd = loom_tensor_data(x);
  float want = ((float)(24 * 4) / 255.0f - 0.2860f) / 0.3530f; /* sample 4, pixel 0 */
  LT_NEAR(xd[0], want, 0);
  LT_EQ(((const int32_t *)loom_tensor_data(y))[3], 7);
  loom_tensor_free(x), loom_tensor_free(y);
  loom_loader_free(l);
  /* the seeded shuffle, pinned to an independent implementation of the documented algorithm
   * (Python: SplitMix64 from seed ^ epoch*0x9E3779B97F4A7C15, Fisher-Yates with rejection) */
  c = loom_loader_cfg_default();
  c.seed = 42;
  LT_OK(loom_loader_create(d, &c, &l));
  const uint32_t *o;
  static const uint32_t e0[10] = {0, 9, 5, 8, 6, 4, 7, 2, 1, 3}, e1[10] = {2, 3, 9, 7, 5, 8, 6, 4, 0, 1};
  LT_OK(loom_loader_order(l, 0, &o));
  LT_TRUE(memcmp(o, e0, sizeof e0) == 0);
  LT_OK(loom_loader_order(l, 1, &o));
  LT_TRUE(memcmp(o, e1, sizeof e1) == 0);
  LT_OK(loom_loader_batch(l, 0, 0, &x, &y)); /* all 10 in one batch, in epoch 0's order */
  for (int i = 0; i < 10; i++) LT_EQ(((const int64_t *)loom_tensor_data(y))[i], e0[i]);
  loom_tensor_free(x), loom_tensor_free(y);
  loom_loader_free(l);
  c.batch = 0;
  LT_ERR(loom_loader_create(d, &c, &l), LOOM_EINVAL, "batch = 0");
  c = loom_loader_cfg_default(), c.norm = LOOM_NORM_STANDARD, c.std = 0;
  LT_ERR(loom_loader_cfg_validate(&c), LOOM_EINVAL, "std = 0");
  c = loom_loader_cfg_default(), c.label_dtype = LOOM_F32;
  LT_ERR(loom_loader_cfg_validate(&c), LOOM_EINVAL, "label_dtype f32");
  loom_dataset_free(d);
  iot_rmdir(dir);
}

LT_TEST(loader_shuffle_is_a_permutation_and_seeded) {
  char dir[64];
  iot_mkdtemp(dir, sizeof dir);
  make_set(dir, "train", 10, 10);
  loom_dataset *d = NULL;
  LT_OK(loom_mnist_load(dir, LOOM_SPLIT_TRAIN, &d));
  loom_loader_cfg c = loom_loader_cfg_default();
  c.seed = 7;
  loom_loader *a = NULL, *b = NULL;
  LT_OK(loom_loader_create(d, &c, &a));
  c.seed = 8;
  LT_OK(loom_loader_create(d, &c, &b));
  const uint32_t *oa, *ob;
  uint32_t copy[10];
  int differ = 0;
  for (uint64_t e = 0; e < 5; e++) {
    LT_OK(loom_loader_order(a, e, &oa));
    memcpy(copy, oa, sizeof copy);
    LT_OK(loom_loader_order(b, e, &ob));
    differ += memcmp(copy, ob, sizeof copy) != 0;
    int seen[10] = {0};
    for (int i = 0; i < 10; i++) seen[copy[i]]++;
    for (int i = 0; i < 10; i++) LT_EQ(seen[i], 1);
    LT_OK(loom_loader_order(a, e, &oa)); /* same epoch again: same order */
    LT_TRUE(memcmp(copy, oa, sizeof copy) == 0);
  }
  LT_TRUE(differ >= 4);
  loom_loader_free(a), loom_loader_free(b);
  loom_dataset_free(d);
  iot_rmdir(dir);
}

LT_TEST(fashion_mnist_real_files) {
  loom_dataset *tr = NULL, *te = NULL;
  if (access(LOOM_FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", F_OK) != 0) {
    lt_skip("dataset-fashion-mnist is not installed");
    return;
  }
  LT_OK(loom_mnist_load(NULL, LOOM_SPLIT_TRAIN, &tr));
  LT_OK(loom_mnist_load(NULL, LOOM_SPLIT_TEST, &te));
  if (!tr || !te) return;
  LT_EQ(loom_dataset_size(tr), 60000);
  LT_EQ(loom_dataset_size(te), 10000);
  LT_EQ(loom_dataset_rows(tr), 28);
  LT_EQ(loom_dataset_cols(te), 28);
  size_t count[10] = {0}, bad = 0;
  for (size_t i = 0; i < 60000; i++) {
    uint8_t y = loom_dataset_labels(tr)[i];
    if (y > 9) bad++;
    else count[y]++;
  }
  LT_EQ(bad, 0);
  for (int k = 0; k < 10; k++) LT_EQ(count[k], 6000); /* balanced classes */
  static const uint8_t first_train[10] = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5};
  static const uint8_t first_test[10] = {9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
  LT_TRUE(memcmp(loom_dataset_labels(tr), first_train, 10) == 0);
  LT_TRUE(memcmp(loom_dataset_labels(te), first_test, 10) == 0);
  long sum = 0; /* pixel sum of image 0 (computed with Python's gzip module) */
  for (int i = 0; i < 784; i++) sum += loom_dataset_images(tr)[i];
  LT_EQ(sum, 76247);
  loom_loader_cfg c = loom_loader_cfg_default();
  loom_loader *l = NULL;
  LT_OK(loom_loader_create(tr, &c, &l));
  LT_EQ(loom_loader_batches(l), 235); /* 234 full + 96 */
  loom_tensor *x = NULL, *y = NULL;
  LT_OK(loom_loader_batch(l, 3, 234, &x, &y));
  LT_EQ(loom_tensor_dim(x, 0), 96);
  LT_EQ(loom_tensor_dim(x, 2), 28);
  loom_tensor_free(x), loom_tensor_free(y);
  loom_loader_free(l);
  loom_dataset_free(tr);
  loom_dataset_free(te);
}

LT_TEST(idx_and_loader_oom_sweeps) {
  char dir[64];
  iot_mkdtemp(dir, sizeof dir);
  make_set(dir, "train", 10, 10);
  for (int which = 0; which < 2; which++) {
    int failures = 0;
    for (uint64_t n = 1; n < 50; n++) {
      size_t before = iot_pool_bytes();
      loom_dataset *d = NULL;
      loom_loader *l = NULL;
      loom_tensor *x = NULL, *y = NULL;
      int rc;
      if (which == 0) {
        loom_alloc_fail_nth(n);
        rc = loom_mnist_load(dir, LOOM_SPLIT_TRAIN, &d);
        loom_alloc_fail_nth(0);
      } else {
        LT_OK(loom_mnist_load(dir, LOOM_SPLIT_TRAIN, &d));
        before = iot_pool_bytes();
        loom_loader_cfg c = loom_loader_cfg_default();
        loom_alloc_fail_nth(n);
        rc = loom_loader_create(d, &c, &l);
        if (!rc) rc = loom_loader_batch(l, 0, 0, &x, &y);
        loom_alloc_fail_nth(0);
        if (rc) LT_TRUE(x == NULL && y == NULL);
        loom_tensor_free(x), loom_tensor_free(y);
        loom_loader_free(l);
      }
      if (which == 1) LT_EQ(iot_pool_bytes(), before);
      loom_dataset_free(d);
      if (which == 0) LT_EQ(iot_pool_bytes(), before);
      if (rc == LOOM_OK) break;
      LT_EQ(rc, LOOM_ENOMEM);
      failures++;
    }
    LT_TRUE(failures >= 2);
  }
  iot_rmdir(dir);
}
