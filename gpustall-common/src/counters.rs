//! Counters aggregated in the kernel (per-CPU maps the agent reads periodically). High-rate
//! events (one hit per swapped folio, one per block request) are summed here instead of sending
//! a ring record each.

/// Per tracked process (key: tgid), in a per-CPU hash map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize, serde::Deserialize))]
pub struct ProcCounters {
    /// Pages of the anonymous folios this process's reclaim wrote out (`mm_vmscan_write_folio`):
    /// swap-out, in kernel pages (a 2 MiB THP is 512 of 4 KiB), as pswpout counts. Recordings
    /// before the BTF-typed program named it `swapout_anon_folios` (one per folio).
    #[cfg_attr(feature = "user", serde(alias = "swapout_anon_folios"))]
    pub swapout_anon_pages: u64,
    /// The same for file folios (dirty page cache written back by reclaim).
    #[cfg_attr(feature = "user", serde(alias = "writeback_file_folios"))]
    pub writeback_file_pages: u64,
    /// `mm_vmscan_wakeup_kswapd` hit in this process's allocations.
    pub kswapd_wakeups: u64,
    /// Direct and memcg reclaim totals (the episodes also go to the ring; these survive losses).
    pub direct_reclaim_count: u64,
    pub direct_reclaim_ns: u64,
    pub memcg_reclaim_count: u64,
    pub memcg_reclaim_ns: u64,
    pub reclaimed_pages: u64,
    pub throttled_count: u64,
    pub throttled_us: u64,
}
const _: () = assert!(core::mem::size_of::<ProcCounters>() == 80);

#[cfg(feature = "user")]
impl ProcCounters {
    /// These totals counted from `base` (an earlier read) instead of from the start.
    pub fn since(&self, base: &Self) -> Self {
        Self {
            swapout_anon_pages: self.swapout_anon_pages.saturating_sub(base.swapout_anon_pages),
            writeback_file_pages: self
                .writeback_file_pages
                .saturating_sub(base.writeback_file_pages),
            kswapd_wakeups: self.kswapd_wakeups.saturating_sub(base.kswapd_wakeups),
            direct_reclaim_count: self
                .direct_reclaim_count
                .saturating_sub(base.direct_reclaim_count),
            direct_reclaim_ns: self.direct_reclaim_ns.saturating_sub(base.direct_reclaim_ns),
            memcg_reclaim_count: self.memcg_reclaim_count.saturating_sub(base.memcg_reclaim_count),
            memcg_reclaim_ns: self.memcg_reclaim_ns.saturating_sub(base.memcg_reclaim_ns),
            reclaimed_pages: self.reclaimed_pages.saturating_sub(base.reclaimed_pages),
            throttled_count: self.throttled_count.saturating_sub(base.throttled_count),
            throttled_us: self.throttled_us.saturating_sub(base.throttled_us),
        }
    }
}

/// Block I/O direction, from the first letters of `rwbs`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoOp {
    Read = 0,
    Write = 1,
    /// Discard, flush-only, ...
    Other = 2,
}

impl TryFrom<u32> for IoOp {
    type Error = u32;
    fn try_from(v: u32) -> Result<Self, u32> {
        match v {
            0 => Ok(Self::Read),
            1 => Ok(Self::Write),
            2 => Ok(Self::Other),
            other => Err(other),
        }
    }
}

/// Key of the per-process block I/O map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct IoKey {
    pub tgid: u32,
    /// Kernel `dev_t` (major << 20 | minor).
    pub dev: u32,
    pub op: u32,
    /// 1 when the submitting thread was inside reclaim: swap-out / writeback caused by memory
    /// pressure, not by the process's own reads and writes.
    pub in_reclaim: u32,
}
const _: () = assert!(core::mem::size_of::<IoKey>() == 16);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize, serde::Deserialize))]
pub struct IoCounters {
    /// Bytes and bios submitted (block_bio_queue, in the submitting task).
    pub bytes: u64,
    pub bios: u64,
    /// Requests started by this task that completed (block_io_start to block_io_done), and
    /// the sum and max of their latency.
    pub completed: u64,
    pub latency_ns_sum: u64,
    pub latency_ns_max: u64,
}
const _: () = assert!(core::mem::size_of::<IoCounters>() == 40);

#[cfg(feature = "user")]
impl IoCounters {
    /// These totals counted from `base` (an earlier read). A maximum cannot be rebased (the
    /// window's own is unknown): the run's is kept.
    pub fn since(&self, base: &Self) -> Self {
        Self {
            bytes: self.bytes.saturating_sub(base.bytes),
            bios: self.bios.saturating_sub(base.bios),
            completed: self.completed.saturating_sub(base.completed),
            latency_ns_sum: self.latency_ns_sum.saturating_sub(base.latency_ns_sum),
            latency_ns_max: self.latency_ns_max,
        }
    }
}

/// A block request in flight, keyed by (dev, sector) between io_start and io_done.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct InflightKey {
    pub dev: u32,
    pub _pad: u32,
    pub sector: u64,
}
const _: () = assert!(core::mem::size_of::<InflightKey>() == 16);

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct InflightIo {
    pub start_ns: u64,
    pub key: IoKey,
}
const _: () = assert!(core::mem::size_of::<InflightIo>() == 24);

/// Slots of the in-flight array the typed block programs use (a power of two).
pub const IO_SLOTS: u32 = 8192;

/// A request in flight, in the typed programs' array (`IO_SLOTS`): found by hashing its
/// (dev, sector), the classic pairing's key (the verifier lets no program hash a kernel
/// pointer). An array slot costs a load and a store where a hash map's insert and delete each
/// took a bucket lock and an element off a free list (~350 ns apiece on the test VM).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct InflightSlot {
    pub dev: u32,
    /// 1 while a request holds the slot.
    pub used: u32,
    pub sector: u64,
    pub start_ns: u64,
    pub key: IoKey,
}
const _: () = assert!(core::mem::size_of::<InflightSlot>() == 40);

impl InflightSlot {
    /// Whether this slot holds the request at (dev, sector).
    #[inline(always)]
    pub fn holds(&self, dev: u32, sector: u64) -> bool {
        self.used != 0 && self.dev == dev && self.sector == sector
    }

    /// Whether a request starting at `now_ns` may take this slot: free, its own (a start whose
    /// done never came), or held longer than any request lives ([`INFLIGHT_STALE_NS`]: its
    /// done was lost).
    #[inline(always)]
    pub fn claimable(&self, dev: u32, sector: u64, now_ns: u64) -> bool {
        self.used == 0
            || (self.dev == dev && self.sector == sector)
            || now_ns.saturating_sub(self.start_ns) > INFLIGHT_STALE_NS
    }
}

/// A request in flight this long lost its completion (no block device takes a minute without
/// the kernel's own timeout ending the request).
pub const INFLIGHT_STALE_NS: u64 = 60_000_000_000;

/// The two candidate slots of a request (its dev and sector hashed): a second choice makes
/// two requests in flight that share a first slot rare to collide (one then loses its
/// latency, counted as lost).
#[inline(always)]
pub fn slot_indexes(dev: u32, sector: u64) -> (u32, u32) {
    // splitmix64's finalizer: neighbouring sectors (low bits) and disks (high bits) alike
    // spread over all 64 bits.
    let mut h = sector ^ (dev as u64).rotate_left(32);
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    let mask = (IO_SLOTS - 1) as u64;
    ((h & mask) as u32, ((h >> 32) & mask) as u32)
}

/// Buckets of the kernel-side block latency histogram: bucket `i` holds latencies in
/// `[2^i, 2^(i+1))` ns (bucket 0 also holds 0).
pub const LATENCY_BUCKETS: u32 = 40;

/// Index of a latency in the log2 histogram.
#[inline(always)]
pub fn latency_bucket(ns: u64) -> u32 {
    let b = 63u32.saturating_sub(ns.leading_zeros());
    if b >= LATENCY_BUCKETS {
        LATENCY_BUCKETS - 1
    } else {
        b
    }
}

/// Indices of the host-level counter array: activity outside the traced tree that still
/// matters to it (kswapd's background reclaim, other processes' reclaim), reported as such,
/// never blamed on a traced process.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostCounter {
    KswapdSwapoutAnon = 0,
    KswapdWritebackFile = 1,
    OtherSwapoutAnon = 2,
    OtherWritebackFile = 3,
    OtherDirectReclaimCount = 4,
    OtherDirectReclaimNs = 5,
    OtherMemcgReclaimCount = 6,
    OtherMemcgReclaimNs = 7,
    KswapdIoBytes = 8,
    OtherReclaimIoBytes = 9,
    KswapdWakeups = 10,
    OtherThrottledCount = 11,
}
pub const HOST_COUNTERS: u32 = 12;

/// Indices of the per-CPU counter of events that could not be recorded.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LostCounter {
    /// Reservation failed in the critical ring (fork/exit/OOM/signal).
    CriticalRing = 0,
    /// Reservation failed in the bulk ring (reclaim episodes, throttling).
    BulkRing = 1,
    /// A kernel map was full (tracked processes, counters, in-flight I/O).
    MapFull = 2,
}
pub const LOST_COUNTERS: u32 = 3;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_taken_when_free_own_or_stale() {
        let held = InflightSlot {
            dev: 7 << 20,
            used: 1,
            sector: 2048,
            start_ns: 1_000,
            ..Default::default()
        };
        assert!(InflightSlot::default().claimable(7 << 20, 4096, 2_000));
        assert!(!InflightSlot::default().holds(0, 0), "a free slot holds nothing");
        assert!(held.holds(7 << 20, 2048) && !held.holds(8 << 20, 2048));
        assert!(held.claimable(7 << 20, 2048, 2_000), "the same request started again");
        assert!(!held.claimable(7 << 20, 4096, 2_000), "another request in flight");
        assert!(held.claimable(7 << 20, 4096, 1_000 + INFLIGHT_STALE_NS + 1));
    }

    #[test]
    fn neighbouring_requests_in_flight_find_a_free_slot() {
        // 1,024 requests of 4 KiB in a row on one disk, all in flight at once: with two choices
        // of slot, about 1 % find both taken (with one choice, 6 % would).
        let mut taken = [false; IO_SLOTS as usize];
        let mut displaced = 0;
        for i in 0..1024 {
            let (a, b) = slot_indexes(259 << 20, 1_000_000 + i * 8);
            match (taken[a as usize], taken[b as usize]) {
                (false, _) => taken[a as usize] = true,
                (true, false) => taken[b as usize] = true,
                (true, true) => displaced += 1,
            }
        }
        assert!(displaced <= 16, "{displaced} of 1024 displaced");
        let (a, b) = slot_indexes(8 << 20, 0);
        assert!(a < IO_SLOTS && b < IO_SLOTS && a != b);
    }
}
