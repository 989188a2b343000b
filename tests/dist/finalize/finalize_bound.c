/* finalize_bound.c: loom_mpi_finalize_within under mpiexec with 2 ranks
 * (tests/dist/CMakeLists.txt). Its argument is checked (a bound not in (0, 1e6] is refused
 * with LOOM_EINVAL and a message). Then rank 1 holds back from MPI_Finalize for 20 s while
 * rank 0 gives it 1.5 s: MPI_Finalize waits for every rank (Open MPI's and MPICH's both end
 * with a barrier of the launcher), so rank 0's bound must end it, saying so on stderr, with
 * exit status 7, long before rank 1 arrives; the launcher then ends the job. The test's
 * command checks the line and the time. */
#include "loom/dist.h"
#include "loom/dist_mpi.h"
#include "loom/status.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(void) {
  if (loom_mpi_finalize_within(0, 0) != LOOM_EINVAL || loom_mpi_finalize_within(NAN, 0) !=
      LOOM_EINVAL || !strstr(loom_last_error(), "seconds")) {
    printf("FAIL: a bound not in (0, 1e6] was not refused\n");
    return 1;
  }
  loom_pg *pg = NULL;
  if (loom_mpi_pg_create(NULL, NULL, &pg)) {
    printf("FAIL: loom_mpi_pg_create: %s\n", loom_last_error());
    return 1;
  }
  int rank = loom_pg_rank(pg);
  if (loom_pg_barrier(pg, NULL)) {
    printf("FAIL: barrier: %s\n", loom_last_error());
    return 1;
  }
  loom_pg_free(pg);
  if (rank == 1) sleep(20);
  fflush(stdout);
  loom_mpi_finalize_within(1.5, 7);
  printf("rank %d: MPI_Finalize returned\n", rank);
  return 0;
}
