//! The job's surroundings, sampled once a second from /proc and /sys: the memory cgroup's limit
//! and usage, host memory and swap, the kernel's vmstat counters, disk busy time, the
//! filesystems the job writes to, and each traced process's scheduler state (to tell a hung or
//! deadlocked job from a starved one).
//!
//! [`ContextReader`] reads the machine (live only); [`HostContext::apply`] folds a
//! [`ContextSample`] into the model, the same way live and on replay.

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
};

use crate::{
    hostctx::{self, CgroupMem, DiskStat, FsUsage, HostMem, TaskState},
    observe::ContextSample,
};

/// The vmstat counters the verdict reads (allocstall_* are summed by `vm_delta`).
fn wanted_vmstat(key: &str) -> bool {
    matches!(key, "pswpin" | "pswpout" | "pgmajfault" | "oom_kill" | "pgscan_direct" | "pgsteal_direct" | "pgscan_kswapd")
        || key.starts_with("allocstall")
}

/// Reads the machine for one [`ContextSample`].
pub struct ContextReader {
    cgroup_dir: Option<(PathBuf, String, u8)>,
    fs_paths: Vec<PathBuf>,
}

impl ContextReader {
    /// `target` is the traced process: its memory cgroup and working directory stand for the job's.
    pub fn new(target: u32) -> Self {
        let mut fs_paths: Vec<PathBuf> = vec!["/tmp".into(), "/dev/shm".into()];
        if let Some(cwd) = hostctx::cwd(target) {
            fs_paths.insert(0, cwd);
        }
        Self { cgroup_dir: hostctx::memory_cgroup_dir(target), fs_paths }
    }

    pub fn read(&self, alive: &[u32], t_ns: u64) -> ContextSample {
        ContextSample {
            t_ns,
            cgroup: self.cgroup_dir.as_ref().and_then(|(d, p, v)| hostctx::read_cgroup_mem(d, p, *v)),
            host: hostctx::read_host_mem(),
            vmstat: hostctx::read_vmstat().into_iter().filter(|(k, _)| wanted_vmstat(k)).collect(),
            disks: hostctx::read_disks(),
            tasks: alive.iter().filter_map(|&p| hostctx::task_state(p)).collect(),
            filesystems: self.fs_paths.iter().filter_map(|p| hostctx::fs_usage(p)).collect(),
        }
    }
}

/// A process that has not made progress: stopped (T), in uninterruptible sleep (D), or using
/// no CPU at all, since the times below.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskWatch {
    pub last: TaskState,
    /// When the current state (T/D) began, as far as the samples tell.
    pub stuck_since_ns: Option<u64>,
    /// When CPU time and I/O last stood still (None while they move).
    pub idle_since_ns: Option<u64>,
}

#[derive(Default)]
pub struct HostContext {
    pub samples: u64,
    pub cgroup_last: Option<CgroupMem>,
    pub cgroup_peak_usage: u64,
    pub host_last: Option<HostMem>,
    pub host_min_available_kb: Option<u64>,
    pub vm_before: BTreeMap<String, u64>,
    pub vm_last: BTreeMap<String, u64>,
    pub disks_before: Vec<DiskStat>,
    pub disks_last: Vec<DiskStat>,
    /// Highest busy % per disk between two consecutive samples.
    pub disk_peak_busy: BTreeMap<String, f64>,
    pub start_ns: u64,
    pub last_ns: u64,
    /// Per path, the fullest it was seen.
    pub filesystems: Vec<FsUsage>,
    pub tasks: HashMap<u32, TaskWatch>,
}

impl HostContext {
    pub fn apply(&mut self, s: &ContextSample) {
        if self.samples == 0 {
            self.vm_before = s.vmstat.clone();
            self.disks_before = s.disks.clone();
            self.disks_last = s.disks.clone();
            self.start_ns = s.t_ns;
            self.last_ns = s.t_ns;
        }
        self.samples += 1;
        if let Some(m) = &s.cgroup {
            self.cgroup_peak_usage = self.cgroup_peak_usage.max(m.peak_bytes.unwrap_or(0)).max(m.usage_bytes);
            self.cgroup_last = Some(m.clone());
        }
        if let Some(h) = &s.host {
            self.host_min_available_kb = Some(self.host_min_available_kb.map_or(h.mem_available_kb, |m| m.min(h.mem_available_kb)));
            self.host_last = Some(h.clone());
        }
        if !s.vmstat.is_empty() {
            self.vm_last = s.vmstat.clone();
        }
        let dt_ms = s.t_ns.saturating_sub(self.last_ns) / 1_000_000;
        if dt_ms > 0 {
            for b in hostctx::disk_busy(&self.disks_last, &s.disks, dt_ms) {
                let e = self.disk_peak_busy.entry(b.name).or_insert(0.0);
                *e = e.max(b.busy_pct);
            }
        }
        self.disks_last = s.disks.clone();
        self.last_ns = s.t_ns;
        for t in &s.tasks {
            self.watch(t.clone(), s.t_ns);
        }
        for fs in &s.filesystems {
            match self.filesystems.iter_mut().find(|f| f.path == fs.path) {
                Some(f) if fs.used_pct > f.used_pct => *f = fs.clone(),
                Some(_) => {}
                None => self.filesystems.push(fs.clone()),
            }
        }
    }

    fn watch(&mut self, s: TaskState, now_ns: u64) {
        let Some(w) = self.tasks.get_mut(&s.pid) else {
            let stuck = matches!(s.state, 'T' | 't' | 'D').then_some(now_ns);
            self.tasks.insert(s.pid, TaskWatch { last: s, stuck_since_ns: stuck, idle_since_ns: None });
            return;
        };
        let stuck = matches!(s.state, 'T' | 't' | 'D');
        w.stuck_since_ns = match (stuck, w.stuck_since_ns) {
            (true, Some(since)) if w.last.state == s.state => Some(since),
            (true, _) => Some(now_ns),
            (false, _) => None,
        };
        let moved = s.cpu_ticks != w.last.cpu_ticks || s.read_bytes != w.last.read_bytes || s.write_bytes != w.last.write_bytes;
        w.idle_since_ns = match (moved, w.idle_since_ns) {
            (true, _) => None,
            (false, Some(since)) => Some(since),
            (false, None) => Some(now_ns),
        };
        w.last = s;
    }

    /// Busy % of each disk over the whole trace.
    pub fn disk_busy_overall(&self) -> Vec<hostctx::DiskBusy> {
        let ms = self.last_ns.saturating_sub(self.start_ns) / 1_000_000;
        if ms == 0 {
            return Vec::new();
        }
        hostctx::disk_busy(&self.disks_before, &self.disks_last, ms)
    }

    pub fn vm_delta(&self) -> hostctx::VmDelta {
        hostctx::vm_delta(&self.vm_before, &self.vm_last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(state: char, cpu: u64) -> TaskState {
        TaskState { pid: 5, state, wchan: String::new(), cpu_ticks: cpu, majflt: 0, read_bytes: Some(0), write_bytes: Some(0) }
    }

    fn at(t_s: u64, tasks: Vec<TaskState>) -> ContextSample {
        ContextSample { t_ns: t_s * 1_000_000_000, tasks, ..Default::default() }
    }

    #[test]
    fn stopped_and_idle_times_start_when_the_state_begins() {
        let mut c = HostContext::default();
        c.apply(&at(0, vec![task('R', 10)]));
        c.apply(&at(1, vec![task('T', 11)]));
        c.apply(&at(2, vec![task('T', 11)]));
        c.apply(&at(3, vec![task('T', 11)]));
        let w = &c.tasks[&5];
        assert_eq!(w.stuck_since_ns, Some(1_000_000_000));
        assert_eq!(w.idle_since_ns, Some(2_000_000_000));
        c.apply(&at(4, vec![task('S', 12)]));
        assert_eq!((c.tasks[&5].stuck_since_ns, c.tasks[&5].idle_since_ns), (None, None));
    }

    #[test]
    fn fullest_filesystem_reading_is_kept() {
        let fs = |pct: f64| FsUsage { path: "/tmp".into(), total_bytes: 100, avail_bytes: 1, used_pct: pct };
        let mut c = HostContext::default();
        c.apply(&ContextSample { filesystems: vec![fs(50.0)], ..Default::default() });
        c.apply(&ContextSample { filesystems: vec![fs(99.0)], ..Default::default() });
        c.apply(&ContextSample { filesystems: vec![fs(60.0)], ..Default::default() });
        assert_eq!(c.filesystems.len(), 1);
        assert_eq!(c.filesystems[0].used_pct, 99.0);
    }
}
