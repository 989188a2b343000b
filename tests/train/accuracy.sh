#!/bin/sh
# accuracy.sh: the runs behind issue 6's "done when" (README's Training section, BENCHMARKS.md):
# Fashion-MNIST, MLP 784-1024-1024-10, AdamW, batch 256, 10 epochs in f32, bf16 autocast and
# f16 autocast with dynamic scaling; the CNN for 10 epochs; and PyTorch 1.13 on the same MLP
# for its samples/s (1 thread each: PyTorch's OpenBLAS pool is capped too, OPENBLAS_NUM_THREADS).
# Takes a long while (the CNN alone about 10-15 minutes on one core). Not a ctest.
# Usage: tests/train/accuracy.sh [build dir] [log dir]
set -u
BUILD=${1:-build}
LOG=${2:-/tmp/loom-accuracy}
mkdir -p "$LOG"
run() { name=$1; shift; echo "== $name: $*"; "$@" > "$LOG/$name.log" 2>&1; tail -1 "$LOG/$name.log"; }
run mlp-f32 "$BUILD/tools/loom" train --threads 1 --epochs 10 --metrics "$LOG/mlp-f32.jsonl"
run mlp-bf16 "$BUILD/tools/loom" train --threads 1 --epochs 10 --amp bf16
run mlp-f16 "$BUILD/tools/loom" train --threads 1 --epochs 10 --amp f16 --metrics "$LOG/mlp-f16.jsonl"
run cnn-f32 "$BUILD/tools/loom" train --threads 1 --epochs 10 --model cnn
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  # 1 thread in both of PyTorch's pools (torch_train.py caps them too and logs the counts)
  tpy="env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 /usr/bin/python3"
  run torch-f32 $tpy "$(dirname "$0")/torch_train.py" f32 1
  # the OpenBLAS core torch ran on (torch_threads.cap replaces a generic fallback core)
  grep -m1 '^torch_threads' "$LOG/torch-f32.log"
  run torch-bf16 $tpy "$(dirname "$0")/torch_train.py" bf16 1
  run loom-f32-1epoch "$BUILD/tools/loom" train --threads 1 --epochs 1
  run loom-bf16-1epoch "$BUILD/tools/loom" train --threads 1 --epochs 1 --amp bf16
fi
