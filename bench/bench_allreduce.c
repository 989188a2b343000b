/* bench_allreduce.c: all-reduce latency and bus bandwidth (2(n-1)/n x bytes / time) by size,
 * 4 B and 4 KB .. 256 MB, f32 sum, for the threads backend (2 ranks by default) and, in the same
 * run, for the mpi backend beside a raw MPI_Allreduce loop over the same sizes (the program
 * launches itself under mpiexec with the same rank count for that part). Each figure is the
 * median of 5 timed loops (BENCH_TRIALS); buffers are touched first so page faults are not timed.
 * Usage: bench_allreduce [RANKS] [MAX_MB] [all|threads|mpi|overlap] (`loom bench allreduce`);
 * BENCH_TRIALS=N in the environment times N loops per figure instead of 5; BENCH_ITERS=N caps
 * the calls per loop (default 20000). The MPI part prints, per size, loom's median and minimum
 * over the loops against raw's ("allreduce mpi/raw"); the two loops alternate which runs first.
 * The MPI part runs under the launcher of the MPI it was built with (Open MPI or MPICH; see
 * launch_mpi). Under Open MPI it uses shared memory without single-copy (the setting the tests
 * use); BENCH_MPI_CMA=1 in the environment leaves Open MPI's default single-copy (CMA) on.
 * Output: one line per backend and size:
 *   allreduce <backend> ranks=N bytes=B iters=I us=T busbw_GBs=G
 * `bench_allreduce RANKS MAX_MB overlap` times the asynchronous path instead (the DDP bucket's
 * and FSDP prefetch's): per size, each rank issues an async all-reduce, computes about 2 ms of
 * its thread's CPU time, then waits, against the same compute with no collective, interleaved
 * loop by loop. It prints rank 0's medians per step: the compute's wall time alone and beside
 * the collective, the step's wall time, and the CPU time that every thread of the process but the
 * caller's took during the compute (`other_cpu_us`: the progress thread's and MPI's; a progress
 * thread that spun beside the compute would show there, whatever the machine's load):
 *   overlap mpi bytes=B compute_alone_us=A compute_beside_us=C ratio=C/A step_us=S
 *   other_cpu_us=O */
#include <loom/dist.h>
#include <loom/dist_mpi.h>
#include <loom/status.h>

#ifdef LOOM_HAVE_MPI
#include <mpi.h>
#endif

#include "bench_args.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_TRIALS 63
/* Timed loops per figure: BENCH_TRIALS (1..63) from the environment, else 5. More, shorter-lived
 * medians hold up better on a loaded machine (BENCHMARKS.md used 41 for the 4-byte figures). */
static int trials(void) {
  const char *e = getenv("BENCH_TRIALS");
  int n = e ? atoi(e) : 5;
  return n >= 1 && n <= MAX_TRIALS ? n : 5;
}
#define TRIALS trials()
#define CHILD_FLAG "--mpi-child"
#define OVERLAP_FLAG "--mpi-overlap-child"
#ifndef LOOM_MPIEXEC /* set by cmake/loom_mpiexec.cmake */
#define LOOM_MPIEXEC "mpiexec"
#define LOOM_MPIEXEC_NP "-n"
#define LOOM_MPIEXEC_FLAGS ""
#endif

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Sizes in bytes: 4, then 4 KB x 4^k up to max_bytes (none past 4 when max_bytes is 0). */
static int sizes(size_t max_bytes, size_t *out) {
  int n = 0;
  out[n++] = 4;
  for (size_t b = 4096; b <= max_bytes; b *= 4) out[n++] = b;
  return n;
}

/* Iterations for one timed loop of `bytes`: about 50 ms of work, at least 3, at most
 * BENCH_ITERS from the environment (default 20000): on a loaded machine short loops (a few
 * thousand calls) are less often cut by a descheduling, so their median and minimum hold up. */
static int iters_for(size_t bytes) {
  double guess = bytes / 4e9 + 2e-6; /* seconds at ~4 GB/s plus latency */
  int it = (int)(0.05 / guess);
  const char *e = getenv("BENCH_ITERS");
  int cap = e && atoi(e) >= 3 ? atoi(e) : 20000;
  return it < 3 ? 3 : it > cap ? cap : it;
}

static void report(const char *backend, int ranks, size_t bytes, int iters, double secs) {
  double us = secs * 1e6, bus = 2.0 * (ranks - 1) / ranks * (double)bytes / secs / 1e9;
  printf("allreduce %-8s ranks=%d bytes=%-10zu iters=%-6d us=%-10.2f busbw_GBs=%.2f\n", backend,
         ranks, bytes, iters, us, bus);
  fflush(stdout);
}

/* ---- threads backend ---- */

typedef struct thr_arg {
  size_t max_bytes;
} thr_arg;

/* Time `iters` blocking all-reduces of `bytes`, all ranks in step; rank 0's view. */
static int thr_rank(loom_pg *pg, void *p) {
  thr_arg *a = p;
  int rc = LOOM_OK;
  float *buf = malloc(a->max_bytes);
  if (!buf) return LOOM_ENOMEM;
  memset(buf, 0, a->max_bytes);
  size_t sz[32];
  int ns = sizes(a->max_bytes, sz);
  for (int s = 0; s < ns && !rc; s++) {
    size_t count = sz[s] / 4;
    int iters = iters_for(sz[s]);
    double t[MAX_TRIALS];
    if ((rc = loom_pg_allreduce(pg, buf, buf, count, LOOM_F32, LOOM_SUM, NULL))) break;
    for (int k = 0; k < TRIALS && !rc; k++) {
      if ((rc = loom_pg_barrier(pg, NULL))) break;
      double t0 = now();
      for (int i = 0; i < iters && !rc; i++)
        rc = loom_pg_allreduce(pg, buf, buf, count, LOOM_F32, LOOM_SUM, NULL);
      t[k] = (now() - t0) / iters;
    }
    if (rc) break;
    qsort(t, TRIALS, sizeof t[0], cmp);
    if (loom_pg_rank(pg) == 0) report("threads", loom_pg_size(pg), sz[s], iters, t[TRIALS / 2]);
  }
  free(buf);
  return rc;
}

/* ---- mpi: raw MPI_Allreduce beside the mpi backend, size by size ---- */

#ifdef LOOM_HAVE_MPI
/* A launched rank's start: MPI with threads, the mpi backend's group over MPI_COMM_WORLD, a
 * zeroed buffer of max_bytes; and its end. */
static loom_pg *child_start(size_t max_bytes, int *rank, int *size, float **buf) {
  int provided;
  MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
  MPI_Comm_size(MPI_COMM_WORLD, size);
  loom_pg *pg = NULL;
  *buf = malloc(max_bytes);
  if (loom_mpi_pg_create(NULL, NULL, &pg) || !*buf) {
    fprintf(stderr, "bench_allreduce: %s\n", *buf ? loom_last_error() : "out of memory");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  memset(*buf, 0, max_bytes);
  return pg;
}

static int child_end(int rc, int rank, float *buf, loom_pg *pg) {
  if (rc) fprintf(stderr, "bench_allreduce: rank %d: %s\n", rank, loom_last_error());
  free(buf);
  loom_pg_free(pg);
  MPI_Finalize();
  return rc ? 1 : 0;
}

static int mpi_child(size_t max_bytes) {
  int rank, size, rc = LOOM_OK;
  float *buf;
  loom_pg *pg = child_start(max_bytes, &rank, &size, &buf);
  size_t sz[32];
  int ns = sizes(max_bytes, sz);
  for (int s = 0; s < ns && !rc; s++) {
    int count = (int)(sz[s] / 4), iters = iters_for(sz[s]);
    double traw[MAX_TRIALS], tloom[MAX_TRIALS];
    MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    rc = loom_pg_allreduce(pg, buf, buf, (size_t)count, LOOM_F32, LOOM_SUM, NULL);
    /* interleaved, so drift hits both alike, and the order alternates loop by loop (raw first
     * on even loops, loom first on odd ones), so neither side always runs second */
    for (int k = 0; k < TRIALS && !rc; k++)
      for (int side = 0; side < 2 && !rc; side++) {
        bool raw = (side == 0) == (k % 2 == 0);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        if (raw)
          for (int i = 0; i < iters; i++)
            MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else
          for (int i = 0; i < iters && !rc; i++)
            rc = loom_pg_allreduce(pg, buf, buf, (size_t)count, LOOM_F32, LOOM_SUM, NULL);
        (raw ? traw : tloom)[k] = (now() - t0) / iters;
      }
    /* every rank reports rank 0's median (the slowest rank sets the pace anyway) */
    qsort(traw, TRIALS, sizeof traw[0], cmp);
    qsort(tloom, TRIALS, sizeof tloom[0], cmp);
    if (rank == 0 && !rc) {
      report("raw-mpi", size, sz[s], iters, traw[TRIALS / 2]);
      report("mpi", size, sz[s], iters, tloom[TRIALS / 2]);
      printf("allreduce mpi/raw  bytes=%-10zu median %.2f (%.2f / %.2f us), min %.2f (%.2f / %.2f "
             "us) over %d loops\n", sz[s], tloom[TRIALS / 2] / traw[TRIALS / 2],
             tloom[TRIALS / 2] * 1e6, traw[TRIALS / 2] * 1e6, tloom[0] / traw[0], tloom[0] * 1e6,
             traw[0] * 1e6, TRIALS);
      fflush(stdout);
    }
  }
  return child_end(rc, rank, buf, pg);
}

/* ---- mpi, asynchronous: an all-reduce in flight beside the rank's compute ---- */

/* CPU-bound work on a cache-resident array (no memory traffic to share with the collective's
 * copies): `passes` passes of a multiply-add. */
static float work_buf[16384];
static volatile float work_sink;
static void compute(int passes) {
  for (int p = 0; p < passes; p++)
    for (int i = 0; i < 16384; i++) work_buf[i] = work_buf[i] * 0.999f + 0.001f;
  work_sink = work_buf[passes & 16383];
}

static double cpu_now(clockid_t which) {
  struct timespec t;
  clock_gettime(which, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int overlap_child(size_t max_bytes) {
  int rank, size, rc = LOOM_OK;
  float *buf;
  loom_pg *pg = child_start(max_bytes, &rank, &size, &buf);
  /* passes for about 2 ms of the thread's CPU time, rank 0's calibration for every rank */
  double t0 = cpu_now(CLOCK_THREAD_CPUTIME_ID);
  compute(200);
  int passes = (int)(200 * 2e-3 / (cpu_now(CLOCK_THREAD_CPUTIME_ID) - t0 + 1e-9));
  passes = passes < 1 ? 1 : passes > 100000 ? 100000 : passes;
  MPI_Bcast(&passes, 1, MPI_INT, 0, MPI_COMM_WORLD);
  static const size_t sz[] = {4, 65536, 1 << 20, 4 << 20, 16 << 20, 64 << 20};
  enum { ITERS = 20 };
  for (size_t s = 0; s < sizeof sz / sizeof sz[0] && sz[s] <= max_bytes && !rc; s++) {
    size_t count = sz[s] / 4;
    double alone[MAX_TRIALS], beside[MAX_TRIALS], step[MAX_TRIALS], cpu[MAX_TRIALS];
    rc = loom_pg_allreduce(pg, buf, buf, count, LOOM_F32, LOOM_SUM, NULL);
    for (int k = 0; k < TRIALS && !rc; k++) { /* interleaved: compute alone, then beside */
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = now();
      for (int i = 0; i < ITERS; i++) compute(passes);
      alone[k] = (now() - t0) / ITERS;
      MPI_Barrier(MPI_COMM_WORLD);
      double in = 0, other = 0;
      t0 = now();
      for (int i = 0; i < ITERS && !rc; i++) {
        loom_work *w = NULL;
        rc = loom_pg_allreduce(pg, buf, buf, count, LOOM_F32, LOOM_SUM, &w);
        double tc = now(), p0 = cpu_now(CLOCK_PROCESS_CPUTIME_ID);
        double c0 = cpu_now(CLOCK_THREAD_CPUTIME_ID);
        compute(passes);
        in += now() - tc;
        other += (cpu_now(CLOCK_PROCESS_CPUTIME_ID) - p0) - (cpu_now(CLOCK_THREAD_CPUTIME_ID) - c0);
        if (!rc) rc = loom_work_wait(&w);
      }
      step[k] = (now() - t0) / ITERS;
      cpu[k] = other / ITERS;
      beside[k] = in / ITERS;
    }
    qsort(alone, TRIALS, sizeof alone[0], cmp);
    qsort(beside, TRIALS, sizeof beside[0], cmp);
    qsort(step, TRIALS, sizeof step[0], cmp);
    qsort(cpu, TRIALS, sizeof cpu[0], cmp);
    if (rank == 0 && !rc) {
      int m = TRIALS / 2;
      printf("overlap mpi bytes=%-10zu compute_alone_us=%.0f compute_beside_us=%.0f ratio=%.3f "
             "step_us=%.0f other_cpu_us=%.0f over %d loops of %d\n", sz[s], alone[m] * 1e6,
             beside[m] * 1e6, beside[m] / alone[m], step[m] * 1e6, cpu[m] * 1e6, TRIALS, ITERS);
      fflush(stdout);
    }
  }
  return child_end(rc, rank, buf, pg);
}

/* Run this program again under mpiexec for the MPI part: the launcher CMake found for the MPI
 * this program was built with (cmake/loom_mpiexec.cmake: Open MPI's or MPICH's), with its
 * flags. Open MPI runs over shared memory, single-copy (CMA) off unless BENCH_MPI_CMA=1 and
 * unbound; MPICH's hydra binds nothing by default, and its UCX picks the transport (CMA here). */
static int launch_mpi(int ranks, int max_mb, const char *child_flag) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return 1;
  self[n] = 0;
  char cmd[8192];
#ifdef LOOM_TOOL
  const char *sub = "bench allreduce ";
#else
  const char *sub = "";
#endif
#if LOOM_MPIEXEC_OPENMPI
  const char *cma = getenv("BENCH_MPI_CMA");
  bool single = cma && strcmp(cma, "1") == 0;
  printf("allreduce: mpi transport: shared memory, single-copy %s\n",
         single ? "default (CMA)" : "none");
  const char *env = single ? "OMPI_MCA_btl=self,vader"
                           : "OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none",
             *extra = "--bind-to none";
#else
  printf("allreduce: mpi transport: the MPI's default (%s)\n", LOOM_MPIEXEC);
  const char *env = "", *extra = "";
#endif
  snprintf(cmd, sizeof cmd, "%s '%s' %s %d %s %s '%s' %s%d %d %s", env, LOOM_MPIEXEC,
           LOOM_MPIEXEC_NP, ranks, LOOM_MPIEXEC_FLAGS, extra, self, sub, ranks, max_mb,
           child_flag);
  fflush(stdout);
  return system(cmd) == 0 ? 0 : 1;
}
#endif

int bench_allreduce_main(int argc, char **argv) {
  static const bench_arg args[] = {
      {"RANKS", "ranks (default 2)", NULL, 1, 64},
      {"MAX_MB", "the largest message in MiB (default 256; 0: the 4-byte all-reduce only)",
       NULL, 0, 4096},
      {"BACKENDS", "which backends run (default all; overlap: the mpi backend's async path "
       "beside compute)", "all|threads|mpi|overlap", 0, 0}, {0}};
  bool child = argc == 4 && (strcmp(argv[3], CHILD_FLAG) == 0 ||
                             strcmp(argv[3], OVERLAP_FLAG) == 0); /* launched by launch_mpi */
  int done = child ? -1 : bench_args(BENCH_PROG("allreduce"), "All-reduce latency and bus "
                                     "bandwidth by size, threads and MPI backends.", args,
                                     argc, argv);
  if (done >= 0) return done;
  int ranks = argc > 1 ? atoi(argv[1]) : 2;
  int max_mb = argc > 2 ? atoi(argv[2]) : 256;
  size_t max_bytes = max_mb > 0 ? (size_t)max_mb << 20 : 4; /* 0: 4 bytes only */
#ifdef LOOM_HAVE_MPI
  if (argc > 3 && strcmp(argv[3], CHILD_FLAG) == 0) return mpi_child(max_bytes);
  if (argc > 3 && strcmp(argv[3], OVERLAP_FLAG) == 0) return overlap_child(max_bytes);
#endif
  const char *which = argc > 3 ? argv[3] : "all";
  bool overlap = strcmp(which, "overlap") == 0;
  bool thr = strcmp(which, "mpi") != 0 && !overlap, mpi = strcmp(which, "threads") != 0;
  thr_arg a = {max_bytes};
  int rc = thr ? loom_threads_run(ranks, NULL, thr_rank, &a) : LOOM_OK;
  if (rc) {
    fprintf(stderr, "bench_allreduce: threads: %s\n", loom_last_error());
    return 1;
  }
#ifdef LOOM_HAVE_MPI
  if (mpi && ranks > 1 && launch_mpi(ranks, max_mb, overlap ? OVERLAP_FLAG : CHILD_FLAG)) {
    fprintf(stderr, "bench_allreduce: the MPI part failed\n");
    return 1;
  }
#else
  (void)mpi;
  printf("allreduce: built without MPI, no mpi or raw-mpi figures\n");
#endif
  return 0;
}

#ifndef LOOM_TOOL
int main(int argc, char **argv) { return bench_allreduce_main(argc, argv); }
#endif
