//! `cargo xtask bench`: what tracing costs, measured side by side in one run on the same
//! machine (timings on shared machines are only meaningful as ratios).
//!
//! Case 1, swap-heavy: three workers allocate 100 MiB each in a 128 MiB memory cgroup with swap,
//! untraced and traced, alternating, three rounds each. Reported: the workload's slowdown, ring
//! records per second against write_folio hits per second (aggregation in the kernel), each
//! program's average run time (kernel BPF stats), the agent's CPU and peak RSS.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use serde_json::{json, Value};
use tests::{
    cgroup::MemCgroup,
    kernel::SwapFile,
    procs::{Tracer, Workload},
};

use crate::util::{cargo, is_root, run_cmd, workspace_root};

const ROUNDS: usize = 3;
const WORKLOAD: [&str; 4] = ["hog", "100,100,100", "8", "0"];

/// Restores kernel.bpf_stats_enabled on drop.
struct BpfStats(String);

impl BpfStats {
    fn enable() -> Self {
        let path = "/proc/sys/kernel/bpf_stats_enabled";
        let old = std::fs::read_to_string(path).unwrap_or_else(|_| "0".into());
        let _ = std::fs::write(path, "1");
        Self(old.trim().to_string())
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", &self.0);
    }
}

fn workload_bin() -> PathBuf {
    workspace_root().join("target/release/gpustall-workload")
}

/// One run of the workload; returns its wall time and, when traced, the summary.
fn run_once(traced: bool) -> anyhow::Result<(Duration, Option<Value>)> {
    let cg = MemCgroup::new("bench", 128, true);
    let mut w = Workload::start(&workload_bin(), &WORKLOAD, Some(&cg));
    let tracer = traced.then(|| Tracer::start(w.pid(), &["--quiet"]));
    let t0 = Instant::now();
    w.go();
    let (code, _) = w.wait(Duration::from_secs(300));
    let wall = t0.elapsed();
    anyhow::ensure!(code == Some(0), "the workload failed ({code:?})");
    let summary = tracer.map(|t| t.wait(Duration::from_secs(60)).summary);
    Ok((wall, summary))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

pub fn run() -> anyhow::Result<()> {
    anyhow::ensure!(is_root(), "the benchmark loads eBPF programs and makes cgroups: run as root");
    crate::setup::run_setup(true)?;
    run_cmd(cargo().args(["build", "--release", "-p", "gpustall", "-p", "tests"]))?;
    std::env::set_var("GPUSTALL_BIN", workspace_root().join("target/release/gpustall"));
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    let _swap = SwapFile::ensure(1024);
    let _stats = BpfStats::enable();

    let mut plain = Vec::new();
    let mut traced = Vec::new();
    let mut summaries = Vec::new();
    for round in 1..=ROUNDS {
        let (w, _) = run_once(false)?;
        let (t, s) = run_once(true)?;
        eprintln!("round {round}: untraced {:.2} s, traced {:.2} s", w.as_secs_f64(), t.as_secs_f64());
        plain.push(w.as_secs_f64());
        traced.push(t.as_secs_f64());
        summaries.push(s.context("no summary")?);
    }
    let (p, t) = (median(plain.clone()), median(traced.clone()));
    // The traced run whose time is the median describes the overhead.
    let s = &summaries[traced.iter().position(|&x| x == t).unwrap_or(0)];
    let duration = s["duration_s"].as_f64().unwrap_or(1.0).max(1e-3);
    let programs = s["overhead"]["programs"].as_array().cloned().unwrap_or_default();
    let hits = |name: &str| {
        programs.iter().find(|p| p["name"] == name).and_then(|p| p["run_count"].as_u64()).unwrap_or(0)
    };
    let records = s["events"].as_u64().unwrap_or(0);
    let cpu = s["overhead"]["agent_cpu_s"].as_f64().unwrap_or(0.0);
    let report = json!({
        "case": "swap-heavy: 3 x 100 MiB workers in a 128 MiB memcg with swap",
        "rounds": ROUNDS,
        "untraced_s": plain,
        "traced_s": traced,
        "slowdown_ratio": t / p,
        "trace_duration_s": duration,
        "ring_records": records,
        "ring_records_per_s": records as f64 / duration,
        "write_folio_hits": hits("mm_vmscan_write_folio"),
        "write_folio_hits_per_s": hits("mm_vmscan_write_folio") as f64 / duration,
        "block_bio_queue_hits_per_s": hits("block_bio_queue") as f64 / duration,
        "programs": programs,
        "agent_cpu_s": cpu,
        "agent_cpu_pct_of_one_core": 100.0 * cpu / duration,
        "agent_peak_rss_kb": s["overhead"]["agent_peak_rss_kb"],
        "lost_events": s["lost_events"],
    });
    println!("\n== gpustall overhead: swap-heavy case ({ROUNDS} rounds, medians) ==");
    println!("workload: untraced {p:.2} s, traced {t:.2} s: slowdown x{:.3}", t / p);
    println!(
        "ring records {:.0}/s reaching userspace vs write_folio hits {:.0}/s (block_bio_queue {:.0}/s)",
        report["ring_records_per_s"].as_f64().unwrap_or(0.0),
        report["write_folio_hits_per_s"].as_f64().unwrap_or(0.0),
        report["block_bio_queue_hits_per_s"].as_f64().unwrap_or(0.0)
    );
    println!("agent: {cpu:.2} s CPU ({:.1}% of one core), peak RSS {} kB, lost events {}",
        report["agent_cpu_pct_of_one_core"].as_f64().unwrap_or(0.0), report["agent_peak_rss_kb"], report["lost_events"]);
    println!("{:<34} {:>10} {:>10}", "program", "runs", "avg ns");
    for p in &programs {
        if p["run_count"].as_u64().unwrap_or(0) > 0 {
            println!("{:<34} {:>10} {:>10.0}", p["name"].as_str().unwrap_or("?"), p["run_count"], p["avg_ns"].as_f64().unwrap_or(0.0));
        }
    }
    let out = workspace_root().join("target/bench");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("overhead.json"), serde_json::to_string_pretty(&report)? + "\n")?;
    println!("written to target/bench/overhead.json");
    Ok(())
}
