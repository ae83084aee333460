//! The once-a-second status line: rates between two consecutive looks at the model.

use gpustall_common::counters::IoOp;

use crate::model::gpu::GpuState;
use crate::model::Model;

/// Totals over the traced tree at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Totals {
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub reclaim_count: u64,
    pub reclaim_ns: u64,
    pub swapout_pages: u64,
    pub events: u64,
}

pub fn totals(m: &Model) -> Totals {
    let mut t = Totals { events: m.events, ..Default::default() };
    for p in m.procs.values() {
        t.read_bytes += p.io_bytes(IoOp::Read, None);
        t.write_bytes += p.io_bytes(IoOp::Write, None);
        t.reclaim_count += p.counters.direct_reclaim_count + p.counters.memcg_reclaim_count;
        t.reclaim_ns += p.counters.direct_reclaim_ns + p.counters.memcg_reclaim_ns;
        t.swapout_pages += p.counters.swapout_anon_pages;
    }
    t
}

pub fn line(
    elapsed_s: f64,
    alive: usize,
    seen: usize,
    prev: Totals,
    cur: Totals,
    dt_s: f64,
    lost: u64,
) -> String {
    let dt = dt_s.max(1e-3);
    let rate = |a: u64, b: u64| b.saturating_sub(a) as f64 / dt;
    format!(
        "[{elapsed_s:>6.1}s] procs {alive}/{seen} | io r {:.1} w {:.1} MiB/s | reclaim {:.0}/s ({:.1} ms/s stalled) | swap-out {:.0} pg/s | events {} | lost {lost}",
        rate(prev.read_bytes, cur.read_bytes) / 1048576.0,
        rate(prev.write_bytes, cur.write_bytes) / 1048576.0,
        rate(prev.reclaim_count, cur.reclaim_count),
        rate(prev.reclaim_ns, cur.reclaim_ns) / 1e6,
        rate(prev.swapout_pages, cur.swapout_pages),
        cur.events,
    )
}

/// A wait for data in progress with no batch for a second or more: "| waiting for data 40 s
/// (pid 4242)", the longest (a trainer hung on its input shows here before the trace ends).
pub fn waiting_part(m: &Model) -> String {
    let longest = m.offcpu.open.iter().filter_map(|w| Some((m.offcpu.open_wait(w.pid)?, w.pid)));
    match longest.max_by_key(|(w, _)| w.without_batch_ns) {
        Some((w, pid)) if w.without_batch_ns >= crate::diagnose::facts::OPEN_WAIT_SHOWN_NS => {
            format!(" | waiting for data {:.0} s (pid {pid})", w.without_batch_ns as f64 / 1e9)
        }
        _ => String::new(),
    }
}

/// The GPU part of the status line.
pub fn live_part(state: &GpuState, now_ns: u64) -> String {
    if state.latest.is_empty() {
        return String::new();
    }
    let utils: Vec<String> = state
        .latest
        .iter()
        .map(|s| s.util_gpu_pct.map_or("?".into(), |u| format!("{u}%")))
        .collect();
    let stall = state
        .stalled_since
        .map(|(start, gpu)| {
            format!(" STALLED gpu{gpu} {:.1}s", now_ns.saturating_sub(start) as f64 / 1e9)
        })
        .unwrap_or_default();
    format!(" | gpu {}{stall} | stalls {}", utils.join(","), state.stalls.len())
}

/// Shows the status line on stderr: redrawn in place on a terminal, a line each otherwise.
/// A closed stderr is ignored (the trace goes on).
pub fn show(line: &str, tty: bool) {
    use std::io::Write as _;
    let mut err = std::io::stderr().lock();
    let _ = if tty { write!(err, "\r{line}\x1b[K") } else { writeln!(err, "{line}") };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_per_second_deltas() {
        let prev = Totals { write_bytes: 0, swapout_pages: 100, ..Default::default() };
        let cur = Totals {
            write_bytes: 2 * 1048576,
            swapout_pages: 300,
            events: 7,
            ..Default::default()
        };
        let l = line(3.0, 2, 3, prev, cur, 2.0, 0);
        assert!(l.contains("w 1.0 MiB/s"), "{l}");
        assert!(l.contains("swap-out 100 pg/s"), "{l}");
        assert!(l.contains("procs 2/3"), "{l}");
    }
}
