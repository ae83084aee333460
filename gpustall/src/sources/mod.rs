//! Stage 2, everything else the agent reads from the machine: /proc (the tree at start,
//! memory per process), the host and memory cgroup (`host`, `context`), NVML, the training log,
//! the agent's own cost, the kernel log's lines that matter to a verdict (`kmsg`). Each reader returns the plain sample types of [`crate::model`].

pub mod agent;
pub mod cgroup;
pub mod clock;
pub mod context;
pub mod cpu_sample;
pub mod host;
pub mod identity_read;
pub mod kmsg;
pub mod nvml;
pub mod procfs;
pub mod pyspy;
pub mod slurm;
pub mod trainlog;
