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

while IFS=$'\t' read -r kind name exe rest; do
  [ "$kind" = test ] || continue
  export GPUSTALL_VM_DEGRADED=/run/degraded-$name
  : > "$GPUSTALL_VM_DEGRADED"
  echo "@@BEGIN $name uptime=$(now)"
  t0=$(now)
  # shellcheck disable=SC2086
  "$exe" $rest </dev/null 2>&1
  rc=$?
  echo "@@END $name rc=$rc secs=$(echo "$(now) $t0" | awk '{printf "%.1f", $1 - $2}')"
  while IFS=$'\t' read -r test what; do
    echo "@@DEGRADED $name $test $what"
  done < "$GPUSTALL_VM_DEGRADED"
done < "$PLAN"
echo "@@GUEST-DONE uptime=$(now)"
