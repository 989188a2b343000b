/* threads_sync.c: the threads backend's synchronisation: ticks, waits on a peer's tick (spin,
 * then futex sleep in slices so abort, failure, exit, the timeout and a long wait's notice
 * (wait.c) are noticed), and the world's failure record. */
#include "dist/threads/threads_int.h"

#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Spin this long on a peer before sleeping (a futex wake-up costs tens of µs here). */
#define SPIN_S 50e-6
/* Longest single sleep, so abort and failure are seen even if a wake-up is missed. */
#define SLICE_S 0.02

static void futex_wait(_Atomic uint32_t *addr, uint32_t val, double seconds) {
  struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
  syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, &ts, NULL, 0);
}

void loom__thr_wake(loom__thr_rank *r) {
  syscall(SYS_futex, (uint32_t *)&r->tick, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

void loom__thr_advance(loom__thr_rank *me, uint32_t v) {
  atomic_store(&me->tick, v); /* seq_cst: pairs with the sleeper count below */
  if (atomic_load(&me->sleepers)) loom__thr_wake(me);
}

void loom__thr_world_fail(loom__thr_world *w, int r, int code, const char *msg) {
  pthread_mutex_lock(&w->mu);
  if (atomic_load(&w->failed_rank) < 0) {
    w->fail_code = code;
    snprintf(w->fail_msg, sizeof w->fail_msg, "%s", msg);
    atomic_store(&w->failed_rank, r);
  }
  pthread_mutex_unlock(&w->mu);
  for (int i = 0; i < w->n; i++) loom__thr_wake(&w->ranks[i]);
}


static bool reached(uint32_t tick, uint32_t target) { return (int32_t)(tick - target) >= 0; }

/* Why can't we go on waiting for `peer` to reach target? LOOM_OK if we can (or it did). */
static int why_stop(loom__thr_rank *me, int peer, uint32_t target, const loom__coll *c,
                    loom__wait *wait) {
  loom__thr_world *w = me->world;
  const char *name = loom__coll_name(c->kind);
  int r = me->pg.rank;
  /* a peer that reached the tick did its part: its failure after that (it went on, found an
   * error of its own and failed the world) is the next collective's to report, not this one's
   * (a rank descheduled between its last look at the tick and this check saw it so) */
  if (reached(atomic_load_explicit(&w->ranks[peer].tick, memory_order_acquire), target))
    return LOOM_OK;
  if (atomic_load(&me->pg.aborted))
    return loom__fail(LOOM_EABORTED, "rank %d: %s #%llu aborted (loom_pg_abort)", r, name,
                      (unsigned long long)c->seq);
  int f = atomic_load(&w->failed_rank);
  if (f >= 0 && f != r) {
    char msg[sizeof w->fail_msg];
    pthread_mutex_lock(&w->mu);
    memcpy(msg, w->fail_msg, sizeof msg);
    pthread_mutex_unlock(&w->mu);
    return loom__fail(LOOM_EREMOTE, "rank %d: %s #%llu failed because rank %d failed: %s", r,
                      name, (unsigned long long)c->seq, f, msg);
  }
  /* a peer that exited after its last tick is not a failure: look at the tick after the flag */
  if (atomic_load(&w->ranks[peer].exited) && !reached(atomic_load(&w->ranks[peer].tick), target))
    return loom__fail(LOOM_EREMOTE,
                      "rank %d: %s #%llu: rank %d returned from its function without joining it",
                      r, name, (unsigned long long)c->seq, peer);
  if (w->root) { /* a split group: its ranks' run may have failed, or the peer returned */
    loom__thr_world *root = w->root;
    int rf = atomic_load(&root->failed_rank), rpeer = w->members[peer];
    if (rf >= 0 && rf != w->members[r]) {
      char msg[sizeof root->fail_msg];
      pthread_mutex_lock(&root->mu);
      memcpy(msg, root->fail_msg, sizeof msg);
      pthread_mutex_unlock(&root->mu);
      return loom__fail(LOOM_EREMOTE, "rank %d: %s #%llu failed because rank %d of the run "
                        "failed: %s", r, name, (unsigned long long)c->seq, rf, msg);
    }
    if (atomic_load(&root->ranks[rpeer].exited) &&
        !reached(atomic_load(&w->ranks[peer].tick), target))
      return loom__fail(LOOM_EREMOTE, "rank %d: %s #%llu: rank %d (rank %d of the run) returned "
                        "from its function without joining it", r, name,
                        (unsigned long long)c->seq, peer, rpeer);
  }
  return loom__wait_check(wait); /* the timeout, and the notice of a long wait */
}

int loom__thr_wait(loom__thr_rank *me, int peer, uint32_t target, const loom__coll *c) {
  loom__thr_rank *p = &me->world->ranks[peer];
  if (reached(atomic_load_explicit(&p->tick, memory_order_acquire), target)) return LOOM_OK;
  loom__wait wait;
  loom__wait_begin(&wait, &me->pg, c, peer);
  for (unsigned i = 1;; i++) {
    if (reached(atomic_load_explicit(&p->tick, memory_order_acquire), target)) return LOOM_OK;
    loom__cpu_relax();
    if ((i & 255) == 0) {
      int rc = why_stop(me, peer, target, c, &wait);
      if (rc) return rc;
      if (loom__now() - wait.t0 > SPIN_S) break;
    }
  }
  for (;;) {
    int rc = why_stop(me, peer, target, c, &wait);
    if (rc) return rc;
    atomic_fetch_add(&p->sleepers, 1);
    uint32_t v = atomic_load(&p->tick);
    if (!reached(v, target)) futex_wait(&p->tick, v, SLICE_S);
    atomic_fetch_sub(&p->sleepers, 1);
    if (reached(atomic_load_explicit(&p->tick, memory_order_acquire), target)) return LOOM_OK;
  }
}

int loom__thr_wait_all(loom__thr_rank *me, uint32_t target, const loom__coll *c) {
  int n = me->world->n, r = me->pg.rank;
  for (int k = 1; k < n; k++) {
    int rc = loom__thr_wait(me, (r + k) % n, target, c);
    if (rc) return rc;
  }
  return LOOM_OK;
}
