/* test_bucket_manager.c: the specification's bucket manager on the threads backend: prepare,
 * asynchronous reduce, is-reduced, copy back, the all-buckets forms, index-of and info, with
 * every rank's gradients checked against a sequential reduction; and its bad-argument errors. */
#include "lt.h"

#include <string.h>
#include "loom/ddp.h"
#include "core/core_int.h"

#include <stdlib.h>

enum { NG = 5 };
static const int64_t sizes[NG] = {300, 7, 1000, 64, 129};

static float value(int rank, int g, int64_t i) { return (float)(rank + 1) * 0.5f + (float)g - (float)(i % 13) * 0.25f; }

typedef struct mgr_run {
  loom_bucket_policy policy;
  size_t bucket_bytes;
  size_t nbuckets;
} mgr_run;

static int mgr_fn(loom_pg *pg, void *arg) {
  mgr_run *r = arg;
  int rank = loom_pg_rank(pg), n = loom_pg_size(pg);
  loom_tensor *g[NG] = {0};
  int rc = LOOM_OK;
  for (int k = 0; k < NG && !rc; k++) {
    rc = loom_tensor_empty(LOOM_F32, 1, &sizes[k], &g[k]);
    if (!rc)
      for (int64_t i = 0; i < sizes[k]; i++) ((float *)loom_tensor_data(g[k]))[i] = value(rank, k, i);
  }
  loom_bucket_cfg cfg = loom_bucket_cfg_default();
  cfg.policy = r->policy;
  cfg.bucket_bytes = r->bucket_bytes;
  cfg.first_bucket_bytes = r->bucket_bytes;
  loom_bucket_manager *m = NULL;
  if (!rc) rc = loom_bucket_manager_create(pg, g, NG, &cfg, &m);
  if (!rc) {
    if (rank == 0) r->nbuckets = loom_bucket_manager_count(m); /* one writer: the ranks are threads */
    /* bucket 0 alone through the single-bucket calls, the rest through reduce_all */
    rc = loom_bucket_prepare(m, 0);
    if (!rc) rc = loom_bucket_reduce_async(m, 0, LOOM_SUM);
    if (!rc && loom_bucket_reduce_async(m, 0, LOOM_SUM) != LOOM_EBUSY) rc = LOOM_EINVAL;
    if (!rc) rc = loom_bucket_wait(m, 0);
    bool reduced = false;
    if (!rc) rc = loom_bucket_test(m, 0, &reduced);
    if (!rc && !reduced) rc = LOOM_EINVAL;
    if (!rc) rc = loom_bucket_copy_back(m, 0);
  }
  /* the gradients of bucket 0 now hold the sum; reduce everything again with AVG: bucket 0's
   * gradients become the average of sums (= the sum), the others the average */
  if (!rc) rc = loom_bucket_manager_reduce_all(m, LOOM_AVG);
  if (!rc) rc = loom_bucket_manager_wait_all(m);
  if (!rc) rc = loom_bucket_manager_copy_back_all(m);
  size_t b0 = 0;
  for (int k = 0; k < NG && !rc; k++) {
    size_t bk;
    rc = loom_bucket_manager_index_of(m, g[k], &bk);
    if (rc) break;
    const float *d = loom_tensor_data(g[k]);
    for (int64_t i = 0; i < sizes[k]; i++) {
      double sum = 0;
      for (int q = 0; q < n; q++) sum += value(q, k, i);
      double want = bk == b0 ? sum : sum / n;
      if (fabs(d[i] - want) > 1e-5 * (1 + fabs(want))) {
        rc = loom__fail(LOOM_EINVAL, "rank %d gradient %d [%lld]: %g, want %g", rank, k,
                         (long long)i, d[i], want);
        break;
      }
    }
  }
  loom_bucket_manager_free(m);
  for (int k = 0; k < NG; k++) loom_tensor_free(g[k]);
  return rc;
}

LT_TEST(bucket_manager_reduces_like_a_sequential_sum) {
  for (int n = 1; n <= 4; n++)
    for (int pol = 0; pol < 2; pol++) {
      mgr_run r = {(loom_bucket_policy)pol, 1200, 0};
      LT_OK(loom_threads_run(n, NULL, mgr_fn, &r));
      LT_TRUE(r.nbuckets >= 2);
    }
  mgr_run one = {LOOM_BUCKET_LARGEST_FIRST, 1 << 20, 0}; /* everything fits: one bucket */
  LT_OK(loom_threads_run(2, NULL, mgr_fn, &one));
  LT_EQ(one.nbuckets, 1);
}

static int info_fn(loom_pg *pg, void *arg) {
  (void)arg;
  loom_tensor *g[3] = {0}, *other = NULL;
  int64_t s[3] = {10, 20, 30};
  int rc = LOOM_OK;
  for (int k = 0; k < 3 && !rc; k++) rc = loom_tensor_zeros(LOOM_F32, 1, &s[k], &g[k]);
  if (!rc) rc = loom_tensor_zeros(LOOM_F32, 1, &s[0], &other);
  loom_bucket_cfg cfg = loom_bucket_cfg_default();
  cfg.policy = LOOM_BUCKET_LARGEST_FIRST;
  cfg.bucket_bytes = 150; /* 30 floats = 120 B alone; 20 + 10 floats = 120 B together (in the
                           * buffer, 10 after 20 at the next 64-byte offset, 32: 42 elements) */
  loom_bucket_manager *m = NULL;
  if (!rc) rc = loom_bucket_manager_create(pg, g, 3, &cfg, &m);
  loom_bucket_info info;
  if (!rc) rc = loom_bucket_manager_info(m, 1, &info);
  if (!rc && (info.count != 2 || info.size_bytes != 120 || info.grads[0] != 1 || info.grads[1] != 0 ||
              info.offsets[1] != 32 || loom_tensor_numel(info.buffer) != 42 || info.dtype != LOOM_F32))
    rc = loom__fail(LOOM_EINVAL, "bucket 1 info is wrong");
  size_t idx;
  if (!rc && loom_bucket_manager_index_of(m, other, &idx) != LOOM_ENOTFOUND)
    rc = loom__fail(LOOM_EINVAL, "index_of found a tensor it does not hold");
  if (!rc && loom_bucket_prepare(m, 2) != LOOM_EINVAL) rc = loom__fail(LOOM_EINVAL, "bucket 2 exists?");
  bool reduced = true;
  if (!rc && (loom_bucket_test(m, 2, &reduced) != LOOM_EINVAL || !strstr(loom_last_error(), "out of range")))
    rc = loom__fail(LOOM_EINVAL, "loom_bucket_test took bucket 2");
  if (!rc && (loom_bucket_test(m, 0, NULL) != LOOM_EINVAL || !strstr(loom_last_error(), "reduced is NULL")))
    rc = loom__fail(LOOM_EINVAL, "loom_bucket_test took a NULL flag");
  if (!rc && (loom_bucket_test(m, 0, &reduced) != LOOM_OK || !reduced)) /* none started yet */
    rc = loom__fail(LOOM_EINVAL, "loom_bucket_test: a bucket never reduced is not 'reduced'");
  loom_bucket_manager_free(m);
  for (int k = 0; k < 3; k++) loom_tensor_free(g[k]);
  loom_tensor_free(other);
  return rc;
}

LT_TEST(bucket_manager_info_index_and_errors) {
  LT_OK(loom_threads_run(1, NULL, info_fn, NULL));
  loom_bucket_manager *m = (loom_bucket_manager *)1;
  LT_ERR(loom_bucket_manager_create(NULL, NULL, 0, NULL, &m), LOOM_EINVAL, "process group is NULL");
  LT_TRUE(m == NULL);
  LT_ERR(loom_bucket_prepare(NULL, 0), LOOM_EINVAL, "manager is NULL");
  bool reduced;
  LT_ERR(loom_bucket_test(NULL, 0, &reduced), LOOM_EINVAL, "manager is NULL");
  const loom_param_seg *segs;
  size_t nseg;
  LT_ERR(loom_ddp_segments(NULL, &segs, &nseg), LOOM_EINVAL, "NULL argument");
  LT_EQ(loom_bucket_manager_count(NULL), 0);
  loom_bucket_manager_free(NULL);
}

static int dup_fn(loom_pg *pg, void *arg) {
  (void)arg;
  loom_tensor *g = NULL, *i32 = NULL;
  int64_t s = 4;
  int rc = loom_tensor_zeros(LOOM_F32, 1, &s, &g);
  if (!rc) rc = loom_tensor_zeros(LOOM_I32, 1, &s, &i32);
  loom_bucket_manager *m = NULL;
  loom_tensor *twice[2] = {g, g}, *ints[1] = {i32};
  int r1 = loom_bucket_manager_create(pg, twice, 2, NULL, &m);
  int r2 = loom_bucket_manager_create(pg, ints, 1, NULL, &m);
  loom_tensor_free(g);
  loom_tensor_free(i32);
  if (rc) return rc;
  if (r1 != LOOM_EINVAL) return loom__fail(LOOM_EINVAL, "a gradient given twice was accepted");
  if (r2 != LOOM_EDTYPE) return loom__fail(LOOM_EINVAL, "an i32 gradient was accepted");
  return LOOM_OK;
}

LT_TEST(bucket_manager_rejects_bad_gradients) { LT_OK(loom_threads_run(1, NULL, dup_fn, NULL)); }
