//! The GPU side of the model. A stall is first seen on the GPU (utilisation falls to ~0 while
//! the job is alive); the rest of gpustall explains it from the host side. On the eBPF clock
//! (CLOCK_MONOTONIC): what each GPU was doing ([`sample`]), when a GPU the job uses stalled and
//! for how long ([`stall`]), how the GPUs fared over the trace ([`summary`]).
//! [`GpuState::apply`] folds a tick of samples in, live and on replay alike; NVML itself is
//! read by `sources::nvml`.

pub mod sample;
pub mod stall;
pub mod totals;

pub use sample::GpuSample;
pub use stall::{StallDetector, StallEpisode};
pub use totals::GpuSummary;

use std::collections::{BTreeSet, HashSet};

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
    /// Critical Xid errors NVML reported, in order.
    pub xids: Vec<GpuXid>,
}

/// A critical Xid error NVML reported for a GPU, at the sample that carried it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct GpuXid {
    pub t_ns: u64,
    pub index: u32,
    pub uuid: String,
    pub pci_bus_id: Option<String>,
    pub xid: u64,
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
    pub fn apply(
        &mut self,
        samples: &[GpuSample],
        job_pids: &HashSet<u32>,
        alive: bool,
    ) -> Vec<StallEpisode> {
        let Some(detector) = self.detector.as_mut() else {
            return Vec::new();
        };
        let ended = detector.observe_all(samples, job_pids, alive);
        for s in samples {
            self.xids.extend(s.xids.iter().map(|&xid| GpuXid {
                t_ns: s.t_ns,
                index: s.index,
                uuid: s.uuid.clone(),
                pci_bus_id: s.pci_bus_id.clone(),
                xid,
            }));
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
