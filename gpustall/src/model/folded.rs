//! Exited processes that matter to no verdict, folded into per-role totals: what keeps the
//! model bounded when a job forks thousands of short children (a shell loop, a data pipeline
//! spawning a decoder per file). A process is folded only when it has exited normally, was
//! not killed, never stalled in reclaim or swapped, has an ordinary role and no process of
//! the tree below it; the most recent exits are kept as they are.
//!
//! Folding is a recorded sample (`Sample::Fold`), so a replay folds the same processes and
//! gives the same summary.

use gpustall_common::counters::IoOp;
use serde::Serialize;

use crate::model::{proctree::Role, Model};

/// Exited, unremarkable processes kept one by one before the oldest are folded.
pub const KEEP_EXITED: usize = 2048;

/// What the folded processes of one role did, together.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FoldedTotals {
    pub processes: u64,
    pub block_read_bytes: u64,
    pub block_write_bytes: u64,
    /// Sum of their block request latencies and of their lifetimes: a pipeline of short
    /// readers that waited on the disk still reads as disk-bound.
    pub io_wait_ns: u64,
    pub lifetime_ns: u64,
}

impl Model {
    /// Exited processes to fold now, oldest exit first, leaving [`KEEP_EXITED`] of them.
    pub fn foldable(&self) -> Vec<u32> {
        let mut candidates: Vec<(u64, u32)> = self
            .tree
            .iter()
            .filter(|n| n.exit_ns.is_some())
            .filter(|n| self.unremarkable(n.pid))
            .map(|n| (n.exit_ns.unwrap_or(0), n.pid))
            .collect();
        if candidates.len() <= KEEP_EXITED {
            return Vec::new();
        }
        // Leaves only: a folded parent would cut its live children off the tree.
        let parents: std::collections::HashSet<u32> = self.tree.iter().map(|n| n.ppid).collect();
        candidates.retain(|(_, pid)| !parents.contains(pid));
        candidates.sort_unstable();
        let excess = candidates.len().saturating_sub(KEEP_EXITED);
        candidates.into_iter().take(excess).map(|(_, pid)| pid).collect()
    }

    fn unremarkable(&self, pid: u32) -> bool {
        let Some(n) = self.tree.get(pid) else { return false };
        let clean_exit = n.exit_signal().is_none() && n.exit_status().is_none_or(|c| c == 0);
        let calm = self.procs.get(&pid).is_none_or(|p| {
            let c = &p.counters;
            c.reclaim_count() == 0 && c.swapout_anon_pages == 0
        });
        clean_exit
            && calm
            && !n.oom_killed
            && n.killed_by.is_none()
            && self.tree.role(pid) == Role::Other
    }

    /// Folds these processes (exited, see [`Model::foldable`]) into the per-role totals.
    pub fn fold(&mut self, pids: &[u32]) {
        for &pid in pids {
            let role = self.tree.role(pid);
            let Some(n) = self.tree.get(pid) else { continue };
            let lifetime =
                n.exit_ns.unwrap_or(self.last_ns).saturating_sub(n.started_ns.max(self.start_ns));
            let t = self.folded.entry(role).or_default();
            t.processes += 1;
            t.lifetime_ns += lifetime;
            if let Some(p) = self.procs.remove(&pid) {
                t.block_read_bytes += p.io_bytes(IoOp::Read, None);
                t.block_write_bytes += p.io_bytes(IoOp::Write, None);
                t.io_wait_ns += p.io.values().map(|v| v.latency_ns_sum).sum::<u64>();
            }
            self.offcpu.long.forget(pid);
            self.tree.remove(pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::{Event, Header};

    fn h(t_ns: u64, pid: u32) -> Header {
        Header { t_ns, pid, tid: pid, comm: "sh".into() }
    }

    #[test]
    fn a_fork_storm_folds_its_oldest_clean_exits_and_keeps_what_matters() {
        let mut m = Model::default();
        m.tree.seed(1, 0, "sh", true, 0);
        let n = KEEP_EXITED as u32 + 500;
        for pid in 2..2 + n {
            m.apply(&Event::Fork { h: h(u64::from(pid), 1), child_pid: pid, clone_flags: 0 });
            // pid 5 was killed by a signal: it matters and stays.
            let status = if pid == 5 { 9 } else { 0 };
            m.apply(&Event::Exit { h: h(u64::from(pid) + 1, pid), exit_code: Some(status) });
        }
        let pids = m.foldable();
        assert_eq!(pids.len(), 499, "all but the newest KEEP_EXITED clean exits");
        assert!(!pids.contains(&5) && !pids.contains(&1));
        assert_eq!(pids[0], 2, "oldest exit first");
        m.fold(&pids);
        assert_eq!(m.folded[&Role::Other].processes, 499);
        assert!(m.tree.get(5).is_some() && m.tree.get(2).is_none());
        assert!(m.foldable().is_empty(), "nothing more to fold");
    }
}
