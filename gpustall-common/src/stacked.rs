//! Stacked block devices (device-mapper: LVM, dm-linear, dm-crypt; md RAID; NVMe multipath):
//! which bios are a remapped clone of a bio already counted, so that each byte counts once, on
//! the device the process used.
//!
//! What the kernel fires, 5.10 to 7.x: `block_bio_queue` runs once per bio, in the submitter,
//! the first time the bio is submitted (`BIO_TRACE_COMPLETION`). A bio-based stacking driver
//! (dm, md) clones the bio, points the clone at the lower device, fires `block_bio_remap`
//! (dev/sector: the clone's; old_dev: the device above) and submits the clone, usually in the
//! same task: the clone is queued again (dm: at once; md RAID1: once per mirror, when the plug is
//! flushed). A partition fires `block_bio_remap` too, before its bio is queued (5.10: dev is the
//! whole disk, old_dev the partition; 5.12+: dev == old_dev, the partition) and that bio is not
//! a clone. NVMe multipath sends the same bio on (remap, no second queue).
//!
//! So, per CPU, for the thread that last queued a tracked bio: the key of that bio (the device
//! it was submitted to), the device of the last bio queued (counted or clone), and a few clones
//! announced by a remap from one of those two devices and not queued yet. A queued bio that
//! matches one is a clone: not counted, its request's latency goes to the key above.
//! Pure logic, unit-tested here; `gpustall-ebpf/src/block.rs` runs it on a per-CPU slot.

use crate::counters::IoKey;

/// Clones announced and not yet queued that one CPU remembers: RAID1 announces one per mirror
/// for each bio in a plug, and queues them when the plug is flushed.
pub const CLONES: usize = 8;

/// One CPU's view of the tracked thread that last queued a bio there.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StackSlot {
    /// The thread (0: none).
    pub tid: u32,
    /// The device of the last bio it queued, counted or clone: the parent of the next remaps.
    pub queued_dev: u32,
    /// Where that bio's request will be (the device and sector a request start shows).
    pub rq_dev: u32,
    /// Clones in `clone_dev` (entries with dev 0 are free).
    pub pending: u32,
    pub rq_sector: u64,
    /// The end of that bio (sector + sectors): a device that splits it starts a request per part.
    pub rq_end: u64,
    /// The key of the last bio counted: the device the process submitted to.
    pub key: IoKey,
    pub clone_dev: [u32; CLONES],
    pub clone_sector: [u64; CLONES],
    /// Where the next announced clone goes (round robin over full slots).
    pub next: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<StackSlot>() == 152);

/// What `block_bio_queue` does with a bio of a tracked thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queued {
    /// The process's own bio: count its bytes under its own key.
    Own,
    /// A clone of a bio counted above: count nothing; its request belongs to this key.
    Clone(IoKey),
}

impl StackSlot {
    pub const fn empty() -> Self {
        Self {
            tid: 0,
            queued_dev: 0,
            rq_dev: 0,
            pending: 0,
            rq_sector: 0,
            rq_end: 0,
            key: IoKey { pid: 0, dev: 0, op: 0, in_reclaim: 0 },
            clone_dev: [0; CLONES],
            clone_sector: [0; CLONES],
            next: 0,
            _pad: 0,
        }
    }

    #[inline(always)]
    fn find_clone(&self, dev: u32, sector: u64) -> Option<usize> {
        let mut i = 0;
        while i < CLONES {
            if self.clone_dev[i] == dev && self.clone_sector[i] == sector {
                return Some(i);
            }
            i += 1;
        }
        None
    }

    #[inline(always)]
    fn free_slot(&self) -> Option<usize> {
        let mut i = 0;
        while i < CLONES {
            if self.clone_dev[i] == 0 {
                return Some(i);
            }
            i += 1;
        }
        None
    }

    /// A tracked thread `tid` queues a bio of `sectors` at (`dev`, `sector`) whose own key is
    /// `key`.
    #[inline(always)]
    pub fn on_queue(
        &mut self,
        tid: u32,
        dev: u32,
        sector: u64,
        sectors: u64,
        key: IoKey,
    ) -> Queued {
        if self.tid == tid && self.pending != 0 && dev != 0 {
            if let Some(i) = self.find_clone(dev, sector) {
                self.clone_dev[i] = 0;
                self.pending -= 1;
                self.queued_dev = dev;
                self.rq_dev = dev;
                self.rq_sector = sector;
                self.rq_end = sector + sectors;
                return Queued::Clone(self.key);
            }
        }
        if self.tid != tid {
            // Another thread's clones are its own: they are never this one's bios.
            *self = Self::empty();
            self.tid = tid;
        }
        self.queued_dev = dev;
        self.rq_dev = dev;
        self.rq_sector = sector;
        self.rq_end = sector + sectors;
        self.key = key;
        Queued::Own
    }

    /// The same thread fires `block_bio_remap`: (`dev`, `sector`) now, from (`old_dev`,
    /// `old_sector`). Returns true when it announced a clone of a bio counted above (the bio
    /// above then never completes as a request on `old_dev`).
    #[inline(always)]
    pub fn on_remap(
        &mut self,
        tid: u32,
        dev: u32,
        sector: u64,
        old_dev: u32,
        old_sector: u64,
    ) -> bool {
        if self.tid != tid || dev == 0 {
            return false;
        }
        if dev != old_dev && (old_dev == self.queued_dev || old_dev == self.key.dev) {
            // dm/md: a clone for the lower device; NVMe multipath: the same bio sent on (its
            // announcement is never queued and is overwritten in time).
            let mut i = self.next as usize % CLONES;
            if let Some(free) = self.free_slot() {
                i = free;
            } else {
                self.next = self.next.wrapping_add(1);
            }
            if i < CLONES {
                if self.clone_dev[i] == 0 {
                    self.pending += 1;
                }
                self.clone_dev[i] = dev;
                self.clone_sector[i] = sector;
            }
            self.rq_end = sector + self.rq_end.saturating_sub(self.rq_sector);
            self.rq_dev = dev;
            self.rq_sector = sector;
            return true;
        }
        // A partition's remap (LVM on a partition): an announced clone (or the request the
        // last bio will start) moves from the partition's sector to the disk's.
        if self.pending != 0 {
            if let Some(i) = self.find_clone(dev, old_sector) {
                self.clone_sector[i] = sector;
            }
        }
        if self.rq_dev == dev && self.rq_sector == old_sector {
            self.rq_end = sector + self.rq_end.saturating_sub(self.rq_sector);
            self.rq_sector = sector;
        }
        false
    }

    /// `block_io_start` on (`dev`, `sector`) in thread `tid`: the key of the bio that starts
    /// this request, when this thread queued it last here. Every request inside that bio's
    /// sectors is its own: a device that splits a bio (7.x splits a clone at the loop device's
    /// limit) starts one per part.
    #[inline(always)]
    pub fn take_request(&self, tid: u32, dev: u32, sector: u64) -> Option<IoKey> {
        let inside = self.rq_sector <= sector && sector < self.rq_end;
        if self.tid != 0 && self.tid == tid && self.rq_dev == dev && inside {
            return Some(self.key);
        }
        None
    }
}

/// The last clone any CPU announced, shared by all CPUs: a thread moved to another CPU between
/// a clone's remap and its queue finds it here (one clone: dm, a RAID1 read; written without a
/// lock, so two CPUs announcing at once may leave a mark that matches nothing: that clone
/// counts again, as without it).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MovedClone {
    pub tid: u32,
    pub dev: u32,
    pub sector: u64,
    pub key: IoKey,
}
const _: () = assert!(core::mem::size_of::<MovedClone>() == 32);

impl MovedClone {
    /// The key above when (`tid`, `dev`, `sector`) is this clone (then forgotten).
    #[inline(always)]
    pub fn take(&mut self, tid: u32, dev: u32, sector: u64) -> Option<IoKey> {
        if self.tid != 0 && self.tid == tid && self.dev == dev && self.sector == sector {
            self.tid = 0;
            return Some(self.key);
        }
        None
    }
}

impl StackSlot {
    /// After a queued bio turned out to be a clone announced on another CPU: its request is
    /// timed under `key`, the device above.
    #[inline(always)]
    pub fn adopt(&mut self, key: IoKey) {
        self.key = key;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DM0: u32 = 254 << 20;
    const DM1: u32 = (254 << 20) | 1;
    const LOOP0: u32 = 7 << 20;
    const SDA: u32 = 8 << 20;
    const SDA2: u32 = (8 << 20) | 2;
    const SDB: u32 = (8 << 20) | 16;
    const MD0: u32 = 9 << 20;
    const TID: u32 = 100;

    fn key(dev: u32) -> IoKey {
        IoKey { pid: 99, dev, op: 1, in_reclaim: 0 }
    }

    /// Replays (queue | remap) events of one thread; returns the bytes counted per key dev and
    /// the clones' keys, as the kernel programs would.
    fn counted(events: &[Ev]) -> (u64, Vec<Queued>) {
        let mut s = StackSlot::empty();
        let mut bytes = 0;
        let mut out = Vec::new();
        for e in events {
            match *e {
                Ev::Queue(dev, sector, n) => {
                    let q = s.on_queue(TID, dev, sector, n / 512, key(dev));
                    if q == Queued::Own {
                        bytes += n;
                    }
                    out.push(q);
                }
                Ev::Remap(dev, sector, old_dev, old_sector) => {
                    s.on_remap(TID, dev, sector, old_dev, old_sector);
                }
            }
        }
        (bytes, out)
    }

    extern crate std;
    use std::vec::Vec;

    #[derive(Clone, Copy)]
    enum Ev {
        Queue(u32, u64, u64),
        Remap(u32, u64, u32, u64),
    }
    use Ev::{Queue, Remap};

    #[test]
    fn dm_linear_clone_is_counted_once_at_the_dm_device() {
        // dm-0 at sector 0 -> loop0 sector 0 (linear, offset 0), 1 MiB bios.
        let ev = [
            Queue(DM0, 0, 1 << 20),
            Remap(LOOP0, 0, DM0, 0),
            Queue(LOOP0, 0, 1 << 20),
            Queue(DM0, 2048, 1 << 20),
            Remap(LOOP0, 2048, DM0, 2048),
            Queue(LOOP0, 2048, 1 << 20),
        ];
        let (bytes, q) = counted(&ev);
        assert_eq!(bytes, 2 << 20);
        assert_eq!(q[1], Queued::Clone(key(DM0)));
        assert_eq!(q[3], Queued::Clone(key(DM0)));
    }

    #[test]
    fn a_request_started_by_a_clone_belongs_to_the_dm_device() {
        let mut s = StackSlot::empty();
        assert_eq!(s.on_queue(TID, DM0, 0, 2048, key(DM0)), Queued::Own);
        assert!(s.on_remap(TID, LOOP0, 8, DM0, 0));
        assert_eq!(s.on_queue(TID, LOOP0, 8, 2048, key(LOOP0)), Queued::Clone(key(DM0)));
        assert_eq!(s.take_request(TID + 1, LOOP0, 8), None, "another thread's request");
        assert_eq!(s.take_request(TID, LOOP0, 8), Some(key(DM0)));
        // The loop device splits the clone at 1024 sectors: the second part's request too.
        assert_eq!(s.take_request(TID, LOOP0, 8 + 1024), Some(key(DM0)));
        assert_eq!(s.take_request(TID, LOOP0, 8 + 2048), None, "past the bio");
        assert_eq!(s.take_request(TID, DM0, 8), None, "another device");
    }

    #[test]
    fn a_split_into_two_clones_counts_once() {
        // dm-0's bio crosses two linear segments: two clones, both announced before either's
        // lower device is processed.
        let ev = [
            Queue(DM0, 100, 1 << 20),
            Remap(LOOP0, 5000, DM0, 100),
            Queue(LOOP0, 5000, 4096),
            Remap(SDB, 0, DM0, 108),
            Queue(SDB, 0, 1 << 20),
        ];
        assert_eq!(counted(&ev).0, 1 << 20);
    }

    #[test]
    fn dm_over_dm_counts_once_at_the_top() {
        let ev = [
            Queue(DM1, 0, 4096),
            Remap(DM0, 0, DM1, 0),
            Queue(DM0, 0, 4096),
            Remap(LOOP0, 64, DM0, 0),
            Queue(LOOP0, 64, 4096),
        ];
        let (bytes, q) = counted(&ev);
        assert_eq!(bytes, 4096);
        assert_eq!(q[2], Queued::Clone(key(DM1)), "the lowest clone belongs to the top device");
    }

    #[test]
    fn raid1_mirrors_queued_at_unplug_count_once() {
        // md0 RAID1: two bios in one plug, each announced to both mirrors, queued at the flush.
        let ev = [
            Queue(MD0, 0, 4096),
            Remap(SDA, 2048, MD0, 0),
            Remap(SDB, 2048, MD0, 0),
            Queue(MD0, 8, 4096),
            Remap(SDA, 2056, MD0, 8),
            Remap(SDB, 2056, MD0, 8),
            Queue(SDA, 2048, 4096),
            Queue(SDB, 2048, 4096),
            Queue(SDA, 2056, 4096),
            Queue(SDB, 2056, 4096),
        ];
        assert_eq!(counted(&ev).0, 8192);
    }

    #[test]
    fn lvm_over_raid1_counts_once() {
        let ev = [
            Queue(DM0, 0, 4096),
            Remap(MD0, 0, DM0, 0),
            Queue(MD0, 0, 4096),
            Remap(SDA, 2048, MD0, 0),
            Remap(SDB, 2048, MD0, 0),
            Queue(SDA, 2048, 4096),
            Queue(SDB, 2048, 4096),
        ];
        assert_eq!(counted(&ev).0, 4096);
    }

    #[test]
    fn partition_bios_are_counted_on_5_10_and_6_x() {
        // 5.10: remap (disk <- partition) before the queue on the disk; 5.12+: dev == old_dev.
        let ev = [
            Queue(SDA, 10, 4096),
            Remap(SDA, 2058, SDA2, 10),
            Queue(SDA, 2058, 4096),
            Remap(SDA2, 4000, SDA2, 1952),
            Queue(SDA2, 4000, 4096),
            Remap(SDA2, 4008, SDA2, 1960),
            Queue(SDA2, 4008, 4096),
        ];
        assert_eq!(counted(&ev).0, 4 * 4096);
    }

    #[test]
    fn lvm_on_a_partition_follows_the_partition_remap() {
        // 5.12+: dm-0 -> sda2 (sector relative to the partition), then the partition's remap.
        let ev = [
            Queue(DM0, 0, 4096),
            Remap(SDA2, 100, DM0, 0),
            Remap(SDA2, 2148, SDA2, 100),
            Queue(SDA2, 2148, 4096),
        ];
        assert_eq!(counted(&ev).0, 4096);
        // 5.10: the clone is announced on the whole disk, the partition remap moves it.
        let ev = [
            Queue(DM0, 0, 4096),
            Remap(SDA, 100, DM0, 0),
            Remap(SDA, 2148, SDA2, 100),
            Queue(SDA, 2148, 4096),
        ];
        assert_eq!(counted(&ev).0, 4096);
    }

    #[test]
    fn nvme_multipath_sends_the_same_bio_on_and_its_request_is_the_heads() {
        const HEAD: u32 = 259 << 20;
        const PATH: u32 = (259 << 20) | 1;
        let mut s = StackSlot::empty();
        for i in 0..20u64 {
            assert_eq!(s.on_queue(TID, HEAD, i * 8, 8, key(HEAD)), Queued::Own, "bio {i}");
            s.on_remap(TID, PATH, i * 8, HEAD, i * 8);
            assert_eq!(s.take_request(TID, PATH, i * 8), Some(key(HEAD)));
        }
    }

    #[test]
    fn a_clone_queued_after_its_thread_moved_cpu_is_found_in_the_shared_mark() {
        // Announced on CPU A, queued on CPU B whose slot knows nothing of it.
        let (mut a, mut b) = (StackSlot::empty(), StackSlot::empty());
        a.on_queue(TID, MD0, 0, 2048, key(MD0));
        assert!(a.on_remap(TID, SDA, 2048, MD0, 0));
        let mut mark = MovedClone { tid: TID, dev: SDA, sector: 2048, key: a.key };
        assert_eq!(b.on_queue(TID, SDA, 2048, 2048, key(SDA)), Queued::Own, "B's slot misses");
        assert_eq!(mark.take(TID + 1, SDA, 2048), None, "another thread");
        assert_eq!(mark.take(TID, SDA, 2048), Some(key(MD0)));
        assert_eq!(mark.take(TID, SDA, 2048), None, "taken once");
        b.adopt(key(MD0));
        assert_eq!(b.take_request(TID, SDA, 2048), Some(key(MD0)));
    }

    #[test]
    fn another_threads_clones_do_not_hide_this_ones_bios() {
        let mut s = StackSlot::empty();
        s.on_queue(TID, DM0, 0, 8, key(DM0));
        s.on_remap(TID, LOOP0, 0, DM0, 0);
        assert_eq!(s.on_queue(TID + 1, LOOP0, 0, 8, key(LOOP0)), Queued::Own);
    }

    #[test]
    fn more_announced_clones_than_slots_overwrite_the_oldest() {
        let mut s = StackSlot::empty();
        s.on_queue(TID, MD0, 0, 8, key(MD0));
        for i in 0..(CLONES as u64 + 3) {
            s.on_remap(TID, SDA, i, MD0, 0);
        }
        assert_eq!(s.pending as usize, CLONES);
        let clones = (0..(CLONES as u64 + 3))
            .filter(|&i| s.on_queue(TID, SDA, i, 8, key(SDA)) != Queued::Own)
            .count();
        assert_eq!(clones, CLONES, "the newest {CLONES} are still known");
    }
}
