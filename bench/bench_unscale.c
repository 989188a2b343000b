/* bench_unscale.c: GB/s of the fused unscale + inf/NaN check (loom__amp_unscale) and of the
 * early-exit check alone (loom__amp_has_nonfinite) for f32, f16 and bf16 gradient buffers,
 * beside memcpy of the same bytes and a plain in-place multiply of the same buffer, timed
 * interleaved in the same run (1 thread, median of 9); then PyTorch's
 * `torch.isfinite(x).all()` + `x.mul_(inv)` on the same sizes (through /usr/bin/python3, when
 * torch is installed); then all the scaler work of one training step (scale the loss,
 * unscale + check every gradient, update) for the gradients of an MLP 784-1024-1024-10.
 * Then the real step: an MLP 784-1024-1024-10, batch 256, trained with loom's own ops, with
 * no scaler, with a separate unscale pass, with the unscale run from the gradient hooks, and
 * with the unscale deferred to the optimizer (loom_optim_step_scaled) after a read-only check
 * (loom_scaler_check) or a check from the hooks (loom_amp_check_hooks_create), the last with
 * gradient bounds off (every gradient read) and on (backward bounds each weight gradient from
 * linear's inputs, loom_tensor_grad_bound: its reads count as scaler work).
 * GB/s counts bytes read plus bytes written (unscale and multiply: 2x the buffer; the check:
 * 1x; memcpy: 2x). Usage: bench_unscale [elements (default 32M)] [step runs (default 15)]. */
#include "bench_args.h"
#include "bench_util.h"
#include "amp/amp_int.h"

#include <loom/loom.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RUNS 9

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Wall clock and thread CPU time together. */
typedef struct tick { double w, c; } tick;
static tick tick_now(void) { return (tick){now(), bench_process_cpu_now()}; }
static tick tick_since(tick a) { tick b = tick_now(); return (tick){b.w - a.w, b.c - a.c}; }
static void tick_add(tick *acc, tick d) { acc->w += d.w, acc->c += d.c; }

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, n, sizeof *v, cmp);
  return v[n / 2];
}

/* The baseline a user would write: x *= inv, in place, vectorised (O3: GCC 12's -O2 cost model
 * leaves this loop scalar; AVX2 when the CPU has it, as loom's own levels). Not cloned under
 * ThreadSanitizer: the clones' resolver runs while the dynamic loader relocates `loom`, before
 * the TSan runtime is up, and its instrumented entry crashed every run of the TSan-built tool. */
#ifdef __SANITIZE_THREAD__
#define MUL_CLONES
#else
#define MUL_CLONES , target_clones("avx2", "default")
#endif
__attribute__((noinline, optimize("O3") MUL_CLONES))
static void mul_inplace(float *x, size_t n, float inv) {
  for (size_t i = 0; i < n; i++) x[i] *= inv;
}

/* PyTorch's figures for the same sizes: "dtype check_s mul_s" lines from a child python, on 1
 * thread in both its pools (bench_torch_cmd; the counts it ran with are printed). */
static void torch_baseline(size_t n) {
  char py[96], cmd[2048];
  bench_torch_cmd(py, sizeof py, 1);
  snprintf(cmd, sizeof cmd,
           "%s -c \"" BENCH_TORCH_CAP
           "import time\n"
           "n=%zu\n"
           "for name, dt in (('f32', torch.float32), ('f16', torch.float16), ('bf16', torch.bfloat16)):\n"
           "  try:\n"
           "    x=(torch.rand(n)-0.5).to(dt); c=[]; m=[]\n"
           "    for r in range(%d):\n"
           "      t0=time.perf_counter(); ok=bool(torch.isfinite(x).all()); t1=time.perf_counter()\n"
           "      x.mul_(1.0/65536); t2=time.perf_counter(); c.append(t1-t0); m.append(t2-t1)\n"
           "    c.sort(); m.sort(); print(name, c[len(c)//2], m[len(m)//2])\n"
           "  except Exception as e: print(name, 'error', type(e).__name__)\n"
           "\" 2>/dev/null",
           py, 1, n, RUNS);
  FILE *p = popen(cmd, "r");
  if (!p) {
    printf("pytorch: could not run /usr/bin/python3\n");
    return;
  }
  char line[256];
  int any = 0;
  while (fgets(line, sizeof line, p)) {
    char name[16], a[64], b[64];
    int tthr[2];
    if (bench_torch_threads(line, tthr)) {
      printf("pytorch: torch threads %d, openblas threads %d\n", tthr[0], tthr[1]);
      continue;
    }
    if (sscanf(line, "%15s %63s %63s", name, a, b) != 3) continue;
    any = 1;
    if (strcmp(a, "error") == 0) {
      printf("%-5s pytorch: %s\n", name, b);
      continue;
    }
    size_t es = strcmp(name, "f32") == 0 ? 4 : 2;
    double tc = atof(a), tm = atof(b), bytes = (double)(n * es);
    printf("%-5s pytorch isfinite().all() %8.2f GB/s, mul_ %8.2f GB/s, both %8.2f GB/s "
           "(%.2f ms)\n", name, bytes / tc / 1e9, 2 * bytes / tm / 1e9,
           3 * bytes / (tc + tm) / 1e9, (tc + tm) * 1e3);
  }
  if (!any) printf("pytorch: not available (no torch for /usr/bin/python3)\n");
  pclose(p);
}

/* Evict the buffers from the caches (a 64 MB write), so no timed op starts with the tail of
 * the previous op's buffer in L3. */
static unsigned char *scratch;
static void flush(void) { memset(scratch, (int)(now() * 1000) & 0x7f, (size_t)64 << 20); }

/* One dtype: unscale+check, check, memcpy, (f32: in-place multiply), interleaved. */
static int bench_dtype(loom_dtype dt, size_t n, void *buf, void *copy, const float *src) {
  size_t es = loom_dtype_size(dt), bytes = n * es;
  double tu[RUNS], tc[RUNS], tmc[RUNS], tmul[RUNS];
  bool found = false, has = false;
  const double inv = 1.0 / 65536;
  for (int r = 0; r < RUNS; r++) {
    if (dt == LOOM_F32) memcpy(buf, src, bytes); /* fresh values each run: no denormal drift */
    else if (dt == LOOM_F16) loom_cvt_f32_to_f16(src, buf, n);
    else loom_cvt_f32_to_bf16(src, buf, n);
    flush();
    double t0 = now();
    memcpy(copy, buf, bytes);
    tmc[r] = now() - t0;
    flush();
    t0 = now();
    if (loom__amp_unscale(buf, dt, n, inv, &found)) return 1;
    tu[r] = now() - t0;
    flush();
    t0 = now();
    if (loom__amp_has_nonfinite(buf, dt, n, &has)) return 1;
    tc[r] = now() - t0;
    flush();
    t0 = now();
    if (dt == LOOM_F32) mul_inplace(copy, n, (float)inv);
    tmul[r] = now() - t0;
  }
  if (found || has) printf("(unexpected non-finite values found)\n");
  double mu = median(tu, RUNS), mc = median(tc, RUNS), mm = median(tmc, RUNS);
  double gu = 2.0 * bytes / mu / 1e9, gc = (double)bytes / mc / 1e9, gm = 2.0 * bytes / mm / 1e9;
  printf("%-5s unscale+check %8.2f GB/s (%.2f ms) | check only %8.2f GB/s | memcpy %8.2f GB/s "
         "| unscale/memcpy %.2f", loom_dtype_name(dt), gu, mu * 1e3, gc, gm, gu / gm);
  if (dt == LOOM_F32) {
    double gx = 2.0 * bytes / median(tmul, RUNS) / 1e9;
    printf(" | in-place multiply %8.2f GB/s | unscale/multiply %.2f (target >= 0.90: %s)", gx,
           gu / gx, gu / gx >= 0.9 ? "met" : "NOT met");
  }
  printf("\n");
  return 0;
}

/* The scaler work of one step over an MLP 784-1024-1024-10's f32 gradients. */
static int bench_step(void) {
  const size_t sizes[6] = {1024 * 784, 1024, 1024 * 1024, 1024, 10 * 1024, 10};
  loom_tensor *g[6] = {0};
  size_t total = 0;
  int rc = 0;
  for (int i = 0; i < 6; i++) {
    int64_t shape[1] = {(int64_t)sizes[i]};
    if ((rc = loom_tensor_zeros(LOOM_F32, 1, shape, &g[i]))) goto done;
    if ((rc = loom_tensor_fill(g[i], 0.001))) goto done;
    total += sizes[i];
  }
  loom_scaler *s = NULL;
  if ((rc = loom_scaler_create_dynamic(NULL, &s))) goto done;
  double t[101];
  for (int r = 0; r < 101; r++) {
    float loss = 2.3f;
    bool found = false;
    double t0 = now();
    rc = loom_scaler_scale_value(s, &loss);
    if (!rc) rc = loom_scaler_unscale(s, g, 6, &found);
    if (!rc) rc = loom_scaler_update(s, found);
    t[r] = now() - t0;
    if (rc) break;
    for (int i = 0; i < 6; i++) loom_tensor_fill(g[i], 0.001); /* fresh gradients */
  }
  loom_scaler_free(s);
  if (!rc) {
    double m = median(t, 101);
    printf("scaler work per step (scale + unscale/check %zu f32 gradients + update): %.1f us = "
           "%.2f%% of a 11.6 ms f32 step, %.2f%% of a 6.0 ms bf16 step (MEASURED.md, oneDNN, "
           "1 thread)\n", total, m * 1e6, m / 11.6e-3 * 100, m / 6.0e-3 * 100);
  }
done:
  for (int i = 0; i < 6; i++) loom_tensor_free(g[i]);
  return rc;
}

/* ---- the real step: an MLP 784-1024-1024-10, batch 256, loom's own ops --------------------- */

enum { NP = 6 };
typedef struct mlp {
  loom_tensor *p[NP], *g[NP], *x, *y;
  loom_optim *opt;
} mlp;

static int mlp_make(mlp *m) {
  static const int64_t shp[NP][2] = {{1024, 784}, {1024, 0}, {1024, 1024}, {1024, 0}, {10, 1024},
                                     {10, 0}};
  loom_param_seg seg[NP];
  int rc = 0;
  for (int i = 0; i < NP && !rc; i++) {
    int nd = shp[i][1] ? 2 : 1;
    if ((rc = loom_tensor_empty(LOOM_F32, nd, shp[i], &m->p[i]))) break;
    float *v = loom_tensor_data(m->p[i]);
    for (size_t j = 0; j < loom_tensor_numel(m->p[i]); j++) v[j] = ((float)(j % 97) - 48) * 6e-4f;
    if ((rc = loom_tensor_set_requires_grad(m->p[i], true))) break;
    if ((rc = loom_tensor_zeros(LOOM_F32, nd, shp[i], &m->g[i]))) break;
    if ((rc = loom_tensor_set_grad(m->p[i], m->g[i]))) break;
    seg[i] = (loom_param_seg){NULL, v, loom_tensor_data(m->g[i]), loom_tensor_numel(m->p[i]), 0};
  }
  if (rc || (rc = loom_tensor_empty(LOOM_F32, 2, (int64_t[]){256, 784}, &m->x))) return rc;
  float *xv = loom_tensor_data(m->x);
  for (size_t j = 0; j < 256 * 784; j++) xv[j] = (float)(j % 255) / 255.0f;
  int64_t yv[256];
  for (int j = 0; j < 256; j++) yv[j] = j % 10;
  if ((rc = loom_tensor_from_data(LOOM_I64, 1, (int64_t[]){256}, yv, &m->y))) return rc;
  loom_sgd_cfg c = loom_sgd_cfg_default();
  c.lr = 1e-3;
  return loom_optim_create_sgd(seg, NP, &c, &m->opt);
}

static void mlp_free(mlp *m) {
  loom_optim_free(m->opt);
  for (int i = 0; i < NP; i++) loom_tensor_free(m->p[i]), loom_tensor_free(m->g[i]);
  loom_tensor_free(m->x);
  loom_tensor_free(m->y);
}

static int mlp_loss(mlp *m, loom_tensor **loss) {
  loom_tensor *h = NULL, *a = NULL, *h2 = NULL, *a2 = NULL, *lg = NULL;
  int rc = loom_linear(m->x, m->p[0], m->p[1], &h);
  if (!rc) rc = loom_relu(h, &a);
  if (!rc) rc = loom_linear(a, m->p[2], m->p[3], &h2);
  if (!rc) rc = loom_relu(h2, &a2);
  if (!rc) rc = loom_linear(a2, m->p[4], m->p[5], &lg);
  if (!rc) rc = loom_cross_entropy(lg, m->y, LOOM_REDUCTION_MEAN, -100, loss);
  loom_tensor_free(h), loom_tensor_free(a), loom_tensor_free(h2), loom_tensor_free(a2);
  loom_tensor_free(lg);
  return rc;
}

/* Timing hooks around the amp hook of each parameter: time spent unscaling inside backward. */
static tick hook_t0, hook_sum;
static int hook_begin(loom_tensor *g, void *c) { (void)g, (void)c; hook_t0 = tick_now(); return 0; }
static int hook_end(loom_tensor *g, void *c) {
  (void)g, (void)c;
  tick_add(&hook_sum, tick_since(hook_t0));
  return 0;
}

/* The step's variants, timed interleaved. */
enum { V_NONE, V_SEPARATE, V_HOOKS, V_CHECK, V_CHECK_HOOKS_READ, V_CHECK_HOOKS, NV };
static const char *const vname[NV] = {
    "no scaler",
    "separate pass: scale, loom_scaler_unscale, update",
    "unscale + check from the gradient hooks, finish, update",
    "deferred: scale, loom_scaler_check, update; step_scaled",
    "deferred, check from the hooks reading every gradient (bounds off), step_scaled",
    "deferred, check from the hooks (loom_amp_check_hooks), update; step_scaled"};

/* One step of variant v: t[0] the whole step, t[1] the scaler work inside it (the
 * unscale/check pass or the time inside the amp hooks, arm, finish, grad_scale, update; the
 * loss scaling is inside loom_backward_amp, one multiply), t[2] the optimizer step (the
 * deferred variants multiply by 1/scale there, as they load the gradients), t[3] the time
 * backward spent reading linear's inputs to bound the weight gradients (loom_grad_bound_cost;
 * only the last variant tracks bounds). */
static double bound_spent_before;
static int mlp_step(mlp *m, int v, loom_scaler *s, loom_amp_unscale_hooks *h[2], tick t[4]) {
  loom_tensor *loss = NULL;
  tick t0 = tick_now(), ts = {0, 0};
  bool found = false;
  float gs = 1.0f;
  int rc = LOOM_OK;
  loom_amp_unscale_hooks *hk = v == V_HOOKS                                  ? h[0]
                               : v == V_CHECK_HOOKS || v == V_CHECK_HOOKS_READ ? h[1]
                                                                             : NULL;
  for (int i = 0; i < NP && !rc; i++) rc = loom_tensor_zero_grad(m->p[i]);
  if (!rc) rc = mlp_loss(m, &loss);
  if (rc) return rc;
  tick a = tick_now();
  if (hk) rc = loom_amp_unscale_hooks_arm(hk);
  tick_add(&ts, tick_since(a));
  hook_sum = (tick){0, 0};
  for (int i = 0; i < NP && !rc && v == V_CHECK_HOOKS; i++)
    rc = loom_tensor_track_grad_bound(m->p[i], true);
  a = tick_now();
  if (!rc) rc = loom_backward_amp(loss, v != V_NONE ? s : NULL, false);
  t[3] = tick_since(a);
  for (int i = 0; i < NP && v == V_CHECK_HOOKS; i++) loom_tensor_track_grad_bound(m->p[i], false);
  t[3].w -= hook_sum.w, t[3].c -= hook_sum.c;
  double spent;
  loom_grad_bound_cost(&spent, NULL);
  t[3].w = t[3].c = spent - bound_spent_before; /* the bound reads inside this backward */
  bound_spent_before = spent;
  tick_add(&ts, hook_sum);
  a = tick_now();
  if (!rc && v == V_SEPARATE) rc = loom_scaler_unscale(s, m->g, NP, &found);
  if (!rc && v == V_CHECK) rc = loom_scaler_check(s, m->g, NP, &found);
  if (!rc && hk) rc = loom_amp_unscale_hooks_finish(hk, &found);
  if (!rc && v != V_NONE) rc = loom_scaler_grad_scale(s, &gs);
  if (!rc && v != V_NONE) rc = loom_scaler_update(s, found);
  tick_add(&ts, tick_since(a));
  a = tick_now();
  if (!rc && !found) rc = loom_optim_step_scaled(m->opt, gs);
  t[2] = tick_since(a);
  t[0] = tick_since(t0);
  t[1] = ts;
  loom_tensor_free(loss);
  return rc;
}

#define NT 4 /* measures per step */
static const tick *at(const tick *t, int runs, int v, int r, int j) {
  return &t[((size_t)v * (size_t)runs + (size_t)r) * NT + (size_t)j];
}

/* Median over the runs of field k (0 wall, 1 CPU) of measure j of variant v. */
static double med(const tick *t, int runs, int v, int j, int k) {
  double *x = malloc((size_t)runs * sizeof *x), m;
  for (int r = 0; r < runs; r++) x[r] = k ? at(t, runs, v, r, j)->c : at(t, runs, v, r, j)->w;
  m = median(x, runs);
  free(x);
  return m;
}

static int bench_real_step(int runs) {
  mlp m = {0};
  loom_scaler *s = NULL;
  loom_amp_unscale_hooks *h[2] = {NULL, NULL};
  int rc = mlp_make(&m);
  loom_dynamic_scaler_cfg cfg = loom_dynamic_scaler_cfg_default();
  cfg.initial_scale = 1024; /* these synthetic gradients must not overflow: no skipped steps */
  if (!rc) rc = loom_scaler_create_dynamic(&cfg, &s);
  /* timing hooks around both amp hook sets (only the armed one does anything) */
  for (int i = 0; i < NP && !rc; i++) rc = loom_tensor_register_hook(m.p[i], hook_begin, NULL, NULL);
  if (!rc) rc = loom__amp_unscale_hooks_create(s, m.p, NP, &h[0]);
  if (!rc) rc = loom_amp_check_hooks_create(s, m.p, NP, &h[1]);
  /* the check hooks turned bound tracking on; mlp_step turns it on for their variant only */
  for (int i = 0; i < NP && !rc; i++) rc = loom_tensor_track_grad_bound(m.p[i], false);
  for (int i = 0; i < NP && !rc; i++) rc = loom_tensor_register_hook(m.p[i], hook_end, NULL, NULL);
  tick *t = calloc((size_t)runs * NV * NT, sizeof *t); /* at(t, runs, v, r, j) */
  for (int r = -2; r < runs && !rc; r++) /* 2 warm-up rounds; variants interleaved */
    for (int v = 0; v < NV && !rc; v++) {
      tick x[NT];
      rc = mlp_step(&m, v, s, h, x);
      if (r >= 0) memcpy((tick *)at(t, runs, v, r, 0), x, sizeof x);
    }
  if (!rc) {
    printf("MLP 784-1024-1024-10 f32 step, batch 256, loom ops (oneDNN), 1 thread, %d rounds "
           "of the %d variants interleaved, medians, wall clock [thread CPU time]; share = "
           "scaler work / this run's no-scaler step; net = scaler work + (this variant's optimizer "
           "time - the no-scaler optimizer's): a pass that leaves the gradients in cache speeds "
           "the optimizer up, the deferred multiply could slow it down:\n", runs, NV);
    for (int v = 0; v < NV; v++) {
      double share[2], work[2], net[2];
      double extra[2] = {0, 0}; /* backward's bound reads (wall time, in both columns) */
      for (int k = 0; k < 2; k++) {
        if (v == V_CHECK_HOOKS) extra[k] = med(t, runs, v, 3, k);
        work[k] = med(t, runs, v, 1, k) + extra[k];
        net[k] = work[k] + med(t, runs, v, 2, k) - med(t, runs, V_NONE, 2, k);
        share[k] = work[k] / med(t, runs, V_NONE, 0, k) * 100;
      }
      printf("  %-74s step %7.2f [%7.2f] ms | optimizer %4.0f [%4.0f] us", vname[v],
             med(t, runs, v, 0, 0) * 1e3, med(t, runs, v, 0, 1) * 1e3,
             med(t, runs, v, 2, 0) * 1e6, med(t, runs, v, 2, 1) * 1e6);
      if (v) printf(" | scaler work %5.1f [%5.1f] us = %.2f%% [%.2f%%]%s | net %+5.0f [%+5.0f] us",
                    work[0] * 1e6, work[1] * 1e6, share[0], share[1],
                    share[1] <= 1.0 ? " (<= 1%: met)" : " (<= 1%: NOT met)", net[0] * 1e6,
                    net[1] * 1e6);
      if (v == V_CHECK_HOOKS)
        printf(" | of it, backward's bound reads %+5.1f [%+5.1f] us", extra[0] * 1e6,
               extra[1] * 1e6);
      printf("\n");
    }
  }
  free(t);
  loom_amp_unscale_hooks_free(h[0]);
  loom_amp_unscale_hooks_free(h[1]);
  loom_scaler_free(s);
  mlp_free(&m);
  return rc;
}

int bench_unscale_main(int argc, char **argv) {
  static const bench_arg args[] = {
      {"ELEMENTS", "elements per unscale pass (default 33554432)", NULL, 1, 1LL << 30},
      {"RUNS", "timed runs of the real training step (default 15)", NULL, 1, 1000000}, {0}};
  int done = bench_args(BENCH_PROG("unscale"), "GB/s of the fused unscale + inf/NaN check per "
                        "dtype, beside PyTorch, and its share of a training step.", args, argc,
                        argv);
  if (done >= 0) return done;
  loom_set_num_threads(1); /* 1 thread, as PyTorch's side and the scaler's own pass */
  size_t n = argc > 1 ? (size_t)strtoull(argv[1], NULL, 10) : ((size_t)32 << 20);
  float *src = malloc(n * 4);
  void *buf = malloc(n * 4), *copy = malloc(n * 4);
  scratch = malloc((size_t)64 << 20);
  if (!src || !buf || !copy || !scratch) {
    fprintf(stderr, "bench_unscale: out of memory for %zu elements\n", n);
    return 1;
  }
  for (size_t i = 0; i < n; i++) src[i] = ((float)(i % 2001) - 1000.0f) * 0.5f;
  memset(buf, 0, n * 4);
  memset(copy, 0, n * 4);
  printf("# unscale + inf/NaN check, %zu elements, 1 thread, CPU level %s, median of %d runs\n",
         n, loom_cpu_level_name(loom_cpu_level_active()), RUNS);
  int rc = bench_dtype(LOOM_F32, n, buf, copy, src) || bench_dtype(LOOM_F16, n, buf, copy, src) ||
           bench_dtype(LOOM_BF16, n, buf, copy, src);
  free(src);
  free(buf);
  free(copy);
  free(scratch);
  if (rc) {
    fprintf(stderr, "bench_unscale: %s\n", loom_last_error());
    return 1;
  }
  torch_baseline(n);
  int runs = argc > 2 ? atoi(argv[2]) : 15;
  if (bench_step() || bench_real_step(runs)) {
    fprintf(stderr, "bench_unscale: %s\n", loom_last_error());
    return 1;
  }
  return 0;
}

#ifndef LOOM_TOOL
int main(int argc, char **argv) { return bench_unscale_main(argc, argv); }
#endif
