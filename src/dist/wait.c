/* wait.c: how every backend waits on its peers: the timeout (counted from the wait's start,
 * i.e. from the peers' last progress), a notice on stderr naming the rank waited for once a
 * wait has lasted a few seconds, and the pause between polls (the wait policy): spin briefly,
 * since a peer's data usually comes within microseconds; then sleep, so that a stalled peer
 * does not cost a core. With LOOM_WAIT_YIELD=1, a caller blocked on the group (a blocking
 * collective, loom_work_wait) polls on with sched_yield first, as MPI's own blocking calls do:
 * faster where every rank has a core of its own, but on shared cores the yielding ranks take
 * the cores their peers need (HSDP across 4 ranks on 2 cores ran 0.6x as fast). */
#include "dist/dist_int.h"

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Spin this long before sleeping between polls. MPI moves a message only inside MPI calls on
 * both sides (Open MPI's shared memory without single copy: fragment by fragment), so a poller
 * that sleeps slows the transfer itself: the spin covers the waits of a large all-reduce's ring
 * steps (chunks of 64-512 KB, about 250 us each at 2 GB/s) and sleeping starts only when a peer
 * is late. */
#define SPIN_S 500e-6
#define SPIN_PAUSES 4 /* CPU pauses between two polls while spinning */
/* With a caller blocked on the group, poll with sched_yield between polls until the wait has
 * lasted this long, then sleep. MPI's blocking calls poll to the end (Open MPI yields when
 * oversubscribed); sleeping there gave the core away whenever a peer was descheduled, and on a
 * loaded machine both ranks then waited to be rescheduled for every later call: loops of 4-byte
 * all-reduces at load 12-17 took a median of 4.2x raw MPI_Allreduce over 20 runs (Open MPI;
 * MPICH 3.0x), against 1.54x (1.06x) yielding; pure spinning measured 1.56x (BENCHMARKS.md, "a
 * blocked caller polls as MPI does"). A yield lets whatever else is runnable (often the peer
 * rank) have the core and needs no timer to come back. Past this bound the peer is stalled,
 * not descheduled: sleeping costs a sixteenth of the wait at most, and no core. */
#define YIELD_S 0.1
/* Sleep between polls: a fraction of the time waited so far (so the extra latency stays a
 * small share of the wait), between these bounds. */
#define SLEEP_MIN_S 10e-6
#define SLEEP_MAX_S 1e-3
#define SLEEP_SHARE 0.0625

void loom__wait_begin(loom__wait *w, loom_pg *pg, const loom__coll *c, int peer) {
  w->pg = pg;
  w->c = c;
  w->peer = peer;
  w->t0 = loom__now();
  w->noticed = false;
}

double loom__wait_notice_after(double timeout_s) {
  double after = fmin(5.0, fmax(1.0, timeout_s / 2));
  return after < timeout_s ? after : INFINITY;
}

/* "rank 1", "rank 1 (rank 3 of the run)" in a split group, or "its peers" */
static void who(const loom_pg *pg, char *buf, size_t cap, int peer) {
  if (peer >= 0) loom__pg_who(pg, peer, buf, cap);
  else snprintf(buf, cap, "its peers");
}

int loom__wait_check(loom__wait *w) {
  loom_pg *pg = w->pg;
  double timeout = atomic_load(&pg->timeout_s), waited = loom__now() - w->t0;
  bool notice = !w->noticed && waited >= loom__wait_notice_after(timeout);
  if (waited <= timeout && !notice) return LOOM_OK; /* the names only for a message */
  char me[48], peer[48];
  loom__pg_who(pg, pg->rank, me, sizeof me);
  who(pg, peer, sizeof peer, w->peer);
  const char *name = loom__coll_name(w->c->kind);
  unsigned long long seq = (unsigned long long)w->c->seq;
  if (waited > timeout)
    return loom__fail(LOOM_ETIMEDOUT, "%s: %s #%llu timed out after %g s waiting for %s%s",
                      me, name, seq, timeout, peer,
                      w->peer >= 0 ? "" : " (a rank stopped issuing collectives or died)");
  if (notice) {
    w->noticed = true;
    fprintf(stderr, "loom: %s waiting for %s in %s #%llu for %.2g s (timeout %g s)\n",
            me, peer, name, seq, waited, timeout);
  }
  return LOOM_OK;
}

loom__pause loom__wait_policy(double waited, bool blocked, double *sleep_s) {
  *sleep_s = 0;
  if (waited < SPIN_S) return LOOM__PAUSE_SPIN;
  if (blocked && waited < YIELD_S) return LOOM__PAUSE_YIELD;
  *sleep_s = fmin(SLEEP_MAX_S, fmax(SLEEP_MIN_S, waited * SLEEP_SHARE));
  return LOOM__PAUSE_SLEEP;
}

/* LOOM_WAIT_YIELD=1: a blocked caller yields between polls (the policy's YIELD phase). Read at
 * each pause past the spin (a pause is at least half a millisecond into a wait). */
static bool yield_wanted(void) {
  const char *e = getenv("LOOM_WAIT_YIELD");
  return e && !strcmp(e, "1");
}

void loom__wait_pause(loom__wait *w) {
  double s, waited = loom__now() - w->t0;
  bool blocked = atomic_load_explicit(&w->pg->blocked, memory_order_relaxed) > 0 &&
                 yield_wanted();
  switch (loom__wait_policy(waited, blocked, &s)) {
  case LOOM__PAUSE_SPIN:
    /* a few pauses only: 32 (about 0.35 us on the Xeon of BENCHMARKS.md) were as long as a
     * whole small all-reduce of raw MPI, and the message waited for was seen that much later */
    for (int i = 0; i < SPIN_PAUSES; i++) loom__cpu_relax();
    return;
  case LOOM__PAUSE_YIELD:
    sched_yield();
    return;
  case LOOM__PAUSE_SLEEP: {
    struct timespec ts = {0, (long)(s * 1e9)};
    nanosleep(&ts, NULL);
    return;
  }
  }
}
