/* schedule.c: learning-rate schedules as pure functions of the step index (constant, linear
 * warmup, cosine decay after warmup), with their default and validation. */
#include "optim/optim_int.h"

#include <math.h>

loom_lr_schedule loom_lr_schedule_default(void) {
  return (loom_lr_schedule){.kind = LOOM_LR_CONSTANT, .lr = 1e-3};
}

int loom_lr_schedule_validate(const loom_lr_schedule *s) {
  if (!s) return loom__fail(LOOM_EINVAL, "loom_lr_schedule: schedule is NULL");
  if ((unsigned)s->kind > LOOM_LR_COSINE)
    return loom__fail(LOOM_EINVAL, "loom_lr_schedule: kind %d is not a schedule", (int)s->kind);
  if (!(s->lr >= 0) || !isfinite(s->lr))
    return loom__fail(LOOM_EINVAL, "loom_lr_schedule: lr = %g must be finite and >= 0", s->lr);
  if (s->warmup_steps < 0)
    return loom__fail(LOOM_EINVAL, "loom_lr_schedule: warmup_steps = %lld is negative",
                      (long long)s->warmup_steps);
  if (s->kind == LOOM_LR_COSINE) {
    if (!(s->min_lr >= 0 && s->min_lr <= s->lr))
      return loom__fail(LOOM_EINVAL, "loom_lr_schedule: min_lr = %g is outside [0, lr = %g]",
                        s->min_lr, s->lr);
    if (s->total_steps <= s->warmup_steps)
      return loom__fail(LOOM_EINVAL,
                        "loom_lr_schedule: total_steps = %lld must exceed warmup_steps = %lld",
                        (long long)s->total_steps, (long long)s->warmup_steps);
  }
  return LOOM_OK;
}

double loom_lr_at(const loom_lr_schedule *s, int64_t t) {
  if (t < 0) t = 0;
  if (s->kind == LOOM_LR_CONSTANT) return s->lr;
  if (t < s->warmup_steps) return s->lr * (double)(t + 1) / (double)s->warmup_steps;
  if (s->kind == LOOM_LR_WARMUP) return s->lr;
  if (t >= s->total_steps) return s->min_lr;
  double p = (double)(t - s->warmup_steps) / (double)(s->total_steps - s->warmup_steps);
  return s->min_lr + (s->lr - s->min_lr) * 0.5 * (1.0 + cos(M_PI * p));
}
