/* dist_int.h: what the dist layer's generic part (pg.c, collectives.c, work.c, reduce.c,
 * copy.c, wait.c) shares with its backends (threads/, mpi/): the group object, the collective
 * descriptor, the backend vtable, reduction kernels and the bulk copy. Private to src/dist/. */
#ifndef LOOM_DIST_INT_H
#define LOOM_DIST_INT_H

#include "core/core_int.h"
#include "dist/prepared.h"
#include "loom/dist.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

typedef enum loom__coll_kind {
  LOOM__ALLREDUCE,
  LOOM__BROADCAST,
  LOOM__ALLGATHER,
  LOOM__REDUCE_SCATTER,
  LOOM__BARRIER,
} loom__coll_kind;

/* "all-reduce", "broadcast", "all-gather", "reduce-scatter", "barrier". */
const char *loom__coll_name(loom__coll_kind k);

/* One collective, as issued. count is per the public call (per-rank block for all-gather and
 * reduce-scatter). seq numbers the group's collectives from 1, in issue order. */
typedef struct loom__coll {
  loom__coll_kind kind;
  const void *send;
  void *recv;
  size_t count;
  loom_dtype dt;
  loom_redop op;
  int root;
  uint64_t seq;
  loom__coll_prepare_fn prepare; /* optional: run first, where the collective runs */
  void *prepare_ctx;
  bool always; /* move the bytes even in a dry run (loom_pg_split's metadata) */
} loom__coll;

/* Backend operations. Each runs one collective to completion on the calling thread (the
 * issuing thread or the group's progress thread; never two at once for one group) and returns
 * a status with loom__fail's message. Slots marked optional may be NULL. */
typedef struct loom__pg_ops {
  const char *name;
  int (*allreduce)(loom_pg *pg, const loom__coll *c);
  int (*broadcast)(loom_pg *pg, const loom__coll *c);
  int (*allgather)(loom_pg *pg, const loom__coll *c);
  int (*reduce_scatter)(loom_pg *pg, const loom__coll *c);
  int (*barrier)(loom_pg *pg, const loom__coll *c); /* optional: NULL => 0-element all-reduce */
  /* optional: the group just failed with (code, msg) (first failure only); tell the peers. */
  void (*failed)(loom_pg *pg, int code, const char *msg);
  /* optional: LOOM_OK while no peer is known to have failed, else the error (with message). */
  int (*health)(loom_pg *pg);
  /* optional: free backend state (the group is idle). */
  void (*destroy)(loom_pg *pg);
  /* optional (NULL: loom_pg_split gives LOOM_ENOSYS): the backend's part of loom_pg_split, on
   * every rank of pg after the colors and keys are known: this rank is `my_rank` of the n ranks
   * members[0..n) (their ranks in pg, in the new group's order), or in no group (n == 0,
   * color < 0). Make the new group in *out. Collective over pg. (split.c has the generic part) */
  int (*split)(loom_pg *pg, int color, int key, const int *members, int n, int my_rank,
               loom_pg **out);
} loom__pg_ops;

struct loom_work {
  loom_pg *pg;
  loom__coll c;
  loom_work *next;                 /* in the queue */
  loom_work *live_prev, *live_next; /* among the group's unconsumed async handles */
  int status;
  _Atomic int done;
  char msg[512];
};

struct loom_pg {
  const loom__pg_ops *ops;
  void *impl; /* backend state */
  int rank, size;
  int *run_ranks; /* a split group's (loom_pg_split): each member's rank in the run's group
                   * (the world it was split from, at any depth); NULL for the run's own group.
                   * Messages name both (loom__pg_who). Freed by loom__pg_fini. */
  int compute_threads;
  _Atomic double timeout_s;
  bool owned; /* by loom_threads_run: loom_pg_free refuses */
  int mem_account; /* memory account of the group's rank (loom_mem_account of the thread that
                    * made the group; loom_threads_run sets its ranks'); the progress thread
                    * allocates on it */

  pthread_mutex_t mu;
  pthread_cond_t cv_work; /* the progress thread waits here for work or stop */
  pthread_cond_t cv_done; /* waiters wait here for work->done */
  loom_work *head, *tail; /* queued, not started */
  bool running;           /* a collective is executing (issuing thread or progress thread) */
  /* callers blocked on the group's collectives now: a blocking collective running inline or
   * waiting for its turn, loom_work_wait (work.c). While > 0, waits that pause through
   * loom__wait_pause (the mpi backend's) poll rather than sleep: nobody computes beside them. */
  _Atomic int blocked;
  bool stop, thread_started;
  pthread_t thread;
  size_t outstanding; /* async handles not yet consumed */
  loom_work *live;    /* those handles */
  uint64_t seq;       /* collectives issued */

  _Atomic int err; /* sticky first failure (LOOM_OK while healthy) */
  char errmsg[512];
  _Atomic bool aborted;
};

/* Initialise the generic part of a group (mutexes, config). LOOM_EBACKEND if pthread init
 * fails. loom__pg_fini undoes it (the group must be idle). */
int loom__pg_init(loom_pg *pg, const loom__pg_ops *ops, void *impl, int rank, int size,
                  const loom_pg_cfg *cfg);
void loom__pg_fini(loom_pg *pg);

/* "rank R" for rank r of pg, or "rank R (rank W of the run)" in a split group, where W is its
 * rank in the run's own group (MPI_COMM_WORLD's rank): how messages name a rank, so that a
 * rank of a sub-group (HSDP's shard and replica groups) is not taken for the world's. */
void loom__pg_who(const loom_pg *pg, int r, char *buf, size_t cap);

/* Record the group's first failure (code, message) and tell the backend (ops->failed). Later
 * calls keep the first. Returns code. Thread-safe. */
int loom__pg_fail(loom_pg *pg, int code, const char *msg);

/* LOOM_OK, or the sticky failure / abort with a message from `who` for this thread. */
int loom__pg_check(loom_pg *pg, const char *who);

/* Run one collective now on this thread (no queue): the sticky check (skipped when `checked`:
 * the caller ran loom__pg_check just before), the backend call, and recording of a failure.
 * The message of a failure is in this thread's loom_last_error(). */
int loom__pg_execute(loom_pg *pg, const loom__coll *c, bool checked);

/* A blocking all-gather whose bytes move even in a dry run (loom_mem_set_dry_run), for
 * metadata the run's structure depends on (loom_pg_split's colors, keys and addresses).
 * (collectives.c) */
int loom__pg_allgather_always(loom_pg *pg, const void *send, void *recv, size_t count,
                              loom_dtype dt);

/* Issue a collective: validated already; blocking when out == NULL. (work.c) */
int loom__pg_issue(loom_pg *pg, const loom__coll *c, loom_work **out);

/* Wait until the group has nothing queued or running (used before tearing a rank down).
 * (work.c) */
void loom__pg_drain(loom_pg *pg);

/* Free the async handles nobody consumed (teardown of an idle group). (work.c) */
void loom__pg_free_live(loom_pg *pg);

/* Block until the group's progress thread (if any) has exited. Call after drain. (work.c) */
void loom__pg_stop_thread(loom_pg *pg);

/* ---- reductions (reduce.c) ---- */

/* dst[i] = op over k < nsrc of srcs[k][i] (folded in order k = 0, 1, ...), i < n. dst may be
 * one of the srcs (same address) but must not partially overlap any. f16/bf16 accumulate in
 * f32 and round once; AVG divides by nsrc. */
void loom__reduce(void *dst, const void *const *srcs, int nsrc, size_t n, loom_dtype dt,
                  loom_redop op);
/* The same result written to every dsts[j], j < ndst, block by block (each block of the
 * sources is read once, while every destination's block is written). A destination may be one
 * of the srcs; none may partially overlap a source or another destination. */
void loom__reduce_to_all(void *const *dsts, int ndst, const void *const *srcs, int nsrc,
                         size_t n, loom_dtype dt, loom_redop op);

/* Widen n f16/bf16 elements to f32 (dt says which), and round f32 back to dt. */

/* ---- spinning and copying (copy.c) ---- */

/* A CPU hint inside spin loops. */
static inline void loom__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
/* Copy n bytes; large copies bypass the cache for the destination. */
void loom__copy(void *dst, const void *src, size_t n);

/* ---- waiting on peers (wait.c) ---- */

/* One wait of rank pg for `peer` (-1: not known which) inside collective c. */
typedef struct loom__wait {
  loom_pg *pg;
  const loom__coll *c;
  int peer;
  double t0;
  bool noticed;
} loom__wait;
void loom__wait_begin(loom__wait *w, loom_pg *pg, const loom__coll *c, int peer);
/* LOOM_OK while the wait may go on; LOOM_ETIMEDOUT, with a message naming the collective and
 * the peer, once it has lasted longer than the group's timeout. Past
 * loom__wait_notice_after(timeout) seconds it prints, once per wait, "loom: rank R waiting for
 * rank P in all-reduce #N for S s (timeout T s)" on stderr. */
int loom__wait_check(loom__wait *w);
/* When a wait's stderr notice is due: after 5 s, or half the timeout when that is shorter, but
 * not before 1 s (INFINITY, no notice, when that is not before the timeout). */
double loom__wait_notice_after(double timeout_s);
/* The wait policy: how a wait that has lasted `waited` seconds pauses before its next poll.
 * SPIN (a few CPU pauses) during the first 0.5 ms; then, when `blocked` (a caller is blocked
 * on the group: pg->blocked), YIELD (sched_yield) until 0.1 s, as MPI's own blocking calls
 * poll on; otherwise, and after that, SLEEP *sleep_s seconds: a sixteenth of the time waited
 * so far, 10 us to 1 ms, so a stalled peer, or a progress thread beside the caller's compute,
 * does not cost a core. */
typedef enum loom__pause { LOOM__PAUSE_SPIN, LOOM__PAUSE_YIELD, LOOM__PAUSE_SLEEP } loom__pause;
loom__pause loom__wait_policy(double waited, bool blocked, double *sleep_s);
/* Pause before the next poll, as loom__wait_policy says for this wait and its group now. */
void loom__wait_pause(loom__wait *w);

#endif
