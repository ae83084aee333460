//! What a trainer's or rank's thread was waiting for when it went to sleep interruptibly, told
//! by the system call it was blocked in: a pipe or socket read (a batch from a worker), a futex
//! (a lock or a queue's condition), poll (one of several fds), an ioctl (a device driver: the
//! NVIDIA driver's waits are ioctls or polls on /dev/nvidia*), a sleep. The kernel reads the
//! number at switch-out from the task's user-entry registers (x86_64 `pt_regs.orig_ax`, which
//! holds the number for the whole syscall) and keeps only the [`WaitClass`]: a syscall is
//! cheaper to read than a kernel stack, and unlike a stack it needs no symbol table.
//!
//! Not told apart: which fd (a pipe from a worker and a pipe from anything else are both a
//! read); a poll on a socket and a poll on a GPU's fd; a futex of a data queue and one of a lock
//! (the Python GIL).

/// The class of the syscall an interruptible wait blocked in (`u8` in the kernel's maps).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "user", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "user", serde(rename_all = "snake_case"))]
pub enum WaitClass {
    /// Not read: the classic sched_switch program (no BTF, or a kernel before 5.18), an
    /// architecture other than x86_64, or a wait that ended before the class was kept.
    Unknown = 0,
    /// read, readv, pread64, preadv(2), recvfrom, recvmsg, recvmmsg: a pipe or a socket.
    Read = 1,
    /// futex, futex_waitv, futex_wait: a lock, a condition variable, a semaphore.
    Futex = 2,
    /// poll, ppoll, select, pselect6, epoll_wait, epoll_pwait, epoll_pwait2.
    Poll = 3,
    /// ioctl: a device driver's wait.
    Ioctl = 4,
    /// nanosleep, clock_nanosleep.
    Sleep = 5,
    /// Any other syscall (wait4, accept, a write to a full pipe, io_uring_enter...), or none.
    Other = 6,
}

/// How many classes there are: the length of the per-class arrays in [`SyscallWaits`].
pub const WAIT_CLASSES: usize = 7;

impl WaitClass {
    pub const ALL: [WaitClass; WAIT_CLASSES] =
        [Self::Unknown, Self::Read, Self::Futex, Self::Poll, Self::Ioctl, Self::Sleep, Self::Other];

    /// The class kept in a map (an out-of-range byte reads as unknown).
    pub const fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Read,
            2 => Self::Futex,
            3 => Self::Poll,
            4 => Self::Ioctl,
            5 => Self::Sleep,
            6 => Self::Other,
            _ => Self::Unknown,
        }
    }

    /// How people read it.
    pub const fn describe(self) -> &'static str {
        match self {
            Self::Unknown => "an unknown syscall",
            Self::Read => "a pipe/socket read",
            Self::Futex => "a futex (lock, queue, condition)",
            Self::Poll => "poll/select/epoll",
            Self::Ioctl => "an ioctl (a device driver)",
            Self::Sleep => "a sleep",
            Self::Other => "another syscall",
        }
    }
}

/// The class of x86_64 syscall `nr` (`pt_regs.orig_ax`). Outside a syscall (`-1`: an
/// interrupt) the wait is "other"; inside a page fault (a userfaultfd wait, the only
/// interruptible one) `orig_ax` holds the fault's error code instead and is misread as a
/// syscall: rare enough for a trainer, and said in the README.
#[inline(always)]
pub const fn x86_64_class(nr: u64) -> WaitClass {
    match nr {
        // read, pread64, readv, recvfrom, recvmsg, preadv, recvmmsg, preadv2
        0 | 17 | 19 | 45 | 47 | 295 | 299 | 327 => WaitClass::Read,
        // futex, futex_waitv, futex_wait
        202 | 449 | 455 => WaitClass::Futex,
        // poll, select, epoll_wait, pselect6, ppoll, epoll_pwait, epoll_pwait2
        7 | 23 | 232 | 270 | 271 | 281 | 441 => WaitClass::Poll,
        16 => WaitClass::Ioctl,
        // nanosleep, clock_nanosleep
        35 | 230 => WaitClass::Sleep,
        _ => WaitClass::Other,
    }
}

/// A trainer's or rank's interruptible waits by class (key: pid): every wait of its threads
/// (`count`, `ns`), and of them those another process of the job ended (`data_*`: its wait for
/// data, as `sched::WakeCounters` sum it per waker). Indexed by `WaitClass as usize`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize, serde::Deserialize))]
pub struct SyscallWaits {
    pub count: [u64; WAIT_CLASSES],
    pub ns: [u64; WAIT_CLASSES],
    pub data_count: [u64; WAIT_CLASSES],
    pub data_ns: [u64; WAIT_CLASSES],
}
const _: () = assert!(core::mem::size_of::<SyscallWaits>() == 4 * 8 * WAIT_CLASSES);

#[cfg(feature = "user")]
impl SyscallWaits {
    /// These totals counted from `base` (an earlier read).
    pub fn since(&self, base: &Self) -> Self {
        let sub = |a: &[u64; WAIT_CLASSES], b: &[u64; WAIT_CLASSES]| {
            core::array::from_fn(|i| a[i].saturating_sub(b[i]))
        };
        Self {
            count: sub(&self.count, &base.count),
            ns: sub(&self.ns, &base.ns),
            data_count: sub(&self.data_count, &base.data_count),
            data_ns: sub(&self.data_ns, &base.data_ns),
        }
    }
}

#[cfg(feature = "user")]
// SAFETY: repr(C), only u64 arrays, no padding (size pinned above).
unsafe impl aya::Pod for SyscallWaits {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn x86_64_syscalls_fall_in_their_class() {
        for (nr, class) in [
            (0, WaitClass::Read),    // read: a worker's pipe
            (45, WaitClass::Read),   // recvfrom
            (47, WaitClass::Read),   // recvmsg: a unix socket (torch's fd passing)
            (202, WaitClass::Futex), // futex: a queue's condition, a lock
            (449, WaitClass::Futex), // futex_waitv
            (7, WaitClass::Poll),    // poll: multiprocessing's Connection.poll
            (23, WaitClass::Poll),   // select
            (232, WaitClass::Poll),  // epoll_wait
            (441, WaitClass::Poll),  // epoll_pwait2
            (16, WaitClass::Ioctl),  // a driver
            (35, WaitClass::Sleep),  // nanosleep
            (230, WaitClass::Sleep), // clock_nanosleep: time.sleep
            (1, WaitClass::Other),   // write to a full pipe
            (61, WaitClass::Other),  // wait4
            (u64::MAX, WaitClass::Other),
        ] {
            assert_eq!(x86_64_class(nr), class, "syscall {nr}");
        }
    }

    #[test]
    fn classes_round_trip_through_their_byte() {
        for (i, c) in WaitClass::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i, "ALL is in index order");
            assert_eq!(WaitClass::from_u8(*c as u8), *c);
        }
        assert_eq!(WaitClass::from_u8(200), WaitClass::Unknown);
    }
}
