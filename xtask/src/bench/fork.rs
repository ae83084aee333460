//! `cargo xtask bench --only fork-burst`: a fork burst under `gpustall watch`: a job forks 18,000 short
//! children (each one 4 KiB O_DIRECT write), then idles while they age out of a 30 s window.
//! Sampled every second: the daemon's RSS against its --memory-budget, its CPU, and how long
//! /metrics takes to answer (it must answer throughout, pruning included).

use std::{
    io::{BufRead as _, Read as _, Write as _},
    net::TcpStream,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tests::procs::Workload;

use super::common::{release_bin, usage, workload_bin};

const CHILDREN: &str = "18000";
const BUDGET_MIB: u64 = 64;

/// The case's figures (drawn by `doc::fork_burst`).
#[derive(Serialize, Deserialize, Debug, Default, PartialEq)]
pub struct ForkReport {
    /// As given to the workload.
    pub children: String,
    /// The burst's own time; absent where the workload did not say.
    pub burst_s: Option<f64>,
    pub peak_rss_kb: u64,
    pub end_rss_kb: u64,
    pub memory_budget_mib: u64,
    pub cpu_pct_of_one_core: f64,
    pub metrics_slowest_ms: f64,
    pub metrics_unanswered: u64,
    /// The job's block writes as /metrics said, at most.
    pub block_write_bytes_by_metrics: u64,
    pub rss_kb_each_second: Vec<u64>,
}

/// One second's reading of the daemon.
struct Reading {
    t_s: f64,
    rss_kb: u64,
    cpu_s: f64,
    metrics_ms: Option<f64>,
    /// The job's block writes as /metrics said (18,000 x 4 KiB once all are counted).
    written: Option<u64>,
}

pub fn run() -> anyhow::Result<Value> {
    let bin = workload_bin();
    let scratch = tests::TempDir::new_in("/var/tmp", "bench-burst");
    let bundles = tests::TempDir::new("bench-burst-bundles");
    let dir = scratch.0.to_str().context("utf-8 path")?;
    // The parent idles 45 s after the burst: its children leave the 30 s window meanwhile.
    let mut w = Workload::start(&bin, &["burst", CHILDREN, dir, "45000"], None);
    let (mut daemon, addr) = start_daemon(w.comm(), &bundles.0)?;
    std::thread::sleep(Duration::from_secs(3)); // found by the next scan
    let t0 = Instant::now();
    w.go();
    let mut readings = Vec::new();
    let mut burst_s = None;
    while w.child.try_wait()?.is_none() {
        std::thread::sleep(Duration::from_secs(1));
        let (cpu_s, rss_kb, _) = usage(daemon.id())?;
        let t_s = t0.elapsed().as_secs_f64();
        let (metrics_ms, written) = scrape(&addr).unzip();
        readings.push(Reading { t_s, rss_kb, cpu_s, metrics_ms, written });
        if burst_s.is_none() && children_done(&w) {
            burst_s = Some(t_s);
        }
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
    report(&readings, burst_s)
}

/// The burst is over once the workload printed nothing new and has no children left.
fn children_done(w: &Workload) -> bool {
    let children = format!("/proc/{0}/task/{0}/children", w.pid());
    std::fs::read_to_string(children).is_ok_and(|c| c.trim().is_empty())
}

fn report(readings: &[Reading], burst_s: Option<f64>) -> anyhow::Result<Value> {
    let peak_kb = readings.iter().map(|r| r.rss_kb).max().unwrap_or(0);
    let end_kb = readings.last().map_or(0, |r| r.rss_kb);
    let cpu = readings.last().map_or(0.0, |r| r.cpu_s) - readings.first().map_or(0.0, |r| r.cpu_s);
    let wall = readings.last().map_or(1.0, |r| r.t_s).max(1.0);
    let unanswered = readings.iter().filter(|r| r.metrics_ms.is_none()).count();
    let slowest = readings.iter().filter_map(|r| r.metrics_ms).fold(0.0, f64::max);
    let written = readings.iter().filter_map(|r| r.written).max().unwrap_or(0);
    println!("\n== gpustall watch: a fork burst of {CHILDREN} children ==");
    println!("  t(s)  RSS(MiB)  CPU(s)  /metrics(ms)  written(MiB)");
    for r in readings.iter().step_by(5) {
        let m = r.metrics_ms.map_or("no answer".into(), |m| format!("{m:.1}"));
        let mib = r.written.map_or("?".into(), |b| format!("{:.1}", b as f64 / 1048576.0));
        println!(
            "{:6.0} {:9.1} {:7.2}  {m:>12}  {mib:>12}",
            r.t_s,
            r.rss_kb as f64 / 1024.0,
            r.cpu_s
        );
    }
    println!("the job's block writes by /metrics: {written} bytes (18,000 x 4 KiB = 73,728,000)");
    println!(
        "peak RSS {:.1} MiB (budget {BUDGET_MIB} MiB for the flight recorder), at the end {:.1} MiB; {:.1}% of a core over {wall:.0} s; /metrics slowest {slowest:.1} ms, unanswered {unanswered} of {}",
        peak_kb as f64 / 1024.0,
        end_kb as f64 / 1024.0,
        100.0 * cpu / wall,
        readings.len()
    );
    let r = ForkReport {
        children: CHILDREN.to_string(),
        burst_s,
        peak_rss_kb: peak_kb,
        end_rss_kb: end_kb,
        memory_budget_mib: BUDGET_MIB,
        cpu_pct_of_one_core: 100.0 * cpu / wall,
        metrics_slowest_ms: slowest,
        metrics_unanswered: unanswered as u64,
        block_write_bytes_by_metrics: written,
        rss_kb_each_second: readings.iter().map(|r| r.rss_kb).collect(),
    };
    Ok(serde_json::to_value(r)?)
}

/// `gpustall watch` (release) on the workload's comm, a 30 s window; its metrics address.
fn start_daemon(
    comm: &str,
    bundles: &std::path::Path,
) -> anyhow::Result<(std::process::Child, String)> {
    let mut child = std::process::Command::new(release_bin("gpustall"))
        .args(["watch", "--match", &format!("comm:^{comm}$"), "--window", "30"])
        .args(["--listen", "127.0.0.1:0", "--no-gpu", "--bundle-dir"])
        .arg(bundles)
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let err = child.stderr.take().context("stderr")?;
    let mut lines = std::io::BufReader::new(err).lines();
    let addr = loop {
        let line = lines.next().context("gpustall watch exited before it listened")??;
        if let Some(rest) = line.split("metrics on http://").nth(1) {
            break rest.split('/').next().unwrap_or_default().to_string();
        }
    };
    // Keep draining its stderr so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Ok((child, addr))
}

/// Milliseconds for a whole /metrics answer and the job's block writes in it, or `None` when no
/// answer came within 5 s.
fn scrape(addr: &str) -> Option<(f64, u64)> {
    let t = Instant::now();
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let written = body
        .lines()
        .filter(|l| l.starts_with("gpustall_block_write_bytes_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    body.starts_with("HTTP/1.1 200").then_some((ms, written as u64))
}
