//! An OOM kill inside a memory-limited cgroup: exactly the victim the kernel names, with its
//! anon-rss, marked oom_killed with exit signal 9.

use std::time::Duration;

use tests::{
    cgroup::MemCgroup,
    kernel::{oom_kills_among, Kmsg},
    procs::{Tracer, Workload},
};

#[test]
fn oom_victim_in_a_memory_cgroup_is_recorded() {
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    let cg = MemCgroup::new("oom", 256, false);
    let mut kmsg = Kmsg::open_at_end();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    // Worker 0 grows past the limit; 1 and 2 hold 40 MiB each, so there is exactly one victim.
    let mut w = Workload::start(bin, &["hog", "600,40,40", "8", "3000"], Some(&cg));
    let perfetto = tests::TempDir::new("oom-perfetto");
    let trace_out = perfetto.path("trace.json");
    let tracer =
        Tracer::start(w.pid(), &["--quiet", "--perfetto", trace_out.to_str().expect("utf-8")]);
    w.go();
    let (code, lines) = w.wait(Duration::from_secs(120));
    let t = tracer.wait(Duration::from_secs(30));
    let log = kmsg.read_new();
    let pids: Vec<u32> = lines.iter().filter_map(|l| l["pid"].as_u64()).map(|p| p as u32).collect();
    let killed = oom_kills_among(&log, &pids);
    assert_eq!(code, Some(1), "the parent saw a worker killed");
    assert_eq!(killed.len(), 1, "the kernel killed exactly one process of the job: {log:?}");
    assert_eq!(cg.oom_kills(), 1, "the cgroup's own OOM count");
    let victim = killed[0].pid;
    let worker0 = lines.iter().find(|l| l["role"] == "worker" && l["index"] == 0).expect("worker 0")
        ["pid"]
        .as_u64()
        .expect("pid") as u32;
    assert_eq!(victim, worker0, "the largest worker is the victim");

    let kills = t.summary["oom_kills"].as_array().expect("oom_kills");
    assert_eq!(kills.len(), 1, "{kills:?}");
    assert_eq!(kills[0]["victim_pid"], victim);
    let anon_kb = kills[0]["anon_rss_kb"].as_u64().expect("anon_rss_kb");
    eprintln!(
        "OOM victim {victim}: anon-rss {anon_kb} kB by gpustall; kernel log: {:?}",
        killed[0]
    );
    assert!(
        (150 * 1024..=256 * 1024).contains(&anon_kb),
        "anon-rss {anon_kb} kB of a worker in a 256 MiB cgroup"
    );
    let p = t.process(victim);
    assert_eq!(p["oom_killed"], true);
    assert_eq!(p["exit_signal"], 9);
    assert_eq!(p["role"], "dataloader_worker");
    assert_eq!(p["killed_by"]["sig"], 9);
    assert_eq!(t.summary["verdict"]["cause"], "host_memory_oom");
    let culprits = t.summary["verdict"]["culprit_pids"].as_array().expect("culprits");
    assert!(culprits.contains(&victim.into()), "the victim is named: {culprits:?}");
    let evidence = t.summary["verdict"]["evidence"].to_string();
    assert!(evidence.contains(&format!("OOM killer chose pid {victim}")), "{evidence}");
    // The kernel log's own anon-rss figure for the victim is the one gpustall reports.
    let logged_anon = killed[0].anon_rss_kb.expect("anon-rss in the kernel log");
    if anon_kb != logged_anon {
        // Newer kernels (7.2) log the exact sum of the per-CPU RSS counters while mark_victim
        // still reports their approximate read: off by at most the counters' batch per CPU.
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
        let tolerance_kb = 4 * cpus * (2 * cpus).max(32);
        let diff = anon_kb.abs_diff(logged_anon);
        assert!(
            diff <= tolerance_kb,
            "anon-rss: gpustall {anon_kb} kB vs the kernel log's {logged_anon} kB (more than the per-CPU counters' {tolerance_kb} kB apart)"
        );
        tests::degraded(&format!(
            "mark_victim's anon_rss is the per-CPU RSS counters' approximate read ({diff} kB from the kernel log's exact sum)"
        ));
    }
    // `trace --perfetto`: the OOM kill is an instant on the victim's track.
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace_out).expect("perfetto trace"))
            .expect("json");
    let ev = trace["traceEvents"].as_array().expect("events");
    assert!(
        ev.iter().any(|e| e["ph"] == "i" && e["name"] == "OOM kill" && e["pid"] == victim),
        "OOM kill instant on pid {victim}"
    );
    assert!(
        ev.iter().any(|e| e["ph"] == "i"
            && e["pid"] == victim
            && e["name"].as_str().is_some_and(|n| n.starts_with("signal 9"))),
        "the SIGKILL instant"
    );
    // The other workers were not OOM-killed.
    for l in lines.iter().filter(|l| l["role"] == "worker" && l["pid"] != victim) {
        let other = t.process(l["pid"].as_u64().expect("pid") as u32);
        assert_eq!(other["oom_killed"], false, "{other}");
    }
}

/// The incident's shape as a launcher runs it: `torchrun --standalone --nproc_per_node=1`, its
/// rank's DataLoader workers started by spawn (each imports torch itself), each keeping every
/// sample it makes (tests/py/datawait.py torch-cpu --grow-mib), in a 3000 MiB memory cgroup
/// the job joins as it starts (`echo $$ > cgroup.procs; exec torchrun`). The cgroup OOM-kills
/// a worker, the rank's DataLoader raises and torchrun fails. Traced from the shell, as
/// `gpustall trace -- sh -c ...` does: the kill, the cgroup and its limit are the job's, the
/// workers are the rank's, and the advice is a worker count under the 3 that ran out.
#[test]
fn a_torchrun_ranks_spawned_workers_that_outgrow_its_cgroup_are_an_oom_with_a_worker_count() {
    tests::require_privileged_env();
    let _memory = tests::pressure_lock();
    let cg = MemCgroup::new("torchrun-oom", 3000, false);
    let dir = tests::TempDir::new("torchrun-oom");
    let torchrun = tests::torch_python().with_file_name("torchrun");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("py/datawait.py");
    let summary = dir.path("summary.json");
    let cmd = format!(
        "echo $$ > {}/cgroup.procs && exec {} --standalone --nproc_per_node=1 {} torch-cpu \
         --workers 3 --worker-start spawn --grow-mib 4 --item-cpu-ms 20 --seconds 300",
        cg.path.display(),
        torchrun.display(),
        script.display()
    );
    let o = std::process::Command::new(tests::gpustall_bin())
        .args(["trace", "--quiet", "--no-gpu", "--summary-json"])
        .arg(&summary)
        .args(["--", "sh", "-c", &cmd])
        .env_remove("SUDO_UID")
        .output()
        .expect("gpustall trace -- torchrun");
    let err = String::from_utf8_lossy(&o.stderr);
    // torchrun fails when its rank does (1); the OOM killer may pick the rank itself (137 is
    // the rank's, torchrun still exits 1).
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(cg.oom_kills() >= 1, "the cgroup's own count");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("JSON");
    let v = &s["verdict"];
    eprintln!("verdict: {v:#}");
    assert_eq!(v["cause"], "host_memory_oom", "{v:#}");
    let victim = s["oom_kills"][0]["victim_pid"].as_u64().expect("the kill");
    let process = |pid: u64| tests::summary_process(&s, pid);
    let killed = process(victim);
    assert_eq!(killed["role"], "dataloader_worker", "the victim: {killed:#}");
    let workers: Vec<&serde_json::Value> = s["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["role"] == "dataloader_worker")
        .collect();
    assert_eq!(workers.len(), 3, "the rank's 3 spawned workers, and no other");
    let rank = process(workers[0]["ppid"].as_u64().expect("ppid"));
    assert_eq!(rank["role"], "rank", "the workers' parent: {rank:#}");
    let culprits = v["culprit_pids"].as_array().expect("culprits");
    assert!(culprits.iter().any(|p| *p == victim), "the victim is named: {v:#}");
    let cgroup = &s["context"]["cgroup"];
    assert_eq!(cgroup["path"].as_str(), Some(cg.cgroup_path().as_str()), "{cgroup:#}");
    assert_eq!(cgroup["limit_bytes"].as_u64(), Some(3000 << 20), "{cgroup:#}");
    let n = v["advice_num_workers"].as_u64().unwrap_or_else(|| panic!("a count: {v:#}"));
    assert!((1..3).contains(&n), "fewer than the 3 that ran out: {v:#}");
    let advice = v["advice"][0].as_str().unwrap_or_default();
    assert!(advice.contains("launcher + 1 rank "), "torchrun and its rank: {advice}");
    // The kill was forecast while the workers grew.
    let kill_ns = s["oom_kills"][0]["t_ns"].as_u64().expect("t_ns");
    let w = &s["context"]["limit_warning"];
    let said =
        w["said_at_ns"].as_u64().unwrap_or_else(|| panic!("no forecast: {:#}", s["context"]));
    let put = w["limit_at_ns"].as_u64().expect("limit_at_ns");
    eprintln!(
        "limit forecast {:.1} s before the kill, for {:.1} s later",
        kill_ns.saturating_sub(said) as f64 / 1e9,
        put.saturating_sub(said) as f64 / 1e9
    );
    assert!(said < kill_ns, "{w}");
}
