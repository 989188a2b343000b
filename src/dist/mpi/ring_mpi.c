/* ring_mpi.c: loom's own ring collectives over MPI_Isend/MPI_Irecv for the mpi backend
 * (pg_mpi.h): the large all-reduce without a single-copy transport, and the all-gather and
 * reduce-scatter of a group that spans machines.
 *
 * Open MPI's non-blocking MPI_Iallreduce (libnbc) runs well behind its blocking MPI_Allreduce
 * on large buffers, so large all-reduces are a ring reduce-scatter + all-gather, each step
 * split into chunks that are all in flight at once and reduced as they arrive (the reduction
 * of chunk i overlaps the transfer of chunk i+1). Every rank ends with the same bits (the
 * all-gather copies the owner's).
 *
 * Across machines, libnbc's MPI_Iallgather sends every block to every rank (a machine's link
 * carries each remote block once per rank behind it) and its MPI_Ireduce_scatter_block reduces
 * the whole buffer to rank 0 before scattering it: with 2 machines x 2 ranks the link carried
 * 1.36x a ring's bytes (BENCHMARKS.md, "Rings across hosts"). A ring in rank order crosses
 * each machine's link once each way with (p-1)/p of the buffer, which is what `loom plan
 * --hosts` counts. */
#include "dist/mpi/pg_mpi.h"

#include <string.h>

/* A step's block goes as RING_CHUNKS messages of 64-512 KB, so the reduction of one chunk
 * overlaps the transfer of the next. Measured, 2 ranks, min of 60 (us): 1 MB (one 512 KB
 * block per step): 512 KB chunks 246-252 against raw MPI_Allreduce 207, 64 KB 138-146, 32 KB
 * 134-142; 4 MB: 512 KB 795-862, 128 KB 437, 256 KB 463 against raw 1067. */
#define RING_CHUNKS 8
#define RING_CHUNK_MIN ((size_t)64 << 10)
#define RING_CHUNK_MAX ((size_t)512 << 10)
/* Across machines each chunk goes in one eager message: at most RING_EAGER bytes, under Open
 * MPI's TCP eager limit (btl_tcp_eager_limit, 64 KiB with its headers). A larger message goes
 * by rendezvous: its sender waits for the receiver's answer before the rest goes, and that
 * answer travels behind the data the peer is sending the other way on the same link. Measured
 * across two capped namespace hosts (2 ranks, 1 Gbit/s, BENCHMARKS.md "HSDP's replica
 * all-reduce in eager chunks"): a 4 MB all-reduce took 66 ms in 256 KB chunks, 35.7 ms (the
 * link's rate) with every chunk eager. Up to RING_MAX_CHUNKS chunks a step; past that (a block
 * over 15.75 MB) the chunks grow past the eager size. */
#define RING_EAGER ((size_t)63 << 10)
#define RING_MAX_CHUNKS 256
#define TAG_RING 78

/* As each chunk of a received block arrives: dst = a op b over that chunk (a and b in order,
 * so that every rank folds the same way). */
typedef struct ring_fold {
  char *dst;
  const char *a, *b;
  loom_dtype dt;
  loom_redop op;
} ring_fold;

/* Send sbytes at sp to the right neighbour and receive rbytes into rp from the left (es: the
 * element size, chunks are whole elements); with f, fold each chunk as it arrives. */
static int ring_xfer(mpi_pg *m, const char *sp, size_t sbytes, char *rp, size_t rbytes,
                     size_t es, const ring_fold *f, const loom__coll *c) {
  int p = m->pg.size, r = m->pg.rank, right = (r + 1) % p, left = (r + p - 1) % p;
  size_t big = sbytes > rbytes ? sbytes : rbytes;
  size_t ch = big / RING_CHUNKS;
  ch = ch < RING_CHUNK_MIN ? RING_CHUNK_MIN : ch > RING_CHUNK_MAX ? RING_CHUNK_MAX : ch;
  if (m->across) ch = RING_EAGER / es * es;
  if (big > ch * RING_MAX_CHUNKS) ch = (big + RING_MAX_CHUNKS - 1) / RING_MAX_CHUNKS;
  ch = (ch + es - 1) / es * es;
  MPI_Request rr[RING_MAX_CHUNKS], sr[RING_MAX_CHUNKS];
  int nr = 0, ns = 0, err = MPI_SUCCESS;
  for (size_t o = 0; o < rbytes && !err; o += ch, nr++) {
    size_t b = rbytes - o < ch ? rbytes - o : ch;
    err = MPI_Irecv(rp + o, (int)b, MPI_BYTE, left, TAG_RING, m->comm, &rr[nr]);
  }
  for (size_t o = 0; o < sbytes && !err; o += ch, ns++) {
    size_t b = sbytes - o < ch ? sbytes - o : ch;
    err = MPI_Isend(sp + o, (int)b, MPI_BYTE, right, TAG_RING, m->comm, &sr[ns]);
  }
  if (err) {
    m->broken = true;
    return loom__mpi_fail(err, loom__coll_name(c->kind), "MPI_Isend/MPI_Irecv");
  }
  int rc;
  for (int i = 0; i < nr; i++) {
    if ((rc = loom__mpi_wait(m, &rr[i], c, left))) return rc;
    if (!f) continue;
    size_t o = (size_t)i * ch, b = rbytes - o < ch ? rbytes - o : ch;
    const void *srcs[2] = {f->a + o, f->b + o};
    loom__reduce(f->dst + o, srcs, 2, b / es, f->dt, f->op);
  }
  for (int i = 0; i < ns; i++)
    if ((rc = loom__mpi_wait(m, &sr[i], c, right))) return rc;
  return LOOM_OK;
}

static void ring_block(size_t n, int p, int j, size_t *off, size_t *len) {
  size_t base = n / (size_t)p, rem = n % (size_t)p;
  *off = (size_t)j * base + ((size_t)j < rem ? (size_t)j : rem);
  *len = base + ((size_t)j < rem);
}

/* Send block sb of buf to the right and receive block rb from the left: into buf (gather), or
 * into tmp and folded into buf (reduce). */
static int ring_step(mpi_pg *m, char *buf, size_t n, loom_dtype dt, loom_redop op, int sb,
                     int rb, bool reduce, char *tmp, const loom__coll *c) {
  size_t es = loom_dtype_size(dt), so, sl, ro, rl;
  ring_block(n, m->pg.size, sb, &so, &sl);
  ring_block(n, m->pg.size, rb, &ro, &rl);
  char *into = buf + ro * es;
  ring_fold f = {into, into, tmp, dt, op};
  return ring_xfer(m, buf + so * es, sl * es, reduce ? tmp : into, rl * es, es,
                   reduce ? &f : NULL, c);
}

/* (Two ranks swapping whole buffers and folding measured slower than the ring at 1-16 MB.) */
int loom__mpi_ring_allreduce(mpi_pg *m, void *buf, size_t n, loom_dtype dt, loom_redop op,
                             const loom__coll *c) {
  int p = m->pg.size, r = m->pg.rank, rc;
  if (op == LOOM_AVG) op = LOOM_SUM; /* the caller divides once at the end */
  size_t off, len;
  ring_block(n, p, 0, &off, &len);
  char *tmp;
  if ((rc = loom__mpi_scratch(m, 1, len * loom_dtype_size(dt), c, (void **)&tmp))) return rc;
  for (int s = 0; s < p - 1; s++)
    if ((rc = ring_step(m, buf, n, dt, op, (r - s + p) % p, (r - s - 1 + 2 * p) % p, true, tmp,
                        c)))
      return rc;
  for (int s = 0; s < p - 1; s++)
    if ((rc = ring_step(m, buf, n, dt, op, (r + 1 - s + p) % p, (r - s + p) % p, false, tmp,
                        c)))
      return rc;
  return LOOM_OK;
}

int loom__mpi_ring_allgather(mpi_pg *m, const loom__coll *c) {
  int p = m->pg.size, r = m->pg.rank, rc;
  size_t es = loom_dtype_size(c->dt), bytes = c->count * es;
  char *buf = c->recv;
  if ((const char *)c->send != buf + (size_t)r * bytes)
    memmove(buf + (size_t)r * bytes, c->send, bytes);
  /* step s passes on block r - s (this rank's own first) and takes block r - s - 1 */
  for (int s = 0; s < p - 1; s++) {
    size_t sb = (size_t)((r - s + p) % p), rb = (size_t)((r - s - 1 + 2 * p) % p);
    if ((rc = ring_xfer(m, buf + sb * bytes, bytes, buf + rb * bytes, bytes, es, NULL, c)))
      return rc;
  }
  return LOOM_OK;
}

/* Step s passes on the partial result of block r - s - 1 (at step 0, this rank's own block)
 * and takes that of block r - s - 2, which it folds with its own block; at the last step
 * (s = p - 2) that block is r, complete. Partials alternate between two scratch pieces: the
 * one going out and the one coming in. */
int loom__mpi_ring_reduce_scatter(mpi_pg *m, const loom__coll *c, size_t piece) {
  int p = m->pg.size, r = m->pg.rank, rc;
  size_t n = c->count, es = loom_dtype_size(c->dt);
  if (!n) return LOOM_OK;
  bool widen = c->dt == LOOM_F16 || c->dt == LOOM_BF16;
  loom_dtype wt = widen ? LOOM_F32 : c->dt;
  size_t ws = loom_dtype_size(wt);
  loom_redop op = c->op == LOOM_AVG ? LOOM_SUM : c->op;
  if (piece > n) piece = n;
  char *scr;
  if ((rc = loom__mpi_scratch(m, 0, (2 + (size_t)widen) * piece * ws, c, (void **)&scr)))
    return rc;
  char *part[2] = {scr, scr + piece * ws}, *own = scr + 2 * piece * ws; /* own: widened */
  const char *send = c->send;
  for (size_t at = 0; at < n; at += piece) {
    size_t len = n - at < piece ? n - at : piece;
    const char *out = send + ((size_t)((r - 1 + p) % p) * n + at) * es;
    if (widen) {
      loom__widen(c->dt, out, (float *)part[0], len);
      out = part[0];
    }
    for (int s = 0; s < p - 1; s++) {
      char *in = part[(s + 1) % 2];
      const char *mine = send + ((size_t)((r - s - 2 + 2 * p) % p) * n + at) * es;
      if (widen) {
        loom__widen(c->dt, mine, (float *)own, len);
        mine = own;
      }
      ring_fold f = {in, mine, in, wt, op};
      if ((rc = ring_xfer(m, out, len * ws, in, len * ws, ws, &f, c))) return rc;
      out = in;
    }
    char *res = part[(p - 1) % 2], *dst = (char *)c->recv + at * es;
    if (c->op == LOOM_AVG) loom__mpi_avg_div(res, wt, len, p);
    if (widen) loom__narrow(c->dt, (const float *)res, dst, len);
    else memcpy(dst, res, len * es);
  }
  return LOOM_OK;
}
