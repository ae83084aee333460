//! The GPU side of a trace: [`GpuWatch`] reads NVML (live only); [`GpuState::apply`] folds a
//! tick of samples into the stall detector and the per-GPU summary, live and on replay alike.

use std::collections::{BTreeSet, HashSet};

use crate::gpu::{GpuSample, GpuSampler, GpuSummary, StallDetector, StallEpisode};

/// GPU state kept in the model for the summary, the verdict and the live line.
#[derive(Default)]
pub struct GpuState {
    /// One line on why there is no GPU data, or which GPUs there are.
    pub status: String,
    /// `None` without GPU data.
    pub detector: Option<StallDetector>,
    pub summary: Option<GpuSummary>,
    pub stalls: Vec<StallEpisode>,
    /// The latest sample per GPU, for the live line.
    pub latest: Vec<GpuSample>,
    /// A stall in progress (start, gpu) for the live line.
    pub stalled_since: Option<(u64, u32)>,
    /// Samples, and those that showed a slowdown reason (thermal, power, ...), over the trace.
    pub samples: u64,
    pub throttled_samples: u64,
    pub throttle_reasons: BTreeSet<String>,
}

impl GpuState {
    /// GPU data on, with these stall settings.
    pub fn enable(&mut self, status: String, threshold_pct: u32, window_ns: u64) {
        self.status = status;
        self.detector = Some(StallDetector::new(threshold_pct, window_ns));
        self.summary = Some(GpuSummary::new());
    }

    /// One tick of samples. `job_pids`: every pid of the traced tree; `alive`: is the job?
    /// Returns the stall episodes that ended.
    pub fn apply(&mut self, samples: &[GpuSample], job_pids: &HashSet<u32>, alive: bool) -> Vec<StallEpisode> {
        let Some(detector) = self.detector.as_mut() else {
            return Vec::new();
        };
        let ended = detector.observe_all(samples, job_pids, alive);
        for s in samples {
            self.samples += 1;
            if !s.throttle_reasons.is_empty() {
                self.throttled_samples += 1;
                self.throttle_reasons.extend(s.throttle_reasons.iter().cloned());
            }
            if let Some(summary) = self.summary.as_mut() {
                summary.add(s, job_pids);
            }
        }
        self.stalled_since = samples
            .iter()
            .filter_map(|s| detector.open_episode(s.index).map(|e| (e.start_ns, s.index)))
            .min();
        self.latest = samples.to_vec();
        self.stalls.extend(ended.iter().cloned());
        ended
    }

    /// The end of the trace: stalls still open count if they lasted the window.
    pub fn finish(&mut self, now_ns: u64) -> Vec<StallEpisode> {
        let ended = self.detector.as_mut().map(|d| d.finish(now_ns)).unwrap_or_default();
        self.stalls.extend(ended.iter().cloned());
        ended
    }
}

/// What the GPU side was asked to do (`None` when --no-gpu).
pub struct GpuOptions {
    pub nvml_lib: Option<std::path::PathBuf>,
    pub interval: std::time::Duration,
    pub threshold_pct: u32,
    pub window: std::time::Duration,
}

/// Opens NVML as asked: turns GPU data on in `state`, or records (and prints, once) why it is
/// off. Returns the sampler, if any, and the `gpu` object of the recording's header.
pub fn open(opts: Option<&GpuOptions>, state: &mut GpuState) -> (Option<GpuWatch>, serde_json::Value) {
    let Some(g) = opts else {
        state.status = "GPU data is off (--no-gpu)".into();
        return (None, serde_json::json!({"enabled": false, "status": state.status}));
    };
    let window_ns = g.window.as_nanos() as u64;
    let (watch, status) = match GpuWatch::open(g.nvml_lib.as_deref()) {
        Ok((w, status)) => {
            state.enable(status.clone(), g.threshold_pct, window_ns);
            (Some(w), status)
        }
        Err(why) => (None, why),
    };
    state.status = status.clone();
    eprintln!("gpustall: {status}");
    let header = serde_json::json!({"enabled": watch.is_some(), "status": status, "threshold_pct": g.threshold_pct, "window_ns": window_ns});
    (watch, header)
}

/// GPU options shared by `trace` and `watch` (whose defaults differ).
#[derive(clap::Args)]
pub struct GpuArgs {
    /// The NVML library to load (default: $GPUSTALL_NVML_LIB, else the driver's libnvidia-ml.so.1).
    #[arg(long, value_name = "PATH")]
    nvml_lib: Option<std::path::PathBuf>,
    /// How often the GPUs are sampled [default: 500ms for trace, 1s for watch].
    #[arg(long, value_name = "D", value_parser = crate::units::parse_duration)]
    gpu_interval: Option<std::time::Duration>,
    /// A GPU at or under this utilisation (%) is idle.
    #[arg(long, value_name = "PCT", default_value_t = 5)]
    stall_threshold: u32,
    /// An idle GPU of the job is a stall once it has been idle this long [default: 3s for trace,
    /// 30s for watch].
    #[arg(long, value_name = "D", value_parser = crate::units::parse_duration)]
    stall_window: Option<std::time::Duration>,
    /// Do not load NVML at all.
    #[arg(long)]
    no_gpu: bool,
}

impl GpuArgs {
    pub fn options(self, interval: std::time::Duration, window: std::time::Duration) -> Option<GpuOptions> {
        (!self.no_gpu).then(|| GpuOptions {
            nvml_lib: self.nvml_lib,
            interval: self.gpu_interval.unwrap_or(interval),
            threshold_pct: self.stall_threshold,
            window: self.stall_window.unwrap_or(window),
        })
    }
}

/// NVML, opened once.
pub struct GpuWatch {
    sampler: GpuSampler,
}

impl GpuWatch {
    /// Opens NVML: the GPUs and driver on success, or the one-line reason GPU data is off.
    pub fn open(lib: Option<&std::path::Path>) -> Result<(Self, String), String> {
        match GpuSampler::open(lib) {
            Ok(sampler) => {
                let status = format!(
                    "{} GPU(s), driver {}",
                    sampler.gpu_count(),
                    sampler.driver_version().unwrap_or_else(|| "?".into())
                );
                Ok((Self { sampler }, status))
            }
            Err(e) => Err(e.to_string()),
        }
    }

    pub fn sample(&mut self) -> Vec<GpuSample> {
        self.sampler.sample()
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
