/* test_fsdp_offload_resident.c: what offload keeps resident (issue 29: the disk tier's RSS).
 *
 * The disk tier with the allocator cache off (how it runs for its resident memory,
 * LOOM_ALLOC_CACHE_MB=0) gives a gradient's pages back as it leaves for the tier: the peers'
 * slices of the local gradient as soon as the reduce-scatter has read them, its own slice chunk
 * by chunk once written (fsdp_offload_grad.c). The release works on whole pages, so the units
 * here are wide enough that a slice spans tens of pages (the other offload tests' model
 * is a few KB). Two ranks, three steps of AdamW: the losses and the weights are the same bits
 * as without offload, with prefetch 1 and 0 and with the allocator cache on (nothing released);
 * a release that took a live byte (the rank's own slice before its write, a slice another rank
 * still reads) would change them.
 *
 * Ranks in one process share each gathered unit (fsdp_share.c); rank 0 makes each buffer and
 * does not make another while a slower rank still holds one rank 0 let go of (unless that rank
 * waits for rank 0, and never for more than a second). Rank 1 computes on 32 times rank 0's rows
 * here, so rank 0 runs ahead: the limit changes no bit (against LOOM_FSDP_SHARE_LIMIT=0) and
 * stalls nothing. What it saves is measured, not asserted: on a quiet machine this test's
 * process held at most 2 gathered units with the limit and 3 without (account 0's peak; 4 with
 * wider units), but under load a waiting rank lets rank 0 go on (BENCHMARKS.md, "The disk
 * tier's resident memory within 35%": 297 MB against 303-312). */
#include "lt.h"
#include "fsdp_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* the middle unit's weight: 61,440 elements, below the initialiser's parallel threshold (an
 * OpenMP team, which ThreadSanitizer cannot follow), yet a 120 KiB slice per rank */
enum { IN = 16, H1 = 256, H2 = 240, OUT = 4, ROWS = 8, STEPS = 3, NR = 2 };

static size_t numel(void) { return (size_t)(IN * H1 + H1 + H1 * H2 + H2 + H2 * OUT + OUT); }

typedef struct prun {
  bool offload, prefetch, cache_off;
  char dir[256];
  double loss[NR][STEPS];
  float *weights; /* rank 0's full state after the last step */
} prun;

/* One training step on fm_batch_of(row0, rows, width, classes); *loss_value gets the loss. */
static int step(loom_module *m, loom_fsdp *f, loom_optim *opt, int64_t row0, int64_t rows,
                int width, int classes, double *loss_value) {
  int rc = fm_backward_of(m, row0, rows, width, classes, LOOM_AUTOCAST_OFF, 1.0f, loss_value);
  if (!rc) rc = loom_fsdp_finish(f);
  if (!rc) rc = loom_fsdp_optim_step(f, opt, 1.0f);
  return rc;
}

static int prun_rank(loom_pg *pg, void *arg) {
  prun *r = arg;
  int rank = loom_pg_rank(pg);
  const int64_t sizes[4] = {IN, H1, H2, OUT};
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  loom_fsdp_cfg cfg = loom_fsdp_cfg_default();
  if (r->offload) {
    cfg.offload = loom_fsdp_offload_cfg_default();
    cfg.offload.tier = LOOM_FSDP_TIER_DISK;
    cfg.offload.dir = r->dir;
    cfg.offload.chunk_bytes = (size_t)16 << 10; /* 4 pages: a slice leaves in 8 chunks */
    cfg.offload.prefetch_steps = r->prefetch ? 1 : 0;
  }
  int rc = loom_nn_mlp_create(sizes, 4, LOOM_ACT_RELU, LOOM_F32, 7, &m);
  if (!rc) rc = fm_wrap(pg, m, &cfg, LOOM_POOL_HOST, &f, &opt);
  for (int s = 0; s < STEPS && !rc; s++)
    rc = step(m, f, opt, ((int64_t)s * NR + rank) * ROWS, ROWS, IN, OUT, &r->loss[rank][s]);
  if (!rc) rc = fm_full_state_flat(f, rank == 0 ? r->weights : NULL);
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

static void prun_go(prun *r) {
  r->weights = calloc(numel(), sizeof(float));
  LT_TRUE(r->weights != NULL);
  snprintf(r->dir, sizeof r->dir, "/tmp/loom-test-pages-%d", (int)getpid());
  mkdir(r->dir, 0700);
  size_t old_limit = loom_mem_cache_limit();
  if (r->cache_off) loom_mem_set_cache_limit(0);
  LT_OK(loom_threads_run(NR, NULL, prun_rank, r));
  loom_mem_set_cache_limit(old_limit);
  rmdir(r->dir); /* empty: the tier's file goes with the wrapper */
}

LT_TEST(fsdp_offload_disk_gradient_pages_given_back_same_bits) {
  prun base = {.offload = false};
  prun_go(&base);
  for (int v = 0; v < 3; v++) {
    prun o = {.offload = true, .prefetch = v != 1, .cache_off = v != 2};
    prun_go(&o);
    char what[96];
    snprintf(what, sizeof what, "disk tier, prefetch %d, allocator cache %s", o.prefetch ? 1 : 0,
             o.cache_off ? "off" : "on");
    if (memcmp(base.loss, o.loss, sizeof base.loss) != 0)
      lt_fail_at(__FILE__, __LINE__, "%s: losses differ from the run without offload", what);
    if (memcmp(base.weights, o.weights, numel() * sizeof(float)) != 0)
      lt_fail_at(__FILE__, __LINE__, "%s: weights differ from the run without offload", what);
    free(o.weights);
  }
  free(base.weights);
}

/* ---- the shared gathered units' limit --------------------------------------------------- */

enum { LW = 128, LAYERS = 4, LSTEPS = 2 };

typedef struct lrun {
  size_t unit_bytes;  /* a hidden unit's gathered buffer */
  size_t peak_bytes;  /* account 0's compute-pool peak over the steps, above its start */
  double loss[NR][LSTEPS];
} lrun;

static int lrun_rank(loom_pg *pg, void *arg) {
  lrun *r = arg;
  int rank = loom_pg_rank(pg);
  int64_t sizes[LAYERS + 1];
  for (int i = 0; i <= LAYERS; i++) sizes[i] = LW;
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  loom_fsdp_cfg cfg = loom_fsdp_cfg_default();
  cfg.offload = loom_fsdp_offload_cfg_default(); /* host tier: gathers into shared buffers */
  int rc = loom_nn_mlp_create(sizes, LAYERS + 1, LOOM_ACT_RELU, LOOM_F32, 11, &m);
  if (!rc) rc = fm_wrap(pg, m, &cfg, LOOM_POOL_HOST, &f, &opt);
  loom_fsdp_unit_info ui;
  if (!rc) rc = loom_fsdp_unit_info_get(f, 1, &ui);
  if (!rc && rank == 0) r->unit_bytes = ui.padded_numel * sizeof(float);
  int64_t rows = rank == 0 ? 2 : 64;
  loom_pool_stats s0, s1;
  if (!rc) rc = loom_pg_barrier(pg, NULL);
  if (!rc && rank == 0) {
    loom_mem_account_reset_peak(0, LOOM_POOL_COMPUTE);
    rc = loom_mem_account_stats(0, LOOM_POOL_COMPUTE, &s0);
  }
  if (!rc) rc = loom_pg_barrier(pg, NULL);
  for (int s = 0; s < LSTEPS && !rc; s++)
    rc = step(m, f, opt, (int64_t)(s * NR + rank) * 64, rows, LW, LW, &r->loss[rank][s]);
  if (!rc) rc = loom_pg_barrier(pg, NULL);
  if (!rc && rank == 0) {
    rc = loom_mem_account_stats(0, LOOM_POOL_COMPUTE, &s1);
    r->peak_bytes = s1.peak_bytes - s0.current_bytes;
  }
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

LT_TEST(fsdp_shared_gathers_limited_same_bits_and_no_stall) {
  lrun limited = {0}, unlimited = {0};
  double t0 = lt_now_s();
  LT_OK(loom_threads_run(NR, NULL, lrun_rank, &limited));
  double limited_s = lt_now_s() - t0;
  setenv("LOOM_FSDP_SHARE_LIMIT", "0", 1);
  LT_OK(loom_threads_run(NR, NULL, lrun_rank, &unlimited));
  unsetenv("LOOM_FSDP_SHARE_LIMIT");
  LT_TRUE(limited.unit_bytes > 0);
  LT_TRUE(memcmp(limited.loss, unlimited.loss, sizeof limited.loss) == 0);
  /* each wait for a stale buffer ends when the slower rank lets go, or when that rank waits
   * for rank 0 (never a second's give-up here: 2 steps of 4 units) */
  if (limited_s > 10.0)
    lt_fail_at(__FILE__, __LINE__, "the limited run took %.1f s: rank 0 stalled (it held %.1f "
               "gathered units at most, %.1f without the limit)", limited_s,
               (double)limited.peak_bytes / (double)limited.unit_bytes,
               (double)unlimited.peak_bytes / (double)limited.unit_bytes);
}
