/* bench_fsdp.c: FSDP against DDP on the threads backend: memory per rank, step time and exposed
 * communication, side by side in one run.
 *
 * Model: MLP 784-4096-4096-4096-4096-10 (loom_nn_mlp_create, ReLU, f32: 53.6 M parameters, so
 * 16 bytes x parameters = 858 MB of f32 AdamW training state: values, gradients, two moments),
 * batch 64 per rank of seeded random data, cross-entropy (mean), AdamW (loom_adamw_cfg_default),
 * each rank on one compute thread (loom_pg_compute_threads: 2 cores shared out). A step:
 *   DDP:  zero grads (lazy, as bench_ddp), forward, loss, backward, loom_ddp_finish, AdamW over
 *         each parameter's data and loom_tensor_grad (in the module's gradient arena, which DDP's
 *         buckets are views of);
 *   FSDP: forward, loss, backward, loom_fsdp_finish, AdamW over loom_fsdp_segments (the shards).
 * FSDP runs with its defaults (one unit per Linear, reshard after forward, one local gradient
 * at a time) with prefetch 1 (the default: forward_prefetch = backward_prefetch = 1) and
 * prefetch 0 (both 0); the memory runs add prefetch 1 with limit_reduce_scatters off.
 *
 * Memory: each rank's compute-pool peak on its account (loom_mem_account_stats(rank + 1,
 * LOOM_POOL_COMPUTE)) over the timed steps, after one warm-up step (the optimizer makes its
 * state there). The peak is reset (loom_mem_account_reset_peak) at each phase boundary of a
 * step (forward + loss, backward + finish, optimizer) and read at its end, so the step's peak,
 * the maximum over its phases, is the peak since the reset after warm-up, and we also see
 * which phase holds it. "state" is the rank's current bytes between steps (what persists).
 * The FSDP model the peak is compared with, from the unit sizes (loom_fsdp_unit_info_get):
 *   16 bytes x this rank's shard elements (f32 values and gradients, AdamW's two moments)
 *   + activations: batch x (input + each hidden width + output + one hidden width) x 4 bytes
 *     (each ReLU's output, which the next linear keeps for backward, and one pre-ReLU output
 *     alive at a time; DDP's forward measures the same, a few MB here)
 *   + units in flight, the larger of
 *       forward:  the running unit gathered + forward_prefetch units gathered ahead;
 *       backward: the running unit gathered + backward_prefetch units gathered ahead
 *                 + its f32 local gradient (padded length), + the previous unit's f32 local
 *                 gradient while its reduce-scatter is in flight only when
 *                 cfg.limit_reduce_scatters is off ("RS queued" rows): by default FSDP waits
 *                 for that reduce-scatter before it makes the next local gradient.
 *   A gathered unit is padded_numel x the gathered dtype's size (4 for f32, 2 under bf16); under
 *   bf16 a second figure adds the temporaries loom makes (fsdp_model).
 * Targets (the FSDP issue): FSDP peak <= 1.1 x that model, <= 0.65 x DDP's at 2 ranks,
 * <= 0.4 x DDP's at 4 ranks.
 *
 * Speed, 2 ranks: rounds of DDP, FSDP prefetch 1, FSDP prefetch 0, FSDP prefetch 1 again
 * with the allocator cache raised to 2 GiB for that run, and FSDP prefetch 1 with each rank
 * gathering into its own buffer (LOOM_FSDP_SHARE_GATHERS=0: how every gather ran before the
 * ranks of the threads backend shared one, fsdp_share.c) (each a fresh loom_threads_run, one
 * warm-up step, then `steps` timed steps; rank 0's step times, and the process's CPU time per
 * step, which a loaded machine disturbs less: on 2 cores with 2 busy ranks the wall time of a
 * quiet machine follows it; "r0 cpu" is rank 0's own thread), at least 3 rounds; the ratio
 * FSDP / DDP per round, median over rounds (after one untimed DDP run). Targets: FSDP <= 1.15 x
 * DDP; prefetch 1 no slower than prefetch 0.
 * Exposed communication (loom_fsdp_stats over the timed steps: comm_s sums every collective's
 * issue-to-completion time, exposed_s the time compute waited for one): exposed / comm with
 * prefetch 1 and 0. Target: exposed <= 30% of comm with prefetch. The 2-rank memory figures
 * come from the same runs (maximum over the rounds).
 *
 * Usage: bench_fsdp [steps] [all|speed|mem4|bf16] [rounds] (or `loom bench fsdp ...`).
 *   steps: timed steps per run of the speed rounds (default 3); rounds: speed rounds at 2
 *   ranks (default 3); the 4-rank and bf16 memory runs time one step after the warm-up (a
 *   step's peak repeats exactly from step to step: the 2-rank peaks of every round agree);
 *   speed: the 2-rank rounds only; mem4: the 4-rank memory comparison only; bf16: mixed
 *   precision only (FSDP with cfg.mp = bf16 and DDP, both under bf16 autocast, 2 and 4 ranks;
 *   not part of all). all (default): speed and mem4.
 * The allocator cache limit (LOOM_ALLOC_CACHE_MB, printed at the top) matters for FSDP's time:
 * every gather and local gradient is a fresh block of up to 67 MB, and blocks the cache cannot
 * keep are page-faulted in again each step (the "faults/st" column counts the process's minor
 * page faults per step); hence the fourth speed configuration. Cached blocks are not counted
 * in any pool, so the memory figures do not depend on it. */
#include "bench_args.h"
#include "bench_util.h"

#include <loom/ddp.h>
#include <loom/cpu.h>
#include <loom/dist.h>
#include <loom/fsdp.h>

#include <sys/resource.h>
#include <unistd.h>

#define MAXR 4
#define MAXSTEPS 32
#define MAXROUNDS 16
#define MAXUNITS 8
#define BATCH 64
#define MB(x) ((double)(x) / 1e6)

static const int64_t sizes[] = {784, 4096, 4096, 4096, 4096, 10};
#define NSIZES 6

typedef struct config {
  const char *name;
  int ranks;
  bool fsdp;
  int prefetch; /* FSDP: forward_prefetch = backward_prefetch */
  bool bf16;    /* forward under bf16 autocast; FSDP: cfg.mp = loom_fsdp_mp_cfg_for(LOOM_BF16) */
  int steps;    /* timed steps after one warm-up step */
  int cache_mb; /* > 0: the allocator cache limit for this run (restored after it) */
  bool rs_queue; /* FSDP: limit_reduce_scatters off (reduce-scatters may queue up) */
  bool own_buffers; /* FSDP: LOOM_FSDP_SHARE_GATHERS=0, each rank gathers into its own buffer
                       (the only way before issue 27) */
} config;

typedef struct result {
  /* per rank, bytes: peak over the timed steps (and by phase), state between steps */
  double peak[MAXR], peak_fwd[MAXR], peak_bwd[MAXR], peak_opt[MAXR], state[MAXR];
  double after_fwd[MAXR]; /* current bytes when forward + loss end (last timed step) */
  double before_fwd; /* rank 0: current bytes when forward starts (for activations) */
  /* rank 0, medians over the timed steps, seconds */
  double step_s, fwd_s, bwd_s, opt_s;
  /* rank 0, per step over the timed steps */
  double comm_s, exposed_s, gathers, reduce_scatters, gather_mb, reduce_mb;
  double faults; /* minor page faults of the whole process per timed step */
  double cpu_s;  /* CPU time of the whole process per timed step */
  double rank_cpu_s; /* rank 0's own thread's CPU time per timed step (its compute; the rest of
                        cpu_s is rank 1 and the progress threads' collectives) */
  size_t params, shard_numel, units, padded[MAXUNITS];
  bool limit_rs; /* FSDP: limit_reduce_scatters as run */
} result;

typedef struct job {
  const config *c;
  result r;
} job;

static double acct_current(int acct) {
  loom_pool_stats st;
  BENCH_CHECK(loom_mem_account_stats(acct, LOOM_POOL_COMPUTE, &st));
  return (double)st.current_bytes;
}

/* The account's peak since the last reset, then a reset (the next phase starts here). */
static double acct_phase_peak(int acct) {
  loom_pool_stats st;
  BENCH_CHECK(loom_mem_account_stats(acct, LOOM_POOL_COMPUTE, &st));
  loom_mem_account_reset_peak(acct, LOOM_POOL_COMPUTE);
  return (double)st.peak_bytes;
}

static double maxd(double a, double b) { return a > b ? a : b; }

static double minor_faults(void) {
  struct rusage ru;
  return getrusage(RUSAGE_SELF, &ru) ? 0 : (double)ru.ru_minflt;
}

static int rank_main(loom_pg *pg, void *arg) {
  job *j = arg;
  const config *c = j->c;
  int rank = loom_pg_rank(pg), acct = rank + 1;
  loom_set_num_threads(loom_pg_compute_threads(pg));
  loom_module *m = NULL;
  BENCH_CHECK(loom_nn_mlp_create(sizes, NSIZES, LOOM_ACT_RELU, LOOM_F32, 1, &m));
  size_t np = loom_module_param_count(m);
  loom_tensor *params[16];
  size_t total = 0;
  for (size_t i = 0; i < np; i++) {
    loom_param p;
    BENCH_CHECK(loom_module_param(m, i, &p));
    params[i] = p.value;
    total += p.numel;
  }
  loom_ddp *d = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  loom_adam_cfg ac = loom_adamw_cfg_default();
  loom_param_seg segs[16];
  if (c->fsdp) {
    loom_fsdp_cfg fc = loom_fsdp_cfg_default();
    fc.forward_prefetch = fc.backward_prefetch = c->prefetch;
    if (c->bf16) fc.mp = loom_fsdp_mp_cfg_for(LOOM_BF16);
    if (c->rs_queue) fc.limit_reduce_scatters = false;
    if (rank == 0) j->r.limit_rs = fc.limit_reduce_scatters;
    BENCH_CHECK(loom_fsdp_create(pg, m, &fc, &f));
    const loom_param_seg *fs = NULL;
    size_t nseg = 0;
    BENCH_CHECK(loom_fsdp_segments(f, &fs, &nseg));
    BENCH_CHECK(loom_optim_create_adamw(fs, nseg, &ac, &opt));
  } else {
    loom_ddp_cfg dc = loom_ddp_cfg_default();
    BENCH_CHECK(loom_ddp_create(pg, params, NULL, np, &dc, &d));
    for (size_t i = 0; i < np; i++) /* the arena's gradients: DDP's buckets view them */
      segs[i] = (loom_param_seg){NULL, loom_tensor_data(params[i]),
                                 loom_tensor_data(loom_tensor_grad(params[i])),
                                 loom_tensor_numel(params[i]), 0};
    BENCH_CHECK(loom_optim_create_adamw(segs, np, &ac, &opt));
  }
  srand(1 + (unsigned)rank);
  int64_t xs[2] = {BATCH, sizes[0]};
  loom_tensor *x = bench_rand_tensor(2, xs, LOOM_F32, 1.0f), *y = NULL;
  BENCH_CHECK(loom_tensor_empty(LOOM_I64, 1, xs, &y));
  for (int64_t i = 0; i < BATCH; i++)
    ((int64_t *)loom_tensor_data(y))[i] = rand() % sizes[NSIZES - 1];

  result *r = &j->r;
  double step_t[MAXSTEPS], fwd_t[MAXSTEPS], bwd_t[MAXSTEPS], opt_t[MAXSTEPS];
  double pf = 0, pb = 0, po = 0;
  loom_fsdp_stats before = {0}, after = {0};
  double faults0 = 0, cpu0 = 0, tcpu0 = 0;
  for (int s = 0; s < 1 + c->steps; s++) {
    bool timed = s > 0;
    if (s == 1) { /* after the warm-up step: what persists, and the peak from here */
      r->state[rank] = acct_current(acct);
      if (f) BENCH_CHECK(loom_fsdp_stats_get(f, &before));
      faults0 = minor_faults();
      cpu0 = bench_process_cpu_now();
      tcpu0 = bench_cpu_now();
    }
    loom_mem_account_reset_peak(acct, LOOM_POOL_COMPUTE);
    if (rank == 0 && s == 1) r->before_fwd = acct_current(acct);
    double t0 = bench_now();
    if (d)
      for (size_t i = 0; i < np; i++) BENCH_CHECK(loom_tensor_zero_grad_lazy(params[i]));
    loom_autocast_token tok;
    BENCH_CHECK(loom_autocast_enter(c->bf16 ? LOOM_AUTOCAST_BF16 : LOOM_AUTOCAST_OFF, NULL, &tok));
    loom_tensor *logits = NULL, *loss = NULL;
    BENCH_CHECK(loom_module_forward(m, x, &logits));
    BENCH_CHECK(loom_cross_entropy(logits, y, LOOM_REDUCTION_MEAN, -100, &loss));
    BENCH_CHECK(loom_autocast_exit(&tok));
    double t1 = bench_now();
    double p1 = acct_phase_peak(acct);
    r->after_fwd[rank] = acct_current(acct);
    BENCH_CHECK(loom_backward(loss, NULL, false));
    BENCH_CHECK(d ? loom_ddp_finish(d) : loom_fsdp_finish(f));
    double t2 = bench_now();
    double p2 = acct_phase_peak(acct);
    loom_tensor_free(logits);
    loom_tensor_free(loss);
    BENCH_CHECK(loom_optim_step(opt));
    double t3 = bench_now();
    double p3 = acct_phase_peak(acct);
    if (!timed) continue;
    pf = maxd(pf, p1), pb = maxd(pb, p2), po = maxd(po, p3);
    step_t[s - 1] = t3 - t0;
    fwd_t[s - 1] = t1 - t0;
    bwd_t[s - 1] = t2 - t1;
    opt_t[s - 1] = t3 - t2;
  }
  r->peak_fwd[rank] = pf, r->peak_bwd[rank] = pb, r->peak_opt[rank] = po;
  r->peak[rank] = maxd(pf, maxd(pb, po));
  if (rank == 0) {
    int n = c->steps;
    r->step_s = bench_median(step_t, n);
    r->fwd_s = bench_median(fwd_t, n);
    r->bwd_s = bench_median(bwd_t, n);
    r->opt_s = bench_median(opt_t, n);
    r->params = total;
    r->faults = (minor_faults() - faults0) / n;
    r->cpu_s = (bench_process_cpu_now() - cpu0) / n;
    r->rank_cpu_s = (bench_cpu_now() - tcpu0) / n;
    if (f) {
      BENCH_CHECK(loom_fsdp_stats_get(f, &after));
      r->comm_s = (after.comm_s - before.comm_s) / n;
      r->exposed_s = (after.exposed_s - before.exposed_s) / n;
      r->gathers = (double)(after.gathers - before.gathers) / n;
      r->reduce_scatters = (double)(after.reduce_scatters - before.reduce_scatters) / n;
      r->gather_mb = MB(after.gather_bytes - before.gather_bytes) / n;
      r->reduce_mb = MB(after.reduce_bytes - before.reduce_bytes) / n;
      r->shard_numel = after.shard_numel;
      r->units = loom_fsdp_unit_count(f);
      for (size_t u = 0; u < r->units && u < MAXUNITS; u++) {
        loom_fsdp_unit_info ui;
        BENCH_CHECK(loom_fsdp_unit_info_get(f, u, &ui));
        r->padded[u] = ui.padded_numel;
      }
    }
  }
  loom_optim_free(opt);
  loom_ddp_free(d);
  loom_fsdp_free(f);
  loom_tensor_free(x);
  loom_tensor_free(y);
  loom_module_free(m);
  return LOOM_OK;
}

static result run(const config *c) {
  job j = {.c = c};
  size_t limit = loom_mem_cache_limit();
  if (c->cache_mb > 0) loom_mem_set_cache_limit((size_t)c->cache_mb << 20);
  const char *e = getenv("LOOM_FSDP_SHARE_GATHERS");
  char was[16] = "";
  if (e) snprintf(was, sizeof was, "%s", e);
  if (c->own_buffers) setenv("LOOM_FSDP_SHARE_GATHERS", "0", 1);
  BENCH_CHECK(loom_threads_run(c->ranks, NULL, rank_main, &j));
  if (c->own_buffers && e) setenv("LOOM_FSDP_SHARE_GATHERS", was, 1);
  else if (c->own_buffers) unsetenv("LOOM_FSDP_SHARE_GATHERS");
  if (c->cache_mb > 0) loom_mem_set_cache_limit(limit); /* and give back what is over it */
  return j.r;
}

/* The largest of a per-rank figure over the ranks. */
static double rank_max(const double *v, int ranks) {
  double w = 0;
  for (int i = 0; i < ranks; i++) w = maxd(w, v[i]);
  return w;
}

static double worst_peak(const result *r, int ranks) { return rank_max(r->peak, ranks); }

/* The FSDP model of the peak (see the file comment), bytes; the parts into the out pointers.
 * as_run adds, under bf16, temporaries loom makes beyond that design: an f32 weight-gradient
 * temporary
 * (a bf16 parameter is not an f32 leaf, so linear's gradient sink does not write into the local
 * gradient); and, without AVX512-BF16, the widened f32 copy of the weight each product runs on
 * (README, "GEMM"). */
static double fsdp_model(const result *r, const config *c, bool as_run, double *state,
                         double *act, double *fwd, double *bwd) {
  double es = c->bf16 ? 2 : 4;
  *state = 16.0 * (double)r->shard_numel;
  /* kept for backward: the input and each layer's ReLU output (linear saves its input), the
   * logits; plus one pre-ReLU output alive at a time */
  double a = 0, hmax = 0;
  for (int i = 0; i < NSIZES; i++) a += (double)sizes[i];
  for (int i = 1; i < NSIZES - 1; i++) hmax = maxd(hmax, (double)sizes[i]);
  *act = (double)BATCH * (a + hmax) * 4;
  size_t nu = r->units < MAXUNITS ? r->units : MAXUNITS, p = (size_t)c->prefetch;
  const size_t *pd = r->padded;
  bool lowp = as_run && c->bf16;
  double widen = lowp && !loom_cpu_has_avx512bf16() ? 4 : 0;
  double fw = 0, bw = 0;
  for (size_t k = 0; k < nu; k++) {
    double g = 0; /* forward: k and the prefetched units after it */
    for (size_t i = k; i < nu && i <= k + p; i++) g += es * (double)pd[i];
    fw = maxd(fw, g + widen * (double)pd[k]);
    double b = 0; /* backward (reverse order): k and the prefetched units before it */
    for (size_t i = k + 1; i-- > 0 && i + p >= k;) b += es * (double)pd[i];
    b += 4.0 * (double)pd[k]; /* k's f32 local gradient */
    /* k+1's, while its reduce-scatter is in flight; with limit_reduce_scatters FSDP waits for
     * it before it makes k's */
    if (k + 1 < nu && !r->limit_rs) b += 4.0 * (double)pd[k + 1];
    if (lowp) b += 4.0 * (double)pd[k]; /* weight gradient temporary */
    bw = maxd(bw, b + widen * (double)pd[k]);
  }
  *fwd = fw, *bwd = bw;
  return *state + *act + maxd(fw, bw);
}

static void print_mem_header(void) {
  printf("%-22s %5s %9s %9s %9s %9s %9s %9s  %s\n", "config", "ranks", "state MB", "peak MB",
         "fwd MB", "fwd end", "bwd MB", "opt MB", "peak per rank MB");
  printf("(largest over the ranks: state between steps, peak, and the peak of each phase; fwd end "
         "= allocated when forward + loss end)\n");
}

static void print_mem_row(const config *c, const result *r) {
  char each[96] = "";
  for (int i = 0, o = 0; i < c->ranks && o < (int)sizeof each; i++)
    o += snprintf(each + o, sizeof each - (size_t)o, "%s%.0f", i ? " " : "", MB(r->peak[i]));
  printf("%-22s %5d %9.0f %9.0f %9.0f %9.0f %9.0f %9.0f  %s\n", c->name, c->ranks,
         MB(rank_max(r->state, c->ranks)), MB(worst_peak(r, c->ranks)),
         MB(rank_max(r->peak_fwd, c->ranks)), MB(rank_max(r->after_fwd, c->ranks)),
         MB(rank_max(r->peak_bwd, c->ranks)), MB(rank_max(r->peak_opt, c->ranks)), each);
}

/* Ratios of an FSDP run's peak against DDP's and against the model. */
static void print_mem_verdict(const config *fc, const result *fr, double ddp_peak,
                              double ddp_act) {
  double st, act, fw, bw, rfw, rbw;
  double model = fsdp_model(fr, fc, false, &st, &act, &fw, &bw);
  double as_run = fsdp_model(fr, fc, true, &st, &act, &rfw, &rbw);
  double peak = worst_peak(fr, fc->ranks), vs_ddp = peak / ddp_peak, vs_model = peak / model;
  double target = fc->ranks == 2 ? 0.65 : fc->ranks == 4 ? 0.4 : 0;
  printf("  %s, %d ranks: model %.0f MB = state %.0f + activations %.1f", fc->name, fc->ranks,
         MB(model), MB(st), MB(act));
  if (!fc->bf16) printf(" (DDP's forward: %.1f measured)", MB(ddp_act));
  printf(" + in flight max(fwd %.0f, bwd %.0f: %s)\n", MB(fw), MB(bw),
         fr->limit_rs ? "one local gradient at a time" : "+ the previous unit's local gradient");
  printf("  %s, %d ranks: peak / model %.2f (target <= 1.10: %s); peak / DDP %.2f", fc->name,
         fc->ranks, vs_model, vs_model <= 1.10 ? "met" : "NOT met", vs_ddp);
  if (target > 0) printf(" (target <= %.2f: %s)", target, vs_ddp <= target ? "met" : "NOT met");
  printf("; model / DDP %.2f\n", model / ddp_peak);
  if (fc->bf16)
    printf("  %s, %d ranks: with loom's bf16 temporaries: %.0f MB (in flight max(fwd %.0f, bwd "
           "%.0f)); peak / that %.2f\n", fc->name, fc->ranks, MB(as_run), MB(rfw), MB(rbw),
           peak / as_run);
  /* what forward leaves allocated: the activations and the last unit (kept for backward),
   * when reshard after forward frees the others */
  double es = fc->bf16 ? 2 : 4, all = 0;
  for (size_t u = 0; u < fr->units && u < MAXUNITS; u++) all += es * (double)fr->padded[u];
  printf("  %s, %d ranks: when forward ends: state + %.1f MB (activations kept for backward, and "
         "the last unit kept gathered: %.1f MB; every unit gathered would be %.0f MB)\n",
         fc->name, fc->ranks, MB(rank_max(fr->after_fwd, fc->ranks) - st),
         MB(es * (double)fr->padded[fr->units ? fr->units - 1 : 0]), MB(all));
}

static void print_units(const result *r, int ranks) {
  printf("units (padded elements, f32 MB gathered):");
  for (size_t u = 0; u < r->units && u < MAXUNITS; u++)
    printf(" %zu (%.1f)", r->padded[u], MB(4.0 * (double)r->padded[u]));
  printf("; parameters %zu (16 B x params = %.0f MB, / %d ranks = %.0f MB); this rank's shards %zu "
         "elements\n",
         r->params, MB(16.0 * (double)r->params), ranks, MB(16.0 * (double)r->params / ranks),
         r->shard_numel);
}

static double loadavg(void) {
  double l = -1;
  FILE *p = fopen("/proc/loadavg", "r");
  if (p) {
    if (fscanf(p, "%lf", &l) != 1) l = -1;
    fclose(p);
  }
  return l;
}

static void cpu_model(char *buf, size_t n) {
  snprintf(buf, n, "?");
  FILE *p = fopen("/proc/cpuinfo", "r");
  if (!p) return;
  char line[256];
  while (fgets(line, sizeof line, p))
    if (!strncmp(line, "model name", 10)) {
      char *v = strchr(line, ':');
      if (v) {
        v += 1 + (v[1] == ' ');
        v[strcspn(v, "\n")] = 0;
        snprintf(buf, n, "%s", v);
      }
      break;
    }
  fclose(p);
}

/* The values of v[0..n) in their order into buf, then their median (which sorts v). */
static double median_list(double *v, int n, char *buf, size_t cap) {
  buf[0] = 0;
  for (int k = 0, o = 0; k < n && o < (int)cap; k++)
    o += snprintf(buf + o, cap - (size_t)o, "%s%.2f", k ? " " : "", v[k]);
  return bench_median(v, n);
}

#define NSPEED 5
#define BIG_CACHE_MB 2048

/* 2 ranks: rounds of DDP, FSDP prefetch 1, FSDP prefetch 0 and FSDP prefetch 1 with a large
 * allocator cache; speed, exposed communication and the 2-rank memory comparison. */
static void speed_part(int steps, int rounds) {
  printf("\n# 2 ranks x 1 compute thread, f32, %d rounds of (DDP, FSDP prefetch 1, FSDP prefetch "
         "0, FSDP prefetch 1 with a %d MiB allocator cache, FSDP prefetch 1 with each rank "
         "gathering into its own buffer: LOOM_FSDP_SHARE_GATHERS=0), one warm-up + %d timed steps each; "
         "rank 0's medians; cpu = the process's CPU time per step (both ranks, their progress "
         "threads)\n", rounds, BIG_CACHE_MB, steps);
  config cs[NSPEED] = {
      {.name = "DDP", .ranks = 2, .steps = steps},
      {.name = "FSDP prefetch 1", .ranks = 2, .fsdp = true, .prefetch = 1, .steps = steps},
      {.name = "FSDP prefetch 0", .ranks = 2, .fsdp = true, .prefetch = 0, .steps = steps},
      {.name = "FSDP pf 1, cache", .ranks = 2, .fsdp = true, .prefetch = 1, .steps = steps,
       .cache_mb = BIG_CACHE_MB},
      {.name = "FSDP pf 1, own", .ranks = 2, .fsdp = true, .prefetch = 1, .steps = steps,
       .own_buffers = true},
  };
  static result rs[MAXROUNDS][NSPEED];
  /* the process's first products run slower (library start-up, first faults): one untimed
   * DDP run first, so that round 1 is like the others */
  config warm = cs[0];
  warm.steps = 1;
  (void)run(&warm);
  printf("%-6s %-16s %8s %7s %7s %7s %8s %8s %8s %8s %8s %7s %6s %9s\n", "round", "config",
         "step ms", "fwd ms", "bwd ms", "opt ms", "cpu ms", "r0 cpu", "comm ms", "exposed", "exp/comm", "gathers",
         "r-scat", "faults/st");
  for (int k = 0; k < rounds; k++)
    for (int i = 0; i < NSPEED; i++) {
      rs[k][i] = run(&cs[i]);
      const result *r = &rs[k][i];
      printf("%-6d %-16s %8.1f %7.1f %7.1f %7.1f %8.1f %8.1f", k + 1, cs[i].name, r->step_s * 1e3,
             r->fwd_s * 1e3, r->bwd_s * 1e3, r->opt_s * 1e3, r->cpu_s * 1e3, r->rank_cpu_s * 1e3);
      if (cs[i].fsdp)
        printf(" %8.1f %8.1f %8.2f %7.0f %6.0f", r->comm_s * 1e3, r->exposed_s * 1e3,
               r->exposed_s / r->comm_s, r->gathers, r->reduce_scatters);
      else
        printf(" %8s %8s %8s %7s %6s", "-", "-", "-", "-", "-");
      printf(" %9.0f  (load %.1f)\n", r->faults, loadavg());
      fflush(stdout);
    }
  double v[MAXROUNDS], m;
  char each[256];
  for (int i = 1; i < NSPEED; i++) {
    for (int k = 0; k < rounds; k++) v[k] = rs[k][i].step_s / rs[k][0].step_s;
    m = median_list(v, rounds, each, sizeof each);
    printf("step %s / DDP: %.2f (rounds %s", cs[i].name, m, each);
    if (i == 1 || i == 3) printf("; target <= 1.15: %s", m <= 1.15 ? "met" : "NOT met");
    for (int k = 0; k < rounds; k++) v[k] = rs[k][i].cpu_s / rs[k][0].cpu_s;
    m = median_list(v, rounds, each, sizeof each);
    printf("); cpu %.2f (%s)\n", m, each);
  }
  for (int i = 1; i < NSPEED; i++) {
    for (int k = 0; k < rounds; k++) v[k] = rs[k][i].exposed_s / rs[k][i].comm_s;
    m = median_list(v, rounds, each, sizeof each);
    printf("exposed / comm, %s: %.2f (rounds %s", cs[i].name, m, each);
    if (i == 1 || i == 3) printf("; target <= 0.30: %s", m <= 0.30 ? "met" : "NOT met");
    printf(")\n");
  }
  for (int k = 0; k < rounds; k++) v[k] = rs[k][1].step_s / rs[k][2].step_s;
  m = median_list(v, rounds, each, sizeof each);
  printf("step FSDP prefetch 1 / prefetch 0: %.2f (rounds %s; target <= 1.00: %s)", m, each,
         m <= 1.0 ? "met" : "NOT met");
  for (int k = 0; k < rounds; k++) v[k] = rs[k][1].cpu_s / rs[k][2].cpu_s;
  m = median_list(v, rounds, each, sizeof each);
  printf("; cpu %.2f (%s)\n", m, each);
  for (int k = 0; k < rounds; k++) v[k] = rs[k][1].exposed_s / rs[k][2].comm_s;
  m = median_list(v, rounds, each, sizeof each);
  printf("exposed with prefetch 1 / comm with prefetch 0, same round: %.2f (%s; comm_s with "
         "prefetch counts a gather from its early issue, so it is longer)\n", m, each);
  printf("per step and rank: %.0f gathers (%.0f MB received), %.0f reduce-scatters (%.0f MB "
         "sent)\n", rs[0][1].gathers, rs[0][1].gather_mb, rs[0][1].reduce_scatters,
         rs[0][1].reduce_mb);

  /* memory at 2 ranks from the same runs: the largest peak over the rounds */
  printf("\n# memory per rank, 2 ranks, f32 (compute pool, account rank + 1; peak over the timed "
         "steps, largest over the rounds)\n");
  print_units(&rs[0][1], 2);
  print_mem_header();
  result worst[NSPEED];
  for (int i = 0; i < NSPEED; i++) {
    worst[i] = rs[0][i];
    for (int k = 1; k < rounds; k++)
      for (int q = 0; q < 2; q++) {
        worst[i].peak[q] = maxd(worst[i].peak[q], rs[k][i].peak[q]);
        worst[i].peak_fwd[q] = maxd(worst[i].peak_fwd[q], rs[k][i].peak_fwd[q]);
        worst[i].peak_bwd[q] = maxd(worst[i].peak_bwd[q], rs[k][i].peak_bwd[q]);
        worst[i].peak_opt[q] = maxd(worst[i].peak_opt[q], rs[k][i].peak_opt[q]);
        worst[i].after_fwd[q] = maxd(worst[i].after_fwd[q], rs[k][i].after_fwd[q]);
      }
    print_mem_row(&cs[i], &worst[i]);
  }
  double ddp_act = worst[0].peak_fwd[0] - rs[0][0].before_fwd;
  for (int i = 1; i < 3; i++)
    print_mem_verdict(&cs[i], &worst[i], worst_peak(&worst[0], 2), ddp_act);
}

/* The memory comparison at `ranks` ranks (DDP, FSDP prefetch 1, FSDP prefetch 0), f32 or bf16. */
static void mem_part(int ranks, int steps, bool bf16) {
  printf("\n# memory per rank, %d ranks, %s (compute pool, account rank + 1; peak over %d timed "
         "steps after a warm-up)\n", ranks, bf16 ? "bf16 (autocast; FSDP cfg.mp bf16)" : "f32",
         steps);
  config cs[4] = {
      {.name = bf16 ? "DDP bf16 autocast" : "DDP", .ranks = ranks, .bf16 = bf16, .steps = steps},
      {.name = bf16 ? "FSDP bf16 prefetch 1" : "FSDP prefetch 1", .ranks = ranks, .fsdp = true,
       .prefetch = 1, .bf16 = bf16, .steps = steps},
      {.name = bf16 ? "FSDP bf16 prefetch 0" : "FSDP prefetch 0", .ranks = ranks, .fsdp = true,
       .prefetch = 0, .bf16 = bf16, .steps = steps},
      {.name = bf16 ? "FSDP bf16 RS queued" : "FSDP pf 1, RS queued", .ranks = ranks,
       .fsdp = true, .prefetch = 1, .bf16 = bf16, .steps = steps, .rs_queue = true},
  };
  result rs[4];
  for (int i = 0; i < 4; i++) rs[i] = run(&cs[i]);
  print_units(&rs[1], ranks);
  print_mem_header();
  for (int i = 0; i < 4; i++) print_mem_row(&cs[i], &rs[i]);
  printf("(RS queued: limit_reduce_scatters = false. Step ms, rank 0: %.0f / %.0f / %.0f / %.0f; "
         "minor faults per step %.0f / %.0f / %.0f / %.0f; load %.1f)\n", rs[0].step_s * 1e3,
         rs[1].step_s * 1e3, rs[2].step_s * 1e3, rs[3].step_s * 1e3, rs[0].faults, rs[1].faults,
         rs[2].faults, rs[3].faults, loadavg());
  double ddp_act = rs[0].peak_fwd[0] - rs[0].before_fwd;
  for (int i = 1; i < 4; i++) print_mem_verdict(&cs[i], &rs[i], worst_peak(&rs[0], ranks), ddp_act);
}

int bench_fsdp_main(int argc, char **argv) {
  static const bench_arg args[] = {
      {"STEPS", "timed steps per run (default 3)", NULL, 1, MAXSTEPS},
      {"PART", "what runs (default all)", "all|speed|mem4|bf16", 0, 0},
      {"ROUNDS", "rounds of the speed part (default 3)", NULL, 1, MAXROUNDS}, {0}};
  int done = bench_args(BENCH_PROG("fsdp"), "FSDP against DDP on the threads backend: step "
                        "time and memory per rank.", args, argc, argv);
  if (done >= 0) return done;
  int steps = argc > 1 ? atoi(argv[1]) : 3;
  const char *part = argc > 2 ? argv[2] : "all";
  int rounds = argc > 3 ? atoi(argv[3]) : 3;
  char cpu[128];
  cpu_model(cpu, sizeof cpu);
  printf("# command:");
  for (int i = 0; i < argc; i++) printf(" %s", argv[i]);
  printf("\n# steps %d, part %s, rounds %d; CPU \"%s\", %ld online CPUs; load average %.1f\n",
         steps, part, rounds, cpu, sysconf(_SC_NPROCESSORS_ONLN), loadavg());
  printf("# MLP 784-4096-4096-4096-4096-10 f32, batch %d per rank, AdamW, threads backend, "
         "1 compute thread per rank (loom_pg_compute_threads); allocator cache limit %.0f MiB "
         "(LOOM_ALLOC_CACHE_MB)\n", BATCH, (double)loom_mem_cache_limit() / 1048576.0);
  double t0 = bench_now();
  bool all = !strcmp(part, "all");
  if (all || !strcmp(part, "speed")) speed_part(steps, rounds);
  if (all || !strcmp(part, "mem4")) mem_part(4, 1, false);
  if (!strcmp(part, "bf16")) {
    mem_part(2, 1, true);
    mem_part(4, 1, true);
  }
  printf("\n# done in %.0f s; load average %.1f\n", bench_now() - t0, loadavg());
  return 0;
}

#ifndef LOOM_TOOL
int main(int argc, char **argv) { return bench_fsdp_main(argc, argv); }
#endif
