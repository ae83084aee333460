//! Off-CPU accounting from sched_switch / sched_waking: a trainer fed over pipes by a slow and
//! a fast worker. The trainer's wait for data (its blocks that a worker's write ended) must
//! match the time it measured inside its own blocking reads, and be charged to the slow worker;
//! a trainer that computes while its workers keep up shows little wait.

use std::time::Duration;

use serde_json::Value;
use tests::procs::{field_u64 as n, trace_trainer_job, TraceResult, Tracer, Workload};

/// Runs `feed SLOW_MS FAST_MS BATCHES BUSY_MS` under the tracer; returns the tracer's result
/// and the trainer's own line (the truth it measured).
fn feed(args: &[&str]) -> (TraceResult, Value) {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    let mut argv = vec!["feed"];
    argv.extend_from_slice(args);
    trace_trainer_job(bin, &argv)
}

#[test]
fn the_slow_worker_kept_the_trainer_waiting_as_long_as_it_blocked() {
    const BATCHES: u64 = 12;
    // The trainer computes 20 ms per batch: with nothing done between two reads, its waits for
    // consecutive batches would be one logical wait (it never stopped waiting for data); 20 ms
    // of wall time is well over the 1 ms of CPU that ends a wait even on a loaded machine.
    let (t, truth) = feed(&["80", "0", &BATCHES.to_string(), "20"]);
    let pid = |f: &str| n(&truth, f) as u32;
    let trainer = t.process(pid("pid"));
    let (slow, fast) = (t.process(pid("slow_pid")), t.process(pid("fast_pid")));
    assert_eq!(trainer["role"], "trainer");
    assert_eq!(slow["role"], "dataloader_worker");

    // The trainer's data wait is the time it spent blocked in its reads, within 10 %.
    let data_wait = n(trainer, "data_wait_ns");
    let blocked = n(&truth, "blocked_ns");
    let err = data_wait.abs_diff(blocked) as f64 / blocked as f64;
    assert!(err < 0.10, "data_wait_ns {data_wait} vs {blocked} ns blocked in reads ({err:.3})");

    // The slow worker ended nearly all of it, one wait per batch (each of its writes woke a
    // blocked read); the fast one almost none.
    let (kept_slow, kept_fast) = (n(slow, "kept_waiting_ns"), n(fast, "kept_waiting_ns"));
    assert!(kept_slow >= data_wait * 9 / 10, "slow {kept_slow} of {data_wait}");
    assert!(kept_fast < data_wait / 10, "fast {kept_fast} of {data_wait}");
    assert_eq!(kept_slow + kept_fast, data_wait, "every data wait has its worker");
    assert_eq!(n(slow, "kept_waiting_count"), BATCHES, "{slow}");
    assert!(n(slow, "kept_waiting_p99_ns") <= n(slow, "kept_waiting_max_ns"));
    // Against the kernel's own count: the trainer's blocks ended by a worker are among its
    // voluntary context switches (getrusage).
    let blocks = n(trainer, "data_wait_count");
    assert!(blocks <= n(&truth, "nvcsw"), "{blocks} waits, {} voluntary switches", truth["nvcsw"]);
    // A trainer's wait is no worker's off-CPU time, and the workers wait on nothing of the
    // trainer's (they are not data waiters).
    assert!(n(trainer, "offcpu_wait_ns") >= data_wait);
    assert!(slow.get("data_wait_ns").is_none(), "{slow}");

    waits_were_in_reads(trainer, data_wait, blocked);

    // The verdict names the worker that kept the trainer waiting, with no training log.
    let evidence = t.summary["verdict"]["evidence"].to_string();
    let slow_pid = format!("(pid {}) kept the trainer waiting", slow["pid"]);
    assert!(evidence.contains(&slow_pid), "{evidence}");

    let waits = each_wait_is_a_record(&t, trainer, slow, BATCHES, kept_slow);
    perfetto_draws_each_wait(&t, trainer, slow, BATCHES, waits.len());
    replays_to_the_same_figures(&t, trainer, slow);
}

/// Each of the trainer's waits blocked in read(2) on a worker's pipe: the syscall class says so.
fn waits_were_in_reads(trainer: &Value, data_wait: u64, blocked: u64) {
    let by_syscall = &trainer["wait_by_syscall"];
    eprintln!("trainer's waits by syscall: {by_syscall}");
    if tests::kernel::typed_sched_switch() {
        let read = &by_syscall["read"];
        assert_eq!(n(read, "data_ns"), data_wait, "every data wait was in a read: {by_syscall}");
        let err = n(read, "ns").abs_diff(blocked) as f64 / blocked as f64;
        assert!(err < 0.10, "read waits {} ns vs {blocked} ns blocked in reads", read["ns"]);
    } else {
        tests::degraded(tests::kernel::NO_SYSCALL_CLASS);
        assert_eq!(n(&by_syscall["unknown"], "data_ns"), data_wait, "{by_syscall}");
    }
}

/// Each wait for a batch (over the 10 ms threshold) came as a record of its own, ended by the
/// slow worker: as many as it ended, summing to exactly what the kernel summed. Returns them.
fn each_wait_is_a_record(
    t: &TraceResult,
    trainer: &Value,
    slow: &Value,
    batches: u64,
    kept_slow: u64,
) -> Vec<Value> {
    let waits: Vec<Value> = std::fs::read_to_string(t.record_path())
        .expect("the recording")
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["kind"] == "data_wait")
        .collect();
    let from_slow: Vec<&Value> = waits.iter().filter(|w| w["pid"] == slow["pid"]).collect();
    assert_eq!(from_slow.len() as u64, batches, "{waits:?}");
    let sum: u64 = from_slow.iter().map(|w| n(w, "duration_ns")).sum();
    assert_eq!(sum, kept_slow, "the records' waits against the kernel's sum");
    assert!(from_slow.iter().all(|w| w["wakee_pid"] == trainer["pid"]));
    let long = &slow["long_waits"];
    assert_eq!((n(long, "count"), n(long, "ns")), (batches, kept_slow), "{slow}");
    assert_eq!(n(long, "in_reclaim_ns"), 0, "the slow worker slept, it did not reclaim");

    waits
}

/// In Perfetto: a slice per wait on the trainer, an arrow from the worker to each.
fn perfetto_draws_each_wait(
    t: &TraceResult,
    trainer: &Value,
    slow: &Value,
    batches: u64,
    waits: usize,
) {
    let trace_path = t.record_path().with_file_name("trace.json");
    let ok = std::process::Command::new(tests::gpustall_bin())
        .arg("export")
        .arg("--perfetto")
        .arg(&trace_path)
        .arg(t.record_path())
        .stdout(std::process::Stdio::null())
        .status()
        .expect("gpustall export");
    assert!(ok.success());
    let trace: Value =
        serde_json::from_str(&std::fs::read_to_string(&trace_path).expect("trace")).expect("json");
    let ev = trace["traceEvents"].as_array().expect("events");
    let slices =
        ev.iter().filter(|e| e["name"] == "waiting for data" && e["pid"] == trainer["pid"]);
    let slices: Vec<&Value> = slices.collect();
    assert_eq!(slices.len() as u64, waits as u64);
    if tests::kernel::typed_sched_switch() {
        assert!(slices.iter().all(|s| s["args"]["syscall"] == "read"), "{slices:?}");
    }
    let arrows = ev.iter().filter(|e| e["ph"] == "s" && e["pid"] == slow["pid"]).count();
    assert_eq!(arrows as u64, batches);
}

/// The recording replays to the same figures.
fn replays_to_the_same_figures(t: &TraceResult, trainer: &Value, slow: &Value) {
    let out = t.record_path().with_file_name("replayed.json");
    let rc = std::process::Command::new(tests::gpustall_bin())
        .args(["report", "--summary-json"])
        .arg(&out)
        .arg(t.record_path())
        .stdout(std::process::Stdio::null())
        .status()
        .expect("gpustall report");
    assert!(rc.success());
    let replayed: Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("replayed summary"))
            .expect("json");
    let again = replayed["processes"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["pid"] == trainer["pid"]))
        .expect("the trainer in the replay");
    for f in ["data_wait_ns", "offcpu_wait_ns", "offcpu_io_ns", "runqueue_ns", "wait_by_syscall"] {
        assert_eq!(again[f], trainer[f], "{f}");
    }
    let slow_again = replayed["processes"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["pid"] == slow["pid"]))
        .expect("the slow worker in the replay");
    assert_eq!(slow_again["long_waits"], slow["long_waits"]);
}

#[test]
fn a_cpu_bound_trainer_shows_little_data_wait() {
    let (t, truth) = feed(&["0", "0", "20", "40"]);
    let trainer = t.process(n(&truth, "pid") as u32);
    let data_wait = n(trainer, "data_wait_ns");
    let busy = n(&truth, "busy_ns");
    assert!(data_wait < busy / 10, "data_wait_ns {data_wait} against {busy} ns of compute");
    // And what it did wait is what it measured (a few ms of slack: the blocks are tiny, and a
    // wait also counts the run-queue time before the trainer's first 1 ms back on a CPU, where
    // its own clock stopped when its read returned).
    let blocked = n(&truth, "blocked_ns");
    assert!(data_wait <= blocked + 10_000_000 + blocked / 10, "{data_wait} vs {truth}");
}

/// A trainer that only sleeps while its workers spin: each wakeup comes from its own timer,
/// in an interrupt that lands on whatever runs on that CPU, usually a busy worker. None of it
/// is a wait for data (before the fix, most of its sleep was charged to the workers).
#[test]
fn a_sleeping_trainer_is_not_kept_waiting_by_the_workers_its_timer_interrupts() {
    sleeping_trainer(&[]);
}

/// The same with workers that spin inside a syscall: the timer interrupts kernel code, which
/// x86_64 runs on the CPU's interrupt stack (user code's interrupts run on the task's stack:
/// the typed sched_waking tells both apart from a worker's own wakeup).
#[test]
fn a_sleeping_trainer_is_not_kept_waiting_by_workers_in_a_syscall_its_timer_interrupts() {
    sleeping_trainer(&["--in-kernel"]);
}

fn sleeping_trainer(extra: &[&str]) {
    tests::require_privileged_env();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("py/jobs.py");
    let mut args = vec!["-u", script.to_str().expect("utf-8"), "sleeper", "--idle", "3"];
    args.extend(extra);
    args.push("--wait-go");
    let mut w = Workload::start(std::path::Path::new("python3"), &args, None);
    let t = Tracer::start(w.pid(), &["--quiet", "--no-gpu"]);
    w.go();
    let (code, lines) = w.wait(Duration::from_secs(60));
    assert_eq!(code, Some(0));
    let slept = lines.iter().find(|l| l["role"] == "slept").and_then(|l| l["ns"].as_u64());
    let slept = slept.expect("the trainer says how long it slept");
    let t = t.wait(Duration::from_secs(30));
    let trainer = t.process(w_pid(&lines));
    let data_wait = n(trainer, "data_wait_ns");
    eprintln!("slept {slept} ns; data_wait_ns {data_wait}");
    assert!(data_wait < slept / 10, "data_wait_ns {data_wait} of {slept} ns asleep: {trainer}");
}

fn w_pid(lines: &[Value]) -> u32 {
    let trainer = lines.iter().find(|l| l["role"] == "trainer").expect("trainer line");
    trainer["pid"].as_u64().expect("pid") as u32
}
