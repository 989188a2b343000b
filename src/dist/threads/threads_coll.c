/* threads_coll.c: the threads backend's collectives. Ranks read each other's buffers
 * directly (one address space), so every algorithm is copy- or reduce-from-peers:
 *   - small all-reduce (<= LOOM__THR_SMALL_BYTES): each rank copies its input to its scratch,
 *     one barrier, each rank folds all scratches in rank order (latency: one barrier, no
 *     second one thanks to the double-buffered scratch);
 *   - large all-reduce: reduce-scatter + all-gather, pipelined in chunks (a quarter segment, 64-512 KB):
 *     rank r folds chunk c of its segment from every rank's input into its output, ticks, and
 *     copies chunk c-1 of every peer's segment from the peer's output while it is still in
 *     cache; a final barrier returns the buffers. Each byte crosses memory once per phase,
 *     which is the bandwidth-optimal ring schedule without the ring's n-1 hops;
 *   - broadcast, all-gather, reduce-scatter: one barrier, direct copy / fold, a done barrier.
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

/* Tick to t and wait for everyone to get there: nobody reads our buffers after this. */
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

/* Chunk k of segment j: [*off, *off + *m) (m may be 0). */
static void chunk(size_t count, int n, int j, size_t ch, size_t k, size_t *off, size_t *m) {
  size_t s, len;
  segment(count, n, j, &s, &len);
  size_t a = k * ch < len ? k * ch : len, b = (k + 1) * ch < len ? (k + 1) * ch : len;
  *off = s + a;
  *m = b - a;
}

/* Copy chunk k of peer j's segment from its output into ours. */
static int gather_chunk(loom__thr_rank *me, const loom__coll *c, uint32_t t0, size_t ch,
                        size_t k) {
  loom__thr_world *w = me->world;
  int n = w->n, r = me->pg.rank;
  size_t es = loom_dtype_size(c->dt);
  for (int d = 1; d < n; d++) {
    int j = (r + d) % n;
    int rc = loom__thr_wait(me, j, t0 + 2 + (uint32_t)k, c);
    if (rc) return rc;
    size_t off, m;
    chunk(c->count, n, j, ch, k, &off, &m);
    loom__copy((char *)c->recv + off * es, (const char *)peer(me, j, c)->recv + off * es,
               m * es);
  }
  return LOOM_OK;
}

static int allreduce_large(loom__thr_rank *me, const loom__coll *c) {
  loom__thr_world *w = me->world;
  int n = w->n, r = me->pg.rank;
  size_t es = loom_dtype_size(c->dt);
  uint32_t t0;
  int rc = arrive(me, c, &t0);
  if (rc) return rc;
    size_t s0, maxlen;
  segment(c->count, n, 0, &s0, &maxlen);
  /* a quarter of a segment, so that even mid sizes pipeline, within the bounds */
  size_t chb = maxlen * es / 4;
  chb = chb < LOOM__THR_CHUNK_MIN ? LOOM__THR_CHUNK_MIN
        : chb > LOOM__THR_CHUNK_MAX ? LOOM__THR_CHUNK_MAX
                                    : chb;
  size_t ch = chb / es, nch = (maxlen + ch - 1) / ch;
  const void *srcs[1024];
  for (size_t k = 0; k < nch; k++) {
    size_t off, m;
    chunk(c->count, n, r, ch, k, &off, &m);
    for (int j = 0; j < n; j++) srcs[j] = (const char *)peer(me, j, c)->send + off * es;
    if (m) loom__reduce((char *)c->recv + off * es, srcs, n, m, c->dt, c->op);
    loom__thr_advance(me, t0 + 2 + (uint32_t)k);
    if (k && (rc = gather_chunk(me, c, t0, ch, k - 1))) return rc;
  }
  if (nch && (rc = gather_chunk(me, c, t0, ch, nch - 1))) return rc;
  return done_barrier(me, c, t0 + 2 + (uint32_t)nch);
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

static void allgather_body(loom__thr_rank *me, const loom__coll *c) {
  size_t bytes = c->count * loom_dtype_size(c->dt);
  int n = me->world->n;
  for (int d = 0; d < n; d++) {
    int j = (me->pg.rank + d) % n;
    const void *src = peer(me, j, c)->send;
    char *dst = (char *)c->recv + (size_t)j * bytes;
    if (src != dst) loom__copy(dst, src, bytes);
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
 * until no peer is active any more, so that no peer still reads our buffers when the caller
 * gets them back; a peer in a failed world fails at its next wait. */
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
  loom__thr_world_fail(me->world, pg->rank, code, msg);
}

static int thr_health(loom_pg *pg) {
  loom__thr_world *w = loom__thr_of(pg)->world;
  int f = atomic_load(&w->failed_rank);
  if (f < 0 || f == pg->rank) return LOOM_OK;
  char msg[sizeof w->fail_msg];
  pthread_mutex_lock(&w->mu);
  memcpy(msg, w->fail_msg, sizeof msg);
  pthread_mutex_unlock(&w->mu);
  return loom__fail(LOOM_EREMOTE, "rank %d: rank %d failed: %s", pg->rank, f, msg);
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
};
