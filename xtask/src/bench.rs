//! `cargo xtask bench`: what tracing costs, measured side by side in one run on the same
//! machine (timings on shared machines are only meaningful as ratios).
//!
//! Case 1, swap-heavy: three workers allocate 300 MiB each in a 128 MiB memory cgroup with swap,
//! untraced and traced, alternating, five rounds each. Reported: the workload's slowdown, ring
//! records per second against write_folio hits per second (aggregation in the kernel), each
//! program's average run time (kernel BPF stats), the agent's CPU and peak RSS.
//!
//! Case 2, `gpustall watch`: the daemon's CPU and RSS while it watches an idle job, then the
//! swap-heavy one. Case 3 (`bench_fork`): the daemon through a fork burst. Case 4
//! (`bench_peer`, `--only peer`): gpustall against a bpftrace script on one workload. Case 5
//! (`bench_ctx`, `--only ctxswitch`): a pipe ping-pong untraced, outside and inside the traced
//! job (what sched_switch / sched_waking cost).

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

const ROUNDS: usize = 5;
const WORKLOAD: [&str; 4] = ["hog", "300,300,300", "8", "0"];

/// Restores kernel.bpf_stats_enabled on drop.
pub(crate) struct BpfStats(String);

impl BpfStats {
    pub(crate) fn enable() -> Self {
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

/// Where cargo builds: `$CARGO_TARGET_DIR` when set, else the workspace's `target/`.
pub(crate) fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

fn workload_bin() -> PathBuf {
    target_dir().join("release/gpustall-workload")
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

/// ROUNDS of the swap-heavy workload, untraced then traced: the wall times and the traced
/// runs' summaries.
fn rounds() -> anyhow::Result<(Vec<f64>, Vec<f64>, Vec<serde_json::Value>)> {
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
fn print_swap_heavy(
    report: &serde_json::Value,
    programs: &[serde_json::Value],
    (p, t): (f64, f64),
    cpu: f64,
) {
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

pub fn run(only: Option<&str>) -> anyhow::Result<()> {
    anyhow::ensure!(is_root(), "the benchmark loads eBPF programs and makes cgroups: run as root");
    crate::setup::run_setup(true)?;
    run_cmd(cargo().args(["build", "--release", "-p", "gpustall", "-p", "tests"]))?;
    std::env::set_var("GPUSTALL_BIN", target_dir().join("release/gpustall"));
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    match only {
        None => {}
        Some("fork-burst") => {
            return write_json(&json!({"watch_fork_burst": crate::bench_fork::run()?}))
        }
        Some("peer") => return write_json(&json!({"peer": crate::bench_peer::run()?})),
        Some("ctxswitch") => return write_json(&json!({"ctxswitch": crate::bench_ctx::run()?})),
        Some("outside") => {
            return write_json(&json!({"outside_the_job": crate::bench_peer::outside_cases()?}))
        }
        Some(other) => {
            anyhow::bail!("no bench case {other:?} (cases: fork-burst, peer, ctxswitch, outside)")
        }
    }
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
            .find(|p| p["name"].as_str().map(crate::util::tracepoint_of) == Some(name))
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
    let daemon = watch_cases()?;
    let burst = crate::bench_fork::run()?;
    let peer = crate::bench_peer::run()?;
    let ctxswitch = crate::bench_ctx::run()?;
    write_json(&json!({"swap_heavy_trace": report, "watch_daemon": daemon,
        "watch_fork_burst": burst, "peer": peer, "ctxswitch": ctxswitch}))
}

fn write_json(all: &Value) -> anyhow::Result<()> {
    let out = workspace_root().join("target/bench");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("overhead.json"), serde_json::to_string_pretty(all)? + "\n")?;
    println!("written to target/bench/overhead.json");
    Ok(())
}

/// CPU seconds (user + system) and resident / peak memory of a process, from /proc.
pub(crate) fn usage(pid: u32) -> anyhow::Result<(f64, u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(") ").map(|x| x.1).context("stat")?;
    let f: Vec<&str> = after.split_whitespace().collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu = (f[11].parse::<f64>()? + f[12].parse::<f64>()?) / hz;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0u64)
    };
    Ok((cpu, kb("VmRSS:"), kb("VmHWM:")))
}

/// Starts `gpustall watch` (release) and waits until it is watching.
fn start_daemon(bundles: &std::path::Path) -> anyhow::Result<std::process::Child> {
    use std::io::BufRead;
    let mut child = std::process::Command::new(target_dir().join("release/gpustall"))
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

/// Case 2: the daemon watching an idle job, then a busy one (the swap-heavy workload).
fn watch_cases() -> anyhow::Result<Value> {
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
        let mut w = Workload::start(&workload_bin(), &["hog", "300,300,300", "8", "0"], Some(&cg));
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
    Ok(json!({
        "idle": {"cpu_pct_of_one_core": idle_cpu, "rss_kb": idle_rss, "seconds": idle_wall},
        "busy_swap_heavy": {"cpu_pct_of_one_core": busy_cpu, "rss_kb": busy_rss, "peak_rss_kb": hwm, "seconds": wall},
    }))
}
