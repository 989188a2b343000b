/* test_scaler_restore_bounds.c: a restored scaler state is untrusted (a checkpoint): counters
 * that would overflow on the next update (the INT64_MAX success counter, a signed
 * overflow under UBSan), counters that contradict each other, and min / max scale reached
 * that are NaN, infinite or outside [min_scale, max_scale] are refused naming the field, and
 * the scaler keeps its old state. */
#include "lt.h"

#include <math.h>

/* A dynamic scaler after a few updates, and its state. */
static loom_scaler *used_scaler(loom_scaler_state *state) {
  loom_dynamic_scaler_cfg c = {8, 2, 0.5f, 3, 1, 64, true};
  loom_scaler *s = NULL;
  LT_OK(loom_scaler_create_dynamic(&c, &s));
  const bool overflow[7] = {false, false, false, true, false, true, false};
  for (int i = 0; i < 7; i++) LT_OK(loom_scaler_update(s, overflow[i]));
  LT_OK(loom_scaler_save(s, state));
  return s;
}

LT_TEST(scaler_restore_refuses_counters_that_could_overflow_or_contradict) {
  loom_scaler_state good, st;
  loom_scaler *s = used_scaler(&good);
  LT_EQ(good.total_successful_iterations, 5);
  LT_EQ(good.total_overflows, 2);
  const struct { int field; int64_t v; const char *want; } cases[] = {
      {0, INT64_MAX, "total_successful_iterations 9223372036854775807 is above 2^62"},
      {1, INT64_MAX, "total_overflows 9223372036854775807 is above 2^62"},
      {0, ((int64_t)1 << 62) - 1, "total_overflows + total_successful_iterations exceeds 2^62"},
      {2, 6, "scale_increase_count 6 is above total_successful_iterations = 5"},
      {3, 3, "scale_decrease_count 3 is above total_overflows = 2"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    st = good;
    int64_t *f[4] = {&st.total_successful_iterations, &st.total_overflows,
                     &st.scale_increase_count, &st.scale_decrease_count};
    *f[cases[i].field] = cases[i].v;
    LT_ERR(loom_scaler_restore(s, &st), LOOM_EINVAL, cases[i].want);
  }
  /* through the flat form, as a checkpoint carries it */
  int64_t words[LOOM_SCALER_STATE_WORDS];
  LT_OK(loom_scaler_state_pack(&good, words));
  words[12] = INT64_MAX; /* total_successful_iterations */
  LT_OK(loom_scaler_state_unpack(words, &st));
  LT_ERR(loom_scaler_restore(s, &st), LOOM_EINVAL, "total_successful_iterations");
  /* refused states leave the scaler as it was; the good one restores and updates */
  loom_scaler_stats stats;
  LT_OK(loom_scaler_stats_get(s, &stats));
  LT_EQ(stats.total_successful_iterations, 5);
  LT_OK(loom_scaler_restore(s, &good));
  LT_OK(loom_scaler_update(s, false));
  loom_scaler_free(s);
}

LT_TEST(scaler_restore_refuses_scales_out_of_range) {
  loom_scaler_state good, st;
  loom_scaler *s = used_scaler(&good);
  const float bad[] = {NAN, INFINITY, -1.0f, 0.5f, 128.0f};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    st = good;
    st.min_scale_reached = bad[i];
    LT_ERR(loom_scaler_restore(s, &st), LOOM_EINVAL, "min/max scale reached");
    st = good;
    st.max_scale_reached = bad[i];
    LT_ERR(loom_scaler_restore(s, &st), LOOM_EINVAL, "min/max scale reached");
    st = good;
    st.scale = bad[i];
    LT_ERR(loom_scaler_restore(s, &st), LOOM_EINVAL, "scale");
  }
  st = good;
  st.growth_counter = good.total_successful_iterations + 1;
  st.cfg.growth_interval = 1000;
  LT_ERR(loom_scaler_restore(s, &st), LOOM_EINVAL, "growth_counter 6 is above");
  loom_scaler_free(s);
}
