//! Off-CPU accounting from sched_switch and sched_waking: how long each tracked process's
//! threads were blocked waiting on an event (interruptible sleep: a pipe, a queue, a socket, a
//! futex, poll), blocked uninterruptibly (disk, page faults, reclaim) or runnable but not
//! running (CPU contention), and which tracked process ended each interruptible block (the
//! waker "kept the wakee waiting" that long).
//!
//! The kernel keeps one [`OffCpuThread`] per tracked thread (the state it left the CPU in and
//! since when) and sums per process ([`OffCpuCounters`]) and per (waker, wakee) process pair
//! ([`WakeCounters`]): never a record per context switch. The transitions are pure functions
//! here, run by the eBPF programs and unit-tested on the host.

/// Offsets of the sched_switch and sched_waking fields the programs read, from tracefs.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SchedOffsets {
    /// sched_switch `prev_state` (a `long`), `next_pid`.
    pub switch_prev_state: u16,
    pub switch_next_pid: u16,
    /// sched_waking `pid` (the wakee's thread id).
    pub waking_pid: u16,
    pub _pad: u16,
}
const _: () = assert!(core::mem::size_of::<SchedOffsets>() == 8);

impl SchedOffsets {
    pub const fn missing() -> Self {
        use crate::offsets::MISSING;
        Self { switch_prev_state: MISSING, switch_next_pid: MISSING, waking_pid: MISSING, _pad: 0 }
    }
}

/// Where the typed sched_waking tells a wakeup in interrupt context (a timer running out, an
/// I/O completion, a network softirq), where `current` is only the task the interrupt happened
/// to land on and must not be charged with ending the wait: partly from whether the arguments
/// the kernel handed the program lie on the current task's stack (`task_struct.stack`,
/// `thread_size` bytes). An interrupt of kernel code runs on a per-CPU stack of its own (x86_64:
/// hardirqs, and softirqs run from them or from `local_bh_enable`; ksoftirqd's are its own
/// task's); one of user code is told by the saved syscall number (gpustall-ebpf's
/// `in_interrupt`). Written by the agent from BTF; where it is unknown the programs fall back to
/// marking hrtimer callbacks (`IN_TIMER`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackLayout {
    /// `task_struct.stack`: the lowest address of the task's kernel stack.
    pub task_stack: u32,
    /// The stack's size (`THREAD_SIZE`); 0: unknown.
    pub thread_size: u32,
}
const _: () = assert!(core::mem::size_of::<StackLayout>() == 8);

impl StackLayout {
    pub const fn unknown() -> Self {
        Self { task_stack: crate::task::UNKNOWN, thread_size: 0 }
    }

    /// Both known, and a size a kernel stack can have (a power of two, 8 KiB to 64 KiB).
    pub const fn knows(&self) -> bool {
        self.task_stack != crate::task::UNKNOWN
            && self.thread_size.is_power_of_two()
            && self.thread_size >= 8192
            && self.thread_size <= 65536
    }

    /// Whether `frame` (an address on the stack the program runs from) lies on the task stack
    /// that starts at `stack`. Below the stack the difference wraps to a huge number.
    #[inline(always)]
    pub const fn on_task_stack(&self, frame: u64, stack: u64) -> bool {
        frame.wrapping_sub(stack) < self.thread_size as u64
    }
}

/// `TRACKED` values: a tracked process (set at fork and by the agent's seeding) is only
/// followed; the agent raises the job's own roles (trainer, ranks, DataLoader workers,
/// pin-memory, forkserver) to [`ACCOUNT`] so that their threads' off-CPU time is counted, and
/// trainers and ranks to [`ACCOUNT_WAITS`]. A fork burst of other processes thus costs the
/// off-CPU maps nothing.
pub const TRACKED_ONLY: u32 = 1;
pub const ACCOUNT: u32 = 2;
pub const ACCOUNT_WAITS: u32 = 3;
/// At most this many processes are accounted at once (the size of the kernel's per-process
/// off-CPU map).
pub const OFFCPU_PROCESSES: u32 = 1024;

/// A data wait at least this long is also sent as a record (`events::DataWaitEvent`), drawn as
/// a slice with an arrow from the worker that ended it. 10 ms: a batch that late is a visible
/// gap on a GPU timeline, and at most 100 records a second per waiting thread.
pub const LONG_WAIT_NS: u64 = 10_000_000;

/// Where a tracked thread is, as the scheduler last showed it.
pub mod state {
    /// On a CPU (switched in since its last switch-out).
    pub const ON_CPU: u16 = 0;
    /// Blocked interruptibly (S): waiting for an event.
    pub const WAIT: u16 = 1;
    /// Blocked uninterruptibly (D): disk, page fault, reclaim.
    pub const IO: u16 = 2;
    /// Runnable, waiting for a CPU (preempted, or woken and not yet running).
    pub const RUNQ: u16 = 3;
    /// Stopped, traced, parked, dead: not counted.
    pub const OTHER: u16 = 4;
}

/// `prev_state` as sched_switch reports it (`__trace_sched_switch_state`, 4.14+): 0 when
/// still runnable, `TASK_REPORT_MAX` (a bit above the others) when preempted, else one bit of
/// `TASK_REPORT`: 0x1 S, 0x2 D, 0x4 T, 0x8 t, 0x10 X, 0x20 Z, 0x40 P, 0x80 I.
#[inline(always)]
pub fn classify(prev_state: i64) -> u16 {
    let s = prev_state as u64;
    if s == 0 || s >= 0x100 {
        state::RUNQ
    } else if s & 0x1 != 0 {
        state::WAIT
    } else if s & 0x2 != 0 {
        state::IO
    } else {
        state::OTHER
    }
}

/// The `prev_state` the classic sched_switch record would carry ([`classify`]'s input), from
/// what the typed tracepoint gets (5.18+): `preempt` and the task's raw `__state`. As
/// `__trace_sched_switch_state`: a preempted task is `TASK_REPORT_MAX`; `TASK_IDLE` is I;
/// `TASK_RTLOCK_WAIT` is D; else the highest of the `TASK_REPORT` bits. A task switching out
/// for the last time is `TASK_DEAD` (0x80), reported with its exit state (X or Z): X here, as
/// both mean "gone".
#[inline(always)]
pub fn report_state(preempt: bool, raw: u32) -> i64 {
    const TASK_REPORT: u32 = 0x7f;
    const TASK_DEAD: u32 = 0x80;
    const TASK_IDLE: u32 = 0x402;
    const TASK_RTLOCK_WAIT: u32 = 0x1000;
    if preempt {
        return 0x100;
    }
    if raw & TASK_DEAD != 0 {
        return 0x10;
    }
    let s = match raw {
        TASK_IDLE => return 0x80,
        TASK_RTLOCK_WAIT => 0x2,
        r => r & TASK_REPORT,
    };
    if s == 0 {
        0
    } else {
        1i64 << (31 - s.leading_zeros())
    }
}

/// A thread that has left the CPU (key: thread id).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct OffCpuThread {
    /// When it entered `state` (switch-out, or the wakeup that made it runnable).
    pub since_ns: u64,
    pub tgid: u32,
    pub state: u16,
    /// 1 when the process's interruptible waits are waits for data (a trainer or a rank: its
    /// `TRACKED` value is [`ACCOUNT_WAITS`]): who ends them is counted in the wake map.
    pub data_waiter: u8,
    /// A data waiter's interruptible wait: the class of the syscall it blocked in
    /// (`syscall::WaitClass`, unknown where it could not be read).
    pub wait_class: u8,
}
const _: () = assert!(core::mem::size_of::<OffCpuThread>() == 16);

/// Off-CPU totals of one process (key: tgid), summed over its threads.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize, serde::Deserialize))]
pub struct OffCpuCounters {
    /// Interruptible blocks ended (by a wakeup) and their total length.
    pub wait_count: u64,
    pub wait_ns: u64,
    /// Uninterruptible blocks ended and their total length.
    pub io_count: u64,
    pub io_ns: u64,
    /// Waits for a CPU (wakeup or preemption to switch-in) and their total length.
    pub runq_count: u64,
    pub runq_ns: u64,
}
const _: () = assert!(core::mem::size_of::<OffCpuCounters>() == 48);

/// Key of the wake map: a tracked process (`waker`) ended an interruptible block of a thread
/// of another tracked process (`wakee`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WakeKey {
    pub waker: u32,
    pub wakee: u32,
}
const _: () = assert!(core::mem::size_of::<WakeKey>() == 8);

/// Buckets of the per-pair block length histogram: bucket `i` holds blocks of
/// `[2^i, 2^(i+1))` microseconds (bucket 0 also under 1 us; the last also anything longer,
/// from 2^23 us = 8.4 s).
pub const WAKE_BUCKETS: usize = 24;

/// The blocks a waker ended for a wakee: count, total, longest, log2 histogram.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize, serde::Deserialize))]
pub struct WakeCounters {
    pub count: u64,
    pub ns: u64,
    pub max_ns: u64,
    pub hist: [u64; WAKE_BUCKETS],
}
const _: () = assert!(core::mem::size_of::<WakeCounters>() == 24 + 8 * WAKE_BUCKETS);

/// Histogram bucket of a block of `ns`.
#[inline(always)]
pub fn wake_bucket(ns: u64) -> usize {
    let us = ns / 1000;
    let b = 63usize.saturating_sub(us.leading_zeros() as usize);
    if us == 0 {
        0
    } else if b >= WAKE_BUCKETS {
        WAKE_BUCKETS - 1
    } else {
        b
    }
}

/// What a wakeup of a tracked thread ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WakeOutcome {
    /// Not blocked (already runnable, on a CPU, or stopped): nothing to count.
    Nothing,
    /// A block of `ns` in `state` (WAIT or IO) ended; the thread is now runnable.
    Ended { state: u16, ns: u64 },
}

/// sched_waking of a thread last seen as `t`, at `now`.
#[inline(always)]
pub fn on_waking(t: &OffCpuThread, now: u64) -> WakeOutcome {
    match t.state {
        state::WAIT | state::IO => {
            WakeOutcome::Ended { state: t.state, ns: now.saturating_sub(t.since_ns) }
        }
        _ => WakeOutcome::Nothing,
    }
}

/// sched_switch bringing `t` back onto a CPU at `now`: the wait it ends, if any. A block whose
/// wakeup was not seen (woken before the programs attached) is charged to its state whole.
#[inline(always)]
pub fn on_switch_in(t: &OffCpuThread, now: u64) -> Option<(u16, u64)> {
    match t.state {
        state::WAIT | state::IO | state::RUNQ => Some((t.state, now.saturating_sub(t.since_ns))),
        _ => None,
    }
}

#[cfg(feature = "user")]
impl OffCpuCounters {
    /// These totals counted from `base` (an earlier read).
    pub fn since(&self, base: &Self) -> Self {
        Self {
            wait_count: self.wait_count.saturating_sub(base.wait_count),
            wait_ns: self.wait_ns.saturating_sub(base.wait_ns),
            io_count: self.io_count.saturating_sub(base.io_count),
            io_ns: self.io_ns.saturating_sub(base.io_ns),
            runq_count: self.runq_count.saturating_sub(base.runq_count),
            runq_ns: self.runq_ns.saturating_sub(base.runq_ns),
        }
    }
}

#[cfg(feature = "user")]
impl WakeCounters {
    /// These totals counted from `base`; the maximum is the run's (a window's is unknown).
    pub fn since(&self, base: &Self) -> Self {
        let mut hist = self.hist;
        for (h, b) in hist.iter_mut().zip(&base.hist) {
            *h = h.saturating_sub(*b);
        }
        Self {
            count: self.count.saturating_sub(base.count),
            ns: self.ns.saturating_sub(base.ns),
            max_ns: self.max_ns,
            hist,
        }
    }
}

#[cfg(feature = "user")]
// SAFETY: repr(C), only integers, no padding (sizes pinned above).
unsafe impl aya::Pod for SchedOffsets {}
#[cfg(feature = "user")]
// SAFETY: plain integers, no padding.
unsafe impl aya::Pod for StackLayout {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl aya::Pod for OffCpuCounters {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl aya::Pod for WakeKey {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl aya::Pod for WakeCounters {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_on_the_task_stack_is_task_context() {
        let l = StackLayout { task_stack: 24, thread_size: 16384 };
        assert!(l.knows());
        let stack = 0xffff_c900_0010_0000;
        assert!(l.on_task_stack(stack + 16000, stack), "deep in the task's stack");
        assert!(l.on_task_stack(stack, stack));
        assert!(!l.on_task_stack(stack + 16384, stack), "just above it");
        assert!(!l.on_task_stack(stack - 8, stack), "just below it: wraps");
        assert!(!l.on_task_stack(0xffff_fe00_0000_7f00, stack), "a per-CPU IRQ stack");
        assert!(!StackLayout::unknown().knows());
        assert!(!StackLayout { task_stack: 24, thread_size: 12288 }.knows(), "not a power of two");
    }

    #[test]
    fn typed_states_report_as_the_classic_record() {
        assert_eq!(report_state(true, 0x1), 0x100); // preempted while going to sleep: runnable
        assert_eq!(report_state(false, 0), 0);
        assert_eq!(report_state(false, 0x1), 0x1); // TASK_INTERRUPTIBLE: S
        assert_eq!(report_state(false, 0x2), 0x2); // TASK_UNINTERRUPTIBLE: D
        assert_eq!(report_state(false, 0x102), 0x2); // TASK_KILLABLE: D
        assert_eq!(report_state(false, 0x2001), 0x1); // TASK_FREEZABLE | S: S
        assert_eq!(report_state(false, 0x402), 0x80); // TASK_IDLE: I, not D
        assert_eq!(report_state(false, 0x1000), 0x2); // TASK_RTLOCK_WAIT: D
        assert_eq!(report_state(false, 0x104), 0x4); // TASK_STOPPED: T
        assert_eq!(report_state(false, 0x40), 0x40); // TASK_PARKED: P
        assert_eq!(report_state(false, 0x80), 0x10); // TASK_DEAD: gone
        for (raw, class) in [(0x1, state::WAIT), (0x2, state::IO), (0x402, state::OTHER)] {
            assert_eq!(classify(report_state(false, raw)), class);
        }
    }

    #[test]
    fn prev_state_classes() {
        assert_eq!(classify(0), state::RUNQ, "yielded, still runnable");
        assert_eq!(classify(0x100), state::RUNQ, "preempted (TASK_REPORT_MAX)");
        assert_eq!(classify(0x1), state::WAIT);
        assert_eq!(classify(0x2), state::IO);
        assert_eq!(classify(0x4), state::OTHER, "stopped");
        assert_eq!(classify(0x20), state::OTHER, "zombie");
        assert_eq!(classify(0x80), state::OTHER, "idle kernel thread");
    }

    #[test]
    fn a_block_ends_at_its_wakeup_and_the_run_queue_wait_at_switch_in() {
        let t = OffCpuThread {
            since_ns: 100,
            tgid: 7,
            state: state::WAIT,
            data_waiter: 1,
            wait_class: 1,
        };
        assert_eq!(on_waking(&t, 350), WakeOutcome::Ended { state: state::WAIT, ns: 250 });
        let runq = OffCpuThread {
            since_ns: 350,
            tgid: 7,
            state: state::RUNQ,
            data_waiter: 1,
            wait_class: 0,
        };
        assert_eq!(on_waking(&runq, 400), WakeOutcome::Nothing, "already runnable");
        assert_eq!(on_switch_in(&runq, 420), Some((state::RUNQ, 70)));
        let on = OffCpuThread {
            since_ns: 0,
            tgid: 7,
            state: state::ON_CPU,
            data_waiter: 0,
            wait_class: 0,
        };
        assert_eq!(on_switch_in(&on, 420), None);
        assert_eq!(on_waking(&on, 420), WakeOutcome::Nothing);
    }

    #[test]
    fn buckets_are_log2_microseconds() {
        assert_eq!(wake_bucket(0), 0);
        assert_eq!(wake_bucket(999), 0);
        assert_eq!(wake_bucket(1_000), 0);
        assert_eq!(wake_bucket(2_000), 1);
        assert_eq!(wake_bucket(50_000_000), 15, "50 ms");
        assert_eq!(wake_bucket(u64::MAX), WAKE_BUCKETS - 1);
    }
}
