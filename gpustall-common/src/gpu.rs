//! A trainer's or rank's waits for the GPU: the time its threads spend inside the CUDA driver's
//! synchronising calls (`cuStreamSynchronize`, `cuCtxSynchronize`, `cuEventSynchronize`, the
//! blocking device-to-host copies), measured with a uprobe at each call's entry and a uretprobe
//! at its return on the `libcuda.so.1` the process mapped.
//!
//! Under CUDA's default scheduling a thread waiting there often spins or yields on its CPU, so
//! the off-CPU model cannot see that wait: it looks like the trainer's own work. The kernel keeps
//! one [`GpuCall`] per thread inside a call and sums per process ([`GpuWaits`]): never a record
//! per call. The transitions are pure functions here, run by the eBPF programs and unit-tested
//! on the host.

/// A thread inside a synchronising call (key: the thread id).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuCall {
    /// When the outermost call began (`bpf_ktime_get_ns`).
    pub since_ns: u64,
    /// The thread's CPU time then (`task_struct.se.sum_exec_runtime`; 0 where unknown).
    pub cpu_at_entry_ns: u64,
    /// Its process.
    pub pid: u32,
    /// Calls entered and not yet returned: a probed call made from inside another (a runtime
    /// wrapper into the driver, or one symbol aliasing another) counts once, as the outermost.
    pub depth: u32,
}
const _: () = assert!(core::mem::size_of::<GpuCall>() == 24);

/// Per process (key: pid): the synchronising calls that returned and the time they took.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize, serde::Deserialize))]
pub struct GpuWaits {
    pub calls: u64,
    /// Wall time inside them.
    pub ns: u64,
    /// Of it, time the thread was on its CPU (spinning or yielding); `ns - cpu_ns` it was not
    /// (blocked, or waiting for a CPU). 0 where the kernel's task layout is unknown
    /// (`cpu_known` 0).
    pub cpu_ns: u64,
    /// The longest call.
    pub max_ns: u64,
    /// 1 when `cpu_ns` was measured.
    pub cpu_known: u64,
}
const _: () = assert!(core::mem::size_of::<GpuWaits>() == 40);

#[cfg(feature = "user")]
impl GpuWaits {
    /// These totals counted from `base` (an earlier read); the maximum is the run's.
    pub fn since(&self, base: &Self) -> Self {
        Self {
            calls: self.calls.saturating_sub(base.calls),
            ns: self.ns.saturating_sub(base.ns),
            cpu_ns: self.cpu_ns.saturating_sub(base.cpu_ns),
            max_ns: self.max_ns,
            cpu_known: self.cpu_known,
        }
    }
}

/// Whether a call entered by a thread of `pid` nests in `c`, the call its thread is in: a
/// call left open by a thread that died inside it has another process's key reused, and is
/// started afresh rather than nested into.
#[inline(always)]
pub fn nests_in(c: &GpuCall, pid: u32) -> bool {
    c.pid == pid && c.depth > 0
}

/// The thread's state after entering a call: a new outermost call, or one level deeper (the
/// uprobe does the same in place on its map entry, with [`nests_in`]).
#[inline(always)]
pub fn enter(current: Option<GpuCall>, pid: u32, now_ns: u64, cpu_ns: u64) -> GpuCall {
    match current {
        Some(c) if nests_in(&c, pid) => GpuCall { depth: c.depth + 1, ..c },
        _ => GpuCall { since_ns: now_ns, cpu_at_entry_ns: cpu_ns, pid, depth: 1 },
    }
}

/// What a return does to the thread's call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Return {
    /// An inner call returned: the thread is still inside the outer one.
    Inner(GpuCall),
    /// The outermost call returned after `ns`, `cpu_ns` of them on CPU where `cpu_known`.
    Done { ns: u64, cpu_ns: u64, cpu_known: bool },
}

/// The thread's state after a call returns (`cpu_ns`: its CPU time now, 0 where unknown).
#[inline(always)]
pub fn leave(c: GpuCall, now_ns: u64, cpu_ns: u64) -> Return {
    if c.depth > 1 {
        return Return::Inner(GpuCall { depth: c.depth - 1, ..c });
    }
    let ns = now_ns.saturating_sub(c.since_ns);
    let cpu_known = c.cpu_at_entry_ns != 0 && cpu_ns >= c.cpu_at_entry_ns;
    // The scheduler updates the runtime at ticks and switches, so it may lag the clock by up
    // to a tick at either end: never more than the wall time.
    let spent = if cpu_known { (cpu_ns - c.cpu_at_entry_ns).min(ns) } else { 0 };
    Return::Done { ns, cpu_ns: spent, cpu_known }
}

/// At most this many processes have their GPU waits summed at once (trainers and ranks: a
/// node's GPUs, with room to spare); past it a waiter's calls are counted as lost (map full).
/// The two maps cost about 12 KiB on a 256-CPU host (`kernel::mapmem`'s 16 MiB bound).
pub const GPU_WAIT_PROCESSES: u32 = 32;
/// At most this many threads are inside a call at once (a rank's main thread, and the odd
/// other one). A thread killed inside a call leaves its entry: the agent deletes those.
pub const GPU_CALL_THREADS: u32 = 32;

#[cfg(feature = "user")]
// SAFETY: repr(C), only integers, no padding (sizes pinned above).
unsafe impl aya::Pod for GpuCall {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl aya::Pod for GpuWaits {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_timed_from_its_entry_to_its_return_with_its_cpu_part() {
        let c = enter(None, 7, 1_000, 50_000);
        assert_eq!(c, GpuCall { since_ns: 1_000, cpu_at_entry_ns: 50_000, pid: 7, depth: 1 });
        assert_eq!(
            leave(c, 9_000, 53_000),
            Return::Done { ns: 8_000, cpu_ns: 3_000, cpu_known: true }
        );
    }

    #[test]
    fn a_call_made_inside_another_counts_once_as_the_outer_one() {
        let outer = enter(None, 7, 1_000, 10);
        let inner = enter(Some(outer), 7, 2_000, 20);
        assert_eq!(inner.depth, 2);
        assert_eq!(inner.since_ns, 1_000);
        let Return::Inner(back) = leave(inner, 5_000, 30) else { panic!("still inside") };
        assert_eq!(back, outer);
        assert_eq!(leave(back, 6_000, 40), Return::Done { ns: 5_000, cpu_ns: 30, cpu_known: true });
    }

    #[test]
    fn an_unknown_or_lagging_cpu_time_is_not_made_up() {
        let c = enter(None, 7, 1_000, 0);
        assert_eq!(leave(c, 2_000, 500), Return::Done { ns: 1_000, cpu_ns: 0, cpu_known: false });
        // A runtime updated at a later tick than the clock read: capped at the wall time.
        let c = enter(None, 7, 1_000, 100);
        assert_eq!(
            leave(c, 2_000, 5_000),
            Return::Done { ns: 1_000, cpu_ns: 1_000, cpu_known: true }
        );
    }

    #[test]
    fn a_stale_entry_of_another_process_is_replaced_not_nested_into() {
        let stale = GpuCall { since_ns: 5, cpu_at_entry_ns: 0, pid: 3, depth: 4 };
        let c = enter(Some(stale), 9, 100, 1);
        assert_eq!(c, GpuCall { since_ns: 100, cpu_at_entry_ns: 1, pid: 9, depth: 1 });
    }
}
