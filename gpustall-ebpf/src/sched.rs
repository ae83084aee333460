//! Off-CPU accounting of tracked threads (sched_switch, sched_waking): the hottest tracepoints
//! there are, so each program does one map lookup for a thread that is not tracked and sends
//! no record per switch: blocks, run-queue waits and who ended them are summed in maps the
//! agent reads once a second (see `gpustall_common::sched`). A trainer's or rank's thread's
//! blocks are joined into logical waits (`sched::LogicalWait`: across timeouts, batches put
//! aside and a relay thread), each charged once, when it is over, to the process whose batch
//! ended it; only one of `LONG_WAIT_NS` or more is also sent, to be drawn one by one.
//! A trainer's or rank's thread going to sleep interruptibly also keeps the class of the
//! syscall it blocked in (`gpustall_common::syscall`): a read of a worker's pipe and an ioctl
//! into a GPU driver are told apart per class in `SYSCALL_WAITS`.

use aya_ebpf::{
    helpers::{bpf_get_current_task, bpf_get_current_task_btf, bpf_ktime_get_ns, bpf_task_pt_regs},
    macros::{btf_tracepoint, map, tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray},
    programs::{BtfTracePointContext, TracePointContext},
    EbpfContext as _,
};
use gpustall_common::{
    events::{DataWaitEvent, EventHeader, EventKind},
    hint::HINT_SLOTS,
    sched::{
        busy_feeder, classify, consumer_wait, on_switch_in, on_waking, relay_charge, report_state,
        state, wait_finish, wait_reclaimed, wait_stalled, wait_switch_out, wait_tail, wait_woken,
        wake_bucket, wrapping_us, Feeders, FinishedWait, LogicalWait, OffCpuCounters, OffCpuThread,
        SchedOffsets, StackLayout, Wake, WakeCounters, WakeKey, WakeOutcome, ACCOUNT,
        ACCOUNT_WAITS, FEEDER_SLOTS, LONG_WAIT_NS, OFFCPU_PROCESSES, WAKE_BUCKETS,
    },
    syscall::{x86_64_class, SyscallWaits, WaitClass, WAIT_CLASSES},
    task::UNKNOWN as TASK_UNKNOWN,
    COMM_LEN,
};

use crate::common::{
    at_most, atomic_add, current_ids, emit_bulk, field, hint_add, is_tracked, kload, maybe_in,
    shared_value, task_offset, tracked_level, BPF_F_NO_PREALLOC, RECLAIM_START,
};

/// Written by the agent before load, from the sched_switch and sched_waking format files.
#[unsafe(no_mangle)]
pub static SCHED_OFFSETS: SchedOffsets = SchedOffsets::missing();

/// Written by the agent before load: where `struct pt_regs` keeps the syscall number (x86_64
/// `orig_ax`, from BTF), or `TASK_UNKNOWN` (another architecture, no BTF): then unread.
#[unsafe(no_mangle)]
pub static SYSCALL_NR_OFFSET: u32 = TASK_UNKNOWN;

/// Written by the agent before load, from BTF: how the typed sched_waking tells interrupt
/// context from the current task's (see `StackLayout`); unknown, it reads `IN_TIMER`.
#[unsafe(no_mangle)]
pub static STACK_LAYOUT: StackLayout = StackLayout::unknown();

macro_rules! sched_offset {
    ($field:ident) => {
        // SAFETY: a plain static of integers; the loader rewrites it before load.
        unsafe { core::ptr::read_volatile(&SCHED_OFFSETS.$field) }
    };
}

// Sizes: only the job's own roles are accounted (the agent raises their `TRACKED` value, at
// most `OFFCPU_PROCESSES` of them), so these follow the job, not the tracked tree; together
// they stay within the 16 MiB bound of all maps (kernel::mapmem).

/// Accounted threads by thread id: where each is (off CPU since when, in which state), and a
/// data waiter's logical wait in progress. LRU: a thread that died unseen (its last switch-out
/// after its process left the tracked set) is evicted by newer ones instead of filling the
/// map. 2,432 threads of the job's roles (88 bytes each) keep all maps within 16 MiB.
#[map]
pub static OFFCPU_THREADS: LruHashMap<u32, OffCpuThread> = LruHashMap::with_max_entries(2432, 0);

/// `OFFCPU_THREADS`' entries per bucket of tids (`gpustall_common::hint`): a switch-in or a
/// wakeup of a thread no one accounts costs an array load, not an LRU lookup. Only this file
/// inserts and deletes there; an LRU eviction leaves the count high (a needless lookup).
#[map]
pub static ACCOUNTED_HINT: Array<u64> = Array::with_max_entries(HINT_SLOTS, 0);

/// Off-CPU totals per accounted process, one value for all CPUs (atomic adds).
#[map]
pub static OFFCPU: HashMap<u32, OffCpuCounters> =
    HashMap::with_max_entries(OFFCPU_PROCESSES, BPF_F_NO_PREALLOC);

/// Trainers' and ranks' logical waits, per (waker, wakee) pair (waker 0: no process of the job
/// ended them). Preallocated: a new pair is mostly created when a wait ends, in sched_switch
/// with the run queue locked, where an allocation on demand can fail (-ENOMEM, seen in about
/// one run in three of the out-of-order job before). 384 pairs: a node's ranks times their
/// workers, and the 16 MiB bound of all maps.
#[map]
pub static WAKES: HashMap<WakeKey, WakeCounters> = HashMap::with_max_entries(384, 0);

/// Each trainer's or rank's workers (key: its pid), written by the agent from the process
/// tree: when a batch ends its wait, one of them busy producing shares it (`busy_feeder_of`).
/// One per data waiter: 64, a node's ranks (a few per GPU), within the 16 MiB bound of all
/// maps; past it a waiter's waits go to the worker whose batch ended them alone.
#[map]
pub static FEEDERS: HashMap<u32, Feeders> = HashMap::with_max_entries(64, BPF_F_NO_PREALLOC);

/// Trainers' and ranks' interruptible waits by the class of the syscall they blocked in. Sized
/// for the job's data waiters (a node's ranks, a few per GPU), allocated on use: 224 bytes an
/// entry, about 21 KiB when full. Past it a new waiter's waits are counted as lost (map full).
#[map]
pub static SYSCALL_WAITS: HashMap<u32, SyscallWaits> =
    HashMap::with_max_entries(64, BPF_F_NO_PREALLOC);

/// Per CPU: 1 inside an hrtimer callback. A wakeup there ends a timeout (a sleep, a poll or a
/// timed wait running out), and `current` is only the task the timer interrupted: it must not
/// be charged with keeping the trainer waiting. For the classic sched_waking, and the typed one
/// where `STACK_LAYOUT` is unknown: the loader attaches the hrtimer programs only then.
#[map]
pub static IN_TIMER: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn set_in_timer(v: u32) -> u32 {
    if let Some(p) = IN_TIMER.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; only this CPU writes it, with preemption off in the callback.
        unsafe { *p = v };
    }
    0
}

/// Whether the current CPU runs an hrtimer callback.
#[inline(always)]
fn in_timer() -> bool {
    // SAFETY: this CPU's slot, read only.
    IN_TIMER.get(0).is_some_and(|v| *v != 0)
}

/// Whether this program runs in interrupt context (typed programs), where `current` is only
/// the task the interrupt landed on (`StackLayout`). On x86_64 an interrupt of kernel code, and
/// softirqs run from `local_bh_enable`, run on a per-CPU stack: the arguments the kernel handed
/// the program (`args`, an array on the stack of the kernel function that runs it; the
/// program's own frame may be a per-CPU private stack, 6.13+) are then off the task's stack. An
/// interrupt of user code runs on the task's stack, but the task then entered the kernel by
/// no syscall: the registers its entry saved say -1 where a syscall's number would be. Where
/// the layout is unknown: whether an hrtimer callback runs (the hrtimer programs run then).
#[inline(always)]
fn in_interrupt(args: *const u8) -> bool {
    // SAFETY: plain statics of integers; the loader rewrites them before load (read-only: the
    // verifier knows their values and drops the branch not taken).
    let (layout, nr_off) = unsafe {
        (core::ptr::read_volatile(&STACK_LAYOUT), core::ptr::read_volatile(&SYSCALL_NR_OFFSET))
    };
    if !layout.knows() || nr_off == TASK_UNKNOWN {
        return in_timer();
    }
    // SAFETY: helper calls on the current task; `kload` reads `task->stack` (a plain number)
    // and the saved syscall number at BTF offsets.
    unsafe {
        let task = bpf_get_current_task_btf();
        let stack: u64 = kload(task as *const u8, layout.task_stack);
        // The arguments' address: their distance from the task (one pointer less another is a
        // plain number for root, see `block::address`), plus the task's address as a number.
        // In assembly, so that the compiler cannot fold the two into arithmetic on a pointer.
        let from_task: u64;
        core::arch::asm!(
            "{d} = {args}",
            "{d} -= {task}",
            d = out(reg) from_task,
            args = in(reg) args as u64,
            task = in(reg) task as u64,
            options(pure, nomem, nostack),
        );
        if !layout.on_task_stack(from_task.wrapping_add(bpf_get_current_task()), stack) {
            return true;
        }
        let nr: i64 = kload(bpf_task_pt_regs(task) as *const u8, nr_off);
        nr < 0
    }
}

#[tracepoint]
pub fn hrtimer_expire_entry(_ctx: TracePointContext) -> u32 {
    set_in_timer(1)
}

#[tracepoint]
pub fn hrtimer_expire_exit(_ctx: TracePointContext) -> u32 {
    set_in_timer(0)
}

/// Reports where a tracked thread ended up; exits are dropped from the map at once.
const TASK_REPORT_DEAD: i64 = 0x10 | 0x20;

#[tracepoint]
pub fn sched_switch(ctx: TracePointContext) -> u32 {
    on_switch(
        || field(&ctx, sched_offset!(switch_prev_state)).unwrap_or(0),
        || field(&ctx, sched_offset!(switch_next_pid)).unwrap_or(0),
        // The classic program gets no task pointer to read registers from.
        || WaitClass::Unknown as u8,
    )
}

/// The same, BTF-typed (5.18+: `prev_state` is an argument): the next thread's id is a plain
/// load from its task, not a field copied out of a record the kernel built first.
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch_btf(ctx: BtfTracePointContext) -> i32 {
    // (bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state)
    let preempt: u64 = ctx.arg(0);
    let next: *const u8 = ctx.arg(2);
    let raw_state: u64 = ctx.arg(3);
    on_switch(
        || report_state(preempt as u8 != 0, raw_state as u32),
        || kload(next, task_offset!(task_pid)),
        current_wait_class,
    );
    0
}

/// The class of the syscall the current task is in: the number its user entry saved in its
/// `pt_regs` at the top of its kernel stack (`orig_ax`, kept for the whole syscall; a nested
/// fault's registers are elsewhere). Typed programs only: both helpers want BTF pointers.
#[inline(always)]
fn current_wait_class() -> u8 {
    // SAFETY: a plain static of an integer; the loader rewrites it before load (read-only: the
    // verifier knows its value and drops the branch not taken).
    let off = unsafe { core::ptr::read_volatile(&SYSCALL_NR_OFFSET) };
    if off == TASK_UNKNOWN {
        return WaitClass::Unknown as u8;
    }
    // SAFETY: helper calls; the task is the current one, never null, and `bpf_task_pt_regs`
    // returns a BTF pointer to its `struct pt_regs`, which `kload` reads at a BTF offset.
    let nr: u64 = unsafe {
        let task = bpf_get_current_task_btf();
        let regs = bpf_task_pt_regs(task) as *const u8;
        kload(regs, off)
    };
    x86_64_class(nr) as u8
}

/// The thread leaving the CPU is the current one; its state and the next thread's id are read
/// only when needed (`prev_state` for an accounted thread only).
/// `wait_class` is only called for a trainer's or rank's thread going to sleep interruptibly.
#[inline(always)]
fn on_switch(
    prev_state: impl FnOnce() -> i64,
    next_tid: impl FnOnce() -> u32,
    wait_class: impl FnOnce() -> u8,
) -> u32 {
    let now = switch_out(prev_state, wait_class);
    switch_in(next_tid(), now);
    0
}

/// The current thread leaves the CPU: it exited (dropped from the map), or it is off CPU in a
/// state, and a data waiter's logical wait takes the switch. Returns the time it read, 0 when
/// the thread is not accounted (the common case outside the job reads no clock).
#[inline(always)]
fn switch_out(prev_state: impl FnOnce() -> i64, wait_class: impl FnOnce() -> u8) -> u64 {
    let (pid, tid) = current_ids();
    let level = if tid == 0 { 0 } else { tracked_level(pid) };
    if level < ACCOUNT {
        return 0;
    }
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let prev_state = prev_state();
    if prev_state & TASK_REPORT_DEAD != 0 && prev_state < 0x100 {
        thread_exit(pid, tid);
        if OFFCPU_THREADS.remove(tid).is_ok() {
            hint_add(&ACCOUNTED_HINT, tid, u64::MAX);
        }
        return now;
    }
    let st = classify(prev_state);
    let data_waiter = level == ACCOUNT_WAITS;
    let class = if data_waiter && st == state::WAIT { wait_class() } else { 0 };
    // In place when the thread has its entry (every switch-out but its first): an LRU insert
    // takes the map's locks and a fresh node each time. The two arms stay here: moved into
    // functions of their own with the switch's figures in a struct, LLVM read a register it
    // never set and 6.18's verifier refused the typed program ("R5 !read_ok").
    match OFFCPU_THREADS.get_ptr_mut(tid) {
        // SAFETY: a live map value; the wakeup on another CPU may read it meanwhile, as it
        // reads the fields written at switch-in.
        Some(p) => unsafe {
            if data_waiter {
                let on_cpu = ((*p).state == state::ON_CPU).then_some((*p).since_ns);
                let on_cpu = on_cpu.map(|s| stalled(tid, &mut (*p).wait, s, now, st));
                // In place: a copy of the wait on the stack leaves too little of it for the
                // record a finished wait sends.
                let done = wait_switch_out(&mut (*p).wait, on_cpu, now, st, class);
                if let Some(f) = done {
                    finished_wait(pid, tid, &f);
                }
            }
            (*p).since_ns = now;
            (*p).pid = pid;
            (*p).state = st;
            (*p).data_waiter = u8::from(data_waiter);
            (*p).wait_class = class;
        },
        None => {
            let mut t = OffCpuThread {
                since_ns: now,
                pid,
                state: st,
                data_waiter: u8::from(data_waiter),
                wait_class: class,
                ..OffCpuThread::default()
            };
            if data_waiter {
                // A first block opens a wait; nothing is open to finish.
                let _ = wait_switch_out(&mut t.wait, None, now, st, class);
            }
            // Counted before the insert, taken back if it failed (hint's rule).
            hint_add(&ACCOUNTED_HINT, tid, 1);
            if OFFCPU_THREADS.insert(tid, t, 0).is_err() {
                hint_add(&ACCOUNTED_HINT, tid, u64::MAX);
            }
        }
    }
    now
}

/// The thread `next` comes on a CPU: an accounted one's time off CPU is added by its state, a
/// data waiter's run-queue wait after its batch lengthens its wait, and its entry says it is on
/// a CPU. `now`: the switch-out's clock reading, 0 when it read none.
#[inline(always)]
fn switch_in(next: u32, mut now: u64) {
    if next == 0 || !maybe_in(&ACCOUNTED_HINT, next) {
        return;
    }
    let Some(p) = OFFCPU_THREADS.get_ptr_mut(next) else {
        return;
    };
    // SAFETY: a live map value; copied out, then its state written back.
    let t = unsafe { *p };
    if now == 0 {
        // SAFETY: plain helper call.
        now = unsafe { bpf_ktime_get_ns() };
    }
    if let Some((st, ns)) = on_switch_in(&t, now) {
        add_offcpu(t.pid, st, ns);
        if t.data_waiter != 0 {
            if st == state::WAIT {
                add_syscall_wait(t.pid, t.wait_class, ns);
            }
            // A run-queue wait after its batch came: the trainer could not use it yet.
            let mut w = t.wait;
            wait_tail(&mut w, ns);
            // SAFETY: as above.
            unsafe { (*p).wait.tail_ns = w.tail_ns };
        }
    }
    // SAFETY: as above. When it came on a CPU: a data waiter's time on CPU between two
    // blocks decides whether they are one wait.
    unsafe {
        (*p).state = state::ON_CPU;
        (*p).since_ns = now;
    }
}

#[tracepoint]
pub fn sched_waking(ctx: TracePointContext) -> u32 {
    on_waking_of(field(&ctx, sched_offset!(waking_pid)).unwrap_or(0), in_timer)
}

/// The same, BTF-typed: the woken thread's id is a plain load from its task.
#[btf_tracepoint(function = "sched_waking")]
pub fn sched_waking_btf(ctx: BtfTracePointContext) -> i32 {
    let p: *const u8 = ctx.arg(0);
    let args = ctx.as_ptr() as *const u8;
    on_waking_of(kload(p, task_offset!(task_pid)), || in_interrupt(args));
    0
}

/// `interrupted`: whether the wakeup runs in an interrupt (then `current` ended nothing).
#[inline(always)]
fn on_waking_of(wakee: u32, interrupted: impl FnOnce() -> bool) -> u32 {
    if wakee == 0 || !maybe_in(&ACCOUNTED_HINT, wakee) {
        return 0;
    }
    let Some(p) = OFFCPU_THREADS.get_ptr_mut(wakee) else {
        return 0;
    };
    // SAFETY: a live map value, copied out.
    let t = unsafe { *p };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let WakeOutcome::Ended { state: st, ns } = on_waking(&t, now) else {
        return 0;
    };
    // SAFETY: as above: the thread is runnable from now on.
    unsafe {
        (*p).since_ns = now;
        (*p).state = state::RUNQ;
    }
    add_offcpu(t.pid, st, ns);
    if t.data_waiter == 0 {
        return 0;
    }
    if st != state::WAIT {
        // An uninterruptible block (a page fault, reclaim) after its batch came.
        let mut w = t.wait;
        wait_tail(&mut w, ns);
        // SAFETY: as above.
        unsafe { (*p).wait.tail_ns = w.tail_ns };
        return 0;
    }
    // Who ended the block: the task running this wakeup (a write to a pipe, a queue, a futex
    // wake) when it belongs to another tracked process; a thread of the wakee's own process
    // that passes on a batch another process woke it for (a relay); else no one of the job.
    let (waker, waker_tid) = current_ids();
    let (mut job, mut job_tid, mut relay) = (0, 0, 0);
    if !interrupted() {
        if waker != t.pid && is_tracked(waker) {
            (job, job_tid) = (waker, waker_tid);
            // SAFETY: as above: this thread was woken by that process (a relay's mark).
            unsafe {
                (*p).relay_from = waker;
                (*p).relay_at_us = wrapping_us(now);
            }
        } else if waker == t.pid && waker_tid != wakee && waker_tid != waker {
            // A sibling thread, never the main thread: that is the consumer itself (its wakes
            // of its own helpers, the queues' feeder threads, pass nothing on).
            if let Some(r) = OFFCPU_THREADS.get_ptr_mut(waker_tid) {
                // SAFETY: a live map value (the relay, running this wakeup).
                job = relay_charge(unsafe { &mut *r }, t.wait.start_ns);
                // The worker's thread that woke the relay is not kept: its main thread's id
                // stands for it.
                (job_tid, relay) = if job != 0 { (job, waker_tid) } else { (0, 0) };
            }
        }
    }
    add_syscall_wait(t.pid, t.wait_class, ns);
    let busy = if job != 0 && wakee == t.pid { busy_feeder_of(t.pid, job, now) } else { 0 };
    let mut w = t.wait;
    let by = Wake { waker: job, waker_tid: job_tid, relay_tid: relay, busy_feeder: busy };
    wait_woken(&mut w, now, t.wait_class, by);
    // SAFETY: as above; only this thread's own switch-out and wakeups write its wait, and a
    // thread is woken once per block.
    unsafe { (*p).wait = w };
    0
}

/// A feeder of data waiter `pid` other than `waker` busy producing now (its main thread's
/// state; one lookup a slot, at the consumer's wakes by the job only), 0: none. The scan
/// starts at a slot the clock picks, so that with several busy feeders each is picked in
/// turn over many waits.
#[inline(always)]
fn busy_feeder_of(pid: u32, waker: u32, now: u64) -> u32 {
    // SAFETY: a live map value, read in place (the agent may rewrite it meanwhile: a worker
    // replaced between two reads is seen or not).
    let Some(feeders) = (unsafe { FEEDERS.get(pid) }) else { return 0 };
    // Only the slots in use: a trainer with one worker (its waker) looks at none.
    let n = (feeders.count as usize).min(FEEDER_SLOTS);
    if n < 2 {
        return 0;
    }
    let start = (now >> 10) as usize;
    for i in 0..FEEDER_SLOTS {
        // A mask, not a remainder by `n`: a bound the verifier sees. Slots past `n` are 0.
        let p = feeders.pids[(start + i) & (FEEDER_SLOTS - 1)];
        if p == 0 || p == waker || !maybe_in(&ACCOUNTED_HINT, p) {
            continue;
        }
        // SAFETY: a live map value, one field read.
        if unsafe { OFFCPU_THREADS.get(p) }.is_some_and(|t| busy_feeder(t.state)) {
            return p;
        }
    }
    0
}

/// A data waiter's thread, on a CPU since `on_cpu_since`, leaves it at `now` into `st`: what of
/// the stretch was a stall (a reclaim in progress, an uninterruptible sleep's way in) is not its
/// work (`sched::wait_stalled`). Returns the time its work is counted from. One lookup, on the
/// switch-outs of data waiters with a wait open only.
#[inline(always)]
fn stalled(tid: u32, w: &mut LogicalWait, on_cpu_since: u64, now: u64, st: u16) -> u64 {
    if w.start_ns == 0 {
        return on_cpu_since;
    }
    // SAFETY: the start is copied out at once.
    let reclaim_start = unsafe { RECLAIM_START.get(tid) }.map(|r| r.start_ns);
    wait_stalled(w, on_cpu_since, now, st, reclaim_start)
}

/// A reclaim of `ns` that ended at `now` in thread `tid` (on its CPU): a data waiter's reclaim
/// inside its wait is not its work (the wait goes on), and after its batch came it lengthens
/// the wait (`sched::wait_reclaimed`).
#[inline(always)]
pub fn reclaimed(tid: u32, now: u64, ns: u64) {
    if !maybe_in(&ACCOUNTED_HINT, tid) {
        return;
    }
    let Some(p) = OFFCPU_THREADS.get_ptr_mut(tid) else {
        return;
    };
    // SAFETY: a live map value, written in place by the thread it is about, on its CPU.
    unsafe {
        if (*p).data_waiter != 0 && (*p).state == state::ON_CPU {
            (*p).since_ns = wait_reclaimed(&mut (*p).wait, (*p).since_ns, now, ns);
        }
    }
}

/// A thread of a tracked process exits (its last switch-out may come after its process left
/// the tracked set): the wait it was in is over.
#[inline(always)]
pub fn thread_exit(pid: u32, tid: u32) {
    if !maybe_in(&ACCOUNTED_HINT, tid) {
        return;
    }
    let Some(p) = OFFCPU_THREADS.get_ptr_mut(tid) else { return };
    // SAFETY: a live map value, copied out and written back.
    let mut w: LogicalWait = unsafe { (*p).wait };
    if let Some(f) = wait_finish(&mut w) {
        finished_wait(pid, tid, &f);
    }
    // SAFETY: as above.
    unsafe { (*p).wait = w };
}

/// A logical wait of thread `tid` of `pid` is over: a consumer's is its process's wait for
/// data, charged to the process whose batch ended it (key waker 0: no process of the job ended
/// it, kept apart and shown), summed per syscall class, and sent one by one when long.
#[inline(always)]
fn finished_wait(pid: u32, tid: u32, f: &FinishedWait) {
    if !consumer_wait(pid, tid, f) {
        return;
    }
    let ns = f.ns();
    if f.waker != 0 {
        add_data_wait(pid, f.class, ns);
        if ns >= LONG_WAIT_NS {
            emit_bulk(DataWaitEvent {
                header: EventHeader {
                    kind: EventKind::DataWait as u32,
                    pid: f.waker,
                    tid: f.waker_tid,
                    _pad: 0,
                    t_ns: f.end_ns,
                    comm: [0; COMM_LEN],
                },
                wakee_pid: pid,
                wakee_tid: tid,
                start_ns: f.start_ns,
                duration_ns: ns,
                wait_class: f.class,
                _pad: 0,
                slices: f.slices,
                job_wakes: f.job_wakes,
                _pad2: 0,
                relay_tid: f.relay_tid,
                co_waker: f.co_waker,
                _pad3: 0,
            });
        }
    }
    // The process that shares the wait gets half of its time, no count (the wait is counted
    // once, with its length in the waker's histogram).
    let shared = if f.co_waker != 0 && f.waker != 0 { ns / 2 } else { 0 };
    if shared != 0 {
        add_wake(WakeKey { waker: f.co_waker, wakee: pid }, shared, None);
    }
    add_wake(WakeKey { waker: f.waker, wakee: pid }, ns - shared, Some(ns));
}

/// Adds `ns` of a wait to a (waker, wakee) pair; `whole`: the wait's length, for its count,
/// histogram and maximum (`None`: a share of a wait counted elsewhere).
#[inline(always)]
fn add_wake(key: WakeKey, ns: u64, whole: Option<u64>) {
    let Some(w) = shared_value(&WAKES, &key) else { return };
    // SAFETY: `w` is a live map value; `&raw mut` makes no reference to it.
    unsafe {
        atomic_add(&raw mut (*w).ns, ns);
        let Some(len) = whole else { return };
        atomic_add(&raw mut (*w).count, 1);
        let bucket = at_most::<{ WAKE_BUCKETS as u64 - 1 }>(wake_bucket(len) as u64) as usize;
        atomic_add((&raw mut (*w).hist).cast::<u64>().add(bucket), 1);
        // A racy maximum: two CPUs ending waits of one pair at once may keep the smaller; the
        // histogram and the total stay exact.
        if len > (*w).max_ns {
            (*w).max_ns = len;
        }
    }
}

/// A data waiter's interruptible block of `ns` in a syscall of `class` ended.
#[inline(always)]
fn add_syscall_wait(pid: u32, class: u8, ns: u64) {
    let Some(c) = shared_value(&SYSCALL_WAITS, &pid) else { return };
    let i = at_most::<{ WAIT_CLASSES as u64 - 1 }>(u64::from(class)) as usize;
    // SAFETY: `c` is a live map value; `i` is within the arrays; `&raw mut` makes no reference.
    unsafe {
        atomic_add((&raw mut (*c).count).cast::<u64>().add(i), 1);
        atomic_add((&raw mut (*c).ns).cast::<u64>().add(i), ns);
    }
}

/// A consumer's wait for data of `ns` is over; its data came in a block of `class`.
#[inline(always)]
fn add_data_wait(pid: u32, class: u8, ns: u64) {
    let Some(c) = shared_value(&SYSCALL_WAITS, &pid) else { return };
    let i = at_most::<{ WAIT_CLASSES as u64 - 1 }>(u64::from(class)) as usize;
    // SAFETY: as above.
    unsafe {
        atomic_add((&raw mut (*c).data_count).cast::<u64>().add(i), 1);
        atomic_add((&raw mut (*c).data_ns).cast::<u64>().add(i), ns);
    }
}

#[inline(always)]
fn add_offcpu(pid: u32, st: u16, ns: u64) {
    let Some(c) = shared_value(&OFFCPU, &pid) else { return };
    // SAFETY: `c` is a live map value; `&raw mut` makes no reference to it.
    unsafe {
        match st {
            state::WAIT => {
                atomic_add(&raw mut (*c).wait_count, 1);
                atomic_add(&raw mut (*c).wait_ns, ns);
            }
            state::IO => {
                atomic_add(&raw mut (*c).io_count, 1);
                atomic_add(&raw mut (*c).io_ns, ns);
            }
            _ => {
                atomic_add(&raw mut (*c).runq_count, 1);
                atomic_add(&raw mut (*c).runq_ns, ns);
            }
        }
    }
}
