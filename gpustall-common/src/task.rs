//! Where this kernel keeps the task fields the BTF-typed programs read (`struct task_struct`,
//! `signal_struct`, `kernel_siginfo`), from its BTF. A raw or BTF-typed tracepoint gets the
//! kernel's pointers, not the classic record: `task->tgid` is what tells which process a
//! thread-directed signal (tgkill, abort() in a thread) or a thread's exit belongs to.

/// Marks an offset the running kernel's BTF does not give.
pub const UNKNOWN: u32 = u32::MAX;

/// Byte offsets inside kernel structures; [`UNKNOWN`] where BTF is missing.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskOffsets {
    /// `task_struct.pid` (the thread id).
    pub task_pid: u32,
    /// `task_struct.tgid` (the process id: what this project calls its pid).
    pub task_tgid: u32,
    /// `task_struct.comm` (`char[16]`).
    pub task_comm: u32,
    /// `task_struct.signal` (`struct signal_struct *`, shared by the thread group).
    pub task_signal: u32,
    /// `signal_struct.live` (`atomic_t`: threads not yet past do_exit's decrement).
    pub signal_live: u32,
    /// `kernel_siginfo.si_code` (inside an anonymous struct since 5.0).
    pub siginfo_code: u32,
}
const _: () = assert!(core::mem::size_of::<TaskOffsets>() == 24);

impl TaskOffsets {
    /// Nothing known: the state before the agent has read BTF.
    pub const fn unknown() -> Self {
        Self {
            task_pid: UNKNOWN,
            task_tgid: UNKNOWN,
            task_comm: UNKNOWN,
            task_signal: UNKNOWN,
            signal_live: UNKNOWN,
            siginfo_code: UNKNOWN,
        }
    }

    /// Enough to tell a signal's target process from its thread (signal_generate's typed
    /// program needs no more).
    pub const fn knows_signal_target(&self) -> bool {
        self.task_pid != UNKNOWN
            && self.task_tgid != UNKNOWN
            && self.task_comm != UNKNOWN
            && self.siginfo_code != UNKNOWN
    }

    /// Enough to read whether an exiting thread's group is dead (`signal->live == 0`).
    pub const fn knows_group_live(&self) -> bool {
        self.task_signal != UNKNOWN && self.signal_live != UNKNOWN
    }
}

#[cfg(feature = "user")]
// SAFETY: repr(C), only u32s, no padding (size pinned above).
unsafe impl aya::Pod for TaskOffsets {}
