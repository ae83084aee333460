//! `gpustall watch --otlp-endpoint` against a real OpenTelemetry collector (rotel, started by
//! the test on loopback): a job with a torchrun rank's environment has a child SIGKILLed; the
//! collector receives the incident as a log record (verdict, rank, run, bundle path) and the
//! metrics with the same values `/metrics` serves. And a collector that is not there costs a
//! warning and a counter, never the daemon.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use tests::{
    otlp::Rotel,
    procs::{unique_comm, Workload},
    watcher::{scrape, value, Watcher},
};

/// Waits until `rotel` printed every one of `needles` (its debug log of what it received).
fn wait_received(rotel: &Rotel, needles: &[&str], timeout: Duration) -> String {
    let end = Instant::now() + timeout;
    loop {
        let got = rotel.received();
        if needles.iter().all(|n| got.contains(n)) {
            return got;
        }
        let missing: Vec<_> = needles.iter().filter(|n| !got.contains(**n)).collect();
        assert!(
            Instant::now() < end,
            "rotel did not receive {missing:?} within {timeout:?}:\n{got}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The pid of `parent`'s first child, once it has one.
fn first_child(parent: u32) -> u32 {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let kids = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
            .unwrap_or_default();
        if let Some(p) = kids.split_whitespace().find_map(|p| p.parse::<u32>().ok()) {
            return p;
        }
        assert!(Instant::now() < end, "pid {parent} started no child");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The record rotel printed that holds `needle`: from its `LogRecord #` line to the next one.
fn log_record<'a>(received: &'a str, needle: &str) -> &'a str {
    let at = received.find(needle).expect("the needle");
    let start = received[..at].rfind("LogRecord #").unwrap_or(0);
    let end = received[at..].find("LogRecord #").map_or(received.len(), |e| at + e);
    &received[start..end]
}

/// The incident, as the collector got it: a log record with the kill, the job and its rank.
fn the_incident_reached_the_collector(
    rotel: &Rotel,
    bundle: &str,
    victim: u32,
    job_name: &str,
    run: &str,
) {
    let got = wait_received(
        rotel,
        &["gpustall.incident.kind: Str(sigkill)", &format!("gpustall.bundle.path: Str({bundle})")],
        Duration::from_secs(20),
    );
    let record = log_record(&got, "gpustall.incident.kind: Str(sigkill)");
    eprintln!("the collector received:\n{record}");
    let me = std::process::id();
    for want in [
        "SeverityText: ERROR".to_string(),
        format!("killed by SIGKILL from pid {me}"),
        format!("process.pid: Int({victim})"),
        format!("gpustall.training_job: Str({job_name})"),
        format!("gpustall.torch.run_id: Str({run})"),
        "gpustall.torch.rank: Int(1)".to_string(),
        "gpustall.torch.world_size: Int(2)".to_string(),
        "gpustall.verdict.cause: Str(process_killed)".to_string(),
    ] {
        assert!(record.contains(&want), "no {want:?} in the log record:\n{record}");
    }
    assert!(!record.contains("k8s.pod.name"), "nothing invented:\n{record}");
}

#[test]
fn watch_sends_incidents_and_metrics_to_an_otlp_collector() {
    tests::require_privileged_env();
    let rotel = Rotel::start();
    let base = rotel.otlp_logs_url().trim_end_matches("/v1/logs").to_string();
    let dir = tests::TempDir::new("otlp-watch");
    let comm = unique_comm();
    let rule = format!("comm:^{comm}$");
    let bundles = dir.0.to_str().expect("utf-8").to_string();
    // The cluster's name as a user gives it to every OpenTelemetry SDK.
    let cluster = format!("gpustall-test-{}", tests::unique());
    let mut cmd = std::process::Command::new(tests::gpustall_bin());
    cmd.env("OTEL_RESOURCE_ATTRIBUTES", format!("k8s.cluster.name={cluster}")).args([
        "watch",
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
        "--otlp-endpoint",
        &base,
        "--otlp-every",
        "1s",
    ]);
    let mut w = Watcher::spawn(cmd);
    let started = w.wait_for("metrics on http://", Duration::from_secs(60));
    let addr = started.split("http://").nth(1).and_then(|r| r.split('/').next()).expect("addr");
    let said = w.wait_for("OpenTelemetry export:", Duration::from_secs(5));
    assert!(said.contains(&format!("incidents to {base}/v1/logs")), "{said}");

    // Rank 1 of 2 of a torchrun run, as torchrun's environment says.
    let run = format!("run-{}", tests::unique());
    let workload = env!("CARGO_BIN_EXE_gpustall-workload");
    let env_args = ["RANK=1", "WORLD_SIZE=2", &format!("TORCHELASTIC_RUN_ID={run}")];
    let args: Vec<&str> = env_args.into_iter().chain([workload, "spawn", "sleep", "30"]).collect();
    let mut job = Workload::start_named(&comm, Path::new("/usr/bin/env"), &args, None, None);
    let job_name = format!("{comm}-{}", job.pid());
    w.wait_for(&format!("watching job {job_name}"), Duration::from_secs(20));
    job.go();
    let victim = first_child(job.pid());
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: plain kill of the test's own grandchild.
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    let wrote = w.wait_for("wrote incident bundle", Duration::from_secs(30));
    let bundle = wrote.split("bundle ").nth(1).and_then(|r| r.split(" (").next()).expect("path");

    the_incident_reached_the_collector(&rotel, bundle, victim, &job_name, &run);

    // The metrics: the job's identity and its incident count, the values /metrics serves.
    let got = wait_received(
        &rotel,
        &["Name: gpustall.incidents", "Name: gpustall.job_info", &format!("run_id: Str({run})")],
        Duration::from_secs(20),
    );
    let served = scrape(addr);
    let series =
        format!("gpustall_incidents_total{{kind=\"sigkill\",training_job=\"{job_name}\"}}");
    assert_eq!(value(&served, &series), Some(1.0), "{served}");
    assert!(got.contains("Name: gpustall.reclaim_stall") && got.contains("Unit: s"), "{got}");
    assert!(got.contains(&format!("k8s.cluster.name: Str({cluster})")), "the resource:\n{got}");
    for signal in ["metrics", "logs"] {
        let failures = format!("gpustall_otlp_export_failures_total{{signal=\"{signal}\"}}");
        assert_eq!(value(&served, &failures), Some(0.0), "no failures:\n{served}");
    }
    let _ = job.wait(Duration::from_secs(30));
}

#[test]
fn a_collector_that_is_not_there_costs_a_warning_and_a_counter() {
    tests::require_privileged_env();
    // A port nothing listens on: bound, its number taken, closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dir = tests::TempDir::new("otlp-down");
    let bundles = dir.0.to_str().expect("utf-8").to_string();
    let endpoint = format!("http://127.0.0.1:{port}");
    // Asked for by OpenTelemetry's own variable, as the OpenTelemetry Operator injects it.
    let mut cmd = std::process::Command::new(tests::gpustall_bin());
    cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint).args([
        "watch",
        "--match",
        &format!("comm:^{}$", unique_comm()),
        "--bundle-dir",
        &bundles,
        "--listen",
        "127.0.0.1:0",
        "--no-gpu",
        "--otlp-every",
        "1s",
    ]);
    let mut w = Watcher::spawn(cmd);
    let started = w.wait_for("metrics on http://", Duration::from_secs(60));
    let addr = started.split("http://").nth(1).and_then(|r| r.split('/').next()).expect("addr");
    let warned = w.wait_for("OTLP metrics export to", Duration::from_secs(20));
    assert!(warned.contains("failed") && warned.contains(&endpoint), "{warned}");
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let served = scrape(addr);
        let failed = value(&served, "gpustall_otlp_export_failures_total{signal=\"metrics\"}");
        if failed >= Some(2.0) {
            break;
        }
        assert!(Instant::now() < end, "failures not counted:\n{served}");
        std::thread::sleep(Duration::from_millis(300));
    }
    // Said once, not at every failed export.
    let warnings = w.seen().iter().filter(|l| l.contains("OTLP metrics export to")).count();
    assert_eq!(warnings, 1, "{:#?}", w.seen());
    assert!(tests::watcher::get(addr, "/healthz").starts_with("HTTP/1.1 200"), "still live");
}

/// Configured only by OpenTelemetry's variables, as an SDK would be: the metrics alone to
/// their own URL, gzipped; the collector reads them and nothing fails.
#[test]
fn the_opentelemetry_variables_alone_send_gzipped_metrics() {
    tests::require_privileged_env();
    let rotel = Rotel::start();
    let dir = tests::TempDir::new("otlp-env");
    let mut cmd = std::process::Command::new(tests::gpustall_bin());
    cmd.env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", rotel.otlp_metrics_url())
        .env("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
        .env("OTEL_SERVICE_NAME", "gpustall-env-test")
        .args(["watch", "--match", &format!("comm:^{}$", unique_comm())])
        .args(["--bundle-dir", dir.0.to_str().expect("utf-8")])
        .args(["--listen", "127.0.0.1:0", "--no-gpu", "--otlp-every", "1s"]);
    let mut w = Watcher::spawn(cmd);
    let started = w.wait_for("metrics on http://", Duration::from_secs(60));
    let addr = started.split("http://").nth(1).and_then(|r| r.split('/').next()).expect("addr");
    let said = w.wait_for("OpenTelemetry export:", Duration::from_secs(5));
    assert!(said.contains(&rotel.otlp_metrics_url()) && said.contains("gzip"), "{said}");
    assert!(!said.contains("incidents to"), "no logs endpoint, no incidents sent: {said}");
    let got = wait_received(
        &rotel,
        &["Name: gpustall.watched_jobs", "service.name: Str(gpustall-env-test)"],
        Duration::from_secs(20),
    );
    assert!(got.contains("Name: gpustall.agent_cpu"), "{got}");
    let served = scrape(addr);
    let failures = "gpustall_otlp_export_failures_total{signal=\"metrics\"}";
    assert_eq!(value(&served, failures), Some(0.0), "{served}");
    assert_eq!(value(&served, "gpustall_otlp_export_failures_total{signal=\"logs\"}"), None);
}

/// An OTLP header's token (OTEL_EXPORTER_OTLP_HEADERS) never reaches the daemon's log, even at
/// RUST_LOG=trace, where the HTTP client would dump each request's bytes: its logs stay at
/// info unless named.
#[test]
fn an_otlp_headers_token_is_never_logged_even_at_trace() {
    tests::require_privileged_env();
    let rotel = Rotel::start();
    let dir = tests::TempDir::new("otlp-secret");
    let token = format!("S3CR3T{}", tests::unique());
    let mut cmd = std::process::Command::new(tests::gpustall_bin());
    cmd.env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", rotel.otlp_metrics_url())
        .env("OTEL_EXPORTER_OTLP_HEADERS", format!("authorization=Bearer {token}"))
        .env("RUST_LOG", "trace")
        .args(["watch", "--match", &format!("comm:^{}$", unique_comm())])
        .args(["--bundle-dir", dir.0.to_str().expect("utf-8")])
        .args(["--listen", "127.0.0.1:0", "--no-gpu", "--otlp-every", "1s"]);
    let mut w = Watcher::spawn(cmd);
    w.wait_for("metrics on http://", Duration::from_secs(60));
    wait_received(&rotel, &["Name: gpustall.watched_jobs"], Duration::from_secs(20));
    // Two more exports (one a second), their log lines read.
    w.read_for(Duration::from_secs(3));
    let log = w.seen().join("\n");
    let exports = log.matches("OTLP metrics:").count();
    assert!(exports >= 2, "{exports} exports logged at debug:\n{log}");
    assert!(!log.contains(&token), "the token is in the log");
    // A wire dump splits the token over lines of hex: none may be logged at all.
    assert!(!log.contains("[ureq_proto::util]"), "a wire dump is logged");
}
