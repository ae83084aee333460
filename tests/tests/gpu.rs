//! The GPU side through the real nvml-wrapper and the project's stand-in libnvidia-ml.so.1:
//! stall episodes on the kernel events' timeline, throttling as evidence, compute processes
//! tied to traced pids, and a clean run with no NVML at all.

use std::time::Duration;

use serde_json::{json, Value};
use tests::procs::{TraceResult, Tracer, Workload};

const INTERVAL_MS: u64 = 200;

/// Traces a `sleep SECS` child of a workload while the stub plays `timeline` for GPU 0.
fn trace_with_scenario(timeline: Value, secs: &str) -> (u32, TraceResult) {
    tests::require_privileged_env();
    let dir = tests::TempDir::new("gpu");
    let scenario = dir.path("scenario.json");
    let doc = json!({"driver_version": "550.54.15", "gpus": [{"name": "Stand-in H200", "uuid": "GPU-stub-0", "pci_bus_id": "0000:3b:00.0", "memory_total_mib": 143771, "timeline": timeline}]});
    std::fs::write(&scenario, doc.to_string()).expect("scenario");
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    // As a launcher starts rank 3 of a job: its identity says so (RANK in its environment).
    let comm = tests::procs::unique_comm();
    let args = ["spawn", "sleep", secs];
    let mut w = Workload::start_env(&comm, bin, &args, None, None, &[("RANK", "3")]);
    let trainer = w.pid().to_string();
    let stub = tests::nvml_stub();
    let tracer = Tracer::start_with_env(
        w.pid(),
        &[
            "--quiet",
            "--nvml-lib",
            stub.to_str().expect("utf-8"),
            "--gpu-interval",
            &format!("{INTERVAL_MS}ms"),
        ],
        &[
            ("GPUSTALL_NVML_STUB_SCENARIO", scenario.to_str().expect("utf-8")),
            ("GPUSTALL_TEST_TRAINER", &trainer),
        ],
    );
    w.go();
    let (code, _) = w.wait(Duration::from_secs(60));
    assert_eq!(code, Some(0));
    let t = tracer.wait(Duration::from_secs(30));
    assert_eq!(t.code, Some(0), "{}", t.stderr);
    (w_pid(&trainer), t)
}

fn w_pid(s: &str) -> u32 {
    s.parse().expect("pid")
}

fn busy(at: f64, util: u32) -> Value {
    json!({"at_s": at, "util_gpu": util, "util_mem": 30, "memory_used_mib": 60000, "temperature_c": 60,
           "sm_clock_mhz": 1980, "power_w": 600, "throttle": [], "pids": [{"pid": "$GPUSTALL_TEST_TRAINER", "used_mib": 50000}]})
}

/// The first GPU sample's time: the stub's clock starts at gpustall's nvmlInit, just before.
fn first_gpu_sample_ns(t: &TraceResult) -> u64 {
    t.record
        .iter()
        .find(|r| r["kind"] == "gpu")
        .and_then(|r| r["t_ns"].as_u64())
        .expect("a GPU sample in the recording")
}

#[test]
fn one_stall_with_its_bounds_throttling_and_ranks() {
    let mut stalled = busy(2.0, 0);
    stalled["temperature_c"] = json!(90);
    stalled["throttle"] = json!(["hw_thermal_slowdown", "gpu_idle"]);
    let (trainer, t) = trace_with_scenario(json!([busy(0.0, 95), stalled, busy(8.0, 90)]), "10");
    let stalls = t.summary["stalls"].as_array().expect("stalls");
    assert_eq!(stalls.len(), 1, "exactly one stall: {stalls:#?}");
    let s = &stalls[0];
    let origin = first_gpu_sample_ns(&t);
    let start_s = (s["start_ns"].as_u64().expect("start") - origin) as f64 / 1e9;
    let end_s = (s["end_ns"].as_u64().expect("end") - origin) as f64 / 1e9;
    eprintln!("stall: {start_s:.3} s .. {end_s:.3} s after the first sample: {s}");
    let slack = INTERVAL_MS as f64 / 1e3 + 0.1; // one sample interval, plus the init-to-sample gap
    assert!((start_s - 2.0).abs() <= slack, "stall start {start_s:.3} s, expected 2 s");
    assert!((end_s - 8.0).abs() <= slack, "stall end {end_s:.3} s, expected 8 s");
    assert_eq!(s["throttle_reasons"], json!(["hw_thermal_slowdown"]), "gpu_idle is not a slowdown");
    assert_eq!(s["max_temperature_c"], 90);
    assert_eq!(s["pids"], json!([trainer]), "the GPU's compute process is the traced trainer");
    assert_eq!(s["attribution"], "process_list");
    // The stall is told by the rank that held the GPU, as NVML listed it.
    let v = &t.summary["verdict"];
    let told = "GPU 0 idle (<= threshold) for";
    let link = v["evidence"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find(|e| e.contains(told));
    assert!(
        link.is_some_and(|l| l.contains(&format!("while rank 3 (pid {trainer}) held it"))),
        "{v:#}"
    );
    let gpu = &t.summary["gpu"][0];
    assert_eq!(gpu["job_pids"], json!([trainer]));
    assert_eq!(gpu["uuid"], "GPU-stub-0");
    assert!(t.record.iter().any(|r| r["kind"] == "gpu_stall"), "the episode is in the recording");
    assert!(
        t.summary["gpu_status"].as_str().is_some_and(|s| s.contains("550.54.15")),
        "{}",
        t.summary["gpu_status"]
    );
}

#[test]
fn a_dip_shorter_than_the_window_is_no_stall() {
    let (_, t) = trace_with_scenario(json!([busy(0.0, 95), busy(2.0, 0), busy(3.0, 90)]), "5");
    assert_eq!(t.summary["stalls"], json!([]), "a 1 s dip under a 3 s window");
    assert!(
        t.summary["gpu"][0]["util_gpu_min_pct"] == 0,
        "the dip was sampled: {}",
        t.summary["gpu"]
    );
}

#[test]
fn no_nvml_is_one_notice_and_the_kernel_side_still_works() {
    tests::require_privileged_env();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    let mut w = Workload::start(bin, &["tree"], None);
    let tracer =
        Tracer::start(w.pid(), &["--quiet", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"]);
    w.go();
    let (code, _) = w.wait(Duration::from_secs(30));
    assert_eq!(code, Some(0));
    let t = tracer.wait(Duration::from_secs(30));
    assert_eq!(t.code, Some(0), "{}", t.stderr);
    let notices: Vec<&str> = t.stderr.lines().filter(|l| l.contains("GPU data is off")).collect();
    assert_eq!(notices.len(), 1, "one notice: {}", t.stderr);
    assert!(notices[0].contains("no NVIDIA driver"), "{}", notices[0]);
    assert!(t.summary["gpu"].is_null());
    assert_eq!(
        t.processes().len(),
        4,
        "the kernel side traced the whole tree: {:#?}",
        t.processes()
    );
}

/// A GPU fault NVML reports (its critical Xid event) while the GPU stalls: the verdict is the
/// fault, read through NVML (no driver line in the kernel log here), with what it means.
#[test]
fn an_xid_the_gpu_raises_through_nvml_is_a_gpu_fault() {
    let mut fault = busy(1.0, 0);
    fault["xid"] = json!(79);
    let (_, t) = trace_with_scenario(json!([busy(0.0, 95), fault]), "4");
    let v = &t.summary["verdict"];
    assert_eq!(v["cause"], "gpu_fault", "{v:#}");
    let text = v["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("The GPU 0 (GPU-stub-0, PCI 0000:3b:00) reported Xid 79 through NVML"),
        "{text}"
    );
    assert!(text.contains("fallen off the bus"), "{text}");
    // Once, on the sample after it was raised.
    let xids: Vec<&Value> = t
        .record
        .iter()
        .filter(|r| r["kind"] == "gpu")
        .flat_map(|r| r["gpus"].as_array().into_iter().flatten())
        .flat_map(|g| g["xids"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(xids, vec![&json!(79)], "the Xid in the recording's GPU samples");
}
