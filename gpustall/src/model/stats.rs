//! Measurements per process and for the host, as the kernel counted them (per-CPU maps, summed
//! by the agent) and as the ring records told (reclaim stall distributions).

use std::collections::BTreeMap;

use gpustall_common::counters::{
    IoCounters, IoOp, ProcCounters, HOST_COUNTERS, LATENCY_BUCKETS, LOST_COUNTERS,
};
use hdrhistogram::Histogram;

/// Where an I/O total belongs: device, direction, and whether it was submitted inside reclaim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct IoSlot {
    pub dev: u32,
    pub op: u32,
    pub in_reclaim: bool,
}

/// Memory of a process as /proc last showed it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemSample {
    pub rss_kb: u64,
    pub anon_kb: u64,
    pub file_kb: u64,
    pub shmem_kb: u64,
    pub swap_kb: u64,
    /// VmHWM: the kernel's own peak RSS of the process.
    pub hwm_kb: u64,
    pub majflt: u64,
    /// Proportional memory (PSS of anonymous and shared-memory pages plus proportional swap,
    /// smaps_rollup): a page shared copy-on-write by a trainer and its forked workers counts
    /// once across them. Read for the job's own roles only; absent in older recordings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pss_kb: Option<u64>,
}

impl MemSample {
    /// What its PSS is made of, unshared: anonymous and shared-memory pages resident, and
    /// swapped out. Mapped files' pages (a dataset read through mmap) are left out: they come
    /// and go with the page cache and are not in the PSS the advice counts.
    pub fn pss_base_kb(&self) -> u64 {
        self.anon_kb + self.shmem_kb + self.swap_kb
    }
}

#[derive(Default)]
pub struct ProcStats {
    /// Cumulative kernel totals (replaced at each read, never added).
    pub counters: ProcCounters,
    pub io: BTreeMap<IoSlot, IoCounters>,
    /// Reclaim stall durations in ns, one value per episode received; made at the first one
    /// (40 KB: most processes of a big tree never stall, and a fork burst must stay small).
    pub reclaim_stalls: Option<Box<Histogram<u64>>>,
    pub mem: MemSample,
    /// Largest RSS seen (VmHWM or a sample), in kB, and when it was first seen.
    pub peak_rss_kb: u64,
    pub peak_rss_ns: u64,
    /// The first /proc sample: where growth is measured from.
    pub first_rss_kb: Option<u64>,
    pub first_rss_ns: u64,
    /// Resident plus swapped-out memory (what the process holds, wherever it is): first
    /// sample, peak and when. Under swap, RSS alone shrinks while the demand grows.
    pub first_mem_kb: Option<u64>,
    pub peak_mem_kb: u64,
    pub peak_mem_ns: u64,
    /// Proportional memory (`MemSample::pss_kb`): first sample, peak and when.
    pub first_pss_kb: Option<(u64, u64)>,
    pub peak_pss_kb: Option<(u64, u64)>,
    /// Major faults at the first sample: those since are the trace's (swap-ins among them).
    pub first_majflt: Option<u64>,
    /// Start of the first reclaim stall.
    pub first_reclaim_ns: Option<u64>,
    /// Its memory's growth over the last half minute to a minute (resident plus swapped).
    pub growth: crate::model::limit_clock::Growth,
    /// The process exited and its kernel counters were read after it: these are final, and
    /// its map entries are gone (a late I/O completion may re-create one: it is not news).
    pub final_counters: bool,
}

/// 1 ns .. 1 hour at 2 significant digits (1 % resolution): about 40 KB per process, where 3
/// digits would take about 700 KB, too much for a daemon watching hundreds of processes.
pub fn new_ns_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 2).expect("static histogram bounds are valid")
}

impl ProcStats {
    pub fn record_stall(&mut self, duration_ns: u64) {
        let h = self.reclaim_stalls.get_or_insert_with(|| Box::new(new_ns_histogram()));
        let _ = h.record(duration_ns.max(1));
    }

    pub fn io_bytes(&self, op: IoOp, reclaim: Option<bool>) -> u64 {
        self.io
            .iter()
            .filter(|(k, _)| k.op == op as u32 && reclaim.is_none_or(|r| r == k.in_reclaim))
            .map(|(_, c)| c.bytes)
            .sum()
    }

    /// The resident memory the OOM killer reported for this process when it killed it: the
    /// kernel's own figure at the peak, which the 1 s samples miss when the process grew
    /// between two of them (a worker that grew 175 MiB in 0.2 s read as 0 MiB and the advice
    /// said its workers fit). Swap is the last sample's: the kill report has none.
    pub fn note_kill_rss(&mut self, rss_kb: u64, t_ns: u64) {
        if rss_kb > self.peak_rss_kb {
            self.peak_rss_kb = rss_kb;
            self.peak_rss_ns = t_ns;
        }
        let held = rss_kb + self.mem.swap_kb;
        if held > self.peak_mem_kb {
            self.peak_mem_kb = held;
            self.peak_mem_ns = t_ns;
        }
    }

    pub fn record_mem(&mut self, m: MemSample, t_ns: u64) {
        if self.first_rss_kb.is_none() {
            self.first_rss_kb = Some(m.rss_kb);
            self.first_rss_ns = t_ns;
        }
        let peak = m.hwm_kb.max(m.rss_kb);
        if peak > self.peak_rss_kb {
            self.peak_rss_kb = peak;
            self.peak_rss_ns = t_ns;
        }
        let held = m.rss_kb + m.swap_kb;
        self.growth.add(t_ns, held);
        self.first_mem_kb.get_or_insert(held);
        if held > self.peak_mem_kb {
            self.peak_mem_kb = held;
            self.peak_mem_ns = t_ns;
        }
        self.first_majflt.get_or_insert(m.majflt);
        if let Some(pss) = m.pss_kb {
            self.first_pss_kb.get_or_insert((pss, t_ns));
            if self.peak_pss_kb.is_none_or(|(peak, _)| pss > peak) {
                self.peak_pss_kb = Some((pss, t_ns));
            }
        }
        self.mem = m;
    }
}

/// Sums I/O counters (of several keys: devices, directions, reclaim or not).
pub fn sum_io<'a>(it: impl IntoIterator<Item = &'a IoCounters>) -> IoCounters {
    let mut s = IoCounters::default();
    for c in it {
        s.bytes += c.bytes;
        s.bios += c.bios;
        s.completed += c.completed;
        s.latency_ns_sum += c.latency_ns_sum;
        s.latency_ns_max = s.latency_ns_max.max(c.latency_ns_max);
    }
    s
}

/// Host-level and global figures.
pub struct HostStats {
    pub counters: [u64; HOST_COUNTERS as usize],
    pub lost: [u64; LOST_COUNTERS as usize],
    /// Completed-request latency, log2 buckets of ns, per direction.
    pub io_latency: [[u64; LATENCY_BUCKETS as usize]; 3],
    pub kswapd_episodes: u64,
    pub kswapd_ns: u64,
    /// Records that could not be decoded (a bug or a version mismatch; counted, never hidden).
    pub undecodable: u64,
    /// Lines missing from the recording (see `Sample::RecordingGap`).
    pub recording_gap_lines: u64,
}

impl Default for HostStats {
    fn default() -> Self {
        Self {
            counters: [0; HOST_COUNTERS as usize],
            lost: [0; LOST_COUNTERS as usize],
            io_latency: [[0; LATENCY_BUCKETS as usize]; 3],
            kswapd_episodes: 0,
            kswapd_ns: 0,
            undecodable: 0,
            recording_gap_lines: 0,
        }
    }
}

/// Percentile of a log2 histogram, as the upper bound of the bucket that holds it (the kernel
/// keeps power-of-two buckets: the value is exact to within a factor of two).
pub fn log2_percentile(buckets: &[u64], q: f64) -> Option<u64> {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (i, &n) in buckets.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return Some(1u64 << (i + 1).min(63));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_io_counters() {
        let x = IoCounters { bytes: 1, latency_ns_max: 9, ..Default::default() };
        let y = IoCounters { bytes: 2, latency_ns_max: 4, ..Default::default() };
        let io = sum_io([&x, &y]);
        assert_eq!((io.bytes, io.latency_ns_max), (3, 9));
    }

    #[test]
    fn io_bytes_split_by_direction_and_reclaim() {
        let mut p = ProcStats::default();
        let slot = |op: IoOp, r| IoSlot { dev: 8, op: op as u32, in_reclaim: r };
        p.io.insert(slot(IoOp::Write, false), IoCounters { bytes: 100, ..Default::default() });
        p.io.insert(slot(IoOp::Write, true), IoCounters { bytes: 40, ..Default::default() });
        p.io.insert(slot(IoOp::Read, false), IoCounters { bytes: 7, ..Default::default() });
        assert_eq!(p.io_bytes(IoOp::Write, None), 140);
        assert_eq!(p.io_bytes(IoOp::Write, Some(true)), 40);
        assert_eq!(p.io_bytes(IoOp::Read, None), 7);
    }

    #[test]
    fn peak_rss_keeps_the_largest() {
        let mut p = ProcStats::default();
        p.record_mem(MemSample { rss_kb: 500, hwm_kb: 800, ..Default::default() }, 1);
        p.record_mem(MemSample { rss_kb: 100, hwm_kb: 0, ..Default::default() }, 2);
        assert_eq!((p.peak_rss_kb, p.peak_rss_ns), (800, 1));
        assert_eq!((p.first_rss_kb, p.first_rss_ns), (Some(500), 1));
        p.record_mem(MemSample { rss_kb: 300, swap_kb: 700, ..Default::default() }, 3);
        assert_eq!((p.first_mem_kb, p.peak_mem_kb, p.peak_mem_ns), (Some(500), 1000, 3));
    }

    #[test]
    fn log2_percentiles() {
        let mut b = [0u64; 40];
        b[10] = 90; // ~1-2 us
        b[20] = 10; // ~1-2 ms
        assert_eq!(log2_percentile(&b, 0.5), Some(2048));
        assert_eq!(log2_percentile(&b, 0.99), Some(1 << 21));
        assert_eq!(log2_percentile(&[0; 40], 0.5), None);
    }
}
