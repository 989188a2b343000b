/* mpi_stub.c: loom_mpi_pg_create, loom_mpi_finalize and loom_mpi_abort in a build without
 * MPI (the real ones are in src/dist/mpi/, compiled only when CMake finds MPI). */
#include "dist/dist_int.h"
#include "loom/dist_mpi.h"

#ifndef LOOM_HAVE_MPI
int loom_mpi_pg_create(void *mpi_comm, const loom_pg_cfg *cfg, loom_pg **out) {
  if (out) *out = NULL;
  return loom__fail(LOOM_ENOSYS, "loom_mpi_pg_create: loom was built without MPI");
}

int loom_mpi_finalize(void) { return LOOM_OK; }

int loom_mpi_finalize_within(double seconds, int exit_status) {
  (void)exit_status;
  if (!(seconds > 0 && seconds <= 1e6))
    return loom__fail(LOOM_EINVAL, "loom_mpi_finalize_within: seconds must be in (0, 1e6], got %g",
                      seconds);
  return LOOM_OK;
}

int loom_mpi_abort(int errorcode) {
  (void)errorcode;
  return loom__fail(LOOM_ENOSYS, "loom_mpi_abort: loom was built without MPI");
}
#endif
