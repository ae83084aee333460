//! The causes of a stall that are not the memory chain, on real processes: a deadlocked job
//! during a GPU stall, a throttling GPU, a full disk.

use std::time::Duration;

use serde_json::{json, Value};
use tests::procs::{TraceResult, Tracer, Workload};

fn workload() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_BIN_EXE_gpustall-workload"))
}

/// Traces `spawn sleep 8` for 6 s while the stand-in GPU plays `timeline`.
fn sleeping_job_with_gpu(timeline: Value) -> TraceResult {
    tests::require_privileged_env();
    let dir = tests::TempDir::new("other-gpu");
    let scenario = dir.path("scenario.json");
    std::fs::write(&scenario, json!({"gpus": [{"name": "Stand-in", "uuid": "GPU-stub-0", "memory_total_mib": 81920, "timeline": timeline}]}).to_string()).expect("scenario");
    let mut w = Workload::start(workload(), &["spawn", "sleep", "8"], None);
    let pid = w.pid().to_string();
    let tracer = Tracer::start_with_env(
        w.pid(),
        &[
            "--quiet",
            "--duration",
            "6s",
            "--nvml-lib",
            tests::nvml_stub().to_str().expect("utf-8"),
            "--gpu-interval",
            "200ms",
        ],
        &[
            ("GPUSTALL_NVML_STUB_SCENARIO", scenario.to_str().expect("utf-8")),
            ("GPUSTALL_TEST_TRAINER", &pid),
        ],
    );
    w.go();
    tracer.wait(Duration::from_secs(30))
}

fn at(t: f64, util: u32, throttle: &[&str]) -> Value {
    json!({"at_s": t, "util_gpu": util, "temperature_c": 70, "throttle": throttle, "pids": [{"pid": "$GPUSTALL_TEST_TRAINER"}]})
}

#[test]
fn an_idle_job_while_its_gpu_stalls_is_a_deadlock() {
    let t = sleeping_job_with_gpu(json!([at(0.0, 90, &[]), at(0.5, 0, &[])]));
    let v = &t.summary["verdict"];
    eprintln!("deadlock verdict: {v:#}");
    assert_eq!(v["cause"], "deadlock", "{v:#}");
    assert!(v["evidence"].to_string().contains("used no CPU and did no I/O"), "{v}");
}

#[test]
fn a_throttling_gpu_with_no_host_cause_is_gpu_throttling() {
    let t = sleeping_job_with_gpu(json!([at(0.0, 90, &[]), at(0.5, 2, &["hw_thermal_slowdown"])]));
    let v = &t.summary["verdict"];
    eprintln!("throttling verdict: {v:#}");
    assert_eq!(v["cause"], "gpu_throttling", "{v:#}");
    assert!(v["text"].as_str().is_some_and(|s| s.contains("hw_thermal_slowdown")), "{v}");
}

#[test]
fn a_full_filesystem_under_the_job_is_disk_full() {
    tests::require_privileged_env();
    // A 2 MiB tmpfs as the job's working directory, filled up.
    let dir = tests::TempDir::new("full");
    let mnt = dir.path("mnt");
    std::fs::create_dir_all(&mnt).expect("mkdir");
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "gpustall-test", mnt.to_str().expect("utf-8")])
        .status()
        .expect("mount")
        .success();
    assert!(ok, "mounting a tmpfs");
    struct Umount(std::path::PathBuf);
    impl Drop for Umount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _umount = Umount(mnt.clone());
    let _ = std::process::Command::new("dd")
        .args([
            "if=/dev/zero",
            &format!("of={}", mnt.join("fill").display()),
            "bs=64k",
            "status=none",
        ])
        .status();
    let mut w = Workload::start_in(workload(), &["spawn", "sleep", "2"], None, Some(&mnt));
    let tracer = Tracer::start(w.pid(), &["--quiet", "--no-gpu"]);
    w.go();
    let (code, _) = w.wait(Duration::from_secs(30));
    assert_eq!(code, Some(0));
    let t = tracer.wait(Duration::from_secs(30));
    let v = &t.summary["verdict"];
    eprintln!("full disk verdict: {v:#}");
    assert_eq!(v["cause"], "disk_full", "{v:#}");
    assert!(v["text"].as_str().is_some_and(|s| s.contains(mnt.to_str().expect("utf-8"))), "{v}");
}
