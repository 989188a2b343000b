/* test_threads_coll.c: every collective x dtype x op x in-place of the threads backend with 1,
 * 2, 3 and 4 ranks against the sequential reference, bit for bit, at counts that are 0, not a
 * multiple of the rank count, on both sides of the small-message threshold and over several
 * pipeline chunks. All cases run back to back on one group per world, so they also check that
 * consecutive collectives do not disturb each other. */
#include "dist_test.h"

/* The reference itself, against values worked out here. */
LT_TEST(dist_reference_by_hand) {
  /* three ranks, one element: check the reference against values computed here */
  for (int op = 0; op < LOOM_REDOP_COUNT; op++) {
    double v[3];
    for (int r = 0; r < 3; r++) v[r] = dt_value(r, 5, 9, LOOM_I64, (loom_redop)op);
    int64_t want = (int64_t)v[0];
    for (int r = 1; r < 3; r++) {
      int64_t x = (int64_t)v[r];
      if (op == LOOM_SUM || op == LOOM_AVG) want += x;
      if (op == LOOM_MIN) want = x < want ? x : want;
      if (op == LOOM_MAX) want = x > want ? x : want;
      if (op == LOOM_PROD) want *= x;
    }
    if (op == LOOM_AVG) want /= 3;
    int64_t got;
    dt_reduce_ref(&got, LOOM_I64, (loom_redop)op, 3, 1, 5, 9);
    LT_EQ(got, want);
  }
}

static void run_world(int n) {
  atomic_store(&dt_failures, 0);
  LT_OK(loom_threads_run(n, NULL, dt_all_cases, NULL));
  LT_EQ(atomic_load(&dt_failures), 0);
}

LT_TEST(threads_coll_1_rank) { run_world(1); }
LT_TEST(threads_coll_2_ranks) { run_world(2); }
LT_TEST(threads_coll_3_ranks) { run_world(3); }
LT_TEST(threads_coll_4_ranks) { run_world(4); }

/* A sum that needs f32 accumulation: 4 ranks of bf16 values 1 + 2^-8 each, whose partial sums
 * round differently in bf16 than in f32. */
static int bf16_accumulates_in_f32(loom_pg *pg, void *arg) {
  (void)arg;
  uint16_t x[3] = {loom_f32_to_bf16(1.0f), loom_f32_to_bf16(0.00390625f),
                   loom_f32_to_bf16(256.0f)};
  uint16_t big = loom_f32_to_bf16(loom_pg_rank(pg) == 0 ? 256.0f : 0.75f);
  x[2] = big;
  DT_CHECK(loom_pg_allreduce(pg, x, x, 3, LOOM_BF16, LOOM_SUM, NULL) == LOOM_OK, "allreduce");
  DT_CHECK(loom_bf16_to_f32(x[0]) == 4.0f, "sum of ones %g", loom_bf16_to_f32(x[0]));
  /* 256 + 0.75*3 = 258.25 -> bf16 258; folding in bf16 would give 256 (each 0.75 lost) */
  DT_CHECK(loom_bf16_to_f32(x[2]) == 258.0f, "f32 accumulation %g", loom_bf16_to_f32(x[2]));
  return LOOM_OK;
}

LT_TEST(threads_bf16_sum_accumulates_in_f32) {
  atomic_store(&dt_failures, 0);
  LT_OK(loom_threads_run(4, NULL, bf16_accumulates_in_f32, NULL));
  LT_EQ(atomic_load(&dt_failures), 0);
}

static int shares(loom_pg *pg, void *arg) {
  int *out = arg;
  out[loom_pg_rank(pg)] = loom_pg_compute_threads(pg);
  return LOOM_OK;
}

LT_TEST(threads_compute_threads_divide_the_cores) {
  int got[3] = {0};
  loom_pg_cfg cfg = loom_pg_cfg_default();
  cfg.cores = 8;
  LT_OK(loom_threads_run(3, &cfg, shares, got));
  LT_EQ(got[0], 3);
  LT_EQ(got[1], 3);
  LT_EQ(got[2], 2);
  cfg.cores = 2;
  LT_OK(loom_threads_run(3, &cfg, shares, got));
  LT_EQ(got[0], 1);
  LT_EQ(got[2], 1); /* never 0 */
}
