//! `cargo xtask bench --only incident`: `gpustall watch` at a big incident under its own shipped
//! limit. The daemon runs in a 256 MiB memory cgroup (the DaemonSet's limit and the unit's
//! MemoryMax=) with a 64 MiB --memory-budget; a watched job of 8,000 processes is SIGKILLed at
//! once. Measured: the daemon's peak RSS (the kernel's VmHWM) before and after, how long the
//! bundle took, whether the kernel OOM-killed the daemon, and that the bundle is whole.

use std::{
    io::BufRead as _,
    path::Path,
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use serde_json::{json, Value};
use tests::{
    cgroup::MemCgroup,
    procs::{descendants, vm_hwm_kb, KillTree, Workload},
};

use super::common::{release_bin, workload_bin};

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
    let (mut daemon, lines) = start_daemon(&cg, job.comm(), &bundles.0)?;
    let mut log = Log { lines, seen: Vec::new() };
    let agent = daemon.id();
    log.wait_for("metrics on http://", 60)?;
    log.wait_for(&format!("watching job {}-{}", job.comm(), job.pid()), 30)?;
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
    let wrote = log.wait_for("wrote incident bundle", 180);
    let bundle_s = started.elapsed().as_secs_f64();
    let peak_kb = vm_hwm_kb(agent);
    let oom_kills = cg.oom_kills();
    let alive = daemon.try_wait()?.is_none();
    let _ = daemon.kill();
    let _ = daemon.wait();
    let complete = wrote.as_ref().ok().is_some_and(|l| bundle_complete(l));
    report(before_kb, peak_kb, bundle_s, oom_kills, alive && complete)
}

/// The daemon, charged to the cgroup from its first page; its log lines on a channel.
fn start_daemon(
    cg: &MemCgroup,
    comm: &str,
    bundles: &Path,
) -> anyhow::Result<(std::process::Child, mpsc::Receiver<String>)> {
    let procs = cg.path.join("cgroup.procs");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("echo $$ > {} && exec \"$0\" \"$@\"", procs.display()))
        .arg(release_bin("gpustall"))
        .args(["watch", "--match", &format!("comm:^{comm}$"), "--no-gpu", "--listen"])
        .args(["127.0.0.1:0", "--after", "2s", "--scan-every", "500ms", "--memory-budget"])
        .arg(format!("{BUDGET_MIB}MiB"))
        .arg("--bundle-dir")
        .arg(bundles)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let err = child.stderr.take().context("stderr")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    Ok((child, rx))
}

/// The daemon's log lines so far (a line may come before the one waited for first: a job that
/// exists at start-up is found before the metrics line).
struct Log {
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Log {
    fn wait_for(&mut self, needle: &str, secs: u64) -> anyhow::Result<String> {
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(l) = self.seen.iter().find(|l| l.contains(needle)) {
                return Ok(l.clone());
            }
            let left = end.checked_duration_since(Instant::now());
            match left.map(|left| self.lines.recv_timeout(left)) {
                Some(Ok(l)) => self.seen.push(l),
                _ => anyhow::bail!(
                    "no {needle:?} from gpustall watch within {secs} s:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }
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
