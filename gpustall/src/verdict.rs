//! The answer: the most likely cause of a stall, the processes behind it, and the measured
//! evidence. Causes (the documented set for `verdict.cause`):
//! - `host_memory_oom`: host/cgroup memory ran out and the OOM killer killed a traced process;
//! - `host_memory_pressure`: traced processes stalled in reclaim and swapped, no kill (yet);
//! - `none_detected`: nothing in the traced tree explains a stall.

use serde::Serialize;

use crate::model::Model;

#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Verdict {
    pub cause: &'static str,
    /// Most to least responsible.
    pub culprit_pids: Vec<u32>,
    pub text: String,
    /// Each link of the chain, a measured figure, in time order where it has a time.
    pub evidence: Vec<String>,
}

/// Reclaim stall time below this fraction of the trace is background noise, not pressure.
const PRESSURE_STALL_FRACTION: f64 = 0.01;

fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

pub fn decide(m: &Model, now_ns: u64) -> Verdict {
    let duration_ns = now_ns.saturating_sub(m.start_ns).max(1);
    // Processes ranked by the reclaim they suffered and the memory they held.
    let mut ranked: Vec<(u32, u64, u64, u64)> = m
        .tree
        .iter()
        .map(|n| {
            let p = m.procs.get(&n.pid);
            let stall = p.map_or(0, |p| p.counters.direct_reclaim_ns + p.counters.memcg_reclaim_ns);
            let swap = p.map_or(0, |p| p.counters.swapout_anon_folios);
            let peak = p.map_or(0, |p| p.peak_rss_kb);
            (n.pid, stall, swap, peak)
        })
        .collect();
    ranked.sort_by(|a, b| b.3.cmp(&a.3).then(b.1.cmp(&a.1)));
    let total_stall: u64 = ranked.iter().map(|r| r.1).sum();
    let total_swap: u64 = ranked.iter().map(|r| r.2).sum();
    let mut evidence = Vec::new();
    for (pid, stall, swap, peak) in ranked.iter().filter(|r| r.1 > 0 || r.2 > 0) {
        let comm = m.tree.get(*pid).map_or("?", |n| n.comm.as_str());
        evidence.push(format!(
            "pid {pid} ({comm}): peak RSS {:.0} MiB, {:.1} ms in reclaim, {} pages swapped out",
            mib(*peak),
            *stall as f64 / 1e6,
            swap
        ));
    }
    let kills: Vec<_> = m.oom_kills.iter().filter(|o| m.tree.contains(o.victim_pid)).collect();
    if let Some(first) = kills.first() {
        for o in &kills {
            evidence.push(format!(
                "OOM kill at +{:.2}s: pid {} ({}) with anon-rss {} , killer invoked by pid {} ({})",
                o.t_ns.saturating_sub(m.start_ns) as f64 / 1e9,
                o.victim_pid,
                o.victim_comm,
                o.rss.map_or("unknown".to_string(), |r| format!("{:.0} MiB", mib(r.anon_rss_kb))),
                o.trigger_pid,
                o.trigger_comm
            ));
        }
        let mut culprits: Vec<u32> = kills.iter().map(|o| o.victim_pid).collect();
        culprits.extend(ranked.iter().filter(|r| r.3 > 0 || r.1 > 0).map(|r| r.0));
        let mut seen = std::collections::HashSet::new();
        culprits.retain(|p| seen.insert(*p));
        return Verdict {
            cause: "host_memory_oom",
            text: format!(
                "Host memory ran out: the OOM killer killed pid {} ({}) after the traced processes spent {:.1} ms in reclaim and swapped out {} pages.",
                first.victim_pid, first.victim_comm, total_stall as f64 / 1e6, total_swap
            ),
            culprit_pids: culprits,
            evidence,
        };
    }
    if total_stall as f64 / duration_ns as f64 >= PRESSURE_STALL_FRACTION || total_swap > 0 {
        return Verdict {
            cause: "host_memory_pressure",
            text: format!(
                "Memory pressure: the traced processes spent {:.1} ms ({:.1}% of the trace) stalled in reclaim and swapped out {} pages.",
                total_stall as f64 / 1e6,
                100.0 * total_stall as f64 / duration_ns as f64,
                total_swap
            ),
            culprit_pids: ranked.iter().filter(|r| r.1 > 0 || r.2 > 0).map(|r| r.0).collect(),
            evidence,
        };
    }
    Verdict {
        cause: "none_detected",
        text: "No memory pressure or OOM kill in the traced tree.".to_string(),
        culprit_pids: Vec::new(),
        evidence,
    }
}
