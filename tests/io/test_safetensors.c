/* test_safetensors.c: safetensors against the format: byte-exact output for the reference
 * implementation's own test vectors (huggingface/safetensors, tensor.rs: test_serialization,
 * test_empty, test_serialization_forced_alignement), a hand-built file with dtypes loom does
 * not hold, a round trip of every loom dtype (read into memory and mapped, copies and views),
 * rejection of each kind of corrupt file with its message, writer argument errors, atomic
 * writes (no file and no temporary left on failure, an old file untouched), never over what is
 * not a regular file (a FIFO, /dev/null, a symlink to a FIFO or to nothing, a folder: refused,
 * left as they were; through a symlink to a regular file) and OOM sweeps. */
#include "lt.h"
#include "io_test.h"

#include <signal.h>
#include <sys/resource.h>

static const float six[6] = {0, 1, 2, 3, 4, 5};

/* Writes `tensors` with loom and compares the file's bytes with `want`. */
static void expect_bytes(const loom_safetensors_entry *t, size_t n,
                         const loom_safetensors_meta_kv *m, size_t nm, const unsigned char *want,
                         size_t wlen) {
  char dir[64], path[128];
  iot_mkdtemp(dir, sizeof dir);
  iot_path(path, sizeof path, dir, "x.safetensors");
  LT_OK(loom_safetensors_write(path, t, n, m, nm));
  size_t len = 0;
  unsigned char *got = iot_read(path, &len);
  LT_EQ(len, wlen);
  LT_TRUE(got && len == wlen && memcmp(got, want, wlen) == 0);
  free(got);
  loom_safetensors *f = NULL;
  LT_OK(loom_safetensors_open(path, 0, &f));
  loom_safetensors_free(f);
  iot_rmdir(dir);
}

LT_TEST(safetensors_writer_matches_reference_vectors) {
  /* test_serialization: "attn.0" F32 [1,2,3] = 0..5 */
  static const unsigned char ser[] = {
      64, 0, 0, 0, 0, 0, 0, 0, 123, 34, 97, 116, 116, 110, 46, 48, 34, 58, 123, 34, 100,
      116, 121, 112, 101, 34, 58, 34, 70, 51, 50, 34, 44, 34, 115, 104, 97, 112, 101, 34,
      58, 91, 49, 44, 50, 44, 51, 93, 44, 34, 100, 97, 116, 97, 95, 111, 102, 102, 115,
      101, 116, 115, 34, 58, 91, 48, 44, 50, 52, 93, 125, 125, 0, 0, 0, 0, 0, 0, 128, 63,
      0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64, 0, 0, 160, 64};
  int64_t s3[] = {1, 2, 3}, s4[] = {1, 1, 2, 3};
  loom_safetensors_entry e = {.name = "attn.0", .dtype = LOOM_F32, .ndim = 3, .shape = s3, .data = six};
  expect_bytes(&e, 1, NULL, 0, ser, sizeof ser);
  /* test_serialization_forced_alignement: "attn0" [1,1,2,3]: 7 spaces of padding */
  static const unsigned char al[] = {
      72, 0, 0, 0, 0, 0, 0, 0, 123, 34, 97, 116, 116, 110, 48, 34, 58, 123, 34, 100, 116,
      121, 112, 101, 34, 58, 34, 70, 51, 50, 34, 44, 34, 115, 104, 97, 112, 101, 34, 58,
      91, 49, 44, 49, 44, 50, 44, 51, 93, 44, 34, 100, 97, 116, 97, 95, 111, 102, 102,
      115, 101, 116, 115, 34, 58, 91, 48, 44, 50, 52, 93, 125, 125, 32, 32, 32, 32, 32,
      32, 32, 0, 0, 0, 0, 0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64, 0, 0,
      160, 64};
  e = (loom_safetensors_entry){.name = "attn0", .dtype = LOOM_F32, .ndim = 4, .shape = s4, .data = six};
  expect_bytes(&e, 1, NULL, 0, al, sizeof al);
  /* test_empty: no tensors; then metadata {"framework": "pt"} */
  static const unsigned char empty[] = {8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32};
  expect_bytes(NULL, 0, NULL, 0, empty, sizeof empty);
  static const unsigned char fw[] = {
      40, 0, 0, 0, 0, 0, 0, 0, 123, 34, 95, 95, 109, 101, 116, 97, 100, 97, 116, 97, 95,
      95, 34, 58, 123, 34, 102, 114, 97, 109, 101, 119, 111, 114, 107, 34, 58, 34, 112,
      116, 34, 125, 125, 32, 32, 32, 32, 32};
  loom_safetensors_meta_kv kv = {"framework", "pt"};
  expect_bytes(NULL, 0, &kv, 1, fw, sizeof fw);
}

LT_TEST(safetensors_reads_hand_built_file) {
  /* tensors out of name order, U8 and I64 among them, metadata, whitespace, escapes */
  int64_t i64[2] = {-5, 1LL << 40};
  unsigned char data[16 + 3 + 1];
  memcpy(data, i64, 16);
  data[16] = 7, data[17] = 8, data[18] = 9, data[19] = 1;
  size_t size;
  unsigned char *b = iot_st_build(
      "{ \"z\\u00e9\" : {\"shape\": [3], \"dtype\": \"U8\", \"data_offsets\": [16, 19]},\n"
      "  \"__metadata__\": {\"step\": \"42\", \"lr\": \"0.001\", \"q\\\"\": \"\\ud83d\\ude00\"},\n"
      "  \"a\": {\"dtype\": \"I64\", \"shape\": [2], \"data_offsets\": [0, 16]},\n"
      "  \"flag\": {\"dtype\": \"BOOL\", \"shape\": [], \"data_offsets\": [19, 20]} }   ",
      data, sizeof data, &size);
  loom_safetensors *f = NULL;
  LT_OK(loom_safetensors_open_memory(b, size, "hand.safetensors", &f));
  free(b);
  if (!f) return;
  LT_EQ(loom_safetensors_count(f), 3);
  loom_safetensors_info in;
  LT_OK(loom_safetensors_info_at(f, 0, &in)); /* data order */
  LT_STREQ(in.name, "a");
  LT_OK(loom_safetensors_info_at(f, 1, &in));
  LT_STREQ(in.name, "z\xc3\xa9");
  LT_STREQ(in.dtype_name, "U8");
  LT_TRUE(!in.has_loom_dtype);
  LT_EQ(in.numel, 3);
  LT_EQ(((const uint8_t *)in.data)[2], 9);
  LT_OK(loom_safetensors_find(f, "flag", &in));
  LT_EQ(in.ndim, 0);
  LT_EQ(in.numel, 1);
  loom_tensor *t = NULL;
  LT_OK(loom_safetensors_get(f, "a", &t));
  int64_t got[2] = {0};
  LT_OK(loom_tensor_read(t, LOOM_I64, got, sizeof got));
  LT_EQ(got[0], -5);
  LT_EQ(got[1], 1LL << 40);
  loom_tensor_free(t);
  LT_ERR(loom_safetensors_get(f, "z\xc3\xa9", &t), LOOM_EDTYPE, "has dtype U8, which loom cannot hold");
  LT_ERR(loom_safetensors_get(f, "nope", &t), LOOM_ENOTFOUND, "hand.safetensors has no tensor \"nope\"");
  LT_TRUE(t == NULL);
  LT_EQ(loom_safetensors_meta_count(f), 3);
  LT_STREQ(loom_safetensors_meta(f, "q\""), "\xf0\x9f\x98\x80");
  int64_t step;
  double lr;
  LT_OK(loom_safetensors_meta_i64(f, "step", &step));
  LT_EQ(step, 42);
  LT_OK(loom_safetensors_meta_f64(f, "lr", &lr));
  LT_NEAR(lr, 0.001, 0);
  LT_ERR(loom_safetensors_meta_i64(f, "lr", &step), LOOM_EFORMAT, "\"0.001\" is not a 64-bit integer");
  LT_ERR(loom_safetensors_meta_i64(f, "none", &step), LOOM_ENOTFOUND, "no metadata \"none\"");
  LT_TRUE(loom_safetensors_meta(f, "none") == NULL);
  loom_safetensors_free(f);
}

/* Every loom dtype, several shapes (a scalar, an empty one), a strided input; read into memory
 * and mapped; copies, views and checked reads give back the same bytes. */
LT_TEST(safetensors_round_trip_every_dtype) {
  char dir[64], path[128];
  iot_mkdtemp(dir, sizeof dir);
  iot_path(path, sizeof path, dir, "rt.safetensors");
  float f32[12];
  for (int i = 0; i < 12; i++) f32[i] = (float)i * 0.37f - 2.0f;
  f32[3] = -0.0f, f32[4] = INFINITY, f32[5] = NAN;
  uint16_t h16[5] = {0x3c00, 0x7bff, 0x0001, 0x8000, 0x7e00}, b16[3] = {0x3f80, 0xff80, 0x0001};
  int32_t i32[4] = {INT32_MIN, -1, 0, INT32_MAX};
  int64_t i64[1] = {INT64_MIN};
  int64_t s34[] = {3, 4}, s5[] = {5}, s13[] = {1, 3}, s40[] = {4, 0};
  loom_tensor *base = NULL, *tr = NULL;
  LT_OK(loom_tensor_from_data(LOOM_F32, 2, s34, f32, &base));
  LT_OK(loom_tensor_transpose(base, 0, 1, &tr)); /* [4, 3], strided */
  loom_safetensors_entry e[] = {
      {.name = "w.f32", .dtype = LOOM_F32, .ndim = 2, .shape = s34, .data = f32},
      {.name = "w.f16", .dtype = LOOM_F16, .ndim = 1, .shape = s5, .data = h16},
      {.name = "w.bf16", .dtype = LOOM_BF16, .ndim = 2, .shape = s13, .data = b16},
      {.name = "w.i32", .dtype = LOOM_I32, .ndim = 1, .shape = s34 + 1, .data = i32},
      {.name = "step", .dtype = LOOM_I64, .ndim = 0, .shape = NULL, .data = i64},
      {.name = "empty", .dtype = LOOM_F32, .ndim = 2, .shape = s40, .data = NULL},
      {.name = "w.T", .tensor = tr},
  };
  loom_safetensors_meta_kv kv[] = {{"format", "pt"}, {"note", "tab\there \"quoted\" \\ / \x01"}};
  LT_OK(loom_safetensors_write(path, e, 7, kv, 2));
  LT_EQ(iot_count(dir), 1); /* no temporary left */
  for (unsigned flags = 0; flags <= LOOM_SAFETENSORS_MMAP; flags++) {
    loom_pool_stats before, during;
    loom_mem_stats(LOOM_POOL_FILE, &before);
    loom_safetensors *f = NULL;
    LT_OK(loom_safetensors_open(path, flags, &f));
    if (!f) break;
    loom_mem_stats(LOOM_POOL_FILE, &during);
    if (flags) LT_TRUE(during.current_bytes > before.current_bytes);
    LT_EQ(loom_safetensors_count(f), 7);
    LT_STREQ(loom_safetensors_meta(f, "note"), "tab\there \"quoted\" \\ / \x01");
    for (int i = 0; i < 6; i++) {
      loom_safetensors_info in;
      LT_OK(loom_safetensors_find(f, e[i].name, &in));
      LT_EQ(in.dtype, e[i].dtype);
      LT_EQ(in.ndim, e[i].ndim);
      size_t nb = in.nbytes;
      LT_TRUE(nb == 0 || memcmp(in.data, e[i].data, nb) == 0);
      loom_tensor *c = NULL, *v = NULL;
      LT_OK(loom_safetensors_get(f, e[i].name, &c));
      LT_OK(loom_safetensors_view(f, e[i].name, &v)); /* aligned: the writer aligns */
      LT_TRUE(c && v && loom_tensor_numel(c) * loom_dtype_size(e[i].dtype) == nb);
      if (c && v && nb) {
        LT_TRUE(memcmp(loom_tensor_data(c), e[i].data, nb) == 0);
        LT_TRUE(loom_tensor_data(v) == in.data);
      }
      loom_tensor_free(c);
      loom_tensor_free(v);
      unsigned char buf[64];
      LT_OK(loom_safetensors_read(f, e[i].name, e[i].dtype, e[i].ndim, e[i].shape, buf));
      LT_TRUE(nb == 0 || memcmp(buf, e[i].data, nb) == 0);
    }
    /* the strided tensor comes back as its contiguous values */
    loom_tensor *c = NULL;
    LT_OK(loom_safetensors_get(f, "w.T", &c));
    if (c) {
      LT_EQ(loom_tensor_dim(c, 0), 4);
      double v;
      LT_OK(loom_tensor_get(c, (int64_t[]){2, 1}, &v));
      LT_NEAR(v, f32[1 * 4 + 2], 0);
    }
    loom_tensor_free(c);
    float small[3];
    LT_ERR(loom_safetensors_read(f, "w.f32", LOOM_F16, 2, s34, small), LOOM_EDTYPE, "is F32, expected f16");
    LT_ERR(loom_safetensors_read(f, "w.f32", LOOM_F32, 1, s34, small), LOOM_ESHAPE,
           "has shape [3, 4], expected [3]");
    loom_safetensors_free(f);
    LT_OK(loom_mem_stats(LOOM_POOL_FILE, &during));
    LT_EQ(during.current_bytes, before.current_bytes);
  }
  loom_tensor_free(tr);
  loom_tensor_free(base);
  iot_rmdir(dir);
}

typedef struct bad_case {
  const char *json;
  size_t dlen;
  const char *msg;
} bad_case;

LT_TEST(safetensors_rejects_each_corruption) {
  static const bad_case cases[] = {
      {"[]", 0, "does not start with '{'"},
      {" {}", 0, "does not start with '{'"},
      {"{\"a\" {}}", 0, "expected ':', found '{'"},
      {"{}x", 0, "characters after the header's JSON object"},
      {"{\"a", 0, "unterminated string"},
      {"{\"a\xff\":{}}", 0, "invalid UTF-8"},
      {"{\"a\xc0\x80\":{}}", 0, "invalid UTF-8"}, /* overlong NUL */
      {"{\"a\x01\":{}}", 0, "control character 0x01"},
      {"{\"a\\x\":{}}", 0, "bad escape '\\x'"},
      {"{\"a\\ud800\":{}}", 0, "without its pair"},
      {"{\"a\\udc00\":{}}", 0, "lone low surrogate"},
      {"{\"a\\u12\":{}}", 0, "bad hex digit"},
      {"{\"a\\u0000\":{}}", 0, "NUL character in a tensor name"},
      {"{\"a\":{\"dtype\":\"F31\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, "unknown dtype \"F31\""},
      {"{\"a\":{\"dtype\":\"F4\",\"shape\":[],\"data_offsets\":[0,1]}}", 1, "unknown dtype \"F4\""},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":1}}", 4, "unknown field \"x\""},
      {"{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\"}}", 0, "field \"dtype\" given twice"},
      {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "tensor \"a\" has no \"shape\""},
      {"{\"a\":{}}", 0, "has no dtype, shape or data_offsets"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "negative number"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, "fraction or exponent"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4, "leading zero"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,4]}}", 4, "overflows 63 bits"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "expected ','"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, "expected ']'"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4, "expected a non-negative integer"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},}", 4, "expected '\"'"},
      {"{\"__metadata__\":{\"k\":1}}", 0, "metadata value of \"k\" is not a string"},
      {"{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, "metadata key \"k\" appears twice"},
      {"{\"__metadata__\":{},\"__metadata__\":{}}", 0, "\"__metadata__\" given twice"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
       "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "tensor name \"a\" appears twice"},
      {"{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "a tensor has an empty name"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "data_offsets [4, 0] are reversed"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 12,
       "data_offsets [0, 12] hold 12 bytes but F32 [2, 2] needs 16"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,8]}}", 8,
       "data_offsets [0, 8] hold 8 bytes but F32 [] needs 4"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "a gap of 4 bytes"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "overlap tensor \"a\""},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "run past the data section's 8 bytes"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 6, "cover 4 bytes of the 6-byte data section"},
      {"{}", 3, "cover 0 bytes of the 3-byte data section"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,4]}}", 4,
       "shape overflows the element count"},
      {"{\"a\":{\"dtype\":\"I64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,4]}}", 4,
       "byte size overflows"},
  };
  static unsigned char zeros[64];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    size_t size;
    unsigned char *b = iot_st_build(cases[i].json, zeros, cases[i].dlen, &size);
    loom_safetensors *f = (loom_safetensors *)1;
    loom_clear_error();
    int rc = loom_safetensors_open_memory(b, size, "bad.safetensors", &f);
    if (rc != LOOM_EFORMAT || !strstr(loom_last_error(), cases[i].msg) ||
        !strstr(loom_last_error(), "bad.safetensors"))
      lt_fail_at(__FILE__, __LINE__, "case %zu (%s): %s: \"%s\", expected \"%s\"", i, cases[i].json,
                 loom_status_name(rc), loom_last_error(), cases[i].msg);
    LT_TRUE(f == NULL);
    free(b);
  }
  /* a NUL byte after the JSON, inside the header */
  unsigned char nul[8 + 3] = {3, 0, 0, 0, 0, 0, 0, 0, '{', '}', 0};
  loom_safetensors *f = NULL;
  LT_ERR(loom_safetensors_open_memory(nul, sizeof nul, "nul", &f), LOOM_EFORMAT, "characters after");
  /* the length field itself */
  LT_ERR(loom_safetensors_open_memory(nul, 5, "short", &f), LOOM_EFORMAT,
         "short: 5 bytes is too short for the 8-byte header length");
  uint64_t huge[2] = {100000001, 0};
  LT_ERR(loom_safetensors_open_memory(huge, 16, "huge", &f), LOOM_EFORMAT,
         "header length 100000001 exceeds the 100000000-byte limit");
  uint64_t past[2] = {9, 0x7d7b};
  LT_ERR(loom_safetensors_open_memory(past, 16, "past", &f), LOOM_EFORMAT,
         "header length 9 runs past the end of the file (16 bytes)");
  uint64_t wrap[2] = {UINT64_MAX, 0};
  LT_ERR(loom_safetensors_open_memory(wrap, 16, "wrap", &f), LOOM_EFORMAT, "exceeds");
  uint64_t zero[1] = {0};
  LT_ERR(loom_safetensors_open_memory(zero, 8, "zero", &f), LOOM_EFORMAT, "does not start with '{'");
}

LT_TEST(safetensors_open_file_errors) {
  char dir[64], path[128];
  iot_mkdtemp(dir, sizeof dir);
  iot_path(path, sizeof path, dir, "missing.safetensors");
  loom_safetensors *f = NULL;
  LT_ERR(loom_safetensors_open(path, 0, &f), LOOM_ENOTFOUND, "cannot open");
  LT_ERR(loom_safetensors_open(dir, 0, &f), LOOM_EIO, "is not a regular file");
  LT_ERR(loom_safetensors_open(path, 8, &f), LOOM_EINVAL, "unknown flags");
  /* a truncated copy of a good file: both read modes */
  int64_t s[] = {16};
  float x[16] = {1};
  loom_safetensors_entry e = {.name = "x", .dtype = LOOM_F32, .ndim = 1, .shape = s, .data = x};
  iot_path(path, sizeof path, dir, "t.safetensors");
  LT_OK(loom_safetensors_write(path, &e, 1, NULL, 0));
  size_t n = 0;
  unsigned char *b = iot_read(path, &n);
  LT_OK(iot_write(path, b, n - 3) == 0 ? LOOM_OK : LOOM_EIO);
  free(b);
  LT_ERR(loom_safetensors_open(path, 0, &f), LOOM_EFORMAT, "run past the data section");
  LT_ERR(loom_safetensors_open(path, LOOM_SAFETENSORS_MMAP, &f), LOOM_EFORMAT, "truncated file?");
  LT_TRUE(f == NULL);
  iot_rmdir(dir);
}

LT_TEST(safetensors_write_never_replaces_what_is_not_a_regular_file) {
  char dir[64], fifo[128], link[128], dangling[128], real[128], reallink[128], sub[128];
  iot_mkdtemp(dir, sizeof dir);
  iot_path(fifo, sizeof fifo, dir, "fifo");
  iot_path(link, sizeof link, dir, "to-fifo");
  iot_path(dangling, sizeof dangling, dir, "to-nothing");
  iot_path(real, sizeof real, dir, "real.safetensors");
  iot_path(reallink, sizeof reallink, dir, "to-real.safetensors");
  iot_path(sub, sizeof sub, dir, "sub");
  LT_TRUE(mkfifo(fifo, 0600) == 0 && symlink("fifo", link) == 0 &&
          symlink("nothing", dangling) == 0 && mkdir(sub, 0700) == 0);
  int64_t s[] = {2};
  float x[2] = {1, 2};
  loom_safetensors_entry e = {.name = "x", .dtype = LOOM_F32, .ndim = 1, .shape = s, .data = x};
  /* the FIFO first: without the check, /dev/null below would be replaced (as root) */
  LT_ERR(loom_safetensors_write(fifo, &e, 1, NULL, 0), LOOM_EIO, "is a FIFO, not a regular file");
  LT_ERR(loom_safetensors_write("/dev/null", &e, 1, NULL, 0), LOOM_EIO,
         "'/dev/null' is a character device");
  LT_ERR(loom_safetensors_write(link, &e, 1, NULL, 0), LOOM_EIO, "is a symlink to a FIFO");
  LT_ERR(loom_safetensors_write(dangling, &e, 1, NULL, 0), LOOM_EIO, "is a symlink to nothing");
  LT_ERR(loom_safetensors_write(sub, &e, 1, NULL, 0), LOOM_EIO, "is a folder");
  LT_ERR(loom_checkpoint_save(fifo, NULL, 0, NULL, 0), LOOM_EIO, "is a FIFO");
  struct stat st;
  LT_TRUE(stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode));
  LT_TRUE(lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode));
  LT_TRUE(lstat(link, &st) == 0 && S_ISLNK(st.st_mode));
  LT_TRUE(lstat(dangling, &st) == 0 && S_ISLNK(st.st_mode));
  LT_TRUE(lstat(sub, &st) == 0 && S_ISDIR(st.st_mode));
  LT_EQ(iot_count(dir), 4); /* no temporary left */
  /* through a symlink to a regular file: the target replaced, the link kept */
  LT_TRUE(iot_write(real, "old", 3) == 0 && symlink("real.safetensors", reallink) == 0);
  LT_OK(loom_safetensors_write(reallink, &e, 1, NULL, 0));
  LT_TRUE(lstat(reallink, &st) == 0 && S_ISLNK(st.st_mode));
  loom_safetensors *f = NULL;
  LT_OK(loom_safetensors_open(real, 0, &f));
  loom_safetensors_free(f);
  char out[8];
  LT_ERR(loom_output_path(fifo, out, sizeof out), LOOM_EIO, "is a FIFO");
  LT_ERR(loom_output_path("a-long-name", out, sizeof out), LOOM_EINVAL, "too long");
  LT_OK(loom_output_path("new", out, sizeof out));
  LT_TRUE(!strcmp(out, "new"));
  LT_EQ(iot_count(dir), 6);
  unlink(sub), rmdir(sub);
  iot_rmdir(dir);
}

LT_TEST(safetensors_writer_argument_errors) {
  char dir[64], path[128];
  iot_mkdtemp(dir, sizeof dir);
  iot_path(path, sizeof path, dir, "w.safetensors");
  int64_t s[] = {2}, neg[] = {-2};
  float x[2] = {1, 2};
  loom_safetensors_entry e[2] = {{.name = "a", .dtype = LOOM_F32, .ndim = 1, .shape = s, .data = x},
                                 {.name = "a", .dtype = LOOM_I32, .ndim = 1, .shape = s, .data = x}};
  LT_ERR(loom_safetensors_write(path, e, 2, NULL, 0), LOOM_EINVAL, "tensor name \"a\" given twice");
  e[1].name = "";
  LT_ERR(loom_safetensors_write(path, e, 2, NULL, 0), LOOM_EINVAL, "tensor 1 has an empty name");
  e[1].name = "__metadata__";
  LT_ERR(loom_safetensors_write(path, e, 2, NULL, 0), LOOM_EINVAL, "reserved");
  e[1].name = "bad\xff";
  LT_ERR(loom_safetensors_write(path, e, 2, NULL, 0), LOOM_EINVAL, "not valid UTF-8");
  e[1].name = "b", e[1].shape = neg;
  LT_ERR(loom_safetensors_write(path, e, 2, NULL, 0), LOOM_EINVAL, "negative size");
  e[1].shape = s, e[1].data = NULL;
  LT_ERR(loom_safetensors_write(path, e, 2, NULL, 0), LOOM_EINVAL, "\"b\" has NULL data");
  e[1].data = x, e[1].dtype = (loom_dtype)42;
  LT_ERR(loom_safetensors_write(path, e, 2, NULL, 0), LOOM_EDTYPE, "invalid dtype");
  loom_safetensors_meta_kv kv[2] = {{"k", "v"}, {"k", "w"}};
  LT_ERR(loom_safetensors_write(path, e, 1, kv, 2), LOOM_EINVAL, "metadata key \"k\" given twice");
  kv[1].key = NULL;
  LT_ERR(loom_safetensors_write(path, e, 1, kv, 2), LOOM_EINVAL, "metadata key 1 is NULL");
  LT_EQ(iot_count(dir), 0); /* nothing written by any failed call */
  iot_rmdir(dir);
}

LT_TEST(safetensors_atomic_write_leaves_nothing_on_failure) {
  char dir[64], path[160];
  iot_mkdtemp(dir, sizeof dir);
  float x[4] = {1, 2, 3, 4};
  int64_t s[] = {4};
  loom_safetensors_entry e = {.name = "x", .dtype = LOOM_F32, .ndim = 1, .shape = s, .data = x};
  iot_path(path, sizeof path, dir, "no/such/dir/x.safetensors");
  LT_ERR(loom_safetensors_write(path, &e, 1, NULL, 0), LOOM_EIO, "cannot create a temporary file");
  LT_EQ(iot_count(dir), 0);
  /* an old file survives a write that fails half way (file size limit: EFBIG) */
  iot_path(path, sizeof path, dir, "keep.safetensors");
  LT_OK(loom_safetensors_write(path, &e, 1, NULL, 0));
  size_t n0 = 0;
  unsigned char *before = iot_read(path, &n0);
  enum { BIG = 1 << 16 };
  static float big[BIG];
  int64_t sb[] = {BIG};
  loom_safetensors_entry eb = {.name = "big", .dtype = LOOM_F32, .ndim = 1, .shape = sb, .data = big};
  struct rlimit old;
  getrlimit(RLIMIT_FSIZE, &old);
  struct rlimit lim = {4096, old.rlim_max};
  void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
  LT_TRUE(setrlimit(RLIMIT_FSIZE, &lim) == 0);
  LT_ERR(loom_safetensors_write(path, &eb, 1, NULL, 0), LOOM_EIO, "cannot write");
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, prev);
  LT_EQ(iot_count(dir), 1);
  size_t n1 = 0;
  unsigned char *after = iot_read(path, &n1);
  LT_TRUE(before && after && n0 == n1 && memcmp(before, after, n0) == 0);
  free(before);
  free(after);
  iot_rmdir(dir);
}

LT_TEST(safetensors_oom_sweeps) {
  char dir[64], path[128];
  iot_mkdtemp(dir, sizeof dir);
  iot_path(path, sizeof path, dir, "o.safetensors");
  float x[6] = {1, 2, 3, 4, 5, 6};
  int64_t s[] = {2, 3};
  loom_tensor *base = NULL, *tr = NULL;
  LT_OK(loom_tensor_from_data(LOOM_F32, 2, s, x, &base));
  LT_OK(loom_tensor_transpose(base, 0, 1, &tr));
  loom_safetensors_entry e[3] = {{.name = "a", .dtype = LOOM_F32, .ndim = 2, .shape = s, .data = x},
                                 {.name = "b", .dtype = LOOM_I32, .ndim = 1, .shape = s, .data = x},
                                 {.name = "t", .tensor = tr}};
  loom_safetensors_meta_kv kv = {"k", "v"};
  for (int which = 0; which < 3; which++) {
    int failures = 0;
    for (uint64_t n = 1; n < 200; n++) {
      size_t before = iot_pool_bytes();
      loom_alloc_fail_nth(n);
      loom_safetensors *f = NULL;
      int rc = which == 0   ? loom_safetensors_write(path, e, 3, &kv, 1)
               : which == 1 ? loom_safetensors_open(path, 0, &f)
                            : loom_safetensors_open(path, LOOM_SAFETENSORS_MMAP, &f);
      loom_alloc_fail_nth(0);
      loom_safetensors_free(f);
      LT_EQ(iot_pool_bytes(), before);
      LT_EQ(iot_count(dir), which == 0 && rc ? 0 : 1);
      if (rc == LOOM_OK) break;
      LT_EQ(rc, LOOM_ENOMEM);
      failures++;
    }
    LT_TRUE(failures >= 2);
  }
  loom_tensor_free(tr);
  loom_tensor_free(base);
  iot_rmdir(dir);
}
