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
#[cfg_attr(feature = "user", derive(serde::Serialize, serde::Deserialize))]
pub struct OffCpuThread {
    /// When it entered `state` (switch-out, the wakeup that made it runnable, switch-in).
    pub since_ns: u64,
    /// Its process (named `tgid` before ids had one vocabulary).
    #[cfg_attr(feature = "user", serde(alias = "tgid"))]
    pub pid: u32,
    pub state: u16,
    /// 1 when the process's interruptible waits are waits for data (a trainer or a rank: its
    /// `TRACKED` value is [`ACCOUNT_WAITS`]): its logical waits are followed.
    pub data_waiter: u8,
    /// A data waiter's interruptible wait: the class of the syscall it blocked in
    /// (`syscall::WaitClass`, unknown where it could not be read).
    pub wait_class: u8,
    /// A data waiter's thread: the other process of the job whose wake ended its latest
    /// interruptible block (0: none since it last passed one on), and when (microseconds of
    /// the clock, wrapping). A thread that then wakes a sibling that was already waiting is a
    /// relay (PyTorch's pin-memory thread): the sibling's wait is charged to this process
    /// ([`relay_charge`]).
    pub relay_from: u32,
    pub relay_at_us: u32,
    /// A data waiter's thread: its logical wait in progress.
    pub wait: LogicalWait,
}
const _: () = assert!(core::mem::size_of::<OffCpuThread>() == 88);

/// On-CPU time under this between two interruptible blocks of a data waiter's thread makes them
/// one wait: a poll or a timed queue get that ran out and looped back to wait again, a batch
/// that came out of order and was put aside, a relay's futex handed over. 1 ms: far under a
/// training step's CPU (launching a step's kernels, a collate) and over a Python loop's turn.
pub const WAIT_JOIN_NS: u64 = 1_000_000;

/// The part of a stretch on CPU that ends in an uninterruptible sleep taken as that sleep's way
/// in, not the thread's work ([`wait_stalled`]): a page fault's swap-in (allocate, charge, add
/// to the swap cache, submit the read) took 30-100 us on CPU per fault under the demo's memory
/// cgroup on the machine measured, and a Python wait loop's turn there took ten of them. 250
/// us allows for a slow one and bounds what a step's work can lose to its faults.
pub const SLEEP_ENTRY_NS: u64 = 250_000;

/// `LogicalWait::flags`: where the syscall class is unknown, a block that no process of the job
/// ended came after the wait's data arrived (a sleep or a timeout): the wait is over at
/// `data_end_ns`.
pub const WAIT_DONE: u8 = 1;

/// `LogicalWait::flags`: its latest block ran out ([`TIMED_OUT_NS`] or more, and no process of
/// the job ended it): the turn on CPU that follows is its wait loop's ([`TIMED_OUT_TURN_NS`]).
pub const WAIT_TIMED_OUT: u8 = 2;

/// An interruptible block this long that no process of the job ended, in a syscall class
/// known, is a timed wait that ran out (PyTorch's DataLoader waits 5 s at a time): the data
/// awaited has not come, so the turn on CPU that follows (checking that the workers live, a
/// signal handler, a garbage collection) is the wait loop's, not a step's. Under it, a block
/// no process of the job ended is the GIL or a lock.
pub const TIMED_OUT_NS: u64 = 500_000_000;

/// How long the turn after a timed-out block may run and still join the wait. A wait loop's
/// turn is tens of microseconds, but a garbage collection or a noisy host's stolen time makes
/// it more than [`WAIT_JOIN_NS`] now and then, and a hung trainer's wait, cut at such a turn,
/// would look no older than its latest piece (a stuck worker not named).
pub const TIMED_OUT_TURN_NS: u64 = 20_000_000;

/// The on-CPU time since its latest block under which the thread is still in wait `w`.
#[inline(always)]
const fn join_ns(w: &LogicalWait) -> u64 {
    if w.flags & WAIT_TIMED_OUT != 0 {
        TIMED_OUT_TURN_NS
    } else {
        WAIT_JOIN_NS
    }
}

/// A data waiter's thread's logical wait: consecutive interruptible blocks separated by under
/// [`WAIT_JOIN_NS`] of on-CPU time ([`TIMED_OUT_TURN_NS`] after a block that ran out), from the first block's switch-out to the last wake by a
/// process of the job (its data arrived), charged once to that process. Pure transitions:
/// [`wait_switch_out`], [`wait_woken`], [`wait_finish`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "user", derive(serde::Serialize, serde::Deserialize))]
pub struct LogicalWait {
    /// When it began (the switch-out of its first block); 0: none open.
    pub start_ns: u64,
    /// The latest wake by a process of the job (its data arrived); 0: none yet.
    pub data_end_ns: u64,
    /// The latest wake of any of its blocks.
    pub last_wake_ns: u64,
    /// When the batch of `co_waker` came (0: none).
    pub co_at_ns: u64,
    /// On-CPU time since its latest block ended (saturating: only its size against
    /// [`WAIT_JOIN_NS`] matters).
    pub ran_ns: u32,
    /// Who `data_end_ns`'s wake is charged to (through a relay: who woke the relay), and the
    /// thread; the relay thread of the waiter's own process (0: woken directly).
    pub waker: u32,
    pub waker_tid: u32,
    pub relay_tid: u32,
    /// Who shares the wait with `waker` ([`wait_woken`]): a process whose batch came before
    /// `waker`'s in this wait, close enough to the end ([`co_arrival`]), or a feeder busy
    /// producing when `waker`'s came.
    pub co_waker: u32,
    /// Blocks entered; at `data_end_ns`: blocks then, and how many a process of the job ended.
    pub slices: u16,
    pub data_slices: u16,
    pub job_wakes: u16,
    /// The syscall class of the block `data_end_ns` ended.
    pub class: u8,
    pub flags: u8,
    /// Off CPU since `data_end_ns` before the thread got back to work (run-queue waits, page
    /// faults, the GIL): the batch came, but the trainer could not use it yet (saturating).
    pub tail_ns: u32,
}
const _: () = assert!(core::mem::size_of::<LogicalWait>() == 64);

/// A logical wait that is over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FinishedWait {
    pub start_ns: u64,
    /// Its data's arrival; for a wait no process of the job ended, its last wake.
    pub end_ns: u64,
    /// The process charged; 0: none of the job ended it (timeouts, a signal, a device).
    pub waker: u32,
    pub waker_tid: u32,
    pub relay_tid: u32,
    pub slices: u16,
    pub job_wakes: u16,
    pub class: u8,
    /// Another process whose batch came at nearly the same time as `waker`'s (within the
    /// wait's last quarter), or a feeder busy producing when it came: the two share the
    /// wait, half each (0: none).
    pub co_waker: u32,
}

impl FinishedWait {
    pub const fn ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// Batches that come together end a wait together. When another worker's batch came within
/// the last quarter of a wait (or [`CO_ARRIVAL_MIN_NS`] of its end), that worker was nearly as
/// late as the one awaited: had its batch been the one needed, the wait would have been about
/// as long, so the two share it. Two identical workers fed round robin deliver in pairs, and
/// which of the pair is awaited is a matter of phase, not speed; a batch put aside long before
/// the awaited one (a fast worker ahead of a slow one) shares nothing.
pub const CO_ARRIVAL_MIN_NS: u64 = 2_000_000;

/// Whether a batch that came at `co_at` shares the wait `[start, end]` with the awaited one.
#[inline(always)]
pub const fn co_arrival(start: u64, end: u64, co_at: u64) -> bool {
    let before_end = end.saturating_sub(co_at);
    let wait = end.saturating_sub(start);
    co_at != 0 && (before_end.saturating_mul(4) <= wait || before_end <= CO_ARRIVAL_MIN_NS)
}

/// Feeder slots per data waiter: the worker processes of a trainer or rank, as the agent
/// knows them from the process tree (key: the waiter's pid). A power of two (a mask bounds
/// the kernel's index).
pub const FEEDER_SLOTS: usize = 8;
const _: () = assert!(FEEDER_SLOTS.is_power_of_two());

/// A data waiter's feeders, written by the agent: `pids[..count]` (the rest 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Feeders {
    pub count: u32,
    pub pids: [u32; FEEDER_SLOTS],
}

/// Whether a feeder whose main thread is in `st` is busy producing a batch: on a CPU, waiting
/// for one, or blocked uninterruptibly (a disk read, reclaim). Blocked interruptibly, it is
/// idle (waiting for an index: its batches are all delivered).
#[inline(always)]
pub const fn busy_feeder(st: u16) -> bool {
    st == state::ON_CPU || st == state::RUNQ || st == state::IO
}

/// A block of this class never joins a wait for data, and ends the one in progress: a sleep
/// (the step's pause, a GPU step's stand-in) and an ioctl (a device driver: a blocking CUDA
/// synchronize) are not waits for a batch.
#[inline(always)]
pub const fn breaks_wait(class: u8) -> bool {
    class == crate::syscall::WaitClass::Sleep as u8
        || class == crate::syscall::WaitClass::Ioctl as u8
}

/// A data waiter's thread leaves the CPU at `now` into `st` (a WAIT block's syscall `class`);
/// `on_cpu_since`: when it last came on a CPU, if it was on one. The wait in progress ends when
/// the thread ran [`WAIT_JOIN_NS`] or more since its latest block ([`TIMED_OUT_TURN_NS`] after
/// a block that ran out), when its data came and a block no process of the job ended followed
/// ([`WAIT_DONE`]), or when it blocks in a class that breaks waits; an interruptible block
/// opens one or joins the one in progress.
#[inline(always)]
pub fn wait_switch_out(
    w: &mut LogicalWait,
    on_cpu_since: Option<u64>,
    now: u64,
    st: u16,
    class: u8,
) -> Option<FinishedWait> {
    if let Some(s) = on_cpu_since {
        let ran = now.saturating_sub(s).min(u32::MAX as u64) as u32;
        w.ran_ns = w.ran_ns.saturating_add(ran);
    }
    let breaks = st == state::WAIT && breaks_wait(class);
    let over = w.ran_ns as u64 >= join_ns(w) || breaks || w.flags & WAIT_DONE != 0;
    let done = if w.start_ns != 0 && over { wait_finish(w) } else { None };
    if st == state::WAIT && !breaks {
        if w.start_ns == 0 {
            *w = LogicalWait { start_ns: now, ..LogicalWait::default() };
        }
        w.slices = w.slices.saturating_add(1);
        w.ran_ns = 0;
        // How this block ends decides the next turn's allowance.
        w.flags &= !WAIT_TIMED_OUT;
    }
    done
}

/// Who ended a block of a data waiter's wait: `waker`, a process of the job (0: none: a
/// timeout, a sibling thread, an interrupt), its thread, the waiter's own thread that relayed
/// the batch (`relay_tid`, 0: none), and another feeder still busy on its next batch then
/// (`busy_feeder`, 0: none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wake {
    pub waker: u32,
    pub waker_tid: u32,
    pub relay_tid: u32,
    pub busy_feeder: u32,
}

/// A block of the wait in progress ended at `now` (its syscall `class`), as `by` says.
#[inline(always)]
pub fn wait_woken(w: &mut LogicalWait, now: u64, class: u8, by: Wake) {
    let Wake { waker, waker_tid, relay_tid, busy_feeder } = by;
    if w.start_ns == 0 || w.flags & WAIT_DONE != 0 {
        return;
    }
    let block = now.saturating_sub(w.last_wake_ns.max(w.start_ns));
    let classic = class == crate::syscall::WaitClass::Unknown as u8;
    w.last_wake_ns = now;
    if waker != 0 {
        w.tail_ns = 0;
        if w.waker != 0 && w.waker != waker {
            w.co_waker = w.waker;
            w.co_at_ns = w.data_end_ns;
        }
        // A batch put aside close to this one shares the wait; else a feeder still busy on
        // its next batch does: it was as late, and which of them the trainer happened to
        // wait for is a matter of phase (`busy_feeder`).
        let put_aside = w.co_waker != 0 && co_arrival(w.start_ns, now, w.co_at_ns);
        if !put_aside && busy_feeder != 0 && busy_feeder != waker {
            w.co_waker = busy_feeder;
            w.co_at_ns = now;
        }
        w.data_end_ns = now;
        w.waker = waker;
        w.waker_tid = waker_tid;
        w.relay_tid = relay_tid;
        w.class = class;
        w.data_slices = w.slices;
        w.job_wakes = w.job_wakes.saturating_add(1);
    } else if !classic && block >= TIMED_OUT_NS {
        // A timed wait that ran out: still waiting. After a batch put aside, the block counts
        // as the tail as below (a later batch, the one awaited, starts that again).
        w.flags |= WAIT_TIMED_OUT;
        wait_tail(w, block);
    } else if w.data_end_ns != 0 && classic {
        // Where the class is unknown (the classic programs) a sleep after the batch (a step's
        // pause) cannot be told from a timeout: a block no process of the job ended ends the
        // wait at its batch. Where it is known, a sleep never joins (`breaks_wait`), and a
        // timeout after a batch put aside is still the wait for the one awaited.
        w.flags |= WAIT_DONE;
    } else {
        // A block no process of the job ended, after the batch came (the GIL, a lock): the
        // trainer could not use it yet; a later batch moves the wait's end past it anyway.
        wait_tail(w, block);
    }
}

/// Time `ns` the thread spent off CPU (a run-queue wait, a page fault, a block no process of
/// the job ended) after its wait's batch came and before it got back to work: the trainer
/// had not got its data yet (its log's data_time counts it), so the wait lasts that long more.
#[inline(always)]
pub fn wait_tail(w: &mut LogicalWait, ns: u64) {
    let tail_open = w.start_ns != 0
        && w.data_end_ns != 0
        && w.flags & WAIT_DONE == 0
        && (w.ran_ns as u64) < join_ns(w);
    if tail_open {
        w.tail_ns = w.tail_ns.saturating_add(ns.min(u32::MAX as u64) as u32);
    }
}

/// A reclaim of `ns` ended at `now` in a data waiter's thread, on a CPU since `on_cpu_since`.
/// Reclaim runs on the CPU, in the allocating thread, and is never the thread's own work: in a
/// wait it does not count toward [`WAIT_JOIN_NS`]. Before the batch came, it is the turn of a
/// wait loop stalled on memory (a poll that ran out, then Python's status check faulting its
/// pages back in: 2-8 ms of reclaim for 0.1-0.4 ms of work, measured under the demo's memory
/// cgroup), and the wait goes on. After the batch came and before the thread got back to work
/// (receiving the batch: its pages, its tensors), the trainer still had no data to use, and its
/// log's data_time counts it: the wait lasts that long more. Only its part in the current
/// stretch on CPU counts: a sleep inside it was counted when it ended ([`wait_tail`]). Returns
/// the time the thread's work on CPU is counted from.
#[inline(always)]
pub fn wait_reclaimed(w: &mut LogicalWait, on_cpu_since: u64, now: u64, ns: u64) -> u64 {
    let on_cpu = now.saturating_sub(on_cpu_since);
    let ns = ns.min(on_cpu);
    let worked = (w.ran_ns as u64).saturating_add(on_cpu - ns);
    let open = w.start_ns != 0 && w.flags & WAIT_DONE == 0 && worked < join_ns(w);
    if !open {
        return on_cpu_since;
    }
    if w.data_end_ns != 0 {
        w.tail_ns = w.tail_ns.saturating_add(ns.min(u32::MAX as u64) as u32);
    }
    on_cpu_since + ns
}

/// A data waiter's thread, on a CPU since `on_cpu_since`, leaves it at `now` into `st`;
/// `reclaim_start`: when a reclaim it is still in began. What of this stretch was a stall, not
/// its work, is taken off as at a reclaim's end ([`wait_reclaimed`]): the reclaim's part (it
/// was preempted or sleeps inside it), or for an uninterruptible sleep its way in, up to
/// [`SLEEP_ENTRY_NS`] (a page fault's swap-in). Returns the time its work is counted from.
#[inline(always)]
pub fn wait_stalled(
    w: &mut LogicalWait,
    on_cpu_since: u64,
    now: u64,
    st: u16,
    reclaim_start: Option<u64>,
) -> u64 {
    let stall = match reclaim_start {
        Some(r) => now.saturating_sub(r),
        None if st == state::IO => SLEEP_ENTRY_NS,
        None => 0,
    };
    if stall == 0 {
        return on_cpu_since;
    }
    wait_reclaimed(w, on_cpu_since, now, stall)
}

/// Closes the wait in progress (at a switch-out that ends it, or the thread's exit).
#[inline(always)]
pub fn wait_finish(w: &mut LogicalWait) -> Option<FinishedWait> {
    let v = *w;
    *w = LogicalWait::default();
    if v.start_ns == 0 {
        return None;
    }
    let f = if v.data_end_ns != 0 {
        FinishedWait {
            start_ns: v.start_ns,
            end_ns: v.data_end_ns.saturating_add(u64::from(v.tail_ns)),
            waker: v.waker,
            waker_tid: v.waker_tid,
            relay_tid: v.relay_tid,
            slices: v.data_slices,
            job_wakes: v.job_wakes,
            class: v.class,
            co_waker: if co_arrival(v.start_ns, v.data_end_ns, v.co_at_ns) {
                v.co_waker
            } else {
                0
            },
        }
    } else {
        FinishedWait {
            start_ns: v.start_ns,
            end_ns: v.last_wake_ns.max(v.start_ns),
            waker: 0,
            waker_tid: 0,
            relay_tid: 0,
            slices: v.slices,
            job_wakes: 0,
            class: 0,
            co_waker: 0,
        }
    };
    (f.ns() > 0).then_some(f)
}

/// Whether a finished wait of thread `tid` of `pid` is its process's wait for data: the
/// consumer is the thread that runs the training loop, the main thread (PyTorch's, Lightning's
/// and Hugging Face's loops run there). A relay's own waits (the pin-memory thread idles on the
/// workers in a GPU-bound job) and those of the other threads (queue feeders, a thread woken
/// through the GIL) are not the trainer's. A loop run in another thread (Ray Train's) is not
/// measured.
#[inline(always)]
pub const fn consumer_wait(pid: u32, tid: u32, _f: &FinishedWait) -> bool {
    tid == pid
}

/// The clock in microseconds, wrapping (a relay's mark: compared over minutes at most).
#[inline(always)]
pub const fn wrapping_us(ns: u64) -> u32 {
    (ns / 1000) as u32
}

/// A wake of a data waiter's thread by `relay`, a sibling of its own process other than the
/// main thread (the consumer, never a relay), whose wait in progress began at `wait_start`:
/// the sibling passes on the batch of the process that last woke it (a relay), once, and only
/// to a thread that was already waiting when that batch reached the relay. A wait that began
/// after it (the consumer waiting for the GIL the relay holds while it works on the batch) is
/// not passed anything. Returns the process to charge (0: not a relay's hand-over).
#[inline(always)]
pub fn relay_charge(relay: &mut OffCpuThread, wait_start: u64) -> u32 {
    let from = relay.relay_from;
    if from == 0 || wait_start == 0 {
        return 0;
    }
    // Signed distance, wrapping: the wait began before the batch reached the relay.
    let before = relay.relay_at_us.wrapping_sub(wrapping_us(wait_start)) as i32 > 0;
    if !before {
        return 0;
    }
    relay.relay_from = 0;
    from
}

/// Off-CPU totals of one process (key: pid), summed over its threads.
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
// SAFETY: repr(C), integers only, padding spelled out (sizes pinned above).
unsafe impl aya::Pod for OffCpuThread {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl aya::Pod for WakeKey {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl aya::Pod for WakeCounters {}
#[cfg(feature = "user")]
// SAFETY: repr(C), an array of integers.
unsafe impl aya::Pod for Feeders {}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

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
    fn a_feeder_busy_when_the_batch_came_shares_the_wait_unless_a_batch_came_with_it() {
        let mut w = LogicalWait::default();
        let _ = wait_switch_out(&mut w, None, T0, state::WAIT, READ);
        // Worker 6's batch ended the wait while worker 5 was busy on its next one.
        wait_woken(
            &mut w,
            T0 + 90 * MS,
            READ,
            Wake { waker: 6, waker_tid: 60, busy_feeder: 5, ..Wake::default() },
        );
        let f = wait_finish(&mut w).unwrap();
        assert_eq!((f.waker, f.co_waker), (6, 5));
        // A batch of 7 put aside in the last quarter shares it instead.
        let _ = wait_switch_out(&mut w, None, T0, state::WAIT, READ);
        wait_woken(&mut w, T0 + 80 * MS, READ, Wake { waker: 7, waker_tid: 70, ..Wake::default() });
        let _ = wait_switch_out(&mut w, Some(T0 + 80 * MS), T0 + 80 * MS, state::WAIT, READ);
        wait_woken(
            &mut w,
            T0 + 90 * MS,
            READ,
            Wake { waker: 6, waker_tid: 60, busy_feeder: 5, ..Wake::default() },
        );
        assert_eq!(wait_finish(&mut w).map(|f| f.co_waker), Some(7));
        // The waker itself, or no busy feeder: nobody shares.
        let _ = wait_switch_out(&mut w, None, T0, state::WAIT, READ);
        wait_woken(
            &mut w,
            T0 + 90 * MS,
            READ,
            Wake { waker: 6, waker_tid: 60, busy_feeder: 6, ..Wake::default() },
        );
        assert_eq!(wait_finish(&mut w).map(|f| f.co_waker), Some(0));
        assert!(busy_feeder(state::ON_CPU) && busy_feeder(state::RUNQ) && busy_feeder(state::IO));
        assert!(!busy_feeder(state::WAIT), "waiting for an index: idle");
    }

    #[test]
    fn a_block_ends_at_its_wakeup_and_the_run_queue_wait_at_switch_in() {
        let t = OffCpuThread {
            since_ns: 100,
            pid: 7,
            state: state::WAIT,
            data_waiter: 1,
            wait_class: 1,
            ..Default::default()
        };
        assert_eq!(on_waking(&t, 350), WakeOutcome::Ended { state: state::WAIT, ns: 250 });
        let runq = OffCpuThread {
            since_ns: 350,
            pid: 7,
            state: state::RUNQ,
            data_waiter: 1,
            wait_class: 0,
            ..Default::default()
        };
        assert_eq!(on_waking(&runq, 400), WakeOutcome::Nothing, "already runnable");
        assert_eq!(on_switch_in(&runq, 420), Some((state::RUNQ, 70)));
        let on = OffCpuThread {
            since_ns: 0,
            pid: 7,
            state: state::ON_CPU,
            data_waiter: 0,
            wait_class: 0,
            ..Default::default()
        };
        assert_eq!(on_switch_in(&on, 420), None);
        assert_eq!(on_waking(&on, 420), WakeOutcome::Nothing);
    }

    const READ: u8 = crate::syscall::WaitClass::Read as u8;
    const POLL: u8 = crate::syscall::WaitClass::Poll as u8;
    const SLEEP: u8 = crate::syscall::WaitClass::Sleep as u8;
    const MS: u64 = 1_000_000;
    /// The clock's value at a test's time 0 (a wait's start of 0 means none is open).
    const T0: u64 = 1_000 * MS;

    /// Drives a thread through (switch-out at, class, woken at, waker, relay, runs for) blocks.
    fn run(w: &mut LogicalWait, blocks: &[(u64, u8, u64, u32, u32, u64)]) -> Vec<FinishedWait> {
        let mut out = Vec::new();
        let mut on_since = None;
        for &(out_at, class, woken_at, waker, relay, _) in blocks {
            out.extend(wait_switch_out(w, on_since, T0 + out_at, state::WAIT, class));
            wait_woken(
                w,
                T0 + woken_at,
                class,
                Wake { waker, waker_tid: waker + 1, relay_tid: relay, ..Wake::default() },
            );
            on_since = Some(T0 + woken_at);
        }
        out
    }

    #[test]
    fn timeouts_that_loop_back_are_one_wait_charged_to_the_worker_that_ended_it() {
        let mut w = LogicalWait::default();
        // A 100 ms poll runs out four times (a few us of Python in between), then worker 7's
        // batch arrives; the trainer works 30 ms and polls again.
        let f = run(
            &mut w,
            &[
                (0, POLL, 100 * MS, 0, 0, 0),
                (100 * MS + 20_000, POLL, 200 * MS, 0, 0, 0),
                (200 * MS + 20_000, POLL, 300 * MS, 0, 0, 0),
                (300 * MS + 20_000, POLL, 400 * MS, 0, 0, 0),
                (400 * MS + 20_000, POLL, 450 * MS, 7, 0, 0),
            ],
        );
        assert!(f.is_empty(), "still open: {f:?}");
        let done = wait_switch_out(&mut w, Some(T0 + 450 * MS), T0 + 480 * MS, state::WAIT, POLL);
        let done = done.expect("the trainer worked 30 ms: the wait is over");
        assert_eq!((done.start_ns, done.end_ns, done.waker), (T0, T0 + 450 * MS, 7));
        assert_eq!((done.slices, done.job_wakes), (5, 1), "four timeouts and the batch");
        assert_eq!(w.start_ns, T0 + 480 * MS, "the next wait opened");
    }

    #[test]
    fn a_batch_put_aside_keeps_the_wait_open_for_the_one_awaited() {
        let mut w = LogicalWait::default();
        // Worker 8's later batch wakes the trainer at 40 ms: it stores it (200 us) and waits
        // again; worker 9's batch, the one it needed, comes at 300 ms.
        run(&mut w, &[(0, READ, 40 * MS, 8, 0, 0), (40 * MS + 200_000, READ, 300 * MS, 9, 0, 0)]);
        let done = wait_finish(&mut w).expect("a wait");
        assert_eq!((done.waker, done.ns(), done.job_wakes), (9, 300 * MS, 2));
    }

    #[test]
    fn a_timeout_after_a_batch_put_aside_is_still_the_wait_for_the_one_awaited() {
        // PyTorch's _data_queue.get(timeout=5.0): a later batch at 1 s is put aside, the get
        // runs out at 6 s, the awaited batch comes at 8 s.
        let mut w = LogicalWait::default();
        let s = 1_000 * MS;
        run(
            &mut w,
            &[
                (0, POLL, s, 8, 0, 0),
                (s + 200_000, POLL, 6 * s, 0, 0, 0),
                (6 * s + 50_000, POLL, 8 * s, 9, 0, 0),
            ],
        );
        let f = wait_finish(&mut w).expect("a wait");
        assert_eq!((f.ns(), f.waker, f.slices, f.job_wakes), (8 * s, 9, 3, 2));
    }

    #[test]
    fn a_slow_turn_after_a_timeout_is_the_wait_loops_and_a_step_after_a_batch_ends_the_wait() {
        // A hung trainer: a later batch put aside at 1 s, then get(timeout=5.0) runs out at
        // 6 s and 11 s; the turn after the first takes 4 ms (a garbage collection).
        let s = 1_000 * MS;
        let mut w = LogicalWait::default();
        let f = run(
            &mut w,
            &[
                (0, POLL, s, 8, 0, 0),
                (s + 200_000, POLL, 6 * s, 0, 0, 0),
                (6 * s + 4 * MS, POLL, 11 * s, 0, 0, 0),
                (11 * s + 50_000, POLL, 12 * s, 0, 0, 0),
            ],
        );
        assert!(f.is_empty(), "one wait since 0: {f:?}");
        assert_eq!((w.start_ns, w.slices), (T0, 4));
        // A turn of the timeout's allowance or more is work: the wait is over.
        let f =
            wait_switch_out(&mut w, Some(T0 + 12 * s), T0 + 12 * s + 20 * MS, state::WAIT, POLL);
        assert_eq!(f.map(|f| (f.start_ns, f.waker)), Some((T0, 8)));
        // A batch, then 4 ms on CPU: the step, the wait over as before.
        let mut w = LogicalWait::default();
        run(&mut w, &[(0, POLL, 2 * s, 9, 0, 0)]);
        let f = wait_switch_out(&mut w, Some(T0 + 2 * s), T0 + 2 * s + 4 * MS, state::WAIT, POLL);
        assert_eq!(f.map(|f| (f.ns(), f.waker)), Some((2 * s, 9)));
        // A short poll that ran out (100 ms) and a 4 ms turn: not a timed wait, over.
        let mut w = LogicalWait::default();
        run(&mut w, &[(0, POLL, 100 * MS, 0, 0, 0)]);
        let f = wait_switch_out(&mut w, Some(T0 + 100 * MS), T0 + 104 * MS, state::WAIT, POLL);
        assert_eq!(f.map(|f| f.waker), Some(0));
    }

    #[test]
    fn batches_that_come_together_share_the_wait_and_early_ones_do_not() {
        // Two identical workers: 8's batch 5 ms before 9's, the one awaited, in an 80 ms wait.
        let mut w = LogicalWait::default();
        run(&mut w, &[(0, POLL, 75 * MS, 8, 0, 0), (75 * MS + 100_000, POLL, 80 * MS, 9, 0, 0)]);
        let f = wait_finish(&mut w).expect("a wait");
        assert_eq!((f.waker, f.co_waker), (9, 8));
        // A fast worker's batch put aside 60 ms into a 240 ms wait for a slow one: no share.
        let mut w = LogicalWait::default();
        run(&mut w, &[(0, POLL, 60 * MS, 8, 0, 0), (60 * MS + 100_000, POLL, 240 * MS, 9, 0, 0)]);
        assert_eq!(wait_finish(&mut w).map(|f| (f.waker, f.co_waker)), Some((9, 0)));
        // Two batches of the awaited worker itself: nobody to share with.
        let mut w = LogicalWait::default();
        run(&mut w, &[(0, POLL, 78 * MS, 9, 0, 0), (78 * MS + 100_000, POLL, 80 * MS, 9, 0, 0)]);
        assert_eq!(wait_finish(&mut w).map(|f| f.co_waker), Some(0));
        assert!(co_arrival(T0, T0 + 10 * MS, T0 + 8 * MS + 500_000), "within 2 ms of the end");
        assert!(!co_arrival(T0, T0 + 10 * MS, 0), "none");
    }

    #[test]
    fn the_time_the_trainer_could_not_use_its_batch_is_part_of_the_wait() {
        // Worker 7's batch at 50 ms; the trainer waits 8 ms for a CPU, runs 200 us, faults
        // (D) 5 ms, then computes: the wait ends at 63.2 ms less its 200 us on CPU.
        let mut w = LogicalWait::default();
        run(&mut w, &[(0, READ, 50 * MS, 7, 0, 0)]);
        wait_tail(&mut w, 8 * MS); // switched in at 58 ms
        let f = wait_switch_out(&mut w, Some(T0 + 58 * MS), T0 + 58 * MS + 200_000, state::IO, 0);
        assert!(f.is_none());
        wait_tail(&mut w, 5 * MS); // the fault's end, then its run-queue wait of none
        let f =
            wait_switch_out(&mut w, Some(T0 + 63 * MS + 200_000), T0 + 80 * MS, state::WAIT, SLEEP);
        assert_eq!(f.map(|f| (f.ns(), f.waker)), Some((63 * MS, 7)));
        // Once it has run 1 ms, nothing more is its wait's.
        let mut w = LogicalWait::default();
        run(&mut w, &[(0, READ, 50 * MS, 7, 0, 0)]);
        let f = wait_switch_out(&mut w, Some(T0 + 50 * MS), T0 + 52 * MS, state::RUNQ, 0);
        assert_eq!(f.map(|f| f.ns()), Some(50 * MS), "preempted after 2 ms of work: over");
        wait_tail(&mut w, 30 * MS);
        assert_eq!(wait_finish(&mut w), None);
        // A later batch (put aside, then the awaited one) starts the tail again.
        let mut w = LogicalWait::default();
        run(&mut w, &[(0, READ, 20 * MS, 8, 0, 0)]);
        wait_tail(&mut w, 3 * MS);
        let _ =
            wait_switch_out(&mut w, Some(T0 + 23 * MS), T0 + 23 * MS + 100_000, state::WAIT, READ);
        wait_woken(&mut w, T0 + 90 * MS, READ, Wake { waker: 9, waker_tid: 90, ..Wake::default() });
        assert_eq!(wait_finish(&mut w).map(|f| (f.ns(), f.waker)), Some((90 * MS, 9)));
    }

    #[test]
    fn reclaim_before_the_batch_is_used_is_part_of_the_wait() {
        // Worker 7's batch at 50 ms; the trainer is on a CPU at 51 ms, runs 300 us, then
        // reclaims 12 ms (memcg reclaim receiving the batch), runs 300 us more and sleeps.
        let mut w = LogicalWait::default();
        run(&mut w, &[(0, READ, 50 * MS, 7, 0, 0)]);
        wait_tail(&mut w, MS);
        let since = T0 + 51 * MS;
        let now = since + 300_000 + 12 * MS;
        let since = wait_reclaimed(&mut w, since, now, 12 * MS);
        assert_eq!(since, T0 + 63 * MS, "the reclaim is not its work");
        let f = wait_switch_out(&mut w, Some(since), now + 300_000, state::WAIT, SLEEP);
        assert_eq!(f.map(|f| f.ns()), Some(63 * MS), "the batch came at 50, used after 13 ms");
        // After a millisecond of its own work, a reclaim is the step's, not the wait's.
        let mut w = LogicalWait::default();
        run(&mut w, &[(0, READ, 50 * MS, 7, 0, 0)]);
        let since = T0 + 50 * MS;
        let now = since + 2 * MS + 5 * MS;
        assert_eq!(wait_reclaimed(&mut w, since, now, 5 * MS), since);
        let f = wait_switch_out(&mut w, Some(since), now, state::WAIT, SLEEP);
        assert_eq!(f.map(|f| f.ns()), Some(50 * MS));
        // A reclaim longer than this stretch on CPU (it slept inside): only the stretch counts.
        let mut w = LogicalWait::default();
        run(&mut w, &[(0, READ, 50 * MS, 7, 0, 0)]);
        let since = T0 + 60 * MS;
        assert_eq!(wait_reclaimed(&mut w, since, since + 2 * MS, 9 * MS), since + 2 * MS);
        assert_eq!(w.tail_ns, 2_000_000);
        // No wait open: nothing to add to.
        let mut w = LogicalWait::default();
        assert_eq!(wait_reclaimed(&mut w, T0, T0 + MS, MS), T0);
        assert_eq!(w.tail_ns, 0);
    }

    /// A poll of the trainer's opened at T0 and ran out at 100 ms, its batch not come.
    fn poll_ran_out_at_100_ms() -> LogicalWait {
        let mut w = LogicalWait::default();
        let _ = wait_switch_out(&mut w, None, T0, state::WAIT, READ);
        wait_woken(&mut w, T0 + 100 * MS, READ, Wake::default());
        w
    }

    /// Worker 7's batch ends the wait at 130 ms: the wait finished (its length, its waker).
    fn batch_of_7_at_130_ms(w: &mut LogicalWait) -> Option<(u64, u32)> {
        wait_woken(w, T0 + 130 * MS, READ, Wake { waker: 7, waker_tid: 70, ..Wake::default() });
        wait_finish(w).map(|f| (f.ns(), f.waker))
    }

    #[test]
    fn reclaim_in_a_wait_loops_turn_does_not_end_the_wait() {
        // Measured under the demo's memory cgroup: the trainer's poll runs out at 100 ms; its
        // status check then stalls 2.1 ms in reclaim (faulting its pages back in) around
        // 0.4 ms of its own work, polls again, and worker 7's batch comes at 130 ms.
        let mut w = poll_ran_out_at_100_ms();
        let since = T0 + 100 * MS;
        let since = wait_reclaimed(&mut w, since, since + 200_000 + 2_100_000, 2_100_000);
        assert_eq!(since, T0 + 102 * MS + 100_000, "the reclaim is not its work");
        let f = wait_switch_out(&mut w, Some(since), T0 + 102 * MS + 500_000, state::WAIT, READ);
        assert!(f.is_none(), "0.4 ms of its own work: one wait");
        assert_eq!(w.tail_ns, 0, "no batch yet: the reclaim lasts nothing past it");
        assert_eq!(batch_of_7_at_130_ms(&mut w), Some((130 * MS, 7)));
        // The same turn with the reclaim still in progress at a preemption: its part of the
        // stretch is not work either.
        let mut w = poll_ran_out_at_100_ms();
        let (since, now) = (T0 + 100 * MS, T0 + 102 * MS + 300_000);
        let since = wait_stalled(&mut w, since, now, state::RUNQ, Some(T0 + 100 * MS + 200_000));
        assert!(wait_switch_out(&mut w, Some(since), now, state::RUNQ, 0).is_none());
        assert_eq!(w.ran_ns, 200_000, "the 0.2 ms before the reclaim began");
        // Counted as work, the 2.5 ms on CPU split it: the 100 ms no process of the job ended
        // (left out of the wait for data), and 28 ms charged to worker 7.
        let mut w = poll_ran_out_at_100_ms();
        let f = wait_switch_out(&mut w, Some(T0 + 100 * MS), T0 + 102 * MS, state::WAIT, READ);
        assert_eq!(f.map(|f| (f.ns(), f.waker)), Some((100 * MS, 0)));
    }

    #[test]
    fn page_faults_in_a_wait_loops_turn_do_not_end_the_wait() {
        // Measured under the demo's memory cgroup: after its poll ran out at 100 ms, the
        // trainer's status check faulted ten pages back in from swap, 0.1 ms on CPU before
        // each sleep on the read (1.3 ms in all with its own 0.15 ms), then polled again.
        let mut w = poll_ran_out_at_100_ms();
        let mut at = T0 + 100 * MS;
        for _ in 0..10 {
            let since = wait_stalled(&mut w, at, at + 110_000, state::IO, None);
            assert!(wait_switch_out(&mut w, Some(since), at + 110_000, state::IO, 0).is_none());
            at += 400_000; // the read, then back on a CPU
        }
        let f = wait_switch_out(&mut w, Some(at), at + 150_000, state::WAIT, READ);
        assert!(f.is_none(), "0.15 ms of its own work: one wait");
        assert_eq!(batch_of_7_at_130_ms(&mut w), Some((130 * MS, 7)));
        // A step's work is not taken for faults: 3 ms on CPU, then a fault, is work.
        let mut w = LogicalWait::default();
        run(&mut w, &[(0, READ, 50 * MS, 7, 0, 0)]);
        let since = T0 + 50 * MS;
        let since = wait_stalled(&mut w, since, since + 3 * MS, state::IO, None);
        assert_eq!(since, T0 + 50 * MS, "past its join, nothing is the wait's");
        let f = wait_switch_out(&mut w, Some(since), T0 + 53 * MS, state::IO, 0);
        assert_eq!(f.map(|f| (f.ns(), f.waker)), Some((50 * MS, 7)));
        // After the batch came, a fault's way in while receiving it lasts the wait, as its read.
        let mut w = LogicalWait::default();
        run(&mut w, &[(0, READ, 50 * MS, 7, 0, 0)]);
        let since = wait_stalled(&mut w, T0 + 50 * MS, T0 + 50 * MS + 100_000, state::IO, None);
        assert_eq!(since, T0 + 50 * MS + 100_000);
        assert_eq!(w.tail_ns, 100_000);
    }

    #[test]
    fn a_sleep_after_the_data_is_not_part_of_the_wait() {
        // The demo's trainer: its batch at 50 ms, then a 40 ms sleep (its GPU step).
        let mut w = LogicalWait::default();
        run(&mut w, &[(0, READ, 50 * MS, 7, 0, 0)]);
        let f =
            wait_switch_out(&mut w, Some(T0 + 50 * MS), T0 + 50 * MS + 100_000, state::WAIT, SLEEP);
        assert_eq!(f.map(|f| (f.ns(), f.waker)), Some((50 * MS, 7)));
        assert_eq!(w.start_ns, 0, "a sleep opens no wait");
        // Where the class is unknown (classic programs) the sleep's timer ends it instead.
        let mut w = LogicalWait::default();
        run(&mut w, &[(0, 0, 50 * MS, 7, 0, 0), (50 * MS + 100_000, 0, 90 * MS, 0, 0, 0)]);
        let f = wait_switch_out(&mut w, Some(T0 + 90 * MS), T0 + 90 * MS + 100_000, state::WAIT, 0);
        assert_eq!(f.map(|f| (f.ns(), f.waker)), Some((50 * MS, 7)), "over at its data");
    }

    #[test]
    fn a_wait_no_process_of_the_job_ended_is_kept_apart() {
        let mut w = LogicalWait::default();
        run(&mut w, &[(0, POLL, 100 * MS, 0, 0, 0), (100 * MS + 1000, POLL, 200 * MS, 0, 0, 0)]);
        let f = wait_switch_out(&mut w, Some(T0 + 200 * MS), T0 + 205 * MS, state::RUNQ, 0);
        let f = f.expect("5 ms of work ended it");
        assert_eq!((f.waker, f.ns(), f.slices), (0, 200 * MS, 2));
        assert_eq!(w, LogicalWait::default(), "a preemption opens nothing");
    }

    #[test]
    fn a_relay_passes_its_batch_on_once_and_only_the_consumer_waits() {
        let marked = |at_ns: u64| OffCpuThread {
            pid: 10,
            relay_from: 7,
            relay_at_us: wrapping_us(at_ns),
            ..Default::default()
        };
        let mut relay = marked(T0 + 50 * MS);
        assert_eq!(relay_charge(&mut relay, T0 + 60 * MS), 0, "a GIL wait begun after the batch");
        assert_eq!(relay_charge(&mut relay, T0), 7, "a consumer waiting since before it");
        assert_eq!(relay_charge(&mut relay, T0), 0, "a second wake passes nothing");
        assert_eq!(relay_charge(&mut marked(T0), 0), 0, "no wait in progress");
        // Across the microsecond clock's wrap.
        let wrap = (u32::MAX as u64 + 1) * 1000;
        assert_eq!(relay_charge(&mut marked(wrap + 5 * MS), wrap - 5 * MS), 7);
        let direct = FinishedWait {
            start_ns: 0,
            end_ns: 1,
            waker: 7,
            waker_tid: 70,
            relay_tid: 0,
            slices: 1,
            job_wakes: 1,
            class: READ,
            co_waker: 0,
        };
        assert!(consumer_wait(10, 10, &direct), "the main thread");
        assert!(!consumer_wait(10, 11, &direct), "a relay's own wait on the workers");
        let via_relay = FinishedWait { relay_tid: 12, ..direct };
        assert!(!consumer_wait(10, 11, &via_relay), "a queue feeder woken through the GIL");
    }

    #[test]
    fn io_blocks_and_preemptions_neither_open_nor_end_a_short_wait() {
        let mut w = LogicalWait::default();
        run(&mut w, &[(0, READ, 10 * MS, 0, 0, 0)]);
        // 100 us on CPU, a page fault (D), 100 us more, preempted, then blocks again.
        assert!(wait_switch_out(&mut w, Some(T0 + 10 * MS), T0 + 10 * MS + 100_000, state::IO, 0)
            .is_none());
        assert!(wait_switch_out(
            &mut w,
            Some(T0 + 15 * MS),
            T0 + 15 * MS + 100_000,
            state::RUNQ,
            0
        )
        .is_none());
        assert!(wait_switch_out(
            &mut w,
            Some(T0 + 16 * MS),
            T0 + 16 * MS + 100_000,
            state::WAIT,
            READ
        )
        .is_none());
        assert_eq!(w.slices, 2, "one wait, two blocks");
        wait_woken(&mut w, T0 + 40 * MS, READ, Wake { waker: 7, waker_tid: 70, ..Wake::default() });
        let f = wait_finish(&mut w).expect("a wait");
        assert_eq!((f.ns(), f.waker_tid), (40 * MS, 70));
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
