/* dist_test.h: helpers of the dist tests: deterministic rank inputs, the sequential reference
 * of every collective, and a thread-safe check (the lt checks are for the main thread only:
 * rank threads count failures here and the test asserts the count at the end). */
#ifndef LOOM_DIST_TEST_H
#define LOOM_DIST_TEST_H

#include "lt.h"
#include "core/core_int.h"
#include "loom/dist.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

extern _Atomic int dt_failures;
#define DT_CHECK(cond, ...)                                                                    \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      if (atomic_fetch_add(&dt_failures, 1) < 20) {                                           \
        fprintf(stderr, "  %s:%d: check %s failed: ", __FILE__, __LINE__, #cond);            \
        fprintf(stderr, __VA_ARGS__);                                                          \
        fprintf(stderr, " (last error: %s)\n", loom_last_error());                            \
      }                                                                                       \
    }                                                                                         \
  } while (0)

static inline double dt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Rank r's input value i for a test `seed` and op (PROD gets values near 1, integers small). */
double dt_value(int r, size_t i, unsigned seed, loom_dtype dt, loom_redop op);
/* Fill buf (n elements of dt) with rank r's values starting at index `first`. */
void dt_fill(void *buf, loom_dtype dt, size_t n, int r, size_t first, unsigned seed,
             loom_redop op);
/* ref[i] = op over ranks 0..n-1 of dt_value(rank, first + i), folded in rank order with the
 * library's rules (f16/bf16 in f32, integers wrapping). */
void dt_reduce_ref(void *ref, loom_dtype dt, loom_redop op, int nranks, size_t count,
                   size_t first, unsigned seed);

/* Every collective x dtype x op x in-place x count (0, 1, 5, 1001, 9001, 70001) on pg, each
 * checked bit for bit against the reference (DT_CHECK). A loom_threads_run function. */
int dt_all_cases(loom_pg *pg, void *arg);

/* Reduce-scatters of 2^21 + 7 elements per block (f32, f16, bf16, i32; SUM and AVG; in place or
 * not), checked bit for bit: large enough for the MPI backend to move them in several pieces
 * and a short last one (src/dist/mpi/pg_mpi.c). */
void dt_large_reduce_scatters(loom_pg *pg);

#endif
