//! Advice computed from the measurements, with the arithmetic shown.

use crate::diagnose::{
    facts::{Facts, ProcFacts},
    verdict::evidence::{mib_kb, MIB_KB},
};

/// num_workers that fit the limit at the measured per-worker peak, with the arithmetic.
pub fn memory_advice(f: &Facts) -> Vec<String> {
    let mut advice = Vec::new();
    let workers: Vec<&ProcFacts> = f.procs.iter().filter(|p| p.is_worker).collect();
    let trainer_kb =
        f.procs.iter().filter(|p| p.is_trainer).map(|p| p.peak_mem_kb).max().unwrap_or(0);
    let limit_kb =
        f.cgroup.as_ref().and_then(|c| c.limit_bytes).map(|b| b / 1024).or(f.host_mem_total_kb);
    if let (false, Some(limit_kb)) = (workers.is_empty(), limit_kb) {
        let n = workers.len() as u64;
        let per = workers.iter().map(|p| p.peak_mem_kb).max().unwrap_or(0).max(1);
        let total = trainer_kb + workers.iter().map(|p| p.peak_mem_kb).sum::<u64>();
        let budget = (limit_kb as f64 * 0.9) as u64;
        let fit = budget.saturating_sub(trainer_kb) / per;
        let verdict = if fit == 0 {
            format!("not even one worker fits: its peak alone ({}) exceeds what the trainer leaves ({}), so fewer workers cannot fix it: bound the per-worker growth", mib_kb(per), mib_kb(budget.saturating_sub(trainer_kb)))
        } else if fit < n {
            format!("num_workers <= {fit} fits at this per-worker peak")
        } else {
            format!("the workers fit at this peak (up to {fit}); look at what else holds memory")
        };
        advice.push(format!(
            "num_workers={n}: trainer {} + {n} workers x up to {} = {} at peak, against a {} limit. With 10% headroom ({}), {verdict}",
            mib_kb(trainer_kb),
            mib_kb(per),
            mib_kb(total),
            mib_kb(limit_kb),
            mib_kb(budget),
        ));
        advice.push(format!(
            "or give the job at least {} of memory (trainer + {n} x {} + 10%)",
            mib_kb(((trainer_kb + n * per) as f64 * 1.1) as u64),
            mib_kb(per)
        ));
    }
    // Still growing at their last sample (peak within 2 s of it), over at least 2 s of samples.
    let grew: Vec<&&ProcFacts> = workers
        .iter()
        .filter(|p| p.peak_mem_kb > 2 * p.first_mem_kb.max(1))
        .filter(|p| p.peak_mem_ns.saturating_sub(p.first_mem_ns) >= 2_000_000_000)
        .filter(|p| p.last_mem_ns.saturating_sub(p.peak_mem_ns) <= 2_000_000_000)
        .collect();
    if !grew.is_empty() {
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
        advice.push(format!(
            "{} of {} workers kept growing until their last sample (about {:.0} MiB/min each) instead of levelling off: a per-worker cache or leak (unbounded lru_cache, decoded samples kept, copy-on-write of Python objects). Bound it; with persistent_workers=True that growth also carries across epochs, while persistent_workers=False restarts workers (and frees it) every epoch",
            grew.len(),
            workers.len(),
            rate
        ));
    }
    advice
}
