//! `gpustall watch` at a big incident, under its own shipped limit: in a 256 MiB memory cgroup
//! (the DaemonSet's limit, the unit's MemoryMax=), a watched job tree of 8,000 processes is
//! SIGKILLed at once. The daemon must write the whole bundle (record, summary, report,
//! Perfetto trace) without being OOM-killed, its memory within --memory-budget plus a margin.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use tests::{
    cgroup::MemCgroup,
    procs::{descendants, vm_hwm_kb, KillTree, Workload},
};

const PROCESSES: usize = 8000;
/// The shipped limit (deploy/kubernetes/daemonset.yaml, deploy/gpustall-watch.service).
const LIMIT_MIB: u64 = 256;
const BUDGET_MIB: u64 = 64;

#[test]
fn a_big_incident_is_bundled_within_the_shipped_memory_limit() {
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    let bundles = tests::TempDir::new("bigincident");
    let cg = MemCgroup::new("watch-limit", LIMIT_MIB, false);
    let comm = tests::procs::unique_comm();
    let rule = format!("comm:^{comm}$");
    let budget = format!("{BUDGET_MIB}MiB");
    let dir = bundles.0.to_str().expect("utf-8");
    // The daemon is charged to the cgroup from its first page.
    let mut w = tests::watcher::in_cgroup(
        &cg,
        &[
            "--match",
            &rule,
            "--no-gpu",
            "--listen",
            "127.0.0.1:0",
            "--after",
            "2s",
            "--scan-every",
            "500ms",
            "--memory-budget",
            &budget,
            "--bundle-dir",
            dir,
        ],
    );
    let agent = w.child.id();
    w.wait_for("metrics on http://", Duration::from_secs(60));

    let script = format!("for i in $(seq {PROCESSES}); do sleep 3600 & done; wait");
    let bin = Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    let mut job = Workload::start_named(&comm, bin, &["spawn", "sh", "-c", &script], None, None);
    let _tree = KillTree(job.pid());
    w.wait_for(&format!("watching job {comm}-{}", job.pid()), Duration::from_secs(30));
    job.go();
    let end = Instant::now() + Duration::from_secs(180);
    let mut tree = descendants(job.pid());
    while tree.len() < PROCESSES + 1 {
        assert!(Instant::now() < end, "only {} processes started", tree.len());
        std::thread::sleep(Duration::from_millis(500));
        tree = descendants(job.pid());
    }
    // Let the daemon take in the forks, then kill the whole tree at once.
    std::thread::sleep(Duration::from_secs(3));
    let before_kb = vm_hwm_kb(agent);
    let started = Instant::now();
    for p in &tree {
        // SAFETY: SIGKILL to a process this test started (the job's tree).
        unsafe { libc::kill(*p as i32, libc::SIGKILL) };
    }
    let wrote = w.wait_for("wrote incident bundle", Duration::from_secs(120));
    let took = started.elapsed();
    let peak_kb = vm_hwm_kb(agent);
    let oom = cg.oom_kills();
    let incident_lines = w.seen().iter().filter(|l| l.contains("gpustall: incident:")).count();
    eprintln!(
        "{PROCESSES} processes killed: bundle in {took:?}, agent peak RSS {} MiB (before the \
         incident {} MiB), {incident_lines} incident lines, OOM kills in its cgroup {oom}: {wrote}",
        peak_kb / 1024,
        before_kb / 1024
    );
    let dir = wrote.split("bundle ").nth(1).and_then(|r| r.split(' ').next()).expect("dir");
    for f in ["record.jsonl", "summary.json", "report.txt", "trace.json"] {
        assert!(Path::new(dir).join(f).exists(), "{f} in {dir}");
    }
    let _ = serde_json::from_str::<serde_json::Value>(
        &std::fs::read_to_string(Path::new(dir).join("trace.json")).expect("trace.json"),
    )
    .expect("trace.json parses");
    assert_eq!(oom, 0, "the daemon was not OOM-killed");
    assert!(w.child.try_wait().expect("try_wait").is_none(), "the daemon is still running");
    // The budget plus a fixed margin (the process model, the BPF side's buffers, the runtime).
    assert!(
        peak_kb < (BUDGET_MIB + 96) * 1024,
        "peak RSS {} MiB over the budget {BUDGET_MIB} MiB + 96 MiB",
        peak_kb / 1024
    );
    assert!(incident_lines <= 10, "{incident_lines} incident lines in the log");
}
