/* test_fsdp_init.c: sharded construction (loom_fsdp_create over a model built with deferred
 * initialisation, loom/nn.h). On 2 and 3 ranks (threads), the shards FSDP makes from the
 * initialisers, gathered, are bit for bit the model built whole in one process, and the
 * replicas DDP starts from are too (the MLP under two wrap policies, and a GPT); the compute
 * pool of each rank, from its own counters, never holds more than its shards while building,
 * and peaks higher in a training step than while building (where building the model whole
 * first peaks at twice the model); ranks that build differently are refused on every rank. */
#include "lt.h"
#include "fsdp_model.h"

#include <stdlib.h>

enum { MAXR = 3 };

typedef struct init_run {
  int nranks;
  bool gpt, ddp, size_policy;
  size_t numel;
  float *got[MAXR]; /* rank 0's full state (FSDP) or each rank's replica (DDP) */
} init_run;

static const loom_gpt_cfg gpt_cfg = {.vocab = 40, .context = 8, .layers = 3, .heads = 2, .dim = 16};

static int build(bool gpt, bool deferred, uint64_t seed, loom_module **m) {
  bool was = loom_nn_set_deferred_init(deferred);
  const int64_t sizes[4] = {FM_IN, 300, 200, FM_OUT};
  int rc = gpt ? loom_nn_gpt_create(&gpt_cfg, seed, m)
               : loom_nn_mlp_create(sizes, 4, LOOM_ACT_RELU, LOOM_F32, seed, m);
  loom_nn_set_deferred_init(was);
  return rc;
}

static int init_rank(loom_pg *pg, void *arg) {
  init_run *r = arg;
  int rank = loom_pg_rank(pg);
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_ddp *d = NULL;
  int rc = build(r->gpt, !r->ddp, 21, &m);
  if (!rc && !r->ddp && !loom_module_deferred(m)) rc = LOOM_EINVAL;
  loom_fsdp_cfg cfg = loom_fsdp_cfg_default();
  if (r->size_policy) cfg.wrap = LOOM_FSDP_WRAP_SIZE, cfg.min_unit_numel = 5000;
  if (!rc && r->ddp) {
    loom_optim *opt = NULL;
    rc = fm_ddp_wrap(pg, m, &d, &opt);
    if (!rc) fm_flatten_module(m, r->got[rank]);
    loom_optim_free(opt);
  } else if (!rc) {
    rc = loom_fsdp_create(pg, m, &cfg, &f);
    if (!rc && loom_module_deferred(m)) rc = LOOM_EINVAL; /* wrapped: no longer deferred */
    if (!rc) rc = fm_full_state_flat(f, r->got[0]);
  }
  loom_fsdp_free(f);
  loom_ddp_free(d);
  loom_module_free(m);
  return rc;
}

static void check_same_start(bool gpt) {
  loom_module *ref = NULL;
  LT_OK(build(gpt, false, 21, &ref));
  size_t numel = loom_module_numel(ref);
  float *want = malloc(numel * sizeof(float));
  LT_TRUE(want != NULL);
  fm_flatten_module(ref, want);
  loom_module_free(ref);
  for (int n = 2; n <= 3; n++)
    for (int mode = 0; mode < 3; mode++) { /* FSDP, FSDP with the size policy, DDP */
      init_run r = {.nranks = n, .gpt = gpt, .ddp = mode == 2, .size_policy = mode == 1,
                    .numel = numel};
      for (int k = 0; k < n; k++) r.got[k] = calloc(numel, sizeof(float));
      int rc = loom_threads_run(n, NULL, init_rank, &r);
      for (int k = 0; k < (r.ddp ? n : 1) && !rc; k++)
        if (memcmp(r.got[k], want, numel * sizeof(float)))
          lt_fail_at(__FILE__, __LINE__, "%s, %d ranks, %s: rank %d starts from other values",
                     gpt ? "gpt" : "mlp", n, mode == 2 ? "ddp" : mode ? "fsdp size" : "fsdp", k);
      for (int k = 0; k < n; k++) free(r.got[k]);
      LT_OK(rc);
    }
  free(want);
}

LT_TEST(fsdp_sharded_construction_starts_from_the_one_process_bits_mlp) { check_same_start(false); }
LT_TEST(fsdp_sharded_construction_starts_from_the_one_process_bits_gpt) { check_same_start(true); }

/* ---- memory: each rank's own counters ------------------------------------------------------- */

typedef struct peak_run {
  bool deferred;
  size_t numel;
  size_t shards[MAXR];     /* this rank's shard elements, all units */
  size_t build[MAXR];      /* compute peak above the start while building and wrapping */
  size_t with_optim[MAXR]; /* ... and making AdamW (its state is made at its first step) */
  size_t step[MAXR];       /* compute peak above the start in training steps */
} peak_run;

static size_t peak_above(size_t base) {
  loom_pool_stats ps = {0};
  loom_mem_account_stats(loom_mem_account(), LOOM_POOL_COMPUTE, &ps);
  return ps.peak_bytes > base ? ps.peak_bytes - base : 0;
}

static size_t now_bytes(void) {
  loom_pool_stats ps = {0};
  loom_mem_account_stats(loom_mem_account(), LOOM_POOL_COMPUTE, &ps);
  loom_mem_account_reset_peak(loom_mem_account(), LOOM_POOL_COMPUTE);
  return ps.current_bytes;
}

static int peak_rank(loom_pg *pg, void *arg) {
  peak_run *r = arg;
  int rank = loom_pg_rank(pg);
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  size_t base = now_bytes();
  int rc = build(false, r->deferred, 4, &m);
  if (!rc) rc = loom_fsdp_create(pg, m, NULL, &f);
  r->build[rank] = peak_above(base);
  const loom_param_seg *segs = NULL;
  size_t nseg = 0;
  loom_adam_cfg ac = fm_adam();
  if (!rc) rc = loom_fsdp_segments(f, &segs, &nseg);
  if (!rc) rc = loom_optim_create_adamw(segs, nseg, &ac, &opt);
  r->with_optim[rank] = peak_above(base);
  for (size_t u = 0; !rc && u < nseg; u++) r->shards[rank] += segs[u].n;
  (void)now_bytes();
  for (int s = 0; s < 2 && !rc; s++) {
    rc = fm_backward(m, (int64_t)(s * 3 + rank) * 16, 16, LOOM_AUTOCAST_OFF, 1.0f, NULL);
    if (!rc) rc = loom_fsdp_finish(f);
    if (!rc) rc = loom_optim_step(opt);
  }
  r->step[rank] = peak_above(base);
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

LT_TEST(fsdp_sharded_construction_build_peak_is_the_shards_and_below_the_step_peak) {
  loom_module *ref = NULL;
  LT_OK(build(false, false, 4, &ref));
  size_t model = loom_module_numel(ref) * sizeof(float);
  loom_module_free(ref);
  for (int deferred = 1; deferred >= 0; deferred--) {
    peak_run r = {.deferred = deferred};
    LT_OK(loom_threads_run(3, NULL, peak_rank, &r));
    for (int k = 0; k < 3; k++) {
      size_t shards = r.shards[k] * sizeof(float); /* parameter + gradient shards: 2x */
      fprintf(stderr, "  %s build, rank %d: build peak %zu B (model %zu B, shards %zu B), with "
              "AdamW %zu B, step peak %zu B\n", deferred ? "deferred" : "whole", k, r.build[k],
              model, 2 * shards, r.with_optim[k], r.step[k]);
      if (deferred) {
        LT_TRUE(r.build[k] <= 2 * shards + 64 * 1024); /* the shards and headers, nothing more */
        LT_TRUE(r.build[k] < model);                    /* no rank ever held the whole model */
        LT_TRUE(r.with_optim[k] <= r.step[k]);
      } else {
        LT_TRUE(r.build[k] >= 2 * model); /* the old way: arena and gradient arena, whole */
      }
    }
  }
}

/* ---- ranks that build differently ------------------------------------------------------------ */

typedef struct odd_run {
  bool rank1_whole;    /* rank 1 builds with values, rank 0 deferred */
  uint64_t rank1_seed; /* rank 1's seed (rank 0: 4) */
  int rc[2];
  char msg[2][256];
} odd_run;

static int odd_rank(loom_pg *pg, void *arg) {
  odd_run *r = arg;
  int rank = loom_pg_rank(pg);
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  int rc = build(false, !(rank == 1 && r->rank1_whole), rank ? r->rank1_seed : 4, &m);
  if (!rc) {
    r->rc[rank] = loom_fsdp_create(pg, m, NULL, &f);
    snprintf(r->msg[rank], sizeof r->msg[rank], "%s", loom_last_error());
  }
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

LT_TEST(fsdp_sharded_construction_refuses_ranks_that_build_differently) {
  odd_run a = {.rank1_whole = true, .rank1_seed = 4}, b = {.rank1_seed = 5};
  LT_OK(loom_threads_run(2, NULL, odd_rank, &a));
  LT_OK(loom_threads_run(2, NULL, odd_rank, &b));
  for (int k = 0; k < 2; k++) {
    LT_EQ(a.rc[k], LOOM_EMISUSE);
    LT_TRUE(strstr(a.msg[k], "deferred") != NULL);
    LT_EQ(b.rc[k], LOOM_EMISUSE);
    LT_TRUE(strstr(b.msg[k], "same seed") != NULL);
  }
}

/* DDP takes values, not recipes: a deferred model's parameters are refused, naming the cause;
 * materialised, the same model is wrapped. */
static int ddp_deferred_rank(loom_pg *pg, void *arg) {
  int *seen = arg;
  loom_module *m = NULL;
  loom_ddp *d = NULL;
  loom_optim *opt = NULL;
  int rc = build(false, true, 4, &m);
  if (!rc) {
    seen[loom_pg_rank(pg)] = fm_ddp_wrap(pg, m, &d, &opt);
    if (seen[loom_pg_rank(pg)] == LOOM_EMISUSE && !strstr(loom_last_error(), "holds no data"))
      seen[loom_pg_rank(pg)] = LOOM_EINVAL;
  }
  if (!rc) rc = loom_module_materialize(m);
  if (!rc) rc = fm_ddp_wrap(pg, m, &d, &opt);
  loom_optim_free(opt);
  loom_ddp_free(d);
  loom_module_free(m);
  return rc;
}

LT_TEST(fsdp_sharded_construction_ddp_refuses_a_deferred_model) {
  int seen[2] = {0, 0};
  LT_OK(loom_threads_run(2, NULL, ddp_deferred_rank, seen));
  LT_EQ(seen[0], LOOM_EMISUSE);
  LT_EQ(seen[1], LOOM_EMISUSE);
}
