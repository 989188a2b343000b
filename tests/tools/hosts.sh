#!/usr/bin/env bash
# hosts.sh: `loom train --backend mpi` across two "hosts" on one machine: two network
# namespaces, each with one veth into a bridge of the root namespace, addresses only inside the
# namespaces (198.18.N.1 and .2, a /24 of the benchmarking range 198.18.0.0/15), and Open MPI
# started in the first with a hostfile naming both, reaching the second through a launcher agent
# that runs `ip netns exec HOST ...` (no ssh), MPI over TCP on that subnet only. Each case is
# bounded in time and every namespace and link the harness made is removed on exit, also on
# failure. Without root, `ip`, Open MPI or network namespaces it prints why and exits 77 (ctest's
# skip).
#   ddp | fsdp   2 hosts x 2 ranks, DDP (f32) or FSDP (bf16 forward) with --save: the model file
#                equals, byte for byte, the same 4 MPI ranks on one host (over shared memory;
#                Open MPI's all-reduce adds 4 ranks' gradients in its own order, so 4 thread
#                ranks, which add in rank order, round differently), and one rank per host
#                equals 2 thread ranks of one process (a sum of two is the same either way)
# Usage: hosts.sh LOOM MPIEXEC CASE
set -u
loom=$1 mpiexec=$2 case=$3
skip() {
  echo "SKIP: $*"
  exit 77
}
[ "$(id -u)" = 0 ] || skip "network namespaces need root"
command -v ip >/dev/null || skip "no 'ip' command (iproute2)"
"$mpiexec" --version 2>/dev/null | grep -qE "Open MPI|OpenRTE" || skip "$mpiexec is not Open MPI's"

dir=$(mktemp -d)
tag=$$                      # names unique to this run: several cases may run at once
net=$((tag % 250 + 2))      # 198.18.$net.0/24
subnet=198.18.$net.0/24
bridge=lmb$tag
hosts=(lm${tag}a lm${tag}b)
cleanup() {
  for h in "${hosts[@]}"; do
    ip netns pids "$h" 2>/dev/null | xargs -r kill -9 2>/dev/null # what a timeout left running
    ip netns del "$h" 2>/dev/null                                 # takes its veth end along
  done
  ip link del "$bridge" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  echo "--- stdout"; cat "$dir/out" 2>/dev/null
  echo "--- stderr"; cat "$dir/err" 2>/dev/null
  exit 1
}

ip link add "$bridge" type bridge 2>"$dir/err" || skip "cannot make a bridge: $(cat "$dir/err")"
ip link set "$bridge" up
i=1
for h in "${hosts[@]}"; do
  ip netns add "$h" 2>"$dir/err" || skip "cannot make a network namespace: $(cat "$dir/err")"
  ip link add "lmv$tag$i" type veth peer name eth0 netns "$h" || fail "veth for $h"
  ip link set "lmv$tag$i" master "$bridge" up
  ip -n "$h" addr add "198.18.$net.$i/24" dev eth0
  ip -n "$h" link set eth0 up
  ip -n "$h" link set lo up
  i=$((i + 1))
done

printf '#!/bin/sh\nhost=$1; shift\nexec ip netns exec "$host" sh -c "$*"\n' >"$dir/agent"
chmod +x "$dir/agent"
printf '%s slots=2\n' "${hosts[@]}" >"$dir/hostfile"
# Open MPI as root, both hosts through the agent, out-of-band and data over the subnet alone
mpirun_hosts() {
  local n=$1
  shift
  timeout -k 5 "${limit:-240}" ip netns exec "${hosts[0]}" "$mpiexec" --allow-run-as-root --oversubscribe -n "$n" \
    --hostfile "$dir/hostfile" --mca plm_rsh_agent "$dir/agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include "$subnet" --mca btl self,tcp --mca btl_tcp_if_include "$subnet" \
    "$@"
}

# The ranks really are on two hosts: each prints the address of its namespace's eth0. (Three
# tries of 30 s: a first launch right after the links come up has been seen to hang.)
for try in 1 2 3; do
  limit=30 mpirun_hosts 4 sh -c 'ip -br -4 addr show eth0' >"$dir/out" 2>"$dir/err" && break
  [ $try = 3 ] && fail "mpirun across the namespaces (3 tries of 30 s)"
  for h in "${hosts[@]}"; do ip netns pids "$h" | xargs -r kill -9 2>/dev/null; done
done
for i in 1 2; do
  [ "$(grep -o "198.18.$net.$i/" "$dir/out" | wc -l)" = 2 ] || fail "two ranks expected on host $i"
done

# Run one training (the command after the step's name) with a time limit of 120 s. A run that
# times out fails the case, after a listing of what was running then; one that timed out before
# any loom process had started (Open MPI's launch itself hung, seen once in many runs on a loaded
# machine) is tried once more.
train_bounded() {
  local what=$1 try
  shift
  for try in 1 2; do
    # the watchdog holds none of this script's output: ctest waits for whatever does
    (exec sleep 110) >/dev/null 2>&1 &
    local watch=$!
    limit=120 "$@" >"$dir/out" 2>"$dir/err" &
    local run=$!
    while kill -0 "$run" 2>/dev/null && kill -0 "$watch" 2>/dev/null; do sleep 0.2; done
    kill -0 "$run" 2>/dev/null && ps -eo pid,stat,etimes,args >"$dir/ps" # the listing at 110 s
    wait "$run"
    local rc=$?
    kill "$watch" 2>/dev/null
    wait "$watch" 2>/dev/null
    [ $rc = 0 ] && return 0
    if [ $rc = 124 ] || [ $rc = 137 ]; then
      echo "$what: timed out (try $try); processes then:"
      grep -E "loom|mpirun|orted" "$dir/ps" | grep -v grep
      for h in "${hosts[@]}"; do ip netns pids "$h" | xargs -r kill -9 2>/dev/null; done
      [ $try = 1 ] && ! grep -q "$loom train" "$dir/ps" && continue
    fi
    fail "$what failed (exit $rc)"
  done
}

case $case in
ddp | fsdp)
  run="train --strategy $case --hidden 32,16 --threads 1 --limit 1024 --batch 32 --epochs 1 --quiet"
  [ "$case" = fsdp ] && run="$run --amp bf16"
  # shellcheck disable=SC2086
  train_bounded "the run on 4 MPI ranks of one host" timeout -k 5 120 "$mpiexec" \
    --allow-run-as-root --oversubscribe -n 4 --mca btl self,vader \
    "$loom" $run --backend mpi --save "$dir/one4"
  # shellcheck disable=SC2086
  train_bounded "the run on 2 hosts x 2 ranks" mpirun_hosts 4 "$loom" $run --backend mpi \
    --save "$dir/two4"
  cmp -s "$dir/one4/model.safetensors" "$dir/two4/model.safetensors" ||
    fail "the model trained on 2 hosts x 2 ranks differs from the one-host run's"
  # shellcheck disable=SC2086
  train_bounded "the run on 2 thread ranks" timeout -k 5 120 "$loom" $run --ranks 2 \
    --save "$dir/one2"
  # shellcheck disable=SC2086
  train_bounded "the run on 2 hosts x 1 rank" mpirun_hosts 2 --map-by node "$loom" $run \
    --backend mpi --save "$dir/two2"
  cmp -s "$dir/one2/model.safetensors" "$dir/two2/model.safetensors" ||
    fail "the model trained on 2 hosts x 1 rank differs from 2 thread ranks'"
  ;;
link-down)
  # one rank per host, a run long enough to be cut: the second host's link goes down mid-run
  run="train --strategy ddp --hidden 256 --threads 1 --epochs 50 --batch 32 --limit 4096 --timeout 10"
  # shellcheck disable=SC2086
  limit=120 mpirun_hosts 2 --map-by node "$loom" $run --backend mpi --save "$dir/ck" \
    >"$dir/out" 2>"$dir/err" &
  job=$!
  for _ in $(seq 1 200); do # until the first checkpoint is written
    [ -f "$dir/ck/checkpoint.safetensors" ] && break
    sleep 0.1
  done
  [ -f "$dir/ck/checkpoint.safetensors" ] || fail "no checkpoint before the link went down"
  ip link set "lmv${tag}2" down
  t0=$(date +%s)
  wait $job
  rc=$? took=$(($(date +%s) - t0))
  echo "exit $rc after $took s"
  cat "$dir/err" | grep -v '^\[' | head -20
  ;;
*)
  fail "unknown case '$case'"
  ;;
esac
echo "ok: $case across 2 hosts x 2 ranks"
