//! SIGINT, SIGTERM and SIGHUP with who sent them. tokio's signal streams say only that a
//! signal came; `trace -- CMD` must also know whether the kernel sent it (a terminal's Ctrl-C
//! or hangup: `SI_KERNEL`) or which process did (`si_pid`), to tell a signal the job got
//! itself from one sent to gpustall alone. A `SA_SIGINFO` handler writes each one, as three
//! `i32`s, to a non-blocking pipe the event loop reads.

use std::{
    io::Read as _,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::atomic::{AtomicI32, Ordering},
};

use anyhow::Context as _;
use tokio::io::unix::AsyncFd;

/// The signals that end a trace (or that `trace -- CMD` passes on).
pub const HANDLED: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// One signal gpustall received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    pub sig: i32,
    /// `si_code`: `SI_USER` (kill), `SI_KERNEL` (the terminal, a hangup), `SI_QUEUE`, ...
    pub code: i32,
    /// `si_pid`: the sender's pid for kill and sigqueue; 0 when the kernel sent it.
    pub pid: i32,
}

impl Received {
    pub fn name(&self) -> &'static str {
        match self.sig {
            libc::SIGINT => "SIGINT",
            libc::SIGTERM => "SIGTERM",
            libc::SIGHUP => "SIGHUP",
            _ => "a signal",
        }
    }

    /// Sent by a process (kill, sigqueue, tgkill), which `pid` names.
    pub fn sent_by_a_process(&self) -> bool {
        self.code <= 0
    }
}

/// The pipe's write end, for the handler; -1 before [`Signals::install`].
static WRITE_FD: AtomicI32 = AtomicI32::new(-1);
/// gpustall's pid: a launched job between its fork and its exec runs this handler too, and
/// must not speak for gpustall.
static OWNER: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: only async-signal-safe calls (getpid, write) and reads of the siginfo the
    // kernel passed; errno is saved and restored around them.
    unsafe {
        let errno = *libc::__errno_location();
        let fd = WRITE_FD.load(Ordering::Relaxed);
        if fd >= 0 && libc::getpid() == OWNER.load(Ordering::Relaxed) {
            let (code, pid) =
                if info.is_null() { (0, 0) } else { ((*info).si_code, (*info).si_pid()) };
            let record = [sig, code, pid];
            // Under PIPE_BUF: written whole or not at all (a full pipe drops it).
            libc::write(fd, record.as_ptr().cast(), std::mem::size_of_val(&record));
        }
        *libc::__errno_location() = errno;
    }
}

/// The read end of the handler's pipe, registered with the runtime.
pub struct Signals {
    read: AsyncFd<std::fs::File>,
    /// Kept open for the handler.
    _write: OwnedFd,
}

impl Signals {
    /// Installs the handler for [`HANDLED`]. One per process: a second call replaces the first.
    pub fn install() -> anyhow::Result<Self> {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 returns.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(std::io::Error::last_os_error()).context("a pipe for signals");
        }
        // SAFETY: both were just created and are owned by nobody else.
        let (read, write) =
            unsafe { (std::fs::File::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        OWNER.store(std::process::id() as i32, Ordering::Relaxed);
        WRITE_FD.store(write.as_raw_fd(), Ordering::Relaxed);
        for sig in HANDLED {
            // SAFETY: a zeroed sigaction with our handler, an empty mask and SA_SIGINFO.
            let rc = unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_signal as *const () as usize;
                sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
                libc::sigemptyset(&mut sa.sa_mask);
                libc::sigaction(sig, &sa, std::ptr::null_mut())
            };
            if rc != 0 {
                return Err(std::io::Error::last_os_error()).context("installing a signal handler");
            }
        }
        // SAFETY: the AsyncFd owns the pipe's read end until it is dropped with it.
        let read = unsafe { AsyncFd::register_with_interest(read, tokio::io::Interest::READABLE) }
            .context("watching the signal pipe")?;
        Ok(Self { read, _write: write })
    }

    /// The next signal.
    pub async fn recv(&mut self) -> std::io::Result<Received> {
        loop {
            let mut guard = self.read.readable_mut().await?;
            let mut b = [0u8; 12];
            match guard.get_inner_mut().read(&mut b) {
                Ok(12) => {
                    let word = |i: usize| {
                        i32::from_ne_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
                    };
                    return Ok(Received { sig: word(0), code: word(1), pid: word(2) });
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => guard.clear_ready(),
                Err(e) => return Err(e),
            }
        }
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        WRITE_FD.store(-1, Ordering::Relaxed);
    }
}
