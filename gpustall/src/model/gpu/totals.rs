//! Per-GPU totals over a trace, for the final report and `--summary-json`.

use super::sample::GpuSample;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// One GPU over the whole trace. A figure no sample could read stays `None`.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
pub struct GpuStats {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub samples: u64,
    pub util_gpu_avg_pct: Option<f64>,
    pub util_gpu_min_pct: Option<u32>,
    pub util_gpu_max_pct: Option<u32>,
    pub max_temperature_c: Option<u32>,
    pub max_power_mw: Option<u32>,
    /// Slowdown reason -> number of samples that showed it.
    pub throttle_reasons: BTreeMap<String, u64>,
    /// Pids of the traced tree that NVML listed on this GPU.
    pub job_pids: BTreeSet<u32>,
    #[serde(skip)]
    util_sum: u64,
    #[serde(skip)]
    util_samples: u64,
}

/// Serializes as a list of [`GpuStats`], in GPU index order.
#[derive(Serialize, Clone, Debug, Default)]
#[serde(transparent)]
pub struct GpuSummary {
    gpus: Vec<GpuStats>,
}

impl GpuSummary {
    pub fn new() -> Self {
        Self::default()
    }

    /// The average utilisation over every GPU's samples; `None` when none read one.
    pub fn util_avg_pct(&self) -> Option<f64> {
        let (sum, n) =
            self.gpus.iter().fold((0, 0), |(s, n), g| (s + g.util_sum, n + g.util_samples));
        (n > 0).then(|| sum as f64 / n as f64)
    }

    #[cfg(test)]
    pub fn gpus(&self) -> &[GpuStats] {
        &self.gpus
    }

    /// Adds one sample. `job_pids` picks the traced tree's processes out of the GPU's list
    /// (other users' processes on a shared GPU are not the job's business).
    pub fn add(&mut self, s: &GpuSample, job_pids: &HashSet<u32>) {
        let at = match self.gpus.binary_search_by_key(&s.index, |g| g.index) {
            Ok(i) => i,
            Err(i) => {
                let fresh = GpuStats { index: s.index, ..GpuStats::default() };
                self.gpus.insert(i, fresh);
                i
            }
        };
        let Some(g) = self.gpus.get_mut(at) else {
            return;
        };
        // Identity as last read: a name or UUID unreadable at start may be readable later.
        if !s.name.is_empty() {
            g.name.clone_from(&s.name);
        }
        if !s.uuid.is_empty() {
            g.uuid.clone_from(&s.uuid);
        }
        g.samples += 1;
        if let Some(u) = s.util_gpu_pct {
            g.util_sum += u64::from(u);
            g.util_samples += 1;
            g.util_gpu_avg_pct = Some(g.util_sum as f64 / g.util_samples as f64);
            g.util_gpu_min_pct = Some(g.util_gpu_min_pct.map_or(u, |m| m.min(u)));
            g.util_gpu_max_pct = g.util_gpu_max_pct.max(Some(u));
        }
        g.max_temperature_c = g.max_temperature_c.max(s.temperature_c);
        g.max_power_mw = g.max_power_mw.max(s.power_mw);
        for r in &s.throttle_reasons {
            *g.throttle_reasons.entry(r.clone()).or_insert(0) += 1;
        }
        g.job_pids.extend(s.processes.iter().map(|p| p.pid).filter(|p| job_pids.contains(p)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gpu::sample::GpuProcess;

    #[test]
    fn accumulates_per_gpu() {
        let job = HashSet::from([10]);
        let mut sum = GpuSummary::new();
        for (index, util, temp, throttle) in
            [(1, 80, 70, vec![]), (0, 90, 60, vec![]), (1, 0, 88, vec!["sw_power_cap"])]
        {
            let s = GpuSample {
                index,
                name: "g".into(),
                util_gpu_pct: Some(util),
                temperature_c: Some(temp),
                power_mw: Some(util * 1000),
                throttle_reasons: throttle.into_iter().map(String::from).collect(),
                processes: vec![
                    GpuProcess { pid: 10, used_bytes: None },
                    GpuProcess { pid: 11, used_bytes: None },
                ],
                ..GpuSample::default()
            };
            sum.add(&s, &job);
        }
        let mut unread = GpuSample { index: 1, ..GpuSample::default() };
        unread.util_gpu_pct = None;
        sum.add(&unread, &job);
        let g = &sum.gpus()[1];
        assert_eq!((g.index, g.samples, g.util_gpu_avg_pct), (1, 3, Some(40.0)));
        assert_eq!(
            (g.util_gpu_min_pct, g.util_gpu_max_pct, g.max_temperature_c),
            (Some(0), Some(80), Some(88))
        );
        assert_eq!(g.max_power_mw, Some(80_000));
        assert_eq!(g.throttle_reasons.get("sw_power_cap"), Some(&1));
        assert_eq!(g.job_pids, BTreeSet::from([10]));
        let json = serde_json::to_value(&sum).expect("serializes");
        assert_eq!(json[0]["index"], 0);
        assert!(json[0].get("util_sum").is_none());
    }
}
