/* test_ddp_pools.c: what DDP costs in each memory pool. DDP offloads nothing, so its steps leave
 * the host pool (the offload figure, loom/alloc.h) at exactly 0, current and peak, on every
 * rank's account and process-wide; its own bookkeeping (the bucket plan, the manager, names,
 * work handles) is counted in the meta pool, and every pool is back where it started once the
 * wrapper is freed. */
#include "lt.h"
#include "ddp_model.h"
#include "loom/ddp.h"

enum { NRANKS = 2, STEPS = 3, B = 4 };

/* Each rank's pools before DDP, after its steps (wrapper alive), and after it is freed. */
typedef struct ddp_pools {
  lt_pools before[NRANKS], live[NRANKS], after[NRANKS];
} ddp_pools;

static int rank_fn(loom_pg *pg, void *arg) {
  ddp_pools *r = arg;
  int rank = loom_pg_rank(pg);
  loom_mem_account_reset_peak(loom_mem_account(), LOOM_POOL_HOST);
  r->before[rank] = lt_pools_now();
  model m;
  int rc = model_init(&m, 7);
  loom_ddp_cfg cfg = loom_ddp_cfg_default();
  cfg.buckets.first_bucket_bytes = 16; /* several buckets, so several work handles */
  cfg.buckets.bucket_bytes = 700;
  loom_ddp *d = NULL;
  if (!rc) rc = loom_ddp_create(pg, m.p, model_names, MODEL_NPARAMS, &cfg, &d);
  for (int s = 0; s < STEPS && !rc; s++) {
    rc = model_backward(&m, ((int64_t)s * NRANKS + rank) * B, B, 1.0f);
    if (!rc) rc = loom_ddp_finish(d);
    if (!rc) model_sgd(&m, 0.1f);
  }
  r->live[rank] = lt_pools_now();
  loom_ddp_free(d);
  model_free(&m);
  r->after[rank] = lt_pools_now();
  return rc;
}

LT_TEST(ddp_steps_leave_the_host_pool_at_zero) {
  loom_pool_stats all = {0};
  LT_OK(loom_mem_stats(LOOM_POOL_HOST, &all));
  LT_EQ(all.current_bytes, 0); /* nothing in this process offloads */
  loom_mem_reset_peak(LOOM_POOL_HOST);
  ddp_pools r = {0};
  LT_OK(loom_threads_run(NRANKS, NULL, rank_fn, &r));
  for (int k = 0; k < NRANKS; k++) {
    LT_EQ(r.live[k].pool[LOOM_POOL_HOST].current_bytes, 0);
    LT_EQ(r.live[k].pool[LOOM_POOL_HOST].peak_bytes, 0);
    /* the wrapper's bookkeeping is counted, in meta, and given back */
    LT_TRUE(r.live[k].pool[LOOM_POOL_META].current_bytes >
            r.before[k].pool[LOOM_POOL_META].current_bytes);
    for (int p = 0; p < LOOM_POOL_COUNT; p++)
      LT_EQ(r.after[k].pool[p].current_bytes, r.before[k].pool[p].current_bytes);
  }
  LT_OK(loom_mem_stats(LOOM_POOL_HOST, &all));
  LT_EQ(all.current_bytes, 0);
  LT_EQ(all.peak_bytes, 0);
}
