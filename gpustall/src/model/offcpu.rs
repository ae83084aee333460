//! Off-CPU time per process and who kept the trainer waiting, as the kernel summed them from
//! sched_switch and sched_waking (see `gpustall_common::sched`): per process, time blocked
//! interruptibly (waiting on an event), uninterruptibly (disk, faults, reclaim) and runnable
//! but not running; per (waker, wakee) pair, the interruptible blocks of the wakee's threads
//! that the waker ended. A trainer's or rank's blocks ended by another process of the job are
//! its wait for data; the worker that ended them kept it waiting. A trainer's or rank's waits
//! are also summed by the class of the syscall they blocked in (`wait_by_syscall`), which tells
//! a read of a worker's pipe from an ioctl into a device driver (the GPU).

use std::collections::BTreeMap;

use gpustall_common::sched::{OffCpuCounters, WakeCounters, WakeKey, WAKE_BUCKETS};
use gpustall_common::syscall::{SyscallWaits, WaitClass};
use serde::{Deserialize, Serialize};

/// The kernel's off-CPU totals of one process, as recorded.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuRec {
    pub pid: u32,
    #[serde(flatten)]
    pub counters: OffCpuCounters,
}

/// The blocks of `wakee`'s threads that `waker` ended, as recorded.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WakeRec {
    pub waker: u32,
    pub wakee: u32,
    #[serde(flatten)]
    pub counters: WakeCounters,
}

impl WakeRec {
    pub fn key(&self) -> WakeKey {
        WakeKey { waker: self.waker, wakee: self.wakee }
    }
}

/// A trainer's or rank's waits by syscall class, as recorded.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallWaitsRec {
    pub pid: u32,
    #[serde(flatten)]
    pub waits: SyscallWaits,
}

/// A trainer's or rank's consumer thread blocked in a wait for data that is still in progress
/// (its data has not come), as the kernel showed it at a read.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenWaitRec {
    pub pid: u32,
    pub tid: u32,
    /// When the wait began (its first block).
    pub since_ns: u64,
    /// Its blocks so far, and the batches that came during it but were not the one it needs
    /// (out of order: put aside).
    pub blocks: u32,
    pub batches: u32,
    /// When the latest of those batches came (0: none).
    #[serde(default)]
    pub last_batch_ns: u64,
}

/// Cumulative totals, replaced at each read (like the other kernel counters).
#[derive(Default, Debug)]
pub struct OffCpu {
    pub procs: BTreeMap<u32, OffCpuCounters>,
    /// Logical waits of the trainers' and ranks' consumer threads per (waker, wakee): the
    /// waker is the process whose batch ended them; waker 0: no process of the job did.
    pub wakes: BTreeMap<WakeKey, WakeCounters>,
    pub syscalls: BTreeMap<u32, SyscallWaits>,
    /// The waits for data in progress at the latest read, and its time.
    pub open: Vec<OpenWaitRec>,
    pub open_at_ns: u64,
    /// The long waits one by one, with the waker's reclaim during each.
    pub long: crate::model::longwait::LongWaits,
}

/// The wake map's key for waits that no process of the job ended.
pub const NO_WAKER: u32 = 0;

impl OffCpu {
    /// Folds in a read of the waits in progress (a full set each time).
    pub fn apply_open(&mut self, t_ns: u64, open: &[OpenWaitRec]) {
        self.open = open.to_vec();
        self.open_at_ns = t_ns;
    }

    /// Folds in a counter read. `settled`: processes whose counters are final (exited, their
    /// kernel entries deleted): a late re-created entry would restart from zero, so it is not
    /// news.
    pub fn apply(
        &mut self,
        procs: &[OffCpuRec],
        wakes: &[WakeRec],
        syscalls: &[SyscallWaitsRec],
        settled: impl Fn(u32) -> bool,
    ) {
        for p in procs {
            if !settled(p.pid) {
                self.procs.insert(p.pid, p.counters);
            }
        }
        for s in syscalls {
            if !settled(s.pid) {
                self.syscalls.insert(s.pid, s.waits);
            }
        }
        for w in wakes {
            if !settled(w.waker) && !settled(w.wakee) {
                self.wakes.insert(w.key(), w.counters);
            }
        }
    }

    pub fn of(&self, pid: u32) -> OffCpuCounters {
        self.procs.get(&pid).copied().unwrap_or_default()
    }

    /// The waits of processes for which `waits` holds (trainers and ranks) that `waker` ended.
    pub fn kept_waiting(&self, waker: u32, waits: impl Fn(u32) -> bool) -> WakeCounters {
        sum(self.wakes.iter().filter(|(k, _)| k.waker == waker && waits(k.wakee)).map(|(_, c)| c))
    }

    /// `wakee`'s waits that other processes of the job ended: its wait for data.
    pub fn data_wait(&self, wakee: u32) -> WakeCounters {
        let theirs = |k: &WakeKey| k.wakee == wakee && k.waker != wakee && k.waker != NO_WAKER;
        sum(self.wakes.iter().filter(|(k, _)| theirs(k)).map(|(_, c)| c))
    }

    /// `wakee`'s consumer waits that no process of the job ended (they ran out, or a signal
    /// or a device ended them): not waits for data, kept apart and shown.
    pub fn unended_wait(&self, wakee: u32) -> WakeCounters {
        self.wakes.get(&WakeKey { waker: NO_WAKER, wakee }).copied().unwrap_or_default()
    }

    /// `pid`'s wait for data in progress at the latest read: since when, how long by then.
    pub fn open_wait(&self, pid: u32) -> Option<OpenWaitSummary> {
        let w = self.open.iter().find(|w| w.pid == pid)?;
        Some(OpenWaitSummary {
            tid: w.tid,
            since_ns: w.since_ns,
            ns: self.open_at_ns.saturating_sub(w.since_ns),
            without_batch_ns: self.open_at_ns.saturating_sub(w.since_ns.max(w.last_batch_ns)),
            blocks: w.blocks,
            batches_put_aside: w.batches,
        })
    }
}

/// A process's off-CPU figures in the summary (`processes[]`, flattened).
#[derive(Serialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct OffCpuSummary {
    /// Blocked interruptibly (waiting on an event: pipe, queue, socket, futex, poll).
    pub offcpu_wait_ns: u64,
    /// Blocked uninterruptibly (disk, page faults, reclaim).
    pub offcpu_io_ns: u64,
    /// Runnable but not running (waiting for a CPU).
    pub runqueue_ns: u64,
    /// Waits of the trainer's or a rank's threads that this process ended: it kept them
    /// waiting that long (for workers, the batches it delivered late).
    pub kept_waiting_ns: u64,
    pub kept_waiting_count: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_waiting_p99_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_waiting_max_ns: Option<u64>,
    /// Trainer and ranks: its wait for data, as logical waits of its consumer thread (the
    /// main thread): blocks joined across timeouts, batches put aside
    /// and a relay thread, each from its first block to the batch that ended it, charged to
    /// another process of the job (batches, results, collectives' helpers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_wait_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_wait_count: Option<u64>,
    /// Trainer and ranks: its consumer thread's waits that no process of the job ended (they
    /// ran out, or a signal or a device woke them): not waits for data, shown apart.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unended_wait_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unended_wait_count: Option<u64>,
    /// Trainer and ranks: a wait for data still in progress at the latest read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_data_wait: Option<OpenWaitSummary>,
    /// The waits of `LONG_WAIT_NS` (10 ms) or more that this process ended, and how much of
    /// them it spent stalled in reclaim itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub long_waits: Option<crate::model::longwait::LongWaitSummary>,
    /// Trainer and ranks: their threads' interruptible waits by the syscall they blocked in
    /// (classes with none left out); `None` where the kernel did not count them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_by_syscall: Option<BTreeMap<WaitClass, ClassWait>>,
}

/// A wait for data in progress (summary: `processes[].open_data_wait`).
#[derive(Serialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenWaitSummary {
    pub tid: u32,
    pub since_ns: u64,
    /// How long it had lasted at the latest read, and how long no batch at all had come (a
    /// stuck input pipeline, where batches put aside still flow).
    pub ns: u64,
    pub without_batch_ns: u64,
    pub blocks: u32,
    pub batches_put_aside: u32,
}

/// The waits of one syscall class: every block (`ns`, `count`), and the waits for data whose
/// batch came in a block of that class (`data_*`, logical waits: part of `data_wait_ns`).
#[derive(Serialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassWait {
    pub ns: u64,
    pub count: u64,
    pub data_ns: u64,
    pub data_count: u64,
}

/// The classes a process's waits fell in, those with any.
pub fn by_class(w: &SyscallWaits) -> BTreeMap<WaitClass, ClassWait> {
    WaitClass::ALL
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            let cw = ClassWait {
                ns: w.ns[i],
                count: w.count[i],
                data_ns: w.data_ns[i],
                data_count: w.data_count[i],
            };
            (c, cw)
        })
        .filter(|(_, cw)| cw.count > 0)
        .collect()
}

impl OffCpu {
    /// `pid`'s figures; `waits(p)` tells the processes whose waits are a wait for data
    /// (trainer and ranks), of which `pid` may be one.
    /// `None` when nothing was measured (a kernel or a recording without off-CPU accounting).
    pub fn summary(&self, pid: u32, waits: impl Fn(u32) -> bool) -> Option<OffCpuSummary> {
        if self.procs.is_empty() && self.wakes.is_empty() {
            return None;
        }
        let c = self.of(pid);
        let is_waiter = waits(pid);
        let kept = self.kept_waiting(pid, &waits);
        let data = is_waiter.then(|| self.data_wait(pid));
        let unended = is_waiter.then(|| self.unended_wait(pid));
        Some(OffCpuSummary {
            offcpu_wait_ns: c.wait_ns,
            offcpu_io_ns: c.io_ns,
            runqueue_ns: c.runq_ns,
            kept_waiting_ns: kept.ns,
            kept_waiting_count: kept.count,
            kept_waiting_p99_ns: wait_percentile_ns(&kept, 0.99),
            kept_waiting_max_ns: (kept.count > 0).then_some(kept.max_ns),
            data_wait_ns: data.map(|d| d.ns),
            data_wait_count: data.map(|d| d.count),
            unended_wait_ns: unended.map(|d| d.ns),
            unended_wait_count: unended.map(|d| d.count),
            open_data_wait: self.open_wait(pid).filter(|_| is_waiter),
            long_waits: self.long.of(pid),
            wait_by_syscall: self.syscalls.get(&pid).filter(|_| is_waiter).map(by_class),
        })
    }
}

/// Sums pairs: counts, totals and histograms add, the maximum is the largest.
pub fn sum<'a>(it: impl IntoIterator<Item = &'a WakeCounters>) -> WakeCounters {
    let mut s = WakeCounters::default();
    for c in it {
        s.count += c.count;
        s.ns += c.ns;
        s.max_ns = s.max_ns.max(c.max_ns);
        for (d, v) in s.hist.iter_mut().zip(&c.hist) {
            *d += v;
        }
    }
    s
}

/// A percentile of the waits, as the upper bound of its power-of-two bucket of microseconds
/// (exact to a factor of two), never above the longest wait seen.
pub fn wait_percentile_ns(c: &WakeCounters, q: f64) -> Option<u64> {
    let total: u64 = c.hist.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (i, &n) in c.hist.iter().enumerate() {
        seen += n;
        if seen >= rank {
            let bound = if i + 1 >= WAKE_BUCKETS { u64::MAX } else { (1u64 << (i + 1)) * 1000 };
            return Some(if c.max_ns > 0 { bound.min(c.max_ns) } else { bound });
        }
    }
    None
}

/// These off-CPU totals counted from `base` (a full read taken earlier): a bundle's window.
pub fn rebase_offcpu(now: &[OffCpuRec], base: &[OffCpuRec]) -> Vec<OffCpuRec> {
    let base: std::collections::HashMap<u32, &OffCpuCounters> =
        base.iter().map(|b| (b.pid, &b.counters)).collect();
    let zero = OffCpuCounters::default();
    now.iter()
        .map(|r| OffCpuRec {
            pid: r.pid,
            counters: r.counters.since(base.get(&r.pid).copied().unwrap_or(&zero)),
        })
        .collect()
}

/// The same for the waits by syscall class.
pub fn rebase_syscall_waits(
    now: &[SyscallWaitsRec],
    base: &[SyscallWaitsRec],
) -> Vec<SyscallWaitsRec> {
    let base: std::collections::HashMap<u32, &SyscallWaits> =
        base.iter().map(|b| (b.pid, &b.waits)).collect();
    let zero = SyscallWaits::default();
    now.iter()
        .map(|r| SyscallWaitsRec {
            pid: r.pid,
            waits: r.waits.since(base.get(&r.pid).copied().unwrap_or(&zero)),
        })
        .collect()
}

/// The same for the wake pairs.
pub fn rebase_wakes(now: &[WakeRec], base: &[WakeRec]) -> Vec<WakeRec> {
    let base: std::collections::HashMap<WakeKey, &WakeCounters> =
        base.iter().map(|b| (b.key(), &b.counters)).collect();
    let zero = WakeCounters::default();
    now.iter()
        .map(|r| WakeRec {
            counters: r.counters.since(base.get(&r.key()).copied().unwrap_or(&zero)),
            ..*r
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wake(count: u64, ns: u64, bucket: usize) -> WakeCounters {
        let mut hist = [0; WAKE_BUCKETS];
        hist[bucket] = count;
        WakeCounters { count, ns, max_ns: ns / count.max(1), hist }
    }

    #[test]
    fn the_trainer_waits_are_charged_to_the_workers_that_ended_them() {
        let mut o = OffCpu::default();
        let rec = |waker, wakee, c| WakeRec { waker, wakee, counters: c };
        o.apply(
            &[OffCpuRec {
                pid: 10,
                counters: OffCpuCounters { wait_ns: 900, ..Default::default() },
            }],
            &[
                rec(11, 10, wake(10, 800_000_000, 16)), // the slow worker: 80 ms each
                rec(12, 10, wake(10, 1_000_000, 6)),    // the fast one
                rec(10, 11, wake(5, 50_000, 5)),        // the trainer woke a worker
            ],
            &[],
            |_| false,
        );
        let trainer = |pid| pid == 10;
        assert_eq!(o.kept_waiting(11, trainer).ns, 800_000_000);
        assert_eq!(o.kept_waiting(10, trainer).count, 0, "a wake of a worker is no data wait");
        assert_eq!(o.data_wait(10).ns, 801_000_000);
        assert_eq!(o.data_wait(10).count, 20);
        let p99 = wait_percentile_ns(&o.kept_waiting(11, trainer), 0.99);
        assert_eq!(p99, Some(80_000_000), "the bucket's bound (131 ms), capped at the max");
        assert_eq!(o.of(10).wait_ns, 900);
    }

    #[test]
    fn a_waiters_waits_are_summed_by_syscall_class() {
        let mut o = OffCpu::default();
        let mut w = SyscallWaits::default();
        let (read, ioctl) = (WaitClass::Read as usize, WaitClass::Ioctl as usize);
        (w.count[read], w.ns[read], w.data_count[read], w.data_ns[read]) = (12, 900, 12, 900);
        (w.count[ioctl], w.ns[ioctl]) = (3, 300);
        let rec = |waits| SyscallWaitsRec { pid: 10, waits };
        let counters = OffCpuCounters { wait_count: 15, wait_ns: 1200, ..Default::default() };
        o.apply(&[OffCpuRec { pid: 10, counters }], &[], &[rec(w)], |_| false);
        let trainer = |pid| pid == 10;
        let s = o.summary(10, trainer).expect("figures");
        let by = s.wait_by_syscall.clone().expect("the trainer's classes");
        assert_eq!(by.len(), 2, "classes with no wait are left out: {by:?}");
        assert_eq!(
            by[&WaitClass::Read],
            ClassWait { ns: 900, count: 12, data_ns: 900, data_count: 12 }
        );
        assert_eq!(by[&WaitClass::Ioctl].data_ns, 0, "no process of the job ended those");
        let json = serde_json::to_value(&s).expect("json");
        assert_eq!(json["wait_by_syscall"]["ioctl"]["ns"], 300, "{json}");
        assert!(o.summary(11, trainer).expect("figures").wait_by_syscall.is_none(), "a worker");
        // A bundle's window: counted from an earlier read.
        let mut later = w;
        later.ns[read] += 100;
        let window = rebase_syscall_waits(&[rec(later)], &[rec(w)]);
        assert_eq!((window[0].waits.ns[read], window[0].waits.ns[ioctl]), (100, 0));
    }

    #[test]
    fn settled_processes_keep_their_last_totals() {
        let mut o = OffCpu::default();
        let w = |ns| WakeRec { waker: 11, wakee: 10, counters: wake(1, ns, 0) };
        o.apply(&[], &[w(500)], &[], |_| false);
        o.apply(&[], &[w(3)], &[], |pid| pid == 11);
        assert_eq!(o.data_wait(10).ns, 500);
        assert_eq!(wait_percentile_ns(&WakeCounters::default(), 0.99), None);
    }
}
