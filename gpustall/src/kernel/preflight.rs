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
    if is_kernel_thread(pid) {
        bail!("pid {pid} is a kernel thread: no job runs under it; give the trainer's pid");
    }
    if pid == 1 {
        say!("gpustall: note: pid 1 is the init process: its tree is every process of the machine (or of the container)");
    }
    Ok(())
}

/// PF_KTHREAD in /proc/PID/stat's flags: kthreadd (pid 2) and its children.
fn is_kernel_thread(pid: u32) -> bool {
    const PF_KTHREAD: u32 = 0x0020_0000;
    let stat = procfs::process::Process::new(pid as i32).and_then(|p| p.stat());
    stat.is_ok_and(|s| s.flags & PF_KTHREAD != 0)
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
/// Open files gpustall needs at most while it loads and runs: its programs, maps, rings, perf
/// links (about 70 on a full attach), /proc and cgroup files, the recording, the metrics
/// endpoint's connections. Measured: about 80 at once on a trace; this leaves room.
const OPEN_FILES_NEEDED: u64 = 512;

/// The soft RLIMIT_NOFILE gpustall was started with, for the job it launches (`-- CMD`) to
/// start with it again: 0 until [`raise_open_files`] ran.
static OPEN_FILES_SOFT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Raises the soft open-files limit to the hard one (as bpftrace does): loading takes a file
/// per program, map and link. Under a hard limit too low an error says so before anything
/// else fails with EMFILE under another name ("tracepoint not available", "no such process").
pub fn raise_open_files() -> anyhow::Result<()> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: valid pointer to an rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return Ok(());
    }
    OPEN_FILES_SOFT.store(r.rlim_cur, std::sync::atomic::Ordering::Relaxed);
    let want = r.rlim_max.min(1 << 20);
    if r.rlim_cur < want {
        let raised = libc::rlimit { rlim_cur: want, rlim_max: r.rlim_max };
        // SAFETY: valid pointer to an rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            r.rlim_cur = want;
        }
    }
    anyhow::ensure!(
        r.rlim_cur >= OPEN_FILES_NEEDED,
        "up to {OPEN_FILES_NEEDED} open files are needed (programs, maps, links, /proc) and RLIMIT_NOFILE allows {} (hard limit {}): raise it (ulimit -n {OPEN_FILES_NEEDED}, or LimitNOFILE= in a unit)",
        r.rlim_cur,
        r.rlim_max
    );
    Ok(())
}

/// In a launched job's child before its exec: the soft open-files limit gpustall was started
/// with (the job must not inherit gpustall's raised one). Async-signal-safe.
pub fn restore_open_files() {
    let soft = OPEN_FILES_SOFT.load(std::sync::atomic::Ordering::Relaxed);
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid rlimit: plain system calls.
    unsafe {
        if soft > 0 && libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && soft < r.rlim_cur {
            r.rlim_cur = soft;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

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
