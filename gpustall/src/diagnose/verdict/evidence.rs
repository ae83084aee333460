//! Evidence: the links of a chain, each a measured figure, put in time order; and the few
//! formatting helpers every rule uses.

use crate::diagnose::facts::{CgroupFacts, Facts, ProcFacts};

pub const MIB_KB: f64 = 1024.0;

pub fn at(f: &Facts, t: u64) -> String {
    format!("+{:.1}s", t.saturating_sub(f.start_ns) as f64 / 1e9)
}

pub fn mib_kb(kb: u64) -> String {
    format!("{:.0} MiB", kb as f64 / MIB_KB)
}

/// "1 worker", "2 workers".
pub fn workers_n(n: u64) -> String {
    format!("{n} worker{}", if n == 1 { "" } else { "s" })
}

pub fn mib_b(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / 1048576.0)
}

pub fn name(p: &ProcFacts) -> String {
    if p.pid == 0 {
        return p.comm.clone(); // the folded processes of a role, together
    }
    match p.worker_index {
        Some(i) => format!("DataLoader worker {i} (pid {})", p.pid),
        None if p.is_trainer => format!("the trainer (pid {})", p.pid),
        None => format!("{} (pid {})", p.comm, p.pid),
    }
}

/// Time-ordered evidence.
pub struct Chain(pub Vec<(u64, String)>);

impl Chain {
    pub fn push(&mut self, t: u64, s: String) {
        self.0.push((t, s));
    }

    /// A link at `t`, said with its time in the trace: "+12.3s: {text}".
    pub fn at(&mut self, f: &Facts, t: u64, text: impl std::fmt::Display) {
        self.0.push((t, format!("{}: {text}", at(f, t))));
    }
    pub fn done(mut self) -> Vec<String> {
        self.0.sort_by_key(|(t, _)| *t);
        self.0.into_iter().map(|(_, s)| s).collect()
    }
}

/// 1234567 as "1,234,567".
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The kernel's own account of the cgroup's pressure: how often it hit its limits (v2
/// memory.events) and how long its tasks waited for memory (PSI), and the host's PSI.
pub fn cgroup_links(f: &Facts) -> Vec<String> {
    let mut links = Vec::new();
    if let Some(c) = &f.cgroup {
        if let Some(e) = c.events.as_ref().filter(|e| !e.is_zero()) {
            let mut parts = vec![format!(
                "memory cgroup {} hit its limit {} times (memory.events max)",
                c.limiting_path(),
                thousands(e.max)
            )];
            if e.high > 0 {
                parts.push(format!("went over memory.high {} times", thousands(e.high)));
            }
            if e.low > 0 {
                parts.push(format!("was reclaimed below memory.low {} times", thousands(e.low)));
            }
            if e.oom > 0 {
                parts.push(format!("{} OOM (reclaim could not make room)", e.oom));
            }
            parts.push(format!("{} OOM kills", e.oom_kill));
            if let Some(g) = e.oom_group_kill.filter(|g| *g > 0) {
                parts.push(format!("{g} group OOM kills"));
            }
            links.push(parts.join(", "));
        }
        if let Some(p) = c.pressure.as_ref().filter(|p| p.some_us > 0) {
            links.push(psi_link(&format!("memory cgroup {}", c.path), p));
        }
    }
    if let Some(p) = f.host_pressure.as_ref().filter(|p| p.some_us > 0) {
        links.push(psi_link("the host", p));
    }
    links
}

fn psi_link(scope: &str, p: &crate::model::host::PsiDelta) -> String {
    format!(
        "memory pressure (PSI) in {scope}: some task waited for memory {:.2} s, all tasks at once {:.2} s over the trace (worst 10 s average {:.0} % some, {:.0} % full)",
        p.some_us as f64 / 1e6,
        p.full_us as f64 / 1e6,
        p.peak_some_avg10,
        p.peak_full_avg10
    )
}

/// A process's growth: from its first sample to its peak, or, never sampled before its OOM
/// kill, the killer's figure alone.
fn growth_link(f: &Facts, p: &ProcFacts, chain: &mut Chain) {
    if p.first_mem_ns == p.peak_mem_ns && p.oom_killed {
        // Never sampled before its kill: its only figure is the OOM killer's.
        chain.at(f, p.peak_mem_ns, format!("{} held {} when it was killed (the OOM killer's figure; it grew faster than the 1 s samples)", name(p), mib_kb(p.peak_mem_kb)));
        return;
    }
    chain.push(
        p.first_mem_ns,
        format!(
            "{at}: {} grew from {} to {} held (resident + swapped; peak at {})",
            name(p),
            mib_kb(p.first_mem_kb),
            mib_kb(p.peak_mem_kb),
            at(f, p.peak_mem_ns),
            at = at(f, p.first_mem_ns)
        ),
    );
}

pub fn memory_chain(f: &Facts, chain: &mut Chain) {
    // Those that grew at least a tenth as much as the largest grower: the rest is noise.
    let max_growth =
        f.procs.iter().map(|p| p.peak_mem_kb.saturating_sub(p.first_mem_kb)).max().unwrap_or(0);
    let mut growers: Vec<&ProcFacts> = f
        .procs
        .iter()
        .filter(|p| {
            p.peak_mem_kb > p.first_mem_kb && (p.peak_mem_kb - p.first_mem_kb) * 10 >= max_growth
        })
        .collect();
    growers.sort_by_key(|p| std::cmp::Reverse(p.peak_mem_kb - p.first_mem_kb));
    for p in growers.iter().take(4) {
        growth_link(f, p, chain);
    }
    let first_reclaim = f.procs.iter().filter_map(|p| p.first_reclaim_ns).min().unwrap_or(f.end_ns);
    if let Some(CgroupFacts { path, limit_bytes: Some(limit), peak_usage_bytes: peak, .. }) =
        &f.cgroup
    {
        let whose = match &f.cgroup.as_ref().and_then(|c| c.limit_set_by.clone()) {
            Some(by) => format!("the {} limit set by its ancestor {by}", mib_b(*limit)),
            None => format!("its {} limit", mib_b(*limit)),
        };
        chain.push(
            first_reclaim,
            format!("memory cgroup {path}: usage peaked at {} of {whose}", mib_b(*peak)),
        );
    }
    chain.0.extend(cgroup_links(f).into_iter().map(|l| (first_reclaim, l)));
    let stalled: Vec<&ProcFacts> = f.procs.iter().filter(|p| p.reclaim_count > 0).collect();
    if let Some(first) = stalled.iter().filter_map(|p| p.first_reclaim_ns).min() {
        let total_ns: u64 = stalled.iter().map(|p| p.reclaim_ns).sum();
        let count: u64 = stalled.iter().map(|p| p.reclaim_count).sum();
        chain.at(f, first, format!("reclaim began; {} stalled a combined {:.2} s in {} reclaim episodes ({:.0}% of their time over the trace)", match stalled.len() {
                    1 => "1 traced process".to_string(),
                    n => format!("{n} traced processes"),
                }, total_ns as f64 / 1e9, count, 100.0 * total_ns as f64 / (f.end_ns.saturating_sub(f.start_ns).max(1) as f64 * stalled.len() as f64)));
    }
    let swap: u64 = f.procs.iter().map(|p| p.swapout_pages).sum();
    let rio: u64 = f.procs.iter().map(|p| p.reclaim_io_bytes).sum();
    if swap > 0 || rio > 0 {
        chain.push(
            f.procs.iter().filter_map(|p| p.first_reclaim_ns).min().unwrap_or(f.end_ns) + 1,
            format!(
                "their reclaim swapped out {} pages ({}) and submitted {} of disk I/O (host pswpout {}, pswpin {})",
                swap,
                mib_b(swap * f.page_bytes()),
                mib_b(rio),
                f.pswpout,
                f.pswpin
            ),
        );
    }
    for d in f.disks.iter().filter(|d| d.peak_busy_pct >= 50.0) {
        chain.push(
            f.end_ns.saturating_sub(2),
            format!(
                "disk {} was {:.0}% busy over the trace, {:.0}% at its busiest second",
                d.name, d.busy_pct, d.peak_busy_pct
            ),
        );
    }
}

/// The job's processes NVML listed on a GPU, by what they are to the job: "rank 3 (pid 812)",
/// "the trainer (pid 640)", else "pid 77".
pub fn holders(f: &Facts, pids: &[u32]) -> String {
    let one = |pid: u32| match f.procs.iter().find(|p| p.pid == pid) {
        Some(p) if p.rank.is_some() => format!("rank {} (pid {pid})", p.rank.unwrap_or(0)),
        Some(p) if p.is_trainer => format!("the trainer (pid {pid})"),
        _ => format!("pid {pid}"),
    };
    pids.iter().map(|&p| one(p)).collect::<Vec<_>>().join(", ")
}

pub fn stall_links(f: &Facts, chain: &mut Chain) {
    for s in &f.gpu_stalls {
        let thr = if s.throttle_reasons.is_empty() {
            String::new()
        } else {
            format!(", throttled: {}", s.throttle_reasons.join(", "))
        };
        chain.at(
            f,
            s.start_ns,
            format!(
                "GPU {} idle (<= threshold) for {:.1} s{}{}",
                s.gpu_index,
                s.duration_ns as f64 / 1e9,
                if s.pids.is_empty() {
                    String::new()
                } else {
                    format!(" while {} held it", holders(f, &s.pids))
                },
                thr
            ),
        );
    }
    if let (Some(tr), Some(t)) = (&f.data_time, f.data_time_rise_ns) {
        chain.at(
            f,
            t,
            format!(
                "data_time {} (x{:.1} at the end, max {:.3} s over {} steps)",
                crate::model::steps::rise_words(tr),
                tr.ratio,
                tr.max_s,
                tr.steps
            ),
        );
    }
}

pub fn gpu_clause(f: &Facts) -> String {
    let mut parts = Vec::new();
    if let Some(s) = f.gpu_stalls.first() {
        let whose = if s.pids.is_empty() {
            String::new()
        } else {
            format!(" while {} held it", holders(f, &s.pids))
        };
        parts.push(format!(
            "; GPU {} sat idle {:.1} s from {}{whose}",
            s.gpu_index,
            s.duration_ns as f64 / 1e9,
            at(f, s.start_ns)
        ));
    }
    if let (Some(tr), Some(_)) = (&f.data_time, f.data_time_rise_ns) {
        parts.push(format!("; data_time {}", crate::model::steps::rise_words(tr)));
    }
    parts.push(super::datawait::clause(f));
    parts.concat()
}

/// Processes that matter to the memory chain: at least a tenth of the largest growth, or of
/// the largest reclaim stall (helpers such as Python's resource tracker drop out).
pub fn significant(ranked: &[&ProcFacts]) -> Vec<u32> {
    let growth = |p: &ProcFacts| p.peak_mem_kb.saturating_sub(p.first_mem_kb);
    let max_growth = ranked.iter().map(|p| growth(p)).max().unwrap_or(0);
    let max_stall = ranked.iter().map(|p| p.reclaim_ns).max().unwrap_or(0);
    ranked
        .iter()
        .filter(|p| {
            (max_growth > 0 && growth(p) * 10 >= max_growth)
                || (max_stall > 0 && p.reclaim_ns * 10 >= max_stall)
        })
        .map(|p| p.pid)
        .collect()
}

pub fn dedup(v: &mut Vec<u32>) {
    let mut seen = std::collections::HashSet::new();
    v.retain(|p| seen.insert(*p));
}
