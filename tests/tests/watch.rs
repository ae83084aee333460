//! `gpustall watch`: a job that starts after the daemon is found by a --match rule, its OOM
//! kill produces an incident bundle whose verdict names the victim, and the metrics endpoint
//! serves counters that move.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use tests::{
    cgroup::MemCgroup,
    kernel::Kmsg,
    procs::{unique_comm, Workload},
    watcher::{bundling_watcher, scrape, value, Watcher},
};

#[test]
fn watch_finds_a_later_job_bundles_its_oom_kill_and_serves_metrics() {
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    let bundles = tests::TempDir::new("bundles");
    let dir = bundles.0.to_str().expect("utf-8").to_string();
    // The rule matches this test's workload only: another test's job must never be watched here.
    let comm = unique_comm();
    let rule = format!("comm:^{comm}$");
    let (mut w, addr) = bundling_watcher(&rule, &dir);
    let before = scrape(&addr);
    assert_eq!(value(&before, "gpustall_watched_jobs"), Some(0.0), "{before}");

    // The job starts after the daemon.
    let cg = MemCgroup::new("watch", 256, false);
    let mut kmsg = Kmsg::open_at_end();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    let mut job =
        Workload::start_named(&comm, bin, &["hog", "600,40,40", "8", "3000"], Some(&cg), None);
    w.wait_for(&format!("watching job {comm}-{}", job.pid()), Duration::from_secs(20));
    job.go();
    let (code, lines) = job.wait(Duration::from_secs(120));
    assert_eq!(code, Some(1), "a worker was OOM-killed");
    let pids: Vec<u32> = lines.iter().filter_map(|l| l["pid"].as_u64()).map(|p| p as u32).collect();
    let victim = tests::kernel::oom_kills_among(&kmsg.read_new(), &pids);
    assert_eq!(victim.len(), 1, "one process of the job was OOM-killed");
    let victim = victim[0].pid;

    let wrote = w.wait_for("wrote incident bundle", Duration::from_secs(30));
    assert!(wrote.contains(&format!("oom_kill-{victim}")), "{wrote}");
    let bundle = bundle_dir(&bundles, &format!("oom_kill-{victim}"));
    let summary = bundle_summary(&bundle);
    assert_eq!(summary["verdict"]["cause"], "host_memory_oom", "{:#}", summary["verdict"]);
    let culprits = summary["verdict"]["culprit_pids"].as_array().expect("culprits");
    assert!(culprits.contains(&victim.into()), "the victim is named: {culprits:?}");
    assert_eq!(summary["oom_kills"][0]["victim_pid"], victim);
    for f in ["record.jsonl", "report.txt", "trace.json"] {
        assert!(bundle.join(f).exists(), "{f} in the bundle");
    }
    // The bundle's recording replays offline into the same verdict.
    let o = Command::new(tests::gpustall_bin())
        .arg("report")
        .arg(bundle.join("record.jsonl"))
        .output()
        .expect("report");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("host_memory_oom"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );

    let after = scrape(&addr);
    // Every role of the job has the series (at zero until a kill): the kill is in one of them.
    let oom: f64 = after
        .lines()
        .filter(|l| l.starts_with("gpustall_oom_kills_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(oom, 1.0, "{after}");
    assert!(after.contains(r#"role="dataloader_worker"} 1"#), "the kill is the worker's: {after}");
    assert!(value(&after, "gpustall_incidents_total{").is_some_and(|v| v >= 1.0), "{after}");
    assert!(value(&after, "gpustall_agent_cpu_seconds_total").is_some_and(|v| v > 0.0), "{after}");
    // The maps' kernel memory, outside the agent's RSS: present, and within its 16 MiB bound.
    let maps = value(&after, "gpustall_agent_bpf_map_memory_bytes").unwrap_or(0.0);
    assert!(maps > 1e6 && maps <= 16.0 * 1048576.0, "BPF map memory {maps}: {after}");
    assert!(
        after.contains("# TYPE gpustall_reclaim_stall_seconds counter")
            || after.contains("gpustall_reclaim_stall_seconds_total"),
        "{after}"
    );
}

#[test]
fn watch_follows_a_process_that_nvml_lists_on_a_gpu() {
    tests::require_privileged_env();
    // A process that uses "the GPU" (the stand-in NVML lists it), matched by no rule.
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    let mut job = Workload::start(bin, &["tree"], None);
    let dir = tests::TempDir::new("watch-gpu");
    let scenario = dir.path("scenario.json");
    let doc = serde_json::json!({"gpus": [{"name": "Stand-in", "uuid": "GPU-stub-0", "memory_total_mib": 81920,
        "timeline": [{"at_s": 0, "util_gpu": 80, "temperature_c": 55, "pids": [{"pid": "$GPUSTALL_TEST_TRAINER", "used_mib": 1000}]}]}]});
    std::fs::write(&scenario, doc.to_string()).expect("scenario");
    let bundles = dir.path("bundles");
    let mut cmd = Command::new(tests::gpustall_bin());
    cmd.args([
        "watch",
        "--listen",
        "127.0.0.1:0",
        "--scan-every",
        "500ms",
        "--gpu-interval",
        "200ms",
        "--nvml-lib",
    ])
    .arg(tests::nvml_stub())
    .arg("--bundle-dir")
    .arg(&bundles)
    .env("GPUSTALL_NVML_STUB_SCENARIO", &scenario)
    .env("GPUSTALL_TEST_TRAINER", job.pid().to_string());
    let mut w = Watcher::spawn(cmd);
    let started = w.wait_for("metrics on http://", Duration::from_secs(60));
    let addr = started
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .expect("address")
        .to_string();
    w.wait_for(&format!("watching job {}-{}", job.comm(), job.pid()), Duration::from_secs(20));
    let metrics = scrape(&addr);
    assert_eq!(value(&metrics, "gpustall_gpu_utilization_ratio{"), Some(0.8), "{metrics}");
    assert_eq!(value(&metrics, "gpustall_watched_jobs"), Some(1.0), "{metrics}");
    job.go();
    let (code, _) = job.wait(Duration::from_secs(30));
    assert_eq!(code, Some(0));
}

/// An idle daemon (no job at all) ends on the first SIGINT, and on SIGTERM and SIGHUP.
#[test]
fn an_idle_watch_ends_on_the_first_signal() {
    tests::require_privileged_env();
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        let dir = tests::TempDir::new("watch-idle");
        let mut cmd = Command::new(tests::gpustall_bin());
        cmd.args([
            "watch",
            "--no-gpu",
            "--listen",
            "127.0.0.1:0",
            "--match",
            &format!("comm:^{}$", unique_comm()),
        ])
        .arg("--bundle-dir")
        .arg(&dir.0);
        let mut w = Watcher::spawn(cmd);
        w.wait_for("metrics on http://", Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(1500));
        let asked = Instant::now();
        // SAFETY: plain kill of our child.
        unsafe { libc::kill(w.child.id() as i32, sig) };
        let end = asked + Duration::from_secs(5);
        let status = loop {
            if let Ok(Some(s)) = w.child.try_wait() {
                break s;
            }
            assert!(Instant::now() < end, "signal {sig}: watch did not end within 5 s");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(status.code(), Some(0), "signal {sig}");
    }
}

/// Runs `watch` on a job whose `sleep` child the test SIGKILLs; returns the bundle's summary.
fn sigkill_bundle(extra: &[&str]) -> (serde_json::Value, u32) {
    let dir = tests::TempDir::new("watch-kill");
    let comm = unique_comm();
    let mut w = kill_watcher(&dir, &comm, extra);
    kill_a_jobs_child(&mut w, &dir, &comm)
}

/// `watch` matching jobs named `comm`, its bundles in `dir`, ready.
fn kill_watcher(dir: &tests::TempDir, comm: &str, extra: &[&str]) -> Watcher {
    let rule = format!("comm:^{comm}$");
    let bundles = dir.0.to_str().expect("utf-8").to_string();
    let mut args = vec![
        "--match",
        &rule,
        "--bundle-dir",
        &bundles,
        "--listen",
        "127.0.0.1:0",
        "--no-gpu",
        "--after",
        "1s",
        "--scan-every",
        "500ms",
    ];
    args.extend_from_slice(extra);
    let mut w = Watcher::start(&args);
    w.wait_for("metrics on http://", Duration::from_secs(60));
    w
}

/// Starts a job named `comm` whose `sleep` child the test SIGKILLs once watch follows it;
/// returns the bundle's summary and the child's pid.
fn kill_a_jobs_child(
    w: &mut Watcher,
    dir: &tests::TempDir,
    comm: &str,
) -> (serde_json::Value, u32) {
    kill_a_jobs_child_running(w, dir, comm, &["sleep", "30"])
}

/// [`kill_a_jobs_child`] with `child` as the child's command.
fn kill_a_jobs_child_running(
    w: &mut Watcher,
    dir: &tests::TempDir,
    comm: &str,
    child: &[&str],
) -> (serde_json::Value, u32) {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    let args: Vec<&str> = std::iter::once("spawn").chain(child.iter().copied()).collect();
    let mut job = Workload::start_named(comm, bin, &args, None, None);
    w.wait_for(&format!("watching job {comm}-{}", job.pid()), Duration::from_secs(20));
    job.go();
    let end = Instant::now() + Duration::from_secs(10);
    let sleep_pid = loop {
        let kids = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", job.pid()))
            .unwrap_or_default();
        if let Some(p) = kids.split_whitespace().find_map(|p| p.parse::<u32>().ok()) {
            break p;
        }
        assert!(Instant::now() < end, "the job's sleep did not start");
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: plain kill of the test's own grandchild.
    unsafe { libc::kill(sleep_pid as i32, libc::SIGKILL) };
    // This kill's bundle (the watcher's earlier lines may announce another's).
    let wrote = w.wait_for(&format!("-sigkill-{sleep_pid} ("), Duration::from_secs(30));
    assert!(wrote.contains("wrote incident bundle"), "{wrote}");
    (bundle_summary(&sigkill_bundle_dir(dir, sleep_pid)), sleep_pid)
}

/// The bundle in `dir` made for the SIGKILL of `pid`.
fn sigkill_bundle_dir(dir: &tests::TempDir, pid: u32) -> std::path::PathBuf {
    bundle_dir(dir, &format!("sigkill-{pid}"))
}

/// The bundle in `dir` whose name holds `needle` (`oom_kill-PID`).
fn bundle_dir(dir: &tests::TempDir, needle: &str) -> std::path::PathBuf {
    std::fs::read_dir(&dir.0)
        .expect("bundles")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains(needle))
        .unwrap_or_else(|| panic!("no bundle {needle} in {}", dir.0.display()))
}

/// A bundle's summary.json.
fn bundle_summary(bundle: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(bundle.join("summary.json")).expect("summary.json");
    serde_json::from_str(&text).expect("json")
}

/// Two runs of a job, each SIGKILLing its own child, both inside one flight-recorder window:
/// the second bundle's verdict is the second kill, not the first one earlier in its window
/// (the bundle is the incident's job's), and it holds no process of the first run.
#[test]
fn a_bundles_verdict_is_its_own_jobs_kill_not_an_earlier_one_in_its_window() {
    tests::require_privileged_env();
    let dir = tests::TempDir::new("watch-two-kills");
    let comm = unique_comm();
    let mut w = kill_watcher(&dir, &comm, &[]);
    let (_, first) = kill_a_jobs_child(&mut w, &dir, &comm);
    let (s, second) = kill_a_jobs_child(&mut w, &dir, &comm);
    let v = &s["verdict"];
    assert_eq!(v["cause"], "process_killed", "{v:#}");
    let text = v["text"].as_str().unwrap_or_default();
    assert!(
        text.contains(&second.to_string()),
        "the verdict names the second kill {second}: {v:#}"
    );
    assert!(!text.contains(&first.to_string()), "not the first {first}: {v:#}");
    let pids: Vec<u64> = s["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter_map(|p| p["pid"].as_u64())
        .collect();
    assert!(!pids.contains(&u64::from(first)), "{first} is the other run's: {pids:?}");
}

#[test]
fn a_sigkill_from_user_space_gets_a_verdict_that_names_the_sender() {
    tests::require_privileged_env();
    let (s, victim) = sigkill_bundle(&[]);
    let v = &s["verdict"];
    assert_eq!(v["cause"], "process_killed", "{v:#}");
    let me = std::process::id();
    assert_eq!(v["culprit_pids"][0], me, "the sender (this test) is the culprit, not {victim}");
    assert!(
        v["text"].as_str().is_some_and(|t| t.contains(&format!("killed by SIGKILL from pid {me}"))),
        "{v:#}"
    );
    assert_eq!(s["lost_events"], 0);
}

#[test]
fn a_flight_recorder_over_its_budget_says_what_the_bundle_lacks() {
    tests::require_privileged_env();
    let (s, _) = sigkill_bundle(&["--memory-budget", "0"]);
    let dropped = s["lost"]["flight_recorder"].as_u64().unwrap_or(0);
    assert!(dropped > 0, "the dropped lines are counted: {:#}", s["lost"]);
    assert!(s["lost_events"].as_u64() >= Some(dropped));
    let lb = s["lower_bounds"].to_string();
    assert!(lb.contains("flight recorder"), "{lb}");
}

/// Two jobs in two memory cgroups and two working directories: each is read in its own, and
/// the bundle of the second's OOM kill has the second's cgroup and cwd, not the first job's
/// (which `watch` used for every job before).
#[test]
fn each_watched_job_keeps_its_own_cgroup_and_cwd() {
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    let bundles = tests::TempDir::new("bundles-2jobs");
    let dir = bundles.0.to_str().expect("utf-8").to_string();
    let (idle_comm, oom_comm) = (unique_comm(), unique_comm());
    let rule = format!("comm:^({idle_comm}|{oom_comm})$");
    let (mut w, addr) = bundling_watcher(&rule, &dir);
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    // The first job found: an idle one in a 512 MiB cgroup.
    let idle_cg = MemCgroup::new("watch-idle", 512, false);
    let idle_cwd = tests::TempDir::new("watch-idle-cwd");
    let mut idle = Workload::start_named(
        &idle_comm,
        bin,
        &["spawn", "sleep", "60"],
        Some(&idle_cg),
        Some(&idle_cwd.0),
    );
    w.wait_for(&format!("watching job {idle_comm}-{}", idle.pid()), Duration::from_secs(20));
    idle.go();
    // The second: an OOM in a 256 MiB cgroup.
    let oom_cg = MemCgroup::new("watch-oom", 256, false);
    let oom_cwd = tests::TempDir::new("watch-oom-cwd");
    let mut kmsg = Kmsg::open_at_end();
    let mut job = Workload::start_named(
        &oom_comm,
        bin,
        &["hog", "600,40,40", "8", "3000"],
        Some(&oom_cg),
        Some(&oom_cwd.0),
    );
    let oom_job = format!("{oom_comm}-{}", job.pid());
    w.wait_for(&format!("watching job {oom_job}"), Duration::from_secs(20));
    // Both jobs' limits, each its own, once a beat has read them.
    std::thread::sleep(Duration::from_millis(2500));
    let metrics = scrape(&addr);
    let limit = |job: &str| {
        value(&metrics, &format!("gpustall_job_memory_limit_bytes{{training_job=\"{job}\"}}"))
    };
    assert_eq!(limit(&format!("{idle_comm}-{}", idle.pid())), Some((512u64 << 20) as f64));
    assert_eq!(limit(&oom_job), Some((256u64 << 20) as f64), "{metrics}");
    job.go();
    let (code, lines) = job.wait(Duration::from_secs(120));
    assert_eq!(code, Some(1), "a worker was OOM-killed");
    let pids: Vec<u32> = lines.iter().filter_map(|l| l["pid"].as_u64()).map(|p| p as u32).collect();
    let victim = tests::kernel::oom_kills_among(&kmsg.read_new(), &pids);
    assert_eq!(victim.len(), 1, "one process of the job was OOM-killed");
    let victim = victim[0].pid;
    w.wait_for(&format!("oom_kill-{victim}"), Duration::from_secs(30));
    let bundle = bundle_dir(&bundles, &format!("oom_kill-{victim}"));
    let summary = bundle_summary(&bundle);
    let ctx = &summary["context"];
    assert_eq!(ctx["cgroup"]["path"], oom_cg.cgroup_path(), "the OOM job's cgroup: {ctx:#}");
    assert_eq!(ctx["cgroup"]["limit_bytes"], 256u64 << 20, "{ctx:#}");
    let fs = ctx["filesystems"].to_string();
    let cwd = |d: &tests::TempDir| d.0.to_str().expect("utf-8").to_string();
    assert!(fs.contains(&cwd(&oom_cwd)), "the OOM job's cwd: {fs}");
    assert!(!fs.contains(&cwd(&idle_cwd)), "not the first job's cwd: {fs}");
    let want = format!("Memory cgroup {} (limit 256 MiB)", oom_cg.cgroup_path());
    let text = summary["verdict"]["text"].as_str().unwrap_or_default().to_string();
    assert!(text.starts_with(&want), "{text}");
}

/// A watched job whose child moves itself into a memory cgroup and is OOM-killed there in a
/// tenth of a second, before a beat has looked (a wrapper that stays where it is, running
/// `echo $$ > cgroup.procs; exec python`), gets that cgroup and its limit from the kernel's OOM
/// report, as `trace` does: the bundle's verdict is against the cgroup's limit, not "its limit
/// was not read in time".
#[test]
fn a_watched_job_killed_moments_after_joining_its_cgroup_gets_the_limit_from_the_oom_report() {
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    let bundles = tests::TempDir::new("bundles-late-cg");
    let dir = bundles.0.to_str().expect("utf-8").to_string();
    let comm = unique_comm();
    let (mut w, _addr) = bundling_watcher(&format!("comm:^{comm}$"), &dir);
    let cg = MemCgroup::new("watch-late", 64, false);
    let go = bundles.path("go");
    // Named for the rule, the wrapper waits to be watched; its child joins the cgroup and
    // outgrows it at once.
    let child = "import os, sys\n\
         open(sys.argv[1] + '/cgroup.procs', 'w').write(str(os.getpid()))\n\
         b = bytearray(256 << 20)\n";
    let wrapper = "import ctypes, os, subprocess, sys, time\n\
         ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)\n\
         while not os.path.exists(sys.argv[2]): time.sleep(0.02)\n\
         subprocess.run([sys.executable, '-c', sys.argv[4], sys.argv[3]])\n\
         time.sleep(0.5)\n";
    let mut job = Command::new("python3")
        .args(["-c", wrapper, &comm, go.to_str().expect("utf-8")])
        .args([cg.path.to_str().expect("utf-8"), child])
        .spawn()
        .expect("python3");
    w.wait_for(&format!("watching job {comm}-{}", job.id()), Duration::from_secs(20));
    std::fs::write(&go, "").expect("go");
    let status = job.wait().expect("wait");
    assert_eq!(cg.oom_kills(), 1, "the cgroup's own count ({status})");
    w.wait_for("oom_kill-", Duration::from_secs(30));
    let bundle = bundle_dir(&bundles, "oom_kill-");
    let summary = bundle_summary(&bundle);
    let ctx = &summary["context"];
    eprintln!("cgroup: {}\nverdict: {}", ctx["cgroup"], summary["verdict"]["text"]);
    assert_eq!(ctx["cgroup"]["path"], cg.cgroup_path(), "the cgroup it joined: {ctx:#}");
    assert_eq!(ctx["cgroup"]["limit_bytes"], 64u64 << 20, "{ctx:#}");
    let text = summary["verdict"]["text"].as_str().unwrap_or_default().to_string();
    assert!(text.contains("(limit 64 MiB") && !text.contains("not read in time"), "{text}");
}

/// `/healthz` answers 200 while the daemon's loop beats (the DaemonSet's liveness probe), and
/// the metrics say which gpustall serves them.
#[test]
fn healthz_answers_and_build_info_is_exported() {
    tests::require_privileged_env();
    let bundles = tests::TempDir::new("healthz");
    let rule = format!("comm:^{}$", unique_comm());
    let (_w, addr) = bundling_watcher(&rule, bundles.0.to_str().expect("utf-8"));
    let health = tests::watcher::get(&addr, "/healthz");
    assert!(health.starts_with("HTTP/1.1 200") && health.ends_with("ok\n"), "{health}");
    let metrics = scrape(&addr);
    assert!(metrics.contains("gpustall_build_info{version=\""), "{metrics}");
}

/// A child that names itself with an escape sequence and a newline, killed: the daemon's log
/// line for its bundle, and the bundle's report.txt, show the bytes as `\xNN`; no line of the
/// log is forged from the name.
#[test]
fn a_name_with_a_newline_cannot_forge_the_daemons_log() {
    tests::require_privileged_env();
    let dir = tests::TempDir::new("watch-forge");
    let comm = unique_comm();
    let mut w = kill_watcher(&dir, &comm, &[]);
    let rename = r#"import ctypes, time
ctypes.CDLL(None).prctl(15, b"\x1b[2J\nFORGED", 0, 0, 0)
time.sleep(30)"#;
    let (s, victim) = kill_a_jobs_child_running(&mut w, &dir, &comm, &["python3", "-c", rename]);
    let text = s["verdict"]["text"].as_str().unwrap_or_default();
    assert!(text.contains("\\x1b[2J\\x0aFORGED"), "the name shown: {text}");
    w.read_for(Duration::from_millis(500));
    let log = w.seen().join("\n");
    assert!(!log.contains('\x1b'), "a raw ESC in the log:\n{}", log.escape_debug());
    assert!(
        !log.lines().any(|l| l.starts_with("FORGED")),
        "a line forged from the name of {victim}:\n{log}"
    );
    let bundle = sigkill_bundle_dir(&dir, victim);
    let report = std::fs::read_to_string(bundle.join("report.txt")).expect("report.txt");
    assert!(!report.contains('\x1b') && !report.lines().any(|l| l.starts_with("FORGED")));
}
