//! The attached programs' own costs: run counts and times the kernel keeps per program.

use aya::Ebpf;

/// Run count and run time of each attached program (`programs`: [`crate::kernel::loader::Probes::programs`]; run time
/// needs kernel.bpf_stats_enabled), sorted by name.
pub fn program_stats(
    ebpf: &Ebpf,
    programs: &[&'static str],
) -> Vec<crate::model::overhead::ProgramStat> {
    use std::os::fd::AsFd;
    let mut stats: Vec<_> = ebpf
        .programs()
        .filter(|(name, _)| programs.contains(name))
        .filter_map(|(name, p)| {
            let info = p.info().ok()?;
            let missed = p.fd().ok().and_then(|fd| recursion_misses(fd.as_fd())).unwrap_or(0);
            Some(
                crate::model::overhead::ProgramStat::new(
                    name,
                    info.run_count(),
                    info.run_time().as_nanos() as u64,
                )
                .with_missed(missed),
            )
        })
        .collect();
    stats.sort_by(|a, b| a.name.cmp(&b.name));
    stats
}

/// What loading each attached program cost, at debug level (target `gpustall::kernel::prog_stats`):
/// the instructions the verifier walked (`verified_insns`, 5.16+) and the sizes of what it kept,
/// translated and JIT-compiled. The per-program table of docs/HOW-IT-WORKS.md comes from it.
pub fn log_verifier_costs(ebpf: &Ebpf, programs: &[&'static str]) {
    if !log::log_enabled!(log::Level::Debug) {
        return;
    }
    let mut costs: Vec<_> = ebpf
        .programs()
        .filter(|(name, _)| programs.contains(name))
        .filter_map(|(name, p)| Some((name, p.info().ok()?)))
        .collect();
    costs.sort_by_key(|(name, _)| *name);
    for (name, info) in costs {
        log::debug!(
            "program {name}: {} instructions verified, {} bytes translated, {} bytes JIT-compiled",
            info.verified_instruction_count().unwrap_or(0),
            info.size_translated().unwrap_or(0),
            info.size_jitted(),
        );
    }
}

/// The runs of a program the kernel skipped because it was already running on that CPU: the
/// `recursion_misses` line of its fdinfo (aya's program info does not carry it; 5.12+).
fn recursion_misses(fd: std::os::fd::BorrowedFd<'_>) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    fdinfo_field(&text, "recursion_misses")
}

/// A numeric `key:\tvalue` line of an fdinfo file.
fn fdinfo_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn recursion_misses_are_read_from_a_programs_fdinfo() {
        let t = "pos:\t0\nflags:\t02000002\nprog_type:\t26\nprog_jited:\t1\n\
                 run_time_ns:\t81234\nrun_cnt:\t3095\nrecursion_misses:\t7\n\
                 verified_insns:\t412\n";
        assert_eq!(super::fdinfo_field(t, "recursion_misses"), Some(7));
        assert_eq!(super::fdinfo_field(t, "run_cnt"), Some(3095));
        assert_eq!(super::fdinfo_field("pos:\t0\n", "recursion_misses"), None);
    }
}
