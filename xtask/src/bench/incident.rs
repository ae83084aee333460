//! `cargo xtask bench --only incident`: `gpustall watch` at a big incident under its own shipped
//! limit. The daemon runs in a 256 MiB memory cgroup (the DaemonSet's limit and the unit's
//! MemoryMax=) with a 64 MiB --memory-budget; a watched job of 8,000 processes is SIGKILLed at
//! once. Measured: the daemon's peak RSS (the kernel's VmHWM) before and after, how long the
//! bundle took, whether the kernel OOM-killed the daemon, and that the bundle is whole.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use serde_json::{json, Value};
use tests::{
    cgroup::MemCgroup,
    procs::{descendants, vm_hwm_kb, KillTree, Workload},
};

use super::common::workload_bin;

const PROCESSES: usize = 8000;
/// The shipped limit (deploy/kubernetes/daemonset.yaml, deploy/gpustall-watch.service).
const LIMIT_MIB: u64 = 256;
const BUDGET_MIB: u64 = 64;

pub fn run() -> anyhow::Result<Value> {
    let bundles = tests::TempDir::new("bench-incident");
    let cg = MemCgroup::new("bench-incident", LIMIT_MIB, false);
    let script = format!("for i in $(seq {PROCESSES}); do sleep 3600 & done; wait");
    let mut job = Workload::start(&workload_bin(), &["spawn", "sh", "-c", &script], None);
    let _tree = KillTree(job.pid());
    let rule = format!("comm:^{}$", job.comm());
    let budget = format!("{BUDGET_MIB}MiB");
    let dir = bundles.0.to_str().context("utf-8 path")?;
    // The daemon (GPUSTALL_BIN: the release build) is charged to the cgroup from its first page.
    let mut w = tests::watcher::in_cgroup(
        &cg,
        &[
            "--match",
            &rule,
            "--no-gpu",
            "--listen",
            "127.0.0.1:0",
            "--after",
            "2s",
            "--scan-every",
            "500ms",
            "--memory-budget",
            &budget,
            "--bundle-dir",
            dir,
        ],
    );
    let agent = w.child.id();
    w.wait_for("metrics on http://", Duration::from_secs(60));
    w.wait_for(&format!("watching job {}-{}", job.comm(), job.pid()), Duration::from_secs(30));
    job.go();
    let end = Instant::now() + Duration::from_secs(300);
    let mut tree = descendants(job.pid());
    while tree.len() < PROCESSES + 1 {
        anyhow::ensure!(Instant::now() < end, "only {} processes started", tree.len());
        std::thread::sleep(Duration::from_millis(500));
        tree = descendants(job.pid());
    }
    // The daemon takes in the forks, then the whole tree is killed at once.
    std::thread::sleep(Duration::from_secs(3));
    let before_kb = vm_hwm_kb(agent);
    let started = Instant::now();
    for p in &tree {
        // SAFETY: SIGKILL to a process of the job this bench started.
        unsafe { libc::kill(*p as i32, libc::SIGKILL) };
    }
    let wrote = w.wait_for("wrote incident bundle", Duration::from_secs(180));
    let bundle_s = started.elapsed().as_secs_f64();
    let peak_kb = vm_hwm_kb(agent);
    let oom_kills = cg.oom_kills();
    let alive = w.child.try_wait()?.is_none();
    report(before_kb, peak_kb, bundle_s, oom_kills, alive && bundle_complete(&wrote))
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
    Ok(json!({
        "processes": PROCESSES,
        "limit_mib": LIMIT_MIB,
        "memory_budget_mib": BUDGET_MIB,
        "peak_rss_before_kb": before_kb,
        "peak_rss_kb": peak_kb,
        "bundle_s": bundle_s,
        "oom_kills_of_the_daemon": oom_kills,
        "bundle_complete_daemon_alive": complete,
    }))
}
