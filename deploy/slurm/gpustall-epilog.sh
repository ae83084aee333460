#!/bin/sh
# gpustall's Slurm Epilog (slurm.conf: Epilog=/usr/share/gpustall/slurm/gpustall-epilog.sh):
# waits for the job's tracer (started by gpustall-prolog.sh) to write its verdict into the
# job's output and its bundle, so that the job leaves `squeue` only once the verdict is there.
# The tracer ends by itself a second after the job's last process; one still running after
# GPUSTALL_SLURM_EPILOG_WAIT seconds (default 20: a job that never started a task on this
# node, say) gets SIGTERM, which ends a trace with everything written.
#
# Settings as for gpustall-prolog.sh; it never fails the job.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
[ -r /etc/default/gpustall-slurm ] && . /etc/default/gpustall-slurm
root=${GPUSTALL_SLURM_DIR:-/var/lib/gpustall/slurm}
wait_s=${GPUSTALL_SLURM_EPILOG_WAIT:-20}
job=${SLURM_JOB_ID:-}
case $job in '' | *[!0-9]*) exit 0 ;; esac
pid=$(cat "$root/job-$job/gpustall.pid" 2>/dev/null) || exit 0
case $pid in '' | *[!0-9]*) exit 0 ;; esac
# Only this job's tracer: the pid may have been reused since.
ours() { tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "--slurm-job $job "; }
i=0
while ours && [ $i -lt $((wait_s * 5)) ]; do
    sleep 0.2
    i=$((i + 1))
done
ours && kill -TERM "$pid"
i=0
while ours && [ $i -lt 50 ]; do
    sleep 0.2
    i=$((i + 1))
done
exit 0
