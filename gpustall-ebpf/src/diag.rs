//! The kernel side's own diagnostics (aya-log), on rare paths only: a ring full, a map full, a
//! reclaim end without its begin, a fallback taken. Each line costs a load of aya-log's level
//! global and a branch. The agent leaves the level at 0 (off) unless `RUST_LOG` asks for
//! [`LOG_TARGET`](gpustall_common::names::LOG_TARGET); the global is read-only data, frozen
//! before the programs load, so the verifier knows the level and drops the logging code: with
//! logging off a program runs what it ran without it. The hot programs (sched, block,
//! write_folio, wakeup_kswapd) have no line at all, so they are the same whatever the level
//! (their losses are counted, as everywhere).

/// A loss or a limit reached: `kwarn!("format", args..)`.
macro_rules! kwarn {
    ($($arg:tt)+) => {
        aya_log_ebpf::warn!(&(), target: gpustall_common::names::LOG_TARGET, $($arg)+)
    };
}
pub(crate) use kwarn;

/// A path taken that is expected now and then (an end seen without its begin, a fallback).
macro_rules! kdebug {
    ($($arg:tt)+) => {
        aya_log_ebpf::debug!(&(), target: gpustall_common::names::LOG_TARGET, $($arg)+)
    };
}
pub(crate) use kdebug;
