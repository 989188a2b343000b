/* lt_oom.h: the out-of-memory sweep a test runs over a forward + backward: allocation n fails,
 * for n = 1, 2, ... until a run succeeds. Each run must end LOOM_OK or LOOM_ENOMEM (never
 * another status, never a crash) and leave the compute pool as it found it once the run's own
 * tensors are freed. Include after lt.h in a test that links loom. */
#ifndef LT_OOM_H
#define LT_OOM_H

#include "lt.h"

#include <loom/loom.h>

/* One run of the step under test: its output in *y and loss in *l (freed by the sweep). */
typedef int (*lt_oom_run_fn)(void *ctx, loom_tensor **y, loom_tensor **l);
/* What undoes a run besides freeing y and l (the inputs' gradients, say); may be NULL. */
typedef void (*lt_oom_reset_fn)(void *ctx);

/* The sweep, at most `max` runs; returns how many failed with LOOM_ENOMEM and sets *ok when a
 * run succeeded. Failures are reported at the caller's line through lt_fail_at. */
static inline int lt_oom_sweep(uint64_t max, lt_oom_run_fn run, lt_oom_reset_fn reset,
                               void *ctx, int *ok) {
  int nomem = 0;
  *ok = 0;
  for (uint64_t n = 1; n < max && !*ok; n++) {
    loom_pool_stats before, after;
    LT_OK(loom_mem_stats(LOOM_POOL_COMPUTE, &before));
    loom_tensor *y = NULL, *l = NULL;
    loom_alloc_fail_nth(n);
    int rc = run(ctx, &y, &l);
    if (!rc) rc = loom_backward(l, NULL, false);
    loom_alloc_fail_nth(0);
    if (rc && rc != LOOM_ENOMEM)
      lt_fail_at(__FILE__, __LINE__, "allocation %llu failing: %s (%s)", (unsigned long long)n,
                 loom_status_name(rc), loom_last_error());
    *ok = rc == LOOM_OK;
    nomem += rc == LOOM_ENOMEM;
    loom_tensor_free(l);
    loom_tensor_free(y);
    if (reset) reset(ctx);
    LT_OK(loom_mem_stats(LOOM_POOL_COMPUTE, &after));
    if (after.current_bytes != before.current_bytes)
      lt_fail_at(__FILE__, __LINE__, "allocation %llu failing: %zu bytes left behind",
                 (unsigned long long)n, after.current_bytes - before.current_bytes);
  }
  return nomem;
}

#endif
