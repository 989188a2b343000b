/* bench_init.c: building an MLP for FSDP, the three ways side by side in one run (issue 26,
 * item 4, sharded construction): (1) whole in one process (loom_nn_mlp_create); (2) whole on
 * each of R ranks (threads), then wrapped by FSDP (what `loom train --strategy fsdp` did
 * before); (3) deferred on each rank (loom_nn_set_deferred_init), then wrapped by FSDP, which
 * makes only the rank's shards from the counter-based initialisers. For each: the wall time
 * (slowest rank), the compute-pool peak per rank from loom's counters, and the process's peak
 * resident memory (VmHWM, reset through /proc/self/clear_refs before each), medians of RUNS.
 * Usage: bench_init [WIDTH [LAYERS [RANKS [RUNS]]]] (default 4096 4 4 3: the issue's
 * 54M-parameter 784-4096x4-10 MLP on 4 ranks). */
#include "bench_args.h"
#include "bench_util.h"

#include <loom/fsdp.h>

enum { MAXR = 16, MAXRUNS = 50 };

typedef struct cfg {
  int64_t sizes[16];
  size_t nsizes;
  bool deferred, fsdp;
  double secs[MAXR];
  size_t peak[MAXR];
} cfg;

static size_t account_peak(void) {
  loom_pool_stats ps = {0};
  loom_mem_account_stats(loom_mem_account(), LOOM_POOL_COMPUTE, &ps);
  return ps.peak_bytes;
}

static int build_rank(loom_pg *pg, void *arg) {
  cfg *c = arg;
  int rank = pg ? loom_pg_rank(pg) : 0;
  loom_set_num_threads(1); /* each rank (or the one process) fills on its own thread */
  loom_mem_account_reset_peak(loom_mem_account(), LOOM_POOL_COMPUTE);
  size_t base = account_peak();
  double t0 = bench_now();
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  bool was = loom_nn_set_deferred_init(c->deferred);
  int rc = loom_nn_mlp_create(c->sizes, c->nsizes, LOOM_ACT_RELU, LOOM_F32, 1, &m);
  loom_nn_set_deferred_init(was);
  if (!rc && c->fsdp) rc = loom_fsdp_create(pg, m, NULL, &f);
  c->secs[rank] = bench_now() - t0;
  c->peak[rank] = account_peak() - base;
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

/* The process's peak resident set (kB) since the last reset, and a reset. */
static long hwm_kb(bool reset) {
  long kb = -1;
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
  if (f) fclose(f);
  if (reset && (f = fopen("/proc/self/clear_refs", "w"))) {
    fputs("5", f);
    fclose(f);
  }
  return kb;
}

int main(int argc, char **argv) {
  static const bench_arg args[] = {
      {"WIDTH", "hidden width (default 4096)", NULL, 1, 1 << 16},
      {"LAYERS", "hidden layers (default 4)", NULL, 1, 14},
      {"RANKS", "FSDP ranks, as threads (default 4)", NULL, 1, MAXR},
      {"RUNS", "runs, the median reported (default 3)", NULL, 1, MAXRUNS}, {0}};
  int done = bench_args(BENCH_PROG("init"), "Building an MLP for FSDP: whole in one process, "
                        "whole on every rank, and deferred (sharded construction).", args, argc,
                        argv);
  if (done >= 0) return done;
  int64_t width = argc > 1 ? atoll(argv[1]) : 4096;
  int layers = argc > 2 ? atoi(argv[2]) : 4, ranks = argc > 3 ? atoi(argv[3]) : 4;
  int runs = argc > 4 ? atoi(argv[4]) : 3;
  cfg base = {.nsizes = 0};
  base.sizes[base.nsizes++] = 784;
  for (int i = 0; i < layers; i++) base.sizes[base.nsizes++] = width;
  base.sizes[base.nsizes++] = 10;
  static const char *const names[3] = {"whole, one process", "whole per rank, then FSDP",
                                       "deferred, FSDP shards"};
  printf("# building the MLP 784-%lldx%d-10 (median of %d runs; %d FSDP ranks as threads)\n",
         (long long)width, layers, runs, ranks);
  printf("%-28s %10s %16s %16s\n", "build", "wall s", "peak/rank MiB", "process RSS MiB");
  for (int k = 0; k < 3; k++) {
    double secs[MAXRUNS], peak[MAXRUNS], rss[MAXRUNS];
    for (int r = 0; r < runs; r++) {
      cfg c = base;
      c.fsdp = k > 0;
      c.deferred = k == 2;
      hwm_kb(true);
      long before = hwm_kb(false);
      if (k == 0) BENCH_CHECK(build_rank(NULL, &c));
      else BENCH_CHECK(loom_threads_run(ranks, NULL, build_rank, &c));
      secs[r] = peak[r] = 0;
      for (int q = 0; q < (k ? ranks : 1); q++) {
        if (c.secs[q] > secs[r]) secs[r] = c.secs[q];
        if ((double)c.peak[q] > peak[r]) peak[r] = (double)c.peak[q];
      }
      rss[r] = (double)(hwm_kb(false) - before) / 1024.0;
    }
    printf("%-28s %10.3f %16.1f %16.1f\n", names[k], bench_median(secs, runs),
           bench_median(peak, runs) / 1048576.0, bench_median(rss, runs));
  }
  return 0;
}
