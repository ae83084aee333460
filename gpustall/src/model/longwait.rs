//! The trainer's long waits for data one by one, and what the worker that ended each was doing
//! meanwhile. The kernel sends a record per wait of `sched::LONG_WAIT_NS` or more that another
//! process of the job ended (`Event::DataWait`); the per-thread reclaim stalls of tracked
//! processes come as records too (`Event::Reclaim`). Overlapping the two says, per worker, how
//! much of the time it kept the trainer waiting it was itself stalled in reclaim: "the trainer
//! waited 740 ms for its batch; worker 3 delivered it and spent 600 ms of that in reclaim".

use std::collections::{BTreeMap, VecDeque};

use serde::Serialize;

/// Reclaim stalls kept per process to overlap with later waits. A wait ends when its batch
/// arrives, right after the worker's stalls that delayed it: a short history suffices.
const STALLS_KEPT: usize = 256;
/// Stalls that ended this long before the newest one cannot overlap a wait still to come
/// unless that wait is longer: waits over a minute see only their last minute of reclaim.
const STALL_HORIZON_NS: u64 = 60_000_000_000;

/// One long wait, as the kernel reported it, with the waker's reclaim during it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LongWait {
    /// When the wait ended (the waker's wakeup).
    pub t_ns: u64,
    pub start_ns: u64,
    pub duration_ns: u64,
    pub waker: u32,
    pub wakee: u32,
    pub wakee_tid: u32,
    /// Of `duration_ns`, the time the waker's threads were stalled in reclaim.
    pub waker_reclaim_ns: u64,
    /// The syscall the wakee blocked in, where the kernel read it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_class: Option<gpustall_common::syscall::WaitClass>,
    /// Of its blocks, those that ran out before the data came (timeouts: a poll or a timed
    /// queue get looping); `None` in recordings before logical waits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<u32>,
    /// A worker whose batch came with the waker's: the two share the wait, half each.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub co_waker: Option<u32>,
}

/// Per waker: the long waits it ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LongWaitSummary {
    /// Waits of `LONG_WAIT_NS` or more of the trainer's or ranks' threads that it ended.
    pub count: u64,
    pub ns: u64,
    /// Of `ns`, the time this process was itself stalled in reclaim (direct or memcg).
    pub in_reclaim_ns: u64,
    /// The longest of them: when it ended, how long, and its time in reclaim.
    pub longest_at_ns: u64,
    pub longest_ns: u64,
    pub longest_in_reclaim_ns: u64,
    /// The largest part of one wait charged to it: the whole wait where it ended it alone,
    /// half where it shared it, as waker or co-waker (a worker whose first batch came with a
    /// sibling's shares the start-up wait without ending it).
    pub largest_share_ns: u64,
}

#[derive(Default, Debug)]
pub struct LongWaits {
    /// Recent reclaim stalls (start, end) per process.
    stalls: BTreeMap<u32, VecDeque<(u64, u64)>>,
    per_waker: BTreeMap<u32, LongWaitSummary>,
    /// Every long wait, in the order they ended, for the outputs that draw them.
    pub waits: Vec<LongWait>,
}

/// Upper bound on the waits kept one by one (the summary keeps counting past it).
const WAITS_KEPT: usize = 100_000;

impl LongWaits {
    /// A reclaim stall of one of `pid`'s threads.
    pub fn note_reclaim(&mut self, pid: u32, start_ns: u64, duration_ns: u64) {
        let end = start_ns.saturating_add(duration_ns);
        let q = self.stalls.entry(pid).or_default();
        q.push_back((start_ns, end));
        while q.len() > STALLS_KEPT
            || q.front().is_some_and(|&(_, e)| e.saturating_add(STALL_HORIZON_NS) < end)
        {
            q.pop_front();
        }
    }

    /// A long wait of `wakee`'s thread that `waker` ended at `t_ns` (shared with `co_waker`,
    /// half each, as the kernel sums it: the wait is counted once, for the waker).
    pub fn note_wait(&mut self, mut w: LongWait) {
        let shared = if w.co_waker.is_some() { w.duration_ns / 2 } else { 0 };
        w.waker_reclaim_ns = self.in_reclaim(w.waker, &w).min(w.duration_ns - shared);
        let s = self.per_waker.entry(w.waker).or_default();
        s.count += 1;
        s.ns += w.duration_ns - shared;
        s.in_reclaim_ns += w.waker_reclaim_ns;
        s.largest_share_ns = s.largest_share_ns.max(w.duration_ns - shared);
        if w.duration_ns > s.longest_ns {
            s.longest_at_ns = w.t_ns;
            s.longest_ns = w.duration_ns;
            s.longest_in_reclaim_ns = w.waker_reclaim_ns;
        }
        if let Some(co) = w.co_waker {
            let in_reclaim = self.in_reclaim(co, &w).min(shared);
            let c = self.per_waker.entry(co).or_default();
            c.ns += shared;
            c.in_reclaim_ns += in_reclaim;
            c.largest_share_ns = c.largest_share_ns.max(shared);
        }
        if self.waits.len() < WAITS_KEPT {
            self.waits.push(w);
        }
    }

    /// How long `pid` was stalled in reclaim during the wait `w`.
    fn in_reclaim(&self, pid: u32, w: &LongWait) -> u64 {
        let stalls = self.stalls.get(&pid).into_iter().flatten();
        overlap(stalls.copied(), w.start_ns, w.t_ns)
    }

    /// The long waits `waker` ended, if any.
    pub fn of(&self, waker: u32) -> Option<LongWaitSummary> {
        self.per_waker.get(&waker).copied()
    }

    /// A process gone and folded: its stall history is no use any more.
    pub fn forget(&mut self, pid: u32) {
        self.stalls.remove(&pid);
    }
}

/// Time in `[from, to)` covered by the union of `intervals` (a worker's threads may stall at
/// once; their time is counted once).
fn overlap(intervals: impl Iterator<Item = (u64, u64)>, from: u64, to: u64) -> u64 {
    let mut clipped: Vec<(u64, u64)> =
        intervals.map(|(s, e)| (s.max(from), e.min(to))).filter(|(s, e)| s < e).collect();
    clipped.sort_unstable();
    let mut total = 0;
    let mut cur: Option<(u64, u64)> = None;
    for (s, e) in clipped {
        cur = match cur {
            Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    total + cur.map_or(0, |(s, e)| e - s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(waker: u32, start_ns: u64, t_ns: u64) -> LongWait {
        LongWait {
            t_ns,
            start_ns,
            duration_ns: t_ns - start_ns,
            waker,
            wakee: 10,
            wakee_tid: 10,
            waker_reclaim_ns: 0,
            wait_class: None,
            timeouts: None,
            co_waker: None,
        }
    }

    #[test]
    fn a_wait_is_charged_the_wakers_reclaim_inside_it_once() {
        let mut l = LongWaits::default();
        l.note_reclaim(11, 100, 300); // 100..400
        l.note_reclaim(11, 350, 100); // 350..450, overlaps the first (another thread)
        l.note_reclaim(11, 900, 500); // 900..1400, after the wait
        l.note_reclaim(12, 200, 100); // another worker's
        l.note_wait(wait(11, 200, 800));
        let s = l.of(11).expect("worker 11 ended a wait");
        assert_eq!((s.count, s.ns, s.in_reclaim_ns), (1, 600, 250), "200..450");
        assert_eq!((s.longest_at_ns, s.longest_ns, s.longest_in_reclaim_ns), (800, 600, 250));
        assert_eq!(l.of(12), None);
        assert_eq!(l.waits[0].waker_reclaim_ns, 250);
    }

    #[test]
    fn the_longest_wait_is_kept_and_the_history_is_bounded() {
        let mut l = LongWaits::default();
        l.note_wait(wait(11, 0, 100));
        l.note_wait(wait(11, 200, 500));
        l.note_wait(wait(11, 600, 700));
        let s = l.of(11).expect("waits");
        assert_eq!((s.count, s.ns, s.longest_at_ns, s.longest_ns), (3, 500, 500, 300));
        for i in 0..1000u64 {
            l.note_reclaim(11, i * 10, 5);
        }
        assert!(l.stalls[&11].len() <= STALLS_KEPT);
        l.note_reclaim(11, 200_000_000_000, 5);
        assert_eq!(l.stalls[&11].len(), 1, "a minute later the old stalls are gone");
    }

    #[test]
    fn a_shared_wait_is_each_sharers_largest_share_though_only_the_waker_counts_it() {
        let mut l = LongWaits::default();
        l.note_wait(LongWait { co_waker: Some(12), ..wait(11, 0, 6_000) });
        l.note_wait(wait(12, 6_000, 6_100));
        let (w, co) = (l.of(11).expect("the waker"), l.of(12).expect("the co-waker"));
        assert_eq!((w.count, w.ns, w.longest_ns, w.largest_share_ns), (1, 3_000, 6_000, 3_000));
        assert_eq!((co.count, co.ns, co.longest_ns, co.largest_share_ns), (1, 3_100, 100, 3_000));
    }

    #[test]
    fn overlap_merges_and_clips() {
        assert_eq!(overlap([(0, 10), (5, 20), (30, 40)].into_iter(), 8, 35), 17);
        assert_eq!(overlap(std::iter::empty(), 0, 10), 0);
        assert_eq!(overlap([(50, 60)].into_iter(), 0, 10), 0);
    }
}
