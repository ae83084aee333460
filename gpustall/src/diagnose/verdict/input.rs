//! The input pipeline starved for reasons other than memory: the causes whose fix is more
//! workers, more CPU or cheaper work per sample, never fewer workers. Each starts from the
//! trainer's wait for data (`datawait`, over [`DATA_WAIT_SHARE`] of its time) and asks what the
//! workers were doing meanwhile, from the kernel's off-CPU split (run-queue, interruptible,
//! uninterruptible) and the CPU time /proc/PID/stat gave (`model::cpu`):
//! - `cpu_quota_throttled`: the job's cgroup CPU quota throttled it (cpu.stat over the trace);
//! - `busy_host`: its workers waited in the run queue behind processes outside the job;
//! - `network_bound`: its workers sat blocked reading sockets or files on a network or FUSE
//!   filesystem (sampled /proc/PID/syscall);
//! - `straggler_worker`: one worker ended most of the trainer's waits while its siblings'
//!   batches sat ready (in-order delivery);
//! - `cpu_bound_pipeline`: its workers were on CPU most of their time: too few of them, or each
//!   sample too costly; the advice computes the worker count that keeps up;
//! - `trainer_bound`: the trainer did not wait for data but was on CPU while the GPU idled: the
//!   main process's own per-batch work starves the GPU.
//!
//! The memory chain, a disk-bound pipeline and a hang come earlier in `RULES`.

use super::{
    datawait::{waiters, DATA_WAIT_SHARE},
    evidence::{gpu_clause, mib_kb, name, workers_n, Chain},
    rules::Ctx,
    Cause, Verdict,
};
use crate::diagnose::facts::{CpuFacts, Facts, ProcFacts};
use crate::model::cpu::Throttling;

/// Workers on CPU at least this share of their time are CPU-bound.
const ON_CPU_SHARE: f64 = 0.5;
/// Workers runnable but waiting for a CPU this share of their time: the CPUs were contended.
const RUNQUEUE_SHARE: f64 = 0.25;
/// Processes outside the job that used at least this many CPUs on average make a busy host.
const OTHERS_CPUS: f64 = 0.5;
/// A quota that throttled the job in at least this share of its periods starved it.
const THROTTLED_SHARE: f64 = 0.2;
/// Workers found blocked reading a socket in at least this share of the readings.
const SOCKET_SHARE: f64 = 0.5;
/// The trainer on CPU this share of its time while the GPU averaged under `GPU_IDLE_PCT`.
const TRAINER_ON_CPU: f64 = 0.6;
const GPU_IDLE_PCT: f64 = 50.0;
/// Workers in the run queue at least this share of their time compete with the processes
/// outside the job for CPUs: what those used is not free for more workers.
const COMPETING_RUNQUEUE_SHARE: f64 = 0.1;
/// More workers are advised short of keeping up when they would deliver at least this much
/// faster (the CPUs left idle beside the job's).
const MORE_WORKERS_GAIN: f64 = 1.1;
/// Processes that lived less than this are not judged on their shares.
const MIN_LIFE_NS: u64 = 200_000_000;

/// One worker's time, split.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Split {
    pub life_ns: u64,
    pub cpu_ns: u64,
    pub runq_ns: u64,
    pub io_ns: u64,
    pub wait_ns: u64,
}

impl Split {
    pub fn of(p: &ProcFacts) -> Split {
        let o = p.offcpu.clone().unwrap_or_default();
        let life = p.lifetime_ns.max(1);
        // /proc's CPU time over the span it covers, scaled to the lifetime; else what the
        // off-CPU split leaves (exact for one thread).
        let cpu = match p.cpu_ns {
            Some(c) if p.cpu_span_ns >= MIN_LIFE_NS => {
                (c as f64 * life as f64 / p.cpu_span_ns as f64) as u64
            }
            _ => life.saturating_sub(o.offcpu_wait_ns + o.offcpu_io_ns + o.runqueue_ns),
        };
        Split {
            life_ns: life,
            cpu_ns: cpu,
            runq_ns: o.runqueue_ns,
            io_ns: o.offcpu_io_ns,
            wait_ns: o.offcpu_wait_ns,
        }
    }
    fn share(&self, ns: u64) -> f64 {
        ns as f64 / self.life_ns.max(1) as f64
    }
}

/// The trainer or rank that waited for data longest (at least [`DATA_WAIT_SHARE`] of its
/// time), with its wait share, and its DataLoader's workers.
struct Starved<'a> {
    main: &'a ProcFacts,
    /// Its wait for data, and the share of its life that was.
    wait_ns: u64,
    share: f64,
    /// Every worker process it had: non-persistent workers are new processes every epoch.
    workers: Vec<&'a ProcFacts>,
    /// The most of them alive at once: its num_workers.
    at_once: u64,
}

fn starved(f: &Facts) -> Option<Starved<'_>> {
    let (main, wait_ns, share) =
        waiters(f).into_iter().filter(|w| w.2 >= DATA_WAIT_SHARE).max_by_key(|w| w.1)?;
    let workers: Vec<&ProcFacts> = f
        .procs
        .iter()
        .filter(|p| p.is_worker && p.dataloader_pid.unwrap_or(p.ppid) == main.pid)
        .filter(|p| p.lifetime_ns >= MIN_LIFE_NS)
        .collect();
    let at_once = super::advice::most_alive_at_once(&workers);
    (!workers.is_empty()).then_some(Starved { main, wait_ns, share, workers, at_once })
}

/// The trainer's wait as a share of the time since its first worker started: what the
/// worker-count arithmetic needs. Its life before (imports, building the model) waited for
/// no batch and would dilute it (a loop that waits 75 % reads as 55 % over the whole run).
fn share_since_workers(f: &Facts, s: &Starved) -> f64 {
    let first = s.workers.iter().map(|p| p.started_ns).min().unwrap_or(0);
    let from = first.max(s.main.started_ns).max(f.start_ns);
    let to = s.main.exit_ns.unwrap_or(f.end_ns);
    let span = to.saturating_sub(from);
    if span < MIN_LIFE_NS {
        return s.share;
    }
    (s.wait_ns as f64 / span as f64).clamp(s.share, 1.0)
}

/// The workers' combined split.
fn total(workers: &[&ProcFacts]) -> Split {
    workers.iter().map(|p| Split::of(p)).fold(Split::default(), |a, b| Split {
        life_ns: a.life_ns + b.life_ns,
        cpu_ns: a.cpu_ns + b.cpu_ns,
        runq_ns: a.runq_ns + b.runq_ns,
        io_ns: a.io_ns + b.io_ns,
        wait_ns: a.wait_ns + b.wait_ns,
    })
}

/// CPUs on average: `ns` of CPU over `over_ns`.
fn cpus(ns: u64, over_ns: u64) -> f64 {
    ns as f64 / over_ns.max(1) as f64
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// "+0.0s: DataLoader worker 0 (pid N) ran 5.60 s on CPU of its 6.00 s (93 %), waited 0.10 s
/// for a CPU, blocked 0.20 s waiting on events and 0.00 s on I/O".
fn split_link(f: &Facts, p: &ProcFacts, chain: &mut Chain) {
    let s = Split::of(p);
    let t = p.started_ns.max(f.start_ns);
    chain.at(
        f,
        t,
        format!("{} was on CPU {:.2} s of its {:.2} s ({:.0} %), waited for a CPU {:.2} s ({:.0} %), blocked on events {:.2} s and on I/O {:.2} s{}", name(p), secs(s.cpu_ns), secs(s.life_ns), 100.0 * s.share(s.cpu_ns), secs(s.runq_ns), 100.0 * s.share(s.runq_ns), secs(s.wait_ns), secs(s.io_ns), // A worker's queue feeder thread sits blocked all its life beside the main thread.
            if s.cpu_ns + s.runq_ns + s.wait_ns + s.io_ns > s.life_ns + s.life_ns / 20 {
                " (off-CPU times summed over its threads)"
            } else {
                ""
            }),
    );
}

/// The CPUs the job may use: online, its affinity, its quota (the smallest), and what bounds it.
pub fn cpu_budget(c: &CpuFacts) -> (f64, String) {
    let mut best = (c.online_cpus.max(1) as f64, format!("{} online", c.online_cpus));
    if let Some(a) = c.allowed_cpus.filter(|a| (*a as f64) < best.0) {
        best = (a as f64, format!("{a} in its cpuset/affinity"));
    }
    if let Some(q) = c
        .throttling
        .iter()
        .filter_map(|t| t.quota_cpus.map(|q| (q, &t.path)))
        .min_by(|a, b| a.0.total_cmp(&b.0))
    {
        if q.0 < best.0 {
            best = (q.0, format!("{:.2} by the CPU quota of {}", q.0, q.1));
        }
    }
    best
}

/// What the worker-count arithmetic starts from.
#[derive(Clone, Debug, PartialEq)]
pub struct KeepUp {
    /// Workers now, and the CPUs they used together.
    pub workers: u64,
    pub workers_cpus: f64,
    /// The CPUs the trainer used.
    pub trainer_cpus: f64,
    /// The trainer's wait share.
    pub wait_share: f64,
    /// The CPUs the job may use, and what the processes outside it used.
    pub budget_cpus: f64,
    pub budget_by: String,
    pub others_cpus: f64,
    /// Memory: the trainer's and ranks' peak, each worker's, and the limit: the cgroup's, or
    /// without one the host's memory (`limit_is_host`).
    pub mains_kb: u64,
    pub per_worker_kb: u64,
    pub limit_kb: Option<u64>,
    pub limit_is_host: bool,
}

/// The advice, and the num_workers it names (none when more workers cannot help): the worker
/// count that keeps up, bounded by CPUs and memory.
pub fn keep_up_advice(k: &KeepUp) -> (Vec<String>, Option<u64>) {
    let busy = (1.0 - k.wait_share).max(0.05);
    let per = (k.workers_cpus / k.workers.max(1) as f64).max(0.01);
    // The trainer consumed at 1/busy the rate it did when batches are there at once; the
    // workers' rate grows with their number (each on its own CPU).
    let needed = ((k.workers as f64 / busy) - 1e-9).ceil().max(k.workers as f64 + 1.0) as u64;
    let trainer_then = (k.trainer_cpus / busy).min(1.0);
    let cpus_then = needed as f64 * per + trainer_then;
    let free = (k.budget_cpus - k.others_cpus).max(0.0);
    let arithmetic = format!(
        "{} used {:.2} CPUs ({:.2} each) while the trainer waited {:.0} % of its time since they started: to keep up they must deliver 1 / (1 - {:.2}) = {:.2} x as fast",
        workers_n(k.workers),
        k.workers_cpus,
        per,
        100.0 * k.wait_share,
        k.wait_share,
        1.0 / busy
    );
    let mem_fit = k
        .limit_kb
        .map(|l| ((l as f64 * 0.9) as u64).saturating_sub(k.mains_kb) / k.per_worker_kb.max(1));
    // "the 7168 MiB limit (with ...)" is a cgroup's; without one, "host memory (24105 MiB, with
    // ...)".
    let against = |l: u64| {
        let with = format!("with the trainer's {} and 10 % headroom", mib_kb(k.mains_kb));
        if k.limit_is_host {
            format!("host memory ({}, {with})", mib_kb(l))
        } else {
            format!("the {} limit ({with})", mib_kb(l))
        }
    };
    let per_worker = mib_kb(k.per_worker_kb);
    let mem_clause = |n: u64| match (k.limit_kb, mem_fit) {
        (Some(l), Some(fit)) if n <= fit => format!("; {n} x {per_worker} fits {}", against(l)),
        (Some(l), Some(fit)) => format!(
            "; but only {fit} x {per_worker} fit {}: give the job more memory too",
            against(l)
        ),
        _ => String::new(),
    };
    let cheaper = "make each sample cheaper: decode once and cache the decoded samples, smaller dtypes, move augmentation to the GPU (DALI, torchvision.transforms.v2 on CUDA tensors) or decode on the GPU";
    if cpus_then <= free + 0.05 {
        let text = format!(
            "num_workers={needed} would keep up: {arithmetic}, {needed} x {per:.2} + the trainer's {trainer_then:.2} = {cpus_then:.2} CPUs of the {:.2} free ({} CPUs: {}, less {:.2} used by other processes that held the workers up){}",
            free, fmt_cpus(k.budget_cpus), k.budget_by, k.others_cpus, mem_clause(needed)
        );
        return (vec![text], Some(needed));
    }
    // Short of keeping up, more workers still help while CPUs sit idle: the workers' rate
    // grows with the CPUs they get, and the trainer's CPU with the batches it is given, so
    // together they can use `free` once the workers get `usable` of it.
    let usable = free / (1.0 + k.trainer_cpus / k.workers_cpus.max(0.01));
    // The last worker counts when it gets at least half a CPU's worth of the rest.
    let fit = ((usable / per) + 0.5).floor().max(0.0) as u64;
    let speedup = (fit as f64 * per).min(usable) / k.workers_cpus.max(0.01);
    if fit <= k.workers || speedup < MORE_WORKERS_GAIN {
        let text = format!(
            "the {} CPUs ({}) are saturated: {arithmetic}, which needs {cpus_then:.2} CPUs against {free:.2} free ({:.2} used by other processes); more workers cannot help: {cheaper}, or give the job more CPUs",
            fmt_cpus(k.budget_cpus), k.budget_by, k.others_cpus
        );
        return (vec![text], None);
    }
    let after = (1.0 - busy * speedup).max(0.0);
    let text = format!(
        "num_workers={fit} uses the CPUs there are: {arithmetic}, {needed} workers would need {cpus_then:.2} CPUs but only {free:.2} are free ({} CPUs: {}, less {:.2} used by other processes that held the workers up); {fit} workers can use {usable:.2} of them beside the trainer's {:.2} (it grows with the batches it gets), {speedup:.2} x the {:.2} CPUs {} used: the trainer's wait falls from {:.0} % to about {:.0} %{}; beyond that {cheaper}",
        fmt_cpus(k.budget_cpus), k.budget_by, k.others_cpus,
        k.trainer_cpus * speedup, k.workers_cpus, workers_n(k.workers),
        100.0 * k.wait_share, 100.0 * after, mem_clause(fit)
    );
    (vec![text], Some(fit))
}

fn fmt_cpus(c: f64) -> String {
    if (c - c.round()).abs() < 1e-6 {
        format!("{}", c.round() as u64)
    } else {
        format!("{c:.2}")
    }
}

/// The memory budget figures the memory advice uses: the trainers' and ranks' peak, the
/// largest worker peak, the limit, and whether that is the host's memory (no cgroup limit).
fn memory(f: &Facts, workers: &[&ProcFacts]) -> (u64, u64, Option<u64>, bool) {
    let mains = f.procs.iter().filter(|p| p.is_trainer || p.is_rank).map(|p| p.peak_mem_kb).sum();
    let per = workers.iter().map(|p| p.peak_mem_kb).max().unwrap_or(0).max(1);
    let cgroup = f.cgroup.as_ref().and_then(|c| c.limit_bytes).map(|b| b / 1024);
    (mains, per, cgroup.or(f.host_mem_total_kb), cgroup.is_none())
}

fn keep_up(f: &Facts, s: &Starved) -> KeepUp {
    let w = total(&s.workers);
    let span = s.main.lifetime_ns.max(1);
    let default_cpu = CpuFacts { online_cpus: 1, ..Default::default() };
    let c = f.cpu.as_ref().unwrap_or(&default_cpu);
    let (budget_cpus, budget_by) = cpu_budget(c);
    let (mains_kb, per_worker_kb, limit_kb, limit_is_host) = memory(f, &s.workers);
    // Other processes stand in the way only where they held the workers up (in the run
    // queue); else they used CPU the job did not ask for, and would yield its fair share.
    let competing = w.share(w.runq_ns) >= COMPETING_RUNQUEUE_SHARE;
    KeepUp {
        workers: s.at_once,
        // Each worker's CPU while it lived, times the workers alive at once: not over the
        // trainer's life, which began before its DataLoader did (imports, the model).
        workers_cpus: w.share(w.cpu_ns) * s.at_once as f64,
        // The trainer's CPU since its workers came (its per-batch work), not over a life that
        // began with its imports and model building (seconds of a CPU for Lightning).
        trainer_cpus: match s.main.cpu_since_workers {
            Some((used, over)) if over >= MIN_LIFE_NS => cpus(used, over),
            _ => cpus(Split::of(s.main).cpu_ns, span),
        },
        wait_share: share_since_workers(f, s),
        budget_cpus,
        budget_by,
        others_cpus: if competing { cpus(c.others_ns, c.span_ns) } else { 0.0 },
        mains_kb,
        per_worker_kb,
        limit_kb,
        limit_is_host,
    }
}

/// The throttled level that cost the job most.
fn throttled(f: &Facts) -> Option<&Throttling> {
    f.cpu
        .as_ref()?
        .throttling
        .iter()
        .filter(|t| {
            t.periods >= 10 && t.throttled_periods as f64 >= THROTTLED_SHARE * t.periods as f64
        })
        .max_by_key(|t| t.throttled_ns)
}

/// cpu.stat's throttled time (v1 `throttled_time`, v2 `throttled_usec`) adds up the time each
/// CPU's run queue of the cgroup sat throttled: on `cpus` CPUs up to `cpus` times the trace.
/// Per CPU it is at most the trace: "0.80 s per CPU of the 6.0 s trace (1.60 s summed over
/// the run queues of its 2 CPUs)".
pub fn throttled_time(throttled_ns: u64, cpus: u32, span_ns: u64) -> String {
    let cpus = cpus.max(1);
    let mut per = throttled_ns / cpus as u64;
    if span_ns > 0 {
        per = per.min(span_ns);
    }
    let of =
        if span_ns > 0 { format!(" of the {:.1} s trace", secs(span_ns)) } else { String::new() };
    format!(
        "{:.2} s per CPU{of} ({:.2} s summed over the run queues of its {cpus} CPU{})",
        secs(per),
        secs(throttled_ns),
        if cpus == 1 { "" } else { "s" }
    )
}

/// Who sets a CPU limit at this cgroup path.
pub fn quota_owner(path: &str) -> String {
    if path.contains("kubepods") {
        format!("a Kubernetes CPU limit (the pod's resources.limits.cpu, cgroup {path})")
    } else if let Some(unit) =
        path.split('/').find(|p| p.ends_with(".service") || p.ends_with(".scope"))
    {
        format!("systemd's CPUQuota= of {unit} (cgroup {path})")
    } else if path.contains("slurm") {
        format!("Slurm's CPU allocation (cgroup {path}: --cpus-per-task / ConstrainCores)")
    } else if path.contains("docker") || path.contains("containerd") {
        format!("the container's CPU limit (docker run --cpus, cgroup {path})")
    } else {
        format!("the quota of cgroup {path} (cpu.max, or v1 cpu.cfs_quota_us / cpu.cfs_period_us)")
    }
}

/// The job's cgroup CPU quota throttled it while the trainer waited for data.
pub fn cpu_quota_throttled(c: &Ctx) -> Option<Verdict> {
    let f = c.f;
    let s = starved(f)?;
    let t = throttled(f)?;
    let quota = t.quota_cpus.or_else(|| f.cpu.as_ref().map(|c| cpu_budget(c).0))?;
    let throttled = f.cpu.as_ref().map_or_else(
        || throttled_time(t.throttled_ns, 1, f.end_ns.saturating_sub(f.start_ns)),
        |c| {
            let span = if c.span_ns > 0 { c.span_ns } else { f.end_ns.saturating_sub(f.start_ns) };
            throttled_time(t.throttled_ns, c.allowed_cpus.unwrap_or(c.online_cpus), span)
        },
    );
    let mut chain = c.chain();
    chain.push(
        f.start_ns,
        format!(
            "cgroup {} (quota {quota:.2} CPUs) was throttled in {} of its {} periods ({:.0} %), {throttled} (cpu.stat)",
            t.path,
            t.throttled_periods,
            t.periods,
            100.0 * t.throttled_periods as f64 / t.periods.max(1) as f64,
        ),
    );
    for p in &s.workers {
        split_link(f, p, &mut chain);
    }
    let pids: Vec<u32> = s.workers.iter().map(|p| p.pid).collect();
    super::stacks::hot_link(f, &pids, "the workers", &mut chain);
    let k = keep_up(f, &s);
    let used = k.workers_cpus + k.trainer_cpus;
    let need = k.workers_cpus / (1.0 - k.wait_share).max(0.05) + k.trainer_cpus;
    let text = format!(
        "CPU quota throttling starves the input pipeline: {} throttled the job in {:.0} % of its scheduling periods (throttled {throttled}), holding it to {quota:.2} CPUs{}.",
        quota_owner(&t.path),
        100.0 * t.throttled_periods as f64 / t.periods.max(1) as f64,
        gpu_clause(f)
    );
    let advice = vec![
        format!(
            "raise the limit to at least {:.1} CPUs: the job used {used:.2} CPUs under the {quota:.2} quota while the trainer waited {:.0} % of its time, so its workers need {:.2} / (1 - {:.2}) + the trainer's {:.2} = {need:.2} CPUs to keep up (set by {})",
            need.ceil().max(quota + 0.5),
            100.0 * k.wait_share,
            k.workers_cpus,
            k.wait_share,
            k.trainer_cpus,
            quota_owner(&t.path)
        ),
        format!("more num_workers cannot help under this quota: they share the same {quota:.2} CPUs; or make each sample cheaper (decode once and cache, smaller dtypes, GPU decode)"),
    ];
    let culprits = s.workers.iter().map(|p| p.pid).collect();
    Some(c.verdict(Cause::CpuQuotaThrottled, text, culprits, chain, advice))
}

/// The job's workers waited for a CPU behind processes outside the job.
pub fn busy_host(c: &Ctx) -> Option<Verdict> {
    let f = c.f;
    let s = starved(f)?;
    let cpu = f.cpu.as_ref()?;
    let w = total(&s.workers);
    let others = cpus(cpu.others_ns, cpu.span_ns);
    if w.share(w.runq_ns) < RUNQUEUE_SHARE || others < OTHERS_CPUS || cpu.others.is_empty() {
        return None;
    }
    let mut chain = c.chain();
    for p in &s.workers {
        split_link(f, p, &mut chain);
    }
    let pids: Vec<u32> = s.workers.iter().map(|p| p.pid).collect();
    super::stacks::hot_link(f, &pids, "the workers", &mut chain);
    let span = secs(cpu.span_ns);
    let names: Vec<String> = cpu
        .others
        .iter()
        .map(|(pid, comm, ns)| {
            format!(
                "{comm} (pid {pid}) {:.2} CPU-s ({:.0} % of a CPU)",
                secs(*ns),
                100.0 * cpus(*ns, cpu.span_ns)
            )
        })
        .collect();
    chain.push(
        f.start_ns + 1,
        format!(
            "processes outside the job used {others:.2} CPUs on average over {span:.1} s{}; the most: {}",
            cpu.host_busy.map_or(String::new(), |b| format!(" (the host's {} CPUs were {:.0} % busy)", cpu.online_cpus, 100.0 * b)),
            names.join(", ")
        ),
    );
    let (top_pid, top_comm, top_ns) = cpu.others[0].clone();
    let text = format!(
        "A busy host starves the input pipeline: the job's DataLoader workers waited for a CPU {:.2} s ({:.0} % of their time) behind processes outside the job, which used {others:.2} of the {} CPUs, the most {top_comm} (pid {top_pid}, {:.2} CPU-s){}.",
        secs(w.runq_ns),
        100.0 * w.share(w.runq_ns),
        cpu.online_cpus,
        secs(top_ns),
        gpu_clause(f)
    );
    let k = keep_up(f, &s);
    let need = k.workers_cpus / (1.0 - k.wait_share).max(0.05) + k.trainer_cpus;
    let advice = vec![
        format!("move the other work off this host or off the job's CPUs: {} used {:.2} CPUs; the job needs about {need:.2} CPUs to keep up (its workers' {:.2} / (1 - {:.2}) + the trainer's {:.2})", names.join(", "), others, k.workers_cpus, k.wait_share, k.trainer_cpus),
        "or give the job CPUs of its own: a cpuset (taskset, docker --cpuset-cpus, Kubernetes' static CPU manager with integer requests), or lower the others' priority (nice, cpu.weight / cpu.shares); more workers only queue behind the same processes".to_string(),
    ];
    let culprits = cpu.others.iter().map(|o| o.0).collect();
    Some(c.verdict(Cause::BusyHost, text, culprits, chain, advice))
}

/// The job's workers sat blocked reading sockets (remote storage, an object store, a network
/// filesystem's client over TCP) or files on a network or FUSE filesystem (NFS, CIFS, s3fs,
/// gcsfuse: no local block device involved) while the trainer waited.
pub fn network_bound(c: &Ctx) -> Option<Verdict> {
    let f = c.f;
    let s = starved(f)?;
    let readings: u64 = s.workers.iter().map(|p| p.readings).sum();
    let sum = |of: fn(&crate::diagnose::facts::ProcFacts) -> &Vec<(String, u64)>| {
        let mut by: std::collections::BTreeMap<String, u64> = Default::default();
        for p in &s.workers {
            for (peer, n) in of(p) {
                *by.entry(peer.clone()).or_default() += n;
            }
        }
        let mut v: Vec<(String, u64)> = by.into_iter().collect();
        v.sort_by_key(|(p, n)| (std::cmp::Reverse(*n), p.clone()));
        v
    };
    let (sockets, files) = (sum(|p| &p.socket_waits), sum(|p| &p.remote_file_waits));
    let (in_socket, in_file): (u64, u64) =
        (sockets.iter().map(|x| x.1).sum(), files.iter().map(|x| x.1).sum());
    let blocked = in_socket + in_file;
    if readings < 2 || (blocked as f64) < SOCKET_SHARE * readings as f64 {
        return None;
    }
    // Said as what the workers mostly waited on: a filesystem's mount or a socket's peer.
    let (by, what, seen) = if in_file > in_socket {
        (&files, "reading files on a network filesystem", "the file's mount")
    } else {
        (&sockets, "reading sockets", "the socket's peer")
    };
    let name = |p: &str| if p.is_empty() { "an unknown peer".to_string() } else { p.to_string() };
    let named: Vec<String> =
        sockets.iter().chain(&files).map(|(p, n)| format!("{} ({n} readings)", name(p))).collect();
    let mut chain = c.chain();
    for p in &s.workers {
        split_link(f, p, &mut chain);
    }
    chain.push(
        f.start_ns + 1,
        format!(
            "the workers were found blocked {what} in {blocked} of {readings} readings (/proc/PID/syscall, {seen}), from {}",
            named.join(", ")
        ),
    );
    let w = total(&s.workers);
    let text = format!(
        "The input pipeline waits on the network: the job's DataLoader workers sat blocked {what} in {:.0} % of the readings (from {}) and were on CPU only {:.0} % of their time: remote storage or a data service, not the disk or the CPU{}.",
        100.0 * blocked as f64 / readings as f64,
        by.first().map_or_else(|| name(""), |(p, _)| name(p)),
        100.0 * w.share(w.cpu_ns),
        gpu_clause(f)
    );
    let n = s.at_once;
    let more = (((n as f64 / (1.0 - s.share).max(0.05)) - 1e-9).ceil() as u64).max(n + 1);
    let idle =
        if n == 1 { "the one worker is".to_string() } else { format!("the {n} workers are") };
    let advice = vec![
        format!("hide the latency: num_workers={more} ({idle} idle on the network, not busy: 1 / (1 - {:.2}) = {:.2} x as many requests in flight keep up if the remote side has headroom), a larger prefetch_factor, or asynchronous fetches inside each worker", s.share, 1.0 / (1.0 - s.share).max(0.05)),
        "or bring the data closer: cache the dataset on local disk or in memory after the first epoch, larger objects per request (shards, WebDataset tar files) to pay the round trip once per many samples".to_string(),
    ];
    let culprits = s.workers.iter().map(|p| p.pid).collect();
    let v = c.verdict(Cause::NetworkBound, text, culprits, chain, advice);
    Some(Verdict { advice_num_workers: Some(more), ..v })
}

/// One worker ended at least this share of the trainer's waits that workers ended...
const STRAGGLER_SHARE: f64 = 0.6;
/// ...and kept it waiting at least this many times as long as the others did on average...
const STRAGGLER_OVER_OTHERS: f64 = 3.0;
/// ...and for at least this share of all the trainer's wait (a wait still open at the end is
/// no worker's yet: a stuck worker's, see `rules::stuck_worker`).
const STRAGGLER_OF_WAIT: f64 = 0.5;

/// The worker that kept the trainer waiting far longer than its siblings did, with the wait
/// it ended and what the others ended together.
/// The others' share also returned apart: their first batches' (start-up) wait.
fn straggler<'a>(s: &Starved<'a>) -> Option<(&'a ProcFacts, u64, u64, u64)> {
    if s.workers.len() < 2 {
        return None;
    }
    let steady = steady_kept_ns;
    let slow = *s.workers.iter().max_by_key(|p| (steady(p), std::cmp::Reverse(p.pid)))?;
    let all: u64 = s.workers.iter().map(|p| steady(p)).sum();
    let others = all - steady(slow);
    let others_mean = others as f64 / (s.workers.len() - 1) as f64;
    let start_up: u64 = s.workers.iter().map(|p| kept_ns(p) - steady(p)).sum();
    let waited = (s.share * s.main.lifetime_ns as f64 - start_up as f64).max(0.0);
    let mine = steady(slow) as f64;
    let holds = mine >= STRAGGLER_SHARE * all as f64
        && mine >= STRAGGLER_OVER_OTHERS * others_mean
        && mine >= STRAGGLER_OF_WAIT * waited
        && all > 0;
    let others_ended = s.workers.iter().filter(|p| p.pid != slow.pid).map(|p| kept_ns(p)).sum();
    holds.then_some((slow, kept_ns(slow), others_ended, others_ended - others))
}

/// "(3.75 s of it their first batches: the workers' start-up)", where that is most of it.
fn start_up_clause(start_up: u64, of: u64) -> String {
    if of == 0 || start_up * 2 < of {
        return String::new();
    }
    format!(" ({:.2} s of it their first batches: the workers' start-up)", secs(start_up))
}

fn kept_ns(p: &ProcFacts) -> u64 {
    p.offcpu.as_ref().map_or(0, |o| o.kept_waiting_ns)
}

/// What a worker kept the trainer waiting, less its largest part of one wait: a worker's first
/// batch carries its start-up (importing torch and unpickling the dataset under spawn or
/// forkserver: seconds), which says nothing of how it keeps up after. One wait per worker is
/// a sliver of a straggler's many. Workers that start together deliver their first batches
/// together, and the kernel charges that wait half to the one that ended it and half to the
/// other: each one's part is what it was charged (the long waits, 10 ms or more, are each
/// told), not the wait's whole length, which is the kernel's maximum of the waits it ended.
fn steady_kept_ns(p: &ProcFacts) -> u64 {
    let o = p.offcpu.as_ref();
    let largest = match o.and_then(|o| o.long_waits) {
        Some(l) => l.largest_share_ns,
        None => o.and_then(|o| o.kept_waiting_max_ns).unwrap_or(0),
    };
    kept_ns(p).saturating_sub(largest)
}

/// One worker held the pipeline back: the trainer's waits ended mostly when that worker's
/// batch came, while its siblings' batches were ready (DataLoader hands batches over in
/// order). A skewed sample, a slow shard or one worker on a slow mount; more workers do not
/// help, the order and the samples do.
pub fn straggler_worker(c: &Ctx) -> Option<Verdict> {
    let f = c.f;
    let s = starved(f)?;
    let (slow, kept, others, others_start_up) = straggler(&s)?;
    let mut chain = c.chain();
    for p in &s.workers {
        split_link(f, p, &mut chain);
    }
    super::stacks::hot_link(f, &[slow.pid], &name(slow), &mut chain);
    let mine = Split::of(slow);
    let rest: Vec<&ProcFacts> = s.workers.iter().copied().filter(|p| p.pid != slow.pid).collect();
    let theirs = total(&rest);
    let (cpu, theirs_cpu) = (mine.share(mine.cpu_ns), theirs.share(theirs.cpu_ns));
    let what = if mine.share(mine.io_ns) >= 0.25 {
        format!(
            "it was blocked on disk I/O {:.0} % of its time (the others {:.0} %): look at what it reads, a slow shard or mount",
            100.0 * mine.share(mine.io_ns),
            100.0 * theirs.share(theirs.io_ns)
        )
    } else if cpu >= ON_CPU_SHARE && cpu >= 1.5 * theirs_cpu {
        format!(
            "it was on CPU {:.0} % of its time against the others' {:.0} %: its samples cost more to make",
            100.0 * cpu,
            100.0 * theirs_cpu
        )
    } else {
        format!(
            "it was on CPU {:.0} % of its time (the others {:.0} %) and blocked on events {:.0} %: its samples wait on something the others' do not",
            100.0 * cpu,
            100.0 * theirs_cpu,
            100.0 * mine.share(mine.wait_ns)
        )
    };
    let text = format!(
        "One DataLoader worker holds the input pipeline back: {} waited for data {:.0} % of its time, and {} ended {:.2} s of those waits against {:.2} s for the other {} together{}; {what}. Batches come back in order, so the others' sit ready while the trainer waits for its{}.",
        name(s.main),
        100.0 * s.share,
        name(slow),
        secs(kept),
        secs(others),
        workers_n(rest.len() as u64),
        start_up_clause(others_start_up, others),
        gpu_clause(f)
    );
    let advice = vec![
        format!("find what is slow about {}'s samples: py-spy dump --pid {} while it works; {what}", name(slow), slow.pid),
        "balance the work: shuffle or spread the expensive samples (a sampler that interleaves them), split a large shard, or give the slow source its own cache".to_string(),
        "let ready batches through: DataLoader(..., in_order=False) (PyTorch 2.6 or later) hands the trainer whichever batch is ready first, so one slow sample delays only itself".to_string(),
    ];
    Some(c.verdict(Cause::StragglerWorker, text, vec![slow.pid], chain, advice))
}

/// The workers were on CPU most of their time while the trainer waited for data.
pub fn cpu_bound_pipeline(c: &Ctx) -> Option<Verdict> {
    let f = c.f;
    let s = starved(f)?;
    let w = total(&s.workers);
    if w.share(w.cpu_ns) < ON_CPU_SHARE || w.share(w.io_ns) >= 0.25 {
        return None;
    }
    let mut chain = c.chain();
    for p in &s.workers {
        split_link(f, p, &mut chain);
    }
    let pids: Vec<u32> = s.workers.iter().map(|p| p.pid).collect();
    super::stacks::hot_link(f, &pids, "the workers", &mut chain);
    let k = keep_up(f, &s);
    let who = match (s.at_once, s.workers.len() as u64) {
        (1, 1) => "one DataLoader worker was".to_string(),
        (n, all) if all == n => format!("{n} DataLoader workers were"),
        (n, all) => format!(
            "{} at a time ({all} worker processes in all, restarted every epoch as persistent_workers=False does) were",
            if n == 1 { "one DataLoader worker".to_string() } else { format!("{n} DataLoader workers") }
        ),
    };
    let text = format!(
        "The input pipeline is CPU-bound: {}'s {who} on CPU {:.0} % of {} time ({:.2} CPUs together{}), with no memory pressure or disk wait{}.",
        name(s.main),
        100.0 * w.share(w.cpu_ns),
        if s.at_once == 1 { "its" } else { "their" },
        k.workers_cpus,
        super::stacks::hot_clause(f, &pids, if s.at_once == 1 { "its" } else { "their" }),
        gpu_clause(f)
    );
    let culprits = s.workers.iter().map(|p| p.pid).collect();
    let (advice, n) = keep_up_advice(&k);
    let v = c.verdict(Cause::CpuBoundPipeline, text, culprits, chain, advice);
    Some(Verdict { advice_num_workers: n, ..v })
}

/// The trainer was on CPU, not waiting for data, while the GPU idled.
pub fn trainer_bound(c: &Ctx) -> Option<Verdict> {
    let f = c.f;
    let util = f.gpu_util_avg_pct?;
    if util >= GPU_IDLE_PCT && f.gpu_stalls.is_empty() {
        return None;
    }
    // Its own CPU: not what it spun inside the CUDA driver waiting for the GPU.
    let (main, _, share) = waiters(f)
        .into_iter()
        .filter(|p| p.0.lifetime_ns >= MIN_LIFE_NS)
        .max_by_key(|p| super::gpu_bound::own_cpu_ns(p.0))?;
    let sp = Split::of(main);
    let own = super::gpu_bound::own_cpu_ns(main);
    if share >= DATA_WAIT_SHARE || sp.share(own) < TRAINER_ON_CPU {
        return None;
    }
    let mut chain = c.chain();
    split_link(f, main, &mut chain);
    super::stacks::hot_link(f, &[main.pid], &name(main), &mut chain);
    chain.push(f.start_ns + 1, format!("the GPUs averaged {util:.0} % utilisation over the trace"));
    let text = format!(
        "The GPU is starved by the main process, not the workers: {} was on CPU {:.0} % of its time and waited for data only {:.0} %, while the GPU averaged {util:.0} % utilisation: its own per-batch work (collate, host-side augmentation, a slow .to(device) path, Python overhead) holds the GPU back{}.",
        name(main),
        100.0 * sp.share(own),
        100.0 * share,
        gpu_clause(f)
    );
    let advice = vec![
        format!("move the per-batch CPU work out of {}: into the DataLoader workers (num_workers > 0, the transforms in the Dataset's __getitem__), or onto the GPU (augmentation on CUDA tensors)", name(main)),
        "copy with pin_memory=True and .to(device, non_blocking=True); profile the loop to find the hot spot (py-spy top --pid PID, torch.profiler)".to_string(),
    ];
    Some(c.verdict(Cause::TrainerBound, text, vec![main.pid], chain, advice))
}

#[cfg(test)]
mod tests;
