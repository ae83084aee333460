//! The syscall a trainer's wait blocked in (`wait_by_syscall`): a wait a worker ends in an
//! ioctl (a device driver's wait, as a blocking CUDA synchronize is) is told apart from a wait
//! for data on a futex, and the verdict does not call the first a wait for data. (A read of a
//! worker's pipe is checked in `offcpu`.) The classic sched_switch program (5.10, no BTF)
//! cannot read the syscall: there every wait is "unknown", and the test says it degraded.

use serde_json::Value;
use tests::procs::{field_u64 as n, trace_trainer_job};

/// `measured` within `tolerance` of what the workload measured itself.
fn close(measured: u64, truth: u64, tolerance: f64, what: &str) {
    let err = measured.abs_diff(truth) as f64 / truth.max(1) as f64;
    eprintln!("{what}: {measured} ns measured, {truth} ns by the workload ({err:.3})");
    assert!(err < tolerance, "{what}: {measured} vs {truth} ns ({err:.3})");
}

/// On a kernel where the class cannot be read: every data wait is unknown, said as degraded.
fn unknown_only(trainer: &Value) {
    tests::degraded(tests::kernel::NO_SYSCALL_CLASS);
    let by = &trainer["wait_by_syscall"];
    assert_eq!(n(&by["unknown"], "data_ns"), n(trainer, "data_wait_ns"), "{by}");
}

#[test]
fn a_wait_in_an_ioctl_that_a_worker_ends_is_a_drivers_not_a_wait_for_data() {
    const WAITS: u64 = 10;
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    let (t, truth) = trace_trainer_job(bin, &["ioctlwait", "150", &WAITS.to_string()]);
    let trainer = t.process(n(&truth, "pid") as u32);
    let worker = t.process(n(&truth, "worker_pid") as u32);
    assert_eq!(trainer["role"], "trainer");
    assert_eq!(worker["role"], "dataloader_worker");
    if !tests::kernel::typed_sched_switch() {
        return unknown_only(trainer);
    }
    // Its waits in the ioctl are what it measured around them, each ended by the worker.
    let by = &trainer["wait_by_syscall"];
    eprintln!("trainer's waits by syscall: {by}");
    let ioctl = &by["ioctl"];
    close(n(ioctl, "ns"), n(&truth, "blocked_ns"), 0.10, "ioctl waits");
    // A block in a driver never joins a wait for data (logical waits), even when a process of
    // the job ended it.
    assert_eq!(n(ioctl, "count"), WAITS, "{by}");
    assert_eq!(n(ioctl, "data_count"), 0, "{by}");
    assert_eq!(n(trainer, "data_wait_ns"), 0, "{trainer}");

    // The verdict calls it a driver's wait, not a wait for data, and blames no worker.
    let verdict = &t.summary["verdict"];
    let evidence = verdict["evidence"].to_string();
    assert!(evidence.contains("waited in a device driver (ioctl)"), "{evidence}");
    assert!(evidence.contains(&format!("{WAITS} waits, never a wait for data")), "{evidence}");
    for said in [evidence.as_str(), verdict["text"].as_str().unwrap_or_default()] {
        assert!(!said.contains("waited for data"), "{said}");
        assert!(!said.contains("kept the trainer waiting"), "{said}");
    }
}

#[test]
fn a_wait_on_a_semaphore_a_worker_releases_is_a_futex_wait_for_data() {
    const WAITS: u64 = 10;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("py/jobs.py");
    let script = script.to_str().expect("utf-8");
    let epochs = WAITS.to_string();
    let args = ["-u", script, "futex", "--epochs", &epochs, "--idle", "0.15", "--wait-go"];
    let (t, truth) = trace_trainer_job(std::path::Path::new("python3"), &args);
    let trainer = t.process(n(&truth, "pid") as u32);
    if !tests::kernel::typed_sched_switch() {
        return unknown_only(trainer);
    }
    // sem_wait sleeps in futex(2); the worker's sem_post ends each wait.
    let by = &trainer["wait_by_syscall"];
    eprintln!("trainer's waits by syscall: {by}");
    let futex = &by["futex"];
    let blocked = n(&truth, "blocked_ns");
    close(n(futex, "data_ns"), blocked, 0.10, "futex waits ended by the worker");
    // The trainer does nothing between two waits: they are one logical wait, or a few.
    assert!((1..=WAITS).contains(&n(futex, "data_count")), "{by}");
    assert!(n(futex, "count") >= WAITS, "every block is counted: {by}");
    let data_wait = n(trainer, "data_wait_ns");
    assert!(n(futex, "data_ns") >= data_wait * 9 / 10, "{by} of {data_wait}");
    assert!(by.get("ioctl").is_none(), "{by}");

    // A wait for data, in a futex, ended by the worker.
    let evidence = t.summary["verdict"]["evidence"].to_string();
    assert!(evidence.contains("waited for data"), "{evidence}");
    assert!(evidence.contains("blocked in a futex"), "{evidence}");
    let keeper = format!("(pid {}) kept the trainer waiting", truth["worker_pid"]);
    assert!(evidence.contains(&keeper), "{evidence}");
}
