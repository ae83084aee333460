//! The thin layer that touches aya: load the eBPF object with this kernel's field offsets,
//! attach what the kernel has, and read the kernel's counter maps into the model.

use aya::{
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
    programs::TracePoint,
    Ebpf, EbpfLoader,
};
use gpustall_common::counters::{
    InflightIo, InflightKey, IoCounters, IoKey, ProcCounters, HOST_COUNTERS, LATENCY_BUCKETS,
    LOST_COUNTERS,
};
use gpustall_common::names::{self, maps, programs};
use gpustall_common::offsets::{TracepointOffsets, MISSING};

use crate::kernel::tracefs::Tracefs;
use crate::model::samples::CountersSample;
use crate::model::samples::IoRec;
use crate::model::samples::ProcCountersRec;
use crate::model::stats::IoSlot;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("loading the eBPF programs failed: {0} (is BPF enabled in this kernel, and are you root or holding CAP_BPF + CAP_PERFMON?)")]
    Load(#[source] aya::EbpfError),
    #[error("the kernel has no tracepoint {0}, which gpustall needs to follow the process tree")]
    MissingRequired(String),
    #[error("attaching {tracepoint} failed: {source}")]
    Attach {
        tracepoint: String,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("eBPF map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("eBPF map {0} is missing from the object (a build mismatch: rebuild gpustall)")]
    MissingMap(&'static str),
}

/// One program and where it attaches.
#[derive(Clone, Copy, Debug)]
struct Probe {
    /// Its name in the object.
    program: &'static str,
    /// Tracepoint category (tracefs events/ subdirectory).
    category: &'static str,
    /// Candidate events, newest name first: the first the kernel has wins.
    events: &'static [&'static str],
    /// Tracing is meaningless without it: its absence is an error, not a warning.
    required: bool,
}

const fn probe(
    program: &'static str,
    category: &'static str,
    events: &'static [&'static str],
    required: bool,
) -> Probe {
    Probe { program, category, events, required }
}

const PROBES: &[Probe] = &[
    probe(programs::TASK_NEWTASK, "task", &["task_newtask"], true),
    probe(programs::SCHED_PROCESS_EXIT, "sched", &["sched_process_exit"], true),
    probe(programs::TASK_RENAME, "task", &["task_rename"], false),
    probe(programs::SCHED_PROCESS_EXEC, "sched", &["sched_process_exec"], false),
    probe(programs::MARK_VICTIM, "oom", &["mark_victim"], false),
    probe(programs::SIGNAL_GENERATE, "signal", &["signal_generate"], false),
    // Ends attach before their begins (the table is the attach order): a begin seen without
    // its end program would leave the thread "in reclaim" until its next begin.
    probe(programs::DIRECT_RECLAIM_END, "vmscan", &["mm_vmscan_direct_reclaim_end"], false),
    probe(programs::MEMCG_RECLAIM_END, "vmscan", &["mm_vmscan_memcg_reclaim_end"], false),
    probe(programs::KSWAPD_SLEEP, "vmscan", &["mm_vmscan_kswapd_sleep"], false),
    probe(programs::DIRECT_RECLAIM_BEGIN, "vmscan", &["mm_vmscan_direct_reclaim_begin"], false),
    probe(programs::MEMCG_RECLAIM_BEGIN, "vmscan", &["mm_vmscan_memcg_reclaim_begin"], false),
    probe(programs::KSWAPD_WAKE, "vmscan", &["mm_vmscan_kswapd_wake"], false),
    // mm_vmscan_writepage before 5.18.
    probe(
        programs::WRITE_FOLIO,
        "vmscan",
        &["mm_vmscan_write_folio", "mm_vmscan_writepage"],
        false,
    ),
    probe(programs::WAKEUP_KSWAPD, "vmscan", &["mm_vmscan_wakeup_kswapd"], false),
    probe(programs::THROTTLED, "vmscan", &["mm_vmscan_throttled"], false),
    probe(programs::BLOCK_BIO_QUEUE, "block", &["block_bio_queue"], false),
    // 6.5+. Before, block_bio_queue starts the latency (`bio_starts_io`) and block_rq_complete
    // ends it: block_io_start's absence is then no loss.
    probe(programs::BLOCK_IO_START, "block", &["block_io_start"], false),
    probe(programs::BLOCK_IO_DONE, "block", &["block_io_done", "block_rq_complete"], false),
    // Off-CPU accounting (kernel::offcpu): wakeups before switches, so that a switch-in is
    // never seen without the wakeup that preceded it.
    probe(programs::SCHED_WAKING, "sched", &["sched_waking"], false),
    probe(programs::SCHED_SWITCH, "sched", &["sched_switch"], false),
    // A wakeup inside an hrtimer callback is a timeout's, not the interrupted task's doing:
    // the exit attaches first, so a CPU is never left marked "in a timer".
    probe(programs::HRTIMER_EXPIRE_EXIT, "timer", &["hrtimer_expire_exit"], false),
    probe(programs::HRTIMER_EXPIRE_ENTRY, "timer", &["hrtimer_expire_entry"], false),
];

/// The first of `events` this kernel has (the probe table's choice), or the newest name.
fn chosen<'a>(tracefs: &Tracefs, category: &str, events: &[&'a str]) -> &'a str {
    events.iter().copied().find(|e| tracefs.exists(category, e)).unwrap_or(events[0])
}

/// What this kernel makes gpustall measure from its next-best source, in words (printed as
/// notes at start-up; the end-to-end tests report them per kernel).
fn degradations(tracefs: &Tracefs, offsets: &TracepointOffsets) -> Vec<String> {
    let mut notes = Vec::new();
    if offsets.exit_group_dead == MISSING {
        notes.push(
            "sched_process_exit has no group_dead on this kernel: a process is taken to end when its main thread exits"
                .to_string(),
        );
    }
    if offsets.bio_starts_io == 1 && tracefs.exists("block", "block_rq_complete") {
        notes.push(
            "no block_io_start/done (before 6.5): I/O latency is measured from block_bio_queue to block_rq_complete"
                .to_string(),
        );
    }
    notes
}

/// The loaded programs and the maps the agent reads.
pub struct Probes {
    /// Kept alive: dropping it detaches every program.
    pub ebpf: Ebpf,
    pub attached: Vec<String>,
    pub skipped: Vec<String>,
    /// What this kernel lacks that gpustall measures another way (see [`degradations`]).
    pub degraded: Vec<String>,
    pub maps: KernelMaps,
    /// The two rings, until the event loop takes them ([`Probes::take_rings`]).
    rings: Option<(RingBuf<MapData>, RingBuf<MapData>)>,
}

impl Probes {
    /// The critical and the bulk ring, for the event loop (once).
    pub fn take_rings(&mut self) -> anyhow::Result<(RingBuf<MapData>, RingBuf<MapData>)> {
        self.rings.take().ok_or_else(|| anyhow::anyhow!("the rings were already taken"))
    }
}

/// Loads with this kernel's layouts and attaches; one warning per tracepoint the kernel lacks.
pub fn load_and_warn() -> anyhow::Result<Probes> {
    let tracefs = Tracefs::open()?;
    let probes = load(&tracefs, crate::kernel::btf::task_exit_code_offset())?;
    for s in &probes.skipped {
        say!("gpustall: warning: tracepoint {s} is not available on this kernel; its data is missing");
    }
    for d in &probes.degraded {
        say!("gpustall: note: {d}");
    }
    Ok(probes)
}

pub struct KernelMaps {
    pub tracked: HashMap<MapData, u32, u32>,
    proc_counters: HashMap<MapData, u32, ProcCounters>,
    io_counters: HashMap<MapData, IoKey, IoCounters>,
    host: PerCpuArray<MapData, u64>,
    lost: PerCpuArray<MapData, u64>,
    io_latency: PerCpuArray<MapData, u64>,
    /// Requests in flight (the kernel pairs start and done); read here only to delete the ones
    /// whose done never came (see [`KernelMaps::read`]).
    io_inflight: std::sync::Mutex<HashMap<MapData, InflightKey, InflightIo>>,
    sched: crate::kernel::offcpu::SchedMaps,
}

/// A request in flight this long lost its completion (no block device takes a minute without
/// the kernel's own timeout ending the request): its kernel entry is deleted.
const INFLIGHT_STALE_NS: u64 = 60_000_000_000;

fn take<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, LoadError>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf.take_map(name).ok_or(LoadError::MissingMap(name))?;
    T::try_from(map).map_err(|source| LoadError::Map { name, source })
}

pub fn load(tracefs: &Tracefs, task_exit_code: Option<u32>) -> Result<Probes, LoadError> {
    let event_of = |program: &str| {
        let p = PROBES.iter().find(|p| p.program == program).expect("in the probe table");
        chosen(tracefs, p.category, p.events)
    };
    let mut offsets =
        tracefs.offsets(event_of(programs::WRITE_FOLIO), event_of(programs::BLOCK_IO_DONE));
    offsets.task_exit_code = task_exit_code.unwrap_or(u32::MAX);
    let degraded = degradations(tracefs, &offsets);

    let mut loader = EbpfLoader::new();
    loader.override_global(names::OFFSETS, &offsets, true);
    let sched_offsets = crate::kernel::offcpu::sched_offsets(tracefs);
    loader.override_global(names::SCHED_OFFSETS, &sched_offsets, true);
    // Tests make the per-process I/O map small to reach "map full" with a few processes, the
    // same kernel path a host with more processes than entries takes.
    if let Some(n) = std::env::var("GPUSTALL_TEST_IO_MAP_ENTRIES").ok().and_then(|v| v.parse().ok())
    {
        loader.map_max_entries(maps::IO_COUNTERS, n);
    }
    let mut ebpf = loader
        .load(aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gpustall")))
        .map_err(LoadError::Load)?;

    let mut attached = Vec::new();
    let mut skipped = Vec::new();
    let only = std::env::var("GPUSTALL_ONLY_PROBES").ok();
    for &Probe { program: prog, category, events, required } in PROBES {
        if only.as_deref().is_some_and(|o| !o.split(',').any(|p| p == prog)) {
            continue;
        }
        let Some(event) = events.iter().find(|e| tracefs.exists(category, e)) else {
            let name = format!("{category}:{}", events[0]);
            if required {
                return Err(LoadError::MissingRequired(name));
            }
            if prog == programs::BLOCK_IO_START && offsets.bio_starts_io == 1 {
                log::debug!("no {name}: block_bio_queue starts the I/O latency instead");
                continue;
            }
            log::debug!("this kernel has no tracepoint {name}: skipping it");
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
        tracked: take(&mut ebpf, maps::TRACKED)?,
        proc_counters: take(&mut ebpf, maps::PROC_COUNTERS)?,
        io_counters: take(&mut ebpf, maps::IO_COUNTERS)?,
        host: take(&mut ebpf, maps::HOST)?,
        lost: take(&mut ebpf, maps::LOST)?,
        io_latency: take(&mut ebpf, maps::IO_LATENCY)?,
        io_inflight: std::sync::Mutex::new(take(&mut ebpf, maps::IO_INFLIGHT)?),
        sched: crate::kernel::offcpu::SchedMaps::take(&mut ebpf)?,
    };
    let critical = take(&mut ebpf, maps::CRITICAL)?;
    let bulk = take(&mut ebpf, maps::BULK)?;
    Ok(Probes { ebpf, attached, skipped, degraded, maps, rings: Some((critical, bulk)) })
}

/// Run count and run time of each attached program (run time needs kernel.bpf_stats_enabled),
/// sorted by name.
pub fn program_stats(ebpf: &Ebpf, attached: &[String]) -> Vec<crate::model::overhead::ProgramStat> {
    let mut stats: Vec<_> = ebpf
        .programs()
        .filter(|(name, _)| {
            attached.iter().any(|a| a.ends_with(&format!(":{name}")) || a.contains(name))
        })
        .filter_map(|(name, p)| {
            let info = p.info().ok()?;
            Some(crate::model::overhead::ProgramStat::new(
                name,
                info.run_count(),
                info.run_time().as_nanos() as u64,
            ))
        })
        .collect();
    stats.sort_by(|a, b| a.name.cmp(&b.name));
    stats
}

impl KernelMaps {
    /// Drops a process's kernel counters (the daemon prunes processes long gone).
    /// Deletes a process's entries: the tracked flag, its counters, and the I/O keys the model
    /// saw for it (`io_slots`: device, op, in_reclaim). One delete per key, not a scan of the
    /// whole I/O map per process (which made pruning thousands of processes take minutes).
    pub fn forget(&mut self, pid: u32, io_slots: impl IntoIterator<Item = IoSlot>) {
        let _ = self.tracked.remove(&pid);
        let _ = self.proc_counters.remove(&pid);
        self.sched.forget(pid);
        for IoSlot { dev, op, in_reclaim } in io_slots {
            let key = IoKey { tgid: pid, dev, op, in_reclaim: u32::from(in_reclaim) };
            let _ = self.io_counters.remove(&key);
        }
    }

    /// Raises the live processes of the job's own roles to off-CPU accounting.
    pub fn account_offcpu(&mut self, tree: &crate::model::proctree::ProcessTree) {
        self.sched.account(&mut self.tracked, &crate::kernel::offcpu::wanted(tree));
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
                Ok((pid, counters)) => out.procs.push(ProcCountersRec { pid, counters }),
                Err(e) => log::debug!("reading PROC_COUNTERS: {e}"),
            }
        }
        for item in self.io_counters.iter() {
            match item {
                Ok((k, counters)) => out.io.push(IoRec {
                    pid: k.tgid,
                    dev: k.dev,
                    op: k.op,
                    in_reclaim: k.in_reclaim != 0,
                    counters,
                }),
                Err(e) => log::debug!("reading IO_COUNTERS: {e}"),
            }
        }
        // Map iteration order is the kernel's: sort so that "what changed" compares like with like.
        out.procs.sort_by_key(|p| p.pid);
        out.io.sort_by_key(|r| (r.pid, r.dev, r.op, r.in_reclaim));
        self.sched.read(&mut out);
        let read_array = |arr: &PerCpuArray<MapData, u64>, n: u32| -> Vec<u64> {
            (0..n).map(|i| arr.get(&i, 0).map(|v| v.iter().sum()).unwrap_or(0)).collect()
        };
        out.host = read_array(&self.host, HOST_COUNTERS);
        out.lost = read_array(&self.lost, LOST_COUNTERS);
        let lat = read_array(&self.io_latency, 3 * LATENCY_BUCKETS);
        out.io_latency = lat.chunks(LATENCY_BUCKETS as usize).map(<[u64]>::to_vec).collect();
        self.drop_stale_inflight(t_ns);
        out
    }

    /// Deletes requests whose completion never came, so the in-flight map never fills.
    fn drop_stale_inflight(&self, now_ns: u64) {
        let Ok(mut map) = self.io_inflight.lock() else { return };
        let stale: Vec<InflightKey> = map
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, io)| now_ns.saturating_sub(io.start_ns) > INFLIGHT_STALE_NS)
            .map(|(k, _)| k)
            .collect();
        for k in stale {
            let _ = map.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use gpustall_common::names::maps;

    use super::PROBES;

    /// The object the agent embeds, parsed without the kernel.
    fn object() -> aya_obj::Object {
        let bytes = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gpustall"));
        aya_obj::Object::parse(bytes).expect("the built eBPF object parses")
    }

    #[test]
    fn every_shared_name_is_in_the_built_object() {
        let obj = object();
        let map_names = [
            maps::TRACKED,
            maps::CRITICAL,
            maps::BULK,
            maps::LOST,
            maps::PROC_COUNTERS,
            maps::HOST,
            maps::IO_COUNTERS,
            maps::IO_LATENCY,
            maps::IO_INFLIGHT,
            maps::OFFCPU_THREADS,
            maps::OFFCPU,
            maps::WAKES,
        ];
        for m in map_names {
            assert!(
                obj.maps.contains_key(m),
                "map {m} is not in the object: {:?}",
                obj.maps.keys()
            );
        }
        for p in PROBES {
            assert!(
                obj.programs.contains_key(p.program),
                "program {} is not in the object",
                p.program
            );
        }
        // Every program of the object is attached by the table (none forgotten).
        assert_eq!(obj.programs.len(), PROBES.len(), "{:?}", obj.programs.keys());
    }
}
