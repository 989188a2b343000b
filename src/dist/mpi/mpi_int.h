/* mpi_int.h: what the mpi backend's files share (src/dist/mpi/ only; no mpi.h types). */
#ifndef LOOM_DIST_MPI_INT_H
#define LOOM_DIST_MPI_INT_H

#include <stdbool.h>

/* Whether this process's MPI moves large shared-memory messages with a single copy (Open MPI's
 * vader/sm single_copy_mechanism, e.g. CMA, XPMEM, KNEM) rather than through its shared
 * bounce buffers. LOOM_MPI_SINGLE_COPY=0|1 decides if set; else, under Open MPI, the MPI_T
 * control variable btl_vader_single_copy_mechanism (btl_sm_... in Open MPI 5) read after
 * MPI_Init, else the environment variable OMPI_MCA_btl_vader_single_copy_mechanism; else true
 * (assumed; always so under MPICH, whose MPI_T is not touched: see mpi_copy.c). Call
 * after MPI is initialised; not a collective (callers agree on the answer across ranks).
 * Thread-safe (MPI_T is initialised and finalised around the query). (mpi_copy.c) */
bool loom__mpi_single_copy(void);

#endif
