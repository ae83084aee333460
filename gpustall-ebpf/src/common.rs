//! Maps and helpers shared by all probe families.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::map,
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::TracePointContext,
};
use gpustall_common::{
    counters::{LostCounter, ProcCounters, HOST_COUNTERS, LOST_COUNTERS},
    events::{EventHeader, EventKind},
    hint::{self, BPF_F_MMAPABLE, HINT_SLOTS},
    offsets::{TracepointOffsets, MISSING},
    reclaim::ReclaimStart,
    task::{TaskOffsets, UNKNOWN as TASK_UNKNOWN},
};

use crate::diag::kwarn;

/// Written by the agent before load (`EbpfLoader::set_global`).
#[unsafe(no_mangle)]
pub static OFFSETS: TracepointOffsets = TracepointOffsets::missing();

/// Written by the agent before load: struct offsets from the kernel's BTF, for the programs
/// that get the kernel's pointers (raw tracepoints) and for reading the exiting task.
#[unsafe(no_mangle)]
pub static TASK_OFFSETS: TaskOffsets = TaskOffsets::unknown();

/// Reads one offset from `TASK_OFFSETS` (volatile, as `offset!`).
macro_rules! task_offset {
    ($field:ident) => {
        // SAFETY: TASK_OFFSETS is a plain static of integers; the loader rewrites it before load.
        unsafe { core::ptr::read_volatile(&$crate::common::TASK_OFFSETS.$field) }
    };
}
pub(crate) use task_offset;

/// Reads a `T` at `base + off` in kernel memory, `off` from BTF: `None` when the offset is
/// unknown or the read faults.
#[inline(always)]
pub fn kread<T>(base: *const u8, off: u32) -> Option<T> {
    if off == TASK_UNKNOWN || base.is_null() {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel checks the address; a bad one is an error, not a fault.
    unsafe { aya_ebpf::helpers::bpf_probe_read_kernel(base.add(off as usize) as *const T) }.ok()
}

/// A plain load of a `T` at `base + off` from a pointer a BTF-typed program got from the
/// kernel: no helper call. `off` must come from a read-only global the loader wrote (the
/// verifier knows its value, checks the access against BTF and turns it into a load that
/// reads 0 instead of faulting); [`TASK_UNKNOWN`]-like offsets are never loaded: the loader
/// only attaches a typed program whose offsets BTF gave.
#[inline(always)]
pub fn kload<T>(base: *const u8, off: u32) -> T {
    // SAFETY: see above; `wrapping_add` since `base` may be null (the load then reads 0).
    unsafe { core::ptr::read_volatile(base.wrapping_add(off as usize) as *const T) }
}

/// Reads one offset from `OFFSETS`; volatile so the compiler does not fold the default in.
macro_rules! offset {
    ($field:ident) => {
        // SAFETY: OFFSETS is a plain static of integers; the loader rewrites it before load.
        unsafe { core::ptr::read_volatile(&$crate::common::OFFSETS.$field) }
    };
}
pub(crate) use offset;

/// Tracked processes (pid -> level: 1, or the off-CPU accounting levels of `sched`). Every
/// insert of a new pid and every delete goes through [`track`] / [`untrack`] (the agent's
/// through `KernelMaps`), which keep `TRACKED_HINT` in step.
#[map]
pub static TRACKED: HashMap<u32, u32> = HashMap::with_max_entries(32768, 0);

/// `TRACKED`'s entries per bucket of pids (`gpustall_common::hint`): the first, inlined test
/// of [`is_tracked`]. Mapped by the agent, which tracks and forgets processes too.
#[map]
pub static TRACKED_HINT: Array<u64> = Array::with_max_entries(HINT_SLOTS, BPF_F_MMAPABLE);

/// Fork/exit/rename/exec/OOM/signal: rare and precious.
#[map]
pub static CRITICAL: RingBuf = RingBuf::with_byte_size(CRITICAL_BYTES, 0);

/// Reclaim episodes and throttling: frequent under pressure; may drop, never silently.
#[map]
pub static BULK: RingBuf = RingBuf::with_byte_size(BULK_BYTES, 0);

#[map]
pub static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(LOST_COUNTERS, 0);

/// Per-process counters, one value for all CPUs, added to atomically. A per-CPU map would cost
/// entries x value x CPUs of kernel memory (700 MiB on a 224-CPU host); allocated on first use
/// (a process's first counted event), so memory follows the processes really counted.
#[map]
pub static PROC_COUNTERS: HashMap<u32, ProcCounters> =
    HashMap::with_max_entries(32768, BPF_F_NO_PREALLOC);

/// Map flag: elements allocated on insert instead of all at creation.
pub const BPF_F_NO_PREALLOC: u32 = 1;
pub const BPF_NOEXIST: u64 = 1;
const BPF_EXIST: u64 = 2;

#[map]
pub static HOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(HOST_COUNTERS, 0);

/// A thread's reclaim in progress (tid -> start), for all tasks: untracked ones feed host counters.
/// 8192 threads in reclaim at once (the kernel throttles reclaimers long before), which leaves
/// room for the off-CPU maps within the 16 MiB bound (kernel::mapmem).
#[map]
pub static RECLAIM_START: HashMap<u32, ReclaimStart> = HashMap::with_max_entries(8192, 0);

/// The current thread's `(pid, tid)` in this project's words, the ones of ps and /proc (see
/// `gpustall_common`): its process's id (the kernel's tgid) and its own (the kernel's pid).
#[inline(always)]
pub fn current_ids() -> (u32, u32) {
    let v = bpf_get_current_pid_tgid();
    ((v >> 32) as u32, v as u32)
}

#[inline(always)]
pub fn is_tracked(pid: u32) -> bool {
    // SAFETY: the value is only tested for presence.
    maybe_in(&TRACKED_HINT, pid) && unsafe { TRACKED.get(pid).is_some() }
}

/// `pid`'s tracking level (0: untracked).
#[inline(always)]
pub fn tracked_level(pid: u32) -> u32 {
    if !maybe_in(&TRACKED_HINT, pid) {
        return 0;
    }
    // SAFETY: the value is copied out at once.
    unsafe { TRACKED.get(pid) }.copied().unwrap_or(0)
}

/// Whether the map a `hint` counts may hold `id`: false only when it cannot.
#[inline(always)]
pub fn maybe_in(hint: &Array<u64>, id: u32) -> bool {
    match hint.get_ptr(hint::slot(id)) {
        // SAFETY: a live map value; other CPUs (and the agent) add to it atomically.
        Some(n) => (unsafe { core::ptr::read_volatile(n) }) != 0,
        None => true,
    }
}

/// Adds `delta` (wrapping: `u64::MAX` takes one away) to `id`'s bucket of `hint`.
#[inline(always)]
pub fn hint_add(hint: &Array<u64>, id: u32, delta: u64) {
    if let Some(n) = hint.get_ptr_mut(hint::slot(id)) {
        atomic_add(n, delta);
    }
}

/// Tracks a new process at level 1; an entry left by an earlier process of the same pid is
/// reset to 1. The hint is counted up first, so it never reads 0 while the entry exists.
#[inline(always)]
pub fn track(pid: u32) {
    hint_add(&TRACKED_HINT, pid, 1);
    if TRACKED.insert(pid, 1, BPF_NOEXIST).is_ok() {
        return;
    }
    // Not a new key: there already (reset it), or the map is full.
    if TRACKED.insert(pid, 1, BPF_EXIST).is_err() {
        add_lost(LostCounter::MapFull);
        kwarn!("TRACKED is full: process {} is not followed", pid);
    }
    hint_add(&TRACKED_HINT, pid, u64::MAX);
}

/// Stops tracking a process; the hint is counted down only for a key really deleted.
#[inline(always)]
pub fn untrack(pid: u32) {
    if TRACKED.remove(pid).is_ok() {
        hint_add(&TRACKED_HINT, pid, u64::MAX);
    }
}

#[inline(always)]
pub fn add_lost(which: LostCounter) {
    add_per_cpu(&LOST, which as u32, 1);
}

#[inline(always)]
pub fn add_per_cpu(map: &PerCpuArray<u64>, index: u32, n: u64) {
    if let Some(p) = map.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, only this CPU writes it while this program runs.
        unsafe { *p += n };
    }
}

#[inline(always)]
pub fn header(kind: EventKind, pid: u32, tid: u32) -> EventHeader {
    // SAFETY: plain helper call.
    header_at(kind, pid, tid, unsafe { bpf_ktime_get_ns() })
}

/// A record header stamped with a time the program already read (one clock read less).
#[inline(always)]
pub fn header_at(kind: EventKind, pid: u32, tid: u32, t_ns: u64) -> EventHeader {
    EventHeader {
        kind: kind as u32,
        pid,
        tid,
        _pad: 0,
        t_ns,
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    }
}

/// Bytes of the rings (power-of-two multiples of the page size).
pub const BULK_BYTES: u32 = 2 * 1024 * 1024;
pub const CRITICAL_BYTES: u32 = 1024 * 1024;

const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;

/// How urgently the agent must see a critical record.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// OOM kills and fatal signals: wake the agent now (it syncs the recording at once);
    /// renames (it gives the kernel the roles they reveal).
    Now,
    /// Forks, exits: the agent's next drain is soon enough, and a wakeup per record costs an
    /// interrupt (in a VM, an exit to the hypervisor) in the forking task.
    Later,
}

/// Puts one record in the critical ring, counting it as lost when the ring is full. Only the
/// process family's programs use it, none of them hot: the loss is logged too.
#[inline(always)]
pub fn emit<T: 'static>(value: T, wake: Wake) {
    match CRITICAL.reserve::<T>(0) {
        Some(mut entry) => {
            entry.write(value);
            let half_full = CRITICAL.query(BPF_RB_AVAIL_DATA) > (CRITICAL_BYTES / 2) as u64;
            let flags = match wake {
                // Forced: the kernel's own choice wakes the agent only when the ring was empty
                // before this record, never behind records put there without a wakeup.
                Wake::Now => BPF_RB_FORCE_WAKEUP,
                Wake::Later if half_full => BPF_RB_FORCE_WAKEUP,
                Wake::Later => BPF_RB_NO_WAKEUP,
            };
            entry.submit(flags);
        }
        None => {
            add_lost(LostCounter::CriticalRing);
            kwarn!("the critical ring is full: a process record is lost");
        }
    }
}

/// Puts one record in the bulk ring without waking the agent, which drains it on a short timer:
/// a wakeup is an interrupt to the agent's CPU per record (in a VM, an exit to the hypervisor),
/// which under a reclaim storm costs more than the record. Once the ring is half full, wake it.
/// False when the ring was full (counted as lost): a caller off the hot paths logs it.
#[inline(always)]
pub fn emit_bulk<T: 'static>(value: T) -> bool {
    match BULK.reserve::<T>(0) {
        Some(mut entry) => {
            entry.write(value);
            let flags = if BULK.query(BPF_RB_AVAIL_DATA) > (BULK_BYTES / 2) as u64 {
                BPF_RB_FORCE_WAKEUP
            } else {
                BPF_RB_NO_WAKEUP
            };
            entry.submit(flags);
            true
        }
        None => {
            add_lost(LostCounter::BulkRing);
            false
        }
    }
}

/// Finds or creates a value in a map shared by all CPUs. Two CPUs may create it at once: the
/// insert only succeeds for the first (BPF_NOEXIST), and both then add to the same value. The
/// agent deletes the entries of processes it has settled: one deleted between the insert and
/// the lookup is created once more (a trainer's last wait, charged at its exit to a worker that
/// exited just before), and only a second miss is a full map.
#[inline(always)]
pub fn shared_value<K, V: Default>(map: &HashMap<K, V>, key: &K) -> Option<*mut V> {
    if let Some(p) = map.get_ptr_mut(key) {
        return Some(p);
    }
    let _ = map.insert(key, V::default(), BPF_NOEXIST);
    if let Some(p) = map.get_ptr_mut(key) {
        return Some(p);
    }
    let _ = map.insert(key, V::default(), BPF_NOEXIST);
    let p = map.get_ptr_mut(key);
    if p.is_none() {
        add_lost(LostCounter::MapFull);
    }
    p
}

/// `i`, or `MAX` if it is larger, for an index into a map value. Written in BPF assembly so
/// that the compare and the clamp act on the register the access then uses: the compiler
/// lowers `min` to a branch around two reloads of a spilled value, and the verifier (5.10's at
/// least) does not carry the branch's bound from one reload to the other, so it refused
/// programs that index the syscall-class and wake-histogram arrays.
#[inline(always)]
pub fn at_most<const MAX: u64>(i: u64) -> u64 {
    let mut v = i;
    // SAFETY: two ALU/jump instructions on one register; no memory, no stack.
    unsafe {
        core::arch::asm!(
            "if {v} <= {max} goto 1f",
            "{v} = {max}",
            "1:",
            v = inout(reg) v,
            max = const MAX,
            options(pure, nomem, nostack),
        );
    }
    v
}

/// Adds to a counter shared by all CPUs: one atomic add instruction, no lock.
#[inline(always)]
pub fn atomic_add(p: *mut u64, n: u64) {
    use core::intrinsics::{atomic_xadd, AtomicOrdering};
    // SAFETY: `p` points into a map value, which lives at least while this program runs.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, n) };
}

/// Adds to fields of a process's counters: `proc_add!(pid, field += n, ...)`; false when the
/// map was full (counted as lost): a caller off the hot paths logs it.
macro_rules! proc_add {
    ($pid:expr, $($f:ident += $n:expr),+ $(,)?) => {
        match $crate::common::shared_value(&$crate::common::PROC_COUNTERS, &$pid) {
            Some(p) => {
                // SAFETY: `p` is a live map value; `&raw mut` makes no reference to it.
                $( $crate::common::atomic_add(unsafe { &raw mut (*p).$f }, $n); )+
                true
            }
            None => false,
        }
    };
}
pub(crate) use proc_add;

/// Reads a scalar field at an offset from the agent, or `None` when the kernel lacks the field.
#[inline(always)]
pub fn field<T>(ctx: &TracePointContext, off: u16) -> Option<T> {
    if off == MISSING {
        return None;
    }
    // SAFETY: the offset comes from this kernel's format file for this tracepoint.
    unsafe { ctx.read_at::<T>(off as usize) }.ok()
}

/// Copies a fixed `char[16]` field.
#[inline(always)]
pub fn comm_field(ctx: &TracePointContext, off: u16) -> [u8; 16] {
    field::<[u8; 16]>(ctx, off).unwrap_or([0; 16])
}

/// Copies a `__data_loc char[]` field (low 16 bits: offset in the record; high: length).
#[inline(always)]
pub fn data_loc_str<const N: usize>(ctx: &TracePointContext, off: u16) -> [u8; N] {
    use aya_ebpf::{helpers::bpf_probe_read_kernel_str_bytes, EbpfContext};
    let mut out = [0u8; N];
    if let Some(loc) = field::<u32>(ctx, off) {
        let start = (loc & 0xffff) as usize;
        // SAFETY: the string lies inside the tracepoint record; the helper bounds the copy.
        let _ = unsafe {
            bpf_probe_read_kernel_str_bytes((ctx.as_ptr() as *const u8).add(start), &mut out)
        };
    }
    out
}
