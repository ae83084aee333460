//! Advice computed from the measurements, with the arithmetic shown.
//!
//! The unit of advice is a DataLoader: the workers one trainer or rank process had alive at
//! the same time. Non-persistent workers (persistent_workers=False) are new processes every
//! epoch, and each rank of a torchrun job has its own DataLoader: counting every worker ever
//! seen would read three epochs of 8 workers as num_workers=24.

use crate::diagnose::{
    facts::{Facts, ProcFacts},
    verdict::evidence::{mib_kb, workers_n, MIB_KB},
};

/// The workers of one trainer or rank.
struct Loader<'a> {
    /// The trainer's or rank's pid.
    parent: u32,
    /// The most workers it had alive at once: its num_workers.
    num_workers: u64,
    /// How many worker processes it had in all (num_workers per epoch when not persistent).
    processes: usize,
    /// The largest peak of any of its workers.
    per_worker_kb: u64,
    workers: Vec<&'a ProcFacts>,
}

/// The most of `workers` alive at one moment.
pub(super) fn most_alive_at_once(workers: &[&ProcFacts]) -> u64 {
    workers
        .iter()
        .map(|w| {
            let t = w.started_ns;
            workers.iter().filter(|o| o.started_ns <= t && o.exit_ns.is_none_or(|e| e > t)).count()
                as u64
        })
        .max()
        .unwrap_or(0)
}

/// Workers grouped by the trainer or rank whose DataLoader they serve (their parent, or the
/// owner of the forkserver that started them), in that process's pid order.
fn loaders(f: &Facts) -> Vec<Loader<'_>> {
    let mut by_parent: std::collections::BTreeMap<u32, Vec<&ProcFacts>> = Default::default();
    for w in f.procs.iter().filter(|p| p.is_worker) {
        by_parent.entry(w.dataloader_pid.unwrap_or(w.ppid)).or_default().push(w);
    }
    by_parent
        .into_iter()
        .map(|(parent, workers)| Loader {
            parent,
            num_workers: most_alive_at_once(&workers),
            processes: workers.len(),
            per_worker_kb: workers.iter().map(|p| p.peak_mem_kb).max().unwrap_or(0).max(1),
            workers,
        })
        .collect()
}

/// num_workers that fit the limit at the measured per-worker peak, per DataLoader and for the
/// job, with the arithmetic; then the growth that makes it so.
pub fn memory_advice(f: &Facts) -> Vec<String> {
    let mut advice = Vec::new();
    let loaders = loaders(f);
    if let (false, Some(limit_kb)) = (loaders.is_empty(), limit_kb(f)) {
        advice.extend(fit_advice(f, &loaders, limit_kb));
    }
    let workers: Vec<&ProcFacts> = loaders.iter().flat_map(|l| l.workers.iter().copied()).collect();
    advice.extend(growth_advice(&workers));
    advice
}

/// The memory the job may use: its cgroup's limit, else the host's.
fn limit_kb(f: &Facts) -> Option<u64> {
    f.cgroup.as_ref().and_then(|c| c.limit_bytes).map(|b| b / 1024).or(f.host_mem_total_kb)
}

/// The memory budget per DataLoader: the trainers' and ranks' peak, 90 % of the limit, and
/// how many workers per DataLoader fit in what they leave.
struct Fit {
    mains_kb: u64,
    budget: u64,
    left: u64,
    per_all: u64,
    fit: u64,
}

fn fit(f: &Facts, loaders: &[Loader], limit_kb: u64) -> Fit {
    // Every trainer and rank holds memory of its own, whether or not it has workers.
    let mains_kb: u64 =
        f.procs.iter().filter(|p| p.is_trainer || p.is_rank).map(|p| p.peak_mem_kb).sum();
    let budget = (limit_kb as f64 * 0.9) as u64;
    let left = budget.saturating_sub(mains_kb);
    let per_all: u64 = loaders.iter().map(|l| l.per_worker_kb).sum();
    Fit { mains_kb, budget, left, per_all, fit: left / per_all.max(1) }
}

/// The num_workers the memory advice names where fewer workers are the fix: the most that fit,
/// when at least one does and a DataLoader ran more.
pub fn memory_num_workers(f: &Facts) -> Option<u64> {
    let loaders = loaders(f);
    let n = fit(f, &loaders, limit_kb(f)?).fit;
    (n > 0 && loaders.iter().any(|l| n < l.num_workers)).then_some(n)
}

/// "num_workers=3: trainer X + 3 workers x up to Y = Z at peak, against L ..." for one
/// DataLoader; per rank and for the job when there are several.
fn fit_advice(f: &Facts, loaders: &[Loader], limit_kb: u64) -> Vec<String> {
    let mains: Vec<&ProcFacts> = f.procs.iter().filter(|p| p.is_trainer || p.is_rank).collect();
    let Fit { mains_kb, budget, left, per_all, fit } = fit(f, loaders, limit_kb);
    let need: u64 = mains_kb + loaders.iter().map(|l| l.num_workers * l.per_worker_kb).sum::<u64>();
    let kind =
        if f.procs.iter().any(|p| p.mem_is_pss) { "proportional" } else { "resident + swap" };
    let verdict = if fit == 0 {
        format!("not even one worker per DataLoader fits: {} per worker exceeds what the {} leave ({}), so fewer workers cannot fix it: bound the per-worker growth", mib_kb(per_all), mains_name(&mains), mib_kb(left))
    } else if loaders.iter().any(|l| fit < l.num_workers) {
        format!("num_workers <= {fit} fits at this per-worker peak")
    } else {
        format!("the workers fit at this peak (up to {fit}); look at what else holds memory")
    };
    let mut out = Vec::new();
    if let [l] = loaders {
        out.push(format!(
            "num_workers={}{}: {} {} + {} x up to {} = {} at peak ({kind} memory), against {}. With 10% headroom ({}), {verdict}",
            l.num_workers,
            epochs(l),
            mains_name(&mains),
            mib_kb(mains_kb),
            workers_n(l.num_workers),
            mib_kb(l.per_worker_kb),
            mib_kb(need),
            limit_name(f, limit_kb),
            mib_kb(budget),
        ));
    } else {
        for l in loaders {
            out.push(format!(
                "pid {}'s DataLoader: num_workers={}{}, up to {} per worker",
                l.parent,
                l.num_workers,
                epochs(l),
                mib_kb(l.per_worker_kb)
            ));
        }
        out.push(format!(
            "the job: {} {} + {} DataLoaders' workers = {} at peak ({kind} memory), against {}. With 10% headroom ({}), per DataLoader {verdict}",
            mains_name(&mains),
            mib_kb(mains_kb),
            loaders.len(),
            mib_kb(need),
            limit_name(f, limit_kb),
            mib_kb(budget),
        ));
    }
    let whose = match f.cgroup.as_ref().and_then(|c| c.limit_set_by.as_deref()) {
        // Raising the job's own memory.max changes nothing: the parent's binds.
        Some(by) => format!(
            " (the limit is {by}'s: raise it there, or ask for more in the job's allocation)"
        ),
        None => String::new(),
    };
    out.push(format!(
        "or give the job at least {} of memory (its peak + 10%){whose}",
        mib_kb((need as f64 * 1.1) as u64)
    ));
    out
}

/// "a 512 MiB limit", or "the 512 MiB limit set by /job" when an ancestor's cgroup sets it.
fn limit_name(f: &Facts, limit_kb: u64) -> String {
    match f
        .cgroup
        .as_ref()
        .filter(|c| c.limit_bytes.is_some())
        .and_then(|c| c.limit_set_by.as_deref())
    {
        Some(by) => format!("the {} limit set by {by}", mib_kb(limit_kb)),
        // No cgroup limit: the host's memory bounds the job.
        None if f.cgroup.as_ref().is_none_or(|c| c.limit_bytes.is_none()) => {
            format!("host memory ({})", mib_kb(limit_kb))
        }
        None => format!("a {} limit", mib_kb(limit_kb)),
    }
}

/// ", 3 epochs of non-persistent workers (9 processes)" when workers came and went.
fn epochs(l: &Loader) -> String {
    if l.processes as u64 > l.num_workers {
        format!(
            " (workers restarted: {} worker processes in all, as persistent_workers=False starts them every epoch)",
            l.processes
        )
    } else {
        String::new()
    }
}

/// "trainer", "2 ranks", or "launcher + 1 rank" (tracing torchrun makes it the trainer).
fn mains_name(mains: &[&ProcFacts]) -> String {
    let ranks = match mains.iter().filter(|p| p.is_rank).count() {
        0 => return "trainer".to_string(),
        1 => "1 rank".to_string(),
        n => format!("{n} ranks"),
    };
    if mains.iter().any(|p| p.is_trainer) {
        format!("launcher + {ranks}")
    } else {
        ranks
    }
}

/// Workers still growing at their last sample (peak within 2 s of it), over at least 2 s.
fn growth_advice(workers: &[&ProcFacts]) -> Option<String> {
    let grew: Vec<&&ProcFacts> = workers
        .iter()
        .filter(|p| p.peak_mem_kb > 2 * p.first_mem_kb.max(1))
        .filter(|p| p.peak_mem_ns.saturating_sub(p.first_mem_ns) >= 2_000_000_000)
        .filter(|p| p.last_mem_ns.saturating_sub(p.peak_mem_ns) <= 2_000_000_000)
        .collect();
    if grew.is_empty() {
        return None;
    }
    let rate = grew
        .iter()
        .map(|p| {
            (p.peak_mem_kb - p.first_mem_kb) as f64
                / MIB_KB
                / (p.peak_mem_ns - p.first_mem_ns) as f64
                * 60e9
        })
        .sum::<f64>()
        / grew.len() as f64;
    let who = match (grew.len(), workers.len()) {
        (1, 1) => format!("the one worker kept growing until its last sample (about {rate:.0} MiB/min)"),
        (g, n) => format!("{g} of {n} workers kept growing until their last sample (about {rate:.0} MiB/min each)"),
    };
    Some(format!(
        "{who} instead of levelling off: a per-worker cache or leak (unbounded lru_cache, decoded samples kept, copy-on-write of Python objects). Bound it; with persistent_workers=True that growth also carries across epochs, while persistent_workers=False restarts workers (and frees it) every epoch"
    ))
}
