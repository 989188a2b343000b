/* test_fsdp_hybrid.c: hybrid sharding (loom_fsdp_cfg.replica_pg: shard within groups of S
 * consecutive ranks, all-reduce the gradient shards across the groups) against one process,
 * FSDP and DDP at the same rank count, with the tolerance and its reasoning of test_fsdp.c
 * (the averages differ from one process's mean only in f32 summation order); also the
 * collectives it issues, offloaded gradients (bit-identical), a skipped step decided over every
 * rank, and its checkpoints: written by replica 0 alone as an FSDP set of S ranks, resumed by
 * FSDP at another rank count and by HSDP from an FSDP set, bit for bit. */
#include "lt.h"
#include "fsdp_ckpt_sets.h"
#include "fsdp_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { STEPS = 4, B = 6, MAXR = 8 };

typedef struct hrun {
  int nranks, shard;       /* shard 0: plain FSDP over every rank; -1: DDP */
  loom_fsdp_cfg cfg;
  loom_autocast_mode amp;
  int poison_step;         /* a step whose gradient rank `poison_rank` makes infinite (-1: none) */
  int poison_rank;
  const char *save_dir;    /* save at the end */
  const char *load_dir;    /* load before the steps (then no steps: compare the state) */
  int steps;
  float *params;           /* world rank 0's full state at the end */
  loom_fsdp_stats stats[MAXR];
  int skipped[MAXR];
} hrun;

static size_t numel(void) {
  return (size_t)FM_IN * FM_H1 + FM_H1 + (size_t)FM_H1 * FM_H2 + FM_H2 + (size_t)FM_H2 * FM_OUT +
         FM_OUT;
}

static int hybrid_rank(loom_pg *pg, void *arg) {
  hrun *r = arg;
  if (r->shard < 0) /* DDP at the same ranks and rows */
    return fm_ddp_run(pg, 1 + (uint64_t)loom_pg_rank(pg), r->steps, B, r->amp, r->params);
  int rank = loom_pg_rank(pg), n = loom_pg_size(pg);
  loom_pg *shard = pg, *rep = NULL;
  int rc = LOOM_OK;
  if (r->shard > 0) {
    rc = loom_pg_split(pg, rank / r->shard, rank, &shard);
    if (!rc) rc = loom_pg_split(pg, rank % r->shard, rank, &rep);
  }
  loom_fsdp_cfg cfg = r->cfg;
  cfg.replica_pg = rep;
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  if (!rc) rc = fm_setup(shard, 1 + (uint64_t)rank, &cfg, LOOM_POOL_COMPUTE, &m, &f, &opt);
  if (!rc && r->load_dir) rc = loom_fsdp_load_sharded(f, r->load_dir, opt);
  for (int s = 0; s < r->steps && !rc; s++) {
    loom_fsdp_mp *mp = loom_fsdp_mp_manager(f);
    float scale = mp ? loom_fsdp_mp_current_loss_scale(mp) : 1.0f;
    if (s == r->poison_step && rank == r->poison_rank) scale = INFINITY;
    rc = fm_backward(m, (int64_t)s * n * B + (int64_t)rank * B, B, r->amp, scale, NULL);
    bool overflow = false;
    if (!rc) rc = loom_fsdp_finish(f);
    if (!rc) rc = loom_fsdp_check_overflow(f, &overflow);
    if (!rc && overflow) r->skipped[rank]++;
    if (!rc && !overflow) rc = loom_fsdp_optim_step(f, opt, 1.0f);
  }
  if (!rc && r->save_dir) rc = loom_fsdp_save_sharded(f, r->save_dir, opt, NULL, 0);
  loom_named_tensor *st = NULL;
  size_t nst = 0;
  if (!rc) rc = loom_fsdp_full_state(f, &st, &nst);
  if (!rc && rank == 0) fm_flatten_state(st, nst, r->params);
  if (!rc && r->shard > 0 && rank % r->shard == 0 && (rank == 0) != (st != NULL))
    rc = LOOM_EMISUSE; /* the full state comes to world rank 0 alone, not to other replicas */
  if (!rc) rc = loom_fsdp_stats_get(f, &r->stats[rank]);
  loom_fsdp_state_free(st, nst);
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  if (rep) loom_pg_free(rep);
  if (shard != pg) loom_pg_free(shard);
  return rc;
}

static float *run(hrun *r) {
  r->params = calloc(numel(), sizeof(float));
  if (!r->steps && !r->load_dir) r->steps = STEPS;
  LT_OK(loom_threads_run(r->nranks, NULL, hybrid_rank, r));
  return r->params;
}

static hrun make(int nranks, int shard) {
  hrun r = {.nranks = nranks, .shard = shard, .poison_step = -1};
  r.cfg = loom_fsdp_cfg_default();
  return r;
}

static double max_diff(const float *a, const float *b) {
  double w = 0;
  for (size_t i = 0; i < numel(); i++) {
    double e = fabs((double)a[i] - (double)b[i]);
    if (!(e <= w)) w = e; /* NaN counts as worst */
  }
  return w;
}

#define CLOSE(a, b, tol)                                                                       \
  do {                                                                                        \
    double d_ = max_diff(a, b);                                                               \
    if (!(d_ <= (tol))) lt_fail_at(__FILE__, __LINE__, "%s vs %s: %g (tol %g)", #a, #b, d_, (double)(tol)); \
  } while (0)

LT_TEST(hsdp_4_ranks_shard_2_matches_fsdp_and_ddp_at_4_ranks) {
  hrun f = make(4, 0), d = make(4, -1), h = make(4, 2);
  float *pf = run(&f), *pd = run(&d), *ph = run(&h);
  CLOSE(ph, pf, 1e-5);
  CLOSE(ph, pd, 1e-5);
  CLOSE(pf, pd, 1e-5);
  LT_TRUE(max_diff(ph, pf) > 0 || max_diff(ph, pd) >= 0); /* computed, not skipped */
  for (int k = 0; k < 4; k++) { /* per unit and step: one reduce-scatter, one replica all-reduce */
    LT_EQ(h.stats[k].reduce_scatters, 3 * STEPS);
    LT_EQ(h.stats[k].replica_reduces, 3 * STEPS);
    LT_EQ(h.stats[k].replica_bytes * 2, h.stats[k].reduce_bytes); /* a shard: 1/2 the unit */
    LT_EQ(f.stats[k].replica_reduces, 0);
    /* the exposed time's parts: gathers, the end of backward, and the rest in between */
    for (int w = 0; w < 2; w++) {
      const loom_fsdp_stats *s = w ? &h.stats[k] : &f.stats[k];
      LT_TRUE(s->exposed_gather_s >= 0 && s->exposed_end_s >= 0);
      LT_TRUE(s->exposed_gather_s + s->exposed_end_s <= s->exposed_s + 1e-9);
    }
  }
  /* 6 ranks as 2 x 3 (3 divides no unit: padding) and 3 x 2; 4 ranks as 4 x 1 (replicas only) */
  hrun f6 = make(6, 0), a = make(6, 3), b = make(6, 2), one = make(4, 1);
  float *pf6 = run(&f6), *pa = run(&a), *pb = run(&b), *p1 = run(&one);
  CLOSE(pa, pf6, 1e-5);
  CLOSE(pb, pf6, 1e-5);
  CLOSE(p1, pf, 1e-5);
  free(pf), free(pd), free(ph), free(pf6), free(pa), free(pb), free(p1);
}

LT_TEST(hsdp_mixed_precision_offload_and_skipped_steps) {
  /* bf16 forward: HSDP equals FSDP within test_fsdp.c's bf16 bound */
  hrun f = make(4, 0), h = make(4, 2);
  f.amp = h.amp = LOOM_AUTOCAST_BF16;
  f.cfg.mp = h.cfg.mp = loom_fsdp_mp_cfg_for(LOOM_BF16);
  float *pf = run(&f), *ph = run(&h);
  CLOSE(ph, pf, 2e-3);
  /* offloaded gradients (reduced in place, then to the host tier) change no bit */
  hrun o = make(4, 2);
  o.amp = LOOM_AUTOCAST_BF16;
  o.cfg.mp = loom_fsdp_mp_cfg_for(LOOM_BF16);
  o.cfg.offload.enabled = true;
  float *po = run(&o);
  LT_TRUE(memcmp(po, ph, numel() * sizeof(float)) == 0);
  /* an infinite gradient on rank 3 only (the other replica of rank 1's shard): every rank
   * skips that step, and the run equals one that never had it but skipped the same step */
  hrun p = make(4, 2), q = make(4, 2);
  p.poison_step = 1, p.poison_rank = 3;
  q.poison_step = 1, q.poison_rank = 0;
  float *pp = run(&p), *pq = run(&q);
  for (int k = 0; k < 4; k++) LT_EQ(p.skipped[k], 1);
  LT_TRUE(memcmp(pp, pq, numel() * sizeof(float)) == 0);
  free(pf), free(ph), free(po), free(pp), free(pq);
}

LT_TEST(hsdp_checkpoint_is_an_fsdp_set_that_reshards) {
  char dir[64], dir2[64];
  ck_tmp_dir(dir, sizeof dir);
  ck_tmp_dir(dir2, sizeof dir2);
  hrun h = make(4, 2);
  h.save_dir = dir;
  float *ph = run(&h);
  /* replica 0 wrote an FSDP set of 2 ranks; no file of a 4-rank world */
  char path[256];
  ck_rank_file(path, sizeof path, dir, 1, 1, 2);
  size_t nb = 0;
  unsigned char *bytes = ck_read_all(path, &nb);
  LT_TRUE(bytes != NULL);
  free(bytes);
  ck_rank_file(path, sizeof path, dir, 1, 3, 4);
  bytes = ck_read_all(path, &nb);
  LT_TRUE(bytes == NULL);
  /* FSDP at 3 ranks and 1, and HSDP as 2 x 3, resume it: the same weights, bit for bit */
  int worlds[3][2] = {{3, 0}, {1, 0}, {6, 3}};
  for (int k = 0; k < 3; k++) {
    hrun l = make(worlds[k][0], worlds[k][1]);
    l.load_dir = dir;
    float *pl = run(&l);
    LT_TRUE(memcmp(pl, ph, numel() * sizeof(float)) == 0);
    free(pl);
  }
  /* and a run resumed from it continues as FSDP would: two more steps under HSDP and FSDP */
  hrun c1 = make(4, 2), c2 = make(4, 0);
  c1.load_dir = c2.load_dir = dir;
  c1.steps = c2.steps = 2;
  c2.save_dir = dir2;
  float *a = run(&c1), *b = run(&c2);
  CLOSE(a, b, 1e-5);
  /* an FSDP set loaded by HSDP */
  hrun back = make(4, 2);
  back.load_dir = dir2;
  float *pb = run(&back);
  LT_TRUE(memcmp(pb, b, numel() * sizeof(float)) == 0);
  free(ph), free(a), free(b), free(pb);
  fm_rm_tree(dir);
  fm_rm_tree(dir2);
}
