# cmake/loom_mpiexec.cmake: how loom's tests and benchmarks launch MPI programs, chosen once by
# the launcher CMake found (MPIEXEC_EXECUTABLE: Open MPI's or MPICH's, whichever belongs to the
# mpicc found; see README.md "Building against MPICH"). Included from the top-level
# CMakeLists.txt after find_package(MPI). Sets:
#   LOOM_MPIEXEC_IMPL   "openmpi", "mpich" or "other" (from `mpiexec --version`)
#   LOOM_MPIEXEC_FLAGS  flags after `-n N`: Open MPI needs --oversubscribe (2-core CI machines
#                       run 3 ranks) and --allow-run-as-root as root; MPICH's hydra needs none
#   LOOM_MPIEXEC_ENV    ctest ENVIRONMENT entries: Open MPI over shared memory and self only
#                       (no network probing in containers), without CMA single-copy (ptrace may
#                       be refused in containers); none for MPICH (UCX picks its transports)
# and defines loom_mpiexec_definitions(target): the launcher's path, flags and kind as
# LOOM_MPIEXEC, LOOM_MPIEXEC_FLAGS and LOOM_MPIEXEC_OPENMPI (0/1), for programs that launch
# themselves under mpiexec (bench/bench_allreduce.c).
set(LOOM_MPIEXEC_IMPL other)
set(LOOM_MPIEXEC_FLAGS ${MPIEXEC_PREFLAGS})
set(LOOM_MPIEXEC_ENV "")
if(MPIEXEC_EXECUTABLE)
  execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE mpiexec_version
                  ERROR_VARIABLE mpiexec_version_err)
  string(APPEND mpiexec_version "${mpiexec_version_err}")
  if(mpiexec_version MATCHES "Open MPI|OpenRTE")
    set(LOOM_MPIEXEC_IMPL openmpi)
  elseif(mpiexec_version MATCHES "HYDRA")
    set(LOOM_MPIEXEC_IMPL mpich)
  endif()
endif()
if(LOOM_MPIEXEC_IMPL STREQUAL "openmpi")
  list(APPEND LOOM_MPIEXEC_FLAGS --oversubscribe)
  execute_process(COMMAND id -u OUTPUT_VARIABLE uid OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(uid STREQUAL "0")
    list(APPEND LOOM_MPIEXEC_FLAGS --allow-run-as-root)
  endif()
  set(LOOM_MPIEXEC_ENV "OMPI_MCA_btl=self,vader;OMPI_MCA_btl_vader_single_copy_mechanism=none;OMPI_MCA_rmaps_base_oversubscribe=1")
endif()
if(MPI_C_FOUND)
  string(REPLACE ";" " " shown "${LOOM_MPIEXEC_FLAGS}")
  message(STATUS "loom: MPI programs run as: ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} N ${shown} (${LOOM_MPIEXEC_IMPL})")
endif()

function(loom_mpiexec_definitions target)
  string(REPLACE ";" " " flags "${LOOM_MPIEXEC_FLAGS}")
  if(LOOM_MPIEXEC_IMPL STREQUAL "openmpi")
    set(openmpi 1)
  else()
    set(openmpi 0)
  endif()
  target_compile_definitions(${target} PRIVATE LOOM_MPIEXEC="${MPIEXEC_EXECUTABLE}"
    LOOM_MPIEXEC_NP="${MPIEXEC_NUMPROC_FLAG}" LOOM_MPIEXEC_FLAGS="${flags}"
    LOOM_MPIEXEC_OPENMPI=${openmpi})
endfunction()
