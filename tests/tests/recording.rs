//! Recordings: durable JSON Lines that replay offline into the very summary the live run
//! produced, and survive `kill -9` of the agent.

use std::{os::unix::fs::PermissionsExt, process::Command, time::Duration};

use serde_json::{json, Value};
use tests::{
    cgroup::MemCgroup,
    kernel::SwapFile,
    procs::{Tracer, Workload},
};

fn workload() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_BIN_EXE_gpustall-workload"))
}

fn report(file: &std::path::Path, out: &std::path::Path) -> (Option<i32>, String, String) {
    let o = Command::new(tests::gpustall_bin())
        .arg("report")
        .arg(file)
        .arg("--summary-json")
        .arg(out)
        .output()
        .expect("gpustall report");
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Every leaf that differs, as "path: live vs replayed".
fn differences(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))) {
                differences(&x[k], y.get(k).unwrap_or(&Value::Null), &format!("{path}.{k}"), out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                differences(p, q, &format!("{path}[{i}]"), out);
            }
        }
        _ if a != b => out.push(format!("{path}: {a} vs {b}")),
        _ => {}
    }
}

/// The recording as a Perfetto trace: tracks per process, slices, counters, the stall.
fn the_perfetto_trace_draws_each_worker(
    dir: &tests::TempDir,
    copy: &std::path::Path,
    live: &tests::procs::TraceResult,
) {
    let trace_out = dir.path("trace.json");
    let o = Command::new(tests::gpustall_bin())
        .args(["export", "--perfetto"])
        .arg(&trace_out)
        .arg(copy)
        .output()
        .expect("export");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(&trace_out).expect("trace"))
        .expect("trace JSON");
    let ev = trace["traceEvents"].as_array().expect("traceEvents");
    let workers: Vec<&Value> =
        live.processes().iter().filter(|p| p["role"] == "dataloader_worker").collect();
    assert_eq!(workers.len(), 3);
    for p in &workers {
        let w = p["pid"].as_u64().expect("pid");
        assert!(
            ev.iter().any(|e| e["ph"] == "M" && e["name"] == "process_name" && e["pid"] == w),
            "a named track for worker {w}"
        );
        assert!(
            ev.iter().any(|e| e["ph"] == "C" && e["pid"] == w && e["name"] == "rss_mib"),
            "an RSS counter on worker {w}'s track"
        );
        // As many reclaim slices on its track as reclaim stalls the summary counts for it.
        let slices = ev
            .iter()
            .filter(|e| e["ph"] == "X" && e["pid"] == w && e["name"] == "memcg reclaim")
            .count() as u64;
        assert_eq!(
            slices,
            p["memcg_reclaim_count"].as_u64().expect("count"),
            "reclaim slices on worker {w}'s track"
        );
    }
    assert!(
        workers.iter().any(|p| p["memcg_reclaim_count"].as_u64() > Some(0)),
        "some worker stalled in reclaim"
    );
    assert!(
        ev.iter().any(|e| e["ph"] == "X" && e["name"] == "GPU stall"),
        "the GPU stall on the GPU track"
    );
    assert!(
        ev.iter().any(|e| e["ph"] == "C" && e["name"] == "util_pct"),
        "GPU utilisation counter"
    );
    assert!(
        ev.iter().any(|e| e["ph"] == "C" && e["name"] == "job_swapout_pages_s"),
        "swap-out rate counter"
    );
    assert!(
        ev.iter().all(|e| e["ts"].is_null() || e["ts"].as_f64().is_some_and(|t| t >= 0.0)),
        "timestamps from the start"
    );
}

/// The recording as one self-contained HTML page.
fn the_html_page_is_one_self_contained_file(
    dir: &tests::TempDir,
    copy: &std::path::Path,
    live: &tests::procs::TraceResult,
) {
    let html_out = dir.path("report.html");
    let o = Command::new(tests::gpustall_bin())
        .arg("report")
        .arg(copy)
        .arg("--html")
        .arg(&html_out)
        .output()
        .expect("report --html");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let html = std::fs::read_to_string(&html_out).expect("html");
    assert!(
        html.contains("<svg")
            && html.contains(live.summary["verdict"]["cause"].as_str().expect("cause"))
    );
    assert!(
        !html.contains("<script") && !html.contains("src=\"http") && !html.contains("href=\"http"),
        "no network, no scripts"
    );
}

/// A corrupt line: the error names it; the report covers what came before.
fn a_corrupt_line_is_named_and_the_rest_reported(dir: &tests::TempDir, record: &std::path::Path) {
    let text = std::fs::read_to_string(record).expect("read");
    let lines: Vec<&str> = text.lines().collect();
    let cut = lines.len() / 2;
    let corrupt = dir.path("corrupt.jsonl");
    std::fs::write(
        &corrupt,
        format!("{}\n{{not json\n{}\n", lines[..cut].join("\n"), lines[cut..].join("\n")),
    )
    .expect("write");
    let (rc, stdout, stderr) = report(&corrupt, &dir.path("c.json"));
    assert_eq!(rc, Some(1));
    assert!(
        stderr.contains(&format!("line {}", cut + 1)) && stderr.contains("not JSON"),
        "{stderr}"
    );
    assert!(stdout.contains("== gpustall:"), "the report of what parsed is printed: {stdout}");
}

#[test]
fn the_offline_report_reproduces_the_live_summary_field_by_field() {
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    let _swap = SwapFile::ensure(1024);
    let cg = MemCgroup::new("replay", 128, true);
    let dir = tests::TempDir::new("replay");
    let scenario = dir.path("scenario.json");
    let e = |at: f64, util: u32| json!({"at_s": at, "util_gpu": util, "temperature_c": 70, "pids": [{"pid": "$GPUSTALL_TEST_TRAINER"}]});
    std::fs::write(&scenario, json!({"gpus": [{"name": "Stand-in", "uuid": "GPU-stub-0", "memory_total_mib": 81920, "timeline": [e(0.0, 90), e(0.5, 0)]}]}).to_string()).expect("scenario");
    let mut w = Workload::start(workload(), &["hog", "100,100,60", "8", "3000"], Some(&cg));
    let pid = w.pid().to_string();
    let tracer = Tracer::start_with_env(
        w.pid(),
        &[
            "--quiet",
            "--nvml-lib",
            tests::nvml_stub().to_str().expect("utf-8"),
            "--gpu-interval",
            "250ms",
            "--summary-every",
            "2s",
        ],
        &[
            ("GPUSTALL_NVML_STUB_SCENARIO", scenario.to_str().expect("utf-8")),
            ("GPUSTALL_TEST_TRAINER", &pid),
        ],
    );
    w.go();
    let (code, _) = w.wait(Duration::from_secs(180));
    assert_eq!(code, Some(0));
    let live = tracer.wait(Duration::from_secs(30));
    let record = live.record_path();
    let mode = std::fs::metadata(&record).expect("record").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the recording is private");
    let copy = dir.path("copy.jsonl");
    std::fs::copy(&record, &copy).expect("copy");
    let out = dir.path("replayed.json");
    let (rc, stdout, stderr) = report(&copy, &out);
    assert_eq!(rc, Some(0), "{stderr}");
    let replayed: Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("summary")).expect("json");
    let mut diffs = Vec::new();
    differences(&live.summary, &replayed, "", &mut diffs);
    assert!(
        diffs.is_empty(),
        "the replayed summary differs from the live one:\n{}",
        diffs.join("\n")
    );
    assert!(stdout.contains(live.summary["verdict"]["cause"].as_str().expect("cause")), "{stdout}");
    // The run had something to replay: reclaim, swap, GPU samples and a stall.
    assert!(
        live.summary["stalls"].as_array().is_some_and(|s| !s.is_empty()),
        "{}",
        live.summary["stalls"]
    );
    let swap: u64 = live.processes().iter().map(|p| p["swapout_pages"].as_u64().unwrap_or(0)).sum();
    assert!(swap > 0);
    eprintln!("replayed {} lines; verdict {}", live.record.len(), live.summary["verdict"]["cause"]);

    the_perfetto_trace_draws_each_worker(&dir, &copy, &live);
    the_html_page_is_one_self_contained_file(&dir, &copy, &live);
    a_corrupt_line_is_named_and_the_rest_reported(&dir, &record);
}

#[test]
fn after_kill_9_of_the_agent_every_line_but_the_last_parses() {
    tests::require_privileged_env();
    let mut w = Workload::start(
        workload(),
        &["spawn", "sh", "-c", "for i in $(seq 40); do sleep 0.05 & wait; done"],
        None,
    );
    let tracer = Tracer::start(w.pid(), &["--quiet", "--no-gpu"]);
    let record = tracer.record_path();
    w.go();
    std::thread::sleep(Duration::from_millis(2500));
    let agent = tracer.pid();
    // SAFETY: plain kill of our own child.
    unsafe { libc::kill(agent as i32, libc::SIGKILL) };
    let _ = w.wait(Duration::from_secs(30));
    let text = std::fs::read_to_string(&record).expect("the recording survives");
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    assert!(lines.len() > 10, "it recorded before the kill: {} lines", lines.len());
    for (i, l) in lines.iter().enumerate() {
        let parsed = serde_json::from_str::<Value>(l.trim_end());
        if i + 1 < lines.len() {
            assert!(parsed.is_ok(), "line {} does not parse: {l}", i + 1);
        }
    }
    let dir = tests::TempDir::new("kill9");
    let (rc, stdout, stderr) = report(&record, &dir.path("s.json"));
    drop(tracer);
    assert!(rc == Some(0) || stderr.contains("truncated"), "{rc:?} {stderr}");
    assert!(stdout.contains("== gpustall:"), "{stdout}");
    let forks = text.lines().filter(|l| l.contains("\"kind\":\"fork\"")).count();
    assert!(forks >= 5, "fork events were on disk before the kill: {forks}");
}

/// However the trace is ended (an SSH session that drops sends SIGHUP), it writes everything:
/// the final summary in the recording and the summary file, and exits 0.
#[test]
fn sigint_sigterm_and_sighup_each_end_the_trace_with_everything_written() {
    tests::require_privileged_env();
    for (sig, name) in
        [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM"), (libc::SIGHUP, "SIGHUP")]
    {
        let mut w = Workload::start(workload(), &["spawn", "sleep", "30"], None);
        let tracer = Tracer::start(w.pid(), &["--quiet", "--no-gpu"]);
        w.go();
        std::thread::sleep(Duration::from_millis(1500));
        let asked = std::time::Instant::now();
        let t = tracer.stop_with(sig);
        let took = asked.elapsed();
        assert_eq!(t.code, Some(0), "{name}: exit status; stderr:\n{}", t.stderr);
        assert_eq!(t.summary["final"], true, "{name}: the final summary file");
        let last = t.record.last().expect("a recording");
        assert_eq!(
            (last["type"].as_str(), last["final"].as_bool()),
            (Some("summary"), Some(true)),
            "{name}"
        );
        assert!(took < Duration::from_secs(5), "{name}: took {took:?} to end");
        assert!(t.process(w.pid())["alive"] == true, "{name}: the job is still running");
    }
}
