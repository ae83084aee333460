//! What `gpustall merge` writes: the recordings of several nodes on one wall-clock timeline.
//! The page and the trace are the single-recording ones ([`html`], [`perfetto`]) drawn per node
//! on a shared time axis, under the job-level verdict.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::json;

use crate::diagnose::job_verdict::{self, JobVerdict, OnsetKind, Source};
use crate::output::html::{self, esc};
use crate::output::perfetto;
use crate::output::summary::Summary;
use crate::output::timeline::Timeline;
use crate::output::trace_event::{Phase, Scope, TraceEvent};

/// One node (one recording) of the merge, its timeline already on the wall clock.
pub struct Lane {
    pub source: Source,
    pub file: String,
    pub mode: String,
    pub summary: Summary,
    /// The recording's timeline on the wall clock: whole for the HTML page, else its tracks'
    /// names only (a Perfetto trace is streamed from `recording`).
    pub timeline: Timeline,
    /// The recording's file and how many of its lines the replay took.
    pub recording: std::path::PathBuf,
    pub lines: usize,
}

/// Puts a recording's timeline on the wall clock: every time is mapped through `wall`.
pub fn to_wall(t: &mut Timeline, wall: impl Fn(u64) -> u64) {
    t.start_ns = wall(t.start_ns);
    t.end_ns = wall(t.end_ns);
    for s in &mut t.slices {
        s.start_ns = wall(s.start_ns);
    }
    for i in &mut t.instants {
        i.t_ns = wall(i.t_ns);
    }
    for f in &mut t.flows {
        f.from.2 = wall(f.from.2);
        f.to.2 = wall(f.to.2);
    }
    for series in t.counters.values_mut() {
        for p in &mut series.points {
            p.0 = wall(p.0);
        }
    }
}

/// A copy of a wall-clock timeline drawn from `t0` to `t1`: every node on the same axis.
fn on_axis(tl: &Timeline, t0: u64, t1: u64) -> Timeline {
    Timeline {
        start_ns: t0,
        end_ns: t1,
        processes: tl.processes.clone(),
        gpus: tl.gpus.clone(),
        ranks: tl.ranks.clone(),
        slices: tl.slices.clone(),
        instants: tl.instants.clone(),
        flows: tl.flows.clone(),
        counters: tl.counters.clone(),
        verdict: None,
    }
}

/// The span of the whole job, wall clock: the earliest start to the latest end.
pub fn span(lanes: &[Lane]) -> (u64, u64) {
    let t0 = lanes.iter().map(|l| l.source.wall_start_ns).min().unwrap_or(0);
    let t1 = lanes.iter().map(|l| l.source.wall_end()).max().unwrap_or(t0);
    (t0, t1.max(t0 + 1))
}

/// `--summary-json` of a merge.
#[derive(Serialize)]
pub struct JobSummary<'a> {
    #[serde(rename = "type")]
    pub record_type: &'static str,
    /// The job's start (the earliest recording's), ns since the epoch, and as a date.
    pub wall_clock_at_start_ns: u64,
    pub start: String,
    pub duration_s: f64,
    pub max_skew_s: f64,
    pub verdict: &'a JobVerdict,
    /// Where the recordings disagree on facts they share.
    pub warnings: &'a [String],
    pub nodes: Vec<NodeSummary<'a>>,
}

#[derive(Serialize)]
pub struct NodeSummary<'a> {
    pub label: &'a str,
    pub file: &'a str,
    pub host: &'a str,
    pub kernel: &'a str,
    /// `trace` or `watch` (an incident bundle).
    pub mode: &'a str,
    pub wall_clock_at_start_ns: u64,
    /// Its start after the job's start.
    pub offset_s: f64,
    pub duration_s: f64,
    pub onsets: Vec<OnsetSummary<'a>>,
    /// The node's own summary, as `gpustall report` writes it.
    pub summary: &'a Summary,
}

#[derive(Serialize)]
pub struct OnsetSummary<'a> {
    pub wall_clock_ns: u64,
    pub after_job_start_s: f64,
    pub kind: OnsetKind,
    pub pid: u32,
    pub what: &'a str,
}

pub fn summary<'a>(
    lanes: &'a [Lane],
    verdict: &'a JobVerdict,
    warnings: &'a [String],
    max_skew_ns: u64,
) -> JobSummary<'a> {
    let (t0, t1) = span(lanes);
    let secs = |a: u64, b: u64| a.saturating_sub(b) as f64 / 1e9;
    JobSummary {
        record_type: "job_summary",
        wall_clock_at_start_ns: t0,
        start: job_verdict::date_time(t0),
        duration_s: secs(t1, t0),
        max_skew_s: max_skew_ns as f64 / 1e9,
        verdict,
        warnings,
        nodes: lanes
            .iter()
            .map(|l| {
                let s = &l.source;
                NodeSummary {
                    label: &s.label,
                    file: &l.file,
                    host: &s.host,
                    kernel: &s.kernel,
                    mode: &l.mode,
                    wall_clock_at_start_ns: s.wall_start_ns,
                    offset_s: secs(s.wall_start_ns, t0),
                    duration_s: secs(s.wall_end(), s.wall_start_ns),
                    onsets: s
                        .onsets
                        .iter()
                        .map(|o| OnsetSummary {
                            wall_clock_ns: s.wall(o.t_ns),
                            after_job_start_s: secs(s.wall(o.t_ns), t0),
                            kind: o.kind,
                            pid: o.pid,
                            what: &o.what,
                        })
                        .collect(),
                    summary: &l.summary,
                }
            })
            .collect(),
    }
}

/// The terminal report: one line per node, then the job's verdict and what to mistrust.
pub fn text(lanes: &[Lane], v: &JobVerdict, warnings: &[String]) -> String {
    let (t0, t1) = span(lanes);
    let mut o = format!(
        "gpustall merge: {} recordings, {} .. {} (UTC)\n\n",
        lanes.len(),
        job_verdict::date_time(t0),
        job_verdict::clock_time(t1)
    );
    let width = lanes.iter().map(|l| l.source.label.len()).max().unwrap_or(4);
    for l in lanes {
        let s = &l.source;
        let first = s.first_onset().map_or("no stall".to_string(), |(t, o)| {
            format!("first stall {} {}", job_verdict::clock_time(t), o.what)
        });
        let _ = writeln!(
            o,
            "  {:width$}  {} +{:.1} s  kernel {}  {}: {}",
            s.label,
            job_verdict::clock_time(s.wall_start_ns),
            (s.wall_end() - s.wall_start_ns) as f64 / 1e9,
            s.kernel,
            s.verdict.cause,
            first
        );
    }
    let _ = write!(o, "\nJOB VERDICT: {}\n\n{}\n", v.text, v.clock);
    for w in warnings {
        let _ = writeln!(o, "warning: {w}");
    }
    o
}

/// One HTML page: the job's verdict, a lane per node on the shared time axis (its recording
/// span and its stalls), then each node's own report with its charts on that same axis.
pub fn html_page(lanes: &[Lane], v: &JobVerdict, warnings: &[String]) -> String {
    let (t0, t1) = span(lanes);
    let mut o = format!(
        r#"<h1>gpustall merge: <span class="cause">{}</span></h1><p>{}</p><p><small>{} Time 0 is {}.</small></p>"#,
        esc(v.first.as_deref().unwrap_or("no node stalled")),
        esc(&v.text),
        esc(&v.clock),
        esc(&job_verdict::date_time(t0))
    );
    if !warnings.is_empty() {
        o.push_str("<h2>The recordings disagree</h2><ul>");
        for w in warnings {
            let _ = write!(o, "<li>{}</li>", esc(w));
        }
        o.push_str("</ul>");
    }
    o.push_str("<h2>Nodes</h2>");
    o.push_str(&lanes_svg(lanes, t0, t1));
    for l in lanes {
        let t = on_axis(&l.timeline, t0, t1);
        let _ = write!(
            o,
            r#"<section><h1>{}: <span class="cause">{}</span></h1><p><small>{}, kernel {}, {}</small></p>"#,
            esc(&l.source.label),
            esc(l.source.verdict.cause.as_str()),
            esc(&l.file),
            esc(&l.source.kernel),
            esc(&l.mode)
        );
        o.push_str(&html::body(&l.summary, &t));
        o.push_str("</section>");
    }
    html::page(&format!("merge of {} nodes", lanes.len()), &o)
}

const LANE_H: f64 = 28.0;
const LANE_LEFT: f64 = 170.0;
const LANE_W: f64 = 1000.0;

fn onset_color(k: OnsetKind) -> &'static str {
    match k {
        OnsetKind::OomKill => "#d62728",
        OnsetKind::Signal => "#9467bd",
        OnsetKind::GpuStall => "#ff7f0e",
        OnsetKind::AbnormalExit => "#333",
    }
}

/// A lane per node: its recording as a bar, each stall a mark (hover for what it was).
fn lanes_svg(lanes: &[Lane], t0: u64, t1: u64) -> String {
    let x = |t: u64| {
        LANE_LEFT + t.saturating_sub(t0) as f64 / (t1 - t0) as f64 * (LANE_W - LANE_LEFT - 10.0)
    };
    let height = LANE_H * lanes.len() as f64 + 20.0;
    let mut s = format!(
        r##"<svg viewBox="0 0 {LANE_W} {height}" width="100%" role="img" aria-label="nodes">"##
    );
    for (i, l) in lanes.iter().enumerate() {
        let y = LANE_H * i as f64;
        let src = &l.source;
        let _ = write!(
            s,
            r##"<text x="{}" y="{:.1}" font-size="12" text-anchor="end">{}</text><rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#dde8f3"/>"##,
            LANE_LEFT - 6.0,
            y + 17.0,
            esc(&src.label),
            x(src.wall_start_ns),
            y + 6.0,
            (x(src.wall_end()) - x(src.wall_start_ns)).max(1.0),
            LANE_H - 12.0
        );
        for o in &src.onsets {
            let _ = write!(
                s,
                r##"<rect x="{:.1}" y="{:.1}" width="3" height="{:.1}" fill="{}"><title>{} {}</title></rect>"##,
                x(src.wall(o.t_ns)) - 1.5,
                y + 3.0,
                LANE_H - 6.0,
                onset_color(o.kind),
                esc(&job_verdict::clock_time(src.wall(o.t_ns))),
                esc(&o.what)
            );
        }
    }
    let _ = write!(
        s,
        r##"<text x="{LANE_LEFT}" y="{:.1}" font-size="10">{}</text><text x="{}" y="{:.1}" font-size="10" text-anchor="end">{}</text></svg><p><small>red: OOM kill, purple: fatal signal, orange: GPU stall, black: a process failed</small></p>"##,
        height - 4.0,
        esc(&job_verdict::clock_time(t0)),
        LANE_W - 10.0,
        height - 4.0,
        esc(&job_verdict::clock_time(t1))
    );
    s
}

/// One Perfetto trace written as it is made: a process group per node, each of its processes
/// (and its GPU and host tracks) a thread in it, on the shared wall-clock axis. Each recording
/// is read again from its file and its events go out as they are read, so memory does not grow
/// with the recordings (holding every lane's trace took 5.2 GB for a 200 MB recording).
pub fn write_perfetto(
    lanes: &[Lane],
    v: &JobVerdict,
    w: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    let (t0, _) = span(lanes);
    let mut out = perfetto::EventWriter::start(w)?;
    for (k, l) in lanes.iter().enumerate() {
        let group = k as u64 + 1;
        let name = format!("{} ({}, {})", l.source.label, l.source.verdict.cause, l.source.kernel);
        out.event(&TraceEvent::meta("process_name", group, json!({ "name": name })));
        out.event(&TraceEvent::meta("process_sort_index", group, json!({ "sort_index": k })));
        // Counters are named after their track's final name (the lane's timeline holds the
        // tracks): a process renamed by exec keeps one counter track.
        let at = |_, ns| l.source.wall(ns).saturating_sub(t0) as f64 / 1e3;
        let t = perfetto::stream_marks(&l.recording, l.lines, at, |_, e| {
            let name = perfetto::track_label(&l.timeline, e.pid);
            out.event(&regroup(e, group, &name));
        })?;
        perfetto::meta_events(&t, &mut |e| out.event(&regroup(e, group, "")));
    }
    if let Some(first) = v.order.first() {
        let group = lanes.iter().position(|l| Some(&l.source.label) == v.first.as_ref());
        let name = format!("first stall: {}", first.label);
        out.event(&TraceEvent {
            tid: Some(0),
            ts: Some(first.onset_wall_ns.saturating_sub(t0) as f64 / 1e3),
            scope: Some(Scope::Global),
            args: json!({ "text": v.text }),
            ..TraceEvent::new(Phase::Instant, name, group.map_or(1, |g| g as u64 + 1))
        });
    }
    out.finish(&json!({"tool": concat!("gpustall ", env!("CARGO_PKG_VERSION")),
            "job_verdict": v.text, "time_zero": job_verdict::date_time(t0)}))?;
    Ok(())
}

/// One recording's trace event moved into process `group`: its processes become threads, its
/// counters are named after `track`, the track they were on (counters belong to a process).
fn regroup(mut e: TraceEvent, group: u64, track_name: &str) -> TraceEvent {
    let track = e.pid;
    e.pid = group;
    match e.ph {
        Phase::Metadata => {
            let sort = e.name == "process_sort_index";
            e.name = if sort { "thread_sort_index" } else { "thread_name" }.into();
            e.tid = Some(track);
        }
        Phase::Counter => e.name = format!("{track_name} {}", e.name),
        Phase::Complete => {
            e.set_arg("tid", json!(e.tid));
            e.tid = Some(track);
        }
        Phase::FlowStart | Phase::FlowEnd => {
            // Flow ids are trace-wide: the lane's number keeps them apart.
            e.id = Some((group << 32) | e.id.unwrap_or(0));
            e.tid = Some(track);
        }
        Phase::Instant => {
            e.tid = Some(track);
            if e.scope == Some(Scope::Process) {
                e.scope = Some(Scope::Thread);
            }
        }
    }
    e
}
