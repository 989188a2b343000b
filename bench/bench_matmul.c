/* bench_matmul.c: GEMM speed, in two parts.
 *
 * 1. loom against PyTorch: GFLOP/s of loom_matmul (oneDNN underneath, or OpenBLAS for f32 on
 * CPUs without AVX-512: src/ops/gemm_blas.c, README "GEMM") at 1024x1024x1024 and
 * 4096x4096x1024 (M x N x K) in f32 and bf16, beside PyTorch's torch.matmul on the same sizes,
 * dtypes and thread count in the same run (through /usr/bin/python3 when torch is installed;
 * skipped otherwise), with the ratio loom / PyTorch.
 * The two are timed in 3 alternating rounds (9 calls each at 1024, 3 at 4096) and each side's
 * median over all its calls is reported, so that both see the same machine load. Both sides
 * allocate their output on every call (loom_matmul and torch.matmul return a new tensor). Each
 * call is timed by the wall clock and by the calling thread's CPU time (loom:
 * CLOCK_THREAD_CPUTIME_ID, torch: time.thread_time()); at 1 thread both compute on the calling
 * thread, so the "cpu" figures leave out the time other processes held the core on a shared
 * machine (with more threads they mean nothing). Before
 * timing, loom's product is checked against a double-precision dot product at sampled elements.
 * PyTorch is capped to the same thread count as loom in both its pools (bench_torch_cmd:
 * torch.set_num_threads alone leaves Debian's OpenBLAS, which runs torch's f32 matmul, on every
 * core), and the line reports the counts it ran with.
 *
 * 2. The GEMM choice, f32 (only when built with OpenBLAS, LOOM_BENCH_OPENBLAS): loom__gemm on
 * oneDNN (loom__gemm_blas_set_mode(NEVER)) against OpenBLAS's cblas_sgemm on the same operands
 * (loom tensors, placed as loom's own) and thread count, timed call by call alternately,
 * medians: square 256, 512, 1024, 2048 in the three transpose variants (NN; NT = B stored
 * [N,K], linear's forward; TN = A stored [K,M], linear's weight gradient), and the 8 GEMMs of
 * an MLP 784-1024-1024-10 step at batch 256 with the transposes and bias that src/ops/matmul.c's
 * linear passes, alone and as one step. OpenBLAS has no bias: its forward rows are filled with
 * the bias first and multiplied with beta = 1, inside the timed call. The two products are
 * compared element by element first. The step is also run through loom__gemm with loom's own
 * choice (gemm_blas.c, "loom-auto"): what loom runs by default.
 * Each is timed by the wall clock and by the calling thread's CPU time ("cpu": with 1 thread
 * both libraries compute on the calling thread, and time other processes held the core is not
 * counted; with more threads the cpu figures mean nothing).
 *
 * Threads: loom_set_num_threads, torch and OpenBLAS with the same count (default 1).
 * Usage: bench_matmul [threads] [torch|gemm|gpt] (one part only; gpt: part 2 on the GPT step's
 * 15 products instead, bench/llmc_side_by_side.sh's model). Prints one line per size and dtype:
 *   matmul <dtype> <M>x<N>x<K> threads <t> runs <r> loom <ms> ms <GFLOP/s> GFLOP/s
 *   torch <GFLOP/s> GFLOP/s ratio <loom GFLOP/s / torch GFLOP/s> (torch threads <t> openblas <t>)
 *   (cpu: loom <GFLOP/s> torch <GFLOP/s> ratio <loom / torch, CPU time>)
 * then one per GEMM-choice shape:
 *   gemm <variant> <M>x<N>x<K> runs <r> onednn <GFLOP/s> openblas <GFLOP/s> ratio <onednn/openblas>
 *   (cpu: <onednn GFLOP/s> <openblas GFLOP/s> ratio <onednn/openblas>)
 * and "gemm mlp-step" with the 8 GEMMs' milliseconds on each side and with loom's choice. */
#include "bench_util.h"

#include "ops/gemm.h"

#include <loom/loom.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef LOOM_BENCH_OPENBLAS
#include <cblas.h>
/* OpenBLAS's own calls (declared by its cblas.h, not by another BLAS's) */
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
char *openblas_get_corename(void);
#endif

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

/* Appends the seconds of `runs` torch.matmul calls for this size and dtype to t[*n] (wall) and
 * tc[*n] (the calling thread's CPU time) and stores the thread counts PyTorch reported in tthr;
 * false without torch. */
static bool torch_times(int64_t M, int64_t N, int64_t K, const char *dt, int runs, int threads,
                        double *t, double *tc, int *n, int tthr[2]) {
  char py[96], cmd[2048];
  bench_torch_cmd(py, sizeof py, threads);
  snprintf(cmd, sizeof cmd,
           "%s -c \"" BENCH_TORCH_CAP
           "import time\n"
           "dt=getattr(torch, '%s')\n"
           "a=(torch.rand(%lld, %lld)*2-1).to(dt); b=(torch.rand(%lld, %lld)*2-1).to(dt)\n"
           "torch.matmul(a, b)\n"
           "for r in range(%d):\n"
           "  t0=time.perf_counter(); c0=time.thread_time(); c=torch.matmul(a, b)\n"
           "  print(time.perf_counter()-t0, time.thread_time()-c0); del c\n"
           "\" 2>/dev/null",
           py, threads, dt, (long long)M, (long long)K, (long long)K, (long long)N, runs);
  FILE *p = popen(cmd, "r");
  if (!p) return false;
  int got = 0;
  char line[256];
  while (got < runs && fgets(line, sizeof line, p))
    if (!bench_torch_threads(line, tthr) &&
        sscanf(line, "%lf %lf", &t[*n + got], &tc[*n + got]) == 2)
      got++;
  pclose(p);
  *n += got;
  return got == runs;
}

/* Part 1: loom_matmul against torch.matmul. Returns nonzero when loom's product is wrong. */
static int against_torch(int threads) {
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
      double lt[ROUNDS * 16], tt[ROUNDS * 16], lc[ROUNDS * 16], tc[ROUNDS * 16];
      int nl = 0, nt = 0, tthr[2] = {-1, -1};
      bool torch = true;
      for (int round = 0; round < ROUNDS; round++) { /* alternate, so both see the same load */
        for (int r = 0; r < runs; r++) {
          double t0 = bench_now(), c0 = bench_cpu_now();
          BENCH_CHECK(loom_matmul(a, b, &c));
          lc[nl] = bench_cpu_now() - c0;
          lt[nl++] = bench_now() - t0;
          loom_tensor_free(c);
        }
        if (torch) torch = torch_times(M, N, K, dts[d].torch, runs, threads, tt, tc, &nt, tthr);
      }
      double flop = 2.0 * (double)M * (double)N * (double)K, ls = bench_median(lt, nl);
      printf("matmul %-4s %lldx%lldx%lld threads %d runs %d loom %.2f ms %.1f GFLOP/s",
             loom_dtype_name(dts[d].dt), (long long)M, (long long)N, (long long)K, threads, nl,
             ls * 1e3, flop / ls * 1e-9);
      if (torch) {
        double ts = bench_median(tt, nt), lcs = bench_median(lc, nl), tcs = bench_median(tc, nt);
        printf(" torch %.1f GFLOP/s ratio %.2f (torch threads %d openblas %d) "
               "(cpu: loom %.1f torch %.1f GFLOP/s ratio %.2f)\n",
               flop / ts * 1e-9, ts / ls, tthr[0], tthr[1], flop / lcs * 1e-9, flop / tcs * 1e-9,
               tcs / lcs);
      } else {
        printf(" torch n/a\n");
      }
      fflush(stdout);
      loom_tensor_free(a);
      loom_tensor_free(b);
    }
  return failed;
}

#ifdef LOOM_BENCH_OPENBLAS
/* ---- part 2: the GEMM choice, oneDNN against OpenBLAS ---------------------------------- */

/* One f32 product as loom's ops call it: op(A) [M,K], op(B) [K,N], C [M,N], optional bias. */
typedef struct shape {
  const char *name;
  int64_t M, N, K;
  bool ta, tb, bias;
} shape;

/* Operands in loom tensors, so that both libraries see buffers placed as loom's own (64-byte
 * aligned by loom's allocator): oneDNN 2.6's f32 GEMM on AVX2 runs some shapes at half speed
 * on 64-byte aligned operands and full speed 16 bytes off (README "GEMM"), so malloc'd
 * buffers, whose placement depends on the heap's history, would not measure what loom runs. */
typedef struct operands {
  loom_tensor *t[5];
  float *a, *b, *c1, *c2, *bias;
} operands;

static float *rand_floats(loom_tensor **t, int64_t n) {
  *t = bench_rand_tensor(1, &n, LOOM_F32, 1.0f);
  return loom_tensor_data(*t);
}

static void operands_init(operands *o, const shape *s) {
  o->a = rand_floats(&o->t[0], s->M * s->K);
  o->b = rand_floats(&o->t[1], s->K * s->N);
  o->c1 = rand_floats(&o->t[2], s->M * s->N);
  o->c2 = rand_floats(&o->t[3], s->M * s->N);
  o->t[4] = NULL;
  o->bias = s->bias ? rand_floats(&o->t[4], s->N) : NULL;
}

static void operands_free(operands *o) {
  for (int i = 0; i < 5; i++) loom_tensor_free(o->t[i]);
}

/* loom__gemm on the shape: oneDNN while the mode is LOOM__GEMM_BLAS_NEVER, loom's own choice
 * (gemm_blas.c) under LOOM__GEMM_BLAS_AUTO once loom__gemm consults it. */
static void run_loom(const shape *s, const operands *o) {
  loom__gemm_args g = {.trans_a = s->ta, .trans_b = s->tb, .batch = 1, .M = s->M, .N = s->N,
                       .K = s->K, .alpha = 1.0f, .beta = 0.0f, .A = o->a,
                       .lda = s->ta ? s->M : s->K, .B = o->b, .ldb = s->tb ? s->K : s->N,
                       .C = o->c1, .ldc = s->N, .ab_dtype = LOOM_F32, .c_dtype = LOOM_F32,
                       .bias = o->bias};
  BENCH_CHECK(loom__gemm(&g));
}

static void run_openblas(const shape *s, const operands *o) {
  if (o->bias)
    for (int64_t i = 0; i < s->M; i++) memcpy(o->c2 + i * s->N, o->bias, (size_t)s->N * 4);
  cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans,
              (int)s->M, (int)s->N, (int)s->K, 1.0f, o->a, (int)(s->ta ? s->M : s->K), o->b,
              (int)(s->tb ? s->K : s->N), o->bias ? 1.0f : 0.0f, o->c2, (int)s->N);
}

/* Nonzero when the two products differ by more than f32 rounding of K terms in [-1, 1]. */
static int compare(const shape *s, const operands *o) {
  double tol = 1e-5 * (double)s->K + 1e-6;
  for (int64_t i = 0; i < s->M * s->N; i++)
    if (fabs((double)o->c1[i] - (double)o->c2[i]) > tol) {
      fprintf(stderr, "bench_matmul: %s C[%lld]: oneDNN %.9g, OpenBLAS %.9g\n", s->name,
              (long long)i, o->c1[i], o->c2[i]);
      return 1;
    }
  return 0;
}

/* Calls per side: enough for about 0.3 s of each at 50 GFLOP/s, 15 to 301. */
static int calls_for(double flop) {
  double n = 0.3 * 50e9 / flop;
  return n < 15 ? 15 : n > 301 ? 301 : (int)n | 1;
}

/* The GPT step's products (6 layers, 384 wide, context 256, batch 16: 4096 rows; vocabulary
 * 256), as linear runs them: forward NT with bias, weight gradient TN, input gradient NN. */
static const shape gpt[] = {
    {"attn-fwd-NT+b", 4096, 1152, 384, false, true, true},
    {"attn-dW-TN", 1152, 384, 4096, true, false, false},
    {"attn-dX-NN", 4096, 384, 1152, false, false, false},
    {"aproj-fwd-NT+b", 4096, 384, 384, false, true, true},
    {"aproj-dW-TN", 384, 384, 4096, true, false, false},
    {"aproj-dX-NN", 4096, 384, 384, false, false, false},
    {"fc-fwd-NT+b", 4096, 1536, 384, false, true, true},
    {"fc-dW-TN", 1536, 384, 4096, true, false, false},
    {"fc-dX-NN", 4096, 384, 1536, false, false, false},
    {"mproj-fwd-NT+b", 4096, 384, 1536, false, true, true},
    {"mproj-dW-TN", 384, 1536, 4096, true, false, false},
    {"mproj-dX-NN", 4096, 1536, 384, false, false, false},
    {"head-fwd-NT", 4096, 256, 384, false, true, false},
    {"head-dW-TN", 256, 384, 4096, true, false, false},
    {"head-dX-NN", 4096, 384, 256, false, false, false},
    {"attn-dW-NN", 1152, 384, 4096, false, false, false},
    {"aproj-dW-NN", 384, 384, 4096, false, false, false},
    {"fc-dW-NN", 1536, 384, 4096, false, false, false},
    {"mproj-dW-NN", 384, 1536, 4096, false, false, false},
};

/* part: "gemm" (the squares and the MLP step) or "gpt" (the GPT step's shapes). */
static int gemm_choice(int threads, const char *which) {
  static const shape squares[] = {
      {"NN", 256, 256, 256, false, false, false},     {"NT", 256, 256, 256, false, true, false},
      {"TN", 256, 256, 256, true, false, false},      {"NN", 512, 512, 512, false, false, false},
      {"NT", 512, 512, 512, false, true, false},      {"TN", 512, 512, 512, true, false, false},
      {"NN", 1024, 1024, 1024, false, false, false},  {"NT", 1024, 1024, 1024, false, true, false},
      {"TN", 1024, 1024, 1024, true, false, false},   {"NN", 2048, 2048, 2048, false, false, false},
      {"NT", 2048, 2048, 2048, false, true, false},   {"TN", 2048, 2048, 2048, true, false, false},
  };
  /* MLP 784-1024-1024-10, batch 256, as linear runs it: forward y = x W^T + b (NT, bias),
   * weight gradient G^T X (TN), input gradient G W (NN); layer 1's input gradient is not
   * needed. */
  static const shape mlp[] = {
      {"fwd1-NT+bias", 256, 1024, 784, false, true, true},
      {"fwd2-NT+bias", 256, 1024, 1024, false, true, true},
      {"fwd3-NT+bias", 256, 10, 1024, false, true, true},
      {"dW3-TN", 10, 1024, 256, true, false, false},
      {"dX3-NN", 256, 1024, 10, false, false, false},
      {"dW2-TN", 1024, 1024, 256, true, false, false},
      {"dX2-NN", 256, 1024, 1024, false, false, false},
      {"dW1-TN", 1024, 784, 256, true, false, false},
  };
  enum { NSQ = sizeof squares / sizeof *squares, NMLP = sizeof mlp / sizeof *mlp, STEPS = 31 };
  openblas_set_num_threads(threads);
  loom__gemm_blas_set_mode(LOOM__GEMM_BLAS_NEVER); /* loom__gemm is oneDNN until said otherwise */
  printf("\n# GEMM choice, f32, %d thread(s): loom__gemm (oneDNN) against cblas_sgemm (OpenBLAS "
         "%s, %d thread(s)), alternating call by call, medians\n",
         threads, openblas_get_corename(), openblas_get_num_threads());
  int failed = 0;
  bool only_gpt = !strcmp(which, "gpt");
  for (int part = only_gpt ? 2 : 0; part < (only_gpt ? 3 : 2); part++) {
    const shape *list = part == 2 ? gpt : part ? mlp : squares;
    int n = part == 2 ? (int)(sizeof gpt / sizeof *gpt) : part ? NMLP : NSQ;
    for (int i = 0; i < n; i++) {
      const shape *s = &list[i];
      operands o;
      operands_init(&o, s);
      run_loom(s, &o), run_openblas(s, &o);
      if (compare(s, &o)) failed = 1;
      double flop = 2.0 * (double)s->M * (double)s->N * (double)s->K;
      int calls = calls_for(flop);
      double *t = malloc(4 * (size_t)calls * sizeof *t), m[4];
      if (!t) exit(1);
      for (int r = 0; r < calls; r++) {
        double w0 = bench_now(), c0 = bench_cpu_now();
        run_loom(s, &o);
        double w1 = bench_now(), c1 = bench_cpu_now();
        run_openblas(s, &o);
        t[r] = w1 - w0, t[calls + r] = bench_now() - w1;
        t[2 * calls + r] = c1 - c0, t[3 * calls + r] = bench_cpu_now() - c1;
      }
      for (int k = 0; k < 4; k++) m[k] = bench_median(t + k * calls, calls);
      printf("gemm %-12s %lldx%lldx%lld runs %d onednn %.1f GFLOP/s openblas %.1f GFLOP/s "
             "ratio %.2f (cpu: %.1f %.1f ratio %.2f)\n",
             s->name, (long long)s->M, (long long)s->N, (long long)s->K, calls, flop / m[0] * 1e-9,
             flop / m[1] * 1e-9, m[1] / m[0], flop / m[2] * 1e-9, flop / m[3] * 1e-9, m[3] / m[2]);
      fflush(stdout);
      free(t);
      operands_free(&o);
    }
  }
  if (only_gpt) return failed;
  /* the step's 8 GEMMs back to back: oneDNN, OpenBLAS, and loom__gemm's own choice in turn */
  operands o[NMLP];
  for (int i = 0; i < NMLP; i++) operands_init(&o[i], &mlp[i]);
  double t[6][STEPS], m[6];
  for (int r = -2; r < STEPS; r++) { /* 2 warm-up steps */
    double w[4], c[4];
    for (int side = 0; side < 3; side++) {
      loom__gemm_blas_set_mode(side == 2 ? LOOM__GEMM_BLAS_AUTO : LOOM__GEMM_BLAS_NEVER);
      w[side] = bench_now(), c[side] = bench_cpu_now();
      for (int i = 0; i < NMLP; i++)
        side == 1 ? run_openblas(&mlp[i], &o[i]) : run_loom(&mlp[i], &o[i]);
    }
    w[3] = bench_now(), c[3] = bench_cpu_now();
    for (int side = 0; r >= 0 && side < 3; side++) {
      t[side][r] = w[side + 1] - w[side];
      t[3 + side][r] = c[side + 1] - c[side];
    }
  }
  loom__gemm_blas_set_mode(LOOM__GEMM_BLAS_NEVER);
  for (int k = 0; k < 6; k++) m[k] = bench_median(t[k], STEPS);
  printf("gemm mlp-step 8 GEMMs runs %d onednn %.2f ms openblas %.2f ms ratio %.2f loom-auto "
         "%.2f ms (cpu: %.2f %.2f ratio %.2f auto %.2f)\n",
         STEPS, m[0] * 1e3, m[1] * 1e3, m[1] / m[0], m[2] * 1e3, m[3] * 1e3, m[4] * 1e3,
         m[4] / m[3], m[5] * 1e3);
  for (int i = 0; i < NMLP; i++) operands_free(&o[i]);
  return failed;
}
#endif

int main(int argc, char **argv) {
  int threads = bench_threads(argc, argv), failed = 0;
  const char *part = argc > 2 ? argv[2] : "all";
  if (strcmp(part, "gemm") && strcmp(part, "gpt")) failed |= against_torch(threads);
  if (strcmp(part, "torch")) {
#ifdef LOOM_BENCH_OPENBLAS
    failed |= gemm_choice(threads, part);
#else
    printf("\n# GEMM choice: not built (OpenBLAS not found)\n");
#endif
  }
  return failed;
}
