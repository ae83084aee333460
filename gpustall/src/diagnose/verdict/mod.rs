//! The answer: the most likely cause of a stall, the processes behind it, the evidence chain
//! (each link a measured figure, in time order) and advice computed from the measurements.
//!
//! `decide` is a pure function of [`Facts`], so every cause is unit-tested on hand-built facts.
//! `verdict.cause` is one of:
//! - `host_memory_oom`: memory ran out (cgroup limit or host) and the OOM killer killed a traced
//!   process;
//! - `host_memory_pressure`: traced processes stalled in reclaim and swapped, no kill (yet);
//! - `disk_full`: a filesystem the job writes to (its cwd, /tmp, /dev/shm) is full;
//! - `process_hung`: a traced process sat stopped (T) or in uninterruptible sleep (D);
//! - `gpu_throttling`: the GPU slowed itself (thermal or power) with no host-side cause;
//! - `disk_io_bound`: the job waited on its own disk reads/writes with no memory pressure;
//! - `deadlock`: the GPU (or the training log) stalled while every traced process sat idle
//!   (no CPU, no I/O), none of them stopped or in D state;
//! - `none_detected`: nothing measured explains a stall.

use serde::Serialize;

use crate::model::gpu::StallEpisode;
use crate::model::steps::DataTimeTrend;

#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Verdict {
    pub cause: &'static str,
    /// Most to least responsible.
    pub culprit_pids: Vec<u32>,
    /// The answer in one paragraph.
    pub text: String,
    /// Links of the chain, each a measured figure, in time order.
    pub evidence: Vec<String>,
    /// What to change, with the arithmetic shown.
    pub advice: Vec<String>,
}

/// One traced process, as the verdict needs it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcFacts {
    pub pid: u32,
    pub comm: String,
    pub is_worker: bool,
    pub is_trainer: bool,
    pub worker_index: Option<usize>,
    /// Memory held (resident + swapped out, from /proc) at the first sample and at the peak.
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
    pub reclaim_io_bytes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Sum of the latency of this process's completed block requests.
    pub io_wait_ns: u64,
    /// How long it lived within the trace (fork or start of tracing, to exit or end).
    pub lifetime_ns: u64,
    pub oom_killed: bool,
    pub exit_signal: Option<i32>,
    /// Stopped (T) or in D state: (state, wchan, since).
    pub stuck: Option<(char, String, u64)>,
    /// No CPU time and no I/O since.
    pub idle_since_ns: Option<u64>,
    pub alive: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct OomFacts {
    pub t_ns: u64,
    pub victim_pid: u32,
    pub victim_comm: String,
    pub anon_rss_kb: Option<u64>,
    pub trigger_pid: u32,
    pub trigger_comm: String,
    /// Who sent the SIGKILL and with which si_code (0x80: the kernel).
    pub killer: Option<(u32, String, i32)>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    pub start_ns: u64,
    pub end_ns: u64,
    pub procs: Vec<ProcFacts>,
    pub oom_kills: Vec<OomFacts>,
    /// The job's memory cgroup: (path, limit, peak usage, its own OOM-kill count).
    pub cgroup: Option<(String, Option<u64>, u64, Option<u64>)>,
    pub host_mem_total_kb: Option<u64>,
    pub host_min_available_kb: Option<u64>,
    pub swap_total_kb: Option<u64>,
    /// pswpout / pswpin over the trace (whole host).
    pub pswpout: u64,
    pub pswpin: u64,
    /// Busy % over the trace and peak one-second busy % of each disk.
    pub disks: Vec<(String, f64, f64)>,
    /// (path, used %, available bytes).
    pub filesystems: Vec<(String, f64, u64)>,
    pub gpu_stalls: Vec<StallEpisode>,
    /// GPU samples that showed thermal/power slowdown, and all GPU samples.
    pub gpu_throttled_samples: u64,
    pub gpu_samples: u64,
    pub gpu_throttle_reasons: Vec<String>,
    pub data_time: Option<DataTimeTrend>,
    /// When data_time first rose (3x baseline), from the training log.
    pub data_time_rise_ns: Option<u64>,
}

const MIB_KB: f64 = 1024.0;
/// Reclaim stall time at or above this fraction of the trace is memory pressure.
const PRESSURE_STALL_FRACTION: f64 = 0.01;
/// Swap-out at or above this many pages (64 MiB) is memory pressure.
const PRESSURE_SWAP_PAGES: u64 = 16_384;
const DISK_FULL_PCT: f64 = 98.0;
/// A process stopped or in D state this long is hung.
const HUNG_NS: u64 = 3_000_000_000;
/// A process waited on its disk I/O this share of its life: disk-bound.
const IO_WAIT_FRACTION: f64 = 0.5;
const DISK_BUSY_PCT: f64 = 80.0;

fn at(f: &Facts, t: u64) -> String {
    format!("+{:.1}s", t.saturating_sub(f.start_ns) as f64 / 1e9)
}

fn mib_kb(kb: u64) -> String {
    format!("{:.0} MiB", kb as f64 / MIB_KB)
}

fn mib_b(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / 1048576.0)
}

fn name(p: &ProcFacts) -> String {
    match p.worker_index {
        Some(i) => format!("DataLoader worker {i} (pid {})", p.pid),
        None if p.is_trainer => format!("the trainer (pid {})", p.pid),
        None => format!("{} (pid {})", p.comm, p.pid),
    }
}

/// Time-ordered evidence.
struct Chain(Vec<(u64, String)>);

impl Chain {
    fn push(&mut self, t: u64, s: String) {
        self.0.push((t, s));
    }
    fn done(mut self) -> Vec<String> {
        self.0.sort_by_key(|(t, _)| *t);
        self.0.into_iter().map(|(_, s)| s).collect()
    }
}

fn memory_chain(f: &Facts, chain: &mut Chain) {
    // Those that grew at least a tenth as much as the largest grower: the rest is noise.
    let max_growth =
        f.procs.iter().map(|p| p.peak_mem_kb.saturating_sub(p.first_mem_kb)).max().unwrap_or(0);
    let mut growers: Vec<&ProcFacts> = f
        .procs
        .iter()
        .filter(|p| {
            p.peak_mem_kb > p.first_mem_kb && (p.peak_mem_kb - p.first_mem_kb) * 10 >= max_growth
        })
        .collect();
    growers.sort_by_key(|p| std::cmp::Reverse(p.peak_mem_kb - p.first_mem_kb));
    for p in growers.iter().take(4) {
        chain.push(
            p.first_mem_ns,
            format!(
                "{at}: {} grew from {} to {} held (resident + swapped; peak at {})",
                name(p),
                mib_kb(p.first_mem_kb),
                mib_kb(p.peak_mem_kb),
                at(f, p.peak_mem_ns),
                at = at(f, p.first_mem_ns)
            ),
        );
    }
    if let Some((path, Some(limit), peak, _)) = &f.cgroup {
        chain.push(
            f.procs.iter().filter_map(|p| p.first_reclaim_ns).min().unwrap_or(f.end_ns),
            format!(
                "memory cgroup {path}: usage peaked at {} of its {} limit",
                mib_b(*peak),
                mib_b(*limit)
            ),
        );
    }
    let stalled: Vec<&ProcFacts> = f.procs.iter().filter(|p| p.reclaim_count > 0).collect();
    if let Some(first) = stalled.iter().filter_map(|p| p.first_reclaim_ns).min() {
        let total_ns: u64 = stalled.iter().map(|p| p.reclaim_ns).sum();
        let count: u64 = stalled.iter().map(|p| p.reclaim_count).sum();
        chain.push(
            first,
            format!(
                "{}: reclaim began; {} traced processes stalled a combined {:.2} s in {} reclaim episodes ({:.0}% of their time over the trace)",
                at(f, first),
                stalled.len(),
                total_ns as f64 / 1e9,
                count,
                100.0 * total_ns as f64 / (f.end_ns.saturating_sub(f.start_ns).max(1) as f64 * stalled.len() as f64)
            ),
        );
    }
    let swap: u64 = f.procs.iter().map(|p| p.swapout_pages).sum();
    let rio: u64 = f.procs.iter().map(|p| p.reclaim_io_bytes).sum();
    if swap > 0 || rio > 0 {
        chain.push(
            f.procs.iter().filter_map(|p| p.first_reclaim_ns).min().unwrap_or(f.end_ns) + 1,
            format!(
                "their reclaim swapped out {} pages ({}) and submitted {} of disk I/O (host pswpout {}, pswpin {})",
                swap,
                mib_b(swap * 4096),
                mib_b(rio),
                f.pswpout,
                f.pswpin
            ),
        );
    }
    for (disk, overall, peak) in f.disks.iter().filter(|d| d.2 >= 50.0) {
        chain.push(f.end_ns.saturating_sub(2), format!("disk {disk} was {overall:.0}% busy over the trace, {peak:.0}% at its busiest second"));
    }
}

fn stall_links(f: &Facts, chain: &mut Chain) {
    for s in &f.gpu_stalls {
        let thr = if s.throttle_reasons.is_empty() {
            String::new()
        } else {
            format!(", throttled: {}", s.throttle_reasons.join(", "))
        };
        chain.push(
            s.start_ns,
            format!(
                "{}: GPU {} idle (<= threshold) for {:.1} s{}{}",
                at(f, s.start_ns),
                s.gpu_index,
                s.duration_ns as f64 / 1e9,
                if s.pids.is_empty() {
                    String::new()
                } else {
                    format!(" while pids {:?} held it", s.pids)
                },
                thr
            ),
        );
    }
    if let (Some(tr), Some(t)) = (&f.data_time, f.data_time_rise_ns) {
        chain.push(
            t,
            format!(
                "{}: data_time rose from {:.3} s to {:.3} s per step (x{:.1}, max {:.3} s over {} steps)",
                at(f, t),
                tr.baseline_s,
                tr.recent_s,
                tr.ratio,
                tr.max_s,
                tr.steps
            ),
        );
    }
}

/// num_workers that fit the limit at the measured per-worker peak, with the arithmetic.
fn memory_advice(f: &Facts) -> Vec<String> {
    let mut advice = Vec::new();
    let workers: Vec<&ProcFacts> = f.procs.iter().filter(|p| p.is_worker).collect();
    let trainer_kb =
        f.procs.iter().filter(|p| p.is_trainer).map(|p| p.peak_mem_kb).max().unwrap_or(0);
    let limit_kb = f.cgroup.as_ref().and_then(|c| c.1).map(|b| b / 1024).or(f.host_mem_total_kb);
    if let (false, Some(limit_kb)) = (workers.is_empty(), limit_kb) {
        let n = workers.len() as u64;
        let per = workers.iter().map(|p| p.peak_mem_kb).max().unwrap_or(0).max(1);
        let total = trainer_kb + workers.iter().map(|p| p.peak_mem_kb).sum::<u64>();
        let budget = (limit_kb as f64 * 0.9) as u64;
        let fit = budget.saturating_sub(trainer_kb) / per;
        let verdict = if fit == 0 {
            format!("not even one worker fits: its peak alone ({}) exceeds what the trainer leaves ({}), so fewer workers cannot fix it: bound the per-worker growth", mib_kb(per), mib_kb(budget.saturating_sub(trainer_kb)))
        } else if fit < n {
            format!("num_workers <= {fit} fits at this per-worker peak")
        } else {
            format!("the workers fit at this peak (up to {fit}); look at what else holds memory")
        };
        advice.push(format!(
            "num_workers={n}: trainer {} + {n} workers x up to {} = {} at peak, against a {} limit. With 10% headroom ({}), {verdict}",
            mib_kb(trainer_kb),
            mib_kb(per),
            mib_kb(total),
            mib_kb(limit_kb),
            mib_kb(budget),
        ));
        advice.push(format!(
            "or give the job at least {} of memory (trainer + {n} x {} + 10%)",
            mib_kb(((trainer_kb + n * per) as f64 * 1.1) as u64),
            mib_kb(per)
        ));
    }
    // Still growing at their last sample (peak within 2 s of it), over at least 2 s of samples.
    let grew: Vec<&&ProcFacts> = workers
        .iter()
        .filter(|p| p.peak_mem_kb > 2 * p.first_mem_kb.max(1))
        .filter(|p| p.peak_mem_ns.saturating_sub(p.first_mem_ns) >= 2_000_000_000)
        .filter(|p| p.last_mem_ns.saturating_sub(p.peak_mem_ns) <= 2_000_000_000)
        .collect();
    if !grew.is_empty() {
        let rate = grew
            .iter()
            .map(|p| {
                (p.peak_mem_kb - p.first_mem_kb) as f64
                    / MIB_KB
                    / (p.peak_mem_ns - p.first_mem_ns) as f64
                    * 60e9
            })
            .sum::<f64>()
            / grew.len() as f64;
        advice.push(format!(
            "{} of {} workers kept growing until their last sample (about {:.0} MiB/min each) instead of levelling off: a per-worker cache or leak (unbounded lru_cache, decoded samples kept, copy-on-write of Python objects). Bound it; with persistent_workers=True that growth also carries across epochs, while persistent_workers=False restarts workers (and frees it) every epoch",
            grew.len(),
            workers.len(),
            rate
        ));
    }
    advice
}

pub fn decide(f: &Facts) -> Verdict {
    let duration = f.end_ns.saturating_sub(f.start_ns).max(1);
    let mut chain = Chain(Vec::new());
    stall_links(f, &mut chain);
    let stall_ns: u64 = f.procs.iter().map(|p| p.reclaim_ns).sum();
    let swap: u64 = f.procs.iter().map(|p| p.swapout_pages).sum();
    let mut by_memory: Vec<&ProcFacts> = f.procs.iter().collect();
    by_memory.sort_by_key(|p| {
        (
            std::cmp::Reverse(p.peak_mem_kb.saturating_sub(p.first_mem_kb)),
            std::cmp::Reverse(p.reclaim_ns),
        )
    });

    let kills: Vec<&OomFacts> =
        f.oom_kills.iter().filter(|o| f.procs.iter().any(|p| p.pid == o.victim_pid)).collect();
    if let Some(first) = kills.first() {
        memory_chain(f, &mut chain);
        for o in &kills {
            let by = match &o.killer {
                Some((pid, comm, 0x80)) => {
                    format!(", SIGKILL sent by the kernel in pid {pid} ({comm})")
                }
                Some((pid, comm, _)) => format!(", SIGKILL sent by pid {pid} ({comm})"),
                None => String::new(),
            };
            let scope = match &f.cgroup {
                Some((path, Some(_), _, Some(k))) if *k > 0 => format!("memory cgroup {path} OOM"),
                _ => "OOM".to_string(),
            };
            chain.push(
                o.t_ns,
                format!(
                    "{}: {scope} killer chose pid {} ({}) with anon-rss {} (invoked by pid {} ({})){by}",
                    at(f, o.t_ns),
                    o.victim_pid,
                    o.victim_comm,
                    o.anon_rss_kb.map_or("unknown".into(), mib_kb),
                    o.trigger_pid,
                    o.trigger_comm
                ),
            );
        }
        let mut culprits: Vec<u32> = kills.iter().map(|o| o.victim_pid).collect();
        culprits.extend(significant(&by_memory));
        dedup(&mut culprits);
        let victim = f.procs.iter().find(|p| p.pid == first.victim_pid);
        return Verdict {
            cause: "host_memory_oom",
            text: format!(
                "Host memory ran out, not the disk: {} was OOM-killed at {} after the job's processes stalled a combined {:.2} s in reclaim and swapped out {} pages{}. {}",
                victim.map_or(format!("pid {}", first.victim_pid), name),
                at(f, first.t_ns),
                stall_ns as f64 / 1e9,
                swap,
                gpu_clause(f),
                "A DataLoader that sees this raises \"DataLoader worker (pid N) is killed by signal: Killed\"; other ranks then time out."
            ),
            culprit_pids: culprits,
            evidence: chain.done(),
            advice: memory_advice(f),
        };
    }
    if let Some((path, pct, avail)) = f.filesystems.iter().find(|fs| fs.1 >= DISK_FULL_PCT) {
        chain.push(f.start_ns, format!("{path} is {pct:.1}% full ({} available)", mib_b(*avail)));
        return Verdict {
            cause: "disk_full",
            text: format!("The filesystem of {path} is full ({pct:.1}%): writes (checkpoints, logs, shared-memory batches) fail or block."),
            culprit_pids: f.procs.iter().filter(|p| p.write_bytes > 0).map(|p| p.pid).collect(),
            evidence: chain.done(),
            advice: vec![format!("free space on {path} or point checkpoints/caches elsewhere; /dev/shm full breaks DataLoader shared-memory batches")],
        };
    }
    if stall_ns as f64 / duration as f64 >= PRESSURE_STALL_FRACTION || swap >= PRESSURE_SWAP_PAGES {
        memory_chain(f, &mut chain);
        let mut culprits: Vec<u32> = significant(&by_memory);
        dedup(&mut culprits);
        return Verdict {
            cause: "host_memory_pressure",
            text: format!(
                "Memory pressure, not the disk: the job's processes stalled a combined {:.2} s in reclaim over a {:.1} s trace and swapped out {} pages{}. No OOM kill yet.",
                stall_ns as f64 / 1e9,
                duration as f64 / 1e9,
                swap,
                gpu_clause(f)
            ),
            culprit_pids: culprits,
            evidence: chain.done(),
            advice: memory_advice(f),
        };
    }
    let hung: Vec<&ProcFacts> = f
        .procs
        .iter()
        .filter(|p| {
            p.alive && p.stuck.as_ref().is_some_and(|s| f.end_ns.saturating_sub(s.2) >= HUNG_NS)
        })
        .collect();
    if !hung.is_empty() {
        for p in &hung {
            if let Some((state, wchan, since)) = &p.stuck {
                let what =
                    if *state == 'D' { "in uninterruptible sleep (D)" } else { "stopped (T)" };
                let w = if wchan.is_empty() { String::new() } else { format!(" in {wchan}") };
                chain.push(
                    *since,
                    format!(
                        "{}: {} {what}{w} for {:.1} s",
                        at(f, *since),
                        name(p),
                        f.end_ns.saturating_sub(*since) as f64 / 1e9
                    ),
                );
            }
        }
        return Verdict {
            cause: "process_hung",
            text: format!("{} is hung: it has not run for {:.1} s{}.", name(hung[0]), hung[0].stuck.as_ref().map_or(0.0, |s| f.end_ns.saturating_sub(s.2) as f64 / 1e9), gpu_clause(f)),
            culprit_pids: hung.iter().map(|p| p.pid).collect(),
            evidence: chain.done(),
            advice: vec!["a stopped process (SIGSTOP, a debugger, job control) must be continued (SIGCONT); one in D state waits in the kernel (wchan above): check the storage or network filesystem it waits on".into()],
        };
    }
    let throttled = f.gpu_stalls.iter().any(|s| !s.throttle_reasons.is_empty())
        || (f.gpu_samples > 0 && f.gpu_throttled_samples * 2 >= f.gpu_samples);
    if throttled && !f.gpu_throttle_reasons.is_empty() {
        chain.push(
            f.start_ns,
            format!(
                "{} of {} GPU samples showed {}",
                f.gpu_throttled_samples,
                f.gpu_samples,
                f.gpu_throttle_reasons.join(", ")
            ),
        );
        return Verdict {
            cause: "gpu_throttling",
            text: format!("The GPU slowed itself ({}) with no memory pressure or disk wait on the host.", f.gpu_throttle_reasons.join(", ")),
            culprit_pids: Vec::new(),
            evidence: chain.done(),
            advice: vec!["check cooling, power limits (nvidia-smi -q -d PERFORMANCE,POWER) and clocks; the host side is not the cause".into()],
        };
    }
    // Waiting on the disk most of its life (a process that lived half a second of a long trace
    // is judged on that half second).
    let waited = |p: &ProcFacts| p.io_wait_ns as f64 / p.lifetime_ns.max(1) as f64;
    let io_wait =
        f.procs.iter().filter(|p| p.lifetime_ns >= 200_000_000).map(waited).fold(0.0, f64::max);
    let io_bytes: u64 = f.procs.iter().map(|p| p.read_bytes + p.write_bytes).sum();
    let busy = f.disks.iter().map(|d| d.1).fold(0.0, f64::max);
    if io_bytes > 0 && (io_wait >= IO_WAIT_FRACTION || busy >= DISK_BUSY_PCT) {
        let mut procs: Vec<&ProcFacts> =
            f.procs.iter().filter(|p| p.read_bytes + p.write_bytes > 0).collect();
        procs.sort_by_key(|p| std::cmp::Reverse(p.io_wait_ns));
        for p in procs.iter().take(4) {
            chain.push(
                f.start_ns,
                format!(
                    "{} read {} and wrote {}, waiting {:.1} s on its block requests ({:.0}% of the {:.1} s it ran)",
                    name(p),
                    mib_b(p.read_bytes),
                    mib_b(p.write_bytes),
                    p.io_wait_ns as f64 / 1e9,
                    100.0 * waited(p),
                    p.lifetime_ns as f64 / 1e9
                ),
            );
        }
        for (disk, overall, peak) in &f.disks {
            if *overall >= 10.0 {
                chain.push(
                    f.start_ns + 1,
                    format!(
                        "disk {disk} was {overall:.0}% busy ({peak:.0}% at its busiest second)"
                    ),
                );
            }
        }
        chain.push(
            f.start_ns + 2,
            format!(
                "no memory pressure: {:.3} s in reclaim, {} pages swapped out",
                stall_ns as f64 / 1e9,
                swap
            ),
        );
        let rate = io_bytes as f64 / (duration as f64 / 1e9) / 1048576.0;
        return Verdict {
            cause: "disk_io_bound",
            text: format!("The data pipeline is disk-bound: the job's processes waited on their own block I/O ({rate:.0} MiB/s) with no memory pressure{}.", gpu_clause(f)),
            culprit_pids: procs.iter().map(|p| p.pid).collect(),
            evidence: chain.done(),
            advice: vec![format!("the pipeline reads at {rate:.0} MiB/s: more DataLoader workers or readahead only help if the disk has headroom; cache the dataset in page cache/local SSD, use larger sequential reads, or a faster store")],
        };
    }
    let stall_signal = !f.gpu_stalls.is_empty() || f.data_time_rise_ns.is_some();
    let alive: Vec<&ProcFacts> = f.procs.iter().filter(|p| p.alive).collect();
    if stall_signal
        && !alive.is_empty()
        && alive
            .iter()
            .all(|p| p.idle_since_ns.is_some_and(|s| f.end_ns.saturating_sub(s) >= HUNG_NS))
    {
        for p in &alive {
            if let Some(s) = p.idle_since_ns {
                chain.push(
                    s,
                    format!(
                        "{}: {} used no CPU and did no I/O for {:.1} s",
                        at(f, s),
                        name(p),
                        f.end_ns.saturating_sub(s) as f64 / 1e9
                    ),
                );
            }
        }
        return Verdict {
            cause: "deadlock",
            text: "The job stalled while every traced process sat idle (no CPU, no I/O, none stopped or in D state): a deadlock or a wait on something outside the job (a collective waiting for another rank, a lock).".into(),
            culprit_pids: alive.iter().map(|p| p.pid).collect(),
            evidence: chain.done(),
            advice: vec!["take Python stacks of the idle processes (py-spy dump --pid PID) and check the other ranks: one rank dead or slow leaves the rest waiting in a collective".into()],
        };
    }
    Verdict {
        cause: "none_detected",
        text: format!("No memory pressure, OOM kill, hung process, disk wait or GPU throttling in the traced tree{}.", gpu_clause(f)),
        culprit_pids: Vec::new(),
        evidence: chain.done(),
        advice: Vec::new(),
    }
}

fn gpu_clause(f: &Facts) -> String {
    let mut parts = Vec::new();
    if let Some(s) = f.gpu_stalls.first() {
        parts.push(format!(
            "; GPU {} sat idle {:.1} s from {}",
            s.gpu_index,
            s.duration_ns as f64 / 1e9,
            at(f, s.start_ns)
        ));
    }
    if let (Some(tr), Some(_)) = (&f.data_time, f.data_time_rise_ns) {
        parts.push(format!(
            "; data_time rose {:.3} -> {:.3} s per step",
            tr.baseline_s, tr.recent_s
        ));
    }
    parts.concat()
}

/// Processes that matter to the memory chain: at least a tenth of the largest growth, or of
/// the largest reclaim stall (helpers such as Python's resource tracker drop out).
fn significant(ranked: &[&ProcFacts]) -> Vec<u32> {
    let growth = |p: &ProcFacts| p.peak_mem_kb.saturating_sub(p.first_mem_kb);
    let max_growth = ranked.iter().map(|p| growth(p)).max().unwrap_or(0);
    let max_stall = ranked.iter().map(|p| p.reclaim_ns).max().unwrap_or(0);
    ranked
        .iter()
        .filter(|p| {
            (max_growth > 0 && growth(p) * 10 >= max_growth)
                || (max_stall > 0 && p.reclaim_ns * 10 >= max_stall)
        })
        .map(|p| p.pid)
        .collect()
}

fn dedup(v: &mut Vec<u32>) {
    let mut seen = std::collections::HashSet::new();
    v.retain(|p| seen.insert(*p));
}

#[cfg(test)]
mod tests;
