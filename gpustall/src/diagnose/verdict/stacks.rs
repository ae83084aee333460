//! The job's own lines in a verdict, from its Python stacks (`model::pystacks`): where the
//! workers' CPU goes, the line a stuck process blocks on, where the trainer waits for data and
//! what receiving its batches costs it.

use super::evidence::{at, name, Chain};
use crate::diagnose::facts::{Facts, ProcFacts};
use crate::model::pystacks::{self, ProcStacks};

/// Hot spots named in a verdict.
const TOP: usize = 3;
use crate::model::pystacks::MIN_SAMPLES;
/// A site with less than this share of the samples is not named.
const MIN_SHARE: f64 = 0.05;

fn sampled<'a>(f: &'a Facts, pids: &[u32]) -> Vec<&'a ProcStacks> {
    pids.iter().filter_map(|p| f.py_stacks.get(*p)).collect()
}

/// "61 % in ds.py:9 `decode` -> numpy/...; 20 % in ...", from the on-CPU samples of `pids`.
pub fn hot_spots(f: &Facts, pids: &[u32]) -> Option<(String, u64)> {
    let procs = sampled(f, pids);
    let (spots, total) = pystacks::hot_spots(&procs, TOP);
    if total < MIN_SAMPLES {
        return None;
    }
    let named: Vec<String> = spots
        .iter()
        .filter(|s| s.share >= MIN_SHARE)
        .map(|s| format!("{:.0} % in {}", s.share * 100.0, s.site))
        .collect();
    (!named.is_empty()).then(|| (named.join("; "), total))
}

/// A clause naming where `pids`' CPU goes: "; 61 % of their CPU in ds.py:9 `decode`".
pub fn hot_clause(f: &Facts, pids: &[u32], whose: &str) -> String {
    let procs = sampled(f, pids);
    let (spots, total) = pystacks::hot_spots(&procs, 1);
    match spots.first() {
        Some(s) if total >= MIN_SAMPLES && s.share >= MIN_SHARE => {
            format!("; {:.0} % of {whose} CPU in {}", s.share * 100.0, s.site)
        }
        _ => String::new(),
    }
}

/// Evidence: where the on-CPU samples of `pids` went.
pub fn hot_link(f: &Facts, pids: &[u32], who: &str, chain: &mut Chain) {
    if let Some((spots, total)) = hot_spots(f, pids) {
        chain.push(
            f.start_ns + 2,
            format!(
                "{}: Python stacks of {who} on CPU ({total} samples): {spots}",
                at(f, f.start_ns)
            ),
        );
    }
}

/// The stack `p` was last seen blocked in, as py-spy dump prints it, innermost first.
pub fn blocked_at(f: &Facts, p: &ProcFacts) -> Option<String> {
    let frames = f.py_stacks.get(p.pid)?.blocked_in()?;
    let site =
        pystacks::user_frame(frames).map_or_else(|| pystacks::show(&frames[0]), pystacks::show);
    Some(format!("blocked at {site}; its stack: {}", pystacks::dump(frames).join(" <- ")))
}

/// Evidence: each of `stuck` blocked at its line.
pub fn blocked_links(f: &Facts, stuck: &[&ProcFacts], chain: &mut Chain) {
    for p in stuck {
        if let Some(b) = blocked_at(f, p) {
            let t = f.py_stacks.get(p.pid).map_or(f.end_ns, |s| s.latest_ns);
            chain.at(f, t, format!("{}'s Python stack: {b}", name(p)));
        }
    }
}

/// " at train.py:30 `main`": the job's line where `p` waits for its batches.
pub fn wait_site(f: &Facts, p: &ProcFacts) -> Option<String> {
    let frames = f.py_stacks.get(p.pid)?.data_wait_stack()?;
    pystacks::user_frame(frames).map(pystacks::show)
}

/// Evidence: where the trainer waits and what receiving batches cost it.
pub fn wait_link(f: &Facts, p: &ProcFacts, chain: &mut Chain) {
    let site = wait_site(f, p);
    let receiving = p.receiving;
    if site.is_none() && receiving.is_none() {
        return;
    }
    let t = p.started_ns.max(f.start_ns);
    let mut s = format!("{}: {}'s Python stacks", at(f, t), name(p));
    if let Some(site) = site {
        s.push_str(&format!(": it waits for its batches at {site}, in the DataLoader's next()"));
    }
    if let Some(r) = receiving {
        s.push_str(&format!(
            "; receiving batches (runnable inside the DataLoader's next(): unpickling, mapping the workers' shared memory) took {:.2} s ({} of {} samples on CPU or waiting for one{})",
            r.ns as f64 / 1e9,
            r.samples_inside,
            r.samples_on_cpu,
            if r.wall_time_weighted {
                ", each for the wall time since the one before: this kernel keeps no schedstat, so it leans high"
            } else {
                ""
            }
        ));
    }
    chain.push(t + 1, s);
}

/// Receiving its batches costs a trainer this share of its time fetching data (blocked plus
/// receiving), and at least [`RECEIVING_NS`]: a cost of its own, which more workers do not cut.
const RECEIVING_SHARE: f64 = 0.25;
const RECEIVING_NS: u64 = 1_000_000_000;

/// Advice for a trainer whose batches are costly to receive, where one is.
pub fn receiving_advice(f: &Facts) -> Option<String> {
    f.procs.iter().filter(|p| p.is_trainer || p.is_rank).find_map(|p| {
        let r = p.receiving?;
        let blocked = p.offcpu.as_ref().and_then(|o| o.data_wait_ns).unwrap_or(0);
        let share = r.ns as f64 / (r.ns + blocked).max(1) as f64;
        (share >= RECEIVING_SHARE && r.ns >= RECEIVING_NS).then(|| {
            format!(
                "receiving its batches took {} {:.2} s ({:.0} % of its time fetching data, besides waiting for them): the batches cost the trainer to take in (unpickling, mapping the workers' shared memory); more workers do not make that faster, smaller or cheaper batches do: uint8 instead of float32, crop or decode on the GPU, fewer samples a batch",
                name(p),
                r.ns as f64 / 1e9,
                100.0 * share
            )
        })
    })
}

/// Processes whose stacks could not be read, said once in the chain.
pub fn unreadable_link(f: &Facts, chain: &mut Chain) {
    let mut by_why: std::collections::BTreeMap<&str, Vec<u32>> = Default::default();
    for (pid, why) in f.py_stacks.unreadable() {
        by_why.entry(why).or_default().push(pid);
    }
    for (why, pids) in by_why {
        let shown: Vec<String> = pids.iter().take(5).map(|p| p.to_string()).collect();
        chain.at(
            f,
            f.end_ns,
            format!(
                "Python stacks were not read for pid {}{} ({why})",
                shown.join(", "),
                if pids.len() > 5 {
                    format!(" and {} more", pids.len() - 5)
                } else {
                    String::new()
                }
            ),
        );
    }
}
