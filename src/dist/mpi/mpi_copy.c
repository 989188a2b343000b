/* mpi_copy.c: detects whether MPI's shared-memory transport copies large messages once
 * (Open MPI's vader/sm single_copy_mechanism: CMA, XPMEM, KNEM) or through its bounce buffers
 * ("none"); large all-reduces pick MPI_Allreduce or loom's ring by it (see pg_mpi.c). Under
 * MPICH (4.0, ch4:ucx) it is assumed on: UCX moves intra-node messages with CMA, and
 * MPI_Allreduce ran within 2-8% of raw at 1-64 MB there while the ring ran 10-28% behind at
 * 1 MB (BENCHMARKS.md, "mpi backend on MPICH 4.0"). Without single copy, MPI_Allreduce still
 * below 4 MB on one machine (loom__mpi_blocking_allreduce). */
#include "dist/mpi/mpi_int.h"

#include <mpi.h>
#include <stdlib.h>
#include <string.h>

/* 1 single copy, 0 none, -1 unknown: from a mechanism's name. */
static int of_name(const char *s) {
  if (!s || !*s) return -1;
  return strcmp(s, "none") == 0 || strcmp(s, "0") == 0 ? 0 : 1;
}

#ifdef OPEN_MPI
/* The MPI_T control variable, by name and enumeration item; -1 if absent or unreadable.
 * Open MPI only: under MPICH (4.0 .. 5.0) MPI_T_finalize frees the control variables MPI
 * itself still uses (the next MPI_T_init_thread's MPI_T_cvar_get_num, or a later intra-node
 * collective, then crashes), and MPICH has no such variable to read anyway. */
static int from_mpit(void) {
  int provided, num = 0, found = -1;
  if (MPI_T_init_thread(MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) return -1;
  if (MPI_T_cvar_get_num(&num) != MPI_SUCCESS) num = 0;
  for (int i = 0; i < num && found < 0; i++) {
    char name[256], desc[8];
    int nlen = (int)sizeof name, dlen = (int)sizeof desc, verb, bind, scope;
    MPI_Datatype dt;
    MPI_T_enum en;
    if (MPI_T_cvar_get_info(i, name, &nlen, &verb, &dt, &en, desc, &dlen, &bind, &scope) !=
        MPI_SUCCESS)
      continue;
    if (strcmp(name, "btl_vader_single_copy_mechanism") != 0 &&
        strcmp(name, "btl_sm_single_copy_mechanism") != 0)
      continue;
    if (dt != MPI_INT || en == MPI_T_ENUM_NULL) break;
    MPI_T_cvar_handle h;
    int count = 0, v = 0, items = 0;
    if (MPI_T_cvar_handle_alloc(i, NULL, &h, &count) != MPI_SUCCESS) break;
    int rc = count == 1 ? MPI_T_cvar_read(h, &v) : MPI_ERR_OTHER;
    MPI_T_cvar_handle_free(&h);
    if (rc != MPI_SUCCESS) break;
    char ename[64];
    int elen = (int)sizeof ename;
    if (MPI_T_enum_get_info(en, &items, ename, &elen) != MPI_SUCCESS) break;
    for (int j = 0; j < items; j++) {
      char item[64];
      int value, ilen = (int)sizeof item;
      if (MPI_T_enum_get_item(en, j, &value, item, &ilen) == MPI_SUCCESS && value == v) {
        found = of_name(item);
        break;
      }
    }
  }
  MPI_T_finalize();
  return found;
}
#endif

bool loom__mpi_single_copy(void) {
  int r = of_name(getenv("LOOM_MPI_SINGLE_COPY"));
#ifdef OPEN_MPI
  if (r < 0) r = from_mpit();
  if (r < 0) r = of_name(getenv("OMPI_MCA_btl_vader_single_copy_mechanism"));
#endif
  return r != 0;
}

bool loom__mpi_blocking_allreduce(bool single_copy, bool across, size_t bytes) {
  return single_copy || (!across && bytes < LOOM__MPI_NOCOPY_RING_MIN);
}
