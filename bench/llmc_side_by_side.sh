#!/bin/sh
# llmc_side_by_side.sh: issue 25, item 6: loom's GPT training step beside llm.c's CPU trainer
# (karpathy/llm.c, train_gpt2.c) and, optionally, PyTorch 1.13's, same model, same text, same
# threads. A benchmark, not a test: nothing registers it with ctest.
#
# What it does, in WORKDIR (default a fresh mktemp -d folder):
#  1. copies llm.c (LLMC_SRC: a checkout, or a bare git directory, whose HEAD is taken; without
#     it, `git clone --depth 1 https://github.com/karpathy/llm.c`) and builds its trainer with
#     the command its Makefile's `make train_gpt2` runs (read from `make -n train_gpt2`:
#     cc -Ofast ... -march=native -fopenmp -DOMP ... -lm -lgomp), compiling bench/llmc/llmc_steps.c
#     in place of train_gpt2.c: that file includes train_gpt2.c unchanged and runs its main()'s
#     step (next batch, forward, zero_grad, backward, AdamW update) at this B and T, timed as
#     main() times it (train_gpt2.c's main fixes B 4, T 64 and adds validation and sampling);
#  2. writes loom's initial weights (one step at --lr 0 --weight-decay 0, saved: the parameters
#     as initialised, as tests/train/gpt_torch_parity.py does) and converts them to llm.c's
#     checkpoint, and the training part of the same text (default: the fortunes) to llm.c's
#     token file (bench/llmc/llmc_files.py): all three start from the same weights. With
#     TORCH=1 the conversion is checked: llm.c's loss on loom's first window (B 1) must equal
#     PyTorch's on loom's weights (the parity test's model) to 1e-5 relative;
#  3. per thread count: `loom train --model gpt ... --threads N --init ... --metrics ...`
#     (step time = batch / samples_per_s of each record), llm.c with OMP_NUM_THREADS=N
#     (its "took X ms"), and with TORCH=1 PyTorch (torch.set_num_threads(N) and OpenBLAS
#     capped, bench/torch_threads.py); medians over STEPS steps after the first (skipped).
# Prints tokens/s (B x T / median step time) per side and the ratios loom / llm.c, loom / torch.
#
# Usage: bench/llmc_side_by_side.sh LOOM_BIN [WORKDIR]
# Environment: LLMC_SRC, STEPS (timed steps, default 5; one more is run and skipped),
#   THREADS (default "1 2"), LAYERS HEADS DIM CONTEXT BATCH (default 6 6 384 256 16, the
#   issue's model), AMP (off or bf16: loom's --amp and PyTorch's autocast, default off), TORCH
#   (1: time PyTorch too), LLMC (0: leave llm.c out, e.g. for bf16 runs: it is f32 only),
#   TEXT (a file instead of the fortunes), CPU (1: instead of wall-clock step times, each side's
#   CPU time a step: the process's user + system time with STEPS + 1 steps less that with 1
#   step, over STEPS; what to compare on a machine loaded by others, at 1 thread, where the
#   other load takes wall-clock time from every side unevenly but not CPU time). With CPU=1
#   only: AMP may list modes ("off bf16"), each measured in turn; ROUNDS (default 1) repeats
#   the whole set, sides alternating (loom, llm.c, torch, loom AVX2 per mode), and the medians
#   over the rounds and their ratios close the output; AVX2=1 adds loom on this CPU capped to
#   AVX2 (LOOM_CPU=avx2 ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell: what an AVX2-only
#   CPU would run) and the ratio of its bf16 step to its f32 step.
set -eu
LOOM=$(readlink -f "$1")
WORK=${2:-$(mktemp -d /tmp/llmc_side_by_side.XXXXXX)}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
# The OpenBLAS core behind torch's f32 GEMMs as the PyTorch runs get it (llmc_files.py calls
# torch_threads.cap, which replaces a generic fallback such as Prescott with OPENBLAS_CORETYPE):
# "torch_threads 1 1 core SkylakeX[ (OPENBLAS_CORETYPE set: OpenBLAS chose Prescott)]".
torch_core() {
  printf 'OPENBLAS_CORETYPE=%s, ' "${OPENBLAS_CORETYPE:-unset}"
  "$PY" -c "import sys; sys.path.insert(0, '$HERE'); import torch_threads
torch_threads.cap(1); print(torch_threads.line())"
}
STEPS=${STEPS:-5}
THREADS=${THREADS:-"1 2"}
L=${LAYERS:-6} H=${HEADS:-6} C=${DIM:-384} T=${CONTEXT:-256} B=${BATCH:-16}
AMP=${AMP:-off}
TORCH=${TORCH:-0}
LLMC=${LLMC:-1}
CPU=${CPU:-0}
ROUNDS=${ROUNDS:-1}
AVX2=${AVX2:-0}
RUNS=$((STEPS + 1))
mkdir -p "$WORK"
echo "llmc_side_by_side: work in $WORK; model $L layers, $H heads, $C wide, context $T, batch $B;" \
     "$STEPS timed steps (+1 skipped); threads $THREADS"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p') (family $(lscpu | sed -n 's/^CPU family: *//p')" \
     "model $(lscpu | sed -n 's/^Model: *//p')), $(nproc) cpus; load: $(cut -d' ' -f1-3 /proc/loadavg)"

# 1. llm.c
src=$WORK/llmc
rm -rf "$src"
mkdir -p "$src"
if [ -n "${LLMC_SRC:-}" ] && [ -f "$LLMC_SRC/HEAD" ] && ! [ -d "$LLMC_SRC/.git" ]; then
  git --git-dir="$LLMC_SRC" archive HEAD | tar -x -C "$src"
  rev=$(git --git-dir="$LLMC_SRC" rev-parse HEAD)
elif [ -n "${LLMC_SRC:-}" ]; then
  cp -r "$LLMC_SRC"/. "$src"
  rev=$(git -C "$LLMC_SRC" rev-parse HEAD 2>/dev/null || echo unknown)
else
  rm -rf "$src"
  git clone -q --depth 1 https://github.com/karpathy/llm.c "$src"
  rev=$(git -C "$src" rev-parse HEAD)
fi
cp "$HERE/llmc/llmc_steps.c" "$src/"
build=$(cd "$src" && make -s -n train_gpt2 2>/dev/null | grep -- ' train_gpt2\.c ' | tail -1)
[ -n "$build" ] || { echo "llmc_side_by_side: no train_gpt2 command in llm.c's Makefile" >&2; exit 2; }
build=$(echo "$build" | sed 's/ train_gpt2\.c / -I. llmc_steps.c /; s/-o train_gpt2$/-o llmc_steps/')
echo "llm.c $rev: $build"
(cd "$src" && eval "$build")

# 2. the same weights and text on every side
shape="--model gpt --layers $L --heads $H --dim $C --context $T --batch $B --seed 0
       --schedule constant --epochs 1000 --eval-windows 1 --quiet"
[ -n "${TEXT:-}" ] && shape="$shape --text $TEXT"
# shellcheck disable=SC2086
"$LOOM" train $shape --threads 1 --max-steps 1 --lr 0 --weight-decay 0 --save "$WORK/init" \
  --overwrite > "$WORK/init.log" 2>&1 || { cat "$WORK/init.log"; exit 1; }
init=$WORK/init/model.safetensors
"$PY" "$HERE/llmc/llmc_files.py" checkpoint "$init" "$WORK/model.llmc.bin" \
  --layers "$L" --heads "$H" --dim "$C" --context "$T"
"$PY" "$HERE/llmc/llmc_files.py" tokens "$WORK/train.llmc.bin" ${TEXT:+--text "$TEXT"}
if [ "$TORCH" = 1 ] && [ -z "${TEXT:-}" ]; then
  want=$("$PY" "$HERE/llmc/llmc_files.py" window "$init" "$WORK/window.llmc.bin" \
           --layers "$L" --heads "$H" --context "$T" | sed -n 's/^torch loss //p')
  got=$(OMP_NUM_THREADS=1 "$src/llmc_steps" "$WORK/model.llmc.bin" "$WORK/window.llmc.bin" 1 "$T" 1 |
        sed -n 's/^step 0: train loss \([0-9.]*\).*/\1/p')
  echo "conversion check: llm.c loss $got, torch $want on loom's first window"
  awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * b) }' ||
    { echo "llmc_side_by_side: llm.c's checkpoint is not loom's model" >&2; exit 1; }
fi

# Median of the step times (ms) on stdin, one per line, the first skipped.
median() {
  tail -n +2 | sort -g | awk '{v[NR] = $1} END {
    if (NR == 0) { print "nan"; exit }
    if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
tps() { awk -v ms="$1" -v n=$((B * T)) 'BEGIN { printf "%.0f", n / (ms / 1000) }'; }

# CPU milliseconds (user + system) of the command's whole run; its output to $CPU_LOG.
cpu_ms() {
  "$PY" -c 'import os, subprocess, sys
with open(sys.argv[1], "w") as log:
    p = subprocess.Popen(sys.argv[2:], stdout=log, stderr=subprocess.STDOUT)
    _, st, ru = os.wait4(p.pid, 0)
if st:
    sys.exit(1)
print("%.0f" % ((ru.ru_utime + ru.ru_stime) * 1000))' "$CPU_LOG" "$@" ||
    { cat "$CPU_LOG"; exit 1; }
}
# The CPU ms a step of a side: its command run with RUNS steps and with 1 (the command's last
# argument is the step count; "$@" without it).
cpu_step() {
  a=$(cpu_ms "$@" "$RUNS")
  b=$(cpu_ms "$@" 1)
  awk -v a="$a" -v b="$b" -v n="$STEPS" 'BEGIN { printf "%.1f", (a - b) / n }'
}
if [ "$CPU" = 1 ]; then
  summary=$WORK/summary.txt
  vals=$WORK/cpu-values.txt # "amp threads side ms" per measurement, for the medians
  : > "$summary"
  : > "$vals"
  [ "$TORCH" = 1 ] && torch_core | tee -a "$summary"
  round=0
  while [ "$round" -lt "$ROUNDS" ]; do
    round=$((round + 1))
    for amp in $AMP; do
      for n in $THREADS; do
        load0=$(cut -d' ' -f1 /proc/loadavg)
        CPU_LOG=$WORK/cpu-loom-$amp-$n.log
        # shellcheck disable=SC2086
        loom_ms=$(cpu_step "$LOOM" train $shape --threads "$n" --amp "$amp" --lr 3e-4 \
                    --init "$init" --max-steps)
        echo "$amp $n loom $loom_ms" >> "$vals"
        line="round $round, threads $n, CPU ms a step: loom $amp $loom_ms ($(tps "$loom_ms") tokens/CPU s)"
        if [ "$LLMC" = 1 ] && [ "$amp" = off ]; then
          CPU_LOG=$WORK/cpu-llmc-$n.log
          llmc_ms=$(OMP_NUM_THREADS=$n cpu_step "$src/llmc_steps" "$WORK/model.llmc.bin" \
                      "$WORK/train.llmc.bin" "$B" "$T")
          echo "$amp $n llmc $llmc_ms" >> "$vals"
          line="$line, llm.c $llmc_ms ($(tps "$llmc_ms")), loom/llm.c $(awk -v a="$llmc_ms" -v b="$loom_ms" 'BEGIN { printf "%.2f", a / b }')x"
        fi
        if [ "$TORCH" = 1 ]; then
          CPU_LOG=$WORK/cpu-torch-$amp-$n.log
          torch_ms=$(cpu_step "$PY" "$HERE/llmc/llmc_files.py" torch "$init" --layers "$L" \
                       --heads "$H" --context "$T" --batch "$B" --threads "$n" --amp "$amp" --steps)
          echo "$amp $n torch $torch_ms" >> "$vals"
          line="$line, torch $amp $torch_ms ($(tps "$torch_ms")), loom/torch $(awk -v a="$torch_ms" -v b="$loom_ms" 'BEGIN { printf "%.2f", a / b }')x"
        fi
        if [ "$AVX2" = 1 ]; then # loom again on this CPU capped to AVX2 (OpenBLAS's too)
          CPU_LOG=$WORK/cpu-avx2-$amp-$n.log
          # shellcheck disable=SC2086
          avx2_ms=$(LOOM_CPU=avx2 ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell \
                      cpu_step "$LOOM" train $shape --threads "$n" --amp "$amp" --lr 3e-4 \
                      --init "$init" --max-steps)
          echo "$amp $n avx2 $avx2_ms" >> "$vals"
          line="$line, loom avx2 $amp $avx2_ms ($(tps "$avx2_ms"))"
        fi
        echo "$line; load $load0-$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$summary"
      done
    done
  done
  # medians over the rounds, and the ratios of the medians
  awk '{ k = $1 " " $2 " " $3; v[k] = v[k] " " $4 }
       END { for (k in v) print k v[k] }' "$vals" | sort | while read -r amp n side ms; do
    med=$(echo "$ms" | tr ' ' '\n' | sort -g | awk '{ x[NR] = $1 } END {
            print NR % 2 ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2 }')
    echo "$amp $n $side $med"
  done > "$WORK/cpu-medians.txt"
  med() { awk -v a="$1" -v n="$2" -v s="$3" '$1 == a && $2 == n && $3 == s { print $4 }' "$WORK/cpu-medians.txt"; }
  for n in $THREADS; do
    for amp in $AMP; do
      l=$(med "$amp" "$n" loom)
      line="medians of $ROUNDS, threads $n, $amp: loom $l ms ($(tps "$l") tokens/CPU s)"
      for side in llmc torch avx2; do
        x=$(med "$amp" "$n" "$side")
        [ -n "$x" ] || continue
        line="$line, $side $x ms ($(tps "$x"))"
        [ "$side" = avx2 ] || line="$line, loom/$side $(awk -v a="$x" -v b="$l" 'BEGIN { printf "%.2f", a / b }')x"
      done
      echo "$line" | tee -a "$summary"
    done
    f=$(med off "$n" avx2) h=$(med bf16 "$n" avx2)
    [ -n "$f" ] && [ -n "$h" ] &&
      echo "medians, threads $n: loom avx2 bf16 / loom avx2 f32 speed $(awk -v a="$f" -v b="$h" 'BEGIN { printf "%.2f", a / b }')x" |
        tee -a "$summary"
  done
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
  exit 0
fi

summary=$WORK/summary.txt
: > "$summary"
# the OpenBLAS core behind torch's f32 GEMMs: a generic fallback (Prescott) would make PyTorch
# look several times slower than it is (a fair baseline names it)
[ "$TORCH" = 1 ] && torch_core | tee -a "$summary"
for n in $THREADS; do
  # loom
  m=$WORK/loom-$n.jsonl
  rm -f "$m"
  # shellcheck disable=SC2086
  "$LOOM" train $shape --threads "$n" --amp "$AMP" --max-steps "$RUNS" --lr 3e-4 \
    --init "$init" --metrics "$m" > "$WORK/loom-$n.log" 2>&1 || { cat "$WORK/loom-$n.log"; exit 1; }
  loom_ms=$(sed -n 's/.*"samples_per_s": \([0-9.e+-]*\).*/\1/p' "$m" |
            awk -v b="$B" '{ printf "%.6f\n", 1000 * b / $1 }' | median)
  echo "loom ($AMP) threads $n: step times (ms): $(sed -n 's/.*"samples_per_s": \([0-9.e+-]*\).*/\1/p' "$m" |
            awk -v b="$B" '{ printf "%.0f ", 1000 * b / $1 }')"
  line="threads $n: loom $AMP $(tps "$loom_ms") tokens/s (${loom_ms%.*} ms/step)"
  # llm.c
  if [ "$LLMC" = 1 ]; then
    OMP_NUM_THREADS=$n "$src/llmc_steps" "$WORK/model.llmc.bin" "$WORK/train.llmc.bin" "$B" "$T" \
      "$RUNS" > "$WORK/llmc-$n.log" 2>&1 || { cat "$WORK/llmc-$n.log"; exit 1; }
    llmc_ms=$(sed -n 's/.*(took \([0-9.]*\) ms).*/\1/p' "$WORK/llmc-$n.log" | median)
    echo "llm.c threads $n: $(grep -m1 'omp threads' "$WORK/llmc-$n.log"); step times (ms):" \
         "$(sed -n 's/.*(took \([0-9.]*\) ms).*/\1/p' "$WORK/llmc-$n.log" | awk '{ printf "%.0f ", $1 }')"
    line="$line, llm.c $(tps "$llmc_ms") tokens/s (${llmc_ms%.*} ms)"
    line="$line, loom/llm.c $(awk -v a="$llmc_ms" -v b="$loom_ms" 'BEGIN { printf "%.2f", a / b }')x"
  fi
  if [ "$TORCH" = 1 ]; then
    "$PY" "$HERE/llmc/llmc_files.py" torch "$init" --layers "$L" --heads "$H" --context "$T" \
      --batch "$B" --threads "$n" --steps "$RUNS" --amp "$AMP" > "$WORK/torch-$n.log" 2>&1 ||
      { cat "$WORK/torch-$n.log"; exit 1; }
    torch_ms=$(sed -n 's/.*(took \([0-9.]*\) ms).*/\1/p' "$WORK/torch-$n.log" | median)
    echo "torch $AMP threads $n: $(head -1 "$WORK/torch-$n.log"); step times (ms):" \
         "$(sed -n 's/.*(took \([0-9.]*\) ms).*/\1/p' "$WORK/torch-$n.log" | awk '{ printf "%.0f ", $1 }')"
    line="$line, torch $AMP $(tps "$torch_ms") tokens/s (${torch_ms%.*} ms), loom/torch $(awk -v a="$torch_ms" -v b="$loom_ms" 'BEGIN { printf "%.2f", a / b }')x"
  fi
  echo "$line" | tee -a "$summary"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "summary:"
cat "$summary"
