/* dataset.c: an MNIST-family dataset (u8 images with u8 labels) from a pair of IDX files, and
 * the Fashion-MNIST layout of Debian's dataset-fashion-mnist package (gzip'd or not). Checked
 * when loaded, naming the file: at least one image, as many labels as images; and on request
 * (loom_dataset_check) against a model: the image size and every label below the number of
 * classes, naming the file and the index. */
#include "io/io_int.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

struct loom_dataset {
  loom_idx *images, *labels;
  size_t n, rows, cols;
  char *images_path, *labels_path; /* for messages */
};

void loom_dataset_free(loom_dataset *d) {
  if (!d) return;
  loom_idx_free(d->images);
  loom_idx_free(d->labels);
  loom__free(d->images_path);
  loom__free(d->labels_path);
  loom__free(d);
}

int loom_dataset_from_idx(const char *images_path, const char *labels_path, loom_dataset **out) {
  const char *who = "loom_dataset_from_idx";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  int rc = LOOM_OK;
  loom_dataset *d = loom__calloc(LOOM_POOL_META, 1, sizeof *d);
  LOOM_TRY_ALLOC(d, "the dataset");
  if (!images_path || !labels_path) {
    rc = loom__fail(LOOM_EINVAL, "%s: a path is NULL", who);
    goto done;
  }
  d->images_path = loom__strdup(LOOM_POOL_META, images_path);
  d->labels_path = loom__strdup(LOOM_POOL_META, labels_path);
  if (!d->images_path || !d->labels_path) {
    rc = loom__fail(LOOM_ENOMEM, "%s: out of memory for the paths", who);
    goto done;
  }
  LOOM_TRY(loom_idx_read(images_path, &d->images));
  LOOM_TRY(loom_idx_read(labels_path, &d->labels));
  loom_idx_info im, lb;
  loom_idx_get_info(d->images, &im);
  loom_idx_get_info(d->labels, &lb);
  if (im.type != 0x08 || im.ndim != 3) {
    rc = loom__fail(LOOM_EFORMAT, "%s: '%s' is not u8 images (type 0x%02x, %d dims; want 0x08, 3)",
                    who, images_path, im.type, im.ndim);
    goto done;
  }
  if (lb.type != 0x08 || lb.ndim != 1) {
    rc = loom__fail(LOOM_EFORMAT, "%s: '%s' is not u8 labels (type 0x%02x, %d dims; want 0x08, 1)",
                    who, labels_path, lb.type, lb.ndim);
    goto done;
  }
  if (im.dims[0] != lb.dims[0]) {
    rc = loom__fail(LOOM_EFORMAT, "%s: '%s' has %u images but '%s' has %u labels", who,
                    images_path, im.dims[0], labels_path, lb.dims[0]);
    goto done;
  }
  if (im.dims[0] == 0) {
    rc = loom__fail(LOOM_EFORMAT, "%s: '%s' holds no images", who, images_path);
    goto done;
  }
  if (im.dims[1] == 0 || im.dims[2] == 0) {
    rc = loom__fail(LOOM_EFORMAT, "%s: '%s' holds images of %ux%u pixels", who, images_path,
                    im.dims[1], im.dims[2]);
    goto done;
  }
  d->n = im.dims[0], d->rows = im.dims[1], d->cols = im.dims[2];
  *out = d;
  return LOOM_OK;
done:
  loom_dataset_free(d);
  return rc;
}

/* dir/name.gz if it exists, else dir/name if it exists; LOOM_ENOTFOUND otherwise. */
static int locate(const char *who, const char *dir, const char *name, char *path, size_t cap) {
  snprintf(path, cap, "%s/%s.gz", dir, name);
  if (access(path, F_OK) == 0) return LOOM_OK;
  snprintf(path, cap, "%s/%s", dir, name);
  if (access(path, F_OK) == 0) return LOOM_OK;
  return loom__fail(LOOM_ENOTFOUND,
                    "%s: no %s[.gz] in '%s' (install the Debian package dataset-fashion-mnist, or "
                    "give the folder that holds the files)",
                    who, name, dir);
}

/* The image and label files of a split in dir (NULL: the Debian package's folder). */
static int mnist_paths(const char *who, const char *dir, loom_split split, char *images,
                       char *labels, size_t cap) {
  if (split != LOOM_SPLIT_TRAIN && split != LOOM_SPLIT_TEST)
    return loom__fail(LOOM_EINVAL, "%s: split %d is neither train nor test", who, (int)split);
  if (!dir) dir = LOOM_FASHION_MNIST_DIR;
  const char *prefix = split == LOOM_SPLIT_TRAIN ? "train" : "t10k";
  char name[64];
  snprintf(name, sizeof name, "%s-images-idx3-ubyte", prefix);
  int rc = locate(who, dir, name, images, cap);
  if (rc) return rc;
  snprintf(name, sizeof name, "%s-labels-idx1-ubyte", prefix);
  return locate(who, dir, name, labels, cap);
}

int loom_mnist_load(const char *dir, loom_split split, loom_dataset **out) {
  const char *who = "loom_mnist_load";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  char images[4096], labels[4096];
  int rc = mnist_paths(who, dir, split, images, labels, sizeof images);
  return rc ? rc : loom_dataset_from_idx(images, labels, out);
}

int loom_mnist_bytes(const char *dir, loom_split split, size_t *count, size_t *bytes) {
  const char *who = "loom_mnist_bytes";
  if (!count || !bytes) return loom__fail(LOOM_EINVAL, "%s: an output is NULL", who);
  char images[4096], labels[4096];
  int rc = mnist_paths(who, dir, split, images, labels, sizeof images);
  size_t im = 0, lb = 0;
  if (!rc) rc = loom_idx_data_bytes(images, &im);
  if (!rc) rc = loom_idx_data_bytes(labels, &lb);
  if (rc) return rc;
  *count = lb; /* u8 labels: one byte each (loom_dataset_from_idx checks the rest) */
  *bytes = im + lb;
  return LOOM_OK;
}

int loom_dataset_check(const loom_dataset *d, size_t classes, size_t rows, size_t cols) {
  const char *who = "loom_dataset_check";
  if (!d) return loom__fail(LOOM_EINVAL, "%s: dataset is NULL", who);
  if ((rows && d->rows != rows) || (cols && d->cols != cols))
    return loom__fail(LOOM_EFORMAT, "%s: '%s' holds images of %zux%zu pixels, expected %zux%zu",
                      who, d->images_path, d->rows, d->cols, rows ? rows : d->rows,
                      cols ? cols : d->cols);
  const uint8_t *y = loom_dataset_labels(d);
  for (size_t i = 0; classes && i < d->n; i++)
    if (y[i] >= classes)
      return loom__fail(LOOM_EFORMAT, "%s: '%s': label %u at index %zu is not below %zu (the "
                        "number of classes)", who, d->labels_path, y[i], i, classes);
  return LOOM_OK;
}

size_t loom_dataset_size(const loom_dataset *d) { return d ? d->n : 0; }
size_t loom_dataset_rows(const loom_dataset *d) { return d ? d->rows : 0; }
size_t loom_dataset_cols(const loom_dataset *d) { return d ? d->cols : 0; }

const uint8_t *loom_dataset_images(const loom_dataset *d) {
  if (!d) return NULL;
  loom_idx_info in;
  loom_idx_get_info(d->images, &in);
  return in.data;
}

const uint8_t *loom_dataset_labels(const loom_dataset *d) {
  if (!d) return NULL;
  loom_idx_info in;
  loom_idx_get_info(d->labels, &in);
  return in.data;
}
