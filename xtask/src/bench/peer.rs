//! `cargo xtask bench --only peer`: gpustall against the bpftrace script a user would write for
//! the same questions (`xtask/bench/peer.bt`), on one workload, in one run.
//!
//! The workload: 40,000 4 KiB O_DIRECT reads (dd), then three workers allocating 200 MiB each
//! in a 200 MiB memory cgroup with swap. Run untraced, under gpustall alone, under the peer
//! alone (wall-time ratios), then under both at once (three runs, summed): each program's runs
//! and run time from the kernel's BPF stats (kernel.bpf_stats_enabled), both tracers' agent
//! CPU, and the ratio gpustall / peer. In those runs a third bpftrace holds a program that does
//! nothing on each of those tracepoints (`xtask/bench/floor.bt`): its ns per run is the floor
//! any program pays on that event, so the table also says what gpustall's and the peer's runs
//! would cost if every program did nothing.
//!
//! `outside_cases` (`--only outside`, and after the peer in a whole run): the cost gpustall adds
//! to processes it does not trace. gpustall traces an idle job while a fork-heavy loop
//! (`/bin/true` spawned 3,000 times), O_DIRECT reads, then a context-switch-heavy one (two
//! threads ping-ponging a byte over pipes) run outside it; ns per run of each program.

use std::{
    io::{BufRead as _, Read as _, Write as _},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use serde_json::Value;
use tests::{
    cgroup::MemCgroup,
    kernel::SwapFile,
    procs::{Tracer, Workload},
};

use super::{
    common::{release_bin, tracepoint_of, usage, BpfStats, Program, TracedSummary},
    doc::num,
    floor::Floor,
};
use crate::util::{run_cmd, workspace_root};

const READS: u64 = 40_000;
const WORKERS_MIB: &str = "200,200,200";
const MEMCG_MIB: u64 = 200;
/// Runs with both tracers attached; the table sums them.
const BOTH_ROUNDS: usize = 3;

fn bin(name: &str) -> PathBuf {
    release_bin(name)
}

/// Installs bpftrace from Debian when missing.
fn ensure_bpftrace() -> anyhow::Result<()> {
    if Command::new("bpftrace").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return Ok(());
    }
    eprintln!("bench: installing bpftrace (apt-get install -y bpftrace)");
    run_cmd(
        Command::new("apt-get")
            .args(["install", "-y", "bpftrace"])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// One program's kernel statistics.
#[derive(Clone, Debug)]
struct Prog {
    name: String,
    runs: u64,
    run_ns: u64,
    /// A typed (tp_btf) or raw tracepoint program, not a classic one.
    typed: bool,
}

/// One tracer's program on a tracepoint, both attached, summed over the rounds.
#[derive(serde::Serialize, serde::Deserialize, Debug, Default, PartialEq)]
pub struct PeerProgram {
    pub runs: u64,
    pub run_time_ns: u64,
    pub ns_per_run: f64,
}

/// A tracepoint that gpustall's or the peer's programs ran on.
#[derive(serde::Serialize, serde::Deserialize, Debug, Default, PartialEq)]
pub struct PeerRow {
    pub tracepoint: String,
    pub gpustall: Option<PeerProgram>,
    pub peer: Option<PeerProgram>,
}

/// A tracepoint of gpustall's against the floors of both kinds.
#[derive(serde::Serialize, serde::Deserialize, Debug, Default, PartialEq)]
pub struct FloorRow {
    pub tracepoint: String,
    pub typed: bool,
    pub classic_floor_ns_per_run: Option<f64>,
    pub typed_floor_ns_per_run: Option<f64>,
    pub gpustall_ns_per_run: f64,
    pub peer_ns_per_run: Option<f64>,
}

/// The floor in the same runs: what the runs cost at the floor of their kind.
#[derive(serde::Serialize, serde::Deserialize, Debug, Default, PartialEq)]
pub struct FloorReport {
    pub programs: Vec<FloorRow>,
    pub gpustall_runs_at_floor_ms: f64,
    pub peer_runs_at_floor_ms: f64,
    pub gpustall_runs_counted: u64,
    pub gpustall_runs_elsewhere: u64,
    pub floor_to_peer_total: f64,
}

/// The peer case's figures (drawn by `doc::peer`).
#[derive(serde::Serialize, serde::Deserialize, Debug, Default, PartialEq)]
pub struct PeerReport {
    pub programs: Vec<PeerRow>,
    pub gpustall_kernel_ms: f64,
    pub peer_kernel_ms: f64,
    pub gpustall_runs: u64,
    pub peer_runs: u64,
    pub gpustall_agent_cpu_ms: f64,
    pub peer_agent_cpu_ms: f64,
    pub gpustall_total_ms: f64,
    pub peer_total_ms: f64,
    pub ratio_gpustall_to_peer: f64,
    pub wall_untraced_s: f64,
    pub wall_gpustall_s: f64,
    pub wall_peer_s: f64,
    pub wall_both_s: f64,
    pub both_rounds: usize,
    pub floor: FloorReport,
}

/// The programs a process holds, from /proc/PID/fdinfo (runs, run time) and the kernel's
/// program info (name).
fn programs_of(pid: u32) -> Vec<Prog> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return out };
    for e in dir.flatten() {
        let Ok(info) = std::fs::read_to_string(e.path()) else { continue };
        let field = |k: &str| {
            info.lines().find_map(|l| l.strip_prefix(k)?.trim().parse::<u64>().ok()).unwrap_or(0)
        };
        let id = field("prog_id:");
        if id == 0 || !info.contains("run_cnt:") {
            continue;
        }
        let name = prog_name(id as u32).unwrap_or_else(|| format!("prog{id}"));
        out.push(Prog {
            name,
            runs: field("run_cnt:"),
            run_ns: field("run_time_ns:"),
            typed: false,
        });
    }
    out
}

/// A loaded program's name (the kernel keeps 15 characters).
fn prog_name(id: u32) -> Option<String> {
    const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    let mut attr = [0u64; 16];
    attr[0] = id as u64;
    // SAFETY: bpf(2) with a zeroed attr holding prog_id; returns a new fd or -1.
    let fd =
        unsafe { libc::syscall(libc::SYS_bpf, BPF_PROG_GET_FD_BY_ID, attr.as_mut_ptr(), 128usize) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a fresh fd we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut info = [0u8; 256];
    let mut attr = [0u64; 16];
    attr[0] = fd.as_raw_fd() as u64 | ((info.len() as u64) << 32);
    attr[1] = info.as_mut_ptr() as u64;
    // SAFETY: bpf_fd, info_len, info pointer into a live buffer of that length.
    let r = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_OBJ_GET_INFO_BY_FD, attr.as_mut_ptr(), 128usize)
    };
    if r < 0 {
        return None;
    }
    // struct bpf_prog_info: name[16] at byte 64.
    let name = &info[64..80];
    let end = name.iter().position(|&b| b == 0).unwrap_or(16);
    Some(String::from_utf8_lossy(&name[..end]).into_owned())
}

/// peer.bt's probes in load order (bpftrace 0.17 names its programs after the probe, cut to
/// 15 characters, so the bench names them by order), as gpustall's programs are named.
const PEER_ORDER: [&str; 7] = [
    "block_io_start",
    "mm_vmscan_direct_reclaim_begin",
    "mm_vmscan_memcg_reclaim_begin",
    "mm_vmscan_direct_reclaim_end",
    "mm_vmscan_memcg_reclaim_end",
    "mm_vmscan_write_folio",
    "mark_victim",
];

/// floor.bt's probes in load order.
const FLOOR_ORDER: [&str; 10] = [
    "block_bio_queue",
    "block_io_start",
    "block_io_done",
    "mm_vmscan_write_folio",
    "mm_vmscan_memcg_reclaim_begin",
    "mm_vmscan_memcg_reclaim_end",
    "sched_switch",
    "sched_waking",
    "hrtimer_expire_entry",
    "hrtimer_expire_exit",
];

/// The events the typed floor (`floor`) attaches to: where gpustall runs typed programs
/// (floor.bt's, less the hrtimer ones, which are classic).
const TYPED_FLOOR: &[&str] = FLOOR_ORDER.split_at(8).0;

/// A bpftrace's programs, named by the tracepoint each serves (`order`: the script's probes).
fn named(progs: &[Prog], order: &[&str]) -> Vec<Prog> {
    let name = |i: usize, p: &Prog| order.get(i).map_or_else(|| p.name.clone(), |s| s.to_string());
    progs.iter().enumerate().map(|(i, p)| Prog { name: name(i, p), ..p.clone() }).collect()
}

/// The workload as one traced job: dd's direct reads, then the swapping workers.
fn start_workload(data: &str) -> anyhow::Result<(Workload, MemCgroup)> {
    let cg = MemCgroup::new("bench-peer", MEMCG_MIB, true);
    let script = format!(
        "dd if={data} of=/dev/null bs=4096 count={READS} iflag=direct status=none && exec {} hog {WORKERS_MIB} 8 0 </dev/null",
        bin("gpustall-workload").display()
    );
    let w = Workload::start(&bin("gpustall-workload"), &["spawn", "sh", "-c", &script], Some(&cg));
    Ok((w, cg))
}

/// bpftrace running one of the bench's scripts, once all its programs are attached.
struct Bpftrace {
    child: Child,
}

impl Bpftrace {
    /// The peer (peer.bt).
    fn peer() -> anyhow::Result<Self> {
        Self::start("peer.bt", PEER_ORDER.len())
    }

    /// The floor (floor.bt).
    fn floor() -> anyhow::Result<Self> {
        Self::start("floor.bt", FLOOR_ORDER.len())
    }

    fn start(script: &str, programs: usize) -> anyhow::Result<Self> {
        let script = workspace_root().join("xtask/bench").join(script);
        let mut child = Command::new("bpftrace")
            .arg(&script)
            .env("BPFTRACE_MAP_KEYS_MAX", "65536")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting bpftrace")?;
        let out = child.stdout.take().context("stdout")?;
        let mut lines = std::io::BufReader::new(out).lines();
        for line in lines.by_ref() {
            if line?.starts_with("Attaching") {
                break;
            }
        }
        // Wait until every program is attached (they load after the line is printed).
        let t = Instant::now();
        while programs_of(child.id()).len() < programs && t.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(300));
        std::thread::spawn(move || for _ in lines {});
        Ok(Self { child })
    }

    /// SIGINT (bpftrace prints its maps and exits), then SIGKILL after 10 s: bpftrace 0.17
    /// once stayed in its poll loop after a SIGINT (the bench hung for 10 minutes). Its
    /// programs' figures were read before.
    fn stop(mut self) {
        // SAFETY: SIGINT to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("bench: bpftrace did not exit on SIGINT; killing it");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Which tracers watch one run of the workload.
#[derive(Clone, Copy, PartialEq)]
enum Under {
    Nothing,
    Gpustall,
    Peer,
    Both,
}

struct RunResult {
    wall_s: f64,
    gpustall: Option<Value>,
    /// The peer's programs, named by tracepoint.
    peer: Vec<Prog>,
    peer_cpu_s: f64,
    /// The floors' programs (runs with both attached), named by tracepoint: bpftrace's
    /// classic ones and this process's raw ones (`typed`).
    floor: Vec<Prog>,
}

fn run_once(under: Under, data: &str) -> anyhow::Result<RunResult> {
    let (mut w, _cg) = start_workload(data)?;
    let peer = matches!(under, Under::Peer | Under::Both).then(Bpftrace::peer).transpose()?;
    let floor = (under == Under::Both).then(Bpftrace::floor).transpose()?;
    let typed_floor = match under {
        Under::Both => TYPED_FLOOR.iter().map(|e| Floor::attach(e)).collect(),
        _ => Ok(Vec::new()),
    };
    let typed_floor = typed_floor.context("the typed floor")?;
    let peer_cpu0 = peer.as_ref().map_or(0.0, |p| usage(p.child.id()).map_or(0.0, |u| u.0));
    let tracer = matches!(under, Under::Gpustall | Under::Both)
        .then(|| Tracer::start(w.pid(), &["--quiet"]));
    let t0 = Instant::now();
    w.go();
    let (code, _) = w.wait(Duration::from_secs(600));
    let wall_s = t0.elapsed().as_secs_f64();
    anyhow::ensure!(code == Some(0), "the workload failed ({code:?})");
    let gpustall = tracer.map(|t| t.wait(Duration::from_secs(60)).summary);
    let (progs, cpu) = match &peer {
        Some(p) => (
            named(&programs_of(p.child.id()), &PEER_ORDER),
            usage(p.child.id()).map_or(0.0, |u| u.0) - peer_cpu0,
        ),
        None => (Vec::new(), 0.0),
    };
    let mut floor_progs =
        floor.as_ref().map_or_else(Vec::new, |f| named(&programs_of(f.child.id()), &FLOOR_ORDER));
    floor_progs.extend(typed_floor.iter().map(|f| {
        let (runs, run_ns) = f.stats();
        Prog { name: f.event.to_string(), runs, run_ns, typed: true }
    }));
    for t in [peer, floor].into_iter().flatten() {
        t.stop();
    }
    Ok(RunResult { wall_s, gpustall, peer: progs, peer_cpu_s: cpu, floor: floor_progs })
}

/// gpustall's programs from its summary (named by their tracepoint; `typed` for the BTF twin).
fn gpustall_programs(summary: &TracedSummary) -> Vec<Prog> {
    let prog = |p: &Program| Prog {
        name: tracepoint_of(&p.name).to_string(),
        runs: p.run_count,
        run_ns: p.run_time_ns,
        typed: tracepoint_of(&p.name) != p.name,
    };
    summary.overhead.programs.iter().map(prog).collect()
}

/// Adds one round's programs into the running sums, by name.
fn add_into(sum: &mut Vec<Prog>, round: Vec<Prog>) {
    for p in round {
        match sum.iter_mut().find(|s| s.name == p.name && s.typed == p.typed) {
            Some(s) => {
                s.runs += p.runs;
                s.run_ns += p.run_ns;
            }
            None => sum.push(p),
        }
    }
}

fn ns_per_run(p: &Prog) -> f64 {
    if p.runs == 0 {
        0.0
    } else {
        p.run_ns as f64 / p.runs as f64
    }
}

/// A file of `mib` MiB of zeros to read back with O_DIRECT, in a scratch directory removed when
/// the first value is dropped.
fn data_file(tag: &str, mib: u64) -> anyhow::Result<(tests::TempDir, String)> {
    let scratch = tests::TempDir::new_in("/var/tmp", tag);
    let data = scratch.path("reads.dat");
    let data = data.to_str().context("utf-8 path")?.to_string();
    run_cmd(Command::new("dd").args([
        "if=/dev/zero",
        &format!("of={data}"),
        "bs=1M",
        &format!("count={mib}"),
        "status=none",
    ]))?;
    Ok((scratch, data))
}

pub fn run() -> anyhow::Result<Value> {
    ensure_bpftrace()?;
    let _stats = BpfStats::enable();
    let _swap = SwapFile::ensure(1024);
    let (_scratch, data) = data_file("bench-peer", READS * 4096 / (1 << 20) + 1)?;

    let mut walls = Vec::new();
    for under in [Under::Nothing, Under::Gpustall, Under::Peer] {
        let r = run_once(under, &data)?;
        eprintln!("bench peer: workload {:.2} s", r.wall_s);
        walls.push(r.wall_s);
    }
    // Both attached, BOTH_ROUNDS times: runs and run time summed per program over the rounds
    // (a shared machine's noise moves single runs by a third).
    let (mut ours, mut peer, mut floor, mut ours_cpu, mut peer_cpu, mut both_wall) =
        (Vec::new(), Vec::new(), Vec::new(), 0.0, 0.0, 0.0);
    for _ in 0..BOTH_ROUNDS {
        let both = run_once(Under::Both, &data)?;
        eprintln!("bench peer: workload under both {:.2} s", both.wall_s);
        let summary = TracedSummary::of(&both.gpustall.context("no gpustall summary")?)?;
        add_into(&mut ours, gpustall_programs(&summary));
        add_into(&mut peer, both.peer);
        add_into(&mut floor, both.floor);
        ours_cpu += summary.overhead.cpu_while_tracing_s();
        peer_cpu += both.peer_cpu_s;
        both_wall += both.wall_s / BOTH_ROUNDS as f64;
    }
    let mut report = print_table(&ours, &peer, ours_cpu, peer_cpu, &walls, both_wall);
    report.floor = print_floor(&ours, &peer, &floor, report.peer_total_ms);
    Ok(serde_json::to_value(report)?)
}

fn print_table(
    ours: &[Prog],
    peer: &[Prog],
    ours_cpu: f64,
    peer_cpu: f64,
    walls: &[f64],
    both_wall: f64,
) -> PeerReport {
    let mut names: Vec<&str> = ours.iter().chain(peer).map(|p| p.name.as_str()).collect();
    names.sort();
    names.dedup();
    let find = |v: &[Prog], n: &str| v.iter().find(|p| p.name == n).cloned();
    println!("\n== gpustall vs the bpftrace peer (xtask/bench/peer.bt), both attached, {BOTH_ROUNDS} runs summed ==");
    println!(
        "workload: {READS} x 4 KiB O_DIRECT reads, then 3 x 200 MiB workers in a {MEMCG_MIB} MiB memcg with swap"
    );
    println!(
        "{:<32} {:>9} {:>8} {:>9} | {:>9} {:>8} {:>9}",
        "tracepoint", "runs", "ns/run", "ms", "peer runs", "ns/run", "ms"
    );
    let mut rows = Vec::new();
    let cell = |p: &Option<Prog>| match p {
        Some(p) if p.runs > 0 => {
            format!("{:>9} {:>8.0} {:>9.2}", p.runs, ns_per_run(p), p.run_ns as f64 / 1e6)
        }
        _ => format!("{:>9} {:>8} {:>9}", "-", "-", "-"),
    };
    for n in &names {
        let (a, b) = (find(ours, n), find(peer, n));
        if a.as_ref().map_or(0, |p| p.runs) == 0 && b.as_ref().map_or(0, |p| p.runs) == 0 {
            continue;
        }
        println!("{n:<32} {} | {}", cell(&a), cell(&b));
        let j = |p: &Option<Prog>| {
            p.as_ref().map(|p| PeerProgram {
                runs: p.runs,
                run_time_ns: p.run_ns,
                ns_per_run: ns_per_run(p),
            })
        };
        rows.push(PeerRow { tracepoint: n.to_string(), gpustall: j(&a), peer: j(&b) });
    }
    let total = |v: &[Prog]| v.iter().map(|p| p.run_ns).sum::<u64>() as f64 / 1e6;
    let runs = |v: &[Prog]| v.iter().map(|p| p.runs).sum::<u64>();
    let (ko, kp) = (total(ours), total(peer));
    let (to, tp) = (ko + ours_cpu * 1e3, kp + peer_cpu * 1e3);
    let report = PeerReport {
        programs: rows,
        gpustall_kernel_ms: ko,
        peer_kernel_ms: kp,
        gpustall_runs: runs(ours),
        peer_runs: runs(peer),
        gpustall_agent_cpu_ms: ours_cpu * 1e3,
        peer_agent_cpu_ms: peer_cpu * 1e3,
        gpustall_total_ms: to,
        peer_total_ms: tp,
        ratio_gpustall_to_peer: to / tp,
        wall_untraced_s: walls[0],
        wall_gpustall_s: walls[1],
        wall_peer_s: walls[2],
        wall_both_s: both_wall,
        both_rounds: BOTH_ROUNDS,
        floor: FloorReport::default(),
    };
    let counted = ours.iter().filter(|p| p.runs > 0).count();
    print_totals(&report, counted, peer.len());
    report
}

/// The totals on the terminal: kernel, agent, both, and the wall times.
fn print_totals(r: &PeerReport, ours_programs: usize, peer_programs: usize) {
    println!(
        "kernel: gpustall {ours_programs} programs, {} runs, {:.1} ms | peer {peer_programs} programs, {} runs, {:.1} ms",
        r.gpustall_runs, r.gpustall_kernel_ms, r.peer_runs, r.peer_kernel_ms
    );
    println!(
        "agent CPU while tracing: gpustall {:.1} ms | peer {:.1} ms",
        r.gpustall_agent_cpu_ms, r.peer_agent_cpu_ms
    );
    println!(
        "total: gpustall {:.1} ms | peer {:.1} ms: gpustall / peer = {:.2} (goal <= 0.5)",
        r.gpustall_total_ms, r.peer_total_ms, r.ratio_gpustall_to_peer
    );
    let base = r.wall_untraced_s;
    println!(
        "wall: untraced {base:.2} s, gpustall {:.2} s (x{:.3}), peer {:.2} s (x{:.3}), both {:.2} s (x{:.3})",
        r.wall_gpustall_s,
        r.wall_gpustall_s / base,
        r.wall_peer_s,
        r.wall_peer_s / base,
        r.wall_both_s,
        r.wall_both_s / base
    );
}

/// The floors' ns per run on each tracepoint (classic: bpftrace's floor.bt; typed: a raw
/// tracepoint program of this process), and what gpustall's and the peer's runs cost at the
/// floor of their own kind: the least any tracer running a program on the same events could
/// cost, however little its programs did.
fn print_floor(ours: &[Prog], peer: &[Prog], floor: &[Prog], peer_total_ms: f64) -> FloorReport {
    let find = |v: &[Prog], n: &str| v.iter().find(|p| p.name == n && p.runs > 0).cloned();
    let floor_of = |n: &str, typed: bool| {
        floor.iter().find(|f| f.name == n && f.typed == typed && f.runs > 0).map(ns_per_run)
    };
    println!("\n== the floor: a program that does nothing, on the same events, same runs ==");
    println!(
        "{:<32} {:>13} {:>11} {:>15} {:>11} {:>13}",
        "tracepoint",
        "classic floor",
        "typed floor",
        "gpustall ns/run",
        "peer ns/run",
        "gpustall at it"
    );
    let (mut rows, mut ours_at, mut peer_at, mut ours_runs, mut others) =
        (Vec::new(), 0.0, 0.0, 0u64, 0u64);
    for p in ours.iter().filter(|p| p.runs > 0) {
        let Some(fns) = floor_of(&p.name, p.typed) else {
            others += p.runs;
            continue;
        };
        let at = p.runs as f64 * fns / 1e6;
        ours_at += at;
        ours_runs += p.runs;
        let b = find(peer, &p.name);
        peer_at += b
            .as_ref()
            .and_then(|b| Some(b.runs as f64 * floor_of(&b.name, false)? / 1e6))
            .unwrap_or(0.0);
        let ns = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
        println!(
            "{:<32} {:>13} {:>11} {:>15.0} {:>11} {:>10.2} ms",
            p.name,
            ns(floor_of(&p.name, false)),
            ns(floor_of(&p.name, true)),
            ns_per_run(p),
            ns(b.as_ref().map(ns_per_run)),
            at
        );
        rows.push(FloorRow {
            tracepoint: p.name.clone(),
            typed: p.typed,
            classic_floor_ns_per_run: floor_of(&p.name, false),
            typed_floor_ns_per_run: floor_of(&p.name, true),
            gpustall_ns_per_run: ns_per_run(p),
            peer_ns_per_run: b.as_ref().map(ns_per_run),
        });
    }
    let ours_kernel = ours.iter().map(|p| p.run_ns).sum::<u64>() as f64 / 1e6;
    let peer_kernel = peer.iter().map(|p| p.run_ns).sum::<u64>() as f64 / 1e6;
    println!(
        "at the floor of their kind: gpustall's {ours_runs} runs {ours_at:.1} ms (of its {ours_kernel:.1} ms; {others} runs elsewhere not counted) | the peer's {peer_at:.1} ms (of {peer_kernel:.1} ms)"
    );
    println!(
        "programs that did nothing on gpustall's events would cost x{:.2} the peer's whole cost ({peer_total_ms:.1} ms, agent included)",
        ours_at / peer_total_ms
    );
    FloorReport {
        programs: rows,
        gpustall_runs_at_floor_ms: ours_at,
        peer_runs_at_floor_ms: peer_at,
        gpustall_runs_counted: ours_runs,
        gpustall_runs_elsewhere: others,
        floor_to_peer_total: ours_at / peer_total_ms,
    }
}

/// A program of gpustall's on one load outside the traced job.
#[derive(serde::Serialize, serde::Deserialize, Debug, Default, PartialEq)]
pub struct OutsideProgram {
    pub program: String,
    pub runs: u64,
    pub ns_per_run: f64,
}

/// One load run outside the traced job: what it was, and gpustall's programs that ran.
#[derive(serde::Serialize, serde::Deserialize, Debug, Default, PartialEq)]
pub struct OutsideCase {
    pub load: String,
    pub programs: Vec<OutsideProgram>,
}

/// The outside cases' figures (drawn by `doc::outside`).
#[derive(serde::Serialize, serde::Deserialize, Debug, Default, PartialEq)]
pub struct OutsideReport {
    pub fork_heavy: OutsideCase,
    pub io_heavy: OutsideCase,
    pub context_switch_heavy: OutsideCase,
}

/// gpustall tracing an idle job while `load` runs outside it: each program's runs and ns/run.
fn outside(label: &str, load: &mut dyn FnMut() -> String) -> anyhow::Result<OutsideCase> {
    // A job waiting for its input (never released: no child left behind when it is dropped).
    let idle = Workload::start(&bin("gpustall-workload"), &["spawn", "sleep", "600"], None);
    let tracer = Tracer::start(idle.pid(), &["--quiet"]);
    let what = load();
    let result = tracer.stop();
    drop(idle);
    let progs = gpustall_programs(&TracedSummary::of(&result.summary)?);
    println!("\n== outside the traced job: {label} ({what}) ==");
    println!("{:<32} {:>9} {:>8}", "program", "runs", "ns/run");
    let mut programs = Vec::new();
    for p in progs.iter().filter(|p| p.runs > 0) {
        println!("{:<32} {:>9} {:>8.0}", p.name, p.runs, ns_per_run(p));
        programs.push(OutsideProgram {
            program: p.name.clone(),
            runs: p.runs,
            ns_per_run: ns_per_run(p),
        });
    }
    Ok(OutsideCase { load: what, programs })
}

/// The outside cases (also `--only outside`): a fork-heavy loop, 20,000 O_DIRECT reads, a
/// context-switch-heavy ping-pong, each run by a process gpustall does not trace.
pub fn outside_cases() -> anyhow::Result<Value> {
    let _stats = BpfStats::enable();
    let fork_heavy = outside("fork-heavy", &mut || {
        let t = Instant::now();
        for _ in 0..3000 {
            let _ = Command::new("/bin/true").status();
        }
        format!("3,000 /bin/true in {:.1} s", t.elapsed().as_secs_f64())
    })?;
    let (_scratch, data) = data_file("bench-outside", 80)?;
    let io_heavy = outside("I/O-heavy", &mut || {
        let t = Instant::now();
        let _ = Command::new("dd")
            .args([&format!("if={data}"), "of=/dev/null", "bs=4096", "count=20000", "iflag=direct"])
            .arg("status=none")
            .status();
        format!("20,000 4 KiB O_DIRECT reads in {:.1} s", t.elapsed().as_secs_f64())
    })?;
    let context_switch_heavy = outside("context-switch-heavy", &mut || {
        let n = ping_pong(Duration::from_secs(5));
        format!("{} pipe round trips in 5 s", num(n as f64, 0))
    })?;
    Ok(serde_json::to_value(OutsideReport { fork_heavy, io_heavy, context_switch_heavy })?)
}

/// Two threads passing a byte back and forth over two pipes for `d`; the round trips.
fn ping_pong(d: Duration) -> u64 {
    let (mut a_rx, mut a_tx) = std::io::pipe().expect("pipe");
    let (mut b_rx, mut b_tx) = std::io::pipe().expect("pipe");
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 1];
        while a_rx.read_exact(&mut buf).is_ok() && buf[0] != 0 {
            if b_tx.write_all(&buf).is_err() {
                break;
            }
        }
    });
    let end = Instant::now() + d;
    let mut n = 0u64;
    let mut buf = [0u8; 1];
    while Instant::now() < end {
        if a_tx.write_all(&[1]).is_err() || b_rx.read_exact(&mut buf).is_err() {
            break;
        }
        n += 1;
    }
    let _ = a_tx.write_all(&[0]);
    let _ = echo.join();
    n
}
