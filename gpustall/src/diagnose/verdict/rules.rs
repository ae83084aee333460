//! One rule per cause. Each looks at the facts and either gives the verdict for its cause or
//! passes; [`super::RULES`] orders them, so precedence reads in one place.

use super::{
    advice::{memory_advice, memory_num_workers},
    evidence::{at, dedup, gpu_clause, memory_chain, mib_b, mib_kb, name, significant, Chain},
    Cause, Verdict,
};
use crate::diagnose::facts::{CgroupFacts, Facts, FsFacts, KillerFacts, OomFacts, ProcFacts};
use gpustall_common::events::SI_KERNEL;

/// Reclaim stall time at or above this fraction of the trace is memory pressure.
const PRESSURE_STALL_FRACTION: f64 = 0.01;
/// Swap-out at or above this many bytes is memory pressure (16,384 pages of 4 KiB, 1,024 of
/// 64 KiB: in bytes, so that a 64 KiB-page host is not held to 16 times more).
const PRESSURE_SWAP_BYTES: u64 = 64 << 20;
const DISK_FULL_PCT: f64 = 98.0;
/// A process stopped or in D state this long is hung.
const HUNG_NS: u64 = 3_000_000_000;
/// A process waited on its disk I/O this share of its life: disk-bound.
const IO_WAIT_FRACTION: f64 = 0.5;
const DISK_BUSY_PCT: f64 = 80.0;

/// What every rule starts from: the facts, the figures several rules share, and the GPU and
/// training-log links that belong in every chain.
pub struct Ctx<'a> {
    pub f: &'a Facts,
    /// The trace's length (at least 1 ns).
    pub duration_ns: u64,
    /// Combined reclaim stall and swap-out of the traced processes.
    pub stall_ns: u64,
    pub swap_pages: u64,
    /// `swap_pages` in bytes (the kernel's page size).
    pub swap_bytes: u64,
    /// Most grown first, then most stalled.
    pub by_memory: Vec<&'a ProcFacts>,
    /// Memory pressure was measured: reclaim stalls of [`PRESSURE_STALL_FRACTION`] of the trace
    /// or more, or [`PRESSURE_SWAP_BYTES`] swapped out.
    pub pressure: bool,
}

impl<'a> Ctx<'a> {
    pub fn new(f: &'a Facts) -> Self {
        let mut by_memory: Vec<&ProcFacts> = f.procs.iter().collect();
        by_memory.sort_by_key(|p| {
            (
                std::cmp::Reverse(p.peak_mem_kb.saturating_sub(p.first_mem_kb)),
                std::cmp::Reverse(p.reclaim_ns),
            )
        });
        let swap_pages: u64 = f.procs.iter().map(|p| p.swapout_pages).sum();
        let duration_ns = f.end_ns.saturating_sub(f.start_ns).max(1);
        let stall_ns: u64 = f.procs.iter().map(|p| p.reclaim_ns).sum();
        let swap_bytes = swap_pages.saturating_mul(f.page_bytes());
        let pressure = stall_ns as f64 / duration_ns as f64 >= PRESSURE_STALL_FRACTION
            || swap_bytes >= PRESSURE_SWAP_BYTES;
        Self { f, duration_ns, stall_ns, swap_pages, swap_bytes, by_memory, pressure }
    }

    /// A chain that starts with the GPU stalls and the data_time rise.
    pub(super) fn chain(&self) -> Chain {
        self.chain_citing(&[])
    }

    /// The same, listing the kernel-log lines `cited` (by their first record's sequence
    /// number) whatever their place among the lines kept.
    pub(super) fn chain_citing(&self, cited: &[u64]) -> Chain {
        let mut chain = Chain(Vec::new());
        super::evidence::stall_links(self.f, &mut chain);
        super::datawait::links(self.f, &mut chain);
        super::kernel_faults::links(self.f, cited, &mut chain);
        super::stacks::unreadable_link(self.f, &mut chain);
        chain
    }

    pub(super) fn verdict(
        &self,
        cause: Cause,
        text: String,
        culprits: Vec<u32>,
        chain: Chain,
        mut advice: Vec<String>,
    ) -> Verdict {
        // A job that runs slower than it could: receiving big batches may be part of why.
        if cause.severity() != super::Severity::Failure {
            advice.extend(super::stacks::receiving_advice(self.f));
        }
        Verdict {
            cause,
            culprit_pids: culprits,
            text,
            evidence: chain.done(),
            advice,
            advice_num_workers: None,
        }
    }
}

const SIGBUS: i32 = 7;

/// A traced process died of SIGBUS: for a DataLoader worker, shared memory (/dev/shm, 64 MiB
/// in a container by default) could not back the batch it was writing. PyTorch then reports
/// "DataLoader worker (pid N) is killed by signal: Bus error"; it is not an OOM kill, and more
/// host memory does not fix it.
pub fn bus_error(c: &Ctx) -> Option<Verdict> {
    let f = c.f;
    let b = bus_errors(f)?;
    let mut chain = c.chain();
    for p in &b.hit {
        chain.at(f, p.exit_ns.unwrap_or(f.end_ns), format!("{} died of SIGBUS", name(p)));
    }
    if let Some(fs) = b.shm.sampled() {
        chain.push(
            b.t_ns,
            format!(
                "/dev/shm at its fullest: {:.0}% used, {} free",
                fs.used_pct,
                mib_b(fs.avail_bytes)
            ),
        );
    }
    let text = format!(
        "Shared memory ran out, not host memory: {} died of SIGBUS (bus error) at {}; {}. PyTorch reports \"DataLoader worker (pid N) is killed by signal: Bus error\"; this is not an OOM kill.",
        name(b.hit[0]),
        at(f, b.t_ns),
        shm_why(f, &b.shm)
    );
    let advice = vec![
        "give the job a bigger /dev/shm: docker run --shm-size=8g (the default is 64 MiB), or in Kubernetes an emptyDir with medium: Memory mounted at /dev/shm".to_string(),
        "or put less in flight through it: fewer num_workers, a lower prefetch_factor, smaller batches".to_string(),
    ];
    Some(c.verdict(Cause::BusError, text, b.hit.iter().map(|p| p.pid).collect(), chain, advice))
}

/// What the job's /dev/shm showed (its fullest sample) when a process died of SIGBUS.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Shm<'a> {
    /// 90 % full or more.
    Full(&'a FsFacts),
    /// Under 256 MiB (a container's default is 64 MiB): the batches in flight did not fit.
    Small(&'a FsFacts),
    /// Room left when sampled: it may have filled between samples.
    Room(&'a FsFacts),
    /// Not read: the job ended (its last exit) before it could be.
    Unread { ended_ns: u64 },
}

impl<'a> Shm<'a> {
    fn sampled(&self) -> Option<&'a FsFacts> {
        match *self {
            Shm::Full(fs) | Shm::Small(fs) | Shm::Room(fs) => Some(fs),
            Shm::Unread { .. } => None,
        }
    }
}

/// The processes dead of SIGBUS, when the first died, and the job's /dev/shm.
pub(super) struct BusErrors<'a> {
    pub(super) hit: Vec<&'a ProcFacts>,
    pub(super) t_ns: u64,
    pub(super) shm: Shm<'a>,
}

pub(super) fn bus_errors(f: &Facts) -> Option<BusErrors<'_>> {
    let hit: Vec<&ProcFacts> = f.procs.iter().filter(|p| p.exit_signal == Some(SIGBUS)).collect();
    let t_ns = hit.first()?.exit_ns.unwrap_or(f.end_ns);
    // Never the host's /dev/shm in its place: the job's may be its own mount.
    let shm = match f.filesystems.iter().find(|fs| fs.path == "/dev/shm") {
        Some(fs) if fs.used_pct >= 90.0 => Shm::Full(fs),
        Some(fs) if fs.total_bytes < 256 << 20 => Shm::Small(fs),
        Some(fs) => Shm::Room(fs),
        None => Shm::Unread {
            ended_ns: f.procs.iter().filter_map(|p| p.exit_ns).max().unwrap_or(f.end_ns),
        },
    };
    Some(BusErrors { hit, t_ns, shm })
}

/// Why /dev/shm could not back the batch, in words.
fn shm_why(f: &Facts, shm: &Shm) -> String {
    match *shm {
        Shm::Full(fs) => format!(
            "/dev/shm, where DataLoader workers put their batches, was {:.0}% full ({} free of {})",
            fs.used_pct,
            mib_b(fs.avail_bytes),
            mib_b(fs.total_bytes)
        ),
        Shm::Small(fs) => format!(
            "/dev/shm, where DataLoader workers put their batches, is only {} (a container's default is 64 MiB): the batches in flight did not fit ({:.0}% used at its fullest sample)",
            mib_b(fs.total_bytes),
            fs.used_pct
        ),
        Shm::Room(fs) => format!(
            "/dev/shm was at most {:.0}% full when sampled ({} free of {}): it may have filled between samples",
            fs.used_pct,
            mib_b(fs.avail_bytes),
            mib_b(fs.total_bytes)
        ),
        Shm::Unread { ended_ns } => format!(
            "/dev/shm of the job's mount namespace was not read: the job ended at {}, before it could be",
            at(f, ended_ns)
        ),
    }
}

/// Memory ran out and the OOM killer killed a traced process.
pub fn host_memory_oom(c: &Ctx) -> Option<Verdict> {
    let f = c.f;
    let o = oom_kills(c)?;
    let first = o.kills[0];
    let mut chain = c.chain();
    memory_chain(f, &mut chain);
    for k in &o.kills {
        chain.push(k.t_ns, oom_link(f, k));
    }
    let grew = o.grower.map_or(String::new(), |g| {
        format!(
            " The OOM killer chose the victim by size; the process that grew most was {} ({} to {}).",
            name(g),
            mib_kb(g.first_mem_kb),
            mib_kb(g.peak_mem_kb)
        )
    });
    let text = format!(
        "{} ran out, not the disk: {} was OOM-killed at {} after the job's processes stalled a combined {:.2} s in reclaim and swapped out {} pages ({}){}.{grew} {}",
        memory_scope(f),
        o.victim.map_or(format!("pid {}", first.victim_pid), name),
        at(f, first.t_ns),
        c.stall_ns as f64 / 1e9,
        c.swap_pages,
        mib_b(c.swap_bytes),
        gpu_clause(f),
        "A DataLoader that sees this raises \"DataLoader worker (pid N) is killed by signal: Killed\"; other ranks then time out."
    );
    let v = c.verdict(Cause::HostMemoryOom, text, o.culprits, chain, memory_advice(f));
    Some(Verdict { advice_num_workers: memory_num_workers(f), ..v })
}

/// The OOM kills of traced processes, first first.
struct OomKills<'a> {
    kills: Vec<&'a OomFacts>,
    /// The first victim, where it is a traced process still known.
    victim: Option<&'a ProcFacts>,
    /// The process that grew most, where it is not the first victim: the killer often picks
    /// the largest process (the trainer) while a worker that grew is the cause.
    grower: Option<&'a ProcFacts>,
    /// By what they did to the pressure (growth, then reclaim), then the victims.
    culprits: Vec<u32>,
}

fn oom_kills<'a>(c: &Ctx<'a>) -> Option<OomKills<'a>> {
    let f = c.f;
    let kills: Vec<&OomFacts> =
        f.oom_kills.iter().filter(|o| f.procs.iter().any(|p| p.pid == o.victim_pid)).collect();
    let first = kills.first()?.victim_pid;
    let mut culprits: Vec<u32> = significant(&c.by_memory);
    culprits.extend(kills.iter().map(|o| o.victim_pid));
    dedup(&mut culprits);
    let victim = f.procs.iter().find(|p| p.pid == first);
    let grower =
        c.by_memory.first().copied().filter(|p| p.peak_mem_kb > p.first_mem_kb && p.pid != first);
    Some(OomKills { kills, victim, grower, culprits })
}

/// What ran out: the job's memory cgroup when it has a limit below the host's memory (a
/// container, a Slurm job, a pod), else host memory.
fn memory_scope(f: &Facts) -> String {
    match &f.cgroup {
        Some(CgroupFacts { path, limit_bytes: Some(limit), limit_set_by, .. })
            if f.host_mem_total_kb.is_none_or(|t| limit / 1024 < t) =>
        {
            match limit_set_by {
                // A Slurm job or a pod sets it on a parent: say whose budget it is.
                Some(by) => format!("Memory cgroup {path} (limit {}, set by {by})", mib_b(*limit)),
                None => format!("Memory cgroup {path} (limit {})", mib_b(*limit)),
            }
        }
        // The job's cgroup was not read before the kill (a job that moved itself into it and
        // died within a second): the kernel's OOM report names it.
        _ => match oom_cgroup_in_log(f) {
            Some(path) => format!(
                "Memory cgroup {path} (named by the kernel's OOM report; its limit was not read in time)"
            ),
            None => "Host memory".to_string(),
        },
    }
}

/// The memory cgroup the kernel's OOM report gives for a traced victim's kill.
fn oom_cgroup_in_log(f: &Facts) -> Option<&str> {
    super::kernel_faults::trusted(f)
        .filter(|l| l.what == crate::model::kernlog::LogWhat::OomCgroup)
        .find(|l| f.oom_kills.iter().any(|o| Some(o.victim_pid) == l.pid))
        .and_then(|l| l.device.as_deref())
}

/// "+55.0s: memory cgroup /job OOM killer chose pid N (comm) with anon-rss ..."
fn oom_link(f: &Facts, o: &OomFacts) -> String {
    let by = match &o.killer {
        Some(KillerFacts { pid, comm, si_code: SI_KERNEL }) => {
            format!(", SIGKILL sent by the kernel in pid {pid} ({comm})")
        }
        Some(KillerFacts { pid, comm, .. }) => format!(", SIGKILL sent by pid {pid} ({comm})"),
        None => String::new(),
    };
    let scope = match &f.cgroup {
        Some(CgroupFacts { path, limit_bytes: Some(_), oom_kills: Some(k), .. }) if *k > 0 => {
            format!("memory cgroup {path} OOM")
        }
        _ => "OOM".to_string(),
    };
    format!(
        "{}: {scope} killer chose pid {} ({}) with anon-rss {} (invoked by pid {} ({})){by}",
        at(f, o.t_ns),
        o.victim_pid,
        o.victim_comm,
        o.anon_rss_kb.map_or("unknown".into(), mib_kb),
        o.trigger_pid,
        o.trigger_comm
    )
}

/// A traced process was killed by SIGKILL from user space (not the kernel's OOM killer).
pub fn process_killed(c: &Ctx) -> Option<Verdict> {
    let f = c.f;
    let u = user_kills(f)?;
    let mut chain = c.chain();
    if c.pressure {
        memory_chain(f, &mut chain);
    }
    for p in &u.killed {
        if let (Some(k), Some(t)) = (&p.killed_by, p.killed_ns) {
            chain.at(
                f,
                t,
                format!("{} was killed by SIGKILL from pid {} ({})", name(p), k.pid, k.comm),
            );
        }
    }
    let k = u.sender;
    let why = if c.pressure {
        format!(" while the job was under memory pressure ({:.2} s in reclaim, {} pages swapped out): a user-space OOM killer such as systemd-oomd or earlyoom acts before the kernel's", c.stall_ns as f64 / 1e9, c.swap_pages)
    } else {
        String::new()
    };
    let text = format!(
        "{} was killed by SIGKILL from pid {} ({}), not by the kernel's OOM killer{why}{}.",
        name(u.killed[0]),
        k.pid,
        k.comm,
        gpu_clause(f)
    );
    let mut advice = vec![format!("find out why pid {} ({}) killed it: its logs (journalctl for systemd-oomd, the kubelet's eviction events, the scheduler's)", k.pid, k.comm)];
    if c.pressure {
        advice.extend(memory_advice(f));
    }
    Some(c.verdict(Cause::ProcessKilled, text, u.senders, chain, advice))
}

/// Traced processes SIGKILLed from user space, first first.
pub(super) struct UserKills<'a> {
    killed: Vec<&'a ProcFacts>,
    /// Who killed the first.
    sender: &'a KillerFacts,
    /// Each sender once, first first: the culprits, not the processes they killed.
    pub(super) senders: Vec<u32>,
}

pub(super) fn user_kills(f: &Facts) -> Option<UserKills<'_>> {
    let killed: Vec<&ProcFacts> = f
        .procs
        .iter()
        .filter(|p| !p.oom_killed && p.exit_signal == Some(9))
        .filter(|p| p.killed_by.as_ref().is_some_and(|k| k.si_code != SI_KERNEL))
        .collect();
    let sender = killed.first()?.killed_by.as_ref()?;
    let mut senders: Vec<u32> =
        killed.iter().filter_map(|p| p.killed_by.as_ref()).map(|k| k.pid).collect();
    dedup(&mut senders);
    Some(UserKills { killed, sender, senders })
}

/// A filesystem the job writes to (its cwd, /tmp, /dev/shm) is full.
pub fn disk_full(c: &Ctx) -> Option<Verdict> {
    let f = c.f;
    let fs = f.filesystems.iter().find(|fs| fs.used_pct >= DISK_FULL_PCT)?;
    let (path, pct) = (&fs.path, fs.used_pct);
    let mut chain = c.chain();
    chain.push(
        f.start_ns,
        format!("{path} is {pct:.1}% full ({} available)", mib_b(fs.avail_bytes)),
    );
    let text = format!("The filesystem of {path} is full ({pct:.1}%): writes (checkpoints, logs, shared-memory batches) fail or block.");
    let writers = f.procs.iter().filter(|p| p.write_bytes > 0).map(|p| p.pid).collect();
    let advice = vec![format!("free space on {path} or point checkpoints/caches elsewhere; /dev/shm full breaks DataLoader shared-memory batches")];
    Some(c.verdict(Cause::DiskFull, text, writers, chain, advice))
}

/// Traced processes stalled in reclaim and swapped, with no kill (yet).
pub fn host_memory_pressure(c: &Ctx) -> Option<Verdict> {
    if !c.pressure {
        return swap_thrash(c);
    }
    let f = c.f;
    let mut chain = c.chain();
    memory_chain(f, &mut chain);
    let mut culprits: Vec<u32> = significant(&c.by_memory);
    dedup(&mut culprits);
    let text = format!(
        "Memory pressure, not the disk: the job's processes stalled a combined {:.2} s in reclaim over a {:.1} s trace and swapped out {} pages ({}){}. No OOM kill yet.",
        c.stall_ns as f64 / 1e9,
        c.duration_ns as f64 / 1e9,
        c.swap_pages,
        mib_b(c.swap_bytes),
        gpu_clause(f)
    );
    let v = c.verdict(Cause::HostMemoryPressure, text, culprits, chain, memory_advice(f));
    Some(Verdict { advice_num_workers: memory_num_workers(f), ..v })
}

/// Pages one major fault on swap brings in: swap readahead reads 2^vm.page-cluster pages
/// (default 3) around the faulting one.
const SWAP_READAHEAD_PAGES: u64 = 8;

/// The job's memory was pushed out to swap earlier (by kswapd, or by a neighbour in its
/// cgroup) and faults back in: its reads are swap-ins, not its data pipeline, though the job
/// itself neither reclaimed nor swapped out. The job's swap-in is bounded three ways: by its
/// major faults (times the readahead), by the pages it read from disk, and by what the whole
/// host read back from swap.
fn swap_thrash(c: &Ctx) -> Option<Verdict> {
    let f = c.f;
    let s = swap_ins(f)?;
    let mut chain = c.chain();
    for p in s.by_faults.iter().take(3) {
        chain.push(
            f.start_ns,
            format!("{} took {} major faults (pages read back in)", name(p), p.major_faults),
        );
    }
    chain.push(
        f.end_ns,
        format!("the host read {} pages back from swap (pswpin) over the trace", f.pswpin),
    );
    let text = format!(
        "Memory pressure, not the disk: the job's memory had been pushed out to swap and faults back in ({} major faults, about {} read back from swap){}. The job itself neither stalled in reclaim nor swapped out: kswapd or another process in its cgroup took its memory. Its reads are swap-ins, not its data pipeline.",
        s.faults,
        mib_b(s.bytes),
        gpu_clause(f)
    );
    let advice = vec![
        "keep the job's working set resident: give its cgroup more memory, or keep neighbours out of it (a separate memory cgroup per job, memory.low / memory.min to protect it)".to_string(),
    ];
    let culprits = s.by_faults.iter().map(|p| p.pid).collect();
    Some(c.verdict(Cause::HostMemoryPressure, text, culprits, chain, advice))
}

/// The job's swap-ins, where they reach [`PRESSURE_SWAP_BYTES`].
pub(super) struct SwapIns<'a> {
    /// Its major faults.
    faults: u64,
    /// What it read back from swap, at most: the least of its major faults times the
    /// readahead, the pages it read from disk, and what the whole host read back.
    pub(super) bytes: u64,
    /// Its processes that faulted, most first.
    by_faults: Vec<&'a ProcFacts>,
}

pub(super) fn swap_ins(f: &Facts) -> Option<SwapIns<'_>> {
    let faults: u64 = f.procs.iter().map(|p| p.major_faults).sum();
    let page = f.page_bytes();
    let read_pages: u64 = f.procs.iter().map(|p| p.read_bytes / page).sum();
    let bytes = (faults * SWAP_READAHEAD_PAGES).min(read_pages).min(f.pswpin) * page;
    if bytes < PRESSURE_SWAP_BYTES {
        return None;
    }
    let mut by_faults: Vec<&ProcFacts> = f.procs.iter().filter(|p| p.major_faults > 0).collect();
    by_faults.sort_by_key(|p| std::cmp::Reverse(p.major_faults));
    Some(SwapIns { faults, bytes, by_faults })
}

/// A traced process sat stopped (T) or in uninterruptible sleep (D).
pub fn process_hung(c: &Ctx) -> Option<Verdict> {
    let f = c.f;
    let hung = hung(f);
    let (first, _, first_ns) = *hung.first()?;
    let mut chain = c.chain();
    for (p, s, ns) in &hung {
        let what = if s.state == 'D' { "in uninterruptible sleep (D)" } else { "stopped (T)" };
        let w = if s.wchan.is_empty() { String::new() } else { format!(" in {}", s.wchan) };
        let secs = *ns as f64 / 1e9;
        chain.at(f, s.since_ns, format!("{} {what}{w} for {secs:.1} s", name(p)));
    }
    let procs: Vec<&ProcFacts> = hung.iter().map(|(p, _, _)| *p).collect();
    super::stacks::blocked_links(f, &procs, &mut chain);
    let secs = first_ns as f64 / 1e9;
    let line = super::stacks::blocked_at(f, first).map_or(String::new(), |b| format!(", {b}"));
    let text =
        format!("{} is hung: it has not run for {secs:.1} s{line}{}.", name(first), gpu_clause(f));
    let advice = vec!["a stopped process (SIGSTOP, a debugger, job control) must be continued (SIGCONT); one in D state waits in the kernel (wchan above): check the storage or network filesystem it waits on".into()];
    Some(c.verdict(Cause::ProcessHung, text, procs.iter().map(|p| p.pid).collect(), chain, advice))
}

/// The live processes stopped (T) or in D state for [`HUNG_NS`] or more at the end, with
/// that state and how long they had been in it.
fn hung(f: &Facts) -> Vec<(&ProcFacts, &crate::diagnose::facts::Stuck, u64)> {
    f.procs
        .iter()
        .filter(|p| p.alive)
        .filter_map(|p| p.stuck.as_ref().map(|s| (p, s, f.end_ns.saturating_sub(s.since_ns))))
        .filter(|(_, _, ns)| *ns >= HUNG_NS)
        .collect()
}

/// The GPU slowed itself (thermal or power) with no host-side cause.
pub fn gpu_throttling(c: &Ctx) -> Option<Verdict> {
    let f = c.f;
    let throttled = f.gpu_stalls.iter().any(|s| !s.throttle_reasons.is_empty())
        || (f.gpu_samples > 0 && f.gpu_throttled_samples * 2 >= f.gpu_samples);
    if !throttled || f.gpu_throttle_reasons.is_empty() {
        return None;
    }
    let reasons = f.gpu_throttle_reasons.join(", ");
    let mut chain = c.chain();
    chain.push(
        f.start_ns,
        format!("{} of {} GPU samples showed {reasons}", f.gpu_throttled_samples, f.gpu_samples),
    );
    let text = format!(
        "The GPU slowed itself ({reasons}) with no memory pressure or disk wait on the host."
    );
    let advice = vec!["check cooling, power limits (nvidia-smi -q -d PERFORMANCE,POWER) and clocks; the host side is not the cause".into()];
    Some(c.verdict(Cause::GpuThrottling, text, Vec::new(), chain, advice))
}

/// The job waited on its own disk reads and writes, with no memory pressure.
pub fn disk_io_bound(c: &Ctx) -> Option<Verdict> {
    let f = c.f;
    let d = disk_bound(f)?;
    let mut chain = c.chain();
    for p in d.procs.iter().take(4) {
        chain.push(
            f.start_ns,
            format!(
                "{} read {} and wrote {}, blocked on I/O {:.1} s ({:.0}% of the {:.1} s it ran; its block requests took {:.1} s together)",
                name(p),
                mib_b(p.read_bytes),
                mib_b(p.write_bytes),
                disk_blocked_ns(p) as f64 / 1e9,
                100.0 * disk_blocked_share(p),
                p.lifetime_ns as f64 / 1e9,
                p.io_wait_ns as f64 / 1e9,
            ),
        );
    }
    for d in f.disks.iter().filter(|d| d.busy_pct >= 10.0) {
        chain.push(
            f.start_ns + 1,
            format!(
                "disk {} was {:.0}% busy ({:.0}% at its busiest second)",
                d.name, d.busy_pct, d.peak_busy_pct
            ),
        );
    }
    chain.push(
        f.start_ns + 2,
        format!(
            "no memory pressure: {:.3} s in reclaim, {} pages swapped out",
            c.stall_ns as f64 / 1e9,
            c.swap_pages
        ),
    );
    let rate = d.io_bytes as f64 / (c.duration_ns as f64 / 1e9) / 1048576.0;
    let text = format!("The data pipeline is disk-bound: the job's processes waited on their own block I/O ({rate:.0} MiB/s) with no memory pressure{}.", gpu_clause(f));
    let advice = vec![format!("the pipeline reads at {rate:.0} MiB/s: more DataLoader workers or readahead only help if the disk has headroom; cache the dataset in page cache/local SSD, use larger sequential reads, or a faster store")];
    let culprits = d.procs.iter().map(|p| p.pid).filter(|&p| p != 0).collect();
    Some(c.verdict(Cause::DiskIoBound, text, culprits, chain, advice))
}

/// A process's time waiting on the disk, as the disk-bound rule judges it: its time blocked
/// on I/O (D state) where the kernel measured it (the job's own roles), else its requests'
/// latency, which adds up requests in flight together (readahead) and is capped at its life.
fn disk_blocked_ns(p: &ProcFacts) -> u64 {
    match &p.offcpu {
        Some(o) if p.is_trainer || p.is_rank || p.is_worker => o.offcpu_io_ns,
        _ => p.io_wait_ns.min(p.lifetime_ns),
    }
}

/// [`disk_blocked_ns`] as a share of its life: a process that lived half a second of a long
/// trace is judged on that half second.
fn disk_blocked_share(p: &ProcFacts) -> f64 {
    disk_blocked_ns(p) as f64 / p.lifetime_ns.max(1) as f64
}

/// The job's block I/O, where one of its processes (of 0.2 s or more) waited on the disk
/// [`IO_WAIT_FRACTION`] of its life or a disk was [`DISK_BUSY_PCT`] busy.
struct DiskBound<'a> {
    /// Bytes its processes read and wrote.
    io_bytes: u64,
    /// Those that did I/O, longest blocked first.
    procs: Vec<&'a ProcFacts>,
}

fn disk_bound(f: &Facts) -> Option<DiskBound<'_>> {
    let io_wait = f
        .procs
        .iter()
        .filter(|p| p.lifetime_ns >= 200_000_000)
        .map(disk_blocked_share)
        .fold(0.0, f64::max);
    let io_bytes: u64 = f.procs.iter().map(|p| p.read_bytes + p.write_bytes).sum();
    let busy = f.disks.iter().map(|d| d.busy_pct).fold(0.0, f64::max);
    if io_bytes == 0 || (io_wait < IO_WAIT_FRACTION && busy < DISK_BUSY_PCT) {
        return None;
    }
    let mut procs: Vec<&ProcFacts> =
        f.procs.iter().filter(|p| p.read_bytes + p.write_bytes > 0).collect();
    procs.sort_by_key(|p| std::cmp::Reverse(disk_blocked_ns(p)));
    Some(DiskBound { io_bytes, procs })
}

/// Who sets a block I/O limit, from its cgroup's path.
fn io_limit_owner(path: &str) -> String {
    if let Some(unit) = path.split('/').find(|p| p.ends_with(".service") || p.ends_with(".scope")) {
        format!("systemd's IOReadBandwidthMax=/IOReadIOPSMax= of {unit} (cgroup {path})")
    } else if path.contains("kubepods") {
        format!("the pod's cgroup {path} (a node agent or runtime policy: Kubernetes itself sets no I/O limits)")
    } else if path.contains("docker") || path.contains("containerd") {
        format!("the container's I/O limit (docker run --device-read-bps / --device-read-iops, cgroup {path})")
    } else if path.contains("slurm") {
        format!("the Slurm job's cgroup {path}")
    } else {
        format!("cgroup {path} (blkio.throttle.*_device on cgroup v1, io.max on v2)")
    }
}

/// "8 MiB/s of reads" / "200 reads/s" of a limit, for the kind the job did.
fn limit_clause(l: &crate::model::host::IoLimit) -> String {
    let mut parts = Vec::new();
    if let Some(b) = l.rbps {
        parts.push(format!("{:.1} MiB/s of reads", b as f64 / 1048576.0));
    }
    if let Some(n) = l.riops {
        parts.push(format!("{n} reads/s"));
    }
    if let Some(b) = l.wbps {
        parts.push(format!("{:.1} MiB/s of writes", b as f64 / 1048576.0));
    }
    if let Some(n) = l.wiops {
        parts.push(format!("{n} writes/s"));
    }
    parts.join(", ")
}

/// The job's cgroup limits its block I/O and its processes sat waiting on I/O: the limit, not
/// the disk, is the bottleneck. The throttle holds the bios and issues them from a kernel
/// thread, so the disk looks idle and the requests' latency is no process's; the processes'
/// time blocked on I/O (D state) and the kernel's per-task byte counts say it.
pub fn io_throttled(c: &Ctx) -> Option<Verdict> {
    let f = c.f;
    let t = io_throttle(f)?;
    let limit = t.limit;
    let rate = t.read_bytes as f64 / (c.duration_ns as f64 / 1e9) / 1048576.0;
    let dev = limit.device.clone().unwrap_or_else(|| limit.dev.clone());
    let mut chain = c.chain();
    chain.push(
        f.start_ns,
        format!("cgroup {} limits {dev} ({}) to {}", limit.path, limit.dev, limit_clause(limit)),
    );
    for p in t.procs.iter().take(4) {
        chain.push(
            f.start_ns + 1,
            format!(
                "{} read {}{} and sat blocked on I/O {:.1} s ({:.0} % of the {:.1} s it ran)",
                name(p),
                mib_b(p.read_bytes),
                if p.read_bytes_from_proc {
                    " (its /proc/PID/io count: the throttle issued its bios from a kernel thread)"
                } else {
                    ""
                },
                p.io_blocked_ns() as f64 / 1e9,
                100.0 * p.io_blocked_share(),
                p.lifetime_ns as f64 / 1e9
            ),
        );
    }
    let of_limit = limit.rbps.map_or(String::new(), |b| {
        format!(", {:.0} % of the limit", 100.0 * rate * 1048576.0 / b as f64)
    });
    let text = format!(
        "The job's disk I/O is throttled by its cgroup, not slowed by the disk: {} limits {dev} to {}; the job read {} at {rate:.1} MiB/s{of_limit}, and {} sat blocked on I/O {:.0} % of its time{}.",
        io_limit_owner(&limit.path),
        limit_clause(limit),
        mib_b(t.read_bytes),
        name(t.procs[0]),
        100.0 * t.procs[0].io_blocked_share(),
        gpu_clause(f)
    );
    let advice = vec![
        format!("raise or lift the limit where it is set: {}", io_limit_owner(&limit.path)),
        format!("or read less from {dev} during training: cache the dataset in memory or on storage outside the limit after the first epoch, larger reads for an IOPS limit"),
    ];
    let culprits = t.procs.iter().map(|p| p.pid).collect();
    Some(c.verdict(Cause::IoThrottled, text, culprits, chain, advice))
}

/// The job's I/O limit, where some of its processes (of 0.2 s or more) sat blocked on I/O
/// [`IO_WAIT_FRACTION`] of their life.
struct IoThrottle<'a> {
    limit: &'a crate::model::host::IoLimit,
    /// Those processes, longest blocked first.
    procs: Vec<&'a ProcFacts>,
    /// What the job's processes read.
    read_bytes: u64,
}

fn io_throttle(f: &Facts) -> Option<IoThrottle<'_>> {
    let limit = f.io_limits.iter().find(|l| l.is_set())?;
    let mut procs: Vec<&ProcFacts> = f
        .procs
        .iter()
        .filter(|p| p.lifetime_ns >= 200_000_000 && p.io_blocked_share() >= IO_WAIT_FRACTION)
        .collect();
    if procs.is_empty() {
        return None;
    }
    procs.sort_by_key(|p| std::cmp::Reverse(p.io_blocked_ns()));
    let read_bytes = f.procs.iter().map(|p| p.read_bytes).sum();
    Some(IoThrottle { limit, procs, read_bytes })
}

/// The GPU (or the training log) stalled while every traced process sat idle (no CPU, no
/// I/O), none stopped or in D state.
pub fn deadlock(c: &Ctx) -> Option<Verdict> {
    let f = c.f;
    let idle = all_idle(f)?;
    let mut chain = c.chain();
    for (p, since) in &idle {
        let secs = f.end_ns.saturating_sub(*since) as f64 / 1e9;
        chain.at(f, *since, format!("{} used no CPU and did no I/O for {secs:.1} s", name(p)));
    }
    let procs: Vec<&ProcFacts> = idle.iter().map(|(p, _)| *p).collect();
    super::stacks::blocked_links(f, &procs, &mut chain);
    let text = "The job stalled while every traced process sat idle (no CPU, no I/O, none stopped or in D state): a deadlock or a wait on something outside the job (a collective waiting for another rank, a lock).".into();
    let advice = vec!["take Python stacks of the idle processes (py-spy dump --pid PID) and check the other ranks: one rank dead or slow leaves the rest waiting in a collective".into()];
    Some(c.verdict(Cause::Deadlock, text, procs.iter().map(|p| p.pid).collect(), chain, advice))
}

/// Every live process with when it went idle, where all of them have been idle for
/// [`HUNG_NS`] or more and the GPU or the training log stalled.
fn all_idle(f: &Facts) -> Option<Vec<(&ProcFacts, u64)>> {
    let stall_signal = !f.gpu_stalls.is_empty() || f.data_time_rise_ns.is_some();
    let alive = f.procs.iter().filter(|p| p.alive);
    let idle: Option<Vec<(&ProcFacts, u64)>> = alive
        .map(|p| p.idle_since_ns.filter(|s| f.end_ns.saturating_sub(*s) >= HUNG_NS).map(|s| (p, s)))
        .collect();
    idle.filter(|v| stall_signal && !v.is_empty())
}

/// A worker not scheduled since this long after its trainer's wait began still counts as
/// having stopped then: the context samples that tell it come once a second.
const ASLEEP_SLACK_NS: u64 = 1_500_000_000;

/// The trainer or rank waiting for data at the end for [`HUNG_NS`] or more, and its workers
/// that have not run since that wait began (oldest first): the trainer waits for a batch
/// that will not come. Its other workers ran meanwhile (DataLoader's wait on its index queue
/// times out every 5 s), so the ones that did not are the ones it waits for.
fn stuck_workers(f: &Facts) -> Option<StuckWorkers<'_>> {
    super::datawait::waiters(f).into_iter().find_map(|(main, _, _)| {
        let open = main.offcpu.as_ref()?.open_data_wait?;
        if open.ns < HUNG_NS {
            return None;
        }
        let mut stuck: Vec<&ProcFacts> = f
            .procs
            .iter()
            .filter(|p| p.alive && p.is_worker && p.dataloader_pid.unwrap_or(p.ppid) == main.pid)
            .filter(|p| {
                p.asleep.as_ref().is_some_and(|a| {
                    a.since_ns <= open.since_ns + ASLEEP_SLACK_NS
                        && f.end_ns.saturating_sub(a.since_ns) >= HUNG_NS
                })
            })
            .collect();
        stuck.sort_by_key(|p| (p.asleep.as_ref().map_or(0, |a| a.since_ns), p.pid));
        (!stuck.is_empty()).then_some(StuckWorkers { main, open, stuck })
    })
}

/// A trainer or rank that waits for a batch that will not come, and the workers it waits for.
struct StuckWorkers<'a> {
    main: &'a ProcFacts,
    /// Its wait in progress at the end.
    open: crate::model::offcpu::OpenWaitSummary,
    /// Its workers not run since that wait began, oldest first.
    stuck: Vec<&'a ProcFacts>,
}

/// The trainer has waited for data for [`HUNG_NS`] or more and the worker whose batch it waits
/// for has not run since: a deadlocked worker (a lock inherited locked at fork, a queue
/// nothing feeds). Found from the open wait, without a GPU stall or a training log.
pub fn stuck_worker(c: &Ctx) -> Option<Verdict> {
    let f = c.f;
    let StuckWorkers { main, open, stuck } = stuck_workers(f)?;
    let mut chain = c.chain();
    chain.at(
        f,
        open.since_ns,
        format!(
            "{} began waiting for data and was still waiting at the end, {:.1} s later",
            name(main),
            open.ns as f64 / 1e9
        ),
    );
    let asleep = |p: &ProcFacts| p.asleep.clone().expect("stuck workers are asleep");
    for p in &stuck {
        let a = asleep(p);
        chain.at(
            f,
            a.since_ns,
            format!("{} was last scheduled{}", name(p), wchan_clause(&a.wchan)),
        );
    }
    super::stacks::blocked_links(f, &stuck, &mut chain);
    let first = stuck[0];
    let a = asleep(first);
    let names: Vec<String> = stuck.iter().map(|p| name(p)).collect();
    let line = super::stacks::blocked_at(f, first).map_or(String::new(), |b| format!(" ({b})"));
    let text = format!(
        "The input pipeline is stuck, not slow: {} has waited for data {:.1} s (since {}), and {} {} not run since {}{}{line}: the batch it waits for will not come (a lock inherited locked when the worker was forked, a queue nothing feeds, a wait on something outside the job){}.",
        name(main),
        open.ns as f64 / 1e9,
        at(f, open.since_ns),
        names.join(", "),
        if stuck.len() == 1 { "has" } else { "have" },
        at(f, a.since_ns),
        wchan_clause(&a.wchan),
        gpu_clause(f)
    );
    let advice = vec![
        format!("see where it waits: py-spy dump --pid {} (the line that blocks), and the trainer's with py-spy dump --pid {}", first.pid, main.pid),
        "a lock or a thread state copied into a forked worker (logging, a cache, a client library's lock held by another thread at fork) is the usual cause: start the workers with multiprocessing_context=\"forkserver\" or \"spawn\", or create such objects inside the worker (worker_init_fn)".to_string(),
        format!("set DataLoader(timeout=...) so a stuck batch raises instead of hanging, and stop the whole job, not only {}: a worker stuck in a lock does not notice its trainer's exit (gpustall trace --stop-job stops every process of the job)", name(main)),
    ];
    Some(c.verdict(Cause::Deadlock, text, stuck.iter().map(|p| p.pid).collect(), chain, advice))
}

/// " (asleep in futex_wait_queue)", or nothing where the kernel hid it.
fn wchan_clause(wchan: &str) -> String {
    if wchan.is_empty() {
        String::new()
    } else {
        format!(" (asleep in {wchan})")
    }
}

/// A process blocked on I/O this share of its time is said to have waited on I/O; a
/// disk-bound verdict needs half.
const SOME_IO_SHARE: f64 = 0.1;
/// Processes shorter than this (ldconfig, a shell) are blocked on I/O for most of their few
/// milliseconds: not the job waiting on I/O.
const SOME_IO_MIN_LIFE_NS: u64 = 1_000_000_000;

/// Nothing measured explains a stall.
pub fn none_detected(c: &Ctx) -> Verdict {
    // Only what was measured absent is said absent: a process that sat blocked on I/O for a
    // while, short of a disk-bound verdict, is not "no disk wait"; it is named.
    let most_io = most_blocked_on_io(c.f);
    let text = format!(
        "No memory pressure, OOM kill, hung process{} or GPU throttling in the traced tree{}{}.",
        if most_io.is_some() { "" } else { ", disk wait" },
        most_io.map_or(String::new(), |p| format!(
            "; {} was blocked on I/O {:.0} % of its time, {}",
            name(p),
            100.0 * p.io_blocked_share(),
            // Half or more with no verdict: the job's block requests were not seen.
            if p.io_blocked_share() < IO_WAIT_FRACTION {
                "short of the half that makes a disk-bound pipeline"
            } else {
                "yet no block I/O of the job's was counted (a network filesystem's reads, or bios a cgroup I/O limit issued from a kernel thread, are no process's)"
            }
        )),
        gpu_clause(c.f)
    );
    c.verdict(Cause::NoneDetected, text, Vec::new(), c.chain(), Vec::new())
}

/// The process (of [`SOME_IO_MIN_LIFE_NS`] or more) blocked on I/O the largest share of its
/// life, where that is [`SOME_IO_SHARE`] or more.
fn most_blocked_on_io(f: &Facts) -> Option<&ProcFacts> {
    f.procs
        .iter()
        .filter(|p| p.lifetime_ns >= SOME_IO_MIN_LIFE_NS && p.io_blocked_share() >= SOME_IO_SHARE)
        .max_by(|a, b| a.io_blocked_share().total_cmp(&b.io_blocked_share()))
}
