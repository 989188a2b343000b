/* test_threads_coll.c: every collective x dtype x op x in-place of the threads backend with 1,
 * 2, 3 and 4 ranks against the sequential reference, bit for bit, at counts that are 0, not a
 * multiple of the rank count, on both sides of the small-message threshold and over several
 * pipeline chunks. All cases run back to back on one group per world, so they also check that
 * consecutive collectives do not disturb each other. */
#include "dist_test.h"

static const size_t counts[] = {0, 1, 5, 1001, 9001, 70001};
#define NCOUNTS (sizeof counts / sizeof counts[0])

static void *xalloc(size_t bytes) { return calloc(1, bytes ? bytes : 1); }

static void case_allreduce(loom_pg *pg, loom_dtype dt, loom_redop op, bool inplace, size_t n,
                           unsigned seed) {
  int r = loom_pg_rank(pg), size = loom_pg_size(pg);
  size_t es = loom_dtype_size(dt);
  unsigned char *send = xalloc(n * es), *recv = inplace ? send : xalloc(n * es),
                *ref = xalloc(n * es);
  dt_fill(send, dt, n, r, 0, seed, op);
  dt_reduce_ref(ref, dt, op, size, n, 0, seed);
  int rc = loom_pg_allreduce(pg, send, recv, n, dt, op, NULL);
  DT_CHECK(rc == LOOM_OK, "all-reduce rc %d", rc);
  DT_CHECK(memcmp(recv, ref, n * es) == 0, "all-reduce %s %s inplace %d count %zu ranks %d rank %d",
           loom_dtype_name(dt), loom_redop_name(op), inplace, n, size, r);
  free(send);
  if (!inplace) free(recv);
  free(ref);
}

static void case_reduce_scatter(loom_pg *pg, loom_dtype dt, loom_redop op, bool inplace,
                                size_t n, unsigned seed) {
  int r = loom_pg_rank(pg), size = loom_pg_size(pg);
  size_t es = loom_dtype_size(dt);
  unsigned char *send = xalloc((size_t)size * n * es), *ref = xalloc(n * es);
  unsigned char *recv = inplace ? send + (size_t)r * n * es : xalloc(n * es);
  dt_fill(send, dt, (size_t)size * n, r, 0, seed, op);
  dt_reduce_ref(ref, dt, op, size, n, (size_t)r * n, seed);
  int rc = loom_pg_reduce_scatter(pg, send, recv, n, dt, op, NULL);
  DT_CHECK(rc == LOOM_OK, "reduce-scatter rc %d", rc);
  DT_CHECK(memcmp(recv, ref, n * es) == 0,
           "reduce-scatter %s %s inplace %d count %zu ranks %d rank %d", loom_dtype_name(dt),
           loom_redop_name(op), inplace, n, size, r);
  free(send);
  if (!inplace) free(recv);
  free(ref);
}

static void case_broadcast(loom_pg *pg, loom_dtype dt, int root, bool inplace, size_t n,
                           unsigned seed) {
  int r = loom_pg_rank(pg), size = loom_pg_size(pg);
  size_t es = loom_dtype_size(dt);
  unsigned char *recv = xalloc(n * es), *ref = xalloc(n * es);
  unsigned char *send = r == root ? (inplace ? recv : xalloc(n * es)) : NULL;
  dt_fill(ref, dt, n, root, 0, seed, LOOM_SUM);
  if (send) memcpy(send, ref, n * es);
  if (r != root) memset(recv, 0x5a, n * es);
  int rc = loom_pg_broadcast(pg, send, recv, n, dt, root, NULL);
  DT_CHECK(rc == LOOM_OK, "broadcast rc %d", rc);
  DT_CHECK(memcmp(recv, ref, n * es) == 0, "broadcast %s root %d inplace %d count %zu ranks %d rank %d",
           loom_dtype_name(dt), root, inplace, n, size, r);
  if (send && send != recv) free(send);
  free(recv);
  free(ref);
}

static void case_allgather(loom_pg *pg, loom_dtype dt, bool inplace, size_t n, unsigned seed) {
  int r = loom_pg_rank(pg), size = loom_pg_size(pg);
  size_t es = loom_dtype_size(dt), blk = n * es;
  unsigned char *recv = xalloc((size_t)size * blk), *ref = xalloc((size_t)size * blk);
  unsigned char *send = inplace ? recv + (size_t)r * blk : xalloc(blk);
  for (int j = 0; j < size; j++) dt_fill(ref + (size_t)j * blk, dt, n, j, 0, seed, LOOM_SUM);
  if (!inplace) memset(recv, 0x5a, (size_t)size * blk);
  memcpy(send, ref + (size_t)r * blk, blk);
  int rc = loom_pg_allgather(pg, send, recv, n, dt, NULL);
  DT_CHECK(rc == LOOM_OK, "all-gather rc %d", rc);
  DT_CHECK(memcmp(recv, ref, (size_t)size * blk) == 0,
           "all-gather %s inplace %d count %zu ranks %d rank %d", loom_dtype_name(dt), inplace,
           n, size, r);
  if (!inplace) free(send);
  free(recv);
  free(ref);
}

static int all_cases(loom_pg *pg, void *arg) {
  (void)arg;
  unsigned seed = 1;
  DT_CHECK(loom_pg_compute_threads(pg) >= 1, "compute threads");
  DT_CHECK(strcmp(loom_pg_backend(pg), "threads") == 0, "backend name");
  for (size_t ci = 0; ci < NCOUNTS; ci++)
    for (int dt = 0; dt < LOOM_DTYPE_COUNT; dt++)
      for (int inplace = 0; inplace < 2; inplace++) {
        for (int op = 0; op < LOOM_REDOP_COUNT; op++) {
          case_allreduce(pg, (loom_dtype)dt, (loom_redop)op, inplace, counts[ci], seed++);
          case_reduce_scatter(pg, (loom_dtype)dt, (loom_redop)op, inplace, counts[ci], seed++);
        }
        for (int root = 0; root < loom_pg_size(pg); root++)
          case_broadcast(pg, (loom_dtype)dt, root, inplace, counts[ci], seed++);
        case_allgather(pg, (loom_dtype)dt, inplace, counts[ci], seed++);
        DT_CHECK(loom_pg_barrier(pg, NULL) == LOOM_OK, "barrier");
      }
  return LOOM_OK;
}

static void run_world(int n) {
  atomic_store(&dt_failures, 0);
  LT_OK(loom_threads_run(n, NULL, all_cases, NULL));
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
