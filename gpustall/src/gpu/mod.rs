//! GPU side: NVML samples and stall episodes.
//!
//! A stall is first seen on the GPU (utilisation falls to ~0 while the job is alive); the
//! rest of gpustall explains it from the host side. So this module answers three questions
//! on the eBPF clock (CLOCK_MONOTONIC): what each GPU was doing ([`sampler`]), when a GPU
//! the job uses stalled and for how long ([`stall`]), and how the GPUs fared over the trace
//! ([`summary`]). NVML is loaded at run time: a host without the driver still gets the
//! host-side analysis, with one line saying GPU data is off ([`GpuUnavailable`]).
//!
//! Tests drive the real nvml-wrapper against the project's stand-in `libnvidia-ml.so.1`
//! (crate `nvml-stub`).

pub mod sampler;
pub mod stall;
pub mod summary;

pub use sampler::{monotonic_ns, GpuSample, GpuSampler};
#[cfg(test)]
pub use stall::Attribution;
pub use stall::{StallDetector, StallEpisode};
pub use summary::GpuSummary;
