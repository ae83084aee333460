//! A real torch DataLoader with a deadlocked worker (tests/py/datawait.py torch-deadlock): a
//! lock held by another thread of the trainer when the workers are forked is inherited
//! locked, and worker 2 waits in acquire() for ever. Nothing stalls on a GPU and no log rises:
//! the trainer simply waits for a batch that will not come. The verdict names worker 2 from
//! the trainer's open wait and the worker's state, and `--stop-job` ends every process of the
//! job, the stuck worker too.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

#[test]
fn a_deadlocked_torch_worker_is_named_and_stop_job_ends_the_whole_job() {
    tests::require_privileged_env();
    // Two torch jobs at once on 2 CPUs (this and the torchrun one) leave the stuck worker's
    // stack unsampled in the trace's time: one at a time.
    let _cpu = tests::cpu_lock();
    let python = tests::torch_python();
    // A heartbeat in the trainer's main thread interrupts its wait every 2 s and runs 5 ms on
    // CPU (a watchdog; as a garbage collection or a noisy host's stolen time does now and
    // then): the wait goes on through it, and is as old as the hang.
    deadlocked_job(&[python.to_str().expect("utf-8"), "-u"], &["--heartbeat-ms", "5"], 16);
}

/// The same job as a launcher runs it: `gpustall trace -- torchrun --standalone
/// --nproc_per_node=1 datawait.py torch-deadlock`. torchrun is the target and its rank waits;
/// the verdict, the lines and the stop are the same, torchrun's elastic agent and its rank
/// stopped with the stuck worker.
#[test]
fn a_deadlocked_worker_of_a_torchrun_rank_is_named_and_stop_job_ends_the_whole_job() {
    tests::require_privileged_env();
    let _cpu = tests::cpu_lock();
    let torchrun = tests::torch_python().with_file_name("torchrun");
    // torchrun imports torch before its rank does: 6 s more before the rank's wait begins.
    let lead = [torchrun.to_str().expect("utf-8"), "--standalone", "--nproc_per_node=1"];
    deadlocked_job(&lead, &[], 22);
}

/// `gpustall trace --duration SECONDS --stop-job -- LEAD... datawait.py torch-deadlock
/// --workers 4 --slow-worker 2 TAIL...`: worker 2 named, with the line it is stuck at and the
/// line the trainer waits at, and every process of the job stopped.
fn deadlocked_job(lead: &[&str], tail: &[&str], seconds: u32) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("py/datawait.py");
    let dir = tests::TempDir::new("stuck-worker");
    let summary = dir.path("summary.json");
    // The trainer's wait begins about 3 s in (torch's import, the workers' fork): 16 s gives
    // it 13 s, the 3 s of a hang and 10 s to name the worker.
    let started = Instant::now();
    let child = Command::new(tests::gpustall_bin())
        .args(["trace", "--quiet", "--no-gpu", "--duration", &seconds.to_string(), "--stop-job"])
        .arg("--summary-json")
        .arg(&summary)
        .arg("--")
        .args(lead)
        .args([script.to_str().expect("utf-8"), "torch-deadlock", "--workers", "4"])
        .args(["--slow-worker", "2"])
        .args(tail)
        .env_remove("SUDO_UID")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gpustall trace -- python");
    let _cleanup = tests::procs::KillTree(child.id());
    let o = child.wait_with_output().expect("gpustall");
    let took = started.elapsed();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<Value> = out.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let trainer =
        lines.iter().find(|l| l["role"] == "trainer").unwrap_or_else(|| panic!("{out}\n{err}"));
    let workers: Vec<u32> = trainer["worker_pids"]
        .as_array()
        .expect("worker_pids")
        .iter()
        .filter_map(|p| p.as_u64().map(|p| p as u32))
        .collect();
    // Whatever --stop-job left is killed, pass or fail.
    let _left = KillPids(workers.clone());
    let steps = lines.iter().filter(|l| l["role"] == "step").count();
    eprintln!("{steps} steps before the trainer hung; the trace and the stop took {took:?}");
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).expect("the summary"))
            .expect("JSON");
    let v = &summary["verdict"];
    eprintln!("verdict: {v:#}");
    // What the verdict was made of, where it is not the one wanted: the trainer's waits (the
    // rank's under torchrun, whose elastic agent is a waiter too).
    let trainer_pid = trainer["pid"].as_u64();
    let waiter = summary["processes"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["pid"].as_u64() == trainer_pid));
    eprintln!("the trainer's waits: {:#}", waiter.unwrap_or(&Value::Null));
    assert_eq!(v["cause"], "deadlock", "{v:#}\n{err}");
    assert_eq!(v["culprit_pids"][0], workers[2], "worker 2 of {workers:?}: {v:#}");
    assert_eq!(v["culprit_pids"].as_array().map(Vec::len), Some(1), "only worker 2: {v:#}");
    let text = v["text"].as_str().unwrap_or_default();
    assert!(text.contains("DataLoader worker 2"), "{text}");
    // The line each waits at, from their Python stacks: the worker in the `with cache_lock:`
    // of its __getitem__, the trainer in its `next(it)`.
    let source = std::fs::read_to_string(&script).expect("datawait.py");
    let line_of = |needle: &str| {
        1 + source.lines().position(|l| l.trim_start().starts_with(needle)).expect(needle)
    };
    let lock_line = format!("datawait.py:{} `", line_of("with cache_lock:  # this worker's"));
    assert!(text.contains(&format!("blocked at {lock_line}")), "{lock_line} in {text}");
    assert!(text.contains("__getitem__`"), "{text}");
    let chain: Vec<&str> =
        v["evidence"].as_array().expect("evidence").iter().filter_map(Value::as_str).collect();
    let next_line = format!("datawait.py:{} `", line_of("next(it)"));
    assert!(
        chain.iter().any(|l| l.contains("waits for its batches at") && l.contains(&next_line)),
        "the trainer at {next_line}: {chain:#?}"
    );
    // Stopped whole: the trainer and every worker, the stuck one too (gone, or a zombie
    // waiting for init to reap it).
    let gone = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_or(true, |s| s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')))
    };
    let end = Instant::now() + Duration::from_secs(5);
    while !workers.iter().all(|&p| gone(p)) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
    }
    let left: Vec<u32> = workers.iter().copied().filter(|&p| !gone(p)).collect();
    assert!(left.is_empty(), "--stop-job left workers {left:?} running");
}

/// Kills the pids still there on drop: a worker left behind would wait for ever.
struct KillPids(Vec<u32>);

impl Drop for KillPids {
    fn drop(&mut self) {
        for &p in &self.0 {
            // SAFETY: SIGKILL to a worker of the job this test started (at worst already gone).
            unsafe { libc::kill(p as i32, libc::SIGKILL) };
        }
    }
}
