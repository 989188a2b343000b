/* test_threads_async.c: work handles of the threads backend: many async collectives in flight
 * completing in issue order with the right data, blocking calls queued behind async ones,
 * test/wait/wait_all semantics (consume, NULL), and the work-outstanding rules. */
#include "dist_test.h"

#define INFLIGHT 48

static int many_in_flight(loom_pg *pg, void *arg) {
  (void)arg;
  int r = loom_pg_rank(pg), size = loom_pg_size(pg);
  float *buf[INFLIGHT], *ref[INFLIGHT];
  loom_work *w[INFLIGHT];
  size_t n[INFLIGHT];
  for (int k = 0; k < INFLIGHT; k++) {
    n[k] = (size_t)(k % 4 == 3 ? 100003 : 1 + 37 * k); /* small and large mixed */
    buf[k] = malloc(n[k] * sizeof(float));
    ref[k] = malloc(n[k] * sizeof(float));
    dt_fill(buf[k], LOOM_F32, n[k], r, 0, 100u + (unsigned)k, LOOM_SUM);
    dt_reduce_ref(ref[k], LOOM_F32, LOOM_SUM, size, n[k], 0, 100u + (unsigned)k);
    int rc = loom_pg_allreduce(pg, buf[k], buf[k], n[k], LOOM_F32, LOOM_SUM, &w[k]);
    DT_CHECK(rc == LOOM_OK && w[k], "start %d", k);
  }
  /* a blocking collective issued now runs after all of them */
  int64_t one = r + 1, total = 0;
  DT_CHECK(loom_pg_allreduce(pg, &one, &total, 1, LOOM_I64, LOOM_SUM, NULL) == LOOM_OK, "blocking");
  DT_CHECK(total == (int64_t)size * (size + 1) / 2, "blocking total %lld", (long long)total);
  /* poll half with test, then wait for the rest all at once */
  for (int k = 0; k < INFLIGHT / 2; k++) {
    int done = 0;
    while (!done) DT_CHECK(loom_work_test(&w[k], &done) == LOOM_OK, "test %d", k);
    DT_CHECK(w[k] == NULL, "test consumed %d", k);
  }
  DT_CHECK(loom_work_wait_all(w, INFLIGHT) == LOOM_OK, "wait_all");
  for (int k = 0; k < INFLIGHT; k++) {
    DT_CHECK(w[k] == NULL, "wait_all consumed %d", k);
    DT_CHECK(memcmp(buf[k], ref[k], n[k] * sizeof(float)) == 0, "data of collective %d", k);
    free(buf[k]);
    free(ref[k]);
  }
  /* NULL handles */
  loom_work *none = NULL;
  int done = 0;
  DT_CHECK(loom_work_wait(&none) == LOOM_OK, "wait NULL");
  DT_CHECK(loom_work_test(&none, &done) == LOOM_OK && done == 1, "test NULL");
  return LOOM_OK;
}

LT_TEST(threads_async_many_in_flight) {
  for (int n = 1; n <= 4; n++) {
    atomic_store(&dt_failures, 0);
    LT_OK(loom_threads_run(n, NULL, many_in_flight, NULL));
    LT_EQ(atomic_load(&dt_failures), 0);
  }
}

/* Every kind async, mixed dtypes, waited in reverse order. */
static int every_kind_async(loom_pg *pg, void *arg) {
  (void)arg;
  int r = loom_pg_rank(pg), size = loom_pg_size(pg);
  enum { N = 1003 };
  uint16_t *h = malloc(N * 2), *href = malloc(N * 2);
  int32_t *g = malloc((size_t)size * N * 4), *gin = malloc(N * 4);
  int64_t *b = malloc(N * 8), *rs = malloc((size_t)size * N * 8), *rsout = malloc(N * 8),
          *rsref = malloc(N * 8);
  dt_fill(h, LOOM_F16, N, r, 0, 7, LOOM_MAX);
  dt_reduce_ref(href, LOOM_F16, LOOM_MAX, size, N, 0, 7);
  dt_fill(gin, LOOM_I32, N, r, 0, 8, LOOM_SUM);
  for (int i = 0; i < N; i++) b[i] = r == size - 1 ? 1000 + i : -1;
  dt_fill(rs, LOOM_I64, (size_t)size * N, r, 0, 9, LOOM_MIN);
  dt_reduce_ref(rsref, LOOM_I64, LOOM_MIN, size, N, (size_t)r * N, 9);
  loom_work *w[5];
  DT_CHECK(loom_pg_allreduce(pg, h, h, N, LOOM_F16, LOOM_MAX, &w[0]) == LOOM_OK, "ar");
  DT_CHECK(loom_pg_allgather(pg, gin, g, N, LOOM_I32, &w[1]) == LOOM_OK, "ag");
  DT_CHECK(loom_pg_broadcast(pg, b, b, N, LOOM_I64, size - 1, &w[2]) == LOOM_OK, "bc");
  DT_CHECK(loom_pg_reduce_scatter(pg, rs, rsout, N, LOOM_I64, LOOM_MIN, &w[3]) == LOOM_OK, "rs");
  DT_CHECK(loom_pg_barrier(pg, &w[4]) == LOOM_OK, "barrier");
  for (int k = 4; k >= 0; k--) DT_CHECK(loom_work_wait(&w[k]) == LOOM_OK && !w[k], "wait %d", k);
  DT_CHECK(memcmp(h, href, N * 2) == 0, "f16 max");
  for (int j = 0; j < size; j++)
    for (int i = 0; i < N; i++)
      DT_CHECK(g[j * N + i] == (int32_t)dt_value(j, (size_t)i, 8, LOOM_I32, LOOM_SUM), "ag %d %d", j, i);
  for (int i = 0; i < N; i++) DT_CHECK(b[i] == 1000 + i, "bc %d", i);
  DT_CHECK(memcmp(rsout, rsref, N * 8) == 0, "rs min");
  free(h), free(href), free(g), free(gin), free(b), free(rs), free(rsout), free(rsref);
  return LOOM_OK;
}

LT_TEST(threads_async_every_kind) {
  for (int n = 1; n <= 4; n++) {
    atomic_store(&dt_failures, 0);
    LT_OK(loom_threads_run(n, NULL, every_kind_async, NULL));
    LT_EQ(atomic_load(&dt_failures), 0);
  }
}

/* An all-gather whose recv is one buffer shared by every rank (FSDP's shared gathered units):
 * each rank copies only its own part into it (threads_coll.c), and after the collective every
 * rank sees every part, sent from separate buffers or in place, async and blocking. */
typedef struct shared_ctx {
  int32_t *recv;    /* size x N, shared */
  int32_t *inplace; /* size x N, shared: each rank's part filled in place */
} shared_ctx;

static int shared_recv_gather(loom_pg *pg, void *arg) {
  shared_ctx *c = arg;
  int r = loom_pg_rank(pg), size = loom_pg_size(pg);
  enum { N = 70001 }; /* odd, above the small-message sizes */
  int32_t *mine = malloc(N * 4);
  for (int i = 0; i < N; i++) mine[i] = (int32_t)dt_value(r, (size_t)i, 21, LOOM_I32, LOOM_SUM);
  memcpy(c->inplace + (size_t)r * N, mine, N * 4);
  loom_work *w = NULL;
  DT_CHECK(loom_pg_allgather(pg, mine, c->recv, N, LOOM_I32, &w) == LOOM_OK, "async");
  DT_CHECK(loom_work_wait(&w) == LOOM_OK, "wait");
  DT_CHECK(loom_pg_allgather(pg, c->inplace + (size_t)r * N, c->inplace, N, LOOM_I32, NULL) ==
               LOOM_OK, "in place");
  for (int j = 0; j < size; j++)
    for (int i = 0; i < N; i++) {
      int32_t want = (int32_t)dt_value(j, (size_t)i, 21, LOOM_I32, LOOM_SUM);
      DT_CHECK(c->recv[(size_t)j * N + i] == want, "rank %d: part %d element %d", r, j, i);
      DT_CHECK(c->inplace[(size_t)j * N + i] == want, "rank %d: in place %d %d", r, j, i);
    }
  /* nobody rewrites the shared buffers before every rank checked them */
  DT_CHECK(loom_pg_barrier(pg, NULL) == LOOM_OK, "barrier");
  free(mine);
  return LOOM_OK;
}

LT_TEST(threads_allgather_into_one_buffer_shared_by_the_ranks) {
  for (int n = 1; n <= 4; n++) {
    shared_ctx c = {calloc((size_t)n * 70001, 4), calloc((size_t)n * 70001, 4)};
    memset(c.recv, 0xa5, (size_t)n * 70001 * 4);
    atomic_store(&dt_failures, 0);
    LT_OK(loom_threads_run(n, NULL, shared_recv_gather, &c));
    LT_EQ(atomic_load(&dt_failures), 0);
    free(c.recv);
    free(c.inplace);
  }
}

/* Returning with a handle not waited is LOOM_EBUSY for that rank (and nothing leaks). */
static int leaves_work(loom_pg *pg, void *arg) {
  (void)arg;
  static _Thread_local float x[4];
  loom_work *w = NULL;
  DT_CHECK(loom_pg_free(pg) == LOOM_EMISUSE, "free of a run's group");
  if (loom_pg_rank(pg) == 1) return loom_pg_allreduce(pg, x, x, 4, LOOM_F32, LOOM_SUM, &w);
  return loom_pg_allreduce(pg, x, x, 4, LOOM_F32, LOOM_SUM, NULL);
}

LT_TEST(threads_returning_with_work_is_busy) {
  atomic_store(&dt_failures, 0);
  LT_ERR(loom_threads_run(2, NULL, leaves_work, NULL), LOOM_EBUSY,
         "rank 1: returned with 1 collectives not waited");
  LT_EQ(atomic_load(&dt_failures), 0);
}

/* Compute overlaps communication: an async all-reduce completes on the progress thread while
 * the caller does not call into loom at all. */
static int overlaps(loom_pg *pg, void *arg) {
  (void)arg;
  enum { N = 1 << 18 };
  float *x = malloc(N * sizeof *x);
  for (int i = 0; i < N; i++) x[i] = 1.0f;
  loom_work *w = NULL;
  DT_CHECK(loom_pg_allreduce(pg, x, x, N, LOOM_F32, LOOM_SUM, &w) == LOOM_OK, "start");
  double t0 = dt_now();
  int done = 0;
  while (dt_now() - t0 < 10.0 && !done) {
    /* "compute" without calling loom; then peek */
    volatile double s = 0;
    for (int i = 0; i < 100000; i++) s += i;
    DT_CHECK(loom_work_test(&w, &done) == LOOM_OK, "test");
  }
  DT_CHECK(done, "the collective progressed without the caller");
  DT_CHECK(x[N - 1] == (float)loom_pg_size(pg), "sum %g", x[N - 1]);
  loom_work_wait(&w);
  free(x);
  return LOOM_OK;
}

LT_TEST(threads_async_progresses_in_background) {
  atomic_store(&dt_failures, 0);
  LT_OK(loom_threads_run(2, NULL, overlaps, NULL));
  LT_EQ(atomic_load(&dt_failures), 0);
}
