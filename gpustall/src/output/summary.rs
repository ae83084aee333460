//! The summary: what `--summary-json` writes and the final `{"type":"summary"}` record holds.
//! Field names are the interface in docs/ARCHITECTURE.md and docs/FORMATS.md: others build on them.

use anyhow::Context as _;
use serde::Serialize;

use gpustall_common::counters::{HostCounter, IoOp, LostCounter};

use crate::diagnose::facts::{Facts, ProcFacts};
use crate::diagnose::verdict::Verdict;
use crate::model::host::DiskStat;
use crate::model::proctree::Role;
use crate::model::stats::log2_percentile;
use crate::model::stats::sum_io;
use crate::model::Model;

#[derive(Serialize, Debug, Clone)]
pub struct Summary {
    #[serde(rename = "type")]
    pub record_type: &'static str,
    /// False for the periodic summaries written while tracing.
    #[serde(rename = "final")]
    pub is_final: bool,
    pub t_ns: u64,
    pub duration_s: f64,
    /// Where and when the trace ran: host, kernel, wall clock at its start, targets, tool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<crate::model::origin::Origin>,
    /// Which job this is in its cluster (pod, Slurm job, torchrun run and rank), where its
    /// processes said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<crate::model::identity::Identity>,
    /// A periodic summary lists only the processes whose figures changed since the previous
    /// one (a tree of thousands would otherwise repeat them all every few seconds).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub processes_changed_only: bool,
    /// Everything that could not be recorded: ring reservations that failed, kernel maps that
    /// were full, records that did not decode.
    pub lost_events: u64,
    pub lost: LostSummary,
    /// Exited processes that mattered to no verdict, folded per role to keep a fork storm
    /// small; absent when none were.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub folded: Vec<FoldedSummary>,
    /// When anything was lost: which figures are lower bounds, one line each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lower_bounds: Vec<String>,
    pub events: u64,
    pub processes: Vec<ProcessSummary>,
    pub oom_kills: Vec<crate::model::OomKill>,
    pub signals: Vec<crate::model::SignalRecord>,
    pub host: HostSummary,
    pub block_latency_us: Vec<LatencySummary>,
    pub overhead: crate::model::overhead::Overhead,
    /// Why there is no GPU data, or which GPUs were sampled.
    pub gpu_status: String,
    /// Per GPU over the trace; `null` without GPU data.
    pub gpu: Option<crate::model::gpu::GpuSummary>,
    /// GPU stall episodes (utilisation at or under the threshold for the window).
    pub stalls: Vec<crate::model::gpu::StallEpisode>,
    pub context: ContextSummary,
    /// The kernel log's kept lines, as counts (the lines themselves are in the verdict's
    /// evidence, the first few, and in the recording).
    pub kernel_log: KernelLogSummary,
    pub verdict: Verdict,
}

/// How much of the kernel log mattered, folded and bounded (`model::kernlog::KernelLog`).
#[derive(Serialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelLogSummary {
    /// Kept lines, every repeat counted.
    pub lines: u64,
    /// Distinct lines they fold into (the same line but for its numbers is one).
    pub distinct: u64,
    /// Of `lines`, those user space wrote into the log (not the kernel's; counted as the
    /// kernel's under `--trust-user-kernel-log` but counted here all the same).
    pub from_user_space: u64,
    /// Lines not kept: unlike every kept one, past the cap of distinct lines of their kind.
    pub dropped: u64,
    /// Records the reader found overwritten before it read them.
    pub missed: u64,
}

impl KernelLogSummary {
    pub fn of(log: &crate::model::kernlog::KernelLog) -> Self {
        use crate::model::kernlog::LogOrigin;
        Self {
            lines: log.total(),
            distinct: log.lines.len() as u64,
            from_user_space: log
                .lines
                .iter()
                .filter(|l| l.origin != LogOrigin::Kernel)
                .map(|l| l.count.max(1))
                .sum(),
            dropped: log.dropped,
            missed: log.missed,
        }
    }
}

/// Exited processes of one role folded together (`model::folded`).
#[derive(Serialize, Debug, Clone)]
pub struct FoldedSummary {
    pub role: Role,
    #[serde(flatten)]
    pub totals: crate::model::folded::FoldedTotals,
}

/// The job's surroundings over the trace.
#[derive(Serialize, Debug, Clone)]
pub struct ContextSummary {
    /// The trainer's memory cgroup at the end, with its peak usage over the trace.
    pub cgroup: Option<crate::model::host::CgroupMem>,
    pub cgroup_peak_usage_bytes: u64,
    /// The limiting cgroup's memory.events over the trace (v2; `null` on v1).
    pub cgroup_memory_events: Option<crate::model::host::MemEvents>,
    /// The job cgroup's memory PSI over the trace (v2 with PSI on).
    pub cgroup_pressure: Option<crate::model::host::PsiDelta>,
    /// /proc/pressure/memory over the trace (`null` without PSI).
    pub host_pressure: Option<crate::model::host::PsiDelta>,
    /// What could not be read, and what stands in for it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub context_notes: Vec<String>,
    pub host_mem_total_kb: Option<u64>,
    pub host_min_available_kb: Option<u64>,
    pub swap_total_kb: Option<u64>,
    pub swap_free_kb: Option<u64>,
    /// The kernel's page size in bytes: the unit of every `*_pages` figure and of pswpin and
    /// pswpout. Absent in reports of recordings that did not record it (4 KiB pages).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_size: Option<u64>,
    /// /proc/vmstat deltas over the trace (whole host).
    pub vmstat: crate::model::host::VmDelta,
    /// Busy % of each disk over the trace, and at its busiest second.
    pub disks: Vec<DiskSummary>,
    pub filesystems: Vec<crate::model::host::FsUsage>,
    /// From `--log`: the per-step data_time trend.
    pub train_steps: usize,
    pub data_time: Option<crate::model::steps::DataTimeTrend>,
    /// The log's data_time over the iterations it covers, read as what it is (mmengine's
    /// window means turned back into time), and how.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_time_logged: Option<crate::model::steps::LoggedDataTime>,
    /// The first forecast that put the job's memory cgroup under 10 minutes from its limit
    /// (`model::limit_clock`): when it was said and when it put the limit, on the clock of
    /// `oom_kills[].t_ns`. Absent when no forecast came that close.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_warning: Option<crate::model::limit_clock::Warning>,
}

#[derive(Serialize, Debug, Clone)]
pub struct DiskSummary {
    pub name: String,
    pub dev: String,
    pub busy_pct: f64,
    pub peak_busy_pct: f64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

#[derive(Serialize, Debug, Clone, Default)]
pub struct LostSummary {
    pub critical_ring: u64,
    pub bulk_ring: u64,
    pub map_full: u64,
    pub undecodable: u64,
    /// Program runs the kernel skipped because the program was already running on that CPU
    /// (`overhead.programs[].missed`): events not seen, said among the lower bounds. Not in
    /// `lost_events` (nor the exit status it sets): a loaded host skips a few timer runs now
    /// and then, which changes no figure a verdict stands on.
    pub program_skipped: u64,
    /// Lines the watch daemon's flight recorder dropped for its memory budget (bundles).
    #[serde(skip_serializing_if = "is_zero")]
    pub flight_recorder: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl LostSummary {
    pub fn total(&self) -> u64 {
        self.critical_ring
            + self.bulk_ring
            + self.map_full
            + self.undecodable
            + self.flight_recorder
    }

    /// Which figures of the summary are lower bounds because of these losses, one line each.
    pub fn lower_bounds(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.critical_ring > 0 {
            v.push(format!("{} process events lost (critical ring full): forks, exits, renames, OOM kills and signals may be missing", self.critical_ring));
        }
        if self.bulk_ring > 0 {
            v.push(format!("{} reclaim records lost (bulk ring full): reclaim stall distributions and timelines are lower bounds (the stall totals are counted in the kernel and complete)", self.bulk_ring));
        }
        if self.map_full > 0 {
            v.push(format!("{} updates lost (a kernel map was full): per-process block I/O, reclaim and swap-out counts are lower bounds", self.map_full));
        }
        if self.undecodable > 0 {
            v.push(format!(
                "{} records could not be decoded: event counts are lower bounds",
                self.undecodable
            ));
        }
        if self.program_skipped > 0 {
            v.push(format!("{} program runs skipped by the kernel (a program already running on that CPU, such as a request's completion in an interrupt while another was handled): per-process block I/O, latency and off-CPU counts are lower bounds", self.program_skipped));
        }
        if self.flight_recorder > 0 {
            v.push(format!("{} lines dropped by the flight recorder (over --memory-budget): this window misses events; processes may show as alive and counts are lower bounds", self.flight_recorder));
        }
        v
    }
}

#[derive(Serialize, Debug, Clone)]
pub struct DeviceIo {
    /// `major:minor`. On a stacked device (dm, md) this is the device the process used: the
    /// clones queued below it are counted once, here.
    pub dev: String,
    /// The kernel's name for it (`dm-0`, `md0`, `nvme0n1`), when the host's disk list has it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What a stacked device sits on (`/sys/block/NAME/slaves`): where its requests really went.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lower: Vec<String>,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Submitted while the process was inside reclaim (swap-out, writeback under pressure).
    pub reclaim_bytes: u64,
    pub bios: u64,
    /// Requests of this process on this device whose latency was measured (block_io_start to
    /// block_io_done, or queue to complete before 6.5): what `avg_latency_us` averages over.
    pub requests: u64,
    pub avg_latency_us: Option<f64>,
    pub max_latency_us: Option<f64>,
}

#[derive(Serialize, Debug, Clone)]
pub struct ProcessSummary {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    pub role: Role,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_index: Option<usize>,
    /// A worker's DataLoader: the trainer or rank it serves (its parent, or the owner of the
    /// forkserver that started it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dataloader_of: Option<u32>,
    pub thread_names: Vec<String>,
    /// Threads PyTorch named for a role (the pin-memory thread, `pt_data_pin`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub thread_roles: Vec<ThreadRoleSummary>,
    pub block_read_bytes: u64,
    pub block_write_bytes: u64,
    pub reclaim_io_bytes: u64,
    pub io_by_device: Vec<DeviceIo>,
    pub direct_reclaim_count: u64,
    pub direct_reclaim_ns: u64,
    pub memcg_reclaim_count: u64,
    pub memcg_reclaim_ns: u64,
    pub reclaimed_pages: u64,
    pub reclaim_stall_p50_ns: Option<u64>,
    pub reclaim_stall_p99_ns: Option<u64>,
    pub reclaim_stall_max_ns: Option<u64>,
    /// Pages of the anonymous folios this process's reclaim wrote to swap, in the kernel's
    /// pages (`context.page_size`), as pswpout counts them: a 2 MiB THP swapped whole is 512.
    /// Where the kernel has no BTF, one per folio (the notes say so).
    pub swapout_pages: u64,
    pub file_writeback_pages: u64,
    pub kswapd_wakeups: u64,
    pub throttled_count: u64,
    pub throttled_us: u64,
    pub peak_rss_kb: u64,
    /// Resident + swapped-out memory at its peak (RSS alone shrinks under swap).
    pub peak_mem_kb: u64,
    /// RSS at the first sample, and growth from there to the peak.
    pub first_rss_kb: Option<u64>,
    pub rss_growth_kb: u64,
    /// Proportional memory (PSS of anon and shmem + SwapPss; the job's own roles only): peak,
    /// and growth from the first sample. What the verdict's culprits and advice use.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_pss_kb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pss_growth_kb: Option<u64>,
    pub last_rss_kb: u64,
    pub last_swap_kb: u64,
    pub major_faults: u64,
    /// Its own identity in the cluster (a rank's rank), where one was found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<crate::model::identity::Identity>,
    pub oom_killed: bool,
    pub exit_code: Option<i32>,
    pub exit_signal: Option<i32>,
    pub killed_by: Option<crate::model::proctree::Killer>,
    pub alive: bool,
    #[serde(flatten)]
    pub offcpu: Option<crate::model::offcpu::OffCpuSummary>,
    /// A trainer's or rank's CPU time receiving batches, from its Python stacks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receiving_batches: Option<crate::model::pystacks::Receiving>,
    /// Its Python stacks, where they were sampled (`--py-stacks`) or could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub py_stacks: Option<crate::model::pystacks::StacksSummary>,
    /// A trainer's or rank's time inside the CUDA driver's synchronising calls, where they
    /// were probed; else, for a trainer or rank, why not (`gpu_wait_unmeasured`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_wait: Option<crate::model::gpuwait::GpuWaitSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_wait_unmeasured: Option<String>,
    /// Its time split into waiting for data, for the GPU, its own CPU work (with `gpu_wait`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_split: Option<crate::diagnose::verdict::TimeSplit>,
}

impl ProcessSummary {
    /// Reclaim episodes of either kind (direct and memcg), as `ProcCounters::reclaim_count`.
    pub fn reclaim_count(&self) -> u64 {
        self.direct_reclaim_count + self.memcg_reclaim_count
    }

    /// Time stalled in reclaim of either kind, as `ProcCounters::reclaim_ns`.
    pub fn reclaim_ns(&self) -> u64 {
        self.direct_reclaim_ns + self.memcg_reclaim_ns
    }
}

/// A thread with a role in its process.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct ThreadRoleSummary {
    pub tid: u32,
    pub role: crate::model::proctree::ThreadRole,
}

#[derive(Serialize, Debug, Clone, Default)]
pub struct HostSummary {
    /// Swap-out done by kswapd (background reclaim), not blamed on any process.
    pub kswapd_swapout_pages: u64,
    pub kswapd_file_writeback_pages: u64,
    pub kswapd_io_bytes: u64,
    pub kswapd_episodes: u64,
    pub kswapd_ns: u64,
    pub kswapd_wakeups_by_others: u64,
    /// Reclaim by processes outside the traced tree.
    pub other_swapout_pages: u64,
    pub other_file_writeback_pages: u64,
    pub other_reclaim_io_bytes: u64,
    pub other_direct_reclaim_count: u64,
    pub other_direct_reclaim_ns: u64,
    pub other_memcg_reclaim_count: u64,
    pub other_memcg_reclaim_ns: u64,
    pub other_throttled_count: u64,
}

#[derive(Serialize, Debug, Clone)]
pub struct LatencySummary {
    pub op: &'static str,
    pub requests: u64,
    /// Upper bounds of the kernel's power-of-two buckets.
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
}

/// Writes the summary as pretty JSON.
pub fn write_json(s: &Summary, path: &std::path::Path) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(s)?;
    crate::recording::files::write_private(path, (text + "\n").as_bytes())
        .with_context(|| format!("writing the summary to {}", path.display()))
}

/// Where the kernel's own pressure figures are missing, and why (the summary says so rather
/// than leave a silent `null`).
fn context_notes(c: &crate::model::host::HostContext) -> Vec<String> {
    let mut notes = Vec::new();
    match &c.cgroup_last {
        Some(cg) if cg.version == 1 => notes.push(
            "memory cgroup v1: no memory.events or memory.pressure; memory.failcnt and memory.oom_control stand in".to_string(),
        ),
        Some(cg) if cg.pressure.is_none() => notes.push(
            "no memory.pressure in the job's cgroup: PSI is off (psi=0 on the kernel command line) or the kernel lacks CONFIG_PSI".to_string(),
        ),
        _ => {}
    }
    if c.samples > 0 && c.host_psi.first.is_none() {
        notes.push(
            "no /proc/pressure/memory: PSI is off (psi=0 on the kernel command line) or the kernel lacks CONFIG_PSI".to_string(),
        );
    }
    notes
}

fn context_summary(m: &Model) -> ContextSummary {
    let c = &m.ctx;
    let data_times: Vec<f64> = m.steps.iter().filter_map(|(_, s)| s.data_time_s).collect();
    ContextSummary {
        cgroup: c.cgroup_last.clone(),
        limit_warning: c.limit_clock.first_warning,
        cgroup_peak_usage_bytes: c.cgroup_peak_usage,
        cgroup_memory_events: c.cgroup_events(),
        cgroup_pressure: c.cgroup_psi.delta(),
        host_pressure: c.host_psi.delta(),
        context_notes: context_notes(c),
        host_mem_total_kb: c.host_last.as_ref().map(|h| h.mem_total_kb),
        host_min_available_kb: c.host_min_available_kb,
        swap_total_kb: c.host_last.as_ref().map(|h| h.swap_total_kb),
        swap_free_kb: c.host_last.as_ref().map(|h| h.swap_free_kb),
        page_size: c.host_last.as_ref().and_then(|h| h.page_size),
        vmstat: c.vm_delta(),
        disks: c
            .disk_busy_overall()
            .into_iter()
            .filter(|d| d.read_bytes + d.write_bytes > 0)
            .map(|d| DiskSummary {
                peak_busy_pct: c.disk_peak_busy.get(&d.name).copied().unwrap_or(d.busy_pct),
                name: d.name,
                dev: d.dev,
                busy_pct: d.busy_pct,
                read_bytes: d.read_bytes,
                write_bytes: d.write_bytes,
            })
            .collect(),
        filesystems: c.filesystems.clone(),
        train_steps: m.steps.len(),
        data_time: crate::model::steps::data_time_trend(&data_times),
        data_time_logged: crate::model::steps::logged_data_time(
            &m.steps.iter().map(|(_, s)| s.clone()).collect::<Vec<_>>(),
        ),
    }
}

fn dev_name(dev: u32) -> String {
    format!("{}:{}", dev >> 20, dev & 0xfffff)
}

/// A device's kernel name and what it is stacked on, from the host's disk samples.
fn device_names(dev: u32, disks: &[DiskStat]) -> (Option<String>, Vec<String>) {
    disks
        .iter()
        .find(|d| d.major == dev >> 20 && d.minor == dev & 0xfffff)
        .map(|d| (Some(d.name.clone()), d.lower.clone()))
        .unwrap_or_default()
}

/// The device whose row shows `dev`'s figures: `dev` itself, or, for a device the process only
/// has request latency on (no bytes) that sits under a stacked device it did use, that device.
/// Such a request is a clone's that the kernel side could not tie to its bio (the task started
/// it after queueing its next bio); its bytes are already counted above.
fn row_dev(dev: u32, bytes_on: impl Fn(u32) -> u64, devs: &[u32], disks: &[DiskStat]) -> u32 {
    if bytes_on(dev) > 0 {
        return dev;
    }
    let Some(name) = device_names(dev, disks).0 else { return dev };
    devs.iter()
        .copied()
        .find(|&top| top != dev && bytes_on(top) > 0 && device_names(top, disks).1.contains(&name))
        .unwrap_or(dev)
}

fn device_io(p: &crate::model::stats::ProcStats, disks: &[DiskStat]) -> Vec<DeviceIo> {
    let mut devs: Vec<u32> = p.io.keys().map(|k| k.dev).collect();
    devs.sort_unstable();
    devs.dedup();
    let bytes_on =
        |dev: u32| -> u64 { p.io.iter().filter(|(k, _)| k.dev == dev).map(|(_, c)| c.bytes).sum() };
    let row_of: Vec<(u32, u32)> =
        devs.iter().map(|&d| (d, row_dev(d, bytes_on, &devs, disks))).collect();
    let in_row = |dev: u32, row: u32| row_of.iter().any(|&(d, r)| d == dev && r == row);
    let mut rows: Vec<u32> = row_of.iter().map(|&(_, r)| r).collect();
    rows.sort_unstable();
    rows.dedup();
    rows.into_iter()
        .map(|dev| {
            let of = |op: IoOp| -> u64 {
                p.io.iter()
                    .filter(|(k, _)| k.dev == dev && k.op == op as u32)
                    .map(|(_, c)| c.bytes)
                    .sum()
            };
            let all = sum_io(p.io.iter().filter(|(k, _)| in_row(k.dev, dev)).map(|(_, c)| c));
            let (name, lower) = device_names(dev, disks);
            DeviceIo {
                dev: dev_name(dev),
                name,
                lower,
                read_bytes: of(IoOp::Read),
                write_bytes: of(IoOp::Write),
                reclaim_bytes: p
                    .io
                    .iter()
                    .filter(|(k, _)| k.dev == dev && k.in_reclaim)
                    .map(|(_, c)| c.bytes)
                    .sum(),
                bios: all.bios,
                requests: all.completed,
                avg_latency_us: (all.completed > 0)
                    .then(|| all.latency_ns_sum as f64 / all.completed as f64 / 1e3),
                max_latency_us: (all.completed > 0).then(|| all.latency_ns_max as f64 / 1e3),
            }
        })
        .collect()
}

fn process_summary(
    m: &Model,
    n: &crate::model::proctree::ProcNode,
    f: Option<&ProcFacts>,
) -> ProcessSummary {
    let empty = crate::model::stats::ProcStats::default();
    let p = m.procs.get(&n.pid).unwrap_or(&empty);
    let c = &p.counters;
    let h = p.reclaim_stalls.as_deref().filter(|h| !h.is_empty());
    ProcessSummary {
        pid: n.pid,
        ppid: n.ppid,
        comm: n.comm.clone(),
        role: m.tree.role(n.pid),
        worker_index: m.tree.worker_index(n.pid),
        dataloader_of: m.tree.dataloader_of(n.pid),
        thread_names: n.thread_names.values().cloned().collect(),
        thread_roles: n.thread_roles().map(|(tid, role)| ThreadRoleSummary { tid, role }).collect(),
        block_read_bytes: f.map_or(0, |f| f.read_bytes),
        block_write_bytes: f.map_or(0, |f| f.write_bytes),
        reclaim_io_bytes: f.map_or(0, |f| f.reclaim_io_bytes),
        io_by_device: device_io(p, &m.ctx.disks_last),
        direct_reclaim_count: c.direct_reclaim_count,
        direct_reclaim_ns: c.direct_reclaim_ns,
        memcg_reclaim_count: c.memcg_reclaim_count,
        memcg_reclaim_ns: c.memcg_reclaim_ns,
        reclaimed_pages: c.reclaimed_pages,
        reclaim_stall_p50_ns: h.map(|h| h.value_at_quantile(0.5)),
        reclaim_stall_p99_ns: h.map(|h| h.value_at_quantile(0.99)),
        reclaim_stall_max_ns: h.map(|h| h.max()),
        swapout_pages: c.swapout_anon_pages,
        file_writeback_pages: c.writeback_file_pages,
        kswapd_wakeups: c.kswapd_wakeups,
        throttled_count: c.throttled_count,
        throttled_us: c.throttled_us,
        peak_rss_kb: p.peak_rss_kb,
        peak_mem_kb: p.peak_mem_kb,
        first_rss_kb: p.first_rss_kb,
        rss_growth_kb: p.peak_rss_kb.saturating_sub(p.first_rss_kb.unwrap_or(p.peak_rss_kb)),
        peak_pss_kb: p.peak_pss_kb.map(|(kb, _)| kb),
        pss_growth_kb: p
            .peak_pss_kb
            .zip(p.first_pss_kb)
            .map(|((peak, _), (first, _))| peak.saturating_sub(first)),
        last_rss_kb: p.mem.rss_kb,
        last_swap_kb: p.mem.swap_kb,
        // Since the trace began, as the diagnosis counts them (not the process's lifetime).
        major_faults: f.map_or(0, |f| f.major_faults),
        identity: m.identities.get(&n.pid).cloned(),
        oom_killed: n.oom_killed,
        exit_code: n.exit_status(),
        exit_signal: n.exit_signal(),
        killed_by: n.killed_by.clone(),
        alive: n.alive(),
        offcpu: f.and_then(|f| f.offcpu.clone()),
        receiving_batches: f.and_then(|f| f.receiving),
        py_stacks: m.py_stacks.procs.get(&n.pid).map(|s| s.summary()),
        gpu_wait: f.and_then(|f| f.gpu_wait.clone()),
        gpu_wait_unmeasured: f
            .filter(|f| {
                (f.is_rank || (f.is_trainer && !has_ranks(m, n.pid))) && f.gpu_wait.is_none()
            })
            .map(|_| gpu_wait_unmeasured(m, n.pid)),
        time_split: f.and_then(crate::diagnose::verdict::time_split),
    }
}

/// The trainer is a launcher (torchrun, the script of torch.multiprocessing.spawn): its ranks
/// drive the GPUs, and its own unmeasured waits are no news.
fn has_ranks(m: &Model, pid: u32) -> bool {
    m.tree.iter().any(|c| c.ppid == pid && m.tree.role(c.pid) == crate::model::proctree::Role::Rank)
}

/// Why a trainer's or rank's GPU waits were not measured.
fn gpu_wait_unmeasured(m: &Model, pid: u32) -> String {
    match m.gpu_waits.probes(pid).and_then(|p| p.error.as_deref().map(|e| (p, e))) {
        Some((p, e)) => format!("its CUDA driver {} was not probed: {e}", p.library),
        None => "it mapped no CUDA driver (libcuda.so) while traced: a CPU-only job, or CUDA not yet initialised".to_string(),
    }
}

fn latency_summary(host: &crate::model::stats::HostStats) -> Vec<LatencySummary> {
    ["read", "write", "other"]
        .iter()
        .enumerate()
        .map(|(i, op)| {
            let b = &host.io_latency[i];
            LatencySummary {
                op,
                requests: b.iter().sum(),
                p50_us: log2_percentile(b, 0.5).map(|v| v as f64 / 1e3),
                p99_us: log2_percentile(b, 0.99).map(|v| v as f64 / 1e3),
            }
        })
        .filter(|l| l.requests > 0)
        .collect()
}

fn host_summary(host: &crate::model::stats::HostStats) -> HostSummary {
    let hc = |c: HostCounter| host.counters[c as usize];
    HostSummary {
        kswapd_swapout_pages: hc(HostCounter::KswapdSwapoutAnon),
        kswapd_file_writeback_pages: hc(HostCounter::KswapdWritebackFile),
        kswapd_io_bytes: hc(HostCounter::KswapdIoBytes),
        kswapd_episodes: host.kswapd_episodes,
        kswapd_ns: host.kswapd_ns,
        kswapd_wakeups_by_others: hc(HostCounter::KswapdWakeups),
        other_swapout_pages: hc(HostCounter::OtherSwapoutAnon),
        other_file_writeback_pages: hc(HostCounter::OtherWritebackFile),
        other_reclaim_io_bytes: hc(HostCounter::OtherReclaimIoBytes),
        other_direct_reclaim_count: hc(HostCounter::OtherDirectReclaimCount),
        other_direct_reclaim_ns: hc(HostCounter::OtherDirectReclaimNs),
        other_memcg_reclaim_count: hc(HostCounter::OtherMemcgReclaimCount),
        other_memcg_reclaim_ns: hc(HostCounter::OtherMemcgReclaimNs),
        other_throttled_count: hc(HostCounter::OtherThrottledCount),
    }
}

/// What each process looked like in the previous periodic summary (a hash of its entry).
#[derive(Default)]
pub struct PeriodicState {
    last: std::collections::HashMap<u32, u64>,
}

impl PeriodicState {
    /// Keeps in `s` only the processes that changed since the previous call.
    pub fn only_changed(&mut self, s: &mut Summary) {
        use std::hash::{Hash, Hasher};
        let present: std::collections::HashSet<u32> = s.processes.iter().map(|p| p.pid).collect();
        self.last.retain(|pid, _| present.contains(pid));
        s.processes.retain(|p| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            serde_json::to_vec(p).unwrap_or_default().hash(&mut h);
            self.last.insert(p.pid, h.finish()) != Some(h.finish())
        });
        s.processes_changed_only = true;
    }
}

impl Summary {
    /// The summary of the model at `now_ns`: the per-process figures the diagnosis also uses
    /// are its facts' (one derivation, one answer), the verdict the one decided from them
    /// (`pipeline::conclude`).
    pub fn from_model(
        m: &Model,
        facts: &Facts,
        now_ns: u64,
        is_final: bool,
        mut verdict: Verdict,
    ) -> Self {
        let host = &m.host;
        let lost = LostSummary {
            critical_ring: host.lost[LostCounter::CriticalRing as usize],
            bulk_ring: host.lost[LostCounter::BulkRing as usize],
            map_full: host.lost[LostCounter::MapFull as usize],
            undecodable: host.undecodable,
            program_skipped: m.overhead.programs.iter().map(|p| p.missed).sum(),
            flight_recorder: host.recording_gap_lines,
        };
        let facts: std::collections::HashMap<u32, &ProcFacts> =
            facts.procs.iter().map(|p| (p.pid, p)).collect();
        let processes =
            m.tree.iter().map(|n| process_summary(m, n, facts.get(&n.pid).copied())).collect();
        if lost.total() > 0 {
            // The verdict stands on what was seen; say that not everything was.
            verdict.text.push_str(&format!(
                " ({} events were lost: the figures behind this verdict are lower bounds.)",
                lost.total()
            ));
        }
        Summary {
            record_type: "summary",
            is_final,
            processes_changed_only: false,
            t_ns: now_ns,
            duration_s: now_ns.saturating_sub(m.start_ns) as f64 / 1e9,
            job: m.job_identity(),
            origin: m.origin.clone().map(|mut o| {
                let first = o.targets.first().and_then(|pid| m.tree.get(*pid));
                o.command = first.and_then(|n| n.cmdline.clone());
                o
            }),
            lost_events: lost.total(),
            lower_bounds: lost.lower_bounds(),
            folded: m
                .folded
                .iter()
                .map(|(role, t)| FoldedSummary { role: *role, totals: t.clone() })
                .collect(),
            lost,
            events: m.events,
            processes,
            oom_kills: m.oom_kills.clone(),
            signals: m.signals.clone(),
            host: host_summary(host),
            block_latency_us: latency_summary(host),
            overhead: m.overhead.clone(),
            gpu_status: m.gpu.status.clone(),
            gpu: m.gpu.summary.clone(),
            stalls: m.gpu.stalls.clone(),
            context: context_summary(m),
            kernel_log: KernelLogSummary::of(&m.kernel_log),
            verdict,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LostSummary;

    #[test]
    fn each_loss_names_the_figures_it_lowers() {
        let none = LostSummary {
            critical_ring: 0,
            bulk_ring: 0,
            map_full: 0,
            undecodable: 0,
            program_skipped: 0,
            flight_recorder: 0,
        };
        assert!(none.lower_bounds().is_empty());
        let some = LostSummary { map_full: 3227, program_skipped: 4, flight_recorder: 9, ..none };
        assert_eq!(some.total(), 3236, "skipped runs are said apart");
        let lb = some.lower_bounds();
        assert_eq!(lb.len(), 3);
        assert!(
            lb[0].starts_with("3227 updates lost (a kernel map was full): per-process block I/O"),
            "{lb:?}"
        );
        assert!(lb[1].starts_with("4 program runs skipped by the kernel"), "{lb:?}");
        assert!(lb[2].contains("flight recorder"), "{lb:?}");
    }

    #[test]
    fn a_stack_reports_on_the_device_used_with_its_lower_devices_latency() {
        use gpustall_common::counters::{IoCounters, IoOp};

        use crate::model::{host::DiskStat, stats::IoSlot};
        let disk = |name: &str, major, minor, lower: &[&str]| DiskStat {
            name: name.into(),
            major,
            minor,
            read_bytes: 0,
            write_bytes: 0,
            io_ticks_ms: 0,
            lower: lower.iter().map(|s| s.to_string()).collect(),
        };
        let disks =
            [disk("loop0", 7, 0, &[]), disk("dm-0", 253, 0, &["loop0"]), disk("vda", 254, 0, &[])];
        let (loop0, dm0, vda) = (7 << 20, 253 << 20, 254 << 20);
        let mut p = crate::model::stats::ProcStats::default();
        let slot = |dev, op: IoOp| IoSlot { dev, op: op as u32, in_reclaim: false };
        let c = |bytes, bios, completed, lat| IoCounters {
            bytes,
            bios,
            completed,
            latency_ns_sum: lat * completed,
            latency_ns_max: lat,
        };
        p.io.insert(slot(dm0, IoOp::Write), c(4 << 20, 4, 3, 1_000_000));
        // One clone's request the kernel side could not tie to its bio: latency, no bytes.
        p.io.insert(slot(loop0, IoOp::Write), c(0, 0, 1, 5_000_000));
        p.io.insert(slot(vda, IoOp::Read), c(8192, 2, 2, 100_000));
        let rows = super::device_io(&p, &disks);
        assert_eq!(rows.len(), 2, "{rows:?}");
        let dm = rows.iter().find(|r| r.dev == "253:0").expect("dm-0 row");
        assert_eq!(
            (dm.name.as_deref(), dm.lower.as_slice()),
            (Some("dm-0"), &["loop0".to_string()][..])
        );
        assert_eq!((dm.write_bytes, dm.bios), (4 << 20, 4));
        assert_eq!(dm.requests, 4, "3 of dm-0's own and 1 of its clone's on loop0");
        assert_eq!(dm.avg_latency_us, Some(2000.0), "4 requests: 3 x 1 ms and 1 x 5 ms");
        assert_eq!(dm.max_latency_us, Some(5000.0));
        let v = rows.iter().find(|r| r.dev == "254:0").expect("vda row");
        assert!(v.lower.is_empty() && v.read_bytes == 8192);
    }
}
