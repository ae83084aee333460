//! Whose proportional memory (PSS) is read this beat.
//!
//! PSS comes from /proc/PID/smaps_rollup, for which the kernel walks the process's page tables
//! (and looks up the swap count of every swapped-out page): about a millisecond per 200 MiB
//! process under swap on the bench VM, and several for a larger one: most of the agent's CPU
//! when it read every process of the job every second. The walks are paid from a budget of
//! [`PSS_BUDGET`] a beat, carried from beat to beat (up to [`PSS_CREDIT_MAX`]): the processes
//! whose PSS is most overdue go first (never read, then the longest ago), each at the cost its
//! last walk took. A small job is read whole every beat; a large one in turns; a single process
//! whose walk costs more than the budget every few beats (when the credit is full, it is read
//! on credit and the next beats pay it back). The peak and growth the summary reports are those
//! of the samples taken, as before.

use std::collections::BTreeMap;
use std::time::Duration;

/// Page-table walks per beat, on average.
pub const PSS_BUDGET: Duration = Duration::from_millis(1);
/// The most budget a quiet spell saves up.
pub const PSS_CREDIT_MAX: Duration = Duration::from_millis(4);

/// When each process's PSS was last read and what that walk cost; the budget left.
#[derive(Default)]
pub struct PssTurns {
    last: BTreeMap<u32, Walk>,
    /// Budget left, in ns: negative after a walk read on credit.
    credit_ns: i64,
}

#[derive(Clone, Copy)]
struct Walk {
    at_ns: u64,
    cost: Duration,
}

fn ns(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

impl PssTurns {
    /// The processes of `wanted` to read this beat: most overdue first, while the budget (this
    /// beat's and what earlier beats saved) covers their estimated cost. A process never read
    /// counts as free: its first sample is what PSS growth is measured from. The walks are
    /// charged when read ([`PssTurns::read`]).
    pub fn due(&mut self, wanted: &[u32]) -> Vec<u32> {
        self.credit_ns = (self.credit_ns + ns(PSS_BUDGET)).min(ns(PSS_CREDIT_MAX));
        let mut order: Vec<(u64, u32)> =
            wanted.iter().map(|&pid| (self.last.get(&pid).map_or(0, |w| w.at_ns), pid)).collect();
        order.sort_unstable();
        let full = self.credit_ns >= ns(PSS_CREDIT_MAX);
        let mut left = self.credit_ns;
        let mut out = Vec::new();
        for (_, pid) in order {
            let cost = self.last.get(&pid).map_or(0, |w| ns(w.cost));
            // In order: a cheaper process further down does not jump a dear overdue one, which
            // would then wait for ever. A full credit buys the first walk whatever it costs.
            let first_on_credit = full && out.is_empty();
            if cost > 0 && cost > left && !first_on_credit {
                break;
            }
            left -= cost;
            out.push(pid);
        }
        out
    }

    /// `pid`'s PSS was read at `at_ns`, in `cost`, paid from the budget.
    pub fn read(&mut self, pid: u32, at_ns: u64, cost: Duration) {
        self.credit_ns -= ns(cost);
        self.last.insert(pid, Walk { at_ns, cost });
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

    #[test]
    fn a_small_job_is_read_whole_every_beat() {
        let mut t = PssTurns::default();
        assert_eq!(t.due(&[3, 1, 2]), vec![1, 2, 3]);
        for pid in [1, 2, 3] {
            t.read(pid, 10, MS / 10);
        }
        assert_eq!(t.due(&[1, 2, 3]), vec![1, 2, 3]);
    }

    #[test]
    fn costly_walks_take_turns_most_overdue_first() {
        let mut t = PssTurns::default();
        assert_eq!(t.due(&[1, 2, 3]).len(), 3, "never read: free");
        t.read(1, 30, MS);
        t.read(2, 10, MS);
        t.read(3, 20, MS);
        // Three walks of a beat's budget each, paid back first: then one a beat, the longest
        // ago first.
        assert_eq!(t.due(&[1, 2, 3]), Vec::<u32>::new());
        assert_eq!(t.due(&[1, 2, 3]), Vec::<u32>::new());
        assert_eq!(t.due(&[1, 2, 3]), vec![2]);
        t.read(2, 40, MS);
        assert_eq!(t.due(&[1, 2, 3]), vec![3]);
        t.read(3, 50, MS);
        // A process never read goes first, and costs nothing in the estimate.
        assert_eq!(t.due(&[1, 2, 3, 9]), vec![9, 1]);
    }

    #[test]
    fn a_walk_dearer_than_the_budget_is_read_every_few_beats() {
        let mut t = PssTurns::default();
        let mut reads = 0;
        for beat in 0..40u64 {
            if t.due(&[7]) == vec![7] {
                reads += 1;
                t.read(7, beat, 5 * MS);
            }
        }
        // 5 ms a walk against 1 ms a beat: about one beat in five, never starved.
        assert!((7..=9).contains(&reads), "{reads} reads in 40 beats");
    }

    #[test]
    fn exited_processes_are_forgotten() {
        let mut t = PssTurns::default();
        t.read(1, 30, MS);
        t.read(2, 10, MS);
        t.retain(|pid| pid == 1);
        // 2 is new again if its pid comes back (free); 1 waits for the walks paid back.
        assert_eq!(t.due(&[1, 2]), vec![2]);
        assert_eq!(t.due(&[1, 2]), vec![2]);
        assert_eq!(t.due(&[1, 2]), vec![2, 1]);
    }
}
