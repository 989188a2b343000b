#!/usr/bin/env bash
# hosts.sh: `loom train --backend mpi` across two "hosts" on one machine: two network
# namespaces, each with one veth into a bridge of the root namespace, addresses only inside the
# namespaces (198.18.N.1 and .2, a /24 of the benchmarking range 198.18.0.0/15), and Open MPI
# started in the first with a hostfile naming both, reaching the second through a launcher agent
# that runs `ip netns exec HOST ...` (no ssh), MPI over TCP on that subnet only. Each case is
# bounded in time and every namespace and link the harness made is removed on exit, also on
# failure. Without root, `ip`, Open MPI or network namespaces it prints why and exits 77 (ctest's
# skip).
#   ddp | fsdp   2 hosts x 2 ranks, DDP (f32) or FSDP (bf16 forward) with --save (and more than
#                300 KB through the link): the model file
#                equals, byte for byte, the same 4 MPI ranks on one host (over shared memory;
#                Open MPI's all-reduce adds 4 ranks' gradients in its own order, so 4 thread
#                ranks, which add in rank order, round differently), and one rank per host
#                equals 2 thread ranks of one process (a sum of two is the same either way)
#   hsdp         the same with HSDP: --shard-size 2 on 4 ranks (a shard group per host,
#                Open MPI placing ranks 0-1 on the first host and 2-3 on the second, the
#                gradient shards all-reduced across the hosts), and --shard-size 1 on 2 ranks
#                (one copy per host: replicas only)
#   link-down    1 rank per host, DDP: the second host's link set down mid-step; every rank
#                fails naming the other within --timeout, the job ends, and the last
#                checkpoint resumes on the first host alone (see the case)
#   link-down-fsdp  the same with FSDP (the sharded checkpoint resharded for 1 rank)
#   link-down-hsdp  the same with HSDP on 2 hosts x 2 ranks (--shard-size 2: a shard group per
#                host): every rank of both hosts fails naming its replica on the other host by
#                its rank in the run, and the checkpoint resumes on the first host at 2 ranks
#                as HSDP (--shard-size 1) and as FSDP
#   fsdp-rings   FSDP with units of 256 KB and more, whose all-gathers and reduce-scatters
#                across hosts are loom's rings: equals 4 ranks of one host in the same rings
#   fsdp-fewer   FSDP on 2 hosts x 2 ranks resumed on one host at 2 ranks, then 1 (resharded)
#   bench-hsdp   not a test (bench/hsdp_hosts.sh runs it): FSDP in Open MPI's collectives,
#                FSDP in loom's rings and HSDP (a shard group per host) on 2 hosts x 2 ranks,
#                uncapped and with each host's link capped by `tc ... tbf` at $LINK (default
#                1gbit) both ways, alternating, $REPS runs each (default 3), and a raw TCP
#                transfer through the capped link and one inside the first host (its ranks'
#                loopback); prints each run's samples/s, cross-host bytes and exposed
#                communication, the medians, the time the cap adds and `loom plan`'s figures
#                at the raw rate, with the hops inside a host at the loopback's rate (what
#                Open MPI's TCP transport has there) and at plan's own memcpy figure;
#                VARIANTS picks among fsdp-mpi, fsdp, hsdp, hsdp-mpi (HSDP in Open
#                MPI's collectives, LOOM_MPI_RINGS=0) and hsdp-rings (loom's rings inside
#                a host too, LOOM_MPI_RINGS=1), and the exposed time's parts (waits
#                for gathers, at the end of backward) are printed beside it;
#                BTL=self,vader,tcp runs the ranks of a host over shared memory instead;
#                PER_HOST=1 runs 2 hosts x 1 rank (HSDP then --shard-size 1: replicas only)
#   bench-allreduce  not a test: bench_allreduce's MPI part (loom's all-reduce against raw
#                MPI_Allreduce, 4 B to $AR_MB MB, default 4) across the 2 hosts, $AR_RANKS ranks
#                (default 2, one a host: HSDP's replica group), with the links uncapped and
#                capped at $LINK ($AR_CAPS: "off on"); $AR_MPI adds mpirun options (-x ...)
# MPIEXEC may be MPICH's hydra (mpiexec.mpich) for ddp, fsdp and hsdp, with a loom built against
# MPICH; the other cases skip there.
# Usage: hosts.sh LOOM MPIEXEC CASE
set -u
loom=$1 mpiexec=$2 case=$3
skip() {
  echo "SKIP: $*"
  exit 77
}
[ "$(id -u)" = 0 ] || skip "network namespaces need root"
command -v ip >/dev/null || skip "no 'ip' command (iproute2)"
command -v "$mpiexec" >/dev/null || skip "$mpiexec: not found (that MPI is not installed)"
# Open MPI's mpirun, or MPICH's hydra (the ddp, fsdp and hsdp cases; its launcher takes the same
# agent: -launcher rsh -launcher-exec AGENT), with a loom built against the same MPI
case "$("$mpiexec" --version 2>&1)" in
*"Open MPI"* | *OpenRTE*) impl=openmpi ;;
*HYDRA*) impl=mpich ;;
*) skip "$mpiexec is neither Open MPI's mpirun nor MPICH's hydra" ;;
esac
if [ $impl = mpich ]; then
  ldd "$loom" 2>/dev/null | grep -q libmpich ||
    skip "$loom is not built against MPICH (README.md, \"Open MPI or MPICH\")"
  case $case in
  ddp | fsdp | hsdp) ;;
  *) skip "case $case uses Open MPI's launcher options" ;;
  esac
fi

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

# Open MPI's transports: TCP alone (between the ranks of a host too, over its loopback), or as
# $BTL says for bench-hsdp (self,vader,tcp: shared memory inside a host, as on real machines)
btl=self,tcp
[ "$case" = bench-hsdp ] && btl=${BTL:-self,tcp}
printf '#!/bin/sh\nhost=$1; shift\nexec ip netns exec "$host" sh -c "$*"\n' >"$dir/agent"
# Shared memory (vader) names its segments by the host's name, the same "hosts" share here:
# each daemon then runs in a UTS namespace of its own, named as its host
case $btl in *vader*)
  printf '#!/bin/sh\nhost=$1; shift\nexec ip netns exec "$host" unshare --uts sh -c "hostname $host; $*"\n' >"$dir/agent" ;;
esac
chmod +x "$dir/agent"
printf '%s slots=2\n' "${hosts[@]}" >"$dir/hostfile"
printf '%s:2\n' "${hosts[@]}" >"$dir/hostfile.hydra"
# Open MPI as root, both hosts through the agent, out-of-band and data over the subnet alone
# The step a checkpoint was written at (its safetensors header's metadata; FSDP's index).
start_step() {
  local f=$1/checkpoint.safetensors
  [ -f "$f" ] || f=$1/fsdp/fsdp-index.safetensors
  head -c 65536 "$f" | grep -ao '"step":"[0-9]*"' | grep -o '[0-9][0-9]*'
}
# A launch across the namespaces has been seen to hang in Open MPI's wire-up before any rank
# started (about one launch in thirty on a loaded machine, two at once): each launch is
# watched, and one that has started nothing but Open MPI's daemon on the last host within 30 s
# is killed and made again (three tries). The exit status is mpirun's (124 on its time limit).
mpirun_hosts() {
  local n=$1 try
  shift
  local launch=(--allow-run-as-root --oversubscribe -n "$n" --hostfile "$dir/hostfile" --mca
    plm_rsh_agent "$dir/agent" --mca plm_rsh_no_tree_spawn 1 --mca oob_tcp_if_include "$subnet"
    --mca btl "$btl" --mca btl_tcp_if_include "$subnet")
  # MPICH: UCX over TCP alone, on eth0 (UCX's shared memory reaches across the network
  # namespaces of one machine: with it nothing crossed the link). MPICH 4.0.2 with UCX 1.13
  # hangs in MPI_Finalize after a run in many launches here (any program that communicated,
  # every rank's work done): loom bounds it (loom_mpi_finalize_within), each rank ending with
  # the run's exit status LOOM_MPI_FINALIZE_S after entering it, and train_bounded counts it.
  if [ $impl = mpich ]; then
    launch=(-f "$dir/hostfile.hydra" -launcher rsh -launcher-exec "$dir/agent" -iface eth0
      -genv UCX_NET_DEVICES eth0 -genv UCX_TLS tcp -n "$n")
    [ "${1:-}" = --map-by ] && [ "${2:-}" = node ] && shift 2 && launch+=(-ppn 1)
  fi
  for try in 1 2 3; do
    timeout -k 5 "${limit:-240}" ip netns exec "${hosts[0]}" "$mpiexec" "${launch[@]}" "$@" &
    local pid=$! ticks=0 started=0 p
    while kill -0 "$pid" 2>/dev/null && [ $started = 0 ]; do
      for p in $(ip netns pids "${hosts[1]}" 2>/dev/null); do
        case "$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)" in
        *orted* | *hydra_pmi_proxy* | "") ;;
        *) started=1 ;;
        esac
      done
      ticks=$((ticks + 1))
      if [ $started = 0 ] && [ $ticks -ge 150 ]; then
        echo "hosts.sh: launch $try started nothing on ${hosts[1]} within 30 s: made again" >&2
        kill -9 "$pid" 2>/dev/null
        for p in "${hosts[@]}"; do ip netns pids "$p" | xargs -r kill -9 2>/dev/null; done
        wait "$pid" 2>/dev/null
        continue 2
      fi
      sleep 0.2
    done
    wait "$pid"
    return $?
  done
  return 124
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
    if [ $rc = 0 ]; then # MPICH's MPI_Finalize, bounded by loom (loom/dist_mpi.h): said, counted
      n=$(grep -c "MPI_Finalize did not return" "$dir/err")
      [ "$n" = 0 ] || echo "$what: $n rank(s) ended after MPI_Finalize hung (loom's bound)"
      return 0
    fi
    # MPICH's hydra may exit 255 when a rank ends on loom's bound while another is in its final
    # barrier (loom/dist_mpi.h), or die of SIGPIPE (141: seen under `ctest -j2` beside other MPI
    # tests, writing to the proxy of the rank that had ended): the run's work done (its summary
    # printed; the model is compared next), that is MPICH's failure to finalize, said and accepted
    if [ $impl = mpich ] && { [ $rc = 255 ] || [ $rc = 141 ]; } &&
      grep -q "MPI_Finalize did not return" "$dir/err" && grep -q "test accuracy" "$dir/out"; then
      echo "$what: hydra exited $rc after loom ended a rank's stuck MPI_Finalize (work done)"
      return 0
    fi
    if [ $rc = 124 ] || [ $rc = 137 ]; then
      echo "$what: timed out (try $try); processes then:"
      grep -E "loom|mpirun|orted|hydra" "$dir/ps" | grep -v grep
      for h in "${hosts[@]}"; do ip netns pids "$h" | xargs -r kill -9 2>/dev/null; done
      [ $try = 1 ] && ! grep -q "$loom train" "$dir/ps" && continue
    fi
    fail "$what failed (exit $rc)"
  done
}

case $case in
ddp | fsdp | hsdp)
  run="train --strategy $case --hidden 32,16 --threads 1 --limit 1024 --batch 32 --epochs 1 --quiet"
  [ "$case" = ddp ] || run="$run --amp bf16"
  run4=$run run2=$run
  [ "$case" = hsdp ] && run4="$run --shard-size 2" run2="$run --shard-size 1"
  # shellcheck disable=SC2086
  one=(--allow-run-as-root --oversubscribe -n 4 --mca btl self,vader)
  [ $impl = mpich ] && one=(-n 4)
  # shellcheck disable=SC2086
  train_bounded "the run on 4 MPI ranks of one host" timeout -k 5 120 "$mpiexec" "${one[@]}" \
    "$loom" $run4 --backend mpi --save "$dir/one4"
  rx0=$(cat "/sys/class/net/lmv${tag}2/statistics/rx_bytes")
  # shellcheck disable=SC2086
  train_bounded "the run on 2 hosts x 2 ranks" mpirun_hosts 4 "$loom" $run4 --backend mpi \
    --save "$dir/two4"
  rx1=$(cat "/sys/class/net/lmv${tag}2/statistics/rx_bytes")
  # its collectives crossed the link: the second host sent more than 300 KB (32 steps of a
  # 26K-parameter model; launching sends a few KB)
  [ $((rx1 - rx0)) -gt 300000 ] ||
    fail "only $((rx1 - rx0)) bytes left the second host: the ranks did not talk across the link"
  cmp -s "$dir/one4/model.safetensors" "$dir/two4/model.safetensors" ||
    fail "the model trained on 2 hosts x 2 ranks differs from the one-host run's"
  # shellcheck disable=SC2086
  train_bounded "the run on 2 thread ranks" timeout -k 5 120 "$loom" $run2 --ranks 2 \
    --save "$dir/one2"
  # shellcheck disable=SC2086
  train_bounded "the run on 2 hosts x 1 rank" mpirun_hosts 2 --map-by node "$loom" $run2 \
    --backend mpi --save "$dir/two2"
  cmp -s "$dir/one2/model.safetensors" "$dir/two2/model.safetensors" ||
    fail "the model trained on 2 hosts x 1 rank differs from 2 thread ranks'"
  ;;
fsdp-rings)
  # FSDP with units large enough (256 KB and more a collective) for the rings a group across
  # hosts takes for its all-gathers and reduce-scatters (loom/dist_mpi.h): 2 hosts x 2 ranks
  # equal, byte for byte, 4 ranks of one host told to take the same rings (LOOM_MPI_RINGS=1)
  run="train --strategy fsdp --amp bf16 --hidden 256,128 --threads 1 --limit 512 --batch 32 \
--epochs 1 --quiet --backend mpi"
  # shellcheck disable=SC2086
  train_bounded "the run on 4 MPI ranks of one host" timeout -k 5 120 env LOOM_MPI_RINGS=1 \
    "$mpiexec" --allow-run-as-root --oversubscribe -n 4 --mca btl self,vader "$loom" $run \
    --save "$dir/one4"
  # shellcheck disable=SC2086
  train_bounded "the run on 2 hosts x 2 ranks" mpirun_hosts 4 "$loom" $run --save "$dir/two4"
  cmp -s "$dir/one4/model.safetensors" "$dir/two4/model.safetensors" ||
    fail "the model trained on 2 hosts x 2 ranks differs from the one-host run's in rings"
  ;;
link-down | link-down-fsdp | link-down-hsdp)
  # DDP or FSDP with one rank per host, or HSDP with 2 ranks per host (--shard-size 2: a shard
  # group per host, ranks 0-1 and 2-3, replicas across the link), --timeout 10; after the first
  # checkpoint the second host's link goes down mid-step. loom's part: each rank fails with a
  # message naming a rank of the other host within the timeout and ends (MPI_Abort, or exit if
  # that cannot reach the launcher); measured from the link going down to each loom process's
  # end. The launcher's part: mpirun learns that the daemon of the unreachable host is gone only
  # when TCP gives up retransmitting to it (net.ipv4.tcp_retries2, 15 by default: about 15
  # minutes), so the namespaces get 5 (about 12 s), a per-namespace setting; the daemon left on
  # the cut host is the cleanup's. Each rank's output goes to a file written on its own host
  # (--output-filename), since what the cut host prints never reaches mpirun. Then the last
  # checkpoint, intact, is resumed on the first host alone: 2 ranks there over shared memory,
  # then another rank count or strategy (see below).
  timeout=10
  for h in "${hosts[@]}"; do ip netns exec "$h" sysctl -qw net.ipv4.tcp_retries2=5; done
  per_host=1 strategy=${case#link-down-} place=(--map-by node)
  [ "$case" = link-down ] && strategy=ddp
  [ $strategy = hsdp ] && per_host=2 place=()
  nranks=$((2 * per_host))
  run="train --strategy $strategy --hidden 256 --threads 1 --epochs 50 --batch 32 --limit 4096"
  [ $strategy = hsdp ] && run="$run --shard-size 2"
  # mpirun's own time limit is not what ends it (its end is asserted, 60 s after the link went
  # down): three launch tries of 30 s and a slow start under load must not reach it, or it
  # would kill the ranks before their timeout
  # shellcheck disable=SC2086
  (
    trap - EXIT
    limit=240 mpirun_hosts $nranks "${place[@]}" --output-filename "$dir/ranks" "$loom" $run \
      --timeout $timeout --backend mpi --save "$dir/ck" >"$dir/out" 2>"$dir/err"
  ) &
  job=$!
  ck=$dir/ck/checkpoint.safetensors
  [ $strategy = ddp ] || ck=$dir/ck/fsdp/fsdp-index.safetensors
  # until the first checkpoint is written, as long as the job runs (its launch may take up to
  # three tries of 30 s on a loaded machine: a fixed wait here was seen to run out)
  while [ ! -f "$ck" ] && kill -0 $job 2>/dev/null; do sleep 0.1; done
  [ -f "$ck" ] || fail "no checkpoint before the link went down (the run ended first)"
  sleep 0.5 # mid-epoch
  loom_in() { # the loom processes of a namespace, if any
    local p
    for p in $(ip netns pids "$1" 2>/dev/null); do
      [ "$(cat "/proc/$p/comm" 2>/dev/null)" = loom ] && echo "$p"
    done
  }
  for i in 0 1; do
    [ "$(loom_in "${hosts[$i]}" | wc -l)" = $per_host ] ||
      fail "a rank on host $((i + 1)) ended before the link went down"
  done
  ip link set "lmv${tag}2" down
  t0=$(date +%s.%N)
  gone=(- -) job_end=-
  while :; do
    now=$(date +%s.%N)
    el=$(awk "BEGIN { printf \"%.1f\", $now - $t0 }")
    for i in 0 1; do # the time the host's last loom process ended
      [ "${gone[$i]}" = - ] && [ -z "$(loom_in "${hosts[$i]}")" ] && gone[i]=$el
    done
    if [ "$job_end" = - ] && ! kill -0 $job 2>/dev/null; then job_end=$el; fi
    [ "${gone[0]}" != - ] && [ "${gone[1]}" != - ] && [ "$job_end" != - ] && break
    awk "BEGIN { exit !($el > 150) }" && break
    sleep 0.1
  done
  wait $job
  rc=$?
  printf 'link down -> host 1 ranks ended after %s s, host 2 ranks after %s s, mpirun after %s s (exit %s)\n' \
    "${gone[0]}" "${gone[1]}" "$job_end" "$rc"
  # every rank's error names the rank its wait was on. DDP and FSDP (one rank per host): the
  # other host's. HSDP: in a group split from the world (the replica groups, across the link,
  # and the shard groups) a rank is named by its rank there and in the run ("rank 0 (rank 1 of
  # the run): ... waiting for rank 1 (rank 3 of the run)"). The ranks of a host wait across the
  # link in their replica all-reduce, but one may instead wait on its own host's other rank in
  # the shard group's reduce-scatter (that rank being stuck in the replica all-reduce; seen in 1
  # of 7 runs): each rank names a rank by its rank in the run, and on each host at least one
  # names a rank of the other host (README, "A host that fails")
  for i in 0 1; do across[i]=0; done
  for r in $(seq 0 $((nranks - 1))); do
    f=$(find "$dir/ranks" -path "*rank.$r/stderr" 2>/dev/null | head -1)
    echo "--- rank $r's stderr"
    grep -v '^\[' "${f:-/dev/null}"
    host=$((r / per_host)) ok=
    for o in $(seq 0 $((nranks - 1))); do
      [ $o = $r ] && continue
      [ $strategy != hsdp ] && [ $((o / per_host)) = $host ] && continue
      if [ $strategy = hsdp ]; then
        grep -q "rank [0-9]* (rank $r of the run): .* timed out after $timeout s waiting for rank [0-9]* (rank $o of the run)" \
          "${f:-/dev/null}" && ok=$o
      else
        grep -q "rank $r: .* timed out after $timeout s waiting for rank $o\b" "${f:-/dev/null}" &&
          ok=$o
      fi
    done
    [ -n "$ok" ] || fail "rank $r did not say it timed out waiting for a rank (named by its rank in the run)"
    [ $((ok / per_host)) != $host ] && across[host]=1
  done
  for i in 0 1; do
    [ "${across[$i]}" = 1 ] || fail "no rank of host $((i + 1)) named a rank of the other host"
  done
  for i in 0 1; do
    [ "${gone[$i]}" != - ] && awk "BEGIN { exit !(${gone[$i]} <= $timeout + 6) }" ||
      fail "host $((i + 1))'s ranks still ran ${gone[$i]} s after the link went down (--timeout $timeout)"
  done
  [ "$rc" != 0 ] || fail "mpirun exited 0 after the link went down"
  [ "$job_end" != - ] && awk "BEGIN { exit !($job_end <= 60) }" ||
    fail "mpirun still ran $job_end s after the link went down"
  # the cut host's daemon (and anything else the run left) goes; the link comes back up
  for h in "${hosts[@]}"; do ip netns pids "$h" | xargs -r kill -9 2>/dev/null; done
  ip link set "lmv${tag}2" up
  # resume on the first host alone: 2 ranks over shared memory, 2 epochs more, the global batch
  # kept (HSDP's 4 x 32 as 2 x 64; as an HSDP of 2 replicas of 1 shard: its checkpoint, written
  # by one shard group of 2, resharded)
  cp -r "$dir/ck" "$dir/ck1"
  run2=$run
  if [ $strategy = hsdp ]; then
    run2=${run/--batch 32/--batch 64}
    run2=${run2/--shard-size 2/--shard-size 1}
  fi
  # shellcheck disable=SC2086
  timeout 120 ip netns exec "${hosts[0]}" "$mpiexec" --allow-run-as-root --oversubscribe -n 2 \
    --mca btl self,vader "$loom" $run2 --timeout $timeout --backend mpi --resume "$dir/ck" \
    --save "$dir/ck" --max-steps "$(($(start_step "$dir/ck") + 128))" >"$dir/out" 2>"$dir/err" ||
    fail "the resume on one host (2 ranks) failed"
  grep -q "resuming at step" "$dir/out" || fail "the run on one host did not resume"
  [ $strategy = hsdp ] && { grep -q "written by 4 ranks x batch 32; this run has 2 ranks x batch 64" \
    "$dir/out" || fail "the resume on 2 ranks did not say what changed"; }
  grep "resuming at step\|written by" "$dir/out"
  # and at another rank count: 1 rank with the same global batch (2 x 32); HSDP's checkpoint
  # under FSDP at 2 ranks (the surviving count, its shards resharded from HSDP's shard group)
  if [ $strategy = hsdp ]; then
    run=${run/--strategy hsdp/--strategy fsdp}
    run=${run/ --shard-size 2/}
    run=${run/--batch 32/--batch 64}
    n1=2 btl=self,vader said="written by 4 ranks x batch 32; this run has 2 ranks x batch 64"
  else
    run=${run/--batch 32/--batch 64}
    n1=1 btl=self said="written by 2 ranks x batch 32; this run has 1 rank x batch 64"
  fi
  # shellcheck disable=SC2086
  timeout 120 ip netns exec "${hosts[0]}" "$mpiexec" --allow-run-as-root --oversubscribe -n $n1 \
    --mca btl $btl "$loom" $run --timeout $timeout --backend mpi --resume "$dir/ck1" \
    --save "$dir/ck1" --max-steps "$(($(start_step "$dir/ck1") + 64))" >"$dir/out" 2>"$dir/err" ||
    fail "the resume on one host ($n1 ranks, $strategy's checkpoint) failed"
  grep -q "$said" "$dir/out" || fail "the resume on $n1 ranks did not say what changed"
  grep "resuming at step\|written by" "$dir/out"
  ;;
fsdp-fewer)
  # FSDP across 2 hosts x 2 ranks, stopped after 16 steps (as if a host were lost: the
  # link-down case shows the failure itself), resumed on the first host alone: the sharded
  # checkpoint of 4 ranks resharded to 2 ranks, then to 1, the global batch kept (4 x 16)
  run="train --strategy fsdp --amp bf16 --hidden 64,32 --threads 1 --limit 1024 --epochs 2"
  # shellcheck disable=SC2086
  mpirun_hosts 4 "$loom" $run --batch 16 --backend mpi --max-steps 16 --save "$dir/ck" \
    >"$dir/out" 2>"$dir/err" || fail "the FSDP run on 2 hosts x 2 ranks failed"
  [ "$(start_step "$dir/ck")" = 16 ] || fail "no checkpoint at step 16"
  # shellcheck disable=SC2086
  timeout 120 ip netns exec "${hosts[0]}" "$mpiexec" --allow-run-as-root --oversubscribe -n 2 \
    --mca btl self,vader "$loom" $run --batch 32 --backend mpi --resume "$dir/ck" --save "$dir/ck" \
    --max-steps 24 >"$dir/out" 2>"$dir/err" || fail "the resume on 1 host x 2 ranks failed"
  grep -q "written by 4 ranks x batch 16; this run has 2 ranks x batch 32" "$dir/out" ||
    fail "the resume on 2 ranks did not say what changed"
  grep "resuming at step\|written by" "$dir/out"
  # shellcheck disable=SC2086
  timeout 120 ip netns exec "${hosts[0]}" "$mpiexec" --allow-run-as-root -n 1 --mca btl self \
    "$loom" $run --batch 64 --backend mpi --resume "$dir/ck" --save "$dir/ck" \
    >"$dir/out" 2>"$dir/err" || fail "the resume on 1 rank failed"
  grep -q "written by 2 ranks x batch 32; this run has 1 rank x batch 64" "$dir/out" ||
    fail "the resume on 1 rank did not say what changed"
  grep "resuming at step\|written by\|test accuracy" "$dir/out"
  # a global batch the ranks cannot keep is refused, naming the --batch that would
  # shellcheck disable=SC2086
  timeout 120 ip netns exec "${hosts[0]}" "$mpiexec" --allow-run-as-root -n 2 --mca btl self,vader \
    "$loom" $run --batch 16 --epochs 3 --backend mpi --resume "$dir/ck" >"$dir/out" 2>"$dir/err" &&
    fail "a resume at another global batch was accepted"
  grep -q "give --batch 32 to keep the global batch" "$dir/err" ||
    fail "the refusal did not name the --batch to give"
  ;;
bench-hsdp)
  # Each repetition runs, with the links uncapped and then capped: FSDP in Open MPI's own
  # all-gather and reduce-scatter (LOOM_MPI_RINGS=0), FSDP in loom's rings (the default across
  # hosts), and HSDP; and, capped, one TCP stream of RAW_MB MiB from the second host into the
  # first (the rate TCP achieves through tbf, which `loom plan --link` is then given).
  link=${LINK:-1gbit} reps=${REPS:-3} hidden=${HIDDEN:-1024,1024} limit_n=${LIMIT:-1024}
  batch=${BATCH:-8} variants=${VARIANTS:-fsdp-mpi fsdp hsdp}
  per_host=${PER_HOST:-2} # ranks per host: 2, or 1 (one process a core: none shares a core)
  nr=$((2 * per_host)) map=
  [ "$per_host" = 1 ] && map="--map-by node"
  steps=$((limit_n / (batch * nr)))
  cap() { # on | off: both ends of each host's link (the root's end and the host's)
    local i
    for i in 1 2; do
      if [ "$1" = on ]; then
        tc qdisc replace dev "lmv$tag$i" root tbf rate "$link" burst 256kb latency 100ms ||
          fail "tc tbf on lmv$tag$i"
        ip netns exec "${hosts[$((i - 1))]}" tc qdisc replace dev eth0 root tbf rate "$link" \
          burst 256kb latency 100ms || fail "tc tbf in ${hosts[$((i - 1))]}"
      else
        tc qdisc del dev "lmv$tag$i" root 2>/dev/null
        ip netns exec "${hosts[$((i - 1))]}" tc qdisc del dev eth0 root 2>/dev/null
      fi
    done
  }
  raw_rate() { # Mbit/s of one TCP stream from host $1 into host 1 (0: the first host's own
    # loopback, as its ranks talk to each other), payload bytes over receive time
    local port=$((20000 + tag % 20000)) srv from=${1:-1}
    timeout 120 ip netns exec "${hosts[0]}" python3 -c '
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1)
c, _ = s.accept()
t0, n = time.time(), 0
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    n += len(b)
print("%.1f" % (n * 8 / (time.time() - t0) / 1e6))
' "198.18.$net.1" "$port" >"$dir/raw" &
    srv=$!
    sleep 0.5
    timeout 120 ip netns exec "${hosts[$from]}" python3 -c '
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
buf = bytes(1 << 20)
for _ in range(int(sys.argv[3])):
    c.sendall(buf)
c.close()
' "198.18.$net.1" "$port" "${RAW_MB:-128}" || fail "the raw transfer"
    wait "$srv" || fail "the raw transfer's receiver"
    cat "$dir/raw"
  }
  link_latency() { # us: loom's 4-byte all-reduce between one rank on each host (the header
    # exchange carrying the data: one message each way, what a ring step waits besides its
    # bytes), the median of 11 loops of bench_allreduce's MPI part
    train_bounded "the link's latency" mpirun_hosts 2 --map-by node -x BENCH_TRIALS=11 \
      -x BENCH_ITERS=50 "$loom" bench allreduce 2 0 --mpi-child
    awk '$1 == "allreduce" && $2 == "mpi" && $4 == "bytes=4" { sub("us=", "", $6); print $6 }' "$dir/out"
  }
  # the median step's increase of a --metrics counter (seconds), in ms, from the second step
  step_median() {
    grep -o "\"$1\": [0-9.]*" "$dir/metrics.jsonl" |
      awk 'NR > 1 { print 1000 * ($2 - last) } { last = $2 }' | sort -n |
      awk '{ v[NR] = $1 } END { if (!NR) print "nan"; else printf "%.1f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
  }
  median() { sort -n "$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
  run="train --hidden $hidden --threads 1 --limit $limit_n --batch $batch --epochs 1 --quiet \
--amp bf16 --backend mpi"
  echo "link $link per host, each way; 2 hosts x $per_host rank(s), transports $btl; $run; $steps steps a run"
  for r in $(seq 1 "$reps"); do
    for c in off on; do
      cap $c
      if [ $c = on ]; then
        raw=$(raw_rate 1)
        echo "raw TCP run $r: $raw Mbit/s"
        echo "$raw" >>"$dir/raw.all"
        loop=$(raw_rate 0)
        echo "loopback TCP inside host 1, run $r: $loop Mbit/s"
        echo "$loop" >>"$dir/loop.all"
        lat=$(link_latency)
        echo "a 4-byte all-reduce across the link (one exchange), run $r: $lat us"
        echo "$lat" >>"$dir/lat.all"
      fi
      for v in $variants; do
        case $v in
        fsdp-mpi) extra="-x LOOM_MPI_RINGS=0 $loom $run --strategy fsdp" ;;
        fsdp) extra="$loom $run --strategy fsdp" ;;
        hsdp) extra="$loom $run --strategy hsdp --shard-size $per_host" ;;
        hsdp-mpi) extra="-x LOOM_MPI_RINGS=0 $loom $run --strategy hsdp --shard-size $per_host" ;;
        hsdp-rings) extra="-x LOOM_MPI_RINGS=1 $loom $run --strategy hsdp --shard-size $per_host" ;;
        esac
        tx0=$(cat "/sys/class/net/lmv${tag}1/statistics/tx_bytes")
        rm -f "$dir/metrics.jsonl"
        # shellcheck disable=SC2086
        train_bounded "$v cap $c run $r" mpirun_hosts $nr $map $extra --metrics "$dir/metrics.jsonl"
        tx1=$(cat "/sys/class/net/lmv${tag}1/statistics/tx_bytes")
        sps=$(grep -o '[0-9.]*k\? samples/s' "$dir/out" | awk '{ v = $1 + 0; if ($1 ~ /k$/) v *= 1000; print v }')
        mb=$(awk "BEGIN { printf \"%.2f\", ($tx1 - $tx0) / 1e6 / $steps }")
        # exposed communication, rank 0's: the time its compute waited for a gather, a
        # reduce-scatter or (HSDP) a replica all-reduce (fsdp_exposed_s of --metrics, summed
        # over the run): the median step's, from the second step on (the first includes the
        # start-up; the median leaves out the steps another process's burst of load held up)
        exp=$(step_median fsdp_exposed_s)
        # where it waited: for all-gathers, and at the end of backward (the reduce-scatters and
        # replica all-reduces still running); the rest before a unit's backward
        egat=$(step_median fsdp_exposed_gather_s) eend=$(step_median fsdp_exposed_end_s)
        printf '%s cap %s run %s: %s samples/s, %s MB a step into host 1, exposed %s ms a step (gathers %s, end of backward %s)\n' \
          "$v" $c "$r" "$sps" "$mb" "$exp" "$egat" "$eend"
        echo "$sps" >>"$dir/$v.$c.sps"
        echo "$mb" >>"$dir/$v.$c.mb"
        echo "$exp" >>"$dir/$v.$c.exp"
        echo "$egat" >>"$dir/$v.$c.egat"
        echo "$eend" >>"$dir/$v.$c.eend"
      done
    done
  done
  raw=$(median "$dir/raw.all")
  gbps=$(awk "BEGIN { print $raw / 1000 }")
  echo "raw TCP median: $raw Mbit/s (runs: $(tr '\n' ' ' <"$dir/raw.all"))"
  loop=$(median "$dir/loop.all")
  lgbps=$(awk "BEGIN { print $loop / 1000 }")
  echo "loopback TCP median: $loop Mbit/s (runs: $(tr '\n' ' ' <"$dir/loop.all")); transports $btl"
  lat=$(median "$dir/lat.all")
  echo "link latency median: $lat us an exchange (runs: $(tr '\n' ' ' <"$dir/lat.all")); the plans below take it (--link-latency-us)"
  for v in $variants; do
    s=fsdp extra=
    case $v in hsdp*) s=hsdp extra="--shard-size $per_host" ;; esac
    # the plan with the hops inside a host at the loopback's measured rate (Open MPI's TCP
    # transport between a host's ranks), unless they run over shared memory ($BTL with vader):
    # then at the plan's own figure (a memcpy); and the other for comparison
    intra="--intra-link $lgbps" ointra=
    case $btl in *vader* | *sm*) intra= ointra="--intra-link $lgbps" ;; esac
    # shellcheck disable=SC2086
    plan=$("$loom" plan --hidden "$hidden" --threads 1 --batch "$batch" --amp bf16 --strategy $s $extra \
      --hosts 2 --ranks-per-host "$per_host" --link "$gbps" --link-latency-us "$lat" $intra --json)
    pmb=$(echo "$plan" | grep -o '"link_bytes": [0-9.]*' | awk '{ printf "%.2f", $2 / 1e6 }')
    pms=$(echo "$plan" | grep -o '"link_seconds": [0-9.]*' | awk '{ printf "%.1f", $2 * 1e3 }')
    pex=$(echo "$plan" | grep -o '"exposed_seconds": [0-9.]*' | awk '{ printf "%.1f", $2 * 1e3 }')
    pgf=$(echo "$plan" | grep -o '"gflops": [0-9.]*' | awk '{ printf "%.0f", $2 }')
    pin=$(echo "$plan" | grep -o '"intra_link_gbps": [0-9.]*' | awk '{ printf "%.1f", $2 }')
    # shellcheck disable=SC2086
    other=$("$loom" plan --hidden "$hidden" --threads 1 --batch "$batch" --amp bf16 --strategy $s $extra \
      --hosts 2 --ranks-per-host "$per_host" --link "$gbps" --link-latency-us "$lat" $ointra --json)
    oex=$(echo "$other" | grep -o '"exposed_seconds": [0-9.]*' | awk '{ printf "%.1f", $2 * 1e3 }')
    oin=$(echo "$other" | grep -o '"intra_link_gbps": [0-9.]*' | awk '{ printf "%.1f", $2 }')
    off=$(median "$dir/$v.off.sps") on=$(median "$dir/$v.on.sps")
    eoff=$(median "$dir/$v.off.exp") eon=$(median "$dir/$v.on.exp")
    # exposed communication: the plan's (the link's time the compute cannot hide, at the rate
    # the plan measured) against rank 0's measured wait, capped, and what the cap added to it
    awk -v v=$v -v eoff="$eoff" -v eon="$eon" -v pex="$pex" -v pgf="$pgf" -v pin="$pin" \
      -v oex="$oex" -v oin="$oin" 'BEGIN {
      printf "%s exposed: measured uncapped %.1f ms/step, capped %.1f (the cap adds %.1f); " \
        "plan %.1f (compute at %s GFLOP/s, a hop inside a host at %s Gbit/s): capped/plan " \
        "%.2fx, added/plan %.2fx; plan with a hop inside a host at %s Gbit/s: %.1f, " \
        "capped/that %.2fx\n", v, eoff, eon, eon - eoff, pex, pgf, pin, eon / pex, \
        (eon - eoff) / pex, oin, oex, eon / oex }'
    echo "  exposed runs uncapped: $(tr '\n' ' ' <"$dir/$v.off.exp")capped: $(tr '\n' ' ' <"$dir/$v.on.exp")"
    echo "  of it waiting for gathers, median uncapped $(median "$dir/$v.off.egat"), capped $(median "$dir/$v.on.egat"); at the end of backward, uncapped $(median "$dir/$v.off.eend"), capped $(median "$dir/$v.on.eend")"
    awk -v v=$v -v off="$off" -v on="$on" -v b=$((batch * nr)) -v mb="$(median "$dir/$v.on.mb")" \
      -v pmb="$pmb" -v pms="$pms" 'BEGIN {
      moff = 1000 * b / off; mon = 1000 * b / on; add = mon - moff
      printf "%s median: uncapped %.0f samples/s (%.1f ms/step), capped %.0f (%.1f ms/step): " \
        "the cap adds %.1f ms/step; %.2f MB a step into host 1; plan %.2f MB, %.1f ms at the raw " \
        "rate: measured/plan bytes %.2fx, time %.2fx\n", v, off, moff, on, mon, add, mb, pmb, \
        pms, mb / pmb, add / pms }'
    echo "  runs uncapped: $(tr '\n' ' ' <"$dir/$v.off.sps")capped: $(tr '\n' ' ' <"$dir/$v.on.sps")"
  done
  ;;
bench-allreduce)
  # loom's all-reduce against raw MPI_Allreduce across the hosts (see the top of this file)
  link=${LINK:-1gbit} nr=${AR_RANKS:-2} map=
  [ "$nr" = 2 ] && map="--map-by node"
  for c in ${AR_CAPS:-off on}; do
    for i in 1 2; do
      if [ $c = on ]; then
        tc qdisc replace dev "lmv$tag$i" root tbf rate "$link" burst 256kb latency 100ms
        ip netns exec "${hosts[$((i - 1))]}" tc qdisc replace dev eth0 root tbf rate "$link" burst 256kb latency 100ms
      fi
    done
    echo "link cap $c ($link)"
    # shellcheck disable=SC2086
    train_bounded "all-reduce cap $c" mpirun_hosts $nr $map -x BENCH_TRIALS -x BENCH_ITERS ${AR_MPI:-} \
      "$loom" bench allreduce "$nr" "${AR_MB:-4}" --mpi-child
    cat "$dir/out"
  done
  ;;
*)
  fail "unknown case '$case'"
  ;;
esac
echo "ok: $case"
