//! Case `watch`: the `gpustall watch` daemon's CPU and RSS while it watches an idle job, then the
//! swap-heavy workload.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tests::{cgroup::MemCgroup, kernel::SwapFile, procs::Workload};

use super::common::{release_bin, usage, workload_bin, SWAP_HEAVY};

/// The daemon's cost over one stretch (drawn by `doc::watch`).
#[derive(Serialize, Deserialize, Debug, Default, PartialEq)]
pub struct DaemonCost {
    pub cpu_pct_of_one_core: f64,
    pub rss_kb: u64,
    /// Its peak RSS by then (the busy stretch only: the idle one comes first).
    pub peak_rss_kb: Option<u64>,
    pub seconds: f64,
    /// The workload's own time (the busy stretch).
    pub workload_s: Option<f64>,
}

/// The case's figures.
#[derive(Serialize, Deserialize, Debug, Default, PartialEq)]
pub struct WatchReport {
    pub idle: DaemonCost,
    pub busy_swap_heavy: DaemonCost,
}

/// Starts `gpustall watch` (release) and waits until it is watching.
fn start_daemon(bundles: &std::path::Path) -> anyhow::Result<std::process::Child> {
    use std::io::BufRead;
    let mut child = std::process::Command::new(release_bin("gpustall"))
        .args([
            "watch",
            "--match",
            // Every workload of this run is named gw<this pid>x<n> (tests::procs::unique_comm).
            &format!("comm:^gw{}x", std::process::id()),
            "--listen",
            "127.0.0.1:0",
            "--no-gpu",
            "--bundle-dir",
        ])
        .arg(bundles)
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let err = child.stderr.take().context("stderr")?;
    let mut lines = std::io::BufReader::new(err).lines();
    for line in lines.by_ref() {
        if line?.contains("metrics on http://") {
            break;
        }
    }
    // Keep draining its stderr so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Ok(child)
}

/// The daemon watching an idle job, then a busy one (the swap-heavy workload).
pub fn run() -> anyhow::Result<Value> {
    let _swap = SwapFile::ensure(1024);
    let bundles = tests::TempDir::new("bench-bundles");
    let mut daemon = start_daemon(&bundles.0)?;
    let pid = daemon.id();
    let measure = |secs: u64,
                   f: &mut dyn FnMut() -> anyhow::Result<()>|
     -> anyhow::Result<(f64, f64, u64, u64)> {
        let (c0, _, _) = usage(pid)?;
        let t0 = Instant::now();
        f()?;
        while t0.elapsed() < Duration::from_secs(secs) {
            std::thread::sleep(Duration::from_millis(100));
        }
        let (c1, rss, hwm) = usage(pid)?;
        let wall = t0.elapsed().as_secs_f64();
        Ok((wall, 100.0 * (c1 - c0) / wall, rss, hwm))
    };
    // Idle: a job waiting for its input (never released), watched for 20 s.
    let idle_job = Workload::start(&workload_bin(), &["spawn", "sleep", "1"], None);
    std::thread::sleep(Duration::from_secs(3));
    let (idle_wall, idle_cpu, idle_rss, _) = measure(20, &mut || Ok(()))?;
    drop(idle_job);
    // Busy: the swap-heavy workload, watched while it runs.
    let mut busy_wall = 0.0;
    let (wall, busy_cpu, busy_rss, hwm) = measure(0, &mut || {
        let cg = MemCgroup::new("bench-watch", 128, true);
        let mut w = Workload::start(&workload_bin(), &SWAP_HEAVY, Some(&cg));
        std::thread::sleep(Duration::from_secs(3)); // found by the next scan
        let t0 = Instant::now();
        w.go();
        let (code, _) = w.wait(Duration::from_secs(300));
        busy_wall = t0.elapsed().as_secs_f64();
        anyhow::ensure!(code == Some(0), "the workload failed ({code:?})");
        Ok(())
    })?;
    let _ = daemon.kill();
    let _ = daemon.wait();
    println!("\n== gpustall watch: agent cost ==");
    println!("idle job:  {idle_cpu:.2}% of one core over {idle_wall:.0} s, RSS {idle_rss} kB");
    println!("busy job (swap-heavy, {busy_wall:.1} s): {busy_cpu:.2}% of one core over {wall:.0} s, RSS {busy_rss} kB, peak RSS {hwm} kB");
    let idle = DaemonCost {
        cpu_pct_of_one_core: idle_cpu,
        rss_kb: idle_rss,
        seconds: idle_wall,
        ..DaemonCost::default()
    };
    let busy_swap_heavy = DaemonCost {
        cpu_pct_of_one_core: busy_cpu,
        rss_kb: busy_rss,
        peak_rss_kb: Some(hwm),
        seconds: wall,
        workload_s: Some(busy_wall),
    };
    Ok(serde_json::to_value(WatchReport { idle, busy_swap_heavy })?)
}
