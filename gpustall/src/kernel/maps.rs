//! The kernel's maps the agent reads and writes while tracing: the tracked set, the counters,
//! the in-flight requests it sweeps.

use aya::{
    maps::{HashMap, IterableMap as _, MapData, PerCpuArray},
    Ebpf,
};
use gpustall_common::counters::{
    InflightIo, InflightKey, IoCounters, IoKey, ProcCounters, HOST_COUNTERS, INFLIGHT_STALE_NS,
    LATENCY_BUCKETS, LOST_COUNTERS,
};
use gpustall_common::names::maps;

use crate::kernel::batch;
use crate::kernel::loader::LoadError;
use crate::model::samples::CountersSample;
use crate::model::samples::IoRec;
use crate::model::samples::ProcCountersRec;
use crate::model::stats::IoSlot;

pub struct KernelMaps {
    tracked: HashMap<MapData, u32, u32>,
    /// `TRACKED`'s entries per bucket, kept in step with every insert and delete here.
    tracked_hint: crate::kernel::hint::TrackedHint,
    proc_counters: HashMap<MapData, u32, ProcCounters>,
    io_counters: HashMap<MapData, IoKey, IoCounters>,
    host: PerCpuArray<MapData, u64>,
    lost: PerCpuArray<MapData, u64>,
    io_latency: PerCpuArray<MapData, u64>,
    /// Requests in flight (the kernel pairs start and done); read here only to delete the ones
    /// whose done never came (see [`KernelMaps::read`]).
    io_inflight: std::sync::Mutex<HashMap<MapData, InflightKey, InflightIo>>,
    /// When the in-flight map was last searched for stale requests.
    inflight_swept_ns: std::sync::atomic::AtomicU64,
    sched: crate::kernel::offcpu_maps::SchedMaps,
    gpu: crate::kernel::cuda::GpuMaps,
}

/// How often the in-flight map is searched for stale requests.
const INFLIGHT_SWEEP_EVERY_NS: u64 = 10_000_000_000;

/// Takes map `name` out of the object as a `T`.
pub(crate) fn take<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, LoadError>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf.take_map(name).ok_or(LoadError::MissingMap(name))?;
    T::try_from(map).map_err(|source| LoadError::Map { name, source })
}

/// Entries of `IO_INFLIGHT` and `RQ_SLOTS` when the typed request programs are (`true`) or
/// are not expected to run. The hash keeps an eighth of its size beside the slots, for the
/// classic programs should the typed ones fail to attach after all (said among degradations).
/// The classic hash holds 12,032 requests of the job (with the front-merged ones it loses
/// until the agent's minute-old sweep): what fits the 16 MiB bound beside the other maps
/// (`kernel::mapmem`), aya-log's ring at its one page (`kernel::klog`) included.
pub(crate) const fn inflight_entries(typed_pair: bool) -> (u32, u32) {
    const HASH: u32 = 12032;
    if typed_pair {
        (HASH / 8, gpustall_common::rqslot::RQ_SLOTS)
    } else {
        (HASH, 1)
    }
}

impl KernelMaps {
    /// Takes the agent's maps out of the loaded object (the rings are taken apart, for the
    /// event loop).
    pub fn take(ebpf: &mut Ebpf) -> Result<Self, LoadError> {
        let tracked_hint = tracked_hint(ebpf)?;
        Ok(Self {
            tracked: take(ebpf, maps::TRACKED)?,
            tracked_hint,
            proc_counters: take(ebpf, maps::PROC_COUNTERS)?,
            io_counters: take(ebpf, maps::IO_COUNTERS)?,
            host: take(ebpf, maps::HOST)?,
            lost: take(ebpf, maps::LOST)?,
            io_latency: take(ebpf, maps::IO_LATENCY)?,
            io_inflight: std::sync::Mutex::new(take(ebpf, maps::IO_INFLIGHT)?),
            inflight_swept_ns: std::sync::atomic::AtomicU64::new(0),
            sched: crate::kernel::offcpu_maps::SchedMaps::take(ebpf)?,
            gpu: crate::kernel::cuda::GpuMaps::take(ebpf)?,
        })
    }

    /// Drops a process's kernel counters (the daemon prunes processes long gone).
    /// Deletes a process's entries: the tracked flag, its counters, and the I/O keys the model
    /// saw for it (`io_slots`: device, op, in_reclaim). One delete per key, not a scan of the
    /// whole I/O map per process (which made pruning thousands of processes take minutes).
    pub fn forget(&mut self, pid: u32, io_slots: impl IntoIterator<Item = IoSlot>) {
        if self.tracked.remove(&pid).is_ok() {
            self.tracked_hint.sub(pid);
        }
        let _ = self.proc_counters.remove(&pid);
        self.sched.forget(pid);
        self.gpu.forget(pid);
        for IoSlot { dev, op, in_reclaim } in io_slots {
            let key = IoKey { pid, dev, op, in_reclaim: u32::from(in_reclaim) };
            let _ = self.io_counters.remove(&key);
        }
    }

    /// Raises the live processes of the job's own roles to off-CPU accounting.
    pub fn account_offcpu(&mut self, tree: &crate::model::proctree::ProcessTree) {
        self.sched.account(&mut self.tracked, &crate::kernel::offcpu_maps::wanted(tree));
        self.sched.set_feeders(crate::kernel::offcpu_maps::feeders(tree));
    }

    /// Adds a process to the tree the kernel follows.
    /// Counted in the hint first (`gpustall_common::hint`'s rule), taken back if the insert
    /// added no key: an entry an earlier process of the pid left is reset to level 1.
    pub fn track(&mut self, pid: u32) -> Result<(), aya::maps::MapError> {
        const BPF_NOEXIST: u64 = 1;
        self.tracked_hint.add(pid);
        if self.tracked.insert(pid, 1, BPF_NOEXIST).is_ok() {
            return Ok(());
        }
        self.tracked_hint.sub(pid);
        // The level is 1 again: not what `account_offcpu` last raised this pid to.
        self.sched.unaccount(pid);
        self.tracked.insert(pid, 1, 0)
    }

    /// Reads the kernel's cumulative counters. A map read that fails is logged and retried at
    /// the next read: never fatal while tracing. Each map is read in batches where the kernel
    /// can ([`batch`]), else entry by entry.
    pub fn read(&self, t_ns: u64, undecodable: u64) -> CountersSample {
        let mut out = CountersSample { t_ns, undecodable: Some(undecodable), ..Default::default() };
        out.procs = batch::entries(self.proc_counters.map())
            .unwrap_or_else(|| iterate(&self.proc_counters, maps::PROC_COUNTERS))
            .into_iter()
            .map(|(pid, counters)| ProcCountersRec { pid, counters })
            .collect();
        out.io = batch::entries(self.io_counters.map())
            .unwrap_or_else(|| iterate(&self.io_counters, maps::IO_COUNTERS))
            .into_iter()
            .map(|(k, counters): (IoKey, IoCounters)| IoRec {
                pid: k.pid,
                dev: k.dev,
                op: k.op,
                in_reclaim: k.in_reclaim != 0,
                counters,
            })
            .collect();
        // Map iteration order is the kernel's: sort so that "what changed" compares like with like.
        out.procs.sort_by_key(|p| p.pid);
        out.io.sort_by_key(|r| (r.pid, r.dev, r.op, r.in_reclaim));
        self.sched.read(&mut out);
        self.gpu.read(&mut out);
        out.host = read_array(&self.host, HOST_COUNTERS);
        out.lost = read_array(&self.lost, LOST_COUNTERS);
        let lat = read_array(&self.io_latency, 3 * LATENCY_BUCKETS);
        out.io_latency = lat.chunks(LATENCY_BUCKETS as usize).map(<[u64]>::to_vec).collect();
        self.drop_stale_inflight(t_ns);
        out
    }

    /// Deletes requests whose completion never came, so the in-flight map never fills. The
    /// map holds every request in flight on the host (thousands under swap): it is read at
    /// most every [`INFLIGHT_SWEEP_EVERY_NS`], a small delay next to the minute it takes to
    /// call a request stale.
    fn drop_stale_inflight(&self, now_ns: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        if now_ns.saturating_sub(self.inflight_swept_ns.load(Relaxed)) < INFLIGHT_SWEEP_EVERY_NS {
            return;
        }
        self.inflight_swept_ns.store(now_ns, Relaxed);
        let Ok(mut map) = self.io_inflight.lock() else { return };
        let all = batch::entries(map.map()).unwrap_or_else(|| iterate(&map, maps::IO_INFLIGHT));
        let stale = all
            .into_iter()
            .filter(|(_, io): &(InflightKey, InflightIo)| {
                now_ns.saturating_sub(io.start_ns) > INFLIGHT_STALE_NS
            })
            .map(|(k, _)| k);
        for k in stale {
            let _ = map.remove(&k);
        }
    }
}

/// `TRACKED_HINT` mapped into the agent's memory (the map itself stays in the object).
fn tracked_hint(ebpf: &Ebpf) -> Result<crate::kernel::hint::TrackedHint, LoadError> {
    let hint_map = ebpf.map(maps::TRACKED_HINT).ok_or(LoadError::MissingMap(maps::TRACKED_HINT))?;
    match hint_map {
        aya::maps::Map::Array(data) => crate::kernel::hint::TrackedHint::map(data),
        _ => Err(std::io::ErrorKind::InvalidInput.into()),
    }
    .map_err(|e| LoadError::Mmap(maps::TRACKED_HINT, e))
}

/// Every entry of a map, one lookup per key (kernels without batch lookups).
pub(crate) fn iterate<K: aya::Pod, V: aya::Pod>(
    map: &HashMap<MapData, K, V>,
    name: &str,
) -> Vec<(K, V)> {
    map.iter()
        .filter_map(|item| item.map_err(|e| log::debug!("reading {name}: {e}")).ok())
        .collect()
}

/// A per-CPU counter array summed over CPUs, `n` indices.
fn read_array(arr: &PerCpuArray<MapData, u64>, n: u32) -> Vec<u64> {
    batch::per_cpu_sums(arr.map(), n).unwrap_or_else(|| {
        (0..n).map(|i| arr.get(&i, 0).map(|v| v.iter().sum()).unwrap_or(0)).collect()
    })
}
