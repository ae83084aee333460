//! `gpustall report FILE --html OUT`: one self-contained page (no scripts, no network): the
//! verdict, evidence and advice, then a timeline drawn as inline SVG (GPU utilisation, the
//! long waits for data over their time, a lane per waiting thread (`waits`), the trainer's and
//! ranks' wait for data per second and the workers that kept them waiting, memory held per
//! process, reclaim stalls, swap and disk rates, data_time) with the OOM kill marked, who kept
//! the trainer waiting (each worker's share) and the processes (`tables`), and flame graphs of
//! the Python stacks (`flame`: the only scripts, inferno's, each in a frame of its own).

use std::fmt::Write as _;

mod flame;
mod tables;
mod waits;

use crate::output::summary::Summary;
use crate::output::timeline::Timeline;
use crate::output::timeline::Track;

const W: f64 = 1000.0;
/// A line chart's plot height, in the SVG's units.
const PLOT_H: f64 = 120.0;
const LEFT: f64 = 70.0;
const COLORS: [&str; 8] =
    ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"];

/// Text for the page: markup escaped, and control characters (a process name may hold ESC or
/// BEL) shown as `\xNN` like everywhere else (`model::untrusted`).
pub fn esc(s: &str) -> String {
    crate::model::untrusted::lines(s)
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

struct Axis {
    t0: u64,
    t1: u64,
}

impl Axis {
    fn x(&self, t: u64) -> f64 {
        LEFT + (t.saturating_sub(self.t0) as f64 / self.t1.saturating_sub(self.t0).max(1) as f64)
            * (W - LEFT - 10.0)
    }
}

/// What every chart of a page shares: the time axis, the OOM-kill marks, the GPU-stall spans.
struct Frame {
    axis: Axis,
    marks: Vec<(u64, String)>,
    spans: Vec<(u64, u64)>,
}

/// A chart's vertical layout: the plot, the time labels below.
struct Layout {
    top: f64,
    bottom: f64,
    height: f64,
}

impl Layout {
    /// A plot `plot_height` high under a small margin, with room for the time labels.
    fn of(plot_height: f64) -> Self {
        let top = 8.0;
        Layout { top, bottom: top + plot_height, height: top + plot_height + 20.0 }
    }
}

/// A chart's title, its legend (HTML: entries wrap to the page's width instead of running
/// into each other) and the opening of its SVG.
fn chart_head(s: &mut String, title: &str, legend: &[(&str, &str)], l: &Layout) {
    let _ = write!(s, r#"<h3>{}</h3><div class="legend">"#, esc(title));
    for (label, color) in legend {
        let _ = write!(s, r#"<span><i style="background:{color}"></i>{}</span>"#, esc(label));
    }
    let _ = write!(
        s,
        r##"</div><svg class="chart" viewBox="0 0 {W} {}" width="100%" role="img" aria-label="{}">"##,
        l.height,
        esc(title)
    );
}

/// The colour of the `i`th series (or worker) of a chart.
fn color(i: usize) -> &'static str {
    COLORS[i % COLORS.len()]
}

/// A line chart of several series, with vertical markers (OOM kills) and shaded spans (stalls).
fn chart(title: &str, unit: &str, series: &[(String, &[(u64, f64)])], f: &Frame) -> String {
    let max =
        series.iter().flat_map(|(_, p)| p.iter().map(|v| v.1)).fold(0.0f64, f64::max).max(1e-9);
    let l = Layout::of(PLOT_H);
    let legend: Vec<(&str, &str)> =
        series.iter().enumerate().map(|(i, (label, _))| (label.as_str(), color(i))).collect();
    let mut s = String::new();
    chart_head(&mut s, title, &legend, &l);
    plot_area(&mut s, f, &l);
    y_labels(&mut s, &l, max, unit);
    time_ticks(&mut s, &f.axis, &l);
    lines(&mut s, series, &f.axis, &l, max);
    marks(&mut s, f, &l);
    s.push_str("</svg>");
    s
}

/// The width an OOM kill's label takes (`OOM kill` and a pid of up to 7 digits at 11 units),
/// and the height of a row of them.
const MARK_LABEL_W: f64 = 110.0;
const MARK_ROW_H: f64 = 13.0;

/// The OOM kills as vertical lines, each labelled on the side that keeps the label inside the
/// plot (to the right of a mark in the plot's left half, to the left of one in its right half),
/// labels that would cover each other (kills within a second of each other) in rows below.
fn marks(s: &mut String, f: &Frame, l: &Layout) {
    let middle = (LEFT + W - 10.0) / 2.0;
    let xs: Vec<f64> = f.marks.iter().map(|(t, _)| f.axis.x(*t)).collect();
    let spans: Vec<(f64, f64)> = xs
        .iter()
        .map(
            |&x| if x > middle { (x - 3.0 - MARK_LABEL_W, x) } else { (x, x + 3.0 + MARK_LABEL_W) },
        )
        .collect();
    let rows = label_rows(&spans, ((l.bottom - l.top - 2.0) / MARK_ROW_H).max(1.0) as usize);
    for (((_, label), x), row) in f.marks.iter().zip(xs).zip(rows) {
        let (tx, anchor) = if x > middle { (x - 3.0, "end") } else { (x + 3.0, "start") };
        let _ = write!(
            s,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{}" y2="{}" stroke="#d62728" stroke-width="2"/><text class="mark" x="{tx:.1}" y="{:.1}" font-size="11" fill="#d62728" text-anchor="{anchor}">{}</text>"##,
            l.top,
            l.bottom,
            l.top + 12.0 + MARK_ROW_H * row as f64,
            esc(label)
        );
    }
}

/// A row for each label's (left, right) extent: the first of `rows` where it covers no label
/// already there, or (none free) the rows in turn.
fn label_rows(spans: &[(f64, f64)], rows: usize) -> Vec<usize> {
    let mut placed: Vec<Vec<(f64, f64)>> = vec![Vec::new(); rows.max(1)];
    let mut out = Vec::with_capacity(spans.len());
    for (i, &(a, b)) in spans.iter().enumerate() {
        let free = placed.iter().position(|row| row.iter().all(|&(c, d)| b <= c || d <= a));
        let row = free.unwrap_or(i % placed.len());
        placed[row].push((a, b));
        out.push(row);
    }
    out
}

/// The plot's background and the stall spans.
fn plot_area(s: &mut String, f: &Frame, l: &Layout) {
    let (top, bottom) = (l.top, l.bottom);
    let _ = write!(
        s,
        r##"<rect class="plot" x="{LEFT}" y="{top}" width="{}" height="{}" fill="#fafafa" stroke="#ccc"/>"##,
        W - LEFT - 10.0,
        bottom - top
    );
    for (a, b) in &f.spans {
        let _ = write!(
            s,
            r##"<rect x="{:.1}" y="{top}" width="{:.1}" height="{}" fill="#f4cccc" opacity="0.7"><title>GPU stall</title></rect>"##,
            f.axis.x(*a),
            (f.axis.x(*b) - f.axis.x(*a)).max(1.0),
            bottom - top
        );
    }
}

/// The y labels: the top of the scale, its unit, and 0.
fn y_labels(s: &mut String, l: &Layout, max: f64, unit: &str) {
    let (top, bottom) = (l.top, l.bottom);
    let _ = write!(
        s,
        r##"<text x="{}" y="{:.1}" font-size="11" text-anchor="end">{}</text><text x="{}" y="{:.1}" font-size="11" text-anchor="end">{}</text><text x="{}" y="{}" font-size="11" text-anchor="end">0</text>"##,
        LEFT - 4.0,
        top + 10.0,
        compact(max),
        LEFT - 4.0,
        top + 22.0,
        esc(unit),
        LEFT - 4.0,
        bottom + 4.0
    );
}

fn tick_step(secs: f64) -> f64 {
    [1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0]
        .into_iter()
        .find(|s| secs / s <= 10.0)
        .unwrap_or_else(|| (secs / 10.0 / 3600.0).ceil() * 3600.0)
}

/// Time ticks at a round step giving at most 10 of them, however long the span (a step in
/// whole hours past 10 hours: a fixed last step drew millions of ticks on a crafted span).
fn time_ticks(s: &mut String, axis: &Axis, l: &Layout) {
    let secs = axis.t1.saturating_sub(axis.t0) as f64 / 1e9;
    let step = tick_step(secs);
    let mut tick = 0.0;
    while tick <= secs + 1e-9 {
        let x = axis.x(axis.t0 + (tick * 1e9) as u64);
        let _ = write!(
            s,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{}" y2="{}" stroke="#999"/><text x="{x:.1}" y="{}" font-size="10" text-anchor="middle">{tick:.0}s</text>"##,
            l.bottom,
            l.bottom + 4.0,
            l.height - 4.0
        );
        tick += step;
    }
}

/// One polyline (or a dot) per series.
fn lines(s: &mut String, series: &[(String, &[(u64, f64)])], axis: &Axis, l: &Layout, max: f64) {
    let y = |v: f64| l.bottom - (v / max) * (l.bottom - l.top);
    for (i, (label, points)) in series.iter().enumerate() {
        let color = color(i);
        let d = steps(points, |t| axis.x(t), y);
        if d.len() == 1 {
            let _ = write!(
                s,
                r##"<circle cx="{}" r="2" fill="{color}"/>"##,
                d[0].replace(',', "\" cy=\"")
            );
        } else if !d.is_empty() {
            let _ = write!(
                s,
                r##"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"><title>{}</title></polyline>"##,
                d.join(" "),
                esc(label)
            );
        }
    }
}

/// A sampled series as steps: each value holds over the interval that ends at its sample (a
/// rate is per the second before it; a level was reached by then), so a burst between two
/// sparse samples is not drawn as a ramp over the seconds that follow it.
fn steps(points: &[(u64, f64)], x: impl Fn(u64) -> f64, y: impl Fn(f64) -> f64) -> Vec<String> {
    let mut d = Vec::with_capacity(points.len() * 2);
    let mut prev_x = None;
    for &(t, v) in points {
        let (px, py) = (x(t), y(v));
        if let Some(from) = prev_x {
            d.push(format!("{from:.1},{py:.1}"));
        }
        d.push(format!("{px:.1},{py:.1}"));
        prev_x = Some(px);
    }
    d
}

/// 1234567 -> "1.2M": axis labels that fit.
fn compact(v: f64) -> String {
    match v {
        v if v >= 1e6 => format!("{:.1}M", v / 1e6),
        v if v >= 1e4 => format!("{:.0}k", v / 1e3),
        v if v >= 10.0 => format!("{v:.0}"),
        v => format!("{v:.2}"),
    }
}

/// The page: verdict, evidence and advice, the timeline charts, the table of processes.
pub fn render(summary: &Summary, t: &Timeline) -> String {
    let c = summary.verdict.cause;
    let severity = match c.severity() {
        crate::diagnose::verdict::Severity::Failure => "failure",
        crate::diagnose::verdict::Severity::Slowdown => "slowdown",
        crate::diagnose::verdict::Severity::Clear => "clear",
    };
    let mut heading = format!(
        r#"<h1 class="{severity}">{} <small class="cause">({})</small></h1>"#,
        esc(c.title()),
        esc(c.as_str())
    );
    if let Some(origin) = &summary.origin {
        let line = crate::output::text::where_and_when(origin, summary);
        let _ = write!(heading, "<p>{}</p>", esc(&line));
    }
    if let Some(job) = summary.job.as_ref().and_then(|j| j.label()) {
        let _ = write!(heading, "<p>Job: {}</p>", esc(&job));
    }
    page(summary.verdict.cause.as_str(), &(heading + &body(summary, t)))
}

/// A self-contained page around `body` (already HTML), titled `gpustall: title`.
pub fn page(title: &str, body: &str) -> String {
    let mut o = String::new();
    let _ = write!(
        o,
        r##"<!doctype html><html><head><meta charset="utf-8"><title>gpustall: {}</title><style>
body{{font-family:system-ui,sans-serif;margin:1.5em 2em;color:#222}} h1{{font-size:1.4em}} .cause{{color:#b00}}
h1.failure{{color:#b00}} h1.slowdown{{color:#a60}} h1.clear{{color:#070}} h1 .cause{{color:inherit;font-weight:normal}}
li{{margin:.2em 0}} table{{border-collapse:collapse;font-size:12px;display:block;max-width:100%;overflow-x:auto}}
.flame{{display:block;width:100%;border:0}} p,li,td{{overflow-wrap:anywhere}} h3{{margin:1.2em 0 .2em}}
.legend{{display:flex;flex-wrap:wrap;gap:2px 16px;font-size:12px;margin-left:7%}} .legend i{{display:inline-block;width:10px;height:10px;margin-right:4px}} td,th{{border:1px solid #ddd;padding:2px 6px;text-align:right}} th{{background:#f3f3f3}}
</style></head><body>"##,
        esc(title)
    );
    o.push_str(body);
    o.push_str("</body></html>\n");
    o
}

/// Everything of one recording's report under its heading: the verdict text, evidence and
/// advice, the timeline charts (on the timeline's own start..end), the table of processes.
pub fn body(summary: &Summary, t: &Timeline) -> String {
    let v = &summary.verdict;
    let mut o = String::new();
    let _ = write!(o, r#"<p>{}</p>"#, esc(&v.text));
    let lower_bounds = &summary.lower_bounds;
    for (title, items) in [
        ("Lower bounds: events were lost", lower_bounds),
        ("Evidence (in time order)", &v.evidence),
        ("Advice", &v.advice),
    ] {
        if !items.is_empty() {
            let _ = write!(o, "<h2>{title}</h2><ul>");
            for e in items {
                let _ = write!(o, "<li>{}</li>", esc(e));
            }
            o.push_str("</ul>");
        }
    }
    o.push_str("<h2>Timeline</h2>");
    timeline_charts(&mut o, t, summary);
    tables::kept_waiting(&mut o, summary);
    flame::graphs(&mut o, summary);
    tables::processes(&mut o, summary);
    let _ = write!(
        o,
        "<p><small>gpustall {}; lost events: {}; GPU: {}</small></p>",
        env!("CARGO_PKG_VERSION"),
        summary.lost_events,
        esc(&summary.gpu_status)
    );
    o
}

/// A labelled series of (t_ns, value) points.
type Series<'a> = (String, &'a [(u64, f64)]);

/// The counter series of the timeline whose track and name `want` labels.
fn series_of<'a>(
    t: &'a Timeline,
    want: &dyn Fn(&Track, &str) -> Option<String>,
) -> Vec<(String, &'a [(u64, f64)])> {
    t.counters
        .iter()
        .filter_map(|((tr, name), s)| want(tr, name).map(|l| (l, s.points.as_slice())))
        .collect()
}

/// Reclaim stalls: ms stalled per second, per process, from the slices.
fn stall_rates(t: &Timeline) -> std::collections::BTreeMap<u32, Vec<(u64, f64)>> {
    let mut stall_rate: std::collections::BTreeMap<u32, Vec<(u64, f64)>> = Default::default();
    for s in t.slices.iter().filter(|s| s.name.ends_with("reclaim")) {
        let bucket = s.start_ns - (s.start_ns.saturating_sub(t.start_ns)) % 1_000_000_000;
        let v = stall_rate.entry(s.pid).or_default();
        match v.last_mut() {
            Some(last) if last.0 == bucket => last.1 += s.dur_ns as f64 / 1e6,
            _ => v.push((bucket, s.dur_ns as f64 / 1e6)),
        }
    }
    stall_rate
}

fn timeline_charts(o: &mut String, t: &Timeline, summary: &Summary) {
    // Legends name a process by its role and name, as the report does.
    let who = |pid: &u32| crate::output::text::process_name(summary, *pid);
    let f = Frame {
        axis: Axis { t0: t.start_ns, t1: t.end_ns.max(t.start_ns + 1) },
        marks: t
            .instants
            .iter()
            .filter(|i| i.name == "OOM kill")
            .map(|i| (i.t_ns, format!("OOM kill {}", i.pid)))
            .collect(),
        spans: t
            .slices
            .iter()
            .filter(|s| s.name == "GPU stall")
            .map(|s| (s.start_ns, s.start_ns + s.dur_ns))
            .collect(),
    };
    let host = |want: &'static str, label: &'static str| {
        series_of(t, &move |tr, n| (*tr == Track::Host && n == want).then(|| label.to_string()))
    };
    let gpu = series_of(t, &|tr, n| match tr {
        Track::Gpu(i) if n == "util_pct" => {
            Some(format!("GPU {i} {} util %", t.gpus.get(i).map_or("", String::as_str)))
        }
        _ => None,
    });
    let mem = series_of(t, &|tr, n| match tr {
        Track::Process(p) if n == "held_mib" => Some(who(p)),
        _ => None,
    });
    // The wait for data, per trainer/rank and per worker that ended it (timeline: charged in
    // the second the wait ended).
    let per_process = |want: &'static str, what: &'static str| {
        series_of(t, &move |tr, n| match tr {
            Track::Process(p) if n == want => Some(format!("{} {what}", who(p))),
            _ => None,
        })
    };
    let waits = per_process("data_wait_ms_s", "waited");
    let kept = per_process("kept_waiting_ms_s", "kept it waiting");
    let rates = stall_rates(t);
    let stalls: Vec<(String, &[(u64, f64)])> =
        rates.iter().map(|(p, v)| (who(p), v.as_slice())).collect();
    let disk = series_of(t, &|tr, n| {
        (*tr == Track::Host && (n == "job_disk_mib_s" || n == "job_reclaim_io_mib_s"))
            .then(|| n.replace("job_", "").replace("_mib_s", " MiB/s"))
    });
    let charts: [(&str, &str, Vec<Series>); 8] = [
        ("GPU utilisation", "%", gpu),
        (
            "Waiting for data: the trainer and ranks (ms per second, each wait counted whole in \
             the second it ended; the long ones are drawn over their time above)",
            "ms/s",
            waits,
        ),
        ("Who ended those waits: per worker (ms per second, when each wait ended)", "ms/s", kept),
        ("Memory held per process (resident + swapped out)", "MiB", mem),
        ("Reclaim stalls (ms stalled per second)", "ms/s", stalls),
        ("Swap-out by the job", "pages/s", host("job_swapout_pages_s", "swap-out pages/s")),
        ("Disk I/O by the job (reclaim I/O = swap/writeback under pressure)", "MiB/s", disk),
        ("Training log data_time", "s", host("data_time_s", "data_time s")),
    ];
    // A chart with nothing but zeros says nothing a line of text cannot: it is left out, and
    // named below the others.
    let mut flat = Vec::new();
    for (i, (title, unit, series)) in charts.into_iter().enumerate() {
        // The long waits over their time, right above the per-second charts of the same waits.
        if i == 1 {
            waits::chart(o, &t.slices, &f, &|p| who(&p));
        }
        if series.iter().any(|(_, p)| p.iter().any(|(_, v)| *v != 0.0)) {
            o.push_str(&chart(title, unit, &series, &f));
        } else {
            flat.push(title.split(" (").next().unwrap_or(title));
        }
    }
    if !flat.is_empty() {
        let _ = write!(
            o,
            "<p><small>Nothing to draw (no samples, or all zero): {}.</small></p>",
            esc(&flat.join("; "))
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_chart_has_at_most_ten_ticks_whatever_its_span() {
        for secs in [0.5, 59.0, 3600.0 * 20.0, 3600.0 * 24.0 * 365.0, 1.8e10] {
            assert!(secs / super::tick_step(secs) <= 10.0 + 1e-9, "{secs}");
        }
    }

    #[test]
    fn a_series_is_drawn_in_steps_that_end_at_each_sample() {
        let d = super::steps(&[(0, 0.0), (1, 5.0), (4, 0.0)], |t| t as f64 * 10.0, |v| v);
        assert_eq!(d, ["0.0,0.0", "0.0,5.0", "10.0,5.0", "10.0,0.0", "40.0,0.0"]);
    }

    /// An OOM kill near the chart's right edge is labelled to the left of its line, one near
    /// its left edge to the right: the label stays inside the plot.
    #[test]
    fn a_marks_label_is_on_the_side_with_room() {
        let axis = super::Axis { t0: 0, t1: 100 };
        let marks = vec![(2, "OOM kill 7".into()), (98, "OOM kill 8".into())];
        let f = super::Frame { axis, marks, spans: vec![] };
        let mut s = String::new();
        super::marks(&mut s, &f, &super::Layout::of(super::PLOT_H));
        let anchor = |label: &str| {
            let at = s.find(label).expect(label);
            s[..at].rsplit("text-anchor=\"").next().and_then(|a| a.split('"').next())
        };
        assert_eq!(anchor("OOM kill 7"), Some("start"), "{s}");
        assert_eq!(anchor("OOM kill 8"), Some("end"), "{s}");
    }

    /// Two kills a moment apart: the second label goes a row below; one far off shares the
    /// first row; with no row free they take the rows in turn.
    #[test]
    fn labels_that_would_cover_each_other_take_rows_below() {
        let spans = [(100.0, 210.0), (105.0, 215.0), (400.0, 510.0), (90.0, 200.0)];
        assert_eq!(super::label_rows(&spans, 8), [0, 1, 0, 2]);
        assert_eq!(super::label_rows(&spans, 2), [0, 1, 0, 1]);
        assert_eq!(super::label_rows(&spans, 0), [0, 0, 0, 0], "at least one row");
    }

    #[test]
    fn escapes_text() {
        assert_eq!(super::esc("<a & \"b\">"), "&lt;a &amp; &quot;b&quot;&gt;");
    }

    /// A trainer (pid 10) fed by two workers: its wait for data is a chart next to GPU
    /// utilisation, and the slow worker's share of it is in the table.
    #[test]
    fn the_wait_for_data_and_each_workers_share_are_on_the_page() {
        let s = 1_000_000_000u64;
        let wake = |waker: u32, ns: u64, count: u64| serde_json::json!({"waker": waker, "wakee": 10, "count": count, "ns": ns, "max_ns": ns / count, "hist": [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, count, 0, 0, 0, 0, 0, 0, 0]});
        let offcpu = |pid: u32, wait_ns: u64| serde_json::json!({"pid": pid, "wait_count": 1, "wait_ns": wait_ns, "io_count": 0, "io_ns": 0, "runq_count": 0, "runq_ns": 0});
        let mut lines = vec![
            serde_json::json!({"type":"header","version":1,"start_ns":0,"gpu":{"enabled":false,"status":"off"}}),
            serde_json::json!({"type":"sample","kind":"seed","t_ns":0,"pid":10,"ppid":1,"comm":"python","is_target":true}),
        ];
        for pid in [11u32, 12] {
            lines.push(serde_json::json!({"type":"event","kind":"fork","t_ns":10,"pid":10,"tid":10,"comm":"python","child_pid":pid,"clone_flags":0}));
            lines.push(serde_json::json!({"type":"event","kind":"rename","t_ns":20,"pid":pid,"tid":pid,"comm":"python","renamed_tid":pid,"new_comm":"pt_data_worker"}));
        }
        lines.push(serde_json::json!({"type":"sample","kind":"counters","t_ns":s,"procs":[],"io":[],"host":[],"lost":[],"undecodable":null,"io_latency":[],
            "offcpu":[offcpu(10, 900_000_000)],"wakes":[wake(11, 600_000_000, 6), wake(12, 200_000_000, 4)]}));
        lines.push(serde_json::json!({"type":"sample","kind":"counters","t_ns":2 * s,"procs":[],"io":[],"host":[],"lost":[],"undecodable":null,"io_latency":[],
            "offcpu":[offcpu(10, 1_100_000_000)],"wakes":[wake(11, 800_000_000, 8)]}));
        let text: String = lines.iter().map(|l| l.to_string() + "\n").collect();
        let r = crate::recording::replay::replay(text.as_bytes());
        assert!(r.error.is_none(), "{:?}", r.error);
        let summary = crate::pipeline::conclude::summary(&r.model, r.end_ns, true);
        let page = super::render(
            &summary,
            &crate::output::timeline::build(
                lines.iter().map(|l| crate::output::timeline::fixtures::line(l.clone())),
            ),
        );
        assert!(page.contains("Waiting for data: the trainer and ranks"), "the chart");
        assert!(page.contains("the trainer python (pid 10) waited"), "the trainer's series");
        assert!(page.contains("DataLoader worker 0 (pid 11) kept it waiting"), "{page}");
        // Drawn in steps: a value holds over the interval that ends at its sample.
        assert!(page.contains("<polyline"), "{page}");
        let table = &page[page.find("kept it waiting ms").expect("the table")..];
        // 800 of the 1000 ms waited were the slow worker's: 80 %, listed first.
        let (slow, fast) = (table.find("<td>11</td>"), table.find("<td>12</td>"));
        assert!(slow < fast, "the slow worker first: {table}");
        assert!(table.contains("<td>800.0</td><td>80.0 %</td>"), "{table}");
        assert!(page.contains("<td>1000.0</td><td>12</td><td>50.0</td>"), "the trainer's wait");
        assert!(table.contains("<td>200.0</td><td>20.0 %</td>"), "{table}");
    }
}
