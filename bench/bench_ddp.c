/* bench_ddp.c: DDP on the threads backend, 2 ranks, in two parts.
 *
 * Overlap (MLP 784-4096-4096-4096-10, batch 64 per rank, f32): the same training step with
 *   - DDP as loom runs it (reverse-order buckets launched from the gradient hooks, the buckets
 *     views of the module's gradient arena),
 *   - the specification's eager path as it is written (its Option 1 and usage example): a
 *     bucket manager over the parameters' own gradients, largest-first buckets; after
 *     backward, prepare (copy in) and reduce every bucket, wait for all, copy back all,
 *   - loom's buckets reduced eagerly (loom_ddp with overlap off, the same reverse-order buckets,
 *     views of the arena): no copies, so against the overlapped path it isolates what overlap
 *     alone gains (before loom's buckets were views of the arena this line used largest-first
 *     buckets; over an arena those are copied in and out now, ddp.h),
 *   - no bucketing (a bucket per parameter, launched from the hooks),
 * reporting collectives per step, the step time, the communication time, the exposed
 * communication (waiting after backward's compute ended) and when the first bucket was
 * launched relative to backward's start and end. Target: exposed(overlapped) <= 50% of the
 * eager path's communication time, and the overlapped step faster than the eager one.
 *
 * Throughput (MLP 784-1024-1024-10, batch 256 per rank, 1 compute thread per rank, SGD): loom
 * DDP samples/s in f32 and under bf16 autocast, beside PyTorch 1.13 DDP (gloo, 2 processes, 1
 * thread each in both its pools, torch's and OpenBLAS's; bench/torch_ddp.py) in the same run
 * when /usr/bin/python3 has torch, the two alternating for 5 rounds (the machine's state drifts between runs); the ratio is the median
 * of the rounds' ratios. Target: loom >= 1.5x PyTorch. Each round also runs loom's step with
 * DDP's sync off (same buffers, no communication): the difference is what DDP costs a step;
 * and one rank alone (1 rank, 1 thread, no DDP): twice its samples/s is the most 2 ranks could
 * give on 2 cores, loom's own limit, and the bench reports the fraction of it DDP reaches.
 *
 * Each figure is the median over the timed steps (after warm-up). The 2 cores are shared by
 * both ranks' compute and the collectives' copies, so communication competes with compute.
 * Usage: bench_ddp [steps] [overlap|f32|bf16] (one part only; or `loom bench ddp ...`). */
#include "bench_args.h"
#include "bench_util.h"

#include <loom/ddp.h>
#include <loom/dist.h>

#define MAXSTEPS 64
#define WARM 3
#define ROUNDS 5 /* throughput: loom and PyTorch alternate */

typedef struct config {
  const char *name;
  const int64_t *sizes;
  int nsizes, batch, steps;
  bool bf16;
  bool spec_eager; /* the specification's bucket manager path instead of loom_ddp */
  bool no_sync;    /* loom_ddp with sync off: the same step and buffers, no communication */
  int ranks;       /* 0: 2 */
  int threads;     /* compute threads per rank; 0: the rank's share (loom_pg_compute_threads) */
  loom_ddp_cfg ddp;
} config;

typedef struct result {
  double step_s, bwd_s, exposed_s, comm_s, first_launch_s, lead_s, coll_per_step;
  size_t buckets;
} result;

typedef struct job {
  const config *c;
  result r;
} job;

static int rank_main(loom_pg *pg, void *arg) {
  job *j = arg;
  const config *c = j->c;
  loom_set_num_threads(c->threads ? c->threads : loom_pg_compute_threads(pg));
  loom_module *m = NULL;
  BENCH_CHECK(loom_nn_mlp_create(c->sizes, c->nsizes, LOOM_ACT_RELU, LOOM_F32, 1, &m));
  size_t np = loom_module_param_count(m);
  loom_tensor *params[16];
  for (size_t i = 0; i < np; i++) {
    loom_param p;
    BENCH_CHECK(loom_module_param(m, i, &p));
    params[i] = p.value;
  }
  loom_ddp *d = NULL;
  loom_bucket_manager *bm = NULL;
  loom_tensor *grads[16] = {0};
  if (c->spec_eager) { /* the parameters' own gradient buffers, and a manager over them */
    for (size_t i = 0; i < np; i++) {
      BENCH_CHECK(loom_tensor_zeros(LOOM_F32, loom_tensor_ndim(params[i]),
                                    loom_tensor_shape(params[i]), &grads[i]));
      BENCH_CHECK(loom_tensor_set_grad(params[i], grads[i]));
    }
    BENCH_CHECK(loom_bucket_manager_create(pg, grads, np, &c->ddp.buckets, &bm));
  } else {
    BENCH_CHECK(loom_ddp_create(pg, params, NULL, np, &c->ddp, &d));
    if (c->no_sync) BENCH_CHECK(loom_ddp_set_sync(d, false));
  }
  loom_param_seg segs[16];
  for (size_t i = 0; i < np; i++)
    segs[i] = (loom_param_seg){NULL, loom_tensor_data(params[i]),
                               loom_tensor_data(loom_tensor_grad(params[i])),
                               loom_tensor_numel(params[i]), 0};
  loom_sgd_cfg sc = loom_sgd_cfg_default();
  sc.lr = 0.01;
  loom_optim *opt = NULL;
  BENCH_CHECK(loom_optim_create_sgd(segs, np, &sc, &opt));
  srand(1 + (unsigned)loom_pg_rank(pg));
  int64_t xs[2] = {c->batch, c->sizes[0]};
  loom_tensor *x = bench_rand_tensor(2, xs, LOOM_F32, 1.0f), *y = NULL;
  BENCH_CHECK(loom_tensor_empty(LOOM_I64, 1, xs, &y));
  for (int64_t i = 0; i < c->batch; i++) ((int64_t *)loom_tensor_data(y))[i] = rand() % c->sizes[c->nsizes - 1];
  double step_t[MAXSTEPS], bwd_t[MAXSTEPS], exp_t[MAXSTEPS], comm_t[MAXSTEPS], first_t[MAXSTEPS],
      lead_t[MAXSTEPS];
  loom_ddp_stats before = {0}, after = {0};
  int n = 0;
  for (int s = 0; s < WARM + c->steps; s++) {
    if (d) BENCH_CHECK(loom_ddp_stats_get(d, &before));
    double t0 = bench_now();
    /* as PyTorch's zero_grad(set_to_none=True) in torch_ddp.py: the next backward overwrites */
    for (size_t i = 0; i < np; i++) BENCH_CHECK(loom_tensor_zero_grad_lazy(params[i]));
    loom_autocast_token tok;
    BENCH_CHECK(loom_autocast_enter(c->bf16 ? LOOM_AUTOCAST_BF16 : LOOM_AUTOCAST_OFF, NULL, &tok));
    loom_tensor *logits = NULL, *loss = NULL;
    BENCH_CHECK(loom_module_forward(m, x, &logits));
    BENCH_CHECK(loom_cross_entropy(logits, y, LOOM_REDUCTION_MEAN, -100, &loss));
    BENCH_CHECK(loom_autocast_exit(&tok));
    double tb = bench_now();
    BENCH_CHECK(loom_backward(loss, NULL, false)); /* DDP waits for its last bucket inside */
    double te = bench_now();
    if (d) {
      BENCH_CHECK(loom_ddp_finish(d));
    } else { /* the specification's usage example, averaging as DDP does */
      BENCH_CHECK(loom_bucket_manager_reduce_all(bm, LOOM_AVG));
      BENCH_CHECK(loom_bucket_manager_wait_all(bm));
      BENCH_CHECK(loom_bucket_manager_copy_back_all(bm));
    }
    double tc = bench_now();
    BENCH_CHECK(loom_optim_step(opt));
    double t1 = bench_now();
    loom_tensor_free(logits);
    loom_tensor_free(loss);
    if (d) {
      BENCH_CHECK(loom_ddp_stats_get(d, &after));
    } else { /* all of it is exposed: nothing runs before backward ends */
      after.last_exposed_s = after.comm_s = tc - te;
      after.first_launch_lead_s = 0;
      after.collectives = loom_bucket_manager_count(bm);
      after.buckets = loom_bucket_manager_count(bm);
    }
    if (s < WARM) continue;
    step_t[n] = t1 - t0;
    bwd_t[n] = te - tb;
    exp_t[n] = after.last_exposed_s;
    comm_t[n] = after.comm_s - before.comm_s;
    lead_t[n] = after.first_launch_lead_s;
    /* loom_ddp finishes inside backward (its queued callback); the spec's path after it */
    first_t[n] = d ? (te - tb - after.last_exposed_s) - after.first_launch_lead_s : te - tb;
    n++;
  }
  if (loom_pg_rank(pg) == 0) {
    loom_ddp_stats st = after;
    if (d) BENCH_CHECK(loom_ddp_stats_get(d, &st));
    j->r.step_s = bench_median(step_t, n);
    j->r.bwd_s = bench_median(bwd_t, n);
    j->r.exposed_s = bench_median(exp_t, n);
    j->r.comm_s = bench_median(comm_t, n);
    j->r.first_launch_s = bench_median(first_t, n);
    j->r.lead_s = bench_median(lead_t, n);
    j->r.buckets = st.buckets;
    /* collectives per step, without the start-up checks and broadcasts */
    j->r.coll_per_step = (double)(after.collectives - before.collectives);
  }
  loom_optim_free(opt);
  loom_ddp_free(d);
  loom_bucket_manager_free(bm);
  for (size_t i = 0; i < np; i++) loom_tensor_free(grads[i]);
  loom_tensor_free(x);
  loom_tensor_free(y);
  loom_module_free(m);
  return LOOM_OK;
}

static result run(const config *c) {
  job j = {.c = c};
  BENCH_CHECK(loom_threads_run(c->ranks ? c->ranks : 2, NULL, rank_main, &j));
  return j.r;
}

/* PyTorch DDP samples/s, or 0 if torch is not there; tthr gets the thread counts (torch,
 * OpenBLAS) its rank 0 ran with: 1 and 1, as loom's ranks (bench_torch_cmd, torch_ddp.py). */
static double torch_ddp(const char *sizes, int batch, const char *dtype, int tthr[2]) {
  char py[96], cmd[1024];
  bench_torch_cmd(py, sizeof py, 1);
  snprintf(cmd, sizeof cmd, "%s %s/bench/torch_ddp.py %s %d 30 %s 2 2>/dev/null", py,
           LOOM_SOURCE_DIR, sizes, batch, dtype);
  FILE *p = popen(cmd, "r");
  if (!p) return 0;
  double v = 0;
  char line[256];
  while (fgets(line, sizeof line, p))
    if (!bench_torch_threads(line, tthr)) sscanf(line, "torch_ddp %*s %*d %lf", &v);
  pclose(p);
  return v;
}

/* The overlap part: the four ways to reduce the big MLP's gradients. */
static void overlap_part(int steps) {
  static const int64_t big[] = {784, 4096, 4096, 4096, 10};
  printf("# DDP overlap: MLP 784-4096-4096-4096-10, batch 64 per rank, f32, 2 ranks (threads), "
         "median of %d steps\n", steps);
  printf("%-22s %7s %9s %9s %9s %9s %9s %12s\n", "path", "buckets", "coll/step", "step ms",
         "bwd ms", "comm ms", "exposed", "1st launch");
  config overlap = {.name = "overlapped (loom)", .sizes = big, .nsizes = 5, .batch = 64,
                    .steps = steps};
  overlap.ddp = loom_ddp_cfg_default();
  config eager = overlap;
  eager.name = "eager (spec, copies)";
  eager.spec_eager = true;
  eager.ddp.overlap = false;
  eager.ddp.buckets.policy = LOOM_BUCKET_LARGEST_FIRST;
  config eager_views = overlap;
  eager_views.name = "eager (loom views)";
  eager_views.ddp.overlap = false;
  config unbucketed = overlap;
  unbucketed.name = "unbucketed (per param)";
  unbucketed.ddp.buckets.bucket_bytes = 1;
  unbucketed.ddp.buckets.first_bucket_bytes = 1;
  const config *cs[] = {&overlap, &eager, &eager_views, &unbucketed};
  result rs[4];
  for (int i = 0; i < 4; i++) {
    rs[i] = run(cs[i]);
    printf("%-22s %7zu %9.0f %9.1f %9.1f %9.1f %9.1f %5.1f/%5.1fms\n", cs[i]->name, rs[i].buckets,
           rs[i].coll_per_step, rs[i].step_s * 1e3, rs[i].bwd_s * 1e3, rs[i].comm_s * 1e3,
           rs[i].exposed_s * 1e3, rs[i].first_launch_s * 1e3,
           (rs[i].first_launch_s + rs[i].lead_s) * 1e3);
  }
  printf("(1st launch: when the first bucket's all-reduce started / when backward's compute "
         "ended, ms after backward began)\n");
  double ratio = rs[0].exposed_s / rs[1].exposed_s;
  printf("exposed communication, overlapped / eager path's communication: %.2f (target <= 0.50: "
         "%s); step overlapped / eager: %.2f (target < 1: %s)\n",
         ratio, ratio <= 0.5 ? "met" : "NOT met", rs[0].step_s / rs[1].step_s,
         rs[0].step_s < rs[1].step_s ? "met" : "NOT met");
  printf("overlap alone (overlapped / eager on the same views): exposed %.2f, step %.2f\n",
         rs[0].exposed_s / rs[2].exposed_s, rs[0].step_s / rs[2].step_s);
}

int bench_ddp_main(int argc, char **argv) {
  static const bench_arg args[] = {
      {"STEPS", "timed steps of the overlap part (default 10)", NULL, 3, MAXSTEPS - WARM},
      {"PART", "what runs (default all)", "all|overlap|f32|bf16", 0, 0}, {0}};
  int done = bench_args(BENCH_PROG("ddp"), "DDP on the threads backend, 2 ranks: overlap of "
                        "communication with backward, and throughput beside PyTorch.", args,
                        argc, argv);
  if (done >= 0) return done;
  int steps = argc > 1 ? atoi(argv[1]) : 10;
  const char *part = argc > 2 ? argv[2] : "all";
  static const int64_t small[] = {784, 1024, 1024, 10};
  if (!strcmp(part, "all") || !strcmp(part, "overlap")) overlap_part(steps);
  if (!strcmp(part, "overlap")) return 0;

  printf("\n# DDP throughput: MLP 784-1024-1024-10, batch 256 per rank, 2 ranks x 1 thread, SGD; "
         "%d rounds of loom then PyTorch, ratio per round, medians\n", ROUNDS);
  printf("%-6s %14s %14s %7s  %s\n", "dtype", "loom samples/s", "torch samples/s", "ratio",
         "(rounds)");
  for (int bf = 0; bf < 2; bf++) {
    if (strcmp(part, "all") && strcmp(part, bf ? "bf16" : "f32")) continue;
    double ls[ROUNDS], ts[ROUNDS], rr[ROUNDS], cost[ROUNDS], one[ROUNDS], frac[ROUNDS];
    int have = 0, tthr[2] = {-1, -1};
    for (int k = 0; k < ROUNDS; k++) {
      config t = {.name = "throughput", .sizes = small, .nsizes = 4, .batch = 256,
                  .steps = steps * 2, .bf16 = bf == 1};
      t.ddp = loom_ddp_cfg_default();
      double step = run(&t).step_s;
      config local = t;
      local.no_sync = true;
      cost[k] = step - run(&local).step_s;
      config alone = local; /* one rank alone on the machine, 1 thread: 2x it is loom's limit */
      alone.ranks = 1;
      alone.threads = 1;
      one[k] = 256 / run(&alone).step_s;
      ls[k] = 2.0 * 256 / step;
      frac[k] = ls[k] / (2.0 * one[k]);
      ts[k] = torch_ddp("784-1024-1024-10", 256, bf ? "bf16" : "f32", tthr);
      if (ts[k] > 0) rr[have++] = ls[k] / ts[k];
    }
    char each[128] = "";
    for (int k = 0, o = 0; k < have && o < (int)sizeof each; k++)
      o += snprintf(each + o, sizeof each - (size_t)o, "%s%.2f", k ? " " : "", rr[k]);
    double lm = bench_median(ls, ROUNDS);
    if (have == ROUNDS) {
      double r = bench_median(rr, ROUNDS);
      printf("%-6s %14.0f %14.0f %7.2f  (%s; target >= 1.5: %s; torch threads %d openblas %d "
             "per rank)\n",
             bf ? "bf16" : "f32", lm, bench_median(ts, ROUNDS), r, each,
             r >= 1.5 ? "met" : "NOT met", tthr[0], tthr[1]);
    } else {
      printf("%-6s %14.0f %14s\n", bf ? "bf16" : "f32", lm, "(no torch)");
    }
    printf("       DDP's cost per step (step - the same step with sync off): median %.2f ms of a "
           "%.2f ms step\n", bench_median(cost, ROUNDS) * 1e3, 2.0 * 256 / lm * 1e3);
    char fr[128] = "";
    for (int k = 0, o = 0; k < ROUNDS && o < (int)sizeof fr; k++)
      o += snprintf(fr + o, sizeof fr - (size_t)o, "%s%.2f", k ? " " : "", frac[k]);
    printf("       loom's limit, 2 x one rank alone (1 thread, no DDP): %.0f samples/s; DDP reaches "
           "%.2f of it (%s)\n", 2.0 * bench_median(one, ROUNDS), bench_median(frac, ROUNDS), fr);
  }
  return 0;
}

#ifndef LOOM_TOOL
int main(int argc, char **argv) { return bench_ddp_main(argc, argv); }
#endif
