/* scaler_state.c: save and restore a scaler's whole state (config, scale, counters,
 * statistics), as a struct and as a flat array of i64 words a checkpoint can carry. Restore
 * checks every field against its range and the others (a counter beyond 2^62 or one that
 * could not have happened is refused by name). */
#include "amp/amp_int.h"

#include <string.h>

int loom_scaler_save(const loom_scaler *s, loom_scaler_state *out) {
  int rc = loom__scaler_check(s, "loom_scaler_save");
  if (rc) return rc;
  if (!out) return loom__fail(LOOM_EINVAL, "loom_scaler_save: out is NULL");
  *out = (loom_scaler_state){.kind = s->ops->kind,
                             .cfg = s->cfg,
                             .scale = s->scale,
                             .growth_counter = s->growth_counter,
                             .total_overflows = s->overflows,
                             .total_successful_iterations = s->successes,
                             .scale_increase_count = s->increases,
                             .scale_decrease_count = s->decreases,
                             .min_scale_reached = s->min_reached,
                             .max_scale_reached = s->max_reached};
  return LOOM_OK;
}

/* Counters above this are refused: no real run gets near, and every later update and sum of
 * two of them stays far from overflow. */
#define MAX_COUNT ((int64_t)1 << 62)

/* Every field of a state to restore in its range: a checkpoint is untrusted input. */
static int check_state(const loom_scaler *s, const loom_scaler_state *st) {
  static const char *who = "loom_scaler_restore";
  if (st->kind != s->ops->kind)
    return loom__fail(LOOM_EINVAL, "%s: state is of a %s scaler, this one is %s", who,
                      loom_scaler_kind_name(st->kind), loom_scaler_kind_name(s->ops->kind));
  int rc = loom_dynamic_scaler_cfg_validate(&st->cfg);
  if (rc) return rc;
  if (st->cfg.enabled ? !(st->scale >= st->cfg.min_scale && st->scale <= st->cfg.max_scale)
                      : st->scale != 1.0f)
    return loom__fail(LOOM_EINVAL, "%s: scale %g is outside [min_scale, max_scale] = [%g, %g]"
                      "%s", who, (double)st->scale, (double)st->cfg.min_scale,
                      (double)st->cfg.max_scale, st->cfg.enabled ? "" : " (disabled: must be 1)");
  if (st->growth_counter < 0 || st->growth_counter >= st->cfg.growth_interval)
    return loom__fail(LOOM_EINVAL, "%s: growth_counter %lld is outside [0, growth_interval)",
                      who, (long long)st->growth_counter);
  if (st->total_overflows < 0 || st->total_successful_iterations < 0 ||
      st->scale_increase_count < 0 || st->scale_decrease_count < 0)
    return loom__fail(LOOM_EINVAL, "%s: a counter is negative", who);
  const struct { const char *name; int64_t v, max; const char *max_name; } counters[] = {
      {"total_overflows", st->total_overflows, MAX_COUNT, "2^62"},
      {"total_successful_iterations", st->total_successful_iterations, MAX_COUNT, "2^62"},
      {"scale_increase_count", st->scale_increase_count, st->total_successful_iterations,
       "total_successful_iterations"},
      {"scale_decrease_count", st->scale_decrease_count, st->total_overflows, "total_overflows"},
      {"growth_counter", st->growth_counter, st->total_successful_iterations,
       "total_successful_iterations"}};
  for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++)
    if (counters[i].v > counters[i].max)
      return loom__fail(LOOM_EINVAL, "%s: %s %lld is above %s = %lld", who,
                        counters[i].name, (long long)counters[i].v, counters[i].max_name,
                        (long long)counters[i].max);
  if (st->total_overflows > MAX_COUNT - st->total_successful_iterations)
    return loom__fail(LOOM_EINVAL, "%s: total_overflows + total_successful_iterations exceeds "
                      "2^62", who);
  float lo = st->cfg.enabled ? st->cfg.min_scale : 1.0f;
  float hi = st->cfg.enabled ? st->cfg.max_scale : 1.0f;
  if (!(lo <= st->min_scale_reached && st->min_scale_reached <= st->scale &&
        st->scale <= st->max_scale_reached && st->max_scale_reached <= hi))
    return loom__fail(LOOM_EINVAL, "%s: min/max scale reached [%g, %g] do not contain the "
                      "scale %g or leave [%g, %g]", who, (double)st->min_scale_reached,
                      (double)st->max_scale_reached, (double)st->scale, (double)lo, (double)hi);
  return LOOM_OK;
}

int loom_scaler_restore(loom_scaler *s, const loom_scaler_state *st) {
  int rc = loom__scaler_check(s, "loom_scaler_restore");
  if (rc) return rc;
  if (!st) return loom__fail(LOOM_EINVAL, "loom_scaler_restore: state is NULL");
  if ((rc = check_state(s, st))) return rc;
  s->cfg = st->cfg;
  s->scale = st->scale;
  s->growth_counter = st->growth_counter;
  s->overflows = st->total_overflows;
  s->successes = st->total_successful_iterations;
  s->increases = st->scale_increase_count;
  s->decreases = st->scale_decrease_count;
  s->min_reached = st->min_scale_reached;
  s->max_reached = st->max_scale_reached;
  s->stage = LOOM__STAGE_IDLE;
  return LOOM_OK;
}

/* ---- the flat form ------------------------------------------------------------------------- */

#define STATE_MAGIC 0x4c4f4f4d53430001ll /* "LOOMSC", version 1 */

static const char *word_names[LOOM_SCALER_STATE_WORDS] = {
    "magic", "kind", "initial_scale", "growth_factor", "backoff_factor", "growth_interval",
    "min_scale", "max_scale", "enabled", "scale", "growth_counter", "total_overflows",
    "total_successful_iterations", "scale_increase_count", "scale_decrease_count",
    "min_scale_reached", "max_scale_reached"};

const char *loom_scaler_state_word_name(size_t i) {
  return i < LOOM_SCALER_STATE_WORDS ? word_names[i] : NULL;
}

static int64_t f2w(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (int64_t)u;
}

/* A word holding an f32 bit pattern: 0 <= w < 2^32. */
static int w2f(int64_t w, size_t i, float *f) {
  if (w < 0 || w > (int64_t)UINT32_MAX)
    return loom__fail(LOOM_EFORMAT, "loom_scaler_state_unpack: word %zu (%s) is not an f32 bit "
                      "pattern (%lld)", i, word_names[i], (long long)w);
  uint32_t u = (uint32_t)w;
  memcpy(f, &u, 4);
  return LOOM_OK;
}

int loom_scaler_state_pack(const loom_scaler_state *st, int64_t out[LOOM_SCALER_STATE_WORDS]) {
  if (!st || !out)
    return loom__fail(LOOM_EINVAL, "loom_scaler_state_pack: %s is NULL", !st ? "state" : "out");
  const int64_t w[LOOM_SCALER_STATE_WORDS] = {
      STATE_MAGIC, st->kind, f2w(st->cfg.initial_scale), f2w(st->cfg.growth_factor),
      f2w(st->cfg.backoff_factor), st->cfg.growth_interval, f2w(st->cfg.min_scale),
      f2w(st->cfg.max_scale), st->cfg.enabled ? 1 : 0, f2w(st->scale), st->growth_counter,
      st->total_overflows, st->total_successful_iterations, st->scale_increase_count,
      st->scale_decrease_count, f2w(st->min_scale_reached), f2w(st->max_scale_reached)};
  memcpy(out, w, sizeof w);
  return LOOM_OK;
}

int loom_scaler_state_unpack(const int64_t in[LOOM_SCALER_STATE_WORDS], loom_scaler_state *out) {
  static const char *who = "loom_scaler_state_unpack";
  if (!in || !out) return loom__fail(LOOM_EINVAL, "%s: %s is NULL", who, !in ? "in" : "out");
  if (in[0] != STATE_MAGIC)
    return loom__fail(LOOM_EFORMAT, "%s: word 0 is not the scaler-state magic/version "
                      "(0x%llx)", who, (unsigned long long)in[0]);
  if (in[1] != LOOM_SCALER_STATIC && in[1] != LOOM_SCALER_DYNAMIC)
    return loom__fail(LOOM_EFORMAT, "%s: word 1 (kind) is %lld, not a scaler kind", who,
                      (long long)in[1]);
  if (in[8] != 0 && in[8] != 1)
    return loom__fail(LOOM_EFORMAT, "%s: word 8 (enabled) is %lld, not 0 or 1", who,
                      (long long)in[8]);
  loom_scaler_state st = {.kind = (loom_scaler_kind)in[1],
                          .cfg.growth_interval = in[5],
                          .cfg.enabled = in[8] == 1,
                          .growth_counter = in[10],
                          .total_overflows = in[11],
                          .total_successful_iterations = in[12],
                          .scale_increase_count = in[13],
                          .scale_decrease_count = in[14]};
  int rc;
  if ((rc = w2f(in[2], 2, &st.cfg.initial_scale)) || (rc = w2f(in[3], 3, &st.cfg.growth_factor)) ||
      (rc = w2f(in[4], 4, &st.cfg.backoff_factor)) || (rc = w2f(in[6], 6, &st.cfg.min_scale)) ||
      (rc = w2f(in[7], 7, &st.cfg.max_scale)) || (rc = w2f(in[9], 9, &st.scale)) ||
      (rc = w2f(in[15], 15, &st.min_scale_reached)) ||
      (rc = w2f(in[16], 16, &st.max_scale_reached)))
    return rc;
  *out = st;
  return LOOM_OK;
}
