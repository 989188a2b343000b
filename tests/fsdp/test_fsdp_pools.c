/* test_fsdp_pools.c: the host pool is the offload figure (loom/alloc.h). FSDP steps without
 * offload leave it at exactly 0 (current and peak, on each rank's account and process-wide),
 * with the wrapper's bookkeeping counted in the meta pool instead; with the host tier and
 * everything offloaded, a rank's host pool holds exactly the bytes its units' shard sizes say
 * are offloaded (parameter, gradient and AdamW's two state shards of every unit: the tier's
 * offload_bytes), and peaks at most one unit's AdamW state above that (the state the step makes
 * in the host pool, state_pool LOOM_POOL_HOST, before it goes to the tier). Every pool is back
 * where it started once the wrapper is freed. */
#include "lt.h"
#include "fsdp_model.h"

enum { NRANKS = 2, STEPS = 3, B = 6 };

typedef struct fsdp_pools {
  bool offload;
  lt_pools before[NRANKS], live[NRANKS], after[NRANKS]; /* around the wrapper's life */
  size_t offloaded[NRANKS];     /* what the units' shard sizes say is in the tier */
  size_t largest_state[NRANKS]; /* AdamW's state of the largest unit's shard */
  loom_fsdp_stats stats[NRANKS];
} fsdp_pools;

static int rank_fn(loom_pg *pg, void *arg) {
  fsdp_pools *r = arg;
  int rank = loom_pg_rank(pg);
  loom_mem_account_reset_peak(loom_mem_account(), LOOM_POOL_HOST);
  r->before[rank] = lt_pools_now();
  loom_fsdp_cfg cfg = loom_fsdp_cfg_default();
  if (r->offload) {
    cfg.offload = loom_fsdp_offload_cfg_default(); /* everything, host tier */
    cfg.offload.chunk_bytes = 64;
  }
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  /* with offload, the state in the host pool (fsdp.h's advice) */
  int rc = fm_setup(pg, 3, &cfg, r->offload ? LOOM_POOL_HOST : LOOM_POOL_COMPUTE, &m, &f, &opt);
  for (int s = 0; s < STEPS && !rc; s++) {
    rc = fm_backward(m, ((int64_t)s * NRANKS + rank) * B, B, LOOM_AUTOCAST_OFF, 1.0f, NULL);
    if (!rc) rc = loom_fsdp_finish(f);
    if (!rc) rc = loom_fsdp_optim_step(f, opt, 1.0f);
  }
  if (!rc) rc = loom_fsdp_prefetch_wait(f);
  for (size_t u = 0; !rc && u < loom_fsdp_unit_count(f); u++) {
    loom_fsdp_unit_info ui;
    rc = loom_fsdp_unit_info_get(f, u, &ui);
    size_t bytes = ui.shard_numel * sizeof(float);
    r->offloaded[rank] += 4 * bytes; /* parameters, gradients, exp_avg, exp_avg_sq */
    if (2 * bytes > r->largest_state[rank]) r->largest_state[rank] = 2 * bytes;
  }
  if (!rc) rc = loom_fsdp_stats_get(f, &r->stats[rank]);
  r->live[rank] = lt_pools_now();
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  r->after[rank] = lt_pools_now();
  return rc;
}

/* The bookkeeping was in meta while the wrapper lived; every pool is back where it started. */
static void check_pools_back(const fsdp_pools *r) {
  for (int k = 0; k < NRANKS; k++) {
    LT_TRUE(r->live[k].pool[LOOM_POOL_META].current_bytes >
            r->before[k].pool[LOOM_POOL_META].current_bytes);
    for (int p = 0; p < LOOM_POOL_COUNT; p++)
      LT_EQ(r->after[k].pool[p].current_bytes, r->before[k].pool[p].current_bytes);
  }
}

LT_TEST(fsdp_steps_without_offload_leave_the_host_pool_at_zero) {
  loom_pool_stats all = {0};
  LT_OK(loom_mem_stats(LOOM_POOL_HOST, &all));
  LT_EQ(all.current_bytes, 0); /* no earlier test left offloaded bytes behind */
  loom_mem_reset_peak(LOOM_POOL_HOST);
  fsdp_pools r = {.offload = false};
  LT_OK(loom_threads_run(NRANKS, NULL, rank_fn, &r));
  for (int k = 0; k < NRANKS; k++) {
    LT_EQ(r.live[k].pool[LOOM_POOL_HOST].current_bytes, 0);
    LT_EQ(r.live[k].pool[LOOM_POOL_HOST].peak_bytes, 0);
    LT_EQ(r.stats[k].offload_bytes, 0);
  }
  check_pools_back(&r);
  LT_OK(loom_mem_stats(LOOM_POOL_HOST, &all));
  LT_EQ(all.current_bytes, 0);
  LT_EQ(all.peak_bytes, 0);
}

LT_TEST(fsdp_host_offload_fills_the_host_pool_with_exactly_the_offloaded_bytes) {
  fsdp_pools r = {.offload = true};
  LT_OK(loom_threads_run(NRANKS, NULL, rank_fn, &r));
  for (int k = 0; k < NRANKS; k++) {
    const loom_pool_stats *host = &r.live[k].pool[LOOM_POOL_HOST];
    LT_TRUE(r.offloaded[k] > 0);
    LT_EQ(r.stats[k].offload_bytes, r.offloaded[k]);
    LT_EQ(host->current_bytes, r.offloaded[k]);
    LT_TRUE(host->peak_bytes >= r.offloaded[k]);
    LT_TRUE(host->peak_bytes <= r.offloaded[k] + r.largest_state[k]);
  }
  check_pools_back(&r);
}
