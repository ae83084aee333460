//! Incidents the session does not see in a single event: a reclaim storm is a rate held for
//! seconds. (OOM kills, SIGKILLs, GPU stalls and GPU faults are classified as they are taken
//! in, in `session`.)

use crate::model::incident::{Incident, IncidentKind};
use crate::model::Model;

/// A storm: the watched processes together stalled at least this long in reclaim per second...
const STORM_STALL_PER_S: f64 = 0.5;
/// ... for this many consecutive seconds.
const STORM_SECONDS: u32 = 3;

/// Reclaim storms: the watched processes stall in reclaim most of the time, for seconds. One
/// incident per storm, named for the process that stalled longest.
#[derive(Default)]
pub struct Storms {
    last_reclaim_ns: u64,
    ticks: u32,
    on: bool,
}

impl Storms {
    /// Called once a second.
    pub fn tick(&mut self, m: &Model, now: u64) -> Option<Incident> {
        let stalled = |p: &crate::model::stats::ProcStats| p.counters.reclaim_ns();
        let total: u64 = m.procs.values().map(stalled).sum();
        let rate = total.saturating_sub(self.last_reclaim_ns) as f64 / 1e9;
        self.last_reclaim_ns = total;
        self.ticks = if rate >= STORM_STALL_PER_S { self.ticks + 1 } else { 0 };
        let starts = self.ticks >= STORM_SECONDS && !self.on;
        self.on = self.ticks > 0 && (self.on || starts);
        if !starts {
            return None;
        }
        let pid = m.procs.iter().max_by_key(|(_, p)| stalled(p)).map_or(0, |(pid, _)| *pid);
        Some(Incident { kind: IncidentKind::ReclaimStorm, t_ns: now, pid })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stall(m: &mut Model, pid: u32, ns: u64) {
        m.procs.entry(pid).or_default().counters.memcg_reclaim_ns += ns;
    }

    #[test]
    fn three_seconds_of_reclaim_make_one_storm_named_for_the_longest_staller() {
        let (mut m, mut s) = (Model::default(), Storms::default());
        let s1 = 1_000_000_000;
        let mut fired = Vec::new();
        for sec in 1..=6u64 {
            stall(&mut m, 7, 600_000_000);
            stall(&mut m, 8, 100_000_000);
            fired.extend(s.tick(&m, sec * s1).map(|i| (i.t_ns / s1, i.pid)));
        }
        assert_eq!(fired, [(3, 7)], "once, at the third second");
        // A quiet second ends it; the next storm is a new incident.
        assert!(s.tick(&m, 7 * s1).is_none());
        for sec in 8..=10u64 {
            stall(&mut m, 8, 900_000_000);
            fired.extend(s.tick(&m, sec * s1).map(|i| (i.t_ns / s1, i.pid)));
        }
        assert_eq!(fired, [(3, 7), (10, 7)], "named by all it stalled");
    }
}
