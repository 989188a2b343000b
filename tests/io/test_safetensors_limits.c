/* test_safetensors_limits.c: what a hostile safetensors header cannot do any more: make the
 * duplicate-key check quadratic (100,000 metadata keys, the cap, are checked in well under a
 * second; the 200,000 took 109 s), pass the key and tensor caps, or be called an
 * "overlap" when two entries are the same byte range; and what a hostile path cannot do:
 * block an open (a FIFO with no writer) or pass for a regular file (a folder). */
#include "lt.h"
#include "io_test.h"

#include <errno.h>

/* A header {"__metadata__":{"k0":"v","k1":"v",...}} of n keys, key `dup` (if < n) a copy of
 * key 0, and no tensors. */
static unsigned char *many_keys(size_t n, size_t dup, size_t *size) {
  size_t cap = 64 + n * 24;
  char *json = malloc(cap);
  size_t len = (size_t)snprintf(json, cap, "{\"__metadata__\":{");
  for (size_t i = 0; i < n; i++)
    len += (size_t)snprintf(json + len, cap - len, "%s\"k%zu\":\"v\"", i ? "," : "", i == dup ? 0 : i);
  snprintf(json + len, cap - len, "}}");
  unsigned char *b = iot_st_build(json, NULL, 0, size);
  free(json);
  return b;
}

LT_TEST(safetensors_many_metadata_keys_are_checked_fast_and_capped) {
  size_t size = 0;
  loom_safetensors *f = NULL;
  unsigned char *b = many_keys(LOOM_SAFETENSORS_MAX_META, (size_t)-1, &size);
  double t0 = iot_now();
  LT_OK(loom_safetensors_open_memory(b, size, "keys", &f));
  double dt = iot_now() - t0;
  LT_EQ(loom_safetensors_meta_count(f), LOOM_SAFETENSORS_MAX_META);
  loom_safetensors_free(f);
  free(b);
  if (dt >= 5.0) fprintf(stderr, "100000 keys took %.1f s\n", dt);
  LT_TRUE(dt < 5.0); /* pairwise: about 27 s for 100,000 keys */
  /* a repeated key at the very end is found */
  b = many_keys(LOOM_SAFETENSORS_MAX_META, LOOM_SAFETENSORS_MAX_META - 1, &size);
  t0 = iot_now();
  LT_ERR(loom_safetensors_open_memory(b, size, "keys", &f), LOOM_EFORMAT,
         "keys: metadata key \"k0\" appears twice");
  LT_TRUE(iot_now() - t0 < 5.0);
  free(b);
  /* one over the cap, and the 200,000 */
  const size_t over[2] = {LOOM_SAFETENSORS_MAX_META + 1, 200000};
  for (int i = 0; i < 2; i++) {
    b = many_keys(over[i], (size_t)-1, &size);
    t0 = iot_now();
    LT_ERR(loom_safetensors_open_memory(b, size, "keys", &f), LOOM_EFORMAT,
           "more than 100000 metadata keys (loom's limit)");
    LT_TRUE(iot_now() - t0 < 5.0);
    free(b);
  }
}

LT_TEST(safetensors_tensor_count_is_capped) {
  size_t n = LOOM_SAFETENSORS_MAX_TENSORS + 1, cap = 64 + n * 64;
  char *json = malloc(cap);
  size_t len = (size_t)snprintf(json, cap, "{");
  for (size_t i = 0; i < n; i++)
    len += (size_t)snprintf(json + len, cap - len,
                            "%s\"t%zu\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}",
                            i ? "," : "", i);
  snprintf(json + len, cap - len, "}");
  size_t size = 0;
  unsigned char *b = iot_st_build(json, NULL, 0, &size);
  free(json);
  loom_safetensors *f = NULL;
  LT_ERR(loom_safetensors_open_memory(b, size, "tensors", &f), LOOM_EFORMAT,
         "more than 100000 tensors (loom's limit)");
  free(b);
}

LT_TEST(safetensors_identical_entries_are_called_duplicates) {
  static const float data[2] = {1, 2};
  size_t size = 0;
  unsigned char *b = iot_st_build(
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
      data, sizeof data, &size);
  loom_safetensors *f = NULL;
  LT_ERR(loom_safetensors_open_memory(b, size, "dup", &f), LOOM_EFORMAT,
         "tensor \"b\": data_offsets [0, 8] are the same as those of tensor \"a\" (a duplicate "
         "entry for one byte range)");
  free(b);
  /* two empty tensors at one offset are fine */
  b = iot_st_build("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}",
                   NULL, 0, &size);
  LT_OK(loom_safetensors_open_memory(b, size, "empty", &f));
  loom_safetensors_free(f);
  free(b);
}

/* ---- paths that are not regular files --------------------------------------------------- */

static const char *fifo_path;

/* In the child: each reader refuses the FIFO with "not a regular file". */
static int open_fifo(void *arg) {
  (void)arg;
  loom_safetensors *f = NULL;
  loom_idx *x = NULL;
  if (loom_safetensors_open(fifo_path, 0, &f) != LOOM_EIO) return 1;
  if (!strstr(loom_last_error(), "is not a regular file")) return 2;
  if (loom_checkpoint_load(fifo_path, NULL, 0, NULL) != LOOM_EIO) return 3;
  if (loom_idx_read(fifo_path, &x) != LOOM_EIO) return 4;
  if (!strstr(loom_last_error(), "is not a regular file")) return 5;
  return 0;
}

LT_TEST(readers_refuse_a_fifo_without_blocking) {
  char dir[64], path[128];
  iot_mkdtemp(dir, sizeof dir);
  iot_path(path, sizeof path, dir, "fifo");
  LT_EQ(mkfifo(path, 0600), 0);
  fifo_path = path;
  double t0 = iot_now();
  LT_EQ(iot_run_limited(open_fifo, NULL, 20), 0); /* -1: it blocked in open() */
  LT_TRUE(iot_now() - t0 < 20);
  /* a folder is not a regular file either */
  loom_safetensors *f = NULL;
  LT_ERR(loom_safetensors_open(dir, 0, &f), LOOM_EIO, "is not a regular file");
  loom_idx *x = NULL;
  LT_ERR(loom_idx_read(dir, &x), LOOM_EIO, "is not a regular file");
  unlink(path);
  iot_rmdir(dir);
}
