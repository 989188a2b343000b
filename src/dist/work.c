/* work.c: work handles (MPI request semantics) and the per-group progress thread.
 *
 * A blocking collective issued while nothing is queued or running runs on the issuing thread
 * (no hand-off, so a small all-reduce costs no thread wake-up). Anything else is queued and
 * the group's progress thread (started on first need) runs the queue in issue order, so async
 * collectives overlap the caller's compute and blocking ones keep their place in line. While a
 * caller is blocked (a blocking collective, loom_work_wait) pg->blocked counts it, and the
 * waits poll instead of sleeping (wait.c's policy): as MPI's blocking calls do. */
#include "dist/dist_int.h"

#include <stdio.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <string.h>

/* How long a waiter spins on a work's completion before it sleeps. */
#define WAIT_SPIN_S 50e-6

/* Communication is latency-critical and compute is throughput: when the progress thread shares
 * the cores with the ranks' compute, it should run as soon as its peer's data is there, as
 * NCCL's high-priority streams do. Raising a thread's priority needs CAP_SYS_NICE (root has
 * it); without it the thread keeps the default priority. */
static void raise_priority(void) {
  (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), -10);
}

static void *progress_main(void *arg) {
  loom_pg *pg = arg;
  raise_priority();
  loom_mem_set_account(pg->mem_account); /* what it allocates is the rank's */
  pthread_mutex_lock(&pg->mu);
  for (;;) {
    while (!pg->stop && (!pg->head || pg->running)) pthread_cond_wait(&pg->cv_work, &pg->mu);
    if (!pg->head || pg->running) break; /* stop requested and nothing left */
    loom_work *w = pg->head;
    pg->head = w->next;
    if (!pg->head) pg->tail = NULL;
    pg->running = true;
    pthread_mutex_unlock(&pg->mu);

    int rc = loom__pg_execute(pg, &w->c, false);
    if (rc) snprintf(w->msg, sizeof w->msg, "%s", loom_last_error());

    pthread_mutex_lock(&pg->mu);
    pg->running = false;
    w->status = rc;
    atomic_store_explicit(&w->done, 1, memory_order_release);
    pthread_cond_broadcast(&pg->cv_done);
  }
  pthread_mutex_unlock(&pg->mu);
  return NULL;
}

/* With pg->mu held: make sure the progress thread runs. */
static int ensure_thread(loom_pg *pg) {
  if (pg->thread_started) return LOOM_OK;
  if (pthread_create(&pg->thread, NULL, progress_main, pg))
    return loom__fail(LOOM_EBACKEND, "loom_pg: rank %d could not start its progress thread",
                      pg->rank);
  pg->thread_started = true;
  return LOOM_OK;
}

static void enqueue(loom_pg *pg, loom_work *w) {
  w->next = NULL;
  if (pg->tail) pg->tail->next = w;
  else pg->head = w;
  pg->tail = w;
  pthread_cond_signal(&pg->cv_work);
}

/* Wait for w->done: spin briefly (a wake-up through the kernel costs tens of µs), then sleep. */
static void wait_done(loom_work *w) {
  loom_pg *pg = w->pg;
  atomic_fetch_add(&pg->blocked, 1); /* the progress thread's waits for peers now poll */
  double t0 = loom__now();
  for (unsigned i = 0; !atomic_load_explicit(&w->done, memory_order_acquire); i++) {
    loom__cpu_relax();
    if ((i & 63) == 0 && loom__now() - t0 > WAIT_SPIN_S) break;
  }
  pthread_mutex_lock(&pg->mu);
  while (!atomic_load_explicit(&w->done, memory_order_acquire))
    pthread_cond_wait(&pg->cv_done, &pg->mu);
  pthread_mutex_unlock(&pg->mu);
  atomic_fetch_sub(&pg->blocked, 1);
}

int loom__pg_issue(loom_pg *pg, const loom__coll *c, loom_work **out) {
  const char *who = loom__coll_name(c->kind);
  if (out) *out = NULL;
  int rc = loom__pg_check(pg, who);
  if (rc) return rc;
  if (!out) { /* blocking: run inline when nothing is queued or running, with no handle (a small
               * all-reduce's whole bookkeeping is this lock and the one after it) */
    loom__coll now = *c;
    pthread_mutex_lock(&pg->mu);
    if (!pg->head && !pg->running) {
      now.seq = ++pg->seq;
      pg->running = true;
      pthread_mutex_unlock(&pg->mu);
      atomic_fetch_add_explicit(&pg->blocked, 1, memory_order_relaxed); /* waits poll */
      rc = loom__pg_execute(pg, &now, true); /* checked above, a moment ago */
      atomic_fetch_sub_explicit(&pg->blocked, 1, memory_order_relaxed);
      pthread_mutex_lock(&pg->mu);
      pg->running = false;
      if (pg->head) pthread_cond_signal(&pg->cv_work);
      pthread_cond_broadcast(&pg->cv_done); /* for loom__pg_drain */
      pthread_mutex_unlock(&pg->mu);
      return rc;
    }
    pthread_mutex_unlock(&pg->mu);
  }
  loom_work *w = NULL;
  loom_work local;
  if (out) {
    w = loom__calloc(LOOM_POOL_META, 1, sizeof *w);
    if (!w) return loom__fail(LOOM_ENOMEM, "%s: out of memory for a work handle", who);
  } else {
    w = &local;
    memset(w, 0, sizeof *w);
  }
  w->pg = pg;
  w->c = *c;
  atomic_init(&w->done, 0);

  pthread_mutex_lock(&pg->mu);
  w->c.seq = ++pg->seq;
  rc = ensure_thread(pg);
  if (rc) {
    pg->seq--;
    pthread_mutex_unlock(&pg->mu);
    if (out) loom__free(w);
    return rc;
  }
  enqueue(pg, w);
  if (out) {
    pg->outstanding++;
    w->live_next = pg->live;
    if (pg->live) pg->live->live_prev = w;
    pg->live = w;
  }
  pthread_mutex_unlock(&pg->mu);
  if (out) {
    *out = w;
    return LOOM_OK;
  }
  wait_done(w);
  if (w->status) return loom__fail(w->status, "%s", w->msg);
  return LOOM_OK;
}

/* Consume a completed handle: free it, NULL the caller's pointer, return its status. */
static int consume(loom_work **wp) {
  loom_work *w = *wp;
  loom_pg *pg = w->pg;
  int rc = w->status;
  char msg[sizeof w->msg];
  if (rc) memcpy(msg, w->msg, sizeof msg);
  pthread_mutex_lock(&pg->mu);
  pg->outstanding--;
  if (w->live_prev) w->live_prev->live_next = w->live_next;
  else pg->live = w->live_next;
  if (w->live_next) w->live_next->live_prev = w->live_prev;
  pthread_mutex_unlock(&pg->mu);
  loom__free(w);
  *wp = NULL;
  if (rc) return loom__fail(rc, "%s", msg);
  return LOOM_OK;
}

int loom_work_wait(loom_work **w) {
  if (!w) return loom__fail(LOOM_EINVAL, "loom_work_wait: w is NULL");
  if (!*w) return LOOM_OK;
  wait_done(*w);
  return consume(w);
}

int loom__work_wait_keep(loom_work *w) {
  if (!w) return LOOM_OK;
  wait_done(w);
  loom_pg *pg = w->pg;
  char msg[sizeof w->msg];
  pthread_mutex_lock(&pg->mu); /* done was set under it: status and msg are published */
  int rc = w->status;
  if (rc) memcpy(msg, w->msg, sizeof msg);
  pthread_mutex_unlock(&pg->mu);
  if (rc) return loom__fail(rc, "%s", msg);
  return LOOM_OK;
}

int loom_work_test(loom_work **w, int *done) {
  if (!w || !done) return loom__fail(LOOM_EINVAL, "loom_work_test: w or done is NULL");
  if (!*w) {
    *done = 1;
    return LOOM_OK;
  }
  if (!atomic_load_explicit(&(*w)->done, memory_order_acquire)) {
    *done = 0;
    return LOOM_OK;
  }
  /* done is set under the mutex; take it once so the completion is fully published */
  pthread_mutex_lock(&(*w)->pg->mu);
  pthread_mutex_unlock(&(*w)->pg->mu);
  *done = 1;
  return consume(w);
}

int loom_work_wait_all(loom_work **ws, size_t n) {
  if (!ws && n) return loom__fail(LOOM_EINVAL, "loom_work_wait_all: ws is NULL");
  int first = LOOM_OK;
  char msg[512] = "";
  for (size_t i = 0; i < n; i++) {
    int rc = loom_work_wait(&ws[i]);
    if (rc && first == LOOM_OK) {
      first = rc;
      snprintf(msg, sizeof msg, "%s", loom_last_error());
    }
  }
  if (first) return loom__fail(first, "%s", msg);
  return LOOM_OK;
}

void loom__pg_drain(loom_pg *pg) {
  pthread_mutex_lock(&pg->mu);
  while (pg->head || pg->running) pthread_cond_wait(&pg->cv_done, &pg->mu);
  pthread_mutex_unlock(&pg->mu);
}

void loom__pg_stop_thread(loom_pg *pg) {
  pthread_mutex_lock(&pg->mu);
  bool started = pg->thread_started;
  pg->stop = true;
  pthread_cond_broadcast(&pg->cv_work);
  pthread_mutex_unlock(&pg->mu);
  if (started) pthread_join(pg->thread, NULL);
  pg->thread_started = false;
}

void loom__pg_free_live(loom_pg *pg) {
  pthread_mutex_lock(&pg->mu);
  while (pg->live) {
    loom_work *w = pg->live;
    pg->live = w->live_next;
    loom__free(w);
  }
  pg->outstanding = 0;
  pthread_mutex_unlock(&pg->mu);
}
