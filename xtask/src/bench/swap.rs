//! Case `swap-heavy`: three workers allocate 300 MiB each in a 128 MiB memory cgroup with swap,
//! untraced and traced, alternating, five rounds each. Reported: the workload's slowdown, ring
//! records per second against write_folio hits per second (aggregation in the kernel), each
//! program's average run time (kernel BPF stats), the agent's CPU and peak RSS.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::{json, Value};
use tests::{
    cgroup::MemCgroup,
    kernel::SwapFile,
    procs::{Tracer, Workload},
};

use super::common::{median, tracepoint_of, workload_bin, BpfStats, SWAP_HEAVY};

const ROUNDS: usize = 5;

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
fn rounds() -> anyhow::Result<(Vec<f64>, Vec<f64>, Vec<Value>)> {
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
        summaries.push(s.context("no summary")?);
    }
    Ok((plain, traced, summaries))
}

/// The swap-heavy case on the terminal: slowdown, records vs hits, agent cost, per program.
fn print_swap_heavy(report: &Value, programs: &[Value], (p, t): (f64, f64), cpu: f64) {
    println!("\n== gpustall overhead: swap-heavy case ({ROUNDS} rounds, medians) ==");
    println!("workload: untraced {p:.2} s, traced {t:.2} s: slowdown x{:.3}", t / p);
    println!(
        "ring records {:.0}/s reaching userspace vs write_folio hits {:.0}/s (block_bio_queue {:.0}/s)",
        report["ring_records_per_s"].as_f64().unwrap_or(0.0),
        report["write_folio_hits_per_s"].as_f64().unwrap_or(0.0),
        report["block_bio_queue_hits_per_s"].as_f64().unwrap_or(0.0)
    );
    println!("agent: {cpu:.2} s CPU while tracing ({:.1}% of one core; start-up not counted), peak RSS {} kB, lost events {}",
        report["agent_cpu_pct_of_one_core"].as_f64().unwrap_or(0.0), report["agent_peak_rss_kb"], report["lost_events"]);
    println!("{:<34} {:>10} {:>10}", "program", "runs", "avg ns");
    for p in programs {
        if p["run_count"].as_u64().unwrap_or(0) > 0 {
            println!(
                "{:<34} {:>10} {:>10.0}",
                p["name"].as_str().unwrap_or("?"),
                p["run_count"],
                p["avg_ns"].as_f64().unwrap_or(0.0)
            );
        }
    }
}

pub fn run() -> anyhow::Result<Value> {
    let _swap = SwapFile::ensure(1024);
    let _stats = BpfStats::enable();

    let (plain, traced, summaries) = rounds()?;
    let (p, t) = (median(plain.clone()), median(traced.clone()));
    // The traced run whose time is the median describes the overhead.
    let s = &summaries[traced.iter().position(|&x| x == t).unwrap_or(0)];
    let duration = s["duration_s"].as_f64().unwrap_or(1.0).max(1e-3);
    let programs = s["overhead"]["programs"].as_array().cloned().unwrap_or_default();
    let hits = |name: &str| {
        programs
            .iter()
            // The typed program where the kernel has BTF, else its classic fallback.
            .find(|p| p["name"].as_str().map(tracepoint_of) == Some(name))
            .and_then(|p| p["run_count"].as_u64())
            .unwrap_or(0)
    };
    let records = s["events"].as_u64().unwrap_or(0);
    let write_folio_hits = hits("mm_vmscan_write_folio");
    // CPU while tracing: without the start-up (loading and verifying the programs).
    let cpu = s["overhead"]["agent_cpu_s"].as_f64().unwrap_or(0.0)
        - s["overhead"]["agent_startup_cpu_s"].as_f64().unwrap_or(0.0);
    let report = json!({
        "case": "swap-heavy: 3 x 300 MiB workers in a 128 MiB memcg with swap",
        "rounds": ROUNDS,
        "untraced_s": plain,
        "traced_s": traced,
        "untraced_median_s": p,
        "traced_median_s": t,
        "slowdown_ratio": t / p,
        "trace_duration_s": duration,
        "ring_records": records,
        "ring_records_per_s": records as f64 / duration,
        "write_folio_hits": write_folio_hits,
        "write_folio_hits_per_s": write_folio_hits as f64 / duration,
        "block_bio_queue_hits_per_s": hits("block_bio_queue") as f64 / duration,
        "programs": programs,
        "agent_cpu_s_while_tracing": cpu,
        "agent_startup_cpu_s": s["overhead"]["agent_startup_cpu_s"],
        "agent_cpu_pct_of_one_core": 100.0 * cpu / duration,
        "agent_peak_rss_kb": s["overhead"]["agent_peak_rss_kb"],
        "lost_events": s["lost_events"],
    });
    print_swap_heavy(&report, &programs, (p, t), cpu);
    Ok(report)
}
