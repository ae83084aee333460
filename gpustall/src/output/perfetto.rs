//! Chrome trace-event JSON (the format ui.perfetto.dev and chrome://tracing open): a track per
//! traced process with its reclaim stalls as slices and its fork/exit/OOM kill/signals as
//! instants, counter tracks for RSS, GPU utilisation, swap, disk throughput and data_time.
//! The trainer's and ranks' wait for data (`data_wait_ms_s`) and each worker's share of it
//! (`kept_waiting_ms_s`) are per-second counters on their process tracks, the trainers and
//! ranks placed next to the GPUs; each long wait (10 ms or more) is also a slice on the waiting
//! thread with a flow arrow from the worker's wakeup that ended it.

use serde_json::{json, Value};

use crate::output::timeline::gpu_pid;
use crate::output::timeline::Timeline;
use crate::output::timeline::Track;
use crate::output::trace_event::{Binding, Phase, Scope, TraceEvent};

/// Pseudo-process holding host-wide counters.
const HOST_PID: u32 = 0x3fff_ffff;

/// Where a time falls on the trace's axis: microseconds after `start_ns`.
pub fn axis_from(start_ns: u64) -> impl Fn(u64) -> f64 {
    move |ns| ns.saturating_sub(start_ns) as f64 / 1e3
}

/// Every trace event of the timeline, one at a time.
#[cfg(test)]
fn for_each_event(t: &Timeline, mut emit: impl FnMut(TraceEvent)) {
    meta_events(t, &mut emit);
    mark_events(t, 0, &axis_from(t.start_ns), &mut emit);
}

/// A process track's name: its name, pid and rank.
pub fn process_label(t: &Timeline, pid: u32) -> String {
    let name = t.processes.get(&pid).map_or("", String::as_str);
    match t.ranks.get(&pid) {
        Some(rank) => format!("{name} ({pid}, rank {rank})"),
        None => format!("{name} ({pid})"),
    }
}

/// The name of the track `pid` of a trace: a process, a GPU or the host's counters.
pub fn track_label(t: &Timeline, pid: u64) -> String {
    let gpu = pid.checked_sub(u64::from(gpu_pid(0))).and_then(|i| u32::try_from(i).ok());
    match (u32::try_from(pid), gpu) {
        (Ok(HOST_PID), _) => "host / job totals".into(),
        (_, Some(i)) if t.gpus.contains_key(&i) => gpu_label(i, &t.gpus[&i]),
        (Ok(pid), _) => process_label(t, pid),
        (Err(_), _) => pid.to_string(),
    }
}

fn gpu_label(index: u32, name: &str) -> String {
    format!("GPU {index} ({name})")
}

/// The tracks' names and order: known whole only at the end of a recording.
pub fn meta_events(t: &Timeline, emit: &mut impl FnMut(TraceEvent)) {
    let name = |name: String| json!({ "name": name });
    let sort_index = |i: i64| json!({ "sort_index": i });
    for pid in t.processes.keys() {
        let p = u64::from(*pid);
        let e = TraceEvent::meta("process_name", p, name(process_label(t, *pid)));
        emit(TraceEvent { tid: Some(p), ..e });
    }
    for (i, gpu) in &t.gpus {
        let p = u64::from(gpu_pid(*i));
        emit(TraceEvent::meta("process_name", p, name(gpu_label(*i, gpu))));
        emit(TraceEvent::meta("process_sort_index", p, sort_index(-2)));
    }
    // Trainers and ranks that waited for data sit right under the GPUs, their wait next to
    // the GPU's utilisation.
    for (track, counter) in t.counters.keys() {
        if let (Track::Process(pid), "data_wait_ms_s") = (track, counter.as_str()) {
            emit(TraceEvent::meta("process_sort_index", u64::from(*pid), sort_index(-1)));
        }
    }
    let host = u64::from(HOST_PID);
    emit(TraceEvent::meta("process_name", host, name("host / job totals".into())));
    emit(TraceEvent::meta("process_sort_index", host, sort_index(-1)));
}

/// The slices, flows (numbered from `first_flow`), instants and counter points the timeline
/// holds, each placed on the trace's axis by `at`.
fn mark_events(
    t: &Timeline,
    first_flow: usize,
    at: &impl Fn(u64) -> f64,
    emit: &mut impl FnMut(TraceEvent),
) {
    for s in &t.slices {
        emit(TraceEvent {
            cat: Some("stall"),
            tid: Some(u64::from(s.tid)),
            ts: Some(at(s.start_ns)),
            dur: Some(s.dur_ns as f64 / 1e3),
            args: serde_json::to_value(&s.args).unwrap_or_default(),
            ..TraceEvent::new(Phase::Complete, &s.name, u64::from(s.pid))
        });
    }
    // Flow v1 events: "s" binds to the slice enclosing it on the waker's thread, "f" with
    // "bp": "e" to the slice enclosing it on the waiting thread.
    for (id, f) in t.flows.iter().enumerate().map(|(i, f)| (first_flow + i, f)) {
        let ((fp, ft, fts), (tp, tt, tts)) = (f.from, f.to);
        let flow = |ph, pid: u32, tid: u32, ts: u64| TraceEvent {
            cat: Some("data_wait"),
            tid: Some(u64::from(tid)),
            ts: Some(at(ts)),
            id: Some(id as u64),
            ..TraceEvent::new(ph, &f.name, u64::from(pid))
        };
        emit(flow(Phase::FlowStart, fp, ft, fts));
        emit(TraceEvent { bp: Some(Binding::Enclosing), ..flow(Phase::FlowEnd, tp, tt, tts) });
    }
    for i in &t.instants {
        let scope = if i.name == "OOM kill" { Scope::Global } else { Scope::Process };
        emit(TraceEvent {
            cat: Some("process"),
            tid: Some(u64::from(i.pid)),
            ts: Some(at(i.t_ns)),
            scope: Some(scope),
            args: i.args.clone(),
            ..TraceEvent::new(Phase::Instant, &i.name, u64::from(i.pid))
        });
    }
    for ((track, name), series) in &t.counters {
        let pid = match track {
            Track::Process(p) => *p,
            Track::Gpu(i) => gpu_pid(*i),
            Track::Host => HOST_PID,
        };
        for (ts, v) in &series.points {
            let mut e = TraceEvent::new(Phase::Counter, name, u64::from(pid));
            e.ts = Some(at(*ts));
            e.set_arg(name, json!(v));
            emit(e);
        }
    }
}

fn other_data(t: &Timeline) -> Value {
    json!({"tool": concat!("gpustall ", env!("CARGO_PKG_VERSION")), "verdict": t.verdict})
}

/// The trace as one JSON value: what the streamed trace must equal (the tests' reference).
#[cfg(test)]
pub fn render(t: &Timeline) -> Value {
    let mut ev = Vec::new();
    for_each_event(t, |e| ev.push(e));
    json!({"traceEvents": ev, "displayTimeUnit": "ms", "otherData": other_data(t)})
}

/// The trace of a recording's first `max_lines` lines written to `w` as they are read: each
/// record's slices, instants and counter points go out and are dropped, and only the tracks'
/// names are kept for the end. Memory does not grow with the recording (a timeline of a
/// 200 MB recording held whole took 4.4 GB).
pub fn write_recording(
    file: &std::path::Path,
    max_lines: usize,
    w: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    let mut out = EventWriter::start(w)?;
    let t = stream_marks(file, max_lines, |start, ns| axis_from(start)(ns), |_, e| out.event(&e))
        .map_err(|e| std::io::Error::other(format!("{e:#}")))?;
    meta_events(&t, &mut |e| out.event(&e));
    out.finish(&other_data(&t))
}

/// A recording's slices, flows, instants and counter points, read and handed to `emit` a
/// record at a time (with the timeline so far: its tracks' names), then dropped; `at` places a
/// time on the trace's axis, given the recording's start. Returns the timeline with only its
/// tracks' names left, for [`meta_events`].
pub fn stream_marks(
    file: &std::path::Path,
    max_lines: usize,
    at: impl Fn(u64, u64) -> f64,
    mut emit: impl FnMut(&Timeline, TraceEvent),
) -> anyhow::Result<Timeline> {
    let mut b = crate::output::timeline::Builder::default();
    let mut flows = 0;
    crate::recording::replay::for_each_record(file, max_lines, |r| {
        b.add(r);
        let start = b.t.start_ns;
        let t = &b.t;
        mark_events(t, flows, &|ns| at(start, ns), &mut |e| emit(t, e));
        flows += b.t.flows.len();
        b.t.clear_marks();
    })?;
    Ok(b.t)
}

/// A JSON array's elements written one at a time; the first error is kept.
pub struct EventWriter<'a> {
    w: &'a mut dyn std::io::Write,
    first: bool,
    result: std::io::Result<()>,
}

impl<'a> EventWriter<'a> {
    /// Opens the trace object and its event array.
    pub fn start(w: &'a mut dyn std::io::Write) -> std::io::Result<Self> {
        w.write_all(b"{\"traceEvents\":[")?;
        Ok(EventWriter { w, first: true, result: Ok(()) })
    }

    /// Closes the event array and the trace object, with its `otherData`.
    pub fn finish(self, other: &Value) -> std::io::Result<()> {
        self.result?;
        self.w.write_all(b"],\"displayTimeUnit\":\"ms\",\"otherData\":")?;
        serde_json::to_writer(&mut *self.w, other)?;
        self.w.write_all(b"}")
    }

    pub fn event(&mut self, e: &TraceEvent) {
        if self.result.is_err() {
            return;
        }
        let sep: &[u8] = if self.first { b"" } else { b"," };
        self.first = false;
        self.result = self
            .w
            .write_all(sep)
            .and_then(|()| serde_json::to_writer(&mut *self.w, e).map_err(Into::into));
    }
}

/// [`write_recording`] into the file `out`.
pub fn write_recording_file(
    file: &std::path::Path,
    max_lines: usize,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    crate::recording::files::write_private_with(out, |w| write_recording(file, max_lines, w))?;
    say!("gpustall: wrote {} (open it in https://ui.perfetto.dev)", out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::timeline::build;
    use crate::output::timeline::fixtures::{counters, header, line, wake};

    /// A recording streamed out a record at a time is the trace of the whole timeline: the same
    /// events (the tracks' names at the end instead of the start).
    #[test]
    fn a_streamed_recording_is_the_whole_timelines_trace() {
        let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/recording/testdata/trace-v1.jsonl");
        let whole = render(&crate::output::timeline::from_file(&file, usize::MAX).expect("read"));
        let mut streamed = Vec::new();
        write_recording(&file, usize::MAX, &mut streamed).expect("streamed");
        let streamed: Value = serde_json::from_slice(&streamed).expect("json");
        let sorted = |v: &Value| {
            let mut e: Vec<String> =
                v["traceEvents"].as_array().expect("events").iter().map(Value::to_string).collect();
            e.sort();
            e
        };
        assert!(sorted(&whole).len() > 100, "a real recording's events");
        assert_eq!(sorted(&streamed), sorted(&whole));
        assert_eq!(streamed["otherData"], whole["otherData"]);
    }

    #[test]
    fn slices_instants_and_counters_land_on_their_tracks() {
        let lines = vec![
            header(1000),
            line(
                json!({"type":"sample","kind":"seed","t_ns":1000,"pid":10,"ppid":1,"comm":"python","is_target":true}),
            ),
            line(
                json!({"type":"event","kind":"reclaim","t_ns":3000,"pid":10,"tid":12,"comm":"w","reclaim":"direct","start_ns":2000,"duration_ns":1000,"nr_reclaimed":8}),
            ),
            line(
                json!({"type":"event","kind":"oom_kill","t_ns":4000,"pid":10,"tid":10,"comm":"python","victim_pid":10,"victim_comm":"python","oom_score_adj":0,"uid":0}),
            ),
            line(
                json!({"type":"sample","kind":"proc_mem","t_ns":5000,"pid":10,"rss_kb":1024,"anon_kb":1024,"file_kb":0,"shmem_kb":0,"swap_kb":0,"hwm_kb":1024,"majflt":0}),
            ),
        ];
        let v = render(&build(lines));
        let ev = v["traceEvents"].as_array().expect("events");
        let slice = ev.iter().find(|e| e["ph"] == "X").expect("a slice");
        assert_eq!(
            (
                slice["pid"].as_u64(),
                slice["tid"].as_u64(),
                slice["ts"].as_f64(),
                slice["dur"].as_f64()
            ),
            (Some(10), Some(12), Some(1.0), Some(1.0))
        );
        let oom = ev.iter().find(|e| e["name"] == "OOM kill").expect("oom");
        assert_eq!((oom["ph"].as_str(), oom["pid"].as_u64()), (Some("i"), Some(10)));
        let rss = ev.iter().find(|e| e["ph"] == "C" && e["name"] == "rss_mib").expect("counter");
        assert_eq!(rss["args"]["rss_mib"], 1.0);
        assert!(ev.iter().any(|e| e["ph"] == "M" && e["args"]["name"] == "python (10)"));
    }

    #[test]
    fn the_wait_for_data_is_a_counter_on_the_trainer_placed_by_the_gpus() {
        let lines = vec![
            header(0),
            line(
                json!({"type":"sample","kind":"seed","t_ns":0,"pid":10,"ppid":1,"comm":"python","is_target":true}),
            ),
            counters(1_000_000_000, vec![], vec![], vec![wake(11, 10, 500_000_000, 3)]),
        ];
        let v = render(&build(lines));
        let ev = v["traceEvents"].as_array().expect("events");
        let wait = ev.iter().find(|e| e["name"] == "data_wait_ms_s").expect("a data-wait counter");
        assert_eq!((wait["ph"].as_str(), wait["pid"].as_u64()), (Some("C"), Some(10)));
        assert_eq!(wait["args"]["data_wait_ms_s"], 500.0);
        let kept = ev.iter().find(|e| e["name"] == "kept_waiting_ms_s").expect("the worker's");
        assert_eq!(kept["pid"], 11);
        assert!(ev.iter().any(|e| e["name"] == "process_sort_index" && e["pid"] == 10));
        assert!(!ev.iter().any(|e| e["ph"] == "s" || e["ph"] == "f"), "no long wait, no flow");
    }

    #[test]
    fn a_long_wait_is_a_slice_with_an_arrow_from_the_worker_that_ended_it() {
        let lines = vec![
            header(0),
            line(
                json!({"type":"event","kind":"data_wait","t_ns":90_000_000u64,"pid":11,"tid":11,"comm":"pt_data_worker",
                "wakee_pid":10,"wakee_tid":10,"start_ns":10_000_000u64,"duration_ns":80_000_000u64,"wait_class":"read"}),
            ),
        ];
        let v = render(&build(lines));
        let ev = v["traceEvents"].as_array().expect("events");
        let wait = ev.iter().find(|e| e["name"] == "waiting for data").expect("the wait");
        assert_eq!(wait["args"]["syscall"], "read", "the syscall it blocked in: {wait}");
        assert_eq!(
            (wait["pid"].as_u64(), wait["ts"].as_f64(), wait["dur"].as_f64()),
            (Some(10), Some(10_000.0), Some(80_000.0))
        );
        let blip = ev.iter().find(|e| e["ph"] == "X" && e["pid"] == 11).expect("the wakeup");
        let (s, f) = (
            ev.iter().find(|e| e["ph"] == "s").expect("flow start"),
            ev.iter().find(|e| e["ph"] == "f").expect("flow end"),
        );
        assert_eq!((s["pid"].as_u64(), s["ts"].as_f64()), (Some(11), blip["ts"].as_f64()));
        assert_eq!((f["pid"].as_u64(), f["id"].clone()), (Some(10), s["id"].clone()));
        let end = wait["ts"].as_f64().unwrap_or(0.0) + wait["dur"].as_f64().unwrap_or(0.0);
        let land = f["ts"].as_f64().unwrap_or(0.0);
        assert!(land < end && land > wait["ts"].as_f64().unwrap_or(0.0), "inside the wait: {land}");
    }
}
