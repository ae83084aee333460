//! Counters aggregated in the kernel (per-CPU maps the agent reads periodically). High-rate
//! events (one hit per swapped folio, one per block request) are summed here instead of sending
//! a ring record each.

/// Per tracked process (key: pid), in a per-CPU hash map.
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
    /// Reclaim episodes of either kind (direct: the host's memory; memcg: its cgroup's limit).
    pub fn reclaim_count(&self) -> u64 {
        self.direct_reclaim_count + self.memcg_reclaim_count
    }

    /// Time stalled in reclaim of either kind.
    pub fn reclaim_ns(&self) -> u64 {
        self.direct_reclaim_ns + self.memcg_reclaim_ns
    }

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
    pub pid: u32,
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
#[derive(Clone, Copy, Debug, Default)]
pub struct InflightIo {
    pub start_ns: u64,
    pub key: IoKey,
}
const _: () = assert!(core::mem::size_of::<InflightIo>() == 24);

/// A request in flight this long lost its completion (no block device takes a minute without
/// the kernel's own timeout ending the request).
pub const INFLIGHT_STALE_NS: u64 = 60_000_000_000;

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
