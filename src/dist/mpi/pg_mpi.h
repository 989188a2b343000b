/* pg_mpi.h: the mpi backend's group (struct mpi_pg) and what pg_mpi.c lends ring_mpi.c (waits,
 * scratch, errors), with the rings ring_mpi.c runs. src/dist/mpi/ only; includes mpi.h. */
#ifndef LOOM_DIST_PG_MPI_H
#define LOOM_DIST_PG_MPI_H

#include "dist/dist_int.h"

#include <mpi.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define HDR 5 /* int64 fields of a collective's header */
/* A small all-reduce's data travels inside its header message (pg_mpi.c): up to this many
 * bytes, i.e. SMALL_WORDS int64 words after the header. */
#define SMALL_BYTES 256
#define SMALL_WORDS (SMALL_BYTES / 8)
#define SLOT (HDR + SMALL_WORDS) /* int64 words of one rank's header message, at most */

typedef struct fail_note {
  uint64_t gid; /* the group's id: a stale notice to a reused communicator id is dropped */
  int rank, code;
  char msg[256];
} fail_note;

typedef struct mpi_pg {
  loom_pg pg;
  MPI_Comm comm, ctl;
  pthread_mutex_t ctl_mu; /* guards the notice receive and sends */
  MPI_Request notice_req;
  fail_note notice_in, notice_out;
  MPI_Request *sends; /* notices sent to peers */
  int nsends;
  bool broken;        /* an MPI request was left active: do not free the communicators */
  uint64_t gid;       /* rank 0's pick, broadcast at creation */
  int64_t mine[SLOT]; /* this rank's header [+ data] (sent from here: valid if a wait fails) */
  int64_t *hdrs;      /* size * SLOT, the header exchange (every rank's header [+ data]) */
  MPI_Request *hreq;  /* 2 * size, its point-to-point requests */
  void *tmp[2];       /* [0] f32 widening / in-place result / ring sums, [1] ring receive chunks */
  size_t tmp_bytes[2];
  bool single_copy;   /* every rank's MPI copies large messages once: MPI_Allreduce, not the ring */
  bool across;        /* the group spans machines: all-gathers and reduce-scatters are rings */
} mpi_pg;

/* LOOM_EBACKEND naming `who`, the MPI `call` and MPI's error string for err. (pg_mpi.c) */
int loom__mpi_fail(int err, const char *who, const char *call);
/* Poll req to completion under the group's timeout, waiting for rank `peer` (-1: not known);
 * fails on abort, a peer's failure notice or the timeout, leaving the group broken. (pg_mpi.c) */
int loom__mpi_wait(mpi_pg *m, MPI_Request *req, const loom__coll *c, int peer);
/* Scratch buffer i (0 or 1) of at least `bytes`, kept for later collectives. (pg_mpi.c) */
int loom__mpi_scratch(mpi_pg *m, int i, size_t bytes, const loom__coll *c, void **out);
/* buf[i] /= the group's size, i < n (i32, i64 or f32). (pg_mpi.c) */
void loom__mpi_avg_div(void *buf, loom_dtype dt, size_t n, int size);

/* ---- rings of MPI_Isend/MPI_Irecv in rank order (ring_mpi.c) ----
 * Each step's block goes in chunks that are all in flight at once, reduced as they arrive;
 * every wait is under the group's timeout. Errors: LOOM_ENOMEM (scratch), LOOM_EBACKEND,
 * LOOM_ETIMEOUT, LOOM_EREMOTE, LOOM_EABORTED. */

/* Large all-reduces without a single-copy transport: at least RING_MIN_BYTES of f32. */
#define RING_MIN_BYTES ((size_t)256 << 10)
/* In place on buf (n >= group size elements of f32, i32 or i64); AVG sums (the caller
 * divides). Scratch 1 holds a block. */
int loom__mpi_ring_allreduce(mpi_pg *m, void *buf, size_t n, loom_dtype dt, loom_redop op,
                             const loom__coll *c);
/* c's all-gather: c->count elements from every rank into c->recv in rank order (c->send may
 * be recv's own block). No scratch. */
int loom__mpi_ring_allgather(mpi_pg *m, const loom__coll *c);
/* c's reduce-scatter: block `rank` of the sum (or min, max, product, average) of every rank's
 * c->send into c->recv (which may be send's own block); f16/bf16 carried and summed in f32.
 * Goes in pieces of `piece` elements of each block, so scratch 0 holds 2-3 pieces whatever
 * the buffer. */
int loom__mpi_ring_reduce_scatter(mpi_pg *m, const loom__coll *c, size_t piece);

#endif
