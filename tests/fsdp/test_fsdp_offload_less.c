/* test_fsdp_offload_less.c: less offload traffic (issue 29, item 3).
 * The low-precision copy of each parameter shard in the tier (cfg.offload.low_precision_params):
 * with a bf16 or f16 forward the gathers read that copy instead of the f32 shard; the results
 * must be the same bits as without offload (a gather casts to the forward dtype anyway): the
 * losses of every step and the final weights, on the host and disk tiers, with prefetch 0 and
 * 1, in bf16 and in f16 with loss scaling and clipping, and across a load of new weights in the
 * middle (the copy must not outlive the f32 shard it was cast from). On the disk tier the bytes
 * moved are counted exactly: the gathers of every step after the first read half the parameter
 * bytes, and each optimizer step writes the copy once.
 * The optimizer step inside backward (cfg.optim_in_backward): the same bits as the step after
 * backward, without offload and on both tiers, f32 and bf16; with gradients offloaded no
 * gradient byte goes to the tier or back; and its refusals (dynamic loss scaling, clipping, no
 * optimizer, another optimizer), each with a status and a message. */
#include "lt.h"
#include "fsdp_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { STEPS = 3, B = 6, NR = 2 };

typedef struct lrun {
  loom_fsdp_cfg cfg;
  loom_autocast_mode amp;
  bool clip;
  bool reload;               /* after STEPS steps: load other weights, then one more step */
  bool oib;                  /* cfg.optim_in_backward, stepping through loom_step */
  double loss[NR][STEPS + 1];
  float *params;             /* rank 0's final full state */
  loom_fsdp_stats stats[NR];
  size_t shard_bytes[NR];    /* the rank's f32 parameter shards, all units */
} lrun;

static size_t model_numel(void) {
  return (size_t)(FM_IN * FM_H1 + FM_H1 + FM_H1 * FM_H2 + FM_H2 + FM_H2 * FM_OUT + FM_OUT);
}

/* With optim_in_backward, the step ends through loom_step (which gave the wrapper its
 * optimizer; nothing is left for its apply to step); otherwise through the FSDP calls. */
static int step_api(loom_module *m, loom_fsdp *f, loom_step *st, int s, int rank, const lrun *r,
                    double *loss) {
  int rc = fm_backward(m, (int64_t)s * NR * B + (int64_t)rank * B, B, r->amp, 1.0f, loss);
  if (!rc) rc = loom_fsdp_finish(f);
  if (!rc) rc = loom_step_apply(st, NULL);
  return rc;
}

static int step(loom_module *m, loom_fsdp *f, loom_optim *opt, int s, int rank, const lrun *r,
                double *loss) {
  loom_fsdp_mp *mp = loom_fsdp_mp_manager(f);
  float scale = mp ? loom_fsdp_mp_current_loss_scale(mp) : 1.0f;
  int rc = fm_backward(m, (int64_t)s * NR * B + (int64_t)rank * B, B, r->amp, scale, loss);
  bool overflow = false;
  if (!rc) rc = loom_fsdp_finish(f);
  if (!rc && mp && loom_fsdp_mp_scaler(mp)) rc = loom_fsdp_check_overflow(f, &overflow);
  if (!rc && r->clip) rc = loom_fsdp_clip_grad_norm(f, 0.05, false, NULL);
  if (!rc && !overflow) rc = loom_fsdp_optim_step(f, opt, 1.0f);
  return rc;
}

/* Every rank loads the weights of a model made from another seed (the same on every rank). */
static int load_other(loom_fsdp *f) {
  loom_module *o = NULL;
  int rc = fm_create(777, &o);
  if (!rc) rc = fm_load_module(f, o);
  loom_module_free(o);
  return rc;
}

static int lrun_rank(loom_pg *pg, void *arg) {
  lrun *r = arg;
  int rank = loom_pg_rank(pg);
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  loom_step *st = NULL;
  int rc = fm_setup(pg, 1 + (uint64_t)rank, &r->cfg, LOOM_POOL_HOST, &m, &f, &opt);
  loom_step_cfg sc = loom_step_cfg_default();
  sc.optim = opt;
  sc.fsdp = f;
  if (!rc && r->oib) rc = loom_step_create(&sc, &st);
  for (int s = 0; s <= STEPS && !rc; s++) {
    if (s == STEPS && !(r->reload && !(rc = load_other(f)))) break;
    rc = r->oib ? step_api(m, f, st, s, rank, r, &r->loss[rank][s])
                : step(m, f, opt, s, rank, r, &r->loss[rank][s]);
  }
  if (!rc) rc = loom_fsdp_optim_wait(f); /* the last step's pass ran behind it: its bytes too */
  if (!rc) rc = loom_fsdp_stats_get(f, &r->stats[rank]);
  for (size_t u = 0; u < loom_fsdp_unit_count(f) && !rc; u++) {
    loom_fsdp_unit_info ui;
    loom_fsdp_unit_info_get(f, u, &ui);
    r->shard_bytes[rank] += ui.shard_numel * sizeof(float);
  }
  if (!rc) rc = fm_full_state_flat(f, rank == 0 ? r->params : NULL);
  loom_step_free(st);
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

static void lrun_go(lrun *r) {
  r->params = calloc(model_numel(), sizeof(float));
  LT_OK(loom_threads_run(NR, NULL, lrun_rank, r));
}

static void expect_same(const lrun *base, const lrun *o, const char *what) {
  if (memcmp(base->params, o->params, model_numel() * sizeof(float)) != 0)
    lt_fail_at(__FILE__, __LINE__, "%s: weights differ from the run without offload", what);
  if (memcmp(base->loss, o->loss, sizeof base->loss) != 0)
    lt_fail_at(__FILE__, __LINE__, "%s: losses differ from the run without offload", what);
}

static char root[256];

static void rm_root(void) { fm_rm_tree(root); }

static const char *tier_dir(void) {
  if (!root[0]) {
    snprintf(root, sizeof root, "/tmp/loom-test-lowp-%d", (int)getpid());
    mkdir(root, 0700);
    atexit(rm_root);
  }
  return root;
}

static void offload(lrun *r, loom_fsdp_tier tier, int prefetch, bool low) {
  r->cfg.offload = loom_fsdp_offload_cfg_default();
  r->cfg.offload.tier = tier;
  r->cfg.offload.dir = tier_dir();
  r->cfg.offload.chunk_bytes = 64; /* 16 elements: many chunks, ragged tails */
  r->cfg.offload.prefetch_steps = prefetch;
  r->cfg.offload.low_precision_params = low;
}

LT_TEST(fsdp_offload_low_precision_copy_is_bitwise_both_tiers) {
  LT_TRUE(loom_fsdp_offload_cfg_default().low_precision_params);
  for (int a = 0; a < 2; a++) { /* bf16; f16 with loss scaling and clipping */
    for (int reload = 0; reload < 2; reload++) {
      lrun base = {.amp = a ? LOOM_AUTOCAST_F16 : LOOM_AUTOCAST_BF16, .clip = a == 1,
                   .reload = reload};
      base.cfg = loom_fsdp_cfg_default();
      base.cfg.mp = loom_fsdp_mp_cfg_for(a ? LOOM_F16 : LOOM_BF16);
      lrun_go(&base);
      for (int tier = 0; tier < 2; tier++)
        for (int p = 0; p < 2; p++) {
          lrun o = base;
          offload(&o, (loom_fsdp_tier)tier, p, true);
          lrun_go(&o);
          char what[96];
          snprintf(what, sizeof what, "%s, %s tier, prefetch %d, low-precision copy%s",
                   a ? "f16" : "bf16", tier ? "disk" : "host", p, reload ? ", reloaded" : "");
          expect_same(&base, &o, what);
          free(o.params);
        }
      free(base.params);
    }
  }
}

/* The bytes: on the disk tier with prefetch 0 (nothing read ahead that a step might not use),
 * bf16 (every step steps: no overflow to skip), the copy against the f32 shard. Step 1's
 * gathers read the f32 shard (no copy yet); each optimizer step writes the copy (half the
 * shard's bytes); steps 2 and 3 gather twice each from the copy: half the bytes of the f32
 * shard each time. */
LT_TEST(fsdp_offload_low_precision_copy_halves_the_gathers_reads) {
  lrun on = {.amp = LOOM_AUTOCAST_BF16}, off = {.amp = LOOM_AUTOCAST_BF16};
  on.cfg = off.cfg = loom_fsdp_cfg_default();
  on.cfg.mp = off.cfg.mp = loom_fsdp_mp_cfg_for(LOOM_BF16);
  offload(&on, LOOM_FSDP_TIER_DISK, 0, true);
  offload(&off, LOOM_FSDP_TIER_DISK, 0, false);
  lrun_go(&on);
  lrun_go(&off);
  expect_same(&off, &on, "bf16, disk tier, the copy against none");
  for (int r = 0; r < NR; r++) {
    double S = (double)on.shard_bytes[r];
    LT_TRUE(S > 0);
    /* a gather's own part in bf16 is 1/NR of its bytes (gather_bytes: every gather's padded
     * bf16 bytes), and half the f32 part it replaces: it saves that much. The last unit is
     * gathered once a step (kept from its forward to its backward), the others twice. */
    LT_EQ(on.stats[r].gather_bytes, off.stats[r].gather_bytes);
    double per_step = (double)on.stats[r].gather_bytes / STEPS / NR;
    double less_read = (double)off.stats[r].offload_from_bytes - (double)on.stats[r].offload_from_bytes;
    double more_written = (double)on.stats[r].offload_to_bytes - (double)off.stats[r].offload_to_bytes;
    if (less_read != (STEPS - 1) * per_step || more_written != STEPS * S / 2)
      lt_fail_at(__FILE__, __LINE__, "rank %d: read %.0f fewer bytes (want %.0f), wrote %.0f more "
                 "(want %.0f); shards %.0f bytes", r, less_read, (STEPS - 1) * per_step,
                 more_written, STEPS * S / 2, S);
    /* the tier holds the copy too: half the shards' bytes more */
    LT_EQ((double)on.stats[r].offload_bytes, (double)off.stats[r].offload_bytes + S / 2);
  }
  /* without mixed precision the flag changes nothing */
  lrun f32a = {.amp = LOOM_AUTOCAST_OFF}, f32b = {.amp = LOOM_AUTOCAST_OFF};
  f32a.cfg = f32b.cfg = loom_fsdp_cfg_default();
  offload(&f32a, LOOM_FSDP_TIER_DISK, 0, true);
  offload(&f32b, LOOM_FSDP_TIER_DISK, 0, false);
  lrun_go(&f32a);
  lrun_go(&f32b);
  expect_same(&f32b, &f32a, "f32, disk tier");
  LT_EQ(f32a.stats[0].offload_from_bytes, f32b.stats[0].offload_from_bytes);
  LT_EQ(f32a.stats[0].offload_to_bytes, f32b.stats[0].offload_to_bytes);
  free(on.params);
  free(off.params);
  free(f32a.params);
  free(f32b.params);
}

/* ---- the optimizer step inside backward --------------------------------------------------- */

LT_TEST(fsdp_optim_in_backward_is_bitwise_without_and_with_offload) {
  LT_TRUE(!loom_fsdp_cfg_default().optim_in_backward);
  for (int a = 0; a < 2; a++) { /* f32; bf16 (the low-precision copy on) */
    lrun base = {.amp = a ? LOOM_AUTOCAST_BF16 : LOOM_AUTOCAST_OFF};
    base.cfg = loom_fsdp_cfg_default();
    if (a) base.cfg.mp = loom_fsdp_mp_cfg_for(LOOM_BF16);
    lrun_go(&base);
    for (int t = -1; t < 2; t++) /* none, host, disk */
      for (int p = 0; p < 2; p++) {
        if (t < 0 && p) continue;
        lrun o = base;
        o.oib = true;
        o.cfg.optim_in_backward = true;
        if (t >= 0) offload(&o, (loom_fsdp_tier)t, p, true);
        lrun_go(&o);
        char what[96];
        snprintf(what, sizeof what, "%s, optimizer in backward, %s, prefetch %d",
                 a ? "bf16" : "f32", t < 0 ? "no offload" : t ? "disk tier" : "host tier", p);
        expect_same(&base, &o, what);
        free(o.params);
      }
    free(base.params);
  }
}

/* With everything offloaded to the disk tier (prefetch 0: nothing read ahead), the step in
 * backward moves the same bytes less each gradient's write and read: one shard's bytes each
 * way per step. */
LT_TEST(fsdp_optim_in_backward_moves_no_gradient) {
  lrun on = {.amp = LOOM_AUTOCAST_OFF, .oib = true}, off = {.amp = LOOM_AUTOCAST_OFF};
  on.cfg = off.cfg = loom_fsdp_cfg_default();
  on.cfg.optim_in_backward = true;
  offload(&on, LOOM_FSDP_TIER_DISK, 0, true);
  offload(&off, LOOM_FSDP_TIER_DISK, 0, true);
  lrun_go(&on);
  lrun_go(&off);
  expect_same(&off, &on, "f32, disk tier, optimizer in backward against after");
  for (int r = 0; r < NR; r++) {
    double S = (double)on.shard_bytes[r];
    double less_read = (double)off.stats[r].offload_from_bytes - (double)on.stats[r].offload_from_bytes;
    double less_written = (double)off.stats[r].offload_to_bytes - (double)on.stats[r].offload_to_bytes;
    if (less_read != STEPS * S || less_written != STEPS * S)
      lt_fail_at(__FILE__, __LINE__, "rank %d: read %.0f and wrote %.0f fewer bytes, want %.0f "
                 "each (%d steps of %.0f-byte shards)", r, less_read, less_written, STEPS * S,
                 STEPS, S);
  }
  free(on.params);
  free(off.params);
}

typedef struct refuse_ctx {
  int rc_nopt, rc_clip, rc_step_clip, rc_other;
  char msg_nopt[256], msg_clip[256], msg_step_clip[256], msg_other[256];
} refuse_ctx;

/* Rank 0 records the outcomes (the same on every rank; the ranks are threads). */
static int refuse_rank(loom_pg *pg, void *arg) {
  refuse_ctx *c = arg;
  int rank = loom_pg_rank(pg);
  loom_fsdp_cfg cfg = loom_fsdp_cfg_default();
  cfg.optim_in_backward = true;
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL, *other = NULL;
  int rc = fm_setup(pg, 1 + (uint64_t)rank, &cfg, LOOM_POOL_COMPUTE, &m, &f, &opt);
  /* no optimizer given: backward fails at its first hook, on every rank */
  if (!rc) {
    double loss;
    int got = fm_backward(m, (int64_t)rank * B, B, LOOM_AUTOCAST_OFF, 1.0f, &loss);
    if (rank == 0) {
      c->rc_nopt = got;
      snprintf(c->msg_nopt, sizeof c->msg_nopt, "%s", loom_last_error());
    }
  }
  /* clipping: refused by the wrapper and by loom_step */
  int got = loom_fsdp_clip_grad_norm(f, 1.0, false, NULL);
  if (rank == 0) {
    c->rc_clip = got;
    snprintf(c->msg_clip, sizeof c->msg_clip, "%s", loom_last_error());
  }
  loom_step_cfg sc = loom_step_cfg_default();
  sc.optim = opt;
  sc.fsdp = f;
  sc.clip = true;
  loom_step *st = NULL;
  got = loom_step_create(&sc, &st);
  if (rank == 0) {
    c->rc_step_clip = got;
    snprintf(c->msg_step_clip, sizeof c->msg_step_clip, "%s", loom_last_error());
  }
  /* a step with another optimizer than the one backward stepped with */
  const loom_param_seg *segs = NULL;
  size_t n = 0;
  loom_adam_cfg ac = fm_adam();
  if (!rc) rc = loom_fsdp_segments(f, &segs, &n);
  if (!rc) rc = loom_optim_create_adamw(segs, n, &ac, &other);
  if (!rc) rc = loom_fsdp_set_optim(f, opt);
  double loss;
  if (!rc) rc = fm_backward(m, (int64_t)rank * B, B, LOOM_AUTOCAST_OFF, 1.0f, &loss);
  if (!rc) rc = loom_fsdp_finish(f);
  if (!rc) {
    got = loom_fsdp_optim_step(f, other, 1.0f);
    if (rank == 0) {
      c->rc_other = got;
      snprintf(c->msg_other, sizeof c->msg_other, "%s", loom_last_error());
    }
    rc = loom_fsdp_optim_step(f, opt, 1.0f);
  }
  loom_step_free(st);
  loom_optim_free(other);
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

LT_TEST(fsdp_optim_in_backward_refusals_have_a_status_and_a_message) {
  loom_fsdp_cfg cfg = loom_fsdp_cfg_default();
  cfg.optim_in_backward = true;
  LT_OK(loom_fsdp_cfg_validate(&cfg));
  cfg.mp = loom_fsdp_mp_cfg_for(LOOM_BF16); /* no loss scaling: fine */
  LT_OK(loom_fsdp_cfg_validate(&cfg));
  cfg.mp = loom_fsdp_mp_cfg_for(LOOM_F16); /* dynamic loss scaling: refused */
  LT_EQ(loom_fsdp_cfg_validate(&cfg), LOOM_EINVAL);
  LT_TRUE(strstr(loom_last_error(), "optim_in_backward") &&
          strstr(loom_last_error(), "loss scaling"));
  refuse_ctx c = {0};
  LT_OK(loom_threads_run(NR, NULL, refuse_rank, &c));
  LT_EQ(c.rc_nopt, LOOM_EMISUSE);
  LT_TRUE(strstr(c.msg_nopt, "loom_fsdp_set_optim") != NULL);
  LT_EQ(c.rc_clip, LOOM_EMISUSE);
  LT_TRUE(strstr(c.msg_clip, "optim_in_backward") != NULL);
  LT_EQ(c.rc_step_clip, LOOM_EINVAL);
  LT_TRUE(strstr(c.msg_step_clip, "optim_in_backward") != NULL);
  LT_EQ(c.rc_other, LOOM_EINVAL);
  LT_TRUE(strstr(c.msg_other, "loom_fsdp_set_optim") != NULL);
}
