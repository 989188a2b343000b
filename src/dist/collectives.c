/* collectives.c: the public collective calls: argument checks (buffers, dtype, op, root, the
 * in-place rules, byte-size overflow), then loom__pg_issue. */
#include "dist/dist_int.h"

#include <stdint.h>

/* Do [a, a+na) and [b, b+nb) overlap? */
static bool overlaps(const void *a, size_t na, const void *b, size_t nb) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return na && nb && x < y + nb && y < x + na;
}

/* Common checks; *send_bytes / *recv_bytes are the sizes of the two buffers. */
static int check(const char *who, loom_pg *pg, const void *send, const void *recv,
                 size_t count, loom_dtype dt, size_t send_blocks, size_t recv_blocks,
                 size_t *send_bytes, size_t *recv_bytes) {
  if (!pg) return loom__fail(LOOM_EINVAL, "%s: pg is NULL", who);
  if (!loom_dtype_valid(dt)) return loom__fail(LOOM_EDTYPE, "%s: dtype %d is not valid", who, dt);
  size_t bytes;
  if (!loom__mul_ok(count, loom_dtype_size(dt), &bytes) ||
      !loom__mul_ok(bytes, send_blocks, send_bytes) ||
      !loom__mul_ok(bytes, recv_blocks, recv_bytes) || *send_bytes > (SIZE_MAX >> 2) ||
      *recv_bytes > (SIZE_MAX >> 2))
    return loom__fail(LOOM_EOVERFLOW, "%s: %zu elements of %s overflow the byte size", who,
                      count, loom_dtype_name(dt));
  if (count && !recv) return loom__fail(LOOM_EINVAL, "%s: recv is NULL with count %zu", who, count);
  if (count && !send && send_blocks)
    return loom__fail(LOOM_EINVAL, "%s: send is NULL with count %zu", who, count);
  return LOOM_OK;
}

static int check_op(const char *who, loom_redop op) {
  if ((unsigned)op >= LOOM_REDOP_COUNT)
    return loom__fail(LOOM_EINVAL, "%s: reduction op %d is not valid", who, op);
  return LOOM_OK;
}

int loom_pg_allreduce(loom_pg *pg, const void *send, void *recv, size_t count, loom_dtype dt,
                      loom_redop op, loom_work **out) {
  return loom__pg_allreduce_prepared(pg, send, recv, count, dt, op, NULL, NULL, out);
}

int loom__pg_allreduce_prepared(loom_pg *pg, const void *send, void *recv, size_t count,
                                loom_dtype dt, loom_redop op, loom__coll_prepare_fn prepare,
                                void *ctx, loom_work **out) {
  const char *who = "loom_pg_allreduce";
  if (out) *out = NULL;
  size_t sb, rb;
  int rc = check(who, pg, send, recv, count, dt, 1, 1, &sb, &rb);
  if (!rc) rc = check_op(who, op);
  if (rc) return rc;
  if (send != recv && overlaps(send, sb, recv, rb))
    return loom__fail(LOOM_EINVAL, "%s: send and recv overlap without being equal", who);
  loom__coll c = {.kind = LOOM__ALLREDUCE, .send = send, .recv = recv, .count = count, .dt = dt,
                  .op = op, .prepare = prepare, .prepare_ctx = ctx};
  return loom__pg_issue(pg, &c, out);
}

int loom_pg_broadcast(loom_pg *pg, const void *send, void *recv, size_t count, loom_dtype dt,
                      int root, loom_work **out) {
  const char *who = "loom_pg_broadcast";
  if (out) *out = NULL;
  size_t sb, rb;
  if (pg && (root < 0 || root >= pg->size))
    return loom__fail(LOOM_EINVAL, "%s: root %d out of range for %d ranks", who, root, pg->size);
  bool is_root = pg && pg->rank == root;
  int rc = check(who, pg, send, recv, count, dt, is_root ? 1 : 0, 1, &sb, &rb);
  if (rc) return rc;
  if (is_root && send != recv && overlaps(send, sb, recv, rb))
    return loom__fail(LOOM_EINVAL, "%s: send and recv overlap without being equal", who);
  loom__coll c = {.kind = LOOM__BROADCAST, .send = is_root ? send : NULL, .recv = recv,
                  .count = count, .dt = dt, .op = LOOM_SUM, .root = root};
  return loom__pg_issue(pg, &c, out);
}

int loom_pg_allgather(loom_pg *pg, const void *send, void *recv, size_t count, loom_dtype dt,
                      loom_work **out) {
  return loom__pg_allgather_prepared(pg, send, recv, count, dt, NULL, NULL, out);
}

int loom__pg_allgather_always(loom_pg *pg, const void *send, void *recv, size_t count,
                              loom_dtype dt) {
  size_t sb, rb;
  int rc = check("loom_pg_allgather", pg, send, recv, count, dt, 1, (size_t)pg->size, &sb, &rb);
  if (rc) return rc;
  loom__coll c = {.kind = LOOM__ALLGATHER, .send = send, .recv = recv, .count = count, .dt = dt,
                  .op = LOOM_SUM, .always = true};
  return loom__pg_issue(pg, &c, NULL);
}

int loom__pg_allgather_prepared(loom_pg *pg, const void *send, void *recv, size_t count,
                                loom_dtype dt, loom__coll_prepare_fn prepare, void *ctx,
                                loom_work **out) {
  const char *who = "loom_pg_allgather";
  if (out) *out = NULL;
  size_t sb, rb;
  int rc = check(who, pg, send, recv, count, dt, 1, pg ? (size_t)pg->size : 1, &sb, &rb);
  if (rc) return rc;
  const char *mine = (const char *)recv + (size_t)pg->rank * sb;
  if (send != mine && overlaps(send, sb, recv, rb))
    return loom__fail(LOOM_EINVAL,
                      "%s: send overlaps recv but is not recv + rank*count (the in-place rule)",
                      who);
  loom__coll c = {.kind = LOOM__ALLGATHER, .send = send, .recv = recv, .count = count, .dt = dt,
                  .op = LOOM_SUM, .prepare = prepare, .prepare_ctx = ctx};
  return loom__pg_issue(pg, &c, out);
}

int loom_pg_reduce_scatter(loom_pg *pg, const void *send, void *recv, size_t count,
                           loom_dtype dt, loom_redop op, loom_work **out) {
  const char *who = "loom_pg_reduce_scatter";
  if (out) *out = NULL;
  size_t sb, rb;
  int rc = check(who, pg, send, recv, count, dt, pg ? (size_t)pg->size : 1, 1, &sb, &rb);
  if (!rc) rc = check_op(who, op);
  if (rc) return rc;
  const char *mine = (const char *)send + (size_t)pg->rank * rb;
  if ((const char *)recv != mine && overlaps(send, sb, recv, rb))
    return loom__fail(LOOM_EINVAL,
                      "%s: recv overlaps send but is not send + rank*count (the in-place rule)",
                      who);
  loom__coll c = {.kind = LOOM__REDUCE_SCATTER, .send = send, .recv = recv, .count = count,
                  .dt = dt, .op = op};
  return loom__pg_issue(pg, &c, out);
}

int loom_pg_barrier(loom_pg *pg, loom_work **out) {
  if (out) *out = NULL;
  if (!pg) return loom__fail(LOOM_EINVAL, "loom_pg_barrier: pg is NULL");
  loom__coll c = {.kind = LOOM__BARRIER, .dt = LOOM_F32, .op = LOOM_SUM};
  return loom__pg_issue(pg, &c, out);
}
