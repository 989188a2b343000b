/* test_wait_policy.c: the wait policy of wait.c (spin, then poll with sched_yield while a
 * caller is blocked on the group, else sleep a bounded share of the time waited) at the
 * boundaries, and pg->blocked, which says when a caller is blocked: set while a blocking
 * collective runs inline on its caller, not while an async one runs on the progress thread
 * beside the caller's work, set again once the caller waits for it, back to 0 after. */
#include "dist_test.h"
#include "dist/dist_int.h"

#include <sched.h>

LT_TEST(dist_wait_policy_boundaries) {
  double s = -1;
  /* the first 0.5 ms spin, blocked or not */
  LT_EQ((int)loom__wait_policy(0, false, &s), (int)LOOM__PAUSE_SPIN);
  LT_EQ((int)loom__wait_policy(0, true, &s), (int)LOOM__PAUSE_SPIN);
  LT_EQ((int)loom__wait_policy(499e-6, true, &s), (int)LOOM__PAUSE_SPIN);
  LT_TRUE(s == 0);
  /* then a blocked caller polls (yields) until 0.1 s, as MPI's blocking calls do ... */
  LT_EQ((int)loom__wait_policy(501e-6, true, &s), (int)LOOM__PAUSE_YIELD);
  LT_EQ((int)loom__wait_policy(0.099, true, &s), (int)LOOM__PAUSE_YIELD);
  LT_TRUE(s == 0);
  /* ... and nobody blocked (the progress thread beside compute) sleeps a sixteenth of it */
  LT_EQ((int)loom__wait_policy(501e-6, false, &s), (int)LOOM__PAUSE_SLEEP);
  LT_NEAR(s, 501e-6 / 16, 1e-12);
  LT_EQ((int)loom__wait_policy(8e-3, false, &s), (int)LOOM__PAUSE_SLEEP);
  LT_NEAR(s, 8e-3 / 16, 1e-12);
  /* a stalled peer: even a blocked caller sleeps past 0.1 s, at most 1 ms a pause */
  LT_EQ((int)loom__wait_policy(0.101, true, &s), (int)LOOM__PAUSE_SLEEP);
  LT_NEAR(s, 1e-3, 1e-12);
  LT_EQ((int)loom__wait_policy(100.0, false, &s), (int)LOOM__PAUSE_SLEEP);
  LT_NEAR(s, 1e-3, 1e-12);
}

typedef struct seen_blocked {
  loom_pg *pg;
  int at_start;        /* pg->blocked when prepare began */
  int later;           /* the largest pg->blocked prepare saw while waiting for the caller */
  _Atomic int started; /* prepare has read at_start */
  bool wait_for_caller;
} seen_blocked;

static int record_blocked(void *ctx) {
  seen_blocked *s = ctx;
  s->at_start = atomic_load(&s->pg->blocked);
  atomic_store(&s->started, 1);
  if (!s->wait_for_caller) return LOOM_OK;
  /* the caller calls loom_work_wait once it saw `started`: pg->blocked must then become 1 */
  double t0 = dt_now();
  while ((s->later = atomic_load(&s->pg->blocked)) == 0 && dt_now() - t0 < 20) sched_yield();
  return LOOM_OK;
}

static int blocked_rank(loom_pg *pg, void *arg) {
  (void)arg;
  float x = 1, y = 0;
  int r = loom_pg_rank(pg);
  /* blocking, nothing queued: runs inline on this thread, which is blocked in it */
  seen_blocked inl = {.pg = pg, .at_start = -1};
  int rc = loom__pg_allreduce_prepared(pg, &x, &y, 1, LOOM_F32, LOOM_SUM, record_blocked, &inl,
                                       NULL);
  DT_CHECK(rc == LOOM_OK, "rank %d: blocking all-reduce", r);
  DT_CHECK(inl.at_start == 1, "rank %d: pg->blocked %d inside a blocking all-reduce", r,
           inl.at_start);
  DT_CHECK(y == 2, "rank %d: sum %g", r, (double)y);
  DT_CHECK(atomic_load(&pg->blocked) == 0, "rank %d: pg->blocked %d after it", r,
           atomic_load(&pg->blocked));
  /* async: on the progress thread, nobody blocked until this thread waits for it */
  seen_blocked as = {.pg = pg, .at_start = -1, .wait_for_caller = true};
  loom_work *w = NULL;
  rc = loom__pg_allreduce_prepared(pg, &x, &y, 1, LOOM_F32, LOOM_SUM, record_blocked, &as, &w);
  DT_CHECK(rc == LOOM_OK, "rank %d: async all-reduce", r);
  if (rc) return rc;
  double t0 = dt_now();
  while (!atomic_load(&as.started) && dt_now() - t0 < 20) sched_yield();
  rc = loom_work_wait(&w);
  DT_CHECK(rc == LOOM_OK, "rank %d: wait", r);
  DT_CHECK(as.at_start == 0, "rank %d: pg->blocked %d before the caller waited", r, as.at_start);
  DT_CHECK(as.later == 1, "rank %d: pg->blocked %d while the caller waited", r, as.later);
  DT_CHECK(atomic_load(&pg->blocked) == 0, "rank %d: pg->blocked %d after the wait", r,
           atomic_load(&pg->blocked));
  return rc;
}

LT_TEST(dist_wait_blocked_counts_waiting_callers) {
  atomic_store(&dt_failures, 0);
  LT_OK(loom_threads_run(2, NULL, blocked_rank, NULL));
  LT_EQ(atomic_load(&dt_failures), 0);
}
