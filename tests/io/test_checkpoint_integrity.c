/* test_checkpoint_integrity.c: a checkpoint's CRC covers the whole file: a changed step in the
 * header metadata and every single-bit flip anywhere in the file are refused; the CRC is the
 * one io.h documents (recomputed here with zlib from the file's bytes) and the file stays a
 * plain safetensors file; the older data-only format is refused by name; entries' value checks
 * refuse NaN, infinity and negative values by tensor and element, before any buffer is
 * written. */
#include "lt.h"
#include "io_test.h"

#include <zlib.h>

/* A small checkpoint dir/ck.safetensors (path): a 2x3 weight, an i64 word and metadata
 * step = "2"; its bytes (malloc'd). */
static unsigned char *save_small(char *dir, char *path, size_t *n) {
  iot_mkdtemp(dir, 64);
  iot_path(path, 128, dir, "ck.safetensors");
  float w[6] = {1, -2, 3.5f, 0, -0.25f, 8};
  int64_t words[2] = {7, INT64_MAX};
  loom_checkpoint_entry e[2] = {
      {.name = "model.w", .dtype = LOOM_F32, .ndim = 2, .shape = {2, 3}, .data = w},
      {.name = "words", .dtype = LOOM_I64, .ndim = 1, .shape = {2}, .data = words},
  };
  loom_safetensors_meta_kv kv[2] = {{"step", "2"}, {"epoch", "0"}};
  LT_OK(loom_checkpoint_save(path, e, 2, kv, 2));
  unsigned char *b = iot_read(path, n);
  LT_TRUE(b != NULL);
  return b;
}

static unsigned char *find(unsigned char *b, size_t n, const char *s) {
  size_t k = strlen(s);
  for (size_t i = 0; i + k <= n; i++)
    if (memcmp(b + i, s, k) == 0) return b + i;
  return NULL;
}

LT_TEST(checkpoint_crc_covers_the_header) {
  char dir[64], path[128], bad[128];
  size_t n = 0;
  unsigned char *b = save_small(dir, path, &n);
  iot_path(bad, sizeof bad, dir, "bad.safetensors");
  /* the case: "step":"2" becomes "step":"6", the data untouched */
  unsigned char *step = find(b, n, "\"step\":\"2\"");
  LT_TRUE(step != NULL);
  step[8] = '6';
  LT_EQ(iot_write(bad, b, n), 0);
  LT_ERR(loom_checkpoint_load(bad, NULL, 0, NULL), LOOM_EFORMAT, "(corrupt file)");
  step[8] = '2';
  /* every single-bit flip anywhere: length, JSON, padding, the CRC digits, the data */
  int accepted = 0;
  for (size_t i = 0; i < n; i++) {
    b[i] ^= (unsigned char)(1u << (i % 8));
    LT_EQ(iot_write(bad, b, n), 0);
    loom_safetensors *f = NULL;
    if (loom_checkpoint_load(bad, NULL, 0, &f) == LOOM_OK) {
      accepted++;
      fprintf(stderr, "a flip of byte %zu was accepted\n", i);
    }
    loom_safetensors_free(f);
    b[i] ^= (unsigned char)(1u << (i % 8));
  }
  LT_EQ(accepted, 0);
  /* and the untouched bytes still load */
  LT_EQ(iot_write(bad, b, n), 0);
  LT_OK(loom_checkpoint_load(bad, NULL, 0, NULL));
  free(b);
  iot_rmdir(dir);
}

LT_TEST(checkpoint_crc_is_the_documented_one) {
  char dir[64], path[128];
  size_t n = 0;
  unsigned char *b = save_small(dir, path, &n);
  /* "loom.crc32" is the last metadata key, its value 8 lowercase hex digits in quotes */
  unsigned char *at = find(b, n, "\"loom.crc32\":\"");
  LT_TRUE(at != NULL);
  unsigned char *digits = at + strlen("\"loom.crc32\":\"");
  LT_TRUE(digits[8] == '"' && digits[9] == '}');
  char want[9];
  memcpy(want, digits, 8);
  want[8] = 0;
  /* zlib.crc32(b[:i] + b"00000000" + b[i + 8:]) */
  memcpy(digits, "00000000", 8);
  char have[16];
  snprintf(have, sizeof have, "%08lx", crc32(0, b, (uInt)n));
  LT_STREQ(have, want);
  free(b);
  /* a plain safetensors file: any reader takes it, the metadata as written */
  loom_safetensors *f = NULL;
  LT_OK(loom_safetensors_open(path, 0, &f));
  LT_STREQ(loom_safetensors_meta(f, "loom.crc32"), want);
  LT_STREQ(loom_safetensors_meta(f, "step"), "2");
  LT_EQ(loom_safetensors_count(f), 2);
  loom_safetensors_free(f);
  LT_OK(loom_checkpoint_open(path, &f));
  loom_safetensors_free(f);
  iot_rmdir(dir);
}

LT_TEST(checkpoint_older_format_and_bad_crc_fields_are_refused) {
  char dir[64], path[128];
  size_t n = 0;
  free(save_small(dir, path, &n)); /* a good checkpoint, each file below written over it */
  LT_OK(loom_checkpoint_load(path, NULL, 0, NULL));
  float w[2] = {1, 2};
  loom_safetensors_entry e = {.name = "w", .dtype = LOOM_F32, .ndim = 1, .shape = (int64_t[]){2}, .data = w};
  char crc[16];
  snprintf(crc, sizeof crc, "%08lx", crc32(0, (const Bytef *)w, sizeof w));
  loom_safetensors_meta_kv v1[2] = {{"loom.format", "checkpoint/1"}, {"loom.crc32", crc}};
  LT_OK(loom_safetensors_write(path, &e, 1, v1, 2));
  LT_ERR(loom_checkpoint_load(path, NULL, 0, NULL), LOOM_EFORMAT, "older loom (checkpoint/1");
  loom_safetensors_meta_kv v2[2] = {{"loom.format", "checkpoint/2"}, {"loom.crc32", "0000000G"}};
  LT_OK(loom_safetensors_write(path, &e, 1, v2, 2));
  LT_ERR(loom_checkpoint_load(path, NULL, 0, NULL), LOOM_EFORMAT, "not 8 lowercase hex digits");
  LT_OK(loom_safetensors_write(path, &e, 1, v2, 1));
  LT_ERR(loom_checkpoint_load(path, NULL, 0, NULL), LOOM_EFORMAT, "\"loom.crc32\" is missing");
  iot_rmdir(dir);
}

LT_TEST(checkpoint_entry_checks_refuse_nonfinite_and_negative_values) {
  char dir[64], path[128];
  iot_mkdtemp(dir, sizeof dir);
  iot_path(path, sizeof path, dir, "ck.safetensors");
  float w[4] = {1, 2, -0.0f, 4}, sq[4] = {0, 1, -0.0f, 2};
  loom_checkpoint_entry e[2] = {
      {.name = "model.w", .dtype = LOOM_F32, .ndim = 1, .shape = {4}, .data = w,
       .checks = LOOM_CHECK_FINITE},
      {.name = "optim.w.exp_avg_sq", .dtype = LOOM_F32, .ndim = 1, .shape = {4}, .data = sq,
       .checks = LOOM_CHECK_FINITE | LOOM_CHECK_NONNEG},
  };
  float w2[4] = {9, 9, 9, 9}, sq2[4] = {9, 9, 9, 9};
  loom_checkpoint_entry r[2] = {e[0], e[1]};
  r[0].data = w2, r[1].data = sq2;
  LT_OK(loom_checkpoint_save(path, e, 2, NULL, 0));
  LT_OK(loom_checkpoint_load(path, r, 2, NULL)); /* -0 is not below zero */
  LT_TRUE(memcmp(w, w2, sizeof w) == 0 && memcmp(sq, sq2, sizeof sq) == 0);
  const struct { int which; size_t at; float v; const char *want; } cases[] = {
      {0, 2, NAN, "tensor \"model.w\" holds nan at element 2: its values must be finite"},
      {0, 3, -INFINITY, "tensor \"model.w\" holds -inf at element 3"},
      {1, 1, -1e-30f, "\"optim.w.exp_avg_sq\" holds -1e-30 at element 1: its values must be finite and >= 0"},
      {1, 0, INFINITY, "\"optim.w.exp_avg_sq\" holds inf at element 0"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    float *buf = cases[i].which ? sq : w, keep = buf[cases[i].at];
    buf[cases[i].at] = cases[i].v;
    LT_OK(loom_checkpoint_save(path, e, 2, NULL, 0));
    buf[cases[i].at] = keep;
    memset(w2, 0, sizeof w2);
    LT_ERR(loom_checkpoint_load(path, r, 2, NULL), LOOM_EFORMAT, cases[i].want);
    LT_TRUE(w2[0] == 0 && w2[1] == 0); /* nothing copied */
  }
  /* without checks the same values load */
  r[0].checks = r[1].checks = 0;
  LT_OK(loom_checkpoint_load(path, r, 2, NULL));
  LT_TRUE(isinf(sq2[0]));
  iot_rmdir(dir);
}

LT_TEST(safetensors_check_values_every_float_dtype) {
  /* F16 inf, BF16 NaN, F64 -1: each named; I32 always passes */
  const uint16_t f16[3] = {0x3c00, 0x7c00, 0}, bf16[2] = {0x3f80, 0x7fc1};
  const double f64[2] = {0.5, -1.0};
  const int32_t i32[1] = {-5};
  unsigned char data[6 + 4 + 16 + 4];
  memcpy(data, f16, 6);
  memcpy(data + 6, bf16, 4);
  memcpy(data + 10, f64, 16); /* not 8-aligned in the file: read byte by byte */
  memcpy(data + 26, i32, 4);
  size_t size = 0;
  unsigned char *b = iot_st_build(
      "{\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]},"
      "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[6,10]},"
      "\"d\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[10,26]},"
      "\"i\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[26,30]}}",
      data, sizeof data, &size);
  loom_safetensors *f = NULL;
  LT_OK(loom_safetensors_open_memory(b, size, "mem", &f));
  free(b);
  LT_ERR(loom_safetensors_check_values(f, "h", LOOM_CHECK_FINITE), LOOM_EFORMAT,
         "mem: tensor \"h\" holds inf at element 1");
  LT_OK(loom_safetensors_check_values(f, "h", LOOM_CHECK_NONNEG));
  LT_ERR(loom_safetensors_check_values(f, "b", LOOM_CHECK_FINITE), LOOM_EFORMAT,
         "tensor \"b\" holds nan at element 1");
  LT_OK(loom_safetensors_check_values(f, "b", LOOM_CHECK_NONNEG)); /* NaN is FINITE's */
  LT_OK(loom_safetensors_check_values(f, "d", LOOM_CHECK_FINITE));
  LT_ERR(loom_safetensors_check_values(f, "d", LOOM_CHECK_NONNEG), LOOM_EFORMAT,
         "tensor \"d\" holds -1 at element 1: its values must be >= 0");
  LT_OK(loom_safetensors_check_values(f, "i", LOOM_CHECK_FINITE | LOOM_CHECK_NONNEG));
  LT_ERR(loom_safetensors_check_values(f, "nope", LOOM_CHECK_FINITE), LOOM_ENOTFOUND, "nope");
  LT_ERR(loom_safetensors_check_values(f, "h", 4), LOOM_EINVAL, "unknown checks");
  loom_safetensors_free(f);
}
