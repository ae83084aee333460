//! Observations: everything the model learns besides kernel events, in the form it is recorded
//! (`{"type":"sample","kind":..}` lines). The live agent and `gpustall report` feed the model
//! through the same [`Sample`]s, so a replayed recording gives the summary the live run gave.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use gpustall_common::counters::{IoCounters, ProcCounters};

use crate::model::gpu::GpuSample;
use crate::model::host::CgroupMem;
use crate::model::host::DiskStat;
use crate::model::host::FsUsage;
use crate::model::host::HostMem;
use crate::model::host::TaskState;
use crate::model::host::{JobContext, Psi};
use crate::model::overhead::Overhead;
use crate::model::stats::MemSample;

/// The kernel's counters for one process.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcCountersRec {
    pub pid: u32,
    #[serde(flatten)]
    pub counters: ProcCounters,
}

/// Block I/O totals of one (process, device, direction, in-reclaim) slot.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoRec {
    pub pid: u32,
    pub dev: u32,
    pub op: u32,
    pub in_reclaim: bool,
    #[serde(flatten)]
    pub counters: IoCounters,
}

/// A read of the kernel's counter maps. Entries are cumulative and replace earlier ones; the
/// live agent writes only entries that changed since its last write.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct CountersSample {
    pub t_ns: u64,
    pub procs: Vec<ProcCountersRec>,
    pub io: Vec<IoRec>,
    /// Host-level counters (`HostCounter` order), lost-event counters (`LostCounter` order) and
    /// undecodable records; empty when unchanged.
    pub host: Vec<u64>,
    pub lost: Vec<u64>,
    pub undecodable: Option<u64>,
    /// Completed-request latency histograms (log2 buckets) per direction; empty when unchanged.
    pub io_latency: Vec<Vec<u64>>,
    /// Off-CPU totals per process and the waits each process ended for another (absent in
    /// recordings from before off-CPU accounting).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub offcpu: Vec<crate::model::offcpu::OffCpuRec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wakes: Vec<crate::model::offcpu::WakeRec>,
    /// Trainers' and ranks' waits by syscall class (recordings before it have none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub syscall_waits: Vec<crate::model::offcpu::SyscallWaitsRec>,
    /// The trainers' and ranks' waits for data in progress, the whole set (`None`: unchanged
    /// since the last line, or not read; recordings before it have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_waits: Option<Vec<crate::model::offcpu::OpenWaitRec>>,
    /// Trainers' and ranks' time inside the CUDA driver's synchronising calls (recordings
    /// before it have none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_waits: Vec<crate::model::gpuwait::GpuWaitRec>,
}

impl CountersSample {
    /// What changed from `prev` to `self` (both full reads), for the recording.
    pub fn changes_since(&self, prev: &CountersSample) -> CountersSample {
        let procs = self.procs.iter().filter(|p| !prev.procs.contains(p)).copied().collect();
        let io = self.io.iter().filter(|r| !prev.io.contains(r)).copied().collect();
        CountersSample {
            t_ns: self.t_ns,
            procs,
            io,
            host: if self.host == prev.host { Vec::new() } else { self.host.clone() },
            lost: if self.lost == prev.lost { Vec::new() } else { self.lost.clone() },
            undecodable: (self.undecodable != prev.undecodable)
                .then_some(self.undecodable)
                .flatten(),
            io_latency: if self.io_latency == prev.io_latency {
                Vec::new()
            } else {
                self.io_latency.clone()
            },
            offcpu: self.offcpu.iter().filter(|p| !prev.offcpu.contains(p)).copied().collect(),
            wakes: self.wakes.iter().filter(|w| !prev.wakes.contains(w)).copied().collect(),
            syscall_waits: self
                .syscall_waits
                .iter()
                .filter(|w| !prev.syscall_waits.contains(w))
                .copied()
                .collect(),
            open_waits: (self.open_waits != prev.open_waits)
                .then(|| self.open_waits.clone())
                .flatten(),
            gpu_waits: self
                .gpu_waits
                .iter()
                .filter(|w| !prev.gpu_waits.contains(w))
                .copied()
                .collect(),
        }
    }

    /// These totals counted from `base` (a full read taken earlier) instead of from the
    /// start: what an incident bundle needs, whose window begins mid-run.
    pub fn minus(&self, base: &CountersSample) -> CountersSample {
        // Keyed once: a bundle rebases thousands of processes, a scan per process would be
        // quadratic.
        let base_procs: HashMap<u32, &ProcCounters> =
            base.procs.iter().map(|b| (b.pid, &b.counters)).collect();
        let base_io: HashMap<(u32, u32, u32, bool), &IoCounters> =
            base.io.iter().map(|b| ((b.pid, b.dev, b.op, b.in_reclaim), &b.counters)).collect();
        let zero_p = ProcCounters::default();
        let zero_io = IoCounters::default();
        let procs = self
            .procs
            .iter()
            .map(|p| ProcCountersRec {
                pid: p.pid,
                counters: p.counters.since(base_procs.get(&p.pid).copied().unwrap_or(&zero_p)),
            })
            .collect();
        let io = self
            .io
            .iter()
            .map(|r| {
                let b = base_io.get(&(r.pid, r.dev, r.op, r.in_reclaim)).copied();
                IoRec { counters: r.counters.since(b.unwrap_or(&zero_io)), ..*r }
            })
            .collect();
        let sub = |a: &[u64], b: &[u64]| -> Vec<u64> {
            a.iter()
                .enumerate()
                .map(|(i, v)| v.saturating_sub(b.get(i).copied().unwrap_or(0)))
                .collect()
        };
        CountersSample {
            t_ns: self.t_ns,
            procs,
            io,
            host: sub(&self.host, &base.host),
            lost: sub(&self.lost, &base.lost),
            undecodable: self.undecodable.map(|u| u.saturating_sub(base.undecodable.unwrap_or(0))),
            io_latency: self
                .io_latency
                .iter()
                .enumerate()
                .map(|(i, h)| sub(h, base.io_latency.get(i).map_or(&[][..], |v| v.as_slice())))
                .collect(),
            offcpu: crate::model::offcpu::rebase_offcpu(&self.offcpu, &base.offcpu),
            wakes: crate::model::offcpu::rebase_wakes(&self.wakes, &base.wakes),
            syscall_waits: crate::model::offcpu::rebase_syscall_waits(
                &self.syscall_waits,
                &base.syscall_waits,
            ),
            open_waits: self.open_waits.clone(),
            gpu_waits: crate::model::gpuwait::rebase(&self.gpu_waits, &base.gpu_waits),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
            && self.io.is_empty()
            && self.host.is_empty()
            && self.lost.is_empty()
            && self.undecodable.is_none()
            && self.io_latency.is_empty()
            && self.offcpu.is_empty()
            && self.wakes.is_empty()
            && self.syscall_waits.is_empty()
            && self.open_waits.is_none()
            && self.gpu_waits.is_empty()
    }
}

/// The job's surroundings at one moment.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ContextSample {
    pub t_ns: u64,
    pub cgroup: Option<CgroupMem>,
    pub host: Option<HostMem>,
    /// The /proc/vmstat counters the verdict uses.
    pub vmstat: BTreeMap<String, u64>,
    pub disks: Vec<DiskStat>,
    pub tasks: Vec<TaskState>,
    pub filesystems: Vec<FsUsage>,
    /// /proc/pressure/memory; `None` without PSI (CONFIG_PSI off, or psi=0 on the cmdline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_pressure: Option<Psi>,
    /// `gpustall watch`: each job's own cgroup and filesystems (`cgroup` and `filesystems`
    /// above are then empty: no job stands for the node).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<JobContext>,
    /// CPU: the job's CPU cgroup quota and throttling, the host's busy time, the top CPU
    /// consumers outside the job, socket waits (`model::cpu`); absent in older recordings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<crate::model::cpu::CpuSample>,
    /// The block I/O limits on the job's cgroup and its ancestors, when read (at the start,
    /// then every few seconds; `None` in between and in older recordings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_limits: Option<Vec<crate::model::host::IoLimit>>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Sample {
    /// A process of the tree that existed when tracing began.
    Seed {
        t_ns: u64,
        pid: u32,
        ppid: u32,
        comm: String,
        is_target: bool,
    },
    ProcMem {
        t_ns: u64,
        pid: u32,
        #[serde(flatten)]
        mem: MemSample,
    },
    /// Gone from /proc without an exit event (one was lost).
    Vanished {
        t_ns: u64,
        pid: u32,
    },
    Cmdline {
        t_ns: u64,
        pid: u32,
        cmdline: String,
    },
    /// Which job the process belongs to in its cluster (pod, Slurm job, torchrun rank),
    /// where anything was found (`model::identity`).
    Identity {
        t_ns: u64,
        pid: u32,
        #[serde(flatten)]
        identity: crate::model::identity::Identity,
    },
    Counters(CountersSample),
    /// Boxed: the largest sample by far (a cgroup with its limits, events and PSI, every
    /// watched job's), and the rarest (one a second).
    Context(Box<ContextSample>),
    /// One NVML read of every GPU.
    Gpu {
        t_ns: u64,
        gpus: Vec<GpuSample>,
    },
    /// A training-log step, stamped when the line was read.
    TrainStep {
        t_ns: u64,
        data_time_s: Option<f64>,
        iter_time_s: Option<f64>,
        /// Its number among the steps traced (from 1): two steps read in one batch with the
        /// same times are still two lines, not a duplicated one (recordings before it have
        /// none, and lose such steps on replay).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seq: Option<u64>,
        /// The training iteration the line was logged at, where it says (mmengine).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        iter: Option<u64>,
    },
    /// What tracing cost, written once at the end.
    Overhead {
        t_ns: u64,
        overhead: Overhead,
    },
    /// Record lines this recording lacks although they were observed: the watch daemon's
    /// flight recorder dropped them to stay within its memory budget.
    RecordingGap {
        t_ns: u64,
        lines: u64,
    },
    /// These exited processes were folded into per-role totals (`model::folded`).
    Fold {
        t_ns: u64,
        pids: Vec<u32>,
    },
    /// These exited processes' counters, as last read, are final: their kernel entries were
    /// deleted.
    Final {
        t_ns: u64,
        pids: Vec<u32>,
    },
    /// A line of the kernel log that matters to a verdict (`model::kernlog`).
    KernelLog(crate::model::kernlog::KernelLogLine),
    /// Records of the kernel log the reader missed since the last such sample (overwritten in
    /// the kernel's buffer before it read them), and kept lines it dropped (past the cap of
    /// distinct lines, `model::kernlog::DISTINCT_PER_KIND`).
    KernelLogMissed {
        t_ns: u64,
        records: u64,
        #[serde(default, skip_serializing_if = "is_zero")]
        dropped: u64,
    },
    /// A process's Python stacks sampled since its last such line (`model::pystacks`).
    PyStacks(crate::model::pystacks::PyStacksRec),
    /// Where a trainer's or rank's waits for the GPU are measured from (`model::gpuwait`).
    CudaProbes(crate::model::gpuwait::CudaProbesRec),
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Sample {
    /// The one process the sample is about, where it is about one.
    pub fn pid(&self) -> Option<u32> {
        match self {
            Sample::Seed { pid, .. }
            | Sample::ProcMem { pid, .. }
            | Sample::Vanished { pid, .. }
            | Sample::Cmdline { pid, .. }
            | Sample::Identity { pid, .. } => Some(*pid),
            Sample::PyStacks(r) => Some(r.pid),
            Sample::CudaProbes(r) => Some(r.pid),
            _ => None,
        }
    }

    pub fn t_ns(&self) -> u64 {
        match self {
            Sample::Seed { t_ns, .. }
            | Sample::ProcMem { t_ns, .. }
            | Sample::Vanished { t_ns, .. }
            | Sample::Cmdline { t_ns, .. }
            | Sample::Identity { t_ns, .. }
            | Sample::Gpu { t_ns, .. }
            | Sample::TrainStep { t_ns, .. }
            | Sample::Overhead { t_ns, .. }
            | Sample::RecordingGap { t_ns, .. }
            | Sample::Fold { t_ns, .. }
            | Sample::Final { t_ns, .. }
            | Sample::KernelLogMissed { t_ns, .. } => *t_ns,
            Sample::KernelLog(l) => l.t_ns,
            Sample::PyStacks(r) => r.t_ns,
            Sample::CudaProbes(r) => r.t_ns,
            Sample::Counters(c) => c.t_ns,
            Sample::Context(c) => c.t_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_round_trip_through_their_record_lines() {
        let s = Sample::ProcMem {
            t_ns: 5,
            pid: 7,
            mem: MemSample { rss_kb: 1, swap_kb: 2, ..Default::default() },
        };
        let line = serde_json::to_value(&s).expect("json");
        assert_eq!((line["kind"].as_str(), line["rss_kb"].as_u64()), (Some("proc_mem"), Some(1)));
        let back: Sample = serde_json::from_value(line).expect("parses back");
        assert!(matches!(back, Sample::ProcMem { t_ns: 5, pid: 7, mem } if mem.swap_kb == 2));
        let step = Sample::TrainStep {
            t_ns: 1,
            data_time_s: Some(0.7384),
            iter_time_s: None,
            seq: None,
            iter: None,
        };
        let back: Sample =
            serde_json::from_str(&serde_json::to_string(&step).expect("json")).expect("parses");
        assert!(matches!(back, Sample::TrainStep { data_time_s: Some(v), .. } if v == 0.7384));
    }

    #[test]
    fn rebasing_counts_from_the_window_start() {
        let base = CountersSample {
            procs: vec![ProcCountersRec {
                pid: 1,
                counters: ProcCounters { memcg_reclaim_ns: 100, ..Default::default() },
            }],
            host: vec![5, 5],
            ..Default::default()
        };
        let later = CountersSample {
            procs: vec![
                ProcCountersRec {
                    pid: 1,
                    counters: ProcCounters { memcg_reclaim_ns: 250, ..Default::default() },
                },
                ProcCountersRec {
                    pid: 2,
                    counters: ProcCounters { memcg_reclaim_ns: 7, ..Default::default() },
                },
            ],
            host: vec![9, 5],
            ..Default::default()
        };
        let r = later.minus(&base);
        assert_eq!(
            (r.procs[0].counters.memcg_reclaim_ns, r.procs[1].counters.memcg_reclaim_ns),
            (150, 7)
        );
        assert_eq!(r.host, vec![4, 0]);
    }

    #[test]
    fn counter_changes_keep_only_what_moved() {
        let a = CountersSample {
            t_ns: 1,
            procs: vec![
                ProcCountersRec {
                    pid: 1,
                    counters: ProcCounters { swapout_anon_pages: 5, ..Default::default() },
                },
                ProcCountersRec { pid: 2, ..Default::default() },
            ],
            host: vec![0, 1],
            ..Default::default()
        };
        let mut b = a.clone();
        b.t_ns = 2;
        b.procs[0].counters.swapout_anon_pages = 9;
        let d = b.changes_since(&a);
        assert_eq!(d.procs.len(), 1);
        assert_eq!(d.procs[0].pid, 1);
        assert!(d.host.is_empty());
        assert!(b.changes_since(&b).is_empty());
    }
}
