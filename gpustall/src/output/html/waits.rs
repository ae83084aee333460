//! The long waits for data (10 ms or more) over the time they lasted: one lane per waiting
//! thread, each wait a bar from its start to its end in the colour of the worker that ended it.
//! The per-second charts count a wait whole in the second it ended (a 7 s wait is one spike of
//! 7000 ms/s); here it spans its 7 s. Drawn from the timeline's long-wait slices, the ones the
//! Perfetto trace shows.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::{chart_head, color, esc, marks, plot_area, time_ticks, Axis, Frame, Layout, LEFT};
use crate::output::timeline::{Slice, SliceArgs};

/// A lane's height (its label above its bar) and its bar's, in the SVG's units.
const LANE_H: f64 = 26.0;
const BAR_H: f64 = 12.0;

const TITLE: &str = "Long waits for data (10 ms or more) over the time they lasted: a lane per \
                     waiting thread, each wait in the colour of the worker that ended it";

/// One long wait: when it began and ended, and the process that ended it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    pub start_ns: u64,
    pub end_ns: u64,
    pub waker: u32,
}

/// The long waits of one waiting thread, in the order they began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lane {
    pub pid: u32,
    pub tid: u32,
    pub waits: Vec<Wait>,
}

/// The long-wait slices among `slices` as lanes, one per waiting thread, by (pid, tid).
pub fn lanes(slices: &[Slice]) -> Vec<Lane> {
    let mut by_thread: BTreeMap<(u32, u32), Vec<Wait>> = BTreeMap::new();
    for s in slices {
        let SliceArgs::Wait(args) = &s.args else { continue };
        by_thread.entry((s.pid, s.tid)).or_default().push(Wait {
            start_ns: s.start_ns,
            end_ns: s.start_ns.saturating_add(s.dur_ns),
            waker: args.waker_pid,
        });
    }
    by_thread
        .into_iter()
        .map(|((pid, tid), mut waits)| {
            waits.sort_by_key(|w| w.start_ns);
            Lane { pid, tid, waits }
        })
        .collect()
}

/// The processes that ended the waits, in pid order: a worker's colour is its place here.
fn wakers(lanes: &[Lane]) -> Vec<u32> {
    let all: BTreeSet<u32> = lanes.iter().flat_map(|l| l.waits.iter().map(|w| w.waker)).collect();
    all.into_iter().collect()
}

/// A wait's bar on the axis: its left edge and width, at least one unit wide (a 10 ms wait in
/// an hour's chart still shows).
fn bar(axis: &Axis, w: &Wait) -> (f64, f64) {
    let x = axis.x(w.start_ns);
    (x, (axis.x(w.end_ns) - x).max(1.0))
}

/// The lanes chart of the long waits among `slices`, with the frame's OOM kills and GPU
/// stalls; nothing without long waits. `who` names a process.
pub fn chart(o: &mut String, slices: &[Slice], f: &Frame, who: &dyn Fn(u32) -> String) {
    let lanes = lanes(slices);
    if lanes.is_empty() {
        return;
    }
    let wakers = wakers(&lanes);
    let names: Vec<String> = wakers.iter().map(|p| who(*p)).collect();
    let legend: Vec<(&str, &str)> =
        names.iter().enumerate().map(|(i, n)| (n.as_str(), color(i))).collect();
    // A band above the lanes for the OOM kills' labels (up to 3 rows), clear of the bars.
    let band = super::MARK_ROW_H * f.marks.len().min(3) as f64;
    let l = Layout::of(band + LANE_H * lanes.len() as f64);
    chart_head(o, TITLE, &legend, &l);
    plot_area(o, f, &l);
    time_ticks(o, &f.axis, &l);
    for (i, lane) in lanes.iter().enumerate() {
        let thread = match lane.tid == lane.pid {
            true => who(lane.pid),
            false => format!("{}, thread {}", who(lane.pid), lane.tid),
        };
        let top = l.top + band + LANE_H * i as f64;
        let _ = write!(
            o,
            r##"<g class="lane" data-pid="{}" data-tid="{}"><text x="{:.1}" y="{:.1}" font-size="10" fill="#444">{}</text>"##,
            lane.pid,
            lane.tid,
            LEFT + 3.0,
            top + 10.0,
            esc(&thread)
        );
        for w in &lane.waits {
            let at = wakers.binary_search(&w.waker).unwrap_or(0);
            let (x, width) = bar(&f.axis, w);
            let _ = write!(
                o,
                r##"<rect class="wait" data-waker="{}" x="{x:.2}" y="{:.1}" width="{width:.2}" height="{BAR_H}" fill="{}"><title>{}: waited {:.0} ms for data, ended by {}</title></rect>"##,
                w.waker,
                top + LANE_H - BAR_H - 2.0,
                color(at),
                esc(&thread),
                w.end_ns.saturating_sub(w.start_ns) as f64 / 1e6,
                esc(&names[at])
            );
        }
        o.push_str("</g>");
    }
    marks(o, f, &l);
    o.push_str("</svg>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::timeline::WaitArgs;
    use serde_json::json;

    fn wait(pid: u32, tid: u32, start_ns: u64, dur_ns: u64, waker: u32) -> Slice {
        Slice {
            pid,
            tid,
            name: crate::output::timeline::DATA_WAIT_SLICE.into(),
            start_ns,
            dur_ns,
            args: SliceArgs::Wait(WaitArgs { waker_pid: waker, ..WaitArgs::default() }),
        }
    }

    #[test]
    fn a_lane_per_waiting_thread_its_waits_in_time_order() {
        let mut reclaim = wait(11, 11, 0, 5, 0);
        (reclaim.name, reclaim.args) = ("direct reclaim".into(), SliceArgs::Other(json!({})));
        let slices =
            [wait(10, 12, 900, 50, 11), wait(10, 10, 500, 100, 12), wait(10, 10, 100, 300, 11)];
        let lanes = lanes(&[reclaim, slices[0].clone(), slices[1].clone(), slices[2].clone()]);
        let w = |start_ns, end_ns, waker| Wait { start_ns, end_ns, waker };
        assert_eq!(
            lanes,
            [
                Lane { pid: 10, tid: 10, waits: vec![w(100, 400, 11), w(500, 600, 12)] },
                Lane { pid: 10, tid: 12, waits: vec![w(900, 950, 11)] },
            ]
        );
        assert_eq!(wakers(&lanes), [11, 12]);
    }

    #[test]
    fn a_wait_spans_its_duration_on_the_time_axis() {
        let s = 1_000_000_000;
        let axis = Axis { t0: 10 * s, t1: 30 * s };
        let plot = super::super::W - LEFT - 10.0;
        // A 7 s wait from 12 s: 7/20 of the plot, from 2/20 of it.
        let (x, width) = bar(&axis, &Wait { start_ns: 12 * s, end_ns: 19 * s, waker: 11 });
        assert!((x - (LEFT + plot * 0.1)).abs() < 1e-9, "{x}");
        assert!((width - plot * 0.35).abs() < 1e-9, "{width}");
        let (_, short) = bar(&axis, &Wait { start_ns: 12 * s, end_ns: 12 * s + 10, waker: 11 });
        assert_eq!(short, 1.0, "a short wait is still drawn");
    }

    #[test]
    fn names_in_the_lanes_are_escaped() {
        let f = Frame { axis: Axis { t0: 0, t1: 1000 }, marks: vec![], spans: vec![] };
        let mut o = String::new();
        chart(&mut o, &[wait(10, 10, 100, 300, 11)], &f, &|p| format!("<b>{p}</b>"));
        assert!(o.contains("&lt;b&gt;11&lt;/b&gt;"), "{o}");
        assert!(!o.contains("<b>"), "{o}");
        assert_eq!(o.matches(r#"<rect class="wait" data-waker="11""#).count(), 1, "{o}");
    }
}
