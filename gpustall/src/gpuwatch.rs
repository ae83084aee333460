//! The GPU side of a trace: NVML sampled every `--gpu-interval`, fed to the stall detector and
//! the per-GPU summary, each sample and episode recorded on the kernel events' timeline.

use std::collections::HashSet;

use serde_json::json;

use crate::{
    gpu::{GpuSampler, GpuSample, GpuSummary, StallDetector, StallEpisode},
    model::Model,
    record::Recorder,
};

/// GPU state kept in the model for the summary and the verdict.
#[derive(Default)]
pub struct GpuState {
    /// One line on why there is no GPU data, or which GPUs there are.
    pub status: String,
    pub summary: Option<GpuSummary>,
    pub stalls: Vec<StallEpisode>,
    /// The latest sample per GPU, for the live line.
    pub latest: Vec<GpuSample>,
    /// A stall in progress (start, gpu) for the live line.
    pub stalled_since: Option<(u64, u32)>,
    /// Samples, and those that showed a slowdown reason (thermal, power, ...), over the trace.
    pub samples: u64,
    pub throttled_samples: u64,
    pub throttle_reasons: std::collections::BTreeSet<String>,
}

pub struct GpuWatch {
    sampler: GpuSampler,
    detector: StallDetector,
}

impl GpuWatch {
    /// Opens NVML; on failure the model says why, once, and tracing goes on without GPU data.
    pub fn open(lib: Option<&std::path::Path>, detector: StallDetector, model: &mut Model) -> Option<Self> {
        match GpuSampler::open(lib) {
            Ok(sampler) => {
                model.gpu.status = format!(
                    "{} GPU(s), driver {}",
                    sampler.gpu_count(),
                    sampler.driver_version().unwrap_or_else(|| "?".into())
                );
                model.gpu.summary = Some(GpuSummary::new());
                Some(Self { sampler, detector })
            }
            Err(e) => {
                model.gpu.status = e.to_string();
                None
            }
        }
    }

    fn job_pids(model: &Model) -> HashSet<u32> {
        model.tree.iter().map(|n| n.pid).collect()
    }

    pub fn tick(&mut self, model: &mut Model, recorder: Option<&mut Recorder>) {
        let samples = self.sampler.sample();
        let pids = Self::job_pids(model);
        let alive = !model.tree.alive_pids().is_empty();
        let ended = self.detector.observe_all(&samples, &pids, alive);
        let mut recorder = recorder;
        if let Some(r) = recorder.as_deref_mut() {
            for s in &samples {
                let mut v = serde_json::to_value(s).unwrap_or_default();
                if let Some(o) = v.as_object_mut() {
                    o.insert("type".into(), json!("sample"));
                    o.insert("kind".into(), json!("gpu"));
                }
                r.write(&v);
            }
        }
        for s in &samples {
            model.gpu.samples += 1;
            if !s.throttle_reasons.is_empty() {
                model.gpu.throttled_samples += 1;
                model.gpu.throttle_reasons.extend(s.throttle_reasons.iter().cloned());
            }
        }
        if let Some(summary) = model.gpu.summary.as_mut() {
            for s in &samples {
                summary.add(s, &pids);
            }
        }
        model.gpu.stalled_since = samples
            .iter()
            .filter_map(|s| self.detector.open_episode(s.index).map(|e| (e.start_ns, s.index)))
            .min();
        model.gpu.latest = samples;
        Self::push(model, recorder, ended);
    }

    pub fn finish(&mut self, model: &mut Model, now_ns: u64, recorder: Option<&mut Recorder>) {
        let ended = self.detector.finish(now_ns);
        Self::push(model, recorder, ended);
    }

    fn push(model: &mut Model, recorder: Option<&mut Recorder>, ended: Vec<StallEpisode>) {
        if let Some(r) = recorder {
            for e in &ended {
                let mut v = serde_json::to_value(e).unwrap_or_default();
                if let Some(o) = v.as_object_mut() {
                    o.insert("type".into(), json!("event"));
                    o.insert("kind".into(), json!("gpu_stall"));
                    o.insert("t_ns".into(), json!(e.start_ns));
                }
                r.write(&v);
            }
        }
        model.gpu.stalls.extend(ended);
    }
}

/// The GPU part of the status line.
pub fn live_part(state: &GpuState, now_ns: u64) -> String {
    if state.latest.is_empty() {
        return String::new();
    }
    let utils: Vec<String> = state
        .latest
        .iter()
        .map(|s| s.util_gpu_pct.map_or("?".into(), |u| format!("{u}%")))
        .collect();
    let stall = state
        .stalled_since
        .map(|(start, gpu)| format!(" STALLED gpu{gpu} {:.1}s", now_ns.saturating_sub(start) as f64 / 1e9))
        .unwrap_or_default();
    format!(" | gpu {}{stall} | stalls {}", utils.join(","), state.stalls.len())
}
