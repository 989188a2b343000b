/* threads_run.c: loom_threads_run, the threads backend's world: N rank threads in this
 * process, each with its group, its scratch buffers and its share of the cores (pinned to it
 * when the configuration asks); a rank's result and its exit become visible to its peers (so
 * they fail instead of waiting for it). */
#define _GNU_SOURCE /* sched_getaffinity, pthread_setaffinity_np */
#include "dist/threads/threads_int.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define MAX_RANKS 1024

typedef struct rank_arg {
  loom__thr_rank *me;
  int (*fn)(loom_pg *, void *);
  void *arg;
} rank_arg;

/* Pin the calling rank thread to rank r's slice of the CPUs the process may run on (threads it
 * starts later inherit it). Measured, DDP on 2 ranks x 1 core (bench_ddp's throughput part, 4
 * alternating pairs): f32 16.7-17.2k samples/s pinned against 10.3-16.3k floating, bf16
 * 26.0-31.6k against 21.8-26.0k: floating ranks migrate and land on the same core. Best
 * effort: nothing happens if the set cannot be read or is too small. */
static void pin_rank(int r, int n) {
  cpu_set_t allowed, mine;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
  int count = CPU_COUNT(&allowed);
  if (count < n) return;
  int share = count / n, extra = count % n;
  int first = r * share + (r < extra ? r : extra), last = first + share + (r < extra);
  CPU_ZERO(&mine);
  for (int cpu = 0, k = 0; cpu < CPU_SETSIZE && k < last; cpu++) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    if (k >= first) CPU_SET(cpu, &mine);
    k++;
  }
  pthread_setaffinity_np(pthread_self(), sizeof mine, &mine);
}

static void *rank_main(void *p) {
  rank_arg *a = p;
  loom__thr_rank *me = a->me;
  loom_pg *pg = &me->pg;
  loom_mem_set_account(pg->mem_account); /* rank r's bytes are counted as rank r's */
  if (me->world->pin) pin_rank(pg->rank, me->world->n);
  int rc = a->fn(pg, a->arg);
  if (rc) {
    snprintf(me->msg, sizeof me->msg, "%s", loom_last_error());
  } else {
    pthread_mutex_lock(&pg->mu);
    size_t n = pg->outstanding;
    pthread_mutex_unlock(&pg->mu);
    if (n) {
      rc = LOOM_EBUSY;
      snprintf(me->msg, sizeof me->msg, "returned with %zu collectives not waited", n);
    }
  }
  me->status = rc;
  if (rc) {
    char msg[600];
    snprintf(msg, sizeof msg, "rank %d returned %s: %s", pg->rank, loom_status_name(rc),
             me->msg);
    loom__pg_fail(pg, rc, msg);
  }
  loom__pg_drain(pg); /* queued collectives still belong to the group's sequence */
  atomic_store(&me->exited, 1);
  loom__thr_wake(me);
  return NULL;
}

static void world_free(loom__thr_world *w, int inited) {
  if (!w) return;
  for (int r = 0; r < inited; r++) {
    loom__thr_rank *me = &w->ranks[r];
    loom__pg_stop_thread(&me->pg);
    loom__pg_free_live(&me->pg);
    loom__pg_fini(&me->pg);
  }
  if (w->ranks)
    for (int r = 0; r < w->n; r++) loom__free(w->ranks[r].scratch[0]);
  loom__free(w->ranks);
  pthread_mutex_destroy(&w->mu);
  loom__free(w);
}

/* Allocate the world and initialise `*inited` ranks' groups. */
static int world_create(int n, const loom_pg_cfg *cfg, loom__thr_world **out, int *inited) {
  int rc = LOOM_OK;
  *inited = 0;
  loom__thr_world *w = loom__calloc(LOOM_POOL_META, 1, sizeof *w);
  if (!w) return loom__fail(LOOM_ENOMEM, "loom_threads_run: out of memory for the world");
  pthread_mutex_init(&w->mu, NULL);
  w->n = n;
  atomic_init(&w->failed_rank, -1);
  w->ranks = loom__calloc(LOOM_POOL_META, (size_t)n, sizeof *w->ranks);
  LOOM_TRY_ALLOC(w->ranks, "the ranks");
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  int cores = cfg->cores ? cfg->cores : (online > 0 ? (int)online : 1);
  w->pin = cfg->pin && cfg->cores == 0 && n > 1;
  for (int r = 0; r < n; r++) {
    loom__thr_rank *me = &w->ranks[r];
    me->world = w;
    me->scratch[0] = loom__malloc(LOOM_POOL_META, 2 * LOOM__THR_SMALL_BYTES);
    LOOM_TRY_ALLOC(me->scratch[0], "scratch buffers");
    me->scratch[1] = me->scratch[0] + LOOM__THR_SMALL_BYTES;
    LOOM_TRY(loom__pg_init(&me->pg, &loom__thr_ops, me, r, n, cfg));
    me->pg.owned = true;
    /* the group is made here, on the caller's thread, but it is rank r's: account r + 1
     * (ranks past the last account stay on the process's) */
    me->pg.mem_account = r + 1 < LOOM_MEM_ACCOUNTS ? r + 1 : 0;
    int share = cores / n + (r < cores % n);
    me->pg.compute_threads = share > 0 ? share : 1;
    (*inited)++;
  }
  *out = w;
  return LOOM_OK;
done:
  world_free(w, *inited);
  *inited = 0;
  return rc;
}

int loom_threads_run(int nranks, const loom_pg_cfg *cfg, int (*fn)(loom_pg *pg, void *arg),
                     void *arg) {
  if (nranks < 1 || nranks > MAX_RANKS)
    return loom__fail(LOOM_EINVAL, "loom_threads_run: nranks %d must be in 1..%d", nranks,
                      MAX_RANKS);
  if (!fn) return loom__fail(LOOM_EINVAL, "loom_threads_run: fn is NULL");
  loom_pg_cfg def = loom_pg_cfg_default();
  if (!cfg) cfg = &def;
  int rc = loom_pg_cfg_validate(cfg);
  if (rc) return rc;
  loom__thr_world *w = NULL;
  int inited = 0;
  rc = world_create(nranks, cfg, &w, &inited);
  if (rc) return rc;
  rank_arg *args = loom__calloc(LOOM_POOL_META, (size_t)nranks, sizeof *args);
  pthread_t *th = loom__calloc(LOOM_POOL_META, (size_t)nranks, sizeof *th);
  int started = 0;
  if (!args || !th) {
    rc = loom__fail(LOOM_ENOMEM, "loom_threads_run: out of memory for %d threads", nranks);
    goto done;
  }
  for (; started < nranks; started++) {
    args[started] = (rank_arg){&w->ranks[started], fn, arg};
    if (pthread_create(&th[started], NULL, rank_main, &args[started])) break;
  }
  if (started < nranks) {
    /* the ranks that did start fail their collectives instead of waiting for the others */
    loom__thr_world_fail(w, started, LOOM_EBACKEND, "a rank thread could not be started");
    for (int r = started; r < nranks; r++) atomic_store(&w->ranks[r].exited, 1);
  }
  for (int r = 0; r < started; r++) pthread_join(th[r], NULL);
  if (started < nranks) {
    rc = loom__fail(LOOM_EBACKEND, "loom_threads_run: could not start rank thread %d of %d",
                    started, nranks);
    goto done;
  }
  /* the root cause: the rank whose failure came first, if its function failed; else the
   * lowest-numbered failing rank */
  int first = atomic_load(&w->failed_rank);
  if (first >= 0 && w->ranks[first].status) {
    rc = loom__fail(w->ranks[first].status, "rank %d: %s", first, w->ranks[first].msg);
    goto done;
  }
  for (int r = 0; r < nranks; r++)
    if (w->ranks[r].status) {
      rc = loom__fail(w->ranks[r].status, "rank %d: %s", r, w->ranks[r].msg);
      break;
    }
done:
  loom__free(args);
  loom__free(th);
  world_free(w, inited);
  return rc;
}
