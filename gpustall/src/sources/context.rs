//! The job's surroundings, sampled once a second from /proc and /sys: the memory cgroup's limit
//! and usage, host memory and swap, the kernel's vmstat counters, disk busy time, the
//! filesystems the job writes to, and each traced process's scheduler state (to tell a hung or
//! deadlocked job from a starved one).
//!
//! [`ContextReader`] reads the machine (live only); [`HostContext::apply`] folds a
//! [`ContextSample`] into the model, the same way live and on replay.

use std::path::PathBuf;

use crate::model::samples::ContextSample;
use crate::sources::host;

/// The vmstat counters the verdict reads (allocstall_* are summed by `vm_delta`).
fn wanted_vmstat(key: &str) -> bool {
    matches!(
        key,
        "pswpin"
            | "pswpout"
            | "pgmajfault"
            | "oom_kill"
            | "pgscan_direct"
            | "pgsteal_direct"
            | "pgscan_kswapd"
    ) || key.starts_with("allocstall")
}

/// Reads the machine for one [`ContextSample`].
pub struct ContextReader {
    cgroup_dir: Option<(PathBuf, String, u8)>,
    /// Each filesystem as the job names it, and where the agent reads it: through the
    /// target's /proc/PID/root, so a container's own /dev/shm (64 MiB by default) is the one
    /// measured, not the host's.
    fs_paths: Vec<(String, PathBuf)>,
}

impl ContextReader {
    /// `target` is the traced process: its memory cgroup and working directory stand for the job's.
    pub fn new(target: u32) -> Self {
        let root = PathBuf::from(format!("/proc/{target}/root"));
        let mut fs_paths: Vec<(String, PathBuf)> =
            ["/tmp", "/dev/shm"].iter().map(|p| (p.to_string(), root.join(&p[1..]))).collect();
        if let Some(cwd) = host::cwd(target) {
            fs_paths.insert(0, (cwd.display().to_string(), format!("/proc/{target}/cwd").into()));
        }
        Self { cgroup_dir: host::memory_cgroup_dir(target), fs_paths }
    }

    pub fn read(&self, alive: &[u32], t_ns: u64) -> ContextSample {
        ContextSample {
            t_ns,
            cgroup: self.cgroup_dir.as_ref().and_then(|(d, p, v)| host::read_cgroup_mem(d, p, *v)),
            host: host::read_host_mem(),
            vmstat: host::read_vmstat().into_iter().filter(|(k, _)| wanted_vmstat(k)).collect(),
            disks: host::read_disks(),
            tasks: alive.iter().filter_map(|&p| host::task_state(p)).collect(),
            filesystems: self
                .fs_paths
                .iter()
                .filter_map(|(name, path)| {
                    // Once the target is gone, the agent's own view of the same path.
                    let u = host::fs_usage(path).or_else(|| host::fs_usage(name.as_ref()))?;
                    Some(crate::model::host::FsUsage { path: name.clone(), ..u })
                })
                .collect(),
        }
    }
}
