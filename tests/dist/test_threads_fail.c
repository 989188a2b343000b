/* test_threads_fail.c: failure, never a hang, on the threads backend: timeouts, abort, a rank
 * that returns an error or returns early, mismatched collectives, the sticky error, and bad
 * arguments; an all-gather's first step (dist/prepared.h), and its failure. Every path uses a
 * short timeout and must finish well within it plus slack. */
#include "dist_test.h"
#include "dist/prepared.h"

#include <pthread.h>

#define SHORT_TIMEOUT 0.3

static loom_pg_cfg short_cfg(void) {
  loom_pg_cfg cfg = loom_pg_cfg_default();
  cfg.timeout_s = SHORT_TIMEOUT;
  return cfg;
}

typedef struct result {
  int rc[4];
  char msg[4][512];
  double secs[4];
} result;

static void note(result *res, loom_pg *pg, int rc, double t0) {
  int r = loom_pg_rank(pg);
  res->rc[r] = rc;
  snprintf(res->msg[r], sizeof res->msg[r], "%s", rc ? loom_last_error() : "");
  res->secs[r] = dt_now() - t0;
}

/* Rank 1 never calls the collective: the others time out, naming rank 1. */
static int stalls(loom_pg *pg, void *arg) {
  result *res = arg;
  float x = 1;
  if (loom_pg_rank(pg) == 1) {
    /* stay alive (so it is not "returned early") but do not join, until the peers gave up */
    while (loom_pg_async_error(pg) == LOOM_OK) {
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
    note(res, pg, loom_pg_async_error(pg), dt_now());
    return LOOM_OK;
  }
  double t0 = dt_now();
  note(res, pg, loom_pg_allreduce(pg, &x, &x, 1, LOOM_F32, LOOM_SUM, NULL), t0);
  /* sticky: a later collective fails at once with the same error */
  int rc = loom_pg_barrier(pg, NULL);
  DT_CHECK(rc == res->rc[loom_pg_rank(pg)], "sticky %d", rc);
  DT_CHECK(strstr(loom_last_error(), "failed earlier") != NULL, "sticky message");
  return LOOM_OK;
}

LT_TEST(threads_timeout_names_the_missing_rank) {
  result res = {0};
  loom_pg_cfg cfg = short_cfg();
  atomic_store(&dt_failures, 0);
  int rc = loom_threads_run(3, &cfg, stalls, &res);
  LT_EQ(atomic_load(&dt_failures), 0);
  (void)rc; /* ranks returned OK themselves */
  /* the first to time out names rank 1; the other either timed out too or learned of it */
  int timedout = 0;
  for (int r = 0; r < 3; r += 2) {
    LT_TRUE(res.rc[r] == LOOM_ETIMEDOUT || res.rc[r] == LOOM_EREMOTE);
    timedout += res.rc[r] == LOOM_ETIMEDOUT;
    LT_TRUE(strstr(res.msg[r], "waiting for rank 1") != NULL);
    LT_TRUE(res.secs[r] >= SHORT_TIMEOUT * 0.9 && res.secs[r] < SHORT_TIMEOUT + 2.0);
  }
  LT_TRUE(timedout >= 1);
  LT_TRUE(res.rc[1] != LOOM_OK); /* rank 1 sees the group broken too */
}

/* Rank 2 aborts while the others wait in an async all-reduce. */
static int aborts(loom_pg *pg, void *arg) {
  result *res = arg;
  float x[1000] = {0};
  double t0 = dt_now();
  if (loom_pg_rank(pg) == 2) {
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
    DT_CHECK(loom_pg_abort(pg) == LOOM_OK, "abort");
    note(res, pg, loom_pg_allreduce(pg, x, x, 1000, LOOM_F32, LOOM_SUM, NULL), t0);
    return LOOM_OK;
  }
  loom_work *w = NULL;
  DT_CHECK(loom_pg_allreduce(pg, x, x, 1000, LOOM_F32, LOOM_SUM, &w) == LOOM_OK, "start");
  note(res, pg, loom_work_wait(&w), t0);
  DT_CHECK(w == NULL, "wait consumed the failed handle");
  return LOOM_OK;
}

LT_TEST(threads_abort_fails_peers_with_eremote) {
  result res = {0};
  loom_pg_cfg cfg = loom_pg_cfg_default(); /* long timeout: abort must not need it */
  atomic_store(&dt_failures, 0);
  LT_OK(loom_threads_run(3, &cfg, aborts, &res));
  LT_EQ(atomic_load(&dt_failures), 0);
  LT_EQ(res.rc[2], LOOM_EABORTED);
  for (int r = 0; r < 2; r++) {
    LT_EQ(res.rc[r], LOOM_EREMOTE);
    LT_TRUE(strstr(res.msg[r], "rank 2 aborted") != NULL);
    LT_TRUE(res.secs[r] < 2.0);
  }
}

/* Abort from another thread while this rank is blocked in a collective. */
static void *abort_later(void *pg) {
  struct timespec ts = {0, 30000000};
  nanosleep(&ts, NULL);
  loom_pg_abort(pg);
  return NULL;
}

static int aborted_while_blocked(loom_pg *pg, void *arg) {
  result *res = arg;
  float x = 0;
  double t0 = dt_now();
  if (loom_pg_rank(pg) == 0) {
    pthread_t t;
    pthread_create(&t, NULL, abort_later, pg);
    note(res, pg, loom_pg_allreduce(pg, &x, &x, 1, LOOM_F32, LOOM_SUM, NULL), t0);
    pthread_join(t, NULL);
    return LOOM_OK;
  }
  /* rank 1 stays out of the collective until the abort reached it */
  while (loom_pg_async_error(pg) == LOOM_OK) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  note(res, pg, loom_pg_allreduce(pg, &x, &x, 1, LOOM_F32, LOOM_SUM, NULL), t0);
  return LOOM_OK;
}

LT_TEST(threads_abort_wakes_a_blocked_caller) {
  result res = {0};
  atomic_store(&dt_failures, 0);
  LT_OK(loom_threads_run(2, NULL, aborted_while_blocked, &res));
  LT_EQ(res.rc[0], LOOM_EABORTED);
  LT_TRUE(res.secs[0] < 2.0);
  LT_EQ(res.rc[1], LOOM_EREMOTE);
  LT_TRUE(strstr(res.msg[1], "rank 0 aborted") != NULL);
}

/* A rank whose function returns an error; a rank that returns without joining. */
static int returns_error(loom_pg *pg, void *arg) {
  result *res = arg;
  int mode = res->rc[3];
  float x = 0;
  double t0 = dt_now();
  if (loom_pg_rank(pg) == 1) {
    if (mode == 0) return loom__fail(LOOM_EIO, "could not read the data");
    return LOOM_OK; /* returns early */
  }
  note(res, pg, loom_pg_allreduce(pg, &x, &x, 1, LOOM_F32, LOOM_SUM, NULL), t0);
  return LOOM_OK;
}

LT_TEST(threads_failed_or_departed_rank_fails_peers) {
  result res = {0};
  LT_ERR(loom_threads_run(3, NULL, returns_error, &res), LOOM_EIO,
         "rank 1: could not read the data");
  for (int r = 0; r < 3; r += 2) {
    LT_EQ(res.rc[r], LOOM_EREMOTE);
    LT_TRUE(strstr(res.msg[r], "rank 1 returned LOOM_EIO: could not read the data") != NULL);
    LT_TRUE(res.secs[r] < 2.0);
  }
  memset(&res, 0, sizeof res);
  res.rc[3] = 1;
  LT_OK(loom_threads_run(2, NULL, returns_error, &res));
  LT_EQ(res.rc[0], LOOM_EREMOTE);
  LT_TRUE(strstr(res.msg[0], "rank 1 returned from its function without joining") != NULL);
}

/* Ranks that disagree get an error naming both calls, and no data moves. */
static int mismatched(loom_pg *pg, void *arg) {
  result *res = arg;
  int kind = res->rc[3], r = loom_pg_rank(pg);
  float x[64], y[64];
  for (int i = 0; i < 64; i++) x[i] = y[i] = 7;
  int rc;
  double t0 = dt_now();
  if (kind == 0) /* count */
    rc = loom_pg_allreduce(pg, x, y, r == 1 ? 63 : 64, LOOM_F32, LOOM_SUM, NULL);
  else if (kind == 1) /* dtype */
    rc = loom_pg_allreduce(pg, x, y, 32, r == 1 ? LOOM_I32 : LOOM_F32, LOOM_SUM, NULL);
  else if (kind == 2) /* kind */
    rc = r == 1 ? loom_pg_broadcast(pg, x, y, 64, LOOM_F32, 0, NULL)
                : loom_pg_allreduce(pg, x, y, 64, LOOM_F32, LOOM_SUM, NULL);
  else /* op */
    rc = loom_pg_allreduce(pg, x, y, 64, LOOM_F32, r == 1 ? LOOM_MAX : LOOM_SUM, NULL);
  note(res, pg, rc, t0);
  DT_CHECK(y[0] == 7 && y[63] == 7, "no data moved");
  return LOOM_OK;
}

LT_TEST(threads_mismatch_is_an_error) {
  static const int want[] = {LOOM_ESHAPE, LOOM_EDTYPE, LOOM_EMISUSE, LOOM_EMISUSE};
  static const char *what[] = {"rank 1 called all-reduce(count 63", "rank 1 called all-reduce(count 32, i32",
                               "rank 1 called broadcast", "rank 1 called all-reduce(count 64, f32, max)"};
  for (int k = 0; k < 4; k++) {
    result res = {0};
    res.rc[3] = k;
    atomic_store(&dt_failures, 0);
    LT_OK(loom_threads_run(3, NULL, mismatched, &res));
    LT_EQ(atomic_load(&dt_failures), 0);
    for (int r = 0; r < 3; r++) {
      /* every rank fails: with the mismatch itself, or learning it from the first that saw it */
      LT_TRUE(res.rc[r] == want[k] || res.rc[r] == LOOM_EREMOTE);
      LT_TRUE(strstr(res.msg[r], "mismatch") != NULL);
      LT_TRUE(res.secs[r] < 2.0);
    }
    LT_TRUE(strstr(res.msg[0], what[k]) != NULL);
  }
}

/* Bad arguments: a clear error, nothing started. */
static int bad_args(loom_pg *pg, void *arg) {
  (void)arg;
  float x[8] = {0};
  loom_work *w = (loom_work *)1;
  int r = loom_pg_rank(pg);
#define BAD(call, code, sub)                                                                  \
  do {                                                                                        \
    int rc_ = (call);                                                                         \
    DT_CHECK(rc_ == (code) && strstr(loom_last_error(), sub), "%s gave %s: %s", #call,        \
             loom_status_name(rc_), loom_last_error());                                      \
  } while (0)
  BAD(loom_pg_allreduce(pg, x, NULL, 8, LOOM_F32, LOOM_SUM, &w), LOOM_EINVAL, "recv is NULL");
  DT_CHECK(w == NULL, "out cleared on failure");
  BAD(loom_pg_allreduce(pg, x, x, 8, (loom_dtype)77, LOOM_SUM, NULL), LOOM_EDTYPE, "dtype 77");
  BAD(loom_pg_allreduce(pg, x, x, 8, LOOM_F32, (loom_redop)9, NULL), LOOM_EINVAL, "op 9");
  BAD(loom_pg_allreduce(pg, x, x + 1, 4, LOOM_F32, LOOM_SUM, NULL), LOOM_EINVAL, "overlap");
  BAD(loom_pg_allreduce(pg, x, x, SIZE_MAX / 2, LOOM_F32, LOOM_SUM, NULL), LOOM_EOVERFLOW, "overflow");
  BAD(loom_pg_broadcast(pg, x, x, 8, LOOM_F32, 5, NULL), LOOM_EINVAL, "root 5 out of range");
  BAD(loom_pg_allgather(pg, x + 2 * r + 1, x, 2, LOOM_F32, NULL), LOOM_EINVAL, "in-place rule");
  BAD(loom_pg_reduce_scatter(pg, x, x + 2 * r + 1, 2, LOOM_F32, LOOM_SUM, NULL), LOOM_EINVAL,
      "in-place rule");
  BAD(loom_pg_allreduce(NULL, x, x, 1, LOOM_F32, LOOM_SUM, NULL), LOOM_EINVAL, "pg is NULL");
  BAD(loom_work_wait(NULL), LOOM_EINVAL, "w is NULL");
  BAD(loom_pg_set_timeout(pg, -1), LOOM_EINVAL, "timeout -1");
  /* nothing above started, so the group is still healthy and in step */
  DT_CHECK(loom_pg_async_error(pg) == LOOM_OK, "healthy");
  DT_CHECK(loom_pg_allreduce(pg, x, x, 8, LOOM_F32, LOOM_SUM, NULL) == LOOM_OK, "still works");
  return LOOM_OK;
}

LT_TEST(threads_bad_arguments) {
  atomic_store(&dt_failures, 0);
  LT_OK(loom_threads_run(2, NULL, bad_args, NULL));
  LT_EQ(atomic_load(&dt_failures), 0);
}

static int noop(loom_pg *pg, void *arg) { return LOOM_OK; }

LT_TEST(threads_run_and_cfg_errors) {
  LT_ERR(loom_threads_run(0, NULL, noop, NULL), LOOM_EINVAL, "nranks 0");
  LT_ERR(loom_threads_run(2, NULL, NULL, NULL), LOOM_EINVAL, "fn is NULL");
  loom_pg_cfg cfg = loom_pg_cfg_default();
  LT_NEAR(cfg.timeout_s, 300, 0);
  cfg.timeout_s = 0;
  LT_ERR(loom_threads_run(2, &cfg, noop, NULL), LOOM_EINVAL, "timeout_s 0");
  cfg = loom_pg_cfg_default();
  cfg.cores = -2;
  LT_ERR(loom_pg_cfg_validate(&cfg), LOOM_EINVAL, "cores -2");
  LT_OK(loom_pg_free(NULL));
  LT_EQ(loom_pg_rank(NULL), -1);
  LT_STREQ(loom_redop_name(LOOM_PROD), "prod");
  LT_STREQ(loom_redop_name((loom_redop)42), "?");
}

/* An all-gather with a first step (dist/prepared.h, FSDP's read of its part out of the offload
 * tier): the step fills the send buffer on the thread that runs the collective, and what it
 * wrote is what the peers receive; a step that fails fails the group, naming its error on
 * every rank, never a hang. */
typedef struct prep_ctx {
  int32_t *send;
  int rank, fail;
  pthread_t ran_on;
  int ran;
} prep_ctx;

static int prepare_part(void *arg) {
  prep_ctx *c = arg;
  c->ran_on = pthread_self();
  c->ran++;
  if (c->fail) return loom__fail(LOOM_EIO, "prepared step of rank %d: the disk is gone", c->rank);
  for (int i = 0; i < 1000; i++) c->send[i] = c->rank * 1000 + i;
  return LOOM_OK;
}

static int prepared_gather(loom_pg *pg, void *arg) {
  result *res = arg;
  int r = loom_pg_rank(pg), size = loom_pg_size(pg);
  int32_t *all = calloc((size_t)size * 1000, sizeof(int32_t));
  prep_ctx c = {.send = all + (size_t)r * 1000, .rank = r, .fail = res->rc[3] == r + 1};
  loom_work *w = NULL;
  double t0 = dt_now();
  int rc = loom__pg_allgather_prepared(pg, c.send, all, 1000, LOOM_I32, prepare_part, &c, &w);
  if (rc == LOOM_OK) rc = loom_work_wait(&w); /* a peer's failure shows at issue or at wait */
  /* it ran once if the collective went through or it failed itself; a peer whose collective
   * the group's failure stopped may or may not have run it */
  DT_CHECK(c.ran <= 1 && (c.ran == 1 || (rc != LOOM_OK && !c.fail)), "rank %d: the step ran %d "
           "times", r, c.ran);
  DT_CHECK(!c.ran || !pthread_equal(c.ran_on, pthread_self()), "it runs on the progress thread");
  if (rc == LOOM_OK)
    for (int j = 0; j < size * 1000; j++)
      DT_CHECK(all[j] == (j / 1000) * 1000 + j % 1000, "rank %d: element %d: %d", r, j, all[j]);
  note(res, pg, rc, t0);
  free(all);
  return LOOM_OK;
}

LT_TEST(threads_prepared_allgather_fills_then_sends_or_fails_the_group) {
  for (int n = 1; n <= 3; n++) {
    result res = {0};
    atomic_store(&dt_failures, 0);
    LT_OK(loom_threads_run(n, NULL, prepared_gather, &res));
    LT_EQ(atomic_load(&dt_failures), 0);
    for (int r = 0; r < n; r++) LT_EQ(res.rc[r], LOOM_OK);
  }
  result res = {0};
  res.rc[3] = 2; /* rank 1's step fails */
  loom_pg_cfg cfg = loom_pg_cfg_default(); /* long timeout: the failure must not need it */
  atomic_store(&dt_failures, 0);
  LT_OK(loom_threads_run(3, &cfg, prepared_gather, &res));
  LT_EQ(atomic_load(&dt_failures), 0);
  for (int r = 0; r < 3; r++) {
    LT_TRUE(res.rc[r] != LOOM_OK);
    LT_TRUE(strstr(res.msg[r], "the disk is gone") != NULL);
    LT_TRUE(res.secs[r] < 2.0);
  }
  LT_EQ(res.rc[1], LOOM_EIO);
}
