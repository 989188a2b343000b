/* train_dry.c: the dry run of a `loom train` run (train_run_dry, train_api.h): setup, two steps
 * and an evaluation batch under loom's dry run, each phase's peak read from loom's counters,
 * and the second step's collective bytes from the wrapper's. */
#include "trainer.h"

#include <string.h>

/* This rank's compute-pool peak since the last call, with what each tag held then (its
 * account's: a rank's own, or account 0's, the whole process, with one rank), and a fresh
 * start for the next phase. */
static void phase_peak(train_dry_phase *ph) {
  loom_pool_stats ps = {0};
  int a = loom_mem_account();
  loom_mem_account_stats(a, LOOM_POOL_COMPUTE, &ps);
  if (ph) {
    ph->peak = ps.peak_bytes;
    loom_mem_account_tags(a, LOOM_POOL_COMPUTE, ph->tag);
  }
  loom_mem_account_reset_peak(a, LOOM_POOL_COMPUTE);
}

/* This rank's bytes in a pool now. */
static size_t pool_now(loom_pool pool) {
  loom_pool_stats ps = {0};
  loom_mem_account_stats(loom_mem_account(), pool, &ps);
  return ps.current_bytes;
}

/* The wrapper's collective bytes so far: gathers, reduce-scatters, replica and DDP all-reduces;
 * then the offload tier's bytes read and written. */
static void step_bytes(const trainer *t, uint64_t c[6]) {
  loom_fsdp_stats fs;
  loom_ddp_stats ds;
  loom_fsdp *f = train_par_fsdp(t->par);
  loom_ddp *d = train_par_ddp(t->par);
  if (f && !loom_fsdp_stats_get(f, &fs)) {
    c[0] = fs.gather_bytes;
    c[1] = fs.reduce_bytes;
    c[2] = fs.replica_bytes;
    c[4] = fs.offload_from_bytes;
    c[5] = fs.offload_to_bytes;
  }
  if (d && !loom_ddp_stats_get(d, &ds)) c[3] = ds.bytes;
}

/* The FSDP units, for the plan's timeline (train_dry_result). */
static void dry_units(const trainer *t, train_dry_result *r) {
  loom_fsdp *f = train_par_fsdp(t->par);
  size_t n = f ? loom_fsdp_unit_count(f) : 0;
  if (n > TRAIN_PLAN_MAX_UNITS) return;
  for (size_t u = 0; u < n; u++) {
    loom_fsdp_unit_info in;
    if (loom_fsdp_unit_info_get(f, u, &in)) return;
    r->unit[u] = (struct train_dry_unit){in.numel, in.padded_numel, in.shard_numel,
                                         strcmp(t->o->reshard, "yes") != 0 || !in.name[0] ||
                                             u == n - 1};
  }
  r->nunits = n;
}

int train_run_dry(const train_opts *o, loom_pg *pg, train_dry_result *r) {
  trainer t;
  memset(&t, 0, sizeof t);
  memset(r, 0, sizeof *r);
  t.o = o;
  t.dry = true;
  phase_peak(NULL);
  int rc = trainer_setup(&t, pg);
  phase_peak(&r->build);
  if (!rc) r->params = loom_module_numel(t.model.root);
  uint64_t c0[6] = {0}, c1[6] = {0};
  if (!rc) loom_mem_dry_mark_written(); /* the step writes the gradients made untouched */
  for (int k = 0; k < 2 && !rc; k++) { /* the second step runs with what the first left */
    double loss = 0;
    loom_step_result res;
    step_bytes(&t, c0);
    rc = trainer_step(&t, &loss, &res);
    step_bytes(&t, c1);
  }
  r->gather_bytes = c1[0] - c0[0];
  r->reduce_scatter_bytes = c1[1] - c0[1];
  r->replica_bytes = c1[2] - c0[2];
  r->allreduce_bytes = c1[3] - c0[3];
  if (!rc) dry_units(&t, r);
  r->offload_read_bytes = c1[4] - c0[4];
  r->offload_write_bytes = c1[5] - c0[5];
  phase_peak(&r->train);
  r->host_bytes = pool_now(LOOM_POOL_HOST); /* what offload keeps once a step has run */
  r->file_bytes = pool_now(LOOM_POOL_FILE);
  if (!rc && (t.lead || t.fsdp)) rc = trainer_evaluate(&t, &t.accuracy);
  phase_peak(&r->eval);
  trainer_teardown(&t);
  return rc;
}
