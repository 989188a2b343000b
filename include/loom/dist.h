/* loom/dist.h: process groups and collectives.
 *
 * A process group (loom_pg) is a set of `size` ranks, numbered 0..size-1, that issue the same
 * sequence of collectives: all-reduce, broadcast, all-gather, reduce-scatter and barrier, on
 * f32, f16, bf16, i32 and i64 buffers. Two backends implement it:
 *   - threads (this header): the ranks are threads of one process, started by loom_threads_run.
 *     No launcher, no setup: the default, and what the dist/ddp/fsdp tests use.
 *   - mpi (loom/dist_mpi.h): each rank is an MPI process (mpirun -n N), one group per
 *     communicator. Built only when MPI is found.
 *
 * Collectives. Every collective has NCCL's argument shape,
 *     loom_pg_allreduce(pg, send, recv, count, dtype, op, &work)
 * and two forms: with `out == NULL` it blocks until the result is in `recv`; with `out` it
 * starts the collective and hands back a work handle (below) at once. Collectives run in issue
 * order on a per-group progress thread, so an async collective overlaps the caller's compute.
 * Every rank must issue the same collectives, with the same count, dtype, op and root, in the
 * same order. Issue collectives on a group from one thread at a time (any thread); waits,
 * tests, loom_pg_abort and loom_pg_async_error may come from any thread.
 * Buffers passed to an async collective are on loan until its work completes: do not read or
 * write them before then. Floating reductions of f16/bf16 accumulate in f32 and round once;
 * every rank receives the same bits. AVG divides the sum by the group size (integers: C
 * division, toward zero). Integer SUM and PROD wrap around (two's complement).
 *
 * Work handles follow MPI's request semantics: loom_work_wait blocks, frees the handle and sets
 * it to NULL, even when the collective failed; waiting on NULL succeeds at once. If a start call
 * fails, *out is NULL and nothing runs.
 *
 * Failure, never a hang. Every wait on peers has a timeout (loom_pg_cfg.timeout_s, default
 * 300 s or the environment's LOOM_TIMEOUT, counted from the last progress a peer made). A wait
 * spins only briefly (under a millisecond), then sleeps, so a stalled peer does not cost its
 * peers a core (with LOOM_WAIT_YIELD=1 a blocked caller's waits yield between polls for 0.1 s
 * first, as MPI's blocking calls poll: loom/dist_mpi.h); a wait that lasts 5 s (or half the timeout, if shorter, but at least 1 s)
 * prints once on stderr which rank it waits for: "loom: rank 0 waiting for rank 1 in
 * all-reduce #42 for 5 s (timeout 300 s)" ("for its peers" when the backend cannot tell). A
 * rank that fails (its collective fails, it calls loom_pg_abort, its function returns an
 * error, it returns without joining a collective, or it stops issuing collectives) makes the
 * pending and later collectives of every peer fail: LOOM_EREMOTE when the peer is known to
 * have failed, LOOM_ETIMEDOUT when it just did not come, LOOM_EABORTED on the rank that
 * aborted; the message names the rank and the collective's sequence number. Ranks that
 * disagree on a collective's kind, count, dtype, op or root get LOOM_EMISUSE (kind, op, root),
 * LOOM_ESHAPE (count) or LOOM_EDTYPE (dtype), never corrupt data. After any failure the group
 * is broken: every later collective returns the same error (loom_pg_async_error) until the
 * group is freed.
 *
 * Thread safety: see above. Errors: each function's comment lists its codes; the message is in
 * loom_last_error() of the calling thread. */
#ifndef LOOM_DIST_H
#define LOOM_DIST_H

#include "loom/dtype.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_pg loom_pg;
typedef struct loom_work loom_work;

/* Reduction operators. */
#define LOOM_REDOP_MAP(XX)                                                                    \
  XX(SUM, "sum")                                                                              \
  XX(AVG, "avg")                                                                              \
  XX(MIN, "min")                                                                              \
  XX(MAX, "max")                                                                              \
  XX(PROD, "prod")

typedef enum loom_redop {
#define LOOM__REDOP_ENUM(name, str) LOOM_##name,
  LOOM_REDOP_MAP(LOOM__REDOP_ENUM)
#undef LOOM__REDOP_ENUM
  LOOM_REDOP_COUNT
} loom_redop;

/* "sum", "avg", "min", "max", "prod"; "?" for a value that is not an operator. */
const char *loom_redop_name(loom_redop op);

/* ---- configuration ---------------------------------------------------------------------- */

typedef struct loom_pg_cfg {
  /* Seconds any wait on peers may last without progress before it fails with
   * LOOM_ETIMEDOUT. Default: the environment variable LOOM_TIMEOUT (seconds, e.g. "30" or
   * "0.5") if set, else 300. Must be > 0 and finite. */
  double timeout_s;
  /* CPU cores the ranks on one machine share for compute (loom_pg_compute_threads divides them
   * among the ranks there). 0 (default): the online CPUs. Must be >= 0. */
  int cores;
  /* threads backend: pin each rank's thread (and the threads it starts: its group's progress
   * thread, its compute threads) to its own share of the CPUs this process may run on, so
   * that ranks do not migrate between cores and evict each other's caches. Done only when
   * cores is 0 and there are at least as many such CPUs as ranks. Default true. (Under MPI,
   * binding processes is the launcher's job.) */
  bool pin;
} loom_pg_cfg;

/* The defaults: timeout LOOM_TIMEOUT or 300 s, cores = 0 (all online CPUs), pin true. A
 * LOOM_TIMEOUT that is not a number > 0 gives timeout_s NaN, which loom_pg_cfg_validate (and
 * so every create call) refuses naming LOOM_TIMEOUT and its value, unless the caller sets
 * timeout_s itself. */
loom_pg_cfg loom_pg_cfg_default(void);
/* LOOM_EINVAL with a message naming the field (or LOOM_TIMEOUT) for a bad value; cfg == NULL
 * is EINVAL. */
int loom_pg_cfg_validate(const loom_pg_cfg *cfg);

/* ---- the threads backend ---------------------------------------------------------------- */

/* Run fn(pg, arg) on `nranks` threads, rank r getting a group of `nranks` ranks whose
 * loom_pg_rank is r; return when every rank has returned. cfg NULL means the defaults.
 * The groups belong to loom_threads_run: fn must not free them, and must wait for every work
 * handle it starts before it returns. A rank's function that returns an error (or returns
 * with work not waited, which counts as LOOM_EBUSY) fails the group for its peers.
 * Returns LOOM_OK if every rank returned LOOM_OK; otherwise the root cause: the status of the
 * rank whose failure came first if that rank's function returned an error, else of the
 * lowest-numbered rank that did, with that rank's message (prefixed "rank R: ") in
 * loom_last_error(). (Peers failed by it typically return LOOM_EREMOTE.)
 * Setup errors: LOOM_EINVAL (nranks < 1 or > 1024, fn NULL, bad cfg), LOOM_ENOMEM,
 * LOOM_EBACKEND (a thread could not be started). Thread-safe; may be nested.
 * Rank r's thread and its group's progress thread allocate on memory account r + 1
 * (loom_mem_account_stats in loom/alloc.h; ranks past 63 on account 0, the process's). */
int loom_threads_run(int nranks, const loom_pg_cfg *cfg, int (*fn)(loom_pg *pg, void *arg),
                     void *arg);

/* ---- the group ---------------------------------------------------------------------------- */

/* This rank's number (0..size-1) and the number of ranks; -1 for pg == NULL. */
int loom_pg_rank(const loom_pg *pg);
int loom_pg_size(const loom_pg *pg);
/* "threads" or "mpi"; "?" for NULL. */
const char *loom_pg_backend(const loom_pg *pg);
/* How many compute threads this rank should use so that the ranks on one machine do not
 * oversubscribe its cores: cfg.cores (or the online CPUs) divided among the ranks on this
 * machine, the first `cores % ranks` ranks getting one more; at least 1. */
int loom_pg_compute_threads(const loom_pg *pg);
/* The timeout in seconds (from the cfg); change it for later waits. EINVAL for <= 0 or
 * non-finite. Not to be called while collectives are running. */
double loom_pg_timeout(const loom_pg *pg);
int loom_pg_set_timeout(loom_pg *pg, double timeout_s);

/* The group's sticky failure: LOOM_OK while healthy, else the first failure's status, with
 * its message put in this thread's loom_last_error(). Thread-safe. */
int loom_pg_async_error(loom_pg *pg);

/* Abort the group: this rank's pending and later collectives fail with LOOM_EABORTED, and
 * its peers' with LOOM_EREMOTE ("rank R aborted"). Returns LOOM_OK (LOOM_EINVAL for NULL).
 * Thread-safe; may be called while another thread is blocked in a collective. */
int loom_pg_abort(loom_pg *pg);

/* Free a group made by a backend's create call (not one given by loom_threads_run:
 * LOOM_EMISUSE). LOOM_EBUSY, freeing nothing, while work handles are outstanding (started and
 * not yet consumed by wait/test). NULL is a no-op (LOOM_OK). */
int loom_pg_free(loom_pg *pg);

/* ---- sub-groups ----------------------------------------------------------------------------- */

/* A color that puts the calling rank in no sub-group (MPI_UNDEFINED); any negative color does. */
#define LOOM_PG_NO_COLOR (-1)

/* Split pg into sub-groups with MPI_Comm_split's semantics: the ranks that pass the same
 * color (>= 0) form one new group, numbered 0.. in the order of their keys, ties broken by
 * their rank in pg; a rank whose color is negative gets *out = NULL. A collective over pg:
 * every rank of pg calls it, in its place among pg's collectives (it is one all-gather of the
 * colors and keys on pg, then the backend's own step: under threads a second all-gather on pg,
 * under MPI an MPI_Comm_split of pg's communicator, entered only once the all-gather has shown
 * every rank there). The new group has pg's backend and timeout and this rank's compute
 * threads (loom_pg_compute_threads of pg); its collectives are its own sequence, independent
 * of pg's. Split groups may be split again. Free each with loom_pg_free: under threads, before
 * the rank's function returns (a rank that returns leaves its peers' waits in the sub-group to
 * fail, naming it). Failures: under threads, a failure in a sub-group (a collective that fails,
 * loom_pg_abort) also fails the rank's group of loom_threads_run, so every group of the run
 * fails rather than waits (as a failed MPI process ends its job); under MPI each group's
 * failure notices reach its own ranks, and the ranks of other groups see a timeout or the
 * launcher's end of the job. Errors: LOOM_EINVAL (pg or out NULL), LOOM_ENOMEM, LOOM_EBACKEND
 * (an MPI call failed), or the all-gather's failure (a peer failed or did not come within the
 * timeout), on the ranks where it happened; *out is NULL on failure. */
int loom_pg_split(loom_pg *pg, int color, int key, loom_pg **out);

/* ---- collectives -------------------------------------------------------------------------- */
/* Common errors of the start calls: LOOM_EINVAL (pg NULL, a NULL buffer with count > 0,
 * op or root out of range, buffers that overlap other than as the in-place rule allows),
 * LOOM_EDTYPE (dtype not valid), LOOM_EOVERFLOW (byte size overflows), LOOM_ENOMEM (async
 * handle), or the group's sticky failure. Blocking forms (out == NULL) also return the
 * collective's own failure (timeout, abort, peer failure, mismatch; see the file comment). */

/* recv[i] = op over ranks of send[i], i < count. In place when send == recv. */
int loom_pg_allreduce(loom_pg *pg, const void *send, void *recv, size_t count, loom_dtype dt,
                      loom_redop op, loom_work **out);

/* recv = root's send (count elements) on every rank. send is read only on the root (may be
 * NULL elsewhere); in place when send == recv on the root. */
int loom_pg_broadcast(loom_pg *pg, const void *send, void *recv, size_t count, loom_dtype dt,
                      int root, loom_work **out);

/* recv (size*count elements) = the concatenation of every rank's send (count elements), in
 * rank order. In place when send == recv + rank*count. */
int loom_pg_allgather(loom_pg *pg, const void *send, void *recv, size_t count, loom_dtype dt,
                      loom_work **out);

/* recv (count elements) = op over ranks of their send's block `rank` (send holds size*count
 * elements, block r being elements [r*count, (r+1)*count)). In place when
 * recv == send + rank*count. */
int loom_pg_reduce_scatter(loom_pg *pg, const void *send, void *recv, size_t count,
                           loom_dtype dt, loom_redop op, loom_work **out);

/* Completes on a rank only once every rank has issued it. */
int loom_pg_barrier(loom_pg *pg, loom_work **out);

/* ---- work handles ------------------------------------------------------------------------- */

/* Block until the collective completes; free the handle and set *w = NULL (also on failure).
 * Returns the collective's status, with its message in this thread's loom_last_error().
 * w == NULL is EINVAL; *w == NULL returns LOOM_OK at once. */
int loom_work_wait(loom_work **w);

/* Never blocks. *done = 0 while the collective runs (the handle stays valid); once it has
 * completed, *done = 1 and the call is loom_work_wait (consumes the handle, returns its
 * status). *w == NULL gives *done = 1 and LOOM_OK. EINVAL for w or done NULL. */
int loom_work_test(loom_work **w, int *done);

/* Wait for every handle in ws[0..n) (NULL entries are fine); afterwards every entry is NULL.
 * Returns LOOM_OK or the first failing handle's status (by index) with its message. */
int loom_work_wait_all(loom_work **ws, size_t n);

#ifdef __cplusplus
}
#endif
#endif
