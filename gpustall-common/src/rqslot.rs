//! Where the typed block programs keep a request between its start and its done: a slot in an
//! array, found from the request's address (`struct request *`), instead of a hash keyed by
//! (dev, sector). An array lookup is a few inlined instructions; a hash insert and delete take
//! a bucket lock and a free-list pop and push each, and were most of block_io_start's and
//! block_io_done's cost.
//!
//! Why the address: a request keeps it for its whole life, whatever merges do to its sector (a
//! front merge moves `__sector`, which leaked (dev, sector) slots), and the kernel preallocates
//! requests per tag and reuses them, so a device has a fixed set of addresses. Two things follow:
//! - A request that ends without a done (merged into another, or a queue that keeps no I/O
//!   statistics and has no scheduler, where the kernel skips the completion's accounting and its
//!   tracepoint) leaves its slot holding an address that comes back soon. The next start at that
//!   address settles it: a tracked one takes the slot over, an untracked one clears it, so a
//!   done never pairs with an earlier life of its request. (The request's own `start_time_ns`
//!   cannot tell its lives apart: since 6.10 the kernel sets it just after block_io_start.)
//! - Slots in use are bounded by the host's requests, not by time.
//!
//! An untracked start and a done first read a count of the slots in use per bucket of homes
//! ([`RQ_HINTS`], 16 KiB, cache-resident where the 512 KiB of slots are not): most requests on a
//! host are not the job's, and theirs then read no slot (a cache miss each: an untracked start
//! cost 254-287 ns a run with the probes, 94 without, on this VM). Counts are never under the
//! truth: raised before a claim, lowered after a slot is freed or taken over.
//!
//! Linear probing over [`RQ_PROBES`] slots from the address's home; a slot is claimed with an
//! atomic compare-and-exchange of its `rq` (BPF's cmpxchg, 5.12+: the typed start needs 6.5).

use crate::counters::{InflightIo, INFLIGHT_STALE_NS};

/// Slots in the array (a power of two): the most requests of tracked processes timed at once,
/// less collisions. 16,384 x 32 bytes = 512 KiB, shared by all CPUs.
pub const RQ_SLOTS: u32 = 16384;
/// Slots looked at from a request's home before it counts as lost ("map full").
pub const RQ_PROBES: u32 = 4;
/// Buckets of homes whose slots in use are counted (`RQ_SLOTS / RQ_HINTS` homes each).
pub const RQ_HINTS: u32 = 2048;

/// One request in flight: its address (0: free) and what its done needs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RqSlot {
    pub rq: u64,
    /// `io.start_ns` is 0 while the slot is free.
    pub io: InflightIo,
}
const _: () = assert!(core::mem::size_of::<RqSlot>() == 32);

/// The first slot looked at for a request: a multiplicative hash of its address (requests lie
/// in arrays of cache-line multiples, so the low 6 bits say nothing).
#[inline(always)]
pub const fn home(rq: u64) -> u32 {
    const BITS: u32 = RQ_SLOTS.trailing_zeros();
    ((rq >> 6).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - BITS)) as u32
}

/// The bucket of [`RQ_HINTS`] counting the slots in use for requests of this home.
#[inline(always)]
pub const fn bucket(home: u32) -> u32 {
    home / (RQ_SLOTS / RQ_HINTS)
}

/// The `i`-th slot looked at from `home`.
#[inline(always)]
pub const fn probe(home: u32, i: u32) -> u32 {
    (home + i) & (RQ_SLOTS - 1)
}

/// Whether a start of `rq` at `now` may take a slot holding `held`, started at `start_ns`:
/// free, an earlier life of the same request (it ended without a done), or a request whose
/// done never came within the minute the classic table also waits.
#[inline(always)]
pub const fn claimable(held: u64, start_ns: u64, rq: u64, now: u64) -> bool {
    held == 0 || held == rq || (start_ns != 0 && now.saturating_sub(start_ns) > INFLIGHT_STALE_NS)
}

/// The array as the programs see it: a slot's address, the atomic claim, and the counts of
/// slots in use per bucket.
pub trait SlotTable {
    /// The slot at `idx` (< [`RQ_SLOTS`]), or `None` if the map has fewer.
    fn slot(&self, idx: u32) -> Option<*mut RqSlot>;
    /// Replaces `(*slot).rq` by `new` if it still holds `old`, atomically.
    fn claim(&self, slot: *mut RqSlot, old: u64, new: u64) -> bool;
    /// Slots in use for the homes of `bucket` (< [`RQ_HINTS`]); 0 if the map has fewer.
    fn in_use(&self, bucket: u32) -> u64;
    /// Adds `delta` (wrapping: `u64::MAX` takes one away) to a bucket's count, atomically.
    fn count(&self, bucket: u32, delta: u64);
}

/// What a start did to the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Started {
    /// The request holds a slot until its done.
    Timed,
    /// Every slot looked at held another live request: this one goes untimed (counted lost).
    Full,
    /// An untracked request: no slot holds its address any more.
    Untracked,
}

/// A request starts at `now`: `io` for a tracked process's, `None` for another's (whose
/// address may still sit in a slot from an earlier life, and is cleared).
///
/// # Safety
/// `t.slot` must give valid, writable slots.
#[inline(always)]
pub unsafe fn start<T: SlotTable>(t: &T, rq: u64, io: Option<InflightIo>, now: u64) -> Started {
    let home = home(rq);
    let Some(io) = io else {
        if t.in_use(bucket(home)) != 0 {
            // SAFETY: the caller's contract.
            unsafe { clear(t, rq, home) };
        }
        return Started::Untracked;
    };
    t.count(bucket(home), 1);
    let mut i = 0;
    while i < RQ_PROBES {
        let Some(s) = t.slot(probe(home, i)) else { break };
        i += 1;
        // SAFETY: a live slot (the caller's contract); read once, as another CPU may write it.
        let held = unsafe { core::ptr::read_volatile(&raw const (*s).rq) };
        // SAFETY: as above.
        let start_ns = unsafe { core::ptr::read_volatile(&raw const (*s).io.start_ns) };
        if claimable(held, start_ns, rq, now) && t.claim(s, held, rq) {
            // SAFETY: the slot is this request's now; its done comes after this start.
            unsafe {
                core::ptr::write_volatile(&raw mut (*s).io, InflightIo { start_ns: now, ..io })
            };
            if held != 0 {
                // Taken over: the entry it held (an earlier life, or stale) is gone.
                t.count(bucket(self::home(held)), u64::MAX);
            }
            return Started::Timed;
        }
    }
    t.count(bucket(home), u64::MAX);
    Started::Full
}

/// Frees the slots holding `rq` from an earlier life.
///
/// # Safety
/// As [`start`].
#[inline(always)]
unsafe fn clear<T: SlotTable>(t: &T, rq: u64, home: u32) {
    let mut i = 0;
    while i < RQ_PROBES {
        let Some(s) = t.slot(probe(home, i)) else { break };
        i += 1;
        // SAFETY: a live slot; the address is this request's, no one else writes it now.
        if unsafe { core::ptr::read_volatile(&raw const (*s).rq) } == rq {
            // SAFETY: as above.
            unsafe { free(s) };
            t.count(bucket(home), u64::MAX);
        }
    }
}

/// A request is done: what its start kept, if a tracked process started it, and its slot freed.
///
/// # Safety
/// As [`start`].
#[inline(always)]
pub unsafe fn done<T: SlotTable>(t: &T, rq: u64) -> Option<InflightIo> {
    let home = home(rq);
    if t.in_use(bucket(home)) == 0 {
        return None;
    }
    let mut i = 0;
    while i < RQ_PROBES {
        let s = t.slot(probe(home, i))?;
        i += 1;
        // SAFETY: a live slot (the caller's contract).
        if unsafe { core::ptr::read_volatile(&raw const (*s).rq) } == rq {
            // SAFETY: this request's slot: its start wrote it before the request was issued.
            let io = unsafe { core::ptr::read_volatile(&raw const (*s).io) };
            // SAFETY: as above.
            unsafe { free(s) };
            t.count(bucket(home), u64::MAX);
            return Some(io);
        }
    }
    None
}

/// Marks a slot free: the start time first, so that a start looking at it meanwhile never sees
/// a free slot's address with an old time (which would look stale).
#[inline(always)]
unsafe fn free(s: *mut RqSlot) {
    // SAFETY: the caller's slot.
    unsafe {
        core::ptr::write_volatile(&raw mut (*s).io.start_ns, 0);
        core::ptr::write_volatile(&raw mut (*s).rq, 0);
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::{cell::UnsafeCell, vec, vec::Vec};

    use super::*;
    use crate::counters::IoKey;

    struct Table(Vec<UnsafeCell<RqSlot>>, Vec<UnsafeCell<u64>>);

    impl Table {
        fn new() -> Self {
            Self(
                (0..RQ_SLOTS).map(|_| UnsafeCell::new(RqSlot::default())).collect(),
                (0..RQ_HINTS).map(|_| UnsafeCell::new(0)).collect(),
            )
        }
        fn used(&self) -> usize {
            let used = self.0.iter().filter(|s| unsafe { (*s.get()).rq } != 0).count();
            // The counts are the truth here (no slot was left by a lost done).
            let counted: u64 = self.1.iter().map(|c| unsafe { *c.get() }).sum();
            assert_eq!(counted, used as u64, "counts match the slots in use");
            used
        }
    }

    impl SlotTable for Table {
        fn slot(&self, idx: u32) -> Option<*mut RqSlot> {
            self.0.get(idx as usize).map(UnsafeCell::get)
        }
        fn claim(&self, slot: *mut RqSlot, old: u64, new: u64) -> bool {
            unsafe {
                if (*slot).rq != old {
                    return false;
                }
                (*slot).rq = new;
            }
            true
        }
        fn in_use(&self, bucket: u32) -> u64 {
            self.1.get(bucket as usize).map_or(0, |c| unsafe { *c.get() })
        }
        fn count(&self, bucket: u32, delta: u64) {
            let c = self.1[bucket as usize].get();
            unsafe { *c = (*c).wrapping_add(delta) };
        }
    }

    fn io(pid: u32) -> Option<InflightIo> {
        Some(InflightIo { start_ns: 0, key: IoKey { pid, dev: 8 << 20, op: 1, in_reclaim: 0 } })
    }

    const RQ: u64 = 0xffff_8880_1234_5600;

    #[test]
    fn a_request_is_timed_from_its_start_to_its_done() {
        let t = Table::new();
        assert_eq!(unsafe { start(&t, RQ, io(7), 1_000) }, Started::Timed);
        let got = unsafe { done(&t, RQ) }.expect("paired");
        assert_eq!((got.start_ns, got.key.pid), (1_000, 7));
        assert_eq!(t.used(), 0, "the done frees the slot");
        assert!(unsafe { done(&t, RQ) }.is_none(), "one done per start");
    }

    #[test]
    fn an_untracked_request_is_never_paired_with_an_earlier_life_of_its_address() {
        let t = Table::new();
        // A tracked request merged into another: it never sees a done.
        unsafe { start(&t, RQ, io(7), 1_000) };
        // The kernel reuses the request for an untracked process's I/O.
        assert_eq!(unsafe { start(&t, RQ, None, 2_000) }, Started::Untracked);
        assert_eq!(t.used(), 0, "the untracked start cleared it");
        assert!(unsafe { done(&t, RQ) }.is_none(), "not timed as process 7's");
    }

    #[test]
    fn a_request_no_one_tracked_reads_no_slot_where_none_is_in_use_nearby() {
        struct Counting(Table, core::cell::Cell<u32>);
        impl SlotTable for Counting {
            fn slot(&self, idx: u32) -> Option<*mut RqSlot> {
                self.1.set(self.1.get() + 1);
                self.0.slot(idx)
            }
            fn claim(&self, slot: *mut RqSlot, old: u64, new: u64) -> bool {
                self.0.claim(slot, old, new)
            }
            fn in_use(&self, bucket: u32) -> u64 {
                self.0.in_use(bucket)
            }
            fn count(&self, bucket: u32, delta: u64) {
                self.0.count(bucket, delta)
            }
        }
        let t = Counting(Table::new(), core::cell::Cell::new(0));
        assert_eq!(unsafe { start(&t, RQ, None, 1) }, Started::Untracked);
        assert!(unsafe { done(&t, RQ) }.is_none());
        assert_eq!(t.1.get(), 0, "no slot read by its start or its done");
        // One tracked elsewhere in the table leaves this bucket's count at 0 too.
        let far = (1..).map(|k| RQ + k * 64).find(|&a| bucket(home(a)) != bucket(home(RQ)));
        unsafe { start(&t, far.unwrap(), io(1), 1) };
        let before = t.1.get();
        assert_eq!(unsafe { start(&t, RQ, None, 2) }, Started::Untracked);
        assert!(unsafe { done(&t, RQ) }.is_none());
        assert_eq!(t.1.get(), before, "still no slot read");
    }

    #[test]
    fn a_tracked_restart_takes_its_address_slot_over() {
        let t = Table::new();
        unsafe { start(&t, RQ, io(7), 1_000) };
        unsafe { start(&t, RQ, io(9), 5_000) };
        assert_eq!(t.used(), 1);
        let got = unsafe { done(&t, RQ) }.expect("paired");
        assert_eq!((got.start_ns, got.key.pid), (5_000, 9));
    }

    #[test]
    fn colliding_requests_probe_on_and_a_full_neighbourhood_counts_as_lost() {
        let t = Table::new();
        // Addresses with the same home: found by search, as the kernel's are arbitrary.
        let h = home(RQ);
        let same: Vec<u64> = (1..)
            .map(|k| RQ + k * 64)
            .filter(|&a| home(a) == h)
            .take(RQ_PROBES as usize + 1)
            .collect();
        for (n, &a) in same.iter().take(RQ_PROBES as usize).enumerate() {
            assert_eq!(unsafe { start(&t, a, io(n as u32), 10) }, Started::Timed);
        }
        let last = same[RQ_PROBES as usize];
        assert_eq!(unsafe { start(&t, last, io(99), 10) }, Started::Full);
        // Each is still found, whichever slot it took.
        for (n, &a) in same.iter().take(RQ_PROBES as usize).enumerate().rev() {
            assert_eq!(unsafe { done(&t, a) }.map(|io| io.key.pid), Some(n as u32));
        }
        assert!(unsafe { done(&t, last) }.is_none());
    }

    #[test]
    fn a_slot_whose_done_never_came_is_taken_after_a_minute() {
        let t = Table::new();
        let h = home(RQ);
        let others: Vec<u64> =
            (1..).map(|k| RQ + k * 64).filter(|&a| home(a) == h).take(4).collect();
        for &a in &others {
            unsafe { start(&t, a, io(1), 1) };
        }
        let later = 1 + INFLIGHT_STALE_NS + 1;
        assert_eq!(unsafe { start(&t, RQ, io(2), later) }, Started::Timed);
        assert_eq!(unsafe { done(&t, RQ) }.map(|io| io.start_ns), Some(later));
    }

    #[test]
    fn homes_spread_over_the_table() {
        // 4,096 requests 256 bytes apart (a device's preallocated requests): few share a home.
        let mut hits = vec![0u32; RQ_SLOTS as usize];
        for k in 0..4096u64 {
            hits[home(RQ + k * 256) as usize] += 1;
        }
        assert!(hits.iter().all(|&n| n <= 3), "max {}", hits.iter().max().unwrap());
    }
}
