# cmake/loom_mpiexec.cmake: how loom's tests and benchmarks launch MPI programs, chosen once by
# the launcher CMake found (MPIEXEC_EXECUTABLE: Open MPI's or MPICH's, whichever belongs to the
# mpicc found; see README.md, "Open MPI or MPICH"). Included from the top-level
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
# The kind of launcher `exe` is, from its --version: openmpi, mpich or other, into `out`.
function(loom_mpiexec_kind exe out)
  set(kind other)
  if(exe)
    execute_process(COMMAND ${exe} --version OUTPUT_VARIABLE version ERROR_VARIABLE version_err)
    string(APPEND version "${version_err}")
    if(version MATCHES "Open MPI|OpenRTE")
      set(kind openmpi)
    elseif(version MATCHES "HYDRA")
      set(kind mpich)
    endif()
  endif()
  set(${out} ${kind} PARENT_SCOPE)
endfunction()

set(LOOM_MPIEXEC_FLAGS ${MPIEXEC_PREFLAGS})
set(LOOM_MPIEXEC_ENV "")
loom_mpiexec_kind("${MPIEXEC_EXECUTABLE}" LOOM_MPIEXEC_IMPL)
# The launcher must be the library's: an MPICH program started by Open MPI's mpirun (or the
# reverse) runs as N singletons of one rank each, and every MPI test would fail or test nothing.
# CMake's FindMPI takes the first `mpiexec` on the path (Debian's alternative, Open MPI) even
# for -DMPI_C_COMPILER=/usr/bin/mpicc.mpich: then the launcher next to that compiler with the
# same suffix (mpiexec.mpich) is taken instead, and with none, configuring stops naming the fix.
if(MPI_C_FOUND)
  set(library other)
  if(MPI_C_LIB_NAMES MATCHES "mpich" OR MPI_C_LIBRARIES MATCHES "libmpich")
    set(library mpich)
  elseif(MPI_C_LIBRARIES MATCHES "openmpi|libmpi\\.so|libmpi\\.dylib")
    set(library openmpi)
  endif()
  if(NOT library STREQUAL "other" AND NOT LOOM_MPIEXEC_IMPL STREQUAL library)
    get_filename_component(cc_dir "${MPI_C_COMPILER}" DIRECTORY)
    get_filename_component(cc_name "${MPI_C_COMPILER}" NAME)
    set(sibling "")
    if(cc_name MATCHES "^mpicc(\\..+)$")
      set(sibling "${cc_dir}/mpiexec${CMAKE_MATCH_1}")
    endif()
    set(sibling_kind other)
    if(sibling AND EXISTS "${sibling}")
      loom_mpiexec_kind("${sibling}" sibling_kind)
    endif()
    if(sibling_kind STREQUAL library)
      message(STATUS "loom: ${MPIEXEC_EXECUTABLE} launches ${LOOM_MPIEXEC_IMPL} programs, not "
              "this ${library} library's: taking ${sibling}")
      set(MPIEXEC_EXECUTABLE "${sibling}" CACHE FILEPATH "Executable for running MPI programs." FORCE)
      set(LOOM_MPIEXEC_IMPL ${library})
    else()
      message(FATAL_ERROR "loom: the MPI library is ${library}'s (${MPI_C_LIBRARIES}) but the "
              "launcher ${MPIEXEC_EXECUTABLE} is ${LOOM_MPIEXEC_IMPL}'s: give the matching one "
              "with -DMPIEXEC_EXECUTABLE=... (for MPICH on Debian: /usr/bin/mpiexec.mpich)")
    endif()
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
