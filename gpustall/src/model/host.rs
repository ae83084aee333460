//! The job's surroundings as the model holds them: memory cgroup, host memory, vmstat, disks,
//! filesystems, scheduler state of each traced process. [`HostContext::apply`] folds a
//! [`ContextSample`] in, the same way live and on replay; reading them is `sources::host`'s job.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::model::samples::ContextSample;

/// /proc/diskstats counts sectors of 512 bytes whatever the device's sector size.
pub const SECTOR_BYTES: u64 = 512;

/// The memory cgroup of a process: the limit that makes reclaim and the OOM killer act on the
/// job long before the host runs out.
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
pub struct CgroupMem {
    /// The cgroup path as /proc/PID/cgroup shows it, e.g. "/gpustall-test-x".
    pub path: String,
    /// 1 or 2.
    pub version: u8,
    /// `None` = unlimited ("max" in v2, or >= 2^60 in v1).
    pub limit_bytes: Option<u64>,
    pub usage_bytes: u64,
    /// v1 memory.max_usage_in_bytes; v2 memory.peak (kernel 5.19+).
    pub peak_bytes: Option<u64>,
    /// v1 memsw.usage - usage; v2 memory.swap.current.
    pub swap_usage_bytes: Option<u64>,
    /// v1 memory.oom_control `oom_kill`; v2 memory.events `oom_kill`.
    pub oom_kills: Option<u64>,
    /// How often usage hit the limit: v1 memory.failcnt; v2 memory.events `max`.
    pub failcnt: Option<u64>,
    /// The ancestor whose limit `limit_bytes` is, when it is smaller than the cgroup's own (a
    /// Slurm job or a pod sets memory.max on a parent; the job's leaf says "max"). `None` when
    /// the limit is the cgroup's own, or there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_set_by: Option<String>,
    /// The swap the job may use, the smallest over the path to the root: v2 memory.swap.max;
    /// v1 memory.memsw.limit_in_bytes (memory + swap) less the memory limit. `None`: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_limit_bytes: Option<u64>,
    /// As `limit_set_by`, for the swap limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_limit_set_by: Option<String>,
    /// v2 memory.events of the cgroup that sets the limit (the leaf's when it sets none):
    /// cumulative over the cgroup's life. `None` on v1, which has no such file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<MemEvents>,
    /// v2 memory.pressure of the job's cgroup; `None` on v1 or without PSI (psi=0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure: Option<Psi>,
    /// The file cache charged to it (memory.stat active_file + inactive_file; v1's total_
    /// ones): what reclaim drops before the OOM killer acts. `None` in older recordings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_bytes: Option<u64>,
}

/// v2 memory.events: how often the cgroup (or one below it) ran into each boundary.
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq, Default)]
pub struct MemEvents {
    /// Reclaimed below memory.low (its protection was not enough).
    pub low: u64,
    /// Throttled and reclaimed above memory.high.
    pub high: u64,
    /// About to go over memory.max: reclaim was forced.
    pub max: u64,
    /// Reclaim failed at memory.max: the OOM killer was invoked (or the charge failed).
    pub oom: u64,
    pub oom_kill: u64,
    /// Kernel 5.17+; `None` before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_group_kill: Option<u64>,
}

impl MemEvents {
    /// `self - before`, counter by counter (a cgroup recreated under the same name restarts
    /// from zero: no step is negative).
    pub fn minus(&self, before: &MemEvents) -> MemEvents {
        MemEvents {
            low: self.low.saturating_sub(before.low),
            high: self.high.saturating_sub(before.high),
            max: self.max.saturating_sub(before.max),
            oom: self.oom.saturating_sub(before.oom),
            oom_kill: self.oom_kill.saturating_sub(before.oom_kill),
            oom_group_kill: self
                .oom_group_kill
                .map(|a| a.saturating_sub(before.oom_group_kill.unwrap_or(0))),
        }
    }

    pub fn is_zero(&self) -> bool {
        self.low
            + self.high
            + self.max
            + self.oom
            + self.oom_kill
            + self.oom_group_kill.unwrap_or(0)
            == 0
    }
}

/// Pressure stall information (PSI) for memory: the share of time tasks waited for memory.
/// `some`: at least one task waited; `full`: all non-idle tasks did at once.
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Psi {
    /// Percent over the last 10 s.
    pub some_avg10: f64,
    /// Microseconds since boot (or since the cgroup was made).
    pub some_total_us: u64,
    pub full_avg10: f64,
    pub full_total_us: u64,
}

/// PSI over the trace: stalled time and the worst 10-second average seen.
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq, Default)]
pub struct PsiDelta {
    pub some_us: u64,
    pub full_us: u64,
    pub peak_some_avg10: f64,
    pub peak_full_avg10: f64,
}

/// Folds PSI readings into a [`PsiDelta`]: the first reading is the baseline.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PsiTrack {
    pub first: Option<Psi>,
    pub last: Option<Psi>,
    pub peak_some_avg10: f64,
    pub peak_full_avg10: f64,
}

impl PsiTrack {
    pub fn add(&mut self, p: &Psi) {
        if self.first.is_none() {
            self.first = Some(p.clone());
        }
        self.peak_some_avg10 = self.peak_some_avg10.max(p.some_avg10);
        self.peak_full_avg10 = self.peak_full_avg10.max(p.full_avg10);
        self.last = Some(p.clone());
    }

    /// `None` when no reading was ever made (v1, PSI off).
    pub fn delta(&self) -> Option<PsiDelta> {
        let (first, last) = (self.first.as_ref()?, self.last.as_ref()?);
        Some(PsiDelta {
            some_us: last.some_total_us.saturating_sub(first.some_total_us),
            full_us: last.full_total_us.saturating_sub(first.full_total_us),
            peak_some_avg10: self.peak_some_avg10,
            peak_full_avg10: self.peak_full_avg10,
        })
    }
}

/// One watched job's own surroundings (`gpustall watch` follows several jobs, each in its own
/// cgroup and mount namespace), keyed by the job's root pid.
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
pub struct JobContext {
    pub root: u32,
    pub cgroup: Option<CgroupMem>,
    pub filesystems: Vec<FsUsage>,
}

/// Host-wide memory: a job without a cgroup limit is squeezed by the host's MemAvailable.
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
pub struct HostMem {
    pub mem_total_kb: u64,
    pub mem_available_kb: u64,
    pub swap_total_kb: u64,
    pub swap_free_kb: u64,
    /// The kernel's page size in bytes (4 KiB on x86-64, often 64 KiB on arm64): the unit of
    /// swap-out pages and of pswpin/pswpout. Recordings without it were made with 4 KiB pages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<u64>,
}

/// Host-wide reclaim, swap and OOM activity between two /proc/vmstat readings: the evidence
/// of memory pressure even for the events the eBPF side could not attribute.
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq, Default)]
pub struct VmDelta {
    pub pswpin: u64,
    pub pswpout: u64,
    pub pgmajfault: u64,
    pub oom_kill: u64,
    pub pgscan_direct: u64,
    pub pgsteal_direct: u64,
    pub pgscan_kswapd: u64,
    /// The sum of allocstall_* (one counter per zone: dma, dma32, normal, movable, device).
    pub allocstall: u64,
}

pub fn vm_delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> VmDelta {
    let d = |key: &str| {
        let a = after.get(key).copied().unwrap_or(0);
        a.saturating_sub(before.get(key).copied().unwrap_or(0))
    };
    // Zones differ between machines, so sum whichever allocstall_* this kernel has.
    let allocstall =
        after.keys().filter(|k| k.starts_with("allocstall")).map(|k| d(k)).sum::<u64>();
    VmDelta {
        pswpin: d("pswpin"),
        pswpout: d("pswpout"),
        pgmajfault: d("pgmajfault"),
        oom_kill: d("oom_kill"),
        pgscan_direct: d("pgscan_direct"),
        pgsteal_direct: d("pgsteal_direct"),
        pgscan_kswapd: d("pgscan_kswapd"),
        allocstall,
    }
}

/// One line of /proc/diskstats, cumulative since boot.
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
pub struct DiskStat {
    pub name: String,
    pub major: u32,
    pub minor: u32,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Milliseconds the device had I/O in flight (field 10 of the documented layout).
    pub io_ticks_ms: u64,
    /// The devices this one is stacked on (/sys/block/NAME/slaves: dm, md), empty for a plain
    /// disk. Absent from recordings made before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lower: Vec<String>,
}

/// A disk's activity over an interval: 100% busy with reclaim I/O is the "disk is the problem"
/// symptom that memory pressure often causes.
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
pub struct DiskBusy {
    pub name: String,
    /// "maj:min", to match the device numbers of block tracepoints.
    pub dev: String,
    pub busy_pct: f64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

/// Busy share and bytes per disk between two readings `elapsed_ms` apart. Disks that appear
/// only in `after` (hot-plugged) have no baseline and are left out.
pub fn disk_busy(before: &[DiskStat], after: &[DiskStat], elapsed_ms: u64) -> Vec<DiskBusy> {
    after
        .iter()
        .filter_map(|a| {
            let b = before.iter().find(|b| b.major == a.major && b.minor == a.minor)?;
            let ticks = a.io_ticks_ms.saturating_sub(b.io_ticks_ms);
            // io_ticks advance in jiffies and are sampled at slightly different moments than
            // our clock, so the raw ratio can exceed 100%.
            let busy_pct = if elapsed_ms == 0 {
                0.0
            } else {
                (ticks as f64 * 100.0 / elapsed_ms as f64).min(100.0)
            };
            Some(DiskBusy {
                name: a.name.clone(),
                dev: format!("{}:{}", a.major, a.minor),
                busy_pct,
                read_bytes: a.read_bytes.saturating_sub(b.read_bytes),
                write_bytes: a.write_bytes.saturating_sub(b.write_bytes),
            })
        })
        .collect()
}

/// Space on the filesystem holding a path (the dataset, the checkpoint directory): a full disk
/// stalls a job in a way that looks like slow I/O.
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
pub struct FsUsage {
    pub path: String,
    /// Which filesystem ("major:minor" of the mount): the job may mount its own at a path
    /// (`unshare -m`, a container), and two filesystems' figures never mix. Absent in
    /// recordings before it was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev: Option<String>,
    pub total_bytes: u64,
    /// Available to unprivileged users (root's reserved blocks excluded), as df shows.
    pub avail_bytes: u64,
    /// As df's Use%: used / (used + available), so it reaches 100 when users can write no more.
    pub used_pct: f64,
}

/// A block I/O limit on one device, set on the job's cgroup or an ancestor (`path`): v1's
/// blkio.throttle.*_device, v2's io.max. `None`: no limit of that kind.
#[derive(Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq)]
pub struct IoLimit {
    pub path: String,
    /// "MAJ:MIN", and the kernel's name for it where it could be read.
    pub dev: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rbps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wbps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub riops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wiops: Option<u64>,
}

impl IoLimit {
    pub fn is_set(&self) -> bool {
        self.rbps.is_some() || self.wbps.is_some() || self.riops.is_some() || self.wiops.is_some()
    }
}

/// What a task is doing: a job whose processes sit in D state with a wchan in the block layer
/// is hung on I/O; at 0 CPU in S state it is waiting or deadlocked.
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
pub struct TaskState {
    pub pid: u32,
    /// R S D T t Z I X, as in /proc/PID/stat.
    pub state: char,
    /// The kernel function the task sleeps in; "" when running or hidden.
    pub wchan: String,
    /// utime + stime, in clock ticks.
    pub cpu_ticks: u64,
    pub majflt: u64,
    /// /proc/PID/io, readable only by the owner or with CAP_SYS_PTRACE.
    pub read_bytes: Option<u64>,
    pub write_bytes: Option<u64>,
    /// Times its main thread was scheduled onto a CPU (/proc/PID/schedstat, CONFIG_SCHED_INFO):
    /// a task asleep on a lock never runs, one that polls with a timeout runs now and then,
    /// though neither uses a clock tick of CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<u64>,
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
    /// Since when it has not been scheduled at all: the first reading of a `runs` that a later
    /// reading found unchanged (None while they move, or where the kernel does not count them).
    pub asleep_since_ns: Option<u64>,
    /// When the current `runs` was first read.
    runs_read_ns: u64,
    /// /proc/PID/io read_bytes at its first reading.
    pub first_read_bytes: Option<u64>,
}

#[derive(Default)]
pub struct HostContext {
    pub samples: u64,
    pub cgroup_last: Option<CgroupMem>,
    pub cgroup_peak_usage: u64,
    /// The cgroup's OOM-kill count at its first sample: kills before the trace are not news.
    pub cgroup_oom_kills_before: Option<u64>,
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
    /// The limiting cgroup's memory.events at its first reading: the trace's own are the
    /// difference (the file counts over the cgroup's life).
    pub cgroup_events_before: Option<MemEvents>,
    /// The job cgroup's memory.pressure and the host's /proc/pressure/memory.
    pub cgroup_psi: PsiTrack,
    pub host_psi: PsiTrack,
    /// `gpustall watch`: each job's latest own context, by root pid.
    pub jobs_last: BTreeMap<u32, JobContext>,
    /// CPU time, quota throttling, host load and socket waits (`model::cpu`).
    pub cpu: crate::model::cpu::CpuTrack,
    /// The job's block I/O limits as last read.
    pub io_limits: Vec<IoLimit>,
    /// When the job's memory cgroup reaches its limit at the growth measured.
    pub limit_clock: crate::model::limit_clock::LimitClock,
    /// `gpustall watch`: the same, per job, by root pid.
    pub job_clocks: BTreeMap<u32, crate::model::limit_clock::LimitClock>,
}

impl HostContext {
    /// The cgroup's OOM kills during the trace (its counter is the cgroup's lifetime's).
    pub fn cgroup_oom_kills(&self) -> Option<u64> {
        let last = self.cgroup_last.as_ref()?.oom_kills?;
        Some(last.saturating_sub(self.cgroup_oom_kills_before.unwrap_or(0)))
    }

    /// The limiting cgroup's memory.events during the trace (v2 only).
    pub fn cgroup_events(&self) -> Option<MemEvents> {
        let last = self.cgroup_last.as_ref()?.events.as_ref()?;
        Some(last.minus(self.cgroup_events_before.as_ref().unwrap_or(&MemEvents::default())))
    }

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
            // The job moved to another cgroup (it joined one after it started): its counters
            // count from there, not from the cgroup it left.
            if self.cgroup_last.as_ref().is_some_and(|l| l.path != m.path) {
                self.cgroup_oom_kills_before = None;
                self.cgroup_events_before = None;
                self.cgroup_peak_usage = 0;
            }
            if self.cgroup_oom_kills_before.is_none() {
                self.cgroup_oom_kills_before = m.oom_kills;
            }
            if self.cgroup_events_before.is_none() {
                self.cgroup_events_before = m.events.clone();
            }
            if let Some(p) = &m.pressure {
                self.cgroup_psi.add(p);
            }
            self.cgroup_peak_usage =
                self.cgroup_peak_usage.max(m.peak_bytes.unwrap_or(0)).max(m.usage_bytes);
            self.limit_clock.add(s.t_ns, m);
            self.cgroup_last = Some(m.clone());
        }
        if let Some(h) = &s.host {
            self.host_min_available_kb = Some(
                self.host_min_available_kb
                    .map_or(h.mem_available_kb, |m| m.min(h.mem_available_kb)),
            );
            self.host_last = Some(h.clone());
        }
        if let Some(p) = &s.host_pressure {
            self.host_psi.add(p);
        }
        for j in &s.jobs {
            if let Some(c) = &j.cgroup {
                self.job_clocks.entry(j.root).or_default().add(s.t_ns, c);
            }
            self.jobs_last.insert(j.root, j.clone());
        }
        // A job that is no longer read has ended.
        if !s.jobs.is_empty() || !self.jobs_last.is_empty() {
            self.jobs_last.retain(|root, _| s.jobs.iter().any(|j| j.root == *root));
            self.job_clocks.retain(|root, _| s.jobs.iter().any(|j| j.root == *root));
        }
        if !s.vmstat.is_empty() {
            self.vm_last = s.vmstat.clone();
        }
        let dt_ms = s.t_ns.saturating_sub(self.last_ns) / 1_000_000;
        if dt_ms > 0 {
            for b in disk_busy(&self.disks_last, &s.disks, dt_ms) {
                let e = self.disk_peak_busy.entry(b.name).or_insert(0.0);
                *e = e.max(b.busy_pct);
            }
        }
        self.disks_last = s.disks.clone();
        self.last_ns = s.t_ns;
        for t in &s.tasks {
            self.watch(t.clone(), s.t_ns);
        }
        self.cpu.apply(s.t_ns, s.cpu.as_ref(), &s.tasks);
        if let Some(l) = &s.io_limits {
            self.io_limits = l.clone();
        }
        for fs in &s.filesystems {
            // At its fullest; a path the job now has another filesystem on is that one's.
            match self.filesystems.iter_mut().find(|f| f.path == fs.path) {
                Some(f) if fs.used_pct > f.used_pct || fs.dev != f.dev => *f = fs.clone(),
                Some(_) => {}
                None => self.filesystems.push(fs.clone()),
            }
        }
    }

    fn watch(&mut self, s: TaskState, now_ns: u64) {
        let Some(w) = self.tasks.get_mut(&s.pid) else {
            let stuck = matches!(s.state, 'T' | 't' | 'D').then_some(now_ns);
            let first_read_bytes = s.read_bytes;
            let w = TaskWatch {
                last: s,
                stuck_since_ns: stuck,
                idle_since_ns: None,
                asleep_since_ns: None,
                runs_read_ns: now_ns,
                first_read_bytes,
            };
            self.tasks.insert(w.last.pid, w);
            return;
        };
        let stuck = matches!(s.state, 'T' | 't' | 'D');
        w.stuck_since_ns = match (stuck, w.stuck_since_ns) {
            (true, Some(since)) if w.last.state == s.state => Some(since),
            (true, _) => Some(now_ns),
            (false, _) => None,
        };
        let moved = s.cpu_ticks != w.last.cpu_ticks
            || s.read_bytes != w.last.read_bytes
            || s.write_bytes != w.last.write_bytes;
        w.idle_since_ns = match (moved, w.idle_since_ns) {
            (true, _) => None,
            (false, Some(since)) => Some(since),
            (false, None) => Some(now_ns),
        };
        w.asleep_since_ns = match (s.runs, w.last.runs) {
            (Some(now), Some(before)) if now == before => Some(w.runs_read_ns),
            _ => {
                w.runs_read_ns = now_ns;
                None
            }
        };
        w.last = s;
    }

    /// Busy % of each disk over the whole trace.
    pub fn disk_busy_overall(&self) -> Vec<DiskBusy> {
        let ms = self.last_ns.saturating_sub(self.start_ns) / 1_000_000;
        if ms == 0 {
            return Vec::new();
        }
        disk_busy(&self.disks_before, &self.disks_last, ms)
    }

    pub fn vm_delta(&self) -> VmDelta {
        vm_delta(&self.vm_before, &self.vm_last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(state: char, cpu: u64) -> TaskState {
        TaskState {
            pid: 5,
            state,
            wchan: String::new(),
            cpu_ticks: cpu,
            majflt: 0,
            read_bytes: Some(0),
            write_bytes: Some(0),
            runs: Some(cpu),
        }
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
    fn asleep_since_the_first_reading_of_runs_that_stood_still() {
        let sleeping = |runs| TaskState { runs, ..task('S', 10) };
        let mut c = HostContext::default();
        c.apply(&at(0, vec![sleeping(Some(7))]));
        assert_eq!(c.tasks[&5].asleep_since_ns, None);
        c.apply(&at(1, vec![sleeping(Some(7))]));
        c.apply(&at(2, vec![sleeping(Some(7))]));
        assert_eq!(c.tasks[&5].asleep_since_ns, Some(0), "since its first reading");
        // Woken by a timeout: no tick of CPU, but it ran.
        c.apply(&at(3, vec![sleeping(Some(8))]));
        assert_eq!(c.tasks[&5].asleep_since_ns, None);
        // A kernel without schedstat: never said.
        c.apply(&at(4, vec![sleeping(None)]));
        c.apply(&at(5, vec![sleeping(None)]));
        assert_eq!(c.tasks[&5].asleep_since_ns, None);
    }

    #[test]
    fn only_the_cgroups_oom_kills_during_the_trace_count() {
        let cg = |kills| CgroupMem {
            path: "/job".into(),
            version: 2,
            limit_bytes: Some(1 << 30),
            usage_bytes: 0,
            peak_bytes: None,
            swap_usage_bytes: None,
            oom_kills: Some(kills),
            failcnt: None,
            limit_set_by: None,
            swap_limit_bytes: None,
            swap_limit_set_by: None,
            events: Some(MemEvents { max: kills * 10, oom_kill: kills, ..Default::default() }),
            pressure: Some(Psi { some_total_us: kills * 1000, ..Default::default() }),
            file_bytes: None,
        };
        let mut c = HostContext::default();
        // Three kills from an earlier run of the job, then one during the trace.
        c.apply(&ContextSample { cgroup: Some(cg(3)), ..Default::default() });
        assert_eq!(c.cgroup_oom_kills(), Some(0));
        c.apply(&ContextSample { cgroup: Some(cg(4)), ..Default::default() });
        assert_eq!(c.cgroup_oom_kills(), Some(1));
        let ev = c.cgroup_events().expect("v2 events");
        assert_eq!((ev.max, ev.oom_kill, ev.oom_group_kill), (10, 1, None));
        assert_eq!(c.cgroup_psi.delta().map(|d| d.some_us), Some(1000));
        assert_eq!(c.host_psi.delta(), None, "no host PSI read: none reported");
    }

    #[test]
    fn event_deltas_never_go_negative() {
        let a = MemEvents { max: 5, oom_group_kill: Some(2), ..Default::default() };
        let b = MemEvents { max: 7, oom_group_kill: Some(1), ..Default::default() };
        assert_eq!(a.minus(&b), MemEvents { oom_group_kill: Some(1), ..Default::default() });
        assert!(!a.minus(&b).is_zero());
        assert!(b.minus(&b).is_zero());
    }

    #[test]
    fn a_jobs_context_goes_when_it_is_no_longer_read() {
        let job = |root| JobContext { root, cgroup: None, filesystems: vec![] };
        let mut c = HostContext::default();
        c.apply(&ContextSample { jobs: vec![job(1), job(2)], ..Default::default() });
        c.apply(&ContextSample { jobs: vec![job(2)], ..Default::default() });
        assert_eq!(c.jobs_last.keys().copied().collect::<Vec<_>>(), vec![2]);
    }

    #[test]
    fn fullest_filesystem_reading_is_kept() {
        let fs = |pct: f64| FsUsage {
            path: "/tmp".into(),
            dev: None,
            total_bytes: 100,
            avail_bytes: 1,
            used_pct: pct,
        };
        let mut c = HostContext::default();
        c.apply(&ContextSample { filesystems: vec![fs(50.0)], ..Default::default() });
        c.apply(&ContextSample { filesystems: vec![fs(99.0)], ..Default::default() });
        c.apply(&ContextSample { filesystems: vec![fs(60.0)], ..Default::default() });
        assert_eq!(c.filesystems.len(), 1);
        assert_eq!(c.filesystems[0].used_pct, 99.0);
    }

    #[test]
    fn a_filesystem_the_job_mounted_over_a_path_replaces_the_one_before() {
        // The job's own 8 MiB /dev/shm, empty, after the host's at 1 %: the host's figures
        // are not the job's, however much fuller.
        let fs = |dev: &str, total: u64, pct: f64| FsUsage {
            path: "/dev/shm".into(),
            dev: Some(dev.into()),
            total_bytes: total,
            avail_bytes: total,
            used_pct: pct,
        };
        let mut c = HostContext::default();
        c.apply(&ContextSample {
            filesystems: vec![fs("0:25", 24 << 30, 1.0)],
            ..Default::default()
        });
        c.apply(&ContextSample {
            filesystems: vec![fs("0:61", 8 << 20, 0.0)],
            ..Default::default()
        });
        c.apply(&ContextSample {
            filesystems: vec![fs("0:61", 8 << 20, 100.0)],
            ..Default::default()
        });
        c.apply(&ContextSample {
            filesystems: vec![fs("0:61", 8 << 20, 3.0)],
            ..Default::default()
        });
        assert_eq!(c.filesystems.len(), 1);
        assert_eq!((c.filesystems[0].total_bytes, c.filesystems[0].used_pct), (8 << 20, 100.0));
    }
}
