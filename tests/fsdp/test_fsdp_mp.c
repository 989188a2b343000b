/* test_fsdp_mp.c: FSDP mixed precision (spec fsdp-mixed-precision: FSDPMixedPrecisionConfig and
 * FSDPMixedPrecisionManager) against the spec's testing requirements: the defaults field by
 * field and the per-dtype defaults, every validation rule (the bad field named), parameter
 * conversion to f16 and bf16 (round to nearest even, overflow, NaN, subnormals), gradient
 * conversion back to f32 (exact, every f16 and bf16 bit pattern), loss scaling (value and
 * backward), overflow detection (NaN, +inf, -inf, f16 / bf16 gradients) with backoff clamped at
 * the minimum, growth after exactly loss_scale_steps clean steps capped at the maximum, long
 * seeded random overflow sequences against a transcription of the spec's CheckOverflow rule
 * (which checks that the reused dynamic scaler is the spec's rule), disabled loss scaling,
 * f16 vs bf16, reset, the scaler's step protocol, and NULL arguments. */
#include "lt.h"

#include "loom/fsdp.h"

#include <float.h>
#include <stdlib.h>

/* ---- helpers ------------------------------------------------------------------------------ */

static loom_tensor *tensor_f32(const float *v, int64_t n) {
  loom_tensor *t = NULL;
  LT_OK(loom_tensor_from_data(LOOM_F32, 1, &n, v, &t));
  return t;
}

static loom_tensor *tensor_u16(loom_dtype dt, const uint16_t *v, int64_t n) {
  loom_tensor *t = NULL;
  LT_OK(loom_tensor_from_data(dt, 1, &n, v, &t));
  return t;
}

static loom_fsdp_mp *make(const loom_fsdp_mp_cfg *c) {
  loom_fsdp_mp *m = NULL;
  LT_OK(loom_fsdp_mp_create(c, &m));
  LT_TRUE(m != NULL);
  return m;
}

static uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

/* The spec's FSDPMixedPrecisionManager state and CheckOverflow rule, transcribed from the C#
 * (Math.Max / Math.Min on floats, products in f32). */
typedef struct spec_manager {
  float current_loss_scale;
  int64_t steps_since_overflow;
  float min, max, growth, backoff;
  int64_t steps;
} spec_manager;

static void spec_check(spec_manager *s, bool overflow) {
  if (overflow) {
    s->current_loss_scale = fmaxf(s->min, s->current_loss_scale * s->backoff);
    s->steps_since_overflow = 0;
  } else {
    s->steps_since_overflow++;
    if (s->steps_since_overflow >= s->steps) {
      s->current_loss_scale = fminf(s->max, s->current_loss_scale * s->growth);
      s->steps_since_overflow = 0;
    }
  }
}

/* Field by field (a struct compare would read its padding). */
static bool cfg_eq(const loom_fsdp_mp_cfg *a, const loom_fsdp_mp_cfg *b) {
  return a->enabled == b->enabled && a->forward_dtype == b->forward_dtype &&
         a->backward_dtype == b->backward_dtype && a->use_loss_scaling == b->use_loss_scaling &&
         f32_bits(a->initial_loss_scale) == f32_bits(b->initial_loss_scale) &&
         f32_bits(a->min_loss_scale) == f32_bits(b->min_loss_scale) &&
         f32_bits(a->max_loss_scale) == f32_bits(b->max_loss_scale) &&
         f32_bits(a->loss_scale_growth_factor) == f32_bits(b->loss_scale_growth_factor) &&
         f32_bits(a->loss_scale_backoff_factor) == f32_bits(b->loss_scale_backoff_factor) &&
         a->loss_scale_steps == b->loss_scale_steps;
}

static uint64_t xorshift(uint64_t *x) {
  *x ^= *x << 13;
  *x ^= *x >> 7;
  *x ^= *x << 17;
  return *x;
}

/* ---- configuration ------------------------------------------------------------------------ */

LT_TEST(fsdp_mp_defaults_are_the_specs) {
  loom_fsdp_mp_cfg c;
  memset(&c, 0xa5, sizeof c);
  c = loom_fsdp_mp_cfg_default();
  LT_TRUE(c.enabled);
  LT_EQ(c.forward_dtype, LOOM_F16);
  LT_EQ(c.backward_dtype, LOOM_F32);
  LT_TRUE(c.use_loss_scaling);
  LT_EQ_HEX(f32_bits(c.initial_loss_scale), f32_bits(2.0f));
  LT_EQ_HEX(f32_bits(c.min_loss_scale), f32_bits(1.0f));
  LT_EQ_HEX(f32_bits(c.max_loss_scale), f32_bits(65536.0f));
  LT_EQ_HEX(f32_bits(c.loss_scale_growth_factor), f32_bits(2.0f));
  LT_EQ_HEX(f32_bits(c.loss_scale_backoff_factor), f32_bits(0.5f));
  LT_EQ(c.loss_scale_steps, 2000);
  LT_OK(loom_fsdp_mp_cfg_validate(&c));


  /* the manager starts at the initial scale, with the spec's values in its scaler */
  loom_fsdp_mp *m = make(&c);
  LT_EQ_HEX(f32_bits(loom_fsdp_mp_current_loss_scale(m)), f32_bits(2.0f));
  const loom_fsdp_mp_cfg *got = loom_fsdp_mp_config(m);
  LT_TRUE(got != NULL && cfg_eq(got, &c));
  loom_scaler *s = loom_fsdp_mp_scaler(m);
  LT_TRUE(s != NULL);
  LT_EQ(loom_scaler_get_kind(s), LOOM_SCALER_DYNAMIC);
  loom_dynamic_scaler_cfg d;
  LT_OK(loom_scaler_get_config(s, &d));
  LT_EQ(d.initial_scale, 2);
  LT_EQ(d.min_scale, 1);
  LT_EQ(d.max_scale, 65536);
  LT_EQ(d.growth_factor, 2);
  LT_EQ(d.backoff_factor * 2, 1);
  LT_EQ(d.growth_interval, 2000);
  LT_TRUE(d.enabled);
  LT_EQ(loom_scaler_growth_counter(s), 0);
  loom_fsdp_mp_free(m);
  loom_fsdp_mp_free(NULL);
}

LT_TEST(fsdp_mp_cfg_for_each_dtype) {
  loom_fsdp_mp_cfg def, c;
  def = loom_fsdp_mp_cfg_default();

  c = loom_fsdp_mp_cfg_for(LOOM_F16);
  LT_TRUE(cfg_eq(&c, &def));

  c = loom_fsdp_mp_cfg_for(LOOM_BF16);
  LT_TRUE(c.enabled);
  LT_EQ(c.forward_dtype, LOOM_BF16);
  LT_EQ(c.backward_dtype, LOOM_F32);
  LT_TRUE(!c.use_loss_scaling);
  LT_EQ(c.initial_loss_scale, 2);
  LT_EQ(c.loss_scale_steps, 2000);
  LT_OK(loom_fsdp_mp_cfg_validate(&c));

  const loom_dtype others[] = {LOOM_F32, LOOM_I32, LOOM_I64, (loom_dtype)99};
  for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
    c = loom_fsdp_mp_cfg_for(others[i]);
    LT_TRUE(!c.enabled);
    loom_fsdp_mp_cfg want = def;
    want.enabled = false;
    LT_TRUE(cfg_eq(&c, &want));
    LT_OK(loom_fsdp_mp_cfg_validate(&c));
  }

}

/* The configuration with one change must fail validation (and create) naming `field`. */
#define EXPECT_BAD(change, substr)                                                            \
  do {                                                                                        \
    loom_fsdp_mp_cfg c;                                                                       \
    c = loom_fsdp_mp_cfg_default();                                                             \
    change;                                                                                   \
    LT_ERR(loom_fsdp_mp_cfg_validate(&c), LOOM_EINVAL, substr);                               \
    loom_fsdp_mp *bad = (loom_fsdp_mp *)&c;                                                   \
    LT_ERR(loom_fsdp_mp_create(&c, &bad), LOOM_EINVAL, substr);                               \
    LT_TRUE(bad == NULL);                                                                     \
  } while (0)

LT_TEST(fsdp_mp_validate_names_each_bad_field) {
  LT_ERR(loom_fsdp_mp_cfg_validate(NULL), LOOM_EINVAL, "cfg is NULL");

  /* the spec's rules */
  EXPECT_BAD(c.forward_dtype = LOOM_F32, "forward_dtype must be f16 or bf16 (got f32)");
  EXPECT_BAD(c.forward_dtype = LOOM_I32, "forward_dtype must be f16 or bf16 (got i32)");
  EXPECT_BAD(c.forward_dtype = (loom_dtype)42, "forward_dtype must be f16 or bf16");
  EXPECT_BAD(c.backward_dtype = LOOM_F16, "backward_dtype must be f32 for stability");
  EXPECT_BAD(c.backward_dtype = LOOM_BF16, "backward_dtype must be f32 for stability (got bf16)");
  EXPECT_BAD(c.initial_loss_scale = 0.5f,
             "initial_loss_scale 0.5 must be within [min_loss_scale 1, max_loss_scale 65536]");
  EXPECT_BAD(c.initial_loss_scale = 131072.0f,
             "initial_loss_scale 131072 must be within [min_loss_scale 1, max_loss_scale 65536]");
  EXPECT_BAD(c.max_loss_scale = 1.5f,
             "initial_loss_scale 2 must be within [min_loss_scale 1, max_loss_scale 1.5]");
  EXPECT_BAD(c.min_loss_scale = 4.0f, "initial_loss_scale 2 must be within [min_loss_scale 4");
  EXPECT_BAD(c.initial_loss_scale = NAN, "initial_loss_scale nan must be within");
  /* the spec's rules hold without loss scaling too */
  EXPECT_BAD((c.use_loss_scaling = false, c.initial_loss_scale = 0.5f),
             "initial_loss_scale 0.5 must be within");
  EXPECT_BAD((c.use_loss_scaling = false, c.backward_dtype = LOOM_F16), "backward_dtype");

  /* the dynamic scaler's rules, on the mapped config, naming this config's fields */
  EXPECT_BAD(c.loss_scale_growth_factor = 1.0f, "loss_scale_growth_factor must be > 1 (got 1)");
  EXPECT_BAD(c.loss_scale_growth_factor = 0.5f, "loss_scale_growth_factor must be > 1");
  EXPECT_BAD(c.loss_scale_growth_factor = NAN, "loss_scale_growth_factor is NaN");
  EXPECT_BAD(c.loss_scale_backoff_factor = 1.0f, "loss_scale_backoff_factor must be in (0, 1)");
  EXPECT_BAD(c.loss_scale_backoff_factor = 0.0f, "loss_scale_backoff_factor must be in (0, 1)");
  EXPECT_BAD(c.loss_scale_backoff_factor = -0.5f, "loss_scale_backoff_factor is negative");
  EXPECT_BAD(c.loss_scale_steps = 0, "loss_scale_steps must be >= 1 (got 0)");
  EXPECT_BAD(c.loss_scale_steps = -5, "loss_scale_steps must be >= 1 (got -5)");
  EXPECT_BAD(c.min_loss_scale = 0.0f, "min_loss_scale must be > 0 (got 0)");
  EXPECT_BAD(c.max_loss_scale = INFINITY, "max_loss_scale is infinite");
  EXPECT_BAD((c.min_loss_scale = -1.0f), "min_loss_scale is negative");
  EXPECT_BAD(c.loss_scale_growth_factor = 1.0f, "loom_fsdp_mp_cfg_validate");

  /* without loss scaling the scaler's fields are not used, so not checked */
  loom_fsdp_mp_cfg c = loom_fsdp_mp_cfg_default();
  c.use_loss_scaling = false;
  c.loss_scale_growth_factor = 1.0f;
  c.loss_scale_backoff_factor = 7.0f;
  c.loss_scale_steps = 0;
  LT_OK(loom_fsdp_mp_cfg_validate(&c));
  loom_fsdp_mp_free(make(&c));

  /* a disabled configuration is valid whatever its other fields hold */
  c.enabled = false;
  c.forward_dtype = LOOM_I64;
  c.backward_dtype = LOOM_F16;
  c.initial_loss_scale = NAN;
  c.min_loss_scale = -1.0f;
  c.max_loss_scale = INFINITY;
  c.loss_scale_growth_factor = 0.0f;
  c.loss_scale_backoff_factor = 2.0f;
  c.loss_scale_steps = -1;
  LT_OK(loom_fsdp_mp_cfg_validate(&c));
  loom_fsdp_mp *m = make(&c);
  LT_TRUE(loom_fsdp_mp_scaler(m) == NULL);
  LT_EQ(loom_fsdp_mp_current_loss_scale(m), 1);
  loom_fsdp_mp_free(m);

  /* valid edge values: bf16 forward, initial at either bound */
  c = loom_fsdp_mp_cfg_default();
  c.forward_dtype = LOOM_BF16;
  LT_OK(loom_fsdp_mp_cfg_validate(&c));
  c.initial_loss_scale = 1.0f;
  LT_OK(loom_fsdp_mp_cfg_validate(&c));
  c.initial_loss_scale = 65536.0f;
  LT_OK(loom_fsdp_mp_cfg_validate(&c));
}

/* ---- conversions -------------------------------------------------------------------------- */

LT_TEST(fsdp_mp_converts_parameters_to_f16_rounding_to_nearest_even) {
  const float in[] = {
      1.0f + 0x1p-11f,              /* halfway 1 / 1+2^-10: to even, 1 */
      1.0f + 3 * 0x1p-11f,          /* halfway 1+2^-10 / 1+2^-9: to even, 1+2^-9 */
      1.0f + 0x1p-11f + 0x1p-20f,   /* above halfway: up */
      70000.0f,                     /* overflow: inf */
      -70000.0f,                    /* -inf */
      65504.0f,                     /* f16 max */
      65519.0f,                     /* below halfway to 65536: max */
      65520.0f,                     /* halfway: to even, inf */
      0x1p-24f,                     /* smallest subnormal, kept */
      0x1p-25f,                     /* halfway 0 / 2^-24: to even, 0 */
      3 * 0x1p-25f,                 /* halfway 2^-24 / 2^-23: to even, 2^-23 */
      -0.0f, INFINITY, -2.5f, 0.1f,
  };
  const uint16_t want[] = {0x3C00, 0x3C02, 0x3C01, 0x7C00, 0xFC00, 0x7BFF, 0x7BFF, 0x7C00,
                           0x0001, 0x0000, 0x0002, 0x8000, 0x7C00, 0xC100, 0x2E66};
  const int64_t n = sizeof in / sizeof in[0];
  loom_fsdp_mp_cfg c = loom_fsdp_mp_cfg_default();
  loom_fsdp_mp *m = make(&c);
  loom_tensor *p = tensor_f32(in, n), *h = NULL, *ref = NULL;
  LT_OK(loom_fsdp_mp_convert_to_mixed_precision(m, p, &h));
  LT_TRUE(h != p);
  LT_EQ(loom_tensor_dtype(h), LOOM_F16);
  LT_EQ(loom_tensor_numel(h), n);
  LT_TRUE(loom_tensor_same_shape(h, p));
  LT_OK(loom_tensor_cast(p, LOOM_F16, &ref));
  const uint16_t *hv = loom_tensor_data(h), *rv = loom_tensor_data(ref);
  for (int64_t i = 0; i < n; i++) {
    if (hv[i] != want[i]) lt_fail_at(__FILE__, __LINE__, "f16 of %a: 0x%04x, want 0x%04x",
                                     (double)in[i], hv[i], want[i]);
    LT_EQ_HEX(hv[i], rv[i]);
    LT_EQ_HEX(hv[i], loom_f32_to_f16(in[i]));
  }
  LT_EQ(lt_failures(), 0);
  /* the parameter is unchanged */
  const float *pv = loom_tensor_data(p);
  for (int64_t i = 0; i < n; i++) LT_EQ_HEX(f32_bits(pv[i]), f32_bits(in[i]));

  /* NaN stays NaN (quiet, same sign) */
  const float nan_in[] = {NAN, -NAN};
  loom_tensor *pn = tensor_f32(nan_in, 2), *hn = NULL;
  LT_OK(loom_fsdp_mp_convert_to_mixed_precision(m, pn, &hn));
  const uint16_t *nv = loom_tensor_data(hn);
  for (int i = 0; i < 2; i++) {
    LT_EQ_HEX(nv[i] & 0x7C00, 0x7C00);
    LT_TRUE((nv[i] & 0x03FF) != 0);
    LT_TRUE((nv[i] & 0x0200) != 0); /* quiet */
    LT_EQ((nv[i] >> 15) & 1, signbit(nan_in[i]) ? 1 : 0);
  }

  /* a strided view converts too (to a contiguous f16 tensor) */
  float grid[6] = {1, 2, 3, 4, 5, 70000};
  loom_tensor *g = NULL, *gt = NULL, *gh = NULL;
  LT_OK(loom_tensor_from_data(LOOM_F32, 2, (int64_t[]){2, 3}, grid, &g));
  LT_OK(loom_tensor_transpose(g, 0, 1, &gt));
  LT_OK(loom_fsdp_mp_convert_to_mixed_precision(m, gt, &gh));
  LT_TRUE(loom_tensor_is_contiguous(gh));
  LT_EQ(loom_tensor_dim(gh, 0), 3);
  const uint16_t *ghv = loom_tensor_data(gh);
  const uint16_t gwant[6] = {0x3C00, 0x4400, 0x4000, 0x4500, 0x4200, 0x7C00}; /* 1 4 2 5 3 inf */
  for (int i = 0; i < 6; i++) LT_EQ_HEX(ghv[i], gwant[i]);

  /* already f16: the same tensor, retained */
  loom_tensor *again = NULL;
  LT_OK(loom_fsdp_mp_convert_to_mixed_precision(m, h, &again));
  LT_TRUE(again == h);
  loom_tensor_free(again); /* h still alive: its own reference */
  LT_EQ(loom_tensor_dtype(h), LOOM_F16);

  /* integer tensors are not parameters */
  int32_t iv[2] = {1, 2};
  loom_tensor *it = NULL, *io = (loom_tensor *)&c;
  LT_OK(loom_tensor_from_data(LOOM_I32, 1, (int64_t[]){2}, iv, &it));
  LT_ERR(loom_fsdp_mp_convert_to_mixed_precision(m, it, &io), LOOM_EDTYPE, "i32");
  LT_TRUE(io == NULL);

  loom_tensor *all[] = {p, h, ref, pn, hn, g, gt, gh, it};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) loom_tensor_free(all[i]);
  loom_fsdp_mp_free(m);
}

LT_TEST(fsdp_mp_converts_parameters_to_bf16_rounding_to_nearest_even) {
  const float in[] = {
      1.0f + 0x1p-8f,            /* halfway 1 / 1+2^-7: to even, 1 */
      1.0f + 3 * 0x1p-8f,        /* halfway 1+2^-7 / 1+2^-6: to even, 1+2^-6 */
      1.0f + 0x1p-9f,            /* below halfway: 1 */
      1.0f + 0x1p-8f + 0x1p-20f, /* above halfway: up */
      70000.0f,                  /* f32 0x4788B800: bf16 keeps the range, 70144 */
      FLT_MAX,                   /* rounds up past bf16's max: inf */
      -0.0f, -INFINITY, 0x1p-130f /* f32 subnormal, kept */, 0.1f,
  };
  const uint16_t want[] = {0x3F80, 0x3F82, 0x3F80, 0x3F81, 0x4789,
                           0x7F80, 0x8000, 0xFF80, 0x0008, 0x3DCD};
  const int64_t n = sizeof in / sizeof in[0];
  loom_fsdp_mp_cfg c = loom_fsdp_mp_cfg_for(LOOM_BF16);
  loom_fsdp_mp *m = make(&c);
  loom_tensor *p = tensor_f32(in, n), *b = NULL, *ref = NULL;
  LT_OK(loom_fsdp_mp_convert_to_mixed_precision(m, p, &b));
  LT_EQ(loom_tensor_dtype(b), LOOM_BF16);
  LT_OK(loom_tensor_cast(p, LOOM_BF16, &ref));
  const uint16_t *bv = loom_tensor_data(b), *rv = loom_tensor_data(ref);
  for (int64_t i = 0; i < n; i++) {
    if (bv[i] != want[i]) lt_fail_at(__FILE__, __LINE__, "bf16 of %a: 0x%04x, want 0x%04x",
                                     (double)in[i], bv[i], want[i]);
    LT_EQ_HEX(bv[i], rv[i]);
    LT_EQ_HEX(bv[i], loom_f32_to_bf16(in[i]));
  }
  LT_EQ(lt_failures(), 0);
  LT_EQ(loom_bf16_to_f32(0x4789), 70144);

  /* an f16 tensor is cast to bf16 as well (through its exact f32 value) */
  const uint16_t hv[] = {0x3C01 /* 1+2^-10 */, 0x7BFF /* 65504 */};
  loom_tensor *h = tensor_u16(LOOM_F16, hv, 2), *hb = NULL;
  LT_OK(loom_fsdp_mp_convert_to_mixed_precision(m, h, &hb));
  LT_EQ(loom_tensor_dtype(hb), LOOM_BF16);
  const uint16_t *hbv = loom_tensor_data(hb);
  LT_EQ_HEX(hbv[0], 0x3F80); /* 1+2^-10 is below bf16's half ulp: 1 */
  LT_EQ_HEX(hbv[1], 0x4780); /* 65504 -> 65536 */

  loom_tensor *all[] = {p, b, ref, h, hb};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) loom_tensor_free(all[i]);
  loom_fsdp_mp_free(m);
}

LT_TEST(fsdp_mp_disabled_keeps_parameters) {
  loom_fsdp_mp_cfg c = loom_fsdp_mp_cfg_for(LOOM_F32);
  loom_fsdp_mp *m = make(&c);
  const float v[] = {1.0f + 0x1p-11f, 70000.0f};
  loom_tensor *p = tensor_f32(v, 2), *o = NULL;
  LT_OK(loom_fsdp_mp_convert_to_mixed_precision(m, p, &o));
  LT_TRUE(o == p);
  LT_EQ(loom_tensor_dtype(o), LOOM_F32);
  loom_tensor_free(o);
  /* gradients still come back in f32 */
  const uint16_t hv[] = {0x3C01};
  loom_tensor *g = tensor_u16(LOOM_F16, hv, 1), *g32 = NULL;
  LT_OK(loom_fsdp_mp_convert_gradient_to_fp32(m, g, &g32));
  LT_EQ(loom_tensor_dtype(g32), LOOM_F32);
  LT_EQ_HEX(f32_bits(*(const float *)loom_tensor_data(g32)), f32_bits(1.0f + 0x1p-10f));
  loom_tensor_free(g);
  loom_tensor_free(g32);
  loom_tensor_free(p);
  loom_fsdp_mp_free(m);
}

/* Every f16 and every bf16 bit pattern comes back to f32 exactly. */
LT_TEST(fsdp_mp_converts_gradients_back_to_f32_exactly) {
  loom_fsdp_mp_cfg c = loom_fsdp_mp_cfg_default();
  loom_fsdp_mp *m = make(&c);
  uint16_t *all = malloc(65536 * sizeof *all);
  LT_TRUE(all != NULL);
  for (uint32_t i = 0; i < 65536; i++) all[i] = (uint16_t)i;
  const loom_dtype dts[2] = {LOOM_F16, LOOM_BF16};
  for (int d = 0; d < 2; d++) {
    loom_tensor *g = tensor_u16(dts[d], all, 65536), *g32 = NULL;
    LT_OK(loom_fsdp_mp_convert_gradient_to_fp32(m, g, &g32));
    LT_EQ(loom_tensor_dtype(g32), LOOM_F32);
    LT_EQ(loom_tensor_numel(g32), 65536);
    const float *v = loom_tensor_data(g32);
    int bad = 0;
    for (uint32_t i = 0; i < 65536; i++) {
      uint16_t h = (uint16_t)i;
      float ref = dts[d] == LOOM_F16 ? loom_f16_to_f32(h) : loom_bf16_to_f32(h);
      bool ok = f32_bits(v[i]) == f32_bits(ref);
      if (dts[d] == LOOM_BF16 && !isnan(ref)) ok &= f32_bits(v[i]) == (uint32_t)h << 16;
      if (dts[d] == LOOM_F16 && !isnan(ref)) {
        /* exact value, computed independently: sign * mantissa * 2^exponent */
        int e = (h >> 10) & 31, f = h & 1023;
        double want = e == 31 ? INFINITY : e ? ldexp(1024 + f, e - 25) : ldexp(f, -24);
        if (h & 0x8000) want = -want;
        ok &= (double)v[i] == want && !signbit(v[i]) == !signbit(want);
      }
      if (isnan(ref)) ok &= isnan(v[i]) != 0;
      if (!ok && bad++ < 5)
        lt_fail_at(__FILE__, __LINE__, "%s 0x%04x -> f32 0x%08x, want 0x%08x",
                   loom_dtype_name(dts[d]), h, f32_bits(v[i]), f32_bits(ref));
    }
    LT_EQ(bad, 0);
    loom_tensor_free(g);
    loom_tensor_free(g32);
  }
  free(all);

  /* round trip of a parameter: f32 -> f16 -> f32 is the f16 value, exactly */
  const float pv[] = {0.1f, -3.14159f, 1.0f + 0x1p-11f, 1e-6f, 60000.0f};
  loom_tensor *p = tensor_f32(pv, 5), *h = NULL, *back = NULL;
  LT_OK(loom_fsdp_mp_convert_to_mixed_precision(m, p, &h));
  LT_OK(loom_fsdp_mp_convert_gradient_to_fp32(m, h, &back));
  const float *bv = loom_tensor_data(back);
  for (int i = 0; i < 5; i++)
    LT_EQ_HEX(f32_bits(bv[i]), f32_bits(loom_f16_to_f32(loom_f32_to_f16(pv[i]))));

  /* already f32: the same tensor, retained */
  loom_tensor *same = NULL;
  LT_OK(loom_fsdp_mp_convert_gradient_to_fp32(m, p, &same));
  LT_TRUE(same == p);
  loom_tensor_free(same);
  LT_EQ_HEX(f32_bits(((const float *)loom_tensor_data(p))[0]), f32_bits(0.1f));

  loom_tensor_free(p);
  loom_tensor_free(h);
  loom_tensor_free(back);
  loom_fsdp_mp_free(m);
}

/* ---- loss scaling ------------------------------------------------------------------------- */

LT_TEST(fsdp_mp_scales_the_loss_on_the_tape) {
  loom_fsdp_mp_cfg c = loom_fsdp_mp_cfg_default();
  c.loss_scale_steps = 1; /* every clean step doubles the scale */
  loom_fsdp_mp *m = make(&c);
  const float wv[] = {0.5f, -1.25f, 3.0f}, xv[] = {1.0f, 2.0f, -4.0f};
  for (int step = 0; step < 3; step++) {
    float scale = loom_fsdp_mp_current_loss_scale(m);
    LT_EQ(scale, 2 << step); /* 2, 4, 8 */
    loom_tensor *w = tensor_f32(wv, 3), *x = tensor_f32(xv, 3), *wx = NULL, *loss = NULL,
                *scaled = NULL;
    LT_OK(loom_tensor_set_requires_grad(w, true));
    LT_OK(loom_mul(w, x, &wx));
    LT_OK(loom_sum(wx, NULL, 0, false, &loss));
    double lv, sv;
    LT_OK(loom_tensor_item(loss, &lv));
    LT_OK(loom_fsdp_mp_scale_loss(m, loss, &scaled));
    LT_TRUE(scaled != loss);
    LT_EQ(loom_tensor_dtype(scaled), LOOM_F32);
    LT_OK(loom_tensor_item(scaled, &sv));
    LT_EQ_HEX(f32_bits((float)sv), f32_bits((float)lv * scale)); /* loss x scale */
    LT_OK(loom_tensor_item(loss, &lv));
    LT_NEAR(lv, 0.5 - 2.5 - 12.0, 0); /* the loss itself is unchanged */
    LT_TRUE(loom_tensor_requires_grad(scaled));
    LT_OK(loom_backward(scaled, NULL, false));
    const float *gv = loom_tensor_data(loom_tensor_grad(w));
    for (int i = 0; i < 3; i++) LT_EQ_HEX(f32_bits(gv[i]), f32_bits(xv[i] * scale));

    /* d(scaled)/d(loss) = scale: backward of the scaled loss alone */
    loom_tensor *l = NULL, *ls = NULL;
    const float one[] = {0.75f};
    LT_OK(loom_tensor_from_data(LOOM_F32, 0, NULL, one, &l));
    LT_OK(loom_tensor_set_requires_grad(l, true));
    LT_OK(loom_fsdp_mp_scale_loss(m, l, &ls));
    LT_OK(loom_tensor_item(ls, &sv));
    LT_EQ_HEX(f32_bits((float)sv), f32_bits(0.75f * scale));
    LT_OK(loom_backward(ls, NULL, false));
    LT_EQ_HEX(f32_bits(*(const float *)loom_tensor_data(loom_tensor_grad(l))), f32_bits(scale));

    bool ov = true;
    LT_OK(loom_fsdp_mp_check_overflow(m, (loom_tensor *[]){loom_tensor_grad(w)}, 1, &ov));
    LT_TRUE(!ov);
    loom_tensor *all[] = {w, x, wx, loss, scaled, l, ls};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) loom_tensor_free(all[i]);
  }
  loom_fsdp_mp_free(m);

  /* without loss scaling: the loss itself */
  c = loom_fsdp_mp_cfg_for(LOOM_BF16);
  m = make(&c);
  const float lv1[] = {0.75f};
  loom_tensor *l = tensor_f32(lv1, 1), *o = NULL;
  LT_OK(loom_fsdp_mp_scale_loss(m, l, &o));
  LT_TRUE(o == l);
  loom_tensor_free(o);
  loom_tensor_free(l);
  loom_fsdp_mp_free(m);
}

/* ---- overflow and the scale --------------------------------------------------------------- */

LT_TEST(fsdp_mp_detects_nan_and_inf_and_backs_off_to_min) {
  loom_fsdp_mp_cfg c = loom_fsdp_mp_cfg_default();
  loom_fsdp_mp *m = make(&c);
  loom_scaler *s = loom_fsdp_mp_scaler(m);
  const float clean[] = {1.0f, -2.0f, 65504.0f, FLT_MAX, -FLT_MAX, 0x1p-149f};
  const float bad_vals[] = {NAN, INFINITY, -INFINITY, -NAN};
  loom_tensor *ok = tensor_f32(clean, 6);

  /* clean gradients: no overflow, a clean step counted, scale kept */
  bool ov = true;
  LT_OK(loom_fsdp_mp_check_overflow(m, (loom_tensor *[]){ok, NULL, ok}, 3, &ov));
  LT_TRUE(!ov);
  LT_EQ(loom_fsdp_mp_current_loss_scale(m), 2);
  LT_EQ(loom_scaler_growth_counter(s), 1);
  /* an empty list is clean too */
  LT_OK(loom_fsdp_mp_check_overflow(m, NULL, 0, &ov));
  LT_TRUE(!ov);
  LT_EQ(loom_scaler_growth_counter(s), 2);

  for (size_t k = 0; k < sizeof bad_vals / sizeof bad_vals[0]; k++) {
    for (int pos = 0; pos < 5; pos += 4) { /* first or last element */
      LT_OK(loom_fsdp_mp_reset_loss_scale(m));
      LT_OK(loom_fsdp_mp_update(m, false)); /* a clean step to see the counter reset */
      LT_EQ(loom_scaler_growth_counter(s), 1);
      float v[5] = {1, 2, 3, 4, 5};
      v[pos] = bad_vals[k];
      loom_tensor *g = tensor_f32(v, 5);
      /* the bad gradient after a clean one and a NULL entry */
      LT_OK(loom_fsdp_mp_check_overflow(m, (loom_tensor *[]){ok, NULL, g}, 3, &ov));
      LT_TRUE(ov);
      LT_EQ(loom_fsdp_mp_current_loss_scale(m), 1); /* 2 x 0.5 */
      LT_EQ(loom_scaler_growth_counter(s), 0);
      /* again: max(1, 1 x 0.5) = 1, clamped at min */
      LT_OK(loom_fsdp_mp_check_overflow(m, (loom_tensor *[]){g}, 1, &ov));
      LT_TRUE(ov);
      LT_EQ(loom_fsdp_mp_current_loss_scale(m), 1);
      loom_tensor_free(g);
    }
  }

  /* f16 and bf16 gradients as stored: inf / NaN patterns found, finite max not */
  const uint16_t f16_inf[] = {0x3C00, 0xFC00}, f16_nan[] = {0x7E00}, f16_max[] = {0x7BFF, 0xFBFF};
  const uint16_t bf16_nan[] = {0x3F80, 0x7FC1}, bf16_inf[] = {0x7F80}, bf16_max[] = {0x7F7F};
  struct {
    loom_dtype dt;
    const uint16_t *v;
    int64_t n;
    bool bad;
  } cases[] = {{LOOM_F16, f16_inf, 2, true},   {LOOM_F16, f16_nan, 1, true},
               {LOOM_F16, f16_max, 2, false},  {LOOM_BF16, bf16_nan, 2, true},
               {LOOM_BF16, bf16_inf, 1, true}, {LOOM_BF16, bf16_max, 1, false}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    LT_OK(loom_fsdp_mp_reset_loss_scale(m));
    loom_tensor *g = tensor_u16(cases[k].dt, cases[k].v, cases[k].n);
    LT_OK(loom_fsdp_mp_check_overflow(m, (loom_tensor *[]){g}, 1, &ov));
    LT_EQ(ov, cases[k].bad);
    LT_EQ(loom_fsdp_mp_current_loss_scale(m), cases[k].bad ? 1 : 2);
    loom_tensor_free(g);
  }

  /* integer gradients are refused, and the scale is left alone */
  LT_OK(loom_fsdp_mp_reset_loss_scale(m));
  int32_t iv[1] = {1};
  loom_tensor *it = NULL;
  LT_OK(loom_tensor_from_data(LOOM_I32, 1, (int64_t[]){1}, iv, &it));
  LT_ERR(loom_fsdp_mp_check_overflow(m, (loom_tensor *[]){it}, 1, &ov), LOOM_EDTYPE, "i32");
  LT_EQ(loom_scaler_growth_counter(s), 0);
  loom_tensor_free(it);

  /* a larger backoff chain: 65536 -> 1 in 16 overflows, then clamped */
  c.initial_loss_scale = 65536.0f;
  loom_fsdp_mp *m2 = make(&c);
  for (int i = 15; i >= 0; i--) {
    LT_OK(loom_fsdp_mp_update(m2, true));
    LT_EQ(loom_fsdp_mp_current_loss_scale(m2), 1 << i);
  }
  LT_OK(loom_fsdp_mp_update(m2, true));
  LT_EQ(loom_fsdp_mp_current_loss_scale(m2), 1);
  loom_scaler_stats st;
  LT_OK(loom_scaler_stats_get(loom_fsdp_mp_scaler(m2), &st));
  LT_EQ(st.total_overflows, 17);
  loom_fsdp_mp_free(m2);

  loom_tensor_free(ok);
  loom_fsdp_mp_free(m);
}

LT_TEST(fsdp_mp_grows_after_exactly_loss_scale_steps_clean_steps_up_to_max) {
  /* the defaults: 1999 clean steps keep 2, the 2000th makes it 4 */
  loom_fsdp_mp_cfg c = loom_fsdp_mp_cfg_default();
  loom_fsdp_mp *m = make(&c);
  const float v[] = {1.0f};
  loom_tensor *g = tensor_f32(v, 1);
  bool ov;
  for (int i = 1; i < 2000; i++) {
    LT_OK(loom_fsdp_mp_check_overflow(m, (loom_tensor *[]){g}, 1, &ov));
    if (loom_fsdp_mp_current_loss_scale(m) != 2) {
      LT_EQ(i, -1); /* grew early */
      break;
    }
  }
  LT_EQ(loom_scaler_growth_counter(loom_fsdp_mp_scaler(m)), 1999);
  LT_OK(loom_fsdp_mp_check_overflow(m, (loom_tensor *[]){g}, 1, &ov));
  LT_TRUE(!ov);
  LT_EQ(loom_fsdp_mp_current_loss_scale(m), 4);
  LT_EQ(loom_scaler_growth_counter(loom_fsdp_mp_scaler(m)), 0);
  loom_fsdp_mp_free(m);

  /* an overflow restarts the count: 4 clean, overflow, 4 clean keep the scale; the 5th grows */
  c.loss_scale_steps = 5;
  c.initial_loss_scale = 2.0f;
  c.max_loss_scale = 8.0f;
  m = make(&c);
  for (int i = 0; i < 4; i++) LT_OK(loom_fsdp_mp_update(m, false));
  LT_EQ(loom_fsdp_mp_current_loss_scale(m), 2);
  LT_OK(loom_fsdp_mp_update(m, true));
  LT_EQ(loom_fsdp_mp_current_loss_scale(m), 1);
  for (int i = 0; i < 4; i++) LT_OK(loom_fsdp_mp_update(m, false));
  LT_EQ(loom_fsdp_mp_current_loss_scale(m), 1);
  LT_OK(loom_fsdp_mp_update(m, false));
  LT_EQ(loom_fsdp_mp_current_loss_scale(m), 2);
  /* 5 more: 4; 5 more: 8 = max; 5 more: capped at 8 (and the count restarts) */
  const float want[] = {4, 8, 8, 8};
  for (int r = 0; r < 4; r++) {
    for (int i = 0; i < 4; i++) LT_OK(loom_fsdp_mp_update(m, false));
    LT_EQ(loom_fsdp_mp_current_loss_scale(m), r == 0 ? 2 : want[r - 1]);
    LT_OK(loom_fsdp_mp_update(m, false));
    LT_EQ(loom_fsdp_mp_current_loss_scale(m), want[r]);
    LT_EQ(loom_scaler_growth_counter(loom_fsdp_mp_scaler(m)), 0);
  }
  loom_fsdp_mp_free(m);

  /* growth capped at a max that is not a power-of-two multiple: 6 x 2 = 12 -> 10 */
  c.initial_loss_scale = 6.0f;
  c.max_loss_scale = 10.0f;
  c.loss_scale_steps = 1;
  m = make(&c);
  LT_OK(loom_fsdp_mp_update(m, false));
  LT_EQ(loom_fsdp_mp_current_loss_scale(m), 10);
  LT_OK(loom_fsdp_mp_update(m, false));
  LT_EQ(loom_fsdp_mp_current_loss_scale(m), 10);
  loom_tensor_free(g);
  loom_fsdp_mp_free(m);
}

/* The reused dynamic scaler against the spec's rule, over long seeded random sequences of
 * decisions (half through check_overflow with real gradients, half through update), with
 * several factors, step counts and bounds: the scale (bit for bit) and the clean-step count
 * must match after every step. */
LT_TEST(fsdp_mp_random_sequences_match_the_specs_rule) {
  struct {
    float init, min, max, growth, backoff;
    int64_t steps;
    uint32_t overflow_per_mille;
  } cfgs[] = {
      {2, 1, 65536, 2, 0.5f, 2000, 1},   /* the defaults, rare overflows: reaches growth */
      {2, 1, 65536, 2, 0.5f, 3, 250},
      {1024, 1, 4096, 2, 0.5f, 1, 400},  /* growth on every clean step */
      {3, 0.7f, 100, 3, 0.3f, 7, 150},   /* non-power-of-two factors: f32 products */
      {1, 1, 1, 2, 0.5f, 2, 500},        /* min = max: the scale never moves */
      {1.5f, 0.001f, 1e6f, 1.1f, 0.9f, 4, 300},
      {65536, 1, 65536, 2, 0.25f, 10, 80},
  };
  const float fin[] = {1.0f, -3.0f, 0.5f, 1e30f}, nonfin[] = {NAN, INFINITY, -INFINITY};
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
    loom_fsdp_mp_cfg c = loom_fsdp_mp_cfg_default();
    c.initial_loss_scale = cfgs[k].init;
    c.min_loss_scale = cfgs[k].min;
    c.max_loss_scale = cfgs[k].max;
    c.loss_scale_growth_factor = cfgs[k].growth;
    c.loss_scale_backoff_factor = cfgs[k].backoff;
    c.loss_scale_steps = cfgs[k].steps;
    loom_fsdp_mp *m = make(&c);
    spec_manager ref = {cfgs[k].init, 0, cfgs[k].min, cfgs[k].max, cfgs[k].growth,
                        cfgs[k].backoff, cfgs[k].steps};
    float gv[4];
    loom_tensor *g = tensor_f32(fin, 4);
    float *gd = loom_tensor_data(g);
    int64_t overflows = 0, grows = 0;
    for (int step = 0; step < 20000; step++) {
      bool overflow = xorshift(&rng) % 1000 < cfgs[k].overflow_per_mille;
      if (xorshift(&rng) & 1) {
        memcpy(gv, fin, sizeof gv);
        if (overflow) gv[xorshift(&rng) % 4] = nonfin[xorshift(&rng) % 3];
        memcpy(gd, gv, sizeof gv);
        bool ov = !overflow;
        LT_OK(loom_fsdp_mp_check_overflow(m, (loom_tensor *[]){g}, 1, &ov));
        LT_EQ(ov, overflow);
      } else {
        LT_OK(loom_fsdp_mp_update(m, overflow));
      }
      float before = ref.current_loss_scale;
      spec_check(&ref, overflow);
      overflows += overflow;
      grows += ref.current_loss_scale > before;
      float got = loom_fsdp_mp_current_loss_scale(m);
      if (f32_bits(got) != f32_bits(ref.current_loss_scale) ||
          loom_scaler_growth_counter(loom_fsdp_mp_scaler(m)) != ref.steps_since_overflow) {
        lt_fail_at(__FILE__, __LINE__, "config %zu step %d (%s): scale %a count %lld, spec %a "
                   "count %lld", k, step, overflow ? "overflow" : "clean", (double)got,
                   (long long)loom_scaler_growth_counter(loom_fsdp_mp_scaler(m)),
                   (double)ref.current_loss_scale, (long long)ref.steps_since_overflow);
        break;
      }
    }
    LT_EQ(lt_failures(), 0);
    LT_TRUE(overflows > 0);
    if (cfgs[k].min < cfgs[k].max) LT_TRUE(grows > 0); /* both directions were exercised */
    loom_tensor_free(g);

    /* reset gives the spec's ResetLossScale: initial scale, count 0 */
    LT_OK(loom_fsdp_mp_reset_loss_scale(m));
    LT_EQ_HEX(f32_bits(loom_fsdp_mp_current_loss_scale(m)), f32_bits(cfgs[k].init));
    LT_EQ(loom_scaler_growth_counter(loom_fsdp_mp_scaler(m)), 0);
    loom_fsdp_mp_free(m);
  }
}

LT_TEST(fsdp_mp_without_loss_scaling_reports_no_overflow_and_scale_1) {
  loom_fsdp_mp_cfg configs[3];
  configs[0] = loom_fsdp_mp_cfg_default();
  configs[0].use_loss_scaling = false; /* f16, no loss scaling */
  configs[1] = loom_fsdp_mp_cfg_for(LOOM_BF16);
  configs[2] = loom_fsdp_mp_cfg_default();
  configs[2].enabled = false; /* mixed precision off: use_loss_scaling has no effect */
  const float v[] = {NAN, INFINITY, -INFINITY};
  for (int k = 0; k < 3; k++) {
    loom_fsdp_mp *m = make(&configs[k]);
    LT_TRUE(loom_fsdp_mp_scaler(m) == NULL);
    LT_EQ_HEX(f32_bits(loom_fsdp_mp_current_loss_scale(m)), f32_bits(1.0f));
    loom_tensor *g = tensor_f32(v, 3);
    for (int i = 0; i < 5; i++) {
      bool ov = true;
      LT_OK(loom_fsdp_mp_check_overflow(m, (loom_tensor *[]){g}, 1, &ov));
      LT_TRUE(!ov);
      LT_OK(loom_fsdp_mp_update(m, true));
      LT_OK(loom_fsdp_mp_update(m, false));
      LT_EQ_HEX(f32_bits(loom_fsdp_mp_current_loss_scale(m)), f32_bits(1.0f));
    }
    LT_OK(loom_fsdp_mp_reset_loss_scale(m));
    LT_EQ(loom_fsdp_mp_current_loss_scale(m), 1);
    loom_tensor *o = NULL;
    LT_OK(loom_fsdp_mp_scale_loss(m, g, &o));
    LT_TRUE(o == g);
    loom_tensor_free(o);
    loom_tensor_free(g);
    loom_fsdp_mp_free(m);
  }
}

LT_TEST(fsdp_mp_f16_and_bf16_configs) {
  loom_fsdp_mp_cfg c16, cb;
  c16 = loom_fsdp_mp_cfg_for(LOOM_F16);
  cb = loom_fsdp_mp_cfg_for(LOOM_BF16);
  loom_fsdp_mp *m16 = make(&c16), *mb = make(&cb);
  /* f16 has loss scaling (its range is small); bf16 has f32's range and none */
  LT_TRUE(loom_fsdp_mp_scaler(m16) != NULL);
  LT_TRUE(loom_fsdp_mp_scaler(mb) == NULL);
  LT_EQ(loom_fsdp_mp_current_loss_scale(m16), 2);
  LT_EQ(loom_fsdp_mp_current_loss_scale(mb), 1);
  LT_EQ(loom_fsdp_mp_config(m16)->forward_dtype, LOOM_F16);
  LT_EQ(loom_fsdp_mp_config(mb)->forward_dtype, LOOM_BF16);

  /* the same parameter: f16 overflows at 70000, bf16 does not; a small value underflows in
   * f16 and not in bf16 */
  const float v[] = {70000.0f, 1e-8f, 1.0f + 0x1p-9f};
  loom_tensor *p = tensor_f32(v, 3), *h = NULL, *b = NULL, *h32 = NULL, *b32 = NULL;
  LT_OK(loom_fsdp_mp_convert_to_mixed_precision(m16, p, &h));
  LT_OK(loom_fsdp_mp_convert_to_mixed_precision(mb, p, &b));
  LT_EQ(loom_tensor_dtype(h), LOOM_F16);
  LT_EQ(loom_tensor_dtype(b), LOOM_BF16);
  LT_OK(loom_fsdp_mp_convert_gradient_to_fp32(m16, h, &h32));
  LT_OK(loom_fsdp_mp_convert_gradient_to_fp32(mb, b, &b32));
  const float *hv = loom_tensor_data(h32), *bv = loom_tensor_data(b32);
  LT_TRUE(isinf(hv[0]));
  LT_EQ(bv[0], 70144);
  LT_EQ(hv[1], 0); /* below half of f16's smallest subnormal */
  LT_EQ_HEX(f32_bits(bv[1]), f32_bits(loom_bf16_to_f32(loom_f32_to_bf16(1e-8f))));
  LT_TRUE(bv[1] > 0);
  LT_EQ_HEX(f32_bits(hv[2]), f32_bits(1.0f + 0x1p-9f)); /* f16 keeps 1+2^-9 */
  LT_EQ_HEX(f32_bits(bv[2]), f32_bits(1.0f));          /* bf16 rounds it to 1 */
  bool ov;
  LT_OK(loom_fsdp_mp_check_overflow(m16, (loom_tensor *[]){h32}, 1, &ov));
  LT_TRUE(ov);
  LT_EQ(loom_fsdp_mp_current_loss_scale(m16), 1);
  LT_OK(loom_fsdp_mp_check_overflow(mb, (loom_tensor *[]){h32}, 1, &ov));
  LT_TRUE(!ov); /* the spec: no loss scaling, no overflow reported */

  loom_tensor *all[] = {p, h, b, h32, b32};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) loom_tensor_free(all[i]);
  loom_fsdp_mp_free(m16);
  loom_fsdp_mp_free(mb);
}

LT_TEST(fsdp_mp_reset_loss_scale) {
  loom_fsdp_mp_cfg c = loom_fsdp_mp_cfg_default();
  c.initial_loss_scale = 16.0f;
  c.loss_scale_steps = 3;
  loom_fsdp_mp *m = make(&c);
  for (int i = 0; i < 6; i++) LT_OK(loom_fsdp_mp_update(m, false)); /* 16 -> 32 -> 64 */
  LT_OK(loom_fsdp_mp_update(m, false));
  LT_EQ(loom_fsdp_mp_current_loss_scale(m), 64);
  LT_EQ(loom_scaler_growth_counter(loom_fsdp_mp_scaler(m)), 1);
  LT_OK(loom_fsdp_mp_reset_loss_scale(m));
  LT_EQ(loom_fsdp_mp_current_loss_scale(m), 16);
  LT_EQ(loom_scaler_growth_counter(loom_fsdp_mp_scaler(m)), 0);
  /* the count really restarted: 2 clean steps keep 16, the 3rd grows */
  LT_OK(loom_fsdp_mp_update(m, false));
  LT_OK(loom_fsdp_mp_update(m, false));
  LT_EQ(loom_fsdp_mp_current_loss_scale(m), 16);
  LT_OK(loom_fsdp_mp_update(m, false));
  LT_EQ(loom_fsdp_mp_current_loss_scale(m), 32);
  /* after backoff too */
  LT_OK(loom_fsdp_mp_update(m, true));
  LT_OK(loom_fsdp_mp_update(m, true));
  LT_EQ(loom_fsdp_mp_current_loss_scale(m), 8);
  LT_OK(loom_fsdp_mp_reset_loss_scale(m));
  LT_EQ(loom_fsdp_mp_current_loss_scale(m), 16);
  loom_fsdp_mp_free(m);
}

/* scale_loss opens the scaler's step, so the gradients may be unscaled through the scaler (as
 * loom_fsdp_check_overflow does); update (or check_overflow) closes it. */
LT_TEST(fsdp_mp_follows_the_scalers_step) {
  loom_fsdp_mp_cfg c = loom_fsdp_mp_cfg_default();
  c.initial_loss_scale = 8.0f;
  loom_fsdp_mp *m = make(&c);
  loom_scaler *s = loom_fsdp_mp_scaler(m);
  const float gv[] = {8.0f, -24.0f};
  loom_tensor *g = tensor_f32(gv, 2), *loss = tensor_f32(gv, 1), *scaled = NULL;
  bool inf = true;
  /* nothing scaled yet: the scaler refuses an unscale (its protocol) */
  LT_ERR(loom_scaler_unscale(s, (loom_tensor *[]){g}, 1, &inf), LOOM_EMISUSE, "no loss");
  LT_OK(loom_fsdp_mp_scale_loss(m, loss, &scaled));
  LT_OK(loom_scaler_unscale(s, (loom_tensor *[]){g}, 1, &inf));
  LT_TRUE(!inf);
  const float *d = loom_tensor_data(g);
  LT_EQ(d[0], 1);
  LT_EQ(d[1], -3);
  /* a second scaled loss before the update is refused by the scaler */
  loom_tensor *again = (loom_tensor *)&c;
  LT_ERR(loom_fsdp_mp_scale_loss(m, loss, &again), LOOM_EMISUSE, "already unscaled");
  LT_TRUE(again == NULL);
  LT_OK(loom_fsdp_mp_update(m, inf));
  float gs;
  LT_ERR(loom_scaler_grad_scale(s, &gs), LOOM_EMISUSE, "loom_scaler_grad_scale");
  loom_tensor_free(scaled);
  /* gradient accumulation: two scaled losses, one check */
  LT_OK(loom_fsdp_mp_scale_loss(m, loss, &scaled));
  loom_tensor_free(scaled);
  LT_OK(loom_fsdp_mp_scale_loss(m, loss, &scaled));
  loom_tensor_free(scaled);
  bool ov;
  LT_OK(loom_fsdp_mp_check_overflow(m, (loom_tensor *[]){g}, 1, &ov));
  LT_TRUE(!ov);
  /* check_overflow closed the step: the next scaled loss opens a new one */
  LT_OK(loom_fsdp_mp_scale_loss(m, loss, &scaled));
  loom_tensor_free(scaled);
  loom_scaler_stats st;
  LT_OK(loom_scaler_stats_get(s, &st));
  LT_EQ(st.total_successful_iterations, 2);
  LT_EQ(st.total_overflows, 0);
  loom_tensor_free(g);
  loom_tensor_free(loss);
  loom_fsdp_mp_free(m);
}

LT_TEST(fsdp_mp_null_arguments) {
  loom_fsdp_mp_cfg c = loom_fsdp_mp_cfg_default();
  loom_fsdp_mp *m = (loom_fsdp_mp *)&c;
  LT_ERR(loom_fsdp_mp_create(NULL, &m), LOOM_EINVAL, "loom_fsdp_mp_create: cfg is NULL");
  LT_TRUE(m == NULL);
  LT_ERR(loom_fsdp_mp_create(&c, NULL), LOOM_EINVAL, "loom_fsdp_mp_create: out is NULL");
  m = make(&c);
  const float v[] = {1.0f};
  loom_tensor *t = tensor_f32(v, 1), *o = t;
  bool ov = true;

  LT_ERR(loom_fsdp_mp_convert_to_mixed_precision(NULL, t, &o), LOOM_EINVAL, "manager is NULL");
  LT_TRUE(o == NULL);
  LT_ERR(loom_fsdp_mp_convert_to_mixed_precision(m, NULL, &o), LOOM_EINVAL,
         "loom_fsdp_mp_convert_to_mixed_precision: parameter is NULL");
  LT_ERR(loom_fsdp_mp_convert_to_mixed_precision(m, t, NULL), LOOM_EINVAL, "out is NULL");
  LT_ERR(loom_fsdp_mp_convert_gradient_to_fp32(NULL, t, &o), LOOM_EINVAL, "manager is NULL");
  LT_ERR(loom_fsdp_mp_convert_gradient_to_fp32(m, NULL, &o), LOOM_EINVAL,
         "loom_fsdp_mp_convert_gradient_to_fp32: gradient is NULL");
  LT_ERR(loom_fsdp_mp_convert_gradient_to_fp32(m, t, NULL), LOOM_EINVAL, "out is NULL");
  LT_ERR(loom_fsdp_mp_scale_loss(NULL, t, &o), LOOM_EINVAL, "manager is NULL");
  LT_ERR(loom_fsdp_mp_scale_loss(m, NULL, &o), LOOM_EINVAL, "loom_fsdp_mp_scale_loss: loss is NULL");
  LT_ERR(loom_fsdp_mp_scale_loss(m, t, NULL), LOOM_EINVAL, "out is NULL");
  LT_ERR(loom_fsdp_mp_check_overflow(NULL, &t, 1, &ov), LOOM_EINVAL, "manager is NULL");
  LT_ERR(loom_fsdp_mp_check_overflow(m, NULL, 1, &ov), LOOM_EINVAL,
         "loom_fsdp_mp_check_overflow: grads is NULL");
  LT_ERR(loom_fsdp_mp_check_overflow(m, &t, 1, NULL), LOOM_EINVAL, "overflow is NULL");
  LT_ERR(loom_fsdp_mp_update(NULL, false), LOOM_EINVAL, "loom_fsdp_mp_update: manager is NULL");
  LT_ERR(loom_fsdp_mp_reset_loss_scale(NULL), LOOM_EINVAL, "manager is NULL");
  loom_clear_error();
  LT_EQ(loom_fsdp_mp_current_loss_scale(NULL), 0);
  LT_TRUE(strstr(loom_last_error(), "manager is NULL") != NULL);
  LT_TRUE(loom_fsdp_mp_scaler(NULL) == NULL);
  LT_TRUE(loom_fsdp_mp_config(NULL) == NULL);
  /* none of that touched the scale */
  LT_EQ(loom_fsdp_mp_current_loss_scale(m), 2);
  LT_EQ(loom_scaler_growth_counter(loom_fsdp_mp_scaler(m)), 0);
  loom_tensor_free(t);
  loom_fsdp_mp_free(m);
}
