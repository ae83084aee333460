//! Gathers what the verdict needs from the model: a thin, mechanical step, so that the
//! decision itself (`verdict::decide`) stays a pure function of plain facts.

use gpustall_common::counters::IoOp;

use crate::model::gpu::StallEpisode;
use crate::model::host::{MemEvents, PsiDelta};
use crate::model::proctree::Role;
use crate::model::steps::DataTimeTrend;
use crate::model::Model;
use gpustall_common::events::SI_KERNEL;

/// One traced process, as the verdict needs it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcFacts {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    pub is_worker: bool,
    pub is_trainer: bool,
    /// A rank of a launcher (torchrun): its memory counts like the trainer's.
    pub is_rank: bool,
    /// Its rank in the job, where its identity says (`RANK`, a launcher's variable).
    pub rank: Option<u32>,
    /// When it started (fork, or the start of tracing) and exited, if it did.
    pub started_ns: u64,
    pub exit_ns: Option<u64>,
    /// The memory figures below are proportional (PSS: pages shared copy-on-write with the
    /// trainer count once across the job); else resident + swapped, which counts them in each.
    pub mem_is_pss: bool,
    pub worker_index: Option<usize>,
    /// A worker's DataLoader: the trainer or rank it serves (its parent, or the owner of the
    /// forkserver that started it). Its advice is per DataLoader.
    pub dataloader_pid: Option<u32>,
    /// A trainer or rank with a pin-memory thread (`pt_data_pin`): that thread, not the main
    /// one, waits for the workers, and the kernel counts its waits as its process's.
    pub pin_memory_thread: bool,
    /// Memory held at the first sample and at the peak seen during the trace (never VmHWM,
    /// which may predate it): proportional where smaps_rollup was read, else resident +
    /// swapped out.
    pub first_mem_kb: u64,
    pub first_mem_ns: u64,
    pub peak_mem_kb: u64,
    pub peak_mem_ns: u64,
    /// The last moment it was sampled (its exit, or the end of the trace).
    pub last_mem_ns: u64,
    pub reclaim_count: u64,
    pub reclaim_ns: u64,
    pub first_reclaim_ns: Option<u64>,
    pub swapout_pages: u64,
    /// Major page faults during the trace: pages read back from swap (or from files mapped).
    pub major_faults: u64,
    pub reclaim_io_bytes: u64,
    /// Bytes it read from block devices: its bios as the kernel side counted them at submission;
    /// where the job's cgroup limits its I/O, the kernel's own per-task count (/proc/PID/io)
    /// when larger, as the throttle issues held bios from its own kernel thread
    /// (`read_bytes_from_proc`).
    pub read_bytes: u64,
    pub read_bytes_from_proc: bool,
    pub write_bytes: u64,
    /// Sum of the latency of this process's completed block requests.
    pub io_wait_ns: u64,
    /// How long it lived within the trace (fork or start of tracing, to exit or end).
    pub lifetime_ns: u64,
    pub oom_killed: bool,
    pub exit_signal: Option<i32>,
    /// Who sent the fatal signal that ended it, when one was seen.
    pub killed_by: Option<KillerFacts>,
    /// When that signal was sent.
    pub killed_ns: Option<u64>,
    /// Stopped (T) or in D state, and since when.
    pub stuck: Option<Stuck>,
    /// No CPU time and no I/O since.
    pub idle_since_ns: Option<u64>,
    /// Not scheduled at all since, and where it sleeps (its wchan).
    pub asleep: Option<Asleep>,
    pub alive: bool,
    /// Off-CPU time and waits (sched_switch / sched_waking), when the kernel measured them.
    pub offcpu: Option<crate::model::offcpu::OffCpuSummary>,
    /// CPU time (utime + stime, /proc/PID/stat) between its first and last reading during the
    /// trace, and the span those readings cover (`model::cpu`).
    pub cpu_ns: Option<u64>,
    /// A trainer's or rank's CPU time since its first DataLoader worker was seen, and the span
    /// that covers (its start-up left out).
    pub cpu_since_workers: Option<(u64, u64)>,
    /// From that first worker's beat to its exit or the end of the trace.
    pub since_workers_ns: Option<u64>,
    /// Its CPU time receiving batches, from its Python stacks (a trainer or rank).
    pub receiving: Option<crate::model::pystacks::Receiving>,
    /// A trainer's or rank's time inside the CUDA driver's synchronising calls, where they
    /// were probed (`model::gpuwait`).
    pub gpu_wait: Option<crate::model::gpuwait::GpuWaitSummary>,
    pub cpu_span_ns: u64,
    /// Readings of it during the trace, and those that found it blocked reading a socket, with
    /// the socket's peer ("" unknown) and how often.
    pub readings: u64,
    pub socket_waits: Vec<(String, u64)>,
    /// Readings that found it blocked reading a file on a network or FUSE filesystem, by
    /// "source (type at mount point)".
    pub remote_file_waits: Vec<(String, u64)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct OomFacts {
    pub t_ns: u64,
    pub victim_pid: u32,
    pub victim_comm: String,
    pub anon_rss_kb: Option<u64>,
    pub trigger_pid: u32,
    pub trigger_comm: String,
    /// Who sent the SIGKILL.
    pub killer: Option<KillerFacts>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    pub start_ns: u64,
    pub end_ns: u64,
    pub procs: Vec<ProcFacts>,
    pub oom_kills: Vec<OomFacts>,
    /// The job's memory cgroup.
    pub cgroup: Option<CgroupFacts>,
    pub host_mem_total_kb: Option<u64>,
    pub host_min_available_kb: Option<u64>,
    /// /proc/pressure/memory during the trace; `None` without PSI.
    pub host_pressure: Option<PsiDelta>,
    pub swap_total_kb: Option<u64>,
    /// The kernel's page size, the unit of swap-out pages and pswpin/pswpout (`None`: a
    /// recording made before it was recorded, on 4 KiB pages; see [`Facts::page_bytes`]).
    pub page_size: Option<u64>,
    /// pswpout / pswpin over the trace (whole host).
    pub pswpout: u64,
    pub pswpin: u64,
    pub disks: Vec<DiskFacts>,
    pub filesystems: Vec<FsFacts>,
    /// Block I/O limits on the job's cgroup and its ancestors.
    pub io_limits: Vec<crate::model::host::IoLimit>,
    pub gpu_stalls: Vec<StallEpisode>,
    /// GPU samples that showed thermal/power slowdown, and all GPU samples.
    pub gpu_throttled_samples: u64,
    pub gpu_samples: u64,
    pub gpu_throttle_reasons: Vec<String>,
    pub data_time: Option<DataTimeTrend>,
    /// When data_time first rose (3x baseline), from the training log.
    pub data_time_rise_ns: Option<u64>,
    /// The CPUs the job may use, its quota's throttling, the host's load (`model::cpu`).
    pub cpu: Option<CpuFacts>,
    /// The GPUs' average utilisation over their samples.
    pub gpu_util_avg_pct: Option<f64>,
    /// The kernel log's lines that matter (`model::kernlog`), folded, the records the reader
    /// missed and the lines dropped past the cap of distinct lines.
    pub kernel_log: Vec<crate::model::kernlog::KernelLogLine>,
    pub kernel_log_missed: u64,
    pub kernel_log_dropped: u64,
    /// Critical Xid errors NVML reported (its event sets).
    pub gpu_xids: Vec<crate::model::gpu::GpuXid>,
    /// The GPUs as their latest samples name them (index, UUID, PCI address).
    pub gpus: Vec<GpuName>,
    /// The job's Python stacks, per process, where they were sampled.
    pub py_stacks: crate::model::pystacks::PyStacks,
}

/// A GPU's names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuName {
    pub index: u32,
    pub uuid: String,
    pub pci_bus_id: Option<String>,
}

/// The job's CPU surroundings over the trace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CpuFacts {
    pub online_cpus: u32,
    /// CPUs the trainer may run on (its affinity: cpuset, taskset).
    pub allowed_cpus: Option<u32>,
    /// The job's CPU cgroup path, and each level's quota and throttling over the trace.
    pub cgroup_path: Option<String>,
    pub throttling: Vec<crate::model::cpu::Throttling>,
    /// The host's CPUs' busy share.
    pub host_busy: Option<f64>,
    /// The processes outside the job that used the most CPU (pid, comm, ns), and all of them.
    pub others: Vec<(u32, String, u64)>,
    pub others_ns: u64,
    /// The span of the readings.
    pub span_ns: u64,
}

/// Page size of recordings that did not record one (all were made on 4 KiB pages).
pub const DEFAULT_PAGE_SIZE: u64 = 4096;

/// A wait for data in progress is named in the outputs from this long (a batch that is a
/// second late is news; a step's usual wait is not).
pub const OPEN_WAIT_SHOWN_NS: u64 = 1_000_000_000;

impl ProcFacts {
    /// Its time blocked on I/O: the larger of its block requests' latency (requests in
    /// flight together add up) and its time off CPU in D state on I/O, where the kernel
    /// measured it (a throttled bio's wait is no request's latency until it is issued).
    pub fn io_blocked_ns(&self) -> u64 {
        self.io_wait_ns.max(self.offcpu.as_ref().map_or(0, |o| o.offcpu_io_ns))
    }

    /// [`Self::io_blocked_ns`] as a share of its life in the trace.
    pub fn io_blocked_share(&self) -> f64 {
        self.io_blocked_ns() as f64 / self.lifetime_ns.max(1) as f64
    }
}

impl Facts {
    /// Bytes in one of the kernel's pages: what a swap-out or pswpin page is worth.
    pub fn page_bytes(&self) -> u64 {
        self.page_size.unwrap_or(DEFAULT_PAGE_SIZE)
    }
}

/// Who sent a fatal signal.
#[derive(Debug, Clone, PartialEq)]
pub struct KillerFacts {
    pub pid: u32,
    pub comm: String,
    /// 0x80 (SI_KERNEL): the kernel sent it.
    pub si_code: i32,
}

/// A process that has not been scheduled since `since_ns` (a lock, a queue nothing feeds).
#[derive(Debug, Clone, PartialEq)]
pub struct Asleep {
    /// Where in the kernel it sleeps (may be empty).
    pub wchan: String,
    pub since_ns: u64,
}

/// A process that stopped making progress.
#[derive(Debug, Clone, PartialEq)]
pub struct Stuck {
    /// 'T' (stopped) or 'D' (uninterruptible sleep).
    pub state: char,
    /// Where in the kernel it waits (may be empty).
    pub wchan: String,
    pub since_ns: u64,
}

/// The job's memory cgroup.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CgroupFacts {
    pub path: String,
    /// `None`: no limit. The smallest on the path to the root: the job's budget.
    pub limit_bytes: Option<u64>,
    /// The ancestor that sets `limit_bytes`, when not the job's own cgroup.
    pub limit_set_by: Option<String>,
    pub swap_limit_bytes: Option<u64>,
    pub peak_usage_bytes: u64,
    /// Its own OOM kills during the trace, where the kernel keeps a count.
    pub oom_kills: Option<u64>,
    /// The limiting cgroup's memory.events during the trace (v2).
    pub events: Option<MemEvents>,
    /// The job cgroup's memory PSI during the trace (v2 with PSI on).
    pub pressure: Option<PsiDelta>,
}

impl CgroupFacts {
    /// The cgroup whose limit binds: its events are that cgroup's.
    pub fn limiting_path(&self) -> &str {
        self.limit_set_by.as_deref().unwrap_or(&self.path)
    }
}

/// One disk over the trace.
#[derive(Debug, Clone, PartialEq)]
pub struct DiskFacts {
    pub name: String,
    /// Busy % over the whole trace.
    pub busy_pct: f64,
    /// Busy % of its busiest second.
    pub peak_busy_pct: f64,
}

/// A filesystem the job writes to, at its fullest.
#[derive(Debug, Clone, PartialEq)]
pub struct FsFacts {
    pub path: String,
    pub used_pct: f64,
    pub avail_bytes: u64,
    pub total_bytes: u64,
}

/// A process's block reads, and whether they are the kernel's per-task count (see
/// `ProcFacts::read_bytes`). /proc/PID/io counts from the process's start: one forked during
/// the trace is counted whole, one already running from its first reading.
fn read_bytes(
    m: &Model,
    n: &crate::model::proctree::ProcNode,
    p: &crate::model::stats::ProcStats,
    watch: Option<&crate::model::host::TaskWatch>,
) -> (u64, bool) {
    let traced = p.io_bytes(IoOp::Read, None);
    if m.ctx.io_limits.is_empty() {
        return (traced, false);
    }
    let counted = watch.and_then(|w| {
        let last = w.last.read_bytes?;
        let first = if n.started_ns > m.start_ns { 0 } else { w.first_read_bytes.unwrap_or(last) };
        Some(last.saturating_sub(first))
    });
    match counted {
        Some(c) if c > traced + traced / 10 + (1 << 20) => (c, true),
        _ => (traced, false),
    }
}

/// From the beat a trainer's first DataLoader worker was seen to its exit or `now_ns`.
fn since_workers(m: &Model, n: &crate::model::proctree::ProcNode, now_ns: u64) -> Option<u64> {
    let from = m.ctx.cpu.mark_ns(n.pid)?;
    Some(n.exit_ns.unwrap_or(now_ns).saturating_sub(from))
}

/// One process as the verdict sees it.
fn proc_facts(m: &Model, n: &crate::model::proctree::ProcNode, now_ns: u64) -> ProcFacts {
    let empty = crate::model::stats::ProcStats::default();
    let p = m.procs.get(&n.pid).unwrap_or(&empty);
    let c = &p.counters;
    let role = m.tree.role(n.pid);
    let watch = m.ctx.tasks.get(&n.pid);
    let read_bytes = read_bytes(m, n, p, watch);
    let ((first_kb, first_ns), (peak_kb, peak_ns)) = match (p.first_pss_kb, p.peak_pss_kb) {
        (Some(first), Some(peak)) => (first, peak),
        // Never sampled (its peak is the OOM kill's figure): no growth was measured.
        _ if p.first_mem_kb.is_none() => ((0, p.peak_mem_ns), (p.peak_mem_kb, p.peak_mem_ns)),
        _ => ((p.first_mem_kb.unwrap_or(0), p.first_rss_ns), (p.peak_mem_kb, p.peak_mem_ns)),
    };
    let facts = ProcFacts {
        offcpu: m
            .offcpu
            .summary(n.pid, |pid| matches!(m.tree.role(pid), Role::Trainer | Role::Rank)),
        pid: n.pid,
        ppid: n.ppid,
        comm: n.comm.clone(),
        is_worker: role == Role::DataloaderWorker,
        is_trainer: role == Role::Trainer,
        is_rank: role == Role::Rank,
        rank: m.identities.get(&n.pid).and_then(|i| i.rank),
        started_ns: n.started_ns,
        exit_ns: n.exit_ns,
        mem_is_pss: p.peak_pss_kb.is_some(),
        worker_index: m.tree.worker_index(n.pid),
        dataloader_pid: m.tree.dataloader_of(n.pid),
        pin_memory_thread: n
            .thread_roles()
            .any(|(_, r)| r == crate::model::proctree::ThreadRole::PinMemory),
        first_mem_kb: first_kb,
        first_mem_ns: first_ns,
        peak_mem_kb: peak_kb,
        peak_mem_ns: peak_ns,
        last_mem_ns: m.ctx.last_ns.min(n.exit_ns.unwrap_or(u64::MAX)),
        reclaim_count: c.reclaim_count(),
        reclaim_ns: c.reclaim_ns(),
        first_reclaim_ns: p.first_reclaim_ns,
        swapout_pages: c.swapout_anon_pages,
        major_faults: p.mem.majflt.saturating_sub(p.first_majflt.unwrap_or(p.mem.majflt)),
        reclaim_io_bytes: p.io.iter().filter(|(k, _)| k.in_reclaim).map(|(_, v)| v.bytes).sum(),
        read_bytes: read_bytes.0,
        read_bytes_from_proc: read_bytes.1,
        write_bytes: p.io_bytes(IoOp::Write, None),
        io_wait_ns: p.io.values().map(|v| v.latency_ns_sum).sum(),
        lifetime_ns: n.exit_ns.unwrap_or(now_ns).saturating_sub(n.started_ns.max(m.start_ns)),
        oom_killed: n.oom_killed,
        exit_signal: n.exit_signal(),
        killed_by: n.killed_by.as_ref().map(|k| KillerFacts {
            pid: k.sender_pid,
            comm: k.sender_comm.clone(),
            si_code: k.si_code,
        }),
        killed_ns: n.killed_by.as_ref().map(|k| k.t_ns),
        stuck: watch.and_then(|w| {
            w.stuck_since_ns.map(|since_ns| Stuck {
                state: w.last.state,
                wchan: w.last.wchan.clone(),
                since_ns,
            })
        }),
        idle_since_ns: watch.and_then(|w| w.idle_since_ns),
        asleep: watch.and_then(|w| {
            w.asleep_since_ns.map(|since_ns| Asleep { wchan: w.last.wchan.clone(), since_ns })
        }),
        alive: n.alive(),
        cpu_ns: m.ctx.cpu.cpu_ns(n.pid, n.started_ns, m.start_ns).map(|(ns, _)| ns),
        receiving: None,
        gpu_wait: m.gpu_waits.summary(n.pid),
        cpu_since_workers: m.ctx.cpu.cpu_ns_since_mark(n.pid),
        since_workers_ns: since_workers(m, n, now_ns),
        cpu_span_ns: m.ctx.cpu.cpu_ns(n.pid, n.started_ns, m.start_ns).map_or(0, |(_, s)| s),
        readings: m.ctx.cpu.readings.get(&n.pid).copied().unwrap_or(0),
        socket_waits: by_peer(&m.ctx.cpu.socket, n.pid),
        remote_file_waits: by_peer(&m.ctx.cpu.remote_file, n.pid),
    };
    ProcFacts { receiving: receiving(m, &facts), ..facts }
}

/// `p`'s time receiving batches, from its main thread's stack samples (a sample sees a thread
/// in state R whether it runs or waits for a CPU), each standing for the time since the one
/// before it.
fn receiving(m: &Model, p: &ProcFacts) -> Option<crate::model::pystacks::Receiving> {
    crate::model::pystacks::Receiving::estimate(m.py_stacks.get(p.pid)?)
}

type PeerReadings = std::collections::BTreeMap<u32, std::collections::BTreeMap<String, u64>>;

/// `pid`'s readings blocked on each peer or mount, from one of `CpuTrack`'s maps.
fn by_peer(map: &PeerReadings, pid: u32) -> Vec<(String, u64)> {
    map.get(&pid).map(|by| by.iter().map(|(p, c)| (p.clone(), *c)).collect()).unwrap_or_default()
}

/// The CPU figures of the trace, when any were read.
fn cpu_facts(m: &Model) -> Option<CpuFacts> {
    let t = &m.ctx.cpu;
    let last = t.last.as_ref()?;
    Some(CpuFacts {
        online_cpus: last.online_cpus,
        allowed_cpus: last.allowed_cpus,
        cgroup_path: last.cgroup.as_ref().map(|c| c.path.clone()),
        throttling: t.throttling(),
        host_busy: t.host_busy(),
        others: t.top_others(5),
        others_ns: t.others_ns(),
        span_ns: t.last_ns.saturating_sub(t.first_ns),
    })
}

fn oom_facts(m: &Model, o: &crate::model::OomKill) -> OomFacts {
    OomFacts {
        t_ns: o.t_ns,
        victim_pid: o.victim_pid,
        victim_comm: o.victim_comm.clone(),
        anon_rss_kb: o.rss.map(|r| r.anon_rss_kb),
        trigger_pid: o.trigger_pid,
        trigger_comm: o.trigger_comm.clone(),
        killer: m.tree.get(o.victim_pid).and_then(|n| n.killed_by.as_ref()).map(|k| KillerFacts {
            pid: k.sender_pid,
            comm: k.sender_comm.clone(),
            si_code: k.si_code,
        }),
    }
}

/// OOM kills whose oom:mark_victim record never came (a full ring, a kernel without the
/// tracepoint, a trace started between the victim's choice and its SIGKILL): a traced process
/// killed by SIGKILL that the kernel itself sent (SI_KERNEL), while the kernel's own counters
/// (/proc/vmstat oom_kill, the cgroup's oom_kill) moved during the trace. Its RSS is unknown.
fn lost_oom_kills(m: &Model, recorded: &[OomFacts], counted: bool) -> Vec<OomFacts> {
    if !counted {
        return Vec::new();
    }
    m.tree
        .iter()
        .filter(|n| !recorded.iter().any(|o| o.victim_pid == n.pid))
        .filter_map(|n| {
            let k = n.killed_by.as_ref().filter(|k| k.sig == 9 && k.si_code == SI_KERNEL)?;
            Some(OomFacts {
                t_ns: k.t_ns,
                victim_pid: n.pid,
                victim_comm: n.comm.clone(),
                anon_rss_kb: None,
                trigger_pid: k.sender_pid,
                trigger_comm: k.sender_comm.clone(),
                killer: Some(KillerFacts {
                    pid: k.sender_pid,
                    comm: k.sender_comm.clone(),
                    si_code: k.si_code,
                }),
            })
        })
        .collect()
}

pub fn from_model(m: &Model, now_ns: u64) -> Facts {
    let mut procs = proc_facts_all(m, now_ns);
    let ctx = &m.ctx;
    let vm = ctx.vm_delta();
    let mut oom_kills: Vec<OomFacts> = m.oom_kills.iter().map(|o| oom_facts(m, o)).collect();
    let counted = vm.oom_kill > 0 || ctx.cgroup_oom_kills().is_some_and(|k| k > 0);
    oom_kills.extend(lost_oom_kills(m, &oom_kills, counted));
    for p in &mut procs {
        p.oom_killed |= oom_kills.iter().any(|o| o.victim_pid == p.pid);
    }
    let (data_time, data_time_rise_ns) = data_time_facts(m);
    Facts {
        start_ns: m.start_ns,
        end_ns: now_ns,
        procs,
        oom_kills,
        cgroup: cgroup_facts(m),
        host_pressure: ctx.host_psi.delta(),
        host_mem_total_kb: ctx.host_last.as_ref().map(|h| h.mem_total_kb),
        host_min_available_kb: ctx.host_min_available_kb,
        swap_total_kb: ctx.host_last.as_ref().map(|h| h.swap_total_kb),
        page_size: ctx.host_last.as_ref().and_then(|h| h.page_size),
        pswpout: vm.pswpout,
        pswpin: vm.pswpin,
        disks: disk_facts(m),
        filesystems: ctx
            .filesystems
            .iter()
            .map(|f| FsFacts {
                path: f.path.clone(),
                used_pct: f.used_pct,
                avail_bytes: f.avail_bytes,
                total_bytes: f.total_bytes,
            })
            .collect(),
        io_limits: m.ctx.io_limits.clone(),
        gpu_stalls: m.gpu.stalls.clone(),
        gpu_throttled_samples: m.gpu.throttled_samples,
        gpu_samples: m.gpu.samples,
        gpu_throttle_reasons: m.gpu.throttle_reasons.iter().cloned().collect(),
        data_time,
        data_time_rise_ns,
        kernel_log: m.kernel_log.lines.clone(),
        kernel_log_missed: m.kernel_log.missed,
        kernel_log_dropped: m.kernel_log.dropped,
        gpu_xids: m.gpu.xids.clone(),
        gpus: gpu_names(m),
        py_stacks: m.py_stacks.clone(),
        cpu: cpu_facts(m),
        gpu_util_avg_pct: m.gpu.summary.as_ref().and_then(|g| g.util_avg_pct()),
    }
}

/// Every process of the tree; folded processes still count for the disk, as one process of
/// all their I/O and lives.
fn proc_facts_all(m: &Model, now_ns: u64) -> Vec<ProcFacts> {
    let mut procs: Vec<ProcFacts> = m.tree.iter().map(|n| proc_facts(m, n, now_ns)).collect();
    for (role, t) in &m.folded {
        procs.push(ProcFacts {
            comm: format!("{} folded {role:?} processes", t.processes),
            read_bytes: t.block_read_bytes,
            write_bytes: t.block_write_bytes,
            io_wait_ns: t.io_wait_ns,
            lifetime_ns: t.lifetime_ns,
            ..Default::default()
        });
    }
    procs
}

fn cgroup_facts(m: &Model) -> Option<CgroupFacts> {
    let ctx = &m.ctx;
    ctx.cgroup_last.as_ref().map(|c| CgroupFacts {
        path: c.path.clone(),
        limit_bytes: c.limit_bytes,
        limit_set_by: c.limit_set_by.clone(),
        swap_limit_bytes: c.swap_limit_bytes,
        peak_usage_bytes: ctx.cgroup_peak_usage,
        oom_kills: ctx.cgroup_oom_kills(),
        events: ctx.cgroup_events(),
        pressure: ctx.cgroup_psi.delta(),
    })
}

fn disk_facts(m: &Model) -> Vec<DiskFacts> {
    let peaks = &m.ctx.disk_peak_busy;
    m.ctx
        .disk_busy_overall()
        .into_iter()
        .map(|d| {
            let peak = peaks.get(&d.name).copied().unwrap_or(d.busy_pct);
            DiskFacts { name: d.name, busy_pct: d.busy_pct, peak_busy_pct: peak }
        })
        .collect()
}

/// The training log's data_time trend, and when it first rose.
fn data_time_facts(m: &Model) -> (Option<crate::model::steps::DataTimeTrend>, Option<u64>) {
    let data_times: Vec<f64> = m.steps.iter().filter_map(|(_, s)| s.data_time_s).collect();
    let data_time = crate::model::steps::data_time_trend(&data_times);
    let rise_ns = data_time.as_ref().and_then(|t| t.first_rise_index).and_then(|i| {
        m.steps.iter().filter(|(_, s)| s.data_time_s.is_some()).nth(i).map(|(t, _)| *t)
    });
    (data_time, rise_ns)
}

fn gpu_names(m: &Model) -> Vec<GpuName> {
    let names = m.gpu.latest.iter().map(|g| GpuName {
        index: g.index,
        uuid: g.uuid.clone(),
        pci_bus_id: g.pci_bus_id.clone(),
    });
    names.collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::{Event, Header};
    use crate::model::samples::Sample;

    /// A traced worker killed by the kernel's SIGKILL, with no mark_victim record.
    fn killed(si_code: i32) -> Model {
        let mut m = Model::default();
        let seed = |pid, ppid| Sample::Seed {
            t_ns: 0,
            pid,
            ppid,
            comm: "python".into(),
            is_target: pid == 10,
        };
        m.observe(&seed(10, 1));
        m.observe(&seed(11, 10));
        m.apply(&Event::Signal {
            h: Header { t_ns: 5, pid: 11, tid: 11, comm: "python".into() },
            sig: 9,
            code: si_code,
            target_pid: 11,
            target_tid: Some(11),
            result: 0,
            target_comm: "python".into(),
        });
        m
    }

    #[test]
    fn a_kernel_sigkill_with_the_oom_counter_moved_is_an_oom_kill_whose_record_was_lost() {
        let m = killed(SI_KERNEL);
        let lost = lost_oom_kills(&m, &[], true);
        assert_eq!(lost.len(), 1);
        assert_eq!((lost[0].victim_pid, lost[0].anon_rss_kb, lost[0].t_ns), (11, None, 5));
        assert!(lost_oom_kills(&m, &[], false).is_empty(), "no kernel counter moved");
        assert!(lost_oom_kills(&m, &lost, true).is_empty(), "already recorded");
        assert!(lost_oom_kills(&killed(0), &[], true).is_empty(), "a kill(2) from user space");
    }
}
