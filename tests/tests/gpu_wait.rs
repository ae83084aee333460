//! The trainer's waits for the GPU, on the real kernel: uprobes and uretprobes on the CUDA
//! driver's synchronising calls of a real program (Python through ctypes, real torch
//! DataLoader workers), the driver being the project's stand-in libcuda.so.1 (cuda-stub),
//! which spins in `cuStreamSynchronize` as CUDA's default scheduling does. The job times its
//! own waits; gpustall's figures are checked against them.

use std::process::Command;

use serde_json::Value;

/// `gpustall trace -- python gpu_job.py LIBCUDA SHAPE` with the stub's scenario `stub`: the
/// summary and the job's own timings.
fn trace(dir: &tests::TempDir, shape: &str, stub: &str) -> (Value, Value) {
    let python = tests::torch_python();
    let libcuda = tests::cuda_stub(dir);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("py/gpu_job.py");
    let summary = dir.path("summary.json");
    let o = Command::new(tests::gpustall_bin())
        .args(["trace", "--quiet", "--no-gpu", "--py-stacks", "off", "--summary-json"])
        .arg(&summary)
        .arg("--")
        .arg(&python)
        .arg("-u")
        .arg(&script)
        .arg(&libcuda)
        .arg(shape)
        .env("GPUSTALL_CUDA_STUB", stub)
        .env_remove("SUDO_UID")
        .output()
        .expect("gpustall trace -- gpu_job.py");
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    let job = out
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["role"] == "trainer")
        .expect("the job's timings");
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("JSON");
    (s, job)
}

fn trainer(s: &Value) -> &Value {
    s["processes"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["role"] == "trainer"))
        .expect("the trainer")
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("a number: {v}"))
}

/// Each step spins 40 ms in cuStreamSynchronize; two workers have every sample ready. The job
/// is GPU-bound: the answer says so (not `trainer_bound`, not a data wait), the time in the
/// driver is the job's own measure of it, and the trainer's split adds up to its life.
#[test]
fn a_trainer_spinning_in_cu_stream_synchronize_is_gpu_bound() {
    tests::require_privileged_env();
    let _cpu = tests::cpu_lock();
    let dir = tests::TempDir::new("gpu-bound");
    let (s, job) = trace(&dir, "gpu", "spin:40");
    let v = &s["verdict"];
    eprintln!("verdict: {v:#}\njob: {job}");
    let t = trainer(&s);
    eprintln!("gpu_wait: {:#}\ntime_split: {:#}", t["gpu_wait"], t["time_split"]);
    assert_eq!(v["cause"], "gpu_bound", "{v:#}");
    assert_eq!(v["culprit_pids"][0], t["pid"], "{v:#}");
    let g = &t["gpu_wait"];
    assert!(g["library"].as_str().is_some_and(|l| l.ends_with("/libcuda.so.1")), "{g:#}");
    assert!(g["symbols"].as_array().is_some_and(|s| s.iter().any(|s| s == "cuStreamSynchronize")));
    assert_eq!(g["calls"], job["steps"], "one call a step: {g:#}");
    let (measured, own) = (f(&g["wait_ns"]) / 1e9, f(&job["sync_s"]));
    eprintln!("time in cuStreamSynchronize: gpustall {measured:.3} s, the job {own:.3} s");
    assert!((measured - own).abs() <= 0.05 * own, "{measured} against {own}");
    // The stub spins (yielding): nearly all of it on a CPU.
    assert!(f(&g["on_cpu_ns"]) >= 0.7 * f(&g["wait_ns"]), "{g:#}");
    let share = f(&t["time_split"]["measured_share"]);
    assert!((0.95..=1.05).contains(&share), "data + GPU + own CPU = {share:.3} of its life");
}

/// One worker burns 60 ms of CPU a sample and each step syncs for 5 ms: the trainer waits for
/// data, and the answer stays the input pipeline's, with the short GPU waits measured beside.
#[test]
fn a_data_starved_trainer_keeps_its_data_wait_verdict_with_its_gpu_waits_measured() {
    tests::require_privileged_env();
    let _cpu = tests::cpu_lock();
    let dir = tests::TempDir::new("gpu-starved");
    let (s, job) = trace(&dir, "data", "spin:5");
    let v = &s["verdict"];
    eprintln!("verdict: {v:#}\njob: {job}");
    let t = trainer(&s);
    eprintln!("gpu_wait: {:#}\ntime_split: {:#}", t["gpu_wait"], t["time_split"]);
    assert_eq!(v["cause"], "cpu_bound_pipeline", "{v:#}");
    let g = &t["gpu_wait"];
    assert_eq!(g["calls"], job["steps"], "{g:#}");
    let (measured, own) = (f(&g["wait_ns"]) / 1e9, f(&job["sync_s"]));
    assert!((measured - own).abs() <= 0.05 * own + 0.02, "{measured} against {own}");
    let split = &t["time_split"];
    assert!(f(&split["data_wait_ns"]) > 5.0 * f(&split["gpu_wait_ns"]), "{split:#}");
}

/// The uprobe path alone, with no Python (so that it runs on every kernel of the VM matrix): a
/// trainer process loads the stand-in driver with dlopen and makes 60 calls of 20 ms each into
/// `cuStreamSynchronize`, half spinning and half asleep; gpustall times each call as the
/// process does.
#[test]
fn the_cuda_drivers_synchronising_calls_are_timed_by_uprobes() {
    tests::require_privileged_env();
    let _cpu = tests::cpu_lock();
    let dir = tests::TempDir::new("gpu-uprobes");
    let libcuda = tests::cuda_stub(&dir);
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    for stub in ["spin:20", "sleep:20"] {
        let comm = tests::procs::unique_comm();
        let args = ["cudasync", libcuda.to_str().expect("utf-8"), "30"];
        let env = [("GPUSTALL_CUDA_STUB", stub)];
        let mut w = tests::procs::Workload::start_env(&comm, bin, &args, None, None, &env);
        let tracer = tests::procs::Tracer::start(w.pid(), &["--quiet", "--no-gpu"]);
        w.go();
        let (code, lines) = w.wait(std::time::Duration::from_secs(60));
        assert_eq!(code, Some(0), "{lines:?}");
        let t = tracer.wait(std::time::Duration::from_secs(30));
        assert_eq!(t.code, Some(0), "{}", t.stderr);
        let truth = lines.iter().find(|l| l["role"] == "trainer").expect("the trainer's line");
        let p = t.process(truth["pid"].as_u64().expect("pid") as u32);
        assert_eq!(p["role"], "trainer", "{p:#}");
        let g = &p["gpu_wait"];
        eprintln!("{stub}: gpu_wait {g}; the workload's {truth}");
        assert!(g.is_object(), "not measured: {}", p["gpu_wait_unmeasured"]);
        assert_eq!(g["calls"], 30, "{g:#}");
        let (measured, own) = (f(&g["wait_ns"]), f(&truth["sync_ns"]));
        assert!((measured - own).abs() <= 0.05 * own, "{measured} ns against {own} ns");
        // Spinning is on a CPU, sleeping is not (where the kernel's task layout is known).
        if let Some(on_cpu) = g["on_cpu_ns"].as_f64() {
            let share = on_cpu / measured;
            if stub.starts_with("spin") {
                assert!(share > 0.5, "{stub}: {share:.2} of it on a CPU");
            } else {
                assert!(share < 0.2, "{stub}: {share:.2} of it on a CPU");
            }
        }
    }
}

/// A job that maps no CUDA driver: its trainer's GPU waits are said to be unmeasured, and why.
#[test]
fn a_cpu_only_trainers_gpu_waits_are_said_to_be_unmeasured() {
    tests::require_privileged_env();
    // Its torch import beside the other tests' spinning trainers would take their CPU.
    let _cpu = tests::cpu_lock();
    let dir = tests::TempDir::new("gpu-none");
    let summary = dir.path("summary.json");
    let python = tests::torch_python();
    let o = Command::new(tests::gpustall_bin())
        .args(["trace", "--quiet", "--no-gpu", "--py-stacks", "off", "--summary-json"])
        .arg(&summary)
        .arg("--")
        .arg(&python)
        .args([
            "-c",
            "import torch.utils.data as d\nfor _ in d.DataLoader(range(40), num_workers=1): pass",
        ])
        .output()
        .expect("gpustall trace -- python");
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("JSON");
    let t = trainer(&s);
    assert!(t["gpu_wait"].is_null(), "{t:#}");
    let why = t["gpu_wait_unmeasured"].as_str().unwrap_or_default();
    assert!(why.contains("no CUDA driver"), "{why}");
}
