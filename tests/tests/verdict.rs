//! The verdict on real workloads: the memory chain, a disk-bound pipeline, a hung trainer, and
//! a GPU stall (stand-in NVML) that coincides with the memory chain.

use std::time::Duration;

use serde_json::{json, Value};
use tests::{
    cgroup::MemCgroup,
    kernel::SwapFile,
    procs::{Tracer, Workload},
};

fn workload() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_BIN_EXE_gpustall-workload"))
}

#[test]
fn cold_direct_reads_with_plenty_of_memory_are_disk_bound() {
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    let dir =
        std::path::PathBuf::from(format!("/var/tmp/gpustall-diskbound-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    struct Rm(std::path::PathBuf);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _rm = Rm(dir.clone());
    let data = dir.join("data");
    let made = std::process::Command::new("dd")
        .args([
            "if=/dev/urandom",
            &format!("of={}", data.display()),
            "bs=1M",
            "count=256",
            "status=none",
        ])
        .status()
        .expect("dd");
    assert!(made.success());
    let input = format!("if={}", data.display());
    // O_DIRECT, small blocks, queue depth 1: the reader waits on the disk all the time.
    let mut w = Workload::start(
        workload(),
        &["spawn", "dd", &input, "of=/dev/null", "bs=16k", "iflag=direct", "status=none"],
        None,
    );
    let tracer = Tracer::start(w.pid(), &["--quiet", "--no-gpu"]);
    w.go();
    let (code, _) = w.wait(Duration::from_secs(120));
    assert_eq!(code, Some(0));
    let t = tracer.wait(Duration::from_secs(30));
    let v = &t.summary["verdict"];
    eprintln!("disk-bound verdict: {v:#}");
    let reader = t.processes().iter().find(|p| p["comm"] == "dd").expect("dd traced");
    assert!(reader["block_read_bytes"].as_u64() >= Some(256 << 20), "{reader}");
    let latency = &reader["io_by_device"][0]["avg_latency_us"];
    assert!(latency.as_f64().is_some_and(|l| l > 0.0), "request latency measured: {reader}");
    if tests::kernel::in_vm_test() && v["cause"] != "disk_io_bound" {
        // Under software emulation dd's own CPU time (each syscall emulated) can outweigh its
        // wait on the virtual disk: the figures above are the kernel-dependent part.
        tests::degraded(&format!("emulated CPU: verdict {} on a cold O_DIRECT reader", v["cause"]));
        return;
    }
    assert_eq!(v["cause"], "disk_io_bound", "{v:#}");
    assert_eq!(v["culprit_pids"][0], reader["pid"]);
    assert!(
        v["evidence"].as_array().is_some_and(|e| e
            .iter()
            .any(|l| l.as_str().is_some_and(|s| s.contains("no memory pressure")))),
        "{v}"
    );
}

#[test]
fn a_stopped_trainer_is_hung() {
    tests::require_privileged_env();
    let mut w = Workload::start(workload(), &["spawn", "sleep", "30"], None);
    let tracer = Tracer::start(w.pid(), &["--quiet", "--no-gpu", "--duration", "6s"]);
    w.go();
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: plain kill of our own child.
    unsafe { libc::kill(w.pid() as i32, libc::SIGSTOP) };
    let t = tracer.wait(Duration::from_secs(30));
    // SAFETY: as above; the Workload guard kills it afterwards.
    unsafe { libc::kill(w.pid() as i32, libc::SIGCONT) };
    let v = &t.summary["verdict"];
    eprintln!("hung verdict: {v:#}");
    assert_eq!(v["cause"], "process_hung", "{v:#}");
    assert_eq!(v["culprit_pids"][0], w.pid());
    assert!(v["evidence"][0].as_str().is_some_and(|e| e.contains("stopped (T)")), "{v}");
}

#[test]
fn gpu_stall_during_the_memory_chain_is_linked_in_the_evidence() {
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    let _swap = SwapFile::ensure(1024);
    let cg = MemCgroup::new("verdict-gpu", 128, true);
    let dir = tests::TempDir::new("verdict-gpu");
    let scenario = dir.path("scenario.json");
    let entry = |at: f64, util: u32| json!({"at_s": at, "util_gpu": util, "temperature_c": 60, "pids": [{"pid": "$GPUSTALL_TEST_TRAINER"}]});
    let doc = json!({"gpus": [{"name": "Stand-in", "uuid": "GPU-stub-0", "memory_total_mib": 81920, "timeline": [entry(0.0, 95), entry(0.5, 0)]}]});
    std::fs::write(&scenario, doc.to_string()).expect("scenario");
    let mut w = Workload::start(workload(), &["hog", "100,100,100", "8", "5000"], Some(&cg));
    let pid = w.pid().to_string();
    let tracer = Tracer::start_with_env(
        w.pid(),
        &[
            "--quiet",
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
    let (code, _) = w.wait(Duration::from_secs(180));
    assert_eq!(code, Some(0));
    let t = tracer.wait(Duration::from_secs(30));
    let v = &t.summary["verdict"];
    eprintln!("memory + GPU verdict: {v:#}");
    assert_eq!(v["cause"], "host_memory_pressure", "{v:#}");
    let evidence: Vec<&str> =
        v["evidence"].as_array().expect("evidence").iter().filter_map(|e| e.as_str()).collect();
    assert!(evidence.iter().any(|e| e.contains("GPU 0 idle")), "{evidence:#?}");
    assert!(evidence.iter().any(|e| e.contains("reclaim began")), "{evidence:#?}");
    assert!(evidence.iter().any(|e| e.contains("swapped out")), "{evidence:#?}");
    assert!(v["text"].as_str().is_some_and(|s| s.contains("GPU 0 sat idle")), "{v}");
    assert!(
        v["advice"].as_array().is_some_and(|a| a
            .iter()
            .any(|l| l.as_str().is_some_and(|s| s.contains("num_workers=3")))),
        "{v}"
    );
}

#[test]
fn the_bundled_dataloader_workload_is_the_host_memory_chain() {
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    let _swap = SwapFile::ensure(1024);
    // 256 MiB of memory and 128 MiB of swap: reclaim, swap-out, then the OOM killer.
    let cg = MemCgroup::with_swap_limit("verdict-demo", 256, 128);
    let dir = tests::TempDir::new("verdict-demo");
    let log = dir.path("train.log");
    std::fs::write(&log, "").expect("log");
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../demo/dataloader_blowup.py");
    let (data, log_s) = (dir.path("data"), log.to_str().expect("utf-8").to_string());
    let args = [
        "-u",
        script.to_str().expect("utf-8"),
        "--wait-go",
        "--data-dir",
        data.to_str().expect("utf-8"),
        "--log",
        &log_s,
        "--workers",
        "3",
        "--cache-mib-per-batch",
        "4",
        "--steps",
        "2000",
        "--step-ms",
        "20",
    ];
    let mut w = Workload::start(std::path::Path::new("python3"), &args, Some(&cg));
    let tracer = Tracer::start(w.pid(), &["--quiet", "--no-gpu", "--log", &log_s]);
    w.go();
    let (code, lines) = w.wait(Duration::from_secs(180));
    assert_eq!(code, Some(1), "the trainer fails when the OOM killer takes a worker");
    let t = tracer.wait(Duration::from_secs(30));
    let v = &t.summary["verdict"];
    eprintln!("bundled workload verdict: {v:#}");
    assert_eq!(v["cause"], "host_memory_oom", "{v:#}");
    let victim = t.summary["oom_kills"][0]["victim_pid"].as_u64().expect("an OOM kill");
    let culprits: Vec<u64> =
        v["culprit_pids"].as_array().expect("culprits").iter().filter_map(Value::as_u64).collect();
    assert!(culprits.contains(&victim), "the victim is named: {culprits:?}");
    // Culprits by what they did to the pressure: a worker that grew comes first.
    assert_eq!(t.process(culprits[0] as u32)["role"], "dataloader_worker", "{culprits:?}");
    let workers: Vec<u64> =
        lines.iter().filter(|l| l["role"] == "worker").filter_map(|l| l["pid"].as_u64()).collect();
    assert!(workers.contains(&victim), "the victim is a DataLoader worker: {workers:?}");
    assert_eq!(t.process(victim as u32)["role"], "dataloader_worker");
    let evidence = v["evidence"].to_string();
    assert!(evidence.contains("reclaim began"), "reclaim figures: {evidence}");
    assert!(evidence.contains("swapped out"), "swap figures: {evidence}");
    assert!(evidence.contains("grew from"), "worker growth: {evidence}");
    assert!(
        t.summary["context"]["train_steps"].as_u64() > Some(10),
        "the training log was read: {}",
        t.summary["context"]
    );
    the_worker_that_kept_the_trainer_waiting_is_named(&t, v, &workers);
    the_trainers_data_wait_is_the_logs_data_time(&t, &log, &lines);
    its_recording_replays_to_the_same_steps_and_verdict(&t);
}

/// `gpustall report` on the demo workload's recording says what the live trace said: the same
/// training steps (two steps read in one batch with equal times are two records, not a
/// duplicated line), the same verdict, and no line skipped.
fn its_recording_replays_to_the_same_steps_and_verdict(t: &tests::procs::TraceResult) {
    let (replayed, stderr) = t.replayed();
    assert!(!stderr.contains("skipped"), "nothing skipped on replay: {stderr}");
    let steps = |s: &Value| s["context"]["train_steps"].as_u64();
    assert_eq!(steps(&replayed), steps(&t.summary), "the same training steps");
    let verdict = |s: &Value| (s["verdict"]["cause"].clone(), s["verdict"]["culprit_pids"].clone());
    assert_eq!(verdict(&replayed), verdict(&t.summary), "the same verdict");
}

/// The demo's trainer polls its worker's pipe in 100 ms slices (its `receive`) and sleeps
/// `--step-ms` per step (the GPU's share); the log's data_time is the time around `receive`.
/// gpustall's data wait for the trainer is one wait per batch however many poll timeouts it
/// spans, and none of the step's sleep: the sum of the logged data_time within 10 %. (The
/// last wait, for the batch of the worker the OOM killer took, is not in the log: the trainer
/// fails instead of logging the step.)
fn the_trainers_data_wait_is_the_logs_data_time(
    t: &tests::procs::TraceResult,
    log: &std::path::Path,
    lines: &[Value],
) {
    let text = std::fs::read_to_string(log).expect("the training log");
    let logged: Vec<f64> = text
        .lines()
        .filter_map(|l| l.split("data_time: ").nth(1))
        .filter_map(|r| r.split_whitespace().next()?.parse().ok())
        .collect();
    let data_time = (logged.iter().sum::<f64>() * 1e9) as u64;
    let trainer = t.processes().iter().find(|p| p["role"] == "trainer").expect("the trainer");
    let data_wait = trainer["data_wait_ns"].as_u64().unwrap_or(0);
    let kept: Vec<String> = t
        .processes()
        .iter()
        .filter(|p| p["role"] == "dataloader_worker")
        .map(|p| format!("{}: {}", p["pid"], p["kept_waiting_ns"].as_u64().unwrap_or(0)))
        .collect();
    let unended = trainer["unended_wait_ns"].as_u64().unwrap_or(0);
    let failed = lines.iter().find_map(|l| l["failed_receive_waited_ns"].as_u64()).unwrap_or(0);
    eprintln!(
        "bundled workload: data_time {data_time} ns over {} logged steps (the first {:.0} ns), data_wait_ns {data_wait} in {} waits (ratio {:.3}); kept_waiting {}; the trainer's unended waits {unended} ns in {}, the failed step waited {failed} ns; reclaim {} + {} ns, uninterruptible {} ns",
        logged.len(),
        logged.first().unwrap_or(&0.0) * 1e9,
        trainer["data_wait_count"],
        data_wait as f64 / data_time as f64,
        kept.join(", "),
        trainer["unended_wait_count"],
        trainer["direct_reclaim_ns"],
        trainer["memcg_reclaim_ns"],
        trainer["offcpu_io_ns"],
    );
    let err = data_wait.abs_diff(data_time) as f64 / data_time as f64;
    // A batch written while the trainer, just woken by its poll's timeout, waits for a CPU wakes
    // nothing (it is awake already): the kernel cannot tell who ended that wait, and gpustall
    // shows it apart, as a wait no process of the job ended. The demo's first batch comes about
    // when its first 100 ms poll runs out, so that happens in about one run in three; where it
    // did, the log's time is the data wait and those waits together. The failed step's wait
    // (for a batch of the worker the OOM killer took, or of another while that one died) is in
    // one or the other and not in the log: the trainer fails instead of logging the step.
    let all_logged = (data_wait + unended).saturating_sub(failed);
    let all_err = all_logged.abs_diff(data_time) as f64 / data_time as f64;
    if err >= 0.10 && all_err < 0.10 {
        eprintln!(
            "bundled workload: waits a timeout ended ({unended} ns) make up the rest of its data_time, less the failed step's ({failed} ns)"
        );
        return;
    }
    if tests::kernel::in_vm_test() && err >= 0.10 {
        // Under software emulation the trainer's every Python turn takes ten times as long and
        // its own reclaim stalls (inside its receive, before it waits) dominate data_time: the
        // measured waits are the kernel-dependent part, checked against the log on real CPUs.
        assert!(data_wait > 0, "no wait for data measured at all");
        tests::degraded(&format!(
            "emulated CPU: data_wait_ns {data_wait} against the log's data_time {data_time} ns"
        ));
        return;
    }
    assert!(
        err < 0.10,
        "data_wait_ns {data_wait} against the log's data_time {data_time} ns ({} steps): off by {:.0} %",
        logged.len(),
        err * 100.0
    );
}

/// The demo's trainer waits on its workers' pipes (its poll in `receive`); the kernel charges
/// those waits to the worker whose send ended them. The verdict names the worker that ended
/// most of them, and it is one of the demo's workers. (That the trainer's data_wait_ns is the
/// log's data_time: `the_trainers_data_wait_is_the_logs_data_time`.)
fn the_worker_that_kept_the_trainer_waiting_is_named(
    t: &tests::procs::TraceResult,
    v: &Value,
    workers: &[u64],
) {
    let trainer = t.processes().iter().find(|p| p["role"] == "trainer").expect("the trainer");
    assert!(trainer["data_wait_ns"].as_u64() > Some(0), "the trainer waited for data: {trainer}");
    let kept = |p: &Value| p["kept_waiting_ns"].as_u64().unwrap_or(0);
    let top = t
        .processes()
        .iter()
        .filter(|p| p["role"] == "dataloader_worker")
        .max_by_key(|p| (kept(p), std::cmp::Reverse(p["pid"].as_u64())))
        .expect("workers");
    assert!(kept(top) > 0, "a worker kept the trainer waiting: {top}");
    let pid = top["pid"].as_u64().expect("pid");
    assert!(workers.contains(&pid), "{pid} is one of the demo's workers {workers:?}");
    let named = format!("(pid {pid})");
    let text = v["text"].as_str().unwrap_or("");
    // The text speaks of it when the trainer waited at least 10 % of its time: a share that
    // moves with the machine's speed (under emulation the trainer's own steps take longer).
    if text.contains("waited for data") {
        assert!(text.contains("of it for DataLoader worker"), "whom it waited for: {text}");
        let clause = &text[text.find("waited for data").unwrap_or(0)..];
        assert!(clause.contains(&named), "the text names worker {pid}: {text}");
    }
    let evidence: Vec<&str> =
        v["evidence"].as_array().expect("evidence").iter().filter_map(Value::as_str).collect();
    assert!(
        evidence.iter().any(|e| e.contains(&named) && e.contains("kept the trainer waiting")),
        "the evidence says worker {pid} kept the trainer waiting: {evidence:#?}"
    );
}
