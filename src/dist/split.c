/* split.c: loom_pg_split's generic part (MPI_Comm_split's semantics): one all-gather of every
 * rank's color and key on the parent, the new group's members in key order (ties by parent
 * rank), then the backend's split (threads_split.c, pg_mpi.c). */
#include "dist/dist_int.h"

#include <stdlib.h>

typedef struct member {
  int64_t key;
  int rank;
} member;

static int by_key(const void *a, const void *b) {
  const member *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return (x->rank > y->rank) - (x->rank < y->rank);
}

int loom_pg_split(loom_pg *pg, int color, int key, loom_pg **out) {
  if (out) *out = NULL;
  if (!pg || !out) return loom__fail(LOOM_EINVAL, "loom_pg_split: pg and out must not be NULL");
  if (!pg->ops->split)
    return loom__fail(LOOM_ENOSYS, "loom_pg_split: the %s backend cannot split", pg->ops->name);
  if (color < 0) color = LOOM_PG_NO_COLOR;
  int size = pg->size;
  int64_t mine[2] = {color, key};
  int64_t *all = loom__calloc(LOOM_POOL_META, 2 * (size_t)size, sizeof *all);
  member *m = loom__calloc(LOOM_POOL_META, (size_t)size, sizeof *m);
  int *members = loom__calloc(LOOM_POOL_META, (size_t)size, sizeof *members);
  int rc = all && m && members ? LOOM_OK
                               : loom__fail(LOOM_ENOMEM, "loom_pg_split: out of memory");
  if (!rc) rc = loom__pg_allgather_always(pg, mine, all, 2, LOOM_I64);
  int n = 0, my_rank = -1;
  for (int r = 0; r < size && !rc && color >= 0; r++)
    if (all[2 * r] == color) m[n++] = (member){all[2 * r + 1], r};
  if (!rc && n) qsort(m, (size_t)n, sizeof *m, by_key);
  for (int i = 0; i < n; i++) {
    members[i] = m[i].rank;
    if (m[i].rank == pg->rank) my_rank = i;
  }
  if (!rc) rc = pg->ops->split(pg, color, key, members, n, my_rank, out);
  /* the members' ranks in the run's group, for messages (loom__pg_who) */
  if (!rc && *out && !((*out)->run_ranks = loom__calloc(LOOM_POOL_META, (size_t)n, sizeof(int)))) {
    loom_pg_free(*out);
    *out = NULL;
    rc = loom__fail(LOOM_ENOMEM, "loom_pg_split: out of memory");
  }
  for (int i = 0; !rc && *out && i < n; i++)
    (*out)->run_ranks[i] = pg->run_ranks ? pg->run_ranks[members[i]] : members[i];
  loom__free(all);
  loom__free(m);
  loom__free(members);
  return rc;
}
