//! The answer: the most likely cause of a stall, the processes behind it, the evidence chain
//! (each link a measured figure, in time order) and advice computed from the measurements.
//!
//! `decide` is a pure function of [`Facts`], so every cause is unit-tested on hand-built facts.
//! `verdict.cause` is one of:
//! - `host_memory_oom`: memory ran out (cgroup limit or host) and the OOM killer killed a traced
//!   process;
//! - `process_killed`: a traced process was killed by SIGKILL from user space (systemd-oomd,
//!   earlyoom, the kubelet, an operator), not by the OOM killer;
//! - `bus_error`: a traced process (a DataLoader worker) died of SIGBUS, typically its shared
//!   memory (/dev/shm) full;
//! - `host_memory_pressure`: traced processes stalled in reclaim and swapped, no kill (yet);
//! - `disk_full`: a filesystem the job writes to (its cwd, /tmp, /dev/shm) is full;
//! - `process_hung`: a traced process sat stopped (T) or in uninterruptible sleep (D);
//! - `gpu_throttling`: the GPU slowed itself (thermal or power) with no host-side cause;
//! - `disk_io_bound`: the job waited on its own disk reads/writes with no memory pressure;
//! - `deadlock`: the GPU (or the training log) stalled while every traced process sat idle
//!   (no CPU, no I/O), none of them stopped or in D state;
//! - `cpu_quota_throttled`, `busy_host`, `network_bound`, `cpu_bound_pipeline`, `trainer_bound`:
//!   the trainer starved for data (or the GPU for the trainer) for a reason other than memory
//!   (`input.rs`);
//! - `gpu_bound`: the trainer waited for the GPU (inside the CUDA driver's synchronising calls)
//!   most of its time and for data little: the input pipeline keeps up (`gpuwait.rs`);
//! - `none_detected`: nothing measured explains a stall.

mod advice;
mod datawait;
mod evidence;
mod gpu_bound;
mod input;
mod kernel_faults;
mod rules;
mod stacks;

use serde::Serialize;

pub use crate::diagnose::facts::Facts;
pub use gpu_bound::TimeSplit;

/// A trainer's or rank's time split into waiting for data, for the GPU, its own CPU work and
/// the rest, where its GPU waits were measured.
pub fn time_split(p: &crate::diagnose::facts::ProcFacts) -> Option<TimeSplit> {
    TimeSplit::of(p, datawait::wait_of(p)?.0)
}
use rules::Ctx;

/// The cause of a stall; its JSON name is the summary's `verdict.cause`.
#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    GpuFault,
    HostMemoryOom,
    ProcessKilled,
    BusError,
    HostMemoryPressure,
    DiskFull,
    StorageError,
    HungTask,
    ProcessHung,
    GpuThrottling,
    IoThrottled,
    DiskIoBound,
    Deadlock,
    CpuQuotaThrottled,
    BusyHost,
    NetworkBound,
    StragglerWorker,
    CpuBoundPipeline,
    TrainerBound,
    GpuBound,
    NoneDetected,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::GpuFault => "gpu_fault",
            Self::HostMemoryOom => "host_memory_oom",
            Self::ProcessKilled => "process_killed",
            Self::BusError => "bus_error",
            Self::HostMemoryPressure => "host_memory_pressure",
            Self::DiskFull => "disk_full",
            Self::StorageError => "storage_error",
            Self::HungTask => "hung_task",
            Self::ProcessHung => "process_hung",
            Self::GpuThrottling => "gpu_throttling",
            Self::IoThrottled => "io_throttled",
            Self::DiskIoBound => "disk_io_bound",
            Self::Deadlock => "deadlock",
            Self::CpuQuotaThrottled => "cpu_quota_throttled",
            Self::BusyHost => "busy_host",
            Self::NetworkBound => "network_bound",
            Self::StragglerWorker => "straggler_worker",
            Self::CpuBoundPipeline => "cpu_bound_pipeline",
            Self::TrainerBound => "trainer_bound",
            Self::GpuBound => "gpu_bound",
            Self::NoneDetected => "none_detected",
        }
    }
}

/// How bad a cause is for the job: what a report's heading is coloured by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// The job failed or cannot progress: a kill, a fault, a hang, a full disk.
    Failure,
    /// The job runs, slower than it could: starved, throttled, waiting on a disk.
    Slowdown,
    /// Nothing measured explains a stall.
    Clear,
}

impl Cause {
    /// The cause in plain words, for a report's heading (the JSON keeps `as_str`).
    pub fn title(self) -> &'static str {
        match self {
            Self::GpuFault => "GPU or driver fault",
            Self::HostMemoryOom => "Out of memory: a process was OOM-killed",
            Self::ProcessKilled => "A process was killed (SIGKILL from user space)",
            Self::BusError => "A process died of a bus error (shared memory full?)",
            Self::HostMemoryPressure => "Memory pressure: reclaim and swap slowed the job",
            Self::DiskFull => "A filesystem the job writes to is full",
            Self::StorageError => "Storage errors",
            Self::HungTask => "The kernel reports a hung task",
            Self::ProcessHung => "A process is stuck",
            Self::GpuThrottling => "The GPU throttled itself",
            Self::IoThrottled => "A cgroup I/O limit throttles the job's reads",
            Self::DiskIoBound => "The job waits on its disk",
            Self::Deadlock => "The job sits idle: a deadlock or a wait",
            Self::CpuQuotaThrottled => "A CPU limit throttles the input pipeline",
            Self::BusyHost => "Other processes take the CPUs the input pipeline needs",
            Self::NetworkBound => "The input pipeline waits on remote storage",
            Self::StragglerWorker => "One DataLoader worker holds the input pipeline back",
            Self::CpuBoundPipeline => "The input pipeline is CPU-bound",
            Self::TrainerBound => "The trainer's own work keeps the GPU waiting",
            Self::GpuBound => "The job is GPU-bound: its input pipeline keeps up",
            Self::NoneDetected => "No stall cause found",
        }
    }

    pub fn severity(self) -> Severity {
        match self {
            Self::GpuFault
            | Self::HostMemoryOom
            | Self::ProcessKilled
            | Self::BusError
            | Self::DiskFull
            | Self::StorageError
            | Self::HungTask
            | Self::ProcessHung
            | Self::Deadlock => Severity::Failure,
            Self::HostMemoryPressure
            | Self::GpuThrottling
            | Self::IoThrottled
            | Self::DiskIoBound
            | Self::CpuQuotaThrottled
            | Self::BusyHost
            | Self::NetworkBound
            | Self::StragglerWorker
            | Self::CpuBoundPipeline
            | Self::TrainerBound => Severity::Slowdown,
            Self::GpuBound | Self::NoneDetected => Severity::Clear,
        }
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The causes in order of precedence: the first rule that matches gives the verdict. An OOM
/// kill explains everything after it; a full disk or memory pressure explain a hang or a
/// disk wait better than those explain themselves; throttling, disk-bound and deadlock are
/// what remains when the host side is clean.
/// A rule gives the verdict for its cause, or passes.
type Rule = fn(&Ctx) -> Option<Verdict>;

const RULES: &[(Cause, Rule)] = &[
    (Cause::GpuFault, kernel_faults::gpu_fault),
    (Cause::HostMemoryOom, rules::host_memory_oom),
    (Cause::ProcessKilled, rules::process_killed),
    (Cause::BusError, rules::bus_error),
    (Cause::DiskFull, rules::disk_full),
    (Cause::StorageError, kernel_faults::storage_error),
    (Cause::HostMemoryPressure, rules::host_memory_pressure),
    (Cause::HungTask, kernel_faults::hung_task),
    (Cause::ProcessHung, rules::process_hung),
    (Cause::Deadlock, rules::stuck_worker),
    (Cause::GpuThrottling, rules::gpu_throttling),
    (Cause::IoThrottled, rules::io_throttled),
    (Cause::DiskIoBound, rules::disk_io_bound),
    (Cause::StragglerWorker, input::straggler_worker),
    (Cause::CpuQuotaThrottled, input::cpu_quota_throttled),
    (Cause::BusyHost, input::busy_host),
    (Cause::NetworkBound, input::network_bound),
    (Cause::CpuBoundPipeline, input::cpu_bound_pipeline),
    (Cause::GpuBound, gpu_bound::gpu_bound),
    (Cause::TrainerBound, input::trainer_bound),
    (Cause::Deadlock, rules::deadlock),
];

/// The verdict on these facts (a pure function).
pub fn decide(f: &Facts) -> Verdict {
    let ctx = Ctx::new(f);
    RULES
        .iter()
        .find_map(|(cause, rule)| rule(&ctx).inspect(|v| debug_assert_eq!(v.cause, *cause)))
        .unwrap_or_else(|| rules::none_detected(&ctx))
}

#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Verdict {
    pub cause: Cause,
    /// Most to least responsible.
    pub culprit_pids: Vec<u32>,
    /// The answer in one paragraph.
    pub text: String,
    /// Links of the chain, each a measured figure, in time order.
    pub evidence: Vec<String>,
    /// What to change, with the arithmetic shown.
    pub advice: Vec<String>,
    /// The num_workers the advice names, where it names one (`cpu_bound_pipeline`,
    /// `network_bound`; `host_memory_oom` and `host_memory_pressure` where fewer workers fit):
    /// what a script reruns the job with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advice_num_workers: Option<u64>,
}

#[cfg(test)]
mod kernel_faults_tests;
#[cfg(test)]
mod tests;
