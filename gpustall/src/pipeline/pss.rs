//! Whose proportional memory (PSS) is read this beat.
//!
//! PSS comes from /proc/PID/smaps_rollup, for which the kernel walks the process's page tables
//! (and looks up the swap count of every swapped-out page): about a millisecond per 200 MiB
//! process under swap on the bench VM, most of the agent's CPU when it read every process of
//! the job every second. The walks of one beat are bounded by [`PSS_BUDGET`], estimated from
//! each process's last walk: the processes whose PSS is most overdue go first (never read,
//! then the longest ago), and at least one is read each beat. A small job is read whole every
//! beat; a large one in turns, each process every few seconds. The peak and growth the summary
//! reports are those of the samples taken, as before.

use std::collections::BTreeMap;
use std::time::Duration;

/// Page-table walks per beat, as estimated from each process's last walk.
pub const PSS_BUDGET: Duration = Duration::from_millis(1);

/// When each process's PSS was last read and what that walk cost.
#[derive(Default)]
pub struct PssTurns {
    last: BTreeMap<u32, Walk>,
}

#[derive(Clone, Copy)]
struct Walk {
    at_ns: u64,
    cost: Duration,
}

impl PssTurns {
    /// The processes of `wanted` to read this beat: most overdue first, while the estimated
    /// cost stays within [`PSS_BUDGET`] (a process never read counts as free: its first
    /// sample is what PSS growth is measured from).
    pub fn due(&self, wanted: &[u32]) -> Vec<u32> {
        let mut order: Vec<(u64, u32)> =
            wanted.iter().map(|&pid| (self.last.get(&pid).map_or(0, |w| w.at_ns), pid)).collect();
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

    /// `pid`'s PSS was read at `at_ns`, in `cost`.
    pub fn read(&mut self, pid: u32, at_ns: u64, cost: Duration) {
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
        t.read(1, 30, MS);
        t.read(2, 10, MS);
        t.read(3, 20, MS);
        // One walk fills the budget: the longest ago goes.
        assert_eq!(t.due(&[1, 2, 3]), vec![2]);
        t.read(2, 40, MS);
        assert_eq!(t.due(&[1, 2, 3]), vec![3]);
        // A process never read goes first, and costs nothing in the estimate.
        assert_eq!(t.due(&[1, 2, 3, 9]), vec![9, 3]);
    }

    #[test]
    fn exited_processes_are_forgotten() {
        let mut t = PssTurns::default();
        t.read(1, 30, MS);
        t.read(2, 10, MS);
        t.retain(|pid| pid == 1);
        // 2 is new again if its pid comes back.
        assert_eq!(t.due(&[1, 2]), vec![2, 1]);
    }
}
