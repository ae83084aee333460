//! Stall episodes: a GPU the job uses sits at or under a utilisation threshold for a window.
//!
//! Pure logic on [`GpuSample`]s, so it is tested on hand-built timelines. An episode starts at
//! the first sample at/under the threshold and ends at the first sample above it (or when the
//! job ends), so both bounds are within one sample interval of the truth.
//!
//! Which GPUs count: those whose NVML process list has shown a pid of the traced tree. A GPU
//! stays counted once it has (its process can die mid-stall, e.g. OOM-killed, while the rest
//! of the job waits; that idle time is exactly what needs explaining). If no GPU has ever
//! listed a job pid (drivers hide host pids inside many containers) every GPU counts, and the
//! episode says so (`attribution: "all_gpus"`). The first time a list does show a job pid,
//! open `all_gpus` episodes are dropped: their premise turned out wrong.

use super::sample::{throttle_names, GpuSample};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashSet};

pub const DEFAULT_THRESHOLD_PCT: u32 = 5;
pub const DEFAULT_WINDOW_NS: u64 = 3_000_000_000;

/// How a GPU was tied to the job.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Attribution {
    /// NVML listed a job pid on this GPU.
    #[default]
    ProcessList,
    /// No GPU listed any job pid, so every GPU was watched.
    AllGpus,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct StallEpisode {
    pub gpu_index: u32,
    pub gpu_uuid: String,
    pub start_ns: u64,
    pub end_ns: u64,
    pub duration_ns: u64,
    /// Job pids listed on this GPU just before and during the stall (empty for `all_gpus`).
    pub pids: Vec<u32>,
    pub max_util_gpu_pct: u32,
    pub max_temperature_c: Option<u32>,
    /// Every slowdown reason (not `gpu_idle`) seen during the stall.
    pub throttle_reasons: Vec<String>,
    pub attribution: Attribution,
}

/// A stall in progress on one GPU.
struct Open {
    uuid: String,
    start_ns: u64,
    last_ns: u64,
    pids: BTreeSet<u32>,
    max_util: u32,
    max_temp: Option<u32>,
    throttle_mask: u64,
    attribution: Attribution,
}

impl Open {
    fn episode(&self, gpu_index: u32, end_ns: u64) -> StallEpisode {
        StallEpisode {
            gpu_index,
            gpu_uuid: self.uuid.clone(),
            start_ns: self.start_ns,
            end_ns,
            duration_ns: end_ns.saturating_sub(self.start_ns),
            pids: self.pids.iter().copied().collect(),
            max_util_gpu_pct: self.max_util,
            max_temperature_c: self.max_temp,
            throttle_reasons: throttle_names(self.throttle_mask),
            attribution: self.attribution,
        }
    }
}

pub struct StallDetector {
    threshold_pct: u32,
    window_ns: u64,
    open: BTreeMap<u32, Open>,
    /// GPUs that have listed a job pid, with the job pids they listed last.
    job_gpus: BTreeMap<u32, BTreeSet<u32>>,
}

impl Default for StallDetector {
    fn default() -> Self {
        Self::new(DEFAULT_THRESHOLD_PCT, DEFAULT_WINDOW_NS)
    }
}

impl StallDetector {
    /// `threshold_pct`: utilisation at or under it is idle; `window_ns`: the shortest idle
    /// spell reported as a stall (shorter dips are normal between steps or at checkpoints).
    pub fn new(threshold_pct: u32, window_ns: u64) -> Self {
        StallDetector { threshold_pct, window_ns, open: BTreeMap::new(), job_gpus: BTreeMap::new() }
    }

    /// Feeds one GPU's sample; returns the episode it ends, if that lasted the window.
    /// `job_pids`: the traced tree's pids; `job_alive`: whether any of them still runs.
    pub fn observe(
        &mut self,
        s: &GpuSample,
        job_pids: &HashSet<u32>,
        job_alive: bool,
    ) -> Option<StallEpisode> {
        let on_gpu = self.note_processes(s, job_pids);
        let attribution = if self.job_gpus.contains_key(&s.index) {
            Some(Attribution::ProcessList)
        } else if self.job_gpus.is_empty() {
            Some(Attribution::AllGpus)
        } else {
            None
        };
        let (Some(attribution), true) = (attribution, job_alive) else {
            return self.close(s.index, s.t_ns);
        };
        // An unreadable utilisation says nothing either way: the state stays as it was.
        let util = s.util_gpu_pct?;
        if util > self.threshold_pct {
            return self.close(s.index, s.t_ns);
        }
        let known = self.job_gpus.get(&s.index);
        let open = self.open.entry(s.index).or_insert_with(|| Open {
            uuid: s.uuid.clone(),
            start_ns: s.t_ns,
            last_ns: s.t_ns,
            pids: known.cloned().unwrap_or_default(),
            max_util: util,
            max_temp: None,
            throttle_mask: 0,
            attribution,
        });
        open.last_ns = open.last_ns.max(s.t_ns);
        open.pids.extend(on_gpu);
        open.max_util = open.max_util.max(util);
        open.max_temp = open.max_temp.max(s.temperature_c);
        open.throttle_mask |= s.throttle_mask;
        None
    }

    /// Feeds one tick of samples (all GPUs), noting every process list before judging any
    /// GPU, so the `all_gpus` fallback is decided on the whole tick.
    pub fn observe_all(
        &mut self,
        samples: &[GpuSample],
        job_pids: &HashSet<u32>,
        job_alive: bool,
    ) -> Vec<StallEpisode> {
        for s in samples {
            self.note_processes(s, job_pids);
        }
        samples.iter().filter_map(|s| self.observe(s, job_pids, job_alive)).collect()
    }

    /// The stall going on on GPU `gpu_index`, once it has lasted the window (for a live line:
    /// "GPU0 idle since ..."); `end_ns` is the latest sample in it.
    pub fn open_episode(&self, gpu_index: u32) -> Option<StallEpisode> {
        let o = self.open.get(&gpu_index)?;
        (o.last_ns.saturating_sub(o.start_ns) >= self.window_ns)
            .then(|| o.episode(gpu_index, o.last_ns))
    }

    /// Ends the trace at `now_ns`: closes every open stall, keeping those that lasted the window.
    pub fn finish(&mut self, now_ns: u64) -> Vec<StallEpisode> {
        let gpus: Vec<u32> = self.open.keys().copied().collect();
        gpus.into_iter().filter_map(|g| self.close(g, now_ns)).collect()
    }

    /// Records which job pids `s` lists (idempotent); returns them.
    fn note_processes(&mut self, s: &GpuSample, job_pids: &HashSet<u32>) -> BTreeSet<u32> {
        let on_gpu: BTreeSet<u32> =
            s.processes.iter().map(|p| p.pid).filter(|p| job_pids.contains(p)).collect();
        if !on_gpu.is_empty() {
            if self.job_gpus.is_empty() {
                // Process lists do show the job after all: the all-GPUs guesses were wrong.
                self.open.retain(|_, o| o.attribution != Attribution::AllGpus);
            }
            self.job_gpus.insert(s.index, on_gpu.clone());
        }
        on_gpu
    }

    fn close(&mut self, gpu_index: u32, end_ns: u64) -> Option<StallEpisode> {
        let o = self.open.remove(&gpu_index)?;
        let end_ns = end_ns.max(o.last_ns);
        (end_ns - o.start_ns >= self.window_ns).then(|| o.episode(gpu_index, end_ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gpu::sample::GpuProcess;

    const MS: u64 = 1_000_000;
    const TRAINER: u32 = 100;

    fn sample(index: u32, t_ns: u64, util: u32, pids: &[u32]) -> GpuSample {
        GpuSample {
            t_ns,
            index,
            uuid: format!("GPU-{index}"),
            util_gpu_pct: Some(util),
            temperature_c: Some(60),
            processes: pids.iter().map(|&pid| GpuProcess { pid, used_bytes: None }).collect(),
            ..GpuSample::default()
        }
    }

    fn job() -> HashSet<u32> {
        HashSet::from([TRAINER, TRAINER + 1])
    }

    /// Runs one GPU through `util_at(t)` every 200 ms from 0 to `end`, returning the episodes.
    fn run(util_at: impl Fn(u64) -> u32, end: u64, d: &mut StallDetector) -> Vec<StallEpisode> {
        (0..=end / (200 * MS))
            .filter_map(|k| {
                d.observe(&sample(0, k * 200 * MS, util_at(k * 200 * MS), &[TRAINER]), &job(), true)
            })
            .collect()
    }

    #[test]
    fn six_second_drop_is_one_episode_with_tight_bounds() {
        let mut d = StallDetector::default();
        let util = |t: u64| {
            if (2_000 * MS..8_000 * MS).contains(&t) {
                0
            } else if t < 2_000 * MS {
                95
            } else {
                90
            }
        };
        let eps = run(util, 10_000 * MS, &mut d);
        assert_eq!(eps.len(), 1, "{eps:?}");
        let e = &eps[0];
        assert!(e.start_ns >= 2_000 * MS && e.start_ns <= 2_200 * MS, "{e:?}");
        assert!(e.end_ns >= 8_000 * MS && e.end_ns <= 8_200 * MS, "{e:?}");
        assert_eq!(e.duration_ns, e.end_ns - e.start_ns);
        assert_eq!(
            (e.gpu_index, e.pids.as_slice(), e.attribution),
            (0, &[TRAINER][..], Attribution::ProcessList)
        );
        assert_eq!(e.max_util_gpu_pct, 0);
        assert!(d.finish(10_000 * MS).is_empty());
    }

    #[test]
    fn one_second_dip_is_not_a_stall() {
        let mut d = StallDetector::default();
        let util = |t: u64| {
            if (2_000 * MS..3_000 * MS).contains(&t) {
                1
            } else {
                90
            }
        };
        assert!(run(util, 6_000 * MS, &mut d).is_empty());
        assert!(d.finish(6_000 * MS).is_empty());
    }

    #[test]
    fn throttle_and_temperature_during_the_stall_are_reported() {
        let mut d = StallDetector::default();
        let job = job();
        assert!(d.observe(&sample(0, 0, 95, &[TRAINER]), &job, true).is_none());
        for k in 1..=20 {
            let mut s = sample(0, k * 200 * MS, 3, &[TRAINER]);
            if k == 10 {
                s.temperature_c = Some(90);
                s.throttle_mask = 0x40 | 0x1; // hw_thermal_slowdown, and gpu_idle which is no cause
            }
            assert!(d.observe(&s, &job, true).is_none());
        }
        assert!(d.open_episode(0).is_some_and(|e| e.start_ns == 200 * MS));
        let e =
            d.observe(&sample(0, 21 * 200 * MS, 80, &[TRAINER]), &job, true).expect("episode ends");
        assert_eq!(e.max_temperature_c, Some(90));
        assert_eq!(e.throttle_reasons, vec!["hw_thermal_slowdown".to_string()]);
        assert_eq!(e.max_util_gpu_pct, 3);
    }

    #[test]
    fn only_gpus_listing_job_pids_count_and_stay_counted() {
        let mut d = StallDetector::default();
        let job = job();
        let mut eps = Vec::new();
        for k in 0..=40 {
            let t = k * 200 * MS;
            // GPU 0: the trainer, which dies at 2 s while the job lives on (its GPU idles).
            let gpu0 =
                if t < 2_000 * MS { sample(0, t, 95, &[TRAINER]) } else { sample(0, t, 0, &[]) };
            // GPU 1: another user's idle process; GPU 2: the job's second rank, busy.
            let tick = [gpu0, sample(1, t, 0, &[999]), sample(2, t, 97, &[TRAINER + 1])];
            eps.extend(d.observe_all(&tick, &job, true));
        }
        eps.extend(d.finish(8_000 * MS));
        assert_eq!(eps.len(), 1, "{eps:?}");
        assert_eq!((eps[0].gpu_index, eps[0].start_ns, eps[0].end_ns), (0, 2_000 * MS, 8_000 * MS));
        assert_eq!(eps[0].pids, vec![TRAINER], "the pids last listed on the GPU");
    }

    #[test]
    fn hidden_process_lists_fall_back_to_all_gpus() {
        let mut d = StallDetector::default();
        let job = job();
        let mut eps = Vec::new();
        for k in 0..=30 {
            let t = k * 200 * MS;
            let util = if t >= 1_000 * MS { 0 } else { 90 };
            eps.extend(d.observe_all(
                &[sample(0, t, util, &[]), sample(1, t, util, &[5])],
                &job,
                true,
            ));
        }
        // The job ends at 7 s: open stalls end there.
        eps.extend(d.observe_all(
            &[sample(0, 7_000 * MS, 0, &[]), sample(1, 7_000 * MS, 0, &[])],
            &job,
            false,
        ));
        assert_eq!(eps.len(), 2, "{eps:?}");
        for (i, e) in eps.iter().enumerate() {
            assert_eq!((e.gpu_index, e.attribution), (i as u32, Attribution::AllGpus));
            assert_eq!((e.start_ns, e.end_ns), (1_000 * MS, 7_000 * MS));
            assert!(e.pids.is_empty());
        }
    }

    #[test]
    fn job_pid_appearing_drops_all_gpus_guesses() {
        let mut d = StallDetector::default();
        let job = job();
        for k in 0..=20 {
            d.observe_all(
                &[sample(0, k * 200 * MS, 0, &[]), sample(1, k * 200 * MS, 0, &[])],
                &job,
                true,
            );
        }
        // CUDA starts on GPU 1 at 4.2 s: GPU 0 was never the job's, GPU 1's stall restarts.
        for k in 21..=40 {
            d.observe_all(
                &[sample(0, k * 200 * MS, 0, &[]), sample(1, k * 200 * MS, 0, &[TRAINER])],
                &job,
                true,
            );
        }
        let eps = d.finish(8_000 * MS);
        assert_eq!(eps.len(), 1, "{eps:?}");
        assert_eq!(
            (eps[0].gpu_index, eps[0].start_ns, eps[0].attribution),
            (1, 4_200 * MS, Attribution::ProcessList)
        );
    }

    #[test]
    fn unreadable_utilisation_neither_opens_nor_closes() {
        let mut d = StallDetector::new(5, 1_000 * MS);
        let job = job();
        d.observe(&sample(0, 0, 0, &[TRAINER]), &job, true);
        let mut blind = sample(0, 600 * MS, 0, &[TRAINER]);
        blind.util_gpu_pct = None;
        assert!(d.observe(&blind, &job, true).is_none());
        let e = d.observe(&sample(0, 1_200 * MS, 50, &[TRAINER]), &job, true).expect("episode");
        assert_eq!((e.start_ns, e.end_ns), (0, 1_200 * MS));
    }
}
