//! Loading, the orchestration: the eBPF object loaded with this kernel's field offsets
//! (tracefs, BTF: [`Layouts`]), the probe table attached ([`crate::kernel::attach`]), the maps
//! the agent reads taken out ([`KernelMaps`]).

use aya::{
    maps::{MapData, RingBuf},
    Ebpf, EbpfLoader,
};
use gpustall_common::folio::FolioLayout;
use gpustall_common::names::{self, maps, programs};
use gpustall_common::offsets::{TracepointOffsets, MISSING};

use crate::kernel::attach::{self, Kernel};
use crate::kernel::layouts::Layouts;
use crate::kernel::maps::inflight_entries;
pub use crate::kernel::maps::KernelMaps;
use crate::kernel::probes::event_of;
pub use crate::kernel::prog_stats::program_stats;
use crate::kernel::tracefs::Tracefs;

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

/// The test hooks: switches the end-to-end tests set in the environment to take, on the kernel
/// they run on, the paths other kernels take. Read once, by [`LoadOptions::from_env`].
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// `GPUSTALL_ONLY_PROBES`: attach only these programs (names, comma-separated).
    pub only_probes: Option<String>,
    /// `GPUSTALL_TEST_CLASSIC_ONLY`: no typed program, as on kernels without BTF.
    pub classic_only: bool,
    /// `GPUSTALL_TEST_NO_GROUP_DEAD`: as before 6.16, no `group_dead` in sched_process_exit.
    pub no_group_dead: bool,
    /// `GPUSTALL_TEST_IO_MAP_ENTRIES`: a small per-process I/O map, to reach "map full" with a
    /// few processes (the kernel path of a host with more processes than entries).
    pub io_map_entries: Option<u32>,
}

impl LoadOptions {
    pub fn from_env() -> Self {
        Self {
            only_probes: std::env::var("GPUSTALL_ONLY_PROBES").ok(),
            classic_only: std::env::var_os("GPUSTALL_TEST_CLASSIC_ONLY").is_some(),
            no_group_dead: std::env::var_os("GPUSTALL_TEST_NO_GROUP_DEAD").is_some(),
            io_map_entries: std::env::var("GPUSTALL_TEST_IO_MAP_ENTRIES")
                .ok()
                .and_then(|v| v.parse().ok()),
        }
    }

    /// Whether `program` is to be attached (all are, without `only_probes`).
    pub fn wants(&self, program: &str) -> bool {
        self.only_probes.as_deref().is_none_or(|o| o.split(',').any(|p| p == program))
    }
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
    notes.extend(crate::kernel::offcpu_maps::syscall_degradation(layouts));
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
    /// The kernel side's own lines, where asked for (`RUST_LOG`): drained at the end too.
    pub klog: Option<crate::kernel::klog::Reader>,
    /// The two rings, until the event loop takes them ([`Probes::take_rings`]).
    rings: Option<(RingBuf<MapData>, RingBuf<MapData>)>,
    /// The CUDA drivers probed for the waiters' GPU waits.
    cuda: crate::kernel::cuda::CudaProbes,
}

impl Drop for Probes {
    fn drop(&mut self) {
        attach::detach_all(&mut self.ebpf);
    }
}

impl Probes {
    /// The critical and the bulk ring, for the event loop (once).
    /// Probes the CUDA drivers `waiters` (live trainers and ranks) mapped since the last
    /// call: what was found, once per waiter.
    pub fn follow_cuda(
        &mut self,
        waiters: &[u32],
        now_ns: u64,
    ) -> Vec<crate::model::gpuwait::CudaProbesRec> {
        let found = self.cuda.follow(&mut self.ebpf, waiters, now_ns);
        // Once loaded, their run statistics are the overhead's as the tracepoints' are.
        if self.cuda.loaded() && !self.programs.contains(&programs::CUDA_SYNC_ENTER) {
            self.programs.extend([programs::CUDA_SYNC_ENTER, programs::CUDA_SYNC_EXIT]);
        }
        found
    }

    pub fn take_rings(&mut self) -> anyhow::Result<(RingBuf<MapData>, RingBuf<MapData>)> {
        self.rings.take().ok_or_else(|| anyhow::anyhow!("the rings were already taken"))
    }
}

/// Loads with this kernel's layouts and attaches; one warning per tracepoint the kernel lacks.
pub fn load_and_warn() -> anyhow::Result<Probes> {
    // The environment is read here, once: below, the loader sees only `options`.
    let options = LoadOptions::from_env();
    let tracefs = Tracefs::open()?;
    let btf = crate::kernel::btf::open();
    if let Err(e) = &btf {
        log::warn!(
            "{e}: exit codes will be unknown, and typed tracepoints fall back to classic ones"
        );
    }
    let probes = load(&tracefs, btf.as_ref().map_err(String::as_str), &options)?;
    for s in &probes.skipped {
        say!("gpustall: warning: tracepoint {s} is not available on this kernel; its data is missing");
    }
    for d in &probes.degraded {
        say!("gpustall: note: {d}");
    }
    Ok(probes)
}

/// Loads with this kernel's layouts (tracefs formats, and `btf`: the kernel's BTF or why it is
/// unreadable) and attaches every probe the kernel has (and `options` wants).
pub fn load(
    tracefs: &Tracefs,
    btf: Result<&btf_rs::Btf, &str>,
    options: &LoadOptions,
) -> Result<Probes, LoadError> {
    let offsets = tracepoint_offsets(tracefs, btf, options);
    let layouts = btf.map_or(Layouts::unknown(), Layouts::from_btf);
    let kernel = Kernel { tracefs, btf, layouts: &layouts, offsets: &offsets };
    // Requests in flight wait in the typed programs' slots or the classic programs' hash: the
    // one that will not be used is made small (kernel memory, `kernel::mapmem`).
    let typed_pair = !options.classic_only && attach::typed_requests_expected(&kernel);
    let log_level = crate::kernel::klog::requested_level();
    let mut ebpf = load_object(&kernel, typed_pair, options, log_level)?;
    let classic_inflight = typed_pair.then_some(inflight_entries(true).0);
    let attached = attach::attach_all(&mut ebpf, &kernel, options, classic_inflight)?;
    crate::kernel::prog_stats::log_verifier_costs(&ebpf, &attached.programs);
    let mut degraded = degradations(tracefs, &offsets, &layouts);
    degraded.extend(attached.degraded);
    let klog = if log_level != 0 { crate::kernel::klog::start(&mut ebpf) } else { None };
    let maps = KernelMaps::take(&mut ebpf)?;
    let critical = crate::kernel::maps::take(&mut ebpf, maps::CRITICAL)?;
    let bulk = crate::kernel::maps::take(&mut ebpf, maps::BULK)?;
    Ok(Probes {
        ebpf,
        attached: attached.names,
        programs: attached.programs,
        skipped: attached.skipped,
        degraded,
        maps,
        klog,
        rings: Some((critical, bulk)),
        cuda: Default::default(),
    })
}

/// The classic tracepoints' field offsets, as this kernel's formats give them, and the task's
/// exit code offset from BTF.
fn tracepoint_offsets(
    tracefs: &Tracefs,
    btf: Result<&btf_rs::Btf, &str>,
    options: &LoadOptions,
) -> TracepointOffsets {
    let mut offsets = tracefs.offsets(
        event_of(tracefs, programs::WRITE_FOLIO),
        event_of(tracefs, programs::BLOCK_IO_DONE),
    );
    offsets.task_exit_code =
        btf.ok().and_then(crate::kernel::btf::task_exit_code_offset).unwrap_or(u32::MAX);
    // Tests take the path of kernels before 6.16 (no group_dead) on a kernel that has it.
    if options.no_group_dead {
        offsets.exit_group_dead = MISSING;
    }
    offsets
}

/// The object loaded (not yet attached) with the kernel's layouts in its globals and its maps
/// sized: the in-flight request maps for the typed pair (`typed_pair`) or the classic one; the
/// kernel side's own lines at `log_level` (0: off).
fn load_object(
    kernel: &Kernel<'_>,
    typed_pair: bool,
    options: &LoadOptions,
    log_level: u8,
) -> Result<Ebpf, LoadError> {
    let layouts = kernel.layouts;
    let mut loader = EbpfLoader::new();
    loader.override_global(names::OFFSETS, kernel.offsets, true);
    loader.override_global(names::TASK_OFFSETS, &layouts.task, true);
    let sched_offsets = crate::kernel::offcpu_maps::sched_offsets(kernel.tracefs);
    loader.override_global(names::SCHED_OFFSETS, &sched_offsets, true);
    let folio = layouts.folio.unwrap_or(FolioLayout::unknown());
    loader.override_global(names::FOLIO_LAYOUT, &folio, true);
    loader.override_global(names::BLOCK_LAYOUT, &layouts.block, true);
    loader.override_global(names::SYSCALL_NR_OFFSET, &layouts.syscall_nr, true);
    loader.override_global(names::STACK_LAYOUT, &layouts.stack, true);
    loader.override_global(names::CPU_TIME_OFFSET, &layouts.cpu_time, true);
    crate::kernel::klog::configure(&mut loader, &log_level);
    let (inflight, slots) = inflight_entries(typed_pair);
    loader.map_max_entries(maps::IO_INFLIGHT, inflight);
    loader.map_max_entries(maps::RQ_SLOTS, slots);
    if let Some(n) = options.io_map_entries {
        loader.map_max_entries(maps::IO_COUNTERS, n);
    }
    loader
        .load(aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gpustall")))
        .map_err(LoadError::Load)
}
