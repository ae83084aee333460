//! Case `swap-heavy`: three workers allocate 300 MiB each in a 128 MiB memory cgroup with swap,
//! untraced and traced, alternating, five rounds each. Reported: the workload's slowdown, ring
//! records per second against write_folio hits per second (aggregation in the kernel), each
//! program's average run time (kernel BPF stats), the agent's CPU and peak RSS.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tests::{
    cgroup::MemCgroup,
    kernel::SwapFile,
    procs::{Tracer, Workload},
};

use super::common::{median, workload_bin, BpfStats, Program, TracedSummary, SWAP_HEAVY};

const ROUNDS: usize = 5;

/// The case's figures (its section of docs/BENCHMARKS.md is drawn from them: `doc::swap_heavy`;
/// every one is required there: a figure missing is said, never drawn as a zero).
#[derive(Serialize, Deserialize, Debug, Default, PartialEq)]
pub struct SwapReport {
    pub case: String,
    pub rounds: usize,
    pub untraced_s: Vec<f64>,
    pub traced_s: Vec<f64>,
    pub untraced_median_s: f64,
    pub traced_median_s: f64,
    pub slowdown_ratio: f64,
    pub trace_duration_s: f64,
    pub ring_records: u64,
    pub ring_records_per_s: f64,
    pub write_folio_hits: u64,
    pub write_folio_hits_per_s: f64,
    pub block_bio_queue_hits_per_s: f64,
    /// Each program in the median traced run.
    pub programs: Vec<Program>,
    pub agent_cpu_s_while_tracing: f64,
    pub agent_startup_cpu_s: f64,
    pub agent_cpu_pct_of_one_core: f64,
    pub agent_peak_rss_kb: u64,
    pub lost_events: u64,
}

/// One run of the workload; returns its wall time and, when traced, the summary.
fn run_once(traced: bool) -> anyhow::Result<(Duration, Option<Value>)> {
    let cg = MemCgroup::new("bench", 128, true);
    let mut w = Workload::start(&workload_bin(), &SWAP_HEAVY, Some(&cg));
    let tracer = traced.then(|| Tracer::start(w.pid(), &["--quiet"]));
    let t0 = Instant::now();
    w.go();
    let (code, _) = w.wait(Duration::from_secs(300));
    let wall = t0.elapsed();
    anyhow::ensure!(code == Some(0), "the workload failed ({code:?})");
    let summary = tracer.map(|t| t.wait(Duration::from_secs(60)).summary);
    Ok((wall, summary))
}

/// ROUNDS of the swap-heavy workload, untraced then traced: the wall times and the traced
/// runs' summaries.
fn rounds() -> anyhow::Result<(Vec<f64>, Vec<f64>, Vec<TracedSummary>)> {
    let mut plain = Vec::new();
    let mut traced = Vec::new();
    let mut summaries = Vec::new();
    for round in 1..=ROUNDS {
        let (w, _) = run_once(false)?;
        let (t, s) = run_once(true)?;
        eprintln!(
            "round {round}: untraced {:.2} s, traced {:.2} s",
            w.as_secs_f64(),
            t.as_secs_f64()
        );
        plain.push(w.as_secs_f64());
        traced.push(t.as_secs_f64());
        summaries.push(TracedSummary::of(&s.context("no summary")?)?);
    }
    Ok((plain, traced, summaries))
}

/// The swap-heavy case on the terminal: slowdown, records vs hits, agent cost, per program.
fn print_swap_heavy(r: &SwapReport) {
    let (p, t) = (r.untraced_median_s, r.traced_median_s);
    println!("\n== gpustall overhead: swap-heavy case ({ROUNDS} rounds, medians) ==");
    println!("workload: untraced {p:.2} s, traced {t:.2} s: slowdown x{:.3}", t / p);
    println!(
        "ring records {:.0}/s reaching userspace vs write_folio hits {:.0}/s (block_bio_queue {:.0}/s)",
        r.ring_records_per_s, r.write_folio_hits_per_s, r.block_bio_queue_hits_per_s
    );
    println!(
        "agent: {:.2} s CPU while tracing ({:.1}% of one core; start-up not counted), peak RSS {} kB, lost events {}",
        r.agent_cpu_s_while_tracing, r.agent_cpu_pct_of_one_core, r.agent_peak_rss_kb, r.lost_events
    );
    println!("{:<34} {:>10} {:>10}", "program", "runs", "avg ns");
    for p in r.programs.iter().filter(|p| p.run_count > 0) {
        println!("{:<34} {:>10} {:>10.0}", p.name, p.run_count, p.ns_per_run().unwrap_or(0.0));
    }
}

pub fn run() -> anyhow::Result<Value> {
    let _swap = SwapFile::ensure(1024);
    let _stats = BpfStats::enable();

    let (plain, traced, summaries) = rounds()?;
    let (p, t) = (median(plain.clone()), median(traced.clone()));
    // The traced run whose time is the median describes the overhead.
    let s = &summaries[traced.iter().position(|&x| x == t).unwrap_or(0)];
    let duration = s.duration_s.max(1e-3);
    let hits = |tracepoint: &str| s.overhead.program(tracepoint).map_or(0, |p| p.run_count);
    let write_folio_hits = hits("mm_vmscan_write_folio");
    let cpu = s.overhead.cpu_while_tracing_s();
    let report = SwapReport {
        case: "swap-heavy: 3 x 300 MiB workers in a 128 MiB memcg with swap".into(),
        rounds: ROUNDS,
        untraced_median_s: p,
        traced_median_s: t,
        slowdown_ratio: t / p,
        untraced_s: plain,
        traced_s: traced,
        trace_duration_s: duration,
        ring_records: s.events,
        ring_records_per_s: s.events as f64 / duration,
        write_folio_hits,
        write_folio_hits_per_s: write_folio_hits as f64 / duration,
        block_bio_queue_hits_per_s: hits("block_bio_queue") as f64 / duration,
        programs: s.overhead.programs.clone(),
        agent_cpu_s_while_tracing: cpu,
        agent_startup_cpu_s: s.overhead.agent_startup_cpu_s,
        agent_cpu_pct_of_one_core: 100.0 * cpu / duration,
        agent_peak_rss_kb: s.overhead.agent_peak_rss_kb,
        lost_events: s.lost_events,
    };
    print_swap_heavy(&report);
    Ok(serde_json::to_value(report)?)
}
