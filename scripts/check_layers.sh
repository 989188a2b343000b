#!/usr/bin/env bash
# check_layers.sh: fails if any file includes a header of a layer it may not use (DESIGN.md,
# "Layers"). A layer is known by its folder (src/<layer>/, or include/loom/<header>.h for the
# public headers); tools/ and examples/ may use public headers only (tests/ and bench/ may
# also reach private ones, to check and time kernels directly).
set -u
cd "$(dirname "$0")/.."

# The layer a public header belongs to.
declare -A header_layer=(
  [status]=core [layout]=core [alloc]=core [dtype]=core [cpu]=core [tensor]=core [rng]=core [threadpool]=core [check]=core [version]=core [scope]=core
  [autocast]=autocast [ops]=ops [autograd]=autograd [amp]=amp [scaler]=amp [nn]=nn [gpt]=nn [optim]=optim
  [dist]=dist [dist_mpi]=dist [ddp]=ddp [fsdp]=fsdp [io]=io [step]=step [loom]=all
)
# The layers each layer may include (itself included).
declare -A allowed=(
  [core]="core"
  [autocast]="core autocast"
  [ops]="core autocast ops autograd"
  [autograd]="core autocast ops autograd"
  [amp]="core autocast ops autograd amp"
  [nn]="core autocast ops autograd amp nn"
  [optim]="core optim"
  [dist]="core dist"
  [ddp]="core autocast ops autograd amp nn optim dist ddp"
  [fsdp]="core autocast ops autograd amp nn optim dist io fsdp"
  [io]="core io"
  [step]="core autocast ops autograd amp nn optim dist ddp fsdp io step"
)

layer_of_file() { # path -> layer
  local f=$1
  case $f in
    src/*) f=${f#src/}; echo "${f%%/*}" ;;
    include/loom/*) local h=${f#include/loom/}; echo "${header_layer[${h%.h}]:-unknown}" ;;
    *) echo public ;;
  esac
}

layer_of_include() { # include path -> layer
  local inc=$1
  case $inc in
    loom/*) local h=${inc#loom/}; echo "${header_layer[${h%.h}]:-unknown}" ;;
    */*) echo "${inc%%/*}" ;;
    *) echo local ;;
  esac
}

bad=0
while IFS= read -r f; do
  from=$(layer_of_file "$f")
  [ "$from" = all ] && continue
  while IFS= read -r inc; do
    to=$(layer_of_include "$inc")
    [ "$to" = local ] && continue
    if [ "$from" = public ]; then
      case $inc in loom/*) continue ;; esac
      # tests, and benchmarks that time a private kernel level by level against its peer
      # (bench_kernels.c, bench_matmul.c's oneDNN-vs-OpenBLAS table), may reach private headers
      # of any layer; tools and examples may not.
      case $f in tests/*|bench/*) continue ;; esac
      echo "layering: $f includes private header \"$inc\" (only loom/*.h is public)"; bad=1; continue
    fi
    [ "$to" = all ] && { echo "layering: $f includes the umbrella \"$inc\""; bad=1; continue; }
    ok=0
    for a in ${allowed[$from]:-}; do [ "$a" = "$to" ] && ok=1; done
    if [ $ok = 0 ]; then
      echo "layering: $f (layer $from) includes \"$inc\" (layer $to)"; bad=1
    fi
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
done < <(git ls-files -co --exclude-standard -- 'src/*.[ch]' 'include/*.h' 'tools/*.[ch]' 'examples/*.c' 'bench/*.[ch]' 'tests/*.[ch]' 2>/dev/null)

if [ $bad = 0 ]; then echo "layering: ok"; fi
exit $bad
