//! What the bench cases share: the release binaries, the kernel's BPF stats switch, a process's
//! CPU and memory from /proc, medians. Imports none of the cases.

use std::path::PathBuf;

use anyhow::Context as _;

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
}
