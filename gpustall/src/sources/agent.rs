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

/// The CPU ticks this process used so far (user and system), without a file read: each beat
/// (`sources::cpu_sample`).
pub fn cpu_ticks(clk_tck: u64) -> u64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid rusage for the call to fill.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0;
    }
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (us(u.ru_utime) + us(u.ru_stime)) * clk_tck / 1_000_000
}

#[cfg(test)]
mod tests {
    #[test]
    fn its_cpu_ticks_are_the_cpu_proc_reports() {
        let mut x = 0u64;
        for i in 0..50_000_000u64 {
            x = std::hint::black_box(x.wrapping_add(i));
        }
        let (proc_s, _) = super::agent_usage();
        let ticks_s = super::cpu_ticks(100) as f64 / 100.0;
        assert!(ticks_s > 0.0, "{x}");
        // Two readings moments apart, of one clock at 10 ms and one in microseconds.
        assert!((ticks_s - proc_s).abs() <= 0.05, "getrusage {ticks_s} s, /proc {proc_s} s");
    }

    #[test]
    fn agent_usage_is_measured() {
        let (_, hwm) = super::agent_usage();
        assert!(hwm > 0);
    }
}
