#!/bin/bash
# Runs inside a `cargo xtask vm-test` guest, as root, on the host's files (read-only over 9p).
# Usage: guest.sh PLAN   (PLAN: written by xtask; lines of TAB-separated fields:
#   cgroup v1|v2     which memory cgroup hierarchy to mount
#   env KEY=VALUE    exported for the tests
#   cwd DIR          where the test binaries run (their crate's directory, as cargo does)
#   test NAME EXE ARGS...   a test binary and its libtest arguments)
# Everything it reports is a line starting with @@ on the serial console, read by xtask.
set -u
PLAN=$1
now() { cut -d' ' -f1 /proc/uptime; }
echo "@@GUEST-START uptime=$(now) kernel=$(uname -r)"
mkdir -p /run/lock /dev/shm /dev/pts
# What a booted system has and the tests use: shared memory (Python's multiprocessing), the
# loopback interface (watch's metrics endpoint), a host name.
mount -t tmpfs -o mode=1777 shm /dev/shm
mount -t devpts devpts /dev/pts 2>/dev/null
ip link set lo up 2>/dev/null || busybox ifconfig lo 127.0.0.1 up
hostname "vm-$(uname -r | cut -d- -f1)"

# A scratch disk (the one virtio disk) for /var/tmp: block I/O and swap files need a real block
# device (a swap file on tmpfs or overlay does not work).
DISK=
for b in /sys/block/vd*; do [ -e "$b" ] && DISK=/dev/$(basename "$b"); done
if [ -n "$DISK" ] && mkfs.ext4 -q -F "$DISK" >/dev/null 2>&1; then
  mkdir -p /run/vmdisk && mount -o noatime "$DISK" /run/vmdisk
  mkdir -p /run/vmdisk/vartmp && chmod 1777 /run/vmdisk/vartmp
  mount --bind /run/vmdisk/vartmp /var/tmp
  echo "@@FACT disk $DISK ext4 on /var/tmp"
else
  echo "@@FACT disk none (no virtio disk or mkfs.ext4 failed)"
fi

CGROUP=v2
while IFS=$'\t' read -r kind a rest; do
  case $kind in
    cgroup) CGROUP=$a ;;
    env) export "$a" ;;
    cwd) cd "$a" || echo "@@FATAL cannot cd $a" ;;
  esac
done < "$PLAN"
case $CGROUP in
  v1)
    mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup
    mkdir -p /sys/fs/cgroup/memory
    if mount -t cgroup -o memory memory /sys/fs/cgroup/memory; then
      echo "@@FACT cgroup v1 memory"
    else
      echo "@@FACT cgroup v1 memory unavailable"
    fi
    ;;
  *)
    mount -t cgroup2 none /sys/fs/cgroup
    echo "@@FACT cgroup v2 $(cat /sys/fs/cgroup/cgroup.controllers)"
    ;;
esac
[ -e /sys/kernel/btf/vmlinux ] && echo "@@FACT btf yes" || echo "@@FACT btf no"
echo "@@FACT cpus online=$(cat /sys/devices/system/cpu/online) possible=$(cat /sys/devices/system/cpu/possible)"

# Under software emulation a guest now and then locks up or oopses (int3 in `__schedule`,
# `__hrtimer_run_queues`) while gpustall attaches: the first probe on a tracepoint flips its
# static key, which rewrites kernel text live on both vCPUs, and qemu's multi-threaded TCG
# loses that race now and then (never seen on real hardware). Enabled here once, on an idle
# guest, through ftrace with its ring buffer off (nothing is recorded), the keys stay on: the
# tests' attaches and detaches then only add and remove probes, with no text patched. The
# tracepoints are gpustall-ebpf's (gpustall/src/kernel/probes.rs); a missing one is skipped.
T=/sys/kernel/tracing
[ -d $T/events ] || T=/sys/kernel/debug/tracing
if [ -w $T/tracing_on ]; then
  echo 0 > $T/tracing_on
  pinned=0
  for ev in task/task_newtask task/task_rename sched/sched_process_exit sched/sched_process_exec \
    sched/sched_waking sched/sched_switch oom/mark_victim signal/signal_generate \
    vmscan/mm_vmscan_direct_reclaim_begin vmscan/mm_vmscan_direct_reclaim_end \
    vmscan/mm_vmscan_memcg_reclaim_begin vmscan/mm_vmscan_memcg_reclaim_end \
    vmscan/mm_vmscan_kswapd_wake vmscan/mm_vmscan_kswapd_sleep vmscan/mm_vmscan_wakeup_kswapd \
    vmscan/mm_vmscan_write_folio vmscan/mm_vmscan_writepage vmscan/mm_vmscan_throttled \
    block/block_bio_remap block/block_bio_queue block/block_io_start block/block_io_done \
    block/block_rq_complete timer/hrtimer_expire_entry timer/hrtimer_expire_exit; do
    [ -w $T/events/$ev/enable ] && echo 1 > $T/events/$ev/enable && pinned=$((pinned + 1))
  done
  echo "@@FACT tracepoint keys pinned on (ftrace, ring buffer off): $pinned"
else
  echo "@@FACT tracepoint keys not pinned (no tracefs)"
fi

while IFS=$'\t' read -r kind name exe rest; do
  [ "$kind" = test ] || continue
  export GPUSTALL_VM_DEGRADED=/run/degraded-$name
  : > "$GPUSTALL_VM_DEGRADED"
  # A binary whose tests failed runs once more: a test that then passes is reported as flaky
  # (its first failure printed), not as passed.
  for try in 1 2; do
    echo "@@BEGIN $name uptime=$(now)"
    t0=$(now)
    # shellcheck disable=SC2086
    "$exe" $rest </dev/null 2>&1
    rc=$?
    echo "@@END $name rc=$rc secs=$(echo "$(now) $t0" | awk '{printf "%.1f", $1 - $2}')"
    [ $rc -eq 0 ] || [ $try -eq 2 ] && break
    echo "@@RETRY $name rc=$rc"
  done
  while IFS=$'\t' read -r test what; do
    echo "@@DEGRADED $name $test $what"
  done < "$GPUSTALL_VM_DEGRADED"
done < "$PLAN"
echo "@@GUEST-DONE uptime=$(now)"
