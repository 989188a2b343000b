/* test_threads_split.c: loom_pg_split on the threads backend against MPI_Comm_split's
 * documented semantics: groups by color, ranks ordered by key with ties by parent rank, a
 * negative color giving no group; every collective correct on the sub-groups (the full
 * reference sweep); the hybrid layout (shard groups of consecutive ranks, replica groups
 * across them) used concurrently, and split again; failures in a sub-group reach every group
 * of the run rather than hang; bad arguments. */
#include "dist_test.h"

#include "loom/alloc.h"

#include <string.h>
#include <time.h>

enum { N = 6 };

/* The reference: rank r's color and key, and where MPI_Comm_split puts it. */
static int color_of(int r) { return r == 5 ? LOOM_PG_NO_COLOR : r % 3; }
static int key_of(int r) { return r % 3 == 0 ? -r : r % 3 == 1 ? 7 : 10 - r; }

static void expected(int r, int *rank, int *size) {
  *rank = 0;
  *size = 0;
  if (color_of(r) < 0) return;
  for (int q = 0; q < N; q++) {
    if (color_of(q) != color_of(r)) continue;
    (*size)++;
    if (key_of(q) < key_of(r) || (key_of(q) == key_of(r) && q < r)) (*rank)++;
  }
}

static int semantics(loom_pg *pg, void *arg) {
  (void)arg;
  int r = loom_pg_rank(pg);
  loom_pg *sub = (loom_pg *)1;
  int rc = loom_pg_split(pg, color_of(r), key_of(r), &sub);
  DT_CHECK(rc == LOOM_OK, "split on rank %d", r);
  int want_rank, want_size;
  expected(r, &want_rank, &want_size);
  int64_t s = r;
  if (want_size == 0) {
    DT_CHECK(sub == NULL, "rank %d has no color: no group", r);
    DT_CHECK(loom_pg_allreduce(pg, &s, &s, 1, LOOM_I64, LOOM_SUM, NULL) == LOOM_OK, "parent");
    return LOOM_OK;
  }
  DT_CHECK(sub && loom_pg_rank(sub) == want_rank && loom_pg_size(sub) == want_size,
           "rank %d: sub rank %d size %d, expected %d of %d", r, loom_pg_rank(sub),
           loom_pg_size(sub), want_rank, want_size);
  DT_CHECK(strcmp(loom_pg_backend(sub), "threads") == 0, "backend");
  DT_CHECK(loom_pg_timeout(sub) == loom_pg_timeout(pg), "timeout inherited");
  if (loom_mem_dry_run()) { /* no bytes move: nothing more to compare */
    DT_CHECK(loom_pg_allreduce(pg, &s, &s, 1, LOOM_I64, LOOM_SUM, NULL) == LOOM_OK, "parent");
    return loom_pg_free(sub);
  }
  /* the members, in the new group's order, are the parent ranks the reference orders */
  int64_t mine = r, all[N];
  DT_CHECK(loom_pg_allgather(sub, &mine, all, 1, LOOM_I64, NULL) == LOOM_OK, "all-gather");
  for (int i = 0; i < want_size; i++) {
    int q = (int)all[i], qr, qs;
    expected(q, &qr, &qs);
    DT_CHECK(color_of(q) == color_of(r) && qr == i, "rank %d: member %d is parent rank %d", r,
             i, q);
  }
  /* the parent keeps working, its collectives independent of the sub-group's */
  DT_CHECK(loom_pg_allreduce(pg, &s, &s, 1, LOOM_I64, LOOM_SUM, NULL) == LOOM_OK &&
               s == N * (N - 1) / 2, "parent all-reduce");
  DT_CHECK(loom_pg_free(sub) == LOOM_OK, "free");
  return LOOM_OK;
}

LT_TEST(threads_split_follows_mpi_comm_split) {
  atomic_store(&dt_failures, 0);
  LT_OK(loom_threads_run(N, NULL, semantics, NULL));
  LT_EQ(atomic_load(&dt_failures), 0);
}

/* Every collective x dtype x op on two groups of two, checked bit for bit, both at once. */
static int sweep(loom_pg *pg, void *arg) {
  (void)arg;
  int r = loom_pg_rank(pg);
  loom_pg *sub = NULL;
  int rc = loom_pg_split(pg, r % 2, r, &sub);
  if (rc) return rc;
  dt_all_cases(sub, NULL);
  return loom_pg_free(sub);
}

LT_TEST(threads_split_groups_run_every_collective) {
  atomic_store(&dt_failures, 0);
  LT_OK(loom_threads_run(4, NULL, sweep, NULL));
  LT_EQ(atomic_load(&dt_failures), 0);
}

/* Hybrid sharding's groups: shards of 2 consecutive ranks, replicas across them, with async
 * collectives in flight on both at once; then the shard group split again. */
static int hybrid(loom_pg *pg, void *arg) {
  (void)arg;
  int r = loom_pg_rank(pg), n = loom_pg_size(pg);
  loom_pg *shard = NULL, *rep = NULL, *half = NULL;
  int rc = loom_pg_split(pg, r / 2, r, &shard);
  if (!rc) rc = loom_pg_split(pg, r % 2, r, &rep);
  if (rc) return rc;
  DT_CHECK(loom_pg_rank(shard) == r % 2 && loom_pg_size(shard) == 2, "shard group");
  DT_CHECK(loom_pg_rank(rep) == r / 2 && loom_pg_size(rep) == n / 2, "replica group");
  enum { M = 50000 }; /* past the small-message path */
  static float a[8][M], b[8][M];
  for (int i = 0; i < M; i++) a[r][i] = (float)(r + 1) * (float)(i % 17), b[r][i] = (float)r;
  loom_work *wa = NULL, *wb = NULL;
  for (int it = 0; it < 5; it++) {
    for (int i = 0; i < M; i++) a[r][i] = (float)(r + 1) * (float)(i % 17), b[r][i] = (float)r;
    DT_CHECK(loom_pg_allreduce(shard, a[r], a[r], M, LOOM_F32, LOOM_SUM, &wa) == LOOM_OK, "a");
    DT_CHECK(loom_pg_allreduce(rep, b[r], b[r], M, LOOM_F32, LOOM_MAX, &wb) == LOOM_OK, "b");
    DT_CHECK(loom_work_wait(&wb) == LOOM_OK && loom_work_wait(&wa) == LOOM_OK, "waits");
    int lo = r / 2 * 2;
    for (int i = 0; i < M; i += 997) {
      DT_CHECK(a[r][i] == (float)(2 * lo + 3) * (float)(i % 17), "shard sum at %d", i);
      DT_CHECK(b[r][i] == (float)(n - 2 + r % 2), "replica max at %d", i);
    }
  }
  /* a split of a split: each shard group cut in two single ranks */
  rc = loom_pg_split(shard, loom_pg_rank(shard), 0, &half);
  DT_CHECK(rc == LOOM_OK && loom_pg_size(half) == 1 && loom_pg_rank(half) == 0, "split again");
  float x = (float)r;
  DT_CHECK(loom_pg_allreduce(half, &x, &x, 1, LOOM_F32, LOOM_SUM, NULL) == LOOM_OK && x == r,
           "one-rank group");
  DT_CHECK(loom_pg_free(half) == LOOM_OK && loom_pg_free(rep) == LOOM_OK &&
               loom_pg_free(shard) == LOOM_OK, "free");
  return LOOM_OK;
}

LT_TEST(threads_split_hybrid_groups_concurrently) {
  atomic_store(&dt_failures, 0);
  LT_OK(loom_threads_run(4, NULL, hybrid, NULL));
  LT_OK(loom_threads_run(8, NULL, hybrid, NULL));
  LT_EQ(atomic_load(&dt_failures), 0);
}

/* Rank 1 aborts its shard group; rank 2 and 3 (another shard group) then wait in their replica
 * group for ranks 0 and 1: every rank fails with a status, within the timeout. And a rank that
 * returns without freeing its group leaves its peers there failing, naming it. */
typedef struct fail_case {
  int kind;
  int rc[4];
  char msg[4][512];
} fail_case;

static int failing(loom_pg *pg, void *arg) {
  fail_case *fc = arg;
  int r = loom_pg_rank(pg);
  loom_pg *shard = NULL, *rep = NULL;
  int rc = loom_pg_split(pg, r / 2, r, &shard);
  if (!rc) rc = loom_pg_split(pg, r % 2, r, &rep);
  if (rc) return rc;
  float x = 1;
  if (fc->kind == 0) {
    if (r == 1) loom_pg_abort(shard);
    rc = loom_pg_allreduce(r < 2 ? shard : rep, &x, &x, 1, LOOM_F32, LOOM_SUM, NULL);
    if (!rc) rc = loom_pg_allreduce(rep, &x, &x, 1, LOOM_F32, LOOM_SUM, NULL);
  } else {
    if (r == 3) { /* leaves its groups without their collectives */
      loom_pg_free(rep);
      loom_pg_free(shard);
      return LOOM_OK;
    }
    rc = loom_pg_allreduce(r == 2 ? shard : rep, &x, &x, 1, LOOM_F32, LOOM_SUM, NULL);
    if (!rc && r == 1) rc = loom_pg_allreduce(rep, &x, &x, 1, LOOM_F32, LOOM_SUM, NULL);
  }
  fc->rc[r] = rc;
  snprintf(fc->msg[r], sizeof fc->msg[r], "%s", rc ? loom_last_error() : "");
  loom_pg_free(rep);
  loom_pg_free(shard);
  return rc;
}

LT_TEST(threads_split_failure_reaches_every_group) {
  loom_pg_cfg cfg = loom_pg_cfg_default();
  cfg.timeout_s = 5;
  for (int kind = 0; kind < 2; kind++) {
    fail_case fc;
    memset(&fc, 0, sizeof fc);
    fc.kind = kind;
    double t0 = dt_now();
    int rc = loom_threads_run(4, &cfg, failing, &fc);
    double secs = dt_now() - t0;
    LT_TRUE(rc != LOOM_OK);
    LT_TRUE(secs < 4.0); /* failed at once, not by the timeout */
    if (kind == 0) {
      LT_EQ(fc.rc[1], LOOM_EABORTED);
      for (int r = 0; r < 4; r++) LT_TRUE(fc.rc[r] != LOOM_OK);
    } else {
      LT_EQ(fc.rc[2], LOOM_EREMOTE);
      LT_TRUE(strstr(fc.msg[2], "rank 1 returned") != NULL);
      for (int r = 0; r < 3; r++) LT_EQ(fc.rc[r], LOOM_EREMOTE);
    }
  }
}

/* A timeout in a group split from a split group names each rank by its rank there and in the
 * run: of the 4 ranks, the replica group {0, 2} is split again in reverse order ({2, 0}), where
 * rank 2 of the run joins no collective until rank 0's has timed out. */
static int named(loom_pg *pg, void *arg) {
  char *msg = arg;
  int r = loom_pg_rank(pg);
  loom_pg *rep = NULL, *rev = NULL;
  int rc = loom_pg_split(pg, r % 2, r, &rep);
  if (!rc) rc = loom_pg_split(rep, 0, -loom_pg_rank(rep), &rev);
  float x = 1;
  if (!rc && r == 0) {
    rc = loom_pg_allreduce(rev, &x, &x, 1, LOOM_F32, LOOM_SUM, NULL);
    snprintf(msg, 512, "%s", rc ? loom_last_error() : "");
    rc = rc == LOOM_ETIMEDOUT ? LOOM_OK : LOOM_EINVAL;
  } else if (!rc && r == 2) {
    struct timespec ts = {1, 500000000}; /* well past rank 0's timeout */
    nanosleep(&ts, NULL);
  }
  loom_pg_free(rev);
  loom_pg_free(rep);
  return rc;
}

LT_TEST(threads_split_timeout_names_ranks_of_the_run) {
  loom_pg_cfg cfg = loom_pg_cfg_default();
  cfg.timeout_s = 0.2;
  char msg[512] = "";
  loom_threads_run(4, &cfg, named, msg); /* rank 0's failure fails the run's group too */
  LT_TRUE(strstr(msg, "rank 1 (rank 0 of the run): all-reduce #1 timed out after 0.2 s waiting "
                      "for rank 0 (rank 2 of the run)") != NULL);
}

LT_TEST(threads_split_bad_arguments) {
  loom_pg *out = (loom_pg *)1;
  LT_EQ(loom_pg_split(NULL, 0, 0, &out), LOOM_EINVAL);
  LT_TRUE(out == NULL);
}

/* In a dry run (loom plan: collectives move no bytes) the groups are still the right ones. */
LT_TEST(threads_split_in_a_dry_run) {
  atomic_store(&dt_failures, 0);
  loom_mem_set_dry_run(true);
  int rc = loom_threads_run(N, NULL, semantics, NULL);
  loom_mem_set_dry_run(false);
  LT_OK(rc);
  LT_EQ(atomic_load(&dt_failures), 0);
}
