//! The thin layer that touches aya: load the eBPF object with this kernel's field offsets,
//! attach what the kernel has, and read the kernel's counter maps into the model.

use aya::{
    maps::{HashMap, IterableMap as _, MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, RawTracePoint, TracePoint},
    Ebpf, EbpfLoader,
};
use gpustall_common::blocklayout::BlockLayout;
use gpustall_common::counters::{
    InflightIo, InflightKey, IoCounters, IoKey, ProcCounters, HOST_COUNTERS, INFLIGHT_STALE_NS,
    LATENCY_BUCKETS, LOST_COUNTERS,
};
use gpustall_common::folio::FolioLayout;
use gpustall_common::names::{self, maps, programs};
use gpustall_common::offsets::{TracepointOffsets, MISSING};
use gpustall_common::sched::StackLayout;
use gpustall_common::task::{TaskOffsets, UNKNOWN as TASK_UNKNOWN};

use crate::kernel::batch;
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
    #[error("mapping eBPF map {0} into memory failed: {1} (BPF_F_MMAPABLE arrays need Linux 5.5)")]
    Mmap(&'static str, #[source] std::io::Error),
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
    /// A typed program on the same event, attached instead of `program` where it can run.
    typed: Option<Typed>,
}

const fn probe(
    program: &'static str,
    category: &'static str,
    events: &'static [&'static str],
    required: bool,
) -> Probe {
    Probe { program, category, events, required, typed: None }
}

impl Probe {
    /// The same probe with a typed program preferred to its classic one.
    const fn or_typed(self, typed: Typed) -> Probe {
        Probe { typed: Some(typed), ..self }
    }
}

/// A BTF-typed (`tp_btf`) or raw tracepoint program on a probe's event. The kernel hands it
/// the tracepoint's own arguments (pointers to its structs, read at offsets from BTF) instead
/// of the classic record, which it does not build: the program sees more (`task->tgid` of a
/// signal's target thread) and costs less. It is attached instead of the probe's classic
/// program when this kernel's BTF declares the event with the arguments it reads and gives the
/// offsets it needs ([`typed_ready`]); otherwise the classic program runs and `fallback` is said
/// among the degradations, with the reason.
#[derive(Clone, Copy, Debug)]
struct Typed {
    /// Its name in the object.
    program: &'static str,
    kind: TypedKind,
    /// The event's leading arguments the program reads, as BTF spells their types
    /// (`btf_trace_<event>`, less `void *__data`): another prototype means another meaning.
    args: &'static [&'static str],
    /// What it needs from [`Layouts`] that this kernel's BTF did not give, if anything.
    blocker: fn(&Layouts) -> Option<&'static str>,
    /// What the classic program cannot see, said when it runs instead; `None` where it sees
    /// the same and only costs more (the typed program is there to be cheaper).
    fallback: Option<&'static str>,
    /// Where it keeps state its partner reads: attached only if that typed program (attached
    /// earlier in the table) was, and only on these events (empty: any).
    pairs: Pairing,
}

/// A typed program that shares state with another: the typed request start and done keep the
/// request in `RQ_SLOTS` (by its address), the classic ones in `IO_INFLIGHT` (by dev and
/// sector), so the two kinds do not pair with each other.
#[derive(Clone, Copy, Debug)]
struct Pairing {
    requires: Option<&'static str>,
    events: &'static [&'static str],
}

const UNPAIRED: Pairing = Pairing { requires: None, events: &[] };

/// How a typed program attaches. Both run from the tracepoint itself (bpf_trace_run), with the
/// same arguments; `tp_btf` needs the kernel's BTF and has the verifier check the arguments'
/// types, `raw_tp` attaches by name alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(dead_code, reason = "both kinds are offered to the probe table; not every kind is in use")]
enum TypedKind {
    Btf,
    Raw,
}

/// What this kernel's BTF says about its structs: written into the programs' globals before
/// load, and what decides whether a typed program can run.
#[derive(Clone, Copy, Debug)]
pub struct Layouts {
    pub task: TaskOffsets,
    /// Where a folio's flags and order are, or what BTF lacks for it (kernel::folio).
    pub folio: Result<FolioLayout, &'static str>,
    pub block: BlockLayout,
    /// Where `struct pt_regs` keeps the syscall number (kernel::offcpu::syscall_nr_offset).
    pub syscall_nr: u32,
    /// How the typed sched_waking tells interrupt context (kernel::offcpu::stack_layout).
    pub stack: StackLayout,
}

impl Layouts {
    /// Nothing known (no BTF): every typed program falls back.
    pub const fn unknown() -> Self {
        Self {
            task: TaskOffsets::unknown(),
            folio: Err("the folio's layout"),
            block: BlockLayout::unknown(),
            syscall_nr: TASK_UNKNOWN,
            stack: StackLayout::unknown(),
        }
    }

    pub fn from_btf(btf: &btf_rs::Btf) -> Self {
        let syscall_nr = crate::kernel::offcpu::syscall_nr_offset(btf);
        Self {
            task: crate::kernel::btf::task_offsets(btf),
            folio: crate::kernel::folio::from_btf(btf),
            block: crate::kernel::btf::block_layout(btf),
            syscall_nr: syscall_nr.unwrap_or(TASK_UNKNOWN),
            stack: crate::kernel::offcpu::stack_layout(btf, syscall_nr),
        }
    }
}

/// Whether `typed` can run on this kernel (`Ok`), or why the classic program runs instead.
/// `args` is the event's prototype from BTF: `Err` when BTF is unreadable, `Ok(None)` when it
/// has no such tracepoint.
fn typed_ready(
    typed: &Typed,
    args: Result<Option<Vec<String>>, &str>,
    layouts: &Layouts,
) -> Result<(), String> {
    let args = match args {
        Err(why) => return Err(why.to_string()),
        Ok(None) => return Err("the kernel's BTF has no typed tracepoint for it".to_string()),
        Ok(Some(a)) => a,
    };
    if !crate::kernel::btf::prototype_matches(&args, typed.args) {
        return Err(format!(
            "its arguments are ({}) on this kernel, not ({}, ..)",
            args.join(", "),
            typed.args.join(", ")
        ));
    }
    match (typed.blocker)(layouts) {
        Some(missing) => Err(format!("BTF does not give {missing}")),
        None => Ok(()),
    }
}

/// Whether a typed program's pairing allows it here (see [`Pairing`]).
fn paired(pairs: &Pairing, event: &str, attached: &[&str]) -> Result<(), String> {
    if !pairs.events.is_empty() && !pairs.events.contains(&event) {
        return Err(format!("its partner has no typed program on {event}"));
    }
    match pairs.requires {
        Some(partner) if !attached.contains(&partner) => {
            Err(format!("its partner {partner} runs classic"))
        }
        _ => Ok(()),
    }
}

/// Whether `prog` is an hrtimer program the typed sched_waking (attached earlier in the table)
/// does without: it tells a wakeup in interrupt context itself (`StackLayout`).
fn timers_unneeded(prog: &str, layouts: &Layouts, attached: &[&str]) -> bool {
    [programs::HRTIMER_EXPIRE_ENTRY, programs::HRTIMER_EXPIRE_EXIT].contains(&prog)
        && layouts.stack.knows()
        && attached.contains(&programs::SCHED_WAKING_BTF)
}

/// A reclaim end's typed twin: `nr_reclaimed` is its argument (no field copied out).
const fn reclaim_end(program: &'static str) -> Typed {
    Typed {
        program,
        kind: TypedKind::Btf,
        args: &["long unsigned int"],
        blocker: |_| None,
        fallback: None,
        pairs: UNPAIRED,
    }
}

const PROBES: &[Probe] = &[
    probe(programs::TASK_NEWTASK, "task", &["task_newtask"], true),
    probe(programs::SCHED_PROCESS_EXIT, "sched", &["sched_process_exit"], true),
    probe(programs::TASK_RENAME, "task", &["task_rename"], false),
    probe(programs::SCHED_PROCESS_EXEC, "sched", &["sched_process_exec"], false),
    probe(programs::MARK_VICTIM, "oom", &["mark_victim"], false),
    probe(programs::SIGNAL_GENERATE, "signal", &["signal_generate"], false).or_typed(Typed {
        program: programs::SIGNAL_GENERATE_RAW,
        kind: TypedKind::Raw,
        // (int sig, struct kernel_siginfo *info, struct task_struct *task, int group, int result)
        args: &["int", "struct kernel_siginfo *", "struct task_struct *", "int", "int"],
        blocker: |l| (!l.task.knows_signal_target()).then_some("task_struct.tgid/pid/comm"),
        fallback: Some("a fatal signal aimed at a thread other than a process's main thread (tgkill, abort() in a thread) is not seen, nor an OOM kill of such a thread"),
        pairs: UNPAIRED,
    }),
    // Ends attach before their begins (the table is the attach order): a begin seen without
    // its end program would leave the thread "in reclaim" until its next begin.
    probe(programs::DIRECT_RECLAIM_END, "vmscan", &["mm_vmscan_direct_reclaim_end"], false)
        .or_typed(reclaim_end(programs::DIRECT_RECLAIM_END_BTF)),
    probe(programs::MEMCG_RECLAIM_END, "vmscan", &["mm_vmscan_memcg_reclaim_end"], false)
        .or_typed(reclaim_end(programs::MEMCG_RECLAIM_END_BTF)),
    probe(programs::KSWAPD_SLEEP, "vmscan", &["mm_vmscan_kswapd_sleep"], false),
    probe(programs::DIRECT_RECLAIM_BEGIN, "vmscan", &["mm_vmscan_direct_reclaim_begin"], false),
    probe(programs::MEMCG_RECLAIM_BEGIN, "vmscan", &["mm_vmscan_memcg_reclaim_begin"], false),
    probe(programs::KSWAPD_WAKE, "vmscan", &["mm_vmscan_kswapd_wake"], false),
    // mm_vmscan_writepage before 5.18. Typed, it reads the folio's order: pages, not folios.
    probe(
        programs::WRITE_FOLIO,
        "vmscan",
        &["mm_vmscan_write_folio", "mm_vmscan_writepage"],
        false,
    )
    .or_typed(Typed {
        program: programs::WRITE_FOLIO_BTF,
        kind: TypedKind::Btf,
        // `struct folio *`, or `struct page *` for writepage: checked with the layout
        // (kernel::folio::from_btf), since the table takes one prototype.
        args: &[],
        blocker: |l| l.folio.err(),
        fallback: Some(
            "swap-out counted per folio: a THP or mTHP swapped whole counts one page, not its 512 or 16",
        ),
        pairs: UNPAIRED,
    }),
    probe(programs::WAKEUP_KSWAPD, "vmscan", &["mm_vmscan_wakeup_kswapd"], false),
    probe(programs::THROTTLED, "vmscan", &["mm_vmscan_throttled"], false),
    // Stacked devices (dm, md, NVMe multipath) announce each clone here before queueing it on
    // the device below: attached before block_bio_queue, so that no clone is queued unseen
    // (it would count twice).
    probe(programs::BLOCK_BIO_REMAP, "block", &["block_bio_remap"], false),
    // The block and scheduler programs run per bio, request and context switch: their typed
    // twins read the kernel's structs with plain loads instead of copying fields out of a
    // record the kernel built first (see `gpustall_common::blocklayout`). Same data.
    probe(programs::BLOCK_BIO_QUEUE, "block", &["block_bio_queue"], false).or_typed(Typed {
        program: programs::BLOCK_BIO_QUEUE_BTF,
        kind: TypedKind::Btf,
        args: &["struct bio *"],
        blocker: |l| (!l.block.knows_bio()).then_some("bio.bi_bdev/bi_iter, gendisk.major"),
        fallback: None,
        pairs: UNPAIRED,
    }),
    // 6.5+. Before, block_bio_queue starts the latency (`bio_starts_io`) and block_rq_complete
    // ends it: block_io_start's absence is then no loss.
    // The done attaches first (no start without its done); the typed start only where the
    // typed done did, so that both read the request alike.
    probe(programs::BLOCK_IO_DONE, "block", &["block_io_done", "block_rq_complete"], false)
        .or_typed(Typed {
            program: programs::BLOCK_IO_DONE_BTF,
            kind: TypedKind::Btf,
            args: &["struct request *"],
            blocker: |l| (!l.block.knows_request()).then_some("request.q/__sector, queue.disk"),
            fallback: None,
            pairs: Pairing { requires: None, events: &["block_io_done"] },
        }),
    probe(programs::BLOCK_IO_START, "block", &["block_io_start"], false).or_typed(Typed {
        program: programs::BLOCK_IO_START_BTF,
        kind: TypedKind::Btf,
        args: &["struct request *"],
        blocker: |l| (!l.block.knows_request()).then_some("request.q/__sector, queue.disk"),
        fallback: None,
        pairs: Pairing { requires: Some(programs::BLOCK_IO_DONE_BTF), events: &[] },
    }),
    // Off-CPU accounting (kernel::offcpu): wakeups before switches, so that a switch-in is
    // never seen without the wakeup that preceded it.
    probe(programs::SCHED_WAKING, "sched", &["sched_waking"], false).or_typed(Typed {
        program: programs::SCHED_WAKING_BTF,
        kind: TypedKind::Btf,
        args: &["struct task_struct *"],
        blocker: |l| (l.task.task_pid == TASK_UNKNOWN).then_some("task_struct.pid"),
        fallback: None,
        pairs: UNPAIRED,
    }),
    // (bool preempt, prev, next, unsigned int prev_state): the state is an argument since 5.18.
    probe(programs::SCHED_SWITCH, "sched", &["sched_switch"], false).or_typed(Typed {
        program: programs::SCHED_SWITCH_BTF,
        kind: TypedKind::Btf,
        args: &["bool", "struct task_struct *", "struct task_struct *", "unsigned int"],
        blocker: |l| (l.task.task_pid == TASK_UNKNOWN).then_some("task_struct.pid"),
        fallback: Some(crate::kernel::offcpu::NO_SYSCALL_CLASS),
        pairs: UNPAIRED,
    }),
    // A wakeup inside an hrtimer callback is a timeout's, not the interrupted task's doing:
    // the exit attaches first, so a CPU is never left marked "in a timer". Only where
    // sched_waking cannot tell interrupt context itself ([`timers_unneeded`]): they run on
    // every timer of every CPU.
    probe(programs::HRTIMER_EXPIRE_EXIT, "timer", &["hrtimer_expire_exit"], false),
    probe(programs::HRTIMER_EXPIRE_ENTRY, "timer", &["hrtimer_expire_entry"], false),
];

/// The first of `events` this kernel has (the probe table's choice), or the newest name.
fn chosen<'a>(tracefs: &Tracefs, category: &str, events: &[&'a str]) -> &'a str {
    events.iter().copied().find(|e| tracefs.exists(category, e)).unwrap_or(events[0])
}

/// What this kernel makes gpustall measure from its next-best source, in words (printed as
/// notes at start-up; the end-to-end tests report them per kernel).
fn degradations(tracefs: &Tracefs, offsets: &TracepointOffsets, layouts: &Layouts) -> Vec<String> {
    let mut notes = Vec::new();
    // Without the field, `signal->live` (read from the exiting task) says the same.
    if offsets.exit_group_dead == MISSING && !layouts.task.knows_group_live() {
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
    notes.extend(crate::kernel::offcpu::syscall_degradation(layouts));
    notes
}

/// The loaded programs and the maps the agent reads.
pub struct Probes {
    /// Kept alive: dropping it detaches every program.
    pub ebpf: Ebpf,
    pub attached: Vec<String>,
    /// The programs attached (a probe's typed or its classic one), for their run statistics.
    pub programs: Vec<&'static str>,
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
    let btf = crate::kernel::btf::open();
    if let Err(e) = &btf {
        log::warn!(
            "{e}: exit codes will be unknown, and typed tracepoints fall back to classic ones"
        );
    }
    let probes = load(&tracefs, btf.as_ref().map_err(String::as_str))?;
    for s in &probes.skipped {
        say!("gpustall: warning: tracepoint {s} is not available on this kernel; its data is missing");
    }
    for d in &probes.degraded {
        say!("gpustall: note: {d}");
    }
    Ok(probes)
}

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
    sched: crate::kernel::offcpu::SchedMaps,
}

/// How often the in-flight map is searched for stale requests.
const INFLIGHT_SWEEP_EVERY_NS: u64 = 10_000_000_000;

fn take<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, LoadError>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf.take_map(name).ok_or(LoadError::MissingMap(name))?;
    T::try_from(map).map_err(|source| LoadError::Map { name, source })
}

/// Loads with this kernel's layouts (tracefs formats, and `btf`: the kernel's BTF or why it is
/// unreadable) and attaches every probe the kernel has.
pub fn load(tracefs: &Tracefs, btf: Result<&btf_rs::Btf, &str>) -> Result<Probes, LoadError> {
    let event_of = |program: &str| {
        let p = PROBES.iter().find(|p| p.program == program).expect("in the probe table");
        chosen(tracefs, p.category, p.events)
    };
    let mut offsets =
        tracefs.offsets(event_of(programs::WRITE_FOLIO), event_of(programs::BLOCK_IO_DONE));
    offsets.task_exit_code =
        btf.ok().and_then(crate::kernel::btf::task_exit_code_offset).unwrap_or(u32::MAX);
    // Tests take the path of kernels before 6.16 (no group_dead) on a kernel that has it.
    if std::env::var_os("GPUSTALL_TEST_NO_GROUP_DEAD").is_some() {
        offsets.exit_group_dead = MISSING;
    }
    let layouts = btf.map_or(Layouts::unknown(), Layouts::from_btf);
    let mut degraded = degradations(tracefs, &offsets, &layouts);

    let mut loader = EbpfLoader::new();
    loader.override_global(names::OFFSETS, &offsets, true);
    loader.override_global(names::TASK_OFFSETS, &layouts.task, true);
    let sched_offsets = crate::kernel::offcpu::sched_offsets(tracefs);
    loader.override_global(names::SCHED_OFFSETS, &sched_offsets, true);
    let folio = layouts.folio.unwrap_or(FolioLayout::unknown());
    loader.override_global(names::FOLIO_LAYOUT, &folio, true);
    loader.override_global(names::BLOCK_LAYOUT, &layouts.block, true);
    loader.override_global(names::SYSCALL_NR_OFFSET, &layouts.syscall_nr, true);
    loader.override_global(names::STACK_LAYOUT, &layouts.stack, true);
    // Requests in flight wait in the typed programs' slots or the classic programs' hash: the
    // one that will not be used is made small (kernel memory, `kernel::mapmem`).
    let typed_pair = typed_requests_expected(tracefs, btf, &layouts);
    let (inflight, slots) = inflight_entries(typed_pair);
    loader.map_max_entries(maps::IO_INFLIGHT, inflight);
    loader.map_max_entries(maps::RQ_SLOTS, slots);
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
    let mut attached_programs = Vec::new();
    let mut skipped = Vec::new();
    // aya's own parse of the kernel's BTF, made once and only if a tp_btf program loads.
    let mut aya_btf: Option<Result<aya::Btf, String>> = None;
    let only = std::env::var("GPUSTALL_ONLY_PROBES").ok();
    for &Probe { program: prog, category, events, required, typed } in PROBES {
        if only.as_deref().is_some_and(|o| !o.split(',').any(|p| p == prog)) {
            continue;
        }
        if timers_unneeded(prog, &layouts, &attached_programs) {
            log::debug!(
                "{prog}: not attached: the typed sched_waking tells interrupt context itself"
            );
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
        if let Some(typed) = typed {
            let args = match std::env::var_os("GPUSTALL_TEST_CLASSIC_ONLY") {
                // Tests take the path of kernels without BTF on one that has it.
                Some(_) => Err("GPUSTALL_TEST_CLASSIC_ONLY is set"),
                None => btf.map(|b| crate::kernel::btf::tracepoint_args(b, event)),
            };
            let ready = typed_ready(&typed, args, &layouts)
                .and_then(|()| paired(&typed.pairs, event, &attached_programs))
                .and_then(|()| {
                    attach_typed(&mut ebpf, &typed, event, &mut aya_btf)
                        .map_err(|e| format!("the kernel refused it: {e}"))
                });
            match ready {
                Ok(()) => {
                    log::debug!("{name}: typed program {} attached", typed.program);
                    attached.push(name);
                    attached_programs.push(typed.program);
                    continue;
                }
                Err(why) => {
                    log::debug!("{name}: no typed program ({why}): the classic one runs");
                    if let Some(fallback) = typed.fallback {
                        degraded.push(format!("{name}: {fallback} ({why})"));
                    }
                    if typed.program == programs::BLOCK_IO_DONE_BTF && typed_pair {
                        degraded.push(format!(
                            "{name}: the classic request programs time at most {inflight} requests in flight at once ({why})"
                        ));
                    }
                    // Its partner, attached already, reads state this one will not keep.
                    if let Some(partner) = typed.pairs.requires {
                        if attached_programs.contains(&partner) {
                            degraded.push(format!(
                                "{name}: block request latency is not measured ({why})"
                            ));
                        }
                    }
                }
            }
        }
        let program: &mut TracePoint = ebpf
            .program_mut(prog)
            .ok_or_else(|| LoadError::MissingRequired(format!("program {prog}")))?
            .try_into()
            .map_err(|source| LoadError::Attach { tracepoint: name.clone(), source })?;
        let result = program.load().and_then(|()| program.attach(category, event).map(|_| ()));
        match result {
            Ok(()) => {
                attached.push(name);
                attached_programs.push(prog);
            }
            Err(source) if required => return Err(LoadError::Attach { tracepoint: name, source }),
            Err(e) => {
                log::warn!("cannot attach {name}: {e}; going on without it");
                degraded.push(format!("{name}: the kernel refused its program: {}", tail_of(&e)));
                skipped.push(name);
            }
        }
    }
    let hint_map = ebpf.map(maps::TRACKED_HINT).ok_or(LoadError::MissingMap(maps::TRACKED_HINT))?;
    let tracked_hint = match hint_map {
        aya::maps::Map::Array(data) => crate::kernel::hint::TrackedHint::map(data),
        _ => Err(std::io::ErrorKind::InvalidInput.into()),
    }
    .map_err(|e| LoadError::Mmap(maps::TRACKED_HINT, e))?;
    let maps = KernelMaps {
        tracked: take(&mut ebpf, maps::TRACKED)?,
        tracked_hint,
        proc_counters: take(&mut ebpf, maps::PROC_COUNTERS)?,
        io_counters: take(&mut ebpf, maps::IO_COUNTERS)?,
        host: take(&mut ebpf, maps::HOST)?,
        lost: take(&mut ebpf, maps::LOST)?,
        io_latency: take(&mut ebpf, maps::IO_LATENCY)?,
        io_inflight: std::sync::Mutex::new(take(&mut ebpf, maps::IO_INFLIGHT)?),
        inflight_swept_ns: std::sync::atomic::AtomicU64::new(0),
        sched: crate::kernel::offcpu::SchedMaps::take(&mut ebpf)?,
    };
    let critical = take(&mut ebpf, maps::CRITICAL)?;
    let bulk = take(&mut ebpf, maps::BULK)?;
    Ok(Probes {
        ebpf,
        attached,
        programs: attached_programs,
        skipped,
        degraded,
        maps,
        rings: Some((critical, bulk)),
    })
}

/// The end of an error that may carry the verifier's whole log: its last lines, where the
/// verifier says what it refused, on one line.
fn tail_of(e: &dyn std::fmt::Display) -> String {
    let text = e.to_string();
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(4)..].join(" | ");
    match tail.char_indices().nth(400) {
        Some((cut, _)) => format!("{}...", &tail[..cut]),
        None => tail,
    }
}

/// Entries of `IO_INFLIGHT` and `RQ_SLOTS` when the typed request programs are (`true`) or
/// are not expected to run. The hash keeps an eighth of its size beside the slots, for the
/// classic programs should the typed ones fail to attach after all (said among degradations).
/// The classic hash holds 12,288 requests of the job (with the front-merged ones it loses
/// until the agent's minute-old sweep): what fits the 16 MiB bound beside the other maps
/// (`kernel::mapmem`).
pub(crate) const fn inflight_entries(typed_pair: bool) -> (u32, u32) {
    const HASH: u32 = 12288;
    if typed_pair {
        (HASH / 8, gpustall_common::rqslot::RQ_SLOTS)
    } else {
        (HASH, 1)
    }
}

/// Whether the typed block_io_start and block_io_done can both run here, as the attach loop
/// will find (BTF, tracepoints, the test switch to classic programs).
fn typed_requests_expected(
    tracefs: &Tracefs,
    btf: Result<&btf_rs::Btf, &str>,
    layouts: &Layouts,
) -> bool {
    if std::env::var_os("GPUSTALL_TEST_CLASSIC_ONLY").is_some() {
        return false;
    }
    let Ok(btf) = btf else { return false };
    [(programs::BLOCK_IO_DONE, "block_io_done"), (programs::BLOCK_IO_START, "block_io_start")]
        .into_iter()
        .all(|(program, event)| {
            let typed = PROBES.iter().find(|p| p.program == program).and_then(|p| p.typed);
            typed.is_some_and(|typed| {
                tracefs.exists("block", event)
                    && typed_ready(
                        &typed,
                        Ok(crate::kernel::btf::tracepoint_args(btf, event)),
                        layouts,
                    )
                    .is_ok()
            })
        })
}

/// Loads and attaches a typed program on `event`; `aya_btf` caches aya's parse of the
/// kernel's BTF (tp_btf programs are loaded against the event's `btf_trace_` type).
fn attach_typed(
    ebpf: &mut Ebpf,
    typed: &Typed,
    event: &str,
    aya_btf: &mut Option<Result<aya::Btf, String>>,
) -> Result<(), String> {
    let program = ebpf
        .program_mut(typed.program)
        .ok_or_else(|| format!("program {} is not in the object", typed.program))?;
    match typed.kind {
        TypedKind::Btf => {
            let btf = aya_btf
                .get_or_insert_with(|| aya::Btf::from_sys_fs().map_err(|e| e.to_string()))
                .as_ref()
                .map_err(Clone::clone)?;
            let p: &mut BtfTracePoint = program.try_into().map_err(|e| format!("{e}"))?;
            p.load(event, btf).map_err(|e| format!("{e}"))?;
            p.attach().map(|_| ()).map_err(|e| format!("{e}"))
        }
        TypedKind::Raw => {
            let p: &mut RawTracePoint = program.try_into().map_err(|e| format!("{e}"))?;
            p.load().map_err(|e| format!("{e}"))?;
            p.attach(event).map(|_| ()).map_err(|e| format!("{e}"))
        }
    }
}

/// Run count and run time of each attached program (`programs`: [`Probes::programs`]; run time
/// needs kernel.bpf_stats_enabled), sorted by name.
pub fn program_stats(
    ebpf: &Ebpf,
    programs: &[&'static str],
) -> Vec<crate::model::overhead::ProgramStat> {
    use std::os::fd::AsFd;
    let mut stats: Vec<_> = ebpf
        .programs()
        .filter(|(name, _)| programs.contains(name))
        .filter_map(|(name, p)| {
            let info = p.info().ok()?;
            let missed = p.fd().ok().and_then(|fd| recursion_misses(fd.as_fd())).unwrap_or(0);
            Some(
                crate::model::overhead::ProgramStat::new(
                    name,
                    info.run_count(),
                    info.run_time().as_nanos() as u64,
                )
                .with_missed(missed),
            )
        })
        .collect();
    stats.sort_by(|a, b| a.name.cmp(&b.name));
    stats
}

/// The runs of a program the kernel skipped because it was already running on that CPU: the
/// `recursion_misses` line of its fdinfo (aya's program info does not carry it; 5.12+).
fn recursion_misses(fd: std::os::fd::BorrowedFd<'_>) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    fdinfo_field(&text, "recursion_misses")
}

/// A numeric `key:\tvalue` line of an fdinfo file.
fn fdinfo_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.trim().parse().ok())
}

impl KernelMaps {
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
        for IoSlot { dev, op, in_reclaim } in io_slots {
            let key = IoKey { tgid: pid, dev, op, in_reclaim: u32::from(in_reclaim) };
            let _ = self.io_counters.remove(&key);
        }
    }

    /// Raises the live processes of the job's own roles to off-CPU accounting.
    pub fn account_offcpu(&mut self, tree: &crate::model::proctree::ProcessTree) {
        self.sched.account(&mut self.tracked, &crate::kernel::offcpu::wanted(tree));
        self.sched.set_feeders(crate::kernel::offcpu::feeders(tree));
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
                pid: k.tgid,
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

#[cfg(test)]
mod tests {
    use gpustall_common::{
        names::{maps, programs},
        task::TaskOffsets,
    };

    use super::{typed_ready, Layouts, Typed, PROBES};

    /// The object the agent embeds, parsed without the kernel.
    fn object() -> aya_obj::Object {
        let bytes = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gpustall"));
        aya_obj::Object::parse(bytes).expect("the built eBPF object parses")
    }

    #[test]
    fn recursion_misses_are_read_from_a_programs_fdinfo() {
        let t = "pos:\t0\nflags:\t02000002\nprog_type:\t26\nprog_jited:\t1\n\
                 run_time_ns:\t81234\nrun_cnt:\t3095\nrecursion_misses:\t7\n\
                 verified_insns:\t412\n";
        assert_eq!(super::fdinfo_field(t, "recursion_misses"), Some(7));
        assert_eq!(super::fdinfo_field(t, "run_cnt"), Some(3095));
        assert_eq!(super::fdinfo_field("pos:\t0\n", "recursion_misses"), None);
    }

    #[test]
    fn every_shared_name_is_in_the_built_object() {
        let obj = object();
        let map_names = [
            maps::TRACKED,
            maps::TRACKED_HINT,
            maps::CRITICAL,
            maps::BULK,
            maps::LOST,
            maps::PROC_COUNTERS,
            maps::HOST,
            maps::IO_COUNTERS,
            maps::IO_LATENCY,
            maps::IO_INFLIGHT,
            maps::RQ_SLOTS,
            maps::RQ_HINT,
            maps::OFFCPU_THREADS,
            maps::OFFCPU,
            maps::WAKES,
            maps::SYSCALL_WAITS,
            maps::FEEDERS,
        ];
        for m in map_names {
            assert!(
                obj.maps.contains_key(m),
                "map {m} is not in the object: {:?}",
                obj.maps.keys()
            );
        }
        let table: Vec<&str> = PROBES
            .iter()
            .flat_map(|p| [Some(p.program), p.typed.map(|t| t.program)])
            .flatten()
            .collect();
        for p in &table {
            assert!(obj.programs.contains_key(*p), "program {p} is not in the object");
        }
        // Every program of the object is attached by the table (none forgotten).
        assert_eq!(obj.programs.len(), table.len(), "{:?}", obj.programs.keys());
    }

    fn signal_typed() -> Typed {
        PROBES
            .iter()
            .find_map(|p| p.typed.filter(|t| t.program == programs::SIGNAL_GENERATE_RAW))
            .expect("signal_generate has a typed program")
    }

    #[test]
    fn a_typed_program_runs_only_where_the_kernel_can_run_it() {
        let typed = signal_typed();
        let known = Layouts {
            task: TaskOffsets {
                task_pid: 1,
                task_tgid: 2,
                task_comm: 3,
                task_signal: 4,
                signal_live: 5,
                siginfo_code: 8,
            },
            ..Layouts::unknown()
        };
        let proto = |a: &[&str]| Ok(Some(a.iter().map(|s| s.to_string()).collect()));
        let this_kernel =
            proto(&["int", "struct kernel_siginfo *", "struct task_struct *", "int", "int"]);
        assert_eq!(typed_ready(&typed, this_kernel.clone(), &known), Ok(()));
        // No BTF at all, or no such tracepoint in it: the classic program, with the reason.
        let no_btf = typed_ready(&typed, Err("cannot read /sys/kernel/btf/vmlinux"), &known);
        assert!(no_btf.unwrap_err().contains("vmlinux"));
        assert!(typed_ready(&typed, Ok(None), &known).is_err());
        // Another prototype (the task moved): never read a pointer where an int is.
        let other = typed_ready(&typed, proto(&["int", "struct task_struct *"]), &known);
        assert!(other.unwrap_err().contains("not (int"), "the reason names both prototypes");
        // The prototype fits but BTF did not give the task's offsets.
        let blocked = typed_ready(&typed, this_kernel, &Layouts::unknown());
        assert!(blocked.unwrap_err().contains("tgid"));
    }

    /// The folio-reading write_folio runs where BTF gave the folio's layout, whatever the
    /// event's argument (folio or page: checked with the layout); else the per-folio fallback.
    #[test]
    fn write_folio_counts_pages_only_with_the_folio_layout() {
        let typed = PROBES
            .iter()
            .find_map(|p| p.typed.filter(|t| t.program == programs::WRITE_FOLIO_BTF))
            .expect("write_folio has a typed program");
        let args = || Ok(Some(vec!["struct page *".to_string()]));
        let layout = gpustall_common::folio::FolioLayout {
            flags: 0,
            order: 64,
            head_bit: 6,
            swapbacked_bit: 17,
        };
        let known = Layouts { folio: Ok(layout), ..Layouts::unknown() };
        assert_eq!(typed_ready(&typed, args(), &known), Ok(()));
        let why = typed_ready(&typed, args(), &Layouts::unknown()).unwrap_err();
        assert!(why.contains("folio"), "{why}");
        assert!(typed.fallback.unwrap().starts_with("swap-out counted per folio"));
    }
}
