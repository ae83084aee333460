//! The job's surroundings, sampled once a second from /proc and /sys: the memory cgroup's limit
//! and usage, host memory and swap, the kernel's vmstat counters, disk busy time, the
//! filesystems the job writes to, and each traced process's scheduler state (to tell a hung or
//! deadlocked job from a starved one).
//!
//! [`ContextReader`] reads the machine (live only); [`HostContext::apply`] folds a
//! [`ContextSample`] into the model, the same way live and on replay.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use crate::model::host::{CgroupMem, FsUsage, JobContext};
use crate::model::samples::ContextSample;
use crate::sources::cgroup::{self, MemCgroupDir};
use crate::sources::host::{self, DiskTopology};

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

/// One job's own surroundings: its memory cgroup and the filesystems it writes to.
struct JobReader {
    target: u32,
    cgroup: Option<MemCgroupDir>,
    /// /proc/TARGET/cgroup when `cgroup` was found: a job that moves itself into another
    /// cgroup (`echo $$ > .../cgroup.procs; exec python ...`) is followed there.
    membership: Option<String>,
    /// Each filesystem as the job names it, and where the agent reads it: through the
    /// target's /proc/PID/root, so a container's own /dev/shm (64 MiB by default) is the one
    /// measured, not the host's.
    fs_paths: Vec<(String, PathBuf)>,
}

impl JobReader {
    /// `target`'s memory cgroup and working directory stand for the job's.
    fn new(target: u32) -> Self {
        let root = PathBuf::from(format!("/proc/{target}/root"));
        let mut fs_paths: Vec<(String, PathBuf)> =
            ["/tmp", "/dev/shm"].iter().map(|p| (p.to_string(), root.join(&p[1..]))).collect();
        if let Some(cwd) = host::cwd(target) {
            fs_paths.insert(0, (cwd.display().to_string(), format!("/proc/{target}/cwd").into()));
        }
        Self { target, cgroup: None, membership: None, fs_paths }
    }

    /// The job's memory cgroup now: found again whenever the target's membership changed.
    fn cgroup(&mut self) -> Option<CgroupMem> {
        // An exited target (a zombie) shows the root cgroup: its last one stands. Checked after
        // the read, so an exit between the two cannot pass for a move.
        let now = std::fs::read_to_string(format!("/proc/{}/cgroup", self.target)).ok();
        let alive = crate::sources::procfs::exists(self.target)
            && !crate::sources::procfs::is_zombie(self.target);
        if alive && now.is_some() && now != self.membership {
            self.cgroup = cgroup::memory_cgroup_dir(self.target);
            self.membership = now;
        }
        self.cgroup.as_ref().and_then(cgroup::read_cgroup_mem)
    }

    fn filesystems(&self) -> Vec<FsUsage> {
        self.fs_paths
            .iter()
            .filter_map(|(name, path)| {
                // Once the target is gone, the agent's own view of the same path.
                let u = host::fs_usage(path).or_else(|| host::fs_usage(name.as_ref()))?;
                Some(FsUsage { path: name.clone(), ..u })
            })
            .collect()
    }
}

/// Reads the machine for one [`ContextSample`]: the host, and the job's own context (`trace`:
/// one target) or each watched job's (`watch`: [`ContextReader::add_job`]).
pub struct ContextReader {
    target: Option<JobReader>,
    jobs: BTreeMap<u32, JobReader>,
    disks: DiskTopology,
    /// The traced job's CPU (`trace` only).
    cpu: Option<crate::sources::cpu::CpuReader>,
}

impl ContextReader {
    /// `target` is the traced process: its memory cgroup and working directory stand for the job's.
    pub fn new(target: u32) -> Self {
        Self {
            target: Some(JobReader::new(target)),
            cpu: Some(crate::sources::cpu::CpuReader::new(target)),
            ..Self::host_only()
        }
    }

    /// The host only, until jobs are added.
    pub fn host_only() -> Self {
        Self {
            target: None,
            jobs: BTreeMap::new(),
            disks: DiskTopology::new(Path::new("/sys/block")),
            cpu: None,
        }
    }

    /// A watched job, by its root process: read from now on, in `ContextSample::jobs`.
    pub fn add_job(&mut self, root: u32) {
        self.jobs.insert(root, JobReader::new(root));
    }

    /// An ended job: no longer read.
    pub fn remove_job(&mut self, root: u32) {
        self.jobs.remove(&root);
    }

    pub fn read(&mut self, alive: &[u32], t_ns: u64) -> ContextSample {
        ContextSample {
            t_ns,
            cgroup: self.target.as_mut().and_then(JobReader::cgroup),
            host: host::read_host_mem(),
            vmstat: host::read_vmstat_keys(wanted_vmstat),
            disks: self.disks.read_disks(),
            tasks: alive.iter().filter_map(|&p| host::task_state(p)).collect(),
            filesystems: self.target.as_ref().map(JobReader::filesystems).unwrap_or_default(),
            host_pressure: cgroup::read_host_psi(),
            jobs: self
                .jobs
                .iter_mut()
                .map(|(&root, j)| JobContext {
                    root,
                    cgroup: j.cgroup(),
                    filesystems: j.filesystems(),
                })
                .collect(),
            cpu: self.cpu.as_mut().map(|c| c.read(alive)),
        }
    }
}
