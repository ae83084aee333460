//! The process tree (newtask, exit, rename, exec) and how processes die (OOM kill, signals).

use aya_ebpf::{helpers::bpf_get_current_task, macros::tracepoint, programs::TracePointContext};
use gpustall_common::{
    counters::LostCounter,
    events::{
        EventKind, ExecEvent, ExitEvent, ForkEvent, OomVictimEvent, RenameEvent, SignalEvent,
    },
};

use crate::common::{
    comm_field, data_loc_str, emit, field, header, is_tracked, offset, pid_tgid, Wake,
    RECLAIM_START, TRACKED,
};

const CLONE_THREAD: u64 = 0x0001_0000;

/// task:task_newtask fires in the parent with the new task's clone flags, which is how a new
/// process is told from a new thread (sched_process_fork cannot tell them apart).
#[tracepoint]
pub fn task_newtask(ctx: TracePointContext) -> u32 {
    let (tgid, tid) = pid_tgid();
    if !is_tracked(tgid) {
        return 0;
    }
    let flags: u64 = field(&ctx, offset!(newtask_clone_flags)).unwrap_or(0);
    if flags & CLONE_THREAD != 0 {
        return 0;
    }
    let Some(child) = field::<i32>(&ctx, offset!(newtask_pid)) else {
        return 0;
    };
    let child = child as u32;
    if TRACKED.insert(child, 1, 0).is_err() {
        crate::common::add_lost(LostCounter::MapFull);
    }
    emit(
        ForkEvent {
            header: header(EventKind::Fork, tgid, tid),
            child_pid: child,
            _pad: 0,
            clone_flags: flags,
        },
        Wake::Later,
    );
    0
}

#[tracepoint]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    let (tgid, tid) = pid_tgid();
    // A thread can die inside reclaim (SIGKILL during an allocation): drop its pairing state.
    // A lookup first: a delete takes the bucket lock even when there is nothing to delete,
    // and almost no thread exits inside reclaim.
    // SAFETY: presence test.
    if unsafe { RECLAIM_START.get(tid) }.is_some() {
        let _ = RECLAIM_START.remove(tid);
    }
    if !is_tracked(tgid) {
        return 0;
    }
    // The process is gone when its last thread exits; kernels without `group_dead` in the
    // format get the leader's exit instead.
    let group_dead = match field::<u8>(&ctx, offset!(exit_group_dead)) {
        Some(v) => v != 0,
        None => tid == tgid,
    };
    if !group_dead {
        return 0;
    }
    let off = offset!(task_exit_code);
    let (exit_code, known) = if off == u32::MAX {
        (0, 0)
    } else {
        let task = unsafe { bpf_get_current_task() } as *const u8;
        // SAFETY: the offset is task_struct.exit_code from this kernel's BTF; probe_read checks.
        match unsafe {
            aya_ebpf::helpers::bpf_probe_read_kernel(task.add(off as usize) as *const u32)
        } {
            Ok(v) => (v, 1),
            Err(_) => (0, 0),
        }
    };
    emit(
        ExitEvent { header: header(EventKind::Exit, tgid, tid), exit_code, exit_code_known: known },
        Wake::Later,
    );
    let _ = TRACKED.remove(tgid);
    0
}

/// task:task_rename: PR_SET_NAME (how PyTorch names its workers), /proc/PID/comm writes, exec.
#[tracepoint]
pub fn task_rename(ctx: TracePointContext) -> u32 {
    let (tgid, tid) = pid_tgid();
    let pid = field::<i32>(&ctx, offset!(rename_pid)).unwrap_or(0) as u32;
    if !is_tracked(tgid) && !is_tracked(pid) {
        return 0;
    }
    emit(
        RenameEvent {
            header: header(EventKind::Rename, tgid, tid),
            pid,
            _pad: 0,
            new_comm: comm_field(&ctx, offset!(rename_newcomm)),
        },
        Wake::Later,
    );
    0
}

#[tracepoint]
pub fn sched_process_exec(ctx: TracePointContext) -> u32 {
    let (tgid, tid) = pid_tgid();
    if !is_tracked(tgid) {
        return 0;
    }
    emit(
        ExecEvent {
            header: header(EventKind::Exec, tgid, tid),
            old_pid: field::<i32>(&ctx, offset!(exec_old_pid)).unwrap_or(0) as u32,
            _pad: 0,
            filename: data_loc_str::<64>(&ctx, offset!(exec_filename)),
        },
        Wake::Later,
    );
    0
}

/// oom:mark_victim runs in the task that invoked the OOM killer. Recorded when either the
/// trigger or the victim is tracked: a worker of the job can be killed for another's allocation.
#[tracepoint]
pub fn mark_victim(ctx: TracePointContext) -> u32 {
    let (tgid, tid) = pid_tgid();
    let Some(victim) = field::<i32>(&ctx, offset!(oom_pid)) else {
        return 0;
    };
    let victim = victim as u32;
    if !is_tracked(tgid) && !is_tracked(victim) {
        return 0;
    }
    let anon = field::<u64>(&ctx, offset!(oom_anon_rss));
    emit(
        OomVictimEvent {
            header: header(EventKind::OomVictim, tgid, tid),
            victim_pid: victim,
            has_rss: anon.is_some() as u32,
            total_vm_kb: field(&ctx, offset!(oom_total_vm)).unwrap_or(0),
            anon_rss_kb: anon.unwrap_or(0),
            file_rss_kb: field(&ctx, offset!(oom_file_rss)).unwrap_or(0),
            shmem_rss_kb: field(&ctx, offset!(oom_shmem_rss)).unwrap_or(0),
            oom_score_adj: field::<i16>(&ctx, offset!(oom_score_adj)).unwrap_or(0) as i32,
            uid: field(&ctx, offset!(oom_uid)).unwrap_or(0),
            victim_comm: data_loc_str::<16>(&ctx, offset!(oom_comm)),
        },
        Wake::Now,
    );
    0
}

/// Signals that end processes: SIGINT, SIGABRT, SIGBUS, SIGKILL, SIGSEGV, SIGTERM.
const FATAL_SIGNALS: u64 = (1 << 2) | (1 << 6) | (1 << 7) | (1 << 9) | (1 << 11) | (1 << 15);

/// signal:signal_generate runs in the sender: who killed whom (OOM killer, systemd-oomd,
/// kubelet, Slurm, torchrun).
#[tracepoint]
pub fn signal_generate(ctx: TracePointContext) -> u32 {
    let sig = field::<i32>(&ctx, offset!(sig_sig)).unwrap_or(0);
    if !(0..64).contains(&sig) || FATAL_SIGNALS & (1u64 << sig) == 0 {
        return 0;
    }
    let target = field::<i32>(&ctx, offset!(sig_pid)).unwrap_or(0) as u32;
    if !is_tracked(target) {
        return 0;
    }
    let (tgid, tid) = pid_tgid();
    emit(
        SignalEvent {
            header: header(EventKind::Signal, tgid, tid),
            sig,
            code: field(&ctx, offset!(sig_code)).unwrap_or(0),
            target_pid: target,
            result: field(&ctx, offset!(sig_result)).unwrap_or(0),
            target_comm: comm_field(&ctx, offset!(sig_comm)),
        },
        Wake::Now,
    );
    0
}
