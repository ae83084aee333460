//! The flight recorder: the last N minutes of record lines in memory, within a fixed byte
//! budget, so that when an incident happens the window before it can be written out.

use std::{collections::VecDeque, sync::Arc};

use crate::recording::record::Line;
use crate::recording::writer::Sink;

pub struct FlightRecorder {
    /// Shared with a bundle being written: taking the window copies no line.
    lines: VecDeque<(u64, Arc<str>)>,
    bytes: usize,
    budget: usize,
    window_ns: u64,
    /// Lines dropped for the budget before they aged out: a window shorter than asked.
    pub evicted_early: u64,
    /// Those drops per second of line time (second, count), within the window: a bundle says
    /// how many lines of its own window are missing.
    evicted_by_second: VecDeque<(u64, u64)>,
}

impl FlightRecorder {
    pub fn new(window_ns: u64, budget: usize) -> Self {
        Self {
            lines: VecDeque::new(),
            bytes: 0,
            budget,
            window_ns,
            evicted_early: 0,
            evicted_by_second: VecDeque::new(),
        }
    }

    fn note_eviction(&mut self, t_ns: u64) {
        let sec = t_ns / 1_000_000_000;
        match self.evicted_by_second.back_mut() {
            Some((s, n)) if *s == sec => *n += 1,
            _ => self.evicted_by_second.push_back((sec, 1)),
        }
    }

    /// Lines with a time at or after `from_ns` that were dropped for the budget.
    pub fn evicted_since(&self, from_ns: u64) -> u64 {
        let from_sec = from_ns / 1_000_000_000;
        self.evicted_by_second.iter().filter(|(s, _)| *s >= from_sec).map(|(_, n)| n).sum()
    }

    pub fn push(&mut self, t_ns: u64, line: String) {
        self.bytes += line.len();
        self.lines.push_back((t_ns, line.into()));
        let horizon = t_ns.saturating_sub(self.window_ns);
        while let Some((t, l)) = self.lines.front() {
            let over_budget = self.bytes > self.budget;
            if *t >= horizon && !over_budget {
                break;
            }
            let (t, len) = (*t, l.len());
            if over_budget && t >= horizon {
                self.evicted_early += 1;
                self.note_eviction(t);
            }
            self.bytes -= len;
            self.lines.pop_front();
        }
        let horizon_sec = horizon / 1_000_000_000;
        while self.evicted_by_second.front().is_some_and(|(s, _)| *s < horizon_sec) {
            self.evicted_by_second.pop_front();
        }
    }

    /// Lines with a time at or after `from_ns`, in order (shared, not copied).
    pub fn since(&self, from_ns: u64) -> Vec<Arc<str>> {
        self.lines.iter().filter(|(t, _)| *t >= from_ns).map(|(_, l)| Arc::clone(l)).collect()
    }

    /// Bytes held now (the watch daemon exports it).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    #[cfg(test)]
    pub fn oldest_ns(&self) -> Option<u64> {
        self.lines.front().map(|(t, _)| *t)
    }
}

/// The session writes into it like into a file; lines without a time get the latest time.
pub struct FlightSink {
    pub recorder: std::sync::Arc<std::sync::Mutex<FlightRecorder>>,
    last_t: u64,
}

impl FlightSink {
    pub fn new(recorder: std::sync::Arc<std::sync::Mutex<FlightRecorder>>) -> Self {
        Self { recorder, last_t: 0 }
    }
}

impl FlightSink {
    fn push(&mut self, t: Option<u64>, line: serde_json::Result<String>) {
        let t = t.unwrap_or(self.last_t);
        self.last_t = self.last_t.max(t);
        if let (Ok(line), Ok(mut r)) = (line, self.recorder.lock()) {
            r.push(t, line);
        }
    }
}

impl Sink for FlightSink {
    fn write(&mut self, line: Line<'_>) {
        self.push(line.t_ns(), line.to_json());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_window_and_the_budget() {
        let mut f = FlightRecorder::new(10, 1000);
        for t in 0..30 {
            f.push(t, format!("line {t}"));
        }
        assert_eq!(f.oldest_ns(), Some(19));
        assert_eq!(f.since(25).len(), 5);
        let mut f = FlightRecorder::new(1_000, 20);
        for t in 0..10 {
            f.push(t, "0123456789".into());
        }
        assert!(f.bytes() <= 20);
        assert_eq!(f.since(0).len(), 2);
        assert_eq!(f.evicted_early, 8);
    }
}
