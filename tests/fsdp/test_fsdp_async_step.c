/* test_fsdp_async_step.c: the disk tier's optimizer step behind the next forward
 * (cfg.offload.async_step, opt-in; src/fsdp/fsdp_async.c). loom_fsdp_optim_step decides the step and
 * returns; its chunked pass runs on a thread of its own, each gather of the next forward
 * waiting for its own unit only. The runs here train 2 ranks for several steps three ways, no
 * offload, the disk tier with the pass behind the call (the default) and within it, and must
 * agree bit for bit: the losses of every step, the final weights, the step count, a unit
 * gathered right after the last step (its stepped values, read while later units may still be
 * stepping) and a sharded checkpoint saved right after it (the stepped weights and state).
 * In f32 with clipping and a new learning rate set right after every step (the pending pass
 * must keep the step's own), with prefetch 0 too, in f16 with dynamic loss scaling, clipping
 * and a step the overflow check skips, and in bf16 with the tier's low-precision parameter
 * copy. Also: the optimizer freed right after the call (the pass has its own copy of the
 * step's scalars), and the faults: test_fsdp_offload.c's (a file changed behind loom's back,
 * reported once by the next forward or loom_fsdp_optim_wait, nothing changed). */
#include "lt.h"
#include "fsdp_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { STEPS = 4, B = 6, NR = 2, UNIT = 1 };

typedef struct arun {
  loom_fsdp_cfg cfg;
  loom_autocast_mode amp;
  bool clip;
  int poison_step;          /* rank 1's loss scale is infinite at this step (-1: never) */
  bool free_opt;            /* free the optimizer right after the last optim_step */
  const char *ckpt;         /* saved right after the last optim_step */
  double loss[NR][STEPS];
  int skipped[NR];
  int64_t steps_counted;
  float *params;            /* rank 0's final full state */
  float unit[4096];         /* rank 0: unit UNIT gathered right after the last step */
  size_t unit_n;
} arun;

static size_t model_numel(void) {
  return (size_t)(FM_IN * FM_H1 + FM_H1 + FM_H1 * FM_H2 + FM_H2 + FM_H2 * FM_OUT + FM_OUT);
}

static char root[128];

static void rm_root(void) { fm_rm_tree(root); }

static const char *tmp_dir(const char *name) {
  static char bufs[64][256];
  static int next;
  if (!root[0]) {
    snprintf(root, sizeof root, "/tmp/loom-test-astep-%d", (int)getpid());
    mkdir(root, 0700);
    atexit(rm_root);
  }
  char *p = bufs[next++ % 64];
  snprintf(p, 256, "%s/%s", root, name);
  mkdir(p, 0700);
  return p;
}

/* Unit UNIT gathered in f32 (a collective) and its parameters copied out on rank 0. */
static int copy_unit(loom_module *m, loom_fsdp *f, int rank, arun *r) {
  int rc = loom_fsdp_gather_unit(f, UNIT, LOOM_F32);
  loom_fsdp_unit_info ui;
  if (!rc) rc = loom_fsdp_unit_info_get(f, UNIT, &ui);
  size_t at = 0;
  for (size_t k = 0; !rc && rank == 0 && k < ui.nparams; k++) {
    loom_param p;
    rc = loom_module_param(m, ui.first_param + k, &p);
    size_t n = loom_tensor_numel(p.value);
    if (!rc && at + n > sizeof r->unit / sizeof r->unit[0]) rc = LOOM_EINVAL;
    if (!rc) memcpy(r->unit + at, loom_tensor_data(p.value), n * sizeof(float));
    at += n;
  }
  if (rank == 0) r->unit_n = at;
  int rc2 = loom_fsdp_reshard_unit(f, UNIT);
  return rc ? rc : rc2;
}

static int arun_rank(loom_pg *pg, void *arg) {
  arun *r = arg;
  int rank = loom_pg_rank(pg);
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  int rc = fm_setup(pg, 1 + (uint64_t)rank, &r->cfg, LOOM_POOL_HOST, &m, &f, &opt);
  for (int s = 0; s < STEPS && !rc; s++) {
    loom_fsdp_mp *mp = loom_fsdp_mp_manager(f);
    float scale = mp ? loom_fsdp_mp_current_loss_scale(mp) : 1.0f;
    if (s == r->poison_step && rank == 1) scale = INFINITY;
    rc = fm_backward(m, (int64_t)s * NR * B + (int64_t)rank * B, B, r->amp, scale,
                     &r->loss[rank][s]);
    bool overflow = false;
    if (!rc) rc = loom_fsdp_finish(f);
    if (!rc && mp && loom_fsdp_mp_scaler(mp)) rc = loom_fsdp_check_overflow(f, &overflow);
    if (!rc && overflow) r->skipped[rank]++;
    if (!rc && r->clip) rc = loom_fsdp_clip_grad_norm(f, 0.05, false, NULL);
    if (!rc && !overflow) rc = loom_fsdp_optim_step(f, opt, 1.0f);
    /* the next step's learning rate, set while this step's pass may still run */
    if (!rc) rc = loom_optim_set_lr(opt, 1e-3 * (double)(s + 2));
  }
  if (!rc && r->free_opt) { /* the pass goes on with its own copy of the step's scalars */
    if (rank == 0) r->steps_counted = loom_optim_step_count(opt);
    loom_optim_free(opt);
    opt = NULL;
  }
  if (!rc) rc = copy_unit(m, f, rank, r);
  if (!rc && r->ckpt) rc = loom_fsdp_save_sharded(f, r->ckpt, opt, NULL, 0);
  if (!rc) rc = loom_fsdp_optim_wait(f);
  if (!rc) rc = fm_full_state_flat(f, r->params); /* rank 0's */
  if (!rc && opt && rank == 0) r->steps_counted = loom_optim_step_count(opt);
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

static void arun_go(arun *r) {
  r->params = calloc(model_numel(), sizeof(float));
  LT_OK(loom_threads_run(NR, NULL, arun_rank, r));
}

static void expect_same(const arun *base, const arun *o, const char *what) {
  if (memcmp(base->params, o->params, model_numel() * sizeof(float)) != 0)
    lt_fail_at(__FILE__, __LINE__, "%s: final weights differ from the run without offload", what);
  if (memcmp(base->loss, o->loss, sizeof base->loss) != 0)
    lt_fail_at(__FILE__, __LINE__, "%s: losses differ from the run without offload", what);
  if (base->unit_n != o->unit_n || base->unit_n == 0 ||
      memcmp(base->unit, o->unit, base->unit_n * sizeof(float)) != 0)
    lt_fail_at(__FILE__, __LINE__, "%s: unit %d gathered right after the last step differs "
               "(%zu against %zu values; largest difference %g; first values %g against %g)",
               what, UNIT, o->unit_n, base->unit_n,
               fm_max_diff(base->unit, o->unit, base->unit_n), (double)o->unit[0],
               (double)base->unit[0]);
  if (base->steps_counted != o->steps_counted || memcmp(base->skipped, o->skipped, sizeof o->skipped))
    lt_fail_at(__FILE__, __LINE__, "%s: %lld steps counted, %d skipped; without offload %lld, %d",
               what, (long long)o->steps_counted, o->skipped[0], (long long)base->steps_counted,
               base->skipped[0]);
  for (int r = 0; base->ckpt && o->ckpt && r < NR; r++) {
    char pa[400], pb[400];
    snprintf(pa, sizeof pa, "%s/gen-1/rank-%d-of-%d.safetensors", base->ckpt, r, NR);
    snprintf(pb, sizeof pb, "%s/gen-1/rank-%d-of-%d.safetensors", o->ckpt, r, NR);
    if (!fm_same_file(pa, pb))
      lt_fail_at(__FILE__, __LINE__, "%s: rank %d's checkpoint saved right after the step "
                 "(shards, optimizer state, step count) differs", what, r);
  }
}

/* The run without offload, and the disk tier with the pass behind the call and within it. */
static void three_ways(arun proto, const char *name, int prefetch) {
  char what[128], dir[64];
  arun base = proto;
  snprintf(dir, sizeof dir, "%s-base", name);
  base.ckpt = tmp_dir(dir);
  arun_go(&base);
  for (int sync = 0; sync < 2; sync++) {
    arun o = proto;
    snprintf(dir, sizeof dir, "%s-%s", name, sync ? "sync" : "async");
    o.ckpt = tmp_dir(dir);
    o.cfg.offload = loom_fsdp_offload_cfg_default();
    o.cfg.offload.tier = LOOM_FSDP_TIER_DISK;
    snprintf(dir, sizeof dir, "%s-tier", name);
    o.cfg.offload.dir = tmp_dir(dir);
    o.cfg.offload.chunk_bytes = 64; /* 16 elements: many chunks per shard, ragged tails */
    o.cfg.offload.prefetch_steps = prefetch;
    o.cfg.offload.async_step = !sync;
    arun_go(&o);
    snprintf(what, sizeof what, "%s, prefetch %d, the step's pass %s", name, prefetch,
             sync ? "within the call" : "behind the call");
    expect_same(&base, &o, what);
    free(o.params);
  }
  free(base.params);
}

LT_TEST(fsdp_async_step_f32_clip_lr_bit_identical) {
  LT_TRUE(!loom_fsdp_offload_cfg_default().async_step); /* opt-in until it measures faster */
  arun p = {.amp = LOOM_AUTOCAST_OFF, .clip = true, .poison_step = -1};
  p.cfg = loom_fsdp_cfg_default();
  three_ways(p, "f32", 1);
  three_ways(p, "f32p0", 0);
}

LT_TEST(fsdp_async_step_f16_scaling_skip_clip_bit_identical) {
  arun p = {.amp = LOOM_AUTOCAST_F16, .clip = true, .poison_step = 1};
  p.cfg = loom_fsdp_cfg_default();
  p.cfg.mp = loom_fsdp_mp_cfg_for(LOOM_F16);
  three_ways(p, "f16", 1);
}

LT_TEST(fsdp_async_step_bf16_low_precision_copy_bit_identical) {
  arun p = {.amp = LOOM_AUTOCAST_BF16, .poison_step = -1};
  p.cfg = loom_fsdp_cfg_default();
  p.cfg.mp = loom_fsdp_mp_cfg_for(LOOM_BF16);
  three_ways(p, "bf16", 1);
}

/* The optimizer freed right after the last loom_fsdp_optim_step: the pass runs on its own copy
 * of the step's scalars, and the result is the run that kept it. */
LT_TEST(fsdp_async_step_outlives_the_optimizer) {
  arun keep = {.amp = LOOM_AUTOCAST_OFF, .poison_step = -1};
  keep.cfg = loom_fsdp_cfg_default();
  keep.cfg.offload = loom_fsdp_offload_cfg_default();
  keep.cfg.offload.tier = LOOM_FSDP_TIER_DISK;
  keep.cfg.offload.dir = tmp_dir("outlive");
  keep.cfg.offload.chunk_bytes = 64;
  keep.cfg.offload.async_step = true;
  arun gone = keep;
  gone.free_opt = true;
  arun_go(&keep);
  arun_go(&gone);
  expect_same(&keep, &gone, "optimizer freed during the pass");
  LT_EQ(gone.steps_counted, STEPS);
  free(keep.params);
  free(gone.params);
}
