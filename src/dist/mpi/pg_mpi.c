/* pg_mpi.c: the mpi backend of loom_pg (see loom/dist_mpi.h for the contract): a private
 * duplicate of the communicator for data, another for failure notices, a header exchange
 * before each collective, MPI non-blocking collectives polled with MPI_Test under the group's
 * timeout, and f16/bf16 widened to f32 for reductions; the rings are ring_mpi.c's. With
 * mpi_copy.c and ring_mpi.c, the only files that include mpi.h (through pg_mpi.h). */
#include "dist/mpi/mpi_int.h"
#include "dist/mpi/pg_mpi.h"
#include "loom/dist_mpi.h"

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TAG_FAIL 77
#define TAG_HDR 79
/* Up to this many ranks the header exchange is point-to-point (one 40-byte eager message to
 * each peer, about 1 us on shared memory); above it an MPI_Iallgather (libnbc: 3-12 us here,
 * but log p rounds). */
#define HDR_P2P_MAX 8
/* Polls a wait makes back to back before it starts its clock and pauses (loom__mpi_wait): about
 * 5-10 us of MPI_Test, long enough for a small message's round trip under a busy machine's
 * usual delays, short against the timeouts. */
#define FAST_POLLS 64

static bool loom_initialised_mpi;

static mpi_pg *of(loom_pg *pg) { return (mpi_pg *)pg; }

int loom__mpi_fail(int err, const char *who, const char *call) {
  char s[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(err, s, &len);
  return loom__fail(LOOM_EBACKEND, "%s: %s failed: %.*s", who, call, len, s);
}

static MPI_Datatype mpi_type(loom_dtype dt) {
  switch (dt) {
  case LOOM_F32: return MPI_FLOAT;
  case LOOM_I32: return MPI_INT32_T;
  case LOOM_I64: return MPI_INT64_T;
  default: return MPI_UINT16_T; /* f16/bf16 as bits: moved, never reduced */
  }
}

static MPI_Op mpi_op(loom_redop op) {
  switch (op) {
  case LOOM_MIN: return MPI_MIN;
  case LOOM_MAX: return MPI_MAX;
  case LOOM_PROD: return MPI_PROD;
  default: return MPI_SUM; /* SUM, AVG */
  }
}

/* ---- failure notices ---- */

static int post_notice_recv(mpi_pg *m) {
  return MPI_Irecv(&m->notice_in, (int)sizeof m->notice_in, MPI_BYTE, MPI_ANY_SOURCE, TAG_FAIL,
                   m->ctl, &m->notice_req);
}

/* Has a peer told us it failed? LOOM_OK if not. Thread-safe. */
static int check_notice(mpi_pg *m) {
  int flag = 0;
  pthread_mutex_lock(&m->ctl_mu);
  for (;;) {
    if (m->notice_req == MPI_REQUEST_NULL) {
      flag = 1;
      break;
    }
    MPI_Test(&m->notice_req, &flag, MPI_STATUS_IGNORE);
    if (!flag || m->notice_in.gid == m->gid) break;
    /* a notice meant for an earlier group whose communicator id MPI reused: drop it */
    flag = 0;
    if (post_notice_recv(m) != MPI_SUCCESS) m->notice_req = MPI_REQUEST_NULL;
  }
  pthread_mutex_unlock(&m->ctl_mu);
  if (!flag) return LOOM_OK;
  char me[48], peer[48];
  loom__pg_who(&m->pg, m->pg.rank, me, sizeof me);
  loom__pg_who(&m->pg, m->notice_in.rank, peer, sizeof peer);
  return loom__fail(LOOM_EREMOTE, "%s: %s failed: %s", me, peer, m->notice_in.msg);
}

static int mpi_health(loom_pg *pg) { return check_notice(of(pg)); }

static void mpi_failed(loom_pg *pg, int code, const char *msg) {
  mpi_pg *m = of(pg);
  if (code == LOOM_EREMOTE) return; /* the peer that failed told everyone already */
  pthread_mutex_lock(&m->ctl_mu);
  m->notice_out.gid = m->gid;
  m->notice_out.rank = pg->rank;
  m->notice_out.code = code;
  snprintf(m->notice_out.msg, sizeof m->notice_out.msg, "%s", msg);
  m->nsends = 0;
  for (int r = 0; r < pg->size; r++)
    if (r != pg->rank)
      MPI_Isend(&m->notice_out, (int)sizeof m->notice_out, MPI_BYTE, r, TAG_FAIL, m->ctl,
                &m->sends[m->nsends++]);
  pthread_mutex_unlock(&m->ctl_mu);
}

/* ---- waiting ---- */

/* Poll req to completion under the timeout, waiting for rank `peer` (-1: not known which, but
 * of two ranks it is the other one);
 * fail on abort or a peer's notice. Polls spin at first, then sleep (wait.c): MPI makes
 * progress only inside MPI calls, so each poll is an MPI_Test. On failure the request stays
 * active and the group is marked broken. */
int loom__mpi_wait(mpi_pg *m, MPI_Request *req, const loom__coll *c, int peer) {
  loom_pg *pg = &m->pg;
  /* first as MPI's own wait does: back-to-back polls, no clock and no pause (a small message's
   * round trip is a few hundred ns; every ns between polls is added to it) */
  for (int i = 0; i < FAST_POLLS; i++) {
    int flag = 0, err = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
    if (err != MPI_SUCCESS) {
      m->broken = true;
      return loom__mpi_fail(err, loom__coll_name(c->kind), "MPI_Test");
    }
    if (flag) return LOOM_OK;
  }
  loom__wait w;
  loom__wait_begin(&w, pg, c, peer < 0 && pg->size == 2 ? 1 - pg->rank : peer);
  for (unsigned i = 0;; i++) {
    int flag = 0, err = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
    if (err != MPI_SUCCESS) {
      m->broken = true;
      return loom__mpi_fail(err, loom__coll_name(c->kind), "MPI_Test");
    }
    if (flag) return LOOM_OK;
    loom__wait_pause(&w);
    if ((i & 63) != 63 && loom__now() - w.t0 < 1e-3) continue; /* early: check now and then */
    int rc = LOOM_OK;
    if (atomic_load(&pg->aborted))
      rc = loom__fail(LOOM_EABORTED, "rank %d: %s #%llu aborted (loom_pg_abort)", pg->rank,
                      loom__coll_name(c->kind), (unsigned long long)c->seq);
    else if ((rc = check_notice(m)) != LOOM_OK) {
      /* the notice travels on another communicator and may be seen first, though what the
       * peer sent before it (its header) arrived before it: if the request is done now, go on
       * (a header mismatch is then reported as such; a later wait sees the notice again) */
      if (MPI_Test(req, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) return LOOM_OK;
    } else
      rc = loom__wait_check(&w);
    if (rc) {
      m->broken = true;
      return rc;
    }
  }
}

static const char *kind_name(int64_t k) {
  return k >= 0 && k <= LOOM__BARRIER ? loom__coll_name((loom__coll_kind)k) : "?";
}

/* Exchange headers and check that every rank issued the same collective. With `data` (point-
 * to-point exchange only, bytes <= SMALL_BYTES), this rank's data rides in its header message
 * and every rank's lands after its header in m->hdrs (slot j at j * SLOT): the message is
 * eager on every transport, so a small all-reduce costs one round trip. Receives are always
 * posted for a whole slot, so a peer's header of any collective is read and refused by name. */
static int check_headers(mpi_pg *m, const loom__coll *c, const void *data, size_t bytes) {
  loom_pg *pg = &m->pg;
  bool has_op = c->kind == LOOM__ALLREDUCE || c->kind == LOOM__REDUCE_SCATTER;
  int64_t *mine = m->mine;
  mine[0] = c->kind;
  mine[1] = (int64_t)c->count;
  mine[2] = c->dt;
  mine[3] = has_op ? (int64_t)c->op : -1;
  mine[4] = c->kind == LOOM__BROADCAST ? c->root : -1;
  int words = HDR;
  if (data && bytes) {
    memcpy(&mine[HDR], data, bytes);
    words += (int)((bytes + 7) / 8);
  }
  int rc, err = MPI_SUCCESS;
  if (pg->size <= HDR_P2P_MAX) {
    memcpy(&m->hdrs[pg->rank * SLOT], mine, (size_t)words * sizeof *mine);
    int nq = 0;
    for (int j = 0; j < pg->size && !err; j++)
      if (j != pg->rank)
        err = MPI_Irecv(&m->hdrs[j * SLOT], SLOT, MPI_INT64_T, j, TAG_HDR, m->comm,
                        &m->hreq[nq++]);
    for (int j = 0; j < pg->size && !err; j++)
      if (j != pg->rank)
        err = MPI_Isend(mine, words, MPI_INT64_T, j, TAG_HDR, m->comm, &m->hreq[nq++]);
    if (err) {
      m->broken = true;
      return loom__mpi_fail(err, loom__coll_name(c->kind), "MPI_Isend/MPI_Irecv (header)");
    }
    for (int i = 0; i < nq; i++) { /* receives, then sends, each in peer order */
      int k = i % (pg->size - 1), peer = k < pg->rank ? k : k + 1;
      if ((rc = loom__mpi_wait(m, &m->hreq[i], c, peer))) return rc;
    }
  } else {
    MPI_Request req;
    err = MPI_Iallgather(mine, SLOT, MPI_INT64_T, m->hdrs, SLOT, MPI_INT64_T, m->comm, &req);
    if (err) return loom__mpi_fail(err, loom__coll_name(c->kind), "MPI_Iallgather (header)");
    if ((rc = loom__mpi_wait(m, &req, c, -1))) return rc;
  }
  for (int j = 0; j < pg->size; j++) {
    const int64_t *o = &m->hdrs[j * SLOT];
    int code = o[0] != mine[0] || o[3] != mine[3] || o[4] != mine[4] ? LOOM_EMISUSE
               : o[1] != mine[1]                                       ? LOOM_ESHAPE
               : o[2] != mine[2]                                       ? LOOM_EDTYPE
                                                                       : LOOM_OK;
    if (code)
      return loom__fail(code,
                        "rank %d: collective #%llu mismatch: rank %d called %s(count %lld, %s, "
                        "op %lld, root %lld), rank %d called %s(count %lld, %s, op %lld, root "
                        "%lld)",
                        pg->rank, (unsigned long long)c->seq, pg->rank, kind_name(mine[0]),
                        (long long)mine[1], loom_dtype_name((loom_dtype)mine[2]),
                        (long long)mine[3], (long long)mine[4], j, kind_name(o[0]),
                        (long long)o[1], loom_dtype_name((loom_dtype)o[2]), (long long)o[3],
                        (long long)o[4]);
  }
  return LOOM_OK;
}

/* Scratch buffer i of at least `bytes`, kept for the next collectives. */
int loom__mpi_scratch(mpi_pg *m, int i, size_t bytes, const loom__coll *c, void **out) {
  if (m->tmp_bytes[i] < bytes) {
    loom__free(m->tmp[i]);
    m->tmp_bytes[i] = 0;
    m->tmp[i] = loom__malloc(LOOM_POOL_META, bytes);
    if (!m->tmp[i])
      return loom__fail(LOOM_ENOMEM, "%s: out of memory for %zu bytes of scratch",
                        loom__coll_name(c->kind), bytes);
    m->tmp_bytes[i] = bytes;
  }
  *out = m->tmp[i];
  return LOOM_OK;
}

static int scratch(mpi_pg *m, size_t bytes, const loom__coll *c, void **out) {
  return loom__mpi_scratch(m, 0, bytes, c, out);
}

static int start(mpi_pg *m, const loom__coll *c) {
  if (c->count > INT_MAX / (size_t)m->pg.size)
    return loom__fail(LOOM_EOVERFLOW, "%s: count %zu exceeds what MPI's int counts hold",
                      loom__coll_name(c->kind), c->count);
  return check_headers(m, c, NULL, 0);
}

static bool half(loom_dtype dt) { return dt == LOOM_F16 || dt == LOOM_BF16; }

void loom__mpi_avg_div(void *buf, loom_dtype dt, size_t n, int size) {
  if (dt == LOOM_I32)
    for (size_t i = 0; i < n; i++) ((int32_t *)buf)[i] /= size;
  else if (dt == LOOM_I64)
    for (size_t i = 0; i < n; i++) ((int64_t *)buf)[i] /= size;
  else
    for (size_t i = 0; i < n; i++) ((float *)buf)[i] /= (float)size;
}

/* Large all-reduce under a single-copy transport (Open MPI's CMA: the receiver copies straight
 * out of the sender's buffer), or below 4 MB on one machine without it: MPI's own blocking
 * MPI_Allreduce, in place on buf. Measured, 2 ranks, CMA on: the ring (whole blocks, or
 * chunked) ran 13-35% behind MPI_Allreduce at 1-16 MB, this path 0.97-1.03x; CMA off, 1 MB:
 * the ring 1.05-1.26x, this path 0.86-1.42x, medians 1.15 and 1.00 (BENCHMARKS.md). It
 * blocks inside MPI, but only after the header exchange has shown every rank inside this same
 * collective; see loom/dist_mpi.h. */
static int blocking_allreduce(mpi_pg *m, void *buf, size_t n, loom_dtype dt, loom_redop op) {
  int err = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, mpi_type(dt),
                          mpi_op(op == LOOM_AVG ? LOOM_SUM : op), m->comm);
  if (err) {
    m->broken = true;
    return loom__mpi_fail(err, "all-reduce", "MPI_Allreduce");
  }
  return LOOM_OK;
}

/* The large-buffer algorithm: MPI's blocking call with a single-copy transport or, on one
 * machine, below 4 MB; else the ring (loom__mpi_blocking_allreduce; in place on buf; AVG is
 * the caller's). */
static int large_allreduce(mpi_pg *m, void *buf, size_t n, loom_dtype dt, loom_redop op,
                           const loom__coll *c) {
  return loom__mpi_blocking_allreduce(m->single_copy, m->across, n * loom_dtype_size(dt))
             ? blocking_allreduce(m, buf, n, dt, op)
             : loom__mpi_ring_allreduce(m, buf, n, dt, op, c);
}

/* A small all-reduce on a group small enough for the point-to-point header exchange: every
 * rank's data comes with its header (check_headers), and each rank reduces the slots in rank
 * order, so all ranks hold the same bits. One round trip in all, as MPI's own for 2 ranks;
 * loom's header check followed by MPI_Iallreduce (libnbc) took 5.5-6x raw MPI_Allreduce at
 * 4 bytes (BENCHMARKS.md). */
static bool small_allreduce(const loom_pg *pg, const loom__coll *c) {
  return pg->size > 1 && pg->size <= HDR_P2P_MAX &&
         c->count * loom_dtype_size(c->dt) <= SMALL_BYTES;
}

static int allreduce_in_header(mpi_pg *m, const loom__coll *c) {
  loom_pg *pg = &m->pg;
  size_t bytes = c->count * loom_dtype_size(c->dt);
  int rc = check_headers(m, c, c->send, bytes);
  if (rc) return rc;
  const void *srcs[HDR_P2P_MAX];
  for (int j = 0; j < pg->size; j++) srcs[j] = &m->hdrs[j * SLOT + HDR];
  loom__reduce(c->recv, srcs, pg->size, c->count, c->dt, c->op);
  return LOOM_OK;
}

static int mpi_allreduce(loom_pg *pg, const loom__coll *c) {
  mpi_pg *m = of(pg);
  if (small_allreduce(pg, c)) return allreduce_in_header(m, c);
  int rc = LOOM_OK;
  /* f16/bf16: the f32 scratch before the header exchange, so that a rank that cannot get it
   * fails before its peers can be inside MPI_Allreduce, where nothing would wake them */
  float *f = NULL;
  if (half(c->dt) && c->count <= INT_MAX / (size_t)pg->size)
    rc = scratch(m, c->count * sizeof(float), c, (void **)&f);
  if (rc || (rc = start(m, c))) return rc;
  int n = (int)c->count;
  MPI_Request req;
  int err;
  bool large = pg->size > 1 && c->count * 4 >= RING_MIN_BYTES && c->count >= (size_t)pg->size;
  if (half(c->dt)) {
    loom__widen(c->dt, c->send, f, c->count);
    if (large) {
      if ((rc = large_allreduce(m, f, c->count, LOOM_F32, c->op, c))) return rc;
    } else {
      err = MPI_Iallreduce(MPI_IN_PLACE, f, n, MPI_FLOAT, mpi_op(c->op), m->comm, &req);
      if (err) return loom__mpi_fail(err, "all-reduce", "MPI_Iallreduce");
      if ((rc = loom__mpi_wait(m, &req, c, -1))) return rc;
    }
    if (c->op == LOOM_AVG) loom__mpi_avg_div(f, LOOM_F32, c->count, pg->size);
    loom__narrow(c->dt, f, c->recv, c->count);
    return LOOM_OK;
  }
  if (large) {
    if (c->send != c->recv) loom__copy(c->recv, c->send, c->count * loom_dtype_size(c->dt));
    if ((rc = large_allreduce(m, c->recv, c->count, c->dt, c->op, c))) return rc;
    if (c->op == LOOM_AVG) loom__mpi_avg_div(c->recv, c->dt, c->count, pg->size);
    return LOOM_OK;
  }
  const void *s = c->send == c->recv ? MPI_IN_PLACE : c->send;
  err = MPI_Iallreduce(s, c->recv, n, mpi_type(c->dt), mpi_op(c->op), m->comm, &req);
  if (err) return loom__mpi_fail(err, "all-reduce", "MPI_Iallreduce");
  if ((rc = loom__mpi_wait(m, &req, c, -1))) return rc;
  if (c->op == LOOM_AVG) loom__mpi_avg_div(c->recv, c->dt, c->count, pg->size);
  return LOOM_OK;
}

/* ---- reduce-scatter in pieces (large buffers) ----
 * MPI_Ireduce_scatter_block (Open MPI's libnbc) reduces the whole buffer to rank 0 first, into
 * a temporary buffer as large as every rank's blocks together, then scatters; and an in-place
 * or f16/bf16 call needs a scratch the size of the result (or of the whole f32-widened send
 * buffer) besides. For an FSDP unit of 67 MB that is 67 MB more resident memory on rank 0 and
 * a 34 MB scratch kept on every rank. Above one piece per block (2^20 elements over the ranks),
 * the blocks go through MPI in pieces instead: piece k packs elements [k*m, k*m + len) of every
 * rank-block into a scratch (widening f16/bf16 to f32 as it packs), reduce-scatters that, and
 * writes the result straight into recv (safe in place: the piece was packed before). MPI's
 * temporary and loom's scratch are then about 4 MiB each, whatever the buffer and the ranks. */
#define PIECE_ELEMS ((size_t)1 << 20) /* of all the blocks together (4 MiB of f32) */
#define PIECE_MIN ((size_t)1 << 14)    /* per block, however many ranks */

/* Elements per block in one piece: PIECE_ELEMS over the ranks, so the scratch (p pieces, one
 * more when widened) stays near 4 MiB whatever the group's size. */
static size_t piece_len(int p) {
  size_t len = PIECE_ELEMS / (size_t)p;
  return len < PIECE_MIN ? PIECE_MIN : len;
}

static int pieces_reduce_scatter(mpi_pg *m, const loom__coll *c) {
  int p = m->pg.size, rc;
  size_t n = c->count, es = loom_dtype_size(c->dt), piece = piece_len(p);
  bool widen = half(c->dt);
  loom_dtype wt = widen ? LOOM_F32 : c->dt;
  size_t ws = loom_dtype_size(wt);
  char *tmp; /* the packed piece of every block, then (widened) the f32 result */
  if ((rc = scratch(m, ((size_t)p + widen) * piece * ws, c, (void **)&tmp))) return rc;
  for (size_t at = 0; at < n; at += piece) {
    size_t len = n - at < piece ? n - at : piece;
    for (int j = 0; j < p; j++) {
      const char *src = (const char *)c->send + ((size_t)j * n + at) * es;
      if (widen) loom__widen(c->dt, src, (float *)(tmp + (size_t)j * len * ws), len);
      else loom__copy(tmp + (size_t)j * len * ws, src, len * ws);
    }
    char *dst = (char *)c->recv + at * es, *res = widen ? tmp + (size_t)p * len * ws : dst;
    MPI_Request req;
    int err = MPI_Ireduce_scatter_block(tmp, res, (int)len, mpi_type(wt), mpi_op(c->op), m->comm,
                                        &req);
    if (err) return loom__mpi_fail(err, "reduce-scatter", "MPI_Ireduce_scatter_block");
    if ((rc = loom__mpi_wait(m, &req, c, -1))) return rc;
    if (c->op == LOOM_AVG) loom__mpi_avg_div(res, wt, len, p);
    if (widen) loom__narrow(c->dt, (const float *)res, dst, len);
  }
  return LOOM_OK;
}

static int mpi_reduce_scatter(loom_pg *pg, const loom__coll *c) {
  mpi_pg *m = of(pg);
  int rc = start(m, c);
  if (rc) return rc;
  size_t n = c->count, total = n * (size_t)pg->size, es = loom_dtype_size(c->dt);
  if (m->across && pg->size > 1 && total * 4 >= RING_MIN_BYTES)
    return loom__mpi_ring_reduce_scatter(m, c, piece_len(pg->size));
  if (n > piece_len(pg->size) && pg->size > 1) return pieces_reduce_scatter(m, c);
  MPI_Request req;
  int err;
  if (half(c->dt)) { /* widen all blocks, reduce in f32 into the scratch's tail */
    float *f;
    if ((rc = scratch(m, (total + n) * sizeof(float), c, (void **)&f))) return rc;
    loom__widen(c->dt, c->send, f, total);
    err = MPI_Ireduce_scatter_block(f, f + total, (int)n, MPI_FLOAT, mpi_op(c->op), m->comm,
                                    &req);
    if (err) return loom__mpi_fail(err, "reduce-scatter", "MPI_Ireduce_scatter_block");
    if ((rc = loom__mpi_wait(m, &req, c, -1))) return rc;
    if (c->op == LOOM_AVG) loom__mpi_avg_div(f + total, LOOM_F32, n, pg->size);
    loom__narrow(c->dt, f + total, c->recv, n);
    return LOOM_OK;
  }
  /* in place (recv inside send): reduce into scratch, then copy */
  bool inplace = (const char *)c->recv == (const char *)c->send + (size_t)pg->rank * n * es;
  void *dst = c->recv;
  if (inplace && n && (rc = scratch(m, n * es, c, &dst))) return rc;
  err = MPI_Ireduce_scatter_block(c->send, dst, (int)n, mpi_type(c->dt), mpi_op(c->op), m->comm,
                                  &req);
  if (err) return loom__mpi_fail(err, "reduce-scatter", "MPI_Ireduce_scatter_block");
  if ((rc = loom__mpi_wait(m, &req, c, -1))) return rc;
  if (c->op == LOOM_AVG) loom__mpi_avg_div(dst, c->dt, n, pg->size);
  if (dst != c->recv) loom__copy(c->recv, dst, n * es);
  return LOOM_OK;
}

static int mpi_broadcast(loom_pg *pg, const loom__coll *c) {
  mpi_pg *m = of(pg);
  int rc = start(m, c);
  if (rc) return rc;
  size_t bytes = c->count * loom_dtype_size(c->dt);
  if (pg->rank == c->root && c->send != c->recv) loom__copy(c->recv, c->send, bytes);
  MPI_Request req;
  int err = MPI_Ibcast(c->recv, (int)c->count, mpi_type(c->dt), c->root, m->comm, &req);
  if (err) return loom__mpi_fail(err, "broadcast", "MPI_Ibcast");
  return loom__mpi_wait(m, &req, c, -1);
}

static int mpi_allgather(loom_pg *pg, const loom__coll *c) {
  mpi_pg *m = of(pg);
  int rc = start(m, c);
  if (rc) return rc;
  size_t bytes = c->count * loom_dtype_size(c->dt);
  if (m->across && pg->size > 1 && bytes * (size_t)pg->size >= RING_MIN_BYTES)
    return loom__mpi_ring_allgather(m, c);
  const void *s = c->send == (const char *)c->recv + (size_t)pg->rank * bytes ? MPI_IN_PLACE
                                                                              : c->send;
  MPI_Request req;
  MPI_Datatype t = mpi_type(c->dt);
  int err = MPI_Iallgather(s, (int)c->count, t, c->recv, (int)c->count, t, m->comm, &req);
  if (err) return loom__mpi_fail(err, "all-gather", "MPI_Iallgather");
  return loom__mpi_wait(m, &req, c, -1);
}

static int mpi_barrier(loom_pg *pg, const loom__coll *c) {
  mpi_pg *m = of(pg);
  int rc = start(m, c); /* the header exchange is itself a barrier */
  return rc;
}

static void destroy(mpi_pg *m) {
  if (!m) return;
  if (m->notice_req != MPI_REQUEST_NULL) {
    MPI_Cancel(&m->notice_req);
    MPI_Wait(&m->notice_req, MPI_STATUS_IGNORE);
  }
  /* notices we sent: give them a moment to leave, then let them go */
  for (int i = 0; i < m->nsends; i++) {
    double t0 = loom__now();
    int flag = 0;
    while (!flag && loom__now() - t0 < 1.0) MPI_Test(&m->sends[i], &flag, MPI_STATUS_IGNORE);
    if (!flag) m->broken = true;
  }
  /* the notice communicator is kept (never freed): a notice still in flight must not reach a
   * later group that MPI gave the same communicator id */
  if (!m->broken && m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
  pthread_mutex_destroy(&m->ctl_mu);
  loom__free(m->sends);
  loom__free(m->hdrs);
  loom__free(m->hreq);
  loom__free(m->tmp[0]);
  loom__free(m->tmp[1]);
  loom__pg_fini(&m->pg);
  loom__free(m);
}

static void mpi_destroy(loom_pg *pg) { destroy(of(pg)); }

/* loom_pg_split's backend step: MPI_Comm_split of the group's communicator (blocking, but
 * entered only after loom_pg_split's all-gather has shown every rank there), and a group over
 * the new communicator, with the parent's timeout and compute threads. */
static int mpi_split(loom_pg *pg, int color, int key, const int *members, int n, int my_rank,
                     loom_pg **out) {
  (void)members;
  (void)my_rank;
  mpi_pg *m = of(pg);
  MPI_Comm sub = MPI_COMM_NULL;
  int err = MPI_Comm_split(m->comm, color < 0 ? MPI_UNDEFINED : color, key, &sub);
  if (err) return loom__mpi_fail(err, "loom_pg_split", "MPI_Comm_split");
  if (n == 0 || sub == MPI_COMM_NULL) return LOOM_OK;
  loom_pg_cfg cfg = loom_pg_cfg_default();
  cfg.timeout_s = loom_pg_timeout(pg);
  int rc = loom_mpi_pg_create(&sub, &cfg, out);
  MPI_Comm_free(&sub);
  if (!rc) (*out)->compute_threads = pg->compute_threads;
  return rc;
}

static const loom__pg_ops mpi_ops = {
    .name = "mpi",
    .allreduce = mpi_allreduce,
    .broadcast = mpi_broadcast,
    .allgather = mpi_allgather,
    .reduce_scatter = mpi_reduce_scatter,
    .barrier = mpi_barrier,
    .failed = mpi_failed,
    .health = mpi_health,
    .destroy = mpi_destroy,
    .split = mpi_split,
};

static int ensure_mpi(void) {
  const char *who = "loom_mpi_pg_create";
  int inited = 0, provided = 0, err;
  MPI_Initialized(&inited);
  if (!inited) {
    err = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (err) return loom__mpi_fail(err, who, "MPI_Init_thread");
    loom_initialised_mpi = true;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_MULTIPLE)
    return loom__fail(LOOM_EBACKEND,
                      "%s: MPI provides thread level %d, loom needs MPI_THREAD_MULTIPLE (%d): "
                      "initialise MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)",
                      who, provided, MPI_THREAD_MULTIPLE);
  return LOOM_OK;
}

int loom_mpi_pg_create(void *mpi_comm, const loom_pg_cfg *cfg, loom_pg **out) {
  const char *who = "loom_mpi_pg_create";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  loom_pg_cfg def = loom_pg_cfg_default();
  if (!cfg) cfg = &def;
  int rc = loom_pg_cfg_validate(cfg);
  if (rc) return rc;
  if ((rc = ensure_mpi())) return rc;
  MPI_Comm user = mpi_comm ? *(MPI_Comm *)mpi_comm : MPI_COMM_WORLD;
  int rank, size, err;
  if ((err = MPI_Comm_rank(user, &rank)) || (err = MPI_Comm_size(user, &size)))
    return loom__mpi_fail(err, who, "MPI_Comm_rank/size");
  mpi_pg *m = loom__calloc(LOOM_POOL_META, 1, sizeof *m);
  if (!m) return loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
  m->comm = m->ctl = MPI_COMM_NULL;
  m->notice_req = MPI_REQUEST_NULL;
  pthread_mutex_init(&m->ctl_mu, NULL);
  if ((rc = loom__pg_init(&m->pg, &mpi_ops, m, rank, size, cfg))) {
    pthread_mutex_destroy(&m->ctl_mu);
    loom__free(m);
    return rc;
  }
  m->sends = loom__calloc(LOOM_POOL_META, (size_t)size, sizeof *m->sends);
  m->hdrs = loom__calloc(LOOM_POOL_META, (size_t)size * SLOT, sizeof *m->hdrs);
  m->hreq = loom__calloc(LOOM_POOL_META, 2 * (size_t)size, sizeof *m->hreq);
  LOOM_TRY_ALLOC(m->sends && m->hdrs && m->hreq ? m : NULL, "the group");
  if ((err = MPI_Comm_dup(user, &m->comm)) || (err = MPI_Comm_dup(user, &m->ctl))) {
    rc = loom__mpi_fail(err, who, "MPI_Comm_dup");
    goto done;
  }
  MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(m->ctl, MPI_ERRORS_RETURN);
  /* cores are shared by the ranks on this machine */
  MPI_Comm local;
  int lrank = 0, lsize = 1;
  if (MPI_Comm_split_type(m->comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local) ==
      MPI_SUCCESS) {
    MPI_Comm_rank(local, &lrank);
    MPI_Comm_size(local, &lsize);
    MPI_Comm_free(&local);
  }
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  int cores = cfg->cores ? cfg->cores : (online > 0 ? (int)online : 1);
  int share = cores / lsize + (lrank < cores % lsize);
  m->pg.compute_threads = share > 0 ? share : 1;
  if (rank == 0) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    static _Atomic uint64_t made;
    m->gid = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^
             ((uint64_t)getpid() << 40) ^ (atomic_fetch_add(&made, 1) * 0x9e3779b97f4a7c15ULL);
  }
  if ((err = MPI_Bcast(&m->gid, 1, MPI_UINT64_T, 0, m->comm))) {
    rc = loom__mpi_fail(err, who, "MPI_Bcast");
    goto done;
  }
  /* every rank must pick the same large all-reduce: MPI's only if all ranks have single copy,
   * which is a shared-memory transport's: a group across machines (a rank with a peer on
   * another node) takes the ring, whose every wait is under the timeout, since a blocking
   * MPI_Allreduce over a network that goes away (a link down) never returns */
  /* and a group across machines gathers and reduce-scatters large buffers in rings too (libnbc's
   * are not rings: ring_mpi.c), the traffic `loom plan --hosts` counts */
  int mine[2] = {lsize == size && loom__mpi_single_copy(), lsize == size}, all[2] = {0, 0};
  const char *rings = getenv("LOOM_MPI_RINGS"); /* 1: rings on one machine too; 0: never */
  if (rings && (strcmp(rings, "0") == 0 || strcmp(rings, "1") == 0)) mine[1] = *rings == '0';
  if ((err = MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MIN, m->comm))) {
    rc = loom__mpi_fail(err, who, "MPI_Allreduce");
    goto done;
  }
  m->single_copy = all[0] != 0;
  m->across = all[1] == 0;
  if ((err = post_notice_recv(m))) {
    rc = loom__mpi_fail(err, who, "MPI_Irecv");
    goto done;
  }
  *out = &m->pg;
  return LOOM_OK;
done:
  destroy(m);
  return rc;
}

/* A deadline for a call that may never return (MPI_Finalize, MPI_Abort): a thread that waits
 * until `seconds` have passed or the call returned (watchdog_end), and in the first case writes
 * msg to stderr and ends the process with _exit(status). SIGPIPE is blocked on that thread: a
 * launcher that has already closed the rank's stderr must not turn the exit into a signal. */
typedef struct watchdog {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  double seconds;
  int status;
  char msg[256];
} watchdog;

static void *watchdog_main(void *arg) {
  watchdog *w = arg;
  sigset_t pipe_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, NULL);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += (time_t)w->seconds;
  until.tv_nsec += (long)((w->seconds - (double)(time_t)w->seconds) * 1e9);
  if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&w->mu);
  while (!w->done && pthread_cond_timedwait(&w->cv, &w->mu, &until) == 0) {}
  bool done = w->done;
  pthread_mutex_unlock(&w->mu);
  if (done) return NULL;
  ssize_t n = write(STDERR_FILENO, w->msg, strlen(w->msg));
  (void)n;
  _exit(w->status);
}

/* Start w's thread (false if it cannot be made: the call then runs without a deadline). */
static bool watchdog_start(watchdog *w, pthread_t *t) {
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  w->done = false;
  if (pthread_create(t, NULL, watchdog_main, w) == 0) return true;
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
  return false;
}

static void watchdog_end(watchdog *w, pthread_t t) {
  pthread_mutex_lock(&w->mu);
  w->done = true;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(t, NULL);
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
}

int loom_mpi_finalize_within(double seconds, int exit_status) {
  if (!(seconds > 0 && seconds <= 1e6))
    return loom__fail(LOOM_EINVAL, "loom_mpi_finalize_within: seconds must be in (0, 1e6], got %g",
                      seconds);
  if (!loom_initialised_mpi) return LOOM_OK;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) {
    static watchdog w;
    w.seconds = seconds;
    w.status = exit_status & 0xff;
    snprintf(w.msg, sizeof w.msg, "loom: MPI_Finalize did not return within %g s (MPICH 4.0 "
             "with UCX over TCP has been seen to hang there after a complete run): this "
             "rank's work is done; exiting with status %d\n", seconds, w.status);
    pthread_t t;
    bool watched = watchdog_start(&w, &t);
    /* a peer that ended on its own bound has closed its sockets: MPI's writes to them must
     * fail (EPIPE), not end this rank by SIGPIPE (the launcher would report the job killed) */
    struct sigaction ignore, before;
    memset(&ignore, 0, sizeof ignore);
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    bool restore = sigaction(SIGPIPE, &ignore, &before) == 0;
    MPI_Finalize();
    if (restore) sigaction(SIGPIPE, &before, NULL);
    if (watched) watchdog_end(&w, t);
  }
  loom_initialised_mpi = false;
  return LOOM_OK;
}

int loom_mpi_finalize(void) { return loom_mpi_finalize_within(LOOM_MPI_FINALIZE_S, 1); }

#define ABORT_GRACE_S 5 /* loom_mpi_abort: seconds MPI_Abort gets to end the process */

int loom_mpi_abort(int errorcode) {
  int inited = 0, fin = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&fin);
  if (!inited || fin)
    return loom__fail(LOOM_EMISUSE, "loom_mpi_abort: MPI is not initialised");
  fflush(stdout);
  fflush(stderr);
  /* MPI_Abort asks the launcher to end the job; with a machine unreachable it may wait for
   * that machine's daemon and never return: this process ends itself if it still runs then */
  static watchdog w;
  w.seconds = ABORT_GRACE_S;
  w.status = errorcode & 0xff ? errorcode & 0xff : 1;
  snprintf(w.msg, sizeof w.msg, "loom: MPI_Abort did not end this process within %d s (the "
           "launcher unreachable?): exiting\n", ABORT_GRACE_S);
  pthread_t t;
  if (watchdog_start(&w, &t)) pthread_detach(t);
  MPI_Abort(MPI_COMM_WORLD, errorcode);
  return loom__fail(LOOM_EBACKEND, "loom_mpi_abort: MPI_Abort returned");
}
