#!/bin/sh
# gpustall's Slurm Prolog (slurm.conf: Prolog=/usr/share/gpustall/slurm/gpustall-prolog.sh):
# starts `gpustall trace --slurm-job $SLURM_JOB_ID --report-to-job` for the job on this node,
# detached, and returns once it is attached and waiting for the job's first task. The trace
# ends by itself when the job's processes are gone; gpustall-epilog.sh waits for it.
#
# Settings, from the environment or /etc/default/gpustall-slurm (a shell file):
#   GPUSTALL_BIN         the binary                  (default: gpustall on PATH)
#   GPUSTALL_SLURM_DIR   where each job's bundle goes (default: /var/lib/gpustall/slurm)
#   GPUSTALL_SLURM_ARGS  more `gpustall trace` flags (default: none; e.g. --no-gpu, --py-stacks 19)
#
# It never fails the job: a Prolog that exits non-zero drains the node. Whatever goes wrong is
# in $GPUSTALL_SLURM_DIR/job-$SLURM_JOB_ID/gpustall.log.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
[ -r /etc/default/gpustall-slurm ] && . /etc/default/gpustall-slurm
bin=${GPUSTALL_BIN:-gpustall}
root=${GPUSTALL_SLURM_DIR:-/var/lib/gpustall/slurm}
job=${SLURM_JOB_ID:-}
case $job in '' | *[!0-9]*) exit 0 ;; esac
dir=$root/job-$job
umask 077
mkdir -p "$dir" || exit 0
# A Prolog rerun for the same job (a requeue) traces the new run.
[ -s "$dir/gpustall.pid" ] && mv -f "$dir" "$dir.$(date +%s)" && mkdir -p "$dir"
# setsid: slurmd kills the Prolog's process group when the Prolog returns.
# shellcheck disable=SC2086 # GPUSTALL_SLURM_ARGS is a list of flags
setsid "$bin" trace --quiet --slurm-job "$job" --report-to-job \
    --record "$dir/recording.jsonl" --summary-json "$dir/summary.json" $GPUSTALL_SLURM_ARGS \
    </dev/null >"$dir/report.txt" 2>"$dir/gpustall.log" &
echo $! >"$dir/gpustall.pid"
# The job's tasks start when this script returns: wait (at most 30 s) until gpustall is
# attached and watching the job's cgroups, so that none starts untraced.
i=0
while [ $i -lt 150 ] && kill -0 "$(cat "$dir/gpustall.pid")" 2>/dev/null; do
    grep -q "waiting for Slurm job" "$dir/gpustall.log" 2>/dev/null && break
    sleep 0.2
    i=$((i + 1))
done
exit 0
