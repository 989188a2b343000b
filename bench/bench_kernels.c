/* bench_kernels.c: GB/s of every dispatch-level kernel family on every CPU level this machine
 * runs, side by side, beside memcpy in the same run (issue 27: a level chosen by speed is never
 * slower than a lower one): the four f32 <-> f16 / bf16 conversions (core), AMP's fused unscale
 * + inf check (f32, f16, bf16, in place), absmax (the gradient-bound reads, f32 / f16 / bf16),
 * the dist layer's f32 sum (a += b, block by block, as the all-reduce folds a peer's chunk) and
 * its two-source sum written to two destinations (the threads backend's large all-reduce), and
 * the optimizer's SGD (momentum) and Adam steps, and the ops' per-level loops: relu, GELU (tanh
 * form) forward and backward, layer norm forward and dx over rows of 768.
 * 1 thread pinned to the CPU it starts on (sched_setaffinity), buffers of N elements on cache
 * lines unless SHIFT says otherwise (default 16M: past the kernels' streaming threshold), each figure the median of ROUNDS
 * rounds (default 15) in which memcpy and every kernel at every level run interleaved, the order
 * of the levels rotated from round to round, each call timed by the thread's CPU time (time
 * other processes held the core is not counted; their traffic on the memory bus still is).
 * GB/s counts bytes read plus bytes written, for the kernel and for memcpy (of N f32), so ratio
 * = kernel GB/s / memcpy GB/s compares memory throughput (as bench_convert). The table has one
 * row per kernel: each level's GB/s and ratio, and the picked level's speed over the fastest
 * lower level's ("vs lower"; "ok" when >= 0.95, the noise of a shared machine). The picked
 * level is the active one (the highest the CPU runs; LOOM_CPU caps it).
 * Usage: bench_kernels [ELEMENTS [ROUNDS [WORD [SHIFT]]]] (WORD: only the kernels whose name
 * holds it, "" for all; SHIFT: every buffer starts that many bytes past a cache line, default 0). It calls private kernel tables (src/), so it stays
 * out of the `loom bench` tool, which takes only benchmarks of the public API. */
#define _GNU_SOURCE
#include "bench_util.h"

#include "amp/amp_int.h"
#include "dist/reduce_int.h"
#include "ops/norm_int.h"
#include "ops/ops_int.h"
#include "ops/unary_int.h"
#include "optim/optim_int.h"

#include <loom/loom.h>

#include <sched.h>

#define MAX_ROUNDS 101
#define LN_C 768 /* layer norm's row length */

enum {
  K_F32_BF16, K_BF16_F32, K_F32_F16, K_F16_F32, K_UNS_F32, K_UNS_F16, K_UNS_BF16, K_ABS_F32,
  K_ABS_F16, K_ABS_BF16, K_SUM, K_SUM2, K_SGD, K_ADAM, K_RELU, K_GELU, K_GELU_BWD, K_LN,
  K_LN_BWD, NK
};
static const char *const kname[NK] = {
    "cvt f32->bf16", "cvt bf16->f32", "cvt f32->f16", "cvt f16->f32", "unscale f32",
    "unscale f16",   "unscale bf16",  "absmax f32",   "absmax f16",   "absmax bf16",
    "sum a += b",    "sum2 -> 2 dsts", "sgd momentum", "adam",       "relu",
    "gelu tanh",     "gelu tanh bwd", "layernorm",    "layernorm dx"};
/* f32-sized streams each kernel reads plus writes, per element (16-bit: half of one). */
static const double kstreams[NK] = {1.5, 1.5, 1.5, 1.5, 2, 1, 1, 1, 0.5, 0.5, 3, 4, 5, 7,
                                    2,   2,   3,   2,   3};

typedef struct bufs {
  float *a, *b, *y, *z, *m, *v;
  uint16_t *h, *bh, *h2;
  size_t n;
} bufs;

static double sink; /* absmax's answers, so the calls are not dropped */

/* One run of kernel k at the active level (absmax at `level`). */
static void run_kernel(int k, loom_cpu_level level, bufs *B) {
  size_t n = B->n;
  const loom__amp_kernels *amp = loom__amp_kernels_for(level);
  switch (k) {
  /* the conversions through the public calls, at the level loom_set_cpu_level picked */
  case K_F32_BF16: loom_cvt_f32_to_bf16(B->a, B->h2, n); break;
  case K_BF16_F32: loom_cvt_bf16_to_f32(B->bh, B->y, n); break;
  case K_F32_F16: loom_cvt_f32_to_f16(B->a, B->h2, n); break;
  case K_F16_F32: loom_cvt_f16_to_f32(B->h, B->y, n); break;
  /* in place by 1: the values stay as they are from round to round */
  case K_UNS_F32: sink += amp->unscale_f32(B->z, n, 1.0f); break;
  case K_UNS_F16: sink += amp->unscale_f16(B->h, n, 1.0f); break;
  case K_UNS_BF16: sink += amp->unscale_bf16(B->bh, n, 1.0f); break;
  case K_ABS_F32: sink += loom__absmax_level(B->a, LOOM_F32, n, level); break;
  case K_ABS_F16: sink += loom__absmax_level(B->h, LOOM_F16, n, level); break;
  case K_ABS_BF16: sink += loom__absmax_level(B->bh, LOOM_BF16, n, level); break;
  case K_SUM: {
    loom__combine_fn f = loom__reduce_kernels_for(level)->combine[0][LOOM_SUM];
    for (size_t off = 0; off < n; off += LOOM__REDUCE_BLK)
      f(B->y + off, B->b + off, n - off < LOOM__REDUCE_BLK ? n - off : LOOM__REDUCE_BLK);
    break;
  }
  case K_SUM2: {
    const void *srcs[2] = {B->a, B->b};
    void *dsts[2] = {B->y, B->z};
    loom__reduce_to_all(dsts, 2, srcs, 2, n, LOOM_F32, LOOM_SUM);
    break;
  }
  case K_SGD: {
    loom__sgd_args s = {.wd = 0, .momentum = 0.9f, .omd = 1, .neg_lr = -1e-3f, .grad_scale = 1,
                        .has_momentum = true};
    loom__optim_k_level(level)->sgd(&s, B->y, B->b, B->m, n);
    break;
  }
  case K_RELU: loom__unary_kernels_level(level)->fwd[LOOM__U_RELU](B->y, B->a, n, 0); break;
  case K_GELU: loom__unary_kernels_level(level)->fwd[LOOM__U_GELU_TANH](B->y, B->a, n, 0); break;
  case K_GELU_BWD:
    loom__unary_kernels_level(level)->bwd[LOOM__U_GELU_TANH](B->y, B->b, B->a, NULL, n, 0);
    break;
  /* rows of LN_C (a transformer's width), the weight from m, no bias, the stats in z */
  case K_LN:
    loom__norm_kernels_for(level)->fwd(B->y, B->z, B->a, B->m, NULL, 0, n / LN_C, LN_C, 1e-5f);
    break;
  case K_LN_BWD:
    loom__norm_kernels_for(level)->bwd_dx(B->y, B->b, B->a, B->m, B->z, 0, n / LN_C, LN_C);
    break;
  case K_ADAM: {
    loom__adam_args a = {.beta1 = 0.9f, .omb1 = 0.1f, .beta2 = 0.999f, .omb2 = 0.001f,
                         .decay = 1, .bc2_sqrt = 0.5f, .eps = 1e-8f, .neg_step = -1e-3f,
                         .grad_scale = 1};
    loom__optim_k_level(level)->adam(&a, B->z, B->b, B->m, B->v, n);
  }
  }
}

/* Buffers start `shift` bytes past a cache line (0: on it, as loom's tensors and arenas are,
 * LOOM_LAYOUT_ALIGN_BYTES; else as a view or a rank's chunk may start); kept to be freed. */
static size_t shift;
static void *raws[16];
static int nraw;

static void *line_alloc(size_t bytes) {
  char *p = aligned_alloc(64, (bytes + 64 + 63) & ~(size_t)63);
  if (!p || nraw == 16) return NULL;
  raws[nraw++] = p;
  return p + shift;
}

int main(int argc, char **argv) {
  size_t n = argc > 1 ? (size_t)strtoull(argv[1], NULL, 10) : ((size_t)16 << 20);
  int rounds = argc > 2 ? atoi(argv[2]) : 15;
  const char *only = argc > 3 ? argv[3] : "";
  shift = argc > 4 ? (size_t)atoi(argv[4]) : 0;
  if (n < 1 || n > ((size_t)1 << 30) || rounds < 1 || rounds > MAX_ROUNDS || shift > 60 ||
      shift % 4) {
    fprintf(stderr,
            "bench_kernels: usage: bench_kernels [ELEMENTS (1..2^30) [ROUNDS (1..%d) [WORD "
            "[SHIFT (bytes past a cache line: 0, 4, .., 60)]]]]\n",
            MAX_ROUNDS);
    return 2;
  }
  bufs B = {line_alloc(n * 4), line_alloc(n * 4), line_alloc(n * 4), line_alloc(n * 4),
            line_alloc(n * 4), line_alloc(n * 4), line_alloc(n * 2), line_alloc(n * 2),
            line_alloc(n * 2), n};
  float *cpy = line_alloc(n * 4);
  if (!B.a || !B.b || !B.y || !B.z || !B.m || !B.v || !B.h || !B.bh || !B.h2 || !cpy) {
    fprintf(stderr, "bench_kernels: out of memory for %zu elements\n", n);
    return 1;
  }
  for (size_t i = 0; i < n; i++) {
    B.a[i] = (float)(i % 1000) * 0.001f - 0.5f;
    B.b[i] = (float)(i % 777) * 0.002f - 0.7f;
    B.y[i] = B.z[i] = B.m[i] = 0.01f;
    B.v[i] = 1e-4f;
  }
  loom_cvt_f32_to_f16(B.a, B.h, n);
  loom_cvt_f32_to_bf16(B.a, B.bh, n);
  memset(B.h2, 0, n * 2);
  memset(cpy, 0, n * 4);
  int cpu = bench_pin();
  loom_cpu_level keep = loom_cpu_level_active(), levels[LOOM_CPU_LEVEL_COUNT];
  int nl = 0;
  for (int l = 0; l <= (int)keep; l++)
    if (loom_cpu_supports((loom_cpu_level)l)) levels[nl++] = (loom_cpu_level)l;
  static double t[LOOM_CPU_LEVEL_COUNT][NK][MAX_ROUNDS], tm[MAX_ROUNDS];
  for (int r = 0; r < rounds; r++) {
    double t0 = bench_cpu_now();
    memcpy(cpy, B.a, n * 4);
    tm[r] = bench_cpu_now() - t0;
    for (int k = 0; k < NK; k++)
      for (int j = 0; j < nl && strstr(kname[k], only); j++) {
        int l = (j + r) % nl; /* rotated: no level always runs first */
        BENCH_CHECK(loom_set_cpu_level(levels[l])); /* the levels the table-driven paths take */
        t0 = bench_cpu_now();
        run_kernel(k, levels[l], &B);
        t[l][k][r] = bench_cpu_now() - t0;
      }
  }
  BENCH_CHECK(loom_set_cpu_level(keep));
  double gm = 2.0 * (double)n * 4 / bench_median(tm, rounds) / 1e9;
  double load[3] = {0};
  FILE *la = fopen("/proc/loadavg", "r");
  if (la) {
    if (fscanf(la, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
    fclose(la);
  }
  printf("# dispatch-level kernels, %zu elements, 1 thread (pinned to CPU %d), median of %d "
         "interleaved rounds, thread CPU time, buffers %zu bytes past a line; memcpy of %zu MB: "
         "%.2f GB/s; picked level %s; load average %.2f\n",
         n, cpu, rounds, shift, n * 4 >> 20, gm, loom_cpu_level_name(keep), load[0]);
  printf("%-15s", "kernel");
  for (int l = 0; l < nl; l++) printf(" %9s GB/s ratio", loom_cpu_level_name(levels[l]));
  printf(" %8s\n", "vs lower");
  int slower = 0;
  int shown = 0;
  for (int k = 0; k < NK; k++) {
    if (!strstr(kname[k], only)) continue;
    shown++;
    double g[LOOM_CPU_LEVEL_COUNT];
    printf("%-15s", kname[k]);
    for (int l = 0; l < nl; l++) {
      g[l] = kstreams[k] * (double)n * 4 / bench_median(t[l][k], rounds) / 1e9;
      printf(" %14.2f %5.2f", g[l], g[l] / gm);
    }
    double lower = 0; /* the fastest level below the picked one (the last column) */
    for (int l = 0; l + 1 < nl; l++) lower = g[l] > lower ? g[l] : lower;
    if (nl > 1) {
      double v = g[nl - 1] / lower;
      printf(" %8.2f%s\n", v, v >= 0.95 ? " ok" : " SLOWER");
      slower += v < 0.95;
    } else {
      printf(" %8s\n", "-");
    }
  }
  printf("picked level slower than a lower one (< 0.95x): %d of %d kernels\n", slower, shown);
  for (int i = 0; i < nraw; i++) free(raws[i]);
  return sink < 0; /* never: magnitudes */
}
