//! A big incident under `gpustall watch`, in its own shipped limit: the daemon in a 256 MiB
//! memory cgroup (the DaemonSet's limit, the unit's MemoryMax=) with a 64 MiB --memory-budget, a
//! watched job tree of 8,000 processes SIGKILLed at once. Shared by the test that holds the
//! daemon to it (tests/watch_incident_memory.rs) and `cargo xtask bench --only incident`.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use crate::{
    cgroup::MemCgroup,
    procs::{descendants, vm_hwm_kb, KillTree, Workload},
    watcher::Watcher,
};

pub const PROCESSES: usize = 8000;
/// The shipped limit (deploy/kubernetes/daemonset.yaml, deploy/gpustall-watch.service).
pub const LIMIT_MIB: u64 = 256;
pub const BUDGET_MIB: u64 = 64;

/// What the daemon did at the incident.
pub struct BigIncident {
    /// The daemon's peak RSS (the kernel's VmHWM) before the kill and after the bundle, kB.
    pub before_kb: u64,
    pub peak_kb: u64,
    /// From the kill to the bundle's "wrote incident bundle" line, and that line.
    pub took: Duration,
    pub wrote: String,
    /// Its "incident:" log lines, and the OOM kills in its cgroup.
    pub incident_lines: usize,
    pub oom_kills: u64,
    /// The daemon, still running after the bundle, and the cgroup it runs in (dropped after it:
    /// the cgroup's guard kills what is left in it).
    pub watcher: Watcher,
    pub cgroup: MemCgroup,
}

/// Runs the incident: `workload` is the gpustall-workload binary, bundles go to `bundles`.
pub fn run(workload: &Path, bundles: &Path) -> BigIncident {
    let cg = MemCgroup::new("watch-limit", LIMIT_MIB, false);
    let script = format!("for i in $(seq {PROCESSES}); do sleep 3600 & done; wait");
    let mut job = Workload::start(workload, &["spawn", "sh", "-c", &script], None);
    let _tree = KillTree(job.pid());
    let rule = format!("comm:^{}$", job.comm());
    let budget = format!("{BUDGET_MIB}MiB");
    let dir = bundles.to_str().expect("utf-8");
    // The daemon is charged to the cgroup from its first page.
    let args = ["--match", &rule, "--no-gpu", "--listen", "127.0.0.1:0", "--after", "2s"];
    let more = ["--scan-every", "500ms", "--memory-budget", &budget, "--bundle-dir", dir];
    let mut w = crate::watcher::in_cgroup(&cg, &[&args[..], &more[..]].concat());
    let agent = w.child.id();
    w.wait_for("metrics on http://", Duration::from_secs(60));
    w.wait_for(&format!("watching job {}-{}", job.comm(), job.pid()), Duration::from_secs(30));
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
        // SAFETY: SIGKILL to a process of the job started here (its tree).
        unsafe { libc::kill(*p as i32, libc::SIGKILL) };
    }
    let wrote = w.wait_for("wrote incident bundle", Duration::from_secs(120));
    let took = started.elapsed();
    let peak_kb = vm_hwm_kb(agent);
    let incident_lines = w.seen().iter().filter(|l| l.contains("gpustall: incident:")).count();
    BigIncident {
        before_kb,
        peak_kb,
        took,
        wrote,
        incident_lines,
        oom_kills: cg.oom_kills(),
        watcher: w,
        cgroup: cg,
    }
}
