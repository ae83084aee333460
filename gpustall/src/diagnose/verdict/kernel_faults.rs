//! Verdicts from the kernel log (`model::kernlog`): a GPU or driver fault (an Xid), a task the
//! kernel reports as hung, a storage error or a network filesystem that stopped answering.
//! The first lines kept, and the verdict's own, also go into every verdict's evidence
//! ([`links`]), so that a fault that does not explain the stall is still in front of the
//! reader; the rest are counted there, not listed. Only the kernel's own lines (and user
//! space's where `--trust-user-kernel-log` says so) make a verdict: a line any process can
//! write into the log is shown as user space's.

use super::evidence::{at, thousands, Chain};
use super::rules::Ctx;
use super::{Cause, Verdict};
use crate::diagnose::facts::Facts;
use crate::model::kernlog::{xid_meaning, KernelLogLine, LogOrigin, LogWhat, XidSide};

fn advice_for(side: XidSide) -> &'static str {
    match side {
        XidSide::Hardware => "drain the node (no new jobs on this GPU), reset the GPU (nvidia-smi -r, or reboot) and run the GPU's diagnostics (dcgmi diag -r 3); a repeated hardware Xid means the GPU or its slot must be replaced: report it with `nvidia-bug-report.sh`",
        XidSide::Driver => "reset the GPU (nvidia-smi -r, or reboot the node) and check the driver version against NVIDIA's known issues; report it with `nvidia-bug-report.sh` if it repeats",
        XidSide::Application => "the job's own GPU code faulted: rerun with CUDA_LAUNCH_BLOCKING=1 and compute-sanitizer to find the kernel; the GPU itself needs no action",
        XidSide::Consequence => "none on its own: it follows another fault or the end of a process",
    }
}

/// Kernel-log lines listed in a verdict's evidence at most, besides the verdict's own.
pub const EVIDENCE_LINES: usize = 8;

/// `+1.2s: the kernel log: "..." (20,000 lines like it, the last at +4.0s)`, or user space's.
fn line_link(f: &Facts, l: &KernelLogLine) -> String {
    let source = match l.origin {
        LogOrigin::Kernel => "the kernel log",
        LogOrigin::UserSpace => {
            "written into the kernel log by user space (not the kernel's: no verdict rests on it)"
        }
        LogOrigin::UserSpaceTrusted => {
            "written into the kernel log by user space, counted as the kernel's (--trust-user-kernel-log)"
        }
    };
    let repeats = if l.count > 1 {
        format!(" ({} lines like it, the last at {})", thousands(l.count), at(f, l.last_ns()))
    } else {
        String::new()
    };
    format!("{}: {source}: \"{}\"{repeats}", at(f, l.t_ns), l.text)
}

/// The first [`EVIDENCE_LINES`] kept kernel-log lines (each with its count), those `cited`
/// (the verdict's own, by their first record's sequence number) whatever their place, and the
/// rest counted in one link; the records the reader missed, and the lines it dropped.
pub fn links(f: &Facts, cited: &[u64], chain: &mut Chain) {
    let mut listed = 0;
    let (mut rest_lines, mut rest_distinct, mut rest_last) = (0u64, 0u64, 0u64);
    for l in &f.kernel_log {
        if listed < EVIDENCE_LINES || cited.contains(&l.seq) {
            chain.push(l.t_ns, line_link(f, l));
            listed += 1;
        } else {
            rest_lines = rest_lines.saturating_add(l.count.max(1));
            rest_distinct += 1;
            rest_last = rest_last.max(l.last_ns());
        }
    }
    if rest_lines > 0 {
        chain.push(
            rest_last,
            format!(
                "and {} more lines of the kernel log like these ({} distinct), not listed",
                thousands(rest_lines),
                thousands(rest_distinct)
            ),
        );
    }
    for x in &f.gpu_xids {
        chain.at(f, x.t_ns, format!("NVML: GPU {} ({}) raised Xid {}", x.index, x.uuid, x.xid));
    }
    if f.kernel_log_missed > 0 {
        chain.push(
            f.start_ns,
            format!(
                "{} records of the kernel log were overwritten before gpustall read them",
                thousands(f.kernel_log_missed)
            ),
        );
    }
    if f.kernel_log_dropped > 0 {
        chain.push(
            f.start_ns,
            format!(
                "{} lines of the kernel log were not kept: unlike every line kept, and of a kind gpustall had its {} distinct lines of already",
                thousands(f.kernel_log_dropped),
                crate::model::kernlog::DISTINCT_PER_KIND
            ),
        );
    }
}

/// The lines a verdict may rest on: the kernel's own (and user space's where trusted).
pub(super) fn trusted(f: &Facts) -> impl Iterator<Item = &KernelLogLine> {
    f.kernel_log.iter().filter(|l| l.origin.is_trusted())
}

fn of(f: &Facts, what: LogWhat) -> impl Iterator<Item = &KernelLogLine> {
    trusted(f).filter(move |l| l.what == what)
}

/// One GPU fault, from the driver's kernel-log line or NVML's event.
struct Fault {
    t_ns: u64,
    /// The kernel-log line's first record (`None`: NVML's event).
    seq: Option<u64>,
    /// The lines it stands for.
    count: u64,
    xid: u32,
    side: XidSide,
    meaning: &'static str,
    /// "at PCI 0000:3b:00" (the kernel log) or "0 (GPU-...)" (NVML).
    gpu: String,
    pid: Option<u32>,
    comm: Option<String>,
    source: &'static str,
}

/// The faults of the trace: the driver's Xid lines, else (no kernel log: a container without
/// /dev/kmsg) NVML's Xid events. Consequences of another fault (Xid 45) are left out.
fn faults(f: &Facts) -> Vec<Fault> {
    let from_log = of(f, LogWhat::GpuXid).filter_map(|l| {
        let xid = l.xid?;
        let (side, meaning) = xid_meaning(xid);
        Some(Fault {
            t_ns: l.t_ns,
            seq: Some(l.seq),
            count: l.count.max(1),
            xid,
            side,
            meaning,
            gpu: gpu_at(f, l.device.as_deref()),
            pid: l.pid,
            comm: l.comm.clone(),
            source: "in the kernel log",
        })
    });
    let mut v: Vec<Fault> = from_log.collect();
    if v.is_empty() {
        v = f
            .gpu_xids
            .iter()
            .map(|x| {
                let xid = u32::try_from(x.xid).unwrap_or(u32::MAX);
                let (side, meaning) = xid_meaning(xid);
                Fault {
                    t_ns: x.t_ns,
                    seq: None,
                    count: 1,
                    xid,
                    side,
                    meaning,
                    gpu: match &x.pci_bus_id {
                        Some(bus) => format!("{} ({}, PCI {bus})", x.index, x.uuid),
                        None => format!("{} ({})", x.index, x.uuid),
                    },
                    pid: None,
                    comm: None,
                    source: "through NVML",
                }
            })
            .collect();
    }
    v.retain(|x| x.side != XidSide::Consequence);
    v
}

/// "at PCI 0000:3b:00", with NVML's index and UUID of the GPU at that address where a GPU
/// sample gave it.
fn gpu_at(f: &Facts, bus: Option<&str>) -> String {
    let Some(bus) = bus else { return "at PCI ?".into() };
    match f.gpus.iter().find(|g| g.pci_bus_id.as_deref() == Some(bus)) {
        Some(g) => format!("{} ({}) at PCI {bus}", g.index, g.uuid),
        None => format!("at PCI {bus}"),
    }
}

/// The GPU or its driver reported a fault (an Xid other than a consequence of another fault).
pub fn gpu_fault(c: &Ctx) -> Option<Verdict> {
    let f = c.f;
    let faults = faults(f);
    // The worst first: hardware, then the driver, then the application.
    let rank = |s: XidSide| match s {
        XidSide::Hardware => 0,
        XidSide::Driver => 1,
        _ => 2,
    };
    let first = faults.iter().min_by_key(|x| (rank(x.side), x.t_ns))?;
    let by = match (first.pid, &first.comm) {
        (Some(p), Some(c)) => format!(" in {c} (pid {p})"),
        (Some(p), None) => format!(" in pid {p}"),
        _ => String::new(),
    };
    let all: u64 = faults.iter().map(|x| x.count).sum();
    let more =
        if all > 1 { format!(" ({} Xid errors in all)", thousands(all)) } else { String::new() };
    let text = format!(
        "The GPU {} reported Xid {} {} at {}{by}: {}{more}. A GPU or driver fault stalls a job like a starved GPU does (utilisation at 0 %, the process alive); this one is on the {} side.",
        first.gpu,
        first.xid,
        first.source,
        at(f, first.t_ns),
        first.meaning,
        match first.side {
            XidSide::Hardware => "hardware",
            XidSide::Driver => "driver",
            _ => "application",
        }
    );
    let culprits = first.pid.filter(|p| f.procs.iter().any(|q| q.pid == *p)).into_iter().collect();
    let advice = vec![advice_for(first.side).to_string()];
    let chain = c.chain_citing(&first.seq.into_iter().collect::<Vec<_>>());
    Some(c.verdict(Cause::GpuFault, text, culprits, chain, advice))
}

/// The kernel's hung-task detector reported a process of the job.
pub fn hung_task(c: &Ctx) -> Option<Verdict> {
    let f = c.f;
    let hung: Vec<&KernelLogLine> =
        of(f, LogWhat::HungTask).chain(of(f, LogWhat::SoftLockup)).collect();
    let first = hung.iter().min_by_key(|l| l.t_ns)?;
    let pid = first.pid?;
    let who = f.procs.iter().find(|p| p.pid == pid).map_or_else(
        || format!("{} (pid {pid})", first.comm.as_deref().unwrap_or("?")),
        super::evidence::name,
    );
    let storage = storage_troubles(f);
    let why = if storage.is_empty() {
        String::new()
    } else {
        format!("; the kernel also logged {}", storage.join(", "))
    };
    let (what, advice) = if first.what == LogWhat::SoftLockup {
        ("stuck on a CPU in the kernel (a soft lockup)", "a soft lockup is a kernel or driver bug: the stack in the kernel log names the function; update the kernel or the driver named there")
    } else {
        ("blocked in uninterruptible sleep (D) past the kernel's hung-task timeout", "a task in D state waits on the kernel: its storage or network filesystem (see the kernel log around it), or a driver; `cat /proc/PID/stack` as root shows where")
    };
    // Where it waits, where gpustall's own readings of the process caught it in D state.
    let wchan = f
        .procs
        .iter()
        .find(|p| p.pid == pid)
        .and_then(|p| p.stuck.as_ref())
        .filter(|s| !s.wchan.is_empty())
        .map_or(String::new(), |s| format!(" (waiting in {})", s.wchan));
    let text = format!(
        "The kernel reports {who} {what}{wchan} at {}{why}: the job cannot make progress until that returns.",
        at(f, first.t_ns)
    );
    let culprits = hung.iter().filter_map(|l| l.pid).collect();
    let mut chain = c.chain_citing(&[first.seq]);
    let hung_procs: Vec<&crate::diagnose::facts::ProcFacts> =
        f.procs.iter().filter(|p| hung.iter().any(|l| l.pid == Some(p.pid))).collect();
    super::stacks::blocked_links(f, &hung_procs, &mut chain);
    Some(c.verdict(Cause::HungTask, text, culprits, chain, vec![advice.to_string()]))
}

/// Storage errors and unresponsive network filesystems, as "NAME (what)", first seen first.
fn storage_troubles(f: &Facts) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for l in trusted(f) {
        let what = match l.what {
            LogWhat::IoError => "I/O errors",
            LogWhat::FsError => "filesystem errors",
            LogWhat::RemoteFsDown => "a server not responding",
            _ => continue,
        };
        let dev = l.device.as_deref().unwrap_or("?");
        // A disk the job read or wrote (its block I/O), said so: the error is on its path.
        let used = f.disks.iter().any(|d| d.name == dev);
        let s = format!("{what} on {dev}{}", if used { " (a disk the job uses)" } else { "" });
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// The kernel logged I/O or filesystem errors, or a network filesystem's server stopped
/// answering (and for how long, where it answered again).
pub fn storage_error(c: &Ctx) -> Option<Verdict> {
    let f = c.f;
    let troubles = storage_troubles(f);
    let first = trusted(f)
        .find(|l| matches!(l.what, LogWhat::IoError | LogWhat::FsError | LogWhat::RemoteFsDown))?;
    let mut outage = String::new();
    let mut cited = vec![first.seq];
    if first.what == LogWhat::RemoteFsDown {
        let back =
            of(f, LogWhat::RemoteFsUp).find(|u| u.device == first.device && u.t_ns >= first.t_ns);
        cited.extend(back.map(|u| u.seq));
        let back = back.map(|u| u.t_ns);
        let secs = back.unwrap_or(f.end_ns).saturating_sub(first.t_ns) as f64 / 1e9;
        outage = match back {
            Some(_) => format!(" for {secs:.1} s, then answered again"),
            None => format!(" and had not answered {secs:.1} s later, at the end of the trace"),
        };
    }
    let text = format!(
        "The kernel logged {} from {}{outage}: the job's reads and writes there fail or wait, and the stall follows from it, not from the job.",
        troubles.join(", "),
        at(f, first.t_ns)
    );
    let advice = vec!["check the device or the server the kernel names (dmesg -T around that time; smartctl or nvme smart-log for a local disk; the NFS or CIFS server and the network to it); move the job's data or checkpoints elsewhere until it is fixed".to_string()];
    Some(c.verdict(Cause::StorageError, text, Vec::new(), c.chain_citing(&cited), advice))
}
