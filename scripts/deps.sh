#!/usr/bin/env bash
# deps.sh: installs, with apt-get, whatever loom needs that this Debian machine lacks.
# Idempotent: it checks each package first and says what it installs. Run by `make demo`
# and `make check` before they build.
set -eu
need=(build-essential cmake pkg-config zlib1g-dev libdnnl-dev libopenblas-dev
      openmpi-bin libopenmpi-dev dataset-fashion-mnist fortunes)
# fortunes: the English fortunes in /usr/share/games/fortunes (LOOM_FORTUNES_DIR), the default
# text of `loom train --model gpt`, as dataset-fashion-mnist is the default data of the MLP.
# Fuzzing (make fuzz, make check-fuzz): Debian's clang and its libFuzzer runtime.
[ "${LOOM_WITH_FUZZ:-0}" = 1 ] && need+=(clang libclang-rt-14-dev)
# MPICH beside Open MPI (make check-mpich): its compiler wrapper, library and hydra launcher.
[ "${LOOM_WITH_MPICH:-0}" = 1 ] && need+=(mpich libmpich-dev)
# Optional: PyTorch is the side-by-side baseline of the benchmarks and of the GPT's parity test
# (tests/train/gpt_torch_parity.sh, skipped without it), never a dependency of loom. Not by
# default (221 packages, 788 MB, about 2 minutes here); CI asks for it (.ci/run).
# Best effort: if it cannot be installed, the tests that need it skip and say why.
optional=()
[ "${LOOM_WITH_TORCH:-0}" = 1 ] && optional+=(python3-torch)
# Optional: Chromium renders `loom plot`'s SVG in a real browser for tests/tools/plot_browser.sh
# (ctest plot_browser, skipped without it). About 2 minutes to install here; CI asks for it.
[ "${LOOM_WITH_BROWSER:-0}" = 1 ] && optional+=(chromium)
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=() missing_optional=()
for p in "${need[@]}"; do installed "$p" || missing+=("$p"); done
for p in "${optional[@]}"; do installed "$p" || missing_optional+=("$p"); done
if [ ${#missing[@]} -eq 0 ] && [ ${#missing_optional[@]} -eq 0 ]; then
  echo "deps: everything loom needs is installed"
  exit 0
fi
echo "deps: installing ${missing[*]} ${missing_optional[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
[ ${#missing[@]} -eq 0 ] || $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
if [ ${#missing_optional[@]} -gt 0 ]; then
  $SUDO apt-get install -y -qq --no-install-recommends "${missing_optional[@]}" ||
    echo "deps: could not install ${missing_optional[*]}: the tests that need it skip"
fi
