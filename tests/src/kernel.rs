//! The kernel's own counters, the ground truth tests compare gpustall with: /proc/vmstat, the
//! kernel log's OOM-kill lines, and swap.

use std::{io::Read, os::fd::AsRawFd, path::PathBuf};

pub fn vmstat(key: &str) -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .expect("/proc/vmstat")
        .lines()
        .find_map(|l| {
            l.strip_prefix(key)
                .and_then(|r| r.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or_else(|| panic!("no {key} in /proc/vmstat"))
}

/// The kernel log from the moment of `open_at_end`.
pub struct Kmsg(std::fs::File);

impl Kmsg {
    pub fn open_at_end() -> Self {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags_nonblock()
            .open("/dev/kmsg")
            .expect("opening /dev/kmsg (root needed)");
        // SAFETY: valid fd; SEEK_END on /dev/kmsg skips to the newest record.
        unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_END) };
        Self(f)
    }

    /// Records since opening (each read returns one record).
    pub fn read_new(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 8192];
        loop {
            match self.0.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => out.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue, // overwritten records
                Err(_) => break,                                             // EAGAIN: no more
            }
        }
        out
    }
}

trait NonBlock {
    fn custom_flags_nonblock(&mut self) -> &mut Self;
}

impl NonBlock for std::fs::OpenOptions {
    fn custom_flags_nonblock(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NONBLOCK)
    }
}

/// One "Killed process N (comm) total-vm:..kB, anon-rss:..kB" line of the kernel log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomKillLine {
    pub pid: u32,
    pub anon_rss_kb: Option<u64>,
}

/// The OOM kills in `log` whose victim is one of `pids`: the kernel log is the whole machine's,
/// and a test must only ever count its own processes' kills.
pub fn oom_kills_among(log: &[String], pids: &[u32]) -> Vec<OomKillLine> {
    log.iter()
        .filter_map(|l| l.split("Killed process ").nth(1))
        .filter_map(|r| {
            let pid = r.split_whitespace().next()?.parse().ok()?;
            let anon_rss_kb = r
                .split("anon-rss:")
                .nth(1)
                .and_then(|a| a.split("kB").next())
                .and_then(|v| v.parse().ok());
            Some(OomKillLine { pid, anon_rss_kb })
        })
        .filter(|k| pids.contains(&k.pid))
        .collect()
}

/// A swap file made for a test when the machine has no swap; swapped off and removed on drop.
pub struct SwapFile(Option<PathBuf>);

pub fn has_swap() -> bool {
    std::fs::read_to_string("/proc/swaps").map(|s| s.lines().count() > 1).unwrap_or(false)
}

/// Where test swap files go, and the start of their names (then `PID-N`).
const SWAP_PREFIX: &str = "/var/tmp/gpustall-test-swap-";

/// The pid that made a test swap file, from its name.
fn swap_owner(path: &str) -> Option<u32> {
    path.strip_prefix(SWAP_PREFIX)?.split('-').next()?.parse().ok()
}

/// Swaps off and removes test swap files whose test process is gone: a test killed outright
/// (SIGKILL, a timeout) never ran its guard, and its swap would be "the machine's swap" to
/// every later test.
pub fn sweep_stale_swap_files() {
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    for path in swaps.lines().skip(1).filter_map(|l| l.split_whitespace().next()) {
        let Some(pid) = swap_owner(path) else { continue };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        eprintln!("removing {path}, a test swap file whose test (pid {pid}) is gone");
        let _ = std::process::Command::new("swapoff").arg(path).status();
        let _ = std::fs::remove_file(path);
    }
}

impl SwapFile {
    pub fn ensure(mib: u64) -> Self {
        sweep_stale_swap_files();
        if has_swap() {
            return Self(None);
        }
        let path =
            PathBuf::from(format!("{SWAP_PREFIX}{}-{}", std::process::id(), crate::unique()));
        let run = |cmd: &str, args: &[&str]| {
            let ok = std::process::Command::new(cmd)
                .args(args)
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            assert!(ok, "{cmd} {args:?} failed");
        };
        let guard = Self(Some(path.clone()));
        let p = path.to_str().expect("utf-8 path");
        run("fallocate", &["-l", &format!("{mib}M"), p]);
        run("chmod", &["600", p]);
        run("mkswap", &["-q", p]);
        run("swapon", &[p]);
        guard
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            let _ = std::process::Command::new("swapoff").arg(p).status();
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The running kernel is at least `major.minor` (from /proc/sys/kernel/osrelease).
pub fn at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit()).map(|p| p.parse::<u32>());
    match (parts.next(), parts.next()) {
        (Some(Ok(a)), Some(Ok(b))) => (a, b) >= (major, minor),
        _ => true,
    }
}

/// What a test says where [`typed_sched_switch`] does not hold.
pub const NO_SYSCALL_CLASS: &str =
    "no typed sched_switch (before 5.18, or no BTF): the syscall a wait blocked in is unknown";

/// gpustall runs its typed sched_switch program here, the one that reads the syscall a trainer's
/// wait blocked in: BTF, 5.18+ (`prev_state` an argument), x86_64.
pub fn typed_sched_switch() -> bool {
    cfg!(target_arch = "x86_64")
        && at_least(5, 18)
        && std::path::Path::new("/sys/kernel/btf/vmlinux").exists()
}

/// Running inside `cargo xtask vm-test`'s guest (software emulation: everything is about ten
/// times slower, so thresholds that compare waiting with computing shift).
pub fn in_vm_test() -> bool {
    std::env::var_os("GPUSTALL_VM_DEGRADED").is_some()
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_oom_kill_lines() {
        let log = vec![
            "3,1234,5678,-;Memory cgroup out of memory: Killed process 4242 (pt_data_worker) total-vm:1kB, anon-rss:2kB".to_string(),
            "6,1,2,-;something else".to_string(),
        ];
        let kills = super::oom_kills_among(&log, &[4242]);
        assert_eq!(kills, vec![super::OomKillLine { pid: 4242, anon_rss_kb: Some(2) }]);
        assert!(
            super::oom_kills_among(&log, &[1]).is_empty(),
            "another process's kill is not ours"
        );
    }

    #[test]
    fn a_test_swap_files_owner_is_read_from_its_name() {
        assert_eq!(super::swap_owner("/var/tmp/gpustall-test-swap-24099-0"), Some(24099));
        assert_eq!(super::swap_owner("/swapfile"), None);
        assert_eq!(super::swap_owner("/var/tmp/gpustall-test-swap-x-0"), None);
    }
}
