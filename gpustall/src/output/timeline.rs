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

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub struct Slice {
    pub pid: u32,
    pub tid: u32,
    pub name: String,
    pub start_ns: u64,
    pub dur_ns: u64,
    pub args: Value,
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
}

/// Length of the slice drawn for a wakeup (an instant has no extent for an arrow to leave).
const WAKE_BLIP_NS: u64 = 1_000;

/// Job-wide cumulative counters, to turn into per-second rates.
#[derive(Default)]
struct Totals {
    io: BTreeMap<(u64, u64, u64, bool), (u64, u64)>, // (pid, dev, op, reclaim) -> (bytes, _)
    swapout: BTreeMap<u64, u64>,
    last: Option<(u64, u64, u64, u64)>, // t, read+write bytes, reclaim bytes, swapout pages
    /// (waker, wakee) -> ns of the wakee's waits the waker ended (cumulative).
    wakes: BTreeMap<(u32, u32), u64>,
    /// The per-process sums at the previous counters sample: trainer/rank -> its data wait,
    /// worker -> the waits it ended.
    waited: BTreeMap<u32, u64>,
    kept: BTreeMap<u32, u64>,
}

/// The timeline of a recording's lines (any recording: only the JSON is read).
#[cfg(test)]
pub fn build<'a>(lines: impl IntoIterator<Item = &'a Value>) -> Timeline {
    let mut b = Builder::default();
    for v in lines {
        b.add(v);
    }
    b.t
}

/// A timeline built one line at a time (a recording streamed from its file).
#[derive(Default)]
pub struct Builder {
    pub t: Timeline,
    totals: Totals,
}

impl Builder {
    pub fn add(&mut self, v: &Value) {
        let t = &mut self.t;
        let ts = v["t_ns"].as_u64().unwrap_or(0);
        t.end_ns = t.end_ns.max(ts);
        let pid = v["pid"].as_u64().unwrap_or(0) as u32;
        match v["type"].as_str() {
            Some("header") => {
                t.start_ns = v["start_ns"].as_u64().unwrap_or(0);
                t.end_ns = t.start_ns;
            }
            Some("event") => t.event(v, ts, pid),
            Some("sample") => t.sample(v, ts, pid, &mut self.totals),
            Some("summary") if v["final"] == true => t.verdict = Some(v["verdict"].clone()),
            _ => {}
        }
    }
}

/// The timeline of a recording file's first `max_lines` lines, streamed.
pub fn from_file(file: &std::path::Path, max_lines: usize) -> anyhow::Result<Timeline> {
    let mut b = Builder::default();
    crate::recording::replay::for_each_line(file, max_lines, |v| b.add(v))?;
    Ok(b.t)
}

impl Timeline {
    /// An event line: instants (fork, exit, OOM kill, signals) and slices (reclaim, GPU stall).
    fn event(&mut self, v: &Value, ts: u64, pid: u32) {
        match v["kind"].as_str() {
            Some("fork") => {
                let child = v["child_pid"].as_u64().unwrap_or(0) as u32;
                self.processes
                    .entry(child)
                    .or_insert_with(|| v["comm"].as_str().unwrap_or("?").to_string());
                self.instants.push(Instant {
                    pid,
                    name: format!("fork {child}"),
                    t_ns: ts,
                    args: Value::Null,
                });
            }
            Some("rename") if v["renamed_tid"] == v["pid"] => {
                self.processes.insert(pid, v["new_comm"].as_str().unwrap_or("?").to_string());
            }
            Some("exit") => {
                let what = match (v["exit_signal"].as_i64(), v["exit_code"].as_i64()) {
                    (Some(s), _) => format!("killed by signal {s}"),
                    (_, Some(c)) => format!("exit {c}"),
                    _ => "exit".into(),
                };
                self.instants.push(Instant { pid, name: what, t_ns: ts, args: Value::Null });
            }
            Some("oom_kill") => {
                let victim = v["victim_pid"].as_u64().unwrap_or(0) as u32;
                self.instants.push(Instant {
                    pid: victim,
                    name: "OOM kill".into(),
                    t_ns: ts,
                    args: v.clone(),
                });
            }
            Some("signal") => {
                let target = v["target_pid"].as_u64().unwrap_or(0) as u32;
                let name = format!(
                    "signal {} from {} ({})",
                    v["sig"],
                    v["pid"],
                    v["comm"].as_str().unwrap_or("?")
                );
                self.instants.push(Instant { pid: target, name, t_ns: ts, args: Value::Null });
            }
            Some("reclaim") => {
                let start = v["start_ns"].as_u64().unwrap_or(ts);
                self.slices.push(Slice {
                    pid,
                    tid: v["tid"].as_u64().unwrap_or(0) as u32,
                    name: format!("{} reclaim", v["reclaim"].as_str().unwrap_or("?")),
                    start_ns: start,
                    dur_ns: v["duration_ns"].as_u64().unwrap_or(0),
                    args: serde_json::json!({"nr_reclaimed": v["nr_reclaimed"]}),
                });
            }
            Some("data_wait") => self.data_wait(v, ts, pid),
            Some("gpu_stall") => {
                let gpu = v["gpu_index"].as_u64().unwrap_or(0) as u32;
                self.slices.push(Slice {
                pid: gpu_pid(gpu),
                tid: 0,
                name: "GPU stall".into(),
                start_ns: v["start_ns"].as_u64().unwrap_or(ts),
                dur_ns: v["duration_ns"].as_u64().unwrap_or(0),
                args: serde_json::json!({"throttle_reasons": v["throttle_reasons"], "pids": v["pids"]}),
            });
            }
            _ => {}
        }
    }

    /// A long wait for data: a slice on the waiting thread, a blip on the waker's thread (the
    /// wakeup: a flow needs a slice at each end) and the arrow between them. `waker` is the
    /// event's process (its header).
    fn data_wait(&mut self, v: &Value, ts: u64, waker: u32) {
        let field = |k: &str| v[k].as_u64().unwrap_or(0);
        let (wakee, wakee_tid, waker_tid) =
            (field("wakee_pid") as u32, field("wakee_tid") as u32, field("tid") as u32);
        let dur_ns = field("duration_ns");
        let start_ns = v["start_ns"].as_u64().unwrap_or(ts.saturating_sub(dur_ns));
        // Logical waits are sent from the wakee's context, with no comm: the waker's name is
        // the tree's.
        let comm = match v["comm"].as_str() {
            Some(c) if !c.is_empty() => c.to_string(),
            _ => self.processes.get(&waker).cloned().unwrap_or_default(),
        };
        let mut args =
            serde_json::json!({"waker_pid": waker, "waker_comm": comm, "ms": dur_ns as f64 / 1e6});
        // Of its blocks, those that ran out (timeouts) and the relay thread that passed the
        // batch on, where the kernel joined blocks into one wait.
        if let (Some(slices), Some(job)) = (v["slices"].as_u64(), v["job_wakes"].as_u64()) {
            args["blocks"] = slices.into();
            args["timeouts"] = slices.saturating_sub(job).into();
        }
        if let Some(relay) = v["relay_tid"].as_u64() {
            args["relay_tid"] = relay.into();
        }
        if let Some(co) = v["co_waker"].as_u64() {
            args["shared_with_pid"] = co.into();
        }
        // The syscall the wait blocked in (where the kernel read it): an ioctl is a driver's
        // wait (the GPU), not a batch.
        if let Some(class) = v["wait_class"].as_str() {
            args["syscall"] = class.into();
        }
        self.slices.push(Slice {
            pid: wakee,
            tid: wakee_tid,
            name: "waiting for data".into(),
            start_ns,
            dur_ns,
            args,
        });
        self.slices.push(Slice {
            pid: waker,
            tid: waker_tid,
            name: "delivered (woke the trainer)".into(),
            start_ns: ts,
            dur_ns: WAKE_BLIP_NS,
            args: serde_json::json!({"wakee_pid": wakee, "waited_ms": dur_ns as f64 / 1e6}),
        });
        // The arrow lands just inside the wait's end so that it binds to that slice.
        let land = start_ns + dur_ns.saturating_sub(WAKE_BLIP_NS);
        self.flows.push(Flow {
            from: (waker, waker_tid, ts),
            to: (wakee, wakee_tid, land),
            name: "batch".into(),
        });
    }

    /// A sample line: names (seeds) and counter series.
    fn sample(&mut self, v: &Value, ts: u64, pid: u32, totals: &mut Totals) {
        match v["kind"].as_str() {
            Some("seed") => {
                self.processes.insert(pid, v["comm"].as_str().unwrap_or("?").to_string());
            }
            Some("proc_mem") => {
                self.point(
                    Track::Process(pid),
                    "rss_mib",
                    ts,
                    v["rss_kb"].as_f64().unwrap_or(0.0) / 1024.0,
                );
                self.point(
                    Track::Process(pid),
                    "swap_mib",
                    ts,
                    v["swap_kb"].as_f64().unwrap_or(0.0) / 1024.0,
                );
                let held =
                    v["rss_kb"].as_f64().unwrap_or(0.0) + v["swap_kb"].as_f64().unwrap_or(0.0);
                self.point(Track::Process(pid), "held_mib", ts, held / 1024.0);
            }
            Some("gpu") => {
                for g in v["gpus"].as_array().into_iter().flatten() {
                    let i = g["index"].as_u64().unwrap_or(0) as u32;
                    self.gpus
                        .entry(i)
                        .or_insert_with(|| g["name"].as_str().unwrap_or("GPU").to_string());
                    if let Some(u) = g["util_gpu_pct"].as_f64() {
                        self.point(Track::Gpu(i), "util_pct", g["t_ns"].as_u64().unwrap_or(ts), u);
                    }
                    if let Some(c) = g["temperature_c"].as_f64() {
                        self.point(
                            Track::Gpu(i),
                            "temperature_c",
                            g["t_ns"].as_u64().unwrap_or(ts),
                            c,
                        );
                    }
                }
            }
            Some("counters") => totals.add(v, ts, self),
            Some("context") => {
                if let Some(h) = v["host"].as_object() {
                    let used = h["swap_total_kb"].as_f64().unwrap_or(0.0)
                        - h["swap_free_kb"].as_f64().unwrap_or(0.0);
                    self.point(Track::Host, "swap_used_mib", ts, used / 1024.0);
                    self.point(
                        Track::Host,
                        "mem_available_mib",
                        ts,
                        h["mem_available_kb"].as_f64().unwrap_or(0.0) / 1024.0,
                    );
                }
                if let Some(u) = v["cgroup"]["usage_bytes"].as_f64() {
                    self.point(Track::Host, "cgroup_usage_mib", ts, u / 1048576.0);
                }
            }
            Some("train_step") => {
                if let Some(d) = v["data_time_s"].as_f64() {
                    self.point(Track::Host, "data_time_s", ts, d);
                }
            }
            _ => {}
        }
    }
}

/// GPUs get pseudo-pids far above real ones, so their tracks never collide with a process.
pub fn gpu_pid(index: u32) -> u32 {
    0x4000_0000 + index
}

impl Totals {
    fn add(&mut self, v: &Value, ts: u64, t: &mut Timeline) {
        for r in v["io"].as_array().into_iter().flatten() {
            let key = (
                r["pid"].as_u64().unwrap_or(0),
                r["dev"].as_u64().unwrap_or(0),
                r["op"].as_u64().unwrap_or(0),
                r["in_reclaim"] == true,
            );
            self.io.insert(key, (r["bytes"].as_u64().unwrap_or(0), 0));
        }
        for p in v["procs"].as_array().into_iter().flatten() {
            self.swapout.insert(
                p["pid"].as_u64().unwrap_or(0),
                // Older recordings name it swapout_anon_folios (it counted one per folio).
                p.get("swapout_anon_pages")
                    .or_else(|| p.get("swapout_anon_folios"))
                    .and_then(Value::as_u64)
                    .unwrap_or(0),
            );
        }
        self.wait_rates(v, ts, t);
        let bytes: u64 = self.io.values().map(|v| v.0).sum();
        let reclaim: u64 = self.io.iter().filter(|(k, _)| k.3).map(|(_, v)| v.0).sum();
        let swap: u64 = self.swapout.values().sum();
        if let Some((t0, b0, r0, s0)) = self.last {
            let dt = ts.saturating_sub(t0).max(1) as f64 / 1e9;
            t.point(
                Track::Host,
                "job_disk_mib_s",
                ts,
                bytes.saturating_sub(b0) as f64 / 1048576.0 / dt,
            );
            t.point(
                Track::Host,
                "job_reclaim_io_mib_s",
                ts,
                reclaim.saturating_sub(r0) as f64 / 1048576.0 / dt,
            );
            t.point(Track::Host, "job_swapout_pages_s", ts, swap.saturating_sub(s0) as f64 / dt);
        }
        self.last = Some((ts, bytes, reclaim, swap));
    }

    /// The wait for data per second: for each trainer/rank (the wakees of the kernel's wake
    /// pairs) the waits that other processes ended, for each worker (the wakers) the waits it
    /// ended. Each point is the rate over the interval that starts at it (since the previous
    /// counters sample), so a counter track shows it over the second it measures. Nothing is
    /// drawn for a recording without wake pairs.
    fn wait_rates(&mut self, v: &Value, ts: u64, t: &mut Timeline) {
        for w in v["wakes"].as_array().into_iter().flatten() {
            let key =
                (w["waker"].as_u64().unwrap_or(0) as u32, w["wakee"].as_u64().unwrap_or(0) as u32);
            let ns = w["ns"].as_u64().unwrap_or(0);
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_and_samples_become_tracks() {
        let lines = vec![
            json!({"type":"header","start_ns":1000}),
            json!({"type":"sample","kind":"seed","t_ns":1000,"pid":10,"ppid":1,"comm":"python","is_target":true}),
            json!({"type":"event","kind":"fork","t_ns":1100,"pid":10,"tid":10,"comm":"python","child_pid":11}),
            json!({"type":"event","kind":"rename","t_ns":1200,"pid":11,"tid":11,"comm":"python","renamed_tid":11,"new_comm":"pt_data_worker"}),
            json!({"type":"event","kind":"reclaim","t_ns":1500,"pid":11,"tid":11,"comm":"w","reclaim":"memcg","start_ns":1300,"duration_ns":200,"nr_reclaimed":32}),
            json!({"type":"sample","kind":"proc_mem","t_ns":2000,"pid":11,"rss_kb":2048,"swap_kb":1024}),
            json!({"type":"sample","kind":"counters","t_ns":2000,"procs":[{"pid":11,"swapout_anon_folios":0}],"io":[]}),
            json!({"type":"sample","kind":"counters","t_ns":3000,"procs":[{"pid":11,"swapout_anon_pages":500}],"io":[{"pid":11,"dev":1,"op":1,"in_reclaim":true,"bytes":2097152}]}),
            json!({"type":"event","kind":"oom_kill","t_ns":4000,"pid":10,"tid":10,"comm":"python","victim_pid":11}),
            json!({"type":"sample","kind":"gpu","t_ns":4000,"gpus":[{"index":0,"name":"H200","t_ns":4000,"util_gpu_pct":0}]}),
        ];
        let t = build(&lines);
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
        let wake = |waker: u32, ns: u64| json!({"waker": waker, "wakee": 10, "count": 1, "ns": ns, "max_ns": ns, "hist": []});
        let lines = vec![
            json!({"type":"header","start_ns":0}),
            json!({"type":"sample","kind":"counters","t_ns":s,"procs":[],"io":[]}),
            json!({"type":"sample","kind":"counters","t_ns":2 * s,"procs":[],"io":[],"wakes":[wake(11, 600_000_000), wake(12, 100_000_000)]}),
            // Only the slow worker's pair changed; a smaller total (re-created after an exit)
            // is ignored.
            json!({"type":"sample","kind":"counters","t_ns":4 * s,"procs":[],"io":[],"wakes":[wake(11, 1_400_000_000), wake(12, 5)]}),
        ];
        let t = build(&lines);
        let series =
            |pid, name: &str| t.counters[&(Track::Process(pid), name.to_string())].points.clone();
        assert_eq!(series(10, "data_wait_ms_s"), vec![(s, 700.0), (2 * s, 400.0)]);
        assert_eq!(series(11, "kept_waiting_ms_s"), vec![(s, 600.0), (2 * s, 400.0)]);
        assert_eq!(series(12, "kept_waiting_ms_s"), vec![(s, 100.0), (2 * s, 0.0)]);
        assert!(!t.counters.contains_key(&(Track::Process(10), "kept_waiting_ms_s".into())));
        let none = build(&lines[..2]);
        assert!(none.counters.keys().all(|(_, n)| !n.contains("wait")), "no wakes, no tracks");
    }
}
