//! The kernel side's own lines (aya-log; gpustall-ebpf's `diag`): a ring or a map full, a
//! reclaim end without its begin, a fallback taken. Off unless `RUST_LOG` turns on the target
//! [`LOG_TARGET`] (`RUST_LOG=gpustall::ebpf=debug`): then the level it asks for is written into
//! the object's level global before load, and a task on the runtime drains the log ring into
//! `log`. Otherwise the global stays 0, the verifier drops the logging code (the global is
//! read-only data it knows), no reader is made and the ring is shrunk to one page.

use aya::{Ebpf, EbpfLoader};
use gpustall_common::names::LOG_TARGET;

/// aya-log's ring, declared by aya-log-ebpf (aya-log keeps its name private).
pub const LOG_MAP: &str = "AYA_LOGS";

/// The kernel side's level as aya-log's global holds it: the most verbose level `enabled`
/// turns on, 0 (off) when none.
pub fn kernel_level(enabled: impl Fn(log::Level) -> bool) -> u8 {
    use aya_log::Level as K;
    use log::Level as L;
    [
        (L::Trace, K::Trace),
        (L::Debug, K::Debug),
        (L::Info, K::Info),
        (L::Warn, K::Warn),
        (L::Error, K::Error),
    ]
    .into_iter()
    .find(|(l, _)| enabled(*l))
    .map_or(0, |(_, k)| k.into())
}

/// The level the user asked for (`RUST_LOG`, through the logger `main` set up).
pub fn requested_level() -> u8 {
    kernel_level(|l| log::log_enabled!(target: LOG_TARGET, l))
}

/// Sets the kernel side's level in the object about to load (`level`: [`requested_level`]);
/// when off, the ring nobody reads takes one page of kernel memory instead of 128 KiB.
pub fn configure<'a>(loader: &mut EbpfLoader<'a>, level: &'a u8) {
    log::debug!("the kernel side's lines: level {level} (0: off)");
    loader.override_global(aya_log::LEVEL, level, true);
    if *level == 0 {
        if let Some(page) = crate::sources::host::page_size().and_then(|p| u32::try_from(p).ok()) {
            loader.map_max_entries(LOG_MAP, page);
        }
    }
}

/// The kernel side's log ring, shared by the task that drains it as lines come and by
/// [`Reader::drain`] at the end: a trace that ends before the task's next turn still prints
/// the lines the programs wrote.
pub struct Reader(Shared);

type Shared = std::sync::Arc<std::sync::Mutex<aya_log::EbpfLogger<&'static dyn log::Log>>>;

fn flush(shared: &Shared) {
    if let Ok(mut l) = shared.lock() {
        l.flush();
    }
}

/// The ring as the runtime watches it: its fd, kept open by the logger it holds.
struct Watched {
    logger: Shared,
    fd: std::os::fd::RawFd,
}

impl std::os::fd::AsRawFd for Watched {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd
    }
}

impl Reader {
    /// Prints whatever lines the ring holds now.
    pub fn drain(&self) {
        flush(&self.0);
    }
}

/// Drains the kernel side's lines into `log` on the current tokio runtime, for as long as the
/// runtime runs. A logger that cannot start is a debug message: the tracer works without it.
pub fn start(ebpf: &mut Ebpf) -> Option<Reader> {
    use std::os::fd::AsRawFd as _;
    use tokio::io::{unix::AsyncFd, Interest};
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        log::debug!("the kernel side's lines are not read: no runtime");
        return None;
    };
    let _in_runtime = runtime.enter();
    let logger = match aya_log::EbpfLogger::init(ebpf) {
        Ok(l) => l,
        Err(e) => {
            log::debug!("the kernel side's lines are not read: {e}");
            return None;
        }
    };
    let fd = logger.as_raw_fd();
    let shared: Shared = std::sync::Arc::new(std::sync::Mutex::new(logger));
    let watched = Watched { logger: std::sync::Arc::clone(&shared), fd };
    // SAFETY: the AsyncFd owns `watched`, whose logger keeps the ring's fd open until the
    // AsyncFd is dropped with it: the fd cannot be closed while registered.
    let mut fd = match unsafe { AsyncFd::register_with_interest(watched, Interest::READABLE) } {
        Ok(fd) => fd,
        Err(e) => {
            log::debug!("the kernel side's lines are not read: {e}");
            return None;
        }
    };
    runtime.spawn(async move {
        loop {
            match fd.readable_mut().await {
                Ok(mut ready) => {
                    flush(&ready.get_inner().logger);
                    ready.clear_ready();
                }
                Err(e) => {
                    log::debug!("the kernel side's lines stop: {e}");
                    return;
                }
            }
        }
    });
    Some(Reader(shared))
}

#[cfg(test)]
mod tests {
    use super::kernel_level;
    use log::Level;

    #[test]
    fn the_kernel_level_is_the_most_verbose_one_asked_for() {
        // Nothing asked: off (aya-log's own default would log everything).
        assert_eq!(kernel_level(|_| false), 0);
        assert_eq!(kernel_level(|l| l <= Level::Warn), aya_log::Level::Warn as u8);
        assert_eq!(kernel_level(|l| l <= Level::Debug), aya_log::Level::Debug as u8);
        assert_eq!(kernel_level(|_| true), aya_log::Level::Trace as u8);
    }
}
