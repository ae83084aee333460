//! The agent's side of the tracked-process hint (`gpustall_common::hint`): the kernel's
//! `TRACKED_HINT` array mapped into the agent's memory, so that the agent adds and takes away
//! with the same atomic adds as the programs (a map update would write a whole bucket and lose
//! a program's add racing with it).

use std::{
    os::fd::{AsFd, AsRawFd},
    ptr::NonNull,
    sync::atomic::{AtomicU64, Ordering},
};

use aya::maps::MapData;
use gpustall_common::hint::{slot, HINT_SLOTS};

/// `TRACKED_HINT`, mapped shared (unmapped on drop).
pub struct TrackedHint {
    words: NonNull<AtomicU64>,
    len: usize,
}

// SAFETY: the mapping is only touched through atomics, and lives as long as the struct.
unsafe impl Send for TrackedHint {}
// SAFETY: as above.
unsafe impl Sync for TrackedHint {}

impl TrackedHint {
    /// Maps the array (created `BPF_F_MMAPABLE`, [`HINT_SLOTS`] words).
    pub fn map(map: &MapData) -> std::io::Result<Self> {
        let len = (HINT_SLOTS as usize * 8).next_multiple_of(4096);
        let fd = map.fd().as_fd().as_raw_fd();
        // SAFETY: a fresh shared mapping of the map's own pages; nothing else aliases it here.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let words = NonNull::new(p.cast::<AtomicU64>()).ok_or(std::io::ErrorKind::Other)?;
        Ok(Self { words, len })
    }

    fn bucket(&self, pid: u32) -> &AtomicU64 {
        // SAFETY: `slot` is below HINT_SLOTS, inside the mapping; the words are 8-byte aligned
        // (the mapping is page-aligned) and only ever accessed atomically.
        unsafe { &*self.words.as_ptr().add(slot(pid) as usize) }
    }

    /// Counts one more tracked process in `pid`'s bucket (before it is inserted).
    pub fn add(&self, pid: u32) {
        self.bucket(pid).fetch_add(1, Ordering::SeqCst);
    }

    /// Counts one less (after a delete that removed it, or an insert that added nothing).
    pub fn sub(&self, pid: u32) {
        self.bucket(pid).fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for TrackedHint {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, not used after this.
        unsafe { libc::munmap(self.words.as_ptr().cast(), self.len) };
    }
}
