/* threads_coll.c: the threads backend's collectives. Ranks read each other's buffers
 * directly (one address space), so every algorithm is copy- or reduce-from-peers:
 *   - small all-reduce (<= LOOM__THR_SMALL_BYTES): each rank copies its input to its scratch,
 *     one barrier, each rank folds all scratches in rank order (latency: one barrier, no
 *     second one thanks to the double-buffered scratch);
 *   - large all-reduce: rank r folds segment r (1/n of the elements) from every rank's input
 *     and writes the result straight into every rank's output; a done barrier returns the
 *     buffers. Each element is read once from each input and written once to each output, as
 *     reduce-scatter + all-gather move it, without the gather's second pass over the reduced
 *     data or any hand-off between the phases (1.2-2x the chunked reduce-scatter + all-gather
 *     it replaced at 1-64 MB, BENCHMARKS.md);
 *   - broadcast, all-gather, reduce-scatter: one barrier, direct copy / fold, a done barrier
 *     (an all-gather into one recv buffer shared by every rank: each copies only its part).
 * Every collective first publishes its header and checks it against every peer's, so ranks
 * that disagree get an error before any data moves. */
#include "dist/threads/threads_int.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

/* Describe a header for mismatch messages. */
static void describe(char *buf, size_t n, const loom__coll *c) {
  switch (c->kind) {
  case LOOM__ALLREDUCE:
  case LOOM__REDUCE_SCATTER:
    snprintf(buf, n, "%s(count %zu, %s, %s)", loom__coll_name(c->kind), c->count,
             loom_dtype_name(c->dt), loom_redop_name(c->op));
    break;
  case LOOM__BROADCAST:
    snprintf(buf, n, "%s(count %zu, %s, root %d)", loom__coll_name(c->kind), c->count,
             loom_dtype_name(c->dt), c->root);
    break;
  case LOOM__ALLGATHER:
    snprintf(buf, n, "%s(count %zu, %s)", loom__coll_name(c->kind), c->count,
             loom_dtype_name(c->dt));
    break;
  case LOOM__BARRIER: snprintf(buf, n, "barrier"); break;
  }
}

/* Compare our header with every peer's (after the arrive barrier). */
static int check_headers(loom__thr_rank *me, const loom__coll *c) {
  loom__thr_world *w = me->world;
  int par = (int)(c->seq & 1);
  for (int j = 0; j < w->n; j++) {
    const loom__coll *o = &w->ranks[j].slot[par];
    int code = LOOM_OK;
    if (o->kind != c->kind || o->seq != c->seq) code = LOOM_EMISUSE;
    else if (o->count != c->count) code = LOOM_ESHAPE;
    else if (o->dt != c->dt) code = LOOM_EDTYPE;
    else if ((c->kind == LOOM__ALLREDUCE || c->kind == LOOM__REDUCE_SCATTER) && o->op != c->op)
      code = LOOM_EMISUSE;
    else if (c->kind == LOOM__BROADCAST && o->root != c->root)
      code = LOOM_EMISUSE;
    if (code) {
      char a[96], b[96];
      describe(a, sizeof a, c);
      describe(b, sizeof b, o);
      return loom__fail(code, "rank %d: collective #%llu mismatch: rank %d called %s, rank %d called %s",
                        me->pg.rank, (unsigned long long)c->seq, me->pg.rank, a, j, b);
    }
  }
  return LOOM_OK;
}

/* Publish the header, advance to t0+1 and wait for every peer to arrive; check headers. */
static int arrive(loom__thr_rank *me, const loom__coll *c, uint32_t *t0) {
  *t0 = atomic_load_explicit(&me->tick, memory_order_relaxed);
  me->slot[c->seq & 1] = *c;
  loom__thr_advance(me, *t0 + 1);
  int rc = loom__thr_wait_all(me, *t0 + 1, c);
  if (!rc) rc = check_headers(me, c);
  return rc;
}

static const loom__coll *peer(loom__thr_rank *me, int j, const loom__coll *c) {
  return &me->world->ranks[j].slot[c->seq & 1];
}

/* Tick to t and wait for everyone to get there: nobody touches our buffers after this. */
static int done_barrier(loom__thr_rank *me, const loom__coll *c, uint32_t t) {
  loom__thr_advance(me, t);
  return loom__thr_wait_all(me, t, c);
}

static int allreduce_small(loom__thr_rank *me, const loom__coll *c) {
  loom__thr_world *w = me->world;
  int par = (int)(c->seq & 1);
  size_t bytes = c->count * loom_dtype_size(c->dt);
  loom__copy(me->scratch[par], c->send, bytes);
  uint32_t t0;
  int rc = arrive(me, c, &t0);
  if (rc) return rc;
  const void *srcs[1024];
  for (int j = 0; j < w->n; j++) srcs[j] = w->ranks[j].scratch[par];
  loom__reduce(c->recv, srcs, w->n, c->count, c->dt, c->op);
  return LOOM_OK;
}

/* Segment j of count elements split over n ranks: [*start, *start + *len). */
static void segment(size_t count, int n, int j, size_t *start, size_t *len) {
  size_t base = count / (size_t)n, rem = count % (size_t)n;
  *start = (size_t)j * base + ((size_t)j < rem ? (size_t)j : rem);
  *len = base + ((size_t)j < rem);
}

/* Rank r folds segment r of every rank's input and writes the result into segment r of every
 * rank's output, block by block from an L1 accumulator: each byte is read once and written
 * once per rank, with no chunk hand-offs between ranks; one done barrier returns the buffers.
 * Only rank r touches segment r of any buffer, so in-place buffers are safe. */
static int allreduce_large(loom__thr_rank *me, const loom__coll *c) {
  loom__thr_world *w = me->world;
  int n = w->n, r = me->pg.rank;
  size_t es = loom_dtype_size(c->dt);
  uint32_t t0;
  int rc = arrive(me, c, &t0);
  if (rc) return rc;
  /* we write into the peers' outputs: a peer whose group failed may be about to return its
   * buffers (it waits only for ranks already marked active), so check once more */
  int f = atomic_load(&w->failed_rank);
  if (f >= 0 && f != r)
    return loom__fail(LOOM_EREMOTE, "rank %d: all-reduce #%llu failed because rank %d failed",
                      r, (unsigned long long)c->seq, f);
  size_t off, m;
  segment(c->count, n, r, &off, &m);
  const void *srcs[1024];
  void *dsts[1024];
  for (int j = 0; j < n; j++) {
    srcs[j] = (const char *)peer(me, j, c)->send + off * es;
    dsts[j] = (char *)peer(me, j, c)->recv + off * es;
  }
  if (m) loom__reduce_to_all(dsts, n, srcs, n, m, c->dt, c->op);
  return done_barrier(me, c, t0 + 2);
}

static int do_allreduce(loom_pg *pg, const loom__coll *c) {
  loom__thr_rank *me = loom__thr_of(pg);
  if (c->count * loom_dtype_size(c->dt) <= LOOM__THR_SMALL_BYTES) return allreduce_small(me, c);
  return allreduce_large(me, c);
}

/* The shape of broadcast, all-gather and reduce-scatter: arrive, move data, done barrier. */
static int one_step(loom_pg *pg, const loom__coll *c,
                    void (*body)(loom__thr_rank *me, const loom__coll *c)) {
  loom__thr_rank *me = loom__thr_of(pg);
  uint32_t t0;
  int rc = arrive(me, c, &t0);
  if (rc) return rc;
  body(me, c);
  return done_barrier(me, c, t0 + 2);
}

static void broadcast_body(loom__thr_rank *me, const loom__coll *c) {
  const void *src = peer(me, c->root, c)->send;
  if (src != c->recv) loom__copy(c->recv, src, c->count * loom_dtype_size(c->dt));
}

/* Every rank passed the same recv buffer (one shared by the ranks: FSDP's gathered units,
 * fsdp_share.c): each rank then copies only its own part into it, 1/n of the bytes, and the
 * done barrier makes the whole buffer ready for all. */
static bool shared_recv(loom__thr_rank *me, const loom__coll *c) {
  for (int j = 0; j < me->world->n; j++)
    if (peer(me, j, c)->recv != c->recv) return false;
  return true;
}

static void allgather_body(loom__thr_rank *me, const loom__coll *c) {
  size_t bytes = c->count * loom_dtype_size(c->dt);
  int n = me->world->n, parts = n > 1 && shared_recv(me, c) ? 1 : n; /* 1: our own part */
  for (int d = 0; d < parts; d++) {
    int j = (me->pg.rank + d) % n;
    const void *src = peer(me, j, c)->send;
    char *dst = (char *)c->recv + (size_t)j * bytes;
    if (src != dst && c->always) memcpy(dst, src, bytes); /* even in a dry run */
    else if (src != dst) loom__copy(dst, src, bytes);
  }
}

static void reduce_scatter_body(loom__thr_rank *me, const loom__coll *c) {
  size_t off = (size_t)me->pg.rank * c->count * loom_dtype_size(c->dt);
  int n = me->world->n;
  const void *srcs[1024];
  for (int j = 0; j < n; j++) srcs[j] = (const char *)peer(me, j, c)->send + off;
  if (c->count) loom__reduce(c->recv, srcs, n, c->count, c->dt, c->op);
}

static int do_broadcast(loom_pg *pg, const loom__coll *c) { return one_step(pg, c, broadcast_body); }
static int do_allgather(loom_pg *pg, const loom__coll *c) { return one_step(pg, c, allgather_body); }
static int do_reduce_scatter(loom_pg *pg, const loom__coll *c) {
  return one_step(pg, c, reduce_scatter_body);
}

static int do_barrier(loom_pg *pg, const loom__coll *c) {
  uint32_t t0;
  return arrive(loom__thr_of(pg), c, &t0);
}

/* Run a collective with this rank marked active. On failure, wait (bounded by the timeout)
 * until no peer is active any more, so that no peer still reads or writes our buffers when
 * the caller gets them back; a peer in a failed world fails at its next wait. */
static int run(loom_pg *pg, const loom__coll *c, int (*impl)(loom_pg *, const loom__coll *)) {
  loom__thr_rank *me = loom__thr_of(pg);
  atomic_store(&me->active, 1);
  int rc = impl(pg, c);
  atomic_store(&me->active, 0);
  if (!rc) return rc;
  char msg[512];
  snprintf(msg, sizeof msg, "%s", loom_last_error());
  loom__pg_fail(pg, rc, msg); /* tell the peers before waiting for them */
  double t0 = loom__now(), timeout = atomic_load(&pg->timeout_s);
  loom__thr_world *w = me->world;
  for (int j = 0; j < w->n; j++)
    while (atomic_load(&w->ranks[j].active) && loom__now() - t0 < timeout) {
      struct timespec ts = {0, 100000};
      nanosleep(&ts, NULL);
    }
  return loom__fail(rc, "%s", msg);
}

#define WRAP(name)                                                                            \
  static int thr_##name(loom_pg *pg, const loom__coll *c) { return run(pg, c, do_##name); }
WRAP(allreduce)
WRAP(broadcast)
WRAP(allgather)
WRAP(reduce_scatter)
WRAP(barrier)

static void thr_failed(loom_pg *pg, int code, const char *msg) {
  loom__thr_rank *me = loom__thr_of(pg);
  loom__thr_world *w = me->world;
  loom__thr_world_fail(w, pg->rank, code, msg);
  /* a split group's failure fails the rank's group of the run too, so that every group of the
   * run fails rather than waits for this rank */
  if (w->root) loom__pg_fail(&w->root->ranks[w->members[pg->rank]].pg, code, msg);
}

/* World w's failure, unless it is rank r's own. */
static int world_health(loom__thr_world *w, int r, int shown_rank, const char *where) {
  int f = atomic_load(&w->failed_rank);
  if (f < 0 || f == r) return LOOM_OK;
  char msg[sizeof w->fail_msg];
  pthread_mutex_lock(&w->mu);
  memcpy(msg, w->fail_msg, sizeof msg);
  pthread_mutex_unlock(&w->mu);
  return loom__fail(LOOM_EREMOTE, "rank %d: rank %d%s failed: %s", shown_rank, f, where, msg);
}

static int thr_health(loom_pg *pg) {
  loom__thr_world *w = loom__thr_of(pg)->world;
  int rc = world_health(w, pg->rank, pg->rank, "");
  if (!rc && w->root)
    rc = world_health(w->root, w->members[pg->rank], pg->rank, " of the run (loom_threads_run)");
  return rc;
}

const loom__pg_ops loom__thr_ops = {
    .name = "threads",
    .allreduce = thr_allreduce,
    .broadcast = thr_broadcast,
    .allgather = thr_allgather,
    .reduce_scatter = thr_reduce_scatter,
    .barrier = thr_barrier,
    .failed = thr_failed,
    .health = thr_health,
    .destroy = NULL, /* loom_threads_run owns the ranks */
    .split = loom__thr_split,
};

const loom__pg_ops loom__thr_sub_ops = {
    .name = "threads",
    .allreduce = thr_allreduce,
    .broadcast = thr_broadcast,
    .allgather = thr_allgather,
    .reduce_scatter = thr_reduce_scatter,
    .barrier = thr_barrier,
    .failed = thr_failed,
    .health = thr_health,
    .destroy = loom__thr_sub_destroy,
    .split = loom__thr_split,
};
