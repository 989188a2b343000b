/* mpi_int.h: what the mpi backend's files share (src/dist/mpi/ only; no mpi.h types). */
#ifndef LOOM_DIST_MPI_INT_H
#define LOOM_DIST_MPI_INT_H

#include <stdbool.h>
#include <stddef.h>

/* Whether this process's MPI moves large shared-memory messages with a single copy (Open MPI's
 * vader/sm single_copy_mechanism, e.g. CMA, XPMEM, KNEM) rather than through its shared
 * bounce buffers. LOOM_MPI_SINGLE_COPY=0|1 decides if set; else, under Open MPI, the MPI_T
 * control variable btl_vader_single_copy_mechanism (btl_sm_... in Open MPI 5) read after
 * MPI_Init, else the environment variable OMPI_MCA_btl_vader_single_copy_mechanism; else true
 * (assumed; always so under MPICH, whose MPI_T is not touched: see mpi_copy.c). Call
 * after MPI is initialised; not a collective (callers agree on the answer across ranks).
 * Thread-safe (MPI_T is initialised and finalised around the query). (mpi_copy.c) */
bool loom__mpi_single_copy(void);

/* Below this many bytes, a large all-reduce of a group on one machine goes through MPI's own
 * blocking MPI_Allreduce even without single copy (BENCHMARKS.md, "mpi backend: a blocked
 * caller polls as MPI does": at 1 MB the ring ran 1.05-1.26x raw, MPI's own 0.86-1.42x,
 * medians 1.15 and 1.00). */
#define LOOM__MPI_NOCOPY_RING_MIN ((size_t)4 << 20)

/* Whether a large all-reduce of `bytes` (what goes on the wire: f32 for f16/bf16) takes MPI's
 * blocking MPI_Allreduce (true) or loom's ring (false): MPI's with single copy on every rank,
 * or on one machine (`across` false) below LOOM__MPI_NOCOPY_RING_MIN; the ring across machines
 * (every wait under the timeout) and for larger buffers without single copy. Pure, so every
 * rank given the same arguments picks the same. (mpi_copy.c) */
bool loom__mpi_blocking_allreduce(bool single_copy, bool across, size_t bytes);

#endif
