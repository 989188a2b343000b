#!/bin/sh
# gpt_torch_parity.sh: the ctest of issue 25's parity with PyTorch (gpt_torch_parity.py has the
# details): `loom train --model gpt` (its default shape: 4 layers, 4 heads, 128 wide, context
# 128, batch 8, on the fortunes) and the same GPT-2 in PyTorch 1.13 from loom's initial weights
# and on the same windows, 50 steps of AdamW at a constant --lr 3e-4, per-step losses compared,
# in f32 and under bf16 autocast, 1 thread on each side. Skips (77) where /usr/bin/python3 has
# no torch (Debian's python3-torch; scripts/deps.sh installs it with LOOM_WITH_TORCH=1) or
# the fortunes are missing.
# Usage: tests/train/gpt_torch_parity.sh LOOM_BIN WORKDIR
set -u
LOOM=$1
WORK=$2
PY=/usr/bin/python3
HERE=$(dirname "$0")
if ! [ -x "$PY" ] || ! "$PY" -c "import torch" 2>/dev/null; then
  echo "skip: $PY cannot import torch (apt-get install python3-torch, or LOOM_WITH_TORCH=1 scripts/deps.sh)"
  exit 77
fi
if ! [ -d /usr/share/games/fortunes ]; then
  echo "skip: no /usr/share/games/fortunes (apt-get install fortunes)"
  exit 77
fi
# The OpenBLAS core behind torch's f32 matmul (MEASURED.md: an unrecognised CPU gets Prescott).
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}, $(OPENBLAS_VERBOSE=2 "$PY" -c "import torch" 2>&1 | grep -m1 Core)"
rc=0
for amp in off bf16; do
  "$PY" "$HERE/gpt_torch_parity.py" "$LOOM" "$WORK" --amp "$amp" --lr 3e-4 --threads 1 || rc=1
done
exit $rc
