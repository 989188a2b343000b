/* bench_attention.c: causal attention, forward + backward (L = sum(out * w), backward to q, k
 * and v), fused (loom_scaled_dot_product_attention) against the unfused reference
 * (loom__sdpa_unfused: matmul, scale, mask, softmax, matmul, every step on the tape), at
 * B = 1, H = 6, D = 64 and context T = 256, 512, 1024, 2048 (GPT-2 small's head width, the
 * issue's 6-head model). For each: the median wall time of RUNS steps after WARM, and the
 * compute pool's peak during a step above what was allocated before it (inputs excluded): what
 * the step itself holds at its worst, which must grow linearly in T for the fused op and grows
 * as T^2 for the unfused one. Before timing, the two agree (forward and gradients) at each T.
 * Then the fused step at T = 1024 on every CPU level this machine has (the inner loops' SIMD),
 * and, where AMX runs bf16 attention (attn_amx.c), the fused step on bf16 inputs at each T with
 * its products on AMX tiles against the same inputs on the f32 path (loom__attn_set_amx).
 * Lines: `sdpa <fused|unfused> <level> T=<T> runs ms/step ms-cpu/step peak_MiB` (wall and
 * process CPU time: on a shared machine the CPU time leaves out the time other processes held
 * the core; with more than one thread it counts every thread) and a speed-up line per T.
 * Usage: bench_attention [threads] (loom_set_num_threads, default 1). */
#include "bench_util.h"
#include "ops/attn_int.h"
#include "ops/ops_int.h"

#include <math.h>

#define RUNS 7
#define WARM 2
enum { B = 1, H = 6, D = 64 };

typedef int (*attn_fn)(loom_tensor *, loom_tensor *, loom_tensor *, bool, loom_tensor **);

/* One step; the gradients are dropped first so that each step allocates them anew. */
static void step(attn_fn f, loom_tensor *const qkv[3], loom_tensor *w, loom_tensor **keep) {
  loom_tensor *y = NULL, *yw = NULL, *l = NULL;
  for (int i = 0; i < 3; i++) BENCH_CHECK(loom_tensor_set_grad(qkv[i], NULL));
  BENCH_CHECK(f(qkv[0], qkv[1], qkv[2], true, &y));
  BENCH_CHECK(loom_mul(y, w, &yw));
  BENCH_CHECK(loom_sum(yw, NULL, 0, false, &l));
  BENCH_CHECK(loom_backward(l, NULL, false));
  loom_tensor_free(yw);
  loom_tensor_free(l);
  if (keep)
    *keep = y;
  else
    loom_tensor_free(y);
}

/* Largest |a - b| over the largest |b| (f32 tensors of one shape). */
static double rel_diff(loom_tensor *a, loom_tensor *b) {
  const float *x = loom_tensor_data(a), *y = loom_tensor_data(b);
  double md = 0, mb = 1e-30;
  for (size_t i = 0; i < loom_tensor_numel(b); i++) {
    md = fmax(md, fabs((double)x[i] - y[i]));
    mb = fmax(mb, fabs((double)y[i]));
  }
  return md / mb;
}

/* Fused and unfused agree (output and gradients) before anything is timed. */
static void validate(loom_tensor *const qkv[3], loom_tensor *w, int64_t T) {
  loom_tensor *y[2], *g[2][3];
  attn_fn f[2] = {loom_scaled_dot_product_attention, loom__sdpa_unfused};
  for (int r = 0; r < 2; r++) {
    step(f[r], qkv, w, &y[r]);
    for (int i = 0; i < 3; i++) g[r][i] = loom_tensor_retain(loom_tensor_grad(qkv[i]));
  }
  double e = rel_diff(y[0], y[1]);
  for (int i = 0; i < 3; i++) e = fmax(e, rel_diff(g[0][i], g[1][i]));
  if (!(e <= 1e-4)) {
    fprintf(stderr, "bench_attention: T=%lld fused and unfused differ by %g\n", (long long)T, e);
    exit(1);
  }
  for (int r = 0; r < 2; r++) {
    loom_tensor_free(y[r]);
    for (int i = 0; i < 3; i++) loom_tensor_free(g[r][i]);
  }
}

/* Median ms of a step, wall (ms[0]) and process CPU time (ms[1]), and its peak compute bytes
 * above the bytes held before it. */
static void measure(attn_fn f, loom_tensor *const qkv[3], loom_tensor *w, double ms[2],
                    double *peak_mib) {
  double t[RUNS], c[RUNS];
  for (int r = 0; r < WARM; r++) step(f, qkv, w, NULL);
  size_t peak = 0;
  for (int r = 0; r < RUNS; r++) {
    for (int i = 0; i < 3; i++) BENCH_CHECK(loom_tensor_set_grad(qkv[i], NULL));
    loom_pool_stats s0, s1;
    BENCH_CHECK(loom_mem_stats(LOOM_POOL_COMPUTE, &s0));
    loom_mem_reset_peak(LOOM_POOL_COMPUTE);
    double t0 = bench_now(), c0 = bench_process_cpu_now();
    step(f, qkv, w, NULL);
    t[r] = (bench_now() - t0) * 1e3;
    c[r] = (bench_process_cpu_now() - c0) * 1e3;
    BENCH_CHECK(loom_mem_stats(LOOM_POOL_COMPUTE, &s1));
    size_t p = s1.peak_bytes - s0.current_bytes;
    peak = p > peak ? p : peak;
  }
  ms[0] = bench_median(t, RUNS);
  ms[1] = bench_median(c, RUNS);
  *peak_mib = (double)peak / (1 << 20);
}

static void report(const char *what, const char *level, int64_t T, const double ms[2],
                   double mib) {
  printf("sdpa %s %s T=%lld %d %.2f ms/step %.2f ms-cpu/step %.2f MiB\n", what, level,
         (long long)T, RUNS, ms[0], ms[1], mib);
}

int main(int argc, char **argv) {
  int threads = bench_threads(argc, argv);
  const char *lv = loom_cpu_level_name(loom_cpu_level_active());
  printf("# bench_attention: causal attention forward+backward, B=%d H=%d D=%d, %d thread(s), "
         "level %s; median of %d\n", B, H, D, threads, lv, RUNS);
  static const int64_t Ts[] = {256, 512, 1024, 2048};
  for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
    int64_t T = Ts[ti], sh[4] = {B, H, T, D};
    loom_tensor *qkv[3], *w = bench_rand_tensor(4, sh, LOOM_F32, 1.0f);
    for (int i = 0; i < 3; i++) {
      qkv[i] = bench_rand_tensor(4, sh, LOOM_F32, 1.0f);
      BENCH_CHECK(loom_tensor_set_requires_grad(qkv[i], true));
    }
    validate(qkv, w, T);
    double ms[2][2], mib[2];
    measure(loom_scaled_dot_product_attention, qkv, w, ms[0], &mib[0]);
    measure(loom__sdpa_unfused, qkv, w, ms[1], &mib[1]);
    report("fused", lv, T, ms[0], mib[0]);
    report("unfused", lv, T, ms[1], mib[1]);
    printf("sdpa speedup T=%lld %.2fx wall %.2fx cpu, %.1fx less memory\n", (long long)T,
           ms[1][0] / ms[0][0], ms[1][1] / ms[0][1], mib[1] / mib[0]);
    fflush(stdout);
    if (T == 1024) { /* the fused step on every level */
      loom_cpu_level keep = loom_cpu_level_active();
      for (int l = 0; l < LOOM_CPU_LEVEL_COUNT; l++) {
        if (!loom_cpu_supports((loom_cpu_level)l) || l > (int)keep) continue;
        BENCH_CHECK(loom_set_cpu_level((loom_cpu_level)l));
        measure(loom_scaled_dot_product_attention, qkv, w, ms[0], &mib[0]);
        report("fused", loom_cpu_level_name((loom_cpu_level)l), T, ms[0], mib[0]);
      }
      BENCH_CHECK(loom_set_cpu_level(keep));
    }
    if (loom__attn_amx_fits(D)) { /* bf16 inputs: products on AMX against the f32 path */
      loom_tensor *lo[3], *wl;
      for (int i = 0; i < 3; i++) {
        lo[i] = bench_rand_tensor(4, sh, LOOM_BF16, 1.0f);
        BENCH_CHECK(loom_tensor_set_requires_grad(lo[i], true));
      }
      wl = bench_rand_tensor(4, sh, LOOM_BF16, 1.0f);
      measure(loom_scaled_dot_product_attention, lo, wl, ms[0], &mib[0]);
      loom__attn_set_amx(false);
      measure(loom_scaled_dot_product_attention, lo, wl, ms[1], &mib[1]);
      loom__attn_set_amx(true);
      report("fused-bf16-amx", lv, T, ms[0], mib[0]);
      report("fused-bf16-f32", lv, T, ms[1], mib[1]);
      printf("sdpa bf16 amx speedup T=%lld %.2fx wall %.2fx cpu\n", (long long)T,
             ms[1][0] / ms[0][0], ms[1][1] / ms[0][1]);
      fflush(stdout);
      for (int i = 0; i < 3; i++) loom_tensor_free(lo[i]);
      loom_tensor_free(wl);
    }
    for (int i = 0; i < 3; i++) loom_tensor_free(qkv[i]);
    loom_tensor_free(w);
  }
  return 0;
}
