#!/usr/bin/env bash
# mpi_ranks.sh: `loom train --backend mpi` under mpiexec -n 2 when the ranks disagree or one
# stalls (issue 13), through the real binary, each case bounded in time:
#   mismatch OPTION V0 V1  rank 1 started with --OPTION V1, rank 0 with V0: every rank fails at
#                          start, naming the option and both values; the job exits non-zero
#   only OPTION            rank 1 alone started with --OPTION (save: a folder; init: a model
#                          file of a first run): every rank fails at start, naming it
#   init-differ            the ranks' --init files hold different models (seeds 1 and 2):
#                          every rank fails at start, naming --init and both files
#   resume                 only rank 0 resumes from a checkpoint: every rank fails at start,
#                          naming --resume; ranks resuming from checkpoints of different steps
#                          fail at start, naming both start steps
#   stall                  rank 1 stopped (kill -STOP) mid-run, --timeout 3: rank 0 names rank
#                          1 on stderr (the notice of a long wait, then the error), the job
#                          exits non-zero within the timeout plus a margin, no hang
#   fsdp NP                NP MPI processes with --strategy fsdp --amp bf16, interrupted by
#                          --max-steps and resumed from the sharded checkpoint, end with the
#                          model file of the same run on NP threads (byte for byte)
#   fsdp-offload NP        NP MPI processes with --strategy fsdp --amp bf16 --offload all on the
#                          disk tier (one folder for every rank), interrupted after 5 steps and
#                          resumed with offload from the sharded checkpoint, end with the model
#                          file of the same run on NP threads without offload (byte for byte), and
#                          leave no file in --offload-dir
#   start NP               sharded construction: NP MPI processes with --strategy fsdp and
#                          --lr 0 (no step changes a weight) save the one-process run's initial
#                          model byte for byte; with --init of a model file (another seed),
#                          that file's tensors
#   launcher               started by the launcher without --backend: one run of 2 MPI ranks (one
#                          summary line); with --backend threads: every process refuses at
#                          start, saying how to run (never two independent trainings)
# Usage: mpi_ranks.sh LOOM MPIEXEC NP_FLAG "flags=LAUNCHER FLAGS" CASE [ARGS...] (the flags
# after "flags=", which may be empty, as MPICH's are)
set -u
loom=$1 mpiexec=$2 np=$3 flags=${4#flags=} case=$5
shift 5
dir=$(mktemp -d)
trap 'kill -CONT $(cat "$dir/pid1" 2>/dev/null) 2>/dev/null; rm -rf "$dir"' EXIT
common="train --backend mpi --strategy ddp --hidden 16 --threads 1"
fail() {
  echo "FAIL: $*"
  echo "--- stdout"; cat "$dir/out"
  echo "--- stderr"; cat "$dir/err"
  exit 1
}

case $case in
mismatch)
  opt=$1 v0=$2 v1=$3
  run="$common --limit 512 --epochs 1 --quiet"
  # shellcheck disable=SC2086
  timeout 120 "$mpiexec" $flags $np 1 "$loom" $run --$opt "$v0" : $np 1 "$loom" $run --$opt "$v1" \
    >"$dir/out" 2>"$dir/err"
  rc=$?
  [ $rc -ne 0 ] || fail "exit 0 with --$opt $v0 on rank 0 and $v1 on rank 1"
  [ $rc -ne 124 ] || fail "no end within 120 s"
  want="rank 1 has --$opt $v1, rank 0 has --$opt $v0"
  grep -q "loom train: rank [01]: the ranks disagree: $want" "$dir/err" || fail "no '$want'"
  grep -q "test accuracy" "$dir/out" && fail "trained anyway"
  ;;
only | init-differ)
  run="$common --limit 512 --epochs 1 --quiet"
  for seed in 1 2; do
    timeout 120 "$loom" train --hidden 16 --threads 1 --limit 512 --epochs 1 --quiet \
      --seed $seed --save "$dir/m$seed" >"$dir/out" 2>"$dir/err" || fail "the first run failed"
  done
  if [ "$case" = only ]; then
    opt=$1 v0=""
    if [ "$opt" = init ]; then v1="$dir/m1/model.safetensors"; else v1="$dir/ck"; fi
    want="rank 1 has --$opt $v1.*, rank 0 has no --$opt"
  else
    opt=init v0="--init $dir/m1/model.safetensors" v1="$dir/m2/model.safetensors"
    want="rank 1 has --init $v1 (bytes .*), rank 0 has $v0 (bytes "
  fi
  # shellcheck disable=SC2086
  timeout 120 "$mpiexec" $flags $np 1 "$loom" $run $v0 : $np 1 "$loom" $run --$opt "$v1" \
    >"$dir/out" 2>"$dir/err"
  rc=$?
  [ $rc -ne 0 ] || fail "exit 0 with --$opt $v1 on rank 1 ($v0 on rank 0)"
  [ $rc -ne 124 ] || fail "no end within 120 s"
  grep -q "loom train: rank [01]: the ranks disagree: $want" "$dir/err" || fail "no '$want'"
  grep -q "test accuracy" "$dir/out" && fail "trained anyway"
  ;;
resume)
  # checkpoints at steps 2 and 3; then only rank 0 resumes (refused by the option), then the
  # ranks resume from different checkpoints (refused by the start step, once read)
  run="$common --limit 512 --batch 64 --epochs 2 --quiet"
  for s in 2 3; do
    # shellcheck disable=SC2086
    timeout 120 "$mpiexec" $flags $np 2 "$loom" $run --max-steps $s --save "$dir/ck$s" \
      >"$dir/out" 2>"$dir/err" || fail "the first run failed"
  done
  # shellcheck disable=SC2086
  timeout 120 "$mpiexec" $flags $np 1 "$loom" $run --resume "$dir/ck2" : \
    $np 1 "$loom" $run >"$dir/out" 2>"$dir/err"
  rc=$?
  [ $rc -ne 0 ] || fail "exit 0 with --resume on rank 0 only"
  [ $rc -ne 124 ] || fail "no end within 120 s"
  grep -q "the ranks disagree: rank 1 has no --resume, rank 0 has --resume $dir/ck2" "$dir/err" ||
    fail "no message naming --resume"
  # shellcheck disable=SC2086
  timeout 120 "$mpiexec" $flags $np 1 "$loom" $run --resume "$dir/ck2" : \
    $np 1 "$loom" $run --resume "$dir/ck3" >"$dir/out" 2>"$dir/err"
  rc=$?
  [ $rc -ne 0 ] || fail "exit 0 with ranks resuming from different steps"
  [ $rc -ne 124 ] || fail "no end within 120 s"
  grep -q "the ranks disagree: rank 1 starts at step 3, rank 0 starts at step 2" "$dir/err" ||
    fail "no message naming the start steps"
  ;;
stall)
  # rank 1 writes its pid, then becomes loom; a long run, stopped once rank 0 is training
  run="$common --limit 512 --batch 16 --epochs 100000 --timeout 3"
  # shellcheck disable=SC2086
  timeout 120 "$mpiexec" $flags $np 1 "$loom" $run : \
    $np 1 sh -c "echo \$\$ > '$dir/pid1'; exec '$loom' $run" >"$dir/out" 2>"$dir/err" &
  job=$!
  for _ in $(seq 300); do grep -q "steps per epoch" "$dir/out" 2>/dev/null && break; sleep 0.2; done
  grep -q "steps per epoch" "$dir/out" || { kill $job; fail "the run did not start"; }
  sleep 1
  kill -STOP "$(cat "$dir/pid1")" || fail "cannot stop rank 1"
  t0=$(date +%s)
  wait $job
  rc=$?
  secs=$(($(date +%s) - t0))
  [ $rc -ne 0 ] || fail "exit 0 with rank 1 stopped"
  [ $rc -ne 124 ] || fail "hang: no end within 120 s"
  # 3 s timeout + 1 s for the peers' messages before MPI_Abort + a loaded machine's slack
  [ $secs -le 30 ] || fail "ended $secs s after rank 1 stopped (timeout 3 s)"
  grep -q "loom: rank 0 waiting for rank 1 in .* (timeout 3 s)" "$dir/err" || fail "no notice"
  grep -q "loom train: rank 0: .*timed out after 3 s waiting for rank 1" "$dir/err" ||
    fail "no error naming rank 1"
  ;;
fsdp)
  n=$1
  run="train --strategy fsdp --amp bf16 --hidden 24,16 --threads 1 --limit 512 --batch 32 --epochs 2 --quiet"
  timeout 120 "$loom" $run --ranks "$n" --save "$dir/thr" >"$dir/out" 2>"$dir/err" ||
    fail "the threads run failed"
  # shellcheck disable=SC2086
  timeout 120 "$mpiexec" $flags $np "$n" "$loom" $run --backend mpi --max-steps 5 --save "$dir/mpi" \
    >"$dir/out" 2>"$dir/err" || fail "the MPI run failed"
  # shellcheck disable=SC2086
  timeout 120 "$mpiexec" $flags $np "$n" "$loom" $run --backend mpi --resume "$dir/mpi" \
    --save "$dir/mpi" >"$dir/out" 2>"$dir/err" || fail "the resumed MPI run failed"
  cmp -s "$dir/thr/model.safetensors" "$dir/mpi/model.safetensors" ||
    fail "the MPI run's model differs from the threads run's"
  ;;
fsdp-offload)
  n=$1
  run="train --strategy fsdp --amp bf16 --hidden 24,16 --threads 1 --limit 512 --batch 32 --epochs 2 --quiet"
  # shellcheck disable=SC2086
  timeout 120 "$loom" $run --ranks "$n" --save "$dir/thr" >"$dir/out" 2>"$dir/err" ||
    fail "the threads run failed"
  mkdir "$dir/off"
  # shellcheck disable=SC2086
  off="--offload all --offload-tier disk --offload-dir $dir/off"
  timeout 120 "$mpiexec" $flags $np "$n" "$loom" $run --backend mpi $off --max-steps 5 \
    --save "$dir/mpi" >"$dir/out" 2>"$dir/err" || fail "the MPI run with offload failed"
  grep -q "loom train: offload: disk tier, " "$dir/out" || fail "no offload line in the summary"
  # shellcheck disable=SC2086
  timeout 120 "$mpiexec" $flags $np "$n" "$loom" $run --backend mpi $off --resume "$dir/mpi" \
    --save "$dir/mpi" >"$dir/out" 2>"$dir/err" || fail "the resumed MPI run with offload failed"
  cmp -s "$dir/thr/model.safetensors" "$dir/mpi/model.safetensors" ||
    fail "the MPI run's model (offload on disk) differs from the threads run's (no offload)"
  [ -z "$(ls -A "$dir/off")" ] || fail "files left in --offload-dir: $(ls -A "$dir/off")"
  ;;
start)
  n=$1
  run="train --hidden 24,16 --threads 1 --limit 256 --batch 32 --max-steps 1 --lr 0 --quiet"
  for seed in 1 2; do
    timeout 120 "$loom" $run --seed $seed --save "$dir/one$seed" >"$dir/out" 2>"$dir/err" ||
      fail "the one-process run failed"
  done
  # shellcheck disable=SC2086
  timeout 120 "$mpiexec" $flags $np "$n" "$loom" $run --seed 1 --backend mpi --strategy fsdp \
    --save "$dir/mpi" >"$dir/out" 2>"$dir/err" || fail "the MPI run failed"
  cmp -s "$dir/one1/model.safetensors" "$dir/mpi/model.safetensors" ||
    fail "FSDP on $n MPI processes starts from other weights than one process"
  # shellcheck disable=SC2086
  timeout 120 "$mpiexec" $flags $np "$n" "$loom" $run --seed 1 --backend mpi --strategy fsdp \
    --init "$dir/one2/model.safetensors" --save "$dir/mpi-init" >"$dir/out" 2>"$dir/err" ||
    fail "the MPI run with --init failed"
  cmp -s "$dir/one2/model.safetensors" "$dir/mpi-init/model.safetensors" ||
    fail "FSDP on $n MPI processes with --init starts from other weights than the file's"
  ;;
launcher)
  run="train --strategy ddp --hidden 16 --threads 1 --limit 256 --batch 64 --epochs 1 --quiet"
  # shellcheck disable=SC2086
  timeout 120 "$mpiexec" $flags $np 2 "$loom" $run --save "$dir/ck" >"$dir/out" 2>"$dir/err" ||
    fail "the run without --backend under the launcher failed"
  [ "$(grep -c '^loom train: mlp' "$dir/out")" = 1 ] || fail "not exactly one summary line"
  grep -q 'after 2 steps' "$dir/out" || fail "not one run of 2 ranks (2 steps of 2 x 64)"
  # shellcheck disable=SC2086
  timeout 60 "$mpiexec" $flags $np 2 "$loom" $run --backend threads >"$dir/out" 2>"$dir/err" &&
    fail "--backend threads under the launcher ran"
  [ "$(grep -c 'this process is one of 2 a launcher started' "$dir/err")" = 2 ] ||
    fail "not every process said why it refused"
  grep -q 'loom train: mlp' "$dir/out" && fail "a process trained"
  ;;
*)
  echo "unknown case $case"
  exit 2
  ;;
esac
echo "ok $case $*"
