/* test_fsdp.c: FSDP on the threads backend against one process. N ranks (2, 3, 4: 3 divides
 * no unit, so padding is exercised) with B rows each end with the same weights as one process
 * with N x B rows, after several AdamW steps, in f32 and under bf16 and f16 mixed precision;
 * and as DDP with the same ranks. Also every wrap policy, resharding and prefetch options, no_sync
 * accumulation, the global overflow decision, cast-then-gather, and the full state dict; and
 * gathered units shared by the ranks against one buffer per rank, bit for bit (each rank's
 * account counting its share).
 *
 * Tolerance. The ranks' averaged gradients and the single process's mean over all rows differ
 * only in f32 summation order (relative ~1e-7). AdamW divides by sqrt(v) + eps, so a gradient
 * element near zero could turn such a difference into a different step; eps = 1e-4 bounds that
 * by lr x 1e-7 x |g| / eps. After 4 steps at lr 1e-2 the weights agree to 1e-5 in f32 (an
 * averaging error, a factor N, moves them by ~1e-2). Under bf16/f16 both sides round the same
 * f32 weights to the same low-precision values (the cast is elementwise: cast-then-gather is
 * gather-then-cast, tested bit for bit), and gradients stay f32; a summation-order difference
 * can flip the rounding of one weight in a later step (one ulp: 2^-8 relative for bf16), so the
 * bound there is 2e-3. */
#include "lt.h"
#include "fsdp_model.h"
#include "loom/ddp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { STEPS = 4, B = 6, MAXR = 4 };

typedef struct run {
  int nranks;
  loom_fsdp_cfg cfg;
  loom_autocast_mode amp;
  bool accumulate;  /* two micro-batches per step, the first with sync off */
  bool use_ddp;     /* DDP instead, same ranks */
  float *params;    /* rank 0's full state at the end */
  loom_fsdp_stats stats[MAXR];
  size_t units;
} run;

static float step_scale(const run *r, loom_fsdp *f) {
  loom_fsdp_mp *mp = f ? loom_fsdp_mp_manager(f) : NULL;
  (void)r;
  return mp ? loom_fsdp_mp_current_loss_scale(mp) : 1.0f;
}

static int fsdp_rank(loom_pg *pg, void *arg) {
  run *r = arg;
  int rank = loom_pg_rank(pg), n = loom_pg_size(pg);
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  int rc = fm_create(1 + (uint64_t)rank, &m); /* different on each rank: rank 0's wins */
  if (!rc) rc = loom_fsdp_create(pg, m, &r->cfg, &f);
  const loom_param_seg *segs = NULL;
  size_t nseg = 0;
  loom_adam_cfg ac = fm_adam();
  if (!rc) rc = loom_fsdp_segments(f, &segs, &nseg);
  if (!rc) rc = loom_optim_create_adamw(segs, nseg, &ac, &opt);
  for (int s = 0; s < STEPS && !rc; s++) {
    int micro = r->accumulate ? 2 : 1;
    for (int k = 0; k < micro && !rc; k++) {
      rc = loom_fsdp_set_sync(f, k == micro - 1);
      int64_t row0 = ((int64_t)s * micro + k) * n * B + (int64_t)rank * B;
      if (!rc) rc = fm_backward(m, row0, B, r->amp, step_scale(r, f), NULL);
    }
    bool overflow = false;
    if (!rc) rc = loom_fsdp_finish(f);
    if (!rc) rc = loom_fsdp_check_overflow(f, &overflow);
    if (!rc && !overflow) rc = loom_optim_step(opt);
  }
  loom_named_tensor *st = NULL;
  size_t nst = 0;
  if (!rc) rc = loom_fsdp_full_state(f, &st, &nst);
  if (!rc && rank == 0) fm_flatten_state(st, nst, r->params);
  if (!rc) rc = loom_fsdp_stats_get(f, &r->stats[rank]);
  if (!rc && rank == 0) r->units = loom_fsdp_unit_count(f);
  loom_fsdp_state_free(st, nst);
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

static int ddp_rank(loom_pg *pg, void *arg) {
  run *r = arg;
  return fm_ddp_run(pg, 1 + (uint64_t)loom_pg_rank(pg), STEPS, B, r->amp, r->params);
}

/* One process, N x B rows a step (micro backwards of N x B rows each, summed), parameters from
 * rank 0's seed. */
static void reference(int n, loom_autocast_mode amp, float scale, int micro, float *out) {
  loom_module *m = NULL;
  LT_OK(fm_create(1, &m));
  loom_tensor *values = NULL, *grads = NULL;
  size_t numel = 0;
  LT_OK(loom_module_arena(m, LOOM_F32, &values, &grads, &numel));
  loom_param_seg seg = {"all", loom_tensor_data(values), loom_tensor_data(grads), numel, 0};
  loom_optim *opt = NULL;
  loom_adam_cfg ac = fm_adam();
  LT_OK(loom_optim_create_adamw(&seg, 1, &ac, &opt));
  for (int s = 0; s < STEPS; s++) {
    LT_OK(loom_module_zero_grad(m));
    for (int k = 0; k < micro; k++)
      LT_OK(fm_backward(m, ((int64_t)s * micro + k) * n * B, (int64_t)n * B, amp, scale, NULL));
    loom_grad_buf gb = {loom_tensor_data(grads), numel, LOOM_F32};
    if (scale != 1.0f) LT_OK(loom_grad_scale(&gb, 1, 1.0f / scale));
    LT_OK(loom_optim_step(opt));
  }
  fm_flatten_module(m, out);
  loom_optim_free(opt);
  loom_module_free(m);
}

static size_t model_numel(void) {
  return (size_t)FM_IN * FM_H1 + FM_H1 + (size_t)FM_H1 * FM_H2 + FM_H2 + (size_t)FM_H2 * FM_OUT + FM_OUT;
}

/* Run r; compare rank 0's final weights with the reference; returns the difference. */
static double check_run(run *r, const float *ref, float tol) {
  size_t np = model_numel();
  r->params = calloc(np, sizeof(float));
  LT_OK(loom_threads_run(r->nranks, NULL, r->use_ddp ? ddp_rank : fsdp_rank, r));
  double d = fm_max_diff(r->params, ref, np);
  if (!(d <= tol))
    lt_fail_at(__FILE__, __LINE__, "%d ranks: %g from the reference (tol %g)", r->nranks, d, tol);
  free(r->params);
  r->params = NULL;
  return d;
}

static float *ref_for(int n, loom_autocast_mode amp, float scale) {
  float *ref = calloc(model_numel(), sizeof(float));
  reference(n, amp, scale, 1, ref);
  return ref;
}

LT_TEST(fsdp_matches_single_process_and_ddp_2_3_4_ranks_f32) {
  for (int n = 2; n <= 4; n++) {
    float *ref = ref_for(n, LOOM_AUTOCAST_OFF, 1.0f);
    run r = {.nranks = n};
    r.cfg = loom_fsdp_cfg_default();
    check_run(&r, ref, 1e-5f);
    LT_EQ(r.units, 3); /* one per Linear of the MLP's Sequential */
    LT_EQ(r.stats[0].steps, STEPS);
    LT_EQ(r.stats[0].reduce_scatters, 3 * STEPS);
    run d = {.nranks = n, .use_ddp = true};
    check_run(&d, ref, 1e-5f);
    free(ref);
  }
}

LT_TEST(fsdp_mixed_precision_bf16_and_f16_match_autocast) {
  for (int n = 2; n <= 4; n += 2) {
    run r = {.nranks = n, .amp = LOOM_AUTOCAST_BF16};
    r.cfg = loom_fsdp_cfg_default();
    r.cfg.mp = loom_fsdp_mp_cfg_for(LOOM_BF16);
    float *ref = ref_for(n, LOOM_AUTOCAST_BF16, 1.0f);
    check_run(&r, ref, 2e-3f);
    free(ref);
    /* f16 with the specification's loss scale (2, a power of two: exact on both sides) */
    run h = {.nranks = n, .amp = LOOM_AUTOCAST_F16};
    h.cfg = loom_fsdp_cfg_default();
    h.cfg.mp = loom_fsdp_mp_cfg_for(LOOM_F16);
    ref = ref_for(n, LOOM_AUTOCAST_F16, 2.0f);
    check_run(&h, ref, 2e-3f);
    free(ref);
  }
}

LT_TEST(fsdp_wrap_policies_reshard_and_prefetch_options_all_match) {
  float *ref = ref_for(3, LOOM_AUTOCAST_OFF, 1.0f);
  static const char *const list[] = {"layers.2"}; /* the rest goes to the root unit */
  for (int variant = 0; variant < 5; variant++) {
    run r = {.nranks = 3};
    r.cfg = loom_fsdp_cfg_default();
    size_t want_units = 3;
    if (variant == 0) { /* size policy: every Linear reaches 100 elements */
      r.cfg.wrap = LOOM_FSDP_WRAP_SIZE;
      r.cfg.min_unit_numel = 100;
    } else if (variant == 1) { /* size policy too large for any module: one root unit */
      r.cfg.wrap = LOOM_FSDP_WRAP_SIZE;
      want_units = 1;
    } else if (variant == 2) {
      r.cfg.wrap = LOOM_FSDP_WRAP_LIST;
      r.cfg.unit_names = list;
      r.cfg.n_unit_names = 1;
      want_units = 2;
    } else if (variant == 3) { /* ZeRO-2: kept gathered from forward to backward */
      r.cfg.reshard_after_forward = false;
    } else { /* no prefetch at all, and the deepest */
      r.cfg.forward_prefetch = 0;
      r.cfg.backward_prefetch = 8;
    }
    check_run(&r, ref, 1e-5f);
    LT_EQ(r.units, want_units);
  }
  free(ref);
}

/* Ranks of the threads backend share each gathered unit (fsdp_share.c): every rank's
 * parameters view one buffer while gathered, and training gives the same bits as each rank
 * gathering into its own buffer (LOOM_FSDP_SHARE_GATHERS=0), at 2 and 3 ranks (3 pads every
 * unit), with and without prefetch, with the root unit kept gathered, and with gradient
 * accumulation. */
typedef struct view_job {
  const void *data[MAXR]; /* each rank's first parameter's data while unit 0 is gathered */
  int64_t counted[MAXR];  /* bytes the gather added to the rank's compute-pool account */
  size_t shard, padded;   /* unit 0's elements per rank and in all */
} view_job;

static int view_rank(loom_pg *pg, void *arg) {
  view_job *j = arg;
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_fsdp_cfg cfg = loom_fsdp_cfg_default();
  int rc = fm_create(1, &m);
  if (!rc) rc = loom_fsdp_create(pg, m, &cfg, &f);
  loom_pool_stats a, b;
  loom_fsdp_unit_info ui;
  if (!rc) rc = loom_fsdp_unit_info_get(f, 0, &ui);
  if (!rc) rc = loom_mem_account_stats(loom_mem_account(), LOOM_POOL_COMPUTE, &a);
  if (!rc) rc = loom_fsdp_gather_unit(f, 0, LOOM_F32);
  if (!rc) rc = loom_mem_account_stats(loom_mem_account(), LOOM_POOL_COMPUTE, &b);
  if (!rc) {
    j->counted[loom_pg_rank(pg)] = (int64_t)b.current_bytes - (int64_t)a.current_bytes;
    if (loom_pg_rank(pg) == 0) { /* the same on every rank */
      j->shard = ui.shard_numel;
      j->padded = ui.padded_numel;
    }
  }
  loom_param p;
  if (!rc) rc = loom_module_param(m, 0, &p);
  if (!rc) j->data[loom_pg_rank(pg)] = loom_tensor_data(p.value);
  if (!rc) rc = loom_pg_barrier(pg, NULL); /* every rank looked before any reshards */
  if (!rc) rc = loom_fsdp_reshard_unit(f, 0);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

static void run_keep(run *r) {
  r->params = calloc(model_numel(), sizeof(float));
  LT_OK(loom_threads_run(r->nranks, NULL, fsdp_rank, r));
}

LT_TEST(fsdp_ranks_in_one_process_share_gathered_units_bit_identical) {
  for (int n = 2; n <= 3; n++) {
    for (int share = 0; share < 2; share++) {
      if (share) unsetenv("LOOM_FSDP_SHARE_GATHERS");
      else setenv("LOOM_FSDP_SHARE_GATHERS", "0", 1);
      view_job j;
      memset(&j, 0, sizeof j);
      LT_OK(loom_threads_run(n, NULL, view_rank, &j));
      for (int r = 1; r < n; r++) {
        LT_TRUE(j.data[r] != NULL);
        LT_EQ(j.data[r] == j.data[0], share == 1);
      }
      /* shared: the ranks' shards are slices of the unit's one buffer, so the gather makes
       * nothing and each rank's account counts only its shard, as before the gather */
      for (int r = 0; r < n; r++)
        if (share) LT_EQ(j.counted[r], 0);
        else LT_TRUE(j.counted[r] >= (int64_t)(j.padded * sizeof(float)));
    }
    for (int variant = 0; variant < 4; variant++) {
      run own = {.nranks = n}, shared = {.nranks = n};
      own.cfg = loom_fsdp_cfg_default();
      if (variant == 1) own.cfg.forward_prefetch = own.cfg.backward_prefetch = 0;
      if (variant == 2) own.cfg.reshard_after_forward = false;
      if (variant == 3) own.accumulate = true;
      shared.cfg = own.cfg;
      shared.accumulate = own.accumulate;
      setenv("LOOM_FSDP_SHARE_GATHERS", "0", 1);
      run_keep(&own);
      unsetenv("LOOM_FSDP_SHARE_GATHERS");
      run_keep(&shared);
      LT_TRUE(memcmp(own.params, shared.params, model_numel() * sizeof(float)) == 0);
      LT_EQ(own.stats[0].gathers, shared.stats[0].gathers);
      free(own.params);
      free(shared.params);
    }
  }
}

LT_TEST(fsdp_no_sync_accumulation_equals_one_large_batch) {
  /* two micro-batches of B rows per rank = one step of 2 x N x B rows */
  int n = 2;
  /* the ranks add two micro-batch means, then average over ranks: the sum of the two global
   * micro-batch means */
  float *ref = calloc(model_numel(), sizeof(float));
  reference(n, LOOM_AUTOCAST_OFF, 1.0f, 2, ref);
  run r = {.nranks = n, .accumulate = true};
  r.cfg = loom_fsdp_cfg_default();
  check_run(&r, ref, 1e-5f);
  /* with sync off nothing is sent: one reduce-scatter per unit per synchronised step */
  LT_EQ(r.stats[0].reduce_scatters, 3 * STEPS);
  free(ref);
}
