//! Ring-buffer records. Every record starts with an [`EventHeader`]; `kind` says which body
//! follows. Records of the process tree, OOM kills and signals go to the *critical* ring; the
//! rest to the *bulk* ring, so that a flood of bulk records cannot push out an OOM kill.

use crate::{COMM_LEN, FILENAME_LEN};

/// What a record is. Decoded on the user side with `TryFrom<u32>`, never transmuted.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Fork = 1,
    Exit = 2,
    Rename = 3,
    Exec = 4,
    OomVictim = 5,
    Signal = 6,
    Reclaim = 7,
    Throttled = 8,
    DataWait = 9,
}

impl TryFrom<u32> for EventKind {
    type Error = u32;
    fn try_from(v: u32) -> Result<Self, u32> {
        Ok(match v {
            1 => Self::Fork,
            2 => Self::Exit,
            3 => Self::Rename,
            4 => Self::Exec,
            5 => Self::OomVictim,
            6 => Self::Signal,
            7 => Self::Reclaim,
            8 => Self::Throttled,
            9 => Self::DataWait,
            other => return Err(other),
        })
    }
}

/// Common prefix: who was running (`pid`/`tid`/`comm` of the current task: its process, its
/// thread, the thread's name) and when (`bpf_ktime_get_ns`, CLOCK_MONOTONIC).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EventHeader {
    pub kind: u32,
    pub pid: u32,
    pub tid: u32,
    pub _pad: u32,
    pub t_ns: u64,
    pub comm: [u8; COMM_LEN],
}
const _: () = assert!(core::mem::size_of::<EventHeader>() == 40);

/// A new process (not a thread) was created by a tracked process.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ForkEvent {
    pub header: EventHeader,
    pub child_pid: u32,
    pub _pad: u32,
    pub clone_flags: u64,
}
const _: () = assert!(core::mem::size_of::<ForkEvent>() == 56);

/// `exit_code_known` is 0 when the kernel's BTF did not give `task_struct.exit_code`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExitEvent {
    pub header: EventHeader,
    /// The raw `task_struct.exit_code`: `(status << 8) | signal`, as wait(2) sees it.
    pub exit_code: u32,
    pub exit_code_known: u32,
}
const _: () = assert!(core::mem::size_of::<ExitEvent>() == 48);

/// A task of a tracked process changed its name (prctl PR_SET_NAME, /proc/PID/comm, exec).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RenameEvent {
    pub header: EventHeader,
    /// The thread that was renamed (the tracepoint's `pid`: the kernel's id of a thread).
    pub renamed_tid: u32,
    pub _pad: u32,
    pub new_comm: [u8; COMM_LEN],
}
const _: () = assert!(core::mem::size_of::<RenameEvent>() == 64);

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExecEvent {
    pub header: EventHeader,
    pub old_pid: u32,
    pub _pad: u32,
    pub filename: [u8; FILENAME_LEN],
}
const _: () = assert!(core::mem::size_of::<ExecEvent>() == 112);

/// `oom:mark_victim`. The header is the task that invoked the OOM killer. Sizes are in kB as the
/// tracepoint reports them; `has_rss` is 0 on kernels whose format carries only `pid`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OomVictimEvent {
    pub header: EventHeader,
    pub victim_pid: u32,
    pub has_rss: u32,
    pub total_vm_kb: u64,
    pub anon_rss_kb: u64,
    pub file_rss_kb: u64,
    pub shmem_rss_kb: u64,
    pub oom_score_adj: i32,
    pub uid: u32,
    pub victim_comm: [u8; COMM_LEN],
    /// The thread the OOM killer marked (`victim_pid` is its process): not the main thread
    /// when that one had already exited.
    pub victim_tid: u32,
    pub _pad2: u32,
}
const _: () = assert!(core::mem::size_of::<OomVictimEvent>() == 112);

/// `si_code` of a signal the kernel itself sent (SEND_SIG_PRIV: the OOM killer), as
/// signal_generate records it (TP_STORE_SIGINFO). One definition for the programs and the
/// agent's verdict.
pub const SI_KERNEL: i32 = 0x80;

/// `signal:signal_generate` of a fatal signal to a task of a tracked process. The header is the
/// sender.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SignalEvent {
    pub header: EventHeader,
    pub sig: i32,
    /// `si_code`: SI_USER (0) for kill(2), SI_KERNEL (0x80) for the OOM killer, ...
    pub code: i32,
    pub target_pid: u32,
    /// TRACE_SIGNAL_DELIVERED (0), IGNORED (1), ALREADY_PENDING (2), ...
    pub result: i32,
    /// The target thread's name.
    pub target_comm: [u8; COMM_LEN],
    /// The thread the signal was aimed at (`target_pid` is its process; the same where the
    /// kernel gave only the thread, see the loader's degradations).
    pub target_tid: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<SignalEvent>() == 80);

/// One completed reclaim stall of a tracked thread (paired begin/end in the kernel), or one
/// kswapd wake/sleep episode (host level; `kind` = [`crate::reclaim::ReclaimKind::Kswapd`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ReclaimEvent {
    pub header: EventHeader,
    pub kind: u32,
    pub _pad: u32,
    pub start_ns: u64,
    pub duration_ns: u64,
    pub nr_reclaimed: u64,
}
const _: () = assert!(core::mem::size_of::<ReclaimEvent>() == 72);

/// `vmscan:mm_vmscan_throttled`: a tracked thread's reclaim waited (on writeback, ...).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ThrottledEvent {
    pub header: EventHeader,
    pub usec_timeout: i32,
    pub usec_delayed: i32,
    pub reason: i32,
    pub nid: i32,
}
const _: () = assert!(core::mem::size_of::<ThrottledEvent>() == 56);

/// One long wait for data: a trainer's or rank's consumer thread (`wakee_*`) waited at least
/// [`crate::sched::LONG_WAIT_NS`] (one logical wait: `sched::LogicalWait`, across timeouts and
/// batches put aside) until a thread of another tracked process (the header: the waker, e.g.
/// the DataLoader worker that delivered the batch; through a relay, the process that woke the
/// relay) brought its data. Shorter waits are only summed (`sched::WakeCounters`); these few
/// draw each wait and who ended it. Sent when the wait is over, from the wakee's context: the
/// header's comm is left empty.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DataWaitEvent {
    pub header: EventHeader,
    pub wakee_pid: u32,
    pub wakee_tid: u32,
    /// When the wakee blocked (its first block's switch-out); the wait ends at the header's
    /// `t_ns`.
    pub start_ns: u64,
    pub duration_ns: u64,
    /// The syscall of the block the data ended, as a `syscall::WaitClass`.
    pub wait_class: u8,
    pub _pad: u8,
    /// Its blocks, and how many of them a process of the job ended (the others ran out or were
    /// ended by something else: timeouts).
    pub slices: u16,
    pub job_wakes: u16,
    pub _pad2: u16,
    /// The thread of the wakee's own process that passed the batch on (a relay: PyTorch's
    /// pin-memory thread); 0: the waker woke the wakee itself.
    pub relay_tid: u32,
    /// Another process that shares the wait with the waker, half each (`sched::wait_woken`:
    /// a batch that came with the awaited one, or a feeder busy producing when it came); 0:
    /// none.
    pub co_waker: u32,
    pub _pad3: u32,
}
const _: () = assert!(core::mem::size_of::<DataWaitEvent>() == 88);
