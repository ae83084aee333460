//! GPU side: NVML sampling and stall episodes (owned by the GPU work; see issue 4).
