/* bench_util.h: what the benchmarks share: a monotonic clock, the thread's CPU time, pinning to a CPU, the median of a sample, a check
 * that stops the benchmark on a loom error, random tensors, the thread count, and how to start
 * PyTorch as a baseline on the same thread count. Header-only, static functions. */
#ifndef LOOM_BENCH_UTIL_H
#define LOOM_BENCH_UTIL_H

#include <loom/loom.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline double bench_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The calling thread's CPU time: time other processes held the core is not counted (the
 * measure for 1-thread compute on a shared machine). */
static inline double bench_cpu_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The process's CPU time, every thread's (the measure for a multi-threaded or multi-rank step
 * on a shared machine). */
static inline double bench_process_cpu_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

#ifdef _GNU_SOURCE
#include <sched.h>
/* Pins the process to the CPU it runs on (a file that wants it defines _GNU_SOURCE before
 * including this header); that CPU, or -1. */
static inline int bench_pin(void) {
  int cpu = sched_getcpu();
  if (cpu < 0) return -1;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return sched_setaffinity(0, sizeof set, &set) == 0 ? cpu : -1;
}
#endif

static inline int bench_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Sorts v. */
static inline double bench_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, bench_cmp);
  return v[n / 2];
}

/* A GEMM benchmark's product: what it is (a layer's name), its sizes and transposes. */
typedef struct bench_gemm_shape {
  const char *what;
  int64_t M, N, K;
  bool ta, tb;
} bench_gemm_shape;

/* bytes (rounded up to 64) aligned to 64; stops the benchmark when memory runs out. */
static inline void *bench_buf(size_t bytes) {
  void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) {
    fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
    exit(1);
  }
  return p;
}

/* The worst difference between a product C and a reference R (n elements, sums over K) relative
 * to the size of a typical element: |C - R| / (|R| + sqrt(K) / 3), a sum of K products of
 * values of standard deviation 1/3 each (the GEMM benchmarks' check of one kernel against
 * another on the same values, before timing them). */
static inline double bench_gemm_rel_diff(const float *R, const float *C, size_t n, int64_t K) {
  double worst = 0, typ = __builtin_sqrt((double)K) / 3;
  for (size_t j = 0; j < n; j++) {
    double d = __builtin_fabs((double)R[j] - C[j]) / (__builtin_fabs((double)R[j]) + typ);
    if (d > worst) worst = d;
  }
  return worst;
}

/* n operand values uniform in [-1, 1) for A and B (a fixed sequence), rounded to dt in a and b
 * and A, B set to their exact f32 values: the same values on every side of a GEMM benchmark. */
static inline void bench_gemm_operands(float *A, float *B, uint16_t *a, uint16_t *b, size_t n,
                                       loom_dtype dt) {
  uint64_t r = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < n; i++) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    A[i] = (float)((r >> 40) & 0xffff) / 32768.0f - 1.0f;
    B[i] = (float)((r >> 20) & 0xffff) / 32768.0f - 1.0f;
  }
  loom_convert(A, LOOM_F32, a, dt, n);
  loom_convert(B, LOOM_F32, b, dt, n);
  loom_convert(a, dt, A, LOOM_F32, n);
  loom_convert(b, dt, B, LOOM_F32, n);
}

#define BENCH_CHECK(call)                                                                          \
  do {                                                                                             \
    int rc_ = (call);                                                                              \
    if (rc_ != LOOM_OK) {                                                                          \
      fprintf(stderr, "%s: %s failed: %s\n", __FILE__, #call, loom_last_error());                  \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

/* A tensor of uniform values in [-scale, scale), made in f32 and rounded to dt. */
static inline loom_tensor *bench_rand_tensor(int ndim, const int64_t *shape, loom_dtype dt,
                                             float scale) {
  loom_tensor *f, *t;
  BENCH_CHECK(loom_tensor_empty(LOOM_F32, ndim, shape, &f));
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  float *p = loom_tensor_data(f);
  for (int64_t i = 0; i < n; i++) p[i] = scale * (2.0f * (float)rand() / (float)RAND_MAX - 1.0f);
  BENCH_CHECK(loom_tensor_cast(f, dt, &t));
  loom_tensor_free(f);
  return t;
}

/* ---- PyTorch as a fair baseline ----------------------------------------------------------
 * torch.set_num_threads(n) does not cap the OpenBLAS pool behind Debian's torch f32 matmul
 * (one thread per core). A PyTorch baseline on `threads` threads is started with
 * bench_torch_cmd, which puts OPENBLAS_NUM_THREADS and OMP_NUM_THREADS in its environment
 * (OPENBLAS_CORETYPE and the rest are inherited as they are), and its Python calls
 * bench/torch_threads.py's cap(threads) (BENCH_TORCH_CAP) and prints torch_threads.line(), the
 * counts it really ran with, which bench_torch_threads parses for the report. */

/* Python that imports bench/torch_threads.py and caps torch and OpenBLAS to `%d` threads, as
 * the first lines of a `python3 -c` script (which must then take the thread count first). */
#define BENCH_TORCH_CAP                                                                            \
  "import sys; sys.path.insert(0, '" LOOM_SOURCE_DIR "/bench'); import torch_threads\n"         \
  "torch = torch_threads.cap(%d); print(torch_threads.line(), flush=True)\n"

/* Writes "OPENBLAS_NUM_THREADS=t OMP_NUM_THREADS=t /usr/bin/python3" into buf (the start of a
 * popen command). */
static inline void bench_torch_cmd(char *buf, size_t n, int threads) {
  snprintf(buf, n, "OPENBLAS_NUM_THREADS=%d OMP_NUM_THREADS=%d /usr/bin/python3", threads,
           threads);
}

/* Parses a "torch_threads <torch> <openblas> core <core...>" line into t[0], t[1]; false for
 * another line. t[1] is -1 when no OpenBLAS was loaded. The first such line of the process also
 * prints "pytorch: OpenBLAS core <core...>" (and whether torch_threads.py had to set
 * OPENBLAS_CORETYPE), so every PyTorch figure names the kernels it ran on. */
static inline bool bench_torch_threads(const char *line, int t[2]) {
  static bool said;
  if (sscanf(line, "torch_threads %d %d", &t[0], &t[1]) != 2) return false;
  const char *core = strstr(line, " core ");
  if (core && !said) {
    said = true;
    printf("pytorch: OpenBLAS core %s", core + 6); /* the line ends with its newline */
  }
  return true;
}

/* The thread count from argv[1] (default 1), set for this thread's ops. */
static inline int bench_threads(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  if (threads < 1) threads = 1;
  loom_set_num_threads(threads);
  return threads;
}

#endif
