#!/usr/bin/env bash
# offload_memlimit.sh: a model whose training state is larger than a memory limit put on the
# process trains under that limit with the disk tier of FSDP offload, and ends bit for bit where
# the same run without offload and without a limit ends (the model file and the sharded
# checkpoint: parameters and AdamW state).
#
# Model: MLP 784-4096x4-10 (53.6 M parameters: 858 MB of f32 AdamW training state), FSDP on one
# rank, batch 64, 4 steps, saved at the end. Under the limit the run stops after 2 steps (saved),
# and a second process resumes it from that sharded checkpoint for the last 2, so loading a
# checkpoint must fit under the limit too. The limit (default 760 MiB, below the state) is a
# memory cgroup: cgroup v2's memory.max when the unified hierarchy has the memory controller,
# else cgroup v1's memory.limit_in_bytes (memsw too, so swap does not absorb it), else
# `systemd-run --scope -p MemoryMax=` when systemd runs. It says which it used, the cgroup's
# peak usage and whether the kernel's OOM killer fired.
#
# Usage: bench/offload_memlimit.sh [LOOM_BINARY] [LIMIT_MIB] [SCRATCH_DIR]   (as root)
set -u
loom=${1:-build/tools/loom}
limit_mib=${2:-760}
scratch=${3:-/var/tmp/loom-memlimit}
args=(train --ranks 1 --strategy fsdp --hidden 4096,4096,4096,4096 --batch 64 --epochs 1 --quiet)
rm -rf "$scratch" && mkdir -p "$scratch/off" || exit 1

echo "== without offload, no limit"
"$loom" "${args[@]}" --max-steps 4 --save "$scratch/free" || exit 1

bytes=$((limit_mib * 1024 * 1024))
cg=""
if grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
  cg=/sys/fs/cgroup/loom-memlimit-$$
  mkdir "$cg" && echo "$bytes" > "$cg/memory.max" && echo 0 > "$cg/memory.swap.max" 2>/dev/null
  how="cgroup v2 memory.max = $limit_mib MiB"
elif [ -d /sys/fs/cgroup/memory ]; then
  cg=/sys/fs/cgroup/memory/loom-memlimit-$$
  mkdir "$cg" && echo "$bytes" > "$cg/memory.limit_in_bytes"
  echo "$bytes" > "$cg/memory.memsw.limit_in_bytes" 2>/dev/null
  how="cgroup v1 memory.limit_in_bytes = $limit_mib MiB"
fi
# one command under the limit: in the cgroup, or in a systemd scope
limited() {
  if [ -n "$cg" ]; then
    ( echo $BASHPID > "$cg/cgroup.procs" && exec "$@" )
  else
    systemd-run --scope -q -p MemoryMax="${limit_mib}M" -p MemorySwapMax=0 "$@"
  fi
}
if [ -z "$cg" ]; then
  if command -v systemd-run >/dev/null && systemctl is-system-running >/dev/null 2>&1; then
    how="systemd-run --scope -p MemoryMax=${limit_mib}M"
  else
    echo "no memory cgroup and no systemd here: cannot put a limit on the process"; exit 2
  fi
fi
off=(--offload all --offload-tier disk --offload-dir "$scratch/off")
echo "== offload all to the disk tier, under $how: 2 steps, saved, then resumed for 2 more"
limited "$loom" "${args[@]}" --max-steps 2 "${off[@]}" --save "$scratch/limited"
rc=$?
if [ "$rc" = 0 ]; then
  limited "$loom" "${args[@]}" --max-steps 4 "${off[@]}" --resume "$scratch/limited" \
    --save "$scratch/limited"
  rc=$?
fi
if [ -n "$cg" ]; then
  if [ -f "$cg/memory.peak" ]; then peak=$(cat "$cg/memory.peak"); else peak=$(cat "$cg/memory.max_usage_in_bytes"); fi
  oom=$(grep -h oom_kill "$cg/memory.events" "$cg/memory.oom_control" 2>/dev/null | tr '\n' ' ')
  echo "cgroup peak usage $((peak / 1048576)) MiB of $limit_mib MiB; $oom"
  rmdir "$cg" 2>/dev/null
fi
[ "$rc" = 0 ] || { echo "the limited run failed (status $rc)"; exit 1; }
same=0
cmp "$scratch/free/model.safetensors" "$scratch/limited/model.safetensors" &&
  cmp "$scratch/free/fsdp/gen-1/rank-0-of-1.safetensors" \
      "$scratch/limited"/fsdp/gen-*/rank-0-of-1.safetensors && same=1
echo "model file and sharded checkpoint (parameters, AdamW state) identical: $([ $same = 1 ] && echo yes || echo NO)"
echo "offload files left: $(ls "$scratch/off" | wc -l)"
rm -rf "$scratch"
[ $same = 1 ]
