//! A recording turned into tracks for people to look at: per-process slices (reclaim stalls),
//! instants (fork, exit, OOM kill, signals) and counter series (RSS, GPU utilisation, swap,
//! disk throughput, data_time, the trainer's wait for data and who kept it waiting). Built from
//! the JSON lines alone, so it works on any recording; the Perfetto and HTML renderers draw
//! from it.
//!
//! The wait for data comes from the kernel's sums per (waker, trainer or rank) pair, recorded
//! in the counters samples (about once a second): per second, how much waiting of a trainer's
//! or rank's threads ended (`data_wait_ms_s` on its track) and how much of it each worker ended
//! (`kept_waiting_ms_s` on the worker's track); a wait is counted in the second it ended, whole
//! (a 3 s wait is 3000 ms in one second). The long waits (10 ms or more) also come one by one
//! (`data_wait` events): each is a slice on the waiting thread's track and a [`Flow`] from the
//! thread that ended it, with how long that process was stalled in reclaim meanwhile.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use gpustall_common::syscall::WaitClass;

use crate::model::event::Event;
use crate::model::gpu::StallEpisode;
use crate::model::samples::{CountersSample, Sample};
use crate::recording::record::Record;

#[derive(Debug, Clone, PartialEq)]
pub struct Slice {
    pub pid: u32,
    pub tid: u32,
    pub name: String,
    pub start_ns: u64,
    pub dur_ns: u64,
    pub args: SliceArgs,
}

/// What a slice shows with it: a long wait's figures, typed (the HTML page draws them too),
/// or the details of a stall.
#[derive(Serialize, Debug, Clone, PartialEq)]
#[serde(untagged)]
pub enum SliceArgs {
    Wait(WaitArgs),
    Other(Value),
}

/// A long wait for data, as its slice on the waiting thread shows it.
#[derive(Serialize, Debug, Clone, PartialEq, Default)]
pub struct WaitArgs {
    /// The process whose batch ended it, and its name.
    pub waker_pid: u32,
    pub waker_comm: String,
    pub ms: f64,
    /// Of its blocks, those that ran out (timeouts), where the kernel joined blocks into one
    /// wait.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocks: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<u32>,
    /// The relay thread that passed the batch on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relay_tid: Option<u32>,
    /// The process whose batch came close enough to share the wait, half each.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_with_pid: Option<u32>,
    /// The syscall it blocked in (where the kernel read it): an ioctl is a driver's wait (the
    /// GPU), not a batch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub syscall: Option<WaitClass>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Instant {
    pub pid: u32,
    pub name: String,
    pub t_ns: u64,
    pub args: Value,
}

/// An arrow from one thread's moment to another's: the worker's wakeup that ended a wait
/// (`from`) to the end of the waiting thread's slice (`to`). (pid, tid, t_ns) each.
#[derive(Debug, Clone, PartialEq)]
pub struct Flow {
    pub from: (u32, u32, u64),
    pub to: (u32, u32, u64),
    pub name: String,
}

/// A named series of (time, value) on a track (`pid`, or a host/GPU pseudo-track).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Series {
    pub points: Vec<(u64, f64)>,
}

/// Which track a counter belongs to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Track {
    Process(u32),
    Gpu(u32),
    Host,
}

#[derive(Debug, Default)]
pub struct Timeline {
    pub start_ns: u64,
    pub end_ns: u64,
    /// pid -> (name, role label).
    pub processes: BTreeMap<u32, String>,
    pub gpus: BTreeMap<u32, String>,
    /// pid -> its torch.distributed rank, where its identity says.
    pub ranks: BTreeMap<u32, u32>,
    pub slices: Vec<Slice>,
    pub instants: Vec<Instant>,
    pub flows: Vec<Flow>,
    /// (track, counter name) -> series.
    pub counters: BTreeMap<(Track, String), Series>,
    pub verdict: Option<Value>,
}

impl Timeline {
    fn point(&mut self, track: Track, name: &str, t: u64, v: f64) {
        self.counters.entry((track, name.to_string())).or_default().points.push((t, v));
    }

    /// Drops the slices, instants, flows and counter points, keeping the tracks' names and
    /// series: a timeline streamed out a record at a time (`perfetto::write_recording`).
    pub fn clear_marks(&mut self) {
        self.slices.clear();
        self.instants.clear();
        self.flows.clear();
        for s in self.counters.values_mut() {
            s.points.clear();
        }
    }
}

/// The name of a long wait's slice on the waiting thread (its args: [`WaitArgs`]).
pub const DATA_WAIT_SLICE: &str = "waiting for data";

/// Length of the slice drawn for a wakeup (an instant has no extent for an arrow to leave).
const WAKE_BLIP_NS: u64 = 1_000;

/// Job-wide cumulative counters, to turn into per-second rates.
#[derive(Default)]
struct JobTotals {
    /// (pid, dev, op, in reclaim) -> bytes.
    io: BTreeMap<(u32, u32, u32, bool), u64>,
    swapout: BTreeMap<u32, u64>,
    last: Option<(u64, u64, u64, u64)>, // t, read+write bytes, reclaim bytes, swapout pages
    /// (waker, wakee) -> ns of the wakee's waits the waker ended (cumulative).
    wakes: BTreeMap<(u32, u32), u64>,
    /// The per-process sums at the previous counters sample: trainer/rank -> its data wait,
    /// worker -> the waits it ended.
    waited: BTreeMap<u32, u64>,
    kept: BTreeMap<u32, u64>,
}

/// The timeline of a recording's records.
#[cfg(test)]
pub fn build(records: impl IntoIterator<Item = Record>) -> Timeline {
    let mut b = Builder::default();
    for r in records {
        b.add(r);
    }
    b.t
}

/// A timeline built one record at a time (a recording streamed from its file).
#[derive(Default)]
pub struct Builder {
    pub t: Timeline,
    totals: JobTotals,
}

impl Builder {
    pub fn add(&mut self, r: Record) {
        let t = &mut self.t;
        if let Some(ts) = r.t_ns() {
            t.end_ns = t.end_ns.max(ts);
        }
        match r {
            Record::Header(h) => {
                t.start_ns = h.start_ns;
                t.end_ns = t.start_ns;
            }
            Record::Event(e) => t.event(&e),
            Record::GpuStall(s) => t.gpu_stall(&s),
            Record::Sample(s) => t.sample(&s, &mut self.totals),
            Record::Summary(s) if s.is_final => t.verdict = s.verdict().cloned(),
            Record::Summary(_) | Record::Unknown { .. } => {}
        }
    }
}

/// The timeline of a recording file's first `max_lines` lines, streamed.
pub fn from_file(file: &std::path::Path, max_lines: usize) -> anyhow::Result<Timeline> {
    let mut b = Builder::default();
    crate::recording::replay::for_each_record(file, max_lines, |r| b.add(r))?;
    Ok(b.t)
}

/// A recording's tracks only (its processes' final names, GPUs, ranks): its marks are dropped
/// as they are read, so memory does not grow with the recording.
pub fn tracks_from_file(file: &std::path::Path, max_lines: usize) -> anyhow::Result<Timeline> {
    let mut b = Builder::default();
    crate::recording::replay::for_each_record(file, max_lines, |r| {
        b.add(r);
        b.t.clear_marks();
    })?;
    Ok(b.t)
}

/// How a process ended, from its raw wait status.
fn exit_name(status: Option<u32>) -> String {
    match status {
        Some(c) if c & 0x7f != 0 => format!("killed by signal {}", c & 0x7f),
        Some(c) => format!("exit {}", (c >> 8) & 0xff),
        None => "exit".into(),
    }
}

impl Timeline {
    fn instant(&mut self, pid: u32, name: String, t_ns: u64, args: Value) {
        self.instants.push(Instant { pid, name, t_ns, args });
    }

    /// A kernel event: instants (fork, exit, OOM kill, signals) and slices (reclaim, waits).
    fn event(&mut self, e: &Event) {
        let h = e.header();
        let (ts, pid) = (h.t_ns, h.pid);
        match e {
            Event::Fork { child_pid, .. } => {
                self.processes.entry(*child_pid).or_insert_with(|| h.comm.clone());
                self.instant(pid, format!("fork {child_pid}"), ts, Value::Null);
            }
            Event::Rename { renamed_tid, new_comm, .. } if *renamed_tid == pid => {
                self.processes.insert(pid, new_comm.clone());
            }
            Event::Exit { exit_code, .. } => {
                self.instant(pid, exit_name(*exit_code), ts, Value::Null)
            }
            Event::OomVictim { victim_pid, .. } => {
                let args = serde_json::to_value(e).unwrap_or_default();
                self.instant(*victim_pid, "OOM kill".into(), ts, args);
            }
            Event::Signal { sig, target_pid, .. } => {
                let name = format!("signal {sig} from {pid} ({})", h.comm);
                self.instant(*target_pid, name, ts, Value::Null);
            }
            Event::Reclaim { kind, start_ns, duration_ns, nr_reclaimed, .. } => {
                let kind = serde_json::to_value(kind).unwrap_or_default();
                self.slices.push(Slice {
                    pid,
                    tid: h.tid,
                    name: format!("{} reclaim", kind.as_str().unwrap_or("?")),
                    start_ns: *start_ns,
                    dur_ns: *duration_ns,
                    args: SliceArgs::Other(serde_json::json!({"nr_reclaimed": nr_reclaimed})),
                });
            }
            Event::DataWait { .. } => self.data_wait(e),
            Event::Rename { .. } | Event::Exec { .. } | Event::Throttled { .. } => {}
        }
    }

    fn gpu_stall(&mut self, s: &StallEpisode) {
        self.slices.push(Slice {
            pid: gpu_pid(s.gpu_index),
            tid: 0,
            name: "GPU stall".into(),
            start_ns: s.start_ns,
            dur_ns: s.duration_ns,
            args: SliceArgs::Other(
                serde_json::json!({"throttle_reasons": s.throttle_reasons, "pids": s.pids}),
            ),
        });
    }

    /// A long wait for data: a slice on the waiting thread, a blip on the waker's thread (the
    /// wakeup: a flow needs a slice at each end) and the arrow between them. The waker is the
    /// event's process (its header).
    fn data_wait(&mut self, e: &Event) {
        let Event::DataWait {
            h,
            wakee_pid: wakee,
            wakee_tid,
            start_ns,
            duration_ns: dur_ns,
            wait_class,
            slices,
            job_wakes,
            relay_tid,
            co_waker,
        } = e
        else {
            return;
        };
        let (ts, waker, waker_tid, wakee, wakee_tid, dur_ns, start_ns) =
            (h.t_ns, h.pid, h.tid, *wakee, *wakee_tid, *dur_ns, *start_ns);
        // Logical waits are sent from the wakee's context, with no comm: the waker's name is
        // the tree's.
        let comm = match h.comm.as_str() {
            "" => self.processes.get(&waker).cloned().unwrap_or_default(),
            c => c.to_string(),
        };
        let joined = (*slices).zip(*job_wakes);
        let args = WaitArgs {
            waker_pid: waker,
            waker_comm: comm,
            ms: dur_ns as f64 / 1e6,
            blocks: joined.map(|(blocks, _)| blocks),
            timeouts: joined.map(|(blocks, job)| blocks.saturating_sub(job)),
            relay_tid: *relay_tid,
            shared_with_pid: *co_waker,
            syscall: *wait_class,
        };
        self.slices.push(Slice {
            pid: wakee,
            tid: wakee_tid,
            name: DATA_WAIT_SLICE.into(),
            start_ns,
            dur_ns,
            args: SliceArgs::Wait(args),
        });
        self.slices.push(Slice {
            pid: waker,
            tid: waker_tid,
            name: "delivered (woke the trainer)".into(),
            start_ns: ts,
            dur_ns: WAKE_BLIP_NS,
            args: SliceArgs::Other(
                serde_json::json!({"wakee_pid": wakee, "waited_ms": dur_ns as f64 / 1e6}),
            ),
        });
        // The arrow lands just inside the wait's end so that it binds to that slice.
        let land = start_ns + dur_ns.saturating_sub(WAKE_BLIP_NS);
        self.flows.push(Flow {
            from: (waker, waker_tid, ts),
            to: (wakee, wakee_tid, land),
            name: "batch".into(),
        });
    }

    /// A sample: names (seeds) and counter series.
    fn sample(&mut self, s: &Sample, totals: &mut JobTotals) {
        let ts = s.t_ns();
        match s {
            Sample::Seed { pid, comm, .. } => {
                self.processes.insert(*pid, comm.clone());
            }
            Sample::Identity { pid, identity, .. } => {
                if let Some(rank) = identity.rank {
                    self.ranks.insert(*pid, rank);
                }
            }
            Sample::ProcMem { pid, mem, .. } => {
                let (rss, swap) = (mem.rss_kb as f64 / 1024.0, mem.swap_kb as f64 / 1024.0);
                self.point(Track::Process(*pid), "rss_mib", ts, rss);
                self.point(Track::Process(*pid), "swap_mib", ts, swap);
                self.point(Track::Process(*pid), "held_mib", ts, rss + swap);
            }
            Sample::Gpu { gpus, .. } => self.gpus_sampled(gpus),
            Sample::Counters(c) => totals.add(c, self),
            Sample::Context(c) => {
                if let Some(h) = &c.host {
                    let used = h.swap_total_kb.saturating_sub(h.swap_free_kb);
                    self.point(Track::Host, "swap_used_mib", ts, used as f64 / 1024.0);
                    let avail = h.mem_available_kb as f64 / 1024.0;
                    self.point(Track::Host, "mem_available_mib", ts, avail);
                }
                if let Some(cg) = &c.cgroup {
                    let usage = cg.usage_bytes as f64 / 1048576.0;
                    self.point(Track::Host, "cgroup_usage_mib", ts, usage);
                }
            }
            Sample::TrainStep { data_time_s: Some(d), .. } => {
                self.point(Track::Host, "data_time_s", ts, *d);
            }
            _ => {}
        }
    }

    fn gpus_sampled(&mut self, gpus: &[crate::model::gpu::GpuSample]) {
        for g in gpus {
            self.gpus.entry(g.index).or_insert_with(|| g.name.clone());
            if let Some(u) = g.util_gpu_pct {
                self.point(Track::Gpu(g.index), "util_pct", g.t_ns, f64::from(u));
            }
            if let Some(c) = g.temperature_c {
                self.point(Track::Gpu(g.index), "temperature_c", g.t_ns, f64::from(c));
            }
        }
    }
}

/// GPUs get pseudo-pids far above real ones, so their tracks never collide with a process.
pub fn gpu_pid(index: u32) -> u32 {
    0x4000_0000 + index
}

impl JobTotals {
    fn add(&mut self, c: &CountersSample, t: &mut Timeline) {
        let ts = c.t_ns;
        for r in &c.io {
            self.io.insert((r.pid, r.dev, r.op, r.in_reclaim), r.counters.bytes);
        }
        for p in &c.procs {
            self.swapout.insert(p.pid, p.counters.swapout_anon_pages);
        }
        self.wait_rates(c, t);
        let bytes: u64 = self.io.values().sum();
        let reclaim: u64 = self.io.iter().filter(|(k, _)| k.3).map(|(_, v)| v).sum();
        let swap: u64 = self.swapout.values().sum();
        if let Some((t0, b0, r0, s0)) = self.last {
            let dt = ts.saturating_sub(t0).max(1) as f64 / 1e9;
            let mib_s = |now: u64, before: u64| now.saturating_sub(before) as f64 / 1048576.0 / dt;
            t.point(Track::Host, "job_disk_mib_s", ts, mib_s(bytes, b0));
            t.point(Track::Host, "job_reclaim_io_mib_s", ts, mib_s(reclaim, r0));
            t.point(Track::Host, "job_swapout_pages_s", ts, swap.saturating_sub(s0) as f64 / dt);
        }
        self.last = Some((ts, bytes, reclaim, swap));
    }

    /// The wait for data per second: for each trainer/rank (the wakees of the kernel's wake
    /// pairs) the waits that other processes ended, for each worker (the wakers) the waits it
    /// ended. Each point is the rate over the interval that starts at it (since the previous
    /// counters sample), so a counter track shows it over the second it measures. Nothing is
    /// drawn for a recording without wake pairs.
    fn wait_rates(&mut self, c: &CountersSample, t: &mut Timeline) {
        let ts = c.t_ns;
        for w in &c.wakes {
            let (key, ns) = ((w.waker, w.wakee), w.counters.ns);
            // Totals only grow; a smaller one is an entry the kernel re-created after the
            // process's exit (the model ignores it too).
            let e = self.wakes.entry(key).or_default();
            *e = (*e).max(ns);
        }
        if self.wakes.is_empty() {
            return;
        }
        let mut waited: BTreeMap<u32, u64> = BTreeMap::new();
        let mut kept: BTreeMap<u32, u64> = BTreeMap::new();
        for (&(waker, wakee), &ns) in &self.wakes {
            if waker == 0 {
                continue; // waits no process of the job ended: not a wait for data
            }
            *waited.entry(wakee).or_default() += ns;
            *kept.entry(waker).or_default() += ns;
        }
        let t0 = self.last.map_or(t.start_ns, |l| l.0).min(ts);
        let dt = ts.saturating_sub(t0).max(1) as f64 / 1e9;
        for (now, before, name) in
            [(&waited, &self.waited, "data_wait_ms_s"), (&kept, &self.kept, "kept_waiting_ms_s")]
        {
            for (&pid, &ns) in now {
                let d = ns.saturating_sub(before.get(&pid).copied().unwrap_or(0));
                t.point(Track::Process(pid), name, t0, d as f64 / 1e6 / dt);
            }
        }
        self.waited = waited;
        self.kept = kept;
    }
}

/// Records for tests, complete where the recording's own lines would be.
#[cfg(test)]
pub mod fixtures {
    use super::*;
    use crate::model::offcpu::WakeRec;
    use crate::model::samples::{IoRec, ProcCountersRec};
    use gpustall_common::sched::WakeCounters;

    pub fn header(start_ns: u64) -> Record {
        let h = crate::recording::header::Header { version: 1, start_ns, ..Default::default() };
        Record::Header(Box::new(h))
    }

    /// A line as a recording holds it (every field there).
    pub fn line(v: Value) -> Record {
        Record::from_value(v.clone()).unwrap_or_else(|e| panic!("{v}: {e}"))
    }

    pub fn counters(
        t_ns: u64,
        procs: Vec<ProcCountersRec>,
        io: Vec<IoRec>,
        wakes: Vec<WakeRec>,
    ) -> Record {
        Record::Sample(Sample::Counters(CountersSample {
            t_ns,
            procs,
            io,
            wakes,
            ..Default::default()
        }))
    }

    /// `count` waits of `wakee` that `waker` ended, `ns` in all.
    pub fn wake(waker: u32, wakee: u32, ns: u64, count: u64) -> WakeRec {
        let counters = WakeCounters { count, ns, max_ns: ns / count.max(1), ..Default::default() };
        WakeRec { waker, wakee, counters }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;
    use serde_json::json;

    #[test]
    fn events_and_samples_become_tracks() {
        use crate::model::samples::{IoRec, ProcCountersRec};
        use gpustall_common::counters::{IoCounters, ProcCounters};
        let swapped = |pages| ProcCountersRec {
            pid: 11,
            counters: ProcCounters { swapout_anon_pages: pages, ..Default::default() },
        };
        let reclaim_io = IoRec {
            pid: 11,
            dev: 1,
            op: 1,
            in_reclaim: true,
            counters: IoCounters { bytes: 2097152, ..Default::default() },
        };
        let gpu = crate::model::gpu::GpuSample {
            t_ns: 4000,
            name: "H200".into(),
            util_gpu_pct: Some(0),
            ..Default::default()
        };
        let lines = vec![
            header(1000),
            line(
                json!({"type":"sample","kind":"seed","t_ns":1000,"pid":10,"ppid":1,"comm":"python","is_target":true}),
            ),
            line(
                json!({"type":"event","kind":"fork","t_ns":1100,"pid":10,"tid":10,"comm":"python","child_pid":11,"clone_flags":17}),
            ),
            line(
                json!({"type":"event","kind":"rename","t_ns":1200,"pid":11,"tid":11,"comm":"python","renamed_tid":11,"new_comm":"pt_data_worker"}),
            ),
            line(
                json!({"type":"event","kind":"reclaim","t_ns":1500,"pid":11,"tid":11,"comm":"w","reclaim":"memcg","start_ns":1300,"duration_ns":200,"nr_reclaimed":32}),
            ),
            line(
                json!({"type":"sample","kind":"proc_mem","t_ns":2000,"pid":11,"rss_kb":2048,"anon_kb":2048,"file_kb":0,"shmem_kb":0,"swap_kb":1024,"hwm_kb":2048,"majflt":0}),
            ),
            counters(2000, vec![swapped(0)], vec![], vec![]),
            counters(3000, vec![swapped(500)], vec![reclaim_io], vec![]),
            line(
                json!({"type":"event","kind":"oom_kill","t_ns":4000,"pid":10,"tid":10,"comm":"python","victim_pid":11,"victim_comm":"pt_data_worker","oom_score_adj":0,"uid":0}),
            ),
            Record::Sample(Sample::Gpu { t_ns: 4000, gpus: vec![gpu] }),
        ];
        let t = build(lines);
        assert_eq!(t.processes[&11], "pt_data_worker");
        assert_eq!(t.slices[0].name, "memcg reclaim");
        assert_eq!((t.slices[0].start_ns, t.slices[0].dur_ns), (1300, 200));
        assert!(t.instants.iter().any(|i| i.pid == 11 && i.name == "OOM kill"));
        assert_eq!(
            t.counters[&(Track::Process(11), "rss_mib".to_string())].points,
            vec![(2000, 2.0)]
        );
        let swap = &t.counters[&(Track::Host, "job_swapout_pages_s".to_string())].points;
        assert_eq!(swap, &vec![(3000, 500.0 / 1e-6)]);
        assert_eq!(
            t.counters[&(Track::Host, "job_reclaim_io_mib_s".to_string())].points[0].1,
            2.0 / 1e-6
        );
        assert_eq!(t.counters[&(Track::Gpu(0), "util_pct".to_string())].points, vec![(4000, 0.0)]);
        assert_eq!(t.end_ns, 4000);
    }

    #[test]
    fn the_wait_for_data_is_drawn_per_second_from_the_wake_pairs() {
        let s = 1_000_000_000u64;
        let lines = vec![
            header(0),
            counters(s, vec![], vec![], vec![]),
            counters(
                2 * s,
                vec![],
                vec![],
                vec![wake(11, 10, 600_000_000, 1), wake(12, 10, 100_000_000, 1)],
            ),
            // Only the slow worker's pair changed; a smaller total (re-created after an exit)
            // is ignored.
            counters(
                4 * s,
                vec![],
                vec![],
                vec![wake(11, 10, 1_400_000_000, 1), wake(12, 10, 5, 1)],
            ),
        ];
        let t = build(lines.clone());
        let series =
            |pid, name: &str| t.counters[&(Track::Process(pid), name.to_string())].points.clone();
        assert_eq!(series(10, "data_wait_ms_s"), vec![(s, 700.0), (2 * s, 400.0)]);
        assert_eq!(series(11, "kept_waiting_ms_s"), vec![(s, 600.0), (2 * s, 400.0)]);
        assert_eq!(series(12, "kept_waiting_ms_s"), vec![(s, 100.0), (2 * s, 0.0)]);
        assert!(!t.counters.contains_key(&(Track::Process(10), "kept_waiting_ms_s".into())));
        let none = build(lines[..2].to_vec());
        assert!(none.counters.keys().all(|(_, n)| !n.contains("wait")), "no wakes, no tracks");
    }
}
