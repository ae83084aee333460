//! Ranks and DataLoader workers told apart for each of multiprocessing's start methods, on real
//! job shapes (tests/py/jobs.py: standard-library Python that names its processes and threads
//! as PyTorch does: `pt_main_thread` on import, `pt_data_worker`, a `pt_data_pin` thread), in a
//! memory cgroup too small for them, so that the verdict's advice per DataLoader shows the
//! grouping. torchrun's forked shape is in verdict_jobs.rs.

use std::time::Duration;

use serde_json::Value;
use tests::{
    cgroup::MemCgroup,
    kernel::SwapFile,
    procs::{TraceResult, Tracer, Workload},
};

/// Runs a jobs.py shape traced, in a memory cgroup of `mib` MiB with 64 MiB of swap; the job
/// fails when the OOM killer takes one of its workers.
fn traced(args: &[&str], tag: &str, mib: u64) -> (TraceResult, Vec<Value>) {
    let _lock = tests::pressure_lock();
    let _swap = SwapFile::ensure(1024);
    let cg = MemCgroup::with_swap_limit(tag, mib, 64);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("py/jobs.py");
    let mut argv = vec!["-u", script.to_str().expect("utf-8")];
    argv.extend_from_slice(args);
    argv.push("--wait-go");
    let mut w = Workload::start(std::path::Path::new("python3"), &argv, Some(&cg));
    let tracer = Tracer::start(w.pid(), &["--quiet", "--no-gpu"]);
    w.go();
    let (code, lines) = w.wait(Duration::from_secs(180));
    assert_eq!(code, Some(1), "the job fails when the OOM killer takes a worker: {lines:?}");
    let t = tracer.wait(Duration::from_secs(30));
    eprintln!("verdict: {:#}", t.summary["verdict"]);
    (t, lines)
}

/// The pids a job shape printed for `role`.
fn pids(lines: &[Value], role: &str) -> Vec<u32> {
    lines
        .iter()
        .filter(|l| l["role"] == role)
        .filter_map(|l| l["pid"].as_u64())
        .map(|p| p as u32)
        .collect()
}

fn ppid_of(lines: &[Value], pid: u32) -> u32 {
    let l = lines.iter().find(|l| l["pid"] == pid).expect("printed");
    l["ppid"].as_u64().expect("ppid") as u32
}

fn advice(t: &TraceResult) -> String {
    let v = &t.summary["verdict"];
    assert_eq!(v["cause"], "host_memory_oom", "{v:#}");
    let a = v["advice"].as_array().expect("advice").iter().filter_map(Value::as_str);
    a.collect::<Vec<_>>().join("\n")
}

/// The summary's DataLoader workers of `owner`, by pid.
fn workers_of(t: &TraceResult, owner: u32) -> Vec<u32> {
    let mut v: Vec<u32> = t
        .processes()
        .iter()
        .filter(|p| p["role"] == "dataloader_worker" && p["dataloader_of"] == owner)
        .filter_map(|p| p["pid"].as_u64())
        .map(|p| p as u32)
        .collect();
    v.sort();
    v
}

/// torch.multiprocessing.spawn's shape: the script spawns the ranks; each rank's DataLoader
/// starts its workers with `start` (fork, or multiprocessing_context="spawn"). The spawned
/// ranks are ranks (they were read as workers of the script), each with its pin-memory thread,
/// and each rank's workers are its own DataLoader.
fn spawned_ranks(start: &str, tag: &str) {
    tests::require_privileged_env();
    // One rank's 3 workers of 120 MiB alone exceed the 256 MiB + 64 MiB of swap: under
    // emulation spawned interpreters start seconds apart, and an OOM kill that needed both
    // ranks' workers alive together did not always come.
    let args = ["spawn-ranks", "--worker-start", start, "--mib", "120", "--hold", "5"];
    let (t, lines) = traced(&args, tag, 256);
    let script = pids(&lines, "launcher")[0];
    let ranks = pids(&lines, "rank");
    assert_eq!(ranks.len(), 2, "{lines:?}");
    assert_eq!(t.process(script)["role"], "trainer");
    for &r in &ranks {
        let p = t.process(r);
        assert_eq!(
            (p["role"].as_str(), p["ppid"].as_u64()),
            (Some("rank"), Some(script as u64)),
            "{p}"
        );
        let pin = p["thread_roles"].as_array().cloned().unwrap_or_default();
        assert!(
            pin.iter().any(|th| th["role"] == "pin_memory"),
            "rank {r}'s pt_data_pin thread: {p}"
        );
        let mut printed: Vec<u32> =
            pids(&lines, "worker").into_iter().filter(|&w| ppid_of(&lines, w) == r).collect();
        printed.sort();
        assert_eq!(printed.len(), 3, "{lines:?}");
        assert_eq!(workers_of(&t, r), printed, "rank {r}'s workers");
    }
    let a = advice(&t);
    for r in &ranks {
        assert!(a.contains(&format!("pid {r}'s DataLoader: num_workers=3")), "{a}");
    }
    assert!(a.contains("the job: launcher + 2 ranks"), "{a}");
    assert!(t.stdout.contains("rank+pin"), "the report's role column: {}", t.stdout);
}

#[test]
fn spawned_ranks_with_forked_workers() {
    spawned_ranks("fork", "roles-spawn-fork");
}

#[test]
fn spawned_ranks_with_spawn_context_workers() {
    spawned_ranks("spawn", "roles-spawn-spawn");
}

/// Python 3.14's default start method: the trainer's workers are forks of the forkserver and
/// carry its command line. Workers that never rename (PyTorch releases before the rename, a
/// plain multiprocessing pool) were read as forkservers; they are the trainer's DataLoader.
#[test]
fn forkserver_started_workers_are_the_trainers_dataloader() {
    tests::require_privileged_env();
    let args = ["forkserver", "--mib", "120", "--unnamed", "--hold", "5"];
    let (t, lines) = traced(&args, "roles-forkserver", 256);
    let trainer = pids(&lines, "trainer")[0];
    let mut workers = pids(&lines, "worker");
    workers.sort();
    assert_eq!(workers.len(), 3, "{lines:?}");
    let forkserver = ppid_of(&lines, workers[0]);
    assert_ne!(forkserver, trainer, "workers hang off the forkserver");
    let forkservers: Vec<&Value> =
        t.processes().iter().filter(|p| p["role"] == "forkserver").collect();
    assert_eq!(forkservers.len(), 1, "one forkserver: {forkservers:?}");
    assert_eq!(forkservers[0]["pid"], forkserver);
    assert_eq!(t.process(forkserver)["ppid"], trainer);
    assert_eq!(workers_of(&t, trainer), workers);
    for &w in &workers {
        assert_eq!(t.process(w)["ppid"], forkserver);
    }
    let a = advice(&t);
    assert!(a.contains("num_workers=3: trainer"), "one DataLoader, the trainer's: {a}");
    assert!(!a.contains(&format!("pid {forkserver}")), "{a}");
}
