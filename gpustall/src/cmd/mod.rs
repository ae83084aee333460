//! The commands: `trace` and `watch` run the pipeline live through one [`event_loop`] over a
//! [`crate::pipeline::session::Session`]; `report`, `export` and `merge` replay recordings offline.

pub mod event_loop;
pub mod export;
pub mod gpu;
mod job_target;
mod kernel_log;
pub mod launch;
pub mod merge;
pub mod report;
mod seed;
pub mod signals;
mod stacks_flag;
pub mod trace;
pub mod units;
pub mod watch;

pub use kernel_log::KernelLogArgs;
pub use stacks_flag::StacksArgs;

/// A trace that ran to its end but lost events: everything is written, the figures are marked
/// as lower bounds, and the exit status says so (3).
#[derive(Debug, thiserror::Error)]
#[error("{0} events were lost: the report marks the figures that are lower bounds")]
pub struct LostEvents(pub u64);

/// `trace -- CMD`: everything is written; gpustall exits with the job's status (its exit
/// code, or 128 + the signal that killed it), as perf and strace do.
#[derive(Debug, thiserror::Error)]
#[error("the job exited with status {0}")]
pub struct JobExit(pub i32);

#[cfg(test)]
mod untrusted_names;
