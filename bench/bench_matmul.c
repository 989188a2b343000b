/* bench_matmul.c: GFLOP/s of loom_matmul (oneDNN underneath, see README "GEMM") at
 * 1024x1024x1024 and 4096x4096x1024 (M x N x K) in f32 and bf16, beside PyTorch's
 * torch.matmul on the same sizes, dtypes and thread count in the same run (through
 * /usr/bin/python3 when torch is installed; skipped otherwise), with the ratio loom / PyTorch.
 * The two are timed in 3 alternating rounds (9 calls each at 1024, 3 at 4096) and each side's
 * median over all its calls is reported, so that both see the same machine load. Both sides
 * allocate their output on every call (loom_matmul and torch.matmul return a new tensor). Before
 * timing, loom's product is checked against a double-precision dot product at sampled elements.
 *
 * Threads: loom_set_num_threads and torch.set_num_threads with the same count (default 1).
 * Usage: bench_matmul [threads]. Prints one line per size and dtype:
 *   matmul <dtype> <M>x<N>x<K> threads <t> runs <r> loom <ms> ms <GFLOP/s> GFLOP/s
 *   torch <GFLOP/s> GFLOP/s ratio <loom GFLOP/s / torch GFLOP/s> */
#include "bench_util.h"

#include <loom/loom.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>

#define ROUNDS 3

/* loom's C = A B at 64 sampled elements against a double dot product of the same (rounded)
 * inputs; bf16 C is compared within its rounding. */
static int validate(loom_tensor *a, loom_tensor *b, loom_tensor *c, int64_t M, int64_t N,
                    int64_t K) {
  int bad = 0;
  for (int s = 0; s < 64; s++) {
    int64_t i = (s * 7919) % M, j = (s * 104729) % N;
    double want = 0, mag = 0, got, x, y;
    for (int64_t k = 0; k < K; k++) {
      BENCH_CHECK(loom_tensor_get(a, (int64_t[]){i, k}, &x));
      BENCH_CHECK(loom_tensor_get(b, (int64_t[]){k, j}, &y));
      want += x * y, mag += fabs(x * y);
    }
    BENCH_CHECK(loom_tensor_get(c, (int64_t[]){i, j}, &got));
    double tol = 1e-5 * mag + (loom_tensor_dtype(c) == LOOM_BF16 ? fabs(want) / 128 : 0);
    if (fabs(got - want) > tol && !bad++)
      fprintf(stderr, "bench_matmul: C[%lld,%lld] = %.9g, expected %.9g\n", (long long)i,
              (long long)j, got, want);
  }
  return bad;
}

/* Appends the seconds of `runs` torch.matmul calls for this size and dtype to t[*n]; false
 * without torch. */
static bool torch_times(int64_t M, int64_t N, int64_t K, const char *dt, int runs, int threads,
                        double *t, int *n) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "/usr/bin/python3 -c \""
           "import time, torch\n"
           "torch.set_num_threads(%d)\n"
           "dt=getattr(torch, '%s')\n"
           "a=(torch.rand(%lld, %lld)*2-1).to(dt); b=(torch.rand(%lld, %lld)*2-1).to(dt)\n"
           "torch.matmul(a, b)\n"
           "for r in range(%d):\n"
           "  t0=time.perf_counter(); c=torch.matmul(a, b); print(time.perf_counter()-t0); del c\n"
           "\" 2>/dev/null",
           threads, dt, (long long)M, (long long)K, (long long)K, (long long)N, runs);
  FILE *p = popen(cmd, "r");
  if (!p) return false;
  int got = 0;
  while (got < runs && fscanf(p, "%lf", &t[*n + got]) == 1) got++;
  pclose(p);
  *n += got;
  return got == runs;
}

int main(int argc, char **argv) {
  int threads = bench_threads(argc, argv);

  static const int64_t sizes[][3] = {{1024, 1024, 1024}, {4096, 4096, 1024}};
  static const struct {
    loom_dtype dt;
    const char *torch;
  } dts[] = {{LOOM_F32, "float32"}, {LOOM_BF16, "bfloat16"}};
  int failed = 0;
  for (int s = 0; s < 2; s++)
    for (int d = 0; d < 2; d++) {
      int64_t M = sizes[s][0], N = sizes[s][1], K = sizes[s][2];
      int runs = s == 0 ? 9 : 3;
      loom_tensor *a = bench_rand_tensor(2, (int64_t[]){M, K}, dts[d].dt, 1.0f),
                  *b = bench_rand_tensor(2, (int64_t[]){K, N}, dts[d].dt, 1.0f), *c;
      BENCH_CHECK(loom_matmul(a, b, &c)); /* builds and caches the primitive */
      if (validate(a, b, c, M, N, K)) failed = 1;
      loom_tensor_free(c);
      double lt[ROUNDS * 16], tt[ROUNDS * 16];
      int nl = 0, nt = 0;
      bool torch = true;
      for (int round = 0; round < ROUNDS; round++) { /* alternate, so both see the same load */
        for (int r = 0; r < runs; r++) {
          double t0 = bench_now();
          BENCH_CHECK(loom_matmul(a, b, &c));
          lt[nl++] = bench_now() - t0;
          loom_tensor_free(c);
        }
        if (torch) torch = torch_times(M, N, K, dts[d].torch, runs, threads, tt, &nt);
      }
      double flop = 2.0 * (double)M * (double)N * (double)K, ls = bench_median(lt, nl);
      printf("matmul %-4s %lldx%lldx%lld threads %d runs %d loom %.2f ms %.1f GFLOP/s",
             loom_dtype_name(dts[d].dt), (long long)M, (long long)N, (long long)K, threads, nl,
             ls * 1e3, flop / ls * 1e-9);
      if (torch) {
        double ts = bench_median(tt, nt);
        printf(" torch %.1f GFLOP/s ratio %.2f\n", flop / ts * 1e-9, ts / ls);
      } else {
        printf(" torch n/a\n");
      }
      fflush(stdout);
      loom_tensor_free(a);
      loom_tensor_free(b);
    }
  return failed;
}
