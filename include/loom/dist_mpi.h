/* loom/dist_mpi.h: the mpi backend of loom_pg (see loom/dist.h): one group per MPI
 * communicator, each rank an MPI process (mpirun -n N). Built only when CMake finds MPI
 * (LOOM_HAVE_MPI is then defined); without it loom_mpi_pg_create returns LOOM_ENOSYS.
 *
 * Threading: loom needs MPI_THREAD_MULTIPLE (collectives run on the issuing thread or on the
 * group's progress thread, and loom_pg_async_error may poll from any thread). If MPI is not
 * initialised, loom_mpi_pg_create initialises it with MPI_Init_thread(MPI_THREAD_MULTIPLE) and
 * loom_mpi_finalize() finalises it; if the program initialised MPI itself at a lower level,
 * create fails with LOOM_EBACKEND naming the level.
 *
 * Collectives map to MPI's non-blocking calls (MPI_Iallreduce, MPI_Ibcast, MPI_Iallgather,
 * MPI_Ireduce_scatter_block) on a private duplicate of the communicator, polled
 * with MPI_Test so every wait has the group's timeout; loom never blocks inside MPI, so a
 * stalled or dead peer cannot hang a rank, with one exception below. All-reduces of 256 KB
 * and more take one of two paths, chosen at group creation by the transport:
 *  - Without a single-copy transport (Open MPI's shared memory through bounce buffers), from
 *    4 MB up or across machines: a ring
 *    reduce-scatter + all-gather of MPI_Isend/MPI_Irecv, each step's block cut into about 8
 *    chunks of 64-512 KB so that the reduction of one chunk overlaps the transfer of the next
 *    (in a group across machines, chunks of at most 63 KiB: each one eager message under Open
 *    MPI's TCP eager limit, so no rendezvous answer waits behind the peer's data on the link).
 *    It runs level with or ahead of MPI_Allreduce from 4 MB up (Open MPI's MPI_Iallreduce,
 *    libnbc, ran 1.5-2x behind its blocking MPI_Allreduce on large buffers); below 4 MB on
 *    one machine it ran 5-26% behind, so there the path below is taken as with single copy.
 *  - With a single-copy transport (Open MPI's default CMA; read at group creation through the
 *    MPI_T control variable btl_vader_single_copy_mechanism, else
 *    OMPI_MCA_btl_vader_single_copy_mechanism, assumed on when unknown and under MPICH, whose
 *    UCX uses CMA; LOOM_MPI_SINGLE_COPY=0|1 overrides; all ranks must have it, and all
 *    must be on one node (MPI_COMM_TYPE_SHARED: across machines the bytes go over a network,
 *    where a blocking call never returns once a link is down, so the ring it is)): MPI's own
 *    blocking MPI_Allreduce, run on the group's thread. The ring ran 13-35% behind it at
 *    1-16 MB there (10-28% at 1 MB under MPICH); this path is within 3% (see BENCHMARKS.md).
 *    The exception: this call blocks inside MPI. It is entered only after the
 *    header exchange (below) has shown every rank inside the same collective, so a rank that
 *    stops calling collectives still gives LOOM_ETIMEDOUT; a peer process that dies inside the
 *    call is handled by the MPI launcher (Open MPI's mpirun and MPICH's hydra end the job), not
 *    by loom's timeout. LOOM_MPI_RINGS=1 keeps every wait under the timeout.
 * All-gathers and reduce-scatters of 256 KB and more (the whole buffer) in a group that spans
 * machines (some rank's MPI_COMM_TYPE_SHARED peers are not all of the group) are loom's own
 * rings too, of the same chunked steps in rank order, every wait under the timeout: Open MPI
 * 4.1's MPI_Iallgather sends each block to every rank and its MPI_Ireduce_scatter_block
 * reduces the whole buffer to rank 0 first, so across 2 machines x 2 ranks a machine's link
 * carried 1.36x a ring's bytes (BENCHMARKS.md, "Rings across hosts"). A ring reduce-scatter
 * goes in pieces of 2^20 elements of all the blocks together (16K per block at least), with
 * f16/bf16 carried in f32, so its scratch is 2-3 such pieces. LOOM_MPI_RINGS=1 takes these
 * rings on one machine too, LOOM_MPI_RINGS=0 never (every rank must agree; a rank that says
 * 1 or spans machines makes it rings for all).
 * Before each collective the ranks exchange a small header (kind, count, dtype, op, root: a
 * 40-byte point-to-point message to each peer up to 8 ranks, about 1 us; one MPI_Iallgather
 * above) so that disagreeing ranks get LOOM_EMISUSE/ESHAPE/EDTYPE naming both calls (the
 * barrier is that exchange alone). An all-reduce of at most 256 bytes on up to 8 ranks
 * carries its data in that header message and each rank reduces every rank's data in rank
 * order (all ranks get the same bits; one round trip in all, within 2x of MPI_Allreduce at 4
 * bytes in BENCHMARKS.md). A failing rank (an error, loom_pg_abort) sends its message
 * to every peer on a second private communicator; peers fail with LOOM_EREMOTE naming it. A
 * peer that dies or stops calling gives LOOM_ETIMEDOUT, naming the rank when the wait is on
 * one peer's message (the point-to-point header exchange, a ring step); inside MPI's own
 * collectives MPI cannot say which rank is missing ("waiting for its peers"; of two ranks,
 * the other one). Waits poll with MPI_Test, spinning for 0.5 ms, then sleeping between polls
 * (a sixteenth of the time waited, up to 1 ms), so neither a stalled peer nor an async wait
 * costs a core. With LOOM_WAIT_YIELD=1, a caller blocked in a collective or loom_work_wait
 * polls on with sched_yield until 0.1 s first, as MPI's own blocking calls poll: a small
 * all-reduce's median stays near MPI's on loaded cores where every rank has a core of its own,
 * but where ranks share cores the yielding ranks take their peers' (HSDP, 4 ranks on 2 cores:
 * 0.6x the samples/s), so it is off by default (see loom/dist.h for the stderr notice of a long wait).
 * Only standard MPI-3 calls are used; tested with Open MPI 4.1 and MPICH 4.0 (README.md). MPI_T
 * is read under Open MPI only (MPICH 4.0's MPI_T_finalize frees control variables it still
 * uses).
 *
 * f16/bf16 reductions keep f32 accumulation by convert-reduce: the buffer is widened to f32
 * (loom_cvt_*), reduced in f32 (by MPI's own MPI_SUM/MIN/MAX/PROD on MPI_FLOAT, or by loom's
 * f32 kernels in the ring), and rounded once back to 16 bits (AVG divides the f32 sum
 * first). This costs twice the wire bytes of a 16-bit reduction and keeps MPI's tuned
 * reduction algorithms; a user-defined MPI op on 16-bit data would round at every combining
 * step instead.
 *
 * Limits: counts above INT_MAX elements give LOOM_EOVERFLOW. After a timeout the collective's
 * MPI request is still active (MPI cannot cancel collectives): the group is broken, its
 * buffers may still be written by MPI, and the process should end (loom_pg_free then leaks
 * the private communicators rather than risk a hang). The notice communicator of a group is
 * never freed (a notice still in flight must not reach a later group to which MPI gave the
 * same communicator id): one communicator per group created. */
#ifndef LOOM_DIST_MPI_H
#define LOOM_DIST_MPI_H

#include "loom/dist.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A group over the MPI communicator *(MPI_Comm *)mpi_comm (NULL: MPI_COMM_WORLD); collective
 * over it (every rank of the communicator must call it). The communicator is duplicated, so
 * the caller keeps using and freeing its own. cfg NULL means the defaults; cfg.cores is divided
 * among the ranks on the same machine. Errors: LOOM_EINVAL (out NULL, bad cfg), LOOM_ENOMEM,
 * LOOM_EBACKEND (an MPI call failed, or the thread level is too low), LOOM_ENOSYS (built
 * without MPI). On failure *out is NULL. Free with loom_pg_free. */
int loom_mpi_pg_create(void *mpi_comm, const loom_pg_cfg *cfg, loom_pg **out);

/* Finalise MPI if loom_mpi_pg_create initialised it (a no-op otherwise). Call after freeing
 * every group. MPI_Finalize gets `seconds`: if it has not returned by then, the process
 * writes a line saying so to stderr and ends with _exit(exit_status & 0xff), since nothing
 * after it could run anyway. MPICH 4.0.2 with UCX 1.13 over TCP has been seen to hang there
 * in about one launch in three of 4 ranks across two hosts, in any program that communicated
 * (one rank closing its UCX endpoints, waiting for peers that had gone on into the launcher's
 * final barrier); Open MPI returns at once. Give the status the program would exit with.
 * SIGPIPE is ignored while MPI_Finalize runs (a peer that ended on its bound has closed its
 * sockets, and a write to them would otherwise end this rank by the signal), then restored.
 * The launcher may still report the job failed: MPICH's hydra exits 255 ("error writing PMI
 * line") when a rank ends this way while another is in, or later enters, its final barrier;
 * every rank's work was done by then.
 * LOOM_EINVAL if seconds is not in (0, 1e6]. loom_mpi_finalize() is
 * loom_mpi_finalize_within(LOOM_MPI_FINALIZE_S, 1). */
#define LOOM_MPI_FINALIZE_S 10.0
int loom_mpi_finalize_within(double seconds, int exit_status);
int loom_mpi_finalize(void);

/* End every process of the job: MPI_Abort(MPI_COMM_WORLD, errorcode), for a rank that failed
 * and has said why. Its peers are failed by loom_pg_abort if they wait in a loom collective,
 * but a peer elsewhere (computing, in MPI_Finalize, inside a blocking MPI call) would wait
 * for the failed rank forever. Flushes stdout and stderr first. Does not return when MPI is
 * initialised (the launcher ends the job, typically with exit status errorcode; if MPI_Abort
 * has not ended this process within 5 s, as with the launcher on a machine now unreachable,
 * it writes a line to stderr and _exit(errorcode & 0xff, or 1)); returns
 * LOOM_EMISUSE if MPI is not initialised (or already finalised), LOOM_ENOSYS without MPI. */
int loom_mpi_abort(int errorcode);

#ifdef __cplusplus
}
#endif
#endif
