//! The once-a-second status line: rates between two consecutive looks at the model.

use gpustall_common::counters::IoOp;

use crate::model::gpu::GpuState;
use crate::model::Model;

/// Totals over the traced tree at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TreeTotals {
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub reclaim_count: u64,
    pub reclaim_ns: u64,
    pub swapout_pages: u64,
    pub events: u64,
}

pub fn totals(m: &Model) -> TreeTotals {
    let mut t = TreeTotals { events: m.events, ..Default::default() };
    for p in m.procs.values() {
        t.read_bytes += p.io_bytes(IoOp::Read, None);
        t.write_bytes += p.io_bytes(IoOp::Write, None);
        t.reclaim_count += p.counters.reclaim_count();
        t.reclaim_ns += p.counters.reclaim_ns();
        t.swapout_pages += p.counters.swapout_anon_pages;
    }
    t
}

pub fn line(
    elapsed_s: f64,
    alive: usize,
    seen: usize,
    prev: TreeTotals,
    cur: TreeTotals,
    dt_s: f64,
    lost: u64,
) -> String {
    let dt = dt_s.max(1e-3);
    let rate = |a: u64, b: u64| b.saturating_sub(a) as f64 / dt;
    format!(
        "[{elapsed_s:>6.1}s] {alive} procs alive ({seen} seen) | io r {:.1} w {:.1} MiB/s | reclaim {:.0}/s ({:.1} ms/s stalled) | swap-out {:.0} pg/s | events {} | lost {lost}",
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

/// The job's memory cgroup heading for its limit: " | OOM kill in ~41 s: memory limit (3000
/// MiB) in ~41 s at +432 MiB/min, growing: worker 2 (pid 7) +200 MiB/min, ...". The processes
/// named are the three that grew fastest over the last half minute or more.
pub fn limit_part(m: &Model) -> String {
    let Some(f) = m.ctx.limit_clock.forecast() else { return String::new() };
    let mut growing: Vec<(f64, u32)> = m
        .tree
        .alive_pids()
        .into_iter()
        .filter_map(|pid| Some((m.procs.get(&pid)?.growth.rate_kb_s()?, pid)))
        .filter(|(kb_s, _)| *kb_s * 1024.0 >= f.rate_bytes_s * 0.05)
        .collect();
    growing.sort_by(|a, b| b.0.total_cmp(&a.0));
    let who: Vec<String> = growing
        .iter()
        .take(3)
        .map(|&(kb_s, pid)| format!("{} +{:.0} MiB/min", who(m, pid), kb_s * 60.0 / 1024.0))
        .collect();
    let who = if who.is_empty() { String::new() } else { format!(", growing: {}", who.join(", ")) };
    format!(" | {}{who}", f.describe())
}

/// "worker 2 (pid 7)", or the process's (escaped) name and pid.
fn who(m: &Model, pid: u32) -> String {
    match m.tree.worker_index(pid) {
        Some(i) => format!("worker {i} (pid {pid})"),
        None => {
            let comm = m.tree.get(pid).map_or("?", |n| n.comm.as_str());
            format!("{} (pid {pid})", crate::model::untrusted::name(comm))
        }
    }
}

/// What makes a status line worth printing at once when no one watches it scroll: a GPU
/// stall in progress, a process of the job killed, its memory cgroup at 90 % of its limit or
/// more or forecast to reach it within 10 minutes, a wait for data with no batch coming. A
/// change in any is news.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Notable {
    pub stalled: bool,
    pub killed: usize,
    pub near_limit: bool,
    pub limit_soon: bool,
    pub waiting: bool,
}

impl Notable {
    pub fn of(m: &Model) -> Self {
        let near_limit = m.ctx.cgroup_last.as_ref().is_some_and(|c| {
            c.limit_bytes.is_some_and(|l| l > 0 && c.usage_bytes.saturating_mul(10) >= l * 9)
        });
        Notable {
            stalled: m.gpu.stalled_since.is_some(),
            killed: m.tree.iter().filter(|n| n.oom_killed || n.killed_by.is_some()).count(),
            near_limit,
            limit_soon: m
                .ctx
                .limit_clock
                .forecast()
                .is_some_and(|f| f.seconds < crate::model::limit_clock::SOON_S),
            waiting: !waiting_part(m).is_empty(),
        }
    }
}

/// When a status line is printed: every beat on a terminal (it redraws one row); elsewhere (a
/// batch job's error file, a pod's log) the first, then at most one per `every`, and at once
/// whenever [`Notable`] changes: a 10-hour job's file gets a line a minute, not 36,000.
pub struct Pacer {
    every: std::time::Duration,
    last: Option<(std::time::Instant, Notable)>,
}

impl Pacer {
    pub fn new(every: std::time::Duration) -> Self {
        Pacer { every, last: None }
    }

    /// Whether to print now (`tty`: a terminal shows it), and if so it counts as printed.
    pub fn due(&mut self, tty: bool, now: std::time::Instant, notable: Notable) -> bool {
        let due = tty
            || self.last.is_none_or(|(at, seen)| {
                seen != notable || now.saturating_duration_since(at) >= self.every
            });
        if due {
            self.last = Some((now, notable));
        }
        due
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

/// The status line on stderr. On a terminal it keeps the bottom row to itself: the rows above
/// become the scrolling region (DECSTBM, as apt's progress bar does), so the job's own output,
/// written to the same terminal, scrolls above it and never runs into it; the line is cut to
/// the terminal's width, read again at each draw (a resized window is followed). Elsewhere it
/// is a line each time. Dropping it gives the terminal its whole screen back.
pub struct StatusBar {
    tty: bool,
    /// The terminal's height the scrolling region was set for (0: not set).
    region_rows: u16,
    drawn: bool,
}

impl StatusBar {
    pub fn new(tty: bool) -> Self {
        StatusBar { tty, region_rows: 0, drawn: false }
    }

    /// It draws on a terminal (not a file or a pipe).
    pub fn is_tty(&self) -> bool {
        self.tty
    }

    /// Draws `line`; a closed stderr is ignored (the trace goes on).
    pub fn show(&mut self, line: &str) {
        use std::io::Write as _;
        // One row, whatever a name in it holds: drawn only with our own escape codes.
        let line = &*crate::model::untrusted::one_line(line);
        let mut err = std::io::stderr().lock();
        if !self.tty {
            let _ = writeln!(err, "{line}");
            return;
        }
        let size = terminal_size::terminal_size_of(std::io::stderr());
        let (cols, rows) = size.map_or((80, 0), |(w, h)| (w.0, h.0));
        let mut out = String::new();
        if rows >= 3 && rows != self.region_rows {
            out += &reserve_bottom_row(rows, self.region_rows == 0);
            self.region_rows = rows;
        }
        out += &draw(line, cols, self.region_rows);
        let _ = err.write_all(out.as_bytes()).and_then(|()| err.flush());
        self.drawn = true;
    }

    /// Gives the terminal back: the whole screen scrolls again, the status row is cleared.
    pub fn finish(&mut self) {
        use std::io::Write as _;
        if !(self.tty && self.drawn) {
            return;
        }
        self.drawn = false;
        let out = match std::mem::take(&mut self.region_rows) {
            0 => "\r\x1b[K".to_string(),
            rows => release(rows),
        };
        let _ = std::io::stderr().write_all(out.as_bytes());
    }
}

impl Drop for StatusBar {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Makes rows 1..rows-1 the scrolling region, the cursor staying where the output was. The
/// first time, a newline first scrolls the screen up one row, so the row the status takes
/// loses nothing.
fn reserve_bottom_row(rows: u16, first: bool) -> String {
    let scroll = if first { "\n" } else { "" };
    // Save the cursor, set the region (which homes the cursor), restore it, and keep it inside
    // the region.
    format!("{scroll}\x1b7\x1b[1;{}r\x1b8\x1b[1A", rows - 1)
}

/// The line on the bottom row (`rows`, 0 when the region could not be set: redrawn in place),
/// cut to `cols` - 1 characters, the cursor left where the job's output is.
fn draw(line: &str, cols: u16, rows: u16) -> String {
    let cut: String = line.chars().take(usize::from(cols.max(2)) - 1).collect();
    match rows {
        0 => format!("\r{cut}\x1b[K"),
        rows => format!("\x1b7\x1b[{rows};1H\x1b[2K{cut}\x1b8"),
    }
}

/// The whole screen as the scrolling region again, and the status row cleared.
fn release(rows: u16) -> String {
    format!("\x1b7\x1b[r\x1b[{rows};1H\x1b[2K\x1b8")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_terminal_a_line_a_minute_and_one_at_once_for_news() {
        use std::time::{Duration, Instant};
        let mut p = Pacer::new(Duration::from_secs(60));
        let t0 = Instant::now();
        let quiet = Notable::default();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(p.due(false, at(0), quiet), "the first line");
        assert!(!(1..60).any(|s| p.due(false, at(s), quiet)), "none for a minute");
        assert!(p.due(false, at(60), quiet));
        let stalled = Notable { stalled: true, ..quiet };
        assert!(p.due(false, at(61), stalled), "a stall begins: at once");
        assert!(!p.due(false, at(62), stalled));
        assert!(p.due(false, at(63), quiet), "and ends: at once");
        let killed = Notable { killed: 1, ..quiet };
        assert!(p.due(false, at(64), killed), "a kill: at once");
        assert!(
            p.due(true, at(65), killed) && p.due(true, at(66), killed),
            "a terminal: each beat"
        );
    }

    #[test]
    fn rates_are_per_second_deltas() {
        let prev = TreeTotals { write_bytes: 0, swapout_pages: 100, ..Default::default() };
        let cur = TreeTotals {
            write_bytes: 2 * 1048576,
            swapout_pages: 300,
            events: 7,
            ..Default::default()
        };
        let l = line(3.0, 2, 3, prev, cur, 2.0, 0);
        assert!(l.contains("w 1.0 MiB/s"), "{l}");
        assert!(l.contains("swap-out 100 pg/s"), "{l}");
        assert!(l.contains("2 procs alive (3 seen)"), "{l}");
    }

    /// The terminal sequences: the bottom row reserved once, the line cut to the width and
    /// drawn there with the cursor saved and restored, the screen given back at the end.
    #[test]
    fn the_status_keeps_the_bottom_row_and_fits_the_width() {
        assert_eq!(reserve_bottom_row(24, true), "\n\x1b7\x1b[1;23r\x1b8\x1b[1A");
        assert_eq!(reserve_bottom_row(30, false), "\x1b7\x1b[1;29r\x1b8\x1b[1A");
        let long = "x".repeat(200);
        assert_eq!(draw(&long, 40, 24), format!("\x1b7\x1b[24;1H\x1b[2K{}\x1b8", "x".repeat(39)));
        assert_eq!(draw("ok", 40, 0), "\rok\x1b[K");
        assert_eq!(release(24), "\x1b7\x1b[r\x1b[24;1H\x1b[2K\x1b8");
    }
}
