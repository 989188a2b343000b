/* threads_split.c: loom_pg_split under the threads backend. A sub-group is a world of its
 * own (ticks, headers, scratch), made by its first member and handed to the others through an
 * all-gather of its address on the parent; it remembers the loom_threads_run world its ranks
 * belong to, so that a wait in it also fails when one of those ranks fails or returns
 * (threads_sync.c), and a failure in it fails that world too (threads_coll.c). The last
 * member to free its group frees the world. */
#include "dist/threads/threads_int.h"

#include <stdint.h>
#include <string.h>

static void sub_world_free(loom__thr_world *w) {
  if (!w) return;
  for (int r = 0; w->ranks && r < w->n; r++) loom__free(w->ranks[r].scratch[0]);
  loom__free(w->ranks);
  loom__free(w->members);
  pthread_mutex_destroy(&w->mu);
  loom__free(w);
}

/* The world of the n ranks members[0..n) of parent world pw. */
static loom__thr_world *sub_world_create(loom__thr_world *pw, const int *members, int n) {
  loom__thr_world *w = loom__calloc(LOOM_POOL_META, 1, sizeof *w);
  if (!w) return NULL;
  pthread_mutex_init(&w->mu, NULL);
  w->n = n;
  w->root = loom__thr_root(pw);
  atomic_init(&w->failed_rank, -1);
  atomic_init(&w->refs, n);
  w->ranks = loom__calloc(LOOM_POOL_META, (size_t)n, sizeof *w->ranks);
  w->members = loom__calloc(LOOM_POOL_META, (size_t)n, sizeof *w->members);
  if (!w->ranks || !w->members) goto fail;
  for (int r = 0; r < n; r++) {
    loom__thr_rank *me = &w->ranks[r];
    w->members[r] = loom__thr_root_rank(pw, members[r]);
    me->world = w;
    me->scratch[0] = loom__malloc(LOOM_POOL_META, 2 * LOOM__THR_SMALL_BYTES);
    if (!me->scratch[0]) goto fail;
    me->scratch[1] = me->scratch[0] + LOOM__THR_SMALL_BYTES;
  }
  return w;
fail:
  sub_world_free(w);
  return NULL;
}

int loom__thr_split(loom_pg *pg, int color, int key, const int *members, int n, int my_rank,
                    loom_pg **out) {
  (void)color;
  (void)key;
  loom__thr_world *pw = loom__thr_of(pg)->world;
  loom__thr_world *w = NULL;
  if (n > 0 && my_rank == 0) w = sub_world_create(pw, members, n);
  int64_t mine = (int64_t)(intptr_t)w;
  int64_t *all = loom__calloc(LOOM_POOL_META, (size_t)pg->size, sizeof *all);
  if (!all) {
    sub_world_free(w);
    return loom__fail(LOOM_ENOMEM, "loom_pg_split: out of memory");
  }
  /* on failure the world a leader made is not freed: a peer may have its address already */
  int rc = loom__pg_allgather_always(pg, &mine, all, 1, LOOM_I64);
  if (!rc && n > 0) {
    w = (loom__thr_world *)(intptr_t)all[members[0]];
    if (!w)
      rc = loom__fail(LOOM_ENOMEM, "loom_pg_split: rank %d, the new group's first, could not "
                      "make it (out of memory)", members[0]);
  }
  loom__free(all);
  if (rc || n == 0) return rc;
  loom__thr_rank *me = &w->ranks[my_rank];
  loom_pg_cfg cfg = {.timeout_s = loom_pg_timeout(pg), .cores = 0, .pin = false};
  if ((rc = loom__pg_init(&me->pg, &loom__thr_sub_ops, me, my_rank, n, &cfg))) {
    atomic_store(&me->exited, 1); /* its peers fail instead of waiting for it */
    if (atomic_fetch_sub(&w->refs, 1) == 1) sub_world_free(w);
    return rc;
  }
  me->pg.compute_threads = pg->compute_threads;
  me->pg.mem_account = pg->mem_account;
  *out = &me->pg;
  return LOOM_OK;
}

void loom__thr_sub_destroy(loom_pg *pg) {
  loom__thr_rank *me = loom__thr_of(pg);
  loom__thr_world *w = me->world;
  atomic_store(&me->exited, 1);
  loom__thr_wake(me);
  loom__pg_fini(pg);
  if (atomic_fetch_sub(&w->refs, 1) == 1) sub_world_free(w);
}
