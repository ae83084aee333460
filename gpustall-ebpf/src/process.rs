//! The process tree (newtask, exit, rename, exec) and how processes die (OOM kill, signals).

use aya_ebpf::{
    helpers::bpf_get_current_task,
    macros::{map, raw_tracepoint, tracepoint},
    maps::LruHashMap,
    programs::{RawTracePointContext, TracePointContext},
};
use gpustall_common::events::{
    EventKind, ExecEvent, ExitEvent, ForkEvent, OomVictimEvent, RenameEvent, SignalEvent, SI_KERNEL,
};

use crate::{
    common::{
        comm_field, current_ids, data_loc_str, emit, field, header, is_tracked, kread, offset,
        task_offset, Wake, RECLAIM_START,
    },
    diag::kdebug,
};

const CLONE_THREAD: u64 = 0x0001_0000;

/// task:task_newtask fires in the parent with the new task's clone flags, which is how a new
/// process is told from a new thread (sched_process_fork cannot tell them apart).
#[tracepoint]
pub fn task_newtask(ctx: TracePointContext) -> u32 {
    let (pid, tid) = current_ids();
    if !is_tracked(pid) {
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
    crate::common::track(child);
    emit(
        ForkEvent {
            header: header(EventKind::Fork, pid, tid),
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
    let (pid, tid) = current_ids();
    // A thread can die inside reclaim (SIGKILL during an allocation): drop its pairing state.
    // A lookup first: a delete takes the bucket lock even when there is nothing to delete,
    // and almost no thread exits inside reclaim.
    // SAFETY: presence test.
    if unsafe { RECLAIM_START.get(tid) }.is_some() {
        let _ = RECLAIM_START.remove(tid);
    }
    if !is_tracked(pid) {
        return 0;
    }
    // Its wait for data is over (its last switch-out may find its process untracked).
    crate::sched::thread_exit(pid, tid);
    // The process is gone when its last thread exits.
    if !group_dead(&ctx, pid, tid) {
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
            Err(_) => {
                kdebug!("the exit code of process {} is unreadable: sent as unknown", pid);
                (0, 0)
            }
        }
    };
    emit(
        ExitEvent { header: header(EventKind::Exit, pid, tid), exit_code, exit_code_known: known },
        Wake::Later,
    );
    crate::common::untrack(pid);
    0
}

/// Whether the exiting thread is its process's last. The format's `group_dead` where the kernel
/// has it (6.16+); else the thread group's count of live threads, which do_exit decrements
/// before this tracepoint (`signal->live`, offsets from BTF: a leader that exits while other
/// threads run, e.g. killed by de_thread() when another thread execs, leaves a live process);
/// else, without BTF, the leader's exit.
#[inline(always)]
fn group_dead(ctx: &TracePointContext, pid: u32, tid: u32) -> bool {
    if let Some(v) = field::<u8>(ctx, offset!(exit_group_dead)) {
        return v != 0;
    }
    // SAFETY: plain helper call; the pointer is only read through bpf_probe_read_kernel.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let live = kread::<u64>(task, task_offset!(task_signal))
        .and_then(|signal| kread::<i32>(signal as *const u8, task_offset!(signal_live)));
    match live {
        Some(n) => n <= 0,
        None => {
            // BTF gave the offsets, yet the read failed (without them the loader says so).
            if task_offset!(signal_live) != gpustall_common::task::UNKNOWN {
                kdebug!("signal->live of process {} is unreadable: its leader's exit ends it", pid);
            }
            tid == pid
        }
    }
}

/// task:task_rename: PR_SET_NAME (how PyTorch names its workers), /proc/PID/comm writes, exec.
#[tracepoint]
pub fn task_rename(ctx: TracePointContext) -> u32 {
    let (pid, tid) = current_ids();
    let renamed_tid = field::<i32>(&ctx, offset!(rename_pid)).unwrap_or(0) as u32;
    if !is_tracked(pid) && !is_tracked(renamed_tid) {
        return 0;
    }
    emit(
        RenameEvent {
            header: header(EventKind::Rename, pid, tid),
            renamed_tid,
            _pad: 0,
            new_comm: comm_field(&ctx, offset!(rename_newcomm)),
        },
        // A rename is how PyTorch's workers and threads say what they are: the agent gives
        // the kernel their roles (off-CPU accounting, a trainer's feeders) as soon as it sees
        // it, not after a quiet spell's drain delay. Renames are rare: one per worker or
        // thread, one per exec.
        Wake::Now,
    );
    0
}

#[tracepoint]
pub fn sched_process_exec(ctx: TracePointContext) -> u32 {
    let (pid, tid) = current_ids();
    if !is_tracked(pid) {
        return 0;
    }
    emit(
        ExecEvent {
            header: header(EventKind::Exec, pid, tid),
            old_pid: field::<i32>(&ctx, offset!(exec_old_pid)).unwrap_or(0) as u32,
            _pad: 0,
            filename: data_loc_str::<64>(&ctx, offset!(exec_filename)),
        },
        Wake::Later,
    );
    0
}

/// Threads other than their process's main one that the kernel sent SIGKILL (tid -> pid), from
/// signal_generate_raw for mark_victim, whose `pid` is the marked thread (the main thread may
/// have exited already). The OOM killer sends its SIGKILL just before it marks the victim, in
/// the same task; LRU, so that a SIGKILL never followed by a mark ages out.
#[map]
pub static KILLED_THREADS: LruHashMap<u32, u32> = LruHashMap::with_max_entries(256, 0);

/// The process of the thread the OOM killer marked: the invoker itself (a task already dying
/// marks itself), or the process signal_generate_raw saw that thread's SIGKILL for, or the
/// thread id as it is (its own process's main thread, or a kernel without the raw program).
#[inline(always)]
fn victim_process(victim_tid: u32, pid: u32, tid: u32) -> u32 {
    if victim_tid == tid {
        return pid;
    }
    // SAFETY: a plain value copied out at once.
    match unsafe { KILLED_THREADS.get(victim_tid) } {
        Some(&process) => {
            let _ = KILLED_THREADS.remove(victim_tid);
            process
        }
        None => victim_tid,
    }
}

/// oom:mark_victim runs in the task that invoked the OOM killer. Recorded when either the
/// trigger or the victim is tracked: a worker of the job can be killed for another's allocation.
#[tracepoint]
pub fn mark_victim(ctx: TracePointContext) -> u32 {
    let (pid, tid) = current_ids();
    let Some(victim_tid) = field::<i32>(&ctx, offset!(oom_pid)) else {
        return 0;
    };
    let victim_tid = victim_tid as u32;
    let victim = victim_process(victim_tid, pid, tid);
    if !is_tracked(pid) && !is_tracked(victim) {
        return 0;
    }
    let anon = field::<u64>(&ctx, offset!(oom_anon_rss));
    emit(
        OomVictimEvent {
            header: header(EventKind::OomVictim, pid, tid),
            victim_pid: victim,
            has_rss: anon.is_some() as u32,
            total_vm_kb: field(&ctx, offset!(oom_total_vm)).unwrap_or(0),
            anon_rss_kb: anon.unwrap_or(0),
            file_rss_kb: field(&ctx, offset!(oom_file_rss)).unwrap_or(0),
            shmem_rss_kb: field(&ctx, offset!(oom_shmem_rss)).unwrap_or(0),
            oom_score_adj: field::<i16>(&ctx, offset!(oom_score_adj)).unwrap_or(0) as i32,
            uid: field(&ctx, offset!(oom_uid)).unwrap_or(0),
            victim_comm: data_loc_str::<16>(&ctx, offset!(oom_comm)),
            victim_tid,
            _pad2: 0,
        },
        Wake::Now,
    );
    0
}

/// Signals that end processes: SIGHUP, SIGINT, SIGABRT, SIGBUS, SIGKILL, SIGSEGV, SIGTERM.
/// (`trace -- CMD` also reads the job's SIGHUP, SIGINT and SIGTERM to pass on only those
/// the job did not get itself.)
const FATAL_SIGNALS: u64 =
    (1 << 1) | (1 << 2) | (1 << 6) | (1 << 7) | (1 << 9) | (1 << 11) | (1 << 15);

const SIGKILL: i32 = 9;
/// `si_code` of a signal sent with SEND_SIG_NOINFO (kill(2) semantics), as the tracepoint's
/// TP_STORE_SIGINFO records it (SEND_SIG_PRIV's is `events::SI_KERNEL`).
const SI_USER: i32 = 0;

#[inline(always)]
fn is_fatal(sig: i32) -> bool {
    (0..64).contains(&sig) && FATAL_SIGNALS & (1u64 << sig) != 0
}

/// What signal_generate tells about a fatal signal to a task of a tracked process.
struct Target {
    process: u32,
    thread: u32,
    comm: [u8; 16],
}

#[inline(always)]
fn record_signal(sig: i32, code: i32, result: i32, target: Target) {
    let (pid, tid) = current_ids();
    emit(
        SignalEvent {
            header: header(EventKind::Signal, pid, tid),
            sig,
            code,
            target_pid: target.process,
            result,
            target_comm: target.comm,
            target_tid: target.thread,
            _pad: 0,
        },
        Wake::Now,
    );
}

/// signal:signal_generate runs in the sender: who killed whom (OOM killer, systemd-oomd,
/// kubelet, Slurm, torchrun). The classic record names only the target thread: this program
/// runs where the kernel has no raw tracepoint for signal_generate_raw (no BTF), and then
/// misses a signal aimed at a thread other than the main one.
#[tracepoint]
pub fn signal_generate(ctx: TracePointContext) -> u32 {
    let sig = field::<i32>(&ctx, offset!(sig_sig)).unwrap_or(0);
    if !is_fatal(sig) {
        return 0;
    }
    let target = field::<i32>(&ctx, offset!(sig_pid)).unwrap_or(0) as u32;
    if !is_tracked(target) {
        return 0;
    }
    record_signal(
        sig,
        field(&ctx, offset!(sig_code)).unwrap_or(0),
        field(&ctx, offset!(sig_result)).unwrap_or(0),
        Target { process: target, thread: target, comm: comm_field(&ctx, offset!(sig_comm)) },
    );
    0
}

/// The same event as a raw tracepoint: (int sig, struct kernel_siginfo *info, struct
/// task_struct *task, int group, int result), the prototype the loader checks in BTF. The
/// target task's tgid resolves a thread-directed signal (tgkill, abort() or a fault in a
/// thread, NCCL's watchdog) to its process. No record is built for it, so it costs less too.
#[raw_tracepoint(tracepoint = "signal_generate")]
pub fn signal_generate_raw(ctx: RawTracePointContext) -> u32 {
    let sig = ctx.arg::<u64>(0) as i32;
    if !is_fatal(sig) {
        return 0;
    }
    let task = ctx.arg::<u64>(2) as *const u8;
    let Some(process) = kread::<u32>(task, task_offset!(task_tgid)) else {
        return 0;
    };
    if !is_tracked(process) {
        return 0;
    }
    let thread = kread::<u32>(task, task_offset!(task_pid)).unwrap_or(process);
    let code = match ctx.arg::<u64>(1) {
        0 => SI_USER,
        1 => SI_KERNEL,
        info => kread::<i32>(info as *const u8, task_offset!(siginfo_code)).unwrap_or(0),
    };
    if sig == SIGKILL && code == SI_KERNEL && thread != process {
        // For mark_victim, which names only the thread (see KILLED_THREADS).
        let _ = KILLED_THREADS.insert(thread, process, 0);
    }
    let comm = kread::<[u8; 16]>(task, task_offset!(task_comm)).unwrap_or([0; 16]);
    record_signal(sig, code, ctx.arg::<u64>(4) as i32, Target { process, thread, comm });
    0
}
