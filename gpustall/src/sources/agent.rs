//! The agent's own cost: its CPU time and peak RSS, and whether the kernel keeps BPF run stats.

/// After forgetting many processes at once, hands the freed heap back to the system (the
/// allocator keeps it otherwise, and a daemon that grew in a fork storm would stay grown).
pub fn give_back_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory at the top of the heap and in its arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

pub fn bpf_stats_enabled() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").is_ok_and(|s| s.trim() == "1")
}

/// CPU seconds (user + system) and peak RSS of this process.
pub fn agent_usage() -> (f64, u64) {
    let Ok(me) = procfs::process::Process::myself() else {
        return (0.0, 0);
    };
    let ticks = procfs::ticks_per_second() as f64;
    let cpu = me.stat().map(|s| (s.utime + s.stime) as f64 / ticks).unwrap_or(0.0);
    let hwm = me.status().ok().and_then(|s| s.vmhwm).unwrap_or(0);
    (cpu, hwm)
}

#[cfg(test)]
mod tests {
    #[test]
    fn agent_usage_is_measured() {
        let (_, hwm) = super::agent_usage();
        assert!(hwm > 0);
    }
}
