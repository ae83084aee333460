//! CPU as the input pipeline sees it: the CPU time each traced process used (utime + stime of
//! /proc/PID/stat, from the context's task samples), the CPUs the job may use (online, its
//! affinity, its cgroup's CPU quota), how often that quota throttled it (cpu.stat deltas for
//! the job's CPU cgroup and its ancestors), how busy the host was (/proc/stat), which processes
//! outside the job took CPU, and where the job's processes sat blocked on a socket (sampled
//! /proc/PID/syscall and the socket's peer).
//!
//! [`CpuSample`] is what `sources::cpu_sample` reads each beat, recorded inside the context sample;
//! [`CpuTrack::apply`] folds it in, the same way live and on replay.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::host::TaskState;

/// One beat's CPU reading (inside `ContextSample::cpu`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct CpuSample {
    /// Clock ticks per second (sysconf CLK_TCK): the unit of every `*_ticks` figure.
    pub clk_tck: u64,
    /// CPUs online on the host.
    pub online_cpus: u32,
    /// CPUs the traced process may run on (its affinity: the cpuset, taskset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_cpus: Option<u32>,
    /// /proc/stat's first line: ticks the host's CPUs were busy (all but idle and iowait), and
    /// all ticks, since boot.
    pub host_busy_ticks: u64,
    pub host_total_ticks: u64,
    /// The traced process's CPU cgroup, with its ancestors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<CpuCgroup>,
    /// The processes outside the traced tree that used the most CPU since the previous reading
    /// (at most a handful), with the ticks each used in that interval.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub others: Vec<OtherCpu>,
    /// The ticks every process outside the traced tree used since the previous reading.
    #[serde(default)]
    pub others_ticks: u64,
    /// Traced processes that sat blocked reading a socket at this reading.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sockets: Vec<SocketWait>,
}

/// A CPU cgroup and its ancestors (v1 cpu controller or v2), each level's quota and throttling.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct CpuCgroup {
    pub path: String,
    pub version: u8,
    /// The job's own cgroup first, then its parent, up to the mount's root.
    pub levels: Vec<CpuLevel>,
}

/// One cgroup's quota (v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us) and its cumulative
/// cpu.stat throttling counters.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct CpuLevel {
    pub path: String,
    /// `None`: no quota ("max", or v1's -1).
    pub quota_us: Option<u64>,
    pub period_us: u64,
    pub nr_periods: u64,
    pub nr_throttled: u64,
    /// v2 throttled_usec; v1 throttled_time (ns) / 1000.
    pub throttled_us: u64,
}

/// A process outside the job and the CPU it used in one interval.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct OtherCpu {
    pub pid: u32,
    pub comm: String,
    pub ticks: u64,
}

/// A traced process blocked in a read of a socket (the socket's peer, when /proc/net/tcp{,6}
/// names it) or of a file on a network or FUSE filesystem (`fs`: its type; `peer`: the
/// mount's source and mount point).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct SocketWait {
    pub pid: u32,
    pub syscall: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs: Option<String>,
}

/// One cgroup level's throttling over the trace.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
pub struct Throttling {
    pub path: String,
    /// The quota in CPUs (quota / period), if the level has one.
    pub quota_cpus: Option<f64>,
    pub periods: u64,
    pub throttled_periods: u64,
    pub throttled_ns: u64,
}

/// One reading of a process's CPU time: (t_ns, utime + stime ticks).
pub type Reading = (u64, u64);

/// What the model keeps of the CPU readings.
#[derive(Default, Debug, Clone)]
pub struct CpuTrack {
    pub first: Option<CpuSample>,
    pub last: Option<CpuSample>,
    pub first_ns: u64,
    pub last_ns: u64,
    /// Per traced pid: its first and last reading (t_ns, utime + stime ticks).
    pub tasks: BTreeMap<u32, (Reading, Reading)>,
    /// Per trainer or rank: its reading when its first DataLoader worker was seen (`mark`).
    pub marks: BTreeMap<u32, Reading>,
    /// Per process outside the job: its name and the ticks it used over the trace (from the
    /// top consumers of each interval).
    pub others: BTreeMap<u32, (String, u64)>,
    pub others_ticks: u64,
    /// Per traced pid: readings that found it, and those that found it blocked on a socket,
    /// by peer ("" when unknown).
    pub readings: BTreeMap<u32, u64>,
    pub socket: BTreeMap<u32, BTreeMap<String, u64>>,
    /// The same for reads of files on a network or FUSE filesystem, by "source (type at
    /// mount point)".
    pub remote_file: BTreeMap<u32, BTreeMap<String, u64>>,
}

impl CpuTrack {
    pub fn apply(&mut self, t_ns: u64, cpu: Option<&CpuSample>, tasks: &[TaskState]) {
        for t in tasks {
            let e = self.tasks.entry(t.pid).or_insert(((t_ns, t.cpu_ticks), (t_ns, t.cpu_ticks)));
            e.1 = (t_ns, t.cpu_ticks);
        }
        let Some(c) = cpu else { return };
        if self.first.is_none() {
            self.first = Some(c.clone());
            self.first_ns = t_ns;
        } else {
            // The first reading's interval began before the trace.
            self.others_ticks += c.others_ticks;
            for o in &c.others {
                let e = self.others.entry(o.pid).or_insert_with(|| (o.comm.clone(), 0));
                e.0.clone_from(&o.comm);
                e.1 += o.ticks;
            }
        }
        for t in tasks {
            *self.readings.entry(t.pid).or_default() += 1;
        }
        for s in &c.sockets {
            let peer = s.peer.clone().unwrap_or_default();
            let by = if s.fs.is_some() { &mut self.remote_file } else { &mut self.socket };
            *by.entry(s.pid).or_default().entry(peer).or_default() += 1;
        }
        self.last = Some(c.clone());
        self.last_ns = t_ns;
    }

    fn tick_ns(&self) -> f64 {
        1e9 / self.last.as_ref().map_or(100, |c| c.clk_tck.max(1)) as f64
    }

    /// CPU time `pid` used between its first and last reading, with the span it covers; a
    /// process forked after `from_ns` (the trace's start) started from zero at `started_ns`.
    pub fn cpu_ns(&self, pid: u32, started_ns: u64, from_ns: u64) -> Option<(u64, u64)> {
        let ((t0, c0), (t1, c1)) = *self.tasks.get(&pid)?;
        let (t0, c0) = if started_ns > from_ns { (started_ns, 0) } else { (t0, c0) };
        let used = (c1.saturating_sub(c0) as f64 * self.tick_ns()) as u64;
        Some((used, t1.saturating_sub(t0)))
    }

    /// Marks `pid`'s latest reading, once: its CPU from then on is `cpu_ns_since_mark`.
    pub fn mark(&mut self, pid: u32) {
        if let Some((_, last)) = self.tasks.get(&pid) {
            self.marks.entry(pid).or_insert(*last);
        }
    }

    /// When `pid`'s mark was read.
    pub fn mark_ns(&self, pid: u32) -> Option<u64> {
        self.marks.get(&pid).map(|(t, _)| *t)
    }

    /// CPU time `pid` used between its mark and its last reading, with the span it covers.
    pub fn cpu_ns_since_mark(&self, pid: u32) -> Option<(u64, u64)> {
        let (t0, c0) = *self.marks.get(&pid)?;
        let (_, (t1, c1)) = *self.tasks.get(&pid)?;
        let used = (c1.saturating_sub(c0) as f64 * self.tick_ns()) as u64;
        Some((used, t1.saturating_sub(t0)))
    }

    /// Each level's throttling between the first and the last reading.
    pub fn throttling(&self) -> Vec<Throttling> {
        let (Some(a), Some(b)) = (
            self.first.as_ref().and_then(|c| c.cgroup.as_ref()),
            self.last.as_ref().and_then(|c| c.cgroup.as_ref()),
        ) else {
            return Vec::new();
        };
        b.levels
            .iter()
            .map(|l| {
                let before = a.levels.iter().find(|x| x.path == l.path);
                let d = |f: fn(&CpuLevel) -> u64| f(l).saturating_sub(before.map_or(0, f));
                Throttling {
                    path: l.path.clone(),
                    quota_cpus: l
                        .quota_us
                        .filter(|_| l.period_us > 0)
                        .map(|q| q as f64 / l.period_us as f64),
                    periods: d(|x| x.nr_periods),
                    throttled_periods: d(|x| x.nr_throttled),
                    throttled_ns: d(|x| x.throttled_us) * 1000,
                }
            })
            .collect()
    }

    /// The host's CPUs' busy share between the first and last reading.
    pub fn host_busy(&self) -> Option<f64> {
        let (a, b) = (self.first.as_ref()?, self.last.as_ref()?);
        let total = b.host_total_ticks.saturating_sub(a.host_total_ticks);
        (total > 0)
            .then(|| b.host_busy_ticks.saturating_sub(a.host_busy_ticks) as f64 / total as f64)
    }

    /// The processes outside the job that used the most CPU, most first, in ns.
    pub fn top_others(&self, n: usize) -> Vec<(u32, String, u64)> {
        let mut v: Vec<(u32, String, u64)> = self
            .others
            .iter()
            .map(|(pid, (comm, t))| (*pid, comm.clone(), (*t as f64 * self.tick_ns()) as u64))
            .collect();
        v.sort_by_key(|(pid, _, ns)| (std::cmp::Reverse(*ns), *pid));
        v.truncate(n);
        v
    }

    pub fn others_ns(&self) -> u64 {
        (self.others_ticks as f64 * self.tick_ns()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(pid: u32, ticks: u64) -> TaskState {
        TaskState {
            pid,
            state: 'R',
            wchan: String::new(),
            cpu_ticks: ticks,
            majflt: 0,
            read_bytes: None,
            write_bytes: None,
            runs: None,
        }
    }

    fn level(nr_periods: u64, nr_throttled: u64, throttled_us: u64) -> CpuLevel {
        CpuLevel {
            path: "/job".into(),
            quota_us: Some(50_000),
            period_us: 100_000,
            nr_periods,
            nr_throttled,
            throttled_us,
        }
    }

    #[test]
    fn cpu_time_throttling_and_neighbours_are_deltas_over_the_trace() {
        let s = 1_000_000_000;
        let sample = |lvl, busy, total, other_ticks| CpuSample {
            clk_tck: 100,
            online_cpus: 2,
            host_busy_ticks: busy,
            host_total_ticks: total,
            cgroup: Some(CpuCgroup { path: "/job".into(), version: 1, levels: vec![lvl] }),
            others: vec![OtherCpu { pid: 99, comm: "make".into(), ticks: other_ticks }],
            others_ticks: other_ticks + 5,
            ..Default::default()
        };
        let mut t = CpuTrack::default();
        t.apply(s, Some(&sample(level(10, 1, 100), 100, 200, 500)), &[task(7, 40)]);
        t.apply(3 * s, Some(&sample(level(30, 11, 500_100), 400, 600, 150)), &[task(7, 190)]);
        // 150 ticks of 10 ms over 2 s, from the first reading (pid 7 predates the trace).
        assert_eq!(t.cpu_ns(7, 0, s), Some((1_500_000_000, 2 * s)));
        // Forked during the trace at 2 s: from zero.
        assert_eq!(t.cpu_ns(7, 2 * s, s), Some((1_900_000_000, s)));
        let th = t.throttling();
        assert_eq!(
            (th[0].periods, th[0].throttled_periods, th[0].throttled_ns),
            (20, 10, 500 * s / 1000)
        );
        assert_eq!(th[0].quota_cpus, Some(0.5));
        assert_eq!(t.host_busy(), Some(0.75));
        // The first interval predates the trace: only the second counts.
        assert_eq!(t.top_others(3), vec![(99, "make".to_string(), 1_500_000_000)]);
        assert_eq!(t.others_ns(), 1_550_000_000);
    }
}
