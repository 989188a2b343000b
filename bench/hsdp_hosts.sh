#!/usr/bin/env bash
# hsdp_hosts.sh: HSDP against FSDP across two "hosts" (network namespaces, Open MPI over TCP)
# with each host's link capped by tc's tbf (the kernel here has no netem): 2 hosts x 2 ranks,
# a shard group per host for HSDP, runs alternating, medians printed. Needs root. The
# namespace recipe is tests/tools/hosts.sh's (its bench-hsdp case).
# Usage: bench/hsdp_hosts.sh [BUILD_DIR]   (env: LINK=1gbit REPS=3 HIDDEN=1024,1024 LIMIT=1024 BATCH=8
#        VARIANTS="fsdp-mpi fsdp hsdp" (also hsdp-mpi, hsdp-rings)
#        RAW_MB=128)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
exec bash "$here/../tests/tools/hosts.sh" "$build/tools/loom" "$(command -v mpiexec)" bench-hsdp
