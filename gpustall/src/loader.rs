//! The thin layer that touches aya: load the eBPF object with this kernel's field offsets,
//! attach what the kernel has, and read the kernel's counter maps into the model.

use aya::{
    maps::{HashMap, MapData, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::TracePoint,
    Ebpf, EbpfLoader,
};
use gpustall_common::counters::{IoCounters, IoKey, ProcCounters, HOST_COUNTERS, LATENCY_BUCKETS, LOST_COUNTERS};

use crate::{
    observe::{CountersSample, IoRec, ProcCountersRec},
    stats::{sum_counters, sum_io},
    tracefs::Tracefs,
};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("loading the eBPF programs failed: {0} (is BPF enabled in this kernel, and are you root or holding CAP_BPF + CAP_PERFMON?)")]
    Load(#[source] aya::EbpfError),
    #[error("the kernel has no tracepoint {0}, which gpustall needs to follow the process tree")]
    MissingRequired(String),
    #[error("attaching {tracepoint} failed: {source}")]
    Attach { tracepoint: String, #[source] source: aya::programs::ProgramError },
    #[error("eBPF map {name}: {source}")]
    Map { name: &'static str, #[source] source: aya::maps::MapError },
    #[error("eBPF map {0} is missing from the object (a build mismatch: rebuild gpustall)")]
    MissingMap(&'static str),
}

/// Program name in the object, tracepoint category, candidate events (first that exists wins),
/// and whether tracing is meaningless without it.
const PROBES: &[(&str, &str, &[&str], bool)] = &[
    ("task_newtask", "task", &["task_newtask"], true),
    ("sched_process_exit", "sched", &["sched_process_exit"], true),
    ("task_rename", "task", &["task_rename"], false),
    ("sched_process_exec", "sched", &["sched_process_exec"], false),
    ("mark_victim", "oom", &["mark_victim"], false),
    ("signal_generate", "signal", &["signal_generate"], false),
    ("mm_vmscan_direct_reclaim_begin", "vmscan", &["mm_vmscan_direct_reclaim_begin"], false),
    ("mm_vmscan_direct_reclaim_end", "vmscan", &["mm_vmscan_direct_reclaim_end"], false),
    ("mm_vmscan_memcg_reclaim_begin", "vmscan", &["mm_vmscan_memcg_reclaim_begin"], false),
    ("mm_vmscan_memcg_reclaim_end", "vmscan", &["mm_vmscan_memcg_reclaim_end"], false),
    ("mm_vmscan_kswapd_wake", "vmscan", &["mm_vmscan_kswapd_wake"], false),
    ("mm_vmscan_kswapd_sleep", "vmscan", &["mm_vmscan_kswapd_sleep"], false),
    // mm_vmscan_writepage before 5.18.
    ("mm_vmscan_write_folio", "vmscan", &["mm_vmscan_write_folio", "mm_vmscan_writepage"], false),
    ("mm_vmscan_wakeup_kswapd", "vmscan", &["mm_vmscan_wakeup_kswapd"], false),
    ("mm_vmscan_throttled", "vmscan", &["mm_vmscan_throttled"], false),
    ("block_bio_queue", "block", &["block_bio_queue"], false),
    // 6.5+; without them there is no request latency, bytes still come from bio_queue.
    ("block_io_start", "block", &["block_io_start"], false),
    ("block_io_done", "block", &["block_io_done"], false),
];

/// The loaded programs and the maps the agent reads.
pub struct Probes {
    /// Kept alive: dropping it detaches every program.
    pub ebpf: Ebpf,
    pub attached: Vec<String>,
    pub skipped: Vec<String>,
    pub maps: KernelMaps,
    pub critical: RingBuf<MapData>,
    pub bulk: RingBuf<MapData>,
}

pub struct KernelMaps {
    pub tracked: HashMap<MapData, u32, u32>,
    proc_counters: PerCpuHashMap<MapData, u32, ProcCounters>,
    io_counters: PerCpuHashMap<MapData, IoKey, IoCounters>,
    host: PerCpuArray<MapData, u64>,
    lost: PerCpuArray<MapData, u64>,
    io_latency: PerCpuArray<MapData, u64>,
}

fn take<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, LoadError>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf.take_map(name).ok_or(LoadError::MissingMap(name))?;
    T::try_from(map).map_err(|source| LoadError::Map { name, source })
}

pub fn load(tracefs: &Tracefs, task_exit_code: Option<u32>) -> Result<Probes, LoadError> {
    let write_folio = if tracefs.exists("vmscan", "mm_vmscan_write_folio") {
        "mm_vmscan_write_folio"
    } else {
        "mm_vmscan_writepage"
    };
    let mut offsets = tracefs.offsets(write_folio);
    offsets.task_exit_code = task_exit_code.unwrap_or(u32::MAX);

    let mut ebpf = EbpfLoader::new()
        .override_global("OFFSETS", &offsets, true)
        .load(aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gpustall")))
        .map_err(LoadError::Load)?;

    let probes: Vec<(&str, &str, &[&str], bool)> = PROBES.to_vec();
    let mut attached = Vec::new();
    let mut skipped = Vec::new();
    let only = std::env::var("GPUSTALL_ONLY_PROBES").ok();
    for (prog, category, events, required) in probes {
        if only.as_deref().is_some_and(|o| !o.split(',').any(|p| p == prog)) {
            continue;
        }
        let Some(event) = events.iter().find(|e| tracefs.exists(category, e)) else {
            let name = format!("{category}:{}", events[0]);
            if required {
                return Err(LoadError::MissingRequired(name));
            }
            log::warn!("this kernel has no tracepoint {name}: skipping it");
            skipped.push(name);
            continue;
        };
        let name = format!("{category}:{event}");
        let program: &mut TracePoint = ebpf
            .program_mut(prog)
            .ok_or_else(|| LoadError::MissingRequired(format!("program {prog}")))?
            .try_into()
            .map_err(|source| LoadError::Attach { tracepoint: name.clone(), source })?;
        let result = program.load().and_then(|()| program.attach(category, event).map(|_| ()));
        match result {
            Ok(()) => attached.push(name),
            Err(source) if required => return Err(LoadError::Attach { tracepoint: name, source }),
            Err(e) => {
                log::warn!("cannot attach {name}: {e}; going on without it");
                skipped.push(name);
            }
        }
    }
    let maps = KernelMaps {
        tracked: take(&mut ebpf, "TRACKED")?,
        proc_counters: take(&mut ebpf, "PROC_COUNTERS")?,
        io_counters: take(&mut ebpf, "IO_COUNTERS")?,
        host: take(&mut ebpf, "HOST")?,
        lost: take(&mut ebpf, "LOST")?,
        io_latency: take(&mut ebpf, "IO_LATENCY")?,
    };
    let critical = take(&mut ebpf, "CRITICAL")?;
    let bulk = take(&mut ebpf, "BULK")?;
    Ok(Probes { ebpf, attached, skipped, maps, critical, bulk })
}

/// Run count and run time of each attached program (run time needs kernel.bpf_stats_enabled),
/// sorted by name.
pub fn program_stats(ebpf: &Ebpf, attached: &[String]) -> Vec<crate::overhead::ProgramStat> {
    let mut stats: Vec<_> = ebpf
        .programs()
        .filter(|(name, _)| attached.iter().any(|a| a.ends_with(&format!(":{name}")) || a.contains(name)))
        .filter_map(|(name, p)| {
            let info = p.info().ok()?;
            Some(crate::overhead::ProgramStat::new(name, info.run_count(), info.run_time().as_nanos() as u64))
        })
        .collect();
    stats.sort_by(|a, b| a.name.cmp(&b.name));
    stats
}

impl KernelMaps {
    /// Drops a process's kernel counters (the daemon prunes processes long gone).
    pub fn forget(&mut self, pid: u32) {
        let _ = self.tracked.remove(&pid);
        let _ = self.proc_counters.remove(&pid);
        let keys: Vec<IoKey> = self.io_counters.keys().filter_map(Result::ok).filter(|k| k.tgid == pid).collect();
        for k in keys {
            let _ = self.io_counters.remove(&k);
        }
    }

    /// Adds a process to the tree the kernel follows.
    pub fn track(&mut self, pid: u32) -> Result<(), aya::maps::MapError> {
        self.tracked.insert(pid, 1, 0)
    }

    /// Reads the kernel's cumulative counters. A map read that fails is logged and retried at
    /// the next read: never fatal while tracing.
    pub fn read(&self, t_ns: u64, undecodable: u64) -> CountersSample {
        let mut out = CountersSample { t_ns, undecodable: Some(undecodable), ..Default::default() };
        for item in self.proc_counters.iter() {
            match item {
                Ok((pid, per_cpu)) => out.procs.push(ProcCountersRec { pid, counters: sum_counters(per_cpu.iter()) }),
                Err(e) => log::debug!("reading PROC_COUNTERS: {e}"),
            }
        }
        for item in self.io_counters.iter() {
            match item {
                Ok((k, per_cpu)) => {
                    out.io.push(IoRec { pid: k.tgid, dev: k.dev, op: k.op, in_reclaim: k.in_reclaim != 0, counters: sum_io(per_cpu.iter()) });
                }
                Err(e) => log::debug!("reading IO_COUNTERS: {e}"),
            }
        }
        // Map iteration order is the kernel's: sort so that "what changed" compares like with like.
        out.procs.sort_by_key(|p| p.pid);
        out.io.sort_by_key(|r| (r.pid, r.dev, r.op, r.in_reclaim));
        let read_array = |arr: &PerCpuArray<MapData, u64>, n: u32| -> Vec<u64> {
            (0..n).map(|i| arr.get(&i, 0).map(|v| v.iter().sum()).unwrap_or(0)).collect()
        };
        out.host = read_array(&self.host, HOST_COUNTERS);
        out.lost = read_array(&self.lost, LOST_COUNTERS);
        let lat = read_array(&self.io_latency, 3 * LATENCY_BUCKETS);
        out.io_latency = lat.chunks(LATENCY_BUCKETS as usize).map(<[u64]>::to_vec).collect();
        out
    }
}
