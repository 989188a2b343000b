/* test_bucket_plan.c: bucket assignment under both policies (the specification's example, a
 * parameter larger than the limit, the single-bucket case, dtypes never mixed, PyTorch's small
 * first bucket in reverse order) and configuration validation. */
#include "lt.h"
#include "ddp/ddp_int.h"

#define MB ((size_t)1 << 20)

static void expect_bucket(const loom__bucket_plan *p, size_t b, const size_t *grads, size_t n) {
  LT_EQ(p->count[b], n);
  for (size_t k = 0; k < n && k < p->count[b]; k++) LT_EQ(p->order[p->first[b] + k], grads[k]);
}

LT_TEST(plan_spec_example_largest_first) {
  /* Parameters [100MB, 50MB, 30MB, 20MB, 15MB], bucket 100MB -> [100], [50,30,20], [15] */
  size_t numel[] = {100 * MB / 4, 50 * MB / 4, 30 * MB / 4, 20 * MB / 4, 15 * MB / 4};
  loom_dtype dt[] = {LOOM_F32, LOOM_F32, LOOM_F32, LOOM_F32, LOOM_F32};
  loom_bucket_cfg cfg = loom_bucket_cfg_default();
  cfg.policy = LOOM_BUCKET_LARGEST_FIRST;
  cfg.bucket_bytes = 100 * MB;
  loom__bucket_plan p;
  LT_OK(loom__bucket_plan_make(numel, dt, 5, &cfg, &p));
  LT_EQ(p.nbuckets, 3);
  expect_bucket(&p, 0, (size_t[]){0}, 1);
  expect_bucket(&p, 1, (size_t[]){1, 2, 3}, 3);
  expect_bucket(&p, 2, (size_t[]){4}, 1);
  LT_EQ(p.bytes[1], 100 * MB);
  LT_EQ(p.offset[2], 50 * MB / 4); /* offsets follow the bucket order */
  LT_EQ(p.offset[3], 80 * MB / 4);
  loom__bucket_plan_free(&p);

  /* shuffled input order gives the same buckets: largest first */
  size_t numel2[] = {15 * MB / 4, 30 * MB / 4, 100 * MB / 4, 20 * MB / 4, 50 * MB / 4};
  LT_OK(loom__bucket_plan_make(numel2, dt, 5, &cfg, &p));
  LT_EQ(p.nbuckets, 3);
  expect_bucket(&p, 0, (size_t[]){2}, 1);
  expect_bucket(&p, 1, (size_t[]){4, 1, 3}, 3);
  expect_bucket(&p, 2, (size_t[]){0}, 1);
  loom__bucket_plan_free(&p);
}

LT_TEST(plan_edge_cases) {
  loom_bucket_cfg cfg = loom_bucket_cfg_default();
  cfg.policy = LOOM_BUCKET_LARGEST_FIRST;
  cfg.bucket_bytes = 1000;
  loom__bucket_plan p;
  /* a parameter larger than the limit gets a bucket of its own */
  size_t big[] = {10, 5000, 20};
  loom_dtype f32[] = {LOOM_F32, LOOM_F32, LOOM_F32};
  LT_OK(loom__bucket_plan_make(big, f32, 3, &cfg, &p));
  LT_EQ(p.nbuckets, 2);
  expect_bucket(&p, 0, (size_t[]){1}, 1);
  expect_bucket(&p, 1, (size_t[]){2, 0}, 2);
  loom__bucket_plan_free(&p);
  /* everything fits: one bucket */
  size_t small[] = {10, 20, 30};
  cfg.bucket_bytes = 1 << 20;
  LT_OK(loom__bucket_plan_make(small, f32, 3, &cfg, &p));
  LT_EQ(p.nbuckets, 1);
  LT_EQ(p.numel[0], 74); /* 30, 20, 10 at the 64-byte offsets 0, 32, 64 */
  loom__bucket_plan_free(&p);
  /* no parameters: no buckets */
  LT_OK(loom__bucket_plan_make(NULL, NULL, 0, &cfg, &p));
  LT_EQ(p.nbuckets, 0);
  loom__bucket_plan_free(&p);
  /* dtypes never share a bucket */
  size_t mixed[] = {10, 10, 10, 10};
  loom_dtype dts[] = {LOOM_F32, LOOM_BF16, LOOM_F32, LOOM_BF16};
  for (int pol = 0; pol < 2; pol++) {
    cfg.policy = (loom_bucket_policy)pol;
    LT_OK(loom__bucket_plan_make(mixed, dts, 4, &cfg, &p));
    LT_EQ(p.nbuckets, 2);
    for (size_t b = 0; b < p.nbuckets; b++)
      for (size_t k = 0; k < p.count[b]; k++) LT_EQ(dts[p.order[p.first[b] + k]], p.dtype[b]);
    loom__bucket_plan_free(&p);
  }
}

LT_TEST(plan_reverse_order_small_first_bucket) {
  /* parameters a..e in forward order; backward produces e first */
  size_t numel[] = {MB / 8, MB / 8, 10 * MB / 4, 20 * MB / 4, MB / 4};
  loom_dtype dt[] = {LOOM_F32, LOOM_F32, LOOM_F32, LOOM_F32, LOOM_F32};
  loom_bucket_cfg cfg = loom_bucket_cfg_default(); /* 1 MiB first, then 25 MiB */
  LT_EQ(cfg.policy, LOOM_BUCKET_REVERSE_ORDER);
  LT_EQ(cfg.first_bucket_bytes, MB);
  LT_EQ(cfg.bucket_bytes, 25 * MB);
  loom__bucket_plan p;
  LT_OK(loom__bucket_plan_make(numel, dt, 5, &cfg, &p));
  LT_EQ(p.nbuckets, 3);
  expect_bucket(&p, 0, (size_t[]){4}, 1);    /* e: 1 MiB fills the first bucket */
  expect_bucket(&p, 1, (size_t[]){3, 2}, 2); /* d 20 MiB + c 10 MiB reach 25 MiB */
  expect_bucket(&p, 2, (size_t[]){1, 0}, 2); /* what is left */
  loom__bucket_plan_free(&p);
}

LT_TEST(bucket_cfg_validation) {
  loom_bucket_cfg cfg = loom_bucket_cfg_default();
  LT_OK(loom_bucket_cfg_validate(&cfg));
  cfg.bucket_bytes = 0;
  LT_ERR(loom_bucket_cfg_validate(&cfg), LOOM_EINVAL, "bucket_bytes must be > 0");
  cfg = loom_bucket_cfg_default();
  cfg.first_bucket_bytes = 0;
  LT_ERR(loom_bucket_cfg_validate(&cfg), LOOM_EINVAL, "first_bucket_bytes");
  cfg.policy = (loom_bucket_policy)9;
  cfg.first_bucket_bytes = 1;
  LT_ERR(loom_bucket_cfg_validate(&cfg), LOOM_EINVAL, "policy 9");
  loom_ddp_cfg dcfg = loom_ddp_cfg_default();
  LT_OK(loom_ddp_cfg_validate(&dcfg));
  dcfg.wire_dtype_set = true;
  dcfg.wire_dtype = LOOM_I32;
  LT_ERR(loom_ddp_cfg_validate(&dcfg), LOOM_EINVAL, "wire_dtype");
}

static size_t meta_bytes(void) { /* the plan's arrays are bookkeeping: the meta pool */
  loom_pool_stats s;
  loom_mem_stats(LOOM_POOL_META, &s);
  return s.current_bytes;
}

LT_TEST(plan_bad_dtype_and_out_of_memory) {
  loom_bucket_cfg cfg = loom_bucket_cfg_default();
  size_t numel[] = {10, 20, 30};
  loom_dtype bad[] = {LOOM_F32, (loom_dtype)77, LOOM_F32};
  loom__bucket_plan p;
  LT_ERR(loom__bucket_plan_make(numel, bad, 3, &cfg, &p), LOOM_EDTYPE, "gradient 1 has an invalid dtype");
  LT_EQ(p.nbuckets, 0);
  /* each allocation of the plan failing in turn: LOOM_ENOMEM and nothing left allocated */
  loom_dtype ok[] = {LOOM_F32, LOOM_BF16, LOOM_F32};
  size_t before = meta_bytes();
  int failures = 0;
  for (uint64_t k = 1; k < 40; k++) {
    loom_alloc_fail_nth(k);
    int rc = loom__bucket_plan_make(numel, ok, 3, &cfg, &p);
    loom_alloc_fail_nth(0);
    if (rc == LOOM_OK) {
      LT_EQ(p.nbuckets, 2);
      loom__bucket_plan_free(&p);
      break;
    }
    failures++;
    LT_EQ(rc, LOOM_ENOMEM);
    LT_EQ(meta_bytes(), before);
  }
  LT_TRUE(failures >= 10); /* every one of the plan's allocations was made to fail once */
  LT_EQ(meta_bytes(), before);
}
