//! What tracing costs: each eBPF program's run count and run time (from the kernel's BPF stats,
//! when `kernel.bpf_stats_enabled` is 1) and the agent's own CPU time and peak memory.

use serde::Serialize;

#[derive(Serialize, serde::Deserialize, Debug, Clone, Default, PartialEq)]
pub struct ProgramStat {
    pub name: String,
    pub run_count: u64,
    pub run_time_ns: u64,
    pub avg_ns: Option<f64>,
    /// Runs the kernel skipped because the program was already running on that CPU (a
    /// request's completion in an interrupt while the program handled another: the kernel
    /// never nests a program; `recursion_misses`, 5.12+, counted for BTF-typed and raw
    /// tracepoint programs only). Each is an event not seen. Absent when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub missed: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

#[derive(Serialize, serde::Deserialize, Debug, Clone, Default, PartialEq)]
pub struct Overhead {
    /// False when the kernel does not collect run times (sysctl kernel.bpf_stats_enabled=0).
    pub bpf_stats_enabled: bool,
    pub programs: Vec<ProgramStat>,
    /// CPU the agent spent loading and attaching (verifier included), before tracing began.
    pub agent_startup_cpu_s: f64,
    /// All CPU the agent spent, start-up included.
    pub agent_cpu_s: f64,
    pub agent_peak_rss_kb: u64,
    /// Kernel memory of the agent's BPF maps (rings included), as the kernel charges it; it is
    /// not in the agent's RSS. Absent from recordings made before it was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bpf_map_bytes: Option<u64>,
    /// The most they can take on this host, every map full (`kernel::mapmem`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bpf_map_bytes_at_full_use: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bpf_maps: Vec<MapMemory>,
}

/// One BPF map's kernel memory (`memlock` in its fdinfo).
#[derive(Serialize, serde::Deserialize, Debug, Clone, Default, PartialEq)]
pub struct MapMemory {
    pub name: String,
    pub bytes: u64,
    pub at_full_use_bytes: u64,
}

impl ProgramStat {
    pub fn new(name: &str, run_count: u64, run_time_ns: u64) -> Self {
        Self {
            name: name.to_string(),
            run_count,
            run_time_ns,
            avg_ns: (run_count > 0 && run_time_ns > 0)
                .then(|| run_time_ns as f64 / run_count as f64),
            missed: 0,
        }
    }

    /// The same, with the runs the kernel skipped.
    pub fn with_missed(self, missed: u64) -> Self {
        Self { missed, ..self }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn average_only_when_measured() {
        assert_eq!(super::ProgramStat::new("p", 10, 500).avg_ns, Some(50.0));
        assert_eq!(super::ProgramStat::new("p", 10, 0).avg_ns, None);
        assert_eq!(super::ProgramStat::new("p", 0, 0).avg_ns, None);
    }
}
