//! `cargo xtask bench --only incident`: `gpustall watch` at a big incident under its own shipped
//! limit. The daemon runs in a 256 MiB memory cgroup (the DaemonSet's limit and the unit's
//! MemoryMax=) with a 64 MiB --memory-budget; a watched job of 8,000 processes is SIGKILLed at
//! once. Measured: the daemon's peak RSS (the kernel's VmHWM) before and after, how long the
//! bundle took, whether the kernel OOM-killed the daemon, and that the bundle is whole.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tests::incident::{BUDGET_MIB, LIMIT_MIB, PROCESSES};

use super::common::workload_bin;

/// The case's figures (drawn by `doc::incident`).
#[derive(Serialize, Deserialize, Debug, Default, PartialEq)]
pub struct IncidentReport {
    pub processes: u64,
    pub limit_mib: u64,
    pub memory_budget_mib: u64,
    pub peak_rss_before_kb: u64,
    pub peak_rss_kb: u64,
    pub bundle_s: f64,
    pub oom_kills_of_the_daemon: u64,
    pub bundle_complete_daemon_alive: bool,
}

pub fn run() -> anyhow::Result<Value> {
    let bundles = tests::TempDir::new("bench-incident");
    // The daemon is GPUSTALL_BIN: the release build.
    let mut i = tests::incident::run(&workload_bin(), &bundles.0);
    let alive = i.watcher.child.try_wait()?.is_none();
    let complete = alive && bundle_complete(&i.wrote);
    report(i.before_kb, i.peak_kb, i.took.as_secs_f64(), i.oom_kills, complete)
}

/// The bundle the line names has its recording, summary, report and a Perfetto trace that parses.
fn bundle_complete(line: &str) -> bool {
    let Some(dir) = line.split("bundle ").nth(1).and_then(|r| r.split(' ').next()) else {
        return false;
    };
    let dir = Path::new(dir);
    let trace = std::fs::read_to_string(dir.join("trace.json")).unwrap_or_default();
    ["record.jsonl", "summary.json", "report.txt"].iter().all(|f| dir.join(f).exists())
        && serde_json::from_str::<Value>(&trace).is_ok()
}

fn report(
    before_kb: u64,
    peak_kb: u64,
    bundle_s: f64,
    oom_kills: u64,
    complete: bool,
) -> anyhow::Result<Value> {
    println!("\n== gpustall watch: {PROCESSES} processes SIGKILLed at once, in {LIMIT_MIB} MiB ==");
    println!(
        "peak RSS {:.1} MiB (before the incident {:.1} MiB; budget {BUDGET_MIB} MiB, limit {LIMIT_MIB} MiB); bundle in {bundle_s:.1} s; OOM kills in its cgroup {oom_kills}; bundle whole and daemon alive: {complete}",
        peak_kb as f64 / 1024.0,
        before_kb as f64 / 1024.0
    );
    let r = IncidentReport {
        processes: PROCESSES as u64,
        limit_mib: LIMIT_MIB,
        memory_budget_mib: BUDGET_MIB,
        peak_rss_before_kb: before_kb,
        peak_rss_kb: peak_kb,
        bundle_s,
        oom_kills_of_the_daemon: oom_kills,
        bundle_complete_daemon_alive: complete,
    };
    Ok(serde_json::to_value(r)?)
}
