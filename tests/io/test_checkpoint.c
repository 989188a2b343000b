/* test_checkpoint.c: checkpoints: save and load of named buffers and metadata (numbers that
 * round-trip exactly), the CRC catching a flipped byte, refusal of a plain safetensors file,
 * missing / mistyped / misshaped entries leaving every buffer untouched, and an AdamW run
 * interrupted, checkpointed, restored into fresh objects and continued, ending bit for bit
 * where the uninterrupted run ends. */
#include "lt.h"
#include "io_test.h"

LT_TEST(checkpoint_round_trip_and_errors) {
  char dir[64], path[128];
  iot_mkdtemp(dir, sizeof dir);
  iot_path(path, sizeof path, dir, "ck.safetensors");
  float w[6] = {1, -2, 3.5f, 0, -0.25f, 8};
  int64_t rng[4] = {1, -2, INT64_MAX, INT64_MIN};
  uint16_t h[2] = {0x3c00, 0xc000};
  loom_checkpoint_entry e[3] = {
      {.name = "model.w", .dtype = LOOM_F32, .ndim = 2, .shape = {2, 3}, .data = w},
      {.name = "rng", .dtype = LOOM_I64, .ndim = 1, .shape = {4}, .data = rng},
      {.name = "scaler.h", .dtype = LOOM_F16, .ndim = 1, .shape = {2}, .data = h},
  };
  char scale[32];
  snprintf(scale, sizeof scale, "%.17g", 65536.0 / 3.0);
  loom_safetensors_meta_kv kv[2] = {{"step", "1234"}, {"scale", scale}};
  LT_OK(loom_checkpoint_save(path, e, 3, kv, 2));
  float w2[6] = {0};
  int64_t rng2[4] = {0};
  uint16_t h2[2] = {0};
  loom_checkpoint_entry r[3] = {e[0], e[1], e[2]};
  r[0].data = w2, r[1].data = rng2, r[2].data = h2;
  loom_safetensors *f = NULL;
  LT_OK(loom_checkpoint_load(path, r, 3, &f));
  LT_TRUE(memcmp(w, w2, sizeof w) == 0 && memcmp(rng, rng2, sizeof rng) == 0 &&
          memcmp(h, h2, sizeof h) == 0);
  int64_t step = 0;
  double s = 0;
  LT_OK(loom_safetensors_meta_i64(f, "step", &step));
  LT_OK(loom_safetensors_meta_f64(f, "scale", &s));
  LT_EQ(step, 1234);
  LT_TRUE(s == 65536.0 / 3.0);
  LT_STREQ(loom_safetensors_meta(f, "loom.format"), "checkpoint/2");
  loom_safetensors_free(f);

  /* one entry missing: nothing written, even into the entries that do match */
  memset(w2, 0, sizeof w2);
  r[1].name = "rng.missing";
  LT_ERR(loom_checkpoint_load(path, r, 3, NULL), LOOM_ENOTFOUND, "has no tensor \"rng.missing\"");
  LT_NEAR(w2[0], 0, 0);
  r[1].name = "rng", r[1].dtype = LOOM_I32;
  LT_ERR(loom_checkpoint_load(path, r, 3, NULL), LOOM_EDTYPE, "is I64, expected i32");
  r[1].dtype = LOOM_I64, r[1].shape[0] = 5;
  LT_ERR(loom_checkpoint_load(path, r, 3, NULL), LOOM_ESHAPE, "has shape [4], expected [5]");
  LT_NEAR(w2[0], 0, 0);
  loom_safetensors_meta_kv res = {"loom.crc32", "0"};
  LT_ERR(loom_checkpoint_save(path, e, 1, &res, 1), LOOM_EINVAL, "\"loom.\" is reserved");

  /* a flipped data byte */
  size_t n = 0;
  unsigned char *b = iot_read(path, &n);
  b[n - 1] ^= 0x10;
  iot_path(path, sizeof path, dir, "flip.safetensors");
  iot_write(path, b, n);
  free(b);
  LT_ERR(loom_checkpoint_load(path, r, 0, NULL), LOOM_EFORMAT, "(corrupt file)");
  /* a plain safetensors file is not a checkpoint */
  iot_path(path, sizeof path, dir, "plain.safetensors");
  loom_safetensors_entry pe = {.name = "x", .dtype = LOOM_F32, .ndim = 1, .shape = (int64_t[]){2}, .data = w};
  LT_OK(loom_safetensors_write(path, &pe, 1, NULL, 0));
  LT_ERR(loom_checkpoint_load(path, NULL, 0, &f), LOOM_EFORMAT, "is not a loom checkpoint (loom.format is missing)");
  LT_TRUE(f == NULL);
  iot_path(path, sizeof path, dir, "none.safetensors");
  LT_ERR(loom_checkpoint_load(path, NULL, 0, NULL), LOOM_ENOTFOUND, "cannot open");
  iot_rmdir(dir);
}

/* AdamW on a 2-segment arena: 7 steps straight, or 3 steps, checkpoint (params, moments,
 * step), fresh optimizer restored from the file, 4 more steps: the same bits. */
LT_TEST(checkpoint_resume_adamw_bit_identical) {
  enum { N = 97, M = 41 };
  static float pa[N + M], pb[N + M], grad[N + M];
  uint64_t r = 5;
  for (int i = 0; i < N + M; i++) pa[i] = (float)((r = r * 6364136223846793005ull + 1) >> 40) / 1e7f - 0.8f;
  memcpy(pb, pa, sizeof pa);
  loom_adam_cfg c = loom_adamw_cfg_default();
  c.lr = 0.01;
  loom_param_seg sa[2] = {{.name = "fc1", .param = pa, .grad = grad, .n = N},
                          {.name = "fc2", .param = pa + N, .grad = grad + N, .n = M}};
  loom_param_seg sb[2] = {sa[0], sa[1]};
  sb[0].param = pb, sb[1].param = pb + N;
  loom_optim *a = NULL, *b = NULL;
  LT_OK(loom_optim_create_adamw(sa, 2, &c, &a));
  LT_OK(loom_optim_create_adamw(sb, 2, &c, &b));
  char dir[64], path[128];
  iot_mkdtemp(dir, sizeof dir);
  iot_path(path, sizeof path, dir, "resume.safetensors");
  for (int t = 0; t < 7; t++) {
    for (int i = 0; i < N + M; i++) grad[i] = (float)(((r = r * 6364136223846793005ull + 1) >> 41) % 2000) / 1000.0f - 1.0f;
    LT_OK(loom_optim_step(a));
    if (t < 3) LT_OK(loom_optim_step(b));
    if (t == 2) { /* checkpoint b, then throw it away */
      loom_checkpoint_entry e[6];
      size_t ne = 0;
      e[ne++] = (loom_checkpoint_entry){.name = "model.fc1", .dtype = LOOM_F32, .ndim = 1, .shape = {N}, .data = pb};
      e[ne++] = (loom_checkpoint_entry){.name = "model.fc2", .dtype = LOOM_F32, .ndim = 1, .shape = {M}, .data = pb + N};
      for (size_t k = 0; k < loom_optim_state_count(b); k++) {
        loom_optim_state st;
        LT_OK(loom_optim_state_at(b, k, &st));
        e[ne++] = (loom_checkpoint_entry){.name = st.name, .dtype = LOOM_F32, .ndim = 1,
                                          .shape = {(int64_t)st.n}, .data = st.data};
      }
      char step[32];
      snprintf(step, sizeof step, "%lld", (long long)loom_optim_step_count(b));
      loom_safetensors_meta_kv kv = {"optim.step", step};
      LT_OK(loom_checkpoint_save(path, e, ne, &kv, 1));
      loom_optim_free(b);
      memset(pb, 0, sizeof pb);
      /* restore into a fresh optimizer */
      LT_OK(loom_optim_create_adamw(sb, 2, &c, &b));
      ne = 2;
      for (size_t k = 0; k < loom_optim_state_count(b); k++) {
        loom_optim_state st;
        LT_OK(loom_optim_state_at(b, k, &st));
        e[ne++] = (loom_checkpoint_entry){.name = st.name, .dtype = LOOM_F32, .ndim = 1,
                                          .shape = {(int64_t)st.n}, .data = st.data};
      }
      loom_safetensors *f = NULL;
      LT_OK(loom_checkpoint_load(path, e, ne, &f));
      int64_t s = 0;
      LT_OK(loom_safetensors_meta_i64(f, "optim.step", &s));
      LT_OK(loom_optim_set_step_count(b, s));
      loom_safetensors_free(f);
    }
    if (t >= 3) LT_OK(loom_optim_step(b));
  }
  LT_TRUE(memcmp(pa, pb, sizeof pa) == 0);
  loom_optim_free(a);
  loom_optim_free(b);
  iot_rmdir(dir);
}

LT_TEST(checkpoint_save_oom_sweep) {
  char dir[64], path[128];
  iot_mkdtemp(dir, sizeof dir);
  iot_path(path, sizeof path, dir, "o.safetensors");
  float w[4] = {1, 2, 3, 4};
  loom_checkpoint_entry e = {.name = "w", .dtype = LOOM_F32, .ndim = 1, .shape = {4}, .data = w};
  int failures = 0;
  for (uint64_t n = 1; n < 100; n++) {
    size_t before = iot_pool_bytes();
    loom_alloc_fail_nth(n);
    int rc = loom_checkpoint_save(path, &e, 1, NULL, 0);
    if (!rc) rc = loom_checkpoint_load(path, &e, 1, NULL);
    loom_alloc_fail_nth(0);
    LT_EQ(iot_pool_bytes(), before);
    if (rc == LOOM_OK) break;
    LT_EQ(rc, LOOM_ENOMEM);
    failures++;
  }
  LT_TRUE(failures >= 3);
  iot_rmdir(dir);
}
