/* test_fsdp_offload.c: FSDP offload (the specification fsdp-cpu-offload and the issue's
 * additions). Offload moves bytes and nothing else, so every run here is compared bit for bit
 * with the same run without offload: the final weights (full state), the losses of every step and
 * each rank's sharded checkpoint file (parameter shards, optimizer state, step count, loss
 * scale), with each offload flag alone and all together, on the host and disk tiers, at 1 and 2
 * ranks, with prefetch depth 0, 1 and 10, in f32 and f16 with loss scaling and clipping. Chunks
 * are 16 elements here, so every shard crosses many chunk boundaries with a ragged tail. Also the
 * specification's list (each offload and prefetch call, its no-op cases, prefetch scheduling,
 * clear, no offloading, one rank), the compute pool left with no shard between steps, and the
 * faults: a missing folder, a full disk during a step (RLIMIT_FSIZE) and a file changed behind
 * loom's back, each failing with the path named and the weights as they were, and no file left. */
#include "lt.h"
#include "fsdp_model.h"
#include "fsdp/fsdp_int.h"
#include "fsdp/offload_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

enum { STEPS = 3, B = 6, MAXR = 2 };

typedef struct orun {
  int nranks;
  loom_fsdp_cfg cfg;
  loom_autocast_mode amp;
  bool clip;
  const char *ckpt;         /* sharded checkpoint folder written at the end */
  float *params;            /* rank 0's full state */
  double loss[MAXR][STEPS];
  loom_fsdp_stats stats[MAXR];
  size_t compute_in_use[MAXR]; /* the rank's compute pool after the last step */
  size_t shard_bytes[MAXR];
  size_t params_back[MAXR];    /* units whose parameters the last step brought back */
} orun;

static char tmp_root[256];

static void rm_tmp_root(void) { fm_rm_tree(tmp_root); }

/* A folder under this process's scratch root, removed at exit (the string is static storage,
 * one of 128). */
static const char *tmp_dir(const char *name) {
  static char bufs[128][512];
  static int next;
  char *p = bufs[next++ % 128];
  if (!tmp_root[0]) {
    snprintf(tmp_root, sizeof tmp_root, "/tmp/loom-test-offload-%d", (int)getpid());
    mkdir(tmp_root, 0700);
    atexit(rm_tmp_root);
  }
  snprintf(p, 512, "%s/%s", tmp_root, name);
  mkdir(p, 0700);
  return p;
}

static int files_in(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

/* Training step s: each rank's B rows of batch s, loss scaling with AMP, clipping if asked. */
static int orun_step(loom_module *m, loom_fsdp *f, loom_optim *opt, int s, int rank, int n,
                     loom_autocast_mode amp, bool clip, double *loss) {
  loom_fsdp_mp *mp = loom_fsdp_mp_manager(f);
  float scale = mp ? loom_fsdp_mp_current_loss_scale(mp) : 1.0f;
  int64_t row0 = (int64_t)s * n * B + (int64_t)rank * B;
  int rc = fm_backward(m, row0, B, amp, scale, loss);
  bool overflow = false;
  if (!rc) rc = loom_fsdp_finish(f);
  if (!rc) rc = loom_fsdp_check_overflow(f, &overflow);
  if (!rc && clip) rc = loom_fsdp_clip_grad_norm(f, 0.05, false, NULL);
  if (!rc && !overflow) rc = loom_fsdp_optim_step(f, opt, 1.0f);
  return rc;
}

/* The seeded model, its FSDP wrapper and AdamW over its segments (state in the host pool). */
static int orun_setup(loom_pg *pg, uint64_t seed, const loom_fsdp_cfg *cfg, loom_module **m,
                      loom_fsdp **f, loom_optim **opt) {
  return fm_setup(pg, seed, cfg, LOOM_POOL_HOST, m, f, opt);
}

static int orun_rank(loom_pg *pg, void *arg) {
  orun *r = arg;
  int rank = loom_pg_rank(pg), n = loom_pg_size(pg);
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  int rc = orun_setup(pg, 1 + (uint64_t)rank, &r->cfg, &m, &f, &opt);
  for (int s = 0; s < STEPS && !rc; s++)
    rc = orun_step(m, f, opt, s, rank, n, r->amp, r->clip, &r->loss[rank][s]);
  /* the step brought the next forward's first parameter shards back (disk tier): send them
   * out again */
  if (!rc) rc = loom_fsdp_prefetch_wait(f);
  r->params_back[rank] = 0;
  for (size_t u = 0; u < loom_fsdp_unit_count(f); u++)
    r->params_back[rank] += !loom_fsdp_is_offloaded(f, u, LOOM_FSDP_OFFLOAD_PARAMS);
  for (size_t u = 0; u < loom_fsdp_unit_count(f) && !rc; u++) rc = loom_fsdp_offload_parameter(f, u);
  if (!rc) {
    loom_pool_stats ps;
    loom_mem_account_stats(rank + 1, LOOM_POOL_COMPUTE, &ps);
    r->compute_in_use[rank] = ps.current_bytes;
    for (size_t u = 0; u < loom_fsdp_unit_count(f); u++) {
      loom_fsdp_unit_info ui;
      loom_fsdp_unit_info_get(f, u, &ui);
      r->shard_bytes[rank] += ui.shard_numel * sizeof(float);
    }
  }
  if (!rc && r->ckpt) rc = loom_fsdp_save_sharded(f, r->ckpt, opt, NULL, 0);
  loom_named_tensor *st = NULL;
  size_t nst = 0;
  if (!rc) rc = loom_fsdp_full_state(f, &st, &nst);
  if (!rc && rank == 0) fm_flatten_state(st, nst, r->params);
  if (!rc) rc = loom_fsdp_stats_get(f, &r->stats[rank]);
  loom_fsdp_state_free(st, nst);
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

static size_t model_numel(void) {
  return (size_t)(FM_IN * FM_H1 + FM_H1 + FM_H1 * FM_H2 + FM_H2 + FM_H2 * FM_OUT + FM_OUT);
}

static void orun_go(orun *r) {
  r->params = calloc(model_numel(), sizeof(float));
  LT_OK(loom_threads_run(r->nranks, NULL, orun_rank, r));
}

/* The offloaded run against the plain one: weights, losses and every rank's checkpoint file. */
static void expect_identical(const orun *base, const orun *o, const char *what) {
  if (memcmp(base->params, o->params, model_numel() * sizeof(float)) != 0)
    lt_fail_at(__FILE__, __LINE__, "%s: weights differ from the run without offload", what);
  if (memcmp(base->loss, o->loss, sizeof base->loss) != 0)
    lt_fail_at(__FILE__, __LINE__, "%s: losses differ from the run without offload", what);
  for (int r = 0; r < base->nranks; r++) {
    char pa[700], pb[700];
    snprintf(pa, sizeof pa, "%s/gen-1/rank-%d-of-%d.safetensors", base->ckpt, r, base->nranks);
    snprintf(pb, sizeof pb, "%s/gen-1/rank-%d-of-%d.safetensors", o->ckpt, r, o->nranks);
    if (!fm_same_file(pa, pb))
      lt_fail_at(__FILE__, __LINE__, "%s: rank %d's checkpoint (shards, optimizer state) differs",
                 what, r);
  }
}

static void offload_cfg(loom_fsdp_cfg *c, loom_fsdp_tier tier, const char *dir) {
  c->offload = loom_fsdp_offload_cfg_default();
  c->offload.tier = tier;
  c->offload.dir = dir;
  c->offload.chunk_bytes = 64; /* 16 elements: many chunks per shard, ragged tails */
}

LT_TEST(fsdp_offload_cfg_defaults_and_rules) {
  loom_fsdp_offload_cfg c = loom_fsdp_offload_cfg_default();
  LT_TRUE(c.enabled && c.offload_optimizer_states && c.offload_gradients && c.offload_parameters);
  LT_TRUE(c.prefetch_parameters && c.prefetch_gradients);
  LT_EQ(c.prefetch_steps, 1);
  LT_EQ(c.tier, LOOM_FSDP_TIER_HOST);
  LT_OK(loom_fsdp_offload_cfg_validate(&c));
  c.prefetch_steps = 10;
  LT_OK(loom_fsdp_offload_cfg_validate(&c));
  c.prefetch_steps = 11;
  LT_EQ(loom_fsdp_offload_cfg_validate(&c), LOOM_EINVAL);
  LT_TRUE(strstr(loom_last_error(), "prefetch_steps") != NULL);
  c.prefetch_steps = -1;
  LT_EQ(loom_fsdp_offload_cfg_validate(&c), LOOM_EINVAL);
  c.prefetch_steps = 1;
  c.tier = LOOM_FSDP_TIER_DISK;
  LT_EQ(loom_fsdp_offload_cfg_validate(&c), LOOM_EINVAL); /* no folder */
  LT_TRUE(strstr(loom_last_error(), "folder") != NULL);
  c.dir = "/tmp";
  LT_OK(loom_fsdp_offload_cfg_validate(&c));
  c.chunk_bytes = 100;
  LT_EQ(loom_fsdp_offload_cfg_validate(&c), LOOM_EINVAL);
  LT_TRUE(strstr(loom_last_error(), "chunk_bytes") != NULL);
  c.chunk_bytes = 64;
  LT_EQ(c.io_threads, 0); /* the tier's default */
  c.io_threads = 16;
  LT_OK(loom_fsdp_offload_cfg_validate(&c));
  c.io_threads = 17;
  LT_EQ(loom_fsdp_offload_cfg_validate(&c), LOOM_EINVAL);
  LT_TRUE(strstr(loom_last_error(), "io_threads") != NULL);
  c.io_threads = -1;
  LT_EQ(loom_fsdp_offload_cfg_validate(&c), LOOM_EINVAL);
  c.enabled = false; /* disabled: valid whatever it holds */
  LT_OK(loom_fsdp_offload_cfg_validate(&c));
  loom_fsdp_cfg fc = loom_fsdp_cfg_default();
  LT_TRUE(!fc.offload.enabled); /* PyTorch's cpu_offload=None */
  fc.offload.enabled = true;
  fc.offload.prefetch_steps = 42;
  LT_EQ(loom_fsdp_cfg_validate(&fc), LOOM_EINVAL);
}

/* Every flag alone and all together, both tiers, 1 and 2 ranks: bit-identical. */
LT_TEST(fsdp_offload_each_flag_both_tiers_1_and_2_ranks_bit_identical) {
  for (int n = 1; n <= 2; n++) {
    orun base = {.nranks = n, .ckpt = tmp_dir(n == 1 ? "base1" : "base2")};
    base.cfg = loom_fsdp_cfg_default();
    orun_go(&base);
    for (int tier = 0; tier < 2; tier++)
      for (int flags = 1; flags <= 4; flags++) { /* params, grads, optim, all */
        char name[64];
        snprintf(name, sizeof name, "run-%d-%d-%d", n, tier, flags);
        orun o = {.nranks = n, .ckpt = tmp_dir(name)};
        o.cfg = loom_fsdp_cfg_default();
        const char *dir = tmp_dir("tier");
        offload_cfg(&o.cfg, (loom_fsdp_tier)tier, dir);
        o.cfg.offload.offload_parameters = flags == 1 || flags == 4;
        o.cfg.offload.offload_gradients = flags == 2 || flags == 4;
        o.cfg.offload.offload_optimizer_states = flags == 3 || flags == 4;
        orun_go(&o);
        snprintf(name, sizeof name, "%d ranks, %s tier, flags %d", n, tier ? "disk" : "host", flags);
        expect_identical(&base, &o, name);
        LT_EQ(files_in(dir), 0); /* the disk tier's files are gone with the wrapper */
        if (flags == 4) {
          LT_TRUE(o.stats[0].offload_to_bytes > 0 && o.stats[0].offload_from_bytes > 0);
          /* nothing of the shards stays in the compute pool between steps */
          /* (the optimizer's state is in the host pool in both runs) */
          if (!(o.compute_in_use[0] + 2 * o.shard_bytes[0] <= base.compute_in_use[0]))
            lt_fail_at(__FILE__, __LINE__, "compute pool %zu with offload, %zu without, shards %zu",
                       o.compute_in_use[0], base.compute_in_use[0], o.shard_bytes[0]);
        }
        free(o.params);
      }
    /* everything on the disk tier with one I/O thread, and with 16 (more than the chunks in
     * flight): the same bytes whatever runs at once */
    for (int t = 0; t < 2; t++) {
      char name[64];
      snprintf(name, sizeof name, "io-%d-%d", n, t);
      orun o = {.nranks = n, .ckpt = tmp_dir(name)};
      o.cfg = loom_fsdp_cfg_default();
      const char *dir = tmp_dir("tier");
      offload_cfg(&o.cfg, LOOM_FSDP_TIER_DISK, dir);
      o.cfg.offload.io_threads = t ? 16 : 1;
      orun_go(&o);
      snprintf(name, sizeof name, "%d ranks, disk tier, %d I/O threads", n, o.cfg.offload.io_threads);
      expect_identical(&base, &o, name);
      LT_EQ(files_in(dir), 0);
      free(o.params);
    }
    free(base.params);
  }
}

/* Prefetch depth 0, 1 and 10 (and prefetch off) move the same bytes; f16 with loss scaling and
 * clipping streams the unscale and the norm too. */
LT_TEST(fsdp_offload_prefetch_depths_and_amp_clip_bit_identical) {
  for (int amp = 0; amp < 2; amp++) {
    orun base = {.nranks = 2, .ckpt = tmp_dir(amp ? "pbase-amp" : "pbase"), .clip = true};
    base.cfg = loom_fsdp_cfg_default();
    if (amp) {
      base.amp = LOOM_AUTOCAST_F16;
      base.cfg.mp = loom_fsdp_mp_cfg_for(LOOM_F16);
    }
    orun_go(&base);
    static const int depth[] = {0, 1, 10, -1};
    for (int d = 0; d < 4; d++) {
      char name[64];
      snprintf(name, sizeof name, "p-%d-%d", amp, d);
      orun o = base;
      o.ckpt = tmp_dir(name);
      offload_cfg(&o.cfg, d % 2 ? LOOM_FSDP_TIER_DISK : LOOM_FSDP_TIER_HOST, tmp_dir("tier"));
      if (depth[d] >= 0) {
        o.cfg.offload.prefetch_steps = depth[d];
      } else {
        o.cfg.offload.prefetch_parameters = false;
        o.cfg.offload.prefetch_gradients = false;
      }
      orun_go(&o);
      snprintf(name, sizeof name, "%s, prefetch %d", amp ? "f16" : "f32", depth[d]);
      expect_identical(&base, &o, name);
      if (amp) LT_TRUE(o.stats[0].offload_wait_s >= 0);
      /* every gather reads its part straight out of the tier (f32 from either tier, the host
       * tier's buffers cast, f16's low-precision copy once the first step has written it):
       * nothing is brought back ahead of them */
      bool ahead = false;
      LT_EQ(o.params_back[0] > 0, ahead);
      /* with prefetch on, the host tier's gathers read it on the progress thread, beside the
       * rank's compute; with it off, never (the rank reads at the gather) */
      if (!(d % 2)) LT_EQ(o.stats[0].offload_gathers_overlapped > 0, depth[d] > 0);
      if (depth[d] < 0) LT_EQ(o.stats[0].offload_gathers_overlapped, 0);
      free(o.params);
    }
    free(base.params);
  }
}

/* ---- the specification's offloader calls ------------------------------------------------ */

typedef struct spec_ctx {
  bool prefetch_off; /* prefetch_steps 0 */
  bool params_off;   /* offload_parameters false */
} spec_ctx;

static int spec_rank(loom_pg *pg, void *arg) {
  spec_ctx *c = arg;
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  loom_fsdp_cfg cfg = loom_fsdp_cfg_default();
  offload_cfg(&cfg, LOOM_FSDP_TIER_HOST, NULL);
  if (c->prefetch_off) cfg.offload.prefetch_steps = 0;
  if (c->params_off) cfg.offload.offload_parameters = false;
  LT_OK(fm_create(1, &m));
  LT_OK(loom_fsdp_create(pg, m, &cfg, &f));
  size_t nu = loom_fsdp_unit_count(f);
  const loom_param_seg *segs;
  size_t nseg;
  LT_OK(loom_fsdp_segments(f, &segs, &nseg));
  loom_adam_cfg ac = fm_adam();
  LT_OK(loom_optim_create_adamw(segs, nseg, &ac, &opt));
  if (c->params_off) {
    /* offloading disabled for parameters: every call on them is a no-op */
    LT_TRUE(!loom_fsdp_is_offloaded(f, 0, LOOM_FSDP_OFFLOAD_PARAMS));
    LT_OK(loom_fsdp_offload_parameter(f, 0));
    LT_TRUE(!loom_fsdp_is_offloaded(f, 0, LOOM_FSDP_OFFLOAD_PARAMS));
  } else {
    for (size_t u = 0; u < nu; u++) LT_TRUE(loom_fsdp_is_offloaded(f, u, LOOM_FSDP_OFFLOAD_PARAMS));
    LT_OK(loom_fsdp_offload_parameter(f, 0)); /* already offloaded: nothing */
    size_t all[8];
    for (size_t u = 0; u < nu; u++) all[u] = u;
    LT_OK(loom_fsdp_schedule_prefetch(f, all, nu, true));
    LT_OK(loom_fsdp_prefetch_wait(f));
    for (size_t u = 0; u < nu; u++)
      LT_EQ(loom_fsdp_is_offloaded(f, u, LOOM_FSDP_OFFLOAD_PARAMS), c->prefetch_off);
    LT_OK(loom_fsdp_prefetch_parameter(f, 0)); /* here already (or prefetch off): nothing */
    for (size_t u = 0; u < nu; u++) LT_OK(loom_fsdp_offload_parameter(f, u));
    for (size_t u = 0; u < nu; u++) LT_TRUE(loom_fsdp_is_offloaded(f, u, LOOM_FSDP_OFFLOAD_PARAMS));
    /* scheduled, then cleared at once: whatever had not started stays offloaded */
    LT_OK(loom_fsdp_schedule_prefetch(f, all, nu, true));
    loom_fsdp_prefetch_clear(f);
    LT_OK(loom_fsdp_prefetch_wait(f));
  }
  LT_EQ(loom_fsdp_offload_parameter(f, nu), LOOM_EINVAL);
  /* a gradient before any backward: nothing to move */
  LT_OK(loom_fsdp_offload_gradient(f, 0));
  LT_OK(loom_fsdp_prefetch_gradient(f, 0));
  /* one step: gradients leave as they are reduced */
  double loss = 0;
  LT_OK(fm_backward(m, 0, B, LOOM_AUTOCAST_OFF, 1.0f, &loss));
  LT_OK(loom_fsdp_finish(f));
  for (size_t u = 0; u < nu; u++) LT_TRUE(loom_fsdp_is_offloaded(f, u, LOOM_FSDP_OFFLOAD_GRADS));
  LT_OK(loom_fsdp_prefetch_gradient(f, 1));
  LT_OK(loom_fsdp_prefetch_wait(f));
  LT_EQ(loom_fsdp_is_offloaded(f, 1, LOOM_FSDP_OFFLOAD_GRADS), c->prefetch_off);
  LT_OK(loom_fsdp_offload_gradient(f, 1));
  LT_TRUE(loom_fsdp_is_offloaded(f, 1, LOOM_FSDP_OFFLOAD_GRADS));
  /* optimizer state: resident until first offloaded */
  LT_TRUE(!loom_fsdp_is_offloaded(f, 0, LOOM_FSDP_OFFLOAD_OPTIM));
  LT_OK(loom_fsdp_optim_step(f, opt, 1.0f));
  for (size_t u = 0; u < nu; u++) {
    LT_TRUE(loom_fsdp_is_offloaded(f, u, LOOM_FSDP_OFFLOAD_OPTIM));
    LT_TRUE(loom_optim_state_released(opt, u));
  }
  LT_EQ(loom_optim_step(opt), LOOM_EMISUSE); /* its state is in the tier */
  LT_OK(loom_fsdp_prefetch_optimizer_state(f, opt, 0));
  LT_OK(loom_fsdp_prefetch_wait(f));
  LT_EQ(loom_fsdp_is_offloaded(f, 0, LOOM_FSDP_OFFLOAD_OPTIM), c->prefetch_off);
  if (!c->prefetch_off) {
    loom_optim_state st;
    LT_OK(loom_optim_state_at(opt, 0, &st));
    LT_TRUE(st.data != NULL);
    bool moved = false; /* after one step, exp_avg is (1 - beta1) x g: not all zero */
    for (size_t i = 0; i < st.n; i++) moved = moved || st.data[i] != 0;
    LT_TRUE(moved);
  }
  LT_OK(loom_fsdp_offload_optimizer_state(f, opt, 0));
  LT_TRUE(loom_fsdp_is_offloaded(f, 0, LOOM_FSDP_OFFLOAD_OPTIM));
  LT_OK(loom_fsdp_offload_optimizer_state(f, opt, 0)); /* already: nothing */
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return LOOM_OK;
}

LT_TEST(fsdp_offloader_calls_and_no_op_cases_one_and_two_ranks) {
  spec_ctx c = {0};
  LT_OK(loom_threads_run(1, NULL, spec_rank, &c));
  LT_OK(loom_threads_run(2, NULL, spec_rank, &c));
  spec_ctx off = {.prefetch_off = true};
  LT_OK(loom_threads_run(2, NULL, spec_rank, &off));
  spec_ctx np = {.params_off = true};
  LT_OK(loom_threads_run(1, NULL, spec_rank, &np));
}

static int plain_rank(loom_pg *pg, void *arg) {
  (void)arg;
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  LT_OK(fm_create(1, &m));
  LT_OK(loom_fsdp_create(pg, m, NULL, &f));
  LT_TRUE(!loom_fsdp_is_offloaded(f, 0, LOOM_FSDP_OFFLOAD_PARAMS));
  LT_OK(loom_fsdp_offload_parameter(f, 0)); /* no offload: no-op */
  LT_OK(loom_fsdp_prefetch_parameter(f, 0));
  size_t u0 = 0;
  LT_OK(loom_fsdp_schedule_prefetch(f, &u0, 1, true));
  LT_OK(loom_fsdp_prefetch_wait(f));
  loom_fsdp_stats st;
  LT_OK(loom_fsdp_stats_get(f, &st));
  LT_EQ(st.offload_to_bytes, 0);
  loom_fsdp_free(f);
  loom_module_free(m);
  return LOOM_OK;
}

LT_TEST(fsdp_offload_disabled_is_plain_fsdp) { LT_OK(loom_threads_run(1, NULL, plain_rank, NULL)); }

/* ---- resuming from a sharded checkpoint ---------------------------------------------------- */

enum { RESUME_AT = 2, RESUME_END = 4 };

/* What a load may not move when refused: the full state (rank 0's) and the step count. */
typedef struct load_before {
  float weights[2048];
  int64_t steps;
} load_before;

/* A load's status and message, and whether it moved the rank's step count or (rank 0, which
 * holds the full state) the weights. */
typedef struct load_outcome {
  int rc;
  char msg[512];
  bool moved;
} load_outcome;

typedef struct resume_run {
  int nranks;
  int tier;             /* -1: no offload; else everything offloaded to this tier */
  const char *tier_dir; /* the disk tier's folder */
  bool amp;
  const char *mid;      /* without load: saved here after RESUME_AT steps */
  const char *load;     /* resumed from this set (fresh weights before: another seed) */
  const char *corrupt;  /* a copy of the set with a byte flipped: its load is refused first */
  bool full_disk;       /* disk tier, one rank: a load that finds the disk full half-way */
  const char *before, *after; /* saved before and after the refused loads */
  const char *end;      /* saved at the end */
  float *params;        /* rank 0's full state at the end */
  double loss[MAXR][RESUME_END];
  load_outcome bad[2][MAXR]; /* the corrupt set's load, the full disk's */
  size_t compute_rise[MAXR], state_bytes[MAXR];
} resume_run;

static void flatten_full(loom_fsdp *f, float *out) {
  loom_named_tensor *st = NULL;
  size_t n = 0;
  LT_OK(loom_fsdp_full_state(f, &st, &n));
  fm_flatten_state(st, n, out);
  loom_fsdp_state_free(st, n);
}

static size_t account_in_use(int rank, loom_pool pool, bool peak) {
  loom_pool_stats ps;
  loom_mem_account_stats(rank + 1, pool, &ps);
  return peak ? ps.peak_bytes : ps.current_bytes;
}

static void take_before(loom_fsdp *f, loom_optim *opt, load_before *b) {
  memset(b, 0, sizeof *b);
  flatten_full(f, b->weights); /* a collective: every rank takes part, rank 0 gets the state */
  b->steps = loom_optim_step_count(opt);
}

/* Load dir against b (taken before whatever the test set up for the load: the full state is a
 * gather, which would land a prefetch the load must meet in flight). */
static void load_against(loom_fsdp *f, loom_optim *opt, const char *dir, int rank,
                         const load_before *b, load_outcome *o) {
  float after[2048] = {0};
  o->rc = loom_fsdp_load_sharded(f, dir, opt);
  snprintf(o->msg, sizeof o->msg, "%s", loom_last_error());
  flatten_full(f, after);
  o->moved = b->steps != loom_optim_step_count(opt) ||
             (rank == 0 && memcmp(b->weights, after, model_numel() * sizeof(float)) != 0);
}

static void load_and_compare(loom_fsdp *f, loom_optim *opt, const char *dir, int rank,
                             load_outcome *o) {
  load_before b;
  take_before(f, opt, &b);
  load_against(f, opt, dir, rank, &b, o);
}

/* From now on the file at path may grow by `extra` bytes only (RLIMIT_FSIZE; SIGXFSZ ignored, so
 * a write past it fails with EFBIG): a disk that is full. *old gets the limit to put back. */
static void file_may_grow(const char *path, size_t extra, struct rlimit *old) {
  struct stat sb;
  getrlimit(RLIMIT_FSIZE, old);
  LT_TRUE(stat(path, &sb) == 0);
  struct rlimit lim = {(rlim_t)sb.st_size + extra, old->rlim_max};
  signal(SIGXFSZ, SIG_IGN);
  setrlimit(RLIMIT_FSIZE, &lim);
}

static int resume_rank(loom_pg *pg, void *arg) {
  resume_run *r = arg;
  int rank = loom_pg_rank(pg), n = loom_pg_size(pg);
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  loom_fsdp_cfg cfg = loom_fsdp_cfg_default();
  if (r->amp) cfg.mp = loom_fsdp_mp_cfg_for(LOOM_F16);
  if (r->tier >= 0) offload_cfg(&cfg, (loom_fsdp_tier)r->tier, r->tier_dir);
  loom_autocast_mode amp = r->amp ? LOOM_AUTOCAST_F16 : LOOM_AUTOCAST_OFF;
  int rc = orun_setup(pg, (r->load ? 40u : 1u) + (uint64_t)rank, &cfg, &m, &f, &opt);
  if (rc) goto out;
  int s = 0;
  if (r->load) {
    if (r->before) rc = loom_fsdp_save_sharded(f, r->before, opt, NULL, 0);
    if (!rc && r->corrupt) load_and_compare(f, opt, r->corrupt, rank, &r->bad[0][rank]);
    if (!rc && r->full_disk) {
      /* the state goes to the tier first; then the file may grow by 8 pages only, while the
       * load's new slot set needs one per chunk and kind */
      for (size_t u = 0; u < loom_fsdp_unit_count(f) && !rc; u++)
        rc = loom_fsdp_offload_optimizer_state(f, opt, u);
      struct rlimit old;
      file_may_grow(loom__ostore_path(f->store), 8 * 4096, &old);
      if (!rc) load_and_compare(f, opt, r->load, rank, &r->bad[1][rank]);
      setrlimit(RLIMIT_FSIZE, &old);
    }
    if (!rc && r->after) rc = loom_fsdp_save_sharded(f, r->after, opt, NULL, 0);
    for (size_t u = 0; u < loom_fsdp_unit_count(f); u++) {
      loom_fsdp_unit_info ui;
      loom_fsdp_unit_info_get(f, u, &ui);
      r->state_bytes[rank] += 3 * ui.shard_numel * sizeof(float); /* parameters, 2 moments */
    }
    size_t c0 = account_in_use(rank, LOOM_POOL_COMPUTE, false);
    loom_mem_account_reset_peak(rank + 1, LOOM_POOL_COMPUTE);
    if (!rc) rc = loom_fsdp_load_sharded(f, r->load, opt);
    r->compute_rise[rank] = account_in_use(rank, LOOM_POOL_COMPUTE, true) - c0;
    s = RESUME_AT;
  }
  for (; s < RESUME_END && !rc; s++) {
    rc = orun_step(m, f, opt, s, rank, n, amp, false, &r->loss[rank][s]);
    if (!rc && !r->load && s + 1 == RESUME_AT && r->mid)
      rc = loom_fsdp_save_sharded(f, r->mid, opt, NULL, 0);
  }
  if (!rc && r->end) rc = loom_fsdp_save_sharded(f, r->end, opt, NULL, 0);
  loom_named_tensor *st = NULL;
  size_t nst = 0;
  if (!rc) rc = loom_fsdp_full_state(f, &st, &nst);
  if (!rc && rank == 0) fm_flatten_state(st, nst, r->params);
  loom_fsdp_state_free(st, nst);
out:
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

static void copy_file(const char *from, const char *to) {
  FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
  LT_TRUE(a && b);
  int c;
  while (a && b && (c = fgetc(a)) != EOF) fputc(c, b);
  if (a) fclose(a);
  if (b) fclose(b);
}

/* A set like `from` whose rank-0 file has one byte flipped in its data. */
static void corrupt_copy(const char *from, const char *to, int nranks) {
  char a[700], b[700];
  mkdir(to, 0700);
  snprintf(a, sizeof a, "%s/gen-1", to);
  mkdir(a, 0700);
  snprintf(a, sizeof a, "%s/fsdp-index.safetensors", from);
  snprintf(b, sizeof b, "%s/fsdp-index.safetensors", to);
  copy_file(a, b);
  for (int r = 0; r < nranks; r++) {
    snprintf(a, sizeof a, "%s/gen-1/rank-%d-of-%d.safetensors", from, r, nranks);
    snprintf(b, sizeof b, "%s/gen-1/rank-%d-of-%d.safetensors", to, r, nranks);
    copy_file(a, b);
  }
  snprintf(b, sizeof b, "%s/gen-1/rank-0-of-%d.safetensors", to, nranks);
  FILE *fl = fopen(b, "r+b");
  LT_TRUE(fl != NULL);
  if (!fl) return;
  fseek(fl, -5, SEEK_END);
  int c = fgetc(fl);
  fseek(fl, -5, SEEK_END);
  fputc(c ^ 0x10, fl);
  fclose(fl);
}

/* Interrupted without offload at step 2, resumed with everything offloaded (either tier, 1 and
 * 2 ranks, f32 and f16): the same losses, weights and final checkpoint as the uninterrupted
 * run. The load reads straight into the tier: the compute pool holds the chunk ring only, not
 * the rank's state (bench/offload_memlimit.sh resumes an 858 MB state under a 760 MiB limit).
 * Before it, a corrupt set and (disk tier) a disk that fills half-way are refused, naming the
 * problem, with nothing changed: weights, step count and the optimizer state (a save before
 * and after is the same file). */
LT_TEST(fsdp_offload_resume_from_sharded_checkpoint_bit_identical) {
  for (int amp = 0; amp < 2; amp++)
    for (int n = 1; n <= 2; n++) {
      char name[64];
      snprintf(name, sizeof name, "r-mid-%d-%d", amp, n);
      resume_run base = {.nranks = n, .tier = -1, .amp = amp, .mid = tmp_dir(name)};
      snprintf(name, sizeof name, "r-end-%d-%d", amp, n);
      base.end = tmp_dir(name);
      base.params = calloc(model_numel(), sizeof(float));
      LT_OK(loom_threads_run(n, NULL, resume_rank, &base));
      snprintf(name, sizeof name, "r-bad-%d-%d", amp, n);
      const char *bad = tmp_dir(name);
      corrupt_copy(base.mid, bad, n);
      for (int tier = 0; tier < 2; tier++) {
        resume_run o = {.nranks = n, .tier = tier, .tier_dir = tmp_dir("rtier"), .amp = amp,
                        .load = base.mid, .corrupt = bad, .full_disk = tier == 1 && n == 1};
        snprintf(name, sizeof name, "r-o-%d-%d-%d", amp, n, tier);
        o.end = tmp_dir(name);
        snprintf(name, sizeof name, "r-b-%d-%d-%d", amp, n, tier);
        o.before = tmp_dir(name);
        snprintf(name, sizeof name, "r-a-%d-%d-%d", amp, n, tier);
        o.after = tmp_dir(name);
        o.params = calloc(model_numel(), sizeof(float));
        LT_OK(loom_threads_run(n, NULL, resume_rank, &o));
        snprintf(name, sizeof name, "%s, %d ranks, %s tier", amp ? "f16" : "f32", n,
                 tier ? "disk" : "host");
        if (memcmp(base.params, o.params, model_numel() * sizeof(float)) != 0)
          lt_fail_at(__FILE__, __LINE__, "%s: weights differ from the uninterrupted run", name);
        for (int r = 0; r < n; r++)
          if (memcmp(base.loss[r] + RESUME_AT, o.loss[r] + RESUME_AT,
                     (RESUME_END - RESUME_AT) * sizeof(double)) != 0)
            lt_fail_at(__FILE__, __LINE__, "%s: rank %d's losses differ", name, r);
        for (int r = 0; r < n; r++) {
          char pa[700], pb[700];
          snprintf(pa, sizeof pa, "%s/gen-1/rank-%d-of-%d.safetensors", base.end, r, n);
          snprintf(pb, sizeof pb, "%s/gen-1/rank-%d-of-%d.safetensors", o.end, r, n);
          if (!fm_same_file(pa, pb))
            lt_fail_at(__FILE__, __LINE__, "%s: rank %d's final checkpoint differs", name, r);
          snprintf(pa, sizeof pa, "%s/gen-1/rank-%d-of-%d.safetensors", o.before, r, n);
          snprintf(pb, sizeof pb, "%s/gen-1/rank-%d-of-%d.safetensors", o.after, r, n);
          if (!fm_same_file(pa, pb))
            lt_fail_at(__FILE__, __LINE__, "%s: a refused load changed rank %d's state", name, r);
          /* nothing comes back into the compute pool but the disk tier's chunk ring (3 sets
           * of 3 kinds of 64-byte chunks, and with f16 the low-precision parameter copy's
           * 32-byte chunk in each set); the host tier is written where it is (with f16, the
           * copy's first write of each chunk goes through one 32-byte buffer) */
          size_t ring = tier == 1 ? 3 * 3 * 64 + (amp ? 3 * 32 : 0) : amp ? 32 : 0;
          if (o.compute_rise[r] > ring)
            lt_fail_at(__FILE__, __LINE__, "%s: rank %d's load took %zu compute bytes (%zu of "
                       "state, ring %zu)", name, r, o.compute_rise[r], o.state_bytes[r], ring);
        }
        for (int r = 0; r < n; r++) {
          LT_EQ(o.bad[0][r].rc, LOOM_EFORMAT);
          LT_TRUE(!o.bad[0][r].moved);
        }
        LT_TRUE(strstr(o.bad[0][0].msg, bad) != NULL);
        if (o.full_disk) {
          LT_EQ(o.bad[1][0].rc, LOOM_EIO);
          LT_TRUE(strstr(o.bad[1][0].msg, "full") != NULL);
          LT_TRUE(!o.bad[1][0].moved);
        }
        LT_EQ(files_in(o.tier_dir), 0);
        free(o.params);
      }
      free(base.params);
    }
}

/* ---- faults ------------------------------------------------------------------------------ */

typedef struct fault_ctx {
  const char *dir;
  int mode;      /* 0: flip a byte of the tier file after step 1; 1: the disk fills in step 1 */
  bool sync;     /* cfg.offload.async_step off: the step's pass runs within the call */
  bool forward;  /* the step's pass runs behind: the next forward is the first call that waits
                    (else loom_fsdp_optim_wait) */
  int step_rc;   /* the failure: the step's, or that of the first call that waited for it */
  char msg[512];
  float before[2048], after[2048];
  int64_t steps_before, steps_after;
  int save_rc;
  bool index_written;
} fault_ctx;

static int fault_rank(loom_pg *pg, void *arg) {
  fault_ctx *c = arg;
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  loom_fsdp_cfg cfg = loom_fsdp_cfg_default();
  offload_cfg(&cfg, LOOM_FSDP_TIER_DISK, c->dir);
  /* one I/O thread: slots get their file range in the order they are first put (with several,
   * the last chunk's parameter and state puts race for the file's end, and the flip below then
   * lands in the current parameters one run in three: the later gathers fail too) */
  cfg.offload.io_threads = 1;
  cfg.offload.async_step = !c->sync;
  LT_OK(fm_create(1, &m));
  LT_OK(loom_fsdp_create(pg, m, &cfg, &f));
  const loom_param_seg *segs;
  size_t nseg;
  LT_OK(loom_fsdp_segments(f, &segs, &nseg));
  loom_adam_cfg ac = fm_adam();
  LT_OK(loom_optim_create_adamw(segs, nseg, &ac, &opt));
  const char *path = loom__ostore_path(f->store);
  struct rlimit old;
  getrlimit(RLIMIT_FSIZE, &old);
  int steps = c->mode == 0 ? 2 : 1;
  for (int s = 0; s < steps; s++) {
    LT_OK(fm_backward(m, s * B, B, LOOM_AUTOCAST_OFF, 1.0f, NULL));
    LT_OK(loom_fsdp_finish(f));
    if (s == steps - 1) {
      flatten_full(f, c->before);
      c->steps_before = loom_optim_step_count(opt);
      struct stat sb;
      LT_TRUE(stat(path, &sb) == 0);
      if (c->mode == 0) { /* the first byte of the file's last page: the last slot written */
        int fd = open(path, O_RDWR);
        off_t at = (sb.st_size - 1) / 4096 * 4096;
        unsigned char b;
        LT_TRUE(pread(fd, &b, 1, at) == 1);
        b ^= 0x40;
        LT_TRUE(pwrite(fd, &b, 1, at) == 1);
        close(fd);
      } else { /* the file may not grow: the state's first puts find the disk full */
        file_may_grow(path, 0, &old);
      }
    }
    c->step_rc = loom_fsdp_optim_step(f, opt, 1.0f);
    if (s < steps - 1) LT_OK(c->step_rc);
  }
  if (c->step_rc == LOOM_OK) /* the pass runs behind the call: the first call that waits */
    c->step_rc = c->forward ? fm_backward(m, 7 * B, B, LOOM_AUTOCAST_OFF, 1.0f, NULL)
                            : loom_fsdp_optim_wait(f);
  snprintf(c->msg, sizeof c->msg, "%s", loom_last_error());
  LT_OK(loom_fsdp_optim_wait(f)); /* reported once */
  setrlimit(RLIMIT_FSIZE, &old);
  if (c->mode == 0) { /* a checkpoint reads the offloaded bytes where they are: the flip too */
    char ck[600];
    snprintf(ck, sizeof ck, "%s-ckpt", c->dir);
    c->save_rc = loom_fsdp_save_sharded(f, ck, opt, NULL, 0);
    char idx[700];
    snprintf(idx, sizeof idx, "%s/fsdp-index.safetensors", ck);
    c->index_written = access(idx, F_OK) == 0;
    fm_rm_tree(ck);
  }
  c->steps_after = loom_optim_step_count(opt);
  flatten_full(f, c->after); /* the weights in the tier are intact: they read */
  LT_TRUE(strstr(c->msg, path) != NULL);
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return LOOM_OK;
}

static int missing_dir_rank(loom_pg *pg, void *arg) {
  (void)arg;
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  LT_OK(fm_create(1, &m));
  loom_fsdp_cfg cfg = loom_fsdp_cfg_default();
  offload_cfg(&cfg, LOOM_FSDP_TIER_DISK, "/nonexistent/loom-offload");
  LT_EQ(loom_fsdp_create(pg, m, &cfg, &f), LOOM_EIO);
  LT_TRUE(strstr(loom_last_error(), "/nonexistent/loom-offload") != NULL);
  LT_TRUE(f == NULL);
  loom_module_free(m);
  return LOOM_OK;
}

/* Run the fault; it fails with rc, its message says `word`, and nothing changed: the weights,
 * the step count, no file left. */
static void expect_failed_whole(fault_ctx *c, int rc, const char *word) {
  LT_OK(loom_threads_run(1, NULL, fault_rank, c));
  LT_EQ(c->step_rc, rc);
  LT_TRUE(strstr(c->msg, word) != NULL);
  LT_EQ(c->steps_after, c->steps_before);
  LT_TRUE(memcmp(c->before, c->after, model_numel() * sizeof(float)) == 0);
  LT_EQ(files_in(c->dir), 0);
}

LT_TEST(fsdp_offload_disk_faults_name_the_path_and_change_nothing) {
  /* a folder that does not exist */
  LT_OK(loom_threads_run(1, NULL, missing_dir_rank, NULL));

  /* a byte flipped behind loom's back: the step reads it, says so, and changes nothing; with
   * the pass behind the call (async_step), the first call that waits for it says so, the
   * next forward or loom_fsdp_optim_wait, once; and with it within the call */
  for (int v = 0; v < 3; v++) {
    fault_ctx c = {.dir = tmp_dir("flip"), .mode = 0, .sync = v == 2, .forward = v == 1};
    expect_failed_whole(&c, LOOM_EFORMAT, "changed");
    LT_EQ(c.save_rc, LOOM_EFORMAT); /* never written into a checkpoint either */
    LT_TRUE(!c.index_written);
  }

  /* the disk fills during the step */
  for (int v = 0; v < 2; v++) {
    fault_ctx d = {.dir = tmp_dir("full"), .mode = 1, .sync = v == 1};
    expect_failed_whole(&d, LOOM_EIO, "full");
  }
}

/* ---- misuse ------------------------------------------------------------------------------ */

static int misuse_rank(loom_pg *pg, void *arg) {
  (void)arg;
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL, *other = NULL;
  loom_fsdp_cfg cfg = loom_fsdp_cfg_default();
  offload_cfg(&cfg, LOOM_FSDP_TIER_HOST, NULL);
  LT_OK(fm_create(1, &m));
  LT_OK(loom_fsdp_create(pg, m, &cfg, &f));
  const loom_param_seg *segs;
  size_t nseg;
  LT_OK(loom_fsdp_segments(f, &segs, &nseg));
  for (size_t i = 0; i < nseg; i++) LT_TRUE((segs[i].flags & LOOM_SEG_STREAMED) != 0);
  loom_adam_cfg ac = fm_adam();
  LT_OK(loom_optim_create_adamw(segs, nseg, &ac, &opt));
  /* an optimizer that is not over this wrapper's segments */
  float p[4] = {0}, g[4] = {0};
  loom_param_seg one = {"x", p, g, 4, 0};
  LT_OK(loom_optim_create_adamw(&one, 1, &ac, &other));
  LT_EQ(loom_fsdp_optim_step(f, other, 1.0f), LOOM_EINVAL);
  LT_TRUE(strstr(loom_last_error(), "loom_fsdp_segments") != NULL);
  LT_EQ(loom_fsdp_offload_optimizer_state(f, other, 0), LOOM_EINVAL);
  LT_EQ(loom_fsdp_load_sharded(f, "/nonexistent", other), LOOM_EINVAL); /* before any file */
  LT_TRUE(strstr(loom_last_error(), "loom_fsdp_segments") != NULL);
  LT_EQ(loom_fsdp_optim_step(f, NULL, 1.0f), LOOM_EINVAL);
  /* a streamed segment is refused by the plain step, which changes nothing */
  LT_EQ(loom_optim_step(opt), LOOM_EMISUSE);
  LT_TRUE(strstr(loom_last_error(), "streamed") != NULL);
  LT_EQ(loom_optim_step_count(opt), 0);
  /* a gathered unit's parameters cannot be offloaded */
  LT_OK(loom_fsdp_gather_unit(f, 0, LOOM_F32));
  LT_EQ(loom_fsdp_offload_parameter(f, 0), LOOM_EMISUSE);
  LT_OK(loom_fsdp_reshard_unit(f, 0));
  LT_OK(loom_fsdp_offload_parameter(f, 0));
  LT_EQ(loom_fsdp_schedule_prefetch(f, NULL, 2, true), LOOM_EINVAL);
  LT_EQ(loom_fsdp_prefetch_gradient(f, 99), LOOM_EINVAL);
  LT_EQ(loom_fsdp_offload_optimizer_state(NULL, opt, 0), LOOM_EINVAL);
  LT_TRUE(!loom_fsdp_is_offloaded(f, 99, LOOM_FSDP_OFFLOAD_PARAMS));
  LT_TRUE(!loom_fsdp_is_offloaded(NULL, 0, LOOM_FSDP_OFFLOAD_PARAMS));
  loom_optim_free(other);
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return LOOM_OK;
}

LT_TEST(fsdp_offload_misuse_is_refused_with_a_message) {
  LT_OK(loom_threads_run(1, NULL, misuse_rank, NULL));
}

/* ---- sharded loads: in-flight transfers, an open step, an empty unit, resharding ----------- */

/* A set saved without offload (seed 1), then loaded into a fresh model (seed 40):
 *   mode 0: disk tier, unit 0's parameters on their way back (as loom_fsdp_optim_step leaves
 *           them) and a disk that fills half-way through the load: refused, nothing changed;
 *   mode 1: disk tier, every unit's optimizer state being prefetched: the load waits for those
 *           reads (they write into buffers it releases) and the offload flags stay true;
 *   mode 2: no offload, a chunked optimizer step open: refused before anything changes;
 *   mode 3: no offload, a unit with no parameters (the ReLU named as a unit): loads. */
typedef struct probe {
  const char *set, *tier_dir; /* tier_dir: made by the test's thread (tmp_dir is not shared) */
  int mode;
  load_outcome out;
  bool state_flag_ok;
} probe;

static int probe_rank(loom_pg *pg, void *arg) {
  probe *p = arg;
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  loom_fsdp_cfg cfg = loom_fsdp_cfg_default();
  static const char *names[] = {"layers.0", "layers.1", "layers.2"};
  if (p->mode == 3) {
    cfg.wrap = LOOM_FSDP_WRAP_LIST;
    cfg.unit_names = names;
    cfg.n_unit_names = 3;
  }
  /* the set: another seed, no offload */
  int rc = orun_setup(pg, 1, &cfg, &m, &f, &opt);
  if (!rc) rc = loom_fsdp_save_sharded(f, p->set, opt, NULL, 0);
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  m = NULL, f = NULL, opt = NULL;
  if (rc) return rc;
  if (p->mode == 3) {
    rc = orun_setup(pg, 40, &cfg, &m, &f, &opt);
    if (!rc) rc = p->out.rc = loom_fsdp_load_sharded(f, p->set, opt);
    goto out;
  }
  if (p->mode == 2) {
    rc = orun_setup(pg, 40, &cfg, &m, &f, &opt);
    if (!rc) rc = loom_optim_step_begin(opt, 1.0f);
    if (!rc) load_and_compare(f, opt, p->set, 0, &p->out);
    (void)loom_optim_step_end(opt, false);
    goto out;
  }
  offload_cfg(&cfg, LOOM_FSDP_TIER_DISK, p->tier_dir);
  rc = orun_setup(pg, 40, &cfg, &m, &f, &opt);
  for (size_t u = 0; u < loom_fsdp_unit_count(f) && !rc; u++)
    rc = loom_fsdp_offload_optimizer_state(f, opt, u);
  if (rc) goto out;
  if (p->mode == 0) {
    /* as loom_fsdp_optim_step leaves it on the disk tier: the next forward's first unit's
     * parameters on their way back */
    load_before b;
    take_before(f, opt, &b);
    rc = loom_fsdp_prefetch_parameter(f, 0);
    struct rlimit old;
    file_may_grow(loom__ostore_path(f->store), 8 * 4096, &old);
    if (!rc) load_against(f, opt, p->set, 0, &b, &p->out);
    setrlimit(RLIMIT_FSIZE, &old);
  } else if (p->mode == 1) {
    for (size_t u = 0; u < loom_fsdp_unit_count(f) && !rc; u++)
      rc = loom_fsdp_prefetch_optimizer_state(f, opt, u);
    if (!rc) p->out.rc = loom_fsdp_load_sharded(f, p->set, opt);
    p->state_flag_ok = true;
    for (size_t u = 0; u < loom_fsdp_unit_count(f); u++)
      if (loom_optim_state_released(opt, u) !=
          loom_fsdp_is_offloaded(f, u, LOOM_FSDP_OFFLOAD_OPTIM))
        p->state_flag_ok = false;
  }
out:
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

LT_TEST(fsdp_offload_load_with_parameters_arriving_fails_whole_on_a_full_disk) {
  probe p = {.set = tmp_dir("probe0"), .tier_dir = tmp_dir("probe-tier"), .mode = 0};
  LT_OK(loom_threads_run(1, NULL, probe_rank, &p));
  LT_EQ(p.out.rc, LOOM_EIO);
  LT_TRUE(strstr(p.out.msg, "full") != NULL);
  LT_TRUE(!p.out.moved);
}

LT_TEST(fsdp_offload_load_while_optimizer_state_is_prefetched) {
  probe p = {.set = tmp_dir("probe1"), .tier_dir = tmp_dir("probe-tier"), .mode = 1};
  LT_OK(loom_threads_run(1, NULL, probe_rank, &p));
  LT_OK(p.out.rc);
  LT_TRUE(p.state_flag_ok);
}

LT_TEST(fsdp_load_during_an_open_step_is_refused_before_any_change) {
  probe p = {.set = tmp_dir("probe2"), .tier_dir = tmp_dir("probe-tier"), .mode = 2};
  LT_OK(loom_threads_run(1, NULL, probe_rank, &p));
  LT_EQ(p.out.rc, LOOM_EMISUSE);
  LT_TRUE(strstr(p.out.msg, "step") != NULL);
  LT_TRUE(!p.out.moved);
}

LT_TEST(fsdp_load_with_a_unit_without_parameters) {
  probe p = {.set = tmp_dir("probe3"), .tier_dir = tmp_dir("probe-tier"), .mode = 3};
  LT_OK(loom_threads_run(1, NULL, probe_rank, &p));
  LT_OK(p.out.rc);
}

/* Saved at one world size without offload, loaded at the other with offload on either tier
 * (reads spanning several old rank files, chunk tails): the same as loading without it. */
typedef struct rs_probe {
  const char *set, *tier_dir;
  int tier; /* -1 none */
  bool save;
  float *out;
} rs_probe;

static int rs_rank(loom_pg *pg, void *arg) {
  rs_probe *p = arg;
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  loom_fsdp_cfg cfg = loom_fsdp_cfg_default();
  if (p->tier >= 0) offload_cfg(&cfg, (loom_fsdp_tier)p->tier, p->tier_dir);
  int rc = orun_setup(pg, p->save ? 1 : 40, &cfg, &m, &f, &opt);
  int rank = loom_pg_rank(pg), n = loom_pg_size(pg);
  double loss;
  if (p->save) {
    for (int s = 0; s < 2 && !rc; s++)
      rc = orun_step(m, f, opt, s, rank, n, LOOM_AUTOCAST_OFF, false, &loss);
    if (!rc) rc = loom_fsdp_save_sharded(f, p->set, opt, NULL, 0);
  } else {
    if (!rc) rc = loom_fsdp_load_sharded(f, p->set, opt);
    for (int s = 0; s < 2 && !rc; s++)
      rc = orun_step(m, f, opt, s, rank, n, LOOM_AUTOCAST_OFF, false, &loss);
    float mine[2048];
    if (!rc) flatten_full(f, rank == 0 ? p->out : mine); /* a collective; rank 0 keeps it */
  }
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

LT_TEST(fsdp_offload_load_reshards_as_without_offload) {
  for (int ws = 1; ws <= 2; ws++)
    for (int wl = 1; wl <= 2; wl++) {
      if (ws == wl) continue;
      char name[64];
      snprintf(name, sizeof name, "rs-%d-%d", ws, wl);
      rs_probe sv = {.set = tmp_dir(name), .tier = -1, .save = true};
      LT_OK(loom_threads_run(ws, NULL, rs_rank, &sv));
      float *ref = calloc(2048, sizeof(float));
      rs_probe a = {.set = sv.set, .tier = -1, .out = ref};
      LT_OK(loom_threads_run(wl, NULL, rs_rank, &a));
      for (int tier = 0; tier < 2; tier++) {
        float *o = calloc(2048, sizeof(float));
        rs_probe b = {.set = sv.set, .tier_dir = tmp_dir("rs-tier"), .tier = tier, .out = o};
        LT_OK(loom_threads_run(wl, NULL, rs_rank, &b));
        if (memcmp(ref, o, model_numel() * sizeof(float)) != 0)
          lt_fail_at(__FILE__, __LINE__, "save %d load %d tier %d differs", ws, wl, tier);
        free(o);
      }
      free(ref);
    }
}
