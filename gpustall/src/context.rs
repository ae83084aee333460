//! The job's surroundings, sampled once a second from /proc and /sys: the memory cgroup's limit
//! and usage, host memory and swap, the kernel's vmstat counters, disk busy time, the
//! filesystems the job writes to, and each traced process's scheduler state (to tell a hung or
//! deadlocked job from a starved one).

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
};

use crate::hostctx::{self, CgroupMem, DiskStat, FsUsage, HostMem, TaskState};

/// A process that has not made progress: stopped (T), in uninterruptible sleep (D), or using
/// no CPU at all, since `since_ns`.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskWatch {
    pub last: TaskState,
    pub cpu_ticks_at_start: u64,
    /// When the current state (T/D) began, as far as the samples tell.
    pub stuck_since_ns: Option<u64>,
    /// When CPU time and I/O last stood still (None while it moves).
    pub idle_since_ns: Option<u64>,
}

#[derive(Default)]
pub struct HostContext {
    pub cgroup_dir: Option<(PathBuf, String, u8)>,
    pub cgroup_first: Option<CgroupMem>,
    pub cgroup_last: Option<CgroupMem>,
    pub cgroup_peak_usage: u64,
    pub host_first: Option<HostMem>,
    pub host_min_available_kb: Option<u64>,
    pub host_last: Option<HostMem>,
    pub vm_before: BTreeMap<String, u64>,
    pub vm_last: BTreeMap<String, u64>,
    pub disks_before: Vec<DiskStat>,
    pub disks_prev: Vec<DiskStat>,
    pub disks_last: Vec<DiskStat>,
    /// Highest one-second busy % per disk name.
    pub disk_peak_busy: BTreeMap<String, f64>,
    pub start_ns: u64,
    pub prev_ns: u64,
    pub last_ns: u64,
    pub filesystems: Vec<FsUsage>,
    pub tasks: HashMap<u32, TaskWatch>,
}

impl HostContext {
    /// First look: baselines for every delta. `target` is the traced process (its cgroup and
    /// working directory stand for the job's).
    pub fn begin(target: u32, now_ns: u64) -> Self {
        let cgroup_dir = hostctx::memory_cgroup_dir(target);
        let mut c = Self {
            cgroup_first: cgroup_dir.as_ref().and_then(|(d, p, v)| hostctx::read_cgroup_mem(d, p, *v)),
            cgroup_dir,
            host_first: hostctx::read_host_mem(),
            vm_before: hostctx::read_vmstat(),
            disks_before: hostctx::read_disks(),
            start_ns: now_ns,
            prev_ns: now_ns,
            last_ns: now_ns,
            ..Default::default()
        };
        c.disks_prev = c.disks_before.clone();
        c.disks_last = c.disks_before.clone();
        c.vm_last = c.vm_before.clone();
        c.cgroup_last = c.cgroup_first.clone();
        c.cgroup_peak_usage = c.cgroup_first.as_ref().map_or(0, |m| m.peak_bytes.unwrap_or(m.usage_bytes));
        c.host_last = c.host_first.clone();
        c.host_min_available_kb = c.host_first.as_ref().map(|h| h.mem_available_kb);
        let mut paths: Vec<PathBuf> = vec!["/tmp".into(), "/dev/shm".into()];
        if let Some(cwd) = hostctx::cwd(target) {
            paths.insert(0, cwd);
        }
        c.filesystems = paths.iter().filter_map(|p| hostctx::fs_usage(p)).collect();
        c
    }

    /// One-second sample.
    pub fn sample(&mut self, alive: &[u32], now_ns: u64) {
        if let Some((d, p, v)) = &self.cgroup_dir {
            if let Some(m) = hostctx::read_cgroup_mem(d, p, *v) {
                self.cgroup_peak_usage = self.cgroup_peak_usage.max(m.peak_bytes.unwrap_or(0)).max(m.usage_bytes);
                self.cgroup_last = Some(m);
            }
        }
        if let Some(h) = hostctx::read_host_mem() {
            self.host_min_available_kb = Some(self.host_min_available_kb.map_or(h.mem_available_kb, |m| m.min(h.mem_available_kb)));
            self.host_last = Some(h);
        }
        self.vm_last = hostctx::read_vmstat();
        let disks = hostctx::read_disks();
        let dt_ms = now_ns.saturating_sub(self.prev_ns) / 1_000_000;
        if dt_ms > 0 {
            for b in hostctx::disk_busy(&self.disks_prev, &disks, dt_ms) {
                let e = self.disk_peak_busy.entry(b.name).or_insert(0.0);
                *e = e.max(b.busy_pct);
            }
        }
        self.disks_prev = disks.clone();
        self.disks_last = disks;
        self.prev_ns = now_ns;
        self.last_ns = now_ns;
        for &pid in alive {
            if let Some(s) = hostctx::task_state(pid) {
                self.watch(s, now_ns);
            }
        }
        for fs in &mut self.filesystems {
            if let Some(now) = hostctx::fs_usage(std::path::Path::new(&fs.path)) {
                if now.used_pct > fs.used_pct {
                    *fs = now;
                }
            }
        }
    }

    fn watch(&mut self, s: TaskState, now_ns: u64) {
        let w = self.tasks.entry(s.pid).or_insert_with(|| TaskWatch {
            last: s.clone(),
            cpu_ticks_at_start: s.cpu_ticks,
            stuck_since_ns: None,
            idle_since_ns: None,
        });
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
