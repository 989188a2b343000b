#!/usr/bin/env bash
# fuzz.sh: runs each libFuzzer harness (fuzz/) for SECONDS, under ASan + UBSan, starting from
# its seed corpus (fuzz/corpus/<harness>/, which also holds any input that once crashed: every
# run replays them first). A crash, a leak, a sanitizer report or an abort() of a harness's own
# consistency check fails the run; the input is left in WORK/<harness>/ (crash-*, leak-*). Prints
# executions per harness. New inputs the fuzzer finds stay in WORK, not in the repository.
# Usage: scripts/fuzz.sh BUILD_DIR SECONDS|fixed [WORK_DIR]
# "fixed" (make check-fuzz, CI): each harness runs a fixed number of inputs from seed 1, so the
# gate is reproducible: what passes on one machine passes on the next, and a failure replays.
# A number of seconds (make fuzz) explores at random: that is where new findings come from,
# and each one's input goes into fuzz/corpus/<harness>/ with its fix.
set -u
build=$(cd "$1" && pwd) seconds=$2 work=${3:-$build/fuzz-work}
# Inputs per harness in the fixed run: about 10-20 s each under ASan on a 2-core VM.
declare -A fixed_runs=([fuzz_safetensors]=1500000 [fuzz_loader]=1500000 [fuzz_checkpoint]=800000
                       [fuzz_idx]=800000 [fuzz_idx_gz]=300000 [fuzz_plot]=250000
                       [fuzz_text]=600000)
mkdir -p "$work" && work=$(cd "$work" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
status=0
printf "%-18s %12s %10s %8s  %s\n" harness executions exec/s seconds result
for h in fuzz_safetensors fuzz_loader fuzz_checkpoint fuzz_idx fuzz_idx_gz fuzz_plot fuzz_text; do
  bin=$build/fuzz/$h
  [ -x "$bin" ] || { echo "fuzz.sh: $bin is not built (make fuzz builds it)"; exit 2; }
  if [ "$seconds" = fixed ]; then
    rm -rf "$work/$h/corpus" # the fixed run starts from the seed corpus alone, as in CI
    budget=(-seed=1 -runs="${fixed_runs[$h]}")
  else
    budget=(-max_total_time="$seconds")
  fi
  mkdir -p "$work/$h/corpus"
  started=$SECONDS
  log=$work/$h/log
  ( cd "$work/$h" &&
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$bin" "${budget[@]}" -print_final_stats=1 -rss_limit_mb=2048 -malloc_limit_mb=512 \
      -timeout=10 corpus "$src/fuzz/corpus/$h" > "$log" 2>&1 )
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  result=ok
  if [ $rc != 0 ]; then
    result="FAILED (status $rc): $(ls "$work/$h" | grep -E '^(crash|leak|timeout|oom)-' | head -3 | tr '\n' ' ')"
    status=1
    grep -E "ERROR|SUMMARY|runtime error" "$log" | head -5
  fi
  printf "%-18s %12s %10s %8s  %s\n" "$h" "${execs:-?}" "${rate:-?}" "$((SECONDS - started))" "$result"
done
exit $status
