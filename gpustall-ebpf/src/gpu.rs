//! A trainer's or rank's waits for the GPU: a uprobe at the entry of each synchronising call of
//! the CUDA driver (`libcuda.so.1`) and a uretprobe at its return, attached by the agent per
//! library file (`kernel::cuda`). Every process mapping that file runs them, so the first test
//! is the caller's tracking level: only trainers and ranks (`ACCOUNT_WAITS`) are timed. The
//! time is summed per process in `GPU_WAITS` (see `gpustall_common::gpu`): no record per call.

use aya_ebpf::{
    helpers::{bpf_get_current_task, bpf_ktime_get_ns},
    macros::{map, uprobe, uretprobe},
    maps::HashMap,
    programs::{ProbeContext, RetProbeContext},
};
use gpustall_common::{
    gpu::{leave, nests_in, GpuCall, GpuWaits, Return, GPU_CALL_THREADS, GPU_WAIT_PROCESSES},
    sched::ACCOUNT_WAITS,
    task::UNKNOWN as TASK_UNKNOWN,
};

use crate::common::{
    atomic_add, current_ids, kread, shared_value, tracked_level, BPF_F_NO_PREALLOC,
};

/// Written by the agent before load: where `struct task_struct` keeps the thread's CPU time
/// (`se.sum_exec_runtime`, from BTF), or `TASK_UNKNOWN`: then only wall time is measured.
#[unsafe(no_mangle)]
pub static CPU_TIME_OFFSET: u32 = TASK_UNKNOWN;

/// Threads inside a call (thread id), allocated on use. A thread killed inside a call never
/// returns: the agent deletes the entries of threads that are gone (`kernel::cuda`).
#[map]
pub static GPU_CALLS: HashMap<u32, GpuCall> =
    HashMap::with_max_entries(GPU_CALL_THREADS, BPF_F_NO_PREALLOC);

/// Per trainer or rank: its calls that returned (40 bytes an entry, allocated on use).
#[map]
pub static GPU_WAITS: HashMap<u32, GpuWaits> =
    HashMap::with_max_entries(GPU_WAIT_PROCESSES, BPF_F_NO_PREALLOC);

#[inline(always)]
fn now() -> u64 {
    // SAFETY: a helper without arguments.
    unsafe { bpf_ktime_get_ns() }
}

/// The current thread's CPU time, or 0 where the kernel's layout is unknown.
#[inline(always)]
fn cpu_time() -> u64 {
    // SAFETY: a plain static of an integer; the loader rewrites it before load.
    let off = unsafe { core::ptr::read_volatile(&CPU_TIME_OFFSET) };
    // SAFETY: bpf_get_current_task returns the current task's address; kread probes it.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    kread::<u64>(task, off).unwrap_or(0)
}

#[uprobe]
pub fn cuda_sync_enter(_ctx: ProbeContext) -> u32 {
    let (pid, tid) = current_ids();
    if tracked_level(pid) != ACCOUNT_WAITS {
        return 0;
    }
    let Some(c) = GPU_CALLS.get_ptr_mut(tid) else {
        return start(tid, pid);
    };
    // SAFETY: `c` is a live map value of this thread's, which only this thread writes.
    unsafe {
        if nests_in(&*c, pid) {
            (*c).depth += 1;
            return 0;
        }
    }
    start(tid, pid)
}

/// A new outermost call of thread `tid`.
#[inline(always)]
fn start(tid: u32, pid: u32) -> u32 {
    let call = GpuCall { since_ns: now(), cpu_at_entry_ns: cpu_time(), pid, depth: 1 };
    let _ = GPU_CALLS.insert(tid, call, 0);
    0
}

#[uretprobe]
pub fn cuda_sync_exit(_ctx: RetProbeContext) -> u32 {
    let (pid, tid) = current_ids();
    let Some(c) = GPU_CALLS.get_ptr_mut(tid) else { return 0 };
    // SAFETY: `c` is a live map value of this thread's, which only this thread writes.
    let call = unsafe { *c };
    if call.pid != pid {
        return 0;
    }
    match leave(call, now(), cpu_time()) {
        Return::Inner(inner) => {
            // SAFETY: as above.
            unsafe { (*c).depth = inner.depth };
        }
        Return::Done { ns, cpu_ns, cpu_known } => {
            let _ = GPU_CALLS.remove(tid);
            add_wait(pid, ns, cpu_ns, cpu_known);
        }
    }
    0
}

#[inline(always)]
fn add_wait(pid: u32, ns: u64, cpu_ns: u64, cpu_known: bool) {
    let Some(w) = shared_value(&GPU_WAITS, &pid) else { return };
    // SAFETY: `w` is a live map value; `&raw mut` makes no reference to it.
    unsafe {
        atomic_add(&raw mut (*w).calls, 1);
        atomic_add(&raw mut (*w).ns, ns);
        if cpu_known {
            atomic_add(&raw mut (*w).cpu_ns, cpu_ns);
            (*w).cpu_known = 1;
        }
        // A race between two threads' returns may keep the smaller: a maximum, not a sum.
        if ns > (*w).max_ns {
            (*w).max_ns = ns;
        }
    }
}
