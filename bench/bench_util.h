/* bench_util.h: what the benchmarks share: a monotonic clock, the median of a sample, a check
 * that stops the benchmark on a loom error, random tensors, and the thread count. Header-only,
 * static functions. */
#ifndef LOOM_BENCH_UTIL_H
#define LOOM_BENCH_UTIL_H

#include <loom/loom.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline double bench_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static inline int bench_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Sorts v. */
static inline double bench_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, bench_cmp);
  return v[n / 2];
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

/* The thread count from argv[1] (default 1), set for this thread's ops. */
static inline int bench_threads(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  if (threads < 1) threads = 1;
  loom_set_num_threads(threads);
  return threads;
}

#endif
