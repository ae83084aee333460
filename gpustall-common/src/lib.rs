//! Types shared by the gpustall eBPF programs (kernel side) and the agent (user side).
//!
//! Everything here is `#[repr(C)]`, has no implicit padding and no `bool`, so that the bytes the
//! kernel writes are exactly the bytes the agent decodes. Each size is pinned with a `const`
//! assertion: changing a layout is a deliberate act that breaks the build until both sides agree.
//!
//! Ids have one vocabulary from the kernel's maps to the JSON a user reads, the one of ps and
//! /proc: a `pid` is a process (the kernel's `tgid`), a `tid` one of its threads (the kernel's
//! `pid`). The kernel's own names appear only where its fields are read (`task::TaskOffsets`,
//! a tracepoint's `pid` field).
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
