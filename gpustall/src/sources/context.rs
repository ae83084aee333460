//! The job's surroundings, sampled once a second from /proc and /sys: the memory cgroup's limit
//! and usage, host memory and swap, the kernel's vmstat counters, disk busy time, the
//! filesystems the job writes to, and each traced process's scheduler state (to tell a hung or
//! deadlocked job from a starved one).
//!
//! [`ContextReader`] reads the machine (live only); [`HostContext::apply`] folds a
//! [`ContextSample`] into the model, the same way live and on replay.

use std::{collections::BTreeMap, path::Path};

use crate::model::host::{CgroupMem, FsUsage, JobContext};
use crate::model::proctree::ProcessTree;
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

/// How often a job without a memory limit is looked at again for one it joined (when its
/// tree did not change meanwhile), and how many of its processes are read then.
const JOINED_LATE_EVERY_NS: u64 = 10_000_000_000;
const JOINED_LATE_READS: usize = 64;
/// At most this many of their cgroups are resolved per look (each reads the mount table).
const JOINED_LATE_GROUPS: usize = 4;

/// How often the job's block I/O limits are read again.
const IO_LIMITS_EVERY_NS: u64 = 10_000_000_000;

/// One filesystem the job writes to, as the job sees it. `held` is the directory opened
/// through a live process of the job (its /proc/PID/root or cwd): the mount it names stays
/// readable after the job's last process is gone and its mount namespace with it, so a job
/// that dies in its first second is still measured on its own 64 MiB /dev/shm, never on the
/// agent's (the host's) /dev/shm of the same name.
struct JobFs {
    /// The path as the job names it ("/dev/shm", its working directory).
    name: String,
    /// Where it is opened from, relative to /proc/PID ("root/dev/shm", "cwd").
    via: &'static str,
    held: Option<std::fs::File>,
    /// When `held` was opened (CLOCK_MONOTONIC ns, the kernel events' clock).
    opened_ns: u64,
    /// The fullest reading since the last sample: a moment read (a worker's fatal signal)
    /// may find it fuller than the next beat does.
    fullest: Option<FsUsage>,
}

impl JobFs {
    /// Opens it again through `pid`, where `pid` can be read: the job may have mounted its own
    /// filesystem there since (`unshare -m`, a container's runtime).
    fn reopen(&mut self, pid: u32) -> bool {
        match host::open_dir(Path::new(&format!("/proc/{pid}/{}", self.via))) {
            Some(f) => {
                self.held = Some(f);
                self.opened_ns = crate::sources::clock::monotonic_ns();
                true
            }
            None => false,
        }
    }

    /// Reads the held directory's filesystem into `fullest`. A directory held from before the
    /// job last forked or exec'd (`changed_ns`) is let go unread when no process of the job
    /// could open it again: the job may have made its own mount namespace since (`unshare -m`
    /// then exec), and what is held would be the host's.
    fn take_reading(&mut self, reopened: bool, changed_ns: u64) {
        if !reopened && self.opened_ns < changed_ns {
            self.held = None;
        }
        let Some(u) = self.held.as_ref().and_then(host::fs_usage_of) else { return };
        let u = FsUsage { path: self.name.clone(), ..u };
        self.fullest = Some(match self.fullest.take() {
            Some(f) if f.dev == u.dev && f.used_pct >= u.used_pct => f,
            _ => u,
        });
    }
}

/// One job's own surroundings: its memory cgroup and the filesystems it writes to.
struct JobReader {
    target: u32,
    cgroup: Option<MemCgroupDir>,
    /// /proc/TARGET/cgroup when `cgroup` was found: a job that moves itself into another
    /// cgroup (`echo $$ > .../cgroup.procs; exec python ...`) is followed there.
    membership: Option<String>,
    /// The job's last fork or exec seen (see [`JobFs::take_reading`]).
    changed_ns: u64,
    /// The process whose memory cgroup stands for the job's: the target, unless the job
    /// joined a cgroup after it started ([`JobReader::look_for_a_joined_cgroup`]).
    stand_in: u32,
    /// When the job's processes' cgroups were last looked at.
    looked_ns: u64,
    /// When its block I/O limits were last read (`None`: never).
    io_read_ns: Option<u64>,
    fs: Vec<JobFs>,
}

impl JobReader {
    /// `target`'s memory cgroup and working directory stand for the job's.
    fn new(target: u32) -> Self {
        let fs = |name: &str, via| JobFs {
            name: name.into(),
            via,
            held: None,
            opened_ns: 0,
            fullest: None,
        };
        let mut me = Self {
            target,
            cgroup: None,
            membership: None,
            changed_ns: 0,
            stand_in: target,
            looked_ns: 0,
            io_read_ns: None,
            fs: vec![fs("/tmp", "root/tmp"), fs("/dev/shm", "root/dev/shm")],
        };
        if let Some(cwd) = host::cwd(target) {
            me.fs.insert(0, fs(&cwd.display().to_string(), "cwd"));
        }
        me.catch_up(&[]);
        me
    }

    /// Reads the job's surroundings now, while one of its processes can still be read: the
    /// target, else the first of `others` that answers (a job's processes share its mount
    /// namespace and, mostly, its working directory).
    fn catch_up(&mut self, others: &[u32]) {
        self.follow_cgroup();
        for fs in &mut self.fs {
            let reopened =
                std::iter::once(self.target).chain(others.iter().copied()).any(|p| fs.reopen(p));
            fs.take_reading(reopened, self.changed_ns);
        }
    }

    /// Finds the job's memory cgroup again when its stand-in's membership changed. An exiting
    /// or exited stand-in shows the root cgroup: its last one stands. Checked after the read,
    /// so an exit between the two cannot pass for a move.
    fn follow_cgroup(&mut self) {
        let pid = self.stand_in;
        let now = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok();
        let alive = !crate::sources::procfs::is_ending(pid);
        if alive && now.is_some() && now != self.membership {
            self.cgroup = cgroup::memory_cgroup_dir(pid);
            self.membership = now;
        }
    }

    /// Where the target's memory cgroup sets no limit, the job may have joined one after it
    /// started: a wrapper that moves its child (`cgexec` from a script, a launcher), or the
    /// trainer moved by hand. The cgroup most of the job's processes are in, when it sets a
    /// limit, is the job's from then on. Looked for when the tree changed (fork, exec) and at
    /// most every [`JOINED_LATE_EVERY_NS`] otherwise; never once a limit is found.
    /// `limited`: the current cgroup's reading sets a limit. Returns whether it moved the job.
    fn look_for_a_joined_cgroup(&mut self, others: &[u32], now_ns: u64, limited: bool) -> bool {
        let due = self.changed_ns > self.looked_ns
            || now_ns.saturating_sub(self.looked_ns) >= JOINED_LATE_EVERY_NS;
        if limited || others.is_empty() || !due {
            return false;
        }
        self.looked_ns = now_ns;
        let mut groups: BTreeMap<String, (usize, u32)> = BTreeMap::new();
        for &p in others.iter().take(JOINED_LATE_READS) {
            if let Ok(text) = std::fs::read_to_string(format!("/proc/{p}/cgroup")) {
                groups.entry(text).or_insert((0, p)).0 += 1;
            }
        }
        // Most of the job's processes first; the first that sets a limit is the job's.
        let mut groups: Vec<(String, (usize, u32))> = groups.into_iter().collect();
        groups.sort_by_key(|(_, (n, pid))| (std::cmp::Reverse(*n), *pid));
        let elsewhere =
            groups.into_iter().filter(|(text, _)| Some(text) != self.membership.as_ref());
        for (text, (_, pid)) in elsewhere.take(JOINED_LATE_GROUPS) {
            let Some(dir) = cgroup::memory_cgroup_dir(pid) else { continue };
            if cgroup::read_cgroup_mem(&dir).is_some_and(|m| m.limit_bytes.is_some()) {
                log::debug!(
                    "the job's memory cgroup is {} (pid {pid}'s, joined after the start)",
                    dir.path
                );
                self.cgroup = Some(dir);
                self.membership = Some(text);
                self.stand_in = pid;
                return true;
            }
        }
        false
    }

    /// The kernel's OOM report named `path` as a traced victim's memory cgroup. Where the
    /// job's cgroup is not known to be limited (the job moved into that one and was killed
    /// before a look at its processes saw it: `echo $$ > cgroup.procs; exec python` dies in a
    /// tenth of a second), that one is the job's, read from now on while it exists. The
    /// stand-in's membership now is kept, so that only a move of its own replaces it.
    fn oom_reported(&mut self, path: &str) {
        if self.cgroup.as_ref().is_some_and(|c| c.path == path) {
            return;
        }
        let limited = self
            .cgroup
            .as_ref()
            .and_then(cgroup::read_cgroup_mem)
            .is_some_and(|m| m.limit_bytes.is_some());
        if limited {
            return;
        }
        let Some(dir) = cgroup::memory_cgroup_dir_named(path) else { return };
        log::debug!("the job's memory cgroup is {} (named by the kernel's OOM report)", dir.path);
        self.cgroup = Some(dir);
        self.membership = std::fs::read_to_string(format!("/proc/{}/cgroup", self.stand_in)).ok();
    }

    /// The block I/O limits on the job's cgroup, read at the first sample and then every
    /// [`IO_LIMITS_EVERY_NS`] (they are set by whoever starts the job, and rarely change).
    /// Read through a live process of the job, the stand-in first: an exiting one shows the
    /// root cgroup, which has no limits, and a gone one none at all. `None` (the last
    /// reading stands) where no process of the job answered.
    fn io_limits(
        &mut self,
        alive: &[u32],
        now_ns: u64,
    ) -> Option<Vec<crate::model::host::IoLimit>> {
        if self.io_read_ns.is_some_and(|t| now_ns.saturating_sub(t) < IO_LIMITS_EVERY_NS) {
            return None;
        }
        // Checked after the read, so an exit between the two cannot pass for a move.
        let limits =
            std::iter::once(self.stand_in).chain(alive.iter().copied()).find_map(|pid| {
                let limits = cgroup::io::read_io_limits(pid)?;
                (!crate::sources::procfs::is_ending(pid)).then_some(limits)
            })?;
        self.io_read_ns = Some(now_ns);
        Some(limits)
    }

    /// The job's memory cgroup now.
    fn cgroup(&mut self, others: &[u32]) -> Option<CgroupMem> {
        self.follow_cgroup();
        // Read once a beat; again only when the job turned out to be in another cgroup.
        let now = self.cgroup.as_ref().and_then(cgroup::read_cgroup_mem);
        let limited = now.as_ref().is_some_and(|m| m.limit_bytes.is_some());
        let now_ns = crate::sources::clock::monotonic_ns();
        if self.look_for_a_joined_cgroup(others, now_ns, limited) {
            return self.cgroup.as_ref().and_then(cgroup::read_cgroup_mem);
        }
        now
    }

    /// Each filesystem at its fullest since the last sample. One never opened through the
    /// job (it ended before it could be read) is left out, not read on the host's path of
    /// the same name: that is another mount namespace's wherever the job had its own.
    fn filesystems(&mut self, others: &[u32]) -> Vec<FsUsage> {
        self.catch_up(others);
        self.fs.iter_mut().filter_map(|fs| fs.fullest.take()).collect()
    }
}

/// Reads the machine for one [`ContextSample`]: the host, and the job's own context (`trace`:
/// one target) or each watched job's (`watch`: [`ContextReader::add_job`]).
pub struct ContextReader {
    target: Option<JobReader>,
    jobs: BTreeMap<u32, JobReader>,
    disks: DiskTopology,
    /// The traced job's CPU (`trace` only).
    cpu: Option<crate::sources::cpu_sample::CpuReader>,
}

impl ContextReader {
    /// `target` is the traced process: its memory cgroup and working directory stand for the job's.
    pub fn new(target: u32) -> Self {
        Self {
            target: Some(JobReader::new(target)),
            cpu: Some(crate::sources::cpu_sample::CpuReader::new(target)),
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

    /// Reads the traced job's surroundings now, between samples (a fatal signal, an exit, an
    /// exec was drained): its processes may be gone by the next beat. What is read is in the
    /// next sample.
    pub fn catch_up(&mut self, alive: &[u32]) {
        if let Some(j) = self.target.as_mut() {
            j.catch_up(alive);
        }
        for j in self.jobs.values_mut() {
            j.catch_up(&[]);
        }
    }

    /// The kernel's OOM report named `path` as the memory cgroup of `victim`, a process of the
    /// traced job (`trace`) or of a watched one (`watch`: the job whose tree holds it): see
    /// [`JobReader::oom_reported`].
    pub fn oom_reported(&mut self, path: &str, victim: u32, tree: &ProcessTree) {
        if let Some(j) = self.target.as_mut() {
            j.oom_reported(path);
            return;
        }
        // `watch`: the watched job whose tree the victim is in.
        let root = tree.ancestors(victim).map(|n| n.pid).find(|p| self.jobs.contains_key(p));
        if let Some(j) = root.and_then(|r| self.jobs.get_mut(&r)) {
            j.oom_reported(path);
        }
    }

    /// The traced job forked or exec'd at `t_ns` (a kernel event's time).
    pub fn job_changed(&mut self, t_ns: u64) {
        if let Some(j) = self.target.as_mut() {
            j.changed_ns = j.changed_ns.max(t_ns);
        }
    }

    pub fn read(&mut self, alive: &[u32], t_ns: u64) -> ContextSample {
        let tasks: Vec<_> = alive.iter().filter_map(|&p| host::task_state(p)).collect();
        let job_ticks = tasks.iter().map(|t| t.cpu_ticks).sum();
        ContextSample {
            t_ns,
            cgroup: self.target.as_mut().and_then(|j| j.cgroup(alive)),
            host: host::read_host_mem(),
            vmstat: host::read_vmstat_keys(wanted_vmstat),
            disks: self.disks.read_disks(),
            tasks,
            filesystems: self.target.as_mut().map(|j| j.filesystems(alive)).unwrap_or_default(),
            host_pressure: cgroup::read_host_psi(),
            jobs: self
                .jobs
                .iter_mut()
                .map(|(&root, j)| JobContext {
                    root,
                    cgroup: j.cgroup(&[]),
                    filesystems: j.filesystems(&[]),
                })
                .collect(),
            cpu: self.cpu.as_mut().map(|c| c.read(alive, job_ticks)),
            io_limits: self.target.as_mut().and_then(|j| j.io_limits(alive, t_ns)),
        }
    }
}
