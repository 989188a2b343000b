/* threads_int.h: the threads backend's shared state (private to src/dist/threads/).
 *
 * A world is N ranks in one process. Each rank publishes, per collective, a header (the
 * loom__coll it issued: kind, count, dtype, op, root and its buffer pointers) and then
 * advances its `tick`, a counter that every rank moves through the same values during a
 * matched collective (arrive, done). Peers read (and a large all-reduce writes) the published
 * buffers directly once a rank's tick says they are ready; waits on a peer's tick spin
 * briefly, then sleep on it as a futex, and check for abort, failure, exit and the timeout.
 * Headers and small-message scratch buffers are double-buffered by the collective's sequence
 * parity: a rank rewrites parity p only after all ranks arrived at the next collective, i.e.
 * after they stopped reading it. */
#ifndef LOOM_DIST_THREADS_INT_H
#define LOOM_DIST_THREADS_INT_H

#include "dist/dist_int.h"

/* All-reduces of at most this many bytes go through per-rank scratch (one barrier). */
#define LOOM__THR_SMALL_BYTES ((size_t)32 << 10)

typedef struct loom__thr_world loom__thr_world;

typedef struct loom__thr_rank {
  _Alignas(64) _Atomic uint32_t tick; /* advanced by this rank; peers wait on it */
  _Atomic uint32_t sleepers;          /* peers sleeping on tick */
  _Alignas(64) loom__coll slot[2];    /* published header, by seq parity */
  unsigned char *scratch[2];          /* LOOM__THR_SMALL_BYTES each, by seq parity */
  _Atomic int exited; /* the rank's function returned and its queue drained */
  _Atomic int active; /* inside a collective: may be reading peers' buffers */
  int status;                         /* the rank function's result */
  char msg[512];
  loom__thr_world *world;
  loom_pg pg;
} loom__thr_rank;

struct loom__thr_world {
  /* A sub-group's world (loom_pg_split): root is the loom_threads_run world its ranks belong
   * to and members[i] its rank i's rank there; refs counts the ranks that have not freed
   * their group yet (the last one frees the world). NULL / unused for the run's own world. */
  loom__thr_world *root;
  int *members;
  _Atomic int refs;
  int n;
  bool pin; /* pin each rank thread to its share of the CPUs (loom_pg_cfg.pin) */
  loom__thr_rank *ranks;
  _Atomic int failed_rank; /* first rank whose group failed, -1 while healthy */
  pthread_mutex_t mu;
  int fail_code;
  char fail_msg[512];
};

extern const loom__pg_ops loom__thr_ops;
extern const loom__pg_ops loom__thr_sub_ops; /* a split group's: it frees its world */

/* The backend's loom_pg_split step and a split group's teardown (threads_split.c). */
int loom__thr_split(loom_pg *pg, int color, int key, const int *members, int n, int my_rank,
                    loom_pg **out);
void loom__thr_sub_destroy(loom_pg *pg);
/* A rank's rank in the loom_threads_run world (itself there). */
static inline int loom__thr_root_rank(const loom__thr_world *w, int r) {
  return w->members ? w->members[r] : r;
}
static inline loom__thr_world *loom__thr_root(loom__thr_world *w) {
  return w->root ? w->root : w;
}

/* This rank's state from its group. */
static inline loom__thr_rank *loom__thr_of(loom_pg *pg) { return pg->impl; }

/* Publish a new tick value (and wake sleeping peers). */
void loom__thr_advance(loom__thr_rank *me, uint32_t v);
/* Wait until rank `peer`'s tick reaches `target` (wrap-safe). Fails, with a message naming
 * collective c and the rank, on abort, a failed or exited peer, or the timeout. */
int loom__thr_wait(loom__thr_rank *me, int peer, uint32_t target, const loom__coll *c);
/* Wait for every peer's tick to reach target. */
int loom__thr_wait_all(loom__thr_rank *me, uint32_t target, const loom__coll *c);
/* Record rank r's failure in the world (first only) and wake every sleeper. */
void loom__thr_world_fail(loom__thr_world *w, int r, int code, const char *msg);
/* Wake whoever sleeps on rank r's tick. */
void loom__thr_wake(loom__thr_rank *r);

#endif
