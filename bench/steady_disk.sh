#!/usr/bin/env bash
# steady_disk.sh: bench_offload's disk-tier configurations on a disk whose rate holds still, so
# that "step / floor" measures loom and not the disk. A virtual machine's disk moves by 2x
# within minutes (the floor of one step's traffic took 0.94-2.37 s in one hour on a Zen 3 VM),
# which buries a 1.2 target. Here the tier lives on an ext4 file system on a loop device over a
# file in RAM (/dev/shm), throttled by the kernel's block throttle to MBPS megabytes per second
# for reads and as many for writes (cgroup v1 blkio.throttle.{read,write}_bps_device on the root
# group, which every writer is in, the kernel's writeback included; or cgroup v2 io.max in a
# child group of the benchmark's own). bench_offload is told the rate
# (LOOM_BENCH_DEVICE_MBPS) and reports the floor that rate sets beside its replays': the larger
# of the step's reads and writes over it. Reads and writes are throttled apart, so the device
# can do both at once at full rate: a floor no real disk that shares its bandwidth has, and
# stricter for the step than one that did.
#
# The loop device's copies take CPU from the step's two cores (a real disk's DMA does not);
# the replays pay them too.
#
# Usage (as root): bench/steady_disk.sh [BENCH_OFFLOAD] [MBPS] [STEPS] [ROUNDS] [CONFIGS]
#   defaults: build/bench/bench_offload 1000 5 3 "disk p1,disk p0"
set -u
bench=${1:-build/bench/bench_offload}
mbps=${2:-1000}
steps=${3:-5}
rounds=${4:-3}
configs=${5:-disk p1,disk p0}
[ "$(id -u)" = 0 ] || { echo "steady_disk.sh: needs root (losetup, mount, cgroups)"; exit 2; }
[ -x "$bench" ] || { echo "steady_disk.sh: no benchmark at $bench (build it first)"; exit 2; }

work=$(mktemp -d /tmp/loom-steady.XXXXXX) || exit 1
img=/dev/shm/loom-steady-$$.img
loopdev="" cg="" majmin=""
cleanup() {
  [ -n "$cg" ] && rmdir "$cg" 2>/dev/null
  if [ -n "$majmin" ] && [ -w /sys/fs/cgroup/blkio/blkio.throttle.read_bps_device ]; then
    echo "$majmin 0" > /sys/fs/cgroup/blkio/blkio.throttle.read_bps_device
    echo "$majmin 0" > /sys/fs/cgroup/blkio/blkio.throttle.write_bps_device
  fi
  if [ -n "$loopdev" ]; then
    umount "$work/mnt" 2>/dev/null
    losetup -d "$loopdev"
  fi
  rm -f "$img"
  rm -rf "$work"
}
trap cleanup EXIT

# 4 GiB: two ranks' tier files (750-810 MB each) and the replays' files beside them
truncate -s 4G "$img" && loopdev=$(losetup -f --show "$img") || exit 1
mkfs.ext4 -q "$loopdev" && mkdir -p "$work/mnt" && mount "$loopdev" "$work/mnt" || exit 1
majmin=$(cat "/sys/block/$(basename "$loopdev")/dev")
bps=$((mbps * 1000000))

run=("$bench" "$work/mnt" "$steps" "$rounds" "$configs")
if [ -w /sys/fs/cgroup/blkio/blkio.throttle.read_bps_device ]; then
  echo "$majmin $bps" > /sys/fs/cgroup/blkio/blkio.throttle.read_bps_device &&
    echo "$majmin $bps" > /sys/fs/cgroup/blkio/blkio.throttle.write_bps_device || exit 1
  echo "steady_disk: $loopdev ($majmin) over $img, ext4, $mbps MB/s each way (cgroup v1 blkio throttle)"
  LOOM_BENCH_DEVICE_MBPS=$mbps "${run[@]}"
elif grep -qw io /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
  echo "+io" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
  cg=/sys/fs/cgroup/loom-steady-$$
  mkdir "$cg" && echo "$majmin rbps=$bps wbps=$bps" > "$cg/io.max" || exit 1
  echo "steady_disk: $loopdev ($majmin) over $img, ext4, $mbps MB/s each way (cgroup v2 io.max)"
  ( echo $BASHPID > "$cg/cgroup.procs" && LOOM_BENCH_DEVICE_MBPS=$mbps exec "${run[@]}" )
else
  echo "steady_disk.sh: no block throttle here (neither cgroup v1 blkio nor v2 io)"; exit 2
fi
