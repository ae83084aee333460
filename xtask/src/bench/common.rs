//! What the bench cases share: the release binaries, the kernel's BPF stats switch, a process's
//! CPU and memory from /proc, medians. Imports none of the cases.

use std::path::PathBuf;

use anyhow::Context as _;
use serde::Deserialize as _;

use crate::util::target_dir;

/// A release binary of the workspace (`gpustall`, `gpustall-workload`).
pub fn release_bin(name: &str) -> PathBuf {
    target_dir().join("release").join(name)
}

/// The test workload (crate `tests`), release build.
pub fn workload_bin() -> PathBuf {
    release_bin("gpustall-workload")
}

/// The swap-heavy workload: three workers allocating 300 MiB each (run in a 128 MiB memcg).
pub const SWAP_HEAVY: [&str; 4] = ["hog", "300,300,300", "8", "0"];

/// Restores kernel.bpf_stats_enabled on drop.
pub struct BpfStats(String);

impl BpfStats {
    pub fn enable() -> Self {
        let path = "/proc/sys/kernel/bpf_stats_enabled";
        let old = std::fs::read_to_string(path).unwrap_or_else(|_| "0".into());
        let _ = std::fs::write(path, "1");
        Self(old.trim().to_string())
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", &self.0);
    }
}

/// CPU seconds (user + system) and resident / peak memory of a process, from /proc.
pub fn usage(pid: u32) -> anyhow::Result<(f64, u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(") ").map(|x| x.1).context("stat")?;
    let f: Vec<&str> = after.split_whitespace().collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu = (f[11].parse::<f64>()? + f[12].parse::<f64>()?) / hz;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0u64)
    };
    Ok((cpu, kb("VmRSS:"), kb("VmHWM:")))
}

/// The middle value (the upper one of an even count); 0 for none.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The tracepoint a gpustall program serves: its typed twins (`_btf`, `_raw`) line up with the
/// classic program (and a peer's) on the same event.
pub fn tracepoint_of(program: &str) -> &str {
    let name = program.strip_suffix("_btf").or_else(|| program.strip_suffix("_raw"));
    name.unwrap_or(program)
}

/// One eBPF program's figures in a gpustall summary's `overhead.programs` (the kernel's BPF
/// stats; docs/FORMATS.md), as the bench reads them.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Program {
    pub name: String,
    pub run_count: u64,
    pub run_time_ns: u64,
    pub avg_ns: Option<f64>,
    /// Runs the kernel skipped (the program already running on that CPU).
    #[serde(skip_serializing_if = "is_zero")]
    pub missed: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl Program {
    /// Its time per run: from the run time where it ran, else the summary's own average.
    pub fn ns_per_run(&self) -> Option<f64> {
        if self.run_count > 0 && self.run_time_ns > 0 {
            return Some(self.run_time_ns as f64 / self.run_count as f64);
        }
        self.avg_ns
    }
}

/// What the bench reads of a gpustall summary's `overhead`.
#[derive(serde::Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Overhead {
    pub programs: Vec<Program>,
    pub agent_cpu_s: f64,
    pub agent_startup_cpu_s: f64,
    pub agent_peak_rss_kb: u64,
}

impl Overhead {
    /// The program that serves `tracepoint` (its typed twin where the kernel has BTF).
    pub fn program(&self, tracepoint: &str) -> Option<&Program> {
        self.programs.iter().find(|p| tracepoint_of(&p.name) == tracepoint)
    }

    /// The agent's CPU while tracing, without its start-up (loading and verifying).
    pub fn cpu_while_tracing_s(&self) -> f64 {
        self.agent_cpu_s - self.agent_startup_cpu_s
    }
}

/// What the bench reads of a gpustall summary (`--summary-json`; docs/FORMATS.md).
#[derive(serde::Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct TracedSummary {
    pub duration_s: f64,
    /// Ring records that reached the agent.
    pub events: u64,
    pub lost_events: u64,
    pub overhead: Overhead,
    pub processes: Vec<ProcessFigures>,
}

/// What the bench reads of a process in a gpustall summary (`processes[]`).
#[derive(serde::Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct ProcessFigures {
    pub role: String,
    /// The trainer's waits this process ended (docs/FORMATS.md).
    pub kept_waiting_ns: u64,
    /// A trainer's wait for data; absent for other roles.
    pub data_wait_ns: Option<u64>,
    /// Its timed GPU calls (CUDA's synchronize uprobes); absent where none were timed.
    pub gpu_wait: Option<GpuWaitFigures>,
    /// Its Python stacks' samples; absent where none were taken.
    pub py_stacks: Option<StackSamples>,
}

/// A process's Python stack samples (`processes[].py_stacks`).
#[derive(serde::Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct StackSamples {
    pub samples: u64,
    pub failed_samples: u64,
}

/// A process's timed GPU calls (`processes[].gpu_wait`).
#[derive(serde::Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct GpuWaitFigures {
    pub calls: u64,
}

impl TracedSummary {
    /// The sum of `figure` over the processes of `role`.
    pub fn sum_over(&self, role: &str, figure: impl Fn(&ProcessFigures) -> u64) -> u64 {
        self.processes.iter().filter(|p| p.role == role).map(figure).sum()
    }
}

impl TracedSummary {
    pub fn of(v: &serde_json::Value) -> anyhow::Result<Self> {
        Self::deserialize(v).context("a gpustall summary")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_tracepoints() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(tracepoint_of("sched_switch_btf"), "sched_switch");
        assert_eq!(tracepoint_of("signal_generate_raw"), "signal_generate");
        assert_eq!(tracepoint_of("task_newtask"), "task_newtask");
    }

    #[test]
    fn a_summary_is_read_typed() {
        let v = serde_json::json!({"duration_s": 2.0, "events": 7, "lost_events": 0,
            "overhead": {"agent_cpu_s": 0.5, "agent_startup_cpu_s": 0.2, "agent_peak_rss_kb": 9,
                "programs": [{"name": "sched_switch_btf", "run_count": 4, "run_time_ns": 800,
                    "avg_ns": 200.0}, {"name": "idle", "run_count": 0, "run_time_ns": 0}]},
            "processes": []});
        let s = TracedSummary::of(&v).expect("typed");
        assert_eq!(s.overhead.program("sched_switch").and_then(Program::ns_per_run), Some(200.0));
        assert_eq!(s.overhead.program("idle").and_then(Program::ns_per_run), None);
        assert!((s.overhead.cpu_while_tracing_s() - 0.3).abs() < 1e-9);
        assert!(TracedSummary::of(&serde_json::json!({"events": "many"})).is_err());
    }
}
