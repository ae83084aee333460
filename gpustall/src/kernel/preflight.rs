//! Checks before loading anything, each failing with one line that says what to do, and the
//! agent's own protection: the tracer must survive the OOM storm it is tracing.

use anyhow::bail;

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

pub fn check_pid(pid: u32) -> anyhow::Result<()> {
    if pid == 0 || !crate::sources::procfs::exists(pid) {
        bail!("no such process: {pid} (check the pid with `ps -p {pid}`; the trainer may have exited)");
    }
    if crate::sources::procfs::is_zombie(pid) {
        bail!("process {pid} has exited (a zombie its parent has not reaped): there is nothing left to trace");
    }
    if pid == std::process::id() {
        bail!("pid {pid} is gpustall itself: give the trainer's pid");
    }
    Ok(())
}

/// Effective capabilities of this process.
fn effective_caps() -> u64 {
    procfs::process::Process::myself().and_then(|p| p.status()).map(|s| s.capeff).unwrap_or(0)
}

pub fn has_cap(caps: u64, cap: u32) -> bool {
    caps & (1u64 << cap) != 0
}

/// Loading tracing programs needs CAP_BPF + CAP_PERFMON (or CAP_SYS_ADMIN on older kernels).
pub fn check_privileges() -> anyhow::Result<()> {
    let caps = effective_caps();
    let bpf = has_cap(caps, CAP_BPF) || has_cap(caps, CAP_SYS_ADMIN);
    let perfmon = has_cap(caps, CAP_PERFMON) || has_cap(caps, CAP_SYS_ADMIN);
    if !(bpf && perfmon) {
        bail!(
            "gpustall needs root to load its eBPF programs: run it with sudo, or grant CAP_BPF, CAP_PERFMON, CAP_DAC_READ_SEARCH (tracefs is 0700) and CAP_SYS_RESOURCE (e.g. `setcap cap_bpf,cap_perfmon,cap_dac_read_search,cap_sys_resource+ep gpustall`)"
        );
    }
    Ok(())
}

/// The OOM killer must pick the job, not the tool explaining it.
pub fn protect_self_from_oom_killer() {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", "-1000") {
        log::warn!("cannot set oom_score_adj to -1000 ({e}): the OOM killer could pick gpustall (it needs CAP_SYS_RESOURCE)");
    }
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; newer ones use memcg accounting, so a
/// failure here is expected where the hard limit is low and does not matter.
pub fn raise_memlock() {
    let r = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: valid pointer to an rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &r) } != 0 {
        log::debug!("raising RLIMIT_MEMLOCK failed: {}", std::io::Error::last_os_error());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_bits() {
        let caps = (1u64 << CAP_BPF) | (1u64 << CAP_PERFMON);
        assert!(has_cap(caps, CAP_BPF) && has_cap(caps, CAP_PERFMON));
        assert!(!has_cap(caps, CAP_SYS_ADMIN));
    }

    #[test]
    fn pid_zero_and_missing_pids_are_rejected() {
        assert!(check_pid(0).is_err());
        let msg = check_pid(u32::MAX - 1).expect_err("no such pid").to_string();
        assert!(msg.starts_with("no such process"), "{msg}");
        let me = check_pid(std::process::id()).expect_err("itself").to_string();
        assert!(me.contains("is gpustall itself"), "{me}");
        assert!(check_pid(1).is_ok());
    }
}
