/* loader.c: batches of a dataset: the epoch's order (identity, or a seeded Fisher-Yates
 * shuffle driven by SplitMix64, so it is the same on every run and machine), normalisation
 * through a 256-entry table computed as torchvision does (x/255, then (x-mean)/std in f32),
 * and the image and label tensors of one batch. */
#include "io/io_int.h"

#include <math.h>
#include <string.h>

struct loom_loader {
  const loom_dataset *d;
  loom_loader_cfg cfg;
  uint32_t *order;
  uint64_t epoch;
  bool have_order;
  float lut[256];
};

loom_loader_cfg loom_loader_cfg_default(void) {
  return (loom_loader_cfg){.batch = 256,
                           .shuffle = true,
                           .mean = LOOM_FASHION_MNIST_MEAN,
                           .std = LOOM_FASHION_MNIST_STD,
                           .label_dtype = LOOM_I64};
}

int loom_loader_cfg_validate(const loom_loader_cfg *c) {
  if (!c) return loom__fail(LOOM_EINVAL, "loom_loader_cfg: cfg is NULL");
  if (c->batch == 0) return loom__fail(LOOM_EINVAL, "loom_loader_cfg: batch = 0 must be >= 1");
  if (c->norm != LOOM_NORM_UNIT && c->norm != LOOM_NORM_STANDARD)
    return loom__fail(LOOM_EINVAL, "loom_loader_cfg: norm %d is not a normalisation", (int)c->norm);
  if (c->norm == LOOM_NORM_STANDARD && (!(c->std > 0) || !isfinite(c->std)))
    return loom__fail(LOOM_EINVAL, "loom_loader_cfg: std = %g must be finite and > 0", c->std);
  if (c->norm == LOOM_NORM_STANDARD && !isfinite(c->mean))
    return loom__fail(LOOM_EINVAL, "loom_loader_cfg: mean = %g must be finite", c->mean);
  if (c->label_dtype != LOOM_I64 && c->label_dtype != LOOM_I32)
    return loom__fail(LOOM_EINVAL, "loom_loader_cfg: label_dtype %s is not i64 or i32",
                      loom_dtype_name(c->label_dtype));
  return LOOM_OK;
}

void loom_loader_free(loom_loader *l) {
  if (!l) return;
  loom__free(l->order);
  loom__free(l);
}

int loom_loader_create(const loom_dataset *d, const loom_loader_cfg *cfg, loom_loader **out) {
  if (!out) return loom__fail(LOOM_EINVAL, "loom_loader_create: out is NULL");
  *out = NULL;
  if (!d) return loom__fail(LOOM_EINVAL, "loom_loader_create: dataset is NULL");
  int rc = loom_loader_cfg_validate(cfg);
  if (rc) return rc;
  size_t n = loom_dataset_size(d);
  if (n > UINT32_MAX)
    return loom__fail(LOOM_EOVERFLOW, "loom_loader_create: %zu samples exceed 2^32", n);
  loom_loader *l = loom__calloc(LOOM_POOL_META, 1, sizeof *l);
  if (!l) return loom__fail(LOOM_ENOMEM, "loom_loader_create: out of memory");
  l->order = loom__malloc(LOOM_POOL_META, (n ? n : 1) * sizeof *l->order);
  if (!l->order) {
    loom_loader_free(l);
    return loom__fail(LOOM_ENOMEM, "loom_loader_create: out of memory for %zu indices", n);
  }
  l->d = d;
  l->cfg = *cfg;
  for (int v = 0; v < 256; v++) {
    float x = (float)v / 255.0f;
    l->lut[v] = cfg->norm == LOOM_NORM_STANDARD ? (x - cfg->mean) / cfg->std : x;
  }
  *out = l;
  return LOOM_OK;
}

size_t loom_loader_batches(const loom_loader *l) {
  if (!l) return 0;
  size_t n = loom_dataset_size(l->d), b = l->cfg.batch;
  return l->cfg.drop_last ? n / b : (n + b - 1) / b;
}

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
  z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
  return z ^ (z >> 31);
}

static void make_order(loom_loader *l, uint64_t epoch) {
  if (l->have_order && l->epoch == epoch) return;
  size_t n = loom_dataset_size(l->d);
  for (size_t i = 0; i < n; i++) l->order[i] = (uint32_t)i;
  if (l->cfg.shuffle && n > 1) {
    uint64_t s = l->cfg.seed ^ (epoch * UINT64_C(0x9E3779B97F4A7C15));
    for (size_t i = n - 1; i > 0; i--) {
      uint64_t bound = (uint64_t)i + 1, threshold = (0 - bound) % bound, r;
      do r = splitmix64(&s);
      while (r < threshold);
      size_t j = (size_t)(r % bound);
      uint32_t t = l->order[i];
      l->order[i] = l->order[j], l->order[j] = t;
    }
  }
  l->epoch = epoch;
  l->have_order = true;
}

int loom_loader_order(loom_loader *l, uint64_t epoch, const uint32_t **order) {
  if (!l || !order) return loom__fail(LOOM_EINVAL, "loom_loader_order: NULL argument");
  make_order(l, epoch);
  *order = l->order;
  return LOOM_OK;
}

int loom_loader_batch(loom_loader *l, uint64_t epoch, size_t index, loom_tensor **x,
                      loom_tensor **y) {
  const char *who = "loom_loader_batch";
  if (x) *x = NULL;
  if (y) *y = NULL;
  if (!l || !x || !y) return loom__fail(LOOM_EINVAL, "%s: NULL argument", who);
  size_t nb = loom_loader_batches(l);
  if (index >= nb)
    return loom__fail(LOOM_EINVAL, "%s: batch %zu out of range (%zu batches)", who, index, nb);
  make_order(l, epoch);
  size_t n = loom_dataset_size(l->d), first = index * l->cfg.batch;
  size_t b = n - first < l->cfg.batch ? n - first : l->cfg.batch;
  size_t rows = loom_dataset_rows(l->d), cols = loom_dataset_cols(l->d), px = rows * cols;
  int64_t flat[2] = {(int64_t)b, (int64_t)px};
  int64_t img[4] = {(int64_t)b, 1, (int64_t)rows, (int64_t)cols};
  int64_t lab[1] = {(int64_t)b};
  int rc = LOOM_OK;
  LOOM_TRY(l->cfg.flatten ? loom_tensor_empty(LOOM_F32, 2, flat, x)
                          : loom_tensor_empty(LOOM_F32, 4, img, x));
  LOOM_TRY(loom_tensor_empty(l->cfg.label_dtype, 1, lab, y));
  float *xd = loom_tensor_data(*x);
  void *yd = loom_tensor_data(*y);
  const uint8_t *images = loom_dataset_images(l->d), *labels = loom_dataset_labels(l->d);
  for (size_t i = 0; i < b; i++) {
    uint32_t s = l->order[first + i];
    const uint8_t *src = images + (size_t)s * px;
    float *dst = xd + i * px;
    for (size_t k = 0; k < px; k++) dst[k] = l->lut[src[k]];
    if (l->cfg.label_dtype == LOOM_I64) ((int64_t *)yd)[i] = labels[s];
    else ((int32_t *)yd)[i] = labels[s];
  }
  return LOOM_OK;
done:
  loom_tensor_free(*x);
  *x = NULL;
  return rc;
}
