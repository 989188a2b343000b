/* test_fsdp_share_write.c: writes to a rank's parameter shard while the ranks of the threads
 * backend share each unit's f32 buffer (fsdp_share.c: rank r's shard is its slice of the one
 * buffer every rank's gathered parameters view).
 *
 * The optimizer step inside backward (cfg.optim_in_backward) writes a rank's slice of unit i
 * before loom_fsdp_finish, while its peers may still be in backward; the unit's reduce-scatter,
 * which every rank joins after its last read of the unit in that backward, is what must order
 * the two, and does not: loom_linear finishes its weight gradient (the hooks, the
 * reduce-scatter) before it multiplies by the weight for its input gradient. So such wrappers
 * keep their shards apart (fsdp_share.c); with the slices shared this test saw the MLP's weights
 * 3e-2 off. Checked: the MLP (3 units, one Linear each) and the GPT (the root unit with the tied
 * wte/lm_head kept gathered for the whole step, one unit per block), 2 and 3 ranks, f32, the
 * step in backward on and off, the buffer shared and not (LOOM_FSDP_SHARE_GATHERS=0): the same
 * bits in all four, and within the summation-order bound of test_fsdp.c / test_fsdp_gpt.c
 * (1e-5) of one process with the whole batch.
 *
 * The loads between steps (loom_fsdp_full_state, then loom_fsdp_load_full_state of a model of
 * another seed; loom_fsdp_save_sharded then loom_fsdp_load_sharded) write the slices with no
 * collective of their own: shared and unshared must give the same bits, and
 * so must rank 0's full state taken just before the load (without the barrier that ends
 * loom_fsdp_full_state it held some loaded values in 26 of 30 runs, at 3 ranks). ThreadSanitizer (the tsan label)
 * does not see these races: the reads are GEMMs and SIMD kernels it does not instrument (it
 * reported nothing with the slices shared and the weights wrong); the bits are the check. */
#include "lt.h"
#include "lt_gpt.h"
#include "fsdp_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { STEPS = 3, B = 2, T = 8 };

static loom_gpt_cfg gcfg(void) {
  loom_gpt_cfg c = {.vocab = 128, .context = T, .layers = 2, .heads = 2, .dim = 16};
  return c;
}

typedef enum { LOAD_NONE, LOAD_FULL, LOAD_SHARDED } load_kind;

typedef struct wrun {
  bool gpt, oib;
  load_kind load;  /* between step 1 and step 2 */
  const char *dir; /* LOAD_SHARDED's folder */
  float *params;   /* rank 0's full state at the end, flat in parameter order */
  float *mid;      /* LOAD_FULL: rank 0's full state taken before the load */
} wrun;

static size_t numel_of(bool gpt) {
  loom_gpt_cfg c = gcfg();
  if (gpt) return loom_gpt_numel(&c);
  return (size_t)FM_IN * FM_H1 + FM_H1 + (size_t)FM_H1 * FM_H2 + FM_H2 + (size_t)FM_H2 * FM_OUT +
         FM_OUT;
}

static int make_model(bool gpt, uint64_t seed, loom_module **m) {
  loom_gpt_cfg c = gcfg();
  return gpt ? loom_nn_gpt_create(&c, seed, m) : fm_create(seed, m);
}

static int backward(const wrun *r, loom_module *m, int64_t row0, int64_t rows) {
  return r->gpt ? lt_gpt_backward(m, row0, rows, T, LOOM_AUTOCAST_OFF, 1.0f, NULL)
                : fm_backward(m, row0, rows, LOOM_AUTOCAST_OFF, 1.0f, NULL);
}

/* The full state (every unit gathered in turn, rank 0 copying it out: the peers may still read
 * the last unit when a rank returns), then every rank loads a model of another seed (each
 * writes its slice at once). */
static int reload_full(const wrun *r, loom_fsdp *f) {
  loom_named_tensor *st = NULL;
  size_t n = 0;
  int rc = loom_fsdp_full_state(f, &st, &n);
  if (!rc && st) fm_flatten_state(st, n, r->mid);
  loom_fsdp_state_free(st, n);
  loom_module *o = NULL;
  if (!rc) rc = make_model(r->gpt, 777, &o);
  if (!rc) rc = fm_load_module(f, o);
  loom_module_free(o);
  return rc;
}

static int wrank(loom_pg *pg, void *arg) {
  wrun *r = arg;
  int rank = loom_pg_rank(pg), n = loom_pg_size(pg);
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  loom_fsdp_cfg cfg = loom_fsdp_cfg_default();
  cfg.optim_in_backward = r->oib;
  int rc = make_model(r->gpt, 1 + (uint64_t)rank, &m); /* rank 0's values win */
  if (!rc) rc = fm_wrap(pg, m, &cfg, LOOM_POOL_COMPUTE, &f, &opt);
  if (!rc && r->oib) rc = loom_fsdp_set_optim(f, opt);
  for (int s = 0; s < STEPS && !rc; s++) {
    if (s == 2 && r->load == LOAD_FULL) rc = reload_full(r, f);
    if (s == 2 && r->load == LOAD_SHARDED) {
      rc = loom_fsdp_save_sharded(f, r->dir, opt, NULL, 0);
      if (!rc) rc = loom_fsdp_load_sharded(f, r->dir, opt);
    }
    if (!rc) rc = backward(r, m, (int64_t)s * n * B + (int64_t)rank * B, B);
    if (!rc) rc = loom_fsdp_finish(f);
    if (!rc) rc = loom_fsdp_optim_step(f, opt, 1.0f); /* only checks after a step in backward */
  }
  if (!rc) rc = fm_full_state_flat(f, rank == 0 ? r->params : NULL);
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

/* One process with n x B rows a step, from rank 0's seed. */
static float *reference(bool gpt, int n) {
  loom_module *m = NULL;
  LT_OK(make_model(gpt, 1, &m));
  loom_optim *opt = NULL;
  LT_OK(fm_arena_adamw(m, &opt));
  wrun r = {.gpt = gpt};
  for (int s = 0; s < STEPS; s++) {
    LT_OK(loom_module_zero_grad(m));
    LT_OK(backward(&r, m, (int64_t)s * n * B, (int64_t)n * B));
    LT_OK(loom_optim_step(opt));
  }
  float *out = calloc(numel_of(gpt), sizeof(float));
  fm_flatten_module(m, out);
  loom_optim_free(opt);
  loom_module_free(m);
  return out;
}

static float *go(wrun *r, int n, bool share) {
  if (share) unsetenv("LOOM_FSDP_SHARE_GATHERS");
  else setenv("LOOM_FSDP_SHARE_GATHERS", "0", 1);
  r->params = calloc(numel_of(r->gpt), sizeof(float));
  r->mid = calloc(numel_of(r->gpt), sizeof(float));
  LT_OK(loom_threads_run(n, NULL, wrank, r));
  unsetenv("LOOM_FSDP_SHARE_GATHERS");
  return r->params;
}

LT_TEST(fsdp_shared_shards_optim_in_backward_bitwise_mlp_and_gpt_2_3_ranks) {
  for (int gpt = 0; gpt < 2; gpt++)
    for (int n = 2; n <= 3; n++) {
      size_t np = numel_of(gpt);
      float *ref = reference(gpt, n);
      float *base = NULL;
      for (int oib = 0; oib < 2; oib++)
        for (int share = 0; share < 2; share++) {
          wrun r = {.gpt = gpt, .oib = oib};
          float *p = go(&r, n, share);
          double d = fm_max_diff(p, ref, np);
          if (!(d <= 1e-5))
            lt_fail_at(__FILE__, __LINE__, "%s, %d ranks, step in backward %d, shared %d: %g "
                       "from one process", gpt ? "GPT" : "MLP", n, oib, share, d);
          free(r.mid);
          if (!base) {
            base = p;
            continue;
          }
          if (memcmp(base, p, np * sizeof(float)) != 0)
            lt_fail_at(__FILE__, __LINE__, "%s, %d ranks, step in backward %d, shared %d: not "
                       "the bits of the step after backward, unshared", gpt ? "GPT" : "MLP", n,
                       oib, share);
          free(p);
        }
      free(base);
      free(ref);
    }
}

static char root[256];

static void rm_root(void) { fm_rm_tree(root); }

LT_TEST(fsdp_shared_shards_loads_between_steps_bitwise) {
  snprintf(root, sizeof root, "/tmp/loom-test-share-write-%d", (int)getpid());
  atexit(rm_root);
  for (int gpt = 0; gpt < 2; gpt++)
    for (int n = 2; n <= 3; n++)
      for (int load = LOAD_FULL; load <= LOAD_SHARDED; load++) {
        size_t np = numel_of(gpt);
        wrun plain = {.gpt = gpt, .load = (load_kind)load, .dir = root};
        float *want = go(&plain, n, false);
        fm_rm_tree(root);
        for (int share = 0; share < 2; share++)
          for (int oib = 0; oib < 2; oib++) {
            if (!share && !oib) continue; /* that is `want` */
            wrun r = {.gpt = gpt, .oib = oib, .load = (load_kind)load, .dir = root};
            float *p = go(&r, n, share);
            if (memcmp(plain.mid, r.mid, np * sizeof(float)) != 0)
              lt_fail_at(__FILE__, __LINE__, "%s, %d ranks, shared %d, step in backward %d: the "
                         "full state before the load is not the unshared run's",
                         gpt ? "GPT" : "MLP", n, share, oib);
            free(r.mid);
            if (memcmp(want, p, np * sizeof(float)) != 0)
              lt_fail_at(__FILE__, __LINE__, "%s, %d ranks, %s load, shared %d, step in "
                         "backward %d: not the bits of the unshared run", gpt ? "GPT" : "MLP",
                         n, load == LOAD_FULL ? "full-state" : "sharded", share, oib);
            free(p);
            fm_rm_tree(root);
          }
        free(want);
        free(plain.mid);
      }
}
