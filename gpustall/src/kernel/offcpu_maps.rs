//! The off-CPU maps (sched_switch / sched_waking): their field offsets from tracefs, where the
//! syscall number is in `pt_regs` (BTF), reading them into a counter sample, deleting a
//! process's entries.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use aya::{
    maps::{HashMap, IterableMap as _, MapData},
    Ebpf,
};
use gpustall_common::names::maps;
use gpustall_common::offsets::MISSING;
use gpustall_common::sched::{state, OffCpuThread, WAIT_DONE};
use gpustall_common::sched::{
    Feeders, OffCpuCounters, SchedOffsets, StackLayout, WakeCounters, WakeKey, ACCOUNT,
    ACCOUNT_WAITS, OFFCPU_PROCESSES,
};
use gpustall_common::syscall::SyscallWaits;
use gpustall_common::task::UNKNOWN as TASK_UNKNOWN;

use crate::kernel::batch;
use crate::kernel::maps::{iterate, take};
use crate::kernel::tracefs::Tracefs;
use crate::model::offcpu::{OffCpuRec, OpenWaitRec, SyscallWaitsRec, WakeRec};
use crate::model::proctree::{ProcessTree, Role};
use crate::model::samples::CountersSample;

/// This kernel's sched_switch and sched_waking field offsets.
pub fn sched_offsets(tracefs: &Tracefs) -> SchedOffsets {
    let find = |ev: &str, field: &str| -> u16 {
        tracefs
            .fields("sched", ev)
            .and_then(|f| f.into_iter().find(|f| f.name == field))
            .map_or(MISSING, |f| f.offset)
    };
    SchedOffsets {
        switch_prev_state: find("sched_switch", "prev_state"),
        switch_next_pid: find("sched_switch", "next_pid"),
        waking_pid: find("sched_waking", "pid"),
        _pad: 0,
    }
}

/// Said when the classic sched_switch program runs (no BTF, or before 5.18): it gets no task
/// pointer to read the registers from.
pub const NO_SYSCALL_CLASS: &str = "the syscall a trainer's or rank's wait blocked in is not read (wait_by_syscall counts every wait as unknown): a wait for data and a wait in a device driver are not told apart";

/// Where `struct pt_regs` keeps the syscall number on this kernel: x86_64's `orig_ax` (the
/// syscall classes are x86_64's numbers); `None` on other architectures or without it in BTF.
pub fn syscall_nr_offset(btf: &btf_rs::Btf) -> Option<u32> {
    if cfg!(target_arch = "x86_64") {
        crate::kernel::btf::member_offset(btf, "pt_regs", "orig_ax")
    } else {
        None
    }
}

/// How the typed sched_waking tells interrupt context (`gpustall_common::sched::StackLayout`):
/// `task_struct.stack`, and on x86_64 `THREAD_SIZE` as the size of `struct irq_stack` (the
/// kernel sizes its IRQ stacks as its task stacks: IRQ_STACK_SIZE is THREAD_SIZE, KASAN's
/// doubling included). It also reads the syscall number the task's entry saved, so it needs
/// `syscall_nr` and the `bpf_task_pt_regs` helper (5.15+). Unknown otherwise: the hrtimer
/// programs then mark timer callbacks.
pub fn stack_layout(btf: &btf_rs::Btf, syscall_nr: Option<u32>) -> StackLayout {
    use crate::kernel::btf::{enum_has, member_offset, struct_size};
    if !cfg!(target_arch = "x86_64") || syscall_nr.is_none() {
        return StackLayout::unknown();
    }
    if !enum_has(btf, "bpf_func_id", "BPF_FUNC_task_pt_regs") {
        log::debug!("no bpf_task_pt_regs: hrtimer programs mark timer callbacks");
        return StackLayout::unknown();
    }
    let (stack, size) = (member_offset(btf, "task_struct", "stack"), struct_size(btf, "irq_stack"));
    let layout = match (stack, size.and_then(|s| u32::try_from(s).ok())) {
        (Some(task_stack), Some(thread_size)) => StackLayout { task_stack, thread_size },
        _ => StackLayout::unknown(),
    };
    if !layout.knows() {
        log::debug!(
            "task stack layout unknown ({stack:?}, {size:?}): hrtimer programs mark timer callbacks"
        );
    }
    layout
}

/// The note when the typed program can run but the syscall number's place is unknown.
pub fn syscall_degradation(layouts: &super::layouts::Layouts) -> Option<String> {
    (layouts.task.task_pid != TASK_UNKNOWN && layouts.syscall_nr == TASK_UNKNOWN).then(|| {
        format!(
            "sched:sched_switch: {} (only x86_64's pt_regs.orig_ax is read; this is {})",
            NO_SYSCALL_CLASS,
            std::env::consts::ARCH
        )
    })
}

pub struct SchedMaps {
    offcpu: HashMap<MapData, u32, OffCpuCounters>,
    /// Per accounted thread: where it is, and a data waiter's logical wait in progress.
    threads: HashMap<MapData, u32, OffCpuThread>,
    wakes: HashMap<MapData, WakeKey, WakeCounters>,
    syscall_waits: HashMap<MapData, u32, SyscallWaits>,
    /// Wake pairs seen in the map, so that forgetting a process deletes its pairs without a
    /// scan of the map per process.
    known_wakes: Mutex<BTreeSet<WakeKey>>,
    /// Processes raised to off-CPU accounting, with their `TRACKED` value.
    accounted: BTreeMap<u32, u32>,
    /// Processes of the job's roles left out because [`OFFCPU_PROCESSES`] were accounted.
    pub over_cap: BTreeSet<u32>,
    /// Each data waiter's workers, as written to `FEEDERS`.
    feeders: HashMap<MapData, u32, Feeders>,
    fed: BTreeMap<u32, Feeders>,
}

/// The `TRACKED` value a process of `role` gets: trainers and ranks wait for data, the other
/// roles of the job (workers, forkserver) are accounted, the rest only followed. A pin-memory
/// thread is its trainer's or rank's: accounted with its process.
pub fn level_of(role: Role) -> Option<u32> {
    match role {
        Role::Trainer | Role::Rank => Some(ACCOUNT_WAITS),
        Role::DataloaderWorker | Role::Forkserver => Some(ACCOUNT),
        Role::Other => None,
    }
}

/// The live processes of the tree to account, with their level.
pub fn wanted(tree: &ProcessTree) -> Vec<(u32, u32)> {
    tree.alive_pids().into_iter().filter_map(|p| Some((p, level_of(tree.role(p))?))).collect()
}

/// Each live trainer's or rank's workers (the nearest data waiter above each live worker), the
/// first [`FEEDER_SLOTS`] in the order they appeared: the kernel splits a wait between the
/// worker whose batch ended it and those of them still busy producing (`sched::sharers`).
pub fn feeders(tree: &ProcessTree) -> BTreeMap<u32, Feeders> {
    let mut workers: BTreeMap<u32, Vec<(u64, u32)>> = BTreeMap::new();
    for n in tree.iter().filter(|n| n.alive() && tree.role(n.pid) == Role::DataloaderWorker) {
        let mut up = tree.get(n.ppid);
        // Bounded: a tree is acyclic, but a pid reused under a stale parent must not loop.
        for _ in 0..64 {
            let Some(p) = up else { break };
            if level_of(tree.role(p.pid)) == Some(ACCOUNT_WAITS) {
                workers.entry(p.pid).or_default().push((n.order, n.pid));
                break;
            }
            up = tree.get(p.ppid).filter(|q| q.pid != p.pid);
        }
    }
    workers
        .into_iter()
        .map(|(waiter, mut w)| {
            w.sort_unstable();
            let mut f = Feeders::default();
            for (slot, &(_, pid)) in f.pids.iter_mut().zip(&w) {
                *slot = pid;
                f.count += 1;
            }
            (waiter, f)
        })
        .collect()
}

impl SchedMaps {
    pub fn take(ebpf: &mut Ebpf) -> Result<Self, super::loader::LoadError> {
        Ok(Self {
            offcpu: take(ebpf, maps::OFFCPU)?,
            threads: take(ebpf, maps::OFFCPU_THREADS)?,
            wakes: take(ebpf, maps::WAKES)?,
            syscall_waits: take(ebpf, maps::SYSCALL_WAITS)?,
            known_wakes: Mutex::default(),
            accounted: BTreeMap::new(),
            over_cap: BTreeSet::new(),
            feeders: take(ebpf, maps::FEEDERS)?,
            fed: BTreeMap::new(),
        })
    }

    /// Adds the off-CPU totals and wake pairs to `out` (sorted, like the other counters).
    pub fn read(&self, out: &mut CountersSample) {
        let offcpu = batch::entries(self.offcpu.map())
            .unwrap_or_else(|| iterate(&self.offcpu, maps::OFFCPU));
        out.offcpu =
            offcpu.into_iter().map(|(pid, counters)| OffCpuRec { pid, counters }).collect();
        let wakes =
            batch::entries(self.wakes.map()).unwrap_or_else(|| iterate(&self.wakes, maps::WAKES));
        let mut known = self.known_wakes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        out.wakes = wakes
            .into_iter()
            .map(|(k, counters): (WakeKey, WakeCounters)| {
                known.insert(k);
                WakeRec { waker: k.waker, wakee: k.wakee, counters }
            })
            .collect();
        let syscall_waits = batch::entries(self.syscall_waits.map())
            .unwrap_or_else(|| iterate(&self.syscall_waits, maps::SYSCALL_WAITS));
        out.syscall_waits = syscall_waits
            .into_iter()
            .map(|(pid, waits): (u32, SyscallWaits)| SyscallWaitsRec { pid, waits })
            .collect();
        out.offcpu.sort_by_key(|r| r.pid);
        out.wakes.sort_by_key(|r| (r.waker, r.wakee));
        out.syscall_waits.sort_by_key(|r| r.pid);
        out.open_waits = Some(self.open_waits());
    }

    /// The waits for data in progress: each trainer's or rank's main thread (the consumer)
    /// blocked in a logical wait whose data has not come. One lookup per data waiter.
    fn open_waits(&self) -> Vec<OpenWaitRec> {
        let waiters = self.accounted.iter().filter(|(_, &l)| l == ACCOUNT_WAITS);
        let mut v: Vec<OpenWaitRec> = waiters
            .filter_map(|(&pid, _)| {
                let t = self.threads.get(&pid, 0).ok()?;
                let w = t.wait;
                let open = t.pid == pid
                    && t.state == state::WAIT
                    && w.start_ns != 0
                    && w.flags & WAIT_DONE == 0;
                open.then(|| OpenWaitRec {
                    pid,
                    tid: pid,
                    since_ns: w.start_ns,
                    blocks: u32::from(w.slices),
                    batches: u32::from(w.job_wakes),
                    last_batch_ns: w.data_end_ns,
                })
            })
            .collect();
        v.sort_by_key(|r| r.pid);
        v
    }

    /// Raises `want` (pid, level) in `TRACKED` (only processes still there: BPF_EXIST), at
    /// most [`OFFCPU_PROCESSES`] at once; a process whose role changed is updated.
    pub fn account(&mut self, tracked: &mut HashMap<MapData, u32, u32>, want: &[(u32, u32)]) {
        const BPF_EXIST: u64 = 2;
        for &(pid, level) in want {
            match self.accounted.get(&pid) {
                Some(&l) if l == level => continue,
                None if self.accounted.len() >= OFFCPU_PROCESSES as usize => {
                    if self.over_cap.insert(pid) {
                        log::warn!("off-CPU accounting is limited to {OFFCPU_PROCESSES} processes at once: pid {pid} is not accounted");
                    }
                    continue;
                }
                _ => {}
            }
            match tracked.insert(pid, level, BPF_EXIST) {
                Ok(()) => {
                    self.accounted.insert(pid, level);
                }
                Err(e) => log::debug!("accounting pid {pid}: {e}"),
            }
        }
    }

    /// Writes each data waiter's workers to `FEEDERS` where they changed, and drops waiters
    /// that are gone.
    pub fn set_feeders(&mut self, want: BTreeMap<u32, Feeders>) {
        let gone: Vec<u32> = self.fed.keys().filter(|p| !want.contains_key(p)).copied().collect();
        for pid in gone {
            let _ = self.feeders.remove(&pid);
            self.fed.remove(&pid);
        }
        for (pid, f) in want {
            if self.fed.get(&pid) == Some(&f) {
                continue;
            }
            match self.feeders.insert(pid, f, 0) {
                Ok(()) => {
                    self.fed.insert(pid, f);
                }
                Err(e) => log::debug!("the workers of pid {pid}: {e}"),
            }
        }
    }

    /// Forgets that `pid` was raised: its `TRACKED` value was reset to 1 (a new process with
    /// a reused pid), so the next [`Self::account`] raises it again if its role asks.
    pub fn unaccount(&mut self, pid: u32) {
        self.accounted.remove(&pid);
        self.over_cap.remove(&pid);
    }

    /// Deletes a process's totals and every wake pair it is in.
    pub fn forget(&mut self, pid: u32) {
        self.accounted.remove(&pid);
        self.over_cap.remove(&pid);
        let _ = self.offcpu.remove(&pid);
        let _ = self.syscall_waits.remove(&pid);
        let mut known = self.known_wakes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let gone: Vec<WakeKey> =
            known.iter().filter(|k| k.waker == pid || k.wakee == pid).copied().collect();
        for k in gone {
            let _ = self.wakes.remove(&k);
            known.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trainers_live_workers_are_its_feeders_in_the_order_they_came() {
        let mut t = ProcessTree::default();
        t.seed(100, 1, "python3", true, 0);
        for (i, pid) in [(0, 103), (1, 101), (2, 102)] {
            t.on_fork(100, pid, "python3", i);
            t.on_rename(pid, pid, "pt_data_worker");
        }
        // A helper the trainer runs is no feeder; a worker that exited is none any more.
        t.on_fork(100, 104, "python3", 3);
        t.on_exit(102, Some(0), 9);
        let f = feeders(&t);
        assert_eq!(f.keys().copied().collect::<Vec<_>>(), vec![100]);
        assert_eq!((f[&100].count, f[&100].pids), (2, [103, 101, 0, 0, 0, 0, 0, 0]));
        assert!(feeders(&ProcessTree::default()).is_empty());
    }
}
