//! The shipped alerting rules against the real thing: `promtool check rules` and `promtool test
//! rules` on deploy/prometheus, and a real Prometheus (Debian's package, installed here if
//! missing, on loopback only) scraping a running `gpustall watch` while a watched job is
//! OOM-killed: the OOM alert must go to firing through Prometheus's own HTTP API.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::Value;
use tests::{
    cgroup::MemCgroup,
    kernel::Kmsg,
    procs::{unique_comm, Workload},
    TempDir,
};

const ALERT: &str = "GpustallOomKillInTrainingJob";
const NEAR_LIMIT: &str = "GpustallJobMemoryNearLimit";
const LIMIT_SOON: &str = "GpustallJobMemoryLimitSoon";

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus").join(file)
}

/// `promtool` and `prometheus` from Debian's `prometheus` package, installed if missing.
fn prometheus_tools() -> (PathBuf, PathBuf) {
    let (promtool, prometheus) =
        (PathBuf::from("/usr/bin/promtool"), PathBuf::from("/usr/bin/prometheus"));
    let present = || promtool.exists() && prometheus.exists();
    if !present() {
        tests::apt::ensure("prometheus", present);
        // The package starts its own Prometheus (on every interface) where systemd runs; these
        // tests start theirs on loopback, so the service this install started is stopped.
        if Path::new("/run/systemd/system").exists() {
            let _ = Command::new("systemctl").args(["disable", "--now", "prometheus"]).status();
        }
    }
    assert!(present(), "the prometheus package has no {}", promtool.display());
    (promtool, prometheus)
}

fn promtool(args: &[&str], file: &Path) -> String {
    let (promtool, _) = prometheus_tools();
    let o = Command::new(promtool).args(args).arg(file).output().expect("promtool");
    let out =
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "promtool {args:?} {}:\n{out}", file.display());
    out
}

#[test]
fn the_alerting_rules_pass_promtool_and_their_unit_tests() {
    tests::require_privileged_env();
    let out = promtool(&["check", "rules"], &deploy("gpustall-alerts.yml"));
    assert!(out.contains("SUCCESS: 12 rules found"), "{out}");
    // Each alert fires on series shaped like the agent's, and stays quiet below its threshold.
    let out = promtool(&["test", "rules"], &deploy("gpustall-alerts.test.yml"));
    assert!(out.contains("SUCCESS"), "{out}");
}

/// A child killed (and reaped) when the test ends, passing or failing.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `gpustall watch` with its stderr read line by line.
fn start_watch(rule: &str, bundles: &Path) -> (Killed, mpsc::Receiver<String>) {
    let mut child = Command::new(tests::gpustall_bin())
        .args([
            "watch",
            "--no-gpu",
            "--listen",
            "127.0.0.1:0",
            "--scan-every",
            "500ms",
            "--after",
            "2s",
        ])
        .args(["--match", rule])
        .arg("--bundle-dir")
        .arg(bundles)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gpustall watch");
    let err = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    (Killed(child), rx)
}

/// The first line from `lines` containing `needle`.
fn wait_line(lines: &mpsc::Receiver<String>, needle: &str, timeout: Duration) -> String {
    let end = Instant::now() + timeout;
    let mut seen = Vec::new();
    while Instant::now() < end {
        if let Ok(l) = lines.recv_timeout(Duration::from_millis(100)) {
            if l.contains(needle) {
                return l;
            }
            seen.push(l);
        }
    }
    panic!("no {needle:?} within {timeout:?}:\n{}", seen.join("\n"));
}

/// A port free on loopback now (the kernel picks it; Prometheus binds it right after).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// A Prometheus of its own: loopback only, a temporary data directory, 1 s scrapes and rule
/// evaluations, the shipped rules, and the agent at `target` as its one scrape target.
fn start_prometheus(dir: &TempDir, target: &str) -> (Killed, String) {
    let (_, prometheus) = prometheus_tools();
    let config = dir.path("prometheus.yml");
    let rules = deploy("gpustall-alerts.yml");
    std::fs::write(
        &config,
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             rule_files: ['{}']\n\
             scrape_configs:\n  - job_name: gpustall\n    static_configs:\n      - targets: ['{target}']\n        labels: {{node: test-node}}\n",
            rules.display()
        ),
    )
    .expect("prometheus.yml");
    let base = format!("127.0.0.1:{}", free_port());
    let child = Command::new(prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.path("data").display()))
        .arg(format!("--web.listen-address={base}"))
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(dir.path("prometheus.log")).expect("log")))
        .spawn()
        .expect("starting prometheus");
    (Killed(child), format!("http://{base}"))
}

fn get(url: &str, query: &[(&str, &str)]) -> Option<Value> {
    let mut req = ureq::get(url);
    for (k, v) in query {
        req = req.query(*k, *v);
    }
    let body = req.call().ok()?.body_mut().read_to_string().ok()?;
    serde_json::from_str(&body).ok()
}

/// The result vector of an instant PromQL query.
fn query(base: &str, q: &str) -> Vec<Value> {
    get(&format!("{base}/api/v1/query"), &[("query", q)])
        .and_then(|v| v["data"]["result"].as_array().cloned())
        .unwrap_or_default()
}

/// Polls `f` every 250 ms until it gives something or `timeout` passes (then explains `what`).
fn poll<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "{what} within {timeout:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The alert `name` firing for `job`, as Prometheus's API has it.
fn firing(base: &str, name: &str, job: &str) -> Option<Value> {
    let alerts = get(&format!("{base}/api/v1/alerts"), &[])?;
    alerts["data"]["alerts"]
        .as_array()?
        .iter()
        .find(|a| {
            a["labels"]["alertname"] == name
                && a["labels"]["training_job"] == job
                && a["state"] == "firing"
        })
        .cloned()
}

/// The warnings before the kill, while the job still runs: its limit forecast under 10
/// minutes away, and the job holding 85 % of it. Returns the job's end.
fn warned_before_the_kill(
    base: &str,
    name: &str,
    mut job: Workload,
    released: Instant,
) -> (Option<i32>, Vec<Value>) {
    let mut warned: [Option<(Value, Duration)>; 2] = [None, None];
    while warned.iter().any(Option::is_none) && job.child.try_wait().expect("try_wait").is_none() {
        for (alert, w) in [LIMIT_SOON, NEAR_LIMIT].iter().zip(warned.iter_mut()) {
            if w.is_none() {
                *w = firing(base, alert, name).map(|a| (a, released.elapsed()));
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let (code, out) = job.wait(Duration::from_secs(120));
    let ended = released.elapsed();
    for (alert, w) in [LIMIT_SOON, NEAR_LIMIT].iter().zip(&warned) {
        let (a, after) =
            w.as_ref().unwrap_or_else(|| panic!("{alert} did not fire before the OOM kill"));
        eprintln!(
            "{alert} firing {:.1} s after the job started, {:.1} s before it ended: {}",
            after.as_secs_f64(),
            (ended - *after).as_secs_f64(),
            a["annotations"]["summary"]
        );
    }
    let soon = &warned[0].as_ref().expect("fired").0;
    assert!(
        soon["annotations"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("Growing fastest: the dataloader_worker processes")),
        "the growing role named: {soon:#}"
    );
    (code, out)
}

#[test]
fn a_real_prometheus_fires_the_oom_alert_for_a_watched_job() {
    tests::require_privileged_env();
    prometheus_tools();
    let _lock = tests::pressure_lock();
    let dir = TempDir::new("prometheus");
    let comm = unique_comm();
    let (mut watch, lines) = start_watch(&format!("comm:^{comm}$"), &dir.path("bundles"));
    let started = wait_line(&lines, "metrics on http://", Duration::from_secs(60));
    let target = started
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .expect("the metrics address")
        .to_string();
    let (mut prom, base) = start_prometheus(&dir, &target);
    let log = || std::fs::read_to_string(dir.path("prometheus.log")).unwrap_or_default();
    poll(Duration::from_secs(60), "Prometheus scraping the agent", || {
        if let Ok(Some(s)) = prom.0.try_wait() {
            panic!("prometheus exited ({s}):\n{}", log());
        }
        let up = query(&base, r#"up{job="gpustall"}"#);
        (up.first()?["value"][1] == "1").then_some(())
    });

    // The job starts after both; Prometheus has its series (at zero) before the kill.
    let cg = MemCgroup::new("prom", 256, false);
    let mut kmsg = Kmsg::open_at_end();
    let bin = Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    // One worker leaks 4 MiB every 0.6 s (two stay small): the job nears its limit for
    // seconds before the kernel kills it.
    let mut job = Workload::start_named(
        &comm,
        bin,
        &["hog", "600,40,40", "4", "3000", "pace=600"],
        Some(&cg),
        None,
    );
    let name = format!("{comm}-{}", job.pid());
    wait_line(&lines, &format!("watching job {name}"), Duration::from_secs(20));
    let series = format!(r#"gpustall_oom_kills_total{{training_job="{name}"}}"#);
    poll(Duration::from_secs(30), "the job's OOM counter in Prometheus", || {
        (!query(&base, &series).is_empty()).then_some(())
    });
    assert!(query(&base, &format!("{series} > 0")).is_empty(), "no kill yet");
    job.go();
    let released = Instant::now();
    let (code, out) = warned_before_the_kill(&base, &name, job, released);
    let killed_at = Instant::now();
    assert_eq!(code, Some(1), "a worker was OOM-killed");
    let pids: Vec<u32> = out.iter().filter_map(|l| l["pid"].as_u64()).map(|p| p as u32).collect();
    assert_eq!(
        tests::kernel::oom_kills_among(&kmsg.read_new(), &pids).len(),
        1,
        "the kernel killed one of the job"
    );

    let alert =
        poll(Duration::from_secs(90), "the OOM alert firing", || firing(&base, ALERT, &name));
    eprintln!(
        "{ALERT} firing {:.1} s after the job ended (scrape and evaluation every 1 s): {}",
        killed_at.elapsed().as_secs_f64(),
        alert["annotations"]["summary"]
    );
    assert_eq!(alert["labels"]["role"], "dataloader_worker", "{alert:#}");
    assert_eq!(alert["labels"]["severity"], "critical");
    assert_eq!(alert["labels"]["node"], "test-node");
    // The other alerts' series are there too: lost events and the agent's budget are scraped.
    for q in [
        "gpustall_lost_events_total",
        "gpustall_agent_memory_budget_bytes",
        "gpustall_flight_recorder_bytes",
    ] {
        // (lost events: a series per reason)
        assert!(!query(&base, q).is_empty(), "{q} in Prometheus");
    }
    drop(prom);
    assert!(watch.0.try_wait().expect("try_wait").is_none(), "the agent kept running");
}
