//! Whose proportional memory (PSS) is read this beat.
//!
//! PSS comes from /proc/PID/smaps_rollup, for which the kernel walks the process's page tables
//! (and looks up the swap count of every swapped-out page): by perf, two thirds of the agent's
//! CPU on an 8-worker torch DataLoader when the job's processes were walked in turn every beat.
//! A walk is done for what changed:
//! - a process's first sample (what its PSS growth is measured from);
//! - a process whose anonymous, shared-memory and swapped memory (`MemSample::pss_base_kb`,
//!   read cheaply every beat; a mapped file's pages come and go with the cache) moved by
//!   [`MOVED_SHARE`] of it, and at least [`MOVED_MIN_KB`], since its last walk: growth toward an
//!   OOM kill is walked as it happens, a steady worker is not walked again;
//! - one whose last walk is [`MAX_AGE_NS`] old: PSS also moves when the pages a process shares
//!   change hands (a sibling forks or exits) without its own memory moving.
//!
//! The walks of one beat are bounded by [`PSS_BUDGET`], estimated from each process's last
//! walk: the most overdue go first (never walked, then the longest ago), and at least one is
//! walked each beat when any is due. The peak and growth the summary reports are those of the
//! walks taken (docs/HOW-IT-WORKS.md). On an idle 8-worker DataLoader the agent's CPU while
//! tracing went from 2.0-2.1 % of a CPU to 0.9-1.25 %; on one moving 80 MiB batches through
//! shared memory every worker moves every beat, and nothing changed.

use std::collections::BTreeMap;
use std::time::Duration;

/// Page-table walks per beat, as estimated from each process's last walk.
pub const PSS_BUDGET: Duration = Duration::from_millis(1);
/// A process's memory moved when it changed by this share of what it held at its last walk...
pub const MOVED_SHARE: u64 = 256;
/// ...and by at least this much (small processes move by a page or two all the time).
pub const MOVED_MIN_KB: u64 = 1024;
/// A process's PSS is walked again after this long even when its memory did not move.
pub const MAX_AGE_NS: u64 = 60_000_000_000;

/// When each process's PSS was last read, what that walk cost and what the process held then.
#[derive(Default)]
pub struct PssTurns {
    last: BTreeMap<u32, Walk>,
}

#[derive(Clone, Copy)]
struct Walk {
    at_ns: u64,
    cost: Duration,
    /// Its `MemSample::pss_base_kb` when it was walked.
    held_kb: u64,
}

impl Walk {
    /// Whether a process that holds `held_kb` now is due a walk at `now_ns`.
    fn stale(&self, held_kb: u64, now_ns: u64) -> bool {
        let moved = held_kb.abs_diff(self.held_kb) >= MOVED_MIN_KB.max(self.held_kb / MOVED_SHARE);
        moved || now_ns.saturating_sub(self.at_ns) >= MAX_AGE_NS
    }
}

impl PssTurns {
    /// The processes of `wanted` (each with what it holds now, `MemSample::pss_base_kb`) to walk
    /// at `now_ns`: those due, most overdue first, while the estimated cost stays within
    /// [`PSS_BUDGET`] (a process never walked counts as free: its first sample is what PSS
    /// growth is measured from).
    pub fn due(&self, wanted: &[(u32, u64)], now_ns: u64) -> Vec<u32> {
        let mut order: Vec<(u64, u32)> = wanted
            .iter()
            .filter_map(|&(pid, held_kb)| match self.last.get(&pid) {
                None => Some((0, pid)),
                Some(w) => w.stale(held_kb, now_ns).then_some((w.at_ns, pid)),
            })
            .collect();
        order.sort_unstable();
        let mut spent = Duration::ZERO;
        let mut out = Vec::new();
        for (_, pid) in order {
            if !out.is_empty() && spent >= PSS_BUDGET {
                break;
            }
            spent += self.last.get(&pid).map_or(Duration::ZERO, |w| w.cost);
            out.push(pid);
        }
        out
    }

    /// `pid`'s PSS was read at `at_ns`, in `cost`, while it held `held_kb`.
    pub fn read(&mut self, pid: u32, at_ns: u64, cost: Duration, held_kb: u64) {
        self.last.insert(pid, Walk { at_ns, cost, held_kb });
    }

    /// Forgets the processes for which `keep` is false (exited).
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        self.last.retain(|&pid, _| keep(pid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const S: u64 = 1_000_000_000;
    /// 300 MiB, a torch worker's.
    const HELD: u64 = 300 << 10;

    #[test]
    fn a_small_job_is_read_whole_on_its_first_beat_then_as_it_moves() {
        let mut t = PssTurns::default();
        let held = |kb| [(3, kb), (1, kb), (2, kb)];
        assert_eq!(t.due(&held(HELD), S), vec![1, 2, 3]);
        for pid in [1, 2, 3] {
            t.read(pid, S, MS / 10, HELD);
        }
        // Steady: no walk; 1 MiB more is under 1/256 of 300 MiB (1.2 MiB): not a move either.
        assert_eq!(t.due(&held(HELD + 1024), 2 * S), Vec::<u32>::new());
        // Grown by 2 MiB: walked again.
        assert_eq!(t.due(&[(1, HELD), (2, HELD + 2048), (3, HELD)], 3 * S), vec![2]);
        // Shrunk by as much (memory freed): walked too.
        assert_eq!(t.due(&[(1, HELD - 2048), (2, HELD), (3, HELD)], 3 * S), vec![1]);
        // A minute without a walk: its shared pages may have changed hands.
        assert_eq!(t.due(&held(HELD), S + MAX_AGE_NS), vec![1, 2, 3]);
    }

    #[test]
    fn a_small_process_moves_by_1_mib_not_by_its_share() {
        let mut t = PssTurns::default();
        t.read(1, S, MS, 4096);
        assert!(t.due(&[(1, 4096 + 512)], 2 * S).is_empty());
        assert_eq!(t.due(&[(1, 4096 + 1024)], 2 * S), vec![1]);
    }

    #[test]
    fn costly_walks_take_turns_most_overdue_first() {
        let mut t = PssTurns::default();
        t.read(1, 30, MS, 0);
        t.read(2, 10, MS, 0);
        t.read(3, 20, MS, 0);
        let grown = [(1, HELD), (2, HELD), (3, HELD)];
        // One walk fills the budget: the longest ago goes.
        assert_eq!(t.due(&grown, 40), vec![2]);
        t.read(2, 40, MS, HELD);
        assert_eq!(t.due(&grown, 50), vec![3]);
        // A process never read goes first, and costs nothing in the estimate.
        assert_eq!(t.due(&[(1, HELD), (2, HELD), (3, HELD), (9, HELD)], 50), vec![9, 3]);
    }

    #[test]
    fn exited_processes_are_forgotten() {
        let mut t = PssTurns::default();
        t.read(1, 30, MS, HELD);
        t.read(2, 10, MS, HELD);
        t.retain(|pid| pid == 1);
        // 2 is new again if its pid comes back; 1 has not moved.
        assert_eq!(t.due(&[(1, HELD), (2, HELD)], 40), vec![2]);
    }
}
