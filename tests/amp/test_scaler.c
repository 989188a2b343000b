/* test_scaler.c: the loss scalers against the seed spec (amp-dynamic-loss-scaler.md): the
 * update rule step by step and against a literal transcription of the spec's UpdateScale over
 * long random overflow sequences (several growth/backoff factors and intervals), growth after
 * exactly growth_interval clean steps, the min/max bounds, overflow on the first step and
 * continuous overflow, the disabled scaler, statistics and success rate and their text,
 * presets, reset, validation (one message per bad field), and the static scaler. */
#include "lt.h"
#include "amp/amp_int.h"

#include <math.h>
#include <stdlib.h>

/* The spec's UpdateScale, transcribed (the reference the scaler must match exactly). */
typedef struct spec_model {
  float scale, growth, backoff, min, max;
  int64_t interval, counter, overflows;
} spec_model;

static void spec_update(spec_model *m, bool overflow) {
  if (overflow) {
    m->scale = fmaxf(m->scale * m->backoff, m->min);
    m->counter = 0;
    m->overflows++;
  } else {
    m->counter++;
    if (m->counter >= m->interval) {
      m->scale = fminf(m->scale * m->growth, m->max);
      m->counter = 0;
    }
  }
}

static loom_scaler *dyn(float initial, float growth, float backoff, int64_t interval, float min,
                        float max) {
  loom_dynamic_scaler_cfg c = {initial, growth, backoff, interval, min, max, true};
  loom_scaler *s = NULL;
  LT_OK(loom_scaler_create_dynamic(&c, &s));
  return s;
}

LT_TEST(scaler_defaults_are_the_specs) {
  loom_dynamic_scaler_cfg c = loom_dynamic_scaler_cfg_default();
  LT_EQ(c.initial_scale, 65536);
  LT_EQ(c.growth_factor, 2);
  LT_EQ(c.backoff_factor * 2, 1);
  LT_EQ(c.growth_interval, 2000);
  LT_EQ(c.min_scale, 1);
  LT_EQ(c.max_scale, 16777216);
  LT_TRUE(c.enabled);
  loom_scaler *s = NULL;
  LT_OK(loom_scaler_create_dynamic(NULL, &s));
  LT_EQ(loom_scaler_get_kind(s), LOOM_SCALER_DYNAMIC);
  LT_STREQ(loom_scaler_kind_name(loom_scaler_get_kind(s)), "dynamic");
  LT_EQ(loom_scaler_get_scale(s), 65536);
  LT_NEAR(loom_scaler_get_inv_scale(s), 1.0 / 65536, 0);
  LT_TRUE(loom_scaler_enabled(s));
  LT_EQ(loom_scaler_growth_counter(s), 0);
  LT_EQ(loom_scaler_total_overflows(s), 0);
  loom_dynamic_scaler_cfg got;
  LT_OK(loom_scaler_get_config(s, &got));
  LT_EQ(got.growth_interval, 2000);
  LT_EQ(got.max_scale, 16777216);
  loom_scaler_free(s);
  loom_scaler_free(NULL);
}

LT_TEST(scaler_grows_after_exactly_growth_interval_clean_steps) {
  loom_scaler *s = NULL;
  LT_OK(loom_scaler_create_dynamic(NULL, &s));
  for (int i = 1; i < 2000; i++) {
    LT_OK(loom_scaler_update(s, false));
    if (loom_scaler_get_scale(s) != 65536) {
      LT_EQ(i, -1); /* grew early */
      break;
    }
  }
  LT_EQ(loom_scaler_growth_counter(s), 1999);
  LT_OK(loom_scaler_update(s, false)); /* the 2000th */
  LT_EQ(loom_scaler_get_scale(s), 131072);
  LT_EQ(loom_scaler_growth_counter(s), 0);
  /* an overflow in between restarts the count */
  for (int i = 0; i < 1500; i++) LT_OK(loom_scaler_update(s, false));
  LT_OK(loom_scaler_update(s, true));
  LT_EQ(loom_scaler_get_scale(s), 65536);
  LT_EQ(loom_scaler_growth_counter(s), 0);
  for (int i = 0; i < 1999; i++) LT_OK(loom_scaler_update(s, false));
  LT_EQ(loom_scaler_get_scale(s), 65536);
  LT_OK(loom_scaler_update(s, false));
  LT_EQ(loom_scaler_get_scale(s), 131072);
  loom_scaler_free(s);
}

LT_TEST(scaler_update_sequence_step_by_step) {
  /* interval 3, growth 2, backoff 0.5, bounds [1, 64], starting at 8 */
  loom_scaler *s = dyn(8, 2, 0.5f, 3, 1, 64);
  static const struct {
    bool overflow;
    float scale;
    int64_t counter;
  } steps[] = {
      {true, 4, 0},   /* overflow on the first step: back off */
      {false, 4, 1},  {false, 4, 2}, {false, 8, 0}, /* third clean step: grow */
      {false, 8, 1},  {true, 4, 0},                 /* overflow resets the counter */
      {true, 2, 0},   {true, 1, 0},  {true, 1, 0},  /* floor at min_scale */
      {false, 1, 1},  {false, 1, 2}, {false, 2, 0},
      {false, 2, 1},  {false, 2, 2}, {false, 4, 0},
      {false, 4, 1},  {false, 4, 2}, {false, 8, 0},
  };
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    LT_OK(loom_scaler_update(s, steps[i].overflow));
    LT_EQ(loom_scaler_get_scale(s), steps[i].scale);
    LT_EQ(loom_scaler_growth_counter(s), steps[i].counter);
  }
  LT_EQ(loom_scaler_total_overflows(s), 5);
  loom_scaler_stats st;
  LT_OK(loom_scaler_stats(s, &st));
  LT_EQ(st.total_overflows, 5);
  LT_EQ(st.total_successful_iterations, 13);
  LT_EQ(st.scale_increase_count, 4);
  LT_EQ(st.scale_decrease_count, 4); /* the overflow at min_scale changed nothing */
  LT_EQ(st.min_scale_reached, 1);
  LT_EQ(st.max_scale_reached, 8);
  LT_EQ(st.current_scale, 8);
  LT_NEAR(st.success_rate, 13.0 / 18.0, 1e-12);
  loom_scaler_free(s);
}

LT_TEST(scaler_caps_at_max_scale) {
  loom_scaler *s = dyn(16, 2, 0.5f, 1, 1, 48); /* 48 is not a power-of-two multiple of 16 */
  LT_OK(loom_scaler_update(s, false));
  LT_EQ(loom_scaler_get_scale(s), 32);
  LT_OK(loom_scaler_update(s, false));
  LT_EQ(loom_scaler_get_scale(s), 48); /* clamped, not 64 */
  for (int i = 0; i < 10; i++) LT_OK(loom_scaler_update(s, false));
  LT_EQ(loom_scaler_get_scale(s), 48);
  loom_scaler_stats st;
  LT_OK(loom_scaler_stats(s, &st));
  LT_EQ(st.scale_increase_count, 2); /* updates at the cap do not count */
  LT_EQ(st.max_scale_reached, 48);
  LT_EQ(st.min_scale_reached, 16);
  LT_NEAR(st.success_rate, 1.0, 0);
  loom_scaler_free(s);
}

LT_TEST(scaler_continuous_overflow_stays_at_min) {
  loom_scaler *s = dyn(65536, 2, 0.5f, 2000, 1, 16777216);
  for (int i = 0; i < 100; i++) LT_OK(loom_scaler_update(s, true));
  LT_EQ(loom_scaler_get_scale(s), 1);
  loom_scaler_stats st;
  LT_OK(loom_scaler_stats(s, &st));
  LT_EQ(st.total_overflows, 100);
  LT_EQ(st.total_successful_iterations, 0);
  LT_EQ(st.scale_decrease_count, 16); /* 2^16 -> 2^0 */
  LT_NEAR(st.success_rate, 0.0, 0);
  loom_scaler_free(s);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

LT_TEST(scaler_matches_the_spec_update_rule_on_random_sequences) {
  static const struct {
    float initial, growth, backoff;
    int64_t interval;
    float min, max;
    int overflow_per_mille;
  } cfgs[] = {
      {65536, 2, 0.5f, 2000, 1, 16777216, 1},  {1024, 2, 0.5f, 5, 1, 65536, 150},
      {100, 1.5f, 0.25f, 3, 0.5f, 1e6f, 300}, {3, 1.1f, 0.9f, 1, 1, 10, 500},
      {65536, 4, 0.125f, 7, 2, 16777216, 80}, {1, 2, 0.5f, 10, 1, 1, 200}, /* min == max */
  };
  for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
    loom_scaler *s = dyn(cfgs[c].initial, cfgs[c].growth, cfgs[c].backoff, cfgs[c].interval,
                         cfgs[c].min, cfgs[c].max);
    spec_model m = {cfgs[c].initial, cfgs[c].growth, cfgs[c].backoff, cfgs[c].min,
                    cfgs[c].max,     cfgs[c].interval, 0, 0};
    int64_t inc = 0, dec = 0, ok = 0;
    float lo = m.scale, hi = m.scale;
    for (int i = 0; i < 20000; i++) {
      bool ov = (int)(next_rand() % 1000) < cfgs[c].overflow_per_mille;
      float before = m.scale;
      spec_update(&m, ov);
      inc += m.scale > before;
      dec += m.scale < before;
      ok += !ov;
      lo = fminf(lo, m.scale);
      hi = fmaxf(hi, m.scale);
      LT_OK(loom_scaler_update(s, ov));
      if (loom_scaler_get_scale(s) != m.scale || loom_scaler_growth_counter(s) != m.counter) {
        LT_EQ_HEX(c * 100000 + i, 0); /* which config and step diverged */
        break;
      }
      if (m.scale < cfgs[c].min || m.scale > cfgs[c].max) LT_TRUE(!"scale out of bounds");
    }
    loom_scaler_stats st;
    LT_OK(loom_scaler_stats(s, &st));
    LT_EQ(st.total_overflows, m.overflows);
    LT_EQ(st.total_successful_iterations, ok);
    LT_EQ(st.scale_increase_count, inc);
    LT_EQ(st.scale_decrease_count, dec);
    LT_EQ(st.min_scale_reached, lo);
    LT_EQ(st.max_scale_reached, hi);
    LT_NEAR(st.success_rate, (double)ok / 20000.0, 1e-12);
    loom_scaler_free(s);
  }
}

LT_TEST(scaler_disabled_keeps_scale_one) {
  loom_dynamic_scaler_cfg c = loom_dynamic_scaler_cfg_default();
  c.enabled = false;
  loom_scaler *s = NULL;
  LT_OK(loom_scaler_create_dynamic(&c, &s));
  LT_TRUE(!loom_scaler_enabled(s));
  LT_EQ(loom_scaler_get_scale(s), 1);
  float loss = 2.5f;
  LT_OK(loom_scaler_scale_value(s, &loss));
  LT_EQ(loss * 2, 5);
  for (int i = 0; i < 3000; i++) LT_OK(loom_scaler_update(s, i % 3 == 0));
  LT_EQ(loom_scaler_get_scale(s), 1);
  loom_scaler_stats st;
  LT_OK(loom_scaler_stats(s, &st));
  LT_EQ(st.total_overflows, 0);
  LT_EQ(st.total_successful_iterations, 0);
  /* unscale still finds inf, and leaves finite values as they are */
  float g[3] = {1.5f, INFINITY, -2};
  loom_tensor *t = NULL;
  LT_OK(loom_tensor_wrap(LOOM_F32, 1, (int64_t[]){3}, g, &t));
  bool found = false;
  LT_OK(loom_scaler_scale_value(s, &loss));
  LT_OK(loom_scaler_unscale(s, &t, 1, &found));
  LT_TRUE(found);
  LT_EQ(g[0] * 2, 3);
  LT_EQ(g[2], -2);
  loom_tensor_free(t);
  loom_scaler_free(s);
}

LT_TEST(scaler_stats_text) {
  loom_scaler *s = dyn(8, 2, 0.5f, 2, 1, 64);
  loom_scaler_stats st;
  char buf[256];
  LT_OK(loom_scaler_stats(s, &st));
  LT_OK(loom_scaler_stats_format(&st, buf, sizeof buf));
  LT_STREQ(buf, "scale 8, overflows 0, successful 0, increases 0, decreases 0, min 8, max 8, "
                "success rate n/a");
  LT_OK(loom_scaler_update(s, false));
  LT_OK(loom_scaler_update(s, false));
  LT_OK(loom_scaler_update(s, true));
  LT_OK(loom_scaler_update(s, true));
  LT_OK(loom_scaler_stats_get(s, &st));
  LT_OK(loom_scaler_stats_format(&st, buf, sizeof buf));
  LT_STREQ(buf, "scale 4, overflows 2, successful 2, increases 1, decreases 2, min 4, max 16, "
                "success rate 50.00%");
  char small[8];
  LT_OK(loom_scaler_stats_format(&st, small, sizeof small)); /* truncated, terminated */
  LT_STREQ(small, "scale 4");
  LT_ERR(loom_scaler_stats_format(&st, buf, 0), LOOM_EINVAL, "cap is 0");
  LT_ERR(loom_scaler_stats_format(NULL, buf, 8), LOOM_EINVAL, "stats is NULL");
  LT_ERR(loom_scaler_stats(s, NULL), LOOM_EINVAL, "out is NULL");
  LT_ERR(loom_scaler_stats(NULL, &st), LOOM_EINVAL, "scaler is NULL");
  loom_scaler_free(s);
}

LT_TEST(scaler_reset_returns_to_initial_state) {
  loom_scaler *s = dyn(8, 2, 0.5f, 2, 1, 64);
  for (int i = 0; i < 7; i++) LT_OK(loom_scaler_update(s, i == 5));
  float v = 1;
  LT_OK(loom_scaler_scale_value(s, &v));
  LT_TRUE(loom_scaler_get_scale(s) != 8);
  LT_OK(loom_scaler_reset(s));
  LT_EQ(loom_scaler_get_scale(s), 8);
  LT_EQ(loom_scaler_growth_counter(s), 0);
  loom_scaler_stats st;
  LT_OK(loom_scaler_stats(s, &st));
  LT_EQ(st.total_overflows + st.total_successful_iterations, 0);
  LT_EQ(st.scale_increase_count + st.scale_decrease_count, 0);
  LT_EQ(st.min_scale_reached, 8);
  LT_EQ(st.max_scale_reached, 8);
  /* the step was reset too: unscale now needs a scaled loss first */
  LT_ERR(loom_scaler_unscale(s, NULL, 0, NULL), LOOM_EMISUSE, "no loss was scaled");
  /* and it behaves like a new scaler afterwards */
  LT_OK(loom_scaler_update(s, false));
  LT_OK(loom_scaler_update(s, false));
  LT_EQ(loom_scaler_get_scale(s), 16);
  LT_ERR(loom_scaler_reset(NULL), LOOM_EINVAL, "scaler is NULL");
  loom_scaler_free(s);
}

LT_TEST(scaler_presets) {
  loom_dynamic_scaler_cfg d, c, a, byname;
  d = loom_dynamic_scaler_cfg_default();
  c = loom_dynamic_scaler_cfg_conservative();
  a = loom_dynamic_scaler_cfg_aggressive();
  LT_OK(loom_dynamic_scaler_cfg_validate(&d));
  LT_OK(loom_dynamic_scaler_cfg_validate(&c));
  LT_OK(loom_dynamic_scaler_cfg_validate(&a));
  /* conservative grows more slowly and less far; aggressive grows faster */
  LT_TRUE(c.growth_interval > d.growth_interval);
  LT_TRUE(c.initial_scale < d.initial_scale);
  LT_TRUE(c.max_scale < d.max_scale);
  LT_TRUE(a.growth_interval < d.growth_interval);
  LT_EQ(c.growth_interval, 5000);
  LT_EQ(c.initial_scale, 32768);
  LT_EQ(c.max_scale, 1048576);
  LT_EQ(a.growth_interval, 500);
  LT_EQ(a.initial_scale, 65536);
  LT_OK(loom_dynamic_scaler_cfg_preset("conservative", &byname));
  LT_EQ(byname.growth_interval, c.growth_interval);
  LT_OK(loom_dynamic_scaler_cfg_preset("aggressive", &byname));
  LT_EQ(byname.growth_interval, a.growth_interval);
  LT_OK(loom_dynamic_scaler_cfg_preset("default", &byname));
  LT_EQ(byname.growth_interval, 2000);
  LT_ERR(loom_dynamic_scaler_cfg_preset("fast", &byname), LOOM_ENOTFOUND, "no preset \"fast\"");
  LT_ERR(loom_dynamic_scaler_cfg_preset(NULL, &byname), LOOM_EINVAL, "name is NULL");
  /* the aggressive scaler recovers 4x as fast after an overflow */
  loom_scaler *s = NULL;
  LT_OK(loom_scaler_create_dynamic(&a, &s));
  LT_OK(loom_scaler_update(s, true));
  for (int i = 0; i < 500; i++) LT_OK(loom_scaler_update(s, false));
  LT_EQ(loom_scaler_get_scale(s), 65536);
  loom_scaler_free(s);
}

/* cfg_default with one field changed must fail validation naming that field. */
#define BAD(field, value, substr)                                                             \
  do {                                                                                        \
    loom_dynamic_scaler_cfg c;                                                                \
    c = loom_dynamic_scaler_cfg_default();                                                    \
    c.field = value;                                                                          \
    LT_ERR(loom_dynamic_scaler_cfg_validate(&c), LOOM_EINVAL, substr);                        \
    loom_scaler *s = (loom_scaler *)&c;                                                       \
    LT_ERR(loom_scaler_create_dynamic(&c, &s), LOOM_EINVAL, substr);                          \
    LT_TRUE(s == NULL);                                                                       \
  } while (0)

LT_TEST(scaler_validation_names_each_bad_field) {
  BAD(growth_factor, 1.0f, "growth_factor must be > 1");
  BAD(growth_factor, 0.5f, "growth_factor must be > 1");
  BAD(growth_factor, NAN, "growth_factor is NaN");
  BAD(growth_factor, INFINITY, "growth_factor is infinite");
  BAD(growth_factor, -2.0f, "growth_factor is negative");
  BAD(backoff_factor, 1.0f, "backoff_factor must be in (0, 1)");
  BAD(backoff_factor, 0.0f, "backoff_factor must be in (0, 1)");
  BAD(backoff_factor, 1.5f, "backoff_factor must be in (0, 1)");
  BAD(backoff_factor, -0.5f, "backoff_factor is negative");
  BAD(backoff_factor, NAN, "backoff_factor is NaN");
  BAD(growth_interval, 0, "growth_interval must be >= 1");
  BAD(growth_interval, -5, "growth_interval must be >= 1 (got -5)");
  BAD(min_scale, 0.0f, "min_scale must be > 0");
  BAD(min_scale, -1.0f, "min_scale is negative");
  BAD(min_scale, NAN, "min_scale is NaN");
  BAD(min_scale, 1e8f, "min_scale 1e+08 is greater than max_scale");
  BAD(max_scale, 0.5f, "min_scale 1 is greater than max_scale 0.5");
  BAD(max_scale, INFINITY, "max_scale is infinite");
  BAD(max_scale, NAN, "max_scale is NaN");
  BAD(initial_scale, 0.5f, "initial_scale 0.5 is outside [min_scale, max_scale]");
  BAD(initial_scale, 3e7f, "initial_scale 3e+07 is outside [min_scale, max_scale]");
  BAD(initial_scale, NAN, "initial_scale is NaN");
  BAD(initial_scale, -1.0f, "initial_scale is negative");
  BAD(initial_scale, INFINITY, "initial_scale is infinite");
  LT_ERR(loom_dynamic_scaler_cfg_validate(NULL), LOOM_EINVAL, "cfg is NULL");
  LT_ERR(loom_scaler_create_dynamic(NULL, NULL), LOOM_EINVAL, "out is NULL");
}

LT_TEST(scaler_static) {
  loom_scaler *s = NULL;
  LT_OK(loom_scaler_create_static(1024, &s));
  LT_EQ(loom_scaler_get_kind(s), LOOM_SCALER_STATIC);
  LT_STREQ(loom_scaler_kind_name(LOOM_SCALER_STATIC), "static");
  for (int i = 0; i < 5000; i++) LT_OK(loom_scaler_update(s, i % 7 == 0));
  LT_EQ(loom_scaler_get_scale(s), 1024);
  loom_scaler_stats st;
  LT_OK(loom_scaler_stats(s, &st));
  LT_EQ(st.total_overflows, 715);
  LT_EQ(st.total_successful_iterations, 4285);
  LT_EQ(st.scale_increase_count + st.scale_decrease_count, 0);
  LT_EQ(st.min_scale_reached, 1024);
  /* overflow detection is the same as the dynamic scaler's */
  float g[4] = {1, 2, NAN, 4};
  loom_tensor *t = NULL;
  LT_OK(loom_tensor_wrap(LOOM_F32, 1, (int64_t[]){4}, g, &t));
  bool ov = false;
  LT_OK(loom__scaler_check_overflow(s, &t, 1, &ov));
  LT_TRUE(ov);
  g[2] = 3;
  LT_OK(loom__scaler_check_overflow(s, &t, 1, &ov));
  LT_TRUE(!ov);
  float loss = 0.5f;
  LT_OK(loom_scaler_scale_value(s, &loss));
  LT_EQ(loss, 512);
  LT_OK(loom_scaler_unscale(s, &t, 1, &ov));
  LT_TRUE(!ov);
  LT_NEAR(g[3], 4.0 / 1024, 0);
  loom_tensor_free(t);
  loom_scaler_free(s);
  LT_ERR(loom_scaler_create_static(0, &s), LOOM_EINVAL, "scale must be finite and > 0 (got 0)");
  LT_TRUE(s == NULL);
  LT_ERR(loom_scaler_create_static(-4, &s), LOOM_EINVAL, "got -4");
  LT_ERR(loom_scaler_create_static(NAN, &s), LOOM_EINVAL, "finite and > 0");
  LT_ERR(loom_scaler_create_static(INFINITY, &s), LOOM_EINVAL, "finite and > 0");
  LT_ERR(loom_scaler_create_static(2, NULL), LOOM_EINVAL, "out is NULL");
}

LT_TEST(scaler_create_cleans_up_when_memory_runs_out) {
  loom_scaler *s = (loom_scaler *)&s;
  loom_alloc_fail_nth(1);
  LT_ERR(loom_scaler_create_dynamic(NULL, &s), LOOM_ENOMEM, "out of memory");
  LT_TRUE(s == NULL);
  loom_alloc_fail_nth(0);
}

LT_TEST(scaler_null_handles) {
  LT_EQ(loom_scaler_get_scale(NULL), 0);
  LT_TRUE(!loom_scaler_enabled(NULL));
  LT_EQ(loom_scaler_get_kind(NULL), 0);
  LT_ERR(loom_scaler_update(NULL, false), LOOM_EINVAL, "loom_scaler_update: scaler is NULL");
  float v = 1;
  LT_ERR(loom_scaler_scale_value(NULL, &v), LOOM_EINVAL, "scaler is NULL");
  loom_dynamic_scaler_cfg c;
  LT_ERR(loom_scaler_get_config(NULL, &c), LOOM_EINVAL, "scaler is NULL");
}
