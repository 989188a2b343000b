/* test_scaler_step.c: the step's state machine (scale -> unscale once -> update), loss
 * scaling of values and tensors, the scale tensors, and save/restore of the whole state (struct
 * and flat i64 form) continuing bit-exactly, with the errors of each. */
#include "lt.h"
#include "amp/amp_int.h"

#include <math.h>

static loom_scaler *small_scaler(void) {
  loom_dynamic_scaler_cfg c = {8, 2, 0.5f, 3, 1, 64, true};
  loom_scaler *s = NULL;
  LT_OK(loom_scaler_create_dynamic(&c, &s));
  return s;
}

LT_TEST(scaler_step_order_is_enforced) {
  loom_scaler *s = small_scaler();
  float g[2] = {8, 16};
  loom_tensor *t = NULL;
  LT_OK(loom_tensor_wrap(LOOM_F32, 1, (int64_t[]){2}, g, &t));
  bool found = true;
  LT_ERR(loom_scaler_unscale(s, &t, 1, &found), LOOM_EMISUSE, "no loss was scaled");
  float loss = 1;
  LT_OK(loom_scaler_scale_value(s, &loss));
  LT_OK(loom_scaler_scale_value(s, &loss)); /* accumulation: scaling again is fine */
  LT_EQ(loss, 64);
  LT_OK(loom_scaler_unscale(s, &t, 1, &found));
  LT_TRUE(!found);
  LT_EQ(g[0], 1);
  LT_EQ(g[1], 2);
  LT_ERR(loom_scaler_unscale(s, &t, 1, &found), LOOM_EMISUSE, "already unscaled this step");
  LT_EQ(g[0], 1); /* untouched by the refused call */
  loom__amp_buffer b = {g, LOOM_F32, 2};
  LT_ERR(loom__scaler_unscale_buffers(s, &b, 1, &found), LOOM_EMISUSE, "already unscaled");
  LT_ERR(loom_scaler_scale_value(s, &loss), LOOM_EMISUSE, "already unscaled");
  LT_OK(loom_scaler_update(s, found));
  /* after the step: unscale again without a new scaled loss is refused */
  LT_ERR(loom_scaler_unscale(s, &t, 1, &found), LOOM_EMISUSE, "after the step");
  /* a skipped step: update without unscale is fine */
  LT_OK(loom_scaler_scale_value(s, &loss));
  LT_OK(loom_scaler_update(s, true));
  LT_EQ(loom_scaler_get_scale(s), 4);
  loom_tensor_free(t);
  loom_scaler_free(s);
}

LT_TEST(scaler_unscale_buffers_and_errors) {
  loom_scaler *s = small_scaler();
  float a[5] = {8, -8, 4, 0, 80};
  uint16_t h[3] = {loom_f32_to_f16(8), loom_f32_to_f16(-0.5f), loom_f32_to_f16(65504)};
  uint16_t bf[2] = {loom_f32_to_bf16(24), loom_f32_to_bf16(NAN)};
  loom__amp_buffer bufs[3] = {{a, LOOM_F32, 5}, {h, LOOM_F16, 3}, {bf, LOOM_BF16, 2}};
  float loss = 1;
  LT_OK(loom_scaler_scale_value(s, &loss));
  loom__amp_buffer bad = {a, LOOM_I32, 5};
  bool found = false;
  LT_ERR(loom__scaler_unscale_buffers(s, &bad, 1, &found), LOOM_EDTYPE, "buffer 0 has dtype i32");
  loom__amp_buffer nodata = {NULL, LOOM_F32, 5};
  LT_ERR(loom__scaler_unscale_buffers(s, &nodata, 1, &found), LOOM_EINVAL, "no data");
  LT_ERR(loom__scaler_unscale_buffers(s, NULL, 2, &found), LOOM_EINVAL, "bufs is NULL");
  LT_EQ(a[0], 8); /* nothing changed by refused calls */
  LT_OK(loom__scaler_unscale_buffers(s, bufs, 3, &found));
  LT_TRUE(found); /* the bf16 NaN */
  LT_EQ(a[0], 1);
  LT_EQ(a[1], -1);
  LT_EQ(a[4], 10);
  LT_EQ(loom_f16_to_f32(h[0]), 1);
  LT_NEAR(loom_f16_to_f32(h[1]), -0.0625, 0);
  LT_EQ(loom_f16_to_f32(h[2]), 8188);
  LT_EQ(loom_bf16_to_f32(bf[0]), 3);
  LT_TRUE(isnan(loom_bf16_to_f32(bf[1])));
  LT_OK(loom_scaler_update(s, found));
  LT_EQ(loom_scaler_get_scale(s), 4);
  loom_scaler_free(s);
}

LT_TEST(scaler_scale_loss_tensor_every_dtype) {
  loom_scaler *s = small_scaler();
  loom_dtype dts[3] = {LOOM_F32, LOOM_F16, LOOM_BF16};
  for (int d = 0; d < 3; d++) {
    loom_tensor *loss = NULL;
    LT_OK(loom_tensor_zeros(dts[d], 0, NULL, &loss));
    LT_OK(loom_tensor_fill(loss, 0.75));
    LT_OK(loom_scaler_scale_loss(s, loss));
    double v = 0;
    LT_OK(loom_tensor_item(loss, &v));
    LT_NEAR(v, 6.0, 0);
    loom_tensor_free(loss);
  }
  /* a strided loss (per-sample losses, every other one) */
  loom_tensor *l = NULL, *view = NULL;
  LT_OK(loom_tensor_zeros(LOOM_F32, 1, (int64_t[]){6}, &l));
  LT_OK(loom_tensor_fill(l, 1));
  LT_OK(loom_tensor_slice(l, 0, 0, 6, 2, &view));
  LT_OK(loom_scaler_scale_loss(s, view));
  float out[6];
  LT_OK(loom_tensor_read(l, LOOM_F32, out, sizeof out));
  for (int i = 0; i < 6; i++) LT_EQ(out[i], i % 2 ? 1 : 8);
  loom_tensor *lab = NULL;
  LT_OK(loom_tensor_zeros(LOOM_I32, 1, (int64_t[]){2}, &lab));
  LT_ERR(loom_scaler_scale_loss(s, lab), LOOM_EDTYPE, "loss has dtype i32");
  LT_ERR(loom_scaler_scale_loss(s, NULL), LOOM_EINVAL, "loom_scaler_scale_loss");
  loom_tensor *st = NULL, *inv = NULL;
  LT_OK(loom_scaler_scale_tensor(s, &st));
  LT_OK(loom_scaler_inv_scale_tensor(s, &inv));
  double sv = 0, iv = 0;
  LT_OK(loom_tensor_item(st, &sv));
  LT_OK(loom_tensor_item(inv, &iv));
  LT_EQ(loom_tensor_ndim(st), 0);
  LT_EQ(loom_tensor_dtype(inv), LOOM_F32);
  LT_NEAR(sv, 8, 0);
  LT_NEAR(iv, 0.125, 0);
  loom_tensor_free(st);
  LT_ERR(loom_scaler_scale_tensor(NULL, &st), LOOM_EINVAL, "scaler is NULL");
  LT_TRUE(st == NULL);
  loom_tensor_free(inv);
  loom_tensor_free(lab);
  loom_tensor_free(view);
  loom_tensor_free(l);
  loom_scaler_free(s);
}

static uint64_t rng = 88172645463325252ull;
static bool coin(int per_mille) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (int)(rng % 1000) < per_mille;
}

static void same_state(loom_scaler *a, loom_scaler *b) {
  loom_scaler_state x, y;
  LT_OK(loom_scaler_save(a, &x));
  LT_OK(loom_scaler_save(b, &y));
  int64_t wx[LOOM_SCALER_STATE_WORDS], wy[LOOM_SCALER_STATE_WORDS];
  LT_OK(loom_scaler_state_pack(&x, wx));
  LT_OK(loom_scaler_state_pack(&y, wy));
  for (size_t i = 0; i < LOOM_SCALER_STATE_WORDS; i++)
    if (wx[i] != wy[i]) {
      LT_STREQ(loom_scaler_state_word_name(i), "(equal)");
      break;
    }
}

LT_TEST(scaler_save_restore_continues_exactly) {
  loom_dynamic_scaler_cfg c = {1000, 1.5f, 0.3f, 4, 0.7f, 1e5f, true};
  loom_scaler *a = NULL, *b = NULL;
  LT_OK(loom_scaler_create_dynamic(&c, &a));
  for (int i = 0; i < 777; i++) LT_OK(loom_scaler_update(a, coin(200)));
  loom_scaler_state st, back;
  LT_OK(loom_scaler_save(a, &st));
  int64_t words[LOOM_SCALER_STATE_WORDS];
  LT_OK(loom_scaler_state_pack(&st, words));
  LT_OK(loom_scaler_state_unpack(words, &back));
  LT_OK(loom_scaler_create_dynamic(NULL, &b)); /* a different config: restore replaces it */
  LT_OK(loom_scaler_restore(b, &back));
  same_state(a, b);
  LT_EQ(loom_scaler_get_scale(a), loom_scaler_get_scale(b));
  loom_dynamic_scaler_cfg cb;
  LT_OK(loom_scaler_get_config(b, &cb));
  LT_EQ(cb.growth_interval, 4);
  for (int i = 0; i < 2000; i++) {
    bool ov = coin(150);
    LT_OK(loom_scaler_update(a, ov));
    LT_OK(loom_scaler_update(b, ov));
  }
  same_state(a, b);
  loom_scaler_stats sa, sb;
  LT_OK(loom_scaler_stats(a, &sa));
  LT_OK(loom_scaler_stats(b, &sb));
  LT_EQ(sa.total_overflows, sb.total_overflows);
  LT_EQ(sa.scale_increase_count, sb.scale_increase_count);
  LT_NEAR(sa.success_rate, sb.success_rate, 0);
  LT_STREQ(loom_scaler_state_word_name(0), "magic");
  LT_STREQ(loom_scaler_state_word_name(9), "scale");
  LT_STREQ(loom_scaler_state_word_name(16), "max_scale_reached");
  LT_TRUE(loom_scaler_state_word_name(17) == NULL);
  loom_scaler_free(a);
  loom_scaler_free(b);
}

LT_TEST(scaler_restore_refuses_bad_states) {
  loom_scaler *d = NULL, *st = NULL;
  LT_OK(loom_scaler_create_dynamic(NULL, &d));
  LT_OK(loom_scaler_create_static(128, &st));
  loom_scaler_state good, s;
  LT_OK(loom_scaler_save(d, &good));
  LT_ERR(loom_scaler_restore(st, &good), LOOM_EINVAL, "state is of a dynamic scaler, this one is "
                                                       "static");
  s = good;
  s.scale = 0.5f;
  LT_ERR(loom_scaler_restore(d, &s), LOOM_EINVAL, "scale 0.5 is outside [min_scale, max_scale]");
  s = good;
  s.cfg.backoff_factor = 2;
  LT_ERR(loom_scaler_restore(d, &s), LOOM_EINVAL, "backoff_factor must be in (0, 1)");
  s = good;
  s.total_overflows = -1;
  LT_ERR(loom_scaler_restore(d, &s), LOOM_EINVAL, "a counter is negative");
  s = good;
  s.growth_counter = 2000;
  LT_ERR(loom_scaler_restore(d, &s), LOOM_EINVAL, "growth_counter 2000 is outside");
  s = good;
  s.max_scale_reached = 2;
  LT_ERR(loom_scaler_restore(d, &s), LOOM_EINVAL, "do not contain the scale");
  s = good;
  s.cfg.enabled = false;
  LT_ERR(loom_scaler_restore(d, &s), LOOM_EINVAL, "disabled: must be 1");
  LT_ERR(loom_scaler_restore(d, NULL), LOOM_EINVAL, "state is NULL");
  LT_EQ(loom_scaler_get_scale(d), 65536); /* unchanged by every refusal */
  int64_t w[LOOM_SCALER_STATE_WORDS];
  LT_OK(loom_scaler_state_pack(&good, w));
  w[0] ^= 1;
  LT_ERR(loom_scaler_state_unpack(w, &s), LOOM_EFORMAT, "magic");
  w[0] ^= 1;
  w[1] = 7;
  LT_ERR(loom_scaler_state_unpack(w, &s), LOOM_EFORMAT, "word 1 (kind) is 7");
  w[1] = LOOM_SCALER_DYNAMIC;
  w[8] = 2;
  LT_ERR(loom_scaler_state_unpack(w, &s), LOOM_EFORMAT, "word 8 (enabled) is 2");
  w[8] = 1;
  w[9] = (int64_t)1 << 40;
  LT_ERR(loom_scaler_state_unpack(w, &s), LOOM_EFORMAT, "word 9 (scale) is not an f32");
  LT_ERR(loom_scaler_state_pack(NULL, w), LOOM_EINVAL, "state is NULL");
  /* a static scaler round-trips too */
  loom_scaler_state ss;
  LT_OK(loom_scaler_update(st, true));
  LT_OK(loom_scaler_save(st, &ss));
  LT_OK(loom_scaler_state_pack(&ss, w));
  LT_OK(loom_scaler_state_unpack(w, &s));
  LT_OK(loom_scaler_reset(st));
  LT_OK(loom_scaler_restore(st, &s));
  LT_EQ(loom_scaler_total_overflows(st), 1);
  LT_EQ(loom_scaler_get_scale(st), 128);
  loom_scaler_free(d);
  loom_scaler_free(st);
}
