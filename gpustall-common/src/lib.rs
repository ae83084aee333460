//! Types shared by the gpustall eBPF programs (kernel side) and the agent (user side).
//!
//! Everything here is `#[repr(C)]`, has no implicit padding and no `bool`, so that the bytes the
//! kernel writes are exactly the bytes the agent decodes. Each size is pinned with a `const`
//! assertion: changing a layout is a deliberate act that breaks the build until both sides agree.
#![no_std]

pub mod blocklayout;
pub mod counters;
pub mod events;
pub mod folio;
pub mod gpu;
pub mod hint;
pub mod names;
pub mod offsets;
pub mod reclaim;
pub mod rqslot;
pub mod sched;
pub mod stacked;
pub mod syscall;
pub mod task;

/// Length of a kernel task name (`TASK_COMM_LEN`).
pub const COMM_LEN: usize = 16;
/// Bytes of an exec'd file name kept in an [`events::ExecEvent`].
pub const FILENAME_LEN: usize = 64;
