/* pg.c: the process group's generic part: configuration (with LOOM_TIMEOUT's default), life
 * cycle, rank/size getters, the sticky failure and abort, and running one collective through
 * the backend's vtable. The queue and the progress thread are in work.c; argument checks in
 * collectives.c; waiting on peers in wait.c. */
#include "dist/dist_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *loom_redop_name(loom_redop op) {
  switch (op) {
#define REDOP_NAME(name, str) case LOOM_##name: return str;
    LOOM_REDOP_MAP(REDOP_NAME)
#undef REDOP_NAME
  default: return "?";
  }
}

const char *loom__coll_name(loom__coll_kind k) {
  static const char *names[] = {"all-reduce", "broadcast", "all-gather", "reduce-scatter",
                                "barrier"};
  return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

/* LOOM_TIMEOUT: unset or empty (0), seconds > 0 and finite (1, *out set), or bad (-1). */
static int env_timeout(double *out) {
  const char *e = getenv("LOOM_TIMEOUT");
  if (!e || !*e) return 0;
  char *end;
  double v = strtod(e, &end);
  if (end == e || *end || !(v > 0) || !isfinite(v)) return -1;
  *out = v;
  return 1;
}

loom_pg_cfg loom_pg_cfg_default(void) {
  double timeout = 300.0;
  if (env_timeout(&timeout) < 0) timeout = NAN; /* loom_pg_cfg_validate names LOOM_TIMEOUT */
  return (loom_pg_cfg){.timeout_s = timeout, .cores = 0, .pin = true};
}

int loom_pg_cfg_validate(const loom_pg_cfg *cfg) {
  if (!cfg) return loom__fail(LOOM_EINVAL, "loom_pg_cfg_validate: cfg is NULL");
  double env;
  if (isnan(cfg->timeout_s) && env_timeout(&env) < 0)
    return loom__fail(LOOM_EINVAL, "LOOM_TIMEOUT=%s: expected seconds, a number > 0",
                      getenv("LOOM_TIMEOUT"));
  if (!(cfg->timeout_s > 0) || !isfinite(cfg->timeout_s))
    return loom__fail(LOOM_EINVAL, "loom_pg_cfg: timeout_s %g must be > 0 and finite",
                      cfg->timeout_s);
  if (cfg->cores < 0)
    return loom__fail(LOOM_EINVAL, "loom_pg_cfg: cores %d must be >= 0", cfg->cores);
  return LOOM_OK;
}

int loom__pg_init(loom_pg *pg, const loom__pg_ops *ops, void *impl, int rank, int size,
                  const loom_pg_cfg *cfg) {
  memset(pg, 0, sizeof *pg);
  pg->ops = ops;
  pg->impl = impl;
  pg->rank = rank;
  pg->size = size;
  pg->compute_threads = 1;
  pg->mem_account = loom_mem_account();
  atomic_init(&pg->timeout_s, cfg->timeout_s);
  atomic_init(&pg->err, LOOM_OK);
  atomic_init(&pg->aborted, false);
  atomic_init(&pg->blocked, 0);
  if (pthread_mutex_init(&pg->mu, NULL)) goto fail0;
  if (pthread_cond_init(&pg->cv_work, NULL)) goto fail1;
  if (pthread_cond_init(&pg->cv_done, NULL)) goto fail2;
  return LOOM_OK;
fail2:
  pthread_cond_destroy(&pg->cv_work);
fail1:
  pthread_mutex_destroy(&pg->mu);
fail0:
  return loom__fail(LOOM_EBACKEND, "loom_pg: could not initialise the group's mutexes");
}

void loom__pg_fini(loom_pg *pg) {
  loom__free(pg->run_ranks);
  pg->run_ranks = NULL;
  pthread_cond_destroy(&pg->cv_done);
  pthread_cond_destroy(&pg->cv_work);
  pthread_mutex_destroy(&pg->mu);
}

void loom__pg_who(const loom_pg *pg, int r, char *buf, size_t cap) {
  if (pg->run_ranks && r >= 0 && r < pg->size)
    snprintf(buf, cap, "rank %d (rank %d of the run)", r, pg->run_ranks[r]);
  else
    snprintf(buf, cap, "rank %d", r);
}

int loom__pg_fail(loom_pg *pg, int code, const char *msg) {
  bool first = false;
  pthread_mutex_lock(&pg->mu);
  if (atomic_load(&pg->err) == LOOM_OK) {
    snprintf(pg->errmsg, sizeof pg->errmsg, "%s", msg);
    atomic_store(&pg->err, code);
    first = true;
  }
  pthread_mutex_unlock(&pg->mu);
  if (first && pg->ops->failed) pg->ops->failed(pg, code, msg);
  return code;
}

int loom__pg_check(loom_pg *pg, const char *who) {
  int err = atomic_load(&pg->err);
  if (err == LOOM_OK && pg->ops->health && (err = pg->ops->health(pg)) != LOOM_OK) {
    char m[512];
    snprintf(m, sizeof m, "%s", loom_last_error());
    err = loom__pg_fail(pg, err, m);
    err = atomic_load(&pg->err);
  }
  if (err == LOOM_OK) return LOOM_OK;
  char msg[sizeof pg->errmsg];
  pthread_mutex_lock(&pg->mu);
  memcpy(msg, pg->errmsg, sizeof msg);
  pthread_mutex_unlock(&pg->mu);
  return loom__fail(err, "%s: rank %d: the group failed earlier: %s", who, pg->rank, msg);
}

/* The backend's operation for c. */
static int run_backend(loom_pg *pg, const loom__coll *c) {
  const loom__pg_ops *o = pg->ops;
  switch (c->kind) {
  case LOOM__ALLREDUCE: return o->allreduce(pg, c);
  case LOOM__BROADCAST: return o->broadcast(pg, c);
  case LOOM__ALLGATHER: return o->allgather(pg, c);
  case LOOM__REDUCE_SCATTER: return o->reduce_scatter(pg, c);
  case LOOM__BARRIER:
    if (o->barrier) return o->barrier(pg, c);
    loom__coll b = *c;
    b.kind = LOOM__ALLREDUCE;
    b.count = 0;
    return o->allreduce(pg, &b);
  }
  return loom__fail(LOOM_EINVAL, "loom_pg: unknown collective %d", (int)c->kind);
}

int loom__pg_execute(loom_pg *pg, const loom__coll *c, bool checked) {
  int rc = checked ? LOOM_OK : loom__pg_check(pg, loom__coll_name(c->kind));
  if (rc) return rc;
  if (c->prepare) rc = c->prepare(c->prepare_ctx); /* a failure fails the group, as below */
  if (!rc) rc = run_backend(pg, c);
  if (rc) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", loom_last_error());
    loom__pg_fail(pg, rc, msg);
    loom__fail(rc, "%s", msg);
  }
  return rc;
}

/* ---- getters and control ---- */

int loom_pg_rank(const loom_pg *pg) { return pg ? pg->rank : -1; }
int loom_pg_size(const loom_pg *pg) { return pg ? pg->size : -1; }
const char *loom_pg_backend(const loom_pg *pg) { return pg ? pg->ops->name : "?"; }
bool loom__pg_one_address_space(const loom_pg *pg) {
  return pg && pg->ops->name && !strcmp(pg->ops->name, "threads");
}
int loom__pg_fail_group(loom_pg *pg, int code, const char *msg) {
  return pg ? loom__pg_fail(pg, code, msg) : code;
}
int loom_pg_compute_threads(const loom_pg *pg) { return pg ? pg->compute_threads : 1; }
double loom_pg_timeout(const loom_pg *pg) { return pg ? atomic_load(&pg->timeout_s) : 0; }

int loom_pg_set_timeout(loom_pg *pg, double timeout_s) {
  if (!pg) return loom__fail(LOOM_EINVAL, "loom_pg_set_timeout: pg is NULL");
  if (!(timeout_s > 0) || !isfinite(timeout_s))
    return loom__fail(LOOM_EINVAL, "loom_pg_set_timeout: timeout %g must be > 0 and finite",
                      timeout_s);
  atomic_store(&pg->timeout_s, timeout_s);
  return LOOM_OK;
}

int loom_pg_async_error(loom_pg *pg) {
  if (!pg) return loom__fail(LOOM_EINVAL, "loom_pg_async_error: pg is NULL");
  return loom__pg_check(pg, "loom_pg_async_error");
}

int loom_pg_abort(loom_pg *pg) {
  if (!pg) return loom__fail(LOOM_EINVAL, "loom_pg_abort: pg is NULL");
  char msg[128];
  snprintf(msg, sizeof msg, "rank %d aborted the group (loom_pg_abort)", pg->rank);
  atomic_store(&pg->aborted, true);
  loom__pg_fail(pg, LOOM_EABORTED, msg);
  return LOOM_OK;
}

int loom_pg_free(loom_pg *pg) {
  if (!pg) return LOOM_OK;
  if (pg->owned)
    return loom__fail(LOOM_EMISUSE, "loom_pg_free: rank %d's group belongs to loom_threads_run",
                      pg->rank);
  pthread_mutex_lock(&pg->mu);
  size_t n = pg->outstanding;
  pthread_mutex_unlock(&pg->mu);
  if (n)
    return loom__fail(LOOM_EBUSY, "loom_pg_free: rank %d has %zu collectives not yet waited",
                      pg->rank, n);
  loom__pg_drain(pg);
  loom__pg_stop_thread(pg);
  if (pg->ops->destroy) pg->ops->destroy(pg);
  return LOOM_OK;
}
